/* actors/expert_balancer/eb_table.c — the expert-balancer's load totals and placements
 * (eb_table.h). The ranks are the workers in the order of their first window; each gets one
 * redundant slot (DeepSeek's serving shape), and the slots are rounded up so that every rank holds
 * the same number. The totals are aged: every window of the clock layer (one per worker and window
 * period) multiplies all of them by 2^(-1 / (half_life * workers)), so a window half_life periods
 * old weighs half as much as the newest and a placement follows a shift in traffic within a few
 * half-lives instead of never (half_life 0: never aged, every window weighs the same). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/expert_balancer/eb_table.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/eplb.h"

struct eb_table {
    int n_experts;                          /* fixed by the first window; 0 before */
    int n_layers;                           /* 1 + the highest layer seen */
    double *load;                           /* [EB_MAX_LAYERS][n_experts] tokens since start, aged */
    int half_life;                          /* windows per worker for a window's weight to halve; 0: never aged */
    char *workers[EB_MAX_RANKS];            /* the ranks, in order of their first window */
    int n_workers;
    int clock_layer;                        /* the layer of the first window: its windows count the interval */
    uint64_t windows;                       /* clock_layer windows since the last placement */
    uint64_t epoch;                         /* placements computed */
    int32_t *slots;                         /* [EB_MAX_LAYERS][n_slots] the latest placement */
    int n_slots;
    double before[EB_MAX_LAYERS];           /* busiest/average rank, experts in order */
    double after[EB_MAX_LAYERS];            /* the same with the placement */
    int group_ranks;                        /* > 0: an expert-parallel group of this many ranks (the
                                               workers are its ranks that sent windows) */
    int redundant;                          /* group: replica slots per rank beyond the experts' share */
    int interval;                           /* windows between placements */
};

eb_table_t *eb_table_new(void)
{
    eb_table_t *t = calloc(1, sizeof(eb_table_t));
    if (t) {
        t->interval = EB_REBALANCE_WINDOWS;
        t->half_life = EB_HALF_LIFE_WINDOWS;
    }
    return t;
}

eb_table_t *eb_table_new_group(int ranks, int redundant, int interval_windows)
{
    if (ranks < 1 || ranks > EB_MAX_RANKS || redundant < 0 || interval_windows < 1)
        return NULL;
    eb_table_t *t = calloc(1, sizeof(eb_table_t));
    if (!t)
        return NULL;
    t->group_ranks = ranks;
    t->redundant = redundant;
    t->interval = interval_windows;
    t->half_life = EB_HALF_LIFE_WINDOWS;
    return t;
}

int eb_table_set_half_life(eb_table_t *t, int windows)
{
    if (windows < 0 || windows > EB_MAX_HALF_LIFE)
        return -1;
    t->half_life = windows;
    return 0;
}

void eb_table_destroy(eb_table_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    eb_table_t *t = *self_p;
    for (int i = 0; i < t->n_workers; i++)
        free(t->workers[i]);
    free(t->load);
    free(t->slots);
    free(t);
    *self_p = NULL;
}

static int s_worker(eb_table_t *t, const char *name)
{
    for (int i = 0; i < t->n_workers; i++)
        if (!strcmp(t->workers[i], name))
            return i;
    if (t->n_workers == EB_MAX_RANKS || !(t->workers[t->n_workers] = strdup(name)))
        return -1;
    return t->n_workers++;
}

/* One placement per layer over the workers seen: 0, or -1 (eplb refused; the old one stays). */
static int s_rebalance(eb_table_t *t)
{
    const int E = t->n_experts, R = t->group_ranks ? t->group_ranks : t->n_workers, per = (E + R - 1) / R;
    int n_slots = per * R + (t->group_ranks ? t->redundant : 1) * R;
    if (n_slots > E * R)   /* at most one replica of an expert per rank */
        n_slots = E * R;
    int32_t *slots = malloc((size_t)EB_MAX_LAYERS * (size_t)n_slots * sizeof(int32_t));
    int32_t *ident = malloc((size_t)E * sizeof(int32_t));
    double *load = malloc((size_t)E * sizeof(double));
    double before[EB_MAX_LAYERS], after[EB_MAX_LAYERS];
    char err[256];
    int rc = -1;
    if (!slots || !ident || !load) {
        LOG_W("expert placement: out of memory; keeping epoch %llu", (unsigned long long)t->epoch);
        goto done;
    }
    eplb_identity(E, ident);
    for (int l = 0; l < t->n_layers; l++) {
        double sum = 0;
        for (int e = 0; e < E; e++)
            sum += load[e] = t->load[(size_t)l * E + e];
        int32_t *ls = slots + (size_t)l * n_slots;
        if (sum == 0)   /* a dense layer (or no tokens yet): every expert once, the rest in turn */
            for (int e = 0; e < E; e++)
                load[e] = 1;
        if (eplb_place(load, E, R, 1, n_slots, ls, err, sizeof err) != 0) {
            LOG_W("expert placement, layer %d: %s; keeping epoch %llu", l, err, (unsigned long long)t->epoch);
            goto done;
        }
        after[l] = eplb_imbalance(load, E, R, n_slots, ls, NULL);
        before[l] = E % R == 0 ? eplb_imbalance(load, E, R, E, ident, NULL) : 0;
    }
    free(t->slots);
    t->slots = slots;
    slots = NULL;
    t->n_slots = n_slots;
    memcpy(t->before, before, sizeof(double) * (size_t)t->n_layers);
    memcpy(t->after, after, sizeof(double) * (size_t)t->n_layers);
    t->epoch++;
    LOG_I("expert placement epoch %llu: %d layers, %d experts, %d ranks, %d slots; layer 0 busiest/average %.3f in "
          "order, %.3f placed", (unsigned long long)t->epoch, t->n_layers, E, R, n_slots, before[0], after[0]);
    rc = 0;
done:
    free(slots);
    free(ident);
    free(load);
    return rc;
}

int eb_table_add(eb_table_t *t, const char *worker, uint32_t layer, const uint64_t *counts, uint32_t n, char *err,
                 size_t errlen)
{
    if (layer >= EB_MAX_LAYERS)
        return errf(err, errlen, "expert_load from %s: layer %u, at most %d layers", worker, layer, EB_MAX_LAYERS);
    if (n < 1 || (t->n_experts && (int)n != t->n_experts))
        return errf(err, errlen, "expert_load from %s: %u experts, expected %d", worker, n, t->n_experts);
    if (!t->n_experts) {
        if (!(t->load = calloc((size_t)EB_MAX_LAYERS * n, sizeof(double))))
            return errf(err, errlen, "expert_load: out of memory");
        t->n_experts = (int)n;
        t->clock_layer = (int)layer;   /* the first MoE layer (a model's first layers may be dense) */
    }
    if (s_worker(t, worker) < 0)
        return errf(err, errlen, "expert_load from %s: more than %d workers", worker, EB_MAX_RANKS);
    /* Aging, once per clock-layer window and before it is added: the other layers' windows of the
     * same period follow it, so each period's windows are all added at the same weight. */
    if ((int)layer == t->clock_layer && t->half_life > 0) {
        const double f = exp2(-1.0 / ((double)t->half_life * t->n_workers));
        for (size_t i = 0; i < (size_t)t->n_layers * n; i++)
            t->load[i] *= f;
    }
    double *row = t->load + (size_t)layer * n;
    for (uint32_t e = 0; e < n; e++)
        row[e] += (double)counts[e];
    if ((int)layer + 1 > t->n_layers)
        t->n_layers = (int)layer + 1;
    if ((int)layer != t->clock_layer || ++t->windows < (uint64_t)t->interval * (uint64_t)t->n_workers)
        return 0;
    t->windows = 0;
    return s_rebalance(t) == 0 ? 1 : 0;
}

uint64_t eb_table_epoch(const eb_table_t *t) { return t->epoch; }
int eb_table_ranks(const eb_table_t *t) { return t->group_ranks ? t->group_ranks : t->n_workers; }
int eb_table_experts(const eb_table_t *t) { return t->n_experts; }

const double *eb_table_load(const eb_table_t *t, int l)
{
    return t->load && l >= 0 && l < t->n_layers ? t->load + (size_t)l * t->n_experts : NULL;
}
int eb_table_layers(const eb_table_t *t) { return t->n_layers; }
double eb_table_before(const eb_table_t *t, int l) { return t->epoch && l >= 0 && l < t->n_layers ? t->before[l] : 0; }
double eb_table_after(const eb_table_t *t, int l) { return t->epoch && l >= 0 && l < t->n_layers ? t->after[l] : 0; }

const int32_t *eb_table_slots(const eb_table_t *t, int l, int *n_slots)
{
    if (!t->slots || l < 0 || l >= t->n_layers)
        return NULL;
    *n_slots = t->n_slots;
    return t->slots + (size_t)l * t->n_slots;
}
