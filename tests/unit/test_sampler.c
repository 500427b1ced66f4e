/* tests/unit/test_sampler.c — every sampling option's semantics on hand-made logits, seeded
 * reproducibility, stop conditions, log-probabilities, and stop strings across token boundaries. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sampler.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_sample.h"

static sampler_t *s_new(const sampler_params_t *p, int V, const int32_t *prompt, int n)
{
    char err[256];
    sampler_t *s = sampler_new(p, V, prompt, n, err, sizeof err);
    if (!s)
        fail_msg("sampler_new: %s", err);
    return s;
}

/* Draws n tokens from the same logits with seeds 1..n (step 0 each) and counts them. */
static void s_histogram(const sampler_params_t *base, const float *logits, int V, int n, int *hist)
{
    memset(hist, 0, (size_t)V * sizeof(int));
    for (int i = 0; i < n; i++) {
        sampler_params_t p = *base;
        p.seed = (uint64_t)i + 1;
        sampler_t *s = s_new(&p, V, NULL, 0);
        int32_t t = sampler_sample(s, logits, NULL);
        assert_true(t >= 0 && t < V);
        hist[t]++;
        sampler_destroy(&s);
    }
}

/* |observed - expected| within 5 binomial standard deviations, for every token. */
static void s_expect_freq(const int *hist, const double *prob, int V, int n, const char *what)
{
    for (int i = 0; i < V; i++) {
        double e = prob[i] * n, sd = sqrt(n * prob[i] * (1 - prob[i]));
        if (prob[i] == 0 && hist[i] != 0)
            fail_msg("%s: token %d drawn %d times but must never be", what, i, hist[i]);
        if (fabs(hist[i] - e) > 5 * sd + 1)
            fail_msg("%s: token %d drawn %d times, expected %.1f", what, i, hist[i], e);
    }
}

static void test_greedy_ties_and_nan(void **state)
{
    sampler_params_t p;
    sampler_params_default(&p);
    float l[6] = {0.5f, 3.0f, -1.0f, 3.0f, NAN, 2.9f};
    sampler_t *s = s_new(&p, 6, NULL, 0);
    assert_int_equal(sampler_sample(s, l, NULL), 1);       /* the lower index of the tie */
    float n[3] = {NAN, -5.0f, -4.0f};
    sampler_destroy(&s);
    s = s_new(&p, 3, NULL, 0);
    assert_int_equal(sampler_sample(s, n, NULL), 2);       /* NaN never wins */
    sampler_destroy(&s);
    assert_null(s);
    sampler_destroy(&s);
}

/* sampler_is_greedy says exactly when sampler_sample is the backend's argmax of the raw logits
 * (the decode worker then takes the device argmax instead of downloading logits). */
static void test_is_greedy_matches_argmax_op(void **state)
{
    sampler_params_t p;
    sampler_params_default(&p);
    sampler_t *s = s_new(&p, 8, NULL, 0);
    assert_true(sampler_is_greedy(s));
    sampler_destroy(&s);
    p.top_k = 3;                                   /* filters do not matter at temperature 0 */
    p.min_p = 0.5;
    s = s_new(&p, 8, NULL, 0);
    assert_true(sampler_is_greedy(s));
    sampler_destroy(&s);
    const struct { double t, rep, pres, freq; } not_greedy[] = {
        {0.7, 1, 0, 0}, {0, 1.1, 0, 0}, {0, 1, 0.5, 0}, {0, 1, 0, -0.5}};
    for (size_t i = 0; i < sizeof not_greedy / sizeof *not_greedy; i++) {
        sampler_params_default(&p);
        p.temperature = not_greedy[i].t;
        p.repetition_penalty = not_greedy[i].rep;
        p.presence_penalty = not_greedy[i].pres;
        p.frequency_penalty = not_greedy[i].freq;
        s = s_new(&p, 8, NULL, 0);
        assert_false(sampler_is_greedy(s));
        sampler_destroy(&s);
    }
    /* Greedy: the same token as the CPU backend's argmax op, ties and NaN included. */
    char err[256];
    backend_t *be = backend_new("cpu", 1, err, sizeof err);
    assert_non_null(be);
    enum { V = 1000 };
    float *l = malloc(V * sizeof(float));
    sampler_params_default(&p);
    s = s_new(&p, V, NULL, 0);
    uint64_t x = 12345;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < V; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            l[i] = (float)((x >> 40) % 50) - 25.0f;    /* few distinct values: many ties */
            if ((x >> 20) % 97 == 0)
                l[i] = NAN;
        }
        int32_t op = -1;
        be->ops->argmax(be, l, 1, V, &op);
        assert_int_equal(sampler_sample(s, l, NULL), op);
    }
    sampler_destroy(&s);
    free(l);
    backend_destroy(&be);
}

static void test_repetition_penalty(void **state)
{
    sampler_params_t p;
    sampler_params_default(&p);
    float l[4] = {2.0f, -1.0f, 0.5f, 1.9f};
    int32_t prompt[2] = {0, 1};
    sampler_t *s = s_new(&p, 4, prompt, 2);
    assert_int_equal(sampler_sample(s, l, NULL), 0);
    sampler_destroy(&s);
    p.repetition_penalty = 2.0;                    /* 2.0 -> 1.0, -1.0 -> -2.0 */
    p.logprobs_mode = SAMPLER_LOGPROBS_PROCESSED;
    s = s_new(&p, 4, prompt, 2);
    float lp;
    assert_int_equal(sampler_sample(s, l, &lp), 3);
    double z = exp(1.0) + exp(-2.0) + exp(0.5) + exp(1.9);
    assert_float_equal(lp, 1.9 - log(z), 1e-5);    /* log_softmax of the penalised logits */
    /* Generated tokens count too: after token 3 it is penalised: 1.9 -> 0.95, so 0 (1.0) wins. */
    assert_int_equal(sampler_accept(s, 3), FINISH_NONE);
    assert_int_equal(sampler_sample(s, l, NULL), 0);
    assert_true(l[0] == 2.0f && l[3] == 1.9f);     /* the caller's logits are untouched */
    sampler_destroy(&s);
}

static void test_presence_frequency(void **state)
{
    sampler_params_t p;
    sampler_params_default(&p);
    p.presence_penalty = 0.5;
    p.frequency_penalty = 0.6;
    p.logprobs_mode = SAMPLER_LOGPROBS_PROCESSED;
    int32_t prompt[1] = {2};
    float l[3] = {2.0f, 1.0f, 1.95f};
    sampler_t *s = s_new(&p, 3, prompt, 1);
    /* Only output tokens are penalised: token 2 in the prompt keeps 1.95. */
    assert_int_equal(sampler_sample(s, l, NULL), 0);
    sampler_accept(s, 0);                          /* 2.0 - (0.6 + 0.5) = 0.9 */
    float lp;
    assert_int_equal(sampler_sample(s, l, &lp), 2);
    double z = exp(0.9) + exp(1.0) + exp(1.95);
    assert_float_equal(lp, 1.95 - log(z), 1e-5);
    sampler_accept(s, 2);                          /* 1.95 - 1.1 = 0.85 */
    sampler_accept(s, 0);                          /* 2.0 - (1.2 + 0.5) = 0.3 */
    assert_int_equal(sampler_sample(s, l, &lp), 1);
    z = exp(0.3) + exp(1.0) + exp(0.85);
    assert_float_equal(lp, 1.0 - log(z), 1e-5);
    sampler_destroy(&s);
}

static void test_temperature_distribution(void **state)
{
    const int V = 5, N = 20000;
    float l[5] = {1.0f, 0.0f, -1.0f, 0.5f, 0.2f};
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = 0.7;
    int hist[5];
    double prob[5], z = 0;
    for (int i = 0; i < V; i++)
        z += (prob[i] = exp(l[i] / 0.7));
    for (int i = 0; i < V; i++)
        prob[i] /= z;
    s_histogram(&p, l, V, N, hist);
    s_expect_freq(hist, prob, V, N, "temperature 0.7");
}

static void test_top_k(void **state)
{
    const int V = 6, N = 6000;
    float l[6] = {0.1f, 1.0f, 0.9f, 1.0f, -3.0f, 0.95f};
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = 1.0;
    p.top_k = 3;                                   /* tokens 1, 3 (tie: both), 5 */
    int hist[6];
    double prob[6] = {0}, z = exp(1.0) * 2 + exp(0.95);
    prob[1] = prob[3] = exp(1.0) / z;
    prob[5] = exp(0.95) / z;
    s_histogram(&p, l, V, N, hist);
    s_expect_freq(hist, prob, V, N, "top_k 3");
    /* A tie at the boundary: the lower index ranks first. */
    float flat[4] = {1, 1, 1, 1};
    p.top_k = 2;
    int h4[4];
    double pf[4] = {0.5, 0.5, 0, 0};
    s_histogram(&p, flat, 4, 2000, h4);
    s_expect_freq(h4, pf, 4, 2000, "top_k tie");
}

static void test_top_p_and_min_p(void **state)
{
    const int V = 4, N = 8000;
    float l[4] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = 1.0;
    p.top_p = 0.75;                                /* 0.5 + 0.3 >= 0.75: tokens 1 and 3 */
    int hist[4];
    double prob[4] = {0, 0.5 / 0.8, 0, 0.3 / 0.8};
    s_histogram(&p, l, V, N, hist);
    s_expect_freq(hist, prob, V, N, "top_p 0.75");
    p.top_p = 0.85;                                /* + 0.15: tokens 1, 3, 0 */
    double prob2[4] = {0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95};
    s_histogram(&p, l, V, N, hist);
    s_expect_freq(hist, prob2, V, N, "top_p 0.85");
    p.top_p = 1.0;
    p.min_p = 0.4;                                 /* keep p >= 0.2: tokens 1 and 3 */
    s_histogram(&p, l, V, N, hist);
    s_expect_freq(hist, prob, V, N, "min_p 0.4");
    p.top_p = 0.01;                                /* always at least the best token */
    p.min_p = 0;
    double only[4] = {0, 1, 0, 0};
    s_histogram(&p, l, V, 200, hist);
    s_expect_freq(hist, only, V, 200, "top_p tiny");
}

/* top-k + top-p + min-p on a large random vocabulary: the processed log-probability of the drawn
 * token must equal one computed from a full sort, which checks the kept set's total mass. */
static void test_filters_against_full_sort(void **state)
{
    const int V = 5000;
    float *l = malloc(V * sizeof(float));
    uint64_t r = 99;
    for (int i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 12 - 6);
    }
    int *order = malloc(V * sizeof(int));
    const int ks[3] = {0, 50, 1000};
    const double ps[3] = {1.0, 0.9, 0.3}, mps[2] = {0, 0.05};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++) {
                sampler_params_t p;
                sampler_params_default(&p);
                p.temperature = 0.8;
                p.top_k = ks[a];
                p.top_p = ps[b];
                p.min_p = mps[c];
                p.seed = 1234 + a * 10 + b * 3 + c;
                p.logprobs_mode = SAMPLER_LOGPROBS_PROCESSED;
                /* Reference: full selection sort order by (value desc, index asc). */
                for (int i = 0; i < V; i++)
                    order[i] = i;
                for (int i = 0; i < V; i++)
                    for (int j = i + 1; j < V; j++)
                        if (l[order[j]] > l[order[i]] || (l[order[j]] == l[order[i]] && order[j] < order[i])) {
                            int t = order[i]; order[i] = order[j]; order[j] = t;
                        }
                int n = p.top_k > 0 ? p.top_k : V;
                double mx = l[order[0]] / 0.8, tot = 0, acc = 0;
                for (int i = 0; i < n; i++)
                    tot += exp(l[order[i]] / 0.8 - mx);
                int keep = n;
                if (p.top_p < 1)
                    for (int i = 0; i < n; i++) {
                        acc += exp(l[order[i]] / 0.8 - mx);
                        if (acc >= p.top_p * tot) {
                            keep = i + 1;
                            break;
                        }
                    }
                int keep2 = keep;
                if (p.min_p > 0)
                    for (keep2 = 1; keep2 < keep && exp(l[order[keep2]] / 0.8 - mx) >= p.min_p; keep2++)
                        ;
                double kept = 0;
                for (int i = 0; i < keep2; i++)
                    kept += exp(l[order[i]] / 0.8 - mx);
                sampler_t *s = s_new(&p, V, NULL, 0);
                for (int step = 0; step < 5; step++) {
                    float lp;
                    int32_t t = sampler_sample(s, l, &lp);
                    int rank = 0;
                    while (order[rank] != t)
                        rank++;
                    if (rank >= keep2)
                        fail_msg("k=%d p=%g min_p=%g: drew token of rank %d, only %d kept", p.top_k, p.top_p, p.min_p, rank, keep2);
                    double ref = l[t] / 0.8 - mx - log(kept);
                    if (fabs(lp - ref) > 1e-4)
                        fail_msg("k=%d p=%g min_p=%g: logprob %.6f vs %.6f (kept %d)", p.top_k, p.top_p, p.min_p, lp, ref, keep2);
                    sampler_accept(s, t);
                }
                sampler_destroy(&s);
            }
    free(order);
    free(l);
}

static void test_seed_reproducible(void **state)
{
    const int V = 50;
    float l[50];
    for (int i = 0; i < V; i++)
        l[i] = (float)sin(i * 1.3) * 2;
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = 1.0;
    p.seed = 42;
    int32_t a[40], b[40], c[40];
    sampler_t *s = s_new(&p, V, NULL, 0);
    for (int i = 0; i < 40; i++)
        sampler_accept(s, a[i] = sampler_sample(s, l, NULL));
    sampler_destroy(&s);
    /* The same request again, interleaved with another request's sampling (a different batch). */
    sampler_params_t q = p;
    q.seed = 7;
    sampler_t *s1 = s_new(&p, V, NULL, 0), *other = s_new(&q, V, NULL, 0);
    for (int i = 0; i < 40; i++) {
        sampler_accept(other, c[i] = sampler_sample(other, l, NULL));
        sampler_accept(other, sampler_sample(other, l, NULL));
        sampler_accept(s1, b[i] = sampler_sample(s1, l, NULL));
    }
    assert_memory_equal(a, b, sizeof a);
    /* Another seed draws another sequence. */
    sampler_destroy(&other);
    q.seed = 43;
    other = s_new(&q, V, NULL, 0);
    for (int i = 0; i < 40; i++)
        sampler_accept(other, c[i] = sampler_sample(other, l, NULL));
    assert_true(memcmp(a, c, sizeof a) != 0);
    sampler_destroy(&other);
    sampler_destroy(&s1);
}

static void test_finish_reasons(void **state)
{
    sampler_params_t p;
    sampler_params_default(&p);
    p.n_eos = 2;
    p.eos_ids[0] = 5;
    p.eos_ids[1] = 6;
    p.n_stop_ids = 1;
    p.stop_ids[0] = 9;
    p.max_tokens = 4;
    sampler_t *s = s_new(&p, 10, NULL, 0);
    assert_int_equal(sampler_accept(s, 1), FINISH_NONE);
    assert_int_equal(sampler_accept(s, 6), FINISH_STOP);
    sampler_destroy(&s);
    p.ignore_eos = 1;
    s = s_new(&p, 10, NULL, 0);
    assert_int_equal(sampler_accept(s, 5), FINISH_NONE);   /* EOS ignored */
    assert_int_equal(sampler_accept(s, 9), FINISH_STOP);   /* stop ids still stop */
    sampler_destroy(&s);
    s = s_new(&p, 10, NULL, 0);
    assert_int_equal(sampler_accept(s, 1), FINISH_NONE);
    assert_int_equal(sampler_accept(s, 2), FINISH_NONE);
    assert_int_equal(sampler_accept(s, 3), FINISH_NONE);
    assert_int_equal(sampler_accept(s, 4), FINISH_LENGTH);
    assert_int_equal(sampler_n_generated(s), 4);
    sampler_destroy(&s);
    assert_string_equal(finish_reason_name(FINISH_LENGTH), "length");
}

static void test_raw_logprob(void **state)
{
    sampler_params_t p;
    sampler_params_default(&p);
    p.repetition_penalty = 3.0;
    p.temperature = 0.5;
    float l[3] = {1.0f, 2.0f, 0.0f};
    int32_t prompt[1] = {1};
    sampler_t *s = s_new(&p, 3, prompt, 1);
    float lp;
    int32_t t = sampler_sample(s, l, &lp);
    double z = exp(1.0) + exp(2.0) + exp(0.0);
    assert_float_equal(lp, l[t] - log(z), 1e-6);  /* raw: before penalty and temperature */
    sampler_destroy(&s);
}

/* ---- top logprobs ------------------------------------------------------------------------ */

static const float *s_rank_row;
static int s_rank_cmp(const void *a, const void *b)   /* larger first, the lower id on ties */
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (s_rank_row[x] != s_rank_row[y])
        return s_rank_row[x] > s_rank_row[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

/* RAW: the n best by a full sort (ties by id, never -inf or NaN), each value bit for bit the chosen
 * token's logprob, sorted and <= 0; a greedy choice is the top-1 with the same logprob; n
 * clipped to SAMPLER_MAX_TOP and the vocabulary. */
static void test_top_logprobs_raw(void **state)
{
    enum { V = 997 };
    static float l[V];
    static int32_t order[V];
    uint64_t x = 88172645463325252ull;
    int n_ok = 0;
    for (int i = 0; i < V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        l[i] = (float)((double)(x % 20000) / 1000.0 - 10.0);   /* [-10, 10), with repeats: ties */
    }
    l[6] = 25.0f;                                 /* a clear first */
    l[700] = 24.0f, l[300] = 24.0f;               /* a tie for second: 300 ranks before 700 */
    l[9] = -INFINITY;
    for (int i = 0; i < V; i++)
        if (isfinite(l[i]))
            order[n_ok++] = i;
    s_rank_row = l;
    qsort(order, (size_t)n_ok, sizeof order[0], s_rank_cmp);
    sampler_params_t p;
    sampler_params_default(&p);
    sampler_t *s = s_new(&p, V, NULL, 0);
    float chosen_lp;
    const int32_t chosen = sampler_sample(s, l, &chosen_lp);
    sampler_top_t top;
    assert_int_equal(sampler_top_logprobs(s, l, 20, &top), 20);
    assert_int_equal(top.ids[0], chosen);
    assert_true(top.logprobs[0] == chosen_lp);   /* exactly: one computation */
    assert_int_equal(top.ids[1], 300);
    assert_int_equal(top.ids[2], 700);
    for (int k = 0; k < top.n; k++) {
        assert_int_equal(top.ids[k], order[k]);
        assert_true(top.logprobs[k] == cpu_log_softmax_at(l, V, top.ids[k]));
        assert_true(top.logprobs[k] <= 0);
        if (k)
            assert_true(top.logprobs[k] <= top.logprobs[k - 1]);
    }
    assert_int_equal(sampler_top_logprobs(s, l, 1000, &top), SAMPLER_MAX_TOP);
    /* A NaN logit is never listed, and the others keep finite values (it is out of the sum). */
    const float keep = l[6];
    l[6] = NAN;
    assert_int_equal(sampler_top_logprobs(s, l, 3, &top), 3);
    assert_int_equal(top.ids[0], 300);
    for (int k = 0; k < top.n; k++)
        assert_true(isfinite(top.logprobs[k]) && top.logprobs[k] <= 0);
    l[6] = keep;
    assert_int_equal(sampler_top_logprobs(s, l, 0, &top), 0);
    assert_int_equal(sampler_top_logprobs(s, l, -3, &top), 0);
    sampler_destroy(&s);
    /* A vocabulary smaller than n; RAW is before any processing (penalties, temperature). */
    float small[3] = {0.25f, -1.0f, 2.0f};
    p.temperature = 0.7;
    p.repetition_penalty = 4.0;
    int32_t prompt[1] = {2};
    s = s_new(&p, 3, prompt, 1);
    assert_int_equal(sampler_top_logprobs(s, small, 5, &top), 3);
    assert_int_equal(top.ids[0], 2);
    assert_int_equal(top.ids[1], 0);
    assert_int_equal(top.ids[2], 1);
    double z = exp(0.25) + exp(-1.0) + exp(2.0), sum = 0;
    for (int k = 0; k < 3; k++) {
        assert_float_equal(top.logprobs[k], small[top.ids[k]] - log(z), 1e-6);
        sum += exp(top.logprobs[k]);
    }
    assert_float_equal(sum, 1.0, 1e-6);
    sampler_destroy(&s);
}

/* PROCESSED: the distribution the token is drawn from. Top-k 3 lists 3 tokens whatever n is,
 * their probabilities sum to 1, and the drawn token's processed logprob is its entry; greedy with a
 * penalty: log_softmax of the penalised row, its choice first with an equal logprob. */
static void test_top_logprobs_processed(void **state)
{
    float l[8] = {1.0f, 3.0f, 0.5f, 2.5f, -1.0f, 2.0f, 0.0f, 1.5f};
    sampler_params_t p;
    sampler_params_default(&p);
    p.logprobs_mode = SAMPLER_LOGPROBS_PROCESSED;
    p.temperature = 0.8;
    p.top_k = 3;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        p.seed = seed;
        sampler_t *s = s_new(&p, 8, NULL, 0);
        float lp;
        const int32_t t = sampler_sample(s, l, &lp);
        sampler_top_t top;
        assert_int_equal(sampler_top_logprobs(s, l, 5, &top), 3);
        assert_int_equal(top.ids[0], 1);
        assert_int_equal(top.ids[1], 3);
        assert_int_equal(top.ids[2], 5);
        double sum = 0;
        int found = 0;
        for (int k = 0; k < top.n; k++) {
            sum += exp(top.logprobs[k]);
            if (top.ids[k] == t) {
                assert_true(top.logprobs[k] == lp);
                found = 1;
            }
        }
        assert_true(found);                       /* top-k 3 <= n: every drawable token is listed */
        assert_float_equal(sum, 1.0, 1e-5);
        sampler_destroy(&s);
    }
    sampler_params_default(&p);
    p.logprobs_mode = SAMPLER_LOGPROBS_PROCESSED;
    p.repetition_penalty = 3.0;
    int32_t prompt[1] = {1};                       /* 3.0 becomes 1.0: token 3 (2.5) wins */
    sampler_t *s = s_new(&p, 8, prompt, 1);
    float lp;
    const int32_t t = sampler_sample(s, l, &lp);
    assert_int_equal(t, 3);
    sampler_top_t top;
    assert_int_equal(sampler_top_logprobs(s, l, 4, &top), 4);
    assert_int_equal(top.ids[0], 3);
    assert_true(top.logprobs[0] == lp);
    assert_int_equal(top.ids[1], 5);
    assert_int_equal(top.ids[2], 7);
    assert_int_equal(top.ids[3], 0);             /* 1.0 and penalised 1.0: the lower id first */
    sampler_destroy(&s);
}

static void test_params_check(void **state)
{
    char err[256];
    sampler_params_t p;
    sampler_params_default(&p);
    p.top_p = 0;
    assert_null(sampler_new(&p, 10, NULL, 0, err, sizeof err));
    assert_non_null(strstr(err, "top_p"));
    sampler_params_default(&p);
    p.temperature = -1;
    assert_int_equal(sampler_params_check(&p, 10, err, sizeof err), -1);
    assert_non_null(strstr(err, "temperature"));
    sampler_params_default(&p);
    p.n_stop_ids = 1;
    p.stop_ids[0] = 10;
    assert_int_equal(sampler_params_check(&p, 10, err, sizeof err), -1);
    assert_non_null(strstr(err, "stop id 10"));
    sampler_params_default(&p);
    p.n_stops = 1;
    p.stops[0] = "";
    assert_int_equal(sampler_params_check(&p, 10, err, sizeof err), -1);
    assert_non_null(strstr(err, "empty"));
    sampler_params_default(&p);
    int32_t bad[1] = {10};
    assert_null(sampler_new(&p, 10, bad, 1, err, sizeof err));
    assert_non_null(strstr(err, "prompt token 10"));
}

/* ---- stop strings ------------------------------------------------------------------------ */

typedef struct { char buf[8192]; size_t n; int calls; } sink_t;
static void s_emit(void *ctx, const char *t, size_t n)
{
    sink_t *k = ctx;
    assert_true(n > 0);
    memcpy(k->buf + k->n, t, n);
    k->n += n;
    k->buf[k->n] = 0;
    k->calls++;
}

static sampler_t *s_stopper(const char *a, const char *b)
{
    sampler_params_t p;
    sampler_params_default(&p);
    p.stops[p.n_stops++] = a;
    if (b)
        p.stops[p.n_stops++] = b;
    return s_new(&p, 10, NULL, 0);
}

static void test_stop_across_tokens(void **state)
{
    sink_t k = {.n = 0};
    sampler_t *s = s_stopper("</s>", "STOP");
    assert_int_equal(sampler_text(s, "Hello <", 7, s_emit, &k), 0);
    assert_string_equal(k.buf, "Hello ");          /* "<" held: it may start "</s>" */
    assert_int_equal(sampler_text(s, "/", 1, s_emit, &k), 0);
    assert_string_equal(k.buf, "Hello ");
    assert_int_equal(sampler_text(s, "s> more", 7, s_emit, &k), 1);
    assert_string_equal(k.buf, "Hello ");          /* the stop string is not emitted */
    assert_int_equal(sampler_text(s, "later", 5, s_emit, &k), 1);
    sampler_text_flush(s, s_emit, &k);
    assert_string_equal(k.buf, "Hello ");
    sampler_destroy(&s);
}

static void test_stop_false_start_and_flush(void **state)
{
    sink_t k = {.n = 0};
    sampler_t *s = s_stopper("</s>", NULL);
    assert_int_equal(sampler_text(s, "a</", 3, s_emit, &k), 0);
    assert_string_equal(k.buf, "a");
    assert_int_equal(sampler_text(s, "x<", 2, s_emit, &k), 0);
    assert_string_equal(k.buf, "a</x");            /* "</x" cannot start a stop; "<" still might */
    sampler_text_flush(s, s_emit, &k);
    assert_string_equal(k.buf, "a</x<");
    sampler_destroy(&s);

    /* The earliest match wins, whichever stop string it is. */
    sink_t k2 = {.n = 0};
    s = s_stopper("</s>", "ST");
    assert_int_equal(sampler_text(s, "xxS", 3, s_emit, &k2), 0);
    assert_int_equal(sampler_text(s, "T</s>", 5, s_emit, &k2), 1);
    assert_string_equal(k2.buf, "xx");
    sampler_destroy(&s);

    /* Multi-byte UTF-8 stop string split across tokens. */
    sink_t k3 = {.n = 0};
    s = s_stopper("\xc3\xa9t\xc3\xa9", NULL);      /* "été" */
    assert_int_equal(sampler_text(s, "l'\xc3\xa9", 4, s_emit, &k3), 0);
    assert_int_equal(sampler_text(s, "t", 1, s_emit, &k3), 0);
    assert_int_equal(sampler_text(s, "\xc3\xa9!", 3, s_emit, &k3), 1);
    assert_string_equal(k3.buf, "l'");
    sampler_destroy(&s);
}

static void test_stop_long_chunk(void **state)
{
    /* A chunk far larger than the held-back buffer, the stop string at its very end. */
    char text[3000];
    memset(text, 'a', sizeof text);
    memcpy(text + sizeof text - 4, "STOP", 4);
    sink_t k = {.n = 0};
    sampler_t *s = s_stopper("STOP", NULL);
    assert_int_equal(sampler_text(s, text, sizeof text, s_emit, &k), 1);
    assert_int_equal(k.n, sizeof text - 4);
    for (size_t i = 0; i < k.n; i++)
        assert_int_equal(k.buf[i], 'a');
    sampler_destroy(&s);
    /* No stop strings: text passes straight through. */
    sampler_params_t p;
    sampler_params_default(&p);
    s = s_new(&p, 10, NULL, 0);
    sink_t k2 = {.n = 0};
    assert_int_equal(sampler_text(s, "abc", 3, s_emit, &k2), 0);
    assert_string_equal(k2.buf, "abc");
    sampler_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_ties_and_nan),
        cmocka_unit_test(test_is_greedy_matches_argmax_op),
        cmocka_unit_test(test_repetition_penalty),
        cmocka_unit_test(test_presence_frequency),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p_and_min_p),
        cmocka_unit_test(test_filters_against_full_sort),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_finish_reasons),
        cmocka_unit_test(test_raw_logprob),
        cmocka_unit_test(test_top_logprobs_raw),
        cmocka_unit_test(test_top_logprobs_processed),
        cmocka_unit_test(test_params_check),
        cmocka_unit_test(test_stop_across_tokens),
        cmocka_unit_test(test_stop_false_start_and_flush),
        cmocka_unit_test(test_stop_long_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
