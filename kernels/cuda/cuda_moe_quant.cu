/* kernels/cuda/cuda_moe_quant.cu — moe_ffn's quantized experts on the FMA device path: fp8 e4m3,
 * int8, int4 (value + 8) or fp4 e2m1 codes (one byte or one nibble per weight, as loaded: no
 * dequantized copy) with f32 block scales of any grid the loader makes (per tensor, per channel,
 * DeepSeek-V3's 128 x 128 blocks, int4's groups of 128 columns, nvfp4's of 16 with the tensor scale
 * folded in), and the per-token activation fake-quantization (bk_mat_t.qact) both MoE paths apply.
 *
 * cuda_moe.cu chooses the path, sorts the entries by expert and sums each token's k outputs; the
 * expert matmuls are cuda_moe_fma.cuh's kernel, the one plain weights run, over moe_row_q rows: a
 * warp owns one row of gate and of up (or two rows of down), streams its codes once per group of
 * up to MT entries with 16-byte loads (16 codes, or 32 nibbles), decodes them in registers
 * (cuda_moe_quant.cuh), multiplies each decoded code by its column group's f32 scale (loaded once
 * per 16 values) and accumulates code * scale * x in f32.
 *
 * Numerics against the CPU reference (cpu_moe.c running cpu_quant.c's matmul per expert): the same
 * dequantized f32 weight (decode(code) * scale, one rounding), f32 products and sums in another
 * order (~1e-6 relative, the plain FMA path's grade). With qact the activations are fake-quantized
 * per row first, with cpu_quant_act_row's arithmetic: x once per token (mq_qrow into scratch, in
 * the sort's launch: cuda_moe.cu's k_moe_sort_qact; bit-identical to the CPU's), and each entry's SwiGLU output before down (in place; an input
 * that differs from the CPU's in its last bit can round to the neighbouring fp8 code, so those
 * cases are compared with a looser bound). Batch-invariant and the same bits run to run, like the
 * plain FMA path.
 *
 * Shapes: the 16-byte kernel needs K a multiple of a chunk's values (16; 32 for nibbles) and
 * 16-byte aligned code rows and inputs (a 16-value piece is then in one column group: gc is a
 * multiple of 16 or covers the row); any other shape runs the element-per-lane kernel. */
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_moe_fma.cuh"
#include "kernels/cuda/cuda_moe_quant.cuh"

bool cuda_moe_quant_takes(int fmt) { return fmt == BK_Q_FP8 || fmt == BK_Q_I8 || fmt == BK_Q_I4 || fmt == BK_Q_FP4; }

/* ---- the expert matmuls ---------------------------------------------------------------------------- */

/* A row of quantized codes as cuda_moe_fma.cuh's kernel reads it: the codes and the row's scale row
 * (the block row's: s[g] is column group g's scale, gc columns each, a multiple of 16 or the whole
 * row, so a 16-value piece has one scale). A piece's values: decode(code) times its group's scale,
 * rounded once (the CPU's dequantized weight: fp4 decodes to value x 2^-14 and takes scale x 2^14,
 * the same product). */
template <int FMT> struct moe_row_q {
    static constexpr int VE = mq_chunk_values(FMT), PV = 16;
    const uint8_t *w;                   /* [K] codes, or [K / 2] bytes of nibbles */
    const float *s;                     /* [ceil(K / gc)] */
    uint32_t gc;
    static __device__ __forceinline__ moe_row_q of(const void *m, const float *s, int64_t n, int64_t K, int gr, int gc)
    {
        const int64_t ngc = (K + gc - 1) / gc;
        return {(const uint8_t *)m + (mq_nib(FMT) ? n * K / 2 : n * K), s + (n / gr) * ngc, (uint32_t)gc};
    }
    __device__ __forceinline__ uint4 chunk(int64_t c) const { return __ldg((const uint4 *)w + c); }
    __device__ __forceinline__ void piece(const uint4 &q, int64_t c, int p, float *f) const
    {
        float sc = __ldg(s + (uint32_t)(c * VE + p * PV) / gc);
        if constexpr (FMT == BK_Q_FP4)
            sc *= mq_dec_scale<FMT>();
        mq_dec16<FMT>(q, p, f);
#pragma unroll
        for (int i = 0; i < PV; i++)
            f[i] = __fmul_rn(f[i], sc);
    }
    __device__ __forceinline__ float at(int64_t i) const { return __fmul_rn(mq_dec1<FMT>(w, i), s[(uint32_t)i / gc]); }
};

template <int FMT>
static void s_experts(const cuda_state_t *st, moe_qgrid_t g, bool gu, int M, bool vec, unsigned grid_y,
                      const moe_dev_expert_t *tab, const int32_t *off, const int32_t *active, const int32_t *n_active,
                      const int32_t *tok, const int32_t *slot, const float *in, int64_t N, int64_t K, float *out)
{
    const int gr = g.gr > 0 ? g.gr : (int)N, gc = g.gc > 0 ? g.gc : (int)K;
    vec = vec && K % mq_chunk_values(FMT) == 0 && (gc % 16 == 0 || gc >= K);
    if (gu)
        moe_fma_experts<moe_row_q<FMT>, true>(st, M, vec, grid_y, tab, off, active, n_active, tok, slot, in, N, K, gr,
                                              gc, out);
    else
        moe_fma_experts<moe_row_q<FMT>, false>(st, M, vec, grid_y, tab, off, active, n_active, tok, slot, in, N, K, gr,
                                               gc, out);
}

void cuda_moe_qexperts(const cuda_state_t *st, moe_qgrid_t g, bool gu, int M, bool vec, unsigned grid_y,
                       const moe_dev_expert_t *tab, const int32_t *off, const int32_t *active,
                       const int32_t *n_active, const int32_t *tok, const int32_t *slot, const float *in, int64_t N,
                       int64_t K, float *out)
{
    const auto run = g.fmt == BK_Q_FP8 ? s_experts<BK_Q_FP8> : g.fmt == BK_Q_I8 ? s_experts<BK_Q_I8>
                   : g.fmt == BK_Q_I4  ? s_experts<BK_Q_I4>  : s_experts<BK_Q_FP4>;
    run(st, g, gu, M, vec, grid_y, tab, off, active, n_active, tok, slot, in, N, K, out);
}

/* ---- activation fake-quantization ---------------------------------------------------------------- */

/* mq_qrow (cuda_moe_quant.cuh) of row blockIdx.x. */
template <bool CODES>
__global__ void k_moe_qrow(const float *x, int64_t K, int act, float *out, uint16_t *codes, float *scale)
{
    DEV_PDL_ENTER();
    mq_qrow<CODES>(x, K, act, blockIdx.x, out, codes, scale);
}

void cuda_moe_qact(const cuda_state_t *st, const float *x, int rows, int64_t K, int act, float *out)
{
    if (rows > 0 && act != BK_QA_NONE)
        cuda_launch(st, k_moe_qrow<false>, rows, K >= 1024 ? 256 : 128, x, K, act, out, (uint16_t *)NULL,
                    (float *)NULL);
}

void cuda_moe_qcodes(const cuda_state_t *st, const float *x, int rows, int64_t K, int act, uint16_t *codes,
                     float *scale)
{
    if (rows > 0)
        cuda_launch(st, k_moe_qrow<true>, rows, K >= 1024 ? 256 : 128, x, K, act, (float *)NULL, codes, scale);
}
