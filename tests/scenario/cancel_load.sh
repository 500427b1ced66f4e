# Cancellation and load: 100 requests cancelled at random moments each get exactly one terminal
# reply and leave every KV pool as it was at idle; then 64 concurrent clients x 50 requests: every
# request gets exactly one terminal reply (and nothing after it).
. "$(dirname "$0")/lib.sh"
# N_PREFILL=0 runs it colocated (the decode workers compute the prompts: tests/scenario/colocated.sh).
N_PREFILL=${N_PREFILL:-2}
# Heartbeats every 500 ms (liveness 1.5 s, not the scenarios' 0.6 s): this test is about cancels and
# load, and colocated on 2 busy cores a worker's step once outlasted 0.6 s and it was restarted.
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 N_PREFILL=$N_PREFILL N_DECODE=2 HEARTBEAT_MS=500 make_topology "$WORK/t.yaml" \
  "limits:" "  max_batch: 64" "  admission_queue: 512"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$((N_PREFILL + 2))" <<'PY'
import random, sys, threading, time
from troupe_client import Client
from servelib import top, metric, wait_idle_pools, wait_workers
ep, bin_dir, topo = sys.argv[1:4]
random.seed(21)
wait_workers(bin_dir, topo, int(sys.argv[4]))
idle = wait_idle_pools(bin_dir, topo)

def one(results, key, cancel_after, n_tokens, drain_s):
    """Submits, optionally cancels, counts terminal replies for the request (also after the first)."""
    with Client(ep, timeout_s=60) as c:
        rid = c.send("submit", tokens=[random.randrange(3, 500) for _ in range(random.randrange(1, 40))],
                     sampling={"max_tokens": n_tokens, "temperature": 0, "ignore_eos": True}, stream=True)
        t0, cancelled, terminal, tokens, finish = time.time(), False, 0, 0, None
        deadline = t0 + 60
        while time.time() < deadline:
            if cancel_after is not None and not cancelled and time.time() - t0 >= cancel_after:
                c.cancel(rid)
                cancelled = True
            m = c.recv(0.005 if cancel_after is not None and not cancelled else 0.5)
            if m is None:
                if terminal:
                    break          # drained: nothing more came
                continue
            if m.get("id") != rid:
                continue
            if m["type"] == "token":
                tokens += 1
                if terminal:
                    terminal += 1  # a token after the terminal reply counts as a violation
            elif m["type"] in ("done", "error"):
                terminal += 1
                finish = m.get("finish_name") or f"{m.get('code_name')}: {m.get('message')}"
                deadline = time.time() + drain_s
        results[key] = (terminal, finish, tokens)

# 100 cancels at random moments (before, during and after generation).
res = {}
ts = [threading.Thread(target=one, args=(res, i, random.uniform(0, 1.5), 200, 0.3)) for i in range(100)]
for t in ts: t.start()
for t in ts: t.join()
bad = {k: v for k, v in res.items() if v[0] != 1}
assert len(res) == 100 and not bad, bad
finishes = {}
for _, f, _ in res.values():
    finishes[f] = finishes.get(f, 0) + 1
print(f"100 cancelled requests: exactly one terminal reply each; finishes {finishes}")
assert set(finishes) <= {"cancelled", "length"}, "a cancel race surfaced as an error"
t = wait_idle_pools(bin_dir, topo)
for n, a in t.items():
    if a["role"] in ("prefill", "decode"):
        assert metric(a, "kv_blocks_used") == 0 and metric(a, "kv_blocks_free") == metric(idle[n], "kv_blocks_free"), n
print("every KV pool back to its idle state")

# Load: 64 clients x 50 requests.
res = {}
def client(ci):
    for j in range(50):
        one(res, (ci, j), None, random.randrange(1, 12), 0.0)
t0 = time.time()
ts = [threading.Thread(target=client, args=(ci,)) for ci in range(64)]
for t in ts: t.start()
for t in ts: t.join()
bad = {k: v for k, v in res.items() if v[0] != 1 or v[1] not in ("stop", "length")}
print(f"load: {len(res)} requests in {time.time() - t0:.1f} s, {len(bad)} without exactly one terminal reply")
assert len(res) == 3200 and not bad, list(bad.items())[:5]
wait_idle_pools(bin_dir, topo)
r = next(a for a in top(bin_dir, topo).values() if a["role"] == "router")
print("router:", {m["name"]: m["value"] for m in r["metrics"] if m["name"].startswith(("requests_", "ttft", "itl"))})
PY
echo "PASS cancel_load"
