# The Python client (tools/troupe_client.py) drops what a router it moved a request away from
# sends for it later, after the request ended elsewhere too (1799b52; tests/unit/test_client.c's
# test_late_reply_from_left_router does the same for the C client). No cluster: two fake routers.
# The first, a process that answers every small submit with a token and a done and then a token for
# an id never used (the marker: delivered as it comes, it shows that what came before it on that
# connection has been read), is stopped (SIGSTOP); a big submit that its connection cannot take and
# a small one behind it wait in the client's queue for it; the heartbeat sent before them times out
# and the client moves both to the second router, where they end. Resumed, the first router gets
# the queued submit through ZeroMQ's reconnection and streams it: only the marker may reach the
# caller. Then a request moved back to a router it had left (that one lost, then the other): its
# replies there are its own and end it.
. "$(dirname "$0")/lib.sh"
$PY - "$WORK" <<'PY'
import os, signal, sys, time
import msgpack, zmq
from troupe_client import Client, TYPE_NUM, VERSION
work = sys.argv[1]
ep_a = f"ipc://{work}/a.sock"   # unix sockets: small buffers, filled by the big submit at once
MARKER = 0xfeed

def reply(sock, rid, type_name, id, **fields):
    sock.send_multipart([rid, msgpack.packb(dict(v=VERSION, t=TYPE_NUM[type_name], id=id, **fields))])

pid = os.fork()
if pid == 0:   # the first router
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.bind(ep_a)
    while True:
        frames = r.recv_multipart()
        try:
            m = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)
        except Exception:   # the rest of the big one its lost connection carried
            continue
        if m.get("t") == TYPE_NUM["submit"] and "prompt" not in m:
            reply(r, frames[0], "token", m["id"], seq=0, tokens=[5], text="late")
            reply(r, frames[0], "done", m["id"], finish=0)
            reply(r, frames[0], "token", MARKER, seq=0, tokens=[5], text="marker")
try:
    ctx = zmq.Context.instance()
    b = ctx.socket(zmq.ROUTER)
    b.setsockopt(zmq.LINGER, 0)
    port = b.bind_to_random_port("tcp://127.0.0.1")
    c = Client([ep_a, f"tcp://127.0.0.1:{port}"], timeout_s=30, heartbeat_ivl_s=0.2, heartbeat_timeout_s=1.0)
    c.send("submit", tokens=[1, 2, 3], stream=True)   # the first router answers: both connections up
    got = [c.recv(30)["type"] for _ in range(3)]
    assert got == ["token", "done", "token"], got
    m = c.recv(0.3)
    assert m is None, m

    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.5)   # a heartbeat goes out unanswered first: its timeout runs while the big one blocks
    big = c.send("submit", prompt="x" * (2 << 20), stream=True)
    rid = c.send("submit", tokens=[1, 2, 3], stream=True)   # queued behind the big one
    seen, dones = set(), 0
    while len(seen) < 2:   # both moved to the second router, after the heartbeat timeout
        if not b.poll(0):
            m = c.recv(0.05)   # the client notices the loss; the first one moved may end meanwhile
            if m is not None:
                assert m["type"] == "done" and m["id"] in seen, m
                dones += 1
            continue
        ident, frame = b.recv_multipart()
        m = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        seen.add(m["id"])
        reply(b, ident, "done", m["id"], finish=0)
    assert seen == {big, rid}, (seen, big, rid)
    for _ in range(2 - dones):
        m = c.recv(30)
        assert m and m["type"] == "done", m
    assert c.requests_retried == 2, c.requests_retried

    os.kill(pid, signal.SIGCONT)   # it gets the queued submit and streams it: only the marker may come
    m = c.recv(30)
    assert m is not None and m["id"] == MARKER, f"a {m and m['type']} for request {m and m['id']} from the router it had left (the marker was due)"
    m = c.recv(0.3)
    assert m is None, m
    assert c.requests_lost == 0, c.requests_lost
    print(f"late replies from the router left dropped: request {rid} moved, its replies there dropped, the marker delivered")
    c.close()

    def fake():
        r = ctx.socket(zmq.ROUTER)
        r.setsockopt(zmq.LINGER, 0)
        return r
    def take(r):   # the client runs meanwhile: it notices a loss and moves requests only then
        while not r.poll(0):
            m = c.recv(0.05)
            assert m is None, m
        return r.recv_multipart()
    a, b2 = fake(), fake()
    pa, pb = a.bind_to_random_port("tcp://127.0.0.1"), b2.bind_to_random_port("tcp://127.0.0.1")
    c = Client([f"tcp://127.0.0.1:{pa}", f"tcp://127.0.0.1:{pb}"], timeout_s=30)
    rid = c.send("submit", tokens=[1, 2, 3], stream=True)
    take(a)
    assert c.recv(0.3) is None   # both connections' handshakes seen
    a.close()
    take(b2)   # moved to the second
    a = fake()
    a.bind(f"tcp://127.0.0.1:{pa}")   # the first back: the client reconnects
    assert c.recv(0.5) is None
    b2.close()
    ident, frame = take(a)   # moved back to the first
    assert msgpack.unpackb(frame, raw=False)["id"] == rid
    reply(a, ident, "done", rid, finish=0)
    m = c.recv(10)
    assert m is not None and m["type"] == "done" and m["id"] == rid, m
    assert c.requests_retried == 2, c.requests_retried
    print(f"request {rid} moved back to the router it had left: ended there")
    c.close()
    a.close()
finally:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
PY
echo "PASS client_py_late_reply"
