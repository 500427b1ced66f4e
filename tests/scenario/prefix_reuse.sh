# Prefix reuse: a 10-turn conversation. From turn 2 on, cached_tokens covers the history (to the
# block: the KV of the last generated token is never computed) and the prefill work per turn is only
# the new tokens, counted by the prefill workers themselves. Between turns 5 and 6 every prefill
# worker is killed (-9) and restarted with an empty pool, so turn 6 lands on a worker that never saw
# the conversation: its history must come from the cache-manager's host store. The tiny fixture
# computes a block faster than a fetch brings it, so the workers are told to fetch regardless
# (TROUPE_PREFILL_FETCH=always): this test is of the fetch path, not of the choice.
. "$(dirname "$0")/lib.sh"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 N_PREFILL=2 make_topology "$WORK/t.yaml"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import random, subprocess, sys, time
from servelib import run_one, top, metric
ep, bin_dir, topo = sys.argv[1:4]
random.seed(11)
while len([a for a in top(bin_dir, topo).values() if a["role"] == "prefill"]) < 2:
    time.sleep(0.2)   # until both workers have reported once
bs = 16
history = []
def computed():
    return sum(metric(a, "computed_tokens_total") for a in top(bin_dir, topo).values() if a["role"] == "prefill")
for turn in range(1, 11):
    if turn == 6:
        for name in ("prefill-0", "prefill-1"):
            pid = top(bin_dir, topo)[name]["pid"]
            subprocess.run(["kill", "-9", str(pid)], check=True)
        deadline = time.time() + 10
        while time.time() < deadline:   # restarted: new pids, ready, counters from zero
            t = top(bin_dir, topo)
            if all(t[n]["restarts"] == 1 and t[n]["state"] == "ready" for n in ("prefill-0", "prefill-1")):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("prefill workers not restarted")
        time.sleep(1.2)   # a stats interval: counters of the new incarnations
    before = computed()
    new = [random.randrange(3, 500) for _ in range(random.randrange(5, 15))]
    prompt = history + new
    toks, done, _ = run_one(ep, prompt, max_tokens=8)
    assert done["type"] == "done", done
    u = done["usage"]
    time.sleep(1.2)       # prefill counters reach the monitor once a second
    work = computed() - before
    expect_cached = ((len(history) - 1) // bs) * bs if turn > 1 else 0
    print(f"turn {turn:2d}: prompt {u['prompt_tokens']:3d} history {len(history):3d} cached {u['cached_tokens']:3d} "
          f"(>= {expect_cached}) prefill computed {work:3.0f} (= prompt - cached {u['prompt_tokens'] - u['cached_tokens']})")
    assert u["prompt_tokens"] == len(prompt)
    assert u["cached_tokens"] >= expect_cached, "history not reused"
    assert work == u["prompt_tokens"] - u["cached_tokens"], "prefill recomputed cached tokens"
    history = prompt + toks
PY
echo "PASS prefix_reuse"
