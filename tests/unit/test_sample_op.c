/* tests/unit/test_sample_op.c — the backend's `sample` op (CPU, the reference for the device
 * kernels) equals the host sampler's sampler_sample on the same logits, parameters and step: many
 * random rows and parameters (greedy, temperature only, top-k, top-p, min-p, combinations, rows of
 * tied values, several rows with different parameters in one call). */
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

static uint64_t s_x = 0x1234567;
static double s_rnd(void)
{
    s_x = s_x * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(s_x >> 11) * (1.0 / 9007199254740992.0);
}

static void test_op_equals_sampler(void **state)
{
    char err[256];
    backend_t *be = backend_new("cpu", 4, err, sizeof err);
    assert_non_null(be);
    enum { ROWS = 8, MAXV = 3000 };
    float *lg = malloc((size_t)ROWS * MAXV * sizeof(float));
    assert_non_null(lg);
    int checked = 0, sampled_differ_from_argmax = 0;
    for (int trial = 0; trial < 150; trial++) {
        const int V = trial % 5 == 0 ? 1 + (int)(s_rnd() * 20) : 50 + (int)(s_rnd() * (MAXV - 50));
        const int ties = trial % 4 == 0;
        sampler_t *smp[ROWS];
        bk_sample_t sp[ROWS];
        for (int r = 0; r < ROWS; r++) {
            float *row = lg + (size_t)r * V;
            for (int i = 0; i < V; i++)
                row[i] = ties ? (float)(int)(s_rnd() * 6) : (float)(s_rnd() * 16 - 8);
            sampler_params_t p;
            sampler_params_default(&p);
            const int kind = (trial + r) % 8;
            p.temperature = kind == 0 ? 0 : 0.2 + 1.5 * s_rnd();
            if (kind == 2 || kind == 5 || kind == 7)
                p.top_k = 1 + (int)(s_rnd() * (r % 2 ? 40 : V + 10));
            if (kind == 3 || kind == 5 || kind == 6 || kind == 7)
                p.top_p = 0.01 + 0.99 * s_rnd();
            if (kind == 4 || kind == 6 || kind == 7)
                p.min_p = s_rnd() * 0.5;
            p.seed = (uint64_t)(trial * 97 + r);
            smp[r] = sampler_new(&p, V, NULL, 0, err, sizeof err);
            assert_non_null(smp[r]);
            for (int k = 0; k < (trial + r) % 4; k++)   /* the RNG counter moves with accepted tokens */
                sampler_accept(smp[r], 0);
            sampler_device_params(smp[r], &sp[r]);
            assert_int_equal(sp[r].step, (uint64_t)((trial + r) % 4));
        }
        int32_t out[ROWS];
        memset(out, 0xff, sizeof out);
        be->ops->sample(be, lg, ROWS, V, sp, out);
        for (int r = 0; r < ROWS; r++) {
            const float *row = lg + (size_t)r * V;
            int32_t want = sampler_sample(smp[r], row, NULL);
            if (out[r] != want)
                fail_msg("trial %d row %d (V %d, T %g, top_k %d, top_p %g, min_p %g): op %d, sampler %d", trial, r, V,
                         sp[r].temperature, sp[r].top_k, sp[r].top_p, sp[r].min_p, out[r], want);
            int32_t am;
            be->ops->argmax(be, row, 1, V, &am);
            if (sp[r].temperature == 0)
                assert_int_equal(out[r], am);
            else
                sampled_differ_from_argmax += out[r] != am;
            checked++;
            sampler_destroy(&smp[r]);
        }
    }
    print_message("%d rows: the op equals the sampler; %d sampled rows chose another token than the argmax\n", checked,
                  sampled_differ_from_argmax);
    assert_true(sampled_differ_from_argmax > 50);  /* the test exercises real draws */
    free(lg);
    backend_destroy(&be);
}

/* Penalties make a request host-only; filters alone do not. */
static void test_needs_host(void **state)
{
    char err[256];
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = 0.7;
    p.top_k = 5;
    p.top_p = 0.9;
    p.min_p = 0.1;
    sampler_t *s = sampler_new(&p, 10, NULL, 0, err, sizeof err);
    assert_false(sampler_needs_host(s));
    sampler_destroy(&s);
    const double pen[3][3] = {{1.1, 0, 0}, {1, 0.5, 0}, {1, 0, -0.5}};
    for (int i = 0; i < 3; i++) {
        p.repetition_penalty = pen[i][0];
        p.presence_penalty = pen[i][1];
        p.frequency_penalty = pen[i][2];
        s = sampler_new(&p, 10, NULL, 0, err, sizeof err);
        assert_true(sampler_needs_host(s));
        sampler_destroy(&s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_equals_sampler),
        cmocka_unit_test(test_needs_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
