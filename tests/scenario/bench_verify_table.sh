# troupe-bench-engine --verify-table on the CPU (dummy weights of a tiny fixture's shape): the step
# cost of k + 1 rows per sequence for k = 0..3 at two batch sizes, the cost ratios, the implied
# speedup at two acceptance rates with the best k, the JSON beside it; its usage errors.
. "$(dirname "$0")/lib.sh"
MODEL=$ROOT/tests/fixtures/models/llama-gqa-f32
timeout 120 "$BIN/troupe-bench-engine" "$MODEL" --load-format dummy --prompt-len 20 --batch 1,3 --steps 2 \
  --verify-table --max-k 3 --accept 0.5,0.8 --json "$WORK/v.json" >"$WORK/v.txt" 2>&1 \
  || { cat "$WORK/v.txt"; fail "troupe-bench-engine --verify-table exited $?"; }
cat "$WORK/v.txt"
grep -q "verify step cost (dummy weights: step costs only" "$WORK/v.txt" || fail "the table does not say its weights are dummy"
grep -qE "^ batch +1-token +k=1 +k=2 +k=3$" "$WORK/v.txt" || fail "no header with the one-token step and k = 1..3"
[ "$(grep -cE '^ +[13]( +[0-9]+\.[0-9]+){4}$' "$WORK/v.txt")" -ge 4 ] || fail "not a row per batch size in the tables"
grep -q "implied speedup at acceptance a = 0.800" "$WORK/v.txt" || fail "no speedup table at a = 0.8"
python3 - "$WORK/v.json" <<'PYEOF' || fail "the JSON report is not what the run printed"
import json, sys
j = json.load(open(sys.argv[1]))
t = j["verify_table"]
assert sorted({(c["batch"], c["k"]) for c in t}) == [(b, k) for b in (1, 3) for k in range(4)], t
assert all(c["step_ms"] > 0 and c["rows_per_seq"] == c["k"] + 1 for c in t), t
assert all(abs(c["cost_vs_one_token"] - 1) < 1e-12 for c in t if c["k"] == 0), t
best = j["verify_best"]
assert len(best) == 4 and all(0 <= b["best_k"] <= 3 and b["speedup"] >= 1 for b in best), best
assert j["weights"] == "dummy"
PYEOF
for args in "--max-k 99" "--accept 1.5" "--accept 0.5,x"; do
  rc=0
  "$BIN/troupe-bench-engine" "$MODEL" --verify-table $args >"$WORK/u.txt" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "$WORK/u.txt"; fail "'$args': exit $rc, expected 2"; }
  grep -q -- "${args%% *}" "$WORK/u.txt" || { cat "$WORK/u.txt"; fail "'$args': the message does not name the option"; }
done
echo "PASS bench_verify_table"
