#include "transfer/kv_transfer.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "transfer/le64.h"

uint64_t kvx_first_id(void)
{
    uint64_t id = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&id, sizeof id, 1, f) != 1)
        id = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 40);
    if (f)
        fclose(f);
    return (id >> 2) & ~0xffffffULL;   /* room to count up; below 2^62 (the write-back flag bit) */
}

void kvx_announce(msg_t *m, uint64_t transfer_id, uint64_t request_id, const bk_kv_t *kv,
                  const uint32_t *block_ids, uint32_t n, msg_channel_t channel, const uint8_t *handle,
                  uint32_t handle_len, const char *src, int64_t timeout_ms)
{
    msg_init(m, MSG_KV_ANNOUNCE, transfer_id);
    msg_kv_announce_t *k = &m->u.kv_announce;
    k->transfer_id = transfer_id;
    k->request_id = request_id;
    k->last = true;
    k->channel = channel;
    k->n_layers = (uint32_t)kv->n_layers;
    k->block_size = (uint32_t)kv->block_size;
    k->n_kv_heads = (uint32_t)kv->n_kv_heads;
    k->head_dim = (uint32_t)kv->head_dim;
    k->dtype = kv->dtype;
    k->block_ids = block_ids;
    k->n_block_ids = n;
    k->total_bytes = (uint64_t)n * kv->block_bytes;
    k->handle = handle;
    k->handle_len = handle_len;
    k->src = src;
    k->deadline_ms = (uint64_t)(wall_ms() + timeout_ms);
}

int kvx_ack(actor_t *a, const char *to, uint64_t transfer_id, int ok, const char *why,
            const uint32_t *dst_block_ids, uint32_t n)
{
    msg_t k;
    msg_init(&k, MSG_KV_ACK, transfer_id);
    k.u.kv_ack.transfer_id = transfer_id;
    k.u.kv_ack.status = ok ? MSG_ACK_OK : MSG_ACK_FAILED;
    k.u.kv_ack.message = ok ? NULL : (why ? why : "refused");
    k.u.kv_ack.dst_block_ids = ok ? dst_block_ids : NULL;
    k.u.kv_ack.n_dst_block_ids = ok ? n : 0;
    return actor_send_keep(a, to, &k);   /* one per hand-off: the sender's blocks wait for it */
}

int kvx_ipc_handle(backend_t *be, const bk_kv_t *pool, uint8_t out[KVX_IPC_HANDLE_BYTES])
{
    if (!be->ops->ipc_export || !pool->base || be->ops->ipc_export(be, pool->base, out) != 0)
        return -1;
    le64_put(out + BK_IPC_HANDLE_BYTES, (uint64_t)pool->n_blocks * pool->block_bytes);
    return 0;
}

uint64_t kvx_ipc_check(const msg_kv_announce_t *k, size_t block_bytes, char *err, size_t errlen)
{
    if (k->handle_len != KVX_IPC_HANDLE_BYTES) {
        errf(err, errlen, "kv_announce: CUDA IPC handle of %u bytes, expected %d", k->handle_len, KVX_IPC_HANDLE_BYTES);
        return 0;
    }
    uint64_t bytes = le64_get(k->handle + BK_IPC_HANDLE_BYTES);
    for (uint32_t i = 0; i < k->n_block_ids; i++)
        if ((uint64_t)k->block_ids[i] >= bytes / block_bytes) {
            errf(err, errlen, "kv_announce: block %u lies outside the sender's pool of %llu bytes", k->block_ids[i],
                 (unsigned long long)bytes);
            return 0;
        }
    return bytes;
}
