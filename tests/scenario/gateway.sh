# The OpenAI HTTP gateway with curl: models / health / metrics, chat and completions (streamed and
# not), top_logprobs (sorted, <= 0, greedy's choice their top-1), usage with cached_tokens on a
# second turn under a prompt_cache_key (and its split by source adding up to it), every error in OpenAI's
# shape (401, 404, 400 for bad JSON / types / ranges / n / retention / a too-long prompt, 413, 429
# with Retry-After, 503 with Retry-After from a full router), a stalled client cut off, a client
# that disconnects (mid-stream, or while waiting for a whole reply) cancelling its request at the
# router, and the gateway restarted after kill -9.
# The model: the Qwen3 demo shape (real tokenizer and chat template, dummy weights).
. "$(dirname "$0")/lib.sh"
[ -x "$BIN/troupe-gateway" ] || fail "troupe-gateway is not built (libmicrohttpd-dev missing? make deps)"
[ -f "$ROOT/third_party/tokenizers/qwen3/tokenizer.json" ] || { echo "SKIP: no Qwen3 tokenizer (make deps fetches it)"; exit 0; }
command -v curl >/dev/null || fail "curl is needed"
. "$ROOT/tests/gateway/lib.sh"
gateway_topology "$WORK/t.yaml" "  admission_queue: 3"
start_cluster "$WORK/t.yaml"
U=$(gw_url "$WORK/t.yaml")
K="Authorization: Bearer sk-test-alpha-0001"
MODEL=qwen3-demo-shape

# code BODYFILE [curl args...]: the HTTP status; the body lands in BODYFILE, headers in BODYFILE.h
code() { local out=$1; shift; curl -s -o "$out" -D "$out.h" -w '%{http_code}' --max-time 60 "$@"; }
# jq_py FILE EXPR: a Python expression over the JSON body j
jq_py() { $PY -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }
expect() { [ "$1" = "$2" ] || { cat "$3" 2>/dev/null; echo; fail "$4: got $1, wanted $2"; }; }
# err_is FILE STATUS PARAM: an OpenAI error object naming PARAM (or None)
err_shape() {
  $PY - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
e = j["error"]
assert set(e) == {"message", "type", "param", "code"}, e
assert e["message"], e
want = None if sys.argv[2] == "None" else sys.argv[2]
assert e["param"] == want, (e, want)
PY
}
B=$WORK/b
note "GET /health, /v1/models, /metrics"
expect "$(code $B "$U/health")" 200 $B health
expect "$(code $B "$U/v1/models")" 200 $B models
expect "$(jq_py $B 'j["data"][0]["id"]')" $MODEL $B "model id"
expect "$(code $B "$U/v1/models/$MODEL")" 200 $B "one model"
expect "$(code $B "$U/v1/models/nope")" 404 $B "unknown model"
expect "$(code $B "$U/nowhere")" 404 $B "unknown URL"
expect "$(code $B -X DELETE "$U/v1/models")" 405 $B "wrong method"
expect "$(code $B "$U/metrics")" 200 $B metrics
grep -q '^troupe_' $B || fail "/metrics has no troupe_ samples"

note "401 without or with a wrong key"
chat='{"model":"'$MODEL'","messages":[{"role":"user","content":"Say hello"}],"max_tokens":4,"temperature":0}'
expect "$(code $B -H 'Content-Type: application/json' -d "$chat" "$U/v1/chat/completions")" 401 $B "no key"
err_shape $B None
grep -qi '^WWW-Authenticate: Bearer' $B.h || fail "401 without WWW-Authenticate"
expect "$(code $B -H "Authorization: Bearer sk-wrong-key-999" -d "$chat" "$U/v1/chat/completions")" 401 $B "wrong key"

note "chat and completions, not streamed"
expect "$(code $B -H "$K" -d "$chat" "$U/v1/chat/completions")" 200 $B chat
$PY - $B <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["object"] == "chat.completion" and j["id"].startswith("chatcmpl-"), j
c = j["choices"][0]
assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str), c
assert c["finish_reason"] in ("stop", "length"), c
u = j["usage"]
assert u["completion_tokens"] >= 1 and u["prompt_tokens"] > 5, u
assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
assert "cached_tokens" in u["prompt_tokens_details"], u
print("chat:", repr(c["message"]["content"]), c["finish_reason"], u)
PY
expect "$(code $B -H "$K" -d '{"model":"'$MODEL'","prompt":[1,2,3,4],"max_tokens":3,"logprobs":0}' "$U/v1/completions")" 200 $B completion
$PY - $B <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
c = j["choices"][0]
assert j["object"] == "text_completion" and c["finish_reason"] == "length", j
assert j["usage"]["prompt_tokens"] == 4 and j["usage"]["completion_tokens"] == 3, j
lp = c["logprobs"]
assert len(lp["token_logprobs"]) == 3 and all(v <= 0 for v in lp["token_logprobs"]), lp
PY

note "top_logprobs: alternatives sorted and <= 0; greedy's choice is their top-1, its logprob equal"
tl='{"model":"'$MODEL'","messages":[{"role":"user","content":"Name a colour"}],"max_tokens":6,"temperature":0,"logprobs":true,"top_logprobs":5}'
expect "$(code $B -H "$K" -d "$tl" "$U/v1/chat/completions")" 200 $B "chat top_logprobs"
$PY - $B <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
content = j["choices"][0]["logprobs"]["content"]
assert len(content) == j["usage"]["completion_tokens"] == 6, (len(content), j["usage"])
for e in content:
    top = e["top_logprobs"]
    assert len(top) == 5, e
    lps = [t["logprob"] for t in top]
    assert all(v <= 0 for v in lps) and lps == sorted(lps, reverse=True), lps
    assert set(top[0]) == {"token", "logprob", "bytes"}, top[0]
    assert (top[0]["token"], top[0]["bytes"], top[0]["logprob"]) == (e["token"], e["bytes"], e["logprob"]), e
    assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"], e
print("chat top_logprobs:", [(e["token"], round(e["logprob"], 3), [t["token"] for t in e["top_logprobs"][:3]]) for e in content[:3]])
PY
expect "$(code $B -H "$K" -d '{"model":"'$MODEL'","prompt":"In the beginning","max_tokens":4,"temperature":0,"logprobs":3}' "$U/v1/completions")" 200 $B "completion logprobs 3"
$PY - $B <<'PY'
import json, sys
lp = json.load(open(sys.argv[1]))["choices"][0]["logprobs"]
assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4, lp
for tok, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
    assert 1 <= len(top) <= 3 and all(x <= 0 for x in top.values()), top
    assert top.get(tok) == v and v == max(top.values()), (tok, v, top)   # greedy: the likeliest
PY
note "... streamed and sampled: every token's chunk carries its 4 alternatives"
curl -sN --max-time 60 -H "$K" -d '{"model":"'$MODEL'","messages":[{"role":"user","content":"Go"}],"max_tokens":5,"temperature":1,"seed":3,"stream":true,"logprobs":true,"top_logprobs":4}' "$U/v1/chat/completions" > $B
$PY - $B <<'PY'
import json, sys
ev = [json.loads(l[6:]) for l in open(sys.argv[1]).read().split("\n\n") if l.startswith("data: {")]
entries = [e for c in ev for ch in c["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
assert len(entries) == 5, ev
for e in entries:
    lps = [t["logprob"] for t in e["top_logprobs"]]
    assert len(lps) == 4 and all(v <= 0 for v in lps) and lps == sorted(lps, reverse=True), e
    assert e["logprob"] <= lps[0], e   # the sampled token is never likelier than the likeliest
PY

note "n = 2 with a seed: two choices, index 0 and 1, choice i as one request with seed + i; usage sums"
n2='{"model":"'$MODEL'","prompt":[11,12,13,14],"max_tokens":5,"temperature":1,"seed":7,"n":2}'
expect "$(code $B -H "$K" -d "$n2" "$U/v1/completions")" 200 $B "n=2"
cp $B $WORK/n2.json
expect "$(code $B -H "$K" -d '{"model":"'$MODEL'","prompt":[11,12,13,14],"max_tokens":5,"temperature":1,"seed":8}' "$U/v1/completions")" 200 $B "seed 8 alone"
$PY - $WORK/n2.json $B <<'PY'
import json, sys
j, one = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
cs = j["choices"]
assert [c["index"] for c in cs] == [0, 1], cs
assert all(c["finish_reason"] == "length" for c in cs), cs
assert j["usage"]["completion_tokens"] == 10 and j["usage"]["prompt_tokens"] == 4, j["usage"]
assert cs[0]["text"] != cs[1]["text"], cs                 # seeds 7 and 8
assert cs[1]["text"] == one["choices"][0]["text"], (cs[1], one)
print("n=2:", [c["text"] for c in cs])
PY
curl -sN --max-time 60 -H "$K" -d '{"model":"'$MODEL'","messages":[{"role":"user","content":"Two"}],"max_tokens":4,"temperature":1,"seed":5,"n":2,"stream":true,"stream_options":{"include_usage":true}}' "$U/v1/chat/completions" > $B
$PY - $B <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]).read().split("\n\n") if l.strip()]
assert lines[-1] == "data: [DONE]", lines[-3:]
ev = [json.loads(l[6:]) for l in lines[:-1]]
assert all(len(e["choices"]) <= 1 for e in ev), ev
by = {0: [], 1: []}
for e in ev:
    for c in e["choices"]:
        by[c["index"]].append(c)
for i, cs in by.items():
    assert cs[0]["delta"].get("role") == "assistant", (i, cs[0])
    fins = [c["finish_reason"] for c in cs]
    assert fins[-1] == "length" and all(f is None for f in fins[:-1]), (i, fins)
    assert sum(1 for c in cs if "role" not in c["delta"] and c["finish_reason"] is None) == 4, (i, cs)
assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 8, ev[-1]
PY

note "streamed chat with include_usage"
curl -sN --max-time 60 -H "$K" -d '{"model":"'$MODEL'","messages":[{"role":"user","content":"Count"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}' \
  "$U/v1/chat/completions" -D $B.h > $B
grep -qi '^Content-Type: text/event-stream' $B.h || fail "stream content type"
grep -qi '^Transfer-Encoding: chunked' $B.h || fail "stream is not chunked"
$PY - $B <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]).read().split("\n\n") if l.strip()]
assert lines[-1] == "data: [DONE]", lines[-3:]
ev = [json.loads(l[6:]) for l in lines[:-1]]
assert ev[0]["choices"][0]["delta"]["role"] == "assistant", ev[0]
fins = [e["choices"][0]["finish_reason"] for e in ev if e["choices"]]
assert fins[-1] == "length" and all(f is None for f in fins[:-1]), fins
assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 5, ev[-1]
assert all(e["usage"] is None for e in ev[:-1]), "chunks before the last carry usage: null"
print("stream:", "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e["choices"]))
PY

note "cached_tokens on a second turn with a prompt_cache_key (pinned 1 h)"
long=$($PY -c 'print(" ".join(f"word{i}" for i in range(80)))')
turn='{"model":"'$MODEL'","messages":[{"role":"system","content":"'"$long"'"},{"role":"user","content":"hi"}],"max_tokens":2,"prompt_cache_key":"conv-1","prompt_cache_options":{"ttl":"1h"}}'
expect "$(code $B -H "$K" -d "$turn" "$U/v1/chat/completions")" 200 $B "turn 1"
sleep 0.5
expect "$(code $B -H "$K" -d "$turn" "$U/v1/chat/completions")" 200 $B "turn 2"
cached=$(jq_py $B 'j["usage"]["prompt_tokens_details"]["cached_tokens"]')
prompt=$(jq_py $B 'j["usage"]["prompt_tokens"]')
echo "second turn: $cached of $prompt prompt tokens from cache"
[ "$cached" -ge 16 ] || fail "second turn: cached_tokens $cached"
[ "$cached" -lt "$prompt" ] || fail "cached_tokens $cached >= prompt_tokens $prompt"
# Where they came from, next to OpenAI's total: the three add up to it (no disk tier here).
split=$(jq_py $B '" ".join(str(j["usage"]["prompt_tokens_details"][f"cached_{k}_tokens"]) for k in ("device", "host", "disk"))')
read -r sdev shost sdisk <<<"$split"
echo "second turn's cached tokens: device $sdev, host $shost, disk $sdisk"
[ $((sdev + shost + sdisk)) = "$cached" ] && [ "$sdisk" = 0 ] || fail "cached tokens by source ($split) vs cached_tokens $cached"
# The same prompt under another tenant shares nothing (the per-tenant salt).
expect "$(code $B -H "Authorization: Bearer sk-test-beta-0002" -d "$turn" "$U/v1/chat/completions")" 200 $B "other tenant"
expect "$(jq_py $B 'j["usage"]["prompt_tokens_details"]["cached_tokens"]')" 0 $B "another tenant's cached_tokens"

note "400s in OpenAI's shape"
bad() {  # bad STATUS PARAM BODY [path]
  expect "$(code $B -H "$K" -d "$3" "$U${4:-/v1/chat/completions}")" "$1" $B "$3"
  err_shape $B "$2"
}
m='"model":"'$MODEL'","messages":[{"role":"user","content":"x"}]'
bad 400 None '{"model": '
bad 400 None '[1,2]'
bad 404 model '{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}'
bad 400 messages '{"model":"'$MODEL'"}'
bad 400 temperature "{$m,\"temperature\":\"warm\"}"
bad 400 temperature "{$m,\"temperature\":7}"
bad 400 top_p "{$m,\"top_p\":0}"
bad 400 max_tokens "{$m,\"max_tokens\":-1}"
bad 400 n "{$m,\"n\":17}"   # 1..16
bad 400 top_logprobs "{$m,\"logprobs\":true,\"top_logprobs\":21}"
bad 400 top_logprobs "{$m,\"top_logprobs\":2}"   # needs logprobs: true
bad 400 logprobs '{"model":"'$MODEL'","prompt":"x","logprobs":6}' /v1/completions
bad 400 prompt_cache_key "{$m,\"prompt_cache_retention\":\"24h\"}"
bad 400 prompt_cache_options.ttl "{$m,\"prompt_cache_key\":\"k\",\"prompt_cache_options\":{\"ttl\":\"30d\"}}"
bad 400 prompt_cache_retention "{$m,\"prompt_cache_key\":\"k\",\"prompt_cache_retention\":\"1y\"}"
bad 400 messages "{$m,\"max_tokens\":5000}"   # prompt + max_tokens past the 4096-token context
$PY -c "import json,sys; e=json.load(open(sys.argv[1]))['error']; assert e['code']=='context_length_exceeded', e" $B
bad 400 prompt '{"model":"'$MODEL'","prompt":["a","b"]}' /v1/completions

note "413 for a body past gateway.max_body_bytes (65536)"
$PY -c 'import json; print(json.dumps({"model":"m","prompt":"x"*70000}))' > $WORK/big.json
expect "$(code $B -H "$K" --data-binary @$WORK/big.json "$U/v1/completions")" 413 $B "oversized body"
err_shape $B None
# ... also without a Content-Length (chunked upload).
expect "$(code $B -H "$K" -H 'Transfer-Encoding: chunked' --data-binary @$WORK/big.json "$U/v1/completions")" 413 $B "chunked oversized"

note "429 with Retry-After past requests_per_minute (2)"
L="Authorization: Bearer sk-test-limited-03"
small='{"model":"'$MODEL'","prompt":[1,2],"max_tokens":1}'
expect "$(code $B -H "$L" -d "$small" "$U/v1/completions")" 200 $B "limited 1"
expect "$(code $B -H "$L" -d "$small" "$U/v1/completions")" 200 $B "limited 2"
expect "$(code $B -H "$L" -d "$small" "$U/v1/completions")" 429 $B "limited 3"
err_shape $B None
ra=$(grep -i '^Retry-After:' $B.h | tr -dc 0-9)
[ -n "$ra" ] && [ "$ra" -ge 1 ] && [ "$ra" -le 60 ] || fail "429 Retry-After '$ra'"
echo "429 Retry-After: $ra s"

note "429 with Retry-After past tokens_per_minute (10): the first request's tokens put the key in debt"
T="Authorization: Bearer sk-test-tokens-004"
expect "$(code $B -H "$T" -d "$small" "$U/v1/completions")" 200 $B "tokens 1"
expect "$(code $B -H "$T" -d '{"model":"'$MODEL'","prompt":[1,2,3,4,5,6,7,8,9,10,11,12],"max_tokens":1}' "$U/v1/completions")" 200 $B "tokens 2"
expect "$(code $B -H "$T" -d "$small" "$U/v1/completions")" 429 $B "tokens 3"
expect "$(jq_py $B 'j["error"]["type"]')" tokens $B "429 type"
grep -qi '^Retry-After: [0-9]' $B.h || fail "429 (tokens) without Retry-After"

note "503 with Retry-After when the router is full (admission_queue 3)"
slow='{"model":"'$MODEL'","prompt":[5,6,7],"max_tokens":120,"stream":true}'
pids=()
for i in 1 2 3 4 5 6; do
  curl -s -o $WORK/full$i -D $WORK/full$i.h -w '%{http_code}' --max-time 90 -H "$K" -d "$slow" "$U/v1/completions" > $WORK/full$i.code &
  pids+=($!)
done
wait "${pids[@]}"
n503=0 n200=0
for i in 1 2 3 4 5 6; do
  c=$(cat $WORK/full$i.code)
  [ "$c" = 200 ] && n200=$((n200 + 1))
  if [ "$c" = 503 ]; then
    n503=$((n503 + 1)); err_shape $WORK/full$i None
    grep -qi '^Retry-After: [0-9]' $WORK/full$i.h || fail "503 without Retry-After"
  fi
done
echo "6 at once against admission_queue 3: $n200 streamed, $n503 got 503"
[ "$n503" -ge 1 ] && [ "$n200" -ge 1 ] || fail "expected some 200 and some 503"

note "a stalled client is cut off (idle_timeout_s 2)"
start=$(date +%s)
$PY - "$U" <<'PY'
import socket, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
s = socket.create_connection((u.hostname, u.port))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-alpha-0001\r\n"
          b"Content-Length: 100\r\n\r\n{\"model\"")
s.settimeout(30)
try:
    got = s.recv(100)
except socket.timeout:
    sys.exit("the gateway kept a stalled upload open for 30 s")
assert not got.startswith(b"HTTP/1.1 2"), got
print("stalled upload closed by the gateway; it said", repr(got[:40]))
PY

note "a client that disconnects mid-stream cancels its request"
before=$(gw_router_metric "$WORK/t.yaml" requests_cancelled)
curl -sN --max-time 2 -H "$K" -d '{"model":"'$MODEL'","prompt":[9,8,7],"max_tokens":2000,"stream":true}' "$U/v1/completions" > $WORK/cut || true
grep -q '^data: ' $WORK/cut || fail "no stream before the disconnect"
now=$(gw_wait_cancelled "$WORK/t.yaml" "$before")
echo "router requests_cancelled: $before -> $now"
note "... and one that disconnects while waiting for a non-streamed reply (seen within a second)"
before=$now
curl -s --max-time 1 -H "$K" -d '{"model":"'$MODEL'","prompt":[9,8,7],"max_tokens":2000}' "$U/v1/completions" > /dev/null || true
now=$(gw_wait_cancelled "$WORK/t.yaml" "$before")
echo "router requests_cancelled: $before -> $now"
note "... and one with n = 2: both its requests are cancelled"
before=$now
curl -sN --max-time 2 -H "$K" -d '{"model":"'$MODEL'","prompt":[9,8,6],"max_tokens":2000,"n":2,"stream":true}' "$U/v1/completions" > $WORK/cut2 || true
grep -q '"index":1' $WORK/cut2 || fail "no stream of choice 1 before the disconnect"
now=$(gw_wait_cancelled "$WORK/t.yaml" "$((before + 1))")
echo "router requests_cancelled: $before -> $now"
note "a gateway killed with -9 is restarted by the supervisor and serves again"
gpid=$(actor_pid "$WORK/t.yaml" gateway)
[ -n "$gpid" ] || fail "no gateway pid from the monitor"
kill -KILL "$gpid"
health() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$U/health")" = 200 ] && \
           [ "$(actor_pid "$WORK/t.yaml" gateway)" != "$gpid" ]; }
wait_for health || fail "the gateway did not come back after kill -9"
expect "$(code $B -H "$K" -d "$chat" "$U/v1/chat/completions")" 200 $B "chat after the restart"
echo "gateway $gpid killed; pid $(actor_pid "$WORK/t.yaml" gateway) serves"
echo "PASS gateway"
