# troupe-bench-engine on the CPU (a real fixture checkpoint): prefill, two batch sizes, a colocated
# step (--mixed: the largest batch's decode rows and a fresh prompt in one forward) and the per-op
# profile, with the JSON the GPU runs are read from; and its usage errors (exit 2, naming the option).
. "$(dirname "$0")/lib.sh"
MODEL=$ROOT/tests/fixtures/models/llama-gqa-f32
timeout 120 "$BIN/troupe-bench-engine" "$MODEL" --prompt-len 24 --batch 1,3 --steps 2 --mixed 10 --profile \
  --json "$WORK/e.json" >"$WORK/e.txt" 2>&1 || { cat "$WORK/e.txt"; fail "troupe-bench-engine exited $?"; }
cat "$WORK/e.txt"
grep -q "mixed step, 3 decode rows + a 10-token prompt" "$WORK/e.txt" || fail "no mixed step line"
grep -q "profile, mixed step (3 decode rows + 10 prompt tokens)" "$WORK/e.txt" || fail "no mixed step profile"
python3 - "$WORK/e.json" <<'EOF' || fail "the JSON report is not what the run printed"
import json, sys
j = json.load(open(sys.argv[1]))
assert [l["batch"] for l in j["decode"]] == [1, 3], j["decode"]
assert all(l["step_ms"] > 0 and "profile_ms_per_step" in l for l in j["decode"])
m = j["mixed"]
assert m["prompt_tokens"] == 10 and m["mixed_step_ms"] > 0 and m["prompt_alone_ms"] > 0, m
assert abs(m["decode_rows_in_mixed_ms"] - (m["mixed_step_ms"] - m["prompt_alone_ms"])) < 1e-9, m
assert "attention" in m["profile_ms_per_step"], m
assert j["prefill_ms"] > 0
EOF
# An MoE model: each level counts the experts a step really routes to (MoE counters), not uniform routing.
timeout 120 "$BIN/troupe-bench-engine" "$ROOT/tests/fixtures/models/qwen3-moe-f32" --prompt-len 16 --batch 1,4 --steps 2 \
  --json "$WORK/moe.json" >"$WORK/moe.txt" 2>&1 || { cat "$WORK/moe.txt"; fail "troupe-bench-engine (MoE) exited $?"; }
grep -q "experts per layer routed to in a step" "$WORK/moe.txt" || { cat "$WORK/moe.txt"; fail "no routed-experts line"; }
python3 - "$WORK/moe.json" <<'EOF' || fail "the MoE levels do not carry the routed experts"
import json, sys
d = json.load(open(sys.argv[1]))["decode"]
assert d[0]["experts_routed_per_layer"] == 2, d[0]          # batch 1, top-2: exactly 2
assert 2 <= d[1]["experts_routed_per_layer"] <= 8, d[1]
assert all(l["bytes_per_step"] <= l["bytes_per_step_uniform_routing"] + 1e9 for l in d), d
EOF
# Usage errors: exit 2 and the option named.
for args in "--mixed -1" "--mixed lots" "--batch 0" "--steps"; do
  rc=0
  "$BIN/troupe-bench-engine" "$MODEL" $args >"$WORK/u.txt" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "$WORK/u.txt"; fail "'$args': exit $rc, expected 2"; }
  grep -q -- "${args%% *}" "$WORK/u.txt" || { cat "$WORK/u.txt"; fail "'$args': the message does not name the option"; }
done
echo "PASS bench_engine"
