/* The cache-manager's device-tier index (actors/cache/dev_index.h): a worker's entries stay within
 * its pool whatever it announces, a hash it announces again stays, an eviction or the worker's end
 * removes its entries, and every hash that leaves is handed to the callback exactly once. Before
 * the index bounded them, the cache-manager kept every hash ever announced (a 30-minute nemesis:
 * about a million, 38 MB). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "actors/cache/dev_index.h"
#include "common/u64map.h"

typedef struct {
    u64map_t gone;                  /* hash -> times withdrawn */
    uint64_t n;
    int last_worker;
} gone_log_t;

static void s_gone(void *arg, int w, const uint64_t *hashes, uint32_t n)
{
    gone_log_t *g = arg;
    assert_true(n >= 1 && n <= 512);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t *v = u64map_get(&g->gone, hashes[i]);
        u64map_put(&g->gone, hashes[i], (v ? *v : 0) + 1);
    }
    g->n += n;
    g->last_worker = w;
}

static uint64_t s_hash(uint64_t i) { return i * 0x9e3779b97f4a7c15ULL + 1; }

/* 100,000 distinct hashes announced by a worker of a 1,000-block pool, 3 per put as a prompt's
 * blocks come: the index never holds more than the pool plus a put, and what it dropped went to
 * the callback once each. */
static void test_bounded_by_the_pool(void **st)
{
    devidx_t *x = devidx_new(2, 4096);
    assert_non_null(x);
    gone_log_t g = {0};
    size_t most = 0;
    for (uint64_t i = 0; i < 100000; i += 3) {
        uint64_t h[3] = {s_hash(i), s_hash(i + 1), s_hash(i + 2)};
        assert_int_equal(devidx_put(x, 1, h, 3, 1000, s_gone, &g), 0);
        if (devidx_held(x, 1) > most)
            most = devidx_held(x, 1);
    }
    assert_true(most <= 1000);
    assert_true(devidx_held(x, 1) >= 500);   /* the newest half a pool at least */
    assert_int_equal(devidx_size(x), devidx_held(x, 1));
    assert_int_equal(g.n + devidx_held(x, 1), 100002);
    assert_int_equal(g.gone.n, g.n);            /* none twice */
    assert_int_equal(devidx_withdrawn(x), g.n);
    assert_int_equal(g.last_worker, 1);
    assert_int_equal(devidx_holders(x, s_hash(100001)), 1u << 1);   /* the newest is there */
    assert_int_equal(devidx_holders(x, s_hash(0)), 0);              /* the oldest is not */
    assert_int_equal(devidx_held(x, 0), 0);
    u64map_free(&g.gone);
    devidx_destroy(&x);
    assert_null(x);
}

/* A prefix every request shares (a system prompt) is announced with each of them: it is never
 * withdrawn however many other hashes pass. */
static void test_hot_hash_stays(void **st)
{
    devidx_t *x = devidx_new(1, 4096);
    gone_log_t g = {0};
    const uint64_t hot = s_hash(7777777);
    for (uint64_t i = 0; i < 20000; i++) {
        uint64_t h[2] = {hot, s_hash(i)};
        assert_int_equal(devidx_put(x, 0, h, 2, 64, s_gone, &g), 0);
        assert_int_equal(devidx_holders(x, hot), 1);
        assert_true(devidx_held(x, 0) <= 64);
    }
    assert_null(u64map_get(&g.gone, hot));
    u64map_free(&g.gone);
    devidx_destroy(&x);
}

/* Two workers share a hash: one's end removes only its bit; the other's entries stay. An eviction
 * removes a hash without a callback (the cache-manager tells the routers itself). */
static void test_forget_and_evict(void **st)
{
    devidx_t *x = devidx_new(3, 4096);
    gone_log_t g = {0};
    uint64_t a[4] = {s_hash(1), s_hash(2), s_hash(3), s_hash(4)}, b[2] = {s_hash(3), s_hash(9)};
    assert_int_equal(devidx_put(x, 0, a, 4, 0, s_gone, &g), 0);
    assert_int_equal(devidx_put(x, 2, b, 2, 0, s_gone, &g), 0);
    assert_int_equal(devidx_size(x), 5);
    assert_int_equal(devidx_holders(x, s_hash(3)), (1u << 0) | (1u << 2));
    assert_int_equal(g.n, 0);   /* the default pool (4,096) holds them all */
    devidx_forget(x, 0, s_gone, &g);
    assert_int_equal(g.n, 4);
    assert_int_equal(devidx_held(x, 0), 0);
    assert_int_equal(devidx_holders(x, s_hash(3)), 1u << 2);
    assert_int_equal(devidx_holders(x, s_hash(1)), 0);
    assert_int_equal(devidx_size(x), 2);
    devidx_evict(x, 2, b, 1);
    assert_int_equal(devidx_holders(x, s_hash(3)), 0);
    assert_int_equal(devidx_held(x, 2), 1);
    assert_int_equal(devidx_size(x), 1);
    /* A worker that restarts many times: each incarnation's hashes go with it. */
    for (uint64_t k = 0; k < 200; k++) {
        uint64_t h[8];
        for (int i = 0; i < 8; i++)
            h[i] = s_hash(1000 + k * 8 + (uint64_t)i);
        assert_int_equal(devidx_put(x, 1, h, 8, 0, s_gone, &g), 0);
        devidx_forget(x, 1, s_gone, &g);
    }
    assert_int_equal(devidx_size(x), 1);
    assert_int_equal(devidx_put(x, 3, a, 1, 0, s_gone, &g), -1);   /* no such worker */
    assert_null(devidx_new(65, 4096));
    assert_null(devidx_new(1, 1));
    u64map_free(&g.gone);
    devidx_destroy(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounded_by_the_pool),
        cmocka_unit_test(test_hot_hash_stays),
        cmocka_unit_test(test_forget_and_evict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
