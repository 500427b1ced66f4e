/* tests/unit/test_expert_apply.c — expert placements on the wire: the balancer's slot tables as
 * expert_placement replica lists and back give every rank the same experts (in ascending order);
 * messages a group cannot take are refused naming the field; a group's balancer table counts only
 * its leader's windows and places every interval with its redundant slots. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/expert_balancer/eb_table.h"
#include "actors/worker/expert_apply.h"
#include "engine/eplb.h"

#define L 3
#define E 8
#define R 4
#define S (E + R)

static void s_table(int32_t *slots)
{
    char err[256];
    for (int l = 0; l < L; l++) {
        double load[E];
        for (int e = 0; e < E; e++)
            load[e] = 1.0 + ((e * 5 + l) % E) * (e % 3 == 0 ? 7.0 : 1.0);
        assert_int_equal(eplb_place(load, E, R, 1, S, slots + l * S, err, sizeof err), 0);
    }
}

static msg_expert_placement_t s_msg(const int32_t *slots, uint32_t **off, uint32_t **rep, const char **workers)
{
    uint32_t n = 0;
    assert_int_equal(expert_placement_encode(slots, L, E, S, R, off, rep, &n), 0);
    assert_int_equal(n, L * S);
    static const char *const names[R] = {"d/0", "d/1", "d/2", "d/3"};
    for (int r = 0; r < R; r++)
        workers[r] = names[r];
    return (msg_expert_placement_t){.epoch = 3, .n_layers = L, .n_experts = E, .offsets = *off,
                                    .n_offsets = L * E + 1, .replicas = *rep, .n_replicas = n, .workers = workers,
                                    .n_workers = R};
}

static void test_round_trip(void **state)
{
    (void)state;
    int32_t slots[L * S], *back = NULL;
    uint32_t *off, *rep;
    const char *workers[R];
    s_table(slots);
    msg_expert_placement_t m = s_msg(slots, &off, &rep, workers);
    const uint8_t is_moe[L] = {1, 0, 1};
    char err[256];
    int ns = 0;
    assert_int_equal(expert_placement_decode(&m, R, L, E, is_moe, &back, &ns, err, sizeof err), 0);
    assert_int_equal(ns, S);
    for (int l = 0; l < L; l++)
        for (int r = 0; r < R; r++)
            for (int e = 0; e < E; e++) {   /* the same experts on each rank */
                int a = 0, b = 0;
                for (int i = 0; i < S / R; i++) {
                    a += slots[l * S + r * (S / R) + i] == e;
                    b += back[l * S + r * (S / R) + i] == e;
                }
                assert_int_equal(a, b);
            }
    free(back);
    /* A model with a fourth, MoE layer the message does not cover; another group size; experts. */
    const uint8_t four[4] = {1, 0, 1, 1};
    assert_int_equal(expert_placement_decode(&m, R, 4, E, four, &back, &ns, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer 3 is an MoE layer"));
    assert_int_equal(expert_placement_decode(&m, 2, L, E, is_moe, &back, &ns, err, sizeof err), -1);
    assert_non_null(strstr(err, "expert_placement.workers: 4 ranks, this group has 2"));
    assert_int_equal(expert_placement_decode(&m, R, L, 16, is_moe, &back, &ns, err, sizeof err), -1);
    assert_non_null(strstr(err, "expert_placement.n_experts"));
    rep[0] = 9;
    assert_int_equal(expert_placement_decode(&m, R, L, E, is_moe, &back, &ns, err, sizeof err), -1);
    assert_non_null(strstr(err, "expert_placement.replicas[0]: rank 9 of 4"));
    rep[0] = rep[1] = rep[2] = rep[3] = 0;   /* expert 0 four times on rank 0: too many slots there */
    for (uint32_t i = 4; i < m.n_replicas && i < 12; i++)
        rep[i] = 0;
    assert_int_equal(expert_placement_decode(&m, R, L, E, is_moe, &back, &ns, err, sizeof err), -1);
    assert_non_null(strstr(err, "more than 3 slots"));
    free(off);
    free(rep);
}

static void test_group_table(void **state)
{
    (void)state;
    eb_table_t *t = eb_table_new_group(2, 1, 3);
    assert_non_null(t);
    assert_null(eb_table_new_group(0, 1, 3));
    uint64_t c[E] = {90, 5, 5, 5, 5, 5, 5, 80};
    char err[256];
    /* Both ranks send windows (each counts its own requests' routing) and they add up; a placement
     * comes every 3 windows per rank: at the sixth window of the clock layer. */
    assert_int_equal(eb_table_add(t, "decode-0", 0, c, E, err, sizeof err), 0);
    assert_int_equal(eb_table_add(t, "decode-1", 0, c, E, err, sizeof err), 0);
    assert_int_equal(eb_table_add(t, "decode-0", 1, c, E, err, sizeof err), 0);   /* not the clock layer */
    for (int i = 0; i < 3; i++)
        assert_int_equal(eb_table_add(t, i % 2 ? "decode-0" : "decode-1", 0, c, E, err, sizeof err), 0);
    assert_int_equal(eb_table_add(t, "decode-1", 0, c, E, err, sizeof err), 1);   /* sixth window: placed */
    assert_int_equal(eb_table_epoch(t), 1);
    assert_int_equal(eb_table_ranks(t), 2);
    int ns = 0;
    const int32_t *p = eb_table_slots(t, 0, &ns);
    assert_non_null(p);
    assert_int_equal(ns, E + 2);   /* one redundant slot per rank */
    assert_true(eb_table_after(t, 0) < eb_table_before(t, 0));
    eb_table_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_round_trip), cmocka_unit_test(test_group_table)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
