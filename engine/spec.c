/* engine/spec.c — the proposer vtable's calls, method names, the acceptance rule on explicit
 * distributions, and the stats' ratios. Semantics: engine/spec.h. */
#include "engine/spec.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

const char *spec_method_name(spec_method_t m)
{
    static const char *const names[] = {"off", "ngram"};
    return (unsigned)m < 2 ? names[m] : "?";
}

int spec_method_parse(const char *name, spec_method_t *out)
{
    for (int m = SPEC_OFF; m <= SPEC_NGRAM; m++)
        if (name && strcmp(name, spec_method_name((spec_method_t)m)) == 0) {
            *out = (spec_method_t)m;
            return 0;
        }
    return -1;
}

int spec_propose(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts, float *probs)
{
    if (k > SPEC_MAX_K)
        k = SPEC_MAX_K;
    if (k <= 0 || n <= 0)
        return 0;
    return p->ops->propose(p, id, tokens, n, k, drafts, probs);
}

void spec_accepted(spec_proposer_t *p, uint64_t id, int n_accepted)
{
    if (p->ops->accepted)
        p->ops->accepted(p, id, n_accepted);
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

double spec_stats_acceptance(const spec_stats_t *st)
{
    return st->drafts ? (double)st->accepted / (double)st->drafts : 0;
}

double spec_stats_mean_len(const spec_stats_t *st)
{
    return st->verify_steps ? (double)st->emitted / (double)st->verify_steps : 0;
}
