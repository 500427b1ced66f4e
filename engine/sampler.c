/* engine/sampler.c — logits processing, seeded sampling, stop conditions. Semantics: sampler.h.
 *
 * The request's state (penalties, the RNG counter, stop strings) lives here; steps 3-7 on the
 * penalised row are the `sample` op's CPU reference, cpu_sample_row (kernels/cpu/cpu_sample.c),
 * the function the device kernels are checked against. No step allocates. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/spec.h"
#include "kernels/cpu/cpu_sample.h"

struct sampler {
    sampler_params_t p;
    int vocab;
    int n_generated;
    float *work;                  /* [vocab] processed logits */
    float *mass;                  /* [vocab] exp(l - max) of candidates, indexed by token */
    int32_t *idx;                 /* [vocab] candidate token ids */
    uint8_t *in_prompt;           /* [vocab] 1 if the token is in the prompt */
    int32_t *count;               /* [vocab] times generated */
    int32_t *seen;                /* [vocab] distinct tokens of prompt + output, to penalise */
    int n_seen;
    char stops[SAMPLER_MAX_STOPS][SAMPLER_MAX_STOP_LEN + 1];
    size_t stop_len[SAMPLER_MAX_STOPS];
    size_t max_stop;              /* longest stop string */
    char *pend;                   /* [pend_cap] text held back */
    size_t n_pend, pend_cap;
    int stopped;                  /* a stop string matched: ignore further text */
};

const char *finish_reason_name(finish_reason_t r)
{
    static const char *const names[] = {"none", "stop", "length"};
    return (unsigned)r < 3 ? names[r] : "?";
}

void sampler_params_default(sampler_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->top_p = 1.0;
    p->repetition_penalty = 1.0;
}

int sampler_params_check(const sampler_params_t *p, int vocab_size, char *err, size_t errlen)
{
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return errf(err, errlen, "sampling: temperature %g must be >= 0", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return errf(err, errlen, "sampling: top_p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return errf(err, errlen, "sampling: min_p %g must be in [0, 1]", p->min_p);
    if (!(p->repetition_penalty > 0) || !isfinite(p->repetition_penalty))
        return errf(err, errlen, "sampling: repetition_penalty %g must be > 0", p->repetition_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return errf(err, errlen, "sampling: presence_penalty %g must be in [-2, 2]", p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return errf(err, errlen, "sampling: frequency_penalty %g must be in [-2, 2]", p->frequency_penalty);
    if (p->n_eos < 0 || p->n_eos > SAMPLER_MAX_EOS)
        return errf(err, errlen, "sampling: %d EOS ids (at most %d)", p->n_eos, SAMPLER_MAX_EOS);
    if (p->n_stop_ids < 0 || p->n_stop_ids > SAMPLER_MAX_STOP_IDS)
        return errf(err, errlen, "sampling: %d stop ids (at most %d)", p->n_stop_ids, SAMPLER_MAX_STOP_IDS);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= vocab_size)
            return errf(err, errlen, "sampling: stop id %d outside the vocabulary [0, %d)", p->stop_ids[i], vocab_size);
    if (p->n_stops < 0 || p->n_stops > SAMPLER_MAX_STOPS)
        return errf(err, errlen, "sampling: %d stop strings (at most %d)", p->n_stops, SAMPLER_MAX_STOPS);
    for (int i = 0; i < p->n_stops; i++) {
        size_t n = p->stops[i] ? strlen(p->stops[i]) : 0;
        if (n == 0)
            return errf(err, errlen, "sampling: stop string %d is empty", i);
        if (n > SAMPLER_MAX_STOP_LEN)
            return errf(err, errlen, "sampling: stop string %d is %zu bytes (at most %d)", i, n, SAMPLER_MAX_STOP_LEN);
    }
    if (p->logprobs_mode != SAMPLER_LOGPROBS_RAW && p->logprobs_mode != SAMPLER_LOGPROBS_PROCESSED)
        return errf(err, errlen, "sampling: logprobs mode %d unknown", (int)p->logprobs_mode);
    return 0;
}

static void s_mark_seen(sampler_t *s, int32_t t)
{
    if (!s->in_prompt[t] && s->count[t] == 0)
        s->seen[s->n_seen++] = t;
}

sampler_t *sampler_new(const sampler_params_t *p, int vocab_size, const int32_t *prompt, int n_prompt, char *err,
                       size_t errlen)
{
    if (vocab_size < 1)
        return errf(err, errlen, "sampling: vocabulary size %d", vocab_size), NULL;
    if (sampler_params_check(p, vocab_size, err, errlen) < 0)
        return NULL;
    sampler_t *s = calloc(1, sizeof(*s));
    if (!s)
        return errf(err, errlen, "sampling: out of memory"), NULL;
    s->p = *p;
    s->vocab = vocab_size;
    size_t v = (size_t)vocab_size;
    s->work = malloc(v * sizeof(float));
    s->mass = malloc(v * sizeof(float));
    s->idx = malloc(v * sizeof(int32_t));
    s->in_prompt = calloc(v, 1);
    s->count = calloc(v, sizeof(int32_t));
    s->seen = malloc(v * sizeof(int32_t));
    for (int i = 0; i < p->n_stops; i++) {
        s->stop_len[i] = strlen(p->stops[i]);
        memcpy(s->stops[i], p->stops[i], s->stop_len[i] + 1);
        s->p.stops[i] = s->stops[i];
        s->max_stop = s->stop_len[i] > s->max_stop ? s->stop_len[i] : s->max_stop;
    }
    s->pend_cap = 2 * s->max_stop + 256;
    s->pend = malloc(s->pend_cap);
    if (!s->work || !s->mass || !s->idx || !s->in_prompt || !s->count || !s->seen || !s->pend) {
        sampler_destroy(&s);
        return errf(err, errlen, "sampling: out of memory for a vocabulary of %d", vocab_size), NULL;
    }
    for (int i = 0; i < n_prompt; i++) {
        int32_t t = prompt[i];
        if (t < 0 || t >= vocab_size) {
            sampler_destroy(&s);
            return errf(err, errlen, "sampling: prompt token %d at %d outside the vocabulary [0, %d)", t, i, vocab_size), NULL;
        }
        s_mark_seen(s, t);
        s->in_prompt[t] = 1;
    }
    return s;
}

void sampler_destroy(sampler_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    sampler_t *s = *self_p;
    free(s->work);
    free(s->mass);
    free(s->idx);
    free(s->in_prompt);
    free(s->count);
    free(s->seen);
    free(s->pend);
    free(s);
    *self_p = NULL;
}

int sampler_n_generated(const sampler_t *s) { return s->n_generated; }

/* ---- sampling ---------------------------------------------------------------------------- */

static void s_penalise(sampler_t *s)
{
    const double rep = s->p.repetition_penalty, pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    if (rep == 1.0 && pres == 0.0 && freq == 0.0)
        return;
    for (int i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        float l = s->work[t];
        if (rep != 1.0)
            l = l < 0 ? (float)(l * rep) : (float)(l / rep);
        if (s->count[t] > 0)
            l = (float)(l - (freq * s->count[t] + pres));
        s->work[t] = l;
    }
}

int sampler_draws(const sampler_t *s) { return s->p.temperature > 0; }

int sampler_is_greedy(const sampler_t *s)
{
    return s->p.temperature == 0 && s->p.repetition_penalty == 1.0 && s->p.presence_penalty == 0 &&
           s->p.frequency_penalty == 0;
}

void sampler_device_params(const sampler_t *s, bk_sample_t *out)
{
    *out = (bk_sample_t){.temperature = s->p.temperature, .top_k = s->p.top_k, .top_p = s->p.top_p,
                         .min_p = s->p.min_p, .seed = s->p.seed, .step = (uint64_t)s->n_generated};
}

int sampler_needs_host(const sampler_t *s)
{
    return s->p.repetition_penalty != 1.0 || s->p.presence_penalty != 0 || s->p.frequency_penalty != 0;
}

int32_t sampler_sample(sampler_t *s, const float *logits, float *logprob)
{
    const int V = s->vocab;
    memcpy(s->work, logits, (size_t)V * sizeof(float));
    s_penalise(s);
    bk_sample_t sp;
    sampler_device_params(s, &sp);
    float lp_processed = 0;
    const int want = logprob && s->p.logprobs_mode == SAMPLER_LOGPROBS_PROCESSED;
    int32_t tok = cpu_sample_row(s->work, V, &sp, s->work, s->mass, s->idx, want ? &lp_processed : NULL);
    if (logprob)
        *logprob = s->p.logprobs_mode == SAMPLER_LOGPROBS_RAW ? cpu_log_softmax_at(logits, V, tok) : lp_processed;
    return tok;
}

/* Puts token t of value v into out's ranking of at most n (larger first; the tokens come in
 * ascending id, so an equal value ranks after those already in: the lower id first on ties). */
static void s_top_insert(sampler_top_t *out, int n, int32_t t, float v)
{
    if (out->n == n && !(v > out->logprobs[n - 1]))
        return;
    int p = out->n < n ? out->n++ : n - 1;
    for (; p > 0 && v > out->logprobs[p - 1]; p--) {
        out->ids[p] = out->ids[p - 1];
        out->logprobs[p] = out->logprobs[p - 1];
    }
    out->ids[p] = t;
    out->logprobs[p] = v;
}

/* The n best of row [V] by value, raw values: only finite ones (a NaN or an infinity has no
 * log-probability a message can carry), and with skip_zero only positive ones. */
static void s_top_rank(const float *row, int V, int n, int skip_zero, sampler_top_t *out)
{
    out->n = 0;
    for (int i = 0; i < V; i++)
        if (isfinite(row[i]) && (!skip_zero || row[i] > 0))
            s_top_insert(out, n, i, row[i]);
}

/* out's values (entries of row) as log_softmax(row), each as cpu_log_softmax_at computes it;
 * a NaN is left out of the sum (where cpu_log_softmax_at gives NaN for every token). */
static void s_top_log_softmax(const float *row, int V, sampler_top_t *out)
{
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++)
        if (row[i] == row[i])
            sum += exp((double)row[i] - mx);
    for (int k = 0; k < out->n; k++)
        out->logprobs[k] = (float)((double)row[out->ids[k]] - mx - log(sum));
}

int sampler_top_logprobs(sampler_t *s, const float *logits, int n, sampler_top_t *out)
{
    const int V = s->vocab;
    n = n < 0 ? 0 : n > SAMPLER_MAX_TOP ? SAMPLER_MAX_TOP : n;
    n = n < V ? n : V;
    out->n = 0;
    if (n == 0)
        return 0;
    if (s->p.logprobs_mode == SAMPLER_LOGPROBS_RAW) {
        s_top_rank(logits, V, n, 0, out);
        s_top_log_softmax(logits, V, out);
        return out->n;
    }
    memcpy(s->work, logits, (size_t)V * sizeof(float));
    s_penalise(s);
    if (s->p.temperature == 0) {   /* greedy: sampler_sample's processed logprob is this softmax */
        s_top_rank(s->work, V, n, 0, out);
        s_top_log_softmax(s->work, V, out);
        return out->n;
    }
    bk_sample_t sp;
    sampler_device_params(s, &sp);
    const double total = cpu_sample_mass(s->work, V, &sp, s->work, s->mass, s->idx);
    s_top_rank(s->work, V, n, 1, out);   /* the masses: a dropped token has 0 and is never drawn */
    for (int k = 0; k < out->n; k++)
        out->logprobs[k] = (float)log(s->work[out->ids[k]] / total);
    return out->n;
}

int32_t sampler_verify_draft(sampler_t *s, const float *logits, int32_t draft, float *logprob, int *accepted)
{
    int32_t tok = sampler_sample(s, logits, logprob);
    *accepted = draft >= 0 && tok == draft;
    return tok;
}

int32_t sampler_verify_dist(sampler_t *s, const float *logits, int32_t draft, const float *q, float *logprob,
                            int *accepted)
{
    if (draft < 0 || !q)
        return sampler_verify_draft(s, logits, draft, logprob, accepted);
    const int V = s->vocab;
    memcpy(s->work, logits, (size_t)V * sizeof(float));
    s_penalise(s);
    bk_sample_t sp;
    sampler_device_params(s, &sp);
    const double total = cpu_sample_mass(s->work, V, &sp, s->work, s->mass, s->idx);
    const int32_t tok = spec_accept_mass(s->work, total, q, V, draft, spec_rng_uniform(sp.seed, SPEC_RNG_ACCEPT, sp.step),
                                         spec_rng_uniform(sp.seed, SPEC_RNG_RESAMPLE, sp.step), accepted);
    if (logprob)
        *logprob = s->p.logprobs_mode == SAMPLER_LOGPROBS_RAW ? cpu_log_softmax_at(logits, V, tok)
                                                              : (float)log(s->work[tok] / total);
    return tok;
}

finish_reason_t sampler_accept(sampler_t *s, int32_t token)
{
    if (token >= 0 && token < s->vocab) {
        s_mark_seen(s, token);
        s->count[token]++;
    }
    s->n_generated++;
    for (int i = 0; i < s->p.n_stop_ids; i++)
        if (token == s->p.stop_ids[i])
            return FINISH_STOP;
    if (!s->p.ignore_eos)
        for (int i = 0; i < s->p.n_eos; i++)
            if (token == s->p.eos_ids[i])
                return FINISH_STOP;
    if (s->p.max_tokens > 0 && s->n_generated >= s->p.max_tokens)
        return FINISH_LENGTH;
    return FINISH_NONE;
}

/* ---- stop strings ------------------------------------------------------------------------ */

/* Length of the longest suffix of pend that is a proper prefix of some stop string. */
static size_t s_held_suffix(const sampler_t *s)
{
    size_t best = 0;
    for (int i = 0; i < s->p.n_stops; i++) {
        size_t L = s->stop_len[i];
        size_t max = L - 1 < s->n_pend ? L - 1 : s->n_pend;
        for (size_t k = max; k > best; k--)
            if (memcmp(s->pend + s->n_pend - k, s->stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

int sampler_text(sampler_t *s, const char *text, size_t len, void (*emit)(void *ctx, const char *t, size_t n), void *ctx)
{
    if (s->stopped)
        return 1;
    if (s->p.n_stops == 0) {
        if (len)
            emit(ctx, text, len);
        return 0;
    }
    while (len > 0) {
        size_t room = s->pend_cap - s->n_pend, take = len < room ? len : room;
        memcpy(s->pend + s->n_pend, text, take);
        s->n_pend += take;
        text += take;
        len -= take;
        /* The earliest occurrence of any stop string in the held text. */
        const char *first = NULL;
        for (int i = 0; i < s->p.n_stops; i++) {
            const char *at = memmem(s->pend, s->n_pend, s->stops[i], s->stop_len[i]);
            if (at && (!first || at < first))
                first = at;
        }
        if (first) {
            if (first > s->pend)
                emit(ctx, s->pend, (size_t)(first - s->pend));
            s->n_pend = 0;
            s->stopped = 1;
            return 1;
        }
        size_t keep = s_held_suffix(s), out = s->n_pend - keep;
        if (out) {
            emit(ctx, s->pend, out);
            memmove(s->pend, s->pend + out, keep);
            s->n_pend = keep;
        }
    }
    return 0;
}

void sampler_text_flush(sampler_t *s, void (*emit)(void *ctx, const char *t, size_t n), void *ctx)
{
    if (!s->stopped && s->n_pend)
        emit(ctx, s->pend, s->n_pend);
    s->n_pend = 0;
}
