/* actors/worker/handoff_out.h — a prefill worker hands a request over to its decode worker: the
 * prompt's KV blocks moved (or posted) by the channel the topology gives the pair, then one handoff
 * message that carries the transfer's description (transfer/kv_chan.h). The twin of handoff_in.h:
 * the transfer contract's sender side, which the prefill step need not read.
 *
 * A hand-off's life (handoff_out_start until the owner's done or fail hook):
 *   - same GPU: CUDA IPC (the decode worker copies out of our pool); another GPU: an NCCL send,
 *     once the link to that worker is up; else a shared-memory segment on one node, or bytes
 *     staged for the network across nodes. Our blocks stay ours until the kv_ack.
 *   - ok: done. An NCCL one is done only when the ack came AND our send is seen complete (until
 *     then NCCL may still read the blocks).
 *   - refused, or not acknowledged within HANDOFF_TIMEOUT_MS: fail (retryable). An NCCL hand-off
 *     that fails (the link broke, the send missed its deadline, the decode side refused it) is done
 *     again once through the pair's fallback (shared memory, or the network across nodes), so a
 *     link failure loses no request; the NCCL attempt's late ok still counts.
 *
 * It also owns the ways the blocks go out (handoff_out_open): the NCCL links to decode workers on
 * other GPUs (transfer/kv_link.h, asked for before any prompt needs one) and every other channel,
 * the tcp one with the cluster's CURVE keys (actors/worker/chan_keys.h). */
#ifndef TROUPE_ACTORS_WORKER_HANDOFF_OUT_H
#define TROUPE_ACTORS_WORKER_HANDOFF_OUT_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/worker/chan_keys.h"
#include "actors/worker/worker.h"
#include "common/u64map.h"
#include "transfer/kv_chan.h"
#include "transfer/kv_link.h"

/* A hand-off not acknowledged by then fails the request (retryable) and frees the blocks. A dead
 * decode worker is noticed sooner by the router (peer watch); this bounds a live but overloaded
 * one. */
#define HANDOFF_TIMEOUT_MS 5000

/* One request's hand-off, inside the owner's request. The owner fills owner, to, kv and msg (the
 * handoff, msg_init'd: everything it says but its KV description) before handoff_out_start. */
typedef struct handoff_out_req {
    void *owner;                 /* the owner's request: what the hooks are given */
    const char *to;              /* its decode worker */
    const kvseq_t *kv;           /* its blocks in our pool (borrowed) */
    msg_t msg;                   /* the handoff (its id: the request's); its kv is out.desc once sent */
    kvchan_out_t out;            /* the current attempt's transfer: its channel, what it holds (a
                                  * segment, staged bytes, an NCCL send), its description */
    uint64_t transfer_id;        /* the current attempt's */
    uint64_t nccl_transfer;      /* the NCCL attempt's id after a retry (0: none) */
    int64_t deadline_ms;         /* of the current attempt's ack */
    int started;                 /* in flight: between handoff_out_start and done, fail or release */
    int handed;                  /* an attempt went out (the next one is the retry) */
    int sent;                    /* NCCL: the send is over (done, or its link aborted) */
    int acked;                   /* NCCL: acknowledged before the send was seen done */
    int refused;                 /* NCCL: refused: retried through the fallback once the send is over */
    struct handoff_out_req *prev, *next;   /* the in-flight list, oldest first */
} handoff_out_req_t;

typedef struct handoff_out {
    const char *self;            /* the worker's instance name (the handoff's prefill_worker) */
    const worker_t *w;
    const char *cache_manager;   /* told which full blocks we hold after a first hand-off; NULL: none */
    kvlinks_t *links;            /* NCCL links to decode workers on other GPUs */
    kvchan_t *chan;              /* how the blocks go out, every channel */
    chan_keys_t keys;            /* CURVE keys of the tcp channel; chan points into it: not copied once open */
    int nccl;                    /* links can exist here: the owner calls handoff_out_poll every KVLINK_POLL_MS */
    const char *nccl_peers[KVLINK_MAX];   /* the decode workers a link is wanted to (topology names) */
    int n_nccl_peers;
    uint64_t next_transfer;
    handoff_out_req_t *head, *tail;   /* in flight, oldest first */
    u64map_t by_transfer;        /* transfer id (the current attempt's, and an NCCL attempt's after a
                                    retry) -> its handoff_out_req_t */
    /* The owner's hooks (ctx: its state): a hand-off acknowledged (the request may go), or failed
     * (the request fails with code, retryable, why). Either ends the hand-off; the owner then
     * releases it (handoff_out_release) with the request. */
    void *ctx;
    void (*done)(void *ctx, handoff_out_req_t *x);
    void (*fail)(void *ctx, handoff_out_req_t *x, msg_error_code_t code, const char *why);
    uint64_t acked, failures, retries;   /* hand-offs acknowledged, failed, retried through the fallback */
} handoff_out_t;

/* Opens the ways out for worker w of actor a (topology t; cache_manager may be NULL): the NCCL
 * links (when the backend has NCCL: every decode process watched, ho->nccl set), the channels with
 * the tcp channel's keys; and removes the shared-memory segments a killed process of the cluster
 * left. The hooks are set by the owner after. -1 with why; handoff_out_close frees what was made. */
int handoff_out_open(handoff_out_t *ho, actor_t *a, const worker_t *w, const topo_t *t, const char *cache_manager,
                     char *err, size_t errlen);
/* Aborts the NCCL sends still in flight: first at shutdown, before the requests' blocks go. */
void handoff_out_close_links(handoff_out_t *ho);
/* The links (if still open), then the channels: after every request was released. Idempotent. */
void handoff_out_close(handoff_out_t *ho);

/* Hands x over by the channel the pair uses now. A failure calls the fail hook before returning. */
void handoff_out_start(handoff_out_t *ho, actor_t *a, handoff_out_req_t *x);
/* Frees what x's transfer holds and forgets it (the request goes: done, failed, cancelled).
 * Idempotent; a handoff_out_req_t never started may be released. */
void handoff_out_release(handoff_out_t *ho, handoff_out_req_t *x);

/* The decode side's kv_ack: ends its hand-off through a hook, retries it, or waits for the NCCL
 * send. A late ack of a transfer given up on is ignored. */
void handoff_out_on_ack(handoff_out_t *ho, actor_t *a, const msg_kv_ack_t *k);
/* Hand-offs past their deadline fail (retryable). The owner calls it each step. */
void handoff_out_expire(handoff_out_t *ho);
/* Every KVLINK_POLL_MS where ho->nccl: links wanted and coming up, and NCCL sends in flight (done,
 * failed, or past their deadline, which aborts their link). */
void handoff_out_poll(handoff_out_t *ho, actor_t *a);

/* A kv_link message (a decode worker's answer to a link offer): 0, never fatal. */
int handoff_out_on_link(handoff_out_t *ho, const msg_t *m);
/* A decode worker's process came (up 1) or went: its link is aborted at once, or offered again at
 * the next poll. */
void handoff_out_peer_event(handoff_out_t *ho, const char *peer, int up);

/* transfers_total, transfer_failures_total, transfers_nccl_total, transfers_tcp_total,
 * nccl_links_ready, transfer_retries_total, transfers_nccl_fallback_total. */
void handoff_out_stats(const handoff_out_t *ho, actor_t *a, msg_stats_t *st);

#endif
