# Colocated: a topology without prefill actors. Each decode worker computes its requests' prompts
# itself, in chunks (prefill_chunk_tokens: 8 here) batched with the decode steps of the others.
#   1. exactness: serve_exact.sh with N_PREFILL=0 (every fixture equals troupe-generate and
#      transformers, 32 random requests beside them, two decode workers);
#   2. cancels and load: cancel_load.sh with N_PREFILL=0 (one terminal reply per request, every
#      pool back to idle);
#   3. prefix reuse over two decode workers: the same 40-token prompt twice; the router sends the
#      second where the first's blocks are, which reuses them (usage.cached_tokens 32);
#   4. kill -9 of one decode worker with requests in flight (prompts being computed, or decoding):
#      every request ends (done, re-routed to the other worker before its first token, or a
#      retryable error), the worker is restarted and serves again.
. "$(dirname "$0")/lib.sh"
N_PREFILL=0 bash "$ROOT/tests/scenario/serve_exact.sh" | grep -E "prompts equal|PASS" || fail "serve_exact, colocated"
N_PREFILL=0 bash "$ROOT/tests/scenario/cancel_load.sh" | grep -E "terminal|idle|PASS" || fail "cancel_load, colocated"

MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 N_PREFILL=0 N_DECODE=2 make_topology "$WORK/t.yaml" \
  "limits:" "  prefill_chunk_tokens: 8" "  max_batch: 16"
start_cluster "$WORK/t.yaml"
grep -q "decode workers compute\|computes its prompt too (colocated)" "$WORK/supervisor.log" || fail "the router did not say colocated"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import subprocess, sys, threading, time
from servelib import run_one, run_many, top, metric, wait_workers
ep, bin_dir, topo = sys.argv[1:4]
wait_workers(bin_dir, topo, 2)
prompt = [(i * 37 + 11) % 500 for i in range(40)]
a, fa, _ = run_one(ep, prompt, max_tokens=6)
b, fb, _ = run_one(ep, prompt, max_tokens=6)
assert fa["type"] == "done" and fb["type"] == "done", (fa, fb)
assert a == b, (a, b)
assert fa["usage"]["cached_tokens"] == 0 and fb["usage"]["cached_tokens"] == 32, (fa["usage"], fb["usage"])
time.sleep(1.2)   # a stats interval
ds = [a for a in top(bin_dir, topo).values() if a["role"] == "decode"]
assert sum(metric(d, "prompts_total") for d in ds) == 2, [d["metrics"] for d in ds]
assert sum(metric(d, "cached_tokens_total") for d in ds) == 32
assert sum(metric(d, "computed_tokens_total") for d in ds) == 40 + 8
print(f"prefix reuse: the second run of a 40-token prompt computed 8 tokens, reused 32; same tokens {a}")

# kill -9 with requests in flight: 48 requests (3 batches of 16) of 200-token prompts (25 chunks
# each) and 300 tokens to generate, 0.15 s after they start.
pid = top(bin_dir, topo)["decode-0"]["pid"]
jobs = [((i,), dict(ids=[(i * 13 + j * 7) % 500 for j in range(200)], max_tokens=300, timeout_s=60)) for i in range(48)]
res = {}
t = threading.Thread(target=lambda: res.update(run_many(ep, jobs, workers=48)))
t.start()
time.sleep(0.15)
subprocess.run(["kill", "-9", str(pid)], check=True)
t.join()
rerouted = metric(top(bin_dir, topo)["router"], "requests_rerouted")
outcomes = {}
for k, r in res.items():
    assert not isinstance(r, Exception), (k, r)
    toks, final, _ = r
    if final["type"] == "done":
        assert len(toks) == 300, (k, len(toks))
        key = "done"
    else:
        assert final["type"] == "error" and final.get("retryable"), (k, final)
        key = "retryable error"
    outcomes[key] = outcomes.get(key, 0) + 1
assert len(res) == 48, res
print(f"kill -9 of decode-0 with requests in flight: {outcomes}, {rerouted:.0f} re-routed")
assert rerouted >= 1 or outcomes.get("retryable error", 0) >= 1, "the kill hit no request in flight"
deadline = time.time() + 15
while time.time() < deadline:
    d = top(bin_dir, topo).get("decode-0")
    if d and d["pid"] != pid and d.get("state") in ("ready", 1):
        break
    time.sleep(0.2)
else:
    raise AssertionError("the decode worker was not restarted")
toks, final, _ = run_one(ep, prompt, max_tokens=6)
assert final["type"] == "done" and toks == a, (final, toks, a)
print(f"restarted as pid {d['pid']}: serves again, same tokens")
PY
echo "PASS colocated"
