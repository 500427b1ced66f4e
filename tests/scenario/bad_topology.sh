# A bad topology file fails before anything starts, with messages that name the file, line and field.
. "$(dirname "$0")/lib.sh"
cat > "$WORK/bad.yaml" <<'YAML'
name: bad
nodes:
  - name: n1
    gpus: 1
actors:
  - role: router
  - role: decoder
  - role: prefill
    gpus: [3]
  - role: decode
    count: 8x
  - role: monitor
supervision:
  strategy: one_for_none
YAML
rc=0
"$BIN/troupe-supervisor" --topology "$WORK/bad.yaml" >"$WORK/out" 2>&1 || rc=$?
cat "$WORK/out"
[ "$rc" -eq 2 ] || fail "exit $rc, expected 2"
grep -q "bad.yaml:7: actors\[1\].role: unknown role 'decoder'" "$WORK/out" || fail "unknown role not named with its line"
grep -q "actors\[2\].gpus" "$WORK/out" || fail "GPU index not reported"
grep -q "actors\[3\].count" "$WORK/out" || fail "junk number not reported"
grep -q "supervision.strategy" "$WORK/out" || fail "bad strategy not reported"
pgrep -f -- "--topology $WORK/bad.yaml" && fail "something started"
"$BIN/troupe-supervisor" --check >/dev/null || fail "embedded default does not validate"
echo "PASS bad_topology"
