/* engine/sampler.c — logits processing, seeded sampling, stop conditions. Semantics: sampler.h.
 *
 * Nothing is sorted: top-k is a quickselect, top-p a quickselect on probability mass (both
 * expected O(vocab), in place), min-p a filter, and the draw walks the kept tokens in ascending
 * token id (their masses scattered into a zeroed row: O(vocab), no sort). Ranks use one total
 * order — larger logit first, then lower index — so every choice is deterministic, and no step
 * allocates. Steps 3-7 (sampler_filter_draw) take a plain row and bk_sample_t, without the
 * request's penalty state: the CPU backend's `sample` op is that function, the reference the
 * device kernels are checked against. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/sampler_rng.h"

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

/* ---- ranking ----------------------------------------------------------------------------- */

static inline int s_before(const float *v, int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

/* Partitions idx[lo, hi) around a pivot; returns its final place m: idx[lo, m) rank before it. */
static int s_partition(const float *v, int32_t *idx, int lo, int hi)
{
    int mid = lo + (hi - lo) / 2;
    /* median of three as the pivot, moved to hi - 1 */
    int a = lo, b = mid, c = hi - 1, med;
    if (s_before(v, idx[a], idx[b]))
        med = s_before(v, idx[b], idx[c]) ? b : (s_before(v, idx[a], idx[c]) ? c : a);
    else
        med = s_before(v, idx[a], idx[c]) ? a : (s_before(v, idx[b], idx[c]) ? c : b);
    int32_t t = idx[med]; idx[med] = idx[hi - 1]; idx[hi - 1] = t;
    int32_t pv = idx[hi - 1];
    int m = lo;
    for (int i = lo; i < hi - 1; i++)
        if (s_before(v, idx[i], pv)) {
            t = idx[i]; idx[i] = idx[m]; idx[m] = t;
            m++;
        }
    t = idx[m]; idx[m] = idx[hi - 1]; idx[hi - 1] = t;
    return m;
}

/* Moves the k best of idx[0, n) to idx[0, k) (in no particular order). */
static void s_select(const float *v, int32_t *idx, int n, int k)
{
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int m = s_partition(v, idx, lo, hi);
        if (m == k || m + 1 == k)
            return;
        if (m > k)
            hi = m;
        else
            lo = m + 1;
    }
}

/* The smallest c such that the c best of idx[0, n) hold >= target of the mass; moves them to
 * idx[0, c). mass[t] = exp(work[t] - max). */
static int s_select_mass(const float *v, const float *mass, int32_t *idx, int n, double target)
{
    int lo = 0, hi = n;
    double acc = 0;                                /* mass of idx[0, lo), all ranked before the rest */
    while (hi - lo > 1) {
        int m = s_partition(v, idx, lo, hi);
        double before = 0;
        for (int i = lo; i < m; i++)
            before += mass[idx[i]];
        if (acc + before >= target) {
            hi = m;                                /* the boundary lies in [lo, m) */
        } else if (acc + before + mass[idx[m]] >= target) {
            return m + 1;
        } else {
            acc += before + mass[idx[m]];
            lo = m + 1;
        }
    }
    return lo < n ? lo + 1 : n;
}

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

/* log_softmax(v)[t] over the whole vocabulary, the sum in double. */
static float s_log_softmax_at(const float *v, int n, int32_t t)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = v[i] > mx ? v[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)v[i] - mx);
    return (float)((double)v[t] - mx - log(sum));
}

int sampler_is_greedy(const sampler_t *s)
{
    return s->p.temperature == 0 && s->p.repetition_penalty == 1.0 && s->p.presence_penalty == 0 &&
           s->p.frequency_penalty == 0;
}

int32_t sampler_filter_draw(const float *logits, int V, const bk_sample_t *sp, float *work, float *mass, int32_t *idx,
                            float *lp_processed)
{
    if (work != logits)
        memcpy(work, logits, (size_t)V * sizeof(float));
    int32_t tok;
    if (sp->temperature == 0) {
        tok = 0;                                   /* NaN never wins unless every logit is NaN */
        for (int i = 1; i < V; i++)
            if (work[i] > work[tok] || (work[tok] != work[tok] && work[i] == work[i]))
                tok = i;
        if (lp_processed)
            *lp_processed = s_log_softmax_at(work, V, tok);
        return tok;
    }
    const float inv_t = (float)(1.0 / sp->temperature);
    for (int i = 0; i < V; i++)
        work[i] *= inv_t;
    int n = V;
    for (int i = 0; i < V; i++)
        idx[i] = i;
    if (sp->top_k > 0 && sp->top_k < n) {
        s_select(work, idx, n, sp->top_k);
        n = sp->top_k;
    }
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = work[idx[i]] > mx ? work[idx[i]] : mx;
    double total = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = idx[i];
        mass[t] = expf(work[t] - mx);
        total += mass[t];
    }
    if (sp->top_p < 1.0 && n > 1)
        n = s_select_mass(work, mass, idx, n, sp->top_p * total);
    if (sp->min_p > 0) {
        /* The best token is still kept (top-k and top-p keep it) and has mass exp(0) = 1. */
        const float floor_mass = (float)sp->min_p;
        int keep = 0;
        for (int i = 0; i < n; i++)
            if (mass[idx[i]] >= floor_mass)
                idx[keep++] = idx[i];
        n = keep;
    }
    /* The walk: the kept tokens in ascending id, a zero mass for every other token (adding +0 to
     * the running sum changes no bit), so the sum and the walk are one fixed order that a device
     * can reproduce without knowing how selection left idx. The fallback when rounding never
     * crosses u (u * total rounding up to total) is the last kept token with a positive mass. */
    memset(work, 0, (size_t)V * sizeof(float));
    for (int i = 0; i < n; i++)
        work[idx[i]] = mass[idx[i]];
    total = 0;
    for (int i = 0; i < V; i++)
        total += work[i];
    double u = sampler_rng_uniform(sp->seed, sp->step) * total, acc = 0;
    tok = -1;
    int32_t last = idx[0];
    for (int i = 0; i < V; i++) {
        if (work[i] > 0)
            last = i;
        acc += work[i];
        if (acc > u) {
            tok = i;
            break;
        }
    }
    if (tok < 0)
        tok = last;
    if (lp_processed)
        *lp_processed = (float)log(work[tok] / total);
    return tok;
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
    int32_t tok = sampler_filter_draw(s->work, V, &sp, s->work, s->mass, s->idx, want ? &lp_processed : NULL);
    if (logprob)
        *logprob = s->p.logprobs_mode == SAMPLER_LOGPROBS_RAW ? s_log_softmax_at(logits, V, tok) : lp_processed;
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
