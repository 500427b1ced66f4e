/* actors/worker/prefix_fetch.h — bringing a prompt's cached prefix blocks from the cache-manager's
 * host store into a worker's own KV pool, before the prompt runs. Used by the prefill worker and
 * by a colocated decode worker (one that computes prompts itself).
 *
 * The router puts in a prompt's request the chained hashes of its leading blocks that the host
 * store holds (hint_hashes). The worker asks for the ones its pool lacks (cache_fetch) when that is
 * cheaper than computing them (fetch_policy.h); the cache-manager answers with a kv_announce of a
 * shared-memory segment (or a cache_fetch_reply with found 0). The blocks go into free pool blocks,
 * registered under their hashes and released at once, so the request's kvseq_match_prefix adopts
 * them like any cached prefix. */
#ifndef TROUPE_ACTORS_RUNTIME_PREFIX_FETCH_H
#define TROUPE_ACTORS_RUNTIME_PREFIX_FETCH_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/runtime/worker.h"
#include "actors/worker/fetch_policy.h"
#include "messages/msg.h"

#define FETCH_TIMEOUT_MS 1000     /* a fetch not answered by then: the prompt runs without it */

/* One worker's fetching: where to ask, how it decides, what it counted. */
typedef struct prefix_fetch {
    const char *self;             /* the worker's instance name (the reply goes there) */
    const char *cache_manager;    /* NULL: no host store, never fetches */
    fetch_policy_t policy;
    uint64_t fetches, fetched_blocks, skipped;
} prefix_fetch_t;

/* Sets pf up for the worker `self` (cache_manager NULL: never fetches), its policy from the
 * environment (fetch_policy_from_env). -1 with why on a bad TROUPE_PREFILL_FETCH. */
int prefix_fetch_init(prefix_fetch_t *pf, const char *self, const char *cache_manager, char *err, size_t errlen);

/* Asks for hints[i..n) where i is the first hint the pool lacks, if any is missing and fetching
 * pays at tokens_per_s (the worker's compute rate; <= 0 unknown). Returns i when a cache_fetch went
 * out for request_id, -1 when nothing is fetched (all held, not worth it, no cache-manager). */
int prefix_fetch_start(actor_t *a, prefix_fetch_t *pf, worker_t *w, uint64_t request_id, const uint64_t *hints,
                       int n_hints, double tokens_per_s);

/* Takes the kv_announce answering a fetch that asked for hints[from..n_hints) at sent_ms: the
 * blocks into the pool under those hashes; acknowledges it to its sender. wanted = 0 (the request
 * is gone or no longer fetching) refuses it. Returns the blocks taken, or -1 when refused. */
int prefix_fetch_take(actor_t *a, prefix_fetch_t *pf, worker_t *w, const msg_kv_announce_t *k, int wanted,
                      const uint64_t *hints, int n_hints, int from, int64_t sent_ms);

/* A fetch asked at sent_ms for n blocks got no answer in time: counts its cost. */
void prefix_fetch_timed_out(prefix_fetch_t *pf, int n_blocks, int64_t sent_ms);

/* Its counters and the policy's cost estimate into the worker's stats (fetches_total,
 * fetched_blocks_total, fetches_skipped_total, fetch_ms_per_block). */
void prefix_fetch_stats(actor_t *a, msg_stats_t *st, const prefix_fetch_t *pf);

#endif
