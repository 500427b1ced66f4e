/* engine/ep.c — expert parallelism: rounds of dispatch / compute / combine over an ep_comm_t, and
 * placements switched at step boundaries (engine/ep.h says the protocol). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/ep.h"
#include "engine/model_internal.h"

#define EP_MAGIC 0x45505431u      /* "EPT1" */

enum { EP_CMD_STEP = 1, EP_CMD_MOE = 2 };
enum { EP_F_DONE = 1u, EP_F_STOP = 2u };   /* STEP flags: draining with nothing left; rank 0 stops followers */

/* The fixed header every rank sends every rank at the start of a step and of each MoE round. */
typedef struct ep_hdr {
    uint32_t magic, cmd, layer, n_entries;   /* MOE: n_entries (token, expert) entries sent to that rank */
    uint64_t step;                           /* the group's step number: every rank counts the same */
    uint64_t epoch;                          /* STEP from rank 0: the placement the step computes with */
    uint64_t ready_epoch;                    /* the placement the sender has loaded (0: none pending) */
    uint64_t place_epoch;                    /* STEP from rank 0 with a table: the table's epoch */
    uint32_t rows, flags;                    /* STEP: the sender's rows in the step; EP_F_* */
    uint32_t extra_bytes, pad;               /* STEP from rank 0: a placement table follows, this long */
} ep_hdr_t;

/* A dispatched entry on the wire: the rank's slot index, the routing weight, the hidden state. */
#define EP_ROW_FLOATS(H) ((size_t)(H) + 2)

/* One MoE layer of a placement. */
typedef struct {
    int32_t *slot_expert;         /* [n_slots] */
    int32_t *rep_start;           /* [E + 1]: expert e's replicas are rep_slot[rep_start[e] .. rep_start[e+1]) */
    int32_t *rep_slot;            /* [n_slots] */
    bk_expert_t *local;           /* [spr] this rank's slots' weights */
    uint8_t *owned;               /* [spr] 1: loaded for this placement (else shared with the one before) */
} ep_lplan_t;

typedef struct {
    uint64_t epoch;
    int n_slots, spr;             /* 0 slots: no placement */
    ep_lplan_t *l;                /* [num_layers]; dense layers stay zero */
} ep_plan_t;

struct ep {
    model_t *m;
    ckpt_t *ck;
    ep_comm_t *comm;
    int rank, n, L, E, H, k, I, first_moe;
    ep_plan_t cur, next;          /* next.n_slots > 0: a placement sent, loading */
    int next_layer;               /* next: layers below this are loaded */
    uint64_t ready[EP_MAX_RANKS]; /* leader: each rank's ready_epoch, from its last header */
    int32_t *prop;                /* leader: a proposal not yet sent [L][prop_slots] */
    int prop_slots;
    uint64_t prop_epoch;
    int failed, rounds_done, fail_told;
    uint64_t step_no;             /* the step in progress, or the last one (numbered from 1) */
    uint32_t step_rows[EP_MAX_RANKS]; /* each rank's rows in that step (its step header): the batch its
                                     entries come from, which their numerics follow (s_compute) */
    int all_done;                 /* a step had every rank done: the group has finished */
    int done_sent;                /* this rank's last step header said done */
    int stopped;                  /* a follower: rank 0 said stop */
    void (*on_fail)(void *ctx, const char *error);
    void *fail_ctx;
    char err[512];
    ep_status_t st;
    /* host buffers, grown on demand */
    uint8_t *sbuf, *rbuf;         /* dispatch, all ranks' parts one after another */
    size_t sbuf_cap, rbuf_cap;
    float *res_s, *res_r;         /* combine: results to send back, results received */
    size_t res_s_cap, res_r_cap;
    int32_t *ent;                 /* [T*k] leader: where entry (t, j) sits in res_r */
    size_t ent_cap;
    int32_t *h_ids;
    float *h_w, *h_x, *h_out;
    size_t h_cap;                 /* tokens the h_ buffers hold */
    int *ctr;                     /* [E] replica turns within a layer */
    uint64_t *rank_entries;       /* [L][n] entries dispatched per (layer, rank) since the reset */
    /* device buffers of the compute, grown on demand */
    float *d_x, *d_w, *d_out;
    int32_t *d_ids;
    void *d_scratch;
    size_t d_cap;
    /* device staging when the comm moves device memory */
    void *d_sstage, *d_rstage;
    size_t d_sstage_cap, d_rstage_cap;
    /* dev_pack (s_dev_round): the dispatch packed, exchanged, computed and combined in device memory */
    int dev_pack;                 /* 1: a device comm (NCCL) and TROUPE_EP_DEVICE_PACK is not 0 */
    int32_t *h_rows, *h_pslot;    /* [T*k] packed order: each entry's token, its slot on its rank */
    float *h_pw;                  /* [T*k] packed order: its routing weight */
    int32_t *h_crow;              /* [1 + k][T] combine: the zero row, then the packed entry of token t's
                                     j-th expert in id order */
    int32_t *h_chk;               /* [entries received] slots read back for checking */
    float *h_zero;                /* [H] zeros: the combine's starting row */
    size_t h_pack_cap, h_crow_cap, h_chk_cap, h_zero_cap;
    float *d_pack, *d_recv;       /* per rank a block (s_blk): x [n][H], w [n], slot [n] (int32) */
    float *d_resin, *d_tmp;       /* [my entries][H] results back, in packed order; [T][H] */
    int32_t *d_rows, *d_crow;     /* [T*k]; [1 + k][T] (row 0: the zero row's index) */
    size_t d_pack_cap, d_recv_cap, d_resin_cap, d_tmp_cap, d_rows_cap, d_crow_cap;   /* bytes */
};

/* ---- placements ---------------------------------------------------------------------------- */

int ep_identity(int n_experts, int n_ranks, int32_t *slot_expert, char *err, size_t errlen)
{
    if (n_ranks < 1 || n_experts < n_ranks || n_experts % n_ranks != 0)
        return errf(err, errlen, "expert parallelism: %d experts do not divide evenly over %d ranks", n_experts, n_ranks);
    for (int e = 0; e < n_experts; e++)
        slot_expert[e] = e;
    return 0;
}

int ep_keep_initial(void *ctx, int layer, int expert)
{
    (void)layer;
    const ep_keep_t *k = ctx;
    const int per = k->n_experts / k->n_ranks;
    return per > 0 && expert / per == k->rank;
}

static void s_lplan_free(ep_lplan_t *p)
{
    free(p->slot_expert);
    free(p->rep_start);
    free(p->rep_slot);
    free(p->local);
    free(p->owned);
    memset(p, 0, sizeof *p);
}

static void s_plan_free(ep_t *ep, ep_plan_t *p)
{
    for (int l = 0; p->l && l < ep->L; l++)
        s_lplan_free(&p->l[l]);
    free(p->l);
    memset(p, 0, sizeof *p);
}

/* Checks one layer's table: every expert has a replica, no rank holds an expert twice. */
static int s_check_table(const ep_t *ep, int l, const int32_t *se, int n_slots, char *err, size_t errlen)
{
    const int spr = n_slots / ep->n;
    int *has = calloc((size_t)ep->E, sizeof(int));
    if (!has)
        return errf(err, errlen, "expert placement: out of memory");
    int rc = 0;
    for (int s = 0; s < n_slots && rc == 0; s++) {
        if (se[s] < 0 || se[s] >= ep->E)
            rc = errf(err, errlen, "expert placement: layer %d slot %d holds expert %d, outside [0, %d)", l, s, se[s], ep->E);
        else if (has[se[s]] && (has[se[s]] - 1) / spr == s / spr)
            rc = errf(err, errlen, "expert placement: layer %d: rank %d holds expert %d twice", l, s / spr, se[s]);
        else if (!has[se[s]] || (has[se[s]] - 1) / spr != s / spr)
            has[se[s]] = s + 1;
    }
    for (int e = 0; e < ep->E && rc == 0; e++)
        if (!has[e])
            rc = errf(err, errlen, "expert placement: layer %d leaves expert %d without a replica", l, e);
    free(has);
    return rc;
}

/* Builds layer l of p from its table (the local weights are left for the caller). */
static int s_lplan_make(ep_t *ep, ep_plan_t *p, int l, const int32_t *se)
{
    ep_lplan_t *q = &p->l[l];
    const int ns = p->n_slots;
    q->slot_expert = malloc((size_t)ns * sizeof(int32_t));
    q->rep_start = calloc((size_t)ep->E + 1, sizeof(int32_t));
    q->rep_slot = malloc((size_t)ns * sizeof(int32_t));
    q->local = calloc((size_t)p->spr, sizeof(bk_expert_t));
    q->owned = calloc((size_t)p->spr, 1);
    if (!q->slot_expert || !q->rep_start || !q->rep_slot || !q->local || !q->owned)
        return -1;
    memcpy(q->slot_expert, se, (size_t)ns * sizeof(int32_t));
    for (int s = 0; s < ns; s++)
        q->rep_start[se[s] + 1]++;
    for (int e = 0; e < ep->E; e++)
        q->rep_start[e + 1] += q->rep_start[e];
    int *fill = calloc((size_t)ep->E, sizeof(int));
    if (!fill)
        return -1;
    for (int s = 0; s < ns; s++)   /* ascending slots: a replica's turn order is fixed */
        q->rep_slot[q->rep_start[se[s]] + fill[se[s]]++] = s;
    free(fill);
    return 0;
}

static int s_plan_make(ep_t *ep, ep_plan_t *p, uint64_t epoch, int n_slots, const int32_t *tables, char *err,
                       size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->epoch = epoch;
    p->n_slots = n_slots;
    p->spr = n_slots / ep->n;
    if (!(p->l = calloc((size_t)ep->L, sizeof(ep_lplan_t))))
        return errf(err, errlen, "expert placement: out of memory");
    for (int l = 0; l < ep->L; l++)
        if (ep->m->layers[l].is_moe && s_lplan_make(ep, p, l, tables + (size_t)l * n_slots) < 0) {
            s_plan_free(ep, p);
            return errf(err, errlen, "expert placement: out of memory");
        }
    return 0;
}

/* This rank's weights of layer l for plan p: the ones cur already holds are shared, the others
 * loaded from the checkpoint. */
static int s_load_layer(ep_t *ep, ep_plan_t *p, int l, char *err, size_t errlen)
{
    ep_lplan_t *q = &p->l[l];
    const ep_lplan_t *c = ep->cur.l ? &ep->cur.l[l] : NULL;
    for (int i = 0; i < p->spr; i++) {
        const int e = q->slot_expert[ep->rank * p->spr + i];
        int found = -1;
        for (int j = 0; c && c->local && j < ep->cur.spr && found < 0; j++)
            if (c->slot_expert[ep->rank * ep->cur.spr + j] == e)
                found = j;
        if (found >= 0) {
            q->local[i] = c->local[found];
            continue;
        }
        if (model_load_expert(ep->m, ep->ck, l, e, &q->local[i], err, errlen) < 0)
            return -1;
        q->owned[i] = 1;
        ep->st.experts_loaded++;
    }
    return 0;
}

/* Switches to next: releases what cur held that next does not. */
static void s_switch(ep_t *ep)
{
    for (int l = 0; l < ep->L; l++) {
        const ep_lplan_t *c = &ep->cur.l[l], *q = &ep->next.l[l];
        if (!c->local)
            continue;
        for (int j = 0; j < ep->cur.spr; j++) {
            int kept = 0;
            for (int i = 0; i < ep->next.spr && !kept; i++)
                kept = q->local[i].gate.data == c->local[j].gate.data;
            if (!kept && c->local[j].gate.data) {
                model_release_mat(ep->m, &c->local[j].gate);
                model_release_mat(ep->m, &c->local[j].up);
                model_release_mat(ep->m, &c->local[j].down);
            }
        }
    }
    s_plan_free(ep, &ep->cur);
    ep->cur = ep->next;
    memset(&ep->next, 0, sizeof ep->next);
    ep->next_layer = 0;
    ep->st.switches++;
    LOG_I("expert-parallel rank %d/%d: placement epoch %llu in use", ep->rank, ep->n, (unsigned long long)ep->cur.epoch);
}

/* After a round: one more layer of the pending placement. */
static void s_load_step(ep_t *ep)
{
    if (!ep->next.n_slots || ep->next_layer >= ep->L || ep->failed)
        return;
    while (ep->next_layer < ep->L && !ep->m->layers[ep->next_layer].is_moe)
        ep->next_layer++;
    if (ep->next_layer < ep->L) {
        char err[400];
        if (s_load_layer(ep, &ep->next, ep->next_layer, err, sizeof err) < 0) {
            ep->failed = 1;
            snprintf(ep->err, sizeof ep->err, "expert-parallel rank %d: loading placement %llu: %s", ep->rank,
                     (unsigned long long)ep->next.epoch, err);
            return;
        }
        ep->next_layer++;
    }
    while (ep->next_layer < ep->L && !ep->m->layers[ep->next_layer].is_moe)
        ep->next_layer++;
}

static int s_next_ready(const ep_t *ep)
{
    return ep->next.n_slots && ep->next_layer >= ep->L;
}

/* ---- exchange helpers ---------------------------------------------------------------------- */

static int s_fail(ep_t *ep, const char *what, const char *why)
{
    if (!ep->failed) {
        ep->failed = 1;
        snprintf(ep->err, sizeof ep->err, "expert-parallel group, rank %d of %d: %s: %s", ep->rank, ep->n, what, why);
        LOG_E("%s", ep->err);
    }
    return -1;
}

static int s_grow(void **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = need < 2 * *cap ? 2 * *cap : need;
    void *q = realloc(*p, n);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* One exchange of host buffers over c, staged through device memory when c moves device memory. */
static int s_xchg_on(ep_t *ep, ep_comm_t *c, const char *what, void *const *send, const size_t *sn, void *const *recv,
                     const size_t *rn, int deadline_ms)
{
    char why[400];
    if (!c->ops->device) {
        if (c->ops->exchange(c, (const void *const *)send, sn, recv, rn, deadline_ms, why, sizeof why) < 0)
            return s_fail(ep, what, why);
        return 0;
    }
    const backend_ops_t *op = ep->m->be->ops;
    backend_t *be = ep->m->be;
    const int me = ep->rank;
    size_t st = 0, rt = 0, sn2[EP_MAX_RANKS], rn2[EP_MAX_RANKS];
    if (sn[me] != rn[me])
        return s_fail(ep, what, "a rank sends itself other than it expects");
    if (sn[me])
        memcpy(recv[me], send[me], sn[me]);   /* its own part never leaves the host */
    for (int r = 0; r < ep->n; r++) {
        sn2[r] = r == me ? 0 : sn[r];
        rn2[r] = r == me ? 0 : rn[r];
        st += sn2[r];
        rt += rn2[r];
    }
    sn = sn2;
    rn = rn2;
    if (st > ep->d_sstage_cap) {
        if (ep->d_sstage)
            op->free(be, ep->d_sstage);
        ep->d_sstage_cap = 0;
        if (!(ep->d_sstage = op->alloc(be, st)))
            return s_fail(ep, what, "out of device memory for the staging buffer");
        ep->d_sstage_cap = st;
    }
    if (rt > ep->d_rstage_cap) {
        if (ep->d_rstage)
            op->free(be, ep->d_rstage);
        ep->d_rstage_cap = 0;
        if (!(ep->d_rstage = op->alloc(be, rt)))
            return s_fail(ep, what, "out of device memory for the staging buffer");
        ep->d_rstage_cap = rt;
    }
    void *ds[EP_MAX_RANKS], *dr[EP_MAX_RANKS];
    size_t so = 0, ro = 0;
    for (int r = 0; r < ep->n; r++) {
        ds[r] = (uint8_t *)ep->d_sstage + so;
        dr[r] = (uint8_t *)ep->d_rstage + ro;
        if (sn[r] && op->upload(be, ds[r], send[r], sn[r]) < 0)
            return s_fail(ep, what, "cannot stage the send buffer");
        so += sn[r];
        ro += rn[r];
    }
    if (c->ops->exchange(c, (const void *const *)ds, sn, dr, rn, deadline_ms, why, sizeof why) < 0)
        return s_fail(ep, what, why);
    for (int r = 0; r < ep->n; r++)
        if (rn[r] && op->download(be, recv[r], dr[r], rn[r]) < 0)
            return s_fail(ep, what, "cannot read the received buffer");
    return 0;
}

/* The dispatch and the combine: over the group's comm. */
static int s_xchg(ep_t *ep, const char *what, void *const *send, const size_t *sn, void *const *recv, const size_t *rn,
                  int deadline_ms)
{
    return s_xchg_on(ep, ep->comm, what, send, sn, recv, rn, deadline_ms);
}

/* Headers and placement tables: over the comm's ctrl when it has one (the sockets beside NCCL:
 * small host structs, and a rank waiting for a peer's step waits in poll, not in NCCL). */
static int s_xchg_ctrl(ep_t *ep, const char *what, void *const *send, const size_t *sn, void *const *recv,
                       const size_t *rn, int deadline_ms)
{
    return s_xchg_on(ep, ep->comm->ctrl ? ep->comm->ctrl : ep->comm, what, send, sn, recv, rn, deadline_ms);
}

/* Headers: mine[r] to rank r, theirs[r] from rank r, all of command cmd (of layer `layer` for an
 * MoE round) in this rank's step: a peer in another step or another round is a broken group. */
static int s_headers(ep_t *ep, ep_hdr_t *mine, ep_hdr_t *theirs, int cmd, int layer, int deadline_ms)
{
    void *s[EP_MAX_RANKS], *r[EP_MAX_RANKS];
    size_t n[EP_MAX_RANKS];
    for (int i = 0; i < ep->n; i++) {
        s[i] = &mine[i];
        r[i] = &theirs[i];
        n[i] = sizeof(ep_hdr_t);
    }
    if (s_xchg_ctrl(ep, cmd == EP_CMD_STEP ? "step header" : "round header", s, n, r, n, deadline_ms) < 0)
        return -1;
    char why[200];
    for (int i = 0; i < ep->n; i++) {
        const ep_hdr_t *h = &theirs[i];
        if (h->magic != EP_MAGIC)
            snprintf(why, sizeof why, "rank %d sent a header without the group's magic number (another program?)", i);
        else if (h->step != ep->step_no || h->cmd != (uint32_t)cmd)
            snprintf(why, sizeof why, "rank %d is at step %llu %s, this rank at step %llu %s", i,
                     (unsigned long long)h->step, h->cmd == EP_CMD_STEP ? "start" : "MoE round",
                     (unsigned long long)ep->step_no, cmd == EP_CMD_STEP ? "start" : "MoE round");
        else if (cmd == EP_CMD_MOE && h->layer != (uint32_t)layer)
            snprintf(why, sizeof why, "rank %d is at MoE layer %u, this rank at %d", i, h->layer, layer);
        else
            continue;
        return s_fail(ep, "lockstep", why);
    }
    for (int i = 0; i < ep->n; i++)
        ep->ready[i] = theirs[i].ready_epoch;
    ep->st.rounds++;
    ep->rounds_done++;
    return 0;
}

static uint64_t s_my_ready(const ep_t *ep)
{
    return s_next_ready(ep) ? ep->next.epoch : 0;
}

/* Grows the device compute buffers to n entries. */
static int s_dev_grow(ep_t *ep, size_t n)
{
    if (n <= ep->d_cap)
        return 0;
    const backend_ops_t *op = ep->m->be->ops;
    backend_t *be = ep->m->be;
    void *const old[5] = {ep->d_x, ep->d_w, ep->d_out, ep->d_ids, ep->d_scratch};
    for (int i = 0; i < 5; i++)
        if (old[i])
            op->free(be, old[i]);
    ep->d_cap = 0;
    const size_t H = (size_t)ep->H;
    int spr = ep->cur.spr > ep->next.spr ? ep->cur.spr : ep->next.spr;
    spr = spr > ep->E ? spr : ep->E;
    ep->d_x = op->alloc(be, n * H * sizeof(float));
    ep->d_w = op->alloc(be, n * sizeof(float));
    ep->d_out = op->alloc(be, n * H * sizeof(float));
    ep->d_ids = op->alloc(be, n * sizeof(int32_t));
    ep->d_scratch = op->alloc(be, moe_scratch_bytes((int)n, 1, ep->H, ep->I, spr));
    if (!ep->d_x || !ep->d_w || !ep->d_out || !ep->d_ids || !ep->d_scratch)
        return -1;
    ep->d_cap = n;
    return 0;
}

/* The experts of layer l over n received rows (rows: slot, w, x[H] each; n_from[r] of them from rank
 * r, rank by rank): res [n][H] = w * expert(x). Each rank's part is rounded as that rank's own
 * moe_ffn over its step's rows would round it (moe_ffn_as with the rows of its step header): a
 * backend that picks its arithmetic by the call's size (CUDA: f32 activations below 9 tokens of
 * bf16 experts, bf16 from there) would otherwise pick it by the entries of every rank together,
 * and a rank's 4 rows of top-4 over 2 ranks would be 16 entries: bf16 where one process computes
 * in f32. */
static int s_compute(ep_t *ep, int l, const float *rows, size_t n, const size_t *n_from, float *res)
{
    if (n == 0)
        return 0;
    const backend_ops_t *op = ep->m->be->ops;
    backend_t *be = ep->m->be;
    const size_t H = (size_t)ep->H, RF = EP_ROW_FLOATS(H);
    const ep_lplan_t *q = &ep->cur.l[l];
    if (s_dev_grow(ep, n) < 0)
        return s_fail(ep, "experts", "out of memory for the received entries");
    int32_t *ids = malloc(n * sizeof(int32_t));
    float *w = malloc(n * sizeof(float)), *x = malloc(n * H * sizeof(float));
    int rc = 0;
    if (!ids || !w || !x) {
        rc = s_fail(ep, "experts", "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const float *row = rows + i * RF;
        int32_t s;
        memcpy(&s, &row[0], sizeof s);
        if (s < 0 || s >= ep->cur.spr) {
            rc = s_fail(ep, "experts", "an entry for a slot this rank does not have");
            goto done;
        }
        ids[i] = s;
        w[i] = row[1];
        memcpy(x + i * H, row + 2, H * sizeof(float));
    }
    if (op->upload(be, ep->d_ids, ids, n * sizeof(int32_t)) < 0 || op->upload(be, ep->d_w, w, n * sizeof(float)) < 0 ||
        op->upload(be, ep->d_x, x, n * H * sizeof(float)) < 0) {
        rc = s_fail(ep, "experts", "cannot upload the received entries");
        goto done;
    }
    if (op->moe_ffn_as) {
        size_t o = 0;   /* the parts in turn over one scratch: stream order */
        for (int r = 0; r < ep->n; o += n_from[r], r++)
            if (n_from[r])
                op->moe_ffn_as(be, ep->d_x + o * H, (int)n_from[r], ep->H, ep->d_ids + o, ep->d_w + o, 1, q->local,
                               ep->cur.spr, ep->d_scratch, ep->d_out + o * H, (int)ep->step_rows[r]);
    } else {
        op->moe_ffn(be, ep->d_x, (int)n, ep->H, ep->d_ids, ep->d_w, 1, q->local, ep->cur.spr, ep->d_scratch, ep->d_out);
    }
    if (op->download(be, res, ep->d_out, n * H * sizeof(float)) < 0)
        rc = s_fail(ep, "experts", "cannot read the experts' results");
done:
    free(ids);
    free(w);
    free(x);
    return rc;
}

/* The MoE part of a round, after the headers: dispatch, compute, combine. send rows of rank r at
 * sbuf + soff[r]; results for my entries land in res_r (rank by rank, in sending order). */
static int s_moe_round(ep_t *ep, int l, const ep_hdr_t *mine, const ep_hdr_t *theirs)
{
    const size_t H = (size_t)ep->H, RB = EP_ROW_FLOATS(H) * sizeof(float);
    void *s[EP_MAX_RANKS], *r[EP_MAX_RANKS];
    size_t sn[EP_MAX_RANKS], rn[EP_MAX_RANKS], n_in = 0, n_out = 0;
    for (int i = 0; i < ep->n; i++) {
        n_in += theirs[i].n_entries;
        n_out += mine[i].n_entries;
    }
    if (s_grow((void **)&ep->rbuf, &ep->rbuf_cap, n_in * RB) < 0 ||
        s_grow((void **)&ep->res_s, &ep->res_s_cap, n_in * H * sizeof(float)) < 0 ||
        s_grow((void **)&ep->res_r, &ep->res_r_cap, n_out * H * sizeof(float)) < 0)
        return s_fail(ep, "dispatch", "out of memory");
    size_t so = 0, ro = 0;
    for (int i = 0; i < ep->n; i++) {
        s[i] = ep->sbuf + so;
        sn[i] = mine[i].n_entries * RB;
        r[i] = ep->rbuf + ro;
        rn[i] = theirs[i].n_entries * RB;
        so += sn[i];
        ro += rn[i];
    }
    if (s_xchg(ep, "dispatch", s, sn, r, rn, EP_ROUND_DEADLINE_MS) < 0)
        return -1;
    size_t n_from[EP_MAX_RANKS];
    for (int i = 0; i < ep->n; i++)
        n_from[i] = theirs[i].n_entries;
    if (s_compute(ep, l, (const float *)ep->rbuf, n_in, n_from, ep->res_s) < 0)
        return -1;
    so = ro = 0;
    for (int i = 0; i < ep->n; i++) {
        s[i] = (uint8_t *)ep->res_s + so;   /* back to whoever sent them */
        sn[i] = theirs[i].n_entries * H * sizeof(float);
        r[i] = (uint8_t *)ep->res_r + ro;
        rn[i] = mine[i].n_entries * H * sizeof(float);
        so += sn[i];
        ro += rn[i];
    }
    return s_xchg(ep, "combine", s, sn, r, rn, EP_ROUND_DEADLINE_MS);
}

/* ---- the group ----------------------------------------------------------------------------- */

ep_t *ep_new(model_t *m, ckpt_t *ck, ep_comm_t *comm, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    if (!comm) {
        errf(err, errlen, "expert parallelism: no transport");
        return NULL;
    }
    if (comm->n_ranks < 1 || comm->n_ranks > EP_MAX_RANKS || comm->rank < 0 || comm->rank >= comm->n_ranks) {
        errf(err, errlen, "expert parallelism: rank %d of %d (1..%d ranks)", comm->rank, comm->n_ranks, EP_MAX_RANKS);
        comm->ops->destroy(comm);
        return NULL;
    }
    ep_t *ep = calloc(1, sizeof *ep);
    int32_t *tab = NULL;
    if (!ep) {
        errf(err, errlen, "expert parallelism: out of memory");
        comm->ops->destroy(comm);
        return NULL;
    }
    ep->m = m;
    ep->ck = ck;
    ep->comm = comm;
    ep->rank = comm->rank;
    ep->n = comm->n_ranks;
    ep->L = c->num_layers;
    ep->E = c->num_experts;
    ep->H = c->hidden_size;
    ep->k = c->num_experts_per_tok;
    ep->I = c->moe_intermediate_size;
    ep->first_moe = -1;
    for (int l = 0; l < ep->L && ep->first_moe < 0; l++)
        if (m->layers[l].is_moe)
            ep->first_moe = l;
    if (ep->E < 1 || ep->first_moe < 0) {
        errf(err, errlen, "expert parallelism: %s has no MoE layers", m->where);
        goto fail;
    }
    if (!(tab = malloc((size_t)ep->L * (size_t)ep->E * sizeof(int32_t))) || !(ep->ctr = calloc((size_t)ep->E, sizeof(int))) ||
        !(ep->rank_entries = calloc((size_t)ep->L * (size_t)ep->n, sizeof(uint64_t))))
        goto oom;
    for (int l = 0; l < ep->L; l++)
        if (ep_identity(ep->E, ep->n, tab + (size_t)l * ep->E, err, errlen) < 0)
            goto fail;
    if (s_plan_make(ep, &ep->cur, 0, ep->E, tab, err, errlen) < 0)
        goto fail;
    /* The in-order placement's weights are what the model loaded (ep_keep_initial). */
    for (int l = 0; l < ep->L; l++) {
        if (!m->layers[l].is_moe)
            continue;
        for (int i = 0; i < ep->cur.spr; i++) {
            const int e = ep->rank * ep->cur.spr + i;
            ep->cur.l[l].local[i] = m->layers[l].experts[e];
            if (!m->layers[l].experts[e].gate.data) {
                errf(err, errlen, "expert parallelism: rank %d lacks expert %d of layer %d (load it with "
                     "ep_keep_initial)", ep->rank, e, l);
                goto fail;
            }
        }
    }
    free(tab);
    ep->st.rank = ep->rank;
    ep->st.n_ranks = ep->n;
    /* A device comm moves device memory: keep the dispatch there unless told not to (the host
     * staging path, TROUPE_EP_DEVICE_PACK=0, is the sockets' arithmetic over the device comm). */
    const char *dp = getenv("TROUPE_EP_DEVICE_PACK");
    const backend_ops_t *bo = m->be->ops;
    ep->dev_pack = comm->ops->device && bo->gather_rows && bo->add && bo->copy && !(dp && strcmp(dp, "0") == 0);
    m->ep = ep;
    return ep;
oom:
    errf(err, errlen, "expert parallelism: out of memory");
fail:
    free(tab);
    ep_destroy(&ep);
    return NULL;
}

static void s_free(ep_t *ep)
{
    const backend_ops_t *op = ep->m->be->ops;
    backend_t *be = ep->m->be;
    void *const dev[13] = {ep->d_x,     ep->d_w,      ep->d_out,  ep->d_ids,   ep->d_scratch, ep->d_sstage, ep->d_rstage,
                           ep->d_pack,  ep->d_recv,   ep->d_resin, ep->d_tmp,  ep->d_rows,    ep->d_crow};
    for (int i = 0; i < 13; i++)
        if (dev[i])
            op->free(be, dev[i]);
    free(ep->h_rows);
    free(ep->h_pslot);
    free(ep->h_pw);
    free(ep->h_crow);
    free(ep->h_chk);
    free(ep->h_zero);
    s_plan_free(ep, &ep->cur);
    s_plan_free(ep, &ep->next);
    free(ep->prop);
    free(ep->sbuf);
    free(ep->rbuf);
    free(ep->res_s);
    free(ep->res_r);
    free(ep->ent);
    free(ep->h_ids);
    free(ep->h_w);
    free(ep->h_x);
    free(ep->h_out);
    free(ep->ctr);
    free(ep->rank_entries);
    if (ep->comm)
        ep->comm->ops->destroy(ep->comm);
    if (ep->m->ep == ep)
        ep->m->ep = NULL;
    free(ep);
}

void ep_destroy(ep_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    s_free(*self_p);
    *self_p = NULL;
}

int ep_error(const ep_t *ep, char *err, size_t errlen)
{
    if (!ep->failed)
        return 0;
    return errf(err, errlen, "%s", ep->err);
}

void ep_status(const ep_t *ep, ep_status_t *out)
{
    *out = ep->st;
    out->epoch = ep->cur.epoch;
    out->pending_epoch = ep->next.n_slots ? ep->next.epoch : (ep->prop ? ep->prop_epoch : 0);
    int left = 0;
    for (int l = ep->next_layer; ep->next.n_slots && l < ep->L; l++)
        left += ep->m->layers[l].is_moe;
    out->loading_layers = left;
    out->nccl = ep->comm->ops->device;
    out->failed = ep->failed;
}

void ep_rank_entries(const ep_t *ep, int layer, uint64_t *out)
{
    for (int r = 0; r < ep->n; r++)
        out[r] = layer >= 0 && layer < ep->L ? ep->rank_entries[(size_t)layer * ep->n + r] : 0;
}

void ep_rank_entries_reset(ep_t *ep)
{
    memset(ep->rank_entries, 0, (size_t)ep->L * (size_t)ep->n * sizeof(uint64_t));
}

const int32_t *ep_placement(const ep_t *ep, int layer, int *n_slots)
{
    *n_slots = ep->cur.n_slots;
    if (layer < 0 || layer >= ep->L || !ep->m->layers[layer].is_moe)
        return NULL;
    return ep->cur.l[layer].slot_expert;
}

int ep_propose(ep_t *ep, uint64_t epoch, int n_slots, const int32_t *slot_expert, char *err, size_t errlen)
{
    if (ep->rank != 0)
        return errf(err, errlen, "expert placement: only the group's leader takes placements");
    if (n_slots < ep->E || n_slots % ep->n != 0)
        return errf(err, errlen, "expert placement: %d slots for %d experts do not divide over %d ranks", n_slots,
                    ep->E, ep->n);
    if (epoch <= ep->cur.epoch || (ep->next.n_slots && epoch <= ep->next.epoch))
        return errf(err, errlen, "expert placement: epoch %llu is not newer than the group's",
                    (unsigned long long)epoch);
    for (int l = 0; l < ep->L; l++)
        if (ep->m->layers[l].is_moe && s_check_table(ep, l, slot_expert + (size_t)l * n_slots, n_slots, err, errlen) < 0)
            return -1;
    int32_t *p = malloc((size_t)ep->L * (size_t)n_slots * sizeof(int32_t));
    if (!p)
        return errf(err, errlen, "expert placement: out of memory");
    memcpy(p, slot_expert, (size_t)ep->L * (size_t)n_slots * sizeof(int32_t));
    free(ep->prop);
    ep->prop = p;
    ep->prop_slots = n_slots;
    ep->prop_epoch = epoch;
    return 0;
}

/* A PLACE round: the leader sends the table (extra bytes: u32 n_slots then [L][n_slots] i32). */
static int s_place_round(ep_t *ep, const ep_hdr_t *theirs, const void *table, size_t bytes)
{
    void *s[EP_MAX_RANKS], *r[EP_MAX_RANKS];
    size_t sn[EP_MAX_RANKS], rn[EP_MAX_RANKS];
    uint8_t *in = malloc(theirs[0].extra_bytes ? theirs[0].extra_bytes : 1);
    if (!in)
        return s_fail(ep, "placement", "out of memory");
    for (int i = 0; i < ep->n; i++) {
        s[i] = (void *)table;
        sn[i] = ep->rank == 0 && i != 0 ? bytes : 0;
        r[i] = in;
        rn[i] = i == 0 && ep->rank != 0 ? theirs[0].extra_bytes : 0;
    }
    int rc = s_xchg_ctrl(ep, "placement", s, sn, r, rn, EP_ROUND_DEADLINE_MS);
    const uint8_t *t = ep->rank == 0 ? table : in;
    const size_t tb = ep->rank == 0 ? bytes : theirs[0].extra_bytes;
    uint32_t ns = 0;
    if (rc == 0) {
        memcpy(&ns, t, sizeof ns);
        char why[400];
        if (tb != sizeof ns + (size_t)ep->L * ns * sizeof(int32_t) || ns < (uint32_t)ep->E || ns % (uint32_t)ep->n)
            rc = s_fail(ep, "placement", "a placement table of the wrong size");
        for (int l = 0; rc == 0 && l < ep->L; l++)
            if (ep->m->layers[l].is_moe &&
                s_check_table(ep, l, (const int32_t *)(t + sizeof ns) + (size_t)l * ns, (int)ns, why, sizeof why) < 0)
                rc = s_fail(ep, "placement", why);
        if (rc == 0) {
            s_plan_free(ep, &ep->next);
            int32_t *tab = malloc((size_t)ep->L * ns * sizeof(int32_t));
            if (!tab) {
                rc = s_fail(ep, "placement", "out of memory");
            } else {
                memcpy(tab, t + sizeof ns, (size_t)ep->L * ns * sizeof(int32_t));
                if (s_plan_make(ep, &ep->next, theirs[0].place_epoch, (int)ns, tab, why, sizeof why) < 0)
                    rc = s_fail(ep, "placement", why);
                free(tab);
            }
            ep->next_layer = 0;
        }
    }
    free(in);
    return rc;
}

/* The step header (ep.h, step 1): rows are this rank's rows in the step, flags its EP_F_*. Rank
 * 0 first switches to a placement every rank has loaded, and sends a proposal not yet sent; every
 * other rank switches when rank 0's header names the placement it has loaded. Returns the rows of
 * every rank together (0: an empty step, no MoE rounds follow), or -1 when the group failed. */
static long s_step_begin(ep_t *ep, int rows, uint32_t flags, int deadline_ms)
{
    if (ep->all_done || ep->stopped)
        return s_fail(ep, "step", "a step after the group finished");
    uint8_t *table = NULL;
    size_t bytes = 0;
    if (ep->rank == 0) {
        int all_ready = s_next_ready(ep) && !ep->prop;
        for (int i = 1; all_ready && i < ep->n; i++)
            all_ready = ep->ready[i] == ep->next.epoch;
        if (all_ready)
            s_switch(ep);
        if (ep->prop) {
            bytes = sizeof(uint32_t) + (size_t)ep->L * (size_t)ep->prop_slots * sizeof(int32_t);
            if (!(table = malloc(bytes)))
                return s_fail(ep, "placement", "out of memory");
            const uint32_t ns = (uint32_t)ep->prop_slots;
            memcpy(table, &ns, sizeof ns);
            memcpy(table + sizeof ns, ep->prop, bytes - sizeof ns);
        }
    }
    ep_hdr_t mine[EP_MAX_RANKS], theirs[EP_MAX_RANKS];
    ep->step_no++;
    for (int i = 0; i < ep->n; i++)
        mine[i] = (ep_hdr_t){.magic = EP_MAGIC, .cmd = EP_CMD_STEP, .step = ep->step_no, .epoch = ep->cur.epoch,
                             .ready_epoch = s_my_ready(ep), .rows = (uint32_t)rows, .flags = flags,
                             .place_epoch = table ? ep->prop_epoch : 0,
                             .extra_bytes = ep->rank == 0 && i ? (uint32_t)bytes : 0};
    if (s_headers(ep, mine, theirs, EP_CMD_STEP, 0, deadline_ms) < 0) {
        free(table);
        return -1;
    }
    ep->done_sent = (flags & EP_F_DONE) != 0;
    for (int i = 0; i < ep->n; i++)
        ep->step_rows[i] = theirs[i].rows;
    const ep_hdr_t *h0 = &theirs[0];
    if (ep->rank != 0 && h0->epoch != ep->cur.epoch) {
        if (!s_next_ready(ep) || h0->epoch != ep->next.epoch)
            return s_fail(ep, "step", "rank 0 computes with a placement this rank has not loaded");
        s_switch(ep);
    }
    if (ep->rank == 0 && table) {
        ep_hdr_t self = mine[0];
        self.extra_bytes = (uint32_t)bytes;
        const int rc = s_place_round(ep, &self, table, bytes);
        free(table);
        free(ep->prop);
        ep->prop = NULL;
        if (rc < 0)
            return -1;
    } else if (ep->rank != 0 && h0->extra_bytes) {
        if (s_place_round(ep, theirs, NULL, 0) < 0)
            return -1;
    }
    long total = 0;
    int done = 1;
    for (int i = 0; i < ep->n; i++) {
        total += theirs[i].rows;
        done &= (theirs[i].flags & EP_F_DONE) != 0;
    }
    if (h0->flags & EP_F_STOP)
        ep->stopped = 1;
    else if (done && total == 0)
        ep->all_done = 1;
    s_load_step(ep);
    return total;
}

void ep_on_fail(ep_t *ep, void (*cb)(void *ctx, const char *error), void *ctx)
{
    ep->on_fail = cb;
    ep->fail_ctx = ctx;
}

/* Token t's k entries in ascending expert id (order[j] is the j-th), the order moe_ffn adds them
 * in; returns how many (k, at most 64). */
static int s_expert_order(const ep_t *ep, int t, int *order)
{
    const int k = ep->k, kk = k < 64 ? k : 64;
    for (int j = 0; j < kk; j++)
        order[j] = j;
    for (int a = 1; a < kk; a++)   /* insertion sort by expert id */
        for (int b = a; b > 0 && ep->h_ids[(size_t)t * k + order[b]] < ep->h_ids[(size_t)t * k + order[b - 1]]; b--) {
            int x = order[b];
            order[b] = order[b - 1];
            order[b - 1] = x;
        }
    return kk;
}

/* dev_pack's host arrays for n entries. */
static int s_grow_pack(ep_t *ep, size_t n)
{
    if (n <= ep->h_pack_cap)
        return 0;
    int32_t *r = realloc(ep->h_rows, n * sizeof(int32_t)), *sl;
    if (r)
        ep->h_rows = r;
    sl = realloc(ep->h_pslot, n * sizeof(int32_t));
    if (sl)
        ep->h_pslot = sl;
    float *w = realloc(ep->h_pw, n * sizeof(float));
    if (w)
        ep->h_pw = w;
    if (!r || !sl || !w)
        return -1;
    ep->h_pack_cap = n;
    return 0;
}

/* A device buffer of at least `bytes` (its contents are not kept). */
static int s_dgrow(ep_t *ep, void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return 0;
    const backend_ops_t *op = ep->m->be->ops;
    if (*p)
        op->free(ep->m->be, *p);
    *cap = 0;
    if (!(*p = op->alloc(ep->m->be, bytes)))
        return -1;
    *cap = bytes;
    return 0;
}

/* dev_pack's block of n entries: x [n][H], then w [n], then slot [n] (int32), each part at a
 * multiple of EP_DEV_ALIGN floats (256 bytes: the experts' kernels may load x by vectors). Both
 * sides of an exchange compute it from the header's count. */
#define EP_DEV_ALIGN 64
static size_t s_al(size_t n) { return (n + EP_DEV_ALIGN - 1) / EP_DEV_ALIGN * EP_DEV_ALIGN; }
static size_t s_blk(size_t n, size_t H) { return s_al(n * H) + 2 * s_al(n); }

/* One exchange of device buffers over the group's device comm; a rank's own part is a device copy
 * (the NCCL comm never sends to itself). */
static int s_xchg_dev(ep_t *ep, const char *what, void *const *send, const size_t *sn, void *const *recv,
                      const size_t *rn)
{
    const int me = ep->rank;
    size_t sn2[EP_MAX_RANKS], rn2[EP_MAX_RANKS];
    char why[400];
    if (sn[me] != rn[me])
        return s_fail(ep, what, "a rank sends itself other than it expects");
    if (sn[me] && ep->m->be->ops->copy(ep->m->be, recv[me], send[me], sn[me]) < 0)
        return s_fail(ep, what, "cannot copy this rank's own part");
    for (int r = 0; r < ep->n; r++) {
        sn2[r] = r == me ? 0 : sn[r];
        rn2[r] = r == me ? 0 : rn[r];
    }
    if (ep->comm->ops->exchange(ep->comm, (const void *const *)send, sn2, recv, rn2, EP_ROUND_DEADLINE_MS, why,
                                sizeof why) < 0)
        return s_fail(ep, what, why);
    return 0;
}

/* The MoE part of a round on the device (dev_pack), after the headers: this rank's entries are
 * gathered from xn by token into one block per rank (ent, h_rows, h_pslot, h_pw in packed order,
 * cnt[r] of them from first[r]), exchanged, each sender's block run through the experts where it
 * landed (moe_ffn_as with the sender's rows, as s_compute), the results sent back, and delta [T][H]
 * made from zeros by gathering each token's j-th result in expert id order and adding it: the
 * host combine's additions in the host combine's order, so the same bits. Only the routing, the small index
 * arrays and the received slots (checked) cross to the host. */
static int s_dev_round(ep_t *ep, int l, int T, const float *xn, const size_t *cnt, const size_t *first,
                       const ep_hdr_t *theirs, float *delta)
{
    const backend_ops_t *op = ep->m->be->ops;
    backend_t *be = ep->m->be;
    const size_t H = (size_t)ep->H, k = (size_t)ep->k, n_ent = (size_t)T * k;
    const ep_lplan_t *q = &ep->cur.l[l];
    size_t sb[EP_MAX_RANKS], rb[EP_MAX_RANKS], st = 0, rt = 0, n_in = 0, n_from[EP_MAX_RANKS];
    for (int r = 0; r < ep->n; r++) {
        n_from[r] = theirs[r].n_entries;
        sb[r] = st;
        rb[r] = rt;
        st += s_blk(cnt[r], H);
        rt += s_blk(n_from[r], H);
        n_in += n_from[r];
    }
    if (s_dgrow(ep, (void **)&ep->d_pack, &ep->d_pack_cap, (st ? st : 1) * sizeof(float)) < 0 ||
        s_dgrow(ep, (void **)&ep->d_recv, &ep->d_recv_cap, (rt ? rt : 1) * sizeof(float)) < 0 ||
        s_dgrow(ep, (void **)&ep->d_rows, &ep->d_rows_cap, (n_ent ? n_ent : 1) * sizeof(int32_t)) < 0 ||
        s_dgrow(ep, (void **)&ep->d_resin, &ep->d_resin_cap, (n_ent + 1) * H * sizeof(float)) < 0 ||
        s_dev_grow(ep, n_in ? n_in : 1) < 0)
        return s_fail(ep, "dispatch", "out of device memory");
    /* Pack: rank r's block gets its entries' hidden states (gathered by token), weights, slots. */
    if (n_ent && op->upload(be, ep->d_rows, ep->h_rows, n_ent * sizeof(int32_t)) < 0)
        return s_fail(ep, "dispatch", "cannot upload the packing order");
    void *s[EP_MAX_RANKS], *r[EP_MAX_RANKS];
    size_t sn[EP_MAX_RANKS], rn[EP_MAX_RANKS];
    for (int p = 0; p < ep->n; p++) {
        float *blk = ep->d_pack + sb[p];
        const size_t c = cnt[p];
        if (c) {
            op->gather_rows(be, xn, ep->d_rows + first[p], (int)c, ep->H, blk);
            if (op->upload(be, blk + s_al(c * H), ep->h_pw + first[p], c * sizeof(float)) < 0 ||
                op->upload(be, blk + s_al(c * H) + s_al(c), ep->h_pslot + first[p], c * sizeof(int32_t)) < 0)
                return s_fail(ep, "dispatch", "cannot upload the entries' weights and slots");
        }
        s[p] = blk;
        sn[p] = c ? s_blk(c, H) * sizeof(float) : 0;
        r[p] = ep->d_recv + rb[p];
        rn[p] = n_from[p] ? s_blk(n_from[p], H) * sizeof(float) : 0;
    }
    if (s_xchg_dev(ep, "dispatch", s, sn, r, rn) < 0)
        return -1;
    /* The slots a peer sent index this rank's experts: read back and checked before any kernel
     * uses them. */
    if (s_grow((void **)&ep->h_chk, &ep->h_chk_cap, (n_in ? n_in : 1) * sizeof(int32_t)) < 0)
        return s_fail(ep, "experts", "out of memory");
    size_t o = 0;
    for (int p = 0; p < ep->n; o += n_from[p], p++) {
        const size_t c = n_from[p];
        if (c && op->download(be, ep->h_chk + o, ep->d_recv + rb[p] + s_al(c * H) + s_al(c), c * sizeof(int32_t)) < 0)
            return s_fail(ep, "experts", "cannot read the received slots");
    }
    for (size_t i = 0; i < n_in; i++)
        if (ep->h_chk[i] < 0 || ep->h_chk[i] >= ep->cur.spr)
            return s_fail(ep, "experts", "an entry for a slot this rank does not have");
    o = 0;
    for (int p = 0; p < ep->n; o += n_from[p], p++) {
        const size_t c = n_from[p];
        if (!c)
            continue;
        const float *blk = ep->d_recv + rb[p];
        const int32_t *sl = (const int32_t *)(blk + s_al(c * H) + s_al(c));
        if (op->moe_ffn_as)
            op->moe_ffn_as(be, blk, (int)c, ep->H, sl, blk + s_al(c * H), 1, q->local, ep->cur.spr, ep->d_scratch,
                           ep->d_out + o * H, (int)ep->step_rows[p]);
        else
            op->moe_ffn(be, blk, (int)c, ep->H, sl, blk + s_al(c * H), 1, q->local, ep->cur.spr, ep->d_scratch,
                        ep->d_out + o * H);
    }
    /* Combine: the results back to their senders, into d_resin in packed order. */
    o = 0;
    for (int p = 0; p < ep->n; o += n_from[p], p++) {
        s[p] = ep->d_out + o * H;
        sn[p] = n_from[p] * H * sizeof(float);
        r[p] = ep->d_resin + first[p] * H;
        rn[p] = cnt[p] * H * sizeof(float);
    }
    if (s_xchg_dev(ep, "combine", s, sn, r, rn) < 0)
        return -1;
    if (T == 0)
        return 0;
    /* delta = each token's results in ascending expert order, from zero: a row of zeros (row
     * n_ent of d_resin) gathered for every token, then the j-th result of every token gathered
     * and added, so delta[t] = ((0 + res_0) + res_1) + ... exactly as the host loop adds them
     * (0 + -0.0 is +0.0: starting from res_0 itself would differ in a zero's sign). */
    int order[64];
    const int kk = ep->k < 64 ? ep->k : 64;
    const size_t rows = (size_t)(kk + 1) * (size_t)T;
    if (s_grow((void **)&ep->h_crow, &ep->h_crow_cap, rows * sizeof(int32_t)) < 0 ||
        s_grow((void **)&ep->h_zero, &ep->h_zero_cap, H * sizeof(float)) < 0 ||
        s_dgrow(ep, (void **)&ep->d_crow, &ep->d_crow_cap, rows * sizeof(int32_t)) < 0 ||
        s_dgrow(ep, (void **)&ep->d_tmp, &ep->d_tmp_cap, (size_t)T * H * sizeof(float)) < 0)
        return s_fail(ep, "combine", "out of memory");
    memset(ep->h_zero, 0, H * sizeof(float));
    for (int t = 0; t < T; t++) {
        s_expert_order(ep, t, order);
        ep->h_crow[t] = (int32_t)n_ent;
        for (int j = 0; j < kk; j++)
            ep->h_crow[(size_t)(j + 1) * T + t] = ep->ent[(size_t)t * k + order[j]];
    }
    if (op->upload(be, ep->d_resin + n_ent * H, ep->h_zero, H * sizeof(float)) < 0 ||
        op->upload(be, ep->d_crow, ep->h_crow, rows * sizeof(int32_t)) < 0)
        return s_fail(ep, "combine", "cannot upload the combine order");
    op->gather_rows(be, ep->d_resin, ep->d_crow, T, ep->H, delta);
    for (int j = 1; j <= kk; j++) {
        op->gather_rows(be, ep->d_resin, ep->d_crow + (size_t)j * T, T, ep->H, ep->d_tmp);
        op->add(be, delta, ep->d_tmp, T * ep->H);
    }
    return 0;
}

/* One MoE round of this rank's T rows (T may be 0: an entry-less part in a peer's step). xn, ids,
 * w and delta are device memory of the model's backend, NULL when T is 0. */
static void s_layer(ep_t *ep, int layer, int T, const float *xn, const int32_t *ids, const float *w, float *delta)
{
    const backend_ops_t *op = ep->m->be->ops;
    backend_t *be = ep->m->be;
    const int k = ep->k, spr = ep->cur.spr;
    const size_t H = (size_t)ep->H, RF = EP_ROW_FLOATS(H), n_ent = (size_t)T * (size_t)k;
    if ((size_t)T > ep->h_cap) {
        float *hx = realloc(ep->h_x, (size_t)T * H * sizeof(float)), *ho;
        if (hx)
            ep->h_x = hx;
        ho = realloc(ep->h_out, (size_t)T * H * sizeof(float));
        if (ho)
            ep->h_out = ho;
        int32_t *hi = realloc(ep->h_ids, n_ent * sizeof(int32_t));
        if (hi)
            ep->h_ids = hi;
        float *hw = realloc(ep->h_w, n_ent * sizeof(float));
        if (hw)
            ep->h_w = hw;
        if (!hx || !ho || !hi || !hw) {
            s_fail(ep, "dispatch", "out of memory");
            return;
        }
        ep->h_cap = (size_t)T;
    }
    if (s_grow((void **)&ep->sbuf, &ep->sbuf_cap, n_ent * RF * sizeof(float)) < 0 ||
        s_grow((void **)&ep->ent, &ep->ent_cap, n_ent * sizeof(int32_t)) < 0) {
        s_fail(ep, "dispatch", "out of memory");
        return;
    }
    /* The device path reads only the routing; the host path the hidden states too. */
    if (T > 0 && ((!ep->dev_pack && op->download(be, ep->h_x, xn, (size_t)T * H * sizeof(float)) < 0) ||
                  op->download(be, ep->h_ids, ids, n_ent * sizeof(int32_t)) < 0 ||
                  op->download(be, ep->h_w, w, n_ent * sizeof(float)) < 0)) {
        s_fail(ep, "dispatch", "cannot read the routing");
        return;
    }
    if (ep->dev_pack && s_grow_pack(ep, n_ent) < 0) {
        s_fail(ep, "dispatch", "out of memory");
        return;
    }
    /* Each entry's rank: expert e's replicas take turns. Counting pass, then placing pass. */
    const ep_lplan_t *q = &ep->cur.l[layer];
    int32_t *dst = malloc((n_ent ? n_ent : 1) * sizeof(int32_t));
    size_t cnt[EP_MAX_RANKS] = {0}, off[EP_MAX_RANKS], first[EP_MAX_RANKS];
    if (!dst) {
        s_fail(ep, "dispatch", "out of memory");
        return;
    }
    memset(ep->ctr, 0, (size_t)ep->E * sizeof(int));
    for (size_t i = 0; i < n_ent; i++) {
        const int e = ep->h_ids[i];
        if (e < 0 || e >= ep->E) {
            free(dst);
            s_fail(ep, "dispatch", "a routed expert id outside the model's experts");
            return;
        }
        const int nrep = q->rep_start[e + 1] - q->rep_start[e];
        const int slot = q->rep_slot[q->rep_start[e] + ep->ctr[e]++ % nrep];
        dst[i] = slot;
        cnt[slot / spr]++;
    }
    size_t o = 0;
    for (int r = 0; r < ep->n; r++) {
        first[r] = off[r] = o;
        o += cnt[r];
    }
    float *sb = (float *)ep->sbuf;
    for (size_t i = 0; i < n_ent; i++) {
        const int r = dst[i] / spr;
        const size_t at = off[r]++;
        const int32_t local = dst[i] % spr;
        if (ep->dev_pack) {   /* gathered on the device from xn by token */
            ep->h_rows[at] = (int32_t)(i / (size_t)k);
            ep->h_pslot[at] = local;
            ep->h_pw[at] = ep->h_w[i];
        } else {
            float *row = sb + at * RF;
            memcpy(&row[0], &local, sizeof local);
            row[1] = ep->h_w[i];
            memcpy(row + 2, ep->h_x + (i / (size_t)k) * H, H * sizeof(float));
        }
        ep->ent[i] = (int32_t)at;   /* results come back in the same order, rank by rank */
    }
    free(dst);
    ep_hdr_t mine[EP_MAX_RANKS], theirs[EP_MAX_RANKS];
    for (int r = 0; r < ep->n; r++)
        mine[r] = (ep_hdr_t){.magic = EP_MAGIC, .cmd = EP_CMD_MOE, .layer = (uint32_t)layer, .step = ep->step_no,
                             .n_entries = (uint32_t)cnt[r], .epoch = ep->cur.epoch, .ready_epoch = s_my_ready(ep)};
    if (s_headers(ep, mine, theirs, EP_CMD_MOE, layer, EP_ROUND_DEADLINE_MS) < 0)
        return;
    if (ep->dev_pack) {
        if (s_dev_round(ep, layer, T, xn, cnt, first, theirs, delta) < 0)
            return;
    } else {
        if (s_moe_round(ep, layer, mine, theirs) < 0)
            return;
        /* Combine: each token's results in ascending expert order, as moe_ffn adds them. */
        for (int t = 0; t < T; t++) {
            float *out = ep->h_out + (size_t)t * H;
            memset(out, 0, H * sizeof(float));
            int order[64];
            const int kk = s_expert_order(ep, t, order);
            for (int j = 0; j < kk; j++) {
                const float *p = ep->res_r + (size_t)ep->ent[(size_t)t * k + order[j]] * H;
                for (size_t h = 0; h < H; h++)
                    out[h] += p[h];
            }
        }
        if (T > 0 && op->upload(be, delta, ep->h_out, (size_t)T * H * sizeof(float)) < 0)
            s_fail(ep, "combine", "cannot write the layer's output");
    }
    ep->st.entries_sent += n_ent;
    for (int r = 0; r < ep->n; r++)
        ep->rank_entries[(size_t)layer * ep->n + r] += cnt[r];
    s_load_step(ep);
}

void ep_moe_layer(ep_t *ep, int layer, int T, const float *xn, const int32_t *ids, const float *w, float *delta)
{
    if (ep->failed) {   /* the step that met the failure has ended: its requests were answered */
        if (ep->on_fail && !ep->fail_told && layer == ep->first_moe) {
            ep->fail_told = 1;
            ep->on_fail(ep->fail_ctx, ep->err);
        }
        return;
    }
    if (layer == ep->first_moe &&
        s_step_begin(ep, T, 0, ep->rounds_done ? EP_ROUND_DEADLINE_MS : EP_FIRST_DEADLINE_MS) < 0)
        return;
    s_layer(ep, layer, T, xn, ids, w, delta);
}

/* A step with no rows of this rank's: the header within deadline_ms, then every MoE round. */
static int s_join(ep_t *ep, uint32_t flags, int deadline_ms)
{
    if (ep->failed)
        return -1;
    const long total = s_step_begin(ep, 0, flags, deadline_ms);
    for (int l = 0; total > 0 && l < ep->L && !ep->failed; l++)
        if (ep->m->layers[l].is_moe)
            s_layer(ep, l, 0, NULL, NULL, NULL, NULL);
    return ep->failed ? -1 : 0;
}

int ep_join(ep_t *ep, int done)
{
    return s_join(ep, done ? EP_F_DONE : 0, ep->rounds_done ? EP_ROUND_DEADLINE_MS : EP_FIRST_DEADLINE_MS);
}

int ep_follow(ep_t *ep, char *err, size_t errlen)
{
    while (!ep->failed && !ep->stopped)
        if (s_join(ep, 0, -1) < 0)   /* the step header without a deadline: rank 0 may be idle for hours */
            break;
    if (ep->stopped)
        return 0;
    return errf(err, errlen, "%s", ep->err);
}

void ep_stop(ep_t *ep)
{
    if (ep && ep->rank == 0 && !ep->failed && !ep->stopped && !ep->all_done)
        (void)s_step_begin(ep, 0, EP_F_STOP, EP_ROUND_DEADLINE_MS);
}

int ep_poll_fds(const ep_t *ep, int *fds)
{
    return ep->comm->ops->poll_fds ? ep->comm->ops->poll_fds(ep->comm, fds) : 0;
}

int ep_pending(ep_t *ep)
{
    int fds[EP_MAX_RANKS];
    struct pollfd pf[EP_MAX_RANKS];
    const int n = ep_poll_fds(ep, fds);
    for (int i = 0; i < n; i++)
        pf[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    return n > 0 && poll(pf, (nfds_t)n, 0) > 0;
}

int ep_all_done(const ep_t *ep) { return ep->all_done; }

int ep_done_sent(const ep_t *ep) { return ep->done_sent; }
