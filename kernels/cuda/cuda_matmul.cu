/* kernels/cuda/cuda_matmul.cu — y[M][N] = x[M][K] W^T (+ bias) on the GPU, two ways.
 *
 * Few rows (M <= gemv_max_m, default 8: decode steps, small experts): bf16 weights from 2 rows
 * take the tensor-core GEMV (cuda_gemv_mma.cuh: W read once whatever M is, activations as bf16
 * hi + lo, ~1e-5 of f32); one row, and f32 / f16 weights, take our CUDA-core GEMV kernel. W's row n
 * is streamed once with 16-byte loads (several in flight per lane) by 1, 4 or 8 warps (1: a warp
 * per row, 8 rows per block; 4 or 8: the warps of a block split the row's K and add their parts in
 * shared memory, in warp order — more, shorter work units, so the last wave of a 4096- or
 * 14336-row matrix leaves fewer SMs idle; s_gemv_warps picks 4 or 8 by the matrix's rows),
 * converting bf16/f16 to f32 in registers and doing f32 FMAs against the f32 activations; lane
 * partial sums are combined by a butterfly of shuffles. The first pass's weight loads are issued
 * before the PDL wait: weights never change, so they stream while the previous kernel ends.
 * Numerics: exact f32 products of the stored weights and the f32 activations, f32 accumulation —
 * the CPU's arithmetic in another summation order (relative difference ~1e-6). The order depends
 * on K, N (the warps) and W's alignment only, so a row's result is bit-identical for any M on this
 * path (batch-invariant within it). A batch-1 decode step is bound by reading W: this kernel is
 * what the HBM bound measures.
 *
 * Many rows: the library. f32 weights: cublasSgemm with pedantic math (no TF32): plain f32.
 * bf16 / f16 weights, M <= gemm_split_max_m (TROUPE_CUDA_GEMM_SPLIT, default 32: decode batches,
 * short prompts, where reading W is the cost): each activation is written as the sum of two 16-bit
 * numbers, hi = round(x) and lo = round(x - hi) (x - hi is exact in f32), stacked as 2M rows of
 * ONE cuBLASLt GEMM (tensor cores, f32 accumulation, W read once), and y = y_hi + y_lo: each
 * product keeps ~16 bits of the activation, so results are within ~1e-5 of f32 — the price is
 * twice the tensor-core work, which only shows once M is large enough to be compute-bound. Above
 * that many rows (prefill chunks, large decode batches: compute-bound, where the split costs up to
 * 2x), the activations are rounded once to the weights' type — bf16 activations with f32
 * accumulation, as vLLM, SGLang and TensorRT-LLM run (round to nearest even; f16 saturates at
 * +-65504 so a large activation cannot become inf): ~1e-3 relative per matmul, which on the bf16
 * fixture compounds to ~1.5e-2 in the logits (measured; the split: 2e-5). cuBLASLt picks its kernel by shape, so this path is NOT batch-invariant:
 * a row's bits can change with M, and differ from the same row computed on the GEMV path. The
 * bias is added after the product (f32 add, as the CPU).
 *
 * Plans (descriptors + the heuristic's algorithm) are cached by (dtype, rows, N, K, alignments),
 * so the per-step cost is the conversion launch, cublasLtMatmul and (split) the sum of halves.
 * cuda_matmul_n (backend.h matmul_n) runs several weights over one x (q, k, v; gate, up) with ONE
 * conversion: at batch 256 the 7 conversions per layer were 12% of an 8B decode step's kernel time
 * (ncu, tools/gpu-profile.sh), now 4, each with 16-byte loads.
 * Should the heuristic offer no algorithm, cublasGemmEx with the same types runs instead.
 */
#include <stdio.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_split.cuh"
#include "kernels/cuda/cuda_gemv_mma.cuh"

#define GEMV_THREADS 256          /* 8 warps per block */
#define GEMV_UNROLL 4             /* 16-byte chunks of W in flight per lane */
#define GEMV_MR 8                 /* rows of x per launch (more rows: several launches) */

/* ---- GEMV ------------------------------------------------------------------------------------- */

/* W rows and x rows 16-byte aligned, K a multiple of 16 / sizeof(WT) and of 4. W warps per output
 * row (1, 4 or 8), so a block covers 8 / W rows. Row n's result goes where o says (one part: y[m][n]).
 * SWIGLU (W == 4 only: two rows per block): w is gate and up stacked ([N = 2I][K]); block b computes
 * rows b (gate) and I + b (up) and writes o.y[0][m][b] = silu(gate) * up with k_swiglu's arithmetic,
 * so the result is bit-identical to this kernel's two rows followed by the swiglu op. */
template <typename WT, int MR, int W, bool SWIGLU = false>
__global__ void __launch_bounds__(GEMV_THREADS)
    k_gemv_vec(const float *x, const WT *__restrict__ w, int64_t N, int64_t K, split_args_t o)
{
    static_assert(!SWIGLU || W == 4, "the SwiGLU pairing needs two rows per block");
    constexpr int VE = 16 / (int)sizeof(WT);       /* weights per 16-byte chunk */
    constexpr int RPB = GEMV_THREADS / 32 / W;     /* rows per block */
    constexpr int STEP = W * 32 * GEMV_UNROLL;     /* chunks of a row per pass of its W warps */
    __shared__ float part[GEMV_THREADS / 32][MR];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, seg = warp % W;
    const int64_t n = SWIGLU ? (int64_t)blockIdx.x + (warp / W) * (N / 2) : (int64_t)blockIdx.x * RPB + warp / W;
    const bool live = n < N;                       /* a dead warp still reaches the barrier */
    const uint4 *wr = (const uint4 *)(w + (live ? n : 0) * K);
    const int64_t chunks = live ? K / VE : 0;
    int64_t c0 = seg * 32 + lane;
    uint4 raw[GEMV_UNROLL];
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++)          /* the first pass's weights: immutable, so they */
        if (c0 + W * 32 * u < chunks)              /* may stream before the previous kernel is done */
            raw[u] = __ldg(wr + c0 + W * 32 * u);
    DEV_PDL_ENTER();
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        acc[m] = 0.0f;
    while (c0 < chunks) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int64_t c = c0 + W * 32 * u;
            if (c >= chunks)
                break;
            float wf[VE];
            dev_unpack16<WT>(raw[u], wf);
#pragma unroll
            for (int m = 0; m < MR; m++) {
                const float4 *xp = (const float4 *)(x + m * K + c * VE);
#pragma unroll
                for (int q = 0; q < VE / 4; q++) {
                    const float4 xv = xp[q];
                    acc[m] = fmaf(xv.x, wf[4 * q + 0], acc[m]);
                    acc[m] = fmaf(xv.y, wf[4 * q + 1], acc[m]);
                    acc[m] = fmaf(xv.z, wf[4 * q + 2], acc[m]);
                    acc[m] = fmaf(xv.w, wf[4 * q + 3], acc[m]);
                }
            }
        }
        c0 += STEP;
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)      /* the next pass's loads, all before their first use */
            if (c0 + W * 32 * u < chunks)
                raw[u] = __ldg(wr + c0 + W * 32 * u);
    }
#pragma unroll
    for (int m = 0; m < MR; m++)
        acc[m] = dev_warp_sum(acc[m]);
    if constexpr (W == 1) {
        if (live && lane == 0) {
#pragma unroll
            for (int m = 0; m < MR; m++)
                *dev_split_dst(o, m, n) = acc[m];
        }
    } else {
        if (lane == 0) {
#pragma unroll
            for (int m = 0; m < MR; m++)
                part[warp][m] = acc[m];
        }
        __syncthreads();
        if constexpr (SWIGLU) {
            if (warp == 0 && lane < MR) {          /* the gate row's parts (warps 0..3), the up row's (4..7) */
                float g = 0.0f, u = 0.0f;
#pragma unroll
                for (int i = 0; i < W; i++)
                    g += part[i][lane];
#pragma unroll
                for (int i = 0; i < W; i++)
                    u += part[W + i][lane];
                o.y[0][lane * (N / 2) + n] = dev_swiglu(g, u);
            }
        } else if (live && seg == 0 && lane < MR) {   /* lane m adds row m's W parts in warp order */
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < W; i++)
                sum += part[warp + i][lane];
            *dev_split_dst(o, lane, n) = sum;
        }
    }
}

/* Any alignment and K: a warp per row, one element per lane per step. */
template <typename WT, int MR>
__global__ void __launch_bounds__(GEMV_THREADS)
    k_gemv_scalar(const float *x, const WT *__restrict__ w, int64_t N, int64_t K, split_args_t o)
{
    DEV_PDL_ENTER();
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * (GEMV_THREADS / 32) + (threadIdx.x >> 5);
    if (n >= N)
        return;
    const WT *wr = w + n * K;
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        acc[m] = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
        const float wv = dev_to_f32(wr[k]);
#pragma unroll
        for (int m = 0; m < MR; m++)
            acc[m] = fmaf(x[m * K + k], wv, acc[m]);
    }
#pragma unroll
    for (int m = 0; m < MR; m++)
        acc[m] = dev_warp_sum(acc[m]);
    if (lane == 0) {
#pragma unroll
        for (int m = 0; m < MR; m++)
            *dev_split_dst(o, m, n) = acc[m];
    }
}

/* Warps sharing one row of an N-row matrix: TROUPE_CUDA_GEMV_WARPS when set, else 4, or 8 when at
 * 4 the matrix is fewer than 3 waves of blocks (2 rows a block, 8 blocks of 256 threads per SM):
 * there the last wave leaves SMs idle, and 8 warps a row double the blocks. On the H200 (5 calls of
 * bench_cuda) 8 warps took a 4,096 x 14,336 down_proj from 32.4 to 30.6 us, a 4,096 x 4,096
 * matrix from 12.0 to 11.7 and a 1,024-row one from 5.5 to 4.8, while 4 stayed faster for the
 * 14,336-row gate/up (30.5 against 35.1) and the 128,256-row LM head (231 against 290). The
 * result's bits depend on the warps, so on N too: still never on M (batch-invariant). */
static int s_gemv_warps(const cuda_state_t *st, int64_t N)
{
    if (st->gemv_warps)
        return st->gemv_warps;
    const int64_t blocks4 = (N + 1) / 2, wave = (int64_t)st->n_sm * (2048 / GEMV_THREADS);
    return blocks4 < 3 * wave ? 8 : 4;
}

template <typename WT, int MR>
static void s_gemv_launch(const cuda_state_t *st, bool vec, const float *x, const WT *w, int64_t N, int64_t K,
                          const split_args_t &y)
{
    const int warps = s_gemv_warps(st, N), rpb = vec ? GEMV_THREADS / 32 / warps : GEMV_THREADS / 32;
    const dim3 blocks((unsigned)((N + rpb - 1) / rpb)), threads(GEMV_THREADS);
    if (!vec)
        cuda_launch(st, k_gemv_scalar<WT, MR>, blocks, threads, x, w, N, K, y);
    else if (warps == 1)
        cuda_launch(st, k_gemv_vec<WT, MR, 1>, blocks, threads, x, w, N, K, y);
    else if (warps == 4)
        cuda_launch(st, k_gemv_vec<WT, MR, 4>, blocks, threads, x, w, N, K, y);
    else
        cuda_launch(st, k_gemv_vec<WT, MR, 8>, blocks, threads, x, w, N, K, y);
}

/* y = x W^T for M rows (several launches of up to GEMV_MR), into y's parts (N = y.end[parts - 1]). */
template <typename WT>
static void s_gemv(const cuda_state_t *st, const float *x, int M, const WT *w, int64_t N, int64_t K,
                   const split_args_t &y)
{
    constexpr int VE = 16 / (int)sizeof(WT);
    const bool vec = (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0 && K % VE == 0 && K % 4 == 0;
    for (int m0 = 0; m0 < M; m0 += GEMV_MR) {      /* rows are independent: chunks of 8 change no bits */
        const int mr = M - m0 < GEMV_MR ? M - m0 : GEMV_MR;
        const float *xm = x + (int64_t)m0 * K;
        split_args_t ym = y;
        for (int p = 0; p < y.parts; p++)
            ym.y[p] += (int64_t)m0 * (y.end[p] - (p ? y.end[p - 1] : 0));
        switch (mr) {
        case 1: s_gemv_launch<WT, 1>(st, vec, xm, w, N, K, ym); break;
        case 2: s_gemv_launch<WT, 2>(st, vec, xm, w, N, K, ym); break;
        case 3: s_gemv_launch<WT, 3>(st, vec, xm, w, N, K, ym); break;
        case 4: s_gemv_launch<WT, 4>(st, vec, xm, w, N, K, ym); break;
        case 5: s_gemv_launch<WT, 5>(st, vec, xm, w, N, K, ym); break;
        case 6: s_gemv_launch<WT, 6>(st, vec, xm, w, N, K, ym); break;
        case 7: s_gemv_launch<WT, 7>(st, vec, xm, w, N, K, ym); break;
        default: s_gemv_launch<WT, 8>(st, vec, xm, w, N, K, ym); break;
        }
    }
}

template <typename WT>
static void s_gemv_swiglu(const cuda_state_t *st, const float *x, int M, const WT *w, int64_t N, int64_t K, float *y)
{
    const int64_t I = N / 2;
    for (int m0 = 0; m0 < M; m0 += GEMV_MR) {
        const int mr = M - m0 < GEMV_MR ? M - m0 : GEMV_MR;
        const float *xm = x + (int64_t)m0 * K;
        const split_args_t ym = s_one_part(y + (int64_t)m0 * I, I);
        const dim3 blocks((unsigned)I), threads(GEMV_THREADS);
        switch (mr) {
        case 1: cuda_launch(st, k_gemv_vec<WT, 1, 4, true>, blocks, threads, xm, w, N, K, ym); break;
        case 2: cuda_launch(st, k_gemv_vec<WT, 2, 4, true>, blocks, threads, xm, w, N, K, ym); break;
        case 3: cuda_launch(st, k_gemv_vec<WT, 3, 4, true>, blocks, threads, xm, w, N, K, ym); break;
        case 4: cuda_launch(st, k_gemv_vec<WT, 4, 4, true>, blocks, threads, xm, w, N, K, ym); break;
        case 5: cuda_launch(st, k_gemv_vec<WT, 5, 4, true>, blocks, threads, xm, w, N, K, ym); break;
        case 6: cuda_launch(st, k_gemv_vec<WT, 6, 4, true>, blocks, threads, xm, w, N, K, ym); break;
        case 7: cuda_launch(st, k_gemv_vec<WT, 7, 4, true>, blocks, threads, xm, w, N, K, ym); break;
        default: cuda_launch(st, k_gemv_vec<WT, 8, 4, true>, blocks, threads, xm, w, N, K, ym); break;
        }
    }
}

/* Whether M rows of x over bf16 weights w take the tensor-core GEMV (cuda_gemv_mma.cuh): from
 * gemv_mma_min_m rows (default 2). One row stays on the CUDA-core kernel, which streams W faster
 * (8B step on the H200: 4.25 against 5.29 ms) while the tensor cores' time hardly grows with the
 * rows (2 to 8 rows: 5.60 to 6.43 ms against 6.21 to 18.9). A row's bits therefore differ between
 * a one-row step and a step of several (both within ~1e-5 of f32), as they already did between
 * the GEMV and the GEMM paths. */
static bool s_gemv_mma(const cuda_state_t *st, const bk_mat_t *w, const float *x, int M)
{
    return st->gemv_mma && M >= st->gemv_mma_min_m && w->dtype == DT_BF16 && cuda_gemv_mma_ok(w->data, x, w->cols);
}

/* gate|up and SwiGLU as one GEMV pass (backend.h gate_up_swiglu): only where the plain path would
 * be the 4-warp vector GEMV for the gate and up halves (and so for the stacked matrix), so the bits
 * equal matmul then swiglu; else 1 (nothing queued). */
int cuda_gate_up_swiglu(backend_t *be, const float *x, int M, const bk_mat_t *w, float *out)
{
    cuda_state_t *st = cuda_st(be);
    const int64_t N = w->rows, K = w->cols;
    const int VE = 16 / (int)dtype_size(w->dtype);
    if (w->qfmt)
        return 1;
    if (M > 0 && M <= st->gemv_max_m && N % 2 == 0 && s_gemv_mma(st, w, x, M)) {
        cuda_gemv_mma<true>(st, st->gemv_mma, st->gemv_mma_kstep, x, M, (const __nv_bfloat16 *)w->data, N, K, s_one_part(out, N / 2));
        return 0;
    }
    if (M <= 0 || M > st->gemv_max_m || s_gemv_warps(st, N / 2) != 4 || N % 2 || (uintptr_t)w->data % 16 ||
        (uintptr_t)x % 16 || K % VE || K % 4)
        return 1;
    switch (w->dtype) {
    case DT_F32: s_gemv_swiglu(st, x, M, (const float *)w->data, N, K, out); break;
    case DT_BF16: s_gemv_swiglu(st, x, M, (const __nv_bfloat16 *)w->data, N, K, out); break;
    default: s_gemv_swiglu(st, x, M, (const __half *)w->data, N, K, out); break;
    }
    return 0;
}

/* ---- activations to 16 bits, halves, bias ------------------------------------------------------ */

/* x as the weights' 16-bit type (dev_to16: bf16, or f16 saturated), 4 elements per thread (16-byte
 * loads, 8-byte stores) when x and out allow it (V4), else one: at 1,000 rows one at a time they
 * were 17% of a prefill's kernel time. */
template <bool F16, bool V4>
__global__ void k_to16(const float *x, int64_t n, uint16_t *out)
{
    DEV_PDL_ENTER();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if constexpr (V4) {
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += stride) {
            const float4 v = ((const float4 *)x)[i];
            ((uint2 *)out)[i] = make_uint2(dev_to16<F16>(v.x) | (uint32_t)dev_to16<F16>(v.y) << 16,
                                           dev_to16<F16>(v.z) | (uint32_t)dev_to16<F16>(v.w) << 16);
        }
    } else {
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            out[i] = dev_to16<F16>(x[i]);
    }
}

template <bool F16> __device__ __forceinline__ float dev_from16(uint16_t h)
{
    if constexpr (F16)
        return __half2float(__ushort_as_half(h));
    else
        return __uint_as_float((uint32_t)h << 16);
}

/* x = hi + lo: hi = x as 16 bits, lo = (x - hi) as 16 bits (the difference is exact in f32; f16
 * saturates x first). */
template <bool F16>
__global__ void k_to16x2(const float *x, int64_t n, uint16_t *hi, uint16_t *lo)
{
    DEV_PDL_ENTER();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = F16 ? dev_f16_sat(x[i]) : x[i];
        const uint16_t h = dev_to16<F16>(v);
        hi[i] = h;
        lo[i] = dev_to16<F16>(__fsub_rn(v, dev_from16<F16>(h)));
    }
}

/* y = y2[hi rows] + y2[lo rows] (+ bias): n = M * N outputs, the lo rows start at y2 + n. */
__global__ void k_sum_halves(const float *y2, int64_t n, int64_t N, const float *bias, float *y)
{
    DEV_PDL_ENTER();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = __fadd_rn(y2[i], y2[n + i]);
        y[i] = bias ? __fadd_rn(v, bias[i % N]) : v;
    }
}

__global__ void k_add_bias(float *y, const float *bias, int64_t n, int64_t N)
{
    DEV_PDL_ENTER();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], bias[i % N]);
}

static unsigned s_grid(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (unsigned)(b > 16384 ? 16384 : b < 1 ? 1 : b);
}

/* ---- cuBLASLt plans ----------------------------------------------------------------------------- */

/* The largest power of two <= 256 that divides the address. */
static unsigned s_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned r = 256;
    while (r > 1 && a % r)
        r >>= 1;
    return r;
}

static void s_plan_release(cuda_plan_t *p)
{
    if (!p->used)
        return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = 0;
}

void cuda_plans_destroy(cuda_state_t *st)
{
    for (int i = 0; i < CUDA_MAX_PLANS; i++)
        s_plan_release(&st->plans[i]);
}

/* The cached plan for this GEMM, made on first use: C[N][M] (column-major) = W^T-as-stored . x^T,
 * i.e. A = W viewed column-major as K x N with op T, B = x as K x M with op N, C = y as N x M. */
static cuda_plan_t *s_plan(cuda_state_t *st, dtype_t dt, int M, int64_t N, int64_t K, unsigned align_w,
                           unsigned align_y)
{
    for (int i = 0; i < CUDA_MAX_PLANS; i++) {
        cuda_plan_t *p = &st->plans[i];
        if (p->used && p->dt == dt && p->M == M && p->N == N && p->K == K && p->align_w == align_w &&
            p->align_y == align_y)
            return p;
    }
    cuda_plan_t *p = NULL;
    for (int i = 0; i < CUDA_MAX_PLANS && !p; i++)
        if (!st->plans[i].used)
            p = &st->plans[i];
    if (!p) {
        p = &st->plans[st->next_plan];
        st->next_plan = (st->next_plan + 1) % CUDA_MAX_PLANS;
        s_plan_release(p);
    }
    const cudaDataType_t ab = dt == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, ab, (uint64_t)K, (uint64_t)N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, ab, (uint64_t)K, (uint64_t)M, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)N, (uint64_t)M, N));
    p->used = 1;
    p->dt = dt;
    p->M = M;
    p->N = N;
    p->K = K;
    p->align_w = align_w;
    p->align_y = align_y;

    cublasLtMatmulPreference_t pref;
    const uint64_t ws = st->lt_ws_bytes;
    const uint32_t aw = align_w, ab_align = 256, ay = align_y;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab_align,
                                                      sizeof(ab_align)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof(ay)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof(ay)));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    p->has_algo = hs == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    if (p->has_algo)
        p->algo = res.algo;
    else
        fprintf(stderr, "troupe cuda: cuBLASLt has no algorithm for %s %d x %lld x %lld (%s); using cublasGemmEx\n",
                dtype_name(dt), M, (long long)N, (long long)K, cublasGetStatusString(hs));
    return p;
}

/* ---- the ops ------------------------------------------------------------------------------------ */

/* x [n] as 16-bit GEMM operands (f16: saturated; else bf16) into out, 4 elements a thread where x
 * and out are aligned for it. Also the grouped MoE path's conversion of its tokens. */
void cuda_to16(const cuda_state_t *st, const float *x, int64_t n, bool f16, uint16_t *out)
{
    const bool v4 = n % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)out % 8 == 0;
    const unsigned grid = s_grid(v4 ? n / 4 : n);
    if (f16)
        v4 ? cuda_launch(st, k_to16<true, true>, grid, 256, x, n, out) : cuda_launch(st, k_to16<true, false>, grid, 256, x, n, out);
    else
        v4 ? cuda_launch(st, k_to16<false, true>, grid, 256, x, n, out)
           : cuda_launch(st, k_to16<false, false>, grid, 256, x, n, out);
}

/* x's 16-bit image for cuBLASLt, in the conversion scratch: M rows rounded once, or (split) the hi
 * rows then the lo rows (2M). One conversion serves every GEMM over the same x (matmul_n). */
static void *s_convert(backend_t *be, cuda_state_t *st, const float *x, int M, int64_t K, dtype_t dt, bool split)
{
    const int64_t n = (int64_t)M * K;
    uint16_t *xb = (uint16_t *)cuda_scratch(be, &st->conv, &st->conv_bytes, (size_t)(split ? 2 : 1) * n * 2);
    if (!split)
        cuda_to16(st, x, n, dt == DT_F16, xb);
    else if (dt == DT_BF16)
        cuda_launch(st, k_to16x2<false>, s_grid(n), 256, x, n, xb, xb + n);
    else
        cuda_launch(st, k_to16x2<true>, s_grid(n), 256, x, n, xb, xb + n);
    return xb;
}

/* y = xb W^T (+ bias) on the tensor cores, xb from s_convert (Mg = 2M rows when split). */
static void s_gemm16(backend_t *be, cuda_state_t *st, const void *xb, int M, bool split, const bk_mat_t *w,
                     const float *bias, float *y)
{
    const int64_t N = w->rows, K = w->cols;
    const int Mg = split ? 2 * M : M;              /* GEMM rows: hi then lo, or the rounded x */
    float *yg = split ? (float *)cuda_scratch(be, (void **)&st->gout, &st->gout_bytes, (size_t)Mg * N * 4) : y;
    const cuda_plan_t *p = s_plan(st, w->dtype, Mg, N, K, s_align(w->data), s_align(yg));
    const float alpha = 1.0f, beta = 0.0f;
    if (p->has_algo) {
        CUBLAS_CHECK(cublasLtMatmul(st->lt, p->desc, &alpha, w->data, p->la, xb, p->lb, &beta, yg, p->lc, yg, p->lc,
                                    &p->algo, st->lt_ws, st->lt_ws_bytes, st->stream));
    } else {
        const cudaDataType_t ab = w->dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        CUBLAS_CHECK(cublasGemmEx(st->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, Mg, (int)K, &alpha, w->data, ab, (int)K,
                                  xb, ab, (int)K, &beta, yg, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    const int64_t ny = (int64_t)M * N;
    if (split)
        cuda_launch(st, k_sum_halves, s_grid(ny), 256, (const float *)yg, ny, N, bias, y);
    else if (bias)
        cuda_launch(st, k_add_bias, s_grid(ny), 256, y, bias, ny, N);
}

static void s_gemv_any(const cuda_state_t *st, const float *x, int M, const bk_mat_t *w, const split_args_t &y)
{
    const int64_t N = w->rows, K = w->cols;
    switch (w->dtype) {
    case DT_F32: s_gemv(st, x, M, (const float *)w->data, N, K, y); break;
    case DT_BF16:
        if (s_gemv_mma(st, w, x, M))
            cuda_gemv_mma<false>(st, st->gemv_mma, st->gemv_mma_kstep, x, M, (const __nv_bfloat16 *)w->data, N, K, y);
        else
            s_gemv(st, x, M, (const __nv_bfloat16 *)w->data, N, K, y);
        break;
    default: s_gemv(st, x, M, (const __half *)w->data, N, K, y); break;
    }
}

void cuda_matmul(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y)
{
    if (M <= 0)
        return;
    if (w->qfmt) {                                 /* quantized weights: cuda_quant.cu */
        cuda_qmatmul(be, x, M, w, bias, y);
        return;
    }
    cuda_state_t *st = cuda_st(be);
    const int64_t N = w->rows, K = w->cols;
    if (M <= st->gemv_max_m) {
        s_gemv_any(st, x, M, w, s_one_part(y, N));
    } else if (w->dtype == DT_F32) {
        const float alpha = 1.0f, beta = 0.0f;
        CUBLAS_CHECK(cublasSgemm(st->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, M, (int)K, &alpha, (const float *)w->data,
                                 (int)K, x, (int)K, &beta, y, (int)N));
    } else {
        const bool split = M <= st->gemm_split_max_m;
        s_gemm16(be, st, s_convert(be, st, x, M, K, w->dtype, split), M, split, w, bias, y);
        return;
    }
    if (bias) {
        const int64_t n = (int64_t)M * N;
        cuda_launch(st, k_add_bias, s_grid(n), 256, y, bias, n, N);
    }
}

/* The fused GEMM's output [M][sum N] dealt out to the parts' outputs y[p] [M][N_p]. V4: every N_p
 * a multiple of 4 and every pointer 16-byte aligned, so a float4 never straddles two parts. */
/* Grid (column groups, rows): no division per element (the 64-bit divides of a flat index made
 * the first version 12 us at 256 x 6,144). */
template <bool V4>
__global__ void k_split_cols(const float *all, int64_t Nt, split_args_t a)
{
    DEV_PDL_ENTER();
    constexpr int W = V4 ? 4 : 1;
    const int64_t row = blockIdx.y;
    const float *src = all + row * Nt;
    for (int64_t col = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W; col < Nt;
         col += (int64_t)gridDim.x * blockDim.x * W) {
        float *dst = dev_split_dst(a, row, col);
        if constexpr (V4)
            *(float4 *)dst = *(const float4 *)(src + col);
        else
            *dst = src[col];
    }
}

/* Whether n weights are consecutive row ranges of one matrix (one dtype, one K, no bias): then *whole
 * is that matrix and *y its outputs dealt out to y[i]. */
static bool s_stacked(int n, const bk_mat_t *const w[], const float *const bias[], float *const y[], bk_mat_t *whole,
                      split_args_t *parts)
{
    if (n < 2 || n > SPLIT_MAX_PARTS)
        return false;
    const size_t es = dtype_size(w[0]->dtype);
    int64_t total = 0;
    *parts = (split_args_t){};
    for (int i = 0; i < n; i++) {
        if ((bias && bias[i]) || w[i]->dtype != w[0]->dtype || w[i]->cols != w[0]->cols)
            return false;
        if (i && (const uint8_t *)w[i]->data != (const uint8_t *)w[i - 1]->data + (size_t)w[i - 1]->rows * w[i]->cols * es)
            return false;
        total += w[i]->rows;
        parts->y[i] = y[i];
        parts->end[i] = total;
    }
    parts->parts = n;
    *whole = (bk_mat_t){.data = w[0]->data, .dtype = w[0]->dtype, .rows = total, .cols = w[0]->cols};
    return true;
}

/* Stacked weights worth one GEMM: a part at most a quarter of the whole (k and v of a GQA model
 * beside q; not gate beside up). A small part alone gets few tiles of the GEMM: at batch 256 on the
 * H200, an 8B layer's k and v took 10.8 us each, q|k|v as one GEMM 23.8 us against q + k + v ~40 us. */
static bool s_gemm_fusable(int n, const bk_mat_t *const w[])
{
    int64_t total = 0, least = w[0]->rows;
    for (int i = 0; i < n; i++) {
        total += w[i]->rows;
        least = w[i]->rows < least ? w[i]->rows : least;
    }
    return least * 4 <= total;
}

/* Stacked weights as one GEMV: always worth it (a small matrix leaves SMs idle at its ramp and
 * tail: bench_cuda times an 8B layer's q, k and v alone at 11.9 + 4.9 + 4.9 us), when the whole
 * gets the warps per row every part would (so each row's bits equal a GEMV of its own part). The
 * engine already runs one row's q|k|v as one matrix (forward.c); this serves 2 to 8 rows. */
static bool s_gemv_fusable(const cuda_state_t *st, int n, const bk_mat_t *const w[], const bk_mat_t *whole,
                           const float *x, int M)
{
    if (s_gemv_mma(st, whole, x, M))
        return true;   /* its warps never depend on N, and every part is as aligned as the whole */
    for (int i = 0; i < n; i++)
        if (s_gemv_warps(st, w[i]->rows) != s_gemv_warps(st, whole->rows))
            return false;
    return true;
}

/* n matmuls over one x (q, k, v; gate, up). On the GEMV path (few rows), weights that are one
 * matrix's consecutive rows run as ONE GEMV over the whole, each row's result written to its part
 * (bit-identical to n calls: s_gemv_fusable). On the tensor-core path x is converted once for all of
 * them, with the results bit-identical to n cuda_matmul calls (same conversion, same plans); when
 * the weights are one matrix's consecutive rows with a small part (s_gemm_fusable: q|k|v) and x is
 * rounded once, ONE GEMM over the whole matrix, its rows dealt out after — the same products, but
 * cuBLASLt's kernel for the whole shape may sum in another order (bits within f32 rounding). */
void cuda_matmul_n(backend_t *be, const float *x, int M, int n, const bk_mat_t *const w[], const float *const bias[],
                   float *const y[])
{
    if (M <= 0 || n <= 0)
        return;
    bool all_q = true;
    for (int i = 0; i < n; i++)
        all_q = all_q && w[i]->qfmt;
    if (all_q) {                                   /* quantized: one launch where it can (cuda_quant.cu) */
        cuda_qmatmul_n(be, x, M, n, w, bias, y);
        return;
    }
    for (int i = 0; i < n; i++)
        if (w[i]->qfmt) {                          /* some quantized: one matmul each */
            for (int j = 0; j < n; j++)
                cuda_matmul(be, x, M, w[j], bias ? bias[j] : NULL, y[j]);
            return;
        }
    cuda_state_t *st = cuda_st(be);
    bk_mat_t whole;
    split_args_t parts;
    const bool stacked = s_stacked(n, w, bias, y, &whole, &parts);
    if (M <= st->gemv_max_m && stacked && s_gemv_fusable(st, n, w, &whole, x, M)) {
        s_gemv_any(st, x, M, &whole, parts);
        return;
    }
    bool shared = M > st->gemv_max_m && w[0]->dtype != DT_F32;
    for (int i = 1; i < n && shared; i++)
        shared = w[i]->dtype == w[0]->dtype && w[i]->cols == w[0]->cols;
    if (!shared) {
        for (int i = 0; i < n; i++)
            cuda_matmul(be, x, M, w[i], bias ? bias[i] : NULL, y[i]);
        return;
    }
    const bool split = M <= st->gemm_split_max_m;
    const void *xb = s_convert(be, st, x, M, w[0]->cols, w[0]->dtype, split);
    if (!split && st->gemm_fuse && M <= 65535 && stacked && s_gemm_fusable(n, w)) {   /* M: the split's gridDim.y */
        bool v4 = true;
        for (int i = 0; i < n; i++)
            v4 = v4 && w[i]->rows % 4 == 0 && (uintptr_t)y[i] % 16 == 0;
        const int64_t Nt = whole.rows;
        float *all = (float *)cuda_scratch(be, (void **)&st->gout, &st->gout_bytes, (size_t)M * Nt * 4);
        s_gemm16(be, st, xb, M, false, &whole, NULL, all);
        const int64_t per_row = v4 ? Nt / 4 : Nt;
        const dim3 grid((unsigned)((per_row + 255) / 256), (unsigned)M);
        if (v4)
            cuda_launch(st, k_split_cols<true>, grid, 256, (const float *)all, Nt, parts);
        else
            cuda_launch(st, k_split_cols<false>, grid, 256, (const float *)all, Nt, parts);
        return;
    }
    for (int i = 0; i < n; i++)
        s_gemm16(be, st, xb, M, split, w[i], bias ? bias[i] : NULL, y[i]);
}

/* silu(g) * u rounded once to the weights' 16-bit type: the f32 swiglu followed by k_to16, without
 * the f32 round trip. V4 as k_to16. */
template <bool F16, bool V4>
__global__ void k_swiglu_to16(const float *g, const float *u, int64_t n, uint16_t *out)
{
    DEV_PDL_ENTER();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if constexpr (V4) {
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += stride) {
            const float4 a = ((const float4 *)g)[i], b = ((const float4 *)u)[i];
            ((uint2 *)out)[i] = make_uint2(dev_to16<F16>(dev_swiglu(a.x, b.x)) | (uint32_t)dev_to16<F16>(dev_swiglu(a.y, b.y)) << 16,
                                           dev_to16<F16>(dev_swiglu(a.z, b.z)) | (uint32_t)dev_to16<F16>(dev_swiglu(a.w, b.w)) << 16);
        }
    } else {
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            out[i] = dev_to16<F16>(dev_swiglu(g[i], u[i]));
    }
}

/* The dense MLP of a GEMM-sized step (backend.h mlp_swiglu): x converted once for gate and up (as
 * matmul_n), silu(g) * u written straight into down's 16-bit input (the conversion scratch), then
 * down's GEMM: the plain ops' bits, less an f32 write and read of [M][I] and a launch. Only where
 * the plain path rounds activations once (more than gemm_split_max_m rows, 16-bit weights of one
 * dtype); else 1. */
int cuda_mlp_swiglu(backend_t *be, const float *x, int M, const bk_mat_t *gate, const bk_mat_t *up, const bk_mat_t *down,
                    float *g, float *u, float *out)
{
    cuda_state_t *st = cuda_st(be);
    const dtype_t dt = gate->dtype;
    const int64_t I = gate->rows, K = gate->cols;
    if (gate->qfmt || up->qfmt || down->qfmt)
        return st->mlp_fuse ? cuda_w8a8_mlp(be, x, M, gate, up, down, g, u, out) : 1;
    if (!st->mlp_fuse || M <= st->gemv_max_m || M <= st->gemm_split_max_m || dt == DT_F32 || up->dtype != dt ||
        down->dtype != dt || up->rows != I || up->cols != K || down->cols != I)
        return 1;
    const void *xb = s_convert(be, st, x, M, K, dt, false);
    s_gemm16(be, st, xb, M, false, gate, NULL, g);
    s_gemm16(be, st, xb, M, false, up, NULL, u);
    const int64_t n = (int64_t)M * I;
    /* The conversion scratch again: the two GEMMs before it on the stream have read x's image. */
    uint16_t *h = (uint16_t *)cuda_scratch(be, &st->conv, &st->conv_bytes, (size_t)n * 2);
    const bool v4 = n % 4 == 0 && ((uintptr_t)g | (uintptr_t)u) % 16 == 0 && (uintptr_t)h % 8 == 0;
    const unsigned grid = s_grid(v4 ? n / 4 : n);
    if (dt == DT_BF16)
        v4 ? cuda_launch(st, k_swiglu_to16<false, true>, grid, 256, (const float *)g, (const float *)u, n, h)
           : cuda_launch(st, k_swiglu_to16<false, false>, grid, 256, (const float *)g, (const float *)u, n, h);
    else
        v4 ? cuda_launch(st, k_swiglu_to16<true, true>, grid, 256, (const float *)g, (const float *)u, n, h)
           : cuda_launch(st, k_swiglu_to16<true, false>, grid, 256, (const float *)g, (const float *)u, n, h);
    s_gemm16(be, st, h, M, false, down, NULL, out);
    return 0;
}
