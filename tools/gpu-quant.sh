#!/usr/bin/env bash
# tools/gpu-quant.sh — the quantized weights' checks and figures on a GPU node, in one call:
#   . .gpu-debs/env.sh && tools/gpu-quant.sh [MODEL_DIR TEXT]
# 1. builds troupe-score and test_backend_cuda with CUDA (the toolchain found as tools/gpu-run.sh does);
# 2. runs the kernel table's matmul entries (quantized and plain) against the CPU backend;
# 3. times batch-1 greedy decode of Llama-3.1-8B's shape with dummy weights (speed only: the values
#    are random) in bf16 and each quantized format, next to the device copy bound;
# 4. with MODEL_DIR and TEXT: troupe-score's NLL on CUDA per format (40 windows of 256 tokens).
# FULL=1 runs the whole kernel table last. Logs go to $OUT (the device tool's folder) or build/gpu-logs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-logs}
mkdir -p "$OUT"
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
echo "== build $(date +%T)"
make -j16 NVCC="$NVCC" CUDA_HOME="$CUDA_HOME" CUDA_LIBDIR="$LIBDIR" build/bin/troupe-score \
  build/gpu-tests/test_backend_cuda >"$OUT/build.log" 2>&1 || { status=1; grep -E "error" "$OUT/build.log" | head -20; }
echo "== kernel table $(date +%T)"
TROUPE_TEST_FILTER='*matmul*' timeout 150 build/gpu-tests/test_backend_cuda >"$OUT/test.log" 2>&1 || status=1
grep -E "qmatmul|FAILED|PASSED|ERROR|error" "$OUT/test.log" | sed 's/^ *//' | tail -64
echo "== decode, Llama-3.1-8B shape, dummy weights (speed only) $(date +%T)"
for q in "" fp8 int8 int4 nvfp4; do
  timeout 120 build/bin/troupe-score tests/fixtures/models/llama-3.1-8b-shape --decode 256 --dummy --backend cuda \
    ${q:+--quantize $q} 2>&1 | grep -E "weights|load_s|tok_per_s|bytes_per|GB_per|error|troupe" | tr '\n' ' ' || status=1
  echo
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
exit $status
