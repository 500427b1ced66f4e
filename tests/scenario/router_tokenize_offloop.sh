# Tokenizing happens off the router's loop (actors/router/tokpool.h): one client's long text prompt
# (just under the message's 4 MiB prompt cap and the router's byte bound) is encoded by
# a tokenizer thread while another client's short token-id request, submitted right after it, is
# routed and streams its first token. Both latencies are printed; the short request's first token
# must come well before the long prompt's reply (generous: under half of it). A cancel of a second
# long prompt while it is still encoding ends it exactly once (one cancelled done, no late reply).
. "$(dirname "$0")/lib.sh"
# The test model with a long context (its weights linked): the byte bound becomes megabytes, whose
# encode takes long enough to see (at 512 positions it is 64 kB, a few milliseconds).
mkdir -p "$WORK/model"
for f in "$ROOT"/tests/fixtures/models/qwen3-f32/*; do ln -s "$f" "$WORK/model/"; done
rm "$WORK/model/config.json"
sed 's/"max_position_embeddings": *512/"max_position_embeddings": 32768/' \
  "$ROOT/tests/fixtures/models/qwen3-f32/config.json" > "$WORK/model/config.json"
MODEL_PATH=$WORK/model make_topology "$WORK/t.yaml" "limits:
  max_model_len: 32768"
sed -i "s|^  load_format: auto|  load_format: auto\n  tokenizer: $ROOT/third_party/tokenizers/qwen3|" "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
ep=$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" <<'PY'
import sys, time
from troupe_client import Client
ep = sys.argv[1]
long_c, short_c = Client(ep, 120), Client(ep, 120)
# Just under the prompt's cap (4 MiB, msg.h's MSG_MAX_PROMPT_BYTES; the byte bound here,
# 32768 tokens x 128 bytes, is the same 4 MiB).
cap = 4000000
words = "In the beginning God created the heaven and the earth. "
text = (words * (cap // len(words) + 1))[:cap - 1]
def long_reply(c, rid):
    while True:
        m = c.recv(120)
        assert m is not None, "the long prompt got no reply"
        if m["type"] in ("done", "error"):
            return m
t0 = time.time()
long_c.send("submit", id=2, prompt=text, sampling={"max_tokens": 4})
# A moment for the 4 MB frame to reach the router and its encode to start (on loopback the frame
# takes milliseconds; the encode hundreds): the short request comes in during the encode.
time.sleep(0.04)
t1 = time.time()
short_c.send("submit", id=3, tokens=[7, 8, 9, 10], sampling={"max_tokens": 4, "ignore_eos": True})
first = None
while True:
    m = short_c.recv(120)
    assert m is not None, "the short request got no reply"
    if first is None and m["type"] in ("token", "done"):
        first = (time.time() - t1) * 1000
    if m["type"] in ("done", "error"):
        assert m["type"] == "done", m
        break
lm = long_reply(long_c, 2)
long_ms = (time.time() - t0) * 1000
# Too many tokens for max_model_len once encoded: the same error as before, after the encode.
print(f"long text prompt of {len(text)} bytes: reply ({lm['type']}: {lm.get('message', '')[:70]}) "
      f"in {long_ms:.0f} ms; the short token-id request sent 40 ms after it: first token in {first:.0f} ms")
assert lm["type"] == "error" and lm.get("field") == "sampling.max_tokens" and "exceeds max_model_len" in lm["message"], lm
assert first < long_ms / 2, f"the short request waited for the long encode ({first:.0f} vs {long_ms:.0f} ms)"
# Cancelled while encoding: one cancelled done, and the late result is dropped.
long_c.send("submit", id=4, prompt=text, sampling={"max_tokens": 4})
long_c.send("cancel", id=4)
m = long_reply(long_c, 4)
assert m["type"] == "done" and m["finish_name"] == "cancelled", m
extra = long_c.recv(max(3.0, 3 * long_ms / 1000))
assert extra is None, f"a second reply after the cancel: {extra}"
# The router is still whole: a short text prompt goes through the pool to the workers (this test
# model's vocabulary is 512, smaller than the tokenizer's: the worker refuses the ids, once), and
# a token-id request is served.
replies = list(long_c.generate(prompt="In the beginning", max_tokens=2, ignore_eos=True, stream=False))
assert len(replies) == 1 and replies[0]["type"] == "error" and "outside the vocabulary" in replies[0]["message"], replies
last = list(long_c.generate(tokens=[7, 8, 9], max_tokens=2, ignore_eos=True, stream=False))[-1]
assert last["type"] == "done", last
PY
echo "PASS router_tokenize_offloop"
