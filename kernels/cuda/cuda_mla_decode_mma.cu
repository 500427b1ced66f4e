/* kernels/cuda/cuda_mla_decode_mma.cu — MLA's absorbed attention (backend.h, mla_attention) on the
 * tensor cores, for DeepSeek's cache shapes: kv_lora 512 + rope 64 (V2, V2-Lite, V3) and 64 + 16
 * (kjv-deepseek), a bf16 or fp8 e4m3 compressed cache. It computes what k_mla_split
 * (cuda_mla.cu) computes, in the same split-KV partial layout, so k_mla_combine merges its ranges.
 *
 * Opt-in: cuda_mla_attention sends a call here only with TROUPE_CUDA_MLA_MMA=1 (or 2: a refusal is
 * fatal, for tests); the default (0) keeps k_mla_split. On one H100 (2026-12-06) its test passes
 * and the V2-Lite-sized step is 1.02-1.84x faster at batch 1-256 (docs/deepseek.md); it becomes the
 * default once the fixtures' greedy output under it is checked on a GPU.
 *
 * Why: every head of a row scores the same cached entry (latent | rope key, W = kv_lora + rope
 * values), so per (row, key tile) attention is a matrix product, heads x W times W x keys, then
 * heads x keys times keys x kv_lora: 16 heads are the M of an m16n8k16 mma, keys its N (Q K^T) or
 * K (P V), and the entry's latent part serves as V in place, as FlashMLA does (its code is not
 * used here). k_mla_split does the same products as f32 FMAs on the CUDA cores.
 *
 * Layout. Grid (rows x head groups, S key ranges); block (t * n_hg + g, s) takes row t, heads
 * 16g .. 16g + 15 (rows past n_heads are zero queries whose results are dropped) and range s of the
 * row's keys 0..tok_pos[t] (k_mla_split's span rule: ceil(n_keys / S) rounded up to 16, at least
 * 16; a trailing range may be empty). Any rows: each row reads its own keys (decode rows are what
 * it is for; rows of one sequence each read them again, as in k_mla_split). 8 warps.
 *   Q: f32 -> 16 bits once into shared memory [16][W + 8]; read by ldmatrix per k16 step.
 *   Tiles of 64 keys through the block table, 16-byte cp.async chunks, double-buffered (the next
 *     tile loads while this one is used); keys past the range are zero-filled (p = 0 must never
 *     meet stale or uninitialised bits: 0 * NaN). An fp8 tile is converted once to f16 in shared
 *     memory (dev_f8_rows_to_f16: exact), then read as a 16-bit tile.
 *   Per tile, three block barriers apart (four with the fp8 conversion):
 *     1. S = Q K^T: warp w scores keys 8w..8w+7 (one n8 block) over the W / 16 k16 steps, K as B by
 *        plain ldmatrix; scores into shared memory [16][64].
 *     2. Online softmax in the log2 domain (s * scale * log2 e, exp2): warp w takes heads 2w, 2w+1,
 *        a lane two keys; m, l and this tile's correction per head in shared memory; p = exp2(x -
 *        m) rounded to 16 bits into shared memory [16][64]; l sums the rounded p.
 *     3. O = O * corr + P V: warp w holds O for latent dims (kv_lora / 8) w .. (16 heads x 64 dims:
 *        32 f32 registers a thread at kv_lora 512), P's A fragments by ldmatrix, the tile's latent
 *        columns as B by ldmatrix .trans.
 *   End: S == 1 writes out = O / l; else part [rows][n_heads][S][kv_lora + 2] = (m, l, O) per
 *   range with m in the natural-log domain (m_log2 * ln 2), an empty range (-inf, 0), the layout
 *   k_mla_combine reads.
 * Shared memory, V2 shape: 2 x 64 x 1168 B tiles + Q 18.3 KB + scores/p 6.5 KB: 171 KB (1 block
 * per SM); fp8: 2 x 64 x 592 B stages + a 73 KB f16 tile + the rest: 172 KB. Rows are padded by 16
 * bytes (an odd number of 16-byte chunks) so ldmatrix's 8 row addresses hit 8 bank groups.
 *
 * Numerics (where it differs from the CPU, kernels/cpu/cpu_mla.c, beyond summation order): q
 * rounded once to bf16 (f16, saturated to +-65504, over an fp8 cache), each p rounded to the same
 * type before P V; scores, softmax state and accumulation in f32; the cache's values exact. The
 * softmax runs per 64-key tile of a range (the CPU's per cache block): the same up to rounding.
 * Expected error: bf16's 2^-9 relative rounding of q moves a score by ~2^-9 |score| / sqrt(W)-ish
 * (random signs), and p's rounding weighs each value by (1 +- 2^-9). A CPU emulation of this
 * arithmetic on tests/gpu/test_mla_cuda.c's inputs (scores of a few units) gives per (row, head)
 * relative errors of RMS ~3e-3, worst 6.8e-3 (bf16), and worst 7.1e-4 (f16);
 * test_attention_mma holds them to 1.5e-2 and 3e-3.
 *
 * Known limits: 16 heads per block, so V3's 128 heads read each tile 8 times (from L2); an fp8
 * tile is converted in shared memory (the GQA kernel converts fragments in registers: faster
 * there). bk_kv_t.scale is not applied, as k_mla_split, k_mla_kv_store and the CPU's MLA ops do not
 * apply it. Refuses (returns -1, nothing launched) other shapes and dtypes.
 */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_mma.cuh"

#define MMLA_WARPS 8
#define MMLA_THREADS (MMLA_WARPS * 32)
#define MMLA_HEADS 16             /* the m16 tile */
#define MMLA_KEYS 64              /* keys per tile: 8 per warp in Q K^T */
#define MMLA_MIN_SPAN 16          /* keys: k_mla_split's rule for a range's length */
#define MMLA_LN2 0.69314718055994531f

/* Everything the kernel needs, passed by value. */
typedef struct mmla_args {
    const uint8_t *base;          /* pool */
    size_t block_bytes;
    int block_size, n_kv, layer;
    const int32_t *tok_seq, *tok_pos, *seq_bt_start, *block_table;
    const float *q_lat, *q_pe;    /* [T][n_heads][kv_lora], [T][n_heads][rope] */
    float *out;                   /* [T][n_heads][kv_lora] (S == 1) */
    float *part;                  /* S > 1: [T][n_heads][S][kv_lora + 2] = (m, l, acc), k_mla_combine's layout */
    int n_heads, n_hg, S;         /* heads, 16-head groups per row, key ranges per row */
    float scale_log2;             /* scale * log2(e) */
} mmla_args_t;

/* Shared memory of one block, in bytes: two staged tiles (as the cache stores them), an fp8 cache's
 * f16 copy of the current one, Q, the scores, p, and m / l / correction per head. */
template <int LORA, int ROPE, bool F8> struct mmla_smem {
    static constexpr int W = LORA + ROPE;
    static constexpr int ST = W + 8;                                /* a 16-bit row, elements */
    static constexpr int SROW = F8 ? W + 16 : 2 * ST;               /* a staged row, bytes */
    static constexpr size_t STAGE = (size_t)MMLA_KEYS * SROW;
    static constexpr size_t STAGES = 2 * STAGE;
    static constexpr size_t CONV = F8 ? (size_t)MMLA_KEYS * 2 * ST : 0;
    static constexpr size_t Q = (size_t)MMLA_HEADS * 2 * ST;
    static constexpr int SST = MMLA_KEYS + 4;                       /* a score row, floats */
    static constexpr size_t SC = (size_t)MMLA_HEADS * SST * 4;
    static constexpr int PST = MMLA_KEYS + 8;                       /* a p row, 16-bit elements (144 B: 9 chunks) */
    static constexpr size_t P = (size_t)MMLA_HEADS * PST * 2;
    static constexpr size_t BYTES = STAGES + CONV + Q + SC + P + 3 * MMLA_HEADS * 4;
    static_assert(STAGE % 16 == 0 && CONV % 16 == 0 && Q % 16 == 0 && SC % 16 == 0 && P % 16 == 0, "16-byte parts");
};

/* Two 8x8 b16 matrices (lanes 0-7 and 8-15 give the row addresses; 16-31 are ignored): register i
 * of lane l receives row l / 4, columns 2 (l % 4), +1 of matrix i; .trans: rows 2 (l % 4), +1 of
 * column l / 4. */
static __device__ __forceinline__ void s_ldsm_x2(const void *p, uint32_t r[2])
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
static __device__ __forceinline__ void s_ldsm_x2_trans(const void *p, uint32_t r[2])
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}

/* A 16-bit operand (bf16, or f16 with F16) back as a float, exactly. */
template <bool F16> static __device__ __forceinline__ float s_from16(uint16_t v)
{
    return F16 ? __half2float(__ushort_as_half(v)) : __uint_as_float((uint32_t)v << 16);
}

template <int LORA, int ROPE, bool F8>
__global__ void __launch_bounds__(MMLA_THREADS, 1) k_mla_decode_mma(mmla_args_t a)
{
    DEV_PDL_ENTER();
    typedef mmla_smem<LORA, ROPE, F8> SM;
    constexpr int W = SM::W, ST = SM::ST, SST = SM::SST, PST = SM::PST;
    constexpr int EB = F8 ? 1 : 2;                 /* bytes per cached element */
    constexpr int CH = W * EB / 16;                /* 16-byte chunks per entry */
    constexpr int KS = W / 16;                     /* k16 steps of Q K^T */
    constexpr int DW = LORA / MMLA_WARPS;          /* latent dims of O per warp */
    constexpr int NB = DW / 8;                     /* ... its n8 blocks */
    static_assert(W % 16 == 0 && DW % 8 == 0 && W * EB % 16 == 0, "a shape the fragments tile");
    static_assert(MMLA_HEADS == 2 * MMLA_WARPS && MMLA_KEYS == 8 * MMLA_WARPS, "warp w: heads 2w, 2w+1; keys 8w..");
    extern __shared__ __align__(16) uint8_t mmla_sm[];
    uint8_t *stage = mmla_sm;                                               /* [2][KEYS][SROW bytes] */
    uint16_t *Kc = (uint16_t *)(mmla_sm + SM::STAGES);                      /* F8: [KEYS][ST] f16 */
    uint16_t *Qs = (uint16_t *)(mmla_sm + SM::STAGES + SM::CONV);           /* [HEADS][ST] */
    float *Ss = (float *)((uint8_t *)Qs + SM::Q);                           /* [HEADS][SST] */
    uint16_t *Ps = (uint16_t *)((uint8_t *)Ss + SM::SC);                    /* [HEADS][PST] */
    float *Ms = (float *)((uint8_t *)Ps + SM::P), *Ls = Ms + MMLA_HEADS, *Cs = Ls + MMLA_HEADS;

    const int t = blockIdx.x / a.n_hg, hg = blockIdx.x % a.n_hg, sidx = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int h0 = hg * MMLA_HEADS, nh = min(MMLA_HEADS, a.n_heads - h0);
    const int seq = a.tok_seq[t], n_keys = a.tok_pos[t] + 1;
    const int span = max(MMLA_MIN_SPAN, ((n_keys + a.S - 1) / a.S + 15) / 16 * 16);
    const int k0 = min(n_keys, sidx * span), k1 = min(n_keys, k0 + span);
    if (k0 >= k1) {                                /* block-uniform (S > 1 only): an empty range weighs nothing */
        if ((int)threadIdx.x < nh) {
            float *pp = a.part + (((size_t)t * a.n_heads + h0 + threadIdx.x) * a.S + sidx) * (size_t)(LORA + 2);
            pp[0] = -INFINITY;
            pp[1] = 0.0f;
        }
        return;
    }
    const int32_t *bt = a.block_table + a.seq_bt_start[seq];
    const size_t row_bytes = (size_t)W * EB, layer_off = (size_t)a.layer * a.block_size * row_bytes;
    /* Keys kt .. kt + 63 into stage buf, those from k1 on zero-filled (their source not read). */
    auto issue = [&](int kt, int buf) {
        uint8_t *dst = stage + (size_t)buf * SM::STAGE;
        for (int c = threadIdx.x; c < MMLA_KEYS * CH; c += MMLA_THREADS) {
            const int j = c / CH, part = c - j * CH, key = kt + j;
            const bool in = key < k1;
            const uint8_t *src = a.base;
            if (in)
                src += (size_t)bt[key / a.block_size] * a.block_bytes + layer_off + (size_t)(key % a.block_size) * row_bytes;
            dev_cp_async16(dst + (size_t)j * SM::SROW + part * 16, src + part * 16, in ? 16 : 0);
        }
        dev_cp_commit();
    };
    issue(k0, 0);                                  /* in flight while Q is converted */

    for (int i = threadIdx.x; i < MMLA_HEADS * W; i += MMLA_THREADS) {
        const int r = i / W, e = i - r * W;
        float v = 0.0f;
        if (r < nh) {
            const size_t th = (size_t)t * a.n_heads + h0 + r;
            v = e < LORA ? a.q_lat[th * LORA + e] : a.q_pe[th * ROPE + (e - LORA)];
        }
        Qs[r * ST + e] = dev_to16<F8>(v);
    }
    if (threadIdx.x < MMLA_HEADS) {
        Ms[threadIdx.x] = -INFINITY;
        Ls[threadIdx.x] = 0.0f;
    }
    /* This lane's O: heads gid (o[][0..1]) and gid + 8 (o[][2..3]), dims DW warp + 8j + 2 tig, +1. */
    float o[NB][4];
#pragma unroll
    for (int j = 0; j < NB; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    const int n_tiles = (k1 - k0 + MMLA_KEYS - 1) / MMLA_KEYS;
    for (int it = 0; it < n_tiles; it++) {
        const int kt = k0 + it * MMLA_KEYS;
        dev_cp_wait<0>();                          /* this thread's chunks of tile it have landed */
        /* Every thread's have; and every warp is done with tile it - 1: its stage (refilled next),
         * the f16 copy, the scores, p and the corrections may be overwritten. Q, m, l set (it = 0). */
        __syncthreads();
        if (it + 1 < n_tiles)
            issue(kt + MMLA_KEYS, (it + 1) & 1);
        const uint8_t *cur = stage + (size_t)(it & 1) * SM::STAGE;
        const uint16_t *Kt = (const uint16_t *)cur;
        if constexpr (F8) {
            dev_f8_rows_to_f16<W>(cur, SM::SROW, Kc, ST, MMLA_KEYS, threadIdx.x, MMLA_THREADS);
            __syncthreads();
            Kt = Kc;
        }

        /* 1. Scores of heads 0-15 x keys 8w..8w+7: matrices (keys 0-7, dims 16kk..+7), (.., +8..15)
         * are b0, b1 of step kk. */
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint16_t *kw = Kt + (size_t)(8 * warp + (lane & 7)) * ST + ((lane >> 3) & 1) * 8;
        const uint16_t *qw = Qs + (lane & 15) * ST + (lane >> 4) * 8;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t qa[4], kb[2];
            dev_ldsm_x4(qw + kk * 16, qa);
            s_ldsm_x2(kw + kk * 16, kb);
            dev_mma16<F8>(s, qa, kb[0], kb[1]);
        }
        *(float2 *)(Ss + gid * SST + 8 * warp + 2 * tig) = make_float2(s[0], s[1]);
        *(float2 *)(Ss + (gid + 8) * SST + 8 * warp + 2 * tig) = make_float2(s[2], s[3]);
        __syncthreads();

        /* 2. Softmax of heads 2w, 2w+1 over the tile (keys from k1 on: -inf, so p = 0). */
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int h = 2 * warp + hh;
            float x[2];
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int j = lane + 32 * u;
                x[u] = kt + j < k1 ? Ss[h * SST + j] * a.scale_log2 : -INFINITY;
            }
            const float bmax = dev_warp_max(fmaxf(x[0], x[1]));
            const float m_old = Ms[h], m_new = fmaxf(m_old, bmax);
            const float mu = m_new == -INFINITY ? 0.0f : m_new;   /* keeps -inf - -inf out */
            const float corr = exp2f(m_old - mu);                /* 0 on the first tile */
            float ps = 0.0f;
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const uint16_t p = dev_to16<F8>(exp2f(x[u] - mu));
                Ps[h * PST + lane + 32 * u] = p;
                ps += s_from16<F8>(p);
            }
            ps = dev_warp_sum(ps);
            __syncwarp();                          /* every lane has read Ms[h] */
            if (lane == 0) {
                Ms[h] = m_new;
                Ls[h] = Ls[h] * corr + ps;
                Cs[h] = corr;
            }
        }
        __syncthreads();

        /* 3. O = O * corr + P V over this warp's dims: P's matrices (heads 0-7 / 8-15 x keys 16ks..+7 /
         * +8..15) as A; .trans matrices (keys 0-7, dims d..d+7), (keys 8-15, d..), (keys 0-7, d+8..),
         * (keys 8-15, d+8..) = b0, b1 of n-block j, then of j + 1. */
        const float c0 = Cs[gid], c1 = Cs[gid + 8];
#pragma unroll
        for (int j = 0; j < NB; j++) {
            o[j][0] *= c0;
            o[j][1] *= c0;
            o[j][2] *= c1;
            o[j][3] *= c1;
        }
        const uint16_t *vw = Kt + (size_t)((lane & 7) + ((lane >> 3) & 1) * 8) * ST + DW * warp;
        const uint16_t *pw = Ps + (lane & 15) * PST + (lane >> 4) * 8;
#pragma unroll
        for (int ks = 0; ks < MMLA_KEYS / 16; ks++) {
            uint32_t pa[4];
            dev_ldsm_x4(pw + ks * 16, pa);
            const uint16_t *vk = vw + (size_t)ks * 16 * ST;
#pragma unroll
            for (int j = 0; j + 1 < NB; j += 2) {
                uint32_t b[4];
                dev_ldsm_x4_trans(vk + j * 8 + (lane >> 4) * 8, b);
                dev_mma16<F8>(o[j], pa, b[0], b[1]);
                dev_mma16<F8>(o[j + 1], pa, b[2], b[3]);
            }
            if constexpr (NB % 2 == 1) {
                uint32_t b[2];
                s_ldsm_x2_trans(vk + (NB - 1) * 8, b);
                dev_mma16<F8>(o[NB - 1], pa, b[0], b[1]);
            }
        }
    }

    /* m and l were last written before the loop's final barrier. */
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = gid + 8 * half;
        if (r >= nh)
            continue;
        const size_t th = (size_t)t * a.n_heads + h0 + r;
        float *dst, mul = 1.0f;
        if (a.S == 1) {
            dst = a.out + th * LORA;
            mul = 1.0f / Ls[r];
        } else {
            float *pp = a.part + (th * a.S + sidx) * (size_t)(LORA + 2);
            if (warp == 0 && tig == 0) {
                pp[0] = Ms[r] * MMLA_LN2;          /* k_mla_combine weighs ranges by expf(m - max m) */
                pp[1] = Ls[r];
            }
            dst = pp + 2;
        }
#pragma unroll
        for (int j = 0; j < NB; j++) {
            const int d = DW * warp + 8 * j + 2 * tig;
            dst[d] = o[j][2 * half] * mul;
            dst[d + 1] = o[j][2 * half + 1] * mul;
        }
    }
}

template <int LORA, int ROPE, bool F8>
static void s_launch(const cuda_state_t *st, const mmla_args_t &a, int T)
{
    const dim3 grid((unsigned)T * (unsigned)a.n_hg, (unsigned)a.S);
    cuda_launch_large_smem<k_mla_decode_mma<LORA, ROPE, F8>>(st, grid, MMLA_THREADS, mmla_smem<LORA, ROPE, F8>::BYTES, a);
}

int cuda_mla_decode_mma(const cuda_state_t *st, const bk_kv_t *kv, int layer, const float *q_lat, const float *q_pe,
                        int n_heads, int kv_lora, int rope_dim, float scale, const bk_attn_meta_t *meta, int S,
                        float *part, float *out)
{
    const bool f8 = kv->dtype == DT_F8E4M3, v2 = kv_lora == 512 && rope_dim == 64, kjv = kv_lora == 64 && rope_dim == 16;
    if ((kv->dtype != DT_BF16 && !f8) || !(v2 || kjv) || 2 * kv->head_dim != kv_lora + rope_dim ||
        kv->n_kv_heads != 1 || kv->block_bytes % 16 != 0 || (uintptr_t)kv->base % 16 != 0)
        return -1;
    if (!(scale > 0.0f) || n_heads < 1 || S < 1 || S > 65535 || (S > 1 && !part))
        return -1;
    const int T = meta->n_tokens, n_hg = (n_heads + MMLA_HEADS - 1) / MMLA_HEADS;
    if ((int64_t)T * n_hg > INT_MAX)                /* gridDim.x */
        return -1;
    if (T <= 0)
        return 0;
    mmla_args_t a = {};
    cuda_kv_addr(a, kv, layer, meta);
    a.q_lat = q_lat;
    a.q_pe = q_pe;
    a.out = out;
    a.part = part;
    a.n_heads = n_heads;
    a.n_hg = n_hg;
    a.S = S;
    a.scale_log2 = scale * 1.4426950408889634f;
    if (v2)
        f8 ? s_launch<512, 64, true>(st, a, T) : s_launch<512, 64, false>(st, a, T);
    else
        f8 ? s_launch<64, 16, true>(st, a, T) : s_launch<64, 16, false>(st, a, T);
    return 0;
}
