/* engine/ep_meet.c — which transport an expert-parallel group of member processes uses, and the
 * NCCL unique id's hand-off over the unix sockets the ranks met on (engine/ep.h: ep_meet).
 *
 * Every rank trades a fixed ep_rank_info_t with every other and runs the same pure choice over the
 * same n infos, so the ranks agree without a leader's say; an env value that differs between the
 * ranks is settled the same way (any "sock" wins over auto; "nccl" against "sock" fails the group).
 * With NCCL, every step of the set-up ends with a trade over the sockets within a deadline, and the
 * last one (each rank's verdict) makes every rank keep NCCL only when every rank has it up and
 * checked: no rank ever runs NCCL while a peer runs sockets, and a failure anywhere costs at most
 * the deadlines, never a hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/ep.h"

#define EP_INFO_MAGIC 0x45504931u      /* "EPI1" */
#define EP_ID_MAGIC 0x45504932u        /* "EPI2" */
#define EP_VERDICT_MAGIC 0x45504933u   /* "EPI3" */
/* The check trade's bytes to each peer: enough for NCCL to set up its connections to every peer
 * before the first step (so a failure shows here, where the group can still keep the sockets),
 * bounded for large groups. */
#define EP_CHECK_BYTES (1u << 20)
#define EP_CHECK_TOTAL (16u << 20)

/* Rank 0's unique id, to every other rank. */
typedef struct {
    uint32_t magic, ok;           /* ok 0: rank 0 could not make one (why says) */
    uint8_t id[BK_NCCL_ID_BYTES];
    char why[240];
} ep_idmsg_t;

/* Each rank's word on its communicator, to every other rank. */
typedef struct {
    uint32_t magic, ok;
    char why[248];
} ep_verdict_t;

int ep_want_parse(const char *s, ep_want_t *out, char *err, size_t errlen)
{
    if (!s || !*s || strcmp(s, "auto") == 0)
        *out = EP_WANT_AUTO;
    else if (strcmp(s, "sock") == 0)
        *out = EP_WANT_SOCK;
    else if (strcmp(s, "nccl") == 0)
        *out = EP_WANT_NCCL;
    else
        return errf(err, errlen, "TROUPE_EP_TRANSPORT=%s: auto, sock or nccl", s);
    return 0;
}

static const char *s_want_name(uint32_t w)
{
    return w == EP_WANT_SOCK ? "sock" : w == EP_WANT_NCCL ? "nccl" : "auto";
}

/* Why NCCL cannot carry this group, in sock_why; 0 when it can. */
static int s_blocker(const ep_rank_info_t *in, int n, char *why, size_t whylen)
{
    for (int r = 0; r < n; r++)
        if (in[r].want == EP_WANT_SOCK)
            return errf(why, whylen, "rank %d has TROUPE_EP_TRANSPORT=sock", r);
    for (int r = 0; r < n; r++) {
        if (in[r].device < 0)
            return errf(why, whylen, "rank %d is not on a GPU", r);
        if (!in[r].nccl)
            return errf(why, whylen, "rank %d's backend (GPU %d) has no NCCL (built without nccl.h)", r, in[r].device);
    }
    for (int r = 1; r < n; r++) {
        if (in[r].host != in[0].host)
            return errf(why, whylen, "ranks 0 and %d are on different hosts", r);
        if (in[r].visible != in[0].visible)
            return errf(why, whylen, "ranks 0 and %d number the GPUs differently (CUDA_VISIBLE_DEVICES)", r);
    }
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (in[a].device == in[b].device)
                return errf(why, whylen, "ranks %d and %d share GPU %d (NCCL takes one rank per GPU)", a, b,
                            in[a].device);
    return 0;
}

int ep_xport_choose(const ep_rank_info_t *in, int n, char *why, size_t whylen)
{
    if (n < 1 || n > EP_MAX_RANKS)
        return errf(why, whylen, "a group of %d ranks (1..%d)", n, EP_MAX_RANKS);
    int req = -1, sock = -1;
    for (int r = 0; r < n; r++) {
        if (in[r].magic != EP_INFO_MAGIC || in[r].want > EP_WANT_NCCL)
            return errf(why, whylen, "rank %d sent no valid transport info (another build?)", r);
        if (in[r].want == EP_WANT_NCCL && req < 0)
            req = r;
        if (in[r].want == EP_WANT_SOCK && sock < 0)
            sock = r;
    }
    if (req >= 0 && sock >= 0)
        return errf(why, whylen, "rank %d requires NCCL (TROUPE_EP_TRANSPORT=nccl), rank %d sockets "
                    "(TROUPE_EP_TRANSPORT=sock)", req, sock);
    char b[200];
    if (n < 2)
        snprintf(b, sizeof b, "a group of one rank");
    else if (s_blocker(in, n, b, sizeof b) == 0) {
        size_t k = (size_t)snprintf(why, whylen, "NCCL: every rank on its own GPU (");
        for (int r = 0; r < n && k < whylen; r++)
            k += (size_t)snprintf(why + k, whylen - k, "%s%d", r ? " " : "", in[r].device);
        if (k < whylen)
            snprintf(why + k, whylen - k, ")");
        return 1;
    }
    if (req >= 0)
        return errf(why, whylen, "rank %d requires NCCL (TROUPE_EP_TRANSPORT=nccl), but %s", req, b);
    snprintf(why, whylen, "sockets: %s", b);
    return 0;
}

static uint64_t s_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h | 1;   /* never 0: 0 is "unset" */
}

/* Every rank's `bytes` bytes of `mine` into all [n][bytes] (own part included). */
static int s_trade(ep_comm_t *c, const void *mine, size_t bytes, void *all, int deadline_ms, char *err, size_t errlen)
{
    const void *s[EP_MAX_RANKS];
    void *r[EP_MAX_RANKS];
    size_t n[EP_MAX_RANKS];
    for (int i = 0; i < c->n_ranks; i++) {
        s[i] = mine;
        r[i] = (uint8_t *)all + (size_t)i * bytes;
        n[i] = bytes;
    }
    return c->ops->exchange(c, s, n, r, n, deadline_ms, err, errlen);
}

static uint32_t s_pattern(int from, int to, size_t i)
{
    uint32_t x = (uint32_t)from * 0x9e3779b1u ^ (uint32_t)to * 0x85ebca77u ^ (uint32_t)i * 0xc2b2ae3du;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    return x ^ (x >> 12);
}

/* The check trade over the fresh NCCL comm: each rank sends each peer a pattern of its own and the
 * peer's ranks, from device memory, and checks what arrives. 0, or -1 with why. */
static int s_check(ep_comm_t *nc, backend_t *be, int deadline_ms, char *why, size_t whylen)
{
    const int n = nc->n_ranks, me = nc->rank;
    size_t per = EP_CHECK_TOTAL / (size_t)(n > 1 ? n - 1 : 1);
    per = (per < EP_CHECK_BYTES ? per : EP_CHECK_BYTES) / sizeof(uint32_t) * sizeof(uint32_t);
    const size_t words = per / sizeof(uint32_t), total = per * (size_t)n;
    const backend_ops_t *op = be->ops;
    uint32_t *h = malloc(total);
    void *ds = op->alloc(be, total), *dr = op->alloc(be, total);
    int rc = -1;
    if (!h || !ds || !dr) {
        errf(why, whylen, "no memory for the check trade (%zu bytes)", total);
        goto done;
    }
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < words; i++)
            h[(size_t)p * words + i] = s_pattern(me, p, i);
    const void *s[EP_MAX_RANKS];
    void *r[EP_MAX_RANKS];
    size_t cnt[EP_MAX_RANKS];
    for (int p = 0; p < n; p++) {
        s[p] = (uint8_t *)ds + (size_t)p * per;
        r[p] = (uint8_t *)dr + (size_t)p * per;
        cnt[p] = p == me ? 0 : per;   /* the NCCL exchange never copies to its own rank */
    }
    char e[300];
    if (op->upload(be, ds, h, total) < 0) {
        errf(why, whylen, "cannot upload the check bytes");
        goto done;
    }
    if (nc->ops->exchange(nc, s, cnt, r, cnt, deadline_ms, e, sizeof e) < 0) {
        errf(why, whylen, "the check trade: %s", e);
        goto done;
    }
    if (op->download(be, h, dr, total) < 0) {
        errf(why, whylen, "cannot read the check bytes back");
        goto done;
    }
    for (int p = 0; p < n; p++)
        for (size_t i = 0; p != me && i < words; i++)
            if (h[(size_t)p * words + i] != s_pattern(p, me, i)) {
                errf(why, whylen, "the check bytes from rank %d differ at byte %zu of %zu", p, i * sizeof(uint32_t),
                     per);
                goto done;
            }
    rc = 0;
done:
    if (ds)
        op->free(be, ds);
    if (dr)
        op->free(be, dr);
    free(h);
    return rc;
}

ep_comm_t *ep_meet(ep_comm_t *ctrl, backend_t *be, const ep_meet_opts_t *o, char *why, size_t whylen, char *err,
                   size_t errlen)
{
    const int n = ctrl->n_ranks, me = ctrl->rank;
    const char *g = o->group ? o->group : "?";
    char e[400];
    ep_want_t want;
    if (ep_want_parse(o->want, &want, e, sizeof e) < 0) {
        errf(err, errlen, "expert-parallel group %s, rank %d: %s", g, me, e);
        goto fail;
    }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const ep_rank_info_t mine = {.magic = EP_INFO_MAGIC, .want = (uint32_t)want,
                                 .nccl = o->device >= 0 && be && be->ops->nccl != NULL, .device = o->device,
                                 .host = s_hash(host), .visible = o->visible ? s_hash(o->visible) : 0};
    ep_rank_info_t all[EP_MAX_RANKS];
    if (s_trade(ctrl, &mine, sizeof mine, all, o->meet_ms, e, sizeof e) < 0) {
        errf(err, errlen, "expert-parallel group %s: choosing the transport: %s", g, e);
        goto fail;
    }
    const int pick = ep_xport_choose(all, n, why, whylen);
    if (pick < 0) {
        errf(err, errlen, "expert-parallel group %s: %s", g, why);
        goto fail;
    }
    if (pick == 0)
        return ctrl;

    /* NCCL: the id from rank 0 to every rank, over the sockets. */
    ep_idmsg_t id = {.magic = EP_ID_MAGIC};
    if (me == 0)
        id.ok = be->ops->nccl->unique_id(id.id, id.why, sizeof id.why) == 0;
    {
        const void *s[EP_MAX_RANKS];
        void *r[EP_MAX_RANKS];
        size_t sn[EP_MAX_RANKS], rn[EP_MAX_RANKS];
        for (int i = 0; i < n; i++) {
            s[i] = &id;
            r[i] = &id;
            sn[i] = me == 0 && i != 0 ? sizeof id : 0;
            rn[i] = me != 0 && i == 0 ? sizeof id : 0;
        }
        if (ctrl->ops->exchange(ctrl, s, sn, r, rn, o->meet_ms, e, sizeof e) < 0) {
            errf(err, errlen, "expert-parallel group %s: handing the NCCL id over: %s", g, e);
            goto fail;
        }
        if (id.magic != EP_ID_MAGIC) {
            errf(err, errlen, "expert-parallel group %s, rank %d: rank 0 sent no NCCL id (another build?)", g, me);
            goto fail;
        }
    }
    ep_verdict_t v = {.magic = EP_VERDICT_MAGIC, .ok = 0};
    ep_comm_t *nc = NULL;
    id.why[sizeof id.why - 1] = 0;
    if (!id.ok)
        errf(v.why, sizeof v.why, "rank 0 could not make the NCCL id: %s", id.why);
    else if (!(nc = ep_nccl_new(be, id.id, me, n, o->init_ms, e, sizeof e)))
        errf(v.why, sizeof v.why, "%s", e);
    else if (s_check(nc, be, o->init_ms, e, sizeof e) < 0)
        errf(v.why, sizeof v.why, "%s", e);
    else
        v.ok = 1;
    /* Every rank's verdict. A peer may spend init_ms bringing its communicator up and as long
     * again on the check trade before it answers. */
    ep_verdict_t vs[EP_MAX_RANKS];
    if (s_trade(ctrl, &v, sizeof v, vs, o->meet_ms + 2 * o->init_ms, e, sizeof e) < 0) {
        if (nc)
            nc->ops->destroy(nc);
        errf(err, errlen, "expert-parallel group %s: after the NCCL set-up: %s", g, e);
        goto fail;
    }
    /* Every failing rank's reason: one rank refused at once and the others' inits timed out
     * waiting for it, say; the first alone could name a consequence. */
    char bw[700] = "";
    size_t bk = 0;
    int bad = 0;
    for (int r = 0; r < n; r++) {
        if (vs[r].magic == EP_VERDICT_MAGIC && vs[r].ok)
            continue;
        vs[r].why[sizeof vs[r].why - 1] = 0;
        if (bad++ < 3 && bk < sizeof bw)
            bk += (size_t)snprintf(bw + bk, sizeof bw - bk, "%srank %d: %s", bk ? "; " : "", r,
                                   vs[r].magic == EP_VERDICT_MAGIC ? vs[r].why : "no valid verdict (another build?)");
    }
    if (!bad) {
        nc->ctrl = ctrl;   /* the headers stay on the sockets */
        return nc;
    }
    if (nc)
        nc->ops->destroy(nc);
    int req = -1;
    for (int r = 0; r < n && req < 0; r++)
        if (all[r].want == EP_WANT_NCCL)
            req = r;
    if (req >= 0) {
        errf(err, errlen, "expert-parallel group %s: NCCL required (TROUPE_EP_TRANSPORT=%s on rank %d) but its set-up "
             "failed: %s", g, s_want_name(all[req].want), req, bw);
        goto fail;
    }
    LOG_W("expert-parallel group %s, rank %d of %d: the NCCL set-up failed, the group keeps the unix sockets: %s", g, me, n,
          bw);
    errf(why, whylen, "sockets: the NCCL set-up failed (%s)", bw);
    return ctrl;
fail:
    ctrl->ops->destroy(ctrl);
    return NULL;
}
