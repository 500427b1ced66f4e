/* transfer/kv_link.h — a prefill or decode worker's NCCL links (transfer/nccl_chan.h),
 * one per peer worker on another GPU of the node, and which channel each KV hand-off takes.
 *
 * Channel of a hand-off (kvlink_route, from the topology): CUDA IPC when both workers share a GPU,
 * NCCL between two GPUs (of one node or of two), shared memory otherwise on one node, tcp across
 * nodes. NCCL is used only while the link to that peer is READY; until then, and for retry_ms
 * after a link failed, the hand-off takes the pair's fallback (kvlinks_channel says MSG_CHAN_SHM;
 * kv_chan.h's kvchan_channel makes that tcp across nodes): nothing waits for a link.
 *
 * Bootstrap over our own messages (kv_link, messages/msg.h):
 *   sender (prefill)  makes the ncclUniqueId, opens rank 0 and sends kv_link{ok, id, rank 1 of 2}
 *                     the first time it hands off to that peer (kvlinks_want: as soon as a request
 *                     names its decode worker, so the link is up by the time the prompt is done);
 *   receiver (decode) opens rank 1 with it, or answers kv_link{failed, why} (no NCCL here);
 *   both poll (kvlinks_poll, from a timer) until READY. Either side that sees the link fail
 *   (init or a transfer past its deadline, an NCCL error) aborts it and tells the other with
 *   kv_link{failed, why}, which aborts its side too. A new offer from the same peer (a restarted
 *   prefill, or a retry) replaces the old link.
 *
 * Transfers: the sender posts the send of a hand-off's blocks (kvlinks_send) and puts the link id
 * and the transfer's sequence number on the link into the transfer description's handle; the receiver takes
 * them when it handles the hand-off (kvlinks_recv, waiting with a deadline), or, when it refuses
 * the hand-off or takes it without its KV, still receives the bytes into a scratch block
 * (kvlinks_settle) so both sides' order stays the same. An announce whose sequence number is not
 * the next one on the link means the order broke: the link is aborted, never trusted again.
 *
 * Every function takes a NULL kvlinks_t (no links: the fallback for everything). */
#ifndef TROUPE_KV_LINK_H
#define TROUPE_KV_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "transfer/nccl_chan.h"
#include "kernels/backend.h"
#include "messages/msg.h"
#include "topology/topology.h"

#define KVLINK_MAX 16                 /* peers with a link */
#define KVLINK_HANDLE_BYTES 16        /* a kv_announce's NCCL handle: link id, sequence (u64 LE each) */
#define KVLINK_POLL_MS 10             /* how often the owner should call kvlinks_poll */

typedef struct kvlink_cfg {
    int64_t init_timeout_ms;      /* offer -> READY (default 20000) */
    int64_t send_timeout_ms;      /* a send, posted before its announce (default 4000) */
    int64_t recv_timeout_ms;      /* a receive, posted when the hand-off is taken (default 2000) */
    int64_t retry_ms;             /* after a failure, the fallback only for this long (default 30000) */
} kvlink_cfg_t;

/* How kv_link messages leave (actor_send in the actors; a capture in the tests). 0 when sent. */
typedef int (*kvlink_send_fn)(void *ctx, const char *to, const msg_t *m);

typedef struct kvlinks kvlinks_t;

/* self: our actor name; block_bytes: one block of our pool (the receiver's discard scratch); cfg
 * NULL: the defaults. NULL only when out of memory. */
kvlinks_t *kvlinks_new(backend_t *be, const char *self, size_t block_bytes, const kvlink_cfg_t *cfg,
                       kvlink_send_fn send, void *ctx);
/* Aborts every link and tells its peer. Idempotent; nulls the pointer. */
void kvlinks_destroy(kvlinks_t **self_p);

/* The channel the topology gives a hand-off from `from` to `to`: MSG_CHAN_CUDA_IPC (same GPU,
 * ipc_ok), MSG_CHAN_NCCL (two GPUs, of one node or two, nccl_ok), else MSG_CHAN_SHM on one node and
 * MSG_CHAN_TCP across nodes. */
msg_channel_t kvlink_route(const topo_instance_t *from, const topo_instance_t *to, int ipc_ok, int nccl_ok);

/* Sender: the channel to use now for a hand-off to `peer` whose route is `route`: NCCL only when
 * the link is READY; otherwise MSG_CHAN_SHM, i.e. the fallback (counted; kvchan_channel makes it
 * tcp across nodes), and the link is offered when there is none or its retry delay is over. Any
 * other route is returned as it is. */
msg_channel_t kvlinks_channel(kvlinks_t *ls, const char *peer, msg_channel_t route);
/* Sender: offers a link to peer now unless one is up, coming up, or failed within retry_ms. */
void kvlinks_want(kvlinks_t *ls, const char *peer);
/* Sender: posts the send of blocks[0..n) of kv to peer (READY link); fills x and the announce's
 * handle. -1 with why (the link is then aborted and the peer told). */
int kvlinks_send(kvlinks_t *ls, const char *peer, const bk_kv_t *kv, const int32_t *blocks, int n,
                 tchan_nccl_xfer_t *x, uint8_t handle[KVLINK_HANDLE_BYTES], char *err, size_t errlen);
/* Sender: 1 the send completed, 0 in flight, -1 failed (past its deadline, an NCCL error, or its
 * link is gone; a failure found here aborts the link and tells the peer). */
int kvlinks_test(kvlinks_t *ls, const char *peer, tchan_nccl_xfer_t *x, char *err, size_t errlen);
/* Aborts the link to peer (a posted send that can never be announced) and tells the peer. */
void kvlinks_abort(kvlinks_t *ls, const char *peer, const char *why);

/* Receiver: receives an NCCL kv_announce's blocks into blocks[0..n) of kv (n must be its block
 * count) and waits for them, at most recv_timeout_ms. -1 with why: no such link here, the order
 * broke, the deadline passed or NCCL failed (the link is then aborted and the sender told). */
int kvlinks_recv(kvlinks_t *ls, const msg_kv_announce_t *a, const bk_kv_t *kv, const int32_t *blocks, int n,
                 char *err, size_t errlen);
/* Receiver: after a hand-off was handled, for an NCCL announce kvlinks_recv did not take (refused,
 * or taken without its KV): receives its bytes into scratch so the link's order holds. No-op for
 * other channels, a taken announce, or a link that is gone. */
void kvlinks_settle(kvlinks_t *ls, const msg_kv_announce_t *a);

/* A kv_link message (an offer to join, or a peer's failure). Never fatal: returns 0. */
int kvlinks_on_msg(kvlinks_t *ls, const msg_t *m);
/* Moves links that are coming up on (every KVLINK_POLL_MS); reports failures. */
void kvlinks_poll(kvlinks_t *ls);
/* From the actor's peer_event (watch the peers links may go to): up = 0, the peer's process is gone,
 * so a link to it can never complete: it is aborted now, not at a transfer's deadline; up = 1, the
 * peer is (back) up, e.g. restarted by the supervisor: a failed link is offered again at the next
 * hand-off instead of after retry_ms. */
void kvlinks_peer_event(kvlinks_t *ls, const char *peer, int up);

/* The state of the link with peer (CLOSED when none) and, when FAILED, why. */
tchan_nccl_state_t kvlinks_state(const kvlinks_t *ls, const char *peer, const char **why);
uint64_t kvlinks_transfers(const kvlinks_t *ls);   /* completed over NCCL, every link */
uint64_t kvlinks_fallbacks(const kvlinks_t *ls);   /* hand-offs routed to NCCL that went by shm */
int kvlinks_ready(const kvlinks_t *ls);             /* links up (READY) now */

/* The (link id, sequence) of an NCCL announce handle; -1 with why when it is not one. */
int kvlink_handle_parse(const msg_kv_announce_t *a, uint64_t *link_id, uint64_t *seq, char *err, size_t errlen);

#endif
