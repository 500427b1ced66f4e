/* actors/monitor.c — the live view of the cluster.
 *
 * Duties:
 *   - subscribe to every actor's periodic STATS (a SUB socket bound at endpoints.stats; every
 *     actor and the supervisor connect a PUB to it) and keep the latest frame per actor;
 *   - answer INSPECT queries on the inspection endpoint (troupe-top, scripts) with an
 *     INSPECT_REPLY listing every actor, itself included, and marking actors whose stats have
 *     gone quiet (a killed or wedged process) with the metric `silent_ms`.
 *
 * The latest STATS frame of each actor is kept as raw bytes and decoded only when someone asks:
 * stats arrive every second from every actor, queries rarely.
 *
 * It also counts the cache-manager's cache events (blocks stored / removed) as metrics.
 *
 * With endpoints.metrics set it also serves Prometheus text on HTTP GET /metrics (a ZMQ_STREAM
 * socket: plain TCP), one sample per actor metric labelled with the actor and its role.
 *
 * The HTTP side never blocks: every send is ZMQ_DONTWAIT into a bounded pipe (HTTP_HWM); a
 * client that does not read its response loses its connection, never the monitor's loop. Only
 * the exact request line `GET /metrics` (optionally with a query) is served.
 *
 * Known limits: cache and expert views (INSPECT cache /
 * experts) answer with the actors whose stats carry those metrics. */
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "actors/runtime/actor.h"
#include "common/log.h"
#include "common/util.h"

#define MAX_TRACKED 1024
#define PAGE_MAX    (1 << 20)
#define HTTP_HWM    64          /* queued frames per HTTP connection before its sends fail */

typedef struct tracked {
    char name[MSG_MAX_NAME];     /* actor instance name, from its stats */
    uint8_t *frame;              /* latest STATS frame, as received */
    size_t len;
    int64_t seen_ms;             /* when it arrived (monotonic) */
} tracked_t;

typedef struct monitor {
    void *sub;                   /* SUB at endpoints.stats_bind */
    void *inspect;               /* ROUTER at endpoints.inspect */
    void *http;                  /* ZMQ_STREAM at endpoints.metrics, or NULL */
    char *page;                  /* [PAGE_MAX] scratch for one /metrics response */
    tracked_t actors[MAX_TRACKED];
    int n;
    uint64_t frames, bad_frames; /* stats frames received / undecodable (or under another actor's name) */
    uint64_t http_dropped;       /* HTTP connections closed because they did not read */
    uint64_t cache_events[MSG_CEV_COUNT];   /* cache_event blocks by kind, from the cache-manager */
    int64_t started_ms;
} monitor_t;

static tracked_t *s_track(monitor_t *mon, const char *name)
{
    for (int i = 0; i < mon->n; i++)
        if (strcmp(mon->actors[i].name, name) == 0)
            return &mon->actors[i];
    if (mon->n >= MAX_TRACKED)
        return NULL;
    tracked_t *t = &mon->actors[mon->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

static int s_on_stats(actor_t *a, void *state, void *sock)
{
    monitor_t *mon = state;
    for (int k = 0; k < 1024; k++) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            return 0;
        }
        mon->frames++;
        msg_t m;
        char err[256];
        const uint8_t *data = zmq_msg_data(&part);
        size_t len = zmq_msg_size(&part);
        if (msg_decode(data, len, &m, err, sizeof err) != 0 || m.type != MSG_STATS) {
            if (m.type == MSG_NONE)
                LOG_D("bad stats frame: %s", err);
            mon->bad_frames++;
            msg_free(&m);
            zmq_msg_close(&part);
            continue;
        }
        /* With CURVE the name in the stats must be the one its key was issued to. */
        const char *uid = zmq_msg_gets(&part, "User-Id");
        if (actor_topo(a)->security.curve_server_public[0] && (!uid || strcmp(uid, m.u.stats.name) != 0)) {
            LOG_D("stats for '%s' from the key of '%s': dropped", m.u.stats.name, uid ? uid : "(none)");
            mon->bad_frames++;
            msg_free(&m);
            zmq_msg_close(&part);
            continue;
        }
        tracked_t *t = s_track(mon, m.u.stats.name);
        msg_free(&m);
        if (t) {
            uint8_t *copy = realloc(t->frame, len);
            if (copy) {
                memcpy(copy, data, len);
                t->frame = copy;
                t->len = len;
                t->seen_ms = now_ms();
            }
        }
        zmq_msg_close(&part);
    }
    return 0;
}

/* Builds the reply from every tracked actor's latest stats (decoded now) plus a silent_ms
 * metric each; the monitor's own entry comes from its live counters. */
static int s_on_inspect(actor_t *a, void *state, const actor_peer_t *from, msg_t *q)
{
    monitor_t *mon = state;
    const char *only = q->u.inspect.what == MSG_INSPECT_ACTOR ? q->u.inspect.name : NULL;
    msg_t *decoded = calloc((size_t)mon->n, sizeof *decoded);
    msg_stats_t *entries = calloc((size_t)mon->n, sizeof *entries);
    msg_metric_t *metrics = calloc((size_t)mon->n * (MSG_MAX_METRICS + 1), sizeof *metrics);
    if (!decoded || !entries || !metrics) {
        free(decoded);
        free(entries);
        free(metrics);
        return actor_reply_error(a, from, q->id, MSG_ERR_INTERNAL, 1, "out of memory"), 0;
    }
    int n = 0;
    int64_t now = now_ms();
    for (int i = 0; i < mon->n; i++) {
        tracked_t *t = &mon->actors[i];
        if (only && strcmp(only, t->name) != 0)
            continue;
        char err[256];
        if (msg_decode(t->frame, t->len, &decoded[n], err, sizeof err) != 0)
            continue;
        entries[n] = decoded[n].u.stats;
        msg_metric_t *ms = &metrics[(size_t)n * (MSG_MAX_METRICS + 1)];
        uint32_t nm = entries[n].n_metrics < MSG_MAX_METRICS ? entries[n].n_metrics : MSG_MAX_METRICS - 1;
        if (nm)
            memcpy(ms, entries[n].metrics, nm * sizeof *ms);
        ms[nm++] = (msg_metric_t){.name = "silent_ms", .value = (double)(now - t->seen_ms)};
        entries[n].metrics = ms;
        entries[n].n_metrics = nm;
        n++;
    }
    if (only && n == 0) {
        actor_reply_error(a, from, q->id, MSG_ERR_BAD_REQUEST, 0, "no actor named '%s' has reported", only);
    } else {
        msg_t r;
        msg_init(&r, MSG_INSPECT_REPLY, q->id);
        r.u.inspect_reply.uptime_ms = (uint64_t)(now - mon->started_ms);
        r.u.inspect_reply.actors = entries;
        r.u.inspect_reply.n_actors = (uint32_t)n;
        if (actor_reply(a, from, &r) != 0)
            LOG_D("inspect reply not delivered");
    }
    for (int i = 0; i < n; i++)
        msg_free(&decoded[i]);
    free(decoded);
    free(entries);
    free(metrics);
    return 0;
}

static int s_on_cache_event(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    monitor_t *mon = state;
    if (from->sock == mon->inspect)   /* the inspection endpoint answers queries, nothing else */
        return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "the inspection endpoint only "
                                 "answers 'inspect'"), 0;
    if (m->u.cache_event.kind < MSG_CEV_COUNT)
        mon->cache_events[m->u.cache_event.kind] += m->u.cache_event.n_hashes;
    return 0;
}

/* ---- Prometheus ---------------------------------------------------------------------------- */

/* A label value as the exposition format wants it: backslash, quote and newline escaped. */
static void s_escape(char *dst, size_t cap, const char *src)
{
    size_t o = 0;
    for (; *src && o + 3 < cap; src++) {
        if (*src == '\\' || *src == '"' || *src == '\n') {
            dst[o++] = '\\';
            dst[o++] = *src == '\n' ? 'n' : *src;
        } else {
            dst[o++] = *src;
        }
    }
    dst[o] = 0;
}

/* 1 if name may be a metric name: [a-zA-Z_][a-zA-Z0-9_]* (others' stats are not trusted). */
static int s_metric_name_ok(const char *name)
{
    if (!*name || (*name >= '0' && *name <= '9'))
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return 0;
    return 1;
}

/* Appends one sample. */
static size_t s_sample(char *b, size_t cap, size_t n, const char *name, const char *suffix, const msg_stats_t *st,
                       const char *extra_label, double v)
{
    if (n >= cap || !s_metric_name_ok(name))
        return n;
    char actor[2 * MSG_MAX_NAME + 1];
    s_escape(actor, sizeof actor, st->name);
    int k = snprintf(b + n, cap - n, "troupe_%s%s{actor=\"%s\",role=\"%s\"%s} %.17g\n", name, suffix, actor,
                     msg_role_name(st->role), extra_label ? extra_label : "", v);
    return k < 0 ? n : n + (size_t)k;
}

/* The exposition of every tracked actor's latest stats. */
static size_t s_render_metrics(monitor_t *mon, char *b, size_t cap)
{
    size_t n = 0;
    int64_t now = now_ms();
    for (int i = 0; i < mon->n; i++) {
        tracked_t *t = &mon->actors[i];
        msg_t m;
        char err[256];
        if (msg_decode(t->frame, t->len, &m, err, sizeof err) != 0)
            continue;
        const msg_stats_t *st = &m.u.stats;
        n = s_sample(b, cap, n, "up", "", st, NULL, now - t->seen_ms < 3000 ? 1 : 0);
        n = s_sample(b, cap, n, "uptime_seconds", "", st, NULL, (double)st->uptime_ms / 1000.0);
        n = s_sample(b, cap, n, "restarts_total", "", st, NULL, st->restarts);
        n = s_sample(b, cap, n, "messages_in_total", "", st, NULL, (double)st->msgs_in);
        n = s_sample(b, cap, n, "messages_out_total", "", st, NULL, (double)st->msgs_out);
        n = s_sample(b, cap, n, "messages_malformed_total", "", st, NULL, (double)st->malformed);
        for (uint32_t k = 0; k < st->n_queues; k++) {
            char label[2 * MSG_MAX_NAME + 16], q[2 * MSG_MAX_NAME + 1];
            s_escape(q, sizeof q, st->queues[k].name);
            snprintf(label, sizeof label, ",queue=\"%s\"", q);
            n = s_sample(b, cap, n, "queue_depth", "", st, label, (double)st->queues[k].depth);
        }
        for (uint32_t k = 0; k < st->n_metrics; k++) {
            const msg_metric_t *mt = &st->metrics[k];
            size_t len = strlen(mt->name);
            int counter = mt->kind == MSG_METRIC_COUNTER;
            const char *suffix = counter && (len < 6 || strcmp(mt->name + len - 6, "_total") != 0) ? "_total" : "";
            n = s_sample(b, cap, n, mt->name, suffix, st, NULL, mt->value);
        }
        msg_free(&m);
    }
    return n < cap ? n : cap;
}

/* One [id][bytes] message to a STREAM peer without blocking; -1 if it could not be queued. */
static int s_http_send(void *sock, const uint8_t *id, size_t idn, const void *data, size_t len)
{
    if (zmq_send(sock, id, idn, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return -1;
    return zmq_send(sock, data, len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

/* HTTP over a ZMQ_STREAM socket: frames come as [peer id][bytes]; an empty payload announces a
 * connection or its end. Each request gets one response and the connection is closed (an empty
 * payload back), as HTTP/1.0 does. */
static int s_on_http(actor_t *a, void *state, void *sock)
{
    monitor_t *mon = state;
    for (int k = 0; k < 64; k++) {
        uint8_t id[256], req[2048];
        int idn = zmq_recv(sock, id, sizeof id, ZMQ_DONTWAIT);
        if (idn < 0)
            return 0;
        int n = zmq_recv(sock, req, sizeof req - 1, ZMQ_DONTWAIT);
        if (n <= 0 || idn > (int)sizeof id)
            continue;
        req[n < (int)sizeof req - 1 ? n : (int)sizeof req - 1] = 0;
        const char *status = "200 OK", *ctype = "text/plain; version=0.0.4";
        size_t body;
        /* Exactly the path /metrics (a query string allowed), not /metricsXYZ. */
        if (strncmp((char *)req, "GET /metrics", 12) == 0 && strchr(" ?", req[12]) && req[12]) {
            body = s_render_metrics(mon, mon->page, PAGE_MAX);
        } else {
            status = "404 Not Found";
            ctype = "text/plain";
            body = (size_t)snprintf(mon->page, PAGE_MAX, "troupe monitor: only GET /metrics is served\n");
        }
        char head[256];
        int hn = snprintf(head, sizeof head, "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                          "Connection: close\r\n\r\n", status, ctype, body);
        /* A STREAM message is exactly [id][bytes]: the head and the body go as two, then an empty
         * one closes the connection. Never blocking: a connection whose pipe is full (it does not
         * read) is closed instead; the close itself may fail only if the peer is gone already. */
        if (s_http_send(sock, id, (size_t)idn, head, (size_t)hn) != 0 ||
            s_http_send(sock, id, (size_t)idn, mon->page, body) != 0)
            mon->http_dropped++;
        s_http_send(sock, id, (size_t)idn, NULL, 0);
    }
    return 0;
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    monitor_t *mon = state;
    actor_stat_metric(a, st, "cache_blocks_stored_events", (double)mon->cache_events[MSG_CEV_STORED], 1);
    actor_stat_metric(a, st, "cache_blocks_removed_events", (double)mon->cache_events[MSG_CEV_REMOVED], 1);
    actor_stat_metric(a, st, "actors_tracked", mon->n, 0);
    actor_stat_metric(a, st, "stats_frames", (double)mon->frames, 1);
    actor_stat_metric(a, st, "stats_frames_bad", (double)mon->bad_frames, 1);
    actor_stat_metric(a, st, "http_dropped", (double)mon->http_dropped, 1);
}

static const actor_handler_t s_handlers[] = {
    {MSG_INSPECT, s_on_inspect},
    {MSG_CACHE_EVENT, s_on_cache_event},
};

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_MONITOR);
    if (!a)
        return 2;
    monitor_t *mon = calloc(1, sizeof *mon);
    mon->started_ms = now_ms();
    const topo_t *t = actor_topo(a);
    mon->sub = zmq_socket(actor_zmq_ctx(a), ZMQ_SUB);
    actor_sock_defaults(mon->sub, &t->limits);
    zmq_setsockopt(mon->sub, ZMQ_SUBSCRIBE, "", 0);
    int rc = -1;
    /* A bind that fails is not cured by a restart (actor_bind): exit ACTOR_EXIT_CONFIG. */
    if (actor_curve_server(a, mon->sub) != 0) {
        LOG_E("CURVE options on the stats endpoint %s: %s", t->endpoints.stats_bind, zmq_strerror(zmq_errno()));
        zmq_close(mon->sub);
        goto out;
    }
    if (actor_bind(mon->sub, t->endpoints.stats_bind,
                   strncmp(t->endpoints.stats_bind, "ipc://", 6) == 0 ? "the stats endpoint, in endpoints.run_dir"
                                                                     : "the stats endpoint, from endpoints.base_port") != 0) {
        zmq_close(mon->sub);
        rc = ACTOR_EXIT_CONFIG;
        goto out;
    }
    actor_add_reader(a, mon->sub, s_on_stats);
    mon->inspect = actor_bind_router(a, t->endpoints.inspect, "endpoints.inspect");
    if (!mon->inspect) {
        rc = ACTOR_EXIT_CONFIG;
        goto out;
    }
    if (t->endpoints.metrics[0]) {
        mon->page = malloc(PAGE_MAX);
        mon->http = zmq_socket(actor_zmq_ctx(a), ZMQ_STREAM);
        int linger = 0, hwm = HTTP_HWM, timeo = 0;
        zmq_setsockopt(mon->http, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(mon->http, ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_setsockopt(mon->http, ZMQ_SNDTIMEO, &timeo, sizeof timeo);
        if (!mon->page) {
            LOG_E("out of memory for the /metrics page");
            zmq_close(mon->http);
            goto out;
        }
        if (actor_bind(mon->http, t->endpoints.metrics, "endpoints.metrics") != 0) {
            zmq_close(mon->http);
            rc = ACTOR_EXIT_CONFIG;
            goto out;
        }
        actor_add_reader(a, mon->http, s_on_http);
        LOG_I("Prometheus metrics at http://%s/metrics", t->endpoints.metrics + strlen("tcp://"));
    }
    actor_ops_t ops = {.handlers = s_handlers, .n_handlers = ARRAY_LEN(s_handlers), .fill_stats = s_fill_stats};
    rc = actor_run(a, &ops, mon);
out:
    actor_destroy(&a);
    for (int i = 0; i < mon->n; i++)
        free(mon->actors[i].frame);
    free(mon->page);
    free(mon);
    return rc == 0 || rc == ACTOR_EXIT_CONFIG ? rc : 1;
}
