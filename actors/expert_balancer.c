/* actors/expert_balancer.c — the expert-balancer actor: per-expert load history and the expert
 * placements it computes and pushes (the logic is actors/expert_balancer/eb_table.c, over
 * engine/eplb.c).
 *
 * Duties: add every `expert_load` window (one worker, one layer, tokens per expert) into the
 * totals, answering a refused one with bad_request. Two kinds of table:
 *   - one per expert-parallel group (topology actors[].ep > 1: ep decode instances, each a rank
 *     running its own requests): the windows of its ranks added up, a placement over its ep ranks
 *     with experts.redundant_slots replica slots per rank every experts.interval_steps /
 *     experts.window_steps windows, pushed to its rank 0 as `expert_placement` (the group
 *     switches at a step boundary, engine/ep.h);
 *   - one over every worker as if each were a rank (what a group of them would gain), shown only.
 * In the periodic stats: the epoch, the ranks, placements pushed, and each of the first
 * EB_SHOWN_LAYERS layers' busiest/average rank load with the experts in order and placed, of the
 * first group when there is one, else of the all-workers view.
 *
 * The totals are aged with a half-life of experts.load_half_life_windows windows (eb_table.c).
 *
 * Known limits: a push that cannot be sent is counted and dropped (the next interval sends a
 * newer one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/expert_balancer/eb_table.h"
#include "actors/runtime/actor.h"
#include "actors/worker/expert_apply.h"
#include "common/log.h"

#define EB_SHOWN_LAYERS 8         /* layers whose ratios the stats carry */
#define EB_SHOWN_EXPERTS 64       /* the shown layer's experts (load share) and slots (expert held) */
#define EB_MAX_GROUPS 64

typedef struct {
    char leader[TOPO_NAME_MAX];   /* rank 0's instance: placements go there */
    int actor, first;             /* the ranks: instances first .. first+ranks-1 of topology actor `actor` */
    int ranks;
    eb_table_t *table;
} eb_group_t;

typedef struct {
    eb_table_t *table;            /* every worker as a rank: shown only */
    eb_group_t groups[EB_MAX_GROUPS];
    int n_groups;
    uint64_t refused;             /* expert_load windows refused */
    uint64_t pushed, push_failed; /* expert_placement messages */
} eb_state_t;

/* The group whose rank `worker` is (NULL: none). */
static eb_group_t *s_group(const topo_t *t, eb_state_t *s, const char *worker)
{
    const topo_instance_t *in = topo_find(t, worker);
    for (int i = 0; in && i < s->n_groups; i++)
        if (in->actor == s->groups[i].actor && in->index >= s->groups[i].first &&
            in->index < s->groups[i].first + s->groups[i].ranks)
            return &s->groups[i];
    return NULL;
}

/* The group's latest placement to its leader. */
static void s_push(actor_t *a, eb_state_t *s, eb_group_t *g)
{
    const eb_table_t *t = g->table;
    const int L = eb_table_layers(t), E = eb_table_experts(t);
    int n_slots = 0;
    if (!eb_table_slots(t, 0, &n_slots) || n_slots < 1)
        return;
    int32_t *slots = malloc((size_t)L * (size_t)n_slots * sizeof(int32_t));
    char (*names)[TOPO_NAME_MAX + 16] = calloc((size_t)g->ranks, sizeof *names);
    const char **workers = calloc((size_t)g->ranks, sizeof *workers);
    uint32_t *off = NULL, *rep = NULL, n_rep = 0;
    if (!slots || !names || !workers)
        goto done;
    for (int l = 0; l < L; l++) {
        int ns = 0;
        memcpy(slots + (size_t)l * n_slots, eb_table_slots(t, l, &ns), (size_t)n_slots * sizeof(int32_t));
    }
    if (expert_placement_encode(slots, L, E, n_slots, g->ranks, &off, &rep, &n_rep) != 0)
        goto done;
    for (int r = 0; r < g->ranks; r++) {
        snprintf(names[r], sizeof names[r], "%s/%d", g->leader, r);
        workers[r] = names[r];
    }
    msg_t m = {.type = MSG_EXPERT_PLACEMENT};
    m.u.expert_placement = (msg_expert_placement_t){
        .epoch = eb_table_epoch(t), .n_layers = (uint32_t)L, .n_experts = (uint32_t)E, .offsets = off,
        .n_offsets = (uint32_t)L * (uint32_t)E + 1, .replicas = rep, .n_replicas = n_rep, .workers = workers,
        .n_workers = (uint32_t)g->ranks};
    if (actor_send(a, g->leader, &m) == 0) {
        s->pushed++;
        LOG_I("expert placement epoch %llu pushed to %s (%d ranks, %d slots per layer)",
              (unsigned long long)eb_table_epoch(t), g->leader, g->ranks, n_slots);
    } else {
        s->push_failed++;
        LOG_W("expert placement epoch %llu not sent to %s", (unsigned long long)eb_table_epoch(t), g->leader);
    }
done:
    free(slots);
    free(names);
    free(workers);
    free(off);
    free(rep);
}

static int s_on_load(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    eb_state_t *s = state;
    const msg_expert_load_t *el = &m->u.expert_load;
    char err[512];
    eb_group_t *g = s_group(actor_topo(a), s, el->worker);
    if (g) {
        const int rc = eb_table_add(g->table, el->worker, el->layer, el->counts, el->n_counts, err, sizeof err);
        if (rc < 0) {
            s->refused++;
            return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "%s", err) < 0 ? -1 : 0;
        }
        if (rc == 1)
            s_push(a, s, g);
    }
    if (eb_table_add(s->table, el->worker, el->layer, el->counts, el->n_counts, err, sizeof err) >= 0)
        return 0;
    if (g)
        return 0;   /* counted in the group; the all-workers view may hold other shapes */
    s->refused++;
    return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "%s", err) < 0 ? -1 : 0;
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    eb_state_t *s = state;
    const eb_table_t *t = s->n_groups ? s->groups[0].table : s->table;
    actor_stat_metric(a, st, "placement_epoch", (double)eb_table_epoch(t), 0);
    actor_stat_metric(a, st, "ranks", eb_table_ranks(t), 0);
    actor_stat_metric(a, st, "groups", s->n_groups, 0);
    actor_stat_metric(a, st, "loads_refused", (double)s->refused, 1);
    actor_stat_metric(a, st, "placements_pushed", (double)s->pushed, 1);
    actor_stat_metric(a, st, "placements_not_sent", (double)s->push_failed, 1);
    static char names[EB_SHOWN_LAYERS][2][48];   /* the stats keep the name pointers until sent */
    for (int l = 0; eb_table_epoch(t) && l < eb_table_layers(t) && l < EB_SHOWN_LAYERS; l++) {
        snprintf(names[l][0], sizeof names[l][0], "layer%d_busiest_over_avg_in_order", l);
        actor_stat_metric(a, st, names[l][0], eb_table_before(t, l), 0);
        snprintf(names[l][1], sizeof names[l][1], "layer%d_busiest_over_avg_placed", l);
        actor_stat_metric(a, st, names[l][1], eb_table_after(t, l), 0);
    }
    /* The first MoE layer of the shown table: each expert's share of its tokens and which expert
     * each slot of the latest placement holds (troupe-top's EXPERTS view). */
    static char enames[EB_SHOWN_EXPERTS][32], snames[EB_SHOWN_EXPERTS][32];
    int shown = -1;
    for (int l = 0; l < eb_table_layers(t) && shown < 0; l++) {
        const double *ld = eb_table_load(t, l);
        for (int e = 0; ld && e < eb_table_experts(t) && shown < 0; e++)
            if (ld[e] > 0)
                shown = l;
    }
    if (shown < 0)
        return;
    const double *ld = eb_table_load(t, shown);
    double sum = 0;
    for (int e = 0; e < eb_table_experts(t); e++)
        sum += ld[e];
    actor_stat_metric(a, st, "shown_layer", shown, 0);
    for (int e = 0; e < eb_table_experts(t) && e < EB_SHOWN_EXPERTS; e++) {
        snprintf(enames[e], sizeof enames[e], "expert%d_load_share", e);
        actor_stat_metric(a, st, enames[e], sum > 0 ? ld[e] / sum : 0, 0);
    }
    int ns = 0;
    const int32_t *slots = eb_table_slots(t, shown, &ns);
    for (int k = 0; slots && k < ns && k < EB_SHOWN_EXPERTS; k++) {
        snprintf(snames[k], sizeof snames[k], "slot%d_expert", k);
        actor_stat_metric(a, st, snames[k], slots[k], 0);
    }
}

/* A table per expert-parallel group: instances g*ep .. g*ep+ep-1 of a decode entry with ep > 1
 * (the rule of actors/worker/expert_group.c), led by the first. */
static int s_groups(const topo_t *t, eb_state_t *s)
{
    const int interval = t->experts.interval_steps / t->experts.window_steps;
    for (int i = 0; i < t->n_instances && s->n_groups < EB_MAX_GROUPS; i++) {
        const topo_instance_t *in = &t->instances[i];
        const int ep = in->role == ROLE_DECODE ? t->actors[in->actor].ep : 1;
        if (ep < 2 || in->index % ep != 0)
            continue;
        eb_group_t *g = &s->groups[s->n_groups];
        snprintf(g->leader, sizeof g->leader, "%s", in->name);
        g->actor = in->actor;
        g->first = in->index;
        g->ranks = ep;
        if (!(g->table = eb_table_new_group(ep, t->experts.redundant_slots, interval)) ||
            eb_table_set_half_life(g->table, t->experts.load_half_life_windows) != 0)
            return -1;
        s->n_groups++;
    }
    return 0;
}

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_EXPERT_BALANCER);
    if (!a)
        return 2;
    eb_state_t *s = calloc(1, sizeof *s);
    if (!s || !(s->table = eb_table_new()) ||
        eb_table_set_half_life(s->table, actor_topo(a)->experts.load_half_life_windows) != 0 ||
        s_groups(actor_topo(a), s) != 0) {
        LOG_E("expert-balancer: out of memory");
        actor_destroy(&a);
        return 1;
    }
    static const actor_handler_t handlers[] = {{MSG_EXPERT_LOAD, s_on_load}};
    actor_ops_t ops = {.handlers = handlers, .n_handlers = 1, .fill_stats = s_fill_stats};
    int rc = actor_run(a, &ops, s);
    eb_table_destroy(&s->table);
    for (int i = 0; i < s->n_groups; i++)
        eb_table_destroy(&s->groups[i].table);
    free(s);
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
