# A pinned prompt longer than the disk tier has I/O jobs (DISK_JOBS, 256 in actors/cache_manager.c)
# is written through to disk whole, and survives a kill -9 of the whole cluster. Its write-back
# brings 300 pinned blocks into the host store at once: the write-throughs past the free jobs must
# be owed and written as jobs come back, not dropped (they once were: disk_persists_total stopped
# at 256 and tools/bench-disk-ttft.sh waited for the 500 blocks of an 8,000-token prompt forever).
# Checks: all 300 written through (disk_persists_total) with some of them deferred
# (disk_persists_deferred_total > 0: this test does exceed the job pool) and none left owed; then
# every process killed, the cluster started again, and the same prompt finds every full block but
# the last cached, all from disk.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/disk_lib.bash"
N_BLOCKS=300
IN_LEN=$((N_BLOCKS * 16))
# The tests' qwen3-f32 shape (3 layers, 12 KiB bf16 blocks: fast on the CPU) with room for the
# prompt: its config with more positions, dummy weights.
mkdir -p "$WORK/model"
$PY - "$ROOT/tests/fixtures/models/qwen3-f32/config.json" "$WORK/model/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 8192
json.dump(c, open(sys.argv[2], "w"))
PY
MODEL_PATH=$WORK/model LOAD_FORMAT=dummy make_topology "$WORK/t.yaml" \
  "limits:" "  kv_blocks: $((2 * N_BLOCKS + 64))" "  max_batch: 4" "  max_model_len: $((IN_LEN + 64))" \
  "cache:" "  host_store_blocks: $((N_BLOCKS + 64))" "  disk_dir: $WORK/kvdisk" "  disk_bytes: 16777216"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
ask() {  # ask: the pinned prompt, one output token; prints cached and prompt tokens, then the split
  $PY - "$ep" "$IN_LEN" <<'PY'
import random, sys
from disk_lib import cached_split
from servelib import run_one
ep, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(20)
ids = [rng.randrange(3, 500) for _ in range(n)]
toks, d, _ = run_one(ep, ids, max_tokens=1, timeout_s=300, prompt_cache_key="long", cache_retention="1d")
assert d["type"] == "done", d
print(d["usage"]["cached_tokens"], d["usage"]["prompt_tokens"], *cached_split(d["usage"]))
PY
}
read -r c1 p1 _ < <(ask)
[ "$p1" = "$IN_LEN" ] && [ "$c1" = 0 ] || fail "the first turn: $c1 of $p1 tokens cached, not 0 of $IN_LEN"
# The write-through of every block, waited for (up to 30 s; it takes well under a second here).
persisted() {
  $PY - "$BIN" "$WORK/t.yaml" "$N_BLOCKS" <<'PY'
import sys
from disk_lib import cm_metrics
m = cm_metrics(*sys.argv[1:3], ["disk_persists_total", "disk_io_in_flight"])
sys.exit(0 if m["disk_persists_total"] >= int(sys.argv[3]) and m["disk_io_in_flight"] == 0 else 1)
PY
}
end=$((SECONDS + 30))
until persisted; do [ "$SECONDS" -lt "$end" ] || break; sleep 0.1; done
$PY - "$BIN" "$WORK/t.yaml" "$N_BLOCKS" <<'PY'
import sys
from disk_lib import cache_manager
from servelib import metric
cm = cache_manager(*sys.argv[1:3])
def get(name):   # -1: a build without the metric
    try:
        return metric(cm, name)
    except KeyError:
        return -1
m = {k: get(k) for k in ("disk_persists_total", "disk_persists_deferred_total", "disk_persists_owed",
                         "disk_spills_shed_total", "disk_io_in_flight", "host_blocks_pinned")}
print("after the first turn: " + ", ".join(f"{k} {v:g}" for k, v in m.items()))
n = int(sys.argv[3])
assert m["disk_persists_total"] == n, f"{m['disk_persists_total']:g} of the {n} pinned blocks written through"
assert m["disk_persists_owed"] == 0 and m["disk_io_in_flight"] == 0, m
assert m["disk_spills_shed_total"] == 0, m
assert m["disk_persists_deferred_total"] > 0, f"no write-through waited for an I/O job: the test no longer exceeds them ({m})"
PY
# kill -9 of everything, frozen first (an actor that saw its supervisor die would drain and write
# its memory to disk): only what was written through survives. The drain runs on an actor's main
# loop, frozen once kill -STOP returns (see stopped in lib.sh); the I/O threads that may run on
# until their group stop only finish jobs queued before it, so there is nothing to wait for.
pkill -STOP -f -- "--topology $WORK/" || true
pkill -KILL -f -- "--topology $WORK/" || true
wait "$SUP_PID" 2>/dev/null || true
SUP_PID=
note "every process killed (SIGKILL); starting the cluster again"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
grep -h "blocks read back" "$WORK/supervisor.log" | head -1
# The router learns what the disk holds from the cache-manager's announcement: wait for it.
indexed() {
  $PY - "$BIN" "$WORK/t.yaml" "$N_BLOCKS" <<'PY'
import sys
from servelib import metric, top
try:
    routers = [a for a in top(*sys.argv[1:3]).values() if a["role"] == "router"]
    ok = routers and all(metric(r, "prefix_index_blocks") >= int(sys.argv[3]) for r in routers)
except (StopIteration, KeyError):
    ok = False
sys.exit(0 if ok else 1)
PY
}
wait_for indexed || fail "the router never learned the $N_BLOCKS blocks read back from disk"
read -r c2 p2 _ _ cdisk < <(ask)
want=$(( (IN_LEN - 1) / 16 * 16 ))   # the block holding the last prompt token is computed
echo "after kill -9: $c2 of $p2 prompt tokens cached, $cdisk from disk"
[ "$c2" -ge "$want" ] || fail "the pinned prompt after kill -9: $c2 tokens cached, not >= $want"
[ "$cdisk" = "$c2" ] || fail "the pinned prompt after kill -9: not all from disk ($cdisk of $c2)"
echo "PASS disk_persist_long"
