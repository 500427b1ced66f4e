/* tests/unit/test_kvcache.c — the paged KV pool and sequences: allocation, reference counts,
 * exhaustion, chained prefix hashes (byte layout, chaining, tenant salt), prefix reuse and its
 * LRU eviction, the hash index under churn, the documented block layout (fp8: one byte per
 * element), kvpool_check's use of the backend's kv_supported, and no leaked blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include <cmocka.h>

#include "engine/kvcache.h"

static kvpool_t *s_pool(int n_blocks, int block_size)
{
    char err[256];
    kvpool_t *p = kvpool_new(n_blocks, block_size, 2, 2, 8, DT_BF16, NULL, err, sizeof err);
    assert_non_null(p);
    return p;
}

static void test_alloc_free_refcounts(void **state)
{
    kvpool_t *p = s_pool(8, 4);
    int got[8], seen[8] = {0};
    assert_int_equal(kvpool_free_count(p), 8);
    for (int i = 0; i < 8; i++) {
        got[i] = kvpool_alloc(p);
        assert_true(got[i] >= 0 && got[i] < 8);
        assert_int_equal(seen[got[i]]++, 0);      /* every block handed out once */
        assert_int_equal(kvpool_refcount(p, got[i]), 1);
    }
    assert_int_equal(kvpool_free_count(p), 0);
    assert_int_equal(kvpool_alloc(p), -1);        /* exhausted */

    kvpool_ref(p, got[3]);
    assert_int_equal(kvpool_refcount(p, got[3]), 2);
    kvpool_free(p, got[3]);
    assert_int_equal(kvpool_free_count(p), 0);    /* still referenced */
    kvpool_free(p, got[3]);
    assert_int_equal(kvpool_free_count(p), 1);
    assert_int_equal(kvpool_refcount(p, got[3]), 0);
    assert_int_equal(kvpool_alloc(p), got[3]);    /* the only free block */
    for (int i = 0; i < 8; i++)
        kvpool_free(p, got[i]);
    assert_int_equal(kvpool_free_count(p), 8);
    kvpool_destroy(&p);
    assert_null(p);
    kvpool_destroy(&p);
}

static void test_bad_sizes(void **state)
{
    char err[256];
    assert_null(kvpool_new(0, 16, 1, 1, 8, DT_F32, NULL, err, sizeof err));
    assert_non_null(strstr(err, "n_blocks"));
    assert_null(kvpool_new(4, BK_MAX_BLOCK_SIZE + 1, 1, 1, 8, DT_F32, NULL, err, sizeof err));
    assert_non_null(strstr(err, "block_size"));
    assert_null(kvpool_new(4, 16, 1, 1, BK_MAX_HEAD_DIM + 1, DT_F32, NULL, err, sizeof err));
    assert_non_null(strstr(err, "head_dim"));
}

static void test_append_grows_and_exhausts(void **state)
{
    kvpool_t *p = s_pool(5, 4);
    kvseq_t *s = kvseq_new(p, 64, 0);
    int32_t t[32];
    for (int i = 0; i < 32; i++)
        t[i] = 100 + i;
    assert_int_equal(kvseq_append(s, t, 10), 0);
    assert_int_equal(kvseq_len(s), 10);
    assert_int_equal(kvseq_n_blocks(s), 3);
    assert_int_equal(kvseq_append(s, t + 10, 2), 0);
    assert_int_equal(kvseq_n_blocks(s), 3);       /* 12 tokens still fit 3 blocks */
    assert_int_equal(kvseq_append(s, t + 12, 1), 0);
    assert_int_equal(kvseq_n_blocks(s), 4);
    assert_int_equal(kvpool_free_count(p), 1);
    /* 8 more tokens need 2 blocks, only 1 is free: nothing changes. */
    assert_int_equal(kvseq_append(s, t + 13, 8), -1);
    assert_int_equal(kvseq_len(s), 13);
    assert_int_equal(kvseq_n_blocks(s), 4);
    assert_int_equal(kvpool_free_count(p), 1);
    assert_memory_equal(kvseq_tokens(s), t, 13 * sizeof(int32_t));
    assert_int_equal(kvseq_append(s, t + 13, 7), 0);   /* 20 tokens = 5 blocks exactly */
    assert_int_equal(kvpool_free_count(p), 0);
    /* max_tokens bounds the sequence regardless of the pool. */
    kvseq_t *small = kvseq_new(p, 3, 0);
    assert_int_equal(kvseq_append(small, t, 4), -1);
    kvseq_destroy(&small);
    const int32_t *b = kvseq_blocks(s);
    for (int i = 0; i < 5; i++)
        assert_int_equal(kvpool_refcount(p, b[i]), 1);
    kvseq_destroy(&s);
    assert_null(s);
    assert_int_equal(kvpool_free_count(p), 5);    /* no leaked block */
    kvpool_destroy(&p);
}

static void test_hash_layout_and_chaining(void **state)
{
    const int bs = 4;
    int32_t t[8] = {1, 2, 3, 70000, 5, -1, 7, 8};
    /* Byte layout: salt LE, previous hash LE, int32 tokens LE. */
    uint8_t buf[16 + 16];
    uint64_t salt = 0x0123456789abcdefull, prev = 0;
    for (int i = 0; i < 8; i++) {
        buf[i] = (uint8_t)(salt >> (8 * i));
        buf[8 + i] = (uint8_t)(prev >> (8 * i));
    }
    for (int k = 0; k < bs; k++)
        for (int i = 0; i < 4; i++)
            buf[16 + 4 * k + i] = (uint8_t)((uint32_t)t[k] >> (8 * i));
    uint64_t h0 = kv_block_hash(salt, 0, t, bs);
    assert_true(h0 == XXH3_64bits(buf, sizeof buf));

    kvpool_t *p = s_pool(8, bs);
    kvseq_t *s = kvseq_new(p, 32, salt);
    assert_int_equal(kvseq_append(s, t, 7), 0);
    assert_true(kvseq_hash(s, 0) == h0);          /* only block 0 is full so far */
    assert_int_equal(kvseq_append(s, t + 7, 1), 0);
    uint64_t h1 = kvseq_hash(s, 1);
    assert_true(h1 == kv_block_hash(salt, h0, t + 4, bs));
    /* Chaining: the same second block after a different first block hashes differently. */
    int32_t u[8] = {9, 2, 3, 70000, 5, -1, 7, 8};
    assert_true(kv_block_hash(salt, kv_block_hash(salt, 0, u, bs), u + 4, bs) != h1);
    /* Tenant salt: the same tokens under another salt hash differently. */
    assert_true(kv_block_hash(salt + 1, 0, t, bs) != h0);
    kvseq_destroy(&s);
    kvpool_destroy(&p);
}

static void test_prefix_reuse_and_eviction(void **state)
{
    const int bs = 4;
    kvpool_t *p = s_pool(6, bs);
    int32_t t[12] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
    kvseq_t *a = kvseq_new(p, 32, 7), *b = kvseq_new(p, 32, 7), *other = kvseq_new(p, 32, 8);

    assert_int_equal(kvseq_append(a, t, 10), 0);  /* blocks 0, 1 full, 2 partial */
    /* Not published yet: nothing to reuse (its KV is not computed). */
    assert_int_equal(kvseq_match_prefix(b, t, 12), 0);
    kvseq_release(b);
    kvseq_publish(a);
    assert_int_equal(kvseq_match_prefix(b, t, 12), 8);
    assert_int_equal(kvseq_len(b), 8);
    assert_memory_equal(kvseq_blocks(b), kvseq_blocks(a), 2 * sizeof(int32_t));
    assert_int_equal(kvpool_refcount(p, kvseq_blocks(a)[0]), 2);
    assert_int_equal(kvpool_refcount(p, kvseq_blocks(a)[2]), 1);   /* the partial block is private */
    assert_int_equal(kvseq_match_prefix(b, t, 12), -1);            /* only on an empty sequence */
    assert_int_equal(kvseq_append(b, t + 8, 4), 0);
    assert_true(kvseq_blocks(b)[2] != kvseq_blocks(a)[2]);

    /* Another tenant's salt never matches. */
    assert_int_equal(kvseq_match_prefix(other, t, 12), 0);

    /* Matching never covers every token: the last one must be computed. */
    kvseq_t *c = kvseq_new(p, 32, 7);
    assert_int_equal(kvseq_match_prefix(c, t, 8), 4);
    kvseq_destroy(&c);

    int32_t shared0 = kvseq_blocks(a)[0];
    uint64_t h0 = kvseq_hash(a, 0);
    kvseq_destroy(&a);
    kvseq_destroy(&b);
    assert_int_equal(kvpool_free_count(p), 6);
    /* Freed, yet still cached: a new sequence finds the same blocks. */
    assert_int_equal(kvpool_lookup(p, h0), shared0);
    kvseq_t *d = kvseq_new(p, 32, 7);
    assert_int_equal(kvseq_match_prefix(d, t, 12), 8);
    assert_int_equal(kvseq_blocks(d)[0], shared0);
    assert_int_equal(kvpool_free_count(p), 4);    /* revived blocks left the free list */
    kvseq_destroy(&d);

    /* Allocate everything: uncached blocks go first, then the cached ones are evicted. */
    int got[6];
    for (int i = 0; i < 6; i++)
        got[i] = kvpool_alloc(p);
    assert_int_equal(kvpool_lookup(p, h0), -1);
    uint64_t dummy;
    assert_int_equal(kvpool_block_hash(p, shared0, &dummy), 0);
    for (int i = 0; i < 6; i++)
        kvpool_free(p, got[i]);
    kvseq_destroy(&other);
    assert_int_equal(kvpool_free_count(p), 6);
    kvpool_destroy(&p);
}

static void test_lru_order(void **state)
{
    /* Freed cached blocks are evicted oldest-freed first; blocks without a hash are reused before any. */
    kvpool_t *p = s_pool(4, 1);
    int b[4];
    for (int i = 0; i < 4; i++) {
        b[i] = kvpool_alloc(p);
        if (i < 3)
            kvpool_set_hash(p, b[i], 1000 + (uint64_t)i);
    }
    kvpool_free(p, b[1]);
    kvpool_free(p, b[0]);
    kvpool_free(p, b[2]);
    kvpool_free(p, b[3]);                          /* no hash */
    assert_int_equal(kvpool_alloc(p), b[3]);
    assert_int_equal(kvpool_alloc(p), b[1]);
    assert_int_equal(kvpool_lookup(p, 1001), -1);
    assert_int_equal(kvpool_lookup(p, 1000), b[0]);
    assert_int_equal(kvpool_lookup(p, 1002), b[2]);
    kvpool_destroy(&p);
}

/* The index against a plain model under random churn, with colliding home slots. */
static void test_index_churn(void **state)
{
    const int N = 64;
    kvpool_t *p = s_pool(N, 1);
    uint64_t rng = 12345, hash_of[64];
    int held[64] = {0}, hashed[64] = {0};
    for (int step = 0; step < 20000; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int op = (int)(rng >> 60) & 3;
        if (op < 2) {
            int b = kvpool_alloc(p);
            if (b < 0)
                continue;
            assert_int_equal(held[b], 0);
            held[b] = 1;
            hashed[b] = 0;
            if (op == 0) {
                /* Few distinct hashes, many equal low bits: long probe runs and duplicates. */
                uint64_t h = ((rng >> 20) % 97) << 32 | ((rng >> 40) & 3);
                int owner = kvpool_lookup(p, h);
                kvpool_set_hash(p, b, h);
                hashed[b] = owner < 0 ? 2 : 1;
                hash_of[b] = h;
            }
        } else {
            int b = (int)((rng >> 33) % N);
            if (held[b]) {
                kvpool_free(p, b);
                held[b] = 0;
            }
        }
        if (step % 97 == 0)
            for (int b = 0; b < N; b++)
                if (hashed[b] == 2)
                    assert_int_equal(kvpool_lookup(p, hash_of[b]), b);
    }
    int n_held = 0;
    for (int b = 0; b < N; b++)
        if (held[b]) {
            kvpool_free(p, b);
            n_held++;
        }
    assert_int_equal(kvpool_free_count(p), N);
    kvpool_destroy(&p);
}

static void test_block_layout(void **state)
{
    char err[256];
    backend_t *be = backend_cpu_new(1);
    kvpool_t *p = kvpool_new(3, 16, 5, 4, 64, DT_BF16, be, err, sizeof err);
    assert_non_null(p);
    const bk_kv_t *v = kvpool_view(p);
    assert_int_equal(v->block_bytes, (size_t)5 * 2 * 16 * 4 * 64 * 2);
    assert_ptr_equal(kvpool_block_ptr(p, 0), v->base);
    assert_ptr_equal(kvpool_block_ptr(p, 2), (uint8_t *)v->base + 2 * v->block_bytes);
    assert_null(kvpool_block_ptr(p, 3));
    memset(v->base, 0x5a, 3 * v->block_bytes);    /* the whole pool is addressable */
    kvpool_destroy(&p);
    backend_destroy(&be);
}

static void test_block_layout_fp8(void **state)
{
    char err[256];
    backend_t *be = backend_cpu_new(1);
    kvpool_t *p = kvpool_new(3, 16, 5, 4, 64, DT_F8E4M3, be, err, sizeof err);
    assert_non_null(p);
    const bk_kv_t *v = kvpool_view(p);
    assert_int_equal(v->dtype, DT_F8E4M3);
    assert_int_equal(v->block_bytes, (size_t)5 * 2 * 16 * 4 * 64);
    assert_ptr_equal(kvpool_block_ptr(p, 2), (uint8_t *)v->base + 2 * v->block_bytes);
    memset(v->base, 0x5a, 3 * v->block_bytes);
    kvpool_destroy(&p);
    backend_destroy(&be);
}

/* A backend that, like the CUDA one, takes fp8 only at head_dim 64 or 128 and groups <= 16;
 * when `silent` it refuses without saying why. */
static int s_silent;
static int s_fake_kv_supported(backend_t *be, dtype_t dtype, int head_dim, int n_heads, int n_kv_heads, char *err,
                               size_t errlen)
{
    if (dtype != DT_F8E4M3 || ((head_dim == 64 || head_dim == 128) && n_heads / n_kv_heads <= 16))
        return 0;
    if (!s_silent)
        snprintf(err, errlen, "fp8 needs head_dim 64 or 128, not %d", head_dim);
    return -1;
}

/* kvseq_set_tokens rewrites recorded tokens in place (the draft model's placeholders): the same
 * blocks, the hashes of a sequence appended with those tokens, and never a published block. */
static void test_set_tokens(void **state)
{
    kvpool_t *p = s_pool(8, 4);
    kvseq_t *a = kvseq_new(p, 32, 0), *b = kvseq_new(p, 32, 0);
    const int32_t real[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, zero[10] = {0};
    assert_int_equal(kvseq_append(a, real, 3), 0);
    assert_int_equal(kvseq_append(a, zero, 7), 0);
    int32_t blocks[3];
    memcpy(blocks, kvseq_blocks(a), sizeof blocks);
    assert_int_equal(kvseq_set_tokens(a, 3, real + 3, 7), 0);
    assert_memory_equal(kvseq_tokens(a), real, sizeof real);
    assert_memory_equal(kvseq_blocks(a), blocks, sizeof blocks);
    assert_int_equal(kvseq_append(b, real, 10), 0);
    for (int i = 0; i < 2; i++)
        assert_true(kvseq_hash(a, i) == kvseq_hash(b, i));
    assert_int_equal(kvseq_set_tokens(a, 8, real, 3), -1);       /* past the end */
    kvseq_publish(a);
    assert_int_equal(kvseq_set_tokens(a, 5, real, 1), -1);       /* block 1 is published */
    assert_int_equal(kvseq_set_tokens(a, 9, zero, 1), 0);        /* the partial block 2 is not */
    kvseq_destroy(&a);
    kvseq_destroy(&b);
    kvpool_destroy(&p);
    (void)state;
}

static void test_check(void **state)
{
    char err[256];
    backend_t *cpu = backend_cpu_new(1);
    /* The CPU backend has no kv_supported: every dtype and shape is taken. */
    assert_null(cpu->ops->kv_supported);
    for (int dt = 0; dt < DT_COUNT; dt++)
        assert_int_equal(kvpool_check(cpu, (dtype_t)dt, 40, 12, 4, err, sizeof err), 0);
    assert_int_equal(kvpool_check(cpu, DT_COUNT, 64, 8, 8, err, sizeof err), -1);

    backend_ops_t ops = *cpu->ops;
    ops.kv_supported = s_fake_kv_supported;
    backend_t fake = {.ops = &ops, .n_threads = 1};
    assert_int_equal(kvpool_check(&fake, DT_F8E4M3, 128, 32, 8, err, sizeof err), 0);
    assert_int_equal(kvpool_check(&fake, DT_BF16, 96, 32, 8, err, sizeof err), 0);
    strcpy(err, "stale");
    assert_int_equal(kvpool_check(&fake, DT_F8E4M3, 96, 32, 8, err, sizeof err), -1);
    assert_string_equal(err, "fp8 needs head_dim 64 or 128, not 96");
    s_silent = 1;
    strcpy(err, "stale");
    assert_int_equal(kvpool_check(&fake, DT_F8E4M3, 64, 64, 2, err, sizeof err), -1);
    assert_string_equal(err, "the cpu backend has no attention over a KV cache in fp8 with head_dim 64, "
                             "64 query heads / 2 kv heads");
    s_silent = 0;
    backend_destroy(&cpu);
}

/* A tenant's salt: 0 without a tenant, else a fixed hash of the name (the router salts requests
 * with it and block hashes carry it, so its value must not change). */
static void test_tenant_salt(void **state)
{
    assert_true(kv_tenant_salt(NULL) == 0);
    assert_true(kv_tenant_salt("") == 0);
    assert_true(kv_tenant_salt("acme") == 0xe2ead72044bdd4b4ULL);
    assert_true(kv_tenant_salt("acme2") != kv_tenant_salt("acme"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tenant_salt),
        cmocka_unit_test(test_alloc_free_refcounts),
        cmocka_unit_test(test_bad_sizes),
        cmocka_unit_test(test_append_grows_and_exhausts),
        cmocka_unit_test(test_hash_layout_and_chaining),
        cmocka_unit_test(test_prefix_reuse_and_eviction),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_index_churn),
        cmocka_unit_test(test_block_layout),
        cmocka_unit_test(test_block_layout_fp8),
        cmocka_unit_test(test_set_tokens),
        cmocka_unit_test(test_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
