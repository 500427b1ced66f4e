# Speculative decoding is lossless: with the n-gram proposer on in the decode workers
# (TROUPE_SPECULATION=ngram:4), greedy tokens through the whole cluster (supervisor, router,
# prefill, KV hand-off, decode) equal troupe-generate's without speculation, token for token, for
# every engine fixture and, when present, the KJV model; prompts with repeats make the proposer
# draft, and the decode workers' stats must show verify steps with drafts. One prompt stops on
# max_tokens inside an accepted run (max_tokens not a multiple of the step's tokens), one on a stop
# id (a token of its own output); sampled requests (temperature, top-k, a repetition penalty, a
# seed) must give the same tokens too: the acceptance keeps the tokens sampling without
# speculation draws (one at a low temperature, so that its drafts are accepted and later positions
# of a verify step are sampled at their own RNG step). Each row's run of accepted tokens in a
# verify step goes out as one token message (generation_tokens_total - accepted drafts =
# token_messages_total).
# FIXTURES=regex limits the fixtures.
. "$(dirname "$0")/lib.sh"
export TROUPE_SPECULATION=${SPEC:-ngram:4}   # SPEC=off: the same comparison without speculation
metric() {   # metric TOPOLOGY NAME...: each metric summed over the decode workers, from one troupe-top call
  local topo=$1; shift
  "$BIN/troupe-top" --topology "$topo" --json | /usr/bin/python3 -c 'import json, sys
actors = [a for a in json.load(sys.stdin)["actors"] if a.get("role") == "decode"]
print(" ".join(str(sum(m["value"] for a in actors for m in a["metrics"] if m["name"] == n)) for n in sys.argv[1:]))' "$@"
}
models=$(ls -d "$ROOT"/tests/fixtures/models/*/ | while read -r d; do [ -f "$d/expected.json" ] && echo "${d%/}"; done)
kjv="$ROOT/../shared/models/kjv-dense"
if [ -d "$kjv" ]; then models="$models $kjv"; else echo "SKIP (kjv part): $kjv absent"; fi
for dir in $models; do
  name=$(basename "$dir")
  echo "$name" | grep -qE "${FIXTURES:-.}" || continue
  note "$name"
  MODEL_PATH=$dir N_PREFILL=1 N_DECODE=1 make_topology "$WORK/$name.yaml" "limits:" "  prefill_chunk_tokens: 8"
  # prompt ids (below every fixture's vocabulary) and max_tokens: a repeating pattern, a phrase
  # that comes back, and a prompt from expected.json when there is one.
  {
    echo "5,6,7,8,5,6,7,8,5,6,7 --max-tokens 24"
    echo "11,12,13,40,41,11,12,13,40,41,11,12 --max-tokens 23"
    echo "3,9,3,9,3,9,3 --max-tokens 7"
    echo "5,6,7,8,5,6,7,8,5,6,7 --max-tokens 24 --temperature 0.8 --top-k 40 --seed 7"
    echo "11,12,13,40,41,11,12,13,40,41,11,12 --max-tokens 20 --temperature 0.7 --repetition-penalty 1.1 --seed 3"
    echo "5,6,7,8,5,6,7,8,5,6,7 --max-tokens 24 --temperature 0.6 --seed 11"   # sampled, drafts accepted
    echo "5,6,7,8,5,6,7,8,5,6,7 --max-tokens 24 --temperature 1.0 --seed 5"
    if [ -f "$dir/expected.json" ]; then
      /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompts"][0]["ids"])), "--max-tokens 32")' "$dir/expected.json"
    fi
  } > "$WORK/$name.prompts"
  gen() {   # gen IDS ARGS...: troupe-generate's ids, without speculation
    local ids=$1; shift
    TROUPE_SPECULATION= "$BIN/troupe-generate" "$dir" --backend cpu --ids "$ids" --chunk 8 --temperature 0 \
      --ignore-eos --json "$@" | /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))'
  }
  # A stop id from inside the first prompt's output: its 7th token.
  stop_id=$(gen 5,6,7,8,5,6,7,8,5,6,7 --max-tokens 24 | cut -d, -f7)
  echo "5,6,7,8,5,6,7,8,5,6,7 --max-tokens 24 --stop-id $stop_id" >> "$WORK/$name.prompts"
  : > "$WORK/$name.generate"
  while read -r ids args; do
    # shellcheck disable=SC2086
    gen "$ids" $args >> "$WORK/$name.generate"
  done < "$WORK/$name.prompts"
  # cluster SPEC OUT: every prompt through a cluster whose decode workers speculate as SPEC says.
  cluster() {
    TROUPE_SPECULATION=$1 start_cluster "$WORK/$name.yaml"
    : > "$2"
    while read -r ids args; do
      # shellcheck disable=SC2086
      timeout 120 "$BIN/troupe-client" --topology "$WORK/$name.yaml" --json submit --ids "$ids" --temperature 0 \
        --ignore-eos $args | stream_summary >> "$2" || fail "$name: troupe-client failed"
    done < "$WORK/$name.prompts"
  }
  cluster off "$WORK/$name.plain"
  kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=
  cluster "$TROUPE_SPECULATION" "$WORK/$name.cluster"
  # Sampled prompts (4 to 7): equal to the cluster without speculation (its seeded sampling is the
  # reference there); the others also equal troupe-generate's greedy.
  cmp -s "$WORK/$name.plain" "$WORK/$name.cluster" || { diff "$WORK/$name.plain" "$WORK/$name.cluster";
    fail "$name: output with speculation differs from output without"; }
  i=0
  while read -r want; do
    i=$((i + 1))
    got=$(sed -n "${i}p" "$WORK/$name.cluster")
    [ "$i" -ge 4 ] && [ "$i" -le 7 ] || [ "${got% *}" = "$want" ] || fail "$name prompt $i: with speculation '${got% *}', without '$want'"
    [ "${got##* }" = done ] || fail "$name prompt $i: ended with '${got##* }', not done"
  done < "$WORK/$name.generate"
  # The monitor's view trails the workers' stats by a report interval: wait for it.
  for _ in $(seq 100); do
    steps=$(metric "$WORK/$name.yaml" spec_verify_steps_total)
    /usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$steps" && break
    sleep 0.1
  done
  acc=$(metric "$WORK/$name.yaml" spec_accepted_tokens_total)
  drafts=$(metric "$WORK/$name.yaml" spec_draft_tokens_total)
  # one report's counters (each troupe-top call may see a newer report)
  read -r toks msgs acc_now < <(metric "$WORK/$name.yaml" generation_tokens_total token_messages_total \
    spec_accepted_tokens_total)
  echo "$name: $i prompts equal; verify steps $steps, drafts $drafts, accepted $acc; $toks tokens in $msgs messages"
  /usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$steps" \
    || fail "$name: no verify step with drafts"
  # A row's run of a verify step is one token message: every accepted draft saves one (one report:
  # the counters agree).
  /usr/bin/python3 -c 'import sys; t, m, a = map(float, sys.argv[1:]); sys.exit(0 if m == t - a else 1)' \
    "$toks" "$msgs" "$acc_now" || fail "$name: $toks tokens in $msgs token messages with $acc_now drafts accepted (want $toks - $acc_now)"
  kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=
  [ "$name" = kjv-dense ] || continue
  # Padded verify steps (TROUPE_SPEC_PAD_ROWS, the GPU's default for graph replays; the CPU's is
  # off): the greedy prompts all at once, 4 copies each, so rows with different draft counts share
  # verify steps and get filler positions; every one must still give its sequential tokens.
  TROUPE_SPEC_PAD_ROWS=16 start_cluster "$WORK/$name.yaml"
  ep=$(grep 'client:' "$WORK/$name.yaml" | awk '{print $2}')
  $PY - "$ep" "$WORK/$name.prompts" "$WORK/$name.plain" <<'PY' || fail "$name: padded verify steps"
import sys
from servelib import run_many
ep, prompts, plain = sys.argv[1:4]
jobs, want = [], {}
for i, (line, out) in enumerate(zip(open(prompts), open(plain))):
    ids, *args = line.split()
    if "--temperature" in args or "--stop-id" in args:
        continue   # greedy, max_tokens only (the Python client takes no stop ids)
    mt = int(args[args.index("--max-tokens") + 1])
    for c in range(4):
        jobs.append(((i, c), dict(ids=[int(x) for x in ids.split(",")], max_tokens=mt)))
    want[i] = out.split()[0]
res = run_many(ep, jobs, workers=len(jobs))
for (i, c), r in sorted(res.items()):
    assert not isinstance(r, Exception), ((i, c), r)
    toks, final, _ = r
    got = ",".join(map(str, toks))
    assert final["type"] == "done" and got == want[i], (i, c, got, want[i], final)
print(f"{len(jobs)} concurrent greedy requests with padded verify steps: sequential tokens")
PY
  for _ in $(seq 100); do
    padded=$(metric "$WORK/$name.yaml" spec_padded_steps_total)
    /usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$padded" && break
    sleep 0.1
  done
  echo "$name: padded verify steps $padded, filler positions $(metric "$WORK/$name.yaml" spec_pad_positions_total)"
  /usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$padded" || fail "$name: no padded step"
  kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=
done
echo PASS
