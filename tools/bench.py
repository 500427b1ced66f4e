#!/usr/bin/python3
"""troupe bench — a serving load generator in the style of `vllm bench serve`.

Random token-id prompts of a fixed input length, a fixed output length (EOS ignored), a warm-up,
then one run per concurrency level; for each it reports TTFT, ITL and end-to-end latency (p50 and
p99), output and total tokens/s, and output tokens/s per user. With --generate MODEL_DIR it first
times the one-process `troupe-generate` on the same lengths (the baseline without the cluster), and
prints the cluster/generate ratio at concurrency 1.

    python3 tools/bench.py --topology FILE --input-len 64 --output-len 64 --concurrency 1,8,32,64
    python3 tools/bench.py --endpoint tcp://127.0.0.1:5555 --json out.json ...

The cluster must be running (tools/bench-serving.sh starts one, runs this, stops it).
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from troupe_client import Client  # noqa: E402


def pct(xs, p):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]


def one_request(ep, prompt, out_len):
    """(ttft_s, [itl_s], e2e_s, n_out) of one streamed request."""
    t0 = time.perf_counter()
    first, last, itls, n = None, None, [], 0
    with Client(ep, timeout_s=600) as c:
        for m in c.generate(tokens=prompt, max_tokens=out_len, temperature=0, ignore_eos=True):
            now = time.perf_counter()
            if m["type"] == "token":
                n += len(m["tokens"])
                if first is None:
                    first = now
                else:
                    itls.append(now - last)
                last = now
            elif m["type"] == "error":
                raise RuntimeError(f"request failed: {m.get('code_name')}: {m.get('message')}")
    return first - t0, itls, time.perf_counter() - t0, n


def run_level(ep, vocab, in_len, out_len, concurrency, n_prompts, seed):
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, vocab) for _ in range(in_len)] for _ in range(n_prompts)]
    lock, results, errors = threading.Lock(), [], []
    it = iter(prompts)

    def worker():
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                return
            try:
                r = one_request(ep, p, out_len)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 — reported below
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [r[0] for r in results]
    itl = [x for r in results for x in r[1]]
    e2e = [r[2] for r in results]
    out_tokens = sum(r[3] for r in results)
    per_user = [(r[3] - 1) / (r[2] - r[0]) for r in results if r[3] > 1 and r[2] > r[0]]
    return {
        "concurrency": concurrency, "requests": len(results), "errors": len(errors), "wall_s": wall,
        "output_tokens_per_s": out_tokens / wall, "total_tokens_per_s": (out_tokens + in_len * len(results)) / wall,
        "tokens_per_s_per_user": statistics.mean(per_user) if per_user else 0.0,
        "ttft_ms_p50": 1e3 * pct(ttft, 0.5), "ttft_ms_p99": 1e3 * pct(ttft, 0.99),
        "itl_ms_p50": 1e3 * pct(itl, 0.5), "itl_ms_p99": 1e3 * pct(itl, 0.99),
        "e2e_ms_p50": 1e3 * pct(e2e, 0.5), "e2e_ms_p99": 1e3 * pct(e2e, 0.99),
        "first_errors": errors[:3],
    }


def run_generate(bin_dir, model_dir, extra, vocab, in_len, out_len, seed, repeats=3):
    """Decode tokens/s of the one-process engine on the same lengths (median of repeats)."""
    rng = random.Random(seed)
    rates = []
    for _ in range(repeats):
        ids = ",".join(str(rng.randrange(10, vocab)) for _ in range(in_len))
        out = subprocess.run([f"{bin_dir}/troupe-generate", model_dir, "--ids", ids, "--max-tokens", str(out_len),
                              "--temperature", "0", "--ignore-eos", "--json"] + extra,
                             check=True, capture_output=True, text=True).stdout
        t = json.loads(out)["timings"]
        rates.append(t["decode_tokens_per_s"])
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--endpoint")
    ap.add_argument("--topology", help="read the client endpoint from this topology")
    ap.add_argument("--bin-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin"))
    ap.add_argument("--vocab", type=int, default=500, help="prompt token ids are drawn below this")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--prompts-per-level", type=int, default=0, help="default: 4 x concurrency, at least 8")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--generate", metavar="MODEL_DIR", help="also time troupe-generate on this model")
    ap.add_argument("--generate-args", default="", help="extra troupe-generate options (e.g. '--load-format dummy --dtype bf16')")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    ep = a.endpoint
    if not ep:
        # The topology's client endpoint (the embedded default's when no file is named).
        m = re.search(r"^\s*client:\s*(\S+)", open(a.topology).read(), re.M) if a.topology else None
        ep = m.group(1) if m else "tcp://127.0.0.1:5555"
    report = {"input_len": a.input_len, "output_len": a.output_len, "endpoint": ep, "levels": []}
    if a.generate:
        report["generate_decode_tokens_per_s"] = run_generate(a.bin_dir, a.generate, a.generate_args.split(),
                                                              a.vocab, a.input_len, a.output_len, a.seed)
    for i in range(a.warmup):
        one_request(ep, [10 + i] * a.input_len, min(a.output_len, 8))
    for c in [int(x) for x in a.concurrency.split(",")]:
        n = a.prompts_per_level or max(8, 4 * c)
        lvl = run_level(ep, a.vocab, a.input_len, a.output_len, c, n, a.seed + c)
        report["levels"].append(lvl)
        print(f"  concurrency {c:3d}: {lvl['output_tokens_per_s']:8.1f} out tok/s, "
              f"{lvl['tokens_per_s_per_user']:7.1f} tok/s/user, TTFT p50 {lvl['ttft_ms_p50']:7.1f} ms, "
              f"ITL p50 {lvl['itl_ms_p50']:6.1f} ms, errors {lvl['errors']}", file=sys.stderr, flush=True)
    print(f"\ninput {a.input_len} / output {a.output_len} tokens, endpoint {ep}")
    print(f"{'conc':>5} {'reqs':>5} {'out tok/s':>10} {'total tok/s':>11} {'tok/s/user':>10} {'TTFT p50':>9} "
          f"{'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'E2E p50':>9} {'E2E p99':>9} {'err':>4}")
    for l in report["levels"]:
        print(f"{l['concurrency']:>5} {l['requests']:>5} {l['output_tokens_per_s']:>10.1f} {l['total_tokens_per_s']:>11.1f} "
              f"{l['tokens_per_s_per_user']:>10.1f} {l['ttft_ms_p50']:>9.1f} {l['ttft_ms_p99']:>9.1f} "
              f"{l['itl_ms_p50']:>8.2f} {l['itl_ms_p99']:>8.2f} {l['e2e_ms_p50']:>9.1f} {l['e2e_ms_p99']:>9.1f} {l['errors']:>4}")
    if a.generate:
        g = report["generate_decode_tokens_per_s"]
        c1 = next((l for l in report["levels"] if l["concurrency"] == 1), None)
        line = f"troupe-generate (one process): {g:.1f} decode tok/s"
        if c1:
            report["cluster_c1_over_generate"] = c1["tokens_per_s_per_user"] / g
            line += (f"; cluster at concurrency 1: {c1['tokens_per_s_per_user']:.1f} tok/s/user = "
                     f"{100 * report['cluster_c1_over_generate']:.1f}% of it")
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if any(l["errors"] for l in report["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
