/* kernels/cuda/cuda_mla.cu — DeepSeek-V3's ops on the GPU: MLA's RoPE, compressed-cache store and
 * absorbed attention (prefill and decode alike), the per-head matmul, add, the sigmoid
 * group-limited MoE router and the MTP layer's draft with its probability (mtp_top). Semantics: kernels/backend.h (the DeepSeek-V3 block); the CPU
 * reference is kernels/cpu/cpu_mla.c.
 *
 * Where the arithmetic differs from the CPU: dot products are summed by warps (lane partial sums,
 * then a butterfly), not in index order; the latent's RMSNorm sums its squares per thread in
 * double, then across the block. Results agree to f32 rounding, not bit for bit
 * (tests/gpu/test_mla_cuda.c compares them).
 *
 * Attention is the absorbed form FlashMLA runs, on the CUDA cores in f32 (not FlashMLA's
 * tensor-core kernel): k_mla_split (layout at its definition) for DeepSeek's shapes (kv_lora <= 512,
 * kv_lora + rope <= 576), decode and prefill rows alike: a block takes one row, up to 16 heads and
 * a range of its keys, each cached entry read once for all those heads; key ranges (split-KV,
 * flash-decoding) fill the GPU when rows are few, k_mla_combine merges them. Other shapes take
 * k_mla_attention, one block per (row, head). The split kernel's softmax runs per 32-key tile and
 * per range (the CPU's per cache block): the same up to rounding. TROUPE_CUDA_MLA_MMA=1 sends the
 * split kernel's calls to cuda_mla_decode_mma.cu (tensor cores, q and p rounded to 16 bits) where
 * it takes the shape; off by default until it is measured on a GPU.
 *
 * The router selects with one warp per row (lane scans and warp argmaxes), the CPU's ids and
 * weights exactly. */
#include <float.h>
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_mma.cuh"

__device__ __forceinline__ float s_ld(const float *p) { return *p; }
__device__ __forceinline__ float s_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float s_ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ float s_ld(const __nv_fp8_e4m3 *p) { return float(*p); }

/* cos/sin of position p for i < half into shared c, s (times mul), as the CPU's s_angles. */
__device__ __forceinline__ void s_angles(float p, const float *inv_freq, int half, float mul, float *c, float *s)
{
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float sn, cs;
        sincosf(__fmul_rn(p, inv_freq[i]), &sn, &cs);
        c[i] = __fmul_rn(cs, mul);
        s[i] = __fmul_rn(sn, mul);
    }
}

/* out[i], out[i + half] for pair i of x (interleaved or rotate_half input). */
__device__ __forceinline__ void s_rope_pair(const float *x, int d, int i, int interleave, const float *c,
                                            const float *s, float *lo_out, float *hi_out)
{
    const int half = d / 2;
    const float lo = interleave ? x[2 * i] : x[i], hi = interleave ? x[2 * i + 1] : x[i + half];
    *lo_out = __fsub_rn(__fmul_rn(lo, c[i]), __fmul_rn(hi, s[i]));
    *hi_out = __fadd_rn(__fmul_rn(hi, c[i]), __fmul_rn(lo, s[i]));
}

__global__ void k_mla_rope_q(const float *q, int n_heads, int head_stride, int rope_off, int d, const int32_t *pos,
                             const float *inv_freq, float mul, int interleave, float *out)
{
    DEV_PDL_ENTER();
    __shared__ float c[BK_MAX_HEAD_DIM / 2], s[BK_MAX_HEAD_DIM / 2];
    const int t = blockIdx.x, half = d / 2;
    s_angles((float)pos[t], inv_freq, half, mul, c, s);
    __syncthreads();
    for (int j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
        const int h = j / half, i = j % half;
        const float *x = q + ((int64_t)t * n_heads + h) * head_stride + rope_off;
        float *o = out + ((int64_t)t * n_heads + h) * d;
        s_rope_pair(x, d, i, interleave, c, s, &o[i], &o[i + half]);
    }
}

void cuda_mla_rope_q(backend_t *be, const float *q, int M, int n_heads, int head_stride, int rope_off, int rope_dim,
                     const int32_t *pos, const float *inv_freq, float mul, int interleave, float *out)
{
    if (M > 0)
        cuda_launch(cuda_st(be), k_mla_rope_q, M, 128, q, n_heads, head_stride, rope_off, rope_dim, pos, inv_freq,
                    mul, interleave, out);
}

/* Where MLA's vector of (block, layer, slot) starts, in elements of the pool (backend.h). */
struct mla_addr_t {
    uint8_t *base;
    size_t block_bytes;
    int block_size, layer, W;
    const int32_t *tok_seq, *tok_pos, *seq_bt_start, *block_table;
};

template <typename KT>
__device__ __forceinline__ KT *s_slot(const mla_addr_t &a, int32_t blk, int slot)
{
    return (KT *)(a.base + (size_t)blk * a.block_bytes) + ((size_t)a.layer * a.block_size + slot) * a.W;
}

static mla_addr_t s_addr(const bk_kv_t *kv, int layer, const bk_attn_meta_t *meta)
{
    return mla_addr_t{(uint8_t *)kv->base, kv->block_bytes, kv->block_size, layer, 2 * kv->head_dim,
                      meta->tok_seq, meta->tok_pos, meta->seq_bt_start, meta->block_table};
}

/* One row per block: RMSNorm of the latent (squares summed in double), RoPE of the key, stored. */
template <typename KT>
__global__ void k_mla_kv_store(mla_addr_t a, const float *ckv, const float *norm_w, float eps, int kv_lora, int d,
                               const float *inv_freq, float mul, int interleave)
{
    DEV_PDL_ENTER();
    __shared__ float c[BK_MAX_HEAD_DIM / 2], s[BK_MAX_HEAD_DIM / 2];
    __shared__ double part[32];
    const int t = blockIdx.x, seq = a.tok_seq[t], p = a.tok_pos[t];
    const float *x = ckv + (int64_t)t * a.W;
    double ss = 0;
    for (int i = threadIdx.x; i < kv_lora; i += blockDim.x)
        ss += (double)x[i] * x[i];
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = ss;
    s_angles((float)p, inv_freq, d / 2, mul, c, s);
    __syncthreads();
    double tot = 0;
    for (int w = 0; w < (int)(blockDim.x / 32); w++)
        tot += part[w];
    const float scale = 1.0f / sqrtf((float)(tot / kv_lora) + eps);
    const int32_t blk = a.block_table[a.seq_bt_start[seq] + p / a.block_size];
    KT *dst = s_slot<KT>(a, blk, p % a.block_size);
    for (int i = threadIdx.x; i < kv_lora; i += blockDim.x)
        dev_store(dst + i, __fmul_rn(norm_w[i], __fmul_rn(x[i], scale)));
    for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
        float lo, hi;
        s_rope_pair(x + kv_lora, d, i, interleave, c, s, &lo, &hi);
        dev_store(dst + kv_lora + i, lo);
        dev_store(dst + kv_lora + i + d / 2, hi);
    }
}

void cuda_mla_kv_store(backend_t *be, const bk_kv_t *kv, int layer, const float *ckv, const float *norm_w, float eps,
                       int kv_lora, int rope_dim, const float *inv_freq, float mul, int interleave,
                       const bk_attn_meta_t *meta)
{
    if (meta->n_tokens <= 0)
        return;
    const mla_addr_t a = s_addr(kv, layer, meta);
    const cuda_state_t *st = cuda_st(be);
    const int T = meta->n_tokens, th = 256;
    switch (kv->dtype) {
    case DT_F32: cuda_launch(st, k_mla_kv_store<float>, T, th, a, ckv, norm_w, eps, kv_lora, rope_dim, inv_freq, mul, interleave); break;
    case DT_BF16: cuda_launch(st, k_mla_kv_store<__nv_bfloat16>, T, th, a, ckv, norm_w, eps, kv_lora, rope_dim, inv_freq, mul, interleave); break;
    case DT_F8E4M3: cuda_launch(st, k_mla_kv_store<__nv_fp8_e4m3>, T, th, a, ckv, norm_w, eps, kv_lora, rope_dim, inv_freq, mul, interleave); break;
    default: cuda_launch(st, k_mla_kv_store<__half>, T, th, a, ckv, norm_w, eps, kv_lora, rope_dim, inv_freq, mul, interleave); break;
    }
}

#define MLA_TILE 32           /* keys scored per pass */
#define MLA_THREADS 256       /* 8 warps */
#define MLA_MAX_W 1024        /* kv_lora + rope held in shared memory */

/* The fallback for shapes k_mla_split does not take. One (row, head) per block: q in shared
 * memory, the keys of a tile scored by the warps, the online softmax over tiles, each thread
 * accumulating latent dims threadIdx.x, +blockDim.x, ... */
template <typename KT>
__global__ void __launch_bounds__(MLA_THREADS) k_mla_attention(mla_addr_t a, const float *q_lat, const float *q_pe,
                                                              int n_heads, int kv_lora, int d, float scale, float *out)
{
    DEV_PDL_ENTER();
    __shared__ float qs[MLA_MAX_W], sc[MLA_TILE];
    __shared__ const KT *ent[MLA_TILE];
    const int t = blockIdx.x / n_heads, h = blockIdx.x % n_heads, W = kv_lora + d;
    const int seq = a.tok_seq[t], n_keys = a.tok_pos[t] + 1;
    for (int i = threadIdx.x; i < W; i += blockDim.x)
        qs[i] = i < kv_lora ? q_lat[((int64_t)t * n_heads + h) * kv_lora + i]
                            : q_pe[((int64_t)t * n_heads + h) * d + (i - kv_lora)];
    __syncthreads();
    constexpr int PER = MLA_MAX_W / MLA_THREADS;   /* latent dims per thread */
    float acc[PER];
#pragma unroll
    for (int j = 0; j < PER; j++)
        acc[j] = 0;
    float mx = -INFINITY, l = 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, n_warps = blockDim.x / 32;
    for (int k0 = 0; k0 < n_keys; k0 += MLA_TILE) {
        const int nk = min(MLA_TILE, n_keys - k0);
        for (int j = warp; j < nk; j += n_warps) {
            const int pos = k0 + j;
            const int32_t blk = a.block_table[a.seq_bt_start[seq] + pos / a.block_size];
            const KT *e = s_slot<KT>(a, blk, pos % a.block_size);
            float sl = 0, sp = 0;
            for (int i = lane; i < kv_lora; i += 32)
                sl += qs[i] * s_ld(e + i);
            for (int i = lane; i < d; i += 32)
                sp += qs[kv_lora + i] * s_ld(e + kv_lora + i);
            sl = dev_warp_sum(sl);
            sp = dev_warp_sum(sp);
            if (lane == 0) {
                sc[j] = (sl + sp) * scale;
                ent[j] = e;
            }
        }
        __syncthreads();
        float bmax = -INFINITY;
        for (int j = 0; j < nk; j++)
            bmax = fmaxf(bmax, sc[j]);
        const float m_new = fmaxf(mx, bmax);
        const float corr = mx == -INFINITY ? 0.0f : expf(mx - m_new);
        __syncthreads();                               /* every thread has read the scores */
        if (threadIdx.x < nk)
            sc[threadIdx.x] = expf(sc[threadIdx.x] - m_new);
        __syncthreads();
        float bsum = 0;
        for (int j = 0; j < nk; j++)
            bsum += sc[j];
        l = l * corr + bsum;
#pragma unroll
        for (int jj = 0; jj < PER; jj++) {
            const int i = threadIdx.x + jj * blockDim.x;
            if (i < kv_lora) {
                float v = acc[jj] * corr;
                for (int j = 0; j < nk; j++)
                    v += sc[j] * s_ld(ent[j] + i);
                acc[jj] = v;
            }
        }
        mx = m_new;
        __syncthreads();
    }
    float *o = out + ((int64_t)t * n_heads + h) * kv_lora;
    const float inv = 1.0f / l;
#pragma unroll
    for (int jj = 0; jj < PER; jj++) {
        const int i = threadIdx.x + jj * blockDim.x;
        if (i < kv_lora)
            o[i] = acc[jj] * inv;
    }
}

/* ---- split-KV attention (decode and prefill rows alike) -------------------------------------------
 *
 * Layout. Grid (rows x head groups, S key ranges); block (t * n_hg + g, s) takes row t, the heads
 * g * 16 .. g * 16 + 15 (8 warps of HPW = 2 heads; fewer than 16 heads: 8 heads of one warp each) and
 * the s-th range of span keys of the row's 0..tok_pos[t] (span = ceil(n_keys / S) rounded up to
 * 16, at least 16, so trailing ranges of a short row are empty). MLA is multi-query over the
 * compressed cache: every head of a row reads the same (latent | rope key) entries, so the block
 * stages each 32-key tile once in shared memory (cp.async, 16-byte chunks, double-buffered: the
 * next tile loads while this one is used) and all its heads read it there: an entry comes from
 * L2/HBM once per block, not once per head as in k_mla_attention.
 *   Shared: 2 x [32 keys][kv_lora + d] in the cache's own type (bf16 576-wide: 72 KiB).
 *   Registers, lane l of a warp, for each of its HPW heads: q's 4-byte words l, l + 32, ... of the
 *   (q_lat | q_pe) vector (P = 4 / sizeof(KT) elements a word: 18 floats for 576 f32 or bf16), and
 *   the latent accumulator in the same word layout (16 floats for kv_lora 512). A warp reads an
 *   entry as 32 consecutive words (128 bytes: no bank conflicts).
 *   Scores: a lane's partial dot products for 8 keys are reduced across the warp by s_sum8 (lane
 *   l ends with key (l >> 2) & 7's score), the softmax per head is the warp's own (f32, online
 *   over tiles, the CPU's arithmetic per tile), p reaches every lane by a shuffle.
 *   Output: S == 1 writes out (acc / l); else part [rows][n_heads][S][kv_lora + 2] = (max, sum,
 *   unnormalised acc) per range, an empty range only (-inf, 0), and k_mla_combine merges the
 *   ranges of each (row, head) in range order (deterministic for a given S).
 * S depends on the call's rows (host-known), never on positions (device-only), so a step's scratch
 * size and launch are fixed for its shape: graphs record and replay them (cuda_scratch grows only
 * outside capture; the model records shapes that ran before). */
#define MLA_TK 32             /* keys per tile (one cp.async stage) */
#define MLA_WARPS 8
#define MLA_FAST_LORA 512     /* the split kernel's register arrays: DeepSeek-V2/V3's kv_lora ... */
#define MLA_FAST_W 576        /* ... plus qk_rope_head_dim 64 */
#define MLA_MAX_SPLIT 64
#define MLA_MIN_SPAN 16       /* keys: a range's partials (16 heads x 2 KiB) should not dwarf what it reads */

struct mla_split_args_t {
    mla_addr_t a;
    const float *q_lat, *q_pe;    /* [T][n_heads][kv_lora], [T][n_heads][d] */
    int n_heads, kv_lora, d;
    int n_hg, S;                  /* head groups per row, key ranges per row */
    float scale;
    float *out;                   /* [T][n_heads][kv_lora] (S == 1) */
    float *part;                  /* [T][n_heads][S][kv_lora + 2] (S > 1) */
};

/* The P = 4 / sizeof(KT) elements of one 4-byte word of KT as floats (exact conversions). */
template <typename KT> __device__ __forceinline__ void s_unpack4(uint32_t w, float *f)
{
    if constexpr (sizeof(KT) == 4) {
        f[0] = __uint_as_float(w);
    } else if constexpr (std::is_same<KT, __nv_bfloat16>::value) {
        f[0] = __uint_as_float(w << 16);               /* the lower element is the low half */
        f[1] = __uint_as_float(w & 0xffff0000u);
    } else if constexpr (std::is_same<KT, __half>::value) {
        __half2 h;
        memcpy(&h, &w, 4);
        const float2 v = __half22float2(h);
        f[0] = v.x;
        f[1] = v.y;
    } else {                                           /* fp8 e4m3: exact in f16 */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> (16 * i)), __NV_E4M3);
            const float2 v = __half22float2(__half2(r));
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
}

/* Eight per-lane partial sums v[k] (keys 0..7) reduced over the warp in 9 shuffles (a butterfly
 * per key would take 40): each xor step halves the keys a lane keeps, so lane l returns key
 * (l >> 2) & 7's total (the four lanes l & ~3 .. l | 3 hold the same value). */
__device__ __forceinline__ float s_sum8(const float v[8], int lane)
{
    float u[4], w[2];
    const bool b4 = (lane >> 4) & 1, b3 = (lane >> 3) & 1, b2 = (lane >> 2) & 1;
#pragma unroll
    for (int i = 0; i < 4; i++)
        u[i] = (b4 ? v[i + 4] : v[i]) + __shfl_xor_sync(0xffffffffu, b4 ? v[i] : v[i + 4], 16);
#pragma unroll
    for (int i = 0; i < 2; i++)
        w[i] = (b3 ? u[i + 2] : u[i]) + __shfl_xor_sync(0xffffffffu, b3 ? u[i] : u[i + 2], 8);
    float x = (b2 ? w[1] : w[0]) + __shfl_xor_sync(0xffffffffu, b2 ? w[0] : w[1], 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x;
}

template <typename KT, int HPW>
__global__ void __launch_bounds__(MLA_WARPS * 32, HPW == 1 ? 2 : 1) k_mla_split(mla_split_args_t x)
{
    DEV_PDL_ENTER();
    constexpr int P = 4 / (int)sizeof(KT);                           /* elements per word */
    constexpr int NI = (MLA_FAST_W + 32 * P - 1) / (32 * P);         /* words per lane: the entry */
    constexpr int NIL = (MLA_FAST_LORA + 32 * P - 1) / (32 * P);     /* ... its latent */
    constexpr int NG = MLA_TK / 8;                                   /* 8-key groups per tile */
    extern __shared__ __align__(16) uint8_t mla_smem[];
    const mla_addr_t &a = x.a;
    const int t = blockIdx.x / x.n_hg, hg = blockIdx.x % x.n_hg, sidx = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int W = x.kv_lora + x.d, EB = W * (int)sizeof(KT), CPK = EB / 16;   /* EB % 16 == 0 (host) */
    const int seq = a.tok_seq[t], n_keys = a.tok_pos[t] + 1;
    const int span = max(MLA_MIN_SPAN, ((n_keys + x.S - 1) / x.S + 15) / 16 * 16);
    const int k0 = sidx * span, k1 = min(n_keys, k0 + span);
    const int h0 = (hg * MLA_WARPS + warp) * HPW;

    if (k0 >= k1) {                                /* block-uniform: an empty range weighs nothing */
        for (int hh = 0; hh < HPW; hh++)
            if (lane == 0 && h0 + hh < x.n_heads) {
                float *pp = x.part + (((size_t)t * x.n_heads + h0 + hh) * x.S + sidx) * (size_t)(x.kv_lora + 2);
                pp[0] = -INFINITY;
                pp[1] = 0.0f;
            }
        return;
    }
    const int32_t *bt = a.block_table + a.seq_bt_start[seq];
    /* Keys kt .. kt + nk - 1 into buffer buf; slots past nk keep stale data, which is never used. */
    auto issue = [&](int kt, int buf) {
        const int nk = min(MLA_TK, k1 - kt);
        uint8_t *dst = mla_smem + (size_t)buf * MLA_TK * EB;
        for (int c = threadIdx.x; c < nk * CPK; c += blockDim.x) {
            const int j = c / CPK, part = c - j * CPK, pos = kt + j;
            const KT *e = s_slot<KT>(a, bt[pos / a.block_size], pos % a.block_size);
            dev_cp_async16(dst + (size_t)j * EB + part * 16, (const uint8_t *)e + part * 16, 16);
        }
    };
    issue(k0, 0);
    dev_cp_commit();

    float q[HPW][NI][P], acc[HPW][NIL][P], mx[HPW], l[HPW];
#pragma unroll
    for (int hh = 0; hh < HPW; hh++) {
        const int h = h0 + hh;
        const size_t th = (size_t)t * x.n_heads + h;
#pragma unroll
        for (int i = 0; i < NI; i++)
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int e = (lane + 32 * i) * P + p;
                float v = 0.0f;
                if (h < x.n_heads && e < W)
                    v = e < x.kv_lora ? x.q_lat[th * x.kv_lora + e] : x.q_pe[th * x.d + (e - x.kv_lora)];
                q[hh][i][p] = v;
            }
#pragma unroll
        for (int i = 0; i < NIL; i++)
#pragma unroll
            for (int p = 0; p < P; p++)
                acc[hh][i][p] = 0.0f;
        mx[hh] = -INFINITY;
        l[hh] = 0.0f;
    }

    const int n_tiles = (k1 - k0 + MLA_TK - 1) / MLA_TK, jl = (lane >> 2) & 7;
    for (int it = 0; it < n_tiles; it++) {
        const int kt = k0 + it * MLA_TK, nk = min(MLA_TK, k1 - kt);
        if (it + 1 < n_tiles)
            issue(kt + MLA_TK, (it + 1) & 1);      /* that buffer was released by the last sync below */
        dev_cp_commit();
        dev_cp_wait<1>();                          /* this tile's group has landed (this thread's) */
        __syncthreads();                           /* ... and every thread's */
        const uint8_t *kb = mla_smem + (size_t)(it & 1) * MLA_TK * EB;

        /* Scores: lane jl's of each 8-key group g, for each head. */
        float sc[HPW][NG];
#pragma unroll
        for (int g = 0; g < NG; g++) {
            float pt[HPW][8];
#pragma unroll
            for (int hh = 0; hh < HPW; hh++)
#pragma unroll
                for (int kk = 0; kk < 8; kk++)
                    pt[hh][kk] = 0.0f;
            if (8 * g < nk) {                      /* warp-uniform */
#pragma unroll
                for (int kk = 0; kk < 8; kk++) {
                    const uint32_t *row = (const uint32_t *)(kb + (size_t)(8 * g + kk) * EB);
#pragma unroll
                    for (int i = 0; i < NI; i++) {
                        const int wi = lane + 32 * i;
                        if (wi * P < W) {
                            float f[P];
                            s_unpack4<KT>(row[wi], f);
#pragma unroll
                            for (int hh = 0; hh < HPW; hh++)
#pragma unroll
                                for (int p = 0; p < P; p++)
                                    pt[hh][kk] = fmaf(q[hh][i][p], f[p], pt[hh][kk]);
                        }
                    }
                }
            }
#pragma unroll
            for (int hh = 0; hh < HPW; hh++)
                sc[hh][g] = s_sum8(pt[hh], lane);
        }

        /* Online softmax per head (keys past nk: -inf by selection, so stale data never enters). */
        float pr[HPW][NG];
#pragma unroll
        for (int hh = 0; hh < HPW; hh++) {
            float bmax = -INFINITY;
#pragma unroll
            for (int g = 0; g < NG; g++) {
                sc[hh][g] = jl + 8 * g < nk ? sc[hh][g] * x.scale : -INFINITY;
                bmax = fmaxf(bmax, sc[hh][g]);
            }
            bmax = dev_warp_max(bmax);
            const float m_new = fmaxf(mx[hh], bmax);
            const float corr = mx[hh] == -INFINITY ? 0.0f : expf(mx[hh] - m_new);
            float bsum = 0.0f;
#pragma unroll
            for (int g = 0; g < NG; g++) {
                pr[hh][g] = expf(sc[hh][g] - m_new);
                bsum += pr[hh][g];
            }
            bsum = dev_warp_sum((lane & 3) == 0 ? bsum : 0.0f);   /* each key is held by 4 lanes */
            l[hh] = l[hh] * corr + bsum;
            mx[hh] = m_new;
#pragma unroll
            for (int i = 0; i < NIL; i++)
#pragma unroll
                for (int p = 0; p < P; p++)
                    acc[hh][i][p] *= corr;
        }

        /* acc += p_j latent_j in key order. */
#pragma unroll
        for (int g = 0; g < NG; g++) {
            if (8 * g >= nk)
                break;
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                const int j = 8 * g + kk;
                if (j >= nk)
                    break;                         /* warp-uniform: the shuffles below see every lane */
                float pj[HPW];
#pragma unroll
                for (int hh = 0; hh < HPW; hh++)
                    pj[hh] = __shfl_sync(0xffffffffu, pr[hh][g], 4 * kk);
                const uint32_t *row = (const uint32_t *)(kb + (size_t)j * EB);
#pragma unroll
                for (int i = 0; i < NIL; i++) {
                    const int wi = lane + 32 * i;
                    if (wi * P < x.kv_lora) {
                        float f[P];
                        s_unpack4<KT>(row[wi], f);
#pragma unroll
                        for (int hh = 0; hh < HPW; hh++)
#pragma unroll
                            for (int p = 0; p < P; p++)
                                acc[hh][i][p] = fmaf(pj[hh], f[p], acc[hh][i][p]);
                    }
                }
            }
        }
        __syncthreads();                           /* the tile is read: the next issue may overwrite it */
    }

#pragma unroll
    for (int hh = 0; hh < HPW; hh++) {
        const int h = h0 + hh;
        if (h >= x.n_heads)
            continue;
        const size_t th = (size_t)t * x.n_heads + h;
        float *dst;
        float mul = 1.0f;
        if (x.S == 1) {
            dst = x.out + th * x.kv_lora;
            mul = 1.0f / l[hh];
        } else {
            float *pp = x.part + (th * x.S + sidx) * (size_t)(x.kv_lora + 2);
            if (lane == 0) {
                pp[0] = mx[hh];
                pp[1] = l[hh];
            }
            dst = pp + 2;
        }
#pragma unroll
        for (int i = 0; i < NIL; i++)
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int e = (lane + 32 * i) * P + p;
                if (e < x.kv_lora)
                    dst[e] = acc[hh][i][p] * mul;
            }
    }
}

/* One (row, head) per block: its S ranges merged in range order. Ranges that weigh nothing (empty,
 * or far below the maximum) are skipped, so an empty range's unwritten accumulator is never read. */
__global__ void k_mla_combine(const float *part, int S, int kv_lora, float *out)
{
    DEV_PDL_ENTER();
    __shared__ float ws[MLA_MAX_SPLIT];
    __shared__ float s_inv;
    const size_t r = blockIdx.x, stride = (size_t)kv_lora + 2;
    const float *p = part + r * S * stride;
    if (threadIdx.x < 32) {
        const int s0 = threadIdx.x, s1 = threadIdx.x + 32;
        const float m0 = s0 < S ? p[s0 * stride] : -INFINITY, m1 = s1 < S ? p[s1 * stride] : -INFINITY;
        const float mt = dev_warp_max(fmaxf(m0, m1));
        if (s0 < S)
            ws[s0] = m0 == -INFINITY ? 0.0f : expf(m0 - mt);
        if (s1 < S)
            ws[s1] = m1 == -INFINITY ? 0.0f : expf(m1 - mt);
        __syncwarp();
        if (threadIdx.x == 0) {
            float lt = 0.0f;
            for (int s = 0; s < S; s++)
                if (ws[s] != 0.0f)
                    lt += p[s * stride + 1] * ws[s];
            s_inv = 1.0f / lt;
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < kv_lora; d += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < S; s++)
            if (ws[s] != 0.0f)
                v += p[s * stride + 2 + d] * ws[s];
        out[r * kv_lora + d] = v * s_inv;
    }
}

/* Whether the split kernel takes the shape: its register arrays (kv_lora <= 512, entry <= 576),
 * 16-byte chunks of whole entries (every entry 16-byte aligned), no word across latent | rope. */
static bool s_split_ok(const bk_kv_t *kv, int kv_lora, int rope_dim)
{
    const size_t W = (size_t)kv_lora + rope_dim;
    return kv_lora <= MLA_FAST_LORA && W <= MLA_FAST_W && kv_lora % 4 == 0 && (W * dtype_size(kv->dtype)) % 16 == 0 &&
           kv->block_bytes % 16 == 0 && (uintptr_t)kv->base % 16 == 0;
}

template <typename KT>
static void s_split_launch(const cuda_state_t *st, const mla_split_args_t &x, int T, int hpw)
{
    const dim3 grid((unsigned)T * (unsigned)x.n_hg, (unsigned)x.S);
    const size_t smem = 2 * (size_t)MLA_TK * (size_t)(x.kv_lora + x.d) * sizeof(KT);
    if (hpw == 2)
        cuda_launch_large_smem<k_mla_split<KT, 2>>(st, grid, MLA_WARPS * 32, smem, x);
    else
        cuda_launch_large_smem<k_mla_split<KT, 1>>(st, grid, MLA_WARPS * 32, smem, x);
}

void cuda_mla_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q_lat, const float *q_pe,
                        int n_heads, int kv_lora, int rope_dim, float scale, const bk_attn_meta_t *meta, float *out)
{
    if (meta->n_tokens <= 0)
        return;
    if (kv_lora + rope_dim > MLA_MAX_W)
        cuda_die("cuda_mla_attention", "kv_lora_rank + qk_rope_head_dim exceeds 1024", __FILE__, __LINE__);
    const mla_addr_t a = s_addr(kv, layer, meta);
    cuda_state_t *st = cuda_st(be);
    const int T = meta->n_tokens;
    if (s_split_ok(kv, kv_lora, rope_dim)) {
        /* 16 heads a block where there are 16 (each tile read once for all of them), else 8 of one
         * head; key ranges until the grid is about two blocks per SM (TROUPE_CUDA_ATTN_SPLIT=0: one). */
        const int hpw = n_heads >= 16 ? 2 : 1, hg = MLA_WARPS * hpw;
        mla_split_args_t x = {a, q_lat, q_pe, n_heads, kv_lora, rope_dim, (n_heads + hg - 1) / hg, 1, scale, out, NULL};
        const int64_t base = (int64_t)T * x.n_hg;
        if (st->attn_split && base < 2 * (int64_t)st->n_sm) {
            const int64_t S = (2 * (int64_t)st->n_sm + base - 1) / base;
            x.S = (int)(S > MLA_MAX_SPLIT ? MLA_MAX_SPLIT : S);
        }
        const int64_t rh = (int64_t)T * n_heads;
        if (x.S > 1)
            x.part = (float *)cuda_scratch(be, (void **)&st->part, &st->part_bytes,
                                           (size_t)rh * x.S * (kv_lora + 2) * sizeof(float));
        /* TROUPE_CUDA_MLA_MMA (default 1; 0: the CUDA-core kernels below, f32 sums): the tensor-core
         * kernel, same ranges and partials, 1.02-1.84x faster on the V2-Lite shape (docs/deepseek.md);
         * a shape it refuses stays here (2: is fatal, so a test knows it ran). */
        if (st->mla_mma &&
            cuda_mla_decode_mma(st, kv, layer, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, meta, x.S, x.part, out) == 0) {
            if (x.S > 1)
                cuda_launch(st, k_mla_combine, (unsigned)rh, 128, (const float *)x.part, x.S, kv_lora, out);
            return;
        }
        if (st->mla_mma == 2)
            cuda_die("cuda_mla_attention", "TROUPE_CUDA_MLA_MMA=2: the tensor-core kernel refused the shape", __FILE__,
                     __LINE__);
        switch (kv->dtype) {
        case DT_F32: s_split_launch<float>(st, x, T, hpw); break;
        case DT_BF16: s_split_launch<__nv_bfloat16>(st, x, T, hpw); break;
        case DT_F8E4M3: s_split_launch<__nv_fp8_e4m3>(st, x, T, hpw); break;
        default: s_split_launch<__half>(st, x, T, hpw); break;
        }
        if (x.S > 1)
            cuda_launch(st, k_mla_combine, (unsigned)rh, 128, (const float *)x.part, x.S, kv_lora, out);
        return;
    }
    const unsigned grid = (unsigned)T * (unsigned)n_heads;
    switch (kv->dtype) {
    case DT_F32: cuda_launch(st, k_mla_attention<float>, grid, MLA_THREADS, a, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, out); break;
    case DT_BF16: cuda_launch(st, k_mla_attention<__nv_bfloat16>, grid, MLA_THREADS, a, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, out); break;
    case DT_F8E4M3: cuda_launch(st, k_mla_attention<__nv_fp8_e4m3>, grid, MLA_THREADS, a, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, out); break;
    default: cuda_launch(st, k_mla_attention<__half>, grid, MLA_THREADS, a, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, out); break;
    }
}

/* A block takes R rows m of one head h and HM_N outputs n: the rows' x[m][h][0..K) are read once
 * into shared memory, and each weight row w[h*N + n] once for all R rows. (One warp per output
 * element read the row's x N times and every weight row M times: at DeepSeek-V3's shape, 512 outputs
 * of q's absorption re-read the same 128 floats, and a batch of 64 rows read w_uk_t, 16 MB a layer,
 * 64 times.) A warp computes one n at a time: lanes over k with the same partial sums and butterfly
 * as one warp per output, so the result does not depend on R. */
#define HM_N 32                   /* outputs n per block (4 per warp of 8) */
#define HM_SMEM (48 << 10)        /* x rows in the default dynamic shared memory */

template <typename WT, int R>
__global__ void k_head_matmul(const float *x, int M, int n_heads, int x_stride, int x_head, const WT *w, int N, int K,
                              float *y, int y_stride, int y_head)
{
    DEV_PDL_ENTER();
    extern __shared__ float xs[];                  /* [R][K] */
    const int h = blockIdx.y, m0 = blockIdx.z * R, rows = M - m0 < R ? M - m0 : R;
    for (int i = threadIdx.x; i < R * K; i += blockDim.x) {
        const int r = i / K, k = i - r * K;
        xs[i] = r < rows ? x[(int64_t)(m0 + r) * x_stride + (int64_t)h * x_head + k] : 0.0f;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int n_end = (blockIdx.x + 1) * HM_N < N ? (blockIdx.x + 1) * HM_N : N;
    for (int n = blockIdx.x * HM_N + warp; n < n_end; n += n_warps) {
        const WT *row = w + ((int64_t)h * N + n) * K;
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r] = 0.0f;
        for (int k = lane; k < K; k += 32) {
            const float wv = s_ld(row + k);
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] += xs[r * K + k] * wv;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float t = dev_warp_sum(acc[r]);
            if (lane == 0 && r < rows)
                y[(int64_t)(m0 + r) * y_stride + (int64_t)h * y_head + n] = t;
        }
    }
}

template <typename WT, int R>
static void s_head_launch(const cuda_state_t *st, const float *x, int M, int n_heads, int x_stride, int x_head,
                          const void *w, int N, int K, float *y, int y_stride, int y_head)
{
    const dim3 grid((unsigned)((N + HM_N - 1) / HM_N), (unsigned)n_heads, (unsigned)((M + R - 1) / R));
    cuda_launch_smem(st, k_head_matmul<WT, R>, grid, 256, (size_t)R * K * sizeof(float), x, M, n_heads, x_stride,
                     x_head, (const WT *)w, N, K, y, y_stride, y_head);
}

/* Rows a block: one for a single row (decode at batch 1), else 8 while their x fits. */
template <typename WT>
static void s_head_rows(const cuda_state_t *st, const float *x, int M, int n_heads, int x_stride, int x_head,
                        const void *w, int N, int K, float *y, int y_stride, int y_head)
{
    if (M > 1 && (size_t)8 * K * sizeof(float) <= HM_SMEM)
        s_head_launch<WT, 8>(st, x, M, n_heads, x_stride, x_head, w, N, K, y, y_stride, y_head);
    else if (M > 1 && (size_t)4 * K * sizeof(float) <= HM_SMEM)
        s_head_launch<WT, 4>(st, x, M, n_heads, x_stride, x_head, w, N, K, y, y_stride, y_head);
    else
        s_head_launch<WT, 1>(st, x, M, n_heads, x_stride, x_head, w, N, K, y, y_stride, y_head);
}

void cuda_head_matmul(backend_t *be, const float *x, int M, int n_heads, int x_stride, int x_head, const bk_mat_t *w,
                      float *y, int y_stride, int y_head)
{
    const int N = (int)(w->rows / n_heads), K = (int)w->cols;
    if ((int64_t)M * n_heads * N <= 0)
        return;
    if ((size_t)K * sizeof(float) > HM_SMEM)
        cuda_die("cuda_head_matmul", "more than 12,288 columns a head", __FILE__, __LINE__);
    const cuda_state_t *st = cuda_st(be);
    switch (w->dtype) {
    case DT_F32: s_head_rows<float>(st, x, M, n_heads, x_stride, x_head, w->data, N, K, y, y_stride, y_head); break;
    case DT_BF16: s_head_rows<__nv_bfloat16>(st, x, M, n_heads, x_stride, x_head, w->data, N, K, y, y_stride, y_head); break;
    default: s_head_rows<__half>(st, x, M, n_heads, x_stride, x_head, w->data, N, K, y, y_stride, y_head); break;
    }
}

__global__ void k_add(float *y, const float *x, int64_t n)
{
    DEV_PDL_ENTER();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], x[i]);
}

void cuda_add(backend_t *be, float *y, const float *x, int n)
{
    if (n > 0)
        cuda_launch(cuda_st(be), k_add, (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256, y, x,
                    (int64_t)n);
}

#define ROUTE_MAX_E 1024      /* a lane's experts e = lane + 32 i fit one 32-bit mask */
#define ROUTE_WARPS 4         /* rows per block (fewer when a row's shared arrays are large) */

/* Floats of shared memory one row takes: s [E], choice [E], gs [G]; then ints keep [G], sel [k]. */
static __host__ __device__ inline size_t s_route_words(int E, int n_group, int k)
{
    return 2 * (size_t)E + 2 * (size_t)n_group + (size_t)k;
}

/* Merges each lane's candidate (value, index; index -1: none) over the warp: the larger value,
 * ties to the lower index, as the CPU's serial scan in index order with a strict > picks. Every
 * lane ends with the same winner (the order is total on distinct indices). */
__device__ __forceinline__ void s_warp_argmax(float &bv, int &bi)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
        }
    }
}

/* One warp per row. Each selection pass (topk_group over the groups, then k over the experts) is a
 * lane-local scan in index order and a warp argmax, so ids and weights are the CPU's exactly (the
 * scores and the weights' sum are the same f32 operations in the same order). It replaces thread 0
 * selecting alone (k passes over E, an O(j) 'taken' search per expert): a serial chain of
 * shared- and global-memory reads per row, the other threads idle. */
__global__ void k_moe_route_sigmoid(const float *logits, const float *bias, int M, int E, int k, int n_group,
                                    int topk_group, int renorm, float scale, int32_t *ids, float *weights)
{
    DEV_PDL_ENTER();
    extern __shared__ float route_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x / 32) + warp, per = E / n_group;
    if (t >= M)
        return;                                    /* the row's warp alone: no block-wide sync below */
    float *s = route_smem + (size_t)warp * s_route_words(E, n_group, k), *choice = s + E, *gs = choice + E;
    int *keep = (int *)(gs + n_group), *sel = keep + n_group;
    for (int e = lane; e < E; e += 32) {
        const float x = logits[(int64_t)t * E + e];
        s[e] = 1.0f / __fadd_rn(1.0f, expf(-x));
        choice[e] = __fadd_rn(s[e], bias[e]);
    }
    __syncwarp();
    for (int g = lane; g < n_group; g += 32) {
        float a = -INFINITY, b = -INFINITY;
        for (int j = 0; j < per; j++) {
            const float v = choice[g * per + j];
            if (v > a) {
                b = a;
                a = v;
            } else if (v > b) {
                b = v;
            }
        }
        gs[g] = a + b;
        keep[g] = 0;
    }
    __syncwarp();
    for (int j = 0; j < topk_group; j++) {
        float bv = 0.0f;
        int bi = -1;
        for (int g = lane; g < n_group; g += 32)
            if (!keep[g] && (bi < 0 || gs[g] > bv)) {
                bv = gs[g];
                bi = g;
            }
        s_warp_argmax(bv, bi);
        if (lane == 0)
            keep[bi] = 1;
        __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
        if (!keep[e / per])
            choice[e] = 0.0f;
    __syncwarp();
    uint32_t taken = 0;                            /* bit i: expert lane + 32 i is chosen */
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = 0.0f;
        int bi = -1;
        for (int e = lane, i = 0; e < E; e += 32, i++)
            if (!((taken >> i) & 1u) && (bi < 0 || choice[e] > bv)) {
                bv = choice[e];
                bi = e;
            }
        s_warp_argmax(bv, bi);
        if ((bi & 31) == lane)
            taken |= 1u << (bi >> 5);
        sum += s[bi];                              /* every lane: the CPU's order, j = 0, 1, ... */
        if (lane == 0)
            sel[j] = bi;
    }
    __syncwarp();
    for (int j = lane; j < k; j += 32) {
        const float w = s[sel[j]];
        ids[(int64_t)t * k + j] = sel[j];
        weights[(int64_t)t * k + j] = __fmul_rn(renorm ? w / (sum + 1e-20f) : w, scale);
    }
}

void cuda_moe_route_sigmoid(backend_t *be, const float *logits, const float *bias, int M, int E, int k, int n_group,
                            int topk_group, int renorm, float scale, int32_t *ids, float *weights)
{
    if (M <= 0)
        return;
    if (E > ROUTE_MAX_E)
        cuda_die("cuda_moe_route_sigmoid", "more than 1024 routed experts", __FILE__, __LINE__);
    if (k > E || topk_group > n_group)
        cuda_die("cuda_moe_route_sigmoid", "more experts (groups) to pick than there are", __FILE__, __LINE__);
    const size_t row = s_route_words(E, n_group, k) * 4;
    int wpb = (int)((48 << 10) / row);             /* within the default dynamic shared memory */
    wpb = wpb < 1 ? 1 : wpb > ROUTE_WARPS ? ROUTE_WARPS : wpb;
    cuda_launch_smem(cuda_st(be), k_moe_route_sigmoid, (unsigned)((M + wpb - 1) / wpb), 32 * wpb,
                                                (size_t)wpb * row, logits, bias, M, E, k, n_group, topk_group,
                                                renorm, scale, ids, weights);
}

#define TOP_THREADS 256

/* One block per row: each thread's best in index order, merged by warps (s_warp_argmax: ties to the
 * lower index, so the id is the argmax op's), then the sum of expf(x - best) over the row. */
__global__ void k_mtp_top(const float *x, int N, int32_t *out, float *prob)
{
    DEV_PDL_ENTER();
    __shared__ float wv[TOP_THREADS / 32], ws[TOP_THREADS / 32];
    __shared__ int wi[TOP_THREADS / 32];
    const float *r = x + (int64_t)blockIdx.x * N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        const float v = r[i];
        if (v == v && (bi < 0 || v > bv)) {
            bv = v;
            bi = i;
        }
    }
    s_warp_argmax(bv, bi);
    if (lane == 0) {
        wv[warp] = bv;
        wi[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < TOP_THREADS / 32 ? wv[lane] : -INFINITY;
        bi = lane < TOP_THREADS / 32 ? wi[lane] : -1;
        s_warp_argmax(bv, bi);
        if (lane == 0) {
            wv[0] = bv;
            wi[0] = bi;
        }
    }
    __syncthreads();
    const float top = wv[0];
    const int best = wi[0];
    float sum = 0.0f;
    for (int i = threadIdx.x; best >= 0 && i < N; i += blockDim.x) {
        const float v = r[i];
        if (v == v)
            sum += expf(v - top);
    }
    sum = dev_warp_sum(sum);
    __syncthreads();                               /* wv[0] read by every thread before ws is written */
    if (lane == 0)
        ws[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < TOP_THREADS / 32; w++)
            t += ws[w];
        out[blockIdx.x] = best < 0 ? 0 : best;
        prob[blockIdx.x] = best < 0 ? 0.0f : 1.0f / t;
    }
}

void cuda_mtp_top(backend_t *be, const float *x, int M, int N, int32_t *out, float *prob)
{
    if (M > 0)
        cuda_launch(cuda_st(be), k_mtp_top, (unsigned)M, TOP_THREADS, x, N, out, prob);
}
