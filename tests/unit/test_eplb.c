/* tests/unit/test_eplb.c — the expert placement: valid placements (every expert has a replica,
 * each rank exactly its slots, no rank with two replicas of one expert), balance on skewed load,
 * uniform load stays uniform, hierarchical packing keeps replicas on their node, edge cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine/eplb.h"

/* Checks the eplb.h contract of one placement; returns the busiest/average ratio. */
static double s_check(const double *load, int E, int R, int S, const int32_t *slot)
{
    int cnt[256] = {0};
    const int cap = S / R;
    for (int s = 0; s < S; s++) {
        assert_true(slot[s] >= 0 && slot[s] < E);
        cnt[slot[s]]++;
        for (int t = (s / cap) * cap; t < s; t++)   /* no rank holds an expert twice */
            assert_int_not_equal(slot[t], slot[s]);
    }
    for (int e = 0; e < E; e++)
        assert_true(cnt[e] >= 1);
    double r = eplb_imbalance(load, E, R, S, slot, NULL);
    assert_true(r >= 1.0);
    return r;
}

static void test_skewed_balances(void **state)
{
    (void)state;
    /* A Zipf-like skew over 16 experts: one expert carries ~a quarter of the tokens. */
    double load[16];
    for (int e = 0; e < 16; e++)
        load[e] = 1000.0 / (1 + e);
    int32_t ident[16], slot[20];
    eplb_identity(16, ident);
    double before = s_check(load, 16, 4, 16, ident);
    char err[256];
    assert_int_equal(eplb_place(load, 16, 4, 1, 20, slot, err, sizeof err), 0);
    double after = s_check(load, 16, 4, 20, slot);
    assert_true(before > 1.5);
    assert_true(after < 1.1);
    assert_true(after < before);
}

static void test_uniform_stays_uniform(void **state)
{
    (void)state;
    double load[16];
    for (int e = 0; e < 16; e++)
        load[e] = 100;
    int32_t slot[16];
    char err[256];
    assert_int_equal(eplb_place(load, 16, 4, 1, 16, slot, err, sizeof err), 0);
    assert_true(s_check(load, 16, 4, 16, slot) < 1.0 + 1e-9);
}

static void test_hierarchical_keeps_node(void **state)
{
    (void)state;
    double load[16];
    for (int e = 0; e < 16; e++)
        load[e] = (e * 37 % 11) + 1 + (e == 3 ? 60 : 0);
    int32_t slot[32];
    char err[256];
    assert_int_equal(eplb_place(load, 16, 8, 2, 32, slot, err, sizeof err), 0);
    s_check(load, 16, 8, 32, slot);
    /* every expert's replicas all sit on one node (slots 0-15 node 0, 16-31 node 1) */
    for (int e = 0; e < 16; e++) {
        int on[2] = {0, 0};
        for (int s = 0; s < 32; s++)
            on[s / 16] += slot[s] == e;
        assert_true(on[0] == 0 || on[1] == 0);
    }
}

static void test_edges(void **state)
{
    (void)state;
    double load[4] = {10, 1, 1, 1};
    int32_t slot[16];
    char err[256];
    /* one rank: every slot on it, each expert once */
    assert_int_equal(eplb_place(load, 4, 1, 1, 4, slot, err, sizeof err), 0);
    s_check(load, 4, 1, 4, slot);
    /* more slots than experts: the hot one gets a replica on every rank */
    assert_int_equal(eplb_place(load, 4, 4, 1, 8, slot, err, sizeof err), 0);
    s_check(load, 4, 4, 8, slot);
    int hot = 0;
    for (int s = 0; s < 8; s++)
        hot += slot[s] == 0;
    assert_true(hot >= 3);
    /* every slot of every rank filled: 4 experts x 4 ranks */
    assert_int_equal(eplb_place(load, 4, 4, 1, 16, slot, err, sizeof err), 0);
    s_check(load, 4, 4, 16, slot);
    /* zero load */
    double zero[4] = {0, 0, 0, 0};
    assert_int_equal(eplb_place(zero, 4, 2, 1, 4, slot, err, sizeof err), 0);
    assert_true(s_check(zero, 4, 2, 4, slot) == 1.0);
    /* refusals, each with a reason */
    assert_int_equal(eplb_place(load, 4, 4, 1, 20, slot, err, sizeof err), -1);   /* 5 replicas of one on 4 ranks */
    assert_int_equal(eplb_place(load, 4, 3, 1, 8, slot, err, sizeof err), -1);    /* 8 slots over 3 ranks */
    assert_int_equal(eplb_place(load, 4, 2, 1, 2, slot, err, sizeof err), -1);    /* fewer slots than experts */
    double bad[4] = {1, -1, 1, 1};
    assert_int_equal(eplb_place(bad, 4, 2, 1, 4, slot, err, sizeof err), -1);
    int32_t missing[4] = {0, 0, 1, 2};
    assert_true(eplb_imbalance(load, 4, 2, 4, missing, NULL) < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skewed_balances),
        cmocka_unit_test(test_uniform_stays_uniform),
        cmocka_unit_test(test_hierarchical_keeps_node),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
