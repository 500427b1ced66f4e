# Configuration errors in the model stop the cluster at once (exit 2, the worker's exit 78
# named, nothing restarted), as a missing checkpoint does (config_error.sh):
#  - a tokenizer.json that exists but does not load (it used to give a READY cluster that refused
#    every text prompt);
#  - a checkpoint whose tensor shapes disagree with config.json (it used to restart-loop).
. "$(dirname "$0")/lib.sh"
src=$ROOT/tests/fixtures/models/qwen3-f32
run_case() {   # NAME DIR WHAT-THE-LOG-MUST-NAME
  MODEL_PATH=$2 MAX_RESTARTS=5 PERIOD_S=30 make_topology "$WORK/$1.yaml"
  local rc=0
  timeout 30 "$BIN/troupe-supervisor" --topology "$WORK/$1.yaml" >"$WORK/$1.log" 2>&1 || rc=$?
  note "$1: supervisor exit $rc"
  [ "$rc" -eq 2 ] || { tail -20 "$WORK/$1.log"; fail "$1: exit $rc, expected 2 (configuration error)"; }
  grep -q -- "$3" "$WORK/$1.log" || { tail -20 "$WORK/$1.log"; fail "$1: the error does not name '$3'"; }
  grep -q "exit 78" "$WORK/$1.log" || fail "$1: no actor exited 78"
  ! grep -q "): restarting" "$WORK/$1.log" || fail "$1: an actor was restarted"
}
mkdir -p "$WORK/badtok" "$WORK/badshape"
cp "$src/config.json" "$WORK/badtok/"; ln -s "$src/model.safetensors" "$WORK/badtok/model.safetensors"
echo '{"model": {"type": "WordPiece"' > "$WORK/badtok/tokenizer.json"
run_case badtok "$WORK/badtok" "badtok/tokenizer.json"
/usr/bin/python3 - "$src/config.json" "$WORK/badshape/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["intermediate_size"] = c["intermediate_size"] * 2
json.dump(c, open(sys.argv[2], "w"))
PY
ln -s "$src/model.safetensors" "$WORK/badshape/model.safetensors"
run_case badshape "$WORK/badshape" "mlp"
echo "PASS config_error_model"
