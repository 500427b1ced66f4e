/* actors/worker/step_clock.h — where a decode worker's loop time goes, for its stats and for
 * speculation's step-cost table: its model steps, the forwards' time and the recomputes' share of
 * it, and its step cycles.
 *
 * A cycle runs from a step's start to the next step's start, while the worker has rows to step (an
 * idle gap ends a cycle unreported). Speculation's step-cost table gets each decode-only step's
 * whole cycle (spec_step_cycle), not its forward: a verify length pays for the drafting and the
 * emitting of its tokens, for the messages the loop handles between steps, and for the time the
 * next step is held for a router's outbox: what throughput is made of. A policy that saw only the
 * forward chose long drafts where the draft model costs as much as the target (a small target on a
 * GPU), and one that saw only the step drafted 7 per row at concurrency 64-96 of the KJV model with
 * n-gram and got 0.60-0.69x of no speculation (one H200, 2026-12-02). The cycles of decode rows
 * only are counted apart, so a speculating worker's (spec_step_counts by kind) compare with a
 * plain one's. */
#ifndef TROUPE_ACTORS_WORKER_STEP_CLOCK_H
#define TROUPE_ACTORS_WORKER_STEP_CLOCK_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "engine/model.h"

typedef struct step_clock {
    uint64_t steps;              /* model steps (forwards, failed ones too) */
    uint64_t forward_ns;         /* their time */
    uint64_t recompute_ns;       /* the preempted requests' recomputes' share of it, by tokens */
    uint64_t cycle_ns;           /* every step's cycle */
    uint64_t decode_cycles, decode_cycle_ns;   /* the cycles of steps with decode rows only */
    int64_t cycle_t0;            /* the step's start (now_ns), while the worker has rows to step; 0: idle */
    int last_decode_only;        /* the last step had decode rows only */
    int last_batch;              /* the last step's decode rows */
} step_clock_t;

/* A step starts (its batch scheduled and not empty); decode_only: it has decode rows only. 1 with
 * the cycle of the step before it, whole, in *cycle_s; 0 after an idle gap (nothing to report). */
int step_clock_begin(step_clock_t *c, int decode_only, double *cycle_s);
/* The worker has nothing to step: the cycle in progress ends unreported. */
static inline void step_clock_idle(step_clock_t *c) { c->cycle_t0 = 0; }
/* The step's forward took ns for n_decode decode rows and prompt_tokens / recompute_tokens tokens
 * of prompt chunks (new prompts / recomputes). Returns the prompts' share of ns, by tokens. */
uint64_t step_clock_forward(step_clock_t *c, uint64_t ns, int n_decode, uint64_t prompt_tokens,
                            uint64_t recompute_tokens);
/* steps_total, forward_seconds_total, recompute_seconds_total, graph_records_total,
 * graph_replays_total, graph_rerecords_total (the target model's CUDA graphs; the rerecords are
 * records of shapes whose graph went stale), step_cycle_seconds_total,
 * decode_only_cycles_total, decode_only_cycle_seconds_total. */
void step_clock_stats(const step_clock_t *c, const model_t *model, actor_t *a, msg_stats_t *st);

#endif
