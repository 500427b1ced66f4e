# Preemption: a decode worker whose KV pool (24 blocks of 16 tokens) is far too small for the
# 8 concurrent requests it admits (15 blocks each by the end) preempts the newest ones,
# recomputes their KV when blocks free up, and still produces exactly troupe-generate's greedy
# tokens for every request; no block leaks.
. "$(dirname "$0")/lib.sh"
MODEL=$ROOT/tests/fixtures/models/qwen3-f32
MODEL_PATH=$MODEL make_topology "$WORK/t.yaml" "limits:" "  kv_blocks: 24" "  max_batch: 8"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$MODEL" <<'PY'
import json, random, subprocess, sys
from servelib import run_many, top, metric, wait_idle_pools, wait_workers
ep, bin_dir, topo, model = sys.argv[1:5]
random.seed(17)
wait_workers(bin_dir, topo, 2)
prompts = [[random.randrange(3, 500) for _ in range(40)] for _ in range(8)]
want = []
for p in prompts:
    out = subprocess.run([f"{bin_dir}/troupe-generate", model, "--ids", ",".join(map(str, p)), "--max-tokens", "200",
                          "--temperature", "0", "--ignore-eos", "--json"], check=True, capture_output=True, text=True).stdout
    want.append(json.loads(out)["ids"])
res = run_many(ep, [(i, dict(ids=p, max_tokens=200)) for i, p in enumerate(prompts)], workers=8)
for i in range(8):
    assert not isinstance(res[i], Exception), res[i]
    toks, final, _ = res[i]
    assert final["type"] == "done", final
    assert toks == want[i], f"request {i}: {toks} != {want[i]}"
t = wait_idle_pools(bin_dir, topo)
d = next(a for a in t.values() if a["role"] == "decode")
print(f"8 requests exact; decode preemptions {metric(d, 'preemptions_total'):.0f}")
assert metric(d, "preemptions_total") > 0, "the pool never ran out: the test did not test preemption"
PY
echo "PASS preemption"
