# A stop whose work outlasts supervision.grace_s (a long request streaming): the actors end their
# drain a little before the supervisor's SIGKILL and exit by themselves, and the router gives the
# request's client its one terminal reply, a retryable `unavailable` error saying the cluster is
# stopping. Before, the router and the decode worker were SIGKILLed at the grace's end (supervisor
# exit 1) and the client saw only its connection drop.
. "$(dirname "$0")/lib.sh"
GRACE_S=2 make_demo_topology "$WORK/t.yaml"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
start_cluster "$WORK/t.yaml"
"$BIN/troupe-client" --endpoint "$ep" submit --max-tokens 3000 --ignore-eos --temperature 0 "In the beginning" \
  >"$WORK/stream.out" 2>"$WORK/stream.err" &
client=$!
wait_for test -s "$WORK/stream.out" || fail "the request did not stream"
t0=$(date +%s%N)
kill -TERM "$SUP_PID"
rc=0; wait "$SUP_PID" || rc=$?
SUP_PID=
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
crc=0; wait "$client" || crc=$?
note "supervisor exit $rc after $ms ms; client exit $crc: $(tail -c 250 "$WORK/stream.err")"
grep -E " (WARN|ERROR) " "$WORK/supervisor.log" | grep -v "no tokenizer" | head -5 || true
[ "$rc" -eq 0 ] || fail "supervisor exit $rc, expected 0 (every actor exited by itself)"
! grep -q "SIGKILL" "$WORK/supervisor.log" || fail "an actor had to be killed"
[ "$crc" -eq 1 ] || fail "client exit $crc, expected 1 (an error reply)"
grep -q "error unavailable (retryable): the cluster is stopping" "$WORK/stream.err" \
  || fail "the client was not told the cluster is stopping"
sleep 0.2
! pgrep -f -- "--topology $WORK/t.yaml" >/dev/null || fail "processes left behind"
echo "PASS stop_grace_over"
