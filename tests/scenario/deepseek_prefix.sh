# DeepSeek-V3's compressed MLA cache through prefix reuse, the host store and a restart: a 6-turn
# conversation on the deepseek-v3-f32 fixture over two prefill workers. From turn 2 on the history's
# blocks are reused (cached_tokens); before turn 4 both prefill workers are killed (-9) and restart
# with empty pools, so from then on the history comes from the cache-manager's host store
# (TROUPE_PREFILL_FETCH=always: the fetch path, not the choice). Every turn's greedy tokens must
# equal troupe-generate's on the same ids (one process, nothing cached): blocks of latent + RoPE key
# survive hand-off, write-back and fetch unchanged. Requests go through the C client (troupe-client,
# servelib.c_run_one): no pyzmq needed. BACKEND=cuda: the cluster and troupe-generate on GPU 0.
. "$(dirname "$0")/lib.sh"
MODEL=$ROOT/tests/fixtures/models/deepseek-v3-f32
MODEL_PATH=$MODEL N_PREFILL=2 make_topology "$WORK/t.yaml"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$MODEL" "${BACKEND:-cpu}" <<'PY'
import random, subprocess, sys, time
from servelib import c_run_one, top
ep, bin_dir, topo, model, backend = sys.argv[1:6]
random.seed(5)
while len([a for a in top(bin_dir, topo).values() if a["role"] == "prefill"]) < 2:
    time.sleep(0.2)
def generate(ids):
    out = subprocess.run([f"{bin_dir}/troupe-generate", model, "--backend", backend, "--ids", ",".join(map(str, ids)),
                          "--max-tokens", "8", "--temperature", "0", "--ignore-eos", "--json"],
                         capture_output=True, text=True, check=True)
    import json
    d = json.loads(out.stdout)
    return d["ids"]   # the generated ids
history = []
for turn in range(1, 7):
    if turn == 4:
        for name in ("prefill-0", "prefill-1"):
            subprocess.run(["kill", "-9", str(top(bin_dir, topo)[name]["pid"])], check=True)
        deadline = time.time() + 10
        while time.time() < deadline:
            t = top(bin_dir, topo)
            if all(t[n]["restarts"] == 1 and t[n]["state"] == "ready" for n in ("prefill-0", "prefill-1")):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("prefill workers not restarted")
    prompt = history + [random.randrange(3, 500) for _ in range(random.randrange(5, 15))]
    toks, done, _ = c_run_one(bin_dir, ep, prompt, max_tokens=8)
    assert done["type"] == "done", done
    ref = generate(prompt)
    cached = done["usage"]["cached_tokens"]
    print(f"turn {turn}: prompt {len(prompt):3d} cached {cached:3d} tokens {'equal' if toks == ref else 'DIFFER'}")
    assert toks == ref, f"turn {turn}: cluster {toks} != troupe-generate {ref}"
    if turn > 1:
        assert cached >= ((len(history) - 1) // 16) * 16, "history not reused"
    history = prompt + toks
PY
echo "PASS deepseek_prefix"
