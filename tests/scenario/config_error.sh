# A topology that asks a worker for what it cannot run (here a model directory with a config.json
# but no weights, load_format auto) is not restarted: the worker exits ACTOR_EXIT_CONFIG (78) with
# an error naming the directory, and the supervisor stops the cluster at once with exit 2 (bad
# topology) instead of restarting it to its limit (crash_loop.sh) — and leaves no process behind.
. "$(dirname "$0")/lib.sh"
mkdir -p "$WORK/noweights"
cp "$ROOT/tests/fixtures/models/qwen3-f32/config.json" "$WORK/noweights/"
MODEL_PATH=$WORK/noweights MAX_RESTARTS=5 PERIOD_S=30 make_topology "$WORK/t.yaml"
t0=$(date +%s%N)
rc=0
timeout 60 "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" >"$WORK/sup.log" 2>&1 || rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
tail -12 "$WORK/sup.log"
note "supervisor stopped with exit $rc after $ms ms"
[ "$rc" -eq 2 ] || fail "exit code $rc, expected 2 (bad topology)"
grep -q "$WORK/noweights: no model.safetensors" "$WORK/sup.log" || fail "no error naming the model directory"
grep -q "cannot run with this topology" "$WORK/sup.log" || fail "no message that restarting cannot help"
grep -q "exit 78" "$WORK/sup.log" || fail "the worker's exit status (78) is not in the log"
! grep -q "): restarting" "$WORK/sup.log" || fail "a worker was restarted"
sleep 0.2
pgrep -f -- "--topology $WORK/t.yaml" && fail "processes left behind"
# A bad TROUPE_GRAPH_WARMUP is a configuration error of the same kind, named in the log.
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-f32 MAX_RESTARTS=5 PERIOD_S=30 make_topology "$WORK/t2.yaml"
rc=0
TROUPE_GRAPH_WARMUP=sometimes timeout 60 "$BIN/troupe-supervisor" --topology "$WORK/t2.yaml" >"$WORK/sup2.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "TROUPE_GRAPH_WARMUP=sometimes: exit code $rc, expected 2"
grep -q "TROUPE_GRAPH_WARMUP 'sometimes': expected 0, verify or all" "$WORK/sup2.log" || fail "no error naming TROUPE_GRAPH_WARMUP"
sleep 0.2
pgrep -f -- "--topology $WORK/t2.yaml" && fail "processes left behind"
echo "PASS config_error"
