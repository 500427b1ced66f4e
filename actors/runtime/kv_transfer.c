#include "actors/runtime/kv_transfer.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

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
                  const uint32_t *block_ids, uint32_t n, const tchan_seg_t *seg, const char *src,
                  int64_t timeout_ms)
{
    msg_init(m, MSG_KV_ANNOUNCE, transfer_id);
    msg_kv_announce_t *k = &m->u.kv_announce;
    k->transfer_id = transfer_id;
    k->request_id = request_id;
    k->last = true;
    k->channel = MSG_CHAN_SHM;
    k->n_layers = (uint32_t)kv->n_layers;
    k->block_size = (uint32_t)kv->block_size;
    k->n_kv_heads = (uint32_t)kv->n_kv_heads;
    k->head_dim = (uint32_t)kv->head_dim;
    k->dtype = kv->dtype;
    k->block_ids = block_ids;
    k->n_block_ids = n;
    k->total_bytes = (uint64_t)n * kv->block_bytes;
    k->handle = (const uint8_t *)seg->name;
    k->handle_len = (uint32_t)strlen(seg->name);
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
    return actor_send(a, to, &k);
}
