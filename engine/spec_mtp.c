/* engine/spec_mtp.c — the MTP proposer: DeepSeek-V3's multi-token-prediction layer drafts for the
 * target it belongs to (engine/mtp.h says what the layer computes; engine/spec.h what a proposer is).
 *
 * Per sequence the proposer keeps an MTP sequence in its own one-layer pool, begun at the first
 * target position it was fed (base; engine/mtp.h says why that may be past 0): MTP position j
 * holds target token base+j+1 and was computed from the target's hidden state h_{base+j}, so its
 * logits guess token base+j+2. The MTP sequence only ever holds target-backed positions between calls: spec_mtp_feed runs
 * every fed position whose next token is known (others wait, at most a few rows, in `pend`), and a
 * proposal appends its chained drafts (the MTP's own output as the hidden state, the drafted token
 * as the input) and truncates them away again before it returns, so nothing depends on which drafts
 * the target accepts.
 *
 * A sampled request's sequence (fed with `sampled`) also keeps the MTP logits of its newest
 * position, and its proposals draw each draft from the MTP's distribution under the request's
 * sampling (spec_draw), keeping those distributions for the verification's rejection sampling
 * (spec_dist): acceptance min(1, p/q) instead of the point mass's p(argmax). A greedy request's
 * drafts stay the device's argmax, and nothing of the logits comes to the host for it. */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/model_internal.h"   /* the target's max_tokens, for the hidden-state buffer */
#include "engine/mtp.h"

static const spec_proposer_ops_t s_ops;   /* below: tells an MTP proposer from another */

#define PEND_MAX (SPEC_MAX_K + 2)   /* fed rows waiting for their next token */
#define MTP_BLOCK 16                /* the MTP pool's tokens per block */
#define RUN_TOKENS 1024             /* rows per MTP forward at most */
#define RUN_SEQS 64                 /* sequences per MTP forward at most */
#define MTP_SPAN_ROWS 4             /* one copy of sampled rows' logits spans at most this x their rows ... */
#define MTP_SPAN_BYTES (8u << 20)   /* ... and these bytes (s_fetch_logits) */

/* The MTP pool's blocks: every sequence's longest MTP sequence (max_context, a proposal's chained
 * drafts past it) and a partial block. */
static long s_pool_blocks(int max_seqs, int max_context)
{
    return (long)max_seqs * ((max_context + SPEC_MAX_K + MTP_BLOCK - 1) / MTP_BLOCK + 1);
}

double spec_mtp_device_bytes(const model_config_t *c, int max_seqs, int max_context)
{
    if (max_seqs < 1)
        max_seqs = 1;
    if (max_context < 1)
        max_context = c->max_position_embeddings;
    /* kvpool_new's block: one layer, K and V, f32 */
    const double block = 2.0 * MTP_BLOCK * c->num_kv_heads * c->head_dim * sizeof(float);
    return (double)s_pool_blocks(max_seqs, max_context) * block;
}

typedef struct {
    int used;
    uint64_t id;
    kvseq_t *kv;                   /* the MTP sequence: kvseq_len = target-backed MTP positions */
    int base;                      /* the target position of MTP position 0 */
    float *pend;                   /* [PEND_MAX][H]: h of positions len .. len + n_pend - 1 */
    int n_pend;
    float *last_hid;               /* [H] the MTP output at position len - 1 */
    int32_t last_draft;            /* its argmax: the guess for target token len + 1 */
    float last_prob;               /* that guess's softmax probability */
    float *save_hid;               /* [H] a proposal's copy of last_hid (and the two below), restored after */
    int32_t save_draft;
    float save_prob;
    int save_len;
    int in_run;                    /* has a job in the batch being gathered (s_gather) */
    int sampled;                   /* fed as a sampled request's: keeps its logits (below) */
    float *logits;                 /* [V] the MTP logits at position len - 1, when has_logits */
    int has_logits;
    float *save_logits;            /* [V] during a proposal: the feed's logits (swapped with logits, whose
                                    * buffer the chained forwards write), swapped back after */
    int save_has_logits;
    float *q;                      /* [SPEC_MAX_K][V] the last sampled proposal's distributions */
    int q_valid;                   /* rows of q that belong to the last proposal (0: greedy) */
    uint64_t fed;                  /* the feed call (s_mtp_t.clock) that last fed it */
} s_seq_t;

/* n new MTP positions of s: MTP tokens toks[0..n) (target tokens have+1 ..), hidden rows hid [n][H]. */
typedef struct {
    s_seq_t *s;
    const int32_t *toks;
    const float *hid;
    int n;
} s_job_t;

typedef struct {
    model_t *m;
    kvpool_t *pool;
    int max_seqs, max_context, H;
    int run_tokens, run_seqs;      /* rows and sequences per MTP forward (the model's max_tokens, max_seqs) */
    s_seq_t *seqs;
    s_job_t *jobs;                 /* [max_seqs] a batch being gathered */
    int n_jobs;
    float *stage;                  /* [run_tokens][H] a forward's hidden rows */
    int32_t *ids;                  /* [run_tokens] each logits row's argmax (the device's) */
    float *probs;                  /* [run_tokens] its softmax probability (the device's mtp_top) */
    int V;
    int draw;                      /* sampled requests draw their drafts (TROUPE_SPEC_MTP_DRAW, default 1) */
    float *work, *mass;            /* [V] spec_draw's scratch */
    int32_t *idx;
    int pad;                       /* pad unequal forwards (PAD_SEQS): the backend has graphs */
    float *hid_out;                /* [run_tokens][H] */
    s_seq_t **want;                /* [run_seqs] a forward's sampled sequences (s_fetch_logits) */
    int *want_row;                 /* [run_seqs] their logits rows */
    float *span;                   /* [span_cap][V] one copy of logits rows */
    int span_cap;
    float *target_hid;             /* [target_rows][H] spec_mtp_hidden_buffer */
    int target_rows;               /* the model's max_tokens: a target step's rows at most */
    uint64_t clock;                /* feed calls so far */
    spec_mtp_stats_t st;
} s_mtp_t;

/* Target positions the MTP layer has: its own positions (each backed by the target's h) from base. */
static int s_have(const s_seq_t *s) { return s->base + kvseq_len(s->kv); }

static s_seq_t *s_find(s_mtp_t *t, uint64_t id, int make)
{
    s_seq_t *free_slot = NULL;
    for (int i = 0; i < t->max_seqs; i++) {
        if (t->seqs[i].used && t->seqs[i].id == id)
            return &t->seqs[i];
        if (!t->seqs[i].used && !free_slot)
            free_slot = &t->seqs[i];
    }
    if (!make)
        return NULL;
    /* All taken (requests preempted or waiting keep theirs while max_seqs others run): the one fed
     * longest ago, not in this call, makes room; it begins again at its next feed. */
    s_seq_t *lru = NULL;
    for (int i = 0; !free_slot && i < t->max_seqs; i++) {
        s_seq_t *c = &t->seqs[i];
        if (!c->in_run && c->fed < t->clock && (!lru || c->fed < lru->fed))
            lru = c;
    }
    if (!free_slot && !(free_slot = lru))
        return NULL;
    t->st.evicted += free_slot->used;
    free_slot->used = 1;
    free_slot->id = id;
    free_slot->n_pend = 0;
    free_slot->base = 0;
    free_slot->sampled = free_slot->has_logits = free_slot->q_valid = 0;
    kvseq_release(free_slot->kv);
    return free_slot;
}

static void s_drop(s_seq_t *s)
{
    kvseq_release(s->kv);
    s->used = 0;
    s->n_pend = 0;
    s->base = 0;
    s->has_logits = s->q_valid = 0;
}

/* A sampled sequence's buffers (logits, their copy, the proposal's distributions), made on its
 * first sampled feed and kept with its slot. 0, or -1 out of memory (it is fed as greedy). */
static int s_sampled_buffers(s_mtp_t *t, s_seq_t *s)
{
    if (s->q)
        return 0;
    float *l = malloc((size_t)t->V * sizeof(float)), *sl = malloc((size_t)t->V * sizeof(float)),
          *q = malloc((size_t)SPEC_MAX_K * (size_t)t->V * sizeof(float));
    if (!l || !sl || !q) {
        free(l);
        free(sl);
        free(q);
        return -1;
    }
    s->logits = l;
    s->save_logits = sl;
    s->q = q;
    return 0;
}

/* The logits of the sampled sequences of the last forward (want, want_row: n of them, rows in
 * increasing order), each into its sequence: a sampled sequence's draws need the distribution,
 * not the argmax alone. One copy of the rows from the first to the last of them where that span
 * is at most MTP_SPAN_ROWS x the rows wanted and MTP_SPAN_BYTES (each copy waits for the device:
 * one a sequence was a wait a sequence), else a copy each. A sequence whose copy failed takes the
 * argmax at its next proposal, verified as a point mass. */
static void s_fetch_logits(s_mtp_t *t, int n)
{
    if (n == 0)
        return;
    const size_t row_bytes = (size_t)t->V * sizeof(float);
    const int lo = t->want_row[0], span = t->want_row[n - 1] - lo + 1;
    if (n > 1 && span <= MTP_SPAN_ROWS * n && (size_t)span * row_bytes <= MTP_SPAN_BYTES) {
        if (span > t->span_cap) {
            float *b = realloc(t->span, (size_t)span * row_bytes);
            if (b) {
                t->span = b;
                t->span_cap = span;
            }
        }
        if (span <= t->span_cap && model_mtp_logits_rows(t->m, lo, span, t->span) == 0) {
            for (int i = 0; i < n; i++) {
                memcpy(t->want[i]->logits, t->span + (size_t)(t->want_row[i] - lo) * t->V, row_bytes);
                t->want[i]->has_logits = 1;
            }
            t->st.logits_copies++;
            return;
        }
    }
    for (int i = 0; i < n; i++) {
        t->want[i]->has_logits = model_mtp_logits_rows(t->m, t->want_row[i], 1, t->want[i]->logits) == 0;
        t->st.logits_copies++;
    }
}

/* Filler positions for a forward of unequal rows (s_forward): where the backend has graphs, a
 * forward of up to PAD_SEQS sequences whose rows differ (a feed after verification: each row's
 * last token and its accepted drafts) is padded to its longest with filler positions (the last
 * token and hidden row repeated), so that it replays a graph of B sequences of n rows: on a small
 * model an MTP forward is mostly its launches, and the filler rows cost little beside them.
 * Causal attention keeps the filler out of every real row, each sequence's outputs are read at its
 * last real row (the forward takes logits of every row), and the filler positions leave the MTP
 * KV after the forward. As the target's verify steps (actors/worker/spec_step.c s_pad). */
#define PAD_SEQS 16

/* One MTP forward over jobs[0..n) (each a different sequence, rows within run_tokens in all): each
 * sequence keeps its last row's output, argmax and probability. On failure the rows appended are
 * taken back (the sequences keep what they had: a later feed finds the gap). */
static int s_forward(s_mtp_t *t, s_job_t *jobs, int n, char *err, size_t errlen)
{
    model_seq_t q[n];
    int T = 0, i = 0, nmax = 0, pad[n];
    for (int u = 0; u < n; u++)
        nmax = jobs[u].n > nmax ? jobs[u].n : nmax;
    /* every row's logits: padded, or unequal rows (the outputs of each last real row) */
    int every = t->pad && n <= PAD_SEQS && nmax <= SPEC_MAX_K + 1 && n * nmax <= t->run_tokens;
    if (every) {
        int equal = 1;
        for (int u = 0; u < n; u++)
            equal &= jobs[u].n == nmax;
        every = !equal;
    }
    for (; i < n; i++) {
        s_job_t *j = &jobs[i];
        if (kvseq_append(j->s->kv, j->toks, j->n) < 0)
            break;
        memcpy(t->stage + (size_t)T * t->H, j->hid, (size_t)j->n * t->H * sizeof(float));
        T += j->n;
        pad[i] = 0;
        if (every && j->n < nmax) {
            int32_t fill[SPEC_MAX_K + 1];
            for (int f = 0; f < nmax - j->n; f++)
                fill[f] = j->toks[j->n - 1];
            if (kvseq_append(j->s->kv, fill, nmax - j->n) == 0)
                pad[i] = nmax - j->n;              /* no room: this forward runs unequal */
            for (int f = 0; f < pad[i]; f++, T++)
                memcpy(t->stage + (size_t)T * t->H, j->hid + (size_t)(j->n - 1) * t->H, (size_t)t->H * sizeof(float));
        }
        q[i] = (model_seq_t){.kv = j->s->kv, .n_new = j->n + pad[i]};
    }
    int rc = i < n ? errf(err, errlen, "mtp: sequence %llu: no room in the MTP KV (%d positions)",
                          (unsigned long long)jobs[i].s->id, kvseq_len(jobs[i].s->kv) + jobs[i].n) : 0;
    model_batch_t b = {.n_seqs = n, .seqs = q, .argmax_out = t->ids, .all_logits = every};
    t->st.padded += every;
    if (rc == 0)
        rc = model_mtp_forward(t->m, &b, t->stage, NULL, t->hid_out, t->probs, err, errlen);
    for (int u = 0; u < i; u++)                     /* the filler goes; on failure every row appended */
        kvseq_truncate(jobs[u].s->kv, kvseq_len(jobs[u].s->kv) - pad[u] - (rc < 0 ? jobs[u].n : 0));
    if (rc < 0)
        return -1;
    t->st.forwards++;
    int row = 0, n_want = 0;
    for (i = 0; i < n; i++) {
        s_seq_t *s = jobs[i].s;
        row += jobs[i].n;
        t->st.rows += (uint64_t)jobs[i].n;
        const int at = every ? row - 1 : i;         /* its last real row's logits */
        memcpy(s->last_hid, t->hid_out + (size_t)(row - 1) * t->H, (size_t)t->H * sizeof(float));
        s->last_draft = t->ids[at];
        s->last_prob = t->probs[at];
        s->has_logits = 0;
        if (s->sampled && s->logits) {
            t->want[n_want] = s;
            t->want_row[n_want++] = at;
        }
        row += pad[i];
    }
    s_fetch_logits(t, n_want);
    return 0;
}

/* Runs the gathered jobs in as few forwards as run_tokens and run_seqs allow (a long job in parts,
 * each part after the one before it), and empties the batch. */
static int s_flush(s_mtp_t *t, char *err, size_t errlen)
{
    s_job_t part[t->n_jobs > 0 ? t->n_jobs : 1];
    int rc = 0;
    while (rc == 0) {
        int n = 0, T = 0;
        for (int i = 0; i < t->n_jobs && n < t->run_seqs && T < t->run_tokens; i++) {
            s_job_t *j = &t->jobs[i];
            if (j->n == 0)
                continue;
            const int c = j->n < t->run_tokens - T ? j->n : t->run_tokens - T;
            part[n++] = (s_job_t){.s = j->s, .toks = j->toks, .hid = j->hid, .n = c};
            j->toks += c;
            j->hid += (size_t)c * t->H;
            j->n -= c;
            T += c;
        }
        if (n == 0)
            break;
        rc = s_forward(t, part, n, err, errlen);
    }
    for (int i = 0; i < t->n_jobs; i++)
        t->jobs[i].s->in_run = 0;
    t->n_jobs = 0;
    return rc;
}

/* Adds a job to the batch (a sequence already in it: the batch runs first, so its rows stay in order). */
static int s_gather(s_mtp_t *t, s_seq_t *s, const int32_t *toks, const float *hid, int n, char *err, size_t errlen)
{
    if (n <= 0)
        return 0;
    if ((s->in_run || t->n_jobs == t->max_seqs) && s_flush(t, err, errlen) < 0)
        return -1;
    t->jobs[t->n_jobs++] = (s_job_t){.s = s, .toks = toks, .hid = hid, .n = n};
    s->in_run = 1;
    return 0;
}

/* Runs the waiting rows whose next token is now known (tokens[0..n) of the target sequence). */
static int s_advance(s_mtp_t *t, s_seq_t *s, const int32_t *tokens, int n, char *err, size_t errlen)
{
    const int have = s_have(s);
    int ready = n - 1 - have;
    ready = ready < s->n_pend ? ready : s->n_pend;
    if (ready <= 0)
        return 0;
    if (s_gather(t, s, tokens + have + 1, s->pend, ready, err, errlen) < 0 || s_flush(t, err, errlen) < 0)
        return -1;
    s->n_pend -= ready;
    memmove(s->pend, s->pend + (size_t)ready * t->H, (size_t)s->n_pend * t->H * sizeof(float));
    return 0;
}

/* One feed's bookkeeping (engine/mtp.h): where the sequence begins, which rows it has, which wait;
 * the rows that can run now are gathered into the batch. */
static int s_feed_one(s_mtp_t *t, const spec_mtp_feed_t *f, char *err, size_t errlen)
{
    if (f->pos0 < 0 || f->n < 0 || f->pos0 + f->n > f->n_tokens)
        return errf(err, errlen, "mtp: sequence %llu: hidden states of positions %d..%d, %d tokens known",
                    (unsigned long long)f->id, f->pos0, f->pos0 + f->n - 1, f->n_tokens);
    s_seq_t *s = s_find(t, f->id, 1);
    if (!s)
        return errf(err, errlen, "mtp: more than %d sequences fed at once", t->max_seqs);
    s->fed = t->clock;
    s->sampled = f->sampled && t->draw && s_sampled_buffers(t, s) == 0;
    const int fresh = kvseq_len(s->kv) == 0 && s->n_pend == 0;
    if (s_advance(t, s, f->tokens, f->n_tokens, err, errlen) < 0)
        return -1;
    int next = s_have(s) + s->n_pend;                   /* the first position not had yet */
    if (fresh || f->pos0 > next) {                      /* begins here (engine/mtp.h) */
        if (f->n == 0)
            return 0;
        if (s->in_run && s_flush(t, err, errlen) < 0)
            return -1;
        kvseq_release(s->kv);
        s->n_pend = 0;
        s->base = next = f->pos0;
        t->st.starts++;
        t->st.started_late += f->pos0 > 0;
    }
    if (f->pos0 + f->n <= next)
        return 0;
    const float *h = f->hidden + (size_t)(next - f->pos0) * t->H;
    int rows = f->pos0 + f->n - next;
    if (s->n_pend == 0) {                               /* straight from the caller's rows */
        const int have = s_have(s);
        int ready = f->n_tokens - 1 - have;
        ready = ready < rows ? ready : rows;
        if (ready > 0) {
            if (s_gather(t, s, f->tokens + have + 1, h, ready, err, errlen) < 0)
                return -1;
            h += (size_t)ready * t->H;
            rows -= ready;
        }
    }
    if (s->n_pend + rows > PEND_MAX)
        return errf(err, errlen, "mtp: sequence %llu: %d hidden states wait for their tokens (at most %d)",
                    (unsigned long long)f->id, s->n_pend + rows, PEND_MAX);
    memcpy(s->pend + (size_t)s->n_pend * t->H, h, (size_t)rows * t->H * sizeof(float));
    s->n_pend += rows;
    return 0;
}

int spec_mtp_feed_batch(spec_proposer_t *p, const spec_mtp_feed_t *feeds, int n, char *err, size_t errlen)
{
    s_mtp_t *t = p->impl;
    int failed = 0;
    char e1[256];
    const int64_t t0 = now_ns();
    t->clock++;
    for (int i = 0; i < n; i++)
        if (s_feed_one(t, &feeds[i], e1, sizeof e1) < 0) {
            s_seq_t *s = s_find(t, feeds[i].id, 0);
            if (s && !s->in_run)    /* begins again at its next feed */
                s_drop(s);
            if (failed++ == 0)
                errf(err, errlen, "%s", e1);
        }
    if (s_flush(t, e1, sizeof e1) < 0) {
        failed++;
        errf(err, errlen, "%s", e1);
    }
    t->st.feed_seconds += (double)(now_ns() - t0) / 1e9;
    return failed ? -1 : 0;
}

int spec_mtp_feed(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n_tokens, int pos0, int n,
                  const float *hidden, char *err, size_t errlen)
{
    const spec_mtp_feed_t f = {.id = id, .tokens = tokens, .n_tokens = n_tokens, .pos0 = pos0, .n = n, .hidden = hidden};
    return spec_mtp_feed_batch(p, &f, 1, err, errlen);
}

/* Draft r of a sampled ask from logits (spec_draw): q row r kept for spec_dist. */
static int32_t s_draw(s_mtp_t *t, const spec_ask_t *a, s_seq_t *s, int r, const float *logits, float *prob)
{
    const int32_t x = spec_draw(logits, t->V, a->sample, r, s->q + (size_t)r * (size_t)t->V, t->work, t->mass,
                                t->idx, prob);
    s->q_valid = r + 1;
    return x;
}

/* Every asking sequence's drafts: the first is the guess the MTP layer made at its newest
 * target-backed position; each further draft position is one forward for all sequences still
 * drafting (the MTP's own output as the hidden state, the draft before as the token). A sampled
 * ask whose sequence kept its logits draws each draft from them instead (s_draw); one that has
 * none for a position stops there. Then every sequence's MTP KV goes back to its target-backed
 * positions. */
static int s_propose_batch(spec_proposer_t *p, spec_ask_t *asks, int n)
{
    s_mtp_t *t = p->impl;
    char err[256];
    int rc = 0, kmax = 0;
    const int64_t t0 = now_ns();
    s_seq_t *seq[n > 0 ? n : 1];
    float cum[n > 0 ? n : 1];
    uint8_t drawn[n > 0 ? n : 1];   /* a sampled ask drawing from the MTP's distribution */
    for (int i = 0; i < n; i++) {
        spec_ask_t *a = &asks[i];
        s_seq_t *s = seq[i] = s_find(t, a->id, 0);
        a->n_drafts = 0;
        drawn[i] = 0;
        if (s)
            s->q_valid = 0;
        if (!s || a->k < 1 || s_advance(t, s, a->tokens, a->n, err, sizeof err) < 0) {
            seq[i] = NULL;
            continue;
        }
        const int len = kvseq_len(s->kv);
        if (len == 0 || s->base + len != a->n - 1 || len + a->k > t->max_context) {
            seq[i] = NULL;                              /* the target's h_{n-2} was not fed */
            continue;
        }
        s->save_len = len;
        memcpy(s->save_hid, s->last_hid, (size_t)t->H * sizeof(float));
        s->save_draft = s->last_draft;
        s->save_prob = s->last_prob;
        /* the feed's logits aside, their buffer for the chained forwards: no copy of V floats */
        s->save_has_logits = s->has_logits;
        if (s->logits) {
            float *feed = s->logits;
            s->logits = s->save_logits;
            s->save_logits = feed;
        }
        float prob = s->last_prob;
        drawn[i] = a->sample && s->has_logits;
        a->drafts[0] = drawn[i] ? s_draw(t, a, s, 0, s->save_logits, &prob) : s->last_draft;
        if (a->probs)
            a->probs[0] = prob;
        a->n_drafts = 1;
        cum[i] = prob;
        kmax = a->k > kmax ? a->k : kmax;
    }
    for (int r = 1; r < kmax && rc == 0; r++) {
        for (int i = 0; i < n && rc == 0; i++) {
            const spec_ask_t *a = &asks[i];
            if (seq[i] && a->n_drafts == r && r < a->k && !(a->stop_below > 0 && cum[i] < a->stop_below))
                rc = s_gather(t, seq[i], &a->drafts[r - 1], seq[i]->last_hid, 1, err, sizeof err);
        }
        if (t->n_jobs == 0 || rc < 0 || (rc = s_flush(t, err, sizeof err)) < 0)
            break;
        for (int i = 0; i < n; i++) {
            spec_ask_t *a = &asks[i];
            if (!seq[i] || a->n_drafts != r || kvseq_len(seq[i]->kv) != seq[i]->save_len + r)
                continue;                               /* not drafting at r */
            if (drawn[i] && !seq[i]->has_logits)
                continue;                               /* no distribution to draw from: stops */
            float prob = seq[i]->last_prob;
            a->drafts[r] = drawn[i] ? s_draw(t, a, seq[i], r, seq[i]->logits, &prob) : seq[i]->last_draft;
            if (a->probs)
                a->probs[r] = prob;
            cum[i] *= prob;
            a->n_drafts = r + 1;
        }
    }
    t->n_jobs = 0;
    for (int i = 0; i < n; i++) {
        s_seq_t *s = seq[i];
        if (!s)
            continue;
        s->in_run = 0;
        kvseq_truncate(s->kv, s->save_len);             /* never published: always allowed */
        memcpy(s->last_hid, s->save_hid, (size_t)t->H * sizeof(float));
        s->last_draft = s->save_draft;
        s->last_prob = s->save_prob;
        s->has_logits = s->save_has_logits;
        if (s->logits) {
            float *feed = s->save_logits;
            s->save_logits = s->logits;
            s->logits = feed;
        }
        if (!drawn[i])
            s->q_valid = 0;
    }
    t->st.propose_seconds += (double)(now_ns() - t0) / 1e9;
    return rc;
}

static int s_propose(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts,
                     float *probs)
{
    spec_ask_t a = {.id = id, .tokens = tokens, .n = n, .k = k < SPEC_MAX_K ? k : SPEC_MAX_K, .drafts = drafts,
                    .probs = probs};
    s_propose_batch(p, &a, 1);
    return a.n_drafts;
}

/* Draft i's distribution of id's last proposal: the sampled ones' (s_draw), NULL for a point mass. */
static const float *s_dist(spec_proposer_t *p, uint64_t id, int i)
{
    s_mtp_t *t = p->impl;
    const s_seq_t *s = s_find(t, id, 0);
    return s && i >= 0 && i < s->q_valid ? s->q + (size_t)i * (size_t)t->V : NULL;
}

static void s_forget(spec_proposer_t *p, uint64_t id)
{
    s_mtp_t *t = p->impl;
    s_seq_t *s = s_find(t, id, 0);
    if (s)
        s_drop(s);
}

float *spec_mtp_hidden_buffer(spec_proposer_t *p, int *rows, int *hidden_size)
{
    s_mtp_t *t = p && p->ops == &s_ops ? p->impl : NULL;
    *rows = t ? t->target_rows : 0;
    *hidden_size = t ? t->H : 0;
    return t ? t->target_hid : NULL;
}

void spec_mtp_stats(const spec_proposer_t *p, spec_mtp_stats_t *out)
{
    *out = (spec_mtp_stats_t){0};
    const s_mtp_t *t = p && p->ops == &s_ops ? p->impl : NULL;
    if (!t)
        return;
    *out = t->st;
    for (int i = 0; i < t->max_seqs; i++)
        out->seqs += t->seqs[i].used;
}

void spec_mtp_pad(spec_proposer_t *p, int on)
{
    s_mtp_t *t = p && p->ops == &s_ops ? p->impl : NULL;
    if (t)
        t->pad = on;
}

int spec_mtp_base(const spec_proposer_t *p, uint64_t id)
{
    const s_mtp_t *t = p && p->ops == &s_ops ? p->impl : NULL;
    for (int i = 0; t && i < t->max_seqs; i++)
        if (t->seqs[i].used && t->seqs[i].id == id)
            return t->seqs[i].base;
    return -1;
}

static void s_destroy(spec_proposer_t *p)
{
    s_mtp_t *t = p->impl;
    for (int i = 0; t && t->seqs && i < t->max_seqs; i++) {
        kvseq_destroy(&t->seqs[i].kv);
        free(t->seqs[i].pend);
        free(t->seqs[i].last_hid);
        free(t->seqs[i].save_hid);
        free(t->seqs[i].logits);
        free(t->seqs[i].save_logits);
        free(t->seqs[i].q);
    }
    if (t) {
        free(t->seqs);
        free(t->jobs);
        kvpool_destroy(&t->pool);
        free(t->stage);
        free(t->ids);
        free(t->probs);
        free(t->hid_out);
        free(t->want);
        free(t->want_row);
        free(t->span);
        free(t->target_hid);
        free(t->work);
        free(t->mass);
        free(t->idx);
    }
    free(t);
    free(p);
}

static const spec_proposer_ops_t s_ops = {
    .name = "mtp", .propose = s_propose, .propose_batch = s_propose_batch, .dist = s_dist, .forget = s_forget,
    .destroy = s_destroy,
};

spec_proposer_t *spec_mtp_new(model_t *target, int max_seqs, int max_context, char *err, size_t errlen)
{
    if (!target || !model_has_mtp(target))
        return errf(err, errlen, "mtp: the model has no MTP layer (num_nextn_predict_layers, model.layers.N.*)"), NULL;
    const model_config_t *c = model_config(target);
    spec_proposer_t *p = calloc(1, sizeof *p);
    s_mtp_t *t = calloc(1, sizeof *t);
    if (!p || !t) {
        free(p);
        free(t);
        return errf(err, errlen, "mtp: out of memory"), NULL;
    }
    p->ops = &s_ops;
    p->impl = t;
    t->m = target;
    t->max_seqs = max_seqs > 0 ? max_seqs : 1;
    t->max_context = max_context > 0 ? max_context : c->max_position_embeddings;
    t->H = c->hidden_size;
    t->V = c->vocab_size;
    /* TROUPE_SPEC_MTP_DRAW=0: sampled requests take the argmax drafts, verified as point masses
     * (how MTP drafted before it drew from its distribution: for comparison) */
    const char *draw = getenv("TROUPE_SPEC_MTP_DRAW");
    t->draw = !(draw && !strcmp(draw, "0"));
    /* The MTP forwards' own batches, within the model's buffers; at most RUN_TOKENS rows and
     * RUN_SEQS sequences each, so that their host buffers stay small on a large model (a batch
     * over more runs as several forwards). */
    const model_opts_t *o = &target->opts;
    t->target_rows = o->max_tokens;
    t->run_tokens = o->max_tokens < RUN_TOKENS ? o->max_tokens : RUN_TOKENS;
    t->run_seqs = o->max_seqs < o->max_logit_rows ? o->max_seqs : o->max_logit_rows;
    t->run_seqs = t->run_seqs < RUN_SEQS ? t->run_seqs : RUN_SEQS;
    t->seqs = calloc((size_t)t->max_seqs, sizeof *t->seqs);
    t->jobs = calloc((size_t)t->max_seqs, sizeof *t->jobs);
    t->stage = malloc((size_t)t->run_tokens * t->H * sizeof(float));
    t->ids = malloc((size_t)t->run_tokens * sizeof(int32_t));
    t->probs = malloc((size_t)t->run_tokens * sizeof(float));
    t->pad = target->be->ops->graph_begin != NULL && o->max_logit_rows >= PAD_SEQS * (SPEC_MAX_K + 1);
    t->hid_out = malloc((size_t)t->run_tokens * t->H * sizeof(float));
    t->want = calloc((size_t)t->run_seqs, sizeof *t->want);
    t->want_row = calloc((size_t)t->run_seqs, sizeof *t->want_row);
    t->target_hid = malloc((size_t)t->target_rows * t->H * sizeof(float));
    t->work = malloc((size_t)t->V * sizeof(float));
    t->mass = malloc((size_t)t->V * sizeof(float));
    t->idx = malloc((size_t)t->V * sizeof(int32_t));
    if (!t->seqs || !t->jobs || !t->stage || !t->ids || !t->probs || !t->hid_out || !t->want || !t->want_row ||
        !t->target_hid || !t->work || !t->mass || !t->idx)
        goto oom;
    if (!(t->pool = model_mtp_pool_new(target, (int)s_pool_blocks(t->max_seqs, t->max_context), MTP_BLOCK, DT_F32,
                                       err, errlen)))
        goto fail;
    for (int i = 0; i < t->max_seqs; i++) {
        s_seq_t *s = &t->seqs[i];
        s->kv = kvseq_new(t->pool, t->max_context + SPEC_MAX_K, 0);
        s->pend = malloc((size_t)PEND_MAX * t->H * sizeof(float));
        s->last_hid = malloc((size_t)t->H * sizeof(float));
        s->save_hid = malloc((size_t)t->H * sizeof(float));
        if (!s->kv || !s->pend || !s->last_hid || !s->save_hid)
            goto oom;
    }
    return p;
oom:
    errf(err, errlen, "mtp: out of memory");
fail:
    s_destroy(p);
    return NULL;
}
