/* actors/worker/spec_step.c — drafts before a decode step's forward, verification after it
 * (spec_step.h says when each runs and why). */
#include "actors/worker/spec_step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/worker/worker.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/mtp.h"

#define SPEC_NGRAM_MIN_N 1       /* the n-gram proposer's suffix lengths in a decode worker */
#define SPEC_NGRAM_MAX_N 3
/* Graph shapes of a decode-only step (engine/forward.c s_graph_step's buckets): B rows of n
 * positions each, n in 1..SPEC_MAX_K + 1, plain (logits of the last) or verify (of every one). */
#define SHAPE_SLOTS(max_seqs) ((size_t)((max_seqs) + 1) * (SPEC_MAX_K + 1) * 2)

struct spec_step {
    int k;                       /* drafts per row at most */
    int max_seqs, max_rows, max_model_len;
    spec_proposer_t *proposer;
    int borrowed;                /* the proposer is the worker's (worker_t.draft: the draft model, or the MTP layer) */
    /* MTP (spec_mtp_feed): every decode-only step where rows asked for drafts is a verify step,
     * drafts got or not, so that the target's hidden state of every kept position reaches the MTP
     * layer (docs/speculation.md); a step where none asked is a plain one. */
    int mtp;
    float *hid;                  /* the MTP proposer's buffer for the forward's hidden_out: [hid_rows][H] */
    int hid_rows, H;
    int hid_ok;                  /* this verify step's forward fills hid */
    spec_mtp_feed_t *feeds;      /* [max_seqs] a verify step's kept rows, fed together */
    spec_ask_t *asks;            /* [max_seqs] a step's proposals, one per drafting row */
    int *ask_row;                /* [max_seqs] the row of each */
    bk_sample_t *sample;         /* [max_seqs] sampled rows' parameters for a draft with a distribution */
    spec_hooks_t hooks;
    int32_t *drafts;             /* [max_seqs][SPEC_MAX_K] each decode row's drafts this step */
    int *n_drafts;               /* [max_seqs] drafts appended to the row's KV this step */
    int *n_pad;                  /* [max_seqs] filler positions after them (spec_step_propose) */
    int pad_max_rows;            /* pad steps of up to this many rows (TROUPE_SPEC_PAD_ROWS; 0: never) */
    int pad_to_asked;            /* to the length the step asked, not its most found (TROUPE_SPEC_PAD_TO) */
    uint64_t padded_steps, pad_positions;   /* verify steps padded, filler positions they computed */
    uint64_t skipped_steps;      /* decode-only steps left out of the cost table (s_unlike) */
    int last_rows, last_tokens;  /* the last step (spec_step_done): decode rows (0: it had prompt rows), positions */
    int last_k;                  /* its cost cell: drafts per row (spec_cost_t: asked, or verified with a distribution) */
    long last_emitted;           /* tokens it emitted */
    int step_asked;              /* this step: drafts each row asked for (0: none asked) */
    int last_skip;               /* the last step's cycle is left out of the cost table (s_unlike) */
    int prev_asked;              /* the decode-only step before the last asked for drafts */
    /* Plain steps of one row, the cost table's batch-1 plain cell: cycles after a drafting step
     * (left out with a stateful proposer) and inside a plain stretch (spec_cost_leave_out). */
    double plain1_after_s, plain1_stretch_s;
    uint64_t plain1_after, plain1_stretch;
    uint64_t slow1[2];           /* one-row cycles over 1 ms (five plain steps of a small GPU model): plain, drafting */
    int last_prev_asked;         /* the last step's prev_asked, for those */
    int last_warmup;             /* the last step was a graph shape's first or second (s_unlike) */
    spec_plain_guard_t plain_guard[SPEC_COST_BATCHES];   /* plain cycles too slow for the cost table, by bucket */
    uint8_t *shape_seen;         /* [SHAPE_SLOTS(max_seqs)] decode-only steps seen of each graph shape, up to 2 */
    long step_emitted;           /* this step's tokens streamed by spec_step_verify; -1: it did not verify */
    int *kv_base;                /* [max_seqs] the row's KV length before its drafts */
    spec_stats_t stats;
    int kind;                    /* this step's spec_step_kind_t (spec_step_propose); -1: it had prompt rows */
    int last_kind;               /* the last done step's, for its cycle (spec_step_cycle) */
    spec_step_counts_t n;        /* where the time goes, by step kind (spec_step_counts) */
    spec_client_t *policy;       /* the draft-scheduler's policy and reports (spec_step_policy_init); NULL: none */
    int has_dist;                /* the proposer gives draft probabilities */
    float *probs;                /* [max_seqs][SPEC_MAX_K] each row's draft probabilities this step */
    /* A verify step's rows of logits (a row's last token, then its drafts), for model_forward: */
    int32_t *ids;                /* [max_rows] the device's token of each (argmax, or the sample op's) */
    uint8_t *need;               /* [max_rows] 1: its logits come to the host (sampler_verify_dist) */
    bk_sample_t *row_sample;     /* [max_rows] its parameters for the sample op (RNG step advanced) */
};

int spec_step_config_from_env(spec_step_config_t *c, char *err, size_t errlen)
{
    *c = (spec_step_config_t){.method = SPEC_OFF, .pad_max_rows = -1, .pad_to_asked = 1, .coalesce = 1};
    const char *co = getenv("TROUPE_SPEC_COALESCE");
    if (co && *co) {
        if (strcmp(co, "0") && strcmp(co, "1"))
            return errf(err, errlen, "TROUPE_SPEC_COALESCE '%s': expected 0 or 1", co);
        c->coalesce = co[0] == '1';
    }
    const char *pt = getenv("TROUPE_SPEC_PAD_TO");
    if (pt && *pt) {
        if (strcmp(pt, "asked") && strcmp(pt, "found"))
            return errf(err, errlen, "TROUPE_SPEC_PAD_TO '%s': expected asked or found", pt);
        c->pad_to_asked = strcmp(pt, "asked") == 0;
    }
    const char *pv = getenv("TROUPE_SPEC_PAD_ROWS");
    if (pv && *pv) {
        char *end;
        const long v = strtol(pv, &end, 10);
        if (*end || v < 0 || v > 1 << 20)
            return errf(err, errlen, "TROUPE_SPEC_PAD_ROWS '%s': expected a row count >= 0", pv);
        c->pad_max_rows = (int)v;
    }
    const char *nc = getenv("TROUPE_SPEC_NGRAM_CONFIDENCE");
    if (nc && *nc) {
        if (strcmp(nc, "0") && strcmp(nc, "1"))
            return errf(err, errlen, "TROUPE_SPEC_NGRAM_CONFIDENCE '%s': expected 0 or 1", nc);
        c->ngram_confidence = nc[0] == '1';
    }
    return spec_knob_parse("TROUPE_SPECULATION", getenv("TROUPE_SPECULATION"), &c->method, &c->k, err, errlen);
}

spec_step_t *spec_step_new(const spec_step_config_t *c, spec_proposer_t *draft, int max_seqs, int max_rows, int max_model_len,
                           const spec_hooks_t *hooks, char *err, size_t errlen)
{
    if (errlen)
        *err = 0;
    if (c->method == SPEC_OFF)
        return NULL;
    spec_step_t *s = calloc(1, sizeof *s);
    if (s) {
        *s = (spec_step_t){.k = c->k, .max_seqs = max_seqs, .max_rows = max_rows, .max_model_len = max_model_len,
                           .hooks = *hooks, .kind = -1, .last_kind = -1};
        if (c->method == SPEC_DRAFT || c->method == SPEC_MTP) {   /* opened by worker_load, freed with the worker */
            s->proposer = draft;
            s->borrowed = 1;
            s->mtp = c->method == SPEC_MTP;
            s->hid = s->mtp ? spec_mtp_hidden_buffer(draft, &s->hid_rows, &s->H) : NULL;
        } else {
            s->proposer = spec_ngram_new(SPEC_NGRAM_MIN_N, SPEC_NGRAM_MAX_N, c->ngram_confidence);
        }
        /* a confidence per draft: the draft model's and the MTP layer's softmax probabilities, the
         * calibrated n-gram proposer's estimate */
        s->has_dist = c->method == SPEC_DRAFT || c->method == SPEC_MTP ||
                      (c->method == SPEC_NGRAM && c->ngram_confidence);
        s->asks = calloc((size_t)max_seqs, sizeof *s->asks);
        s->ask_row = calloc((size_t)max_seqs, sizeof *s->ask_row);
        s->sample = calloc((size_t)max_seqs, sizeof *s->sample);
        s->drafts = calloc((size_t)max_seqs * SPEC_MAX_K, sizeof *s->drafts);
        s->n_drafts = calloc((size_t)max_seqs, sizeof *s->n_drafts);
        s->n_pad = calloc((size_t)max_seqs, sizeof *s->n_pad);
        s->pad_max_rows = c->pad_max_rows > 0 ? c->pad_max_rows : 0;
        s->pad_to_asked = c->pad_to_asked;
        s->kv_base = calloc((size_t)max_seqs, sizeof *s->kv_base);
        s->probs = calloc((size_t)max_seqs * SPEC_MAX_K, sizeof *s->probs);
        s->ids = calloc((size_t)max_rows, sizeof *s->ids);
        s->need = calloc((size_t)max_rows, 1);
        s->row_sample = calloc((size_t)max_rows, sizeof *s->row_sample);
        s->feeds = calloc((size_t)max_seqs, sizeof *s->feeds);
        s->shape_seen = calloc(SHAPE_SLOTS(max_seqs), 1);
    }
    if (s && !s->proposer && c->method == SPEC_DRAFT) {
        spec_step_destroy(&s);
        errf(err, errlen, "TROUPE_SPECULATION=draft: this worker opened no draft model (model.draft)");
        return NULL;
    }
    if (s && s->mtp && (!s->proposer || !s->hid || s->hid_rows < max_rows)) {
        spec_step_destroy(&s);
        errf(err, errlen, "TROUPE_SPECULATION=mtp: this worker opened no MTP proposer for %d rows (the model's MTP layer)",
             max_rows);
        return NULL;
    }
    if (!s || !s->proposer || !s->asks || !s->ask_row || !s->sample || !s->drafts || !s->n_drafts || !s->n_pad || !s->kv_base ||
        !s->probs || !s->ids || !s->need || !s->row_sample || !s->feeds || !s->shape_seen) {
        spec_step_destroy(&s);
        errf(err, errlen, "out of memory for speculation over %d rows", max_seqs);
        return NULL;
    }
    LOG_I("speculation: %s, %d drafts per row", spec_method_name(c->method), c->k);
    return s;
}

void spec_step_destroy(spec_step_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    spec_step_t *s = *self_p;
    if (!s->borrowed)
        spec_proposer_destroy(&s->proposer);
    free(s->asks);
    free(s->ask_row);
    free(s->sample);
    free(s->drafts);
    free(s->n_drafts);
    free(s->n_pad);
    free(s->kv_base);
    free(s->probs);
    free(s->ids);
    free(s->need);
    free(s->row_sample);
    free(s->feeds);
    free(s->shape_seen);
    spec_client_destroy(&s->policy);
    free(s);
    *self_p = NULL;
}

static void s_pad(spec_step_t *s, const sched_batch_t *b);
static int s_propose(spec_step_t *s, const sched_batch_t *b);

/* The proposer's calls of this step, timed and counted by the step's kind (s->kind). */
static void s_proposer_time(spec_step_t *s, int64_t t0)
{
    const int k = s->kind >= 0 ? s->kind : SPEC_STEP_DRAFTING;
    s->n.proposer_calls[k]++;
    s->n.proposer_seconds[k] += (double)(now_ns() - t0) / 1e9;
}

static double s_proposer_total(const spec_step_t *s)
{
    double p = 0;
    for (int k = 0; k < SPEC_STEP_KINDS; k++)
        p += s->n.proposer_seconds[k];
    return p;
}

/* The step's own host time: from t0 on, less what the proposer took since its total was proposer_s0. */
static void s_host_time(spec_step_t *s, int64_t t0, double proposer_s0)
{
    s->n.host_seconds += (double)(now_ns() - t0) / 1e9 - (s_proposer_total(s) - proposer_s0);
}

int spec_step_propose(spec_step_t *s, const sched_batch_t *b)
{
    if (!s)
        return 0;
    const int64_t t0 = now_ns();
    const double p0 = s_proposer_total(s);
    const int rc = s_propose(s, b);
    s_host_time(s, t0, p0);
    return rc;
}

/* Every drafting row's proposal in one call (the draft model batches its forwards across rows);
 * each row's k is reserved from the step's budget before the proposals come back. A sampled row
 * (temperature > 0) gives a draft model its sampling, so it draws from its distribution. The
 * step's kind: off when no row asks (nothing of the proposer runs: a worker whose policy is off
 * pays for its proposer in its exploration steps only), explore, or drafting. A draft model asked
 * by the policy catches up at most SPEC_RESUME_TOKENS / rows tokens of a row it lost step with
 * (within SPEC_EXPLORE_CATCH_UP .. SPEC_RESUME_CATCH_UP: the policy turning drafting on after a
 * plain stretch, a row's first proposal), an exploration step at most SPEC_EXPLORE_CATCH_UP
 * (spec_ask_t.max_catch_up): the step that brings it back in step is one bounded forward. */
static int s_propose(spec_step_t *s, const sched_batch_t *b)
{
    for (int i = 0; i < b->n; i++)   /* spec_step_drafts: 0 in a step that does not verify */
        s->n_drafts[i] = s->n_pad[i] = 0;
    s->step_asked = 0;
    s->step_emitted = -1;
    s->kind = -1;
    if (b->n != b->n_decode)
        return 0;
    int budget = s->max_rows - b->n, any = 0, n_ask = 0;
    const int explore = s->policy ? spec_client_explore(s->policy, b->n) : -1;
    for (int i = 0; i < b->n; i++) {
        sched_req_t *r = b->rows[i].req;
        if (!r)
            continue;
        s->kv_base[i] = kvseq_len(r->kv);
        /* the verify length: the draft-scheduler's policy for this batch size, or the default */
        int k = explore >= 0 ? explore : s->policy ? spec_client_ask(s->policy, b->n) : s->k;
        s->step_asked = k > s->step_asked ? k : s->step_asked;
        k = k < budget ? k : budget;
        if (k > s->max_model_len - s->kv_base[i] - 1)
            k = s->max_model_len - s->kv_base[i] - 1;
        if (k <= 0)
            continue;
        int logprobs = 0;
        const sampler_t *smp = s->hooks.sampler(s->hooks.ctx, r, &logprobs);
        sampler_device_params(smp, &s->sample[i]);
        s->asks[n_ask] = (spec_ask_t){.id = r->id, .tokens = r->toks, .n = r->n_toks, .k = k,
                                      .sample = sampler_draws(smp) ? &s->sample[i] : NULL,
                                      .drafts = s->drafts + (size_t)i * SPEC_MAX_K,
                                      .probs = s->probs + (size_t)i * SPEC_MAX_K,
                                      .stop_below = explore < 0 && s->policy ? spec_client_stop_below(s->policy, b->n) : 0,
                                      .max_catch_up = SPEC_EXPLORE_CATCH_UP};
        s->ask_row[n_ask++] = i;
        budget -= k;
    }
    /* No row asked (the policy says no drafts at this batch, or an exploration step without):
     * a plain step, for MTP too. Its feed would cost the hidden states' download and an MTP
     * forward for drafts nobody asks for; its sequences begin again at their next feed (a row
     * then drafts from the step after, the output is the same), and the k = 0 cell of the cost
     * table is the plain step the policy compares against. */
    s->kind = explore > 0 ? SPEC_STEP_EXPLORE : s->step_asked > 0 ? SPEC_STEP_DRAFTING : SPEC_STEP_OFF;
    if (n_ask == 0)
        return 0;
    if (explore <= 0) {   /* the policy's drafts: SPEC_RESUME_TOKENS over the rows, within the bounds */
        int per = SPEC_RESUME_TOKENS / n_ask;
        per = per < SPEC_EXPLORE_CATCH_UP ? SPEC_EXPLORE_CATCH_UP : per > SPEC_RESUME_CATCH_UP ? SPEC_RESUME_CATCH_UP : per;
        for (int a = 0; a < n_ask; a++)
            s->asks[a].max_catch_up = per;
    }
    const int64_t tp = now_ns();
    spec_propose_batch(s->proposer, s->asks, n_ask);
    s_proposer_time(s, tp);
    for (int a = 0; a < n_ask; a++) {
        const int i = s->ask_row[a];
        sched_req_t *r = b->rows[i].req;
        int n = s->asks[a].n_drafts;
        if (n > 0 && s->policy && explore < 0)   /* a row with a distribution keeps the drafts it is confident of */
            n = spec_client_keep(s->policy, b->n, s->has_dist ? s->asks[a].probs : NULL, n);
        if (n > 0 && kvseq_append(r->kv, s->asks[a].drafts, n) == 0) {
            s->n_drafts[i] = n;
            any = 1;
        }
    }
    if (any)
        s_pad(s, b);
    return any || s->mtp;
}

/* A CUDA graph replays a verify step only when every row has the same positions, and rows' draft
 * counts differ (the proposer found fewer, confidence kept fewer): a small step's rows are padded
 * to its largest count, or (pad_to_asked, a proposer without a distribution) to the length the
 * step asked, with filler positions (the row's last draft repeated, or its last token). Padding to
 * the length asked keeps one graph shape per (batch size, length): with the count found, a
 * scheduled worker met new shapes all through serving (on one H100, 2026-12-07, 110 graph records
 * against 45 for a plain worker, each a step run op by op and then one recorded, 2-7 ms).
 * Causal attention keeps them out of every real position's logits, the verify reads only real
 * positions, and the KV roll-back to the accepted length removes them. Small steps only: there
 * the step's cost is its launches and weight reads, and the filler positions cost little beside
 * the launches a replay saves; a large step's positions are real work. Nothing is padded when a
 * row lacks the room (blocks, max_model_len, rows of logits). */
static void s_pad(spec_step_t *s, const sched_batch_t *b)
{
    if (b->n > s->pad_max_rows)
        return;
    int nmax = 0;
    for (int i = 0; i < b->n; i++) {
        if (!b->rows[i].req)
            return;
        nmax = s->n_drafts[i] > nmax ? s->n_drafts[i] : nmax;
    }
    /* one shape per (batch size, length asked); a proposer with a distribution asks max_k and
     * keeps what its confidence passes: padding those to max_k would be the k = 7 step always */
    if (s->pad_to_asked && !s->has_dist && s->step_asked > nmax)
        nmax = s->step_asked < SPEC_MAX_K ? s->step_asked : SPEC_MAX_K;
    if (b->n * (1 + nmax) > s->max_rows)
        return;
    int i = 0;
    for (; i < b->n; i++) {
        sched_req_t *r = b->rows[i].req;
        const int n = s->n_drafts[i], pad = nmax - n;
        if (pad == 0)
            continue;
        if (s->kv_base[i] + 1 + nmax > s->max_model_len)
            break;
        const int32_t fill = n > 0 ? s->drafts[(size_t)i * SPEC_MAX_K + n - 1] : r->toks[r->n_toks - 1];
        int32_t f[SPEC_MAX_K];
        for (int j = 0; j < pad; j++)
            f[j] = fill;
        if (kvseq_append(r->kv, f, pad) != 0)
            break;
        s->n_pad[i] = pad;
    }
    if (i == b->n) {
        s->padded_steps++;
        for (int q = 0; q < b->n; q++)
            s->pad_positions += (uint64_t)s->n_pad[q];
        return;
    }
    for (int q = 0; q < i; q++)   /* a row had no room: no padding this step */
        if (s->n_pad[q]) {
            if (kvseq_truncate(b->rows[q].req->kv, s->kv_base[q] + s->n_drafts[q]) != 0)
                LOG_E("request %llu: cannot take its filler positions back", (unsigned long long)b->rows[q].req->id);
            s->n_pad[q] = 0;
        }
}

int spec_step_drafts(const spec_step_t *s, int i) { return s ? s->n_drafts[i] + s->n_pad[i] : 0; }

int spec_step_max_drafts(const spec_step_t *s)
{
    if (!s)
        return 0;
    return s->policy ? spec_client_max_ask(s->policy) : s->k;
}

/* A verify step's rows of logits: every position of every row (all_logits), each row's token from
 * the device, and a row's logits on the host only where its acceptance reads them: penalties or
 * log-probabilities (sampler_needs_host), a sampled row without the backend's sample op, or a
 * sampled row's draft drawn from a distribution (the rejection rule reads p). A greedy row is an
 * argmax whatever its draft (its p is a point mass: sampler_verify_dist accepts exactly the
 * argmax and emits it), and a sampled row's token at a point-mass draft is sampler_sample's, the
 * sample op's at the RNG step of its position (the tokens generated before it). */
void spec_step_batch(spec_step_t *s, const sched_batch_t *b, int dev_sample, model_batch_t *mb)
{
    const int64_t t0 = now_ns();
    int row = 0, any_sampled = 0;
    for (int i = 0; i < b->n; i++) {
        sched_req_t *r = b->rows[i].req;
        const int n = s->n_drafts[i];
        int logprobs = 0;
        const sampler_t *smp = r ? s->hooks.sampler(s->hooks.ctx, r, &logprobs) : NULL;
        const int greedy = !smp || sampler_is_greedy(smp), host = smp && (logprobs || sampler_needs_host(smp));
        for (int j = 0; j <= n + s->n_pad[i]; j++, row++) {
            const int real = j <= n;   /* filler positions after: nothing reads them */
            s->need[row] = (uint8_t)(real && (host || (!greedy && (!dev_sample || (j < n && spec_dist(s->proposer, r->id, j))))));
            s->row_sample[row] = (bk_sample_t){0};   /* temperature 0: the argmax */
            if (real && !greedy && !s->need[row]) {
                sampler_device_params(smp, &s->row_sample[row]);
                s->row_sample[row].step += (uint64_t)j;
                any_sampled = 1;
            }
        }
    }
    /* MTP: every position's hidden state; rows <= max_rows <= hid_rows (spec_step_new) */
    s->hid_ok = s->mtp && row <= s->hid_rows;
    *mb = (model_batch_t){.n_seqs = b->n, .seqs = mb->seqs, .all_logits = 1, .argmax_out = s->ids,
                          .need_logits = s->need, .sample = any_sampled ? s->row_sample : NULL,
                          .hidden_out = s->hid_ok ? s->hid : NULL};
    s->n.host_seconds += (double)(now_ns() - t0) / 1e9;
}

/* Row i's positions in order (its last token, then its drafts), the target's token for each,
 * streamed as long as the drafts are accepted and the request goes on (a stop id, a stop string,
 * max_tokens or max_model_len ends it at the first finishing token); the last token streamed is
 * the next step's input, as without speculation. */
void spec_step_verify(spec_step_t *s, const sched_batch_t *b, const float *logits, int vocab)
{
    if (!s)
        return;
    const int64_t t0 = now_ns();
    const double p0 = s_proposer_total(s);
    int64_t emit_ns = 0;
    const size_t V = (size_t)vocab;
    size_t row = 0;
    int n_feeds = 0;
    for (int i = 0; i < b->n; i++) {
        sched_req_t *r = b->rows[i].req;
        const int n = s->n_drafts[i], base = s->kv_base[i];
        const size_t first = row;
        row += (size_t)(1 + n + s->n_pad[i]);
        if (!r)
            continue;
        const uint64_t id = r->id;
        kvseq_t *kv = r->kv;
        const int32_t *dr = s->drafts + (size_t)i * SPEC_MAX_K;
        int logprobs = 0;
        sampler_t *smp = s->hooks.sampler(s->hooks.ctx, r, &logprobs);
        int j = 0, alive = 1;
        s->step_emitted += s->step_emitted < 0;   /* -1: the first row of this verify step */
        for (;; j++) {
            int acc;
            float lp = 0;
            /* the device's token (spec_step_batch), else a draft drawn from a distribution
             * (spec_dist) takes the rejection rule, a point mass the coupling (sampler.h) */
            const size_t at = first + (size_t)j;
            int32_t t = s->ids[at];
            if (s->need[at])
                t = sampler_verify_dist(smp, logits + at * V, j < n ? dr[j] : -1,
                                        j < n ? spec_dist(s->proposer, id, j) : NULL, logprobs ? &lp : NULL, &acc);
            else
                acc = j < n && t == dr[j];
            const int64_t te = now_ns();   /* streaming is the owner's, as a plain step's emit: not ours */
            alive = s->hooks.emit(s->hooks.ctx, r, t, lp, s->need[at] ? logits + at * V : NULL,
                                  base + j + 1 >= s->max_model_len, base + j, acc);
            emit_ns += now_ns() - te;
            s->step_emitted++;
            if (!acc || !alive)
                break;
        }
        if (n > 0 && s->policy)
            spec_client_verified(s->policy, n, j, s->has_dist ? s->probs + (size_t)i * SPEC_MAX_K : NULL);
        if (n > 0) {
            s->stats.verify_steps++;
            s->stats.drafts += (uint64_t)n;
            s->stats.accepted += (uint64_t)j;
            s->stats.emitted += (uint64_t)(j + 1);
        }
        if (!alive)
            continue;
        spec_accepted(s->proposer, id, n, j);
        if (s->hid_ok)   /* the kept positions: the last token's and the j accepted drafts' */
            s->feeds[n_feeds++] = (spec_mtp_feed_t){.id = id, .tokens = r->toks, .n_tokens = r->n_toks,
                                                    .pos0 = base - 1, .n = j + 1,
                                                    .hidden = s->hid + first * (size_t)s->H,
                                                    .sampled = smp && sampler_draws(smp)};
        if (kvseq_truncate(kv, base + j) != 0)
            LOG_E("request %llu: cannot roll its KV back to %d tokens", (unsigned long long)id, base + j);
    }
    /* Every row's kept positions through the MTP layer together. A feed that fails drops its
     * sequence, which begins again at its next feed (fewer drafts accepted a while, the same output). */
    char err[256];
    if (n_feeds > 0) {
        const int64_t tp = now_ns();
        if (spec_mtp_feed_batch(s->proposer, s->feeds, n_feeds, err, sizeof err) != 0)
            LOG_W("MTP: %s; that sequence begins again", err);
        s_proposer_time(s, tp);
    }
    s_host_time(s, t0 + emit_ns, p0);
}

int spec_step_policy_init(spec_step_t *s, actor_t *a, char *err, size_t errlen)
{
    if (!s)
        return 0;
    s->policy = spec_client_new(a, s->k, s->has_dist, err, errlen);
    return s->policy ? 0 : -1;
}

int spec_step_on_policy(spec_step_t *s, const msg_draft_policy_t *p, char *err, size_t errlen)
{
    if (!s || !s->policy)
        return errf(err, errlen, "speculation is off in this worker (TROUPE_SPECULATION)");
    return spec_client_on_policy(s->policy, p, err, errlen);
}

/* 1 when the step's cycle would not measure what its cell stands for, so the cost table leaves it
 * out (counting its shape once):
 *   - the first two steps of a graph shape (B rows of n positions each, plain or verify): the
 *     first runs uncaptured and the second records the graph, a few milliseconds on a GPU. A cell
 *     the exploration fills gets few steps, many of them of a batch size not seen before, and
 *     with these it read 3 ms a plain step at batch 1 where the plain run's steps took 0.21 ms
 *     (kjv-deepseek, MTP, one H200, 2026-12-02), and the policy drafted at 0.31x of no speculation;
 *   - with a stateful proposer (a draft model, MTP), a step whose predecessor drafted where it did
 *     not or the reverse (spec_cost_leave_out: the proposer's catch-up; what a drafting step
 *     leaves for the plain step after it). */
static int s_unlike(spec_step_t *s, const sched_batch_t *b, int verified, int asked)
{
    const int transition = spec_cost_leave_out(s->has_dist, s->prev_asked, asked);
    s->last_warmup = 0;
    s->last_prev_asked = s->prev_asked;
    s->prev_asked = asked;
    const int n = 1 + s->n_drafts[0] + s->n_pad[0];
    for (int i = 1; i < b->n; i++)
        if (1 + s->n_drafts[i] + s->n_pad[i] != n)
            return transition;   /* unequal rows: never a graph */
    if (b->n > s->max_seqs || n > SPEC_MAX_K + 1)
        return transition;
    const int verify = verified && n > 1;   /* a one-position verify step shares the plain step's graph */
    uint8_t *seen = &s->shape_seen[((size_t)(n - 1) * 2 + (size_t)verify) * (size_t)(s->max_seqs + 1) + (size_t)b->n];
    if (*seen < 2) {
        ++*seen;
        if (s->kind >= 0)
            s->n.graph_warmups[s->kind]++;
        s->last_warmup = 1;
        return 1;
    }
    return transition;
}

void spec_step_done(spec_step_t *s, const sched_batch_t *b)
{
    if (!s)
        return;
    const int64_t t0 = now_ns();
    s->last_kind = s->kind;
    s->last_rows = b->n == b->n_decode ? b->n : 0;   /* a step with prompt rows is no verify cost */
    s->last_tokens = b->n;
    for (int i = 0; i < b->n; i++)
        s->last_tokens += s->n_drafts[i];
    /* Its cell: without a distribution every row asked the same length, which is what the policy
     * decides, so the cell is that ask (the rows the proposer found nothing for, or the draft
     * budget cut, are in its emitted tokens); with one the policy decides a confidence, and the
     * cell is the drafts verified per row (rounded, at least 1 when drafts were asked: a step
     * that asked and kept none still paid for drafting, and is not the plain step of k = 0). */
    const int rows = b->n > 0 ? b->n : 1, mean = (s->last_tokens - b->n + rows / 2) / rows;
    s->last_k = !s->has_dist ? s->step_asked : s->step_asked == 0 ? 0 : mean > 1 ? mean : 1;
    /* a step that did not verify emitted a token per row */
    s->last_emitted = s->step_emitted >= 0 ? s->step_emitted : b->n;
    s->last_skip = s->last_rows > 0 && s_unlike(s, b, s->step_emitted >= 0, s->step_asked > 0);
    s->n.host_seconds += (double)(now_ns() - t0) / 1e9;
}

static void s_cycle(spec_step_t *s, double seconds)
{
    const int kind = s->last_kind;
    if (kind >= 0 && s->last_rows >= 1) {
        s->n.steps[kind]++;
        s->n.seconds[kind] += seconds;
    }
    s->last_kind = -1;
    if (!s->policy || s->last_rows < 1)
        return;
    /* every decode-only cycle, left out of the cost table or not: the budget is of time spent */
    spec_client_cycle(s->policy, kind == SPEC_STEP_EXPLORE, seconds);
    if (s->last_rows == 1 && seconds > 1e-3)
        s->slow1[s->last_k > 0]++;
    if (s->last_rows == 1 && s->last_k == 0) {   /* where the batch-1 plain cell's time goes */
        if (s->last_prev_asked) {
            s->plain1_after_s += seconds;
            s->plain1_after++;
        } else {
            s->plain1_stretch_s += seconds;
            s->plain1_stretch++;
        }
    }
    /* A plain cycle far slower than the bucket's plain steps paid for something else (the
     * prefill on the same GPU, hand-offs coming in: engine/spec_policy.h spec_plain_guard_slow). */
    if (s->last_k == 0 && !s->last_warmup &&
        spec_plain_guard_slow(&s->plain_guard[spec_cost_bucket(s->last_rows)], seconds) && !s->last_skip) {
        s->n.plain_slow++;
        s->last_skip = 1;
    }
    if (s->last_skip)
        s->skipped_steps++;
    else
        spec_client_step(s->policy, s->last_rows, s->last_k, s->last_emitted, seconds);
    s->last_rows = 0;
}

void spec_step_cycle(spec_step_t *s, double seconds)
{
    if (!s)
        return;
    const int64_t t0 = now_ns();
    s_cycle(s, seconds);
    s->n.host_seconds += (double)(now_ns() - t0) / 1e9;
}

void spec_step_forget(spec_step_t *s, uint64_t id)
{
    if (s)
        spec_forget(s->proposer, id);
}

void spec_step_counts(const spec_step_t *s, spec_step_counts_t *out)
{
    *out = s ? s->n : (spec_step_counts_t){0};
}

void spec_step_stats(const spec_step_t *s, actor_t *a, msg_stats_t *st)
{
    if (!s)
        return;
    /* Where the time goes, by step kind: a worker whose policy is off runs off steps (whose
     * proposer calls must stay 0) and exploration steps, whose proposer time is its upkeep. */
    static const char *const kinds[SPEC_STEP_KINDS] = {"off", "explore", "drafting"};
    char name[64];
    for (int k = 0; k < SPEC_STEP_KINDS; k++) {
        snprintf(name, sizeof name, "spec_%s_steps_total", kinds[k]);
        actor_stat_metric(a, st, name, (double)s->n.steps[k], 1);
        snprintf(name, sizeof name, "spec_%s_seconds_total", kinds[k]);
        actor_stat_metric(a, st, name, s->n.seconds[k], 1);
    }
    actor_stat_metric(a, st, "spec_upkeep_seconds_total",
                      s->n.proposer_seconds[SPEC_STEP_OFF] + s->n.proposer_seconds[SPEC_STEP_EXPLORE], 1);
    actor_stat_metric(a, st, "spec_upkeep_calls_total",
                      (double)(s->n.proposer_calls[SPEC_STEP_OFF] + s->n.proposer_calls[SPEC_STEP_EXPLORE]), 1);
    actor_stat_metric(a, st, "spec_off_proposer_calls_total", (double)s->n.proposer_calls[SPEC_STEP_OFF], 1);
    actor_stat_metric(a, st, "spec_explore_graph_warmups_total", (double)s->n.graph_warmups[SPEC_STEP_EXPLORE], 1);
    actor_stat_metric(a, st, "spec_host_seconds_total", s->n.host_seconds, 1);
    actor_stat_metric(a, st, "spec_verify_steps_total", (double)s->stats.verify_steps, 1);
    actor_stat_metric(a, st, "spec_draft_tokens_total", (double)s->stats.drafts, 1);
    actor_stat_metric(a, st, "spec_accepted_tokens_total", (double)s->stats.accepted, 1);
    actor_stat_metric(a, st, "spec_acceptance_rate", spec_stats_acceptance(&s->stats), 0);
    actor_stat_metric(a, st, "spec_mean_accepted_length", spec_stats_mean_len(&s->stats), 0);
    actor_stat_metric(a, st, "spec_padded_steps_total", (double)s->padded_steps, 1);
    actor_stat_metric(a, st, "spec_pad_positions_total", (double)s->pad_positions, 1);
    actor_stat_metric(a, st, "spec_cost_steps_skipped_total", (double)s->skipped_steps, 1);
    actor_stat_metric(a, st, "spec_cost_plain_slow_total", (double)s->n.plain_slow, 1);
    /* one-row plain steps: after a drafting step and inside a plain stretch, count and mean cycle */
    actor_stat_metric(a, st, "spec_plain1_after_draft_steps_total", (double)s->plain1_after, 1);
    actor_stat_metric(a, st, "spec_plain1_after_draft_ms", s->plain1_after ? 1e3 * s->plain1_after_s / (double)s->plain1_after : 0, 0);
    actor_stat_metric(a, st, "spec_plain1_in_stretch_steps_total", (double)s->plain1_stretch, 1);
    actor_stat_metric(a, st, "spec_plain1_in_stretch_ms", s->plain1_stretch ? 1e3 * s->plain1_stretch_s / (double)s->plain1_stretch : 0, 0);
    actor_stat_metric(a, st, "spec_plain1_slow_steps_total", (double)s->slow1[0], 1);
    actor_stat_metric(a, st, "spec_draft1_slow_steps_total", (double)s->slow1[1], 1);
    if (s->borrowed && !s->mtp) {
        spec_draft_stats_t ds;
        spec_draft_stats(s->proposer, &ds);
        actor_stat_metric(a, st, "spec_draft_forwards_total", (double)ds.forwards, 1);
        actor_stat_metric(a, st, "spec_draft_positions_total", (double)ds.tokens, 1);
        actor_stat_metric(a, st, "spec_draft_windows_total", (double)ds.windows, 1);
        actor_stat_metric(a, st, "spec_draft_seconds_total", (double)ds.ns / 1e9, 1);   /* proposals' wall time */
    }
    if (s->mtp) {
        spec_mtp_stats_t ms;
        spec_mtp_stats(s->proposer, &ms);
        actor_stat_metric(a, st, "spec_mtp_forwards_total", (double)ms.forwards, 1);
        actor_stat_metric(a, st, "spec_mtp_positions_total", (double)ms.rows, 1);
        actor_stat_metric(a, st, "spec_mtp_sequences_begun_total", (double)ms.starts, 1);
        actor_stat_metric(a, st, "spec_mtp_begun_late_total", (double)ms.started_late, 1);
        actor_stat_metric(a, st, "spec_mtp_evicted_total", (double)ms.evicted, 1);
        actor_stat_metric(a, st, "spec_mtp_padded_forwards_total", (double)ms.padded, 1);
        actor_stat_metric(a, st, "spec_mtp_logits_copies_total", (double)ms.logits_copies, 1);
        actor_stat_metric(a, st, "spec_mtp_feed_seconds_total", ms.feed_seconds, 1);
        actor_stat_metric(a, st, "spec_mtp_propose_seconds_total", ms.propose_seconds, 1);
    }
    if (s->policy)
        spec_client_stats(s->policy, a, st);
}
