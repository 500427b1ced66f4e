# 10,000 malformed or mutated messages at the router: every actor keeps running (same pids, no
# restarts) and every message gets exactly one terminal reply: an error for everything malformed
# or refused, a done for a mutated submit that is still a valid request (then served for real);
# none for a message that shows the type error (errors are never answered).
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
before=$(pgrep -f -- "--topology $WORK/t.yaml" | sort | tr '\n' ' ')
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
PYTHONPATH="$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 - "$ep" <<'PY'
import random, sys, time
import msgpack, zmq
from troupe_client import TYPE_NUM
random.seed(1234)
ctx = zmq.Context.instance()
s = ctx.socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0); s.connect(sys.argv[1])
valid = [
    msgpack.packb({"v": 1, "t": TYPE_NUM["submit"], "id": 7, "prompt": "hello", "sampling": {"max_tokens": 8}}),
    msgpack.packb({"v": 1, "t": TYPE_NUM["done"], "id": 8, "finish": 0}),
    msgpack.packb({"v": 1, "t": TYPE_NUM["submit"], "id": 9, "tokens": [1, 2, 3], "stream": True}),
]
def mutate(b):
    b = bytearray(b)
    op = random.randrange(6)
    if op == 0 and b: b[random.randrange(len(b))] ^= 1 << random.randrange(8)
    elif op == 1: b = b[:random.randrange(len(b) + 1)]
    elif op == 2: b.insert(random.randrange(len(b) + 1), random.randrange(256))
    elif op == 3: b = bytearray(random.getrandbits(8) for _ in range(random.randrange(64)))
    elif op == 4: b = bytearray(b"\xdd\xff\x00\x00\x00") + b   # huge declared count
    else: b[random.randrange(len(b)):] = bytes(random.getrandbits(8) for _ in range(8))
    return bytes(b)
def peeks_error(b):
    # What msg_peek (messages/msg_codec.c) makes of a frame: its "t" even when the rest does not
    # decode. An error is never answered, whatever its content (actors/runtime/actor.c, s_reject):
    # two peers that refuse each other's errors would answer each other forever.
    u = msgpack.Unpacker(raw=False, unicode_errors="surrogateescape", strict_map_key=False)
    u.feed(b)
    t = None
    try:
        for _ in range(u.read_map_header()):
            k = u.unpack()
            if not isinstance(k, str):
                break
            if k not in ("t", "id"):
                u.skip()
                continue
            v = u.unpack()
            if k == "t" and type(v) is int and 0 < v < len(TYPE_NUM):
                t = v
    except Exception:
        pass
    return t == TYPE_NUM["error"]
def silent(b):
    # A valid cancel of an unknown request is (rightly) ignored, and so is any error: no reply expected.
    if peeks_error(b):
        return True
    try:
        m = msgpack.unpackb(b, raw=False, strict_map_key=False)
        return isinstance(m, dict) and m.get("v") == 1 and m.get("t") == TYPE_NUM["cancel"]
    except Exception:
        return False
N, sent, expect, got, errors, dones = 10000, 0, 0, 0, 0, 0
t0 = time.time()
while sent < N or got < expect:
    while sent < N and expect - got < 200:
        b = mutate(random.choice(valid))
        s.send(b); sent += 1; expect += not silent(b)
    if not s.poll(10000):
        break
    r = msgpack.unpackb(s.recv(), raw=False, strict_map_key=False)
    if r.get("t") == TYPE_NUM["token"]:
        continue
    got += 1
    errors += r.get("t") == TYPE_NUM["error"]
    dones += r.get("t") == TYPE_NUM["done"]
print(f"sent {sent}, terminal replies {got} (expected {expect}): {errors} errors, {dones} done, {time.time()-t0:.1f} s")
assert got == expect, "some messages got no terminal reply"
assert errors + dones == got
PY
sleep 1.5   # a stats interval, so the monitor sees the counters
after=$(pgrep -f -- "--topology $WORK/t.yaml" | sort | tr '\n' ' ')
[ "$before" = "$after" ] || fail "processes changed: before [$before] after [$after]"
"$BIN/troupe-top" --topology "$WORK/t.yaml" --once | tee "$WORK/top.txt"
awk '$1=="router" && $9 > 5000' "$WORK/top.txt" | grep -q . || fail "router does not count malformed messages"
grep -c " ready " "$WORK/top.txt" | grep -qx 8 || fail "not every actor ready"
echo "PASS malformed_flood"
