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
 *   - the disk tier below the host store (cache.disk_dir, actors/cache/): a block the host store
 *     evicts spills to disk (least recently used first, pinned ones last) and comes back into the
 *     host store when a fetch asks for it, if reading them beats computing them: the fetch
 *     carries the worker's budget per block (its compute time of one), this actor times its own
 *     reads, and the fetch waits for them a margin over their expected time
 *     (actors/worker/fetch_policy.h), reading all of them at once from the moment the prefill
 *     worker asks (when the request arrives, before it is scheduled); when the wait ends it is
 *     answered with the leading blocks that arrived, and reads still running land in memory for
 *     the next fetch. Blocks a disk too slow for the budget would bring are not read: the fetch
 *     gets what memory holds before them. Pinned blocks are also written through as they arrive
 *     (those past the free I/O jobs are owed and written as jobs come back), so a pinned
 *     conversation survives a restart of this actor or of the whole cluster: the disk's index is
 *     read back at start and announced to each router when it connects. All file I/O
 *     runs on the disk tier's threads (disk_io.h: a fetch's reads in parallel, writes in order);
 *     their completions wake this loop;
 *   - publish cache_event (stored / removed) to every router, so routing sees where prefixes live,
 *     and to the monitor, which counts them. Tier "host" in these events means "this actor can serve
 *     it", from memory or from disk: the routers' hints need no more.
 *
 * A graceful stop (TERM) writes the host store's blocks that are not on disk yet, newest first,
 * within the grace period.
 *
 * Known limits: device-tier entries are what workers announced, kept within each worker's pool by
 * the order of its announcements (actors/cache/dev_index.h: workers do not say when their pool
 * drops a block), so some may be stale (harmless: a stale hint only costs a recompute); a worker's
 * entries go when its connection drops (its process ended); after a kill -9, unpinned blocks that
 * were only in memory are lost (pinned and spilled ones are on disk); a fetch asking for more
 * blocks than the host store holds gets the leading ones that fit (in the slots other waiting
 * fetches do not keep for themselves), each read from disk once; disk blocks are served through
 * the host store, so when memory holds only pinned blocks that the (full) disk cannot take, blocks
 * on disk cannot come back (disk_promotions_failed_total). */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "actors/cache/disk_io.h"
#include "actors/cache/dev_index.h"
#include "actors/cache/disk_store.h"
#include "actors/cache/fingerprint.h"
#include "actors/runtime/actor.h"
#include "actors/worker/fetch_policy.h"
#include "transfer/kv_transfer.h"
#include "transfer/shm_chan.h"
#include "common/log.h"
#include "common/u64map.h"
#include "common/util.h"

#define MAX_WORKERS      DEVIDX_MAX_WORKERS
#define DEVICE_POOL_DEFAULT 65536   /* blocks a worker's pool is taken to hold when nothing says */
#define MAX_PENDING      256        /* host puts waiting for their kv_announce */
#define MAX_FETCHES      64         /* fetch segments waiting for their kv_ack */
#define FETCH_TIMEOUT_MS 2000
#define PENDING_TIMEOUT_MS 5000     /* a host put whose blocks never come */
#define MAX_PARKED       64         /* fetches waiting for a pending put's blocks */
#define PARK_MS          300        /* how long a fetch waits for them (prefill holds >= 1 s) */
#define DISK_JOBS        256        /* disk reads and writes in flight, each with a block buffer */
#define DISK_THREADS     4          /* I/O threads: a fetch's reads run this many at a time */
#define DIRTY_PER_TICK   256        /* pin changes written to record headers per timer tick */
#define PERSIST_RESERVE  DISK_THREADS /* I/O jobs write-throughs leave free: a fetch's reads start at once */

typedef struct slot {
    uint64_t hash;                  /* 0 = free */
    uint64_t lru;                   /* last use tick */
    int64_t pin_until_ms;           /* pinned until then (monotonic); 0 = not pinned */
    uint8_t from_disk;              /* read back from disk and not served yet: its next hit counts as disk's */
    uint32_t guards;                /* parked fetches keeping it for their answer: it is not evicted while > 0 */
    uint8_t owed;                   /* pinned, not on disk: its write-through waits for a free I/O job */
} slot_t;

typedef struct pending_put {
    uint64_t transfer_id;           /* == the cache_put's id */
    uint64_t *hashes;
    uint32_t n;
    char holder[64];
    int64_t deadline_ms;            /* its kv_announce must come by then, else it is dropped */
} pending_put_t;

/* A fetch waiting for blocks on their way (a write-back's, or disk reads). It is served at most
 * its leading `window` blocks: the host store's size at first, lowered to the first block memory
 * cannot take. The blocks of its window that reach memory are guarded until it is answered, so
 * neither its own later reads nor anything else evicts a block it will serve. */
typedef struct parked {
    msg_t m;                        /* the cache_fetch, cloned */
    int64_t until;                  /* answered by then with what it has */
    int64_t since;                  /* parked then; its disk wait runs from it */
    int64_t park_until;             /* its wait for a write-back (PARK_MS), whatever the disk's */
    uint32_t n_disk;                /* blocks of its window only the disk held when it parked: 0, none
                                     * (or not worth reading), else their wait follows the read time */
    uint32_t window;                /* <= the fetch's n_hashes and the host store's size */
    uint8_t *held;                  /* [window when parked] 1: hashes[i]'s block is in memory, guarded for it */
} parked_t;

typedef struct fetch {
    uint64_t transfer_id;
    tchan_seg_t seg;
    int64_t deadline_ms;
} fetch_t;

typedef struct cmgr {
    const topo_t *topo;
    const char *name, *cluster;
    const char *routers[16];        /* who gets cache events (with the monitor) */
    int is_router[16];              /* 1: a router (gets the whole index when it connects) */
    int n_routers;
    const char *workers[MAX_WORKERS];
    int n_workers;
    devidx_t *device;               /* hash -> the workers holding it, each bounded by its pool */
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
    parked_t parked[MAX_PARKED];    /* fetches whose next block is in a pending put or on disk */
    int n_parked;
    int n_guarded;                  /* host slots with guards > 0 */
    int reads_in_flight;            /* disk reads submitted, not done: each takes a host slot when it lands */
    int n_owed;                     /* host slots with owed set */
    int owed_next;                  /* where the next scan for owed slots starts (they go out in turn) */
    uint64_t tick, next_transfer;
    /* disk tier: NULL without cache.disk_dir */
    dstore_t *disk;
    dio_t *dio;
    int disk_failed;                /* its file header could not be written: nothing more goes to disk */
    u64map_t tenants;               /* hash -> tenant hash of its pin, for the disk record */
    uint64_t gone[512];             /* hashes that left every tier of this store, for one removed event */
    uint32_t n_gone;
    /* stats */
    uint64_t stored, evicted, expired, fetched_blocks, fetch_queries, fetch_hits, puts_dropped, fetches_parked;
    uint64_t hits_host, hits_disk;  /* blocks served by fetches, by the tier they were in */
    uint64_t spills, persists;      /* disk writes: host evictions, pinned blocks written through */
    uint64_t persists_deferred;     /* write-throughs that had to wait for an I/O job (owed) */
    uint64_t spills_shed, spills_shed_full; /* writes not made: no job free for a spill / disk full or all pinned */
    uint64_t disk_write_errors, disk_reads, disk_read_failed, disk_reads_not_started;
    uint64_t disk_corrupt, disk_foreign; /* reads refused (since start; the store counts those at open) */
    uint64_t promotions_failed;     /* blocks read back that memory (all pinned, disk full) could not take */
    uint64_t drain_spills;          /* blocks written at shutdown */
    int *drain_order;               /* host slots by last use, newest first (built when draining starts) */
    int drain_next;                 /* next index into drain_order */
    double read_ms_sum, read_ms_max;  /* reads finished since the last stats */
    uint64_t reads_window;
    double read_ms_last;            /* mean read latency over the last stats window that had reads */
    double read_ms_avg;             /* moving average of every read's time (0: none yet): the disk's
                                     * cost of a block for fetches, s_disk_block_ms */
    uint64_t disk_declined;         /* disk-only blocks fetches did not read: computing them is faster */
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

/* A block that left every tier of this store: one removed event for a batch of them. */
static void s_flush_gone(actor_t *a, cmgr_t *c)
{
    s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_HOST, c->name, c->gone, c->n_gone);
    c->n_gone = 0;
}

static void s_gone(actor_t *a, cmgr_t *c, uint64_t hash)
{
    if (c->n_gone == ARRAY_LEN(c->gone))
        s_flush_gone(a, c);
    c->gone[c->n_gone++] = hash;
}

/* ---- disk tier: writes ------------------------------------------------------------------- */

/* The wall-clock expiry of hash's pin (0: none), for the disk record. */
static int64_t s_pin_wall(cmgr_t *c, uint64_t hash, int64_t now)
{
    uint64_t *p = u64map_get(&c->pins, hash);
    return p && (int64_t)*p > now ? wall_ms() + ((int64_t)*p - now) : 0;
}

static uint64_t s_tenant_of(cmgr_t *c, uint64_t hash)
{
    uint64_t *t = u64map_get(&c->tenants, hash);
    return t ? *t : 0;
}

/* Queues hash's block (data) for the disk. 1 when it is there or on its way; 0 when shed (the
 * disk full of pinned or busy blocks, or off); -1 when every I/O job is in flight: a spill (persist
 * 0) is then shed and counted, a write-through (persist 1) is not counted: its caller owes it
 * (s_persist). A slot taken from another block that is in neither tier any more is withdrawn from
 * the routers. */
static int s_disk_write(actor_t *a, cmgr_t *c, uint64_t hash, const uint8_t *data, int64_t now, int persist)
{
    if (!c->disk || c->disk_failed || !c->disk->formatted)
        return 0;
    if (dstore_find(c->disk, hash) >= 0)
        return 1;
    dio_job_t *j = dio_get(c->dio);
    if (!j) {
        if (!persist)
            c->spills_shed++;
        return -1;
    }
    uint64_t victim = 0;
    int64_t slot = dstore_alloc(c->disk, hash, wall_ms(), &victim);
    if (slot < 0) {
        dio_put(c->dio, j);
        c->spills_shed_full++;
        return 0;
    }
    if (victim && !u64map_get(&c->host, victim))
        s_gone(a, c, victim);
    dstore_pin(c->disk, slot, s_pin_wall(c, hash, now), s_tenant_of(c, hash));
    c->disk->slots[slot].dirty = 0;   /* the write carries the pin */
    j->kind = DIO_WRITE;
    j->slot = slot;
    j->hash = hash;
    dstore_rec(c->disk, slot, &j->rec);
    memcpy(j->buf, data, c->block_bytes);
    dio_submit(c->dio, j);
    if (persist)
        c->persists++;
    else
        c->spills++;
    return 1;
}

/* Pinned blocks go to disk as they reach memory (or are pinned), so they outlive a kill. A write
 * needs an I/O job and its buffer (DISK_JOBS of them): a write-back of a long pinned prompt (500
 * blocks for 8,000 tokens) has more blocks than jobs, and a write-through that finds too few free
 * is owed instead of dropped: s_persist_owed writes it as jobs come back. Write-throughs leave
 * PERSIST_RESERVE jobs free, so a fetch arriving meanwhile starts its reads at once. */
static int s_persist_room(const cmgr_t *c)
{
    return DISK_JOBS - dio_in_flight(c->dio) > PERSIST_RESERVE;
}

/* Host slot i's block through to disk if it is pinned and not there yet; owed when no job is free. */
static void s_persist(actor_t *a, cmgr_t *c, int i, int64_t now)
{
    slot_t *s = &c->slots[i];
    if (!c->disk || c->disk_failed || !c->disk->formatted || !s->hash || !s_pinned(c, s->hash, now) ||
        dstore_find(c->disk, s->hash) >= 0)
        return;
    if (s_persist_room(c) && s_disk_write(a, c, s->hash, c->store + (size_t)i * c->block_bytes, now, 1) >= 0)
        return;   /* written, on its way, or shed (the disk full of pinned blocks: counted there) */
    if (!s->owed) {
        s->owed = 1;
        c->n_owed++;
        c->persists_deferred++;
    }
}

/* The owed write-throughs, while jobs are free: a scan of the host store from where the last one
 * stopped, so each owed block goes out in turn. Runs after completions (each frees a job) and on
 * the timer. An owed block whose pin expired meanwhile is no longer owed (it spills if evicted). */
static void s_persist_owed(actor_t *a, cmgr_t *c, int64_t now)
{
    for (int k = 0; c->n_owed > 0 && k < c->n_slots && s_persist_room(c); k++) {
        const int i = c->owed_next;
        c->owed_next = (i + 1) % c->n_slots;
        if (!c->slots[i].owed)
            continue;
        c->slots[i].owed = 0, c->n_owed--;
        s_persist(a, c, i, now);
    }
    s_flush_gone(a, c);
}

/* A slot for a new block: a free one, else the least recently used unpinned one, else (with a
 * disk tier) the least recently used pinned one; never one a parked fetch guards. The block leaving goes to disk when there is one;
 * a block that leaves every tier has its hash added to evicted[*n_evicted] for one batched removed
 * event. A pinned block leaves memory only once it is on disk or on its way. -1 when none can go. */
static int s_take_slot(actor_t *a, cmgr_t *c, int64_t now, uint64_t *evicted, uint32_t *n_evicted)
{
    int best = -1, best_pinned = -1;
    for (int i = 0; i < c->n_slots; i++) {
        if (!c->slots[i].hash)
            return i;
        if (c->slots[i].guards)
            continue;   /* a parked fetch will serve it */
        if (s_pinned(c, c->slots[i].hash, now)) {
            if (best_pinned < 0 || c->slots[i].lru < c->slots[best_pinned].lru)
                best_pinned = i;
            continue;
        }
        if (best < 0 || c->slots[i].lru < c->slots[best].lru)
            best = i;
    }
    int spilled = 0;
    if (best >= 0) {
        spilled = s_disk_write(a, c, c->slots[best].hash, c->store + (size_t)best * c->block_bytes, now, 0) > 0;
    } else if (best_pinned >= 0 && c->disk) {
        spilled = s_disk_write(a, c, c->slots[best_pinned].hash, c->store + (size_t)best_pinned * c->block_bytes, now,
                               0) > 0;
        best = spilled ? best_pinned : -1;
    }
    if (best >= 0) {
        uint64_t h = c->slots[best].hash;
        u64map_del(&c->host, h);
        c->slots[best].hash = 0;
        if (c->slots[best].owed)   /* it spilled (its write is the one owed), or its pin expired */
            c->slots[best].owed = 0, c->n_owed--;
        c->evicted++;
        if (!spilled)
            evicted[(*n_evicted)++] = h;
    }
    return best;
}

static void s_guard_new(cmgr_t *c, uint64_t hash, int slot);

/* Stores one block in the host store (a free or evicted slot), guarded for the parked fetches whose
 * window names it; the slot, or -1 when every slot is guarded, or pinned and cannot go to disk. */
static int s_host_put(actor_t *a, cmgr_t *c, uint64_t hash, const uint8_t *data, int64_t now, uint64_t *evicted,
                      uint32_t *n_evicted)
{
    if (*n_evicted == 512) {
        s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_HOST, c->name, evicted, *n_evicted);
        *n_evicted = 0;
    }
    int slot = s_take_slot(a, c, now, evicted, n_evicted);
    if (slot < 0)
        return -1;
    memcpy(c->store + (size_t)slot * c->block_bytes, data, c->block_bytes);
    c->slots[slot] = (slot_t){.hash = hash, .lru = ++c->tick};
    u64map_put(&c->host, hash, (uint64_t)slot + 1);
    c->stored++;
    s_guard_new(c, hash, slot);
    return slot;
}

/* Allocates the host store for blocks of one shape (the first write-back, or the disk file's shape
 * at start) and formats the disk tier for it when it is new. NULL, or why it failed. */
static const char *s_shape(cmgr_t *c, size_t bb, uint32_t n_layers, uint32_t block_size, uint32_t n_kv_heads,
                           uint32_t head_dim, dtype_t dtype)
{
    c->store = malloc((size_t)c->n_slots * bb);
    if (!c->store)
        return "out of memory for the host store";
    c->block_bytes = bb;
    c->shape[0] = n_layers, c->shape[1] = block_size, c->shape[2] = n_kv_heads, c->shape[3] = head_dim;
    c->dtype = dtype;
    LOG_I("host store: %d blocks of %zu bytes (%.1f MiB)", c->n_slots, bb, (double)c->n_slots * bb / (1 << 20));
    if (!c->disk)
        return NULL;
    char err[256];
    int fresh = !c->disk->formatted;
    if (fresh && dstore_format(c->disk, dtype, n_layers, block_size, n_kv_heads, head_dim, bb, err, sizeof err) != 0) {
        LOG_E("%s: the disk tier is off", err);
        c->disk_failed = 1;
        return NULL;
    }
    if (dio_set_block_bytes(c->dio, bb) != 0) {
        LOG_E("disk tier: out of memory for its buffers: the disk tier is off");
        c->disk_failed = 1;
        return NULL;
    }
    if (fresh) {
        dio_job_t *j = dio_get(c->dio);   /* nothing is in flight before the format */
        if (!j) {
            LOG_E("disk tier: no I/O job free for its header: the disk tier is off");
            c->disk_failed = 1;
            return NULL;
        }
        j->kind = DIO_FILE_HDR;   /* runs before any block write: jobs run in order */
        dio_submit(c->dio, j);
        LOG_I("disk tier %s: %llu slots of %llu bytes", c->disk->path, (unsigned long long)c->disk->fh.n_slots,
              (unsigned long long)c->disk->fh.slot_bytes);
    }
    return NULL;
}

/* ---- device tier: what workers hold ------------------------------------------------------ */

typedef struct {
    actor_t *a;
    cmgr_t *c;
} s_dev_ctx_t;

/* Blocks the index no longer counts in worker w's pool: the routers forget them too. */
static void s_dev_gone(void *arg, int w, const uint64_t *hashes, uint32_t n)
{
    s_dev_ctx_t *ctx = arg;
    s_event(ctx->a, ctx->c, MSG_CEV_REMOVED, MSG_TIER_DEVICE, ctx->c->workers[w], hashes, n);
}

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
    s_event(a, c, MSG_CEV_STORED, MSG_TIER_DEVICE, p->holder, p->hashes, p->n_hashes);
    /* After the stored event: the hashes this pushes out of the worker's share are removed after it. */
    s_dev_ctx_t ctx = {a, c};
    if (devidx_put(c->device, bit, p->hashes, p->n_hashes, p->pool_blocks, s_dev_gone, &ctx) != 0)
        LOG_W("out of memory indexing %u blocks of %s", p->n_hashes, p->holder);
    return 0;
}

static int s_on_evict(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    const msg_cache_evict_t *e = &m->u.cache_evict;
    int bit = s_worker_bit(c, e->holder);
    if (bit < 0)
        return 0;
    devidx_evict(c->device, bit, e->hashes, e->n_hashes);
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

/* 1 when this store can serve hash: in memory or on disk (being written counts: it is readable
 * once written). */
static int s_held(const cmgr_t *c, uint64_t hash)
{
    return u64map_get(&c->host, hash) || (c->disk && dstore_find(c->disk, hash) >= 0);
}

/* A pending put is over (its blocks stored, refused, or never come): the hashes it announced that
 * the store does not hold are withdrawn, and fetches waiting on it are answered. */
static void s_end_pending(actor_t *a, cmgr_t *c, pending_put_t *p)
{
    uint64_t gone[512];
    uint32_t n_gone = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        if (s_held(c, p->hashes[i]))
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
        why = s_shape(c, bb, k->n_layers, k->block_size, k->n_kv_heads, k->head_dim, k->dtype);
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
            const uint8_t *data = (uint8_t *)seg.ptr + (size_t)i * bb;
            const int slot = s_host_put(a, c, p->hashes[i], data, now, evicted, &n_evicted);
            if (slot < 0)
                break;   /* every slot pinned: the rest of this sequence is not stored */
            /* A pinned block goes to disk at once (or as soon as an I/O job is free): it must
             * outlive a restart. */
            s_persist(a, c, slot, now);
            added[n_added++] = p->hashes[i];
            if (n_added == 512) {
                s_event(a, c, MSG_CEV_STORED, MSG_TIER_HOST, c->name, added, n_added);
                n_added = 0;
            }
        }
        s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_HOST, c->name, evicted, n_evicted);
        s_event(a, c, MSG_CEV_STORED, MSG_TIER_HOST, c->name, added, n_added);
        s_flush_gone(a, c);
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

/* Sends what the store holds of a fetch's leading blocks (the reply, then a kv_announce on a
 * shared-memory segment), or found = 0. The reply goes first and says which blocks were read back
 * from disk for this fetch: the worker has it when the blocks land, for the request's usage. */
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
    /* The segment is filled and then copied into the worker's pool before its ack: a long prefix
     * (gigabytes) is given the time of both copies beyond FETCH_TIMEOUT_MS (fetch_policy.h's
     * allowance, which the worker's hold counts too). */
    const int64_t copy_ms = (int64_t)(2.0 * FETCH_COPY_MS_PER_MIB * (double)found * (double)c->block_bytes / (1 << 20));
    ft->deadline_ms = now_ms() + FETCH_TIMEOUT_MS + copy_ms;
    const uint32_t words = (found + 63) / 64;
    uint32_t *ids = malloc(found * sizeof *ids);
    uint64_t *mask = calloc(words, sizeof *mask);
    if (!ids || !mask) {
        free(ids);
        free(mask);
        tchan_shm_close(&ft->seg);
        r.u.cache_fetch_reply.found = 0;
        actor_send(a, f->reply_to, &r);
        return;
    }
    uint32_t from_disk = 0;
    for (uint32_t i = 0; i < found; i++) {
        uint64_t slot = *u64map_get(&c->host, f->hashes[i]) - 1;
        c->slots[slot].lru = ++c->tick;
        if (c->slots[slot].from_disk) {
            c->hits_disk++, c->slots[slot].from_disk = 0;
            mask[i / 64] |= 1ull << (i % 64);
            from_disk++;
        } else {
            c->hits_host++;
        }
        memcpy((uint8_t *)ft->seg.ptr + (size_t)i * c->block_bytes, c->store + slot * c->block_bytes, c->block_bytes);
        ids[i] = (uint32_t)slot;
    }
    c->fetch_hits += found;
    c->fetched_blocks += found;
    bk_kv_t shape = {.dtype = c->dtype, .block_size = (int)c->shape[1], .n_layers = (int)c->shape[0],
                     .n_kv_heads = (int)c->shape[2], .head_dim = (int)c->shape[3], .block_bytes = c->block_bytes};
    msg_t an;
    kvx_announce(&an, ft->transfer_id, m->id, &shape, ids, found, MSG_CHAN_SHM,
                 (const uint8_t *)ft->seg.name, (uint32_t)strlen(ft->seg.name), c->name, FETCH_TIMEOUT_MS + copy_ms);
    r.u.cache_fetch_reply.found = found;
    r.u.cache_fetch_reply.transfer_id = ft->transfer_id;
    r.u.cache_fetch_reply.found_disk = from_disk;
    r.u.cache_fetch_reply.disk_mask = mask;
    r.u.cache_fetch_reply.n_disk_mask = from_disk ? words : 0;
    if (actor_send(a, f->reply_to, &r) != 0 || actor_send(a, f->reply_to, &an) != 0)
        tchan_shm_close(&ft->seg);
    free(ids);
    free(mask);
}

/* ---- parked fetches: their windows and guards ------------------------------------------ */

static void s_guard(cmgr_t *c, parked_t *p, uint32_t k, int slot)
{
    p->held[k] = 1;
    if (c->slots[slot].guards++ == 0)
        c->n_guarded++;
}

/* hash's block just reached memory (host slot `slot`): guarded for every parked fetch whose window
 * names it, before anything else can evict it. */
static void s_guard_new(cmgr_t *c, uint64_t hash, int slot)
{
    for (int i = 0; i < c->n_parked; i++) {
        parked_t *p = &c->parked[i];
        const uint64_t *hs = p->m.u.cache_fetch.hashes;
        for (uint32_t k = 0; k < p->window; k++)
            if (hs[k] == hash && !p->held[k])
                s_guard(c, p, k, slot);
    }
}

/* Lowers p's window to w (when smaller), its blocks past w no longer guarded for it. */
static void s_shrink(cmgr_t *c, parked_t *p, uint32_t w)
{
    const uint64_t *hs = p->m.u.cache_fetch.hashes;
    for (uint32_t k = w; k < p->window; k++) {
        if (!p->held[k])
            continue;
        p->held[k] = 0;
        const uint64_t *s = u64map_get(&c->host, hs[k]);
        assert(s);   /* a guarded block never leaves memory */
        if (--c->slots[*s - 1].guards == 0)
            c->n_guarded--;
    }
    if (w < p->window)
        p->window = w;
}

/* Index of hash in p's window, or -1. */
static int64_t s_window_index(const parked_t *p, uint64_t hash)
{
    for (uint32_t k = 0; k < p->window; k++)
        if (p->m.u.cache_fetch.hashes[k] == hash)
            return k;
    return -1;
}

/* A block read back from disk that memory cannot take (every slot guarded, or pinned with no room
 * on disk): a fetch that guards a block after it in its window gives that one up, so leading blocks
 * win over later ones. 1 when a guard was released (the put may succeed now). */
static int s_make_room(cmgr_t *c, uint64_t hash)
{
    for (int i = 0; i < c->n_parked; i++) {
        parked_t *p = &c->parked[i];
        const int64_t k = s_window_index(p, hash);
        for (int64_t h = (int64_t)p->window - 1; k >= 0 && h > k; h--)
            if (p->held[h]) {
                s_shrink(c, p, (uint32_t)h);
                return 1;
            }
    }
    return 0;
}

/* Starts the disk reads of a parked fetch's blocks that are on disk only, from its first block
 * missing in memory to the end of its window. Each block missing needs a slot that no fetch guards
 * and no read in flight will take: where those run out, the window ends there (what does not fit
 * could not be served, and reading it would evict a block this or another fetch will serve), and
 * the fetch is answered with what it has instead of waiting. A block being read already (for this
 * fetch or another) has its slot counted in reads_in_flight and is guarded when it lands; one still
 * being written is read when its write ends (s_answer_parked calls here again). */
static void s_read_ahead(cmgr_t *c, parked_t *p)
{
    if (!c->disk || !c->store)
        return;
    const msg_cache_fetch_t *f = &p->m.u.cache_fetch;
    const int room = c->n_slots - c->n_guarded - c->reads_in_flight;
    int missing = 0;
    for (uint32_t i = s_found(c, f); i < p->window; i++) {
        const uint64_t h = f->hashes[i];
        if (u64map_get(&c->host, h))
            continue;
        const int64_t ds = dstore_find(c->disk, h);
        dslot_t *d = ds >= 0 ? &c->disk->slots[ds] : NULL;
        if (d && d->readers)
            continue;
        if (++missing > room) {
            s_shrink(c, p, i);
            return;
        }
        if (!d) {
            if (s_pending_has(c, h))
                continue;   /* a write-back brings it */
            return;
        }
        if (d->state != DSLOT_VALID)
            continue;
        dio_job_t *j = dio_get(c->dio);
        if (!j) {
            c->disk_reads_not_started++;
            return;
        }
        j->kind = DIO_READ;
        j->slot = ds;
        j->hash = h;
        d->readers++;
        c->reads_in_flight++;
        dstore_touch(c->disk, ds);
        dio_submit(c->dio, j);
    }
}

/* 1 while a parked fetch should wait for its next block: a write-back's or a disk read's. */
static int s_coming(const cmgr_t *c, uint64_t hash)
{
    return s_pending_has(c, hash) || (c->disk && dstore_find(c->disk, hash) >= 0);
}

/* 1: hash's block is only on disk (not in memory, no write-back bringing it). */
static int s_disk_only(const cmgr_t *c, uint64_t hash)
{
    return c->disk && !u64map_get(&c->host, hash) && !s_pending_has(c, hash) && dstore_find(c->disk, hash) >= 0;
}

/* The disk's time per block of a fetch: a fetch's reads run DISK_THREADS at a time, so a long run
 * of them moves at that many blocks per read time (the block's bytes over the tier's measured read
 * bandwidth). 0 before the first read. */
static double s_disk_block_ms(const cmgr_t *c)
{
    return c->read_ms_avg / DISK_THREADS;
}

/* When p's wait ends: its disk reads' wait (fetch_disk_wait_ms, from the read time measured now,
 * so the first reads of a disk too slow for the budget end it) or its write-back's, the later. */
static int64_t s_park_until(const cmgr_t *c, const parked_t *p)
{
    if (!p->n_disk)
        return p->park_until;
    const double w = fetch_disk_wait_ms((int)p->n_disk, s_disk_block_ms(c), p->m.u.cache_fetch.block_budget_ms);
    const int64_t disk = p->since + (int64_t)w;
    return disk > p->park_until ? disk : p->park_until;
}

/* A fetch whose next block is still on its way (a write-back announced by cache_put whose
 * kv_announce has not landed, or a block on disk) waits for it, within a window of the host
 * store's size: up to PARK_MS for a write-back, for disk reads as long as fetch_disk_wait_ms says
 * from the fetch's budget and the disk's read time (blocks not worth reading end the window
 * before the first of them); any other is answered at once. */
static int s_on_fetch(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    const msg_cache_fetch_t *f = &m->u.cache_fetch;
    c->fetch_queries += f->n_hashes;
    const uint32_t found = s_found(c, f);
    uint32_t window = f->n_hashes < (uint32_t)c->n_slots ? f->n_hashes : (uint32_t)c->n_slots;
    /* The blocks only the disk holds: read if that beats computing them, else the window ends at
     * the first (what follows it could not be adopted: the prefix breaks there). */
    uint32_t n_disk = 0, first_disk = window;
    for (uint32_t i = found; c->disk && i < window; i++)
        if (s_disk_only(c, f->hashes[i])) {
            if (!n_disk++)
                first_disk = i;
        }
    const double disk_wait = fetch_disk_wait_ms((int)n_disk, s_disk_block_ms(c), f->block_budget_ms);
    if (n_disk && disk_wait <= 0) {
        c->disk_declined += n_disk;
        window = first_disk;
        n_disk = 0;
    }
    char err[128];
    if (found < window && c->n_parked < MAX_PARKED && s_coming(c, f->hashes[found])) {
        parked_t *p = &c->parked[c->n_parked];
        *p = (parked_t){.window = window, .held = calloc(window, 1)};
        if (p->held && msg_clone(m, &p->m, err, sizeof err) == 0) {
            p->since = now_ms();
            p->park_until = p->since + (s_pending_has(c, f->hashes[found]) ? PARK_MS : 0);
            p->n_disk = n_disk;
            p->until = s_park_until(c, p);
            c->n_parked++;
            c->fetches_parked++;
            const uint64_t *hs = p->m.u.cache_fetch.hashes;
            for (uint32_t k = 0; k < window; k++) {
                const uint64_t *s = u64map_get(&c->host, hs[k]);
                if (s)
                    s_guard(c, p, k, (int)(*s - 1));
            }
            s_read_ahead(c, p);
            s_answer_parked(a, c, now_ms());   /* its window may have shrunk to what it has */
            return 0;
        }
        free(p->held);
    }
    s_answer_fetch(a, c, m);
    return 0;
}

/* Answers the parked fetches that need not wait any more: they hold their whole window, their
 * next block's put ended without it, its disk read failed, or their time passed. The others get
 * their reads. An answered fetch's guards are released. */
static void s_answer_parked(actor_t *a, cmgr_t *c, int64_t now)
{
    for (int i = 0; i < c->n_parked;) {
        parked_t *p = &c->parked[i];
        const msg_cache_fetch_t *f = &p->m.u.cache_fetch;
        p->until = s_park_until(c, p);   /* the disk's read time may be known, or better, now */
        if (now < p->until && s_found(c, f) < p->window && s_coming(c, f->hashes[s_found(c, f)])) {
            s_read_ahead(c, p);
            if (s_found(c, f) < p->window) {   /* else its window shrank to what it has: answered now */
                i++;
                continue;
            }
        }
        s_answer_fetch(a, c, &p->m);
        s_shrink(c, p, 0);
        free(p->held);
        msg_free(&p->m);
        c->parked[i] = c->parked[--c->n_parked];
    }
}

/* ---- disk tier: completions -------------------------------------------------------------- */

static void s_read_done(actor_t *a, cmgr_t *c, dio_job_t *j, int64_t now)
{
    dslot_t *d = &c->disk->slots[j->slot];
    if (d->readers)
        d->readers--;
    c->reads_in_flight--;
    c->read_ms_sum += j->ms;
    c->reads_window++;
    /* Slow to move (a fetch's hundreds of reads set it; one outlier does not), from the first read. */
    c->read_ms_avg = c->read_ms_avg > 0 ? 0.95 * c->read_ms_avg + 0.05 * j->ms : j->ms;
    if (j->ms > c->read_ms_max)
        c->read_ms_max = j->ms;
    if (j->read == DSTORE_READ_OK) {
        c->disk_reads++;
        if (!u64map_get(&c->host, j->hash)) {
            uint64_t evicted[512];
            uint32_t n_evicted = 0;
            int slot = s_host_put(a, c, j->hash, j->buf, now, evicted, &n_evicted);
            while (slot < 0 && s_make_room(c, j->hash))
                slot = s_host_put(a, c, j->hash, j->buf, now, evicted, &n_evicted);
            if (slot >= 0) {
                c->slots[slot].from_disk = 1;
            } else {
                /* Memory is all guarded blocks, or pinned ones that cannot go to disk: the fetches
                 * waiting for this one end their window before it (else they would read it again
                 * and again) and are answered with what they have. */
                c->promotions_failed++;
                for (int i = 0; i < c->n_parked; i++) {
                    const int64_t k = s_window_index(&c->parked[i], j->hash);
                    if (k >= 0)
                        s_shrink(c, &c->parked[i], (uint32_t)k);
                }
            }
            s_event(a, c, MSG_CEV_REMOVED, MSG_TIER_HOST, c->name, evicted, n_evicted);
        }
        return;
    }
    /* Never served: dropped from the index and counted. */
    c->disk_read_failed++;
    if (j->read == DSTORE_READ_FOREIGN)
        c->disk_foreign++;
    else if (j->read == DSTORE_READ_CORRUPT)
        c->disk_corrupt++;
    LOG_W("disk tier: block %016llx in slot %lld refused: %s", (unsigned long long)j->hash, (long long)j->slot, j->why);
    if (d->state == DSLOT_VALID && d->hash == j->hash && !d->readers)
        dstore_drop(c->disk, j->slot);
    if (!s_held(c, j->hash))
        s_gone(a, c, j->hash);
}

static void s_write_done(actor_t *a, cmgr_t *c, dio_job_t *j)
{
    dslot_t *d = &c->disk->slots[j->slot];
    if (d->state != DSLOT_WRITING || d->hash != j->hash)
        return;
    if (j->err == 0) {
        d->written_ms = j->rec.written_ms;
        dstore_written(c->disk, j->slot, 1, j->rec.payload_crc);
        return;
    }
    if (dstore_errno_full(-j->err))
        c->spills_shed_full++;
    else
        c->disk_write_errors++;
    LOG_D("disk tier: write of block %016llx failed: %s", (unsigned long long)j->hash, strerror(-j->err));
    dstore_written(c->disk, j->slot, 0, 0);
    if (!s_held(c, j->hash))
        s_gone(a, c, j->hash);
}

/* The disk thread finished jobs: their results into the index and the host store, then the
 * fetches that waited for them. */
static int s_on_disk(actor_t *a, void *state, void *sock)
{
    cmgr_t *c = state;
    const int64_t now = now_ms();
    for (dio_job_t *j; (j = dio_next_done(c->dio)) != NULL; dio_put(c->dio, j)) {
        switch (j->kind) {
        case DIO_FILE_HDR:
            if (j->err) {
                LOG_E("disk tier %s: cannot write its header (%s): the disk tier is off", c->disk->path,
                      strerror(-j->err));
                c->disk_failed = 1;
            }
            break;
        case DIO_WRITE:
            s_write_done(a, c, j);
            break;
        case DIO_WRITE_REC:
            if (j->err)
                c->disk_write_errors++;
            break;
        case DIO_READ:
            s_read_done(a, c, j, now);
            break;
        }
    }
    s_flush_gone(a, c);
    s_answer_parked(a, c, now);   /* before the owed writes: a waiting fetch's reads get jobs first */
    s_persist_owed(a, c, now);
    return 0;
}

/* Pin changes of blocks on disk go into their record headers, a bounded number per tick. */
static void s_flush_pins(cmgr_t *c)
{
    for (int k = 0; c->disk && c->disk->formatted && !c->disk_failed && k < DIRTY_PER_TICK; k++) {
        dio_job_t *j = dio_get(c->dio);
        if (!j)
            return;
        int64_t slot = dstore_take_dirty(c->disk);
        if (slot < 0) {
            dio_put(c->dio, j);
            return;
        }
        j->kind = DIO_WRITE_REC;
        j->slot = slot;
        j->hash = c->disk->slots[slot].hash;
        dstore_rec(c->disk, slot, &j->rec);
        dio_submit(c->dio, j);
    }
}

/* Tells a router the whole index of this store, memory and disk, so its hints are right from its
 * first request: at start (queued in the router's outbox until it connects: up to 1024 events of
 * 512 blocks) and when a router comes back after a restart of its own. */
static void s_announce_all(actor_t *a, cmgr_t *c, const char *peer)
{
    uint64_t batch[512];
    uint32_t n = 0;
    msg_t e;
    msg_init(&e, MSG_CACHE_EVENT, 0);
    e.u.cache_event.kind = MSG_CEV_STORED;
    e.u.cache_event.tier = MSG_TIER_HOST;
    e.u.cache_event.holder = c->name;
    e.u.cache_event.hashes = batch;
    uint64_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        const u64map_t *m = pass == 0 ? &c->host : c->disk ? &c->disk->index : NULL;
        for (size_t i = 0; m && i < m->cap; i++) {
            if (!m->keys[i] || (pass == 1 && u64map_get(&c->host, m->keys[i])))
                continue;
            batch[n++] = m->keys[i];
            if (n == ARRAY_LEN(batch)) {
                e.u.cache_event.n_hashes = n;
                actor_send(a, peer, &e);
                total += n, n = 0;
            }
        }
    }
    if (n) {
        e.u.cache_event.n_hashes = n;
        actor_send(a, peer, &e);
        total += n;
    }
    if (total)
        LOG_I("told %s of %llu blocks held", peer, (unsigned long long)total);
}

static const cmgr_t *s_sort_c;   /* qsort has no context argument; used only inside s_drained */

static int s_by_lru_desc(const void *x, const void *y)
{
    const uint64_t a = s_sort_c->slots[*(const int *)x].lru, b = s_sort_c->slots[*(const int *)y].lru;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* Draining (TERM): the host store's blocks that are not on disk go there, most recently used
 * first, so a graceful stop loses nothing the disk can hold; the grace period bounds it (what is
 * not queued by then is lost, as a kill loses it). Queued writes finish in dio_destroy. */
static int s_drained(actor_t *a, void *state)
{
    cmgr_t *c = state;
    if (!c->disk || c->disk_failed || !c->disk->formatted || !c->store)
        return 1;
    if (!c->drain_order) {
        c->drain_order = malloc((size_t)c->n_slots * sizeof *c->drain_order);
        if (!c->drain_order)
            return 1;
        for (int i = 0; i < c->n_slots; i++)
            c->drain_order[i] = i;
        s_sort_c = c;
        qsort(c->drain_order, (size_t)c->n_slots, sizeof *c->drain_order, s_by_lru_desc);
    }
    const int64_t now = now_ms();
    while (c->drain_next < c->n_slots) {
        if (dio_in_flight(c->dio) >= DISK_JOBS)
            return 0;   /* its completions free jobs: the next call goes on */
        const int i = c->drain_order[c->drain_next++];
        const uint64_t h = c->slots[i].hash;
        if (h && dstore_find(c->disk, h) < 0 &&
            s_disk_write(a, c, h, c->store + (size_t)i * c->block_bytes, now, 1) > 0)
            c->drain_spills++;
    }
    s_flush_pins(c);
    s_flush_gone(a, c);
    if (c->drain_spills)
        LOG_I("disk tier: %llu blocks of memory written at shutdown", (unsigned long long)c->drain_spills);
    c->drain_spills = 0;
    return 1;
}

/* A watched router reconnected (its first connection at start is not reported: the start-up
 * announcement is already queued for it). */
/* A router that connects gets the disk's index; a worker whose connection drops (its process
 * ended: a restarted one starts with an empty pool) loses its device entries. */
static void s_peer_event(actor_t *a, void *state, const char *peer, int up)
{
    cmgr_t *c = state;
    const int w = s_worker_bit(c, peer);
    if (w >= 0) {
        if (!up) {
            const size_t n = devidx_held(c->device, w);
            s_dev_ctx_t ctx = {a, c};
            devidx_forget(c->device, w, s_dev_gone, &ctx);
            LOG_I("worker %s gone: its %zu device blocks withdrawn", peer, n);
        }
        return;
    }
    if (up)
        s_announce_all(a, state, peer);
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

static uint64_t s_tenant_hash(const char *tenant)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *p = tenant; p && *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    return tenant && *tenant ? h : 0;
}

static int s_on_pin(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    const msg_cache_pin_t *p = &m->u.cache_pin;
    const int64_t now = now_ms();
    int64_t until = now + (int64_t)p->expires_in_ms;
    const uint64_t tenant = s_tenant_hash(p->tenant);
    for (uint32_t i = 0; i < p->n_hashes; i++) {
        const uint64_t h = p->hashes[i];
        uint64_t *v = u64map_get(&c->pins, h);
        if (!v || (int64_t)*v < until)
            u64map_put(&c->pins, h, (uint64_t)until);
        if (tenant)
            u64map_put(&c->tenants, h, tenant);
        if (!c->disk)
            continue;
        /* On disk: the new expiry goes into its record; only in memory: written through now. */
        int64_t ds = dstore_find(c->disk, h);
        uint64_t *hs = u64map_get(&c->host, h);
        if (ds >= 0)
            dstore_pin(c->disk, ds, s_pin_wall(c, h, now), tenant);
        else if (hs)
            s_persist(a, c, (int)(*hs - 1), now);
    }
    s_flush_gone(a, c);
    LOG_D("pinned %u blocks under '%s' for %llu ms", p->n_hashes, p->prompt_cache_key,
          (unsigned long long)p->expires_in_ms);
    return 0;
}

static int s_on_unpin(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    cmgr_t *c = state;
    for (uint32_t i = 0; i < m->u.cache_unpin.n_hashes; i++) {
        const uint64_t h = m->u.cache_unpin.hashes[i];
        u64map_del(&c->pins, h);
        u64map_del(&c->tenants, h);
        int64_t ds = c->disk ? dstore_find(c->disk, h) : -1;
        if (ds >= 0)
            dstore_pin(c->disk, ds, 0, 0);
    }
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
        u64map_del(&c->tenants, h);
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
    s_persist_owed(a, c, now);
    s_flush_pins(c);
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
    actor_stat_metric(a, st, "device_blocks_indexed", (double)devidx_size(c->device), 0);
    actor_stat_metric(a, st, "device_blocks_withdrawn_total", (double)devidx_withdrawn(c->device), 1);
    actor_stat_metric(a, st, "blocks_stored_total", (double)c->stored, 1);
    actor_stat_metric(a, st, "blocks_evicted_total", (double)c->evicted, 1);
    actor_stat_metric(a, st, "pins_expired_total", (double)c->expired, 1);
    actor_stat_metric(a, st, "fetch_queries_total", (double)c->fetch_queries, 1);
    actor_stat_metric(a, st, "fetch_hits_total", (double)c->fetch_hits, 1);
    actor_stat_metric(a, st, "fetches_parked_total", (double)c->fetches_parked, 1);
    /* Per tier: blocks and bytes held, blocks served (hits). */
    actor_stat_metric(a, st, "device_bytes_indexed", (double)devidx_size(c->device) * (double)c->block_bytes, 0);
    actor_stat_metric(a, st, "host_bytes_used", (double)used * (double)c->block_bytes, 0);
    actor_stat_metric(a, st, "fetch_hits_host_total", (double)c->hits_host, 1);
    if (!c->disk)
        return;
    uint64_t d_used = 0, d_pinned = 0, d_bytes = 0;
    dstore_usage(c->disk, wall_ms(), &d_used, &d_pinned, &d_bytes);
    if (c->reads_window) {
        c->read_ms_last = c->read_ms_sum / (double)c->reads_window;
        c->read_ms_sum = 0, c->reads_window = 0;
    }
    actor_stat_metric(a, st, "fetch_hits_disk_total", (double)c->hits_disk, 1);
    actor_stat_metric(a, st, "disk_blocks_used", (double)d_used, 0);
    actor_stat_metric(a, st, "disk_blocks_capacity", (double)(c->disk->formatted ? c->disk->fh.n_slots : 0), 0);
    actor_stat_metric(a, st, "disk_blocks_pinned", (double)d_pinned, 0);
    actor_stat_metric(a, st, "disk_bytes_used", (double)d_bytes, 0);
    actor_stat_metric(a, st, "disk_blocks_loaded", (double)c->disk->loaded, 0);
    actor_stat_metric(a, st, "disk_spills_total", (double)c->spills, 1);
    actor_stat_metric(a, st, "disk_persists_total", (double)c->persists, 1);
    actor_stat_metric(a, st, "disk_persists_owed", (double)c->n_owed, 0);
    actor_stat_metric(a, st, "disk_persists_deferred_total", (double)c->persists_deferred, 1);
    actor_stat_metric(a, st, "disk_spills_shed_total", (double)(c->spills_shed + c->spills_shed_full), 1);
    actor_stat_metric(a, st, "disk_spills_shed_full_total", (double)c->spills_shed_full, 1);
    actor_stat_metric(a, st, "disk_write_errors_total", (double)c->disk_write_errors, 1);
    actor_stat_metric(a, st, "disk_reads_total", (double)c->disk_reads, 1);
    actor_stat_metric(a, st, "disk_read_ms", c->read_ms_last, 0);
    actor_stat_metric(a, st, "disk_read_ms_max", c->read_ms_max, 0);
    /* The bandwidth fetches are costed at: DISK_THREADS reads of a block per average read time. */
    actor_stat_metric(a, st, "disk_read_mib_s",
                      c->read_ms_avg > 0 ? 1000.0 * (double)c->block_bytes / (1 << 20) / s_disk_block_ms(c) : 0, 0);
    actor_stat_metric(a, st, "fetch_disk_declined_total", (double)c->disk_declined, 1);
    actor_stat_metric(a, st, "disk_reads_not_started_total", (double)c->disk_reads_not_started, 1);
    actor_stat_metric(a, st, "disk_promotions_failed_total", (double)c->promotions_failed, 1);
    /* Refused blocks: at start (the index read back) and on reads since. */
    actor_stat_metric(a, st, "disk_dropped_corrupt_total", (double)(c->disk->dropped_corrupt + c->disk_corrupt), 1);
    actor_stat_metric(a, st, "disk_dropped_foreign_total", (double)(c->disk->dropped_foreign + c->disk_foreign), 1);
    actor_stat_metric(a, st, "disk_evicted_total", (double)c->disk->evicted, 1);
    actor_stat_metric(a, st, "disk_io_in_flight", (double)dio_in_flight(c->dio), 0);
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
    u64map_init(&c->host, 1024);
    u64map_init(&c->pins, 256);
    u64map_init(&c->tenants, 256);
    for (int i = 0; i < t->n_instances; i++) {
        const topo_instance_t *in = &t->instances[i];
        if ((in->role == ROLE_ROUTER || in->role == ROLE_MONITOR) && c->n_routers < 16) {
            c->is_router[c->n_routers] = in->role == ROLE_ROUTER;
            c->routers[c->n_routers++] = in->name;
        }
        if ((in->role == ROLE_PREFILL || in->role == ROLE_DECODE) && c->n_workers < MAX_WORKERS)
            c->workers[c->n_workers++] = in->name;
    }
    /* A worker that does not say its pool's size is bounded by the topology's, else by DEVICE_POOL_DEFAULT. */
    c->device = devidx_new(c->n_workers, t->limits.kv_blocks >= 2 ? (uint32_t)t->limits.kv_blocks : DEVICE_POOL_DEFAULT);
    if (!c->device) {
        LOG_E("out of memory");
        return 1;
    }
    for (int i = 0; i < c->n_workers; i++)
        actor_watch(a, c->workers[i]);
    tchan_shm_sweep(t->name);
    c->next_transfer = kvx_first_id();
    if (t->cache.disk_dir[0] && c->n_slots > 0) {
        /* Load: the disk's index is read back before READY (a restart's blocks are served at once). */
        char err[512];
        int64_t t0 = now_ms();
        c->disk = dstore_open(t->cache.disk_dir, (uint64_t)t->cache.disk_bytes, kv_fingerprint(t), err, sizeof err);
        if (!c->disk) {
            LOG_E("%s", err);
            return ACTOR_EXIT_CONFIG;
        }
        c->dio = dio_new(c->disk, actor_zmq_ctx(a), DISK_JOBS, DISK_THREADS,
                         c->disk->formatted ? c->disk->fh.block_bytes : 0, err, sizeof err);
        if (!c->dio) {
            LOG_E("%s", err);
            return 1;
        }
        actor_add_reader(a, dio_socket(c->dio), s_on_disk);
        if (c->disk->formatted) {
            const df_file_hdr_t *fh = &c->disk->fh;
            const char *why = s_shape(c, fh->block_bytes, fh->n_layers, fh->block_size, fh->n_kv_heads, fh->head_dim,
                                      fh->dtype);
            if (why) {
                LOG_E("%s", why);
                return 1;
            }
        }
        LOG_I("disk tier %s: %llu blocks read back in %lld ms", c->disk->path, (unsigned long long)c->disk->loaded,
              (long long)(now_ms() - t0));
        for (int i = 0; i < c->n_routers; i++)
            if (c->is_router[i]) {
                actor_watch(a, c->routers[i]);
                s_announce_all(a, c, c->routers[i]);
            }
    }
    actor_timer_add(a, 100, s_expire);
    actor_ops_t ops = {.handlers = s_handlers, .n_handlers = ARRAY_LEN(s_handlers), .fill_stats = s_fill_stats,
                       .peer_event = s_peer_event, .drained = s_drained};
    int rc = actor_run(a, &ops, c);
    dio_destroy(&c->dio);   /* the queued writes go out first */
    dstore_destroy(&c->disk);
    for (int i = 0; i < MAX_PENDING; i++)
        free(c->pending[i].hashes);
    for (int i = 0; i < c->n_parked; i++) {
        free(c->parked[i].held);
        msg_free(&c->parked[i].m);
    }
    for (int i = 0; i < MAX_FETCHES; i++)
        tchan_shm_close(&c->fetches[i].seg);
    devidx_destroy(&c->device);
    u64map_free(&c->host);
    u64map_free(&c->pins);
    u64map_free(&c->tenants);
    free(c->drain_order);
    free(c->slots);
    free(c->store);
    free(c);
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
