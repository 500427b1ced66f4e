#!/usr/bin/env bash
# TTFT of a long prefix fetched from the cache-manager's disk tier against computing it again, with
# the disk's read bandwidth measured in the same run (issue 20's H200 figure; docs/kv-cache.md).
#
#   BACKEND=cuda tools/bench-disk-ttft.sh [OUT_DIR]     # the 8B shape, an 8,000-token prefix
#   BACKEND=cpu  tools/bench-disk-ttft.sh [OUT_DIR]     # a smoke run: a small model, 512 tokens
#
# 1. troupe-bench-disk in the disk tier's directory, with the model's KV block size: write the
#    prefix's number of blocks, drop them from the page cache (posix_fadvise), read them back.
# 2. A cluster (supervisor) with the disk tier on: a warm-up prompt, then prompt A (IN_LEN tokens,
#    never seen: computed, the first "recompute" TTFT), pinned for 24 h with a prompt_cache_key, so
#    its blocks are written through to disk as they reach the host store. The cluster is stopped
#    (SIGTERM) once they are on disk.
# 3. ROUNDS times: the cluster started again. The workers' KV pools and the host store start empty
#    and the disk tier reads its index back, so only the disk holds A. A warm-up prompt of the same
#    length; the disk file dropped from the page cache (posix_fadvise; /proc/sys/vm/drop_caches as
#    root when that was not enough) and what stays resident measured (mincore); A again: a "from
#    disk" TTFT and usage.cached_tokens (the blocks the cache-manager read from disk meanwhile
#    counted from its metrics); then C, a never-seen prompt of IN_LEN tokens: another "recompute"
#    TTFT; in the last round A once more, from the prefill worker's own pool now ("device").
#    The cluster stopped again.
# 4. A table; a JSON summary in OUT_DIR/summary.json. Exit status 1 when a step failed: A after a
#    restart found less than its whole prefix cached (every full block but the one that holds the
#    last prompt token, which may be computed; its leading HOST_BLOCKS blocks when the host store is
#    smaller), the disk tier read fewer blocks than that, or more than it served (blocks read again,
#    or too late for the fetch), or a recompute found anything cached. With FETCH=cost the first
#    two are the cost model's choice, not failures: the table says what it chose (blocks read,
#    blocks declined because computing them is faster).
#
# Environment:
#   BACKEND        cpu (default) or cuda (prefill and decode workers on GPU 0)
#   MODEL          the checkpoint (default tests/fixtures/models/llama-3.1-8b-shape on cuda,
#                  models/kjv-tiny on cpu, or tests/fixtures/models/qwen3-demo-shape without it)
#   LOAD_FORMAT    dummy (random weights: the default when MODEL has no *.safetensors, and on cuda)
#                  or auto
#   DTYPE KV_DTYPE model.dtype (default bf16 on cuda, f32 on cpu) and model.kv_dtype (default bf16)
#   IN_LEN         prompt tokens (default 8000 on cuda, 512 on cpu)
#   ROUNDS         restarts, each with one from-disk and one recompute TTFT (default 3 on cuda, 1 on cpu)
#   DISK_DIR       cache.disk_dir (default OUT_DIR/kvdisk): the disk measured. It must not hold a
#                  blocks.kvd yet; the run's is removed after it unless KEEP_DISK=1
#   DISK_BYTES     cache.disk_bytes (default 4x the prefix's slots, at least 64 MiB)
#   HOST_BLOCKS    cache.host_store_blocks (default 2x the prefix's blocks + 64: a disk fetch is
#                  served through the host store, which must hold the whole prefix; a smaller store
#                  serves A's leading HOST_BLOCKS blocks, and that is what is checked)
#   KV_BLOCKS      limits.kv_blocks per worker (default: derived from memory on cuda, 4x the
#                  prefix's blocks + 64 on cpu)
#   GPUS           the node's GPU count on cuda (default 1; both workers on GPU 0)
#   N_PREFILL      1 (default) or 0: colocated, the decode worker computes and fetches prompts
#   FETCH          TROUPE_PREFILL_FETCH of the workers (default always: the fetch path, not the
#                  cost model's choice, is measured; cost: the default of a cluster, which reads
#                  the disk only when that beats computing, actors/worker/fetch_policy.h)
#   B BIN          the build folder (default build) and its binaries (default B/bin)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
BACKEND=${BACKEND:-cpu}
case $BACKEND in
  cuda) MODEL=${MODEL:-tests/fixtures/models/llama-3.1-8b-shape}; IN_LEN=${IN_LEN:-8000}; DTYPE=${DTYPE:-bf16}
        LOAD_FORMAT=${LOAD_FORMAT:-dummy}; ROUNDS=${ROUNDS:-3} ;;
  cpu)  [ -f models/kjv-tiny/config.json ] && MODEL=${MODEL:-models/kjv-tiny}
        MODEL=${MODEL:-tests/fixtures/models/qwen3-demo-shape}; IN_LEN=${IN_LEN:-512}; DTYPE=${DTYPE:-f32}; ROUNDS=${ROUNDS:-1} ;;
  *) echo "bench-disk-ttft: BACKEND must be cpu or cuda, not '$BACKEND'" >&2; exit 2 ;;
esac
if [ -z "${LOAD_FORMAT:-}" ]; then
  LOAD_FORMAT=auto
  compgen -G "$MODEL/*.safetensors" >/dev/null || LOAD_FORMAT=dummy
fi
KV_DTYPE=${KV_DTYPE:-bf16}
N_PREFILL=${N_PREFILL:-1}
FETCH=${FETCH:-always}
OUT=${1:-build/bench-disk-ttft/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
DISK_DIR=${DISK_DIR:-$OUT/kvdisk}
mkdir -p "$DISK_DIR" && DISK_DIR=$(cd "$DISK_DIR" && pwd)
# A tier file already there is another tier's (or a previous run's): its blocks would make the
# first turn a hit, and troupe-bench-disk would overwrite it.
[ ! -e "$DISK_DIR/blocks.kvd" ] ||
  { echo "bench-disk-ttft: $DISK_DIR/blocks.kvd exists: remove it or set DISK_DIR to another directory" >&2; exit 1; }
BIN=${BIN:-$B/bin}
for b in troupe-supervisor troupe-client troupe-top troupe-bench-disk; do
  [ -x "$BIN/$b" ] || { echo "bench-disk-ttft: $BIN/$b is missing; build first (make B=$B)" >&2; exit 1; }
done
[ -f "$MODEL/config.json" ] || { echo "bench-disk-ttft: $MODEL/config.json not found (set MODEL)" >&2; exit 1; }
# (the ids travel as one argument of troupe-client, at most 128 KiB: 5 bytes a token)
[[ $IN_LEN =~ ^[0-9]+$ ]] && [ "$IN_LEN" -ge 64 ] && [ "$IN_LEN" -le 25000 ] ||
  { echo "bench-disk-ttft: IN_LEN must be a whole number, 64..25000" >&2; exit 2; }
[[ $ROUNDS =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] || { echo "bench-disk-ttft: ROUNDS must be a whole number >= 1" >&2; exit 2; }
MODEL=$(cd "$MODEL" && pwd)
BS=16   # cache.block_size: the topology's default

# The KV block's bytes (every layer's K and V of BS tokens) and what follows from it.
read -r BLOCK_BYTES VOCAB MAX_POS < <(python3 - "$MODEL/config.json" "$KV_DTYPE" "$BS" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c = c.get("text_config", c)
kvh = c.get("num_key_value_heads", c["num_attention_heads"])
hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
el = {"f32": 4, "bf16": 2, "f16": 2, "fp8": 1}.get(sys.argv[2])
if el is None or "kv_lora_rank" in c:
    sys.exit(f"bench-disk-ttft: KV_DTYPE must be f32, bf16, f16 or fp8, and {sys.argv[1]} a model with K and V heads (no MLA)")
print(c["num_hidden_layers"] * 2 * kvh * hd * int(sys.argv[3]) * el, c["vocab_size"], c.get("max_position_embeddings", 1 << 20))
PY
)
[ -n "${BLOCK_BYTES:-}" ] || exit 2
PREFIX_BLOCKS=$((IN_LEN / BS))
SLOT_BYTES=$(( (BLOCK_BYTES + 128 + 4095) / 4096 * 4096 ))
HOST_BLOCKS=${HOST_BLOCKS:-$((2 * PREFIX_BLOCKS + 64))}
DISK_BYTES=${DISK_BYTES:-$(( 4 * PREFIX_BLOCKS * SLOT_BYTES > 67108864 ? 4 * PREFIX_BLOCKS * SLOT_BYTES : 67108864 ))}
MAX_LEN=$(( (IN_LEN + 64 + BS - 1) / BS * BS ))
[ "$MAX_LEN" -le "$MAX_POS" ] || MAX_LEN=$MAX_POS
[ "$IN_LEN" -lt "$MAX_LEN" ] || { echo "bench-disk-ttft: IN_LEN $IN_LEN does not fit $MODEL's $MAX_POS positions" >&2; exit 2; }
if [ "$BACKEND" = cpu ]; then KV_BLOCKS=${KV_BLOCKS:-$((4 * PREFIX_BLOCKS + 64))}; fi
echo "bench-disk-ttft: $MODEL ($LOAD_FORMAT, $BACKEND), $IN_LEN-token prompts, KV $KV_DTYPE: $PREFIX_BLOCKS blocks of $BLOCK_BYTES bytes; disk tier in $DISK_DIR" >&2

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
SUP=
stop() {
  if [ -n "$SUP" ] && kill -0 "$SUP" 2>/dev/null; then
    kill -TERM "$SUP"
    for _ in $(seq 600); do kill -0 "$SUP" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SUP" 2>/dev/null || true
  fi
  [ -z "$SUP" ] || wait "$SUP" 2>/dev/null || true
  SUP=
}
trap stop EXIT
die() { echo "bench-disk-ttft: $*" >&2; exit 1; }

# Where this runs: the figure names its date, commit and machine.
{
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit $(git describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)"
  echo "cpus $(nproc), memory $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  [ "$BACKEND" != cuda ] || echo "gpu $(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null || echo unknown)"
  echo "disk $(df -PT "$DISK_DIR" | awk 'NR == 2 {print $2 " on " $1 ", mounted at " $7}')"
  echo "shm $(df -Pk /dev/shm | awk 'NR == 2 {printf "%.1f GiB free", $4 / 1048576}')"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2
# Blocks cross shared memory (/dev/shm) both ways: a decode worker's write-back of a finished
# prompt and a fetch's answer are one segment each, the prefix's size. A tmpfs too small for them
# kills the process that touches the missing pages (SIGBUS), so say it before.
shm_need=$(( 2 * PREFIX_BLOCKS * BLOCK_BYTES / 1024 + 65536 ))
shm_free=$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')
[ "${shm_free:-0}" -ge "$shm_need" ] ||
  die "/dev/shm has ${shm_free:-0} KiB free; two segments of the prefix ($PREFIX_BLOCKS blocks of $BLOCK_BYTES bytes) need $shm_need KiB"

# 1. The disk's read bandwidth where the tier lives, in blocks of this model's size.
BENCH_BLOCKS=${BENCH_BLOCKS:-$(( PREFIX_BLOCKS > 16 ? PREFIX_BLOCKS : 16 ))}
"$BIN/troupe-bench-disk" --dir "$DISK_DIR" --block-bytes "$BLOCK_BYTES" --blocks "$BENCH_BLOCKS" \
  >"$OUT/bench-disk.txt" 2>&1 || { cat "$OUT/bench-disk.txt" >&2; die "troupe-bench-disk failed"; }
cat "$OUT/bench-disk.txt" >&2

# 2. The topology: one cluster on free ports, the disk tier on.
TOPO=$OUT/topology.yaml
gpu_node="" gpu_worker=""
if [ "$BACKEND" = cuda ]; then gpu_node=$'\n    gpus: '"${GPUS:-1}"; gpu_worker=$'\n    gpus: [0]'; fi
prefill_actor=""
[ "$N_PREFILL" = 0 ] || prefill_actor=$'\n  - role: prefill'"$gpu_worker"
cat > "$TOPO" <<YAML
name: bench-disk-ttft-$$
model:
  path: $MODEL
  backend: $BACKEND
  dtype: $DTYPE
  kv_dtype: $KV_DTYPE
  load_format: $LOAD_FORMAT
nodes:
  - name: local
    address: 127.0.0.1$gpu_node
actors:
  - role: monitor
  - role: cache-manager$prefill_actor
  - role: decode$gpu_worker
  - role: router
endpoints:
  client: tcp://127.0.0.1:$(port)
  inspect: tcp://127.0.0.1:$(port)
limits:
  max_batch: 16
  max_model_len: $MAX_LEN
  prefill_chunk_tokens: $([ "$BACKEND" = cuda ] && echo 2048 || echo 512)${KV_BLOCKS:+
  kv_blocks: $KV_BLOCKS}
cache:
  block_size: $BS
  host_store_blocks: $HOST_BLOCKS
  disk_dir: $DISK_DIR
  disk_bytes: $DISK_BYTES
supervision:
  ready_timeout_s: 300
  grace_s: 60          # a graceful stop writes the host store's blocks to disk first
  heartbeat_ms: 1000
  liveness: 10
YAML

start() {   # start N: the cluster, waited for until ready
  rm -f "$OUT/ready-$1"
  TROUPE_PREFILL_FETCH=$FETCH "$BIN/troupe-supervisor" --topology "$TOPO" --ready-file "$OUT/ready-$1" \
    >"$OUT/supervisor-$1.log" 2>&1 &
  SUP=$!
  for _ in $(seq 3000); do [ -s "$OUT/ready-$1" ] && break; kill -0 "$SUP" 2>/dev/null || break; sleep 0.1; done
  [ -s "$OUT/ready-$1" ] || { tail -20 "$OUT/supervisor-$1.log" >&2; die "cluster $1 not ready"; }
}

# ids NAME: IN_LEN token ids of prompt NAME, the same every call (seeded by the name).
ids() {
  python3 - "$1" "$IN_LEN" "$VOCAB" <<'PY'
import random, sys
rng = random.Random(sys.argv[1])
print(",".join(str(rng.randrange(3, min(int(sys.argv[3]), 10000))) for _ in range(int(sys.argv[2]))))
PY
}

# ask NAME PROMPT [client options]: one request of one output token; its done message's JSON in
# OUT/NAME.json.
ask() {
  local name=$1 prompt=$2; shift 2
  "$BIN/troupe-client" --topology "$TOPO" --json --timeout-ms 600000 submit --ids --max-tokens 1 \
    --ignore-eos --temperature 0 "$@" "$(ids "$prompt")" >"$OUT/$name.replies" 2>"$OUT/$name.err" ||
    { cat "$OUT/$name.err" "$OUT/$name.replies" >&2; die "request $name failed"; }
  grep '"done"' "$OUT/$name.replies" | tail -1 >"$OUT/$name.json"
  [ -s "$OUT/$name.json" ] || { cat "$OUT/$name.replies" >&2; die "request $name: no done message"; }
  echo "--- $name: $(python3 - "$OUT/$name.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
u, t = d["usage"], d["timings"]
print(f"prompt {u['prompt_tokens']}, cached {u['cached_tokens']}, ttft {t['ttft_ms']} ms")
PY
)" >&2
}

# cm [NAME...]: the values of the cache-manager's metrics NAME... (troupe-top) on one line, -1 for
# one it lacks; all of them as JSON with no NAME.
cm() {
  "$BIN/troupe-top" --topology "$TOPO" --json | python3 -c '
import json, sys
cm = next(a for a in json.load(sys.stdin)["actors"] if a["role"] == "cache_manager")
m = {x["name"]: x["value"] for x in cm.get("metrics", [])}
names = sys.argv[1:]
print(json.dumps(m) if not names else " ".join(str(int(m.get(n, -1))) for n in names))' "$@"
}

# until_cm SECONDS EXPR: waits until EXPR (python, over the cache-manager metric names) holds, at
# most SECONDS of wall time (each look costs a troupe-top and a python: the deadline is a clock's,
# not a count of looks).
until_cm() {
  local end=$((SECONDS + $1)) expr=$2
  while [ "$SECONDS" -lt "$end" ]; do
    "$BIN/troupe-top" --topology "$TOPO" --json 2>/dev/null | python3 -c '
import json, sys
cm = next(a for a in json.load(sys.stdin)["actors"] if a["role"] == "cache_manager")
m = {x["name"]: x["value"] for x in cm.get("metrics", [])}
sys.exit(0 if eval(sys.argv[1], {}, m) else 1)' "$expr" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

# why_not_on_disk N: what the cache-manager says of its writes when the pinned prefix's N blocks
# are not all on disk, and the cluster's warnings and errors, before the run fails.
why_not_on_disk() {
  local names=(disk_persists_total disk_persists_owed disk_persists_deferred_total disk_spills_shed_total
               disk_spills_shed_full_total disk_write_errors_total disk_io_in_flight disk_blocks_used
               disk_blocks_pinned disk_blocks_capacity host_blocks_used host_blocks_pinned pins)
  local vals
  vals=($(cm "${names[@]}" 2>/dev/null)) || vals=()
  echo "bench-disk-ttft: the cache-manager's disk writes (-1: no such metric):" >&2
  for i in "${!names[@]}"; do echo "  ${names[$i]} ${vals[$i]:-?}" >&2; done
  echo "bench-disk-ttft: warnings and errors of $OUT/supervisor-0.log (the last 20):" >&2
  grep -E " (WARN|ERROR) " "$OUT/supervisor-0.log" | tail -20 >&2 || true
  echo "  (disk_persists_owed > 0 and no I/O in flight: owed write-throughs not retried;" \
       "disk_persists_owed -1 and disk_spills_shed_total > 0: a build that dropped the write-throughs" \
       "past its 256 I/O jobs; disk_spills_shed_full_total > 0: the disk full of pinned blocks (DISK_BYTES);" \
       "host_blocks_pinned < $1: the pin or the write-back did not reach the host store)" >&2
}

KEY=(--cache-key bench-disk-ttft-a --retention 24h)

# Drops the tier's file from the page cache, so A's blocks come from the disk: posix_fadvise for
# this file (clean pages go; no privilege needed), the whole page cache as root if that left any.
# Prints the bytes of the file still resident (mincore) and how it was dropped.
drop_cache() {
  python3 - "$DISK_DIR/blocks.kvd" <<'PY'
import ctypes, mmap, os, sys
path = sys.argv[1]

def resident():
    """Bytes of the file in the page cache (mincore over a read-only mapping); -1: unknown."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value):
        return -1
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
    rc = libc.mincore(addr, size, vec)
    libc.munmap(addr, size)
    return -1 if rc != 0 else sum(1 for v in bytes(vec) if v & 1) * page

fd = os.open(path, os.O_RDONLY)
os.fsync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
how = "posix_fadvise(DONTNEED) of the file"
r = resident()
if r != 0 and os.geteuid() == 0:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        how += ", then /proc/sys/vm/drop_caches"
    except OSError as e:
        how += f"; /proc/sys/vm/drop_caches refused ({e.strerror})"
    r = resident()
print(r, how)
PY
}

# 2a. The first cluster: A computed, pinned, written through to disk.
start 0
ask warmup-0 warmup-0
ask recompute-0 A "${KEY[@]}"
# Every block written through (an 8,000-token prefix has more blocks than the disk tier has I/O
# jobs: those past them are owed and go out as jobs come back) and none still being written.
until_cm 120 "disk_persists_total >= $PREFIX_BLOCKS and disk_persists_owed == 0 and disk_io_in_flight == 0" ||
  { why_not_on_disk "$PREFIX_BLOCKS"; die "the pinned prefix's $PREFIX_BLOCKS blocks did not all reach the disk within 120 s"; }
# 2b. Stopped: the device pools and the host store are gone; the disk keeps A.
stop
grep -q "blocks of memory written at shutdown" "$OUT/supervisor-0.log" ||
  echo "bench-disk-ttft: the cache-manager did not say it wrote its memory at shutdown" >&2
# The block size the tier wrote (its file header, docs/kv-cache.md) is the one measured above.
file_bb=$(python3 -c 'import sys; d = open(sys.argv[1], "rb").read(48); print(int.from_bytes(d[40:48], "little") if d[:8] == b"TRKVDSK1" else -1)' \
  "$DISK_DIR/blocks.kvd")
[ "$file_bb" = "$BLOCK_BYTES" ] ||
  die "the disk tier's blocks are $file_bb bytes, not the $BLOCK_BYTES computed from $MODEL/config.json"

: >"$OUT/rounds.txt"
for r in $(seq "$ROUNDS"); do
  # 2c. Started again: the disk tier's index read back; only the disk holds A.
  start "$r"
  grep -h "blocks read back" "$OUT/supervisor-$r.log" | head -1 >&2 || true
  ask "warmup-$r" "warmup-$r"
  # The warm-up's write-back (its blocks into the host store) lands before A's fetch starts.
  until_cm 60 "host_blocks_used >= $(( PREFIX_BLOCKS < HOST_BLOCKS ? PREFIX_BLOCKS : HOST_BLOCKS ))" ||
    echo "bench-disk-ttft: the warm-up's blocks did not reach the host store" >&2
  read -r resident drop_how < <(drop_cache)
  echo "--- page cache: $drop_how; $resident bytes of the disk tier's file still resident" >&2
  read -r reads0 hits0 declined0 < <(cm disk_reads_total fetch_hits_disk_total fetch_disk_declined_total)
  ask "from-disk-$r" A "${KEY[@]}"
  sleep 1.5   # the cache-manager's stats are sent once a second
  cm >"$OUT/cm-after-disk-$r.json"
  read -r reads1 hits1 declined1 < <(cm disk_reads_total fetch_hits_disk_total fetch_disk_declined_total)
  echo "$r $resident $((reads1 - reads0)) $((hits1 - hits0)) $((declined1 - declined0)) $drop_how" >>"$OUT/rounds.txt"
  # 2d. The control: a never-seen prompt of the same length, computed.
  ask "recompute-$r" "C-$r"
  # Last, A once more: from the prefill worker's own pool now.
  [ "$r" != "$ROUNDS" ] || ask device A "${KEY[@]}"
  stop   # a graceful stop: what the host store holds and the disk does not is written first
done
# The tier's file (gigabytes on the 8B shape) is of no use after the run, unless asked for.
[ -n "${KEEP_DISK:-}" ] || rm -f "$DISK_DIR/blocks.kvd"

# 3. The table.
python3 - "$OUT" "$IN_LEN" "$BS" "$BLOCK_BYTES" "$MODEL" "$BACKEND" "$KV_DTYPE" "$HOST_BLOCKS" "$FETCH" <<'PY'
import json, os, re, statistics, sys
out, in_len, bs, block_bytes, model, backend, kv, host_blocks, fetch = sys.argv[1:10]
in_len, bs, block_bytes, host_blocks = int(in_len), int(bs), int(block_bytes), int(host_blocks)
load = lambda name: json.load(open(os.path.join(out, name)))
machine = dict(l.rstrip("\n").split(" ", 1) for l in open(os.path.join(out, "machine.txt")) if " " in l)
bench = open(os.path.join(out, "bench-disk.txt")).read()
m = re.search(r"read\s+\d+ blocks of \d+ bytes: [\d.]+ s, (\d+) MiB/s; per block p50 ([\d.]+) ms, p99 ([\d.]+) ms", bench)
read_mibs = int(m.group(1)) if m else None
wm = re.search(r"write\s+\d+ blocks of \d+ bytes: [\d.]+ s, (\d+) MiB/s", bench)
rounds = []
for line in open(os.path.join(out, "rounds.txt")):
    r, resident, reads, hits, declined, how = line.rstrip("\n").split(" ", 5)
    d, c = load(f"from-disk-{r}.json"), load(f"recompute-{r}.json")
    cm_after = load(f"cm-after-disk-{r}.json")
    rounds.append(dict(round=int(r), page_cache_resident_bytes=int(resident), page_cache_drop=how,
                       disk_blocks_read=int(reads), disk_blocks_served=int(hits), disk_blocks_declined=int(declined),
                       disk_read_ms_per_block=cm_after.get("disk_read_ms"),
                       cm_disk_read_mib_s=cm_after.get("disk_read_mib_s"),
                       from_disk_ttft_ms=d["timings"]["ttft_ms"], from_disk_cached=d["usage"]["cached_tokens"],
                       from_disk_cached_disk=d["usage"].get("cached_disk_tokens"),
                       recompute_ttft_ms=c["timings"]["ttft_ms"], recompute_cached=c["usage"]["cached_tokens"]))
first, dev = load("recompute-0.json"), load("device.json")
recompute = [first["timings"]["ttft_ms"]] + [r["recompute_ttft_ms"] for r in rounds]
from_disk = [r["from_disk_ttft_ms"] for r in rounds]
# The prompt's last token is always computed: the block that holds it may be too. A fetch larger
# than the host store gets its leading blocks that fit (docs/kv-cache.md, Limits).
full = (in_len - 1) // bs * bs
want = min(full, host_blocks * bs)
prefix_bytes = full // bs * block_bytes
fails = []
# With the cost model a disk slower than the GPU is not read (or read until the first reads show
# it): what it chose is reported, not checked.
for r in (rounds if fetch == "always" else []):
    if r["from_disk_cached"] < want:
        fails.append(f"round {r['round']}: A after the restart found {r['from_disk_cached']} of {in_len} tokens cached, not >= {want}")
    if r["disk_blocks_read"] < want // bs:
        fails.append(f"round {r['round']}: the disk tier read {r['disk_blocks_read']} blocks for A, not >= {want // bs}")
    if r["disk_blocks_read"] > r["disk_blocks_served"]:
        fails.append(f"round {r['round']}: the disk tier read {r['disk_blocks_read']} blocks for A and served "
                     f"{r['disk_blocks_served']}: blocks read again, or too late for the fetch")
for r in rounds:
    if r["recompute_cached"]:
        fails.append(f"round {r['round']}: the control found {r['recompute_cached']} tokens cached: not a recompute")
if first["usage"]["cached_tokens"]:
    fails.append(f"A's first turn found {first['usage']['cached_tokens']} tokens cached: not a recompute")
med_rec, med_disk = statistics.median(recompute), statistics.median(from_disk)
ms = lambda xs: ", ".join(str(x) for x in xs) + " ms"
resident = max(r["page_cache_resident_bytes"] for r in rounds)
split = [r["from_disk_cached_disk"] for r in rounds]
rows = [
    ("disk read bandwidth (troupe-bench-disk)", (f"{read_mibs} MiB/s" if read_mibs is not None else "?")
     + (f" (write {wm.group(1)} MiB/s)" if wm else "")),
    ("prefix", f"{in_len} tokens, {full // bs} blocks of {block_bytes} B = {prefix_bytes / 2**20:.1f} MiB"
     + (f"; the host store holds {host_blocks}" if want < full else "")),
    ("the prefix at that bandwidth", f"{prefix_bytes / 2**20 / read_mibs * 1000:.0f} ms of reads" if read_mibs else "-"),
    ("page cache before the disk turns", f"at most {resident / 2**20:.1f} MiB of the tier's file resident ({rounds[0]['page_cache_drop']})"),
    ("TTFT recompute (A first, then C)", f"{ms(recompute)}: median {med_rec:g} ms"),
    ("TTFT from disk (A after a restart)", f"{ms(from_disk)}: median {med_disk:g} ms"),
    ("recompute / from disk (medians)", f"{med_rec / med_disk:.2f}x" if med_disk else "-"),
    ("cached_tokens of A from disk", ", ".join(str(r["from_disk_cached"]) for r in rounds) + f" of {in_len}"
     + (f" (from disk: {', '.join(str(x) for x in split)})" if None not in split else "")),
    ("disk blocks read / served for A", ", ".join(f"{r['disk_blocks_read']} / {r['disk_blocks_served']}" for r in rounds)
     + "; ms a block: " + ", ".join(f"{r['disk_read_ms_per_block'] or 0:.2f}" for r in rounds)
     + " (the mean time of one read; 4 run at once)"),
    ("the cache-manager's read rate", ", ".join(f"{r['cm_disk_read_mib_s'] or 0:.0f}" for r in rounds)
     + " MiB/s (what fetches are costed at)"),
    (f"fetch policy ({fetch})", "disk blocks declined for A (computing them is faster): "
     + ", ".join(str(r["disk_blocks_declined"]) for r in rounds)),
    ("TTFT from the worker's pool (A again)", f"{dev['timings']['ttft_ms']} ms, cached {dev['usage']['cached_tokens']}"),
]
w = max(len(r[0]) for r in rows)
print(f"bench-disk-ttft: {model} ({backend}, KV {kv}); {machine.get('date')}, commit {machine.get('commit')}")
print("  " + "; ".join(f"{k} {v}" for k, v in machine.items() if k in ("gpu", "cpus", "disk", "shm")))
for k, v in rows:
    print(f"  {k:<{w}}  {v}")
summary = dict(machine=machine, model=model, backend=backend, kv_dtype=kv, in_len=in_len, block_bytes=block_bytes, fetch=fetch,
               prefix_bytes=prefix_bytes, disk_read_mib_s=read_mibs, recompute_ttft_ms=recompute,
               from_disk_ttft_ms=from_disk, recompute_cached=[first["usage"]["cached_tokens"]] + [r["recompute_cached"] for r in rounds],
               device_ttft_ms=dev["timings"]["ttft_ms"], device_cached=dev["usage"]["cached_tokens"],
               rounds=rounds, failures=fails)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
if resident > prefix_bytes // 100:
    print(f"  NOTE: {resident / 2**20:.1f} MiB of the file stayed in the page cache: the reads may have been cached")
for f in fails:
    print(f"  FAILED: {f}")
if fails and read_mibs and prefix_bytes / 2**20 / read_mibs > 10:
    print("  NOTE: a fetch waits at most 10 s for its disk reads (docs/kv-cache.md); at this bandwidth the "
          "prefix takes longer, so its tail is computed")
print(f"  (replies, logs and summary.json in {out})")
sys.exit(1 if fails else 0)
PY
