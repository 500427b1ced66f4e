/* engine/kvcache.h — the paged KV cache: a pool of fixed-size blocks and per-sequence block tables.
 *
 * Pool. n_blocks blocks of block_size token slots, sized once at creation. One block holds every
 * layer's K and V for its tokens as ONE contiguous chunk of block_bytes, so a KV hand-off copies
 * whole blocks:
 *     block b = [n_layers][2 (K, V)][block_size][n_kv_heads][head_dim]  in the pool's dtype
 * (bk_kv_t in kernels/backend.h gives the same formula the kernels use). Blocks carry reference
 * counts: a block shared by several sequences (a common prefix) goes back to the free list when
 * the last one lets go.
 *
 * Prefix hashes. Every FULL block of a sequence gets a chained hash
 *     hash_i = XXH3_64(salt || hash_{i-1} || tokens of block i)        (hash_{-1} = 0)
 * over little-endian bytes: the 8-byte tenant salt, the 8-byte previous hash, block_size int32
 * tokens. Equal hashes mean equal token prefixes (for one salt), so the cache-manager can index
 * blocks across workers, and tenants with different salts never share KV. Once its KV is computed
 * (kvseq_publish), a full block is findable by its hash (kvpool_lookup) — even after its last
 * user freed it: a free block keeps its hash until the free list hands it out again, oldest freed
 * first (LRU eviction of the unreferenced cache).
 *
 * Nothing here allocates after creation: the per-token path (kvseq_append, kvpool_alloc, free,
 * lookup) uses the arrays made by kvpool_new and kvseq_new. Not thread-safe: one owner (the
 * actor's loop) drives a pool and its sequences.
 */
#ifndef TROUPE_ENGINE_KVCACHE_H
#define TROUPE_ENGINE_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "kernels/backend.h"

typedef struct kvpool kvpool_t;
typedef struct kvseq kvseq_t;

/* The hash of one full block given the previous block's hash (0 for the first block). */
uint64_t kv_block_hash(uint64_t salt, uint64_t prev, const int32_t *tokens, int block_size);
/* A tenant's salt: 0 for no tenant (NULL or ""), else a hash of its name. */
uint64_t kv_tenant_salt(const char *tenant);

/* A pool of n_blocks blocks. be == NULL makes a bookkeeping-only pool (no KV memory: the
 * cache-manager's view, tests); otherwise the KV memory is allocated on be. block_size in
 * [1, BK_MAX_BLOCK_SIZE]. NULL with err on bad sizes or out of memory. */
kvpool_t *kvpool_new(int n_blocks, int block_size, int n_layers, int n_kv_heads, int head_dim, dtype_t dtype,
                     backend_t *be, char *err, size_t errlen);
void kvpool_destroy(kvpool_t **self_p);
/* Whether backend be runs attention over a cache of `dtype` for a model with these heads (the
 * backend's kv_supported op; a backend without it takes every dtype). 0, or -1 with the backend's
 * reason in err. Model-loading callers check this at start, before the weights are loaded, and
 * prefix err with the option that chose the dtype (model.kv_dtype, --kv-dtype). */
int kvpool_check(backend_t *be, dtype_t dtype, int head_dim, int n_heads, int n_kv_heads, char *err, size_t errlen);

/* A free block with reference count 1 (evicting its cached hash, if any), or -1 when none is free. */
int kvpool_alloc(kvpool_t *p);
/* One more reference. A free block (refcount 0, found by kvpool_lookup) leaves the free list. */
void kvpool_ref(kvpool_t *p, int block);
/* One reference less. At 0 the block is free: a cached one (with a hash) joins the free list's
 * tail, still findable by its hash until it is handed out again; one without a hash goes to the
 * head, to be reused before any cached prefix is evicted. */
void kvpool_free(kvpool_t *p, int block);
int kvpool_refcount(const kvpool_t *p, int block);
int kvpool_free_count(const kvpool_t *p);
int kvpool_n_blocks(const kvpool_t *p);
int kvpool_block_size(const kvpool_t *p);

/* Prefix-cache index: the block registered for a full-block hash, or -1. */
int kvpool_lookup(const kvpool_t *p, uint64_t hash);
/* Registers block under hash (when no other block holds that hash already). */
void kvpool_set_hash(kvpool_t *p, int block, uint64_t hash);
/* 1 and *hash when the block carries a hash (a full, published block). */
int kvpool_block_hash(const kvpool_t *p, int block, uint64_t *hash);

/* The KV memory as the attention kernels address it (base NULL for a bookkeeping-only pool). */
const bk_kv_t *kvpool_view(const kvpool_t *p);
/* An fp8 pool's scales (engine/kvscale.h): host [n_layers][2][n_kv_heads], each positive and
 * finite, copied to the backend and used by every op on the pool from now on (bk_kv_t.scale; none
 * set: 1). Set them before the first forward over the pool: its codes mean x / scale, and graphs
 * record the pointer. 0, or -1 with err (another dtype, a bookkeeping-only pool, a bad value). */
int kvpool_set_scales(kvpool_t *p, const float *scales, char *err, size_t errlen);
/* Device pointer to block b's block_bytes (for block copies and hand-offs). */
void *kvpool_block_ptr(const kvpool_t *p, int block);

/* A sequence's tokens and block table, with room for max_tokens tokens (made once). */
kvseq_t *kvseq_new(kvpool_t *pool, int max_tokens, uint64_t salt);
/* Releases the blocks, then frees the sequence. */
void kvseq_destroy(kvseq_t **self_p);

/* Reuses cached KV for a new (empty) sequence: adopts the longest run of published blocks whose
 * chained hashes match tokens[0..n), but never all n tokens (the last token must be computed to
 * give logits). Records those tokens; returns how many (a multiple of block_size), or -1 when the
 * sequence is not empty. */
int kvseq_match_prefix(kvseq_t *s, const int32_t *tokens, int n);
/* Appends n tokens: records them and grows the block table to cover them. All or nothing: -1
 * (nothing changed) when the pool has too few free blocks or max_tokens would be exceeded. */
int kvseq_append(kvseq_t *s, const int32_t *tokens, int n);
/* Declares the KV of every token appended so far computed: registers the hash of every full block
 * not yet registered, so other sequences can find them. Call after the forward that wrote them. */
void kvseq_publish(kvseq_t *s);
/* Rolls the sequence back to its first n tokens (0 <= n <= len; rejected speculative drafts):
 * blocks wholly past n are let go (last first: a shared or cached one keeps its other users and
 * its hash; one that was never published goes to the free list's head with no hash), hashes of
 * blocks past n / block_size are forgotten, so a partly kept block is never published with the
 * rejected tokens (its slots past n are rewritten by the next appends). Call it before
 * kvseq_publish: -1 (nothing changed) when n < len and the block holding token n was already
 * published or adopted full (its content must not change under its hash), or when n is out of
 * range. */
int kvseq_truncate(kvseq_t *s, int n);
/* Rewrites the recorded tokens [at, at + n) in place (0 <= at, at + n <= len), the blocks and their
 * KV untouched: for a caller that appended placeholders and computed their KV from ids it kept on
 * the device (the draft model's chained drafts, engine/spec_draft.c). The hashes of the full blocks
 * from at's on are computed again. -1 (nothing changed) when at, n are out of range or a block
 * holding one of those tokens was published or adopted (its hash names its tokens). */
int kvseq_set_tokens(kvseq_t *s, int at, const int32_t *tokens, int n);
/* Frees every block and forgets the tokens (the sequence can be reused). */
void kvseq_release(kvseq_t *s);

int kvseq_len(const kvseq_t *s);                                /* tokens recorded */
const int32_t *kvseq_tokens(const kvseq_t *s);                  /* [kvseq_len] */
int kvseq_n_blocks(const kvseq_t *s);
const int32_t *kvseq_blocks(const kvseq_t *s);                  /* [kvseq_n_blocks] pool block ids */
uint64_t kvseq_hash(const kvseq_t *s, int i);                   /* block i's chained hash; i < len/block_size */
kvpool_t *kvseq_pool(const kvseq_t *s);

#endif
