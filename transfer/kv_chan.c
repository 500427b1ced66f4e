/* transfer/kv_chan.c — one send / receive / settle contract over cuda_ipc, nccl, shm and tcp
 * (kv_chan.h). Each channel's own code lives in its file; this one dispatches and counts. */
#include "transfer/kv_chan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

struct kvchan {
    kvchan_cfg_t cfg;
    int ipc_ok;                          /* our pool can be mapped by processes on our GPU */
    uint8_t ipc_handle[KVX_IPC_HANDLE_BYTES];
    kvblocks_ipc_t ipc_in;               /* senders' pools mapped here */
    tcpchan_server_t *tcp_out;           /* made at the first tcp send */
    tcpchan_client_t *tcp_in;            /* made at the first tcp receive */
    uint64_t count[MSG_CHAN_COUNT];
};

kvchan_t *kvchan_new(const kvchan_cfg_t *cfg, char *err, size_t errlen)
{
    kvchan_t *c = calloc(1, sizeof *c);
    if (!c)
        return errf(err, errlen, "out of memory"), NULL;
    c->cfg = *cfg;
    c->ipc_ok = kvx_ipc_handle(cfg->be, kvpool_view(cfg->pool), c->ipc_handle) == 0;
    return c;
}

void kvchan_destroy(kvchan_t **self_p)
{
    kvchan_t *c = self_p ? *self_p : NULL;
    if (!c)
        return;
    kvblocks_ipc_close(c->cfg.be, &c->ipc_in);
    tcpchan_server_destroy(&c->tcp_out);
    tcpchan_client_destroy(&c->tcp_in);
    free(c);
    *self_p = NULL;
}

msg_channel_t kvchan_route_to(const kvchan_t *c, const char *peer)
{
    return kvlink_route(c->cfg.self, c->cfg.topo ? topo_find(c->cfg.topo, peer) : NULL, c->ipc_ok,
                        tchan_nccl_available(c->cfg.be));
}

msg_channel_t kvchan_fallback(const kvchan_t *c, const char *peer)
{
    const topo_instance_t *to = c->cfg.topo ? topo_find(c->cfg.topo, peer) : NULL;
    return to && c->cfg.self && to->node != c->cfg.self->node ? MSG_CHAN_TCP : MSG_CHAN_SHM;
}

msg_channel_t kvchan_channel(kvchan_t *c, const char *peer)
{
    msg_channel_t ch = kvlinks_channel(c->cfg.links, peer, kvchan_route_to(c, peer));
    return ch == MSG_CHAN_SHM ? kvchan_fallback(c, peer) : ch;
}

/* The address our tcp endpoints bind: the topology's interface, else our node's address. */
static const char *s_host(const kvchan_t *c, const topo_instance_t *in)
{
    const topo_t *t = c->cfg.topo;
    if (!t || !in)
        return "127.0.0.1";
    return t->endpoints.bind_interface[0] ? t->endpoints.bind_interface : t->nodes[in->node].address;
}

static int s_send_tcp(kvchan_t *c, const char *peer, const int32_t *blocks, int n, kvchan_out_t *o, char *err,
                      size_t errlen)
{
    if (!c->tcp_out && !(c->tcp_out = tcpchan_server_new_curve(c->cfg.zmq_ctx, s_host(c, c->cfg.self),
                                                               c->cfg.curve_secret, err, errlen)))
        return -1;
    size_t bytes = (size_t)n * kvpool_view(c->cfg.pool)->block_bytes;
    uint8_t *buf = malloc(bytes);
    if (!buf)
        return errf(err, errlen, "no host memory to stage %zu bytes for the network", bytes);
    if (kvblocks_out(c->cfg.be, c->cfg.pool, blocks, n, buf) != 0) {
        free(buf);
        return errf(err, errlen, "copying %d blocks out of the pool failed", n);
    }
    /* With CURVE only `peer` may pull it: the ZAP handler names each connecting key's instance. */
    if (tcpchan_put_for(c->tcp_out, o->desc.transfer_id, &buf, bytes, c->cfg.curve_secret ? peer : NULL) != 0)
        return errf(err, errlen, "tcp channel: transfer %llx cannot be staged (too many in flight)",
                    (unsigned long long)o->desc.transfer_id);
    o->staged = 1;
    snprintf((char *)o->handle, sizeof o->handle, "%s", tcpchan_server_endpoint(c->tcp_out));
    return 0;
}

int kvchan_send(kvchan_t *c, const char *peer, msg_channel_t channel, uint64_t transfer_id, uint64_t request_id,
                const int32_t *blocks, int n, int64_t timeout_ms, kvchan_out_t *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->xfer.ticket = -1;
    const bk_kv_t *kv = kvpool_view(c->cfg.pool);
    const size_t bb = kv->block_bytes;
    const char *self = c->cfg.self ? c->cfg.self->name : "?";
    if (channel == MSG_CHAN_NCCL &&
        kvlinks_send(c->cfg.links, peer, kv, blocks, n, &o->xfer, o->handle, err, errlen) != 0) {
        LOG_W("request %llu: %s; handing it off through %s", (unsigned long long)request_id, err,
              msg_channel_name(kvchan_fallback(c, peer)));
        channel = kvchan_fallback(c, peer);
    }
    if (channel == MSG_CHAN_CUDA_IPC && !c->ipc_ok)
        channel = MSG_CHAN_SHM;   /* a route made without our pool's handle */
    o->channel = channel;
    o->desc.transfer_id = transfer_id;   /* the tcp channel stages under it */
    uint32_t handle_len = 0;
    switch (channel) {
    case MSG_CHAN_CUDA_IPC:
        memcpy(o->handle, c->ipc_handle, KVX_IPC_HANDLE_BYTES);
        handle_len = KVX_IPC_HANDLE_BYTES;
        break;
    case MSG_CHAN_NCCL:
        handle_len = KVLINK_HANDLE_BYTES;
        break;
    case MSG_CHAN_TCP:
        if (s_send_tcp(c, peer, blocks, n, o, err, errlen) != 0)
            return -1;
        handle_len = (uint32_t)strlen((const char *)o->handle);
        break;
    default:
        if (tchan_shm_create(&o->seg, c->cfg.cluster, transfer_id, (size_t)n * bb, err, errlen) != 0)
            return -1;
        if (kvblocks_out(c->cfg.be, c->cfg.pool, blocks, n, o->seg.ptr) != 0) {
            tchan_shm_close(&o->seg);
            return errf(err, errlen, "copying %d blocks out of the pool failed", n);
        }
        handle_len = (uint32_t)strlen(o->seg.name);
        memcpy(o->handle, o->seg.name, handle_len);
        break;
    }
    msg_t m;
    kvx_announce(&m, transfer_id, request_id, kv, (const uint32_t *)blocks, (uint32_t)n, channel, o->handle, handle_len,
                 self, timeout_ms);
    o->desc = m.u.kv_announce;
    return 0;
}

int kvchan_test(kvchan_t *c, const char *peer, kvchan_out_t *o, char *err, size_t errlen)
{
    if (o->channel != MSG_CHAN_NCCL)
        return 1;
    return kvlinks_test(c->cfg.links, peer, &o->xfer, err, errlen);
}

void kvchan_release(kvchan_t *c, kvchan_out_t *o)
{
    tchan_shm_close(&o->seg);
    if (o->staged && c && c->tcp_out)
        tcpchan_drop(c->tcp_out, o->desc.transfer_id);
    o->staged = 0;
}

void kvchan_acked(kvchan_t *c, msg_channel_t ch)
{
    if ((unsigned)ch < MSG_CHAN_COUNT)
        c->count[ch]++;
}

int kvchan_check(const kvchan_t *c, const msg_kv_announce_t *d, char *err, size_t errlen)
{
    return kvblocks_check(c->cfg.pool, d, err, errlen);
}

/* tcp: the endpoint must be on the sender's node (a description cannot send us elsewhere). */
static int s_recv_tcp(kvchan_t *c, const msg_kv_announce_t *d, const int32_t *blocks, int n, char *err, size_t errlen)
{
    char ep[TCPCHAN_ENDPOINT_MAX];
    if (d->handle_len >= sizeof ep || memchr(d->handle, 0, d->handle_len))
        return errf(err, errlen, "handoff.kv.handle from %s is not a tcp endpoint", d->src);
    memcpy(ep, d->handle, d->handle_len);
    ep[d->handle_len] = 0;
    const topo_instance_t *src = c->cfg.topo ? topo_find(c->cfg.topo, d->src) : NULL;
    if (!src)
        return errf(err, errlen, "tcp hand-off from %s, which the topology does not name", d->src);
    if (tcpchan_endpoint_check(ep, s_host(c, src), err, errlen) != 0)
        return -1;
    /* With CURVE the sender's key comes from the topology's key files for the instance the
     * description names, never from the description: only that instance can answer. */
    char server_key[48];
    if (c->cfg.curve_secret && (!c->cfg.peer_key ||
                                c->cfg.peer_key(c->cfg.peer_key_ctx, d->src, server_key, err, errlen) != 0))
        return -1;
    const bk_kv_t *kv = kvpool_view(c->cfg.pool);
    if (!c->tcp_in) {
        if (!(c->tcp_in = tcpchan_client_new(c->cfg.zmq_ctx, (int64_t)kv->n_blocks * (int64_t)kv->block_bytes)))
            return errf(err, errlen, "out of memory");
        if (c->cfg.curve_secret && tcpchan_client_curve(c->tcp_in, c->cfg.curve_public, c->cfg.curve_secret) != 0) {
            tcpchan_client_destroy(&c->tcp_in);
            return errf(err, errlen, "tcp channel: our CURVE keypair is not two 40-character Z85 keys");
        }
    }
    int64_t deadline = now_ms() + KVCHAN_TCP_RECV_MS;
    if (d->deadline_ms) {   /* the sender's wall-clock deadline, on our monotonic clock */
        int64_t left = (int64_t)d->deadline_ms - wall_ms();
        if (left <= 0)      /* the sender has given up on it (and dropped the bytes): do not wait */
            return errf(err, errlen, "tcp transfer %llx from %s: its deadline passed %lld ms ago",
                        (unsigned long long)d->transfer_id, d->src, (long long)-left);
        if (now_ms() + left < deadline)
            deadline = now_ms() + left;
    }
    size_t bytes = (size_t)d->total_bytes;
    uint8_t *buf = malloc(bytes);
    if (!buf)
        return errf(err, errlen, "no host memory for %zu bytes from the network", bytes);
    int rc = tcpchan_fetch_from(c->tcp_in, ep, c->cfg.curve_secret ? server_key : NULL, d->transfer_id, buf, bytes,
                                deadline, err, errlen);
    if (rc == 0 && kvblocks_in(c->cfg.be, c->cfg.pool, blocks, n, buf) != 0)
        rc = errf(err, errlen, "copying the blocks into the pool failed");
    free(buf);
    return rc;
}

int kvchan_recv(kvchan_t *c, const msg_kv_announce_t *d, const int32_t *blocks, int n, char *err, size_t errlen)
{
    if ((int)d->n_block_ids != n)
        return errf(err, errlen, "the description names %u blocks, %d here", d->n_block_ids, n);
    int rc;
    switch (d->channel) {
    case MSG_CHAN_CUDA_IPC:
        rc = kvblocks_in_ipc(c->cfg.be, c->cfg.pool, &c->ipc_in, d, blocks, n, err, errlen);
        break;
    case MSG_CHAN_NCCL:
        rc = kvlinks_recv(c->cfg.links, d, kvpool_view(c->cfg.pool), blocks, n, err, errlen);
        break;
    case MSG_CHAN_TCP:
        rc = s_recv_tcp(c, d, blocks, n, err, errlen);
        break;
    case MSG_CHAN_SHM: {
        tchan_seg_t seg;
        rc = tchan_shm_open(&seg, d->handle, d->handle_len, (size_t)d->total_bytes, err, errlen);
        if (rc == 0 && kvblocks_in(c->cfg.be, c->cfg.pool, blocks, n, seg.ptr) != 0)
            rc = errf(err, errlen, "copying the blocks into the pool failed");
        tchan_shm_close(&seg);
        break;
    }
    default:
        rc = errf(err, errlen, "channel %s is not one this worker receives", msg_channel_name(d->channel));
    }
    if (rc == 0)
        c->count[d->channel]++;
    return rc;
}

void kvchan_settle(kvchan_t *c, const msg_kv_announce_t *d) { kvlinks_settle(c->cfg.links, d); }

uint64_t kvchan_count(const kvchan_t *c, msg_channel_t ch)
{
    return c && (unsigned)ch < MSG_CHAN_COUNT ? c->count[ch] : 0;
}
