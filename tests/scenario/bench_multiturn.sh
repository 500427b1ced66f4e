# troupe-bench --multi-turn on a small cluster: every request completes, the conversations reuse
# their history (each turn at least the previous turn's prompt, to the block, which the prefill
# worker still holds), the run without reuse reuses nothing, and the cached and prompt tokens the
# bench reports are the router's own counters (cached_tokens_total, prompt_tokens_total).
. "$(dirname "$0")/lib.sh"
make_topology "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
S=40 N=20 M=12 T=3
"$BIN/troupe-bench" --topology "$WORK/t.yaml" --vocab 512 --warmup 1 --multi-turn --turns $T --system-len $S \
  --turn-len $N --output-len $M --concurrency 1,3 --json "$WORK/mt.json" | tee "$WORK/mt.txt" \
  || fail "troupe-bench failed"
sleep 1.2   # the router's counters reach the monitor once a second
top_json "$WORK/t.yaml" > "$WORK/top.json"
$PY - "$WORK/mt.json" "$WORK/top.json" $S $N $M $T <<'PY'
import json, sys
d, top = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
S, N, M, T = map(int, sys.argv[3:7])
bs = 16
assert d["mode"] == "multi-turn" and d["turns"] == T and len(d["levels"]) == 2, d
prompt = [S + t * N + (t - 1) * M for t in range(1, T + 1)]          # turn t's whole history
cached = prompt_tokens = 0
for lv in d["levels"]:
    convs = lv["conversations"]
    assert convs == lv["concurrency"], lv
    for mode in ("reuse", "no_reuse"):
        r = lv[mode]
        assert r["errors"] == 0 and r["requests"] == convs * T, (mode, r)
        assert r["prompt_tokens"] == convs * sum(prompt), (mode, r)
        cached += r["cached_tokens"]
        prompt_tokens += r["prompt_tokens"]
    # With reuse, turn t finds at least turn t-1's prompt (its full blocks) in the prefill pool.
    floor = convs * sum(p // bs * bs for p in prompt[:-1])
    r, n = lv["reuse"], lv["no_reuse"]
    print(f"concurrency {lv['concurrency']}: reuse {r['cached_tokens']}/{r['prompt_tokens']} cached "
          f"(>= {floor}), hit rate {r['cache_hit_rate']:.3f}; without {n['cached_tokens']}")
    assert r["cached_tokens"] >= floor and r["cache_hit_rate"] > 0, r
    assert abs(r["cache_hit_rate"] - r["cached_tokens"] / r["prompt_tokens"]) < 1e-9, r
    assert n["cached_tokens"] == 0 and n["cache_hit_rate"] == 0, n
    for mode in ("reuse", "no_reuse"):                               # each turn's TTFT, for a p99's origin
        bt = lv[mode]["ttft_by_turn"]
        assert [x["turn"] for x in bt] == list(range(1, T + 1)), bt
        assert all(0 < x["ttft_ms_p50"] <= x["ttft_ms_max"] for x in bt), bt
        assert max(x["ttft_ms_max"] for x in bt) == lv[mode]["ttft_ms_p99"] or convs * T > 100, (bt, lv[mode])
router = next(a for a in top["actors"] if a["role"] == "router")
m = {x["name"]: x["value"] for x in router["metrics"]}
warmup = 64                                                          # one prompt of --input-len 64, no hit
print(f"router: cached_tokens_total {m['cached_tokens_total']:.0f}, prompt_tokens_total {m['prompt_tokens_total']:.0f}")
assert m["cached_tokens_total"] == cached, (m["cached_tokens_total"], cached)
assert m["prompt_tokens_total"] == prompt_tokens + warmup, (m["prompt_tokens_total"], prompt_tokens)
PY
# The decode-bytes estimate counts KV at the workers' dtype (the auto rule: qwen3-f32's f32), or at
# --kv-dtype when given (fp8: one byte an element).
kv_bytes() {
  "$BIN/troupe-bench" --topology "$WORK/t.yaml" --vocab 512 --warmup 0 --concurrency 1 --rounds 1 --input-len 8 \
    --output-len 2 --copy-bw 10 "$@" | sed -n 's/.*KV \([0-9]*\) bytes per token (.*, \([a-z0-9]*\) KV).*/\1 \2/p'
}
per_elem=$($PY -c 'import json, sys
c = json.load(open(sys.argv[1]))
print(c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * (c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]))' \
  "$ROOT/tests/fixtures/models/qwen3-f32/config.json")
auto=$(kv_bytes); fp8=$(kv_bytes --kv-dtype fp8)
echo "troupe-bench KV bytes per token: auto '$auto', --kv-dtype fp8 '$fp8' ($per_elem elements)"
[ "$auto" = "$((per_elem * 4)) f32" ] || fail "auto KV bytes: '$auto' (want $((per_elem * 4)) f32)"
[ "$fp8" = "$per_elem fp8" ] || fail "--kv-dtype fp8 KV bytes: '$fp8' (want $per_elem fp8)"
echo "PASS bench_multiturn"
