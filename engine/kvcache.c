/* engine/kvcache.c — block pool (free list, reference counts, hash index) and sequences.
 *
 * The free list is doubly linked through next/prev arrays so that reviving a cached free block
 * (kvpool_ref after kvpool_lookup) unlinks it in O(1). The hash index is open addressing with
 * linear probing and backward-shift deletion, 2x to 4x the block count, so it never fills. */
#include "engine/kvcache.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/util.h"

struct kvpool {
    int n_blocks, block_size;
    bk_kv_t view;                 /* base: device [n_blocks][n_layers][2][block_size][n_kv_heads][head_dim] dtype */
    backend_t *be;                /* owner of view.base; NULL for a bookkeeping-only pool */
    float *scale_dev;             /* device [n_layers][2][n_kv_heads] f32: view.scale (fp8), owned; NULL: none */
    int32_t *ref;                 /* [n_blocks] reference counts */
    int32_t *next, *prev;         /* [n_blocks] free-list links (-1 ends); valid while ref == 0 */
    int32_t head, tail, n_free;   /* free list: alloc takes the head, free appends at the tail */
    uint64_t *hash;               /* [n_blocks] the block's chained hash, when has_hash */
    uint8_t *has_hash;            /* [n_blocks] 1: hash valid; 2: valid and the index points here */
    uint64_t *slot_key;           /* [cap] index keys */
    int32_t *slot_block;          /* [cap] index values, -1 = empty */
    uint32_t cap_mask;            /* cap - 1 (cap a power of two) */
};

struct kvseq {
    kvpool_t *pool;
    uint64_t salt;                /* tenant salt, first input of every block hash */
    int max_tokens;
    int n_tokens;                 /* tokens recorded */
    int n_blocks;                 /* blocks in the table (covers n_tokens) */
    int n_hashed;                 /* full blocks whose hash is computed */
    int n_published;              /* full blocks registered in the pool index */
    int32_t *tokens;              /* [max_tokens] */
    int32_t *blocks;              /* [max_blocks] pool block ids */
    uint64_t *hashes;             /* [max_blocks] chained hashes of full blocks */
};

uint64_t kv_block_hash(uint64_t salt, uint64_t prev, const int32_t *tokens, int block_size)
{
    uint8_t buf[16 + 4 * BK_MAX_BLOCK_SIZE];
    assert(block_size > 0 && block_size <= BK_MAX_BLOCK_SIZE);
    for (int i = 0; i < 8; i++) {
        buf[i] = (uint8_t)(salt >> (8 * i));
        buf[8 + i] = (uint8_t)(prev >> (8 * i));
    }
    for (int t = 0; t < block_size; t++) {
        uint32_t v = (uint32_t)tokens[t];
        for (int i = 0; i < 4; i++)
            buf[16 + 4 * t + i] = (uint8_t)(v >> (8 * i));
    }
    return XXH3_64bits(buf, 16 + 4 * (size_t)block_size);
}

uint64_t kv_tenant_salt(const char *tenant)
{
    if (!tenant || !*tenant)
        return 0;
    return XXH3_64bits_withSeed(tenant, strlen(tenant), 0x74726f757065ULL);
}

/* ---- hash index -------------------------------------------------------------------------- */

static uint32_t s_slot(const kvpool_t *p, uint64_t key) { return (uint32_t)(key ^ (key >> 29)) & p->cap_mask; }

int kvpool_lookup(const kvpool_t *p, uint64_t hash)
{
    for (uint32_t i = s_slot(p, hash);; i = (i + 1) & p->cap_mask) {
        if (p->slot_block[i] < 0)
            return -1;
        if (p->slot_key[i] == hash)
            return p->slot_block[i];
    }
}

static void s_index_remove(kvpool_t *p, uint64_t key)
{
    uint32_t i = s_slot(p, key);
    while (p->slot_block[i] >= 0 && p->slot_key[i] != key)
        i = (i + 1) & p->cap_mask;
    if (p->slot_block[i] < 0)
        return;
    /* Backward shift: pull later entries of the probe run into the hole when their home slot
     * does not lie cyclically in (hole, j]. */
    uint32_t hole = i;
    for (uint32_t j = (hole + 1) & p->cap_mask; p->slot_block[j] >= 0; j = (j + 1) & p->cap_mask) {
        uint32_t home = s_slot(p, p->slot_key[j]);
        int home_in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!home_in_range) {
            p->slot_key[hole] = p->slot_key[j];
            p->slot_block[hole] = p->slot_block[j];
            hole = j;
        }
    }
    p->slot_block[hole] = -1;
}

void kvpool_set_hash(kvpool_t *p, int block, uint64_t hash)
{
    assert(block >= 0 && block < p->n_blocks);
    if (p->has_hash[block])
        return;                                    /* a block's content never changes once full */
    p->hash[block] = hash;
    p->has_hash[block] = 1;
    uint32_t i = s_slot(p, hash);
    while (p->slot_block[i] >= 0) {
        if (p->slot_key[i] == hash)
            return;                                /* another block already serves this prefix */
        i = (i + 1) & p->cap_mask;
    }
    p->slot_key[i] = hash;
    p->slot_block[i] = block;
    p->has_hash[block] = 2;
}

int kvpool_block_hash(const kvpool_t *p, int block, uint64_t *hash)
{
    if (block < 0 || block >= p->n_blocks || !p->has_hash[block])
        return 0;
    *hash = p->hash[block];
    return 1;
}

/* ---- pool -------------------------------------------------------------------------------- */

kvpool_t *kvpool_new(int n_blocks, int block_size, int n_layers, int n_kv_heads, int head_dim, dtype_t dtype,
                     backend_t *be, char *err, size_t errlen)
{
    if (n_blocks < 1 || n_blocks > (1 << 28))
        return errf(err, errlen, "kvpool: n_blocks %d out of range [1, 2^28]", n_blocks), NULL;
    if (block_size < 1 || block_size > BK_MAX_BLOCK_SIZE)
        return errf(err, errlen, "kvpool: block_size %d out of range [1, %d]", block_size, BK_MAX_BLOCK_SIZE), NULL;
    if (n_layers < 1 || n_kv_heads < 1 || head_dim < 1 || head_dim > BK_MAX_HEAD_DIM || dtype >= DT_COUNT)
        return errf(err, errlen, "kvpool: bad shape layers=%d kv_heads=%d head_dim=%d dtype=%d", n_layers, n_kv_heads,
                    head_dim, (int)dtype), NULL;
    kvpool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return errf(err, errlen, "kvpool: out of memory"), NULL;
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n_blocks)
        cap <<= 1;
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->cap_mask = cap - 1;
    p->ref = calloc((size_t)n_blocks, sizeof(int32_t));
    p->next = malloc((size_t)n_blocks * sizeof(int32_t));
    p->prev = malloc((size_t)n_blocks * sizeof(int32_t));
    p->hash = calloc((size_t)n_blocks, sizeof(uint64_t));
    p->has_hash = calloc((size_t)n_blocks, 1);
    p->slot_key = calloc(cap, sizeof(uint64_t));
    p->slot_block = malloc((size_t)cap * sizeof(int32_t));
    if (!p->ref || !p->next || !p->prev || !p->hash || !p->has_hash || !p->slot_key || !p->slot_block) {
        kvpool_destroy(&p);
        return errf(err, errlen, "kvpool: out of memory for %d blocks of bookkeeping", n_blocks), NULL;
    }
    for (uint32_t i = 0; i < cap; i++)
        p->slot_block[i] = -1;
    for (int b = 0; b < n_blocks; b++) {
        p->next[b] = b + 1 < n_blocks ? b + 1 : -1;
        p->prev[b] = b - 1;
    }
    p->head = 0;
    p->tail = n_blocks - 1;
    p->n_free = n_blocks;

    p->view = (bk_kv_t){.base = NULL, .dtype = dtype, .n_blocks = n_blocks, .block_size = block_size,
                        .n_layers = n_layers, .n_kv_heads = n_kv_heads, .head_dim = head_dim};
    p->view.block_bytes = (size_t)n_layers * 2 * (size_t)block_size * (size_t)n_kv_heads * (size_t)head_dim * dtype_size(dtype);
    if (be) {
        size_t bytes = p->view.block_bytes * (size_t)n_blocks;
        p->view.base = be->ops->alloc(be, bytes);
        if (!p->view.base) {
            kvpool_destroy(&p);
            return errf(err, errlen, "kvpool: cannot allocate %zu bytes of KV (%d blocks of %zu bytes) on %s", bytes,
                        n_blocks, (size_t)bytes / (size_t)n_blocks, be->ops->name), NULL;
        }
        p->be = be;
    }
    return p;
}

int kvpool_check(backend_t *be, dtype_t dtype, int head_dim, int n_heads, int n_kv_heads, char *err, size_t errlen)
{
    if ((unsigned)dtype >= DT_COUNT)
        return errf(err, errlen, "unknown KV dtype %d", (int)dtype);
    if (!be->ops->kv_supported)
        return 0;
    if (errlen)
        err[0] = '\0';
    if (be->ops->kv_supported(be, dtype, head_dim, n_heads, n_kv_heads, err, errlen) == 0)
        return 0;
    if (errlen && !err[0])                         /* the backend said no without saying why */
        errf(err, errlen, "the %s backend has no attention over a KV cache in %s with head_dim %d, "
             "%d query heads / %d kv heads", be->ops->name, dtype_name(dtype), head_dim, n_heads, n_kv_heads);
    return -1;
}

void kvpool_destroy(kvpool_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvpool_t *p = *self_p;
    if (p->be && p->view.base)
        p->be->ops->free(p->be, p->view.base);
    if (p->be && p->scale_dev)
        p->be->ops->free(p->be, p->scale_dev);
    free(p->ref);
    free(p->next);
    free(p->prev);
    free(p->hash);
    free(p->has_hash);
    free(p->slot_key);
    free(p->slot_block);
    free(p);
    *self_p = NULL;
}

static void s_unlink(kvpool_t *p, int b)
{
    if (p->prev[b] >= 0)
        p->next[p->prev[b]] = p->next[b];
    else
        p->head = p->next[b];
    if (p->next[b] >= 0)
        p->prev[p->next[b]] = p->prev[b];
    else
        p->tail = p->prev[b];
    p->n_free--;
}

int kvpool_alloc(kvpool_t *p)
{
    if (p->head < 0)
        return -1;
    int b = p->head;
    s_unlink(p, b);
    if (p->has_hash[b] == 2)                       /* evict the cached prefix this block held */
        s_index_remove(p, p->hash[b]);
    p->has_hash[b] = 0;
    p->ref[b] = 1;
    return b;
}

void kvpool_ref(kvpool_t *p, int block)
{
    assert(block >= 0 && block < p->n_blocks);
    if (p->ref[block]++ == 0)
        s_unlink(p, block);
}

void kvpool_free(kvpool_t *p, int block)
{
    assert(block >= 0 && block < p->n_blocks && p->ref[block] > 0);
    if (--p->ref[block] > 0)
        return;
    if (!p->has_hash[block]) {
        /* Nothing cached here: hand it out first rather than evicting a cached prefix. */
        p->prev[block] = -1;
        p->next[block] = p->head;
        if (p->head >= 0)
            p->prev[p->head] = block;
        else
            p->tail = block;
        p->head = block;
    } else {
        p->next[block] = -1;
        p->prev[block] = p->tail;
        if (p->tail >= 0)
            p->next[p->tail] = block;
        else
            p->head = block;
        p->tail = block;
    }
    p->n_free++;
}

int kvpool_refcount(const kvpool_t *p, int block) { return block >= 0 && block < p->n_blocks ? p->ref[block] : 0; }
int kvpool_free_count(const kvpool_t *p) { return p->n_free; }
int kvpool_n_blocks(const kvpool_t *p) { return p->n_blocks; }
int kvpool_block_size(const kvpool_t *p) { return p->block_size; }
const bk_kv_t *kvpool_view(const kvpool_t *p) { return &p->view; }

int kvpool_set_scales(kvpool_t *p, const float *scales, char *err, size_t errlen)
{
    const bk_kv_t *v = &p->view;
    if (v->dtype != DT_F8E4M3 || !p->be)
        return errf(err, errlen, "kvpool: scales are for an fp8 pool with memory (this one: %s%s)", dtype_name(v->dtype),
                    p->be ? "" : ", bookkeeping only");
    const size_t n = (size_t)v->n_layers * 2 * (size_t)v->n_kv_heads;
    for (size_t i = 0; i < n; i++)
        if (!(scales[i] > 0.0f) || scales[i] > 3.0e38f)
            return errf(err, errlen, "kvpool: scale %zu (layer %zu %s head %zu) is %g, not positive and finite", i,
                        i / (2 * (size_t)v->n_kv_heads), i / (size_t)v->n_kv_heads % 2 ? "V" : "K",
                        i % (size_t)v->n_kv_heads, (double)scales[i]);
    if (!p->scale_dev && !(p->scale_dev = p->be->ops->alloc(p->be, n * sizeof(float))))
        return errf(err, errlen, "kvpool: cannot allocate %zu bytes of KV scales on %s", n * sizeof(float), p->be->ops->name);
    if (p->be->ops->upload(p->be, p->scale_dev, scales, n * sizeof(float)) < 0)
        return errf(err, errlen, "kvpool: cannot upload the KV scales to %s", p->be->ops->name);
    p->view.scale = p->scale_dev;
    return 0;
}

void *kvpool_block_ptr(const kvpool_t *p, int block)
{
    if (!p->view.base || block < 0 || block >= p->n_blocks)
        return NULL;
    return (uint8_t *)p->view.base + (size_t)block * p->view.block_bytes;
}

/* ---- sequences --------------------------------------------------------------------------- */

kvseq_t *kvseq_new(kvpool_t *pool, int max_tokens, uint64_t salt)
{
    if (!pool || max_tokens < 1)
        return NULL;
    kvseq_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    int max_blocks = (max_tokens + pool->block_size - 1) / pool->block_size;
    s->pool = pool;
    s->salt = salt;
    s->max_tokens = max_tokens;
    s->tokens = malloc((size_t)max_tokens * sizeof(int32_t));
    s->blocks = malloc((size_t)max_blocks * sizeof(int32_t));
    s->hashes = malloc((size_t)max_blocks * sizeof(uint64_t));
    if (!s->tokens || !s->blocks || !s->hashes) {
        kvseq_destroy(&s);
        return NULL;
    }
    return s;
}

void kvseq_destroy(kvseq_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvseq_t *s = *self_p;
    if (s->blocks)
        kvseq_release(s);
    free(s->tokens);
    free(s->blocks);
    free(s->hashes);
    free(s);
    *self_p = NULL;
}

void kvseq_release(kvseq_t *s)
{
    /* Last block first: cached blocks are evicted in the order they were freed, so a prefix's
     * root (block 0) outlives its tail and the prefix stays adoptable as long as possible. */
    for (int i = s->n_blocks - 1; i >= 0; i--)
        kvpool_free(s->pool, s->blocks[i]);
    s->n_blocks = s->n_tokens = s->n_hashed = s->n_published = 0;
}

/* Computes the chained hash of every block that has become full. */
static void s_hash_full_blocks(kvseq_t *s)
{
    const int bs = s->pool->block_size;
    for (; (s->n_hashed + 1) * bs <= s->n_tokens; s->n_hashed++) {
        uint64_t prev = s->n_hashed ? s->hashes[s->n_hashed - 1] : 0;
        s->hashes[s->n_hashed] = kv_block_hash(s->salt, prev, s->tokens + (size_t)s->n_hashed * bs, bs);
    }
}

int kvseq_match_prefix(kvseq_t *s, const int32_t *tokens, int n)
{
    if (s->n_tokens)
        return -1;
    const int bs = s->pool->block_size;
    int max_blocks = n > 0 ? (n - 1) / bs : 0;
    if (max_blocks * bs > s->max_tokens)
        max_blocks = s->max_tokens / bs;
    uint64_t prev = 0;
    int i = 0;
    for (; i < max_blocks; i++) {
        uint64_t h = kv_block_hash(s->salt, prev, tokens + (size_t)i * bs, bs);
        int b = kvpool_lookup(s->pool, h);
        if (b < 0)
            break;
        kvpool_ref(s->pool, b);
        s->blocks[i] = b;
        s->hashes[i] = h;
        prev = h;
    }
    s->n_blocks = s->n_hashed = s->n_published = i;
    s->n_tokens = i * bs;
    memcpy(s->tokens, tokens, (size_t)s->n_tokens * sizeof(int32_t));
    return s->n_tokens;
}

int kvseq_append(kvseq_t *s, const int32_t *tokens, int n)
{
    const int bs = s->pool->block_size;
    if (n < 0 || n > s->max_tokens - s->n_tokens)
        return -1;
    int need = (s->n_tokens + n + bs - 1) / bs - s->n_blocks;
    if (need > s->pool->n_free)
        return -1;
    for (int i = 0; i < need; i++)
        s->blocks[s->n_blocks++] = kvpool_alloc(s->pool);
    memcpy(s->tokens + s->n_tokens, tokens, (size_t)n * sizeof(int32_t));
    s->n_tokens += n;
    s_hash_full_blocks(s);
    return 0;
}

void kvseq_publish(kvseq_t *s)
{
    for (; s->n_published < s->n_hashed; s->n_published++)
        kvpool_set_hash(s->pool, s->blocks[s->n_published], s->hashes[s->n_published]);
}

int kvseq_truncate(kvseq_t *s, int n)
{
    const int bs = s->pool->block_size;
    if (n < 0 || n > s->n_tokens)
        return -1;
    if (n == s->n_tokens)
        return 0;
    const int full = n / bs, keep = (n + bs - 1) / bs;
    /* A kept partial block (n % bs != 0) is rewritten from slot n % bs on: it must not be one the
     * index (or another sequence through kvseq_match_prefix) already knows by its hash. */
    if (n % bs && s->n_published > full)
        return -1;
    for (int i = s->n_blocks - 1; i >= keep; i--)
        kvpool_free(s->pool, s->blocks[i]);
    s->n_blocks = keep;
    s->n_tokens = n;
    if (s->n_hashed > full)
        s->n_hashed = full;
    if (s->n_published > full)
        s->n_published = full;
    return 0;
}

int kvseq_set_tokens(kvseq_t *s, int at, const int32_t *tokens, int n)
{
    const int bs = s->pool->block_size;
    if (at < 0 || n < 0 || n > s->n_tokens - at || s->n_published > at / bs)
        return -1;
    memcpy(s->tokens + at, tokens, (size_t)n * sizeof(int32_t));
    if (s->n_hashed > at / bs)
        s->n_hashed = at / bs;
    s_hash_full_blocks(s);
    return 0;
}

int kvseq_len(const kvseq_t *s) { return s->n_tokens; }
const int32_t *kvseq_tokens(const kvseq_t *s) { return s->tokens; }
int kvseq_n_blocks(const kvseq_t *s) { return s->n_blocks; }
const int32_t *kvseq_blocks(const kvseq_t *s) { return s->blocks; }
kvpool_t *kvseq_pool(const kvseq_t *s) { return s->pool; }

uint64_t kvseq_hash(const kvseq_t *s, int i)
{
    assert(i >= 0 && i < s->n_hashed);
    return s->hashes[i];
}
