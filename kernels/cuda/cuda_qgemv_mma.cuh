/* kernels/cuda/cuda_qgemv_mma.cuh — the weight-only GEMV of quantized weights on the tensor cores
 * (internal: cuda_quant.cu and tests/gpu/bench_qgemv.cu include it): y[m][n] = sum_k x[m][k] W[n][k]
 * for M <= 8 rows of f32 x (16 with W8A8 activations or QM_F_WIDE: qm_launch_rows), W in fp8 e4m3, int8, int4 or
 * fp4 e2m1 codes with f32 block scales (kernels/backend.h's bk_mat_t), optionally x quantized per
 * row first (W8A8's dynamic fp8 / int8 activations, bk_mat_t.qact). One launch may cover up to
 * QM_PARTS matrices over the same x (q, k, v; gate, up): its blocks are dealt out to the parts in
 * order, each part with its own codes, scales, bias and output.
 *
 * Why: the CUDA-core GEMV (cuda_qgemv.cuh) spends several instructions per weight and row of x
 * (decode, convert to f32, one FMA per row) and is bound by them, not by HBM (docs/quantization.md:
 * 3.4-4.0 ms for the 8B's weights whatever their bytes, eight rows 3.8x one). Here one mma.sync
 * m16n8k16 (f16 in, f32 accumulation) does 16 rows x 16 k x 8 columns, the codes are decoded in
 * registers straight into its A fragment (every code is exact in f16) and x's rows are its
 * columns, so the work per weight is the decode alone, about one instruction per two codes.
 *
 * x as f16 operands, xs [R][K] (qm_stage_row; the same function wherever it runs, so the same bits):
 *   - weight-only (qact none): each row as hi + lo f16 (hi = f16(x p), lo = f16(x p - hi), the
 *     difference exact in f32: ~22 bits of x), p = 2^e chosen from the row's amax so that
 *     amax p lies in [2^14, 2^15): hi and lo stay in f16's range and normal where it matters,
 *     and 1 / p is undone exactly after the sum (xmul[m] = 2^-e). Rows 0..M-1 of xs are the hi
 *     parts, M..2M-1 the lo parts (R = 2M): for M <= 4 one mma's 8 columns hold both;
 *   - W8A8 (qact fp8 / int8): the row's codes q = quant(x / s), s = amax / 448 or amax / 127 as
 *     cpu_quant_act_row computes them; every code is exact in f16, so one row each (R = M)
 *     and y = s * sum q W: the products are exact, the CPU's x = q s rounded once more.
 *   For 4-bit weights each group of 8 k is stored in the order 0 4 1 5 2 6 3 7, the order in
 *   which a nibble word decodes into f16 pairs (below).
 * Where xs fits in QM_STAGE_MAX bytes of shared memory (every M = 1 decode shape, and M up to 4 at
 * K = 4,096), each block computes the rows' amax and writes xs into its own shared memory after the
 * PDL wait: no other launch, and nothing in device memory between the two. Else one pre-pass launch
 * (k_qm_prep, a block per row) writes xs to scratch for every part and block of the GEMV after it.
 *
 * The GEMV (k_qgemv_mma): a block of W warps takes row blocks of 16 rows of W (the mma's m) in
 * turn (blockIdx.x, + gridDim.x, ...; the grid is what the SMs hold at once, so xs is staged once
 * per block, and a warp's loads for its next row block are issued before the reduction of the
 * current one); its warps split K into steps (warp w takes steps w, w + W, ...; 64 k for byte codes, 128 for nibbles: each lane
 * one 16-byte chunk of rows g and g + 8, lanes t = 0..3 of a row 64 contiguous bytes), QM_U steps
 * of loads in flight per lane and the next QM_U issued before the current ones are used (the first
 * before the PDL wait: weights never change). A step's mmas accumulate into a fresh fragment from
 * 0, which is then added (per row scale) or FMA'd with the rows' group scale (groups: the step lies
 * inside one group, gc a multiple of the step) into the total in f32: the tensor cores' own
 * accumulation spans 4 or 8 mmas only (nibbles with smaller groups, nvfp4's 16: k_qgemv_mma_bd
 * below). The W warps' fragments are added in shared memory in warp order (qm_put, qm_finish:
 * deterministic, no atomics, one piece of code for both kernels), then hi + lo, times xmul[m],
 * times the row scale (per channel / per tensor), plus the bias.
 *
 * Fragment layout (PTX ISA, mma.m16n8k16 .f16, g = lane / 4, t = lane % 4): a[0] = A[g][2t, 2t+1],
 * a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g],
 * b1 = B[2t+8, 2t+9][g]; c[0..1] = C[g][2t, 2t+1], c[2..3] = C[g+8][2t, 2t+1]. A lane's logical k
 * (2t, 2t+1, 2t+8, 2t+9) are mapped to physical k of its own chunk, the same for A and B (the map
 * depends on t only, as A's rows and B's columns of one t share them), so the dot products are
 * unchanged and every lane decodes and loads contiguous bytes (cuda_gemv_mma.cuh does the same):
 *   - byte codes, step s, lane t: physical k 64 s + 16 t + 4 j + {0, 1, 2, 3} is mma j's logical
 *     k {2t, 2t+1, 2t+8, 2t+9}: A word j of the chunk, bytes 0-1 then 2-3; B f16 words 2j, 2j+1;
 *   - nibbles, step s, lane t: word i of the chunk holds k 128 s + 32 t + 8 i + 0..7, decoded as
 *     the f16 pairs (0, 4), (1, 5), (2, 6), (3, 7): mma 2i takes the first two as logical
 *     (2t, 2t+1) and (2t+8, 2t+9), mma 2i + 1 the last two; xs holds x in that order.
 * Decoding (no tables): fp8 by the hardware's e4m3x2 -> f16x2 convert (one per two codes); int8 by
 * a byte permute into f16 1024 + (code + 128) and one HSUB2 per two; int4 by OR-ing nibble pairs
 * into the mantissa of f16 1024 and one HSUB2 / HFMA2 per two (as cuda_qgemv.cuh); fp4 by moving
 * its bits into an f16 and one HMUL2 per two.
 *
 * Numerics against the CPU reference (x times the dequantized f32 weight): products exact in the
 * tensor cores (f16 x f16), x kept to ~22 bits (weight-only) or exactly (W8A8 codes), f32 sums in
 * another order: relative ~1e-6. The summation order depends on K and the format only: a row's
 * result does not depend on the other rows of x (each column of the mma is its own dot product,
 * xs's scale is per row), nor on M, nor on where xs was made, nor on the other parts of a launch
 * or N (the warps per block come from K: qm_warps). So a row's bits are the same at any M, and
 * matmul_n's parts equal separate matmuls. Forcing the warps (TROUPE_CUDA_QGEMV_MMA=4/8/16) changes
 * the order.
 *
 * Shapes: K a multiple of 16 (byte codes) or 32 (nibbles), 16-byte aligned codes and x, one scale
 * per row or column groups of a multiple of the step (64 k for byte codes; nibbles: any multiple of
 * 16); N < 2^31. Anything else runs cuda_qgemv.cuh's kernels (qm_ok says which).
 * Known limits: a row block is one block's over all of K (no split-K across blocks), so a lone
 * matrix of few rows and short K leaves SMs idle (q|k|v in one launch has 384 row blocks at the
 * 8B); the small-group kernel needs R / 2 mmas per 16 k (eight at M = 8, where it spills
 * registers). */
#ifndef TROUPE_KERNELS_CUDA_QGEMV_MMA_CUH
#define TROUPE_KERNELS_CUDA_QGEMV_MMA_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_mma.cuh"

#ifndef QM_U
#define QM_U 4                    /* steps of loads in flight per lane (another QM_U issued ahead) */
#endif
#define QM_PREP_THREADS 512
#define QM_XS_OFF 64              /* bytes before xs in the scratch: xmul[16] f32 */
#define QM_PARTS 3                /* matrices per launch */
#ifndef QM_STAGE_MAX
#define QM_STAGE_MAX (64 << 10)   /* bytes of shared memory a block may stage xs in */
#endif

typedef struct qm_part {
    const uint8_t *codes;         /* [N][K] bytes, or [N][K/2] nibbles */
    const float *scale;           /* [ceil(N/gr)][ngc] */
    const float *bias;            /* [N] or NULL */
    float *y;                     /* [M][N] */
    int64_t N;
    int gr;
    unsigned end;                 /* blocks of this part and the ones before it (qm_setup) */
} qm_part_t;

typedef struct qm_args {
    qm_part_t part[QM_PARTS];
    int parts;
    unsigned blocks;              /* row blocks (16 rows of a part) of all the parts */
    int64_t K, ngc;
    int gc;
    int act;                      /* BK_QA_*: how xs is made from x */
    const float *x;               /* [M][K] f32: each block stages xs from it (xs NULL) */
    const uint16_t *xs;           /* [R][K] f16 from k_qm_prep, or NULL */
    const float *xmul;            /* [M] from k_qm_prep: what row m's sums are multiplied by (2^-e or s) */
    int M, R;                     /* rows of x (1..qm_launch_rows); rows of xs: 2M (hi, lo) or M (codes) */
} qm_args_t;

template <int FMT> struct qm_fmt {
    static constexpr bool NIB = FMT == BK_Q_I4 || FMT == BK_Q_FP4;
    static constexpr int SK = NIB ? 128 : 64;     /* k per step: 4 lanes x one 16-byte chunk */
    static constexpr int XC = NIB ? 4 : 2;        /* 16-byte pieces of xs per lane per step and column tile */
};

/* ---- f16x2 helpers -------------------------------------------------------------------------------- */

static __device__ __forceinline__ uint32_t qm_hsub2(uint32_t a, uint32_t b)
{
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
static __device__ __forceinline__ uint32_t qm_hfma2(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
static __device__ __forceinline__ uint32_t qm_h16(float v) { return (uint32_t)__half_as_ushort(__float2half_rn(v)); }

/* Word i of n 16-byte chunks (i a constant after unrolling: registers, not local memory). */
static __device__ __forceinline__ uint32_t qm_word(const uint4 *r, int i)
{
    const uint4 &v = r[i / 4];
    switch (i & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
    }
}

/* Streaming 16-byte load of weights: not kept in L1 (xs is what L1 should hold), 256-byte L2
 * prefetch (a row's next chunks are the block's next loads). */
static __device__ __forceinline__ uint4 qm_ld_stream(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* ---- decoding into A fragments ---------------------------------------------------------------- */

/* Byte codes: the two codes of bytes 0-1 (H = 0) or 2-3 (H = 1) of w as f16x2, element order kept. */
template <int FMT, int H> static __device__ __forceinline__ uint32_t qm_dec2(uint32_t w)
{
    if constexpr (FMT == BK_Q_FP8) {
        return dev_e4m3x2_f16x2(H ? w >> 16 : w);
    } else {                                       /* int8: f16 0x64XX = 1024 + XX, XX = code + 128 */
        const uint32_t u = __byte_perm(w ^ 0x80808080u, 0x64646464u, H ? 0x4342u : 0x4140u);
        return qm_hsub2(u, 0x64806480u);           /* - 1152 */
    }
}

/* fp8 e4m3 by integer operations (the Marlin kernels' way): a byte's exponent and mantissa bits
 * into f16 bits 7-13, its sign to 15, which is the value times 2^-8 exactly (subnormals included;
 * NaN codes become 480 x 2^-8, not NaN: checkpoints have none). H = 0: bytes 0 and 2 of w as
 * f16x2, H = 1: bytes 1 and 3. */
template <int H> static __device__ __forceinline__ uint32_t qm_dec_fp8_int(uint32_t w)
{
    const uint32_t v = H ? w : w << 8;
    return (v & 0x80008000u) | ((v & 0x7f007f00u) >> 1);
}

/* Nibbles (element e at bits 4e of q) as the f16 pairs r[0] = (0, 4), r[1] = (1, 5), r[2] = (2, 6),
 * r[3] = (3, 7). int4 (value + 8): 1024 + n - 1032, or (1024 + 16 n) / 16 - 72 (exact). fp4 e2m1:
 * its exponent and mantissa bits into f16 bits 9-11, the sign to 15 (the value times 2^-14, exact,
 * subnormals included), then times 2^14 in f16 (exact), so the tensor cores see plain normal values. */
template <int FMT> static __device__ __forceinline__ void qm_dec_nib(uint32_t q, uint32_t r[4])
{
    if constexpr (FMT == BK_Q_I4) {
        const uint32_t q8 = q >> 8;
        r[0] = qm_hsub2((q & 0x000f000fu) | 0x64006400u, 0x64086408u);
        r[1] = qm_hfma2((q & 0x00f000f0u) | 0x64006400u, 0x2c002c00u, 0xd480d480u);
        r[2] = qm_hsub2((q8 & 0x000f000fu) | 0x64006400u, 0x64086408u);
        r[3] = qm_hfma2((q8 & 0x00f000f0u) | 0x64006400u, 0x2c002c00u, 0xd480d480u);
    } else {
        const uint32_t t[4] = {((q & 0x00070007u) << 9) | ((q & 0x00080008u) << 12),
                               ((q & 0x00700070u) << 5) | ((q & 0x00800080u) << 8),
                               ((q & 0x07000700u) << 1) | ((q & 0x08000800u) << 4),
                               ((q & 0x70007000u) >> 3) | (q & 0x80008000u)};
#pragma unroll
        for (int i = 0; i < 4; i++)
            r[i] = qm_hfma2(t[i], 0x74007400u, 0u);   /* x 2^14 (+ 0) */
    }
}


/* ---- x as f16 operands ------------------------------------------------------------------------- */

/* A row's treatment from its amax (see the header). weight-only: p = 2^e with amax p in
 * [2^14, 2^15) (e clamped so 2^e and 2^-e are normal), mul = 2^-e; W8A8: the activation scale s,
 * or 1 for an all-zero row (x as it is, as the CPU's "plain"), mul NaN for a non-finite amax
 * (every output NaN, as the CPU's). */
typedef struct qm_rowq {
    float p, s, mul;
    bool plain;
} qm_rowq_t;

static __device__ __forceinline__ qm_rowq_t qm_row_scale(float amax, int act)
{
    qm_rowq_t r = {1.0f, 1.0f, 1.0f, act == BK_QA_NONE || amax == 0.0f};
    if (act == BK_QA_NONE) {
        int e = 0;
        if (amax > 0.0f && isfinite(amax)) {
            e = 14 - (int)((__float_as_uint(amax) >> 23) & 0xff) + 127;
            e = e < -126 ? -126 : e > 126 ? 126 : e;
        }
        r.p = __uint_as_float((uint32_t)(127 + e) << 23);
        r.mul = __uint_as_float((uint32_t)(127 - e) << 23);
    } else if (amax != 0.0f) {
        r.s = act == BK_QA_FP8_TOKEN ? amax / 448.0f : amax / 127.0f;
        r.mul = isfinite(amax) ? r.s : __int_as_float(0x7fc00000);
    }
    return r;
}

static __device__ __forceinline__ float qm_amax8(float4 u, float4 v)
{
    return fmaxf(fmaxf(fmaxf(fabsf(u.x), fabsf(u.y)), fmaxf(fabsf(u.z), fabsf(u.w))),
                 fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
}

/* The order of x in xs, per group of 8 k: QM_ORD_NAT natural; QM_ORD_NIB 0 4 1 5 2 6 3 7 (nibbles);
 * QM_ORD_MIX natural in even groups, 0 2 1 3 4 6 5 7 in odd ones (fp8 decoded half by the convert,
 * half by integer ops: qm_dec_fp8_int). */
enum { QM_ORD_NAT, QM_ORD_NIB, QM_ORD_MIX, QM_ORD_I8 };   /* QM_ORD_I8: int8 W8A8's codes as bytes (IMMA) */

/* Row m of x [M][K] (its amax known) as xs rows m (hi or codes) and, weight-only, M + m (lo), row
 * stride ld halves, by threads tid = 0..nt-1, in the order ORD; x read through the read-only path.
 * The rounding of cpu_quant_act_row / k_qact for W8A8. */
template <int ORD>
static __device__ __forceinline__ void qm_stage_row(const float *x, int64_t K, int M, int m, int act, float amax,
                                                    uint16_t *xs, int64_t ld, int tid, int nt, int *nan_flag = NULL)
{
    const qm_rowq_t rq = qm_row_scale(amax, act);
    const float4 *xr = (const float4 *)(x + (int64_t)m * K);
    uint4 *hi_row = (uint4 *)(xs + (int64_t)m * ld), *lo_row = (uint4 *)(xs + (int64_t)(M + m) * ld);
    if constexpr (ORD == QM_ORD_I8) {             /* int8 W8A8 only: the codes as bytes; a NaN sets *nan_flag */
        uint2 *row = (uint2 *)(xs + (int64_t)m * ld);
        bool nan = false;
        for (int64_t i = tid; i < K / 8; i += nt) {
            const float4 u = __ldg(xr + 2 * i), v = __ldg(xr + 2 * i + 1);
            const float f[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
            uint32_t b[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float q = rq.plain ? f[j] : f[j] / rq.s;   /* plain: an all-zero row (or NaNs) */
                nan |= isnan(q);
                const int c = isnan(q) ? 0 : (int)(rq.plain ? q : rintf(fminf(fmaxf(q, -127.0f), 127.0f)));
                b[j / 4] |= (uint32_t)(c & 0xff) << (8 * (j % 4));
            }
            row[i] = make_uint2(b[0], b[1]);
        }
        if (nan)
            *nan_flag = 1;
    } else {
        for (int64_t i = tid; i < K / 8; i += nt) {
            const float4 u = __ldg(xr + 2 * i), v = __ldg(xr + 2 * i + 1);
            const float f[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
            uint32_t h[8], l[8];
    #pragma unroll
            for (int j = 0; j < 8; j++) {
                if (act == BK_QA_NONE) {
                    const float xp = f[j] * rq.p;
                    const __half hh = __float2half_rn(xp);
                    h[j] = __half_as_ushort(hh);
                    l[j] = qm_h16(xp - __half2float(hh));
                } else if (rq.plain) {
                    h[j] = qm_h16(f[j]);
                    l[j] = 0;
                } else {
                    float q = f[j] / rq.s;
                    if (!isnan(q)) {
                        if (act == BK_QA_FP8_TOKEN) {
                            __nv_fp8_e4m3 c;
                            c.__x = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
                            q = (float)c;
                        } else {
                            q = rintf(fminf(fmaxf(q, -127.0f), 127.0f));
                        }
                    }
                    h[j] = qm_h16(q);
                    l[j] = 0;
                }
            }
            if (ORD == QM_ORD_MIX && (i & 1)) {
                hi_row[i] = make_uint4(h[0] | h[2] << 16, h[1] | h[3] << 16, h[4] | h[6] << 16, h[5] | h[7] << 16);
                if (act == BK_QA_NONE)
                    lo_row[i] = make_uint4(l[0] | l[2] << 16, l[1] | l[3] << 16, l[4] | l[6] << 16, l[5] | l[7] << 16);
                continue;
            }
            constexpr bool NIB = ORD == QM_ORD_NIB;
            constexpr int o[8] = {0, NIB ? 4 : 1, NIB ? 1 : 2, NIB ? 5 : 3, NIB ? 2 : 4, NIB ? 6 : 5, NIB ? 3 : 6, 7};
            hi_row[i] = make_uint4(h[o[0]] | h[o[1]] << 16, h[o[2]] | h[o[3]] << 16, h[o[4]] | h[o[5]] << 16,
                                   h[o[6]] | h[o[7]] << 16);
            if (act == BK_QA_NONE)
                lo_row[i] = make_uint4(l[o[0]] | l[o[1]] << 16, l[o[2]] | l[o[3]] << 16, l[o[4]] | l[o[5]] << 16,
                                       l[o[6]] | l[o[7]] << 16);
        }
    }
}

/* The pre-pass where xs does not fit a block's shared memory: row blockIdx.x of x [M][K] f32 into
 * xs [R][K] and xmul[m], for every block of the GEMV after it. K % 8 == 0, x 16-byte aligned. */
template <int ORD>
__global__ void __launch_bounds__(QM_PREP_THREADS) k_qm_prep(const float *x, int64_t K, int M, int act, uint16_t *xs,
                                                            float *xmul)
{
    DEV_PDL_ENTER();
    __shared__ float red[QM_PREP_THREADS / 32];
    const int m = blockIdx.x;
    const float4 *xr = (const float4 *)(x + (int64_t)m * K);
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < K / 8; i += blockDim.x)
        amax = fmaxf(amax, qm_amax8(xr[2 * i], xr[2 * i + 1]));
    amax = dev_block_max(amax, red);              /* fmaxf skips NaN, as the CPU's comparison does */
    __shared__ int nan;
    if (threadIdx.x == 0)
        nan = 0;
    __syncthreads();
    qm_stage_row<ORD>(x, K, M, m, act, amax, xs, ORD == QM_ORD_I8 ? K / 2 + 32 : K, threadIdx.x, blockDim.x, &nan);
    __syncthreads();
    if (threadIdx.x == 0)
        xmul[m] = nan ? __int_as_float(0x7fc00000) : qm_row_scale(amax, act).mul;
}

/* ---- what every block does first and last ----------------------------------------------------- */

/* The block's part and its first row; *xs_out / *ld / *xmul_out: where its xs lie. Stages xs into
 * the block's dynamic shared memory when the launch has none (a.xs NULL): every row's amax (W
 * warps, in any order: max is exact), then the rows, then a barrier. After the PDL wait only. */
struct qm_block {
    qm_part_t p;
    int64_t n0;                   /* the block's first row of its part */
};

static __device__ __forceinline__ qm_block qm_block_of(const qm_args_t &a, unsigned rb)
{
    qm_block b;
    b.p = a.part[0];
    unsigned first = 0;
#pragma unroll
    for (int i = 1; i < QM_PARTS; i++)            /* constant indices: the parameters stay in param space */
        if (i < a.parts && rb >= a.part[i - 1].end) {
            first = a.part[i - 1].end;
            b.p = a.part[i];
        }
    b.n0 = (int64_t)(rb - first) * 16;
    return b;
}

extern __shared__ uint4 qm_dyn_smem[];

template <int ORD>
static __device__ __forceinline__ void qm_xs(const qm_args_t &a, const uint16_t **xs, int64_t *ld, const float **xmul)
{
    __shared__ float s_amax[8][32];               /* [row][warp] */
    __shared__ float s_xmul[8];
    __shared__ int s_nan[8];
    if (a.xs) {
        *xs = a.xs;
        *ld = ORD == QM_ORD_I8 ? a.K / 2 + 32 : a.K;
        *xmul = a.xmul;
        return;
    }
    uint16_t *st = (uint16_t *)qm_dyn_smem;
    /* padding, so that rows g and g + 1 lie in other banks: 16 bytes (f16 rows: 4 lanes read 128
     * bytes of a row), 64 (byte rows: 4 lanes read 64) */
    const int64_t sld = ORD == QM_ORD_I8 ? a.K / 2 + 32 : a.K + 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int m = 0; m < a.M; m++) {
        const float4 *xr = (const float4 *)(a.x + (int64_t)m * a.K);
        float amax = 0.0f;
        for (int64_t i = threadIdx.x; i < a.K / 8; i += blockDim.x)
            amax = fmaxf(amax, qm_amax8(__ldg(xr + 2 * i), __ldg(xr + 2 * i + 1)));
        amax = dev_warp_max(amax);
        if (lane == 0)
            s_amax[m][warp] = amax;
    }
    __syncthreads();
    if (threadIdx.x < a.M) {
        float v = 0.0f;
        for (int w = 0; w < nw; w++)
            v = fmaxf(v, s_amax[threadIdx.x][w]);
        s_amax[threadIdx.x][0] = v;
        s_xmul[threadIdx.x] = qm_row_scale(v, a.act).mul;
        s_nan[threadIdx.x] = 0;
    }
    __syncthreads();
    for (int m = 0; m < a.M; m++)
        qm_stage_row<ORD>(a.x, a.K, a.M, m, a.act, s_amax[m][0], st, sld, threadIdx.x, blockDim.x, &s_nan[m]);
    __syncthreads();
    if constexpr (ORD == QM_ORD_I8) {
        if (threadIdx.x < a.M && s_nan[threadIdx.x])
            s_xmul[threadIdx.x] = __int_as_float(0x7fc00000);   /* a NaN in x: every output NaN, as the CPU's */
        __syncthreads();
    }
    *xs = st;
    *ld = sld;
    *xmul = s_xmul;
}

/* A warp's accumulators into its slice of the block's partial sums, part[row][column], the column
 * being the xs row: mma layout, c[jt][i] = row g + 8 (i >> 1), column 8 jt + 2t + (i & 1); or the
 * block-diagonal one (BD, below), where c[jt][i] of lane t holds column 2 jt + (i & 1) over lane
 * t's k only: the four t lanes' sums by a fixed butterfly first. */
template <int NT, bool BD, int C>
static __device__ __forceinline__ void qm_put(float (&part)[16][C], const float (&acc)[NT][4], int g, int t)
{
#pragma unroll
    for (int jt = 0; jt < NT; jt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (BD) {
                float v = acc[jt][i];
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                if (t == 0)
                    part[g + 8 * (i >> 1)][2 * jt + (i & 1)] = v;
            } else {
                part[g + 8 * (i >> 1)][8 * jt + 2 * t + (i & 1)] = acc[jt][i];
            }
        }
}

/* The row scale (RS; else 1) and bias (else 0) of the output this thread writes in qm_finish (a
 * thread writes at most one: 16 M <= the block's threads, qm_setup); with one scale per row loaded
 * while the row block's steps run rather than after its barrier. */
struct qm_fin {
    float scale, bias;
};

template <bool RS> static __device__ __forceinline__ qm_fin qm_fin_of(const qm_args_t &a, const qm_block &b)
{
    qm_fin f = {1.0f, 0.0f};
    const int o = threadIdx.x, r = o & 15;
    const int64_t n = b.n0 + r;
    if (o < 16 * a.M && n < b.p.N) {
        if constexpr (RS)
            f.scale = __ldg(b.p.scale + (int64_t)((uint32_t)n / (uint32_t)b.p.gr) * a.ngc);
        if (b.p.bias)
            f.bias = __ldg(b.p.bias + n);
    }
    return f;
}

/* After qm_put and a barrier: the W warps' sums added in warp order (the split-K reduction), xs
 * rows m (hi or codes) and M + m (lo), times xmul[m], times the row's scale (RS), plus the bias
 * (f from qm_fin_of). */
template <int W, int C, bool RS>
static __device__ __forceinline__ void qm_finish(const qm_args_t &a, const qm_block &b, const float (&part)[W][16][C],
                                                 const float *xmul, qm_fin f)
{
    static_assert(W * 32 >= 128, "one output per thread");
    const bool split = a.R > a.M;                  /* hi + lo columns */
    const int o = threadIdx.x, r = o & 15, m = o >> 4;
    const int64_t n = b.n0 + r;
    if (o >= 16 * a.M || n >= b.p.N)
        return;
    float hi = 0.0f, lo = 0.0f;
#pragma unroll
    for (int w = 0; w < W; w++)
        hi += part[w][r][m];
    if (split) {
#pragma unroll
        for (int w = 0; w < W; w++)
            lo += part[w][r][a.M + m];
    }
    float v = (hi + lo) * xmul[m];
    if constexpr (RS)
        v *= f.scale;
    b.p.y[(int64_t)m * b.p.N + n] = v + f.bias;
}

/* xs through a generic load: shared memory (staged) or device memory (the pre-pass). */
static __device__ __forceinline__ uint4 qm_ldx(const uint4 *p) { return *p; }

/* ---- the tensor-core kernel ---------------------------------------------------------------------- */

/* c += A B exactly in int32: A 16 x 32 int8 (a[0] = A[g][4t..4t+3], a[1] = A[g+8][4t..], a[2] =
 * A[g][4t+16..], a[3] = A[g+8][4t+16..]), B 32 x 8 int8 (b0 = B[4t..4t+3][g], b1 = B[4t+16..][g]),
 * c as the f16 mma's C. */
static __device__ __forceinline__ void qm_imma(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* This lane's chunks of rows g and g + 8 for U steps from s (warp stride W), zeros past K, and
 * (group scales) the rows' scales of each step's group. spg: steps per column group. */
template <int FMT, bool RS, int W, int U>
static __device__ __forceinline__ void qm_load(uint4 (&q)[U][2], float (&sq)[U][2], const uint4 *w0,
                                               const uint4 *w1, const float *s0, const float *s1, int64_t s,
                                               int64_t nch, int t, int spg)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t su = s + (int64_t)u * W;
        const bool in = 4 * su + t < nch;
        q[u][0] = in ? qm_ld_stream(w0 + 4 * su) : make_uint4(0, 0, 0, 0);
        q[u][1] = in ? qm_ld_stream(w1 + 4 * su) : make_uint4(0, 0, 0, 0);
        if constexpr (!RS) {
            /* by the step, not the lane: the mma adds every lane's k into each lane's columns, so a
             * lane whose chunk lies past K still scales the partial sums of the lanes before it */
            const bool step_in = 4 * su < nch;
            const int64_t grp = spg == 1 ? su : su / spg;
            sq[u][0] = step_in ? __ldg(s0 + grp) : 0.0f;
            sq[u][1] = step_in ? __ldg(s1 + grp) : 0.0f;
        }
    }
}

/* A block's rows g and g + 8 of a row block: code and scale pointers of lane (g, t). */
template <int FMT> struct qm_rows {
    const uint4 *w0, *w1;
    const float *s0, *s1;
};

template <int FMT>
static __device__ __forceinline__ qm_rows<FMT> qm_rows_of(const qm_args_t &a, const qm_block &b, int g, int t)
{
    using F = qm_fmt<FMT>;
    const int64_t r0 = b.n0 + g, r1 = r0 + 8, N = b.p.N;
    const int64_t c0 = r0 < N ? r0 : N - 1, c1 = r1 < N ? r1 : N - 1;   /* rows past N: read N - 1, store nothing */
    const int64_t rowb = F::NIB ? a.K / 2 : a.K;
    qm_rows<FMT> r;
    r.w0 = (const uint4 *)(b.p.codes + c0 * rowb) + t;
    r.w1 = (const uint4 *)(b.p.codes + c1 * rowb) + t;
    r.s0 = b.p.scale + (int64_t)((uint32_t)c0 / (uint32_t)b.p.gr) * a.ngc;
    r.s1 = b.p.scale + (int64_t)((uint32_t)c1 / (uint32_t)b.p.gr) * a.ngc;
    return r;
}

/* NT: column tiles of 8 (R <= 8: 1, R <= 16: 2, else 4: weight-only x of 16 rows, QM_F_WIDE, one
 * block of 8 warps per SM for its registers); RS: one scale per row, else per group of columns;
 * W: warps per block; U: steps of loads in flight per lane (QM_U, or fewer for more blocks per SM:
 * QM_F_SHALLOW); MIX (fp8): words 2 and 3 of each chunk decoded by qm_dec_fp8_int into a
 * fragment of their own (scaled by 2^8 when added), words 0 and 1 by the convert, so that the
 * decode is split between the conversion and the integer pipes (xs in QM_ORD_MIX). A block takes row blocks (16 rows of one part, the whole of K) blockIdx.x,
 * + gridDim.x, ... (a grid of what fits the SMs at once: qm_setup), staging xs once for all of
 * them; a warp's last loads of one row block are followed by the first of its next, so the loads
 * stay in flight across the reduction between them. */
template <int FMT, int NT, bool RS, int W, bool MIX = false, int U = QM_U>
__global__ void __launch_bounds__(W * 32, (NT > 2 ? 8 : U < QM_U ? 24 : 16) / W) k_qgemv_mma(qm_args_t a)
{
    static_assert(!MIX || FMT == BK_Q_FP8 || (FMT == BK_Q_I8 && NT == 1), "fp8's split decode, int8 W8A8's IMMA");
    constexpr bool IMMA = MIX && FMT == BK_Q_I8;   /* int8 codes times x's int8 codes, exactly */
    using F = qm_fmt<FMT>;
    constexpr int SK = F::SK, XC = F::XC;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const unsigned n_rb = a.blocks;
    unsigned rb = blockIdx.x;
    qm_rows<FMT> w = qm_rows_of<FMT>(a, qm_block_of(a, rb), g, t);
    const int64_t nch = (F::NIB ? a.K / 2 : a.K) / 16;
    const int spg = RS ? 1 : a.gc / SK;
    const int64_t steps = (a.K + SK - 1) / SK;
    uint4 q[U][2];
    float sq[U][2];
    qm_load<FMT, RS, W, U>(q, sq, w.w0, w.w1, w.s0, w.s1, warp, nch, t, spg);
    DEV_PDL_ENTER();
    const uint16_t *xs;
    const float *xmul;
    int64_t ld;
    qm_xs<F::NIB ? QM_ORD_NIB : IMMA ? QM_ORD_I8 : MIX ? QM_ORD_MIX : QM_ORD_NAT>(a, &xs, &ld, &xmul);
    /* B rows: xs row 8 jt + g of each column tile (zeros past R) */
    const uint4 *xr[NT];
    bool xon[NT];
#pragma unroll
    for (int jt = 0; jt < NT; jt++) {
        const int rho = 8 * jt + g;
        xon[jt] = rho < a.R;
        xr[jt] = (const uint4 *)(xs + (int64_t)(xon[jt] ? rho : 0) * ld) + (IMMA ? t : XC * t);
    }
    __shared__ float part[2][W][16][8 * NT + 1];  /* two: a row block's sums are read while the next's are put */
    for (int buf = 0;; buf ^= 1) {
        const unsigned rb_next = rb + gridDim.x;
        const bool more = rb_next < n_rb;
        qm_fin fin;
        if constexpr (RS)                          /* (group scales: registers are short, loaded late) */
            fin = qm_fin_of<RS>(a, qm_block_of(a, rb));
        float acc[NT][4];
        int acci[NT][4];                           /* IMMA: the row block's exact sums */
#pragma unroll
        for (int jt = 0; jt < NT; jt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[jt][i] = 0.0f, acci[jt][i] = 0;
        for (int64_t s = warp; s < steps; s += (int64_t)U * W) {
            uint4 qn[U][2];                     /* the next U steps, in flight while these are used: */
            float sqn[U][2];                    /* this row block's, or the next one's first */
            if (s + (int64_t)U * W < steps || !more) {
                qm_load<FMT, RS, W, U>(qn, sqn, w.w0, w.w1, w.s0, w.s1, s + (int64_t)U * W, nch, t, spg);
            } else {                               /* (the pointers made here, not kept: registers) */
                const qm_rows<FMT> wn = qm_rows_of<FMT>(a, qm_block_of(a, rb_next), g, t);
                qm_load<FMT, RS, W, U>(qn, sqn, wn.w0, wn.w1, wn.s0, wn.s1, warp, nch, t, spg);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t su = s + (int64_t)u * W;
                if (su >= steps)
                    break;
                const bool in = 4 * su + t < nch;
                if constexpr (IMMA) {              /* words 0-1 and 2-3: one m16n8k32 each, into acci */
#pragma unroll
                    for (int jt = 0; jt < NT; jt++) {
                        const uint4 xv = in && xon[jt] ? qm_ldx(xr[jt] + 4 * su) : make_uint4(0, 0, 0, 0);
                        const uint32_t a0[4] = {q[u][0].x, q[u][1].x, q[u][0].y, q[u][1].y};
                        const uint32_t a1[4] = {q[u][0].z, q[u][1].z, q[u][0].w, q[u][1].w};
                        qm_imma(acci[jt], a0, xv.x, xv.y);
                        qm_imma(acci[jt], a1, xv.z, xv.w);
                    }
                    continue;
                }
                uint4 xb[NT][XC];                  /* nibbles: one piece at a time, below (registers) */
                if constexpr (!F::NIB) {
#pragma unroll
                    for (int jt = 0; jt < NT; jt++)
#pragma unroll
                        for (int c = 0; c < XC; c++)
                            xb[jt][c] = in && xon[jt] ? qm_ldx(xr[jt] + 4 * XC * su + c) : make_uint4(0, 0, 0, 0);
                }
                float p[NT][4], p8[NT][4];         /* p8: MIX's integer-decoded words, times 2^-8 */
#pragma unroll
                for (int jt = 0; jt < NT; jt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        p[jt][i] = 0.0f, p8[jt][i] = 0.0f;
                if constexpr (!F::NIB) {
#pragma unroll
                    for (int j = 0; j < 4; j++) {  /* mma j: bytes 4j .. 4j + 3 of the chunk */
                        const uint32_t wg = qm_word(&q[u][0], j), w8 = qm_word(&q[u][1], j);
                        if (MIX && j >= 2) {       /* bytes (0, 2) as logical (2t, 2t+1), (1, 3) as (2t+8, 2t+9) */
                            const uint32_t af[4] = {qm_dec_fp8_int<0>(wg), qm_dec_fp8_int<0>(w8), qm_dec_fp8_int<1>(wg),
                                                    qm_dec_fp8_int<1>(w8)};
#pragma unroll
                            for (int jt = 0; jt < NT; jt++)
                                dev_mma16<true>(p8[jt], af, qm_word(xb[jt], 2 * j), qm_word(xb[jt], 2 * j + 1));
                        } else {
                            const uint32_t af[4] = {qm_dec2<FMT, 0>(wg), qm_dec2<FMT, 0>(w8), qm_dec2<FMT, 1>(wg),
                                                    qm_dec2<FMT, 1>(w8)};
#pragma unroll
                            for (int jt = 0; jt < NT; jt++)
                                dev_mma16<true>(p[jt], af, qm_word(xb[jt], 2 * j), qm_word(xb[jt], 2 * j + 1));
                        }
                    }
                    if constexpr (MIX) {
#pragma unroll
                        for (int jt = 0; jt < NT; jt++)
#pragma unroll
                            for (int i = 0; i < 4; i++)
                                p[jt][i] = fmaf(p8[jt][i], 256.0f, p[jt][i]);   /* exact scaling, one rounding */
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 4; i++) {  /* word i: mmas 2i and 2i + 1 */
                        uint32_t rg[4], r8[4];
                        qm_dec_nib<FMT>(qm_word(&q[u][0], i), rg);
                        qm_dec_nib<FMT>(qm_word(&q[u][1], i), r8);
                        const uint32_t a0[4] = {rg[0], r8[0], rg[1], r8[1]}, a1[4] = {rg[2], r8[2], rg[3], r8[3]};
#pragma unroll
                        for (int jt = 0; jt < NT; jt++) {
                            const uint4 xv = in && xon[jt] ? qm_ldx(xr[jt] + 4 * XC * su + i) : make_uint4(0, 0, 0, 0);
                            dev_mma16<true>(p[jt], a0, xv.x, xv.y);
                            dev_mma16<true>(p[jt], a1, xv.z, xv.w);
                        }
                    }
                }
#pragma unroll
                for (int jt = 0; jt < NT; jt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[jt][i] = RS ? acc[jt][i] + p[jt][i] : fmaf(p[jt][i], sq[u][i >> 1], acc[jt][i]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                q[u][0] = qn[u][0];
                q[u][1] = qn[u][1];
                if constexpr (!RS) {
                    sq[u][0] = sqn[u][0];
                    sq[u][1] = sqn[u][1];
                }
            }
        }
        if constexpr (IMMA) {
#pragma unroll
            for (int jt = 0; jt < NT; jt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[jt][i] = (float)acci[jt][i];
        }
        /* part[buf] was last read two row blocks ago, before the barrier of the previous one */
        qm_put<NT, false>(part[buf][warp], acc, g, t);
        __syncthreads();
        if constexpr (!RS)
            fin = qm_fin_of<RS>(a, qm_block_of(a, rb));
        qm_finish<W, 8 * NT + 1, RS>(a, qm_block_of(a, rb), part[buf], xmul, fin);
        if (!more)
            break;
        rb = rb_next;
        w = qm_rows_of<FMT>(a, qm_block_of(a, rb), g, t);
    }
}

/* ---- groups smaller than a step: block-diagonal B --------------------------------------------- */

/* Nibbles with groups of 16..112 columns or any multiple of 16 that is not one of 128 (nvfp4's 16,
 * int4's 32 / 64): an mma sums over all four t lanes' k, which here lie in different groups. So each
 * lane gets columns of its own: column g of tile jt is xs row 2 jt + (g & 1) restricted to the k of
 * lane t = g / 2 (the lanes with t != g / 2 give zeros for it), and the lane holding C[.][2t, 2t+1]
 * is that lane t, whose C is then a sum over its own codes only: a half chunk (16 codes: mmas 4h ..
 * 4h + 3) lies in one group, is accumulated from zero and FMA'd with that group's scale. The cost is
 * R / 2 tiles (one per two xs rows) instead of R / 8: the same one mma per 16 k at M = 1, eight at
 * M = 8; the four lanes' sums are added by shuffles, then the warps' in shared memory. */
#define QM_U_BD 2                 /* steps of loads in flight per lane (more tiles, fewer registers) */

template <int W>
static __device__ __forceinline__ void qm_load_bd(uint4 (&q)[QM_U_BD][2], float (&sq)[QM_U_BD][2][2], const uint4 *w0,
                                                  const uint4 *w1, const float *s0, const float *s1, int64_t s,
                                                  int64_t nch, int t, int gc)
{
#pragma unroll
    for (int u = 0; u < QM_U_BD; u++) {
        const int64_t su = s + (int64_t)u * W;
        const bool in = 4 * su + t < nch;
        q[u][0] = in ? qm_ld_stream(w0 + 4 * su) : make_uint4(0, 0, 0, 0);
        q[u][1] = in ? qm_ld_stream(w1 + 4 * su) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t grp = (int64_t)((uint32_t)(128 * su + 32 * t + 16 * h) / (uint32_t)gc);   /* K < 2^31 */
            sq[u][0][h] = in ? __ldg(s0 + grp) : 0.0f;
            sq[u][1][h] = in ? __ldg(s1 + grp) : 0.0f;
        }
    }
}

/* NT: column tiles, each two xs rows (R <= 2 NT); W warps per block; row blocks taken in turn as
 * k_qgemv_mma's. */
template <int FMT, int NT, int W>
__global__ void __launch_bounds__(W * 32, 16 / W) k_qgemv_mma_bd(qm_args_t a)
{
    static_assert(FMT == BK_Q_I4 || FMT == BK_Q_FP4, "nibbles");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const unsigned n_rb = a.blocks;
    unsigned rb = blockIdx.x;
    qm_rows<FMT> w = qm_rows_of<FMT>(a, qm_block_of(a, rb), g, t);
    const int64_t nch = a.K / 2 / 16;
    const int64_t steps = (a.K + 127) / 128;
    uint4 q[QM_U_BD][2];
    float sq[QM_U_BD][2][2];
    qm_load_bd<W>(q, sq, w.w0, w.w1, w.s0, w.s1, warp, nch, t, a.gc);
    DEV_PDL_ENTER();
    const uint16_t *xs;
    const float *xmul;
    int64_t ld;
    qm_xs<QM_ORD_NIB>(a, &xs, &ld, &xmul);
    const uint4 *xr[NT];
    bool xon[NT];
#pragma unroll
    for (int jt = 0; jt < NT; jt++) {
        const int rho = 2 * jt + (g & 1);
        xon[jt] = t == (g >> 1) && rho < a.R;
        xr[jt] = (const uint4 *)(xs + (int64_t)(rho < a.R ? rho : 0) * ld) + 4 * t;
    }
    __shared__ float part[2][W][16][2 * NT + 1];
    for (int buf = 0;; buf ^= 1) {
        const unsigned rb_next = rb + gridDim.x;
        const bool more = rb_next < n_rb;
        float acc[NT][4];
#pragma unroll
        for (int jt = 0; jt < NT; jt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[jt][i] = 0.0f;
        for (int64_t s = warp; s < steps; s += (int64_t)QM_U_BD * W) {
            uint4 qn[QM_U_BD][2];
            float sqn[QM_U_BD][2][2];
            if (s + (int64_t)QM_U_BD * W < steps || !more) {
                qm_load_bd<W>(qn, sqn, w.w0, w.w1, w.s0, w.s1, s + (int64_t)QM_U_BD * W, nch, t, a.gc);
            } else {
                const qm_rows<FMT> wn = qm_rows_of<FMT>(a, qm_block_of(a, rb_next), g, t);
                qm_load_bd<W>(qn, sqn, wn.w0, wn.w1, wn.s0, wn.s1, warp, nch, t, a.gc);
            }
#pragma unroll
            for (int u = 0; u < QM_U_BD; u++) {
                const int64_t su = s + (int64_t)u * W;
                if (su >= steps)
                    break;
                const bool in = 4 * su + t < nch;
#pragma unroll
                for (int h = 0; h < 2; h++) {      /* half chunk h: words 2h, 2h + 1, one group */
                    float p[NT][4];
#pragma unroll
                    for (int jt = 0; jt < NT; jt++)
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            p[jt][i] = 0.0f;
#pragma unroll
                    for (int i = 2 * h; i < 2 * h + 2; i++) {
                        uint32_t rg[4], r8[4];
                        qm_dec_nib<FMT>(qm_word(&q[u][0], i), rg);
                        qm_dec_nib<FMT>(qm_word(&q[u][1], i), r8);
                        const uint32_t a0[4] = {rg[0], r8[0], rg[1], r8[1]}, a1[4] = {rg[2], r8[2], rg[3], r8[3]};
#pragma unroll
                        for (int jt = 0; jt < NT; jt++) {
                            const uint4 xv = in && xon[jt] ? qm_ldx(xr[jt] + 16 * su + i) : make_uint4(0, 0, 0, 0);
                            dev_mma16<true>(p[jt], a0, xv.x, xv.y);
                            dev_mma16<true>(p[jt], a1, xv.z, xv.w);
                        }
                    }
#pragma unroll
                    for (int jt = 0; jt < NT; jt++)
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            acc[jt][i] = fmaf(p[jt][i], sq[u][i >> 1][h], acc[jt][i]);
                }
            }
#pragma unroll
            for (int u = 0; u < QM_U_BD; u++) {
                q[u][0] = qn[u][0];
                q[u][1] = qn[u][1];
#pragma unroll
                for (int h = 0; h < 2; h++)
                    sq[u][0][h] = sqn[u][0][h], sq[u][1][h] = sqn[u][1][h];
            }
        }
        qm_put<NT, true>(part[buf][warp], acc, g, t);
        __syncthreads();
        qm_finish<W, 2 * NT + 1, false>(a, qm_block_of(a, rb), part[buf], xmul,
                                        qm_fin_of<false>(a, qm_block_of(a, rb)));   /* group scales: in the sums */
        if (!more)
            break;
        rb = rb_next;
        w = qm_rows_of<FMT>(a, qm_block_of(a, rb), g, t);
    }
}

/* ---- choosing ------------------------------------------------------------------------------------- */

typedef void (*qm_kernel_t)(qm_args_t);
typedef void (*qm_prep_t)(const float *, int64_t, int, int, uint16_t *, float *);

/* 1 when the tensor-core GEMV takes this weight, x and activation treatment (see the header). */
static inline bool qm_ok(int fmt, int64_t N, int64_t K, int gc, int act, const void *codes, const float *x)
{
    const bool nib = fmt == BK_Q_I4 || fmt == BK_Q_FP4;
    const int64_t sk = nib ? 128 : 64;
    const bool rs = gc >= K;
    if (fmt != BK_Q_FP8 && fmt != BK_Q_I8 && fmt != BK_Q_I4 && fmt != BK_Q_FP4)
        return false;
    if ((fmt == BK_Q_I8 && !rs) || (nib && rs))   /* combinations not built (never made) */
        return false;
    if (!rs && gc % (nib ? 16 : sk))               /* nibbles: groups under a step run k_qgemv_mma_bd */
        return false;
    if (act != BK_QA_NONE && act != BK_QA_FP8_TOKEN && act != BK_QA_I8_TOKEN)
        return false;
    return N > 0 && N < ((int64_t)1 << 31) && K > 0 && K < ((int64_t)1 << 31) && K % (nib ? 32 : 16) == 0 &&
           (uintptr_t)codes % 16 == 0 && (uintptr_t)x % 16 == 0;
}

/* Warps per block: from K and the format only (never N or M, so that a row's bits do not depend on
 * the matrix's height, the other parts of a launch or the rows of x): 8 while every warp keeps two
 * steps, else 4. */
static inline int qm_warps(int64_t K, int fmt)
{
    const int64_t sk = fmt == BK_Q_I4 || fmt == BK_Q_FP4 ? 128 : 64, steps = (K + sk - 1) / sk;
    return steps >= 16 ? 8 : 4;
}

template <int FMT, int NT, bool RS, bool MIX = false, int U = QM_U> static inline qm_kernel_t qm_pick_w(int w)
{
    return w <= 4 ? k_qgemv_mma<FMT, NT, RS, 4, MIX, U> : w <= 8 ? k_qgemv_mma<FMT, NT, RS, 8, MIX, U>
                                                                 : k_qgemv_mma<FMT, NT, RS, 16, MIX, U>;
}

template <int FMT, int NT> static inline qm_kernel_t qm_pick_bd(int w)
{
    return w <= 4 ? k_qgemv_mma_bd<FMT, NT, 4> : w <= 8 ? k_qgemv_mma_bd<FMT, NT, 8> : k_qgemv_mma_bd<FMT, NT, 16>;
}

/* The block-diagonal kernel for nibbles with groups under a step, R rows of xs. */
static inline qm_kernel_t qm_kernel_bd(int fmt, int R, int w)
{
    const int nt = (R + 1) / 2;
    if (fmt == BK_Q_I4)
        return nt <= 1 ? qm_pick_bd<BK_Q_I4, 1>(w) : nt <= 2 ? qm_pick_bd<BK_Q_I4, 2>(w)
             : nt <= 4 ? qm_pick_bd<BK_Q_I4, 4>(w) : qm_pick_bd<BK_Q_I4, 8>(w);
    if (fmt == BK_Q_FP4)
        return nt <= 1 ? qm_pick_bd<BK_Q_FP4, 1>(w) : nt <= 2 ? qm_pick_bd<BK_Q_FP4, 2>(w)
             : nt <= 4 ? qm_pick_bd<BK_Q_FP4, 4>(w) : qm_pick_bd<BK_Q_FP4, 8>(w);
    return NULL;
}

/* Four column tiles (R up to 32): 8 warps only (qm_wide_ok; 16 would pass 48 KB of static shared
 * memory for the partial sums). */
template <int FMT, bool RS> static inline qm_kernel_t qm_pick_wide(int w)
{
    return w == 8 ? k_qgemv_mma<FMT, 4, RS, 8> : NULL;
}

/* The kernel for fmt with R rows of xs, w warps, one scale per row or not (mix: fp8's split decode
 * or int8 W8A8's IMMA, one scale per row only; shallow: 2 steps in flight, R <= 8 only); NULL when
 * not built. */
static inline qm_kernel_t qm_kernel(int fmt, int R, int w, bool rs, bool mix, bool shallow)
{
    const bool two = R > 8;
    if (R > 16) {                                  /* weight-only x of 9..16 rows (hi and lo) */
        if (mix || shallow)
            return NULL;
        switch (fmt) {
        case BK_Q_FP8: return rs ? qm_pick_wide<BK_Q_FP8, true>(w) : qm_pick_wide<BK_Q_FP8, false>(w);
        case BK_Q_I8: return rs ? qm_pick_wide<BK_Q_I8, true>(w) : NULL;
        case BK_Q_I4: return rs ? NULL : qm_pick_wide<BK_Q_I4, false>(w);
        default: return NULL;
        }
    }
    if (shallow && !two) {
        switch (fmt) {
        case BK_Q_FP8:
            return mix && rs ? qm_pick_w<BK_Q_FP8, 1, true, true, 2>(w)
                 : rs        ? qm_pick_w<BK_Q_FP8, 1, true, false, 2>(w)
                             : qm_pick_w<BK_Q_FP8, 1, false, false, 2>(w);
        case BK_Q_I8:
            return !rs ? NULL : mix ? qm_pick_w<BK_Q_I8, 1, true, true, 2>(w) : qm_pick_w<BK_Q_I8, 1, true, false, 2>(w);
        case BK_Q_I4: return rs ? NULL : qm_pick_w<BK_Q_I4, 1, false, false, 2>(w);
        default: return NULL;
        }
    }
    switch (fmt) {
    case BK_Q_FP8:
        if (mix && rs)
            return two ? qm_pick_w<BK_Q_FP8, 2, true, true>(w) : qm_pick_w<BK_Q_FP8, 1, true, true>(w);
        return rs ? (two ? qm_pick_w<BK_Q_FP8, 2, true>(w) : qm_pick_w<BK_Q_FP8, 1, true>(w))
                  : (two ? qm_pick_w<BK_Q_FP8, 2, false>(w) : qm_pick_w<BK_Q_FP8, 1, false>(w));
    case BK_Q_I8:
        if (mix)
            return rs && !two ? qm_pick_w<BK_Q_I8, 1, true, true>(w) : NULL;
        return !rs ? NULL : two ? qm_pick_w<BK_Q_I8, 2, true>(w) : qm_pick_w<BK_Q_I8, 1, true>(w);
    case BK_Q_I4: return rs ? NULL : two ? qm_pick_w<BK_Q_I4, 2, false>(w) : qm_pick_w<BK_Q_I4, 1, false>(w);
    default: return NULL;
    }
}

/* A call's launches: when prep is set, prep<<<M, QM_PREP_THREADS>>>(x, K, M, act, xs, xmul) first
 * (qm_prep_args), then kernel<<<blocks, threads, smem>>>(args). */
typedef struct qm_plan {
    qm_prep_t prep;               /* NULL: every block stages xs itself (smem bytes of it) */
    qm_kernel_t kernel;
    unsigned blocks, threads;
    size_t smem;
    qm_args_t args;
} qm_plan_t;

enum { QM_F_STAGE = 1, QM_F_FP8_MIX = 2, QM_F_SHALLOW = 4, QM_F_I8_IMMA = 8, QM_F_WIDE = 16 };   /* qm_setup's flags */

/* Scratch for the pre-pass (16-byte aligned): xmul, then xs [32][K] (16 rows' hi and lo parts). */
static inline size_t qm_scratch_bytes(int64_t K) { return QM_XS_OFF + (size_t)32 * (size_t)K * 2; }
static inline uint16_t *qm_scratch_xs(void *scratch) { return (uint16_t *)((char *)scratch + QM_XS_OFF); }

/* Raises kernel k's dynamic shared memory limit to QM_STAGE_MAX on the current device, once per
 * kernel and device (a small table; a race between threads can only repeat the call). */
static inline bool qm_allow_smem(qm_kernel_t k)
{
    static struct {
        qm_kernel_t k;
        int dev;
    } done[128];
    static int n_done;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return false;
    for (int i = 0; i < n_done && i < 128; i++)
        if (done[i].k == k && done[i].dev == dev)
            return true;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, QM_STAGE_MAX) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if (n_done < 128)
        done[n_done] = {k, dev}, n_done++;
    return true;
}

/* Blocks of kernel k (threads, smem bytes) one SM holds at once, on the current device: a small
 * table, so the occupancy query runs once per kernel and size; 0 when the query fails. */
static inline int qm_occupancy(qm_kernel_t k, unsigned threads, size_t smem)
{
    static struct {
        qm_kernel_t k;
        size_t smem;
        int dev, n;
    } seen[256];
    static int n_seen;
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return 0;
    for (int i = 0; i < n_seen && i < 256; i++)
        if (seen[i].k == k && seen[i].smem == smem && seen[i].dev == dev)
            return seen[i].n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, (int)threads, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (n_seen < 256)
        seen[n_seen] = {k, smem, dev, n}, n_seen++;
    return n;
}

/* Rows of x one launch takes: 8 weight-only (x's hi and lo parts, 16 columns: two tiles), 16 with
 * quantized activations (W8A8: one column a row, the same two tiles). Past 8 rows xs always comes
 * from the pre-pass and a block needs a thread per output of its row block (16 M), so every row
 * keeps the bits it has at M = 1: each column is its own dot product, the warps come from K. */
/* Whether weight-only x of up to 16 rows runs in one launch (QM_F_WIDE; TROUPE_CUDA_QGEMV_WIDE=1 in
 * cuda_quant.cu): its 32 xs rows are four column tiles, so a step's decoded A fragment serves 16
 * rows and the codes are read once, not once per 8 rows. The byte codes (fp8 any grid, int8 one
 * scale per row) and int4 with groups of whole steps; not the block-diagonal kernel (nvfp4, int4
 * g32 / g64), whose tiles grow with the rows. A block needs 8 warps (a thread per output of 16
 * rows: qm_finish), which qm_warps gives from 16 steps of K on. */
static inline bool qm_wide_ok(int fmt, int64_t K, int gc)
{
    const bool rs = gc >= K;
    const bool kernel = fmt == BK_Q_FP8 || (fmt == BK_Q_I8 && rs) || (fmt == BK_Q_I4 && !rs && gc % 128 == 0);
    return kernel && qm_warps(K, fmt) == 8;
}

/* Rows of x one launch takes (qm_setup's flags). */
static inline int qm_launch_rows(int fmt, int64_t K, int gc, int act, int flags)
{
    return act != BK_QA_NONE || ((flags & QM_F_WIDE) && qm_wide_ok(fmt, K, gc)) ? 16 : 8;
}

/* The plan for up to qm_launch_rows rows of x (mr) times n <= QM_PARTS weights of one format, K, column grid
 * (gc) and activation treatment (each part's codes, scale, N, gr, bias, y in parts[]; end is set
 * here), or 0 when a part is not taken (qm_ok) or the kernel not built. warps: 0 for qm_warps'
 * choice, else 4, 8 or 16. flags: QM_F_STAGE lets blocks stage xs in shared memory where it fits
 * (else always the pre-pass, its xs in scratch: qm_scratch_bytes(K), 16-byte aligned); QM_F_FP8_MIX
 * fp8's split decode (one scale per row; the bits differ from the convert's); QM_F_I8_IMMA int8
 * W8A8 (one scale per row) on the integer tensor cores, x's codes as bytes and the sums exact in
 * int32 per row block (other bits than the f16 path's); QM_F_SHALLOW 2 steps
 * of loads in flight instead of QM_U and registers for 1.5x the blocks per SM (up to 8 rows of xs;
 * the same bits). n_sm: the SMs, for
 * a grid of as many blocks as they hold at once (0: a block per row block). */
static inline int qm_setup(qm_plan_t *pl, int fmt, int64_t K, int gc, int act, const float *x, int mr,
                           const qm_part_t *parts, int n, void *scratch, int warps, int flags, int n_sm)
{
    const bool stage = flags & QM_F_STAGE;
    const bool imma = (flags & QM_F_I8_IMMA) && fmt == BK_Q_I8 && act == BK_QA_I8_TOKEN && gc >= K;
    const bool mix = ((flags & QM_F_FP8_MIX) && fmt == BK_Q_FP8 && gc >= K) || imma;
    if (mr < 1 || mr > qm_launch_rows(fmt, K, gc, act, flags) || n < 1 || n > QM_PARTS)
        return 0;
    const bool rs = gc >= K;
    for (int i = 0; i < n; i++)
        if (!qm_ok(fmt, parts[i].N, K, gc, act, parts[i].codes, x) || (gc >= K) != rs || parts[i].gr < 1)
            return 0;
    const int R = act == BK_QA_NONE ? 2 * mr : mr;
    const int w = warps ? warps : qm_warps(K, fmt);
    const bool nib = fmt == BK_Q_I4 || fmt == BK_Q_FP4;
    const bool bd = nib && !rs && gc % 128;
    pl->kernel = bd ? qm_kernel_bd(fmt, R, w) : qm_kernel(fmt, R, w, rs, mix, flags & QM_F_SHALLOW);
    if (!pl->kernel)
        return 0;
    pl->threads = (unsigned)(w <= 4 ? 128 : w <= 8 ? 256 : 512);
    if (16 * mr > (int)pl->threads)               /* qm_finish: one output a thread */
        return 0;
    qm_args_t &a = pl->args;
    a = qm_args_t{};
    unsigned blocks = 0;
    for (int i = 0; i < n; i++) {
        a.part[i] = parts[i];
        blocks += (unsigned)((parts[i].N + 15) / 16);
        a.part[i].end = blocks;
    }
    pl->blocks = blocks;
    a.parts = n;
    a.blocks = blocks;
    a.K = K;
    a.ngc = (K + gc - 1) / gc;
    a.gc = gc;
    a.act = act;
    a.x = x;
    a.M = mr;
    a.R = R;
    const size_t smem = imma ? (size_t)R * (size_t)(K + 64) : (size_t)R * (size_t)(K + 8) * 2;
    /* the limit raised for every staging kernel: 48 KB bounds static + dynamic shared memory, and
     * the partial sums alone take up to 36 KB */
    if (stage && mr <= 8 && smem <= QM_STAGE_MAX && qm_allow_smem(pl->kernel)) {   /* (qm_xs stages 8 rows) */
        pl->prep = NULL;
        pl->smem = smem;
    } else {
        pl->prep = nib ? k_qm_prep<QM_ORD_NIB> : imma ? k_qm_prep<QM_ORD_I8> : mix ? k_qm_prep<QM_ORD_MIX>
                                                                              : k_qm_prep<QM_ORD_NAT>;
        pl->smem = 0;
        a.xs = qm_scratch_xs(scratch);
        a.xmul = (const float *)scratch;
    }
    if (n_sm > 0) {                                /* blocks take row blocks in turn */
        const int per_sm = qm_occupancy(pl->kernel, pl->threads, pl->smem);
        if (per_sm > 0 && (int64_t)per_sm * n_sm < (int64_t)blocks)
            pl->blocks = (unsigned)(per_sm * n_sm);
    }
    return 1;
}

#endif
