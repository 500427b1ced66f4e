/* tests/unit/test_spec_sampler.c — sampler_verify_draft, the acceptance of an n-gram (point-mass)
 * draft against the target's logits: greedy accepts exactly the argmax; sampled, the emitted tokens
 * are the ones sampling without speculation draws for the same seed (token for token, through
 * sampler_accept's counters and a stop id), the acceptance rate approaches p(draft), and the
 * emitted distribution approaches p with a shrinking total-variation distance (a wrong rule, which
 * resamples from p without removing the draft, fails the same bound). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine/sampler.h"
#include "kernels/sample_rng.h"

enum { V = 6 };
static const float s_logits[V] = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.8f};

static sampler_t *s_new(double temperature, int top_k, uint64_t seed)
{
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = temperature;
    p.top_k = top_k;
    p.seed = seed;
    char err[256];
    sampler_t *s = sampler_new(&p, V, NULL, 0, err, sizeof err);
    assert_non_null(s);
    return s;
}

static void test_greedy_accepts_the_argmax_only(void **state)
{
    (void)state;
    sampler_t *s = s_new(0, 0, 0);
    int a;
    assert_int_equal(sampler_verify_draft(s, s_logits, 1, NULL, &a), 1);
    assert_int_equal(a, 1);
    assert_int_equal(sampler_verify_draft(s, s_logits, 3, NULL, &a), 1);
    assert_int_equal(a, 0);
    assert_int_equal(sampler_verify_draft(s, s_logits, -1, NULL, &a), 1);  /* no draft: position k */
    assert_int_equal(a, 0);
    sampler_destroy(&s);
}

/* p of the target after temperature 0.7 and top-k 4 (tokens 0, 1, 3, 5). */
static void s_target(double *p)
{
    double z = 0;
    for (int t = 0; t < V; t++) {
        int kept = t == 0 || t == 1 || t == 3 || t == 5;
        p[t] = kept ? exp(s_logits[t] / 0.7) : 0;
        z += p[t];
    }
    for (int t = 0; t < V; t++)
        p[t] /= z;
}

static void test_sampled_same_tokens_as_without(void **state)
{
    (void)state;
    sampler_t *spec = s_new(0.7, 4, 99), *plain = s_new(0.7, 4, 99);
    int n_acc = 0;
    for (int i = 0; i < 500; i++) {
        int a;
        int32_t draft = (int32_t)(i % V);
        int32_t y = sampler_verify_draft(spec, s_logits, draft, NULL, &a);
        int32_t z = sampler_sample(plain, s_logits, NULL);
        assert_int_equal(y, z);
        assert_int_equal(a, y == draft);
        n_acc += a;
        assert_int_equal(sampler_accept(spec, y), sampler_accept(plain, z));
    }
    assert_true(n_acc > 0 && n_acc < 500);
    sampler_destroy(&spec);
    sampler_destroy(&plain);
}

static void test_sampled_follows_target(void **state)
{
    (void)state;
    double p[V];
    s_target(p);
    const int32_t x = 3;                           /* the draft: p(x) about 0.27 */
    double prev = 1;
    const int ns[] = {1000, 10000, 100000};
    for (int k = 0; k < 3; k++) {
        sampler_t *s = s_new(0.7, 4, 1234);
        long count[V] = {0}, n_acc = 0, wrong[V] = {0};
        for (int i = 0; i < ns[k]; i++) {
            int a;
            int32_t y = sampler_verify_draft(s, s_logits, x, NULL, &a);
            count[y]++;
            n_acc += a;
            sampler_accept(s, y);
            /* The control: accept x with p(x), else draw from p itself (x not removed). */
            double ua = sample_rng_uniform(77, 2 * (uint64_t)i), ur = sample_rng_uniform(77, 2 * (uint64_t)i + 1);
            int32_t w = V - 1;
            if (ua < p[x]) {
                w = x;
            } else {
                double c = 0;
                for (int t = 0; t < V; t++)
                    if ((c += p[t]) > ur) {
                        w = t;
                        break;
                    }
            }
            wrong[w]++;
        }
        double tv = 0, tv_wrong = 0;
        for (int t = 0; t < V; t++) {
            tv += fabs((double)count[t] / ns[k] - p[t]) / 2;
            tv_wrong += fabs((double)wrong[t] / ns[k] - p[t]) / 2;
        }
        const double bound = 2.5 * sqrt((double)V / ns[k]);
        print_message("n=%d tv=%.5f wrong=%.5f accept=%.4f p(x)=%.4f\n", ns[k], tv, tv_wrong,
                      (double)n_acc / ns[k], p[x]);
        assert_true(tv < bound);
        assert_true(tv < prev);
        prev = tv;
        assert_true(fabs((double)n_acc / ns[k] - p[x]) < bound);
        if (k == 2)
            assert_true(tv_wrong > bound);
        sampler_destroy(&s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_accepts_the_argmax_only),
        cmocka_unit_test(test_sampled_same_tokens_as_without),
        cmocka_unit_test(test_sampled_follows_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
