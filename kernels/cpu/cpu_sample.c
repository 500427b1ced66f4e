/* kernels/cpu/cpu_sample.c — the `sample` op's CPU reference (semantics: kernels/backend.h,
 * engine/sampler.h's steps 3-7), which the host sampler (engine/sampler.c) runs too: a token
 * sampled on the host and one sampled by the CPU backend are one computation.
 *
 * Nothing is sorted: top-k is a quickselect, top-p a quickselect on probability mass (both
 * expected O(vocab), in place), min-p a filter, and the draw walks the kept tokens in ascending
 * token id (their masses scattered into a zeroed row: O(vocab), no sort). Ranks use one total
 * order — larger logit first, then lower index — so every choice is deterministic, and no step
 * allocates. */
#include "kernels/cpu/cpu_sample.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/sample_rng.h"

/* ---- ranking ----------------------------------------------------------------------------- */

static inline int s_before(const float *v, int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

/* Partitions idx[lo, hi) around a pivot; returns its final place m: idx[lo, m) rank before it. */
static int s_partition(const float *v, int32_t *idx, int lo, int hi)
{
    int mid = lo + (hi - lo) / 2;
    /* median of three as the pivot, moved to hi - 1 */
    int a = lo, b = mid, c = hi - 1, med;
    if (s_before(v, idx[a], idx[b]))
        med = s_before(v, idx[b], idx[c]) ? b : (s_before(v, idx[a], idx[c]) ? c : a);
    else
        med = s_before(v, idx[a], idx[c]) ? a : (s_before(v, idx[b], idx[c]) ? c : b);
    int32_t t = idx[med]; idx[med] = idx[hi - 1]; idx[hi - 1] = t;
    int32_t pv = idx[hi - 1];
    int m = lo;
    for (int i = lo; i < hi - 1; i++)
        if (s_before(v, idx[i], pv)) {
            t = idx[i]; idx[i] = idx[m]; idx[m] = t;
            m++;
        }
    t = idx[m]; idx[m] = idx[hi - 1]; idx[hi - 1] = t;
    return m;
}

/* Moves the k best of idx[0, n) to idx[0, k) (in no particular order). */
static void s_select(const float *v, int32_t *idx, int n, int k)
{
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int m = s_partition(v, idx, lo, hi);
        if (m == k || m + 1 == k)
            return;
        if (m > k)
            hi = m;
        else
            lo = m + 1;
    }
}

/* The smallest c such that the c best of idx[0, n) hold >= target of the mass; moves them to
 * idx[0, c). mass[t] = exp(work[t] - max). */
static int s_select_mass(const float *v, const float *mass, int32_t *idx, int n, double target)
{
    int lo = 0, hi = n;
    double acc = 0;                                /* mass of idx[0, lo), all ranked before the rest */
    while (hi - lo > 1) {
        int m = s_partition(v, idx, lo, hi);
        double before = 0;
        for (int i = lo; i < m; i++)
            before += mass[idx[i]];
        if (acc + before >= target) {
            hi = m;                                /* the boundary lies in [lo, m) */
        } else if (acc + before + mass[idx[m]] >= target) {
            return m + 1;
        } else {
            acc += before + mass[idx[m]];
            lo = m + 1;
        }
    }
    return lo < n ? lo + 1 : n;
}

/* ---- one row ----------------------------------------------------------------------------- */

/* log_softmax(v)[t] over the whole vocabulary, the sum in double. */
float cpu_log_softmax_at(const float *v, int n, int32_t t)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = v[i] > mx ? v[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)v[i] - mx);
    return (float)((double)v[t] - mx - log(sum));
}

static int32_t s_argmax(const float *work, int V)
{
    int32_t tok = 0;                               /* NaN never wins unless every logit is NaN */
    for (int i = 1; i < V; i++)
        if (work[i] > work[tok] || (work[tok] != work[tok] && work[i] == work[i]))
            tok = i;
    return tok;
}

double cpu_sample_mass(const float *logits, int V, const bk_sample_t *sp, float *work, float *mass, int32_t *idx)
{
    if (work != logits)
        memcpy(work, logits, (size_t)V * sizeof(float));
    if (sp->temperature == 0) {
        const int32_t tok = s_argmax(work, V);
        memset(work, 0, (size_t)V * sizeof(float));
        work[tok] = 1;
        idx[0] = tok;
        return 1;
    }
    const float inv_t = (float)(1.0 / sp->temperature);
    for (int i = 0; i < V; i++)
        work[i] *= inv_t;
    int n = V;
    for (int i = 0; i < V; i++)
        idx[i] = i;
    if (sp->top_k > 0 && sp->top_k < n) {
        s_select(work, idx, n, sp->top_k);
        n = sp->top_k;
    }
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = work[idx[i]] > mx ? work[idx[i]] : mx;
    double total = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = idx[i];
        mass[t] = expf(work[t] - mx);
        total += mass[t];
    }
    if (sp->top_p < 1.0 && n > 1)
        n = s_select_mass(work, mass, idx, n, sp->top_p * total);
    if (sp->min_p > 0) {
        /* The best token is still kept (top-k and top-p keep it) and has mass exp(0) = 1. */
        const float floor_mass = (float)sp->min_p;
        int keep = 0;
        for (int i = 0; i < n; i++)
            if (mass[idx[i]] >= floor_mass)
                idx[keep++] = idx[i];
        n = keep;
    }
    /* The kept tokens in ascending id, a zero mass for every other token (adding +0 to the running
     * sum changes no bit), so the sum and the draw's walk are one fixed order that a device can
     * reproduce without knowing how selection left idx. */
    memset(work, 0, (size_t)V * sizeof(float));
    for (int i = 0; i < n; i++)
        work[idx[i]] = mass[idx[i]];
    total = 0;
    for (int i = 0; i < V; i++)
        total += work[i];
    return total;
}

int32_t cpu_sample_row(const float *logits, int V, const bk_sample_t *sp, float *work, float *mass, int32_t *idx,
                       float *lp_processed)
{
    if (work != logits)
        memcpy(work, logits, (size_t)V * sizeof(float));
    int32_t tok;
    if (sp->temperature == 0) {
        tok = s_argmax(work, V);
        if (lp_processed)
            *lp_processed = cpu_log_softmax_at(work, V, tok);
        return tok;
    }
    /* The walk over the kept masses; the fallback when rounding never crosses u (u * total
     * rounding up to total) is the last kept token with a positive mass. */
    const double total = cpu_sample_mass(work, V, sp, work, mass, idx);
    double u = sample_rng_uniform(sp->seed, sp->step) * total, acc = 0;
    tok = -1;
    int32_t last = idx[0];
    for (int i = 0; i < V; i++) {
        if (work[i] > 0)
            last = i;
        acc += work[i];
        if (acc > u) {
            tok = i;
            break;
        }
    }
    if (tok < 0)
        tok = last;
    if (lp_processed)
        *lp_processed = (float)log(work[tok] / total);
    return tok;
}

/* ---- the op ------------------------------------------------------------------------------ */

/* The op: cpu_sample_row on each row, the reference the device kernels are compared with. Scratch grows once to the largest N (an out-of-memory there is
 * fatal: the op has no error path, like a device error). */
void cpu_sample(backend_t *be, const float *logits, int M, int N, const bk_sample_t *params, int32_t *out)
{
    cpu_state_t *st = be->impl;
    const int threads = M < be->n_threads ? M : be->n_threads;
    if (M <= 0)
        return;
    const size_t per = (size_t)N * (2 * sizeof(float) + sizeof(int32_t)), need = per * (size_t)threads;
    if (need > st->sample_scratch_bytes) {
        free(st->sample_scratch);
        st->sample_scratch = malloc(need);
        st->sample_scratch_bytes = st->sample_scratch ? need : 0;
        if (!st->sample_scratch) {
            fprintf(stderr, "cpu sample: out of memory for %d rows of %d\n", threads, N);
            abort();
        }
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int m = 0; m < M; m++) {
        uint8_t *base = (uint8_t *)st->sample_scratch + per * (size_t)omp_get_thread_num();
        float *work = (float *)base, *mass = work + N;
        int32_t *idx = (int32_t *)(mass + N);
        out[m] = cpu_sample_row(logits + (size_t)m * N, N, &params[m], work, mass, idx, NULL);
    }
}
