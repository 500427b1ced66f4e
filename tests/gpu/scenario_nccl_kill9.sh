#!/usr/bin/env bash
# tests/gpu/scenario_nccl_kill9.sh — issue #6 on a node with two or more GPUs: kill -9 of the decode
# worker in the middle of an NCCL KV hand-off.
#   1. the cluster of TOPO (default tools/bench/h200x2-8b.yaml: prefill on GPU 0, decode on GPU 1)
#      serves a warm-up request over the NCCL link, once the prefill worker reports it up
#      (nccl_links_ready);
#   2. the decode worker is stopped (SIGSTOP), an 8,000-token prompt is submitted, and once the
#      prefill worker has posted its NCCL send (handoffs_in_flight >= 1) the decode worker is
#      killed (SIGKILL);
#   3. checks: the prefill worker aborts its side of the link within 10 s (a "communicator aborted"
#      line in the cluster log after the kill), the request ends within 30 s either completed
#      (recomputed elsewhere) or with a retryable error, the supervisor restarts the decode worker,
#      and a new request is served with its KV handed over on a rebuilt NCCL link.
# Prints what it saw and "PASS"/"FAIL: ..."; exit 0 on pass or skip. Needs build/bin (make) and
# the GPU node's environment (tools/gpu-run.sh runs it when there are two GPUs).
# NCCL_CHECKS=0 leaves out what needs NCCL (the GPU count, the link checks, the abort line): a dry
# run of the rest of the script against any topology, e.g. the CPU demo one with LONG=300.
set -uo pipefail
cd "$(dirname "$0")/../.."
TOPO=${TOPO:-tools/bench/h200x2-8b.yaml}
BIN=build/bin
LOG=${LOG:-/tmp/scenario_nccl_kill9.log}
LONG=${LONG:-8000}
NCCL_CHECKS=${NCCL_CHECKS:-1}
n_gpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$NCCL_CHECKS" = 1 ] && [ "$n_gpu" -lt 2 ]; then echo "scenario_nccl_kill9: SKIPPED: $n_gpu GPU(s); needs 2"; exit 0; fi

fail() { echo "FAIL: $*"; grep -E " (WARN|ERROR) " "$LOG" | grep -v "no tokenizer" | tail -20; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# top FIELD ACTOR [METRIC]: the actor's pid or state, or one of its metrics, from the monitor.
top() {
  "$BIN/troupe-top" --topology "$TOPO" --json 2>/dev/null | python3 -c 'import json, sys
what, actor = sys.argv[1], sys.argv[2]
for a in json.load(sys.stdin).get("actors", []):
    if a["name"] == actor:
        if what == "metric":
            print(next((m["value"] for m in a["metrics"] if m["name"] == sys.argv[3]), ""))
        else:
            print(a.get(what, ""))' "$@"
}
submit() {   # ids max_tokens -> the client's JSON lines
  timeout 60 "$BIN/troupe-client" --topology "$TOPO" --json submit --ids "$1" --max-tokens "$2" --ignore-eos \
    --temperature 0
}
last_type() { python3 -c 'import json, sys
last = None
for l in sys.stdin:
    l = l.strip()
    if l.startswith("{"): last = json.loads(l)
print("%s %s" % (last.get("type"), last.get("retryable", "")) if last else "none")'; }

"$BIN/troupe-supervisor" --topology "$TOPO" --ready-file /tmp/kill9.ready >"$LOG" 2>&1 &
sup=$!
trap 'kill -TERM $sup 2>/dev/null; wait $sup 2>/dev/null' EXIT
rm -f /tmp/kill9.ready
for _ in $(seq 3000); do [ -s /tmp/kill9.ready ] && break; kill -0 $sup 2>/dev/null || fail "supervisor exited"; sleep 0.1; done
[ -s /tmp/kill9.ready ] || fail "cluster not ready in 300 s"

short=$(python3 -c 'print(",".join(str((i * 7919 + 11) % 120000) for i in range(1000)))')
long=$(python3 -c 'import sys; print(",".join(str((i * 104729 + 7) % 120000) for i in range(int(sys.argv[1]))))' "$LONG")
# A link comes up a second or so after READY (NCCL's bootstrap and connection set-up); hand-offs
# before it go by shared memory, so the warm-up waits for it.
wait_link() {
  [ "$NCCL_CHECKS" = 0 ] && return 0
  local t0; t0=$(now_ms)
  while [ $(( $(now_ms) - t0 )) -lt 60000 ]; do
    v=$(top metric prefill nccl_links_ready); [ "${v%.*}" -ge 1 ] 2>/dev/null && return 0; sleep 0.1
  done
  fail "$1: no NCCL link up on the prefill worker within 60 s"
}
# metric_above ACTOR METRIC N: the metric once it exceeds N, polled for up to 5 s (workers publish
# their stats once a heartbeat, so a count read right after a request is a second stale).
metric_above() {
  local t0 v; t0=$(now_ms)
  while :; do
    v=$(top metric "$1" "$2")
    [ "${v%.*}" -gt "$3" ] 2>/dev/null && break
    [ $(( $(now_ms) - t0 )) -ge 5000 ] && break
    sleep 0.1
  done
  echo "$v"
}
wait_link "at start"
[ "$(submit "$short" 4 | last_type)" = "done " ] || fail "warm-up request did not complete"
nccl0=$(metric_above prefill transfers_nccl_total 0)
[ "$NCCL_CHECKS" = 0 ] || [ "${nccl0%.*}" -ge 1 ] 2>/dev/null || fail "warm-up hand-off did not go over NCCL (prefill transfers_nccl_total=$nccl0, fallbacks to shared memory $(top metric prefill transfers_nccl_fallback_total))"

dpid=$(top pid decode)
kill -STOP "$dpid"
submit "$long" 8 >/tmp/kill9.client 2>&1 &
cpid=$!
t_sub=$(now_ms)
posted=""
for _ in $(seq 300); do
  v=$(top metric prefill handoffs_in_flight); [ "${v%.*}" -ge 1 ] 2>/dev/null && { posted=1; break; }
  sleep 0.1
done
[ -n "$posted" ] || { kill -CONT "$dpid"; fail "the prefill worker never started the hand-off"; }
lines_before=$(grep -c "communicator aborted" "$LOG")
ups_before=$(grep -c "NCCL link .* to decode is up" "$LOG")
kill -KILL "$dpid"
t_kill=$(now_ms)
echo "decode worker (pid $dpid) killed $((t_kill - t_sub)) ms after the submit, with the NCCL send posted"

t_abort=""
[ "$NCCL_CHECKS" = 0 ] && t_abort=$t_kill
while [ -z "$t_abort" ] && [ $(( $(now_ms) - t_kill )) -lt 15000 ]; do
  if [ "$(grep -c "communicator aborted" "$LOG")" -gt "$lines_before" ]; then t_abort=$(now_ms); break; fi
  sleep 0.05
done
[ -n "$t_abort" ] || fail "no 'communicator aborted' in the log within 15 s of the kill"
echo "prefill side aborted its communicator $((t_abort - t_kill)) ms after the kill (bound 10,000)"
[ $((t_abort - t_kill)) -le 10000 ] || fail "the abort took more than 10 s"

wait $cpid
outcome=$(last_type </tmp/kill9.client)
echo "the request ended: $outcome ($(( $(now_ms) - t_kill )) ms after the kill)"
case "$outcome" in
  "done "*|"error True"|"error true") ;;
  *) fail "the request ended with '$outcome' (want done, or an error with retryable true)" ;;
esac

restarted=""
for _ in $(seq 600); do
  p=$(top pid decode); s=$(top state decode)
  if [ -n "$p" ] && [ "$p" != "$dpid" ] && { [ "$s" = ready ] || [ "$s" = 1 ]; }; then restarted=$p; break; fi
  sleep 0.1
done
[ -n "$restarted" ] || fail "the decode worker was not restarted and ready within 60 s"
echo "decode worker restarted as pid $restarted"
t_re=$(now_ms)
# The monitor's nccl_links_ready can still be the old link's (stats come once a heartbeat): the
# new link is up when the prefill worker logs it, after the kill.
if [ "$NCCL_CHECKS" = 1 ]; then
  while [ "$(grep -c "NCCL link .* to decode is up" "$LOG")" -le "$ups_before" ]; do
    [ $(( $(now_ms) - t_re )) -lt 60000 ] || fail "no new NCCL link to the restarted decode worker within 60 s"
    sleep 0.1
  done
fi
echo "NCCL link rebuilt $(( $(now_ms) - t_re )) ms after the new decode worker was ready"
nccl1=$(top metric prefill transfers_nccl_total)
out=$(submit "$short" 4)
[ "$(echo "$out" | last_type)" = "done " ] || fail "request after the restart did not complete: $(echo "$out" | tail -2)"
nccl2=$(metric_above prefill transfers_nccl_total "${nccl1%.*}")
echo "prefill NCCL hand-offs: $nccl1 before the request after the restart, $nccl2 after"
[ "$NCCL_CHECKS" = 0 ] || [ "${nccl2%.*}" -gt "${nccl1%.*}" ] 2>/dev/null ||
  fail "the hand-off after the restart did not go over a rebuilt NCCL link"
echo "PASS scenario_nccl_kill9"
