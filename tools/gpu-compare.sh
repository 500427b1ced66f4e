#!/usr/bin/env bash
# tools/gpu-compare.sh — the same measurements on a baseline tree and on this one, in one call, so a
# change is judged against figures from the same machine and minute. From the repository root:
#   git archive COMMIT | (mkdir -p .baseline && tar -x -C .baseline)   # on a machine with git
#   . .gpu-debs/env.sh && COMPARE=build tools/gpu-compare.sh   # builds both trees (one after the other)
#   . .gpu-debs/env.sh && COMPARE=bench tools/gpu-compare.sh   # measures both, prints a table
# COMPARE=all does both (may exceed a 10-minute window). PREBUILT=1 COMPARE=bench measures trees
# whose build/ came from tools/gpu-pack.sh (built on another machine): nothing is compiled here,
# also for a baseline whose gpu-run.sh predates PREBUILT (a make that does nothing stands in for
# make in its PATH). The build step also runs this tree's
# unit and GPU tests. What is measured is tools/gpu-run.sh with
# GPU tests skipped: batch-1 decode of the Llama-3.1-8B shape (dummy bf16 weights) beside the HBM
# bound, and the served colocated fp8 sweep (input 1000, output SERVE_OUT, SERVE_CONC, SERVE_ROUNDS),
# baseline first, then this tree. Logs: $OUT/base and $OUT/new (or build/gpu-logs/...), left loose
# (ARCHIVE=0 for gpu-run.sh: the table reads them; pack $OUT yourself for the device tool).
set -uo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:-.baseline}
OUT=${OUT:-build/gpu-logs}
mode=${COMPARE:-all}
[ -f "$BASE/Makefile" ] || { echo "gpu-compare: no baseline tree in $BASE (see the header)"; exit 2; }
mkdir -p "$OUT/base" "$OUT/new"
OUT=$(cd "$OUT" && pwd)
knobs=(ARCHIVE=0 SKIP_TESTS=1 GEN_VARIANTS=default ENGINE=0 SERVE=1
       SERVE_TOPO=${SERVE_TOPO:-tools/bench/h200-8b-colo-fp8.yaml} SERVE_CONC=${SERVE_CONC:-1,16,64,256}
       SERVE_ROUNDS=${SERVE_ROUNDS:-2} SERVE_OUT=${SERVE_OUT:-1000} SERVE_TIMEOUT=${SERVE_TIMEOUT:-400})
if [ "$mode" = build ] || [ "$mode" = all ]; then
  # Each tree through its own gpu-run.sh (which knows where the GPU machine keeps the CUDA
  # libraries): the baseline only builds; this tree builds and runs its unit and GPU tests. One
  # after the other: a baseline's gpu-run.sh from before a0ffd7b ends with `pkill -f
  # build/bin/troupe-`, which also kills a make of the other tree running beside it (its targets
  # name build/bin/troupe-*), and the second tree's GPU tests then go silently missing.
  t0=$(date +%s)
  (cd "$BASE" && env ARCHIVE=0 SKIP_TESTS=1 SKIP_BENCH=1 GEN_VARIANTS=none ENGINE=0 OUT="$OUT/base" tools/gpu-run.sh) \
    >"$OUT/base/build-run.txt" 2>&1; rb=$?
  env ARCHIVE=0 SKIP_UNIT=${SKIP_UNIT:-0} SKIP_BENCH=1 GEN_VARIANTS=none ENGINE=0 OUT="$OUT/new" tools/gpu-run.sh >"$OUT/new/build-run.txt" 2>&1; rn=$?
  echo "baseline build: rc $rb; this tree's build and tests: rc $rn; $(( $(date +%s) - t0 )) s"
  tail -15 "$OUT/new/build-run.txt"
  grep -E "FAILED|error" "$OUT/base/build-run.txt" | head -5
fi
if [ "${PREBUILT:-0}" = 1 ]; then
  nomake=$(mktemp -d)
  printf '#!/bin/sh\nexit 0\n' >"$nomake/make" && chmod +x "$nomake/make"
  export PATH="$nomake:$PATH" PREBUILT
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  # The baseline skips the ceilings and its exactness check (time): this tree measures both.
  (cd "$BASE" && env "${knobs[@]}" SKIP_BENCH=1 SERVE_EXACT=0 OUT="$OUT/base" tools/gpu-run.sh) >"$OUT/base/run.txt" 2>&1
  env "${knobs[@]}" OUT="$OUT/new" tools/gpu-run.sh >"$OUT/new/run.txt" 2>&1
  python3 - "$OUT/base" "$OUT/new" <<'PY'
import json, sys
def load(d):
    r = {}
    try:
        g = json.load(open(d + "/generate-default.json"))
        r["batch-1 decode tok/s"] = g["timings"]["decode_tokens_per_s"]
    except Exception:
        pass
    try:
        s = json.load(open(d + "/serve-bench.json"))
        for lv in s.get("levels", s if isinstance(s, list) else []):
            c = lv.get("concurrency")
            r["conc %s out tok/s" % c] = lv.get("output_tokens_per_s") or lv.get("output_tok_s")
    except Exception:
        pass
    return r
b, n = load(sys.argv[1]), load(sys.argv[2])
print("%-26s %12s %12s %8s" % ("figure", "baseline", "this tree", "ratio"))
for k in sorted(set(b) | set(n), key=lambda k: (k[0] != "b", len(k), k)):
    x, y = b.get(k), n.get(k)
    ratio = "%.3f" % (y / x) if x and y else "-"
    print("%-26s %12s %12s %8s" % (k, "%.1f" % x if x else "-", "%.1f" % y if y else "-", ratio))
PY
fi
