# rest_for_one: when an actor dies, it and every actor started after it are restarted (in start
# order); the ones started before it keep running untouched.
. "$(dirname "$0")/lib.sh"
STRATEGY=rest_for_one make_topology "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
# Start order (make_topology): monitor, cache-manager, router, prefill, decode, expert-balancer, draft-scheduler.
before=$($PY - "$BIN" "$WORK/t.yaml" <<'PY'
import sys
from servelib import top, wait_workers
t = wait_workers(sys.argv[1], sys.argv[2], 2)
print(" ".join(f"{n}={a['pid']}" for n, a in sorted(t.items())))
PY
)
victim=$(pgrep -f -- "troupe-router --topology $WORK/t.yaml" | head -1)
kill -9 "$victim"
wait_for grep -q "draft-scheduler ready in .*restarted" "$WORK/supervisor.log" || { cat "$WORK/supervisor.log"; fail "rest not restarted"; }
sleep 1.5
$PY - "$BIN" "$WORK/t.yaml" "$before" <<'PY'
import sys
from servelib import top
bin_dir, topo, before = sys.argv[1], sys.argv[2], dict(kv.split("=") for kv in sys.argv[3].split())
t = top(bin_dir, topo)
for name in ("monitor", "cache-manager"):          # started before the router: untouched
    assert str(t[name]["pid"]) == before[name] and t[name]["restarts"] == 0, (name, t[name])
for name in ("router", "prefill", "decode", "expert-balancer", "draft-scheduler"):
    assert str(t[name]["pid"]) != before[name] and t[name]["restarts"] == 1 and t[name]["state"] == "ready", (name, t[name])
print("router killed: router and the 4 actors after it restarted once; monitor and cache-manager untouched")
PY
echo "PASS rest_for_one"
