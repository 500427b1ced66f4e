/* engine/spec_draft.c — the draft-model proposer: a second, smaller checkpoint with the target's
 * tokenizer guesses the next k tokens, greedy or sampled. Semantics: engine/spec.h.
 *
 * Each sequence keeps a kvseq in the draft's own pool. A proposal first brings it in step with
 * the sequence (the tokens it lacks: the whole prompt the first time, then the last accepted draft
 * and the target's own token; at most the last max_catch_up tokens when the ask says so, a window
 * whose positions start at 0), all sequences in one forward (chunked by max_tokens), and then
 * runs one forward per draft position for every sequence still drafting, each appending its
 * previous draft. The last draft is never computed: the target may reject it, and if it is kept
 * the next catch-up computes it with the target's token. */
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
    bk_sample_t sp = *a->sample;
    sp.step += (uint64_t)j;        /* draft j stands at the target's step + j */
    const double total = cpu_sample_mass(logits, d->V, &sp, d->work, d->mass, d->idx);
    float *q = s->q + (size_t)j * (size_t)d->V;
    const double u = spec_rng_uniform(sp.seed, SPEC_RNG_DRAFT, sp.step) * total;
    double acc = 0;
    int32_t x = -1, last = d->idx[0];
    for (int t = 0; t < d->V; t++) {
        q[t] = (float)(d->work[t] / total);
        if (d->work[t] > 0)
            last = t;
        acc += d->work[t];
        if (x < 0 && acc > u)
            x = t;
    }
    if (x < 0)
        x = last;
    if (a->probs)
        a->probs[j] = q[x];
    return x;
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
        /* A window asked no more: the whole sequence again. */
        if (s->off > 0 && a->max_catch_up <= 0) {
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
static void s_accepted(spec_proposer_t *p, uint64_t id, int n_accepted)
{
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
    if (u64map_init(&d->by_id, 64) != 0 || !d->rows || !d->argmax || !d->need || !d->which || !d->seq || !d->pend ||
        !d->kk || !d->work || !d->mass || !d->idx) {
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
