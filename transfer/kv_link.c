#include "transfer/kv_link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transfer/kv_transfer.h"
#include "common/log.h"
#include "common/util.h"
#include "transfer/le64.h"

typedef struct kvlink {
    char peer[TCHAN_NCCL_PEER_MAX];   /* "" = free slot */
    tchan_nccl_t chan;
    int offerer;                  /* 1: we offered it and send on it; 0: we joined and receive */
    int64_t retry_at;             /* FAILED: no new offer before this (now_ms clock) */
    uint64_t seq;                 /* sender: sends posted; receiver: announces taken or discarded */
    uint64_t taken_transfer;      /* receiver: the transfer id of the last announce taken */
    int taken_valid;
    int down_reported;            /* its failure was logged (and told to the peer) */
} kvlink_t;

struct kvlinks {
    backend_t *be;
    char self[TCHAN_NCCL_PEER_MAX];
    kvlink_cfg_t cfg;
    kvlink_send_fn send;
    void *ctx;
    uint64_t next_id;             /* link ids we offer: random start (kvx_first_id), then counting */
    size_t block_bytes;
    void *scratch;                /* device [block_bytes]: receiver's discard target, made at the first join */
    kvlink_t links[KVLINK_MAX];
    uint64_t transfers;           /* hand-offs completed over NCCL (sent or received) */
    uint64_t fallbacks;
};

static const kvlink_cfg_t s_default_cfg = {
    .init_timeout_ms = 20000, .send_timeout_ms = 4000, .recv_timeout_ms = 2000, .retry_ms = 30000};

kvlinks_t *kvlinks_new(backend_t *be, const char *self, size_t block_bytes, const kvlink_cfg_t *cfg,
                       kvlink_send_fn send, void *ctx)
{
    kvlinks_t *ls = calloc(1, sizeof *ls);
    if (!ls)
        return NULL;
    ls->be = be;
    snprintf(ls->self, sizeof ls->self, "%s", self ? self : "?");
    ls->cfg = cfg ? *cfg : s_default_cfg;
    ls->send = send;
    ls->ctx = ctx;
    ls->next_id = kvx_first_id();
    ls->block_bytes = block_bytes;
    for (int i = 0; i < KVLINK_MAX; i++)
        ls->links[i].chan.warm.ticket = -1;
    return ls;
}

static int s_up(const kvlink_t *k)
{
    return k->chan.state == TCHAN_NCCL_INIT || k->chan.state == TCHAN_NCCL_WARMUP || k->chan.state == TCHAN_NCCL_READY;
}

/* kv_link{failed} to the peer of link k (best effort: a peer that is gone needs no telling). */
static void s_tell_failed(kvlinks_t *ls, const char *peer, uint64_t link_id, const char *why)
{
    if (!ls->send)
        return;
    msg_t m;
    msg_init(&m, MSG_KV_LINK, link_id);
    m.u.kv_link.link_id = link_id;
    m.u.kv_link.channel = MSG_CHAN_NCCL;
    m.u.kv_link.status = MSG_ACK_FAILED;
    m.u.kv_link.n_ranks = 2;
    m.u.kv_link.src = ls->self;
    char msg[MSG_MAX_TEXT];
    snprintf(msg, sizeof msg, "%s", why && *why ? why : "link failed");
    m.u.kv_link.message = msg;
    ls->send(ls->ctx, peer, &m);
}

void kvlinks_destroy(kvlinks_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvlinks_t *ls = *self_p;
    for (int i = 0; i < KVLINK_MAX; i++) {
        kvlink_t *k = &ls->links[i];
        if (!k->peer[0])
            continue;
        if (s_up(k)) {
            char why[128];
            snprintf(why, sizeof why, "%s is stopping", ls->self);
            s_tell_failed(ls, k->peer, k->chan.link_id, why);
        }
        tchan_nccl_close(&k->chan);
    }
    if (ls->scratch)
        ls->be->ops->free(ls->be, ls->scratch);
    free(ls);
    *self_p = NULL;
}

msg_channel_t kvlink_route(const topo_instance_t *from, const topo_instance_t *to, int ipc_ok, int nccl_ok)
{
    if (!from || !to)
        return MSG_CHAN_SHM;
    const int gpus = from->gpu >= 0 && to->gpu >= 0;
    if (from->node != to->node)   /* shared memory cannot cross machines */
        return gpus && nccl_ok ? MSG_CHAN_NCCL : MSG_CHAN_TCP;
    if (!gpus)
        return MSG_CHAN_SHM;
    if (from->gpu == to->gpu)
        return ipc_ok ? MSG_CHAN_CUDA_IPC : MSG_CHAN_SHM;
    return nccl_ok ? MSG_CHAN_NCCL : MSG_CHAN_SHM;
}

static kvlink_t *s_find(const kvlinks_t *ls, const char *peer)
{
    for (int i = 0; ls && peer && i < KVLINK_MAX; i++)
        if (ls->links[i].peer[0] && strcmp(ls->links[i].peer, peer) == 0)
            return (kvlink_t *)&ls->links[i];
    return NULL;
}

/* The peer's slot, made when missing; NULL when every slot holds a live link. */
static kvlink_t *s_slot(kvlinks_t *ls, const char *peer)
{
    kvlink_t *k = s_find(ls, peer), *spare = NULL;
    if (k)
        return k;
    for (int i = 0; i < KVLINK_MAX && !k; i++) {
        kvlink_t *c = &ls->links[i];
        if (!c->peer[0])
            k = c;
        else if (!spare && !s_up(c))
            spare = c;   /* a dead link of another peer can make room */
    }
    if (!k)
        k = spare;
    if (!k)
        return NULL;
    tchan_nccl_close(&k->chan);
    memset(k, 0, sizeof *k);
    k->chan.warm.ticket = -1;
    snprintf(k->peer, sizeof k->peer, "%s", peer);
    return k;
}

/* The link is down: aborted (or never opened), no new offer for retry_ms; logged once, and the
 * peer told when `tell` (it aborts its side). */
static void s_down(kvlinks_t *ls, kvlink_t *k, const char *why, int tell)
{
    if (k->down_reported)
        return;
    int opened = k->chan.state != TCHAN_NCCL_CLOSED;
    if (!opened) {
        k->chan.state = TCHAN_NCCL_FAILED;
        snprintf(k->chan.why, sizeof k->chan.why, "%s", why);
    } else {
        tchan_nccl_abort(&k->chan, why);
    }
    k->retry_at = now_ms() + ls->cfg.retry_ms;
    k->down_reported = 1;
    LOG_W("%s; hand-offs %s %s take the fallback channel (%s)", k->chan.why, k->offerer ? "to" : "from", k->peer,
          k->offerer ? "a new link is offered after a while" : "until the sender offers a new link");
    if (tell && opened && k->chan.link_id)
        s_tell_failed(ls, k->peer, k->chan.link_id, k->chan.why);
}

void kvlinks_want(kvlinks_t *ls, const char *peer)
{
    if (!ls || !peer)
        return;
    kvlink_t *k = s_find(ls, peer);
    if (k && (s_up(k) || (k->chan.state == TCHAN_NCCL_FAILED && now_ms() < k->retry_at)))
        return;
    if (!(k = s_slot(ls, peer))) {
        LOG_W("no room for an NCCL link to %s (%d links): its hand-offs take the fallback channel", peer, KVLINK_MAX);
        return;
    }
    tchan_nccl_close(&k->chan);
    k->offerer = 1;
    k->seq = 0;
    k->down_reported = 0;
    char err[512];
    uint8_t id[TCHAN_NCCL_ID_BYTES];
    uint64_t link_id = ++ls->next_id;
    if (tchan_nccl_unique_id(ls->be, id, err, sizeof err) != 0 ||
        tchan_nccl_open(&k->chan, ls->be, peer, link_id, id, sizeof id, 2, 0, ls->cfg.init_timeout_ms, err,
                        sizeof err) != 0) {
        s_down(ls, k, err, 0);
        return;
    }
    msg_t m;
    msg_init(&m, MSG_KV_LINK, link_id);
    msg_kv_link_t *o = &m.u.kv_link;
    o->link_id = link_id;
    o->channel = MSG_CHAN_NCCL;
    o->status = MSG_ACK_OK;
    o->handle = id;
    o->handle_len = sizeof id;
    o->n_ranks = 2;
    o->rank = 1;
    o->src = ls->self;
    o->deadline_ms = (uint64_t)(wall_ms() + ls->cfg.init_timeout_ms);
    if (!ls->send || ls->send(ls->ctx, peer, &m) != 0) {
        snprintf(err, sizeof err, "NCCL link to %s (link %llx): the offer could not be sent", peer,
                 (unsigned long long)link_id);
        s_down(ls, k, err, 0);
        return;
    }
    LOG_I("NCCL link %llx to %s offered (rank 0 of 2)", (unsigned long long)link_id, peer);
}

msg_channel_t kvlinks_channel(kvlinks_t *ls, const char *peer, msg_channel_t route)
{
    if (route != MSG_CHAN_NCCL)
        return route;
    kvlink_t *k = s_find(ls, peer);
    if (k && k->offerer && k->chan.state == TCHAN_NCCL_READY)
        return MSG_CHAN_NCCL;
    kvlinks_want(ls, peer);
    if (ls)
        ls->fallbacks++;
    return MSG_CHAN_SHM;
}

int kvlink_handle_parse(const msg_kv_announce_t *a, uint64_t *link_id, uint64_t *seq, char *err, size_t errlen)
{
    if (a->channel != MSG_CHAN_NCCL)
        return errf(err, errlen, "kv_announce from %s: channel %s, not nccl", a->src, msg_channel_name(a->channel));
    if (a->handle_len != KVLINK_HANDLE_BYTES)
        return errf(err, errlen, "kv_announce from %s: an NCCL handle of %u bytes (link id and sequence: %d)", a->src,
                    a->handle_len, KVLINK_HANDLE_BYTES);
    *link_id = le64_get(a->handle);
    *seq = le64_get(a->handle + 8);
    return 0;
}

int kvlinks_send(kvlinks_t *ls, const char *peer, const bk_kv_t *kv, const int32_t *blocks, int n,
                 tchan_nccl_xfer_t *x, uint8_t handle[KVLINK_HANDLE_BYTES], char *err, size_t errlen)
{
    kvlink_t *k = s_find(ls, peer);
    x->ticket = -1;
    if (!k || !k->offerer || k->chan.state != TCHAN_NCCL_READY)
        return errf(err, errlen, "no NCCL link to %s is up", peer);
    if (tchan_nccl_send(&k->chan, kv, blocks, n, ls->cfg.send_timeout_ms, x, err, errlen) != 0) {
        if (k->chan.state != TCHAN_NCCL_READY)
            s_down(ls, k, err, 1);   /* else nothing was posted: this one goes by shm, the link stays */
        return -1;
    }
    le64_put(handle, k->chan.link_id);
    le64_put(handle + 8, k->seq++);
    return 0;
}

int kvlinks_test(kvlinks_t *ls, const char *peer, tchan_nccl_xfer_t *x, char *err, size_t errlen)
{
    kvlink_t *k = s_find(ls, peer);
    if (!k)
        return errf(err, errlen, "the NCCL link to %s is gone", peer);
    int was_done = x->done;
    int s = tchan_nccl_test(&k->chan, x, err, errlen);
    if (s > 0 && !was_done)
        ls->transfers++;
    if (s < 0 && k->chan.state == TCHAN_NCCL_FAILED && x->link_id == k->chan.link_id)
        s_down(ls, k, k->chan.why, 1);   /* this transfer failed the link (no-op when known) */
    return s;
}

void kvlinks_abort(kvlinks_t *ls, const char *peer, const char *why)
{
    kvlink_t *k = s_find(ls, peer);
    if (k && s_up(k)) {
        char msg[512];
        snprintf(msg, sizeof msg, "NCCL link to %s (link %llx): %s; communicator aborted", peer,
                 (unsigned long long)k->chan.link_id, why);
        s_down(ls, k, msg, 1);
    }
}

void kvlinks_peer_event(kvlinks_t *ls, const char *peer, int up)
{
    kvlink_t *k = ls && peer ? s_find(ls, peer) : NULL;
    if (!k)
        return;
    if (!up)
        kvlinks_abort(ls, peer, "the peer's process is gone");
    else if (k->chan.state == TCHAN_NCCL_FAILED)
        k->retry_at = 0;
}

/* The receiving link an announce names, READY (waited for, briefly, when it is still coming up:
 * the sender posts only on a READY link, so ours is at most one exchange behind). */
static kvlink_t *s_recv_link(kvlinks_t *ls, const msg_kv_announce_t *a, char *err, size_t errlen)
{
    uint64_t id, seq;
    if (!ls)
        return errf(err, errlen, "kv_announce from %s: this worker has no NCCL links", a->src), NULL;
    if (kvlink_handle_parse(a, &id, &seq, err, errlen) != 0)
        return NULL;
    kvlink_t *k = s_find(ls, a->src);
    if (!k || k->offerer || k->chan.link_id != id || !s_up(k)) {
        errf(err, errlen, "kv_announce from %s names NCCL link %llx, which is not up here (%s)", a->src,
             (unsigned long long)id,
             !k || k->offerer ? "no link from it"
             : k->chan.link_id != id ? "another link replaced it"
             : k->chan.why[0] ? k->chan.why : tchan_nccl_state_name(k->chan.state));
        return NULL;
    }
    int64_t until = now_ms() + ls->cfg.recv_timeout_ms;
    char why[512];
    while (k->chan.state != TCHAN_NCCL_READY) {
        tchan_nccl_state_t st = tchan_nccl_poll(&k->chan, why, sizeof why);
        if (st == TCHAN_NCCL_READY)
            break;
        if (st == TCHAN_NCCL_FAILED || now_ms() > until) {
            if (st != TCHAN_NCCL_FAILED)
                snprintf(why, sizeof why, "NCCL link from %s (link %llx): not ready %lld ms after the sender used it",
                         a->src, (unsigned long long)id, (long long)ls->cfg.recv_timeout_ms);
            s_down(ls, k, why, 1);
            errf(err, errlen, "%s", k->chan.why);
            return NULL;
        }
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
    if (seq != k->seq) {
        char msg[512];
        snprintf(msg, sizeof msg, "NCCL link from %s (link %llx): transfer %llu is number %llu on the link, %llu "
                 "expected: the order of transfers broke; communicator aborted", a->src, (unsigned long long)id,
                 (unsigned long long)a->transfer_id, (unsigned long long)seq, (unsigned long long)k->seq);
        s_down(ls, k, msg, 1);
        errf(err, errlen, "%s", k->chan.why);
        return NULL;
    }
    return k;
}

/* After posting (posted: its return): waits for the transfer; the announce counts as taken
 * either way (a failure takes the link down). */
static int s_take(kvlinks_t *ls, kvlink_t *k, const msg_kv_announce_t *a, int posted, tchan_nccl_xfer_t *x,
                  int count, char *err, size_t errlen)
{
    k->seq++;
    k->taken_transfer = a->transfer_id;
    k->taken_valid = 1;
    if (posted != 0 || tchan_nccl_wait(&k->chan, x, err, errlen) != 1) {
        s_down(ls, k, k->chan.why[0] ? k->chan.why : err, 1);
        return errf(err, errlen, "%s", k->chan.why);
    }
    ls->transfers += (uint64_t)count;
    return 0;
}

int kvlinks_recv(kvlinks_t *ls, const msg_kv_announce_t *a, const bk_kv_t *kv, const int32_t *blocks, int n,
                 char *err, size_t errlen)
{
    kvlink_t *k = s_recv_link(ls, a, err, errlen);
    if (!k)
        return -1;
    if (n != (int)a->n_block_ids || a->total_bytes != (uint64_t)n * kv->block_bytes)
        return errf(err, errlen, "kv_announce from %s: %u blocks of %llu bytes in all, %d blocks of %zu here",
                    a->src, a->n_block_ids, (unsigned long long)a->total_bytes, n, kv->block_bytes);
    tchan_nccl_xfer_t x;
    int posted = tchan_nccl_recv(&k->chan, kv, blocks, n, ls->cfg.recv_timeout_ms, &x, err, errlen);
    return s_take(ls, k, a, posted, &x, 1, err, errlen);
}

void kvlinks_settle(kvlinks_t *ls, const msg_kv_announce_t *a)
{
    uint64_t id, seq;
    char err[512];
    if (!ls || a->channel != MSG_CHAN_NCCL || kvlink_handle_parse(a, &id, &seq, err, sizeof err) != 0)
        return;
    kvlink_t *k = s_find(ls, a->src);
    if (!k || k->offerer || k->chan.link_id != id || !s_up(k) ||
        (k->taken_valid && k->taken_transfer == a->transfer_id))
        return;
    if (!(k = s_recv_link(ls, a, err, sizeof err)))
        return;
    /* The sender's blocks: its bytes per block, which our scratch block must hold. */
    uint64_t per = a->n_block_ids ? a->total_bytes / a->n_block_ids : 0;
    if (!ls->scratch || per == 0 || per * a->n_block_ids != a->total_bytes || per > ls->block_bytes) {
        snprintf(err, sizeof err, "NCCL link from %s (link %llx): transfer %llu (%u blocks of %llu bytes) cannot be "
                 "discarded into a block of %zu; communicator aborted", a->src, (unsigned long long)id,
                 (unsigned long long)a->transfer_id, a->n_block_ids, (unsigned long long)per, ls->block_bytes);
        s_down(ls, k, err, 1);
        return;
    }
    tchan_nccl_xfer_t x;
    int posted = tchan_nccl_discard(&k->chan, ls->scratch, (size_t)per, (int)a->n_block_ids, ls->cfg.recv_timeout_ms,
                                    &x, err, sizeof err);
    if (s_take(ls, k, a, posted, &x, 0, err, sizeof err) == 0)
        LOG_D("transfer %llu from %s discarded (%u blocks): its hand-off was not taken with its KV",
              (unsigned long long)a->transfer_id, a->src, a->n_block_ids);
}

/* Answers an offer we cannot take. */
static void s_refuse(kvlinks_t *ls, const msg_kv_link_t *o, const char *why)
{
    LOG_W("NCCL link %llx from %s refused: %s", (unsigned long long)o->link_id, o->src, why);
    s_tell_failed(ls, o->src, o->link_id, why);
}

int kvlinks_on_msg(kvlinks_t *ls, const msg_t *m)
{
    if (!ls || m->type != MSG_KV_LINK)
        return 0;
    const msg_kv_link_t *o = &m->u.kv_link;
    char err[512];
    if (o->channel != MSG_CHAN_NCCL) {
        snprintf(err, sizeof err, "%s links are not made here (only nccl)", msg_channel_name(o->channel));
        if (o->status == MSG_ACK_OK)
            s_refuse(ls, o, err);
        return 0;
    }
    kvlink_t *k = s_find(ls, o->src);
    if (o->status == MSG_ACK_FAILED) {
        if (k && k->chan.link_id == o->link_id && s_up(k)) {
            snprintf(err, sizeof err, "NCCL link %s %s (link %llx) closed by the peer: %s", k->offerer ? "to" : "from",
                     o->src, (unsigned long long)o->link_id, o->message ? o->message : "no reason");
            s_down(ls, k, err, 0);
        }
        return 0;
    }
    if (k && k->chan.link_id == o->link_id && !k->offerer && s_up(k))
        return 0;   /* the same offer again */
    if (!tchan_nccl_available(ls->be)) {
        snprintf(err, sizeof err, "%s cannot join: its backend (%s) has no NCCL", ls->self, ls->be->ops->name);
        s_refuse(ls, o, err);
        return 0;
    }
    if (!ls->scratch && !(ls->scratch = ls->be->ops->alloc(ls->be, ls->block_bytes ? ls->block_bytes : 64))) {
        snprintf(err, sizeof err, "%s cannot join: no device memory for a scratch block", ls->self);
        s_refuse(ls, o, err);
        return 0;
    }
    if (k && s_up(k))
        LOG_I("NCCL link %llx %s %s replaced by link %llx from it", (unsigned long long)k->chan.link_id,
              k->offerer ? "to" : "from", o->src, (unsigned long long)o->link_id);
    if (!(k = s_slot(ls, o->src))) {
        snprintf(err, sizeof err, "%s cannot join: %d links already", ls->self, KVLINK_MAX);
        s_refuse(ls, o, err);
        return 0;
    }
    tchan_nccl_close(&k->chan);   /* an older link with this peer, in either direction */
    k->offerer = 0;
    k->seq = 0;
    k->taken_valid = 0;
    k->retry_at = 0;
    k->down_reported = 0;
    int64_t timeout = ls->cfg.init_timeout_ms;
    if (o->deadline_ms) {
        int64_t left = (int64_t)o->deadline_ms - wall_ms();
        if (left < timeout)
            timeout = left > 0 ? left : 0;
    }
    if (tchan_nccl_open(&k->chan, ls->be, o->src, o->link_id, o->handle, o->handle_len, (int)o->n_ranks, (int)o->rank,
                        timeout, err, sizeof err) != 0) {
        s_refuse(ls, o, err);
        return 0;
    }
    LOG_I("joining NCCL link %llx from %s (rank %u of %u)", (unsigned long long)o->link_id, o->src, o->rank, o->n_ranks);
    return 0;
}

void kvlinks_poll(kvlinks_t *ls)
{
    for (int i = 0; ls && i < KVLINK_MAX; i++) {
        kvlink_t *k = &ls->links[i];
        if (!k->peer[0] || (k->chan.state != TCHAN_NCCL_INIT && k->chan.state != TCHAN_NCCL_WARMUP))
            continue;
        char err[512];
        tchan_nccl_state_t st = tchan_nccl_poll(&k->chan, err, sizeof err);
        if (st == TCHAN_NCCL_READY) {
            LOG_I("NCCL link %llx %s %s is up (%lld ms): its hand-offs go GPU to GPU", (unsigned long long)k->chan.link_id,
                  k->offerer ? "to" : "from", k->peer, (long long)(now_ms() - k->chan.opened_ms));
        } else if (st == TCHAN_NCCL_FAILED) {
            s_down(ls, k, k->chan.why, 1);   /* already aborted by the poll: log, tell, wait to retry */
        }
    }
}

tchan_nccl_state_t kvlinks_state(const kvlinks_t *ls, const char *peer, const char **why)
{
    const kvlink_t *k = s_find(ls, peer);
    if (why)
        *why = k && k->chan.state == TCHAN_NCCL_FAILED ? k->chan.why : NULL;
    return k ? k->chan.state : TCHAN_NCCL_CLOSED;
}

uint64_t kvlinks_transfers(const kvlinks_t *ls) { return ls ? ls->transfers : 0; }

uint64_t kvlinks_fallbacks(const kvlinks_t *ls) { return ls ? ls->fallbacks : 0; }

int kvlinks_ready(const kvlinks_t *ls)
{
    int n = 0;
    for (int i = 0; ls && i < KVLINK_MAX; i++)
        n += ls->links[i].peer[0] && ls->links[i].chan.state == TCHAN_NCCL_READY;
    return n;
}
