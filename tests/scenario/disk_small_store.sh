# A fetch larger than the host store, from the disk tier: a pinned conversation's 16-block history
# is on disk only (the cluster stopped and started again) and the cache-manager's memory holds 8
# blocks. Its second turn gets the 8 leading blocks (128 cached tokens, all from disk), each read
# from disk once: a block read into the host store is kept there until the fetch is answered, and
# the fetch reads no block it could not hold (it used to read the disk in a loop for its whole
# wait, every later block evicting an earlier one, and be served 0 or 1 block). The answer is the
# same as the prompt computed from nothing (another tenant: nothing shared). Then two such fetches
# at once, of two conversations, share the 8 slots: each is served a leading run of its blocks
# from disk (8 of them at least), each reads at most its 8 leading blocks, once, and both are
# answered.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/disk_lib.bash"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 make_topology "$WORK/t.yaml" \
  "limits:" "  kv_blocks: 96" "  max_batch: 4" "cache:" "  host_store_blocks: 8" \
  "  disk_dir: $WORK/kvdisk" "  disk_bytes: 4194304"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
# first turns: three pinned conversations of 256 prompt tokens (16 blocks) each, on disk once their
# blocks reach the host store (which keeps only the last 8 of each): written through when their pin
# came first, spilled as they leave memory and pinned there when it comes after them.
$PY - "$ep" "$WORK" <<'PY'
import json, random, sys
from servelib import run_one
ep, work = sys.argv[1:3]
for name in ("a", "b", "c"):
    rng = random.Random(name)
    hist = [rng.randrange(3, 500) for _ in range(256)]
    toks, d, _ = run_one(ep, hist, max_tokens=8, prompt_cache_key=f"conv-{name}", cache_retention="1d")
    assert d["type"] == "done" and d["usage"]["cached_tokens"] == 0, d
    json.dump(hist + toks + [rng.randrange(3, 500) for _ in range(16)], open(f"{work}/{name}.json", "w"))
PY
persisted() {
  $PY - "$BIN" "$WORK/t.yaml" <<'PY'
import sys
from disk_lib import cm_metrics
m = cm_metrics(*sys.argv[1:3], ["disk_blocks_pinned", "disk_io_in_flight"])
sys.exit(0 if m["disk_blocks_pinned"] >= 48 and m["disk_io_in_flight"] == 0 else 1)
PY
}
wait_for persisted 10 || fail "the pinned conversations' 48 blocks never reached the disk"
indexed() {   # the router knows the blocks read back from disk (its hints name them)
  $PY - "$BIN" "$WORK/t.yaml" <<'PY'
import sys
from disk_lib import cm_metrics
from servelib import metric, top
try:
    loaded = cm_metrics(*sys.argv[1:3], ["disk_blocks_loaded"])["disk_blocks_loaded"]
    routers = [a for a in top(*sys.argv[1:3]).values() if a["role"] == "router"]
    ok = loaded >= 48 and routers and all(metric(r, "prefix_index_blocks") >= loaded for r in routers)
except (StopIteration, KeyError):   # no stats of theirs yet
    ok = False
sys.exit(0 if ok else 1)
PY
}
stop_cluster
note "cluster stopped (SIGTERM); starting it again: the histories are on disk only"
TROUPE_PREFILL_FETCH=always start_cluster "$WORK/t.yaml"
wait_for indexed 10 || fail "the router never learned the blocks read back from disk"
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$WORK" <<'PY'
import json, sys, threading, time
from disk_lib import cached_split, cm_metrics
from servelib import run_one
ep, bin_dir, topo, work = sys.argv[1:5]
NAMES = ["disk_reads_total", "fetch_hits_disk_total", "fetch_hits_total", "disk_promotions_failed_total",
         "disk_dropped_corrupt_total", "fetches_parked_total"]

def metrics():
    time.sleep(1.2)   # the cache-manager's stats go out once a second
    return cm_metrics(bin_dir, topo, NAMES)

def turn(name, out, tenant=None):
    hist = json.load(open(f"{work}/{name}.json"))
    kw = dict(tenant=tenant) if tenant else dict(prompt_cache_key=f"conv-{name}", cache_retention="1d")
    toks, d, _ = run_one(ep, hist, max_tokens=8, **kw)
    assert d["type"] == "done", d
    out[name] = (d["usage"]["cached_tokens"], cached_split(d["usage"])[2], toks)

m0 = metrics()
got = {}
turn("a", got)
m1 = metrics()
cached, disk, toks = got["a"]
d = {k: m1[k] - m0[k] for k in NAMES}
print(f"second turn of a: cached {cached}, from disk {disk}; cache-manager: " + ", ".join(f"{k} +{v:g}" for k, v in d.items()))
assert cached == 128 and disk == 128, f"a fetch of 16 disk blocks into an 8-block store: cached {cached}, disk {disk} (want 128)"
assert d["disk_reads_total"] == 8, f"{d['disk_reads_total']:g} blocks read from disk for 8 served: read again and again"
assert d["fetch_hits_disk_total"] == 8 and d["fetch_hits_total"] == 8, d
assert d["disk_promotions_failed_total"] == 0 and d["disk_dropped_corrupt_total"] == 0, d
ref = {}
turn("a", ref, tenant="elsewhere")
assert ref["a"][0] == 0, f"another tenant's prompt found {ref['a'][0]} tokens cached"
assert toks == ref["a"][2], f"the answer on 8 blocks from disk {toks} differs from the prompt computed {ref['a'][2]}"

# Two at once: b and c, 16 disk blocks each, the 8 slots shared.
m2 = metrics()
both = {}
ts = [threading.Thread(target=turn, args=(n, both)) for n in ("b", "c")]
for t in ts:
    t.start()
for t in ts:
    t.join()
m3 = metrics()
d = {k: m3[k] - m2[k] for k in NAMES}
print("second turns of b and c at once: " + ", ".join(f"{n} cached {both[n][0]} (disk {both[n][1]})" for n in "bc") +
      "; cache-manager: " + ", ".join(f"{k} +{v:g}" for k, v in d.items()))
assert set(both) == {"b", "c"}, both
served = d["fetch_hits_disk_total"]
assert all(both[n][0] % 16 == 0 and both[n][1] == both[n][0] for n in "bc"), both
assert 8 <= served <= 16 and sum(both[n][0] for n in "bc") == 16 * served, (both, d)
# Each fetch reads within its window of 8 (the store's size), each block at most once; a fetch that
# finds every slot taken by the other's blocks and reads is answered at once, reading nothing.
assert served <= d["disk_reads_total"] <= 16, f"{d['disk_reads_total']:g} blocks read for two fetches of 16"
assert d["disk_dropped_corrupt_total"] == 0, d
for n in "bc":
    ref = {}
    turn(n, ref, tenant="elsewhere")
    assert both[n][2] == ref[n][2], f"{n}: the answer on blocks from disk differs from the prompt computed"
PY
echo "PASS disk_small_store"
