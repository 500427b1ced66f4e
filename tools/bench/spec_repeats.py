#!/usr/bin/env python3
"""tools/bench/spec_repeats.py — the summary of tools/bench-spec.sh's repeated sweeps (REPEATS=N):

    python3 tools/bench/spec_repeats.py OUT_DIR ENTRY...

OUT_DIR holds r1, r2, ... (one whole sweep each, its troupe-bench JSON per entry: r1/0.json,
r1/sched.json, ...). Per concurrency it prints the median output tokens/s of every entry over the
repeats, then the scheduled entry against k = 0 (no speculation) and against the best fixed verify
length (the best of the entries k = 1..7 given: k = 0 is the baseline, not a length), each ratio taken
inside one repeat (the entries of a repeat ran one after another on the same machine) and given as
min / median / max over the repeats. A repeat that lacks an entry's JSON is named and left out.
Exit 1 when no repeat is complete. Standard library only."""
import json
import os
import statistics
import sys


def load(out, entries):
    """{repeat name: {entry: {concurrency: output tokens/s}}} of the complete repeats."""
    reps = {}
    names = sorted((d for d in os.listdir(out) if d.startswith("r") and d[1:].isdigit()), key=lambda d: int(d[1:]))
    for r in names:
        got = {}
        for e in entries:
            path = os.path.join(out, r, f"{e}.json")
            try:
                with open(path) as f:
                    levels = json.load(f)["levels"]
                got[e] = {l["concurrency"]: l["output_tokens_per_s"] for l in levels}
            except (OSError, ValueError, KeyError, TypeError) as why:
                print(f"spec_repeats: {path}: {why}; repeat {r} left out", file=sys.stderr)
                got = None
                break
        if got:
            reps[r] = got
    return reps


def spread(xs):
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, entries = argv[1], argv[2:]
    reps = load(out, entries)
    if not reps:
        print(f"spec_repeats: no complete repeat in {out}", file=sys.stderr)
        return 1
    first = next(iter(reps.values()))
    conc = sorted(first[entries[0]])
    fixed = [e for e in entries if e not in ("sched", "0")]   # verify lengths; k = 0 is no speculation
    print(f"{len(reps)} repeats ({', '.join(reps)}); median output tokens/s of the cluster, and the ratios of each "
          "repeat as min / median / max")
    head = "conc " + "".join(f"{('k=' + e) if e != 'sched' else 'sched':>10}" for e in entries)
    if "sched" in entries:
        head += "  " + (f"{'sched/k0':>23}" if "0" in entries else "") + (f"  {'sched/best':>23}" if fixed else "")
    print(head)
    for c in conc:
        row = f"{c:4d} " + "".join(f"{statistics.median(r[e][c] for r in reps.values()):10.1f}" for e in entries)
        if "sched" in entries:
            if "0" in entries:
                row += "  " + f"{spread([r['sched'][c] / r['0'][c] for r in reps.values()]):>23}"
            if fixed:
                row += "  " + f"{spread([r['sched'][c] / max(r[e][c] for e in fixed) for r in reps.values()]):>23}"
        print(row)
    if fixed:
        print("best fixed k per repeat: " + "; ".join(
            f"{name}: " + " ".join(f"{c}:k={max(fixed, key=lambda e: r[e][c])}" for c in conc) for name, r in reps.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
