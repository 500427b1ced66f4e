# The draft-model proposer is lossless, greedy, on a real pair (kjv-dense target, kjv-draft
# draft, sharing one tokenizer):
#   - single process: troupe-generate with --speculation draft:K (K = 2, 4, 6) gives the same ids
#     as without, for KJV prompts (K = 4 only for the last two), one of them ending on max_tokens inside an accepted run, one on
#     a stop id taken from its own output; the drafts must be accepted at some rate (a draft
#     that never agrees would make the comparison empty); a sampled run ends with all its tokens;
#   - the whole cluster (supervisor, router, prefill, KV hand-off, decode) with model.draft and
#     TROUPE_SPECULATION=draft:4: the same tokens as the cluster without speculation and as
#     troupe-generate, a sampled request ends with all its tokens, and the decode worker's stats
#     show verify steps with accepted drafts;
#   - a topology whose model.draft has another vocabulary stops the decode worker with a
#     configuration error naming both models.
# Skips when the shared models folder (TROUPE_MODELS, default ../shared/models) is absent.
. "$(dirname "$0")/lib.sh"
MODELS=${TROUPE_MODELS:-$ROOT/../shared/models}
target=$MODELS/kjv-dense draft=$MODELS/kjv-draft
if [ ! -d "$target" ] || [ ! -d "$draft" ]; then echo "SKIP: $target or $draft absent"; exit 0; fi
py=/usr/bin/python3
ids_of() { $py -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))'; }
gen() {   # gen PROMPT ARGS...: troupe-generate's JSON
  local p=$1; shift
  TROUPE_SPECULATION= "$BIN/troupe-generate" "$target" --backend cpu --threads 1 --prompt "$p" --temperature 0 \
    --ignore-eos --json "$@"
}
prompts=("And God said unto Moses" "In the beginning" "The LORD is my shepherd; I shall not want." "And it came to pass")
maxes=(48 37 40 29)

note "single process"
stop_id=$(gen "${prompts[0]}" --max-tokens 48 | ids_of | cut -d, -f9)
for i in "${!prompts[@]}"; do
  p=${prompts[$i]} m=${maxes[$i]}
  want=$(gen "$p" --max-tokens "$m" | ids_of)
  ks="4"; [ "$i" -lt 2 ] && ks="2 4 6"
  for k in $ks; do
    out=$(gen "$p" --max-tokens "$m" --speculation "draft:$k" --draft "$draft")
    got=$(echo "$out" | ids_of)
    [ "$got" = "$want" ] || fail "'$p' draft:$k: ids differ
  with    $got
  without $want"
    echo "$out" | $py -c 'import json,sys; s=json.load(sys.stdin)["speculation"]
print("  draft:%d %-45r acceptance %.3f, %.2f tokens per verify step" % (s["k"], sys.argv[1], s["acceptance_rate"], s["mean_accepted_length"]))
sys.exit(0 if s["accepted"] > 0 else 1)' "$p" || fail "'$p' draft:$k: no draft accepted"
  done
done
want=$(gen "${prompts[0]}" --max-tokens 48 --stop-id "$stop_id" | ids_of)
got=$(gen "${prompts[0]}" --max-tokens 48 --stop-id "$stop_id" --speculation draft:4 --draft "$draft" | ids_of)
[ "$got" = "$want" ] || fail "stop id $stop_id: with '$got', without '$want'"
[ "${got##*,}" = "$stop_id" ] || fail "stop id $stop_id: '$got' does not end on it"
n=$(gen "${prompts[1]}" --max-tokens 40 --temperature 0.8 --top-k 40 --seed 5 --speculation draft:4 --draft "$draft" \
    | ids_of | tr , '\n' | wc -l)
[ "$n" = 40 ] || fail "sampled with a draft: $n tokens, not 40"
# Refused: a draft whose tokenizer is not the target's (the synthetic fixture's, another size).
mkdir -p "$WORK/bad-draft"
cp "$draft/config.json" "$draft/model.safetensors" "$WORK/bad-draft/"
cp "$ROOT/tests/fixtures/tokenizer/synth/flags/tokenizer.json" "$WORK/bad-draft/"
if err=$(gen "x" --max-tokens 2 --draft "$WORK/bad-draft" 2>&1); then fail "a draft with another tokenizer was taken"; fi
echo "$err" | grep -q "bad-draft.*kjv-dense" || fail "the refusal does not name both models: $err"

note "cluster"
metric() {
  "$BIN/troupe-top" --topology "$1" --json | $py -c 'import json, sys
print(sum(m["value"] for a in json.load(sys.stdin)["actors"] if a.get("role") == "decode"
          for m in a["metrics"] if m["name"] == sys.argv[1]))' "$2"
}
topo=$WORK/draft.yaml
MODEL_PATH=$target N_PREFILL=1 N_DECODE=1 make_topology "$topo" "limits:" "  prefill_chunk_tokens: 8"
sed -i "/^model:/a\\  draft: $draft" "$topo"
grep -q "draft: $draft" "$topo" || fail "no model.draft in $topo"
cluster() {   # cluster SPEC OUT
  TROUPE_SPECULATION=$1 start_cluster "$topo"
  : > "$2"
  for i in "${!prompts[@]}"; do
    timeout 120 "$BIN/troupe-client" --topology "$topo" --json submit --temperature 0 --ignore-eos \
      --max-tokens "${maxes[$i]}" "${prompts[$i]}" | stream_summary >> "$2" || fail "troupe-client failed"
  done
}
cluster off "$WORK/plain"
kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=
cluster draft:4 "$WORK/spec"
cmp -s "$WORK/plain" "$WORK/spec" || { diff "$WORK/plain" "$WORK/spec"; fail "cluster: output with the draft differs"; }
for i in "${!prompts[@]}"; do
  want=$(gen "${prompts[$i]}" --max-tokens "${maxes[$i]}" | ids_of)
  got=$(sed -n "$((i + 1))p" "$WORK/spec")
  [ "$got" = "$want done" ] || fail "cluster prompt $i: '$got', troupe-generate '$want'"
done
for _ in $(seq 100); do
  acc=$(metric "$topo" spec_accepted_tokens_total)
  $py -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$acc" && break
  sleep 0.1
done
# A sampled request: the draft samples from its distribution, the verify takes the rejection rule;
# it must end done with all its tokens.
timeout 120 "$BIN/troupe-client" --topology "$topo" --json submit --temperature 0.8 --top-k 40 --seed 5 --ignore-eos \
  --max-tokens 40 "${prompts[1]}" | $py -c 'import json, sys
line, dec, pos, n, fin = sys.stdin.read(), json.JSONDecoder(), 0, 0, None
while pos < len(line):
    while pos < len(line) and line[pos].isspace(): pos += 1
    if pos >= len(line): break
    m, pos = dec.raw_decode(line, pos)
    if m["type"] == "token": n += len(m["tokens"])
    else: fin = m.get("type")
sys.exit(0 if (n, fin) == (40, "done") else "sampled with the draft: %d tokens, %s" % (n, fin))' || fail "cluster: a sampled request with the draft did not end with 40 tokens"
steps=$(metric "$topo" spec_verify_steps_total) drafts=$(metric "$topo" spec_draft_tokens_total)
echo "cluster: ${#prompts[@]} prompts equal; verify steps $steps, drafts $drafts, accepted $acc"
$py -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$acc" || fail "cluster: no draft accepted"
kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=

note "a draft with another vocabulary"
sed -i "s|^  draft: .*|  draft: $ROOT/tests/fixtures/models/llama-gqa-f32|" "$topo"
rc=0
TROUPE_SPECULATION=draft:4 timeout 60 "$BIN/troupe-supervisor" --topology "$topo" >"$WORK/bad.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { tail -20 "$WORK/bad.log"; fail "another vocabulary: supervisor exit $rc, expected 2 (configuration error)"; }
grep -q "llama-gqa-f32.*kjv-dense" "$WORK/bad.log" || { tail -20 "$WORK/bad.log"; fail "the error does not name both models"; }
echo PASS
