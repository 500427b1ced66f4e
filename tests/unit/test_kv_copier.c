/* The write-back copier: blocks land intact in their segments, jobs come back in submission order,
 * a full ring refuses, drain waits for every job, and destroy with jobs outstanding leaks nothing
 * (make test-asan). Runs on the CPU backend, whose download_side is a memcpy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "transfer/kv_copier.h"
#include "transfer/shm_chan.h"

#define BB 4096   /* bytes per block */

static uint8_t *s_pool(int n)
{
    uint8_t *p = malloc((size_t)n * BB);
    for (size_t i = 0; i < (size_t)n * BB; i++)
        p[i] = (uint8_t)(i * 131 + i / BB);
    return p;
}

static void test_blocks_intact_in_order(void **st)
{
    backend_t *be = backend_cpu_new(1);
    uint8_t *pool = s_pool(16);
    kvcopier_t *c = kvcopier_new(be, "unitcp", BB, 4);
    assert_non_null(c);
    /* Job t copies blocks (t + 3*i) % 16: scattered, not in pool order. */
    for (int t = 0; t < 3; t++) {
        const void *src[5];
        for (int i = 0; i < 5; i++)
            src[i] = pool + (size_t)((t + 3 * i) % 16) * BB;
        assert_int_equal(kvcopier_submit(c, 100 + (uint64_t)t, src, 5, (void *)(intptr_t)(t + 1)), 0);
    }
    kvcopier_drain(c);
    assert_int_equal(kvcopier_pending(c), 3);
    for (int t = 0; t < 3; t++) {
        kvcopier_done_t d;
        assert_int_equal(kvcopier_poll(c, &d), 1);
        assert_int_equal(d.ok, 1);
        assert_int_equal((intptr_t)d.cookie, t + 1);
        assert_int_equal(d.transfer_id, 100 + (uint64_t)t);
        assert_int_equal(d.seg.bytes, 5 * BB);
        for (int i = 0; i < 5; i++)
            assert_memory_equal((uint8_t *)d.seg.ptr + (size_t)i * BB, pool + (size_t)((t + 3 * i) % 16) * BB, BB);
        tchan_shm_close(&d.seg);
    }
    kvcopier_done_t d;
    assert_int_equal(kvcopier_poll(c, &d), 0);
    assert_int_equal(kvcopier_pending(c), 0);
    kvcopier_destroy(&c);
    assert_null(c);
    free(pool);
    backend_destroy(&be);
}

static void test_full_ring_refuses(void **st)
{
    backend_t *be = backend_cpu_new(1);
    uint8_t *pool = s_pool(2);
    kvcopier_t *c = kvcopier_new(be, "unitcp", BB, 2);
    const void *src[1] = {pool};
    assert_int_equal(kvcopier_submit(c, 1, src, 1, NULL), 0);
    assert_int_equal(kvcopier_submit(c, 2, src, 1, NULL), 0);
    /* Done or not, both occupy the ring until polled. */
    assert_int_equal(kvcopier_submit(c, 3, src, 1, NULL), -1);
    kvcopier_drain(c);
    assert_int_equal(kvcopier_submit(c, 3, src, 1, NULL), -1);
    kvcopier_done_t d;
    assert_int_equal(kvcopier_poll(c, &d), 1);
    tchan_shm_close(&d.seg);
    assert_int_equal(kvcopier_submit(c, 3, src, 1, NULL), 0);
    /* Destroy with two jobs outstanding: their segments are closed (asan: nothing leaks). */
    kvcopier_destroy(&c);
    free(pool);
    backend_destroy(&be);
}

static void test_failed_job_reports(void **st)
{
    backend_t *be = backend_cpu_new(1);
    uint8_t *pool = s_pool(1);
    kvcopier_t *c = kvcopier_new(be, "unitcp", BB, 2);
    const void *src[1] = {pool};
    /* Two jobs with the same transfer id: the second segment's name is taken, so it fails. */
    assert_int_equal(kvcopier_submit(c, 7, src, 1, NULL), 0);
    assert_int_equal(kvcopier_submit(c, 7, src, 1, NULL), 0);
    kvcopier_drain(c);
    kvcopier_done_t a, b;
    assert_int_equal(kvcopier_poll(c, &a), 1);
    assert_int_equal(kvcopier_poll(c, &b), 1);
    assert_int_equal(a.ok, 1);
    assert_int_equal(b.ok, 0);
    assert_null(b.seg.ptr);
    assert_true(strlen(b.err) > 0);
    tchan_shm_close(&a.seg);
    kvcopier_destroy(&c);
    free(pool);
    backend_destroy(&be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_intact_in_order),
        cmocka_unit_test(test_full_ring_refuses),
        cmocka_unit_test(test_failed_job_reports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
