#!/usr/bin/env bash
# The gateway's overhead: troupe-bench on one CPU cluster, straight to the router over ZeroMQ and
# through the gateway over HTTP (--http), the same prompts, at each concurrency. Not a test (it
# asserts nothing); prints both tables. Model: MODEL_PATH, else a small real one beside the
# repository (kjv-dense) when present, else the qwen3-f32 fixture.
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
echo "model $MODEL_PATH, commit $(git -C "$ROOT" rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores"
for run in 1 2; do
  echo "== run $run: ZeroMQ (router endpoint)"
  "$BIN/troupe-bench" "${args[@]}" || fail "troupe-bench over ZeroMQ failed"
  echo "== run $run: HTTP (gateway)"
  "$BIN/troupe-bench" "${args[@]}" --http "$(gw_url "$WORK/t.yaml")" || fail "troupe-bench over HTTP failed"
done
