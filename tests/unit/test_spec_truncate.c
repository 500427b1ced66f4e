/* tests/unit/test_spec_truncate.c — kvseq_truncate, the paged cache's roll-back of rejected
 * speculative drafts: blocks past the kept length go back to the free list (reference counts,
 * free count), a shared prefix block keeps its other user and its hash, the hashes of a partly
 * kept block are forgotten so the block is published only with the tokens that replace the
 * rejected ones, a published block cannot be rolled into, and nothing leaks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine/kvcache.h"

enum { BS = 4 };

static kvpool_t *s_pool(int n_blocks)
{
    char err[256];
    kvpool_t *p = kvpool_new(n_blocks, BS, 2, 2, 8, DT_BF16, NULL, err, sizeof err);
    assert_non_null(p);
    return p;
}

static void test_truncate_frees_tail_blocks(void **state)
{
    (void)state;
    kvpool_t *p = s_pool(8);
    kvseq_t *s = kvseq_new(p, 64, 0);
    int32_t t[13];
    for (int i = 0; i < 13; i++)
        t[i] = 100 + i;
    assert_int_equal(kvseq_append(s, t, 5), 0);            /* 2 blocks */
    kvseq_publish(s);                                      /* block 0 published */
    const int b1 = kvseq_blocks(s)[1];
    assert_int_equal(kvseq_append(s, t + 5, 8), 0);        /* 13 tokens: 4 blocks, drafts in 1..3 */
    assert_int_equal(kvseq_n_blocks(s), 4);
    assert_int_equal(kvpool_free_count(p), 4);
    const int b3 = kvseq_blocks(s)[3];
    assert_int_equal(kvseq_truncate(s, 6), 0);             /* keep 6: blocks 0 and 1 */
    assert_int_equal(kvseq_len(s), 6);
    assert_int_equal(kvseq_n_blocks(s), 2);
    assert_int_equal(kvseq_blocks(s)[1], b1);
    assert_int_equal(kvpool_free_count(p), 6);
    assert_int_equal(kvpool_refcount(p, b3), 0);
    uint64_t h;
    assert_int_equal(kvpool_block_hash(p, b3, &h), 0);     /* never published: no hash */
    /* The freed unhashed blocks are handed out first (no cached prefix evicted for them). */
    int got = kvpool_alloc(p);
    assert_true(got != b1 && kvpool_refcount(p, got) == 1);
    kvpool_free(p, got);
    /* Truncating to the length, or past it, or below 0. */
    assert_int_equal(kvseq_truncate(s, 6), 0);
    assert_int_equal(kvseq_truncate(s, 7), -1);
    assert_int_equal(kvseq_truncate(s, -1), -1);
    kvseq_destroy(&s);
    assert_int_equal(kvpool_free_count(p), 8);
    kvpool_destroy(&p);
}

static void test_truncate_partial_block_never_published_with_drafts(void **state)
{
    (void)state;
    kvpool_t *p = s_pool(8);
    kvseq_t *s = kvseq_new(p, 64, 7);
    const int32_t prompt[] = {1, 2, 3, 4, 5, 6};
    const int32_t drafts[] = {90, 91};                     /* fill block 1: 5 6 90 91 */
    assert_int_equal(kvseq_append(s, prompt, 6), 0);
    kvseq_publish(s);
    assert_int_equal(kvseq_append(s, drafts, 2), 0);
    const int b1 = kvseq_blocks(s)[1];
    assert_int_equal(kvseq_truncate(s, 7), 0);             /* 90 accepted, 91 rejected */
    const int32_t fix = 42;                                /* the target's own token */
    assert_int_equal(kvseq_append(s, &fix, 1), 0);
    kvseq_publish(s);
    /* Block 1 is registered under the hash of 5 6 90 42, not 5 6 90 91. */
    const int32_t right[] = {1, 2, 3, 4, 5, 6, 90, 42}, wrong[] = {1, 2, 3, 4, 5, 6, 90, 91};
    uint64_t h0 = kv_block_hash(7, 0, right, BS);
    assert_int_equal(kvpool_lookup(p, kv_block_hash(7, h0, right + 4, BS)), b1);
    assert_int_equal(kvpool_lookup(p, kv_block_hash(7, h0, wrong + 4, BS)), -1);
    assert_true(kvseq_hash(s, 1) == kv_block_hash(7, h0, right + 4, BS));
    kvseq_destroy(&s);
    kvpool_destroy(&p);
}

static void test_truncate_keeps_shared_prefix(void **state)
{
    (void)state;
    kvpool_t *p = s_pool(8);
    kvseq_t *a = kvseq_new(p, 64, 0), *b = kvseq_new(p, 64, 0);
    const int32_t t[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(kvseq_append(a, t, 9), 0);
    kvseq_publish(a);
    assert_int_equal(kvseq_match_prefix(b, t, 9), 8);      /* b shares blocks 0 and 1 */
    const int s0 = kvseq_blocks(b)[0], s1 = kvseq_blocks(b)[1];
    assert_int_equal(kvpool_refcount(p, s1), 2);
    const int32_t d[] = {50, 51, 52, 53, 54};
    assert_int_equal(kvseq_append(b, d, 5), 0);            /* 13 tokens: blocks 2, 3 its own */
    assert_int_equal(kvseq_truncate(b, 8), 0);             /* back to the shared prefix exactly */
    assert_int_equal(kvseq_n_blocks(b), 2);
    assert_int_equal(kvpool_refcount(p, s0), 2);
    assert_int_equal(kvpool_refcount(p, s1), 2);
    /* Into the shared, published block: refused, nothing changed. */
    assert_int_equal(kvseq_truncate(b, 6), -1);
    assert_int_equal(kvseq_len(b), 8);
    assert_int_equal(kvseq_n_blocks(b), 2);
    /* Dropping a shared block wholly leaves it to its other user, hash intact. */
    assert_int_equal(kvseq_truncate(b, 4), 0);
    assert_int_equal(kvpool_refcount(p, s1), 1);
    uint64_t h;
    assert_int_equal(kvpool_block_hash(p, s1, &h), 1);
    assert_int_equal(kvpool_lookup(p, h), s1);
    assert_int_equal(kvseq_truncate(b, 0), 0);
    assert_int_equal(kvpool_refcount(p, s0), 1);
    assert_int_equal(kvseq_n_blocks(b), 0);
    kvseq_destroy(&b);
    kvseq_destroy(&a);
    assert_int_equal(kvpool_free_count(p), 8);
    /* The published blocks stay findable while free (the prefix cache), as after a release. */
    assert_true(kvpool_lookup(p, h) == s1);
    kvpool_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncate_frees_tail_blocks),
        cmocka_unit_test(test_truncate_partial_block_never_published_with_drafts),
        cmocka_unit_test(test_truncate_keeps_shared_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
