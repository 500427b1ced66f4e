#include "tools/lib/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "actors/runtime/auth.h"
#include "common/u64map.h"
#include "common/util.h"
#include "topology/topology.h"

#define CLIENT_MAX_LOST_IDS 65536   /* ids remembered as lost (their late replies dropped), then forgotten */

/* One router's connection. */
typedef struct link {
    void *sock;          /* DEALER to the router's client endpoint */
    void *mon;           /* PAIR: the socket monitor's events for sock (disconnections) */
    int connected;       /* a connection completed its handshake and has not dropped since */
    int ever;            /* some connection completed its handshake (client_wait_connected) */
    int dropped;         /* that connection dropped: its requests move or fail once sock is drained */
    char lost_msg[400];  /* the synthesized error's message, naming this endpoint */
} link_t;

/* A request in flight. */
typedef struct req {
    int link;            /* the router it was last sent to (index into client.links) */
    int replied;         /* something came back for it (a token): it has streamed and cannot move */
    int moves;           /* times resubmitted to another router */
    size_t len;          /* bytes of frame: the request as sent, kept for a resubmission (a submit, */
    uint8_t frame[];     /* with several routers; len 0 otherwise) */
} req_t;

struct client {
    void *ctx;
    link_t links[CLIENT_ROUTERS_MAX];
    int n_links;
    int active;          /* where new requests go: the first router, until its connection is lost */
    uint8_t *buf;        /* [MSG_MAX_FRAME] encode scratch */
    uint64_t next_id;
    int64_t max_frame;   /* the cluster's frame limit: larger requests are refused before sending */
    u64map_t inflight;   /* id -> req_t *: sent and not yet ended (no done / error / inspect_reply received) */
    u64map_t lost;       /* id -> bit mask of the router it was lost with: it ended by a synthesized
                          * error, and a late reply for it is dropped (client_send of it again: moved) */
    u64map_t moved;      /* id -> bit mask of the routers it was moved away from: a router that was only
                          * stopped (SIGSTOP) may resume and stream it after it ended elsewhere */
    uint64_t *pending;   /* [n_pending] lost ids whose synthesized error client_recv has yet to return */
    size_t n_pending, cap_pending;
    const char **pending_msg; /* [cap_pending] the message of each pending error (its link's lost_msg) */
    uint64_t n_requests_lost, n_connections_lost, n_requests_retried;
};

client_t *client_connect(const char *endpoint, char *err, size_t errlen)
{
    client_opts_t o = {.server_key = getenv("TROUPE_CURVE_SERVER_KEY"), .key = getenv("TROUPE_CURVE_KEY")};
    return client_connect_opts(endpoint, &o, err, errlen);
}

/* CURVE client options from the key files named in o. */
static int s_curve(void *sock, const client_opts_t *o, char *err, size_t errlen)
{
    if (!o->key || !*o->key)
        return errf(err, errlen, "the server key is set but not our own keypair (a key prefix: PREFIX.pub and "
                    "PREFIX.key)");
    char pub[1024], sec[1024], server[AUTH_Z85_LEN + 1];
    auth_keypair_t kp;
    snprintf(pub, sizeof pub, "%s.pub", o->key);
    snprintf(sec, sizeof sec, "%s.key", o->key);
    if (auth_key_read(o->server_key, server, err, errlen) != 0 || auth_key_read(pub, kp.pub, err, errlen) != 0 ||
        auth_key_read(sec, kp.sec, err, errlen) != 0)
        return -1;
    if (auth_client(sock, &kp, server) != 0)
        return errf(err, errlen, "CURVE: %s (is libzmq built with CURVE?)", zmq_strerror(errno));
    return 0;
}

/* Link k: a DEALER connected to endpoint, with heartbeats, its socket monitor and CURVE. */
static int s_link_open(client_t *c, int k, const char *endpoint, const client_opts_t *opts, char *err, size_t errlen)
{
    link_t *l = &c->links[k];
    l->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!l->sock)
        return errf(err, errlen, "client: out of sockets (%s)", zmq_strerror(errno));
    int linger = 100, hs = 5000, sndto = 5000;   /* a DEALER blocks when no peer is connected: bounded */
    int64_t maxmsg = MSG_MAX_FRAME;
    zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(l->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(l->sock, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
    zmq_setsockopt(l->sock, ZMQ_SNDTIMEO, &sndto, sizeof sndto);
    /* Heartbeats: a router that is gone without closing the connection (stopped, wedged, a host
     * or network gone) is noticed after the timeout. The TTL asks the router's side to drop our
     * connection likewise when it stops hearing from us. */
    int ivl = opts && opts->heartbeat_ivl_ms ? opts->heartbeat_ivl_ms : CLIENT_HEARTBEAT_IVL_MS;
    int hb_to = opts && opts->heartbeat_timeout_ms > 0 ? opts->heartbeat_timeout_ms : CLIENT_HEARTBEAT_TIMEOUT_MS;
    if (ivl > 0) {
        int ttl = hb_to < 6553500 ? hb_to : 6553500;   /* ZMTP carries it in deciseconds, 16 bits */
        if (zmq_setsockopt(l->sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
            zmq_setsockopt(l->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to) != 0 ||
            zmq_setsockopt(l->sock, ZMQ_HEARTBEAT_TTL, &ttl, sizeof ttl) != 0)
            return errf(err, errlen, "client: heartbeat options (ivl %d ms, timeout %d ms): %s", ivl, hb_to,
                        zmq_strerror(errno));
        snprintf(l->lost_msg, sizeof l->lost_msg, "the connection to the router at %s was lost (closed, or no "
                 "heartbeat answered for %d ms): the request's outcome is unknown; retry it", endpoint, hb_to);
    } else {
        snprintf(l->lost_msg, sizeof l->lost_msg, "the connection to the router at %s was lost: the request's "
                 "outcome is unknown; retry it", endpoint);
    }
    /* Our own connection's losses (a closed connection, a heartbeat timeout): one context per
     * client, so the inproc name is ours alone. Only a connection that completed its handshake
     * counts: a refused handshake (a wrong or missing CURVE key) delivered nothing, and its
     * requests stay queued for a connection that may yet succeed, as before. */
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://client-monitor-%d", k);
    if (zmq_socket_monitor(l->sock, mon, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) != 0 ||
        !(l->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || zmq_setsockopt(l->mon, ZMQ_LINGER, &(int){0}, sizeof(int)) != 0 ||
        zmq_connect(l->mon, mon) != 0)
        return errf(err, errlen, "client: socket monitor: %s", zmq_strerror(errno));
    if (opts && opts->server_key && *opts->server_key && s_curve(l->sock, opts, err, errlen) != 0)
        return -1;
    if (opts && opts->sock_setup && opts->sock_setup(l->sock, opts->sock_setup_arg) != 0)
        return errf(err, errlen, "client: the caller's options for the socket to %s: %s", endpoint, zmq_strerror(errno));
    if (zmq_connect(l->sock, endpoint) != 0)
        return errf(err, errlen, "connect %s: %s", endpoint, zmq_strerror(errno));
    return 0;
}

client_t *client_connect_opts(const char *endpoints, const client_opts_t *opts, char *err, size_t errlen)
{
    client_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->max_frame = opts && opts->max_frame > 0 && opts->max_frame < MSG_MAX_FRAME ? opts->max_frame : MSG_MAX_FRAME;
    c->ctx = zmq_ctx_new();
    c->buf = malloc(MSG_MAX_FRAME);
    if (!c->ctx || !c->buf || u64map_init(&c->inflight, 64) != 0 || u64map_init(&c->lost, 64) != 0 ||
        u64map_init(&c->moved, 64) != 0) {
        errf(err, errlen, "client: out of memory or sockets (%s)", zmq_strerror(errno));
        client_destroy(&c);
        return NULL;
    }
    /* "EP" or "EP1,EP2,...": one link a router. */
    for (const char *p = endpoints; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char ep[TOPO_ENDPOINT_MAX];
        while (n && (*p == ' ' || *p == '\t'))
            p++, n--;
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        if (n == 0 || n >= sizeof ep || c->n_links == CLIENT_ROUTERS_MAX) {
            errf(err, errlen, "client: endpoints '%s': %s", endpoints,
                 n == 0 ? "an empty entry" : n >= sizeof ep ? "an entry too long" : "more than 8 routers");
            client_destroy(&c);
            return NULL;
        }
        memcpy(ep, p, n);
        ep[n] = '\0';
        if (s_link_open(c, c->n_links++, ep, opts, err, errlen) != 0) {
            client_destroy(&c);
            return NULL;
        }
        p = comma ? comma + 1 : p + n;
    }
    if (c->n_links == 0) {
        errf(err, errlen, "client: no endpoint given");
        client_destroy(&c);
        return NULL;
    }
    /* Random starting id so several clients of one router do not collide. */
    FILE *r = fopen("/dev/urandom", "rb");
    if (!r || fread(&c->next_id, sizeof c->next_id, 1, r) != 1)
        c->next_id = (uint64_t)now_ns();
    if (r)
        fclose(r);
    c->next_id &= 0x3fffffffffffffffULL;
    return c;
}

static void s_free_inflight(client_t *c)
{
    for (size_t i = 0; i < c->inflight.cap; i++)
        if (c->inflight.keys[i])
            free((req_t *)(uintptr_t)c->inflight.vals[i]);
    u64map_free(&c->inflight);
}

void client_destroy(client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    client_t *c = *self_p;
    for (int k = 0; k < CLIENT_ROUTERS_MAX; k++) {
        link_t *l = &c->links[k];
        if (l->mon) {
            zmq_socket_monitor(l->sock, NULL, 0);
            zmq_close(l->mon);
        }
        if (l->sock)
            zmq_close(l->sock);
    }
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    s_free_inflight(c);
    u64map_free(&c->lost);
    u64map_free(&c->moved);
    free(c->pending);
    free(c->pending_msg);
    free(c->buf);
    free(c);
    *self_p = NULL;
}

static req_t *s_req(const client_t *c, uint64_t id)
{
    const uint64_t *v = u64map_get(&c->inflight, id);
    return v ? (req_t *)(uintptr_t)*v : NULL;
}

static void s_req_end(client_t *c, uint64_t id)
{
    req_t *q = s_req(c, id);
    if (q) {
        u64map_del(&c->inflight, id);
        free(q);
    }
}

/* The monitors' events (frame 1: u16 event + u32 value, frame 2: the endpoint). */
static void s_read_monitor(link_t *l)
{
    uint8_t ev[6];
    char ep[256];
    while (zmq_recv(l->mon, ev, sizeof ev, ZMQ_DONTWAIT) >= 0) {
        int more = 0;
        size_t sz = sizeof more;
        zmq_getsockopt(l->mon, ZMQ_RCVMORE, &more, &sz);
        if (more)
            zmq_recv(l->mon, ep, sizeof ep, ZMQ_DONTWAIT);
        uint16_t e;
        memcpy(&e, ev, sizeof e);
        if (e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            l->connected = l->ever = 1;
        else if (e == ZMQ_EVENT_DISCONNECTED && l->connected)
            l->connected = 0, l->dropped = 1;
    }
}

/* Another router than `not` whose connection is up, the next in order; -1 if none. */
static int s_other_link(const client_t *c, int not)
{
    for (int k = 1; k < c->n_links; k++) {
        const int j = (not + k) % c->n_links;
        if (c->links[j].connected && !c->links[j].dropped)
            return j;
    }
    return -1;
}

int client_send(client_t *c, msg_t *m, uint64_t *id_out, char *err, size_t errlen)
{
    if (m->id == 0)
        m->id = ++c->next_id;
    size_t len;
    if (msg_encode(m, c->buf, MSG_MAX_FRAME, &len, err, errlen) != 0)
        return -2;
    if ((int64_t)len > c->max_frame) {   /* the cluster would refuse it: say so without sending */
        errf(err, errlen, "a %s of %zu bytes exceeds the cluster's limits.max_message_bytes (%lld)",
             msg_type_name(m->type), len, (long long)c->max_frame);
        return -2;
    }
    /* New requests go off the active router once its connection is seen lost (not while it is
     * still being made: the first router is the one to use while it comes up). */
    for (int k = 0; k < c->n_links; k++)
        s_read_monitor(&c->links[k]);
    if (c->links[c->active].dropped) {
        const int j = s_other_link(c, c->active);
        if (j >= 0)
            c->active = j;
    }
    int k = c->active;
    const req_t *known = s_req(c, m->id);
    req_t *q = NULL;
    if (m->type == MSG_CANCEL) {   /* to the router that has the request; not a request of its own */
        if (known)
            k = known->link;
    } else {
        /* In flight before it goes out: a loss seen right after the send must end it too. A submit
         * is kept for a resubmission where another router may take it. */
        const size_t keep = m->type == MSG_SUBMIT && c->n_links > 1 ? len : 0;
        s_req_end(c, m->id);   /* an id sent again: the new request is the one tracked */
        const uint64_t *lost_at = u64map_get(&c->lost, m->id);
        if (lost_at) {
            /* Sent again after it was lost with its router (the caller restarts it): it is this
             * send's now, and a reply from the router it was lost with (one that only stopped
             * answering) is dropped as a moved request's is. */
            const uint64_t *left = u64map_get(&c->moved, m->id);
            const uint64_t mask = (left ? *left : 0) | *lost_at;
            u64map_del(&c->lost, m->id);
            if (u64map_put(&c->moved, m->id, mask & ~(1ull << k)) != 0)
                return errf(err, errlen, "client: out of memory");
        }
        q = malloc(sizeof *q + keep);
        if (!q || u64map_put(&c->inflight, m->id, (uint64_t)(uintptr_t)q) != 0) {
            free(q);
            return errf(err, errlen, "client: out of memory");
        }
        *q = (req_t){.link = k, .len = keep};
        memcpy(q->frame, c->buf, keep);
    }
    int sent = zmq_send(c->links[k].sock, c->buf, len, 0) >= 0;
    if (!sent && errno == EAGAIN && q) {
        /* That router's connection cannot take it now (full; or, with ZMQ_IMMEDIATE, none is up
         * yet, as while it restarts): the next router whose connection is up takes this one.
         * New requests still try the active router first: a moment's refusal is no loss. */
        const int j = s_other_link(c, k);
        if (j >= 0 && zmq_send(c->links[j].sock, c->buf, len, 0) >= 0)
            sent = 1, q->link = j;
        else
            errno = EAGAIN;
    }
    if (!sent) {
        const int e = errno;
        if (q)
            s_req_end(c, m->id);
        return errf(err, errlen, "send: %s (is the cluster running?)", zmq_strerror(e));
    }
    if (id_out)
        *id_out = m->id;
    return 0;
}

uint64_t client_requests_lost(const client_t *c) { return c->n_requests_lost; }
uint64_t client_connections_lost(const client_t *c) { return c->n_connections_lost; }
uint64_t client_requests_retried(const client_t *c) { return c->n_requests_retried; }

static int s_pend(client_t *c, uint64_t id, int link, const char *msg)
{
    if (c->n_pending == c->cap_pending) {
        size_t cap = c->cap_pending ? 2 * c->cap_pending : 64;
        uint64_t *p = realloc(c->pending, cap * sizeof *p);
        if (p)
            c->pending = p;
        const char **pm = realloc(c->pending_msg, cap * sizeof *pm);
        if (pm)
            c->pending_msg = pm;
        if (!p || !pm)
            return -1;
        c->cap_pending = cap;
    }
    c->pending_msg[c->n_pending] = msg;
    c->pending[c->n_pending++] = id;
    return u64map_put(&c->lost, id, 1ull << link);
}

/* Link k's connection is gone: the requests it carried are lost (the router that held them is
 * dead, or a new connection has another routing id and gets none of their replies). One that has
 * had no reply yet, a submit, goes to another router whose connection is up (at most
 * CLIENT_MAX_RESUBMITS times); every other gets its error. */
static int s_lose_link(client_t *c, int k)
{
    link_t *l = &c->links[k];
    l->dropped = 0;
    c->n_connections_lost++;
    if (c->lost.n + c->inflight.n > CLIENT_MAX_LOST_IDS) {   /* long-past losses: forget their ids */
        u64map_free(&c->lost);
        u64map_free(&c->moved);
        if (u64map_init(&c->lost, 64) != 0 || u64map_init(&c->moved, 64) != 0)
            return -1;
    }
    uint64_t *ids = malloc((c->inflight.n + 1) * sizeof *ids);   /* the map changes as they are handled */
    if (!ids)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < c->inflight.cap; i++)
        if (c->inflight.keys[i] && ((req_t *)(uintptr_t)c->inflight.vals[i])->link == k)
            ids[n++] = c->inflight.keys[i];
    const int to = s_other_link(c, k);
    if (to >= 0 && c->active == k)
        c->active = to;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        req_t *q = s_req(c, ids[i]);
        if (to >= 0 && q->len && !q->replied && q->moves < CLIENT_MAX_RESUBMITS &&
            zmq_send(c->links[to].sock, q->frame, q->len, ZMQ_DONTWAIT) >= 0) {
            /* Moved back to a router it had left, it is that router's again: its replies end it. */
            const uint64_t *left = u64map_get(&c->moved, ids[i]);
            if (u64map_put(&c->moved, ids[i], ((left ? *left : 0) | (1ull << k)) & ~(1ull << to)) != 0) {
                rc = -1;
                break;
            }
            q->link = to;
            q->moves++;
            c->n_requests_retried++;
            continue;
        }
        s_req_end(c, ids[i]);
        rc = s_pend(c, ids[i], k, l->lost_msg);
    }
    free(ids);
    return rc;
}

static int s_readable(void *sock)
{
    int ev = 0;
    size_t sz = sizeof ev;
    return zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &sz) == 0 && (ev & ZMQ_POLLIN);
}

int client_recv(client_t *c, msg_t *out, int timeout_ms, char *err, size_t errlen)
{
    const int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        /* What a router sent before its connection dropped is read first (a done that made it is
         * the request's real outcome); then its requests still in flight move or fail. */
        int dropped = 0;
        for (int k = 0; k < c->n_links; k++) {
            link_t *l = &c->links[k];
            if (l->dropped && !s_readable(l->sock) && s_lose_link(c, k) != 0)
                return errf(err, errlen, "client: out of memory");
            dropped |= l->dropped;
        }
        if (c->n_pending) {
            c->n_pending--;
            msg_init(out, MSG_ERROR, c->pending[c->n_pending]);
            out->u.error.code = MSG_ERR_UNAVAILABLE;
            out->u.error.retryable = true;
            out->u.error.message = c->pending_msg[c->n_pending];
            c->n_requests_lost++;
            return 0;
        }
        zmq_pollitem_t items[2 * CLIENT_ROUTERS_MAX];
        for (int k = 0; k < c->n_links; k++) {
            items[2 * k] = (zmq_pollitem_t){.socket = c->links[k].sock, .events = ZMQ_POLLIN};
            items[2 * k + 1] = (zmq_pollitem_t){.socket = c->links[k].mon, .events = ZMQ_POLLIN};
        }
        int64_t left = timeout_ms < 0 ? -1 : deadline - now_ms();   /* < 0: no limit */
        int rc = zmq_poll(items, 2 * c->n_links, timeout_ms < 0 ? -1 : left > 0 ? (long)left : 0);
        if (rc < 0)
            return errf(err, errlen, "poll: %s", zmq_strerror(errno));
        int from = -1;
        for (int k = 0; k < c->n_links; k++) {
            if (items[2 * k + 1].revents & ZMQ_POLLIN)
                s_read_monitor(&c->links[k]);
            if (from < 0 && (items[2 * k].revents & ZMQ_POLLIN))
                from = k;
        }
        if (from < 0) {
            if (dropped)
                continue;
            if (timeout_ms >= 0 && left <= 0)
                return 1;
            continue;
        }
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, c->links[from].sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            if (errno == EAGAIN)
                continue;
            return errf(err, errlen, "recv: %s", zmq_strerror(errno));
        }
        rc = msg_decode(zmq_msg_data(&part), zmq_msg_size(&part), out, err, errlen);
        zmq_msg_close(&part);
        if (rc != 0)
            return -1;
        const uint64_t *moved = out->id ? u64map_get(&c->moved, out->id) : NULL;
        if ((out->id && u64map_get(&c->lost, out->id)) ||   /* it already ended here: a late reply */
            (moved && (*moved >> from & 1))) {                /* from a router it was moved away from */
            msg_free(out);
            continue;
        }
        req_t *q = out->id ? s_req(c, out->id) : NULL;
        if (q && q->link != from) {   /* from a router the request has left */
            msg_free(out);
            continue;
        }
        if (q)
            q->replied = 1;
        if (out->type == MSG_DONE || out->type == MSG_ERROR || out->type == MSG_INSPECT_REPLY)
            s_req_end(c, out->id);
        return 0;
    }
}

int client_fds(const client_t *c, int *fds, int cap)
{
    int n = 0;
    for (int k = 0; k < c->n_links; k++) {
        void *socks[2] = {c->links[k].sock, c->links[k].mon};
        for (int i = 0; i < 2 && n < cap; i++) {
            size_t sz = sizeof fds[n];
            if (zmq_getsockopt(socks[i], ZMQ_FD, &fds[n], &sz) == 0)
                n++;
        }
    }
    return n;
}

int client_wait_connected(client_t *c, int timeout_ms)
{
    const int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        zmq_pollitem_t items[CLIENT_ROUTERS_MAX];
        for (int k = 0; k < c->n_links; k++) {
            s_read_monitor(&c->links[k]);
            if (c->links[k].ever)
                return 1;
            items[k] = (zmq_pollitem_t){.socket = c->links[k].mon, .events = ZMQ_POLLIN};
        }
        const int64_t left = deadline - now_ms();
        if (left <= 0)
            return 0;
        if (zmq_poll(items, c->n_links, (long)left) < 0 && errno != EINTR)
            return 0;
    }
}

int client_cancel(client_t *c, uint64_t id, char *err, size_t errlen)
{
    msg_t m;
    msg_init(&m, MSG_CANCEL, id);
    return client_send(c, &m, NULL, err, errlen);
}

int client_call(client_t *c, msg_t *req, msg_t *reply, int timeout_ms, char *err, size_t errlen)
{
    uint64_t id;
    if (client_send(c, req, &id, err, errlen) != 0)
        return -1;
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return errf(err, errlen, "no reply within %d ms", timeout_ms);
        int rc = client_recv(c, reply, (int)left, err, errlen);
        if (rc < 0)
            return -1;
        if (rc == 1)
            continue;
        if (reply->id == id)
            return 0;
        msg_free(reply);
    }
}

int64_t client_parse_duration_s(const char *s)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0)
        return -1;
    long long mul = 1;
    if (*end) {
        switch (*end) {
        case 's': mul = 1; break;
        case 'm': mul = 60; break;
        case 'h': mul = 3600; break;
        case 'd': mul = 86400; break;
        default: return -1;
        }
        if (end[1])
            return -1;
    }
    if (v > INT32_MAX / mul)
        return -1;
    return v * mul;
}

/* The topology file (NULL = the embedded default), or NULL with its first problem in err. */
static topo_t *s_topology(const char *path, char *err, size_t errlen)
{
    topo_t *t = NULL;
    topo_errors_t *e = calloc(1, sizeof *e);
    if (!e)
        return errf(err, errlen, "out of memory"), NULL;
    if ((path ? topo_load_file(path, &t, e) : topo_load_default(&t, e)) != 0)
        errf(err, errlen, "%s", e->count ? e->msg[0] : "invalid topology");
    free(e);
    return t;
}

int client_opts_from_topology(const char *path, client_opts_t *o, char *server_key, size_t cap, char *err,
                              size_t errlen)
{
    topo_t *t = s_topology(path, err, errlen);
    if (!t)
        return -1;
    client_opts_from_topo(t, o);
    snprintf(server_key, cap, "%s", t->security.curve_server_public);
    o->server_key = server_key[0] ? server_key : o->server_key;
    topo_destroy(&t);
    return 0;
}

int client_endpoints_from_topology(const char *path, char *client_ep, char *inspect_ep, size_t cap,
                                   char *err, size_t errlen)
{
    topo_t *t = s_topology(path, err, errlen);
    if (!t)
        return -1;
    if (client_ep && client_endpoints_of_topo(t, client_ep, cap, err, errlen) != 0) {
        topo_destroy(&t);
        return -1;
    }
    if (inspect_ep)
        snprintf(inspect_ep, cap, "%s", t->endpoints.inspect);
    topo_destroy(&t);
    return 0;
}

void client_opts_from_topo(const topo_t *t, client_opts_t *o)
{
    o->max_frame = t->limits.max_message_bytes;
    if (!o->heartbeat_ivl_ms)   /* the caller's own choice stands */
        o->heartbeat_ivl_ms = t->supervision.client_heartbeat_ms;
    if (!o->heartbeat_timeout_ms)
        o->heartbeat_timeout_ms = t->supervision.client_heartbeat_timeout_ms;
}

int client_endpoints_of_topo(const topo_t *t, char *client_ep, size_t cap, char *err, size_t errlen)
{
    /* every router's, comma-separated: the client fails over between them */
    size_t used = 0;
    if (cap == 0)
        return errf(err, errlen, "no room for the topology's client endpoints");
    client_ep[0] = '\0';
    for (int i = 0; i < t->endpoints.n_clients; i++) {
        int w = snprintf(client_ep + used, cap - used, "%s%s", i ? "," : "", t->endpoints.clients[i]);
        if (w < 0 || (size_t)w >= cap - used)
            return errf(err, errlen, "the topology's client endpoints do not fit in %zu bytes", cap);
        used += (size_t)w;
    }
    return 0;
}
