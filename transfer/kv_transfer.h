/* transfer/kv_transfer.h — the announce / move / acknowledge protocol of KV block transfers,
 * shared by every actor that moves blocks (prefill -> decode hand-offs, decode -> cache-manager
 * write-backs, cache-manager -> prefill fetches).
 *
 * The sender moves whole blocks ([layers][2][block_size][kv_heads][head_dim], kernels/backend.h)
 * onto a channel, describes them (shape, block ids, bytes, the channel's handle, a deadline: a
 * msg_kv_announce_t, sent alone as a kv_announce for write-backs and fetches, inside the handoff
 * for a hand-off: kv_chan.h), and keeps what the transfer holds until a kv_ack names the transfer
 * or the deadline passes. The receiver checks the described shape against its own pool before
 * reading a byte. */
#ifndef TROUPE_KV_TRANSFER_H
#define TROUPE_KV_TRANSFER_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "transfer/shm_chan.h"
#include "kernels/backend.h"
#include "messages/msg.h"

/* A first transfer id for this process: transfer ids only need to be unique per sender, but
 * receivers also match on the sender's name and the request; starting every process at a random
 * point keeps ids from two senders (or two incarnations of one) from ever looking alike. */
uint64_t kvx_first_id(void);

/* Fills *m as the kv_announce of transfer `transfer_id` for request `request_id`: n blocks of
 * shape kv (block_ids are the sender's), from `src`, due within timeout_ms, carried by
 *   MSG_CHAN_SHM       a shared-memory segment: handle = the segment's name, the blocks packed in
 *                      block_ids order;
 *   MSG_CHAN_CUDA_IPC  the sender's KV pool itself, same GPU: handle = kvx_ipc_handle(), the
 *                      receiver copies block_ids straight out of the pool (device to device).
 * The message points at block_ids, handle and src: they must outlive the send. */
void kvx_announce(msg_t *m, uint64_t transfer_id, uint64_t request_id, const bk_kv_t *kv,
                  const uint32_t *block_ids, uint32_t n, msg_channel_t channel, const uint8_t *handle,
                  uint32_t handle_len, const char *src, int64_t timeout_ms);

/* The CUDA IPC handle of a whole KV pool: the backend's handle, then the pool's size in bytes
 * (u64, little endian) so a receiver can check every announced block lies inside the mapping. */
#define KVX_IPC_HANDLE_BYTES (BK_IPC_HANDLE_BYTES + 8)
int kvx_ipc_handle(backend_t *be, const bk_kv_t *pool, uint8_t out[KVX_IPC_HANDLE_BYTES]);
/* Checks an IPC announce against the sender's pool size; returns the pool bytes or 0 (bad). */
uint64_t kvx_ipc_check(const msg_kv_announce_t *k, size_t block_bytes, char *err, size_t errlen);

/* Sends the kv_ack of a transfer to `to`: ok with the receiver's block ids, or failed and why. */
int kvx_ack(actor_t *a, const char *to, uint64_t transfer_id, int ok, const char *why,
            const uint32_t *dst_block_ids, uint32_t n);

#endif
