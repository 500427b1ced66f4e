#!/usr/bin/env bash
# tools/gpu-profile.sh — where one decode step's GPU time goes, kernel by kernel (GPU node, built tree).
#
#   . .gpu-debs/env.sh && BATCH=256 KV=fp8 tools/gpu-profile.sh [OUT_DIR]
#   . .gpu-debs/env.sh && BATCH=1 QUANT=fp8 tools/gpu-profile.sh [OUT_DIR]   (weights quantized at load)
#   . .gpu-debs/env.sh && BATCH=1 KV=fp8 EXTRA_METRICS=smsp__inst_executed.sum tools/gpu-profile.sh [OUT_DIR]
#
# Runs troupe-bench-engine on Llama-3.1-8B's shape (dummy bf16 weights, 1,000 tokens of context,
# one batch size, 2 timed steps, graphs on) under Nsight Compute with one metric (each kernel's
# duration; --graph-profiling node times every kernel of a replayed graph on its own, with the
# clocks left alone), then sums the kernels of the LAST decode step (those after the last k_embed)
# by kernel name, and the last prefill's the same way. The sum is the step's pure kernel time: set beside the step time the engine
# reports without ncu, the difference is what launches, gaps and dependencies cost. ncu runs each
# kernel alone, so PDL overlap is not in these durations.
# Output: OUT_DIR/profile-b<BATCH>.csv (ncu's raw rows), .txt (the engine's report under ncu: its
# times are ncu's, not real) and a table on stdout. Needs ncu (the GPU
# node has it under /opt/nvidia or on PATH).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-build/gpu-logs}}
BATCH=${BATCH:-256}
KV=${KV:-auto}
QUANT=${QUANT:-}   # fp8|int8|int4|nvfp4: the dummy weights quantized at load (--quantize)
# PROMPTS: --prompts of the engine (distinct, the default, or shared). Under ncu every kernel runs
# alone, so 256 distinct 1,000-token prompts take minutes to prefill (raise PROFILE_TIMEOUT, or use
# shared, whose decode reads one prompt's KV for every row). KV_SCALES: --kv-scales (auto, one, ...).
PROMPTS=${PROMPTS:-distinct}
KV_SCALES=${KV_SCALES:-auto}
# EXTRA_METRICS: more ncu metrics, comma-separated, summed per kernel beside the time (for example
# smsp__inst_executed.sum, the instructions each kernel executed: two trees' same kernel compared).
EXTRA_METRICS=${EXTRA_METRICS:-}
MODEL=${MODEL:-tests/fixtures/models/llama-3.1-8b-shape}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu-profile: no ncu on this machine"; exit 1; }
csv="$OUT/profile-b$BATCH.csv"   # ncu's report (its --log-file; the engine's own output goes to .txt)
timeout "${PROFILE_TIMEOUT:-400}" "$NCU" --clock-control none --graph-profiling node --metrics gpu__time_duration.sum${EXTRA_METRICS:+,$EXTRA_METRICS} \
  --csv --print-units base --log-file "$csv" \
  build/bin/troupe-bench-engine "$MODEL" --load-format dummy --dtype bf16 ${QUANT:+--quantize $QUANT} \
  --backend cuda --kv-dtype "$KV" --kv-scales "$KV_SCALES" --prompts "$PROMPTS" --prompt-len 1000 --batch "$BATCH" --steps 2 >"$OUT/profile-b$BATCH.txt" 2>"$OUT/profile-b$BATCH.err"
rc=$?
[ $rc -eq 0 ] || { echo "gpu-profile: ncu exit $rc"; tail -5 "$OUT/profile-b$BATCH.err" "$csv"; exit 1; }
python3 - "$csv" "$BATCH" "$EXTRA_METRICS" <<'PY'
import csv, sys, collections
extra = [m for m in sys.argv[3].split(",") if m]
launches = collections.OrderedDict()   # ncu's launch ID -> (kernel name, {metric: value})
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    try:
        v = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    launches.setdefault(r["ID"], (r["Kernel Name"], {}))[1][r["Metric Name"]] = v
rows = [(k, m.get("gpu__time_duration.sum", 0.0), m) for k, m in launches.values()]
starts = [i for i, (k, _, _) in enumerate(rows) if k.startswith("k_embed") or "k_embed<" in k]
if not starts:
    sys.exit("gpu-profile: no k_embed kernel found: cannot find the last step")
segs = [(a, b) for a, b in zip(starts, starts[1:] + [len(rows)])]

def table(title, seg):
    by = collections.defaultdict(lambda: [0.0, 0, [0.0] * len(extra)])
    for k, ns, m in rows[seg[0]:seg[1]]:
        name = k.split("(")[0]
        by[name][0] += ns
        by[name][1] += 1
        for i, e in enumerate(extra):
            by[name][2][i] += m.get(e, 0.0)
    total = sum(v[0] for v in by.values())
    print(f"{title}: {seg[1] - seg[0]} kernels, {total / 1e6:.3f} ms of kernel time")
    print(f"{'kernel':60s} {'ms':>8s} {'calls':>6s} {'share':>6s}" + "".join(f" {e[:24]:>24s}" for e in extra))
    for name, (ns, n, ex) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"{name[:60]:60s} {ns / 1e6:8.3f} {n:6d} {100 * ns / total:5.1f}%" + "".join(f" {x:24.0f}" for x in ex))

# Every forward starts with k_embed: the engine's prefills (warm-up, then the timed ones) come
# first, then the decode steps, which all have one kernel count. The last step is a decode step;
# the last segment of another count before it is the last prefill.
table(f"last decode step at batch {sys.argv[2]}", segs[-1])
n_last = segs[-1][1] - segs[-1][0]
pre = [g for g in segs if g[1] - g[0] != n_last]
if pre:
    print()
    table("last prefill (the engine's --prompt-len tokens)", pre[-1])
PY
