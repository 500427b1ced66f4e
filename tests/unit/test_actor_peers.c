/* An actor's sockets to peers it never sends to (the monitor's, the expert-balancer's to routers and
 * workers) while those peers restart again and again: libzmq frees the pipes of an ended
 * connection only when the application calls that socket, so without actor_tend_peers each restart
 * kept about 16 KiB for good (the 30-minute nemesis: an expert-balancer from 8.9 to 20.9 MB over
 * about 900 restarts). Here a "router" inbox is bound and closed PEERS times under an actor that
 * only connects to it; the heap in use may not grow by more than a few restarts' worth. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/runtime/actor.h"
#include "common/util.h"
#include "tests/unit/actor_topo_harness.h"

enum { RESTARTS = 40 };

static int s_setup(void **st) { return actor_topo_setup("peers", ""); }

static int s_teardown(void **st) { return actor_topo_teardown(); }

/* Binds endpoint, waits (up to 5 s) until a connection to it has completed its handshake, then
 * closes it: one incarnation of the peer. */
static int s_one_incarnation(void *ctx, const char *endpoint, int k)
{
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://peer-incarnation-%d", k);
    if (zmq_socket_monitor(s, mon_ep, ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0 || zmq_bind(s, endpoint) != 0)
        return -1;
    void *mon = zmq_socket(ctx, ZMQ_PAIR);
    zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(mon, mon_ep);
    zmq_pollitem_t it = {.socket = mon, .events = ZMQ_POLLIN};
    int up = zmq_poll(&it, 1, 5000) == 1;
    zmq_socket_monitor(s, NULL, 0);
    zmq_close(mon);
    zmq_close(s);
    return up ? 0 : -1;
}

static void test_idle_peer_restarts_keep_nothing(void **st)
{
    char *argv[] = {"test", "--topology", s_topo, "--name", "monitor", NULL};
    actor_t *a = actor_new(5, argv, ROLE_MONITOR);
    assert_non_null(a);
    const topo_instance_t *ri = topo_find(actor_topo(a), "router");
    assert_int_equal(actor_outbox_room(a, "router"), actor_outbox_cap(a));   /* connects, sends nothing */
    void *ctx = zmq_ctx_new();
    size_t before = 0;
    for (int k = 0; k < RESTARTS; k++) {
        assert_int_equal(s_one_incarnation(ctx, ri->inbox_bind, k), 0);
        actor_tend_peers(a);   /* the loop does it once a second */
        if (k == 4)
            before = mallinfo2().uordblks;   /* after the first few: libzmq's one-off allocations */
    }
    usleep(200 * 1000);
    actor_tend_peers(a);
    const size_t after = mallinfo2().uordblks;
    const long grown = (long)after - (long)before;
    printf("heap in use over %d restarts of an idle peer: %+ld bytes\n", RESTARTS - 5, grown);
    assert_true(grown < 4 * 16384);   /* without the tending: about 16 KiB per restart */
    zmq_ctx_term(ctx);
    actor_destroy(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_peer_restarts_keep_nothing),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
