/* The network channel: staged bytes arrive intact; a dropped, unknown or mis-sized transfer is
 * refused with why; a sender that is gone or stalled costs the receiver its deadline and never a
 * hang, and the next transfer from a live sender still works; endpoints are checked. With CURVE:
 * the intended receiver gets the exact bytes; another actor's key, a key outside the cluster, a
 * wrong sender key and a plaintext peer are refused at once with why; a byte flipped on the wire
 * (a proxy in the middle) is detected and nothing is taken, where plaintext takes the flipped bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/runtime/auth.h"
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

/* ---- CURVE ------------------------------------------------------------------------------- */

typedef struct keys {
    char pub[41], sec[41];
} keys_t;

static keys_t s_keys(void)
{
    keys_t k;
    assert_int_equal(zmq_curve_keypair(k.pub, k.sec), 0);
    return k;
}

/* A ZAP handler admitting "decode-0" and "decode-1" (domain cluster), as an actor's does. */
static auth_t *s_zap(const keys_t *d0, const keys_t *d1, const keys_t *sender)
{
    char err[256];
    auth_t *au = auth_new(s_ctx, err, sizeof err);
    assert_non_null(au);
    assert_int_equal(auth_allow(au, "cluster", d0->pub, "decode-0"), 0);
    assert_int_equal(auth_allow(au, "cluster", d1->pub, "decode-1"), 0);
    assert_int_equal(auth_allow(au, "cluster", sender->pub, "prefill"), 0);
    assert_int_equal(auth_start(au, err, sizeof err), 0);
    return au;
}

static tcpchan_client_t *s_client(const keys_t *k)
{
    tcpchan_client_t *c = tcpchan_client_new(s_ctx, 1 << 24);
    if (k)
        assert_int_equal(tcpchan_client_curve(c, k->pub, k->sec), 0);
    return c;
}

static void test_curve_receiver_only(void **st)
{
    char err[512];
    keys_t snd = s_keys(), d0 = s_keys(), d1 = s_keys(), mallory = s_keys();
    auth_t *au = s_zap(&d0, &d1, &snd);
    tcpchan_server_t *s = tcpchan_server_new_curve(s_ctx, "127.0.0.1", snd.sec, err, sizeof err);
    assert_non_null(s);
    const char *ep = tcpchan_server_endpoint(s);
    const size_t n = 1u << 20;
    uint8_t *buf = s_pattern(n, 3), *want = s_pattern(n, 3), *got = calloc(1, n);
    assert_int_equal(tcpchan_put_for(s, 9, &buf, n, "decode-0"), 0);

    tcpchan_client_t *c0 = s_client(&d0);
    assert_int_equal(tcpchan_fetch_from(c0, ep, snd.pub, 9, got, n, now_ms() + 5000, err, sizeof err), 0);
    assert_memory_equal(got, want, n);

    /* Another actor of the cluster: its key is admitted, the transfer is not its. */
    tcpchan_client_t *c1 = s_client(&d1);
    memset(got, 0, n);
    int64_t t0 = now_ms();
    assert_int_equal(tcpchan_fetch_from(c1, ep, snd.pub, 9, got, n, now_ms() + 5000, err, sizeof err), -1);
    print_message("      decode-1: %s\n", err);
    assert_non_null(strstr(err, "refused it to us"));
    assert_true(tcpchan_refused(s) == 1);

    /* A key outside the cluster: refused by the ZAP handler, at once. */
    tcpchan_client_t *cm = s_client(&mallory);
    assert_int_equal(tcpchan_fetch_from(cm, ep, snd.pub, 9, got, n, now_ms() + 5000, err, sizeof err), -1);
    print_message("      outside key: %s\n", err);
    assert_non_null(strstr(err, "refused our CURVE key"));

    /* The right receiver, told the wrong sender key (an impostor's endpoint): the handshake fails. */
    tcpchan_client_t *cw = s_client(&d0);
    assert_int_equal(tcpchan_fetch_from(cw, ep, d1.pub, 9, got, n, now_ms() + 5000, err, sizeof err), -1);
    print_message("      wrong sender key: %s\n", err);
    assert_non_null(strstr(err, "handshake"));

    /* A plaintext receiver at a CURVE sender: no bytes. */
    tcpchan_client_t *cp = s_client(NULL);
    assert_int_equal(tcpchan_fetch(cp, ep, 9, got, n, now_ms() + 1500, err, sizeof err), -1);
    print_message("      plaintext: %s\n", err);
    assert_true(now_ms() - t0 < 4000);   /* all refused at once, bar the plaintext one's deadline */
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], 0);     /* nothing was written by any of them */

    /* And the right one still works after all that. */
    if (tcpchan_fetch_from(c0, ep, snd.pub, 9, got, n, now_ms() + 5000, err, sizeof err) != 0)
        fail_msg("the right receiver, again: %s", err);
    assert_memory_equal(got, want, n);
    tcpchan_client_destroy(&c0);
    tcpchan_client_destroy(&c1);
    tcpchan_client_destroy(&cm);
    tcpchan_client_destroy(&cw);
    tcpchan_client_destroy(&cp);
    tcpchan_server_destroy(&s);
    auth_destroy(&au);
    free(want);
    free(got);
}

/* A man in the middle that flips one bit of the sender-to-receiver stream at byte FLIP_AT of every
 * connection it relays. */
#define FLIP_AT 200000
typedef struct proxy {
    int lfd, port, target;
    _Atomic int stop;
    pthread_t th;
} proxy_t;

static void *s_proxy_run(void *arg)
{
    proxy_t *px = arg;
    while (!atomic_load(&px->stop)) {
        struct pollfd lp = {.fd = px->lfd, .events = POLLIN};
        if (poll(&lp, 1, 50) <= 0)
            continue;
        int a = accept(px->lfd, NULL, NULL);
        if (a < 0)
            continue;
        int b = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)px->target)};
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(b, (struct sockaddr *)&to, sizeof to) != 0) {
            close(a);
            close(b);
            continue;
        }
        size_t down = 0;   /* bytes relayed from the sender */
        uint8_t buf[65536];
        while (!atomic_load(&px->stop)) {
            struct pollfd fds[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
            if (poll(fds, 2, 50) <= 0)
                continue;
            if (fds[0].revents) {
                ssize_t k = read(a, buf, sizeof buf);
                if (k <= 0 || write(b, buf, (size_t)k) != k)
                    break;
            }
            if (fds[1].revents) {
                ssize_t k = read(b, buf, sizeof buf);
                if (k <= 0)
                    break;
                if (down <= FLIP_AT && FLIP_AT < down + (size_t)k)
                    buf[FLIP_AT - down] ^= 0x10;
                down += (size_t)k;
                if (write(a, buf, (size_t)k) != k)
                    break;
            }
        }
        close(a);
        close(b);
    }
    return NULL;
}

static void s_proxy_start(proxy_t *px, const char *target_ep)
{
    memset(px, 0, sizeof *px);
    px->target = atoi(strrchr(target_ep, ':') + 1);
    px->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in at = {.sin_family = AF_INET};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(px->lfd, (struct sockaddr *)&at, sizeof at), 0);
    assert_int_equal(listen(px->lfd, 4), 0);
    socklen_t len = sizeof at;
    getsockname(px->lfd, (struct sockaddr *)&at, &len);
    px->port = ntohs(at.sin_port);
    assert_int_equal(pthread_create(&px->th, NULL, s_proxy_run, px), 0);
}

static void s_proxy_stop(proxy_t *px)
{
    atomic_store(&px->stop, 1);
    pthread_join(px->th, NULL);
    close(px->lfd);
}

static void test_tampered_frames(void **st)
{
    char err[512], ep[64];
    const size_t n = 1u << 20;
    uint8_t *want = s_pattern(n, 11), *got = calloc(1, n);
    /* Plaintext, the control: the flipped bit is taken as data. */
    tcpchan_server_t *s = tcpchan_server_new(s_ctx, "127.0.0.1", err, sizeof err);
    uint8_t *buf = s_pattern(n, 11);
    assert_int_equal(tcpchan_put(s, 5, &buf, n), 0);
    proxy_t px;
    s_proxy_start(&px, tcpchan_server_endpoint(s));
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", px.port);
    tcpchan_client_t *c = s_client(NULL);
    if (tcpchan_fetch(c, ep, 5, got, n, now_ms() + 5000, err, sizeof err) != 0)
        fail_msg("plaintext through the proxy: %s", err);
    assert_memory_not_equal(got, want, n);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += got[i] != want[i];
    assert_int_equal(diff, 1);
    tcpchan_client_destroy(&c);
    s_proxy_stop(&px);
    tcpchan_server_destroy(&s);

    /* CURVE: the frame fails its MAC; the fetch fails at once and writes nothing. */
    keys_t snd = s_keys(), d0 = s_keys(), d1 = s_keys();
    auth_t *au = s_zap(&d0, &d1, &snd);
    s = tcpchan_server_new_curve(s_ctx, "127.0.0.1", snd.sec, err, sizeof err);
    buf = s_pattern(n, 11);
    assert_int_equal(tcpchan_put_for(s, 6, &buf, n, "decode-0"), 0);
    s_proxy_start(&px, tcpchan_server_endpoint(s));
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", px.port);
    c = s_client(&d0);
    memset(got, 0, n);
    int64_t t0 = now_ms();
    assert_int_equal(tcpchan_fetch_from(c, ep, snd.pub, 6, got, n, now_ms() + 5000, err, sizeof err), -1);
    print_message("      tampered: %s (%lld ms)\n", err, (long long)(now_ms() - t0));
    assert_true(strstr(err, "authentication") != NULL || strstr(err, "cut mid-transfer") != NULL);
    assert_true(now_ms() - t0 < 4000);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], 0);
    /* Without the man in the middle the same transfer arrives exact. */
    assert_int_equal(tcpchan_fetch_from(c, tcpchan_server_endpoint(s), snd.pub, 6, got, n, now_ms() + 5000, err,
                                        sizeof err), 0);
    assert_memory_equal(got, want, n);
    tcpchan_client_destroy(&c);
    s_proxy_stop(&px);
    tcpchan_server_destroy(&s);
    auth_destroy(&au);
    free(want);
    free(got);
}

int main(void)
{
    s_ctx = zmq_ctx_new();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_and_drop),
        cmocka_unit_test(test_stalled_and_dead_sender),
        cmocka_unit_test(test_endpoint_check),
        cmocka_unit_test(test_curve_receiver_only),
        cmocka_unit_test(test_tampered_frames),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    zmq_ctx_term(s_ctx);
    return rc;
}
