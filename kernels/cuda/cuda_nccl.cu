/* kernels/cuda/cuda_nccl.cu — the CUDA backend's NCCL hooks (bk_nccl_ops_t in kernels/backend.h):
 * communicators of the backend's device and point-to-point transfers of device memory through
 * them, every step polled. Compiled to nothing unless the Makefile found nccl.h (TROUPE_NCCL); the
 * backend's .nccl is NULL then and callers keep to the shared-memory channel.
 *
 * Communicators are non-blocking (config.blocking = 0): ncclCommInitRankConfig and ncclGroupEnd
 * may return ncclInProgress while NCCL's own threads do the work (bootstrap, connection set-up
 * with the peer), and ncclCommGetAsyncError says when it is over; no other NCCL call is made on
 * the communicator meanwhile. So a transfer is enqueued group by group (BK_NCCL_GROUP_SPANS spans
 * per direction in each ncclGroupStart/End), from xfer and then from xfer_poll whenever NCCL has
 * accepted the previous group, and its completion event is recorded on the communicator's stream
 * after its last group went in. One transfer is enqueued at a time; while one is, xfer refuses
 * another (the caller falls back) instead of waiting for the peer.
 *
 * Streams: each transfer first makes the communicator's stream wait for an event recorded on the
 * backend's stream (the KV it sends is written, the blocks it receives into are no longer read);
 * nothing ever makes the backend's stream wait for the communicator's, so a send the peer never
 * matches (a dead or wedged peer) holds up no model op and no download: only its own event, which
 * the caller polls with a deadline before ncclCommAbort ends it.
 *
 * Errors are returned, never fatal (unlike the ops' CUDA_CHECK): a peer that died or never came is
 * the caller's to handle, and the process stays useful through the shared-memory channel.
 *
 * Known limits: a communicator is torn down with ncclCommAbort only (ncclCommFinalize waits for
 * every rank to finalize too, which a dying or already-gone peer never does). */
#ifdef TROUPE_NCCL
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

#define INFLIGHT 64               /* transfers posted and not yet seen complete, per communicator */

struct bk_comm {
    int device;
    cudaStream_t be_stream;       /* the backend's stream (borrowed) */
    ncclComm_t comm;
    cudaStream_t stream;          /* the transfers' stream */
    cudaEvent_t ready;            /* recorded on the backend's stream when a transfer is posted */
    cudaEvent_t done[INFLIGHT];   /* done[t % INFLIGHT]: recorded after transfer t's last group */
    int64_t next;                 /* ticket of the next transfer */
    int64_t completed;            /* every ticket below this one has completed */
    /* The transfer being enqueued (enq >= 0): its spans, sends first, then receives. */
    int64_t enq;
    int peer, n_sends, n_recvs, group, n_groups;
    int pending;                  /* its last ncclGroupEnd returned ncclInProgress */
    bk_span_t *spans;             /* [cap] */
    int cap;
    int failed;                   /* 1: NCCL or CUDA failed; why says how; only abort is left */
    char why[384];
};

static int s_fail(bk_comm_t *c, const char *what, const char *detail)
{
    if (!c->failed)
        snprintf(c->why, sizeof c->why, "%s: %s", what, detail);
    c->failed = 1;
    return -1;
}

static int s_fail_nccl(bk_comm_t *c, const char *what, ncclResult_t r)
{
    char d[320];
    const char *last = ncclGetLastError(c->comm);
    snprintf(d, sizeof d, "%s%s%s", ncclGetErrorString(r), last && *last ? "; " : "", last ? last : "");
    return s_fail(c, what, d);
}

static int s_fail_cuda(bk_comm_t *c, const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    return s_fail(c, what, cudaGetErrorString(e));
}

static void s_free(bk_comm_t *c)
{
    if (c->stream)
        cudaStreamDestroy(c->stream);   /* returns at once; released when its work is gone */
    if (c->ready)
        cudaEventDestroy(c->ready);
    for (int i = 0; i < INFLIGHT; i++)
        if (c->done[i])
            cudaEventDestroy(c->done[i]);
    (void)cudaGetLastError();
    free(c->spans);
    free(c);
}

static int s_unique_id(uint8_t id[BK_NCCL_ID_BYTES], char *err, size_t errlen)
{
    static_assert(sizeof(ncclUniqueId) == BK_NCCL_ID_BYTES, "ncclUniqueId size");
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return errf(err, errlen, "ncclGetUniqueId: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
    memcpy(id, &u, sizeof u);
    return 0;
}

static bk_comm_t *s_comm_init(backend_t *be, const uint8_t id[BK_NCCL_ID_BYTES], int n_ranks, int rank, char *err,
                              size_t errlen)
{
    cuda_state_t *st = cuda_st(be);
    bk_comm_t *c = (bk_comm_t *)calloc(1, sizeof *c);
    if (!c) {
        errf(err, errlen, "out of memory");
        return NULL;
    }
    c->device = st->device;
    c->be_stream = st->stream;
    c->enq = -1;
    cudaError_t e = cudaSetDevice(st->device);   /* NCCL takes the calling thread's device */
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming);
    for (int i = 0; i < INFLIGHT && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&c->done[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        errf(err, errlen, "cuda:%d: cannot make the transfer stream and events: %s", st->device, cudaGetErrorString(e));
        s_free(c);
        return NULL;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "troupe-kv";
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, n_ranks, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        errf(err, errlen, "ncclCommInitRankConfig (rank %d of %d on cuda:%d): %s (%s)", rank, n_ranks, st->device,
             ncclGetErrorString(r), ncclGetLastError(c->comm));
        if (c->comm)
            ncclCommAbort(c->comm);
        s_free(c);
        return NULL;
    }
    return c;
}

/* ncclCommGetAsyncError: 1 idle and well, 0 still working (init, an enqueue), -1 failed. */
static int s_state(bk_comm_t *c, const char *what)
{
    if (c->failed)
        return -1;
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
    if (r != ncclSuccess)
        return s_fail_nccl(c, "ncclCommGetAsyncError", r);
    if (st == ncclInProgress)
        return 0;
    if (st != ncclSuccess)
        return s_fail_nccl(c, what, st);
    return 1;
}

static int s_comm_poll(bk_comm_t *c, char *err, size_t errlen)
{
    int s = s_state(c, "communicator initialisation");
    if (s < 0)
        errf(err, errlen, "%s", c->why);
    return s;
}

/* Enqueues the current transfer's groups while NCCL takes them at once; records its event after
 * the last. 0, or -1 when NCCL failed. */
static int s_issue(bk_comm_t *c)
{
    const int G = BK_NCCL_GROUP_SPANS;
    while (c->enq >= 0 && !c->pending) {
        if (c->group == c->n_groups) {
            cudaError_t e = cudaEventRecord(c->done[c->enq % INFLIGHT], c->stream);
            if (e != cudaSuccess)
                return s_fail_cuda(c, "cudaEventRecord after a transfer", e);
            c->enq = -1;
            break;
        }
        int g = c->group++;
        ncclResult_t r = ncclGroupStart(), first = ncclSuccess;
        if (r != ncclSuccess)
            return s_fail_nccl(c, "ncclGroupStart", r);
        for (int i = g * G; i < c->n_sends && i < (g + 1) * G && first == ncclSuccess; i++)
            first = ncclSend(c->spans[i].dev, c->spans[i].bytes, ncclUint8, c->peer, c->comm, c->stream);
        for (int i = g * G; i < c->n_recvs && i < (g + 1) * G && first == ncclSuccess; i++) {
            const bk_span_t *s = &c->spans[c->n_sends + i];
            first = ncclRecv(s->dev, s->bytes, ncclUint8, c->peer, c->comm, c->stream);
        }
        r = ncclGroupEnd();   /* always: a group once started must end */
        if (first != ncclSuccess && first != ncclInProgress)
            return s_fail_nccl(c, "ncclSend/ncclRecv", first);
        if (r == ncclInProgress)
            c->pending = 1;
        else if (r != ncclSuccess)
            return s_fail_nccl(c, "ncclGroupEnd", r);
    }
    return 0;
}

/* Moves a pending enqueue on when NCCL has taken its last group. */
static int s_progress(bk_comm_t *c)
{
    if (c->failed)
        return -1;
    if (!c->pending)
        return 0;
    int s = s_state(c, "enqueueing a transfer");
    if (s <= 0)
        return s;
    c->pending = 0;
    return s_issue(c);
}

/* Advances `completed` over the transfers whose event has fired. */
static int s_reap(bk_comm_t *c)
{
    while (c->completed < c->next && c->completed != c->enq) {
        cudaError_t e = cudaEventQuery(c->done[c->completed % INFLIGHT]);
        if (e == cudaErrorNotReady) {
            (void)cudaGetLastError();
            break;
        }
        if (e != cudaSuccess)
            return s_fail_cuda(c, "a transfer's event", e);
        c->completed++;
    }
    return 0;
}

static int64_t s_xfer(bk_comm_t *c, int peer, const bk_span_t *sends, int n_sends, const bk_span_t *recvs, int n_recvs,
                      char *err, size_t errlen)
{
    if (s_progress(c) < 0 || s_reap(c) < 0)
        return errf(err, errlen, "%s", c->why);
    if (n_sends < 0 || n_recvs < 0 || n_sends + n_recvs == 0)
        return errf(err, errlen, "a transfer of nothing (%d sends, %d receives)", n_sends, n_recvs);
    if (c->enq >= 0)
        return errf(err, errlen, "transfer %lld is still being enqueued (NCCL is setting up with the peer)",
                    (long long)c->enq);
    if (c->next - c->completed >= INFLIGHT)
        return errf(err, errlen, "%d transfers in flight, none complete", INFLIGHT);
    if (n_sends + n_recvs > c->cap) {
        int cap = n_sends + n_recvs + 64;
        bk_span_t *p = (bk_span_t *)realloc(c->spans, (size_t)cap * sizeof *p);
        if (!p)
            return errf(err, errlen, "out of memory for %d spans", n_sends + n_recvs);
        c->spans = p;
        c->cap = cap;
    }
    if (n_sends)
        memcpy(c->spans, sends, (size_t)n_sends * sizeof *sends);
    if (n_recvs)
        memcpy(c->spans + n_sends, recvs, (size_t)n_recvs * sizeof *recvs);
    /* After the backend's queued work: what we send is written, what we overwrite is read. */
    cudaError_t e = cudaEventRecord(c->ready, c->be_stream);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(c->stream, c->ready, 0);
    if (e != cudaSuccess) {
        s_fail_cuda(c, "ordering a transfer after the backend's stream", e);
        return errf(err, errlen, "%s", c->why);
    }
    int64_t t = c->next++;
    const int G = BK_NCCL_GROUP_SPANS;
    int gs = (n_sends + G - 1) / G, gr = (n_recvs + G - 1) / G;
    c->enq = t;
    c->peer = peer;
    c->n_sends = n_sends;
    c->n_recvs = n_recvs;
    c->group = 0;
    c->n_groups = gs > gr ? gs : gr;
    if (s_issue(c) < 0)
        return errf(err, errlen, "%s", c->why);
    return t;
}

static int s_xfer_poll(bk_comm_t *c, int64_t ticket, char *err, size_t errlen)
{
    if (ticket < 0 || ticket >= c->next)
        return errf(err, errlen, "no transfer %lld on this communicator", (long long)ticket);
    if (c->completed > ticket)
        return 1;
    /* An error NCCL found in the background (a peer gone, a remote error) shows here. */
    if (s_progress(c) < 0 || s_reap(c) < 0 || (!c->pending && s_state(c, "a transfer") < 0))
        return errf(err, errlen, "%s", c->why);
    return c->completed > ticket ? 1 : 0;
}

static void s_comm_abort(bk_comm_t **cp)
{
    bk_comm_t *c = cp ? *cp : NULL;
    if (!c)
        return;
    if (c->comm)
        ncclCommAbort(c->comm);   /* kernels in flight see the abort flag and end */
    s_free(c);
    *cp = NULL;
}

const bk_nccl_ops_t cuda_nccl_ops = {
    .unique_id = s_unique_id,
    .comm_init = s_comm_init,
    .comm_poll = s_comm_poll,
    .xfer = s_xfer,
    .xfer_poll = s_xfer_poll,
    .comm_abort = s_comm_abort,
};

#endif
