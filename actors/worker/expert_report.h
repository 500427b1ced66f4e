/* actors/worker/expert_report.h — a worker's per-window `expert_load` reports to the
 * expert-balancer: the MoE kernels count routed tokens per (layer, expert) on the device
 * (engine/model.h, model_expert_load); every experts.window_steps steps (topology) the counts are read
 * back once and sent, one message per MoE layer, to every expert-balancer of the topology. */
#ifndef TROUPE_ACTORS_WORKER_EXPERT_REPORT_H
#define TROUPE_ACTORS_WORKER_EXPERT_REPORT_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "engine/model.h"
#include "topology/topology.h"

#define EXPERT_REPORT_WINDOW_STEPS 1000   /* the default window (topology experts.window_steps) */

typedef struct expert_report expert_report_t;

/* NULL (nothing to report, not an error) for a dense model, a backend that does not count, or a
 * topology without an expert-balancer. */
expert_report_t *expert_report_new(const topo_t *t, model_t *m);
void expert_report_destroy(expert_report_t **self_p);

/* From the stats timer (between steps): when steps has passed the next window boundary, reads the
 * counters (one device sync) and sends the window. *r is made at the first window (and stays NULL
 * when there is nothing to report); the caller destroys it. */
void expert_report_tick(expert_report_t **r, actor_t *a, model_t *m, uint64_t steps);

#endif
