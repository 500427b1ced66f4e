#!/usr/bin/env bash
# Runs every test and ends with one summary line CI can read: "N passed, N failed".
#   unit:     build/tests/test_*        (cmocka; its own per-test counts are added up)
#   scenario: tests/scenario/*.sh       (real processes; one test each, pass = exit 0)
#   fuzz:     build/fuzz/fuzz_*         (`make fuzz`; a few seconds each; pass = no failing input)
# TESTS=pattern runs only the tests whose name matches. Logs go to build/test-logs/.
# B=DIR tests what `make B=DIR` built (its tests/ and, unless TROUPE_BIN says otherwise, bin/).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
[ "$B" = build ] || export TROUPE_BIN=${TROUPE_BIN:-$PWD/$B/bin}
logs=$B/test-logs
mkdir -p "$logs"
pattern=${TESTS:-.}
passed=0 failed=0 failures=()

for t in "$B"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  echo "$name" | grep -qE "$pattern" || continue
  start=$(date +%s.%N)
  timeout 600 "$t" >"$logs/$name.log" 2>&1
  rc=$?
  p=$(grep -oE '\[  PASSED  \] [0-9]+' "$logs/$name.log" | awk '{s+=$4} END {print s+0}')
  f=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$logs/$name.log" | awk '{s+=$4} END {print s+0}')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or timed out before its summary
  passed=$((passed + p)); failed=$((failed + f))
  printf "%-40s %3d passed %3d failed  %5.1fs\n" "$name" "$p" "$f" "$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{print e-s}')"
  if [ "$f" -ne 0 ]; then failures+=("$name"); grep -E 'FAILED|ERROR|error|Assert' "$logs/$name.log" | head -20 | sed 's/^/    /'; fi
done

for s in tests/scenario/*.sh; do
  [ -f "$s" ] || continue
  name=$(basename "$s" .sh)
  [ "$name" = lib ] && continue          # helpers for the scenarios, not a test
  echo "$name" | grep -qE "$pattern" || continue
  start=$(date +%s.%N)
  timeout 600 bash "$s" >"$logs/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); res=PASS; else failed=$((failed + 1)); res=FAIL; failures+=("$name"); fi
  printf '%-40s %s  %5.1fs\n' "scenario/$name" "$res" "$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{print e-s}')"
  [ "$res" = FAIL ] && tail -25 "$logs/$name.log" | sed 's/^/    /'
done

# fuzz: every tests/fuzz/fuzz_<x>.c for FUZZ_SECONDS (default 8) from its corpus, two at a time
# (tests/fuzz/run-target.sh: seeds read only, new inputs in a temporary folder, a crash input
# saved in $logs). Pass = no input failed; the corpus replay makes every kept crash a regression test.
fuzz_names=()
for src in tests/fuzz/fuzz_*.c; do
  [ -f "$src" ] || continue
  x=$(basename "$src" .c); x=${x#fuzz_}
  echo "fuzz_$x" | grep -qE "$pattern" && fuzz_names+=("$x")
done
fuzz_jobs=${FUZZ_JOBS:-2}
for ((i = 0; i < ${#fuzz_names[@]}; i += fuzz_jobs)); do
  batch=("${fuzz_names[@]:i:fuzz_jobs}")
  start=$(date +%s.%N)
  for x in "${batch[@]}"; do
    if [ -x "$B/fuzz/fuzz_$x" ]; then
      { tests/fuzz/run-target.sh "$x" "$B/fuzz/fuzz_$x" "$logs/fuzz_$x.log" -max_total_time="${FUZZ_SECONDS:-8}" \
          >"$logs/fuzz_$x.summary" 2>&1; echo $? >"$logs/fuzz_$x.rc"; } &
    fi
  done
  wait
  secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{print e-s}')
  for x in "${batch[@]}"; do
    if [ ! -x "$B/fuzz/fuzz_$x" ]; then
      printf '%-40s SKIP  (not built: make B=%s fuzz)\n' "fuzz/$x" "$B"
      continue
    fi
    if [ "$(cat "$logs/fuzz_$x.rc")" = 0 ]; then
      passed=$((passed + 1)); res=PASS
    else
      failed=$((failed + 1)); res=FAIL; failures+=("fuzz_$x")
    fi
    printf '%-40s %s  %5.1fs  %s\n' "fuzz/$x" "$res" "$secs" "$(cat "$logs/fuzz_$x.summary")"
    [ "$res" = FAIL ] && grep -E 'ERROR|SUMMARY|fuzz_[a-z_]+:|==[0-9]+==' "$logs/fuzz_$x.log" | head -15 | sed 's/^/    /'
  done
done

[ ${#failures[@]} -gt 0 ] && echo "failed: ${failures[*]} (logs in $logs/)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
