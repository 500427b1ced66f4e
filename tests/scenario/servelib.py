"""Helpers for the serving scenario tests: run requests through a live cluster, read top.

The Python client (tools/troupe_client.py) needs pyzmq, which a machine may lack (the GPU node:
no pyzmq for its Python, no network for pip). It is imported only by the helpers that use it
(run_one, run_many, run_many_live); top, metric, the waits and the c_* helpers (the C client,
troupe-client, as a subprocess) need only the standard library."""
import json
import subprocess
import tempfile
import threading
import time


def _client():
    from troupe_client import Client  # PYTHONPATH has tools/ (tests/scenario/lib.sh sets it)
    return Client


def c_generate(bin_dir, ep, ids, max_tokens=8, temperature=0, ignore_eos=True, timeout_s=120):
    """Client.generate(tokens=ids, ...) through the C client: one troupe-client --json process,
    its replies yielded as dicts as they arrive (one JSON object a line). An error's code name
    (the JSON's "code") is also under "code_name", the Python client's key. A troupe-client that
    ends without a terminal reply (its timeout, a usage error) raises RuntimeError with its stderr."""
    cmd = [f"{bin_dir}/troupe-client", "--endpoint", ep, "--timeout-ms", str(int(timeout_s * 1000)), "--json",
           "submit", "--ids", ",".join(map(str, ids)), "--max-tokens", str(max_tokens),
           "--temperature", repr(float(temperature))] + (["--ignore-eos"] if ignore_eos else [])
    with tempfile.TemporaryFile(mode="w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        terminal = False
        try:
            for line in p.stdout:
                m = json.loads(line)
                if m["type"] == "error":
                    m.setdefault("code_name", m.get("code"))
                terminal = terminal or m["type"] in ("done", "error")
                yield m
        finally:
            if p.poll() is None and not terminal:
                p.kill()
            rc = p.wait()
            p.stdout.close()
        if not terminal:
            err.seek(0)
            raise RuntimeError(f"troupe-client exit {rc}, no terminal reply: {err.read().strip()}")


def c_run_one(bin_dir, ep, ids, max_tokens=8, timeout_s=120):
    """run_one through the C client: (tokens, terminal message, [all replies])."""
    toks, replies = [], []
    for m in c_generate(bin_dir, ep, ids, max_tokens=max_tokens, timeout_s=timeout_s):
        replies.append(m)
        if m["type"] == "token":
            toks += m["tokens"]
    return toks, replies[-1], replies


def run_one(ep, ids, max_tokens=8, timeout_s=120, **kw):
    """(tokens, terminal message, [all replies]) for one request."""
    with _client()(ep, timeout_s=timeout_s) as c:
        toks, replies = [], []
        for m in c.generate(tokens=ids, max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw):
            replies.append(m)
            if m["type"] == "token":
                toks += m["tokens"]
        return toks, replies[-1], replies


def submit_collect(ep, tokens, sampling, stream=True, on_token=None, timeout_s=120):
    """One submit of tokens with sampling, on a client of its own: (its id, every reply to it up to
    and including its terminal one, and then any that came within 0.3 s after it: a second terminal
    reply, or anything after one, shows there). on_token(m) is called for each token message as it
    arrives (the scenarios that kill a worker mid-stream time the kill by it)."""
    with _client()(ep, timeout_s=timeout_s) as c:
        rid = c.send("submit", tokens=tokens, stream=stream, sampling=sampling)
        replies, deadline = [], time.time() + timeout_s
        while time.time() < deadline:
            m = c.recv(0.5)
            if m is None or m.get("id") != rid:
                continue
            replies.append(m)
            if m["type"] == "token" and on_token:
                on_token(m)
            if m["type"] in ("done", "error"):
                break
        while (m := c.recv(0.3)) is not None:
            if m.get("id") == rid:
                replies.append(m)
        return rid, replies


def _drain(it, lock, results, run):
    """One worker thread of a job pool: takes (key, kwargs) jobs from it until none are left and
    stores run(**kwargs), or the exception it raised, under key."""
    while True:
        with lock:
            job = next(it, None)
        if job is None:
            return
        key, kw = job
        try:
            r = run(**kw)
        except Exception as e:  # noqa: BLE001 — the test inspects it
            r = e
        with lock:
            results[key] = r


def run_many(ep, jobs, workers=32):
    """jobs: list of (key, kwargs for run_one). Returns {key: result or Exception}."""
    results, lock, it = {}, threading.Lock(), iter(jobs)

    def worker():
        _drain(it, lock, results, lambda **kw: run_one(ep, **kw))

    ts = [threading.Thread(target=worker) for _ in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results


def run_many_live(ep, jobs, workers=32, stall_s=30, limit_s=900):
    """run_many for a cluster that may be slow (sanitizers, a loaded machine) but must not lose a
    request: a job is only given up on when none of the jobs has had a reply for stall_s (a lost
    request ends up alone and silent once the others are over), or after limit_s in all. kwargs
    may carry start_s: the job is sent that long after the first. Returns {key: result or
    TimeoutError}; results as run_one's."""
    results, lock, it = {}, threading.Lock(), iter(jobs)
    t0 = time.monotonic()
    last = [t0]
    stop = threading.Event()

    def one(c, ids, max_tokens=8, start_s=0, timeout_s=None, **kw):
        while not stop.is_set() and time.monotonic() < t0 + start_s:
            time.sleep(0.01)
        sampling = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        rid = c.send("submit", tokens=ids, sampling=sampling, stream=True, **kw)
        toks, replies = [], []
        while not stop.is_set():
            m = c.recv(0.2)
            if m is None or m.get("id") != rid:
                continue
            with lock:
                last[0] = time.monotonic()
            replies.append(m)
            if m["type"] == "token":
                toks += m["tokens"]
            elif m["type"] in ("done", "error"):
                return toks, m, replies
        raise TimeoutError(f"no terminal reply for request {rid}: no reply to any of {len(jobs)} requests for "
                           f"{stall_s} s (or {limit_s} s in all)")

    def worker():
        with _client()(ep, timeout_s=limit_s) as c:
            _drain(it, lock, results, lambda **kw: one(c, **kw))

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in ts:
        t.start()
    while any(t.is_alive() for t in ts):
        now = time.monotonic()
        with lock:
            stalled = now - last[0] > stall_s
        if stalled or now - t0 > limit_s:
            stop.set()
        for t in ts:
            t.join(0.1)
    return results


def top(bin_dir, topo):
    out = subprocess.run([f"{bin_dir}/troupe-top", "--topology", topo, "--json"], check=True,
                         capture_output=True, text=True).stdout
    d = json.loads(out)
    actors = d.get("actors", [])
    return {a["name"]: a for a in actors}


def metric(actor, name):
    for m in actor.get("metrics", []):
        if m["name"] == name:
            return m["value"]
    raise KeyError(name)


def wait_idle_pools(bin_dir, topo, roles=("prefill", "decode"), timeout_s=10):
    """Waits until every worker's KV blocks in use are back to 0 (idle); returns the last view.
    Stats arrive once a second: the first look waits one interval, so a frame from before the
    work just done can never pass for idle."""
    time.sleep(1.1)
    deadline = time.time() + timeout_s
    while True:
        t = top(bin_dir, topo)
        busy = {n: metric(a, "kv_blocks_used") for n, a in t.items()
                if a["role"] in roles and metric(a, "kv_blocks_used") != 0}
        if not busy:
            return t
        if time.time() > deadline:
            raise AssertionError(f"KV blocks still in use: {busy}")
        time.sleep(0.3)


def wait_workers(bin_dir, topo, n, timeout_s=10):
    """Waits until n prefill/decode workers have reported to the monitor."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        t = top(bin_dir, topo)
        if sum(a["role"] in ("prefill", "decode") for a in t.values()) >= n:
            return t
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} workers reported")


def wait_restarted(bin_dir, topo, name, old_pid, restarts=None, timeout_s=None):
    """Waits until actor `name` runs again as a new process that is ready (and, when given, has
    that many restarts); returns its top entry. By default as long as the supervisor itself gives a
    start (the topology's supervision.ready_timeout_s) and 5 s more: a model loads slowly under
    sanitizers or on a loaded machine."""
    if timeout_s is None:
        timeout_s = 5 + next((int(l.split(":")[1]) for l in open(topo) if l.strip().startswith("ready_timeout_s:")),
                             30)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        a = top(bin_dir, topo).get(name)
        if a and a["pid"] != old_pid and a.get("state") == "ready" and \
                (restarts is None or a["restarts"] == restarts):
            return a
        time.sleep(0.2)
    raise AssertionError(f"{name} was not restarted within {timeout_s} s")
