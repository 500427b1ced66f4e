/* kernels/cuda/cuda_moe_gemm.cu — moe_ffn's grouped path: the routed experts' SwiGLU FFNs as two
 * grouped GEMMs on the tensor cores, for steps of many tokens (prefill chunks, large decode
 * batches).
 *
 * cuda_moe.cu chooses the path, cuts the step into chunks of at most BK_MOE_GROUPED_CHUNK tokens,
 * sorts each chunk's (token, slot) entries by expert on the device and cuts every expert's run of
 * entries into row tiles of BM (k_moe_sort_tiles); after this file's three kernels it sums each
 * token's k outputs (k_moe_combine). Here, per chunk:
 *   1. cuda_to16 (cuda_matmul.cu's conversion): the chunk's x [mc][H] f32 -> xh [mc][H] in the
 *      weights' 16-bit type, once per token (not per entry: GEMM 1 reads a tile's rows through
 *      tok[], a gather in its loads).
 *   2. k_moe_gemm<GU>: per (row tile, 64 columns of I): G = Xs Wg^T and U = Xs Wu^T over K = H,
 *      epilogue act[entry][n] = silu(g) * u rounded to the 16-bit type (entries in sorted order).
 *   3. k_moe_gemm<down>: per (row tile, 128 columns of H): y[t * k + j][n] = act Wd^T over K = I,
 *      f32.
 * Both GEMMs are "TN" (A [rows][K] and the weights [N][K] both K-contiguous, nn.Linear's layout),
 * the same kernel with a different B and epilogue:
 *   block: BM rows (32, 64 or 128, cuda_moe_gemm_bm) x 128 weight rows (down: 128 rows of Wd;
 *     gate|up: 64 rows of Wg then the same 64 rows of Wu), 4 warps as 2 (rows) x 2 (columns);
 *     warp: BM/2 rows x 64 weight rows = BM/32 m16 tiles x 8 n8 tiles of f32 accumulators
 *     (128 registers at BM = 128). For gate|up, warp column wn owns act columns n0 + 32 wn ..
 *     + 31: its n8 tiles 0-3 are those columns of gate and 4-7 the same columns of up, so one
 *     thread holds g and u of the same element.
 *   K loop: 64-element (128-byte) K slices in a 3-stage cp.async pipeline (two slices in flight
 *     while one is used; one barrier per slice). Shared rows are padded to 72 elements (144
 *     bytes), so the 8 row addresses of every ldmatrix phase fall in 8 different 16-byte bank
 *     groups and a quarter warp's 16-byte cp.async stores fill one row: no conflicts, no swizzle.
 *     Shared memory 3 x (BM + 128) x 144 bytes: 108 KB at BM = 128 (2 blocks per SM), 81 KB at
 *     64 (2), 68 KB at 32 (3).
 *   mma.sync m16n8k16 (bf16 or f16 in, f32 accumulation); A fragments by ldmatrix .x4 (one m16 x
 *     k16 block), B fragments by ldmatrix .x4 of 16 weight rows x k16 (two n8 tiles: no .trans,
 *     the weights' rows are the B operand's columns).
 *   masking: a tile's rows past its count, weight rows past N and K slices past K (K a multiple of
 *     8, so a 16-byte chunk is wholly in or out) are zero-filled by cp.async (the source is not
 *     read) and never stored.
 *   grid: (N tiles, an upper bound on the row tiles: ceil(rows / BM) + min(E, rows)), N fastest,
 *     so the blocks running together share a row tile's A and sweep one expert's weights; blocks
 *     past the chunk's tile count (*n_tiles, written by the sort) leave at once. No host round
 *     trip, no sync, no allocation: the launches are graph-capturable.
 *
 * Numerics (what differs from the CPU reference): x is rounded once to the weights' 16-bit type
 * (round to nearest even; f16 saturates at +-65504 as cuda_matmul.cu's conversion does), gate and
 * up are f32 sums of exact 16 x 16-bit products (mma.sync), SwiGLU in f32 with cuda_swiglu's
 * arithmetic, its result rounded once more to the 16-bit type, down in f32 the same way: the
 * rounding points of the host path's cuBLASLt GEMMs above TROUPE_CUDA_GEMM_SPLIT rows (bf16
 * activations, as vLLM and SGLang run MoE): ~1e-3 relative per GEMM. A row's result depends only
 * on its own inputs and K (every output element sees the same mma sequence over the same K
 * slices, whatever the tile, its other rows or BM), so the path is batch-invariant and the same
 * bits run to run, although the sort places an expert's entries in no fixed order.
 *
 * Quantized experts (cuda_moe_gemm_takes_q): fp8 / int8 codes (H and I multiples of 16) or int4 /
 * fp4 nibbles (multiples of 32) with f32 block scales. The B stages hold codes (64 per weight row
 * per K slice: 64 or 32 bytes), cp.async'd as above; after a slice lands each thread decodes the
 * chunks it loaded (cuda_moe_quant.cuh) into one bf16 slice, code * its column group's scale
 * rounded to bf16, and a second barrier publishes it to the mma. Weight-only, that is the bf16
 * path's grade with the dequantized weight rounded to bf16 too. With per-token activations (qact:
 * one-byte codes, one weight scale per row) the A operands are the activations' codes and the B
 * slice the weights' codes, both exact in f16 and run as f16 (decoding fp8 is then one convert per
 * two codes, no scale: the cheapest decode), and the two scales multiply the f32 sums: the CPU's
 * products, summed in another order.
 *
 * Known limits: 16-bit or quantized weights only, H and I multiples of 8, 16-byte aligned weights
 * (cuda_moe.cu sends other shapes to its other paths); one fixed tile shape per BM, chosen by the
 * average rows per expert (TROUPE_CUDA_MOE_GROUPED_BM forces one); no split-K, no persistent
 * scheduling, and an expert's tiles are as many blocks as its rows need (a skewed chunk is no long
 * tail, but a row tile holding few rows still costs a full one). mma.sync rather than Hopper's wgmma/TMA: simpler,
 * and ~2/3 of the tensor peak at best. Written without a GPU at hand (checked first under a host
 * emulation of the threads, barriers, cp.async, ldmatrix and mma.sync), then run on the H200:
 * tests/gpu/test_backend_cuda.c's moe_ffn cases pass on every row tile, and bench_cuda's layer of
 * Qwen3-30B-A3B's shape takes 0.25 / 0.34 / 0.36 / 0.54 / 0.82 ms at 16 / 64 / 256 / 1,024 /
 * 2,048 tokens (the FMA path 0.33 / 0.65 / 2.08 ms up to 256; the host path 2.1-8.2 ms): ~3.4
 * TB/s of expert weights at decode sizes, 188 TFLOP/s (24% of the bf16 peak) at 2,048.
 */
#include <stdint.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_mma.cuh"
#include "kernels/cuda/cuda_moe_quant.cuh"

#define MG_WARPS 4
#define MG_THREADS (MG_WARPS * 32)
#define MG_BN 128                 /* weight rows per block: 128 of down, or 64 of gate + 64 of up */
#define MG_BK 64                  /* K per stage: 128 bytes of a 16-bit row */
#define MG_STAGES 3
#define MG_LD (MG_BK + 8)         /* shared row stride in elements: 144 bytes */
#define MG_CH (MG_BK / 8)         /* 16-byte chunks per row per stage */

/* Quantized weights of format QF: a K slice's code bytes per weight row (64 codes, or 64 nibbles),
 * their 16-byte chunks, and the row stride of a stage of codes in shared memory (16-byte aligned). */
__host__ __device__ constexpr int mg_qbytes(int qf) { return mq_nib(qf) ? MG_BK / 2 : MG_BK; }
__host__ __device__ constexpr int mg_qch(int qf) { return mg_qbytes(qf) / 16; }
__host__ __device__ constexpr int mg_qld(int qf) { return mg_qbytes(qf) + 16; }

/* One GEMM of the chunk, passed by value. */
typedef struct mg_args {
    const moe_dev_expert_t *tab;  /* device [E] */
    const int4 *tiles;            /* device [*n_tiles]: expert, first sorted entry, rows (1..BM) */
    const int32_t *n_tiles;       /* device [1] */
    const int32_t *tok;           /* device [rows]: each sorted entry's token in the chunk */
    const int32_t *slot;          /* device [rows]: each sorted entry's t * k + j */
    const uint16_t *a;            /* gate|up: xh [mc][K]; down: act [rows][K] (sorted order) */
    int N, K;                     /* gate|up: I, H; down: H, I */
    int qgr, qgc;                 /* quantized weights: their scale block (gate and up share one) */
    int qrow;                     /* quantized: 1 = one scale per weight row (gc >= K), applied to the sums
                                     (the bf16 operand is the code itself, exact); 0 = code * scale per block */
    const float *sx;              /* quantized with qact: the A rows' activation scales (gate|up: [mc] by
                                     token; down: [rows] by sorted entry), the A operand being their codes;
                                     NULL: A holds the values */
    float *actf;                  /* gate|up with qact: silu(g) * u in f32 [rows][N] here instead of act */
    uint16_t *act;                /* gate|up: out [rows][N] 16-bit, sorted order */
    float *y;                     /* down: out [rows][N] f32, row t * k + j */
} mg_args_t;

/* 16-bit weights: A and B stages. Quantized (QF): A stages, one bf16 B slice (the decoded
 * weights the mma reads) and the stages of codes. */
template <int BM, int QF> struct mg_smem {
    static constexpr size_t A = (size_t)MG_STAGES * BM * MG_LD * 2;
    static constexpr size_t BYTES = QF ? A + (size_t)MG_BN * MG_LD * 2 + (size_t)MG_STAGES * MG_BN * mg_qld(QF)
                                       : (size_t)MG_STAGES * (BM + MG_BN) * MG_LD * 2;
};

/* Two floats as the 16-bit type, round to nearest even, lo in the low half. bf16: common/dtype.h's
 * rounding (dev_bf16_bits); f16: saturated first. */
template <bool F16> static __device__ __forceinline__ uint32_t dev_moe_pack(float lo, float hi)
{
    if constexpr (F16)
        return dev_pack_f16x2(dev_f16_sat(lo), dev_f16_sat(hi));
    else
        return (uint32_t)dev_bf16_bits(lo) | (uint32_t)dev_bf16_bits(hi) << 16;
}

/* One grouped GEMM (the file header has the tiling). GU: gate|up with the SwiGLU epilogue, else
 * down. Block (x, y) computes columns n0 = x * (GU ? 64 : 128) of row tile tiles[y]. QF: the
 * weights are codes of that format (fp8, int8: a byte each; int4, fp4: a nibble) with f32 block
 * scales; every K slice of codes is decoded once into a bf16 slice in shared memory (code * scale,
 * rounded to bf16), which the mma reads as it reads 16-bit weights (F16 is false then). */
template <bool F16, int BM, bool GU, int QF = 0>
__global__ void __launch_bounds__(MG_THREADS, 2) k_moe_gemm(mg_args_t a)
{
    constexpr int MT = BM / 32;                    /* m16 tiles per warp: the warp has BM / 2 rows */
    constexpr int NT = 8;                          /* n8 tiles per warp: 64 weight rows */
    constexpr int A_IT = BM * MG_CH / MG_THREADS;  /* A chunks per thread per stage (rows tid / 8 + 16 i) */
    constexpr int B_IT = MG_BN * MG_CH / MG_THREADS;
    /* Quantized: a row's chunks per stage, their stride, values per chunk, chunks per thread per
     * stage (rows tid / QCH + QR i) */
    constexpr int QCH = mg_qch(QF), QLD = mg_qld(QF), QV = mq_chunk_values(QF);
    constexpr int Q_IT = MG_BN * QCH / MG_THREADS, QR = MG_THREADS / QCH;
    static_assert(BM == 32 || BM == 64 || BM == 128, "BM");
    static_assert(A_IT * MG_THREADS == BM * MG_CH && B_IT == 8 && MG_THREADS / MG_CH == 16, "one chunk column per thread");
    static_assert(!QF || (Q_IT * QR == MG_BN && Q_IT <= 4), "one code chunk column per thread");
    /* Quantized weights decode to bf16 (code * scale); to f16 only with one scale per row (qrow),
     * the slice then holding the codes' values, exact (cuda_moe_gemm picks F16 for W8A8 alone; a
     * zero-filled nibble would not decode to 0). */
    static_assert(!QF || !F16 || !mq_nib(QF), "f16 operands: one-byte codes");
    extern __shared__ __align__(16) uint16_t mg_sm[];
    uint16_t *As = mg_sm;                          /* [MG_STAGES][BM][MG_LD] */
    uint16_t *Bs = mg_sm + MG_STAGES * BM * MG_LD; /* [MG_STAGES][MG_BN][MG_LD]; QF: [MG_BN][MG_LD], the decoded slice */
    uint8_t *Bq = (uint8_t *)(Bs + MG_BN * MG_LD); /* QF: [MG_STAGES][MG_BN][QLD] codes */

    DEV_PDL_ENTER();
    if ((int)blockIdx.y >= *a.n_tiles)
        return;                                    /* the whole block: no barrier is left waiting */
    const int4 tile = a.tiles[blockIdx.y];
    const int e = tile.x, r0 = tile.y, nrows = tile.z;
    const int N = a.N, K = a.K;
    const int n0 = blockIdx.x * (GU ? MG_BN / 2 : MG_BN);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1;       /* warp rows wm * BM/2 ..; weight rows, see below */
    const int ch = tid & (MG_CH - 1);              /* the 16-byte chunk (8 elements) of every row this thread loads */

    /* Sources of this thread's rows (fixed for the whole K loop); a row out of range keeps a valid
     * pointer that cp.async is told not to read. A row i: tile row tid / 8 + 16 i. B row j = tid /
     * 8 + 16 i: gate|up: j < 64 gate row n0 + j, else up row n0 + j - 64; down: down row n0 + j. */
    const uint16_t *asrc[A_IT], *bsrc[B_IT];
    unsigned amask = 0, bmask = 0;
#pragma unroll
    for (int i = 0; i < A_IT; i++) {
        const int row = (tid >> 3) + 16 * i;
        const bool in = row < nrows;
        const int64_t src = !in ? 0 : GU ? (int64_t)a.tok[r0 + row] : (int64_t)(r0 + row);
        asrc[i] = a.a + src * K;
        amask |= (unsigned)in << i;
    }
    const moe_dev_expert_t ex = a.tab[e];
    if constexpr (!QF) {
#pragma unroll
        for (int i = 0; i < B_IT; i++) {
            const int j = (tid >> 3) + 16 * i;
            const int n = n0 + (GU ? (j & 63) : j);
            const bool in = n < N;
            const void *w = GU ? (j < 64 ? ex.gate : ex.up) : ex.down;
            bsrc[i] = (const uint16_t *)w + (in ? (int64_t)n * K : 0);
            bmask |= (unsigned)in << i;
        }
    }
    /* Quantized: code chunk qc = tid % QCH (QV values) of B rows j = tid / QCH + QR i, their rows'
     * scale rows; the thread decodes exactly the chunks it loads (so its own cp.async wait suffices
     * before decoding; the barrier after makes the bf16 slice visible). */
    const int qc = tid & (QCH - 1);
    const uint8_t *qsrc[Q_IT];
    const float *qscl[Q_IT];
    if constexpr (QF != 0) {
        const int64_t ngc = (K + a.qgc - 1) / a.qgc;
#pragma unroll
        for (int i = 0; i < Q_IT; i++) {
            const int j = tid / QCH + QR * i;
            const int n = n0 + (GU ? (j & 63) : j);
            const bool in = n < N;
            const void *w = GU ? (j < 64 ? ex.gate : ex.up) : ex.down;
            const float *sc = GU ? (j < 64 ? ex.gate_s : ex.up_s) : ex.down_s;
            qsrc[i] = (const uint8_t *)w + (in ? (int64_t)n * (mq_nib(QF) ? K / 2 : K) : 0);
            qscl[i] = sc + (in ? (int64_t)(n / a.qgr) * ngc : 0);
            bmask |= (unsigned)in << i;
        }
    }

    /* K slice kt into stage buf (the caller commits the group). */
    auto load_stage = [&](int kt, int buf) {
        const int k = kt * MG_BK + ch * 8;
        const bool kin = k < K;
        uint16_t *as = As + buf * BM * MG_LD, *bs = Bs + buf * MG_BN * MG_LD;
#pragma unroll
        for (int i = 0; i < A_IT; i++) {
            const bool in = kin && (amask >> i & 1u);
            dev_cp_async16(as + ((tid >> 3) + 16 * i) * MG_LD + ch * 8, in ? asrc[i] + k : asrc[i], in ? 16 : 0);
        }
        if constexpr (!QF) {
#pragma unroll
            for (int i = 0; i < B_IT; i++) {
                const bool in = kin && (bmask >> i & 1u);
                dev_cp_async16(bs + ((tid >> 3) + 16 * i) * MG_LD + ch * 8, in ? bsrc[i] + k : bsrc[i], in ? 16 : 0);
            }
        } else {                                   /* K % QV == 0: a code chunk is wholly in or out */
            const int kq = kt * MG_BK + qc * QV, kb = kt * mg_qbytes(QF) + qc * 16;
            uint8_t *bq = Bq + buf * MG_BN * QLD;
#pragma unroll
            for (int i = 0; i < Q_IT; i++) {
                const bool in = kq < K && (bmask >> i & 1u);
                dev_cp_async16(bq + (tid / QCH + QR * i) * QLD + qc * 16, in ? qsrc[i] + kb : qsrc[i], in ? 16 : 0);
            }
        }
    };

    /* Quantized: the thread's code chunks of K slice kt (stage kt % MG_STAGES) decoded into the bf16
     * slice, 16 values at a time: code * its column group's scale (times mq_dec_scale: fp4's 2^14),
     * rounded to bf16 (zero-filled chunks give 0). With qrow the row's scale waits for the sums and
     * the slice holds the codes' values (exact in bf16). */
    auto decode_stage = [&](int kt) {
        if constexpr (QF != 0) {
            const int kq = kt * MG_BK + qc * QV;
            const uint8_t *bq = Bq + (kt % MG_STAGES) * MG_BN * QLD;
#pragma unroll
            for (int i = 0; i < Q_IT; i++) {
                const int j = tid / QCH + QR * i;
                const bool in = kq < K && (bmask >> i & 1u);
                const uint4 q = *(const uint4 *)(bq + j * QLD + qc * 16);
#pragma unroll
                for (int pc = 0; pc < QV / 16; pc++) {
                    uint4 *dst = (uint4 *)(Bs + j * MG_LD + qc * QV + 16 * pc);
                    uint32_t p[8];
                    if constexpr (F16) {           /* qrow: the codes as f16 (a zero-filled chunk's: 0) */
                        mq_dec16_h2<QF>(q, pc, p);
                    } else {
                        float sc = !in     ? 0.0f
                                 : a.qrow ? 1.0f
                                          : __ldg(qscl[i] + (uint32_t)(kq + 16 * pc) / (uint32_t)a.qgc);
                        if constexpr (QF == BK_Q_FP4)
                            sc *= mq_dec_scale<QF>();
                        float f[16];
                        mq_dec16<QF>(q, pc, f);
#pragma unroll
                        for (int h = 0; h < 8; h++) {   /* one convert per two values (a NaN stays a NaN) */
                            const __nv_bfloat162 v =
                                __floats2bfloat162_rn(__fmul_rn(f[2 * h], sc), __fmul_rn(f[2 * h + 1], sc));
                            p[h] = *(const uint32_t *)&v;
                        }
                    }
                    dst[0] = make_uint4(p[0], p[1], p[2], p[3]);
                    dst[1] = make_uint4(p[4], p[5], p[6], p[7]);
                }
            }
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

    const int KT = (K + MG_BK - 1) / MG_BK;
#pragma unroll
    for (int s = 0; s < MG_STAGES - 1; s++) {      /* group s holds slice s (empty past KT) */
        if (s < KT)
            load_stage(s, s);
        dev_cp_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        /* Groups committed so far: MG_STAGES - 1 + kt; all but the newest MG_STAGES - 2 done means
         * group kt (slice kt) landed for this thread; the barrier makes every thread's visible and
         * says every warp finished slice kt - 1, whose stage the next load reuses. */
        dev_cp_wait<MG_STAGES - 2>();
        __syncthreads();
        const int nk = kt + MG_STAGES - 1;
        if (nk < KT)
            load_stage(nk, nk % MG_STAGES);
        dev_cp_commit();                           /* empty past KT: the wait count stays uniform */
        if constexpr (QF != 0) {
            /* The barrier above also says every warp finished reading the previous bf16 slice. */
            decode_stage(kt);
            __syncthreads();
        }

        const uint16_t *as = As + (kt % MG_STAGES) * BM * MG_LD + wm * (BM / 2) * MG_LD;
        const uint16_t *bs = QF ? Bs : Bs + (kt % MG_STAGES) * MG_BN * MG_LD;
#pragma unroll
        for (int kk = 0; kk < MG_BK / 16; kk++) {
            /* B: 4 x4 loads of 16 weight rows each; matrices (rows 0-7, k 0-7), (rows 0-7, k 8-15),
             * (rows 8-15, k 0-7), (rows 8-15, k 8-15) = b0, b1 of n8 tile 2 np, then of 2 np + 1.
             * Weight rows of pair np: gate|up: (np / 2) * 64 + 32 wn + (np % 2) * 16 (np 0-1 gate,
             * 2-3 up, the same columns); down: 64 wn + 16 np. So n8 tile nt holds weight rows
             * 32 wn + 8 nt (+ 64 for nt >= 4: up) or 64 wn + 8 nt. */
            uint32_t b[NT / 2][4];
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                const int brow = GU ? (np >> 1) * 64 + wn * 32 + (np & 1) * 16 : wn * 64 + np * 16;
                dev_ldsm_x4(bs + (brow + (lane & 7) + (lane >> 4) * 8) * MG_LD + kk * 16 + ((lane >> 3) & 1) * 8, b[np]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                /* A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15,
                 * k 8-15) of the m16 tile = a[0..3]. */
                uint32_t af[4];
                dev_ldsm_x4(as + (mt * 16 + (lane & 15)) * MG_LD + kk * 16 + (lane >> 4) * 8, af);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    dev_mma16<F16>(acc[mt][nt], af, b[nt >> 1][(nt & 1) * 2], b[nt >> 1][(nt & 1) * 2 + 1]);
            }
        }
    }
    dev_cp_wait<0>();                              /* only empty groups are left; none outlives the block */

    /* Accumulators: acc[mt][nt][2h + c] is tile row wm * BM/2 + 16 mt + g + 8h, n8 column 2t + c
     * (g = lane / 4, t = lane % 4). N is a multiple of 8, so column 2t < N implies 2t + 1 < N. */
    const int g = lane >> 2, t2 = (lane & 3) * 2;
    /* Quantized: the factors of a sum left out of the operands: the weight row's scale (qrow) and
     * the A row's activation scale (sx). Weight row n's scale row is n / qgr (one scale per row). */
    auto wscale = [&](const float *s, int n) -> float {
        if constexpr (QF != 0)
            return a.qrow ? __ldg(s + n / a.qgr) : 1.0f;
        return 1.0f;
    };
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = wm * (BM / 2) + mt * 16 + g + 8 * h;
            if (row >= nrows)
                continue;
            const int p = r0 + row;                /* the sorted entry */
            float xs = 1.0f;
            if constexpr (QF != 0)
                xs = a.sx ? a.sx[GU ? a.tok[p] : p] : 1.0f;
            if constexpr (GU) {
                uint16_t *dst = a.act + (int64_t)p * N;
#pragma unroll
                for (int nt = 0; nt < NT / 2; nt++) {
                    const int n = n0 + wn * 32 + nt * 8 + t2;
                    if (n >= N)
                        continue;
                    float s[2];
#pragma unroll
                    for (int c = 0; c < 2; c++) {  /* cuda_swiglu's (and the CPU's) arithmetic */
                        float gv = acc[mt][nt][2 * h + c], uv = acc[mt][nt + NT / 2][2 * h + c];
                        if constexpr (QF != 0) {
                            gv = gv * wscale(ex.gate_s, n + c) * xs;
                            uv = uv * wscale(ex.up_s, n + c) * xs;
                        }
                        s[c] = dev_swiglu(gv, uv);
                    }
                    if (QF != 0 && a.actf)
                        *(float2 *)(a.actf + (int64_t)p * N + n) = make_float2(s[0], s[1]);
                    else
                        *(uint32_t *)(dst + n) = dev_moe_pack<F16>(s[0], s[1]);
                }
            } else {
                float *dst = a.y + (int64_t)a.slot[p] * N;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int n = n0 + wn * 64 + nt * 8 + t2;
                    float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
                    if constexpr (QF != 0) {
                        if (n < N) {
                            v0 = v0 * wscale(ex.down_s, n) * xs;
                            v1 = v1 * wscale(ex.down_s, n + 1) * xs;
                        }
                    }
                    if (n < N)
                        *(float2 *)(dst + n) = make_float2(v0, v1);
                }
            }
        }
    }
}

/* ---- host side ----------------------------------------------------------------------------------- */

bool cuda_moe_gemm_takes(dtype_t dt, int64_t H, int64_t I)
{
    return (dt == DT_BF16 || dt == DT_F16) && H > 0 && I > 0 && H % 8 == 0 && I % 8 == 0;
}

/* One scale per weight row: the scale block spans the row. */
static bool s_qrow(moe_qgrid_t g, int64_t K) { return g.gc >= K; }

bool cuda_moe_gemm_takes_q(int qfmt, int qact, moe_qgrid_t qgu, moe_qgrid_t qdn, int64_t H, int64_t I)
{
    const int qv = mq_chunk_values(qfmt);          /* 16-byte chunks of 16 codes or 32 nibbles */
    if (!cuda_moe_quant_takes(qfmt) || H <= 0 || I <= 0 || H % qv || I % qv)
        return false;
    /* qact: the activations' codes are the A operand and their scale multiplies the sum, which needs
     * one weight scale per row too; the f32 SwiGLU output waits in y's space ([rows][I] <= [rows][H]).
     * Only the one-byte formats have such a kernel (4-bit checkpoints are weight-only). */
    return !qact || (!mq_nib(qfmt) && s_qrow(qgu, H) && s_qrow(qdn, I) && I <= H);
}

/* By the average entries per expert: at ~16 (a 256-token decode step of Qwen3-30B-A3B) the step
 * streams every expert's weights and a 128-row tile would be 7/8 padding; at ~128 (2,048 tokens)
 * the tensor work dominates and the bigger tile reads its shared rows twice as often per load.
 * An expert needs on average half a tile of padding: 64-row tiles are fuller than 128-row ones up
 * to ~100 entries per expert. (Guesses: bench_cuda's moe_M*_grouped_bm* lines measure each.) */
int cuda_moe_gemm_bm(const cuda_state_t *st, int rows, int E)
{
    if (st->moe_grouped_bm)
        return st->moe_grouped_bm;
    const int avg = rows / (E > 0 ? E : 1);
    return avg <= 24 ? 32 : avg <= 100 ? 64 : 128;
}

template <bool F16, int BM, int QF> static void s_gemms(const cuda_state_t *st, const moe_grouped_chunk_t *c)
{
    const unsigned tiles = (unsigned)cuda_moe_tiles_max(c->rows, BM, c->E);
    mg_args_t a = {};
    a.tab = c->tab;
    a.tiles = c->tiles;
    a.n_tiles = c->n_tiles;
    a.tok = c->tok;
    a.slot = c->slot;

    a.a = (const uint16_t *)c->xh;
    a.N = c->I;
    a.K = c->H;
    a.act = (uint16_t *)c->act;
    a.qgr = c->qgu.gr;
    a.qgc = c->qgu.gc;
    a.qrow = QF && s_qrow(c->qgu, c->H);
    a.sx = QF && c->qact ? c->qsx : NULL;
    a.actf = QF && c->qact ? c->y : NULL;
    const dim3 g_gu((unsigned)((c->I + MG_BN / 2 - 1) / (MG_BN / 2)), tiles);
    cuda_launch_large_smem<k_moe_gemm<F16, BM, true, QF>>(st, g_gu, MG_THREADS, mg_smem<BM, QF>::BYTES, a);
    if (QF && c->qact)                             /* down's input: each entry's codes and scale */
        cuda_moe_qcodes(st, c->y, c->rows, c->I, c->qact, (uint16_t *)c->act, c->qsa);

    a.a = (const uint16_t *)c->act;
    a.N = c->H;
    a.K = c->I;
    a.act = NULL;
    a.y = c->y;
    a.qgr = c->qdn.gr;
    a.qgc = c->qdn.gc;
    a.qrow = QF && s_qrow(c->qdn, c->I);
    a.sx = QF && c->qact ? c->qsa : NULL;
    a.actf = NULL;
    const dim3 g_dn((unsigned)((c->H + MG_BN - 1) / MG_BN), tiles);
    cuda_launch_large_smem<k_moe_gemm<F16, BM, false, QF>>(st, g_dn, MG_THREADS, mg_smem<BM, QF>::BYTES, a);
}

template <bool F16, int QF> static void s_chunk(const cuda_state_t *st, const moe_grouped_chunk_t *c)
{
    if (QF && c->qact)                             /* the tokens' codes and scales */
        cuda_moe_qcodes(st, c->x, c->mc, c->H, c->qact, (uint16_t *)c->xh, c->qsx);
    else
        cuda_to16(st, c->x, (int64_t)c->mc * c->H, F16, (uint16_t *)c->xh);   /* matmul's conversion */
    switch (c->bm) {
    case 32: s_gemms<F16, 32, QF>(st, c); break;
    case 64: s_gemms<F16, 64, QF>(st, c); break;
    default: s_gemms<F16, 128, QF>(st, c); break;
    }
}

void cuda_moe_gemm(const cuda_state_t *st, const moe_grouped_chunk_t *c)
{
    /* W8A8 (qact): both operands are codes, exact in f16, whose f16 decode is the cheapest (fp8: one
     * convert per two codes, no scale); weight-only: code * scale in bf16. */
    if (c->qfmt == BK_Q_FP8 && c->qact)
        s_chunk<true, BK_Q_FP8>(st, c);
    else if (c->qfmt == BK_Q_FP8)
        s_chunk<false, BK_Q_FP8>(st, c);
    else if (c->qfmt == BK_Q_I8 && c->qact)
        s_chunk<true, BK_Q_I8>(st, c);
    else if (c->qfmt == BK_Q_I8)
        s_chunk<false, BK_Q_I8>(st, c);
    else if (c->qfmt == BK_Q_I4)
        s_chunk<false, BK_Q_I4>(st, c);
    else if (c->qfmt == BK_Q_FP4)
        s_chunk<false, BK_Q_FP4>(st, c);
    else if (c->dt == DT_F16)
        s_chunk<true, 0>(st, c);
    else
        s_chunk<false, 0>(st, c);
}
