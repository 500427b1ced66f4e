/* tools/generate/decode.c — troupe-generate's decode loop (gen.h): token by token, or with
 * speculation a verify step over the last token and the proposer's drafts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/mtp.h"
#include "tools/generate/gen.h"

void gen_emit(void *ctx, const char *t, size_t n)
{
    out_ctx_t *o = ctx;
    if (!o->json) {
        fwrite(t, 1, n, stdout);
        fflush(stdout);
        return;
    }
    if (o->n + n + 1 > o->cap) {                   /* rare: sized for the common case up front */
        size_t cap = (o->n + n + 1) * 2;
        char *p = realloc(o->text, cap);
        if (!p)
            return;
        o->text = p;
        o->cap = cap;
    }
    memcpy(o->text + o->n, t, n);
    o->n += n;
    o->text[o->n] = 0;
}

/* Streams token t's text (or, without a tokenizer and not --json, its id); 1 when a stop string
 * completed. */
static int s_stream(gen_t *g, tok_stream_t *ts, int32_t t)
{
    if (g->tok) {
        size_t nt = 0;
        return tok_stream_feed(ts, t, g->tbuf, g->tcap, &nt) == 0 && nt && sampler_text(g->smp, g->tbuf, nt, gen_emit, &g->out);
    }
    if (!g->out.json) {
        int nt = snprintf(g->tbuf, g->tcap, "%s%d", g->n_out > 1 ? " " : "", t);
        gen_emit(&g->out, g->tbuf, (size_t)nt);
    }
    return 0;
}

/* Records token t (log-probability lp): the output, the sampler's counters, the stream. 1 when
 * the request finished with it. */
static int s_take(gen_t *g, tok_stream_t *ts, int32_t t, float lp)
{
    if (g->all)
        g->all[g->n_prompt + (size_t)g->n_out] = t;
    g->out_ids[g->n_out] = t;
    g->lps[g->n_out++] = lp;
    g->fin = sampler_accept(g->smp, t);
    if (g->fin != FINISH_STOP && s_stream(g, ts, t))   /* EOS or a stop id is not printed */
        g->fin = FINISH_STOP;
    return g->fin != FINISH_NONE;
}

/* Up to K drafts after the output so far; 0: decode the plain way. q rows (spec_dist) when the
 * draft model sampled them. */
static int s_drafts(const gen_opts_t *o, gen_t *g, int32_t *drafts, const float **q)
{
    int k = o->spec_k < g->max_tokens - g->n_out ? o->spec_k : g->max_tokens - g->n_out;   /* the KV's room */
    const int n = (int)g->n_prompt + g->n_out;
    for (int i = 0; i < k; i++)
        q[i] = NULL;
    if (k <= 0)
        return 0;
    if (!g->prop)
        return spec_ngram_propose(g->all, n, 1, 3, k, drafts);
    bk_sample_t sp;
    sampler_device_params(g->smp, &sp);
    spec_ask_t a = {.id = 1, .tokens = g->all, .n = n, .k = k, .sample = sampler_draws(g->smp) ? &sp : NULL,
                    .drafts = drafts};
    spec_propose_batch(g->prop, &a, 1);
    for (int i = 0; i < a.n_drafts; i++)
        q[i] = spec_dist(g->prop, 1, i);
    return a.n_drafts;
}

/* Sample, stream, stop or run the next step. Greedy without log-probabilities: decode steps bring
 * back the device's argmax, not logits. With speculation, a step that has drafts verifies them:
 * one forward over the last token and the drafts, every position's logits, the target's token at
 * each position in order (sampler_verify_draft, or sampler_verify_dist for a draft distribution)
 * until one disagrees or the request ends; the KV of the rejected drafts is rolled back. */
int gen_decode(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    tok_stream_t ts;
    if (g->tok) {
        tok_stream_init(&ts, g->tok);
        ts.skip_special = 1;                       /* as vLLM's skip_special_tokens default */
    }
    const int device_greedy = sampler_is_greedy(g->smp) && !o->logprobs;
    const size_t V = (size_t)g->e->cfg.vocab_size;
    int32_t dev_tok = 0, drafts[SPEC_MAX_K];
    const float *q[SPEC_MAX_K];
    g->fin = FINISH_NONE;
    float lp = 0;
    int32_t t = sampler_sample(g->smp, g->e->logits, o->logprobs ? &lp : NULL);
    while (!s_take(g, &ts, t, lp)) {
        if (g->hid && g->hid_n > 0) {               /* the last step's rows whose tokens are final */
            const spec_mtp_feed_t f = {.id = 1, .tokens = g->all, .n_tokens = (int)g->n_prompt + g->n_out,
                                       .pos0 = g->hid_pos, .n = g->hid_n, .hidden = g->hid,
                                       .sampled = sampler_draws(g->smp)};
            if (spec_mtp_feed_batch(g->prop, &f, 1, err, sizeof err) < 0)
                return gen_fail(1, "mtp", err);
        }
        const int r = o->spec != SPEC_OFF ? s_drafts(o, g, drafts, q) : 0;
        const int base = kvseq_len(g->seq);
        model_seq_t qs = {.kv = g->seq, .n_new = 1 + r};
        model_batch_t b = {.n_seqs = 1, .seqs = &qs, .argmax_out = device_greedy && !r ? &dev_tok : NULL,
                           .all_logits = r > 0, .hidden_out = g->hid};
        g->hid_pos = base;
        g->hid_n = 1;
        if (kvseq_append(g->seq, &t, 1) < 0 || (r && kvseq_append(g->seq, drafts, r) < 0) ||
            model_forward(g->e->model, &b, g->e->logits, err, sizeof err) < 0) {
            fprintf(stderr, "troupe-generate: decode step %d: %s\n", g->n_out, err);
            return 1;
        }
        g->n_decode_steps++;
        if (!r) {
            lp = 0;
            t = device_greedy ? dev_tok : sampler_sample(g->smp, g->e->logits, o->logprobs ? &lp : NULL);
            continue;
        }
        /* Verify: position j's logits check draft j; the last position (j == r) has no draft. */
        int j = 0, acc = 0;
        for (;; j++) {
            lp = 0;
            t = sampler_verify_dist(g->smp, g->e->logits + (size_t)j * V, j < r ? drafts[j] : -1, j < r ? q[j] : NULL,
                                    o->logprobs ? &lp : NULL, &acc);
            if (!acc || j == r)
                break;
            if (s_take(g, &ts, t, lp))
                break;                             /* finished on an accepted draft */
        }
        g->spec.verify_steps++;
        g->spec.drafts += (uint64_t)r;
        g->spec.accepted += (uint64_t)j;
        g->spec.emitted += (uint64_t)(j + (g->fin == FINISH_NONE));
        g->hid_n = 1 + j;                         /* the input row and the accepted drafts' rows */
        if (g->prop)
            spec_accepted(g->prop, 1, r, j);
        /* The KV keeps the step's input and the accepted drafts; t (the target's own token, not
         * yet taken) is the next step's input. */
        if (kvseq_truncate(g->seq, base + 1 + j) != 0)
            return gen_fail(1, "speculation", "cannot roll the KV back");
        if (g->fin != FINISH_NONE)
            break;
    }
    if (g->tok) {
        size_t nt = 0;
        if (tok_stream_flush(&ts, g->tbuf, g->tcap, &nt) == 0 && nt)
            sampler_text(g->smp, g->tbuf, nt, gen_emit, &g->out);
        sampler_text_flush(g->smp, gen_emit, &g->out);
    }
    return 0;
}
