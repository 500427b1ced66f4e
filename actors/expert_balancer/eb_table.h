/* actors/expert_balancer/eb_table.h — the expert-balancer's state as pure logic: the per-(layer,
 * expert) load totals from the workers' `expert_load` windows, and the placement computed from
 * them every EB_REBALANCE_WINDOWS windows per worker of the first layer reported (engine/eplb.h), with its epoch and each layer's
 * busiest/average rank load before (experts in order) and after (the placement). The totals decay
 * with a half-life in windows (eb_table_set_half_life), so placements follow the recent load. */
#ifndef TROUPE_ACTORS_EXPERT_BALANCER_EB_TABLE_H
#define TROUPE_ACTORS_EXPERT_BALANCER_EB_TABLE_H

#include <stddef.h>
#include <stdint.h>

#define EB_REBALANCE_WINDOWS 10   /* load windows per worker between placements (10,000 / 1,000 steps) */
#define EB_MAX_RANKS 64           /* workers the balancer places experts over */
#define EB_MAX_LAYERS 256         /* MoE layers (messages/msg.h MSG_MAX_LAYERS) */
#define EB_HALF_LIFE_WINDOWS 10   /* default aging of the totals: a window's weight halves in 10 windows */
#define EB_MAX_HALF_LIFE 1000000

typedef struct eb_table eb_table_t;

eb_table_t *eb_table_new(void);
/* An expert-parallel group of `ranks` ranks (the caller adds only its ranks' windows; each rank
 * counts the routing of its own requests, so their sum is the group's load):
 * each placement gives every rank `redundant` slots beyond its share of the experts (fewer when a
 * rank would hold an expert twice), every interval_windows windows. NULL on bad arguments. */
eb_table_t *eb_table_new_group(int ranks, int redundant, int interval_windows);
void eb_table_destroy(eb_table_t **self_p);
/* The totals' half-life in windows per worker (default EB_HALF_LIFE_WINDOWS; 0: never aged, every
 * window weighs the same forever): 0, or -1 when out of 0..EB_MAX_HALF_LIFE. */
int eb_table_set_half_life(eb_table_t *t, int windows);

/* Adds one window of worker's layer: counts [n] tokens per expert. 1 when this window completed an
 * interval and a new placement (epoch + 1) was computed, 0 when not, -1 with err when refused (an
 * expert count other than the first window's, a layer out of range, too many workers). A placement
 * eplb refuses keeps the previous epoch (logged). */
int eb_table_add(eb_table_t *t, const char *worker, uint32_t layer, const uint64_t *counts, uint32_t n, char *err,
                 size_t errlen);

uint64_t eb_table_epoch(const eb_table_t *t);          /* placements computed; 0: none yet */
int eb_table_ranks(const eb_table_t *t);               /* workers seen, or the group's ranks */
int eb_table_experts(const eb_table_t *t);             /* experts per layer (0 before the first window) */
/* Tokens routed to each expert of layer l since the start, aged ([eb_table_experts]), NULL out of range. */
const double *eb_table_load(const eb_table_t *t, int l);
int eb_table_layers(const eb_table_t *t);              /* 1 + the highest layer seen */
/* The latest placement's ratios for layer l (0 when there is none, or before when the experts do
 * not divide evenly over the ranks). */
double eb_table_before(const eb_table_t *t, int l);
double eb_table_after(const eb_table_t *t, int l);
/* The latest placement of layer l: *n_slots slots, rank r holding slots r * n_slots / ranks ..;
 * NULL before the first. */
const int32_t *eb_table_slots(const eb_table_t *t, int l, int *n_slots);

#endif
