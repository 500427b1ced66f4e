/* kernels/cuda/cuda_mla_prefill.cu — MLA's decompressed form for prompt chunks (backend.h,
 * mla_prefill): the rows of one sequence attend to its keys 0..n_ctx-1 with K and V made per head
 * from the compressed cache, on the tensor cores. The cache keeps only [latent, k_pe]; decode and
 * short verify steps stay absorbed (cuda_mla.cu).
 *
 * Why: the absorbed form scores every (row, key) against kv_lora + rope = 576 values per head on the
 * CUDA cores in f32 (k_mla_split); a prompt chunk of a thousand rows spends most of its attention
 * time there (V2-Lite shape on one H200: 122 of a 1,000-token prefill's 221 ms). Decompressed, the
 * per-key work is one GEMM over the context (latent [n_ctx][kv_lora] times kv_b), done once for all
 * the chunk's rows, and the per-(row, key) work is ordinary attention with head dim 192 / 128 on
 * the tensor cores. vLLM, SGLang and FlashMLA split prefill and decode the same way.
 *
 * Steps of one call (one stream, in order), per pass over a range of the context's positions (one
 * pass unless K and V of the whole context would pass MLA_PF_MAX_SCRATCH, or
 * TROUPE_CUDA_MLA_PREFILL_KEYS sets the keys per pass):
 *   1. k_pf_gather: the range's entries from the paged cache as bf16: the latents into
 *      lat [nk][kv_lora], the RoPE key broadcast into every head's last dr columns of
 *      K [nk][n_heads][dn + dr] (nk: the pass's positions).
 *   2. cuBLAS, bf16 in, f32 accumulation, bf16 out: K[:, h, :dn] = lat W_UK[h]^T (a batched GEMM
 *      over the heads with w_uk_t, the absorbed form's own re-laid copy: no second copy of kv_b is
 *      kept) and V [nk][n_heads][dv] = lat w_uv^T (one GEMM).
 *   3. k_mla_prefill: causal flash attention (FlashAttention-2's structure, mma.sync m16n8k16 bf16,
 *      the key-tile loop of cuda_flash_tile.cuh, shared with cuda_attention_mma.cu's kernel): one block per (head, 64 rows), 4 warps of 16 rows; Q
 *      (q's no-RoPE part and the RoPE'd q_pe, f32 -> bf16) in registers, 64-key K/V tiles
 *      double-buffered by cp.async, online softmax in the log2 domain, P reused from S's
 *      accumulators as A fragments. Each row attends to keys 0..tok_pos[t]: the chunk's offset into
 *      the context (prefix-cached or earlier chunks) comes with the positions; K/V hold the pass's
 *      positions k0..k1-1 in order, so key index = position - k0. Between passes each row's
 *      softmax state stays in memory (FlashAttention's split over keys): out holds the
 *      unnormalised sum, ml the running max and sum; the last pass divides. 
 * K is 192 wide and V 128, in dense per-call buffers (cuda_attention_mma.cu's kernel reads one
 * head_dim, 64 or 128, for both from the paged cache; V padded to 192 would cost a third more P V),
 * so the kernel's template has a width for each: Q K^T in DK / 16 k-steps, P V in DV / 8 n-blocks.
 *
 * Numerics (against the absorbed form, the CPU's): the latent is the cache's value (exact for a bf16
 * or fp8 cache; an f32 cache's is rounded to bf16), K_nope and V are rounded once to bf16 after f32
 * accumulation, q to bf16, and p to bf16 before P V (l sums the rounded p): a CPU emulation of this
 * rounding gives 4-8e-3 worst (row, head) relative error on tests/gpu/test_mla_cuda.c's
 * test_prefill inputs (scores of a few units), which holds it to 2e-2.
 *
 * Declines (returns -1, the caller runs the absorbed form): TROUPE_CUDA_MLA_PREFILL=absorbed, auto
 * with fewer than MLA_PF_AUTO_ROWS rows, a graph being recorded (the scratch depends on n_ctx), kv_b
 * not bf16, a head shape not instantiated below, an fp8 cache with scales, misaligned activations,
 * or scratch that cannot be allocated.
 *
 * Written without a GPU at hand: compiled for sm_90, first run pending. */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_flash_tile.cuh"
#include "kernels/cuda/cuda_mma.cuh"

#define PF_WARPS 4
#define PF_THREADS (PF_WARPS * 32)
#define PF_ROWS 64                /* query rows per block: 16 per warp, one m16 tile each */
#define PF_KEYS FLASH_KEYS        /* keys per K/V tile (the tile loop's) */
#define PF_PAD 8                  /* bf16 elements (16 bytes) added to every shared row: no ldmatrix conflicts */
/* auto: a sequence's rows from which the decompressed form runs. Unmeasured guess: by FLOPs the
 * context GEMM (2 kv_lora (dn + dv) per key and head) costs what ~8 rows of absorbed scores do on
 * the CUDA cores at a tenth of the tensor cores' rate; 32 leaves room for the K/V round trip. */
#define MLA_PF_AUTO_ROWS 32
#define MLA_PF_MAX_SCRATCH ((size_t)1 << 30)

typedef struct pf_args {
    const float *q;               /* [T][n_heads][DK]: each head's first dn = DK - dr values (no RoPE) */
    const float *q_pe;            /* [T][n_heads][dr]: the RoPE'd part */
    const uint16_t *k;            /* [k1 - k0][n_heads][DK] bf16 */
    const uint16_t *v;            /* [k1 - k0][n_heads][DV] bf16 */
    const int32_t *tok_pos;       /* device [T] */
    float *out;                   /* [T][n_heads][DV]: the result; between passes the unnormalised sum */
    float *ml;                    /* [T][n_heads][2]: the running (max, sum) between passes */
    int T, n_heads, dr;
    int k0, k1;                   /* this pass's positions k0..k1-1: k[0] is position k0 */
    int first, last;              /* whether the pass starts (no state to read) or ends the softmax */
    float scale_log2;             /* scale * log2(e) */
} pf_args_t;

/* Shared memory: K and V stages 2 x 64 x (D + 8) bf16 each, Q 64 x (DK + 8): 109 KB at 192 / 128
 * (2 blocks per SM). */
template <int DK, int DV> struct pf_smem {
    static constexpr int KS = DK + PF_PAD, VS = DV + PF_PAD;  /* row strides, elements */
    static constexpr size_t BYTES = ((size_t)2 * PF_KEYS * KS + (size_t)2 * PF_KEYS * VS + (size_t)PF_ROWS * KS) * 2;
};

template <int DK, int DV>
__global__ void __launch_bounds__(PF_THREADS, 2) k_mla_prefill(pf_args_t a)
{
    DEV_PDL_ENTER();
    typedef pf_smem<DK, DV> SM;
    constexpr int KS = SM::KS, VS = SM::VS;
    constexpr int KCH = DK / 8, VCH = DV / 8;      /* 16-byte chunks per K, V row */
    constexpr int KD = DK / 16;                    /* k16 steps of Q K^T */
    constexpr int DB = DV / 8;                     /* n8 blocks of O */
    extern __shared__ __align__(16) uint8_t pf_sm[];
    uint16_t *Ks = (uint16_t *)pf_sm;              /* [2][PF_KEYS][KS] */
    uint16_t *Vs = Ks + 2 * PF_KEYS * KS;          /* [2][PF_KEYS][VS] */
    uint16_t *Qs = Vs + 2 * PF_KEYS * VS;          /* [PF_ROWS][KS] */
    __shared__ int s_pos[PF_ROWS];                 /* per tile row; -1: no row */

    const int h = blockIdx.x, t0 = (gridDim.y - 1 - blockIdx.y) * PF_ROWS;   /* the long (late) rows first */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int dn = DK - a.dr;
    for (int r = threadIdx.x; r < PF_ROWS; r += PF_THREADS)
        s_pos[r] = t0 + r < a.T ? a.tok_pos[t0 + r] : -1;
    __syncthreads();
    int max_pos = -1;
    for (int r = 0; r < PF_ROWS; r++)
        max_pos = max(max_pos, s_pos[r]);
    const int n_keys = min(max_pos + 1, a.k1) - a.k0;   /* this pass's, block-uniform; may be <= 0 */

    const size_t kst = (size_t)a.n_heads * DK, vst = (size_t)a.n_heads * DV;   /* elements per key */
    const uint16_t *kh = a.k + (size_t)h * DK, *vh = a.v + (size_t)h * DV;
    auto load_tile = [&](int kt, int buf) {
        uint16_t *kd = Ks + buf * PF_KEYS * KS, *vd = Vs + buf * PF_KEYS * VS;
        /* Keys past n_keys are zero-filled: P = 0 must never meet garbage (0 * NaN). */
        for (int c = threadIdx.x; c < PF_KEYS * KCH; c += PF_THREADS) {
            const int j = c / KCH, part = c % KCH, key = kt + j;
            const bool in = key < n_keys;
            dev_cp_async16(kd + j * KS + part * 8, kh + (in ? (size_t)key * kst : 0) + part * 8, in ? 16 : 0);
        }
        for (int c = threadIdx.x; c < PF_KEYS * VCH; c += PF_THREADS) {
            const int j = c / VCH, part = c % VCH, key = kt + j;
            const bool in = key < n_keys;
            dev_cp_async16(vd + j * VS + part * 8, vh + (in ? (size_t)key * vst : 0) + part * 8, in ? 16 : 0);
        }
        dev_cp_commit();
    };
    load_tile(0, 0);                               /* in flight while the queries are converted */

    for (int i = threadIdx.x; i < PF_ROWS * (DK / 4); i += PF_THREADS) {
        const int v = i / (DK / 4), d = (i % (DK / 4)) * 4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (s_pos[v] >= 0) {
            const size_t rh = (size_t)(t0 + v) * a.n_heads + h;
            x = d < dn ? *(const float4 *)(a.q + rh * DK + d) : *(const float4 *)(a.q_pe + rh * a.dr + (d - dn));
        }
        *(uint2 *)(Qs + v * KS + d) = make_uint2(dev_pack_bf16x2(x.x, x.y), dev_pack_bf16x2(x.z, x.w));
    }
    __syncthreads();

    /* This warp's rows: the lane holds rows gid (p0) and gid + 8 (p1) of the warp's 16. */
    const int wv = warp * 16;
    const int p0 = s_pos[wv + gid], p1 = s_pos[wv + gid + 8];
    int wmin, wmax;
    uint32_t qf[KD][4];
    float o[DB][4];
    dev_flash_begin<DK, DV, KS>(s_pos, Qs, wv, lane, wmin, wmax, qf, o);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;   /* l: this thread's share of the row sum */
    const float sl2 = a.scale_log2;
    if (!a.first) {                                /* an earlier pass's state: o, max, the whole sum in tig 0 */
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int v = wv + gid + 8 * half;
            if ((half ? p1 : p0) < 0)
                continue;
            const size_t rh = (size_t)(t0 + v) * a.n_heads + h;
            const float *op = a.out + rh * DV + 2 * tig;
#pragma unroll
            for (int j = 0; j < DB; j++) {
                const float2 x = *(const float2 *)(op + 8 * j);
                o[j][2 * half] = x.x;
                o[j][2 * half + 1] = x.y;
            }
            const float mm = a.ml[rh * 2], ll = tig == 0 ? a.ml[rh * 2 + 1] : 0.0f;
            if (half) {
                m1 = mm;
                l1 = ll;
            } else {
                m0 = mm;
                l0 = ll;
            }
        }
    }
    const int ka = a.k0;                           /* the absolute position of this pass's key 0 */
    /* The last key a row may see in this pass: its position, or the pass's end. A pass that ends
     * inside a tile (k1 - k0 not a multiple of 64) zero-fills the tile's keys from k1 on, and a
     * row past k1 would otherwise take them as keys of score 0 (weight exp(-m) each in its sum,
     * then counted again by the next pass): GPU run of f25aa02, 100 rows in passes of 96 keys,
     * 3.5e-2 against 5.9e-3 in one pass. */
    const int lim0 = min(p0, a.k1 - 1), lim1 = min(p1, a.k1 - 1), wlim = min(wmin, a.k1 - 1);

    auto stage = [&](int buf) { return flash_kv_t{Ks + buf * PF_KEYS * KS, Vs + buf * PF_KEYS * VS}; };   /* bf16 already */
    const flash_rows_t rows = {n_keys, ka, wmax, wlim, lim0, lim1, sl2};
    dev_flash_tiles<DK, DV, KS, VS, false>(rows, qf, o, m0, m1, l0, l1, lane, load_tile, stage);

#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int v = wv + gid + 8 * half;
        if ((half ? p1 : p0) < 0)
            continue;
        const size_t rh = (size_t)(t0 + v) * a.n_heads + h;
        const float inv = a.last ? 1.0f / (half ? l1 : l0) : 1.0f;   /* not last: the state, unnormalised */
        float *op = a.out + rh * DV + 2 * tig;
#pragma unroll
        for (int j = 0; j < DB; j++)
            *(float2 *)(op + 8 * j) = make_float2(o[j][2 * half] * inv, o[j][2 * half + 1] * inv);
        if (!a.last && tig == 0) {
            a.ml[rh * 2] = half ? m1 : m0;
            a.ml[rh * 2 + 1] = half ? l1 : l0;
        }
    }
}

template <typename KT> __device__ __forceinline__ float s_f32(const KT *p) { return float(*p); }
template <> __device__ __forceinline__ float s_f32(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
template <> __device__ __forceinline__ float s_f32(const __half *p) { return __half2float(*p); }

/* One context position p = k0 + blockIdx.x per block: its [latent | k_pe] entry (the layer's slot
 * of the sequence's block, backend.h's MLA addressing) as bf16 into lat[p - k0] and, k_pe, into
 * every head's last dr columns of K[p - k0] (k_pe is shared by the heads). The sequence is the
 * call's rows' (all one). */
template <typename KT>
__global__ void k_pf_gather(const uint8_t *base, size_t block_bytes, int block_size, int layer, const int32_t *tok_seq,
                            const int32_t *seq_bt_start, const int32_t *block_table, int kv_lora, int dr, int n_heads,
                            int DK, int k0, __nv_bfloat16 *lat, __nv_bfloat16 *k)
{
    DEV_PDL_ENTER();
    const int i0 = blockIdx.x, p = k0 + i0, W = kv_lora + dr, seq = tok_seq[0];
    const int32_t blk = block_table[seq_bt_start[seq] + p / block_size];
    const KT *e = (const KT *)(base + (size_t)blk * block_bytes) + ((size_t)layer * block_size + p % block_size) * W;
    for (int i = threadIdx.x; i < kv_lora; i += blockDim.x)
        dev_store(lat + (size_t)i0 * kv_lora + i, s_f32(e + i));
    for (int i = threadIdx.x; i < n_heads * dr; i += blockDim.x) {
        const int hh = i / dr, j = i % dr;
        dev_store(k + ((size_t)i0 * n_heads + hh) * DK + (DK - dr) + j, s_f32(e + kv_lora + j));
    }
}

/* The call's scratch: lat, K and V of a pass's positions and the rows' softmax state in one buffer, grown (never shrunk) outside
 * graphs: this op never runs while one is recorded, so no graph holds the address and a
 * reallocation leaves them valid (no scratch_gen bump, unlike cuda_scratch). NULL when the device
 * has no memory for it (the caller falls back to the absorbed form). */
static void *s_pf_scratch(cuda_state_t *st, size_t bytes)
{
    if (bytes <= st->mla_pf_bytes)
        return st->mla_pf;
    CUDA_CHECK(cudaStreamSynchronize(st->stream));   /* a queued op may still read the old buffer */
    if (st->mla_pf)
        CUDA_CHECK(cudaFree(st->mla_pf));
    st->mla_pf = NULL;
    st->mla_pf_bytes = 0;
    const size_t want = bytes + bytes / 4;
    if (cudaMalloc(&st->mla_pf, want) != cudaSuccess) {
        (void)cudaGetLastError();                  /* clear the sticky-free allocation error */
        st->mla_pf = NULL;
        return NULL;
    }
    st->mla_pf_bytes = want;
    return st->mla_pf;
}

template <int DK, int DV>
static void s_attend(const cuda_state_t *st, const pf_args_t &a)
{
    const dim3 grid((unsigned)a.n_heads, (unsigned)((a.T + PF_ROWS - 1) / PF_ROWS));
    cuda_launch_large_smem<k_mla_prefill<DK, DV>>(st, grid, PF_THREADS, pf_smem<DK, DV>::BYTES, a);
}

/* The (dn + dr, dv) head shapes compiled: DeepSeek-V2/V3 (192, 128), kjv-deepseek (48, 32), the
 * deepseek-v3-noqlora-bf16 fixture (32, 32). */
static bool s_shape_ok(int DK, int DV)
{
    return (DK == 192 && DV == 128) || (DK == 48 && DV == 32) || (DK == 32 && DV == 32);
}

int cuda_mla_prefill(backend_t *be, const bk_kv_t *kv, int layer, const float *q, const float *q_pe, int n_heads,
                     int kv_lora, int dn, int dr, int dv, const bk_mat_t *w_uk_t, const bk_mat_t *w_uv, float scale,
                     const bk_attn_meta_t *meta, int n_ctx, float *out)
{
    cuda_state_t *st = cuda_st(be);
    const int T = meta->n_tokens, DK = dn + dr, DV = dv;
    if (st->mla_prefill == CUDA_MLA_PF_ABSORBED || (st->mla_prefill == CUDA_MLA_PF_AUTO && T < MLA_PF_AUTO_ROWS) ||
        st->capturing || T <= 0 || n_ctx <= 0 || !s_shape_ok(DK, DV) || dr % 4 || !(scale > 0.0f))
        return -1;
    if (w_uk_t->dtype != DT_BF16 || w_uk_t->qfmt || w_uv->dtype != DT_BF16 || w_uv->qfmt ||
        w_uk_t->rows != (int64_t)n_heads * kv_lora || w_uk_t->cols != dn || w_uv->rows != (int64_t)n_heads * dv ||
        w_uv->cols != kv_lora)
        return -1;
    if ((kv->dtype == DT_F8E4M3 && kv->scale) || 2 * kv->head_dim != kv_lora + dr || kv->n_kv_heads != 1)
        return -1;
    if (((uintptr_t)q & 15) || ((uintptr_t)q_pe & 15) || ((uintptr_t)out & 7) || (T + PF_ROWS - 1) / PF_ROWS > 65535)
        return -1;
    /* Positions go in passes of at most KP keys (the scratch bound, or TROUPE_CUDA_MLA_PREFILL_KEYS):
     * each pass makes its keys' K and V and runs the attention over them, carrying every row's
     * softmax state (out unnormalised, ml) to the next; one pass when the context fits. Scratch:
     * lat, K, V of KP keys, then ml, each 256-byte aligned (cuBLAS, the 16-byte cp.async chunks). */
    const size_t per_key = ((size_t)kv_lora + (size_t)n_heads * (DK + DV)) * 2;
    const size_t ml_b = ((size_t)T * n_heads * 2 * sizeof(float) + 255) & ~(size_t)255;
    if (ml_b + 64 * per_key + 3 * 256 > MLA_PF_MAX_SCRATCH)
        return -1;
    size_t KP = st->mla_pf_keys > 0 ? (size_t)st->mla_pf_keys : (MLA_PF_MAX_SCRATCH - ml_b - 3 * 256) / per_key / 64 * 64;
    if (KP > (size_t)n_ctx)
        KP = (size_t)n_ctx;
    const size_t lat_b = (KP * kv_lora * 2 + 255) & ~(size_t)255;
    const size_t k_b = (KP * n_heads * DK * 2 + 255) & ~(size_t)255;
    const size_t v_b = (KP * n_heads * DV * 2 + 255) & ~(size_t)255;
    uint8_t *scr = (uint8_t *)s_pf_scratch(st, lat_b + k_b + v_b + ml_b);
    if (!scr)
        return -1;
    __nv_bfloat16 *lat = (__nv_bfloat16 *)scr, *kb = (__nv_bfloat16 *)(scr + lat_b), *vb = (__nv_bfloat16 *)(scr + lat_b + k_b);
    float *ml = (float *)(scr + lat_b + k_b + v_b);

    pf_args_t a = {};
    a.q = q;
    a.q_pe = q_pe;
    a.k = (const uint16_t *)kb;
    a.v = (const uint16_t *)vb;
    a.tok_pos = meta->tok_pos;
    a.out = out;
    a.ml = ml;
    a.T = T;
    a.n_heads = n_heads;
    a.dr = dr;
    a.scale_log2 = scale * 1.4426950408889634f;
    const uint8_t *base = (const uint8_t *)kv->base;
    const float alpha = 1.0f, beta = 0.0f;
    /* The backend's handle is pedantic (no TF32 for its f32 GEMMs); these are bf16 GEMMs that
     * should take the tensor cores: default math, with any split-K reduction in f32 (not in the
     * bf16 output type), restored after the passes. */
    CUBLAS_CHECK(cublasSetMathMode(st->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                            CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    for (int k0 = 0; k0 < n_ctx; k0 += (int)KP) {
        const int nk = n_ctx - k0 < (int)KP ? n_ctx - k0 : (int)KP;
#define PF_GATHER(KT)                                                                                      \
    cuda_launch(st, k_pf_gather<KT>, (unsigned)nk, 128, base, kv->block_bytes, kv->block_size, layer,         \
                meta->tok_seq, meta->seq_bt_start, meta->block_table, kv_lora, dr, n_heads, DK, k0, lat, kb)
        switch (kv->dtype) {
        case DT_F32: PF_GATHER(float); break;
        case DT_BF16: PF_GATHER(__nv_bfloat16); break;
        case DT_F8E4M3: PF_GATHER(__nv_fp8_e4m3); break;
        default: PF_GATHER(__half); break;
        }
#undef PF_GATHER
        /* Column-major views (cuBLAS): per head h, K_h (dn x nk, ld n_heads * DK, at column offset
         * h * DK) = A_h (dn x kv_lora: w_uk_t's [kv_lora][dn] block h, ld dn) . lat (kv_lora x nk,
         * ld kv_lora; the same for every head: stride 0); V (n_heads * dv x nk) = w_uv^T ([n_heads *
         * dv][kv_lora] row-major: op T) . lat. (Checked against the direct formula on the CPU with
         * these exact parameters and mla_load.c's layouts.) */
        const cublasStatus_t bs = cublasGemmStridedBatchedEx(
            st->blas, CUBLAS_OP_N, CUBLAS_OP_N, dn, nk, kv_lora, &alpha, w_uk_t->data, CUDA_R_16BF, dn,
            (long long)kv_lora * dn, lat, CUDA_R_16BF, kv_lora, 0, &beta, kb, CUDA_R_16BF, n_heads * DK, DK, n_heads,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS)           /* should a library refuse B's stride 0: one GEMM a head */
            for (int h = 0; h < n_heads; h++)
                CUBLAS_CHECK(cublasGemmEx(st->blas, CUBLAS_OP_N, CUBLAS_OP_N, dn, nk, kv_lora, &alpha,
                                          (const __nv_bfloat16 *)w_uk_t->data + (size_t)h * kv_lora * dn, CUDA_R_16BF,
                                          dn, lat, CUDA_R_16BF, kv_lora, &beta, kb + (size_t)h * DK, CUDA_R_16BF,
                                          n_heads * DK, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CUBLAS_CHECK(cublasGemmEx(st->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_heads * dv, nk, kv_lora, &alpha, w_uv->data,
                                  CUDA_R_16BF, kv_lora, lat, CUDA_R_16BF, kv_lora, &beta, vb, CUDA_R_16BF, n_heads * dv,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        a.k0 = k0;
        a.k1 = k0 + nk;
        a.first = k0 == 0;
        a.last = k0 + nk >= n_ctx;
        if (DK == 192)
            s_attend<192, 128>(st, a);
        else if (DK == 48)
            s_attend<48, 32>(st, a);
        else
            s_attend<32, 32>(st, a);
    }
    CUBLAS_CHECK(cublasSetMathMode(st->blas, CUBLAS_PEDANTIC_MATH));
    return 0;
}
