# A model file the serving user cannot read is named with the reason, not taken for a missing one:
# an unreadable model.safetensors said "no model.safetensors or model.safetensors.index.json"
# beside the file an operator sees with ls. Checked with troupe-generate (the same engine_open as
# the workers) and through the cluster (exit 2, the worker's exit 78). As root, which reads any
# file, the commands run as nobody.
. "$(dirname "$0")/lib.sh"
src=$ROOT/tests/fixtures/models/qwen3-f32
as_user=()
if [ "$(id -u)" = 0 ]; then
  command -v setpriv >/dev/null || { echo "SKIP: root without setpriv"; exit 0; }
  as_user=(setpriv --reuid 65534 --regid 65534 --clear-groups)
fi
chmod 755 "$WORK"
mkdir "$WORK/m"
cp "$src/config.json" "$src/model.safetensors" "$WORK/m/"
chmod 000 "$WORK/m/model.safetensors"
rc=0
timeout 30 "${as_user[@]}" "$BIN/troupe-generate" "$WORK/m" --ids 1,2,3 --max-tokens 2 >"$WORK/gen.out" 2>&1 || rc=$?
note "troupe-generate: exit $rc: $(cat "$WORK/gen.out")"
[ "$rc" -ne 0 ] || fail "an unreadable model.safetensors loaded"
grep -q "m/model.safetensors: cannot open: Permission denied" "$WORK/gen.out" || fail "the error does not say the file cannot be read"

MODEL_PATH=$WORK/m make_topology "$WORK/t.yaml"
chmod 644 "$WORK/t.yaml"
mkdir "$WORK/run"
[ "$(id -u)" != 0 ] || chown 65534:65534 "$WORK/run"   # the run directory is the supervisor's user's
rc=0
timeout 60 "${as_user[@]}" "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" >"$WORK/sup.log" 2>&1 || rc=$?
note "supervisor: exit $rc"
grep -E " ERROR " "$WORK/sup.log" | head -3
[ "$rc" -eq 2 ] || fail "supervisor exit $rc, expected 2 (configuration error)"
grep -q "m/model.safetensors: cannot open: Permission denied" "$WORK/sup.log" || fail "the workers' error does not say the file cannot be read"
sleep 0.2
! pgrep -f -- "--topology $WORK/t.yaml" >/dev/null || fail "processes left behind"
echo "PASS model_unreadable"
