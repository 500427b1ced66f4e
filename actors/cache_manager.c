/* actors/cache_manager.c — the cluster's KV prefix cache: the global index and the host store.
 *
 * Duties:
 *   - index every full KV block by its chained prefix hash (engine/kvcache.h: tenant salt, previous
 *     hash, tokens), with where it lives: which workers' pools (device tier, from their cache_put)
 *     and whether this actor's host store holds it;
 *   - keep the host store: a bounded array of blocks (cache.host_store_blocks) written by decode
 *     workers when a sequence finishes (cache_put tier host + kv_announce on the shared-memory
 *     channel, paired by id) and read by prefill workers (cache_fetch -> kv_announce + reply), so the
 *     next turn of a conversation skips its history on any worker. A write-back's blocks are
 *     announced to the routers when its cache_put arrives (before the request's done reaches the
 *     client); a fetch whose next block is still on its way waits for it up to PARK_MS, and a put
 *     whose blocks never come is dropped after PENDING_TIMEOUT_MS, its blocks withdrawn;
 *   - retention: cache_pin pins a prefix's blocks until an expiry (prompt_cache_key + 5 min / 1 h);
 *     a pinned block is never evicted before its time whatever the load; unpinned blocks are
 *     evicted least-recently-used; expired pins are dropped by a timer;
 *   - publish cache_event (stored / removed) to every router, so routing sees where prefixes live,
 *     and to the monitor, which counts them.
 *
 * Known limits: the host store lives in this process's memory (no disk tier yet); device-tier
 * entries are what workers announced and may be stale after a worker evicts (harmless: a stale
 * hint only costs a recompute). */
#include <stdlib.h>
#include <string.h>

#include "actors/runtime/actor.h"
#include "transfer/kv_transfer.h"
#include "transfer/shm_chan.h"
#include "common/log.h"
#include "common/u64map.h"
#include "common/util.h"

#define MAX_WORKERS      64
#define MAX_PENDING      256        /* host puts waiting for their kv_announce */
#define MAX_FETCHES      64         /* fetch segments waiting for their kv_ack */
#define FETCH_TIMEOUT_MS 2000
#define PENDING_TIMEOUT_MS 5000     /* a host put whose blocks never come */
#define MAX_PARKED       64         /* fetches waiting for a pending put's blocks */
#define PARK_MS          300        /* how long a fetch waits for them (prefill gives up at 1 s) */

typedef struct slot {
    uint64_t hash;                  /* 0 = free */
    uint64_t lru;                   /* last use tick */
    int64_t pin_until_ms;           /* pinned until then (monotonic); 0 = not pinned */
} slot_t;

typedef struct pending_put {
    uint64_t transfer_id;           /* == the cache_put's id */
    uint64_t *hashes;
    uint32_t n;
    char holder[64];
    int64_t deadline_ms;            /* its kv_announce must come by then, else it is dropped */
} pending_put_t;

typedef struct fetch {
    uint64_t transfer_id;
    tchan_seg_t seg;
    int64_t deadline_ms;
} fetch_t;

typedef struct cmgr {
    const topo_t *topo;
    const char *name, *cluster;
    const char *routers[16];        /* who gets cache events (with the monitor) */
    int n_routers;
    const char *workers[MAX_WORKERS];
    int n_workers;
    u64map_t device;                /* hash -> bitmask of worker indices holding it */
    u64map_t host;                  /* hash -> slot index + 1 */
    u64map_t pins;                  /* hash -> pin expiry (ms, monotonic): pins may precede the block */
    slot_t *slots;                  /* [n_slots] */
    int n_slots;
    uint8_t *store;                 /* [n_slots][block_bytes], allocated with the first write-back */
    size_t block_bytes;
    uint32_t shape[4];              /* n_layers, block_size, n_kv_heads, head_dim of stored blocks */
    dtype_t dtype;
    pending_put_t pending[MAX_PENDING];
    fetch_t fetches[MAX_FETCHES];
    msg_t parked[MAX_PARKED];       /* cache_fetch clones whose next block is in a pending put */
    int64_t parked_until[MAX_PARKED];
    int n_parked;
    uint64_t tick, next_transfer;
    /* stats */
    uint64_t stored, evicted, expired, fetched_blocks, fetch_queries, fetch_hits, puts_dropped, fetches_parked;
} cmgr_t;

static int s_worker_bit(cmgr_t *c, const char *name)
{
    for (int i = 0; i < c->n_workers; i++)
        if (strcmp(c->workers[i], name) == 0)
            return i;
    return -1;
}

static void s_event(actor_t *a, cmgr_t *c, msg_cache_event_kind_t kind, msg_tier_t tier, const char *holder,
                    const uint64_t *hashes, uint32_t n)
{
    if (n == 0)
        return;
    msg_t e;
    msg_init(&e, MSG_CACHE_EVENT, 0);
    e.u.cache_event.kind = kind;
    e.u.cache_event.tier = tier;
    e.u.cache_event.holder = holder;
    e.u.cache_event.hashes = hashes;
    e.u.cache_event.n_hashes = n;
    for (int i = 0; i < c->n_routers; i++)
        actor_send(a, c->routers[i], &e);
}

static int s_pinned(cmgr_t *c, uint64_t hash, int64_t now)
{
    uint64_t *p = u64map_get(&c->pins, hash);
    return p && (int64_t)*p > now;
}

/* A slot for a new block: a free one, else the least recently used unpinned one (evicted; its
 * hash is added to evicted[*n_evicted] for one batched removed event). -1 when every slot is
 * pinned. */
static int s_take_slot(cmgr_t *c, int64_t now, uint64_t *evicted, uint32_t *n_evicted)
{
    int best = -1;
    for (int i = 0; i < c->n_slots; i++) {
        if (!c->slots[i].hash)
            return i;
        if (s_pinned(c, c->slots[i].hash, now))
            continue;
        if (best < 0 || c->slots[i].lru < c->slots[best].lru)
            best = i;
    }
    if (best >= 0) {
        uint64_t h = c->slots[best].hash;
        u64map_del(&c->host, h);
        c->slots[best].hash = 0;
        c->evicted++;
        evicted[(*n_evicted)++] = h;
    }
    return best;
}

/* ---- device tier: what workers hold ------------------------------------------------------ */

static int s_on_put(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    const msg_cache_put_t *p = &m->u.cache_put;
    if (p->tier == MSG_TIER_HOST) {
        /* The blocks follow in a kv_announce with transfer_id == m->id. */
        pending_put_t *slot = NULL;
        for (int i = 0; i < MAX_PENDING && !slot; i++)
            if (!c->pending[i].hashes)
                slot = &c->pending[i];
        if (!slot) {
            c->puts_dropped++;
            return 0;
        }
        slot->hashes = malloc(p->n_hashes * sizeof *slot->hashes);
        if (!slot->hashes)
            return 0;
        memcpy(slot->hashes, p->hashes, p->n_hashes * sizeof *slot->hashes);
        slot->n = p->n_hashes;
        slot->transfer_id = m->id;
        slot->deadline_ms = now_ms() + PENDING_TIMEOUT_MS;
        snprintf(slot->holder, sizeof slot->holder, "%s", p->holder);
        /* Told to the routers now, before the blocks land: a conversation's next turn may be routed
         * before then, and its fetch waits for them here (s_on_fetch) instead of missing them. */
        s_event(a, c, MSG_CEV_STORED, MSG_TIER_HOST, c->name, p->hashes, p->n_hashes);
        return 0;
    }
    int bit = s_worker_bit(c, p->holder);
    if (bit < 0)
        return 0;
    for (uint32_t i = 0; i < p->n_hashes; i++) {
        uint64_t *v = u64map_get(&c->device, p->hashes[i]);
        u64map_put(&c->device, p->hashes[i], (v ? *v : 0) | (1ULL << bit));
    }
    s_event(a, c, MSG_CEV_STORED, MSG_TIER_DEVICE, p->holder, p->hashes, p->n_hashes);
    return 0;
}

static int s_on_evict(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    const msg_cache_evict_t *e = &m->u.cache_evict;
    int bit = s_worker_bit(c, e->holder);
    if (bit < 0)
        return 0;
    for (uint32_t i = 0; i < e->n_hashes; i++) {
        uint64_t *v = u64map_get(&c->device, e->hashes[i]);
        if (v && !(*v &= ~(1ULL << bit)))
            u64map_del(&c->device, e->hashes[i]);
    }
    s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_DEVICE, e->holder, e->hashes, e->n_hashes);
    return 0;
}

/* ---- host tier: write-backs in, fetches out ---------------------------------------------- */

/* 1 when a host put still waiting for its blocks names this hash. */
static int s_pending_has(const cmgr_t *c, uint64_t hash)
{
    for (int i = 0; i < MAX_PENDING; i++)
        for (uint32_t j = 0; c->pending[i].hashes && j < c->pending[i].n; j++)
            if (c->pending[i].hashes[j] == hash)
                return 1;
    return 0;
}

static void s_answer_parked(actor_t *a, cmgr_t *c, int64_t now);

/* A pending put is over (its blocks stored, refused, or never come): the hashes it announced that
 * the store does not hold are withdrawn, and fetches waiting on it are answered. */
static void s_end_pending(actor_t *a, cmgr_t *c, pending_put_t *p)
{
    uint64_t gone[512];
    uint32_t n_gone = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        if (u64map_get(&c->host, p->hashes[i]))
            continue;
        gone[n_gone++] = p->hashes[i];
        if (n_gone == 512) {
            s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_HOST, c->name, gone, n_gone);
            n_gone = 0;
        }
    }
    s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_HOST, c->name, gone, n_gone);
    free(p->hashes);
    memset(p, 0, sizeof *p);
    s_answer_parked(a, c, now_ms());
}

static int s_on_announce(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    const msg_kv_announce_t *k = &m->u.kv_announce;
    pending_put_t *p = NULL;
    for (int i = 0; i < MAX_PENDING && !p; i++)
        if (c->pending[i].hashes && c->pending[i].transfer_id == k->transfer_id &&
            strcmp(c->pending[i].holder, k->src) == 0)
            p = &c->pending[i];
    if (!p) {
        kvx_ack(a, k->src, k->transfer_id, 0, "no cache_put announced these blocks", NULL, 0);
        return 0;
    }
    char err[256];
    const char *why = NULL;
    size_t bb = k->n_block_ids ? (size_t)(k->total_bytes / k->n_block_ids) : 0;
    if (k->n_block_ids != p->n || bb == 0 || (uint64_t)bb * k->n_block_ids != k->total_bytes) {
        why = "kv_announce and cache_put disagree";
    } else if (!c->store) {
        c->store = malloc((size_t)c->n_slots * bb);
        c->block_bytes = bb;
        c->shape[0] = k->n_layers, c->shape[1] = k->block_size, c->shape[2] = k->n_kv_heads, c->shape[3] = k->head_dim;
        c->dtype = k->dtype;
        if (!c->store)
            why = "out of memory for the host store";
        else
            LOG_I("host store: %d blocks of %zu bytes (%.1f MiB)", c->n_slots, bb, (double)c->n_slots * bb / (1 << 20));
    } else if (bb != c->block_bytes || k->n_layers != c->shape[0] || k->block_size != c->shape[1] ||
               k->n_kv_heads != c->shape[2] || k->head_dim != c->shape[3] || k->dtype != c->dtype) {
        why = "block shape differs from the store's";
    }
    tchan_seg_t seg = {0};
    if (!why && tchan_shm_open(&seg, k->handle, k->handle_len, (size_t)k->total_bytes, err, sizeof err) != 0)
        why = err;
    if (!why) {
        int64_t now = now_ms();
        uint64_t added[512], evicted[512];
        uint32_t n_added = 0, n_evicted = 0;
        for (uint32_t i = 0; i < p->n; i++) {
            uint64_t *s = u64map_get(&c->host, p->hashes[i]);
            if (s) {
                c->slots[*s - 1].lru = ++c->tick;
                continue;
            }
            if (n_evicted == 512) {
                s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_HOST, c->name, evicted, n_evicted);
                n_evicted = 0;
            }
            int slot = s_take_slot(c, now, evicted, &n_evicted);
            if (slot < 0)
                break;   /* every slot pinned: the rest of this sequence is not stored */
            memcpy(c->store + (size_t)slot * bb, (uint8_t *)seg.ptr + (size_t)i * bb, bb);
            c->slots[slot] = (slot_t){.hash = p->hashes[i], .lru = ++c->tick};
            u64map_put(&c->host, p->hashes[i], (uint64_t)slot + 1);
            c->stored++;
            added[n_added++] = p->hashes[i];
            if (n_added == 512) {
                s_event(a, c, MSG_CEV_STORED, MSG_TIER_HOST, c->name, added, n_added);
                n_added = 0;
            }
        }
        s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_HOST, c->name, evicted, n_evicted);
        s_event(a, c, MSG_CEV_STORED, MSG_TIER_HOST, c->name, added, n_added);
    }
    tchan_shm_close(&seg);
    kvx_ack(a, k->src, k->transfer_id, why == NULL, why, NULL, 0);
    s_end_pending(a, c, p);
    return 0;
}

/* A prefill worker asks for blocks of the host store: the leading run it has is copied into a
 * segment and announced; the reply says how many (0: nothing to wait for). */
/* The leading hashes of a fetch that the store holds. */
static uint32_t s_found(const cmgr_t *c, const msg_cache_fetch_t *f)
{
    uint32_t found = 0;
    while (found < f->n_hashes && u64map_get(&c->host, f->hashes[found]))
        found++;
    return found;
}

/* Sends what the store holds of a fetch's leading blocks (a kv_announce on a shared-memory segment
 * and the reply), or found = 0. */
static void s_answer_fetch(actor_t *a, cmgr_t *c, const msg_t *m)
{
    const msg_cache_fetch_t *f = &m->u.cache_fetch;
    const uint32_t found = s_found(c, f);
    fetch_t *ft = NULL;
    for (int i = 0; i < MAX_FETCHES && !ft; i++)
        if (!c->fetches[i].seg.ptr)
            ft = &c->fetches[i];
    char err[256];
    msg_t r;
    msg_init(&r, MSG_CACHE_FETCH_REPLY, m->id);
    if (found == 0 || !ft ||
        tchan_shm_create(&ft->seg, c->cluster, ++c->next_transfer, (size_t)found * c->block_bytes, err, sizeof err) != 0) {
        r.u.cache_fetch_reply.found = 0;
        actor_send(a, f->reply_to, &r);
        return;
    }
    ft->transfer_id = c->next_transfer;
    ft->deadline_ms = now_ms() + FETCH_TIMEOUT_MS;
    uint32_t *ids = malloc(found * sizeof *ids);
    if (!ids) {
        tchan_shm_close(&ft->seg);
        r.u.cache_fetch_reply.found = 0;
        actor_send(a, f->reply_to, &r);
        return;
    }
    for (uint32_t i = 0; i < found; i++) {
        uint64_t slot = *u64map_get(&c->host, f->hashes[i]) - 1;
        c->slots[slot].lru = ++c->tick;
        memcpy((uint8_t *)ft->seg.ptr + (size_t)i * c->block_bytes, c->store + slot * c->block_bytes, c->block_bytes);
        ids[i] = (uint32_t)slot;
    }
    c->fetch_hits += found;
    c->fetched_blocks += found;
    bk_kv_t shape = {.dtype = c->dtype, .block_size = (int)c->shape[1], .n_layers = (int)c->shape[0],
                     .n_kv_heads = (int)c->shape[2], .head_dim = (int)c->shape[3], .block_bytes = c->block_bytes};
    msg_t an;
    kvx_announce(&an, ft->transfer_id, m->id, &shape, ids, found, MSG_CHAN_SHM,
                 (const uint8_t *)ft->seg.name, (uint32_t)strlen(ft->seg.name), c->name, FETCH_TIMEOUT_MS);
    r.u.cache_fetch_reply.found = found;
    r.u.cache_fetch_reply.transfer_id = ft->transfer_id;
    if (actor_send(a, f->reply_to, &an) != 0 || actor_send(a, f->reply_to, &r) != 0)
        tchan_shm_close(&ft->seg);
    free(ids);
}

/* A fetch whose next block is still on its way (a write-back announced by cache_put whose
 * kv_announce has not landed) waits for it, up to PARK_MS; any other is answered at once. */
static int s_on_fetch(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    const msg_cache_fetch_t *f = &m->u.cache_fetch;
    c->fetch_queries += f->n_hashes;
    const uint32_t found = s_found(c, f);
    char err[128];
    if (found < f->n_hashes && c->n_parked < MAX_PARKED && s_pending_has(c, f->hashes[found]) &&
        msg_clone(m, &c->parked[c->n_parked], err, sizeof err) == 0) {
        c->parked_until[c->n_parked++] = now_ms() + PARK_MS;
        c->fetches_parked++;
        return 0;
    }
    s_answer_fetch(a, c, m);
    return 0;
}

/* Answers the parked fetches that need not wait any more: their next block landed, its put
 * ended without it, or PARK_MS passed. */
static void s_answer_parked(actor_t *a, cmgr_t *c, int64_t now)
{
    for (int i = 0; i < c->n_parked;) {
        const msg_cache_fetch_t *f = &c->parked[i].u.cache_fetch;
        const uint32_t found = s_found(c, f);
        if (now < c->parked_until[i] && found < f->n_hashes && s_pending_has(c, f->hashes[found])) {
            i++;
            continue;
        }
        s_answer_fetch(a, c, &c->parked[i]);
        msg_free(&c->parked[i]);
        c->parked[i] = c->parked[--c->n_parked];
        c->parked_until[i] = c->parked_until[c->n_parked];
    }
}

static int s_on_kv_ack(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    for (int i = 0; i < MAX_FETCHES; i++)
        if (c->fetches[i].seg.ptr && c->fetches[i].transfer_id == m->u.kv_ack.transfer_id)
            tchan_shm_close(&c->fetches[i].seg);
    return 0;
}

/* ---- retention --------------------------------------------------------------------------- */

static int s_on_pin(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    const msg_cache_pin_t *p = &m->u.cache_pin;
    int64_t until = now_ms() + (int64_t)p->expires_in_ms;
    for (uint32_t i = 0; i < p->n_hashes; i++) {
        uint64_t *v = u64map_get(&c->pins, p->hashes[i]);
        if (!v || (int64_t)*v < until)
            u64map_put(&c->pins, p->hashes[i], (uint64_t)until);
    }
    LOG_D("pinned %u blocks under '%s' for %llu ms", p->n_hashes, p->prompt_cache_key,
          (unsigned long long)p->expires_in_ms);
    return 0;
}

static int s_on_unpin(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    for (uint32_t i = 0; i < m->u.cache_unpin.n_hashes; i++)
        u64map_del(&c->pins, m->u.cache_unpin.hashes[i]);
    return 0;
}

/* Drops expired pins (the blocks stay, now evictable) and abandoned fetch segments. */
static int s_expire(actor_t *a, void *state)
{
    cmgr_t *c = state;
    int64_t now = now_ms();
    for (size_t i = 0; i < c->pins.cap; i++) {
        if (!c->pins.keys[i] || (int64_t)c->pins.vals[i] > now)
            continue;
        uint64_t h = c->pins.keys[i];
        u64map_del(&c->pins, h);
        c->expired++;
        i--;   /* backward-shift deletion may have moved another entry into slot i */
    }
    for (int i = 0; i < MAX_FETCHES; i++)
        if (c->fetches[i].seg.ptr && now > c->fetches[i].deadline_ms)
            tchan_shm_close(&c->fetches[i].seg);
    for (int i = 0; i < MAX_PENDING; i++)
        if (c->pending[i].hashes && now > c->pending[i].deadline_ms) {
            LOG_W("write-back %llu from %s: its blocks never came; dropped", (unsigned long long)c->pending[i].transfer_id,
                  c->pending[i].holder);
            s_end_pending(a, c, &c->pending[i]);
        }
    s_answer_parked(a, c, now);
    return 0;
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    cmgr_t *c = state;
    int used = 0, pinned = 0;
    int64_t now = now_ms();
    for (int i = 0; i < c->n_slots; i++) {
        used += c->slots[i].hash != 0;
        pinned += c->slots[i].hash && s_pinned(c, c->slots[i].hash, now);
    }
    actor_stat_metric(a, st, "host_blocks_used", used, 0);
    actor_stat_metric(a, st, "host_blocks_free", c->n_slots - used, 0);
    actor_stat_metric(a, st, "host_blocks_pinned", pinned, 0);
    actor_stat_metric(a, st, "pins", (double)c->pins.n, 0);
    actor_stat_metric(a, st, "device_blocks_indexed", (double)c->device.n, 0);
    actor_stat_metric(a, st, "blocks_stored_total", (double)c->stored, 1);
    actor_stat_metric(a, st, "blocks_evicted_total", (double)c->evicted, 1);
    actor_stat_metric(a, st, "pins_expired_total", (double)c->expired, 1);
    actor_stat_metric(a, st, "fetch_queries_total", (double)c->fetch_queries, 1);
    actor_stat_metric(a, st, "fetch_hits_total", (double)c->fetch_hits, 1);
    actor_stat_metric(a, st, "fetches_parked_total", (double)c->fetches_parked, 1);
}

static const actor_handler_t s_handlers[] = {
    {MSG_CACHE_PUT, s_on_put},       {MSG_CACHE_EVICT, s_on_evict}, {MSG_KV_ANNOUNCE, s_on_announce},
    {MSG_CACHE_FETCH, s_on_fetch},   {MSG_KV_ACK, s_on_kv_ack},     {MSG_CACHE_PIN, s_on_pin},
    {MSG_CACHE_UNPIN, s_on_unpin},
};

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_CACHE_MANAGER);
    if (!a)
        return 2;
    const topo_t *t = actor_topo(a);
    cmgr_t *c = calloc(1, sizeof *c);
    c->topo = t;
    c->name = actor_self(a)->name;
    c->cluster = t->name;
    c->n_slots = t->cache.host_store_blocks;
    c->slots = calloc((size_t)(c->n_slots ? c->n_slots : 1), sizeof *c->slots);
    u64map_init(&c->device, 1024);
    u64map_init(&c->host, 1024);
    u64map_init(&c->pins, 256);
    for (int i = 0; i < t->n_instances; i++) {
        const topo_instance_t *in = &t->instances[i];
        if ((in->role == ROLE_ROUTER || in->role == ROLE_MONITOR) && c->n_routers < 16)
            c->routers[c->n_routers++] = in->name;
        if ((in->role == ROLE_PREFILL || in->role == ROLE_DECODE) && c->n_workers < MAX_WORKERS)
            c->workers[c->n_workers++] = in->name;
    }
    tchan_shm_sweep(t->name);
    c->next_transfer = kvx_first_id();
    actor_timer_add(a, 100, s_expire);
    actor_ops_t ops = {.handlers = s_handlers, .n_handlers = ARRAY_LEN(s_handlers), .fill_stats = s_fill_stats};
    int rc = actor_run(a, &ops, c);
    for (int i = 0; i < MAX_PENDING; i++)
        free(c->pending[i].hashes);
    for (int i = 0; i < c->n_parked; i++)
        msg_free(&c->parked[i]);
    for (int i = 0; i < MAX_FETCHES; i++)
        tchan_shm_close(&c->fetches[i].seg);
    u64map_free(&c->device);
    u64map_free(&c->host);
    u64map_free(&c->pins);
    free(c->slots);
    free(c->store);
    free(c);
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
