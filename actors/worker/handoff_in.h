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
 * the same without its KV, to be recomputed here when blocks free up. */
#ifndef TROUPE_ACTORS_WORKER_HANDOFF_IN_H
#define TROUPE_ACTORS_WORKER_HANDOFF_IN_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/runtime/worker.h"
#include "actors/worker/dc_req.h"
#include "actors/worker/writeback.h"
#include "transfer/kv_chan.h"

typedef struct handoff_in {
    const char *self;            /* the worker's instance name (in refusals) */
    const worker_t *w;
    kvchan_t *chan;              /* borrowed: how the blocks come in, every channel */
    writeback_t *wb;             /* borrowed: finished sequences give their blocks back when full */
    uint64_t taken, refused, ipc;   /* hand-offs taken, refused, taken over CUDA IPC */
    uint64_t ns;                 /* the loop's time taking hand-offs in, the KV receive included */
} handoff_in_t;

/* Takes handoff m: a new request (not in the scheduler yet) holding the prompt's KV (*with_kv 1)
 * or, without room, none (*with_kv 0), the sender acknowledged; or NULL when refused (acknowledged
 * with why, logged, counted). here: a request with m's id is already at this worker. */
dc_req_t *handoff_in_take(handoff_in_t *hi, actor_t *a, const msg_t *m, int here, int *with_kv);

/* A kv_announce outside a handoff (not the cache-manager's answer to a fetch) is refused, so its
 * sender frees what it holds for it. */
void handoff_in_refuse_announce(handoff_in_t *hi, actor_t *a, const msg_kv_announce_t *k);

/* transfers_total, transfer_failures_total, transfers_cuda_ipc_total, transfers_tcp_total,
 * handoff_seconds_total. */
void handoff_in_stats(const handoff_in_t *hi, actor_t *a, msg_stats_t *st);

#endif
