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
            cpu_quant_row(w, n0 + r, 0, K, wf + (size_t)r * K);
        const bk_mat_t part = {.data = wf, .dtype = DT_F32, .rows = nr, .cols = K};
        cpu_matmul(&one, xx, M, &part, bias ? bias + n0 : NULL, yt);
        for (int m = 0; m < M; m++)
            memcpy(y + (size_t)m * N + n0, yt + (size_t)m * nr, (size_t)nr * sizeof(float));
    }
}
