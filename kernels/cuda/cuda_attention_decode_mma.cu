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
 * f16: q and p rounded to f16 (2^-11) instead of bf16; the cache's scales (bk_kv_t.scale) are
 * folded into the score scale (K) and the output or partials (V). Earlier versions converted tiles in shared
 * memory (to bf16: conversion-bound; to f16: latency-bound), no faster than bf16 (RESULTS.md,
 * 2026-11-29). Batch 256 at 1,000 keys, H200, 2026-11-29: 5.55 ms, 1.72x the bf16 cache.
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
    const int32_t *seq_row0;      /* NULL: one row per block; else sequence s owns rows [seq_row0[s], seq_row0[s + 1]) */
    const float *q;               /* [T][n_heads][D] */
    float *out;                   /* [T][n_heads][D] (S = 1) */
    float *part;                  /* S > 1: [T][n_heads][S][D + 2] = (m, l, acc[D]), k_attn_merge's layout */
    int n_heads;
    int G;                        /* query heads per kv head, 1..16 */
    int S;                        /* key ranges per row */
    int RB;                       /* with seq_row0: rows per block (MT * 16 / G) */
    int NGS;                      /* with seq_row0: blocks per sequence and kv head (groups of RB rows) */
    float scale_log2;             /* scale * log2(e): exp(s * scale - m) is computed as exp2 */
    const float *kv_scale;        /* fp8 with scales (bk_kv_t.scale): [n_layers][2][n_kv]; NULL: 1 */
} dmma_args_t;

/* Shared memory of one block, in bytes: the K/V stages, tiles as the cache stores them (rows
 * padded by 16 bytes: ldmatrix's 8 row addresses in 8 bank groups), then Q: one m16 tile (MT = 1)
 * as bf16 rows (a bf16 cache only; an fp8 one reads its fragments from global memory), two (MT = 2)
 * as each lane's own A fragments. fp8 tiles are half the bytes: 54 KB at D = 128, so 4 blocks per
 * SM (bf16: 106 KB, 2). The merge of the warps' states is laid over the stages (MT = 2 with an fp8
 * cache: it is the larger). */
template <int D, bool F8, int MT> struct dmma_smem {
    static constexpr int STRIDE = D + DMMA_PAD;                     /* one 16-bit Q row (and bf16 K/V row), elements */
    static constexpr int STAGES = DMMA_STAGES;
    static constexpr int SROW = F8 ? D + 16 : STRIDE * 2;           /* one staged K or V row, bytes */
    static constexpr size_t TILE = (size_t)DMMA_KEYS * SROW;        /* one staged K or V tile, bytes */
    static constexpr size_t KV_BYTES = (size_t)STAGES * 2 * TILE;
    static constexpr int VROWS = MT * DMMA_ROWS;                    /* query vectors of a block */
    static constexpr int RSTRIDE = D + 8;                           /* a merge row, floats (+8: fewer bank conflicts) */
    static constexpr size_t MERGE_BYTES = ((size_t)DMMA_WARPS * VROWS * RSTRIDE + 2 * DMMA_WARPS * VROWS) * 4;
    static constexpr size_t BASE = KV_BYTES > MERGE_BYTES ? KV_BYTES : MERGE_BYTES;
    static constexpr size_t Q_BYTES = MT > 1 ? (size_t)MT * (D / 16) * 32 * 16     /* uint4 per lane per (tile, k16 step) */
                                             : F8 ? 0 : (size_t)DMMA_ROWS * STRIDE * 2;
    static constexpr size_t BYTES = BASE + Q_BYTES;
};

/* One block per (row group, kv head g, key range s), 4 warps. A row group is one row (decode,
 * seq_row0 NULL) or up to RB consecutive rows of one sequence (speculative verification: a
 * sequence's last token and its drafts, k + 1 rows at consecutive positions). The group's rows x
 * g's G query heads are the block's query vectors, vector v = r * G + h (row r, head gG + h), in
 * MT m16 tiles; every K/V tile is loaded once for all of them, and each vector's scores are masked
 * causally past its own row's position. The key range is that of the group's last position. */
template <int D, bool F8, int MT>
__global__ void __launch_bounds__(DMMA_THREADS, MT > 1 ? 2 : F8 ? 4 : D == 64 ? 3 : 2) k_attn_decode_mma(dmma_args_t a)
{
    DEV_PDL_ENTER();
    typedef dmma_smem<D, F8, MT> SM;
    constexpr int ST = SM::STRIDE, RST = SM::RSTRIDE, STAGES = SM::STAGES, VROWS = SM::VROWS;
    constexpr int EB = F8 ? 1 : 2;                 /* bytes per cached element */
    constexpr int CH = D * EB / 16;                /* 16-byte chunks per key row */
    constexpr int KD = D / 16;                     /* k16 steps of Q K^T */
    constexpr int DB = D / 8;                      /* n8 blocks of O (dimensions) */
    extern __shared__ __align__(16) uint8_t dmma_sm[];
    uint8_t *Ks = dmma_sm;                                    /* [STAGES][KEYS][SROW bytes] */
    uint8_t *Vs = Ks + STAGES * SM::TILE;                     /* [STAGES][KEYS][SROW bytes] */
    uint16_t *Qs = (uint16_t *)(dmma_sm + SM::BASE);         /* MT = 1, bf16 cache: [ROWS][ST] */
    uint4 *Qf = (uint4 *)(dmma_sm + SM::BASE);               /* MT = 2: [MT][KD][32 lanes] A fragments */
    float *Ro = (float *)dmma_sm;                             /* after the loop: [WARPS][VROWS][RST] */
    float *Rm = Ro + DMMA_WARPS * VROWS * RST;                /* [WARPS][VROWS] */
    float *Rl = Rm + DMMA_WARPS * VROWS;                      /* [WARPS][VROWS] */

    const int G = a.G, g = blockIdx.x % a.n_kv, grp = blockIdx.x / a.n_kv, sidx = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    int t0 = grp, n_rows = 1;                      /* this block's rows: t0 .. t0 + n_rows - 1 */
    if (a.seq_row0) {
        const int s = grp / a.NGS;
        t0 = a.seq_row0[s] + (grp % a.NGS) * a.RB;
        n_rows = min(a.RB, a.seq_row0[s + 1] - t0);
        if (n_rows <= 0)                           /* block-uniform: a sequence with fewer rows than the largest */
            return;
    }
    const int nvec = n_rows * G;
    const bool two = MT > 1 && nvec > DMMA_ROWS;   /* block-uniform: the second m16 tile has vectors */
    int pmin = INT_MAX, pmax = -1;
    for (int r = 0; r < n_rows; r++) {
        const int p = a.tok_pos[t0 + r];
        pmin = min(pmin, p);
        pmax = max(pmax, p);
    }
    const int seq = a.tok_seq[t0], n_keys = pmax + 1;
    const int span = (n_keys + a.S - 1) / a.S;
    const int k0 = min(n_keys, sidx * span), k1 = min(n_keys, k0 + span);
    const int kmask = min(k1, pmin + 1);           /* keys from here are masked for some vector */
    const int n_tiles = (k1 - k0 + DMMA_KEYS - 1) / DMMA_KEYS;
    const int32_t *bt = a.block_table + a.seq_bt_start[seq];
    const size_t slot_stride = (size_t)a.n_kv * D * EB;      /* bytes */
    const size_t k_off = (size_t)a.layer * 2 * a.block_size * slot_stride + (size_t)g * D * EB;
    const size_t v_off = k_off + (size_t)a.block_size * slot_stride;
    /* An fp8 cache's scales of kv head g: K's folded into the score scale, V's into the output
     * (and the partials, which the merge only weighs and adds). */
    float sl2 = a.scale_log2;
    if (F8 && a.kv_scale)
        sl2 *= a.kv_scale[(size_t)a.layer * 2 * a.n_kv + g];
    /* Query vector v's row of q (valid for v < nvec). */
    /* Vector v = r * G + h: row r of the block's rows, head gG + h. G is a runtime value, so r
     * costs an integer division; a block of one row (decode, the common case) has r = 0 without
     * one. The fp8 kernel's PTX had 14 divisions while it took one row per block, 37 once it took
     * rows by sequence (a qvec per k16 step), 19 with this and the row pointers found once. */
    auto vrow = [&](int v) { return n_rows == 1 ? 0 : v / G; };
    auto qvec = [&](int v) {
        const int r = vrow(v);
        return a.q + ((size_t)(t0 + r) * a.n_heads + (size_t)g * G + (v - r * G)) * D;
    };

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

    /* The A fragments of Q, vectors past nvec zero. MT = 1 keeps them in registers (qf); MT = 2
     * writes each lane's into shared memory (Qf; read back per k16 step: the registers hold two
     * tiles' O instead). An fp8 cache's come straight from global memory in its K fragments'
     * permuted order (below), k 2t, 2t+1 = dimensions 16kk + 4t, +1 and k 2t+8, 2t+9 = 16kk + 4t
     * + 2, +3 (a permutation of the sum's terms); a bf16 cache's MT = 1 tile through shared memory
     * and ldmatrix, its MT = 2 tiles from global memory in the mma's order (k 2t, 2t+1 and 2t+8,
     * 2t+9 = those dimensions of 16kk). */
    uint32_t qf[MT > 1 ? 1 : KD][4];
    if constexpr (MT > 1) {
        for (int mt = 0; mt < MT; mt++) {
            const float *qr[2];                    /* this lane's two vectors of tile mt (NULL: past nvec) */
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int v = mt * DMMA_ROWS + gid + 8 * half;
                qr[half] = v < nvec ? qvec(v) : NULL;
            }
#pragma unroll
            for (int kk = 0; kk < KD; kk++) {
                uint32_t f[4];
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (qr[half]) {
                        const float *qv = qr[half] + kk * 16;
                        if constexpr (F8) {
                            x = *(const float4 *)(qv + 4 * tig);
                        } else {
                            const float2 lo = *(const float2 *)(qv + 2 * tig), hi = *(const float2 *)(qv + 2 * tig + 8);
                            x = make_float4(lo.x, lo.y, hi.x, hi.y);
                        }
                    }
                    f[half] = dev_pack2<F8>(x.x, x.y);
                    f[2 + half] = dev_pack2<F8>(x.z, x.w);
                }
                Qf[(mt * KD + kk) * 32 + lane] = make_uint4(f[0], f[1], f[2], f[3]);
            }
        }
        __syncwarp();                              /* a lane reads back only its own fragments */
    } else if constexpr (F8) {
        /* This lane's two vectors' rows found once, not per k16 step: each qvec was a division
         * ahead of a load, 16 of them in a row before the first score. */
        const float *qr[2] = {gid < nvec ? qvec(gid) : NULL, gid + 8 < nvec ? qvec(gid + 8) : NULL};
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (qr[half])
                    x = *(const float4 *)(qr[half] + kk * 16 + 4 * tig);
                qf[kk][half] = dev_pack2<F8>(x.x, x.y);
                qf[kk][2 + half] = dev_pack2<F8>(x.z, x.w);
            }
        }
    } else {
        for (int i = threadIdx.x; i < DMMA_ROWS * (D / 4); i += DMMA_THREADS) {
            const int v = i / (D / 4), d = (i % (D / 4)) * 4;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (v < nvec)
                x = *(const float4 *)(qvec(v) + d);
            *(uint2 *)(Qs + v * ST + d) = make_uint2(dev_pack2<F8>(x.x, x.y), dev_pack2<F8>(x.z, x.w));
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
            dev_ldsm_x4(Qs + (lane & 15) * ST + kk * 16 + (lane >> 4) * 8, qf[kk]);
    }
    /* The A fragment of tile mt, k16 step kk. */
    auto qfrag = [&](int mt, int kk, uint32_t f[4]) {
        if constexpr (MT > 1) {
            const uint4 w = Qf[(mt * KD + kk) * 32 + lane];
            f[0] = w.x, f[1] = w.y, f[2] = w.z, f[3] = w.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                f[e] = qf[kk][e];
        }
    };

    /* This lane's vectors of tile mt: gid (m[mt][0], l[mt][0], o[mt][][0..1]) and gid + 8 (m[mt][1],
     * l[mt][1], o[mt][][2..3]). */
    float o[MT][DB][4], m[MT][2], l[MT][2];       /* l: this thread's share of the row sum */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int j = 0; j < DB; j++)
            o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    /* The end of vector v's keys in this range: its row's position + 1, at most k1 (re-read where
     * a tile is masked, rather than held in registers the fp8 kernel has none to spare of); k1
     * for a block of one row, whose position is the last of its keys. */
    auto key_end = [&](int v) { return v < nvec && n_rows > 1 ? min(k1, a.tok_pos[t0 + v / G] + 1) : k1; };

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

        float s[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
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
                for (int mt = 0; mt < MT; mt++) {
                    if (mt > 0 && !two)
                        break;
                    uint32_t f0[4], f1[4];
                    qfrag(mt, kk, f0);
                    qfrag(mt, kk + 1, f1);
#pragma unroll
                    for (int n = 0; n < 4; n++)
                        dev_mma16<F8>(s[mt][n & 1], n >> 1 ? f1 : f0, dev_e4m3x2_f16x2(r[n]), dev_e4m3x2_f16x2(r[n] >> 16));
                }
            }
        } else {
            /* S (16 vectors x 16 keys): matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15,
             * d 0-7), (keys 8-15, d 8-15) of each k16 step = b0, b1 of n-block 0, then of n-block 1. */
#pragma unroll
            for (int kk = 0; kk < KD; kk++) {
                uint32_t b[4];
                dev_ldsm_x4(Kw + ((lane & 7) + (lane >> 4) * 8) * ST + kk * 16 + ((lane >> 3) & 1) * 8, b);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (mt > 0 && !two)
                        break;
                    uint32_t f[4];
                    qfrag(mt, kk, f);
                    dev_mma16<F8>(s[mt][0], f, b[0], b[1]);
                    dev_mma16<F8>(s[mt][1], f, b[2], b[3]);
                }
            }
        }
        uint32_t pa[MT][4];                        /* P as the A fragment of one k16 step, per tile */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (mt > 0 && !two)
                break;
            if (kw + 16 > kmask) {                 /* the range's last keys, or past some vector's row: mask */
                const int e0 = key_end(mt * DMMA_ROWS + gid), e1 = key_end(mt * DMMA_ROWS + gid + 8);
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int key = kw + 8 * j + 2 * tig;
                    if (key >= e0) s[mt][j][0] = -INFINITY;
                    if (key + 1 >= e0) s[mt][j][1] = -INFINITY;
                    if (key >= e1) s[mt][j][2] = -INFINITY;
                    if (key + 1 >= e1) s[mt][j][3] = -INFINITY;
                }
            }
            float mx0 = fmaxf(fmaxf(s[mt][0][0], s[mt][0][1]), fmaxf(s[mt][1][0], s[mt][1][1]));
            float mx1 = fmaxf(fmaxf(s[mt][0][2], s[mt][0][3]), fmaxf(s[mt][1][2], s[mt][1][3]));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(m[mt][0], mx0 * sl2), mn1 = fmaxf(m[mt][1], mx1 * sl2);
            /* A vector whose keys all lie past its row (a draft's row in the range's first tile of
             * another) has mn = -inf here: the guard keeps -inf - -inf out, and its p are 0. */
            const float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;
            const float c0 = exp2f(m[mt][0] - mu0), c1 = exp2f(m[mt][1] - mu1);
            m[mt][0] = mn0;
            m[mt][1] = mn1;
            /* P as the 16-bit A fragment of one k16 step: n-block 0 is its columns 0-7, n-block 1 8-15. */
            float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint32_t h0 = dev_pack2<F8>(exp2f(fmaf(s[mt][j][0], sl2, -mu0)),
                                                  exp2f(fmaf(s[mt][j][1], sl2, -mu0)));
                const uint32_t h1 = dev_pack2<F8>(exp2f(fmaf(s[mt][j][2], sl2, -mu1)),
                                                  exp2f(fmaf(s[mt][j][3], sl2, -mu1)));
                ps0 += dev_lo2<F8>(h0) + dev_hi2<F8>(h0);
                ps1 += dev_lo2<F8>(h1) + dev_hi2<F8>(h1);
                pa[mt][2 * j] = h0;
                pa[mt][2 * j + 1] = h1;
            }
            l[mt][0] = l[mt][0] * c0 + ps0;
            l[mt][1] = l[mt][1] * c1 + ps1;
#pragma unroll
            for (int j = 0; j < DB; j++) {
                o[mt][j][0] *= c0;
                o[mt][j][1] *= c0;
                o[mt][j][2] *= c1;
                o[mt][j][3] *= c1;
            }
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
                    const uint32_t a0 = dev_e4m3x2_f16x2(lo), a1 = dev_e4m3x2_f16x2(hi);
                    const uint32_t b0 = dev_e4m3x2_f16x2(lo >> 16), b1 = dev_e4m3x2_f16x2(hi >> 16);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        if (mt > 0 && !two)
                            break;
                        dev_mma16<F8>(o[mt][4 * dq + 2 * h], pa[mt], a0, a1);
                        dev_mma16<F8>(o[mt][4 * dq + 2 * h + 1], pa[mt], b0, b1);
                    }
                }
            }
        } else {
            /* O = O * c + P V: .trans matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
             * (keys 8-15, d 8-15) of each 16 dimensions = b0, b1 of n-block 2dp, then of 2dp + 1. */
#pragma unroll
            for (int dp = 0; dp < DB / 2; dp++) {
                uint32_t b[4];
                dev_ldsm_x4_trans(Vw + ((lane & 7) + ((lane >> 3) & 1) * 8) * ST + dp * 16 + (lane >> 4) * 8, b);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (mt > 0 && !two)
                        break;
                    dev_mma16<F8>(o[mt][2 * dp], pa[mt], b[0], b[1]);
                    dev_mma16<F8>(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
                }
            }
        }
    }
    dev_cp_wait<0>();                              /* only empty groups are left; nothing lands later */
    __syncthreads();                               /* every warp is done with the stages: the merge area overlays them */

    /* The warps' states: row sums over the quad, then vectors < nvec into shared memory. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            float x = l[mt][half];
            x += __shfl_xor_sync(0xffffffffu, x, 1);
            x += __shfl_xor_sync(0xffffffffu, x, 2);
            const int v = mt * DMMA_ROWS + gid + 8 * half;
            if (v >= nvec)
                continue;
            if constexpr (F8) {                    /* group h's A and B columns: dims 16h + 4t .. + 3 */
                float *ro = Ro + (warp * VROWS + v) * RST + 4 * tig;
#pragma unroll
                for (int h = 0; h < D / 16; h++)
                    *(float4 *)(ro + 16 * h) = make_float4(o[mt][2 * h][2 * half], o[mt][2 * h + 1][2 * half],
                                                           o[mt][2 * h][2 * half + 1], o[mt][2 * h + 1][2 * half + 1]);
            } else {
                float *ro = Ro + (warp * VROWS + v) * RST + 2 * tig;
#pragma unroll
                for (int j = 0; j < DB; j++)
                    *(float2 *)(ro + 8 * j) = make_float2(o[mt][j][2 * half], o[mt][j][2 * half + 1]);
            }
            if (tig == 0) {
                Rm[warp * VROWS + v] = m[mt][half];
                Rl[warp * VROWS + v] = x;
            }
        }
    }
    __syncthreads();
    const float vsc = F8 && a.kv_scale ? a.kv_scale[((size_t)a.layer * 2 + 1) * a.n_kv + g] : 1.0f;
    /* Merge (a warp that saw no key of a vector has m = -inf, l = 0, O = 0 and weight 0). */
    for (int i = threadIdx.x; i < nvec * D; i += DMMA_THREADS) {
        const int v = i / D, d = i % D;
        float mt = -INFINITY;
#pragma unroll
        for (int w = 0; w < DMMA_WARPS; w++)
            mt = fmaxf(mt, Rm[w * VROWS + v]);
        float lt = 0.0f, x = 0.0f;
#pragma unroll
        for (int w = 0; w < DMMA_WARPS; w++) {
            const float mw = Rm[w * VROWS + v], wt = mw == -INFINITY ? 0.0f : exp2f(mw - mt);
            lt += Rl[w * VROWS + v] * wt;
            x += Ro[(w * VROWS + v) * RST + d] * wt;
        }
        const int r = vrow(v);
        const size_t row = (size_t)(t0 + r) * a.n_heads + (size_t)g * G + (v - r * G);
        if (a.S == 1) {
            a.out[row * D + d] = x * (vsc / lt);
        } else {
            /* A range wholly past a vector's row is empty for it: (-inf, 0, zeros), weight 0 in the merge. */
            float *pp = a.part + (row * a.S + sidx) * (size_t)(D + 2);
            if (d == 0) {
                pp[0] = mt * DMMA_LN2;             /* k_attn_merge weighs ranges by expf(m - max m) */
                pp[1] = lt;
            }
            pp[2 + d] = F8 ? x * vsc : x;
        }
    }
}

/* Launched without programmatic dependent launch for more than one sequence (st->attn_decode_pdl):
 * on an H200 (2026-12-03) the 8B shape's 16-row decode step over 1,500 fp8 keys took 6.868 ms with
 * this kernel's early launch and 6.599 without it, the rest of the step's kernels keeping theirs
 * (TROUPE_CUDA_PDL_SKIP=k_attn_decode_mma); the baseline tree before the kernel took sequences
 * together ran 6.626. One sequence (batch-1 decode) keeps it: there it makes no difference (4.647
 * ms without, 4.660 with, 1,500 keys, 2026-12-03). */
template <int D, bool F8, int MT>
static void s_launch(const cuda_state_t *st, const dmma_args_t &a, int n_groups)
{
    const dim3 grid((unsigned)(n_groups * a.n_kv), (unsigned)a.S);   /* the kv heads of one group side by side */
    const int pdl = st->attn_decode_pdl == 1 || (st->attn_decode_pdl == 2 && n_groups == 1);
    cuda_launch_large_smem_pdl<k_attn_decode_mma<D, F8, MT>>(st, pdl, grid, DMMA_THREADS, dmma_smem<D, F8, MT>::BYTES, a);
}

/* The grouping of a call's rows (cuda.h): 0 when the call is not one the kernel takes by sequence;
 * else MT (query tiles per block), RB (rows per block) and NGS (blocks per sequence). */
static int s_groups(const bk_kv_t *kv, int n_heads, const bk_attn_meta_t *meta, int max_mt, int *mt, int *rb, int *ngs)
{
    const int G = cuda_mma_attn_group(kv, n_heads, DMMA_ROWS), R = meta->max_rows;
    if (!G || !meta->seq_row0 || R < 1 || R > CUDA_VERIFY_MAX_ROWS || (max_mt < 2 && R * G > DMMA_ROWS))
        return 0;
    const int MT = R * G <= DMMA_ROWS ? 1 : 2, RB = MT * DMMA_ROWS / G, NGS = (R + RB - 1) / RB;
    if ((int64_t)meta->n_seqs * NGS * kv->n_kv_heads > INT_MAX)
        return 0;
    *mt = MT;
    *rb = RB;
    *ngs = NGS;
    return meta->n_seqs * NGS;
}

int cuda_attention_decode_mma_groups(const bk_kv_t *kv, int n_heads, const bk_attn_meta_t *meta, int max_mt)
{
    int mt, rb, ngs;
    return max_mt >= 1 ? s_groups(kv, n_heads, meta, max_mt, &mt, &rb, &ngs) : 0;
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
    a.kv_scale = kv->dtype == DT_F8E4M3 ? kv->scale : NULL;
    int MT = 1, n_groups = T;
    if (T != meta->n_seqs) {                       /* several rows per sequence: by sequence, or refused */
        if (!(n_groups = s_groups(kv, n_heads, meta, st->attn_verify, &MT, &a.RB, &a.NGS)))
            return -1;
        a.seq_row0 = meta->seq_row0;
    }
    const bool f8 = kv->dtype == DT_F8E4M3;
    if (D == 64) {
        if (MT == 1) f8 ? s_launch<64, true, 1>(st, a, n_groups) : s_launch<64, false, 1>(st, a, n_groups);
        else f8 ? s_launch<64, true, 2>(st, a, n_groups) : s_launch<64, false, 2>(st, a, n_groups);
    } else {
        if (MT == 1) f8 ? s_launch<128, true, 1>(st, a, n_groups) : s_launch<128, false, 1>(st, a, n_groups);
        else f8 ? s_launch<128, true, 2>(st, a, n_groups) : s_launch<128, false, 2>(st, a, n_groups);
    }
    return 0;
}
