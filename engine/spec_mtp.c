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
 * the target accepts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/model_internal.h"   /* the target's max_tokens, for the hidden-state buffer */
#include "engine/mtp.h"

static const spec_proposer_ops_t s_ops;   /* below: tells an MTP proposer from another */

#define PEND_MAX (SPEC_MAX_K + 2)   /* fed rows waiting for their next token */
#define MTP_BLOCK 16                /* the MTP pool's tokens per block */

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
} s_seq_t;

typedef struct {
    model_t *m;
    kvpool_t *pool;
    int max_seqs, max_context, chunk, H, V;
    s_seq_t *seqs;
    float *logits;                 /* [V] */
    float *hid_out;                /* [chunk][H] */
    float *target_hid;             /* [max_tokens][H] spec_mtp_hidden_buffer */
    int target_rows;
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
    if (!make || !free_slot)
        return NULL;
    free_slot->used = 1;
    free_slot->id = id;
    free_slot->n_pend = 0;
    free_slot->base = 0;
    kvseq_release(free_slot->kv);
    return free_slot;
}

/* Runs the MTP layer over n new positions of s: MTP tokens toks[0..n) (target tokens len+1 ..),
 * hidden rows hid [n][H], in chunks; keeps the last row's output, argmax and probability. */
static int s_run(s_mtp_t *t, s_seq_t *s, const int32_t *toks, const float *hid, int n, char *err, size_t errlen)
{
    for (int done = 0; done < n;) {
        const int c = n - done < t->chunk ? n - done : t->chunk;
        if (kvseq_append(s->kv, toks + done, c) < 0)
            return errf(err, errlen, "mtp: sequence %llu: no room in the MTP KV (%d positions)",
                        (unsigned long long)s->id, kvseq_len(s->kv) + c);
        model_seq_t q = {.kv = s->kv, .n_new = c};
        model_batch_t b = {.n_seqs = 1, .seqs = &q};
        if (model_mtp_forward(t->m, &b, hid + (size_t)done * t->H, t->logits, t->hid_out, err, errlen) < 0) {
            kvseq_truncate(s->kv, kvseq_len(s->kv) - c);
            return -1;
        }
        t->st.forwards++;
        t->st.rows += (uint64_t)c;
        done += c;
        memcpy(s->last_hid, t->hid_out + (size_t)(c - 1) * t->H, (size_t)t->H * sizeof(float));
        int best = 0;
        for (int v = 1; v < t->V; v++)
            best = t->logits[v] > t->logits[best] ? v : best;
        double sum = 0;
        for (int v = 0; v < t->V; v++)
            sum += exp((double)t->logits[v] - t->logits[best]);
        s->last_draft = best;
        s->last_prob = (float)(1.0 / sum);
    }
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
    if (s_run(t, s, tokens + have + 1, s->pend, ready, err, errlen) < 0)
        return -1;
    s->n_pend -= ready;
    memmove(s->pend, s->pend + (size_t)ready * t->H, (size_t)s->n_pend * t->H * sizeof(float));
    return 0;
}

int spec_mtp_feed(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n_tokens, int pos0, int n,
                  const float *hidden, char *err, size_t errlen)
{
    s_mtp_t *t = p->impl;
    if (pos0 < 0 || n < 0 || pos0 + n > n_tokens)
        return errf(err, errlen, "mtp: sequence %llu: hidden states of positions %d..%d, %d tokens known",
                    (unsigned long long)id, pos0, pos0 + n - 1, n_tokens);
    s_seq_t *s = s_find(t, id, 1);
    if (!s)
        return errf(err, errlen, "mtp: more than %d sequences", t->max_seqs);
    const int fresh = kvseq_len(s->kv) == 0 && s->n_pend == 0;
    if (s_advance(t, s, tokens, n_tokens, err, errlen) < 0)
        return -1;
    int next = s_have(s) + s->n_pend;                   /* the first position not had yet */
    if (fresh || pos0 > next) {                         /* begins here (engine/mtp.h) */
        if (n == 0)
            return 0;
        kvseq_release(s->kv);
        s->n_pend = 0;
        s->base = next = pos0;
        t->st.starts++;
        t->st.started_late += pos0 > 0;
    }
    if (pos0 + n <= next)
        return 0;
    const float *h = hidden + (size_t)(next - pos0) * t->H;
    int rows = pos0 + n - next;
    if (s->n_pend == 0) {                               /* straight from the caller's rows */
        const int have = s_have(s);
        int ready = n_tokens - 1 - have;
        ready = ready < rows ? ready : rows;
        if (ready > 0) {
            if (s_run(t, s, tokens + have + 1, h, ready, err, errlen) < 0)
                return -1;
            h += (size_t)ready * t->H;
            rows -= ready;
        }
    }
    if (s->n_pend + rows > PEND_MAX)
        return errf(err, errlen, "mtp: sequence %llu: %d hidden states wait for their tokens (at most %d)",
                    (unsigned long long)id, s->n_pend + rows, PEND_MAX);
    memcpy(s->pend + (size_t)s->n_pend * t->H, h, (size_t)rows * t->H * sizeof(float));
    s->n_pend += rows;
    return 0;
}

static int s_propose(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts,
                     float *probs)
{
    s_mtp_t *t = p->impl;
    s_seq_t *s = s_find(t, id, 0);
    char err[256];
    k = k < SPEC_MAX_K ? k : SPEC_MAX_K;
    if (!s || k < 1 || s_advance(t, s, tokens, n, err, sizeof err) < 0)
        return 0;
    const int len = kvseq_len(s->kv);
    if (len == 0 || s->base + len != n - 1 || len + k > t->max_context)
        return 0;                                       /* the target's h_{n-2} was not fed */
    /* The guess from position n-2, then chained positions n-1 .. on the MTP's own output. */
    float hid[2 * 8192], *save_hid = hid, *cur = hid + t->H;
    if (t->H > 8192)
        return 0;
    memcpy(save_hid, s->last_hid, (size_t)t->H * sizeof(float));
    const int32_t save_draft = s->last_draft;
    const float save_prob = s->last_prob;
    int r = 0;
    drafts[r] = s->last_draft;
    if (probs)
        probs[r] = s->last_prob;
    for (r = 1; r < k; r++) {
        memcpy(cur, s->last_hid, (size_t)t->H * sizeof(float));
        if (s_run(t, s, &drafts[r - 1], cur, 1, err, sizeof err) < 0)
            break;
        drafts[r] = s->last_draft;
        if (probs)
            probs[r] = s->last_prob;
    }
    kvseq_truncate(s->kv, len);                         /* never published: always allowed */
    memcpy(s->last_hid, save_hid, (size_t)t->H * sizeof(float));
    s->last_draft = save_draft;
    s->last_prob = save_prob;
    return r;
}

static void s_forget(spec_proposer_t *p, uint64_t id)
{
    s_mtp_t *t = p->impl;
    s_seq_t *s = s_find(t, id, 0);
    if (s) {
        kvseq_release(s->kv);
        s->used = 0;
        s->n_pend = 0;
        s->base = 0;
    }
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
    }
    if (t) {
        free(t->seqs);
        kvpool_destroy(&t->pool);
        free(t->logits);
        free(t->hid_out);
        free(t->target_hid);
    }
    free(t);
    free(p);
}

static const spec_proposer_ops_t s_ops = {
    .name = "mtp", .propose = s_propose, .forget = s_forget, .destroy = s_destroy,
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
    t->target_rows = target->opts.max_tokens;
    t->chunk = t->target_rows < 64 ? t->target_rows : 64;   /* rows per MTP forward (<= the model's max_tokens) */
    t->H = c->hidden_size;
    t->V = c->vocab_size;
    t->seqs = calloc((size_t)t->max_seqs, sizeof *t->seqs);
    t->logits = malloc((size_t)t->V * sizeof(float));
    t->hid_out = malloc((size_t)t->chunk * t->H * sizeof(float));
    t->target_hid = malloc((size_t)t->target_rows * t->H * sizeof(float));
    if (!t->seqs || !t->logits || !t->hid_out || !t->target_hid)
        goto oom;
    if (!(t->pool = model_mtp_pool_new(target, (int)s_pool_blocks(t->max_seqs, t->max_context), MTP_BLOCK, DT_F32,
                                       err, errlen)))
        goto fail;
    for (int i = 0; i < t->max_seqs; i++) {
        s_seq_t *s = &t->seqs[i];
        s->kv = kvseq_new(t->pool, t->max_context + SPEC_MAX_K, 0);
        s->pend = malloc((size_t)PEND_MAX * t->H * sizeof(float));
        s->last_hid = malloc((size_t)t->H * sizeof(float));
        if (!s->kv || !s->pend || !s->last_hid)
            goto oom;
    }
    return p;
oom:
    errf(err, errlen, "mtp: out of memory");
fail:
    s_destroy(p);
    return NULL;
}
