#include "transfer/kv_blocks.h"

#include <stdio.h>
#include <string.h>

#include "common/util.h"

int kvblocks_out(backend_t *be, const kvpool_t *pool, const int32_t *blocks, int n, uint8_t *dst)
{
    size_t bb = kvpool_view(pool)->block_bytes;
    for (int i = 0; i < n; i++)
        if (be->ops->download(be, dst + (size_t)i * bb, kvpool_block_ptr(pool, blocks[i]), bb) != 0)
            return -1;
    return 0;
}

int kvblocks_in(backend_t *be, kvpool_t *pool, const int32_t *blocks, int n, const uint8_t *src)
{
    size_t bb = kvpool_view(pool)->block_bytes;
    for (int i = 0; i < n; i++)
        if (be->ops->upload(be, kvpool_block_ptr(pool, blocks[i]), src + (size_t)i * bb, bb) != 0)
            return -1;
    return 0;
}

int kvblocks_in_ipc(backend_t *be, kvpool_t *pool, kvblocks_ipc_t *ipc, const msg_kv_announce_t *k,
                    const int32_t *blocks, int n, char *err, size_t errlen)
{
    size_t bb = kvpool_view(pool)->block_bytes;
    if (!be->ops->ipc_open || !be->ops->copy)
        return errf(err, errlen, "this backend cannot map another process's memory (CUDA IPC)");
    if (!kvx_ipc_check(k, bb, err, errlen))
        return -1;
    if ((int)k->n_block_ids != n)
        return errf(err, errlen, "kv_announce names %u blocks, %d expected", k->n_block_ids, n);
    /* The sender's pool: mapped once, remapped when the sender restarted (a new handle). */
    size_t np = KVBLOCKS_IPC_PEERS, slot = np;
    for (size_t i = 0; i < np && slot == np; i++)
        if (strcmp(ipc->peers[i].src, k->src) == 0)
            slot = i;
    if (slot < np && memcmp(ipc->peers[slot].handle, k->handle, KVX_IPC_HANDLE_BYTES) != 0) {
        be->ops->ipc_close(be, ipc->peers[slot].base);
        ipc->peers[slot].base = NULL;
    }
    if (slot == np)
        for (size_t i = 0; i < np && slot == np; i++)
            if (!ipc->peers[i].base)
                slot = i;
    if (slot == np)
        return errf(err, errlen, "too many CUDA IPC senders");
    if (!ipc->peers[slot].base) {
        ipc->peers[slot].base = be->ops->ipc_open(be, k->handle);
        if (!ipc->peers[slot].base)
            return errf(err, errlen, "cannot map %s's KV pool (CUDA IPC)", k->src);
        snprintf(ipc->peers[slot].src, sizeof ipc->peers[slot].src, "%s", k->src);
        memcpy(ipc->peers[slot].handle, k->handle, KVX_IPC_HANDLE_BYTES);
    }
    const uint8_t *remote = ipc->peers[slot].base;
    for (int i = 0; i < n; i++)
        if (be->ops->copy(be, kvpool_block_ptr(pool, blocks[i]), remote + (size_t)k->block_ids[i] * bb, bb) != 0)
            return errf(err, errlen, "device copy of block %d failed", i);
    /* The sender frees its blocks on our ack: the copies must be done before we send it. */
    return be->ops->sync(be) == 0 ? 0 : errf(err, errlen, "device sync after the copies failed");
}

void kvblocks_ipc_close(backend_t *be, kvblocks_ipc_t *ipc)
{
    for (size_t i = 0; i < KVBLOCKS_IPC_PEERS; i++)
        if (ipc->peers[i].base)
            be->ops->ipc_close(be, ipc->peers[i].base);
    memset(ipc, 0, sizeof *ipc);
}

int kvblocks_check(const kvpool_t *pool, const msg_kv_announce_t *a, char *err, size_t errlen)
{
    const bk_kv_t *kv = kvpool_view(pool);
    if ((int)a->n_layers != kv->n_layers || (int)a->block_size != kv->block_size ||
        (int)a->n_kv_heads != kv->n_kv_heads || (int)a->head_dim != kv->head_dim || a->dtype != kv->dtype)
        return errf(err, errlen, "kv_announce: blocks of %u layers x %u tokens x %u heads x %u dims %s, "
                    "this pool holds %d x %d x %d x %d %s", a->n_layers, a->block_size, a->n_kv_heads,
                    a->head_dim, dtype_name(a->dtype), kv->n_layers, kv->block_size, kv->n_kv_heads,
                    kv->head_dim, dtype_name(kv->dtype));
    if (a->total_bytes != (uint64_t)a->n_block_ids * kv->block_bytes)
        return errf(err, errlen, "kv_announce: %llu bytes for %u blocks of %zu bytes",
                    (unsigned long long)a->total_bytes, a->n_block_ids, kv->block_bytes);
    return 0;
}
