/* The network channel: staged bytes arrive intact; a dropped, unknown or mis-sized transfer is
 * refused with why; a sender that is gone or stalled costs the receiver its deadline and never a
 * hang, and the next transfer from a live sender still works; endpoints are checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/util.h"
#include "transfer/tcp_chan.h"

static void *s_ctx;

static uint8_t *s_pattern(size_t n, uint8_t seed)
{
    uint8_t *p = malloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31 + seed);
    return p;
}

static void test_roundtrip_and_drop(void **st)
{
    char err[256];
    tcpchan_server_t *s = tcpchan_server_new(s_ctx, "127.0.0.1", err, sizeof err);
    assert_non_null(s);
    assert_int_equal(tcpchan_endpoint_check(tcpchan_server_endpoint(s), "127.0.0.1", err, sizeof err), 0);
    const size_t n = 3u << 20;
    uint8_t *buf = s_pattern(n, 5), *want = s_pattern(n, 5), *got = calloc(1, n);
    assert_int_equal(tcpchan_put(s, 77, &buf, n), 0);
    assert_null(buf);
    uint8_t *again = s_pattern(16, 1);
    assert_int_equal(tcpchan_put(s, 77, &again, 16), -1);   /* one buffer per transfer id */
    assert_int_equal(tcpchan_staged(s), 1);
    tcpchan_client_t *c = tcpchan_client_new(s_ctx, 1 << 24);
    assert_int_equal(tcpchan_fetch(c, tcpchan_server_endpoint(s), 77, got, n, now_ms() + 5000, err, sizeof err), 0);
    assert_memory_equal(got, want, n);
    /* Fetched twice (a receiver that retries): the same bytes; a wrong size is refused. */
    assert_int_equal(tcpchan_fetch(c, tcpchan_server_endpoint(s), 77, got, n, now_ms() + 5000, err, sizeof err), 0);
    assert_int_equal(tcpchan_fetch(c, tcpchan_server_endpoint(s), 77, got, n - 1, now_ms() + 5000, err, sizeof err), -1);
    assert_non_null(strstr(err, "announced"));
    tcpchan_drop(s, 77);
    assert_int_equal(tcpchan_staged(s), 0);
    assert_int_equal(tcpchan_fetch(c, tcpchan_server_endpoint(s), 77, got, n, now_ms() + 5000, err, sizeof err), -1);
    assert_non_null(strstr(err, "no longer holds it"));
    assert_true(tcpchan_served(s) >= 4);
    tcpchan_client_destroy(&c);
    tcpchan_server_destroy(&s);
    tcpchan_server_destroy(&s);   /* idempotent */
    assert_null(s);
    free(want);
    free(got);
}

/* A sender that takes the request and never answers (a stalled process), and one that is not
 * there at all: both end at the deadline with a reason; the receiver then still fetches from a
 * live sender on a fresh socket. */
static void test_stalled_and_dead_sender(void **st)
{
    char err[256], ep[128];
    void *mute = zmq_socket(s_ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(mute, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(mute, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof ep;
    zmq_getsockopt(mute, ZMQ_LAST_ENDPOINT, ep, &len);
    tcpchan_client_t *c = tcpchan_client_new(s_ctx, 1 << 20);
    uint8_t got[64];
    int64_t t0 = now_ms();
    assert_int_equal(tcpchan_fetch(c, ep, 1, got, sizeof got, t0 + 300, err, sizeof err), -1);
    assert_non_null(strstr(err, "no reply"));
    assert_true(now_ms() >= t0 + 300);
    zmq_close(mute);   /* now nobody listens there */
    assert_int_equal(tcpchan_fetch(c, ep, 2, got, sizeof got, now_ms() + 200, err, sizeof err), -1);
    assert_non_null(strstr(err, "gone or stalled"));

    tcpchan_server_t *s = tcpchan_server_new(s_ctx, "127.0.0.1", err, sizeof err);
    uint8_t *buf = s_pattern(sizeof got, 9), *want = s_pattern(sizeof got, 9);
    assert_int_equal(tcpchan_put(s, 3, &buf, sizeof got), 0);
    assert_int_equal(tcpchan_fetch(c, tcpchan_server_endpoint(s), 3, got, sizeof got, now_ms() + 5000, err, sizeof err), 0);
    assert_memory_equal(got, want, sizeof got);
    /* Unknown transfer id: refused at once, not at the deadline. */
    assert_int_equal(tcpchan_fetch(c, tcpchan_server_endpoint(s), 4, got, sizeof got, now_ms() + 5000, err, sizeof err), -1);
    assert_non_null(strstr(err, "no longer holds it"));
    free(want);
    tcpchan_server_destroy(&s);
    tcpchan_client_destroy(&c);
}

static void test_endpoint_check(void **st)
{
    char err[256];
    assert_int_equal(tcpchan_endpoint_check("tcp://127.0.0.2:5601", "127.0.0.2", err, sizeof err), 0);
    assert_int_equal(tcpchan_endpoint_check("tcp://127.0.0.2:5601", NULL, err, sizeof err), 0);
    assert_int_equal(tcpchan_endpoint_check("tcp://127.0.0.3:5601", "127.0.0.2", err, sizeof err), -1);
    assert_non_null(strstr(err, "not on the sender's node"));
    assert_int_equal(tcpchan_endpoint_check("tcp://127.0.0.22:5601", "127.0.0.2", err, sizeof err), -1);
    const char *bad[] = {"ipc:///tmp/x", "tcp://:5601", "tcp://127.0.0.1:", "tcp://127.0.0.1:56a1", "tcp://*:5601",
                         "tcp://a b:1", "tcp://127.0.0.1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(tcpchan_endpoint_check(bad[i], NULL, err, sizeof err), -1);
    char err2[256];
    tcpchan_client_t *c = tcpchan_client_new(s_ctx, 1024);
    uint8_t b[8];
    assert_int_equal(tcpchan_fetch(c, "ipc:///tmp/x", 1, b, sizeof b, now_ms() + 1000, err2, sizeof err2), -1);
    tcpchan_client_destroy(&c);
}

int main(void)
{
    s_ctx = zmq_ctx_new();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_and_drop),
        cmocka_unit_test(test_stalled_and_dead_sender),
        cmocka_unit_test(test_endpoint_check),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    zmq_ctx_term(s_ctx);
    return rc;
}
