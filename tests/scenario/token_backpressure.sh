# Nothing on a request's stream is lost when a queue fills (docs/architecture.md, Backpressure).
# Small queues (limits.send_hwm 4, recv_hwm 4, outbox 64) and the fast in-repo model:
#  1. The router stops (SIGSTOP) while 48 streams run: the decode worker's outbox to it fills and
#     its steps wait (steps_held_outbox_total) instead of refusing tokens; once the router runs
#     again every request gets all its tokens, in order, and its done. (Before backpressure, a
#     token refused at the full outbox was lost and its request never ended.)
#  2. A client that submits 32 streams of 600 tokens and reads nothing for a while: the router's
#     backlog for its connection fills, so its requests end with an error that says the client does
#     not read, queued after the tokens it had not read (no gap); a second client, reading, gets
#     every token of its own requests meanwhile.
# Refusals are logged at most once a second per queue, with counts.
. "$(dirname "$0")/lib.sh"
# Heartbeats every 2 s (liveness 6 s): the router is stopped for a few seconds on purpose.
MODEL_PATH=$ROOT/models/kjv-tiny N_PREFILL=1 N_DECODE=1 HEARTBEAT_MS=2000 make_topology "$WORK/t.yaml" \
  "limits:" "  max_batch: 64" "  admission_queue: 512" "  send_hwm: 4" "  recv_hwm: 4" "  outbox: 64"
# Clients on an ipc endpoint: its kernel buffers are fixed (a few hundred KB), where loopback tcp's
# grow with the traffic and could swallow the whole of the slow client's streams.
sed -i "s|^  client: tcp://.*|  client: ipc://$WORK/client.sock|" "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" <<'PY' || fail "see above"
import os, random, signal, sys, threading, time
import msgpack, zmq
from troupe_client import Client, _decorate, TYPE_NUM, VERSION
from servelib import top, metric, wait_workers, wait_idle_pools
ep, bin_dir, topo = sys.argv[1:4]
random.seed(7)
wait_workers(bin_dir, topo, 2)

def stream(c, rid, results, stall_s=60):
    """Reads request rid's replies on c until its terminal one: (token seqs, terminal message)."""
    seqs, last = [], time.time()
    while time.time() - last < stall_s:
        m = c.recv(0.5)
        if m is None or m.get("id") != rid:
            continue
        last = time.time()
        if m["type"] == "token":
            seqs.append(m["seq"])
        elif m["type"] in ("done", "error"):
            results[rid] = (seqs, m)
            return
    results[rid] = (seqs, None)

def submit(c, n_tokens):
    return c.send("submit", tokens=[random.randrange(3, 4000) for _ in range(random.randrange(4, 24))],
                  sampling={"max_tokens": n_tokens, "temperature": 0, "ignore_eos": True}, stream=True)

def by_role(role):
    return next(a for a in top(bin_dir, topo).values() if a["role"] == role)

# --- 1. the router stops: the decode worker holds its steps, loses nothing.
N, T = 48, 400
res, threads = {}, []
for _ in range(N):
    # The router is stopped for up to 4 s on purpose: a heartbeat timeout longer than that, or
    # these clients would rightly give their requests up as lost (tools/lib/client.h).
    c = Client(ep, timeout_s=120, heartbeat_timeout_s=30)
    rid = submit(c, T)
    t = threading.Thread(target=stream, args=(c, rid, res), daemon=True)
    t.start()
    threads.append((t, c))
# Stop it once the streams run (the decode worker has streamed a few hundred tokens).
deadline = time.time() + 60
while time.time() < deadline and metric(by_role("decode"), "generation_tokens_total") < 200:
    time.sleep(0.2)
router = by_role("router")["pid"]
os.kill(router, signal.SIGSTOP)
held = 0
try:
    # Until the worker's steps wait for the router's outbox (stats come every second; the
    # supervisor would kill the stopped router after 6 s).
    deadline = time.time() + 4
    while time.time() < deadline and held == 0:
        time.sleep(0.3)
        held = metric(by_role("decode"), "steps_held_outbox_total")
finally:
    os.kill(router, signal.SIGCONT)
for t, c in threads:
    t.join()
    c.close()
bad = {rid: (len(s), m and m["type"], m and m.get("finish_name")) for rid, (s, m) in res.items()
       if m is None or m["type"] != "done" or m.get("finish_name") != "length" or s != list(range(T))}
print(f"router stopped: decode steps held {held:.0f} times; {len(res)} streams, {len(bad)} incomplete")
assert len(res) == N and not bad, list(bad.items())[:5]
assert held > 0, "the router's stop never filled the decode worker's outbox: nothing was tested"
d = by_role("decode")
assert metric(d, "sends_refused") == 0, "the decode worker refused a send"

# --- 2. a client that does not read, beside one that does.
slow = zmq.Context.instance().socket(zmq.DEALER)
slow.setsockopt(zmq.RCVHWM, 4)
slow.setsockopt(zmq.RCVBUF, 4096)
slow.setsockopt(zmq.LINGER, 0)
slow.connect(ep)
slow_ids, ST = list(range(1, 33)), 600
for rid in slow_ids:
    slow.send(msgpack.packb({"v": VERSION, "t": TYPE_NUM["submit"], "id": rid,
                             "tokens": [random.randrange(3, 4000) for _ in range(8)],
                             "sampling": {"max_tokens": ST, "temperature": 0, "ignore_eos": True},
                             "stream": True}, use_bin_type=True))
fast_res, fast_threads = {}, []
for _ in range(4):
    c = Client(ep, timeout_s=120)
    rid = submit(c, 64)
    t = threading.Thread(target=stream, args=(c, rid, fast_res), daemon=True)
    t.start()
    fast_threads.append((t, c))
# Not reading until the router has refused it a reply (its backlog full).
deadline = time.time() + 60
while time.time() < deadline and metric(by_role("router"), "replies_refused") == 0:
    time.sleep(0.3)
refused = metric(by_role("router"), "replies_refused")
seqs, terminal, after = {rid: [] for rid in slow_ids}, {}, 0
last = time.time()
while len(terminal) < len(slow_ids) and time.time() - last < 60:
    if not slow.poll(500):
        continue
    m = _decorate(msgpack.unpackb(slow.recv(), raw=False, strict_map_key=False))
    last = time.time()
    rid = m.get("id")
    if rid in terminal:
        after += 1
    elif m["type"] == "token":
        seqs[rid].append(m["seq"])
    elif m["type"] in ("done", "error"):
        terminal[rid] = m
slow.close()
for t, c in fast_threads:
    t.join()
    c.close()
kinds = {}
for rid, m in terminal.items():
    k = m.get("finish_name") or m.get("code_name")
    kinds[k] = kinds.get(k, 0) + 1
print(f"slow client: {refused:.0f} replies refused; terminal replies {kinds}; "
      f"tokens per request {sorted(len(s) for s in seqs.values())}")
assert len(terminal) == len(slow_ids), f"{len(slow_ids) - len(terminal)} of the slow client's requests got no terminal reply"
assert after == 0, f"{after} replies after a terminal one"
for rid, m in terminal.items():
    assert seqs[rid] == list(range(len(seqs[rid]))), f"request {rid}: a gap in its stream {seqs[rid][:20]}"
    if m["type"] == "done":
        assert len(seqs[rid]) == ST, (rid, len(seqs[rid]), m)
    else:
        assert m["code_name"] == "cancelled" and "does not read" in m["message"], m
assert kinds.get("cancelled", 0) > 0, "the slow client's backlog never filled: nothing was tested"
fbad = {rid: (len(s), m) for rid, (s, m) in fast_res.items()
        if m is None or m["type"] != "done" or s != list(range(64))}
print(f"the reading client: {len(fast_res)} requests, {len(fbad)} incomplete")
assert len(fast_res) == 4 and not fbad, fbad
wait_idle_pools(bin_dir, topo)
PY
# At most one refusal line a second per queue: a burst of refused replies is one line with a count.
lines=$(grep -c "replies to clients that do not read refused" "$WORK/supervisor.log" || true)
note "refusal log lines: $lines"
[ "$lines" -ge 1 ] || fail "the refused replies were not logged"
[ "$lines" -le 30 ] || fail "$lines refusal lines: not rate-limited"
echo "PASS token_backpressure"
