/* kernels/cuda/cuda_quant.cu — y = x W^T for quantized W (kernels/backend.h's bk_mat_t qfmt): fp8,
 * int8, int4 and nvfp4 weights, every scale grid, optional per-token activation fake-quantization.
 *
 * Small M (decode, M <= gemv_max_m): a weight-only GEMV that reads the packed codes once and
 * dequantizes in registers: one warp per output row, each lane loads 16 bytes of codes at a time
 * (16 fp8/int8 values, 32 nibbles), QG_U loads in flight, decodes them (fp8 by the hardware's
 * convert, int by arithmetic, fp4 through a table in shared memory), multiplies by the block's
 * scale and accumulates against up to 4 rows of x in f32.
 * Larger M (prefill): the weight is dequantized to bf16 into scratch and the bf16 GEMM runs
 * (cuda_matmul's cuBLASLt path): the weight is read once per call either way, and the tensor cores
 * do the rest. With qact, x is first fake-quantized per row into scratch (the CPU's arithmetic).
 *
 * Semantics against the CPU reference (cpu_quant.c): the same dequantized f32 weight; the GEMV sums
 * in another order (f32, within rounding); the GEMM path rounds the dequantized weight to bf16
 * (relative 2^-9 per element) and follows the bf16 GEMM's activation rules.
 *
 * Known limits: no FP8 tensor-core (cuBLASLt FP8) GEMM yet: W8A8 checkpoints run the fake-quantized
 * activations through the bf16 path; moe_ffn does not take quantized experts (quant_moe 0). */
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"

#define QG_WARPS 8
#define QG_MB 4
#define QG_U 4        /* 16-byte code loads in flight per lane */

/* The 256 (or 16) code values of fmt, as cpu_quant_code gives them. */
__device__ __forceinline__ void dev_qtable(int fmt, float *tab)
{
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        float v;
        if (fmt == BK_Q_FP8) {
            __nv_fp8_e4m3 f;
            f.__x = (__nv_fp8_storage_t)i;
            v = (float)f;
        } else if (fmt == BK_Q_I8) {
            v = (float)(int8_t)i;
        } else if (fmt == BK_Q_I4) {
            v = (float)((i & 15) - 8);
        } else {
            const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
            v = (i & 8) ? -mag[i & 7] : mag[i & 7];
        }
        tab[i] = v;
    }
}

/* Code c of row `row` (bytes of that row). */
__device__ __forceinline__ float dev_qcode(const float *tab, bool nib, const uint8_t *row, int64_t c)
{
    if (!nib)
        return tab[row[c]];
    const uint8_t b = row[c >> 1];
    return tab[(c & 1) ? b >> 4 : b & 15];
}

/* 16 bytes of codes -> the CH = 16 (bytes) or 32 (nibbles) values they hold, times their scales
 * (s0 for the first 16 values, s1 for the next 16). fp8 through the hardware's e4m3 -> f16 convert
 * (exact), int8 / int4 by arithmetic, fp4 through the block's table. */
template <int FMT>
__device__ __forceinline__ void dev_qdecode16(uint4 q, float s0, float s1, const float *tab, float *w)
{
    const uint32_t qs[4] = {q.x, q.y, q.z, q.w};
    if constexpr (FMT == BK_Q_FP8) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(qs[i / 2] >> (16 * (i % 2))), __NV_E4M3);
            const float2 f = __half22float2(*(const __half2 *)&h);
            w[2 * i] = f.x * s0;
            w[2 * i + 1] = f.y * s0;
        }
    } else if constexpr (FMT == BK_Q_I8) {
#pragma unroll
        for (int i = 0; i < 16; i++)
            w[i] = (float)(int8_t)(qs[i / 4] >> (8 * (i % 4))) * s0;
    } else {
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const uint32_t nib = (qs[i / 8] >> (4 * (i % 8))) & 15u;
            const float v = FMT == BK_Q_I4 ? (float)((int)nib - 8) : tab[nib];
            w[i] = v * (i < 16 ? s0 : s1);
        }
    }
}

/* VEC: 16-byte code loads, K a multiple of the chunk (16 values of bytes, 32 of nibbles) and the
 * scale groups a multiple of 16 values (or the row). Each lane keeps QG_U chunks in flight. */
template <bool VEC, int FMT>
__global__ void k_qgemv(const uint8_t *codes, const float *scale, int64_t N, int64_t K, int gr, int gc,
                        const float *x, int M, const float *bias, float *y)
{
    __shared__ float tab[256];
    dev_qtable(FMT, tab);
    __syncthreads();
    DEV_PDL_ENTER();
    constexpr bool nib = FMT == BK_Q_I4 || FMT == BK_Q_FP4;
    constexpr int CH = nib ? 32 : 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * QG_WARPS + warp;
    if (n >= N)
        return;
    const uint8_t *row = codes + (nib ? n * K / 2 : n * K);
    const int64_t ngc = (K + gc - 1) / gc;
    const float *srow = scale + (n / gr) * ngc;
    for (int m0 = 0; m0 < M; m0 += QG_MB) {
        const int mb = M - m0 < QG_MB ? M - m0 : QG_MB;
        float acc[QG_MB] = {0.0f, 0.0f, 0.0f, 0.0f};
        if constexpr (VEC) {
            for (int64_t c0 = (int64_t)lane * CH; c0 < K; c0 += (int64_t)32 * CH * QG_U) {
                uint4 q[QG_U];
                float s0[QG_U], s1[QG_U];
#pragma unroll
                for (int u = 0; u < QG_U; u++) {   /* every load first: QG_U in flight per lane */
                    const int64_t c = c0 + (int64_t)u * 32 * CH;
                    if (c < K) {
                        q[u] = __ldg((const uint4 *)(row + (nib ? c / 2 : c)));
                        s0[u] = srow[c / gc];
                        s1[u] = nib ? srow[(c + 16) / gc] : s0[u];
                    }
                }
#pragma unroll
                for (int u = 0; u < QG_U; u++) {
                    const int64_t c = c0 + (int64_t)u * 32 * CH;
                    if (c >= K)
                        break;
                    float w[CH];
                    dev_qdecode16<FMT>(q[u], s0[u], s1[u], tab, w);
#pragma unroll
                    for (int j = 0; j < QG_MB; j++) {
                        if (j < mb) {
                            const float4 *xv = (const float4 *)(x + (int64_t)(m0 + j) * K + c);
#pragma unroll
                            for (int i = 0; i < CH / 4; i++) {
                                const float4 v = xv[i];
                                acc[j] += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
                            }
                        }
                    }
                }
            }
        } else {
            for (int64_t c = lane; c < K; c += 32) {
                const float w = dev_qcode(tab, nib, row, c) * srow[c / gc];
#pragma unroll
                for (int j = 0; j < QG_MB; j++)
                    if (j < mb)
                        acc[j] += w * x[(int64_t)(m0 + j) * K + c];
            }
        }
#pragma unroll
        for (int j = 0; j < QG_MB; j++) {
            float v = acc[j];
            for (int o = 16; o > 0; o /= 2)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && j < mb)
                y[(int64_t)(m0 + j) * N + n] = v + (bias ? bias[n] : 0.0f);
        }
    }
}

template <int FMT>
static void s_qgemv(const cuda_state_t *st, const bk_mat_t *w, const float *x, int M, const float *bias, float *y)
{
    const int64_t N = w->rows, K = w->cols;
    constexpr int CH = FMT == BK_Q_I4 || FMT == BK_Q_FP4 ? 32 : 16;
    const bool vec = K % CH == 0 && (w->qgc % 16 == 0 || w->qgc >= K) && ((uintptr_t)w->data % 16) == 0 &&
                     ((uintptr_t)x % 16) == 0;
    const dim3 grid((unsigned)((N + QG_WARPS - 1) / QG_WARPS)), block(32 * QG_WARPS);
    if (vec)
        cuda_launch(st, k_qgemv<true, FMT>, grid, block, (const uint8_t *)w->data, w->qscale, N, K, (int)w->qgr,
                    (int)w->qgc, x, M, bias, y);
    else
        cuda_launch(st, k_qgemv<false, FMT>, grid, block, (const uint8_t *)w->data, w->qscale, N, K, (int)w->qgr,
                    (int)w->qgc, x, M, bias, y);
}

/* The dequantized weight as bf16 [N][K] (round to nearest even). */
__global__ void k_qdequant_bf16(const uint8_t *codes, const float *scale, int fmt, int64_t N, int64_t K, int gr, int gc,
                                uint16_t *out)
{
    __shared__ float tab[256];
    dev_qtable(fmt, tab);
    __syncthreads();
    DEV_PDL_ENTER();
    const bool nib = fmt == BK_Q_I4 || fmt == BK_Q_FP4;
    const int64_t ngc = (K + gc - 1) / gc, total = N * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / K, c = i % K;
        const uint8_t *row = codes + (nib ? n * K / 2 : n * K);
        out[i] = dev_bf16_bits(dev_qcode(tab, nib, row, c) * scale[(n / gr) * ngc + c / gc]);
    }
}

/* cpu_quant_act_row per row: one block per row. */
__global__ void k_qact(const float *x, int64_t K, int act, float *out)
{
    DEV_PDL_ENTER();
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * K;
    float *o = out + (int64_t)blockIdx.x * K;
    float amax = 0.0f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
        amax = fmaxf(amax, fabsf(xr[k]));          /* fmaxf skips NaN, as the CPU's comparison does */
    for (int off = 16; off > 0; off /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        for (int off = 16; off > 0; off /= 2)
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (threadIdx.x == 0)
            red[0] = v;
    }
    __syncthreads();
    amax = red[0];
    const bool plain = amax == 0.0f;
    const bool bad = !isfinite(amax);
    const float s = act == BK_QA_FP8_TOKEN ? amax / 448.0f : amax / 127.0f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
        if (plain) {
            o[k] = xr[k];
            continue;
        }
        if (bad) {
            o[k] = __int_as_float(0x7fc00000);
            continue;
        }
        float q = xr[k] / s;
        if (isnan(q)) {
            o[k] = q;
            continue;
        }
        if (act == BK_QA_FP8_TOKEN) {
            __nv_fp8_e4m3 f;
            f.__x = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
            q = (float)f;
        } else {
            q = rintf(fminf(fmaxf(q, -127.0f), 127.0f));
        }
        o[k] = q * s;
    }
}

void cuda_qmatmul(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y)
{
    if (M <= 0)
        return;
    cuda_state_t *st = cuda_st(be);
    const int64_t N = w->rows, K = w->cols;
    if (w->qact) {
        float *xq = (float *)cuda_scratch(be, &st->quant_x, &st->quant_x_bytes, (size_t)M * (size_t)K * 4);
        cuda_launch(st, k_qact, dim3((unsigned)M), dim3(256), x, K, (int)w->qact, xq);
        x = xq;
    }
    if (M <= st->gemv_max_m) {
        switch (w->qfmt) {
        case BK_Q_FP8: s_qgemv<BK_Q_FP8>(st, w, x, M, bias, y); break;
        case BK_Q_I8: s_qgemv<BK_Q_I8>(st, w, x, M, bias, y); break;
        case BK_Q_I4: s_qgemv<BK_Q_I4>(st, w, x, M, bias, y); break;
        default: s_qgemv<BK_Q_FP4>(st, w, x, M, bias, y); break;
        }
        return;
    }
    uint16_t *wb = (uint16_t *)cuda_scratch(be, &st->quant_w, &st->quant_w_bytes, (size_t)N * (size_t)K * 2);
    const int64_t total = N * K;
    const unsigned blocks = (unsigned)((total + 255) / 256 < 65535 * 4 ? (total + 255) / 256 : 65535 * 4);
    cuda_launch(st, k_qdequant_bf16, dim3(blocks), dim3(256), (const uint8_t *)w->data, w->qscale, (int)w->qfmt, N, K,
                (int)w->qgr, (int)w->qgc, wb);
    const bk_mat_t plain = {.data = wb, .dtype = DT_BF16, .rows = N, .cols = K};
    cuda_matmul(be, x, M, &plain, bias, y);
}
