# tests/scenario/disk_lib.bash — shell helpers of the disk-tier scenarios, sourced after lib.sh (not a
# test itself: tests/run.sh runs every *.sh here).

# stop_cluster: a graceful stop of the running cluster (SIGTERM to the supervisor), waited for.
stop_cluster() {
  kill -TERM "$SUP_PID" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$SUP_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SUP_PID" 2>/dev/null && fail "the cluster did not stop within 15 s"
  wait "$SUP_PID" 2>/dev/null || true
  SUP_PID=
}

# disk_workload TOPOLOGY OUT.json: the multi-turn workload (12 conversations x 3 turns) as JSON.
disk_workload() {
  local ep
  ep=$(grep 'client:' "$1" | awk '{print $2}')
  $PY - "$ep" "$2" <<'PY'
import json, sys
from disk_lib import conversations
json.dump(conversations(sys.argv[1], n_conv=12, turns=3, sys_len=48, turn_len=16, out_len=8, seed=5), open(sys.argv[2], "w"))
PY
}
