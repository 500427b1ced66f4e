/* actors/worker/handoff_out.c — the sender side of a hand-off (handoff_out.h). */
#include "actors/worker/handoff_out.h"

#include <stdio.h>

#include "common/log.h"
#include "common/util.h"
#include "transfer/kv_transfer.h"
#include "transfer/nccl_chan.h"
#include "transfer/shm_chan.h"

/* A refused NCCL hand-off is retried through the fallback once our send is over: the decode side
 * receives (and drops) the bytes of a hand-off it refuses, so this only bounds a refusal that left
 * them on the link (its link is then aborted). */
#define REFUSED_SEND_GRACE_MS 250

/* How the links' kv_link messages leave: ctx is the actor. */
static int s_link_send(void *ctx, const char *to, const msg_t *m) { return actor_send(ctx, to, m); }

int handoff_out_open(handoff_out_t *ho, actor_t *a, const worker_t *w, const topo_t *t, const char *cache_manager,
                     char *err, size_t errlen)
{
    ho->self = actor_self(a)->name;
    ho->w = w;
    ho->cache_manager = cache_manager;
    ho->next_transfer = kvx_first_id();
    if (u64map_init(&ho->by_transfer, 64) != 0 ||
        !(ho->links = kvlinks_new(w->eng->be, ho->self, worker_block_bytes(w), NULL, s_link_send, a)))
        return errf(err, errlen, "out of memory for the hand-offs");
    kvchan_cfg_t cc = {.be = w->eng->be, .pool = w->eng->pool, .topo = t, .self = actor_self(a),
                       .cluster = t->name, .zmq_ctx = actor_zmq_ctx(a), .links = ho->links};
    if (chan_keys_fill(a, &ho->keys, &cc, err, errlen) != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        return errf(err, errlen, "security: the KV channel's keys: %s", why);
    }
    if (!(ho->chan = kvchan_new(&cc, err, errlen)))
        return -1;
    ho->nccl = tchan_nccl_available(w->eng->be);
    for (int i = 0; ho->nccl && i < t->n_instances; i++)
        if (t->instances[i].role == ROLE_DECODE) {
            actor_watch(a, t->instances[i].name);
            if (kvchan_route_to(ho->chan, t->instances[i].name) == MSG_CHAN_NCCL && ho->n_nccl_peers < KVLINK_MAX)
                ho->nccl_peers[ho->n_nccl_peers++] = t->instances[i].name;
        }
    tchan_shm_sweep(t->name);
    return 0;
}

void handoff_out_close_links(handoff_out_t *ho) { kvlinks_destroy(&ho->links); }

void handoff_out_close(handoff_out_t *ho)
{
    kvlinks_destroy(&ho->links);
    kvchan_destroy(&ho->chan);
    u64map_free(&ho->by_transfer);
}

static void s_unlink(handoff_out_t *ho, handoff_out_req_t *x)
{
    if (!x->started)
        return;
    *(x->prev ? &x->prev->next : &ho->head) = x->next;
    *(x->next ? &x->next->prev : &ho->tail) = x->prev;
    x->prev = x->next = NULL;
    x->started = 0;
    u64map_del(&ho->by_transfer, x->transfer_id);
    if (x->nccl_transfer)
        u64map_del(&ho->by_transfer, x->nccl_transfer);
}

void handoff_out_release(handoff_out_t *ho, handoff_out_req_t *x)
{
    s_unlink(ho, x);
    kvchan_release(ho->chan, &x->out);
}

/* The hooks end x (the owner releases it with its request, which x may be part of: x is not
 * touched after). */
static void s_done(handoff_out_t *ho, handoff_out_req_t *x)
{
    ho->acked++;
    s_unlink(ho, x);
    ho->done(ho->ctx, x);
}

static void s_fail(handoff_out_t *ho, handoff_out_req_t *x, msg_error_code_t code, const char *why)
{
    s_unlink(ho, x);
    ho->fail(ho->ctx, x, code, why);
}

/* One attempt by `channel` (NCCL falls back when the send cannot be posted): the blocks move, then
 * the handoff with the transfer's description goes; x fails when either cannot. */
static void s_send(handoff_out_t *ho, actor_t *a, handoff_out_req_t *x, msg_channel_t channel)
{
    char err[512];
    kvchan_release(ho->chan, &x->out);   /* a retry: the failed attempt's segment or staged bytes */
    if (x->transfer_id && x->transfer_id != x->nccl_transfer)
        u64map_del(&ho->by_transfer, x->transfer_id);
    x->transfer_id = ++ho->next_transfer;
    x->sent = x->acked = x->refused = 0;
    if (u64map_put(&ho->by_transfer, x->transfer_id, (uint64_t)(uintptr_t)x) != 0) {
        s_fail(ho, x, MSG_ERR_OVERLOADED, "prefill out of memory for the hand-off");
        return;
    }
    if (kvchan_send(ho->chan, x->to, channel, x->transfer_id, x->msg.id, kvseq_blocks(x->kv), kvseq_n_blocks(x->kv),
                    HANDOFF_TIMEOUT_MS, &x->out, err, sizeof err) != 0) {
        s_fail(ho, x, MSG_ERR_TRANSFER_FAILED, err);
        return;
    }
    x->msg.u.handoff.prefill_worker = ho->self;
    x->msg.u.handoff.kv = &x->out.desc;
    x->msg.u.handoff.n_kv = 1;
    /* Kept past a full outbox (never refused for it): one per request, bounded by our pool's blocks,
     * which stay ours until the kv_ack; refused, a request would fail only for a burst. */
    if (actor_send_keep(a, x->to, &x->msg) != 0) {
        /* A posted send nobody will receive would pair with the next hand-off's receive. */
        if (x->out.channel == MSG_CHAN_NCCL)
            kvlinks_abort(ho->links, x->to, "a posted send could not be announced");
        s_fail(ho, x, MSG_ERR_UNAVAILABLE, "decode worker unreachable for the KV hand-off");
        return;
    }
    if (!x->handed)
        worker_publish_blocks(a, ho->self, ho->cache_manager, x->kv, ho->w->block_size);
    x->deadline_ms = now_ms() + HANDOFF_TIMEOUT_MS;
    LOG_D("request %llu: hand-off %s", (unsigned long long)x->msg.id, x->handed ? "retried through the fallback channel" : "sent");
    x->handed = 1;
}

void handoff_out_start(handoff_out_t *ho, actor_t *a, handoff_out_req_t *x)
{
    x->prev = ho->tail;
    x->next = NULL;
    *(ho->tail ? &ho->tail->next : &ho->head) = x;
    ho->tail = x;
    x->started = 1;
    s_send(ho, a, x, kvchan_channel(ho->chan, x->to));
}

/* An NCCL hand-off that failed (link broke, send past its deadline, refused) is done once more
 * through the pair's fallback: our blocks are still here, so nothing is lost. */
static void s_retry(handoff_out_t *ho, actor_t *a, handoff_out_req_t *x, const char *why)
{
    const msg_channel_t fb = kvchan_fallback(ho->chan, x->to);
    LOG_W("request %llu: NCCL hand-off to %s failed (%s); handing it off through %s", (unsigned long long)x->msg.id, x->to,
          why, msg_channel_name(fb));
    ho->retries++;
    x->nccl_transfer = x->transfer_id;
    s_send(ho, a, x, fb);
}

void handoff_out_on_ack(handoff_out_t *ho, actor_t *a, const msg_kv_ack_t *k)
{
    uint64_t *v = k->transfer_id ? u64map_get(&ho->by_transfer, k->transfer_id) : NULL;
    if (!v)
        return;   /* a late ack for a transfer we already gave up on */
    handoff_out_req_t *x = (handoff_out_req_t *)(uintptr_t)*v;
    if (x->nccl_transfer == k->transfer_id) {
        /* The NCCL attempt's late answer, its retry already out: ok means the decode side has the
         * request (it refuses the retry as a duplicate); a refusal is old news. */
        if (k->status == MSG_ACK_OK)
            s_done(ho, x);
        return;
    }
    char err[512];
    if (x->out.channel == MSG_CHAN_NCCL && !x->sent && kvchan_test(ho->chan, x->to, &x->out, err, sizeof err) != 0)
        x->sent = 1;   /* done, or its link aborted: NCCL reads our blocks no more */
    if (k->status == MSG_ACK_OK && x->out.channel == MSG_CHAN_NCCL && !x->sent) {
        x->acked = 1;   /* NCCL may still read the blocks: done when our send is seen done */
    } else if (k->status == MSG_ACK_OK) {
        kvchan_acked(ho->chan, x->out.channel);
        LOG_D("request %llu handed off (%d blocks)", (unsigned long long)x->msg.id, kvseq_n_blocks(x->kv));
        s_done(ho, x);
    } else if (x->out.channel == MSG_CHAN_NCCL) {
        char why[512];
        snprintf(why, sizeof why, "refused by %s: %s", x->to, k->message ? k->message : "no reason");
        x->refused = 1;
        if (x->sent)
            s_retry(ho, a, x, why);
        else if (x->out.xfer.deadline_ms > now_ms() + REFUSED_SEND_GRACE_MS)
            x->out.xfer.deadline_ms = now_ms() + REFUSED_SEND_GRACE_MS;
    } else {
        ho->failures++;
        char why[512];
        snprintf(why, sizeof why, "KV hand-off refused by %s: %s", x->to, k->message ? k->message : "no reason");
        s_fail(ho, x, MSG_ERR_TRANSFER_FAILED, why);
    }
}

void handoff_out_expire(handoff_out_t *ho)
{
    const int64_t now = now_ms();
    for (handoff_out_req_t *x = ho->head, *next; x; x = next) {
        next = x->next;
        if (now > x->deadline_ms) {
            ho->failures++;
            s_fail(ho, x, MSG_ERR_TRANSFER_FAILED, "KV hand-off not acknowledged in time");
        }
    }
}

void handoff_out_poll(handoff_out_t *ho, actor_t *a)
{
    /* A link to every decode worker on another GPU of the node, before any prompt needs it: at
     * start, and again once a failed one's retry time has passed (kvlinks_want does nothing for a
     * link that is up or coming up), so a decode worker that took longer to load than the link's
     * set-up deadline still gets one without waiting for a hand-off. A restarted worker's retry
     * time is cleared when its connection comes back (handoff_out_peer_event): offered now. */
    for (int i = 0; i < ho->n_nccl_peers; i++)
        kvlinks_want(ho->links, ho->nccl_peers[i]);
    kvlinks_poll(ho->links);
    char err[512];
    for (handoff_out_req_t *x = ho->head, *next; x; x = next) {
        next = x->next;
        if (x->out.channel != MSG_CHAN_NCCL || x->sent)
            continue;
        int s = kvchan_test(ho->chan, x->to, &x->out, err, sizeof err);
        if (s == 0)
            continue;
        x->sent = 1;
        if (x->acked)
            s_done(ho, x);
        else if (s < 0 || x->refused)
            s_retry(ho, a, x, s < 0 ? err : "refused by the decode worker");
    }
}

int handoff_out_on_link(handoff_out_t *ho, const msg_t *m) { return kvlinks_on_msg(ho->links, m); }
void handoff_out_peer_event(handoff_out_t *ho, const char *peer, int up) { kvlinks_peer_event(ho->links, peer, up); }

void handoff_out_stats(const handoff_out_t *ho, actor_t *a, msg_stats_t *st)
{
    actor_stat_metric(a, st, "transfers_total", (double)ho->acked, 1);
    actor_stat_metric(a, st, "transfer_failures_total", (double)ho->failures, 1);
    actor_stat_metric(a, st, "transfers_nccl_total", (double)kvlinks_transfers(ho->links), 1);
    actor_stat_metric(a, st, "transfers_tcp_total", (double)kvchan_count(ho->chan, MSG_CHAN_TCP), 1);
    actor_stat_metric(a, st, "nccl_links_ready", kvlinks_ready(ho->links), 0);
    actor_stat_metric(a, st, "transfer_retries_total", (double)ho->retries, 1);
    actor_stat_metric(a, st, "transfers_nccl_fallback_total", (double)kvlinks_fallbacks(ho->links), 1);
}
