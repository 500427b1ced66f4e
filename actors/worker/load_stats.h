/* actors/worker/load_stats.h — a decode worker's load in its stats, as troupe-top, the monitor and
 * the scenario tests read it: its requests by state (queues running, waiting and preempted, their
 * gauges, preemptions_total), its last batch, its output's rate and totals, its KV pool's blocks.
 * Gauges and counters of the state as it is; what the loop's time went to is step_clock.h's. */
#ifndef TROUPE_ACTORS_WORKER_LOAD_STATS_H
#define TROUPE_ACTORS_WORKER_LOAD_STATS_H

#include "actors/runtime/actor.h"
#include "actors/worker/stream_out.h"
#include "engine/kvcache.h"
#include "engine/sched.h"

/* The queues running (of max_seqs), waiting and preempted; requests_running, requests_waiting
 * (preempted ones included), batch_size (batch: the last step's decode rows, 0 while none runs),
 * tokens_per_s, kv_blocks_free, kv_blocks_used, generation_tokens_total, requests_finished_total,
 * preemptions_total. */
void load_stats_fill(actor_t *a, msg_stats_t *st, const sched_t *s, int max_seqs, int batch, stream_out_t *out,
                     const kvpool_t *pool);

#endif
