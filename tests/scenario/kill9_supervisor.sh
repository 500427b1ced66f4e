# kill -9 of the supervisor with a request streaming: every actor ends within a second (their
# parent's death signal), and a new supervisor of the same topology, started at once, comes up
# without a restart and serves. The actors used to drain for the grace period (5 s), orphaned:
# the old router kept the client port (the new router's bind failed and it was restarted), and the
# old decode worker, reconnecting to the new actors under its own name, took its traffic from the
# new decode worker, which never became ready, exited as an orphan after 8 s and was restarted.
. "$(dirname "$0")/lib.sh"
make_demo_topology "$WORK/t.yaml"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
start_cluster "$WORK/t.yaml"
"$BIN/troupe-client" --endpoint "$ep" submit --max-tokens 1500 --ignore-eos --temperature 0 "In the beginning" \
  >"$WORK/stream.out" 2>"$WORK/stream.err" &
client=$!
wait_for test -s "$WORK/stream.out" || fail "the request did not stream"
old=$(pgrep -f -- "troupe-[a-z-]* --topology $WORK/t.yaml" | tr '\n' ' ')
kill -9 "$SUP_PID"
wait "$SUP_PID" 2>/dev/null || true
t0=$(date +%s%N)
mv "$WORK/supervisor.log" "$WORK/supervisor-1.log"
start_cluster "$WORK/t.yaml"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
left=0
for p in $old; do kill -0 "$p" 2>/dev/null && left=$((left + 1)); done
note "new cluster ready in $ms ms; actors of the old one still alive: $left"
[ "$left" -eq 0 ] || fail "$left actors of the killed supervisor survived it"
! grep -q "restarting\|no word from the supervisor" "$WORK/supervisor.log" \
  || { grep -E "WARN|ERROR" "$WORK/supervisor.log" | head; fail "the new cluster had to restart actors"; }
[ "$ms" -lt 20000 ] || fail "the new cluster took $ms ms"
rc=0; wait "$client" || rc=$?
note "the old request's client: exit $rc: $(tail -c 200 "$WORK/stream.err")"
[ "$rc" -eq 1 ] || fail "the old request's client exited $rc, expected 1 (a retryable error)"
timeout 30 "$BIN/troupe-client" --endpoint "$ep" --json submit --max-tokens 4 --temperature 0 "In the beginning" \
  >"$WORK/new.out" || fail "the new cluster did not serve"
grep -q '"type":"done"' "$WORK/new.out" || fail "no done from the new cluster"
echo "PASS kill9_supervisor"
