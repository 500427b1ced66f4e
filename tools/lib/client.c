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

struct client {
    void *ctx;
    void *sock;          /* DEALER */
    void *mon;           /* PAIR: the socket monitor's events for sock (disconnections) */
    uint8_t *buf;        /* [MSG_MAX_FRAME] encode scratch */
    uint64_t next_id;
    int64_t max_frame;   /* the cluster's frame limit: larger requests are refused before sending */
    u64map_t inflight;   /* ids sent and not yet ended (no done / error / inspect_reply received) */
    u64map_t lost;       /* ids ended by a synthesized error: a late reply for one is dropped */
    uint64_t *pending;   /* [n_pending] lost ids whose synthesized error client_recv has yet to return */
    size_t n_pending, cap_pending;
    int connected;       /* a connection completed its handshake and has not dropped since */
    int dropped;         /* that connection dropped: fail the in-flight requests once sock is drained */
    uint64_t n_requests_lost, n_connections_lost;
    char lost_msg[320];  /* the synthesized error's message */
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

client_t *client_connect_opts(const char *endpoint, const client_opts_t *opts, char *err, size_t errlen)
{
    client_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->max_frame = opts && opts->max_frame > 0 && opts->max_frame < MSG_MAX_FRAME ? opts->max_frame : MSG_MAX_FRAME;
    c->ctx = zmq_ctx_new();
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    c->buf = malloc(MSG_MAX_FRAME);
    if (!c->ctx || !c->sock || !c->buf || u64map_init(&c->inflight, 64) != 0 || u64map_init(&c->lost, 64) != 0) {
        errf(err, errlen, "client: out of memory or sockets (%s)", zmq_strerror(errno));
        client_destroy(&c);
        return NULL;
    }
    int linger = 100, hs = 5000;
    int64_t maxmsg = MSG_MAX_FRAME;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(c->sock, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
    /* Heartbeats: a router that is gone without closing the connection (stopped, wedged, a host
     * or network gone) is noticed after the timeout. The TTL asks the router's side to drop our
     * connection likewise when it stops hearing from us. */
    int ivl = opts && opts->heartbeat_ivl_ms ? opts->heartbeat_ivl_ms : CLIENT_HEARTBEAT_IVL_MS;
    int hb_to = opts && opts->heartbeat_timeout_ms > 0 ? opts->heartbeat_timeout_ms : CLIENT_HEARTBEAT_TIMEOUT_MS;
    if (ivl > 0) {
        int ttl = hb_to < 6553500 ? hb_to : 6553500;   /* ZMTP carries it in deciseconds, 16 bits */
        if (zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
            zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to) != 0 ||
            zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TTL, &ttl, sizeof ttl) != 0) {
            errf(err, errlen, "client: heartbeat options (ivl %d ms, timeout %d ms): %s", ivl, hb_to,
                 zmq_strerror(errno));
            client_destroy(&c);
            return NULL;
        }
        snprintf(c->lost_msg, sizeof c->lost_msg, "the connection to the router at %s was lost (closed, or no "
                 "heartbeat answered for %d ms): the request's outcome is unknown; retry it", endpoint, hb_to);
    } else {
        snprintf(c->lost_msg, sizeof c->lost_msg, "the connection to the router at %s was lost: the request's "
                 "outcome is unknown; retry it", endpoint);
    }
    /* Our own connection's losses (a closed connection, a heartbeat timeout): one context per
     * client, so the inproc name is ours alone. Only a connection that completed its handshake
     * counts: a refused handshake (a wrong or missing CURVE key) delivered nothing, and its
     * requests stay queued for a connection that may yet succeed, as before. */
    if (zmq_socket_monitor(c->sock, "inproc://client-monitor", ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) != 0 ||
        !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || zmq_setsockopt(c->mon, ZMQ_LINGER, &(int){0}, sizeof(int)) != 0 ||
        zmq_connect(c->mon, "inproc://client-monitor") != 0) {
        errf(err, errlen, "client: socket monitor: %s", zmq_strerror(errno));
        client_destroy(&c);
        return NULL;
    }
    if (opts && opts->server_key && *opts->server_key && s_curve(c->sock, opts, err, errlen) != 0) {
        client_destroy(&c);
        return NULL;
    }
    if (zmq_connect(c->sock, endpoint) != 0) {
        errf(err, errlen, "connect %s: %s", endpoint, zmq_strerror(errno));
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

void client_destroy(client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    client_t *c = *self_p;
    if (c->mon) {
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->mon);
    }
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    u64map_free(&c->inflight);
    u64map_free(&c->lost);
    free(c->pending);
    free(c->buf);
    free(c);
    *self_p = NULL;
}

int client_send(client_t *c, msg_t *m, uint64_t *id_out, char *err, size_t errlen)
{
    if (m->id == 0)
        m->id = ++c->next_id;
    size_t len;
    if (msg_encode(m, c->buf, MSG_MAX_FRAME, &len, err, errlen) != 0)
        return -1;
    if ((int64_t)len > c->max_frame)   /* the cluster would refuse it: say so without sending */
        return errf(err, errlen, "a %s of %zu bytes exceeds the cluster's limits.max_message_bytes (%lld)",
                    msg_type_name(m->type), len, (long long)c->max_frame);
    /* A DEALER blocks when no peer is connected; bound it. */
    int to = 5000;
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &to, sizeof to);
    /* In flight before it goes out: a loss seen right after the send must end it too. A cancel
     * is not a request of its own (the request it names gets the terminal reply). */
    if (m->type != MSG_CANCEL && u64map_put(&c->inflight, m->id, 1) != 0)
        return errf(err, errlen, "client: out of memory");
    if (zmq_send(c->sock, c->buf, len, 0) < 0) {
        if (m->type != MSG_CANCEL)
            u64map_del(&c->inflight, m->id);
        return errf(err, errlen, "send: %s (is the cluster running?)", zmq_strerror(errno));
    }
    if (id_out)
        *id_out = m->id;
    return 0;
}

uint64_t client_requests_lost(const client_t *c) { return c->n_requests_lost; }
uint64_t client_connections_lost(const client_t *c) { return c->n_connections_lost; }

/* The connection is gone: every request in flight is lost (the router that held it is dead, or
 * a new connection has another routing id and gets none of its replies). Each gets its error. */
static int s_lose_inflight(client_t *c)
{
    c->dropped = 0;
    c->n_connections_lost++;
    if (c->lost.n + c->inflight.n > CLIENT_MAX_LOST_IDS) {   /* long-past losses: forget their ids */
        u64map_free(&c->lost);
        if (u64map_init(&c->lost, 64) != 0)
            return -1;
    }
    for (size_t i = 0; i < c->inflight.cap; i++) {
        const uint64_t id = c->inflight.keys[i];
        if (!id)
            continue;
        if (c->n_pending == c->cap_pending) {
            size_t cap = c->cap_pending ? 2 * c->cap_pending : 64;
            uint64_t *p = realloc(c->pending, cap * sizeof *p);
            if (!p)
                return -1;
            c->pending = p, c->cap_pending = cap;
        }
        c->pending[c->n_pending++] = id;
        if (u64map_put(&c->lost, id, 1) != 0)
            return -1;
    }
    u64map_free(&c->inflight);
    return u64map_init(&c->inflight, 64);
}

/* The monitor's events (frame 1: u16 event + u32 value, frame 2: the endpoint). */
static void s_read_monitor(client_t *c)
{
    uint8_t ev[6];
    char ep[256];
    while (zmq_recv(c->mon, ev, sizeof ev, ZMQ_DONTWAIT) >= 0) {
        int more = 0;
        size_t sz = sizeof more;
        zmq_getsockopt(c->mon, ZMQ_RCVMORE, &more, &sz);
        if (more)
            zmq_recv(c->mon, ep, sizeof ep, ZMQ_DONTWAIT);
        uint16_t e;
        memcpy(&e, ev, sizeof e);
        if (e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            c->connected = 1;
        else if (e == ZMQ_EVENT_DISCONNECTED && c->connected)
            c->connected = 0, c->dropped = 1;
    }
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
        /* What the router sent before the connection dropped is read first (a done that made it
         * is the request's real outcome); then the requests still in flight are failed. */
        if (c->dropped && !s_readable(c->sock) && s_lose_inflight(c) != 0)
            return errf(err, errlen, "client: out of memory");
        if (c->n_pending) {
            const uint64_t id = c->pending[--c->n_pending];
            msg_init(out, MSG_ERROR, id);
            out->u.error.code = MSG_ERR_UNAVAILABLE;
            out->u.error.retryable = true;
            out->u.error.message = c->lost_msg;
            c->n_requests_lost++;
            return 0;
        }
        zmq_pollitem_t items[2] = {{.socket = c->sock, .events = ZMQ_POLLIN},
                                   {.socket = c->mon, .events = ZMQ_POLLIN}};
        int64_t left = timeout_ms < 0 ? -1 : deadline - now_ms();   /* < 0: no limit */
        int rc = zmq_poll(items, 2, timeout_ms < 0 ? -1 : left > 0 ? (long)left : 0);
        if (rc < 0)
            return errf(err, errlen, "poll: %s", zmq_strerror(errno));
        if (items[1].revents & ZMQ_POLLIN)
            s_read_monitor(c);
        if (!(items[0].revents & ZMQ_POLLIN)) {
            if (c->dropped)
                continue;
            if (timeout_ms >= 0 && left <= 0)
                return 1;
            continue;
        }
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, c->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            if (errno == EAGAIN)
                continue;
            return errf(err, errlen, "recv: %s", zmq_strerror(errno));
        }
        rc = msg_decode(zmq_msg_data(&part), zmq_msg_size(&part), out, err, errlen);
        zmq_msg_close(&part);
        if (rc != 0)
            return -1;
        if (out->id && u64map_get(&c->lost, out->id)) {   /* it already ended here: a late reply */
            msg_free(out);
            continue;
        }
        if (out->type == MSG_DONE || out->type == MSG_ERROR || out->type == MSG_INSPECT_REPLY)
            u64map_del(&c->inflight, out->id);
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
    o->max_frame = t->limits.max_message_bytes;
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
    if (client_ep)
        snprintf(client_ep, cap, "%s", t->endpoints.client);
    if (inspect_ep)
        snprintf(inspect_ep, cap, "%s", t->endpoints.inspect);
    topo_destroy(&t);
    return 0;
}
