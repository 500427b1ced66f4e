# The cache-manager's device-tier index stays within the workers' pools (actors/cache/dev_index.h):
# 240 requests with distinct prompts of three full blocks each are announced by the workers (720
# blocks and more) to pools of 64 blocks; the index may hold at most 64 per worker. Then the prefill
# worker is killed (kill -9): its entries are withdrawn (device_blocks_withdrawn_total grows by them)
# and its restarted incarnation starts from none. Before the index was bounded it kept every block
# ever announced (a 30-minute nemesis: about a million).
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml" "limits:
  kv_blocks: 64
  max_model_len: 256"
start_cluster "$WORK/t.yaml"
$PY - "$(client_endpoints "$WORK/t.yaml")" "$BIN" "$WORK/t.yaml" <<'PY'
import os, random, signal, sys, time
from troupe_client import Client
from servelib import metric, top
ep, bin_dir, topo = sys.argv[1:4]
POOL, BLOCK = 64, 16
r = random.Random(5)

def cm():
    time.sleep(1.2)   # stats come once a second
    return top(bin_dir, topo)["cache-manager"]

def m(view, name):
    try:
        return metric(view, name)
    except KeyError:   # a cache-manager that does not withdraw
        return 0

with Client(ep, timeout_s=60) as c:
    for k in range(240):
        last = list(c.generate(tokens=[r.randrange(1, 500) for _ in range(3 * BLOCK + 2)], max_tokens=2))[-1]
        assert last["type"] == "done", last
view = cm()
workers = [n for n, a in top(bin_dir, topo).items() if a["role"] in ("prefill", "decode")]
indexed, withdrawn = metric(view, "device_blocks_indexed"), m(view, "device_blocks_withdrawn_total")
print(f"after 240 distinct prompts (3 blocks each) on {len(workers)} workers of {POOL} blocks: "
      f"{indexed:.0f} device blocks indexed, {withdrawn:.0f} withdrawn")
assert 0 < indexed <= POOL * len(workers), indexed
assert withdrawn >= 240 * 3 - POOL * len(workers), withdrawn
prefill = top(bin_dir, topo)["prefill"]
os.kill(prefill["pid"], signal.SIGKILL)
deadline = time.time() + 30
while time.time() < deadline:
    view = cm()
    if m(view, "device_blocks_withdrawn_total") > withdrawn:
        break
after = metric(view, "device_blocks_indexed")
print(f"prefill killed: {after:.0f} device blocks indexed, "
      f"{m(view, 'device_blocks_withdrawn_total') - withdrawn:.0f} more withdrawn")
assert m(view, "device_blocks_withdrawn_total") > withdrawn, "the dead worker's blocks were not withdrawn"
assert after <= POOL * (len(workers) - 1), after
PY
echo "PASS cache_index_bounded"
