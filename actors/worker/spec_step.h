/* actors/worker/spec_step.h — a decode worker's speculation (TROUPE_SPECULATION; docs/speculation.md):
 * the drafts of a step's decode rows before the forward, their verification after it. A module of
 * its own so that the decode step reads the same with or without speculation, and so that what
 * decides the drafts (a proposer behind engine/spec.h, a policy for how many per row) changes here
 * and nowhere else.
 *
 * In a step of decode rows only (no prompt chunk):
 *   1. spec_step_propose (after the schedule, before the forward): each row gets up to k drafts,
 *      appended to its KV; the forward computes spec_step_drafts(s, i) more positions of row i
 *      and, as spec_step_batch asks, brings each position's token from the device (argmax, or the
 *      backend's sample op) and its logits to the host only where the acceptance reads them;
 *   2. spec_step_verify (after the forward, before the step's commit): for each row, position by
 *      position, the target's token (sampler_verify_draft: lossless), streamed through the owner's
 *      emit hook while the drafts are accepted and the request goes on; then the row's KV is
 *      rolled back to what was accepted (kvseq_truncate), so the commit publishes only that.
 * The drafts of a step never exceed max_rows - rows (its rows of logits fit the buffers the model
 * was sized for: worker_t.max_logit_rows), nor a row's room to max_model_len.
 *
 * A NULL spec_step_t is speculation off: every function takes it and does nothing. */
#ifndef TROUPE_ACTORS_WORKER_SPEC_STEP_H
#define TROUPE_ACTORS_WORKER_SPEC_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/worker/spec_policy_client.h"
#include "engine/sampler.h"
#include "engine/model.h"
#include "engine/sched.h"
#include "engine/spec.h"

/* What the environment asks for: method SPEC_OFF, or SPEC_NGRAM / SPEC_DRAFT / SPEC_MTP with k drafts per row. */
typedef struct spec_step_config {
    spec_method_t method;
    int k;                       /* drafts per row, [1, SPEC_MAX_K] */
    /* Verify steps of at most this many rows are padded to one count of positions per row, so a
     * CUDA graph replays them (spec_step.c s_pad); 0: never. TROUPE_SPEC_PAD_ROWS; -1 when unset:
     * the owner chooses (the decode worker: 16 on a backend with graphs, else 0). */
    int pad_max_rows;
    /* The count those steps are padded to: 1 (default) the length the step asked (the policy's
     * for its batch size, an exploration's one draft), so a batch size has one verify shape per
     * length asked whatever its rows' proposals found, and a cost cell is the cost of its length;
     * 0 the step's most drafts found (fewer filler positions, but a graph shape for every count,
     * each recorded on first sight in the middle of serving). Proposers without a distribution only
     * (n-gram): the others ask max_k and keep what their confidence passes. TROUPE_SPEC_PAD_TO=asked
     * or found. */
    int pad_to_asked;
    /* SPEC_NGRAM: 1 reports the proposer's calibrated confidence in each draft (spec_ngram_new),
     * so the draft-scheduler's policy chooses each row's verify length from it as from a draft
     * model's probabilities; 0 (default): a point mass's 1.0, every row the batch's length.
     * TROUPE_SPEC_NGRAM_CONFIDENCE. */
    int ngram_confidence;
    /* A verify step's accepted run of a row streams as one token message (the owner's emit holds
     * while `more`); 0: a message a token, as before. TROUPE_SPEC_COALESCE (default 1). */
    int coalesce;
} spec_step_config_t;

#define SPEC_PAD_ROWS_GRAPHS 16   /* pad_max_rows on a backend with graphs (the decode worker's choice) */

/* What the step needs of its owner's requests (ctx: the hooks' first argument). */
typedef struct spec_hooks {
    void *ctx;
    /* r's sampler; *logprobs: r wants each token's log-probability. */
    sampler_t *(*sampler)(void *ctx, sched_req_t *r, int *logprobs);
    /* Streams token t of r (at_length: no room for another); row is the row of logits t was
     * chosen from when it came to the host (NULL: it stayed on the device), for its position's
     * alternatives; kv_keep is the KV length right for the tokens streamed so far, to which r's
     * KV is rolled back if t ends it; more: r's next token follows in this step (t's draft was
     * accepted), so the owner may hold t to stream the row's run as one message. 1 while r goes
     * on, 0 when it ended (r is freed). */
    int (*emit)(void *ctx, sched_req_t *r, int32_t t, float lp, const float *row, int at_length, int kv_keep, int more);
} spec_hooks_t;

typedef struct spec_step spec_step_t;

/* TROUPE_SPECULATION (spec_knob_parse): unset, "" or "off": off; "ngram", "draft" or "mtp" (4
 * drafts), "ngram:K", "draft:K" or "mtp:K" (K in [1, SPEC_MAX_K]). -1 with why (naming the
 * variable) on anything else. draft is the topology's model.draft, mtp the model's own MTP layer,
 * both proposers made by worker_load (worker_t.draft). */
int spec_step_config_from_env(spec_step_config_t *c, char *err, size_t errlen);

/* The speculation of a worker with max_seqs rows, max_rows rows of logits per forward (>= max_seqs;
 * rows and their drafts together) and max_model_len tokens per sequence. NULL when
 * c->method is SPEC_OFF (err empty), or with err when out of memory or, for SPEC_DRAFT and
 * SPEC_MTP, when draft is NULL (or not an MTP proposer for SPEC_MTP). draft is the worker's
 * proposer (worker_t.draft: the draft model, or the MTP layer), borrowed: the worker frees it.
 *
 * MTP: the MTP layer drafts from the target's final hidden states, which only a verify step's
 * forward brings back here (spec_step_batch asks for model_batch_t.hidden_out); so with SPEC_MTP
 * every decode-only step where rows asked for drafts is a verify step, rows that got none
 * included, and after verification
 * each row's kept positions (its last token and its accepted drafts) are fed to the MTP layer
 * (spec_mtp_feed). A row's MTP sequence begins at the first position fed: the prompt was
 * computed by a prefill worker, or in a step with prompt chunks, neither of which gives hidden
 * states here, and a step with prompt chunks, or one where no row asked for drafts (the policy
 * off at its batch size, an exploration step at k = 0: a plain step, no hidden states or MTP
 * forward for drafts nobody asked for), leaves a gap at which the sequence begins again
 * (docs/speculation.md: what this costs). */
spec_step_t *spec_step_new(const spec_step_config_t *c, spec_proposer_t *draft, int max_seqs, int max_rows, int max_model_len,
                           const spec_hooks_t *hooks, char *err, size_t errlen);
void spec_step_destroy(spec_step_t **self_p);

/* Drafts for b's rows, appended to their KV: 1 when some row got drafts (the step verifies), 0
 * when none did or b has prompt chunks (the step decodes the plain way). With SPEC_MTP, 1 for
 * every step without prompt chunks where some row asked for drafts (its hidden states feed the
 * MTP layer). */
int spec_step_propose(spec_step_t *s, const sched_batch_t *b);
/* The most drafts a row of the next step may verify, for the room its messages need (decode.c's
 * backpressure): the policy's most at any batch (the default k without one), and 1 where an
 * exploration step may come; 0 when off (s NULL). A worker whose policy is off everywhere waits
 * for the room of 1 + 1 tokens a row, not 1 + SPEC_MAX_K. */
int spec_step_max_drafts(const spec_step_t *s);
/* Drafts row i carries this step (0 unless spec_step_propose returned 1). */
int spec_step_drafts(const spec_step_t *s, int i);
/* A verify step's model batch (spec_step_propose returned 1): mb keeps its seqs and gets every
 * position's row of logits (all_logits), the device's token of each (argmax_out, and sample for
 * sampled rows when dev_sample: the backend has the sample op) and need_logits only for the
 * positions whose acceptance reads the logits (penalties, log-probabilities, a sampled row's draft
 * drawn from a distribution, sampling without the op). The tokens stay the ones of a run that
 * downloads every row's logits. */
void spec_step_batch(spec_step_t *s, const sched_batch_t *b, int dev_sample, model_batch_t *mb);
/* Verifies and emits b's rows from spec_step_batch's tokens and, where it asked for them, logits
 * ([rows of every position][vocab], rows in b's order). */
void spec_step_verify(spec_step_t *s, const sched_batch_t *b, const float *logits, int vocab);
/* The draft-scheduler's side (spec_policy_client.h): reports to it and its policy applied per row
 * (the verify length from the step's batch size and, for a proposer with a confidence per draft
 * (the draft model, the MTP layer, the calibrated n-gram proposer), the row's draft confidence).
 * -1 with err when out of memory (TROUPE_SPEC_POLICY is checked by spec_step_config_from_env).
 * Without it every row asks for k. */
int spec_step_policy_init(spec_step_t *s, actor_t *a, char *err, size_t errlen);
/* A draft_policy from the draft-scheduler; -1 with err when it cannot be applied. */
int spec_step_on_policy(spec_step_t *s, const msg_draft_policy_t *p, char *err, size_t errlen);
/* The step-cost table's measure is a step's cycle (decode.c s_step): spec_step_done records b's
 * rows and drafts when its step is over (b's counts and this step's drafts only: valid after
 * sched_commit); spec_step_cycle then reports that step's cost, the seconds from its start to the
 * next step's start, when it had decode rows only. */
void spec_step_done(spec_step_t *s, const sched_batch_t *b);
void spec_step_cycle(spec_step_t *s, double seconds);
/* Request id ended: a proposer with per-sequence state drops it. */
void spec_step_forget(spec_step_t *s, uint64_t id);

/* What decided a decode-only step's drafts (spec_step_propose): no row asked for any (the policy
 * off at the step's batch, or an exploration step at k = 0: a plain step), an exploration step's
 * one draft per row, or the policy's (or the default k's) drafts. */
typedef enum { SPEC_STEP_OFF = 0, SPEC_STEP_EXPLORE, SPEC_STEP_DRAFTING, SPEC_STEP_KINDS } spec_step_kind_t;

/* Where a speculating worker's time goes, by step kind: what a worker whose policy is off pays
 * beside a worker without speculation (docs/speculation.md, Stats). */
typedef struct spec_step_counts {
    uint64_t steps[SPEC_STEP_KINDS];            /* decode-only steps whose cycle was reported (spec_step_cycle) */
    double seconds[SPEC_STEP_KINDS];            /* those cycles */
    uint64_t proposer_calls[SPEC_STEP_KINDS];   /* proposals (spec_propose_batch) and MTP feeds in steps of each kind */
    double proposer_seconds[SPEC_STEP_KINDS];   /* their wall time */
    uint64_t graph_warmups[SPEC_STEP_KINDS];    /* steps that were a graph shape's first or second (s_unlike) */
    uint64_t plain_slow;                        /* plain cycles left out of the cost table as too slow to be a
                                                 * plain step's cost (spec_plain_guard_slow) */
    double host_seconds;                        /* spec_step_*'s own host time, outside the proposer, the forward
                                                 * and the owner's emit hook (streaming, as a plain step's) */
} spec_step_counts_t;
/* All 0 when s is NULL. */
void spec_step_counts(const spec_step_t *s, spec_step_counts_t *out);

/* spec_verify_steps_total, spec_draft_tokens_total, spec_accepted_tokens_total,
 * spec_acceptance_rate, spec_mean_accepted_length, the step kinds' counts (spec_step_counts:
 * spec_off_steps_total, spec_off_seconds_total, spec_explore_*, spec_drafting_*,
 * spec_upkeep_seconds_total and spec_upkeep_calls_total: the proposer in steps the policy asked
 * nothing of, spec_off_proposer_calls_total, spec_host_seconds_total), the proposer's and the
 * policy client's (nothing when off). */
void spec_step_stats(const spec_step_t *s, actor_t *a, msg_stats_t *st);

#endif
