#!/usr/bin/env bash
# Runs one libFuzzer target the way the tree lays targets out, and prints one summary line.
#
#   tests/fuzz/run-target.sh NAME BIN LOG [libFuzzer options...]
#
# NAME is x for tests/fuzz/fuzz_x.c; BIN its binary (make fuzz: build/fuzz/fuzz_x); LOG gets
# libFuzzer's whole output. Seeds come from tests/fuzz/corpus/x/ (read only: a target without
# that folder starts from nothing) and the dictionary from tests/fuzz/x.dict (or fuzz_x.dict) if any.
# Inputs the run finds go to a fresh temporary folder, deleted afterwards, so the tree is never
# written; with FUZZ_WORK=DIR they go to DIR instead and stay (a long campaign's growing corpus).
# A crashing input is saved beside LOG (LOG's name without .log, then "-crash-<sha1>") so it
# can be copied into the corpus as a regression case.
#
# Prints "N runs, S seeds, M new inputs[, crashed: FILE]"; the exit status is libFuzzer's
# (0 when no input failed). Run from anywhere: paths are taken from the repository root.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 NAME BIN LOG [libFuzzer options...]" >&2; exit 2; }
name=$1 bin=$2 log=$3
shift 3
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
case $log in /*) ;; *) log=$PWD/$log ;; esac
cd "$(dirname "$0")/../.."

[ -x "$bin" ] || { echo "$bin: not built (make fuzz)"; exit 2; }
mkdir -p "$(dirname "$log")"
prefix=${log%.log}-
rm -f "$prefix"crash-* "$prefix"leak-* "$prefix"timeout-* "$prefix"oom-*

if [ -n "${FUZZ_WORK:-}" ]; then
  work=$FUZZ_WORK
  mkdir -p "$work"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/troupe-fuzz-$name.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
before=$(find "$work" -type f | wc -l)

corpus=tests/fuzz/corpus/$name
seeds=()
nseeds=0
if [ -d "$corpus" ]; then
  seeds=("$corpus")
  nseeds=$(find "$corpus" -type f | wc -l)
fi
dict=()
for d in "tests/fuzz/$name.dict" "tests/fuzz/fuzz_$name.dict"; do
  [ -f "$d" ] && { dict=(-dict="$d"); break; }
done

# The sanitizers' settings are the fuzzer's own (test-asan's detect_leaks=0 must not leak in);
# one input running 60 s is a hang, not load.
env -u ASAN_OPTIONS -u UBSAN_OPTIONS "$bin" -artifact_prefix="$prefix" -print_final_stats=1 -timeout=60 \
    "${dict[@]}" "$@" "$work" "${seeds[@]}" >"$log" 2>&1
rc=$?

runs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | awk '{print $2}' | tail -1)
new=$(( $(find "$work" -type f | wc -l) - before ))
line="${runs:-?} runs, $nseeds seeds, $new new inputs"
[ -d "$corpus" ] || line="$line (no tests/fuzz/corpus/$name/)"
crash=$(ls "$prefix"crash-* "$prefix"leak-* "$prefix"timeout-* "$prefix"oom-* 2>/dev/null | head -1)
[ -n "$crash" ] && line="$line, crashed: $crash"
[ "$rc" -ne 0 ] && [ -z "$crash" ] && line="$line, exit status $rc"
echo "$line"
exit "$rc"
