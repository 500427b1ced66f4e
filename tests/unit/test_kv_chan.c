/* The one transfer contract (kv_chan.h) on the CPU backend, between two pools of one shape: the
 * route each peer pair gets from the topology (shm on one node, tcp across nodes, never shm across
 * them); blocks sent by shm and by tcp arrive intact in the receiver's own block ids, scattered in
 * both pools; a tcp description that points at another host, or that is past its deadline, is
 * refused before a byte is read; a released transfer is gone (a late receiver is told, at once);
 * a description of another shape is refused by kvchan_check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/util.h"
#include "transfer/kv_chan.h"

static void *s_ctx;
static topo_node_t s_nodes[2] = {{.name = "a", .address = "127.0.0.1"}, {.name = "b", .address = "127.0.0.2"}};
static topo_instance_t s_inst[3] = {
    {.name = "prefill-0", .role = ROLE_PREFILL, .node = 1, .gpu = -1},
    {.name = "decode-0", .role = ROLE_DECODE, .node = 0, .gpu = -1},
    {.name = "decode-1", .role = ROLE_DECODE, .node = 1, .gpu = -1}};
static topo_t s_topo = {.name = "unitkvc", .nodes = s_nodes, .n_nodes = 2, .instances = s_inst, .n_instances = 3,
                        .multi_node = 1};

typedef struct pair {
    backend_t *be;
    kvpool_t *src, *dst;
    kvchan_t *tx, *rx;           /* the sender (prefill-0) and a receiver (decode-0 or decode-1) */
} pair_t;

static void s_pair(pair_t *p, int receiver)
{
    char err[256];
    p->be = backend_cpu_new(1);
    p->src = kvpool_new(16, 16, 2, 2, 8, DT_F32, p->be, err, sizeof err);
    p->dst = kvpool_new(16, 16, 2, 2, 8, DT_F32, p->be, err, sizeof err);
    assert_non_null(p->src);
    assert_non_null(p->dst);
    const size_t bb = kvpool_view(p->src)->block_bytes;
    for (int b = 0; b < 16; b++) {   /* every block its own pattern */
        uint8_t *q = kvpool_block_ptr(p->src, b);
        for (size_t i = 0; i < bb; i++)
            q[i] = (uint8_t)(b * 37 + i * 11 + 1);
        memset(kvpool_block_ptr(p->dst, b), 0xee, bb);
    }
    kvchan_cfg_t tx = {.be = p->be, .pool = p->src, .topo = &s_topo, .self = &s_inst[0], .cluster = "unitkvc",
                       .zmq_ctx = s_ctx};
    kvchan_cfg_t rx = tx;
    rx.pool = p->dst;
    rx.self = &s_inst[receiver];
    assert_non_null(p->tx = kvchan_new(&tx, err, sizeof err));
    assert_non_null(p->rx = kvchan_new(&rx, err, sizeof err));
}

static void s_unpair(pair_t *p)
{
    kvchan_destroy(&p->tx);
    kvchan_destroy(&p->rx);
    kvchan_destroy(&p->rx);   /* idempotent */
    kvpool_destroy(&p->src);
    kvpool_destroy(&p->dst);
    backend_destroy(&p->be);
}

static void test_route(void **st)
{
    pair_t p;
    s_pair(&p, 1);
    assert_int_equal(kvchan_route_to(p.tx, "decode-0"), MSG_CHAN_TCP);   /* another node */
    assert_int_equal(kvchan_route_to(p.tx, "decode-1"), MSG_CHAN_SHM);   /* the same node, CPU workers */
    assert_int_equal(kvchan_channel(p.tx, "decode-0"), MSG_CHAN_TCP);
    assert_int_equal(kvchan_fallback(p.tx, "decode-0"), MSG_CHAN_TCP);
    assert_int_equal(kvchan_fallback(p.tx, "decode-1"), MSG_CHAN_SHM);
    s_unpair(&p);
}

/* Sends blocks {9, 2, 14} by `ch`, receives them into {3, 7, 0}: the bytes of each land intact. */
static void s_move(pair_t *p, msg_channel_t ch, uint64_t id)
{
    char err[256];
    const int32_t from[3] = {9, 2, 14}, to[3] = {3, 7, 0};
    kvchan_out_t o;
    assert_int_equal(kvchan_send(p->tx, "decode-x", ch, id, 500 + id, from, 3, 5000, &o, err, sizeof err), 0);
    assert_int_equal(o.channel, ch);
    assert_int_equal(o.desc.channel, ch);
    assert_int_equal(o.desc.transfer_id, id);
    assert_int_equal(o.desc.request_id, 500 + id);
    assert_int_equal(o.desc.n_block_ids, 3);
    assert_string_equal(o.desc.src, "prefill-0");
    assert_int_equal(kvchan_test(p->tx, "decode-x", &o, err, sizeof err), 1);   /* only NCCL reads later */
    /* The description travels inside a handoff: through the codec, as the receiver gets it. */
    msg_t h, back;
    msg_init(&h, MSG_HANDOFF, 500 + id);
    static const uint32_t toks[40] = {1};
    h.u.handoff.tokens = toks;
    h.u.handoff.n_tokens = 40;
    h.u.handoff.kv_tokens = 40;
    h.u.handoff.block_size = 16;
    h.u.handoff.reply_to = "router";
    h.u.handoff.prefill_worker = "prefill-0";
    h.u.handoff.kv = &o.desc;
    h.u.handoff.n_kv = 1;
    uint8_t buf[4096];
    size_t len;
    assert_int_equal(msg_encode(&h, buf, sizeof buf, &len, err, sizeof err), 0);
    assert_int_equal(msg_decode(buf, len, &back, err, sizeof err), 0);
    const msg_kv_announce_t *d = &back.u.handoff.kv[0];
    assert_int_equal(kvchan_check(p->rx, d, err, sizeof err), 0);
    assert_int_equal(kvchan_recv(p->rx, d, to, 3, err, sizeof err), 0);
    kvchan_settle(p->rx, d);
    const size_t bb = kvpool_view(p->src)->block_bytes;
    for (int i = 0; i < 3; i++)
        assert_memory_equal(kvpool_block_ptr(p->dst, to[i]), kvpool_block_ptr(p->src, from[i]), bb);
    assert_int_equal(kvchan_count(p->rx, ch), 1);
    kvchan_acked(p->tx, ch);
    assert_int_equal(kvchan_count(p->tx, ch), 1);
    /* Released (the ack came): a late or repeated receive finds nothing, and says so. */
    kvchan_release(p->tx, &o);
    kvchan_release(p->tx, &o);   /* idempotent */
    assert_int_equal(kvchan_recv(p->rx, d, to, 3, err, sizeof err), -1);
    msg_free(&back);
}

static void test_shm_and_tcp_intact(void **st)
{
    pair_t p;
    s_pair(&p, 1);
    s_move(&p, MSG_CHAN_SHM, 11);
    s_move(&p, MSG_CHAN_TCP, 12);
    s_unpair(&p);
}

static void test_tcp_refusals(void **st)
{
    pair_t p;
    s_pair(&p, 1);
    char err[256];
    const int32_t blocks[2] = {1, 2};
    kvchan_out_t o;
    assert_int_equal(kvchan_send(p.tx, "decode-0", MSG_CHAN_TCP, 21, 1, blocks, 2, 5000, &o, err, sizeof err), 0);
    msg_kv_announce_t d = o.desc;
    /* The endpoint must be on the sender's node: 127.0.0.2 for prefill-0. */
    const char *elsewhere = "tcp://127.0.0.1:5555";
    d.handle = (const uint8_t *)elsewhere;
    d.handle_len = (uint32_t)strlen(elsewhere);
    assert_int_equal(kvchan_recv(p.rx, &d, blocks, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "not on the sender's node"));
    /* A sender the topology does not name. */
    d = o.desc;
    d.src = "stranger";
    assert_int_equal(kvchan_recv(p.rx, &d, blocks, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "does not name"));
    /* Past its deadline: refused at once, without asking. */
    d = o.desc;
    d.deadline_ms = (uint64_t)wall_ms() - 10;
    assert_int_equal(kvchan_recv(p.rx, &d, blocks, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "deadline passed"));
    /* A block count that is not the description's, and a shape that is not the pool's. */
    assert_int_equal(kvchan_recv(p.rx, &o.desc, blocks, 1, err, sizeof err), -1);
    d = o.desc;
    d.head_dim = 16;
    assert_int_equal(kvchan_check(p.rx, &d, err, sizeof err), -1);
    assert_int_equal(kvchan_count(p.rx, MSG_CHAN_TCP), 0);
    kvchan_release(p.tx, &o);
    s_unpair(&p);
}

int main(void)
{
    s_ctx = zmq_ctx_new();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_shm_and_tcp_intact),
        cmocka_unit_test(test_tcp_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    zmq_ctx_term(s_ctx);
    return rc;
}
