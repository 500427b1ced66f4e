# The decode worker's step trace (TROUPE_STEP_TRACE, actors/worker/step_trace.h) end to end: a
# colocated cluster (prefill_chunk_tokens 8) with the trace on, 6 requests of 20-token prompts and
# 5 tokens each at once, then a clean stop. One trace file (its "%p" made the pid); every line well
# formed (tools/bench/step_trace.py --check); every request arrives once as a prompt and ends once;
# each prompt's chunks add up to its 20 tokens over at least 3 steps (8 tokens a step, all prompts
# together); the decode rows add up to the 6 x 4 tokens after the first; the chunks of a step are
# listed in it and no step has more prompt tokens than the budget; the summary runs.
. "$(dirname "$0")/lib.sh"
N_PREFILL=0 make_topology "$WORK/t.yaml" "limits:" "  prefill_chunk_tokens: 8" "  max_batch: 16"
export TROUPE_STEP_TRACE="$WORK/trace-%p.txt"
start_cluster "$WORK/t.yaml"
unset TROUPE_STEP_TRACE
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" <<'PY'
import sys
from servelib import run_many
ep = sys.argv[1]
res = run_many(ep, [(i, dict(ids=[(i * 29 + j * 7) % 500 + 1 for j in range(20)], max_tokens=5)) for i in range(6)],
               workers=6)
assert all(not isinstance(r, Exception) and r[1]["type"] == "done" and len(r[0]) == 5 for r in res.values()), res
print("6 requests done, 5 tokens each")
PY
# A clean stop: the worker drains and closes the trace (what is buffered reaches the file).
kill -TERM "$SUP_PID"
for _ in $(seq 200); do kill -0 "$SUP_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$SUP_PID" 2>/dev/null && fail "the supervisor did not stop"
SUP_PID=
traces=("$WORK"/trace-*.txt)
[ "${#traces[@]}" = 1 ] && [ -s "${traces[0]}" ] || fail "expected one trace file, got: ${traces[*]}"
[[ "${traces[0]}" =~ trace-[0-9]+\.txt$ ]] || fail "%p not replaced: ${traces[0]}"
$PY "$ROOT/tools/bench/step_trace.py" --check "${traces[0]}" || fail "malformed trace lines"
$PY - "${traces[0]}" "$ROOT/tools/bench" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from step_trace import Trace, summary
t = Trace(sys.argv[1])
prompts = {i: a for i, a in t.arrive.items() if a[2] == "p"}
assert len(prompts) == 6 and len(t.arrive) == 6, t.arrive
assert set(t.end) == set(prompts), (t.end, prompts)
assert all(a[1] == 20 for a in prompts.values()), prompts
got, steps_of = {}, {}
for s in t.steps:
    assert s["ptok"] + s["rtok"] <= 8, s
    for rid, n in s["chunks"]:
        got[rid] = got.get(rid, 0) + n
        steps_of[rid] = steps_of.get(rid, 0) + 1
assert got == {i: 20 for i in prompts}, got
assert all(n >= 3 for n in steps_of.values()), steps_of
assert sum(s["dec"] for s in t.steps) == 6 * 4, sum(s["dec"] for s in t.steps)
for i, s in enumerate(t.steps[1:]):
    assert s["gap"] >= 0 and s["t"] >= t.steps[i]["t"], (t.steps[i], s)
rows = dict(summary(t))
print("trace: %d steps, %s; chunks spread %s" % (len(t.steps), rows["steps (mixed / decode-only)"],
                                                 rows["steps a prompt's chunks spread over"]))
PY
echo PASS
