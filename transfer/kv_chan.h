/* transfer/kv_chan.h — the one interface a KV hand-off goes through, whatever carries its bytes.
 *
 * Channels (chosen per peer pair from the topology: kvchan_route_to, kv_link.h's kvlink_route):
 *   cuda_ipc  both workers on one GPU: the receiver copies the blocks out of the sender's pool;
 *   nccl      both workers on GPUs, different GPUs (of one node, or of two nodes): a send posted on
 *             the link to that peer (kv_link.h), matched by the receiver's receive;
 *   shm       one node otherwise (CPU workers): a POSIX shared-memory segment (shm_chan.h);
 *   tcp       two nodes otherwise: the sender stages the bytes and the receiver pulls them over
 *             ZeroMQ (tcp_chan.h); CURVE when the cluster has keys: only the decode worker named
 *             in the hand-off may pull it, from the sender the description names.
 * NCCL is used only while its link is READY; until then (and after a failure) a hand-off takes the
 * fallback of the pair: shm on one node, tcp across nodes (kvchan_channel, kvchan_fallback).
 *
 * The contract, the same on every channel:
 *   sender    kvchan_send moves (or posts) blocks[0..n) and fills the transfer description that
 *             travels inside the handoff message (one message: nothing for the receiver to pair);
 *             its blocks stay untouched until kvchan_test says the channel no longer reads them
 *             (at once except for NCCL) AND the receiver's kv_ack came, or the deadline passed;
 *             then kvchan_release frees what the transfer held (a segment, a staged buffer).
 *   receiver  kvchan_check (the shape against its pool), then kvchan_recv into its own blocks,
 *             bounded by the description's deadline and the channel's own (never a hang); then
 *             always kvchan_settle (an NCCL transfer it refused still takes its bytes off the link)
 *             and a kv_ack, ok or failed with why. A failed hand-off is retried by the sender
 *             through the fallback once (NCCL), or fails the request with a retryable error, so the
 *             client's retry recomputes it.
 *
 * Counters (kvchan_count): hand-offs moved per channel, received or sent, for the stats. */
#ifndef TROUPE_KV_CHAN_H
#define TROUPE_KV_CHAN_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kvcache.h"
#include "kernels/backend.h"
#include "messages/msg.h"
#include "topology/topology.h"
#include "transfer/kv_blocks.h"
#include "transfer/kv_link.h"
#include "transfer/shm_chan.h"
#include "transfer/tcp_chan.h"

/* Longest a receiver waits for a hand-off's bytes over tcp, whatever the description's deadline.
 * The wait runs inside the decode loop (known limit): it stays below the supervisor's default
 * wedge detection (3 missed heartbeats of 500 ms), so a stalled sender never gets its receiver
 * killed as wedged. */
#define KVCHAN_TCP_RECV_MS 1000

typedef struct kvchan_cfg {
    backend_t *be;
    kvpool_t *pool;              /* this worker's: what is sent from and received into */
    const topo_t *topo;
    const topo_instance_t *self;
    const char *cluster;         /* names shared-memory segments */
    void *zmq_ctx;               /* the actor's: the tcp channel's sockets */
    kvlinks_t *links;            /* NCCL links (borrowed; NULL: none) */
    /* CURVE on the tcp channel (tcp_chan.h) when the cluster has keys: our keypair (Z85) and how to
     * read another instance's public key (from the topology's key files). NULL: plaintext. */
    const char *curve_public, *curve_secret;
    int (*peer_key)(void *ctx, const char *instance, char *z85, char *err, size_t errlen);
    void *peer_key_ctx;
} kvchan_cfg_t;

typedef struct kvchan kvchan_t;

/* One outgoing transfer, held by the sender until released. */
typedef struct kvchan_out {
    msg_channel_t channel;       /* the channel it actually took (NCCL may fall back) */
    msg_kv_announce_t desc;      /* its description: points into this struct and the caller's blocks */
    tchan_seg_t seg;             /* shm */
    tchan_nccl_xfer_t xfer;      /* nccl: the posted send */
    uint8_t handle[MSG_MAX_HANDLE];
    int staged;                  /* tcp: the bytes are staged under desc.transfer_id */
} kvchan_out_t;

/* NULL with why (the tcp channel cannot bind, no memory). */
kvchan_t *kvchan_new(const kvchan_cfg_t *cfg, char *err, size_t errlen);
void kvchan_destroy(kvchan_t **self_p);

/* This worker's route to peer (kvlink_route: from the topology), and the channel to use now (NCCL
 * only on a READY link, else the fallback). */
msg_channel_t kvchan_route_to(const kvchan_t *c, const char *peer);
msg_channel_t kvchan_channel(kvchan_t *c, const char *peer);
/* What a hand-off to peer takes when NCCL cannot: shm on one node, tcp across nodes. */
msg_channel_t kvchan_fallback(const kvchan_t *c, const char *peer);

/* Sender: moves blocks[0..n) of transfer_id (request request_id) towards peer by channel (NCCL
 * falls back when its send cannot be posted), due within timeout_ms; fills o. -1 with why (o then
 * holds nothing). */
int kvchan_send(kvchan_t *c, const char *peer, msg_channel_t channel, uint64_t transfer_id, uint64_t request_id,
                const int32_t *blocks, int n, int64_t timeout_ms, kvchan_out_t *o, char *err, size_t errlen);
/* Sender: 1 the channel reads the blocks no more, 0 in flight (NCCL), -1 failed (NCCL: its link). */
int kvchan_test(kvchan_t *c, const char *peer, kvchan_out_t *o, char *err, size_t errlen);
/* Sender: frees what the transfer holds. Idempotent. */
void kvchan_release(kvchan_t *c, kvchan_out_t *o);

/* Receiver: the description against this pool (shape, bytes). */
int kvchan_check(const kvchan_t *c, const msg_kv_announce_t *d, char *err, size_t errlen);
/* Receiver: the described bytes into blocks[0..n) (n: the description's block count). -1 with why. */
int kvchan_recv(kvchan_t *c, const msg_kv_announce_t *d, const int32_t *blocks, int n, char *err, size_t errlen);
/* Receiver: after every hand-off, taken or not (an NCCL transfer not received is discarded). */
void kvchan_settle(kvchan_t *c, const msg_kv_announce_t *d);

/* Hand-offs moved over channel ch by this worker (received, or sent and released after an ok). */
uint64_t kvchan_count(const kvchan_t *c, msg_channel_t ch);
/* Sender: counts an acknowledged transfer of channel ch. */
void kvchan_acked(kvchan_t *c, msg_channel_t ch);

#endif
