# Write-back shedding: a decode worker copies finished sequences to the host store in its loop,
# so under load (half of max_batch running) it writes back only requests that asked for
# retention (prompt_cache_key); alone, any request is written back. Checked through the decode
# worker's writebacks_total / writebacks_shed_total and that every request is served.
. "$(dirname "$0")/lib.sh"
MODEL=$ROOT/tests/fixtures/models/qwen3-f32
MODEL_PATH=$MODEL make_topology "$WORK/t.yaml" "limits:" "  max_batch: 4"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import random, sys
from servelib import run_one, run_many, metric, wait_idle_pools, wait_workers
ep, bin_dir, topo = sys.argv[1:4]
random.seed(5)
wait_workers(bin_dir, topo, 2)
prompt = lambda: [random.randrange(3, 500) for _ in range(40)]

def decode_counts():
    d = next(a for a in wait_idle_pools(bin_dir, topo).values() if a["role"] == "decode")
    return metric(d, "writebacks_total"), metric(d, "writebacks_shed_total")

def served(res):
    for k, r in res.items():
        assert not isinstance(r, Exception), (k, r)
        assert r[1]["type"] == "done", (k, r[1])

# Alone: written back.
_, final, _ = run_one(ep, prompt(), max_tokens=40)
assert final["type"] == "done", final
wb0, shed0 = decode_counts()
assert (wb0, shed0) == (1, 0), (wb0, shed0)
# Four at once without a cache key, same lengths: they finish together in a full batch, so all
# but the last to leave are shed.
served(run_many(ep, [(i, dict(ids=prompt(), max_tokens=40)) for i in range(4)], workers=4))
wb1, shed1 = decode_counts()
print(f"no key, batch of 4: written back {wb1 - wb0:.0f}, shed {shed1 - shed0:.0f}")
assert shed1 - shed0 >= 1 and wb1 - wb0 + shed1 - shed0 == 4, (wb1, shed1)
# Four at once with a cache key (retention asked): every one is written back.
served(run_many(ep, [(i, dict(ids=prompt(), max_tokens=40, prompt_cache_key=f"conv-{i}")) for i in range(4)],
                workers=4))
wb2, shed2 = decode_counts()
print(f"with keys, batch of 4: written back {wb2 - wb1:.0f}, shed {shed2 - shed1:.0f}")
assert (wb2 - wb1, shed2 - shed1) == (4, 0), (wb2, shed2)
PY
echo "PASS writeback_shed"
