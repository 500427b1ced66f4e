/* transfer/kv_blocks.h — whole KV blocks between a worker's pool and the bytes a channel carries:
 * out to host memory (a shared-memory segment, a network buffer), in from host memory, in from
 * another process's pool on the same GPU (CUDA IPC), and the check every receiver makes first.
 *
 * A block is one contiguous chunk of block_bytes ([layers][2][block_size][kv_heads][head_dim],
 * kernels/backend.h bk_kv_t), so a transfer is n whole blocks in the order the description lists them. */
#ifndef TROUPE_KV_BLOCKS_H
#define TROUPE_KV_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kvcache.h"
#include "kernels/backend.h"
#include "messages/msg.h"
#include "transfer/kv_transfer.h"

#define KVBLOCKS_IPC_PEERS 16

/* Pools of senders on our GPU, mapped here (CUDA IPC) once per sender, remapped when it restarts. */
typedef struct kvblocks_ipc {
    struct {
        char src[64];
        uint8_t handle[KVX_IPC_HANDLE_BYTES];
        void *base;                  /* NULL: free slot */
    } peers[KVBLOCKS_IPC_PEERS];
} kvblocks_ipc_t;

/* Copies blocks[0..n) of pool into dst (n * block_bytes, host memory). */
int kvblocks_out(backend_t *be, const kvpool_t *pool, const int32_t *blocks, int n, uint8_t *dst);
/* Copies n blocks' bytes from src (host memory) into the pool's blocks[0..n). */
int kvblocks_in(backend_t *be, kvpool_t *pool, const int32_t *blocks, int n, const uint8_t *src);
/* Copies the blocks a CUDA IPC description names out of the sender's pool into blocks[0..n). -1 with why. */
int kvblocks_in_ipc(backend_t *be, kvpool_t *pool, kvblocks_ipc_t *ipc, const msg_kv_announce_t *k,
                    const int32_t *blocks, int n, char *err, size_t errlen);
/* Unmaps every sender's pool. */
void kvblocks_ipc_close(backend_t *be, kvblocks_ipc_t *ipc);

/* 0 when a transfer description names blocks of exactly this pool's shape, else -1 and why. */
int kvblocks_check(const kvpool_t *pool, const msg_kv_announce_t *a, char *err, size_t errlen);

#endif
