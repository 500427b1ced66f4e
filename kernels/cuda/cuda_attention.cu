/* kernels/cuda/cuda_attention.cu — K/V into the paged cache, and causal GQA attention over it.
 *
 * Two attention kernels, both with the online softmax of kernels/backend.h (running max m, running
 * sum l, unnormalised accumulator rescaled by exp(m_old - m_new); out = acc * (1 / l)), both
 * reading K and V at the cache's stored width (bf16 K/V are converted in registers):
 *
 * Rows (decode, and any shape): one block per (row, query head, split). Each of its 4 warps takes
 * 4 keys at a time (all 8 K/V loads in flight before the first use), a lane holding head_dim/32
 * elements of q, K, V and the accumulator; a dot product is finished by a butterfly of shuffles.
 * The warps' states merge in shared memory at the end. When rows x heads cannot fill the GPU
 * (decode: 1 row x 32 heads on 132 SMs), each row's keys are split into S ranges (split-KV,
 * "flash-decoding"): every block writes (m, l, acc) for its range and a second kernel merges them.
 * S comes from the shape only (the host does not know the context lengths: positions live on the
 * device), so a short context just leaves some ranges empty.
 *
 * Tiles (prefill: many rows per sequence, head_dim 32, 64 or 128): one block per (16 consecutive
 * rows, query head). Keys come 32 at a time into shared memory as f32 (K rows padded so each
 * lane's 16-byte reads hit distinct banks); lane j scores key j against each of the warp's 4 rows,
 * then the tile's softmax update and P.V (p broadcast by shuffle, V read as float4). K and V are
 * read once per 16 rows instead of once per row. Rows of one tile that belong to different
 * sequences (the interface allows any order) are handled in one pass per sequence.
 *
 * Numerics: scores are f32 dot products times scale, exp is expf; only the summation order
 * differs from the CPU (relative ~1e-6).
 *
 * Prefill over a bf16 cache (head_dim 64/128) goes to the tensor-core kernel of
 * cuda_attention_mma.cu first (TROUPE_CUDA_ATTN_MMA=1, the default; bf16 q and p, ~2e-3), and so
 * does decode with one new row per sequence to cuda_attention_decode_mma.cu's
 * (TROUPE_CUDA_ATTN_MMA_DECODE=1, the default; it writes the same split-KV partials, merged by
 * k_attn_merge here); the kernels here remain their fallback and their reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_mma.cuh"

#define ATTN_WARPS 4              /* warps per block in both kernels */
#define ATTN_KU 4                 /* keys per warp per step in the row kernel */
#define ATTN_MAX_SPLIT 32
#define TILE_ROWS 16              /* query rows per block in the tile kernel (4 per warp) */
#define TILE_KEYS 32              /* keys per shared-memory tile: one per lane */
#define TILE_MAX_D 128

/* Everything a kernel needs to address the pool and the step, passed by value. */
typedef struct attn_args {
    const uint8_t *base;          /* pool */
    size_t block_bytes;
    int block_size, n_kv, D, layer;
    const int32_t *tok_seq, *tok_pos, *seq_bt_start, *block_table;
    const float *q;               /* [T][n_heads][D] */
    int T, n_heads;
    float scale;
    int S;                        /* key ranges per row (row kernel) */
    float *out;                   /* [T][n_heads][D] */
    float *part;                  /* S > 1: [T][n_heads][S][D + 2] = (m, l, acc[D]) */
    const float *kv_scale;        /* fp8 with scales (bk_kv_t.scale): [n_layers][2][n_kv]; NULL: 1 */
} attn_args_t;

/* Element offset, from the start of a block, of K (which 0) or V (1) of `layer`, slot 0, head 0. */
__device__ __forceinline__ size_t dev_kv_off(const attn_args_t &a, int which)
{
    return ((size_t)a.layer * 2 + (size_t)which) * (size_t)a.block_size * (size_t)a.n_kv * (size_t)a.D;
}

/* ---- kv_store ----------------------------------------------------------------------------------- */

/* What is stored for value x of K (which 0) or V (1), kv head h: x, or x / s with scales (IEEE
 * division, as the CPU's; dev_store then rounds it to the cache's dtype). */
__device__ __forceinline__ float dev_kv_enc(const attn_args_t &a, int which, int h, float x)
{
    return a.kv_scale ? __fdiv_rn(x, a.kv_scale[((size_t)a.layer * 2 + (size_t)which) * (size_t)a.n_kv + (size_t)h]) : x;
}

template <typename KT>
__global__ void k_kv_store(attn_args_t a, const float *k, const float *v)
{
    DEV_PDL_ENTER();
    const int t = blockIdx.x;
    const int seq = a.tok_seq[t], pos = a.tok_pos[t];
    const int32_t blk = a.block_table[a.seq_bt_start[seq] + pos / a.block_size];
    const int slot = pos % a.block_size, n = a.n_kv * a.D;
    KT *blockp = (KT *)(a.base + (size_t)blk * a.block_bytes);
    KT *kd = blockp + dev_kv_off(a, 0) + (size_t)slot * n;
    KT *vd = blockp + dev_kv_off(a, 1) + (size_t)slot * n;
    const float *ks = k + (size_t)t * n, *vs = v + (size_t)t * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        dev_store(kd + i, dev_kv_enc(a, 0, i / a.D, ks[i]));
        dev_store(vd + i, dev_kv_enc(a, 1, i / a.D, vs[i]));
    }
}

/* RoPE of q and k and the kv_store (backend.h rope_kv_store): block (t, y) takes token t's heads
 * y*ROPE_HEADS.. (q heads, then k heads) and a 1/gridDim.y share of its v: the angles in shared
 * memory, every head rotated in place with k_rope's arithmetic, the rotated k and v stored with
 * k_kv_store's. One launch instead of three per layer. Several blocks per token: at batch 1 one
 * block did the 40 heads of an 8B layer in 10 dependent rounds of loads, 9.8 us (ncu). */
#define ROPE_HEADS 2
template <typename KT>
__global__ void k_rope_kv_store(attn_args_t a, float *q, float *k, const float *v, const float *inv_freq)
{
    DEV_PDL_ENTER();
    __shared__ float c[BK_MAX_HEAD_DIM / 2], s[BK_MAX_HEAD_DIM / 2];
    const int t = blockIdx.x, D = a.D, half = D / 2, h0 = blockIdx.y * ROPE_HEADS;
    const int seq = a.tok_seq[t], pos = a.tok_pos[t];
    const float p = (float)pos;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = __fmul_rn(p, inv_freq[i]);
        sincosf(ang, &s[i], &c[i]);
    }
    __syncthreads();
    const int32_t blk = a.block_table[a.seq_bt_start[seq] + pos / a.block_size];
    const int slot = pos % a.block_size, n = a.n_kv * D;
    KT *blockp = (KT *)(a.base + (size_t)blk * a.block_bytes);
    KT *kd = blockp + dev_kv_off(a, 0) + (size_t)slot * n;
    KT *vd = blockp + dev_kv_off(a, 1) + (size_t)slot * n;
    float *qrow = q + (int64_t)t * a.n_heads * D, *krow = k + (int64_t)t * n;
    const int h1 = min(h0 + ROPE_HEADS, a.n_heads + a.n_kv);
    for (int j = h0 * half + threadIdx.x; j < h1 * half; j += blockDim.x) {
        const int h = j / half, i = j % half;
        const bool is_k = h >= a.n_heads;
        float *x = is_k ? krow + (int64_t)(h - a.n_heads) * D : qrow + (int64_t)h * D;
        const float lo = x[i], hi = x[i + half];
        const float rlo = __fsub_rn(__fmul_rn(lo, c[i]), __fmul_rn(hi, s[i]));
        const float rhi = __fadd_rn(__fmul_rn(hi, c[i]), __fmul_rn(lo, s[i]));
        x[i] = rlo;
        x[i + half] = rhi;
        if (is_k) {
            const int e = (h - a.n_heads) * D + i;
            dev_store(kd + e, dev_kv_enc(a, 0, h - a.n_heads, rlo));
            dev_store(kd + e + half, dev_kv_enc(a, 0, h - a.n_heads, rhi));
        }
    }
    const float *vs = v + (size_t)t * n;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n; i += gridDim.y * blockDim.x)
        dev_store(vd + i, dev_kv_enc(a, 1, i / D, vs[i]));
}

void cuda_rope_kv_store(backend_t *be, const bk_kv_t *kv, int layer, float *q, float *k, const float *v, int n_heads,
                        const float *inv_freq, const bk_attn_meta_t *meta)
{
    if (meta->n_tokens <= 0)
        return;
    attn_args_t a = {};
    cuda_kv_addr(a, kv, layer, meta);
    a.D = kv->head_dim;
    a.n_heads = n_heads;
    a.kv_scale = kv->dtype == DT_F8E4M3 ? kv->scale : NULL;
    const cuda_state_t *st = cuda_st(be);
    const dim3 grid((unsigned)meta->n_tokens, (unsigned)((n_heads + kv->n_kv_heads + ROPE_HEADS - 1) / ROPE_HEADS));
    const int threads = 128;
    switch (kv->dtype) {
    case DT_F32: cuda_launch(st, k_rope_kv_store<float>, grid, threads, a, q, k, v, inv_freq); break;
    case DT_BF16: cuda_launch(st, k_rope_kv_store<__nv_bfloat16>, grid, threads, a, q, k, v, inv_freq); break;
    case DT_F8E4M3: cuda_launch(st, k_rope_kv_store<__nv_fp8_e4m3>, grid, threads, a, q, k, v, inv_freq); break;
    default: cuda_launch(st, k_rope_kv_store<__half>, grid, threads, a, q, k, v, inv_freq); break;
    }
}

void cuda_kv_store(backend_t *be, const bk_kv_t *kv, int layer, const float *k, const float *v, const bk_attn_meta_t *meta)
{
    if (meta->n_tokens <= 0)
        return;
    attn_args_t a = {};
    cuda_kv_addr(a, kv, layer, meta);
    a.D = kv->head_dim;
    a.kv_scale = kv->dtype == DT_F8E4M3 ? kv->scale : NULL;
    const cuda_state_t *st = cuda_st(be);
    const int threads = kv->n_kv_heads * kv->head_dim >= 512 ? 256 : 128;
    switch (kv->dtype) {
    case DT_F32: cuda_launch(st, k_kv_store<float>, meta->n_tokens, threads, a, k, v); break;
    case DT_BF16: cuda_launch(st, k_kv_store<__nv_bfloat16>, meta->n_tokens, threads, a, k, v); break;
    case DT_F8E4M3: cuda_launch(st, k_kv_store<__nv_fp8_e4m3>, meta->n_tokens, threads, a, k, v); break;
    default: cuda_launch(st, k_kv_store<__half>, meta->n_tokens, threads, a, k, v); break;
    }
}

/* ---- row kernel (decode, split-KV) ------------------------------------------------------------- */

/* DPL elements of a head vector at p + d0 (this lane's part) as floats. VEC: D == 32 * DPL and
 * the lane's part is 4, 8 or 16+ bytes, so it is loaded in 16-byte (or smaller) vectors; else one
 * element at a time, lanes past D reading nothing. */
template <typename KT, int DPL, bool VEC>
__device__ __forceinline__ void dev_load_part(const KT *p, int d0, int D, float *out)
{
    if constexpr (VEC) {
        constexpr int VN = DPL * (int)sizeof(KT) > 16 ? 16 / (int)sizeof(KT) : DPL;
#pragma unroll
        for (int i = 0; i < DPL; i += VN)
            dev_load_vec<KT, VN>(p + d0 + i, out + i);
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i++)
            out[i] = d0 + i < D ? dev_to_f32(p[d0 + i]) : 0.0f;
    }
}

template <typename KT, int DPL, bool VEC>
__global__ void __launch_bounds__(ATTN_WARPS * 32) k_attn_rows(attn_args_t a)
{
    DEV_PDL_ENTER();
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_acc[ATTN_WARPS][BK_MAX_HEAD_DIM];
    const int t = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int D = a.D, G = a.n_heads / a.n_kv, g = h / G, d0 = lane * DPL;
    const int seq = a.tok_seq[t], n_keys = a.tok_pos[t] + 1;
    const int chunk = (n_keys + a.S - 1) / a.S;
    const int k0 = s * chunk, k1 = min(n_keys, k0 + chunk);
    const int32_t *bt = a.block_table + a.seq_bt_start[seq];
    const size_t slot_stride = (size_t)a.n_kv * D, k_off = dev_kv_off(a, 0) + (size_t)g * D,
                 v_off = dev_kv_off(a, 1) + (size_t)g * D;

    float qv[DPL], acc[DPL];
    const float *qp = a.q + ((size_t)t * a.n_heads + h) * D;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qv[i] = d0 + i < D ? qp[d0 + i] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j0 = k0 + warp * ATTN_KU; j0 < k1; j0 += ATTN_WARPS * ATTN_KU) {
        float kf[ATTN_KU][DPL], vf[ATTN_KU][DPL];
#pragma unroll
        for (int u = 0; u < ATTN_KU; u++) {
            const int j = j0 + u;
            if (j < k1) {
                const KT *blockp = (const KT *)(a.base + (size_t)bt[j / a.block_size] * a.block_bytes);
                const size_t slot = (size_t)(j % a.block_size) * slot_stride;
                dev_load_part<KT, DPL, VEC>(blockp + k_off + slot, d0, D, kf[u]);
                dev_load_part<KT, DPL, VEC>(blockp + v_off + slot, d0, D, vf[u]);
            } else {
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    kf[u][i] = vf[u][i] = 0.0f;
            }
        }
        float sc[ATTN_KU];
        float bmax = -INFINITY;
#pragma unroll
        for (int u = 0; u < ATTN_KU; u++) {
            float part = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                part = fmaf(qv[i], kf[u][i], part);
            sc[u] = j0 + u < k1 ? dev_warp_sum(part) * a.scale : -INFINITY;
            bmax = fmaxf(bmax, sc[u]);
        }
        const float m_new = fmaxf(m, bmax);        /* finite: key j0 is always in range */
        const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
        float p[ATTN_KU], psum = 0.0f;
#pragma unroll
        for (int u = 0; u < ATTN_KU; u++) {
            p[u] = j0 + u < k1 ? expf(sc[u] - m_new) : 0.0f;
            psum += p[u];
        }
        l = l * corr + psum;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            float x = acc[i] * corr;
#pragma unroll
            for (int u = 0; u < ATTN_KU; u++)
                x = fmaf(p[u], vf[u][i], x);
            acc[i] = x;
        }
        m = m_new;
    }

    /* Merge the warps (a warp that saw no key has m = -inf, l = 0, acc = 0 and weight 0). */
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++)
        if (d0 + i < D)
            sm_acc[warp][d0 + i] = acc[i];
    __syncthreads();
    float mt = -INFINITY, lt = 0.0f, wt[ATTN_WARPS];
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++)
        mt = fmaxf(mt, sm_m[w]);
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) {
        wt[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - mt);
        lt += sm_l[w] * wt[w];
    }
    const size_t r = (size_t)t * a.n_heads + h;
    if (a.S == 1) {
        const float inv = 1.0f / lt;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float x = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++)
                x += sm_acc[w][d] * wt[w];
            a.out[r * D + d] = x * inv;
        }
    } else {
        float *pp = a.part + (r * a.S + s) * (size_t)(D + 2);
        if (threadIdx.x == 0) {
            pp[0] = mt;
            pp[1] = lt;
        }
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float x = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++)
                x += sm_acc[w][d] * wt[w];
            pp[2 + d] = x;
        }
    }
}

/* Merges the S key ranges of each (row, head): one block each. The ranges' m and l are loaded by
 * warp 0's lanes at once (one range each; S <= 32) and the maximum taken by shuffles, so no thread
 * waits on S loads in turn (a single thread did: 9.2 us a layer at batch 1, ncu); l and every
 * output are still summed over s in order, and the loads of the unrolled loop go out together. */
__global__ void k_attn_merge(const float *part, int S, int D, float *out)
{
    DEV_PDL_ENTER();
    __shared__ float wts[ATTN_MAX_SPLIT], ls[ATTN_MAX_SPLIT];
    __shared__ float s_inv;
    const size_t r = blockIdx.x;
    const float *p = part + r * S * (size_t)(D + 2);
    if (threadIdx.x < 32) {
        const int s = threadIdx.x;
        const float ms = s < S ? p[(size_t)s * (D + 2)] : -INFINITY;
        const float mt = dev_warp_max(ms);
        if (s < S) {
            wts[s] = ms == -INFINITY ? 0.0f : expf(ms - mt);   /* an empty range weighs nothing */
            ls[s] = p[(size_t)s * (D + 2) + 1];
        }
        __syncwarp();
        if (s == 0) {
            float lt = 0.0f;
            for (int i = 0; i < S; i++)
                lt += ls[i] * wts[i];
            s_inv = 1.0f / lt;
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float x = 0.0f;
#pragma unroll 8
        for (int s = 0; s < S; s++)
            x += p[(size_t)s * (D + 2) + 2 + d] * wts[s];
        out[r * D + d] = x * s_inv;
    }
}

/* ---- tile kernel (prefill) --------------------------------------------------------------------- */

template <typename KT, int DPL>
__global__ void __launch_bounds__(ATTN_WARPS * 32) k_attn_tiles(attn_args_t a)
{
    DEV_PDL_ENTER();
    constexpr int D = 32 * DPL, KSTRIDE = D + 4;   /* +4 floats: lane j's float4 reads spread over banks */
    constexpr int RPW = TILE_ROWS / ATTN_WARPS;    /* rows per warp */
    __shared__ __align__(16) float Ks[TILE_KEYS][KSTRIDE];
    __shared__ __align__(16) float Vs[TILE_KEYS][D];
    __shared__ __align__(16) float Qs[TILE_ROWS][D];
    __shared__ int s_seq[TILE_ROWS], s_pos[TILE_ROWS];
    const int t0 = blockIdx.x * TILE_ROWS, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d0 = lane * DPL;
    const int G = a.n_heads / a.n_kv, g = h / G;
    const size_t slot_stride = (size_t)a.n_kv * D, k_off = dev_kv_off(a, 0) + (size_t)g * D,
                 v_off = dev_kv_off(a, 1) + (size_t)g * D;
    if (threadIdx.x < TILE_ROWS) {
        const int t = t0 + threadIdx.x;
        s_seq[threadIdx.x] = t < a.T ? a.tok_seq[t] : -1;   /* -1: no row, or a row already done */
        s_pos[threadIdx.x] = t < a.T ? a.tok_pos[t] : -1;
    }
    for (;;) {
        __syncthreads();
        /* This pass: the sequence of the first row not done yet, and its rows' largest position. */
        int max_pos;
        const int cur = dev_next_pass(s_seq, s_pos, TILE_ROWS, &max_pos);
        if (cur < 0)
            break;
        for (int i = threadIdx.x; i < TILE_ROWS * D; i += blockDim.x) {
            const int r = i / D, d = i % D;
            Qs[r][d] = s_seq[r] == cur ? a.q[((size_t)(t0 + r) * a.n_heads + h) * D + d] : 0.0f;
        }
        const int32_t *bt = a.block_table + a.seq_bt_start[cur];
        float m[RPW], l[RPW], acc[RPW][DPL];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            m[rr] = -INFINITY;
            l[rr] = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                acc[rr][i] = 0.0f;
        }
        for (int kt = 0; kt <= max_pos; kt += TILE_KEYS) {
            __syncthreads();                       /* the previous tile (and Qs's writers) are done */
            for (int i = threadIdx.x; i < TILE_KEYS * D; i += blockDim.x) {
                const int j = i / D, d = i % D, key = kt + j;
                float kx = 0.0f, vx = 0.0f;        /* keys past max_pos: zeros, never garbage (0 * NaN) */
                if (key <= max_pos) {
                    const KT *blockp = (const KT *)(a.base + (size_t)bt[key / a.block_size] * a.block_bytes);
                    const size_t slot = (size_t)(key % a.block_size) * slot_stride;
                    kx = dev_to_f32(blockp[k_off + slot + d]);
                    vx = dev_to_f32(blockp[v_off + slot + d]);
                }
                Ks[j][d] = kx;
                Vs[j][d] = vx;
            }
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const int r = warp * RPW + rr;
                if (s_seq[r] != cur || kt > s_pos[r])   /* warp-uniform */
                    continue;
                const int key = kt + lane;
                float sc = 0.0f;
#pragma unroll 8
                for (int d = 0; d < D; d += 4) {
                    const float4 kv = *(const float4 *)&Ks[lane][d];
                    const float4 qv = *(const float4 *)&Qs[r][d];
                    sc = fmaf(qv.x, kv.x, sc);
                    sc = fmaf(qv.y, kv.y, sc);
                    sc = fmaf(qv.z, kv.z, sc);
                    sc = fmaf(qv.w, kv.w, sc);
                }
                const bool valid = key <= s_pos[r];
                sc = valid ? sc * a.scale : -INFINITY;
                const float m_new = fmaxf(m[rr], dev_warp_max(sc));   /* finite: key kt is valid */
                const float corr = m[rr] == -INFINITY ? 0.0f : expf(m[rr] - m_new);
                const float p = valid ? expf(sc - m_new) : 0.0f;
                l[rr] = l[rr] * corr + dev_warp_sum(p);
                m[rr] = m_new;
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    acc[rr][i] *= corr;
                for (int j = 0; j < TILE_KEYS; j++) {
                    const float pj = __shfl_sync(0xffffffffu, p, j);
                    float vv[DPL];
                    if constexpr (DPL == 4) {
                        const float4 v4 = *(const float4 *)&Vs[j][d0];
                        vv[0] = v4.x, vv[1] = v4.y, vv[2] = v4.z, vv[3] = v4.w;
                    } else if constexpr (DPL == 2) {
                        const float2 v2 = *(const float2 *)&Vs[j][d0];
                        vv[0] = v2.x, vv[1] = v2.y;
                    } else {
                        vv[0] = Vs[j][d0];
                    }
#pragma unroll
                    for (int i = 0; i < DPL; i++)
                        acc[rr][i] = fmaf(pj, vv[i], acc[rr][i]);
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = warp * RPW + rr;
            if (s_seq[r] != cur)
                continue;
            const float inv = 1.0f / l[rr];
            float *o = a.out + ((size_t)(t0 + r) * a.n_heads + h) * D;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                o[d0 + i] = acc[rr][i] * inv;
        }
        __syncthreads();                           /* every warp has read s_seq for this pass */
        if (threadIdx.x < TILE_ROWS && s_seq[threadIdx.x] == cur)
            s_seq[threadIdx.x] = -1;
    }
}

/* ---- flash kernel (decode and prefill, D = 64 or 128) ------------------------------------------ */

/* One block per (tile of NT rows, kv head g, key range s). Its "vectors" are the NT x G queries of
 * the tile's rows and g's query heads: every K/V tile is loaded once for all of them (GQA costs
 * no extra reads). Warp w owns vectors w, w + 4, ... (VPW of them), and for each of them:
 *   scores: lane j takes key kt + j of the tile (a dot product over D from shared memory);
 *   softmax: the warp's max and sum of the tile's 32 scores update (m, l); p goes to shared memory;
 *   P.V: lane owns DPL dimensions of the accumulator and walks the tile's keys.
 * A warp touches only its own vectors' rows of Ps, so only the K/V tiles need block barriers.
 * K/V tiles are double-buffered with cp.async (16-byte chunks; keys past the range load zeros), K
 * rows padded by 16 bytes so that the lanes' 16-byte reads of different keys hit different banks.
 * Rows of one tile that belong to different sequences are handled one sequence per pass. */
#define FL_KEYS 32                /* keys per K/V tile: one per lane */
#define FL_VECS 32                /* vectors (rows x heads) per prefill block: 4 warps x 8 (G=4: 8 rows) */

/* Shared memory of one block: K and V tiles (two of each), the queries, the probabilities. */
template <typename KT, int D, int VECS>
struct fl_smem {
    static constexpr int KPAD = D + 16 / (int)sizeof(KT);          /* K row stride, elements */
    static constexpr size_t K_BYTES = (size_t)2 * FL_KEYS * KPAD * sizeof(KT);
    static constexpr size_t V_BYTES = (size_t)2 * FL_KEYS * D * sizeof(KT);
    static constexpr size_t Q_BYTES = (size_t)VECS * D * sizeof(float);
    static constexpr size_t P_BYTES = (size_t)VECS * FL_KEYS * sizeof(float);
    static constexpr size_t BYTES = K_BYTES + V_BYTES + Q_BYTES + P_BYTES;
};

/* N elements of shared memory at p (N * sizeof(T) = 4, 8 or 16 bytes, aligned) as floats. */
template <typename T, int N> __device__ __forceinline__ void dev_smem_load(const T *p, float *out)
{
    constexpr int BYTES = N * (int)sizeof(T);
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "a vector of 4, 8 or 16 bytes");
    uint4 w = {0, 0, 0, 0};
    if constexpr (BYTES == 16) {
        w = *(const uint4 *)p;
    } else if constexpr (BYTES == 8) {
        const uint2 x = *(const uint2 *)p;
        w.x = x.x, w.y = x.y;
    } else {
        w.x = *(const unsigned *)p;
    }
    float all[16 / sizeof(T)];
    dev_unpack16<T>(w, all);
#pragma unroll
    for (int i = 0; i < N; i++)
        out[i] = all[i];
}

template <typename KT, int DPL, int VPW>
__global__ void __launch_bounds__(ATTN_WARPS * 32) k_attn_flash(attn_args_t a, int NT)
{
    DEV_PDL_ENTER();
    constexpr int D = 32 * DPL, VN = 16 / (int)sizeof(KT), CHUNKS = D / VN;   /* 16-byte chunks per key */
    typedef fl_smem<KT, D, 4 * VPW> SM;
    extern __shared__ __align__(16) uint8_t fl_sm[];
    KT *Ks = (KT *)fl_sm;                                   /* [2][FL_KEYS][KPAD] */
    KT *Vs = (KT *)(fl_sm + SM::K_BYTES);                   /* [2][FL_KEYS][D] */
    float *Qs = (float *)(fl_sm + SM::K_BYTES + SM::V_BYTES);   /* [4 * VPW][D] */
    float *Ps = Qs + 4 * VPW * D;                           /* [4 * VPW][FL_KEYS] */
    __shared__ int s_seq[FL_VECS], s_pos[FL_VECS];          /* per tile row; seq -1: no row, or done */

    const int G = a.n_heads / a.n_kv, g = blockIdx.y, sidx = blockIdx.z;
    /* Last row tiles first: in a causal prefill they have the most keys, so the short ones fill
     * the tail of the grid instead of the long ones running alone at its end. */
    const int t0 = (gridDim.x - 1 - blockIdx.x) * NT, nvec = NT * G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d0 = lane * DPL;
    const size_t slot_stride = (size_t)a.n_kv * D, k_off = dev_kv_off(a, 0) + (size_t)g * D,
                 v_off = dev_kv_off(a, 1) + (size_t)g * D;
    for (int r = threadIdx.x; r < NT; r += blockDim.x) {
        const int t = t0 + r;
        s_seq[r] = t < a.T ? a.tok_seq[t] : -1;
        s_pos[r] = t < a.T ? a.tok_pos[t] : -1;
    }
    for (;;) {
        __syncthreads();
        int max_pos;
        const int cur = dev_next_pass(s_seq, s_pos, NT, &max_pos);
        if (cur < 0)
            break;
        /* This block's key range: [k0, k1) of 0..max_pos, split S ways (decode). */
        const int n_keys = max_pos + 1, span = (n_keys + a.S - 1) / a.S;
        const int k0 = sidx * span, k1 = min(n_keys, k0 + span);
        const int32_t *bt = a.block_table + a.seq_bt_start[cur];

        /* Queries of this pass; vectors of other sequences' rows get position -1 (never valid). */
        for (int i = threadIdx.x; i < nvec * D; i += blockDim.x) {
            const int v = i / D, d = i % D, r = v / G, h = g * G + v % G;
            Qs[v * D + d] = s_seq[r] == cur ? a.q[((size_t)(t0 + r) * a.n_heads + h) * D + d] : 0.0f;
        }
        int vpos[VPW];
        float m[VPW], l[VPW], acc[VPW][DPL];
#pragma unroll
        for (int i = 0; i < VPW; i++) {
            const int v = warp + 4 * i, r = v / G;
            vpos[i] = v < nvec && s_seq[r] == cur ? s_pos[r] : -1;
            m[i] = -INFINITY;
            l[i] = 0.0f;
#pragma unroll
            for (int e = 0; e < DPL; e++)
                acc[i][e] = 0.0f;
        }

        auto load_tile = [&](int kt, int buf) {
            for (int c = threadIdx.x; c < FL_KEYS * CHUNKS; c += blockDim.x) {
                const int j = c / CHUNKS, part = c % CHUNKS, key = kt + j;
                const bool in = key < k1;
                const KT *blockp = (const KT *)(a.base + (in ? (size_t)bt[key / a.block_size] * a.block_bytes : 0));
                const size_t slot = in ? (size_t)(key % a.block_size) * slot_stride : 0;
                dev_cp_async16(Ks + ((size_t)buf * FL_KEYS + j) * SM::KPAD + part * VN, blockp + k_off + slot + part * VN,
                               in ? 16 : 0);
                dev_cp_async16(Vs + ((size_t)buf * FL_KEYS + j) * D + part * VN, blockp + v_off + slot + part * VN,
                               in ? 16 : 0);
            }
            dev_cp_commit();
        };
        if (k0 < k1)
            load_tile(k0, 0);
        for (int kt = k0, buf = 0; kt < k1; kt += FL_KEYS, buf ^= 1) {
            if (kt + FL_KEYS < k1)
                load_tile(kt + FL_KEYS, buf ^ 1);
            else
                dev_cp_commit();                   /* an empty group keeps the wait count uniform */
            dev_cp_wait<1>();
            __syncthreads();                       /* tile kt (and the queries) visible to every warp */
            const KT *Kt = Ks + (size_t)buf * FL_KEYS * SM::KPAD, *Vt = Vs + (size_t)buf * FL_KEYS * D;

            /* Scores: lane j, key kt + j, against each of this warp's vectors. */
            float sc[VPW];
#pragma unroll
            for (int i = 0; i < VPW; i++)
                sc[i] = 0.0f;
#pragma unroll 4
            for (int d = 0; d < D; d += VN) {
                float kf[VN];
                dev_unpack16<KT>(*(const uint4 *)(Kt + (size_t)lane * SM::KPAD + d), kf);
#pragma unroll
                for (int i = 0; i < VPW; i++) {
                    const float *qv = Qs + (size_t)(warp + 4 * i) * D + d;
#pragma unroll
                    for (int e = 0; e < VN; e++)
                        sc[i] = fmaf(qv[e], kf[e], sc[i]);
                }
            }
            const int key = kt + lane;
#pragma unroll
            for (int i = 0; i < VPW; i++) {
                const bool valid = key < k1 && key <= vpos[i];
                const float s = valid ? sc[i] * a.scale : -INFINITY;
                const float m_new = fmaxf(m[i], dev_warp_max(s));
                const float corr = m[i] == -INFINITY ? 0.0f : expf(m[i] - m_new);
                const float p = valid ? expf(s - m_new) : 0.0f;
                l[i] = l[i] * corr + dev_warp_sum(p);
                m[i] = m_new;
                Ps[(size_t)(warp + 4 * i) * FL_KEYS + lane] = p;
#pragma unroll
                for (int e = 0; e < DPL; e++)
                    acc[i][e] *= corr;
            }
            __syncwarp();
            /* P.V over the tile's keys that exist. */
            const int nk = min(FL_KEYS, k1 - kt);
            for (int j = 0; j < nk; j++) {
                float vf[DPL];
                dev_smem_load<KT, DPL>(Vt + (size_t)j * D + d0, vf);
#pragma unroll
                for (int i = 0; i < VPW; i++) {
                    const float p = Ps[(size_t)(warp + 4 * i) * FL_KEYS + j];
#pragma unroll
                    for (int e = 0; e < DPL; e++)
                        acc[i][e] = fmaf(p, vf[e], acc[i][e]);
                }
            }
            __syncthreads();                       /* every warp is done with buf before it is refilled */
        }
        dev_cp_wait<0>();

        /* Results: the normalised output (one range), or the range's (m, l, acc) for the merge. */
#pragma unroll
        for (int i = 0; i < VPW; i++) {
            const int v = warp + 4 * i;
            if (vpos[i] < 0)
                continue;
            const int r = v / G, h = g * G + v % G;
            const size_t row = (size_t)(t0 + r) * a.n_heads + h;
            if (a.S == 1) {
                const float inv = 1.0f / l[i];
#pragma unroll
                for (int e = 0; e < DPL; e++)
                    a.out[row * D + d0 + e] = acc[i][e] * inv;
            } else {
                float *pp = a.part + (row * a.S + sidx) * (size_t)(D + 2);
                if (lane == 0) {
                    pp[0] = m[i];
                    pp[1] = l[i];
                }
#pragma unroll
                for (int e = 0; e < DPL; e++)
                    pp[2 + d0 + e] = acc[i][e];
            }
        }
        __syncthreads();                           /* every warp has read s_seq / Qs for this pass */
        for (int r = threadIdx.x; r < NT; r += blockDim.x)
            if (s_seq[r] == cur)
                s_seq[r] = -1;
    }
}

/* Launches the flash kernel: NT rows per block (1 for decode), S key ranges. */
template <typename KT, int DPL, int VPW>
static void s_flash_launch(const cuda_state_t *st, const attn_args_t &a, int NT)
{
    constexpr size_t bytes = fl_smem<KT, 32 * DPL, 4 * VPW>::BYTES;
    const dim3 grid((unsigned)((a.T + NT - 1) / NT), (unsigned)a.n_kv, (unsigned)a.S);
    cuda_launch_large_smem<k_attn_flash<KT, DPL, VPW>>(st, grid, ATTN_WARPS * 32, bytes, a, NT);
}

/* 1 when the flash kernel takes this shape (else the row / tile kernels do). */
static int s_flash_ok(int D, int G) { return (D == 64 || D == 128) && G >= 1 && G <= 16; }

template <typename KT, int DPL>
static void s_flash_dpl(const cuda_state_t *st, const attn_args_t &a, int prefill)
{
    const int G = a.n_heads / a.n_kv;
    if (prefill) {                                 /* FL_VECS vectors: NT = FL_VECS / G rows */
        s_flash_launch<KT, DPL, FL_VECS / 4>(st, a, FL_VECS / G > 0 ? FL_VECS / G : 1);
        return;
    }
    if (G <= 4) s_flash_launch<KT, DPL, 1>(st, a, 1);   /* decode: one row, its G heads */
    else if (G <= 8) s_flash_launch<KT, DPL, 2>(st, a, 1);
    else s_flash_launch<KT, DPL, 4>(st, a, 1);
}

template <typename KT>
static void s_flash(const cuda_state_t *st, const attn_args_t &a, int prefill)
{
    if (a.D == 64) s_flash_dpl<KT, 2>(st, a, prefill);
    else s_flash_dpl<KT, 4>(st, a, prefill);
}

/* ---- dispatch ----------------------------------------------------------------------------------- */

template <typename KT, int DPL>
static void s_rows(const cuda_state_t *st, const attn_args_t &a)
{
    const dim3 grid((unsigned)a.T, (unsigned)a.n_heads, (unsigned)a.S);
    if constexpr (DPL * sizeof(KT) >= 4) {         /* a lane's part is at least one 4-byte word */
        if (a.D == 32 * DPL) {
            cuda_launch(st, k_attn_rows<KT, DPL, true>, grid, ATTN_WARPS * 32, a);
            return;
        }
    }
    cuda_launch(st, k_attn_rows<KT, DPL, false>, grid, ATTN_WARPS * 32, a);
}

template <typename KT>
static void s_rows_dpl(const cuda_state_t *st, const attn_args_t &a)
{
    const int dpl = (a.D + 31) / 32;
    if (dpl <= 1) s_rows<KT, 1>(st, a);
    else if (dpl <= 2) s_rows<KT, 2>(st, a);
    else if (dpl <= 4) s_rows<KT, 4>(st, a);
    else if (dpl <= 8) s_rows<KT, 8>(st, a);
    else s_rows<KT, 16>(st, a);
}

template <typename KT>
static void s_tiles(const cuda_state_t *st, const attn_args_t &a)
{
    const dim3 grid((unsigned)((a.T + TILE_ROWS - 1) / TILE_ROWS), (unsigned)a.n_heads);
    switch (a.D) {
    case 32: cuda_launch(st, k_attn_tiles<KT, 1>, grid, ATTN_WARPS * 32, a); break;
    case 64: cuda_launch(st, k_attn_tiles<KT, 2>, grid, ATTN_WARPS * 32, a); break;
    default: cuda_launch(st, k_attn_tiles<KT, 4>, grid, ATTN_WARPS * 32, a); break;
    }
}

/* The split-KV partials of rh rows x heads in S ranges ([rh][S][D + 2] floats, the backend's
 * scratch), and their merge into out. */
static float *s_part(backend_t *be, cuda_state_t *st, int64_t rh, int S, int D)
{
    return (float *)cuda_scratch(be, (void **)&st->part, &st->part_bytes, (size_t)rh * S * (D + 2) * sizeof(float));
}
static void s_merge(const cuda_state_t *st, const float *part, int64_t rh, int S, int D, float *out)
{
    cuda_launch(st, k_attn_merge, (unsigned)rh, D >= 256 ? 256 : 128, part, S, D, out);
}

/* Split count for decode rows of the tensor-core kernel: key ranges until rows x kv heads x S is
 * about TROUPE_CUDA_ATTN_SPLIT_BLOCKS blocks per SM (default 1; shared by the bf16 and fp8 paths).
 * The partials' writes and the merge cost more than a partly filled GPU: 8B heads over 1,000 keys
 * on an H200, a target of 8 blocks per SM took 44 / 67 / 106 us at batch 16 / 32 / 64, 1 took
 * 27 / 41 / 81 (batch 1: 10.1 against 9.4; batch 1 over 4,000 keys is the exception, 12.9 against
 * 16.8). */
static int s_decode_split(const cuda_state_t *st, int T, int n_kv)
{
    const int64_t base = (int64_t)T * n_kv;
    if (!st->attn_split || base >= 4 * (int64_t)st->n_sm)
        return 1;
    const int64_t S = ((int64_t)st->attn_split_blocks * st->n_sm + base - 1) / base;
    return (int)(S > ATTN_MAX_SPLIT ? ATTN_MAX_SPLIT : S);
}

/* An fp8 cache has only the tensor-core kernels (the fallbacks read 2- and 4-byte elements; both
 * apply the cache's scales, bk_kv_t.scale, by folding K's into the score scale and V's into the
 * output): decode
 * rows (one new row per sequence) go to the decode kernel, every other shape to the prefill kernel,
 * which is correct for any rows (one sequence per pass). The TROUPE_CUDA_ATTN_* switches do not
 * apply. cuda_kv_supported refuses the shapes these kernels cannot take before a pool is made, so
 * a refusal here is a bug: it ends the process like a failed CUDA call. */
static void s_attention_f8(backend_t *be, cuda_state_t *st, const bk_kv_t *kv, int layer, const float *q,
                           int n_heads, float scale, const bk_attn_meta_t *meta, float *out)
{
    const int T = meta->n_tokens, D = kv->head_dim;
    const int verify = T != meta->n_seqs ? cuda_attention_decode_mma_groups(kv, n_heads, meta, st->attn_verify) : 0;
    int rc;
    if (T == meta->n_seqs || verify) {
        const int S = s_decode_split(st, T, kv->n_kv_heads);   /* by rows: a verify block's work grows with its rows */
        float *part = NULL;
        const int64_t rh = (int64_t)T * n_heads;
        if (S > 1)
            part = s_part(be, st, rh, S, D);
        rc = cuda_attention_decode_mma(st, kv, layer, q, n_heads, scale, meta, S, part, out);
        if (rc == 0 && S > 1)
            s_merge(st, part, rh, S, D, out);
    } else {
        rc = cuda_attention_mma(st, kv, layer, q, n_heads, scale, meta, out);
    }
    if (rc != 0) {
        fprintf(stderr, "cuda_attention: fp8 cache with head_dim %d, %d query heads over %d kv heads, %d rows: no kernel "
                        "takes it (%s:%d)\n", D, n_heads, kv->n_kv_heads, T, __FILE__, __LINE__);
        exit(1);
    }
}

int cuda_kv_supported(backend_t *be, dtype_t dtype, int head_dim, int n_heads, int n_kv_heads, char *err, size_t errlen)
{
    if (dtype != DT_F8E4M3)
        return 0;
    bk_kv_t kv = {};
    kv.dtype = dtype;
    kv.head_dim = head_dim;
    kv.n_kv_heads = n_kv_heads;
    if (cuda_mma_attn_group(&kv, n_heads, 16) > 0)
        return 0;
    snprintf(err, errlen, "an fp8 KV cache on CUDA needs head_dim 64 or 128 and at most 16 query heads per kv head "
                          "(this model: head_dim %d, %d query heads over %d kv heads)", head_dim, n_heads, n_kv_heads);
    return -1;
}

void cuda_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q, int n_heads, float scale,
                    const bk_attn_meta_t *meta, float *out)
{
    const int T = meta->n_tokens;
    if (T <= 0)
        return;
    cuda_state_t *st = cuda_st(be);
    /* Several rows per sequence that the tensor-core decode kernel takes by sequence (a speculative
     * verify step, its sequences' one-row decode rows included): > 0, the blocks per kv head. */
    const int verify = T != meta->n_seqs && (kv->dtype == DT_F8E4M3 || (st->attn_flash && st->attn_mma_decode))
                           ? cuda_attention_decode_mma_groups(kv, n_heads, meta, st->attn_verify) : 0;
    const int n1 = meta->n_single;
    if (n1 > 0 && n1 < T && !verify) {
        /* Decode rows beside prompt chunks (a colocated step): one call would send every row to the
         * prefill kernel, whose 16-row tiles then hold 16 sequences' single rows, each pass over a
         * whole context with 1/16 of the tile used: at batch 256 that took several times the decode
         * kernel's time (the served mixed steps' ITL p99). The decode rows go on their own. */
        const size_t row = (size_t)n_heads * kv->head_dim;
        bk_attn_meta_t dm = *meta, pm = *meta;
        dm.n_tokens = dm.n_seqs = n1;
        pm.n_tokens = T - n1;
        pm.n_seqs = meta->n_seqs - n1;
        pm.tok_seq += n1;   /* sequence ids stay absolute: seq_bt_start is shared */
        pm.tok_pos += n1;
        pm.n_single = 0;
        dm.seq_row0 = pm.seq_row0 = NULL;   /* row numbers and sequence ids would need the offsets */
        dm.max_rows = 0;                     /* pm keeps its max_rows: the kernel choice below */
        cuda_attention(be, kv, layer, q, n_heads, scale, &dm, out);
        cuda_attention(be, kv, layer, q + n1 * row, n_heads, scale, &pm, out + n1 * row);
        return;
    }
    attn_args_t a = {};
    cuda_kv_addr(a, kv, layer, meta);
    a.D = kv->head_dim;
    a.q = q;
    a.T = T;
    a.n_heads = n_heads;
    a.scale = scale;
    a.out = out;
    a.S = 1;

    /* The flash kernel for head_dim 64 / 128 (every row shape); else prefill-shaped steps (8+ rows
     * per sequence on average) take the tile kernel and the rest the row kernel. */
    const int D = kv->head_dim, G = n_heads / kv->n_kv_heads;
    /* Prefill-shaped: 8+ rows per sequence on average, or a verify step (a few rows per sequence,
     * max_rows > 1) the decode kernel does not take by sequence (its tensor-core prefill kernel
     * reads a sequence's keys once per 64 query vectors; the flash kernel once per row). */
    const int prefill = !verify && (T >= 8 * meta->n_seqs || (st->attn_verify && meta->max_rows > 1));
    if (kv->dtype == DT_F8E4M3) {
        s_attention_f8(be, st, kv, layer, q, n_heads, scale, meta, out);
        return;
    }
    if (st->attn_flash && s_flash_ok(D, G)) {
        /* Prefill over a bf16 cache: the tensor-core kernel, unless it is off or refuses the shape. */
        if (prefill && st->attn_mma && cuda_attention_mma(st, kv, layer, q, n_heads, scale, meta, out) == 0)
            return;
        if (!prefill)
            a.S = s_decode_split(st, T, kv->n_kv_heads);   /* by rows (a verify block's work grows with its rows) */
        const int64_t rh = (int64_t)T * n_heads;
        if (a.S > 1)
            a.part = s_part(be, st, rh, a.S, D);
        /* Decode (one new row per sequence, or a verify step's rows by sequence) over a bf16 cache: the
         * tensor-core decode kernel, with the same key ranges and merge, unless it is off or refuses
         * the shape. */
        if ((T != meta->n_seqs && !verify) || !st->attn_mma_decode ||
            cuda_attention_decode_mma(st, kv, layer, q, n_heads, scale, meta, a.S, a.part, out) != 0) {
            switch (kv->dtype) {
            case DT_F32: s_flash<float>(st, a, prefill); break;
            case DT_BF16: s_flash<__nv_bfloat16>(st, a, prefill); break;
            case DT_F16: s_flash<__half>(st, a, prefill); break;
            default: break;                        /* fp8 never gets here (s_attention_f8) */
            }
        }
        if (a.S > 1)
            s_merge(st, a.part, rh, a.S, D, out);
        return;
    }
    if (prefill && (D == 32 || D == 64 || D == 128)) {
        switch (kv->dtype) {
        case DT_F32: s_tiles<float>(st, a); break;
        case DT_BF16: s_tiles<__nv_bfloat16>(st, a); break;
        case DT_F16: s_tiles<__half>(st, a); break;
        default: break;
        }
        return;
    }
    /* Split each row's keys until rows x heads x S is about four blocks per SM. */
    const int64_t rh = (int64_t)T * n_heads;
    if (st->attn_split && rh < 2 * (int64_t)st->n_sm) {
        int64_t S = (4 * (int64_t)st->n_sm + rh - 1) / rh;
        a.S = (int)(S > ATTN_MAX_SPLIT ? ATTN_MAX_SPLIT : S);
    }
    if (a.S > 1)
        a.part = s_part(be, st, rh, a.S, D);
    switch (kv->dtype) {
    case DT_F32: s_rows_dpl<float>(st, a); break;
    case DT_BF16: s_rows_dpl<__nv_bfloat16>(st, a); break;
    case DT_F16: s_rows_dpl<__half>(st, a); break;
    default: break;
    }
    if (a.S > 1)
        s_merge(st, a.part, rh, a.S, D, out);
}
