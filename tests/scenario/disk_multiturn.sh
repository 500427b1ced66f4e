# The disk tier under a multi-turn workload whose working set (12 conversations of up to 8 blocks,
# round-robin) is more than 10x the host store (8 blocks) and larger than the workers' pools (48):
# the same workload without and with cache.disk_dir. With the disk tier later turns hit blocks
# read back from disk (fetch_hits_disk_total > 0, cached tokens > 0 on later turns) and nothing is
# refused as corrupt. Every request's cached tokens are split by source (device, host, disk) adding
# up to cached_tokens; without the disk tier none come from disk, with it some do, and no more than
# the cache-manager served from each tier. Hit rates and TTFTs of both runs are printed (reported,
# not asserted: timing).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/disk_lib.bash"
W="limits: |  kv_blocks: 48|  max_batch: 4|cache:|  host_store_blocks: 8"
IFS='|' read -r -a base <<<"$W"

MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 make_topology "$WORK/mem.yaml" "${base[@]}"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/mem.yaml"
disk_workload "$WORK/mem.yaml" "$WORK/mem.json"
stop_cluster

MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 make_topology "$WORK/disk.yaml" "${base[@]}" \
  "  disk_dir: $WORK/kvdisk" "  disk_bytes: 4194304"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/disk.yaml"
disk_workload "$WORK/disk.yaml" "$WORK/disk.json"
sleep 1.2   # a stats interval
$PY - "$BIN" "$WORK/disk.yaml" "$WORK/mem.json" "$WORK/disk.json" <<'PY'
import json, sys
from disk_lib import summary, cm_metrics
bin_dir, topo = sys.argv[1:3]
mem, disk = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
sm, sd = summary(mem), summary(disk)
for name, s in (("host store only", sm), ("with the disk tier", sd)):
    print(f"{name:20s}: turns 2-3 hit rate {s['hit_rate']:.3f} ({s['cached']}/{s['prompt']} tokens: device "
          f"{s['device']}, host {s['host']}, disk {s['disk']}), TTFT mean {s['ttft_mean_ms']:.1f} ms, p50 "
          f"{s['ttft_p50_ms']} ms over {s['requests']} requests")
m = cm_metrics(bin_dir, topo, ["fetch_hits_disk_total", "fetch_hits_host_total", "disk_spills_total",
                               "disk_reads_total", "disk_read_ms_max", "disk_blocks_used", "disk_bytes_used",
                               "disk_dropped_corrupt_total", "disk_dropped_foreign_total", "disk_spills_shed_total"])
print("cache-manager: " + ", ".join(f"{k} {v:g}" for k, v in m.items()))
assert m["disk_spills_total"] > 0 and m["disk_reads_total"] > 0, m
assert m["fetch_hits_disk_total"] > 0, m
assert m["disk_dropped_corrupt_total"] == 0 and m["disk_dropped_foreign_total"] == 0, m
assert sd["cached"] > 0, sd
# By source: the disk's tokens only with a disk tier, and never more than the blocks it served (each
# block read back counts as the disk's at its first fetch; a worker may leave a fetched block unused).
assert sum(r["disk"] for r in mem) == 0, "tokens from disk without a disk tier"
total = {k: sum(r[k] for r in disk) for k in ("device", "host", "disk")}
assert total["disk"] > 0, total
assert total["disk"] <= 16 * m["fetch_hits_disk_total"], (total, m)
assert total["host"] <= 16 * m["fetch_hits_host_total"], (total, m)
assert all(r["cached"] <= r["prompt"] for r in disk), disk
PY
"$BIN/troupe-top" --topology "$WORK/disk.yaml" --once | sed -n '/^KV CACHE/,$p' | tee "$WORK/top.txt"
grep -qE "^cache-manager +disk +[0-9]+" "$WORK/top.txt" || fail "troupe-top shows no disk tier line"
grep -q "refused corrupt" "$WORK/top.txt" || fail "troupe-top shows no disk traffic line"
# The same counters on Prometheus /metrics (the monitor exports every metric an actor publishes).
mp=$(grep 'metrics:' "$WORK/disk.yaml" | sed 's|.*:||')
$PY - "$mp" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
for name in ("troupe_disk_blocks_used", "troupe_disk_bytes_used", "troupe_fetch_hits_disk_total", "troupe_fetch_hits_host_total",
             "troupe_disk_spills_total", "troupe_disk_reads_total", "troupe_disk_read_ms", "troupe_disk_dropped_corrupt_total",
             "troupe_disk_dropped_foreign_total", "troupe_disk_spills_shed_total", "troupe_host_bytes_used"):
    assert any(l.startswith(name + "{") for l in body.splitlines()), f"{name} missing from /metrics"
print("/metrics carries the disk tier's samples")
PY
echo "PASS disk_multiturn"
