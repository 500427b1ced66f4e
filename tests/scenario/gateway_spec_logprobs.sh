# top_logprobs through speculation's verify steps: a decode worker with n-gram drafts
# (TROUPE_SPECULATION=ngram:4) streams tokens accepted within a verify step, each with its
# position's alternatives from that position's row of logits (the emit hook's row). Greedy
# repetitive prompts get drafts accepted; every token must carry 3 alternatives with the chosen
# one the likeliest at its own logprob, and the decode worker must have accepted drafts (else
# the test proves nothing about verify steps).
. "$(dirname "$0")/lib.sh"
[ -x "$BIN/troupe-gateway" ] || fail "troupe-gateway is not built (libmicrohttpd-dev missing? make deps)"
[ -f "$ROOT/third_party/tokenizers/qwen3/tokenizer.json" ] || { echo "SKIP: no Qwen3 tokenizer (make deps fetches it)"; exit 0; }
command -v curl >/dev/null || fail "curl is needed"
. "$ROOT/tests/gateway/lib.sh"
export TROUPE_SPECULATION=ngram:4
gateway_topology "$WORK/t.yaml" "  admission_queue: 64"
start_cluster "$WORK/t.yaml"
U=$(gw_url "$WORK/t.yaml")
K="Authorization: Bearer sk-test-alpha-0001"
for p in '[5,6,7,5,6,7,5,6,7]' '[1,2,1,2,1,2,1,2]'; do
  [ "$(curl -s -o $WORK/r.json -w '%{http_code}' --max-time 60 -H "$K" \
       -d '{"model":"qwen3-demo-shape","prompt":'$p',"max_tokens":24,"temperature":0,"logprobs":3}' \
       "$U/v1/completions")" = 200 ] || { cat $WORK/r.json; fail "completion of $p"; }
  $PY - $WORK/r.json <<'PY'
import json, sys
lp = json.load(open(sys.argv[1]))["choices"][0]["logprobs"]
assert len(lp["tokens"]) == len(lp["top_logprobs"]) == 24, lp
for tok, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
    assert 1 <= len(top) <= 3 and top.get(tok) == v == max(top.values()), (tok, v, top)
print("24 tokens, each with its alternatives:", lp["tokens"][:6])
PY
done
# The worker's counters reach the monitor with its next stats message: wait for them.
accepted() {
  top_json "$WORK/t.yaml" | $PY -c '
import json, sys
print(sum(int(m["value"]) for a in json.load(sys.stdin)["actors"] if a["role"] == "decode"
          for m in a["metrics"] if m["name"] == "spec_accepted_tokens_total"))'
}
got=0
for _ in $(seq 60); do
  got=$(accepted)
  [ "$got" -gt 0 ] && break
  sleep 0.5
done
[ "$got" -gt 0 ] || fail "no draft was accepted: the verify steps' alternatives went untested"
echo "drafts accepted: $got"
echo "PASS gateway_spec_logprobs"
