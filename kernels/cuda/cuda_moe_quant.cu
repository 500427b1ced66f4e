/* kernels/cuda/cuda_moe_quant.cu — moe_ffn's quantized experts on the FMA device path: fp8 e4m3 or
 * int8 codes (one byte per weight, as loaded: no dequantized copy) with f32 block scales of any
 * grid the loader makes (per tensor, per channel, DeepSeek-V3's 128 x 128 blocks), and the
 * per-token activation fake-quantization (bk_mat_t.qact) both MoE paths apply.
 *
 * cuda_moe.cu chooses the path, sorts the entries by expert and sums each token's k outputs; the
 * kernels here are k_moe_experts' (cuda_moe.cu) twins with the weight loads replaced: a warp owns
 * one row of gate and of up (or two rows of down), streams its codes once per group of up to MT
 * entries with 16-byte loads (16 codes), decodes them in registers (cuda_moe_quant.cuh: fp8 by the
 * hardware's exact e4m3x2 -> f16x2 convert; int8: the byte as a signed integer),
 * multiplies each decoded code by its block's f32 scale (the scale of the chunk's column group,
 * loaded once per 16 codes) and accumulates code * scale * x in f32.
 *
 * Numerics against the CPU reference (cpu_moe.c running cpu_quant.c's matmul per expert): the same
 * dequantized f32 weight (decode(code) * scale, one rounding), f32 products and sums in another
 * order (~1e-6 relative, the plain FMA path's grade). With qact the activations are fake-quantized
 * per row first, with cpu_quant_act_row's arithmetic: x once per token (k_moe_qact into scratch;
 * bit-identical to the CPU's), and each entry's SwiGLU output before down (in place; an input
 * that differs from the CPU's in its last bit can round to the neighbouring fp8 code, so those
 * cases are compared with a looser bound). Batch-invariant and the same bits run to run, like the
 * plain FMA path.
 *
 * Shapes: the 16-byte kernel needs K % 16 == 0 and 16-byte aligned code rows and inputs (the
 * column group of a chunk is then one scale: gc is a multiple of 16 or covers the row); any other
 * shape runs the element-per-lane kernel. Known limits: int4 and nvfp4 experts are not taken
 * (backend_ops_t.quant_moe_formats; the model refuses them at load, naming the format). */
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_moe_quant.cuh"

#define MQ_THREADS 256                   /* k_moe_experts' block: 8 warps */
#define MQ_WARPS (MQ_THREADS / 32)

bool cuda_moe_quant_takes(int fmt) { return fmt == BK_Q_FP8 || fmt == BK_Q_I8; }

/* ---- the expert matmuls ---------------------------------------------------------------------------- */

/* a0[m] = w0 . xr[m], a1[m] = w1 . xr[m] over K, the weights dequantized (code * the scale of its
 * column group: s0 / s1 are the rows' scale rows), summed over the warp (every lane gets the
 * totals). VEC: 16-code chunks c = lane, lane + 32, ..., U of each row in flight; else one element
 * per lane per step. The summation order depends on K and VEC only. */
template <int FMT, bool VEC, int MR>
__device__ __forceinline__ void mq_dot2(const uint8_t *w0, const uint8_t *w1, const float *s0, const float *s1,
                                        uint32_t gc, int64_t K, const float *const *xr, float *a0, float *a1)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < MR; m++) {
        a0[m] = 0.0f;
        a1[m] = 0.0f;
    }
    if constexpr (VEC) {
        constexpr int U = MR <= 4 ? 4 : 2;
        const int64_t chunks = K / 16;
        const uint4 *v0 = (const uint4 *)w0, *v1 = (const uint4 *)w1;
        for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
            uint4 r0[U], r1[U];
#pragma unroll
            for (int u = 0; u < U; u++) {          /* all of the pass's code loads first */
                const int64_t c = c0 + 32 * u;
                if (c < chunks) {
                    r0[u] = __ldg(v0 + c);
                    r1[u] = __ldg(v1 + c);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t c = c0 + 32 * u;
                if (c >= chunks)
                    break;
                const uint32_t g = (uint32_t)(c * 16) / gc;   /* the chunk's column group: one scale */
                const float sc0 = __ldg(s0 + g), sc1 = __ldg(s1 + g);
                float f0[16], f1[16];
                mq_dec16<FMT>(r0[u], f0);
                mq_dec16<FMT>(r1[u], f1);
#pragma unroll
                for (int i = 0; i < 16; i++) {     /* the CPU's dequantized value: one rounding */
                    f0[i] = __fmul_rn(f0[i], sc0);
                    f1[i] = __fmul_rn(f1[i], sc1);
                }
#pragma unroll
                for (int m = 0; m < MR; m++) {
                    const float4 *xp = (const float4 *)(xr[m] + c * 16);
#pragma unroll
                    for (int q = 0; q < 4; q++) {
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
    } else {
        for (int64_t i = lane; i < K; i += 32) {
            const uint32_t g = (uint32_t)i / gc;
            const float f0 = __fmul_rn(mq_dec1<FMT>(w0[i]), s0[g]), f1 = __fmul_rn(mq_dec1<FMT>(w1[i]), s1[g]);
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

/* One matrix row's codes and scale row. */
typedef struct mq_row {
    const uint8_t *w;
    const float *s;
} mq_row_t;

/* MR consecutive sorted entries p .. p + MR - 1 of one expert through the warp's two rows, as
 * cuda_moe.cu's dev_expert_group: GU: r0, r1 = gate and up row n, inputs in[tok[p]], out = act
 * [entries][N] (silu(g) * u); down: r0, r1 = down rows n and n + 1, inputs in[p], out = y [M*k][N]
 * at row slot[p]. */
template <int FMT, bool VEC, bool GU, int MR>
__device__ __forceinline__ void mq_group(mq_row_t r0, mq_row_t r1, uint32_t gc, int64_t N, int64_t K, int64_t n,
                                         const float *in, const int32_t *tok, const int32_t *slot, int p, float *out)
{
    const float *xr[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        xr[m] = in + (int64_t)(GU ? tok[p + m] : p + m) * K;
    float a0[MR], a1[MR];
    mq_dot2<FMT, VEC, MR>(r0.w, r1.w, r0.s, r1.s, gc, K, xr, a0, a1);
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < MR; m++) {
        if (lane != m)
            continue;
        if constexpr (GU) {
            out[(int64_t)(p + m) * N + n] = dev_swiglu(a0[m], a1[m]);   /* cuda_swiglu's arithmetic */
        } else {
            float *o = out + (int64_t)slot[p + m] * N + n;
            o[0] = a0[m];
            if (n + 1 < N)
                o[1] = a1[m];
        }
    }
}

template <int FMT, bool VEC, bool GU, int MR>
__device__ __forceinline__ void mq_groups(int mr, mq_row_t r0, mq_row_t r1, uint32_t gc, int64_t N, int64_t K,
                                          int64_t n, const float *in, const int32_t *tok, const int32_t *slot, int p,
                                          float *out)
{
    if constexpr (MR > 1) {
        if (mr < MR) {
            mq_groups<FMT, VEC, GU, MR - 1>(mr, r0, r1, gc, N, K, n, in, tok, slot, p, out);
            return;
        }
    }
    mq_group<FMT, VEC, GU, MR>(r0, r1, gc, N, K, n, in, tok, slot, p, out);
}

/* k_moe_experts over quantized rows: grid (row tiles, min(E, entries)), block y works active[y]'s
 * entries or leaves; GU: warp w owns row n = x * 8 + w of gate and up; down: rows n, n + 1 with
 * n = 2 (x * 8 + w). gr, gc: the matrix's scale block; ngc scales per block row. */
template <int FMT, bool VEC, bool GU, int MT>
__global__ void __launch_bounds__(MQ_THREADS, 2)
    k_moe_qexperts(const moe_dev_expert_t *tab, const int32_t *off, const int32_t *active, const int32_t *n_active,
                   const int32_t *tok, const int32_t *slot, const float *in, int64_t N, int64_t K, int gr, int gc,
                   float *out)
{
    DEV_PDL_ENTER();
    if ((int)blockIdx.y >= *n_active)
        return;
    const int e = active[blockIdx.y], p0 = off[e], c = off[e + 1] - p0;
    const int64_t wid = (int64_t)blockIdx.x * MQ_WARPS + (threadIdx.x >> 5), n = GU ? wid : 2 * wid;
    if (n >= N)
        return;
    const int64_t ngc = (K + gc - 1) / gc;
    const moe_dev_expert_t ex = tab[e];
    mq_row_t r0, r1;
    if constexpr (GU) {
        const int64_t so = (n / gr) * ngc;
        r0 = {(const uint8_t *)ex.gate + n * K, ex.gate_s + so};
        r1 = {(const uint8_t *)ex.up + n * K, ex.up_s + so};
    } else {
        const int64_t n1 = n + 1 < N ? n + 1 : n;
        r0 = {(const uint8_t *)ex.down + n * K, ex.down_s + (n / gr) * ngc};
        r1 = {(const uint8_t *)ex.down + n1 * K, ex.down_s + (n1 / gr) * ngc};
    }
    for (int g = 0; g < c; g += MT)
        mq_groups<FMT, VEC, GU, MT>(c - g < MT ? c - g : MT, r0, r1, (uint32_t)gc, N, K, n, in, tok, slot, p0 + g,
                                    out);
}

template <int FMT, bool GU, int MT>
static void s_launch_mt(const cuda_state_t *st, bool vec, dim3 grid, const moe_dev_expert_t *tab, const int32_t *off,
                        const int32_t *active, const int32_t *n_active, const int32_t *tok, const int32_t *slot,
                        const float *in, int64_t N, int64_t K, int gr, int gc, float *out)
{
    if (vec)
        cuda_launch(st, k_moe_qexperts<FMT, true, GU, MT>, grid, MQ_THREADS, tab, off, active, n_active, tok, slot, in,
                    N, K, gr, gc, out);
    else
        cuda_launch(st, k_moe_qexperts<FMT, false, GU, MT>, grid, MQ_THREADS, tab, off, active, n_active, tok, slot,
                    in, N, K, gr, gc, out);
}

/* Entries per pass as the plain path: 1 at batch 1, 4 up to 32 tokens, 8 above. */
template <int FMT, bool GU>
static void s_launch(const cuda_state_t *st, int M, bool vec, dim3 grid, const moe_dev_expert_t *tab,
                     const int32_t *off, const int32_t *active, const int32_t *n_active, const int32_t *tok,
                     const int32_t *slot, const float *in, int64_t N, int64_t K, int gr, int gc, float *out)
{
    if (M == 1)
        s_launch_mt<FMT, GU, 1>(st, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
    else if (M <= 32)
        s_launch_mt<FMT, GU, 4>(st, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
    else
        s_launch_mt<FMT, GU, 8>(st, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
}

void cuda_moe_qexperts(const cuda_state_t *st, moe_qgrid_t g, bool gu, int M, bool vec, unsigned grid_y,
                       const moe_dev_expert_t *tab, const int32_t *off, const int32_t *active,
                       const int32_t *n_active, const int32_t *tok, const int32_t *slot, const float *in, int64_t N,
                       int64_t K, float *out)
{
    const int gr = g.gr > 0 ? g.gr : (int)N, gc = g.gc > 0 ? g.gc : (int)K;
    vec = vec && K % 16 == 0 && (gc % 16 == 0 || gc >= K);
    const dim3 grid(gu ? (unsigned)((N + MQ_WARPS - 1) / MQ_WARPS) : (unsigned)((N + 2 * MQ_WARPS - 1) / (2 * MQ_WARPS)),
                    grid_y);
    if (g.fmt == BK_Q_FP8) {
        if (gu)
            s_launch<BK_Q_FP8, true>(st, M, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
        else
            s_launch<BK_Q_FP8, false>(st, M, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
    } else {
        if (gu)
            s_launch<BK_Q_I8, true>(st, M, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
        else
            s_launch<BK_Q_I8, false>(st, M, vec, grid, tab, off, active, n_active, tok, slot, in, N, K, gr, gc, out);
    }
}

/* ---- activation fake-quantization ---------------------------------------------------------------- */

/* x's value fake-quantized with the row's scale s (amax != 0, finite): cpu_quant_act_row. */
__device__ __forceinline__ float mq_fake(float x, float s, int act)
{
    float q = x / s;
    if (isnan(q))
        return q;
    if (act == BK_QA_FP8_TOKEN) {
        __nv_fp8_e4m3 f;
        f.__x = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);   /* f32_to_f8e4m3's rounding in range */
        q = (float)f;
    } else {
        q = rintf(fminf(fmaxf(q, -127.0f), 127.0f));
    }
    return q * s;
}

/* One block per row: cpu_quant_act_row (a zero row stays, a non-finite amax gives NaN). In place
 * is safe: each thread reads the elements it writes, after the barrier of the amax. */
__global__ void k_moe_qact(const float *x, int64_t K, int act, float *out)
{
    __shared__ float red[32];
    DEV_PDL_ENTER();
    const float *xr = x + (int64_t)blockIdx.x * K;
    float *o = out + (int64_t)blockIdx.x * K;
    float amax = 0.0f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
        amax = fmaxf(amax, fabsf(xr[k]));
    amax = dev_block_max(amax, red);
    const float s = act == BK_QA_FP8_TOKEN ? amax / 448.0f : amax / 127.0f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
        o[k] = amax == 0.0f ? xr[k] : !isfinite(amax) ? __int_as_float(0x7fc00000) : mq_fake(xr[k], s, act);
}

/* One block per row: the row's codes as bf16 (exact: fp8 values and integers up to 127 are bf16
 * values) and its scale, as cpu_quant_act_row would multiply them. */
__global__ void k_moe_qcodes(const float *x, int64_t K, int act, uint16_t *codes, float *scale)
{
    __shared__ float red[32];
    DEV_PDL_ENTER();
    const float *xr = x + (int64_t)blockIdx.x * K;
    uint16_t *o = codes + (int64_t)blockIdx.x * K;
    float amax = 0.0f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
        amax = fmaxf(amax, fabsf(xr[k]));
    amax = dev_block_max(amax, red);
    const float nan = __int_as_float(0x7fc00000);
    const float s = amax == 0.0f ? 1.0f : !isfinite(amax) ? nan : act == BK_QA_FP8_TOKEN ? amax / 448.0f : amax / 127.0f;
    if (threadIdx.x == 0)
        scale[blockIdx.x] = s;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
        float q = xr[k];                           /* an all-zero row: x itself (zeros, NaN) times 1 */
        if (amax != 0.0f) {
            q = !isfinite(amax) ? nan : q / s;
            if (!isnan(q)) {
                if (act == BK_QA_FP8_TOKEN) {
                    __nv_fp8_e4m3 f;
                    f.__x = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
                    q = (float)f;
                } else {
                    q = rintf(fminf(fmaxf(q, -127.0f), 127.0f));
                }
            }
        }
        o[k] = dev_bf16_bits(q);
    }
}

void cuda_moe_qact(const cuda_state_t *st, const float *x, int rows, int64_t K, int act, float *out)
{
    if (rows > 0 && act != BK_QA_NONE)
        cuda_launch(st, k_moe_qact, rows, K >= 1024 ? 256 : 128, x, K, act, out);
}

void cuda_moe_qcodes(const cuda_state_t *st, const float *x, int rows, int64_t K, int act, uint16_t *codes,
                     float *scale)
{
    if (rows > 0)
        cuda_launch(st, k_moe_qcodes, rows, K >= 1024 ? 256 : 128, x, K, act, codes, scale);
}
