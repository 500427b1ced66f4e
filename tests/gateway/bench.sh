#!/usr/bin/env bash
# The gateway's overhead: troupe-bench on one CPU cluster, straight to the router over ZeroMQ and
# through the gateway over HTTP (--http), the same prompts, at each concurrency. Not a test (it
# asserts nothing); prints both tables, and after each HTTP run the CPU time the gateway's threads
# spent per output token (TROUPE_GATEWAY_HTTP_THREADS=N sets its HTTP threads). Model: MODEL_PATH,
# else a small real one beside the repository (kjv-dense) when present, else the qwen3-f32 fixture.
#   B=build-x tests/gateway/bench.sh [--concurrency 1,64] [more troupe-bench options]
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export TROUPE_BIN=${TROUPE_BIN:-$ROOT/${B:-build}/bin}
export TROUPE_TEST_NAME=gwbench
. "$ROOT/tests/scenario/lib.sh"
. "$ROOT/tests/gateway/lib.sh"
if [ -z "${MODEL_PATH:-}" ]; then
  MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32
  [ -f "$ROOT/../shared/models/kjv-dense/config.json" ] && MODEL_PATH=$(cd "$ROOT/../shared/models/kjv-dense" && pwd)
fi
export MODEL_PATH
make_topology "$WORK/t.yaml" "limits:" "  admission_queue: 1024"
sed -i "s|^  - role: draft-scheduler|  - role: draft-scheduler\n  - role: gateway|" "$WORK/t.yaml"
sed -i "s|^  run_dir: |  http: tcp://127.0.0.1:$(free_port)\n  run_dir: |" "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
vocab=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$MODEL_PATH/config.json")
args=(--topology "$WORK/t.yaml" --input-len 64 --output-len 64 --concurrency 1,64 --vocab "$vocab" "$@")
# The gateway's threads' CPU time (utime + stime, clock ticks) by thread name, summed over threads of
# one name (the HTTP threads are MHD-single or MHD-worker, the actor thread troupe-gateway).
gpid=
for _ in $(seq 100); do
  gpid=$( (top_json "$WORK/t.yaml" 2>/dev/null || true) | $PY -c 'import json,sys
try: print(next(a["pid"] for a in json.load(sys.stdin).get("actors", []) if a["role"] == "gateway"))
except Exception: print("")')
  [ -n "$gpid" ] && break
  sleep 0.2
done
gw_cpu() {
  [ -n "$gpid" ] || return 0
  for t in /proc/$gpid/task/*; do echo "$(tr ' ' _ < "$t/comm") $(awk '{print $14 + $15}' "$t/stat")"; done |
    awk '{a[$1] += $2} END {for (k in a) print k, a[k]}' | sort
}
echo "model $MODEL_PATH, commit $(git -C "$ROOT" rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores"
hz=$(getconf CLK_TCK)
for run in 1 2; do
  echo "== run $run: ZeroMQ (router endpoint)"
  "$BIN/troupe-bench" "${args[@]}" || fail "troupe-bench over ZeroMQ failed"
  echo "== run $run: HTTP (gateway)"
  gw_cpu > "$WORK/cpu0"
  "$BIN/troupe-bench" "${args[@]}" --http "$(gw_url "$WORK/t.yaml")" --json "$WORK/http.json" ||
    fail "troupe-bench over HTTP failed"
  gw_cpu > "$WORK/cpu1"
  # What the gateway's threads spent per output token relayed (warm-up included: a few percent).
  toks=$($PY -c 'import json,sys; d=json.load(open(sys.argv[1]))
print(int(sum(l["output_tokens_per_s"] * l["wall_s"] for l in d.get("levels", []))))' "$WORK/http.json" 2>/dev/null || echo 0)
  [ "$toks" -gt 0 ] || continue
  join "$WORK/cpu0" "$WORK/cpu1" | awk -v t="$toks" -v hz="$hz" \
    '{ms = ($3 - $2) * 1000 / hz; if (ms > 0) printf "   gateway thread %-16s %7.0f ms CPU, %5.1f us per output token\n", $1, ms, ms * 1000 / t}'
done
