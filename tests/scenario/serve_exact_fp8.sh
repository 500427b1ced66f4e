# Exactness with an fp8 (E4M3) KV cache: serve_exact.sh on the qwen3-f32 fixture with
# model.kv_dtype: fp8, against troupe-generate --kv-dtype fp8. Greedy output through the cluster
# (prompts in 8-token prefill chunks on two prefill workers, fp8 blocks handed to two decode
# workers through shared memory, 8 other requests beside them) must equal the one-process run
# token for token; the workers' pools must be fp8 and the host store's blocks one byte per element.
. "$(dirname "$0")/lib.sh"
KV_DTYPE=fp8 FIXTURES='^qwen3-f32$' N_BG=8 bash "$ROOT/tests/scenario/serve_exact.sh" \
  | grep -E "prompts equal|KV pools|PASS" || fail "serve_exact with an fp8 KV cache"
echo "PASS serve_exact_fp8"
