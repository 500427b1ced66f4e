/* Error replies between actors never storm (actors/runtime/actor.c, s_reject): an actor running
 * its loop (in a thread) is sent, by a raw peer posing as the cluster's router, error messages
 * valid, undecodable and multipart, and must answer none of them, not even from a handler that
 * tries to; and a peer that answers every error it gets with another bad message (two mismatched
 * versions) hears one error a second at most while its requests are still served. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/runtime/actor.h"
#include "common/util.h"
#include "tests/unit/actor_topo_harness.h"

enum { PROBE_ID = 999, N_ERRORS = 100, PROBES = 200 };

static atomic_int s_stop;

static int s_setup(void **st) { return actor_topo_setup("errors", ""); }

static int s_teardown(void **st) { return actor_topo_teardown(); }

/* The probe: a cancel, answered with a done of the same id (a request the actor keeps serving). */
static int s_on_cancel(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    msg_t d;
    msg_init(&d, MSG_DONE, m->id);
    d.u.done.finish = MSG_FINISH_CANCELLED;
    actor_reply(a, from, &d);
    return 0;
}

/* A handler that refuses the errors it gets with an error of its own: the runtime must stop it. */
static int s_on_error_answering(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "I do not take errors");
    return 0;
}

static int s_before_sleep(actor_t *a, void *state) { return atomic_load(&s_stop) ? -1 : 0; }

static const actor_handler_t s_plain[] = {{MSG_CANCEL, s_on_cancel}};
static const actor_handler_t s_answering[] = {{MSG_CANCEL, s_on_cancel}, {MSG_ERROR, s_on_error_answering}};

typedef struct harness {
    actor_t *a;                 /* "decode", run by `thread` */
    actor_ops_t ops;
    pthread_t thread;
    void *ctx;
    void *inbox;                /* ROUTER at the router's inbox: where the actor's replies come */
    void *out;                  /* DEALER named "router", connected to the actor's inbox */
} harness_t;

static void *s_run(void *arg)
{
    harness_t *h = arg;
    actor_run(h->a, &h->ops, NULL);
    return NULL;
}

static void s_start(harness_t *h, const actor_handler_t *handlers, size_t n)
{
    char *argv[] = {"test", "--topology", s_topo, "--name", "decode", NULL};
    h->a = actor_new(5, argv, ROLE_DECODE);
    assert_non_null(h->a);
    h->ops = (actor_ops_t){.handlers = handlers, .n_handlers = n, .before_sleep = s_before_sleep};
    const topo_t *t = actor_topo(h->a);
    h->ctx = zmq_ctx_new();
    h->inbox = zmq_socket(h->ctx, ZMQ_ROUTER);
    h->out = zmq_socket(h->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(h->inbox, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(h->out, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(h->out, ZMQ_ROUTING_ID, "router", 6);
    assert_int_equal(zmq_bind(h->inbox, topo_find(t, "router")->inbox_bind), 0);
    assert_int_equal(zmq_connect(h->out, topo_find(t, "decode")->inbox), 0);
    atomic_store(&s_stop, 0);
    assert_int_equal(pthread_create(&h->thread, NULL, s_run, h), 0);
}

static void s_send_frame(harness_t *h, const uint8_t *buf, size_t len, int more)
{
    assert_int_equal(zmq_send(h->out, buf, len, more ? ZMQ_SNDMORE : 0), (int)len);
}

static void s_send_msg(harness_t *h, const msg_t *m)
{
    uint8_t buf[1024];
    size_t len;
    char err[128];
    assert_int_equal(msg_encode(m, buf, sizeof buf, &len, err, sizeof err), 0);
    s_send_frame(h, buf, len, 0);
}

static void s_probe(harness_t *h, uint64_t id)
{
    msg_t c;
    msg_init(&c, MSG_CANCEL, id);
    s_send_msg(h, &c);
}

/* Bytes no decoder takes: not even a map (a peer of another protocol version, say). */
static void s_send_garbage(harness_t *h)
{
    static const uint8_t junk[] = {0xc1, 0x00, 0x42, 0x13};
    s_send_frame(h, junk, sizeof junk, 0);
}

/* The next reply the actor sent to "router"; -1 when none comes for 10 s (it is lost: the test
 * fails, it does not wait forever). */
static int s_reply(harness_t *h, msg_t *m)
{
    zmq_pollitem_t it = {.socket = h->inbox, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, 10000) <= 0)
        return -1;
    uint8_t buf[4096];
    if (zmq_recv(h->inbox, buf, sizeof buf, 0) < 0)
        return -1;
    int n = zmq_recv(h->inbox, buf, sizeof buf, 0);
    char err[128];
    return n > 0 && n <= (int)sizeof buf && msg_decode(buf, (size_t)n, m, err, sizeof err) == 0 ? 0 : -1;
}

static void s_stop_actor(harness_t *h)
{
    atomic_store(&s_stop, 1);
    s_probe(h, 1);   /* wakes the loop, which then stops */
    pthread_join(h->thread, NULL);
    zmq_close(h->inbox);
    zmq_close(h->out);
    zmq_ctx_term(h->ctx);
    actor_destroy(&h->a);
}

/* Errors of every kind, then a probe: the probe's done is the first reply (the actor handles its
 * inbox in order, so an answer to any of the errors would have come before it). Then a bad message
 * that is not an error is still answered with one. */
static void s_errors_unanswered(const actor_handler_t *handlers, size_t n)
{
    harness_t h;
    s_start(&h, handlers, n);
    uint8_t buf[1024];
    size_t len;
    char err[128];
    for (int i = 1; i <= N_ERRORS; i++) {
        msg_t e;
        msg_init(&e, MSG_ERROR, (uint64_t)i);
        e.u.error.code = MSG_ERR_MALFORMED;
        e.u.error.message = "malformed message: from a newer version";
        assert_int_equal(msg_encode(&e, buf, sizeof buf, &len, err, sizeof err), 0);
        s_send_frame(&h, buf, len, 0);              /* valid */
        s_send_frame(&h, buf, len - 1, 0);          /* cut short: undecodable, still shows its type */
        s_send_frame(&h, buf, len, 1);              /* two frames */
        s_send_frame(&h, buf, len, 0);
    }
    s_probe(&h, PROBE_ID);
    msg_t r;
    assert_int_equal(s_reply(&h, &r), 0);
    if (r.type == MSG_ERROR)
        print_error("answered error id=%llu with: %s\n", (unsigned long long)r.id, r.u.error.message);
    assert_int_equal(r.type, MSG_DONE);
    assert_int_equal(r.id, PROBE_ID);
    msg_free(&r);
    s_send_garbage(&h);
    assert_int_equal(s_reply(&h, &r), 0);
    assert_int_equal(r.type, MSG_ERROR);
    assert_int_equal(r.u.error.code, MSG_ERR_MALFORMED);
    msg_free(&r);
    s_stop_actor(&h);
}

static void test_errors_never_answered(void **st) { s_errors_unanswered(s_plain, ARRAY_LEN(s_plain)); }

static void test_handler_cannot_answer_an_error(void **st)
{
    s_errors_unanswered(s_answering, ARRAY_LEN(s_answering));
}

/* The storm: the peer answers every error with another bad message, and sends PROBES requests one
 * after another meanwhile. Every probe is served; the errors the actor sends are bounded by the
 * rate limit (one a second, plus one for the second that was going when it started), not by how
 * many bad messages the peer sent. Without the limit each error begets the next: one per round. */
static void test_bad_message_ping_pong_is_bounded(void **st)
{
    harness_t h;
    s_start(&h, s_plain, ARRAY_LEN(s_plain));
    const int64_t t0 = now_ms();
    s_send_garbage(&h);
    s_probe(&h, PROBE_ID);
    int probes = 0, errors = 0, bad_sent = 1;
    while (probes < PROBES) {
        msg_t r;
        assert_int_equal(s_reply(&h, &r), 0);
        if (r.type == MSG_ERROR) {
            errors++;
            s_send_garbage(&h);
            bad_sent++;
        } else {
            assert_int_equal(r.type, MSG_DONE);
            assert_int_equal(r.id, PROBE_ID);
            if (++probes < PROBES)
                s_probe(&h, PROBE_ID);
        }
        msg_free(&r);
    }
    const int64_t elapsed = now_ms() - t0;
    print_message("%d probes served in %lld ms; %d bad messages sent, %d errors back\n", probes,
                  (long long)elapsed, bad_sent, errors);
    assert_true(errors >= 1);   /* the first bad message is still answered */
    assert_true(errors <= 2 + (int)(elapsed / 1000));
    s_stop_actor(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors_never_answered),
        cmocka_unit_test(test_handler_cannot_answer_an_error),
        cmocka_unit_test(test_bad_message_ping_pong_is_bounded),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
