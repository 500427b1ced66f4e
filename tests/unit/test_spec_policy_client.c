/* tests/unit/test_spec_policy_client.c — a decode worker's side of the draft-scheduler without
 * sockets: the default k until a policy arrives, the pushed policy per batch size and per row's
 * confidence while it is valid, the default again once it expired (the scheduler away), a fixed
 * worker (TROUPE_SPEC_POLICY=fixed) that ignores policies, a bad knob refused naming it, and the
 * chosen verify length in the stats. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "actors/worker/spec_policy_client.h"

static const msg_draft_bucket_t s_buckets[] = {{1, 6, 0.3f}, {16, 2, 0.6f}, {256, 0, 1.0f}};

static msg_draft_policy_t s_policy(uint32_t valid_ms)
{
    return (msg_draft_policy_t){.epoch = 3, .valid_ms = valid_ms, .max_k = 7, .buckets = s_buckets, .n_buckets = 3};
}

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_default_policy_and_expiry(void **state)
{
    (void)state;
    unsetenv("TROUPE_SPEC_POLICY");
    char err[256];
    spec_client_t *c = spec_client_new(NULL, 3, 0, err, sizeof err);
    assert_non_null(c);
    assert_false(spec_client_active(c));
    assert_int_equal(spec_client_ask(c, 1), 3);          /* no policy yet: the default */
    assert_int_equal(spec_client_max_ask(c), 3);
    assert_int_equal(spec_client_keep(c, 1, NULL, 3), 3);
    msg_draft_policy_t p = s_policy(150);
    assert_int_equal(spec_client_on_policy(c, &p, err, sizeof err), 0);
    assert_true(spec_client_active(c));
    assert_int_equal(spec_client_ask(c, 1), 6);
    assert_int_equal(spec_client_ask(c, 8), 2);
    assert_int_equal(spec_client_ask(c, 64), 0);          /* speculation off at a large batch */
    assert_int_equal(spec_client_ask(c, 5000), 0);        /* past the last bucket: the last */
    assert_int_equal(spec_client_keep(c, 8, NULL, 5), 2);
    assert_int_equal(spec_client_max_ask(c), 6);          /* the most at any batch: a step's room */
    s_sleep_ms(200);                                      /* the scheduler went away */
    assert_false(spec_client_active(c));
    assert_int_equal(spec_client_ask(c, 64), 3);
    assert_int_equal(spec_client_keep(c, 64, NULL, 3), 3);
    assert_int_equal(spec_client_max_ask(c), 3);
    /* Off at every batch: no step drafts (no draft-scheduler here: no exploration either). */
    const msg_draft_bucket_t off[] = {{16, 0, 1.0f}, {1024, 0, 1.0f}};
    const msg_draft_policy_t po = {.epoch = 4, .valid_ms = 60000, .max_k = 7, .buckets = off, .n_buckets = 2};
    assert_int_equal(spec_client_on_policy(c, &po, err, sizeof err), 0);
    assert_int_equal(spec_client_max_ask(c), 0);
    spec_client_destroy(&c);
    assert_null(c);
    spec_client_destroy(&c);
}

static void test_confidence_rows(void **state)
{
    (void)state;
    unsetenv("TROUPE_SPEC_POLICY");
    char err[256];
    spec_client_t *c = spec_client_new(NULL, 4, 1, err, sizeof err);
    msg_draft_policy_t p = s_policy(60000);
    assert_int_equal(spec_client_on_policy(c, &p, err, sizeof err), 0);
    assert_int_equal(spec_client_ask(c, 1), 7);           /* a distribution asks max_k, then trims */
    assert_int_equal(spec_client_max_ask(c), 7);
    const float sure[7] = {0.95f, 0.95f, 0.95f, 0.95f, 0.95f, 0.95f, 0.95f};
    const float unsure[7] = {0.7f, 0.4f, 0.9f, 0.9f, 0.9f, 0.9f, 0.9f};
    assert_int_equal(spec_client_keep(c, 1, sure, 7), 7);     /* 0.95^7 = 0.70 >= 0.3 */
    assert_int_equal(spec_client_keep(c, 1, unsure, 7), 1);   /* 0.7, then 0.28 < 0.3 */
    assert_int_equal(spec_client_keep(c, 16, sure, 7), 7);    /* 0.95^7 >= 0.6 */
    assert_int_equal(spec_client_keep(c, 16, unsure, 7), 1);
    assert_int_equal(spec_client_keep(c, 200, sure, 7), 0);   /* break-even 1: nothing is sure enough */
    spec_client_verified(c, 3, 1, sure);
    spec_client_step(c, 1, 3, 2, 0.01);
    spec_client_destroy(&c);
}

static void test_fixed_and_bad_knob(void **state)
{
    (void)state;
    char err[256];
    setenv("TROUPE_SPEC_POLICY", "fixed", 1);
    spec_client_t *c = spec_client_new(NULL, 5, 0, err, sizeof err);
    assert_non_null(c);
    msg_draft_policy_t p = s_policy(60000);
    assert_int_equal(spec_client_on_policy(c, &p, err, sizeof err), 0);
    assert_false(spec_client_active(c));
    assert_int_equal(spec_client_ask(c, 64), 5);
    spec_client_destroy(&c);
    setenv("TROUPE_SPEC_POLICY", "sometimes", 1);
    assert_null(spec_client_new(NULL, 5, 0, err, sizeof err));
    assert_non_null(strstr(err, "TROUPE_SPEC_POLICY 'sometimes'"));
    unsetenv("TROUPE_SPEC_POLICY");
    /* more buckets than a worker holds: refused, the previous policy stays */
    c = spec_client_new(NULL, 5, 0, err, sizeof err);
    assert_int_equal(spec_client_on_policy(c, &p, err, sizeof err), 0);
    msg_draft_bucket_t many[SPEC_COST_BATCHES + 1];
    for (int i = 0; i <= SPEC_COST_BATCHES; i++)
        many[i] = (msg_draft_bucket_t){.max_batch = (uint32_t)i + 1, .max_draft = 1};
    msg_draft_policy_t q = {.epoch = 4, .valid_ms = 60000, .max_k = 7, .buckets = many,
                            .n_buckets = SPEC_COST_BATCHES + 1};
    assert_int_equal(spec_client_on_policy(c, &q, err, sizeof err), -1);
    assert_non_null(strstr(err, "draft_policy.buckets"));
    assert_int_equal(spec_client_ask(c, 1), 6);
    spec_client_destroy(&c);
}

/* TROUPE_SPEC_EXPLORE_SHARE: the exploration budget's share of decode time, SPEC_EXPLORE_SHARE
 * unset; a share outside (0, 1] or not a number refuses the worker, naming the variable (0 would
 * never explore, so the policy could never turn drafting on). */
static void test_explore_share_knob(void **state)
{
    (void)state;
    char err[256];
    double share = -1;
    unsetenv("TROUPE_SPEC_EXPLORE_SHARE");
    assert_int_equal(spec_client_explore_share_from_env(&share, err, sizeof err), 0);
    assert_true(share == SPEC_EXPLORE_SHARE);
    setenv("TROUPE_SPEC_EXPLORE_SHARE", "0.05", 1);
    assert_int_equal(spec_client_explore_share_from_env(&share, err, sizeof err), 0);
    assert_true(share == 0.05);
    static const char *const bad[] = {"0", "-0.01", "1.5", "one", "0.01x", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("TROUPE_SPEC_EXPLORE_SHARE", bad[i], 1);
        assert_int_equal(spec_client_explore_share_from_env(&share, err, sizeof err), -1);
        assert_non_null(strstr(err, "TROUPE_SPEC_EXPLORE_SHARE"));
        assert_null(spec_client_new(NULL, 4, 1, err, sizeof err));
        assert_non_null(strstr(err, bad[i]));
    }
    unsetenv("TROUPE_SPEC_EXPLORE_SHARE");
    spec_client_t *c = spec_client_new(NULL, 4, 1, err, sizeof err);
    assert_non_null(c);
    spec_client_cycle(c, 1, 1e-3);   /* fed whether or not a scheduler is there to explore for */
    spec_client_destroy(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_policy_and_expiry),
        cmocka_unit_test(test_confidence_rows),
        cmocka_unit_test(test_fixed_and_bad_knob),
        cmocka_unit_test(test_explore_share_knob),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
