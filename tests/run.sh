#!/usr/bin/env bash
# Runs every test and ends with one summary line CI can read: "N passed, N failed".
#   unit:     build/tests/test_*        (cmocka; its own per-test counts are added up)
#   scenario: tests/scenario/*.sh       (real processes; one test each, pass = exit 0)
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

[ ${#failures[@]} -gt 0 ] && echo "failed: ${failures[*]} (logs in $logs/)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
