/* kernels/backend.h — the one interface between the model code and the hardware.
 *
 * A backend owns device memory and runs ops on it. The engine sees device memory only as opaque
 * pointers (`float *` typed for documentation, never dereferenced outside a backend): it allocates,
 * uploads, downloads and calls ops, so engine/forward.c reads like the model and a CUDA backend
 * can implement the same table. Pointer arithmetic on device pointers (a row offset, an expert's
 * slice of a fused tensor) is allowed; reading through them is not.
 *
 * Every op is asynchronous with respect to the host on a device backend (it is queued on the
 * backend's stream); `download` and `sync` wait. The CPU backend runs each op to completion, in
 * parallel over its OpenMP threads.
 *
 * Semantics that a second implementation must copy are written next to each op: accumulation
 * type, where eps goes, tie-breaking. Activations are f32 everywhere; weights stay in their stored
 * dtype (f32, bf16, f16) and are converted on the fly inside the op (bf16 -> f32 is exact).
 *
 * Known limits: RoPE rotates the whole head (partial_rotary_factor 1); head_dim <= BK_MAX_HEAD_DIM,
 * query heads per kv head <= BK_MAX_GQA_GROUP, KV block_size <= BK_MAX_BLOCK_SIZE (the CPU
 * attention keeps its state on the stack).
 */
#ifndef TROUPE_KERNELS_BACKEND_H
#define TROUPE_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

#define BK_MAX_HEAD_DIM 512
#define BK_MAX_GQA_GROUP 16
#define BK_MAX_BLOCK_SIZE 256
#define BK_IPC_HANDLE_BYTES 64       /* cudaIpcMemHandle_t */
#define BK_NCCL_ID_BYTES 128         /* ncclUniqueId */
#define BK_NCCL_GROUP_SPANS 512      /* spans per direction in one ncclGroupStart/End (<= 1024 ops) */

typedef struct backend backend_t;

/* A weight matrix resident on the backend, as nn.Linear stores it: row-major [rows][cols] in
 * dtype; a matmul computes y = x W^T, so rows = output features (N), cols = input features (K). */
typedef struct bk_mat {
    const void *data;             /* device pointer, [rows][cols] dtype (a quantized weight: its codes) */
    dtype_t dtype;
    int64_t rows, cols;
    /* Quantized weights (engine/quant.h), all 0 for a plain one. qfmt BK_Q_*: data holds codes,
     * [rows][cols] bytes (fp8 e4m3, int8) or [rows][cols/2] bytes of 4-bit codes (int4, fp4 e2m1;
     * element 2j in the low nibble of byte j, 2j+1 in the high one; int4 stored as value + 8), and
     * dtype is the byte type (DT_F8E4M3, DT_I8, DT_U8). Element (r, c) is, in f32,
     * decode(code) * qscale[(r / qgr) * ceil(cols / qgc) + c / qgc]: one f32 scale per block of
     * qgr rows x qgc columns (per tensor: rows x cols; per channel: 1 x cols; groups: 1 x 128 or
     * 1 x 16; DeepSeek's blocks: 128 x 128). qgc is a multiple of 16 or >= cols.
     * qact: how the op treats the activations (BK_QA_*): weight-only (f32 x), or x quantized per
     * row (token) to fp8 / int8 with a dynamic scale amax / 448 or amax / 127 and used as
     * dequantized f32 values (what a W8A8 kernel's integer or fp8 products give, up to rounding). */
    int8_t qfmt, qact;
    int32_t qgr, qgc;
    const float *qscale;          /* device [ceil(rows/qgr)][ceil(cols/qgc)] f32 */
} bk_mat_t;

/* Weight formats of bk_mat_t.qfmt, and the bit of each in backend_ops_t.quant_formats. */
enum { BK_Q_NONE = 0, BK_Q_FP8, BK_Q_I8, BK_Q_I4, BK_Q_FP4, BK_Q_COUNT };
enum { BK_QA_NONE = 0, BK_QA_FP8_TOKEN, BK_QA_I8_TOKEN, BK_QA_COUNT };

/* Bytes a weight occupies on the backend: codes plus scales for a quantized one. */
static inline size_t bk_mat_bytes(const bk_mat_t *w)
{
    size_t n = (size_t)w->rows * (size_t)w->cols;
    if (!w->qfmt)
        return n * dtype_size(w->dtype);
    size_t codes = w->qfmt == BK_Q_I4 || w->qfmt == BK_Q_FP4 ? n / 2 : n;
    size_t gr = (size_t)(w->rows + w->qgr - 1) / (size_t)w->qgr, gc = (size_t)(w->cols + w->qgc - 1) / (size_t)w->qgc;
    return codes + gr * gc * sizeof(float);
}

/* One expert's SwiGLU FFN: down(silu(gate(x)) * up(x)). */
typedef struct bk_expert {
    bk_mat_t gate;                /* [I][H] */
    bk_mat_t up;                  /* [I][H] */
    bk_mat_t down;                /* [H][I] */
} bk_expert_t;

/* The paged KV cache as the ops address it. Block b, layer l, slot j (token j of the block),
 * kv head h: K at base + b*block_bytes + (((l*2 + 0)*block_size + j)*n_kv_heads + h)*head_dim
 * elements, V the same with 1 for 0. One block is one contiguous chunk of block_bytes. */
typedef struct bk_kv {
    void *base;                   /* device: [n_blocks][n_layers][2][block_size][n_kv_heads][head_dim] dtype */
    dtype_t dtype;                /* f32, bf16, f16 or fp8 (e4m3, scaled: `scale`); converted to/from f32 on store/load */
    int n_blocks, block_size, n_layers, n_kv_heads, head_dim;
    size_t block_bytes;           /* n_layers*2*block_size*n_kv_heads*head_dim*dtype_size */
    /* fp8 only (NULL: every scale 1; other dtypes ignore it): device [n_layers][2][n_kv_heads] f32,
     * the dequantization scale s of layer l's K (0) or V (1) of kv head h (engine/kvscale.h). An
     * element x is stored as the e4m3 code of f32(x / s) (IEEE division, nearest even, saturated to
     * +-448) and read as code * s; a backend may fold s into the scores (K: scale * s) and the output
     * (V: out * s), which equals reading code * s up to rounding. Fixed for the pool's life (graphs
     * record the pointer). */
    const float *scale;
} bk_kv_t;

/* Where each row of a step's activations lives in the paged cache. Row t belongs to sequence
 * tok_seq[t] at absolute position tok_pos[t]; that sequence's block table is
 * block_table[seq_bt_start[s] ...], one pool block id per block_size positions. The rows of one
 * sequence need not be contiguous or sorted, but every position a row attends to (0..tok_pos[t])
 * must be covered by its block table and already stored (earlier steps or this step's kv_store). */
typedef struct bk_attn_meta {
    int n_tokens;                 /* rows */
    int n_seqs;
    const int32_t *tok_seq;       /* device [n_tokens] */
    const int32_t *tok_pos;       /* device [n_tokens] */
    const int32_t *seq_bt_start;  /* device [n_seqs] */
    const int32_t *block_table;   /* device [sum over seqs of their block counts] */
    /* Host-side hint, 0 when unknown: rows 0..n_single-1 are each the only new row of its sequence
     * (decode rows put first in a step that also holds prompt chunks). A backend may run those rows
     * and the rest as two attention calls: a decode kernel suits the first, a prefill kernel the
     * others; the results are what one call over all rows gives. */
    int n_single;
    /* Optional (NULL / 0 when unknown): the rows of sequence s are rows seq_row0[s] ..
     * seq_row0[s + 1] - 1 (device [n_seqs + 1]), and no sequence has more than max_rows (host). A
     * backend may then take a sequence's rows together, reading its keys once for all of them (a
     * speculative verify step: each sequence's last token and its drafts, k + 1 rows). */
    const int32_t *seq_row0;
    int max_rows;
} bk_attn_meta_t;

/* NCCL point-to-point between processes on different GPUs (KV hand-off from a prefill to a decode
 * process): a communicator of this backend's device, and transfers of device memory through it.
 * Nothing here blocks: init, transfers and their completion are polled, so a peer that never
 * comes (or dies mid-transfer) costs the caller a deadline, never a hang.
 *
 * Ordering: a transfer runs on the communicator's own stream, after everything queued on the
 * backend's stream before the call (so a send reads the finished KV and a receive never overwrites
 * a block an earlier op still reads); the backend's stream never waits for a transfer (a send the
 * peer never matches must not wedge the model's ops or a download). Received bytes may be used by
 * the backend's ops once xfer_poll has said 1. Sends and receives are matched in posting order per
 * peer; the spans of a transfer go in groups of at most BK_NCCL_GROUP_SPANS per direction, so two
 * sides that post the same number of spans group them alike (NCCL requires it). */
typedef struct bk_comm bk_comm_t;

typedef struct bk_span {
    void *dev;                    /* device memory of this backend */
    size_t bytes;
} bk_span_t;

typedef struct bk_nccl_ops {
    /* A new ncclUniqueId (the bootstrap's root lives in this process). */
    int (*unique_id)(uint8_t id[BK_NCCL_ID_BYTES], char *err, size_t errlen);
    /* Starts rank `rank` of `n_ranks` with ncclCommInitRankConfig (config.blocking = 0) on the
     * backend's device and returns at once; NULL with why when NCCL refused at once. */
    bk_comm_t *(*comm_init)(backend_t *be, const uint8_t id[BK_NCCL_ID_BYTES], int n_ranks, int rank, char *err,
                            size_t errlen);
    /* ncclCommGetAsyncError: 1 ready and idle, 0 still working (initialising, enqueueing a
     * transfer), -1 failed (why): only comm_abort is left then. */
    int (*comm_poll)(bk_comm_t *c, char *err, size_t errlen);
    /* Posts one transfer with `peer`: a send of every sends[i], a receive into every recvs[i]
     * (either list may be empty; both, with peer = own rank, on a one-rank communicator). Returns
     * its ticket (>= 0), or -1 with why: then either nothing was posted and comm_poll still says
     * >= 0 (an earlier transfer is still being enqueued, too many in flight), or it failed. */
    int64_t (*xfer)(bk_comm_t *c, int peer, const bk_span_t *sends, int n_sends, const bk_span_t *recvs, int n_recvs,
                    char *err, size_t errlen);
    /* 1 when transfer `ticket` (and every one before it) completed, 0 while in flight, -1 when the
     * communicator failed (why: NCCL's asynchronous error). */
    int (*xfer_poll)(bk_comm_t *c, int64_t ticket, char *err, size_t errlen);
    /* ncclCommAbort: ends whatever is in flight, frees everything, nulls *c. The only way a
     * communicator goes (ncclCommFinalize would wait for a peer that may be gone). */
    void (*comm_abort)(bk_comm_t **c);
} bk_nccl_ops_t;

/* One row's sampling parameters for the `sample` op: engine/sampler.h's steps 3-7, with the
 * sampler's own types (so a row's parameters reach a device unrounded). */
typedef struct bk_sample {
    double temperature;           /* 0 = greedy (argmax); else > 0 */
    int top_k;                    /* <= 0 or >= N = off */
    double top_p;                 /* (0, 1]; 1 = off */
    double min_p;                 /* [0, 1]; 0 = off */
    uint64_t seed;
    uint64_t step;                /* the request's RNG counter: tokens generated so far */
} bk_sample_t;

typedef struct backend_ops {
    const char *name;             /* "cpu", "cuda" */
    /* 1: a matmul launch costs enough that the model places q|k|v and gate|up as one matrix each
     * (one launch for a one-row step; a GPU). 0: the weights stay as stored (the CPU backend uses
     * the checkpoint's mapped file in place: a fused copy would cost memory and load time for
     * nothing). engine/model.h: model_opts_t.fuse_weights overrides it. */
    int fuse_weights;
    /* 1: weight_put and upload copy the bytes into device memory (the model lets the checkpoint
     * drop each tensor's host data once placed: ckpt_drop); 0: weights may be used in place. */
    int weights_copied;
    /* Bit (1 << BK_Q_x) set for each quantized weight format whose weights every op that takes a
     * weight (matmul, matmul_n, the fusions, moe_ffn's experts) accepts; the model refuses the
     * others at load. 0: plain weights only. */
    unsigned quant_formats;
    /* Bit (1 << BK_Q_x) set for each quantized format moe_ffn takes its experts in (the model refuses
     * quantized MoE experts of the others at load, naming the format). 0: plain experts only. */
    unsigned quant_moe_formats;
    void (*destroy)(backend_t *be);

    /* Memory. alloc returns 64-byte aligned device memory or NULL; upload/download copy n bytes
     * (download waits for queued ops first). */
    void *(*alloc)(backend_t *be, size_t bytes);
    void (*free)(backend_t *be, void *p);
    int (*upload)(backend_t *be, void *dst, const void *host_src, size_t n);
    int (*download)(backend_t *be, void *host_dst, const void *src, size_t n);
    int (*sync)(backend_t *be);   /* waits for every queued op; -1 on a device error */
    /* download on a second queue that neither waits for nor holds up the model's ops, and waits
     * for that copy only: a finished sequence's KV written back while the next step runs. The
     * caller guarantees src is final (no queued op writes it). Callable from another thread than
     * the one running the model (each call is independent). NULL: callers use download. */
    int (*download_side)(backend_t *be, void *host_dst, const void *src, size_t n);
    /* Makes checkpoint bytes (host memory, any alignment, kept alive by the caller while the
     * weight is in use) resident and returns the device pointer; the CPU backend uses them in
     * place when naturally aligned for elem_size and copies them otherwise. host NULL: only the
     * allocation, its bytes undefined (for fill_dummy). */
    const void *(*weight_put)(backend_t *be, const void *host, size_t bytes, size_t elem_size);
    void (*weight_release)(backend_t *be, const void *dev);
    /* Optional (NULL: not offered; weight_put with host NULL then only allocates): fills n elements
     * of dt at dev with the 'dummy' load format's values (kernels/dummy_fill.h), bit for bit what the
     * checkpoint would make on the host, without the host memory or the copy. Queued. */
    void (*fill_dummy)(backend_t *be, void *dev, dtype_t dt, size_t n, uint64_t key, float center, float scale);

    /* out[t][:] = f32(table[ids[t]][:]); ids must be in [0, table.rows) (the engine checks). */
    void (*embed)(backend_t *be, const bk_mat_t *table, const int32_t *ids, int n, float *out);

    /* y[M][N] = x[M][K] W^T (+ bias[N]). Each y element is an f32 dot product whose summation
     * order depends only on K (16 interleaved partial sums over k mod 16, then a fixed tree), so a
     * row's result is bit-identical whatever M is and whichever other rows are in the batch. The
     * bias is added after the dot product. x and y must not overlap. */
    void (*matmul)(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y);

    /* n matmuls over one x: y[i] = x W[i]^T (+ bias[i], bias itself may be NULL), results equal to
     * n matmul calls, with what they share done once (CUDA: x's conversion to 16 bits). NULL in a
     * backend that gains nothing: the engine then calls matmul n times. */
    void (*matmul_n)(backend_t *be, const float *x, int M, int n, const bk_mat_t *const w[], const float *const bias[],
                     float *const y[]);

    /* The pre-norm residual step: if x != NULL, res += x (f32); then
     * out = w * (res * 1/sqrt(mean(res^2) + eps)) per row of H. The mean of squares is summed in
     * double, the scale and products in f32 (HF: x.float() * rsqrt(var + eps), then weight *). */
    void (*add_rmsnorm)(backend_t *be, float *res, const float *x, const float *w, int M, int H, float eps, float *out);

    /* Per-head RMSNorm in place (Qwen3 q_norm / k_norm): x [M][n_heads][head_dim], w [head_dim];
     * same arithmetic as add_rmsnorm over each head_dim vector. */
    void (*head_rmsnorm)(backend_t *be, float *x, const float *w, int M, int n_heads, int head_dim, float eps);

    /* RoPE in place, HF's rotate_half layout: for head vector x, i < d/2, with
     * a = f32(f32(pos[t]) * inv_freq[i]):  x[i] = x[i] cos a - x[i+d/2] sin a,
     * x[i+d/2] = x[i+d/2] cos a + x[i] sin a.  inv_freq [head_dim/2] f32 carries any scaling
     * (llama3, linear) so the op is the same for every rope kind. x [M][n_heads][head_dim]. */
    void (*rope)(backend_t *be, float *x, const int32_t *pos, const float *inv_freq, int M, int n_heads, int head_dim);

    /* out = silu(gate) * up elementwise, silu(g) = g / (1 + exp(-g)) in f32. [n] each. */
    void (*swiglu)(backend_t *be, const float *gate, const float *up, int n, float *out);

    /* Fusions where a launch costs (a GPU's one-row decode step); NULL: the caller runs the plain
     * ops. Each gives the bits of the ops it replaces.
     * gate_up_swiglu: out[M][I] = silu(x Wg^T) * (x Wu^T) for w = gate and up stacked ([2I][K],
     * gate rows first): matmul then swiglu; returns 0, or 1 when it cannot for this shape or M
     * (nothing queued: the caller runs the plain ops).
     * rope_kv_store: rope of q [T][n_heads][D] and k [T][n_kv][D] in place (pos = meta->tok_pos),
     * then kv_store of the rotated k and v. */
    int (*gate_up_swiglu)(backend_t *be, const float *x, int M, const bk_mat_t *w, float *out);
    /* The whole dense SwiGLU MLP: out[M][H] = (silu(x Wg^T) * (x Wu^T)) Wd^T, with g and u ([M][I]
     * each) as scratch; the result equals matmul_n(gate, up), swiglu and matmul(down) bit for bit
     * (CUDA: the SwiGLU product goes straight to down's 16-bit input, never stored in f32). Returns
     * 0, or 1 when it cannot for this shape or M (nothing queued: the caller runs the plain ops).
     * NULL in a backend that gains nothing. */
    int (*mlp_swiglu)(backend_t *be, const float *x, int M, const bk_mat_t *gate, const bk_mat_t *up,
                      const bk_mat_t *down, float *g, float *u, float *out);
    void (*rope_kv_store)(backend_t *be, const bk_kv_t *kv, int layer, float *q, float *k, const float *v, int n_heads,
                          const float *inv_freq, const bk_attn_meta_t *meta);

    /* Stores this step's K and V rows into the paged cache of `layer`, converted to kv->dtype
     * (round to nearest even; fp8: x / kv->scale, bk_kv_t). k, v [M][n_kv_heads][head_dim] with M = meta->n_tokens. */
    void (*kv_store)(backend_t *be, const bk_kv_t *kv, int layer, const float *k, const float *v, const bk_attn_meta_t *meta);

    /* Causal GQA attention over the paged cache: row t, head h (kv head h / (n_heads/n_kv_heads))
     * attends to positions 0..tok_pos[t] of its sequence. Scores q.k * scale in f32; softmax in f32
     * with max subtraction, computed online block by block (equal to the two-pass softmax up to
     * rounding); out = sum p v / sum p. q [M][n_heads][head_dim], out the same shape. */
    void (*attention)(backend_t *be, const bk_kv_t *kv, int layer, const float *q, int n_heads, float scale,
                      const bk_attn_meta_t *meta, float *out);
    /* Whether attention runs over a cache of `dtype` with these heads: 0, or -1 with why (e.g. the
     * CUDA backend takes an fp8 cache only where its tensor-core kernels do: head_dim 64 or 128, at
     * most 16 query heads per kv head). NULL: every dtype kvpool_new takes. Checked once, before
     * the pool is made (engine/kvcache.h, kvpool_check). */
    int (*kv_supported)(backend_t *be, dtype_t dtype, int head_dim, int n_heads, int n_kv_heads, char *err,
                        size_t errlen);

    /* MoE routing (HF Qwen3-MoE and Mixtral): p = softmax(logits[t]) over E in f32 (max
     * subtracted); the k largest p, ties to the lower expert index, in descending order; if
     * renorm, each divided by their sum (Mixtral always; Qwen3-MoE when norm_topk_prob).
     * logits [M][E] -> ids [M][k], weights [M][k]. */
    void (*moe_route)(backend_t *be, const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights);

    /* out[t] = sum over the k experts e of token t, in ascending expert order, of
     * weights[t][j] * down_e(silu(gate_e(x[t])) * up_e(x[t])) — HF's order of index_add_. The
     * CPU runs every expert's matmuls as the `matmul` op, so a token's result does not depend on
     * the batch (CUDA: kernels/cuda/cuda_moe.cu says where its paths differ).
     * experts is a HOST array [n_experts] of descriptors of device weights (fixed after load, so a
     * device backend may cache its own copy keyed by the pointer); ids and weights are device.
     * scratch: device memory of moe_scratch_bytes(M, k, H, I, n_experts) bytes. x, out [M][H]. */
    void (*moe_ffn)(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                    const bk_expert_t *experts, int n_experts, void *scratch, float *out);

    /* moe_ffn rounded as a call of as_m tokens would be. A backend whose moe_ffn picks its
     * arithmetic by M (CUDA: bf16/f16 experts run the FMA device path, f32 activations, below
     * TROUPE_CUDA_MOE_GROUPED_MIN_M tokens and the grouped path, activations rounded to 16 bits,
     * from there; kernels/cuda/cuda_moe.cu) picks it by as_m here and runs it over the M entries.
     * For an expert-parallel rank computing a peer's entries (k = 1, M of them from the peer's
     * as_m rows of top-k; engine/ep.c): each result is then the one the peer's own moe_ffn over
     * its as_m rows gives, where plain moe_ffn would pick by the entries received from every
     * rank. NULL: moe_ffn's result for a token does not depend on M (the CPU). Same scratch as
     * moe_ffn for M and k. */
    void (*moe_ffn_as)(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                       const bk_expert_t *experts, int n_experts, void *scratch, float *out, int as_m);

    /* counts[ids[i]] += 1 for i < n (ids device [n], each in 0..E-1; counts device uint32 [E]): the
     * per-expert token counts the expert-balancer reads (engine/model.h, model_expert_load). Device
     * work only (CUDA: one atomic add per id), so it may sit in a captured graph; the caller reads
     * the counts back once per window, never per step. NULL: the backend does not count. */
    void (*moe_count)(backend_t *be, const int32_t *ids, int n, uint32_t *counts);

    /* dst[i][:] = src[rows[i]][:], cols floats per row. */
    void (*gather_rows)(backend_t *be, const float *src, const int32_t *rows, int n, int cols, float *dst);

    /* out[m] = the index of the largest x[m][:], the lowest index on ties; NaN is never the
     * largest (an all-NaN row gives 0). */
    void (*argmax)(backend_t *be, const float *x, int M, int N, int32_t *out);

    /* out[m] = a token drawn from logits[m][:] with params[m] (a HOST array [M]; out device [M]):
     * engine/sampler.h's steps 3-7 exactly as the host sampler runs them (cpu_sample_row in
     * kernels/cpu/cpu_sample.c, the CPU backend's op and the host sampler's draw): temperature 0
     * is argmax (the argmax op's id, bit for bit); else l * f32(1/T); top-k (ties to the lower
     * index); top-p over what top-k kept (the smallest set of highest-ranked tokens whose mass sum
     * >= top_p * their total; at least one); min-p (mass >= f32(min_p), mass = expf(l - max) in
     * f32); then u = sample_rng_uniform(seed, step) (kernels/sample_rng.h)
     * and the walk over the kept tokens in ascending id, summed in double, until the cumulative
     * mass exceeds u * total (fallback: the last kept token of positive mass). The kept set and
     * the walk are the host sampler's; given bit-identical logits the token is the host
     * sampler's except where rounding decides a boundary: a device's expf may differ from the
     * host's in the last place, and the double sums that may be added in another order are the
     * total that top-p's target is taken of, the top-p prefix sums, and (when the kept set is
     * not gathered: no top-k or top-k > the device's cap) the total and the walk. Rows whose
     * logits contain NaN, or whose largest scaled logit is not finite, are only defined for
     * temperature 0. NULL: the backend has none (callers download the logits). */
    void (*sample)(backend_t *be, const float *logits, int M, int N, const bk_sample_t *params, int32_t *out);

    /* Bytes of device memory still free for allocations (sizing KV pools), or 0 when the backend
     * cannot tell (the CPU backend: callers size by host memory). May be NULL. */
    size_t (*mem_available)(backend_t *be);

    /* Sharing device memory with another process on the same device (KV hand-off between a
     * prefill and a decode process on one GPU). All four may be NULL (no such sharing: the CPU
     * backend; callers then move bytes through host memory). ipc_export writes an opaque handle of
     * BK_IPC_HANDLE_BYTES for the allocation that holds dev; ipc_open maps a handle exported by
     * another process (NULL on failure: not the same device, the exporter is gone, ...) and
     * ipc_close unmaps it. copy moves n bytes device to device, ordered with the other ops; every
     * backend has it (the CPU backend's is memcpy), only the three ipc_ hooks may be NULL. */
    int (*ipc_export)(backend_t *be, const void *dev, uint8_t *handle);
    void *(*ipc_open)(backend_t *be, const uint8_t *handle);
    void (*ipc_close)(backend_t *be, void *dev);
    int (*copy)(backend_t *be, void *dst, const void *src, size_t n);

    /* NCCL between processes on different GPUs (bk_nccl_ops_t above); NULL when the backend has
     * none (the CPU backend, or libtroupe_cuda built without nccl.h). */
    const bk_nccl_ops_t *nccl;

    /* Graphs (CUDA graphs): a recorded sequence of ops replayed by one launch, which saves a
     * launch per kernel (a one-row decode step of an 8B model is ~230 of them). All four NULL: the
     * backend has none (the CPU). graph_begin starts recording the ops queued after it on this
     * thread instead of running them (-1: not now, e.g. TROUPE_CUDA_GRAPHS=0; nothing changed);
     * graph_end stops and returns the recorded ops as a graph (NULL with why: none of them ran, the
     * caller queues them again). graph_launch queues one replay; it returns 1 without queueing
     * anything when the graph is stale (scratch memory it uses was reallocated since: free it and
     * record again), else 0. A replay reads and writes the same device addresses with the same
     * launch shapes as the recording: what varies between replays (ids, positions, block tables)
     * must live in device memory the ops read. Ops whose work needs the host between kernels (a
     * download, a host-side sort) must not be recorded. */
    int (*graph_begin)(backend_t *be);
    void *(*graph_end)(backend_t *be, char *err, size_t errlen);
    int (*graph_launch)(backend_t *be, void *graph);
    void (*graph_free)(backend_t *be, void *graph);
    /* 1 when moe_ffn of M tokens over these experts queues device work only (no host round trip,
     * no allocation or upload once it ran uncaptured with them), so a graph may record it; 0 when
     * it may not. Called outside a recording. NULL: never. */
    int (*moe_graphable)(backend_t *be, int M, int H, int k, const bk_expert_t *experts, int n_experts);

    /* DeepSeek-V3 (engine/mla.c). NULL in a backend without them: such models are refused at load.
     *
     * Multi-head Latent Attention over the compressed cache. The pool is made with n_kv_heads 1 and
     * head_dim W/2, W = kv_lora + rope_dim, so one block holds per layer block_size x W values, and
     * MLA addresses a layer's part of a block as [block_size][W]: token slot j's vector at element
     * j*W of base + b*block_bytes + layer*block_size*W*dtype_size, its first kv_lora values the
     * normed latent, the last rope_dim the RoPE'd key (shared by every head).
     *
     * RoPE of MLA (mla_rope_q, mla_kv_store), per row t with p = f32(pos[t]), i < d/2 (d = rope_dim):
     * a = f32(p * inv_freq[i]), c = f32(cos a * mul), s = f32(sin a * mul); with interleave the input
     * pairs are (x[2i], x[2i+1]) (transformers' apply_rotary_pos_emb_interleave: the vector is first
     * de-interleaved), else (x[i], x[i+d/2]); the output is always in rotate_half layout:
     * out[i] = lo c - hi s, out[i+d/2] = hi c + lo s.
     * mla_rope_q: out [M][n_heads][d] = RoPE of q[t][h][rope_off .. rope_off+d) (head stride
     * head_stride floats, row stride n_heads*head_stride).
     * mla_kv_store: per row t of ckv [M][kv_lora + d]: latent = RMSNorm(ckv[t][0..kv_lora)) * norm_w
     * (add_rmsnorm's arithmetic), key = RoPE(ckv[t][kv_lora..)), both stored at the row's slot in
     * kv->dtype (nearest even).
     * mla_attention: absorbed attention. q_lat [M][n_heads][kv_lora], q_pe [M][n_heads][d]; row t,
     * head h attends to positions 0..tok_pos[t] of its sequence: score = (q_lat . latent + q_pe .
     * key) * scale in f32 (the two dot products summed, then scaled), online softmax as `attention`,
     * out [M][n_heads][kv_lora] = sum p latent / sum p.
     * mla_prefill (optional, NULL: never): the decompressed form of mla_attention followed by the
     * latent output's head_matmul through w_uv, for a prompt chunk: every row of meta is of one
     * sequence, n_ctx (host) exceeds each row's position and its positions 0..n_ctx-1 are stored.
     * Per head h: k_j = [W_UK[h] latent_j, key_j], v_j = W_UV[h] latent_j (W_UK[h] = w_uk_t's
     * block h transposed, W_UV[h] = w_uv's block h: mla_load.c's layout), row t's score against
     * position j <= tok_pos[t] = (q[t][h][0..dn) . W_UK[h] latent_j + q_pe[t][h] . key_j) * scale,
     * softmax as `attention`, out [M][n_heads][dv] = sum p v / sum p: the same function as the
     * absorbed ops, up to rounding (a backend may round K, V and q to 16 bits). q [M][n_heads][dn +
     * dr] (its no-RoPE part read), q_pe [M][n_heads][dr]. Returns 0 when it wrote out, -1 when it
     * declines the call (its own choice by rows and shape, a knob, memory): nothing is written and
     * the caller runs the absorbed ops. Never called while a graph is recorded.
     * head_matmul: y[m*y_stride + h*y_head + n] = sum_k w[h*N + n][k] * x[m*x_stride + h*x_head + k]
     * for n < N = w->rows / n_heads, k < K = w->cols, f32 sums in k order (a per-head matmul: q
     * into the latent space through kv_b's K half, the latent output through its V half).
     * add: y[i] += x[i], n floats.
     * moe_route_sigmoid: DeepSeek-V3's router (transformers' DeepseekV3TopkRouter): s = sigmoid(
     * logits) in f32; choice = s + bias (bias [E], device f32); each of n_group groups of E/n_group
     * experts scores the sum of its two largest choice values; the topk_group best groups are kept
     * (ties to the lower group), the other experts' choice set to 0.0; the k largest choice values
     * (ties to the lower expert) give ids [M][k]; weights = s of those experts, divided by (their
     * sum + 1e-20) when renorm, times scale.
     * mtp_top: the MTP layer's drafts and their confidence without the logits coming to the host:
     * out[m] = argmax's id of x[m][0..N) (the lowest index on ties, NaN never the largest, 0 for
     * an all-NaN row) and prob[m] = its softmax probability, 1 / sum_j expf(x[m][j] - x[m][out[m]])
     * over the non-NaN j (0 for an all-NaN row): f32 terms, summed in double on the CPU, in f32
     * in any order on a device (the same up to rounding). NULL in a backend without it (the
     * MTP proposer needs it: engine/mtp.c). */
    void (*mla_rope_q)(backend_t *be, const float *q, int M, int n_heads, int head_stride, int rope_off, int rope_dim,
                       const int32_t *pos, const float *inv_freq, float mul, int interleave, float *out);
    void (*mla_kv_store)(backend_t *be, const bk_kv_t *kv, int layer, const float *ckv, const float *norm_w, float eps,
                         int kv_lora, int rope_dim, const float *inv_freq, float mul, int interleave,
                         const bk_attn_meta_t *meta);
    void (*mla_attention)(backend_t *be, const bk_kv_t *kv, int layer, const float *q_lat, const float *q_pe,
                          int n_heads, int kv_lora, int rope_dim, float scale, const bk_attn_meta_t *meta, float *out);
    int (*mla_prefill)(backend_t *be, const bk_kv_t *kv, int layer, const float *q, const float *q_pe, int n_heads,
                       int kv_lora, int dn, int dr, int dv, const bk_mat_t *w_uk_t, const bk_mat_t *w_uv, float scale,
                       const bk_attn_meta_t *meta, int n_ctx, float *out);
    void (*head_matmul)(backend_t *be, const float *x, int M, int n_heads, int x_stride, int x_head,
                        const bk_mat_t *w, float *y, int y_stride, int y_head);
    void (*add)(backend_t *be, float *y, const float *x, int n);
    void (*moe_route_sigmoid)(backend_t *be, const float *logits, const float *bias, int M, int E, int k, int n_group,
                              int topk_group, int renorm, float scale, int32_t *ids, float *weights);
    void (*mtp_top)(backend_t *be, const float *x, int M, int N, int32_t *out, float *prob);
} backend_ops_t;

struct backend {
    const backend_ops_t *ops;
    int n_threads;                /* CPU threads the backend's host work may use */
    void *impl;                   /* the implementation's own state */
};

/* Tokens per pass of a device backend's MoE kernels (kernels/cuda/cuda_moe.cu): bound the
 * per-entry part of moe_ffn's scratch for long prefill chunks. The FMA device path works chunks of
 * BK_MOE_DEVICE_CHUNK, the grouped tensor-core path chunks of BK_MOE_GROUPED_CHUNK (a bigger chunk
 * fills its GEMM tiles better: 2,048 tokens x top-8 over 128 experts is ~128 rows per expert). */
#define BK_MOE_DEVICE_CHUNK 256
#define BK_MOE_GROUPED_CHUNK 2048

/* Bytes of scratch moe_ffn needs for M tokens, top-k, hidden H, expert width I, E experts, the
 * largest of three layouts. Per expert (the CPU, CUDA's host-sorted path): one expert's gathered
 * rows, gate, up and output (an expert sees each token at most once), plus the per-expert token
 * lists. All experts at once (CUDA's FMA device path), per chunk of at most BK_MOE_DEVICE_CHUNK
 * tokens, R = chunk * k entries: offsets, active experts and the sorted (token, slot) lists, then
 * every entry's SwiGLU activations [R][I] and expert output [R][H] in f32. Grouped (CUDA's
 * tensor-core path), per chunk of at most BK_MOE_GROUPED_CHUNK tokens, R = chunk * k: a tile count,
 * at most R + E row tiles of 16 bytes, the sorted lists, then (each 64-byte aligned) the chunk's
 * tokens [chunk][H] and activations [R][I] in 16 bits, the expert outputs [R][H] in f32 and the
 * per-row scales of quantized activations [chunk + R] in f32. */
static inline size_t moe_scratch_bytes(int M, int k, int H, int I, int E)
{
    size_t m = (size_t)M, rows = m * (size_t)k;
    size_t per_expert = m * ((size_t)H * 2 + (size_t)I * 2) * sizeof(float) + (rows * 2 + (size_t)E + 1) * sizeof(int32_t);
    size_t dm = m < BK_MOE_DEVICE_CHUNK ? m : BK_MOE_DEVICE_CHUNK, r = dm * (size_t)k;
    size_t all = ((size_t)E * 2 + 2 + r * 2) * sizeof(int32_t) + 64 + r * ((size_t)H + (size_t)I) * sizeof(float);
    size_t gm = m < BK_MOE_GROUPED_CHUNK ? m : BK_MOE_GROUPED_CHUNK, gr = gm * (size_t)k;
    size_t grouped = 16 + (gr + (size_t)E) * 16 + gr * 2 * sizeof(int32_t) + 4 * 64 +
                     (gm * (size_t)H + gr * (size_t)I) * 2 + (gr * (size_t)H + gm + gr) * sizeof(float);
    size_t most = per_expert > all ? per_expert : all;
    return (most > grouped ? most : grouped) + 256;
}

/* Makes a backend by name: "cpu" (n_threads <= 0: all cores, or OMP_NUM_THREADS) or "cuda" /
 * "cuda:N" (when libtroupe_cuda is linked in). NULL with err naming the problem otherwise. */
backend_t *backend_new(const char *kind, int n_threads, char *err, size_t errlen);
void backend_destroy(backend_t **self_p);

/* The CPU backend directly. */
backend_t *backend_cpu_new(int n_threads);
/* Provided by libtroupe_cuda.a when linked (weak here). */
backend_t *backend_cuda_new(int device, char *err, size_t errlen) __attribute__((weak));

#endif
