/* The runtime's queues when a receiver does not read (actors/runtime/actor.h, Backpressure): a
 * decode worker's outbox to a router that is stopped, and a router's backlog for a client that
 * does not read. actor_send refuses past limits.outbox; actor_send_keep and keep replies never do;
 * once the receiver reads, it gets every message that was not refused, in the order sent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/runtime/actor.h"
#include "common/util.h"
#include "tests/unit/actor_topo_harness.h"

enum { CAP = 16, N = 60000 };   /* N tokens: far more than the kernel's socket buffers hold */

/* A cluster of a router and a decode worker in a fresh run directory, an outbox of CAP. */
static const char *s_limits(void)
{
    static char l[96];
    snprintf(l, sizeof l, "limits:\n  send_hwm: 1000\n  recv_hwm: 1000\n  outbox: %d\n", CAP);
    return l;
}

static int s_setup(void **st) { return actor_topo_setup("outbox", s_limits()); }

static int s_teardown(void **st) { return actor_topo_teardown(); }

static actor_t *s_actor(const char *name, topo_role_t role)
{
    char *argv[] = {"test", "--topology", s_topo, "--name", (char *)name, NULL};
    return actor_new(5, argv, role);
}

static void s_token(msg_t *m, uint64_t id, uint32_t seq, uint32_t *tok)
{
    msg_init(m, MSG_TOKEN, id);
    *tok = seq;
    m->u.token.seq = seq;
    m->u.token.tokens = tok;
    m->u.token.n_tokens = 1;
}

/* Reads one message from a socket (the identity frame first on a ROUTER), flushing a's queues
 * while none comes; -1 after 5,000 tries in a row with nothing (the message is lost). */
static int s_recv(actor_t *a, void *sock, int router, msg_t *m)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    int tries = 0;
    while (zmq_poll(&it, 1, tries ? 1 : 0) <= 0) {
        if (++tries == 5000)
            return -1;
        actor_flush(a);   /* as the loop does */
    }
    uint8_t buf[4096];
    if (router && zmq_recv(sock, buf, sizeof buf, 0) < 0)
        return -1;
    int n = zmq_recv(sock, buf, sizeof buf, 0);
    char err[128];
    return n > 0 && msg_decode(buf, (size_t)n, m, err, sizeof err) == 0 ? 0 : -1;
}

/* A stopped router: its inbox bound and never read. Keep sends are all queued; a plain send is
 * refused past the limit; the router then reads every kept message in order, none refused. */
static void test_outbox_keeps_a_stream(void **st)
{
    actor_t *d = s_actor("decode", ROLE_DECODE);
    assert_non_null(d);
    const topo_instance_t *ri = topo_find(actor_topo(d), "router");
    void *ctx = zmq_ctx_new(), *inbox = zmq_socket(ctx, ZMQ_ROUTER);
    int hwm = 1, linger = 0;
    zmq_setsockopt(inbox, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(inbox, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(inbox, ri->inbox_bind), 0);
    assert_int_equal(actor_outbox_cap(d), CAP);
    msg_t m;
    uint32_t tok;
    for (uint32_t i = 0; i < N; i++) {
        s_token(&m, 7, i, &tok);
        assert_int_equal(actor_send_keep(d, "router", &m), 0);
    }
    assert_true(actor_outbox_room(d, "router") < 0);   /* past the limit: kept, never refused */
    s_token(&m, 8, 0, &tok);
    assert_int_equal(actor_send(d, "router", &m), -1);  /* an ordinary send is refused */
    for (uint32_t i = 0; i < N; i++) {
        msg_t got;
        assert_int_equal(s_recv(d, inbox, 1, &got), 0);
        assert_int_equal(got.type, MSG_TOKEN);
        assert_int_equal(got.id, 7);
        assert_int_equal(got.u.token.seq, i);
        msg_free(&got);
    }
    assert_int_equal(actor_outbox_room(d, "router"), CAP);   /* drained */
    zmq_close(inbox);
    zmq_ctx_term(ctx);
    actor_destroy(&d);
    assert_null(d);
}

/* A client that does not read: the router's replies wait in its connection's backlog; past the
 * limit a plain reply is ACTOR_REFUSED, a keep one (a terminal reply) queued; the client then
 * reads everything but the refused one, in order. */
static void test_backlog_for_a_slow_client(void **st)
{
    actor_t *r = s_actor("router", ROLE_ROUTER);
    assert_non_null(r);
    void *clients = actor_bind_router(r, actor_topo(r)->endpoints.client, "endpoints.client");
    assert_non_null(clients);
    assert_int_equal(actor_reply_backlog(r, clients), 0);
    void *ctx = zmq_ctx_new(), *c = zmq_socket(ctx, ZMQ_DEALER);
    int hwm = 1, buf = 4096, linger = 0;
    zmq_setsockopt(c, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(c, ZMQ_RCVBUF, &buf, sizeof buf);
    zmq_setsockopt(c, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_connect(c, actor_topo(r)->endpoints.client), 0);
    /* The client says hello so the router knows its routing id. */
    msg_t hello;
    msg_init(&hello, MSG_CANCEL, 1);
    uint8_t frame[256];
    size_t len;
    char err[128];
    assert_int_equal(msg_encode(&hello, frame, sizeof frame, &len, err, sizeof err), 0);
    assert_int_equal(zmq_send(c, frame, len, 0), (int)len);
    actor_peer_t from = {.sock = clients};
    int n = -1;
    for (int tries = 0; tries < 100 && n < 0; tries++) {
        zmq_pollitem_t it = {.socket = clients, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 100) > 0)
            n = zmq_recv(clients, from.id, sizeof from.id, 0);
    }
    assert_true(n > 0);
    from.id_len = (size_t)n;
    zmq_recv(clients, frame, sizeof frame, 0);
    /* Replies until one is refused: the backlog is full. */
    msg_t m;
    uint32_t tok, sent = 0;
    int rc = 0;
    while (sent < N) {
        s_token(&m, 9, sent, &tok);
        rc = actor_reply_stream(r, &from, &m, 0);
        if (rc != 0)
            break;
        sent++;
    }
    assert_int_equal(rc, ACTOR_REFUSED);
    assert_true(sent >= CAP);
    msg_t done;
    msg_init(&done, MSG_DONE, 9);
    done.u.done.finish = MSG_FINISH_CANCELLED;
    assert_int_equal(actor_reply_stream(r, &from, &done, 1), 0);   /* terminal: kept */
    for (uint32_t i = 0; i <= sent; i++) {
        msg_t got;
        assert_int_equal(s_recv(r, c, 0, &got), 0);
        assert_int_equal(got.id, 9);
        if (i < sent) {
            assert_int_equal(got.type, MSG_TOKEN);
            assert_int_equal(got.u.token.seq, i);
        } else {
            assert_int_equal(got.type, MSG_DONE);
        }
        msg_free(&got);
    }
    zmq_close(c);
    zmq_ctx_term(ctx);
    actor_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outbox_keeps_a_stream),
        cmocka_unit_test(test_backlog_for_a_slow_client),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
