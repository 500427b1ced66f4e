# The n-gram proposer's calibrated confidence (TROUPE_SPEC_NGRAM_CONFIDENCE=1) in a running
# cluster: with a policy pinned at 6 drafts and a minimum prefix confidence of 0.5
# (TROUPE_DRAFT_POLICY_FILE '1024:6:0.5'), each row keeps only the drafts whose estimated
# acceptance the proposer has learnt is high enough, so the workers' mean verify length comes out
# between 0 and 6 (not the 6 a point mass would keep), while greedy output stays equal to
# troupe-generate's without speculation, token for token, and verify steps accept drafts. A bad
# value of the knob stops the decode worker with a message naming it.
# The model is the repository's kjv-tiny (real weights): its greedy KJV text repeats itself.
. "$(dirname "$0")/lib.sh"
model=$ROOT/models/kjv-tiny
export TROUPE_SPECULATION=ngram:6 TROUPE_SPEC_NGRAM_CONFIDENCE=1
export TROUPE_DRAFT_POLICY_FILE=$WORK/policy
echo "1024:6:0.5" > "$TROUPE_DRAFT_POLICY_FILE"
MODEL_PATH=$model N_PREFILL=1 N_DECODE=1 make_topology "$WORK/t.yaml" "limits:" "  max_batch: 16" \
  "  max_model_len: 512"
prompts="And God said|In the beginning|And it came to pass|The LORD is my shepherd"
: > "$WORK/want"
IFS='|' read -r -a ps <<< "$prompts"
for p in "${ps[@]}"; do
  TROUPE_SPECULATION= "$BIN/troupe-generate" "$model" --backend cpu --prompt "$p" --max-tokens 64 --temperature 0 \
    --ignore-eos --json | /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))' \
    >> "$WORK/want"
done
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$WORK/want" "$prompts" <<'PY' || fail "calibrated n-gram confidence"
import sys, time
from troupe_client import Client
from servelib import top, metric
ep, bin_dir, topo, want_file, prompts = sys.argv[1:6]
want = [l.strip() for l in open(want_file)]
# Rounds of every prompt: the first teach the proposer what its drafts are worth, and the
# policy's confidence cut applies from the first step it is in force.
for rnd in range(4):
    for p, w in zip(prompts.split("|"), want):
        with Client(ep, timeout_s=120) as c:
            toks, last = [], None
            for m in c.generate(prompt=p, max_tokens=64, temperature=0, ignore_eos=True):
                if m["type"] == "token":
                    toks += m["tokens"]
                last = m
        got = ",".join(map(str, toks))
        # troupe-generate's ids are the prompt's and the output's; the cluster streams the output
        assert last["type"] == "done" and w.endswith(got) and len(toks) == 64, (rnd, p, got, w, last)
deadline = time.time() + 20
while True:
    d = [a for a in top(bin_dir, topo).values() if a["role"] == "decode"][0]
    steps, acc = metric(d, "spec_verify_steps_total") or 0, metric(d, "spec_accepted_tokens_total") or 0
    chosen, active = metric(d, "spec_chosen_verify_len"), metric(d, "spec_policy_active")
    if steps > 0 and active == 1 and chosen is not None or time.time() > deadline:
        break
    time.sleep(0.3)
print(f"16 greedy requests equal; verify steps {steps}, accepted {acc}, policy active {active}, "
      f"mean verify length {chosen}")
assert steps > 0 and acc > 0, "no drafts accepted"
assert active == 1, "the pinned policy is not in force"
assert 0 < chosen < 6, f"mean verify length {chosen}: the confidence cut did not apply (6: a point mass's)"
PY
kill -TERM "$SUP_PID"; wait "$SUP_PID" || fail "supervisor exit $?"; SUP_PID=
# A value the knob does not know: the decode worker refuses to start, naming it.
TROUPE_SPEC_NGRAM_CONFIDENCE=yes "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" --ready-file "$WORK/ready2" \
  > "$WORK/bad.log" 2>&1 &
bad_pid=$!
for _ in $(seq 100); do grep -q "TROUPE_SPEC_NGRAM_CONFIDENCE 'yes'" "$WORK/bad.log" && break; sleep 0.1; done
kill -TERM "$bad_pid" 2>/dev/null || true; wait "$bad_pid" 2>/dev/null || true
grep -q "TROUPE_SPEC_NGRAM_CONFIDENCE 'yes': expected 0 or 1" "$WORK/bad.log" \
  || { tail -20 "$WORK/bad.log"; fail "a bad TROUPE_SPEC_NGRAM_CONFIDENCE was not refused by name"; }
echo "PASS spec_ngram_confidence"
