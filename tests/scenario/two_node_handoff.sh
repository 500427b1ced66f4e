# KV hand-off between machines: a cluster of two nodes on distinct loopback addresses (127.0.0.1
# and 127.0.0.2, both launch: local), the prefill worker on one and the decode worker on the other.
#   1. Every hand-off goes over the network channel (transfers_tcp_total on both workers, none by
#      shared memory), and greedy output equals troupe-generate (and transformers) token for token.
#   2. The sender stalls mid-transfer (SIGSTOP after its hand-offs went out, before the decode
#      worker pulled their bytes): the decode worker gives up on each within its deadline and
#      refuses it; the requests fail with a retryable error; nothing hangs.
#   3. The sender dies mid-transfer (kill -9, same moment): the same, and the supervisor restarts it.
# After each fault a new request is served exactly again. The decode worker is held (SIGSTOP)
# while the hand-offs queue up, so "mid-transfer" is a state the test makes, not a race it hopes for;
# heartbeats are slow (1 s, liveness 10) so no held process is taken for wedged.
. "$(dirname "$0")/lib.sh"
GRACE_S=2 two_node_topology "$WORK/t.yaml" "t-two-node-$$"
ep=$CLIENT_EP
start_cluster "$WORK/t.yaml"
generate_reference "$MODEL"

note "1. hand-offs over the network, greedy exact"
$PY - "$BIN" "$WORK/t.yaml" "$ep" "$WORK/prompts" "$WORK/generate" "$MODEL/expected.json" <<'PY'
import json, sys, time
from servelib import run_many, top
bin_dir, topo, ep = sys.argv[1], sys.argv[2], sys.argv[3]
prompts = [list(map(int, l.split(","))) for l in open(sys.argv[4]).read().split()]
generate = [list(map(int, l.split(","))) for l in open(sys.argv[5]).read().split()]
expected = json.load(open(sys.argv[6]))["prompts"]
res = run_many(ep, [(i, dict(ids=p, max_tokens=16)) for i, p in enumerate(prompts)], workers=4)
for i, p in enumerate(prompts):
    r = res[i]
    assert not isinstance(r, Exception), (i, r)
    toks, final, _ = r
    assert final["type"] == "done", (i, final)
    assert toks == generate[i], f"prompt {i}: cluster {toks} != generate {generate[i]}"
    assert toks == expected[i]["greedy"][:16], f"prompt {i}: cluster {toks} != transformers {expected[i]['greedy'][:16]}"
def metrics():
    out = {}
    for a in top(bin_dir, topo).values():
        for m in a["metrics"]:
            out[(a["role"], m["name"])] = out.get((a["role"], m["name"]), 0) + m["value"]
    return out
# Workers publish their stats once a heartbeat: wait for both sides' counts to catch up.
deadline = time.time() + 10
while True:
    m = metrics()
    if (m.get(("decode", "transfers_tcp_total"), 0) >= len(prompts)
            and m.get(("prefill", "transfers_tcp_total"), 0) >= len(prompts)) or time.time() > deadline:
        break
    time.sleep(0.2)
tcp_in, tcp_out = m.get(("decode", "transfers_tcp_total"), 0), m.get(("prefill", "transfers_tcp_total"), 0)
print(f"{len(prompts)} prompts equal to generate and transformers; hand-offs over tcp: decode {tcp_in:.0f}, prefill {tcp_out:.0f}")
assert tcp_in == len(prompts) and tcp_out == len(prompts), m
assert m.get(("decode", "transfers_total"), 0) == len(prompts)   # every hand-off, and all of them by tcp
PY

# The prefill worker's hand-offs waiting for their kv_ack, as it last reported them.
in_flight() {
  top_json "$WORK/t.yaml" | $PY -c 'import json, sys
print(int(sum(m["value"] for a in json.load(sys.stdin)["actors"] if a.get("role") == "prefill"
              for m in a["metrics"] if m["name"] == "handoffs_in_flight")))'
}

# fault KIND: hold the decode worker, let two hand-offs go out, then stall (STOP) or kill (KILL) the
# prefill worker and release the decode worker (a stall once it has taken effect; after a kill at
# once, so that it reads the dead sender's hand-offs before the restarted one connects and takes over
# its routing id). Both requests must end in one retryable error each.
fault() {
  local kind=$1 dec pf
  dec=$(pgrep -f -- "troupe-decode --topology $WORK/t.yaml" | head -1)
  pf=$(pgrep -f -- "troupe-prefill --topology $WORK/t.yaml" | head -1)
  [ -n "$dec" ] && [ -n "$pf" ] || fail "no decode or prefill process"
  refused0=$(grep -c "hand-off of request .* refused: tcp transfer" "$WORK/supervisor.log" || true)
  # Stats of the last round must not pass for this one's: none in flight first.
  for _ in $(seq 200); do [ "$(in_flight)" = 0 ] && break; sleep 0.1; done
  [ "$(in_flight)" = 0 ] || fail "$kind: hand-offs of an earlier round still in flight"
  kill -STOP "$dec"
  wait_for stopped "$dec" || { kill -CONT "$dec"; fail "$kind: the decode worker did not stop"; }
  $PY - "$ep" "$WORK/prompts" "$BIN" "$WORK/t.yaml" > "$WORK/fault.out" 2>&1 <<'PY' &
import sys
from servelib import run_many
ep = sys.argv[1]
prompts = [list(map(int, l.split(","))) for l in open(sys.argv[2]).read().split()]
res = run_many(ep, [(i, dict(ids=prompts[i], max_tokens=16, timeout_s=60)) for i in range(2)], workers=2)
for i in range(2):
    r = res[i]
    assert not isinstance(r, Exception), (i, r)    # a timeout here would be a hang
    toks, final, replies = r
    terminal = [m for m in replies if m["type"] in ("done", "error")]
    assert len(terminal) == 1, (i, replies)
    assert final["type"] == "error" and final.get("retryable"), (i, final)
    print(f"request {i}: {final.get('code')} (retryable): {final.get('message')}")
PY
  local client=$!
  # Both prompts prefilled and handed off (their bytes staged at the sender), none pulled yet.
  for _ in $(seq 200); do
    n=$(in_flight)
    [ "$n" -ge 2 ] && break
    sleep 0.1
  done
  [ "$n" -ge 2 ] || { kill -CONT "$dec"; fail "$kind: the hand-offs never went out"; }
  kill "-$kind" "$pf"
  [ "$kind" != STOP ] || wait_for stopped "$pf" || { kill -CONT "$dec"; fail "STOP: the prefill worker did not stop"; }
  kill -CONT "$dec"
  wait_for sh -c "[ \$(grep -c 'hand-off of request .* refused: tcp transfer' '$WORK/supervisor.log') -ge $((refused0 + 2)) ]" \
    || { [ "$kind" != STOP ] || kill -CONT "$pf" 2>/dev/null || true; sleep 1; cat "$WORK/fault.out"
         fail "$kind: the decode worker did not give up on the two transfers"; }
  [ "$kind" = STOP ] && kill -CONT "$pf"
  wait "$client" || { cat "$WORK/fault.out"; fail "$kind: a request did not end in one retryable error"; }
  cat "$WORK/fault.out"
  grep "hand-off of request .* refused: tcp transfer" "$WORK/supervisor.log" | tail -2 | sed 's/^.*refused: /  decode: /'
}

# After a fault: the cluster serves again, exactly (the first fixture prompt).
serve_again() {
  $PY - "$ep" "$WORK/prompts" "$WORK/generate" <<'PY'
import sys, time
from servelib import run_one
ep = sys.argv[1]
ids = list(map(int, open(sys.argv[2]).read().split()[0].split(",")))
want = list(map(int, open(sys.argv[3]).read().split()[0].split(",")))
for attempt in range(50):   # a restarted worker may still be loading: retry what says so
    toks, final, _ = run_one(ep, ids, max_tokens=16, timeout_s=60)
    if final["type"] == "done" or not final.get("retryable"):
        break
    time.sleep(0.2)
assert final["type"] == "done" and toks == want, (toks, want, final)
print("served again, equal to generate")
PY
}

note "2. the sender stalls mid-transfer"
fault STOP
serve_again
note "3. the sender dies mid-transfer"
fault KILL
# A restart loads the model again: slow under sanitizers or on a loaded machine, so wait as long as
# the supervisor itself gives it (ready_timeout_s: 30) and a little more.
for _ in $(seq 350); do
  grep -q "prefill-0 ready in .*restarted\|prefill ready in .*restarted" "$WORK/supervisor.log" && break
  sleep 0.1
done
grep -q "prefill-0 ready in .*restarted\|prefill ready in .*restarted" "$WORK/supervisor.log" \
  || fail "prefill not restarted after kill -9"
serve_again
kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=
echo "PASS two_node_handoff"
