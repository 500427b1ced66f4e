# Admission is fair across clients (engine/sched.h, docs/security.md): a short request's latency
# beside 40 clients that flood (each keeps its limits.max_inflight_per_client of 4 requests of 480
# tokens in flight, submitting again as each ends) and 40 that submit 4 such streams each and never
# read. 2 decode slots (max_batch 2) for the 320 requests: the workers promote waiting requests
# and order prompt chunks round robin over the router's client key, so the short request goes at
# the next freed slot instead of behind the others' 300 (oldest first, its p50 was about 1 s
# here; round robin, tens of ms). Its p50 must stay under max(20 x its p50 alone, 400 ms): loose
# enough for a loaded machine, well under what oldest first gave. The "fairness: ..." line is the
# figure.
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml" "limits:
  max_inflight_per_client: 4
  max_batch: 2
  admission_queue: 512
  max_model_len: 512"
start_cluster "$WORK/t.yaml"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY' || fail "see above"
import random, statistics, sys, time
import msgpack, zmq
from troupe_client import _decorate, TYPE_NUM, VERSION
from servelib import top, metric, wait_workers
ep, bin_dir, topo = sys.argv[1:4]
random.seed(21)
wait_workers(bin_dir, topo, 2)
ctx = zmq.Context.instance()

def sock(rcvhwm=1000):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.RCVHWM, rcvhwm)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(ep)
    return s

def submit(s, rid, tokens, max_tokens, stream):
    s.send(msgpack.packb({"v": VERSION, "t": TYPE_NUM["submit"], "id": rid, "tokens": tokens,
                          "sampling": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
                          "stream": stream}, use_bin_type=True))

def recv(s):
    return _decorate(msgpack.unpackb(s.recv(), raw=False, strict_map_key=False))

SHORT = [7, 8, 9, 10]
FLOOD_TOKENS = 480
short = sock()
poller = zmq.Poller()
poller.register(short, zmq.POLLIN)
flooders, next_id = [], [1]
stats = {"done": 0, "error": 0, "codes": {}}

def pump(timeout_ms):
    """Reads what has come; every flood request that ended is submitted again. Returns the short
    client's terminal reply if one came."""
    got = None
    for s, _ in poller.poll(timeout_ms):
        while s.poll(0):
            m = recv(s)
            if s is short:
                if m["type"] in ("done", "error"):
                    got = m
                continue
            if m["type"] not in ("done", "error"):
                continue
            stats[m["type"]] += 1
            if m["type"] == "error":
                assert m.get("code_name") != "bad_request", m
                stats["codes"][m.get("code_name")] = stats["codes"].get(m.get("code_name"), 0) + 1
            if s in flooders:
                next_id[0] += 1
                submit(s, next_id[0], [random.randrange(3, 500) for _ in range(16)], FLOOD_TOKENS, False)
    return got

def short_ms(limit_s=60):
    t0 = time.time()
    submit(short, int(t0 * 1e6), SHORT, 4, False)
    while time.time() - t0 < limit_s:
        m = pump(20)
        if m:
            assert m["type"] == "done", f"the short request failed: {m}"
            return (time.time() - t0) * 1000
    raise AssertionError(f"the short request got no reply in {limit_s} s")

short_ms()   # warm-up
alone = statistics.median(short_ms() for _ in range(7))

# 40 clients that never read: 4 streams each, tiny receive buffers.
silent = []
for c in range(40):
    s = sock(rcvhwm=4)
    s.setsockopt(zmq.RCVBUF, 4096)
    for k in range(4):
        submit(s, k + 1, [random.randrange(3, 500) for _ in range(16)], FLOOD_TOKENS, True)
    silent.append(s)
# 40 clients that flood: always 4 in flight.
for c in range(40):
    s = sock()
    for k in range(4):
        next_id[0] += 1
        submit(s, next_id[0], [random.randrange(3, 500) for _ in range(16)], FLOOD_TOKENS, False)
    flooders.append(s)
    poller.register(s, zmq.POLLIN)
# Until the cluster is in its steady state: the decode batch full, requests waiting behind it.
t0, loaded = time.time(), None
while time.time() - t0 < 20:
    pump(50)
    if time.time() - t0 > 1.5:
        d = next(a for a in top(bin_dir, topo).values() if a["role"] == "decode")
        if metric(d, "requests_running") >= 2 and metric(d, "requests_waiting") >= 32:
            loaded = (metric(d, "requests_running"), metric(d, "requests_waiting"))
            break
assert loaded, "the flood never filled the decode batch: nothing was tested"
router = next(a for a in top(bin_dir, topo).values() if a["role"] == "router")
in_flight = metric(router, "requests_waiting") + metric(router, "requests_running")
lat = [short_ms() for _ in range(7)]
p50 = statistics.median(lat)
print(f"fairness: short request p50 {p50:.0f} ms (alone {alone:.0f} ms) with 40 flooding + 40 non-reading clients"
      f" (decode running {loaded[0]:.0f}, waiting {loaded[1]:.0f}; router in flight {in_flight:.0f};"
      f" short latencies {[round(x) for x in lat]} ms; flood replies {stats['done']} done, errors {stats['codes']})")
assert in_flight >= 200, f"only {in_flight} requests in flight at the router: not the load meant"
bound = max(20 * alone, 400)
assert p50 < bound, f"short request p50 {p50:.0f} ms, more than {bound:.0f} ms beside the flood"
assert stats["codes"].get("overloaded", 0) == 0, f"a flood client was refused: {stats['codes']}"
for s in silent + flooders + [short]:
    s.close()
PY
echo "PASS client_fairness_rr"
