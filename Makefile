# Troupe — build everything with `make`, run every test with `make test`.
#
# Layout is discovered by wildcard so a new file needs no Makefile edit:
#   common/ messages/ topology/ engine/ kernels/cpu/ transfer/ actors/*/ (runtime, worker, ...) tools/lib/
#   tools/generate/ (troupe-generate's pieces)
#                                                   -> build/libtroupe.a
#   actors/<name>.c  -> build/bin/troupe-<name>   (one process per actor; '_' becomes '-')
#   tools/<name>.c   -> build/bin/troupe-<name>   (supervisor, client, top, generate, bench)
#   tests/unit/test_<x>.c -> build/tests/test_<x> (cmocka)
#   kernels/cuda/*.cu -> build/libtroupe_cuda.a   (only where nvcc exists)
#   tests/fuzz/fuzz_<x>.c -> build/fuzz/fuzz_<x>  (`make fuzz`, clang libFuzzer + ASan + UBSan; seeds
#                                   in tests/fuzz/corpus/<x>/, dictionary tests/fuzz/<x>.dict or fuzz_<x>.dict;
#                                   `make test` runs each for seconds, `make fuzz-long` for FUZZ_RUNS)

CC      ?= cc
ARCH    ?= -march=native
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wshadow -fopenmp $(ARCH) -I.
PKGS    := libzmq msgpack jansson oniguruma libcyaml libxxhash
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
LDLIBS  := $(PKG_LIBS) -lncursesw -lm -lpthread -ldl -fopenmp
CMOCKA  := $(shell pkg-config --libs cmocka 2>/dev/null || echo -lcmocka)

# CUDA and NCCL: /usr/local/cuda on the CPU machines, /usr on the GPU node. Optional.
comma := ,
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ( [ -x $(CUDA_HOME)/bin/nvcc ] && echo $(CUDA_HOME)/bin/nvcc ))
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a
NCCL_INC  := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
# libnccl beside its header: CUDA_HOME's lib folder here, the system's on the GPU node. With both,
# kernels/cuda/cuda_nccl.cu is compiled (-DTROUPE_NCCL) and the CUDA binaries link -lnccl.
NCCL_LIBDIR ?= $(patsubst %/,%,$(dir $(firstword $(wildcard $(CUDA_HOME)/lib64/libnccl.so \
               $(CUDA_HOME)/targets/x86_64-linux/lib/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so))))
NCCL      := $(if $(and $(NCCL_INC),$(NCCL_LIBDIR)),1)
# (The system's folder needs no -L: one would put it before LIBRARY_PATH's folders.)
NCCL_LDLIBS := $(if $(NCCL),$(if $(filter /usr/lib/x86_64-linux-gnu,$(NCCL_LIBDIR)),,-L$(NCCL_LIBDIR) \
               -Wl$(comma)-rpath$(comma)$(NCCL_LIBDIR)) -lnccl)

B := build
# make demo and make test build with one job per core (JOBS=1 builds serially).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
LIB_SRCS   := $(wildcard common/*.c messages/*.c topology/*.c engine/*.c kernels/cpu/*.c transfer/*.c actors/*/*.c tools/lib/*.c \
                        tools/generate/*.c)
ACTOR_SRCS := $(wildcard actors/*.c)
TOOL_SRCS  := $(wildcard tools/*.c)
TEST_SRCS  := $(wildcard tests/unit/test_*.c)
FUZZ_SRCS  := $(wildcard tests/fuzz/fuzz_*.c)
CU_SRCS    := $(wildcard kernels/cuda/*.cu)

LIB_OBJS := $(LIB_SRCS:%.c=$(B)/obj/%.o)
ACTOR_BINS := $(patsubst actors/%.c,$(B)/bin/troupe-%,$(subst _,-,$(ACTOR_SRCS)))
# The gateway needs libmicrohttpd (tools/install-deps.sh); a machine without it (an offline GPU
# node) builds everything else.
ifeq ($(shell pkg-config --exists libmicrohttpd 2>/dev/null && echo 1),)
ACTOR_BINS := $(filter-out $(B)/bin/troupe-gateway,$(ACTOR_BINS))
endif
TOOL_BINS  := $(patsubst tools/%.c,$(B)/bin/troupe-%,$(subst _,-,$(TOOL_SRCS)))
TEST_BINS  := $(TEST_SRCS:tests/unit/%.c=$(B)/tests/%) $(B)/tests/test_kernels_cpu_novec
FUZZ_BINS  := $(FUZZ_SRCS:tests/fuzz/%.c=$(B)/fuzz/%)

ifneq ($(NVCC),)
CU_OBJS := $(CU_SRCS:%.cu=$(B)/obj/%.o)
CUDA_LIB := $(if $(CU_SRCS),$(B)/libtroupe_cuda.a)
endif
# The model-running binaries (CUDA_USERS) link the CUDA backend when it is built (CUDA_LINK=0 opts
# out); the others stay free of the CUDA libraries, which cost ~80 ms per process start. -u makes the linker
# take backend_cuda_new from the archive (libtroupe's weak reference alone would not); libtroupe.a
# again after it resolves what the CUDA objects use. CUDA_LIBDIR holds libcudart/libcublas(Lt).
CUDA_LINK   ?= 1
CUDA_USERS  := troupe-prefill troupe-decode troupe-generate troupe-bench-engine troupe-score
CUDA_LIBDIR ?= $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib) /usr/lib/x86_64-linux-gnu)
ifneq ($(CUDA_LIB),)
ifneq ($(CUDA_LINK),0)
CUDA_LDLIBS := -Wl,-u,backend_cuda_new $(CUDA_LIB) $(B)/libtroupe.a -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) \
               $(NCCL_LDLIBS) -lcublasLt -lcublas -lcudart -lstdc++
CUDA_DEP    := $(CUDA_LIB)
endif
endif
# GPU-only tests and benchmarks (never run by tests/run.sh): tests/gpu/test_*.c (cmocka) and
# tests/gpu/*.cu -> build/gpu-tests/<name>, with `make gpu-tests` where CUDA is built.
GPU_TEST_C_BINS := $(if $(CUDA_LDLIBS),$(patsubst tests/gpu/%.c,$(B)/gpu-tests/%,$(wildcard tests/gpu/test_*.c)))
GPU_TEST_BINS := $(GPU_TEST_C_BINS) $(if $(CUDA_LDLIBS),$(patsubst tests/gpu/%.cu,$(B)/gpu-tests/%,$(wildcard tests/gpu/*.cu)))

.PHONY: all deps demo test test-asan fuzz fuzz-long nemesis-long clean cuda gpu-tests check-layers
all: $(B)/libtroupe.a $(ACTOR_BINS) $(TOOL_BINS) $(TEST_BINS) $(CUDA_LIB)

# Installs what is missing (apt-get as root; otherwise prints the line), fetches tokenizers.
deps:
	@tools/install-deps.sh

# The README's first command: deps, build, then the main job on the embedded default topology.
demo: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@tools/demo.sh

# The README's second command (and .ci/run): deps, build, every test, one summary line at the end.
# Where CUDA is built the GPU tests' C programs are built too (not run: they need a GPU), so that
# one that no longer compiles fails here rather than on the GPU machine.
test: deps check-layers
	@$(MAKE) --no-print-directory -j$(JOBS) all fuzz $(GPU_TEST_C_BINS)
	@tests/run.sh

# The nemesis for NEMESIS_S seconds (default 30 minutes; `make test` runs it for 2 minutes): random
# kill -9 and SIGSTOP/SIGCONT of both routers and the workers under continuous load
# (tests/scenario/nemesis.sh; docs/development.md). Not part of `make test`.
NEMESIS_S ?= 1800
nemesis-long:
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@NEMESIS_S=$(NEMESIS_S) TROUPE_BIN=$(CURDIR)/$(B)/bin timeout $$(( $(NEMESIS_S) + 300 )) bash tests/scenario/nemesis.sh

# Kernels stand alone: nothing under kernels/ includes a layer above them (engine/ and up).
check-layers:
	@! grep -rnE '#include "(engine|transfer|actors|tools|messages|topology)/' kernels/ || \
	    { echo "check-layers: kernels/ include the layers above them (above)"; exit 1; }

# The scenario tests with every process built with AddressSanitizer + UBSan (slower; not in CI).
# A sanitizer report in any actor's log fails its scenario (tests/scenario/lib.sh).
ASAN_BINS := $(patsubst $(B)/%,build/asan/%,$(ACTOR_BINS) $(TOOL_BINS))
test-asan: deps
	@CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" $(MAKE) --no-print-directory -j$(JOBS) \
	    B=build/asan CUDA_LINK=0 NVCC= build/asan/libtroupe.a $(ASAN_BINS)
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    TROUPE_BIN=$(CURDIR)/build/asan/bin tests/run.sh

cuda: $(CUDA_LIB)
gpu-tests: $(GPU_TEST_BINS)

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(B)/libtroupe.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

# The gateway alone links the HTTP library (libmicrohttpd).
$(B)/bin/troupe-gateway: LDLIBS += $(shell pkg-config --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd)

# Actor and tool names use '-' where the source uses '_': actors/cache_manager.c -> troupe-cache-manager.
.SECONDEXPANSION:
$(B)/bin/troupe-%: $$(firstword $$(wildcard actors/$$(subst -,_,$$*).c tools/$$(subst -,_,$$*).c)) $(B)/libtroupe.a $(CUDA_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) $< -o $@ $(B)/libtroupe.a $(if $(filter $(notdir $@),$(CUDA_USERS)),$(CUDA_LDLIBS)) $(LDLIBS)

$(B)/tests/%: tests/unit/%.c $(B)/libtroupe.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) $< -o $@ $(B)/libtroupe.a $(CMOCKA) $(LDLIBS)

# The CPU kernels' plain C paths, which an AVX-512 build never runs: test_kernels_cpu again with
# kernels/cpu compiled into it without AVX-512 (its objects then stand in for the library's).
CPU_KERNEL_SRCS := $(wildcard kernels/cpu/*.c)
$(B)/tests/test_kernels_cpu_novec: tests/unit/test_kernels_cpu.c $(CPU_KERNEL_SRCS) $(wildcard kernels/cpu/*.h) \
                                   $(B)/libtroupe.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -mno-avx512f $(PKG_CFLAGS) $< $(CPU_KERNEL_SRCS) -o $@ $(B)/libtroupe.a $(CMOCKA) $(LDLIBS)

# -MMD -MP: every header a .cu includes (cuda.h's cuda_state_t, the kernels in .cuh files) is a
# dependency, as for the C sources: an object built against an older struct layout is never linked.
$(B)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) -I. $(if $(NCCL),-DTROUPE_NCCL -I$(dir $(NCCL_INC))) -MMD -MP -c $< -o $@

$(B)/libtroupe_cuda.a: $(CU_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/gpu-tests/%: tests/gpu/%.c $(B)/libtroupe.a $(CUDA_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -I$(CUDA_HOME)/include $< -o $@ $(B)/libtroupe.a $(CUDA_LDLIBS) $(CMOCKA) $(LDLIBS)
$(B)/gpu-tests/%: tests/gpu/%.cu $(B)/libtroupe.a $(CUDA_DEP)
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) -I. -MMD -MP -MT $@ -c $< -o $@.o
	$(CC) $(CFLAGS) $@.o -o $@ $(B)/libtroupe.a $(CUDA_LDLIBS) $(LDLIBS)

# Fuzzers: the library sources rebuilt with clang and sanitizers, one binary per target.
FUZZ_CC     ?= clang
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -I.
FUZZ_OBJS   := $(LIB_SRCS:%.c=$(B)/fuzz-obj/%.o)
fuzz: $(FUZZ_BINS)
$(B)/fuzz-obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fopenmp $(PKG_CFLAGS) -MMD -MP -c $< -o $@
# An archive, like libtroupe.a: the objects stay between builds (as a pattern rule's prerequisites
# they were deleted as intermediates and rebuilt every time) and a target links what it uses.
$(B)/libtroupe-fuzz.a: $(FUZZ_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(B)/fuzz/%: tests/fuzz/%.c $(B)/libtroupe-fuzz.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(PKG_CFLAGS) $< $(B)/libtroupe-fuzz.a -o $@ $(LDLIBS)

# A long campaign: every target (or FUZZ_TARGETS="x y") for FUZZ_RUNS executions from its corpus,
# new inputs kept in $(B)/fuzz-corpus/<x>/, logs and any crash input in $(B)/fuzz-logs/.
# `make test` runs each target for a few seconds only (tests/run.sh).
FUZZ_RUNS    ?= 10000000
FUZZ_TARGETS ?= $(FUZZ_SRCS:tests/fuzz/fuzz_%.c=%)
fuzz-long: fuzz
	@st=0; for x in $(FUZZ_TARGETS); do \
	    printf '%-20s ' "fuzz_$$x"; \
	    FUZZ_WORK=$(B)/fuzz-corpus/$$x tests/fuzz/run-target.sh $$x $(B)/fuzz/fuzz_$$x \
	        $(B)/fuzz-logs/fuzz_$$x.log -runs=$(FUZZ_RUNS) || st=1; \
	done; exit $$st

clean:
	rm -rf $(B)

-include $(shell find $(B) -name '*.d' 2>/dev/null)
