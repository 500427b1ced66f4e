/* tests/unit/spec_dist_check.h — the check every proposer with a distribution passes: a proposal's
 * drafts each come with a distribution (spec_dist) over the vocabulary that sums to 1 and gives the
 * draft the probability the proposal reported. Included by the draft-model and MTP tests after
 * cmocka.h and engine/spec.h. */
#ifndef TROUPE_SPEC_DIST_CHECK_H
#define TROUPE_SPEC_DIST_CHECK_H

#include <math.h>

/* Drafts d[0..n) of sequence id, with their reported probabilities pr, over a vocabulary of V. */
static void spec_check_dists(spec_proposer_t *p, uint64_t id, const int32_t *d, const float *pr, int n, size_t V)
{
    for (int j = 0; j < n; j++) {
        const float *q = spec_dist(p, id, j);
        assert_non_null(q);
        double sum = 0;
        for (size_t t = 0; t < V; t++)
            sum += q[t];
        assert_true(fabs(sum - 1.0) < 1e-4);
        assert_true(q[d[j]] > 0 && q[d[j]] == pr[j]);
    }
}

#endif
