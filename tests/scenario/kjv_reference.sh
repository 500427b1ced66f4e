# kjv-deepseek (a real DeepSeek-V3-architecture checkpoint of the shared KJV models, with an MTP
# layer) against transformers: troupe-generate's greedy tokens on the CPU equal the reference's
# (tests/fixtures/kjv/kjv-deepseek.json: transformers 5.17 in float64, greedy by full
# recomputation, made by tests/fixtures/make_kjv_reference.py), 32 tokens for each of 3 prompts,
# and so does speculation with the model's own MTP layer (--speculation mtp:2). Skips when the
# shared models folder (TROUPE_MODELS, default ../shared/models) is absent.
. "$(dirname "$0")/lib.sh"
MODELS=${TROUPE_MODELS:-$ROOT/../shared/models}
model=$MODELS/kjv-deepseek
ref=$ROOT/tests/fixtures/kjv/kjv-deepseek.json
if [ ! -d "$model" ]; then echo "SKIP: $model absent"; exit 0; fi
n=$($PY -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["prompts"]))' "$ref")
for ((i = 0; i < n; i++)); do
  ids=$($PY -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["ids"])))' "$ref" "$i")
  want=$($PY -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["greedy"])))' "$ref" "$i")
  for spec in off mtp:2; do
    got=$(TROUPE_SPECULATION= "$BIN/troupe-generate" "$model" --backend cpu --ids "$ids" --max-tokens 32 --temperature 0 \
            --ignore-eos --speculation "$spec" --json | $PY -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))') \
      || fail "prompt $i, speculation $spec: troupe-generate failed"
    [ "$got" = "$want" ] || fail "prompt $i, speculation $spec: '$got', transformers '$want'"
  done
  echo "prompt $i ($(echo "$ids" | tr ',' '\n' | wc -l) ids): 32 greedy tokens equal to transformers, with and without MTP speculation"
done
echo PASS
