#!/usr/bin/env bash
# tools/bench-moe.sh — the MoE decode step of Qwen3-30B-A3B's shape on one GPU, every row its own
# prompt, under several routings, against the bound for the experts each step actually reads:
#   . .gpu-debs/env.sh && B=build tools/bench-moe.sh [OUT_DIR]
# 1. builds troupe-bench-engine and bench_cuda in $B (BUILD=0: uses what is there);
# 2. the copy bandwidth: bench_cuda --copy-only (cudaMemcpy device to device of 2 GiB, bytes read
#    + written over the median of 10: the ceiling tools/gpu-run.sh judges by), in the same run;
# 3. troupe-bench-engine MODEL --backend cuda --load-format dummy --dtype bf16 --prompts distinct,
#    once per weight format of QUANTIZE and routing of ROUTINGS (a process each: the router skew is
#    fitted at load; a format other than none is --quantize FMT, the dummy weights quantized at
#    load as model.quantization does, so the bytes are the format's codes and scales): the decode
#    step at BATCH rows over PROMPT tokens of context, the bytes each step reads (the dense
#    weights, the experts that step routed to, counted by the MoE counters, and the KV), the bound
#    (those bytes at the copy bandwidth) and the step's fraction of it;
# 4. a table of every run (also $OUT/summary.txt).
# Knobs: MODEL (tests/fixtures/models/qwen3-30b-a3b-shape), BATCH (1,16,64,256), PROMPT (1000),
# STEPS (16), CHUNK (4096: distinct prompts are prefilled CHUNK / PROMPT rows per forward),
# ROUTINGS (uniform table:tests/fixtures/expert-load/kjv-moe-valid.txt zipf:1), QUANTIZE (none: bf16
# weights; a list, e.g. "none fp8", runs each format: fp8, int8, int4, nvfp4), TIMEOUT (per run,
# 120 s), PROFILE=1 (adds the per-op profile of each level), BACKEND (cuda) and COPY_BW (TB/s, instead
# of measuring it: with BACKEND=cpu a dry run of the script on a machine without a GPU).
# Exit status 0 when every step passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
OUT=${1:-${OUT:-$B/bench-moe}}
MODEL=${MODEL:-tests/fixtures/models/qwen3-30b-a3b-shape}
ROUTINGS=${ROUTINGS:-uniform table:tests/fixtures/expert-load/kjv-moe-valid.txt zipf:1}
QUANTIZE=${QUANTIZE:-none}
mkdir -p "$OUT"
export TROUPE_OFFLINE=1
status=0
t0=$(date +%s)

if [ "${BUILD:-1}" = 1 ]; then
  echo "== build ($B)"
  make B="$B" -j"$(nproc)" "$B/bin/troupe-bench-engine" "$B/gpu-tests/bench_cuda" >"$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; echo "build failed"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi

echo "== copy bandwidth"
if [ -n "${COPY_BW:-}" ]; then
  echo "copy_bandwidth $COPY_BW TB/s (given, not measured)" | tee "$OUT/copy.txt"
else
  timeout 60 "$B/gpu-tests/bench_cuda" --copy-only | tee "$OUT/copy.txt" || status=1
fi
bw=$(awk '$1 == "copy_bandwidth" {print $2; exit}' "$OUT/copy.txt")
[ -n "$bw" ] || { echo "no copy bandwidth measured"; exit 1; }

rm -f "$OUT"/moe-*.json
i=0
for q in $QUANTIZE; do
  qarg=()
  [ "$q" = none ] || qarg=(--quantize "$q")
  for r in $ROUTINGS; do
    i=$((i + 1))
    echo "== weights $q, routing $r"
    t=$(date +%s)
    timeout "${TIMEOUT:-120}" "$B/bin/troupe-bench-engine" "$MODEL" --backend "${BACKEND:-cuda}" --load-format dummy \
      --dtype bf16 ${qarg[@]+"${qarg[@]}"} --prompts distinct --prompt-len "${PROMPT:-1000}" --batch "${BATCH:-1,16,64,256}" \
      --steps "${STEPS:-16}" --chunk "${CHUNK:-4096}" --copy-bw "$bw" --router-skew "$r" ${PROFILE:+--profile} \
      --json "$OUT/moe-$i.json" >"$OUT/moe-$i.txt" 2>&1
    rc=$?
    [ $rc = 0 ] || { status=1; echo "FAILED (exit $rc)"; }
    cat "$OUT/moe-$i.txt"
    echo "($(( $(date +%s) - t )) s)"
  done
done

echo "== summary (copy bandwidth $bw TB/s; $(( $(date +%s) - t0 )) s in all)"
python3 - "$OUT"/moe-*.json <<'EOF' | tee "$OUT/summary.txt"
import json, sys
prompts = "?"
print("%-6s %-44s %5s %9s %8s %8s %8s %9s %8s %9s" % ("format", "routing (target busiest/avg)", "batch", "step ms",
      "GB read", "experts", "busiest", "bound ms", "of bound", "uniform GB"))
for f in sys.argv[1:]:
    try:
        j = json.load(open(f))
    except Exception as e:
        print("%s: no result (%s)" % (f, e.__class__.__name__)); continue
    prompts = j.get("prompts", "?")
    r = j.get("routing", "?")
    r = "table:" + r.rsplit("/", 1)[-1] if r.startswith("table:") else r
    name = "%s (%.2f)" % (r, j["routing_target"]) if j.get("routing_target") else r
    fmt = j.get("quantize", "none")
    fmt = j.get("dtype", "?") if fmt == "none" else fmt
    for l in j["decode"]:
        print("%-6s %-44s %5d %9.3f %8.2f %8.1f %8.2f %9.3f %7.0f%% %9.2f" % (
            fmt, name[-44:], l["batch"], l["step_ms"], l["bytes_per_step"] / 1e9,
            l.get("experts_routed_per_layer", 0), l.get("expert_busiest_over_avg", 0), l.get("bound_ms", 0),
            100 * l.get("bound_ms", 0) / l["step_ms"], l.get("bytes_per_step_uniform_routing", 0) / 1e9))
print("prompts: %s; experts: distinct experts per MoE layer read per step; GB read: dense + those "
      "experts + KV, mean over the steps; uniform GB: the same if the rows chose independently and evenly"
      % prompts)
EOF
exit $status
