# Colocated: a topology without prefill actors. Each decode worker computes its requests' prompts
# itself, in chunks (prefill_chunk_tokens: 8 here) batched with the decode steps of the others.
#   1. exactness: serve_exact.sh with N_PREFILL=0 (every fixture equals troupe-generate and
#      transformers, 32 random requests beside them, two decode workers);
#   2. cancels and load: cancel_load.sh with N_PREFILL=0 (one terminal reply per request, every
#      pool back to idle);
#   3. prefix reuse over two decode workers: the same 40-token prompt twice; the router sends the
#      second where the first's blocks are, which reuses them (usage.cached_tokens 32, all from
#      the worker's own pool: cached_device_tokens);
#   4. balance: 8 requests one after another, each still running when the next comes, are spread
#      over both workers (each worker's running requests count as its load);
#   5. kill -9 of one decode worker with requests in flight (prompts being computed, or decoding):
#      every request ends (done, re-routed to the other worker before its first token, or a
#      retryable error), the worker is restarted and serves again;
#   6. one worker, 100 prompts at once: they start in arrival order (none is passed by 8 or more
#      newer ones);
#   7. one worker with a 12-block pool: a long request near the end of its blocks and a 96-token
#      prompt that arrives then both finish (the prompt waits for blocks rather than taking the
#      ones the running request needs); a prompt larger than the pool is refused at once;
#   8. the host store: a first turn is written back, the worker restarts empty, and the second
#      turn's history is fetched from the cache-manager (its cached tokens all cached_host_tokens).
. "$(dirname "$0")/lib.sh"
N_PREFILL=0 bash "$ROOT/tests/scenario/serve_exact.sh" | grep -E "prompts equal|PASS" || fail "serve_exact, colocated"
N_PREFILL=0 bash "$ROOT/tests/scenario/cancel_load.sh" | grep -E "terminal|idle|PASS" || fail "cancel_load, colocated"

# Two workers of the demo model (slow enough on the CPU for requests to overlap and for a kill to
# land mid-request).
N_PREFILL=0 make_demo_topology "$WORK/t.yaml" "limits:" "  prefill_chunk_tokens: 8" "  max_batch: 16"
start_cluster "$WORK/t.yaml"
grep -q "decode workers compute\|computes its prompt too (colocated)" "$WORK/supervisor.log" || fail "the router did not say colocated"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import subprocess, sys, threading, time
from servelib import run_one, run_many_live, top, metric, wait_restarted, wait_workers
ep, bin_dir, topo = sys.argv[1:4]
wait_workers(bin_dir, topo, 2)
prompt = [(i * 37 + 11) % 500 for i in range(40)]
a, fa, _ = run_one(ep, prompt, max_tokens=6)
b, fb, _ = run_one(ep, prompt, max_tokens=6)
assert fa["type"] == "done" and fb["type"] == "done", (fa, fb)
assert a == b, (a, b)
assert fa["usage"]["cached_tokens"] == 0 and fb["usage"]["cached_tokens"] == 32, (fa["usage"], fb["usage"])
assert (fb["usage"]["cached_device_tokens"], fb["usage"]["cached_host_tokens"], fb["usage"]["cached_disk_tokens"]) == (32, 0, 0), fb["usage"]
time.sleep(1.2)   # a stats interval
ds = [a for a in top(bin_dir, topo).values() if a["role"] == "decode"]
assert sum(metric(d, "prompts_total") for d in ds) == 2, [d["metrics"] for d in ds]
assert sum(metric(d, "cached_tokens_total") for d in ds) == 32
assert sum(metric(d, "computed_tokens_total") for d in ds) == 40 + 8
print(f"prefix reuse: the second run of a 40-token prompt computed 8 tokens, reused 32; same tokens {a}")

# Balance: each request is still generating when the next one comes. Waits are on progress, not
# on a clock (run_many_live): a slow build or a loaded machine only makes this take longer.
before = {n: metric(a, "prompts_total") for n, a in top(bin_dir, topo).items() if a["role"] == "decode"}
res = run_many_live(ep, [(i, dict(ids=[(i * 31 + j) % 500 for j in range(20)], max_tokens=48, start_s=0.15 * i))
                         for i in range(8)], workers=8)
time.sleep(1.2)
after = {n: metric(a, "prompts_total") for n, a in top(bin_dir, topo).items() if a["role"] == "decode"}
spread = {n: after[n] - before.get(n, 0) for n in after}
assert len(res) == 8 and all(not isinstance(r, Exception) and r[1]["type"] == "done" for r in res.values()), res
assert min(spread.values()) >= 2, f"8 overlapping requests spread {spread}"
print(f"8 overlapping requests spread over the workers: {spread}")

# kill -9 with requests in flight: 24 requests of 64-token prompts (8 chunks each) and 32 tokens to
# generate, 0.3 s after they start. The survivor computes every prompt 8 tokens a step, the
# re-routed ones last: on a slow build that takes minutes, so a request is only given up on when
# the cluster stalls (no reply to any of them for 30 s), which a lost request does.
pid = top(bin_dir, topo)["decode-0"]["pid"]
jobs = [((i,), dict(ids=[(i * 13 + j * 7) % 500 for j in range(64)], max_tokens=32)) for i in range(24)]
res = {}
t = threading.Thread(target=lambda: res.update(run_many_live(ep, jobs, workers=24, stall_s=30)))
t.start()
time.sleep(0.3)
subprocess.run(["kill", "-9", str(pid)], check=True)
t.join()
rerouted = metric(top(bin_dir, topo)["router"], "requests_rerouted")
outcomes = {}
for k, r in res.items():
    assert not isinstance(r, Exception), (k, r)
    toks, final, _ = r
    if final["type"] == "done":
        assert len(toks) == 32, (k, len(toks))
        key = "done"
    else:
        assert final["type"] == "error" and final.get("retryable"), (k, final)
        key = "retryable error"
    outcomes[key] = outcomes.get(key, 0) + 1
assert len(res) == 24, res
print(f"kill -9 of decode-0 with requests in flight: {outcomes}, {rerouted:.0f} re-routed")
assert rerouted >= 1 or outcomes.get("retryable error", 0) >= 1, "the kill hit no request in flight"
d = wait_restarted(bin_dir, topo, "decode-0", pid)
toks, final, _ = run_one(ep, prompt, max_tokens=6)
assert final["type"] == "done" and toks == a, (final, toks, a)
print(f"restarted as pid {d['pid']}: serves again, same tokens")
PY
kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=

# One worker: arrival order under a queue of 100 prompts.
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 N_PREFILL=0 N_DECODE=1 make_topology "$WORK/one.yaml" \
  "limits:" "  prefill_chunk_tokens: 8" "  max_batch: 16" "  admission_queue: 256"
start_cluster "$WORK/one.yaml"
ep=$(grep 'client:' "$WORK/one.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/one.yaml" <<'PY'
import sys, time
from troupe_client import Client
from servelib import wait_workers
ep, bin_dir, topo = sys.argv[1:4]
wait_workers(bin_dir, topo, 1)
# 100 prompts of 64 tokens sent in order on one connection; the rank of each one's first token.
first, done = {}, 0
with Client(ep, timeout_s=120) as c:
    rids = [c.send("submit", tokens=[(i * 7 + j) % 500 for j in range(64)],
                   sampling={"max_tokens": 2, "temperature": 0, "ignore_eos": True}, stream=True) for i in range(100)]
    order = {rid: i for i, rid in enumerate(rids)}
    deadline = time.time() + 120
    while done < 100 and time.time() < deadline:
        m = c.recv(1.0)
        if m is None:
            continue
        i = order.get(m.get("id"))
        if i is None:
            continue
        if m["type"] == "token" and i not in first:
            first[i] = len(first)
        elif m["type"] in ("done", "error"):
            assert m["type"] == "done", m
            done += 1
assert done == 100 and len(first) == 100, (done, len(first))
passed = [(i, j) for i in range(100) for j in range(i + 8, 100) if first[j] < first[i]]
assert not passed, f"prompts passed by 8 or more newer ones (first-token ranks of 0..9: {[first[i] for i in range(10)]})"
print(f"100 queued prompts: started in arrival order (first-token ranks of 0..4: {[first[i] for i in range(5)]})")
PY
kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=

# One worker of the demo model with a 12-block pool (192 tokens): A (10 + 150 tokens, 10 blocks)
# has streamed 110 tokens (8 blocks) when B (a 96-token prompt, 6 blocks) comes. B must not take
# the blocks A needs to finish (it would stall part-way with all 4 free ones, and A, alone in the
# batch, would fail); it finishes after A.
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-demo-shape LOAD_FORMAT=dummy N_PREFILL=0 N_DECODE=1 \
  make_topology "$WORK/small.yaml" "limits:" "  prefill_chunk_tokens: 8" "  max_batch: 16" "  kv_blocks: 12"
sed -i "s|^  load_format: dummy|  load_format: dummy\n  dtype: bf16|" "$WORK/small.yaml"
start_cluster "$WORK/small.yaml"
ep=$(grep 'client:' "$WORK/small.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/small.yaml" <<'PY'
import sys, threading, time
from troupe_client import Client
from servelib import run_one, wait_workers
ep, bin_dir, topo = sys.argv[1:4]
wait_workers(bin_dir, topo, 1)
res, progress, last = {}, threading.Event(), [time.time()]
def a():
    toks, final = [], None
    with Client(ep, timeout_s=120) as c:
        for m in c.generate(tokens=list(range(1, 11)), max_tokens=150, temperature=0, ignore_eos=True):
            if m["type"] == "token":
                toks += m["tokens"]
                last[0] = time.time()
                if len(toks) >= 110:
                    progress.set()
            else:
                final = m
    res["a"] = (toks, final)
ta = threading.Thread(target=a)
ta.start()
# Waits on progress, not on a clock: a sanitizer build takes minutes to get there; a stall of 60 s
# (no token at all) is the failure.
while not progress.wait(1):
    assert time.time() - last[0] < 60 and ta.is_alive(), "A stopped before 110 tokens"
res["b"] = run_one(ep, [(j * 3) % 500 for j in range(96)], max_tokens=8)[:2]
ta.join()
for k, n in (("a", 150), ("b", 8)):
    toks, final = res[k]
    assert final["type"] == "done" and len(toks) == n, (k, final, len(toks))
print("a 12-block pool: the running request and the prompt that came during it both finished")
# A prompt larger than the whole pool is refused at once (it used to loop giving its blocks back).
t0 = time.time()
toks, final, _ = run_one(ep, [(j * 5) % 500 for j in range(200)], max_tokens=4, timeout_s=20)
assert final["type"] == "error" and final.get("retryable") and "KV blocks" in final["message"], final
assert time.time() - t0 < 5, time.time() - t0
toks, final, _ = run_one(ep, [1, 2, 3], max_tokens=4)
assert final["type"] == "done" and len(toks) == 4, final
print("a 200-token prompt on a 12-block pool: refused at once; a small request is served after it")
PY
kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=

# The host store: a conversation's first turn is written back; the worker is killed (-9) and
# restarts with an empty pool; the second turn's history comes back from the cache-manager
# (fetched regardless of cost: TROUPE_PREFILL_FETCH=always, the tiny fixture computes faster).
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 N_PREFILL=0 N_DECODE=1 make_topology "$WORK/host.yaml"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/host.yaml"
ep=$(grep 'client:' "$WORK/host.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/host.yaml" <<'PY'
import subprocess, sys, time
from servelib import run_one, top, metric, wait_restarted, wait_workers
ep, bin_dir, topo = sys.argv[1:4]
wait_workers(bin_dir, topo, 1)
p1 = [(i * 11 + 5) % 500 for i in range(64)]
a1, f1, _ = run_one(ep, p1, max_tokens=16)
assert f1["type"] == "done", f1
time.sleep(1.5)   # the write-back reaches the host store
pid = top(bin_dir, topo)["decode"]["pid"]
subprocess.run(["kill", "-9", str(pid)], check=True)
wait_restarted(bin_dir, topo, "decode", pid)
p2 = p1 + a1 + [(i * 13 + 7) % 500 for i in range(16)]
a2, f2, _ = run_one(ep, p2, max_tokens=4)
assert f2["type"] == "done", f2
assert f2["usage"]["cached_tokens"] >= 64, f2["usage"]
u = f2["usage"]   # the pool was empty, and there is no disk tier: all from the host store's memory
assert (u["cached_device_tokens"], u["cached_host_tokens"], u["cached_disk_tokens"]) == (0, u["cached_tokens"], 0), u
time.sleep(1.2)
d = top(bin_dir, topo)["decode"]
assert metric(d, "fetched_blocks_total") >= 4, d["metrics"]
print(f"host store: after a restart the second turn reused {f2['usage']['cached_tokens']} tokens, "
      f"{metric(d, 'fetched_blocks_total'):.0f} blocks fetched")
PY
echo "PASS colocated"
