# A configured port another program holds stops the cluster at once: the actor that binds it (the
# router's endpoints.client, the monitor's endpoints.inspect and endpoints.metrics, the gateway's
# endpoints.http) says in one line which endpoint, from which key, and why, exits ACTOR_EXIT_CONFIG
# (78), and the supervisor exits 2 without a restart, leaving no process behind; the supervisor's
# own endpoints.control says the same line and exits 2 before it starts any actor. A bind failure
# does not cure itself: the supervisor restarted the router 5 times in 0.2 s and gave up with exit 3
# and a generic "more than 5 restarts". Once the port is free the same topology comes up and serves
# (the gateway's HTTP on the listening socket it now binds itself).
. "$(dirname "$0")/lib.sh"
[ -x "$BIN/troupe-gateway" ] || fail "troupe-gateway is not built (libmicrohttpd-dev missing? make deps)"
[ -f "$ROOT/third_party/tokenizers/qwen3/tokenizer.json" ] || { echo "SKIP: no Qwen3 tokenizer (make deps fetches it)"; exit 0; }
command -v curl >/dev/null || fail "curl is needed"
. "$ROOT/tests/gateway/lib.sh"
gateway_topology "$WORK/t.yaml" "  admission_queue: 256"

HOLDER=
release() { [ -z "$HOLDER" ] || { kill "$HOLDER" 2>/dev/null || true; wait "$HOLDER" 2>/dev/null || true; HOLDER=; }; }
trap 'release; cleanup' EXIT

# taken KEY ACTOR: holds KEY's port with a plain listening socket and starts the cluster.
taken() {
  local key=$1 actor=$2 ep port rc=0 t0 ms line
  ep=$(grep "^  $key: " "$WORK/t.yaml" | awk '{print $2}')
  port=${ep##*:}
  rm -f "$WORK/held"
  $PY -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
open(sys.argv[2], "w").write("1"); time.sleep(120)' "$port" "$WORK/held" &
  HOLDER=$!
  wait_for test -s "$WORK/held" || fail "$key: could not hold port $port"
  t0=$(date +%s%N)
  timeout 60 "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" >"$WORK/$key.log" 2>&1 || rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  release
  line=$(grep " ERROR " "$WORK/$key.log" | grep "cannot bind" || true)
  note "endpoints.$key held: supervisor exit $rc after $ms ms; $line"
  [ "$rc" -eq 2 ] || { tail -20 "$WORK/$key.log"; fail "$key: exit $rc, expected 2 (the topology cannot run here)"; }
  grep -q "^[^ ]* $actor \[[0-9]*\] ERROR cannot bind $ep (endpoints.$key): Address already in use; another cluster or program holds it\$" \
    "$WORK/$key.log" || { tail -20 "$WORK/$key.log"; fail "$key: no line from $actor naming $ep, endpoints.$key and the reason"; }
  [ "$(grep -c "cannot bind" "$WORK/$key.log")" -eq 1 ] || fail "$key: the bind failure is said more than once"
  grep -q "$actor exited (exit 78): it cannot run with this topology" "$WORK/$key.log" \
    || fail "$key: the supervisor did not stop on $actor's exit 78"
  ! grep -q "): restarting\|giving up" "$WORK/$key.log" || fail "$key: an actor was restarted"
  [ "$ms" -lt 20000 ] || fail "$key: the supervisor took $ms ms to stop"
  sleep 0.2
  ! pgrep -f -- "--topology $WORK/t.yaml" >/dev/null || fail "$key: processes left behind"
}
grep -q "^  metrics: tcp://" "$WORK/t.yaml" || fail "no endpoints.metrics in the topology"
taken client router
taken inspect monitor
taken metrics monitor
taken http gateway

# The supervisor's own control endpoint (set to tcp here; by default an ipc socket in run_dir, which
# the run directory's lock keeps to one supervisor): the same one line, exit 2, no actor started.
cp=$(free_port)
sed "s|^endpoints:|endpoints:\n  control: tcp://127.0.0.1:$cp|" "$WORK/t.yaml" > "$WORK/tc.yaml"
$PY -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
open(sys.argv[2], "w").write("1"); time.sleep(120)' "$cp" "$WORK/held-c" &
HOLDER=$!
wait_for test -s "$WORK/held-c" || fail "control: could not hold port $cp"
rc=0; timeout 30 "$BIN/troupe-supervisor" --topology "$WORK/tc.yaml" >"$WORK/control.log" 2>&1 || rc=$?
release
note "endpoints.control held: supervisor exit $rc; $(grep "cannot bind" "$WORK/control.log" || true)"
[ "$rc" -eq 2 ] || { tail -20 "$WORK/control.log"; fail "control: exit $rc, expected 2"; }
grep -q "ERROR cannot bind tcp://127.0.0.1:$cp (endpoints.control): Address already in use; another cluster or program holds it\$" \
  "$WORK/control.log" || { tail -20 "$WORK/control.log"; fail "control: no line naming the endpoint, endpoints.control and the reason"; }
! grep -q "started\|READY" "$WORK/control.log" || fail "control: actors were started"

start_cluster "$WORK/t.yaml"
U=$(gw_url "$WORK/t.yaml")
[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 30 "$U/health")" = 200 ] || fail "the gateway does not serve once its port is free"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
timeout 60 "$BIN/troupe-client" --endpoint "$ep" --json submit --max-tokens 2 --temperature 0 "Hello" \
  | grep -q '"type":"done"' || fail "the router does not serve once its port is free"
echo "PASS port_taken"
