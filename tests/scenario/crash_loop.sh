# An actor that crashes at start hits the restart limit; the supervisor stops the whole
# cluster with a clear report and a non-zero exit (3), and leaves no process behind.
. "$(dirname "$0")/lib.sh"
MAX_RESTARTS=3 PERIOD_S=10 make_topology "$WORK/t.yaml"
mkdir -p "$WORK/bin"
for b in "$BIN"/troupe-*; do ln -s "$b" "$WORK/bin/"; done
rm "$WORK/bin/troupe-decode"
printf '#!/bin/sh\necho "decode: cannot start (simulated broken install)" >&2\nexit 1\n' > "$WORK/bin/troupe-decode"
chmod +x "$WORK/bin/troupe-decode"
t0=$(date +%s%N)
rc=0
timeout 60 "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" --bin-dir "$WORK/bin" >"$WORK/sup.log" 2>&1 || rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
cat "$WORK/sup.log" | tail -15
note "supervisor gave up with exit $rc after $ms ms"
[ "$rc" -eq 3 ] || fail "exit code $rc, expected 3"
grep -q "more than 3 restarts in 10 s" "$WORK/sup.log" || fail "no clear give-up message"
grep -qE "decode +decode +3 +exit 1" "$WORK/sup.log" || fail "report does not show decode's 3 restarts and exit 1"
sleep 0.2
pgrep -f -- "--topology $WORK/t.yaml" && fail "processes left behind"
echo "PASS crash_loop"
