# tools/bench-spec.sh's repeated sweeps (REPEATS=N) and their summary (tools/bench/spec_repeats.py):
# the medians and the per-repeat ratios are computed from each repeat's own JSON (two made-up
# repeats, where each repeat's best fixed k differs, and k = 0 is never that best), an incomplete
# repeat is named and left out, and a REPEATS that is not a count is refused by name before anything starts. No cluster: the
# sweep itself needs the KJV models and minutes (docs/speculation.md).
. "$(dirname "$0")/lib.sh"
level() { printf '{"concurrency": %s, "output_tokens_per_s": %s}' "$1" "$2"; }
put() {   # put REPEAT ENTRY TPS_AT_1 TPS_AT_16
  mkdir -p "$WORK/s/$1"
  printf '{"levels": [%s, %s]}\n' "$(level 1 "$3")" "$(level 16 "$4")" >"$WORK/s/$1/$2.json"
}
put r1 0 100 1000; put r1 2 140 1200; put r1 4 150 1100; put r1 sched 160 1050
put r2 0 200 1000; put r2 2 190 1100; put r2 4 180 1300; put r2 sched 240 1200
put r3 0 100 1000; put r3 2 100 1000; put r3 4 100 1000   # no sched.json: incomplete
$PY "$ROOT/tools/bench/spec_repeats.py" "$WORK/s" 0 2 4 sched >"$WORK/sum.txt" 2>"$WORK/sum.err" || fail "spec_repeats failed: $(cat "$WORK/sum.err")"
cat "$WORK/sum.txt" "$WORK/sum.err"
grep -q "r3/sched.json" "$WORK/sum.err" || fail "the incomplete repeat r3 is not named"
grep -q "^2 repeats (r1, r2)" "$WORK/sum.txt" || fail "not the two complete repeats"
# The best fixed k is a verify length (k = 1..7), never k = 0: r2's k = 0 beats both lengths at
# concurrency 1 and is still not the best fixed k.
# concurrency 1: medians 150 / 165 / 165 / 200; sched/k0 1.6 and 1.2; sched/best 160/150 (k = 4)
# and 240/190 (k = 2).
grep -Eq "^ +1 +150\.0 +165\.0 +165\.0 +200\.0 +1\.200 / 1\.400 / 1\.600 +1\.067 / 1\.165 / 1\.263$" "$WORK/sum.txt" ||
  fail "concurrency 1's row is not the one computed by hand"
# concurrency 16: sched/best 1050/1200 (k = 2) and 1200/1300 (k = 4): each repeat's own best.
grep -Eq "^ +16 +1000\.0 +1150\.0 +1200\.0 +1125\.0 +1\.050 / 1\.125 / 1\.200 +0\.875 / 0\.899 / 0\.923$" "$WORK/sum.txt" ||
  fail "concurrency 16's row is not the one computed by hand"
grep -q "r1: 1:k=4 16:k=2; r2: 1:k=2 16:k=4" "$WORK/sum.txt" || fail "the best fixed k per repeat"
rc=0
REPEATS=two "$ROOT/tools/bench-spec.sh" "$WORK/b" >"$WORK/b.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "REPEATS=two was accepted"
grep -q "REPEATS must be a count of 1 or more, not 'two'" "$WORK/b.log" || fail "no error naming REPEATS: $(cat "$WORK/b.log")"
rm -rf "$WORK/s/r1" "$WORK/s/r2"
rc=0
$PY "$ROOT/tools/bench/spec_repeats.py" "$WORK/s" 0 4 sched >/dev/null 2>"$WORK/none.err" || rc=$?
[ "$rc" -eq 1 ] || fail "no complete repeat: exit $rc, expected 1"
grep -q "no complete repeat" "$WORK/none.err" || fail "no message for no complete repeat"
echo "PASS bench_spec_repeats"
