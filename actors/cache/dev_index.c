/* actors/cache/dev_index.c — the device tier's index, each worker's share bounded by its pool (see
 * dev_index.h). */
#include "actors/cache/dev_index.h"

#include <stdlib.h>

#include "common/u64map.h"

/* One worker's announced hashes in two disjoint generations (hash -> 1): a hash announced again
 * moves from old to cur. */
typedef struct {
    u64map_t cur, old;
    uint32_t gen_cap;               /* cur rotates at this many: half the pool */
} devgen_t;

struct devidx {
    u64map_t holders;               /* hash -> bitmask of the workers holding it */
    devgen_t w[DEVIDX_MAX_WORKERS];
    int n_workers;
    uint32_t default_gen_cap;
    uint64_t withdrawn;
};

devidx_t *devidx_new(int n_workers, uint32_t default_pool_blocks)
{
    if (n_workers < 0 || n_workers > DEVIDX_MAX_WORKERS || default_pool_blocks < 2)
        return NULL;
    devidx_t *x = calloc(1, sizeof *x);
    if (!x || u64map_init(&x->holders, 1024) != 0) {
        free(x);
        return NULL;
    }
    x->n_workers = n_workers;
    x->default_gen_cap = default_pool_blocks / 2;
    for (int i = 0; i < n_workers; i++)
        x->w[i].gen_cap = x->default_gen_cap;
    return x;
}

void devidx_destroy(devidx_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    devidx_t *x = *self_p;
    for (int i = 0; i < x->n_workers; i++) {
        u64map_free(&x->w[i].cur);
        u64map_free(&x->w[i].old);
    }
    u64map_free(&x->holders);
    free(x);
    *self_p = NULL;
}

/* Worker w no longer holds hash: its bit goes, and the hash with its last holder. */
static void s_unmark(devidx_t *x, int w, uint64_t hash)
{
    uint64_t *v = u64map_get(&x->holders, hash);
    if (v && !(*v &= ~(1ULL << w)))
        u64map_del(&x->holders, hash);
}

/* Withdraws every hash of m (one of worker w's generations) and empties it. */
static void s_withdraw(devidx_t *x, int w, u64map_t *m, devidx_gone_fn gone, void *arg)
{
    uint64_t batch[512];
    uint32_t n = 0;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        s_unmark(x, w, m->keys[i]);
        batch[n++] = m->keys[i];
        x->withdrawn++;
        if (n == sizeof batch / sizeof batch[0]) {
            if (gone)
                gone(arg, w, batch, n);
            n = 0;
        }
    }
    if (n && gone)
        gone(arg, w, batch, n);
    u64map_free(m);
}

int devidx_put(devidx_t *x, int w, const uint64_t *hashes, uint32_t n, uint32_t pool_blocks, devidx_gone_fn gone,
               void *arg)
{
    if (w < 0 || w >= x->n_workers)
        return -1;
    devgen_t *g = &x->w[w];
    if (pool_blocks >= 2)
        g->gen_cap = pool_blocks / 2;
    int rc = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint64_t h = hashes[i];
        if (!h || u64map_get(&g->cur, h))
            continue;
        const int was_old = u64map_del(&g->old, h);
        if (u64map_put(&g->cur, h, 1) != 0) {
            if (was_old)
                s_unmark(x, w, h);
            rc = -1;
            continue;
        }
        if (!was_old) {
            const uint64_t *v = u64map_get(&x->holders, h);
            if (u64map_put(&x->holders, h, (v ? *v : 0) | (1ULL << w)) != 0) {
                u64map_del(&g->cur, h);
                rc = -1;
                continue;
            }
        }
        if (g->cur.n >= g->gen_cap) {   /* rotate: the older generation is what the pool lost */
            s_withdraw(x, w, &g->old, gone, arg);
            g->old = g->cur;
            g->cur = (u64map_t){0};   /* allocated by the next put */
        }
    }
    return rc;
}

void devidx_evict(devidx_t *x, int w, const uint64_t *hashes, uint32_t n)
{
    if (w < 0 || w >= x->n_workers)
        return;
    devgen_t *g = &x->w[w];
    for (uint32_t i = 0; i < n; i++)
        if (u64map_del(&g->cur, hashes[i]) || u64map_del(&g->old, hashes[i]))
            s_unmark(x, w, hashes[i]);
}

void devidx_forget(devidx_t *x, int w, devidx_gone_fn gone, void *arg)
{
    if (w < 0 || w >= x->n_workers)
        return;
    s_withdraw(x, w, &x->w[w].cur, gone, arg);
    s_withdraw(x, w, &x->w[w].old, gone, arg);
}

uint64_t devidx_holders(const devidx_t *x, uint64_t hash)
{
    const uint64_t *v = u64map_get(&x->holders, hash);
    return v ? *v : 0;
}

size_t devidx_size(const devidx_t *x) { return x->holders.n; }

size_t devidx_held(const devidx_t *x, int w)
{
    return w >= 0 && w < x->n_workers ? x->w[w].cur.n + x->w[w].old.n : 0;
}

uint64_t devidx_withdrawn(const devidx_t *x) { return x->withdrawn; }
