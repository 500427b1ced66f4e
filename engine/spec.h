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
 *     min(1, p(x) / q(x)); on rejection emit a token of norm(max(0, p - q)) (spec_accept_dist,
 *     spec_accept_mass; sampler_verify_dist applies it to a request's processed distribution);
 *   - sampled, a point-mass draft (n-gram: q(x) = 1): the rule above accepts with p(x) and
 *     resamples from p with x removed and renormalised. sampler_verify_draft realises it as the
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

#include "kernels/backend.h"       /* bk_sample_t */

#define SPEC_MAX_K 16              /* most drafts per verify step */
#define SPEC_DEFAULT_K 4           /* drafts per row when the knob names none */

typedef enum { SPEC_OFF = 0, SPEC_NGRAM, SPEC_DRAFT, SPEC_MTP } spec_method_t;

const char *spec_method_name(spec_method_t m);              /* "off", "ngram", "draft", "mtp" */
/* "off" / "ngram" / "draft" / "mtp" -> the method; -1 for an unknown name. */
int spec_method_parse(const char *name, spec_method_t *out);
/* The speculation knob (TROUPE_SPECULATION, troupe-generate --speculation): NULL, "" or "off";
 * "ngram", "draft" or "mtp" (SPEC_DEFAULT_K drafts); "ngram:K", "draft:K" or "mtp:K" (K in
 * [1, SPEC_MAX_K]).
 * 0, or -1 with err naming `what` (the variable or option) and the value. */
int spec_knob_parse(const char *what, const char *value, spec_method_t *method, int *k, char *err, size_t errlen);

typedef struct spec_proposer spec_proposer_t;

/* One sequence of a batched proposal (spec_propose_batch): what the caller asks, what comes back. */
typedef struct spec_ask {
    uint64_t id;
    const int32_t *tokens;         /* the sequence so far, prompt and generated: [n] */
    int n;
    int k;                         /* drafts wanted, <= SPEC_MAX_K */
    /* NULL: greedy drafts. Else the request's sampling (temperature > 0, top-k, top-p, min-p,
     * seed; step = the tokens it generated so far, sampler_device_params): a proposer with a
     * distribution draws its drafts from it, and the verify applies spec_accept_mass with the
     * proposer's q rows (spec_dist). Point-mass proposers ignore it. */
    const bk_sample_t *sample;
    int32_t *drafts;               /* out: [k] */
    float *probs;                  /* out (may be NULL): [k] the proposer's confidence in drafts[i]: q(drafts[i])
                                      for sampled drafts, the draft model's softmax probability for
                                      greedy ones (a row of logits to the host each), 1.0 for n-gram */
    int n_drafts;                  /* out: drafts written, in [0, k] */
    /* > 0 (with probs): a proposer with a distribution may stop drafting once the product of its
     * drafts' probs so far is below it (the policy would not verify the rest: spec_policy_keep),
     * so a row drafts about what it keeps. 0: draft k. */
    float stop_below;
    /* > 0: a draft model whose KV of this sequence lacks more than this many tokens computes only
     * the sequence's last max_catch_up tokens, a window (a step after a long stretch without
     * drafts, a sequence's first proposal: a catch-up of every token since costs more than the
     * drafts it improves are worth). A window stays, caught up, while the asks carry a bound it
     * holds (as many tokens of the sequence as the bound, or the whole sequence); an ask with a
     * larger bound computes its own window once, and the next ask without one the whole
     * sequence again. 0: the whole sequence. The decode worker's asks always carry one
     * (SPEC_EXPLORE_CATCH_UP, SPEC_RESUME_CATCH_UP). */
    int max_catch_up;
} spec_ask_t;

typedef struct spec_proposer_ops {
    const char *name;
    /* Up to k (<= SPEC_MAX_K) drafts for sequence id, whose tokens so far (prompt and generated)
     * are tokens[0..n): writes drafts[0..r) and returns r in [0, k] (0: no guess, decode the
     * plain way). probs (may be NULL) gets q(drafts[i]) for proposers with a distribution, 1.0
     * for a point mass. */
    int (*propose)(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts,
                   float *probs);
    /* Proposals for n sequences at once (NULL: propose, one sequence after another, greedy). A
     * model-backed proposer runs one draft forward per draft position for all of them. 0, or -1
     * when the proposer failed (every n_drafts 0: decode the plain way). */
    int (*propose_batch)(spec_proposer_t *p, spec_ask_t *asks, int n);
    /* The distribution draft i of id's last proposal was drawn from: q [vocab] (sums to 1), valid
     * until the next proposal for id or its forget; NULL for a point mass (greedy or n-gram
     * drafts). NULL entry: always a point mass. */
    const float *(*dist)(spec_proposer_t *p, uint64_t id, int i);
    /* The target verified n_verified of the last proposal's drafts (the caller may verify fewer
     * than were proposed) and kept the first n_accepted of them (NULL: nothing to track). */
    void (*accepted)(spec_proposer_t *p, uint64_t id, int n_verified, int n_accepted);
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
int spec_propose_batch(spec_proposer_t *p, spec_ask_t *asks, int n);
const float *spec_dist(spec_proposer_t *p, uint64_t id, int i);
void spec_accepted(spec_proposer_t *p, uint64_t id, int n_verified, int n_accepted);
void spec_forget(spec_proposer_t *p, uint64_t id);
void spec_proposer_destroy(spec_proposer_t **self_p);

/* The n-gram (prompt lookup) proposer: the longest suffix of the sequence, of min_n..max_n tokens
 * (1 <= min_n <= max_n <= 64), that occurred earlier in the sequence; the most recent earlier
 * occurrence wins; the tokens that followed it are the drafts (a continuation that runs into the
 * end of the sequence keeps copying its own drafts, so a repeating pattern extends itself). Cost
 * O(n * (max_n - min_n + 1)) per proposal, on the CPU. calibrated 0: every draft's confidence
 * (probs) is 1.0, a point mass's; 1: the proposer's running estimate of the draft's acceptance
 * given the drafts before it, by match length and draft position, learnt from `accepted`
 * (engine/spec_ngram.c), which a verify-length policy can read as a draft model's probabilities.
 * Either way the drafts are point masses to the verify rule. NULL on bad sizes or out of memory. */
spec_proposer_t *spec_ngram_new(int min_n, int max_n, int calibrated);

/* The n-gram search itself (what the proposer's propose does), for callers without a proposer. */
int spec_ngram_propose(const int32_t *tokens, int n, int min_n, int max_n, int k, int32_t *drafts);

/* The draft-model proposer: a second, smaller checkpoint with the target's tokenizer, on the
 * target's backend (same device), with a paged KV pool of its own (engine/spec_draft.c).
 *   - a sequence's draft KV is made the first time it is asked about (its tokens so far, in
 *     chunks of max_tokens), and afterwards only the tokens it lacks are computed: those the
 *     target emitted since, found by comparing the draft KV's tokens with the sequence's (so a
 *     missed `accepted`, or tokens the caller replaced, only cost recomputation);
 *   - `propose` (batched: every sequence's catch-up in one forward, then one forward per draft
 *     position for all sequences still drafting) writes k drafts: greedy, or drawn from the
 *     draft's distribution under the request's sampling (spec_ask_t.sample), whose rows `dist`
 *     then returns; probs, when asked for, gets the draft's confidence in each (greedy: its
 *     softmax probability), the prefix confidence a verify-length policy reads;
 *   - `accepted` rolls the draft KV back to what the target kept (kvseq_truncate); `forget`
 *     frees the sequence and its blocks. When the pool runs out, the sequence needing blocks
 *     loses its draft KV (it gets no drafts this time and is recomputed when next asked).
 * The draft's vocabulary size must equal the target's, and when both directories hold a
 * tokenizer.json the two must map every id to the same token: otherwise spec_draft_new fails
 * naming both directories. Destroy the proposer before the target's engine (it runs on its
 * backend). Memory: the pool, and for each sequence proposing sampled drafts k rows of vocab
 * floats (its q rows). */
struct engine;
typedef struct spec_draft_opts {
    const char *model_dir;         /* the draft checkpoint (config.json, model.safetensors) */
    struct engine *target;         /* the open target: its backend, vocabulary, model_dir */
    const char *target_tokenizer;  /* the target's tokenizer directory (NULL: target's model_dir) */
    int max_seqs;                  /* sequences per draft forward (>= 1) */
    int max_tokens;                /* tokens per draft forward (>= max_seqs): catch-up chunks */
    int max_model_len;             /* longest sequence (prompt and generated) */
    int block_size;                /* the draft pool's tokens per block (0: 16) */
    long kv_blocks;                /* the draft pool's blocks (0: max_seqs sequences of max_model_len) */
    int dummy;                     /* random weights of the draft config's shape (tests, cost only) */
} spec_draft_opts_t;

/* NULL with err (naming the draft directory, and the target's for a tokenizer mismatch) and
 * *config_error (may be NULL: 1 when the files or options are at fault, 0 for the moment). */
spec_proposer_t *spec_draft_new(const spec_draft_opts_t *o, int *config_error, char *err, size_t errlen);

/* The device bytes spec_draft_new will place for o (its weights, as config_weight_bytes counts
 * them, and its KV pool, by spec_draft_new's own sizing rule) into *bytes, from the draft's
 * config.json alone; dtype: the dummy weights' (DT_COUNT: the config's). A target that sizes its
 * KV pool from the free memory takes this off first (engine_spec_t.kv_reserve_bytes). -1 with
 * err naming the draft's config when it cannot be read. */
int spec_draft_device_bytes(const spec_draft_opts_t *o, dtype_t dtype, double *bytes, char *err, size_t errlen);

/* What a draft proposer did, for stats and tests (all 0 for another proposer). */
typedef struct spec_draft_stats {
    uint64_t forwards;             /* draft forwards run */
    uint64_t tokens;               /* tokens they computed (catch-up and drafts) */
    uint64_t ns;                   /* time in propose */
    uint64_t windows;              /* catch-ups cut to a window (spec_ask_t.max_catch_up) */
    int seqs;                      /* sequences tracked now */
    int blocks_used, blocks_total; /* the draft pool */
} spec_draft_stats_t;
void spec_draft_stats(const spec_proposer_t *p, spec_draft_stats_t *out);
/* Tokens of id's draft KV (-1: not tracked); for tests. */
int spec_draft_kv_len(const spec_proposer_t *p, uint64_t id);

/* Sampled speculation's randomness: counter-based like the sampler's (kernels/sample_rng.h), on
 * streams of its own so the draft's draw, the acceptance test and the residual draw at a step are
 * independent of each other and of the target's draw at that step. */
#define SPEC_RNG_DRAFT 0x64726166745f7531ull
#define SPEC_RNG_ACCEPT 0x6163636570745f32ull
#define SPEC_RNG_RESAMPLE 0x726573616d706c33ull
double spec_rng_uniform(uint64_t seed, uint64_t stream, uint64_t step);

/* A sampled proposer's draft j, drawn from its row of logits under the request's sampling sp
 * (temperature, top-k, top-p, min-p; no penalties: cpu_sample_mass's distribution) at the RNG step
 * sp->step + j (draft j stands at the target's step + j), on the SPEC_RNG_DRAFT stream. q [V]: the
 * distribution it was drawn from, what the verification's rejection sampling reads (spec_dist);
 * *prob (may be NULL): q at the draw. work, mass, idx: scratch of V each. */
int32_t spec_draw(const float *logits, int V, const bk_sample_t *sp, int j, float *q, float *work, float *mass,
                  int32_t *idx, float *prob);

/* spec_accept_dist on the sampler's representation: the target as kept masses p_mass [V] with
 * their total (p = p_mass / p_total, cpu_sample_mass), the draft as probabilities q [V] (f32,
 * summing to 1, q[x] > 0). Same rule, same walk. */
int32_t spec_accept_mass(const float *p_mass, double p_total, const float *q, int V, int32_t x, double u_accept,
                         double u_resample, int *accepted);

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
