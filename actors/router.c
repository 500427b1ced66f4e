/* actors/router.c — the router: the cluster's front door.
 *
 * Duties: bind the client endpoint; check every client message (malformed frames are answered
 * by the runtime with a `malformed` error); answer every request with exactly one terminal reply.
 *
 * Known limits: the serving path (tokenize, pick prefill/decode workers, stream tokens back) is
 * not wired yet, so a well-formed submit is answered with an `unavailable` error that says so;
 * nothing is silently dropped. */
#include <string.h>

#include "actors/runtime/actor.h"
#include "common/log.h"
#include "common/util.h"

typedef struct router {
    void *clients;               /* ROUTER at endpoints.client */
    uint64_t submitted, rejected;
} router_t;

static int s_on_submit(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    router_t *r = state;
    r->submitted++;
    if (actor_draining(a)) {
        r->rejected++;
        return actor_reply_error(a, from, m->id, MSG_ERR_UNAVAILABLE, 1, "router is draining"), 0;
    }
    r->rejected++;
    actor_reply_error(a, from, m->id, MSG_ERR_UNAVAILABLE, 0,
                      "this build has no serving path yet: prefill/decode are not wired");
    return 0;
}

static int s_on_cancel(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "no request %llu in flight",
                      (unsigned long long)m->id);
    return 0;
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    router_t *r = state;
    actor_stat_metric(a, st, "requests_submitted", (double)r->submitted, 1);
    actor_stat_metric(a, st, "requests_rejected", (double)r->rejected, 1);
}

static const actor_handler_t s_handlers[] = {
    {MSG_SUBMIT, s_on_submit},
    {MSG_CANCEL, s_on_cancel},
};

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_ROUTER);
    if (!a)
        return 2;
    router_t r = {0};
    int rc = -1;
    r.clients = actor_bind_router(a, actor_topo(a)->endpoints.client);
    if (!r.clients) {
        LOG_E("cannot bind the client endpoint %s", actor_topo(a)->endpoints.client);
    } else {
        actor_ops_t ops = {.handlers = s_handlers, .n_handlers = ARRAY_LEN(s_handlers),
                           .fill_stats = s_fill_stats};
        rc = actor_run(a, &ops, &r);
    }
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
