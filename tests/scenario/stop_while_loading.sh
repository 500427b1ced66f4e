# A stop while the workers are still loading their model is a clean stop: SIGTERM to the supervisor,
# or Ctrl-C (SIGINT to its process group), ends every actor at once, with exit 0 and no SIGKILL.
# An actor in its set-up read no stop flag until its load was over, so the supervisor waited its
# grace period (3 s here; the workers load Qwen3-0.6B-shaped random bf16 weights for about 10 s on
# two cores), SIGKILLed the workers and exited 1.
. "$(dirname "$0")/lib.sh"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-0.6b-shape LOAD_FORMAT=dummy GRACE_S=3 make_topology "$WORK/t.yaml"
sed -i "s|^  load_format: dummy|  load_format: dummy\n  dtype: bf16\n  tokenizer: $ROOT/third_party/tokenizers/qwen3|" "$WORK/t.yaml"
stop_case() {   # NAME KILL-TARGET-PREFIX SIGNAL: "" signals the supervisor, "-" its process group
  local name=$1 target=$2 sig=$3 rc=0 t0 ms p
  rm -f "$WORK/ready"
  setsid "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" --ready-file "$WORK/ready" >"$WORK/$name.log" 2>&1 &
  p=$!
  SUP_PID=$p
  # The workers exist (forked and exec'd) but the cluster is not ready: they are loading.
  wait_for pgrep -f -- "troupe-decode --topology $WORK/t.yaml" >/dev/null || fail "$name: no decode worker started"
  sleep 0.3
  [ ! -s "$WORK/ready" ] || { echo "SKIP: the cluster became ready before the stop (a fast machine)"; exit 0; }
  t0=$(date +%s%N)
  kill "-$sig" -- "$target$p"
  for _ in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "$name: the supervisor still runs 15 s after SIG$sig"
  wait "$p" || rc=$?
  SUP_PID=
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  note "$name: supervisor exit $rc, $ms ms after SIG$sig"
  grep -v "no tokenizer" "$WORK/$name.log" | grep -E "WARN|ERROR" | head -5 || true
  [ "$rc" -eq 0 ] || fail "$name: supervisor exit $rc, expected 0 (a clean stop)"
  ! grep -q "SIGKILL" "$WORK/$name.log" || fail "$name: an actor had to be killed"
  sleep 0.2
  ! pgrep -f -- "--topology $WORK/t.yaml" >/dev/null || fail "$name: processes left behind"
}
stop_case sigterm "" TERM
stop_case ctrl_c "-" INT
echo "PASS stop_while_loading"
