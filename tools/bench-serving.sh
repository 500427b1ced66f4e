#!/usr/bin/env bash
# Starts a cluster from a topology, runs troupe-bench against it, stops it.
#   tools/bench-serving.sh TOPOLOGY [troupe-bench options...]
# Example (the overhead figure of the serving-path issue, on this machine):
#   tools/bench-serving.sh tools/bench/cpu-demo.yaml --vocab 150000 --input-len 32 --output-len 64 \
#       --concurrency 1,8,32,64 --generate tests/fixtures/models/qwen3-demo-shape \
#       --generate-args "--load-format dummy --dtype bf16 --threads 1"
# Environment:
#   B=DIR         where the binaries were built (default build)
#   COPY_BW=GBps  copy bandwidth for troupe-bench's decode-bandwidth column; default: measured by
#                 troupe-membw before the cluster starts, with the topology's model.threads (the
#                 decode worker's threads; all cores when it is 0); COPY_BW=0 leaves the column out.
#                 The model's bytes come from the topology's model section (troupe-bench --topology).
#   JSON=FILE     the sweep's JSON (default a file beside the log); PLOT=FILE.png plots it
#                 (tools/bench_plot.py: output tokens/s per GPU against tokens/s per user)
#   MULTITURN=1   then troupe-bench --multi-turn on the same cluster with the same options plus
#                 MT_ARGS (default "--turns 4 --system-len 256 --turn-len 64 --output-len 32
#                 --concurrency 1,8"); its JSON goes to MT_JSON (default beside the log)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
topo=$1; shift
log=$(mktemp /tmp/troupe-bench.XXXXXX.log)
ready=$(mktemp -u /tmp/troupe-bench.XXXXXX.ready)
json=${JSON:-${log%.log}.json}
if [ -z "${COPY_BW:-}" ]; then
  threads=$("$B/bin/troupe-supervisor" --print --topology "$topo" | awk '$1 == "threads:" {print $2; exit}')
  targs=(); [ "${threads:-0}" -gt 0 ] && targs=(--threads "$threads")
  COPY_BW=$("$B/bin/troupe-membw" --mb 512 --json "${targs[@]}" | python3 -c 'import json, sys; print(json.load(sys.stdin)["copy_gb_per_s"])')
  echo "copy bandwidth ${COPY_BW} GB/s (troupe-membw, ${threads:-all} threads)" >&2
fi
bw=(); [ "$COPY_BW" != 0 ] && bw=(--copy-bw "$COPY_BW")
"$B/bin/troupe-supervisor" --topology "$topo" --bin-dir "$B/bin" --ready-file "$ready" >"$log" 2>&1 &
sup=$!
trap 'kill -TERM $sup 2>/dev/null; wait $sup 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 1200); do [ -s "$ready" ] && break; kill -0 $sup 2>/dev/null || { tail -20 "$log"; exit 1; }; sleep 0.1; done
[ -s "$ready" ] || { echo "cluster not ready"; tail -20 "$log"; exit 1; }
echo "cluster ready in $(cat "$ready") ms (log $log)" >&2
status=0
"$B/bin/troupe-bench" --topology "$topo" "${bw[@]}" "$@" --json "$json" || status=1
echo "JSON: $json" >&2
if [ -n "${PLOT:-}" ]; then python3 tools/bench_plot.py "$json" --out "$PLOT" || status=1; fi
if [ "${MULTITURN:-0}" = 1 ]; then
  mt_json=${MT_JSON:-${log%.log}.multiturn.json}
  # shellcheck disable=SC2086  # MT_ARGS is a list of options
  "$B/bin/troupe-bench" --topology "$topo" "$@" --multi-turn ${MT_ARGS:---turns 4 --system-len 256 --turn-len 64 \
    --output-len 32 --concurrency 1,8} --json "$mt_json" || status=1
  echo "multi-turn JSON: $mt_json" >&2
fi
exit $status
