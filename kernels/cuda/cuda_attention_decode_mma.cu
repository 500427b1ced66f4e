/* kernels/cuda/cuda_attention_decode_mma.cu — decode attention on the tensor cores: GQA over the
 * paged cache, bf16 K/V, head_dim 64 or 128, G = n_heads / n_kv_heads in 1..16 ("tensor cores for
 * GQA decode", as FlashInfer does it).
 *
 * cuda_attention (cuda_attention.cu) sends a call here when every sequence in it has exactly one
 * new row (meta->n_tokens == meta->n_seqs) and TROUPE_CUDA_ATTN_MMA_DECODE=1 (the default); what
 * this file refuses (an f32 or f16 cache, another head_dim, G > 16, a misaligned q) goes to the
 * flash kernel, which stays the reference for everything done here. The kernel itself is correct
 * for any rows (each row reads its own sequence's keys), but rows of one sequence would each read
 * them again: prefill-shaped calls belong to cuda_attention_mma.cu.
 *
 * Decode attention at large batch reads every cached key and value once and does ~2 flops per
 * byte: the whole cost is streaming K and V, so the kernel is built around keeping that stream
 * full, and the tensor cores only take the arithmetic off the issue slots the loads need.
 * One block per (row t, kv head g, key range s), 4 warps:
 *   Q: the G query vectors of row t that share kv head g (heads gG..gG+G-1), f32 -> bf16 (round to
 *      nearest even) into shared memory as rows 0..G-1 of a 16-row m16 tile, rows G..15 zero (their
 *      results are computed and dropped); every warp holds all 16 rows as A fragments (ldmatrix).
 *   K/V: the range's keys in 64-key tiles through the block table, 16-byte cp.async chunks (each
 *      warp loads the 16 keys it alone reads, so a tile needs only warp barriers), 3
 *      stages (2 tiles in flight while one is used: 64 KB of loads in flight per block at D = 128,
 *      2 blocks per SM). Keys past the range are zero-filled (P = 0 must never meet garbage,
 *      0 * NaN). Rows padded by 16 bytes so ldmatrix's 8 row addresses hit 8 different bank groups.
 *   Warp w takes keys 16w..16w+15 of every tile, with its own online softmax state (m, l, O[16][D]
 *      in f32 registers) over the whole range: S = Q K^T (m16n8k16, 2 n8 blocks x D/16 k steps, K
 *      as B by plain ldmatrix), softmax in the log2 domain (s * scale * log2(e), exp2; row maxima
 *      and sums over the quad by shuffles), P re-used from S's accumulators as the bf16 A fragment
 *      of one k16 step, O += P V with V's B fragments by ldmatrix .trans (D/8 n8 blocks).
 *      Splitting a tile's keys across the warps (rather than its head dimensions) needs no exchange
 *      of P or of the row maxima between warps per tile: no block barrier in the loop at all (each
 *      warp loads and waits for its own keys; its program order protects a stage's reuse), and
 *      one merge of the 4 warps' states at the end, through shared memory laid over the K/V
 *      stages. (With a block barrier per tile and block-shared loads: batch 256, 1,000 keys, 10.0
 *      ms bf16 / 6.4 ms fp8; without: 9.6 / 6.1, H200.)
 *   End: the warps' (m, l, O) merged per vector, then either the normalised output (one range) or
 *      the range's (m, l, acc) into the split-KV partials that cuda_attention.cu's k_attn_merge
 *      combines: part[(t * n_heads + h) * S + s][D + 2], m in the natural-log domain like the flash
 *      kernel's (m_log2 * ln 2), an empty range as (-inf, 0, zeros).
 * The split count S comes from cuda_attention's rule (rows x kv heads against the SMs), so a batch
 * of 1 with a few thousand tokens of context still fills the GPU.
 *
 * Shared memory: K and V 3 x 64 x (D + 8) bf16 each, Q 16 x (D + 8) bf16: 106 KB at D = 128 (2
 * blocks per SM), 56 KB at D = 64 (3 per SM); an fp8 cache 3 x 64 x (D + 16) bytes each and no Q
 * (its fragments come from global memory): 54 KB at D = 128, 4 blocks per SM.
 *
 * Numerics, as the prefill kernel's (beyond summation order): q rounded once to bf16, each p =
 * exp(s - m) rounded to bf16 before P V, f32 scores, softmax state and accumulation; l sums the
 * rounded p. ~2e-3 relative on random inputs; tests/gpu/test_backend_cuda.c holds it to 5e-3.
 *
 * An fp8 (e4m3) cache (F8): tiles come in at 1 byte per element and stay so in shared memory;
 * ldmatrix reads them as 16-bit pairs and each fragment is converted in registers (one exact cvt
 * per pair; the K and V layouts this implies are described at their loops), and the mma runs on
 * f16: q and p rounded to f16 (2^-11) instead of bf16. Earlier versions converted tiles in shared
 * memory (to bf16: conversion-bound; to f16: latency-bound), no faster than bf16 (RESULTS.md runs
 * K and L). Batch 256 at 1,000 keys, H200: 5.55 ms, 1.72x the bf16 cache (run R).
 *
 * Known limits: q must be 16-byte aligned (cudaMalloc'd activations are). Up to 16 query heads per
 * kv head (one m16 tile).
 */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_mma.cuh"

#define DMMA_WARPS 4
#define DMMA_THREADS (DMMA_WARPS * 32)
#define DMMA_ROWS 16              /* the m16 tile: G query vectors, padded with zero rows */
#define DMMA_KEYS 64              /* keys per K/V tile: 16 per warp */
#define DMMA_STAGES 3             /* K/V tiles in shared memory: 2 in flight while 1 is used */
#define DMMA_PAD 8                /* bf16 elements (16 bytes) added to every shared row */
#define DMMA_LN2 0.69314718055994531f

/* Everything the kernel needs, passed by value. */
typedef struct dmma_args {
    const uint8_t *base;          /* pool */
    size_t block_bytes;
    int block_size, n_kv, layer;
    const int32_t *tok_seq, *tok_pos, *seq_bt_start, *block_table;
    const float *q;               /* [T][n_heads][D] */
    float *out;                   /* [T][n_heads][D] (S = 1) */
    float *part;                  /* S > 1: [T][n_heads][S][D + 2] = (m, l, acc[D]), k_attn_merge's layout */
    int n_heads;
    int G;                        /* query heads per kv head, 1..16 */
    int S;                        /* key ranges per row */
    float scale_log2;             /* scale * log2(e): exp(s * scale - m) is computed as exp2 */
} dmma_args_t;

/* Shared memory of one block, in bytes: the K/V stages, tiles as the cache stores them (rows
 * padded by 16 bytes: ldmatrix's 8 row addresses in 8 bank groups), then Q (bf16 only). fp8 tiles
 * are half the bytes: 54 KB at D = 128, so 4 blocks per SM (bf16: 106 KB, 2). */
template <int D, bool F8> struct dmma_smem {
    static constexpr int STRIDE = D + DMMA_PAD;                     /* one 16-bit Q row (and bf16 K/V row), elements */
    static constexpr int STAGES = DMMA_STAGES;
    static constexpr int SROW = F8 ? D + 16 : STRIDE * 2;           /* one staged K or V row, bytes */
    static constexpr size_t TILE = (size_t)DMMA_KEYS * SROW;        /* one staged K or V tile, bytes */
    static constexpr size_t KV_BYTES = (size_t)STAGES * 2 * TILE;
    static constexpr size_t BYTES = KV_BYTES + (F8 ? 0 : (size_t)DMMA_ROWS * STRIDE * 2);   /* fp8: Q from global */
    static constexpr int RSTRIDE = D + 8;                           /* a merge row, floats (+8: fewer bank conflicts) */
    static constexpr size_t MERGE_BYTES = ((size_t)DMMA_WARPS * DMMA_ROWS * RSTRIDE + 2 * DMMA_WARPS * DMMA_ROWS) * 4;
    static_assert(MERGE_BYTES <= KV_BYTES, "the merge area fits over the K/V stages");
};

template <int D, bool F8>
__global__ void __launch_bounds__(DMMA_THREADS, F8 ? 4 : D == 64 ? 3 : 2) k_attn_decode_mma(dmma_args_t a)
{
    DEV_PDL_ENTER();
    typedef dmma_smem<D, F8> SM;
    constexpr int ST = SM::STRIDE, RST = SM::RSTRIDE, STAGES = SM::STAGES;
    constexpr int EB = F8 ? 1 : 2;                 /* bytes per cached element */
    constexpr int CH = D * EB / 16;                /* 16-byte chunks per key row */
    constexpr int KD = D / 16;                     /* k16 steps of Q K^T */
    constexpr int DB = D / 8;                      /* n8 blocks of O (dimensions) */
    extern __shared__ __align__(16) uint8_t dmma_sm[];
    uint8_t *Ks = dmma_sm;                                    /* [STAGES][KEYS][SROW bytes] */
    uint8_t *Vs = Ks + STAGES * SM::TILE;                     /* [STAGES][KEYS][SROW bytes] */
    uint16_t *Qs = (uint16_t *)(dmma_sm + SM::KV_BYTES);     /* [ROWS][ST] (bf16 cache only) */
    float *Ro = (float *)dmma_sm;                             /* after the loop: [WARPS][ROWS][RST] */
    float *Rm = Ro + DMMA_WARPS * DMMA_ROWS * RST;            /* [WARPS][ROWS] */
    float *Rl = Rm + DMMA_WARPS * DMMA_ROWS;                  /* [WARPS][ROWS] */

    const int G = a.G, g = blockIdx.x % a.n_kv, t = blockIdx.x / a.n_kv, sidx = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int seq = a.tok_seq[t], n_keys = a.tok_pos[t] + 1;
    const int span = (n_keys + a.S - 1) / a.S;
    const int k0 = min(n_keys, sidx * span), k1 = min(n_keys, k0 + span);
    const int n_tiles = (k1 - k0 + DMMA_KEYS - 1) / DMMA_KEYS;
    const int32_t *bt = a.block_table + a.seq_bt_start[seq];
    const size_t slot_stride = (size_t)a.n_kv * D * EB;      /* bytes */
    const size_t k_off = (size_t)a.layer * 2 * a.block_size * slot_stride + (size_t)g * D * EB;
    const size_t v_off = k_off + (size_t)a.block_size * slot_stride;

    /* Tile i of the range into stage i % STAGES, or an empty group past the last tile (keeps the
     * wait count uniform). */
    auto load_tile = [&](int i) {
        if (i < n_tiles) {
            const int kt = k0 + i * DMMA_KEYS;
            uint8_t *kd = Ks + (i % STAGES) * SM::TILE, *vd = Vs + (i % STAGES) * SM::TILE;
            /* Each warp loads its own 16 keys (rows 16w..16w+15), which no other warp reads, so the
             * loop below needs only warp barriers and the warps run ahead of one another. A fixed
             * count per thread: the block-table reads go first. */
            static_assert(16 * CH % 32 == 0, "whole chunks per lane");
#pragma unroll
            for (int r = 0; r < 16 * CH / 32; r++) {
                const int c = lane + r * 32, j = 16 * warp + c / CH, part = c % CH, key = kt + j;
                const bool in = key < k1;
                const uint8_t *blockp = a.base + (in ? (size_t)bt[key / a.block_size] * a.block_bytes : 0);
                const size_t slot = in ? (size_t)(key % a.block_size) * slot_stride : 0;
                dev_cp_async16(kd + j * SM::SROW + part * 16, blockp + k_off + slot + part * 16, in ? 16 : 0);
                dev_cp_async16(vd + j * SM::SROW + part * 16, blockp + v_off + slot + part * 16, in ? 16 : 0);
            }
        }
        dev_cp_commit();
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++)
        load_tile(i);                              /* in flight while the queries are converted */

    uint32_t qf[KD][4];
    if constexpr (F8) {
        /* Straight from global memory (no shared-memory Q: 4 blocks fit an SM, not 3). k16 step kk
         * in the fp8 K fragments' order (below): k 2t, 2t+1 are dimensions 16kk + 4t, +1 and k 2t+8,
         * 2t+9 are 16kk + 4t + 2, +3 (a permutation of the sum's terms). Rows G..15 are zero. */
        const float *qrow = a.q + ((size_t)t * a.n_heads + (size_t)g * G) * D + 4 * tig;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int v = gid + 8 * half;
                float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (v < G)
                    x = *(const float4 *)(qrow + (size_t)v * D + kk * 16);
                qf[kk][half] = dev_pack2<F8>(x.x, x.y);
                qf[kk][2 + half] = dev_pack2<F8>(x.z, x.w);
            }
        }
    } else {
        for (int i = threadIdx.x; i < DMMA_ROWS * (D / 4); i += DMMA_THREADS) {
            const int v = i / (D / 4), d = (i % (D / 4)) * 4;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (v < G)
                x = *(const float4 *)(a.q + ((size_t)t * a.n_heads + (size_t)g * G + v) * D + d);
            *(uint2 *)(Qs + v * ST + d) = make_uint2(dev_pack2<F8>(x.x, x.y), dev_pack2<F8>(x.z, x.w));
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
            dev_ldsm_x4(Qs + (lane & 15) * ST + kk * 16 + (lane >> 4) * 8, qf[kk]);
    }

    /* This lane's rows of the m16 tile: gid (m0, l0, o[][0..1]) and gid + 8 (m1, l1, o[][2..3]). */
    float o[DB][4];
#pragma unroll
    for (int j = 0; j < DB; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;   /* l: this thread's share of the row sum */

    for (int i = 0; i < n_tiles; i++) {
        dev_cp_wait<STAGES - 2>();                 /* this thread's chunks of tile i have landed */
        __syncwarp();                              /* ... the warp's (its rows alone); its tile i - 1 reads are done */
        load_tile(i + STAGES - 1);
        const int kw = k0 + i * DMMA_KEYS + 16 * warp;   /* this warp's first key */
        if (kw >= k1)                              /* warp-uniform: the range ends before this warp's keys */
            continue;
        const uint8_t *kst = Ks + (i % STAGES) * SM::TILE + 16 * warp * SM::SROW;
        const uint8_t *vst = Vs + (i % STAGES) * SM::TILE + 16 * warp * SM::SROW;
        const uint16_t *Kw = (const uint16_t *)kst, *Vw = (const uint16_t *)vst;

        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        if constexpr (F8) {
            /* S from fp8 K: ldmatrix treats a key's 16 bytes of one k16 step as 8 b16 columns, so lane
             * (g, t) gets key g's dimensions 4t..4t+3 of it; as f16 pairs (one exact cvt each) they
             * are b0 (k 2t, 2t+1) and b1 (k 2t+8, 2t+9) in the permuted order qf was built in.
             * Matrices (keys 0-7, step kk), (keys 8-15, kk), (keys 0-7, kk+1), (keys 8-15, kk+1). */
#pragma unroll
            for (int kk = 0; kk < KD; kk += 2) {
                uint32_t r[4];
                dev_ldsm_x4(kst + ((lane & 7) + ((lane >> 3) & 1) * 8) * SM::SROW + (kk + (lane >> 4)) * 16, r);
#pragma unroll
                for (int m = 0; m < 4; m++)
                    dev_mma16<F8>(s[m & 1], qf[kk + (m >> 1)], dev_e4m3x2_f16x2(r[m]), dev_e4m3x2_f16x2(r[m] >> 16));
            }
        } else {
            /* S (16 vectors x 16 keys): matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15,
             * d 0-7), (keys 8-15, d 8-15) of each k16 step = b0, b1 of n-block 0, then of n-block 1. */
#pragma unroll
            for (int kk = 0; kk < KD; kk++) {
                uint32_t b[4];
                dev_ldsm_x4(Kw + ((lane & 7) + (lane >> 4) * 8) * ST + kk * 16 + ((lane >> 3) & 1) * 8, b);
                dev_mma16<F8>(s[0], qf[kk], b[0], b[1]);
                dev_mma16<F8>(s[1], qf[kk], b[2], b[3]);
            }
        }
        if (kw + 16 > k1) {                        /* the range's last keys: mask the zero-filled rest */
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int key = kw + 8 * j + 2 * tig;
                if (key >= k1) s[j][0] = s[j][2] = -INFINITY;
                if (key + 1 >= k1) s[j][1] = s[j][3] = -INFINITY;
            }
        }
        float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
        float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0 * a.scale_log2), mn1 = fmaxf(m1, mx1 * a.scale_log2);
        /* Key kw is in range, so mn is finite here; the guard keeps -inf - -inf out regardless. */
        const float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;
        const float c0 = exp2f(m0 - mu0), c1 = exp2f(m1 - mu1);
        m0 = mn0;
        m1 = mn1;
        /* P as the bf16 A fragment of one k16 step: n-block 0 is its columns 0-7, n-block 1 8-15. */
        uint32_t pa[4];
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint32_t h0 = dev_pack2<F8>(exp2f(fmaf(s[j][0], a.scale_log2, -mu0)),
                                                exp2f(fmaf(s[j][1], a.scale_log2, -mu0)));
            const uint32_t h1 = dev_pack2<F8>(exp2f(fmaf(s[j][2], a.scale_log2, -mu1)),
                                                exp2f(fmaf(s[j][3], a.scale_log2, -mu1)));
            ps0 += dev_lo2<F8>(h0) + dev_hi2<F8>(h0);
            ps1 += dev_lo2<F8>(h1) + dev_hi2<F8>(h1);
            pa[2 * j] = h0;
            pa[2 * j + 1] = h1;
        }
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
#pragma unroll
        for (int j = 0; j < DB; j++) {
            o[j][0] *= c0;
            o[j][1] *= c0;
            o[j][2] *= c1;
            o[j][3] *= c1;
        }
        if constexpr (F8) {
            /* O += P V from fp8 V: ldmatrix .trans of a 16-byte column group (16 dimensions as 8 b16
             * columns) gives lane (g, t) the bytes (key 2t: dims 2g, 2g+1; key 2t+1: the same); a
             * byte permute pairs the keys per dimension, so one register yields the b0 of two n8
             * blocks, block A = dims G0 + 2c and block B = dims G0 + 2c + 1 of the 16 (c: the mma's
             * column). o[2h] and o[2h+1] are A and B of group h; the write below un-permutes them.
             * Matrices (keys 0-7, group 2dq), (keys 8-15, 2dq), (keys 0-7, 2dq+1), (keys 8-15, 2dq+1). */
#pragma unroll
            for (int dq = 0; dq < D / 32; dq++) {
                uint32_t r[4];
                dev_ldsm_x4_trans(vst + ((lane & 7) + ((lane >> 3) & 1) * 8) * SM::SROW + dq * 32 + (lane >> 4) * 16, r);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t lo = __byte_perm(r[2 * h], 0, 0x3120), hi = __byte_perm(r[2 * h + 1], 0, 0x3120);
                    dev_mma16<F8>(o[4 * dq + 2 * h], pa, dev_e4m3x2_f16x2(lo), dev_e4m3x2_f16x2(hi));
                    dev_mma16<F8>(o[4 * dq + 2 * h + 1], pa, dev_e4m3x2_f16x2(lo >> 16), dev_e4m3x2_f16x2(hi >> 16));
                }
            }
        } else {
            /* O = O * c + P V: .trans matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
             * (keys 8-15, d 8-15) of each 16 dimensions = b0, b1 of n-block 2dp, then of 2dp + 1. */
#pragma unroll
            for (int dp = 0; dp < DB / 2; dp++) {
                uint32_t b[4];
                dev_ldsm_x4_trans(Vw + ((lane & 7) + ((lane >> 3) & 1) * 8) * ST + dp * 16 + (lane >> 4) * 8, b);
                dev_mma16<F8>(o[2 * dp], pa, b[0], b[1]);
                dev_mma16<F8>(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
    }
    dev_cp_wait<0>();                              /* only empty groups are left; nothing lands later */
    __syncthreads();                               /* every warp is done with the stages: the merge area overlays them */

    /* The warps' states: row sums over the quad, then rows < G into shared memory. */
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int v = gid + 8 * half;
        if (v >= G)
            continue;
        if constexpr (F8) {                        /* group h's A and B columns: dims 16h + 4t .. + 3 */
            float *ro = Ro + (warp * DMMA_ROWS + v) * RST + 4 * tig;
#pragma unroll
            for (int h = 0; h < D / 16; h++)
                *(float4 *)(ro + 16 * h) = make_float4(o[2 * h][2 * half], o[2 * h + 1][2 * half],
                                                       o[2 * h][2 * half + 1], o[2 * h + 1][2 * half + 1]);
        } else {
            float *ro = Ro + (warp * DMMA_ROWS + v) * RST + 2 * tig;
#pragma unroll
            for (int j = 0; j < DB; j++)
                *(float2 *)(ro + 8 * j) = make_float2(o[j][2 * half], o[j][2 * half + 1]);
        }
        if (tig == 0) {
            Rm[warp * DMMA_ROWS + v] = half ? m1 : m0;
            Rl[warp * DMMA_ROWS + v] = half ? l1 : l0;
        }
    }
    __syncthreads();
    /* Merge (a warp that saw no key has m = -inf, l = 0, O = 0 and weight 0). */
    for (int i = threadIdx.x; i < G * D; i += DMMA_THREADS) {
        const int v = i / D, d = i % D;
        float mt = -INFINITY;
#pragma unroll
        for (int w = 0; w < DMMA_WARPS; w++)
            mt = fmaxf(mt, Rm[w * DMMA_ROWS + v]);
        float lt = 0.0f, x = 0.0f;
#pragma unroll
        for (int w = 0; w < DMMA_WARPS; w++) {
            const float mw = Rm[w * DMMA_ROWS + v], wt = mw == -INFINITY ? 0.0f : exp2f(mw - mt);
            lt += Rl[w * DMMA_ROWS + v] * wt;
            x += Ro[(w * DMMA_ROWS + v) * RST + d] * wt;
        }
        const size_t row = (size_t)t * a.n_heads + (size_t)g * G + v;
        if (a.S == 1) {
            a.out[row * D + d] = x * (1.0f / lt);
        } else {
            float *pp = a.part + (row * a.S + sidx) * (size_t)(D + 2);
            if (d == 0) {
                pp[0] = mt * DMMA_LN2;             /* k_attn_merge weighs ranges by expf(m - max m) */
                pp[1] = lt;
            }
            pp[2 + d] = x;
        }
    }
}

template <int D, bool F8>
static void s_launch(const cuda_state_t *st, const dmma_args_t &a, int T)
{
    const dim3 grid((unsigned)(T * a.n_kv), (unsigned)a.S);   /* the kv heads of one row side by side */
    cuda_launch_large_smem<k_attn_decode_mma<D, F8>>(st, grid, DMMA_THREADS, dmma_smem<D, F8>::BYTES, a);
}

int cuda_attention_decode_mma(const cuda_state_t *st, const bk_kv_t *kv, int layer, const float *q, int n_heads,
                              float scale, const bk_attn_meta_t *meta, int S, float *part, float *out)
{
    const int D = kv->head_dim, n_kv = kv->n_kv_heads, T = meta->n_tokens;
    const int G = cuda_mma_attn_group(kv, n_heads, DMMA_ROWS);
    if (!G || !(scale > 0.0f) || ((uintptr_t)q & 15) || S < 1 || S > 65535 || (S > 1 && !part))
        return -1;
    if ((int64_t)T * n_kv > INT_MAX)               /* gridDim.x */
        return -1;
    if (T <= 0)
        return 0;
    dmma_args_t a = {};
    cuda_kv_addr(a, kv, layer, meta);
    a.q = q;
    a.out = out;
    a.part = part;
    a.n_heads = n_heads;
    a.G = G;
    a.S = S;
    a.scale_log2 = scale * 1.4426950408889634f;
    const bool f8 = kv->dtype == DT_F8E4M3;
    if (D == 64)
        f8 ? s_launch<64, true>(st, a, T) : s_launch<64, false>(st, a, T);
    else
        f8 ? s_launch<128, true>(st, a, T) : s_launch<128, false>(st, a, T);
    return 0;
}
