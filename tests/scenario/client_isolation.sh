# One client cannot hurt another inside the protocol, and the router's ids survive its restart:
#  - a cancel from another connection naming a request's client id leaves that request running, and
#    that connection is told its cancel was refused;
#  - a frame over limits.max_message_bytes is answered with an error naming the limit (not a
#    silent disconnect), and the C client library refuses such a request before sending it;
#  - a text prompt too long to fit max_model_len is refused before it is tokenized;
#  - a restarted router does not number its requests from where a fresh one would (1): its ids
#    start at a random point, so workers still running the old incarnation's requests never see a
#    new request under the same id.
. "$(dirname "$0")/lib.sh"
make_demo_topology "$WORK/t.yaml" "limits:
  max_message_bytes: 65536
  max_model_len: 64"
start_cluster "$WORK/t.yaml" --verbose
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
PYTHONPATH="$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 - "$ep" <<'PY' || fail "see above"
import sys, time, msgpack, zmq
from troupe_client import Client, TYPE_NUM
ep = sys.argv[1]
a, b = Client(ep, 60), Client(ep, 60)
a.send("submit", id=4242, tokens=list(range(1, 9)), stream=True,
       sampling={"max_tokens": 48, "ignore_eos": True})
# b's cancel only once the request is in flight (its first token came back): the two connections'
# frames reach the router in no set order, and a cancel of an id not yet known is ignored.
sent = False
while True:
    m = a.recv(60)
    assert m is not None, "no reply for the request"
    if not sent:
        b.send("cancel", id=4242)
        sent = True
    if m["type"] in ("done", "error"):
        break
print("--- request after another connection's cancel:", m["type"], m.get("finish_name"), m.get("usage"))
assert m["type"] == "done" and m["finish_name"] != "cancelled" and m["usage"]["completion_tokens"] == 48, \
    "another connection's cancel ended the request: %s" % m
e = b.recv(10)
print("--- the other connection's cancel:", e and e.get("message"))
assert e is not None and e["type"] == "error" and "cancel refused" in e["message"], \
    "the other connection's cancel was not refused with an error: %s" % e
assert b.recv(0.3) is None, "the other connection got a reply for a request it did not submit"

# A frame over the cap, sent raw (the client library would refuse it).
raw = zmq.Context.instance().socket(zmq.DEALER); raw.setsockopt(zmq.LINGER, 0); raw.connect(ep)
raw.send(msgpack.packb({"v": 1, "t": TYPE_NUM["submit"], "id": 77, "prompt": "x" * 100000,
                        "sampling": {"max_tokens": 4}}))
assert raw.poll(10000), "no reply to a frame over the cap"
e = msgpack.unpackb(raw.recv(), raw=False)
print("--- frame over the cap:", e.get("message"))
assert e.get("id") == 77 and "limits.max_message_bytes (65536)" in e.get("message", ""), e

# A prompt that fits the frame but cannot fit max_model_len: refused before tokenizing.
a.send("submit", id=78, prompt="word " * 12000, sampling={"max_tokens": 4})
m = a.recv(30)
print("--- long prompt:", m.get("message"))
assert m["type"] == "error" and "bytes cannot fit in max_model_len" in m["message"], m
PY
big=$(head -c 70000 /dev/zero | tr '\0' 'y')
rc=0; "$BIN/troupe-client" --topology "$WORK/t.yaml" --timeout-ms 5000 submit "$big" >"$WORK/big.out" 2>&1 || rc=$?
note "C client, 70 kB prompt: exit $rc: $(head -c 200 "$WORK/big.out")"
[ "$rc" -eq 2 ] && grep -q "exceeds the cluster's limits.max_message_bytes (65536)" "$WORK/big.out" \
  || fail "the client library sent (or did not explain) a request over the cap"

# Router restart: the new incarnation's first id is not the old one's next, nor 1.
"$BIN/troupe-client" --topology "$WORK/t.yaml" submit --ids 1,2,3 --max-tokens 2 >/dev/null 2>&1 || fail "submit"
first=$(grep -o "request [0-9]* (client" "$WORK/supervisor.log" | head -1 | awk '{print $2}')
kill -9 "$(pgrep -f -- "troupe-router --topology $WORK/t.yaml" | head -1)"
wait_for grep -q "router ready in .*restarted" "$WORK/supervisor.log" || fail "router not restarted"
n_before=$(grep -c "request [0-9]* (client" "$WORK/supervisor.log")
"$BIN/troupe-client" --topology "$WORK/t.yaml" submit --ids 1,2,3 --max-tokens 2 >/dev/null 2>&1 || fail "submit after restart"
second=$(grep -o "request [0-9]* (client" "$WORK/supervisor.log" | sed -n "$((n_before + 1))p" | awk '{print $2}')
note "router ids: first incarnation's first request $first, restarted router's first request $second"
[ -n "$first" ] && [ -n "$second" ] || fail "request ids not found in the router's log"
[ "$second" != 1 ] && [ "$second" != "$first" ] && [ "$second" != $((first + 1)) ] \
  || fail "the restarted router reuses the id space (first $first, then $second)"
echo "PASS client_isolation"
