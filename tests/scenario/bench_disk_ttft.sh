# tools/bench-disk-ttft.sh end to end on the CPU (a smoke run that keeps the script from rotting):
# a 256-token prompt computed and pinned, the cluster stopped and started again, the same prompt
# fetched from the disk tier. The script must succeed, and its summary must show the prefix coming
# back from the disk (every full block but the last read and cached) and both recomputes cached
# nothing. Speed is not checked.
. "$(dirname "$0")/lib.sh"
BIN=$BIN BACKEND=cpu MODEL=$ROOT/tests/fixtures/models/qwen3-f32 IN_LEN=256 \
  "$ROOT/tools/bench-disk-ttft.sh" "$WORK/out" >"$WORK/table.txt" 2>"$WORK/bench.log" \
  || { cat "$WORK/bench.log" "$WORK/table.txt"; fail "bench-disk-ttft.sh failed"; }
cat "$WORK/table.txt"
$PY - "$WORK/out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["failures"] == [], s["failures"]
assert s["in_len"] == 256 and s["disk_read_mib_s"] > 0 and len(s["rounds"]) == 1, s
r = s["rounds"][0]
assert r["from_disk_cached"] == 240, r                                    # 15 of 16 blocks: the last is computed
assert r["from_disk_cached_disk"] in (None, 240), r                       # the split, where the cluster reports it
assert r["disk_blocks_read"] >= 15 and r["disk_blocks_served"] >= 15, r
assert r["page_cache_resident_bytes"] >= 0, r
assert s["recompute_cached"] == [0, 0], s["recompute_cached"]
assert len(s["recompute_ttft_ms"]) == 2 and len(s["from_disk_ttft_ms"]) == 1, s
assert s["device_cached"] == 240, s
PY
[ ! -e "$WORK/out/kvdisk/blocks.kvd" ] || fail "the disk tier's file was left behind"
echo "PASS bench_disk_ttft"
