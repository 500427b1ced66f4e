# kill -9 of an actor: the supervisor restarts it within 1 s and top counts the restart.
# A stopped (SIGSTOP) actor is detected as wedged by missed heartbeats, killed and restarted.
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
for victim in decode cache-manager; do
  old=$(pgrep -f -- "troupe-$victim --topology $WORK/t.yaml" | head -1)
  [ -n "$old" ] || fail "no $victim process"
  t0=$(date +%s%N)
  kill -9 "$old"
  # Restarted = a new process that has said READY to the supervisor.
  wait_for grep -q "$victim ready in .*restarted" "$WORK/supervisor.log" || { cat "$WORK/supervisor.log"; fail "$victim not restarted"; }
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  new=$(pgrep -f -- "troupe-$victim --topology $WORK/t.yaml" | head -1)
  note "$victim: kill -9 pid $old -> ready again as pid $new in $ms ms"
  [ "$ms" -lt 1000 ] || fail "$victim restart took $ms ms"
  [ "$new" != "$old" ] || fail "same pid"
  # top counts the restart (the new incarnation reports restarts=1).
  wait_for sh -c "'$BIN/troupe-top' --topology '$WORK/t.yaml' --once | awk '\$1==\"$victim\" && \$5==\"ready\" && \$6==1' | grep -q ." \
    || { "$BIN/troupe-top" --topology "$WORK/t.yaml" --once; fail "top does not count the $victim restart"; }
done

# Wedged: SIGSTOP the router; heartbeats stop; liveness 3 x 200 ms -> killed and restarted.
old=$(pgrep -f -- "troupe-router --topology $WORK/t.yaml" | head -1)
t0=$(date +%s%N)
kill -STOP "$old"
wait_for grep -q "router (pid $old) missed 3 heartbeats" "$WORK/supervisor.log" || { cat "$WORK/supervisor.log"; fail "wedged router not detected"; }
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
note "SIGSTOP router detected as wedged in $ms ms"
[ "$ms" -lt 2000 ] || fail "wedge detection took $ms ms"
wait_for grep -q "router ready in .*restarted" "$WORK/supervisor.log" || fail "router not restarted after wedge"
"$BIN/troupe-top" --topology "$WORK/t.yaml" --once
echo "PASS kill9_restart"
