/* kv_link + nccl_chan without a GPU: the NCCL hooks of a backend are replaced by a fake fabric in
 * host memory (communicators of one unique id see each other; the k-th send of one rank to another
 * pairs with the k-th receive posted there, bytes copied when both exist, a size mismatch an error),
 * so the whole protocol runs here: the channel each hand-off takes, the kv_link bootstrap over
 * real encoded messages, sends and receives of KV blocks checked byte for byte, a refused hand-off
 * still taking its bytes off the link, a broken order, deadlines that abort (and say who and what),
 * init that never completes, the retry delay, a replaced link, a backend without NCCL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transfer/kv_link.h"
#include "transfer/kv_transfer.h"
#include "transfer/nccl_chan.h"
#include "common/util.h"

/* ---- the fake fabric ------------------------------------------------------------------------ */

#define FAKE_COMMS 8
#define FAKE_OPS 4096

typedef struct fake_op {
    int64_t ticket;
    void *dev;
    size_t bytes;
    int done;
} fake_op_t;

struct bk_comm {
    uint64_t key;                 /* the unique id's first 8 bytes */
    int rank, n_ranks;
    fake_op_t sends[FAKE_OPS], recvs[FAKE_OPS];   /* to / from the other rank (or self), posting order */
    int n_sends, n_recvs, m_sends, m_recvs;       /* posted, matched */
    int64_t next;
    int error;
};

static struct {
    bk_comm_t *comms[FAKE_COMMS];
    uint64_t next_key;
    int hang;                     /* nothing matches: every transfer stays in flight */
    int busy;                     /* xfer posts nothing and says so; the communicator stays well */
    int aborts;                   /* comm_abort calls */
    int inits;
} g_fab;

static int s_fake_unique_id(uint8_t id[BK_NCCL_ID_BYTES], char *err, size_t errlen)
{
    memset(id, 0, BK_NCCL_ID_BYTES);
    uint64_t k = ++g_fab.next_key;
    memcpy(id, &k, sizeof k);
    return 0;
}

static bk_comm_t *s_fake_init(backend_t *be, const uint8_t id[BK_NCCL_ID_BYTES], int n_ranks, int rank, char *err,
                              size_t errlen)
{
    for (int i = 0; i < FAKE_COMMS; i++)
        if (!g_fab.comms[i]) {
            bk_comm_t *c = calloc(1, sizeof *c);
            memcpy(&c->key, id, sizeof c->key);
            c->rank = rank;
            c->n_ranks = n_ranks;
            g_fab.comms[i] = c;
            g_fab.inits++;
            return c;
        }
    errf(err, errlen, "fake: too many communicators");
    return NULL;
}

static bk_comm_t *s_other(const bk_comm_t *c)
{
    if (c->n_ranks == 1)
        return (bk_comm_t *)c;
    for (int i = 0; i < FAKE_COMMS; i++)
        if (g_fab.comms[i] && g_fab.comms[i] != c && g_fab.comms[i]->key == c->key)
            return g_fab.comms[i];
    return NULL;
}

static int s_fake_poll(bk_comm_t *c, char *err, size_t errlen) { return s_other(c) ? 1 : 0; }

/* Pairs c's sends with its peer's receives, in order. */
static void s_match(bk_comm_t *c)
{
    bk_comm_t *o = s_other(c);
    if (!o || g_fab.hang)
        return;
    bk_comm_t *pairs[2][2] = {{c, o}, {o, c}};
    for (int p = 0; p < 2; p++) {
        bk_comm_t *s = pairs[p][0], *r = pairs[p][1];
        while (s->m_sends < s->n_sends && r->m_recvs < r->n_recvs) {
            fake_op_t *a = &s->sends[s->m_sends++], *b = &r->recvs[r->m_recvs++];
            if (a->bytes != b->bytes) {
                s->error = r->error = 1;   /* NCCL: message truncated */
                return;
            }
            memcpy(b->dev, a->dev, a->bytes);
            a->done = b->done = 1;
        }
    }
}

static int64_t s_fake_xfer(bk_comm_t *c, int peer, const bk_span_t *sends, int n_sends, const bk_span_t *recvs,
                           int n_recvs, char *err, size_t errlen)
{
    if (g_fab.busy)
        return errf(err, errlen, "fake: an earlier transfer is still being enqueued");
    if (c->n_sends + n_sends > FAKE_OPS || c->n_recvs + n_recvs > FAKE_OPS)
        return errf(err, errlen, "fake: too many ops");
    int64_t t = c->next++;
    for (int i = 0; i < n_sends; i++)
        c->sends[c->n_sends++] = (fake_op_t){t, sends[i].dev, sends[i].bytes, 0};
    for (int i = 0; i < n_recvs; i++)
        c->recvs[c->n_recvs++] = (fake_op_t){t, recvs[i].dev, recvs[i].bytes, 0};
    s_match(c);
    return t;
}

static int s_fake_xfer_poll(bk_comm_t *c, int64_t ticket, char *err, size_t errlen)
{
    s_match(c);
    if (c->error)
        return errf(err, errlen, "fake: message truncated");
    for (int i = 0; i < c->n_sends; i++)
        if (c->sends[i].ticket <= ticket && !c->sends[i].done)
            return 0;
    for (int i = 0; i < c->n_recvs; i++)
        if (c->recvs[i].ticket <= ticket && !c->recvs[i].done)
            return 0;
    return 1;
}

static void s_fake_abort(bk_comm_t **cp)
{
    for (int i = 0; i < FAKE_COMMS; i++)
        if (g_fab.comms[i] == *cp)
            g_fab.comms[i] = NULL;
    free(*cp);
    *cp = NULL;
    g_fab.aborts++;
}

static const bk_nccl_ops_t s_fake_nccl = {
    .unique_id = s_fake_unique_id,
    .comm_init = s_fake_init,
    .comm_poll = s_fake_poll,
    .xfer = s_fake_xfer,
    .xfer_poll = s_fake_xfer_poll,
    .comm_abort = s_fake_abort,
};

/* Two "GPU" backends: the CPU backend's table (host memory) plus the fake NCCL hooks. */
static backend_t *s_cpu;
static backend_ops_t s_fake_ops;
static backend_t s_be_p, s_be_d;

/* ---- the control plane: kv_link messages, encoded, queued, decoded on delivery ------------- */

typedef struct wire {
    char to[64];
    uint8_t frame[4096];
    size_t len;
} wire_t;
static wire_t g_wire[32];
static int g_n_wire;

static int s_send(void *ctx, const char *to, const msg_t *m)
{
    char err[256];
    assert_true(g_n_wire < 32);
    wire_t *w = &g_wire[g_n_wire];
    if (msg_encode(m, w->frame, sizeof w->frame, &w->len, err, sizeof err) != 0)
        fail_msg("kv_link does not encode: %s", err);
    snprintf(w->to, sizeof w->to, "%s", to);
    g_n_wire++;
    return 0;
}

/* Decodes the queued message i (checking it is a kv_link to `to`). */
static void s_take_msg(int i, const char *to, msg_t *m)
{
    char err[256];
    assert_true(i < g_n_wire);
    assert_string_equal(g_wire[i].to, to);
    if (msg_decode(g_wire[i].frame, g_wire[i].len, m, err, sizeof err) != 0)
        fail_msg("kv_link does not decode: %s", err);
    assert_int_equal(m->type, MSG_KV_LINK);
}

/* Delivers the messages queued so far to their addressees (P = "prefill-0", D = "decode-1");
 * the answers they cause stay queued. */
static void s_deliver(kvlinks_t *p, kvlinks_t *d)
{
    int n = g_n_wire;
    for (int i = 0; i < n; i++) {
        msg_t m;
        s_take_msg(i, g_wire[i].to, &m);
        kvlinks_on_msg(strcmp(g_wire[i].to, "decode-1") == 0 ? d : p, &m);
        msg_free(&m);
    }
    memmove(g_wire, g_wire + n, (size_t)(g_n_wire - n) * sizeof *g_wire);
    g_n_wire -= n;
}

/* ---- pools ------------------------------------------------------------------------------------ */

static bk_kv_t s_pool(int n_blocks, uint8_t salt)
{
    bk_kv_t kv = {.dtype = DT_BF16, .n_blocks = n_blocks, .block_size = 4, .n_layers = 2, .n_kv_heads = 2,
                  .head_dim = 8};
    kv.block_bytes = (size_t)kv.n_layers * 2 * kv.block_size * kv.n_kv_heads * kv.head_dim * 2;
    kv.base = malloc((size_t)n_blocks * kv.block_bytes);
    for (size_t i = 0; i < (size_t)n_blocks * kv.block_bytes; i++)
        ((uint8_t *)kv.base)[i] = (uint8_t)(i * 31 + salt);
    return kv;
}

static const uint8_t *s_block(const bk_kv_t *kv, int b) { return (const uint8_t *)kv->base + (size_t)b * kv->block_bytes; }

static const kvlink_cfg_t s_cfg = {.init_timeout_ms = 300, .send_timeout_ms = 60, .recv_timeout_ms = 60, .retry_ms = 150};

static int setup(void **st)
{
    s_cpu = backend_cpu_new(1);
    s_fake_ops = *s_cpu->ops;
    s_fake_ops.name = "fake-gpu";
    s_fake_ops.nccl = &s_fake_nccl;
    s_be_p = (backend_t){.ops = &s_fake_ops, .n_threads = 1, .impl = s_cpu->impl};
    s_be_d = s_be_p;
    return 0;
}

static int teardown(void **st)
{
    backend_destroy(&s_cpu);
    return 0;
}

static void s_reset(void)
{
    memset(&g_fab, 0, sizeof g_fab);
    g_n_wire = 0;
}

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* P offers, D joins, both poll until READY. */
static void s_link_up(kvlinks_t *p, kvlinks_t *d)
{
    assert_int_equal(kvlinks_channel(p, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);   /* not up yet */
    assert_int_equal(g_n_wire, 1);
    msg_t offer;
    s_take_msg(0, "decode-1", &offer);
    assert_int_equal(offer.u.kv_link.status, MSG_ACK_OK);
    assert_int_equal(offer.u.kv_link.channel, MSG_CHAN_NCCL);
    assert_int_equal(offer.u.kv_link.handle_len, TCHAN_NCCL_ID_BYTES);
    assert_int_equal(offer.u.kv_link.rank, 1);
    assert_int_equal(offer.u.kv_link.n_ranks, 2);
    assert_string_equal(offer.u.kv_link.src, "prefill-0");
    assert_true(offer.u.kv_link.deadline_ms > (uint64_t)wall_ms());
    msg_free(&offer);
    s_deliver(p, d);
    assert_int_equal(g_n_wire, 0);   /* D joined without a word */
    for (int i = 0; i < 10 && (kvlinks_state(p, "decode-1", NULL) != TCHAN_NCCL_READY ||
                                kvlinks_state(d, "prefill-0", NULL) != TCHAN_NCCL_READY); i++) {
        kvlinks_poll(p);
        kvlinks_poll(d);
    }
    assert_int_equal(kvlinks_state(p, "decode-1", NULL), TCHAN_NCCL_READY);
    assert_int_equal(kvlinks_state(d, "prefill-0", NULL), TCHAN_NCCL_READY);
    assert_int_equal(kvlinks_channel(p, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_NCCL);
}

/* P posts the send of blocks and builds the announce D will get (through the wire format). */
static void s_send_announce(kvlinks_t *p, const bk_kv_t *kv, const int32_t *blocks, int n, uint64_t transfer,
                            tchan_nccl_xfer_t *x, msg_t *an_out)
{
    char err[512];
    uint8_t handle[KVLINK_HANDLE_BYTES];
    assert_int_equal(kvlinks_send(p, "decode-1", kv, blocks, n, x, handle, err, sizeof err), 0);
    msg_t an;
    uint8_t buf[8192];
    size_t len;
    kvx_announce(&an, transfer, 1000 + transfer, kv, (const uint32_t *)blocks, (uint32_t)n, MSG_CHAN_NCCL, handle,
                 KVLINK_HANDLE_BYTES, "prefill-0", 5000);
    assert_int_equal(msg_encode(&an, buf, sizeof buf, &len, err, sizeof err), 0);
    assert_int_equal(msg_decode(buf, len, an_out, err, sizeof err), 0);
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_route(void **st)
{
    topo_instance_t pf = {.name = "prefill-0", .node = 0, .gpu = 0};
    topo_instance_t same = {.name = "decode-0", .node = 0, .gpu = 0};
    topo_instance_t other = {.name = "decode-1", .node = 0, .gpu = 1};
    topo_instance_t remote = {.name = "decode-2", .node = 1, .gpu = 1};
    topo_instance_t cpu = {.name = "decode-3", .node = 0, .gpu = -1};
    assert_int_equal(kvlink_route(&pf, &same, 1, 1), MSG_CHAN_CUDA_IPC);
    assert_int_equal(kvlink_route(&pf, &same, 0, 1), MSG_CHAN_SHM);      /* no IPC handle: host memory */
    assert_int_equal(kvlink_route(&pf, &other, 1, 1), MSG_CHAN_NCCL);
    assert_int_equal(kvlink_route(&pf, &other, 1, 0), MSG_CHAN_SHM);     /* built without NCCL */
    assert_int_equal(kvlink_route(&pf, &remote, 1, 1), MSG_CHAN_NCCL);   /* another node's GPU */
    assert_int_equal(kvlink_route(&pf, &remote, 1, 0), MSG_CHAN_TCP);    /* ... without NCCL: the network */
    topo_instance_t remote_cpu = {.name = "decode-4", .node = 1, .gpu = -1};
    assert_int_equal(kvlink_route(&cpu, &remote_cpu, 1, 1), MSG_CHAN_TCP);   /* CPU workers on two nodes */
    assert_int_equal(kvlink_route(&pf, &cpu, 1, 1), MSG_CHAN_SHM);       /* no GPU */
    assert_int_equal(kvlink_route(&cpu, &cpu, 1, 1), MSG_CHAN_SHM);
    assert_int_equal(kvlink_route(&pf, NULL, 1, 1), MSG_CHAN_SHM);       /* unknown peer */
    /* Only an NCCL route is a link question; the others pass through, and no links is no NCCL. */
    assert_int_equal(kvlinks_channel(NULL, "decode-1", MSG_CHAN_CUDA_IPC), MSG_CHAN_CUDA_IPC);
    assert_int_equal(kvlinks_channel(NULL, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);
}

static void test_bootstrap_and_blocks(void **st)
{
    s_reset();
    kvlinks_t *p = kvlinks_new(&s_be_p, "prefill-0", 512, &s_cfg, s_send, NULL);
    kvlinks_t *d = kvlinks_new(&s_be_d, "decode-1", 512, &s_cfg, s_send, NULL);
    s_link_up(p, d);
    assert_int_equal(kvlinks_fallbacks(p), 1);   /* the first hand-off, while the link came up */

    bk_kv_t src = s_pool(8, 1), dst = s_pool(8, 200);
    assert_int_equal(src.block_bytes, 512);
    int32_t from[3] = {5, 0, 7}, to[3] = {2, 6, 1};
    tchan_nccl_xfer_t x;
    msg_t an;
    s_send_announce(p, &src, from, 3, 77, &x, &an);
    char err[512];
    assert_int_equal(kvlinks_recv(d, &an.u.kv_announce, &dst, to, 3, err, sizeof err), 0);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(s_block(&dst, to[i]), s_block(&src, from[i]), src.block_bytes);
    kvlinks_settle(d, &an.u.kv_announce);   /* taken: nothing more comes off the link */
    assert_int_equal(kvlinks_test(p, "decode-1", &x, err, sizeof err), 1);
    assert_int_equal(kvlinks_test(p, "decode-1", &x, err, sizeof err), 1);   /* stays done, counted once */
    assert_int_equal(kvlinks_transfers(p), 1);
    assert_int_equal(kvlinks_transfers(d), 1);
    msg_free(&an);
    assert_int_equal(g_fab.aborts, 0);

    /* A send NCCL cannot take now (busy) fails alone: that hand-off goes by shm, the link stays. */
    uint8_t handle[KVLINK_HANDLE_BYTES];
    g_fab.busy = 1;
    assert_int_equal(kvlinks_send(p, "decode-1", &src, from, 3, &x, handle, err, sizeof err), -1);
    assert_non_null(strstr(err, "the send of 3 blocks was not posted: fake: an earlier transfer"));
    g_fab.busy = 0;
    assert_int_equal(kvlinks_state(p, "decode-1", NULL), TCHAN_NCCL_READY);
    assert_int_equal(g_fab.aborts, 0);
    assert_int_equal(g_n_wire, 0);
    s_send_announce(p, &src, from, 3, 78, &x, &an);   /* the next one is number 1 on the link */
    assert_int_equal(kvlinks_recv(d, &an.u.kv_announce, &dst, to, 3, err, sizeof err), 0);
    msg_free(&an);

    /* Stopping tells the peer, which aborts its side. */
    kvlinks_destroy(&p);
    assert_null(p);
    assert_int_equal(g_n_wire, 1);
    msg_t bye;
    s_take_msg(0, "decode-1", &bye);
    assert_int_equal(bye.u.kv_link.status, MSG_ACK_FAILED);
    assert_non_null(strstr(bye.u.kv_link.message, "prefill-0 is stopping"));
    msg_free(&bye);
    s_deliver(NULL, d);
    const char *why;
    assert_int_equal(kvlinks_state(d, "prefill-0", &why), TCHAN_NCCL_FAILED);
    assert_non_null(strstr(why, "closed by the peer"));
    kvlinks_destroy(&d);
    kvlinks_destroy(&d);   /* idempotent */
    assert_int_equal(g_fab.aborts, 2);
    free(src.base);
    free(dst.base);
}

/* A hand-off the decode side refuses (or takes without its KV) still takes its bytes off the link:
 * the next one gets its own blocks, not the refused one's. */
static void test_refused_handoff_keeps_order(void **st)
{
    s_reset();
    kvlinks_t *p = kvlinks_new(&s_be_p, "prefill-0", 512, &s_cfg, s_send, NULL);
    kvlinks_t *d = kvlinks_new(&s_be_d, "decode-1", 512, &s_cfg, s_send, NULL);
    s_link_up(p, d);
    bk_kv_t src = s_pool(8, 3), dst = s_pool(8, 99);
    int32_t a_blocks[2] = {1, 2}, b_blocks[3] = {4, 5, 6}, to[3] = {0, 3, 7};
    tchan_nccl_xfer_t xa, xb;
    msg_t a, b;
    s_send_announce(p, &src, a_blocks, 2, 1, &xa, &a);
    s_send_announce(p, &src, b_blocks, 3, 2, &xb, &b);
    kvlinks_settle(d, &a.u.kv_announce);   /* refused: discarded */
    char err[512];
    assert_int_equal(kvlinks_recv(d, &b.u.kv_announce, &dst, to, 3, err, sizeof err), 0);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(s_block(&dst, to[i]), s_block(&src, b_blocks[i]), src.block_bytes);
    assert_int_equal(kvlinks_test(p, "decode-1", &xa, err, sizeof err), 1);
    assert_int_equal(kvlinks_test(p, "decode-1", &xb, err, sizeof err), 1);
    assert_int_equal(kvlinks_transfers(d), 1);   /* a discard is no transfer */
    assert_int_equal(g_fab.aborts, 0);
    msg_free(&a);
    msg_free(&b);
    kvlinks_destroy(&p);
    kvlinks_destroy(&d);
    free(src.base);
    free(dst.base);
}

/* An announce out of order (one went missing) aborts the link on both sides, never pairs wrong. */
static void test_broken_order_aborts(void **st)
{
    s_reset();
    kvlinks_t *p = kvlinks_new(&s_be_p, "prefill-0", 512, &s_cfg, s_send, NULL);
    kvlinks_t *d = kvlinks_new(&s_be_d, "decode-1", 512, &s_cfg, s_send, NULL);
    s_link_up(p, d);
    bk_kv_t src = s_pool(8, 5), dst = s_pool(8, 6);
    int32_t blocks[1] = {3}, to[1] = {4};
    tchan_nccl_xfer_t x0, x1;
    msg_t a0, a1;
    s_send_announce(p, &src, blocks, 1, 10, &x0, &a0);
    s_send_announce(p, &src, blocks, 1, 11, &x1, &a1);
    char err[512];
    assert_int_equal(kvlinks_recv(d, &a1.u.kv_announce, &dst, to, 1, err, sizeof err), -1);   /* a0 never came */
    assert_non_null(strstr(err, "prefill-0"));
    assert_non_null(strstr(err, "transfer 11 is number 1 on the link, 0 expected"));
    assert_int_equal(kvlinks_state(d, "prefill-0", NULL), TCHAN_NCCL_FAILED);
    assert_int_equal(g_fab.aborts, 1);
    /* The sender is told and aborts too; its sends in flight fail; NCCL is off for retry_ms. */
    assert_int_equal(g_n_wire, 1);
    s_deliver(p, d);
    assert_int_equal(kvlinks_state(p, "decode-1", NULL), TCHAN_NCCL_FAILED);
    assert_int_equal(g_fab.aborts, 2);
    assert_int_equal(kvlinks_test(p, "decode-1", &x1, err, sizeof err), -1);
    assert_non_null(strstr(err, "decode-1"));
    assert_int_equal(kvlinks_channel(p, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);
    assert_int_equal(g_n_wire, 0);   /* no new offer before retry_ms */
    msg_free(&a0);
    msg_free(&a1);
    kvlinks_destroy(&p);
    kvlinks_destroy(&d);
    free(src.base);
    free(dst.base);
}

/* A transfer whose peer never takes it times out within its deadline, aborts the communicator and
 * names the peer and what did not complete; the same on the receiving side. */
static void test_deadlines_abort(void **st)
{
    s_reset();
    kvlinks_t *p = kvlinks_new(&s_be_p, "prefill-0", 512, &s_cfg, s_send, NULL);
    kvlinks_t *d = kvlinks_new(&s_be_d, "decode-1", 512, &s_cfg, s_send, NULL);
    s_link_up(p, d);
    bk_kv_t src = s_pool(8, 7), dst = s_pool(8, 8);
    int32_t blocks[3] = {0, 1, 2};
    tchan_nccl_xfer_t x;
    msg_t an;
    g_fab.hang = 1;
    s_send_announce(p, &src, blocks, 3, 5, &x, &an);
    char err[512];
    int64_t t0 = now_ms();
    /* The receiver: waits its recv_timeout_ms, no longer. */
    assert_int_equal(kvlinks_recv(d, &an.u.kv_announce, &dst, blocks, 3, err, sizeof err), -1);
    int64_t waited = now_ms() - t0;
    assert_true(waited >= s_cfg.recv_timeout_ms && waited < s_cfg.recv_timeout_ms + 500);
    assert_non_null(strstr(err, "NCCL link to prefill-0"));
    assert_non_null(strstr(err, "receive of 3 blocks (0.0 MiB) not complete after"));
    assert_non_null(strstr(err, "communicator aborted"));
    assert_int_equal(g_fab.aborts, 1);
    assert_int_equal(g_n_wire, 1);   /* the sender is told */
    g_n_wire = 0;                    /* ... but say it never heard: its own deadline must fire */
    /* The sender: polled, it fails once its send_timeout_ms is over. */
    int s;
    while ((s = kvlinks_test(p, "decode-1", &x, err, sizeof err)) == 0)
        s_sleep_ms(2);
    assert_int_equal(s, -1);
    assert_true(now_ms() - t0 < s_cfg.send_timeout_ms + 500);
    assert_non_null(strstr(err, "NCCL link to decode-1"));
    assert_non_null(strstr(err, "send of 3 blocks (0.0 MiB) not complete after"));
    assert_int_equal(g_fab.aborts, 2);
    assert_int_equal(g_n_wire, 1);   /* and tells the receiver */
    msg_t m;
    s_take_msg(0, "decode-1", &m);
    assert_int_equal(m.u.kv_link.status, MSG_ACK_FAILED);
    assert_non_null(strstr(m.u.kv_link.message, "send of 3 blocks"));
    msg_free(&m);
    g_n_wire = 0;
    g_fab.hang = 0;
    msg_free(&an);
    kvlinks_destroy(&p);
    kvlinks_destroy(&d);
    free(src.base);
    free(dst.base);
}

/* A peer that never joins: init fails at its deadline; no new offer before retry_ms, then one. */
static void test_init_timeout_and_retry(void **st)
{
    s_reset();
    kvlinks_t *p = kvlinks_new(&s_be_p, "prefill-0", 512, &s_cfg, s_send, NULL);
    kvlinks_want(p, "decode-1");
    assert_int_equal(g_n_wire, 1);
    msg_t offer;
    s_take_msg(0, "decode-1", &offer);
    uint64_t first = offer.u.kv_link.link_id;
    msg_free(&offer);
    g_n_wire = 0;   /* the offer is lost */
    kvlinks_want(p, "decode-1");
    assert_int_equal(g_n_wire, 0);   /* already coming up */
    int64_t t0 = now_ms();
    while (kvlinks_state(p, "decode-1", NULL) == TCHAN_NCCL_INIT && now_ms() - t0 < 5000) {
        kvlinks_poll(p);
        s_sleep_ms(5);
    }
    const char *why;
    assert_int_equal(kvlinks_state(p, "decode-1", &why), TCHAN_NCCL_FAILED);
    assert_true(now_ms() - t0 < s_cfg.init_timeout_ms + 500);
    assert_non_null(strstr(why, "NCCL link to decode-1"));
    assert_non_null(strstr(why, "initialisation (rank 0 of 2) not complete after"));
    assert_int_equal(g_fab.aborts, 1);
    g_n_wire = 0;
    assert_int_equal(kvlinks_channel(p, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);
    assert_int_equal(g_n_wire, 0);
    s_sleep_ms((int)s_cfg.retry_ms + 20);
    assert_int_equal(kvlinks_channel(p, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);
    assert_int_equal(g_n_wire, 1);   /* offered again, a new link id */
    s_take_msg(0, "decode-1", &offer);
    assert_true(offer.u.kv_link.link_id != first);
    msg_free(&offer);
    g_n_wire = 0;
    kvlinks_destroy(&p);
}

/* The peer's process goes away (peer_event down): a READY link is aborted at once, saying so, and
 * hand-offs take shared memory; the peer comes back (restarted): a new link is offered at the next
 * hand-off, without waiting out retry_ms. Events for unknown peers or a NULL kvlinks do nothing. */
static void test_peer_events(void **st)
{
    s_reset();
    kvlink_cfg_t cfg = s_cfg;
    cfg.retry_ms = 60000;   /* far longer than the test: only the event may bring the link back */
    kvlinks_t *p = kvlinks_new(&s_be_p, "prefill-0", 512, &cfg, s_send, NULL);
    kvlinks_t *d = kvlinks_new(&s_be_d, "decode-1", 512, &cfg, s_send, NULL);
    s_link_up(p, d);
    kvlinks_peer_event(p, "nobody", 0);
    kvlinks_peer_event(NULL, "decode-1", 0);
    assert_int_equal(kvlinks_state(p, "decode-1", NULL), TCHAN_NCCL_READY);
    kvlinks_peer_event(p, "decode-1", 0);
    const char *why;
    assert_int_equal(kvlinks_state(p, "decode-1", &why), TCHAN_NCCL_FAILED);
    assert_non_null(strstr(why, "the peer's process is gone"));
    assert_non_null(strstr(why, "communicator aborted"));
    g_n_wire = 0;
    assert_int_equal(kvlinks_channel(p, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);
    assert_int_equal(g_n_wire, 0);   /* no new offer while the peer is down (retry_ms not over) */
    kvlinks_peer_event(p, "decode-1", 1);
    assert_int_equal(kvlinks_channel(p, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);   /* coming up */
    assert_int_equal(g_n_wire, 1);   /* offered again at once */
    msg_t offer;
    s_take_msg(0, "decode-1", &offer);
    assert_int_equal(offer.u.kv_link.channel, MSG_CHAN_NCCL);
    msg_free(&offer);
    g_n_wire = 0;
    kvlinks_destroy(&p);
    kvlinks_destroy(&d);
}

/* A new offer from the same sender (it restarted) replaces the link; announces of the old one are
 * refused with a reason. */
static void test_new_offer_replaces(void **st)
{
    s_reset();
    kvlinks_t *p = kvlinks_new(&s_be_p, "prefill-0", 512, &s_cfg, s_send, NULL);
    kvlinks_t *d = kvlinks_new(&s_be_d, "decode-1", 512, &s_cfg, s_send, NULL);
    s_link_up(p, d);
    bk_kv_t src = s_pool(4, 9), dst = s_pool(4, 10);
    int32_t blocks[1] = {1};
    tchan_nccl_xfer_t x;
    msg_t old;
    s_send_announce(p, &src, blocks, 1, 3, &x, &old);
    kvlinks_destroy(&p);     /* the sender restarts (its farewell lost) */
    g_n_wire = 0;
    p = kvlinks_new(&s_be_p, "prefill-0", 512, &s_cfg, s_send, NULL);
    s_link_up(p, d);         /* D replaced its link */
    char err[512];
    assert_int_equal(kvlinks_recv(d, &old.u.kv_announce, &dst, blocks, 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "another link replaced it"));
    kvlinks_settle(d, &old.u.kv_announce);   /* nothing to take off the new link */
    msg_t an;
    s_send_announce(p, &src, blocks, 1, 4, &x, &an);
    assert_int_equal(kvlinks_recv(d, &an.u.kv_announce, &dst, blocks, 1, err, sizeof err), 0);
    assert_memory_equal(s_block(&dst, 1), s_block(&src, 1), src.block_bytes);
    msg_free(&old);
    msg_free(&an);
    kvlinks_destroy(&p);
    kvlinks_destroy(&d);
    free(src.base);
    free(dst.base);
}

/* A decode worker whose backend has no NCCL refuses an offer and says why; a sender without NCCL
 * never offers; a malformed announce handle is refused. */
static void test_no_nccl(void **st)
{
    s_reset();
    kvlinks_t *p = kvlinks_new(&s_be_p, "prefill-0", 512, &s_cfg, s_send, NULL);
    kvlinks_t *d = kvlinks_new(s_cpu, "decode-1", 512, &s_cfg, s_send, NULL);
    kvlinks_want(p, "decode-1");
    s_deliver(p, d);          /* D refuses ... */
    assert_int_equal(g_n_wire, 1);
    msg_t m;
    s_take_msg(0, "prefill-0", &m);
    assert_int_equal(m.u.kv_link.status, MSG_ACK_FAILED);
    assert_non_null(strstr(m.u.kv_link.message, "decode-1 cannot join: its backend (cpu) has no NCCL"));
    msg_free(&m);
    s_deliver(p, d);          /* ... and P gives up the link for now */
    const char *why;
    assert_int_equal(kvlinks_state(p, "decode-1", &why), TCHAN_NCCL_FAILED);
    assert_non_null(strstr(why, "has no NCCL"));
    assert_int_equal(g_fab.aborts, 1);
    assert_int_equal(kvlinks_channel(p, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);
    assert_int_equal(g_n_wire, 0);

    kvlinks_t *c = kvlinks_new(s_cpu, "prefill-1", 512, &s_cfg, s_send, NULL);
    assert_int_equal(kvlinks_channel(c, "decode-1", MSG_CHAN_NCCL), MSG_CHAN_SHM);
    assert_int_equal(g_n_wire, 0);
    assert_int_equal(kvlinks_state(c, "decode-1", &why), TCHAN_NCCL_FAILED);
    assert_non_null(strstr(why, "backend cpu has no NCCL"));

    uint8_t bad[5] = {1, 2, 3, 4, 5};
    uint32_t ids[1] = {0};
    bk_kv_t kv = s_pool(1, 0);
    msg_t an;
    kvx_announce(&an, 1, 1, &kv, ids, 1, MSG_CHAN_NCCL, bad, sizeof bad, "prefill-0", 1000);
    char err[256];
    uint64_t id, seq;
    assert_int_equal(kvlink_handle_parse(&an.u.kv_announce, &id, &seq, err, sizeof err), -1);
    assert_non_null(strstr(err, "an NCCL handle of 5 bytes"));
    assert_int_equal(kvlinks_recv(d, &an.u.kv_announce, &kv, (const int32_t *)ids, 1, err, sizeof err), -1);
    kvlinks_settle(d, &an.u.kv_announce);   /* no link: nothing happens */
    free(kv.base);
    kvlinks_destroy(&p);
    kvlinks_destroy(&d);
    kvlinks_destroy(&c);
}

/* The channel itself: open checks its arguments; a one-rank link sends to itself. */
static void test_chan_self(void **st)
{
    s_reset();
    tchan_nccl_t l;
    uint8_t id[TCHAN_NCCL_ID_BYTES];
    char err[512];
    assert_int_equal(tchan_nccl_unique_id(&s_be_p, id, err, sizeof err), 0);
    assert_int_equal(tchan_nccl_open(&l, &s_be_p, "self", 9, id, 17, 1, 0, 100, err, sizeof err), -1);
    assert_non_null(strstr(err, "a bootstrap of 17 bytes"));
    assert_int_equal(tchan_nccl_open(&l, &s_be_p, "self", 9, id, sizeof id, 2, 2, 100, err, sizeof err), -1);
    assert_non_null(strstr(err, "rank 2 of 2"));
    assert_int_equal(tchan_nccl_open(&l, &s_be_p, "self", 9, id, sizeof id, 1, 0, 1000, err, sizeof err), 0);
    tchan_nccl_xfer_t x;
    bk_kv_t a = s_pool(6, 11), b = s_pool(6, 12);
    int32_t from[2] = {0, 5}, to[2] = {3, 1};
    assert_int_equal(tchan_nccl_sendrecv(&l, &a, from, &b, to, 2, 1000, &x, err, sizeof err), -1);
    assert_non_null(strstr(err, "not ready (init)"));
    while (tchan_nccl_poll(&l, err, sizeof err) != TCHAN_NCCL_READY)
        assert_int_not_equal(l.state, TCHAN_NCCL_FAILED);
    int32_t outside[1] = {6};
    assert_int_equal(tchan_nccl_send(&l, &a, outside, 1, 1000, &x, err, sizeof err), -1);
    assert_non_null(strstr(err, "block 6 is outside the pool of 6"));
    assert_int_equal(tchan_nccl_sendrecv(&l, &a, from, &b, to, 2, 1000, &x, err, sizeof err), 0);
    assert_int_equal(tchan_nccl_wait(&l, &x, err, sizeof err), 1);
    assert_memory_equal(s_block(&b, 3), s_block(&a, 0), a.block_bytes);
    assert_memory_equal(s_block(&b, 1), s_block(&a, 5), a.block_bytes);
    assert_int_equal(l.transfers, 1);
    assert_int_equal(l.bytes, 2 * a.block_bytes);
    tchan_nccl_abort(&l, "test");
    assert_int_equal(l.state, TCHAN_NCCL_FAILED);
    assert_string_equal(l.why, "test");
    assert_int_equal(tchan_nccl_test(&l, &x, err, sizeof err), 1);   /* done before the abort: stays done */
    tchan_nccl_close(&l);
    tchan_nccl_close(&l);
    assert_int_equal(l.state, TCHAN_NCCL_CLOSED);
    assert_string_equal(tchan_nccl_state_name(TCHAN_NCCL_WARMUP), "warmup");
    free(a.base);
    free(b.base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_bootstrap_and_blocks),
        cmocka_unit_test(test_refused_handoff_keeps_order),
        cmocka_unit_test(test_broken_order_aborts),
        cmocka_unit_test(test_deadlines_abort),
        cmocka_unit_test(test_init_timeout_and_retry),
        cmocka_unit_test(test_peer_events),
        cmocka_unit_test(test_new_offer_replaces),
        cmocka_unit_test(test_no_nccl),
        cmocka_unit_test(test_chan_self),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
