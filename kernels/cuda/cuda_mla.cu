/* kernels/cuda/cuda_mla.cu — DeepSeek-V3's ops on the GPU: MLA's RoPE, compressed-cache store and
 * absorbed attention (prefill and decode alike), the per-head matmul, add and the sigmoid
 * group-limited MoE router. Semantics: kernels/backend.h (the DeepSeek-V3 block); the CPU
 * reference is kernels/cpu/cpu_mla.c.
 *
 * Where the arithmetic differs from the CPU: dot products are summed by warps (lane partial sums,
 * then a butterfly), not in index order; the latent's RMSNorm sums its squares per thread in
 * double, then across the block. Results agree to f32 rounding, not bit for bit
 * (tests/gpu/test_mla_cuda.c compares them).
 *
 * Attention is the absorbed form FlashMLA runs: one block per (row, head); its warps score the
 * keys of a tile (one key per warp at a time, lanes over the kv_lora + rope values), the block
 * keeps the online softmax, and every thread accumulates its share of the kv_lora latent output.
 * A straightforward kernel, not FlashMLA's tensor-core one. */
#include <float.h>
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"

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

/* One (row, head) per block: q in shared memory, the keys of a tile scored by the warps, the
 * online softmax over tiles, each thread accumulating latent dims threadIdx.x, +blockDim.x, ... */
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

void cuda_mla_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q_lat, const float *q_pe,
                        int n_heads, int kv_lora, int rope_dim, float scale, const bk_attn_meta_t *meta, float *out)
{
    if (meta->n_tokens <= 0)
        return;
    if (kv_lora + rope_dim > MLA_MAX_W)
        cuda_die("cuda_mla_attention", "kv_lora_rank + qk_rope_head_dim exceeds 1024", __FILE__, __LINE__);
    const mla_addr_t a = s_addr(kv, layer, meta);
    const cuda_state_t *st = cuda_st(be);
    const unsigned grid = (unsigned)meta->n_tokens * (unsigned)n_heads;
    switch (kv->dtype) {
    case DT_F32: cuda_launch(st, k_mla_attention<float>, grid, MLA_THREADS, a, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, out); break;
    case DT_BF16: cuda_launch(st, k_mla_attention<__nv_bfloat16>, grid, MLA_THREADS, a, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, out); break;
    case DT_F8E4M3: cuda_launch(st, k_mla_attention<__nv_fp8_e4m3>, grid, MLA_THREADS, a, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, out); break;
    default: cuda_launch(st, k_mla_attention<__half>, grid, MLA_THREADS, a, q_lat, q_pe, n_heads, kv_lora, rope_dim, scale, out); break;
    }
}

/* One warp per output element (m, h, n): lanes over k, a butterfly sum. */
template <typename WT>
__global__ void k_head_matmul(const float *x, int M, int n_heads, int x_stride, int x_head, const WT *w, int N, int K,
                              float *y, int y_stride, int y_head)
{
    DEV_PDL_ENTER();
    const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (gw >= (int64_t)M * n_heads * N)
        return;
    const int n = (int)(gw % N), h = (int)((gw / N) % n_heads), m = (int)(gw / ((int64_t)N * n_heads));
    const float *xv = x + (int64_t)m * x_stride + (int64_t)h * x_head;
    const WT *row = w + ((int64_t)h * N + n) * K;
    float s = 0;
    for (int k = lane; k < K; k += 32)
        s += xv[k] * s_ld(row + k);
    s = dev_warp_sum(s);
    if (lane == 0)
        y[(int64_t)m * y_stride + (int64_t)h * y_head + n] = s;
}

void cuda_head_matmul(backend_t *be, const float *x, int M, int n_heads, int x_stride, int x_head, const bk_mat_t *w,
                      float *y, int y_stride, int y_head)
{
    const int N = (int)(w->rows / n_heads), K = (int)w->cols;
    const int64_t warps = (int64_t)M * n_heads * N;
    if (warps <= 0)
        return;
    const cuda_state_t *st = cuda_st(be);
    const unsigned grid = (unsigned)((warps * 32 + 255) / 256);
    switch (w->dtype) {
    case DT_F32: cuda_launch(st, k_head_matmul<float>, grid, 256, x, M, n_heads, x_stride, x_head, (const float *)w->data, N, K, y, y_stride, y_head); break;
    case DT_BF16: cuda_launch(st, k_head_matmul<__nv_bfloat16>, grid, 256, x, M, n_heads, x_stride, x_head, (const __nv_bfloat16 *)w->data, N, K, y, y_stride, y_head); break;
    default: cuda_launch(st, k_head_matmul<__half>, grid, 256, x, M, n_heads, x_stride, x_head, (const __half *)w->data, N, K, y, y_stride, y_head); break;
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

#define ROUTE_MAX_E 1024

/* One row per block; thread 0 selects (E and k are small), the others compute the scores. */
__global__ void k_moe_route_sigmoid(const float *logits, const float *bias, int E, int k, int n_group, int topk_group,
                                    int renorm, float scale, int32_t *ids, float *weights)
{
    DEV_PDL_ENTER();
    __shared__ float s[ROUTE_MAX_E], choice[ROUTE_MAX_E], gs[ROUTE_MAX_E];
    __shared__ int keep[ROUTE_MAX_E];
    const int t = blockIdx.x, per = E / n_group;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float x = logits[(int64_t)t * E + e];
        s[e] = 1.0f / __fadd_rn(1.0f, expf(-x));
        choice[e] = __fadd_rn(s[e], bias[e]);
    }
    __syncthreads();
    for (int g = threadIdx.x; g < n_group; g += blockDim.x) {
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
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    for (int j = 0; j < topk_group; j++) {
        int best = -1;
        for (int g = 0; g < n_group; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best]))
                best = g;
        keep[best] = 1;
    }
    for (int e = 0; e < E; e++)
        if (!keep[e / per])
            choice[e] = 0.0f;
    int32_t *id = ids + (int64_t)t * k;
    float *w = weights + (int64_t)t * k, sum = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken |= id[i] == e;
            if (!taken && (best < 0 || choice[e] > choice[best]))
                best = e;
        }
        id[j] = best;
        w[j] = s[best];
        sum += w[j];
    }
    for (int j = 0; j < k; j++)
        w[j] = __fmul_rn(renorm ? w[j] / (sum + 1e-20f) : w[j], scale);
}

void cuda_moe_route_sigmoid(backend_t *be, const float *logits, const float *bias, int M, int E, int k, int n_group,
                            int topk_group, int renorm, float scale, int32_t *ids, float *weights)
{
    if (M <= 0)
        return;
    if (E > ROUTE_MAX_E)
        cuda_die("cuda_moe_route_sigmoid", "more than 1024 routed experts", __FILE__, __LINE__);
    cuda_launch(cuda_st(be), k_moe_route_sigmoid, M, 128, logits, bias, E, k, n_group, topk_group, renorm, scale, ids,
                weights);
}
