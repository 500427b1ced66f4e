/* engine/sampler.h — choosing the next token from logits, and deciding when a request is done.
 *
 * One sampler per request. It owns every buffer it needs (allocated by sampler_new, sized by the
 * vocabulary), so sampling a token never allocates.
 *
 * Processing order (HF's logits-processor order; vLLM applies min-p before top-k/top-p, which only
 * differs when both are set):
 *   1. repetition penalty (HF): over tokens of the prompt and the output so far, a logit l > 0
 *      becomes l / r, l < 0 becomes l * r (l == 0 stays);
 *   2. presence and frequency penalties (OpenAI): over output tokens only,
 *      l -= frequency * count + presence * (count > 0);
 *   3. temperature 0: greedy, the largest logit, the lowest index on ties; otherwise l / T, then
 *   4. top-k: the k largest (ties: the lower index ranks first);
 *   5. top-p: the smallest set of highest-probability tokens whose probability sum >= p
 *      (probabilities renormalised over what top-k kept; always at least one token);
 *   6. min-p: drop tokens whose probability < min_p * the largest probability;
 *   7. draw u in [0, 1) and walk the kept tokens in ascending token id until their cumulative
 *      mass (exp(l - max) in f32, summed in double in that order) exceeds u * total (the same
 *      sum); when rounding never crosses, the last kept token of positive mass.
 * Randomness is counter-based: u = mix(seed, number of tokens generated so far)
 * (kernels/sample_rng.h, shared with the device kernel), so a request gets the same tokens for
 * the same seed whatever else is in the batch, and after a restart.
 *
 * Steps 3-7 on a plain row are the backend's `sample` op (kernels/backend.h), whose CPU reference
 * (kernels/cpu/cpu_sample.h) sampler_sample runs after the penalties: a request without penalties
 * and without log-probabilities may take its token from that op on the device
 * (sampler_needs_host, sampler_device_params).
 *
 * Log-probability of the chosen token (and of the most likely alternatives, sampler_top_logprobs,
 * for OpenAI's top_logprobs): SAMPLER_LOGPROBS_RAW (the default, as vLLM's default
 * logprobs_mode "raw_logprobs") is log_softmax of the model's logits before any processing;
 * SAMPLER_LOGPROBS_PROCESSED is the log of the probability the token was actually drawn with
 * (after penalties, temperature and filtering; for greedy, log_softmax of the penalised logits).
 *
 * Stop strings are matched on the detokenised text (sampler_text): across token boundaries, the
 * earliest match wins, the stop string and everything after it are never emitted (vLLM's
 * include_stop_str_in_output = false). Text that might be the start of a stop string is held
 * back until it is known not to be.
 */
#ifndef TROUPE_ENGINE_SAMPLER_H
#define TROUPE_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define SAMPLER_MAX_STOP_IDS 16
#define SAMPLER_MAX_EOS 8
#define SAMPLER_MAX_STOPS 8
#define SAMPLER_MAX_STOP_LEN 256   /* bytes per stop string */
#define SAMPLER_MAX_TOP 20         /* alternatives per position (OpenAI's top_logprobs bound) */

typedef enum { SAMPLER_LOGPROBS_RAW = 0, SAMPLER_LOGPROBS_PROCESSED } sampler_logprobs_t;

typedef enum {
    FINISH_NONE = 0,              /* keep going */
    FINISH_STOP,                  /* an EOS id, a stop id or a stop string */
    FINISH_LENGTH,                /* max_tokens generated */
} finish_reason_t;

const char *finish_reason_name(finish_reason_t r);   /* "none", "stop", "length" */

typedef struct sampler_params {
    double temperature;           /* 0 = greedy; else > 0 */
    int top_k;                    /* <= 0 = off */
    double top_p;                 /* (0, 1]; 1 = off */
    double min_p;                 /* [0, 1]; 0 = off */
    double repetition_penalty;    /* > 0; 1 = off */
    double presence_penalty;      /* [-2, 2]; 0 = off */
    double frequency_penalty;     /* [-2, 2]; 0 = off */
    uint64_t seed;
    int max_tokens;               /* new tokens before FINISH_LENGTH; <= 0 = no limit */
    int ignore_eos;               /* EOS ids do not stop (stop ids still do) */
    int n_eos;
    int32_t eos_ids[SAMPLER_MAX_EOS];            /* the model's EOS ids (config) */
    int n_stop_ids;
    int32_t stop_ids[SAMPLER_MAX_STOP_IDS];      /* extra ids that stop */
    int n_stops;
    const char *stops[SAMPLER_MAX_STOPS];        /* stop strings (copied by sampler_new) */
    sampler_logprobs_t logprobs_mode;
} sampler_params_t;

typedef struct sampler sampler_t;

/* The most likely tokens at one position, most likely first, with their log-probabilities. */
typedef struct sampler_top {
    int n;                        /* entries filled, <= SAMPLER_MAX_TOP */
    int32_t ids[SAMPLER_MAX_TOP];
    float logprobs[SAMPLER_MAX_TOP]; /* non-increasing, <= 0 */
} sampler_top_t;

/* Greedy, no penalties, no limits, seed 0, no stops. */
void sampler_params_default(sampler_params_t *p);
/* Range checks; the error names the field and the value. */
int sampler_params_check(const sampler_params_t *p, int vocab_size, char *err, size_t errlen);

/* A sampler for one request over vocab_size logits; prompt tokens feed the repetition penalty. */
sampler_t *sampler_new(const sampler_params_t *p, int vocab_size, const int32_t *prompt, int n_prompt, char *err,
                       size_t errlen);
void sampler_destroy(sampler_t **self_p);

/* Chooses the next token from logits [vocab_size] (left unchanged); *logprob (may be NULL) gets
 * its log-probability in the configured mode. Does not record the token: call sampler_accept. */
int32_t sampler_sample(sampler_t *s, const float *logits, float *logprob);
/* The n most likely tokens of logits [vocab_size] (n clipped to [0, SAMPLER_MAX_TOP] and to the
 * vocabulary) into *out, ranked as greedy ranks them (larger first, the lower id on ties, so a
 * greedy token is out->ids[0]); a NaN or infinite logit never ranks. Their log-probabilities are
 * on the scale of sampler_sample's *logprob, so the chosen token's value equals its entry here when
 * it is among them: RAW, log_softmax of the raw logits (computed as cpu_log_softmax_at does, bit
 * for bit; a NaN logit, for which that gives NaN everywhere, is left out of the sum);
 * PROCESSED, of the distribution the token is drawn from (penalties, temperature, filters): only
 * tokens it can draw are listed, so out->n may be smaller than n (greedy: log_softmax of the
 * penalised logits). Call it for the position sampler_sample just chose from, before
 * sampler_accept (the penalties must be the same). Uses the sampler's scratch (no allocation);
 * costs one pass over the vocabulary, two with RAW. Returns out->n. */
int sampler_top_logprobs(sampler_t *s, const float *logits, int n, sampler_top_t *out);
/* Verifies a point-mass draft (an n-gram proposer's; draft < 0: none) against the target's logits
 * at its position: the token to emit is sampler_sample's, and *accepted says whether it equals
 * the draft. This is speculative rejection sampling for q = a point mass at the draft (accept
 * with p(draft), else a token of p without the draft, renormalised) realised as a coupling: the
 * acceptance probability and the law of the emitted token are the rule's, and the tokens are the
 * very ones a run without speculation draws for the same seed (greedy: the argmax). As with
 * sampler_sample, call sampler_accept with the token before verifying the next position. */
int32_t sampler_verify_draft(sampler_t *s, const float *logits, int32_t draft, float *logprob, int *accepted);
/* Verifies a draft drawn from a distribution q [vocab] (a draft model's, spec_dist; NULL or
 * draft < 0: sampler_verify_draft) against the target's logits at its position: speculative
 * rejection sampling on the request's processed distribution p (penalties, temperature, top-k,
 * top-p, min-p): accept with min(1, p(draft) / q(draft)), else emit a token of
 * norm(max(0, p - q)) (spec_accept_mass), with randomness from the seed and the tokens generated
 * so far on speculation's own streams (spec_rng_uniform). The emitted tokens follow p exactly,
 * but are not the ones a run without speculation draws for the same seed. *logprob as
 * sampler_sample's (processed: log p of the token). Call sampler_accept with the token after. */
int32_t sampler_verify_dist(sampler_t *s, const float *logits, int32_t draft, const float *q, float *logprob,
                            int *accepted);
/* Records a generated token (penalty counts, the RNG counter) and says whether it finishes the
 * request: FINISH_STOP for an EOS id (unless ignore_eos) or a stop id, FINISH_LENGTH at max_tokens. */
finish_reason_t sampler_accept(sampler_t *s, int32_t token);
/* 1 when sampler_sample is a plain argmax of the raw logits (temperature 0, no penalties): the
 * caller may take the token from a device-side argmax (model_batch_t.argmax_out) instead. */
int sampler_is_greedy(const sampler_t *s);
/* 1 when the request draws its tokens (temperature > 0, penalties or not): a proposer with a
 * distribution draws its drafts for it (spec_ask_t.sample), and MTP keeps its logits (spec_mtp_feed_t.sampled). */
int sampler_draws(const sampler_t *s);
/* 1 when the request has penalties (repetition, presence, frequency): its logits must come to the
 * host (sampler_sample). Otherwise sampler_sample equals steps 3-7 on the raw logits with
 * sampler_device_params: the backend's `sample` op may choose the token instead. */
int sampler_needs_host(const sampler_t *s);
/* The request's steps 3-7 as the backend's sample op takes them: temperature, filters, seed, and
 * step = tokens generated so far (the RNG counter sampler_sample would use now). */
void sampler_device_params(const sampler_t *s, bk_sample_t *out);
int sampler_n_generated(const sampler_t *s);

/* Feeds detokenised text (complete UTF-8) of the accepted tokens. Text known not to start a stop
 * string goes to emit(ctx, bytes, n). Returns 1 when a stop string completed (emit got the text
 * before it; the request finishes with FINISH_STOP and later text is ignored), else 0. */
int sampler_text(sampler_t *s, const char *text, size_t len, void (*emit)(void *ctx, const char *t, size_t n), void *ctx);
/* At the end of a request (any reason but a stop string), emits the text held back. */
void sampler_text_flush(sampler_t *s, void (*emit)(void *ctx, const char *t, size_t n), void *ctx);

#endif
