#include "tools/lib/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "actors/runtime/auth.h"
#include "common/util.h"
#include "topology/topology.h"

struct client {
    void *ctx;
    void *sock;          /* DEALER */
    uint8_t *buf;        /* [MSG_MAX_FRAME] encode scratch */
    uint64_t next_id;
    int64_t max_frame;   /* the cluster's frame limit: larger requests are refused before sending */
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
    int linger = 100, hs = 5000;
    int64_t maxmsg = MSG_MAX_FRAME;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(c->sock, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
    if (opts && opts->server_key && *opts->server_key && s_curve(c->sock, opts, err, errlen) != 0) {
        client_destroy(&c);
        return NULL;
    }
    if (!c->buf || zmq_connect(c->sock, endpoint) != 0) {
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
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
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
    if (zmq_send(c->sock, c->buf, len, 0) < 0)
        return errf(err, errlen, "send: %s (is the cluster running?)", zmq_strerror(errno));
    if (id_out)
        *id_out = m->id;
    return 0;
}

int client_recv(client_t *c, msg_t *out, int timeout_ms, char *err, size_t errlen)
{
    zmq_pollitem_t item = {.socket = c->sock, .events = ZMQ_POLLIN};
    int rc = zmq_poll(&item, 1, timeout_ms);
    if (rc < 0)
        return errf(err, errlen, "poll: %s", zmq_strerror(errno));
    if (rc == 0)
        return 1;
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, c->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&part);
        return errf(err, errlen, "recv: %s", zmq_strerror(errno));
    }
    rc = msg_decode(zmq_msg_data(&part), zmq_msg_size(&part), out, err, errlen);
    zmq_msg_close(&part);
    return rc == 0 ? 0 : -1;
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
