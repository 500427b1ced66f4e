/* transfer/tcp_chan.c — the network channel (tcp_chan.h): a serving thread on the sender, a
 * deadline-bounded fetch on the receiver. */
#include "transfer/tcp_chan.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/util.h"
#include "transfer/le64.h"

#define STAGED_MAX   256            /* transfers a sender holds at once (hand-offs in flight) */
#define CLIENT_PEERS 32             /* senders a receiver keeps a socket to */
#define SERVE_POLL_MS 50            /* how often the serving thread looks at its stop flag */

typedef struct staged {
    uint64_t id;
    uint8_t *buf;                   /* NULL: free slot */
    size_t n;
} staged_t;

struct tcpchan_server {
    void *sock;                     /* ROUTER; touched by the serving thread only once it runs */
    char endpoint[TCPCHAN_ENDPOINT_MAX];
    pthread_t thread;
    pthread_mutex_t lock;           /* guards staged[], stop, served */
    staged_t staged[STAGED_MAX];
    int stop;
    uint64_t served;
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
    uint8_t rid[256], req[16];
    int rl = zmq_recv(s->sock, rid, sizeof rid, ZMQ_DONTWAIT);
    if (rl < 0)
        return;
    int more = 0;
    size_t len = sizeof more;
    zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &len);
    int ql = more ? zmq_recv(s->sock, req, sizeof req, ZMQ_DONTWAIT) : -1;
    s_drain(s->sock);
    if (rl > (int)sizeof rid || ql != 8)
        return;   /* not a request of ours: nothing to answer */
    uint64_t id = le64_get(req);
    pthread_mutex_lock(&s->lock);
    const staged_t *t = NULL;
    for (int i = 0; i < STAGED_MAX && !t; i++)
        if (s->staged[i].buf && s->staged[i].id == id)
            t = &s->staged[i];
    uint8_t h[TCPCHAN_HEADER_BYTES];
    s_header(h, id, t ? 0 : 1, t ? t->n : 0);
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
    tcpchan_server_t *s = calloc(1, sizeof *s);
    if (!s)
        return errf(err, errlen, "out of memory"), NULL;
    char bind[TCPCHAN_ENDPOINT_MAX];
    snprintf(bind, sizeof bind, "tcp://%s:*", host);
    int linger = 0;
    size_t len = sizeof s->endpoint;
    if (!(s->sock = zmq_socket(zmq_ctx, ZMQ_ROUTER)) || zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
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
    pthread_mutex_lock(&s->lock);
    staged_t *slot = NULL;
    int dup = 0;
    for (int i = 0; i < STAGED_MAX; i++) {
        dup |= s->staged[i].buf && s->staged[i].id == id;
        if (!slot && !s->staged[i].buf)
            slot = &s->staged[i];
    }
    if (slot && !dup)
        *slot = (staged_t){.id = id, .buf = *buf_p, .n = n};
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

/* ---- receiver ---------------------------------------------------------------------------- */

typedef struct peer {
    char endpoint[TCPCHAN_ENDPOINT_MAX];   /* "" = free */
    void *sock;                            /* DEALER connected to it */
} peer_t;

struct tcpchan_client {
    void *ctx;
    int64_t max_bytes;
    peer_t peers[CLIENT_PEERS];
    int next_evict;
};

tcpchan_client_t *tcpchan_client_new(void *zmq_ctx, int64_t max_bytes)
{
    tcpchan_client_t *c = calloc(1, sizeof *c);
    if (c) {
        c->ctx = zmq_ctx;
        c->max_bytes = max_bytes;
    }
    return c;
}

static void s_peer_close(peer_t *p)
{
    if (p->sock)
        zmq_close(p->sock);
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

static peer_t *s_peer(tcpchan_client_t *c, const char *ep, char *err, size_t errlen)
{
    for (int i = 0; i < CLIENT_PEERS; i++)
        if (c->peers[i].sock && strcmp(c->peers[i].endpoint, ep) == 0)
            return &c->peers[i];
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
        zmq_setsockopt(p->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0 || zmq_connect(p->sock, ep) != 0) {
        errf(err, errlen, "tcp channel: cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
        s_peer_close(p);
        return NULL;
    }
    snprintf(p->endpoint, sizeof p->endpoint, "%s", ep);
    return p;
}

int tcpchan_fetch(tcpchan_client_t *c, const char *ep, uint64_t id, void *dst, size_t n, int64_t deadline_ms,
                  char *err, size_t errlen)
{
    if (tcpchan_endpoint_check(ep, NULL, err, errlen) != 0)
        return -1;
    peer_t *p = s_peer(c, ep, err, errlen);
    if (!p)
        return -1;
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
        zmq_pollitem_t it = {.socket = p->sock, .events = ZMQ_POLLIN};
        if (left <= 0 || zmq_poll(&it, 1, (long)left) <= 0 || !(it.revents & ZMQ_POLLIN)) {
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
        if (status != 0 || !more) {
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
