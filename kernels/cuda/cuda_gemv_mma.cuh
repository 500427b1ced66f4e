/* kernels/cuda/cuda_gemv_mma.cuh — the GEMV of bf16 weights on tensor cores (internal to
 * cuda_matmul.cu): y[m][n] = sum_k x[m][k] W[n][k] for up to 8 rows of f32 x at a time.
 *
 * Why: the CUDA-core GEMV (k_gemv_vec) does one f32 FMA per weight per row of x and reads x
 * once per weight chunk per row, so its time grows with M (8B shape on the H200: about 2.6 + 2.15 x M
 * ms per step), and a speculative verify step of k + 1 rows costs nearly k + 1 steps. Here a warp
 * runs mma.sync m16n8k16 with 16 rows of W as the A operand and the x rows as the B operand's
 * columns, so W is read once whatever M is, and one instruction does 16 x 8 x 16 products.
 *
 * Numerics: each activation is the sum of two bf16 numbers, hi = round(x) and lo = round(x - hi)
 * (x - hi is exact in f32), as the split GEMM does: columns 0..7 of one n-tile hold the rows' hi
 * parts, another n-tile's their lo parts, and y = (y_hi + y_lo) per warp; products keep ~16 bits
 * of x, f32 accumulation: within ~1e-5 of f32. A column's result never depends on the other
 * columns, and the summation order depends on K, the warps per block and the step only (fixed
 * numbers, not chosen by N), so a row's bits are the same for any M, for any N, stacked (q|k|v) or not,
 * and in the SwiGLU pairing (batch-invariant, and matmul_n / gate_up_swiglu give the bits of
 * separate matmuls).
 *
 * Layout: W [N][K] row-major, 16-byte aligned rows, K a multiple of 16. A block of W warps owns
 * 16 rows; its warps split K into steps of KS = 64 or 128 (TROUPE_CUDA_GEMV_MMA_KSTEP; warp w
 * takes steps w, w + W, ...) and add their parts in shared memory in warp order. In a step, lane
 * (g = lane / 4, t = lane % 4) loads KS / 4 consecutive k (32 or 64 bytes in 16-byte loads) of rows
 * g and g + 8, and the same k of x's row g: the MMA's logical k index is permuted so that each
 * lane's registers are its own contiguous memory (mma j of the step takes k (KS / 4) t + 4j ..
 * + 3 of every lane as its logical k 2t, 2t + 1, 2t + 8, 2t + 9; A and B use the same permutation,
 * so the dot products are unchanged). The summation order depends on K, W and KS only.
 * The first step's weights are loaded before the PDL wait (weights never change). */
#ifndef TROUPE_KERNELS_CUDA_GEMV_MMA_CUH
#define TROUPE_KERNELS_CUDA_GEMV_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_mma.cuh"
#include "kernels/cuda/cuda_split.cuh"

#define GEMV_MMA_MR 8             /* rows of x per launch: the 8 columns of an n-tile */

/* Word i of n 16-byte chunks. i is a constant after unrolling: registers, no local memory. */
static __device__ __forceinline__ uint32_t dev_word(const uint4 *r, int i)
{
    const uint4 &v = r[i / 4];
    switch (i & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
    }
}

/* This lane's KS / 4 weights of rows g and g + 8 at step s (zeros past K or past the matrix's
 * rows): r[0 .. C) row g, r[C .. 2C) row g + 8, C = KS / 32 chunks of 16 bytes. */
template <int KS>
static __device__ __forceinline__ void dev_mma_gemv_load(uint4 *r, const uint4 *w0, const uint4 *w1, bool l0, bool l1,
                                                         int64_t s, int64_t steps, int64_t K, int t)
{
    constexpr int C = KS / 32;
    const bool in = s < steps && KS * s + (KS / 4) * t < K;
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < C; c++) {
        r[c] = in && l0 ? __ldg(w0 + (KS / 8) * s + c) : z;
        r[C + c] = in && l1 ? __ldg(w1 + (KS / 8) * s + c) : z;
    }
}

/* M <= 8 rows of x, steps of KS k (64 or 128: each lane's KS / 4 consecutive k of a row, 32 or 64
 * bytes; K a multiple of KS / 4), U = 128 / KS steps loaded at once (the same bytes in flight).
 * Plain: block b computes rows 16b .. 16b + 15 of W, written where o says.
 * SWIGLU: w is gate and up stacked ([N = 2I][K]); block b computes gate rows 8b .. 8b + 7 (as the
 * tile's rows 0..7) and the up rows I + 8b .. (rows 8..15), and writes o.y[0][m][n] =
 * swiglu(gate, up): the lane holding a gate row's result holds its up row's too. */
template <int W, int KS, bool SWIGLU>
__global__ void __launch_bounds__(W * 32)
    k_gemv_mma(const float *__restrict__ x, int M, const __nv_bfloat16 *__restrict__ w, int64_t N, int64_t K,
               split_args_t o)
{
    static_assert(KS == 64 || KS == 128, "steps of 64 or 128 k");
    constexpr int U = 128 / KS, C = KS / 32, L = KS / 4;   /* steps at once, chunks per row, k per lane */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int64_t r0, r1;
    bool l0, l1;
    if constexpr (SWIGLU) {
        const int64_t I = N / 2, b = (int64_t)blockIdx.x * 8 + g;
        r0 = b, r1 = I + b, l0 = l1 = b < I;
    } else {
        r0 = (int64_t)blockIdx.x * 16 + g, r1 = r0 + 8, l0 = r0 < N, l1 = r1 < N;
    }
    const uint4 *w0 = (const uint4 *)(w + (l0 ? r0 : 0) * K) + C * t;
    const uint4 *w1 = (const uint4 *)(w + (l1 ? r1 : 0) * K) + C * t;
    const int64_t steps = (K + KS - 1) / KS;
    uint4 wa[U][2 * C];
#pragma unroll
    for (int u = 0; u < U; u++)
        dev_mma_gemv_load<KS>(wa[u], w0, w1, l0, l1, warp + (int64_t)u * W, steps, K, t);
    DEV_PDL_ENTER();
    const bool xrow = g < M;
    const float *xr = x + (int64_t)(xrow ? g : 0) * K + L * t;
    float hi[4] = {0.0f, 0.0f, 0.0f, 0.0f}, lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s = warp; s < steps; s += (int64_t)U * W) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t su = s + (int64_t)u * W;
            if (su >= steps)
                break;
            float xf[L];
            if (xrow && KS * su + L * t < K) {
                const float4 *xp = (const float4 *)(xr + KS * su);
#pragma unroll
                for (int q = 0; q < L / 4; q++) {
                    const float4 v = xp[q];
                    xf[4 * q] = v.x, xf[4 * q + 1] = v.y, xf[4 * q + 2] = v.z, xf[4 * q + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int q = 0; q < L; q++)
                    xf[q] = 0.0f;
            }
            uint32_t bh[L / 2], bl[L / 2];
#pragma unroll
            for (int i = 0; i < L / 2; i++) {
                bh[i] = dev_pack_bf16x2(xf[2 * i], xf[2 * i + 1]);
                bl[i] = dev_pack_bf16x2(xf[2 * i] - dev_bf16x2_lo(bh[i]), xf[2 * i + 1] - dev_bf16x2_hi(bh[i]));
            }
#pragma unroll
            for (int j = 0; j < L / 4; j++) {   /* mma j: the lane's k 4j .. 4j + 3 as logical 2t, 2t+1, 2t+8, 2t+9 */
                const uint32_t a[4] = {dev_word(wa[u], 2 * j), dev_word(wa[u] + C, 2 * j), dev_word(wa[u], 2 * j + 1),
                                       dev_word(wa[u] + C, 2 * j + 1)};
                dev_mma16<false>(hi, a, bh[2 * j], bh[2 * j + 1]);
                dev_mma16<false>(lo, a, bl[2 * j], bl[2 * j + 1]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)   /* the next pass's loads, before their first use */
            dev_mma_gemv_load<KS>(wa[u], w0, w1, l0, l1, s + (int64_t)(U + u) * W, steps, K, t);
    }
    /* c[0..1]: row r0, x rows 2t and 2t + 1; c[2..3]: row r1, the same x rows. */
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        v[i] = hi[i] + lo[i];
    __shared__ float part[W][4][32];
#pragma unroll
    for (int i = 0; i < 4; i++)
        part[warp][i][lane] = v[i];
    __syncthreads();
    if (warp != 0)
        return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < W; k++)
            sum += part[k][i][lane];
        v[i] = sum;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int m = 2 * t + i;
        if (m >= M)
            continue;
        if constexpr (SWIGLU) {
            if (l0)
                o.y[0][m * (N / 2) + r0] = dev_swiglu(v[i], v[2 + i]);
        } else {
            if (l0)
                *dev_split_dst(o, m, r0) = v[i];
            if (l1)
                *dev_split_dst(o, m, r1) = v[2 + i];
        }
    }
}

/* Whether the tensor-core GEMV takes these bf16 weights and activations (aligned rows, K % 16). */
static inline bool cuda_gemv_mma_ok(const void *w, const float *x, int64_t K)
{
    return (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0 && K % 16 == 0;
}

/* y = x W^T for M rows, in launches of up to 8 rows (rows are independent: chunks change no bits),
 * with `warps` (4 or 8) warps per block and steps of `kstep` k (128 when K is a multiple of 32,
 * else 64). SWIGLU: y.y[0] is [M][N / 2], as k_gemv_mma says. */
template <bool SWIGLU>
static void cuda_gemv_mma(const cuda_state_t *st, int warps, int kstep, const float *x, int M, const __nv_bfloat16 *w,
                          int64_t N, int64_t K, const split_args_t &y)
{
    const int64_t rows_per_block = SWIGLU ? 8 : 16, rows = SWIGLU ? N / 2 : N;
    const dim3 blocks((unsigned)((rows + rows_per_block - 1) / rows_per_block)), threads(warps * 32);
    const bool k128 = kstep == 128 && K % 32 == 0;
    for (int m0 = 0; m0 < M; m0 += GEMV_MMA_MR) {
        const int mr = M - m0 < GEMV_MMA_MR ? M - m0 : GEMV_MMA_MR;
        const float *xm = x + (int64_t)m0 * K;
        split_args_t ym = y;
        for (int p = 0; p < y.parts; p++)
            ym.y[p] += (int64_t)m0 * (SWIGLU ? rows : y.end[p] - (p ? y.end[p - 1] : 0));
        if (warps == 4 && k128)
            cuda_launch(st, k_gemv_mma<4, 128, SWIGLU>, blocks, threads, xm, mr, w, N, K, ym);
        else if (warps == 4)
            cuda_launch(st, k_gemv_mma<4, 64, SWIGLU>, blocks, threads, xm, mr, w, N, K, ym);
        else if (k128)
            cuda_launch(st, k_gemv_mma<8, 128, SWIGLU>, blocks, threads, xm, mr, w, N, K, ym);
        else
            cuda_launch(st, k_gemv_mma<8, 64, SWIGLU>, blocks, threads, xm, mr, w, N, K, ym);
    }
}

#endif
