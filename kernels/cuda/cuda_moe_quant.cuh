/* kernels/cuda/cuda_moe_quant.cuh — decoding the one-byte codes of quantized MoE experts in
 * registers (internal: cuda_moe_quant.cu's FMA kernels and cuda_moe_gemm.cu's grouped GEMMs).
 * fp8 e4m3 -> f16 is exact (NaN stays NaN): the hardware's e4m3x2 -> f16x2 convert, two codes per
 * instruction, as cuda_qgemv.cuh's qv_dec8_fp8 does; int8 is the byte as a signed integer. The
 * block scale is applied by the caller. */
#ifndef TROUPE_KERNELS_CUDA_MOE_QUANT_CUH
#define TROUPE_KERNELS_CUDA_MOE_QUANT_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kernels/backend.h"

/* The 16 codes of a 16-byte chunk as f32, before the scale. */
template <int FMT> __device__ __forceinline__ void mq_dec16(const uint4 &q, float *w)
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
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++)
            w[i] = (float)(int8_t)(uint8_t)(ws[i / 4] >> (8 * (i % 4)));
    }
}

/* One code as f32, before the scale. */
template <int FMT> __device__ __forceinline__ float mq_dec1(uint8_t c)
{
    if constexpr (FMT == BK_Q_FP8) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
        return __half2float(__half(h));
    } else {
        return (float)(int8_t)c;
    }
}

#endif
