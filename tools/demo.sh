#!/usr/bin/env bash
# The README's main job: launch the embedded default topology (one machine, CPU, the real
# model in models/kjv-tiny), wait until every actor is READY, submit a prompt through the client
# greedily (temperature 0: the same text every time), show `top`, then stop cleanly.
#   TOPOLOGY=file.yaml PROMPT="..." MAX_TOKENS=N TROUPE_BIN=dir tools/demo.sh
# tests/scenario/demo_text.sh runs it and checks the text against troupe-generate.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${TROUPE_BIN:-build/bin}
TOPO_ARGS=()
[ -n "${TOPOLOGY:-}" ] && TOPO_ARGS=(--topology "$TOPOLOGY")
PROMPT=${PROMPT:-"And God said"}
MAX_TOKENS=${MAX_TOKENS:-32}
log=$(mktemp /tmp/troupe-demo.XXXXXX.log)
ready=$(mktemp -u /tmp/troupe-demo.XXXXXX.ready)

echo "== troupe: starting the cluster (${TOPOLOGY:-embedded default topology}); log: $log"
"$BIN/troupe-supervisor" "${TOPO_ARGS[@]}" --ready-file "$ready" >"$log" 2>&1 &
sup=$!
stop() {
  if kill -0 "$sup" 2>/dev/null; then
    kill -TERM "$sup"
    wait "$sup"; rc=$?
    echo "== troupe: cluster stopped (supervisor exit $rc)"
  fi
  rm -f "$ready"
}
trap stop EXIT
for _ in $(seq 600); do
  [ -s "$ready" ] && break
  if ! kill -0 "$sup" 2>/dev/null; then
    echo "== troupe: the supervisor exited before the cluster was ready:"; tail -30 "$log"; exit 1
  fi
  sleep 0.1
done
[ -s "$ready" ] || { echo "== troupe: not ready after 60 s"; tail -30 "$log"; exit 1; }
echo "== troupe: every actor READY in $(cat "$ready") ms"

echo "== troupe-client submit --max-tokens $MAX_TOKENS --temperature 0 \"$PROMPT\""
"$BIN/troupe-client" "${TOPO_ARGS[@]}" --timeout-ms 60000 submit --max-tokens "$MAX_TOKENS" --temperature 0 "$PROMPT"
client_rc=$?
sleep 1.1   # one stats interval, so top shows the request
echo "== troupe-top --once"
"$BIN/troupe-top" "${TOPO_ARGS[@]}" --once
exit "$client_rc"
