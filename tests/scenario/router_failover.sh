# Client-side liveness (tools/lib/client.h, tools/troupe_client.py): kill -9 of the router while
# three troupe-client processes (the C library) and three Python clients stream long requests.
# Every one of them ends with exactly one terminal reply, the synthesized `unavailable` error
# (retryable, "the connection to the router ... was lost ... outcome is unknown"), and none waits
# for its own 30 s timeout: the error must be what ended each wait (no timed assertion on how
# fast). After the supervisor restarts the router, each Python client object sends a new request
# that completes, and a new troupe-client request completes.
. "$(dirname "$0")/lib.sh"
make_demo_topology "$WORK/t.yaml" "limits:
  max_model_len: 4096"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
pids=()
for i in 0 1 2; do
  "$BIN/troupe-client" --topology "$WORK/t.yaml" --json --timeout-ms 30000 \
    submit --ids "$((300 + i)),5,6,7" --max-tokens 2000 --ignore-eos --temperature 0 >"$WORK/c$i.out" 2>"$WORK/c$i.err" &
  pids+=($!)
done
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$WORK" <<'PY' || fail "see above"
import json, os, signal, sys, threading, time
from troupe_client import Client
from servelib import top, wait_restarted
ep, bin_dir, topo, work = sys.argv[1:5]
N = 3
clients = [Client(ep, timeout_s=30) for _ in range(N)]
streamed, terminal, timed_out = {}, {}, []
def stream(i):
    try:
        for m in clients[i].generate(tokens=[400 + i] * 8, max_tokens=2000, temperature=0, ignore_eos=True):
            if m["type"] == "token":
                streamed[i] = streamed.get(i, 0) + 1
            else:
                terminal.setdefault(i, []).append(m)
    except TimeoutError:
        timed_out.append(i)
ts = [threading.Thread(target=stream, args=(i,)) for i in range(N)]
for t in ts: t.start()
def c_streaming(i):
    try:
        return any(json.loads(l).get("type") == "token" for l in open(f"{work}/c{i}.out") if l.strip())
    except (OSError, ValueError):
        return False
deadline = time.time() + 60
while time.time() < deadline and not (len(streamed) == N and all(c_streaming(i) for i in range(N))):
    time.sleep(0.05)
assert len(streamed) == N and all(c_streaming(i) for i in range(N)), \
    f"not all streams started: python {sorted(streamed)}, C {[c_streaming(i) for i in range(N)]}"
router = top(bin_dir, topo)["router"]["pid"]
os.kill(router, signal.SIGKILL)
t0 = time.time()
for t in ts: t.join()
waited = time.time() - t0
assert not timed_out, f"Python clients {timed_out} waited for their own timeout: no terminal reply"
for i in range(N):
    got = terminal.get(i, [])
    assert len(got) == 1, f"Python client {i}: {len(got)} terminal replies: {got}"
    e = got[0]
    assert e["type"] == "error" and e["code_name"] == "unavailable" and e["retryable"], e
    assert "connection to the router" in e["message"] and "outcome is unknown" in e["message"], e
    assert clients[i].requests_lost == 1, clients[i].requests_lost
print(f"kill -9 of the router: {N} Python streams (after {sorted(streamed.values())} tokens) each ended "
      f"once with unavailable/retryable, {waited:.1f} s after the kill; none waited for its 30 s timeout")
print("---", got[0]["message"])
wait_restarted(bin_dir, topo, "router", router)
for i, c in enumerate(clients):   # the same client object, against the restarted router
    for attempt in range(50):
        last = list(c.generate(tokens=[1, 2, 3, 4], max_tokens=4))[-1]
        if last["type"] == "done" or not last.get("retryable"):
            break
        time.sleep(0.2)
    assert last["type"] == "done", (i, last)
    c.close()
print(f"each of the {N} Python client objects then completed a request at the restarted router")
PY
for i in 0 1 2; do
  rc=0; wait "${pids[$i]}" || rc=$?
  n_term=$($PY -c "
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(sum(m.get('type') in ('done', 'error') for m in ms))" "$WORK/c$i.out")
  note "troupe-client $i: exit $rc, $n_term terminal replies: $(grep -h '"type":"error"\|"type": "error"' "$WORK/c$i.out" | head -c 300)"
  [ "$rc" -ne 3 ] || fail "troupe-client $i waited for its own timeout: no terminal reply ($(cat "$WORK/c$i.err"))"
  [ "$rc" -eq 1 ] && [ "$n_term" -eq 1 ] || fail "troupe-client $i: exit $rc with $n_term terminal replies"
  $PY - "$WORK/c$i.out" <<'PY' || fail "troupe-client $i: not the lost-connection error"
import json, sys
e = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
assert e["type"] == "error" and e["code"] == "unavailable" and e["retryable"] is True, e
assert "connection to the router" in e["message"] and "outcome is unknown" in e["message"], e
PY
done
"$BIN/troupe-client" --topology "$WORK/t.yaml" --timeout-ms 60000 submit --ids 1,2,3 --max-tokens 2 >/dev/null 2>&1 \
  || fail "a new troupe-client request after the restart failed"
echo "3 troupe-client streams each ended once with the retryable unavailable error; a new one completes"
echo "PASS router_failover"
