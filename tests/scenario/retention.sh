# Retention: a prompt pinned with prompt_cache_key survives a flood of unrelated prompts that
# evicts everything unpinned (host store of 24 blocks, worker pools of 48), and after its pin
# expires the next flood evicts it too. The 60 s pin is checked for survival; the expiry part uses a
# 3 s pin so the suite stays quick (the cache-manager's expiry timer is the same code either way).
. "$(dirname "$0")/lib.sh"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 make_topology "$WORK/t.yaml" \
  "limits:" "  kv_blocks: 48" "  max_batch: 4" "cache:" "  host_store_blocks: 24"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$WORK/supervisor.log" <<'PY'
import random, sys, time
from servelib import run_one, top, metric
ep, bin_dir, topo = sys.argv[1:4]
random.seed(3)
def prompt(): return [random.randrange(3, 500) for _ in range(64)]
def flood(n=30):
    for _ in range(n):
        _, d, _ = run_one(ep, prompt(), max_tokens=4)
        assert d["type"] == "done", d
def cached(ids, **kw):
    _, d, _ = run_one(ep, ids, max_tokens=4, **kw)
    assert d["type"] == "done", d
    return d["usage"]["cached_tokens"]
pinned, short, plain = prompt(), prompt(), prompt()
assert cached(pinned, prompt_cache_key="system-prompt", cache_retention="60") == 0
assert cached(short, prompt_cache_key="short-lived", cache_retention="3s") == 0
assert cached(plain) == 0
time.sleep(0.3)
flood()
time.sleep(1.2)     # a stats interval
cm = next(a for a in top(bin_dir, topo).values() if a["role"] == "cache_manager")
print(f"after the flood: host store {metric(cm, 'host_blocks_used'):.0f} used, {metric(cm, 'host_blocks_pinned'):.0f} pinned, "
      f"{metric(cm, 'blocks_evicted_total'):.0f} evicted")
assert metric(cm, "blocks_evicted_total") > 24, open(sys.argv[4]).read()[-3000:]
c_plain, c_pinned = cached(plain), cached(pinned, prompt_cache_key="system-prompt", cache_retention="60")
print(f"unpinned prompt: cached {c_plain}; pinned (60 s): cached {c_pinned}")
assert c_plain == 0, "an unpinned prompt survived the flood"
assert c_pinned == 48, "the pinned prompt lost its blocks"   # 4 blocks, the last token always computed
time.sleep(3.5)     # the 3 s pin expires
flood()
time.sleep(0.3)
c_short = cached(short)
print(f"3 s pin after expiry and a flood: cached {c_short}")
assert c_short == 0, "an expired pin still protected its blocks"
time.sleep(1.2)
cm = next(a for a in top(bin_dir, topo).values() if a["role"] == "cache_manager")
assert metric(cm, "pins_expired_total") >= 4
PY
echo "PASS retention"
