#!/usr/bin/env bash
# tools/gpu-run.sh — everything the GPU node checks and measures, in one call, from the repo root:
#   . .gpu-debs/env.sh && TROUPE_OFFLINE=1 tools/gpu-run.sh
# 1. builds everything with CUDA (make -j16: libtroupe, libtroupe_cuda, tools, unit and GPU tests);
# 2. runs the unit tests (tests/run.sh; SCENARIOS=1 runs the scenario tests too);
# 3. runs the GPU tests (build/gpu-tests/test_backend_cuda: every op against the CPU backend, and
#    the transformers fixtures end to end on CUDA), with PDL (default) and with plain launches, and
#    its quantized matmuls again on the older paths (TROUPE_CUDA_QDEQUANT_CHUNKS=0,
#    TROUPE_CUDA_QUANT_I8_GEMM=0, TROUPE_CUDA_QGEMV_MAX_M=8, TROUPE_CUDA_QGEMV_WIDE=0), which must stay right too;
# 4. benchmarks: copy bandwidth and the bf16 GEMM ceiling (build/gpu-tests/bench_cuda, which also
#    times the backend's M=1 matmuls), then troupe-generate on Llama-3.1-8B's shape (dummy bf16
#    weights, 128 prompt ids, 128 greedy tokens, --ignore-eos) on the CUDA backend, with the GEMV
#    backend's defaults (GEMV 4 warps per row, PDL launches), with PDL off, with 8 warps per row,
#    and with cuBLASLt at M=1, next to the HBM bound (weight bytes per token / copy bandwidth).
# Logs go to $OUT (the device tool's folder) or build/gpu-logs; a short table is printed last.
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-logs}
mkdir -p "$OUT"
export TROUPE_OFFLINE=1
status=0
# Stopped early (timeout, ^C) or not, no cluster of ours outlives this script: a second gpu-run in
# the same call would find the GPUs' memory taken by the first one's workers. It stops EVERY
# troupe process of the machine (the scenario scripts it starts are not signalled by a timeout):
# meant for the GPU node, where it is the only user.
s_stop_clusters() {
  # Programs only (the command's first word is a troupe binary): a make of another tree whose
  # targets name build/bin/troupe-* must survive this one's exit.
  pkill -TERM -f "^[^ ]*build/bin/troupe-supervisor" 2>/dev/null && sleep 3
  pkill -KILL -f "^[^ ]*build/bin/troupe-" 2>/dev/null
  return 0
}
trap 's_stop_clusters' EXIT
trap 'exit 143' TERM INT
step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }
# wait_links TOPO: on a topology with workers on several GPUs, waits (60 s at most) until every
# prefill worker reports an NCCL link up: a link comes up a second or so after READY, and the
# hand-offs before it go by shared memory, which a measurement of NCCL must not count.
wait_links() {
  local t0=$(date +%s%N)
  while [ $(( ($(date +%s%N) - t0) / 1000000 )) -lt 60000 ]; do
    build/bin/troupe-top --topology "$1" --json 2>/dev/null | python3 -c 'import json, sys
p = [a for a in json.load(sys.stdin).get("actors", []) if a.get("role") == "prefill"]
ok = p and all(any(m["name"] == "nccl_links_ready" and m["value"] >= 1 for m in a["metrics"]) for a in p)
sys.exit(0 if ok else 1)' && { echo "NCCL links up $(( ($(date +%s%N) - t0) / 1000000 )) ms after READY"; return 0; }
    sleep 0.1
  done
  echo "NCCL links not up 60 s after READY"; return 1
}

# ---- toolchain ------------------------------------------------------------------------------------
if [ -z "${PKG_CONFIG_SYSROOT_DIR:-}" ] && [ -f .gpu-debs/env.sh ]; then . .gpu-debs/env.sh; fi
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$d/nvcc" ] && PATH="$d:$PATH" && break; done
fi
NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ]; then echo "gpu-run: no nvcc on this machine"; exit 1; fi
CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
# cudart / cublas / cublasLt: wherever this image keeps them; a folder of links gives the linker
# the unversioned names and the loader the versioned ones.
LIBDIR=/tmp/troupe-cudalib
mkdir -p "$LIBDIR"
for lib in libcudart libcublas libcublasLt; do
  found=""
  for d in "$CUDA_HOME/lib64" "$CUDA_HOME/targets/x86_64-linux/lib" /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
    found=$(ls "$d/$lib.so" "$d/$lib.so."[0-9]* 2>/dev/null | head -1)
    [ -n "$found" ] && break
  done
  [ -z "$found" ] && found=$(ldconfig -p | awk -v l="$lib.so" '$1 ~ "^"l {print $NF; exit}')
  if [ -z "$found" ]; then echo "gpu-run: $lib not found"; exit 1; fi
  real=$(readlink -f "$found")
  ln -sf "$real" "$LIBDIR/$lib.so"
  for v in "$(dirname "$found")/$lib.so."[0-9]*; do [ -e "$v" ] && ln -sf "$real" "$LIBDIR/$(basename "$v")"; done
done
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv; \
  echo "nvcc: $NVCC ($("$NVCC" --version | tail -1))"; ls -l "$LIBDIR"; } >"$OUT/build.log" 2>&1
cat "$OUT/build.log"

# ---- build ----------------------------------------------------------------------------------------
step build
# PREBUILT=1: build/ came from tools/gpu-pack.sh (built elsewhere); nothing is compiled here, and
# the steps below use what it holds (a GPU test it lacks is skipped or reported missing).
if [ "${PREBUILT:-0}" = 1 ]; then
  [ -x build/bin/troupe-generate ] || { echo "gpu-run: PREBUILT=1 but no build/bin/troupe-generate (unpack tools/gpu-pack.sh's archive first)"; exit 1; }
  echo "prebuilt: $(ls build/bin | wc -l) programs, $(ls build/gpu-tests 2>/dev/null | wc -l) GPU tests; not built here" | tee -a "$OUT/build.log"
else
  MK=(make -j16 NVCC="$NVCC" CUDA_HOME="$CUDA_HOME" CUDA_LIBDIR="$LIBDIR")
  t0=$(date +%s)
  "${MK[@]}" gpu-tests build/bin/troupe-generate >>"$OUT/build.log" 2>&1 || { echo "build of the GPU targets FAILED"; status=1; }
  "${MK[@]}" -k all >>"$OUT/build.log" 2>&1 || { echo "make all FAILED (some targets)"; status=1; }
  grep -E "error|warning" "$OUT/build.log" | grep -v "^make" | head -30
  echo "build: $(( $(date +%s) - t0 )) s"
fi

# ---- unit tests -----------------------------------------------------------------------------------
step "unit tests"
[ "${SKIP_TESTS:-0}" = 1 ] || [ "${SKIP_UNIT:-0}" = 1 ] && echo "skipped (SKIP_TESTS=1 or SKIP_UNIT=1)"
pattern='^test_'
[ "${SCENARIOS:-0}" = 1 ] && pattern='.'
[ "${SKIP_TESTS:-0}" = 1 ] || [ "${SKIP_UNIT:-0}" = 1 ] || TESTS="$pattern" timeout 300 tests/run.sh >"$OUT/unit.log" 2>&1 || status=1
tail -25 "$OUT/unit.log"
unit=$(tail -1 "$OUT/unit.log")

# ---- GPU tests ------------------------------------------------------------------------------------
step "GPU tests"
gpu="not built"
if [ "${SKIP_TESTS:-0}" = 1 ]; then
  gpu="skipped (SKIP_TESTS=1)"
elif [ -x build/gpu-tests/test_backend_cuda ]; then
  # Twice: programmatic dependent launches (the default), then plain launches (TROUPE_CUDA_PDL=0).
  # Then the quantized matmuls once more on the older paths: the element-a-thread dequantization,
  # int8 W8A8 dequantized instead of its GEMM, W8A8 GEMVs of 8 rows a launch.
  { echo "### launches: PDL (default)"; timeout 200 build/gpu-tests/test_backend_cuda 2>&1 || { status=1; echo "### FAILED"; }
    echo "### launches: TROUPE_CUDA_PDL=0"; TROUPE_CUDA_PDL=0 timeout 200 build/gpu-tests/test_backend_cuda 2>&1 \
      || { status=1; echo "### FAILED"; }
    echo "### quantized matmuls: TROUPE_CUDA_QDEQUANT_CHUNKS=0 TROUPE_CUDA_QUANT_I8_GEMM=0 TROUPE_CUDA_QGEMV_MAX_M=8 TROUPE_CUDA_QGEMV_WIDE=0"
    TROUPE_CUDA_QDEQUANT_CHUNKS=0 TROUPE_CUDA_QUANT_I8_GEMM=0 TROUPE_CUDA_QGEMV_MAX_M=8 TROUPE_CUDA_QGEMV_WIDE=0 TROUPE_TEST_FILTER='*quant_matmul*' \
      timeout 100 build/gpu-tests/test_backend_cuda 2>&1 || { status=1; echo "### FAILED"; }; } >"$OUT/gpu-tests.log"
  grep -E '###|FAILED|ERROR|error|PASSED|rel err [0-9.e+-]+ \(bound 1e-0[24]\)|lockstep' "$OUT/gpu-tests.log" | head -60
  p=$(grep -oE '\[  PASSED  \] [0-9]+' "$OUT/gpu-tests.log" | awk '{s+=$4} END {print s+0}')
  f=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$OUT/gpu-tests.log" | awk '{s+=$4} END {print s+0}')
  gpu="$p passed, $f failed (PDL + plain launches + the older quantized paths)"
else
  status=1
fi

# The other GPU tests (tests/gpu/test_*.c besides the backend's: NCCL channel, ...), once each.
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  : >"$OUT/gpu-tests-other.log"
  for t in build/gpu-tests/test_*; do   # no pipe around the loop: status must survive it
    case $t in */test_backend_cuda|*.o) continue ;; esac
    [ -x "$t" ] || continue
    echo "### $(basename "$t")" >>"$OUT/gpu-tests-other.log"
    timeout 120 "$t" >>"$OUT/gpu-tests-other.log" 2>&1 || { status=1; echo "### FAILED" >>"$OUT/gpu-tests-other.log"; }
  done
  grep -E '^###|PASSED|FAILED|SKIPPED|_bw ' "$OUT/gpu-tests-other.log"
fi

# ---- benchmarks -----------------------------------------------------------------------------------
step "ceilings and backend matmuls"
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -x build/gpu-tests/bench_cuda ]; then   # SKIP_BENCH=1: not this time
  timeout 180 build/gpu-tests/bench_cuda >"$OUT/bench.log" 2>&1 || status=1
  cat "$OUT/bench.log"
fi
# GEMM_BENCH=1: build/gpu-tests/bench_gemm, cuBLASLt's first heuristic choice against the best of
# its candidates (and a bf16 output) on the GEMMs of a served 8B step at M = 256, 2,048, 2,304.
if [ "${GEMM_BENCH:-0}" = 1 ] && [ -x build/gpu-tests/bench_gemm ]; then
  step "cuBLASLt candidates on the 8B step's GEMMs"
  timeout 300 build/gpu-tests/bench_gemm >"$OUT/gemm.log" 2>&1 || status=1
  cat "$OUT/gemm.log"
fi
val() { awk -v k="$1" '$1 == k {print $2; exit}' "$OUT/bench.log" 2>/dev/null; }
bw=$(val copy_bandwidth); tf=$(val gemm_bf16_8192)
gemv_line=""
for v in gemv_cc_w4 gemv_cc gemv_mma4 gemv_mma8 gemv_mma_k128 cublaslt; do
  gemv_line+="$v $(val ${v}_step_ms) ms $(val ${v}_bandwidth) TB/s; "
done
split_line="M=512: split $(val gemm_M512_split), single $(val gemm_M512_single) TFLOP/s"

step "Llama-3.1-8B shape, batch 1 decode"
ids=$(python3 -c 'print(",".join(str((i * 7919 + 1000) % 120000) for i in range(128)))')
gen() {   # name, then environment assignments
  local name=$1; shift
  if [ -x build/bin/troupe-generate ]; then
    env "$@" timeout 240 build/bin/troupe-generate tests/fixtures/models/llama-3.1-8b-shape --load-format dummy \
      --dtype bf16 --backend cuda --ids "$ids" --max-tokens 128 --ignore-eos --temperature 0 --json ${GEN_KV:+--kv-dtype $GEN_KV} \
      >"$OUT/generate-$name.json" 2>/tmp/generate-$name.err || { status=1; cat /tmp/generate-$name.err; }
    head -c 600 "$OUT/generate-$name.json"; echo
  fi
}
# GEN_VARIANTS limits the runs (each loads 16 GB of dummy weights): default nographs graphplain
# nopdl w4 w8 cublaslt (and on request: cc, mma4, fp8). The default replays each decode step from a
# CUDA graph (recorded with PDL edges; graphplain: without) and runs the bf16 GEMV on tensor cores
# with 8 warps per block (mma4: 4; cc: on CUDA cores, TROUPE_CUDA_GEMV_MMA=0, whose warps per row
# w4 / w8 set: 4 or 8 for every matrix, else by the matrix).
variants=" ${GEN_VARIANTS:-default nographs graphplain nopdl w4 w8 cublaslt} "
[[ $variants == *" default "* ]] && gen default
[[ $variants == *" nographs "* ]] && gen nographs TROUPE_CUDA_GRAPHS=0
[[ $variants == *" graphplain "* ]] && gen graphplain TROUPE_CUDA_GRAPH_PDL=0
[[ $variants == *" nopdl "* ]] && gen nopdl TROUPE_CUDA_PDL=0 TROUPE_CUDA_GRAPHS=0
[[ $variants == *" w4 "* ]] && gen w4 TROUPE_CUDA_GEMV_MMA=0 TROUPE_CUDA_GEMV_WARPS=4
[[ $variants == *" w8 "* ]] && gen w8 TROUPE_CUDA_GEMV_MMA=0 TROUPE_CUDA_GEMV_WARPS=8
[[ $variants == *" cc "* ]] && gen cc TROUPE_CUDA_GEMV_MMA=0
[[ $variants == *" mma4 "* ]] && gen mma4 TROUPE_CUDA_GEMV_MMA=4
[[ $variants == *" cublaslt "* ]] && gen cublaslt TROUPE_CUDA_GEMV_MAX_M=0 TROUPE_CUDA_GEMM_SPLIT=0 TROUPE_CUDA_PDL=0
# fp8: the KV cache in fp8 e4m3 (--kv-dtype fp8); batch 1 reads little KV, so this is about the same.
[[ $variants == *" fp8 "* ]] && GEN_KV=fp8 gen fp8
report() {   # name -> "decode tok/s | prefill tok/s | bound | fraction"
  python3 - "$OUT/generate-$1.json" "${bw:-0}" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print("no result (%s)" % e.__class__.__name__); sys.exit(0)
bw = float(sys.argv[2] or 0) * 1e12
t = j["timings"]; wb = j["model"]["weight_bytes_per_token"]
bound = bw / wb if bw else 0
d = t["decode_tokens_per_s"]
print("%.1f tok/s (%.2f ms/token) | HBM bound %.0f tok/s (%.2f GB/token) -> %.0f%% | prefill %.0f tok/s | load %.1f s"
      % (d, 1e3 / d if d else 0, bound, wb / 1e9, 100 * d / bound if bound else 0, t["prompt_tokens_per_s"], t["load_ms"] / 1e3))
EOF
}
dec_def=$(report default); dec_nog=$(report nographs); dec_gplain=$(report graphplain); dec_nopdl=$(report nopdl); dec_w4=$(report w4); dec_w8=$(report w8); dec_cc=$(report cc); dec_mma4=$(report mma4); dec_lt=$(report cublaslt); dec_fp8=$(report fp8)

# ---- the engine alone: prefill and batched decode steps ------------------------------------------
# ENGINE=1 (default): troupe-bench-engine on the 8B shape (one weight load): a 1,000-token prefill
# and the decode step at ENGINE_BATCH sizes over 1,000 tokens of context, with the per-op profile,
# next to the copy bandwidth; ENGINE_SPLIT0=1 repeats it with TROUPE_CUDA_GEMM_SPLIT=0.
# ENGINE_MIXED=N adds --mixed N: a colocated step (the largest batch's decode rows and an N-token
# prompt in one forward) against the prompt alone.
engine_line="not run (ENGINE=0)"
if [ "${ENGINE:-1}" = 1 ] && [ -x build/bin/troupe-bench-engine ]; then
  step "engine: prefill and batched decode (troupe-bench-engine)"
  eng() {   # name, then environment assignments
    local name=$1; shift
    env "$@" timeout 300 build/bin/troupe-bench-engine "${ENGINE_MODEL:-tests/fixtures/models/llama-3.1-8b-shape}" \
      --load-format dummy --dtype bf16 --backend cuda --prompt-len "${ENGINE_PROMPT:-1000}" \
      --batch "${ENGINE_BATCH:-1,16,64,256}" --steps "${ENGINE_STEPS:-16}" --copy-bw "${bw:-0}" --profile \
      ${ENG_KV:+--kv-dtype $ENG_KV} ${ENGINE_MIXED:+--mixed $ENGINE_MIXED} \
      --json "$OUT/engine-$name.json" >"$OUT/engine-$name.txt" 2>&1 || status=1
    cat "$OUT/engine-$name.txt"
  }
  eng default
  [ "${ENGINE_SPLIT0:-0}" = 1 ] && eng split0 TROUPE_CUDA_GEMM_SPLIT=0
  # ENGINE_NOGRAPHS=1: again with decode steps launched op by op (TROUPE_CUDA_GRAPHS=0).
  [ "${ENGINE_NOGRAPHS:-0}" = 1 ] && eng nographs TROUPE_CUDA_GRAPHS=0
  # ENGINE_FP8=1: again with an fp8 e4m3 KV cache (--kv-dtype fp8): half the KV bytes per step.
  [ "${ENGINE_FP8:-0}" = 1 ] && ENG_KV=fp8 eng fp8
  # ENGINE_MLPOFF=1: again (fp8 KV) without the dense MLP's SwiGLU written into down's input
  # (TROUPE_CUDA_MLP_FUSE=0): what the fusion gains, against ENGINE_FP8's run.
  [ "${ENGINE_MLPOFF:-0}" = 1 ] && ENG_KV=fp8 eng fp8-mlpoff TROUPE_CUDA_MLP_FUSE=0
  # ENGINE_MOE=1: the same on Qwen3-30B-A3B's shape (61 GB of dummy bf16 weights, 128 experts).
  if [ "${ENGINE_MOE:-0}" = 1 ]; then
    ENGINE_MODEL=tests/fixtures/models/qwen3-30b-a3b-shape eng moe
    [ "${ENGINE_NOGRAPHS:-0}" = 1 ] && ENGINE_MODEL=tests/fixtures/models/qwen3-30b-a3b-shape eng moe-nographs TROUPE_CUDA_GRAPHS=0
  fi
  engine_line="see engine-*.txt"
fi

# ---- speculative verify steps --------------------------------------------------------------------
# VERIFY_TABLE=1: build/gpu-tests/test_verify (attention of k + 1 rows per sequence against the CPU
# backend, k = 0..7, bf16 and fp8 caches; verify steps from CUDA graphs bit for bit), the attention
# and graph cases of the other GPU tests (the decode kernel it extends), then troupe-bench-engine
# --verify-table on the 8B shape (dummy weights: step costs only) at VERIFY_ACCEPT's acceptance
# rates (default 0.5,0.6,0.7,0.8) and VERIFY_KV's cache dtype (default bf16).
verify_line="not run (VERIFY_TABLE=0)"
if [ "${VERIFY_TABLE:-0}" = 1 ] && [ -x build/gpu-tests/test_verify ] && [ -x build/bin/troupe-bench-engine ]; then
  step "speculative verify steps (test_verify, troupe-bench-engine --verify-table)"
  { timeout 150 build/gpu-tests/test_verify && TROUPE_TEST_FILTER='*attention*' timeout 120 build/gpu-tests/test_backend_cuda \
      && timeout 60 build/gpu-tests/test_graphs; } >"$OUT/verify-tests.log" 2>&1 && vt=passed || { vt=FAILED; status=1; }
  grep -E 'PASSED|FAILED|time:|rel err .*[0-9]e-0[0-2]' "$OUT/verify-tests.log" | head -40
  timeout 240 build/bin/troupe-bench-engine tests/fixtures/models/llama-3.1-8b-shape --load-format dummy --dtype bf16 \
    --backend cuda --kv-dtype "${VERIFY_KV:-bf16}" --verify-table --prompt-len 1000 --steps 5 \
    --accept "${VERIFY_ACCEPT:-0.5,0.6,0.7,0.8}" --json "$OUT/verify-table.json" >"$OUT/verify-table.txt" 2>&1 || { status=1; vt="$vt, table FAILED"; }
  cat "$OUT/verify-table.txt"
  verify_line="tests $vt; table in verify-table.txt"
fi

# ---- serving on the GPU ---------------------------------------------------------------------------
# SERVE=1: the one-GPU topology (prefill and decode processes on GPU 0, Llama-3.1-8B shape, dummy
# bf16 weights) under the supervisor, then troupe-bench: input 1000 / output SERVE_OUT tokens at
# SERVE_CONC concurrency levels, with the decode bytes/s as a fraction of the copy bandwidth above
# (the model's bytes from the topology's config.json); the plot (serve-bench.png, with the
# transformers line when HF=1) is drawn with the table. MULTITURN=1 adds troupe-bench --multi-turn
# (MT_TURNS turns, a shared MT_SYS-token system prompt, MT_TURN new tokens and MT_OUT output
# tokens per turn, MT_CONC users): cache hit rate and TTFT with and without prefix reuse.
# Reports the time from supervisor start to READY and to the first token.
serve_line="not run (SERVE=1 runs it)"
# SERVE_TOPO: the topology served (default the 8B one; tools/bench/h200-moe.yaml: Qwen3-30B-A3B).
TOPO=${SERVE_TOPO:-tools/bench/h200-8b.yaml}
SERVE_MODEL=$(awk '/^model:/ {m = 1} m && $1 == "path:" {print $2; exit}' "$TOPO")
SERVE_KV=$(awk '/^model:/ {m = 1} m && $1 == "kv_dtype:" {print $2; exit}' "$TOPO")
if [ "${SERVE:-0}" = 1 ] && [ -x build/bin/troupe-supervisor ]; then
  step "serving: $TOPO under the supervisor"
  rm -f /tmp/serve.ready
  if [ "${SERVE_EXACT:-1}" = 1 ]; then   # the one-process reference, before the cluster takes the GPUs
    ex_ids=$(python3 -c 'print(",".join(str((i * 104729 + 77) % 120000) for i in range(40)))')
    ex_gen=$(timeout 200 build/bin/troupe-generate "$SERVE_MODEL" --load-format dummy --dtype bf16 \
      --backend cuda --ids "$ex_ids" --max-tokens 24 --ignore-eos --temperature 0 --json ${SERVE_KV:+--kv-dtype $SERVE_KV} 2>/dev/null \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
  fi
  # Where the workers' loops spent their time (cumulative since start): decode steps, hand-offs
  # taken in, write-back submissions, recomputes; prefill forwards. Saved as JSON too.
  loop_times() {
    build/bin/troupe-top --topology $TOPO --json >"$OUT/metrics-$1.json" 2>/dev/null
    python3 - "$OUT/metrics-$1.json" "$1" <<'EOF'
import json, sys
try:
    actors = json.load(open(sys.argv[1])).get("actors", [])
except Exception as e:
    print("loop times: no metrics (%s)" % e.__class__.__name__); sys.exit(0)
for a in actors:
    m = {x["name"]: x["value"] for x in a.get("metrics", [])}
    if "forward_seconds_total" not in m:
        continue
    keys = [k for k in ("steps_total", "forward_seconds_total", "handoff_seconds_total", "writeback_seconds_total",
                        "recompute_seconds_total", "writebacks_total", "writebacks_shed_total", "preemptions_total") if k in m]
    print("loop times after %s, %s: %s" % (sys.argv[2], a.get("name"), ", ".join("%s %.6g" % (k.replace("_total", ""), m[k]) for k in keys)))
EOF
  } >>"$OUT/loop-times.txt"
  t0=$(date +%s%N)
  build/bin/troupe-supervisor --topology $TOPO --ready-file /tmp/serve.ready >"$OUT/serve-cluster.log" 2>&1 &
  sup=$!
  for _ in $(seq 3000); do [ -s /tmp/serve.ready ] && break; kill -0 $sup 2>/dev/null || break; sleep 0.1; done
  if [ -s /tmp/serve.ready ]; then
    ready_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    [ "${SERVE_GPUS:-1}" -gt 1 ] && { wait_links $TOPO || status=1; }
    timeout 60 build/bin/troupe-client --topology $TOPO --json submit --ids 1000,2000,3000 --max-tokens 1 --temperature 0 >/dev/null 2>&1
    first_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    # Exactness on the GPU: greedy through the cluster (prefill -> KV hand-off -> decode) equals
    # the one-process engine on the same dummy weights (run before the cluster started, so the two
    # never share a GPU's memory; SERVE_EXACT=0 skips it).
    exact="exactness check skipped (SERVE_EXACT=0)"
    if [ "${SERVE_EXACT:-1}" = 1 ]; then
      ex_cl=$(timeout 60 build/bin/troupe-client --topology $TOPO --json submit --ids --max-tokens 24 \
        --ignore-eos --temperature 0 "$ex_ids" | python3 -c 'import json, sys
ids = []
for l in sys.stdin:
    m = json.loads(l)
    if m["type"] == "token": ids += m["tokens"]
print(ids)')
      if [ -n "$ex_gen" ] && [ "$ex_gen" = "$ex_cl" ]; then exact="cluster greedy == generate (24 tokens)"; else exact="MISMATCH cluster $ex_cl vs generate $ex_gen"; status=1; fi
    fi
    echo "$exact"
    copy_bw=(); [ -n "$bw" ] && copy_bw=(--copy-bw "$(awk -v t="$bw" 'BEGIN {print t * 1000}')")   # TB/s -> GB/s
    timeout "${SERVE_TIMEOUT:-240}" build/bin/troupe-bench --topology $TOPO --vocab 120000 \
      --input-len "${SERVE_IN:-1000}" --output-len "${SERVE_OUT:-128}" --concurrency "${SERVE_CONC:-1,16,64}" \
      ${SERVE_ROUNDS:+--rounds "$SERVE_ROUNDS"} \
      --gpus "${SERVE_GPUS:-1}" "${copy_bw[@]}" --json "$OUT/serve-bench.json" >"$OUT/serve-bench.txt" 2>&1 || status=1
    cat "$OUT/serve-bench.txt"
    loop_times serve
    if [ "${MULTITURN:-0}" = 1 ]; then
      step "serving: multi-turn conversations, with and without prefix reuse"
      timeout "${MT_TIMEOUT:-300}" build/bin/troupe-bench --topology $TOPO --vocab 120000 \
        --multi-turn --turns "${MT_TURNS:-4}" --system-len "${MT_SYS:-512}" --turn-len "${MT_TURN:-128}" \
        --output-len "${MT_OUT:-128}" --concurrency "${MT_CONC:-1,16}" --json "$OUT/serve-multiturn.json" \
        >"$OUT/serve-multiturn.txt" 2>&1 || status=1
      cat "$OUT/serve-multiturn.txt"
      loop_times multiturn
    fi
    build/bin/troupe-top --topology $TOPO --once >>"$OUT/serve-bench.txt" 2>&1
    ipc=$(build/bin/troupe-top --topology $TOPO --json | python3 -c 'import json, sys
print(sum(m["value"] for a in json.load(sys.stdin).get("actors", []) for m in a["metrics"] if m["name"] == "transfers_cuda_ipc_total"))')
    serve_line="ready ${ready_ms} ms, first token ${first_ms} ms after supervisor start; $exact; CUDA IPC hand-offs $ipc"
  else
    serve_line="cluster did not become ready"; status=1
    tail -30 "$OUT/serve-cluster.log"
  fi
  kill -TERM $sup 2>/dev/null; wait $sup 2>/dev/null
fi

# ---- two or more GPUs (issue #6) ------------------------------------------------------------------
# MULTIGPU=1 on a node with >= 2 GPUs: NCCL's own point-to-point bandwidth GPU 0 -> 1
# (build/gpu-tests/bench_nccl) beside the KV hand-off over our NCCL channel (test_nccl_chan's
# kv_handoff_nccl_bw, run with the other GPU tests); the hand-off's share of TTFT for 1,000- and
# 8,000-token prompts on MULTI_TOPO (default tools/bench/h200x2-8b.yaml: prefill on GPU 0, decode
# on GPU 1; 5 prompts each at concurrency 1, the decode workers' handoff_seconds_total per
# hand-off against the TTFT p50); then kill -9 of the decode worker during a hand-off
# (tests/gpu/scenario_nccl_kill9.sh). The served sweep on several GPUs is SERVE=1 with
# SERVE_TOPO=tools/bench/h200x{2,4,8}-8b.yaml SERVE_GPUS=N (output tokens/s per GPU in its table).
# EXACT1=1 on one GPU: the engine fixtures through prefill and decode workers on GPU 0 (CUDA IPC)
# against troupe-generate on the GPU (GPUS=1 tests/scenario/serve_exact.sh).
exact1_line="not run (EXACT1=1 runs it)"
if [ "${EXACT1:-0}" = 1 ]; then
  step "engine fixtures through the cluster on one GPU (serve_exact GPUS=1)"
  if GPUS=1 timeout 300 bash tests/scenario/serve_exact.sh >"$OUT/exact1.txt" 2>&1; then exact1_line="PASS"
  else exact1_line="FAIL (exact1.txt)"; status=1; fi
  grep -E "prompts equal|PASS|FAIL|!=" "$OUT/exact1.txt"
fi
multi_line="not run (MULTIGPU=1 runs it)"
if [ "${MULTIGPU:-0}" = 1 ]; then
  step "two or more GPUs: NCCL baseline, hand-off share of TTFT, kill -9 during a hand-off"
  MTOPO=${MULTI_TOPO:-tools/bench/h200x2-8b.yaml}
  # The engine fixtures through prefill on GPU 0 -> NCCL -> decode on GPU 1, against one GPU.
  GPUS=2 timeout 300 bash tests/scenario/serve_exact.sh >"$OUT/multi-exact.txt" 2>&1 || { status=1; echo "FAIL serve_exact on 2 GPUs" >>"$OUT/multi-exact.txt"; }
  # ... and with both workers on GPU 0 (CUDA IPC): a failure on two GPUs alone points at NCCL.
  GPUS=1 timeout 300 bash tests/scenario/serve_exact.sh >"$OUT/multi-exact1.txt" 2>&1 || { status=1; echo "FAIL serve_exact on 1 GPU" >>"$OUT/multi-exact1.txt"; }
  { [ -x build/gpu-tests/bench_nccl ] && timeout 120 build/gpu-tests/bench_nccl; \
    grep -h "kv_handoff_nccl_bw\|SKIPPED" "$OUT/gpu-tests-other.log" 2>/dev/null; } >"$OUT/multigpu.txt" 2>&1
  handoff_totals() {   # -> "seconds transfers" summed over the decode workers
    build/bin/troupe-top --topology "$MTOPO" --json 2>/dev/null | python3 -c 'import json, sys
s = n = 0
for a in json.load(sys.stdin).get("actors", []):
    if a.get("role") == "decode":
        m = {x["name"]: x["value"] for x in a["metrics"]}
        s += m.get("handoff_seconds_total", 0); n += m.get("transfers_total", 0)
print(s, n)'
  }
  rm -f /tmp/multi.ready
  build/bin/troupe-supervisor --topology "$MTOPO" --ready-file /tmp/multi.ready >"$OUT/multi-cluster.log" 2>&1 &
  msup=$!
  for _ in $(seq 3000); do [ -s /tmp/multi.ready ] && break; kill -0 $msup 2>/dev/null || break; sleep 0.1; done
  if [ -s /tmp/multi.ready ]; then
    wait_links "$MTOPO" >>"$OUT/multigpu.txt" || status=1
    for in_len in 1000 8000; do
      before=$(handoff_totals)
      timeout 300 build/bin/troupe-bench --topology "$MTOPO" --vocab 120000 --input-len $in_len --output-len 16 \
        --concurrency 1 --rounds 5 --json "$OUT/handoff-$in_len.json" >"$OUT/handoff-$in_len.txt" 2>&1 || status=1
      after=$(handoff_totals)
      python3 - "$OUT/handoff-$in_len.json" "$before" "$after" "$in_len" >>"$OUT/multigpu.txt" <<'PY' || status=1
import json, sys
lv = json.load(open(sys.argv[1]))["levels"][0]
(s0, n0), (s1, n1) = (map(float, x.split()) for x in sys.argv[2:4])
per = 1e3 * (s1 - s0) / (n1 - n0) if n1 > n0 else float("nan")
print("prompt %s tokens: TTFT p50 %.1f ms (prefill %.1f, rest %.1f); hand-off taken in %.2f ms on average "
      "(%d hand-offs) = %.1f%% of TTFT" % (sys.argv[4], lv["ttft_ms_p50"], lv.get("ttft_prefill_ms_p50", 0),
      lv.get("ttft_rest_ms_p50", 0), per, n1 - n0, 100 * per / lv["ttft_ms_p50"]))
PY
    done
  else
    echo "cluster $MTOPO did not become ready" >>"$OUT/multigpu.txt"; status=1
  fi
  kill -TERM $msup 2>/dev/null; wait $msup 2>/dev/null
  TOPO="$MTOPO" LOG="$OUT/kill9-cluster.log" timeout 300 tests/gpu/scenario_nccl_kill9.sh >>"$OUT/multigpu.txt" 2>&1 || status=1
  grep -E "prompts equal|over NCCL|PASS|FAIL" "$OUT/multi-exact.txt" >>"$OUT/multigpu.txt"
  grep -E "prompts equal|PASS|FAIL|!=" "$OUT/multi-exact1.txt" | sed 's/^/one GPU: /' >>"$OUT/multigpu.txt"
  cat "$OUT/multigpu.txt"
  multi_line="see multigpu.txt"
fi

# ---- the transformers baseline -------------------------------------------------------------------
# HF=1: Hugging Face transformers (eager attention, bf16, random weights of the same shape) on the
# same GPU in the same run, same input/output lengths, batch = each concurrency level; the model
# served (SERVE_TOPO's) unless HF_MODEL names another.
hf_line="not run (HF=1 runs it)"
if [ "${HF:-0}" = 1 ]; then
  step "transformers baseline"
  timeout "${HF_TIMEOUT:-240}" python3 tools/bench_hf.py --model "${HF_MODEL:-$SERVE_MODEL}" \
    --input-len 1000 --output-len "${HF_OUT:-${SERVE_OUT:-128}}" --batch "${HF_CONC:-${SERVE_CONC:-1,16,64}}" --json "$OUT/hf.json" \
    >"$OUT/hf.txt" 2>&1 || status=1
  cat "$OUT/hf.txt"
  hf_line="see hf.txt"
fi

# ---- a prefix from the KV cache's disk tier ---------------------------------------------------------
# DISK_TTFT=1: TTFT of an 8,000-token prefix of the 8B shape fetched from the disk tier against
# computing it, with the disk's read bandwidth in the same run (tools/bench-disk-ttft.sh,
# docs/kv-cache.md). The tier's file goes on the tree's disk (DISK_TTFT_DIR), not in $OUT.
disk_ttft_line="not run (DISK_TTFT=1 runs it)"
if [ "${DISK_TTFT:-0}" = 1 ] && [ -x build/bin/troupe-bench-disk ]; then
  step "a prefix from the disk tier"
  disk_dir=${DISK_TTFT_DIR:-build/bench-disk-ttft-kv}
  rm -f "$disk_dir/blocks.kvd"   # a previous run's file: the script refuses to start on one
  BACKEND=cuda DISK_DIR="$disk_dir" timeout "${DISK_TTFT_TIMEOUT:-420}" tools/bench-disk-ttft.sh "$OUT/disk-ttft" \
    >"$OUT/disk-ttft.txt" 2>"$OUT/disk-ttft.log" && disk_ttft_line="see disk-ttft.txt" ||
    { status=1; disk_ttft_line="FAILED (disk-ttft.txt, disk-ttft.log)"; tail -20 "$OUT/disk-ttft.log"; }
  cat "$OUT/disk-ttft.txt"
fi

# ---- speculation's sweep (issue 16) ---------------------------------------------------------------
# SPEC_SWEEP=1: tools/bench-spec.sh on the GPU (BACKEND=cuda; SPEC_BACKEND=cpu tries the step on a
# machine without one), its own clusters with both workers on GPU 0, over the KJV models in
# TROUPE_MODELS (default ../shared/models; on the GPU machine an ignored folder of the checkout,
# carried along, holding kjv-dense, kjv-draft and kjv-text): SPEC_METHOD (default ngram), SPEC_KS
# (default "0 1 2 3 4 5 6 7 sched"), SPEC_CONC (1,16,64,96), SPEC_REPEATS whole sweeps (default 3:
# a level lasts a fraction of a second, so one sweep's ratios move by 10-20%), SPEC_ROUNDS (10) and
# SPEC_WARMUP (3) rounds a level. The summary (medians, and each repeat's ratios against k = 0 and
# the best fixed length) goes into the table; every sweep's tables, troupe-bench JSON and the
# scheduled entry's policy log stay in $OUT/spec (in the archive).
spec_line="not run (SPEC_SWEEP=1 runs it)"
if [ "${SPEC_SWEEP:-0}" = 1 ] && [ -x build/bin/troupe-bench ]; then
  step "speculation's sweep (tools/bench-spec.sh, ${SPEC_METHOD:-ngram})"
  spec_ks=${SPEC_KS:-0 1 2 3 4 5 6 7 sched}
  if BACKEND="${SPEC_BACKEND:-cuda}" METHOD="${SPEC_METHOD:-ngram}" KS="$spec_ks" CONC="${SPEC_CONC:-1,16,64,96}" \
      REPEATS="${SPEC_REPEATS:-3}" ROUNDS="${SPEC_ROUNDS:-10}" WARMUP_ROUNDS="${SPEC_WARMUP:-3}" \
      timeout "${SPEC_TIMEOUT:-560}" tools/bench-spec.sh "$OUT/spec" >"$OUT/spec.txt" 2>&1; then
    spec_line="see spec.txt"
  else
    status=1; spec_line="FAILED or cut short (spec.txt; the summary below is of the complete repeats)"
    tail -20 "$OUT/spec.txt"
  fi
  # Also after a timeout: the repeats that finished.
  if [ "${SPEC_REPEATS:-3}" -gt 1 ]; then
    python3 tools/bench/spec_repeats.py "$OUT/spec" $spec_ks >"$OUT/spec-summary.txt" 2>&1 || status=1
  else
    cp "$OUT/spec/table.txt" "$OUT/spec-summary.txt" 2>/dev/null || status=1
  fi
  cat "$OUT/spec-summary.txt"
fi

# ---- the table ------------------------------------------------------------------------------------
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fix=$(grep -cE 'greedy [0-9]+/[0-9]+ equal|all [0-9]+ tokens equal' "$OUT/gpu-tests.log" 2>/dev/null)
bf16=$(grep -E 'llama-tied-bf16 +bf16 KV prompt' "$OUT/gpu-tests.log" 2>/dev/null | grep -oE 'rel err [0-9.e+-]+' | awk '{print $3}' | paste -sd/ -)
bf16f=$(grep -E 'llama-tied-bf16 +f32 KV prompt' "$OUT/gpu-tests.log" 2>/dev/null | grep -oE 'rel err [0-9.e+-]+' | awk '{print $3}' | paste -sd/ -)
bf16a=$(grep -E 'llama-tied-bf16 +bf16 KV bf16-act prompt' "$OUT/gpu-tests.log" 2>/dev/null | grep -oE 'rel err [0-9.e+-]+' | awk '{print $3}' | paste -sd/ -)
echo
echo "== Troupe CUDA backend on ${gpu_name:-?} (logs in $OUT)"
printf '%-30s %s\n' "unit tests" "${unit:-?}"
printf '%-30s %s\n' "GPU tests (CUDA vs CPU, e2e)" "$gpu"
printf '%-30s %s\n' "fixture greedy runs equal" "${fix:-0} (f32: must all be equal)"
printf '%-30s %s\n' "bf16 fixture logits rel err" "bf16 KV ${bf16:-?} (bound 1e-2 up to 32 tokens, else 3e-2); f32 KV ${bf16f:-?}"
printf '%-30s %s\n' "  every GEMM on bf16 activations" "${bf16a:-?} (bound 3e-2)"
printf '%-30s %s\n' "copy bandwidth D2D" "${bw:-?} TB/s (read + write)"
printf '%-30s %s\n' "bf16 GEMM 8192^3 cuBLASLt" "${tf:-?} TFLOP/s"
printf '%-30s %s\n' "8B step matmuls M=1" "$gemv_line"
printf '%-30s %s\n' "gate GEMM through backend" "$split_line"
printf '%-30s %s\n' "8B decode b=1 (defaults)" "$dec_def"
printf '%-30s %s\n' "8B decode b=1, no graphs" "$dec_nog"
printf '%-30s %s\n' "8B decode b=1, graphs, no PDL" "$dec_gplain"
printf '%-30s %s\n' "8B decode b=1, PDL+graphs off" "$dec_nopdl"
printf '%-30s %s\n' "8B decode b=1, GEMV 4 warps" "$dec_w4"
printf '%-30s %s\n' "8B decode b=1, GEMV 8 warps" "$dec_w8"
printf '%-30s %s\n' "8B decode b=1, GEMV CUDA cores" "$dec_cc"
printf '%-30s %s\n' "8B decode b=1, tensor GEMV 4w" "$dec_mma4"
printf '%-30s %s\n' "8B decode b=1, cuBLASLt" "$dec_lt"
printf '%-30s %s\n' "8B decode b=1, fp8 KV" "$dec_fp8"
printf '%-30s %s\n' "8B engine (ENGINE=1)" "$engine_line"
for e in default nographs fp8 moe moe-nographs; do
  [ -s "$OUT/engine-$e.txt" ] && { echo "engine $e:"; grep -E '^prefill|^ +[0-9]+ +[0-9]+ ' "$OUT/engine-$e.txt"; }
done
printf '%-30s %s\n' "8B verify steps (VERIFY_TABLE)" "$verify_line"
printf '%-30s %s\n' "8B serving (SERVE=1)" "$serve_line"
[ -s "$OUT/serve-bench.txt" ] && grep -B1 -A6 '^ conc' "$OUT/serve-bench.txt"
[ -s "$OUT/serve-multiturn.txt" ] && grep -A6 '^multi-turn' "$OUT/serve-multiturn.txt"
[ -s "$OUT/loop-times.txt" ] && cat "$OUT/loop-times.txt"
printf '%-30s %s\n' "cluster exact, 1 GPU (EXACT1)" "$exact1_line"
printf '%-30s %s\n' "multi-GPU (MULTIGPU=1)" "$multi_line"
[ -s "$OUT/multigpu.txt" ] && grep -E "_bw|prompt .* tokens|PASS|FAIL|SKIPPED|prompts equal|over NCCL|links up" "$OUT/multigpu.txt"
printf '%-30s %s\n' "transformers (HF=1)" "$hf_line"
printf '%-30s %s\n' "disk-tier prefix (DISK_TTFT=1)" "$disk_ttft_line"
[ -s "$OUT/disk-ttft.txt" ] && grep -E "bandwidth|^  prefix|page cache|TTFT|medians|cached_tokens|blocks read|FAILED|NOTE" "$OUT/disk-ttft.txt"
printf '%-30s %s\n' "speculation (SPEC_SWEEP=1)" "$spec_line"
[ -s "$OUT/spec-summary.txt" ] && cat "$OUT/spec-summary.txt"
[ -s "$OUT/hf.txt" ] && grep -E '^(batch|hf )' "$OUT/hf.txt"
if [ -s "$OUT/serve-bench.json" ]; then   # output tokens/s per GPU against tokens/s per user
  hf_json=(); [ -s "$OUT/hf.json" ] && hf_json=(--hf "$OUT/hf.json")
  python3 tools/bench_plot.py "$OUT/serve-bench.json" "${hf_json[@]}" --out "$OUT/serve-bench.png" \
    --title "$(basename "${SERVE_MODEL:-?}") on ${gpu_name:-?}, input ${SERVE_IN:-1000} / output ${SERVE_OUT:-128}" || status=1
fi
# The device tool brings back few files: everything but the plot goes into one archive.
if [ "${ARCHIVE:-1}" = 1 ] && [ "$OUT" != build/gpu-logs ]; then
  ( cd "$OUT" && files=$(ls | grep -v -e '\.png$' -e '^gpu-run\.tgz$') && [ -n "$files" ] \
      && tar czf gpu-run.tgz $files && rm -rf $files )   # folders too (spec/): the tool brings back few files
fi
exit $status
