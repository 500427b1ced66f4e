"""Helpers for the disk-tier scenarios (tests/scenario/disk_*.sh): multi-turn conversations, the
cache-manager's metrics."""
import random

from servelib import metric, run_one, top


def conversations(ep, n_conv, turns, sys_len, turn_len, out_len, seed, key=None, retention=None):
    """Runs n_conv conversations round-robin (turn 1 of each, then turn 2 of each, ...): between two
    turns of one conversation every other one runs a turn, so the working set is all of them.
    Returns one dict per request: conv, turn, prompt, cached, ttft_ms, tokens (the answer)."""
    rng = random.Random(seed)
    hist = [[rng.randrange(3, 500) for _ in range(sys_len)] for _ in range(n_conv)]
    out = []
    for t in range(turns):
        for c in range(n_conv):
            hist[c] += [rng.randrange(3, 500) for _ in range(turn_len)]
            kw = {}
            if key:
                kw = dict(prompt_cache_key=f"{key}-{c}", cache_retention=retention)
            toks, d, _ = run_one(ep, hist[c], max_tokens=out_len, **kw)
            assert d["type"] == "done", d
            device, host, disk = cached_split(d["usage"])
            out.append(dict(conv=c, turn=t, prompt=d["usage"]["prompt_tokens"], cached=d["usage"]["cached_tokens"],
                            device=device, host=host, disk=disk, ttft_ms=d["timings"]["ttft_ms"], tokens=toks))
            hist[c] += toks
    return out


def cached_split(usage):
    """(device, host, disk): where a done message's cached prompt tokens came from. The three must
    add up to cached_tokens (the cluster always splits it)."""
    split = tuple(usage.get(f"cached_{k}_tokens", 0) for k in ("device", "host", "disk"))
    assert sum(split) == usage["cached_tokens"], f"cached tokens by source {split} do not add up to {usage}"
    return split


def summary(reqs, first_turn=1):
    """Hit rate (cached / prompt tokens) and mean TTFT of the turns from first_turn on."""
    rs = [r for r in reqs if r["turn"] >= first_turn]
    cached, prompt = sum(r["cached"] for r in rs), sum(r["prompt"] for r in rs)
    ttft = sorted(r["ttft_ms"] for r in rs)
    return dict(hit_rate=cached / prompt, cached=cached, prompt=prompt, ttft_mean_ms=sum(ttft) / len(ttft),
                ttft_p50_ms=ttft[len(ttft) // 2], requests=len(rs),
                **{k: sum(r[k] for r in rs) for k in ("device", "host", "disk")})


def cache_manager(bin_dir, topo):
    return next(a for a in top(bin_dir, topo).values() if a["role"] == "cache_manager")


def cm_metrics(bin_dir, topo, names):
    cm = cache_manager(bin_dir, topo)
    return {n: metric(cm, n) for n in names}


def disk_records(path):
    """The disk tier's file (actors/cache/disk_format.h): slot bytes and the offsets of the slots
    that hold a record (magic "TKVB")."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"TRKVDSK1", "not a disk-tier file"
    slot_bytes = int.from_bytes(data[48:56], "little")
    n_slots = int.from_bytes(data[56:64], "little")
    offs = [4096 + i * slot_bytes for i in range(n_slots)]
    return slot_bytes, [o for o in offs if data[o:o + 4] == b"TKVB"]


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x20]))
