/* actors/runtime/kv_transfer.h — the announce / move / acknowledge protocol of KV block transfers,
 * shared by every actor that moves blocks (prefill -> decode hand-offs, decode -> cache-manager
 * write-backs, cache-manager -> prefill fetches).
 *
 * The sender writes whole blocks ([layers][2][block_size][kv_heads][head_dim], kernels/backend.h)
 * into a tensor-channel segment, sends a kv_announce (shape, block ids, bytes, the segment's
 * handle, a deadline), and keeps the segment until a kv_ack names the transfer or the deadline
 * passes. The receiver checks the announced shape against its own pool before reading a byte. */
#ifndef TROUPE_KV_TRANSFER_H
#define TROUPE_KV_TRANSFER_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/runtime/tensor_chan.h"
#include "kernels/backend.h"
#include "messages/msg.h"

/* A first transfer id for this process: transfer ids only need to be unique per sender, but
 * receivers also match on the sender's name and the request; starting every process at a random
 * point keeps ids from two senders (or two incarnations of one) from ever looking alike. */
uint64_t kvx_first_id(void);

/* Fills *m as the kv_announce of transfer `transfer_id` for request `request_id`: n blocks of
 * shape kv (block_ids are the sender's), carried by shared-memory segment seg, from `src`, due
 * within timeout_ms. The message points at block_ids, seg and src: they must outlive the send. */
void kvx_announce(msg_t *m, uint64_t transfer_id, uint64_t request_id, const bk_kv_t *kv,
                  const uint32_t *block_ids, uint32_t n, const tchan_seg_t *seg, const char *src,
                  int64_t timeout_ms);

/* Sends the kv_ack of a transfer to `to`: ok with the receiver's block ids, or failed and why. */
int kvx_ack(actor_t *a, const char *to, uint64_t transfer_id, int ok, const char *why,
            const uint32_t *dst_block_ids, uint32_t n);

#endif
