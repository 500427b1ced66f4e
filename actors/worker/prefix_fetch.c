#include "actors/worker/prefix_fetch.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "transfer/kv_blocks.h"
#include "transfer/kv_transfer.h"
#include "transfer/shm_chan.h"

int prefix_fetch_init(prefix_fetch_t *pf, const char *self, const char *cache_manager, char *err, size_t errlen)
{
    *pf = (prefix_fetch_t){.self = self, .cache_manager = cache_manager};
    return fetch_policy_from_env(&pf->policy, err, errlen);
}

int prefix_fetch_start(actor_t *a, prefix_fetch_t *pf, worker_t *w, uint64_t request_id, const uint64_t *hints,
                       int n_hints, double tokens_per_s)
{
    if (!pf->cache_manager || n_hints <= 0)
        return -1;
    int i = 0;
    while (i < n_hints && kvpool_lookup(w->eng->pool, hints[i]) >= 0)
        i++;
    const int missing = n_hints - i;
    if (missing <= 0)
        return -1;
    if (!fetch_policy_decide(&pf->policy, missing, w->block_size, tokens_per_s)) {
        pf->skipped++;
        return -1;
    }
    const double budget = fetch_policy_budget_ms(&pf->policy, w->block_size, tokens_per_s);
    msg_t f;
    msg_init(&f, MSG_CACHE_FETCH, request_id);
    f.u.cache_fetch.hashes = hints + i;
    f.u.cache_fetch.n_hashes = (uint32_t)missing;
    f.u.cache_fetch.channel = MSG_CHAN_SHM;
    f.u.cache_fetch.reply_to = pf->self;
    f.u.cache_fetch.block_budget_ms = (float)budget;
    if (actor_send(a, pf->cache_manager, &f) != 0)
        return -1;
    pf->hold_ms = (int64_t)fetch_policy_hold_ms(&pf->policy, missing, (double)worker_block_bytes(w) / (1 << 20), budget);
    pf->fetches++;
    return i;
}

int prefix_fetch_take(actor_t *a, prefix_fetch_t *pf, worker_t *w, const msg_kv_announce_t *k, int wanted,
                      const uint64_t *hints, int n_hints, int from, int64_t sent_ms)
{
    char err[256] = "";
    tchan_seg_t seg = {0};
    int ok = wanted && kvblocks_check(w->eng->pool, k, err, sizeof err) == 0 &&
             tchan_shm_open(&seg, k->handle, k->handle_len, (size_t)k->total_bytes, err, sizeof err) == 0;
    int got = 0;
    if (ok) {
        const size_t bb = worker_block_bytes(w);
        /* No more than the pool has free: each block goes back to the free list as a cached one,
         * and a later block taking an earlier one's place would break the prefix at its root. */
        const int room = kvpool_free_count(w->eng->pool);
        for (uint32_t j = 0; j < k->n_block_ids && from + (int)j < n_hints && (int)j < room; j++) {
            int32_t b = kvpool_alloc(w->eng->pool);
            if (b < 0)
                break;
            /* A block that cannot be copied ends the run: the ones after it could not be adopted
             * (the prefix breaks there), and the request's usage counts the run taken. */
            const int in = kvblocks_in(w->eng->be, w->eng->pool, &b, 1, (const uint8_t *)seg.ptr + (size_t)j * bb);
            if (in == 0) {
                kvpool_set_hash(w->eng->pool, b, hints[from + (int)j]);
                got++;
            }
            kvpool_free(w->eng->pool, b);
            if (in != 0)
                break;
        }
        pf->fetched_blocks += (uint64_t)got;
        fetch_policy_observe(&pf->policy, got, (double)(now_ms() - sent_ms));
        LOG_D("request %llu: %d blocks fetched from the host store", (unsigned long long)k->request_id, got);
    }
    tchan_shm_close(&seg);
    kvx_ack(a, k->src, k->transfer_id, ok, wanted ? err : "fetch not wanted any more", NULL, 0);
    return ok ? got : -1;
}

void prefix_fetch_on_reply(fetch_src_t *fs, const msg_cache_fetch_reply_t *r)
{
    free(fs->disk_mask);
    fs->disk_mask = NULL;
    fs->n_disk_mask = 0;
    if (r->found_disk == 0 || r->n_disk_mask == 0 || !(fs->disk_mask = malloc(r->n_disk_mask * sizeof *fs->disk_mask)))
        return;
    memcpy(fs->disk_mask, r->disk_mask, r->n_disk_mask * sizeof *fs->disk_mask);
    fs->n_disk_mask = (int)r->n_disk_mask;
}

void prefix_fetch_split(const fetch_src_t *fs, int cached_tokens, int block_size, uint32_t *host, uint32_t *disk)
{
    *host = *disk = 0;
    const int n_cached = block_size > 0 ? cached_tokens / block_size : 0;
    for (int i = fs->from; i < fs->from + fs->got && i < n_cached; i++) {
        const int j = i - fs->from;
        if (j / 64 < fs->n_disk_mask && (fs->disk_mask[j / 64] >> (j % 64) & 1))
            *disk += (uint32_t)block_size;
        else
            *host += (uint32_t)block_size;
    }
}

void fetch_src_clear(fetch_src_t *fs)
{
    free(fs->disk_mask);
    *fs = (fetch_src_t){0};
}

void prefix_fetch_timed_out(prefix_fetch_t *pf, int n_blocks, int64_t sent_ms)
{
    fetch_policy_observe(&pf->policy, n_blocks, (double)(now_ms() - sent_ms));
}

void prefix_fetch_stats(actor_t *a, msg_stats_t *st, const prefix_fetch_t *pf)
{
    actor_stat_metric(a, st, "fetches_total", (double)pf->fetches, 1);
    actor_stat_metric(a, st, "fetched_blocks_total", (double)pf->fetched_blocks, 1);
    actor_stat_metric(a, st, "fetches_skipped_total", (double)pf->skipped, 1);
    actor_stat_metric(a, st, "fetch_ms_per_block", pf->policy.ms_per_block, 0);
}
