/* kernels/cpu/cpu_quant.h — decoding quantized weight codes and fake-quantizing activations, as
 * kernels/backend.h's bk_mat_t (qfmt, qact) defines them: one definition for the CPU kernels,
 * engine/quant.c's reference and troupe-quantize. Plain C, inline. */
#ifndef TROUPE_KERNELS_CPU_QUANT_H
#define TROUPE_KERNELS_CPU_QUANT_H

#include <math.h>

#include "common/dtype.h"
#include "kernels/backend.h"

/* E2M1: sign bit 3, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (no infinities, no NaN). */
static inline float cpu_fp4_value(unsigned nib)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (nib & 8) ? -mag[nib & 7] : mag[nib & 7];
}

/* Code (r, c) of a [rows][cols] weight before its scale. */
static inline float cpu_quant_code(int fmt, const uint8_t *codes, int64_t cols, int64_t r, int64_t c)
{
    switch (fmt) {
    case BK_Q_FP8: return f8e4m3_to_f32(codes[r * cols + c]);
    case BK_Q_I8: return (float)(int8_t)codes[r * cols + c];
    case BK_Q_I4: {
        uint8_t b = codes[(r * cols + c) / 2];
        return (float)((int)((c & 1) ? b >> 4 : b & 15) - 8);
    }
    case BK_Q_FP4: {
        uint8_t b = codes[(r * cols + c) / 2];
        return cpu_fp4_value((c & 1) ? b >> 4 : b & 15);
    }
    default: return NAN;
    }
}

/* Row r, columns [c0, c0 + n) of w dequantized into out [n] f32: code * its block's scale. */
static inline void cpu_quant_row(const bk_mat_t *w, int64_t r, int64_t c0, int64_t n, float *out)
{
    const uint8_t *codes = w->data;
    const int64_t gc_n = (w->cols + w->qgc - 1) / w->qgc;
    const float *srow = w->qscale + (r / w->qgr) * gc_n;
    for (int64_t c = c0; c < c0 + n; c++)
        out[c - c0] = cpu_quant_code(w->qfmt, codes, w->cols, r, c) * srow[c / w->qgc];
}

/* Dynamic per-row activation quantization (bk_mat_t.qact), applied as its dequantized f32 values:
 * s = amax / 448 (fp8, each value x / s rounded to e4m3) or amax / 127 (int8, rounded to nearest
 * even integer in [-127, 127]); out = q * s. A zero row stays zero; NaN stays NaN. */
static inline void cpu_quant_act_row(int act, const float *x, int64_t K, float *out)
{
    float amax = 0.0f;
    for (int64_t k = 0; k < K; k++)
        amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
    if (act == BK_QA_NONE || amax == 0.0f || !isfinite(amax)) {
        for (int64_t k = 0; k < K; k++)
            out[k] = (act == BK_QA_NONE || amax == 0.0f) ? x[k] : NAN;
        return;
    }
    const float s = act == BK_QA_FP8_TOKEN ? amax / 448.0f : amax / 127.0f;
    for (int64_t k = 0; k < K; k++) {
        float q = x[k] / s;
        if (isnan(q)) {
            out[k] = q;
            continue;
        }
        q = act == BK_QA_FP8_TOKEN ? f8e4m3_to_f32(f32_to_f8e4m3(q)) : rintf(fminf(fmaxf(q, -127.0f), 127.0f));
        out[k] = q * s;
    }
}

#endif
