# troupe-client and troupe-top against a cluster that is not running (a tcp port nobody listens
# on, an ipc path with no socket) say so within seconds, naming the endpoint, and exit 3. The
# client used to wait in silence for the whole --timeout-ms (120 s by default: ZeroMQ queues a
# request for a connection that never comes), and `cancel` exited 0 having sent nothing. Against
# the same endpoint once a cluster runs, both work.
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
inspect=$(grep '^  inspect:' "$WORK/t.yaml" | awk '{print $2}')

expect_down() {   # WHAT EXPECTED-ENDPOINT COMMAND...: exit 3 within 10 s, stderr naming the endpoint
  local what=$1 want=$2 rc=0 t0 ms
  shift 2
  t0=$(date +%s%N)
  timeout 30 "$@" >"$WORK/out" 2>"$WORK/err" </dev/null || rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  note "$what: exit $rc after $ms ms: $(head -c 300 "$WORK/err")"
  [ "$rc" -eq 3 ] || fail "$what: exit $rc, expected 3 (no connection)"
  [ "$ms" -lt 10000 ] || fail "$what: took $ms ms to say the cluster is not there"
  grep -qF -- "$want" "$WORK/err" || fail "$what: the error does not name $want"
}
expect_down "submit, tcp" "$ep" "$BIN/troupe-client" --endpoint "$ep" submit --ids --max-tokens 2 1,2,3
expect_down "submit, ipc" "ipc://$WORK/none.sock" "$BIN/troupe-client" --endpoint "ipc://$WORK/none.sock" submit --max-tokens 2 hi
expect_down "submit, --topology" "$ep" "$BIN/troupe-client" --topology "$WORK/t.yaml" submit --ids --max-tokens 2 1,2,3
expect_down "cancel" "$ep" "$BIN/troupe-client" --endpoint "$ep" cancel 7
expect_down "top --json" "$inspect" "$BIN/troupe-top" --topology "$WORK/t.yaml" --json
expect_down "top --once, ipc" "ipc://$WORK/none.sock" "$BIN/troupe-top" --endpoint "ipc://$WORK/none.sock" --once

start_cluster "$WORK/t.yaml"
timeout 30 "$BIN/troupe-client" --endpoint "$ep" --json submit --ids --max-tokens 2 --temperature 0 1,2,3 >"$WORK/out" \
  || fail "submit to the running cluster failed"
grep -q '"type":"done"' "$WORK/out" || fail "no done from the running cluster: $(cat "$WORK/out")"
timeout 30 "$BIN/troupe-client" --endpoint "$ep" cancel 7 || fail "cancel to the running cluster: exit $?"
echo "PASS client_no_cluster"
