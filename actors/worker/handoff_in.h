/* actors/worker/handoff_in.h — a decode worker takes a prefill worker's hand-off: one handoff
 * message, the request with its KV's transfer description (kv[0]: the blocks in a shared-memory
 * segment, in the prefill pool on our GPU, on an NCCL link, or staged for the network on another
 * node: transfer/kv_chan.h). A module of its own because its checks, the receive and the ack are
 * the transfer contract's receiver side, which the decode step need not read.
 *
 * A hand-off is refused (a kv_ack with why, so the sender frees its copy and fails or retries the
 * request) when its description disagrees with the message or our pool, the request is already
 * here, it would not fit max_model_len, the prompt needs more blocks than the whole pool, or the
 * receive fails (the channel's own deadline bounds it: a dead or stalled sender ends there). When
 * the pool has no room now (after finished write-backs give theirs back), the request is taken all
 * the same without its KV, to be recomputed here when blocks free up.
 *
 * It also owns the ways the blocks come in (handoff_in_open): the NCCL links from prefill workers
 * on other GPUs (transfer/kv_link.h: their kv_link messages, their processes watched, polled from
 * the owner's timer) and every other channel (transfer/kv_chan.h), the tcp one with the cluster's
 * CURVE keys (actors/worker/chan_keys.h). */
#ifndef TROUPE_ACTORS_WORKER_HANDOFF_IN_H
#define TROUPE_ACTORS_WORKER_HANDOFF_IN_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/worker/worker.h"
#include "actors/worker/chan_keys.h"
#include "actors/worker/dc_req.h"
#include "actors/worker/writeback.h"
#include "transfer/kv_chan.h"
#include "transfer/kv_link.h"

typedef struct handoff_in {
    const char *self;            /* the worker's instance name (in refusals) */
    const worker_t *w;
    writeback_t *wb;             /* borrowed (the owner sets it): finished sequences give their blocks
                                    back when the pool is full */
    kvlinks_t *links;            /* NCCL links from prefill workers on other GPUs */
    kvchan_t *chan;              /* how the blocks come in, every channel */
    chan_keys_t keys;            /* CURVE keys of the tcp channel (none without CURVE); chan points
                                    into it: a handoff_in_t is not copied once open */
    int nccl;                    /* links can exist here: the owner polls them (handoff_in_poll) */
    uint64_t taken, refused, ipc;   /* hand-offs taken, refused, taken over CUDA IPC */
    uint64_t ns;                 /* the loop's time taking hand-offs in, the KV receive included */
} handoff_in_t;

/* Opens the ways in for worker w of actor a (topology t): the NCCL links (when the backend has
 * NCCL: every prefill process watched, hi->nccl set; the owner then calls handoff_in_poll every
 * KVLINK_POLL_MS), the channels with the tcp channel's keys; and removes the shared-memory
 * segments a killed process of the cluster left. -1 with why (the keys cannot be read, a channel
 * cannot be made, out of memory); handoff_in_close frees what was made. */
int handoff_in_open(handoff_in_t *hi, actor_t *a, const worker_t *w, const topo_t *t, char *err, size_t errlen);
/* The channels first, then the links. Idempotent. */
void handoff_in_close(handoff_in_t *hi);

/* A kv_link message (a prefill worker's offer of a link, or its failure): 0, never fatal. */
int handoff_in_on_link(handoff_in_t *hi, const msg_t *m);
/* Moves the links that are coming up on; reports failures. */
void handoff_in_poll(handoff_in_t *hi);
/* A watched process came (up 1) or went: its link is aborted at once, or may be offered again. */
void handoff_in_peer_event(handoff_in_t *hi, const char *peer, int up);

/* Takes handoff m: a new request (not in the scheduler yet) holding the prompt's KV (*with_kv 1)
 * or, without room, none (*with_kv 0), the sender acknowledged; or NULL when refused (acknowledged
 * with why, logged, counted). here: a request with m's id is already at this worker. */
dc_req_t *handoff_in_take(handoff_in_t *hi, actor_t *a, const msg_t *m, int here, int *with_kv);

/* A kv_announce outside a handoff (not the cache-manager's answer to a fetch) is refused, so its
 * sender frees what it holds for it. */
void handoff_in_refuse_announce(handoff_in_t *hi, actor_t *a, const msg_kv_announce_t *k);

/* transfers_total, transfer_failures_total, transfers_cuda_ipc_total, transfers_tcp_total,
 * transfers_nccl_total, nccl_links_ready, handoff_seconds_total. */
void handoff_in_stats(const handoff_in_t *hi, actor_t *a, msg_stats_t *st);

#endif
