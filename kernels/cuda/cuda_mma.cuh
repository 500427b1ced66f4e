/* kernels/cuda/cuda_mma.cuh — device helpers of the tensor-core kernels (internal): cp.async,
 * ldmatrix, mma.sync m16n8k16 bf16 and bf16x2 packing (sm_80+). Used by the flash kernel's tile
 * loads (cuda_attention.cu), the prefill kernel (cuda_attention_mma.cu) and the decode kernel
 * (cuda_attention_decode_mma.cu); the fragment layouts are the PTX ISA's, written next to each. */
#ifndef TROUPE_KERNELS_CUDA_MMA_CUH
#define TROUPE_KERNELS_CUDA_MMA_CUH

#include <stdint.h>

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

/* c += A B, A 16x16 row-major, B 16x8 column-major, bf16 in, f32 accumulators. With g = lane / 4
 * and t = lane % 4: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] =
 * A[g+8][2t+8..]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; c[0..1] = C[g][2t, 2t+1], c[2..3] =
 * C[g+8][2t, 2t+1]. */
static __device__ __forceinline__ void dev_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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

/* Host: the caches and head shapes both tensor-core attention kernels take (a bf16 cache, head_dim
 * 64 or 128, whole GQA groups of at most max_g query heads): the group size, or 0. */
static inline int cuda_mma_attn_group(const bk_kv_t *kv, int n_heads, int max_g)
{
    const int D = kv->head_dim, n_kv = kv->n_kv_heads;
    if (kv->dtype != DT_BF16 || (D != 64 && D != 128) || n_kv <= 0 || n_heads % n_kv != 0)
        return 0;
    const int G = n_heads / n_kv;
    return G >= 1 && G <= max_g ? G : 0;
}

#endif
