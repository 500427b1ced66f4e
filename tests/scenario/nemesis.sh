# A nemesis against the workers under continuous load (issue #21's failure model, workers only):
# for NEMESIS_S seconds (default 30) 8 clients submit requests back to back while the nemesis,
# every 0.5-2 s, kill -9s a random prefill or decode worker, or stops it (SIGSTOP) for 0.2-1.2 s
# and lets it go on (SIGCONT; past 3 missed heartbeats the supervisor kills it as wedged). Checked:
# every request ends in exactly one terminal reply (done with all its tokens, or an error), no
# stream repeats or skips a seq, nothing is lost (a request with no terminal reply in 30 s), and
# once the nemesis stops every worker is back and every KV pool returns to idle; then a request is
# served again. Prints submitted / done / failed (by code) / lost and the faults dealt.
. "$(dirname "$0")/lib.sh"
N_DECODE=2 HEARTBEAT_MS=200 MAX_RESTARTS=1000 PERIOD_S=10 make_topology "$WORK/t.yaml" "limits:
  max_model_len: 256"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "${NEMESIS_S:-30}" <<'PY'
import collections, os, random, signal, sys, threading, time
from troupe_client import Client
from servelib import top, wait_idle_pools, wait_workers
ep, bin_dir, topo, duration = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rng = random.Random(21)
stop = threading.Event()
lock = threading.Lock()
stats = collections.Counter()
problems = []

def client(k):
    r = random.Random(k)
    with Client(ep, timeout_s=30) as c:
        while not stop.is_set():
            n_prompt, n_gen = r.randrange(4, 40), r.randrange(2, 24)
            rid = c.send("submit", tokens=[r.randrange(1, 200) for _ in range(n_prompt)], stream=True,
                         sampling={"max_tokens": n_gen, "ignore_eos": True, "temperature": 0})
            seq, terminal, deadline = 0, None, time.time() + 30
            while terminal is None and time.time() < deadline:
                m = c.recv(max(0.01, deadline - time.time()))
                if m is None:
                    break
                if m.get("id") != rid:
                    with lock: problems.append(f"reply for another id: {m}")
                    continue
                if m["type"] == "token":
                    if m.get("seq", seq) != seq:
                        with lock: problems.append(f"request {rid}: seq {m.get('seq')} where {seq} was due")
                    seq += len(m["tokens"])
                else:
                    terminal = m
            with lock:
                stats["submitted"] += 1
                if terminal is None:
                    stats["lost"] += 1
                    problems.append(f"request {rid}: no terminal reply in 30 s ({seq} tokens)")
                elif terminal["type"] == "done":
                    stats["done"] += 1
                    if seq != n_gen or terminal["usage"]["completion_tokens"] != n_gen:
                        problems.append(f"request {rid}: done with {seq} tokens streamed, {n_gen} asked")
                else:
                    stats["failed " + terminal.get("code_name", "?")] += 1
            if terminal is not None and terminal["type"] == "error":
                time.sleep(0.1)   # a client backs off after an error (the workers may be restarting)
            # A second terminal reply for it would show up as the next request's "another id".

def pid_of(name):
    a = top(bin_dir, topo).get(name)
    if not a or a.get("state") != "ready":
        return None
    try:
        cmd = open(f"/proc/{a['pid']}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return None
    return a["pid"] if topo.encode() in cmd and name.encode() in b" ".join(cmd) else None

ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
for t in ts: t.start()
faults = collections.Counter()
t_end = time.time() + duration
while time.time() < t_end:
    time.sleep(rng.uniform(0.5, 2.0))
    name = rng.choice(["prefill", "decode-0", "decode-1"])
    pid = pid_of(name)
    if not pid:
        continue
    try:
        if rng.random() < 0.6:
            os.kill(pid, signal.SIGKILL)
            faults["kill -9"] += 1
        else:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(rng.uniform(0.2, 1.2))
            os.kill(pid, signal.SIGCONT)
            faults["stop/cont"] += 1
    except ProcessLookupError:
        pass
stop.set()
for t in ts: t.join()
wait_workers(bin_dir, topo, 3, timeout_s=30)
wait_idle_pools(bin_dir, topo, timeout_s=15)
with Client(ep, timeout_s=60) as c:
    last = list(c.generate(tokens=[1, 2, 3, 4], max_tokens=4))[-1]
print(f"nemesis {duration:.0f} s, faults {dict(faults)}: {dict(stats)}; pools idle after; served again: {last['type']}")
for p in problems[:10]:
    print("PROBLEM:", p)
assert not problems, f"{len(problems)} problems"
assert stats["lost"] == 0 and stats["submitted"] == sum(v for k, v in stats.items() if k != "submitted" and k != "lost")
assert sum(faults.values()) >= duration / 4, faults
assert last["type"] == "done", last
PY
echo "PASS nemesis"
