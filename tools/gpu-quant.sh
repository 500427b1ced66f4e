#!/usr/bin/env bash
# tools/gpu-quant.sh — the quantized weights' checks and figures on a GPU node, in one call (about
# 3 minutes after `make`):
#   . .gpu-debs/env.sh && tools/gpu-quant.sh [MODEL_DIR TEXT]
# 1. builds troupe-score, test_backend_cuda and bench_qgemv with CUDA (the toolchain found as
#    tools/gpu-run.sh does);
# 2. bench_qgemv: both weight-only GEMVs (the CUDA-core one, "old", and the tensor-core one, "mma")
#    against its own CPU reference for every format and scale grid, M = 1..8, odd shapes (one
#    PASS / FAIL line per path and format), the tensor-core one's rows at M = 2..8 against M = 1,
#    then both timed side by side on the 8B layer shapes; the CUDA-core one again with the
#    whole-warp lane layout at M = 1 (--lk 32), for comparison;
# 3. the kernel table's quantized matmuls (test_quant_matmul: GEMV, FP8 GEMM, dequantize + bf16
#    GEMM against the CPU backend), with the tensor-core GEMV (the default) and without
#    (TROUPE_CUDA_QGEMV_MMA=0);
# 4. batch-1 greedy decode of Llama-3.1-8B's shape with dummy weights (speed only: the values are
#    random) in bf16 and each quantized format, next to the device copy bound and to bf16, each
#    quantized format again with TROUPE_CUDA_QGEMV_MMA=0 ("old") and the two side by side;
# 5. with MODEL_DIR and TEXT: troupe-score's NLL on CUDA per format (40 windows of 256 tokens).
# FULL=1 runs the whole kernel table last. Logs go to $OUT (the device tool's folder) or
# build/gpu-logs. The last lines are a summary: one RESULT line per check and per format.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-logs}
mkdir -p "$OUT"
if [ -z "${PKG_CONFIG_SYSROOT_DIR:-}" ] && [ -f .gpu-debs/env.sh ]; then . .gpu-debs/env.sh; fi
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$d/nvcc" ] && PATH="$d:$PATH" && break; done
fi
NVCC=$(command -v nvcc) || { echo "gpu-quant: no nvcc"; exit 1; }
CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
LIBDIR=/tmp/troupe-cudalib
mkdir -p "$LIBDIR"
for lib in libcudart libcublas libcublasLt; do
  found=$(ls "$CUDA_HOME"/lib64/$lib.so* "$CUDA_HOME"/targets/x86_64-linux/lib/$lib.so* 2>/dev/null | head -1)
  [ -z "$found" ] && { echo "gpu-quant: $lib not found"; exit 1; }
  real=$(readlink -f "$found")
  ln -sf "$real" "$LIBDIR/$lib.so"
  for v in "$(dirname "$found")/$lib.so."[0-9]*; do [ -e "$v" ] && ln -sf "$real" "$LIBDIR/$(basename "$v")"; done
done
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
status=0
summary=()
res() { summary+=("RESULT $*"); }

echo "== build $(date +%T)"
if make -j16 NVCC="$NVCC" CUDA_HOME="$CUDA_HOME" CUDA_LIBDIR="$LIBDIR" build/bin/troupe-score \
    build/gpu-tests/test_backend_cuda build/gpu-tests/bench_qgemv >"$OUT/build.log" 2>&1; then
  res "build: PASS"
else
  status=1; res "build: FAIL (see build.log)"; grep -E "error" "$OUT/build.log" | head -20
fi

echo "== bench_qgemv: checks and 8B shapes $(date +%T)"
if timeout 300 build/gpu-tests/bench_qgemv >"$OUT/bench_qgemv.log" 2>&1; then :; else status=1; fi
cat "$OUT/bench_qgemv.log"
while read -r line; do res "gemv $line"; done < <(grep -E "^check " "$OUT/bench_qgemv.log" | cut -c7- | sed -E 's/  worst/: worst/')
grep -q "all checks PASSED" "$OUT/bench_qgemv.log" || res "gemv checks: FAIL (or did not run: see bench_qgemv.log)"
while read -r line; do res "gemv $line"; done < <(grep -E "^time .*mma vs old" "$OUT/bench_qgemv.log" | cut -c6-)
echo "-- the whole-warp lane layout at M = 1 (--lk 32):"
timeout 90 build/gpu-tests/bench_qgemv --lk 32 --path old >"$OUT/bench_qgemv_lk32.log" 2>&1 || status=1
grep -E "^time M=1|FAIL" "$OUT/bench_qgemv_lk32.log" | sed 's/^/lk32 /'
grep -q "all checks PASSED" "$OUT/bench_qgemv_lk32.log" && res "gemv checks with --lk 32: PASS" || res "gemv checks with --lk 32: FAIL"

echo "== kernel table: quantized matmuls vs the CPU backend $(date +%T)"
for mma in 1 0; do                                 # the tensor-core GEMV (default), then the CUDA-core one
  tag=$([ $mma = 1 ] && echo "tensor-core GEMV" || echo "TROUPE_CUDA_QGEMV_MMA=0")
  log="$OUT/test-qmma$mma.log"
  if TROUPE_CUDA_QGEMV_MMA=$mma TROUPE_TEST_FILTER='*quant*' timeout 150 build/gpu-tests/test_backend_cuda >"$log" 2>&1; then
    res "kernel table test_quant_matmul ($tag): PASS ($(grep -c 'qmatmul' "$log") cases)"
  else
    status=1; res "kernel table test_quant_matmul ($tag): FAIL (see $(basename "$log"))"
  fi
  echo "-- $tag"
  grep -E "qmatmul|FAILED|PASSED|ERROR|error" "$log" | sed 's/^ *//' | grep -E "FAIL|ERROR|error|PASSED|M=1 |M=300 " | tail -40
done

echo "== decode, Llama-3.1-8B shape, dummy weights (speed only) $(date +%T)"
bf16=""
declare -A tps_of
for q in "" fp8 int8 int4 nvfp4 fp8:old int8:old int4:old nvfp4:old; do
  name=${q:-bf16}
  mma=1
  case $q in *:old) mma=0; q=${q%:old} ;; esac
  log="$OUT/decode-${name/:/-}.log"
  TROUPE_CUDA_QGEMV_MMA=$mma timeout 120 build/bin/troupe-score tests/fixtures/models/llama-3.1-8b-shape --decode 256 --dummy --backend cuda \
    ${q:+--quantize $q} >"$log" 2>&1 || status=1
  grep -E "weights|load_s|tok_per_s|bytes_per|GB_per|error|troupe" "$log" | tr '\n' ' '
  echo
  tps=$(awk '$1 == "tok_per_s" {print $2}' "$log")
  bound=$(awk '$1 == "bound_tok_per_s" {print $2}' "$log")
  if [ -z "$tps" ]; then
    res "decode $name: FAIL (no figure: see decode-${name/:/-}.log)"; status=1; continue
  fi
  [ -z "$q" ] && bf16=$tps
  tps_of[$name]=$tps
  res "$(awk -v n="$name" -v t="$tps" -v b="$bound" -v r="$bf16" 'BEGIN {
    printf "decode %-9s %7.1f tok/s  bound %4.0f (%3.0f%%)", n, t, b, b > 0 ? 100 * t / b : 0
    if (r != "" && n != "bf16") printf "  %.2fx bf16 (%s)", t / r, (t >= r ? "faster" : "SLOWER") }')"
done
for q in fp8 int8 int4 nvfp4; do                   # the tensor-core GEMV against the CUDA-core one
  new=${tps_of[$q]:-} old=${tps_of[$q:old]:-}
  [ -n "$new" ] && [ -n "$old" ] && res "$(awk -v n="$q" -v a="$new" -v b="$old" 'BEGIN {
    printf "decode %-5s tensor-core GEMV %7.1f tok/s, CUDA-core GEMV %7.1f tok/s: %.2fx", n, a, b, a / b }')"
done

if [ $# -ge 2 ]; then
  echo "== NLL on CUDA, $1 $(date +%T)"
  for q in "" fp8 int8 int4 nvfp4; do
    timeout 60 build/bin/troupe-score "$1" --text "$2" --max-windows 40 --backend cuda ${q:+--quantize $q} 2>&1 \
      | grep -E "^format|mean_nll|error|troupe" | tr '\n' ' ' || status=1
    echo
  done
fi
if [ "${FULL:-0}" = 1 ]; then                     # FULL=1: the whole kernel table too (regressions elsewhere)
  echo "== whole kernel table $(date +%T)"
  timeout 200 build/gpu-tests/test_backend_cuda >"$OUT/test-all.log" 2>&1 || status=1
  grep -E "FAILED|PASSED|ERROR" "$OUT/test-all.log" | tail -12
fi
echo "== summary $(date +%T)"
printf '%s\n' "${summary[@]}"
echo "gpu-quant: $([ $status = 0 ] && echo 'every step passed' || echo 'SOMETHING FAILED (above)')"
exit $status
