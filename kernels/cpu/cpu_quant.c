/* kernels/cpu/cpu_quant.c — y = x W^T for a quantized W (kernels/backend.h's bk_mat_t qfmt): the
 * reference for every format.
 *
 * Threads split W into units of QB rows; a unit is dequantized into the thread's f32 scratch
 * (QB x K, kept in cache) and multiplied by the plain f32 kernel (cpu_matmul). So the result is
 * bit-identical to cpu_matmul over the dequantized f32 weight — for any M, any thread count — and
 * the packed weight is read once per call. With qact, x is first fake-quantized per row
 * (cpu_quant_act_row) into scratch, once.
 *
 * Scratch lives in cpu_state_t and grows to the largest call (the first steps of a model); a
 * later call of the same shape allocates nothing. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_quant.h"

#define QB 16         /* W rows per unit */

/* Code -> f32 tables (exactly cpu_quant_code's values), made before main. */
static float s_fp8[256], s_i8[256], s_i4[16], s_fp4[16];
__attribute__((constructor)) static void s_tables(void)
{
    for (int b = 0; b < 256; b++) {
        s_fp8[b] = f8e4m3_to_f32((uint8_t)b);
        s_i8[b] = (float)(int8_t)b;
    }
    for (int n = 0; n < 16; n++) {
        s_i4[n] = (float)(n - 8);
        s_fp4[n] = cpu_fp4_value((unsigned)n);
    }
}

/* Row r of w dequantized into out [cols]: cpu_quant_row's values, by table and scale group. */
static void s_row(const bk_mat_t *w, int64_t r, float *out)
{
    const int64_t K = w->cols, gc = w->qgc, ngc = (K + gc - 1) / gc;
    const float *srow = w->qscale + (r / w->qgr) * ngc;
    const uint8_t *codes = (const uint8_t *)w->data;
    const int nib = w->qfmt == BK_Q_I4 || w->qfmt == BK_Q_FP4;
    const float *tab = w->qfmt == BK_Q_FP8 ? s_fp8 : w->qfmt == BK_Q_I8 ? s_i8 : w->qfmt == BK_Q_I4 ? s_i4 : s_fp4;
    const uint8_t *row = codes + (nib ? (size_t)r * (size_t)K / 2 : (size_t)r * (size_t)K);
    for (int64_t g = 0; g < ngc; g++) {
        const float sc = srow[g];
        const int64_t c0 = g * gc, c1 = c0 + gc < K ? c0 + gc : K;
        if (!nib) {
            for (int64_t c = c0; c < c1; c++)
                out[c] = tab[row[c]] * sc;
        } else {                                   /* c0 is even: groups are a multiple of 16 or the row */
            for (int64_t c = c0; c + 1 < c1; c += 2) {
                const uint8_t b = row[c / 2];
                out[c] = tab[b & 15] * sc;
                out[c + 1] = tab[b >> 4] * sc;
            }
            if ((c1 - c0) & 1)
                out[c1 - 1] = tab[row[(c1 - 1) / 2] & 15] * sc;
        }
    }
}

static float *s_scratch(cpu_state_t *st, size_t floats)
{
    if (floats > st->quant_scratch_n) {
        float *p = NULL;
        if (posix_memalign((void **)&p, 64, floats * sizeof(float)) != 0)
            return NULL;
        free(st->quant_scratch);
        st->quant_scratch = p;
        st->quant_scratch_n = floats;
    }
    return st->quant_scratch;
}

void cpu_qmatmul(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y)
{
    cpu_state_t *st = be->impl;
    const int64_t N = w->rows, K = w->cols;
    const int nt = be->n_threads > 0 ? be->n_threads : 1;
    const size_t per_thread = (size_t)QB * (size_t)K + (size_t)M * QB;
    const size_t xq_n = w->qact ? (size_t)M * (size_t)K : 0;
    float *scr = s_scratch(st, xq_n + (size_t)nt * per_thread);
    if (!scr) {                                    /* no memory: poison, never a silent wrong answer */
        for (size_t i = 0; i < (size_t)M * (size_t)N; i++)
            y[i] = NAN;
        return;
    }
    const float *xx = x;
    if (w->qact) {
        for (int m = 0; m < M; m++)
            cpu_quant_act_row(w->qact, x + (size_t)m * K, K, scr + (size_t)m * K);
        xx = scr;
    }
    float *thr = scr + xq_n;
    const int64_t n_units = (N + QB - 1) / QB;
    /* A single-thread backend for the inner plain matmul: this loop is the parallel one. */
    backend_t one = *be;
    one.n_threads = 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (n_units > 1 && (int64_t)M * N * K > 32768)
    for (int64_t u = 0; u < n_units; u++) {
        float *wf = thr + (size_t)omp_get_thread_num() * per_thread, *yt = wf + (size_t)QB * (size_t)K;
        const int64_t n0 = u * QB, nr = N - n0 < QB ? N - n0 : QB;
        for (int64_t r = 0; r < nr; r++)
            s_row(w, n0 + r, wf + (size_t)r * K);
        const bk_mat_t part = {.data = wf, .dtype = DT_F32, .rows = nr, .cols = K};
        cpu_matmul(&one, xx, M, &part, bias ? bias + n0 : NULL, yt);
        for (int m = 0; m < M; m++)
            memcpy(y + (size_t)m * N + n0, yt + (size_t)m * nr, (size_t)nr * sizeof(float));
    }
}
