/* kernels/cuda/cuda.h — the CUDA backend's state and ops, shared between its files (internal).
 *
 * Each cuda_<op> implements the backend_ops_t entry of the same name with the semantics written in
 * kernels/backend.h; where the GPU's arithmetic differs from the CPU reference (summation order,
 * bf16 activations inside a GEMM) the op's file says so next to it. Every op is queued on the
 * backend's one stream and returns at once; nothing on the per-token path allocates, except a
 * scratch buffer growing to the largest shape seen (once, at the first step of that shape).
 *
 * Errors: a failing CUDA or cuBLAS call inside an op prints the call, file and line and exits the
 * process with status 1 (CUDA_CHECK / CUBLAS_CHECK): a device error leaves the context unusable,
 * so the supervisor restarting the actor is the only recovery. upload/download/sync report through
 * their return value instead (CUDA_TRY), as the interface asks; alloc returns NULL on
 * out-of-memory.
 *
 * Settings (environment, read by backend_cuda_new; a bad value is an error naming it):
 *   TROUPE_CUDA_GEMV_MAX_M  rows up to which matmul runs the GEMV kernel (default 8; 0: never)
 *   TROUPE_CUDA_QGEMV_MAX_M  the same for W8A8 weights (fp8 / int8 with per-token activations;
 *                           default 16, or TROUPE_CUDA_GEMV_MAX_M where that is given lower): steps
 *                           of 9-16 rows (batch 16, verify steps) read the codes once on the
 *                           tensor-core GEMV instead of running the FP8 / int8 GEMM; weight-only fp8,
 *                           int8 and int4 g128 too unless TROUPE_CUDA_QGEMV_WIDE=0 (cuda_quant.cu)
 *   TROUPE_CUDA_GEMV_WARPS  warps sharing a GEMV row: 0 (default: 8 for matrices of fewer than 3
 *                           waves of 4-warp blocks, else 4; cuda_matmul.cu), 1, 4 or 8 for all
 *   TROUPE_CUDA_GEMM_SPLIT  N: GEMMs of <= N rows (default 32) take activations as bf16/f16 hi + lo,
 *                           larger ones round them once (bf16 activations); 0: always rounded once
 *   TROUPE_CUDA_GEMM_FUSE  1 (default): matmul_n over consecutive row ranges of one matrix with a
 *                           small part (q|k|v) runs one GEMM and deals the rows out; 0: one each
 *   TROUPE_CUDA_MLP_FUSE  1 (default): the dense MLP of a step of more than TROUPE_CUDA_GEMM_SPLIT rows
 *                           writes silu(g) * u straight into down's bf16/f16 input (mlp_swiglu, the
 *                           same bits; 8B fp8 at batch 256: 14.47 -> 14.11 ms a step); 0: swiglu,
 *                           then down converts
 *   TROUPE_CUDA_ATTN_SPLIT  1 (default): split-KV decode attention when rows x heads are few
 *   TROUPE_CUDA_ATTN_FLASH  1 (default): the flash attention kernel (head_dim 64/128); 0: row/tile kernels
 *   TROUPE_CUDA_ATTN_MMA    1 (default): prefill attention over a bf16 cache on the tensor cores
 *                           (head_dim 64/128, cuda_attention_mma.cu); 0: the flash kernel does it
 *   TROUPE_CUDA_ATTN_MMA_DECODE  1 (default): decode attention (one new row per sequence) over a bf16
 *                           cache on the tensor cores (head_dim 64/128, G <= 16,
 *                           cuda_attention_decode_mma.cu); 0: the flash kernel does it
 *   TROUPE_CUDA_PDL         1 (default): programmatic dependent launch for every kernel
 *   TROUPE_CUDA_MOE_DEVICE  1 (default): moe_ffn sorts and runs the experts on the device (no host
 *                           round trip); 0: the host-sorted per-expert path (cuda_moe.cu)
 *   TROUPE_CUDA_MOE_DEVICE_MAX_M  tokens up to which the FMA device path runs (default 64: on the
 *                           H200 it wins up to 64 and loses at 256); above, the grouped path
 *   TROUPE_CUDA_MOE_GROUPED 1 (default): above that, moe_ffn's grouped tensor-core GEMMs on the device
 *                           (cuda_moe_gemm.cu); 0: the host-sorted path there, as before
 *   TROUPE_CUDA_MOE_GROUPED_MIN_M  tokens from which the grouped path runs for the experts it takes,
 *                           below the FMA threshold too (default 9: on the H200 it beats the FMA path
 *                           from 16 tokens, 1.3x, and at 64, 1.9x; f32 experts keep the FMA path)
 *   TROUPE_CUDA_MOE_GROUPED_BM  the grouped GEMMs' row tile: 0 (default: by the average rows per
 *                           expert), or 32, 64, 128 for every step (measuring)
 * kernels/cuda/README.md has what each choice measured on the H200.
 *
 * Known limits: one device per process (ops do not call cudaSetDevice: a process with several
 * CUDA backends on different devices must not interleave them on one thread). Not batch-
 * invariant above gemv_max_m rows (cuBLASLt chooses its kernel by shape; kernels/cuda/cuda_matmul.cu).
 */
#ifndef TROUPE_KERNELS_CUDA_H
#define TROUPE_KERNELS_CUDA_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <pthread.h>
#include <cuda_runtime.h>

extern "C" {
#include "common/dtype.h"
#include "common/util.h"
#include "kernels/backend.h"
}

/* Prints "what failed: why (file:line)" and exits 1. */
[[noreturn]] void cuda_die(const char *expr, const char *why, const char *file, int line);
/* Prints the same line and returns -1 (for the ops that report errors by value). */
int cuda_report(const char *expr, const char *why, const char *file, int line);

#define CUDA_CHECK(expr)                                                                                  \
    do {                                                                                                  \
        cudaError_t e_ = (expr);                                                                          \
        if (e_ != cudaSuccess)                                                                            \
            cuda_die(#expr, cudaGetErrorString(e_), __FILE__, __LINE__);                                  \
    } while (0)
#define CUBLAS_CHECK(expr)                                                                                \
    do {                                                                                                  \
        cublasStatus_t s_ = (expr);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                  \
            cuda_die(#expr, cublasGetStatusString(s_), __FILE__, __LINE__);                               \
    } while (0)
/* After every kernel launch: a bad launch configuration shows up here, not at the next sync. */
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())
/* For functions that return 0 / -1. */
#define CUDA_TRY(expr)                                                                                    \
    do {                                                                                                  \
        cudaError_t e_ = (expr);                                                                          \
        if (e_ != cudaSuccess)                                                                            \
            return cuda_report(#expr, cudaGetErrorString(e_), __FILE__, __LINE__);                        \
    } while (0)

#define CUDA_MAX_PLANS 64         /* cuBLASLt plans cached by shape */
#define CUDA_STAGE_BYTES ((size_t)64 << 20)   /* one pinned staging buffer for weight_put */

/* One cuBLASLt GEMM shape, ready to run: descriptors and the algorithm the heuristic chose. */
typedef struct cuda_plan {
    int used;
    dtype_t dt;                   /* weight dtype (bf16 or f16) */
    int M;
    int64_t N, K;
    unsigned align_w, align_y;    /* pointer alignments the algorithm was chosen for */
    int has_algo;                 /* 0: the heuristic found none; cublasGemmEx runs instead */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} cuda_plan_t;

typedef struct cuda_state {
    int device;
    int n_sm;                     /* multiprocessors: sizes the attention split */
    cudaStream_t stream;          /* every op, copy and sync of this backend */
    cudaStream_t side;            /* download_side only (write-backs beside the model's ops) */
    pthread_mutex_t side_lock;    /* download_side: one caller at a time (its staging below) */
    void *side_buf[2];            /* pinned host staging, SIDE_CHUNK bytes each (made at first use) */
    cudaEvent_t side_ev[2];
    cublasHandle_t blas;          /* SGEMM for f32 weights (pedantic math: no TF32) */
    cublasLtHandle_t lt;          /* bf16 / f16 GEMMs */
    void *lt_ws;                  /* device: cuBLASLt workspace */
    size_t lt_ws_bytes;
    void *conv;                   /* device: activations converted to the weights' 16-bit type for a GEMM */
    size_t conv_bytes;
    float *part;                  /* device: split-KV attention partials [rows][heads][splits][D + 2] */
    size_t part_bytes;
    float *gout;                  /* device: the split GEMM's [2M][N] output (hi rows, then lo rows), or a fused one's [M][sum N] */
    size_t gout_bytes;
    int gemv_max_m;               /* matmuls with M <= this run the GEMV kernel (TROUPE_CUDA_GEMV_MAX_M, default 8) */
    int qgemv_max_m;              /* W8A8 ones (TROUPE_CUDA_QGEMV_MAX_M: 16, or a lower GEMV_MAX_M given) */
    int gemv_warps;               /* warps sharing one output row in the GEMV (TROUPE_CUDA_GEMV_WARPS: 0 = by N, 1, 4, 8) */
    int gemv_mma;                 /* bf16 weights' GEMV on tensor cores with this many warps per block, 4 or 8 (TROUPE_CUDA_GEMV_MMA, default 8); 0: the CUDA-core GEMV */
    int gemv_mma_min_m;           /* ... for matmuls of at least this many rows (TROUPE_CUDA_GEMV_MMA_MIN_M, default 2) */
    int gemv_mma_kstep;           /* ... with steps of this many k per warp, 64 or 128 (TROUPE_CUDA_GEMV_MMA_KSTEP, default 64) */
    int gemm_split_max_m;         /* GEMMs of at most this many rows take activations as hi + lo (TROUPE_CUDA_GEMM_SPLIT, default 32) */
    int gemm_fuse;                /* 1 (default): matmul_n runs q|k|v as one GEMM (TROUPE_CUDA_GEMM_FUSE) */
    int mlp_fuse;                 /* 1: mlp_swiglu takes GEMM-sized steps (TROUPE_CUDA_MLP_FUSE, default 1) */
    int w8a8_mlp;                 /* 1: and W8A8 ones, gate's and up's sums straight to down's codes
                                     (TROUPE_CUDA_W8A8_MLP, default 1) */
    int attn_split;               /* 0: never split the keys of a row across blocks (TROUPE_CUDA_ATTN_SPLIT=0) */
    int attn_split_blocks;        /* tensor-core decode: key ranges until rows x kv heads x ranges is this many blocks per SM
                                     (TROUPE_CUDA_ATTN_SPLIT_BLOCKS, default 1) */
    int attn_flash;               /* 1 (default): the flash kernel for head_dim 64/128 (TROUPE_CUDA_ATTN_FLASH) */
    int attn_mma;                 /* 1 (default): the tensor-core kernel for bf16 prefill within attn_flash (TROUPE_CUDA_ATTN_MMA) */
    int attn_mma_decode;          /* 1 (default): the tensor-core kernel for bf16 decode within attn_flash (TROUPE_CUDA_ATTN_MMA_DECODE) */
    int attn_verify;              /* verify steps' rows (TROUPE_CUDA_ATTN_VERIFY): 0 as any rows; 1 by sequence in the decode
                                     kernel up to one m16 tile per block, else the prefill kernel; 2 (default) up to two */
    int pdl;                      /* 1 (default): kernels launch with programmatic dependent launch (TROUPE_CUDA_PDL) */
    int attn_decode_pdl;          /* the tensor-core decode attention's own launch (TROUPE_CUDA_ATTN_DECODE_PDL): 0 never
                                     with PDL, 1 always, 2 (default) only for one sequence (cuda_attention_decode_mma.cu) */
    const char *pdl_skip;         /* kernels that launch without it: comma-separated parts of their names, NULL for
                                     none (TROUPE_CUDA_PDL_SKIP: to find a kernel whose early launch costs more than it saves) */
    cuda_plan_t plans[CUDA_MAX_PLANS];
    int next_plan;                /* round-robin victim when the plan cache is full */

    void *stage[2];               /* pinned host: weight_put staging, used alternately */
    cudaEvent_t stage_done[2];    /* recorded after the copy out of stage[i]: refill only after it */
    int stage_next;

    void **weights;               /* device buffers made by weight_put, freed at destroy if still held */
    void **slabs;                 /* slabs small weights are carved from (WEIGHT_SLAB bytes each), freed at destroy */
    int n_slabs, cap_slabs;
    size_t wslab_used;            /* bytes carved from the last slab */
    int n_weights, cap_weights;

    int32_t *h_ids;               /* host: moe_ffn's routing copied back, then its sorted lists */
    size_t h_ids_cap;             /* int32 elements */

    int moe_device;               /* 1 (default): moe_ffn's device paths (TROUPE_CUDA_MOE_DEVICE) */
    int moe_device_max_m;         /* ... the FMA one for M <= this (TROUPE_CUDA_MOE_DEVICE_MAX_M, default 64) */
    int moe_grouped;              /* 1 (default): the grouped GEMMs above it (TROUPE_CUDA_MOE_GROUPED) */
    int moe_grouped_min_m;        /* ... and from this many tokens for the weights they take (TROUPE_CUDA_MOE_GROUPED_MIN_M, 9) */
    int moe_grouped_bm;           /* their row tile: 0 = by rows per expert, else 32/64/128 (TROUPE_CUDA_MOE_GROUPED_BM) */
    struct cuda_moe_table *moe_tables;   /* device copies of the experts arrays seen (cuda_moe.cu) */
    int n_moe_tables, cap_moe_tables;

    void *sample_params;          /* device: the sample op's bk_sample_t [M] of the latest call */
    size_t sample_params_bytes;

    int graphs;                   /* 1 (default): graph_begin records (TROUPE_CUDA_GRAPHS=0: it refuses) */
    int graph_pdl;                /* 1 (default): recorded kernels keep their PDL edges (TROUPE_CUDA_GRAPH_PDL) */
    int capturing;                /* between graph_begin and graph_end */
    uint64_t scratch_gen;         /* bumped by every cuda_scratch reallocation that frees (cuda_graph.cu) */
    /* Scratch buffers a larger step replaced, kept allocated so that the graphs recorded with them
     * stay valid (cuda_scratch), up to scratch_keep_bytes in all (TROUPE_CUDA_SCRATCH_KEEP_MB) */
#define CUDA_RETIRED_MAX 64
    void *retired[CUDA_RETIRED_MAX];
    int n_retired;
    size_t retired_bytes, scratch_keep_bytes;
    int scratch_keep_mb;
    void *quant_x;                /* device: cuda_qmatmul's fake-quantized activations [M][K] f32 */
    size_t quant_x_bytes;
    void *quant_w;                /* device: cuda_qmatmul's dequantized weight [N][K] bf16 (GEMM-sized steps) */
    size_t quant_w_bytes;
    int mla_prefill;              /* MLA prompt chunks: CUDA_MLA_PF_* (TROUPE_CUDA_MLA_PREFILL, default auto) */
    int mla_pf_keys;              /* ... keys per pass of the decompressed form (TROUPE_CUDA_MLA_PREFILL_KEYS; 0: by 1 GiB of scratch) */
    int mla_mma;                  /* MLA's absorbed attention on the tensor cores (TROUPE_CUDA_MLA_MMA): 0 (default) never, 1 where
                                     cuda_mla_decode_mma.cu takes the shape, 2 the same and a refusal is fatal (tests) */
    void *mla_pf;                 /* device: mla_prefill's latents, K and V of one call (cuda_mla_prefill.cu) */
    size_t mla_pf_bytes;
} cuda_state_t;

/* TROUPE_CUDA_MLA_PREFILL: absorbed (every row over the compressed cache), decompressed (every
 * sequence the engine offers: more rows than a graph step has), auto (those of at least 32 rows). */
enum { CUDA_MLA_PF_AUTO = 0, CUDA_MLA_PF_ABSORBED, CUDA_MLA_PF_DECOMPRESSED };

static inline cuda_state_t *cuda_st(backend_t *be) { return (cuda_state_t *)be->impl; }

/* Grows a device scratch buffer to at least `bytes` (waits for queued work before freeing the
 * old one, which an op in flight may still read). */
void *cuda_scratch(backend_t *be, void **buf, size_t *cap, size_t bytes);

void cuda_matmul(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y);
/* cuda_matmul for a quantized w (kernels/cuda/cuda_quant.cu); cuda_matmul calls it. */
void cuda_qmatmul(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y);
int cuda_w8a8_mlp(backend_t *be, const float *x, int M, const bk_mat_t *gate, const bk_mat_t *up,
                  const bk_mat_t *down, float *g, float *u, float *out);
void cuda_qmatmul_n(backend_t *be, const float *x, int M, int n, const bk_mat_t *const w[], const float *const bias[],
                    float *const y[]);
/* x [n] as 16-bit GEMM operands into out (f16: saturated; else bf16, round to nearest even). */
void cuda_to16(const cuda_state_t *st, const float *x, int64_t n, bool f16, uint16_t *out);
void cuda_matmul_n(backend_t *be, const float *x, int M, int n, const bk_mat_t *const w[], const float *const bias[],
                   float *const y[]);

int cuda_moe_graphable(backend_t *be, int M, int H, int k, const bk_expert_t *experts, int n_experts);
int cuda_graph_begin(backend_t *be);
void *cuda_graph_end(backend_t *be, char *err, size_t errlen);
int cuda_graph_launch(backend_t *be, void *graph);
void cuda_graph_free(backend_t *be, void *graph);
void cuda_plans_destroy(cuda_state_t *st);

void cuda_embed(backend_t *be, const bk_mat_t *table, const int32_t *ids, int n, float *out);
void cuda_add_rmsnorm(backend_t *be, float *res, const float *x, const float *w, int M, int H, float eps, float *out);
void cuda_head_rmsnorm(backend_t *be, float *x, const float *w, int M, int n_heads, int head_dim, float eps);
void cuda_rope(backend_t *be, float *x, const int32_t *pos, const float *inv_freq, int M, int n_heads, int head_dim);
void cuda_swiglu(backend_t *be, const float *gate, const float *up, int n, float *out);
void cuda_gather_rows(backend_t *be, const float *src, const int32_t *rows, int n, int cols, float *dst);
void cuda_argmax(backend_t *be, const float *x, int M, int N, int32_t *out);
void cuda_sample(backend_t *be, const float *logits, int M, int N, const bk_sample_t *params, int32_t *out);

/* The fields every KV/attention kernel's argument struct has for addressing the paged pool and the
 * step's rows (attn_args_t, mma_args_t, dmma_args_t), filled in one place. */
template <typename A> static inline void cuda_kv_addr(A &a, const bk_kv_t *kv, int layer, const bk_attn_meta_t *meta)
{
    a.base = (const uint8_t *)kv->base;
    a.block_bytes = kv->block_bytes;
    a.block_size = kv->block_size;
    a.n_kv = kv->n_kv_heads;
    a.layer = layer;
    a.tok_seq = meta->tok_seq;
    a.tok_pos = meta->tok_pos;
    a.seq_bt_start = meta->seq_bt_start;
    a.block_table = meta->block_table;
}

void cuda_kv_store(backend_t *be, const bk_kv_t *kv, int layer, const float *k, const float *v, const bk_attn_meta_t *meta);
int cuda_kv_supported(backend_t *be, dtype_t dtype, int head_dim, int n_heads, int n_kv_heads, char *err, size_t errlen);
void cuda_rope_kv_store(backend_t *be, const bk_kv_t *kv, int layer, float *q, float *k, const float *v, int n_heads,
                        const float *inv_freq, const bk_attn_meta_t *meta);
int cuda_gate_up_swiglu(backend_t *be, const float *x, int M, const bk_mat_t *w, float *out);
int cuda_mlp_swiglu(backend_t *be, const float *x, int M, const bk_mat_t *gate, const bk_mat_t *up, const bk_mat_t *down,
                    float *g, float *u, float *out);
void cuda_fill_dummy(backend_t *be, void *dev, dtype_t dt, size_t n, uint64_t key, float center, float scale);
void cuda_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q, int n_heads, float scale,
                    const bk_attn_meta_t *meta, float *out);
/* The prefill attention on the tensor cores (cuda_attention_mma.cu): queued and 0, or -1 without
 * touching anything when it does not take the shape (not a bf16 cache, head_dim not 64/128, ...). */
int cuda_attention_mma(const cuda_state_t *st, const bk_kv_t *kv, int layer, const float *q, int n_heads, float scale,
                       const bk_attn_meta_t *meta, float *out);
/* The decode attention on the tensor cores (cuda_attention_decode_mma.cu), for calls with one row
 * per sequence (or, grouped by sequence, the calls cuda_attention_decode_mma_groups takes): S key
 * ranges per row; S > 1 writes part ([T][n_heads][S][D + 2], for k_attn_merge)
 * instead of out. Queued and 0, or -1 without touching anything when it does not take the shape. */
int cuda_attention_decode_mma(const cuda_state_t *st, const bk_kv_t *kv, int layer, const float *q, int n_heads,
                              float scale, const bk_attn_meta_t *meta, int S, float *part, float *out);
/* Calls with several rows per sequence (speculative verification) that the decode kernel takes by
 * sequence, each sequence's rows in blocks of up to max_mt x 16 query vectors (rows x query heads
 * per kv head) that read its keys once: the meta names each sequence's rows (seq_row0) and
 * max_rows is at most CUDA_VERIFY_MAX_ROWS (with max_mt 1: at most 16 vectors). Returns the
 * blocks per kv head, or 0 when the call is not such a call. */
#define CUDA_VERIFY_MAX_ROWS 16
int cuda_attention_decode_mma_groups(const bk_kv_t *kv, int n_heads, const bk_attn_meta_t *meta, int max_mt);

void cuda_moe_route(backend_t *be, const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights);
void cuda_moe_ffn(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                  const bk_expert_t *experts, int n_experts, void *scratch, float *out);
void cuda_moe_ffn_as(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                     const bk_expert_t *experts, int n_experts, void *scratch, float *out, int as_m);
void cuda_moe_count(backend_t *be, const int32_t *ids, int n, uint32_t *counts);
void cuda_moe_destroy(cuda_state_t *st);   /* frees the moe tables (at backend destroy) */

/* One expert's weights as the device MoE kernels read them (cuda_moe.cu keeps a device table of
 * them per experts array). */
typedef struct moe_dev_expert {
    const void *gate;             /* [I][H] (quantized: its codes, a byte or a nibble each) */
    const void *up;               /* [I][H] */
    const void *down;             /* [H][I] */
    const float *gate_s, *up_s, *down_s;   /* quantized: each one's f32 block scales (bk_mat_t.qscale); else NULL */
} moe_dev_expert_t;

/* Quantized experts (cuda_moe_quant.cu): fp8 e4m3 or int8 codes (a byte per weight), int4 or fp4
 * e2m1 (a nibble), with f32 block scales of gr x gc (kernels/backend.h's bk_mat_t; effective
 * blocks, gc a multiple of 16 or >= the columns). */
typedef struct moe_qgrid {
    int fmt;                      /* BK_Q_FP8, BK_Q_I8, BK_Q_I4 or BK_Q_FP4 */
    int gr, gc;                   /* scale block of the matrix (gate and up share one; down its own) */
} moe_qgrid_t;
/* Whether the quantized expert kernels take this format (fp8, int8, int4, fp4). */
bool cuda_moe_quant_takes(int fmt);
/* The FMA device path's expert matmuls over quantized weights, as k_moe_experts (cuda_moe.cu) over
 * plain ones: gu: act[sorted entry][I] = silu(gate x) * up x with x = in[tok[p]] (N = I, K = H);
 * else y[slot[p]][H] = down act[p] (N = H, K = I). grid_y = min(E, entries); M sizes the entries
 * per pass; vec: the 16-byte kernel (codes and in rows 16-byte aligned, K % 16 == 0). */
void cuda_moe_qexperts(const cuda_state_t *st, moe_qgrid_t g, bool gu, int M, bool vec, unsigned grid_y,
                       const moe_dev_expert_t *tab, const int32_t *off, const int32_t *active,
                       const int32_t *n_active, const int32_t *tok, const int32_t *slot, const float *in, int64_t N,
                       int64_t K, float *out);
/* bk_mat_t.qact's fake quantization (cpu_quant_act_row's arithmetic) of rows rows of K floats:
 * out may alias x. */
void cuda_moe_qact(const cuda_state_t *st, const float *x, int rows, int64_t K, int act, float *out);
/* The same as GEMM operands: per row the codes q (fp8 values, or integers in [-127, 127]) as f16,
 * exactly, into codes [rows][K], and the row's scale s into scale [rows], so q * s is
 * cpu_quant_act_row's value (an all-zero row: x itself and 1; a non-finite amax: NaN). */
void cuda_moe_qcodes(const cuda_state_t *st, const float *x, int rows, int64_t K, int act, uint16_t *codes,
                     float *scale);

/* One chunk of moe_ffn's grouped path (cuda_moe_gemm.cu), every pointer device memory: what the
 * sort made (cuda_moe.cu, k_moe_sort_tiles) and where the GEMMs write. */
typedef struct moe_grouped_chunk {
    const moe_dev_expert_t *tab;  /* [E] */
    dtype_t dt;                   /* the weights': bf16 or f16 (quantized experts: bf16; unused, qfmt decides) */
    int qfmt, qact;               /* quantized experts: BK_Q_* and BK_QA_*; 0 for plain weights */
    moe_qgrid_t qgu, qdn;         /* quantized: the scale blocks of gate|up and of down */
    float *qsx, *qsa;             /* quantized with qact: [mc] the tokens' and [rows] the entries' activation scales */
    int bm;                       /* rows per tile (32, 64, 128): the sort cut the tiles to it */
    int H, I, E;
    const float *x;               /* [mc][H] the chunk's tokens (f32; qact: their codes are taken from it) */
    int mc, rows;                 /* tokens; routing entries, mc * k */
    const int4 *tiles;            /* [cuda_moe_tiles_max]: expert, first sorted entry, rows (1..bm) */
    const int32_t *n_tiles;       /* [1] tiles in use */
    const int32_t *tok, *slot;    /* [rows] each sorted entry's token (in the chunk) and t * k + j */
    void *xh;                     /* [mc][H] 16-bit: x in the weights' type */
    void *act;                    /* [rows][I] 16-bit: silu(g) * u, sorted order (qact: its codes) */
    float *y;                     /* [rows][H]: each entry's expert output, row t * k + j (qact: first the
                                     f32 silu(g) * u [rows][I], I <= H, before its codes are taken) */
} moe_grouped_chunk_t;

/* Row tiles of bm that rows entries over E experts can need: sum over experts of ceil(n_e / bm)
 * <= rows / bm + (experts with entries). Sizes the tile list and the GEMMs' grid. */
static inline int cuda_moe_tiles_max(int rows, int bm, int E)
{
    return (rows + bm - 1) / bm + (E < rows ? E : rows);
}
/* Whether the grouped GEMMs take experts of this dtype and shape (bf16/f16, H and I multiples of 8;
 * the caller checks the weights' 16-byte alignment); quantized (qfmt, qact, the scale blocks qgu of
 * gate|up and qdn of down): fp8/int8 codes with H and I multiples of 16, int4/fp4 with multiples of
 * 32, and with qact one scale per weight row (per channel or tensor) and I <= H. */
bool cuda_moe_gemm_takes(dtype_t dt, int64_t H, int64_t I);
bool cuda_moe_gemm_takes_q(int qfmt, int qact, moe_qgrid_t qgu, moe_qgrid_t qdn, int64_t H, int64_t I);
/* Their row tile for a chunk of `rows` entries over E experts: 32, 64 or 128. */
int cuda_moe_gemm_bm(const cuda_state_t *st, int rows, int E);
/* Queues the chunk's x conversion and its two GEMMs (y complete when the next kernel starts). */
void cuda_moe_gemm(const cuda_state_t *st, const moe_grouped_chunk_t *c);

/* NCCL between processes on different GPUs (cuda_nccl.cu; only when built with nccl.h). */
#ifdef TROUPE_NCCL
extern const bk_nccl_ops_t cuda_nccl_ops;
#define CUDA_NCCL_OPS (&cuda_nccl_ops)
#else
#define CUDA_NCCL_OPS NULL
#endif

/* Shared by moe_ffn: dst[i] = src[rows[i]] for n rows of cols floats (rows on the device). */
void cuda_launch_gather(const cuda_state_t *st, const float *src, const int32_t *rows, int n, int cols, float *dst);

/* Whether `kernel` is one of TROUPE_CUDA_PDL_SKIP's (cuda_backend.cu; called only when it is set). */
int cuda_pdl_skipped(const cuda_state_t *st, const void *kernel);

/* Every kernel of this backend is launched here, on the backend's stream. With st->pdl the launch
 * allows programmatic dependent launch (Hopper): the kernel may start while its predecessor in
 * the stream is finishing. That is safe because every kernel begins with DEV_PDL_ENTER (in
 * cuda_dev.cuh), which waits until the predecessor grid has completed and its writes are visible
 * before touching anything but immutable weights; launches that are not kernels (copies, memsets,
 * cuBLAS) keep the stream's full ordering. The check after the launch catches a bad configuration
 * at once. pdl 0 launches this one kernel without it, whatever st->pdl says (a kernel whose early
 * launch was measured to cost more than it saves). */
template <typename... KArgs, typename... Args>
static inline void cuda_launch_smem_pdl(const cuda_state_t *st, int pdl, void (*kernel)(KArgs...), dim3 grid,
                                        dim3 block, size_t smem, Args... args)
{
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st->stream;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl && st->pdl && (!st->capturing || st->graph_pdl) &&
                           !(st->pdl_skip && cuda_pdl_skipped(st, (const void *)kernel)) ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...));
}
template <typename... KArgs, typename... Args>
static inline void cuda_launch_smem(const cuda_state_t *st, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                    size_t smem, Args... args)
{
    cuda_launch_smem_pdl(st, 1, kernel, grid, block, smem, args...);
}
template <typename... KArgs, typename... Args>
static inline void cuda_launch(const cuda_state_t *st, void (*kernel)(KArgs...), dim3 grid, dim3 block, Args... args)
{
    cuda_launch_smem(st, kernel, grid, block, 0, args...);
}

/* cuda_launch_smem for a kernel that may take more than the default 48 KB of dynamic shared
 * memory: the kernel's limit is raised (cudaFuncSetAttribute) the first time a launch asks for more
 * than it was set to, once per kernel and size rather than per launch. */
template <auto Kernel, typename... Args>
static inline void cuda_launch_large_smem_pdl(const cuda_state_t *st, int pdl, dim3 grid, dim3 block, size_t smem,
                                              Args... args)
{
    static size_t allowed = 48 << 10;              /* per kernel (each Kernel is its own instantiation) */
    if (smem > allowed) {
        CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        allowed = smem;
    }
    cuda_launch_smem_pdl(st, pdl, Kernel, grid, block, smem, args...);
}
template <auto Kernel, typename... Args>
static inline void cuda_launch_large_smem(const cuda_state_t *st, dim3 grid, dim3 block, size_t smem, Args... args)
{
    cuda_launch_large_smem_pdl<Kernel>(st, 1, grid, block, smem, args...);
}

/* DeepSeek-V3 (kernels/cuda/cuda_mla.cu). */
void cuda_mla_rope_q(backend_t *be, const float *q, int M, int n_heads, int head_stride, int rope_off, int rope_dim,
                     const int32_t *pos, const float *inv_freq, float mul, int interleave, float *out);
void cuda_mla_kv_store(backend_t *be, const bk_kv_t *kv, int layer, const float *ckv, const float *norm_w, float eps,
                       int kv_lora, int rope_dim, const float *inv_freq, float mul, int interleave,
                       const bk_attn_meta_t *meta);
void cuda_mla_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q_lat, const float *q_pe,
                        int n_heads, int kv_lora, int rope_dim, float scale, const bk_attn_meta_t *meta, float *out);
int cuda_mla_prefill(backend_t *be, const bk_kv_t *kv, int layer, const float *q, const float *q_pe, int n_heads,
                     int kv_lora, int dn, int dr, int dv, const bk_mat_t *w_uk_t, const bk_mat_t *w_uv, float scale,
                     const bk_attn_meta_t *meta, int n_ctx, float *out);   /* cuda_mla_prefill.cu */
/* The absorbed attention on the tensor cores (cuda_mla_decode_mma.cu): k_mla_split's result, its
 * partials [T][n_heads][S][kv_lora + 2] in part when S > 1 (the caller combines them); -1 when it
 * refuses the shape (nothing launched). */
int cuda_mla_decode_mma(const cuda_state_t *st, const bk_kv_t *kv, int layer, const float *q_lat, const float *q_pe,
                        int n_heads, int kv_lora, int rope_dim, float scale, const bk_attn_meta_t *meta, int S,
                        float *part, float *out);
void cuda_head_matmul(backend_t *be, const float *x, int M, int n_heads, int x_stride, int x_head, const bk_mat_t *w,
                      float *y, int y_stride, int y_head);
void cuda_add(backend_t *be, float *y, const float *x, int n);
void cuda_moe_route_sigmoid(backend_t *be, const float *logits, const float *bias, int M, int E, int k, int n_group,
                            int topk_group, int renorm, float scale, int32_t *ids, float *weights);
void cuda_mtp_top(backend_t *be, const float *x, int M, int N, int32_t *out, float *prob);

#endif
