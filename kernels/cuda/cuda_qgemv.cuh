/* kernels/cuda/cuda_qgemv.cuh — the weight-only GEMV of quantized weights (internal: cuda_quant.cu
 * and tests/gpu/bench_qgemv.cu include it): y[m][n] = sum_k x[m][k] W[n][k] for M <= 8 rows of f32
 * x, W in fp8 e4m3, int8, int4 (value + 8) or fp4 e2m1 codes with f32 block scales
 * (kernels/backend.h's bk_mat_t).
 *
 * A decode step is bound by reading W, so the kernel is built to keep enough code bytes in flight
 * on every SM, for small matrices too (a 1,024 x 4,096 fp8 matrix is 4 MB: about 30 KB per SM,
 * which is what an SM must have in flight anyway to cover the DRAM latency at full bandwidth):
 *
 * Layout (which lane loads which bytes, and why):
 *   - a block is 8 warps; W of them (2, 4 or 8) share one set of rows, each taking every W-th
 *     slice of K (split-K within the block; their sums are added in shared memory in warp order);
 *   - a warp is 32 / LK row groups of LK lanes (LK = 8; 32 kept for M = 1 to compare); a lane works
 *     on R consecutive rows (1, 2 or 4) and on the 16-byte chunks seg * LK + kl + i * W * LK of
 *     them (seg: the warp's place among the W, kl: the lane's place in its group): one load
 *     instruction of a warp reads 16 * LK contiguous bytes of each of its rows, and the W warps of
 *     a row set together read 16 * LK * W contiguous bytes of each row per pass;
 *   - the 32 / LK row groups of a warp read the same x addresses: one L1 wavefront serves them all
 *     (with LK = 32 each lane's 64 or 128 bytes of x sit in lines of their own: four times the
 *     wavefronts), and a lane's R rows share each x load it makes: x costs an L1 load per R x 8
 *     codes per x row;
 *   - each lane keeps QV_INFLIGHT = 8 code loads in flight (U = 8 / R chunks of each of its R
 *     rows): a chunk's registers are refilled with the chunk U passes ahead as soon as it is
 *     consumed, so the lane never waits for more than one chunk while U - 1 more are on the way,
 *     without a second set of registers; the first U are issued before the PDL wait (weights never
 *     change). Codes are read with L1::no_allocate (streamed once) so that x keeps the L1;
 *   - qv_plan picks R and W by the shape: W as large as keeps each lane two chunks of a row, then R
 *     as large as still gives every SM its resident blocks (at M = 1 a 14,336-row matrix: 4 rows a
 *     lane, each x load used 4 times; 4,096 rows: 2; 1,024: 1, so that every SM has blocks). Few
 *     registers at M = 1 (3 blocks per SM), so several blocks per SM hide each other's start and
 *     end.
 * Per code, at M rows of x, a lane decodes the code once (below) and does M FMAs with it: the
 * decoded weight stays in registers for all rows of x.
 *
 * Decoding, in registers with no table and no conversion-pipe work per element where the ALU can do
 * it: fp8 by the hardware's e4m3x2 -> f16x2 convert; int8 by a byte permute into the mantissa of
 * 2^23 (one PRMT and one FADD per code); int4 by OR-ing nibble pairs into the mantissa of f16 1024
 * and one HSUB2 / HFMA2 per two codes (exact); fp4 by placing the nibble's exponent, mantissa and
 * sign bits into an f16 directly, which gives the value times 2^-14 exactly (the 2^14 goes into
 * the block scale). The block scale is applied once per 16 codes (a group of 16..256 columns), or
 * once per row at the end when the row has one scale (per channel, per tensor): products code * x
 * are f32 and exact, sums f32.
 * Numerics against the CPU reference (cpu_quant.c: x times the dequantized f32 weight): the same
 * products up to where the scale is applied, f32 sums in another order: relative ~1e-6. A row's
 * order depends on K (through W) and LK only, not on R or M: batch-invariant at LK = 8.
 *
 * Shapes: the vector kernel needs K a multiple of the chunk (16 values; 32 for nibbles), 16-byte
 * aligned code rows and x rows, and a column group of a power of two >= 16 (or the whole row);
 * anything else runs the one-code-per-lane kernel (k_qgemv_any), slower but any shape.
 * Known limits (by arithmetic, not yet measured): at M = 8 the f32 FMAs (8 per code) bound the
 * 4-bit formats near 2x their M = 1 time (an SM's 128 FMAs per clock against 24 nibbles per clock
 * at the HBM rate), and x's L1 wavefronts (8 lines per 16-byte load of a nibble chunk's x, over
 * 4 x R rows) come close to that too; the way past both is the tensor cores with x split into
 * bf16 hi + lo (every code is exact in bf16) and x staged in shared memory, not done yet. */
#ifndef TROUPE_KERNELS_CUDA_QGEMV_CUH
#define TROUPE_KERNELS_CUDA_QGEMV_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_dev.cuh"

#define QV_THREADS 256
#define QV_LK 8                   /* lanes along K per row group by default (32 / LK row groups per warp) */
#ifndef QV_INFLIGHT
#define QV_INFLIGHT 8             /* 16-byte code loads in flight per lane (U chunks x R rows) */
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

/* int4 (value + 8, element i at bits 4i): nibble pairs (i, i + 4) into f16 1024 + n (or 1024 + 16n),
 * then minus 1032 (or / 16 - 72): n - 8 exactly. */
__device__ __forceinline__ void qv_dec8_i4(uint32_t q, float *w)
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

/* fp4 e2m1 (bit 3 sign, bits 1-2 exponent, bit 0 mantissa): exponent and mantissa bits to f16 bits
 * 9-11, the sign to bit 15: the f16 is the value times 2^-14, exactly (subnormals included). */
__device__ __forceinline__ void qv_dec8_fp4(uint32_t q, float *w)
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

/* Piece p (8 values) of a 16-byte chunk. */
template <int FMT> __device__ __forceinline__ void qv_dec8(const uint4 &q, int p, float *w)
{
    const uint32_t qs[4] = {q.x, q.y, q.z, q.w};
    if constexpr (FMT == BK_Q_FP8)
        qv_dec8_fp8(qs[2 * p], qs[2 * p + 1], w);
    else if constexpr (FMT == BK_Q_I8)
        qv_dec8_i8(qs[2 * p], qs[2 * p + 1], w);
    else if constexpr (FMT == BK_Q_I4)
        qv_dec8_i4(qs[p], w);
    else
        qv_dec8_fp4(qs[p], w);
}

/* What the decoded value is to be multiplied by besides the block scale (fp4: 2^14). */
template <int FMT> __device__ __forceinline__ constexpr float qv_dec_scale() { return FMT == BK_Q_FP4 ? 16384.0f : 1.0f; }

/* ---- the vector kernel --------------------------------------------------------------------------- */

/* Blocks per SM the registers are sized for: at M = 1 three (80 registers; two with 4 rows a lane,
 * whose row pointers, scales and decoded values spilled at 80), so that a block starting or ending
 * on an SM leaves the others streaming; at M = 2 two; at M = 4 and 8 the accumulators (M x R) and
 * decoded weights need the registers of one. */
#define QV_MINB(MR, R) ((MR) <= 1 ? ((R) >= 4 ? 2 : 3) : (MR) <= 2 ? 2 : 1)

/* A 16-byte load of codes: read once, so not kept in L1 (where x is). Immutable memory: ld.global.nc. */
__device__ __forceinline__ uint4 qv_ld_codes(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* One chunk of each of a lane's R rows (codes q[r], columns col0 ..) against the a.mr rows of x, into
 * acc[m][r]; sr[r]: row r's scales (group scales only). */
template <int FMT, int MR, int R, bool RS>
__device__ __forceinline__ void qv_chunk(const qv_args_t &a, const uint4 (&q)[R], int64_t col0,
                                         const float *const (&sr)[R], float (&acc)[MR][R])
{
    constexpr bool NIB = FMT == BK_Q_I4 || FMT == BK_Q_FP4;
    constexpr int CH = NIB ? 32 : 16;
#pragma unroll
    for (int h = 0; h < CH / 16; h++) {            /* 16 values: one scale each */
        const int64_t col = col0 + 16 * h;
        float s[R];
        if constexpr (!RS) {
#pragma unroll
            for (int r = 0; r < R; r++)
                s[r] = __ldg(sr[r] + (col >> a.gshift)) * qv_dec_scale<FMT>();
        }
        float part[MR][R];                         /* one scale per row: the accumulators themselves */
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int r = 0; r < R; r++)
                part[m][r] = RS ? acc[m][r] : 0.0f;
#pragma unroll
        for (int p = 0; p < 2; p++) {              /* 8 values: one x load of each row of x */
            const int piece = NIB ? 2 * h + p : p;
            if constexpr (MR <= 2) {               /* few rows of x: hold x, decode one row of W at a time */
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
                for (int r = 0; r < R; r++) {
                    float wv[8];
                    qv_dec8<FMT>(q[r], piece, wv);
#pragma unroll
                    for (int m = 0; m < MR; m++)
                        if (m < a.mr)
#pragma unroll
                            for (int i = 0; i < 8; i++)
                                part[m][r] = fmaf(xv[m][i], wv[i], part[m][r]);
                }
            } else {                               /* many: hold the R rows' decoded weights, one row of x at a time */
                float wv[R][8];
#pragma unroll
                for (int r = 0; r < R; r++)
                    qv_dec8<FMT>(q[r], piece, wv[r]);
#pragma unroll
                for (int m = 0; m < MR; m++) {
                    if (m < a.mr) {
                        const float4 *xp = (const float4 *)(a.x + (int64_t)m * a.K + col + 8 * p);
                        const float4 xa = __ldg(xp), xb = __ldg(xp + 1);
                        const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                        for (int r = 0; r < R; r++)
#pragma unroll
                            for (int i = 0; i < 8; i++)
                                part[m][r] = fmaf(xv[i], wv[r][i], part[m][r]);
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[m][r] = RS ? part[m][r] : fmaf(part[m][r], s[r], acc[m][r]);
    }
}

/* MR: x rows the kernel is built for (a.mr <= MR run); R: rows of W per lane; W: warps sharing a
 * row set's K; RS: one scale per row (applied at the end), else a scale per group of columns
 * (1 << a.gshift); LK: lanes along K per row group. The layout is the header's. */
template <int FMT, int MR, int R, int W, bool RS, int LK>
__global__ void __launch_bounds__(QV_THREADS, QV_MINB(MR, R)) k_qgemv_vec(qv_args_t a)
{
    constexpr bool NIB = FMT == BK_Q_I4 || FMT == BK_Q_FP4;
    constexpr int CH = NIB ? 32 : 16;             /* values per 16-byte chunk */
    constexpr int U = QV_INFLIGHT / R;            /* chunks of each row in flight per lane */
    constexpr int RG = 32 / LK;                   /* row groups per warp */
    constexpr int G = QV_THREADS / 32 / W;        /* row sets per block */
    constexpr int RB = G * RG * R;                /* rows per block */
    constexpr int STEP = W * LK;                  /* chunks between a lane's consecutive ones */
    static_assert(U * R == QV_INFLIGHT && (W == 2 || W == 4 || W == 8) && (LK == 8 || LK == 32), "plan");
    __shared__ float part_s[QV_THREADS / 32][RG][MR * R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, seg = warp % W, rg = lane / LK,
              kl = lane % LK;
    const int64_t n0 = (int64_t)blockIdx.x * RB + ((warp / W) * RG + rg) * R;
    const int64_t rowb = NIB ? a.K / 2 : a.K, nch = a.K / CH;
    const uint4 *wr[R];
    const float *sr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t n = n0 + r < a.N ? n0 + r : a.N - 1;  /* rows past N: read row N-1, store nothing */
        wr[r] = (const uint4 *)(a.codes + n * rowb);
        sr[r] = a.scale + (a.gr == 1 ? n : (int64_t)((uint32_t)n / (uint32_t)a.gr)) * a.ngc;   /* N < 2^31 */
    }
    const int64_t cb = (int64_t)seg * LK + kl;     /* the lane's first chunk */
    uint4 q[U][R];                                 /* slot u: the lane's chunk cb + (u + U * pass) * STEP */
#pragma unroll
    for (int u = 0; u < U; u++)
        if (cb + (int64_t)u * STEP < nch)
#pragma unroll
            for (int r = 0; r < R; r++)
                q[u][r] = qv_ld_codes(wr[r] + cb + (int64_t)u * STEP);
    DEV_PDL_ENTER();
    float acc[MR][R];
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[m][r] = 0.0f;
    for (int64_t c0 = cb; c0 < nch; c0 += (int64_t)U * STEP) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t c = c0 + (int64_t)u * STEP;
            if (c >= nch)
                break;
            qv_chunk<FMT, MR, R, RS>(a, q[u], c * CH, sr, acc);
            const int64_t cn = c + (int64_t)U * STEP;  /* the slot's next chunk, in flight behind the other U - 1 */
            if (cn < nch)
#pragma unroll
                for (int r = 0; r < R; r++)
                    q[u][r] = qv_ld_codes(wr[r] + cn);
        }
    }
    /* the group's LK lanes (lanes without a chunk add zeros), then the W warps in warp order */
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int r = 0; r < R; r++) {
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
            for (int r = 0; r < R; r++)
                part_s[warp][rg][m * R + r] = acc[m][r];
    }
    __syncthreads();
    if (seg == 0) {
        for (int i = kl; i < MR * R; i += LK) {
            const int m = i / R, r = i % R;
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

/* Rows of W one block covers with R rows per lane, W warps per row set, LK lanes along K. */
static inline int64_t qv_rows_per_block(int R, int W, int LK) { return (int64_t)(QV_THREADS / 32 / W) * (32 / LK) * R; }

/* Blocks of the vector kernel. */
static inline unsigned qv_blocks(int64_t N, int R, int W, int LK)
{
    const int64_t rows = qv_rows_per_block(R, W, LK);
    return (unsigned)((N + rows - 1) / rows);
}

/* The plan for an N x K weight and mr rows of x: W, the warps sharing a row set's K, the most of 8,
 * 4, 2 that keep every lane two chunks of a row (a K of 4,096: 8); then R, the rows per lane, the
 * most of 4, 2, 1 that still give every SM its resident blocks (QV_MINB: 3 at mr 1, 2 at mr 2, 1
 * above): more rows a lane use each x load more often, more blocks keep every SM streaming when N
 * is small. At least 2 for mr > 2 (each x load then feeds mr x R x 8 FMAs, and the L1's x
 * wavefronts, not the FMAs, would bound 1 row a lane; not built). w_force / r_force (non-zero)
 * override, for measuring. A row's sums depend on W and LK only (R changes which lane holds the
 * row, not the order of its additions), so its result does not change with mr: batch-invariant. */
static inline void qv_plan(int fmt, int mr, int64_t N, int64_t K, int lk, int n_sm, int w_force, int r_force, int *R,
                           int *W)
{
    const int64_t nch = K / (fmt == BK_Q_I4 || fmt == BK_Q_FP4 ? 32 : 16);
    int w = 8;
    while (w > 2 && nch < 2 * (int64_t)w * lk)
        w /= 2;
    if (w_force)
        w = w_force;
    const int64_t want = (int64_t)(mr <= 1 ? 3 : mr <= 2 ? 2 : 1) * n_sm;
    int r = 4;
    while (r > 1 && (int64_t)qv_blocks(N, r, w, lk) < want)
        r /= 2;
    if (r_force)
        r = r_force;
    if (mr > 2 && r < 2)
        r = 2;
    *R = r;
    *W = w;
}

template <int FMT, int MR, bool RS, int LK, int R> static inline qv_kernel_t qv_pick_w(int w)
{
    return w <= 2 ? k_qgemv_vec<FMT, MR, R, 2, RS, LK> : w == 4 ? k_qgemv_vec<FMT, MR, R, 4, RS, LK>
                                                                : k_qgemv_vec<FMT, MR, R, 8, RS, LK>;
}

template <int FMT, int MR, bool RS, int LK> static inline qv_kernel_t qv_pick_r(int r, int w)
{
    if constexpr (MR > 2) {                        /* 1 row a lane not built (qv_plan) */
        return r <= 1 ? NULL : r == 2 ? qv_pick_w<FMT, MR, RS, LK, 2>(w) : qv_pick_w<FMT, MR, RS, LK, 4>(w);
    } else {
        return r <= 1 ? qv_pick_w<FMT, MR, RS, LK, 1>(w) : r == 2 ? qv_pick_w<FMT, MR, RS, LK, 2>(w)
                                                                  : qv_pick_w<FMT, MR, RS, LK, 4>(w);
    }
}

template <int FMT, bool RS> static inline qv_kernel_t qv_pick_m(int mr, int r, int w, int lk)
{
    if (lk == 32)
        return mr <= 1 ? qv_pick_r<FMT, 1, RS, 32>(r, w) : NULL;
    return mr <= 1 ? qv_pick_r<FMT, 1, RS, QV_LK>(r, w) : mr <= 2 ? qv_pick_r<FMT, 2, RS, QV_LK>(r, w)
         : mr <= 4 ? qv_pick_r<FMT, 4, RS, QV_LK>(r, w) : qv_pick_r<FMT, 8, RS, QV_LK>(r, w);
}

/* The vector kernel for (fmt, mr rows of x, r rows per lane (1, 2, 4), w warps (2, 4, 8), rs, lk
 * lanes along K: QV_LK, or 32 for mr 1); NULL for a combination not built (int8 and the 4-bit
 * formats with group scales, fp4 with one scale per row: the formats never make them; lk 32 with
 * mr > 1; r 1 with mr > 2). Launch it with qv_blocks(N, r, w, lk) blocks of QV_THREADS. */
static inline qv_kernel_t qv_kernel(int fmt, int mr, int r, int w, bool rs, int lk)
{
    switch (fmt) {
    case BK_Q_FP8: return rs ? qv_pick_m<BK_Q_FP8, true>(mr, r, w, lk) : qv_pick_m<BK_Q_FP8, false>(mr, r, w, lk);
    case BK_Q_I8: return rs ? qv_pick_m<BK_Q_I8, true>(mr, r, w, lk) : NULL;
    case BK_Q_I4: return rs ? NULL : qv_pick_m<BK_Q_I4, false>(mr, r, w, lk);
    case BK_Q_FP4: return rs ? NULL : qv_pick_m<BK_Q_FP4, false>(mr, r, w, lk);
    default: return NULL;
    }
}

#endif
