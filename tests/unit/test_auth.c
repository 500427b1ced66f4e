/* tests/unit/test_auth.c — CURVE key files, the ZAP handler and who may send what to an inbox. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "actors/runtime/actor.h"
#include "actors/runtime/auth.h"
#include "common/util.h"

static char s_dir[64];

static void s_path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", s_dir, name); }

static void s_write(const char *name, const char *text)
{
    char p[128];
    s_path(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int s_setup(void **state)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/test_auth.XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_key_files(void **state)
{
    if (!auth_curve_available())
        skip();
    char pub[128], sec[128], z85[AUTH_Z85_LEN + 1], err[512];
    s_path(pub, sizeof pub, "a.pub");
    s_path(sec, sizeof sec, "a.key");
    auth_keypair_t kp;
    assert_int_equal(auth_keypair_generate(pub, sec, &kp, err, sizeof err), 0);
    struct stat st;
    assert_int_equal(stat(sec, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(pub, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(auth_key_read(pub, z85, err, sizeof err), 0);
    assert_string_equal(z85, kp.pub);
    assert_int_equal(auth_key_read(sec, z85, err, sizeof err), 0);
    assert_string_equal(z85, kp.sec);

    s_write("junk.pub", "# a comment\n\nnot a key\n");
    s_path(pub, sizeof pub, "junk.pub");
    assert_int_equal(auth_key_read(pub, z85, err, sizeof err), -1);
    assert_non_null(strstr(err, "junk.pub:3: not a Z85 CURVE key"));
    s_path(pub, sizeof pub, "missing.pub");
    assert_int_equal(auth_key_read(pub, z85, err, sizeof err), -1);
    assert_non_null(strstr(err, "missing.pub"));
    s_write("empty.pub", "# nothing\n");
    s_path(pub, sizeof pub, "empty.pub");
    assert_int_equal(auth_key_read(pub, z85, err, sizeof err), -1);
    assert_non_null(strstr(err, "no key"));
}

static void test_allow_file(void **state)
{
    if (!auth_curve_available())
        skip();
    char a[AUTH_Z85_LEN + 1], as[AUTH_Z85_LEN + 1], b[AUTH_Z85_LEN + 1], bs[AUTH_Z85_LEN + 1], text[256], p[128], err[512];
    zmq_curve_keypair(a, as);
    zmq_curve_keypair(b, bs);
    snprintf(text, sizeof text, "# clients\n%s\n\n%s  \n", a, b);
    s_write("clients", text);
    void *ctx = zmq_ctx_new();
    auth_t *au = auth_new(ctx, err, sizeof err);
    assert_non_null(au);
    s_path(p, sizeof p, "clients");
    assert_int_equal(auth_allow_file(au, "clients", p, err, sizeof err), 2);
    snprintf(text, sizeof text, "%s\n%.39s\n", a, b);
    s_write("bad", text);
    s_path(p, sizeof p, "bad");
    assert_int_equal(auth_allow_file(au, "clients", p, err, sizeof err), -1);
    assert_non_null(strstr(err, "bad:2: not a Z85"));
    /* One handler per context. */
    assert_null(auth_new(ctx, err, sizeof err));
    auth_destroy(&au);
    assert_null(au);
    zmq_ctx_term(ctx);
}

/* A DEALER to ep: CURVE with kp (server key server) when kp is not NULL, plain otherwise. */
static void *s_dealer(void *ctx, const char *ep, const auth_keypair_t *kp, const char *server)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    if (kp)
        assert_int_equal(auth_client(d, kp, server), 0);
    assert_int_equal(zmq_connect(d, ep), 0);
    zmq_send(d, "hi", 2, ZMQ_DONTWAIT);
    return d;
}

/* The next payload at the ROUTER within ms, with its User-Id copied to uid; 0 if none came. */
static int s_recv(void *router, int ms, char *uid, size_t cap)
{
    zmq_pollitem_t it = {.socket = router, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, ms) <= 0)
        return 0;
    zmq_msg_t part;
    zmq_msg_init(&part);
    zmq_msg_recv(&part, router, 0);   /* routing id */
    zmq_msg_close(&part);
    zmq_msg_init(&part);
    zmq_msg_recv(&part, router, 0);
    const char *u = zmq_msg_gets(&part, "User-Id");
    snprintf(uid, cap, "%s", u ? u : "");
    zmq_msg_close(&part);
    return 1;
}

static void test_zap(void **state)
{
    if (!auth_curve_available())
        skip();
    char err[512], ep[128], uid[64];
    void *ctx = zmq_ctx_new();
    auth_keypair_t server, alice, mallory;
    zmq_curve_keypair(server.pub, server.sec);
    zmq_curve_keypair(alice.pub, alice.sec);
    zmq_curve_keypair(mallory.pub, mallory.sec);
    auth_t *au = auth_new(ctx, err, sizeof err);
    assert_non_null(au);
    assert_int_equal(auth_allow(au, "clients", alice.pub, "alice"), 0);
    assert_int_equal(auth_allow(au, "cluster", mallory.pub, "decode-0"), 0);   /* another domain */
    assert_int_equal(auth_allow(au, "clients", "short", "x"), -1);
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(auth_server(r, &server, "clients"), 0);
    assert_int_equal(auth_watch(au, r, "test endpoint"), 0);
    assert_int_equal(auth_start(au, err, sizeof err), 0);
    assert_int_equal(zmq_bind(r, "tcp://127.0.0.1:*"), 0);
    size_t n = sizeof ep;
    zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, ep, &n);

    /* The allowed key gets in, and its messages carry the name it was allowed as. */
    void *a = s_dealer(ctx, ep, &alice, server.pub);
    assert_int_equal(s_recv(r, 5000, uid, sizeof uid), 1);
    assert_string_equal(uid, "alice");
    /* A key allowed only in another domain, and a plaintext peer: refused, counted. */
    void *m = s_dealer(ctx, ep, &mallory, server.pub);
    void *p = s_dealer(ctx, ep, NULL, NULL);
    for (int i = 0; i < 100 && auth_refused(au) < 2; i++)
        usleep(50000);
    assert_true(auth_refused(au) >= 2);
    assert_int_equal(s_recv(r, 300, uid, sizeof uid), 0);
    zmq_close(a);
    zmq_close(m);
    zmq_close(p);
    zmq_close(r);
    auth_destroy(&au);
    zmq_ctx_term(ctx);
}

static void test_may_send(void **state)
{
    assert_true(actor_may_send(ROLE_ROUTER, MSG_CANCEL));
    assert_false(actor_may_send(ROLE_DECODE, MSG_CANCEL));
    assert_false(actor_may_send(ROLE_MONITOR, MSG_PREFILL_REQUEST));
    assert_true(actor_may_send(ROLE_DECODE, MSG_TOKEN));
    assert_true(actor_may_send(ROLE_PREFILL, MSG_DONE));
    assert_false(actor_may_send(ROLE_CACHE_MANAGER, MSG_DONE));
    assert_false(actor_may_send(ROLE_ROUTER, MSG_SUBMIT));
    assert_false(actor_may_send(ROLE_ROUTER, MSG_HEARTBEAT));
    assert_false(actor_may_send(ROLE_DECODE, MSG_STATS));
    assert_false(actor_may_send(ROLE_ROUTER, MSG_CACHE_EVENT));
    assert_true(actor_may_send(ROLE_CACHE_MANAGER, MSG_CACHE_EVENT));
    assert_true(actor_may_send(ROLE_CACHE_MANAGER, MSG_KV_ACK));   /* not restricted: any actor */
    assert_false(actor_may_send(ROLE_COUNT, MSG_KV_ACK));          /* but an actor */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_files),
        cmocka_unit_test(test_allow_file),
        cmocka_unit_test(test_zap),
        cmocka_unit_test(test_may_send),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
