/* actors/worker/router_watch.c — see router_watch.h. */
#include "actors/worker/router_watch.h"

#include <string.h>

#include "common/log.h"
#include "common/util.h"

int router_watch_init(router_watch_t *rw, actor_t *a, const topo_t *t)
{
    memset(rw, 0, sizeof *rw);
    for (int i = 0; i < t->n_instances && rw->n < ROUTER_WATCH_MAX; i++) {
        if (t->instances[i].role != ROLE_ROUTER)
            continue;
        if (actor_watch(a, t->instances[i].name) != 0)
            return -1;
        rw->names[rw->n] = t->instances[i].name;
        rw->up[rw->n++] = 1;
    }
    return 0;
}

static int s_index(const router_watch_t *rw, const char *name)
{
    for (int i = 0; name && i < rw->n; i++)
        if (strcmp(rw->names[i], name) == 0)
            return i;
    return -1;
}

int router_watch_event(router_watch_t *rw, const char *peer, int up)
{
    int i = s_index(rw, peer);
    if (i < 0)
        return 0;
    int went_down = rw->up[i] && !up;
    rw->up[i] = up;
    rw->lost += (uint64_t)went_down;
    return went_down;
}

int router_watch_alive(const router_watch_t *rw, const char *name)
{
    int i = s_index(rw, name);
    return i < 0 || rw->up[i];
}

void router_watch_dropped(router_watch_t *rw, const char *router, int n)
{
    rw->dropped += (uint64_t)n;
    LOG_W("router %s lost: %d of its requests dropped (their KV freed)", router, n);
}

int router_watch_room(router_watch_t *rw, actor_t *a, long need)
{
    if (need > actor_outbox_cap(a))
        need = actor_outbox_cap(a);
    for (int i = 0; i < rw->n; i++) {
        if (!rw->up[i])
            continue;
        const int room = actor_outbox_room(a, rw->names[i]);
        if (room >= need)
            continue;
        rw->steps_held++;
        const int64_t now = now_ms();
        if (now - rw->held_log_ms >= 1000) {
            LOG_I("steps held: the outbox to %s has room for %d messages, the next step may send %ld "
                  "(limits.outbox %d); waiting for it to drain (%llu steps held since the last line)",
                  rw->names[i], room, need, actor_outbox_cap(a),
                  (unsigned long long)(rw->steps_held - rw->held_logged));
            rw->held_logged = rw->steps_held;
            rw->held_log_ms = now;
        }
        return 0;
    }
    return 1;
}

void router_watch_stats(actor_t *a, msg_stats_t *st, const router_watch_t *rw)
{
    actor_stat_metric(a, st, "routers_lost_total", (double)rw->lost, 1);
    actor_stat_metric(a, st, "requests_dropped_router_lost", (double)rw->dropped, 1);
    actor_stat_metric(a, st, "steps_held_outbox_total", (double)rw->steps_held, 1);
}
