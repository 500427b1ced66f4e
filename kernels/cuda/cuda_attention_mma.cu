/* kernels/cuda/cuda_attention_mma.cu — prefill attention on the tensor cores: causal GQA over the
 * paged cache, bf16 K/V, head_dim 64 or 128 (FlashAttention-2's structure, mma.sync + ldmatrix).
 *
 * cuda_attention (cuda_attention.cu) sends prefill-shaped steps here when TROUPE_CUDA_ATTN_MMA=1
 * (the default) and the flash kernel would otherwise take them; anything this file refuses (an f32
 * or f16 cache, another head_dim, a misaligned q/out) goes to that flash kernel, which stays the
 * reference for everything done here.
 *
 * One block per (kv head g, tile of NT rows), 4 warps. Its 64 "vectors" are the NT x G queries of
 * the tile's rows and g's query heads (vector v = row v / G, head g*G + v % G; NT = 64 / G, so
 * G = 4: 16 rows, G = 1: 64 rows, G = 8: 8 rows; vectors past NT x G are padding): the G query
 * heads sharing a kv head fill the mma's M dimension, so each K/V tile is loaded once per group.
 * Warp w owns vectors 16w..16w+15, one m16 tile, for the whole key range:
 *   Q: the pass's queries, f32 -> bf16 (round to nearest even) into shared memory, then held in
 *      registers as A fragments (ldmatrix) for the whole pass.
 *   K/V: 64-key tiles, double-buffered with cp.async (16-byte chunks through the block table; keys
 *      past the pass's last position are zero-filled: P = 0 must never meet garbage, 0 * NaN).
 *      Every shared row is padded by 16 bytes, so the 8 row addresses of one ldmatrix phase fall in
 *      8 different 16-byte bank groups (row strides 272 / 144 bytes): no conflicts, no swizzle.
 *   S = Q K^T: m16n8k16 bf16 mma, f32 accumulation; K's rows are B's columns (plain ldmatrix).
 *   softmax: online, in f32 registers, in the log2 domain (s * scale * log2(e), exp2): each thread
 *      holds 2 rows x 16 keys of the 16 x 64 tile; row maxima and sums over the quad by shuffles.
 *   O += P V: P re-used from S's accumulator registers as bf16 A fragments (the C layout of two
 *      n8 blocks is the A layout of one k16 step), V's B fragments by ldmatrix .trans.
 * The key-tile loop (S, softmax, P V, masking) is cuda_flash_tile.cuh's, shared with the MLA prefill.
 * Causality: each row attends to keys 0..its position. A warp skips the key tiles above all of its
 * rows' positions, masks only tiles that reach past one of them (the diagonal), and takes the
 * others unmasked. Rows of one tile that belong to different sequences (the interface allows any
 * order) are handled one sequence per pass, like the flash kernel; the other rows' vectors get
 * position -1 in that pass (every key masked, nothing written). Row tiles are issued last first
 * (the causal long ones start first; the kv head is blockIdx.x so all heads of a tile go together).
 *
 * Shared memory: K and V 2 x 64 x (D + 8) bf16 each, Q 64 x (D + 8) bf16: 85 KB at D = 128
 * (2 blocks per SM), 45 KB at D = 64.
 *
 * Numerics (what differs from the CPU reference, beyond summation order): q is rounded once to
 * bf16 (the cache's K/V are bf16 already, so Q K^T's products are exact and summed in f32), and
 * each p = exp(s - m) is rounded to bf16 before P V (f32 accumulation); l sums the rounded p, so
 * out is an exact weighted mean of V under slightly perturbed weights. Relative error ~2e-3 on
 * random inputs (a CPU emulation of this rounding: q alone 1.5e-3, p alone 1.7e-3, both 2.2e-3;
 * tests/gpu/test_backend_cuda.c holds it to 5e-3).
 *
 * An fp8 (e4m3) cache (F8): the stages hold tiles at 1 byte per element; after a tile lands the
 * block converts it into one f16 K/V tile (exact) and the mma runs on f16 (q and p rounded to f16,
 * 2^-11). This kernel also takes every non-decode call over an fp8 cache (the flash kernel reads
 * only 2- and 4-byte elements), e.g. a few rows per sequence. The cache's scales (bk_kv_t.scale)
 * never touch the tiles: kv head g's K scale multiplies the score scale, its V scale the output.
 *
 * Known limits: no split-KV (prefill rows give enough blocks); q must be 16-byte aligned and out
 * 8-byte aligned (cudaMalloc'd activations are). Written without a GPU at hand: compiled, and its
 * fragment layouts checked against the PTX ISA's tables, first run pending.
 */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_flash_tile.cuh"
#include "kernels/cuda/cuda_mma.cuh"

#define MMA_WARPS 4
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_VECS 64               /* query vectors (rows x heads) per block: 16 per warp, one m16 tile each */
#define MMA_KEYS FLASH_KEYS       /* keys per K/V tile (the tile loop's) */
#define MMA_PAD 8                 /* bf16 elements (16 bytes) added to every shared row */

/* Everything the kernel needs, passed by value. */
typedef struct mma_args {
    const uint8_t *base;          /* pool */
    size_t block_bytes;
    int block_size, n_kv, layer;
    const int32_t *tok_seq, *tok_pos, *seq_bt_start, *block_table;
    const float *q;               /* [T][n_heads][D] */
    float *out;                   /* [T][n_heads][D] */
    int T, n_heads;
    int G;                        /* query heads per kv head */
    int NT;                       /* rows per block: MMA_VECS / G */
    float scale_log2;             /* scale * log2(e): exp(s * scale - m) is computed as exp2 */
    const float *kv_scale;        /* fp8 with scales (bk_kv_t.scale): [n_layers][2][n_kv]; NULL: 1 */
} mma_args_t;

/* Shared memory of one block, in bytes. The two K/V stages hold tiles as the cache stores them
 * (rows padded by 16 bytes). With an fp8 cache (F8) the current tile is converted, by the whole
 * block, into one bf16 K/V tile (Kc/Vc) that the mma code reads in place of the stage: 89 KB at
 * D = 128, still 2 blocks per SM. */
template <int D, bool F8> struct mma_smem {
    static constexpr int STRIDE = D + MMA_PAD;                      /* one bf16 K, V or Q row, elements */
    static constexpr int SROW = F8 ? D + 16 : STRIDE * 2;           /* one staged K or V row, bytes */
    static constexpr size_t TILE = (size_t)MMA_KEYS * SROW;         /* one staged K or V tile, bytes */
    static constexpr size_t CONV_BYTES = F8 ? (size_t)2 * MMA_KEYS * STRIDE * 2 : 0;   /* Kc, Vc */
    static constexpr size_t BYTES = 4 * TILE + CONV_BYTES + (size_t)MMA_VECS * STRIDE * 2;
};

template <int D, bool F8>
__global__ void __launch_bounds__(MMA_THREADS, 2) k_attn_mma(mma_args_t a)
{
    DEV_PDL_ENTER();
    typedef mma_smem<D, F8> SM;
    constexpr int ST = SM::STRIDE;
    constexpr int EB = F8 ? 1 : 2;                 /* bytes per cached element */
    constexpr int CH = D * EB / 16;                /* 16-byte chunks per key row */
    constexpr int DB = D / 8;                      /* n8 blocks of O (dimensions) */
    extern __shared__ __align__(16) uint8_t mma_sm[];
    uint8_t *Ks = mma_sm;                         /* [2][MMA_KEYS][SROW bytes] */
    uint8_t *Vs = Ks + 2 * SM::TILE;              /* [2][MMA_KEYS][SROW bytes] */
    uint16_t *Kc = (uint16_t *)(mma_sm + 4 * SM::TILE);   /* F8: [MMA_KEYS][ST] */
    uint16_t *Vc = Kc + MMA_KEYS * ST;                         /* F8: [MMA_KEYS][ST] */
    uint16_t *Qs = (uint16_t *)(mma_sm + 4 * SM::TILE + SM::CONV_BYTES);   /* [MMA_VECS][ST] */
    __shared__ int s_seq[MMA_VECS], s_pos[MMA_VECS];   /* per tile row; seq -1: no row, or done */
    __shared__ int s_vpos[MMA_VECS];              /* per vector in this pass: its position, -1: none */

    const int G = a.G, NT = a.NT, g = blockIdx.x;
    const int t0 = (gridDim.y - 1 - blockIdx.y) * NT;   /* last row tiles first */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const size_t slot_stride = (size_t)a.n_kv * D * EB;      /* bytes */
    const size_t k_off = (size_t)a.layer * 2 * a.block_size * slot_stride + (size_t)g * D * EB;
    const size_t v_off = k_off + (size_t)a.block_size * slot_stride;
    /* An fp8 cache's scales of kv head g: K's folded into the score scale, V's into the output. */
    float sl2 = a.scale_log2, vsc = 1.0f;
    if (F8 && a.kv_scale) {
        sl2 *= a.kv_scale[(size_t)a.layer * 2 * a.n_kv + g];
        vsc = a.kv_scale[((size_t)a.layer * 2 + 1) * a.n_kv + g];
    }
    for (int r = threadIdx.x; r < NT; r += MMA_THREADS) {
        const int t = t0 + r;
        s_seq[r] = t < a.T ? a.tok_seq[t] : -1;
        s_pos[r] = t < a.T ? a.tok_pos[t] : -1;
    }
    for (;;) {
        __syncthreads();
        /* This pass: the sequence of the first row not done yet, and its rows' largest position. */
        int max_pos;
        const int cur = dev_next_pass(s_seq, s_pos, NT, &max_pos);
        if (cur < 0)
            break;
        const int n_keys = max_pos + 1;
        const int32_t *bt = a.block_table + a.seq_bt_start[cur];

        auto load_tile = [&](int kt, int buf) {
            uint8_t *kd = Ks + buf * SM::TILE, *vd = Vs + buf * SM::TILE;
            for (int c = threadIdx.x; c < MMA_KEYS * CH; c += MMA_THREADS) {
                const int j = c / CH, part = c % CH, key = kt + j;
                const bool in = key < n_keys;
                const uint8_t *blockp = a.base + (in ? (size_t)bt[key / a.block_size] * a.block_bytes : 0);
                const size_t slot = in ? (size_t)(key % a.block_size) * slot_stride : 0;
                dev_cp_async16(kd + j * SM::SROW + part * 16, blockp + k_off + slot + part * 16, in ? 16 : 0);
                dev_cp_async16(vd + j * SM::SROW + part * 16, blockp + v_off + slot + part * 16, in ? 16 : 0);
            }
            dev_cp_commit();
        };
        load_tile(0, 0);                           /* in flight while the queries are converted */

        for (int v = threadIdx.x; v < MMA_VECS; v += MMA_THREADS) {
            const int r = v / G;
            s_vpos[v] = r < NT && s_seq[r] == cur ? s_pos[r] : -1;
        }
        for (int i = threadIdx.x; i < MMA_VECS * (D / 4); i += MMA_THREADS) {
            const int v = i / (D / 4), d = (i % (D / 4)) * 4, r = v / G;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < NT && s_seq[r] == cur)
                x = *(const float4 *)(a.q + ((size_t)(t0 + r) * a.n_heads + (size_t)g * G + v % G) * D + d);
            *(uint2 *)(Qs + v * ST + d) = make_uint2(dev_pack2<F8>(x.x, x.y), dev_pack2<F8>(x.z, x.w));
        }
        __syncthreads();

        /* This warp's rows: lane holds rows gid (p0) and gid + 8 (p1) of the warp's 16. */
        const int wv = warp * 16;
        const int p0 = s_vpos[wv + gid], p1 = s_vpos[wv + gid + 8];
        int wmin, wmax;
        uint32_t qf[D / 16][4];
        float o[DB][4];
        dev_flash_begin<D, D, ST>(s_vpos, Qs, wv, lane, wmin, wmax, qf, o);
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;   /* l: this thread's share of the row sum */

        /* The tiles the mma reads: the stage itself, or (fp8) its f16 conversion. Kc/Vc are free:
         * the last tile's closing barrier. */
        auto stage = [&](int buf) {
            if constexpr (F8) {
                dev_f8_rows_to_f16<D>(Ks + buf * SM::TILE, SM::SROW, Kc, ST, MMA_KEYS, threadIdx.x, MMA_THREADS);
                dev_f8_rows_to_f16<D>(Vs + buf * SM::TILE, SM::SROW, Vc, ST, MMA_KEYS, threadIdx.x, MMA_THREADS);
                __syncthreads();
                return flash_kv_t{Kc, Vc};
            }
            return flash_kv_t{(const uint16_t *)(Ks + buf * SM::TILE), (const uint16_t *)(Vs + buf * SM::TILE)};
        };
        /* Key index = position (ka 0); a row's limit is its position (-1 for vectors not in this
         * pass), which also masks the zero-filled keys past n_keys. */
        const flash_rows_t rows = {n_keys, 0, wmax, wmin, p0, p1, sl2};
        dev_flash_tiles<D, D, ST, ST, F8>(rows, qf, o, m0, m1, l0, l1, lane, load_tile, stage);

        /* Results: the normalised output of this pass's vectors. */
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int v = wv + gid + 8 * half;
            if ((half ? p1 : p0) < 0)
                continue;
            const float inv = vsc / (half ? l1 : l0);
            float *op = a.out + ((size_t)(t0 + v / G) * a.n_heads + (size_t)g * G + v % G) * D + 2 * tig;
#pragma unroll
            for (int j = 0; j < DB; j++)
                *(float2 *)(op + 8 * j) = make_float2(o[j][2 * half] * inv, o[j][2 * half + 1] * inv);
        }
        __syncthreads();                           /* every thread has read s_seq / s_vpos for this pass */
        for (int r = threadIdx.x; r < NT; r += MMA_THREADS)
            if (s_seq[r] == cur)
                s_seq[r] = -1;
    }
}

template <int D, bool F8>
static void s_launch(const cuda_state_t *st, const mma_args_t &a)
{
    const dim3 grid((unsigned)a.n_kv, (unsigned)((a.T + a.NT - 1) / a.NT));
    cuda_launch_large_smem<k_attn_mma<D, F8>>(st, grid, MMA_THREADS, mma_smem<D, F8>::BYTES, a);
}

int cuda_attention_mma(const cuda_state_t *st, const bk_kv_t *kv, int layer, const float *q, int n_heads, float scale,
                       const bk_attn_meta_t *meta, float *out)
{
    const int D = kv->head_dim, T = meta->n_tokens, G = cuda_mma_attn_group(kv, n_heads, MMA_VECS);
    if (!G || !(scale > 0.0f) || ((uintptr_t)q & 15) || ((uintptr_t)out & 7))
        return -1;
    const int NT = MMA_VECS / G;
    if ((T + NT - 1) / NT > 65535)                 /* gridDim.y */
        return -1;
    if (T <= 0)
        return 0;
    mma_args_t a = {};
    cuda_kv_addr(a, kv, layer, meta);
    a.q = q;
    a.out = out;
    a.T = T;
    a.n_heads = n_heads;
    a.G = G;
    a.NT = NT;
    a.scale_log2 = scale * 1.4426950408889634f;
    const bool f8 = kv->dtype == DT_F8E4M3;
    a.kv_scale = f8 ? kv->scale : NULL;
    if (D == 64)
        f8 ? s_launch<64, true>(st, a) : s_launch<64, false>(st, a);
    else
        f8 ? s_launch<128, true>(st, a) : s_launch<128, false>(st, a);
    return 0;
}
