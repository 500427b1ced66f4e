/* tests/unit/test_eb_table.c — the expert-balancer's table: windows add up, a placement (and a new
 * epoch) comes exactly every EB_REBALANCE_WINDOWS windows per worker, it is valid and balances a
 * skewed load, and bad windows are refused with a reason without changing anything. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interval_and_placement),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
