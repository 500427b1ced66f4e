#!/usr/bin/env bash
# CPU decode and prefill throughput of troupe-generate next to the memory-bandwidth bound.
#
#   tools/bench-cpu.sh [MODEL_DIR] [THREADS]
#       MODEL_DIR  a config-only model directory (default tests/fixtures/models/qwen3-0.6b-shape),
#                  run with the dummy load format (random weights of the real shape)
#       THREADS    CPU threads (default: all)
#   B=build-dir    where troupe-generate and troupe-membw were built (default build)
#
# Decode: batch 1, a 16-token prompt, 32 new tokens (--ignore-eos, greedy), for bf16 and f32
# weights. Bound = copy bandwidth (troupe-membw, read + write counted) / bytes of weights read per
# token (every layer's weights at their dtype plus the LM head, as model_weight_bytes counts).
# Prefill: one 512-token prompt in one chunk (blocked GEMM), tokens/s and achieved GFLOP/s
# (2 x active weights x tokens; attention's share excluded).
# Other processes on the machine slow every number down: run it on an idle machine. Each figure
# is the best of REPEAT runs (default 3), the bandwidth the best of troupe-membw's passes.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
MODEL=${1:-tests/fixtures/models/qwen3-0.6b-shape}
THREADS=${2:-}
GEN=$B/bin/troupe-generate
MEMBW=$B/bin/troupe-membw
for b in "$GEN" "$MEMBW"; do
  [ -x "$b" ] || { echo "bench-cpu: $b is missing; build it first (make $b)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "bench-cpu: python3 is needed to read the JSON results" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "bench-cpu: $MODEL/config.json not found" >&2; exit 1; }

targs=()
[ -n "$THREADS" ] && targs=(--threads "$THREADS")
REPEAT=${REPEAT:-3}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
# best KEY CMD...: runs CMD REPEAT times, prints the output whose timings[KEY] is largest.
best() {
  local key=$1; shift
  local top="" topv=-1 out v
  for _ in $(seq "$REPEAT"); do
    out=$("$@")
    v=$(echo "$out" | json "d['timings']['$key']")
    if python3 -c "import sys; sys.exit(0 if $v > $topv else 1)"; then top=$out; topv=$v; fi
  done
  echo "$top"
}
ids() { python3 -c "print(','.join(str(100 + (i * 7919) % 100000) for i in range($1)))"; }

bw_args=()
[ -n "$THREADS" ] && bw_args=(--threads "$THREADS")
bw=$("$MEMBW" --mb 1024 --json "${bw_args[@]}")
copy=$(echo "$bw" | json 'd["copy_gb_per_s"]')
read_bw=$(echo "$bw" | json 'd["read_gb_per_s"]')
threads=$(echo "$bw" | json 'd["threads"]')

printf '%s, %s threads, %s\n' "$(basename "$MODEL")" "$threads" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
printf 'memory: copy %.2f GB/s (read+write), read %.2f GB/s\n\n' "$copy" "$read_bw"
printf '%-6s %-8s %14s %14s %12s %10s\n' dtype phase "tokens/s" "bound tok/s" "of bound" "GB/token"
for dt in bf16 f32; do
  out=$(best decode_tokens_per_s "$GEN" "$MODEL" --load-format dummy --dtype "$dt" --ids "$(ids 16)" --max-tokens 32 \
        --ignore-eos --temperature 0 --json "${targs[@]}")
  tps=$(echo "$out" | json 'd["timings"]["decode_tokens_per_s"]')
  bytes=$(echo "$out" | json 'd["model"]["weight_bytes_per_token"]')
  bound=$(python3 -c "print($copy * 1e9 / $bytes)")
  printf '%-6s %-8s %14.2f %14.2f %11.0f%% %10.3f\n' "$dt" decode "$tps" "$bound" "$(python3 -c "print(100 * $tps / $bound)")" \
    "$(python3 -c "print($bytes / 1e9)")"
  out=$(best prompt_tokens_per_s "$GEN" "$MODEL" --load-format dummy --dtype "$dt" --ids "$(ids 512)" --max-tokens 1 \
        --ignore-eos --temperature 0 --chunk 512 --json "${targs[@]}")
  ptps=$(echo "$out" | json 'd["timings"]["prompt_tokens_per_s"]')
  # Prefill FLOPs per token: 2 x the layers' weights (the LM head runs for the last token only).
  gflops=$(python3 -c "
import json; c = json.load(open('$MODEL/config.json')); es = 4 if '$dt' == 'f32' else 2
layers = $bytes / es - c['vocab_size'] * c['hidden_size']
print(2 * layers * $ptps / 1e9)")
  printf '%-6s %-8s %14.2f %14s %12s %10s  (%.0f GFLOP/s)\n' "$dt" prefill "$ptps" - - - "$gflops"
done
