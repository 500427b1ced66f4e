# The demo's text: what a new user sees first is real English, and it is the model's own greedy
# output. The default topology (topology/examples/cpu-default.yaml, equal to the embedded one:
# test_topology checks that) serves models/kjv-tiny; this test runs it as it is except for its
# name, tcp ports and run directory (so that it can run beside another cluster), from the
# repository root as `make demo` does (model.path is relative to the supervisor's directory).
#   1. "And God said", 32 tokens at temperature 0 through the cluster (router, prefill, KV
#      hand-off, decode) gives exactly troupe-generate's ids and text on the same model;
#   2. that text is printable English: ASCII letters, spaces and punctuation, mostly words of
#      two or more letters, and common English words among them (random weights give neither);
#   3. tools/demo.sh itself, on the same topology, prints that same text and exits 0.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
prompt="And God said"
[ -f models/kjv-tiny/model.safetensors ] || fail "models/kjv-tiny is missing from the repository"

# The default topology with this test's name, ports and run directory; nothing else changes.
p1=$(free_port); p2=$(free_port); p3=$(free_port)
/usr/bin/python3 - topology/examples/cpu-default.yaml "$WORK/demo.yaml" "t-demo-text-$$" "$p1" "$p2" "$p3" \
    "$WORK/run" <<'PY' || fail "cannot derive the test topology from cpu-default.yaml"
import sys
src, dst, name, p1, p2, p3, run = sys.argv[1:]
text = open(src).read()
for old, new in [("name: cpu-default\n", f"name: {name}\n"),
                 ("client: tcp://127.0.0.1:5555", f"client: tcp://127.0.0.1:{p1}"),
                 ("inspect: tcp://127.0.0.1:5556", f"inspect: tcp://127.0.0.1:{p2}"),
                 ("metrics: tcp://127.0.0.1:5557", f"metrics: tcp://127.0.0.1:{p3}\n  run_dir: {run}")]:
    if text.count(old) != 1:
        sys.exit(f"cpu-default.yaml: expected one '{old.strip()}'")
    text = text.replace(old, new)
open(dst, "w").write(text)
PY
grep -q '^  path: models/kjv-tiny$' "$WORK/demo.yaml" || fail "the default topology does not serve models/kjv-tiny"

note "troupe-generate (one process)"
"$BIN/troupe-generate" models/kjv-tiny --prompt "$prompt" --max-tokens 32 --temperature 0 --json \
  > "$WORK/generate.json" 2>"$WORK/generate.log" || { cat "$WORK/generate.log"; fail "troupe-generate failed"; }

note "the default topology's cluster"
start_cluster "$WORK/demo.yaml"
"$BIN/troupe-client" --topology "$WORK/demo.yaml" --json --timeout-ms 60000 submit --max-tokens 32 \
  --temperature 0 "$prompt" > "$WORK/client.jsonl" 2>"$WORK/client.log" || { cat "$WORK/client.log"; fail "submit failed"; }

/usr/bin/python3 - "$WORK/generate.json" "$WORK/client.jsonl" > "$WORK/text" <<'PY' || fail "the cluster's text"
import json, re, sys
gen = json.load(open(sys.argv[1]))
ids, text, done = [], "", None
for line in open(sys.argv[2]):
    m = json.loads(line)
    if m["type"] == "token":
        ids += m["tokens"]; text += m["text"]
    elif m["type"] == "done":
        done = m
    else:
        sys.exit(f"unexpected reply {m}")
if done is None:
    sys.exit("no done reply")
if ids != gen["ids"]:
    sys.exit(f"cluster ids {ids}\n != troupe-generate's {gen['ids']}")
if text != gen["text"]:
    sys.exit(f"cluster text {text!r}\n != troupe-generate's {gen['text']!r}")
if len(ids) != 32 or done["usage"]["completion_tokens"] != 32:
    sys.exit(f"{len(ids)} tokens, done says {done['usage']}: expected 32 (the model stops only at <|endoftext|>)")
# Printable English: ASCII letters, digits, spaces, newlines and punctuation only; words of
# letters (with an apostrophe or trailing punctuation) make up most of it; common words occur.
if not re.fullmatch(r"[A-Za-z0-9 \n.,;:?!'()-]+", text):
    sys.exit(f"not printable English text: {text!r}")
words = text.split()
wordy = [w for w in words if re.fullmatch(r"[A-Za-z]+('[a-z]+)?[.,;:?!)]*", w)]
common = {"and", "the", "of", "unto", "he", "i", "him", "said", "to", "shall", "will", "not", "that",
          "thee", "thou", "my", "me", "his", "is", "in", "for", "a", "be", "lord", "god", "them", "they",
          "was", "with", "all", "but", "do", "what", "ye", "it", "which", "upon", "their", "thy"}
found = {w.strip(".,;:?!()").lower() for w in words} & common
if len(words) < 12 or len(wordy) < 0.9 * len(words) or len(found) < 5:
    sys.exit(f"does not read as English ({len(words)} words, {len(wordy)} plain, common {sorted(found)}): {text!r}")
print(text, end="")
PY
note "greedy text: $(tr '\n' ' ' < "$WORK/text")"
kill -TERM "$SUP_PID"
rc=0; wait "$SUP_PID" || rc=$?
SUP_PID=
[ "$rc" = 0 ] || fail "the supervisor exited $rc after SIGTERM"

note "tools/demo.sh on the same topology"
TOPOLOGY="$WORK/demo.yaml" TROUPE_BIN="$BIN" tools/demo.sh > "$WORK/demo.out" 2>&1 \
  || { cat "$WORK/demo.out"; fail "tools/demo.sh exited non-zero"; }
/usr/bin/python3 - "$WORK/text" "$WORK/demo.out" <<'PY' || { cat "$WORK/demo.out"; fail "the demo's text"; }
import sys
text, out = open(sys.argv[1]).read(), open(sys.argv[2]).read()
if text not in out:
    sys.exit("tools/demo.sh did not print troupe-generate's text")
if "cluster stopped (supervisor exit 0)" not in out:
    sys.exit("the demo's cluster did not stop cleanly")
PY
echo "PASS"
