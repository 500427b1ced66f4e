/* actors/runtime/actor.c — the poll loop, sockets, supervision protocol and stats of every actor.
 * See actor.h for the life of an actor and the socket layout. */
#include "actors/runtime/actor.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "actors/runtime/auth.h"
#include "common/log.h"
#include "common/util.h"

#define MAX_EXTRA     4             /* role-bound ROUTER sockets */
#define MAX_POLLED    4             /* role sockets with their own reader (SUB, ...) */
#define MAX_WAKE_FDS  64            /* plain descriptors that wake the loop (actor_add_wake_fd) */
#define MAX_TIMERS    16
#define MAX_PEERS     256
#define SEND_BUF      (MSG_MAX_FRAME)
#define LINGER_MS     200           /* bounded: shutdown never waits longer on unsent data */
#define STATS_MS      1000
/* A step (one forward of a big batch on a slow CPU) may take seconds; heartbeats are answered by a
 * thread meanwhile. A loop that has not come round for this long is wedged for real: the thread
 * stops answering and the supervisor kills the process. SIGSTOP stops the thread too, so a
 * stopped process is still detected within liveness x heartbeat_ms. */
#define STEP_TIMEOUT_MS 30000

typedef struct outbox_item {
    uint8_t *data;
    size_t len;
} outbox_item_t;

/* Encoded messages waiting for a socket, oldest first: a ring that grows on demand. Its limit
 * (limits.outbox) is the senders' to apply: actor_send refuses past it, actor_send_keep does not. */
typedef struct fifo {
    outbox_item_t *q;               /* ring of cap */
    int head, len, cap;
} fifo_t;

/* At most one log line a second for a burst of like events (sends refused): each line counts the
 * events since the one before, and the stats tick writes out the rest of a burst. */
typedef struct ratelog {
    uint64_t n, logged;             /* events; how many of them lines have counted */
    int64_t last_ms;                /* the last line */
} ratelog_t;

/* One destination actor: a lazily-connected DEALER and the queue for when it is full. */
typedef struct peer {
    char name[TOPO_NAME_MAX];
    void *sock;
    void *mon;                      /* PAIR receiving the DEALER's socket-monitor events, or NULL */
    int up;                         /* last connection event seen (watched peers) */
    fifo_t q;                       /* past the DEALER's send_hwm; limits.outbox for actor_send */
    ratelog_t refused;              /* sends refused with the outbox full */
    msg_type_t refused_type;        /* the latest of them, for the log line */
    uint64_t refused_id;
    ratelog_t over;                 /* actor_send_keep sends queued past limits.outbox */
    int64_t rejected_ms;            /* when the runtime last answered a bad message of its (s_reject) */
} peer_t;

/* Replies for one client connection that its pipe could not take (it reads slowly): sent in order
 * before anything newer for it (actor_reply_stream). */
typedef struct backlog {
    void *sock;                     /* a client-facing ROUTER (actor_bind_router) */
    uint8_t id[ACTOR_ID_MAX];       /* the connection's routing id */
    size_t id_len;
    fifo_t q;                       /* limits.outbox, past it only `keep` replies */
} backlog_t;

typedef struct timer {
    int interval_ms;
    int64_t next_ms;
    actor_timer_fn fn;
} timer_t_;

struct actor {
    topo_t *topo;                   /* the whole cluster's topology, validated */
    const topo_instance_t *self;    /* our instance inside topo */
    topo_role_t role;
    void *ctx;                      /* ZeroMQ context */
    void *inbox;                    /* ROUTER, bound at self->inbox_bind */
    void *control;                  /* DEALER to the supervisor, owned by the heartbeat thread; NULL
                                       when run by hand without one */
    pthread_t hb_thread;            /* answers the supervisor while a long step runs (see s_hb_main) */
    int hb_started;
    _Atomic int hb_stop;            /* main -> thread: exit */
    _Atomic int ready_flag;         /* main -> thread: send READY */
    _Atomic int term_flag;          /* thread -> main: TERM received */
    _Atomic int64_t progress_ms;    /* main: last time the loop came round */
    _Atomic uint64_t a_steps, a_msgs_in, a_msgs_out;   /* counters the heartbeats carry */
    void *stats_pub;                /* PUB to the monitor */
    void *extra[MAX_EXTRA];         /* role-bound ROUTERs */
    int extra_backlog[MAX_EXTRA];   /* 1: its replies wait in backlogs when a connection is full */
    int n_extra;
    void *polled[MAX_POLLED];       /* role sockets read by their own function */
    actor_reader_fn polled_fn[MAX_POLLED];
    int n_polled;
    int wake_fds[MAX_WAKE_FDS];     /* readable: the loop comes round (before_sleep reads them) */
    int n_wake_fds;
    peer_t peers[MAX_PEERS];        /* destinations, by name */
    int n_peers;
    int outbox_cap;                 /* limits.outbox */
    backlog_t *backlogs;            /* [n_backlogs] client connections with replies waiting; only those
                                       with streams in flight get one (admission_queue bounds them) */
    int n_backlogs, cap_backlogs;
    ratelog_t replies_refused;      /* client replies refused with the connection's backlog full */
    uint64_t sends_refused, replies_dropped;   /* outbox full; a backlog's client gone before it read it */
    timer_t_ timers[MAX_TIMERS];
    int n_timers;
    uint8_t *sendbuf;               /* [SEND_BUF] encode scratch: no malloc per message */
    int64_t started_ms;             /* monotonic, for uptime */
    _Atomic int64_t last_sup_ms;    /* last message from the supervisor (orphan detection) */
    int64_t next_stats_ms;
    cpu_meter_t cpu;                /* the process's CPU time at the last stats report (cpu_percent) */
    int64_t drain_deadline_ms;      /* 0 until TERM */
    uint64_t restarts;              /* incarnation number from the supervisor (TROUPE_RESTARTS) */
    uint64_t msgs_in, msgs_out, malformed, steps;
    int draining;
    msg_state_t state;
    auth_t *auth;                   /* ZAP handler when CURVE is in force (the topology has keys), else NULL */
    auth_keypair_t kp;              /* our own keypair (CURVE): inbox server key, client key everywhere */
    auth_keypair_t server_kp;       /* the client-facing endpoints' keypair (security.curve_server_*) */
    uint64_t refused, oversized;    /* inbox messages refused (sender's role or name), frames over the cap */
    uint64_t errors_unanswered;     /* error messages in with no handler, or that a handler tried to answer
                                       with an error: never answered (s_reject) */
    uint64_t rejects_limited;       /* bad messages from actors left unanswered: one error a second each */
    const actor_peer_t *error_from; /* while a handler runs on an error message: its sender (no error to it) */
    msg_queue_depth_t queues[MSG_MAX_QUEUES];   /* storage for the stats being built */
    msg_metric_t metrics[MSG_MAX_METRICS];
    /* Copies of the metrics' names: callers build names like "layer_3_ratio" in reused stack
     * buffers, so the stats message must not keep their pointers. */
    char metric_names[MSG_MAX_METRICS][96];
    int n_queues, n_metrics;
};

static volatile sig_atomic_t s_term_signal = 0;
/* 0 until actor_run: the role is still setting up (loading a model may take minutes) and reads no
 * flag, so a stop signal then (the supervisor's SIGTERM, a Ctrl-C, the supervisor's death) ends the
 * process at once. Nothing has been served, so nothing is to drain; waiting for the set-up to end
 * made the supervisor SIGKILL it after its grace period and report an unclean stop. */
static volatile sig_atomic_t s_serving = 0;
/* The supervisor that started us (our parent, set in actor_new); 0 when run by hand. */
static pid_t s_sup_pid = 0;

static void s_on_signal(int sig)
{
    if (!s_serving)
        _exit(0);
    /* Our supervisor died (kill -9, OOM): its death's SIGTERM (PR_SET_PDEATHSIG) ends us at once,
     * without a drain. Nobody manages this cluster any more, and a draining actor blocks the next
     * supervisor of it: it holds its tcp ports (a new router's bind fails), and its sockets,
     * reconnecting to the new actors' ipc paths under its instance's name, take that name's
     * traffic from the new incarnation (handover), which then never gets its READY through. */
    if (s_sup_pid && getppid() != s_sup_pid)
        _exit(1);
    s_term_signal = sig;
}

/* ---- queues ------------------------------------------------------------------------------ */

/* Appends a copy of data; -1 out of memory. */
static int s_fifo_push(fifo_t *f, const uint8_t *data, size_t len)
{
    if (f->len == f->cap) {
        int cap = f->cap ? f->cap * 2 : 64;
        outbox_item_t *q = malloc((size_t)cap * sizeof *q);
        if (!q)
            return -1;
        for (int i = 0; i < f->len; i++)
            q[i] = f->q[(f->head + i) % f->cap];
        free(f->q);
        *f = (fifo_t){.q = q, .head = 0, .len = f->len, .cap = cap};
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return -1;
    memcpy(copy, data, len);
    f->q[(f->head + f->len) % f->cap] = (outbox_item_t){copy, len};
    f->len++;
    return 0;
}

static void s_fifo_pop(fifo_t *f)
{
    free(f->q[f->head].data);
    f->head = (f->head + 1) % f->cap;
    f->len--;
}

static void s_fifo_free(fifo_t *f)
{
    while (f->len > 0)
        s_fifo_pop(f);
    free(f->q);
    *f = (fifo_t){0};
}

/* 1 when a burst's line is due: events not counted yet and none written this second. */
static int s_ratelog_due(const ratelog_t *r, int64_t now) { return r->n > r->logged && now - r->last_ms >= 1000; }

/* The events since the last line (marked as counted). */
static uint64_t s_ratelog_take(ratelog_t *r, int64_t now)
{
    uint64_t k = r->n - r->logged;
    r->logged = r->n;
    r->last_ms = now;
    return k;
}

/* ---- sockets ----------------------------------------------------------------------------- */

void actor_sock_defaults(void *sock, const topo_limits_t *limits)
{
    int linger = LINGER_MS;
    int64_t maxmsg = limits ? limits->max_message_bytes : MSG_MAX_FRAME;
    int sndhwm = limits ? limits->send_hwm : 1000, rcvhwm = limits ? limits->recv_hwm : 1000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
}

/* ---- keys -------------------------------------------------------------------------------- */

int actor_key_paths(const topo_t *t, const char *name, char *pub, char *sec, size_t cap)
{
    char dir[TOPO_PATH_MAX + 8];
    if (t->security.curve_keys_dir[0])
        snprintf(dir, sizeof dir, "%s", t->security.curve_keys_dir);
    else
        snprintf(dir, sizeof dir, "%s/keys", t->endpoints.run_dir);
    int a = snprintf(pub, cap, "%s/%s.pub", dir, name), b = snprintf(sec, cap, "%s/%s.key", dir, name);
    return a < 0 || b < 0 || (size_t)a >= cap || (size_t)b >= cap ? -1 : 0;
}

int actor_public_key(const topo_t *t, const char *name, char *z85, char *err, size_t errlen)
{
    char pub[TOPO_PATH_MAX + 128], sec[TOPO_PATH_MAX + 128];
    if (actor_key_paths(t, name, pub, sec, sizeof pub) != 0)
        return errf(err, errlen, "security.curve_keys_dir: path too long");
    return auth_key_read(pub, z85, err, errlen);
}

/* CURVE set-up: our keypair, the ZAP handler with every actor's public key in domain "cluster"
 * (user id = instance name, "supervisor" for the supervisor) and, for the actors that serve
 * clients (router, monitor), the client-facing keypair and the allow-list in domain "clients". */
static int s_curve_setup(actor_t *a)
{
    const topo_t *t = a->topo;
    const topo_security_t *sec = &t->security;
    char err[512], pub[TOPO_PATH_MAX + 128], key[TOPO_PATH_MAX + 128], z85[AUTH_Z85_LEN + 1];
    if (!auth_curve_available()) {
        LOG_E("security: the topology has CURVE keys but this libzmq has no CURVE");
        return -1;
    }
    if (actor_key_paths(t, a->self->name, pub, key, sizeof pub) != 0 ||
        auth_key_read(pub, a->kp.pub, err, sizeof err) != 0 || auth_key_read(key, a->kp.sec, err, sizeof err) != 0) {
        LOG_E("security: our keypair: %s (the supervisor generates it at launch)", err);
        return -1;
    }
    a->auth = auth_new(a->ctx, err, sizeof err);
    if (!a->auth) {
        LOG_E("security: %s", err);
        return -1;
    }
    for (int i = 0; i <= t->n_instances; i++) {
        const char *name = i < t->n_instances ? t->instances[i].name : "supervisor";
        if (actor_public_key(t, name, z85, err, sizeof err) != 0 || auth_allow(a->auth, "cluster", z85, name) != 0) {
            LOG_E("security: %s", err);
            return -1;
        }
        /* A gateway is a client of the router, known by its own key. */
        if (i < t->n_instances && t->instances[i].role == ROLE_GATEWAY)
            auth_allow(a->auth, "clients", z85, name);
    }
    if (auth_key_read(sec->curve_server_public, a->server_kp.pub, err, sizeof err) != 0) {
        LOG_E("security.curve_server_public: %s", err);
        return -1;
    }
    if (a->role == ROLE_ROUTER || a->role == ROLE_MONITOR) {
        if (auth_key_read(sec->curve_server_secret, a->server_kp.sec, err, sizeof err) != 0) {
            LOG_E("security.curve_server_public / curve_server_secret: %s", err);
            return -1;
        }
        int n = auth_allow_file(a->auth, "clients", sec->curve_clients, err, sizeof err);
        if (n < 0) {
            LOG_E("security.curve_clients: %s", err);
            return -1;
        }
        LOG_I("CURVE: %d client keys allowed (%s)", n, sec->curve_clients);
    }
    if (auth_start(a->auth, err, sizeof err) != 0) {
        LOG_E("security: %s", err);
        return -1;
    }
    return 0;
}

int actor_curve_server(actor_t *a, void *sock)
{
    return a->auth ? auth_server(sock, &a->kp, "cluster") : 0;
}

int actor_curve_client_endpoint(actor_t *a, void *sock)
{
    return a->auth ? auth_client(sock, &a->kp, a->server_kp.pub) : 0;
}

/* ---- sockets ----------------------------------------------------------------------------- */

/* A ROUTER bound at endpoint: our inbox (clients = 0: actors of the cluster connect) or a
 * client-facing socket (clients = 1). Frames up to twice limits.max_message_bytes are read so
 * that one over the limit can be answered with an error naming it (s_drain_router); past that
 * libzmq drops the connection. */
static void *s_router(actor_t *a, const char *endpoint, const char *what, int clients)
{
    void *s = zmq_socket(a->ctx, ZMQ_ROUTER);
    if (!s)
        return NULL;
    int one = 1;
    actor_sock_defaults(s, &a->topo->limits);
    int64_t maxmsg = a->topo->limits.max_message_bytes * 2;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);   /* never drop silently */
    zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &one, sizeof one);    /* restarted peers reclaim ids */
    if (a->auth && (auth_server(s, clients ? &a->server_kp : &a->kp, clients ? "clients" : "cluster") != 0 ||
                    auth_watch(a->auth, s, clients ? "client endpoint" : "inbox") != 0)) {
        LOG_E("CURVE options on %s: %s", endpoint, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    if (actor_bind(s, endpoint, what) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

void actor_bind_failed(const char *endpoint, const char *what, int err)
{
    const int ipc = strncmp(endpoint, "ipc://", 6) == 0;
    const char *hint = err == EADDRINUSE      ? "; another cluster or program holds it"
                       : err == EADDRNOTAVAIL ? "; no interface of this host has that address"
                       : err == EACCES        ? (ipc ? "; its directory is not writable by this user"
                                                     : "; a port below 1024 needs privileges")
                       : err == ENOENT && ipc ? "; its directory does not exist"
                                              : "";
    LOG_E("cannot bind %s (%s): %s%s", endpoint, what, zmq_strerror(err), hint);
}

int actor_bind(void *sock, const char *endpoint, const char *what)
{
    if (zmq_bind(sock, endpoint) == 0)
        return 0;
    actor_bind_failed(endpoint, what, zmq_errno());
    return -1;
}

static int s_curve_client(actor_t *a, void *s, const char *server)
{
    char z85[AUTH_Z85_LEN + 1], err[512];
    if (actor_public_key(a->topo, server, z85, err, sizeof err) != 0 || auth_client(s, &a->kp, z85) != 0) {
        LOG_E("CURVE client of %s: %s", server, err);
        return -1;
    }
    return 0;
}

/* immediate: queue nothing for a peer that is not connected (peers: the outbox holds it);
 * the control channel wants the opposite, READY must wait for the supervisor's socket. */
/* server: the name whose public key the other end serves with (CURVE). */
static void *s_dealer(actor_t *a, const char *endpoint, const char *identity, int immediate, const char *server)
{
    void *s = zmq_socket(a->ctx, ZMQ_DEALER);
    if (!s)
        return NULL;
    actor_sock_defaults(s, &a->topo->limits);
    zmq_setsockopt(s, ZMQ_IMMEDIATE, &immediate, sizeof immediate);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, identity, strlen(identity));
    if (a->auth && s_curve_client(a, s, server) != 0) {
        zmq_close(s);
        return NULL;
    }
    if (zmq_connect(s, endpoint) != 0) {
        LOG_E("connect %s: %s", endpoint, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

void *actor_bind_router(actor_t *a, const char *endpoint, const char *what)
{
    if (a->n_extra >= MAX_EXTRA) {
        LOG_E("%s: more than %d client-facing sockets", endpoint, MAX_EXTRA);
        return NULL;
    }
    void *s = s_router(a, endpoint, what, 1);
    if (s)
        a->extra[a->n_extra++] = s;
    return s;
}

/* ---- encode / send ----------------------------------------------------------------------- */

static int s_encode(actor_t *a, const msg_t *m, size_t *len)
{
    char err[256];
    if (msg_encode(m, a->sendbuf, SEND_BUF, len, err, sizeof err) != 0) {
        LOG_E("encode %s id=%llu: %s", msg_type_name(m->type), (unsigned long long)m->id, err);
        return -1;
    }
    return 0;
}

static peer_t *s_peer(actor_t *a, const char *name)
{
    for (int i = 0; i < a->n_peers; i++)
        if (strcmp(a->peers[i].name, name) == 0)
            return &a->peers[i];
    const topo_instance_t *inst = topo_find(a->topo, name);
    if (!inst || a->n_peers >= MAX_PEERS)
        return NULL;
    peer_t *p = &a->peers[a->n_peers];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->sock = s_dealer(a, inst->inbox, a->self->name, 1, name);
    p->up = 1;   /* assumed until a watched connection reports otherwise */
    if (!p->sock)
        return NULL;
    a->n_peers++;
    return p;
}

/* Sends queued messages while the peer accepts them. Returns how many are still queued. */
static int s_flush_peer(peer_t *p)
{
    while (p->q.len > 0) {
        const outbox_item_t *it = &p->q.q[p->q.head];
        if (zmq_send(p->sock, it->data, it->len, ZMQ_DONTWAIT) < 0)
            break;
        s_fifo_pop(&p->q);
    }
    return p->q.len;
}

void actor_tend_peers(actor_t *a)
{
    for (int i = 0; i < a->n_peers; i++) {
        int events;
        size_t len = sizeof events;
        zmq_getsockopt(a->peers[i].sock, ZMQ_EVENTS, &events, &len);   /* runs the socket's commands */
    }
}

int actor_watch(actor_t *a, const char *peer_name)
{
    peer_t *p = s_peer(a, peer_name);
    if (!p)
        return -1;
    if (p->mon)
        return 0;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://peer-mon-%d", (int)(p - a->peers));
    if (zmq_socket_monitor(p->sock, ep, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0)
        return -1;
    p->mon = zmq_socket(a->ctx, ZMQ_PAIR);
    int linger = 0;
    zmq_setsockopt(p->mon, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(p->mon, ep) != 0) {
        zmq_close(p->mon);
        p->mon = NULL;
        return -1;
    }
    return 0;
}

/* Socket-monitor events: frame 1 = u16 event + u32 value, frame 2 = the endpoint. */
static void s_read_peer_events(actor_t *a, const actor_ops_t *ops, void *state, peer_t *p)
{
    for (;;) {
        uint8_t ev[6];
        int n = zmq_recv(p->mon, ev, sizeof ev, ZMQ_DONTWAIT);
        if (n < 0)
            return;
        char ep[256];
        zmq_recv(p->mon, ep, sizeof ep, ZMQ_DONTWAIT);
        uint16_t e;
        memcpy(&e, ev, 2);
        int up = e == ZMQ_EVENT_CONNECTED;
        if (up == p->up)
            continue;
        p->up = up;
        LOG_I("peer %s %s", p->name, up ? "connected" : "disconnected");
        if (ops->peer_event)
            ops->peer_event(a, state, p->name, up);
    }
}

/* The rate-limited lines of a peer's outbox: sends refused, keep sends past the limit. */
static void s_log_outbox(actor_t *a, peer_t *p, int64_t now)
{
    if (s_ratelog_due(&p->refused, now)) {
        const uint64_t k = s_ratelog_take(&p->refused, now);
        LOG_W("outbox to %s full (%d queued, limits.outbox %d): %llu sends refused since the last line "
              "(latest: %s id=%llu)", p->name, p->q.len, a->outbox_cap, (unsigned long long)k,
              msg_type_name(p->refused_type), (unsigned long long)p->refused_id);
    }
    if (s_ratelog_due(&p->over, now)) {
        const uint64_t k = s_ratelog_take(&p->over, now);
        /* Not a fault: a step bigger than the limit, or a burst of hand-offs' first tokens. */
        LOG_I("outbox to %s past limits.outbox (%d): %d queued, %llu messages kept past the limit since the "
              "last line (a stream's tokens and terminal replies are never refused)", p->name, a->outbox_cap,
              p->q.len, (unsigned long long)k);
    }
}

/* 1 when an error to (sock, id) would answer the error message a handler is running on: dropped
 * (counted, logged) instead. Two actors that each answer the other's errors with one of their own
 * (mixed versions, a handler that refuses what it cannot use) would never stop. */
static int s_answers_error(actor_t *a, const void *sock, const uint8_t *id, size_t id_len)
{
    const actor_peer_t *f = a->error_from;
    if (!f || f->sock != sock || f->id_len != id_len || memcmp(f->id, id, id_len) != 0)
        return 0;
    a->errors_unanswered++;
    if (a->errors_unanswered <= 10 || a->errors_unanswered % 100 == 0)
        LOG_W("an error to %.*s answering its error not sent (%llu errors not answered)", (int)id_len,
              (const char *)id, (unsigned long long)a->errors_unanswered);
    return 1;
}

/* actor_send and actor_send_keep: keep queues past limits.outbox instead of refusing. */
static int s_send(actor_t *a, const char *peer_name, const msg_t *m, int keep)
{
    if (m->type == MSG_ERROR && s_answers_error(a, a->inbox, (const uint8_t *)peer_name, strlen(peer_name)))
        return 0;
    peer_t *p = s_peer(a, peer_name);
    if (!p) {
        LOG_W("send %s to unknown peer '%s'", msg_type_name(m->type), peer_name);
        return -1;
    }
    size_t len;
    if (s_encode(a, m, &len) != 0)
        return -1;
    /* Order matters: never overtake messages already queued for this peer. */
    if (s_flush_peer(p) == 0 && zmq_send(p->sock, a->sendbuf, len, ZMQ_DONTWAIT) >= 0) {
        a->msgs_out++;
        return 0;
    }
    if (p->q.len >= a->outbox_cap) {
        if (!keep) {
            p->refused.n++;
            p->refused_type = m->type;
            p->refused_id = m->id;
            a->sends_refused++;
            s_log_outbox(a, p, now_ms());
            return -1;
        }
        p->over.n++;
        s_log_outbox(a, p, now_ms());
    }
    if (s_fifo_push(&p->q, a->sendbuf, len) != 0) {
        LOG_E("out of memory queueing %s id=%llu for %s", msg_type_name(m->type), (unsigned long long)m->id, p->name);
        return -1;
    }
    a->msgs_out++;
    return 0;
}

int actor_send(actor_t *a, const char *peer_name, const msg_t *m) { return s_send(a, peer_name, m, 0); }

int actor_send_keep(actor_t *a, const char *peer_name, const msg_t *m) { return s_send(a, peer_name, m, 1); }

int actor_outbox_room(actor_t *a, const char *peer_name)
{
    peer_t *p = s_peer(a, peer_name);
    return p ? a->outbox_cap - s_flush_peer(p) : a->outbox_cap;
}

int actor_outbox_cap(const actor_t *a) { return a->outbox_cap; }

/* ---- client backlogs --------------------------------------------------------------------- */

static backlog_t *s_backlog_find(actor_t *a, const actor_peer_t *to)
{
    for (int i = 0; i < a->n_backlogs; i++) {
        backlog_t *b = &a->backlogs[i];
        if (b->sock == to->sock && b->id_len == to->id_len && memcmp(b->id, to->id, to->id_len) == 0)
            return b;
    }
    return NULL;
}

static backlog_t *s_backlog_new(actor_t *a, const actor_peer_t *to)
{
    if (a->n_backlogs == a->cap_backlogs) {
        int cap = a->cap_backlogs ? a->cap_backlogs * 2 : 16;
        backlog_t *nb = realloc(a->backlogs, (size_t)cap * sizeof *nb);
        if (!nb)
            return NULL;
        a->backlogs = nb;
        a->cap_backlogs = cap;
    }
    backlog_t *b = &a->backlogs[a->n_backlogs++];
    *b = (backlog_t){.sock = to->sock, .id_len = to->id_len};
    memcpy(b->id, to->id, to->id_len);
    return b;
}

/* Sends a backlog's replies while its connection takes them; a connection that is gone (its client
 * closed it) loses them: nobody is left to read them. 1 when the backlog is empty now. */
static int s_backlog_flush(actor_t *a, backlog_t *b)
{
    while (b->q.len > 0) {
        const outbox_item_t *it = &b->q.q[b->q.head];
        if (zmq_send(b->sock, b->id, b->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
            if (errno == EAGAIN)
                return 0;
            LOG_D("client connection gone with %d replies waiting for it", b->q.len);
            a->replies_dropped += (uint64_t)b->q.len;
            break;
        }
        zmq_send(b->sock, it->data, it->len, ZMQ_DONTWAIT);   /* the identity frame went: so does this one */
        s_fifo_pop(&b->q);
    }
    s_fifo_free(&b->q);
    return 1;
}

/* Flushes every backlog, forgetting the empty ones. Returns the replies still waiting. */
static int s_flush_backlogs(actor_t *a)
{
    int waiting = 0;
    for (int i = 0; i < a->n_backlogs;) {
        if (s_backlog_flush(a, &a->backlogs[i])) {
            a->backlogs[i] = a->backlogs[--a->n_backlogs];
            continue;
        }
        waiting += a->backlogs[i].q.len;
        i++;
    }
    return waiting;
}

static void s_log_backlogs(actor_t *a, int64_t now)
{
    if (s_ratelog_due(&a->replies_refused, now)) {
        const uint64_t k = s_ratelog_take(&a->replies_refused, now);
        LOG_W("%llu replies to clients that do not read refused since the last line (a connection's backlog "
              "holds limits.outbox %d; their requests fail)", (unsigned long long)k, a->outbox_cap);
    }
}

int actor_reply_stream(actor_t *a, const actor_peer_t *to, const msg_t *m, int keep)
{
    if (to->sock == a->inbox && to->id_len < TOPO_NAME_MAX) {
        char name[TOPO_NAME_MAX];
        memcpy(name, to->id, to->id_len);
        name[to->id_len] = 0;
        if (topo_find(a->topo, name))
            return s_send(a, name, m, keep) == 0 ? 0 : ACTOR_REFUSED;
    }
    size_t len;
    if (s_encode(a, m, &len) != 0)
        return -1;
    backlog_t *b = s_backlog_find(a, to);
    if (b && s_backlog_flush(a, b)) {
        *b = a->backlogs[--a->n_backlogs];   /* drained (or its client is gone): send as if none */
        b = NULL;
    }
    if (!b) {
        if (zmq_send(to->sock, to->id, to->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) {
            zmq_send(to->sock, a->sendbuf, len, ZMQ_DONTWAIT);
            a->msgs_out++;
            return 0;
        }
        if (errno != EAGAIN) {
            LOG_D("reply %s id=%llu: %s", msg_type_name(m->type), (unsigned long long)m->id, zmq_strerror(errno));
            return -1;   /* no such connection (any more) */
        }
        b = s_backlog_new(a, to);
        if (!b)
            return -1;
    } else if (!keep && b->q.len >= a->outbox_cap) {
        a->replies_refused.n++;
        s_log_backlogs(a, now_ms());
        return ACTOR_REFUSED;
    }
    if (s_fifo_push(&b->q, a->sendbuf, len) != 0) {
        LOG_E("out of memory queueing a reply %s id=%llu", msg_type_name(m->type), (unsigned long long)m->id);
        return -1;
    }
    a->msgs_out++;
    return 0;
}

int actor_flush(actor_t *a)
{
    int pending = a->n_backlogs ? s_flush_backlogs(a) : 0;
    for (int i = 0; i < a->n_peers; i++)
        pending += s_flush_peer(&a->peers[i]);
    return pending;
}

int actor_reply_backlog(actor_t *a, void *sock)
{
    for (int i = 0; i < a->n_extra; i++)
        if (a->extra[i] == sock) {
            a->extra_backlog[i] = 1;
            return 0;
        }
    return -1;
}

static int s_backlogged_sock(const actor_t *a, const void *sock)
{
    for (int i = 0; i < a->n_extra; i++)
        if (a->extra[i] == sock)
            return a->extra_backlog[i];
    return 0;
}

int actor_reply(actor_t *a, const actor_peer_t *to, const msg_t *m)
{
    /* A connection with replies waiting: this one waits behind them (never overtakes a stream). */
    if (to->sock != a->inbox && (s_backlogged_sock(a, to->sock) || (a->n_backlogs > 0 && s_backlog_find(a, to))))
        return actor_reply_stream(a, to, m, 0) == 0 ? 0 : -1;
    /* From another actor of the cluster (it came in on our inbox, named by its instance): that
     * actor reads only its own inbox, never the connection it sends us on, so the answer goes
     * there by name. Clients and tools read their connection: they get it on it. */
    if (to->sock == a->inbox && to->id_len < TOPO_NAME_MAX) {
        char name[TOPO_NAME_MAX];
        memcpy(name, to->id, to->id_len);
        name[to->id_len] = 0;
        if (topo_find(a->topo, name))
            return actor_send(a, name, m);
    }
    size_t len;
    if (s_encode(a, m, &len) != 0)
        return -1;
    if (zmq_send(to->sock, to->id, to->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(to->sock, a->sendbuf, len, ZMQ_DONTWAIT) < 0) {
        LOG_D("reply %s id=%llu: %s", msg_type_name(m->type), (unsigned long long)m->id,
              zmq_strerror(errno));
        return -1;
    }
    a->msgs_out++;
    return 0;
}

int actor_reply_error(actor_t *a, const actor_peer_t *to, uint64_t id, msg_error_code_t code,
                      int retryable, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (s_answers_error(a, to->sock, to->id, to->id_len))
        return 0;
    msg_t m;
    msg_init(&m, MSG_ERROR, id);
    m.u.error.code = code;
    m.u.error.retryable = retryable != 0;
    m.u.error.message = text;
    /* To another actor an error is a terminal reply it waits for (a worker's refusal of a request):
     * kept past a full outbox. A client's goes as any reply (behind its backlog, if it has one). */
    if (to->sock == a->inbox)
        return actor_reply_stream(a, to, &m, 1) == 0 ? 0 : -1;
    return actor_reply(a, to, &m);
}

/* Encodes with a private buffer: the heartbeat thread must not share the main thread's. */
static int s_control_send(void *sock, const msg_t *m)
{
    uint8_t buf[1024];
    size_t len;
    char err[128];
    if (msg_encode(m, buf, sizeof buf, &len, err, sizeof err) != 0)
        return -1;
    /* The supervisor always reads; DONTWAIT so a stalled supervisor can never wedge us. */
    return zmq_send(sock, buf, len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

/* The heartbeat thread: owns the control socket. Sends READY when the main thread says so,
 * answers each heartbeat with the loop's progress counters as long as the loop is alive
 * (came round within STEP_TIMEOUT_MS), and turns TERM into a flag the loop reads. */
static void *s_hb_main(void *arg)
{
    actor_t *a = arg;
    int ready_sent = 0;
    while (!atomic_load(&a->hb_stop)) {
        if (!ready_sent && atomic_load(&a->ready_flag)) {
            msg_t ready;
            msg_init(&ready, MSG_READY, 0);
            ready.u.ready.role = actor_msg_role(a->role);
            ready.u.ready.name = a->self->name;
            ready.u.ready.endpoint = a->self->inbox;
            ready.u.ready.pid = (uint32_t)getpid();
            if (s_control_send(a->control, &ready) != 0)
                LOG_W("could not send READY to the supervisor");
            ready_sent = 1;
        }
        zmq_pollitem_t item = {.socket = a->control, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, 20) <= 0)
            continue;
        uint8_t buf[4096];
        int n;
        while ((n = zmq_recv(a->control, buf, sizeof buf, ZMQ_DONTWAIT)) >= 0) {
            atomic_store(&a->last_sup_ms, now_ms());
            msg_t m;
            char err[256];
            if (n > (int)sizeof buf || msg_decode(buf, (size_t)n, &m, err, sizeof err) != 0)
                continue;
            if (m.type == MSG_HEARTBEAT && ready_sent &&
                now_ms() - atomic_load(&a->progress_ms) < STEP_TIMEOUT_MS) {
                msg_t r;
                msg_init(&r, MSG_HEARTBEAT, m.id);
                r.u.heartbeat.seq = m.u.heartbeat.seq;
                r.u.heartbeat.steps = atomic_load(&a->a_steps);
                r.u.heartbeat.msgs_in = atomic_load(&a->a_msgs_in);
                r.u.heartbeat.msgs_out = atomic_load(&a->a_msgs_out);
                s_control_send(a->control, &r);
            } else if (m.type == MSG_TERM) {
                atomic_store(&a->term_flag, 1);
            }
            msg_free(&m);
        }
    }
    return NULL;
}

/* ---- stats ------------------------------------------------------------------------------- */

msg_role_t actor_msg_role(topo_role_t r)
{
    static const msg_role_t map[ROLE_COUNT] = {
        [ROLE_ROUTER] = MSG_ROLE_ROUTER,
        [ROLE_PREFILL] = MSG_ROLE_PREFILL,
        [ROLE_DECODE] = MSG_ROLE_DECODE,
        [ROLE_CACHE_MANAGER] = MSG_ROLE_CACHE_MANAGER,
        [ROLE_EXPERT_BALANCER] = MSG_ROLE_EXPERT_BALANCER,
        [ROLE_DRAFT_SCHEDULER] = MSG_ROLE_DRAFT_SCHEDULER,
        [ROLE_MONITOR] = MSG_ROLE_MONITOR,
        [ROLE_GATEWAY] = MSG_ROLE_GATEWAY,
    };
    return r < ROLE_COUNT ? map[r] : MSG_ROLE_NONE;
}

void actor_stat_queue(actor_t *a, msg_stats_t *st, const char *name, uint64_t depth, uint64_t cap)
{
    if (a->n_queues >= MSG_MAX_QUEUES)
        return;
    a->queues[a->n_queues++] = (msg_queue_depth_t){.name = name, .depth = depth, .capacity = cap};
    st->n_queues = (uint32_t)a->n_queues;
}

void actor_stat_metric(actor_t *a, msg_stats_t *st, const char *name, double value, int counter)
{
    if (a->n_metrics >= MSG_MAX_METRICS)
        return;
    char *copy = a->metric_names[a->n_metrics];
    snprintf(copy, sizeof a->metric_names[0], "%s", name);
    a->metrics[a->n_metrics++] = (msg_metric_t){
        .name = copy, .value = value, .kind = counter ? MSG_METRIC_COUNTER : MSG_METRIC_GAUGE};
    st->n_metrics = (uint32_t)a->n_metrics;
}

static void s_publish_stats(actor_t *a, const actor_ops_t *ops, void *state)
{
    msg_t m;
    msg_init(&m, MSG_STATS, a->steps);
    msg_stats_t *st = &m.u.stats;
    st->role = actor_msg_role(a->role);
    st->name = a->self->name;
    st->pid = (uint32_t)getpid();
    st->uptime_ms = (uint64_t)(now_ms() - a->started_ms);
    st->state = a->state;
    st->restarts = (uint32_t)a->restarts;
    st->msgs_in = a->msgs_in;
    st->msgs_out = a->msgs_out;
    st->malformed = a->malformed;
    /* Queue depths the runtime knows: the longest outbox. Roles add their own. */
    a->n_queues = 0;
    a->n_metrics = 0;
    st->queues = a->queues;
    st->metrics = a->metrics;
    int outbox = 0, backlog = 0;
    for (int i = 0; i < a->n_peers; i++)
        if (a->peers[i].q.len > outbox)
            outbox = a->peers[i].q.len;
    for (int i = 0; i < a->n_backlogs; i++)
        if (a->backlogs[i].q.len > backlog)
            backlog = a->backlogs[i].q.len;
    actor_stat_queue(a, st, "outbox", (uint64_t)outbox, (uint64_t)a->outbox_cap);
    if (a->n_extra > 0)
        actor_stat_queue(a, st, "client_backlog", (uint64_t)backlog, (uint64_t)a->outbox_cap);
    actor_stat_metric(a, st, "messages_refused", (double)a->refused, 1);
    actor_stat_metric(a, st, "sends_refused", (double)a->sends_refused, 1);
    if (a->n_extra > 0) {
        actor_stat_metric(a, st, "replies_refused", (double)a->replies_refused.n, 1);
        actor_stat_metric(a, st, "replies_dropped_client_gone", (double)a->replies_dropped, 1);
    }
    actor_stat_metric(a, st, "frames_oversized", (double)a->oversized, 1);
    actor_stat_metric(a, st, "errors_not_answered", (double)a->errors_unanswered, 1);
    actor_stat_metric(a, st, "error_replies_limited", (double)a->rejects_limited, 1);
    /* The process's CPU time over all its threads (libzmq's I/O thread, OpenMP's): which actor is
     * busy, e.g. a router relaying every token of a large batch (its rate over a window: the
     * difference of two reports over their uptime_ms). */
    double cpu, pct;
    if (cpu_meter_read(&a->cpu, a->started_ms, &cpu, &pct) == 0) {
        actor_stat_metric(a, st, "cpu_seconds_total", cpu, 1);
        actor_stat_metric(a, st, "cpu_percent", pct, 0);   /* since the last report: troupe-top's CPU% */
    }
    if (a->auth)
        actor_stat_metric(a, st, "auth_refused", (double)auth_refused(a->auth), 1);
    if (ops->fill_stats)
        ops->fill_stats(a, state, st);
    size_t len;
    if (s_encode(a, &m, &len) == 0)
        zmq_send(a->stats_pub, a->sendbuf, len, ZMQ_DONTWAIT);   /* PUB drops at HWM: fine for stats */
}

/* ---- receive / dispatch ------------------------------------------------------------------ */

/* The runtime's own answer to a message it cannot take (malformed, oversized, multipart, a type
 * with no handler). The rule that keeps two mismatched peers (mixed versions) from answering each
 * other forever: an error is never answered with an error, whatever its content (`type` is the
 * message's, peeked when it did not decode); and another actor (on the inbox) gets at most one
 * such error a second, the rest counted (error_replies_limited), so a peer that answers our
 * errors with bad messages stops hearing from us. Senders not of the cluster get none (as in
 * s_check_sender). Clients keep one terminal error per bad message: they never answer errors, so
 * there is no loop, and each of their requests must end. */
static void s_reject(actor_t *a, const actor_peer_t *from, msg_type_t type, uint64_t id, msg_error_code_t code,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void s_reject(actor_t *a, const actor_peer_t *from, msg_type_t type, uint64_t id, msg_error_code_t code,
                     const char *fmt, ...)
{
    if (type == MSG_ERROR) {
        a->errors_unanswered++;
        if (a->errors_unanswered <= 10 || a->errors_unanswered % 100 == 0)
            LOG_W("an error message from %.*s (id=%llu) we could not take: not answered (%llu errors not answered)",
                  (int)from->id_len, (const char *)from->id, (unsigned long long)id,
                  (unsigned long long)a->errors_unanswered);
        return;
    }
    if (from->sock == a->inbox) {
        char name[TOPO_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)from->id_len, (const char *)from->id);
        peer_t *p = from->id_len < TOPO_NAME_MAX && topo_find(a->topo, name) ? s_peer(a, name) : NULL;
        const int64_t now = now_ms();
        if (!p || (p->rejected_ms && now - p->rejected_ms < 1000)) {
            a->rejects_limited++;
            return;
        }
        p->rejected_ms = now;
    }
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    actor_reply_error(a, from, id, code, 0, "%s", text);
}

static int s_dispatch(actor_t *a, const actor_ops_t *ops, void *state, const actor_peer_t *from,
                      msg_t *m)
{
    for (size_t i = 0; i < ops->n_handlers; i++)
        if (ops->handlers[i].type == m->type) {
            if (m->type != MSG_ERROR)
                return ops->handlers[i].fn(a, state, from, m);
            a->error_from = from;   /* its handler may not answer it with an error (s_answers_error) */
            int rc = ops->handlers[i].fn(a, state, from, m);
            a->error_from = NULL;
            return rc;
        }
    s_reject(a, from, m->type, m->id, MSG_ERR_BAD_REQUEST, "%s does not handle '%s' messages",
             topo_role_name(a->role), msg_type_name(m->type));
    return 0;
}

/* Who may send each message type to an inbox, a bit per topology role: every sender must be an
 * actor of this cluster (by its authenticated key when CURVE is in force, else by the routing id
 * it connects with), and these types only from these roles. Supervision and client messages
 * never arrive on an inbox (they have their own sockets). Types not listed: any actor. */
#define R_(x) (1u << ROLE_##x)
static const struct {
    msg_type_t type;
    unsigned roles;
} s_senders[] = {
    {MSG_READY, 0}, {MSG_TERM, 0}, {MSG_HEARTBEAT, 0}, {MSG_STATS, 0}, {MSG_SUBMIT, 0},
    {MSG_TOKEN, R_(PREFILL) | R_(DECODE)},
    {MSG_DONE, R_(PREFILL) | R_(DECODE)},
    {MSG_CANCEL, R_(ROUTER)},
    {MSG_PREFILL_REQUEST, R_(ROUTER)},
    {MSG_HANDOFF, R_(PREFILL) | R_(DECODE)},
    {MSG_CACHE_EVENT, R_(CACHE_MANAGER)},
    {MSG_EXPERT_PLACEMENT, R_(EXPERT_BALANCER)},
    {MSG_DRAFT_POLICY, R_(DRAFT_SCHEDULER)},
    {MSG_SPEC_REPORT, R_(DECODE)},
    {MSG_INSPECT_REPLY, R_(MONITOR)},
};

int actor_may_send(topo_role_t sender, msg_type_t type)
{
    for (size_t i = 0; i < ARRAY_LEN(s_senders); i++)
        if (s_senders[i].type == type)
            return (s_senders[i].roles >> sender) & 1u;
    return sender < ROLE_COUNT;
}

/* 0 if an inbox message (its payload frame `part`) may be dispatched; else it is refused: logged
 * (the first few and then every 100th) and counted, with no reply (the sender is not one we
 * answer). */
static int s_check_sender(actor_t *a, const actor_peer_t *from, zmq_msg_t *part)
{
    char name[TOPO_NAME_MAX], why[160];
    snprintf(name, sizeof name, "%.*s", (int)from->id_len, (const char *)from->id);
    const char *uid = a->auth ? zmq_msg_gets(part, "User-Id") : NULL;
    const topo_instance_t *in = topo_find(a->topo, name);
    msg_type_t t = MSG_NONE;
    uint64_t id = 0;
    if (a->auth && (!uid || strcmp(uid, name) != 0)) {
        snprintf(why, sizeof why, "connects as '%s' with the key of '%s'", name, uid ? uid : "(none)");
    } else if (!in) {
        snprintf(why, sizeof why, "'%s' is not another actor of this cluster", name);
    } else if (msg_peek(zmq_msg_data(part), zmq_msg_size(part), &t, &id) == 0 && !actor_may_send(in->role, t)) {
        snprintf(why, sizeof why, "a %s may not send '%s' messages", topo_role_name(in->role), msg_type_name(t));
    } else {
        return 0;
    }
    a->refused++;
    if (a->refused <= 10 || a->refused % 100 == 0)
        LOG_W("refused a message on the inbox: %s (%llu refused)", why, (unsigned long long)a->refused);
    return -1;
}

/* Reads everything waiting on one ROUTER socket (identity frame + payload frame), bounded per
 * call so one busy socket cannot starve the others. */
static int s_drain_router(actor_t *a, const actor_ops_t *ops, void *state, void *sock)
{
    for (int n = 0; n < 256; n++) {
        actor_peer_t from = {.sock = sock};
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            return 0;
        }
        from.id_len = zmq_msg_size(&part) < ACTOR_ID_MAX ? zmq_msg_size(&part) : ACTOR_ID_MAX;
        memcpy(from.id, zmq_msg_data(&part), from.id_len);
        int more = zmq_msg_more(&part);
        zmq_msg_close(&part);
        if (!more)
            continue;   /* a bare identity: nothing to do */
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            return 0;
        }
        int extra_frames = zmq_msg_more(&part);
        a->msgs_in++;
        if (!extra_frames && zmq_msg_size(&part) > (size_t)a->topo->limits.max_message_bytes) {
            /* Read (up to twice the limit, s_router) only to say so: never decoded. */
            msg_type_t t = MSG_NONE;
            uint64_t id = 0;
            if (msg_peek(zmq_msg_data(&part), zmq_msg_size(&part), &t, &id) != 0)
                id = 0;
            a->oversized++;
            a->malformed++;
            s_reject(a, &from, t, id, MSG_ERR_BAD_REQUEST,
                     "a frame of %zu bytes exceeds limits.max_message_bytes (%lld)", zmq_msg_size(&part),
                     (long long)a->topo->limits.max_message_bytes);
            zmq_msg_close(&part);
            continue;
        }
        const char *uid = a->auth ? zmq_msg_gets(&part, "User-Id") : NULL;
        if (uid)
            snprintf(from.user, sizeof from.user, "%s", uid);
        if (!extra_frames && sock == a->inbox && s_check_sender(a, &from, &part) != 0) {
            zmq_msg_close(&part);
            continue;
        }
        if (extra_frames) {
            /* One message = one frame. Swallow the rest of a multipart message and refuse it. */
            msg_type_t t = MSG_NONE;
            uint64_t id = 0;
            msg_peek(zmq_msg_data(&part), zmq_msg_size(&part), &t, &id);
            zmq_msg_t rest;
            do {
                zmq_msg_init(&rest);
                zmq_msg_recv(&rest, sock, ZMQ_DONTWAIT);
                extra_frames = zmq_msg_more(&rest);
                zmq_msg_close(&rest);
            } while (extra_frames);
            a->malformed++;
            s_reject(a, &from, t, 0, MSG_ERR_MALFORMED, "a message is exactly one frame");
            zmq_msg_close(&part);
            continue;
        }
        msg_t m;
        char err[256];
        int rc = msg_decode(zmq_msg_data(&part), zmq_msg_size(&part), &m, err, sizeof err);
        if (rc != 0) {
            /* Answer with the request id when the frame still shows one, so the client can
             * correlate the error with what it sent. */
            msg_type_t t = MSG_NONE;
            uint64_t id = 0;
            if (msg_peek(zmq_msg_data(&part), zmq_msg_size(&part), &t, &id) != 0)
                id = 0;
            zmq_msg_close(&part);
            a->malformed++;
            LOG_D("malformed message from %.*s: %s", (int)from.id_len, (const char *)from.id, err);
            s_reject(a, &from, t, id, MSG_ERR_MALFORMED, "malformed message: %s", err);
            continue;
        }
        zmq_msg_close(&part);
        if (log_verbose()) {
            char line[512];
            msg_to_json(&m, line, sizeof line);
            LOG_D("<- %.*s %s", (int)from.id_len, (const char *)from.id, line);
        }
        rc = s_dispatch(a, ops, state, &from, &m);
        msg_free(&m);
        if (rc != 0)
            return -1;
    }
    return 0;
}

static void s_start_drain(actor_t *a, const char *why)
{
    if (a->draining)
        return;
    a->draining = 1;
    a->state = MSG_STATE_DRAINING;
    /* Ends a little before the supervisor's SIGKILL (it waits grace_s from the same TERM), so
     * that an actor whose work outlasts the grace still exits by itself and says goodbye: the
     * router tells its clients, rather than their connections dropping. */
    const int64_t grace_ms = (int64_t)a->topo->supervision.grace_s * 1000;
    a->drain_deadline_ms = now_ms() + grace_ms - (grace_ms / 5 < 1000 ? grace_ms / 5 : 1000);
    LOG_I("draining (%s)", why);
}

/* ---- the loop ---------------------------------------------------------------------------- */

int actor_run(actor_t *a, const actor_ops_t *ops, void *state)
{
    s_serving = 1;   /* before READY: from now on a stop signal drains */
    a->state = MSG_STATE_READY;
    atomic_store(&a->last_sup_ms, now_ms());
    atomic_store(&a->progress_ms, now_ms());
    atomic_store(&a->ready_flag, 1);
    LOG_I("ready: %s inbox %s", a->self->name, a->self->inbox);
    /* Connect now to the actors of the serving path (routers, prefill and decode workers, cache
     * managers): a connection made lazily at the first send is not up yet when that send happens,
     * so the message would wait in the outbox for a whole step (a first token, a decode step). */
    for (int i = 0; i < a->topo->n_instances; i++) {
        const topo_instance_t *in = &a->topo->instances[i];
        if (in != a->self && (in->role == ROLE_ROUTER || in->role == ROLE_PREFILL || in->role == ROLE_DECODE ||
                              in->role == ROLE_CACHE_MANAGER))
            s_peer(a, in->name);
    }

    /* With no supervisor message for this long we are an orphan (the supervisor died or the
     * node lost it): exit rather than serve a cluster nobody manages. */
    const int64_t orphan_ms = (int64_t)a->topo->supervision.heartbeat_ms *
                                  a->topo->supervision.liveness * 4 + 5000;
    zmq_pollitem_t items[3 + MAX_EXTRA + MAX_POLLED + MAX_WAKE_FDS + 2 * MAX_PEERS];
    for (;;) {
        if (s_term_signal)
            s_start_drain(a, s_term_signal == SIGTERM ? "SIGTERM" : "SIGINT");
        if (a->draining) {
            int done = ops->drained ? ops->drained(a, state) : 1;
            if (done || now_ms() >= a->drain_deadline_ms) {
                if (!done)
                    LOG_W("grace period over with work left; exiting");
                a->state = MSG_STATE_STOPPING;
                s_publish_stats(a, ops, state);
                LOG_I("stopped");
                return 0;
            }
        }
        int busy = 0;
        if (ops->before_sleep) {
            busy = ops->before_sleep(a, state);
            if (busy < 0)
                return -1;
            if (busy)
                a->steps++;
        }
        const int pending = actor_flush(a);

        int64_t now = now_ms();
        int64_t wake = a->next_stats_ms;
        for (int i = 0; i < a->n_timers; i++)
            if (a->timers[i].next_ms < wake)
                wake = a->timers[i].next_ms;
        long timeout = busy ? 0 : (long)(wake > now ? wake - now : 0);
        if (pending && timeout > 5)
            timeout = 5;   /* retry queued sends soon */
        if (a->draining && timeout > 20)
            timeout = 20;

        int n = 0;
        items[n++] = (zmq_pollitem_t){.socket = a->inbox, .events = ZMQ_POLLIN};
        for (int i = 0; i < a->n_extra; i++)
            items[n++] = (zmq_pollitem_t){.socket = a->extra[i], .events = ZMQ_POLLIN};
        for (int i = 0; i < a->n_polled; i++)
            items[n++] = (zmq_pollitem_t){.socket = a->polled[i], .events = ZMQ_POLLIN};
        for (int i = 0; i < a->n_wake_fds; i++)
            items[n++] = (zmq_pollitem_t){.socket = NULL, .fd = a->wake_fds[i], .events = ZMQ_POLLIN};
        for (int i = 0; i < a->n_peers; i++)
            if (a->peers[i].mon)
                items[n++] = (zmq_pollitem_t){.socket = a->peers[i].mon, .events = ZMQ_POLLIN};
        /* A peer with messages queued wakes the loop as soon as it takes one (a decode worker holding
         * its step for a router's outbox resumes at once, not at the next 5 ms retry). */
        for (int i = 0; i < a->n_peers; i++)
            if (a->peers[i].q.len > 0)
                items[n++] = (zmq_pollitem_t){.socket = a->peers[i].sock, .events = ZMQ_POLLOUT};
        if (zmq_poll(items, n, timeout) < 0 && errno != EINTR) {
            LOG_E("poll: %s", zmq_strerror(errno));
            return -1;
        }
        if (s_drain_router(a, ops, state, a->inbox) != 0)
            return -1;
        if (atomic_load(&a->term_flag))
            s_start_drain(a, "TERM from supervisor");
        for (int i = 0; i < a->n_extra; i++)
            if (s_drain_router(a, ops, state, a->extra[i]) != 0)
                return -1;
        for (int i = 0; i < a->n_polled; i++)
            if (a->polled_fn[i](a, state, a->polled[i]) != 0)
                return -1;
        for (int i = 0; i < a->n_peers; i++)
            if (a->peers[i].mon)
                s_read_peer_events(a, ops, state, &a->peers[i]);

        now = now_ms();
        for (int i = 0; i < a->n_timers; i++) {
            timer_t_ *t = &a->timers[i];
            if (now >= t->next_ms) {
                t->next_ms = now + t->interval_ms;
                if (t->fn(a, state) != 0)
                    return -1;
            }
        }
        if (now >= a->next_stats_ms) {
            a->next_stats_ms = now + STATS_MS;
            s_publish_stats(a, ops, state);
            actor_tend_peers(a);
            for (int i = 0; i < a->n_peers; i++)   /* the ends of bursts the last lines did not count */
                s_log_outbox(a, &a->peers[i], now);
            s_log_backlogs(a, now);
        }
        atomic_store(&a->progress_ms, now);
        atomic_store(&a->a_steps, a->steps);
        atomic_store(&a->a_msgs_in, a->msgs_in);
        atomic_store(&a->a_msgs_out, a->msgs_out);
        if (a->control && now - atomic_load(&a->last_sup_ms) > orphan_ms) {
            LOG_E("no word from the supervisor for %lld ms: exiting", (long long)(now - atomic_load(&a->last_sup_ms)));
            return -1;
        }
    }
}

int actor_add_wake_fd(actor_t *a, int fd)
{
    if (a->n_wake_fds >= MAX_WAKE_FDS || fd < 0)
        return -1;
    a->wake_fds[a->n_wake_fds++] = fd;
    return 0;
}

int actor_add_reader(actor_t *a, void *sock, actor_reader_fn fn)
{
    if (a->n_polled >= MAX_POLLED)
        return -1;
    a->polled[a->n_polled] = sock;
    a->polled_fn[a->n_polled++] = fn;
    return 0;
}

int actor_timer_add(actor_t *a, int interval_ms, actor_timer_fn fn)
{
    if (a->n_timers >= MAX_TIMERS || interval_ms <= 0)
        return -1;
    a->timers[a->n_timers++] = (timer_t_){interval_ms, now_ms() + interval_ms, fn};
    return 0;
}

/* ---- set-up and tear-down ---------------------------------------------------------------- */

static void s_usage(const char *prog, topo_role_t role)
{
    fprintf(stderr,
            "usage: %s [--topology FILE] [--name INSTANCE] [--verbose]\n"
            "  Runs one %s actor of a Troupe cluster. Normally started by troupe-supervisor.\n"
            "  --topology FILE  the cluster's topology (default: the embedded one-machine CPU topology)\n"
            "  --name NAME      this instance's name in the topology (default: the first %s)\n"
            "  --verbose        debug logging, including every decoded message\n",
            prog, topo_role_name(role), topo_role_name(role));
}

actor_t *actor_new(int argc, char **argv, topo_role_t role)
{
    const char *topo_path = NULL, *name = NULL;
    static const struct option opts[] = {
        {"topology", required_argument, 0, 't'}, {"name", required_argument, 0, 'n'},
        {"verbose", no_argument, 0, 'v'},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:n:vh", opts, NULL)) != -1) {
        switch (c) {
        case 't': topo_path = optarg; break;
        case 'n': name = optarg; break;
        case 'v': log_set_verbose(1); break;
        case 'h': s_usage(argv[0], role); exit(0);
        default: s_usage(argv[0], role); return NULL;
        }
    }
    log_init(topo_role_name(role), -1);

    actor_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->role = role;
    a->started_ms = now_ms();
    a->state = MSG_STATE_STARTING;
    const char *r = getenv("TROUPE_RESTARTS");
    a->restarts = r ? strtoull(r, NULL, 10) : 0;

    topo_errors_t *errs = calloc(1, sizeof *errs);
    int rc = topo_path ? topo_load_file(topo_path, &a->topo, errs) : topo_load_default(&a->topo, errs);
    if (rc != 0) {
        topo_errors_print(errs, stderr);
        free(errs);
        free(a);
        return NULL;
    }
    free(errs);
    a->outbox_cap = a->topo->limits.outbox;
    a->self = name ? topo_find(a->topo, name) : topo_first(a->topo, role);
    if (!a->self || a->self->role != role) {
        LOG_E("%s: no %s instance named '%s' in %s", argv[0], topo_role_name(role),
              name ? name : "(first)", a->topo->source);
        goto fail;
    }
    log_init(a->self->name, -1);

    /* Die with the supervisor when it started us locally (remote children rely on the orphan
     * timeout in the loop instead). */
    if (getenv("TROUPE_SUPERVISED")) {
        s_sup_pid = getppid();
        prctl(PR_SET_PDEATHSIG, SIGTERM);
    }
    struct sigaction sa = {.sa_handler = s_on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    a->sendbuf = malloc(SEND_BUF);
    a->ctx = zmq_ctx_new();
    if (!a->sendbuf || !a->ctx)
        goto fail;
    if (a->topo->security.curve_server_public[0] && s_curve_setup(a) != 0)
        goto fail;
    const int ipc_inbox = strncmp(a->self->inbox_bind, "ipc://", 6) == 0;
    a->inbox = s_router(a, a->self->inbox_bind,
                        ipc_inbox ? "our inbox, in endpoints.run_dir" : "our inbox, from endpoints.base_port", 0);
    if (!a->inbox) {
        /* The line above says why; restarting cannot cure it (actor_bind): the supervisor stops
         * the cluster instead. */
        actor_destroy(&a);
        exit(ACTOR_EXIT_CONFIG);
    }
    if (getenv("TROUPE_SUPERVISED")) {
        a->control = s_dealer(a, a->topo->endpoints.control, a->self->name, 0, "supervisor");
        if (!a->control || pthread_create(&a->hb_thread, NULL, s_hb_main, a) != 0)
            goto fail;
        a->hb_started = 1;
    }
    a->stats_pub = zmq_socket(a->ctx, ZMQ_PUB);
    actor_sock_defaults(a->stats_pub, &a->topo->limits);
    const topo_instance_t *mon = topo_first(a->topo, ROLE_MONITOR);
    if (a->auth && mon && s_curve_client(a, a->stats_pub, mon->name) != 0)
        goto fail;
    if (zmq_connect(a->stats_pub, a->topo->endpoints.stats) != 0) {
        LOG_E("connect stats %s: %s", a->topo->endpoints.stats, zmq_strerror(errno));
        goto fail;
    }
    a->next_stats_ms = now_ms() + 200;   /* first stats soon after start */
    return a;
fail:
    actor_destroy(&a);
    return NULL;
}

void actor_destroy(actor_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    actor_t *a = *self_p;
    for (int i = 0; i < a->n_peers; i++) {
        peer_t *p = &a->peers[i];
        s_fifo_free(&p->q);
        if (p->mon) {
            zmq_socket_monitor(p->sock, NULL, 0);
            zmq_close(p->mon);
        }
        zmq_close(p->sock);
    }
    for (int i = 0; i < a->n_backlogs; i++)
        s_fifo_free(&a->backlogs[i].q);
    free(a->backlogs);
    for (int i = 0; i < a->n_extra; i++)
        zmq_close(a->extra[i]);
    for (int i = 0; i < a->n_polled; i++)
        zmq_close(a->polled[i]);
    if (a->inbox)
        zmq_close(a->inbox);
    if (a->hb_started) {
        atomic_store(&a->hb_stop, 1);
        pthread_join(a->hb_thread, NULL);
    }
    if (a->control)
        zmq_close(a->control);
    if (a->stats_pub)
        zmq_close(a->stats_pub);
    auth_destroy(&a->auth);   /* before the context: its socket is one of the context's */
    if (a->ctx)
        zmq_ctx_term(a->ctx);   /* bounded: every socket has a short linger */
    topo_destroy(&a->topo);
    free(a->sendbuf);
    free(a);
    *self_p = NULL;
}

const topo_t *actor_topo(const actor_t *a) { return a->topo; }
const topo_instance_t *actor_self(const actor_t *a) { return a->self; }
void *actor_zmq_ctx(actor_t *a) { return a->ctx; }
int actor_draining(const actor_t *a) { return a->draining; }
uint64_t actor_restarts(const actor_t *a) { return a->restarts; }
