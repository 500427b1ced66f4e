# Workers drop a dead router's requests (actors/worker/router_watch.h): with three streams running
# at the decode workers and two long prompts at the prefill worker, kill -9 of the router. Nobody
# can read those requests' answers any more (the restarted router knows none of their ids), so the
# workers must not finish them: within a few seconds every KV pool is back to idle (not after the
# 2,000 tokens each stream asked for), and the workers count the requests they dropped. A router
# restarted too fast for a worker to see it die answers the old requests' tokens with a cancel (its
# stale_requests_cancelled). Then the restarted router serves a new request.
. "$(dirname "$0")/lib.sh"
make_demo_topology "$WORK/t.yaml" "limits:
  max_model_len: 4096
  prefill_chunk_tokens: 16"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import os, signal, sys, threading, time
from troupe_client import Client
from servelib import top, metric, wait_idle_pools, wait_restarted
ep, bin_dir, topo = sys.argv[1:4]
started = set()
def stream(i):
    with Client(ep, timeout_s=8) as c:
        try:
            for m in c.generate(tokens=[100 + i] * 8, max_tokens=2000, temperature=0, ignore_eos=True):
                if m["type"] == "token":
                    started.add(i)
        except TimeoutError:
            pass    # the lost-connection error normally ends them first (router_failover.sh checks that)
ts = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
for t in ts: t.start()
deadline = time.time() + 60
while len(started) < 3 and time.time() < deadline:
    time.sleep(0.05)
assert len(started) == 3, f"only {len(started)} of 3 streams started"
long_clients = []
for i in range(2):   # two long prompts, computed 16 tokens a step at the prefill worker
    c = Client(ep, timeout_s=5)
    c.send("submit", tokens=[200 + i] * 3000, stream=True, sampling={"max_tokens": 8})
    long_clients.append(c)
time.sleep(0.5)
view = top(bin_dir, topo)
router = view["router"]["pid"]
os.kill(router, signal.SIGKILL)
t0 = time.time()
wait_idle_pools(bin_dir, topo, timeout_s=10)
idle_s = time.time() - t0
wait_restarted(bin_dir, topo, "router", router, timeout_s=15)
time.sleep(1.2)
view = top(bin_dir, topo)
dropped = {n: metric(a, "requests_dropped_router_lost") for n, a in view.items() if a["role"] in ("prefill", "decode")}
stale = metric(view["router"], "stale_requests_cancelled")
print(f"kill -9 of the router with 3 streams and 2 long prompts in flight: every KV pool idle "
      f"{idle_s:.1f} s after; dropped by the workers {dropped}; stale tokens cancelled by the new router {stale}")
assert sum(dropped.values()) + stale >= 5, (dropped, stale)
assert dropped.get("prefill", 0) >= 1, dropped        # a long prompt was still being computed
assert dropped.get("decode-0", 0) + dropped.get("decode-1", 0) >= 3, dropped   # the three streams
for c in long_clients: c.close()
for t in ts: t.join()
with Client(ep, timeout_s=60) as c:
    for attempt in range(50):
        last = list(c.generate(tokens=[1, 2, 3, 4], max_tokens=4))[-1]
        if last["type"] == "done" or not last.get("retryable"):
            break
        time.sleep(0.2)
assert last["type"] == "done", last
print("the restarted router serves again")
PY
echo "PASS router_lost"
