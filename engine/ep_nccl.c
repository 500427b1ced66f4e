/* engine/ep_nccl.c — the expert-parallel group's transport between GPUs: one NCCL communicator
 * over the group, through the backend's NCCL hooks (bk_nccl_ops_t), so libtroupe stays free of
 * CUDA. An exchange is n-1 pairwise steps: at step i rank r trades with rank (i - r) mod n, which
 * trades with r at the same step, so every pair's send and receive are posted together (one
 * grouped ncclSend/ncclRecv each, bk_nccl_ops_t.xfer) and no rank waits on a peer busy with a third.
 * Both sides of a pair skip a step with nothing either way. Every wait has the exchange's deadline;
 * a failure aborts the communicator.
 *
 * It carries the dispatch and the combine only: the step and round headers go over the sockets
 * the group met on (ep_comm_t.ctrl, set by ep_meet, which also hands the unique id over), whose
 * descriptors are this comm's poll_fds, so a rank with no rows learns of a peer's step in its poll
 * loop and every NCCL exchange starts with every rank agreed on its sizes.
 *
 * engine/ep.c keeps the dispatch and the combine in device memory over this comm (s_dev_round:
 * gathered, exchanged, computed and added on the device; only the routing and index arrays cross
 * to the host), or with TROUPE_EP_DEVICE_PACK=0 stages them through the host as for the sockets.
 *
 * Known limits: written for any number of GPUs; its exchange logic and both of ep.c's paths over
 * it run on the CPU against a stand-in for the NCCL hooks (tests/unit/test_ep_meet.c); not yet run
 * on two GPUs. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "engine/ep.h"

typedef struct {
    ep_comm_t base;
    backend_t *be;
    const bk_nccl_ops_t *nc;
    bk_comm_t *comm;
} ep_nccl_t;

/* The ctrl sockets' descriptors: a peer's step header (or its going away) arrives there. */
static int s_poll_fds(const ep_comm_t *c, int *fds)
{
    return c->ctrl && c->ctrl->ops->poll_fds ? c->ctrl->ops->poll_fds(c->ctrl, fds) : 0;
}

/* 1 when a peer's ctrl socket says it closed (a rank killed mid-exchange): NCCL itself may not
 * notice before the deadline. Never blocks. */
static int s_peer_gone(const ep_comm_t *c)
{
    int fds[EP_MAX_RANKS];
    struct pollfd pf[EP_MAX_RANKS];
    const int n = s_poll_fds(c, fds);
    for (int i = 0; i < n; i++)
        pf[i] = (struct pollfd){.fd = fds[i], .events = POLLRDHUP};
    if (n <= 0 || poll(pf, (nfds_t)n, 0) <= 0)
        return 0;
    for (int i = 0; i < n; i++)
        if (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR))
            return 1;
    return 0;
}

static void s_nap(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

static int s_exchange(ep_comm_t *c, const void *const *send, const size_t *send_n, void *const *recv,
                      const size_t *recv_n, int deadline_ms, char *err, size_t errlen)
{
    ep_nccl_t *s = (ep_nccl_t *)c;
    const int n = c->n_ranks, me = c->rank;
    const int64_t end = deadline_ms < 0 ? -1 : now_ns() + (int64_t)deadline_ms * 1000000;
    int64_t last = -1;
    char peers[160] = "";         /* the ranks traded with, for an error */
    size_t pk = 0;
    if (!s->comm)
        return errf(err, errlen, "rank %d: the NCCL communicator was aborted", me);
    if (send_n[me] || recv_n[me])
        return errf(err, errlen, "rank %d: the NCCL exchange does not copy to its own rank", me);
    for (int i = 0; i < n; i++) {
        const int p = ((i - me) % n + n) % n;
        if (p == me || (!send_n[p] && !recv_n[p]))
            continue;
        bk_span_t sp = {(void *)send[p], send_n[p]}, rp = {recv[p], recv_n[p]};
        char why[256];
        for (;;) {
            int64_t t = s->nc->xfer(s->comm, p, &sp, send_n[p] ? 1 : 0, &rp, recv_n[p] ? 1 : 0, why, sizeof why);
            if (t >= 0) {
                last = t;
                if (pk + 8 < sizeof peers)
                    pk += (size_t)snprintf(peers + pk, sizeof peers - pk, "%s%d", pk ? ", " : "", p);
                break;
            }
            if (s->nc->comm_poll(s->comm, why, sizeof why) < 0 || (end >= 0 && now_ns() > end)) {
                s->nc->comm_abort(&s->comm);
                return errf(err, errlen, "rank %d: NCCL exchange with rank %d: %s", me, p, why);
            }
            s_nap();
        }
    }
    for (unsigned spin = 1; last >= 0; spin++) {
        char why[256];
        int k = s->nc->xfer_poll(s->comm, last, why, sizeof why);
        if (k == 1)
            break;
        if (k == 0 && spin % 64 == 0 && s_peer_gone(c)) {
            s->nc->comm_abort(&s->comm);
            return errf(err, errlen, "rank %d: NCCL exchange with rank(s) %s not complete: a peer's connection "
                        "closed (it has gone)", me, peers);
        }
        if (k < 0 || (end >= 0 && now_ns() > end)) {
            s->nc->comm_abort(&s->comm);
            return errf(err, errlen, "rank %d: NCCL exchange with rank(s) %s not complete%s: %s", me, peers,
                        k < 0 ? "" : " by its deadline", k < 0 ? why : "a rank is gone or stalled");
        }
        s_nap();
    }
    return 0;
}

static void s_destroy(ep_comm_t *c)
{
    ep_nccl_t *s = (ep_nccl_t *)c;
    if (s->comm)
        s->nc->comm_abort(&s->comm);
    if (c->ctrl)
        c->ctrl->ops->destroy(c->ctrl);
    free(s);
}

static const ep_comm_ops_t s_ops = {.name = "NCCL", .device = 1, .exchange = s_exchange, .destroy = s_destroy,
                                    .poll_fds = s_poll_fds};

ep_comm_t *ep_nccl_new(backend_t *be, const uint8_t *id, int rank, int n_ranks, int init_ms, char *err, size_t errlen)
{
    const bk_nccl_ops_t *nc = be->ops->nccl;
    if (!nc) {
        errf(err, errlen, "expert parallelism over NCCL: the %s backend has no NCCL", be->ops->name);
        return NULL;
    }
    if (n_ranks < 1 || n_ranks > EP_MAX_RANKS || rank < 0 || rank >= n_ranks) {
        errf(err, errlen, "expert parallelism: rank %d of %d (1..%d ranks)", rank, n_ranks, EP_MAX_RANKS);
        return NULL;
    }
    ep_nccl_t *s = calloc(1, sizeof *s);
    if (!s) {
        errf(err, errlen, "expert parallelism: out of memory");
        return NULL;
    }
    s->base = (ep_comm_t){.ops = &s_ops, .rank = rank, .n_ranks = n_ranks};
    s->be = be;
    s->nc = nc;
    char why[256];
    if (!(s->comm = nc->comm_init(be, id, n_ranks, rank, why, sizeof why))) {
        errf(err, errlen, "expert parallelism: NCCL rank %d of %d: %s", rank, n_ranks, why);
        free(s);
        return NULL;
    }
    const int64_t end = now_ns() + (int64_t)(init_ms > 0 ? init_ms : EP_FIRST_DEADLINE_MS) * 1000000;
    for (;;) {
        int k = nc->comm_poll(s->comm, why, sizeof why);
        if (k == 1)
            break;
        if (k < 0 || now_ns() > end) {
            if (k < 0)
                errf(err, errlen, "expert parallelism: NCCL rank %d of %d: %s", rank, n_ranks, why);
            else
                errf(err, errlen, "expert parallelism: NCCL rank %d of %d: the communicator did not come up within "
                     "%d ms (a rank never joined)", rank, n_ranks, init_ms);
            s_destroy(&s->base);
            return NULL;
        }
        s_nap();
    }
    return &s->base;
}
