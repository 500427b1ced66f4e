/* kernels/cuda/cuda_moe_fma.cuh — moe_ffn's FMA device path: the routed experts' matmuls on the
 * CUDA cores, one kernel for every weight format (internal: cuda_moe.cu instantiates it over plain
 * f32 / bf16 / f16 weights, cuda_moe_quant.cu over quantized codes).
 *
 * What differs between the formats is only how a 16-byte chunk of a weight row becomes f32 values,
 * so that is a type parameter, the row (ROW below):
 *   static constexpr int VE        values per 16-byte chunk (f32 4, bf16/f16 8, one-byte codes 16,
 *                                  nibbles 32);
 *   static constexpr int PV        values per decoded piece (VE, or 16 for nibbles: a piece's f32
 *                                  values are what the registers hold at once);
 *   static ROW of(w, s, n, K, gr, gc)  row n of matrix w [N][K] (s its block scales of gr x gc, or
 *                                  NULL for plain weights);
 *   uint4 chunk(c)                 the 16-byte chunk c of the row (a read-only load);
 *   void piece(q, c, p, f)         piece p of chunk c (loaded as q) as f32 [PV]: the weight the CPU
 *                                  multiplies by (a plain value, or decode(code) * scale rounded once);
 *   float at(i)                    element i, the same value (the element-per-lane kernel).
 * A warp owns one row of gate and of up (or two rows of down), streams both once per group of up
 * to MT of the expert's entries with all of a pass's 16-byte loads issued before any is decoded,
 * and accumulates weight * x in f32 (fmaf, in column order per accumulator), lanes summed by a
 * butterfly. The summation order depends on K, VEC and VE only: every format gives the bits its
 * own earlier kernel gave.
 *
 * Launch: grid (row tiles of MOE_FMA_WARPS gate|up rows or 2 MOE_FMA_WARPS down rows, min(E,
 * entries)); block y works active[y]'s entries or leaves at once (at batch 1 the grid's second
 * dimension is k, not E). MT, the entries per pass: 1 at batch 1 (fewest registers, most warps per
 * SM), 4 up to 32 tokens, 8 above; more entries take more passes, the rows then coming from L2. */
#ifndef TROUPE_KERNELS_CUDA_MOE_FMA_CUH
#define TROUPE_KERNELS_CUDA_MOE_FMA_CUH

#include <stdint.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"

#define MOE_FMA_THREADS 256             /* 8 warps */
#define MOE_FMA_WARPS (MOE_FMA_THREADS / 32)

/* A row of plain weights (f32, bf16, f16): the stored values. */
template <typename WT> struct moe_row_plain {
    static constexpr int VE = 16 / (int)sizeof(WT), PV = VE;
    const WT *w;
    static __device__ __forceinline__ moe_row_plain of(const void *m, const float *, int64_t n, int64_t K, int, int)
    {
        return {(const WT *)m + n * K};
    }
    __device__ __forceinline__ uint4 chunk(int64_t c) const { return __ldg((const uint4 *)w + c); }
    __device__ __forceinline__ void piece(const uint4 &q, int64_t, int, float *f) const { dev_unpack16<WT>(q, f); }
    __device__ __forceinline__ float at(int64_t i) const { return dev_to_f32(w[i]); }
};

/* a0[m] = w0 . xr[m], a1[m] = w1 . xr[m] over K, summed over the warp (every lane gets the totals).
 * VEC: the rows and the xr rows 16-byte aligned, K a multiple of ROW::VE: lanes take 16-byte chunks
 * c = lane, lane + 32, ..., U chunks of each row in flight. Otherwise one element per lane per step. */
template <typename ROW, bool VEC, int MR>
__device__ __forceinline__ void moe_fma_dot2(const ROW &w0, const ROW &w1, int64_t K, const float *const *xr,
                                             float *a0, float *a1)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < MR; m++) {
        a0[m] = 0.0f;
        a1[m] = 0.0f;
    }
    if constexpr (VEC) {
        constexpr int VE = ROW::VE, PV = ROW::PV, U = MR <= 4 ? 4 : 2;
        const int64_t chunks = K / VE;
        for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
            uint4 r0[U], r1[U];
#pragma unroll
            for (int u = 0; u < U; u++) {          /* all of the pass's weight loads first */
                const int64_t c = c0 + 32 * u;
                if (c < chunks) {
                    r0[u] = w0.chunk(c);
                    r1[u] = w1.chunk(c);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t c = c0 + 32 * u;
                if (c >= chunks)
                    break;
#pragma unroll
                for (int p = 0; p < VE / PV; p++) {
                    float f0[PV], f1[PV];
                    w0.piece(r0[u], c, p, f0);
                    w1.piece(r1[u], c, p, f1);
#pragma unroll
                    for (int m = 0; m < MR; m++) {
                        const float4 *xp = (const float4 *)(xr[m] + c * VE + p * PV);
#pragma unroll
                        for (int q = 0; q < PV / 4; q++) {
                            const float4 xv = xp[q];
                            a0[m] = fmaf(xv.x, f0[4 * q + 0], a0[m]);
                            a0[m] = fmaf(xv.y, f0[4 * q + 1], a0[m]);
                            a0[m] = fmaf(xv.z, f0[4 * q + 2], a0[m]);
                            a0[m] = fmaf(xv.w, f0[4 * q + 3], a0[m]);
                            a1[m] = fmaf(xv.x, f1[4 * q + 0], a1[m]);
                            a1[m] = fmaf(xv.y, f1[4 * q + 1], a1[m]);
                            a1[m] = fmaf(xv.z, f1[4 * q + 2], a1[m]);
                            a1[m] = fmaf(xv.w, f1[4 * q + 3], a1[m]);
                        }
                    }
                }
            }
        }
    } else {
        for (int64_t i = lane; i < K; i += 32) {
            const float f0 = w0.at(i), f1 = w1.at(i);
#pragma unroll
            for (int m = 0; m < MR; m++) {
                const float xv = xr[m][i];
                a0[m] = fmaf(xv, f0, a0[m]);
                a1[m] = fmaf(xv, f1, a1[m]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
        a0[m] = dev_warp_sum(a0[m]);
        a1[m] = dev_warp_sum(a1[m]);
    }
}

/* MR consecutive sorted entries p .. p + MR - 1 of one expert through the warp's two rows.
 * GU: r0, r1 = gate and up row n; inputs in[tok[p]]; out = act [entries][N]: silu(g) * u.
 * Down: r0, r1 = down rows n and n + 1; inputs in[p]; out = y [M * k][N] at row slot[p]. */
template <typename ROW, bool VEC, bool GU, int MR>
__device__ __forceinline__ void moe_fma_group(const ROW &r0, const ROW &r1, int64_t N, int64_t K, int64_t n,
                                              const float *in, const int32_t *tok, const int32_t *slot, int p,
                                              float *out)
{
    const float *xr[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        xr[m] = in + (int64_t)(GU ? tok[p + m] : p + m) * K;
    float a0[MR], a1[MR];
    moe_fma_dot2<ROW, VEC, MR>(r0, r1, K, xr, a0, a1);
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < MR; m++) {
        if (lane != m)
            continue;
        if constexpr (GU) {
            out[(int64_t)(p + m) * N + n] = dev_swiglu(a0[m], a1[m]);   /* cuda_swiglu's (and the CPU's) arithmetic */
        } else {
            float *o = out + (int64_t)slot[p + m] * N + n;
            o[0] = a0[m];
            if (n + 1 < N)
                o[1] = a1[m];
        }
    }
}

/* mr (1 .. MR) entries through moe_fma_group<mr>: a chain of compile-time sizes. */
template <typename ROW, bool VEC, bool GU, int MR>
__device__ __forceinline__ void moe_fma_groups(int mr, const ROW &r0, const ROW &r1, int64_t N, int64_t K, int64_t n,
                                               const float *in, const int32_t *tok, const int32_t *slot, int p,
                                               float *out)
{
    if constexpr (MR > 1) {
        if (mr < MR) {
            moe_fma_groups<ROW, VEC, GU, MR - 1>(mr, r0, r1, N, K, n, in, tok, slot, p, out);
            return;
        }
    }
    moe_fma_group<ROW, VEC, GU, MR>(r0, r1, N, K, n, in, tok, slot, p, out);
}

/* GU: warp w of block x owns row n = x * 8 + w of gate and up (N = I, K = H). Down: rows n, n + 1
 * with n = 2 (x * 8 + w) (N = H, K = I). gr, gc: the matrix's scale block (quantized rows). No
 * barrier: a warp past N leaves. */
template <typename ROW, bool VEC, bool GU, int MT>
__global__ void __launch_bounds__(MOE_FMA_THREADS, 2)
    k_moe_experts(const moe_dev_expert_t *tab, const int32_t *off, const int32_t *active, const int32_t *n_active,
                  const int32_t *tok, const int32_t *slot, const float *in, int64_t N, int64_t K, int gr, int gc,
                  float *out)
{
    DEV_PDL_ENTER();
    if ((int)blockIdx.y >= *n_active)
        return;
    const int e = active[blockIdx.y], p0 = off[e], c = off[e + 1] - p0;
    const int64_t wid = (int64_t)blockIdx.x * MOE_FMA_WARPS + (threadIdx.x >> 5), n = GU ? wid : 2 * wid;
    if (n >= N)
        return;
    const moe_dev_expert_t ex = tab[e];
    ROW r0, r1;
    if constexpr (GU) {
        r0 = ROW::of(ex.gate, ex.gate_s, n, K, gr, gc);
        r1 = ROW::of(ex.up, ex.up_s, n, K, gr, gc);
    } else {
        r0 = ROW::of(ex.down, ex.down_s, n, K, gr, gc);
        r1 = ROW::of(ex.down, ex.down_s, n + 1 < N ? n + 1 : n, K, gr, gc);
    }
    for (int g = 0; g < c; g += MT)
        moe_fma_groups<ROW, VEC, GU, MT>(c - g < MT ? c - g : MT, r0, r1, N, K, n, in, tok, slot, p0 + g, out);
}

template <typename ROW, bool GU, int MT>
static void moe_fma_launch_mt(const cuda_state_t *st, bool vec, dim3 grid, const moe_dev_expert_t *tab,
                              const int32_t *off, const int32_t *active, const int32_t *n_active, const int32_t *tok,
                              const int32_t *slot, const float *in, int64_t N, int64_t K, int gr, int gc, float *out)
{
    if (vec)
        cuda_launch(st, k_moe_experts<ROW, true, GU, MT>, grid, MOE_FMA_THREADS, tab, off, active, n_active, tok,
                    slot, in, N, K, gr, gc, out);
    else
        cuda_launch(st, k_moe_experts<ROW, false, GU, MT>, grid, MOE_FMA_THREADS, tab, off, active, n_active, tok,
                    slot, in, N, K, gr, gc, out);
}

/* One expert matmul of the FMA device path over a chunk of M tokens (grid_y = min(E, entries)):
 * GU: act[sorted entry][N] = silu(gate x) * up x, x = in[tok[p]]; else y[slot[p]][N] = down in[p].
 * Entries per pass MT = 1 at batch 1 (an expert then has one entry; ~68 registers, 3 blocks per SM
 * for bf16), 4 up to 32 tokens, 8 above (~128 registers, 2 blocks per SM). */
template <typename ROW, bool GU>
static void moe_fma_experts(const cuda_state_t *st, int M, bool vec, unsigned grid_y, const moe_dev_expert_t *tab,
                            const int32_t *off, const int32_t *active, const int32_t *n_active, const int32_t *tok,
                            const int32_t *slot, const float *in, int64_t N, int64_t K, int gr, int gc, float *out)
{
    const int64_t rows_per_block = GU ? MOE_FMA_WARPS : 2 * MOE_FMA_WARPS;
    const dim3 grid((unsigned)((N + rows_per_block - 1) / rows_per_block), grid_y);
    if (M == 1)
        moe_fma_launch_mt<ROW, GU, 1>(st, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
    else if (M <= 32)
        moe_fma_launch_mt<ROW, GU, 4>(st, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
    else
        moe_fma_launch_mt<ROW, GU, 8>(st, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
}

#endif
