# Faults under load: kill -9 of a decode worker under 32 concurrent streams — every affected request
# migrates to the other worker and completes with all its tokens (the router's requests_migrated),
# or ends with a retryable error within 2 s, the others complete untouched, the supervisor restarts
# the worker and no KV block leaks; then a stuck decode worker (SIGSTOP) is detected (missed
# heartbeats) and its requests are handled the same way.
# Waits are on progress, not on a clock, so a slow build (sanitizers) or a loaded machine only makes
# the test take longer; and the prefill worker computes at most 64 prompt tokens a step: the burst
# of 32 prompts in one 512-token step can outlast the runtime's step timeout there (30 s without
# the loop coming round: the supervisor would replace the prefill worker as wedged).
. "$(dirname "$0")/lib.sh"
make_demo_topology "$WORK/t.yaml" "limits:" "  max_batch: 32" "  max_model_len: 512" "  prefill_chunk_tokens: 64"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import os, random, signal, sys, threading, time
from troupe_client import Client
from servelib import top, metric, wait_idle_pools, wait_restarted
ep, bin_dir, topo = sys.argv[1:4]
random.seed(9)

streaming = set()
def stream(results, key, n_tokens):
    with Client(ep, timeout_s=300) as c:
        toks, last = 0, None
        for m in c.generate(tokens=[random.randrange(1000, 100000) for _ in range(20)], max_tokens=n_tokens,
                            temperature=0, ignore_eos=True):
            if m["type"] == "token":
                toks += 1
                streaming.add(key)
            last = m
        results[key] = (toks, last, time.time())

def storm(n, victim, sig, label):
    results = {}
    ts = [threading.Thread(target=stream, args=(results, i, 60), daemon=True) for i in range(n)]
    for t in ts: t.start()
    streaming.clear()
    # Every stream producing tokens: given up on only when no new one started for 90 s (the
    # prompts come out of the prefill worker a few a step, and a step of the demo model takes
    # seconds on a loaded machine).
    seen, since = 0, time.time()
    while len(streaming) < n and time.time() - since < 90:
        if len(streaming) > seen:
            seen, since = len(streaming), time.time()
        time.sleep(0.05)
    assert len(streaming) == n, f"only {len(streaming)} of {n} streams started"
    time.sleep(0.2)
    batches = {n: metric(a, "requests_running") for n, a in top(bin_dir, topo).items() if a["role"] == "decode"}
    router = next(n for n, a in top(bin_dir, topo).items() if a["role"] == "router")
    moved0 = metric(top(bin_dir, topo)[router], "requests_migrated")
    pid = top(bin_dir, topo)[victim]["pid"]
    t_fault = time.time()
    os.kill(pid, sig)
    for t in ts: t.join()
    failed = [r for r in results.values() if r[1]["type"] == "error"]
    done = [r for r in results.values() if r[1]["type"] == "done"]
    assert len(results) == n, "a request got no terminal reply"
    time.sleep(1.2)   # a stats interval
    moved = metric(top(bin_dir, topo)[router], "requests_migrated") - moved0
    assert failed or moved, "no request was affected"
    for toks, m, t_end in failed:
        assert m["retryable"] and m["code_name"] == "worker_lost" and victim in m["message"], m
        assert t_end - t_fault < 2.0, f"error came {t_end - t_fault:.2f} s after the fault"
    for toks, m, _ in done:
        assert toks == 60 and m["usage"]["completion_tokens"] == 60, (toks, m)
    worst = max((t_end - t_fault for _, _, t_end in failed), default=0)
    print(f"{label} {victim}: {moved:.0f} requests migrated, {len(failed)} failed retryable (last {worst:.2f} s "
          f"after), {len(done)} completed")
    print("  decode batch sizes just before:", batches)
    return pid

old = storm(32, "decode-0", signal.SIGKILL, "kill -9")
wait_restarted(bin_dir, topo, "decode-0", old, restarts=1)
wait_idle_pools(bin_dir, topo)
print("decode-0 restarted; every KV pool back to idle")
time.sleep(1.0)
storm(16, "decode-1", signal.SIGSTOP, "SIGSTOP")
wait_idle_pools(bin_dir, topo)
print("stuck worker replaced; every KV pool back to idle")
PY
grep -q "decode-1 (pid .*) missed 3 heartbeats" "$WORK/supervisor.log" || fail "the supervisor did not report the stuck worker"
echo "PASS faults"
