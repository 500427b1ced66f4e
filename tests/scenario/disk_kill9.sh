# kill -9 of the cache-manager while it spills to disk, then bytes flipped in the disk tier's file:
# nothing corrupt is ever served. A reference run of the multi-turn workload gives each answer
# (greedy); a second run kills the cache-manager mid-run (the supervisor restarts it, and it reads
# its file back); then the cluster is stopped, a payload byte is flipped in every other record and
# one record header is broken, and after a new start the same workload must give the reference
# answers exactly, with the flipped blocks refused and counted (disk_dropped_corrupt_total) and
# the intact ones still served (fetch_hits_disk_total).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/disk_lib.bash"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 make_topology "$WORK/t.yaml" \
  "limits:" "  kv_blocks: 48" "  max_batch: 4" "cache:" "  host_store_blocks: 8" \
  "  disk_dir: $WORK/kvdisk" "  disk_bytes: 4194304"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
disk_workload "$WORK/t.yaml" "$WORK/ref.json"
pid=$(actor_pid "$WORK/t.yaml" cache-manager)
[ -n "$pid" ] || fail "no cache-manager pid"
disk_workload "$WORK/t.yaml" "$WORK/run2.json" &
load=$!
sleep 0.5
kill -KILL "$pid"
note "cache-manager (pid $pid) killed during the second run"
wait "$load" || fail "the workload failed across the cache-manager's kill -9"
wait_for grep -q "cache-manager ready in .*restarted" "$WORK/supervisor.log" || fail "cache-manager not restarted"
grep -q "blocks read back" "$WORK/supervisor.log" || fail "the restarted cache-manager did not read its disk back"
stop_cluster
$PY - "$WORK/kvdisk/blocks.kvd" <<'PY'
import sys
from disk_lib import disk_records, flip
path = sys.argv[1]
slot_bytes, recs = disk_records(path)
assert len(recs) >= 8, f"only {len(recs)} records on disk"
for off in recs[0::2]:
    flip(path, off + 128 + 100)      # a byte of the block: its CRC no longer matches
flip(path, recs[1] + 9)              # a byte of one record header's block hash
print(f"{len(recs)} records on disk: {len(recs[0::2])} payloads and 1 header flipped")
PY
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
disk_workload "$WORK/t.yaml" "$WORK/run3.json"
sleep 1.2
$PY - "$BIN" "$WORK/t.yaml" "$WORK/ref.json" "$WORK/run3.json" <<'PY'
import json, sys
from disk_lib import cm_metrics, summary
bin_dir, topo = sys.argv[1:3]
ref, run3 = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
bad = [(a["conv"], a["turn"]) for a, b in zip(ref, run3) if a["tokens"] != b["tokens"]]
assert not bad, f"answers differ from the reference (a corrupt block served?): {bad}"
m = cm_metrics(bin_dir, topo, ["disk_blocks_loaded", "disk_dropped_corrupt_total", "fetch_hits_disk_total",
                               "disk_reads_total"])
print(f"after the flips: {len(run3)} answers equal the reference; hit rate {summary(run3)['hit_rate']:.3f}; "
      + ", ".join(f"{k} {v:g}" for k, v in m.items()))
assert m["disk_dropped_corrupt_total"] >= 2, m     # the header at start, payloads when read
assert m["fetch_hits_disk_total"] > 0, m
PY
echo "PASS disk_kill9"
