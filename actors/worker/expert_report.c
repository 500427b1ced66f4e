/* actors/worker/expert_report.c — a worker's `expert_load` windows (expert_report.h). A window
 * that cannot be sent (the balancer's outbox full) is dropped and counted in the log, never
 * retried: the balancer's totals are a sample of the load, not a ledger. */
#include <stdio.h>
#include <stdlib.h>

#include "actors/worker/expert_report.h"
#include "common/log.h"

#define EXPERT_REPORT_MAX_BALANCERS 4

struct expert_report {
    model_t *m;                                  /* counts here; not owned */
    int n_layers, n_experts;
    uint64_t *load;                              /* [n_layers][n_experts] the window being read */
    uint64_t next;                               /* the step count at which the next window ends */
    uint64_t window;                             /* steps per window (topology experts.window_steps) */
    char balancers[EXPERT_REPORT_MAX_BALANCERS][TOPO_NAME_MAX];
    int n_balancers;
};

expert_report_t *expert_report_new(const topo_t *t, model_t *m)
{
    const model_config_t *c = model_config(m);
    const backend_t *be = model_backend(m);
    if (c->num_experts < 1 || !be->ops->moe_count)
        return NULL;
    expert_report_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    for (int i = 0; i < t->n_instances && r->n_balancers < EXPERT_REPORT_MAX_BALANCERS; i++)
        if (t->instances[i].role == ROLE_EXPERT_BALANCER)
            snprintf(r->balancers[r->n_balancers++], TOPO_NAME_MAX, "%s", t->instances[i].name);
    r->m = m;
    r->n_layers = c->num_layers;
    r->n_experts = c->num_experts;
    r->window = t->experts.window_steps > 0 ? (uint64_t)t->experts.window_steps : EXPERT_REPORT_WINDOW_STEPS;
    r->next = r->window;
    if (!r->n_balancers || !(r->load = calloc((size_t)r->n_layers * (size_t)r->n_experts, sizeof(uint64_t)))) {
        free(r);
        return NULL;
    }
    return r;
}

void expert_report_destroy(expert_report_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->load);
    free(*self_p);
    *self_p = NULL;
}

void expert_report_tick(expert_report_t **r_p, actor_t *a, model_t *m, uint64_t steps)
{
    const int win = actor_topo(a)->experts.window_steps;
    if (steps < (uint64_t)(win > 0 ? win : EXPERT_REPORT_WINDOW_STEPS) ||
        (!*r_p && !(*r_p = expert_report_new(actor_topo(a), m))))
        return;
    expert_report_t *r = *r_p;
    if (steps < r->next)
        return;
    r->next = steps + r->window;
    char err[256];
    const size_t n = (size_t)r->n_layers * (size_t)r->n_experts;
    for (size_t i = 0; i < n; i++)
        r->load[i] = 0;
    if (model_expert_load(r->m, r->load, err, sizeof err) != 0) {
        LOG_W("expert load window dropped: %s", err);
        return;
    }
    for (int l = 0; l < r->n_layers; l++) {
        const uint64_t *c = r->load + (size_t)l * r->n_experts;
        uint64_t sum = 0;
        for (int e = 0; e < r->n_experts; e++)
            sum += c[e];
        if (sum == 0)
            continue;   /* a dense layer, or none of its tokens this window */
        msg_t msg = {.type = MSG_EXPERT_LOAD};
        msg.u.expert_load = (msg_expert_load_t){.worker = actor_self(a)->name, .layer = (uint32_t)l, .counts = c,
                                              .n_counts = (uint32_t)r->n_experts};
        for (int b = 0; b < r->n_balancers; b++)
            if (actor_send(a, r->balancers[b], &msg) != 0)
                LOG_W("expert load window of layer %d not sent to %s", l, r->balancers[b]);
    }
}
