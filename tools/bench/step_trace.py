#!/usr/bin/env python3
"""tools/bench/step_trace.py — summarises a decode worker's step trace (TROUPE_STEP_TRACE=FILE,
actors/worker/step_trace.h), or two side by side (a baseline's and this tree's):

    python3 tools/bench/step_trace.py TRACE [TRACE2] [--check]

Per trace: steps (all, decode-only, with prompt chunks), decode rows per step, forward us (mean,
p50, p99; of mixed and decode-only steps apart), the gap between steps, a histogram of prompt
tokens per step, how many steps each new prompt's chunks were spread over, the wait from a
request's arrival to its first chunk (and to its last: its time to first token inside the
worker), arrivals per idle-to-step window (prompts that came together), and loop passes held for
a router's outbox. --check only validates the lines (exit 1 on the first malformed one, naming
it): what tests use. Standard library only."""
import re
import sys

STEP_KEYS = ("t", "gap", "sched", "fwd", "post", "dec", "prm", "ptok", "rtok", "wait", "prompting", "pre", "holds")
# v2 adds pos= (the forward's positions) and graph= (r recorded, p replayed, e launched op by op)
STEP_RE = re.compile(r"^step " + " ".join(k + r"=(-?\d+)" for k in STEP_KEYS) +
                     r"(?: pos=(\d+) graph=([rpe]))? chunks=(-|\d+:\d+(?:,\d+:\d+)*)$")
ARRIVE_RE = re.compile(r"^arrive t=(\d+) id=(\d+) ntok=(\d+) src=([ph])$")
END_RE = re.compile(r"^end t=(\d+) id=(\d+)$")
HEAD_RE = re.compile(r"^# troupe step trace v[12] pid=(\d+)$")


class Trace:
    def __init__(self, path):
        self.path = path
        self.steps = []      # dicts of STEP_KEYS plus "chunks": [(id, n)]
        self.arrive = {}     # id -> (t, ntok, src)
        self.end = {}        # id -> t
        with open(path) as f:
            for no, line in enumerate(f, 1):
                line = line.rstrip("\n")
                m = STEP_RE.match(line)
                if m:
                    s = {k: int(v) for k, v in zip(STEP_KEYS, m.groups())}
                    n = len(STEP_KEYS)
                    s["pos"] = int(m.group(n + 1)) if m.group(n + 1) is not None else None
                    s["graph"] = m.group(n + 2)
                    c = m.group(n + 3)
                    s["chunks"] = [] if c == "-" else [tuple(int(x) for x in p.split(":")) for p in c.split(",")]
                    if len(s["chunks"]) != s["prm"] or sum(n for _, n in s["chunks"]) != s["ptok"] + s["rtok"]:
                        raise ValueError("%s:%d: chunks disagree with prm / ptok + rtok: %s" % (path, no, line))
                    self.steps.append(s)
                    continue
                m = ARRIVE_RE.match(line)
                if m:
                    self.arrive[int(m.group(2))] = (int(m.group(1)), int(m.group(3)), m.group(4))
                    continue
                m = END_RE.match(line)
                if m:
                    self.end[int(m.group(2))] = int(m.group(1))
                    continue
                if no == 1 and HEAD_RE.match(line):
                    continue
                raise ValueError("%s:%d: not a step trace line: %r" % (path, no, line))


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def hist(xs, edges):
    """Counts of xs per bucket [edges[i], edges[i+1]) (the last bucket open)."""
    out = [0] * len(edges)
    for x in xs:
        i = len(edges) - 1
        while i > 0 and x < edges[i]:
            i -= 1
        out[i] += 1
    return out


def summary(tr):
    """Rows of (label, value string) for one trace."""
    st = tr.steps
    rows = []
    mixed = [s for s in st if s["prm"]]
    plain = [s for s in st if not s["prm"]]
    rows.append(("steps (mixed / decode-only)", "%d (%d / %d)" % (len(st), len(mixed), len(plain))))
    rows.append(("decode rows per step, mean", "%.2f" % mean([s["dec"] for s in st])))
    rows.append(("decode tokens (rows summed)", "%d" % sum(s["dec"] for s in st)))
    rows.append(("prompt / recompute tokens", "%d / %d" % (sum(s["ptok"] for s in st), sum(s["rtok"] for s in st))))
    for name, ss in (("all", st), ("mixed", mixed), ("decode-only", plain)):
        f = [s["fwd"] for s in ss]
        rows.append(("fwd us %s: mean / p50 / p99" % name, "%.0f / %s / %s" % (mean(f), pct(f, 50), pct(f, 99))))
    rows.append(("forward seconds (sum)", "%.3f" % (sum(s["fwd"] for s in st) / 1e6)))
    # Like for like: decode-only forwards by their rows (a slower kernel shows here whatever the
    # arrivals), and mixed ones by their prompt tokens.
    by = {}
    for s in plain:
        by.setdefault(s["dec"], []).append(s["fwd"])
    common = sorted((k for k in by if len(by[k]) >= 20), reverse=True)[:6]
    rows.append(("decode-only fwd us by rows (n >= 20)", "  ".join(
        "%d:%.0f(%d)" % (k, mean(by[k]), len(by[k])) for k in common) or "-"))
    # v2: how each decode-only forward ran (graph recorded / replayed / op by op), plain (one position
    # a row) apart from verify steps (drafts), and plain replays by rows: what a graph churn costs.
    if any(x["graph"] for x in plain):
        for name, ss in (("plain", [x for x in plain if x["pos"] == x["dec"]]),
                         ("verify", [x for x in plain if x["pos"] > x["dec"]])):
            rows.append(("decode-only %s steps by graph r / p / e: n (fwd us mean)" % name, "  ".join(
                "%s:%d(%.0f)" % (g, len(gs), mean([x["fwd"] for x in gs]))
                for g, gs in ((g, [x for x in ss if x["graph"] == g]) for g in "rpe")) or "-"))
        rep = {}
        for x in plain:
            if x["pos"] == x["dec"] and x["graph"] == "p":
                rep.setdefault(x["dec"], []).append(x["fwd"])
        rows.append(("plain replays fwd us by rows (n >= 20)", "  ".join(
            "%d:%.0f(%d)" % (k, mean(rep[k]), len(rep[k])) for k in common if k in rep and len(rep[k]) >= 20) or "-"))
    # The whole cycle (this step's start to the next one's, host time included): what a client's
    # inter-token time is made of. Not counted across an idle gap (> 1 s).
    cyc = {}
    for s0, s1 in zip(st, st[1:]):
        if not s0["prm"] and s1["t"] - s0["t"] < 1000000:
            cyc.setdefault(s0["dec"], []).append(s1["t"] - s0["t"])
    rows.append(("decode-only cycle us by rows (to the next start)", "  ".join(
        "%d:%.0f(%d)" % (k, mean(cyc[k]), len(cyc[k])) for k in common if k in cyc) or "-"))
    edges = [1, 512, 1024, 1536, 2048]
    byp = {}
    for s in mixed:
        e = max(x for x in edges if s["ptok"] + s["rtok"] >= x)
        byp.setdefault(e, []).append(s["fwd"])
    rows.append(("mixed fwd us by prompt tokens from", "  ".join(
        "%d:%.0f(%d)" % (k, mean(byp[k]), len(byp[k])) for k in sorted(byp)) or "-"))
    # Decode-only forwards while a finished request's write-back copy may be running (the 50 ms
    # after an end) against the others: the copier reads the pool beside the steps.
    ends = sorted(tr.end.values())
    near, far = [], []
    k = 0
    for s in plain:
        while k < len(ends) and ends[k] <= s["t"] - 50000:
            k += 1
        (near if k < len(ends) and ends[k] <= s["t"] else far).append(s["fwd"])
    rows.append(("decode-only fwd us <= 50 ms after an end / other", "%.0f (%d) / %.0f (%d)" % (
        mean(near), len(near), mean(far), len(far))))
    if st:
        span = (st[-1]["t"] + st[-1]["sched"] + st[-1]["fwd"] + st[-1]["post"] - st[0]["t"]) / 1e6
        rows.append(("first step to last step's end, s", "%.3f" % span))
    g = [s["gap"] for s in st if s["gap"] >= 0]
    rows.append(("gap us: mean / p50 / p99 / max", "%.0f / %s / %s / %s" % (mean(g), pct(g, 50), pct(g, 99),
                                                                          max(g) if g else "-")))
    rows.append(("post us (sample+emit): mean / p99", "%.0f / %s" % (mean([s["post"] for s in st]),
                                                                     pct([s["post"] for s in st], 99))))
    rows.append(("steps after a gap > 1 ms", "%d" % sum(1 for x in g if x > 1000)))
    rows.append(("holds (loop passes held for a router)", "%d" % sum(s["holds"] for s in st)))
    edges = [0, 1, 256, 512, 1024, 1536, 2048]
    h = hist([s["ptok"] + s["rtok"] for s in st], edges)
    rows.append(("prompt tokens per step: histogram", "  ".join(
        "%s:%d" % ("0" if e == 0 else "%d-%s" % (e, edges[i + 1] - 1 if i + 1 < len(edges) else "+"), c)
        for i, (e, c) in enumerate(zip(edges, h)))))
    rows.append(("prompt rows per mixed step: histogram", "  ".join(
        "%d:%d" % (k, sum(1 for s in mixed if s["prm"] == k)) for k in sorted({s["prm"] for s in mixed}))))
    # Each new prompt: the steps its chunks fell in, the wait from arrival to its first chunk's step
    # and to the end of its last chunk's step (its first token).
    chunk_steps, first_t, last_end = {}, {}, {}
    for s in st:
        end = s["t"] + s["sched"] + s["fwd"] + s["post"]
        for rid, _ in s["chunks"]:
            chunk_steps[rid] = chunk_steps.get(rid, 0) + 1
            first_t.setdefault(rid, s["t"])
            last_end[rid] = end
    prompts = [rid for rid, a in tr.arrive.items() if a[2] == "p"]
    spread = [chunk_steps.get(rid, 0) for rid in prompts if rid in chunk_steps]
    rows.append(("new prompts (arrived / chunked)", "%d / %d" % (len(prompts), len(spread))))
    rows.append(("steps a prompt's chunks spread over", "  ".join(
        "%d:%d" % (k, spread.count(k)) for k in sorted(set(spread))) or "-"))
    w = [first_t[rid] - tr.arrive[rid][0] for rid in prompts if rid in first_t]
    rows.append(("arrival -> first chunk us: mean / p50 / p99", "%.0f / %s / %s" % (mean(w), pct(w, 50), pct(w, 99))))
    w = [last_end[rid] - tr.arrive[rid][0] for rid in prompts if rid in last_end]
    rows.append(("arrival -> prompt's last chunk done us: mean / p50 / p99", "%.0f / %s / %s" % (mean(w), pct(w, 50),
                                                                                            pct(w, 99))))
    # Arrivals between two consecutive step starts: prompts that could have shared a step.
    starts = [s["t"] for s in st]
    per = {}
    j = 0
    for t in sorted(a[0] for a in tr.arrive.values() if a[2] == "p"):
        while j < len(starts) and starts[j] <= t:
            j += 1
        per[j] = per.get(j, 0) + 1
    rows.append(("prompts arriving in one inter-step window", "  ".join(
        "%d:%d" % (k, sum(1 for v in per.values() if v == k)) for k in sorted(set(per.values()))) or "-"))
    # From a request's end to the next arrival: the router and client's turn-around (one-request
    # clients send the next prompt when the last one is done).
    ends = sorted(tr.end.values())
    arr = sorted(a[0] for a in tr.arrive.values())
    ta = []
    k = 0
    for t in arr:
        while k < len(ends) and ends[k] <= t:
            k += 1
        if k:
            ta.append(t - ends[k - 1])
    rows.append(("arrival after the latest end us: p50 / p99", "%s / %s" % (pct(ta, 50), pct(ta, 99))))
    return rows


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    if not args or len(args) > 2 or any(a not in ("--check",) for a in argv[1:] if a.startswith("--")):
        sys.stderr.write(__doc__)
        return 2
    try:
        traces = [Trace(p) for p in args]
    except (OSError, ValueError) as e:
        print("step_trace: %s" % e, file=sys.stderr)
        return 1
    if "--check" in argv:
        for t in traces:
            print("%s: %d steps, %d arrivals, %d ends: well formed" % (t.path, len(t.steps), len(t.arrive), len(t.end)))
        return 0
    cols = [summary(t) for t in traces]
    width = max(len(label) for label, _ in cols[0])
    print("%-*s  %s" % (width, "", "    ".join(t.path for t in traces)))
    for i, (label, v) in enumerate(cols[0]):
        print("%-*s  %s" % (width, label, "    |    ".join([v] + [c[i][1] for c in cols[1:]])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
