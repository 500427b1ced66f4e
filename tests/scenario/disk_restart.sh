# The whole cluster stopped and started again, two ways:
# - a graceful stop (SIGTERM): the cache-manager writes what its memory holds to the disk tier as it
#   drains, so both a conversation pinned for a day (prompt_cache_key, cache_retention 1d) and an
#   unpinned one find their history cached at their next turn;
# - kill -9 of every process: only what was on disk survives: the pinned conversation (its blocks
#   are written through as they arrive) finds its history cached, the unpinned one nothing.
# Either way the blocks come from the file the cache-manager read back at start (disk_blocks_loaded),
# and the requests' usage says so: those second turns' cached tokens are all from disk, while a
# second turn on the live cluster, before any restart, finds its history in the prefill worker's
# own pool (all from the device), and a third turn after the restart finds most of it there too.
# Every split adds up to cached_tokens.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/disk_lib.bash"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 make_topology "$WORK/t.yaml" \
  "limits:" "  kv_blocks: 48" "  max_batch: 4" "cache:" "  host_store_blocks: 64" \
  "  disk_dir: $WORK/kvdisk" "  disk_bytes: 4194304"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
turn() {  # turn STATE.json KEY|'' : the next turn of the conversation in STATE.json; prints cached and
          # prompt tokens, then the cached tokens from the device, the host store and the disk
  $PY - "$ep" "$1" "$2" <<'PY'
import json, os, random, sys
from disk_lib import cached_split
from servelib import run_one
ep, state, key = sys.argv[1:4]
rng = random.Random(hash(state) & 0xffff)
hist = json.load(open(state)) if os.path.exists(state) else [rng.randrange(3, 500) for _ in range(64)]
hist += [rng.randrange(3, 500) for _ in range(16)]
kw = dict(prompt_cache_key=key, cache_retention="1d") if key else {}
toks, d, _ = run_one(ep, hist, max_tokens=8, **kw)
assert d["type"] == "done", d
json.dump(hist + toks, open(state, "w"))
print(d["usage"]["cached_tokens"], d["usage"]["prompt_tokens"], *cached_split(d["usage"]))
PY
}
read -r c1 _ < <(turn "$WORK/pinned.json" conv-a); read -r u1 _ < <(turn "$WORK/plain.json" "")
[ "$c1" = 0 ] && [ "$u1" = 0 ] || fail "first turns found something cached ($c1, $u1)"
# A second turn on the live cluster: its history's blocks are still in the prefill worker's pool.
read -r l1 _ < <(turn "$WORK/live.json" ""); read -r l2 lp2 ldev lhost ldisk < <(turn "$WORK/live.json" "")
echo "live second turn: cached $l2 of $lp2 prompt tokens: device $ldev, host $lhost, disk $ldisk"
[ "$l1" = 0 ] && [ "$l2" -ge 80 ] || fail "the live conversation's history was not cached ($l1, $l2)"
[ "$ldev" = "$l2" ] || fail "a live second turn's cached tokens did not all come from the worker's pool ($ldev of $l2)"
# The pinned blocks are written through as they arrive: wait until they are on disk.
persisted() {
  $PY - "$BIN" "$WORK/t.yaml" "$1" <<'PY'
import sys
from disk_lib import cm_metrics
m = cm_metrics(*sys.argv[1:3], ["disk_persists_total", "disk_io_in_flight"])
sys.exit(0 if m["disk_persists_total"] >= int(sys.argv[3]) and m["disk_io_in_flight"] == 0 else 1)
PY
}
wait_for persisted 5 || fail "pinned blocks never reached the disk"
# After a start the router learns the store's index from the cache-manager's announcement, which
# may land after the cluster is ready: a turn routed before it would get no hint and compute its
# history. Wait for it: the router knows at least as many blocks as were read back from disk.
indexed() {
  $PY - "$BIN" "$WORK/t.yaml" <<'PY'
import sys
from disk_lib import cm_metrics
from servelib import metric, top
try:
    loaded = cm_metrics(*sys.argv[1:3], ["disk_blocks_loaded"])["disk_blocks_loaded"]
    routers = [a for a in top(*sys.argv[1:3]).values() if a["role"] == "router"]
    ok = loaded > 0 and routers and all(metric(r, "prefix_index_blocks") >= loaded for r in routers)
except (StopIteration, KeyError):   # no stats of theirs yet
    ok = False
sys.exit(0 if ok else 1)
PY
}
stop_cluster
grep -q "blocks of memory written at shutdown" "$WORK/supervisor.log" || fail "the cache-manager wrote nothing as it drained"
note "cluster stopped (SIGTERM); starting it again"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
grep -q "blocks read back" "$WORK/supervisor.log" || fail "the cache-manager did not read its disk back"
wait_for indexed || fail "the router never learned the blocks read back from disk"
read -r c2 p2 _ _ cdisk < <(turn "$WORK/pinned.json" conv-a); read -r u2 q2 _ _ udisk < <(turn "$WORK/plain.json" "")
echo "after a graceful stop: second turns cached $c2 of $p2 prompt tokens (pinned; $cdisk from disk), $u2 of $q2" \
  "(unpinned; $udisk from disk)"
[ "$c2" -ge 80 ] || fail "the pinned conversation's history was not cached after the restart ($c2)"
[ "$u2" -ge 80 ] || fail "the unpinned conversation's history was not written at shutdown ($u2)"
# Nothing was in any pool or in memory after the restart: every cached token came from disk.
[ "$cdisk" = "$c2" ] && [ "$udisk" = "$u2" ] || fail "second turns after the restart: not all from disk ($cdisk of $c2, $udisk of $u2)"
# The next turn on the live cluster: what the last turn fetched or computed is in the pool now.
read -r c3 p3 cdev chost cdisk < <(turn "$WORK/pinned.json" conv-a)
echo "third turn: cached $c3 of $p3 prompt tokens: device $cdev, host $chost, disk $cdisk"
[ "$cdev" -ge "$c2" ] || fail "a third turn's history did not come from the worker's pool ($cdev, the last turn's $c2)"
sleep 1.2
$PY - "$BIN" "$WORK/t.yaml" <<'PY'
import sys
from disk_lib import cm_metrics
m = cm_metrics(*sys.argv[1:3], ["disk_blocks_loaded", "fetch_hits_disk_total", "disk_dropped_corrupt_total"])
print("cache-manager after the restart: " + ", ".join(f"{k} {v:g}" for k, v in m.items()))
assert m["disk_blocks_loaded"] >= 10 and m["fetch_hits_disk_total"] >= 10 and m["disk_dropped_corrupt_total"] == 0, m
PY

# kill -9 of the whole cluster: two new conversations, then every process of this test killed.
before=$($PY - "$BIN" "$WORK/t.yaml" <<'PY'
import sys
from disk_lib import cm_metrics
print(int(cm_metrics(*sys.argv[1:3], ["disk_persists_total"])["disk_persists_total"]))
PY
)
read -r c1 _ < <(turn "$WORK/pinned2.json" conv-b); read -r u1 _ < <(turn "$WORK/plain2.json" "")
[ "$c1" = 0 ] && [ "$u1" = 0 ] || fail "first turns found something cached ($c1, $u1)"
wait_for persisted $((before + 5)) || fail "the second pinned conversation's blocks never reached the disk"
# Frozen first, all of them, then killed: an actor that saw its supervisor die first would drain
# (and write its memory to disk) before its own SIGKILL came. The drain runs on an actor's main
# loop, frozen once kill -STOP returns (see stopped in lib.sh); the I/O threads that may run on
# until their group stop only finish jobs queued before it, so there is nothing to wait for.
pkill -STOP -f -- "--topology $WORK/" || true
pkill -KILL -f -- "--topology $WORK/" || true
wait "$SUP_PID" 2>/dev/null || true
SUP_PID=
note "every process killed (SIGKILL); starting the cluster again"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
wait_for indexed || fail "the router never learned the blocks read back from disk"
read -r c3 p3 _ _ cdisk < <(turn "$WORK/pinned2.json" conv-b); read -r u3 q3 _ < <(turn "$WORK/plain2.json" "")
echo "after kill -9 of everything: second turns cached $c3 of $p3 prompt tokens (pinned; $cdisk from disk), $u3 of" \
  "$q3 (unpinned)"
[ "$c3" -ge 80 ] || fail "the pinned conversation's history did not survive kill -9 ($c3)"
[ "$cdisk" = "$c3" ] || fail "the pinned conversation's second turn after kill -9: not all from disk ($cdisk of $c3)"
[ "$u3" = 0 ] || fail "an unpinned conversation kept blocks that were only in memory ($u3)"
echo "PASS disk_restart"
