/* actors/expert_balancer.c — the expert-balancer actor: per-expert load history and the expert
 * placement it computes (the logic is actors/expert_balancer/eb_table.c, over engine/eplb.c).
 *
 * Duties: add every `expert_load` window (one worker, one layer, tokens per expert) into the
 * totals, answering a refused one with bad_request; every EB_REBALANCE_WINDOWS windows per worker
 * a new placement and epoch; in the periodic stats the epoch, the ranks, and each of the first
 * EB_SHOWN_LAYERS layers' busiest/average rank load with the experts in order and placed.
 *
 * Known limits: the workers neither send `expert_load` yet nor apply an `expert_placement`, so
 * the placement is computed and shown but not pushed (a worker would answer the message with
 * bad_request); the interval counts windows, not steps, and is a constant, not a topology field. */
#include <stdio.h>

#include "actors/expert_balancer/eb_table.h"
#include "actors/runtime/actor.h"

#define EB_SHOWN_LAYERS 8         /* layers whose ratios the stats carry */

typedef struct {
    eb_table_t *table;            /* load totals and the latest placement */
    uint64_t refused;             /* expert_load windows refused */
} eb_state_t;

static int s_on_load(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    eb_state_t *s = state;
    const msg_expert_load_t *el = &m->u.expert_load;
    char err[512];
    if (eb_table_add(s->table, el->worker, el->layer, el->counts, el->n_counts, err, sizeof err) >= 0)
        return 0;
    s->refused++;
    return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "%s", err) < 0 ? -1 : 0;
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    eb_state_t *s = state;
    const eb_table_t *t = s->table;
    actor_stat_metric(a, st, "placement_epoch", (double)eb_table_epoch(t), 0);
    actor_stat_metric(a, st, "ranks", eb_table_ranks(t), 0);
    actor_stat_metric(a, st, "loads_refused", (double)s->refused, 1);
    for (int l = 0; eb_table_epoch(t) && l < eb_table_layers(t) && l < EB_SHOWN_LAYERS; l++) {
        char name[64];
        snprintf(name, sizeof name, "layer%d_busiest_over_avg_in_order", l);
        actor_stat_metric(a, st, name, eb_table_before(t, l), 0);
        snprintf(name, sizeof name, "layer%d_busiest_over_avg_placed", l);
        actor_stat_metric(a, st, name, eb_table_after(t, l), 0);
    }
}

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_EXPERT_BALANCER);
    if (!a)
        return 2;
    eb_state_t s = {.table = eb_table_new()};
    if (!s.table) {
        actor_destroy(&a);
        return 1;
    }
    static const actor_handler_t handlers[] = {{MSG_EXPERT_LOAD, s_on_load}};
    actor_ops_t ops = {.handlers = handlers, .n_handlers = 1, .fill_stats = s_fill_stats};
    int rc = actor_run(a, &ops, &s);
    eb_table_destroy(&s.table);
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
