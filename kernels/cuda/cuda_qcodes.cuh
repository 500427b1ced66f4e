/* kernels/cuda/cuda_qcodes.cuh — the 4-bit code decoders every quantized kernel shares (internal:
 * cuda_qgemv.cuh's dense GEMV, cuda_moe_quant.cuh's expert kernels and dequantization): 8 codes of
 * a word to 8 f32 values before the block scale, each exact, with no table and no conversion-pipe
 * work per element. One copy, so that the GEMV, the experts and the bf16 dequantization decode the
 * same bits the same way.
 *   int4 (value + 8, element i at bits 4i): nibble pairs (i, i + 4) OR-ed into the mantissa of f16
 *     1024 (or 1024 + 16 n for the high nibble of a byte), then minus 1032 (or / 16 - 72): n - 8;
 *   fp4 e2m1 (bit 3 sign, bits 1-2 exponent, bit 0 mantissa): the exponent and mantissa bits moved
 *     to f16 bits 9-11 and the sign to bit 15, which is the value times 2^-14 exactly (subnormals
 *     included); the caller folds the 2^14 into the block scale (exact). */
#ifndef TROUPE_KERNELS_CUDA_QCODES_CUH
#define TROUPE_KERNELS_CUDA_QCODES_CUH

#include <cuda_fp16.h>
#include <stdint.h>

/* int4: the 8 nibbles of q, in order. */
__device__ __forceinline__ void qc_dec8_i4(uint32_t q, float *w)
{
    const uint32_t q8 = q >> 8;
    const uint32_t r[4] = {(q & 0x000f000fu) | 0x64006400u, (q & 0x00f000f0u) | 0x64006400u,
                           (q8 & 0x000f000fu) | 0x64006400u, (q8 & 0x00f000f0u) | 0x64006400u};
    const __half2 sub = __floats2half2_rn(1032.0f, 1032.0f), mul = __floats2half2_rn(0.0625f, 0.0625f),
                  add = __floats2half2_rn(-72.0f, -72.0f);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const __half2 h = *(const __half2 *)&r[j];
        const float2 f = __half22float2(j % 2 ? __hfma2(h, mul, add) : __hsub2(h, sub));
        w[j] = f.x;                                /* elements j (low half) and j + 4 (high half) */
        w[j + 4] = f.y;
    }
}

/* fp4: the 8 nibbles of q, in order, each times 2^-14. */
__device__ __forceinline__ void qc_dec8_fp4(uint32_t q, float *w)
{
    const uint32_t r[4] = {((q & 0x00070007u) << 9) | ((q & 0x00080008u) << 12),
                           ((q & 0x00700070u) << 5) | ((q & 0x00800080u) << 8),
                           ((q & 0x07000700u) << 1) | ((q & 0x08000800u) << 4),
                           ((q & 0x70007000u) >> 3) | (q & 0x80008000u)};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 f = __half22float2(*(const __half2 *)&r[j]);
        w[j] = f.x;
        w[j + 4] = f.y;
    }
}

#endif
