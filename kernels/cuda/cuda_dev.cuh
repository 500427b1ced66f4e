/* kernels/cuda/cuda_dev.cuh — device helpers shared by the CUDA kernels (internal): element
 * conversions in the CPU reference's rounding, warp reductions. */
#ifndef TROUPE_KERNELS_CUDA_DEV_CUH
#define TROUPE_KERNELS_CUDA_DEV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

/* Programmatic dependent launch: wait until the previous kernel in the stream has completed and
 * its writes are visible (a no-op when this kernel was launched without PDL), then let the next
 * kernel start launching. Every kernel runs this before it reads or writes activations, caches
 * or outputs (cuda.h, cuda_launch); only immutable weights may be read before it. */
#define DEV_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define DEV_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define DEV_PDL_ENTER()                                                                                   \
    do {                                                                                                  \
        DEV_PDL_WAIT();                                                                                   \
        DEV_PDL_TRIGGER();                                                                                \
    } while (0)

__device__ __forceinline__ float dev_to_f32(float v) { return v; }

__device__ __forceinline__ float dev_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float dev_to_f32(__half v) { return __half2float(v); }

/* f32 -> bf16 bits exactly as common/dtype.h's f32_to_bf16: round to nearest even, NaN stays a
 * quiet NaN with its sign and high payload. */
__device__ __forceinline__ uint16_t dev_bf16_bits(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* v clamped to f16's largest finite value (comparisons are false for NaN: NaN stays NaN), so a
 * large activation rounds to +-65504 rather than inf when it becomes an f16 GEMM operand. */
__device__ __forceinline__ float dev_f16_sat(float v)
{
    return v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
}

/* An activation as a 16-bit GEMM operand, round to nearest even: bf16 bits (dev_bf16_bits) or f16
 * bits, saturated. */
template <bool F16> __device__ __forceinline__ uint16_t dev_to16(float v)
{
    if constexpr (F16)
        return __half_as_ushort(__float2half_rn(dev_f16_sat(v)));
    else
        return dev_bf16_bits(v);
}

/* silu(g) * u in the CPU's arithmetic (cuda_swiglu, the GEMV's SwiGLU epilogue, mlp_swiglu). */
__device__ __forceinline__ float dev_swiglu(float g, float u)
{
    const float silu = g / __fadd_rn(1.0f, expf(-g));
    return __fmul_rn(silu, u);
}
__device__ __forceinline__ void dev_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void dev_store(__nv_bfloat16 *p, float v)
{
    *(uint16_t *)p = dev_bf16_bits(v);
}
__device__ __forceinline__ void dev_store(__half *p, float v) { *p = __float2half_rn(v); }   /* round to nearest even */
/* fp8 e4m3 as common/dtype.h's f32_to_f8e4m3: round to nearest even, clamp to +-448, NaN -> 0x7f. */
__device__ __forceinline__ void dev_store(__nv_fp8_e4m3 *p, float v)
{
    p->__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

/* Attention kernels take a tile of rows whose (sequence, position) sit in shared memory (sequence
 * -1: no row, or one already done) one sequence per pass: the sequence of the first row left and
 * its rows' largest position (*max_pos), or -1 when none is left. Reads shared memory only. */
__device__ __forceinline__ int dev_next_pass(const int *s_seq, const int *s_pos, int n, int *max_pos)
{
    int cur = -1, mp = -1;
    for (int r = 0; r < n; r++)
        if (s_seq[r] >= 0 && cur < 0)
            cur = s_seq[r];
    for (int r = 0; cur >= 0 && r < n; r++)
        if (s_seq[r] == cur)
            mp = max(mp, s_pos[r]);
    *max_pos = mp;
    return cur;
}

template <typename T> __device__ __forceinline__ T dev_warp_sum(T v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

template <typename T> __device__ __forceinline__ T dev_warp_max(T v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* The block's max of v (fmaxf: NaN skipped, as the CPU's comparison does) to every thread; red is
 * shared, at least blockDim.x / 32 floats; blockDim.x a multiple of 32. Exact in any order. */
__device__ __forceinline__ float dev_block_max(float v, float *red)
{
    v = dev_warp_max(v);
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float w = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        w = dev_warp_max(w);
        if (threadIdx.x == 0)
            red[0] = w;
    }
    __syncthreads();
    return red[0];
}

/* N consecutive elements at p (N * sizeof(T) = 4, 8 or 16 bytes, p aligned to that) as floats,
 * in one load through the read-only path. */
template <typename T, int N> __device__ __forceinline__ void dev_load_vec(const T *p, float *out)
{
    constexpr int BYTES = N * (int)sizeof(T), WORDS = BYTES / 4;
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "a vector of 4, 8 or 16 bytes");
    uint32_t w[WORDS];
    if constexpr (WORDS == 4) {
        const uint4 v = __ldg((const uint4 *)p);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (WORDS == 2) {
        const uint2 v = __ldg((const uint2 *)p);
        w[0] = v.x, w[1] = v.y;
    } else {
        w[0] = __ldg((const unsigned int *)p);
    }
#pragma unroll
    for (int j = 0; j < WORDS; j++) {
        if constexpr (sizeof(T) == 4) {
            out[j] = __uint_as_float(w[j]);
        } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            out[2 * j] = __uint_as_float(w[j] << 16);              /* element 2j is the low half */
            out[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        } else {
            __half2 h;
            memcpy(&h, &w[j], 4);
            const float2 f = __half22float2(h);
            out[2 * j] = f.x;
            out[2 * j + 1] = f.y;
        }
    }
}

/* The 16 / sizeof(T) elements of one 16-byte chunk as floats. */
template <typename T> __device__ __forceinline__ void dev_unpack16(uint4 v, float *out)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if constexpr (sizeof(T) == 4) {
            out[j] = __uint_as_float(w[j]);
        } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            out[2 * j] = __uint_as_float(w[j] << 16);
            out[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        } else {
            __half2 h;
            memcpy(&h, &w[j], 4);
            const float2 f = __half22float2(h);
            out[2 * j] = f.x;
            out[2 * j + 1] = f.y;
        }
    }
}

#endif
