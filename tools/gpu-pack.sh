#!/usr/bin/env bash
# tools/gpu-pack.sh — a tree's GPU binaries built on a machine with nvcc but no GPU, packed for a GPU
# machine that should spend its time measuring, not compiling (a fresh one takes 80-180 s to build
# a tree, two trees for tools/gpu-compare.sh):
#
#   tools/gpu-pack.sh [TREE] OUT.tar.xz        # TREE: a source tree (default: this one)
#
# Builds TREE's actors and tools (build/bin) and the GPU tests named in GPU_TESTS (default
# test_backend_cuda test_verify bench_cuda: the ones tools/gpu-run.sh's measurements and the
# compare's exactness need) for sm_90a in TREE/build-pack, with ARCH (default -march=x86-64-v3, so
# the binaries run on the GPU machine's CPU), and writes them as build/bin/* and build/gpu-tests/*
# into OUT.tar.xz. Every CUDA-linked binary (about 21 MB) holds the same kernels, so the archive is
# compressed as one stream with a dictionary larger than a binary (192 MiB; as much memory to
# unpack), which keeps one copy of them: 5.6 MB for d3a35ba's 22 programs and 2 tests, against
# 27 MB with xz's default 8 MiB dictionary.
# On the GPU machine, unpack the archive over the same tree's sources and run with PREBUILT=1:
#
#   tar -xJf OUT.tar.xz -C TREE && (cd TREE && . .gpu-debs/env.sh && PREBUILT=1 tools/gpu-run.sh)
#   PREBUILT=1 BASE=... COMPARE=bench tools/gpu-compare.sh     # both trees unpacked this way
#
# The binaries find libcudart, libcublas(Lt) and NCCL at run time (tools/gpu-run.sh's LD_LIBRARY_PATH
# and the system's), and libzmq, msgpack-c, libcyaml ... from .gpu-debs (its env.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tree=$here
if [ $# -eq 2 ]; then tree=$(cd "$1" && pwd); shift; fi
[ $# -eq 1 ] || { echo "usage: tools/gpu-pack.sh [TREE] OUT.tar.xz" >&2; exit 2; }
out=$(realpath -m "$1")
command -v nvcc >/dev/null || PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "gpu-pack: no nvcc (looked in PATH and /usr/local/cuda/bin)" >&2; exit 1; }
[ -f "$tree/Makefile" ] || { echo "gpu-pack: $tree has no Makefile" >&2; exit 2; }
B=build-pack
cd "$tree"
[ -d third_party/tokenizers ] || make deps >/dev/null
bins=$(make -s B=$B --eval='gp-bins: ; @echo $(ACTOR_BINS) $(TOOL_BINS)' gp-bins)
tests=""
for t in ${GPU_TESTS:-test_backend_cuda test_verify bench_cuda}; do
  # An older tree (a baseline) may lack one: skipped, said so.
  if [ -f tests/gpu/$t.c ] || [ -f tests/gpu/$t.cu ]; then tests="$tests $B/gpu-tests/$t"; else echo "gpu-pack: $tree has no tests/gpu/$t: not packed"; fi
done
echo "gpu-pack: building $(echo $bins $tests | wc -w) binaries of $tree in $B (log: $B/pack.log)"
mkdir -p $B
make B=$B ARCH="${ARCH:--march=x86-64-v3}" -j"${JOBS:-$(nproc)}" $bins $tests >$B/pack.log 2>&1 \
  || { tail -20 $B/pack.log; echo "gpu-pack: build FAILED" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/bin" "$stage/build/gpu-tests"
cp $bins "$stage/build/bin/"
for t in $tests; do cp "$t" "$stage/build/gpu-tests/"; done
tar -C "$stage" -cf - build | xz -T1 --lzma2=preset=6,dict=192MiB >"$out"
echo "gpu-pack: $out ($(du -h "$out" | cut -f1)), tree at $(git -C "$tree" rev-parse --short HEAD 2>/dev/null || echo '?')"
