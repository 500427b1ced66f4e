/* actors/worker/prefix_fetch.h — bringing a prompt's cached prefix blocks from the cache-manager's
 * host store into a worker's own KV pool, before the prompt runs. Used by the prefill worker and
 * by a colocated decode worker (one that computes prompts itself).
 *
 * The router puts in a prompt's request the chained hashes of its leading blocks that the host
 * store holds (hint_hashes). The worker asks for the ones its pool lacks (cache_fetch) when that is
 * cheaper than computing them (fetch_policy.h); the cache-manager answers with a kv_announce of a
 * shared-memory segment (or a cache_fetch_reply with found 0). The blocks go into free pool blocks,
 * registered under their hashes and released at once, so the request's kvseq_match_prefix adopts
 * them like any cached prefix.
 *
 * A request's usage says where its cached tokens came from (messages/msg.h msg_usage_t): the
 * cache_fetch_reply, which comes before the blocks, marks those read back from the disk tier; the
 * blocks taken are remembered (fetch_src_t), and once the prompt's prefix is matched each cached
 * block is the device's (it was in the pool), the host store's or the disk's (prefix_fetch_split). */
#ifndef TROUPE_ACTORS_RUNTIME_PREFIX_FETCH_H
#define TROUPE_ACTORS_RUNTIME_PREFIX_FETCH_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/worker/worker.h"
#include "actors/worker/fetch_policy.h"
#include "messages/msg.h"

/* The shortest hold of a prompt for its fetch; a long one is held longer (prefix_fetch_t.hold_ms):
 * a fetch not answered by then is given up, and the prompt runs without it. */
#define FETCH_TIMEOUT_MS FETCH_HOLD_MIN_MS

/* One worker's fetching: where to ask, how it decides, what it counted. */
typedef struct prefix_fetch {
    const char *self;             /* the worker's instance name (the reply goes there) */
    const char *cache_manager;    /* NULL: no host store, never fetches */
    fetch_policy_t policy;
    int64_t hold_ms;              /* how long to hold the prompt of the fetch prefix_fetch_start sent
                                   * last (fetch_policy_hold_ms: the cache-manager's longest wait for
                                   * its disk reads, plus the copies) */
    uint64_t fetches, fetched_blocks, skipped;
} prefix_fetch_t;

/* One request's fetched blocks, by source. */
typedef struct fetch_src {
    int from;                     /* the first hint block asked for */
    int got;                      /* hints[from .. from + got) were taken into the pool */
    uint64_t *disk_mask;          /* bit j: hints[from + j] came from the disk tier; NULL: none did */
    int n_disk_mask;              /* its words */
} fetch_src_t;

/* Sets pf up for the worker `self` (cache_manager NULL: never fetches), its policy from the
 * environment (fetch_policy_from_env). -1 with why on a bad TROUPE_PREFILL_FETCH. */
int prefix_fetch_init(prefix_fetch_t *pf, const char *self, const char *cache_manager, char *err, size_t errlen);

/* Asks for hints[i..n) where i is the first hint the pool lacks, if any is missing and fetching
 * pays at tokens_per_s (the worker's compute rate; <= 0 unknown). The fetch carries the budget of a
 * block read from disk at that rate (fetch_policy_budget_ms). Returns i when a cache_fetch went out
 * for request_id, pf->hold_ms then set to how long its prompt should wait for the answer; -1 when
 * nothing is fetched (all held, not worth it, no cache-manager). */
int prefix_fetch_start(actor_t *a, prefix_fetch_t *pf, worker_t *w, uint64_t request_id, const uint64_t *hints,
                       int n_hints, double tokens_per_s);

/* Takes the kv_announce answering a fetch that asked for hints[from..n_hints) at sent_ms: the
 * blocks into the pool under those hashes; acknowledges it to its sender. wanted = 0 (the request
 * is gone or no longer fetching) refuses it. Returns the blocks taken (hints[from..from + taken),
 * the leading ones: the first that cannot be taken ends it), or -1 when refused. */
int prefix_fetch_take(actor_t *a, prefix_fetch_t *pf, worker_t *w, const msg_kv_announce_t *k, int wanted,
                      const uint64_t *hints, int n_hints, int from, int64_t sent_ms);

/* The cache_fetch_reply of fs's fetch (found > 0; before its blocks): which of them came from disk.
 * Without memory for the mask they count as the host store's. */
void prefix_fetch_on_reply(fetch_src_t *fs, const msg_cache_fetch_reply_t *r);

/* The first cached_tokens of a prompt were adopted from the pool (kvseq_match_prefix: a multiple of
 * block_size): how many of them the fetch fs brought from the host store's memory and from its
 * disk. The rest were in the pool before (the device tier). */
void prefix_fetch_split(const fetch_src_t *fs, int cached_tokens, int block_size, uint32_t *host, uint32_t *disk);

/* Frees fs's mask; fs is empty after (idempotent). */
void fetch_src_clear(fetch_src_t *fs);

/* A fetch asked at sent_ms for n blocks got no answer in time: counts its cost. */
void prefix_fetch_timed_out(prefix_fetch_t *pf, int n_blocks, int64_t sent_ms);

/* Its counters and the policy's cost estimate into the worker's stats (fetches_total,
 * fetched_blocks_total, fetches_skipped_total, fetch_ms_per_block). */
void prefix_fetch_stats(actor_t *a, msg_stats_t *st, const prefix_fetch_t *pf);

#endif
