/* engine/model.h — the decoder-only transformer forward pass: Llama, Qwen3, Qwen3-MoE, Mixtral.
 *
 * A model is its weights on a backend plus activation buffers sized at load for the largest step
 * (opts): a forward never allocates. The KV cache is not the model's: each sequence of a batch
 * brings its kvseq (engine/kvcache.h), whose pool holds the layers' K and V.
 *
 * One forward runs a step over a batch of sequences. Sequence i contributes its last n_new tokens
 * (recorded by kvseq_append before the call) at positions len-n_new .. len-1: a prefill chunk is
 * many tokens, a decode step one. Their K and V are written into the sequence's blocks, attention
 * reads positions 0..p of the same sequence, and the logits of each sequence's LAST new token (or
 * of every new token, when asked) come back. Rows never interact except through their own
 * sequence's cache, and every op is batch-invariant (kernels/backend.h), so a sequence's logits do
 * not depend on what else is in the batch or on how its prompt was chunked.
 *
 * Weights are used in their stored dtype (f32, bf16, f16); activations are f32. Norm weights and
 * biases are converted to f32 once at load. Tensor names are Hugging Face's; MoE experts may be
 * stored per expert (hub checkpoints, and what transformers 5 save_pretrained writes) or fused
 * (transformers 5's in-memory layout: mlp.experts.gate_up_proj [E][2I][H], gate rows first, and
 * mlp.experts.down_proj [E][H][I]). The LM head is the embedding when tie_word_embeddings, else
 * lm_head.weight (required). The checkpoint must outlive the model (the CPU backend uses the
 * mapped file in place).
 */
#ifndef TROUPE_ENGINE_MODEL_H
#define TROUPE_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "kernels/backend.h"

typedef struct model model_t;

/* Limits that size the activation buffers (0 fields take the defaults). */
typedef struct model_opts {
    int max_tokens;               /* new tokens per forward, all sequences together (default 512) */
    int max_seqs;                 /* sequences per forward (default 64) */
    int max_logit_rows;           /* rows of logits per forward (default max_seqs; all_logits needs more) */
    int max_context;              /* longest sequence (default config max_position_embeddings) */
    int kv_block_size;            /* smallest KV block size to be used (default 16); sizes block tables */
    int fuse_weights;             /* q|k|v and gate|up as one matrix each (one matmul for a one-row
                                     step): 0 = the backend's choice (backend_ops_t.fuse_weights),
                                     1 = always, -1 = never */
    int plain_ops;                /* 1: never the backend's fused ops (rope_kv_store, gate_up_swiglu),
                                     which give the same bits: tests compare the two */
    int dummy_on_host;            /* 1: dummy weights made on the host and copied even when the backend
                                     can make them in place (fill_dummy); same bits, for tests */
    int no_graphs;                /* 1: decode steps never replayed from a backend graph (CUDA graphs);
                                     same bits, for tests and measurements */
    int quantize;                 /* online quantization of a plain checkpoint at load (model.quantization):
                                     0 none, else BK_Q_* (engine/quant.h: fp8 and int8 W8A8 per channel
                                     with dynamic per-token activations, int4 group 128, nvfp4) */
    /* Expert parallelism (engine/ep.h): when set, a routed expert of a per-expert checkpoint is
     * loaded only when expert_keep(expert_ctx, layer, expert) says 1 (the fused layout loads all). */
    int (*expert_keep)(void *ctx, int layer, int expert);
    void *expert_ctx;
    /* Dummy weights only: a bias on every MoE router so that routing follows a named load
     * distribution ("zipf:1.2", "table:FILE"; NULL or "uniform": none): engine/router_skew.h. */
    const char *router_skew;
} model_opts_t;

/* One sequence's part of a step. */
typedef struct model_seq {
    kvseq_t *kv;                  /* tokens and block table; every sequence of a batch shares one pool */
    int n_new;                    /* >= 1: the last n_new tokens of kv are computed now */
    int n_logits;                 /* 0: the batch's rule (all_logits); 1..n_new: the logits of the last
                                     n_logits new tokens (a verify step: the token and its drafts) */
} model_seq_t;

typedef struct model_batch {
    int n_seqs;
    const model_seq_t *seqs;      /* [n_seqs] */
    int all_logits;               /* 0: one row per sequence (its last new token); 1: every new token
                                     (a sequence's n_logits, when set, overrides either) */
    /* Optional, for decode steps: greedy sampling on the device. When argmax_out (host [rows]) is
     * set, each row's argmax (the lowest index on ties, NaN never chosen) is computed on the
     * backend and only those ids come back, not the rows x vocab logits; need_logits (host [rows],
     * may be NULL = none) marks the rows whose full logits are still wanted (a sampler with
     * temperature, penalties or log-probabilities): only those rows are copied into `logits`. */
    int32_t *argmax_out;
    const uint8_t *need_logits;
    /* Optional, with argmax_out: sampling on the device. sample (host [rows]) gives each row's
     * parameters and argmax_out gets the backend's `sample` op's ids instead (kernels/backend.h;
     * a row with temperature 0 gets the argmax id, bit for bit). The backend must have the op
     * (backend_ops_t.sample != NULL), else the forward fails. */
    const bk_sample_t *sample;
    /* Optional: host [T][hidden_size], T = the batch's new tokens: every new row's final hidden state
     * (the residual stream after the last layer, before the final norm), in batch order. DeepSeek-V3's
     * MTP layer drafts from it (engine/mtp.h). */
    float *hidden_out;
} model_batch_t;

/* Loads every weight the config implies from ck onto be (shapes checked, errors name the tensor
 * and the file). model_dir (may be NULL) only labels messages. */
model_t *model_load(const char *model_dir, const model_config_t *cfg, ckpt_t *ck, backend_t *be,
                    const model_opts_t *opts, char *err, size_t errlen);
void model_destroy(model_t **self_p);

/* One step. logits: host memory of [rows][vocab_size] floats, rows = the sum over the sequences of
 * their rows of logits (1 each, n_new with all_logits, or n_logits), in batch order; with
 * argmax_out, argmax_out, need_logits and sample are per row of logits too, and only the rows
 * marked in need_logits are written. Decode steps and verify steps (every sequence with the same
 * n_new, at most 16, and logits of every row or of the last) are replayed from backend graphs.
 * -1 with err on a bad batch (token id outside the vocabulary,
 * too many tokens, a pool of another shape, ...), nothing computed. */
int model_forward(model_t *m, const model_batch_t *batch, float *logits, char *err, size_t errlen);

/* Records the backend graphs of decode steps of 1..plain_rows sequences and of verify steps of
 * 1..verify_rows sequences x 2..max_n new rows (logits of every row) before serving, so that no
 * step of those shapes is run op by op and recorded in the middle of serving (each costs a few ms
 * there: a scheduled speculation worker meets new shapes all through a run, docs/speculation.md).
 * Each shape runs twice on fresh sequences of pool (token 0, a context of its own rows; their blocks
 * are given back), the largest first. *recorded: graphs recorded. 0 where the backend records
 * none (the CPU, opts.no_graphs, an expert-parallel group); -1 with err when a forward fails or the
 * pool has no room. */
int model_graph_warmup(model_t *m, kvpool_t *pool, int plain_rows, int verify_rows, int max_n, int *recorded,
                       char *err, size_t errlen);

/* A step queued on the device and left there: nothing comes to the host and nothing waits for the
 * backend, so a caller can queue several steps back to back (the draft model's chained drafts,
 * engine/spec_draft.c) and bring their results down with one download. The batch's seqs,
 * all_logits and n_logits are model_forward's; its argmax_out, need_logits, sample and hidden_out
 * are not read. dev_ids (device [T], may be NULL): the step's token ids, copied over the ids the
 * sequences recorded (placeholders, for tokens that a step queued before computed and the host has
 * not seen), so step j + 1 can read step j's draft without a round trip. dev_top, dev_prob (device
 * [R] each): every row of logits' argmax and its softmax probability, the backend's mtp_top op
 * (kernels/backend.h; the argmax op's id). Replayed from a graph as model_forward's steps are.
 * -1 with err on a bad batch or a backend without mtp_top. */
int model_forward_top(model_t *m, const model_batch_t *batch, const int32_t *dev_ids, int32_t *dev_top,
                      float *dev_prob, char *err, size_t errlen);

/* Per-op time profile (TROUPE_PROFILE=1 at model_load): every op is followed by a backend sync
 * and its wall time added to its category, so a profiled step is slower than a real one; it says
 * where a step's time goes, not how long a step takes. model_profile writes "name ms calls" lines
 * of the time since the last reset (and resets when reset != 0); 0 bytes when nothing was timed. */
size_t model_profile(model_t *m, char *buf, size_t len, int reset);
/* Turns the profile on or off at run time (a tool profiles a few chosen steps). */
void model_profile_enable(model_t *m, int on);

/* Per-expert load: adds the tokens routed to each (layer, expert) since the last call into
 * load [num_layers][num_experts] (dense layers stay 0) and restarts the count. Reads the device
 * counters back (a sync): call it once per stats window, never per step. 0, or -1 with err (a
 * dense model, a backend that does not count, a device error). */
int model_expert_load(model_t *m, uint64_t *load, char *err, size_t errlen);

/* The routing the MoE layers were loaded with: "uniform-random" (no router bias) or the router skew
 * spec (model_opts_t.router_skew); and the busiest/average expert load the bias aims at in a layer
 * (0: a dense layer or no skew). */
const char *model_router_skew(const model_t *m);
double model_router_skew_target(const model_t *m, int layer);
/* Refines a router skew's bias on the model itself (engine/router_skew.c says why): prefills of
 * random tokens in pool, counted by the MoE counters, which it leaves cleared. engine_load calls
 * it; model_load alone gives the load-time fit. 0 (also without a skew), or -1 with err. */
int model_router_skew_calibrate(model_t *m, kvpool_t *pool, char *err, size_t errlen);
/* Tokens that refinement prefilled (0: none). */
long model_router_skew_fit_tokens(const model_t *m);

/* Decode steps recorded as a backend graph, and steps replayed from one, since load. */
void model_graph_stats(const model_t *m, uint64_t *records, uint64_t *replays);
/* Of those records, the ones of a shape recorded before whose graph went stale (a backend scratch
 * buffer grew since, so every graph addressing it was recorded again): the rest are new shapes. */
uint64_t model_graph_rerecords(const model_t *m);

const model_config_t *model_config(const model_t *m);
backend_t *model_backend(const model_t *m);
/* Bytes of weights one decode step reads (every layer's weights at their stored dtype, plus the
 * LM head; for MoE, all experts): the numerator of the memory-bandwidth bound. */
size_t model_weight_bytes(const model_t *m);
/* Bytes of weights one token reads: as above, but only num_experts_per_tok experts per MoE layer. */
size_t model_active_weight_bytes(const model_t *m);

/* RoPE inverse frequencies [head_dim / 2] as transformers computes them in float32: default
 * 1 / theta^(2i/d); linear divides by factor; llama3 scales the low-frequency band by 1/factor and
 * interpolates the middle band (engine/rope.c). */
int rope_inv_freq(const model_config_t *cfg, float *inv_freq, char *err, size_t errlen);

#endif
