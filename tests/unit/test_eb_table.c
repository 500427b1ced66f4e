/* tests/unit/test_eb_table.c — the expert-balancer's table: windows add up, a placement (and a new
 * epoch) comes exactly every EB_REBALANCE_WINDOWS windows per worker, it is valid and balances a
 * skewed load, bad windows are refused with a reason without changing anything, and the totals
 * age: after the hot expert changes, the placement follows the new one within a few half-lives,
 * where never-aged totals keep replicating the old one. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "actors/expert_balancer/eb_table.h"

static void test_interval_and_placement(void **state)
{
    (void)state;
    eb_table_t *t = eb_table_new();
    char err[256];
    uint64_t skew[8] = {800, 400, 200, 100, 50, 25, 12, 6}, flat[8] = {10, 10, 10, 10, 10, 10, 10, 10};
    int placed = 0;
    for (int w = 0; w < EB_REBALANCE_WINDOWS; w++)
        for (int r = 0; r < 2; r++) {
            const char *name = r ? "decode-1" : "decode-0";
            /* layer 2 first: the first layer reported (a model's first layers may be dense) clocks */
            int rc = eb_table_add(t, name, 2, skew, 8, err, sizeof err);
            assert_true(rc == 0 || rc == 1);
            placed += rc;
            assert_int_equal(eb_table_add(t, name, 3, flat, 8, err, sizeof err), 0);
            assert_int_equal(eb_table_epoch(t), (uint64_t)placed);
        }
    assert_int_equal(placed, 1);   /* 10 windows x 2 workers: exactly one placement */
    assert_int_equal(eb_table_ranks(t), 2);
    assert_int_equal(eb_table_layers(t), 4);
    int n = 0;
    const int32_t *slots = eb_table_slots(t, 2, &n);
    assert_non_null(slots);
    assert_int_equal(n, 10);       /* 8 experts + one redundant slot per rank */
    int seen[8] = {0};
    for (int i = 0; i < n; i++)
        seen[slots[i]]++;
    for (int e = 0; e < 8; e++)
        assert_true(seen[e] >= 1);
    assert_int_equal(seen[0], 2);  /* the hot expert has its replica */
    assert_true(eb_table_before(t, 2) > eb_table_after(t, 2));
    assert_true(eb_table_after(t, 3) < 1.0 + 1e-9);   /* uniform stays uniform */
    eb_table_destroy(&t);
    assert_null(t);
    eb_table_destroy(&t);
}

static void test_refusals(void **state)
{
    (void)state;
    eb_table_t *t = eb_table_new();
    char err[256];
    uint64_t c[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_null(eb_table_slots(t, 0, &(int){0}));
    assert_int_equal(eb_table_add(t, "w", 0, c, 8, err, sizeof err), 0);
    assert_int_equal(eb_table_add(t, "w", 0, c, 4, err, sizeof err), -1);   /* another expert count */
    assert_non_null(strstr(err, "expected 8"));
    assert_int_equal(eb_table_add(t, "w", EB_MAX_LAYERS, c, 8, err, sizeof err), -1);
    char name[32];
    for (int i = 1; i < EB_MAX_RANKS; i++) {
        snprintf(name, sizeof name, "w%d", i);
        assert_int_equal(eb_table_add(t, name, 1, c, 8, err, sizeof err), 0);
    }
    assert_int_equal(eb_table_add(t, "one-too-many", 1, c, 8, err, sizeof err), -1);
    assert_int_equal(eb_table_ranks(t), EB_MAX_RANKS);
    eb_table_destroy(&t);
}

/* 100 windows of experts 0 and 1 hot, then `after` windows of experts 7 and 6 hot, on a group of 2 ranks with one
 * redundant slot each (10 slots for 8 experts) and a placement every 10 windows: which experts
 * the last placement replicates (seen[e] = replicas of e). */
static void s_shift(int half_life, int after, int seen[8], double *share7)
{
    eb_table_t *t = eb_table_new_group(2, 1, 10);
    assert_non_null(t);
    assert_int_equal(eb_table_set_half_life(t, half_life), 0);
    char err[256];
    uint64_t old_hot[8] = {1000, 800, 100, 100, 100, 100, 100, 100}, new_hot[8] = {100, 100, 100, 100, 100, 100, 800, 1000};
    for (int w = 0; w < 100 + after; w++)
        assert_true(eb_table_add(t, "decode-0", 0, w < 100 ? old_hot : new_hot, 8, err, sizeof err) >= 0);
    assert_int_equal(eb_table_epoch(t), (uint64_t)(100 + after) / 10);
    int n = 0;
    const int32_t *slots = eb_table_slots(t, 0, &n);
    assert_int_equal(n, 10);
    memset(seen, 0, 8 * sizeof(int));
    for (int i = 0; i < n; i++)
        seen[slots[i]]++;
    const double *ld = eb_table_load(t, 0);
    double sum = 0;
    for (int e = 0; e < 8; e++)
        sum += ld[e];
    *share7 = ld[7] / sum;
    eb_table_destroy(&t);
}

static void test_aging_follows_a_shift(void **state)
{
    (void)state;
    int seen[8];
    double share7;
    /* Never aged: 30 windows of the new load do not outweigh 100 of the old: experts 0 and 1 keep
     * the two replicas (totals 103,000 and 83,000 against 40,000 and 34,000 for 7 and 6). */
    s_shift(0, 30, seen, &share7);
    assert_int_equal(seen[0], 2);
    assert_int_equal(seen[1], 2);
    assert_int_equal(seen[6], 1);
    assert_int_equal(seen[7], 1);
    assert_true(fabs(share7 - 40000.0 / (103000.0 + 83000.0 + 34000.0 + 40000.0 + 4 * 13000.0)) < 1e-9);
    /* Half-life 10: three half-lives after the shift, the replicas have moved to experts 7 and 6. */
    s_shift(10, 30, seen, &share7);
    assert_int_equal(seen[7], 2);
    assert_int_equal(seen[6], 2);
    assert_int_equal(seen[0], 1);
    assert_int_equal(seen[1], 1);
    assert_true(share7 > 0.3);     /* the newest windows carry 1000 of 2600 */
    /* One placement after the shift (10 windows, one half-life) is not yet enough here: the old
     * pair still outweighs the new one, so aging is gradual rather than a reset. */
    s_shift(10, 10, seen, &share7);
    assert_int_equal(seen[0], 2);
    /* One window's weight halves in half_life windows: a single old window against a new one. */
    eb_table_t *t = eb_table_new_group(1, 0, 1000);
    assert_int_equal(eb_table_set_half_life(t, 4), 0);
    char err[256];
    uint64_t a[2] = {1024, 0}, b[2] = {0, 1024}, none[2] = {0, 0};
    assert_int_equal(eb_table_add(t, "w", 0, a, 2, err, sizeof err), 0);
    for (int w = 0; w < 3; w++)
        assert_int_equal(eb_table_add(t, "w", 0, none, 2, err, sizeof err), 0);
    assert_int_equal(eb_table_add(t, "w", 0, b, 2, err, sizeof err), 0);   /* 4 windows after a's */
    assert_true(fabs(eb_table_load(t, 0)[0] - 512) < 1e-6);
    assert_true(fabs(eb_table_load(t, 0)[1] - 1024) < 1e-6);
    assert_int_equal(eb_table_set_half_life(t, -1), -1);
    assert_int_equal(eb_table_set_half_life(t, EB_MAX_HALF_LIFE + 1), -1);
    eb_table_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interval_and_placement),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_aging_follows_a_shift),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
