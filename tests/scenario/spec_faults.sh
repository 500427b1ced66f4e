# Speculation under faults: with the n-gram proposer on (TROUPE_SPECULATION=ngram:4) and 16
# concurrent streams whose prompts repeat (so rows carry drafts), kill -9 of a decode worker: every
# request ends with exactly one terminal reply (the affected ones a retryable worker_lost error, the
# others done with all their tokens), the worker is restarted, and every KV pool goes back to idle
# (no block leaked by drafts rolled back or requests ended inside a verify step).
. "$(dirname "$0")/lib.sh"
export TROUPE_SPECULATION=ngram:4
# Prompt chunks of 64 tokens keep each prefill step short: 16 prompts in one 512-token step can
# outlast the demo topology's heartbeat window on a loaded 2-core machine (the supervisor then
# replaces the prefill worker as wedged before the test reaches its kill).
make_demo_topology "$WORK/t.yaml" "limits:" "  max_batch: 32" "  max_model_len: 512" "  prefill_chunk_tokens: 64"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import os, random, signal, sys, threading, time
from troupe_client import Client
from servelib import top, metric, wait_idle_pools, wait_restarted
ep, bin_dir, topo = sys.argv[1:4]
random.seed(16)
streaming, results = set(), {}
def stream(key, n_tokens):
    pattern = [random.randrange(1000, 100000) for _ in range(3)]
    with Client(ep, timeout_s=120) as c:
        toks, last, n_final = 0, None, 0
        for m in c.generate(tokens=pattern * 7, max_tokens=n_tokens, temperature=0, ignore_eos=True):
            if m["type"] == "token":
                toks += len(m["tokens"])
                streaming.add(key)
            else:
                n_final += 1
            last = m
        results[key] = (toks, last, n_final)
ts = [threading.Thread(target=stream, args=(i, 60)) for i in range(16)]
for t in ts: t.start()
deadline = time.time() + 60
while len(streaming) < 16 and time.time() < deadline:
    time.sleep(0.05)
assert len(streaming) == 16, f"only {len(streaming)} of 16 streams started"
pid = top(bin_dir, topo)["decode-0"]["pid"]
os.kill(pid, signal.SIGKILL)
for t in ts: t.join()
assert len(results) == 16, "a request got no terminal reply"
failed = [r for r in results.values() if r[1]["type"] == "error"]
done = [r for r in results.values() if r[1]["type"] == "done"]
assert len(failed) + len(done) == 16 and all(r[2] == 1 for r in results.values()), results
for toks, m, _ in failed:
    assert m["retryable"] and m["code_name"] == "worker_lost", m
for toks, m, _ in done:
    assert toks == 60 and m["usage"]["completion_tokens"] == 60, (toks, m)
wait_restarted(bin_dir, topo, "decode-0", pid, restarts=1, timeout_s=10)
wait_idle_pools(bin_dir, topo)
steps = sum(metric(a, "spec_verify_steps_total") or 0 for a in top(bin_dir, topo).values() if a["role"] == "decode")
print(f"kill -9 decode-0 while speculating: {len(failed)} failed retryable, {len(done)} completed; "
      f"verify steps on the surviving worker: {steps}")
PY
echo "PASS spec_faults"
