/* fetch_policy: fetch or recompute a prompt's cached blocks, by measured costs; read the blocks
 * only the disk tier holds or compute them, and how long the fetch and the prompt wait. */
#include <math.h>
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

/* The disk tier's side (fetch_disk_wait_ms), with the H200 figures of docs/kv-cache.md: a 2 MiB
 * block of the 8B shape computes in 16 / 27000 s = 0.59 ms; a 1.4 GiB/s disk reads one in 1.4 ms,
 * an NVMe drive at 7 GB/s in 0.3 ms. */
static void test_fast_disk_is_read_and_waited_for(void **state)
{
    const double wait = fetch_disk_wait_ms(500, 0.3, 0.59);
    /* its expected read time (150 ms) with the margin, not a fixed time */
    assert_true(wait > 0);
    assert_true(wait >= FETCH_DISK_FIXED_MS + FETCH_DISK_MARGIN * 150 - 0.01);
    assert_true(wait <= FETCH_DISK_FIXED_MS + FETCH_DISK_MARGIN * 150 + 0.01);
    /* a longer prefix waits longer, up to the bound */
    assert_true(fetch_disk_wait_ms(1000, 0.3, 0.59) > wait);
    assert_true(fetch_disk_wait_ms(1000000, 0.3, 0.59) <= FETCH_DISK_MAX_MS);
    assert_true(fetch_disk_wait_ms(0, 0.3, 0.59) == 0);   /* nothing on disk: no wait */
}

static void test_slow_disk_is_recomputed(void **state)
{
    /* 1.4 ms a block to read against 0.59 to compute: not read, whatever the length */
    assert_true(fetch_disk_wait_ms(500, 1.4, 0.59) == 0);
    assert_true(fetch_disk_wait_ms(1, 1.4, 0.59) == 0);
    /* the same disk pays for a worker that computes slowly (a CPU: 16 ms a block) */
    assert_true(fetch_disk_wait_ms(500, 1.4, 16) > 0);
    /* TROUPE_PREFILL_FETCH=always: any disk is read, within the bound */
    const fetch_policy_t always = {.always = 1};
    const double budget = fetch_policy_budget_ms(&always, 16, 27000);
    assert_true(budget == FETCH_ALWAYS_BUDGET_MS);
    const double wait = fetch_disk_wait_ms(500, 1.4, budget);
    assert_true(wait >= FETCH_DISK_MARGIN * 700 && wait <= FETCH_DISK_FIXED_MS + FETCH_DISK_MARGIN * 700 + 0.01);
}

static void test_unmeasured_disk_waits_at_most_the_compute_time(void **state)
{
    /* after a restart nothing is measured: the wait is what computing the blocks takes (with the
     * margin), so reading them cannot lose more than that */
    const double wait = fetch_disk_wait_ms(500, 0, 0.59);
    assert_true(wait > 0 && wait <= FETCH_DISK_FIXED_MS + FETCH_DISK_MARGIN * 500 * 0.59 + 0.01);
    /* the first reads measure the disk: a slow one ends the wait (the cache-manager then answers
     * with the leading blocks that arrived), a fast one shortens it */
    assert_true(fetch_disk_wait_ms(500, 1.4, 0.59) == 0);
    assert_true(fetch_disk_wait_ms(500, 0.3, 0.59) < wait);
    /* a worker whose rate is unknown: read, within FETCH_DISK_UNKNOWN_MS */
    assert_true(fetch_disk_wait_ms(500, 0, 0) == FETCH_DISK_UNKNOWN_MS);
    assert_true(fetch_disk_wait_ms(500, 1.4, 0) == FETCH_DISK_UNKNOWN_MS);
    assert_true(fetch_disk_wait_ms(2, 1.4, 0) < FETCH_DISK_UNKNOWN_MS);
}

static void test_budget_is_compute_less_the_host_fetch(void **state)
{
    fetch_policy_t fp = {0};
    assert_true(fetch_policy_budget_ms(&fp, 16, 0) == 0);   /* rate unknown */
    const double c = 1000.0 * 16 / 27000;
    assert_true(fabs(fetch_policy_budget_ms(&fp, 16, 27000) - c) < 1e-9);   /* no fetch measured */
    fetch_policy_observe(&fp, 10, 2.0);                                        /* 0.2 ms a block */
    assert_true(fabs(fetch_policy_budget_ms(&fp, 16, 27000) - (c - 0.2)) < 1e-9);
    fetch_policy_observe(&fp, 1, 100.0);   /* a host fetch slower than computing: a token budget */
    const double b = fetch_policy_budget_ms(&fp, 16, 27000);
    assert_true(b > 0 && b <= c / 100 + 1e-12);
}

/* Partial use at the deadline: the cache-manager answers when its wait ends with the leading
 * blocks that arrived; that answer is used only if the worker still holds the prompt then. The
 * hold covers every wait the cache-manager can choose for the fetch's budget (any disk it would
 * read, measured or not) with the copies on top. */
static void test_hold_outlasts_every_disk_wait(void **state)
{
    fetch_policy_t fp = {0};
    const fetch_policy_t always = {.always = 1};
    const double budgets[] = {0, 0.05, 0.59, 16, fetch_policy_budget_ms(&always, 16, 27000)};
    const int lengths[] = {1, 8, 500, 16384};
    for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++)
        for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
            const int n = lengths[l];
            const fetch_policy_t *p = b == 4 ? &always : &fp;
            const double hold = fetch_policy_hold_ms(p, n, 2.0, budgets[b]);
            const double copies = 2.0 * n * 2.0 * FETCH_COPY_MS_PER_MIB;
            assert_true(hold >= FETCH_HOLD_MIN_MS);
            for (double d = 0; d <= 64; d = d > 0 ? d * 1.5 : 0.001) {
                const double wait = fetch_disk_wait_ms(n, d, budgets[b]);
                if (wait + 100 + copies > hold)   /* + the cache-manager's 100 ms timer */
                    fail_msg("budget %g, %d blocks, disk %g ms a block: wait %g + copies %g > hold %g", budgets[b],
                             n, d, wait, copies, hold);
            }
        }
    /* the 700 ms that the 8B prefix took from a 1.4 GiB/s disk fits the hold of always */
    assert_true(fetch_policy_hold_ms(&always, 500, 2.0, FETCH_ALWAYS_BUDGET_MS) > 700 + 2000);
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
        cmocka_unit_test(test_fast_disk_is_read_and_waited_for),
        cmocka_unit_test(test_slow_disk_is_recomputed),
        cmocka_unit_test(test_unmeasured_disk_waits_at_most_the_compute_time),
        cmocka_unit_test(test_budget_is_compute_less_the_host_fetch),
        cmocka_unit_test(test_hold_outlasts_every_disk_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
