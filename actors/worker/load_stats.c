/* actors/worker/load_stats.c — a decode worker's load in its stats (load_stats.h). */
#include "actors/worker/load_stats.h"

void load_stats_fill(actor_t *a, msg_stats_t *st, const sched_t *s, int max_seqs, int batch, stream_out_t *out,
                     const kvpool_t *pool)
{
    const int running = sched_count(s, SCHED_RUNNING), waiting = sched_count(s, SCHED_WAITING);
    const int preempted = sched_count(s, SCHED_PREEMPTED);
    actor_stat_queue(a, st, "running", (uint64_t)running, (uint64_t)max_seqs);
    actor_stat_queue(a, st, "waiting", (uint64_t)waiting, 0);
    actor_stat_queue(a, st, "preempted", (uint64_t)preempted, 0);
    actor_stat_metric(a, st, "requests_running", running, 0);
    actor_stat_metric(a, st, "requests_waiting", waiting + preempted, 0);
    actor_stat_metric(a, st, "batch_size", running ? batch : 0, 0);
    actor_stat_metric(a, st, "tokens_per_s", stream_out_rate(out), 0);
    actor_stat_metric(a, st, "kv_blocks_free", kvpool_free_count(pool), 0);
    actor_stat_metric(a, st, "kv_blocks_used", kvpool_n_blocks(pool) - kvpool_free_count(pool), 0);
    actor_stat_metric(a, st, "generation_tokens_total", (double)out->tokens_out, 1);
    actor_stat_metric(a, st, "token_messages_total", (double)out->messages_out, 1);
    actor_stat_metric(a, st, "requests_finished_total", (double)out->finished, 1);
    actor_stat_metric(a, st, "preemptions_total", (double)sched_preemptions(s), 1);
}
