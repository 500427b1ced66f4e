#!/usr/bin/env bash
# Starts a cluster from a topology, runs troupe-bench against it, stops it.
#   tools/bench-serving.sh TOPOLOGY [troupe-bench options...]
# Example (the overhead figure of the serving-path issue, on this machine):
#   tools/bench-serving.sh tools/bench/cpu-demo.yaml --vocab 150000 --input-len 32 --output-len 64 \
#       --concurrency 1,8,32,64 --generate tests/fixtures/models/qwen3-demo-shape \
#       --generate-args "--load-format dummy --dtype bf16 --threads 1"
set -euo pipefail
cd "$(dirname "$0")/.."
topo=$1; shift
log=$(mktemp /tmp/troupe-bench.XXXXXX.log)
ready=$(mktemp -u /tmp/troupe-bench.XXXXXX.ready)
build/bin/troupe-supervisor --topology "$topo" --ready-file "$ready" >"$log" 2>&1 &
sup=$!
trap 'kill -TERM $sup 2>/dev/null; wait $sup 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 1200); do [ -s "$ready" ] && break; kill -0 $sup 2>/dev/null || { tail -20 "$log"; exit 1; }; sleep 0.1; done
[ -s "$ready" ] || { echo "cluster not ready"; tail -20 "$log"; exit 1; }
echo "cluster ready in $(cat "$ready") ms (log $log)" >&2
build/bin/troupe-bench --topology "$topo" "$@"
