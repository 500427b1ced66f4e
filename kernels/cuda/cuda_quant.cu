/* kernels/cuda/cuda_quant.cu — y = x W^T for quantized W (kernels/backend.h's bk_mat_t qfmt): fp8,
 * int8, int4 and nvfp4 weights, every scale grid, optional per-token activation quantization.
 *
 * Small M (decode): the tensor-core GEMV of cuda_qgemv_mma.cuh, up to gemv_max_m rows (8) for
 * weight-only formats and qgemv_max_m (16) with W8A8 activations, one launch per 16 rows there
 * (a batch-16 step reads the codes once: s_qgemv_rows) (fp8, int8, int4
 * and nvfp4: codes decoded into mma fragments, x as f16 hi + lo or, for W8A8,
 * as its exact f16 codes; it quantizes the activations itself; matmul_n's q, k, v or gate, up in
 * one launch, cuda_qmatmul_n); else, or with
 * TROUPE_CUDA_QGEMV_MMA=0, the CUDA-core GEMV of cuda_qgemv.cuh, which streams the packed codes once
 * with 16-byte loads, decodes them in registers and shares each load of x across four rows (any
 * shape the vector kernel cannot take runs its one-code-per-lane kernel).
 * Larger M (prefill):
 *   - fp8 weights with fp8 per-token activations (W8A8, one scale per row of W: per channel or per
 *     tensor): an FP8 GEMM on the tensor cores (cuBLASLt, e4m3 x e4m3, f32 accumulation): x is
 *     quantized per row to e4m3 with scale amax / 448 (the CPU's arithmetic, cpu_quant_act_row), the
 *     GEMM gives sum_k q_x q_w in f32, and one pass multiplies by the row's and the channel's scales
 *     and adds the bias. No dequantized copy of W is written;
 *   - int8 weights with int8 per-token activations (W8A8, one scale per row of W): the same on the
 *     integer tensor cores (cuBLASLt, int8 x int8, exact int32 sums; TROUPE_CUDA_QUANT_I8_GEMM=0
 *     dequantizes instead);
 *   - everything else: W dequantized to bf16 into scratch and the bf16 GEMM (cuda_matmul's cuBLASLt
 *     path); with qact, x is first fake-quantized per row into scratch (the CPU's arithmetic).
 *
 * Semantics against the CPU reference (cpu_quant.c): the same dequantized f32 weight; the GEMV sums
 * in another order (f32, within rounding); the FP8 GEMM has the same products (exact in f32) summed
 * by the tensor cores and the two scales applied after the sum (the int8 GEMM's sums are exact);
 * the bf16 path rounds the dequantized weight to bf16 (relative 2^-9 per element) and follows the
 * bf16 GEMM's activation rules.
 *
 * Known limits: int8 W8A8 prefill dequantizes by default (above); quantized MoE experts (fp8,
 * int8) run in cuda_moe_quant.cu and cuda_moe_gemm.cu, not here (quant_moe_formats). */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_moe_quant.cuh"   /* mq_dec16: the codes of a 16-byte chunk */
#include "kernels/cuda/cuda_qgemv.cuh"
#include "kernels/cuda/cuda_qgemv_mma.cuh"

/* Rows up to which a matmul over w runs the GEMV: with W8A8 activations qgemv_max_m (16, one
 * launch: one H100, 2026-12-07, 8B shape at batch 16: fp8 5.88 ms a step against 6.70 on the FP8
 * GEMM, int8 5.88 against 7.10 on the int8 GEMM); weight-only, the same where qm_wide_ok takes 16
 * rows (x's hi and lo parts in four column tiles; same H100 and day: int4 g128 at batch 16 9.17 ms
 * against 16.69 dequantizing to bf16, TROUPE_CUDA_QGEMV_WIDE=0), else gemv_max_m (8: more rows
 * would read the codes again per 8). */
static int s_qgemv_wide(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("TROUPE_CUDA_QGEMV_WIDE");
        on = !(e && e[0] == '0');
    }
    return on;
}

static int s_qgemv_rows(const cuda_state_t *st, const bk_mat_t *w)
{
    const bool wide = s_qgemv_wide() && qm_wide_ok(w->qfmt, w->cols, (int)w->qgc);
    return w->qact == BK_QA_NONE && !wide ? st->gemv_max_m : st->qgemv_max_m;
}

/* The GEMV: the vector kernel where the shape allows (cuda_qgemv.cuh), else the any-shape one;
 * up to 8 rows of x per launch. */
static void s_qgemv(const cuda_state_t *st, const bk_mat_t *w, const float *x, int M, const float *bias, float *y)
{
    static int lk_env = -1;                        /* TROUPE_CUDA_QGEMV_LK=32: the whole-warp layout at M = 1 */
    if (lk_env < 0) {
        const char *e = getenv("TROUPE_CUDA_QGEMV_LK");
        lk_env = e && atoi(e) == 32 ? 32 : QV_LK;
    }
    const int64_t N = w->rows, K = w->cols;
    const int fmt = w->qfmt, gr = (int)w->qgr, gc = (int)w->qgc, lk = M == 1 ? lk_env : QV_LK;
    bool rs;
    int gshift;
    const bool vec = qv_vector_ok(fmt, N, K, gr, gc, w->data, x, &rs, &gshift);
    const int warps = qv_warps(N, K, fmt, st->n_sm, lk);
    for (int m0 = 0; m0 < M; m0 += 8) {
        const int mr = M - m0 < 8 ? M - m0 : 8;
        const qv_args_t a = {(const uint8_t *)w->data, w->qscale, N, K, (K + gc - 1) / gc, gr, gc, gshift,
                             x + (int64_t)m0 * K, mr, bias, y + (int64_t)m0 * N};
        const qv_kernel_t k = vec ? qv_kernel(fmt, mr, warps, rs, lk) : NULL;
        if (k)
            cuda_launch(st, k, dim3(qv_blocks(N, warps, lk)), dim3(QV_THREADS), a);
        else
            cuda_launch(st, k_qgemv_any, dim3((unsigned)((N + 7) / 8)), dim3(QV_THREADS), a, fmt);
    }
}

/* The tensor-core GEMV (cuda_qgemv_mma.cuh) for n <= QM_PARTS weights over one x (q, k, v; gate,
 * up: one format, K, column grid and activation treatment), all in ONE launch per 8 rows of x (16
 * with W8A8 activations, and weight-only where qm_wide_ok says so),
 * activations quantized (w->qact) by the kernel itself, or by one pre-pass shared by every part
 * where x's operands do not fit a block's shared memory; 1 when it does not take them (nothing
 * queued). Each part's rows get the bits a launch of their own would give (qm_warps: from K).
 * TROUPE_CUDA_QGEMV_MMA: 1 (default) on, warps per block by qm_warps; 4, 8 or 16 forces the
 * warps; 0 off (the CUDA-core GEMV everywhere, for comparison). TROUPE_CUDA_QGEMV_STAGE=0 runs the
 * pre-pass for every call, TROUPE_CUDA_QGEMV_GRID=0 a block per 16 rows instead of a grid the SMs
 * hold at once, TROUPE_CUDA_QGEMV_FP8_DECODE=mix fp8 (one scale per row) decoded half by the
 * convert, half by integer operations, TROUPE_CUDA_QGEMV_DEPTH=2 two steps of loads in flight per
 * lane instead of four, with 1.5x the blocks per SM, TROUPE_CUDA_QGEMV_I8_IMMA=1 int8 W8A8 on the
 * integer tensor cores (to compare), TROUPE_CUDA_QGEMV_WIDE=0 weight-only steps of 9-16 rows dequantized to bf16
 * for the GEMM instead of one launch (to compare). */
static int s_qgemv_mma(backend_t *be, cuda_state_t *st, int n, const bk_mat_t *const w[], const float *x, int M,
                       const float *const bias[], float *const y[])
{
    static int mode = -1, flags = -1, grid_sms = -1;
    if (mode < 0) {
        const char *e = getenv("TROUPE_CUDA_QGEMV_MMA");
        const int v = e ? atoi(e) : 1;
        mode = v == 0 || v == 4 || v == 8 || v == 16 ? v : 1;
        const char *s = getenv("TROUPE_CUDA_QGEMV_STAGE"), *d = getenv("TROUPE_CUDA_QGEMV_FP8_DECODE");
        const char *sh = getenv("TROUPE_CUDA_QGEMV_DEPTH"), *im = getenv("TROUPE_CUDA_QGEMV_I8_IMMA");
        flags = (s && s[0] == '0' ? 0 : QM_F_STAGE) | (d && strcmp(d, "mix") == 0 ? QM_F_FP8_MIX : 0) |
                (sh && atoi(sh) == 2 ? QM_F_SHALLOW : 0) | (im && im[0] == '1' ? QM_F_I8_IMMA : 0) |
                (s_qgemv_wide() ? QM_F_WIDE : 0);
        const char *gs = getenv("TROUPE_CUDA_QGEMV_GRID");
        grid_sms = !(gs && gs[0] == '0');
    }
    const int64_t K = w[0]->cols;
    if (!mode || n < 1 || n > QM_PARTS)
        return 1;
    for (int i = 0; i < n; i++)
        if (w[i]->qfmt != w[0]->qfmt || w[i]->qact != w[0]->qact || w[i]->qgc != w[0]->qgc || w[i]->cols != K ||
            !qm_ok(w[i]->qfmt, w[i]->rows, K, (int)w[i]->qgc, w[i]->qact, w[i]->data, x))
            return 1;
    void *scratch = cuda_scratch(be, &st->quant_x, &st->quant_x_bytes, qm_scratch_bytes(K));
    const int warps = mode == 1 ? 0 : mode;
    qm_plan_t pl[1];
    const int rows = qm_launch_rows(w[0]->qfmt, K, (int)w[0]->qgc, w[0]->qact, flags);
    for (int m0 = 0; m0 < M; m0 += rows) {
        const int mr = M - m0 < rows ? M - m0 : rows;
        qm_part_t parts[QM_PARTS];
        for (int i = 0; i < n; i++)
            parts[i] = qm_part_t{(const uint8_t *)w[i]->data, w[i]->qscale, bias ? bias[i] : NULL,
                                 y[i] + (int64_t)m0 * w[i]->rows, w[i]->rows, (int)w[i]->qgr, 0};
        const float *xm = x + (int64_t)m0 * K;
        if (!qm_setup(pl, w[0]->qfmt, K, (int)w[0]->qgc, w[0]->qact, xm, mr, parts, n, scratch, warps, flags,
                      grid_sms ? st->n_sm : 0)) {
            if (m0 == 0)
                return 1;                          /* (qm_ok said yes: not reached) */
            fprintf(stderr, "troupe cuda: qgemv_mma refused rows %d.. of a matmul it took\n", m0);
            abort();
        }
        if (pl->prep)
            cuda_launch(st, pl->prep, dim3((unsigned)mr), dim3(QM_PREP_THREADS), xm, K, mr, (int)w[0]->qact,
                        qm_scratch_xs(scratch), (float *)scratch);
        cuda_launch_smem(st, pl->kernel, dim3(pl->blocks), dim3(pl->threads), pl->smem, pl->args);
    }
    return 0;
}

/* The dequantized weight as bf16 [N][K] (round to nearest even), K a multiple of
 * mq_chunk_values(FMT): block (n, chunk) writes row n's part of QD_THREADS 16-byte chunks of
 * codes, a thread one chunk (16 byte codes or 32 nibbles) in one load, decoded by the MoE kernels'
 * mq_dec16 (cuda_moe_quant.cuh; fp4 comes times 2^-14, so the scale is taken times mq_dec_scale,
 * exactly) and written 8 values to a 16-byte store. The same values as k_qdequant_bf16, whose
 * grid-stride loop divides by K in 64 bits for every element and keeps nvfp4's value table in
 * local memory: on one H100 (2026-12-07, 8B shape, dummy weights) a batch-256 step took 25.3 ms
 * (int4), 25.6 (nvfp4), 28.9 (int8 without its GEMM) this way against 75.7, 85.7 and 74.4 through
 * k_qdequant_bf16, and bf16's 15.4. TROUPE_CUDA_QDEQUANT_CHUNKS=0 runs the old kernel. */
#define QD_THREADS 128
template <int FMT>
__global__ void __launch_bounds__(QD_THREADS) k_qdequant_bf16_chunks(const uint8_t *codes, const float *scale,
                                                                     int64_t K, int gr, int gc, uint16_t *out)
{
    DEV_PDL_ENTER();
    constexpr int V = mq_chunk_values(FMT);
    const int64_t n = blockIdx.x, c0 = ((int64_t)blockIdx.y * QD_THREADS + threadIdx.x) * V;
    if (c0 >= K)
        return;
    const uint4 q = *(const uint4 *)(codes + (mq_nib(FMT) ? n * (K / 2) + c0 / 2 : n * K + c0));
    const float *srow = scale + (n / gr) * ((K + gc - 1) / gc);
#pragma unroll
    for (int p = 0; p < V / 16; p++) {
        float f[16];
        mq_dec16<FMT>(q, p, f);
        uint32_t h[8];
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
            const uint32_t c = (uint32_t)(c0 + 16 * p + i);
            const uint32_t lo = dev_bf16_bits(f[i] * (srow[c / (uint32_t)gc] * mq_dec_scale<FMT>()));
            const uint32_t hi = dev_bf16_bits(f[i + 1] * (srow[(c + 1) / (uint32_t)gc] * mq_dec_scale<FMT>()));
            h[i / 2] = lo | hi << 16;
        }
        uint4 *o = (uint4 *)(out + n * K + c0 + 16 * p);
        o[0] = make_uint4(h[0], h[1], h[2], h[3]);
        o[1] = make_uint4(h[4], h[5], h[6], h[7]);
    }
}

template <int FMT>
static void s_dequant_chunks(const cuda_state_t *st, const bk_mat_t *w, uint16_t *wb)
{
    const int64_t N = w->rows, K = w->cols;
    const dim3 grid((unsigned)N, (unsigned)((K / mq_chunk_values(FMT) + QD_THREADS - 1) / QD_THREADS));
    cuda_launch(st, k_qdequant_bf16_chunks<FMT>, grid, dim3(QD_THREADS), (const uint8_t *)w->data, w->qscale, K,
                (int)w->qgr, (int)w->qgc, wb);
}

/* The dequantized weight as bf16 [N][K] (round to nearest even): any K (k_qdequant_bf16_chunks
 * takes whole 16-byte chunks of codes per row). */
__global__ void k_qdequant_bf16(const uint8_t *codes, const float *scale, int fmt, int64_t N, int64_t K, int gr, int gc,
                                uint16_t *out)
{
    DEV_PDL_ENTER();
    const bool nib = fmt == BK_Q_I4 || fmt == BK_Q_FP4;
    const int64_t ngc = (K + gc - 1) / gc, total = N * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / K, c = i % K;
        const uint8_t *row = codes + (nib ? n * K / 2 : n * K);
        out[i] = dev_bf16_bits(qv_code(fmt, row, c) * scale[(n / gr) * ngc + c / gc]);
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

/* ---- W8A8 GEMMs (prefill): fp8 on the FP8 tensor cores, int8 on the integer ones ------------- */

/* A row's quantization from its amax (k_qact_w8, k_w8a8_rows_q): s the step, dead a row whose
 * codes are all 0 (amax 0 or not finite), stored the scale the GEMM's epilogue multiplies by (NaN
 * for a non-finite amax, or for int8, which has no NaN code, a row holding a NaN). */
struct w8_row {
    float s, stored;
    bool dead;
};
template <bool I8> __device__ __forceinline__ w8_row dev_w8_row(float amax, bool nan)
{
    const float s = amax / (I8 ? 127.0f : 448.0f);
    return {s, isfinite(amax) && !(I8 && nan) ? s : __int_as_float(0x7fc00000), amax == 0.0f || !isfinite(amax)};
}

/* One activation code of a row (dev_w8_row): e4m3 of v / s, or int8 rint(v / s) clamped to +-127;
 * 0 for a dead row. */
template <bool I8> __device__ __forceinline__ uint8_t dev_w8_code(float v, float s, bool dead)
{
    if (dead)
        return 0;
    if (I8)
        return (uint8_t)(int8_t)rintf(fminf(fmaxf(v / s, -127.0f), 127.0f));   /* NaN: the row's scale is NaN */
    return __nv_cvt_float_to_fp8(v / s, __NV_SATFINITE, __NV_E4M3);
}

/* x row blockIdx.x quantized as cpu_quant_act_row: e4m3 codes with scale amax / 448 (I8 false) or
 * int8 codes rint(x / s) clamped to +-127 with scale amax / 127 (I8 true), into xq [M][K], the scale
 * into sx[row]. An all-zero row: codes 0. A non-finite amax, or (int8, which has no NaN code) a NaN
 * element: scale NaN, so every output of the row is NaN, as the CPU's (fp8's NaN element converts to
 * a NaN code). */
template <bool I8>
__global__ void k_qact_w8(const float *x, int64_t K, uint8_t *xq, float *sx)
{
    DEV_PDL_ENTER();
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * K;
    uint8_t *o = xq + (int64_t)blockIdx.x * K;
    float amax = 0.0f;
    int nan = 0;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
        amax = fmaxf(amax, fabsf(xr[k]));          /* fmaxf skips NaN, as the CPU's comparison does */
        nan |= isnan(xr[k]);
    }
    amax = dev_block_max(amax, red);
    if (I8)
        nan = __syncthreads_or(nan);
    const w8_row r = dev_w8_row<I8>(amax, nan);
    if (threadIdx.x == 0)
        sx[blockIdx.x] = r.stored;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
        o[k] = dev_w8_code<I8>(xr[k], r.s, r.dead);
}

/* y[m][n] = raw[m][n] * sx[m] * ws[n] (+ bias[n]), in place over the GEMM's output (RAW float for
 * fp8, int32 for int8: the same 4 bytes); ws one scale per row block of W. */
template <typename RAW>
__global__ void k_w8a8_epilogue(float *y, int64_t M, int64_t N, const float *sx, const float *ws, int gr,
                                const float *bias)
{
    DEV_PDL_ENTER();
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N)
        return;
    const RAW raw = ((const RAW *)y)[m * N + n];
    float v = (float)raw * sx[m] * ws[gr == 1 ? n : n / gr];
    if (bias)
        v = __fadd_rn(v, bias[n]);
    y[m * N + n] = v;
}

/* The dense MLP's middle on the W8A8 path (cuda_w8a8_mlp), in two passes over [M][I] whose blocks
 * each take a slice of a row (a block a row would leave most SMs idle at M = 64):
 *
 * k_w8a8_swiglu_h: gate's and up's raw sums scaled as k_w8a8_epilogue scales them, silu(g) * u as
 * cuda_swiglu computes it, written as f32 over gate's sums (the same 4 bytes, read first by the
 * same thread); each block's amax of its slice (fmaxf: NaN skipped, as k_qact_w8) into the row's
 * (atomicMax on the bits: a non-negative float's order is its bits' order), and whether the slice
 * held a NaN. k_w8a8_rows_q: the rows quantized for down as k_qact_w8 quantizes them, with the
 * row's amax. The codes and scales are the bits of those ops (a max is exact in any order). amax and
 * nan start at 0 (a memset before the first pass). */
template <typename RAW>
__global__ void k_w8a8_swiglu_h(void *graw, const void *uraw, int64_t I, const float *sx, const float *sg, int grg,
                                const float *su, int gru, unsigned *amax, int *nan)
{
    DEV_PDL_ENTER();
    __shared__ float red[32];
    const int64_t m = blockIdx.y;
    const RAW *gr = (const RAW *)graw + m * I, *ur = (const RAW *)uraw + m * I;
    float *h = (float *)graw + m * I;
    const float s_x = sx[m];
    float mx = 0.0f;
    int bad = 0;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < I; k += (int64_t)gridDim.x * blockDim.x) {
        const float v = dev_swiglu((float)gr[k] * s_x * sg[grg == 1 ? k : k / grg],
                                   (float)ur[k] * s_x * su[gru == 1 ? k : k / gru]);
        h[k] = v;
        mx = fmaxf(mx, fabsf(v));
        bad |= isnan(v);
    }
    mx = dev_block_max(mx, red);
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        atomicMax(amax + m, __float_as_uint(mx));
        if (bad)
            atomicOr(nan + m, 1);
    }
}

template <bool I8>
__global__ void k_w8a8_rows_q(const float *h, int64_t I, const unsigned *amax_bits, const int *nan, uint8_t *hq,
                              float *sh)
{
    DEV_PDL_ENTER();
    const int64_t m = blockIdx.y;
    const float *hr = h + m * I;
    uint8_t *o = hq + m * I;
    const w8_row r = dev_w8_row<I8>(__uint_as_float(amax_bits[m]), nan[m] != 0);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        sh[m] = r.stored;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < I; k += (int64_t)gridDim.x * blockDim.x)
        o[k] = dev_w8_code<I8>(hr[k], r.s, r.dead);
}

/* cuBLASLt plans of the W8A8 GEMMs, by element type, shape (and handle), made on first use. (The
 * scales stay in our own epilogue pass: the cuBLASLt of the H100 machine of 2026-12-07 refused
 * outer-vector scales, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, for FP8 with 'an unsupported
 * value or parameter'.) */
typedef struct w8_plan {
    cublasLtHandle_t lt;
    int i8;                                        /* int8 (int32 sums) or fp8 (f32 sums) */
    int M;
    int64_t N, K;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int ok;                                        /* 0: no algorithm (the bf16 path runs) */
    /* TROUPE_CUDA_LT_SEARCH: the heuristic's candidates, timed on the first run outside a graph
     * capture (s_w8_search), then algo is the fastest */
    cublasLtMatmulAlgo_t cand[16];
    int n_cand, searched;
} w8_plan_t;

/* TROUPE_CUDA_LT_SEARCH=N (2..16; opt-in until measured): the W8A8 GEMM asks cuBLASLt's heuristic
 * for N algorithms and times them on the first run of each shape, instead of taking its first
 * answer. Why: at batch 256 on one H100 the FP8 GEMMs of the 8B shape were no faster than bf16's
 * (docs/quantization.md), far from both the compute and the byte bound, and the heuristic's first
 * answer is not timed. 0 / unset: the first answer. */
static int s_lt_search(void)
{
    static int n = -1;
    if (n < 0) {
        const char *e = getenv("TROUPE_CUDA_LT_SEARCH");
        const int v = e ? atoi(e) : 0;
        n = v >= 2 && v <= 16 ? v : 0;
    }
    return n;
}

#define W8_PLANS 256
static w8_plan_t s_w8_plans[W8_PLANS];
static int s_w8_next;

static const w8_plan_t *s_w8_plan(cuda_state_t *st, int i8, int M, int64_t N, int64_t K)
{
    for (int i = 0; i < W8_PLANS; i++) {
        const w8_plan_t *p = &s_w8_plans[i];
        if (p->lt == st->lt && p->i8 == i8 && p->M == M && p->N == N && p->K == K)
            return p;
    }
    w8_plan_t *p = &s_w8_plans[s_w8_next];
    s_w8_next = (s_w8_next + 1) % W8_PLANS;
    if (p->lt) {
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->lc);
        cublasLtMatmulDescDestroy(p->desc);
    }
    *p = (w8_plan_t){.lt = st->lt, .i8 = i8, .M = M, .N = N, .K = K};
    /* "TN": W [N][K] row-major is column-major K x N, transposed; x's codes K x M as they are. The
     * integer tensor cores take int8 only in this form (K a multiple of 4). */
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    const cudaDataType_t in = i8 ? CUDA_R_8I : CUDA_R_8F_E4M3, acc = i8 ? CUDA_R_32I : CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, i8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F, acc));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, in, (uint64_t)K, (uint64_t)N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, in, (uint64_t)K, (uint64_t)M, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, acc, (uint64_t)N, (uint64_t)M, N));
    cublasLtMatmulPreference_t pref;
    const uint64_t ws = st->lt_ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t res[16];
    int found = 0;
    const int want = s_lt_search() ? s_lt_search() : 1;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(st->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, want, res, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    p->ok = hs == CUBLAS_STATUS_SUCCESS && found > 0 && res[0].state == CUBLAS_STATUS_SUCCESS;
    for (int i = 0; p->ok && i < found; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS)
            p->cand[p->n_cand++] = res[i].algo;
    p->searched = p->n_cand < 2;
    if (p->ok)
        p->algo = res[0].algo;
    else
        fprintf(stderr, "troupe cuda: cuBLASLt has no %s algorithm for %d x %lld x %lld (%s); dequantizing to bf16\n",
                i8 ? "int8" : "FP8", M, (long long)N, (long long)K, cublasGetStatusString(hs));
    return p;
}

/* Whether w takes the W8A8 GEMM: an fp8 or int8 weight with one scale per row block and per-token
 * activations of its own format (TROUPE_CUDA_QUANT_FP8_GEMM=0 turns fp8's off,
 * TROUPE_CUDA_QUANT_I8_GEMM=0 int8's: both then dequantize to bf16; on one H100, 2026-12-07, an 8B
 * int8 step at batch 256 took 17.8 ms with the int8 GEMM, 28.9 dequantizing). */
static bool s_w8a8_takes(const bk_mat_t *w, const float *y, int M)
{
    static int fp8_on = -1, i8_on = -1;
    if (fp8_on < 0) {
        const char *e = getenv("TROUPE_CUDA_QUANT_FP8_GEMM"), *i = getenv("TROUPE_CUDA_QUANT_I8_GEMM");
        fp8_on = !(e && e[0] == '0');
        i8_on = !(i && i[0] == '0');
    }
    const int64_t N = w->rows, K = w->cols;
    const int i8 = w->qfmt == BK_Q_I8;
    return (i8 ? i8_on && w->qact == BK_QA_I8_TOKEN : fp8_on && w->qfmt == BK_Q_FP8 && w->qact == BK_QA_FP8_TOKEN) &&
           w->qgc >= K && K % 16 == 0 && N % 16 == 0 && (uintptr_t)w->data % 16 == 0 && (uintptr_t)y % 16 == 0 &&
           M <= 65535;
}

/* x's codes for the W8A8 GEMM (k_qact_w8 into scratch): [M][K] bytes, then [M] f32 row scales. */
typedef struct w8_x {
    const uint8_t *q;
    const float *s;
} w8_x_t;

/* M rows of K codes at buf, then their M scales, each part 256-byte aligned: the codes' bytes
 * (rounded up) and s_w8_x_bytes in all, so such blocks can follow one another. */
static size_t s_w8_codes_bytes(int M, int64_t K) { return ((size_t)M * (size_t)K + 255) / 256 * 256; }
static size_t s_w8_x_bytes(int M, int64_t K) { return s_w8_codes_bytes(M, K) + ((size_t)M * 4 + 255) / 256 * 256; }

/* x's codes into buf (s_w8_x_bytes(M, K) of device memory). */
static w8_x_t s_w8a8_quantize_into(cuda_state_t *st, const float *x, int M, int64_t K, int i8, uint8_t *buf)
{
    float *sx = (float *)(buf + s_w8_codes_bytes(M, K));
    cuda_launch(st, i8 ? k_qact_w8<true> : k_qact_w8<false>, dim3((unsigned)M), dim3(256), x, K, buf, sx);
    return (w8_x_t){buf, sx};
}

static w8_x_t s_w8a8_quantize(backend_t *be, cuda_state_t *st, const float *x, int M, int64_t K, int i8)
{
    uint8_t *buf = (uint8_t *)cuda_scratch(be, &st->quant_x, &st->quant_x_bytes, s_w8_x_bytes(M, K));
    return s_w8a8_quantize_into(st, x, M, K, i8, buf);
}

/* Times each candidate of p on these operands (y is written; the real run after overwrites it) and
 * keeps the fastest: 2 runs to warm, 5 timed, one event pair each. Not while the stream is being
 * captured into a graph (events cannot be waited on then): a later uncaptured run searches. */
static void s_w8_search(cuda_state_t *st, w8_plan_t *p, const void *w, const void *xq, void *y)
{
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st->stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone)
        return;
    const float alpha = 1.0f, beta = 0.0f;
    const int32_t alpha_i = 1, beta_i = 0;
    const void *a = p->i8 ? (const void *)&alpha_i : (const void *)&alpha, *b = p->i8 ? (const void *)&beta_i : (const void *)&beta;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float best = -1.0f;
    int best_i = 0;
    for (int c = 0; c < p->n_cand; c++) {
        bool ok = true;
        for (int r = 0; r < 7 && ok; r++) {
            if (r == 2)
                CUDA_CHECK(cudaEventRecord(e0, st->stream));
            ok = cublasLtMatmul(st->lt, p->desc, a, w, p->la, xq, p->lb, b, y, p->lc, y, p->lc, &p->cand[c], st->lt_ws,
                                st->lt_ws_bytes, st->stream) == CUBLAS_STATUS_SUCCESS;
        }
        CUDA_CHECK(cudaEventRecord(e1, st->stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        if (ok && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && (best < 0 || ms < best))
            best = ms, best_i = c;
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    p->algo = p->cand[best_i];
    p->searched = 1;
    if (getenv("TROUPE_CUDA_LT_SEARCH_LOG"))
        fprintf(stderr, "troupe cuda: %s GEMM %d x %lld x %lld: candidate %d of %d, %.1f us a run\n",
                p->i8 ? "int8" : "FP8", p->M, (long long)p->N, (long long)p->K, best_i, p->n_cand, 1e3 * best / 5);
}

/* The GEMM over x's codes alone: y gets the raw sums, int8's exact (int32), fp8's the tensor cores'
 * f32 sums of exact products. 1 when cuBLASLt has no algorithm for the shape, nothing queued. */
static int s_w8a8_raw(cuda_state_t *st, const w8_x_t *xq, int M, const bk_mat_t *w, float *y)
{
    const int64_t N = w->rows, K = w->cols;
    const int i8 = w->qfmt == BK_Q_I8;
    const float alpha = 1.0f, beta = 0.0f;
    const int32_t alpha_i = 1, beta_i = 0;
    w8_plan_t *p = (w8_plan_t *)s_w8_plan(st, i8, M, N, K);
    if (!p->ok)
        return 1;
    if (!p->searched)
        s_w8_search(st, p, w->data, xq->q, y);
    CUBLAS_CHECK(cublasLtMatmul(st->lt, p->desc, i8 ? (const void *)&alpha_i : (const void *)&alpha, w->data, p->la,
                                xq->q, p->lb, i8 ? (const void *)&beta_i : (const void *)&beta, y, p->lc, y, p->lc,
                                &p->algo, st->lt_ws, st->lt_ws_bytes, st->stream));
    return 0;
}

/* The GEMM and its epilogue: the scales come after the raw sums, in one pass over y
 * (k_w8a8_epilogue). 1 when cuBLASLt has no algorithm for the shape, nothing queued. */
static int s_w8a8_run(cuda_state_t *st, const w8_x_t *xq, int M, const bk_mat_t *w, const float *bias, float *y)
{
    const int64_t N = w->rows;
    const int i8 = w->qfmt == BK_Q_I8;
    if (s_w8a8_raw(st, xq, M, w, y) != 0)
        return 1;
    cuda_launch(st, i8 ? k_w8a8_epilogue<int32_t> : k_w8a8_epilogue<float>, dim3((unsigned)((N + 255) / 256), (unsigned)M),
                dim3(256), y, (int64_t)M, N, xq->s, w->qscale, (int)w->qgr, bias);
    return 0;
}

/* The W8A8 GEMM of one weight; 1 when it does not apply, nothing queued. */
static int s_w8a8_gemm(backend_t *be, cuda_state_t *st, const float *x, int M, const bk_mat_t *w, const float *bias,
                       float *y)
{
    const int i8 = w->qfmt == BK_Q_I8;
    if (!s_w8a8_takes(w, y, M) || !s_w8_plan(st, i8, M, w->rows, w->cols)->ok)
        return 1;
    const w8_x_t xq = s_w8a8_quantize(be, st, x, M, w->cols, i8);
    return s_w8a8_run(st, &xq, M, w, bias, y);
}

/* n W8A8 GEMMs over one x (q, k, v; gate, up) with x quantized once: the bits of n cuda_qmatmul
 * calls (the same codes, plans and epilogue), less n - 1 passes over x. 1 when any part does not
 * take it, nothing queued. */
static int s_w8a8_gemm_n(backend_t *be, cuda_state_t *st, const float *x, int M, int n, const bk_mat_t *const w[],
                         const float *const bias[], float *const y[])
{
    const int i8 = w[0]->qfmt == BK_Q_I8;
    for (int i = 0; i < n; i++)
        if (w[i]->qfmt != w[0]->qfmt || w[i]->qact != w[0]->qact || w[i]->cols != w[0]->cols ||
            !s_w8a8_takes(w[i], y[i], M) || !s_w8_plan(st, i8, M, w[i]->rows, w[i]->cols)->ok)
            return 1;
    const w8_x_t xq = s_w8a8_quantize(be, st, x, M, w[0]->cols, i8);
    for (int i = 0; i < n; i++)
        s_w8a8_run(st, &xq, M, w[i], bias ? bias[i] : NULL, y[i]);   /* planned above: cannot refuse */
    return 0;
}

/* The dense MLP of a W8A8 step (cuda_mlp_swiglu's quantized half, TROUPE_CUDA_W8A8_MLP, default on:
 * on one H100, 2026-12-07, the 8B fp8 step at batch 64 / 256 took 7.50 / 14.91 ms with it against
 * 8.10 / 16.15 without, a 1,000-token prefill 24.0 against 28.1 ms; docs/quantization.md): x
 * quantized once for gate and up, their raw sums, then two passes (k_w8a8_swiglu_h, k_w8a8_rows_q)
 * from those sums to down's codes, then down's GEMM and epilogue: the bits of matmul_n + swiglu +
 * matmul, with 17 bytes an element of [M][I] moved instead of 37 (gate's and up's epilogues, the
 * SwiGLU pass and down's quantize pass) and one launch fewer. g ends holding silu(g) * u, u the raw
 * sums. 1 when a part does not take the W8A8 GEMM, nothing queued. */
int cuda_w8a8_mlp(backend_t *be, const float *x, int M, const bk_mat_t *gate, const bk_mat_t *up,
                  const bk_mat_t *down, float *g, float *u, float *out)
{
    cuda_state_t *st = cuda_st(be);
    if (!st->w8a8_mlp)
        return 1;
    const int64_t I = gate->rows, H = gate->cols;
    const int i8 = gate->qfmt == BK_Q_I8;
    if (M <= s_qgemv_rows(st, gate) || M <= s_qgemv_rows(st, down) || up->qfmt != gate->qfmt ||
        down->qfmt != gate->qfmt || up->qact != gate->qact || down->qact != gate->qact || up->rows != I ||
        up->cols != H || down->cols != I || !s_w8a8_takes(gate, g, M) || !s_w8a8_takes(up, u, M) ||
        !s_w8a8_takes(down, out, M) || !s_w8_plan(st, i8, M, I, H)->ok || !s_w8_plan(st, i8, M, down->rows, I)->ok)
        return 1;
    /* x's codes, then down's (the passes over the sums read x's row scales), then the rows' amax and
     * NaN flags */
    const size_t xb = s_w8_x_bytes(M, H), hb = s_w8_x_bytes(M, I);
    uint8_t *buf = (uint8_t *)cuda_scratch(be, &st->quant_x, &st->quant_x_bytes, xb + hb + (size_t)M * 8);
    const w8_x_t xq = s_w8a8_quantize_into(st, x, M, H, i8, buf);
    s_w8a8_raw(st, &xq, M, gate, g);   /* planned above: cannot refuse */
    s_w8a8_raw(st, &xq, M, up, u);
    uint8_t *hq = buf + xb;
    float *sh = (float *)(hq + s_w8_codes_bytes(M, I));
    unsigned *amax = (unsigned *)(buf + xb + hb);
    int *nan = (int *)(amax + M);
    CUDA_CHECK(cudaMemsetAsync(amax, 0, (size_t)M * 8, st->stream));
    const dim3 grid((unsigned)((I + 1023) / 1024), (unsigned)M);
    cuda_launch(st, i8 ? k_w8a8_swiglu_h<int32_t> : k_w8a8_swiglu_h<float>, grid, dim3(256), (void *)g, (const void *)u,
                I, xq.s, gate->qscale, (int)gate->qgr, up->qscale, (int)up->qgr, amax, nan);
    cuda_launch(st, i8 ? k_w8a8_rows_q<true> : k_w8a8_rows_q<false>, grid, dim3(256), (const float *)g, I,
                (const unsigned *)amax, (const int *)nan, hq, sh);
    const w8_x_t hx = {hq, sh};
    return s_w8a8_run(st, &hx, M, down, NULL, out);
}

void cuda_qmatmul(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y)
{
    if (M <= 0)
        return;
    cuda_state_t *st = cuda_st(be);
    const int64_t N = w->rows, K = w->cols;
    const int gemv_rows = s_qgemv_rows(st, w);
    if (M > gemv_rows && s_w8a8_gemm(be, st, x, M, w, bias, y) == 0)
        return;
    if (M <= gemv_rows && s_qgemv_mma(be, st, 1, &w, x, M, &bias, &y) == 0)
        return;
    if (w->qact) {
        float *xq = (float *)cuda_scratch(be, &st->quant_x, &st->quant_x_bytes, (size_t)M * (size_t)K * 4);
        cuda_launch(st, k_qact, dim3((unsigned)M), dim3(256), x, K, (int)w->qact, xq);
        x = xq;
    }
    if (M <= gemv_rows) {
        s_qgemv(st, w, x, M, bias, y);
        return;
    }
    uint16_t *wb = (uint16_t *)cuda_scratch(be, &st->quant_w, &st->quant_w_bytes, (size_t)N * (size_t)K * 2);
    static int chunks = -1;
    if (chunks < 0) {
        const char *e = getenv("TROUPE_CUDA_QDEQUANT_CHUNKS");
        chunks = !(e && e[0] == '0');
    }
    if (chunks && K % mq_chunk_values(w->qfmt) == 0 && (uintptr_t)w->data % 16 == 0 && N <= INT_MAX &&
        K < (int64_t)UINT32_MAX) {
        switch (w->qfmt) {
        case BK_Q_FP8: s_dequant_chunks<BK_Q_FP8>(st, w, wb); break;
        case BK_Q_I8: s_dequant_chunks<BK_Q_I8>(st, w, wb); break;
        case BK_Q_I4: s_dequant_chunks<BK_Q_I4>(st, w, wb); break;
        default: s_dequant_chunks<BK_Q_FP4>(st, w, wb); break;
        }
    } else {
        const int64_t total = N * K;
        const unsigned blocks = (unsigned)((total + 255) / 256 < 65535 * 4 ? (total + 255) / 256 : 65535 * 4);
        cuda_launch(st, k_qdequant_bf16, dim3(blocks), dim3(256), (const uint8_t *)w->data, w->qscale, (int)w->qfmt, N,
                    K, (int)w->qgr, (int)w->qgc, wb);
    }
    const bk_mat_t plain = {.data = wb, .dtype = DT_BF16, .rows = N, .cols = K};
    cuda_matmul(be, x, M, &plain, bias, y);
}

/* n quantized matmuls over one x (backend.h matmul_n: q, k, v; gate, up): on the tensor-core GEMV
 * one launch for all of them, on the W8A8 GEMM x quantized once for all of them, each part's bits
 * those of its own cuda_qmatmul; else one each. */
void cuda_qmatmul_n(backend_t *be, const float *x, int M, int n, const bk_mat_t *const w[], const float *const bias[],
                    float *const y[])
{
    if (M <= 0)
        return;
    cuda_state_t *st = cuda_st(be);
    if (M <= s_qgemv_rows(st, w[0]) && s_qgemv_mma(be, st, n, w, x, M, bias, y) == 0)
        return;
    if (M > s_qgemv_rows(st, w[0]) && s_w8a8_gemm_n(be, st, x, M, n, w, bias, y) == 0)
        return;
    for (int i = 0; i < n; i++)
        cuda_qmatmul(be, x, M, w[i], bias ? bias[i] : NULL, y[i]);
}
