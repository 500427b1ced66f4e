# A decode worker killed mid-stream: its streaming requests migrate (issue 21, item 4). One prefill
# and two decode workers of the demo model (Qwen3 shape with its real tokenizer and vocabulary, dummy
# weights: slow enough on the CPU to kill a worker mid-stream, and random tokens). N greedy requests
# of MAX_TOKENS tokens:
#   1. undisturbed, without stop strings;
#   2. undisturbed, 4 of them with a stop string that never matches but begins one character into
#      an early token's text and runs on with the rest of their text: the workers hold everything
#      from there back to the end (actors/worker/token_text.h); the same tokens and text as 1;
#   3. as 2, with kill -9 of decode-0 once every request streams past the start of its stop string.
#      Every request ends exactly once, with done; its seqs run from 0 with no repeat or gap; its
#      tokens, its text and its usage equal run 2's; the router's requests_migrated counter equals
#      the migrations it logged, one per request moved; at least one moved, and at least one was
#      resumed from before its last token sent (the new worker recomputed tokens the client had,
#      and the router checked and dropped them and their text); every KV pool returns to idle.
#      Before migration those requests failed with worker_lost;
#   4. the limit: one long request whose worker is killed three times moves twice, then ends with
#      the retryable worker_lost error naming the limit, its seqs unbroken.
# COLOCATED=1: two colocated decode workers instead (no prefill actor).
. "$(dirname "$0")/lib.sh"
N_PREFILL=$([ "${COLOCATED:-0}" = 1 ] && echo 0 || echo 1) \
  make_demo_topology "$WORK/t.yaml" "limits:" "  max_batch: 32" "  max_model_len: 1024" "  prefill_chunk_tokens: 128"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$WORK/supervisor.log" <<'PY'
import os, random, re, signal, sys, threading, time
from troupe_client import Client
from servelib import top, metric, submit_collect, wait_idle_pools, wait_workers
ep, bin_dir, topo, log = sys.argv[1:5]
N, PROMPT, MAX_TOKENS = 6, 24, 48
rng = random.Random(4)
prompts = [[rng.randrange(1000, 150000) for _ in range(PROMPT)] for _ in range(N)]
stops = {}   # i -> the request's stop string
wait_workers(bin_dir, topo, 3 if "role: prefill" in open(topo).read() else 2)

def run(need=None, kill=None):
    """Every prompt at once; returns {i: replies}. kill(progress): called once request i has
    streamed need[i] tokens, for every i."""
    out, progress, lock = {}, {}, threading.Lock()
    def one(i):
        sampling = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
        if i in stops:
            sampling["stop"] = [stops[i]]
        def seen(m):
            with lock: progress[i] = progress.get(i, 0) + len(m["tokens"])
        out[i] = submit_collect(ep, prompts[i], sampling, on_token=seen)[1]
    ts = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in ts: t.start()
    if kill:
        deadline = time.time() + 60
        while time.time() < deadline and any(progress.get(i, 0) < need[i] for i in range(N)):
            time.sleep(0.01)
        assert all(need[i] <= progress.get(i, 0) < MAX_TOKENS for i in range(N)), f"streams too fast or not started: {progress}"
        kill(dict(progress))
    for t in ts: t.join()
    assert len(out) == N, "a request got no terminal reply"
    return out

def stream_of(i, replies):
    """The request's tokens, its text and its token messages' texts, checking that it ended
    exactly once with done and that its seqs run from 0 with no repeat or gap."""
    toks, pieces = [], []
    terminal = [m for m in replies if m["type"] in ("done", "error")]
    assert len(terminal) == 1 and replies[-1] is terminal[0], (i, [m["type"] for m in replies])
    assert terminal[0]["type"] == "done", (i, terminal[0])
    for m in replies[:-1]:
        assert m["type"] == "token", (i, m)
        assert m["seq"] == len(toks), f"request {i}: seq {m['seq']} where {len(toks)} was due"
        toks += m["tokens"]
        pieces.append(m.get("text") or "")
    u = terminal[0]["usage"]
    assert u["prompt_tokens"] == PROMPT and u["completion_tokens"] == MAX_TOKENS == len(toks), (i, u, len(toks))
    return toks, "".join(pieces), pieces

t0 = time.time()
plain = {i: stream_of(i, r) for i, r in run().items()}
print(f"undisturbed: {N} requests of {MAX_TOKENS} tokens in {time.time() - t0:.1f} s, "
      f"{sum(len(t.encode()) for _, t, _ in plain.values())} text bytes")
need = {i: 3 for i in range(N)}
for i in range(N):
    if i % 3 == 0:
        continue
    _, text, pieces = plain[i]
    # One message per token: j, an early token whose text has two characters or more; p, one
    # character into it (its message sends that character, and holds back the rest).
    j = next((j for j in range(2, 12) if len(pieces[j]) >= 2), 2)
    p = len("".join(pieces[:j])) + (len(pieces[j]) >= 2)
    tail = text[p:]
    while len(tail.encode()) > 240:
        tail = tail[:-1]
    stops[i] = tail + "\u2603\u2603"   # not in the text: never matches
    need[i] = j + 1
t0 = time.time()
want = {i: stream_of(i, r) for i, r in run().items()}
for i in range(N):
    assert want[i][:2] == plain[i][:2], f"request {i}: a stop string that never matches changed the output"
held = sum(len(want[i][2][-1]) for i in stops)
print(f"undisturbed with stop strings on {sorted(stops)}: the same tokens and text; {held} characters held "
      f"back to the last token ({time.time() - t0:.1f} s)")

def counter(actor, name):
    try:
        return metric(actor, name)
    except KeyError:   # a router without migration: what it does to the streams is what fails
        return 0
router = next(n for n, a in top(bin_dir, topo).items() if a["role"] == "router")
before = counter(top(bin_dir, topo)[router], "requests_migrated")
lines_before = sum(" migrated as " in l for l in open(log, errors="replace"))
victim = top(bin_dir, topo)["decode-0"]["pid"]
at_kill = {}
def kill(progress):
    at_kill.update(progress)
    os.kill(victim, signal.SIGKILL)
t0 = time.time()
got = run(need, kill)
for i in range(N):
    toks, text, _ = stream_of(i, got[i])
    assert toks == want[i][0], f"request {i}: tokens differ from the undisturbed run\n{toks}\n{want[i][0]}"
    assert text == want[i][1], f"request {i}: text differs from the undisturbed run\n{text!r}\n{want[i][1]!r}"
time.sleep(1.2)   # a stats interval
r = top(bin_dir, topo)[router]
moved = metric(r, "requests_migrated") - before
lines = [l for l in open(log, errors="replace") if " migrated as " in l][lines_before:]
ours = [re.search(r"request (\d+) \(client \d+\) migrated", l).group(1) for l in lines]   # the router's ids
cuts = [tuple(map(int, re.search(r"(\d+) tokens sent, resumed after (\d+), (\d+) text bytes", l).groups()))
        for l in lines]
print(f"kill -9 of decode-0 with every request streaming (tokens sent by then: {[at_kill[i] for i in range(N)]}): "
      f"{N} ended once with done, all equal to the undisturbed run (tokens and text), {moved:.0f} migrated, "
      f"{sum(c < s for s, c, _ in cuts)} of them resumed before their last token sent "
      f"({sum(k > 0 for _, _, k in cuts)} with text to skip), in {time.time() - t0:.1f} s")
for l in lines:
    print("  " + l.split("INFO ")[-1].strip())
assert moved == len(lines) == len(set(ours)), (moved, lines)
assert moved >= 1, "no request migrated: the kill hit no stream"
assert any(c < s for s, c, _ in cuts), f"no migrated request had text held back: the resume path was not tested {cuts}"
assert metric(r, "migrations_diverged") == 0 and metric(r, "migrations_failed") == 0
wait_idle_pools(bin_dir, topo, timeout_s=20)
print("every KV pool back to idle")

# The limit: one long request whose worker is killed three times (each time once the other one is
# back): it moves twice, then ends with the retryable worker_lost error naming the limit; its seqs
# never repeat or skip on the way.
from servelib import wait_restarted
dead, stream, ended = set(), [], threading.Event()
def long_one():
    with Client(ep, timeout_s=120) as c:
        for m in c.generate(tokens=prompts[0], max_tokens=900, temperature=0, ignore_eos=True):
            stream.append(m)
    ended.set()
th = threading.Thread(target=long_one)
th.start()
def serving():
    """The decode worker streaming the request: the last migration's target, else the one that
    says it runs a request."""
    lines = [l for l in open(log, errors="replace") if " migrated as " in l][lines_before + int(moved):]
    if lines:
        return re.search(r" / (\S+) after losing", lines[-1]).group(1)
    deadline = time.time() + 15
    while time.time() < deadline:
        for n, a in top(bin_dir, topo).items():
            if a["role"] == "decode" and a["pid"] not in dead and metric(a, "requests_running") >= 1:
                return n
        time.sleep(0.1)
    raise AssertionError("no decode worker runs the request")
kills = []
for k in range(3):
    n_before = len(stream)
    while len(stream) < n_before + 3 and not ended.is_set():
        time.sleep(0.01)
    assert not ended.is_set(), f"the request ended before kill {k + 1}: {stream[-1]}"
    name = serving()
    other = "decode-1" if name == "decode-0" else "decode-0"
    pid = top(bin_dir, topo)[name]["pid"]
    dead.add(pid)
    os.kill(pid, signal.SIGKILL)
    kills.append((name, len(stream)))
    if k < 2:   # wait until the worker killed is back, so the next kill has somewhere to move to
        wait_restarted(bin_dir, topo, name, pid)
        time.sleep(0.3)
th.join()
seqs = [m["seq"] for m in stream if m["type"] == "token"]
assert seqs == list(range(len(seqs))), f"seqs repeat or skip: {seqs}"
last = stream[-1]
assert sum(m["type"] != "token" for m in stream) == 1, [m for m in stream if m["type"] != "token"]
assert last["type"] == "error" and last["code_name"] == "worker_lost" and last["retryable"] and "limit" in last["message"], last
total = counter(top(bin_dir, topo)[router], "requests_migrated") - before
print(f"migration limit: kills of {kills} (worker, messages by then): moved twice, then {last['code_name']} "
      f"({last['message']}); {len(seqs)} tokens, seqs 0..{len(seqs) - 1} with no repeat or gap")
time.sleep(1.2)
assert counter(top(bin_dir, topo)[router], "requests_migrated") - before == moved + 2
PY
echo "PASS decode_migrate"
