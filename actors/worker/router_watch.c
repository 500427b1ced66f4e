/* actors/worker/router_watch.c — see router_watch.h. */
#include "actors/worker/router_watch.h"

#include <string.h>

#include "common/log.h"

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

void router_watch_stats(actor_t *a, msg_stats_t *st, const router_watch_t *rw)
{
    actor_stat_metric(a, st, "routers_lost_total", (double)rw->lost, 1);
    actor_stat_metric(a, st, "requests_dropped_router_lost", (double)rw->dropped, 1);
}
