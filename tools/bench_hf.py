#!/usr/bin/env python3
"""The Hugging Face transformers baseline for troupe-bench: the same model shape (random bf16
weights from config.json alone), eager attention, on the same GPU, the same input / output lengths
(EOS ignored: min_new_tokens = max_new_tokens), batch = each concurrency level of the sweep.

    python3 tools/bench_hf.py --model tests/fixtures/models/llama-3.1-8b-shape \
        --input-len 1000 --output-len 128 --batch 1,16,64 --json hf.json

Prints one line per batch size: output tokens/s, TTFT (the prefill of the batch) and per-user
tokens/s. Runs where transformers and a CUDA GPU exist (the GPU node); no network.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as e:
    sys.exit(f"bench_hf: needs torch and transformers ({e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="directory with config.json")
    ap.add_argument("--input-len", type=int, default=1000)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_hf: no CUDA device")
    cfg = AutoConfig.from_pretrained(a.model)
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="eager")
    model.eval()
    print(f"hf model: {cfg.architectures[0]}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params, "
          f"built in {time.time() - t0:.1f} s, transformers {__import__('transformers').__version__}", flush=True)
    out = {"model": a.model, "input_len": a.input_len, "output_len": a.output_len, "attn": "eager", "levels": []}
    g = torch.Generator(device="cuda").manual_seed(1)
    for b in [int(x) for x in a.batch.split(",")]:
        ids = torch.randint(10, cfg.vocab_size, (b, a.input_len), device="cuda", generator=g)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            model.generate(ids[:, :16], attention_mask=mask[:, :16], max_new_tokens=2, min_new_tokens=2,
                           do_sample=False, pad_token_id=0)          # warm-up
            torch.cuda.synchronize()
            t0 = time.time()
            model(ids, attention_mask=mask)                         # the prefill alone: TTFT
            torch.cuda.synchronize()
            ttft = time.time() - t0
            t0 = time.time()
            model.generate(ids, attention_mask=mask, max_new_tokens=a.output_len, min_new_tokens=a.output_len,
                           do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            wall = time.time() - t0
        lvl = {"batch": b, "wall_s": wall, "output_tokens_per_s": b * a.output_len / wall,
               "ttft_ms": 1e3 * ttft, "tokens_per_s_per_user": (a.output_len - 1) / max(wall - ttft, 1e-9)}
        out["levels"].append(lvl)
        print(f"batch {b:4d}: {lvl['output_tokens_per_s']:9.1f} out tok/s, TTFT {lvl['ttft_ms']:8.1f} ms, "
              f"{lvl['tokens_per_s_per_user']:7.1f} tok/s/user, {wall:.1f} s", flush=True)
        del ids, mask
        torch.cuda.empty_cache()
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
