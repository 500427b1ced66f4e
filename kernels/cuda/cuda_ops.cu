/* kernels/cuda/cuda_ops.cu — the elementwise and per-row ops on the GPU: embedding, RMSNorm (+
 * residual), per-head RMSNorm, RoPE, SwiGLU, row gather, argmax. Semantics: kernels/backend.h.
 *
 * Arithmetic matches the CPU reference operation for operation: products and sums that the CPU
 * rounds separately are written with __fmul_rn / __fadd_rn so nvcc cannot fuse them into an FMA;
 * the RMSNorm sum of squares is in double like the CPU's (only its summation order differs);
 * sqrtf, division, expf, cosf and sinf are the accurate versions (no fast math). So these ops
 * agree with the CPU to a few ulp, not bit for bit (libm and CUDA's expf/cosf/sinf may differ in
 * the last place).
 */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"

/* ---- embedding ------------------------------------------------------------------------------- */

template <typename T>
__global__ void k_embed(const T *table, const int32_t *ids, int64_t H, float *out)
{
    DEV_PDL_ENTER();
    const int t = blockIdx.x;
    const T *row = table + (int64_t)ids[t] * H;
    float *o = out + (int64_t)t * H;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
        o[i] = dev_to_f32(row[i]);
}

void cuda_embed(backend_t *be, const bk_mat_t *table, const int32_t *ids, int n, float *out)
{
    if (n <= 0)
        return;
    const cuda_state_t *st = cuda_st(be);
    const int64_t H = table->cols;
    switch (table->dtype) {
    case DT_F32: cuda_launch(st, k_embed<float>, n, 256, (const float *)table->data, ids, H, out); break;
    case DT_BF16: cuda_launch(st, k_embed<__nv_bfloat16>, n, 256, (const __nv_bfloat16 *)table->data, ids, H, out); break;
    default: cuda_launch(st, k_embed<__half>, n, 256, (const __half *)table->data, ids, H, out); break;
    }
}

/* ---- RMSNorm ------------------------------------------------------------------------------------ */

/* Sum of a double over the block; every thread gets the total. blockDim.x a multiple of 32, <= 1024. */
__device__ double dev_block_sum(double v)
{
    __shared__ double warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = dev_warp_sum(v);
    __syncthreads();                               /* warp_sums may still be read by a previous call */
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    double t = lane < n_warps ? warp_sums[lane] : 0.0;
    return dev_warp_sum(t);
}

/* add_rmsnorm's first pass over 4 elements at i: r += x (when x), written back. Returns the
 * updated elements (their squares are added by the caller: dev_sq4). */
__device__ __forceinline__ float4 dev_add4(float *r, const float *xr, int i)
{
    float4 v = *(const float4 *)(r + i);
    if (xr) {
        const float4 d = *(const float4 *)(xr + i);
        v = make_float4(__fadd_rn(v.x, d.x), __fadd_rn(v.y, d.y), __fadd_rn(v.z, d.z), __fadd_rn(v.w, d.w));
        *(float4 *)(r + i) = v;
    }
    return v;
}

/* The 4 elements' squares in double, summed left to right (the sum the caller adds to ss). */
__device__ __forceinline__ double dev_sq4(float4 v)
{
    return (double)v.x * (double)v.x + (double)v.y * (double)v.y + (double)v.z * (double)v.z + (double)v.w * (double)v.w;
}

/* Its second pass: o = w * (v * scale) for the 4 elements at i. */
__device__ __forceinline__ void dev_norm4(float *o, int i, float4 v, float4 wv, float scale)
{
    *(float4 *)(o + i) = make_float4(__fmul_rn(wv.x, __fmul_rn(v.x, scale)), __fmul_rn(wv.y, __fmul_rn(v.y, scale)),
                                     __fmul_rn(wv.z, __fmul_rn(v.z, scale)), __fmul_rn(wv.w, __fmul_rn(v.w, scale)));
}

/* One row per block: res += x (when x), then out = w * (res * 1/sqrt(mean(res^2) + eps)). Each
 * element is read, updated and normalised by the same thread, so out may alias res. V4: 4
 * consecutive elements per thread (16-byte accesses; H % 4 == 0 and 16-byte aligned rows), the
 * same arithmetic per element (the double sum of squares may differ in its last bit, which the
 * f32 variance hides but for ties).
 * Rows up to NORM_CACHE float4 per thread (H <= 16,384 at 1,024 threads) keep their elements and
 * the norm's weights in registers: the weights are loaded before the PDL wait (they never change)
 * and the elements are not read back after the sum. A single-row step (batch-1 decode) is a chain
 * of two dependent rounds of loads around a block reduction; ncu put it at 4.3 us a call. */
#define NORM_CACHE 4
template <bool V4>
__global__ void k_add_rmsnorm(float *res, const float *x, const float *w, int H, float eps, float *out)
{
    float *r = res + (int64_t)blockIdx.x * H;
    const float *xr = x ? x + (int64_t)blockIdx.x * H : NULL;
    float *o = out + (int64_t)blockIdx.x * H;
    const bool cached = V4 && H <= 4 * NORM_CACHE * (int)blockDim.x;
    float4 vc[NORM_CACHE], wc[NORM_CACHE];
    if (V4 && cached) {
#pragma unroll
        for (int c = 0; c < NORM_CACHE; c++) {
            const int i = 4 * (threadIdx.x + c * blockDim.x);
            if (i < H)
                wc[c] = *(const float4 *)(w + i);
        }
    }
    DEV_PDL_ENTER();
    double ss = 0;
    if (V4 && cached) {                            /* the loop below, its elements kept */
#pragma unroll
        for (int c = 0; c < NORM_CACHE; c++) {
            const int i = 4 * (threadIdx.x + c * blockDim.x);
            if (i >= H)
                break;
            vc[c] = dev_add4(r, xr, i);
            ss += dev_sq4(vc[c]);
        }
    } else if constexpr (V4) {
        for (int i = 4 * threadIdx.x; i < H; i += 4 * blockDim.x)
            ss += dev_sq4(dev_add4(r, xr, i));
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) {
            float v = r[i];
            if (xr) {
                v = __fadd_rn(v, xr[i]);
                r[i] = v;
            }
            ss += (double)v * (double)v;
        }
    }
    ss = dev_block_sum(ss);
    const float var = (float)(ss / H);
    const float scale = 1.0f / sqrtf(var + eps);
    if (V4 && cached) {
#pragma unroll
        for (int c = 0; c < NORM_CACHE; c++) {
            const int i = 4 * (threadIdx.x + c * blockDim.x);
            if (i >= H)
                break;
            dev_norm4(o, i, vc[c], wc[c], scale);
        }
    } else if constexpr (V4) {
        for (int i = 4 * threadIdx.x; i < H; i += 4 * blockDim.x)
            dev_norm4(o, i, *(const float4 *)(r + i), *(const float4 *)(w + i), scale);
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x)
            o[i] = __fmul_rn(w[i], __fmul_rn(r[i], scale));
    }
}

void cuda_add_rmsnorm(backend_t *be, float *res, const float *x, const float *w, int M, int H, float eps, float *out)
{
    if (M <= 0)
        return;
    const bool v4 = H % 4 == 0 && ((uintptr_t)res | (uintptr_t)x | (uintptr_t)w | (uintptr_t)out) % 16 == 0;
    const int per = v4 ? H / 4 : H;                /* elements (or groups of 4) per row */
    const int threads = per >= 4096 ? 1024 : per >= 1024 ? 512 : per >= 256 ? 256 : 128;
    if (v4)
        cuda_launch(cuda_st(be), k_add_rmsnorm<true>, M, threads, res, x, w, H, eps, out);
    else
        cuda_launch(cuda_st(be), k_add_rmsnorm<false>, M, threads, res, x, w, H, eps, out);
}

/* One warp per head vector, in place. */
__global__ void k_head_rmsnorm(float *x, const float *w, int64_t rows, int D, float eps)
{
    DEV_PDL_ENTER();
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    float *v = x + r * D;
    double ss = 0;
    for (int i = lane; i < D; i += 32)
        ss += (double)v[i] * (double)v[i];
    ss = dev_warp_sum(ss);
    const float var = (float)(ss / D);
    const float scale = 1.0f / sqrtf(var + eps);
    for (int i = lane; i < D; i += 32)
        v[i] = __fmul_rn(w[i], __fmul_rn(v[i], scale));
}

void cuda_head_rmsnorm(backend_t *be, float *x, const float *w, int M, int n_heads, int head_dim, float eps)
{
    const int64_t rows = (int64_t)M * n_heads;
    if (rows <= 0)
        return;
    const int per_block = 8;
    cuda_launch(cuda_st(be), k_head_rmsnorm, (unsigned)((rows + per_block - 1) / per_block), per_block * 32, x, w, rows,
                head_dim, eps);
}

/* ---- RoPE --------------------------------------------------------------------------------------- */

/* One token per block: the angles of its position once in shared memory, then every head. */
__global__ void k_rope(float *x, const int32_t *pos, const float *inv_freq, int n_heads, int D)
{
    DEV_PDL_ENTER();
    __shared__ float c[BK_MAX_HEAD_DIM / 2], s[BK_MAX_HEAD_DIM / 2];
    const int t = blockIdx.x, half = D / 2;
    const float p = (float)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float a = __fmul_rn(p, inv_freq[i]);       /* f32 product, as HF's inv_freq @ position_ids */
        sincosf(a, &s[i], &c[i]);                 /* the same values as sinf and cosf, one reduction */
    }
    __syncthreads();
    float *row = x + (int64_t)t * n_heads * D;
    for (int j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
        const int h = j / half, i = j % half;
        float *v = row + (int64_t)h * D;
        const float lo = v[i], hi = v[i + half];
        v[i] = __fsub_rn(__fmul_rn(lo, c[i]), __fmul_rn(hi, s[i]));
        v[i + half] = __fadd_rn(__fmul_rn(hi, c[i]), __fmul_rn(lo, s[i]));
    }
}

void cuda_rope(backend_t *be, float *x, const int32_t *pos, const float *inv_freq, int M, int n_heads, int head_dim)
{
    if (M <= 0)
        return;
    cuda_launch(cuda_st(be), k_rope, M, 256, x, pos, inv_freq, n_heads, head_dim);
}

/* ---- SwiGLU ------------------------------------------------------------------------------------- */

/* out may alias gate or up: each element is read before it is written, by one thread. V4: 4
 * elements per thread (n % 4 == 0, 16-byte aligned arrays), the same arithmetic. */
template <bool V4>
__global__ void k_swiglu(const float *gate, const float *up, int64_t n, float *out)
{
    DEV_PDL_ENTER();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if constexpr (V4) {
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += stride) {
            const float4 g = ((const float4 *)gate)[i], u = ((const float4 *)up)[i];
            ((float4 *)out)[i] = make_float4(dev_swiglu(g.x, u.x), dev_swiglu(g.y, u.y), dev_swiglu(g.z, u.z),
                                             dev_swiglu(g.w, u.w));
        }
    } else {
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            out[i] = dev_swiglu(gate[i], up[i]);
    }
}

void cuda_swiglu(backend_t *be, const float *gate, const float *up, int n, float *out)
{
    if (n <= 0)
        return;
    const bool v4 = n % 4 == 0 && ((uintptr_t)gate | (uintptr_t)up | (uintptr_t)out) % 16 == 0;
    const int work = v4 ? n / 4 : n;
    int blocks = (work + 255) / 256;
    blocks = blocks > 8192 ? 8192 : blocks;
    if (v4)
        cuda_launch(cuda_st(be), k_swiglu<true>, blocks, 256, gate, up, (int64_t)n, out);
    else
        cuda_launch(cuda_st(be), k_swiglu<false>, blocks, 256, gate, up, (int64_t)n, out);
}

/* ---- gather ------------------------------------------------------------------------------------- */

__global__ void k_gather(const float *src, const int32_t *rows, int cols, float *dst)
{
    DEV_PDL_ENTER();
    const float *s = src + (int64_t)rows[blockIdx.x] * cols;
    float *d = dst + (int64_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        d[c] = s[c];
}

void cuda_launch_gather(const cuda_state_t *st, const float *src, const int32_t *rows, int n, int cols, float *dst)
{
    if (n <= 0)
        return;
    cuda_launch(st, k_gather, n, cols >= 1024 ? 512 : 128, src, rows, cols, dst);
}

void cuda_gather_rows(backend_t *be, const float *src, const int32_t *rows, int n, int cols, float *dst)
{
    cuda_launch_gather(cuda_st(be), src, rows, n, cols, dst);
}

/* ---- argmax ------------------------------------------------------------------------------------- */

/* A candidate: the largest value seen and its index; found == 0 until a non-NaN value is seen. */
struct dev_best {
    float v;
    int i;
    int found;
};

/* The better of two candidates: the larger value, the lower index on a tie; a NaN is never taken. */
__device__ __forceinline__ dev_best dev_better(dev_best a, dev_best b)
{
    if (!b.found)
        return a;
    if (!a.found)
        return b;
    if (b.v > a.v || (b.v == a.v && b.i < a.i))
        return b;
    return a;
}

__global__ void k_argmax(const float *x, int N, int32_t *out)
{
    DEV_PDL_ENTER();
    __shared__ dev_best warp_best[32];
    const float *r = x + (int64_t)blockIdx.x * N;
    dev_best b = {-INFINITY, 0, 0};
    for (int i = threadIdx.x; i < N; i += blockDim.x) {   /* ascending i: strict > keeps the lowest index */
        const float v = r[i];
        if (v != v)
            continue;
        if (!b.found || v > b.v) {
            b.v = v;
            b.i = i;
            b.found = 1;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        dev_best o;
        o.v = __shfl_down_sync(0xffffffffu, b.v, off);
        o.i = __shfl_down_sync(0xffffffffu, b.i, off);
        o.found = __shfl_down_sync(0xffffffffu, b.found, off);
        b = dev_better(b, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    if (lane == 0)
        warp_best[warp] = b;
    __syncthreads();
    if (threadIdx.x == 0) {
        dev_best t = warp_best[0];
        for (int w = 1; w < n_warps; w++)
            t = dev_better(t, warp_best[w]);
        out[blockIdx.x] = t.found ? t.i : 0;       /* an all-NaN row gives 0 */
    }
}

void cuda_argmax(backend_t *be, const float *x, int M, int N, int32_t *out)
{
    if (M <= 0)
        return;
    cuda_launch(cuda_st(be), k_argmax, M, 1024, x, N, out);
}
