# MTP speculation in the decode workers is lossless, greedy, on kjv-deepseek (a DeepSeek-V3
# checkpoint of the shared KJV models with one MTP layer):
#   - the whole cluster with TROUPE_SPECULATION=mtp:3, disaggregated (prefill, KV hand-off,
#     decode: the decode worker never sees the prompt's hidden states, so its MTP sequences begin
#     at the first generated position) and colocated (the decode worker computes the prompts in
#     steps with prompt chunks, which give no hidden states either): the same tokens as the
#     cluster without speculation and as troupe-generate, and the decode worker's stats show
#     verify steps with accepted drafts (so the test fails if MTP never proposes);
#   - a sampled request ends with all its tokens;
#   - TROUPE_SPECULATION=mtp on a model without an MTP layer (kjv-dense) stops the decode worker
#     with a configuration error naming the variable.
# Skips when the shared models folder (TROUPE_MODELS, default ../shared/models) is absent.
. "$(dirname "$0")/lib.sh"
MODELS=${TROUPE_MODELS:-$ROOT/../shared/models}
model=$MODELS/kjv-deepseek
if [ ! -d "$model" ]; then echo "SKIP: $model absent (set TROUPE_MODELS to the shared models folder)"; exit 0; fi
py=/usr/bin/python3
prompts=("And God said unto Moses" "In the beginning" "The LORD is my shepherd; I shall not want.")
maxes=(40 33 29)
gen() {   # gen PROMPT MAX: troupe-generate's greedy ids, no speculation, on the cluster's backend
  TROUPE_SPECULATION= "$BIN/troupe-generate" "$model" --backend "${BACKEND:-cpu}" --threads 1 --prompt "$1" --temperature 0 \
    --ignore-eos --max-tokens "$2" --json | $py -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))'
}
metric() {   # metric TOPOLOGY NAME: the sum over the decode workers
  "$BIN/troupe-top" --topology "$1" --json | $py -c 'import json, sys
print(sum(m["value"] for a in json.load(sys.stdin)["actors"] if a.get("role") == "decode"
          for m in a["metrics"] if m["name"] == sys.argv[1]))' "$2"
}
submit() {   # submit TOPOLOGY MAX PROMPT [client args]: "ids final-type"
  local topo=$1 max=$2 p=$3; shift 3
  timeout 120 "$BIN/troupe-client" --topology "$topo" --json submit --ignore-eos --max-tokens "$max" "$@" "$p" \
    | stream_summary
}
stop_cluster() { kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=; }

want=$WORK/want
: > "$want"
for i in "${!prompts[@]}"; do echo "$(gen "${prompts[$i]}" "${maxes[$i]}") done" >> "$want"; done

for layout in disaggregated colocated; do
  note "$layout"
  topo=$WORK/$layout.yaml
  n_prefill=1; [ "$layout" = colocated ] && n_prefill=0
  HEARTBEAT_MS=500 MODEL_PATH=$model N_PREFILL=$n_prefill N_DECODE=1 make_topology "$topo" "limits:" "  prefill_chunk_tokens: 8"
  for spec in off mtp:3; do
    # fixed: the draft-scheduler's policy would turn speculation off on this CPU (it does not pay
    # here) and leave the comparison with few drafts (SPEC_POLICY=scheduled runs it with the policy)
    TROUPE_SPECULATION=$spec TROUPE_SPEC_POLICY=${SPEC_POLICY:-fixed} start_cluster "$topo"
    out=$WORK/$layout-$spec
    : > "$out"
    for i in "${!prompts[@]}"; do
      submit "$topo" "${maxes[$i]}" "${prompts[$i]}" --temperature 0 >> "$out" || fail "troupe-client failed"
    done
    cmp -s "$want" "$out" || { diff "$want" "$out"; fail "$layout, speculation $spec: not troupe-generate's tokens"; }
    if [ "$spec" != off ]; then
      # the stats reach the monitor within a heartbeat or two: read until two reads agree
      acc=0 last=
      for _ in $(seq 30); do
        now="$(metric "$topo" spec_verify_steps_total) $(metric "$topo" spec_draft_tokens_total) $(metric "$topo" spec_accepted_tokens_total)"
        [ "$now" = "$last" ] && break
        last=$now
        sleep 1.2
      done
      read -r steps drafts acc <<< "$now"
      begun=$(metric "$topo" spec_mtp_sequences_begun_total) late=$(metric "$topo" spec_mtp_begun_late_total)
      echo "$layout mtp:3: MTP sequences begun $begun, of them past position 0: $late"
      echo "$layout mtp:3: ${#prompts[@]} prompts equal to troupe-generate; verify steps $steps, drafts $drafts," \
        "accepted $acc ($($py -c 'import sys; d=float(sys.argv[2]); print("%.1f%%" % (100 * float(sys.argv[1]) / d if d else 0))' "$acc" "$drafts"))"
      $py -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$acc" || fail "$layout: no MTP draft accepted"
      # concurrent: the rows of a step propose together (one MTP forward per draft position) and
      # feed together (colocated: the prompt chunks of one request interrupt the others' MTP
      # sequences, which begin again); each request still gets its own greedy tokens
      pids=()
      for i in "${!prompts[@]}"; do
        submit "$topo" "${maxes[$i]}" "${prompts[$i]}" --temperature 0 > "$WORK/conc$i" &
        pids+=($!)
      done
      wait "${pids[@]}" || fail "a concurrent troupe-client failed"
      for i in "${!prompts[@]}"; do
        [ "$(cat "$WORK/conc$i")" = "$(sed -n "$((i + 1))p" "$want")" ] || fail "$layout, concurrent prompt $i: '$(cat "$WORK/conc$i")'"
      done
      echo "$layout mtp:3: ${#prompts[@]} concurrent requests equal too"
      if [ "$layout" = disaggregated ]; then
        # sampled: drafts drawn from the MTP distribution, verified by rejection sampling (spec_dist);
        # it must end done with all its tokens
        got=$(submit "$topo" 30 "${prompts[1]}" --temperature 0.8 --top-k 40 --seed 5)
        [ "$(echo "${got% *}" | tr , '\n' | wc -l) ${got##* }" = "30 done" ] || fail "sampled with MTP: '$got'"
      fi
    fi
    stop_cluster
  done
done

note "a model without an MTP layer"
if [ -d "$MODELS/kjv-dense" ]; then
  topo=$WORK/dense.yaml
  MODEL_PATH=$MODELS/kjv-dense N_PREFILL=1 N_DECODE=1 make_topology "$topo"
  rc=0
  TROUPE_SPECULATION=mtp timeout 60 "$BIN/troupe-supervisor" --topology "$topo" >"$WORK/bad.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { tail -20 "$WORK/bad.log"; fail "mtp without an MTP layer: supervisor exit $rc, expected 2 (configuration error)"; }
  grep -q "TROUPE_SPECULATION=mtp.*no MTP layer" "$WORK/bad.log" || { tail -20 "$WORK/bad.log"; fail "the error does not name the knob"; }
else
  echo "skipped: $MODELS/kjv-dense absent"
fi
echo PASS
