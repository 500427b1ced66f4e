# A disk tier too small for what must go on it: 12 conversations pinned for a day on a host store of
# 8 blocks and a 1 MiB disk (36 slots of this model's blocks). Pinned blocks never give up their
# disk slots before their time, so once the disk is full of them further spills are shed and
# counted (disk_spills_shed_full_total), never a crash: every request completes and the
# cache-manager is never restarted. (With memory and disk both full of pinned blocks, disk blocks
# cannot come back through the host store: counted, disk_promotions_failed_total.)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/disk_lib.bash"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 make_topology "$WORK/t.yaml" \
  "limits:" "  kv_blocks: 48" "  max_batch: 4" "cache:" "  host_store_blocks: 8" \
  "  disk_dir: $WORK/kvdisk" "  disk_bytes: 1048576"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$WORK/run.json" <<'PY'
import json, sys
from disk_lib import conversations
json.dump(conversations(sys.argv[1], n_conv=12, turns=3, sys_len=48, turn_len=16, out_len=8, seed=9,
                        key="full", retention="1d"), open(sys.argv[2], "w"))
PY
sleep 1.2
$PY - "$BIN" "$WORK/t.yaml" "$WORK/run.json" <<'PY'
import json, sys
from disk_lib import cache_manager, summary
from servelib import metric
cm = cache_manager(*sys.argv[1:3])
m = {n: metric(cm, n) for n in ("disk_blocks_capacity", "disk_blocks_used", "disk_blocks_pinned",
                                "disk_spills_shed_full_total", "disk_promotions_failed_total")}
s = summary(json.load(open(sys.argv[3])))
print(f"restarts {cm['restarts']}, hit rate {s['hit_rate']:.3f}; " + ", ".join(f"{k} {v:g}" for k, v in m.items()))
assert cm["restarts"] == 0, cm["restarts"]
assert m["disk_blocks_used"] == m["disk_blocks_capacity"] == m["disk_blocks_pinned"] > 0, m
assert m["disk_spills_shed_full_total"] > 0, m
assert m["disk_spills_shed_full_total"] < 10000, m   # counted once per block refused, not in a loop
PY
echo "PASS disk_full"
