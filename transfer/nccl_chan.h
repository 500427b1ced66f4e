/* transfer/nccl_chan.h — the NCCL tensor channel: whole KV blocks between processes on
 * different GPUs, through the backend's NCCL hooks (kernels/backend.h bk_nccl_ops_t). Plain C: the
 * NCCL calls themselves live in kernels/cuda/cuda_nccl.cu, reached through the backend's ops table,
 * so libtroupe stays free of CUDA and NCCL.
 *
 * One tchan_nccl_t is one link, a communicator of n_ranks (2 for a hand-off: the sender is rank 0,
 * the receiver rank 1; 1 for a self test). Its life:
 *   1. the offering side makes a unique id (tchan_nccl_unique_id) and sends it to the other over
 *      our own control plane (a kv_link message: transfer/kv_link.h);
 *   2. both open the link with it (tchan_nccl_open: non-blocking ncclCommInitRankConfig) and poll
 *      it (tchan_nccl_poll) until READY: initialised, then one small exchange with the peer that
 *      sets up NCCL's point-to-point connections (so the first hand-off does not wait for the peer
 *      to connect) and proves both sides are there;
 *   3. transfers: the sender posts a send of the blocks before the handoff that describes them, the
 *      receiver posts the matching receive when it takes the hand-off; each side polls its
 *      transfer (tchan_nccl_test, or tchan_nccl_wait which sleeps between polls).
 * Every wait has a deadline. A deadline that passes, or an error NCCL reports (ncclCommGetAsyncError),
 * aborts the communicator (ncclCommAbort: whatever is in flight ends) and leaves the link FAILED
 * with an error naming the peer and what did not complete, e.g.
 *     NCCL link to decode-1 (link 5c1f00000003): send of 12 blocks (24.0 MiB) not complete after
 *     4000 ms; communicator aborted
 * The caller then moves its blocks another way (the pair's fallback: shared memory on one node, tcp
 * across nodes) and may open a new link later.
 *
 * Blocks: a KV block is one contiguous chunk (every layer's K and V: bk_kv_t's block layout), so
 * one block travels as one ncclSend/ncclRecv of block_bytes; a transfer's blocks go in groups of
 * BK_NCCL_GROUP_SPANS. Sends and receives match in posting order per link, so both sides must post
 * the same transfers in the same order with the same block counts: a receiver that refuses a
 * hand-off still receives its bytes (tchan_nccl_discard) or the link must be aborted.
 *
 * Ordering with the model: a transfer starts after the ops already queued on the backend's stream
 * (the KV sent is complete; the blocks received into are no longer read) and runs on the link's
 * own stream; received blocks may be used once tchan_nccl_test/wait said done. Sent blocks may be
 * reused once the send is done or the link was aborted. */
#ifndef TROUPE_NCCL_CHAN_H
#define TROUPE_NCCL_CHAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define TCHAN_NCCL_ID_BYTES BK_NCCL_ID_BYTES
#define TCHAN_NCCL_PEER_MAX 64
/* The READY exchange, each way. Large enough for NCCL's bulk protocol on every channel it will use
 * for hand-offs, so their connections and kernels are set up before the first real one (a 256-byte
 * exchange left ~75 ms of set-up inside the first hand-off on two H200s). */
#define TCHAN_NCCL_WARM_BYTES (16u << 20)

typedef enum tchan_nccl_state {
    TCHAN_NCCL_CLOSED = 0,        /* never opened, or closed */
    TCHAN_NCCL_INIT,              /* the communicator is initialising */
    TCHAN_NCCL_WARMUP,            /* initialised; the first exchange with the peer is in flight */
    TCHAN_NCCL_READY,             /* transfers may be posted */
    TCHAN_NCCL_FAILED,            /* aborted; why says what happened */
    TCHAN_NCCL_STATE_COUNT
} tchan_nccl_state_t;

/* One posted transfer, held by the caller (a request's hand-off). */
typedef struct tchan_nccl_xfer {
    int64_t ticket;               /* the backend's; -1: nothing posted */
    int done;                     /* seen complete (tchan_nccl_test says 1 from then on) */
    uint64_t link_id;             /* the link it was posted on (a transfer of an aborted link is dead) */
    int64_t started_ms, deadline_ms;   /* now_ms() clock */
    int n_blocks;
    size_t bytes;
    const char *what;             /* "send", "receive", "discard", "exchange", "send+receive" */
} tchan_nccl_xfer_t;

typedef struct tchan_nccl {
    backend_t *be;
    bk_comm_t *comm;              /* NULL unless INIT, WARMUP or READY */
    tchan_nccl_state_t state;
    char peer[TCHAN_NCCL_PEER_MAX];   /* the other side's actor name, for errors */
    uint64_t link_id;             /* the offerer's id (kv_link.link_id) */
    int n_ranks, rank, peer_rank; /* peer_rank: the other rank (own rank on a one-rank link) */
    int64_t opened_ms, deadline_ms;   /* INIT and WARMUP must be over by deadline_ms */
    tchan_nccl_xfer_t warm;       /* the READY exchange */
    void *warm_buf;               /* device [2][TCHAN_NCCL_WARM_BYTES]: out, in */
    bk_span_t *spans;             /* [spans_cap] scratch for posting */
    int spans_cap;
    uint64_t transfers;           /* completed transfers (the READY exchange not counted) */
    uint64_t bytes;               /* their bytes */
    char why[512];                /* FAILED: what happened */
} tchan_nccl_t;

const char *tchan_nccl_state_name(tchan_nccl_state_t s);

/* 1 when the backend can make NCCL links (CUDA backend built with nccl.h). */
int tchan_nccl_available(const backend_t *be);

/* A fresh unique id for a link whose rank 0 lives in this process. */
int tchan_nccl_unique_id(backend_t *be, uint8_t id[TCHAN_NCCL_ID_BYTES], char *err, size_t errlen);

/* Starts opening link `link_id` to `peer` as rank `rank` of `n_ranks` from the unique id
 * (id_len must be TCHAN_NCCL_ID_BYTES); it must be READY within timeout_ms. *l must be CLOSED (or
 * zeroed). -1 with why (and *l CLOSED) when the id is malformed or NCCL refused at once. */
int tchan_nccl_open(tchan_nccl_t *l, backend_t *be, const char *peer, uint64_t link_id, const uint8_t *id,
                    size_t id_len, int n_ranks, int rank, int64_t timeout_ms, char *err, size_t errlen);

/* Moves INIT and WARMUP on (never blocks) and returns the state; err gets why when it is FAILED. */
tchan_nccl_state_t tchan_nccl_poll(tchan_nccl_t *l, char *err, size_t errlen);

/* Posts a transfer on a READY link (never blocks): blocks[0..n) of kv, each whole. It must finish
 * within timeout_ms of now. -1 with why when the link is not READY or NCCL refused (the link is
 * then aborted: a half-posted transfer would break the order). */
int tchan_nccl_send(tchan_nccl_t *l, const bk_kv_t *kv, const int32_t *blocks, int n, int64_t timeout_ms,
                    tchan_nccl_xfer_t *x, char *err, size_t errlen);
int tchan_nccl_recv(tchan_nccl_t *l, const bk_kv_t *kv, const int32_t *blocks, int n, int64_t timeout_ms,
                    tchan_nccl_xfer_t *x, char *err, size_t errlen);
/* Receives n blocks of block_bytes, every one into the same device scratch (their bytes are not
 * wanted: a refused hand-off), keeping the link's order. */
int tchan_nccl_discard(tchan_nccl_t *l, void *scratch, size_t block_bytes, int n, int64_t timeout_ms,
                       tchan_nccl_xfer_t *x, char *err, size_t errlen);
/* One-rank link only: src_blocks of src to dst_blocks of dst (same block size) in one group. */
int tchan_nccl_sendrecv(tchan_nccl_t *l, const bk_kv_t *src, const int32_t *src_blocks, const bk_kv_t *dst,
                        const int32_t *dst_blocks, int n, int64_t timeout_ms, tchan_nccl_xfer_t *x, char *err,
                        size_t errlen);

/* 1 done, 0 in flight, -1 failed: NCCL reported an error, the deadline passed, or the link was
 * aborted since it was posted. The first two abort the link; err says which and names the peer. */
int tchan_nccl_test(tchan_nccl_t *l, tchan_nccl_xfer_t *x, char *err, size_t errlen);
/* tchan_nccl_test until it is not 0 (sleeping 50 us between polls): bounded by the deadline. */
int tchan_nccl_wait(tchan_nccl_t *l, tchan_nccl_xfer_t *x, char *err, size_t errlen);

/* ncclCommAbort now; the link is FAILED with why (kept when NULL). Idempotent. */
void tchan_nccl_abort(tchan_nccl_t *l, const char *why);
/* Aborts what is open and frees everything; the link is CLOSED. Idempotent. */
void tchan_nccl_close(tchan_nccl_t *l);

#endif
