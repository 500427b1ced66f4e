/* engine/spec_policy.h — how many drafts to verify: the draft-scheduler's policy, as pure
 * arithmetic (no sockets, no clock), shared by the actor that computes it (actors/draft_scheduler.c)
 * and the decode workers that apply it (actors/worker/spec_policy_client.c).
 *
 * The model. A verify step of a batch of B decode rows, row r carrying k_r drafts, costs
 * cost(B, k) seconds (measured by the workers, by batch bucket and drafts per row) and emits, in
 * expectation, sum_r (1 + sum_{i < k_r} S_r(i)) tokens, where S_r(i) is the probability that the
 * first i + 1 drafts of row r all survive verification (prefix survival). The policy maximises
 * expected tokens per second of the whole batch:
 *   - for a proposer without a distribution (n-gram), every row shares the measured curve
 *     S(i) = accepted[i] / proposed[i] (acceptance by draft position); the best uniform k for each
 *     batch bucket is found by trying k = 0..max_k, and k = 0 (no speculation) wins whenever
 *     drafting does not pay (a large batch, low acceptance). S(i) counts only rows that had
 *     drafts, so where a cell of the cost table also counted the tokens its steps emitted, the
 *     cell's own tokens per row replace the model's (spec_policy_rate), and a bucket whose
 *     measured drafting cells all fail to beat its measured plain step stays at k = 0;
 *   - for a proposer with a distribution (a draft model), a row's own confidence is the cumulative
 *     product of its drafts' probabilities (as DeepSeek's DSpark does), mapped through a measured
 *     calibration (how often a prefix of that confidence really survived). A draft is worth its
 *     place while its survival is at least the bucket's break-even survival, theta = R* x dc: the
 *     batch's tokens per second at the optimum times the seconds one more token adds to the step
 *     (below theta the token it may add is worth less than the time it costs). Such a bucket
 *     drafts only where its drafting steps, every cell together (spec_policy_drafting_rate),
 *     beat its plain step: it cannot choose a cell, and the steps that kept no draft paid the
 *     proposer all the same.
 * Each batch bucket thus gets (max_draft, min_confidence): the decode worker decides per row and
 * per step from them, locally, without a round trip.
 *
 * Not thread-safe; nothing allocates. */
#ifndef TROUPE_ENGINE_SPEC_POLICY_H
#define TROUPE_ENGINE_SPEC_POLICY_H

#include <stdint.h>

#include "engine/spec.h"

#define SPEC_CONF_BINS      10    /* confidence calibration bins over [0, 1] */
#define SPEC_COST_BATCHES   20    /* batch buckets of the cost table (spec_cost_batch) */
#define SPEC_POLICY_MIN_SAMPLES 32 /* drafts a position (or a confidence bin) needs to be measured */
#define SPEC_POLICY_MIN_STEPS   4  /* steps a cost cell needs to be measured */
#define SPEC_POLICY_PRIOR_ROWS  8  /* rows of one token each a drafting cell's tokens per row counts beside its own
                                    * (spec_policy_rate: a few lucky steps at a small batch do not win) */
#define SPEC_POLICY_MIN_GAIN    0.05 /* a k > 0 must beat k = 0 by this fraction of tokens/s (the
                                      * noise of whole-step times on a busy host: a GPU run's cycles
                                      * vary by a few percent from window to window) */

/* Acceptance by draft position, and the calibration of draft confidence. Counts, not rates, so
 * that windows from several workers add up. */
typedef struct spec_accept {
    uint64_t proposed[SPEC_MAX_K];   /* row-steps that verified at least i + 1 drafts */
    uint64_t accepted[SPEC_MAX_K];   /* ... whose first i + 1 drafts were all accepted */
    uint64_t conf_seen[SPEC_CONF_BINS];     /* drafts whose prefix confidence fell in bin j */
    uint64_t conf_accepted[SPEC_CONF_BINS]; /* ... and were accepted (their prefix survived) */
} spec_accept_t;

/* One verified row: n drafts, the first n_accepted accepted; prefix_conf (NULL: no distribution)
 * the cumulative product of the drafts' probabilities, [n]. */
void spec_accept_record(spec_accept_t *a, int n, int n_accepted, const float *prefix_conf);
void spec_accept_add(spec_accept_t *into, const spec_accept_t *from);
/* Halves every count (old windows weigh less; counts stay far from overflow). */
void spec_accept_decay(spec_accept_t *a);

/* The step-cost table: decode-only steps by batch bucket and drafts per row: the length every row
 * of the step asked for (a proposer without a distribution: what the policy decides), or the
 * rounded mean of the drafts verified (with a distribution, at least 1 when any row asked), and
 * what those steps emitted. The emitted tokens make the comparison like for like: a cell's rate
 * is what its steps really gave, rows the proposer found nothing for, the step's draft budget
 * and the rows that stopped included, where the model's S(i) counts only rows that had drafts. */
typedef struct spec_cost {
    uint64_t steps[SPEC_COST_BATCHES][SPEC_MAX_K + 1];
    double seconds[SPEC_COST_BATCHES][SPEC_MAX_K + 1];   /* summed over those steps */
    uint64_t counted[SPEC_COST_BATCHES][SPEC_MAX_K + 1]; /* of the steps, those whose tokens were counted */
    uint64_t rows[SPEC_COST_BATCHES][SPEC_MAX_K + 1];    /* decode rows of the counted steps */
    uint64_t emitted[SPEC_COST_BATCHES][SPEC_MAX_K + 1]; /* tokens the counted steps emitted */
} spec_cost_t;

/* The bucket of batch size b (>= 1): the first grid value >= b (1, 2, 3, 4, 6, 8, 12, 16, 24, 32,
 * 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024; larger batches share the last). */
int spec_cost_bucket(int b);
int spec_cost_batch(int bucket);              /* the grid value of a bucket */
/* A decode-only step of `batch` rows and `tokens` positions (batch + drafts) took seconds. */
void spec_cost_record(spec_cost_t *c, int batch, int tokens, double seconds);
/* A decode-only step of `batch` rows in cell k (drafts per row, as above) that emitted `emitted`
 * tokens (< 0: not counted) and took seconds. */
void spec_cost_record_step(spec_cost_t *c, int batch, int k, long emitted, double seconds);
/* The same for `steps` steps of one cell (bucket, drafts per row) that took seconds in all. Dropped
 * (the cell unchanged) for no steps, negative or NaN seconds, or a sum that would not stay finite or
 * would wrap: a report's absurd figures must not turn the policy's arithmetic into NaN. */
void spec_cost_add_cell(spec_cost_t *c, int bucket, int k, uint64_t steps, double seconds);
/* `steps` counted steps of one cell had `rows` decode rows and emitted `emitted` tokens in all
 * (dropped for no steps or no rows, or counts that would wrap). */
void spec_cost_add_tokens(spec_cost_t *c, int bucket, int k, uint64_t steps, uint64_t rows, uint64_t emitted);
/* Measured tokens per row of a cell (SPEC_POLICY_MIN_STEPS counted steps); -1 when not measured. */
double spec_cost_tokens_per_row(const spec_cost_t *c, int bucket, int k);
void spec_cost_add(spec_cost_t *into, const spec_cost_t *from);
/* Halves the table (old steps weigh less), except cells with fewer than 2 x SPEC_POLICY_MIN_STEPS
 * steps, which keep what they have: a cell that exploration fills rarely (a one-draft cell where
 * drafting loses by far) stays measured until newer steps outweigh it, instead of halving into
 * an unmeasured cell that the fit would then stand in for. */
void spec_cost_decay(spec_cost_t *c);
/* Estimated seconds of one step at batch bucket `bucket` with k drafts per row: the cell's mean
 * when measured (SPEC_POLICY_MIN_STEPS steps); between two measured drafting cells (k >= 1) of the
 * bucket, their line; else a least-squares fit over every measured cell, cost = c0 + c1 * tokens
 * (+ c2 * batch + c3 * drafts per row, when the cells tell the terms apart: a step is the whole of
 * it, drafting and emitting included), scaled to the bucket's nearest measured cell, and past the
 * bucket's longest measured drafting cell at least that cell plus the bucket's own slope between
 * its two longest. Never below a measured cell of no more rows and drafts, never above the
 * bucket's own measured cell of more drafts. -1 when the table cannot say (fewer than two
 * measured cells). */
double spec_cost_estimate(const spec_cost_t *c, int bucket, int k);

/* Which decode-only steps measure their cell (the worker asks before recording a step's cycle):
 * 0, or 1 when the step is left out of the cost table. has_dist: the proposer keeps state per
 * sequence (a draft model's KV, an MTP layer's); prev_asked / asked: whether the step before and
 * this one asked for drafts. With such a proposer two steps are not what their cell stands for:
 *   - a drafting step after a plain one: the proposer catches up first (the draft model computes
 *     the tokens it missed; an MTP sequence not fed begins again), which a policy that keeps
 *     drafting does not pay every step, nor one that stays at k = 0;
 *   - a plain step after a drafting one. Its own cycle runs no proposer code, yet on one H200
 *     (kjv-dense with kjv-draft, 2026-12-02, commit 2e81020) the plain cell at batch 1, filled by
 *     exploration steps amid drafting ones, read 2,533 tokens/s where plain steps run at 5,100,
 *     and the policy drafted at 0.49x of no speculation: whatever a drafting step leaves behind
 *     (the draft model's upkeep, the router relaying its burst of tokens) lands in the step after
 *     it. A plain step inside a stretch of plain steps pays none of it, and that is the step a
 *     policy at k = 0 runs; so only those measure the plain cell.
 * A proposer without state (n-gram) leaves nothing behind a drafting step; every step counts. */
int spec_cost_leave_out(int has_dist, int prev_asked, int asked);

/* Which plain (k = 0) cycles are too slow to be a plain step's cost, by batch bucket: one more than
 * SPEC_COST_PLAIN_SLOW times the lowest plain cycle the worker saw at that bucket, once it saw
 * SPEC_POLICY_MIN_STEPS of them. The lowest rises by 1/SPEC_COST_PLAIN_RISE of itself with every
 * plain cycle, so a step that really got slower (longer contexts) is measured again after a few
 * dozen. Why: the plain cell is the baseline every drafting cell is judged against, and a worker
 * that drafts fills it with few steps (exploration: one in 32), so a handful of cycles that paid
 * for something else inflates it. On one H200 (kjv-deepseek with MTP, 2026-12-03, f25aa02) the
 * batch-1 plain cell read 0.412 ms from 20 steps where the timed run's plain steps took 0.21 ms:
 * 7 of them, in the warm-up's concurrency-16 level (a batch of one while the prefill worker, on the
 * same GPU, computed the other 15 prompts and their hand-offs came in), averaged 0.79 ms; the
 * policy drafted at batch 1 and the cluster ran 0.60x of no speculation. A drafting cell keeps
 * its slow cycles: leaving only the plain ones out errs toward no speculation. */
#define SPEC_COST_PLAIN_SLOW 2.0
#define SPEC_COST_PLAIN_RISE 64
typedef struct spec_plain_guard {
    double low;          /* the lowest plain cycle seen (rising slowly), seconds */
    uint64_t seen;       /* plain cycles seen */
    uint64_t slow;       /* ... of them too slow (left out of the cost table) */
} spec_plain_guard_t;
/* A plain cycle of `seconds` at the guard's bucket: 1 when it is left out of the cost table. Graph
 * warm-ups are not given to it (their first and second steps are left out anyway). */
int spec_plain_guard_slow(spec_plain_guard_t *g, double seconds);

/* Exploration: which decode-only steps ask for drafts whatever the policy, so that the cost
 * table keeps the plain step and the one-draft step measured at every batch size next to the
 * policy's choice (a fit from one length cannot tell a step's fixed cost from its cost per token,
 * and a policy settled on k would otherwise never see that k = 0 became better, or the reverse).
 *   - plain: two steps in a row (the second measures the plain cell with a stateful proposer:
 *     spec_cost_leave_out) every 2 x SPEC_EXPLORE_EVERY decode-only steps of the batch bucket,
 *     every 2 x SPEC_EXPLORE_EARLY_EVERY of them while no policy is in force. Where the
 *     bucket's own measured cells say drafting wins by far (a drafting cell above 1 +
 *     SPEC_EXPLORE_WIDE of the plain cell's tokens/s), each plain pair doubles the bucket's
 *     interval, up to SPEC_EXPLORE_PLAIN_MAX; anything else puts it back to the start. A plain
 *     pair where drafting pays costs what drafting would have given: on one H100 (KJV pair,
 *     n-gram, 2026-12-07, 7ea3ba5) batch 16 drafted 6.4 a row for 2.75 tokens a verify step,
 *     and its plain pairs (2 steps in 32) took about 3% of its tokens/s;
 *   - one draft: two steps in a row (the first is the catch-up) every `one_every` decode-only steps
 *     of the batch bucket, SPEC_EXPLORE_ONE_EVERY to begin with. Where the worker's own measured
 *     cells say drafting loses by far at that bucket (the best measured drafting cell below
 *     1 - SPEC_EXPLORE_WIDE of the plain cell's tokens/s), each exploration doubles the bucket's
 *     interval, up to SPEC_EXPLORE_ONE_MAX; anything else puts it back to the start. A bucket
 *     whose own cells do not tell yet takes the verdict of the nearest smaller bucket whose cells
 *     do, and a new bucket so judged starts from that bucket's interval (a draft costs a larger
 *     share of a step as the batch grows). On one
 *     H200 (kjv-dense with kjv-draft at concurrency 96, 2026-12-02) a policy that was off lost
 *     21% to two one-draft steps in 64 and the draft model's catch-up before them, where the
 *     measured one-draft cell gave a tenth of the plain one's tokens/s. */
#define SPEC_EXPLORE_EVERY      16    /* plain: two steps in every 2 x this many */
#define SPEC_EXPLORE_EARLY_EVERY 4    /* ... and every 2 x this many while no policy is in force
                                       * (spec_explore_t.early): the policy waits for a measured plain
                                       * cell (spec_policy_compute), and one pair in 32 steps, spread over
                                       * every batch bucket a level ramps through, fills one slowly. On
                                       * one H200 (kjv-dense with kjv-draft, 2026-12-03, 22dde92) the
                                       * batch-64 and batch-96 buckets had one counted plain step each
                                       * after 124 and 104 drafting ones (the cell needs 4), while their
                                       * drafting steps took 1.97 ms against a plain 0.35. */
#define SPEC_EXPLORE_PLAIN_MAX  512   /* plain: a pair in this many at most, where drafting wins by far */
#define SPEC_EXPLORE_ONE_EVERY  64    /* one draft: two steps in this many (per batch bucket), at first */
#define SPEC_EXPLORE_ONE_MAX    1024  /* ... backing off up to this many */
#define SPEC_EXPLORE_WIDE       0.15  /* drafting losing by this fraction of tokens/s is losing by far */
#define SPEC_EXPLORE_CATCH_UP   32    /* a one-draft exploration's draft model computes at most the last
                                       * this many tokens of a row it lost step with (spec_ask_t.max_catch_up) */
#define SPEC_RESUME_CATCH_UP    128   /* ... and a drafting step's (the policy turning drafting on after a
                                       * plain stretch, a row's first proposal): a bounded catch-up, whose
                                       * drafts see this much of the row's context, */
#define SPEC_RESUME_TOKENS      512   /* ... and this many tokens over all the step's drafting rows, but
                                       * never below SPEC_EXPLORE_CATCH_UP a row: a step where drafting
                                       * resumes costs one draft forward of at most 512 positions (its
                                       * greedy drafts then come from the device: engine/spec_draft.c) */
/* The exploration budget: one-draft pairs take at most this share of the worker's decode-only
 * time. Every other decode-only cycle earns the share of its seconds, every exploration cycle
 * spends its own (measured, the draft model's catch-up included), and a bucket's pair that is due
 * waits while the balance is below zero; nothing is saved up beyond zero. So over any stretch of
 * a run exploration takes at most share x the other cycles' time plus one pair, whatever the
 * buckets, their intervals or the cost of a pair. Why: the intervals above count steps, not time,
 * and an exploration step of a draft model whose policy is off costs several plain ones (it
 * catches up on the context first). On one H200 (kjv-dense with kjv-draft, 2026-12-03, 720ee79,
 * policy off at every bucket) the timed run's 32 exploration steps took 1.975 ms a cycle against
 * 0.364 ms for its 3,354 off steps, 5% of its decode-only time, and the scheduled entry ran
 * 0.925-1.056x of no speculation. TROUPE_SPEC_EXPLORE_SHARE overrides it (in (0, 1]). */
#define SPEC_EXPLORE_SHARE      0.01

typedef struct spec_explore {
    uint64_t steps;                          /* decode-only steps asked about */
    int early;                               /* no policy in force (the caller sets it): SPEC_EXPLORE_EARLY_EVERY */
    uint64_t at[SPEC_COST_BATCHES];          /* ... of each batch bucket */
    uint64_t one_next[SPEC_COST_BATCHES];    /* the bucket's step at which its next one-draft pair begins */
    uint32_t one_every[SPEC_COST_BATCHES];   /* the bucket's interval (0: not set yet, the start) */
    int one_left;                            /* one-draft steps left in the pair under way */
    uint64_t backoffs;                       /* explorations that doubled an interval */
    uint64_t plain_next[SPEC_COST_BATCHES];  /* the bucket's step at which its next plain pair begins */
    uint32_t plain_every[SPEC_COST_BATCHES]; /* the bucket's plain interval (0: not set yet, the start) */
    int plain_left;                          /* plain steps left in the pair under way */
    uint64_t plain_backoffs;                 /* plain pairs that doubled an interval */
    double share;                            /* the budget's share (0: SPEC_EXPLORE_SHARE) */
    double credit;                           /* seconds exploration may still spend (<= 0: spec_explore_cycle) */
    uint8_t one_held[SPEC_COST_BATCHES];     /* the bucket's due pair waits for the budget */
    uint64_t held;                           /* pairs that waited for the budget */
    double explore_seconds, other_seconds;   /* the cycles reported: exploration's, and the rest */
} spec_explore_t;

/* Tokens per second a measured cell gave (its counted steps' tokens over its steps' time); -1
 * when the cell has fewer than SPEC_POLICY_MIN_STEPS counted steps. */
double spec_cost_cell_rate(const spec_cost_t *c, int bucket, int k);
/* For a decode-only step of `batch` rows: -1 (ask as the policy says), or the drafts every row
 * asks for and verifies in this exploration step (0 or 1). seen: the worker's own measured cells
 * (decaying), which decide the back-off; NULL: never back off. A one-draft pair that is due waits
 * while the budget is spent (SPEC_EXPLORE_SHARE, spec_explore_cycle). */
int spec_explore_next(spec_explore_t *e, int batch, const spec_cost_t *seen);
/* A decode-only cycle of `seconds` ended; explored: it was a one-draft exploration step (a step
 * spec_explore_next answered 1 for). Feeds the budget (SPEC_EXPLORE_SHARE); a worker that never
 * reports its cycles explores by the intervals alone. */
void spec_explore_cycle(spec_explore_t *e, int explored, double seconds);

/* The policy, what draft_policy carries (messages/msg.h). */
typedef struct spec_policy_bucket {
    int max_batch;                /* batch sizes up to this (ascending; the last covers all above) */
    int max_draft;                /* drafts per row without a distribution; 0: no speculation */
    float min_confidence;         /* break-even prefix survival for rows with a distribution */
} spec_policy_bucket_t;

typedef struct spec_policy {
    uint64_t epoch;
    int max_k;                    /* drafts a row with a distribution may verify at most */
    int n_buckets;
    spec_policy_bucket_t buckets[SPEC_COST_BATCHES];
    int n_survival;               /* the prefix survival by position it was computed from */
    float survival[SPEC_MAX_K];
    int n_calibration;            /* 0: confidence taken as is */
    float calibration[SPEC_CONF_BINS];   /* measured survival of a prefix by confidence bin */
} spec_policy_t;

/* The measured survival curve S(0..max_k) into s: positions with SPEC_POLICY_MIN_SAMPLES drafts
 * as measured (made non-increasing), the rest extrapolated geometrically from the last measured
 * ones. -1 when not even position 0 is measured. */
int spec_policy_survival(const spec_accept_t *a, int max_k, float *s);

/* Expected tokens per second of a step of `batch` rows at bucket b, each row with k drafts and
 * survival curve s: batch x tokens per row / spec_cost_estimate. Tokens per row are the cell's
 * measured ones where its steps were counted (spec_cost_tokens_per_row: what asking k gave, like
 * for like with the measured k = 0 of the same bucket); else the model's 1 + sum_{i<k} S(i),
 * its drafts scaled by what the bucket's counted k > 0 cells nearest to k (one on each side,
 * their rows pooled, SPEC_POLICY_PRIOR_ROWS rows of one token beside them once) really got of
 * the model's (at most 1: rows with no match, a step's draft budget, rows that end). -1 when the
 * cost is unknown. */
double spec_policy_rate(const spec_cost_t *c, int bucket, int batch, int k, const float *s);

/* Tokens per second of bucket b's drafting steps, every cell k > 0 together, as for a step of
 * `batch` rows: their counted tokens per row (SPEC_POLICY_PRIOR_ROWS rows of one token beside
 * them) over their mean step. What drafting gave at that bucket where the policy cannot choose a
 * cell (a proposer with a distribution: confidence decides each row's drafts). -1 when fewer than
 * SPEC_POLICY_MIN_STEPS drafting steps were counted. */
double spec_policy_drafting_rate(const spec_cost_t *c, int bucket, int batch);

/* Tokens per second of bucket b (0 .. the bucket of max_batch) for k = 0..max_k into r, as
 * spec_policy_compute judges them for survival s: r[0] the plain rate (an unmeasured plain cell
 * bounded from the nearest measured plain cells below and above), r[k] spec_policy_rate, but where
 * the bucket's own gain from drafting was not measured (its plain cell and a drafting cell, both
 * counted) at most r[0] times the larger gain its nearest measured buckets below and above show
 * (a bucket the workers never ran is not predicted to gain more than its neighbours did). 0, or
 * -1 when the cost is unknown. */
int spec_policy_bucket_rates(const spec_accept_t *a, const spec_cost_t *c, int max_k, int max_batch, int b,
                             const float *s, double *r);

/* The policy for proposers that verify at most max_k (1..SPEC_MAX_K) drafts per row, from the
 * acceptance counts and the cost table: buckets for every batch size up to max_batch. out comes in
 * as the policy in force (n_buckets 0: none): a drafting bucket keeps its length unless the new best
 * beats it by SPEC_POLICY_MIN_GAIN (proposers without a distribution). -1 (out untouched, why says
 * what is missing) when acceptance or cost is not measured well enough yet, among them a table
 * with no plain (k = 0) cell measured at any of those batch sizes. */
int spec_policy_compute(const spec_accept_t *a, const spec_cost_t *c, int max_k, int max_batch, spec_policy_t *out,
                        char *why, int why_len);

/* One line (no newline) into buf saying everything a computation read and decided, for
 * TROUPE_SPEC_POLICY_LOG: "t=SECONDS epoch=E max_k=K max_batch=B ok=0|1 acc=P/A,... conf=S/A,...
 * cells=BUCKET:K:STEPS:SECONDS:COUNTED:ROWS:EMITTED,... rates=BUCKET:R0/R1/.../Rmax_k,...
 * choice=MAX_BATCH:K:MIN_CONFIDENCE,... why=..." (rates in tokens/s as spec_policy_bucket_rates
 * gives them for the policy's survival, the chosen k and break-even; -1 where unknown). p: the policy
 * computed (ok=1), or the one in force when the computation failed with why (ok=0). Returns the
 * length written, or -1 when buf is too small (4096 bytes hold any table of a run). */
int spec_policy_log_line(char *buf, int len, double t, const spec_accept_t *a, const spec_cost_t *c, int max_k,
                         int max_batch, int ok, const spec_policy_t *p, const char *why);
/* The inputs of such a line back (acc, conf and cells; max_k, max_batch, the logged choice's
 * buckets into choice, which may be NULL): 0, or -1 with why naming the field that does not
 * parse. Recomputing from them gives the decision again offline (tools/spec-policy-replay). */
int spec_policy_log_parse(const char *line, spec_accept_t *a, spec_cost_t *c, int *max_k, int *max_batch,
                          spec_policy_t *choice, char *why, int why_len);

/* The bucket that applies to a step of `batch` decode rows. */
const spec_policy_bucket_t *spec_policy_bucket(const spec_policy_t *p, int batch);
/* A prefix confidence through the calibration. */
float spec_policy_calibrate(const spec_policy_t *p, float conf);
/* Drafts a row of a `batch`-row step asks its proposer for: max_k with a distribution (then
 * trimmed by spec_policy_keep) unless the bucket's max_draft is 0, else the bucket's max_draft. */
int spec_policy_ask(const spec_policy_t *p, int batch, int has_dist);
/* The raw prefix confidence below which spec_policy_keep would stop at a `batch`-row step (its
 * bucket's min_confidence through the inverse of the calibration; 0: it never stops): what a
 * proposer with a distribution is told to stop drafting at (spec_ask_t.stop_below). */
float spec_policy_stop_below(const spec_policy_t *p, int batch);
/* Of n proposed drafts with probabilities probs (NULL: a point mass, as the n-gram's), how many to
 * verify: with a distribution the leading drafts whose calibrated prefix confidence is at least
 * the bucket's min_confidence; without one min(n, max_draft). */
int spec_policy_keep(const spec_policy_t *p, int batch, const float *probs, int n);

#endif
