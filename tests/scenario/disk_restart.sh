# The whole cluster stopped and started again: a conversation pinned for a day (prompt_cache_key,
# cache_retention 1d) finds its history cached at its next turn, served from the disk tier's file
# the cache-manager read back at start (disk_blocks_loaded); an unpinned one, whose blocks were
# only in memory, finds nothing.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/disk_lib.bash"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 make_topology "$WORK/t.yaml" \
  "limits:" "  kv_blocks: 48" "  max_batch: 4" "cache:" "  host_store_blocks: 64" \
  "  disk_dir: $WORK/kvdisk" "  disk_bytes: 4194304"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
turn() {  # turn STATE.json KEY|'' : the next turn of the conversation in STATE.json; prints cached tokens
  $PY - "$ep" "$1" "$2" <<'PY'
import json, os, random, sys
from servelib import run_one
ep, state, key = sys.argv[1:4]
rng = random.Random(hash(state) & 0xffff)
hist = json.load(open(state)) if os.path.exists(state) else [rng.randrange(3, 500) for _ in range(64)]
hist += [rng.randrange(3, 500) for _ in range(16)]
kw = dict(prompt_cache_key=key, cache_retention="1d") if key else {}
toks, d, _ = run_one(ep, hist, max_tokens=8, **kw)
assert d["type"] == "done", d
json.dump(hist + toks, open(state, "w"))
print(d["usage"]["cached_tokens"], d["usage"]["prompt_tokens"])
PY
}
read -r c1 _ < <(turn "$WORK/pinned.json" conv-a); read -r u1 _ < <(turn "$WORK/plain.json" "")
[ "$c1" = 0 ] && [ "$u1" = 0 ] || fail "first turns found something cached ($c1, $u1)"
# The pinned blocks are written through as they arrive: wait until they are on disk.
wait_for $PY - "$BIN" "$WORK/t.yaml" <<'PY' || fail "pinned blocks never reached the disk"
import sys
from disk_lib import cm_metrics
m = cm_metrics(*sys.argv[1:3], ["disk_persists_total", "disk_io_in_flight", "disk_blocks_used"])
sys.exit(0 if m["disk_persists_total"] >= 5 and m["disk_io_in_flight"] == 0 and m["disk_blocks_used"] >= 5 else 1)
PY
stop_cluster
note "cluster stopped; starting it again"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
grep -q "blocks read back" "$WORK/supervisor.log" || fail "the cache-manager did not read its disk back"
read -r c2 p2 < <(turn "$WORK/pinned.json" conv-a); read -r u2 _ < <(turn "$WORK/plain.json" "")
echo "after the restart: the pinned conversation's second turn: $c2 of $p2 prompt tokens cached (its first" \
  "turn's 80-token prompt, 5 blocks); the unpinned one's: $u2"
[ "$c2" -ge 64 ] || fail "the pinned conversation's history was not cached after the restart ($c2)"
[ "$u2" = 0 ] || fail "an unpinned conversation kept blocks that were only in memory ($u2)"
sleep 1.2
$PY - "$BIN" "$WORK/t.yaml" <<'PY'
import sys
from disk_lib import cm_metrics
m = cm_metrics(*sys.argv[1:3], ["disk_blocks_loaded", "fetch_hits_disk_total", "disk_dropped_corrupt_total"])
print("cache-manager after the restart: " + ", ".join(f"{k} {v:g}" for k, v in m.items()))
assert m["disk_blocks_loaded"] >= 5 and m["fetch_hits_disk_total"] >= 4 and m["disk_dropped_corrupt_total"] == 0, m
PY
echo "PASS disk_restart"
