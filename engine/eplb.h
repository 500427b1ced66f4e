/* engine/eplb.h — expert placement with redundant replicas (the expert-balancer's algorithm).
 *
 * Given one MoE layer's measured load per logical expert, the ranks of an expert-parallel group
 * and the physical slots they hold between them (the experts plus redundant slots), choose which
 * expert each slot holds:
 *   1. replicate: every expert gets one replica; each redundant slot goes to the expert whose
 *      load per replica is highest at that moment (a token picks among replicas evenly, so a
 *      replica carries load / replicas);
 *   2. pack: replicas, heaviest first, go to the least loaded rank that still has a free slot and
 *      does not hold that expert yet (every rank ends with exactly n_slots / n_ranks slots, and
 *      no rank holds two replicas of one expert);
 *   3. hierarchical (n_nodes > 1): the experts are first packed onto nodes evenly (n_experts /
 *      n_nodes each, the same greedy), then steps 1-2 run inside each node with its ranks and
 *      slots, so a token's expert is always on the node that holds the expert's replicas.
 * Pure logic: no I/O, no state. The same idea as DeepSeek's open EPLB (greedy replication by
 * load per replica, balanced packing), written from its description. */
#ifndef TROUPE_ENGINE_EPLB_H
#define TROUPE_ENGINE_EPLB_H

#include <stddef.h>
#include <stdint.h>

/* Fills slot_expert [n_slots]: rank r holds slots r * (n_slots / n_ranks) .. +n_slots / n_ranks.
 * load [n_experts] >= 0. Needs n_slots % n_ranks == 0, n_slots >= n_experts, n_ranks % n_nodes
 * == 0, n_experts % n_nodes == 0, n_slots / n_nodes >= n_experts / n_nodes, and at most n_ranks
 * (per node) replicas of an expert fitting: 0, or -1 with err naming the bad argument. */
int eplb_place(const double *load, int n_experts, int n_ranks, int n_nodes, int n_slots, int32_t *slot_expert,
               char *err, size_t errlen);

/* The placement without a balancer: n_slots == n_experts, expert e on slot e (rank e / per-rank). */
void eplb_identity(int n_experts, int32_t *slot_expert);

/* Busiest rank's load over the average rank's, each replica carrying load[e] / replicas(e):
 * 1.0 is perfect balance (and the answer when the total load is 0). rank_load (may be NULL)
 * gets [n_ranks]. Every expert must have a replica in slot_expert (else it returns -1). */
double eplb_imbalance(const double *load, int n_experts, int n_ranks, int n_slots, const int32_t *slot_expert,
                      double *rank_load);

#endif
