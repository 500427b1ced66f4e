#!/usr/bin/env python3
"""How far Troupe's KV cache dtypes move greedy decoding from Hugging Face transformers (GPU node).

    python3 tools/kv_accuracy.py [--out DIR] [--kv bf16,fp8] [--init 0.02,0.05,0.2] [--prompts 4]
                                 [--prompt-len 300] [--tokens 64] [--backend cuda]

Needs PyTorch, transformers 5 and safetensors (the GPU node has them) and a built tree
(build/bin/troupe-generate). No network: the model is made here.

  1. Builds a Llama-shaped model whose attention the CUDA fp8 kernels take (head_dim 128, 8 query
     heads over 2 kv heads, 4 layers, hidden 512, vocabulary 4,096) with random weights (each init
     range of --init, random RMSNorm weights, as tests/fixtures/make_model_fixtures.py does), saves
     it in bf16. The init range sets how sharp the model is: at 0.02 (trained models' init) scores
     and logits are O(1); at 0.2 attention scores reach tens and the model is chaotic (a last-bit
     change flips later tokens), so every dtype's agreement falls.
  2. For each prompt of random ids and each KV dtype: troupe-generate --kv-dtype KV greedy, with the
     log-probability of every chosen token.
  3. The reference: transformers (eager, float32 on the GPU) over the same saved bf16 weights,
     teacher-forced on each Troupe sequence: its log-probability of each token Troupe chose, and its
     own argmax there.
Reported per init range and KV dtype: the share of positions where transformers' argmax is
Troupe's token, the mean and largest |log p(troupe) - log p(transformers)| of the chosen tokens,
and the first position where the fp8 sequence leaves the bf16 one; and, for scale, the same
figures for transformers itself in bf16 (weights and activations, how models are usually run) on
Troupe's bf16-KV sequences. A random-weight model has no outlier channels: an fp8
cache with scale 1 clamps |K|, |V| > 448, which real checkpoints can reach; this measures rounding,
not clamping. Writes DIR/kv_accuracy.json and prints a table; exit 1 on any failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def die(msg):
    print(f"kv_accuracy: error: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
except ImportError as e:
    die(f"PyTorch and transformers are required ({e}): run this on the GPU node")

VOCAB = 4096
SEED = 7


def build(out_dir, init):
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_act="silu",
                      tie_word_embeddings=False, attention_bias=False, mlp_bias=False, initializer_range=init)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.4 * (torch.rand(p.shape, generator=g) - 0.5))
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False)
    model.save_pretrained(out_dir)


def troupe(model_dir, ids, kv, tokens, backend):
    cmd = ["build/bin/troupe-generate", model_dir, "--backend", backend, "--kv-dtype", kv, "--ids",
           ",".join(map(str, ids)), "--max-tokens", str(tokens), "--temperature", "0", "--ignore-eos", "--json",
           "--logprobs"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"{' '.join(cmd[:6])} ... exit {r.returncode}: {r.stderr.strip()[-400:]}")
    j = json.loads(r.stdout)
    lps = [x["logprob"] if isinstance(x, dict) else x for x in j["logprobs"]]
    return j["ids"], lps


def reference(model, prompt, out):
    """transformers' log p of each of Troupe's tokens, teacher-forced, and its argmax at each step."""
    seq = torch.tensor([prompt + out[:-1]], device=model.device)
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt) - 1:].float()
    if not torch.isfinite(logits).all():
        die("non-finite reference logits")
    lp = torch.log_softmax(logits, dim=-1)
    chosen = torch.tensor(out, device=lp.device)
    return lp.gather(1, chosen[:, None])[:, 0].tolist(), lp.argmax(dim=-1).tolist()


def measure(a, init, kvs):
    model_dir = os.path.join(a.out, f"model-{init}")
    os.makedirs(model_dir, exist_ok=True)
    build(model_dir, init)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    refs = {}
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        m = LlamaForCausalLM.from_pretrained(model_dir, dtype=dt).to(device).eval()
        if hasattr(m, "set_attn_implementation"):
            m.set_attn_implementation("eager")
        refs[name] = m
    g = torch.Generator().manual_seed(SEED + 2)
    prompts = [torch.randint(3, VOCAB, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]
    rows = {kv: {"agree": 0, "n": 0, "abs": [], "seqs": []} for kv in kvs + ["transformers-bf16"]}
    for p in prompts:
        for kv in kvs:
            out, lps = troupe(model_dir, p, kv, a.tokens, a.backend)
            if len(out) != a.tokens or len(lps) != a.tokens:
                die(f"troupe-generate --kv-dtype {kv}: {len(out)} tokens, {len(lps)} logprobs (want {a.tokens})")
            hf_lp, hf_arg = reference(refs["f32"], p, out)
            r = rows[kv]
            r["agree"] += sum(int(x == y) for x, y in zip(out, hf_arg))
            r["n"] += len(out)
            r["abs"] += [abs(x - y) for x, y in zip(lps, hf_lp)]
            r["seqs"].append(out)
            if kv == kvs[0]:                       # transformers in bf16 on the same sequence, for scale
                b_lp, b_arg = reference(refs["bf16"], p, out)
                r = rows["transformers-bf16"]
                r["agree"] += sum(int(x == y) for x, y in zip(b_arg, hf_arg))
                r["n"] += len(out)
                r["abs"] += [abs(x - y) for x, y in zip(b_lp, hf_lp)]
    shutil.rmtree(model_dir, ignore_errors=True)
    res = {}
    for kv, r in rows.items():
        res[kv] = {"argmax_agree": r["agree"] / r["n"], "mean_abs_dlogp": sum(r["abs"]) / len(r["abs"]),
                   "max_abs_dlogp": max(r["abs"])}
        print(f"{init:5.2f} {kv:18s} {100 * res[kv]['argmax_agree']:13.2f}% {res[kv]['mean_abs_dlogp']:13.2e} "
              f"{res[kv]['max_abs_dlogp']:12.2e}", flush=True)
    if "bf16" in rows and "fp8" in rows:
        firsts = [next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x))
                  for x, y in zip(rows["bf16"]["seqs"], rows["fp8"]["seqs"])]
        res["fp8_leaves_bf16_at"] = firsts
        print(f"{init:5.2f} fp8 sequence leaves the bf16 one at token {firsts} (of {a.tokens}; {a.tokens} = never)")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/kv-accuracy")
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument("--init", default="0.02,0.05,0.2")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--backend", default="cuda")
    a = ap.parse_args()
    kvs = a.kv.split(",")
    os.makedirs(a.out, exist_ok=True)
    summary = {"model": "Llama shape, head_dim 128, 8 q / 2 kv heads, 4 layers, hidden 512, vocab 4096, bf16 weights",
               "reference": "transformers eager float32 over the bf16 weights, teacher-forced on Troupe's tokens",
               "prompts": a.prompts, "prompt_len": a.prompt_len, "tokens": a.tokens, "backend": a.backend, "init": {}}
    print(f"{'init':5s} {'KV / engine':18s} {'argmax agrees':>14s} {'mean |dlogp|':>13s} {'max |dlogp|':>12s}")
    for init in a.init.split(","):
        summary["init"][init] = measure(a, float(init), kvs)
    with open(os.path.join(a.out, "kv_accuracy.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
