/* engine/spec.c — the proposer vtable's calls, method names, the acceptance rule on explicit
 * distributions, and the stats' ratios. Semantics: engine/spec.h. */
#include "engine/spec.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/cpu_sample.h"
#include "kernels/sample_rng.h"

const char *spec_method_name(spec_method_t m)
{
    static const char *const names[] = {"off", "ngram", "draft", "mtp"};
    return (unsigned)m < 4 ? names[m] : "?";
}

int spec_method_parse(const char *name, spec_method_t *out)
{
    for (int m = SPEC_OFF; m <= SPEC_MTP; m++)
        if (name && strcmp(name, spec_method_name((spec_method_t)m)) == 0) {
            *out = (spec_method_t)m;
            return 0;
        }
    return -1;
}

int spec_knob_parse(const char *what, const char *value, spec_method_t *method, int *k, char *err, size_t errlen)
{
    *method = SPEC_OFF;
    *k = 0;
    if (!value || !*value || strcmp(value, "off") == 0)
        return 0;
    const char *colon = strchr(value, ':');
    char name[16];
    const size_t len = colon ? (size_t)(colon - value) : strlen(value);
    spec_method_t m = SPEC_OFF;
    long kk = SPEC_DEFAULT_K;
    char *end = NULL;
    if (len < sizeof name) {
        memcpy(name, value, len);
        name[len] = 0;
        if (spec_method_parse(name, &m) != 0)
            m = SPEC_OFF;
    }
    if (colon)
        kk = strtol(colon + 1, &end, 10);
    if (m == SPEC_OFF || kk < 1 || kk > SPEC_MAX_K || (end && (*end || end == colon + 1)))
        return errf(err, errlen, "%s '%s': expected off, ngram, ngram:K, draft, draft:K, mtp or mtp:K with K in [1, %d]", what,
                    value, SPEC_MAX_K);
    *method = m;
    *k = (int)kk;
    return 0;
}

int spec_propose(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts, float *probs)
{
    if (k > SPEC_MAX_K)
        k = SPEC_MAX_K;
    if (k <= 0 || n <= 0)
        return 0;
    return p->ops->propose(p, id, tokens, n, k, drafts, probs);
}

int spec_propose_batch(spec_proposer_t *p, spec_ask_t *asks, int n)
{
    for (int i = 0; i < n; i++) {
        asks[i].n_drafts = 0;
        if (asks[i].k > SPEC_MAX_K)
            asks[i].k = SPEC_MAX_K;
    }
    if (p->ops->propose_batch)
        return p->ops->propose_batch(p, asks, n);
    for (int i = 0; i < n; i++) {
        spec_ask_t *a = &asks[i];
        a->n_drafts = spec_propose(p, a->id, a->tokens, a->n, a->k, a->drafts, a->probs);
    }
    return 0;
}

const float *spec_dist(spec_proposer_t *p, uint64_t id, int i)
{
    return p->ops->dist ? p->ops->dist(p, id, i) : NULL;
}

void spec_accepted(spec_proposer_t *p, uint64_t id, int n_verified, int n_accepted)
{
    if (p->ops->accepted)
        p->ops->accepted(p, id, n_verified, n_accepted);
}

void spec_forget(spec_proposer_t *p, uint64_t id)
{
    if (p->ops->forget)
        p->ops->forget(p, id);
}

void spec_proposer_destroy(spec_proposer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    (*self_p)->ops->destroy(*self_p);
    *self_p = NULL;
}

/* Walks ascending ids to u of the total mass of w[i] (clamped at 0); the last positive entry when
 * rounding never crosses; -1 when there is no mass at all. */
static int32_t s_walk(const double *w, const double *minus, int V, double u)
{
    double total = 0;
    for (int i = 0; i < V; i++) {
        double m = w[i] - (minus ? minus[i] : 0);
        total += m > 0 ? m : 0;
    }
    if (!(total > 0))
        return -1;
    double target = u * total, acc = 0;
    int32_t last = -1;
    for (int i = 0; i < V; i++) {
        double m = w[i] - (minus ? minus[i] : 0);
        if (!(m > 0))
            continue;
        last = i;
        acc += m;
        if (acc > target)
            return i;
    }
    return last;
}

int32_t spec_accept_dist(const double *p, const double *q, int V, int32_t x, double u_accept, double u_resample,
                         int *accepted)
{
    assert(x >= 0 && x < V && q[x] > 0);
    if (u_accept * q[x] < p[x]) {                  /* u < p/q without dividing */
        *accepted = 1;
        return x;
    }
    *accepted = 0;
    int32_t t = s_walk(p, q, V, u_resample);
    return t >= 0 ? t : s_walk(p, NULL, V, u_resample);
}

double spec_rng_uniform(uint64_t seed, uint64_t stream, uint64_t step)
{
    return sample_rng_uniform(sample_rng_mix(seed ^ stream), step);
}

int32_t spec_draw(const float *logits, int V, const bk_sample_t *sp_in, int j, float *q, float *work, float *mass,
                  int32_t *idx, float *prob)
{
    bk_sample_t sp = *sp_in;
    sp.step += (uint64_t)j;
    const double total = cpu_sample_mass(logits, V, &sp, work, mass, idx);
    const double u = spec_rng_uniform(sp.seed, SPEC_RNG_DRAFT, sp.step) * total;
    double acc = 0;
    int32_t x = -1, last = idx[0];
    for (int t = 0; t < V; t++) {
        q[t] = (float)(work[t] / total);
        if (work[t] > 0)
            last = t;
        acc += work[t];
        if (x < 0 && acc > u)
            x = t;
    }
    if (x < 0)   /* rounding left u past the last kept mass */
        x = last;
    if (prob)
        *prob = q[x];
    return x;
}

int32_t spec_accept_mass(const float *p_mass, double p_total, const float *q, int V, int32_t x, double u_accept,
                         double u_resample, int *accepted)
{
    assert(x >= 0 && x < V && p_total > 0);
    if (u_accept * (double)q[x] * p_total < (double)p_mass[x]) {   /* u < p/q without dividing */
        *accepted = 1;
        return x;
    }
    *accepted = 0;
    /* The residual max(0, p - q), walked in ascending id to u_resample of its mass; empty (p == q
     * up to rounding, where rejection cannot happen) falls back to p's own walk. */
    double total = 0;
    for (int i = 0; i < V; i++) {
        const double m = (double)p_mass[i] / p_total - (double)q[i];
        total += m > 0 ? m : 0;
    }
    const int residual = total > 0;
    if (!residual)
        total = 1;
    const double target = u_resample * total;
    double acc = 0;
    int32_t last = -1;
    for (int i = 0; i < V; i++) {
        const double m = (double)p_mass[i] / p_total - (residual ? (double)q[i] : 0);
        if (!(m > 0))
            continue;
        last = i;
        acc += m;
        if (acc > target)
            return i;
    }
    return last >= 0 ? last : x;
}

double spec_stats_acceptance(const spec_stats_t *st)
{
    return st->drafts ? (double)st->accepted / (double)st->drafts : 0;
}

double spec_stats_mean_len(const spec_stats_t *st)
{
    return st->verify_steps ? (double)st->emitted / (double)st->verify_steps : 0;
}
