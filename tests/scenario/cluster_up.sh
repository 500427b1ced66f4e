# The cluster comes up under the supervisor, every actor reports to the monitor (with its CPU
# time), `top` shows them all, and SIGTERM stops everything with exit code 0 within the grace period.
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml"
start=$(date +%s%N)
start_cluster "$WORK/t.yaml"
note "all READY in $(cat "$WORK/ready") ms (supervisor's count)"

# Every instance of the topology plus the supervisor shows in top, state ready.
want="monitor cache-manager router prefill decode expert-balancer draft-scheduler supervisor"
wait_for sh -c "'$BIN/troupe-top' --topology '$WORK/t.yaml' --once | grep -c ' ready ' | grep -qx 8" \
  || { "$BIN/troupe-top" --topology "$WORK/t.yaml" --once; fail "top does not show 8 ready actors"; }
"$BIN/troupe-top" --topology "$WORK/t.yaml" --once | tee "$WORK/top.txt"
for a in $want; do grep -q "^$a " "$WORK/top.txt" || fail "top lacks $a"; done
top_json "$WORK/t.yaml" > "$WORK/top.json"
/usr/bin/python3 - "$WORK/top.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
actors = d.get("actors") or d.get("inspect_reply", {}).get("actors")
assert len(actors) == 8, actors
for a in actors:
    for k in ("role", "name", "pid", "uptime_ms", "state", "restarts", "msgs_in", "msgs_out", "malformed"):
        assert k in a, (k, a)
    assert a["pid"] > 0
    m = {x["name"]: x["value"] for x in a.get("metrics", [])}   # the process's CPU time, and its rate
    assert m.get("cpu_seconds_total", 0) > 0 and 0 <= m.get("cpu_percent", -1), (a["name"], m)
PY

# Prometheus: every actor's samples on GET /metrics, and a 404 elsewhere.
mp=$(grep 'metrics:' "$WORK/t.yaml" | sed 's|.*:||')
/usr/bin/python3 - "$mp" <<'PY'
import sys, urllib.request, urllib.error
port = sys.argv[1]
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
ups = [l for l in body.splitlines() if l.startswith("troupe_up{")]
assert len(ups) == 8 and all(l.endswith(" 1") for l in ups), ups
for name in ("router", "prefill", "decode", "cache-manager", "monitor", "supervisor"):
    assert f'actor="{name}"' in body, name
assert 'troupe_kv_blocks_free{actor="decode",role="decode"}' in body
assert "troupe_requests_submitted_total{" in body    # counters get _total
assert 'troupe_cpu_seconds_total{actor="router",role="router"}' in body
try:
    urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=5)
    raise AssertionError("no 404")
except urllib.error.HTTPError as e:
    assert e.code == 404
print(f"/metrics: {len(body.splitlines())} samples, every actor up")
PY

# A second supervisor of the running cluster is refused before it touches anything (its ipc bind
# would replace the first one's control socket), naming the pid that runs it; the cluster goes on.
rc=0; timeout 20 "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" >"$WORK/second.log" 2>&1 || rc=$?
note "second supervisor: exit $rc: $(grep -m1 'already running' "$WORK/second.log")"
[ "$rc" -eq 2 ] || { cat "$WORK/second.log"; fail "second supervisor exit $rc (want 2)"; }
grep -q "already running: supervisor pid $SUP_PID holds" "$WORK/second.log" || { cat "$WORK/second.log"; fail "no 'already running' naming pid $SUP_PID"; }
"$BIN/troupe-top" --topology "$WORK/t.yaml" --once | awk '$5 == "ready" && $6 == 0' | grep -c . | grep -qx 8 \
  || { "$BIN/troupe-top" --topology "$WORK/t.yaml" --once; fail "the cluster did not stay as it was (8 ready, no restarts)"; }

# SIGTERM: everything stops, exit 0, within the grace period (5 s) plus a margin.
pids=$(pgrep -f -- "--topology $WORK/t.yaml" || true)
[ -n "$pids" ] || fail "no actor processes found"
t0=$(date +%s%N)
kill -TERM "$SUP_PID"
rc=0; wait "$SUP_PID" || rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
SUP_PID=
note "SIGTERM -> supervisor exit $rc in $ms ms"
[ "$rc" -eq 0 ] || { cat "$WORK/supervisor.log"; fail "supervisor exit code $rc after SIGTERM"; }
[ "$ms" -lt 6000 ] || fail "stop took $ms ms (grace 5 s)"
for p in $pids; do kill -0 "$p" 2>/dev/null && fail "actor pid $p still alive after stop"; done
grep -q "report for cluster" "$WORK/supervisor.log" || fail "no stop report"
echo "PASS cluster_up"
