/* actors/worker/step_clock.c — a decode worker's step and cycle times (step_clock.h). */
#include "actors/worker/step_clock.h"

#include "common/util.h"

int step_clock_begin(step_clock_t *c, int decode_only, double *cycle_s)
{
    const int64_t t0 = now_ns();
    const int busy = c->cycle_t0 != 0;
    if (busy) {
        const uint64_t cyc = (uint64_t)(t0 - c->cycle_t0);
        c->cycle_ns += cyc;
        c->decode_cycles += (uint64_t)c->last_decode_only;
        c->decode_cycle_ns += c->last_decode_only ? cyc : 0;
        *cycle_s = (double)cyc / 1e9;
    }
    c->last_decode_only = decode_only;
    c->cycle_t0 = t0;
    return busy;
}

uint64_t step_clock_forward(step_clock_t *c, uint64_t ns, int n_decode, uint64_t prompt_tokens,
                            uint64_t recompute_tokens)
{
    const uint64_t all = prompt_tokens + recompute_tokens + (uint64_t)n_decode;
    c->forward_ns += ns;
    c->recompute_ns += ns * recompute_tokens / all;
    c->steps++;
    c->last_batch = n_decode;
    return ns * prompt_tokens / all;
}

void step_clock_stats(const step_clock_t *c, const model_t *model, actor_t *a, msg_stats_t *st)
{
    actor_stat_metric(a, st, "steps_total", (double)c->steps, 1);
    actor_stat_metric(a, st, "forward_seconds_total", (double)c->forward_ns / 1e9, 1);
    actor_stat_metric(a, st, "recompute_seconds_total", (double)c->recompute_ns / 1e9, 1);
    /* The target's CUDA graphs: a record is a step that ran uncaptured-then-captured (a new shape,
     * or every shape again after a shared scratch buffer grew: the draft model and the MTP layer
     * run on the target's backend, and any cuda_scratch growth makes every recorded graph stale). */
    uint64_t g_rec = 0, g_rep = 0;
    model_graph_stats(model, &g_rec, &g_rep);
    actor_stat_metric(a, st, "graph_records_total", (double)g_rec, 1);
    actor_stat_metric(a, st, "graph_replays_total", (double)g_rep, 1);
    actor_stat_metric(a, st, "graph_rerecords_total", (double)model_graph_rerecords(model), 1);   /* stale ones */
    actor_stat_metric(a, st, "step_cycle_seconds_total", (double)c->cycle_ns / 1e9, 1);
    actor_stat_metric(a, st, "decode_only_cycles_total", (double)c->decode_cycles, 1);
    actor_stat_metric(a, st, "decode_only_cycle_seconds_total", (double)c->decode_cycle_ns / 1e9, 1);
}
