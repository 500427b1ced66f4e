/* actors/worker/writeback.h — a decode worker writes finished sequences' full blocks back to the
 * cache-manager's host store, so the next turn of a conversation can reuse them on any worker.
 *
 * Best effort: a refused or lost write-back only costs a future cache miss. In two halves around
 * the request's done:
 *   1. writeback_put (before done): decide, reserve a slot and name the blocks to the
 *      cache-manager (cache_put). It tells the routers at once, so a next turn routed the moment
 *      done arrives is pointed at these blocks, and its fetch waits for them there instead of
 *      missing them. The prompt's leading blocks that were cache hits are left out: the request
 *      that computed them wrote them back already (a conversation's next turn then copies only its
 *      new blocks, not its whole history).
 *   2. writeback_copy (after done): the sequence moves to the write-back, and a copier thread
 *      (transfer/kv_copier.h) copies its blocks into a shared-memory segment beside the next
 *      steps, the blocks held until it is done; writeback_poll announces the copy (kv_announce on
 *      the shared-memory channel) and frees the blocks; the segment stays mapped until the
 *      cache-manager acks it (writeback_on_ack) or its deadline passes.
 * Under load (the caller says busy: at least half of max_batch running) only requests that asked
 * for retention (prompt_cache_key) are written back: the others are a cache's best effort, shed
 * before their copies compete with the running requests for the host store and the memory bus,
 * and so are any beyond a short copy queue. */
#ifndef TROUPE_ACTORS_WORKER_WRITEBACK_H
#define TROUPE_ACTORS_WORKER_WRITEBACK_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/worker/worker.h"

typedef struct writeback writeback_t;
typedef struct wb_slot wb_slot_t;

/* The write-backs of worker w (instance `self` of cluster `cluster`) to `cache_manager`; NULL
 * cache_manager: a module that writes nothing back. NULL when out of memory. */
writeback_t *writeback_new(worker_t *w, const char *self, const char *cluster, const char *cache_manager);
/* Stops the copier before the sequences it may be reading are freed. */
void writeback_destroy(writeback_t **self_p);

/* First half (before done) for the finished sequence kv of request_id, whose first cached_tokens
 * prompt tokens were cache hits; keyed: it asked for retention; busy: the batch is under load.
 * The reserved slot, or NULL when nothing is written back (shed, nothing new, no slot). */
wb_slot_t *writeback_put(writeback_t *wb, actor_t *a, const kvseq_t *kv, uint64_t request_id, int cached_tokens,
                         int keyed, int busy);
/* Second half (after done): takes the sequence (*kv_p is NULLed when the copy was submitted; left
 * to the caller when it could not be). */
void writeback_copy(writeback_t *wb, wb_slot_t *slot, kvseq_t **kv_p);
/* Every step: announces the finished copies (their blocks freed) and unmaps segments past their
 * deadline. 1 while copies are in flight (the loop should come back soon). */
int writeback_poll(writeback_t *wb, actor_t *a);
/* Out of blocks: finished sequences still held by copies give theirs back (the copies are waited
 * for). 1 if that freed any. */
int writeback_reclaim(writeback_t *wb, actor_t *a);
/* The cache-manager stored a write-back: its segment is unmapped. */
void writeback_on_ack(writeback_t *wb, uint64_t transfer_id);
/* writebacks_total, writeback_blocks_total, writebacks_shed_total, writebacks_copying,
 * writeback_seconds_total (the decode loop's time handing copies over). */
void writeback_stats(const writeback_t *wb, actor_t *a, msg_stats_t *st);

#endif
