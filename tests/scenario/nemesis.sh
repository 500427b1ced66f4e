# A nemesis under continuous load (issue #21's failure model): a topology with two routers
# (NEMESIS_ROUTERS, default 2; the clients fail over between them) and two decode workers. For
# NEMESIS_S seconds (default 120, as `make test` runs it; `make nemesis-long` runs 1800) 8 clients submit requests back to
# back while the nemesis, every 0.5-2 s, kill -9s a random router, prefill or decode worker, or
# stops it (SIGSTOP) for 0.2-1.2 s and lets it go on (SIGCONT; past 3 missed heartbeats the
# supervisor kills it as wedged). Checked: every request ends in exactly one terminal reply (done
# with all its tokens, or an error), no stream repeats or skips a seq, nothing is lost (a request
# with no terminal reply in 30 s), and once the nemesis stops every worker and router is back and
# every KV pool returns to idle; then a request is served again. The resident memory of the actors
# the nemesis never touches (supervisor, monitor, cache-manager, expert-balancer, draft-scheduler)
# is sampled every tenth of the run and at the end, and printed per actor; from 300 s on it must stay
# flat: at the end at most 20% or 16 MiB (whichever is more) over the sample after the first tenth
# (start-up's allocations done), each actor still the process it was then (one restarted would hide
# its growth). Prints submitted / done / failed (by code) / lost / retried (sent again to the other
# router) and the faults dealt.
. "$(dirname "$0")/lib.sh"
N_ROUTERS=${NEMESIS_ROUTERS:-2} N_DECODE=2 HEARTBEAT_MS=200 MAX_RESTARTS=1000 PERIOD_S=10 \
  make_topology "$WORK/t.yaml" "limits:
  max_model_len: 256"
start_cluster "$WORK/t.yaml"
ep=$(client_endpoints "$WORK/t.yaml")
$PY - "$ep" "$BIN" "$WORK/t.yaml" "${NEMESIS_S:-120}" "$SUP_PID" <<'PY'
import collections, os, random, signal, sys, threading, time
from troupe_client import Client
from servelib import top, wait_idle_pools, wait_workers
ep, bin_dir, topo, duration, sup_pid = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
routers = [f"router-{i}" for i in range(len(ep.split(",")))] if "," in ep else ["router"]
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
        with lock:
            stats["retried"] += c.requests_retried

def view():
    """The monitor's view, or {} while it cannot answer (the nemesis must not end on that)."""
    try:
        return top(bin_dir, topo)
    except Exception as e:
        print(f"troupe-top failed ({e}); skipping this round", flush=True)
        return {}

def pid_of(name):
    a = view().get(name)
    if not a or a.get("state") != "ready":
        return None
    try:
        cmd = open(f"/proc/{a['pid']}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return None
    return a["pid"] if topo.encode() in cmd and name.encode() in b" ".join(cmd) else None

UNTOUCHED = ["monitor", "cache-manager", "expert-balancer", "draft-scheduler"]

def rss_kib():
    """(pid, resident KiB) of the supervisor and of each actor the nemesis never touches."""
    v, out = view(), {}
    for name, pid in [("supervisor", sup_pid)] + [(n, v[n]["pid"]) for n in UNTOUCHED if n in v]:
        try:
            out[name] = (pid, next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:")))
        except (OSError, StopIteration):
            pass
    return out

ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
for t in ts: t.start()
faults = collections.Counter()
t_start = time.time()
t_end = t_start + duration
samples = []   # (seconds into the run, rss_kib())
try:
    while time.time() < t_end:
        time.sleep(rng.uniform(0.5, 2.0))
        if time.time() - t_start >= duration / 10 * (len(samples) + 1):
            samples.append((time.time() - t_start, rss_kib()))
        name = rng.choice(["prefill", "decode-0", "decode-1"] + routers)
        pid = pid_of(name)
        if not pid:
            continue
        try:
            if rng.random() < 0.6:
                os.kill(pid, signal.SIGKILL)
                faults["kill -9 router" if name in routers else "kill -9 worker"] += 1
            else:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(rng.uniform(0.2, 1.2))
                os.kill(pid, signal.SIGCONT)
                faults["stop/cont router" if name in routers else "stop/cont worker"] += 1
        except ProcessLookupError:
            pass
finally:
    stop.set()   # the clients end whatever happened here, or the test would never exit
    for t in ts: t.join()
wait_workers(bin_dir, topo, 3, timeout_s=30)
deadline = time.time() + 30
while time.time() < deadline and not all((top(bin_dir, topo).get(r) or {}).get("state") == "ready" for r in routers):
    time.sleep(0.2)
wait_idle_pools(bin_dir, topo, timeout_s=15)
for r_ep in ep.split(","):   # every router serves again
    with Client(r_ep, timeout_s=60) as c:
        last = list(c.generate(tokens=[1, 2, 3, 4], max_tokens=4))[-1]
    assert last["type"] == "done", (r_ep, last)
samples.append((time.time() - t_start, rss_kib()))
print(f"nemesis {duration:.0f} s, {len(routers)} router(s), faults {dict(faults)}: {dict(stats)}; pools idle "
      f"after; every router served again: {last['type']}")
# One row per sample, one column per actor; the last row is the end (after the recovery checks).
names = ["supervisor"] + UNTOUCHED
print("resident memory of the untouched actors, KiB (t: seconds into the run):")
print("  " + f"{'t':>7}" + "".join(f"{n:>17}" for n in names))
for t, rss in samples:
    print("  " + f"{t:>7.0f}" + "".join(f"{rss[n][1] if n in rss else '-':>17}" for n in names))
base, end = samples[0][1], samples[-1][1]
def change(n):
    if n not in base or n not in end:
        return "-"
    if base[n][0] != end[n][0]:
        return "restarted"
    d = end[n][1] - base[n][1]
    return f"{d:+d} ({100 * d / base[n][1]:+.0f}%)"
print("  " + f"{'grown':>7}" + "".join(f"{change(n):>17}" for n in names))
for p in problems[:10]:
    print("PROBLEM:", p)
assert not problems, f"{len(problems)} problems"
assert stats["lost"] == 0 and stats["submitted"] == sum(v for k, v in stats.items() if k not in ("submitted", "lost", "retried"))
assert sum(faults.values()) >= duration / 4, faults
assert last["type"] == "done", last
if duration >= 300:
    missing = [n for n in names if n not in base or n not in end]
    assert not missing, f"no resident memory read for {missing}"
    restarted = {n: (base[n][0], end[n][0]) for n in names if base[n][0] != end[n][0]}
    assert not restarted, f"untouched actors restarted during the run (pid then -> now): {restarted}"
    grown = {n: (base[n][1], end[n][1]) for n in names if end[n][1] > max(base[n][1] * 1.2, base[n][1] + 16384)}
    assert not grown, f"resident memory grew (KiB after the first tenth -> at the end): {grown}"
PY
echo "PASS nemesis"
