# tests/scenario/lib.sh — helpers for scenario tests: real processes under the real supervisor.
# Each test gets its own cluster name (so its own ipc run directory) and its own tcp ports.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${TROUPE_BIN:-$ROOT/build/bin}
WORK=$(mktemp -d /tmp/troupe-test.XXXXXX)
SUP_PID=
export TROUPE_TEST_NAME=${TROUPE_TEST_NAME:-$(basename "$0" .sh)}

fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "--- $*"; }

cleanup() {
  local rc=$?
  # On failure, what the cluster said about itself goes into the test's log.
  if [ "$rc" -ne 0 ] && [ -f "$WORK/supervisor.log" ]; then
    echo "--- supervisor log (warnings and errors):"
    grep -E " (WARN|ERROR) " "$WORK/supervisor.log" | grep -v "no tokenizer" | tail -20 || true   # none left: still clean up
  fi
  if [ -n "$SUP_PID" ] && kill -0 "$SUP_PID" 2>/dev/null; then
    kill -TERM "$SUP_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$SUP_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SUP_PID" 2>/dev/null || true
  fi
  # Never leave actors of this test behind.
  pkill -KILL -f -- "--topology $WORK/" 2>/dev/null || true
  # A sanitizer report from any actor (make test-asan) fails the test, even if a restart hid it.
  if grep -h -m3 -A8 "ERROR: AddressSanitizer\|runtime error:" "$WORK"/*.log 2>/dev/null; then
    echo "FAIL: a sanitizer report above" >&2
    rm -rf "$WORK"
    exit 1
  fi
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# free_port_block N [ADDR...]: the first of N consecutive tcp ports free on every ADDR (default
# 127.0.0.1), in the 10,000 ports below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default). A port read back from bind(0)
# is an ephemeral one, and between its release here and the actor's bind any outgoing connection
# on the machine (another test's clients) may take it as its source port ("Address already in
# use"); ports below the range are never handed out that way. Ports handed out before in this
# test are skipped (remembered in $WORK/.ports: this runs in $(...) subshells).
free_port_block() {
  local n=$1 p
  shift
  p=$(/usr/bin/python3 - "$WORK/.ports" "$n" "${@:-127.0.0.1}" <<'PY'
import random, socket, sys
try:
    used = set(open(sys.argv[1]).read().split())
except OSError:
    used = set()
n, addrs = int(sys.argv[2]), sys.argv[3:]
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
low = max(low, 12000)

def free(p):
    for a in addrs:
        s = socket.socket()
        try:
            s.bind((a, p))
        except OSError:
            return False
        finally:
            s.close()
    return True

for _ in range(200):
    b = random.randrange(low - 10000, low - n)
    if all(str(p) not in used and free(p) for p in range(b, b + n)):
        print(b)
        break
else:
    sys.exit("free_port_block: no %d free ports below %d after 200 tries" % (n, low))
PY
) || return 1
  seq "$p" $((p + n - 1)) >>"$WORK/.ports"
  echo "$p"
}

# A free tcp port on loopback (see free_port_block).
free_port() { free_port_block 1; }

# stream_summary: a troupe-client --json reply stream on stdin (one JSON message after another) ->
# "comma-joined token ids, the final message's type" on one line.
stream_summary() {
  /usr/bin/python3 -c 'import json, sys
line, dec, pos, toks, fin = sys.stdin.read(), json.JSONDecoder(), 0, [], None
while pos < len(line):
    while pos < len(line) and line[pos].isspace(): pos += 1
    if pos >= len(line): break
    m, pos = dec.raw_decode(line, pos)
    if m["type"] == "token": toks += m["tokens"]
    else: fin = m
print(",".join(map(str, toks)), fin and fin.get("type"))'
}

# make_topology FILE [extra yaml appended]: a one-machine CPU cluster of every role on free ports.
# On a GPU node: BACKEND=cuda NODE_GPUS=N PREFILL_GPUS='[0]' DECODE_GPUS='[1]' places the workers
# (with BACKEND=cuda both default to GPU 0).
# N_PREFILL=0: no prefill actor (colocated: the decode workers compute the prompts).
# N_ROUTERS=2 (up to 8): that many routers (router-0, router-1, ...), each with its own client
# endpoint (endpoints.clients, the first also as endpoints.client); client_endpoints FILE lists them.
# KV_DTYPE=fp8 (or f32, bf16, f16): the workers' KV cache dtype (model.kv_dtype; default auto).
make_topology() {
  local file=$1; shift
  local p1 p2 p3 more_clients="" k PREFILL_GPUS=${PREFILL_GPUS:-} DECODE_GPUS=${DECODE_GPUS:-}
  if [ "${BACKEND:-cpu}" = cuda ]; then PREFILL_GPUS=${PREFILL_GPUS:-[0]}; DECODE_GPUS=${DECODE_GPUS:-[0]}; fi
  p1=$(free_port); p2=$(free_port); p3=$(free_port)
  for ((k = 1; k < ${N_ROUTERS:-1}; k++)); do more_clients+=", tcp://127.0.0.1:$(free_port)"; done
  cat > "$file" <<YAML
name: t-$TROUPE_TEST_NAME-$$
model:
  path: ${MODEL_PATH:-$ROOT/tests/fixtures/models/qwen3-f32}
  backend: ${BACKEND:-cpu}
  load_format: ${LOAD_FORMAT:-auto}${KV_DTYPE:+
  kv_dtype: $KV_DTYPE}
nodes:
  - name: local
    address: 127.0.0.1${NODE_GPUS:+
    gpus: $NODE_GPUS}
actors:
  - role: monitor
  - role: cache-manager
  - role: router${more_clients:+
    count: ${N_ROUTERS}}
$( [ "${N_PREFILL:-1}" = 0 ] || printf '  - role: prefill\n    count: %s\n%s' "${N_PREFILL:-1}" \
     "${PREFILL_GPUS:+    gpus: $PREFILL_GPUS
}" )
  - role: decode
    count: ${N_DECODE:-1}${DECODE_GPUS:+
    gpus: $DECODE_GPUS}${DECODE_EP:+
    ep: $DECODE_EP}
  - role: expert-balancer
  - role: draft-scheduler
endpoints:
  client: tcp://127.0.0.1:$p1${more_clients:+
  clients: [tcp://127.0.0.1:$p1$more_clients]}
  inspect: tcp://127.0.0.1:$p2
  metrics: tcp://127.0.0.1:$p3
  run_dir: $WORK/run
supervision:
  strategy: ${STRATEGY:-one_for_one}
  max_restarts: ${MAX_RESTARTS:-5}
  period_s: ${PERIOD_S:-10}
  ready_timeout_s: 30
  grace_s: ${GRACE_S:-5}
  heartbeat_ms: ${HEARTBEAT_MS:-200}
  liveness: 3
YAML
  for extra in "$@"; do echo "$extra" >> "$file"; done
}

# make_demo_topology FILE [extra yaml]: make_topology with the demo model (Qwen3 shape, real
# vocabulary and tokenizer, dummy bf16 weights: slow enough on the CPU to act mid-request), two
# decode workers and fast heartbeats.
make_demo_topology() {
  local file=$1; shift
  MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-demo-shape LOAD_FORMAT=dummy N_DECODE=2 HEARTBEAT_MS=200 \
    make_topology "$file" "$@"
  sed -i "s|^  load_format: dummy|  load_format: dummy\n  dtype: bf16\n  tokenizer: $ROOT/third_party/tokenizers/qwen3|" "$file"
}

# two_node_topology FILE NAME [extra yaml appended]: a cluster of two nodes on distinct loopback
# addresses, a (127.0.0.1) and b (127.0.0.2), both launch: local, the prefill worker on b and the
# decode worker on a, so every KV hand-off goes over the tcp channel. The CPU fixture model
# qwen3-f32, prefill chunks of 8 tokens (as generate_reference's), cluster name NAME; slow
# heartbeats (1 s, liveness 10) so that a held (SIGSTOPped) worker is not taken for wedged; GRACE_S:
# the supervisor's grace (default 5, the topology's own). Skips the test (exit 0) without the
# model or where 127.0.0.2 is not a local address. Sets MODEL (the model's folder) and CLIENT_EP.
two_node_topology() {
  local file=$1 name=$2 base p2
  shift 2
  MODEL=$ROOT/tests/fixtures/models/qwen3-f32
  [ -f "$MODEL/expected.json" ] || { echo "SKIP: no fixture model at $MODEL"; exit 0; }
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.2", 0))' 2>/dev/null \
    || { echo "SKIP: 127.0.0.2 is not a local address here"; exit 0; }
  # A base port whose next 16 ports are free on both addresses (the derived internal endpoints).
  base=$(free_port_block 16 127.0.0.1 127.0.0.2)
  CLIENT_EP=tcp://127.0.0.1:$(free_port); p2=$(free_port)
  cat > "$file" <<YAML
name: $name
model:
  path: $MODEL
  backend: cpu
nodes:
  - name: a
    address: 127.0.0.1
    launch: local
  - name: b
    address: 127.0.0.2
    launch: local
actors:
  - role: monitor
  - role: cache-manager
  - role: router
  - role: prefill
    node: b
  - role: decode
    node: a
endpoints:
  client: $CLIENT_EP
  inspect: tcp://127.0.0.1:$p2
  base_port: $base
  run_dir: $WORK/run
limits:
  prefill_chunk_tokens: 8
supervision:
  ready_timeout_s: 30
  grace_s: ${GRACE_S:-5}
  heartbeat_ms: 1000
  liveness: 10
YAML
  for extra in "$@"; do echo "$extra" >> "$file"; done
}

# generate_reference MODEL: the one-process reference for each of the model's fixture prompts
# (expected.json): the prompts' ids into $WORK/prompts and troupe-generate's greedy 16 tokens
# (prefill chunks of 8, EOS ignored) into $WORK/generate, one comma-joined line each.
generate_reference() {
  local model=$1 ids
  /usr/bin/python3 -c 'import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]: print(",".join(map(str, p["ids"])))' "$model/expected.json" > "$WORK/prompts"
  : > "$WORK/generate"
  while read -r ids; do
    "$BIN/troupe-generate" "$model" --ids "$ids" --chunk 8 --max-tokens 16 --temperature 0 --ignore-eos --json \
      | /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))' >> "$WORK/generate"
  done < "$WORK/prompts"
}

# client_endpoints TOPOLOGY: every router's client endpoint, comma-separated (what the clients take).
client_endpoints() {
  local l
  l=$(grep '^  clients:' "$1" | sed 's/^  clients: \[\(.*\)\]/\1/; s/ //g' || true)
  [ -n "$l" ] && echo "$l" || grep '^  client:' "$1" | awk '{print $2}'
}

# start_cluster TOPOLOGY [supervisor args]: starts the supervisor in the background and waits
# until every actor is READY (or fails the test after 60 s).
start_cluster() {
  local topo=$1; shift
  rm -f "$WORK/ready"
  "$BIN/troupe-supervisor" --topology "$topo" --ready-file "$WORK/ready" "$@" >"$WORK/supervisor.log" 2>&1 &
  SUP_PID=$!
  for _ in $(seq 600); do
    [ -s "$WORK/ready" ] && return 0
    kill -0 "$SUP_PID" 2>/dev/null || { cat "$WORK/supervisor.log"; fail "supervisor exited before the cluster was ready"; }
    sleep 0.1
  done
  cat "$WORK/supervisor.log"
  fail "cluster not ready within 60 s"
}

# top_json TOPOLOGY: the monitor's view as JSON.
top_json() { "$BIN/troupe-top" --topology "$1" --json; }

# actor_pid TOPOLOGY NAME: the pid the monitor reports for an actor.
actor_pid() {
  top_json "$1" | /usr/bin/python3 -c '
import json,sys
d=json.load(sys.stdin); name=sys.argv[1]
for a in d.get("actors", []):
    if a["name"]==name: print(a["pid"]); break' "$2"
}

# wait_for CMD...: retries a command for up to 10 s.
wait_for() {
  for _ in $(seq 100); do "$@" && return 0; sleep 0.1; done
  return 1
}

# stopped PID: whether every thread of the process is stopped (state T), as `wait_for stopped PID`
# after `kill -STOP PID`. kill returns once SIGSTOP is queued; the kernel stops the process's other
# threads only when the one woken for it gets a CPU (its group stop), on a loaded machine
# milliseconds later, and until then its I/O threads still serve peers. Wait for it where a test's
# next action needs the process quiet (two_node_handoff: a stalled sender's channel thread must not
# answer fetches). The woken thread is the main one unless it already has a signal pending, and a
# thread with one pending runs no more user code, so a process's main loop is frozen when kill
# returns. SIGKILL needs no wait: it is put on every thread at once, and none runs again.
stopped() {
  local f l
  for f in /proc/$1/task/*/stat; do
    l=$(cat "$f") || return 1
    l=${l##*) }
    [ "${l%% *}" = T ] || return 1
  done
}

# Python for the serving tests: the client and servelib on the path.
export PYTHONPATH="$ROOT/tools:$ROOT/tests/scenario${PYTHONPATH:+:$PYTHONPATH}"
PY=/usr/bin/python3
