/* actors/worker/router_watch.h — a worker's view of the routers its requests belong to.
 *
 * Every request a worker holds names the router that submitted it (prefill_request.reply_to,
 * handoff.reply_to). When that router's process goes away (killed, crashed, or killed by the
 * supervisor as wedged after missed heartbeats), nobody will read the request's tokens: its new
 * incarnation numbers requests from a fresh random point and knows nothing of the old ones. So the
 * worker watches every router's inbox connection (actor_watch, milliseconds after a death) and drops
 * the requests of one that went down, as if that router had cancelled them, freeing their KV.
 *
 * A hand-off for a request of a router that is down is refused too (router_watch_alive): it may
 * have left the prefill worker just before the death was seen. A router restarted so fast that the
 * drop of its connection was never seen answers the old incarnation's tokens with a cancel (the
 * router's rule for a request id it does not know), so those requests end at their next token.
 *
 * Backpressure (router_watch_room): a decode worker steps only while every live router's outbox
 * has room for what the step may send it. Nothing for a router is ever refused (actor_send_keep);
 * a router that relays more slowly than the worker produces (one core against a fast GPU's batch)
 * slows the steps down instead of losing tokens. The requests of a router that is down are
 * dropped: it holds nothing back. */
#ifndef TROUPE_ACTORS_WORKER_ROUTER_WATCH_H
#define TROUPE_ACTORS_WORKER_ROUTER_WATCH_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "topology/topology.h"

#define ROUTER_WATCH_MAX 16

typedef struct router_watch {
    const char *names[ROUTER_WATCH_MAX];   /* the topology's router instances */
    int up[ROUTER_WATCH_MAX];              /* its inbox connection is up (assumed until seen down) */
    int n;
    uint64_t lost;                         /* router deaths seen */
    uint64_t dropped;                      /* requests dropped because their router was gone */
    uint64_t steps_held;                   /* router_watch_room answered 0 */
    uint64_t held_logged;                  /* of them, counted in log lines already */
    int64_t held_log_ms;                   /* the last such line (at most one a second) */
} router_watch_t;

/* Watches every router instance of t (actor_watch). -1 when a watch cannot be set up. */
int router_watch_init(router_watch_t *rw, actor_t *a, const topo_t *t);

/* From the worker's peer_event: records the router's state; 1 when `peer` is a router that just
 * went down (the caller drops its requests and counts them with router_watch_dropped), else 0. */
int router_watch_event(router_watch_t *rw, const char *peer, int up);

/* 0 when `name` is a router seen down now; 1 otherwise (up, or not a router of the topology). */
int router_watch_alive(const router_watch_t *rw, const char *name);

/* Counts n requests dropped for a lost router (and logs it once per death). */
void router_watch_dropped(router_watch_t *rw, const char *router, int n);

/* 1 when every live router's outbox (actor_outbox_room) has room for `need` messages (capped at
 * the outbox's limit, so a drained outbox always lets a step run); else 0, counted and logged at
 * most once a second, and the caller waits: the loop wakes as soon as the router takes messages
 * again. */
int router_watch_room(router_watch_t *rw, actor_t *a, long need);

/* routers_lost_total, requests_dropped_router_lost and steps_held_outbox_total in a worker's stats. */
void router_watch_stats(actor_t *a, msg_stats_t *st, const router_watch_t *rw);

#endif
