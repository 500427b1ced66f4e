/* actors/cache/dev_index.h — the cache-manager's index of the device tier: which workers' KV pools
 * hold a block, by its prefix hash, from what the workers announce (cache_put tier device).
 *
 * A worker announces the full blocks of every prompt it takes in and never says when its pool
 * hands one of them out again (kvcache.h: the least recently freed cached block goes first), nor
 * does a restarted worker say that its predecessor's pool is gone. So the index bounds each
 * worker's entries itself: a hash announced goes into the worker's newer generation; when that one
 * holds half the worker's pool (cache_put.pool_blocks), the older generation's hashes that were
 * not announced again are withdrawn and the newer becomes the older. A worker thus keeps at most
 * its pool's size of the hashes it announced most recently (plus one announcement), and the index
 * is bounded by the sum of the pools whatever the traffic. A worker whose process ended
 * (devidx_forget) loses every entry.
 *
 * Withdrawn hashes are handed to a callback in batches (the cache-manager tells the routers, whose
 * own indexes follow its events).
 *
 * Known limits: an approximation of the pool's LRU from the order of announcements: a block held
 * for a long time by a running sequence may be withdrawn while still there (a routing hint lost:
 * the prefix is recomputed), and up to half a pool of withdrawn-late hashes may be stale (a hint
 * that costs a recompute, as before). */
#ifndef TROUPE_DEV_INDEX_H
#define TROUPE_DEV_INDEX_H

#include <stddef.h>
#include <stdint.h>

#define DEVIDX_MAX_WORKERS 64       /* a worker is a bit of a holders mask */

typedef struct devidx devidx_t;

/* Hashes worker w does not hold any more, as far as the index knows (batches of at most 512). */
typedef void (*devidx_gone_fn)(void *arg, int w, const uint64_t *hashes, uint32_t n);

/* An index for workers 0..n_workers-1 (<= DEVIDX_MAX_WORKERS); default_pool_blocks (>= 2) bounds a
 * worker that never said its pool's size. NULL out of memory or on bad arguments. */
devidx_t *devidx_new(int n_workers, uint32_t default_pool_blocks);
void devidx_destroy(devidx_t **self_p);

/* Worker w holds hashes[0..n) (announced in this order); pool_blocks: its pool's size (0: not
 * said, the last one said or the default stands). The hashes this pushes out of its older
 * generation go to gone. 0, or -1 out of memory (the index is then missing some of them). */
int devidx_put(devidx_t *x, int w, const uint64_t *hashes, uint32_t n, uint32_t pool_blocks, devidx_gone_fn gone,
               void *arg);
/* Worker w said it does not hold these any more (cache_evict). */
void devidx_evict(devidx_t *x, int w, const uint64_t *hashes, uint32_t n);
/* Worker w's process ended: every hash it held goes to gone. */
void devidx_forget(devidx_t *x, int w, devidx_gone_fn gone, void *arg);

uint64_t devidx_holders(const devidx_t *x, uint64_t hash);   /* bit w: worker w holds it; 0: none */
size_t devidx_size(const devidx_t *x);                       /* distinct hashes held by any worker */
size_t devidx_held(const devidx_t *x, int w);                /* worker w's entries */
uint64_t devidx_withdrawn(const devidx_t *x);                /* hashes withdrawn (pushed out or forgotten) */

#endif
