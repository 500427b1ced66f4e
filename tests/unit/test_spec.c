/* tests/unit/test_spec.c — the n-gram proposer (longest suffix, most recent occurrence, a
 * continuation that copies its own drafts, k and size limits), the proposer vtable, and the
 * rejection rule on explicit distributions: a statistical test that the emitted token follows the
 * target distribution (total-variation distance shrinking with the sample count, under a bound a
 * deliberately wrong rule fails). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/spec.h"
#include "kernels/sample_rng.h"

static void test_ngram_longest_suffix_wins(void **state)
{
    (void)state;
    /* suffix "1 2 3": a 3-gram match at 0 (followed by 7 8), a 2-gram "2 3" later at 5 (followed by
     * 9); the longer match wins though it is older. */
    const int32_t t[] = {1, 2, 3, 7, 8, 2, 3, 9, 4, 1, 2, 3};
    int32_t d[4];
    assert_int_equal(spec_ngram_propose(t, 12, 1, 3, 2, d), 2);
    assert_int_equal(d[0], 7);
    assert_int_equal(d[1], 8);
    /* With max_n 2 the most recent 2-gram "2 3" (at 5) wins. */
    assert_int_equal(spec_ngram_propose(t, 12, 1, 2, 2, d), 2);
    assert_int_equal(d[0], 9);
    assert_int_equal(d[1], 4);
}

static void test_ngram_most_recent_occurrence(void **state)
{
    (void)state;
    const int32_t t[] = {5, 1, 5, 2, 5, 3, 5};
    int32_t d[1];
    assert_int_equal(spec_ngram_propose(t, 7, 1, 1, 1, d), 1);
    assert_int_equal(d[0], 3);                     /* "5" last seen at 4, followed by 3 */
}

static void test_ngram_repeat_extends_itself(void **state)
{
    (void)state;
    const int32_t t[] = {4, 1, 2, 1, 2};
    int32_t d[5];
    /* "1 2" occurred at 1, followed by "1 2" and then the end: the drafts continue the pattern. */
    assert_int_equal(spec_ngram_propose(t, 5, 2, 2, 5, d), 5);
    const int32_t want[] = {1, 2, 1, 2, 1};
    assert_memory_equal(d, want, sizeof want);
}

static void test_ngram_no_match_and_limits(void **state)
{
    (void)state;
    const int32_t t[] = {1, 2, 3, 4};
    int32_t d[SPEC_MAX_K + 4];
    assert_int_equal(spec_ngram_propose(t, 4, 1, 3, 4, d), 0);        /* "4" never occurred before */
    assert_int_equal(spec_ngram_propose(t, 1, 1, 3, 4, d), 0);        /* one token: nothing earlier */
    assert_int_equal(spec_ngram_propose(t, 0, 1, 3, 4, d), 0);
    const int32_t r[] = {7, 7};
    assert_int_equal(spec_ngram_propose(r, 2, 1, 3, 0, d), 0);        /* k 0 */
    assert_int_equal(spec_ngram_propose(r, 2, 1, 3, SPEC_MAX_K + 4, d), SPEC_MAX_K);
    for (int i = 0; i < SPEC_MAX_K; i++)
        assert_int_equal(d[i], 7);
    /* min_n above what fits: the suffix must leave an earlier token. */
    assert_int_equal(spec_ngram_propose(r, 2, 2, 3, 2, d), 0);
}

static void test_ngram_proposer_vtable(void **state)
{
    (void)state;
    assert_null(spec_ngram_new(0, 3, 0));
    assert_null(spec_ngram_new(3, 2, 0));
    assert_null(spec_ngram_new(1, 65, 1));
    spec_proposer_t *p = spec_ngram_new(1, 4, 0);
    assert_non_null(p);
    assert_string_equal(p->ops->name, "ngram");
    const int32_t t[] = {9, 8, 7, 9, 8};
    int32_t d[3];
    float q[3] = {0, 0, 0};
    assert_int_equal(spec_propose(p, 42, t, 5, 3, d, q), 3);
    assert_int_equal(d[0], 7);
    assert_int_equal(d[1], 9);
    assert_int_equal(d[2], 8);
    for (int i = 0; i < 3; i++)
        assert_true(q[i] == 1.0f);
    assert_int_equal(spec_propose(p, 42, t, 5, 0, d, NULL), 0);
    spec_accepted(p, 42, 3, 2);                    /* uncalibrated: nothing learnt, still 1.0 */
    assert_int_equal(spec_propose(p, 42, t, 5, 3, d, q), 3);
    for (int i = 0; i < 3; i++)
        assert_true(q[i] == 1.0f);
    spec_forget(p, 42);
    spec_proposer_destroy(&p);
    assert_null(p);
    spec_proposer_destroy(&p);
}

/* The calibrated n-gram proposer: its confidence in a draft is its running estimate of acceptance
 * given the drafts before it, by match length and position, learnt from what the target kept. */
static void test_ngram_confidence(void **state)
{
    (void)state;
    spec_proposer_t *p = spec_ngram_new(1, 4, 1);
    assert_non_null(p);
    /* long: "1 2 3 4 5 6 1 2 3" matches 3 tokens (drafts 4 5 6); short: "1 2 3 9 1" matches 1 (2 3 9) */
    const int32_t lng[] = {1, 2, 3, 4, 5, 6, 1, 2, 3}, sht[] = {1, 2, 3, 9, 1};
    int32_t d[4];
    float q[4];
    assert_int_equal(spec_propose(p, 1, lng, 9, 3, d, q), 3);
    assert_int_equal(d[0], 4);
    for (int i = 0; i < 3; i++)
        assert_float_equal(q[i], 0.5f, 1e-6);       /* nothing seen: (0 + 1) / (0 + 2) */
    /* The long match's drafts are all kept, the short match's first draft never. */
    for (int r = 0; r < 200; r++) {
        assert_int_equal(spec_propose(p, 1, lng, 9, 3, d, q), 3);
        spec_accepted(p, 1, 3, 3);
        assert_int_equal(spec_propose(p, 2, sht, 5, 3, d, q), 3);
        spec_accepted(p, 2, 3, 0);
    }
    assert_int_equal(spec_propose(p, 1, lng, 9, 3, d, q), 3);
    for (int i = 0; i < 3; i++)
        assert_true(q[i] > 0.99f);
    assert_int_equal(spec_propose(p, 2, sht, 5, 3, d, q), 3);
    assert_true(q[0] < 0.01f);
    assert_float_equal(q[1], 0.5f, 1e-6);           /* never reached: still the prior */
    assert_float_equal(q[2], 0.5f, 1e-6);
    /* Only verified drafts count: 2 verified of 3, both kept, reaches positions 0 and 1 only. */
    spec_accepted(p, 2, 2, 2);
    assert_int_equal(spec_propose(p, 2, sht, 5, 3, d, q), 3);
    assert_float_equal(q[1], 2.0f / 3.0f, 1e-6);    /* (1 + 1) / (1 + 2) */
    assert_float_equal(q[2], 0.5f, 1e-6);
    /* One report per proposal; a forgotten sequence's report is dropped. */
    spec_accepted(p, 2, 3, 1);
    spec_accepted(p, 2, 3, 1);
    assert_int_equal(spec_propose(p, 2, sht, 5, 3, d, q), 3);
    assert_float_equal(q[1], 2.0f / 4.0f, 1e-6);    /* reached 2, kept 1 (the second report ignored) */
    spec_forget(p, 2);
    spec_accepted(p, 2, 3, 3);
    assert_int_equal(spec_propose(p, 2, sht, 5, 3, d, q), 3);
    assert_float_equal(q[1], 2.0f / 4.0f, 1e-6);
    /* Bad reports change nothing; no match, no drafts and no confidence. */
    spec_accepted(p, 2, 3, 4);
    spec_accepted(p, 2, 0, 0);
    assert_float_equal(q[1], 2.0f / 4.0f, 1e-6);
    const int32_t none[] = {5, 6, 7};
    assert_int_equal(spec_propose(p, 3, none, 3, 3, d, q), 0);
    /* Counts halve past 2,048 reached: the estimate follows a change of text within a few thousand. */
    for (int r = 0; r < 5000; r++) {
        assert_int_equal(spec_propose(p, 1, lng, 9, 3, d, q), 3);
        spec_accepted(p, 1, 3, 0);
    }
    assert_int_equal(spec_propose(p, 1, lng, 9, 3, d, q), 3);
    assert_true(q[0] < 0.05f);
    spec_proposer_destroy(&p);
}

static void test_method_names(void **state)
{
    (void)state;
    spec_method_t m;
    assert_int_equal(spec_method_parse("ngram", &m), 0);
    assert_int_equal(m, SPEC_NGRAM);
    assert_int_equal(spec_method_parse("off", &m), 0);
    assert_int_equal(m, SPEC_OFF);
    assert_int_equal(spec_method_parse("eagle", &m), -1);
    assert_int_equal(spec_method_parse(NULL, &m), -1);
    assert_string_equal(spec_method_name(SPEC_NGRAM), "ngram");
    assert_int_equal(spec_method_parse("mtp", &m), 0);
    assert_int_equal(m, SPEC_MTP);
    assert_string_equal(spec_method_name(SPEC_MTP), "mtp");
    int k = 0;
    char err[256];
    assert_int_equal(spec_knob_parse("TROUPE_SPECULATION", "mtp:3", &m, &k, err, sizeof err), 0);
    assert_true(m == SPEC_MTP && k == 3);
    assert_int_equal(spec_knob_parse("TROUPE_SPECULATION", "mtp:0", &m, &k, err, sizeof err), -1);
    assert_non_null(strstr(err, "mtp:K"));
}

/* ---- the rejection rule ------------------------------------------------------------------- */

enum { V = 5 };
static const double s_p[V] = {0.40, 0.05, 0.25, 0.20, 0.10};   /* target */
static const double s_q[V] = {0.10, 0.45, 0.05, 0.30, 0.10};   /* draft, far from p */

/* A wrong rule for the control: accepts like the right one but resamples from p itself instead
 * of the residual, which over-weights the tokens the draft likes. */
static int32_t s_wrong_rule(const double *p, const double *q, int n, int32_t x, double ua, double ur, int *acc)
{
    *acc = ua * q[x] < p[x];
    if (*acc)
        return x;
    double c = 0;
    for (int t = 0; t < n; t++)
        if ((c += p[t]) > ur)
            return t;
    return n - 1;
}

/* Draws x from q and applies rule; the total-variation distance of the emitted tokens' empirical
 * distribution from p after n samples. */
static double s_tv(int32_t (*rule)(const double *, const double *, int, int32_t, double, double, int *), int n,
                   uint64_t seed, double *accept_rate)
{
    long count[V] = {0}, n_acc = 0;
    for (int i = 0; i < n; i++) {
        double u = sample_rng_uniform(seed, 3 * (uint64_t)i), acc = 0;
        int32_t x = V - 1;
        for (int t = 0; t < V; t++)
            if ((acc += s_q[t]) > u) {
                x = t;
                break;
            }
        int a;
        int32_t y = rule(s_p, s_q, V, x, sample_rng_uniform(seed, 3 * (uint64_t)i + 1),
                         sample_rng_uniform(seed, 3 * (uint64_t)i + 2), &a);
        assert_true(y >= 0 && y < V);
        if (a)
            assert_int_equal(y, x);
        count[y]++;
        n_acc += a;
    }
    double tv = 0;
    for (int t = 0; t < V; t++)
        tv += fabs((double)count[t] / n - s_p[t]);
    if (accept_rate)
        *accept_rate = (double)n_acc / n;
    return tv / 2;
}

static void test_accept_dist_follows_target(void **state)
{
    (void)state;
    /* The expected TV of n samples from p is about 0.4 * sqrt(V / n): bounds of 2.5 sqrt(V / n)
     * leave room for chance and still fail a rule that is off by a few percent. */
    double prev = 1, rate = 0;
    const int ns[] = {1000, 10000, 200000};
    for (int i = 0; i < 3; i++) {
        double tv = s_tv(spec_accept_dist, ns[i], 0x5eed, &rate);
        print_message("n=%d tv=%.5f accept=%.4f\n", ns[i], tv, rate);
        assert_true(tv < 2.5 * sqrt((double)V / ns[i]));
        assert_true(tv < prev);
        prev = tv;
    }
    /* The acceptance rate is sum_x min(p(x), q(x)) = 0.1 + 0.05 + 0.05 + 0.2 + 0.1 = 0.5. */
    assert_true(fabs(rate - 0.5) < 0.01);
    /* The control: a wrong rule is caught by the same bound. */
    double bad = s_tv(s_wrong_rule, 200000, 0x5eed, NULL);
    print_message("wrong rule: tv=%.5f\n", bad);
    assert_true(bad > 2.5 * sqrt((double)V / 200000));
}

static void test_accept_dist_edges(void **state)
{
    (void)state;
    int a;
    /* p == q: always accepted whatever u. */
    assert_int_equal(spec_accept_dist(s_p, s_p, V, 2, 0.999, 0.5, &a), 2);
    assert_int_equal(a, 1);
    /* p(x) = 0: always rejected, never x. */
    const double p0[V] = {0.5, 0, 0.5, 0, 0};
    for (int i = 0; i < 50; i++) {
        int32_t y = spec_accept_dist(p0, s_q, V, 1, i / 50.0, i / 50.0, &a);
        assert_int_equal(a, 0);
        assert_true(y == 0 || y == 2);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_longest_suffix_wins),  cmocka_unit_test(test_ngram_most_recent_occurrence),
        cmocka_unit_test(test_ngram_repeat_extends_itself), cmocka_unit_test(test_ngram_no_match_and_limits),
        cmocka_unit_test(test_ngram_proposer_vtable),
        cmocka_unit_test(test_ngram_confidence),      cmocka_unit_test(test_method_names),
        cmocka_unit_test(test_accept_dist_follows_target), cmocka_unit_test(test_accept_dist_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
