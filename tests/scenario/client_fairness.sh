# One client cannot take the router from others (limits.max_inflight_per_client, docs/security.md):
# with a cap of 4, a client that fires 40 requests at once on one connection gets 4 admitted and 36
# immediate retryable `overloaded` errors naming the limit, while another client's short request
# beside it is served; once the flood's requests end the client's count is back to zero (its next 4
# are all admitted). The router counts the refusals (requests_client_capped).
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml" "limits:
  max_inflight_per_client: 4
  max_model_len: 512"
start_cluster "$WORK/t.yaml"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import collections, sys, time
from troupe_client import Client
from servelib import top, metric
ep, bin_dir, topo = sys.argv[1:4]
def replies(c, n):
    """The terminal reply of each of n requests in flight on c (token messages skipped)."""
    out = {}
    while len(out) < n:
        m = c.recv(60)
        assert m is not None, f"{n - len(out)} of the flood got no reply"
        if m["type"] in ("done", "error"):
            assert m["id"] not in out, f"a second terminal reply: {m}"
            out[m["id"]] = m
    return out
def flood(c, n):
    ids = [c.send("submit", tokens=[5 + i % 50] * 16, stream=False,
                  sampling={"max_tokens": 48, "ignore_eos": True}) for i in range(n)]
    out = replies(c, n)
    return [out[i] for i in ids]
flooder, other = Client(ep, 60), Client(ep, 60)
# The flood goes out first; the other client's request right behind it.
ids = [flooder.send("submit", tokens=[5 + i % 50] * 16, stream=False,
                    sampling={"max_tokens": 48, "ignore_eos": True}) for i in range(40)]
t_other = time.time()
last = list(other.generate(tokens=[7, 8, 9, 10], max_tokens=4, stream=False))[-1]
other_ms = (time.time() - t_other) * 1000
assert last["type"] == "done", last
got = replies(flooder, 40)
kinds = collections.Counter(m["type"] if m["type"] == "done" else m.get("code_name") for m in got.values())
capped = [m for m in got.values() if m["type"] == "error"]
print(f"flood of 40 with max_inflight_per_client 4: {dict(kinds)}; the other client's request done in {other_ms:.0f} ms")
assert kinds["done"] == 4 and kinds["overloaded"] == 36, kinds
assert all(m["retryable"] and "max_inflight_per_client" in m["message"] for m in capped), capped[0]
again = flood(flooder, 4)
assert all(m["type"] == "done" for m in again), again
time.sleep(1.2)
router = [a for a in top(bin_dir, topo).values() if a["role"] == "router"][0]
print("--- router requests_client_capped:", metric(router, "requests_client_capped"))
assert metric(router, "requests_client_capped") == 36
PY
echo "PASS client_fairness"
