# A decode worker killed while requests are still being prefilled for it: those requests have not
# streamed anything yet, so the router re-routes them (requests_rerouted) to the other decode
# worker and they complete. Requests already streaming from the dead worker migrate instead
# (tests/scenario/decode_migrate.sh checks those); any request that fails must have streamed, with
# the retryable worker_lost error. Every request ends once.
. "$(dirname "$0")/lib.sh"
make_demo_topology "$WORK/t.yaml" "limits:" "  max_batch: 32" "  max_model_len: 1024" "  prefill_chunk_tokens: 128"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import os, random, signal, sys, threading, time
from troupe_client import Client
from servelib import top, metric, wait_idle_pools, wait_workers
ep, bin_dir, topo = sys.argv[1:4]
random.seed(23)
t = wait_workers(bin_dir, topo, 3)
results = {}
def one(i):
    # 12 prompts (and the re-routed ones again) go through one prefill worker on the CPU, which
    # computes a few dozen demo-model tokens a second on a 2-core machine: give the replies time;
    # a lost request still fails, only later.
    with Client(ep, timeout_s=300) as c:
        n, last = 0, None
        for m in c.generate(tokens=[random.randrange(1000, 100000) for _ in range(200)], max_tokens=16,
                            temperature=0, ignore_eos=True):
            n += m["type"] == "token"
            last = m
        results[i] = (n, last)
ts = [threading.Thread(target=one, args=(i,)) for i in range(12)]
for th in ts: th.start()
time.sleep(0.4)                    # 12 x 200 prompt tokens in 128-token chunks: most still prefilling
os.kill(t["decode-0"]["pid"], signal.SIGKILL)
for th in ts: th.join()
done = [r for r in results.values() if r[1]["type"] == "done"]
failed = [r for r in results.values() if r[1]["type"] == "error"]
assert len(results) == 12
for n, m in done:
    assert n == 16 and m["usage"]["completion_tokens"] == 16, (n, m)
for n, m in failed:
    assert m["code_name"] == "worker_lost" and m["retryable"] and n > 0, (n, m)   # only ones already streaming
wait_idle_pools(bin_dir, topo)
router = next(a for a in top(bin_dir, topo).values() if a["role"] == "router")
moved = metric(router, "requests_rerouted")
print(f"decode-0 killed: {moved:.0f} requests re-routed, {len(done)} completed, {len(failed)} failed (were streaming)")
assert moved >= 1, "nothing was re-routed: the test did not test re-routing"
PY
echo "PASS reroute"
