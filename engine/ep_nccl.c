/* engine/ep_nccl.c — the expert-parallel group's transport between GPUs: one NCCL communicator
 * over the group, through the backend's NCCL hooks (bk_nccl_ops_t), so libtroupe stays free of
 * CUDA. An exchange is n-1 pairwise steps: at step i rank r trades with rank (i - r) mod n, which
 * trades with r at the same step, so every pair's send and receive are posted together (one
 * grouped ncclSend/ncclRecv each, bk_nccl_ops_t.xfer) and no rank waits on a peer busy with a third.
 * Both sides of a pair skip a step with nothing either way. Every wait has the exchange's deadline;
 * a failure aborts the communicator. Written for any number of GPUs; not yet run on more than one. */
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
                break;
            }
            if (s->nc->comm_poll(s->comm, why, sizeof why) < 0 || (end >= 0 && now_ns() > end)) {
                s->nc->comm_abort(&s->comm);
                return errf(err, errlen, "rank %d: NCCL exchange with rank %d: %s", me, p, why);
            }
            s_nap();
        }
    }
    while (last >= 0) {
        char why[256];
        int k = s->nc->xfer_poll(s->comm, last, why, sizeof why);
        if (k == 1)
            break;
        if (k < 0 || (end >= 0 && now_ns() > end)) {
            s->nc->comm_abort(&s->comm);
            return errf(err, errlen, "rank %d: NCCL exchange not complete%s: %s", me,
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
    free(s);
}

static const ep_comm_ops_t s_ops = {.name = "NCCL", .device = 1, .exchange = s_exchange, .destroy = s_destroy};

ep_comm_t *ep_nccl_new(backend_t *be, const uint8_t *id, int rank, int n_ranks, char *err, size_t errlen)
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
    const int64_t end = now_ns() + (int64_t)EP_FIRST_DEADLINE_MS * 1000000;
    for (;;) {
        int k = nc->comm_poll(s->comm, why, sizeof why);
        if (k == 1)
            break;
        if (k < 0 || now_ns() > end) {
            errf(err, errlen, "expert parallelism: NCCL rank %d of %d: %s", rank, n_ranks,
                 k < 0 ? why : "the communicator did not come up (a rank never joined)");
            s_destroy(&s->base);
            return NULL;
        }
        s_nap();
    }
    return &s->base;
}
