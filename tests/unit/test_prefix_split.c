/* prefix_fetch_split: a prompt's cached tokens by source (the worker's pool, the host store's
 * memory, its disk), from the blocks its fetch took and the fetch reply's disk mask. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "actors/worker/prefix_fetch.h"

#define BS 16

/* The reply of a fetch that found `found` blocks, those in disk[] read back from disk. */
static msg_cache_fetch_reply_t s_reply(uint32_t found, const int *disk, int n_disk, uint64_t *mask)
{
    const uint32_t words = (found + 63) / 64;
    memset(mask, 0, words * sizeof *mask);
    for (int i = 0; i < n_disk; i++)
        mask[disk[i] / 64] |= 1ull << (disk[i] % 64);
    msg_cache_fetch_reply_t r = {.found = found, .transfer_id = 1, .found_disk = (uint32_t)n_disk,
                                 .disk_mask = mask, .n_disk_mask = n_disk ? words : 0};
    return r;
}

static void test_no_fetch_is_all_device(void **state)
{
    fetch_src_t fs = {0};
    uint32_t host = 9, disk = 9;
    prefix_fetch_split(&fs, 5 * BS, BS, &host, &disk);
    assert_int_equal(host, 0);
    assert_int_equal(disk, 0);
}

/* Blocks 0-1 were in the pool; the fetch brought 2-6, of which 2 and 3 from disk (a conversation's
 * history spilled, its last answer still in memory). */
static void test_disk_head_host_tail(void **state)
{
    uint64_t mask[1];
    const int d[] = {0, 1};
    msg_cache_fetch_reply_t r = s_reply(5, d, 2, mask);
    fetch_src_t fs = {.from = 2};
    prefix_fetch_on_reply(&fs, &r);
    mask[0] = ~0ull;   /* the worker keeps its own copy */
    fs.got = 5;
    uint32_t host, disk;
    prefix_fetch_split(&fs, 7 * BS, BS, &host, &disk);
    assert_int_equal(disk, 2 * BS);
    assert_int_equal(host, 3 * BS);   /* device: 2 blocks */
    /* The prompt's last block is never adopted (its last token must be computed): a fetch of every
     * full block of a prompt that is a multiple of the block size has one block unused, and the
     * split counts only what was adopted. */
    prefix_fetch_split(&fs, 6 * BS, BS, &host, &disk);
    assert_int_equal(disk, 2 * BS);
    assert_int_equal(host, 2 * BS);
    /* The pool gave back blocks before the prompt ran (its prefix broke at block 1): all device. */
    prefix_fetch_split(&fs, 1 * BS, BS, &host, &disk);
    assert_int_equal(host + disk, 0);
    fetch_src_clear(&fs);
    assert_null(fs.disk_mask);
    fetch_src_clear(&fs);   /* idempotent */
}

/* Memory first, then blocks read from disk; the pool took only the first 3 (no more room). */
static void test_taken_run_bounds_it(void **state)
{
    uint64_t mask[1];
    const int d[] = {2, 3};
    msg_cache_fetch_reply_t r = s_reply(4, d, 2, mask);
    fetch_src_t fs = {.from = 0};
    prefix_fetch_on_reply(&fs, &r);
    fs.got = 3;
    uint32_t host, disk;
    prefix_fetch_split(&fs, 10 * BS, BS, &host, &disk);
    assert_int_equal(host, 2 * BS);
    assert_int_equal(disk, 1 * BS);
    fetch_src_clear(&fs);
}

/* A long prefix: the mask's second word counts too. */
static void test_mask_past_64_blocks(void **state)
{
    uint64_t mask[2];
    const int d[] = {63, 64, 70};
    msg_cache_fetch_reply_t r = s_reply(100, d, 3, mask);
    fetch_src_t fs = {.from = 4};
    prefix_fetch_on_reply(&fs, &r);
    assert_int_equal(fs.n_disk_mask, 2);
    fs.got = 100;
    uint32_t host, disk;
    prefix_fetch_split(&fs, 104 * BS, BS, &host, &disk);
    assert_int_equal(disk, 3 * BS);
    assert_int_equal(host, 97 * BS);
    prefix_fetch_split(&fs, (4 + 65) * BS, BS, &host, &disk);   /* fetched blocks 0..64 adopted: 63 and 64 */
    assert_int_equal(disk, 2 * BS);
    assert_int_equal(host, 63 * BS);
    fetch_src_clear(&fs);
}

/* A reply without disk blocks, or a later one, replaces what an earlier reply said. */
static void test_reply_without_disk(void **state)
{
    uint64_t mask[1];
    const int d[] = {0};
    msg_cache_fetch_reply_t r = s_reply(2, d, 1, mask);
    fetch_src_t fs = {.from = 0, .got = 2};
    prefix_fetch_on_reply(&fs, &r);
    r = s_reply(2, NULL, 0, mask);
    prefix_fetch_on_reply(&fs, &r);
    assert_null(fs.disk_mask);
    uint32_t host, disk;
    prefix_fetch_split(&fs, 2 * BS, BS, &host, &disk);
    assert_int_equal(host, 2 * BS);
    assert_int_equal(disk, 0);
    fetch_src_clear(&fs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_fetch_is_all_device),
        cmocka_unit_test(test_disk_head_host_tail),
        cmocka_unit_test(test_taken_run_bounds_it),
        cmocka_unit_test(test_mask_past_64_blocks),
        cmocka_unit_test(test_reply_without_disk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
