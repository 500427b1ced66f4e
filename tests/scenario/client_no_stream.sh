# A request that does not stream (submit.stream false: troupe-client --no-stream, the Python
# client's generate(stream=False)) gets one reply: the done, carrying the whole completion, its
# token ids, text and logprobs (when asked for); the router collects the workers' token messages
# instead of relaying them. The router used to relay them whatever the flag said. Streaming stays
# the default, and both ways give the same tokens and text (temperature 0, models/kjv-tiny: a real
# tokenizer, so the text is checked too). Then a cancelled request that does not stream: its done
# (finish cancelled) carries what was made before the cancel; and sampling.top_logprobs, which a
# done cannot carry, is refused for a request that does not stream (Python client part: skipped
# without pyzmq).
. "$(dirname "$0")/lib.sh"
MODEL_PATH=$ROOT/models/kjv-tiny make_topology "$WORK/t.yaml"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
start_cluster "$WORK/t.yaml"
prompt="And God said"

submit() {   # OUT ARGS...: troupe-client --json submit ARGS into OUT (one JSON message a line)
  local out=$1
  shift
  timeout 60 "$BIN/troupe-client" --endpoint "$ep" --json --timeout-ms 50000 submit "$@" >"$out" 2>"$out.err" \
    || fail "submit $*: exit $?: $(cat "$out.err")"
}

note "streamed (the default), then --no-stream, then --no-stream --logprobs"
submit "$WORK/stream.jsonl" --max-tokens 24 --temperature 0 --ignore-eos "$prompt"
submit "$WORK/whole.jsonl" --max-tokens 24 --temperature 0 --ignore-eos --no-stream "$prompt"
submit "$WORK/whole_lp.jsonl" --max-tokens 24 --temperature 0 --ignore-eos --no-stream --logprobs "$prompt"
submit "$WORK/ids.jsonl" --max-tokens 5 --temperature 0 --ignore-eos --no-stream --ids 1,2,3
$PY - "$WORK" <<'PY' || fail "the replies"
import json, sys
work = sys.argv[1]
def replies(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
s = replies("stream")
assert [m["type"] for m in s[:-1]] == ["token"] * (len(s) - 1) and s[-1]["type"] == "done", [m["type"] for m in s]
assert len(s) > 2, f"streamed: {len(s)} replies, expected several tokens then the done"
ids = [t for m in s[:-1] for t in m["tokens"]]
text = "".join(m.get("text", "") for m in s[:-1])
assert len(ids) == 24 and text.strip(), (ids, text)
assert "tokens" not in s[-1] and "text" not in s[-1], f"a streamed request's done repeats the completion: {s[-1]}"
for name in ("whole", "whole_lp"):
    w = replies(name)
    assert [m["type"] for m in w] == ["done"], f"{name}: {[m['type'] for m in w]}, expected one done (not a stream)"
    d = w[0]
    assert d.get("tokens") == ids, f"{name}: done.tokens {d.get('tokens')} != the streamed {ids}"
    assert d.get("text") == text, f"{name}: done.text {d.get('text')!r} != the streamed {text!r}"
    assert d["usage"]["completion_tokens"] == 24, d["usage"]
    assert d["finish"] == "length", d
    lp = d.get("logprobs")
    if name == "whole_lp":
        assert lp is not None and len(lp) == 24 and all(x <= 0 for x in lp), lp
    else:
        assert lp is None, f"logprobs not asked for: {lp}"
i = replies("ids")
assert [m["type"] for m in i] == ["done"] and len(i[0]["tokens"]) == 5, i
print(f"streamed {len(s) - 1} token messages; not streamed: one done with the same {len(ids)} tokens and text {text!r}")
PY

note "plain output: the text on stdout either way"
timeout 60 "$BIN/troupe-client" --endpoint "$ep" submit --max-tokens 24 --temperature 0 --ignore-eos "$prompt" \
  >"$WORK/stream.txt" 2>/dev/null || fail "plain streamed submit"
timeout 60 "$BIN/troupe-client" --endpoint "$ep" submit --max-tokens 24 --temperature 0 --ignore-eos --no-stream \
  "$prompt" >"$WORK/whole.txt" 2>"$WORK/whole.err" || fail "plain --no-stream submit: $(cat "$WORK/whole.err")"
cmp "$WORK/stream.txt" "$WORK/whole.txt" || fail "--no-stream printed '$(cat "$WORK/whole.txt")', streamed '$(cat "$WORK/stream.txt")'"
[ -s "$WORK/whole.txt" ] || fail "--no-stream printed nothing"
grep -q '\[done: length' "$WORK/whole.err" || fail "--no-stream: no done line on stderr: $(cat "$WORK/whole.err")"

# The Python client: the same through generate(stream=False) and complete(stream=False).
if ! $PY -c 'import zmq, msgpack' 2>/dev/null; then
  echo "SKIP (Python client part): no pyzmq / msgpack for $PY"
else
  $PY - "$ep" "$WORK/stream.jsonl" <<'PY' || fail "the Python client"
import json, sys
from troupe_client import Client, TroupeError
ep, streamed = sys.argv[1], [json.loads(l) for l in open(sys.argv[2])]
text = "".join(m.get("text", "") for m in streamed[:-1])
with Client(ep, timeout_s=60) as c:
    got = list(c.generate("And God said", max_tokens=24, temperature=0, ignore_eos=True, stream=False))
    assert [m["type"] for m in got] == ["done"], [m["type"] for m in got]
    assert got[0]["text"] == text, (got[0]["text"], text)
    assert c.complete("And God said", max_tokens=24, temperature=0, ignore_eos=True, stream=False) == text
    assert c.complete("And God said", max_tokens=24, temperature=0, ignore_eos=True) == text
    # A done carries no alternatives: a request that does not stream cannot ask for them.
    rid = c.send("submit", tokens=[1, 2, 3], stream=False,
                 sampling={"max_tokens": 4, "logprobs": True, "top_logprobs": 2})
    m = c.recv(30)
    assert m and m["id"] == rid and m["type"] == "error" and m["code_name"] == "bad_request", m
    assert m.get("field") == "sampling.top_logprobs" and "stream" in m["message"], m
print("the Python client: one done, the same text; top_logprobs without streaming refused")
PY
fi

note "cancelled before the end: the done carries what was made (the demo model: slow enough to cancel mid-request)"
kill -TERM "$SUP_PID"
wait "$SUP_PID" || fail "the first cluster's supervisor: exit $?"
make_demo_topology "$WORK/demo.yaml"
sed -i 's/^name: \(.*\)$/name: \1-demo/' "$WORK/demo.yaml"
ep=$(grep '^  client:' "$WORK/demo.yaml" | awk '{print $2}')
start_cluster "$WORK/demo.yaml"
timeout 60 "$BIN/troupe-client" --endpoint "$ep" --json submit --max-tokens 2000 --ignore-eos --no-stream \
  --cancel-after-ms 1500 "$prompt" >"$WORK/cancel.jsonl" 2>"$WORK/cancel.err" || fail "cancelled submit: $(cat "$WORK/cancel.err")"
$PY - "$WORK/cancel.jsonl" <<'PY' || fail "the cancelled request"
import json, sys
w = [json.loads(l) for l in open(sys.argv[1])]
assert [m["type"] for m in w] == ["done"], [m["type"] for m in w]
d = w[0]
assert d["finish"] == "cancelled", d
n = d["usage"]["completion_tokens"]
assert 0 < n < 2000 and len(d.get("tokens", [])) == n, (n, len(d.get("tokens", [])))
print(f"cancelled after {n} tokens: all of them in its done")
PY

echo "PASS client_no_stream"
