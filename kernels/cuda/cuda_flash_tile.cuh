/* kernels/cuda/cuda_flash_tile.cuh — the key-tile loop of the tensor-core prefill attention kernels
 * (internal): one warp's m16 tile of query rows against 64-key K/V tiles double-buffered by
 * cp.async, S = Q K^T and O += P V by mma.sync m16n8k16, online softmax in the log2 domain, the
 * causal mask. FlashAttention-2's inner loop, shared by k_attn_mma (cuda_attention_mma.cu: the
 * paged cache, one head_dim for K and V, bf16, or fp8 through f16 tiles) and k_mla_prefill
 * (cuda_mla_prefill.cu: dense per-call K and V of different widths); those files' headers give the
 * fragment layouts and the numerics. Any change here changes both kernels' results.
 *
 * What differs between them is a parameter: the K and V widths (DK, DV) and shared row strides
 * (KS, VS), the mma's operand type (F16), where a tile comes from (the caller's load and stage
 * functors) and where positions start (flash_rows_t.ka). Forced inline, so that each kernel keeps
 * the instructions, and their order, that it had with the loop written out in it (its PTX was
 * compared, register names aside, when the loop moved here). */
#ifndef TROUPE_KERNELS_CUDA_FLASH_TILE_CUH
#define TROUPE_KERNELS_CUDA_FLASH_TILE_CUH

#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda_mma.cuh"

#define FLASH_KEYS 64             /* keys per K/V tile */

/* Which keys one warp's rows see in a pass. Positions are absolute: the pass's key index i is
 * position ka + i. */
typedef struct flash_rows {
    int n_keys;                   /* the pass's keys: tiles at 0, 64, ... below it (zero-filled past it) */
    int ka;                       /* the position of key index 0 */
    int wmax;                     /* the warp's largest row position: a tile starting past it is skipped */
    int wlim;                     /* the warp's smallest row limit: a tile reaching past it is masked */
    int lim0, lim1;               /* the last position rows gid and gid + 8 may see (-1: a padding row) */
    float sl2;                    /* the score scale times log2(e) */
} flash_rows_t;

/* Before the loop: the warp's rows' smallest and largest position (pos: the block's per-vector
 * positions, -1 for none; the warp's 16 start at wv), Q as A fragments of the warp's m16 tile (Qs:
 * [64][KS] 16-bit elements), O zero. */
template <int DK, int DV, int KS>
static __device__ __forceinline__ void dev_flash_begin(const int *pos, const uint16_t *Qs, int wv, int lane, int &wmin,
                                                       int &wmax, uint32_t (&qf)[DK / 16][4], float (&o)[DV / 8][4])
{
    wmin = INT_MAX;
    wmax = -1;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        wmin = min(wmin, pos[wv + i]);
        wmax = max(wmax, pos[wv + i]);
    }
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++)
        dev_ldsm_x4(Qs + (wv + (lane & 15)) * KS + kk * 16 + (lane >> 4) * 8, qf[kk]);
#pragma unroll
    for (int j = 0; j < DV / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
}

/* The K and V tiles of one stage as the mma reads them. */
typedef struct flash_kv {
    const uint16_t *k, *v;
} flash_kv_t;

/* The pass's key tiles, the tile at key index 0 already loading into stage 0 (load(0, 0), so that
 * it lands while the caller converts Q). load(kt, buf): issue the cp.async copies of the tile at key
 * index kt into stage buf and commit them as one group. stage(buf): called by the whole block once
 * stage buf has landed, returns the K and V tiles the mma reads ([64][KS], [64][VS] elements; a
 * caller that converts the stage first synchronises the block itself). m0, m1, l0, l1: the running
 * maxima of rows gid and gid + 8 (log2 domain, -inf: no key yet) and this thread's share of their
 * sums; on return l0 and l1 are the whole sums (over the quad) and every copy has landed. */
template <int DK, int DV, int KS, int VS, bool F16, class Load, class Stage>
static __device__ __forceinline__ void dev_flash_tiles(const flash_rows_t &r, const uint32_t (&qf)[DK / 16][4],
                                                       float (&o)[DV / 8][4], float &m0, float &m1, float &l0,
                                                       float &l1, int lane, Load &&load, Stage &&stage)
{
    static_assert(DK % 16 == 0 && DV % 16 == 0, "k16 steps of Q K^T, pairs of n8 blocks of P V");
    constexpr int KD = DK / 16;                    /* k16 steps of Q K^T */
    constexpr int NB = FLASH_KEYS / 8;             /* n8 blocks of S (keys) */
    constexpr int KP = FLASH_KEYS / 16;            /* k16 steps of P V */
    constexpr int DB = DV / 8;                     /* n8 blocks of O */
    const int tig = lane & 3;
    const float sl2 = r.sl2;
    for (int kt = 0, buf = 0; kt < r.n_keys; kt += FLASH_KEYS, buf ^= 1) {
        if (kt + FLASH_KEYS < r.n_keys)
            load(kt + FLASH_KEYS, buf ^ 1);
        else
            dev_cp_commit();                       /* an empty group keeps the wait count uniform */
        dev_cp_wait<1>();
        __syncthreads();                           /* tile kt visible to every warp */
        const flash_kv_t kv = stage(buf);
        const uint16_t *Kt = kv.k, *Vt = kv.v;
        if (r.ka + kt <= r.wmax) {                 /* warp-uniform: some row of this warp sees a key here */
            float s[NB][4];
#pragma unroll
            for (int j = 0; j < NB; j++)
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            /* S: matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15,
             * d 8-15) of each 16 keys = b0, b1 of n-block 2jp, then of 2jp + 1. */
#pragma unroll
            for (int kk = 0; kk < KD; kk++) {
#pragma unroll
                for (int jp = 0; jp < NB / 2; jp++) {
                    uint32_t b[4];
                    dev_ldsm_x4(Kt + (jp * 16 + (lane & 7) + (lane >> 4) * 8) * KS + kk * 16 + ((lane >> 3) & 1) * 8, b);
                    dev_mma16<F16>(s[2 * jp], qf[kk], b[0], b[1]);
                    dev_mma16<F16>(s[2 * jp + 1], qf[kk], b[2], b[3]);
                }
            }
            /* Keys past a row's limit (its position, or where the keys end: the zero-filled keys past
             * n_keys too, every key of a padding row) masked on tiles that reach past some row's. */
            if (r.ka + kt + FLASH_KEYS - 1 > r.wlim) {
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    const int key = r.ka + kt + 8 * j + 2 * tig;
                    if (key > r.lim0) s[j][0] = -INFINITY;
                    if (key + 1 > r.lim0) s[j][1] = -INFINITY;
                    if (key > r.lim1) s[j][2] = -INFINITY;
                    if (key + 1 > r.lim1) s[j][3] = -INFINITY;
                }
            }
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < NB; j++) {
                mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);
            /* A row with no key yet (-inf) subtracts 0: exp2(-inf) = 0, never -inf - -inf. */
            const float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;
            const float c0 = exp2f(m0 - mu0), c1 = exp2f(m1 - mu1);
            m0 = mn0;
            m1 = mn1;
            /* P as A fragments (p rounded to the mma's type; l sums the rounded p): n-blocks 2kk,
             * 2kk + 1 of S are k16 step kk of P V. */
            uint32_t pa[KP][4];
            float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
            for (int j = 0; j < NB; j++) {
                const uint32_t h0 = dev_pack2<F16>(exp2f(fmaf(s[j][0], sl2, -mu0)), exp2f(fmaf(s[j][1], sl2, -mu0)));
                const uint32_t h1 = dev_pack2<F16>(exp2f(fmaf(s[j][2], sl2, -mu1)), exp2f(fmaf(s[j][3], sl2, -mu1)));
                ps0 += dev_lo2<F16>(h0) + dev_hi2<F16>(h0);
                ps1 += dev_lo2<F16>(h1) + dev_hi2<F16>(h1);
                pa[j / 2][(j & 1) * 2] = h0;
                pa[j / 2][(j & 1) * 2 + 1] = h1;
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
            /* O += P V: .trans matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
             * (keys 8-15, d 8-15) of each 16 dimensions = b0, b1 of n-block 2dp, then of 2dp + 1. */
#pragma unroll
            for (int kk = 0; kk < KP; kk++) {
#pragma unroll
                for (int dp = 0; dp < DB / 2; dp++) {
                    uint32_t b[4];
                    dev_ldsm_x4_trans(Vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * VS + dp * 16 + (lane >> 4) * 8, b);
                    dev_mma16<F16>(o[2 * dp], pa[kk], b[0], b[1]);
                    dev_mma16<F16>(o[2 * dp + 1], pa[kk], b[2], b[3]);
                }
            }
        }
        __syncthreads();                           /* every warp is done with buf before it is refilled */
    }
    dev_cp_wait<0>();
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
}

#endif
