/* tests/unit/test_ep_meet.c — the expert-parallel group's choice of transport and the NCCL unique
 * id's hand-off at its meeting (engine/ep_meet.c), and the NCCL transport's exchange
 * (engine/ep_nccl.c), on the CPU.
 *
 * The choice (ep_xport_choose) is pure: a table of ranks' backends, GPUs, hosts and
 * TROUPE_EP_TRANSPORT values and what must come out. The meeting runs for real between ranks that
 * are threads of this process over unix socket pairs (ep_sock_pairs), on the CPU backend with a
 * stand-in for the NCCL hooks (bk_nccl_ops_t): its unique id is 128 random bytes, its
 * communicator comes up only once every rank has joined with exactly the id made (so a rank that
 * got other bytes never comes up), and its transfers are FIFO mailboxes per (sender, receiver),
 * matched in posting order as NCCL's point-to-point is. Checked: who picks NCCL and who the
 * sockets; every rank's communicator got rank 0's id byte for byte; a fallback to the sockets
 * (with the reason naming the rank) when a communicator never comes up, is refused, or its check
 * trade gets a wrong byte; a required NCCL failing the group; a silent peer and a stalled exchange
 * ending at their deadlines, a peer gone mid-exchange ending it at once; and whatever was chosen then moves every byte of an all-to-all of
 * uneven sizes (some pairs empty) between 2 and 4 ranks. Then whole groups of 2 and 4 ranks of
 * qwen3-moe-f32 (threads, a CPU engine each holding its experts): every logit over the NCCL comm
 * (the dispatch packed, exchanged and combined in the backend's buffers, or staged through the
 * host; the headers over the sockets) equals the same group's over the sockets, bit for bit. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util.h"
#include "engine/engine_open.h"
#include "engine/ep.h"
#include "engine/kvcache.h"
#include "kernels/backend.h"

#define MAXR 8

/* ---- the NCCL stand-in ------------------------------------------------------------------------ */

typedef struct fmsg {
    struct fmsg *next;
    size_t bytes;
    uint8_t data[];
} fmsg_t;

typedef struct {
    uint8_t id[BK_NCCL_ID_BYTES];
    int n, joined;
    fmsg_t *head[MAXR][MAXR], *tail[MAXR][MAXR];   /* [from][to] */
} fworld_t;

typedef struct {
    int64_t ticket;
    int peer;
    void *dev;
    size_t bytes;
} fpend_t;

struct bk_comm {
    fworld_t *w;
    int rank;
    int64_t next;
    fpend_t pend[256];
    int n_pend;
};

static pthread_mutex_t s_mu = PTHREAD_MUTEX_INITIALIZER;
static fworld_t s_world;          /* the one id made in a test */
static int s_ids_made;
static uint8_t s_got_id[MAXR][BK_NCCL_ID_BYTES];   /* what each rank's comm_init was given */
static int s_inits;
static int s_hang;                /* the communicator never comes up */
static int s_refuse = -1;         /* comm_init of this rank fails at once */
static int s_corrupt = -1;        /* one byte of this rank's first send is flipped */

static void s_fake_reset(void)
{
    pthread_mutex_lock(&s_mu);
    for (int a = 0; a < MAXR; a++)
        for (int b = 0; b < MAXR; b++)
            while (s_world.head[a][b]) {
                fmsg_t *m = s_world.head[a][b];
                s_world.head[a][b] = m->next;
                free(m);
            }
    memset(&s_world, 0, sizeof s_world);
    memset(s_got_id, 0, sizeof s_got_id);
    s_ids_made = s_inits = s_hang = 0;
    s_refuse = s_corrupt = -1;
    pthread_mutex_unlock(&s_mu);
}

static int f_unique_id(uint8_t id[BK_NCCL_ID_BYTES], char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    pthread_mutex_lock(&s_mu);
    for (int i = 0; i < BK_NCCL_ID_BYTES; i++)
        s_world.id[i] = (uint8_t)(rand() & 0xff);
    s_world.id[0] |= 1;   /* never all zero */
    memcpy(id, s_world.id, BK_NCCL_ID_BYTES);
    s_ids_made++;
    pthread_mutex_unlock(&s_mu);
    return 0;
}

static bk_comm_t *f_comm_init(backend_t *be, const uint8_t id[BK_NCCL_ID_BYTES], int n_ranks, int rank, char *err,
                              size_t errlen)
{
    (void)be;
    pthread_mutex_lock(&s_mu);
    s_inits++;
    memcpy(s_got_id[rank], id, BK_NCCL_ID_BYTES);
    pthread_mutex_unlock(&s_mu);
    if (rank == s_refuse) {
        errf(err, errlen, "stand-in ncclCommInitRankConfig refused rank %d", rank);
        return NULL;
    }
    bk_comm_t *c = calloc(1, sizeof *c);
    c->w = &s_world;
    c->rank = rank;
    pthread_mutex_lock(&s_mu);
    if (memcmp(id, s_world.id, BK_NCCL_ID_BYTES) == 0) {   /* other bytes: a bootstrap nobody else joins */
        s_world.n = n_ranks;
        s_world.joined++;
    }
    pthread_mutex_unlock(&s_mu);
    return c;
}

static int f_comm_poll(bk_comm_t *c, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    pthread_mutex_lock(&s_mu);
    const int up = !s_hang && c->w->n > 0 && c->w->joined == c->w->n && memcmp(s_got_id[c->rank], s_world.id,
                                                                               BK_NCCL_ID_BYTES) == 0;
    pthread_mutex_unlock(&s_mu);
    return up;
}

static int64_t f_xfer(bk_comm_t *c, int peer, const bk_span_t *sends, int n_sends, const bk_span_t *recvs, int n_recvs,
                      char *err, size_t errlen)
{
    if (c->n_pend + n_recvs > 256)
        return errf(err, errlen, "stand-in: too many receives in flight");
    pthread_mutex_lock(&s_mu);
    const int64_t t = c->next++;
    for (int i = 0; i < n_sends; i++) {
        fmsg_t *m = malloc(sizeof *m + sends[i].bytes);
        m->next = NULL;
        m->bytes = sends[i].bytes;
        memcpy(m->data, sends[i].dev, sends[i].bytes);
        if (c->rank == s_corrupt && m->bytes) {
            m->data[m->bytes / 2] ^= 0x10;
            s_corrupt = -1;
        }
        fmsg_t **tl = &c->w->tail[c->rank][peer];
        if (*tl)
            (*tl)->next = m;
        else
            c->w->head[c->rank][peer] = m;
        *tl = m;
    }
    for (int i = 0; i < n_recvs; i++)
        c->pend[c->n_pend++] = (fpend_t){.ticket = t, .peer = peer, .dev = recvs[i].dev, .bytes = recvs[i].bytes};
    pthread_mutex_unlock(&s_mu);
    return t;
}

static int f_xfer_poll(bk_comm_t *c, int64_t ticket, char *err, size_t errlen)
{
    pthread_mutex_lock(&s_mu);
    int rc = 1;
    while (c->n_pend && c->pend[0].ticket <= ticket) {
        const fpend_t *p = &c->pend[0];
        fmsg_t *m = c->w->head[p->peer][c->rank];
        if (!m) {
            rc = 0;
            break;
        }
        if (m->bytes != p->bytes) {
            rc = errf(err, errlen, "stand-in: %zu bytes sent, %zu received", m->bytes, p->bytes);
            break;
        }
        memcpy(p->dev, m->data, m->bytes);
        c->w->head[p->peer][c->rank] = m->next;
        if (!m->next)
            c->w->tail[p->peer][c->rank] = NULL;
        free(m);
        memmove(&c->pend[0], &c->pend[1], (size_t)--c->n_pend * sizeof c->pend[0]);
    }
    pthread_mutex_unlock(&s_mu);
    return rc;
}

static void f_comm_abort(bk_comm_t **c)
{
    free(*c);
    *c = NULL;
}

static const bk_nccl_ops_t s_fake = {.unique_id = f_unique_id, .comm_init = f_comm_init, .comm_poll = f_comm_poll,
                                     .xfer = f_xfer, .xfer_poll = f_xfer_poll, .comm_abort = f_comm_abort};

static backend_t *s_cpu;          /* the CPU backend as it is: no NCCL */
static backend_t *s_gpu;          /* the CPU backend with the stand-in's NCCL hooks */
static backend_ops_t s_gpu_ops;

static int s_setup(void **state)
{
    (void)state;
    char err[256];
    s_cpu = backend_new("cpu", 1, err, sizeof err);
    s_gpu = backend_new("cpu", 1, err, sizeof err);
    if (!s_cpu || !s_gpu)
        return -1;
    s_gpu_ops = *s_gpu->ops;
    s_gpu_ops.nccl = &s_fake;
    s_gpu->ops = &s_gpu_ops;
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    s_gpu->ops = s_cpu->ops;   /* its own ops to be destroyed by */
    backend_destroy(&s_cpu);
    backend_destroy(&s_gpu);
    return 0;
}

/* ---- the choice ------------------------------------------------------------------------------ */

static ep_rank_info_t s_info(int want, int nccl, int device)
{
    ep_rank_info_t in;
    memset(&in, 0, sizeof in);
    in.magic = 0x45504931u;   /* ep_meet.c's EP_INFO_MAGIC: what a rank of this build sends */
    in.want = (uint32_t)want;
    in.nccl = (uint32_t)nccl;
    in.device = device;
    in.host = 42;
    return in;
}

static void test_want_parse(void **state)
{
    (void)state;
    ep_want_t w;
    char err[200];
    assert_int_equal(ep_want_parse(NULL, &w, err, sizeof err), 0);
    assert_int_equal(w, EP_WANT_AUTO);
    assert_int_equal(ep_want_parse("", &w, err, sizeof err), 0);
    assert_int_equal(w, EP_WANT_AUTO);
    assert_int_equal(ep_want_parse("auto", &w, err, sizeof err), 0);
    assert_int_equal(w, EP_WANT_AUTO);
    assert_int_equal(ep_want_parse("sock", &w, err, sizeof err), 0);
    assert_int_equal(w, EP_WANT_SOCK);
    assert_int_equal(ep_want_parse("nccl", &w, err, sizeof err), 0);
    assert_int_equal(w, EP_WANT_NCCL);
    assert_int_equal(ep_want_parse("NCCL2", &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "TROUPE_EP_TRANSPORT=NCCL2"));
}

static void test_choose(void **state)
{
    (void)state;
    const struct {
        int n;
        int want[4], nccl[4], dev[4];
        uint64_t host1, vis1;     /* rank 1's host and CUDA_VISIBLE_DEVICES hashes (0: as rank 0's) */
        int pick;
        const char *why;
    } cases[] = {
        {2, {0, 0}, {1, 1}, {0, 1}, 0, 0, 1, "NCCL: every rank on its own GPU (0 1)"},
        {4, {0, 0, 0, 0}, {1, 1, 1, 1}, {3, 1, 0, 2}, 0, 0, 1, "(3 1 0 2)"},
        {2, {0, 0}, {1, 1}, {0, 0}, 0, 0, 0, "ranks 0 and 1 share GPU 0"},
        {4, {0, 0, 0, 0}, {1, 1, 1, 1}, {0, 1, 2, 1}, 0, 0, 0, "ranks 1 and 3 share GPU 1"},
        {2, {0, 0}, {0, 0}, {-1, -1}, 0, 0, 0, "rank 0 is not on a GPU"},
        {2, {0, 0}, {1, 0}, {0, -1}, 0, 0, 0, "rank 1 is not on a GPU"},
        {2, {0, 0}, {1, 0}, {0, 1}, 0, 0, 0, "rank 1's backend (GPU 1) has no NCCL"},
        {2, {0, 1}, {1, 1}, {0, 1}, 0, 0, 0, "rank 1 has TROUPE_EP_TRANSPORT=sock"},
        {2, {1, 1}, {1, 1}, {0, 1}, 0, 0, 0, "rank 0 has TROUPE_EP_TRANSPORT=sock"},
        {2, {0, 0}, {1, 1}, {0, 1}, 7, 0, 0, "ranks 0 and 1 are on different hosts"},
        {2, {0, 0}, {1, 1}, {0, 1}, 0, 9, 0, "number the GPUs differently"},
        {2, {2, 0}, {1, 1}, {0, 1}, 0, 0, 1, "NCCL"},
        {2, {2, 2}, {1, 1}, {0, 0}, 0, 0, -1, "rank 0 requires NCCL (TROUPE_EP_TRANSPORT=nccl), but ranks 0 and 1 share"},
        {2, {0, 2}, {1, 0}, {0, -1}, 0, 0, -1, "rank 1 requires NCCL (TROUPE_EP_TRANSPORT=nccl), but rank 1 is not on"},
        {2, {2, 1}, {1, 1}, {0, 1}, 0, 0, -1, "rank 0 requires NCCL (TROUPE_EP_TRANSPORT=nccl), rank 1 sockets"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ep_rank_info_t in[4];
        for (int r = 0; r < cases[i].n; r++)
            in[r] = s_info(cases[i].want[r], cases[i].nccl[r], cases[i].dev[r]);
        if (cases[i].host1)
            in[1].host = cases[i].host1;
        if (cases[i].vis1)
            in[1].visible = cases[i].vis1;
        char why[300] = "";
        const int got = ep_xport_choose(in, cases[i].n, why, sizeof why);
        if (got != cases[i].pick || !strstr(why, cases[i].why))
            fail_msg("case %zu: %d (%s), expected %d (... %s ...)", i, got, why, cases[i].pick, cases[i].why);
    }
    ep_rank_info_t in[2] = {s_info(0, 1, 0), s_info(0, 1, 1)};
    in[1].magic = 0;
    char why[300];
    assert_int_equal(ep_xport_choose(in, 2, why, sizeof why), -1);
    assert_non_null(strstr(why, "rank 1 sent no valid transport info"));
}

/* ---- meetings of threads --------------------------------------------------------------------- */

typedef struct {
    int rank, n;
    int fds[MAXR];                /* its ends of the socket pairs */
    backend_t *be;
    ep_meet_opts_t o;
    int silent;                   /* takes no part: holds its sockets for silent_ms, then closes them */
    int silent_ms;
    int trade;                    /* after the meeting, one all-to-all over what was chosen */
    int stall;                    /* in that all-to-all, rank 1: 1 posts nothing for 1 s, 2 leaves */
    /* results */
    int got;                      /* a comm came back */
    int device;                   /* its ops->device (1: NCCL) */
    int poll_fds;
    int64_t ms;                   /* the meeting's time */
    char why[800], err[800], trade_err[600];
    int trade_rc;
} rank_t;

/* Bytes of rank a's part to rank b in the trade: uneven, some pairs empty. */
static size_t s_part(int a, int b)
{
    return (size_t)((a * 7 + b * 3) % 5) * 1000;
}

static uint8_t s_byte(int a, int b, size_t i)
{
    return (uint8_t)(a * 31 + b * 17 + i * 13 + (i >> 8));
}

static void s_trade_check(rank_t *k, ep_comm_t *c)
{
    const int n = k->n, me = k->rank;
    const void *s[MAXR];
    void *r[MAXR];
    size_t sn[MAXR], rn[MAXR];
    for (int p = 0; p < n; p++) {
        sn[p] = p == me ? 0 : s_part(me, p);
        rn[p] = p == me ? 0 : s_part(p, me);
        uint8_t *b = malloc(sn[p] + 1);
        for (size_t i = 0; i < sn[p]; i++)
            b[i] = s_byte(me, p, i);
        s[p] = b;
        r[p] = calloc(1, rn[p] + 1);
    }
    if (k->stall && me == 1) {   /* 1: posts nothing for 1 s; 2: leaves at once (its sockets close) */
        if (k->stall == 1)
            usleep(1000000);
        k->trade_rc = 0;
    } else {
        k->trade_rc = c->ops->exchange(c, s, sn, r, rn, k->stall == 1 ? 300 : 10000, k->trade_err, sizeof k->trade_err);
        for (int p = 0; k->trade_rc == 0 && p < n; p++)
            for (size_t i = 0; i < rn[p]; i++)
                if (((uint8_t *)r[p])[i] != s_byte(p, me, i)) {
                    k->trade_rc = -2;
                    snprintf(k->trade_err, sizeof k->trade_err, "rank %d: byte %zu from rank %d wrong", me, i, p);
                    break;
                }
    }
    for (int p = 0; p < n; p++) {
        free((void *)s[p]);
        free(r[p]);
    }
}

static void *s_rank_main(void *arg)
{
    rank_t *k = arg;
    char err[200];
    ep_comm_t *ctrl = ep_sock_new(k->rank, k->n, k->fds, err, sizeof err);
    if (!ctrl) {
        snprintf(k->err, sizeof k->err, "ep_sock_new: %s", err);
        return NULL;
    }
    if (k->silent) {   /* a peer that met and then says nothing */
        usleep((useconds_t)k->silent_ms * 1000);
        ctrl->ops->destroy(ctrl);
        return NULL;
    }
    const int64_t t0 = now_ns();
    ep_comm_t *c = ep_meet(ctrl, k->be, &k->o, k->why, sizeof k->why, k->err, sizeof k->err);
    k->ms = (now_ns() - t0) / 1000000;
    if (!c)
        return NULL;
    k->got = 1;
    k->device = c->ops->device;
    int fds[EP_MAX_RANKS];
    k->poll_fds = c->ops->poll_fds ? c->ops->poll_fds(c, fds) : -1;
    if (k->trade)
        s_trade_check(k, c);
    c->ops->destroy(c);
    return NULL;
}

/* n ranks, each on GPU dev[r] (-1: none) of backend be (NULL: s_gpu), TROUPE_EP_TRANSPORT want[r]. */
static void s_meet(rank_t *k, int n, const int *dev, const char *const *want, int init_ms)
{
    int pairs[MAXR * MAXR];
    char err[200];
    assert_int_equal(ep_sock_pairs(n, pairs, err, sizeof err), 0);
    for (int r = 0; r < n; r++) {
        k[r].rank = r;
        k[r].n = n;
        if (!k[r].be)
            k[r].be = s_gpu;
        for (int p = 0; p < n; p++)
            k[r].fds[p] = p == r ? -1 : pairs[r * n + p];
        k[r].o = (ep_meet_opts_t){.group = "decode-0", .want = want ? want[r] : NULL, .device = dev[r],
                                  .visible = NULL, .meet_ms = 2000, .init_ms = init_ms};
    }
    pthread_t th[MAXR];
    for (int r = 0; r < n; r++)
        assert_int_equal(pthread_create(&th[r], NULL, s_rank_main, &k[r]), 0);
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
}

/* Ranks 0..n-1 on GPUs 0..n-1 (k zeroed first), each trading over the comm it ends with, each
 * stalling as `stall` says (rank_t.stall). */
static void s_meet_trading(rank_t *k, int n, int stall, int init_ms)
{
    int dev[MAXR];
    memset(k, 0, MAXR * sizeof *k);
    for (int r = 0; r < n; r++) {
        dev[r] = r;
        k[r].trade = 1;
        k[r].stall = stall;
    }
    s_meet(k, n, dev, NULL, init_ms);
}

static void s_expect_all(const rank_t *k, int n, int device, const char *why)
{
    for (int r = 0; r < n; r++) {
        if (!k[r].got)
            fail_msg("rank %d: no comm: %s", r, k[r].err);
        if (k[r].device != device || !strstr(k[r].why, why))
            fail_msg("rank %d: %s (%s), expected %s with '%s'", r, k[r].device ? "NCCL" : "sockets", k[r].why,
                     device ? "NCCL" : "sockets", why);
        if (k[r].trade && k[r].trade_rc != 0)
            fail_msg("rank %d: the trade after the meeting: %s", r, k[r].trade_err);
        assert_int_equal(k[r].poll_fds, n - 1);   /* the sockets wake a poll loop either way */
    }
}

static void s_nccl_group(int n)
{
    s_fake_reset();
    rank_t k[MAXR];
    memset(k, 0, sizeof k);
    const int dev[MAXR] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int r = 0; r < n; r++)
        k[r].trade = 1;
    s_meet(k, n, dev, NULL, 2000);
    s_expect_all(k, n, 1, "NCCL: every rank on its own GPU");
    assert_int_equal(s_ids_made, 1);
    assert_int_equal(s_inits, n);
    for (int r = 0; r < n; r++)   /* rank 0's id, byte for byte, on every rank */
        assert_memory_equal(s_got_id[r], s_world.id, BK_NCCL_ID_BYTES);
}

static void test_meet_nccl_2(void **state)
{
    (void)state;
    s_nccl_group(2);
}

static void test_meet_nccl_4(void **state)
{
    (void)state;
    s_nccl_group(4);
}

static void s_sock_group(int n, const int *dev, const char *const *want, backend_t *be1, const char *why)
{
    s_fake_reset();
    rank_t k[MAXR];
    memset(k, 0, sizeof k);
    for (int r = 0; r < n; r++)
        k[r].trade = 1;
    k[1].be = be1;
    s_meet(k, n, dev, want, 2000);
    s_expect_all(k, n, 0, why);
    assert_int_equal(s_ids_made, 0);   /* no NCCL at all */
    assert_int_equal(s_inits, 0);
}

static void test_meet_sock_env(void **state)
{
    (void)state;
    const int dev[3] = {0, 1, 2};
    const char *const want[3] = {NULL, "sock", "auto"};
    s_sock_group(3, dev, want, NULL, "sockets: rank 1 has TROUPE_EP_TRANSPORT=sock");
}

static void test_meet_shared_gpu(void **state)
{
    (void)state;
    const int dev[4] = {0, 1, 1, 2};
    s_sock_group(4, dev, NULL, NULL, "sockets: ranks 1 and 2 share GPU 1");
    const int one[2] = {0, 0};   /* the one-GPU machine: every rank on GPU 0 */
    s_sock_group(2, one, NULL, NULL, "ranks 0 and 1 share GPU 0");
}

static void test_meet_cpu_ranks(void **state)
{
    (void)state;
    const int dev[2] = {-1, -1};
    s_sock_group(2, dev, NULL, s_cpu, "sockets: rank 0 is not on a GPU");
    const int gpus[2] = {0, 1};   /* on GPUs, but rank 1's backend has no NCCL */
    s_sock_group(2, gpus, NULL, s_cpu, "rank 1's backend (GPU 1) has no NCCL");
}

/* A communicator that never comes up: every rank keeps the sockets after init_ms, the reason says
 * so, and the sockets still carry the trade. */
static void test_meet_init_timeout(void **state)
{
    (void)state;
    s_fake_reset();
    s_hang = 1;
    rank_t k[MAXR];
    s_meet_trading(k, 3, 0, 300);
    s_expect_all(k, 3, 0, "sockets: the NCCL set-up failed (rank 0: expert parallelism: NCCL rank 0 of 3: the "
                          "communicator did not come up within 300 ms");
    for (int r = 0; r < 3; r++)
        assert_true(k[r].ms < 2500);
    assert_int_equal(s_inits, 3);
}

/* One rank refused at once: the reason names it (beside the others, whose init waited for it). */
static void test_meet_init_refused(void **state)
{
    (void)state;
    s_fake_reset();
    s_refuse = 1;
    rank_t k[MAXR];
    s_meet_trading(k, 2, 0, 300);
    s_expect_all(k, 2, 0, "rank 1: expert parallelism: NCCL rank 1 of 2: stand-in ncclCommInitRankConfig refused");
}

/* The check trade catches a wrong byte: the group keeps the sockets. */
static void test_meet_check_corrupt(void **state)
{
    (void)state;
    s_fake_reset();
    s_corrupt = 1;
    rank_t k[MAXR];
    s_meet_trading(k, 2, 0, 2000);
    s_expect_all(k, 2, 0, "rank 0: the check bytes from rank 1 differ at byte");
}

/* TROUPE_EP_TRANSPORT=nccl: the group fails where NCCL cannot be had, naming the group. */
static void test_meet_required(void **state)
{
    (void)state;
    s_fake_reset();
    rank_t k[MAXR];
    memset(k, 0, sizeof k);
    const int shared[2] = {0, 0};
    const char *const want[2] = {"nccl", "nccl"};
    s_meet(k, 2, shared, want, 2000);
    for (int r = 0; r < 2; r++) {
        assert_false(k[r].got);
        assert_non_null(strstr(k[r].err, "expert-parallel group decode-0: rank 0 requires NCCL"));
        assert_true(k[r].ms < 1000);   /* decided at once, no NCCL tried */
    }
    assert_int_equal(s_inits, 0);

    s_fake_reset();
    s_hang = 1;
    memset(k, 0, sizeof k);
    const int dev[2] = {0, 1};
    const char *const one[2] = {NULL, "nccl"};
    s_meet(k, 2, dev, one, 300);
    for (int r = 0; r < 2; r++) {
        assert_false(k[r].got);
        assert_non_null(strstr(k[r].err, "NCCL required (TROUPE_EP_TRANSPORT=nccl on rank 1) but its set-up failed"));
    }

    s_fake_reset();
    memset(k, 0, sizeof k);
    const char *const bad[2] = {"nccl", "sock"};
    s_meet(k, 2, dev, bad, 2000);
    for (int r = 0; r < 2; r++) {
        assert_false(k[r].got);
        assert_non_null(strstr(k[r].err, "rank 0 requires NCCL (TROUPE_EP_TRANSPORT=nccl), rank 1 sockets"));
    }
    s_fake_reset();
    memset(k, 0, sizeof k);
    const char *const typo[2] = {"nccl2", NULL};   /* rank 0 gives up; rank 1 finds its socket closed */
    s_meet(k, 2, dev, typo, 2000);
    assert_false(k[0].got);
    assert_non_null(strstr(k[0].err, "TROUPE_EP_TRANSPORT=nccl2: auto, sock or nccl"));
    assert_false(k[1].got);
    if (!strstr(k[1].err, "choosing the transport: rank 1:") ||   /* EOF, EPIPE or ECONNRESET, as it happens */
        (!strstr(k[1].err, "rank 0 closed its connection") && !strstr(k[1].err, "sending to rank 0") &&
         !strstr(k[1].err, "receiving from rank 0")))
        fail_msg("rank 1: %s", k[1].err);
}

/* A peer that met and then says nothing: the meeting ends at meet_ms, naming it. */
static void test_meet_peer_silent(void **state)
{
    (void)state;
    s_fake_reset();
    rank_t k[MAXR];
    memset(k, 0, sizeof k);
    k[1].silent = 1;
    k[1].silent_ms = 1000;
    int pairs[4];
    char err[200];
    assert_int_equal(ep_sock_pairs(2, pairs, err, sizeof err), 0);
    const int dev[2] = {0, 1};
    for (int r = 0; r < 2; r++) {
        k[r].rank = r;
        k[r].n = 2;
        k[r].be = s_gpu;
        k[r].fds[r] = -1;
        k[r].fds[1 - r] = pairs[r * 2 + 1 - r];
        k[r].o = (ep_meet_opts_t){.group = "decode-4", .device = dev[r], .meet_ms = 400, .init_ms = 400};
    }
    pthread_t th[2];
    for (int r = 0; r < 2; r++)
        assert_int_equal(pthread_create(&th[r], NULL, s_rank_main, &k[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    assert_false(k[0].got);
    assert_non_null(strstr(k[0].err, "expert-parallel group decode-4: choosing the transport: rank 0: nothing from "
                                     "rank 1 for 400 ms"));
    assert_true(k[0].ms >= 350 && k[0].ms < 2000);
}

/* Over NCCL, a rank that posts nothing: the exchange fails at its deadline, naming the peer. */
static void test_nccl_exchange_deadline(void **state)
{
    (void)state;
    s_fake_reset();
    rank_t k[MAXR];
    s_meet_trading(k, 2, 1, 2000);
    assert_true(k[0].got && k[0].device == 1);
    assert_int_equal(k[0].trade_rc, -1);
    assert_non_null(strstr(k[0].trade_err, "rank 0: NCCL exchange with rank(s) 1 not complete by its deadline"));
}

/* Over NCCL, a rank that goes away mid-exchange: its closed socket ends the exchange at once, not at
 * the deadline (10 s here). */
static void test_nccl_exchange_peer_gone(void **state)
{
    (void)state;
    s_fake_reset();
    rank_t k[MAXR];
    const int64_t t0 = now_ns();
    s_meet_trading(k, 2, 2, 2000);
    assert_true(k[0].got && k[0].device == 1);
    assert_int_equal(k[0].trade_rc, -1);
    assert_non_null(strstr(k[0].trade_err, "rank 0: NCCL exchange with rank(s) 1 not complete: a peer's connection "
                                           "closed"));
    assert_true(now_ns() - t0 < 5ll * 1000000000);
}

/* ---- a whole group over the stand-in ------------------------------------------------------------ */

#define G_STEPS 6
#define G_SEQS 3

typedef struct {
    int rank, n;
    engine_t *e;
    int fds[MAXR];
    const char *want;             /* TROUPE_EP_TRANSPORT */
    float *lg;                    /* [G_STEPS][rows][V] */
    int nccl;                     /* ep_status's */
    uint64_t entries;
    char err[800];
} grank_t;

static int s_grows(int rank) { return rank == 0 ? G_SEQS : rank == 1 ? 1 : 2; }

/* One rank's group life: meet, its own sequences through G_STEPS forwards (each a group step: a
 * 5-token prompt then one-row steps), a done step with every rank, then the comm goes. */
static void *s_grank_main(void *arg)
{
    grank_t *k = arg;
    char err[300], why[600];
    ep_comm_t *c = ep_sock_new(k->rank, k->n, k->fds, err, sizeof err);
    const ep_meet_opts_t o = {.group = "decode-0", .want = k->want, .device = k->rank, .meet_ms = 5000,
                              .init_ms = 5000};
    ep_t *ep = NULL;
    if (!c || !(c = ep_meet(c, k->e->be, &o, why, sizeof why, k->err, sizeof k->err)) ||
        !(ep = ep_new(k->e->model, k->e->ck, c, k->err, sizeof k->err)))
        return NULL;
    const int V = k->e->cfg.vocab_size, ns = s_grows(k->rank);
    kvseq_t *kv[G_SEQS];
    model_seq_t q[G_SEQS];
    for (int s = 0; s < ns; s++) {
        int32_t p[5];
        for (int i = 0; i < 5; i++)
            p[i] = (k->rank * 53 + s * 29 + i * 7 + 1) % V;
        kv[s] = kvseq_new(k->e->pool, 64, 0);
        kvseq_append(kv[s], p, 5);
        q[s] = (model_seq_t){.kv = kv[s], .n_new = 5};
    }
    for (int step = 0; step < G_STEPS; step++) {
        model_batch_t b = {.n_seqs = ns, .seqs = q};
        if (model_forward(k->e->model, &b, k->e->logits, err, sizeof err) != 0) {
            snprintf(k->err, sizeof k->err, "rank %d, step %d: %s", k->rank, step, err);
            break;
        }
        memcpy(k->lg + (size_t)step * ns * V, k->e->logits, (size_t)ns * V * sizeof(float));
        for (int s = 0; s < ns; s++) {
            kvseq_publish(kv[s]);
            const int32_t t = (step * 11 + s * 3 + k->rank) % V;
            kvseq_append(kv[s], &t, 1);
            q[s].n_new = 1;
        }
    }
    if (!k->err[0] && (ep_join(ep, 1) != 0 || !ep_all_done(ep)))
        snprintf(k->err, sizeof k->err, "rank %d: the done step did not end the group", k->rank);
    ep_status_t st;
    ep_status(ep, &st);
    k->nccl = st.nccl;
    k->entries = st.entries_sent;
    for (int s = 0; s < ns; s++)
        kvseq_destroy(&kv[s]);
    ep_destroy(&ep);
    return NULL;
}

/* n ranks (threads) of qwen3-moe-f32 on CPU backends with the stand-in's NCCL hooks, over the
 * transport `want` asks for; lg[r] gets rank r's logits. */
static void s_group(int n, engine_t **e, const char *want, float **lg, int want_nccl)
{
    s_fake_reset();
    int pairs[MAXR * MAXR];
    char err[200];
    assert_int_equal(ep_sock_pairs(n, pairs, err, sizeof err), 0);
    grank_t k[MAXR];
    memset(k, 0, sizeof k);
    pthread_t th[MAXR];
    for (int r = 0; r < n; r++) {
        k[r] = (grank_t){.rank = r, .n = n, .e = e[r], .want = want, .lg = lg[r]};
        for (int p = 0; p < n; p++)
            k[r].fds[p] = p == r ? -1 : pairs[r * n + p];
        assert_int_equal(pthread_create(&th[r], NULL, s_grank_main, &k[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
        if (k[r].err[0])
            fail_msg("over %s: %s", want, k[r].err);
        assert_int_equal(k[r].nccl, want_nccl);
        assert_true(k[r].entries > 0);
    }
}

/* A group's every logit over the NCCL comm (the stand-in; the headers over ctrl) equals the same
 * group over the sockets, bit for bit, with the dispatch packed, computed and combined in the
 * backend's buffers (ep.c s_dev_round, the default on a device comm) and with it staged through
 * the host (TROUPE_EP_DEVICE_PACK=0); groups of 2 and 4 ranks, of 3, 1, 2 and 2 rows. */
static void test_group_nccl_equals_sockets(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n *= 2) {   /* qwen3-moe-f32's 8 experts over 2 and 4 ranks */
        engine_t *e[MAXR];
        ep_keep_t keep[MAXR];
        backend_ops_t ops[MAXR];
        float *lg[3][MAXR];
        for (int r = 0; r < n; r++) {
            char err[600];
            engine_spec_t sp;
            engine_spec_default(&sp);
            sp.threads = 1;
            assert_non_null(sp.be = backend_new("cpu", 1, err, sizeof err));
            ops[r] = *sp.be->ops;
            ops[r].nccl = &s_fake;
            sp.be->ops = &ops[r];
            assert_non_null(e[r] = engine_new("tests/fixtures/models/qwen3-moe-f32", err, sizeof err));
            keep[r] = (ep_keep_t){.rank = r, .n_ranks = n, .n_experts = e[r]->cfg.num_experts};
            sp.model = (model_opts_t){.max_tokens = 32, .max_seqs = G_SEQS, .max_context = 64, .kv_block_size = 16,
                                      .expert_keep = ep_keep_initial, .expert_ctx = &keep[r]};
            sp.kv_blocks = 16;
            if (engine_load(e[r], &sp, err, sizeof err) != ENGINE_OK)
                fail_msg("rank %d: %s", r, err);
            const size_t cnt = (size_t)G_STEPS * s_grows(r) * e[r]->cfg.vocab_size;
            for (int v = 0; v < 3; v++)
                lg[v][r] = calloc(cnt, sizeof(float));
        }
        s_group(n, e, "nccl", lg[0], 1);   /* the dispatch packed and combined in "device" buffers */
        setenv("TROUPE_EP_DEVICE_PACK", "0", 1);
        s_group(n, e, "nccl", lg[1], 1);   /* host staging over the device comm */
        unsetenv("TROUPE_EP_DEVICE_PACK");
        s_group(n, e, "sock", lg[2], 0);
        for (int r = 0; r < n; r++) {
            const size_t cnt = (size_t)G_STEPS * s_grows(r) * e[r]->cfg.vocab_size;
            if (memcmp(lg[0][r], lg[2][r], cnt * sizeof(float)) != 0)
                fail_msg("group of %d, rank %d: logits over the NCCL comm, packed on the device, differ from the "
                         "sockets'", n, r);
            if (memcmp(lg[1][r], lg[2][r], cnt * sizeof(float)) != 0)
                fail_msg("group of %d, rank %d: logits over the NCCL comm, staged through the host, differ from the "
                         "sockets'", n, r);
            for (int v = 0; v < 3; v++)
                free(lg[v][r]);
            backend_t *be = e[r]->be;
            engine_destroy(&e[r]);
            be->ops = s_cpu->ops;   /* its own ops to be destroyed by */
            backend_destroy(&be);
        }
    }
}

int main(void)
{
    srand(12345);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_want_parse),          cmocka_unit_test(test_choose),
        cmocka_unit_test(test_meet_nccl_2),         cmocka_unit_test(test_meet_nccl_4),
        cmocka_unit_test(test_meet_sock_env),       cmocka_unit_test(test_meet_shared_gpu),
        cmocka_unit_test(test_meet_cpu_ranks),      cmocka_unit_test(test_meet_init_timeout),
        cmocka_unit_test(test_meet_init_refused),   cmocka_unit_test(test_meet_check_corrupt),
        cmocka_unit_test(test_meet_required),       cmocka_unit_test(test_meet_peer_silent),
        cmocka_unit_test(test_nccl_exchange_deadline), cmocka_unit_test(test_nccl_exchange_peer_gone),
        cmocka_unit_test(test_group_nccl_equals_sockets),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
