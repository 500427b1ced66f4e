# A cancel reaches only the requests submitted under the canceller's own credential (docs/security.md):
# with CURVE, the client's key. Alice submits a long stream on one connection; Bob (another allowed
# key) cancels the same id: he gets an error saying so and Alice's stream goes on, until Alice
# herself cancels it from a second connection under her key, which ends it with
# done (cancelled) on the submitting connection. Counted in the router's cancels_refused.
. "$(dirname "$0")/lib.sh"
mkdir -p "$WORK/keys"
for k in server alice bob; do "$BIN/troupe-keygen" "$WORK/keys/$k" >/dev/null; done
cat "$WORK/keys/alice.pub" "$WORK/keys/bob.pub" > "$WORK/keys/clients"
make_demo_topology "$WORK/t.yaml" "security:
  curve_server_public: $WORK/keys/server.pub
  curve_server_secret: $WORK/keys/server.key
  curve_clients: $WORK/keys/clients"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$WORK/keys" "$BIN" "$WORK/t.yaml" <<'PY' || fail "see above"
import os, sys, time
from troupe_client import Client
from servelib import top, metric
ep, keys, bin_dir, topo = sys.argv[1:5]
def client(who):
    return Client(ep, 60, server_key=keys + "/server.pub", key=keys + "/" + who)
a1, a2, b = client("alice"), client("alice"), client("bob")
a1.send("submit", id=4242, tokens=list(range(1, 9)), stream=True,
        sampling={"max_tokens": 400, "ignore_eos": True})
m = a1.recv(60)
assert m is not None and m["type"] == "token", f"no first token: {m}"
b.send("cancel", id=4242)
e = b.recv(10)
print("--- Bob's cancel of Alice's request:", e and (e["type"], e.get("message")))
assert e is not None and e["type"] == "error" and "cancel refused" in e["message"] and "key" in e["message"], e
streamed = len(m["tokens"])
t_end = time.time() + 1.0
while time.time() < t_end:        # Alice's stream goes on after Bob's cancel
    m = a1.recv(5)
    assert m is not None and m["type"] == "token", f"Alice's request ended after Bob's cancel: {m}"
    streamed += len(m["tokens"])
a2.send("cancel", id=4242)        # Alice again, on another connection: her key, her request
while True:
    m = a1.recv(30)
    assert m is not None, "no terminal reply after Alice's cancel"
    if m["type"] != "token":
        break
    streamed += len(m["tokens"])
print("--- after Alice's own cancel (second connection):", m["type"], m.get("finish_name"), m.get("usage"))
assert m["type"] == "done" and m["finish_name"] == "cancelled" and streamed < 400, m
assert a2.recv(0.3) is None and b.recv(0.3) is None, "a terminal reply went to a connection that did not submit"
time.sleep(1.2)
os.environ.update(TROUPE_CURVE_SERVER_KEY=keys + "/server.pub", TROUPE_CURVE_KEY=keys + "/alice")
router = [x for x in top(bin_dir, topo).values() if x["role"] == "router"][0]
print("--- router: cancels_refused", metric(router, "cancels_refused"),
      "requests_cancelled", metric(router, "requests_cancelled"))
assert metric(router, "cancels_refused") == 1 and metric(router, "requests_cancelled") == 1, router
PY
echo "PASS cancel_credential"
