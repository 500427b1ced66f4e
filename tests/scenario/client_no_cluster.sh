# troupe-client and troupe-top against a cluster that is not running (a tcp port nobody listens
# on, an ipc path with no socket) say so within seconds, naming the endpoint, and exit 3. The
# client used to wait in silence for the whole --timeout-ms (120 s by default: ZeroMQ queues a
# request for a connection that never comes), and `cancel` exited 0 having sent nothing. Against
# the same endpoint once a cluster runs, both work. The Python client (tools/troupe_client.py) the
# same way: its command line exits 3 with the message, the library's first send raises
# NoClusterError with it; it used to wait for its whole timeout (120 s) and end in a TimeoutError
# traceback. Its part is skipped, saying so, where $PY has no pyzmq / msgpack.
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
inspect=$(grep '^  inspect:' "$WORK/t.yaml" | awk '{print $2}')

# Each check runs in the background (each waits about 3 s for a connection that never comes);
# wait_down collects them.
pids=() n=0
expect_down() {   # WHAT EXPECTED-ENDPOINT COMMAND...: exit 3 within 10 s, stderr naming the endpoint
  local what=$1 want=$2 f
  shift 2
  n=$((n + 1)) f="$WORK/down$n"
  (
    rc=0 t0=$(date +%s%N)
    timeout 30 "$@" >"$f.out" 2>"$f.err" </dev/null || rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    note "$what: exit $rc after $ms ms: $(head -c 300 "$f.err")"
    [ "$rc" -eq 3 ] || fail "$what: exit $rc, expected 3 (no connection)"
    [ "$ms" -lt 10000 ] || fail "$what: took $ms ms to say the cluster is not there"
    grep -qF -- "$want" "$f.err" || fail "$what: the error does not name $want"
  ) &
  pids+=($!)
}
wait_down() {
  local p bad=0
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  pids=()
  [ "$bad" = 0 ] || fail "a client against no cluster did not say so in time (above)"
}
expect_down "submit, tcp" "$ep" "$BIN/troupe-client" --endpoint "$ep" submit --ids --max-tokens 2 1,2,3
expect_down "submit, ipc" "ipc://$WORK/none.sock" "$BIN/troupe-client" --endpoint "ipc://$WORK/none.sock" submit --max-tokens 2 hi
expect_down "submit, --topology" "$ep" "$BIN/troupe-client" --topology "$WORK/t.yaml" submit --ids --max-tokens 2 1,2,3
expect_down "cancel" "$ep" "$BIN/troupe-client" --endpoint "$ep" cancel 7
expect_down "top --json" "$inspect" "$BIN/troupe-top" --topology "$WORK/t.yaml" --json
expect_down "top --once, ipc" "ipc://$WORK/none.sock" "$BIN/troupe-top" --endpoint "ipc://$WORK/none.sock" --once

have_py=1
$PY -c 'import zmq, msgpack' 2>/dev/null || { have_py=0; echo "SKIP (the Python client's part): no pyzmq / msgpack for $PY"; }
if [ "$have_py" = 1 ]; then
  expect_down "Python submit, tcp" "$ep" $PY "$ROOT/tools/troupe_client.py" --endpoint "$ep" submit hi
  expect_down "Python submit, ipc" "ipc://$WORK/none.sock" $PY "$ROOT/tools/troupe_client.py" --endpoint "ipc://$WORK/none.sock" submit hi
  expect_down "Python inspect" "$inspect" $PY "$ROOT/tools/troupe_client.py" --endpoint "$inspect" inspect
  # The library: generate (and a cancel) raise NoClusterError naming every endpoint, within seconds.
  wait_down   # (before the library's own timing, so the checks do not slow it)
  $PY - "$ep" "ipc://$WORK/none.sock" <<'PY' || fail "the Python library against no cluster"
import sys, time
from troupe_client import Client, NoClusterError
ep, ipc = sys.argv[1], sys.argv[2]
for eps, call in (([ep], lambda c: list(c.generate("hi", max_tokens=2))), ([ep, ipc], lambda c: c.cancel(7))):
    t0 = time.monotonic()
    with Client(eps, timeout_s=60) as c:
        try:
            call(c)
            sys.exit(f"{eps}: no NoClusterError")
        except NoClusterError as e:
            ms = (time.monotonic() - t0) * 1000
            print(f"--- library, {eps}: NoClusterError after {ms:.0f} ms: {e}")
            assert ms < 10000, ms
            assert all(x in str(e) for x in eps), e
PY
fi
wait_down

start_cluster "$WORK/t.yaml"
timeout 30 "$BIN/troupe-client" --endpoint "$ep" --json submit --ids --max-tokens 2 --temperature 0 1,2,3 >"$WORK/out" \
  || fail "submit to the running cluster failed"
grep -q '"type":"done"' "$WORK/out" || fail "no done from the running cluster: $(cat "$WORK/out")"
timeout 30 "$BIN/troupe-client" --endpoint "$ep" cancel 7 || fail "cancel to the running cluster: exit $?"
if [ "$have_py" = 1 ]; then
  # This model has no tokenizer (and the command line sends text): the cluster's own error, exit 1.
  rc=0; timeout 30 $PY "$ROOT/tools/troupe_client.py" --endpoint "$ep" submit --max-tokens 2 hi >"$WORK/out" 2>"$WORK/err" || rc=$?
  { [ "$rc" = 0 ] && grep -q "done:" "$WORK/err"; } || { [ "$rc" = 1 ] && grep -q "^error bad_request" "$WORK/err"; } \
    || fail "Python submit to the running cluster: exit $rc: $(cat "$WORK/err")"
  timeout 30 $PY "$ROOT/tools/troupe_client.py" --endpoint "$inspect" inspect >"$WORK/out" \
    || fail "Python inspect of the running cluster: exit $?"
  grep -q '"inspect_reply"' "$WORK/out" || fail "Python inspect: $(head -c 300 "$WORK/out")"
  $PY - "$ep" <<'PY' || fail "the Python library against the running cluster"
import sys
from troupe_client import Client
with Client(sys.argv[1], timeout_s=30) as c:
    last = list(c.generate(tokens=[1, 2, 3], max_tokens=2, temperature=0))[-1]
    assert last["type"] == "done", last
PY
fi
echo "PASS client_no_cluster"
