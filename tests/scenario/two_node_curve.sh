# The KV hand-off between machines under CURVE (docs/security.md, "The KV hand-off between
# machines"): a two-node cluster on 127.0.0.1 and 127.0.0.2 (both launch: local) with keys, the
# prefill worker on one node and the decode worker on the other, so every hand-off's bytes go over
# the tcp channel, which is then a CURVE server at the sender that serves a transfer only to its
# decode worker's key. Greedy output equals troupe-generate, every hand-off went over tcp, and no
# fetch was refused.
. "$(dirname "$0")/lib.sh"
two_node_topology "$WORK/t.yaml" "t-two-node-curve-$$" "security:" \
  "  curve_server_public: $WORK/keys/server.pub" "  curve_server_secret: $WORK/keys/server.key" \
  "  curve_clients: $WORK/keys/clients"
mkdir -p "$WORK/keys"
for k in server alice; do "$BIN/troupe-keygen" "$WORK/keys/$k" >/dev/null; done
cp "$WORK/keys/alice.pub" "$WORK/keys/clients"
start_cluster "$WORK/t.yaml"
generate_reference "$MODEL"
export TROUPE_CURVE_SERVER_KEY=$WORK/keys/server.pub TROUPE_CURVE_KEY=$WORK/keys/alice
$PY - "$BIN" "$WORK/t.yaml" "$CLIENT_EP" "$WORK/prompts" "$WORK/generate" "$WORK/keys" <<'PY'
import sys, time
from troupe_client import Client
from servelib import top
bin_dir, topo, ep, keys = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[6]
prompts = [list(map(int, l.split(","))) for l in open(sys.argv[4]).read().split()]
generate = [list(map(int, l.split(","))) for l in open(sys.argv[5]).read().split()]
with Client(ep, 60, server_key=keys + "/server.pub", key=keys + "/alice") as c:
    for i, p in enumerate(prompts):
        toks, last = [], None
        for m in c.generate(tokens=p, max_tokens=16, temperature=0, ignore_eos=True):
            if m["type"] == "token":
                toks += m["tokens"]
            last = m
        assert last["type"] == "done", (i, last)
        assert toks == generate[i], f"prompt {i}: cluster {toks} != generate {generate[i]}"
def metrics():
    out = {}
    for a in top(bin_dir, topo).values():
        for m in a["metrics"]:
            out[(a["role"], m["name"])] = out.get((a["role"], m["name"]), 0) + m["value"]
    return out
deadline = time.time() + 10
while True:
    m = metrics()
    # both sides' counters: each actor publishes its stats on its own period, so one may lag
    if (m.get(("decode", "transfers_tcp_total"), 0) >= len(prompts) and
            m.get(("prefill", "transfers_tcp_total"), 0) >= len(prompts)) or time.time() > deadline:
        break
    time.sleep(0.2)
tcp_in, tcp_out = m.get(("decode", "transfers_tcp_total"), 0), m.get(("prefill", "transfers_tcp_total"), 0)
print(f"CURVE, two nodes: {len(prompts)} prompts equal to generate; hand-offs over tcp: decode {tcp_in:.0f}, "
      f"prefill {tcp_out:.0f}")
assert tcp_in == len(prompts) and tcp_out == len(prompts), m
PY
grep -q "CURVE handshake\|refused it to us\|refused our CURVE key" "$WORK/supervisor.log" \
  && fail "a hand-off fetch was refused: $(grep -m1 'CURVE handshake\|refused it to us\|refused our CURVE key' "$WORK/supervisor.log")"
echo "PASS two_node_curve"
