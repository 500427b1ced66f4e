/* kernels/cuda/cuda_moe_quant.cuh — decoding the codes of quantized MoE experts in registers
 * (internal: cuda_moe_quant.cu's FMA kernels, cuda_moe_gemm.cu's grouped GEMMs and cuda_quant.cu's
 * dequantization of a dense weight for the bf16 GEMM), every value
 * exact before the block scale:
 *   fp8 e4m3: the hardware's e4m3x2 -> f16x2 convert, two codes per instruction (NaN stays NaN);
 *   int8: the byte as a signed integer;
 *   int4 (value + 8, element 2j in the low nibble of byte j): nibble pairs OR-ed into the mantissa
 *     of f16 1024, then one HSUB2 / HFMA2 per two codes: n - 8;
 *   fp4 e2m1 (bit 3 sign, bits 1-2 exponent, bit 0 mantissa): the exponent and mantissa bits moved
 *     to f16 bits 9-11 and the sign to bit 15, which is the value times 2^-14 exactly (subnormals
 *     included); mq_dec_scale says so, and the caller multiplies the block scale by it (the scale
 *     times 2^14 is exact, so code * that scale rounds once, as the CPU's value * scale).
 * The 4-bit decodes are cuda_qcodes.cuh's, shared with the dense GEMV. The block scale is applied
 * by the caller. */
#ifndef TROUPE_KERNELS_CUDA_MOE_QUANT_CUH
#define TROUPE_KERNELS_CUDA_MOE_QUANT_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_qcodes.cuh"

/* 4-bit codes, two per byte. */
__host__ __device__ constexpr bool mq_nib(int fmt) { return fmt == BK_Q_I4 || fmt == BK_Q_FP4; }

/* Values in a 16-byte chunk of codes: 16 bytes or 32 nibbles. */
__host__ __device__ constexpr int mq_chunk_values(int fmt) { return mq_nib(fmt) ? 32 : 16; }

/* What a decoded value is to be multiplied by besides its block scale (fp4: 2^14). */
template <int FMT> __device__ __forceinline__ constexpr float mq_dec_scale() { return FMT == BK_Q_FP4 ? 16384.0f : 1.0f; }

/* Values 16 p .. 16 p + 15 of a 16-byte chunk as f32, before the scale (and mq_dec_scale): p = 0
 * for one-byte codes, 0 or 1 for nibbles. */
template <int FMT> __device__ __forceinline__ void mq_dec16(const uint4 &q, int p, float *w)
{
    const uint32_t ws[4] = {q.x, q.y, q.z, q.w};
    if constexpr (FMT == BK_Q_FP8) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const __half2_raw h =
                __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(ws[i / 2] >> (16 * (i % 2))), __NV_E4M3);
            const float2 f = __half22float2(*(const __half2 *)&h);
            w[2 * i] = f.x;
            w[2 * i + 1] = f.y;
        }
    } else if constexpr (FMT == BK_Q_I8) {
#pragma unroll
        for (int i = 0; i < 16; i++)
            w[i] = (float)(int8_t)(uint8_t)(ws[i / 4] >> (8 * (i % 4)));
    } else if constexpr (FMT == BK_Q_I4) {
        qc_dec8_i4(ws[2 * p], w);
        qc_dec8_i4(ws[2 * p + 1], w + 8);
    } else {
        qc_dec8_fp4(ws[2 * p], w);
        qc_dec8_fp4(ws[2 * p + 1], w + 8);
    }
}

/* Values 16 p .. 16 p + 15 of a 16-byte chunk as f16 pairs (value 2h in the low half of h2[h]), each
 * the code's true value exactly (fp8 e4m3 values, integers of int8 / int4 and e2m1 values are all
 * f16 values): fp8 by the hardware's e4m3x2 -> f16x2 convert alone. */
template <int FMT> __device__ __forceinline__ void mq_dec16_h2(const uint4 &q, int p, uint32_t *h2)
{
    if constexpr (FMT == BK_Q_FP8) {
        const uint32_t ws[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const __half2_raw h =
                __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(ws[i / 2] >> (16 * (i % 2))), __NV_E4M3);
            h2[i] = (uint32_t)h.x | (uint32_t)h.y << 16;
        }
    } else {
        float f[16];
        mq_dec16<FMT>(q, p, f);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const __half2 h = __floats2half2_rn(f[2 * i] * mq_dec_scale<FMT>(), f[2 * i + 1] * mq_dec_scale<FMT>());
            h2[i] = *(const uint32_t *)&h;
        }
    }
}

/* Element i of a row of codes as f32, its true value (no mq_dec_scale), before the block scale. */
template <int FMT> __device__ __forceinline__ float mq_dec1(const uint8_t *row, int64_t i)
{
    if constexpr (FMT == BK_Q_FP8) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)row[i], __NV_E4M3);
        return __half2float(__half(h));
    } else if constexpr (FMT == BK_Q_I8) {
        return (float)(int8_t)row[i];
    } else {
        const unsigned n = (i & 1) ? row[i / 2] >> 4 : row[i / 2] & 15u;
        if constexpr (FMT == BK_Q_I4)
            return (float)((int)n - 8);
        const unsigned e = (n >> 1) & 3u, m = n & 1u;  /* e2m1: 0, 0.5 (subnormal), 1 .. 6 */
        const float mag = e == 0 ? 0.5f * (float)m : ldexpf(1.0f + 0.5f * (float)m, (int)e - 1);
        return (n & 8u) ? -mag : mag;
    }
}

/* x / s as the activation's code (an fp8 value, or an integer in [-127, 127]): cpu_quant_act_row's
 * rounding (a NaN stays). */
__device__ __forceinline__ float mq_code(float x, float s, int act)
{
    float q = x / s;
    if (isnan(q))
        return q;
    if (act == BK_QA_FP8_TOKEN) {
        __nv_fp8_e4m3 f;
        f.__x = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);   /* f32_to_f8e4m3's rounding in range */
        return (float)f;
    }
    return rintf(fminf(fmaxf(q, -127.0f), 127.0f));
}

/* ---- the per-token activation fake-quantization (bk_mat_t.qact) ---- */

/* Row `row` of x [][K] by one block (k_moe_qrow, k_moe_sort_qact), cpu_quant_act_row: the row's amax, its scale s = amax / 448 (fp8) or / 127
 * (int8), each element's code q. CODES: q as f16 (exact: fp8 values and integers up to 127 are
 * f16 values; the grouped GEMMs' W8A8 operands) into codes and s into scale, so q * s is the CPU's
 * value; else q * s into out. A zero row stays (codes: x itself, scale 1); a non-finite amax gives
 * NaN. In place (out = x) is safe: each thread reads the elements it writes, after the barrier of
 * the amax. */
template <bool CODES>
__device__ __forceinline__ void mq_qrow(const float *x, int64_t K, int act, int64_t row, float *out, uint16_t *codes,
                                        float *scale)
{
    __shared__ float red[32];
    const float *xr = x + row * K;
    float amax = 0.0f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
        amax = fmaxf(amax, fabsf(xr[k]));
    amax = dev_block_max(amax, red);
    const float nan = __int_as_float(0x7fc00000), s = act == BK_QA_FP8_TOKEN ? amax / 448.0f : amax / 127.0f;
    if (CODES && threadIdx.x == 0)
        scale[row] = amax == 0.0f ? 1.0f : !isfinite(amax) ? nan : s;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
        const float xv = xr[k];
        float v = xv;
        if (amax != 0.0f) {
            v = !isfinite(amax) ? nan : mq_code(xv, s, act);
            if (!CODES && !isnan(v))
                v *= s;
        }
        if constexpr (CODES)
            codes[row * K + k] = __half_as_ushort(__float2half_rn(v));
        else
            out[row * K + k] = v;
    }
}

#endif
