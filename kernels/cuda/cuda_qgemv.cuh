/* kernels/cuda/cuda_qgemv.cuh — the weight-only GEMV of quantized weights (internal: cuda_quant.cu
 * and tests/gpu/bench_qgemv.cu include it): y[m][n] = sum_k x[m][k] W[n][k] for M <= 8 rows of f32
 * x, W in fp8 e4m3, int8, int4 (value + 8) or fp4 e2m1 codes with f32 block scales
 * (kernels/backend.h's bk_mat_t).
 *
 * A decode step is bound by reading W, so the kernel is built to stream the codes at HBM speed:
 *   - a warp works on QV_R = 4 rows at once: each 8-value piece of x is loaded once (two float4
 *     from L1) and used against the 4 rows' codes, so x costs an L1 load per 4 x 8 weights (the
 *     previous kernel, one row per warp, read 4 bytes of x per fp8 code, 8 per int4 code: L1
 *     bandwidth, not HBM, set its speed);
 *   - every code load is 16 bytes (16 fp8 / int8 codes, 32 nibbles), QV_U chunks of each of the 4
 *     rows in flight per lane, and the first ones issued before the PDL wait (weights never change);
 *   - W warps share a row group's K (1, 2 or 4: qv_warps picks the fewest that still give the
 *     132 SMs several waves of blocks), their sums added in shared memory in warp order (split-K
 *     within the block, no second kernel);
 *   - codes are decoded in registers with no table and no conversion-pipe work per element where
 *     the ALU can do it: fp8 by the hardware's e4m3x2 -> f16x2 convert; int8 by a byte permute into
 *     the mantissa of 2^23 (one PRMT and one FADD per code); int4 by OR-ing nibble pairs into the
 *     mantissa of f16 1024 and one HSUB2 / HFMA2 per two codes (exact); fp4 by placing the nibble's
 *     exponent, mantissa and sign bits into an f16 directly, which gives the value times 2^-14
 *     exactly (the 2^14 goes into the block scale);
 *   - the block scale is applied once per 16 codes (a group of 16..256 columns), or once per row at
 *     the end when the row has one scale (per channel, per tensor): products code * x are f32 and
 *     exact, sums f32.
 * Numerics against the CPU reference (cpu_quant.c: x times the dequantized f32 weight): the same
 * products up to where the scale is applied, f32 sums in another order: relative ~1e-6.
 *
 * Shapes: the vector kernel needs K a multiple of the chunk (16 values; 32 for nibbles), 16-byte
 * aligned code rows and x rows, and a column group of a power of two >= 16 (or the whole row);
 * anything else runs the one-code-per-lane kernel (k_qgemv_any), slower but any shape. */
#ifndef TROUPE_KERNELS_CUDA_QGEMV_CUH
#define TROUPE_KERNELS_CUDA_QGEMV_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_qcodes.cuh"   /* the 4-bit decoders */

#define QV_THREADS 256
#ifndef QV_R
#define QV_R 4                    /* rows per warp group */
#endif
#ifndef QV_U
#define QV_U 2                    /* 16-byte chunks of each row per lane per pass (two passes in flight) */
#endif
#define QV_LK 8                 /* lanes along K per row group by default (32 / LK row groups per warp) */
#ifndef QV_MINB
#define QV_MINB 2                 /* blocks per SM the registers are sized for */
#endif

typedef struct qv_args {
    const uint8_t *codes;         /* [N][K] bytes, or [N][K/2] nibbles */
    const float *scale;           /* [ceil(N/gr)][ngc] */
    int64_t N, K, ngc;
    int gr, gc, gshift;           /* gshift: log2(gc) (vector kernel, group scales) */
    const float *x;               /* [mr][K] f32 */
    int mr;                       /* rows of x, 1..8 */
    const float *bias;            /* [N] or NULL */
    float *y;                     /* [mr][N] */
} qv_args_t;

/* ---- decoding: 8 codes -> 8 f32 values (before the block scale) ------------------------------- */

/* fp8: 8 bytes (two words), the hardware's exact e4m3 -> f16 convert. */
__device__ __forceinline__ void qv_dec8_fp8(uint32_t a, uint32_t b, float *w)
{
    const uint32_t ws[2] = {a, b};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(ws[i / 2] >> (16 * (i % 2))), __NV_E4M3);
        const float2 f = __half22float2(*(const __half2 *)&h);
        w[2 * i] = f.x;
        w[2 * i + 1] = f.y;
    }
}

/* int8: each byte (offset by 128) permuted into the low mantissa byte of 2^23, then 2^23 + 128 off. */
__device__ __forceinline__ void qv_dec8_i8(uint32_t a, uint32_t b, float *w)
{
    const uint32_t ws[2] = {a ^ 0x80808080u, b ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 8; i++)
        w[i] = __uint_as_float(__byte_perm(ws[i / 4], 0x4b000000u, 0x7440u | (uint32_t)(i % 4))) - 8388736.0f;
}

/* Piece p (8 values) of a 16-byte chunk. */
template <int FMT> __device__ __forceinline__ void qv_dec8(const uint4 &q, int p, float *w)
{
    const uint32_t qs[4] = {q.x, q.y, q.z, q.w};
    if constexpr (FMT == BK_Q_FP8)
        qv_dec8_fp8(qs[2 * p], qs[2 * p + 1], w);
    else if constexpr (FMT == BK_Q_I8)
        qv_dec8_i8(qs[2 * p], qs[2 * p + 1], w);
    else if constexpr (FMT == BK_Q_I4)
        qc_dec8_i4(qs[p], w);
    else
        qc_dec8_fp4(qs[p], w);
}

/* What the decoded value is to be multiplied by besides the block scale (fp4: 2^14). */
template <int FMT> __device__ __forceinline__ constexpr float qv_dec_scale() { return FMT == BK_Q_FP4 ? 16384.0f : 1.0f; }

/* ---- the vector kernel --------------------------------------------------------------------------- */

/* MR: x rows the kernel is built for (a.mr <= MR run); W: warps sharing a row group's K; RS: one
 * scale per row (applied at the end), else a scale per group of columns (1 << a.gshift).
 * Lane l of a warp works on row group l / LK (QV_R rows) and on the chunks l % LK, + LK, ... of
 * the warp's share of K: the LK lanes of a group read 16 * LK consecutive code bytes of a row, and
 * the warp's 32 / LK groups read the same x (one L1 wavefront serves them all). LK = 32 (a whole
 * warp along one row: each lane's 64 or 128 bytes of x in lines of their own) is kept for M = 1,
 * to compare (TROUPE_CUDA_QGEMV_LK=32). */
template <int FMT, int MR, int W, bool RS, int LK = QV_LK>
__global__ void __launch_bounds__(QV_THREADS, MR <= 1 ? QV_MINB : 1) k_qgemv_vec(qv_args_t a)
{
    constexpr bool NIB = FMT == BK_Q_I4 || FMT == BK_Q_FP4;
    constexpr int CH = NIB ? 32 : 16;             /* values per 16-byte chunk */
    constexpr int RG = 32 / LK;                 /* row groups per warp */
    constexpr int G = QV_THREADS / 32 / W;         /* warp groups per block */
    constexpr int RB = G * RG * QV_R;              /* rows per block */
    constexpr int STEP = W * LK;                /* chunks between a lane's consecutive ones */
    __shared__ float part_s[QV_THREADS / 32][RG][MR * QV_R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, seg = warp % W, rg = lane / LK,
              kl = lane % LK;
    const int64_t n0 = (int64_t)blockIdx.x * RB + ((warp / W) * RG + rg) * QV_R;
    const int64_t rowb = NIB ? a.K / 2 : a.K, nch = a.K / CH;
    const uint4 *wr[QV_R];
    const float *sr[QV_R];
#pragma unroll
    for (int r = 0; r < QV_R; r++) {
        const int64_t n = n0 + r < a.N ? n0 + r : a.N - 1;  /* rows past N: read row N-1, store nothing */
        wr[r] = (const uint4 *)(a.codes + n * rowb);
        sr[r] = a.scale + (a.gr == 1 ? n : (int64_t)((uint32_t)n / (uint32_t)a.gr)) * a.ngc;   /* N < 2^31 */
    }
    int64_t c0 = (int64_t)seg * LK + kl;
    uint4 q[QV_U][QV_R];
#pragma unroll
    for (int u = 0; u < QV_U; u++)
#pragma unroll
        for (int r = 0; r < QV_R; r++)
            if (c0 + (int64_t)u * STEP < nch)
                q[u][r] = __ldg(wr[r] + c0 + (int64_t)u * STEP);
    DEV_PDL_ENTER();
    float acc[MR][QV_R];
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int r = 0; r < QV_R; r++)
            acc[m][r] = 0.0f;
    while (c0 < nch) {
        uint4 qn[QV_U][QV_R];                      /* the next pass's codes, in flight while this one is summed */
        const int64_t c1 = c0 + (int64_t)QV_U * STEP;
#pragma unroll
        for (int u = 0; u < QV_U; u++)
#pragma unroll
            for (int r = 0; r < QV_R; r++)
                if (c1 + (int64_t)u * STEP < nch)
                    qn[u][r] = __ldg(wr[r] + c1 + (int64_t)u * STEP);
#pragma unroll
        for (int u = 0; u < QV_U; u++) {
            const int64_t c = c0 + (int64_t)u * STEP;
            if (c >= nch)
                break;
#pragma unroll
            for (int h = 0; h < CH / 16; h++) {    /* 16 values: one scale each */
                const int64_t col = c * CH + 16 * h;
                float s[QV_R];
                if constexpr (!RS) {
#pragma unroll
                    for (int r = 0; r < QV_R; r++)
                        s[r] = __ldg(sr[r] + (col >> a.gshift)) * qv_dec_scale<FMT>();
                }
                float part[MR][QV_R];
#pragma unroll
                for (int m = 0; m < MR; m++)
#pragma unroll
                    for (int r = 0; r < QV_R; r++)
                        part[m][r] = 0.0f;
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    float xv[MR][8];
#pragma unroll
                    for (int m = 0; m < MR; m++) {
                        if (m < a.mr) {
                            const float4 *xp = (const float4 *)(a.x + (int64_t)m * a.K + col + 8 * p);
                            const float4 xa = __ldg(xp), xb = __ldg(xp + 1);
                            xv[m][0] = xa.x, xv[m][1] = xa.y, xv[m][2] = xa.z, xv[m][3] = xa.w;
                            xv[m][4] = xb.x, xv[m][5] = xb.y, xv[m][6] = xb.z, xv[m][7] = xb.w;
                        }
                    }
#pragma unroll
                    for (int r = 0; r < QV_R; r++) {
                        float wv[8];
                        qv_dec8<FMT>(q[u][r], NIB ? 2 * h + p : p, wv);
#pragma unroll
                        for (int m = 0; m < MR; m++)
                            if (m < a.mr)
#pragma unroll
                                for (int i = 0; i < 8; i++)
                                    part[m][r] = fmaf(xv[m][i], wv[i], part[m][r]);
                    }
                }
#pragma unroll
                for (int m = 0; m < MR; m++)
#pragma unroll
                    for (int r = 0; r < QV_R; r++)
                        acc[m][r] = RS ? acc[m][r] + part[m][r] : fmaf(part[m][r], s[r], acc[m][r]);
            }
        }
        c0 = c1;
#pragma unroll
        for (int u = 0; u < QV_U; u++)
#pragma unroll
            for (int r = 0; r < QV_R; r++)
                q[u][r] = qn[u][r];
    }
    /* the group's LK lanes, then the W warps in warp order */
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int r = 0; r < QV_R; r++) {
            float v = acc[m][r];
#pragma unroll
            for (int off = LK / 2; off > 0; off >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, off);
            acc[m][r] = v;
        }
    if (kl == 0) {
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int r = 0; r < QV_R; r++)
                part_s[warp][rg][m * QV_R + r] = acc[m][r];
    }
    __syncthreads();
    if (seg == 0) {
        for (int i = kl; i < MR * QV_R; i += LK) {
            const int m = i / QV_R, r = i % QV_R;
            const int64_t n = n0 + r;
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < W; w++)
                v += part_s[warp + w][rg][i];
            if (m < a.mr && n < a.N) {
                if constexpr (RS)
                    v *= __ldg(a.scale + (a.gr == 1 ? n : (int64_t)((uint32_t)n / (uint32_t)a.gr)) * a.ngc) *
                         qv_dec_scale<FMT>();
                a.y[(int64_t)m * a.N + n] = v + (a.bias ? a.bias[n] : 0.0f);
            }
        }
    }
}

/* ---- any shape: a warp per row, one code per lane per step -------------------------------------- */

__device__ __forceinline__ float qv_code(int fmt, const uint8_t *row, int64_t c)
{
    if (fmt == BK_Q_FP8) {
        __nv_fp8_e4m3 f;
        f.__x = (__nv_fp8_storage_t)row[c];
        return (float)f;
    }
    if (fmt == BK_Q_I8)
        return (float)(int8_t)row[c];
    const uint8_t b = row[c >> 1];
    const unsigned nib = (c & 1) ? b >> 4 : b & 15u;
    if (fmt == BK_Q_I4)
        return (float)((int)nib - 8);
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (nib & 8) ? -mag[nib & 7] : mag[nib & 7];
}

static __global__ void __launch_bounds__(QV_THREADS) k_qgemv_any(qv_args_t a, int fmt)
{
    DEV_PDL_ENTER();
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * (QV_THREADS / 32) + (threadIdx.x >> 5);
    if (n >= a.N)
        return;
    const bool nib = fmt == BK_Q_I4 || fmt == BK_Q_FP4;
    const uint8_t *row = a.codes + (nib ? n * (a.K / 2) : n * a.K);
    const float *srow = a.scale + (int64_t)((uint32_t)n / (uint32_t)a.gr) * a.ngc;   /* N, K < 2^31 */
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t c = lane; c < a.K; c += 32) {
        const float w = qv_code(fmt, row, c) * srow[(uint32_t)c / (uint32_t)a.gc];
#pragma unroll
        for (int m = 0; m < 8; m++)
            if (m < a.mr)
                acc[m] = fmaf(w, a.x[(int64_t)m * a.K + c], acc[m]);
    }
#pragma unroll
    for (int m = 0; m < 8; m++) {
        const float v = dev_warp_sum(acc[m]);
        if (lane == 0 && m < a.mr)
            a.y[(int64_t)m * a.N + n] = v + (a.bias ? a.bias[n] : 0.0f);
    }
}

/* ---- choosing a kernel ------------------------------------------------------------------------------ */

typedef void (*qv_kernel_t)(qv_args_t);

/* 1 when the vector kernel takes this weight (and x): see the header. *rs: one scale per row. */
static inline bool qv_vector_ok(int fmt, int64_t N, int64_t K, int gr, int gc, const void *codes, const float *x,
                                bool *rs, int *gshift)
{
    const bool nib = fmt == BK_Q_I4 || fmt == BK_Q_FP4;
    const int64_t ch = nib ? 32 : 16;
    *rs = gc >= K;
    *gshift = 0;
    if (!*rs) {
        if (gc < 16 || (gc & (gc - 1)))
            return false;
        while ((1 << *gshift) < gc)
            ++*gshift;
    }
    (void)N;
    (void)gr;
    return K % ch == 0 && (uintptr_t)codes % 16 == 0 && (uintptr_t)x % 16 == 0 && (nib ? (K / 2) % 16 : K % 16) == 0;
}

/* Warps sharing a row group's K: the fewest of 2, 4, 8 that give at least 4 blocks per SM, as long
 * as every lane keeps two chunks of each row. */
static inline int qv_warps(int64_t N, int64_t K, int fmt, int n_sm, int LK)
{
    const int64_t nch = K / (fmt == BK_Q_I4 || fmt == BK_Q_FP4 ? 32 : 16);
    int w = 2;
    while (w < 8 && (N * w * LK + 1023) / 1024 < 4 * (int64_t)n_sm && nch >= 2 * LK * 2 * w)
        w *= 2;
    return w;
}

template <int FMT, int MR, bool RS, int LK> static inline qv_kernel_t qv_pick_w(int w)
{
    return w <= 2 ? k_qgemv_vec<FMT, MR, 2, RS, LK> : w == 4 ? k_qgemv_vec<FMT, MR, 4, RS, LK>
                                                             : k_qgemv_vec<FMT, MR, 8, RS, LK>;
}

template <int FMT, bool RS> static inline qv_kernel_t qv_pick_m(int mr, int w, int lk)
{
    if (lk == 32)
        return mr <= 1 ? qv_pick_w<FMT, 1, RS, 32>(w) : NULL;
    return mr <= 1 ? qv_pick_w<FMT, 1, RS, QV_LK>(w) : mr <= 2 ? qv_pick_w<FMT, 2, RS, QV_LK>(w)
         : mr <= 4 ? qv_pick_w<FMT, 4, RS, QV_LK>(w) : qv_pick_w<FMT, 8, RS, QV_LK>(w);
}

/* The vector kernel for (fmt, mr rows, w warps, rs, lk lanes along K: QV_LK, or 32 for mr 1);
 * NULL for a combination not built (int8 and the 4-bit formats with group scales, fp4 with one
 * scale per row: the formats never make them; lk 32 with mr > 1). */
static inline qv_kernel_t qv_kernel(int fmt, int mr, int w, bool rs, int lk)
{
    switch (fmt) {
    case BK_Q_FP8: return rs ? qv_pick_m<BK_Q_FP8, true>(mr, w, lk) : qv_pick_m<BK_Q_FP8, false>(mr, w, lk);
    case BK_Q_I8: return rs ? qv_pick_m<BK_Q_I8, true>(mr, w, lk) : NULL;
    case BK_Q_I4: return rs ? NULL : qv_pick_m<BK_Q_I4, false>(mr, w, lk);
    case BK_Q_FP4: return rs ? NULL : qv_pick_m<BK_Q_FP4, false>(mr, w, lk);
    default: return NULL;
    }
}

/* Blocks of the vector kernel with w warps per row group. */
static inline unsigned qv_blocks(int64_t N, int w, int LK)
{
    const int64_t rows = (int64_t)(QV_THREADS / 32 / w) * (32 / LK) * QV_R;
    return (unsigned)((N + rows - 1) / rows);
}

#endif
