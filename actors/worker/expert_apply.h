/* actors/worker/expert_apply.h — `expert_placement` on the wire and in a group: the balancer's
 * slot tables (engine/eplb.h: per layer, n_slots expert ids, rank r holding slots r * n_slots /
 * n_ranks ..) as the message's replica lists (per (layer, expert) the ranks holding it, ranks named
 * in workers[]: "<leader>/<rank>"), and back; a decode worker leading a group hands a received
 * placement to it (engine/ep.h ep_propose), which switches at a step boundary. */
#ifndef TROUPE_ACTORS_WORKER_EXPERT_APPLY_H
#define TROUPE_ACTORS_WORKER_EXPERT_APPLY_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "engine/ep.h"
#include "messages/msg.h"

/* slots [n_layers][n_slots] over n_ranks -> *offsets [n_layers * n_experts + 1] and *replicas
 * (malloc'd, the caller frees), *n_replicas. 0, or -1 (out of memory). */
int expert_placement_encode(const int32_t *slots, int n_layers, int n_experts, int n_slots, int n_ranks,
                            uint32_t **offsets, uint32_t **replicas, uint32_t *n_replicas);

/* The message -> *slots [n_layers][*n_slots] (malloc'd) for a group of n_ranks over a model of
 * model_layers layers and model_experts experts: each rank's experts of a layer in ascending order.
 * Refused (-1, err naming the field) when the experts or ranks differ from the group's, a rank
 * index is out of range, or the ranks do not hold the same number of slots in every layer. Layers
 * past the message's n_layers get the experts in order with the same slot count (dense at the
 * model's end: an MoE layer there is refused). */
int expert_placement_decode(const msg_expert_placement_t *p, int n_ranks, int model_layers, int model_experts,
                            const uint8_t *is_moe, int32_t **slots, int *n_slots, char *err, size_t errlen);

/* A decode worker's `expert_placement` handler: the message to its group (ep NULL: refused, the
 * worker leads no group). 0, or -1 with err for a bad_request reply. */
int expert_apply(ep_t *ep, const model_t *m, const msg_expert_placement_t *p, char *err, size_t errlen);

/* The group's state in the worker's stats: ep_ranks, ep_epoch, ep_pending_epoch, ep_loading_layers,
 * ep_switches_total, ep_experts_loaded_total, ep_entries_total, ep_transport_nccl (1: the dispatch
 * and the combine go over NCCL, 0: over unix sockets). Nothing without a group. */
void expert_apply_stats(actor_t *a, msg_stats_t *st, const ep_t *ep);

#endif
