# troupe-bench-engine on the CPU (a real fixture checkpoint): prefill, two batch sizes, a colocated
# step (--mixed: the largest batch's decode rows and a fresh prompt in one forward) and the per-op
# profile, with the JSON the GPU runs are read from (rows sharing one prompt there, distinct prompts
# below); an MoE model's bytes from the experts each step routed to; distinct prompts against shared
# ones on a dummy MoE shape; --quantize (int4 at load: fewer bytes, named in the output and the
# JSON); and its usage errors (exit 2, naming the option).
. "$(dirname "$0")/lib.sh"
MODEL=$ROOT/tests/fixtures/models/llama-gqa-f32
timeout 120 "$BIN/troupe-bench-engine" "$MODEL" --prompt-len 24 --batch 1,3 --steps 2 --mixed 10 --profile \
  --prompts shared --json "$WORK/e.json" >"$WORK/e.txt" 2>&1 || { cat "$WORK/e.txt"; fail "troupe-bench-engine exited $?"; }
cat "$WORK/e.txt"
grep -q "prompts: shared" "$WORK/e.txt" || fail "the prompt mode is not printed"
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
assert j["prompts"] == "shared", j.get("prompts")
EOF
# An MoE model: each timed step counts the experts it really routed to (MoE counters), not uniform
# routing; the bound is those bytes at --copy-bw.
timeout 120 "$BIN/troupe-bench-engine" "$ROOT/tests/fixtures/models/qwen3-moe-f32" --prompt-len 16 --batch 1,4 --steps 3 \
  --copy-bw 0.01 --json "$WORK/moe.json" >"$WORK/moe.txt" 2>&1 || { cat "$WORK/moe.txt"; fail "troupe-bench-engine (MoE) exited $?"; }
cat "$WORK/moe.txt"
grep -q "experts per layer read per step" "$WORK/moe.txt" || fail "no routed-experts line"
grep -q "prompts: distinct: every row its own 16 random token ids (seed 1)" "$WORK/moe.txt" || fail "no prompt mode line"
python3 - "$WORK/moe.json" <<'EOF' || fail "the MoE levels do not carry the routed experts"
import json, sys
j = json.load(open(sys.argv[1]))
d = j["decode"]
assert j["prompts"] == "distinct" and j["prompt_seed"] == 1 and j["routing"] == "checkpoint", j
assert d[0]["experts_routed_per_layer"] == 2, d[0]          # batch 1, top-2: exactly 2 in every step
assert d[0]["experts_routed_per_layer_min"] == d[0]["experts_routed_per_layer_max"] == 2, d[0]
assert 2 <= d[1]["experts_routed_per_layer"] <= 8, d[1]
for l in d:
    assert l["bytes_counted"] == "routed", l
    assert l["bytes_per_step_min"] <= l["bytes_per_step"] <= l["bytes_per_step_max"], l
    assert l["bytes_per_step"] <= l["bytes_per_step_uniform_routing"] * 1.2, l
    assert abs(l["bound_ms"] - l["bytes_per_step"] / 0.01e12 * 1e3) < 1e-9, l
assert d[0]["bytes_per_step"] < d[1]["bytes_per_step"], d   # batch 1 reads 2 experts a layer, batch 4 more
EOF
# Distinct prompts make a dummy MoE model's rows route independently: a 32-expert top-4 shape at
# batch 16 reads close to the 28.2 experts per layer that independent uniform choices would (27.5
# when this was written); rows sharing one prompt pick alike (13.5).
mkdir -p "$WORK/moe32"
cat >"$WORK/moe32/config.json" <<'EOF'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "float32", "hidden_size": 128,
 "intermediate_size": 128, "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
 "num_key_value_heads": 1, "head_dim": 64, "num_experts": 32, "num_experts_per_tok": 4, "norm_topk_prob": true,
 "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 512, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}
EOF
for p in shared distinct; do
  timeout 120 "$BIN/troupe-bench-engine" "$WORK/moe32" --load-format dummy --prompt-len 64 --batch 16 --steps 3 \
    --prompts $p --json "$WORK/moe32-$p.json" >"$WORK/moe32-$p.txt" 2>&1 || { cat "$WORK/moe32-$p.txt"; fail "dummy MoE, $p prompts"; }
  grep -E "prompts|MoE" "$WORK/moe32-$p.txt"
done
python3 - "$WORK/moe32-shared.json" "$WORK/moe32-distinct.json" <<'EOF' || fail "distinct prompts do not route independently"
import json, sys
sh, di = (json.load(open(f))["decode"][0]["experts_routed_per_layer"] for f in sys.argv[1:3])
assert di >= 24 and di > sh + 5, (sh, di)
EOF
# --quantize: the MoE model quantized at load (int4 groups of 128) reads fewer bytes than its f32
# weights, says so, and the JSON names the format.
timeout 120 "$BIN/troupe-bench-engine" "$ROOT/tests/fixtures/models/qwen3-moe-f32" --prompt-len 16 --batch 1,4 --steps 3 \
  --copy-bw 0.01 --quantize int4 --json "$WORK/moe-i4.json" >"$WORK/moe-i4.txt" 2>&1 \
  || { cat "$WORK/moe-i4.txt"; fail "troupe-bench-engine --quantize int4 exited $?"; }
grep -q "quantized at load to int4" "$WORK/moe-i4.txt" || { cat "$WORK/moe-i4.txt"; fail "--quantize is not printed"; }
python3 - "$WORK/moe.json" "$WORK/moe-i4.json" <<'EOF' || fail "--quantize int4 does not shrink the bytes"
import json, sys
f, q = (json.load(open(p)) for p in sys.argv[1:3])
assert f["quantize"] == "none" and q["quantize"] == "int4", (f["quantize"], q["quantize"])
assert q["weight_bytes"] < 0.5 * f["weight_bytes"], (q["weight_bytes"], f["weight_bytes"])
assert q["decode"][0]["bytes_per_step"] < f["decode"][0]["bytes_per_step"], (q["decode"][0], f["decode"][0])
EOF
# Usage errors: exit 2 and the option named.
for args in "--mixed -1" "--mixed lots" "--batch 0" "--steps" "--prompts some" "--seed -3" "--quantize int3"; do
  rc=0
  "$BIN/troupe-bench-engine" "$MODEL" $args >"$WORK/u.txt" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "$WORK/u.txt"; fail "'$args': exit $rc, expected 2"; }
  grep -q -- "${args%% *}" "$WORK/u.txt" || { cat "$WORK/u.txt"; fail "'$args': the message does not name the option"; }
done
echo "PASS bench_engine"
