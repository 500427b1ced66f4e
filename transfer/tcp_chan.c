/* transfer/tcp_chan.c — the network channel (tcp_chan.h): a serving thread on the sender, a
 * deadline-bounded fetch on the receiver. */
#include "transfer/tcp_chan.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/util.h"
#include "transfer/le64.h"

#define STAGED_MAX   256            /* transfers a sender holds at once (hand-offs in flight) */
#define CLIENT_PEERS 32             /* senders a receiver keeps a socket to */
#define SERVE_POLL_MS 50            /* how often the serving thread looks at its stop flag */
#define Z85_KEY 40                  /* a CURVE key in Z85, without its NUL */
#define RECEIVER_MAX 64             /* a receiver's name (the ZAP handler's User-Id) */
#define ST_FOUND   0
#define ST_UNKNOWN 1
#define ST_REFUSED 2

typedef struct staged {
    uint64_t id;
    uint8_t *buf;                   /* NULL: free slot */
    size_t n;
    char receiver[RECEIVER_MAX];    /* "" = anyone may fetch it */
} staged_t;

struct tcpchan_server {
    void *sock;                     /* ROUTER; touched by the serving thread only once it runs */
    char endpoint[TCPCHAN_ENDPOINT_MAX];
    pthread_t thread;
    pthread_mutex_t lock;           /* guards staged[], stop, served */
    staged_t staged[STAGED_MAX];
    int stop;
    uint64_t served, refused;
};

static void s_header(uint8_t h[TCPCHAN_HEADER_BYTES], uint64_t id, uint32_t status, uint64_t n)
{
    le64_put(h, id);
    for (int i = 0; i < 4; i++)
        h[8 + i] = (uint8_t)(status >> (8 * i));
    le64_put(h + 12, n);
}

/* Drops the rest of a multipart message. */
static void s_drain(void *sock)
{
    int more = 1;
    size_t len = sizeof more;
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, sock, ZMQ_DONTWAIT);
        zmq_msg_close(&m);
        len = sizeof more;
    }
}

/* One request: [routing id][transfer id] -> [routing id][header][bytes]. The lock is held across
 * the send: zmq_send copies the bytes before it returns, so a tcpchan_drop cannot free them under it. */
static void s_serve_one(tcpchan_server_t *s)
{
    uint8_t rid[256], req[8];
    char user[RECEIVER_MAX] = "";
    int rl = zmq_recv(s->sock, rid, sizeof rid, ZMQ_DONTWAIT);
    if (rl < 0)
        return;
    int more = 0;
    size_t len = sizeof more;
    zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &len);
    int ql = -1;
    if (more) {
        /* A message, to read the name the ZAP handler gave the peer's key (CURVE only). */
        zmq_msg_t q;
        zmq_msg_init(&q);
        if (zmq_msg_recv(&q, s->sock, ZMQ_DONTWAIT) >= 0) {
            ql = (int)zmq_msg_size(&q);
            if (ql == (int)sizeof req)
                memcpy(req, zmq_msg_data(&q), sizeof req);
            const char *uid = zmq_msg_gets(&q, "User-Id");
            if (uid)
                snprintf(user, sizeof user, "%s", uid);
        }
        zmq_msg_close(&q);
    }
    s_drain(s->sock);
    if (rl > (int)sizeof rid || ql != (int)sizeof req)
        return;   /* not a request of ours: nothing to answer */
    uint64_t id = le64_get(req);
    pthread_mutex_lock(&s->lock);
    const staged_t *t = NULL;
    for (int i = 0; i < STAGED_MAX && !t; i++)
        if (s->staged[i].buf && s->staged[i].id == id)
            t = &s->staged[i];
    uint32_t status = t ? ST_FOUND : ST_UNKNOWN;
    if (t && t->receiver[0] && strcmp(t->receiver, user) != 0) {
        status = ST_REFUSED;   /* staged for another receiver: that key is not this one */
        t = NULL;
        s->refused++;
    }
    uint8_t h[TCPCHAN_HEADER_BYTES];
    s_header(h, id, status, t ? t->n : 0);
    if (zmq_send(s->sock, rid, (size_t)rl, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) {
        if (zmq_send(s->sock, h, sizeof h, (t ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) >= 0 && t)
            zmq_send(s->sock, t->buf, t->n, ZMQ_DONTWAIT);
    }
    s->served++;
    pthread_mutex_unlock(&s->lock);
}

static void *s_serve(void *arg)
{
    tcpchan_server_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        int stop = s->stop;
        pthread_mutex_unlock(&s->lock);
        if (stop)
            break;
        zmq_pollitem_t it = {.socket = s->sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, SERVE_POLL_MS) > 0 && (it.revents & ZMQ_POLLIN))
            s_serve_one(s);
    }
    return NULL;
}

tcpchan_server_t *tcpchan_server_new(void *zmq_ctx, const char *host, char *err, size_t errlen)
{
    return tcpchan_server_new_curve(zmq_ctx, host, NULL, err, errlen);
}

/* A CURVE server with our secret key, whose peers the process's ZAP handler admits (domain
 * "cluster"). */
static int s_curve_server(void *sock, const char *secret_z85)
{
    int one = 1;
    return zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
                   zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, secret_z85, Z85_KEY + 1) != 0 ||
                   zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "cluster", strlen("cluster")) != 0
               ? -1
               : 0;
}

tcpchan_server_t *tcpchan_server_new_curve(void *zmq_ctx, const char *host, const char *secret_z85, char *err,
                                           size_t errlen)
{
    if (secret_z85 && strlen(secret_z85) != Z85_KEY)
        return errf(err, errlen, "tcp channel: our CURVE secret key is not %d Z85 characters", Z85_KEY), NULL;
    tcpchan_server_t *s = calloc(1, sizeof *s);
    if (!s)
        return errf(err, errlen, "out of memory"), NULL;
    char bind[TCPCHAN_ENDPOINT_MAX];
    snprintf(bind, sizeof bind, "tcp://%s:*", host);
    int linger = 0;
    size_t len = sizeof s->endpoint;
    if (!(s->sock = zmq_socket(zmq_ctx, ZMQ_ROUTER)) || zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        (secret_z85 && s_curve_server(s->sock, secret_z85) != 0) ||
        zmq_bind(s->sock, bind) != 0 || zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, s->endpoint, &len) != 0) {
        errf(err, errlen, "tcp channel: cannot bind %s: %s", bind, zmq_strerror(zmq_errno()));
        if (s->sock)
            zmq_close(s->sock);
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    if (pthread_create(&s->thread, NULL, s_serve, s) != 0) {
        errf(err, errlen, "tcp channel: cannot start its thread");
        pthread_mutex_destroy(&s->lock);
        zmq_close(s->sock);
        free(s);
        return NULL;
    }
    return s;
}

void tcpchan_server_destroy(tcpchan_server_t **self_p)
{
    tcpchan_server_t *s = self_p ? *self_p : NULL;
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    zmq_close(s->sock);
    for (int i = 0; i < STAGED_MAX; i++)
        free(s->staged[i].buf);
    pthread_mutex_destroy(&s->lock);
    free(s);
    *self_p = NULL;
}

const char *tcpchan_server_endpoint(const tcpchan_server_t *s) { return s->endpoint; }

int tcpchan_put(tcpchan_server_t *s, uint64_t id, uint8_t **buf_p, size_t n)
{
    return tcpchan_put_for(s, id, buf_p, n, NULL);
}

int tcpchan_put_for(tcpchan_server_t *s, uint64_t id, uint8_t **buf_p, size_t n, const char *receiver)
{
    if (receiver && strlen(receiver) >= RECEIVER_MAX) {
        free(*buf_p);
        *buf_p = NULL;
        return -1;
    }
    pthread_mutex_lock(&s->lock);
    staged_t *slot = NULL;
    int dup = 0;
    for (int i = 0; i < STAGED_MAX; i++) {
        dup |= s->staged[i].buf && s->staged[i].id == id;
        if (!slot && !s->staged[i].buf)
            slot = &s->staged[i];
    }
    if (slot && !dup) {
        *slot = (staged_t){.id = id, .buf = *buf_p, .n = n};
        if (receiver)
            snprintf(slot->receiver, sizeof slot->receiver, "%s", receiver);
    }
    pthread_mutex_unlock(&s->lock);
    if (!slot || dup)
        free(*buf_p);
    *buf_p = NULL;
    return slot && !dup ? 0 : -1;
}

void tcpchan_drop(tcpchan_server_t *s, uint64_t id)
{
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < STAGED_MAX; i++)
        if (s->staged[i].buf && s->staged[i].id == id) {
            free(s->staged[i].buf);
            s->staged[i] = (staged_t){0};
        }
    pthread_mutex_unlock(&s->lock);
}

int tcpchan_staged(tcpchan_server_t *s)
{
    int n = 0;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < STAGED_MAX; i++)
        n += s->staged[i].buf != NULL;
    pthread_mutex_unlock(&s->lock);
    return n;
}

uint64_t tcpchan_served(tcpchan_server_t *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t n = s->served;
    pthread_mutex_unlock(&s->lock);
    return n;
}

uint64_t tcpchan_refused(tcpchan_server_t *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t n = s->refused;
    pthread_mutex_unlock(&s->lock);
    return n;
}

/* ---- receiver ---------------------------------------------------------------------------- */

typedef struct peer {
    char endpoint[TCPCHAN_ENDPOINT_MAX];   /* "" = free */
    char server_key[Z85_KEY + 1];          /* the sender's CURVE key; "" = plaintext */
    void *sock;                            /* DEALER connected to it */
    void *mon;                             /* PAIR: its socket-monitor events */
    int connected, handshaken;             /* seen on the monitor */
} peer_t;

struct tcpchan_client {
    void *ctx;
    int64_t max_bytes;
    char pub[Z85_KEY + 1], sec[Z85_KEY + 1];   /* our CURVE keypair; "" = none */
    peer_t peers[CLIENT_PEERS];
    int next_evict;
};

static _Atomic unsigned s_monitors;   /* names the monitors' inproc endpoints */

tcpchan_client_t *tcpchan_client_new(void *zmq_ctx, int64_t max_bytes)
{
    tcpchan_client_t *c = calloc(1, sizeof *c);
    if (c) {
        c->ctx = zmq_ctx;
        c->max_bytes = max_bytes;
    }
    return c;
}

int tcpchan_client_curve(tcpchan_client_t *c, const char *public_z85, const char *secret_z85)
{
    if (!public_z85 || !secret_z85 || strlen(public_z85) != Z85_KEY || strlen(secret_z85) != Z85_KEY)
        return -1;
    memcpy(c->pub, public_z85, Z85_KEY + 1);
    memcpy(c->sec, secret_z85, Z85_KEY + 1);
    return 0;
}

static void s_peer_close(peer_t *p)
{
    /* The monitor is stopped first, from this thread: the socket's close is finished later by
     * libzmq's own threads, whose events sent to a monitor nobody reads any more would block them. */
    if (p->sock && p->mon)
        zmq_socket_monitor(p->sock, NULL, 0);
    if (p->sock)
        zmq_close(p->sock);
    if (p->mon)
        zmq_close(p->mon);
    memset(p, 0, sizeof *p);
}

void tcpchan_client_destroy(tcpchan_client_t **self_p)
{
    tcpchan_client_t *c = self_p ? *self_p : NULL;
    if (!c)
        return;
    for (int i = 0; i < CLIENT_PEERS; i++)
        s_peer_close(&c->peers[i]);
    free(c);
    *self_p = NULL;
}

int tcpchan_endpoint_check(const char *ep, const char *host, char *err, size_t errlen)
{
    size_t n = strnlen(ep, TCPCHAN_ENDPOINT_MAX);
    const char *colon = n < TCPCHAN_ENDPOINT_MAX ? strrchr(ep, ':') : NULL;
    if (n >= TCPCHAN_ENDPOINT_MAX || strncmp(ep, "tcp://", 6) != 0 || !colon || colon <= ep + 6 || !colon[1])
        return errf(err, errlen, "tcp endpoint \"%.64s\" is not tcp://<host>:<port>", ep);
    for (const char *p = ep + 6; p < colon; p++)
        if (*p <= ' ' || *p > '~' || *p == '*')
            return errf(err, errlen, "tcp endpoint \"%.64s\": its host is not a plain address", ep);
    for (const char *p = colon + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return errf(err, errlen, "tcp endpoint \"%.64s\": its port is not a number", ep);
    if (host && ((size_t)(colon - ep - 6) != strlen(host) || strncmp(ep + 6, host, strlen(host)) != 0))
        return errf(err, errlen, "tcp endpoint %s is not on the sender's node (%s)", ep, host);
    return 0;
}

/* The monitor of a peer's socket: its connection, handshake and disconnection, so a refused key or
 * a connection cut by a frame that fails CURVE's authentication ends a fetch at once. */
static int s_monitor(tcpchan_client_t *c, peer_t *p)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://tcpchan-mon-%u", atomic_fetch_add(&s_monitors, 1));
    const int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    int linger = 0;
    if (zmq_socket_monitor(p->sock, ep, events) != 0 || !(p->mon = zmq_socket(c->ctx, ZMQ_PAIR)))
        return -1;
    zmq_setsockopt(p->mon, ZMQ_LINGER, &linger, sizeof linger);
    return zmq_connect(p->mon, ep);
}

static peer_t *s_peer(tcpchan_client_t *c, const char *ep, const char *server_key, char *err, size_t errlen)
{
    const char *key = server_key ? server_key : "";
    for (int i = 0; i < CLIENT_PEERS; i++)
        if (c->peers[i].sock && strcmp(c->peers[i].endpoint, ep) == 0 && strcmp(c->peers[i].server_key, key) == 0)
            return &c->peers[i];
    if (server_key && (!c->pub[0] || strlen(server_key) != Z85_KEY))
        return errf(err, errlen, "tcp channel: a CURVE fetch from %s needs our keypair and the sender's 40-character key",
                    ep), NULL;
    peer_t *p = NULL;
    for (int i = 0; i < CLIENT_PEERS && !p; i++)
        if (!c->peers[i].sock)
            p = &c->peers[i];
    if (!p) {
        p = &c->peers[c->next_evict];
        c->next_evict = (c->next_evict + 1) % CLIENT_PEERS;
        s_peer_close(p);
    }
    int linger = 0;
    int64_t maxmsg = c->max_bytes > 0 ? c->max_bytes + 64 : -1;
    if (!(p->sock = zmq_socket(c->ctx, ZMQ_DEALER)) || zmq_setsockopt(p->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(p->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0 ||
        (server_key && (zmq_setsockopt(p->sock, ZMQ_CURVE_SERVERKEY, server_key, Z85_KEY + 1) != 0 ||
                        zmq_setsockopt(p->sock, ZMQ_CURVE_PUBLICKEY, c->pub, Z85_KEY + 1) != 0 ||
                        zmq_setsockopt(p->sock, ZMQ_CURVE_SECRETKEY, c->sec, Z85_KEY + 1) != 0)) ||
        s_monitor(c, p) != 0 || zmq_connect(p->sock, ep) != 0) {
        errf(err, errlen, "tcp channel: cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
        s_peer_close(p);
        return NULL;
    }
    snprintf(p->endpoint, sizeof p->endpoint, "%s", ep);
    snprintf(p->server_key, sizeof p->server_key, "%s", key);
    return p;
}

/* Reads the monitor's waiting events. `live`: inside a fetch, where a refused or failed handshake
 * or a lost connection ends it: -1 with why then. Outside (live = 0) only the state is kept. */
static int s_events(peer_t *p, int live, uint64_t id, char *err, size_t errlen)
{
    for (;;) {
        uint8_t ev[6];
        char where[256];
        if (zmq_recv(p->mon, ev, sizeof ev, ZMQ_DONTWAIT) < 0)
            return 0;
        zmq_recv(p->mon, where, sizeof where, ZMQ_DONTWAIT);
        uint16_t e = (uint16_t)(ev[0] | ev[1] << 8);
        uint32_t v = (uint32_t)ev[2] | (uint32_t)ev[3] << 8 | (uint32_t)ev[4] << 16 | (uint32_t)ev[5] << 24;
        const int curve = p->server_key[0] != 0, was_handshaken = p->handshaken;
        if (e == ZMQ_EVENT_CONNECTED)
            p->connected = 1;
        if (e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            p->handshaken = 1;
        if (e == ZMQ_EVENT_DISCONNECTED)
            p->connected = p->handshaken = 0;
        if (!live || e == ZMQ_EVENT_CONNECTED || e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            continue;
        if (e == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            return errf(err, errlen, "tcp transfer %llx: %s refused our CURVE key (ZAP status %u): not a key of this "
                        "cluster's actors", (unsigned long long)id, p->endpoint, v);
        if (e == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && v == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC && was_handshaken)
            return errf(err, errlen, "tcp transfer %llx from %s: a frame failed CURVE's authentication (tampered with "
                        "or corrupted on the way): connection dropped, nothing taken", (unsigned long long)id,
                        p->endpoint);
        if (e == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || e == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
            (e == ZMQ_EVENT_DISCONNECTED && curve && !was_handshaken))
            return errf(err, errlen, "tcp transfer %llx: the %s handshake with %s failed (%s): %s", (unsigned long long)id,
                        curve ? "CURVE" : "plaintext", p->endpoint,
                        e == ZMQ_EVENT_DISCONNECTED ? "it closed the connection" : "a protocol error",
                        curve ? "the peer there does not hold the sender's key, or refused ours"
                              : "the sender speaks CURVE and we have no key for it");
        if (e == ZMQ_EVENT_DISCONNECTED)
            return errf(err, errlen, "tcp transfer %llx from %s: the connection was cut mid-transfer (the sender is "
                        "gone or stalled%s)", (unsigned long long)id, p->endpoint,
                        curve ? ", or a frame failed CURVE's authentication" : "");
    }
}

int tcpchan_fetch(tcpchan_client_t *c, const char *ep, uint64_t id, void *dst, size_t n, int64_t deadline_ms,
                  char *err, size_t errlen)
{
    return tcpchan_fetch_from(c, ep, NULL, id, dst, n, deadline_ms, err, errlen);
}

int tcpchan_fetch_from(tcpchan_client_t *c, const char *ep, const char *server_key, uint64_t id, void *dst, size_t n,
                       int64_t deadline_ms, char *err, size_t errlen)
{
    if (tcpchan_endpoint_check(ep, NULL, err, errlen) != 0)
        return -1;
    peer_t *p = s_peer(c, ep, server_key, err, errlen);
    if (!p)
        return -1;
    s_events(p, 0, id, err, errlen);   /* what happened between fetches is old news */
    uint8_t req[8];
    le64_put(req, id);
    const int64_t t0 = now_ms();
    if (zmq_send(p->sock, req, sizeof req, ZMQ_DONTWAIT) != (int)sizeof req) {
        errf(err, errlen, "tcp transfer %llx: the request to %s could not be queued: %s", (unsigned long long)id, ep,
             zmq_strerror(zmq_errno()));
        goto out;
    }
    for (;;) {
        int64_t left = deadline_ms - now_ms();
        zmq_pollitem_t it[2] = {{.socket = p->sock, .events = ZMQ_POLLIN}, {.socket = p->mon, .events = ZMQ_POLLIN}};
        int pr = left > 0 ? zmq_poll(it, 2, (long)left) : 0;
        if (pr > 0 && (it[1].revents & ZMQ_POLLIN) && !(it[0].revents & ZMQ_POLLIN)) {
            if (s_events(p, 1, id, err, errlen) != 0)
                goto out;
            continue;
        }
        if (pr <= 0 || !(it[0].revents & ZMQ_POLLIN)) {
            if (deadline_ms - now_ms() > 0)
                continue;   /* a signal woke the poll early */
            errf(err, errlen, "tcp transfer %llx (%zu bytes) from %s: no reply in %lld ms (the sender is gone or "
                 "stalled)", (unsigned long long)id, n, ep, (long long)(now_ms() - t0));
            goto out;
        }
        uint8_t h[TCPCHAN_HEADER_BYTES];
        int hl = zmq_recv(p->sock, h, sizeof h, ZMQ_DONTWAIT);
        if (hl < 0)
            continue;
        int more = 0;
        size_t len = sizeof more;
        zmq_getsockopt(p->sock, ZMQ_RCVMORE, &more, &len);
        if (hl != TCPCHAN_HEADER_BYTES || le64_get(h) != id) {
            s_drain(p->sock);   /* a late reply to a request we gave up on: not ours */
            continue;
        }
        uint32_t status = (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
        uint64_t bytes = le64_get(h + 12);
        if (status == ST_REFUSED) {
            s_drain(p->sock);
            errf(err, errlen, "tcp transfer %llx: %s refused it to us: it is staged for another receiver's key",
                 (unsigned long long)id, ep);
            goto out;
        }
        if (status != ST_FOUND || !more) {
            s_drain(p->sock);
            errf(err, errlen, "tcp transfer %llx: %s no longer holds it (past its deadline?)", (unsigned long long)id, ep);
            goto out;
        }
        if (bytes != n) {
            s_drain(p->sock);
            errf(err, errlen, "tcp transfer %llx from %s: %llu bytes, %zu announced", (unsigned long long)id, ep,
                 (unsigned long long)bytes, n);
            goto out;
        }
        zmq_msg_t body;   /* a message, not zmq_recv: its int return cannot say more than 2 GiB */
        zmq_msg_init(&body);
        int ok = zmq_msg_recv(&body, p->sock, ZMQ_DONTWAIT) >= 0 && zmq_msg_size(&body) == n;
        size_t got = ok ? n : zmq_msg_size(&body);
        if (ok)
            memcpy(dst, zmq_msg_data(&body), n);
        zmq_msg_close(&body);
        s_drain(p->sock);
        if (!ok) {
            errf(err, errlen, "tcp transfer %llx from %s: %zu bytes arrived, %zu announced", (unsigned long long)id, ep,
                 got, n);
            goto out;
        }
        return 0;
    }
out:
    s_peer_close(p);   /* whatever it may still deliver belongs to a transfer we gave up on */
    return -1;
}
