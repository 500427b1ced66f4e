/* actors/worker/writeback.c — finished sequences' blocks to the cache-manager's host store
 * (writeback.h says how and why in two halves). */
#include "actors/worker/writeback.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "transfer/kv_copier.h"

#define WRITEBACK_TIMEOUT_MS 2000
#define MAX_WRITEBACKS       64
/* Write-backs queued for the copier beyond which one without a prompt_cache_key is shed: a deep
 * queue only delays the copies a next turn is waiting for (a fetch parks 300 ms at most). */
#define WRITEBACK_QUEUE_MAX  4

/* A slot is in use from cache_put until the copy is announced and acked (or its deadline). */
struct wb_slot {
    uint64_t transfer_id, request_id;
    kvseq_t *kv;                 /* the finished sequence, its blocks held while the copier reads them */
    tchan_seg_t seg;             /* the announced copy, mapped until acked or past its deadline */
    int64_t deadline_ms;
    int skip, n;                 /* the sequence's blocks [skip, skip + n) */
    int reserved;                /* between cache_put and the copy's submission */
};

struct writeback {
    worker_t *w;
    const char *self;
    const char *cache_manager;   /* NULL: nothing is written back */
    kvcopier_t *copier;          /* the copies, off the decode loop */
    wb_slot_t slot[MAX_WRITEBACKS];
    uint64_t next_transfer;
    uint64_t writebacks;         /* copies announced */
    uint64_t blocks;             /* blocks copied to the host store */
    uint64_t shed;               /* left out under load */
    uint64_t copy_ns;            /* the decode loop's time handing copies to the copier */
};

writeback_t *writeback_new(worker_t *w, const char *self, const char *cluster, const char *cache_manager)
{
    writeback_t *wb = calloc(1, sizeof *wb);
    if (!wb)
        return NULL;
    wb->w = w;
    wb->self = self;
    wb->cache_manager = cache_manager;
    wb->next_transfer = kvx_first_id();
    /* No copier thread without a store to write to. */
    if (cache_manager && !(wb->copier = kvcopier_new(w->eng->be, cluster, worker_block_bytes(w), MAX_WRITEBACKS))) {
        free(wb);
        return NULL;
    }
    return wb;
}

void writeback_destroy(writeback_t **self_p)
{
    writeback_t *wb = *self_p;
    if (!wb)
        return;
    kvcopier_destroy(&wb->copier);   /* before the sequences it may be reading are freed */
    for (int i = 0; i < MAX_WRITEBACKS; i++) {
        kvseq_destroy(&wb->slot[i].kv);
        tchan_shm_close(&wb->slot[i].seg);
    }
    free(wb);
    *self_p = NULL;
}

wb_slot_t *writeback_put(writeback_t *wb, actor_t *a, const kvseq_t *kv, uint64_t request_id, int cached_tokens,
                         int keyed, int busy)
{
    if (!wb->cache_manager)
        return NULL;
    if (!keyed && (busy || kvcopier_pending(wb->copier) >= WRITEBACK_QUEUE_MAX)) {
        wb->shed++;
        return NULL;
    }
    const int bs = wb->w->block_size;
    const int skip = cached_tokens / bs;
    int full = kvseq_len(kv) / bs - skip;
    if (full <= 0)
        return NULL;
    if (full > MSG_MAX_BLOCKS)
        full = MSG_MAX_BLOCKS;
    wb_slot_t *s = NULL;
    for (int i = 0; i < MAX_WRITEBACKS && !s; i++)
        if (!wb->slot[i].seg.ptr && !wb->slot[i].kv && !wb->slot[i].reserved)
            s = &wb->slot[i];
    uint64_t *hashes = s ? malloc((size_t)full * sizeof *hashes) : NULL;
    if (!hashes)
        return NULL;   /* too many in flight (or no memory): skip this one */
    for (int i = 0; i < full; i++)
        hashes[i] = kvseq_hash(kv, skip + i);
    s->transfer_id = ++wb->next_transfer;
    s->request_id = request_id;
    s->skip = skip;
    s->n = full;
    /* cache_put.id == kv_announce.transfer_id: the cache-manager pairs them. */
    msg_t put;
    msg_init(&put, MSG_CACHE_PUT, s->transfer_id);
    put.u.cache_put.holder = wb->self;
    put.u.cache_put.tier = MSG_TIER_HOST;
    put.u.cache_put.hashes = hashes;
    put.u.cache_put.n_hashes = (uint32_t)full;
    put.u.cache_put.parent_hash = skip ? kvseq_hash(kv, skip - 1) : 0;
    int rc = actor_send(a, wb->cache_manager, &put);
    free(hashes);
    s->reserved = rc == 0;
    return rc == 0 ? s : NULL;
}

/* A failure leaves the cache-manager's put without its blocks: it drops it at its deadline. */
void writeback_copy(writeback_t *wb, wb_slot_t *s, kvseq_t **kv_p)
{
    const int64_t t0 = now_ns();
    s->reserved = 0;
    const void **src = malloc((size_t)s->n * sizeof *src);
    const int32_t *blocks = kvseq_blocks(*kv_p) + s->skip;
    for (int i = 0; src && i < s->n; i++)
        src[i] = kvpool_block_ptr(wb->w->eng->pool, blocks[i]);
    int rc = src ? kvcopier_submit(wb->copier, s->transfer_id | (1ULL << 62), src, s->n, s) : -1;
    free(src);
    if (rc != 0)
        LOG_W("write-back of request %llu: no copier slot", (unsigned long long)s->request_id);
    else {
        s->kv = *kv_p;
        *kv_p = NULL;
    }
    wb->copy_ns += (uint64_t)(now_ns() - t0);
}

/* The copies the copier finished: announced to the cache-manager (it acks when stored), and the
 * sequences' blocks freed. */
static void s_announce(writeback_t *wb, actor_t *a)
{
    kvcopier_done_t done;
    while (wb->copier && kvcopier_poll(wb->copier, &done)) {
        wb_slot_t *s = done.cookie;
        if (!done.ok) {
            LOG_W("write-back of request %llu: %s", (unsigned long long)s->request_id, done.err);
        } else {
            s->seg = done.seg;
            msg_t an;
            kvx_announce(&an, s->transfer_id, s->request_id, kvpool_view(wb->w->eng->pool),
                         (const uint32_t *)kvseq_blocks(s->kv) + s->skip, (uint32_t)s->n, MSG_CHAN_SHM,
                         (const uint8_t *)s->seg.name, (uint32_t)strlen(s->seg.name), wb->self, WRITEBACK_TIMEOUT_MS);
            if (actor_send(a, wb->cache_manager, &an) != 0) {
                tchan_shm_close(&s->seg);
            } else {
                s->deadline_ms = now_ms() + WRITEBACK_TIMEOUT_MS;
                wb->writebacks++;
                wb->blocks += (uint64_t)s->n;
            }
        }
        kvseq_destroy(&s->kv);
    }
}

int writeback_poll(writeback_t *wb, actor_t *a)
{
    s_announce(wb, a);
    const int64_t now = now_ms();
    for (int i = 0; i < MAX_WRITEBACKS; i++)
        if (wb->slot[i].seg.ptr && now > wb->slot[i].deadline_ms)
            tchan_shm_close(&wb->slot[i].seg);
    return wb->copier && kvcopier_pending(wb->copier) > 0;
}

int writeback_reclaim(writeback_t *wb, actor_t *a)
{
    int held = 0;
    for (int i = 0; i < MAX_WRITEBACKS; i++)
        held |= wb->slot[i].kv != NULL;
    if (!held)
        return 0;
    kvcopier_drain(wb->copier);
    s_announce(wb, a);
    return 1;
}

void writeback_on_ack(writeback_t *wb, uint64_t transfer_id)
{
    for (int i = 0; i < MAX_WRITEBACKS; i++)
        if (wb->slot[i].seg.ptr && wb->slot[i].transfer_id == transfer_id)
            tchan_shm_close(&wb->slot[i].seg);
}

void writeback_stats(const writeback_t *wb, actor_t *a, msg_stats_t *st)
{
    actor_stat_metric(a, st, "writebacks_total", (double)wb->writebacks, 1);
    actor_stat_metric(a, st, "writeback_blocks_total", (double)wb->blocks, 1);
    actor_stat_metric(a, st, "writebacks_shed_total", (double)wb->shed, 1);
    actor_stat_metric(a, st, "writebacks_copying", wb->copier ? kvcopier_pending(wb->copier) : 0, 0);
    actor_stat_metric(a, st, "writeback_seconds_total", (double)wb->copy_ns / 1e9, 1);
}
