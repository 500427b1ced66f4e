#!/usr/bin/env bash
# The README's main job: launch the embedded default topology (one machine, CPU), wait until
# every actor is READY, submit a prompt through the client, show `top`, then stop cleanly.
#   TOPOLOGY=file.yaml PROMPT="..." tools/demo.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
TOPO_ARGS=()
[ -n "${TOPOLOGY:-}" ] && TOPO_ARGS=(--topology "$TOPOLOGY")
PROMPT=${PROMPT:-"The capital of France is"}
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

echo "== troupe-client submit \"$PROMPT\""
"$BIN/troupe-client" "${TOPO_ARGS[@]}" --timeout-ms 60000 submit --max-tokens 32 "$PROMPT"
client_rc=$?
sleep 1.1   # one stats interval, so top shows the request
echo "== troupe-top --once"
"$BIN/troupe-top" "${TOPO_ARGS[@]}" --once
exit "$client_rc"
