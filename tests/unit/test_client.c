/* The client library's liveness (tools/lib/client.c) against a fake router (a ROUTER socket):
 * when the connection is lost, what the router sent before is still read, every request left in
 * flight gets exactly one synthesized `unavailable` error, late replies for those are dropped, and
 * the same client then works against a router bound again at the endpoint. Two ways to lose it:
 * the router's socket closes (a kill -9 closes it the same way), and a router process that stops
 * answering (SIGSTOP: only the heartbeats notice). Waits are generous bounds, never the thing
 * that ends a wait: each check asserts the reply came, not how fast. Also under CURVE. With two
 * routers, requests that have not streamed move to the other one, and what the router they left
 * sends for them later is dropped, after they ended too. A client whose sends never wait (the
 * gateway's: ZMQ_IMMEDIATE) sends past a router that is down. A request lost after it streamed can
 * be sent again by its caller, same id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/runtime/auth.h"
#include "tools/lib/client.h"

#define WAIT_MS 30000   /* a bound that only a broken client reaches */

/* A fake router: a ROUTER bound at ep (a CURVE server with kp's secret when kp is not NULL; without
 * a ZAP handler it admits any client key); the endpoint bound into `bound` when not NULL. */
static void *s_fake_router(void *ctx, const char *ep, const auth_keypair_t *kp, char *bound, size_t cap)
{
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int one = 1, linger = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &linger, sizeof linger);
    if (kp) {
        assert_int_equal(zmq_setsockopt(r, ZMQ_CURVE_SERVER, &one, sizeof one), 0);
        assert_int_equal(zmq_setsockopt(r, ZMQ_CURVE_SECRETKEY, kp->sec, AUTH_Z85_LEN), 0);
    }
    assert_int_equal(zmq_bind(r, ep), 0);
    if (bound) {
        size_t n = cap;
        zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, bound, &n);
    }
    return r;
}

/* Receives one request at the fake router: its routing id into rid (rid_len) and its msg. */
static void s_take(void *r, uint8_t *rid, size_t *rid_len, msg_t *m)
{
    zmq_pollitem_t it = {.socket = r, .events = ZMQ_POLLIN};
    assert_int_equal(zmq_poll(&it, 1, WAIT_MS), 1);
    int n = zmq_recv(r, rid, 256, 0);
    assert_true(n > 0);
    *rid_len = (size_t)n;
    static uint8_t buf[4 << 20];   /* test_late_reply_from_left_router's big submit */
    n = zmq_recv(r, buf, sizeof buf, 0);
    assert_true(n > 0);
    char err[256];
    assert_int_equal(msg_decode(buf, (size_t)n, m, err, sizeof err), 0);
}

static void s_reply(void *r, const uint8_t *rid, size_t rid_len, const msg_t *m)
{
    static uint8_t buf[1 << 16];
    size_t len;
    char err[256];
    assert_int_equal(msg_encode(m, buf, sizeof buf, &len, err, sizeof err), 0);
    assert_true(zmq_send(r, rid, rid_len, ZMQ_SNDMORE) >= 0);
    assert_true(zmq_send(r, buf, len, 0) >= 0);
}

/* A streamed submit of three tokens: with id 0 a fresh one, else that id sent again. Its id. */
static uint64_t s_submit_id(client_t *c, uint64_t id_in)
{
    msg_t m;
    msg_init(&m, MSG_SUBMIT, id_in);
    static const uint32_t toks[] = {1, 2, 3};
    m.u.submit.tokens = toks;
    m.u.submit.n_tokens = 3;
    m.u.submit.stream = true;
    uint64_t id;
    char err[256];
    assert_int_equal(client_send(c, &m, &id, err, sizeof err), 0);
    return id;
}

static uint64_t s_submit(client_t *c) { return s_submit_id(c, 0); }

/* A token message for id (one token, 7, with text) from the fake router. */
static void s_reply_token(void *r, const uint8_t *rid, size_t rid_len, uint64_t id, const char *text)
{
    msg_t rep;
    msg_init(&rep, MSG_TOKEN, id);
    static const uint32_t t[] = {7};
    rep.u.token.tokens = t;
    rep.u.token.n_tokens = 1;
    rep.u.token.text = text;
    s_reply(r, rid, rid_len, &rep);
}

/* Two fake routers on free ports, *a first (its endpoint into ep_a: bound again later), and a
 * client of both (failover between them). */
static client_t *s_two_routers(void *ctx, void **a, void **b, char *ep_a, size_t cap)
{
    char ep_b[256], eps[600], err[256];
    *a = s_fake_router(ctx, "tcp://127.0.0.1:*", NULL, ep_a, cap);
    *b = s_fake_router(ctx, "tcp://127.0.0.1:*", NULL, ep_b, sizeof ep_b);
    snprintf(eps, sizeof eps, "%s, %s", ep_a, ep_b);
    client_t *c = client_connect_opts(eps, &(client_opts_t){0}, err, sizeof err);
    if (!c)
        fail_msg("client_connect_opts: %s", err);
    return c;
}

/* The next message at the client: it must come before the bound. */
static void s_next(client_t *c, msg_t *out)
{
    char err[256];
    int rc = client_recv(c, out, WAIT_MS, err, sizeof err);
    if (rc != 0)
        fail_msg("client_recv: %d (%s): no reply within %d ms", rc, rc == 1 ? "timed out" : err, WAIT_MS);
}

static int s_is_lost(const msg_t *m)
{
    return m->type == MSG_ERROR && m->u.error.code == MSG_ERR_UNAVAILABLE && m->u.error.retryable &&
           strstr(m->u.error.message, "connection to the router") && strstr(m->u.error.message, "outcome is unknown");
}

/* The fake router answers a new request with a done (after a stray token for stray_id, if not 0). */
static void s_serve_one(client_t *c, void *r, uint64_t stray_id)
{
    uint64_t id = s_submit(c);
    uint8_t rid[256];
    size_t rid_len;
    msg_t req, rep;
    s_take(r, rid, &rid_len, &req);
    assert_true(req.id == id);
    msg_free(&req);
    if (stray_id) {   /* a reply for a request that already ended with the lost error: dropped */
        msg_init(&rep, MSG_TOKEN, stray_id);
        static const uint32_t t[] = {9};
        rep.u.token.tokens = t;
        rep.u.token.n_tokens = 1;
        rep.u.token.text = "x";
        s_reply(r, rid, rid_len, &rep);
    }
    msg_init(&rep, MSG_DONE, id);
    s_reply(r, rid, rid_len, &rep);
    msg_t got;
    s_next(c, &got);
    assert_int_equal(got.type, MSG_DONE);
    assert_true(got.id == id);
    msg_free(&got);
}

static void test_closed_connection(void **st)
{
    void *ctx = zmq_ctx_new();
    char ep[256];
    void *r = s_fake_router(ctx, "tcp://127.0.0.1:*", NULL, ep, sizeof ep);
    char err[256];
    client_t *c = client_connect_opts(ep, &(client_opts_t){0}, err, sizeof err);
    assert_non_null(c);
    uint64_t ids[3];
    uint8_t rid[256];
    size_t rid_len;
    for (int i = 0; i < 3; i++) {
        ids[i] = s_submit(c);
        msg_t req;
        s_take(r, rid, &rid_len, &req);
        assert_true(req.id == ids[i]);
        msg_free(&req);
    }
    /* Request 0 ends for real, request 1 streams a token; then the router goes away. */
    msg_t rep;
    msg_init(&rep, MSG_DONE, ids[0]);
    s_reply(r, rid, rid_len, &rep);
    msg_init(&rep, MSG_TOKEN, ids[1]);
    static const uint32_t t[] = {7};
    rep.u.token.tokens = t;
    rep.u.token.n_tokens = 1;
    rep.u.token.text = "a";
    s_reply(r, rid, rid_len, &rep);
    msg_t got;
    s_next(c, &got);   /* read before the close: the lost error must not overtake a real done */
    assert_int_equal(got.type, MSG_DONE);
    assert_true(got.id == ids[0]);
    msg_free(&got);
    zmq_close(r);

    s_next(c, &got);
    assert_int_equal(got.type, MSG_TOKEN);
    assert_true(got.id == ids[1]);
    msg_free(&got);
    int seen[3] = {0};
    for (int k = 0; k < 2; k++) {
        s_next(c, &got);
        assert_true(s_is_lost(&got));
        for (int i = 0; i < 3; i++)
            seen[i] += got.id == ids[i];
        msg_free(&got);
    }
    assert_int_equal(seen[0], 0);   /* it had ended: no error for it */
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[2], 1);
    assert_int_equal(client_recv(c, &got, 300, err, sizeof err), 1);   /* nothing more: once each */
    assert_int_equal((int)client_requests_lost(c), 2);
    assert_int_equal((int)client_connections_lost(c), 1);

    /* A router bound again at the endpoint: ZeroMQ reconnects, a new request completes, and a late
     * reply for a lost request is dropped. */
    r = s_fake_router(ctx, ep, NULL, NULL, 0);
    s_serve_one(c, r, ids[2]);
    assert_int_equal((int)client_requests_lost(c), 2);
    client_destroy(&c);
    assert_null(c);
    zmq_close(r);
    zmq_ctx_term(ctx);
}

/* A router process that stops answering (SIGSTOP) keeps its connection open: the heartbeats find
 * it. The child answers requests with one token each until it is stopped. */
static void s_child_router(int ready_fd)
{
    void *ctx = zmq_ctx_new();
    char ep[256] = "";
    void *r = s_fake_router(ctx, "tcp://127.0.0.1:*", NULL, ep, sizeof ep);
    (void)!write(ready_fd, ep, sizeof ep);   /* the endpoint bound, to the parent */
    for (;;) {
        uint8_t rid[256];
        size_t rid_len;
        msg_t req, rep;
        s_take(r, rid, &rid_len, &req);
        msg_init(&rep, MSG_TOKEN, req.id);
        static const uint32_t t[] = {5};
        rep.u.token.tokens = t;
        rep.u.token.n_tokens = 1;
        rep.u.token.text = "b";
        s_reply(r, rid, rid_len, &rep);
        msg_free(&req);
    }
}

static void test_stopped_router(void **st)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        s_child_router(p[1]);
        _exit(0);
    }
    close(p[1]);
    char ep[256];
    assert_int_equal(read(p[0], ep, sizeof ep), (int)sizeof ep);
    close(p[0]);
    char err[256];
    client_opts_t o = {.heartbeat_ivl_ms = 200, .heartbeat_timeout_ms = 1000};
    client_t *c = client_connect_opts(ep, &o, err, sizeof err);
    assert_non_null(c);
    uint64_t ids[2] = {s_submit(c), s_submit(c)};
    msg_t got;
    for (int i = 0; i < 2; i++) {   /* both streaming */
        s_next(c, &got);
        assert_int_equal(got.type, MSG_TOKEN);
        msg_free(&got);
    }
    kill(pid, SIGSTOP);
    int seen = 0;
    for (int k = 0; k < 2; k++) {
        s_next(c, &got);
        assert_true(s_is_lost(&got));
        seen += (got.id == ids[0]) + 2 * (got.id == ids[1]);
        msg_free(&got);
    }
    assert_int_equal(seen, 3);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    client_destroy(&c);
}

/* Heartbeats off: a closed connection is still noticed (by the socket monitor). */
static void test_heartbeats_off(void **st)
{
    void *ctx = zmq_ctx_new();
    char ep[256];
    void *r = s_fake_router(ctx, "tcp://127.0.0.1:*", NULL, ep, sizeof ep);
    char err[256];
    client_t *c = client_connect_opts(ep, &(client_opts_t){.heartbeat_ivl_ms = -1}, err, sizeof err);
    assert_non_null(c);
    uint64_t id = s_submit(c);
    uint8_t rid[256];
    size_t rid_len;
    msg_t req, got;
    s_take(r, rid, &rid_len, &req);
    msg_free(&req);
    zmq_close(r);
    s_next(c, &got);
    assert_true(s_is_lost(&got));
    assert_true(got.id == id);
    assert_null(strstr(got.u.error.message, "heartbeat"));
    msg_free(&got);
    client_destroy(&c);
    zmq_ctx_term(ctx);
}

/* Under CURVE: the loss is seen and the same client is served again by a router bound again with
 * the same key. */
static void test_curve(void **st)
{
    char dir[] = "/tmp/test_client.XXXXXX", sp[128], ss[128], cp[160], cs[160], prefix[128], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(sp, sizeof sp, "%s/server.pub", dir), snprintf(ss, sizeof ss, "%s/server.key", dir);
    snprintf(prefix, sizeof prefix, "%s/me", dir);
    snprintf(cp, sizeof cp, "%s.pub", prefix), snprintf(cs, sizeof cs, "%s.key", prefix);
    auth_keypair_t server, me;
    assert_int_equal(auth_keypair_generate(sp, ss, &server, err, sizeof err), 0);
    assert_int_equal(auth_keypair_generate(cp, cs, &me, err, sizeof err), 0);
    void *ctx = zmq_ctx_new();
    char ep[256];
    void *r = s_fake_router(ctx, "tcp://127.0.0.1:*", &server, ep, sizeof ep);
    client_opts_t o = {.server_key = sp, .key = prefix};
    client_t *c = client_connect_opts(ep, &o, err, sizeof err);
    assert_non_null(c);
    s_serve_one(c, r, 0);   /* served over CURVE */
    uint64_t id = s_submit(c);
    uint8_t rid[256];
    size_t rid_len;
    msg_t req, got;
    s_take(r, rid, &rid_len, &req);
    msg_free(&req);
    zmq_close(r);
    s_next(c, &got);
    assert_true(s_is_lost(&got));
    assert_true(got.id == id);
    msg_free(&got);
    r = s_fake_router(ctx, ep, &server, NULL, 0);
    s_serve_one(c, r, id);
    client_destroy(&c);
    zmq_close(r);
    zmq_ctx_term(ctx);
    unlink(sp), unlink(ss), unlink(cp), unlink(cs), rmdir(dir);
}

/* Two routers: when the first one's connection is lost, its requests that had no reply yet are
 * sent again, with their ids, to the second and end there; the one that had streamed ends with the
 * lost error; new requests go to the second, even once the first is back. One terminal reply each. */
static void test_failover(void **st)
{
    void *ctx = zmq_ctx_new(), *a, *b;
    char ep_a[256], err[256];
    client_t *c = s_two_routers(ctx, &a, &b, ep_a, sizeof ep_a);
    uint64_t ids[3];
    uint8_t rid[256];
    size_t rid_len;
    msg_t req, rep, got;
    for (int i = 0; i < 3; i++) {   /* every one to the first router */
        ids[i] = s_submit(c);
        s_take(a, rid, &rid_len, &req);
        assert_true(req.id == ids[i]);
        msg_free(&req);
    }
    s_reply_token(a, rid, rid_len, ids[0], "a");   /* request 0 streams */
    s_next(c, &got);
    assert_int_equal(got.type, MSG_TOKEN);
    msg_free(&got);
    assert_int_equal(client_recv(c, &got, 300, err, sizeof err), 1);   /* both connections' handshakes seen */
    zmq_close(a);

    s_next(c, &got);   /* the streamed one: lost */
    assert_true(s_is_lost(&got));
    assert_true(got.id == ids[0]);
    msg_free(&got);
    uint8_t rid_b[256];
    size_t rid_b_len;
    int seen[3] = {0};
    for (int k = 0; k < 2; k++) {   /* the others: at the second router, unchanged */
        s_take(b, rid_b, &rid_b_len, &req);
        assert_int_equal(req.type, MSG_SUBMIT);
        assert_int_equal(req.u.submit.n_tokens, 3);
        for (int i = 0; i < 3; i++)
            seen[i] += req.id == ids[i];
        msg_init(&rep, MSG_DONE, req.id);
        s_reply(b, rid_b, rid_b_len, &rep);
        msg_free(&req);
    }
    assert_int_equal(seen[0], 0);
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[2], 1);
    for (int k = 0; k < 2; k++) {
        s_next(c, &got);
        assert_int_equal(got.type, MSG_DONE);
        assert_true(got.id == ids[1] || got.id == ids[2]);
        msg_free(&got);
    }
    assert_int_equal(client_recv(c, &got, 300, err, sizeof err), 1);   /* nothing more: once each */
    assert_int_equal((int)client_requests_retried(c), 2);
    assert_int_equal((int)client_requests_lost(c), 1);
    assert_int_equal((int)client_connections_lost(c), 1);

    /* New requests go to the second router, with the first back too. */
    a = s_fake_router(ctx, ep_a, NULL, NULL, 0);
    s_serve_one(c, b, 0);
    uint64_t id = s_submit(c);
    s_take(b, rid_b, &rid_b_len, &req);
    assert_true(req.id == id);
    msg_free(&req);
    msg_init(&rep, MSG_DONE, id);
    s_reply(b, rid_b, rid_b_len, &rep);
    s_next(c, &got);
    assert_int_equal(got.type, MSG_DONE);
    assert_true(got.id == id);
    msg_free(&got);
    client_destroy(&c);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}

/* A request that streamed and was lost with its router, sent again by its caller with the same id
 * (the gateway restarts a non-streamed call so): it is the new send's, at the other router, and its
 * replies there come through, where a lost request's late replies are dropped. */
static void test_restart_after_lost(void **st)
{
    void *ctx = zmq_ctx_new(), *a, *b;
    char ep_a[256], err[256];
    client_t *c = s_two_routers(ctx, &a, &b, ep_a, sizeof ep_a);
    uint8_t rid[256];
    size_t rid_len;
    msg_t req, rep, got;
    const uint64_t id = s_submit(c);
    s_take(a, rid, &rid_len, &req);
    msg_free(&req);
    s_reply_token(a, rid, rid_len, id, "a");   /* it streams: the library cannot move it */
    s_next(c, &got);
    assert_int_equal(got.type, MSG_TOKEN);
    msg_free(&got);
    assert_int_equal(client_recv(c, &got, 300, err, sizeof err), 1);   /* both connections' handshakes seen */
    zmq_close(a);
    s_next(c, &got);
    assert_true(s_is_lost(&got));
    assert_true(got.id == id);
    msg_free(&got);

    assert_true(s_submit_id(c, id) == id);   /* the caller starts it again, same id */
    uint8_t rid_b[256];
    size_t rid_b_len;
    s_take(b, rid_b, &rid_b_len, &req);
    assert_true(req.id == id);
    msg_free(&req);
    s_reply_token(b, rid_b, rid_b_len, id, "b");
    msg_init(&rep, MSG_DONE, id);
    s_reply(b, rid_b, rid_b_len, &rep);
    s_next(c, &got);
    assert_int_equal(got.type, MSG_TOKEN);
    assert_string_equal(got.u.token.text, "b");
    msg_free(&got);
    s_next(c, &got);
    assert_int_equal(got.type, MSG_DONE);
    assert_true(got.id == id);
    msg_free(&got);
    assert_int_equal(client_recv(c, &got, 300, err, sizeof err), 1);   /* once */
    assert_int_equal((int)client_requests_lost(c), 1);
    client_destroy(&c);
    zmq_close(b);
    zmq_ctx_term(ctx);
}

/* The first router of test_late_reply_from_left_router: a process answering every small submit
 * with a token and a done, then a token for MARKER_ID (an id the client never used: delivered as it
 * comes, it shows that what came before on this connection has been read). A submit it cannot
 * decode (the rest of a big one its connection lost) is skipped. */
#define MARKER_ID 0xfeedULL
static pid_t s_child = -1;   /* the first router's process, ended by the teardown whatever happened */

static int s_end_child(void **st)
{
    if (s_child > 0) {
        kill(s_child, SIGKILL);
        waitpid(s_child, NULL, 0);
        s_child = -1;
    }
    return 0;
}
static void s_child_answering_router(const char *ep)
{
    void *ctx = zmq_ctx_new(), *r = s_fake_router(ctx, ep, NULL, NULL, 0);
    static uint8_t buf[8 << 20];
    for (;;) {
        uint8_t rid[256];
        int n = zmq_recv(r, rid, sizeof rid, 0), more = 0;
        size_t sz = sizeof more;
        zmq_getsockopt(r, ZMQ_RCVMORE, &more, &sz);
        if (n <= 0 || !more)
            continue;
        int len = zmq_recv(r, buf, sizeof buf, 0);
        msg_t req, rep;
        char err[256];
        if (len <= 0 || len > (int)sizeof buf || msg_decode(buf, (size_t)len, &req, err, sizeof err) != 0)
            continue;
        if (req.type == MSG_SUBMIT && !req.u.submit.prompt) {
            static const uint32_t t[] = {5};
            msg_init(&rep, MSG_TOKEN, req.id);
            rep.u.token.tokens = t;
            rep.u.token.n_tokens = 1;
            rep.u.token.text = "late";
            s_reply(r, rid, (size_t)n, &rep);
            msg_init(&rep, MSG_DONE, req.id);
            s_reply(r, rid, (size_t)n, &rep);
            msg_init(&rep, MSG_TOKEN, MARKER_ID);
            rep.u.token.tokens = t;
            rep.u.token.n_tokens = 1;
            rep.u.token.text = "marker";
            s_reply(r, rid, (size_t)n, &rep);
        }
        msg_free(&req);
    }
}

/* A request the client moved away from a router that was only stopped, and that the router then
 * gets after all: a submit made while the stopped router's connection could take no more (a big
 * one before it fills the socket's buffers) waits in the client's queue for that router; the
 * heartbeat sent before them times out and the client moves both to the second router, where they end. When the
 * first resumes, ZeroMQ's reconnection delivers the queued submit to it and it streams it: those
 * replies, for a request that ended elsewhere, must be dropped (the nemesis saw them delivered as
 * replies for an unknown id, 1799b52). */
static void test_late_reply_from_left_router(void **st)
{
    char dir[64], ep_a[128];
    snprintf(dir, sizeof dir, "/tmp/troupe-client-late-%d", (int)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(ep_a, sizeof ep_a, "ipc://%s/a.sock", dir);   /* unix sockets: small buffers, filled at once */
    pid_t pid = s_child = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        s_child_answering_router(ep_a);
        _exit(0);
    }
    void *ctx = zmq_ctx_new();
    char ep_b[256], eps[400], err[256];
    void *b = s_fake_router(ctx, "tcp://127.0.0.1:*", NULL, ep_b, sizeof ep_b);
    snprintf(eps, sizeof eps, "%s, %s", ep_a, ep_b);
    client_opts_t o = {.heartbeat_ivl_ms = 200, .heartbeat_timeout_ms = 1000};
    client_t *c = client_connect_opts(eps, &o, err, sizeof err);
    assert_non_null(c);
    msg_t got, req, rep;
    s_submit(c);   /* the first router answers: both connections are up */
    s_next(c, &got);
    assert_int_equal(got.type, MSG_TOKEN);
    msg_free(&got);
    for (int k = 0; k < 2; k++) {   /* its done, then the marker */
        s_next(c, &got);
        msg_free(&got);
    }
    assert_int_equal(client_recv(c, &got, 300, err, sizeof err), 1);   /* both connections' handshakes seen */

    kill(pid, SIGSTOP);
    usleep(500 * 1000);   /* a heartbeat goes out unanswered first: its timeout runs while the big one blocks */
    msg_init(&req, MSG_SUBMIT, 0);
    static char big[2 << 20];
    memset(big, 'x', sizeof big - 1);
    req.u.submit.prompt = big;
    uint64_t big_id, id;
    assert_int_equal(client_send(c, &req, &big_id, err, sizeof err), 0);
    id = s_submit(c);   /* queued behind the big one */
    uint8_t rid[256];
    size_t rid_len;
    int seen = 0;
    for (int k = 0; k < 2; k++) {   /* both moved to the second router (after the heartbeat timeout) */
        zmq_pollitem_t it = {.socket = b, .events = ZMQ_POLLIN};
        while (zmq_poll(&it, 1, 0) == 0)
            assert_int_equal(client_recv(c, &got, 50, err, sizeof err), 1);   /* the client notices the loss */
        s_take(b, rid, &rid_len, &req);
        seen |= (req.id == big_id) | 2 * (req.id == id);
        msg_init(&rep, MSG_DONE, req.id);
        s_reply(b, rid, rid_len, &rep);
        msg_free(&req);
    }
    assert_int_equal(seen, 3);
    for (int k = 0; k < 2; k++) {
        s_next(c, &got);
        assert_int_equal(got.type, MSG_DONE);
        msg_free(&got);
    }
    assert_int_equal((int)client_requests_retried(c), 2);

    kill(pid, SIGCONT);   /* it gets the queued submit and streams it: only the marker may come */
    s_next(c, &got);
    if (got.id != MARKER_ID)
        fail_msg("a %s for request %llu from the router it had left (the marker was due)", msg_type_name(got.type),
                 (unsigned long long)got.id);
    msg_free(&got);
    assert_int_equal(client_recv(c, &got, 300, err, sizeof err), 1);
    assert_int_equal((int)client_requests_lost(c), 0);
    s_end_child(NULL);
    client_destroy(&c);
    zmq_close(b);
    zmq_ctx_term(ctx);
    char path[160];
    snprintf(path, sizeof path, "%s/a.sock", dir);
    unlink(path);
    rmdir(dir);
}

/* s_take at r while the client runs (it notices a lost connection and moves requests only then);
 * nothing may reach the caller meanwhile. */
static void s_take_pumping(client_t *c, void *r, uint8_t *rid, size_t *rid_len, msg_t *m)
{
    zmq_pollitem_t it = {.socket = r, .events = ZMQ_POLLIN};
    char err[256];
    msg_t got;
    for (int k = 0; zmq_poll(&it, 1, 0) == 0; k++) {
        assert_true(k < WAIT_MS / 50);
        assert_int_equal(client_recv(c, &got, 50, err, sizeof err), 1);
    }
    s_take(r, rid, rid_len, m);
}

/* A request moved back to a router it had left (first lost, then the second): that router's
 * replies over its new connection are the request's own and end it. */
static void test_moved_back(void **st)
{
    void *ctx = zmq_ctx_new(), *a, *b;
    char ep_a[256], err[256];
    client_t *c = s_two_routers(ctx, &a, &b, ep_a, sizeof ep_a);
    uint8_t rid[256];
    size_t rid_len;
    msg_t req, rep, got;
    uint64_t id = s_submit(c);
    s_take(a, rid, &rid_len, &req);
    msg_free(&req);
    assert_int_equal(client_recv(c, &got, 300, err, sizeof err), 1);   /* both connections' handshakes seen */
    zmq_close(a);
    s_take_pumping(c, b, rid, &rid_len, &req);   /* moved to the second */
    assert_true(req.id == id);
    msg_free(&req);
    a = s_fake_router(ctx, ep_a, NULL, NULL, 0);   /* the first back: the client reconnects */
    assert_int_equal(client_recv(c, &got, 500, err, sizeof err), 1);
    zmq_close(b);
    s_take_pumping(c, a, rid, &rid_len, &req);   /* moved back to the first */
    assert_true(req.id == id);
    msg_free(&req);
    msg_init(&rep, MSG_DONE, id);
    s_reply(a, rid, rid_len, &rep);
    s_next(c, &got);
    assert_int_equal(got.type, MSG_DONE);
    assert_true(got.id == id);
    msg_free(&got);
    assert_int_equal((int)client_requests_retried(c), 2);
    client_destroy(&c);
    zmq_close(a);
    zmq_ctx_term(ctx);
}

/* The gateway's kind of client (sock_setup: ZMQ_IMMEDIATE, no send timeout): a send the active
 * router's connection cannot take (none up) goes to the other router, whose reply then ends it; with
 * neither up it fails at once (-1); a message over max_frame is refused before sending (-2). */
static int s_immediate(void *sock, void *arg)
{
    int one = 1, zero = 0;
    ++*(int *)arg;
    return zmq_setsockopt(sock, ZMQ_IMMEDIATE, &one, sizeof one) | zmq_setsockopt(sock, ZMQ_SNDTIMEO, &zero, sizeof zero);
}

static void test_immediate_send_fallback(void **st)
{
    void *ctx = zmq_ctx_new();
    char ep_a[256], ep_b[256], eps[600], err[256];
    void *a = s_fake_router(ctx, "tcp://127.0.0.1:*", NULL, ep_a, sizeof ep_a);
    zmq_close(a);   /* a port where no router listens: the first router is down */
    void *b = s_fake_router(ctx, "tcp://127.0.0.1:*", NULL, ep_b, sizeof ep_b);
    snprintf(eps, sizeof eps, "%s,%s", ep_a, ep_b);
    int setups = 0;
    client_t *c = client_connect_opts(eps, &(client_opts_t){.sock_setup = s_immediate, .sock_setup_arg = &setups,
                                                            .max_frame = 1024}, err, sizeof err);
    assert_non_null(c);
    assert_int_equal(setups, 2);
    int fds[8];
    assert_int_equal(client_fds(c, fds, 8), 4);   /* each router's socket and its monitor */
    for (int i = 0; i < 4; i++)
        assert_true(fds[i] >= 0);
    msg_t req, rep, got;
    /* the second's handshake seen (waited for, not given a fixed 300 ms: on a loaded machine the
     * connection can take longer, and the submit below then found no router up) */
    assert_int_equal(client_wait_connected(c, WAIT_MS), 1);
    uint64_t id = s_submit(c);   /* the first refuses it at once: it goes to the second */
    uint8_t rid[256];
    size_t rid_len;
    s_take(b, rid, &rid_len, &req);
    assert_true(req.id == id);
    msg_free(&req);
    msg_init(&rep, MSG_DONE, id);
    s_reply(b, rid, rid_len, &rep);
    s_next(c, &got);   /* its reply from the second is its own: the request is the second's */
    assert_int_equal(got.type, MSG_DONE);
    assert_true(got.id == id);
    msg_free(&got);

    static uint32_t many[2000];
    msg_t m;
    msg_init(&m, MSG_SUBMIT, 0);
    m.u.submit.tokens = many;
    m.u.submit.n_tokens = 2000;
    assert_int_equal(client_send(c, &m, NULL, err, sizeof err), -2);
    assert_non_null(strstr(err, "max_message_bytes"));

    zmq_close(b);   /* neither router up: a send fails at once instead of waiting */
    for (int waited = 0; client_connections_lost(c) == 0 && waited < WAIT_MS; waited += 100)
        assert_int_equal(client_recv(c, &got, 100, err, sizeof err), 1);
    assert_int_equal((int)client_connections_lost(c), 1);
    msg_init(&m, MSG_SUBMIT, 0);
    static const uint32_t toks[] = {1, 2, 3};
    m.u.submit.tokens = toks;
    m.u.submit.n_tokens = 3;
    assert_int_equal(client_send(c, &m, NULL, err, sizeof err), -1);
    assert_int_equal(client_recv(c, &got, 100, err, sizeof err), 1);   /* nothing in flight: no error comes */
    assert_int_equal((int)client_requests_retried(c), 0);
    client_destroy(&c);
    zmq_ctx_term(ctx);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_connection),
        cmocka_unit_test(test_stopped_router),
        cmocka_unit_test(test_heartbeats_off),
        cmocka_unit_test(test_curve),
        cmocka_unit_test(test_failover),
        cmocka_unit_test(test_restart_after_lost),
        cmocka_unit_test_teardown(test_late_reply_from_left_router, s_end_child),
        cmocka_unit_test(test_moved_back),
        cmocka_unit_test(test_immediate_send_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
