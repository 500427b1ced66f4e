# CURVE with a ZAP handler (docs/security.md): with keys in the topology, a client without a key,
# one with a key that is not in security.curve_clients, and a plaintext peer at an actor's inbox
# get nothing; the allow-listed key is served; refusals are logged and counted. Then who may say
# what: a peer that connects to a decode inbox under the router's name but holds no key of the
# cluster is refused by the handshake, so the inbox never counts a message from it.
. "$(dirname "$0")/lib.sh"
mkdir -p "$WORK/keys"
for k in server alice mallory; do "$BIN/troupe-keygen" "$WORK/keys/$k" >/dev/null; done
[ "$(stat -c %a "$WORK/keys/alice.key")" = 600 ] || fail "a secret key file is not 0600"
cp "$WORK/keys/alice.pub" "$WORK/keys/clients"
make_topology "$WORK/t.yaml" "security:
  curve_server_public: $WORK/keys/server.pub
  curve_server_secret: $WORK/keys/server.key
  curve_clients: $WORK/keys/clients"
start_cluster "$WORK/t.yaml"
for f in "$WORK"/run/keys/*.key; do
  [ "$(stat -c %a "$f")" = 600 ] || fail "generated key $f is not 0600"
done
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
ask() { timeout 30 "$BIN/troupe-client" --endpoint "$ep" --timeout-ms 3000 "$@" submit --ids 1,2,3,4 --max-tokens 4; }

rc=0; ask >"$WORK/nokey.out" 2>&1 || rc=$?
note "no key: exit $rc"
[ "$rc" -eq 3 ] || { cat "$WORK/nokey.out"; fail "a client without a key got an answer (exit $rc, expected 3: none)"; }
rc=0; ask --server-key "$WORK/keys/server.pub" --key "$WORK/keys/mallory" >"$WORK/wrong.out" 2>&1 || rc=$?
note "wrong key: exit $rc"
[ "$rc" -eq 3 ] || { cat "$WORK/wrong.out"; fail "a client whose key is not allowed got an answer (exit $rc)"; }
rc=0; ask --server-key "$WORK/keys/server.pub" --key "$WORK/keys/alice" >"$WORK/right.out" 2>&1 || rc=$?
note "right key: exit $rc"
[ "$rc" -eq 0 ] || { cat "$WORK/right.out"; fail "the allow-listed client was not served (exit $rc)"; }
grep -q "done:" "$WORK/right.out" || fail "no done for the allow-listed client"
grep -q "refused a connection" "$WORK/supervisor.log" || fail "the refusals were not logged"
# The Python client takes keys too.
PYTHONPATH="$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 - "$ep" "$WORK/keys" <<'PY' || fail "the Python client with the allow-listed key"
import sys
from troupe_client import Client
ep, keys = sys.argv[1], sys.argv[2]
with Client(ep, 30, server_key=keys + "/server.pub", key=keys + "/alice") as c:
    last = list(c.generate(tokens=[1, 2, 3, 4], max_tokens=4))[-1]
print("--- Python client, right key:", last["type"])
assert last["type"] == "done", last
PY

# A plaintext peer at decode.s inbox, claiming to be the router, sends a cancel.
PYTHONPATH="$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 - "$WORK/run/decode.sock" <<'PY'
import sys, time, msgpack, zmq
from troupe_client import TYPE_NUM
s = zmq.Context.instance().socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0); s.setsockopt(zmq.ROUTING_ID, b"router")
s.connect("ipc://" + sys.argv[1])
for i in range(5):
    try:
        s.send(msgpack.packb({"v": 1, "t": TYPE_NUM["cancel"], "id": 1}), zmq.DONTWAIT)
    except zmq.Again:
        pass   # not connected: the handshake was refused
    time.sleep(0.2)
PY
# With the cluster's key the monitor tool is served too (and shows the counts).
sleep 1.5
TROUPE_CURVE_SERVER_KEY=$WORK/keys/server.pub TROUPE_CURVE_KEY=$WORK/keys/alice top_json "$WORK/t.yaml" > "$WORK/top.json" \
  || fail "troupe-top with the allow-listed key got no answer"
/usr/bin/python3 - "$WORK/top.json" <<'PY' || fail "counts"
import json, sys
d = json.load(open(sys.argv[1]))
m = {a["name"]: {x["name"]: x["value"] for x in a.get("metrics", [])} for a in d["actors"]}
refused = m["router"].get("auth_refused", -1)
print("--- router auth_refused", refused, "; decode auth_refused", m["decode"].get("auth_refused"),
      "messages_refused", m["decode"].get("messages_refused"))
assert refused >= 2, "router counted %s refused handshakes, expected >= 2" % refused
assert m["decode"].get("auth_refused", 0) >= 1, "the plaintext peer at the inbox was not refused"
PY
echo "PASS curve_auth"
