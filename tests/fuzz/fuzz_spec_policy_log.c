/* tests/fuzz/fuzz_spec_policy_log.c — spec_policy_log_parse (a line of TROUPE_SPEC_POLICY_LOG, what
 * troupe-spec-policy-replay reads) on arbitrary bytes, and the policy computed from whatever tables
 * it accepts: the same computation the draft-scheduler runs on the counts its workers report.
 *
 * Properties checked on every input:
 *   - a refusal explains itself: a non-empty message naming a field;
 *   - accepted tables are consistent: max_k in [1, SPEC_MAX_K], max_batch >= 1, accepted <=
 *     proposed at every draft position and confidence bin, every cell's seconds >= 0;
 *   - the policy computed from them (if any) is one a worker can apply: 1 to SPEC_COST_BATCHES
 *     buckets with ascending batch bounds, each max_draft in [0, max_k] and min_confidence a number
 *     in [0, 1]; survival and calibration in [0, 1], survival non-increasing; asking and keeping
 *     for any batch stay within max_k;
 *   - the line the scheduler would log for those tables parses back to the same tables (counts
 *     exactly, seconds to the %.9g it prints).
 * Seeds: tests/fuzz/corpus/spec_policy_log/ (computations of H200 runs, and refusals). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/spec_policy.h"

static void s_die(const char *what)
{
    fprintf(stderr, "fuzz_spec_policy_log: %s\n", what);
    abort();
}

static int s_unit(float x) { return x >= 0.0f && x <= 1.0f; }   /* false for NaN */

static void s_check_policy(const spec_policy_t *p, int max_k, int max_batch)
{
    if (p->n_buckets < 1 || p->n_buckets > SPEC_COST_BATCHES)
        s_die("a policy's bucket count is out of range");
    for (int i = 0; i < p->n_buckets; i++) {
        const spec_policy_bucket_t *b = &p->buckets[i];
        if (i > 0 && b->max_batch <= p->buckets[i - 1].max_batch)
            s_die("a policy's buckets do not ascend");
        if (b->max_draft < 0 || b->max_draft > max_k)
            s_die("a bucket's max_draft is outside [0, max_k]");
        if (!s_unit(b->min_confidence))
            s_die("a bucket's min_confidence is not in [0, 1]");
    }
    for (int i = 0; i < p->n_survival; i++)
        if (!s_unit(p->survival[i]) || (i > 0 && p->survival[i] > p->survival[i - 1]))
            s_die("the survival curve is not a non-increasing curve in [0, 1]");
    for (int j = 0; j < p->n_calibration; j++)
        if (!s_unit(p->calibration[j]))
            s_die("a calibration bin is not in [0, 1]");
    const float probs[SPEC_MAX_K] = {0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.3f};
    for (int batch = 1; batch <= 4096 && batch <= 2 * (long long)max_batch; batch = batch * 2 + 1)
        for (int dist = 0; dist <= 1; dist++) {
            const int k = spec_policy_ask(p, batch, dist);
            if (k < 0 || k > max_k)
                s_die("spec_policy_ask is outside [0, max_k]");
            const int keep = spec_policy_keep(p, batch, dist ? probs : NULL, max_k);
            if (keep < 0 || keep > max_k)
                s_die("spec_policy_keep is outside [0, max_k]");
        }
}

static void s_round_trip(const spec_accept_t *a, const spec_cost_t *c, int max_k, int max_batch, int ok,
                         const spec_policy_t *p, const char *why)
{
    static char line[1 << 16];
    if (spec_policy_log_line(line, sizeof line, 1.0, a, c, max_k, max_batch, ok, p, why) < 0)
        return;                                    /* too long for the buffer: the logger skips it too */
    spec_accept_t a2;
    spec_cost_t c2;
    int k2, b2;
    char e[256];
    if (spec_policy_log_parse(line, &a2, &c2, &k2, &b2, NULL, e, sizeof e) != 0)
        s_die("a logged line does not parse back");
    if (k2 != max_k || b2 != max_batch || memcmp(a, &a2, sizeof a2) != 0)
        s_die("a logged line's acceptance or limits read back differently");
    for (int b = 0; b < SPEC_COST_BATCHES; b++)
        for (int k = 0; k <= SPEC_MAX_K; k++) {
            if (c->steps[b][k] != c2.steps[b][k] || c->counted[b][k] != c2.counted[b][k] ||
                c->rows[b][k] != c2.rows[b][k] || c->emitted[b][k] != c2.emitted[b][k])
                s_die("a logged line's cost cell reads back with other counts");
            const double x = c->seconds[b][k], y = c2.seconds[b][k];
            if (!(x == y || fabs(x - y) <= 1e-8 * fabs(x)))
                s_die("a logged line's cost cell reads back with other seconds");
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char line[1 << 16];
    if (size >= sizeof line)
        return 0;
    memcpy(line, data, size);
    line[size] = 0;
    spec_accept_t a;
    spec_cost_t c;
    spec_policy_t logged;
    int max_k = 0, max_batch = 0;
    char why[256] = "";
    const int rc = spec_policy_log_parse(line, &a, &c, &max_k, &max_batch, &logged, why, sizeof why);
    if (rc != 0) {
        if (rc != -1)
            s_die("return code other than 0 / -1");
        if (!why[0] || !strchr(why, ':'))
            s_die("a refusal does not name its field");
        return 0;
    }
    if (max_k < 1 || max_k > SPEC_MAX_K || max_batch < 1)
        s_die("accepted limits out of range");
    for (int i = 0; i < SPEC_MAX_K; i++)
        if (a.accepted[i] > a.proposed[i])
            s_die("accepted tables have more accepted than proposed drafts");
    for (int j = 0; j < SPEC_CONF_BINS; j++)
        if (a.conf_accepted[j] > a.conf_seen[j])
            s_die("accepted tables have more accepted than seen in a confidence bin");
    for (int b = 0; b < SPEC_COST_BATCHES; b++)
        for (int k = 0; k <= SPEC_MAX_K; k++)
            if (!(c.seconds[b][k] >= 0))
                s_die("an accepted cost cell has negative or NaN seconds");
    spec_policy_t p = {.epoch = 1};
    char pwhy[256] = "";
    const int ok = spec_policy_compute(&a, &c, max_k, max_batch, &p, pwhy, sizeof pwhy);
    if (ok == 0)
        s_check_policy(&p, max_k, max_batch);
    else if (ok != -1 || !pwhy[0])
        s_die("a policy refused without saying why");
    s_round_trip(&a, &c, max_k, max_batch, ok == 0, &p, pwhy);
    /* The logged policy as the one in force (its lengths kept within the margin): whatever it holds,
     * the new policy is as well formed, and computed or refused as without it. */
    spec_policy_t in_force = logged;
    const int ok2 = spec_policy_compute(&a, &c, max_k, max_batch, &in_force, pwhy, sizeof pwhy);
    if (ok2 != ok)
        s_die("the policy in force changed whether a policy is computed");
    if (ok2 == 0)
        s_check_policy(&in_force, max_k, max_batch);
    return 0;
}
