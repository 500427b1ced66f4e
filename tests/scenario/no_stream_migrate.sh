# A request that does not stream (submit.stream false) whose decode worker is killed mid-request
# migrates like a streaming one, and its one reply, the done, carries the whole completion: the
# tokens the router collected before the kill and the new worker's after it, none twice (the
# new worker's recomputed tokens are checked against what was collected and dropped), equal to an
# undisturbed run's. One prefill and two decode workers of the demo model (random tokens, dummy
# weights: slow enough on the CPU to kill a worker mid-request). Streaming requests run beside
# the ones that do not stream, so the kill can be timed: once every stream is past its third
# token and before its last.
. "$(dirname "$0")/lib.sh"
make_demo_topology "$WORK/t.yaml" "limits:" "  max_batch: 32" "  max_model_len: 1024" "  prefill_chunk_tokens: 128"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$WORK/supervisor.log" <<'PY'
import os, random, re, signal, sys, threading, time
from servelib import top, metric, submit_collect, wait_idle_pools, wait_workers
ep, bin_dir, topo, log = sys.argv[1:5]
N_STREAM, N_WHOLE, PROMPT, MAX_TOKENS = 4, 8, 24, 48
N = N_STREAM + N_WHOLE
rng = random.Random(11)
prompts = [[rng.randrange(1000, 150000) for _ in range(PROMPT)] for _ in range(N)]
wait_workers(bin_dir, topo, 3)

def run(kill=None):
    """Every prompt at once, the first N_STREAM streaming; {i: (client id, replies)}. kill(): called
    once every stream has 3 tokens or more."""
    out, progress, lock = {}, {}, threading.Lock()
    def one(i):
        def seen(m):
            with lock: progress[i] = progress.get(i, 0) + len(m["tokens"])
        out[i] = submit_collect(ep, prompts[i], {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
                                stream=i < N_STREAM, on_token=seen)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in ts: t.start()
    if kill:
        deadline = time.time() + 60
        while time.time() < deadline and any(progress.get(i, 0) < 3 for i in range(N_STREAM)):
            time.sleep(0.01)
        assert all(3 <= progress.get(i, 0) < MAX_TOKENS for i in range(N_STREAM)), f"streams too fast or not started: {progress}"
        kill()
    for t in ts: t.join()
    assert len(out) == N, "a request got no terminal reply"
    return out

def completion(i, replies):
    """The request's tokens and text, checking that it ended exactly once with done (a request
    that does not stream: that done alone, carrying them)."""
    terminal = [m for m in replies if m["type"] in ("done", "error")]
    assert len(terminal) == 1 and replies[-1] is terminal[0], (i, [m["type"] for m in replies])
    d = terminal[0]
    assert d["type"] == "done", (i, d)
    if i < N_STREAM:
        toks = [t for m in replies[:-1] for t in m["tokens"]]
        text = "".join(m.get("text") or "" for m in replies[:-1])
    else:
        assert len(replies) == 1, f"request {i} does not stream: {[m['type'] for m in replies]}"
        toks, text = d.get("tokens"), d.get("text")
    assert d["usage"]["completion_tokens"] == MAX_TOKENS == len(toks), (i, d["usage"], len(toks))
    return toks, text

t0 = time.time()
want = {i: completion(i, r) for i, (_, r) in run().items()}
print(f"undisturbed: {N_STREAM} streaming and {N_WHOLE} whole requests of {MAX_TOKENS} tokens in {time.time() - t0:.1f} s")

router = next(n for n, a in top(bin_dir, topo).items() if a["role"] == "router")
before = metric(top(bin_dir, topo)[router], "requests_migrated")
lines_before = sum(" migrated as " in l for l in open(log, errors="replace"))
victim = top(bin_dir, topo)["decode-0"]["pid"]
got = run(lambda: os.kill(victim, signal.SIGKILL))
for i in range(N):
    toks, text = completion(i, got[i][1])
    assert toks == want[i][0], f"request {i}: tokens differ from the undisturbed run\n{toks}\n{want[i][0]}"
    assert text == want[i][1], f"request {i}: text differs from the undisturbed run\n{text!r}\n{want[i][1]!r}"
time.sleep(1.2)   # a stats interval
r = top(bin_dir, topo)[router]
moved = metric(r, "requests_migrated") - before
lines = [l for l in open(log, errors="replace") if " migrated as " in l][lines_before:]
clients = {int(re.search(r"request \d+ \(client (\d+)\) migrated", l).group(1)) for l in lines}
whole = {got[i][0] for i in range(N_STREAM, N)}
print(f"kill -9 of decode-0 mid-request: {N} ended once with done, all equal to the undisturbed run; "
      f"{moved:.0f} migrated, {len(clients & whole)} of them not streaming")
for l in lines:
    print("  " + l.split("INFO ")[-1].strip())
assert moved == len(lines) >= 1, (moved, lines)
assert clients & whole, "no request that does not stream was on the killed worker: nothing was tested"
assert metric(r, "migrations_diverged") == 0 and metric(r, "migrations_failed") == 0
wait_idle_pools(bin_dir, topo, timeout_s=20)
print("every KV pool back to idle")
PY
[ $? -eq 0 ] || fail "no-stream migration"
echo "PASS no_stream_migrate"
