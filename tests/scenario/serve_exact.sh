# Exactness: for every engine fixture, greedy tokens through the whole cluster (supervisor, router,
# prefill, KV hand-off, decode) equal the one-process troupe-generate output and transformers'
# greedy — while 32 other requests of random lengths run at the same time, with prompts split
# across prefill chunks (prefill_chunk_tokens: 8), over two prefill and two decode workers.
. "$(dirname "$0")/lib.sh"
for model in "$ROOT"/tests/fixtures/models/*/expected.json; do
  dir=$(dirname "$model"); name=$(basename "$dir")
  note "$name"
  MODEL_PATH=$dir N_PREFILL=2 N_DECODE=2 make_topology "$WORK/$name.yaml" "limits:" "  prefill_chunk_tokens: 8" "  max_batch: 48"
  # The one-process reference for each prompt.
  /usr/bin/python3 - "$model" > "$WORK/$name.prompts" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]:
    print(",".join(map(str, p["ids"])))
PY
  : > "$WORK/$name.generate"
  while read -r ids; do
    "$BIN/troupe-generate" "$dir" --ids "$ids" --max-tokens 32 --temperature 0 --ignore-eos --json \
      | /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))' >> "$WORK/$name.generate"
  done < "$WORK/$name.prompts"
  start_cluster "$WORK/$name.yaml"
  ep=$(grep 'client:' "$WORK/$name.yaml" | awk '{print $2}')
  PYTHONPATH="$ROOT/tools" /usr/bin/python3 - "$ep" "$model" "$WORK/$name.generate" <<'PY'
import json, random, sys, threading
from troupe_client import Client
ep, expected, gen_file = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
generate = [list(map(int, l.split(","))) for l in open(gen_file).read().split()]
vocab = 500
results, errors = {}, []
def run(key, ids, max_tokens):
    try:
        with Client(ep, timeout_s=120) as c:
            toks, final = [], None
            for m in c.generate(tokens=ids, max_tokens=max_tokens, temperature=0, ignore_eos=True):
                if m["type"] == "token": toks += m["tokens"]
                else: final = m
            results[key] = (toks, final)
    except Exception as e:
        errors.append(f"{key}: {e}")
random.seed(5)
threads = [threading.Thread(target=run, args=(("fx", i), p["ids"], 32)) for i, p in enumerate(expected["prompts"])]
threads += [threading.Thread(target=run, args=(("bg", i), [random.randrange(vocab) for _ in range(random.randrange(1, 60))],
                                               random.randrange(1, 40))) for i in range(32)]
random.shuffle(threads)
for t in threads: t.start()
for t in threads: t.join()
assert not errors, errors
for key, (toks, final) in results.items():
    assert final and final["type"] == "done", (key, final)
for i, p in enumerate(expected["prompts"]):
    toks, final = results[("fx", i)]
    assert toks == generate[i], f"prompt {i}: cluster {toks} != generate {generate[i]}"
    assert toks == p["greedy"], f"prompt {i}: cluster {toks} != transformers {p['greedy']}"
    assert final["usage"]["completion_tokens"] == 32 and final["usage"]["prompt_tokens"] == len(p["ids"])
print(f"{expected['variant']}: 3 prompts equal to generate and transformers; {len(results)} requests done")
PY
  kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=
done
echo "PASS serve_exact"
