/* engine/spec_draft.c — the draft-model proposer: a second, smaller checkpoint with the target's
 * tokenizer guesses the next k tokens, greedy or sampled. Semantics: engine/spec.h.
 *
 * Each sequence keeps a kvseq in the draft's own pool. A proposal first brings it in step with
 * the sequence (the tokens it lacks: the whole prompt the first time, then the last accepted draft
 * and the target's own token; at most the last max_catch_up tokens when the ask says so, a window
 * whose positions start at 0, kept and caught up while later asks carry a bound it holds), all
 * sequences in one forward (chunked by max_tokens), and then
 * runs one forward per draft position for every sequence still drafting, each appending its
 * previous draft. The last draft is never computed: the target may reject it, and if it is kept
 * the next catch-up computes it with the target's token.
 *
 * Greedy groups (s_group_dev) take each draft and its probability from the device (the backend's
 * mtp_top op, model_forward_top): no row of logits comes to the host. By default their draft
 * positions are chained: each position's forward reads the previous one's drafts on the device,
 * so the k forwards are queued back to back and their drafts come down in one download, one wait
 * for the device per proposal instead of two per draft position. TROUPE_DRAFT_DEVICE=1: device
 * drafts, one download per position; 0: every draft from a row of logits on the host (before). */
#include "engine/spec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/u64map.h"
#include "common/util.h"
#include "engine/engine_open.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_sample.h"

#define DEFAULT_BLOCK 16

/* How greedy drafts come from the device (TROUPE_DRAFT_DEVICE; the header says why). */
enum { DEV_HOST = 0, DEV_PER_POSITION = 1, DEV_CHAINED = 2 };

typedef struct d_seq {
    uint64_t id;
    kvseq_t *kv;                   /* the draft's KV: tokens whose draft KV is computed */
    int off;                       /* the sequence position of kv's first token (> 0: a window, spec_ask_t.max_catch_up) */
    int base;                      /* n - off of the last proposal: the sequence's length then, in kv's positions */
    float *q;                      /* [q_rows][V]: the last sampled proposal's distributions */
    int q_rows;
    int q_valid;                   /* rows of q that belong to the last proposal (0: greedy) */
} d_seq_t;

typedef struct draft {
    engine_t *e;                   /* the draft model on the target's backend */
    int V, max_seqs, max_tokens, max_model_len;
    u64map_t by_id;                /* id | 1 << 63 -> d_seq_t * (key 0 is the map's empty slot) */
    /* step scratch, [max_seqs] each */
    model_seq_t *rows;
    int32_t *argmax;
    uint8_t *need;
    int *which;                    /* row -> ask */
    /* per ask of the current group, [max_seqs] */
    d_seq_t **seq;
    int *pend, *kk;
    float *work, *mass;            /* [V] sampling scratch */
    int32_t *idx;
    /* Device drafts (s_group_dev): dev_mode DEV_*; per draft position j, top + j x 2 max_seqs
     * holds the ids of the position's rows, then their probabilities (f32); h_top its host copy. */
    int dev_mode;
    int block_size;
    int32_t *top, *h_top;
    int *ord;                      /* [max_seqs] asks by k, largest first */
    spec_draft_stats_t st;
} draft_t;

static uint64_t s_key(uint64_t id) { return id | 1ull << 63; }

static d_seq_t *s_get(const draft_t *d, uint64_t id)
{
    uint64_t *v = u64map_get(&d->by_id, s_key(id));
    d_seq_t *s = v ? (d_seq_t *)(uintptr_t)*v : NULL;
    return s && s->id == id ? s : NULL;
}

static d_seq_t *s_get_or_new(draft_t *d, uint64_t id)
{
    d_seq_t *s = s_get(d, id);
    if (s)
        return s;
    if (u64map_get(&d->by_id, s_key(id)))  /* the key is taken by id ^ 1 << 63: no drafts for this one */
        return NULL;
    if (!(s = calloc(1, sizeof *s)))
        return NULL;
    s->id = id;
    if (!(s->kv = kvseq_new(d->e->pool, d->max_model_len + SPEC_MAX_K, 0)) ||
        u64map_put(&d->by_id, s_key(id), (uint64_t)(uintptr_t)s) != 0) {
        kvseq_destroy(&s->kv);
        free(s);
        return NULL;
    }
    d->st.seqs++;
    return s;
}

static void s_seq_free(draft_t *d, d_seq_t *s)
{
    u64map_del(&d->by_id, s_key(s->id));
    kvseq_destroy(&s->kv);
    free(s->q);
    free(s);
    d->st.seqs--;
}

/* Draft j of ask a from its row of logits (sampled) or the device's argmax (greedy). */
static int32_t s_pick(draft_t *d, spec_ask_t *a, d_seq_t *s, int j, const float *logits, int32_t argmax)
{
    if (!a->sample) {              /* greedy: the draft's confidence, its softmax at the argmax */
        if (a->probs)
            a->probs[j] = expf(cpu_log_softmax_at(logits, d->V, argmax));
        return argmax;
    }
    return spec_draw(logits, d->V, a->sample, j, s->q + (size_t)j * (size_t)d->V, d->work, d->mass, d->idx,
                     a->probs ? &a->probs[j] : NULL);
}

/* The sequence's draft KV and tokens are of no use any more (a failed forward, no blocks). */
static void s_drop_kv(draft_t *d, int i)
{
    kvseq_release(d->seq[i]->kv);
    d->seq[i] = NULL;
}

/* One forward over rows [0, n) of the scratch; the rows' sequences lose their KV on failure. */
static int s_forward(draft_t *d, int n, int any_sampled)
{
    model_batch_t b = {.n_seqs = n, .seqs = d->rows, .argmax_out = d->argmax, .need_logits = any_sampled ? d->need : NULL};
    char err[512];
    d->st.forwards++;
    for (int r = 0; r < n; r++)
        d->st.tokens += (uint64_t)d->rows[r].n_new;
    if (model_forward(d->e->model, &b, d->e->logits, err, sizeof err) == 0)
        return 0;
    LOG_E("draft model %s: %s", d->e->model_dir, err);
    for (int r = 0; r < n; r++)
        s_drop_kv(d, d->which[r]);
    return -1;
}

/* One forward over rows [0, n) of the scratch whose drafts and probabilities stay on the device,
 * in draft position slot's place of d->top; dev_ids: the rows' token ids there (NULL: recorded).
 * The rows' sequences lose their KV on failure. */
static int s_forward_top(draft_t *d, int n, const int32_t *dev_ids, int slot)
{
    model_batch_t b = {.n_seqs = n, .seqs = d->rows};
    int32_t *top = d->top + (size_t)slot * 2 * (size_t)d->max_seqs;
    char err[512];
    d->st.forwards++;
    for (int r = 0; r < n; r++)
        d->st.tokens += (uint64_t)d->rows[r].n_new;
    if (model_forward_top(d->e->model, &b, dev_ids, top, (float *)(top + d->max_seqs), err, sizeof err) == 0)
        return 0;
    LOG_E("draft model %s: %s", d->e->model_dir, err);
    for (int r = 0; r < n; r++)
        s_drop_kv(d, d->which[r]);
    return -1;
}

/* Draft position slots [0, n_slots) of d->top, each's first rows ids and probabilities, to h_top. */
static int s_fetch(draft_t *d, int n_slots, int rows)
{
    backend_t *be = d->e->be;
    const size_t words = (size_t)(n_slots - 1) * 2 * (size_t)d->max_seqs + (size_t)d->max_seqs + (size_t)rows;
    if (be->ops->download(be, d->h_top, d->top, words * sizeof(int32_t)) == 0)
        return 0;
    LOG_E("draft model %s: the drafts' download failed", d->e->model_dir);
    return -1;
}

static int32_t s_top_id(const draft_t *d, int slot, int row) { return d->h_top[(size_t)slot * 2 * (size_t)d->max_seqs + (size_t)row]; }

static float s_top_prob(const draft_t *d, int slot, int row)
{
    float p;
    memcpy(&p, &d->h_top[(size_t)slot * 2 * (size_t)d->max_seqs + (size_t)d->max_seqs + (size_t)row], sizeof p);
    return p;
}

/* Whether ask i goes on to draft position j: what the policy would verify (stop_below). */
static int s_confident(const spec_ask_t *a, int j)
{
    if (a->stop_below <= 0 || !a->probs)
        return 1;
    double conf = 1.0;
    for (int q = 0; q < j; q++)
        conf *= a->probs[q];
    return conf >= a->stop_below;
}

/* Greedy proposals of the group set up by s_group (every ask greedy, the catch-up one forward):
 * each draft and its probability from the device. The catch-up's rows, in order of k (largest
 * first), give draft 0 of each. Chained, the forward of draft position j runs the rows with k > j,
 * a prefix of the catch-up's rows, each with a placeholder token whose id the device copies from
 * position j - 1's drafts, so the positions are queued back to back and come down in one
 * download; the placeholders are then rewritten with the drafts (kvseq_set_tokens), and
 * stop_below cuts a row's drafts where the loop of s_group would have stopped it (the positions
 * past the cut were computed for nothing: a draft forward of a few rows costs its launches, a
 * wait for the device costs as much). Chaining needs every row's placeholders to fit the pool,
 * else (and with DEV_PER_POSITION) each position's drafts come down before the next, whose rows
 * are those still drafting and confident, as in s_group. */
static int s_group_dev(draft_t *d, spec_ask_t *asks, int n, int kmax)
{
    int na = 0, r = 0, rc = 0;
    for (int i = 0; i < n; i++)
        asks[i].n_drafts = 0;
    for (int k = SPEC_MAX_K; k >= 1; k--)
        for (int i = 0; i < n; i++)
            if (d->seq[i] && d->kk[i] == k)
                d->ord[na++] = i;
    for (int q = 0; q < na; q++) {
        const int i = d->ord[q];
        kvseq_t *kv = d->seq[i]->kv;
        if (kvseq_append(kv, asks[i].tokens + (asks[i].n - d->pend[i]), d->pend[i]) != 0) {
            s_drop_kv(d, i);                           /* out of draft blocks */
            continue;
        }
        d->rows[r] = (model_seq_t){.kv = kv, .n_new = d->pend[i]};
        d->which[r++] = i;
    }
    if (r == 0)
        return 0;
    if (s_forward_top(d, r, NULL, 0) != 0)
        return -1;
    int chain = d->dev_mode == DEV_CHAINED;
    long blocks = 0;
    for (int q = 0; chain && q < r; q++) {
        const kvseq_t *kv = d->seq[d->which[q]]->kv;
        blocks += (kvseq_len(kv) + d->kk[d->which[q]] - 1 + d->block_size - 1) / d->block_size - kvseq_n_blocks(kv);
    }
    chain = chain && blocks <= kvpool_free_count(d->e->pool);
    if (!chain) {                                      /* draft 0 of every row to the host now */
        if (s_fetch(d, 1, r) != 0) {
            for (int q = 0; q < r; q++)
                s_drop_kv(d, d->which[q]);
            return -1;
        }
        for (int q = 0; q < r; q++) {
            spec_ask_t *a = &asks[d->which[q]];
            a->drafts[0] = s_top_id(d, 0, q);
            if (a->probs)
                a->probs[0] = s_top_prob(d, 0, q);
            a->n_drafts = 1;
        }
    }
    int rows_at[SPEC_MAX_K];                           /* chained: the rows of each position's forward */
    rows_at[0] = r;
    int j = 1;
    const int32_t zero = 0;
    for (; j < kmax; j++) {
        int rr = 0;
        if (chain) {
            while (rr < rows_at[j - 1] && d->kk[d->which[rr]] > j)
                rr++;
            for (int q = 0; q < rr; q++) {
                if (kvseq_append(d->seq[d->which[q]]->kv, &zero, 1) != 0) {
                    rr = q;                            /* cannot happen (the room was checked): a prefix goes on */
                    break;
                }
                d->rows[q].n_new = 1;                  /* the catch-up's rows, one position now */
            }
            if (rr == 0)
                break;
            const int32_t *prev = d->top + (size_t)(j - 1) * 2 * (size_t)d->max_seqs;
            if (s_forward_top(d, rr, prev, j) != 0) {  /* its rows lose their KV; the others' drafts stand */
                rc = -1;
                break;
            }
            rows_at[j] = rr;
            continue;
        }
        for (int q = 0; q < na; q++) {
            const int i = d->ord[q];
            if (!d->seq[i] || d->kk[i] <= j || asks[i].n_drafts != j || !s_confident(&asks[i], j))
                continue;
            if (kvseq_append(d->seq[i]->kv, &asks[i].drafts[j - 1], 1) != 0)
                continue;                              /* no block for it: the drafts so far stand */
            d->rows[rr] = (model_seq_t){.kv = d->seq[i]->kv, .n_new = 1};
            d->which[rr++] = i;
        }
        if (rr == 0)
            break;
        if (s_forward_top(d, rr, NULL, j) != 0 || s_fetch(d, j + 1, rr) != 0) {
            for (int q = 0; q < rr; q++)
                asks[d->which[q]].n_drafts = 0;
            rc = -1;
            continue;
        }
        for (int q = 0; q < rr; q++) {
            spec_ask_t *a = &asks[d->which[q]];
            a->drafts[j] = s_top_id(d, j, q);
            if (a->probs)
                a->probs[j] = s_top_prob(d, j, q);
            a->n_drafts = j + 1;
        }
    }
    if (!chain)
        return rc;
    /* One download for every position; row q of the catch-up is row q of each position it ran in. */
    if (s_fetch(d, j, rows_at[j - 1]) != 0) {
        for (int q = 0; q < r; q++)
            if (d->seq[d->which[q]])
                s_drop_kv(d, d->which[q]);
        return -1;
    }
    for (int q = 0; q < r; q++) {
        const int i = d->which[q];
        spec_ask_t *a = &asks[i];
        if (!d->seq[i])
            continue;                                  /* a failed forward took its KV */
        int nd = 0;
        for (; nd < j && q < rows_at[nd]; nd++) {
            a->drafts[nd] = s_top_id(d, nd, q);
            if (a->probs)
                a->probs[nd] = s_top_prob(d, nd, q);
        }
        /* The placeholders of positions 1 .. nd - 1 are drafts 0 .. nd - 2. */
        if (nd > 1 && kvseq_set_tokens(d->seq[i]->kv, d->seq[i]->base, a->drafts, nd - 1) != 0) {
            s_drop_kv(d, i);
            rc = -1;
            continue;
        }
        int keep = 1;
        while (keep < nd && s_confident(a, keep))
            keep++;
        a->n_drafts = keep;
    }
    return rc;
}

/* Proposals for asks[0, n), n <= max_seqs. */
static int s_group(draft_t *d, spec_ask_t *asks, int n)
{
    int kmax = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        spec_ask_t *a = &asks[i];
        d->seq[i] = NULL;
        int k = a->k;
        if (k > d->max_model_len + 1 - a->n)
            k = d->max_model_len + 1 - a->n;          /* the drafts' KV stays within the sequence's room */
        d_seq_t *s = k > 0 && a->n > 0 && a->n <= d->max_model_len ? s_get_or_new(d, a->id) : NULL;
        if (!s)
            continue;
        if (a->sample && s->q_rows < k) {
            float *q = realloc(s->q, (size_t)k * (size_t)d->V * sizeof *q);
            if (!q)
                continue;
            s->q = q;
            s->q_rows = k;
        }
        /* A window (off > 0) is kept while the asks carry a bound it holds: an ask without one
         * computes the whole sequence again, and one whose bound is more than the window holds
         * (a drafting step after an exploration's window) computes its own window of the
         * sequence's last max_catch_up tokens, once: bounded, and its drafts see that much. */
        if (s->off > 0 && (a->max_catch_up <= 0 || a->n - s->off < a->max_catch_up)) {
            kvseq_release(s->kv);
            s->off = 0;
        }
        /* In step: keep the longest prefix of the draft KV the sequence still starts with (from
         * off), but never its last token (its logits give the first draft). */
        const int len = kvseq_len(s->kv), n_rel = a->n - s->off;
        const int32_t *have = kvseq_tokens(s->kv);
        int m = 0;
        const int upto = len < n_rel - 1 ? len : n_rel - 1;
        while (m < upto && have[m] == a->tokens[s->off + m])
            m++;
        if (m < len && kvseq_truncate(s->kv, m) != 0)
            kvseq_release(s->kv), m = 0;
        int pend = n_rel - m;
        if (a->max_catch_up > 0 && pend > a->max_catch_up) {   /* the last max_catch_up tokens only */
            kvseq_release(s->kv);
            s->off = a->n - a->max_catch_up;
            pend = a->max_catch_up;
            d->st.windows++;
        }
        s->base = a->n - s->off;
        s->q_valid = 0;
        d->seq[i] = s;
        d->pend[i] = pend;
        d->kk[i] = k;
        kmax = k > kmax ? k : kmax;
    }
    /* Greedy asks whose catch-up is one forward: their drafts from the device. */
    int greedy = d->dev_mode != DEV_HOST, pending = 0;
    for (int i = 0; greedy && i < n; i++)
        if (d->seq[i]) {
            greedy = !asks[i].sample && d->kk[i] <= SPEC_MAX_K;
            pending += d->pend[i];
        }
    if (greedy && pending <= d->max_tokens)
        return s_group_dev(d, asks, n, kmax);
    /* Catch-up: every sequence's missing tokens, max_tokens per forward; the forward that
     * computes a sequence's last token gives its first draft. */
    for (;;) {
        int r = 0, budget = d->max_tokens, any_sampled = 0;
        for (int i = 0; i < n && budget > 0; i++) {
            if (!d->seq[i] || d->pend[i] == 0)
                continue;
            const int take = d->pend[i] < budget ? d->pend[i] : budget;
            kvseq_t *kv = d->seq[i]->kv;
            if (kvseq_append(kv, asks[i].tokens + (asks[i].n - d->pend[i]), take) != 0) {
                s_drop_kv(d, i);                       /* out of draft blocks */
                continue;
            }
            budget -= take;
            d->rows[r] = (model_seq_t){.kv = kv, .n_new = take};
            d->need[r] = take == d->pend[i] && (asks[i].sample || asks[i].probs);
            any_sampled |= d->need[r];
            d->which[r++] = i;
        }
        if (r == 0)
            break;
        if (s_forward(d, r, any_sampled) != 0) {
            rc = -1;
            continue;
        }
        for (int j = 0; j < r; j++) {
            const int i = d->which[j];
            d->pend[i] -= d->rows[j].n_new;
            if (d->pend[i] == 0)
                asks[i].drafts[0] = s_pick(d, &asks[i], d->seq[i], 0, d->e->logits + (size_t)j * (size_t)d->V,
                                           d->argmax[j]);
        }
    }
    for (int i = 0; i < n; i++)
        if (d->seq[i])
            asks[i].n_drafts = 1;
    /* Draft positions 1..k-1: one forward each over the sequences still drafting. */
    for (int j = 1; j < kmax; j++) {
        int r = 0, any_sampled = 0;
        for (int i = 0; i < n; i++) {
            if (!d->seq[i] || d->kk[i] <= j || asks[i].n_drafts != j)
                continue;
            if (asks[i].stop_below > 0 && asks[i].probs) {   /* confident enough to go on? */
                double conf = 1.0;
                for (int q = 0; q < j; q++)
                    conf *= asks[i].probs[q];
                if (conf < asks[i].stop_below)
                    continue;
            }
            if (kvseq_append(d->seq[i]->kv, &asks[i].drafts[j - 1], 1) != 0)
                continue;                              /* no block for it: the drafts so far stand */
            d->rows[r] = (model_seq_t){.kv = d->seq[i]->kv, .n_new = 1};
            d->need[r] = asks[i].sample || asks[i].probs;
            any_sampled |= d->need[r];
            d->which[r++] = i;
        }
        if (r == 0)
            break;
        if (s_forward(d, r, any_sampled) != 0) {
            for (int q = 0; q < r; q++)
                asks[d->which[q]].n_drafts = 0;
            rc = -1;
            continue;
        }
        for (int q = 0; q < r; q++) {
            const int i = d->which[q];
            asks[i].drafts[j] = s_pick(d, &asks[i], d->seq[i], j, d->e->logits + (size_t)q * (size_t)d->V, d->argmax[q]);
            asks[i].n_drafts = j + 1;
        }
    }
    for (int i = 0; i < n; i++)
        if (d->seq[i] && asks[i].sample)
            d->seq[i]->q_valid = asks[i].n_drafts;
    return rc;
}

static int s_propose_batch(spec_proposer_t *p, spec_ask_t *asks, int n)
{
    draft_t *d = p->impl;
    const int64_t t0 = now_ns();
    int rc = 0;
    for (int at = 0; at < n; at += d->max_seqs)
        rc |= s_group(d, asks + at, n - at < d->max_seqs ? n - at : d->max_seqs);
    d->st.ns += (uint64_t)(now_ns() - t0);
    return rc;
}

static int s_propose(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts,
                     float *probs)
{
    spec_ask_t a = {.id = id, .tokens = tokens, .n = n, .k = k, .drafts = drafts, .probs = probs};
    s_propose_batch(p, &a, 1);
    return a.n_drafts;
}

static const float *s_dist(spec_proposer_t *p, uint64_t id, int i)
{
    const draft_t *d = p->impl;
    const d_seq_t *s = s_get(d, id);
    return s && i >= 0 && i < s->q_valid ? s->q + (size_t)i * (size_t)d->V : NULL;
}

/* The target kept n_accepted drafts: the draft KV keeps the sequence as it was plus those (at
 * most what it computed: the last draft never is). */
static void s_accepted(spec_proposer_t *p, uint64_t id, int n_verified, int n_accepted)
{
    (void)n_verified;
    draft_t *d = p->impl;
    d_seq_t *s = s_get(d, id);
    if (!s || n_accepted < 0)
        return;
    const int keep = s->base + n_accepted;
    if (keep < kvseq_len(s->kv) && kvseq_truncate(s->kv, keep) != 0)
        kvseq_release(s->kv);
    s->q_valid = 0;
}

static void s_forget(spec_proposer_t *p, uint64_t id)
{
    draft_t *d = p->impl;
    d_seq_t *s = s_get(d, id);
    if (s)
        s_seq_free(d, s);
}

static void s_destroy(spec_proposer_t *p)
{
    draft_t *d = p->impl;
    if (d) {
        for (size_t i = 0; d->by_id.keys && i < d->by_id.cap; i++)
            if (d->by_id.keys[i]) {
                d_seq_t *s = (d_seq_t *)(uintptr_t)d->by_id.vals[i];
                kvseq_destroy(&s->kv);
                free(s->q);
                free(s);
            }
        u64map_free(&d->by_id);
        if (d->top)
            d->e->be->ops->free(d->e->be, d->top);
        free(d->h_top);
        free(d->ord);
        engine_destroy(&d->e);
        free(d->rows);
        free(d->argmax);
        free(d->need);
        free(d->which);
        free(d->seq);
        free(d->pend);
        free(d->kk);
        free(d->work);
        free(d->mass);
        free(d->idx);
        free(d);
    }
    free(p);
}

static const spec_proposer_ops_t s_ops = {
    .name = "draft", .propose = s_propose, .propose_batch = s_propose_batch, .dist = s_dist,
    .accepted = s_accepted, .forget = s_forget, .destroy = s_destroy,
};

static int s_has_file(const char *dir, const char *file)
{
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return stat(p, &st) == 0;
}

/* The draft's tokenizer against the target's: the same tokenizer.json, or the same token at
 * every id. Checked only where both directories hold one. */
static int s_same_tokenizer(const char *target_dir, const char *draft_dir, char *err, size_t errlen)
{
    if (!s_has_file(target_dir, "tokenizer.json") || !s_has_file(draft_dir, "tokenizer.json"))
        return 0;
    char pt[4096], pd[4096];
    snprintf(pt, sizeof pt, "%s/tokenizer.json", target_dir);
    snprintf(pd, sizeof pd, "%s/tokenizer.json", draft_dir);
    size_t nt = 0, nd = 0;
    char *ft = util_read_file(pt, &nt), *fd = util_read_file(pd, &nd);
    const int same_bytes = ft && fd && nt == nd && memcmp(ft, fd, nt) == 0;
    free(ft);
    free(fd);
    if (same_bytes)
        return 0;
    char e2[512];
    tokenizer_t *tt = tok_load(target_dir, e2, sizeof e2), *td = tt ? tok_load(draft_dir, e2, sizeof e2) : NULL;
    int rc = 0;
    if (!tt || !td) {
        rc = errf(err, errlen, "draft model %s: cannot compare its tokenizer with the target's (%s): %s", draft_dir,
                  target_dir, e2);
    } else if (tok_vocab_size(tt) != tok_vocab_size(td)) {
        rc = errf(err, errlen, "draft model %s: its tokenizer has %d tokens, the target's (%s) %d: a draft needs the "
                  "target's tokenizer", draft_dir, tok_vocab_size(td), target_dir, tok_vocab_size(tt));
    } else {
        for (int id = 0; id < tok_vocab_size(tt); id++) {
            const char *a = tok_token_str(tt, id), *b = tok_token_str(td, id);
            if ((a == NULL) != (b == NULL) || (a && strcmp(a, b) != 0)) {
                rc = errf(err, errlen, "draft model %s: its tokenizer differs from the target's (%s): token %d is "
                          "'%.40s' there and '%.40s' here; a draft needs the target's tokenizer", draft_dir,
                          target_dir, id, a ? a : "(none)", b ? b : "(none)");
                break;
            }
        }
    }
    tok_destroy(&tt);
    tok_destroy(&td);
    return rc;
}

static int s_block_size(const spec_draft_opts_t *o) { return o->block_size > 0 ? o->block_size : DEFAULT_BLOCK; }

/* The draft pool: o->kv_blocks, or max_seqs sequences of max_model_len and their drafts. */
static long s_pool_blocks(const spec_draft_opts_t *o)
{
    const int bs = s_block_size(o);
    const long per_seq = (o->max_model_len + SPEC_MAX_K + bs - 1) / bs;
    return o->kv_blocks > 0 ? o->kv_blocks : (long)o->max_seqs * per_seq;
}

int spec_draft_device_bytes(const spec_draft_opts_t *o, dtype_t dtype, double *bytes, char *err, size_t errlen)
{
    model_config_t cfg;
    char e2[512];
    if (!o->model_dir || config_load(o->model_dir, &cfg, e2, sizeof e2) != 0)
        return errf(err, errlen, "draft model %s: %s", o->model_dir ? o->model_dir : "(none)",
                    o->model_dir ? e2 : "no directory");
    const dtype_t wdt = dtype != DT_COUNT ? dtype : cfg.dtype;
    const size_t es = dtype_size(wdt), kv_es = dtype_size(config_kv_dtype(&cfg, dtype, DT_COUNT));
    double w = config_weight_bytes(&cfg, es, cfg.num_experts);
    if (!cfg.tie_word_embeddings)
        w += (double)cfg.vocab_size * cfg.hidden_size * (double)es;   /* the embedding beside the LM head */
    *bytes = w + (double)s_pool_blocks(o) * s_block_size(o) * (double)config_kv_bytes_per_token(&cfg, kv_es);
    return 0;
}

spec_proposer_t *spec_draft_new(const spec_draft_opts_t *o, int *config_error, char *err, size_t errlen)
{
    int cfg_err = 1;
    spec_proposer_t *p = NULL;
    draft_t *d = NULL;
    engine_t *t = o->target;
    if (!o->model_dir || !*o->model_dir || !t || o->max_seqs < 1 || o->max_tokens < o->max_seqs || o->max_model_len < 1) {
        errf(err, errlen, "draft model %s: bad sizes (max_seqs %d, max_tokens %d, max_model_len %d)",
             o->model_dir ? o->model_dir : "(none)", o->max_seqs, o->max_tokens, o->max_model_len);
        goto fail;
    }
    if (!(p = calloc(1, sizeof *p)) || !(d = calloc(1, sizeof *d))) {
        cfg_err = 0;
        errf(err, errlen, "draft model %s: out of memory", o->model_dir);
        goto fail;
    }
    p->ops = &s_ops;
    p->impl = d;
    char e2[1024];
    if (!(d->e = engine_new(o->model_dir, e2, sizeof e2))) {
        errf(err, errlen, "draft model: %s", e2);
        goto fail;
    }
    if (d->e->cfg.vocab_size != t->cfg.vocab_size) {
        errf(err, errlen, "draft model %s: vocabulary of %d tokens, the target's (%s) %d: a draft needs the target's "
             "tokenizer", o->model_dir, d->e->cfg.vocab_size, t->model_dir, t->cfg.vocab_size);
        goto fail;
    }
    if (s_same_tokenizer(o->target_tokenizer ? o->target_tokenizer : t->model_dir, o->model_dir, err, errlen) != 0)
        goto fail;
    const int bs = s_block_size(o);
    engine_spec_t s;
    engine_spec_default(&s);
    s.be = t->be;
    s.dummy = o->dummy;
    s.kv_dtype_option = "the draft model's KV dtype";
    s.model = (model_opts_t){.max_tokens = o->max_tokens, .max_seqs = o->max_seqs, .max_logit_rows = o->max_seqs,
                             .max_context = o->max_model_len + SPEC_MAX_K, .kv_block_size = bs};
    s.kv_blocks = s_pool_blocks(o);
    const engine_status_t st = engine_load(d->e, &s, e2, sizeof e2);
    if (st != ENGINE_OK) {
        cfg_err = st == ENGINE_ERR_CONFIG;
        errf(err, errlen, "draft model %s: %s", o->model_dir, e2);
        goto fail;
    }
    d->V = t->cfg.vocab_size;
    d->max_seqs = o->max_seqs;
    d->max_tokens = o->max_tokens;
    d->max_model_len = o->max_model_len;
    const size_t ms = (size_t)o->max_seqs, V = (size_t)d->V;
    d->rows = calloc(ms, sizeof *d->rows);
    d->argmax = calloc(ms, sizeof *d->argmax);
    d->need = calloc(ms, 1);
    d->which = calloc(ms, sizeof *d->which);
    d->seq = calloc(ms, sizeof *d->seq);
    d->pend = calloc(ms, sizeof *d->pend);
    d->kk = calloc(ms, sizeof *d->kk);
    d->work = malloc(V * sizeof *d->work);
    d->mass = malloc(V * sizeof *d->mass);
    d->idx = malloc(V * sizeof *d->idx);
    d->block_size = bs;
    d->ord = calloc(ms, sizeof *d->ord);
    const char *dv = getenv("TROUPE_DRAFT_DEVICE");
    d->dev_mode = DEV_CHAINED;
    if (dv && *dv) {   /* a value we do not know is refused, not taken as the default */
        if (dv[0] < '0' || dv[0] > '2' || dv[1]) {
            cfg_err = 1;
            errf(err, errlen, "draft model %s: TROUPE_DRAFT_DEVICE=%s: expected 0 (host), 1 (one download per "
                 "position) or 2 (chained)", o->model_dir, dv);
            goto fail;
        }
        d->dev_mode = dv[0] - '0';
    }
    if (!t->be->ops->mtp_top || !t->be->ops->copy)
        d->dev_mode = DEV_HOST;
    const size_t top_words = (size_t)SPEC_MAX_K * 2 * ms;
    if (d->dev_mode != DEV_HOST) {
        d->top = t->be->ops->alloc(t->be, top_words * sizeof(int32_t));
        d->h_top = malloc(top_words * sizeof(int32_t));
    }
    if (u64map_init(&d->by_id, 64) != 0 || !d->rows || !d->argmax || !d->need || !d->which || !d->seq || !d->pend ||
        !d->kk || !d->work || !d->mass || !d->idx || !d->ord || (d->dev_mode != DEV_HOST && (!d->top || !d->h_top))) {
        cfg_err = 0;
        errf(err, errlen, "draft model %s: out of memory", o->model_dir);
        goto fail;
    }
    if (config_error)
        *config_error = 0;
    return p;
fail:
    if (p)
        s_destroy(p);
    else
        free(d);
    if (config_error)
        *config_error = cfg_err;
    return NULL;
}

void spec_draft_stats(const spec_proposer_t *p, spec_draft_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!p || p->ops != &s_ops)
        return;
    const draft_t *d = p->impl;
    *out = d->st;
    out->blocks_total = kvpool_n_blocks(d->e->pool);
    out->blocks_used = out->blocks_total - kvpool_free_count(d->e->pool);
}

int spec_draft_kv_len(const spec_proposer_t *p, uint64_t id)
{
    if (!p || p->ops != &s_ops)
        return -1;
    const d_seq_t *s = s_get(p->impl, id);
    return s ? kvseq_len(s->kv) : -1;
}
