/* actors/worker/handoff_in.c — the receiver side of a hand-off (handoff_in.h). */
#include "actors/worker/handoff_in.h"

#include <stdio.h>

#include "common/log.h"
#include "common/util.h"
#include "transfer/kv_transfer.h"
#include "transfer/nccl_chan.h"
#include "transfer/shm_chan.h"

/* How the links' kv_link messages leave: ctx is the actor. */
static int s_link_send(void *ctx, const char *to, const msg_t *m) { return actor_send(ctx, to, m); }

int handoff_in_open(handoff_in_t *hi, actor_t *a, const worker_t *w, const topo_t *t, char *err, size_t errlen)
{
    hi->self = actor_self(a)->name;
    hi->w = w;
    if (!(hi->links = kvlinks_new(w->eng->be, hi->self, worker_block_bytes(w), NULL, s_link_send, a)))
        return errf(err, errlen, "out of memory for the NCCL links");
    kvchan_cfg_t cc = {.be = w->eng->be, .pool = w->eng->pool, .topo = t, .self = actor_self(a),
                       .cluster = t->name, .zmq_ctx = actor_zmq_ctx(a), .links = hi->links};
    if (chan_keys_fill(a, &hi->keys, &cc, err, errlen) != 0 || !(hi->chan = kvchan_new(&cc, err, errlen)))
        return -1;
    hi->nccl = tchan_nccl_available(w->eng->be);
    for (int i = 0; hi->nccl && i < t->n_instances; i++)   /* one not watched: its link ends at a deadline */
        if (t->instances[i].role == ROLE_PREFILL)
            actor_watch(a, t->instances[i].name);
    tchan_shm_sweep(t->name);
    return 0;
}

void handoff_in_close(handoff_in_t *hi)
{
    kvchan_destroy(&hi->chan);
    kvlinks_destroy(&hi->links);
}

int handoff_in_on_link(handoff_in_t *hi, const msg_t *m) { return kvlinks_on_msg(hi->links, m); }
void handoff_in_poll(handoff_in_t *hi) { kvlinks_poll(hi->links); }
void handoff_in_peer_event(handoff_in_t *hi, const char *peer, int up) { kvlinks_peer_event(hi->links, peer, up); }

/* Why m cannot be taken as it is (NULL: it can). */
static const char *s_check(const handoff_in_t *hi, const msg_t *m, int here, char *err, size_t errlen)
{
    const msg_handoff_t *h = &m->u.handoff;
    const msg_kv_announce_t *an = h->n_kv ? &h->kv[0] : NULL;   /* its src is h->prefill_worker (schema) */
    const uint32_t bs = (uint32_t)hi->w->block_size;
    if (!an)
        return "handoff without its KV's transfer description";
    if (an->request_id != m->id)
        return "the handoff's KV description is for another request";
    if (here)
        return "request already here";
    if (kvchan_check(hi->chan, an, err, errlen) != 0)
        return err;
    if (h->kv_tokens != h->n_tokens || an->n_block_ids != (h->n_tokens + bs - 1) / bs)
        return "the handoff's tokens and its KV description disagree on the number of blocks";
    if ((int)h->n_tokens + (int)h->sampling.max_tokens > hi->w->max_model_len)
        return "prompt + max_tokens exceeds this worker's max_model_len";
    return NULL;
}

/* The prompt's blocks into r's KV, received from the channel; *no_room when the pool has none now
 * (and could have: a prompt larger than the pool is refused). NULL, or why it failed. */
static const char *s_receive(handoff_in_t *hi, actor_t *a, dc_req_t *r, const msg_kv_announce_t *an, int *no_room,
                             char *err, size_t errlen)
{
    const msg_handoff_t *h = &r->handoff.u.handoff;
    const int32_t *toks = (const int32_t *)h->tokens;
    if (kvseq_append(r->kv, toks, (int)h->n_tokens) != 0 &&
        !(writeback_reclaim(hi->wb, a) && kvseq_append(r->kv, toks, (int)h->n_tokens) == 0)) {
        if (an->n_block_ids + 1 > (uint32_t)kvpool_n_blocks(hi->w->eng->pool))
            return "the prompt needs more KV blocks than the decode pool has";
        *no_room = 1;
        return NULL;
    }
    return kvchan_recv(hi->chan, an, kvseq_blocks(r->kv), kvseq_n_blocks(r->kv), err, errlen) != 0 ? err : NULL;
}

dc_req_t *handoff_in_take(handoff_in_t *hi, actor_t *a, const msg_t *m, int here, int *with_kv)
{
    const int64_t t0 = now_ns();
    const msg_kv_announce_t *an = m->u.handoff.n_kv ? &m->u.handoff.kv[0] : NULL;
    char err[512];
    dc_req_t *r = NULL;
    int no_room = 0;
    const char *why = s_check(hi, m, here, err, sizeof err);
    if (!why && !(r = dc_req_new(hi->w, m, err, sizeof err)))
        why = err;
    if (!why)
        why = s_receive(hi, a, r, an, &no_room, err, sizeof err);
    if (an)   /* an NCCL hand-off refused or taken without its KV still takes its bytes off the link */
        kvchan_settle(hi->chan, an);
    if (why) {
        hi->refused++;
        LOG_W("hand-off of request %llu refused: %s", (unsigned long long)m->id, why);
        if (an)
            kvx_ack(a, an->src, an->transfer_id, 0, why, NULL, 0);
        dc_req_destroy(&r);
    } else {
        kvseq_publish(r->kv);
        kvx_ack(a, an->src, an->transfer_id, 1, NULL, (const uint32_t *)kvseq_blocks(r->kv),
                (uint32_t)kvseq_n_blocks(r->kv));
        hi->taken++;
        hi->ipc += an->channel == MSG_CHAN_CUDA_IPC;
        *with_kv = !no_room;
    }
    hi->ns += (uint64_t)(now_ns() - t0);
    return r;
}

void handoff_in_refuse_announce(handoff_in_t *hi, actor_t *a, const msg_kv_announce_t *k)
{
    char err[256];
    snprintf(err, sizeof err, "%s takes KV only inside a handoff or from its cache-manager", hi->self);
    LOG_W("kv_announce %llu from %s refused: %s", (unsigned long long)k->transfer_id, k->src, err);
    kvx_ack(a, k->src, k->transfer_id, 0, err, NULL, 0);
}

void handoff_in_stats(const handoff_in_t *hi, actor_t *a, msg_stats_t *st)
{
    actor_stat_metric(a, st, "transfers_total", (double)hi->taken, 1);
    actor_stat_metric(a, st, "transfer_failures_total", (double)hi->refused, 1);
    actor_stat_metric(a, st, "transfers_cuda_ipc_total", (double)hi->ipc, 1);
    actor_stat_metric(a, st, "transfers_tcp_total", (double)kvchan_count(hi->chan, MSG_CHAN_TCP), 1);
    actor_stat_metric(a, st, "transfers_nccl_total", (double)kvlinks_transfers(hi->links), 1);
    actor_stat_metric(a, st, "nccl_links_ready", kvlinks_ready(hi->links), 0);
    actor_stat_metric(a, st, "handoff_seconds_total", (double)hi->ns / 1e9, 1);
}
