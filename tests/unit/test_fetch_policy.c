/* fetch_policy: fetch or recompute a prompt's cached blocks, by measured costs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "actors/worker/fetch_policy.h"

static void test_fetches_until_measured(void **state)
{
    fetch_policy_t fp = {0};
    assert_int_equal(fetch_policy_decide(&fp, 8, 16, 30000), 1);   /* no fetch measured yet */
    assert_int_equal(fetch_policy_decide(&fp, 8, 16, 0), 1);       /* compute rate unknown */
    assert_int_equal(fetch_policy_decide(&fp, 0, 16, 30000), 0);   /* nothing to fetch */
}

static void test_gpu_recomputes_a_short_answer(void **state)
{
    fetch_policy_t fp = {0};
    fetch_policy_observe(&fp, 70, 14.0);   /* 0.2 ms a block */
    /* 8 blocks of 16 tokens at 32K tokens/s: 4 ms to compute, 1 + 1.6 ms to fetch */
    assert_int_equal(fetch_policy_decide(&fp, 8, 16, 32000), 1);
    fetch_policy_observe(&fp, 8, 40.0);    /* that one waited for a write-back: the average is 1.4 ms */
    assert_int_equal(fetch_policy_decide(&fp, 8, 16, 32000), 0);
    /* a long prefix still pays on a slow compute rate */
    assert_int_equal(fetch_policy_decide(&fp, 64, 16, 500), 1);
}

static void test_cpu_always_fetches(void **state)
{
    fetch_policy_t fp = {0};
    fetch_policy_observe(&fp, 4, 20.0);   /* 5 ms a block */
    for (int i = 0; i < 100; i++)
        assert_int_equal(fetch_policy_decide(&fp, 4, 16, 200), 1);   /* 80 ms a block to compute */
}

static void test_explores_after_a_run_of_recomputes(void **state)
{
    fetch_policy_t fp = {0};
    fetch_policy_observe(&fp, 1, 100.0);
    int fetched = 0, first = -1;
    for (int i = 0; i < 2 * FETCH_EXPLORE; i++)
        if (fetch_policy_decide(&fp, 2, 16, 32000)) {
            fetched++;
            if (first < 0)
                first = i;
        }
    assert_int_equal(fetched, 2);
    assert_int_equal(first, FETCH_EXPLORE - 1);
}

static void test_always(void **state)
{
    fetch_policy_t fp = {.always = 1};
    fetch_policy_observe(&fp, 1, 100.0);
    for (int i = 0; i < 10; i++)
        assert_int_equal(fetch_policy_decide(&fp, 2, 16, 32000), 1);
}

static void test_average_moves_toward_new_samples(void **state)
{
    fetch_policy_t fp = {0};
    fetch_policy_observe(&fp, 10, 10.0);
    assert_true(fp.ms_per_block > 0.99 && fp.ms_per_block < 1.01);
    fetch_policy_observe(&fp, 10, 50.0);
    assert_true(fp.ms_per_block > 1.99 && fp.ms_per_block < 2.01);
    fetch_policy_observe(&fp, 0, 50.0);   /* ignored */
    assert_true(fp.ms_per_block > 1.99 && fp.ms_per_block < 2.01);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fetches_until_measured),
        cmocka_unit_test(test_gpu_recomputes_a_short_answer),
        cmocka_unit_test(test_cpu_always_fetches),
        cmocka_unit_test(test_explores_after_a_run_of_recomputes),
        cmocka_unit_test(test_always),
        cmocka_unit_test(test_average_moves_toward_new_samples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
