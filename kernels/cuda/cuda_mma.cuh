/* kernels/cuda/cuda_mma.cuh — device helpers of the tensor-core kernels (internal): cp.async,
 * ldmatrix, mma.sync m16n8k16 bf16 / f16, bf16x2 and f16x2 packing (sm_80+) and fp8 e4m3 -> f16 tiles (sm_89+). Used by the flash kernel's tile
 * loads (cuda_attention.cu), the prefill kernel (cuda_attention_mma.cu) and the decode kernel
 * (cuda_attention_decode_mma.cu); the fragment layouts are the PTX ISA's, written next to each. */
#ifndef TROUPE_KERNELS_CUDA_MMA_CUH
#define TROUPE_KERNELS_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"

/* 16 bytes global -> shared without passing through registers (L2 only, .cg); src_bytes < 16
 * zero-fills the rest (0: all zeros, the source is not read). */
static __device__ __forceinline__ void dev_cp_async16(void *smem, const void *gmem, int src_bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
static __device__ __forceinline__ void dev_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> static __device__ __forceinline__ void dev_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 b16 matrices: lanes 8i..8i+7 give the row addresses of matrix i; register i of lane l
 * receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (lower column in the low
 * half). .trans: register i receives rows 2 (l % 4), 2 (l % 4) + 1 of column l / 4 instead. */
static __device__ __forceinline__ void dev_ldsm_x4(const void *p, uint32_t r[4])
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
static __device__ __forceinline__ void dev_ldsm_x4_trans(const void *p, uint32_t r[4])
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* Two floats as bf16 (round to nearest even): lo in the low half, hi in the high half. */
static __device__ __forceinline__ uint32_t dev_pack_bf16x2(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
static __device__ __forceinline__ float dev_bf16x2_lo(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float dev_bf16x2_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* Two floats as f16 (round to nearest even): lo in the low half. */
static __device__ __forceinline__ uint32_t dev_pack_f16x2(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* The 16-bit operand type of the attention kernels' mma: bf16 over a bf16 cache, f16 over an fp8
 * one (F16). Packing, the mma, and the two halves back as floats. */
template <bool F16> static __device__ __forceinline__ uint32_t dev_pack2(float lo, float hi)
{
    return F16 ? dev_pack_f16x2(lo, hi) : dev_pack_bf16x2(lo, hi);
}
/* c += A B, A 16x16 row-major, B 16x8 column-major, T (bf16 or f16) in, f32 accumulators. With g =
 * lane / 4 and t = lane % 4: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] =
 * A[g+8][2t+8..]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; c[0..1] = C[g][2t, 2t+1], c[2..3] =
 * C[g+8][2t, 2t+1]. f16 serves the fp8 cache's kernels (fp8 e4m3 -> f16 is one exact cvt per pair,
 * where bf16 would need three, and the conversion unit, 16 results per clock per SM, would bound an
 * fp8 decode step). */
#define DEV_MMA_M16N8K16(T)                                                                               \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
                 "{%8, %9}, {%0, %1, %2, %3};\n"                                                         \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <bool F16> static __device__ __forceinline__ void dev_mma16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    if constexpr (F16)
        DEV_MMA_M16N8K16("f16");
    else
        DEV_MMA_M16N8K16("bf16");
}
template <bool F16> static __device__ __forceinline__ float dev_lo2(uint32_t w)
{
    return F16 ? __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))) : dev_bf16x2_lo(w);
}
template <bool F16> static __device__ __forceinline__ float dev_hi2(uint32_t w)
{
    return F16 ? __half2float(__ushort_as_half((unsigned short)(w >> 16))) : dev_bf16x2_hi(w);
}

/* Two fp8 e4m3 values (the low 16 bits of w, element 0 in the low byte) as f16x2, exactly. */
static __device__ __forceinline__ uint32_t dev_e4m3x2_f16x2(uint32_t w)
{
    const __half2_raw x = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    return (uint32_t)x.x | ((uint32_t)x.y << 16);
}

/* Rows [0, rows) of D fp8 e4m3 elements at src (row stride src_stride bytes, 16-byte aligned) into
 * f16 rows at dst (row stride dst_stride elements, 16-byte aligned), shared memory to shared
 * memory, exactly (every e4m3 value, subnormals and NaN included, is an f16 value), by threads tid =
 * 0..n_threads-1 together (the caller synchronises before and after). */
template <int D>
static __device__ __forceinline__ void dev_f8_rows_to_f16(const uint8_t *src, int src_stride, uint16_t *dst,
                                                          int dst_stride, int rows, int tid, int n_threads)
{
    constexpr int CH = D / 16;                     /* 16-byte fp8 chunks per row */
    for (int c = tid; c < rows * CH; c += n_threads) {
        const int r = c / CH, part = c % CH;
        const uint4 in = *(const uint4 *)(src + (size_t)r * src_stride + part * 16);
        const uint32_t w[4] = {in.x, in.y, in.z, in.w};
        uint32_t h[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {              /* element pair j: bytes 2j, 2j + 1 -> low, high half */
            h[j] = dev_e4m3x2_f16x2(w[j / 2] >> (16 * (j & 1)));
        }
        uint4 *d = (uint4 *)(dst + (size_t)r * dst_stride + part * 16);
        d[0] = make_uint4(h[0], h[1], h[2], h[3]);
        d[1] = make_uint4(h[4], h[5], h[6], h[7]);
    }
}

/* Host: the caches and head shapes both tensor-core attention kernels take (a bf16 or fp8 cache,
 * head_dim 64 or 128, whole GQA groups of at most max_g query heads): the group size, or 0. */
static inline int cuda_mma_attn_group(const bk_kv_t *kv, int n_heads, int max_g)
{
    const int D = kv->head_dim, n_kv = kv->n_kv_heads;
    if ((kv->dtype != DT_BF16 && kv->dtype != DT_F8E4M3) || (D != 64 && D != 128) || n_kv <= 0 ||
        n_heads % n_kv != 0)
        return 0;
    const int G = n_heads / n_kv;
    return G >= 1 && G <= max_g ? G : 0;
}

#endif
