/* actors/runtime/actor.h — the skeleton every actor process shares.
 *
 * Life of an actor:  actor_new (parse argv, load the topology, find our instance, open sockets)
 *   -> the role's own set-up (load a model, allocate pools)  -> actor_run (sends READY, then one poll
 *   loop)  -> actor_destroy.  The loop dispatches each incoming message to one handler from the
 *   role's table keyed by message type, fires timers, calls the role's before_sleep hook (where
 *   decode runs a step), answers the supervisor's heartbeats, publishes stats, and on TERM or
 *   SIGTERM drains (the role says when it is drained) and returns 0. A fatal error returns -1 and
 *   main() exits non-zero so the supervisor can decide what happens next. SIGTERM or SIGINT during
 *   the set-up, before actor_run, exits 0 at once (nothing to drain yet); the SIGTERM of the local
 *   supervisor's death exits 1 at once, without a drain (a new supervisor may start at once).
 *
 * Sockets (endpoints all derived by topology/):
 *   inbox    ROUTER, bound at our instance's inbox; peers' DEALERs connect with routing id = their
 *            instance name. ROUTER_MANDATORY + ROUTER_HANDOVER (a restarted peer reclaims its id).
 *   peers    one DEALER per destination actor, connected lazily to its inbox, ZMQ_IMMEDIATE so
 *            nothing queues for a peer that is not there; sends never block: at the high-water
 *            mark a per-peer outbox holds the message, up to limits.outbox messages; past that
 *            actor_send fails (the caller answers `overloaded` or retries) while actor_send_keep
 *            still queues (a stream's tokens and terminal replies: never lost, their producer
 *            holds back instead, reading actor_outbox_room; see "Backpressure" below).
 *   control  DEALER to the supervisor: READY, heartbeats (with progress counters), TERM.
 *   stats    PUB connected to the monitor's SUB: periodic STATS (monitoring only; drops at HWM).
 *   extra    sockets a role adds (the router's client ROUTER, the monitor's inspection ROUTER).
 *
 * Backpressure (docs/architecture.md): nothing on a request's stream is refused or dropped on the
 * way. A decode worker runs its next step only while each router's outbox has room for the step's
 * tokens (actor_outbox_room), so a router slower than its workers slows them down; the messages a
 * worker sends outside its steps (a hand-off's first token, errors) are few per request and
 * queued past the limit (actor_send_keep). A router's reply that a client's connection cannot take
 * now (the client reads slowly) waits in that connection's backlog (actor_reply_stream); a
 * connection whose backlog reaches limits.outbox is not reading: its requests' next tokens are
 * refused and those requests fail with an error that is queued for it, so one slow client costs
 * only its own requests. Refusals are logged at most once a second, with counts.
 *
 * Every socket gets a bounded linger, a maximum message size and high-water marks from the
 * topology's limits, so shutdown never hangs and no peer can make us allocate without bound.
 *
 * Security (docs/security.md): with CURVE keys in the topology every socket above is CURVE
 * (servers: the inbox with our own keypair, client-facing sockets with security.curve_server_*;
 * everything else connects as a client with our keypair), and a ZAP handler thread admits only
 * the cluster's actors (by the keys the supervisor generated) to inboxes, control and stats, and
 * the allow-listed client keys to client-facing sockets. Every inbox message is checked against
 * who may send it (actor_may_send): by the authenticated key's name with CURVE, by the routing id
 * without; refusals are counted (messages_refused, auth_refused). A frame over
 * limits.max_message_bytes is answered with an error naming the limit.
 *
 * Known limits: with CURVE, an actor that holds a valid key can still connect under another
 * actor's routing id and, by ROUTER_HANDOVER, take that actor's replies on a ROUTER until it
 * reconnects; its messages are refused. */
#ifndef TROUPE_ACTOR_H
#define TROUPE_ACTOR_H

#include <stddef.h>
#include <stdint.h>

#include "messages/msg.h"
#include "topology/topology.h"

#define ACTOR_ID_MAX 256           /* ZeroMQ routing ids are at most 255 bytes */
/* An actor's exit status when the topology asks for what it cannot run (a model path without
 * weights, a KV dtype the backend refuses, an unreadable config, an endpoint it cannot bind):
 * restarting cannot help, so the supervisor stops the cluster at once (its exit 2) instead of
 * restarting it (sysexits' EX_CONFIG). */
#define ACTOR_EXIT_CONFIG 78

typedef struct actor actor_t;

#define ACTOR_USER_MAX 64          /* the ZAP handler's user ids (auth.c's USER_MAX) */

/* Who sent a message and how to answer: the socket it came in on plus the routing id. */
typedef struct actor_peer {
    void *sock;                    /* a ROUTER socket of ours (inbox or an extra socket) */
    uint8_t id[ACTOR_ID_MAX];
    size_t id_len;
    char user[ACTOR_USER_MAX];     /* with CURVE: the name the ZAP handler gave the peer's key (an
                                      instance name, or "client:<its Z85 public key>"); else "" */
} actor_peer_t;

/* A handler returns 0 to go on, or -1 to stop the actor with an error (fatal). The message is
 * freed by the runtime after the handler returns; a handler that keeps data copies it. */
typedef int (*actor_handler_fn)(actor_t *a, void *state, const actor_peer_t *from, msg_t *m);

typedef struct actor_handler {
    msg_type_t type;
    actor_handler_fn fn;
} actor_handler_t;

typedef struct actor_ops {
    const actor_handler_t *handlers;   /* dispatch table for the inbox and extra sockets */
    size_t n_handlers;
    /* Called once per loop iteration before polling. Return 1 if there is more work right away
     * (poll will not sleep), 0 if idle, -1 on a fatal error. May be NULL. */
    int (*before_sleep)(actor_t *a, void *state);
    /* Adds role-specific metrics and queue depths to the periodic stats. May be NULL. */
    void (*fill_stats)(actor_t *a, void *state, msg_stats_t *st);
    /* Called repeatedly after TERM/SIGTERM; return 1 when drained (the loop then exits 0).
     * NULL means nothing to drain. Draining is bounded by the grace period. */
    int (*drained)(actor_t *a, void *state);
    /* A watched peer's connection came up (up = 1) or went down (up = 0: the process died or
     * closed its inbox). May be NULL. */
    void (*peer_event)(actor_t *a, void *state, const char *peer_name, int up);
} actor_ops_t;

/* Parses --topology FILE (default: the embedded default), --name INSTANCE, --verbose, --help,
 * loads and validates the topology, checks the instance's role is `role`, sets up logging and
 * opens the sockets. Returns NULL after logging a clear error (main exits 2 then); an inbox it
 * cannot bind exits ACTOR_EXIT_CONFIG here (actor_bind). */
actor_t *actor_new(int argc, char **argv, topo_role_t role);
void actor_destroy(actor_t **self_p);

/* The loop: READY, then dispatch until TERM/SIGTERM (returns 0 when drained) or a fatal error
 * (returns -1). */
int actor_run(actor_t *a, const actor_ops_t *ops, void *state);

/* Sends m to another actor's inbox. Never blocks. 0 when sent or queued; -1 when the peer is
 * unknown or its outbox is full (the caller turns that into `overloaded` or a retry). */
int actor_send(actor_t *a, const char *peer_name, const msg_t *m);
/* As actor_send, but a full outbox still queues m (it is refused only for an unknown peer or out of
 * memory): for the messages a request cannot do without (its tokens, done and error to its router,
 * cancels). The caller bounds them: per step by actor_outbox_room, or a few per request. */
int actor_send_keep(actor_t *a, const char *peer_name, const msg_t *m);
/* How many more messages the outbox to peer_name takes before actor_send refuses (limits.outbox less
 * what is queued after sending what the peer takes now; negative past the limit, by keep sends). */
int actor_outbox_room(actor_t *a, const char *peer_name);
int actor_outbox_cap(const actor_t *a);   /* limits.outbox */
/* Connects to a peer now (not on first send) and reports its connection's ups and downs through
 * ops->peer_event: how a router learns within milliseconds that a worker process died. */
int actor_watch(actor_t *a, const char *peer_name);

/* Answers the sender of a message: a client or tool through the socket it came in on, another
 * actor of the cluster at its inbox (actors read nothing else). -1 if it is gone. */
int actor_reply(actor_t *a, const actor_peer_t *to, const msg_t *m);
/* actor_reply_stream's answer when the connection's backlog (or the peer's outbox) is full. */
#define ACTOR_REFUSED (-2)
/* Answers a client like actor_reply, for a request's stream: a reply its connection cannot take now
 * (the client reads slowly) waits in that connection's backlog and goes out, in order, as the client
 * reads (the loop flushes it; actor_reply to that connection waits behind it too). 0 when sent or
 * queued; ACTOR_REFUSED when the backlog holds limits.outbox replies already and !keep (the client
 * is not reading: the caller fails the request); -1 when the connection is gone. keep: queued past
 * the limit (terminal replies, one per request). To another actor: actor_send(_keep) by name. */
int actor_reply_stream(actor_t *a, const actor_peer_t *to, const msg_t *m, int keep);
/* Every actor_reply on sock (a socket from actor_bind_router) goes through actor_reply_stream
 * (!keep): a reply a connection cannot take now waits instead of failing. -1: not such a socket. */
int actor_reply_backlog(actor_t *a, void *sock);
/* Sends what the peers' outboxes and the client backlogs can send now (the loop does this every
 * time round). Returns how many messages still wait. */
int actor_flush(actor_t *a);
/* Lets libzmq finish its work on every peer's socket: it runs a socket's pending commands (freeing
 * the pipes of a connection that ended, attaching a reconnection's) only when the application calls
 * that socket, so a DEALER to a peer we never send to kept the two pipes of each connection its
 * peer's restarts ended (16 KiB per restart, never freed). The loop calls it once a second. */
void actor_tend_peers(actor_t *a);
/* Replies with an error message (code, text, retryable) to a sender, correlated by id. To another
 * actor it is kept past a full outbox (actor_send_keep): a terminal reply. Never to the sender of
 * the error message a handler is running on (nor does any send of an error to it go): dropped and
 * counted, so two peers cannot answer each other's errors forever. */
int actor_reply_error(actor_t *a, const actor_peer_t *to, uint64_t id, msg_error_code_t code,
                      int retryable, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Binds sock at an endpoint of the topology; `what` names where it comes from for the error
 * ("endpoints.client"). A bind that fails logs one line, `cannot bind <endpoint> (<what>): <reason>`
 * with a hint for the usual causes, and returns -1: the role then exits ACTOR_EXIT_CONFIG, since a
 * port another program holds, an address this host lacks or a directory it cannot write stays so
 * however often the actor is restarted (the supervisor restart-looped to its limit in 0.2 s). */
int actor_bind(void *sock, const char *endpoint, const char *what);
/* actor_bind's error line, for a bind done without ZeroMQ (the gateway's HTTP port); err: errno. */
void actor_bind_failed(const char *endpoint, const char *what, int err);

/* Adds a ROUTER socket the role binds itself (client-facing, inspection) at endpoint (`what`: as
 * actor_bind's). Its messages are decoded and dispatched through the same handler table; the
 * socket is closed by actor_destroy. Returns the socket (the runtime applies the standard options
 * first) or NULL after logging why (a failed bind: exit ACTOR_EXIT_CONFIG). */
void *actor_bind_router(actor_t *a, const char *endpoint, const char *what);

/* Adds a socket the role reads itself (the monitor's stats SUB): fn is called when it is
 * readable and must not block (ZMQ_DONTWAIT). The socket is closed by actor_destroy. */
typedef int (*actor_reader_fn)(actor_t *a, void *state, void *sock);
int actor_add_reader(actor_t *a, void *sock, actor_reader_fn fn);

/* A plain descriptor (not a ZeroMQ socket) whose readability wakes the loop, so before_sleep
 * handles it at once: an expert-parallel peer starting a step (actors/worker/expert_group.h). The
 * role owns and reads it; it stays polled until the actor ends. At most 64. */
int actor_add_wake_fd(actor_t *a, int fd);

/* Calls fn(a, state) every interval_ms (first call after one interval). At most 16 timers. */
typedef int (*actor_timer_fn)(actor_t *a, void *state);
int actor_timer_add(actor_t *a, int interval_ms, actor_timer_fn fn);

/* Applies the standard options (linger, max message size, HWMs) to a socket made elsewhere
 * (e.g. a client library socket). */
void actor_sock_defaults(void *sock, const topo_limits_t *limits);

/* Role-specific entries for fill_stats. A queue's name must be a string literal or outlive the
 * call; a metric's name is copied (up to 95 bytes), so it may live in a reused buffer. */
void actor_stat_queue(actor_t *a, msg_stats_t *st, const char *name, uint64_t depth, uint64_t cap);
void actor_stat_metric(actor_t *a, msg_stats_t *st, const char *name, double value, int counter);
/* 1 if an actor of role sender may send messages of this type to another actor's inbox. */
int actor_may_send(topo_role_t sender, msg_type_t type);
/* The key files of an instance (or "supervisor") under security.curve_keys_dir (default
 * <run_dir>/keys): <name>.pub and <name>.key. -1 if a path does not fit in cap. */
int actor_key_paths(const topo_t *t, const char *name, char *pub, char *sec, size_t cap);
/* An instance's (or the supervisor's) public key, Z85, read from its .pub file. */
int actor_public_key(const topo_t *t, const char *name, char *z85, char *err, size_t errlen);
/* Makes a socket a role binds itself (the monitor's stats SUB) a CURVE server for the cluster's
 * actors, when CURVE is in force; 0 otherwise. Call before bind. */
int actor_curve_server(actor_t *a, void *sock);
/* Makes a socket a role connects to the cluster's client endpoint (the gateway's DEALER to the
 * router) a CURVE client with our keypair, when CURVE is in force (the router admits gateway
 * instances by their keys); 0 otherwise. Call before connect. */
int actor_curve_client_endpoint(actor_t *a, void *sock);

/* The wire role for a topology role. */
msg_role_t actor_msg_role(topo_role_t r);

const topo_t *actor_topo(const actor_t *a);
const topo_instance_t *actor_self(const actor_t *a);
void *actor_zmq_ctx(actor_t *a);
int actor_draining(const actor_t *a);    /* 1 after TERM / SIGTERM */
uint64_t actor_restarts(const actor_t *a);

#endif
