# The monitor never blocks on an HTTP client: clients that send requests for /metrics and never
# read the answers (a tiny receive buffer, so their pipes fill), then half-read one and close,
# leave /metrics and the inspection endpoint answering; only the exact path /metrics is served;
# a forged label value could not break the exposition (labels are escaped).
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
mep=$(grep 'metrics:' "$WORK/t.yaml" | awk '{print $2}' | sed 's#tcp://##')
/usr/bin/python3 - "$mep" <<'PY' || fail "see above"
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1); port = int(port)
def get(path, timeout=10):
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(("GET %s HTTP/1.0\r\n\r\n" % path).encode())
    data = b""
    while True:
        c = s.recv(65536)
        if not c: break
        data += c
    s.close()
    return data
# Clients that ask and ask and never read.
hogs = []
for i in range(8):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.connect((host, port)); s.setblocking(False)
    for _ in range(400):
        try: s.send(b"GET /metrics HTTP/1.0\r\n\r\n")
        except (BlockingIOError, ConnectionError): break
    hogs.append(s)
time.sleep(1.0)
# One that reads a little and closes.
s = socket.create_connection((host, port), timeout=10); s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n"); s.recv(10); s.close()
t0 = time.time()
page = get("/metrics")
print("--- /metrics beside %d non-reading clients: %d bytes in %.2f s" % (len(hogs), len(page), time.time() - t0))
assert page.startswith(b"HTTP/1.0 200") and b"troupe_up{" in page, page[:200]
assert get("/metricsX").startswith(b"HTTP/1.0 404"), "a path other than /metrics was served"
for s in hogs: s.close()
PY
# The inspection endpoint still answers: the monitor's loop was never blocked.
top_json "$WORK/t.yaml" >/dev/null || fail "the monitor stopped answering inspect"
[ "$(pgrep -f -- "troupe-monitor --topology $WORK/t.yaml" | wc -l)" -eq 1 ] || fail "monitor restarted"
grep -q "monitor (pid [0-9]*) missed" "$WORK/supervisor.log" && fail "the monitor wedged (missed heartbeats)"
echo "PASS monitor_slow_client"
