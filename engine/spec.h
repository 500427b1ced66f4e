/* engine/spec.h — speculative decoding: proposers behind one interface, and the acceptance rule.
 *
 * A proposer guesses the next k tokens of a sequence (drafts); the target model then scores the
 * sequence's last token and the k drafts in ONE forward (k + 1 rows), and the acceptance rule keeps
 * the longest prefix of drafts the target agrees with plus one token of the target's own, so every
 * verify step emits between 1 and k + 1 tokens, and the output follows the target's distribution
 * exactly (lossless):
 *   - greedy: accept draft i while the target's argmax at position i equals it; the first
 *     disagreement (or position k) emits the target's argmax;
 *   - sampled, draft distribution q (a draft model): accept draft x with probability
 *     min(1, p(x) / q(x)); on rejection emit a token of norm(max(0, p - q)) (spec_accept_dist);
 *   - sampled, a point-mass draft (n-gram: q(x) = 1): the rule above accepts with p(x) and
 *     resamples from p with x removed and renormalised. sampler_sample_draft realises it as the
 *     coupling "draw y from p exactly as without speculation; accept iff y == x", which has the
 *     same acceptance probability and the same output law, and besides emits the very tokens a
 *     run without speculation emits for the same seed.
 *
 * Proposers. spec_proposer_t is a small vtable so that a draft model, MTP heads or EAGLE heads
 * slot in beside the n-gram proposer: `propose` fills up to k drafts (and, for proposers with a
 * distribution, q(draft) per position in probs; NULL rows mean a point mass), `accepted` tells a
 * stateful proposer (a draft model's own KV) how many drafts the target kept, `forget` drops a
 * sequence. The n-gram proposer is stateless and needs neither.
 *
 * Not thread-safe: one owner (the decode worker's loop) drives a proposer. Nothing allocates on
 * the per-token path.
 */
#ifndef TROUPE_ENGINE_SPEC_H
#define TROUPE_ENGINE_SPEC_H

#include <stddef.h>
#include <stdint.h>

#define SPEC_MAX_K 16              /* most drafts per verify step */

typedef enum { SPEC_OFF = 0, SPEC_NGRAM } spec_method_t;

const char *spec_method_name(spec_method_t m);              /* "off", "ngram" */
/* "off" / "ngram" -> the method; -1 for an unknown name. */
int spec_method_parse(const char *name, spec_method_t *out);

typedef struct spec_proposer spec_proposer_t;

typedef struct spec_proposer_ops {
    const char *name;
    /* Up to k (<= SPEC_MAX_K) drafts for sequence id, whose tokens so far (prompt and generated)
     * are tokens[0..n): writes drafts[0..r) and returns r in [0, k] (0: no guess, decode the
     * plain way). probs (may be NULL) gets q(drafts[i]) for proposers with a distribution, 1.0
     * for a point mass. */
    int (*propose)(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts,
                   float *probs);
    /* The target kept n_accepted of the last proposal's drafts (NULL: nothing to track). */
    void (*accepted)(spec_proposer_t *p, uint64_t id, int n_accepted);
    /* Sequence id ended (NULL: nothing to track). */
    void (*forget)(spec_proposer_t *p, uint64_t id);
    void (*destroy)(spec_proposer_t *p);
} spec_proposer_ops_t;

struct spec_proposer {
    const spec_proposer_ops_t *ops;
    void *impl;                    /* the proposer's own state */
};

/* Calls through the vtable (optional entries may be NULL). */
int spec_propose(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts, float *probs);
void spec_accepted(spec_proposer_t *p, uint64_t id, int n_accepted);
void spec_forget(spec_proposer_t *p, uint64_t id);
void spec_proposer_destroy(spec_proposer_t **self_p);

/* The n-gram (prompt lookup) proposer: the longest suffix of the sequence, of min_n..max_n tokens
 * (1 <= min_n <= max_n <= 64), that occurred earlier in the sequence; the most recent earlier
 * occurrence wins; the tokens that followed it are the drafts (a continuation that runs into the
 * end of the sequence keeps copying its own drafts, so a repeating pattern extends itself). Cost
 * O(n * (max_n - min_n + 1)) per proposal, on the CPU. NULL on bad sizes or out of memory. */
spec_proposer_t *spec_ngram_new(int min_n, int max_n);

/* The n-gram search itself (what the proposer's propose does), for callers without a proposer. */
int spec_ngram_propose(const int32_t *tokens, int n, int min_n, int max_n, int k, int32_t *drafts);

/* The rejection rule on explicit distributions over V tokens: target p, draft q (both sum to 1),
 * draft token x (q[x] > 0). u_accept and u_resample in [0, 1). Returns x when u_accept <
 * p[x] / q[x] (*accepted = 1); otherwise (*accepted = 0) the token of the residual
 * norm(max(0, p - q)) found by walking ascending token ids to u_resample of its mass (when the
 * residual is empty, which needs p == q where rejection cannot happen, p's own walk). */
int32_t spec_accept_dist(const double *p, const double *q, int V, int32_t x, double u_accept, double u_resample,
                         int *accepted);

/* Counters of one worker's speculation, for stats: steps that verified drafts, drafts proposed,
 * drafts accepted, tokens emitted by those steps. */
typedef struct spec_stats {
    uint64_t verify_steps;
    uint64_t drafts;
    uint64_t accepted;
    uint64_t emitted;
} spec_stats_t;

/* accepted / drafts (0 when no drafts) */
double spec_stats_acceptance(const spec_stats_t *st);
/* emitted / verify_steps: mean tokens per verify step, 1 + accepted per step (0 when none) */
double spec_stats_mean_len(const spec_stats_t *st);

#endif
