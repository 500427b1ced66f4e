# A stopped cluster leaves nothing of its own in its run directory: the supervisor, once every
# actor is reaped, removes the ipc socket files (control, stats, every inbox), the default key
# directory and supervisor.pid, and the directory it made. libzmq leaves a socket's file behind
# even on a clean close, so every one of them stayed after a clean stop (exit 0), and after any
# other. Cases: a clean stop (SIGTERM); a stop where a wedged actor has to be SIGKILLed (exit 1;
# it cannot remove its own), after another actor was killed with -9 and restarted; CURVE (the
# keys directory goes too); a second supervisor of the running cluster, refused by the lock,
# removes nothing of the first, which still serves; a run directory the user made, with a file of
# theirs and the cache-manager's disk tier in it: those stay, with the directory.
. "$(dirname "$0")/lib.sh"
R=$WORK/run

# stop_cluster SIGNAL EXPECTED-EXIT: stops the running supervisor, checks its exit status.
stop_cluster() {
  local rc=0
  kill "-$1" "$SUP_PID"
  wait "$SUP_PID" || rc=$?
  SUP_PID=
  [ "$rc" -eq "$2" ] || { tail -20 "$WORK/supervisor.log"; fail "supervisor exit $rc after SIG$1, expected $2"; }
}
# socks: the socket files in the run directory
socks() { find "$R" -type s 2>/dev/null | wc -l; }
# gone WHAT: the run directory no longer exists
gone() {
  [ ! -e "$R" ] || { ls -laR "$R"; fail "$1: the run directory is still there"; }
  note "$1: run directory removed"
}

make_topology "$WORK/t.yaml"
# serves TOPOLOGY: a request to its router ends in done
serves() {
  timeout 30 "$BIN/troupe-client" --endpoint "$(grep '^  client:' "$1" | awk '{print $2}')" --json submit --ids 1,2,3 \
    --max-tokens 2 | grep -q '"type":"done"'
}

# A clean stop.
start_cluster "$WORK/t.yaml"
n=$(socks)
note "running: $n sockets in the run directory: $(ls "$R" | tr '\n' ' ')"
[ "$n" -ge 8 ] || fail "expected control, stats and 6 inboxes in the run directory, found $n sockets"
stop_cluster TERM 0
gone "clean stop"

# An actor killed (-9, restarted), then one that has to be SIGKILLed at the stop.
GRACE_S=1 make_topology "$WORK/t1.yaml"
start_cluster "$WORK/t1.yaml"
before=$(grep -c " router ready in " "$WORK/supervisor.log" || true)
kill -9 "$(pgrep -f -- "troupe-router --topology $WORK/t1.yaml")"
wait_for bash -c "[ \$(grep -c ' router ready in ' '$WORK/supervisor.log') -gt $before ]" || fail "the router was not restarted"
kill -STOP "$(pgrep -f -- "troupe-decode --topology $WORK/t1.yaml")"
stop_cluster TERM 1
grep -q "decode did not stop within .*SIGKILL" "$WORK/supervisor.log" || fail "decode was not SIGKILLed at the stop"
gone "stop with a SIGKILL"

# CURVE: the generated keys are in <run_dir>/keys while the cluster runs.
mkdir -p "$WORK/keys"
for k in server alice; do "$BIN/troupe-keygen" "$WORK/keys/$k" >/dev/null; done
cp "$WORK/keys/alice.pub" "$WORK/keys/clients"
make_topology "$WORK/t2.yaml" "security:
  curve_server_public: $WORK/keys/server.pub
  curve_server_secret: $WORK/keys/server.key
  curve_clients: $WORK/keys/clients"
start_cluster "$WORK/t2.yaml"
ls "$R"/keys/*.key >/dev/null 2>&1 || fail "no generated keys in $R/keys"
stop_cluster INT 0
gone "CURVE"

# A second supervisor of the running cluster: refused, and the first keeps every file and serves.
start_cluster "$WORK/t.yaml"
n=$(socks)
rc=0
timeout 30 "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" >"$WORK/second.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat "$WORK/second.log"; fail "the second supervisor exited $rc, expected 2"; }
grep -q "already running" "$WORK/second.log" || fail "the second supervisor did not say the cluster runs"
[ "$(socks)" -eq "$n" ] && [ -s "$R/supervisor.pid" ] || { ls -la "$R"; fail "the refused supervisor removed files of the running one"; }
serves "$WORK/t.yaml" || fail "the running cluster does not serve after the refused start"
note "a second supervisor refused (exit 2): the first's $n sockets and supervisor.pid kept; it serves"
stop_cluster TERM 0
gone "after the refused start"

# A run directory of the user's, with their file and the disk tier in it.
mkdir -p "$R"
echo mine >"$R/notes.txt"
make_topology "$WORK/t3.yaml" "cache:" "  host_store_blocks: 8" "  disk_dir: $R/kvdisk" "  disk_bytes: 4194304"
start_cluster "$WORK/t3.yaml"
serves "$WORK/t3.yaml" || fail "the cluster with a disk tier does not serve"
stop_cluster TERM 0
left=$(ls -A "$R" | tr '\n' ' ')
note "user's run directory after the stop: $left"
[ "$left" = "kvdisk notes.txt " ] || { ls -laR "$R"; fail "expected only kvdisk and notes.txt left, found: $left"; }
[ "$(cat "$R/notes.txt")" = mine ] || fail "the user's file changed"
[ -n "$(ls -A "$R/kvdisk")" ] || fail "the disk tier's files are gone"
[ "$(socks)" -eq 0 ] || fail "socket files left"
echo "PASS run_dir_clean"
