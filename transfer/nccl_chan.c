#include "transfer/nccl_chan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"

static const char *const s_state_names[TCHAN_NCCL_STATE_COUNT] = {"closed", "init", "warmup", "ready", "failed"};

const char *tchan_nccl_state_name(tchan_nccl_state_t s)
{
    return (unsigned)s < TCHAN_NCCL_STATE_COUNT ? s_state_names[s] : "?";
}

int tchan_nccl_available(const backend_t *be) { return be && be->ops->nccl != NULL; }

int tchan_nccl_unique_id(backend_t *be, uint8_t id[TCHAN_NCCL_ID_BYTES], char *err, size_t errlen)
{
    if (!tchan_nccl_available(be))
        return errf(err, errlen, "backend %s has no NCCL", be ? be->ops->name : "(none)");
    return be->ops->nccl->unique_id(id, err, errlen);
}

/* "NCCL link to decode-1 (link 5c1f00000003): " + the rest; also the link's why. */
static int s_errf(const tchan_nccl_t *l, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int s_errf(const tchan_nccl_t *l, char *err, size_t errlen, const char *fmt, ...)
{
    char rest[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rest, sizeof rest, fmt, ap);
    va_end(ap);
    return errf(err, errlen, "NCCL link to %s (link %llx): %s", l->peer, (unsigned long long)l->link_id, rest);
}

static void s_abort_comm(tchan_nccl_t *l)
{
    if (l->comm)
        l->be->ops->nccl->comm_abort(&l->comm);
    l->comm = NULL;
}

/* Aborts and keeps why (the first reason wins). Returns -1 with why in err. */
static int s_fail(tchan_nccl_t *l, char *err, size_t errlen, const char *why)
{
    s_abort_comm(l);
    if (l->state != TCHAN_NCCL_FAILED)
        snprintf(l->why, sizeof l->why, "%s", why);
    l->state = TCHAN_NCCL_FAILED;
    return errf(err, errlen, "%s", l->why);
}

void tchan_nccl_abort(tchan_nccl_t *l, const char *why)
{
    if (l->state == TCHAN_NCCL_CLOSED)
        return;
    s_fail(l, NULL, 0, why ? why : "aborted");
}

void tchan_nccl_close(tchan_nccl_t *l)
{
    if (l->comm)
        s_abort_comm(l);
    if (l->warm_buf)
        l->be->ops->free(l->be, l->warm_buf);
    free(l->spans);
    memset(l, 0, sizeof *l);
    l->warm.ticket = -1;
}

int tchan_nccl_open(tchan_nccl_t *l, backend_t *be, const char *peer, uint64_t link_id, const uint8_t *id,
                    size_t id_len, int n_ranks, int rank, int64_t timeout_ms, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    l->be = be;
    l->warm.ticket = -1;
    snprintf(l->peer, sizeof l->peer, "%s", peer ? peer : "?");
    l->link_id = link_id;
    if (!tchan_nccl_available(be))
        return s_errf(l, err, errlen, "backend %s has no NCCL", be ? be->ops->name : "(none)");
    if (id_len != TCHAN_NCCL_ID_BYTES)
        return s_errf(l, err, errlen, "a bootstrap of %zu bytes (an NCCL unique id has %d)", id_len,
                      TCHAN_NCCL_ID_BYTES);
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks || n_ranks > 2)
        return s_errf(l, err, errlen, "rank %d of %d (a link has one or two ranks)", rank, n_ranks);
    l->n_ranks = n_ranks;
    l->rank = rank;
    l->peer_rank = n_ranks == 1 ? rank : 1 - rank;
    l->warm_buf = be->ops->alloc(be, 2 * TCHAN_NCCL_WARM_BYTES);
    if (!l->warm_buf)
        return s_errf(l, err, errlen, "no device memory for the link");
    char why[400];
    l->comm = be->ops->nccl->comm_init(be, id, n_ranks, rank, why, sizeof why);
    if (!l->comm) {
        s_errf(l, err, errlen, "%s", why);
        tchan_nccl_close(l);
        return -1;
    }
    l->opened_ms = now_ms();
    l->deadline_ms = l->opened_ms + timeout_ms;
    l->state = TCHAN_NCCL_INIT;
    return 0;
}

/* Posts sends and receives of spans (sends first in l->spans). */
static int s_post(tchan_nccl_t *l, int n_sends, int n_recvs, int n_blocks, size_t bytes, const char *what,
                  int64_t timeout_ms, tchan_nccl_xfer_t *x, char *err, size_t errlen)
{
    char why[400], msg[480];
    int64_t t = l->be->ops->nccl->xfer(l->comm, l->peer_rank, l->spans, n_sends, l->spans + n_sends, n_recvs, why,
                                       sizeof why);
    if (t < 0) {
        /* Nothing posted and the communicator well (busy enqueueing an earlier transfer, too many
         * in flight): this transfer goes another way, the link stays. Else the order may be broken. */
        char ignore[8];
        if (l->be->ops->nccl->comm_poll(l->comm, ignore, sizeof ignore) >= 0)
            return s_errf(l, err, errlen, "the %s of %d blocks was not posted: %s", what, n_blocks, why);
        s_errf(l, msg, sizeof msg, "posting the %s of %d blocks failed: %s; communicator aborted", what, n_blocks, why);
        return s_fail(l, err, errlen, msg);
    }
    *x = (tchan_nccl_xfer_t){.ticket = t, .link_id = l->link_id, .started_ms = now_ms(), .n_blocks = n_blocks,
                             .bytes = bytes, .what = what};
    x->deadline_ms = x->started_ms + timeout_ms;
    return 0;
}

static int s_spans(tchan_nccl_t *l, int n, char *err, size_t errlen)
{
    if (n <= l->spans_cap)
        return 0;
    bk_span_t *p = realloc(l->spans, (size_t)n * sizeof *p);
    if (!p)
        return s_errf(l, err, errlen, "out of memory for %d spans", n);
    l->spans = p;
    l->spans_cap = n;
    return 0;
}

static int s_ready(tchan_nccl_t *l, int n, char *err, size_t errlen)
{
    if (l->state != TCHAN_NCCL_READY)
        return l->state == TCHAN_NCCL_FAILED ? errf(err, errlen, "%s", l->why)
                                             : s_errf(l, err, errlen, "not ready (%s)", tchan_nccl_state_name(l->state));
    if (n <= 0)
        return s_errf(l, err, errlen, "a transfer of %d blocks", n);
    return 0;
}

/* The device spans of blocks[0..n) of kv, from slot `at` on; -1 when a block id is outside the pool. */
static int s_block_spans(tchan_nccl_t *l, int at, const bk_kv_t *kv, const int32_t *blocks, int n, char *err,
                         size_t errlen)
{
    for (int i = 0; i < n; i++) {
        if (blocks[i] < 0 || blocks[i] >= kv->n_blocks)
            return s_errf(l, err, errlen, "block %d is outside the pool of %d", blocks[i], kv->n_blocks);
        l->spans[at + i] = (bk_span_t){(uint8_t *)kv->base + (size_t)blocks[i] * kv->block_bytes, kv->block_bytes};
    }
    return 0;
}

static int s_one_way(tchan_nccl_t *l, int send, const bk_kv_t *kv, const int32_t *blocks, int n, int64_t timeout_ms,
                     tchan_nccl_xfer_t *x, char *err, size_t errlen)
{
    x->ticket = -1;
    if (s_ready(l, n, err, errlen) != 0 || s_spans(l, n, err, errlen) != 0 ||
        s_block_spans(l, 0, kv, blocks, n, err, errlen) != 0)
        return -1;
    return s_post(l, send ? n : 0, send ? 0 : n, n, (size_t)n * kv->block_bytes, send ? "send" : "receive",
                  timeout_ms, x, err, errlen);
}

int tchan_nccl_send(tchan_nccl_t *l, const bk_kv_t *kv, const int32_t *blocks, int n, int64_t timeout_ms,
                    tchan_nccl_xfer_t *x, char *err, size_t errlen)
{
    return s_one_way(l, 1, kv, blocks, n, timeout_ms, x, err, errlen);
}

int tchan_nccl_recv(tchan_nccl_t *l, const bk_kv_t *kv, const int32_t *blocks, int n, int64_t timeout_ms,
                    tchan_nccl_xfer_t *x, char *err, size_t errlen)
{
    return s_one_way(l, 0, kv, blocks, n, timeout_ms, x, err, errlen);
}

int tchan_nccl_discard(tchan_nccl_t *l, void *scratch, size_t block_bytes, int n, int64_t timeout_ms,
                       tchan_nccl_xfer_t *x, char *err, size_t errlen)
{
    x->ticket = -1;
    if (s_ready(l, n, err, errlen) != 0 || s_spans(l, n, err, errlen) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        l->spans[i] = (bk_span_t){scratch, block_bytes};
    return s_post(l, 0, n, n, (size_t)n * block_bytes, "discard", timeout_ms, x, err, errlen);
}

int tchan_nccl_sendrecv(tchan_nccl_t *l, const bk_kv_t *src, const int32_t *src_blocks, const bk_kv_t *dst,
                        const int32_t *dst_blocks, int n, int64_t timeout_ms, tchan_nccl_xfer_t *x, char *err,
                        size_t errlen)
{
    x->ticket = -1;
    if (s_ready(l, n, err, errlen) != 0)
        return -1;
    if (l->n_ranks != 1)
        return s_errf(l, err, errlen, "send+receive to itself needs a one-rank link");
    if (src->block_bytes != dst->block_bytes)
        return s_errf(l, err, errlen, "blocks of %zu bytes into blocks of %zu", src->block_bytes, dst->block_bytes);
    if (s_spans(l, 2 * n, err, errlen) != 0 || s_block_spans(l, 0, src, src_blocks, n, err, errlen) != 0 ||
        s_block_spans(l, n, dst, dst_blocks, n, err, errlen) != 0)
        return -1;
    return s_post(l, n, n, n, (size_t)n * src->block_bytes, "send+receive", timeout_ms, x, err, errlen);
}

int tchan_nccl_test(tchan_nccl_t *l, tchan_nccl_xfer_t *x, char *err, size_t errlen)
{
    char why[400], msg[480];
    if (x->done)
        return 1;
    if (x->ticket < 0)
        return s_errf(l, err, errlen, "no transfer posted");
    if (x->link_id != l->link_id || !l->comm) {
        if (l->state == TCHAN_NCCL_FAILED && x->link_id == l->link_id)
            return errf(err, errlen, "%s", l->why);
        return s_errf(l, err, errlen, "the %s of %d blocks was posted on link %llx, which is gone", x->what,
                      x->n_blocks, (unsigned long long)x->link_id);
    }
    int s = l->be->ops->nccl->xfer_poll(l->comm, x->ticket, why, sizeof why);
    if (s > 0) {
        if (x != &l->warm) {
            l->transfers++;
            l->bytes += x->bytes;
        }
        x->done = 1;
        return 1;
    }
    if (s < 0) {
        s_errf(l, msg, sizeof msg, "%s of %d blocks (%.1f MiB) failed: %s; communicator aborted", x->what, x->n_blocks,
               (double)x->bytes / (1 << 20), why);
        return s_fail(l, err, errlen, msg);
    }
    int64_t now = now_ms();
    if (now > x->deadline_ms) {
        s_errf(l, msg, sizeof msg, "%s of %d blocks (%.1f MiB) not complete after %lld ms; communicator aborted",
               x->what, x->n_blocks, (double)x->bytes / (1 << 20), (long long)(now - x->started_ms));
        return s_fail(l, err, errlen, msg);
    }
    return 0;
}

int tchan_nccl_wait(tchan_nccl_t *l, tchan_nccl_xfer_t *x, char *err, size_t errlen)
{
    int s;
    while ((s = tchan_nccl_test(l, x, err, errlen)) == 0) {
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
    }
    return s;
}

tchan_nccl_state_t tchan_nccl_poll(tchan_nccl_t *l, char *err, size_t errlen)
{
    char why[400], msg[480];
    int64_t now = now_ms();
    if (l->state == TCHAN_NCCL_INIT) {
        int s = l->be->ops->nccl->comm_poll(l->comm, why, sizeof why);
        if (s < 0) {
            s_errf(l, msg, sizeof msg, "initialisation failed: %s; communicator aborted", why);
            s_fail(l, err, errlen, msg);
        } else if (s == 0 && now > l->deadline_ms) {
            s_errf(l, msg, sizeof msg, "initialisation (rank %d of %d) not complete after %lld ms; communicator aborted",
                   l->rank, l->n_ranks, (long long)(now - l->opened_ms));
            s_fail(l, err, errlen, msg);
        } else if (s > 0) {
            /* The first exchange: both ranks send and receive a few bytes in one group. */
            bk_span_t out = {l->warm_buf, TCHAN_NCCL_WARM_BYTES};
            bk_span_t in = {(uint8_t *)l->warm_buf + TCHAN_NCCL_WARM_BYTES, TCHAN_NCCL_WARM_BYTES};
            if (s_spans(l, 2, err, errlen) != 0)
                return l->state;
            l->spans[0] = out;
            l->spans[1] = in;
            if (s_post(l, 1, 1, 0, TCHAN_NCCL_WARM_BYTES, "exchange", l->deadline_ms - now, &l->warm, err, errlen) == 0)
                l->state = TCHAN_NCCL_WARMUP;
        }
    }
    if (l->state == TCHAN_NCCL_WARMUP) {
        int s = tchan_nccl_test(l, &l->warm, err, errlen);
        if (s > 0)
            l->state = TCHAN_NCCL_READY;
    }
    if (l->state == TCHAN_NCCL_FAILED)
        errf(err, errlen, "%s", l->why);
    return l->state;
}
