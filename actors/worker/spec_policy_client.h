/* actors/worker/spec_policy_client.h — a decode worker's side of the draft-scheduler: it measures
 * (acceptance by draft position, draft confidence against acceptance, the cost of each decode-only
 * step by batch and drafts per row), sends a `spec_report` every SPEC_REPORT_STEPS decode-only
 * steps (or SPEC_REPORT_MS, whichever comes first) to the topology's draft-scheduler, and applies
 * the `draft_policy` it pushes: per step and per row, how many drafts to ask the proposer for
 * and how many of them to verify, from the step's batch size and the row's own confidence
 * (engine/spec_policy.h), decided here without a round trip.
 *
 * When no policy is in force (none arrived yet, the last one is older than its valid_ms because
 * the scheduler died or hangs, or TROUPE_SPEC_POLICY=fixed) a row asks for the worker's default k
 * and verifies every draft it got: speculation goes on as configured.
 *
 * TROUPE_SPEC_POLICY: "scheduled" (default: apply the pushed policy) or "fixed" (keep k fixed at
 * the configured value; reports are still sent, so the scheduler learns the costs of that k).
 *
 * One owner (the decode loop); nothing allocates after spec_client_new. */
#ifndef TROUPE_ACTORS_WORKER_SPEC_POLICY_CLIENT_H
#define TROUPE_ACTORS_WORKER_SPEC_POLICY_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "actors/runtime/actor.h"
#include "engine/spec_policy.h"

#define SPEC_REPORT_STEPS 256   /* decode-only steps per report window */
#define SPEC_REPORT_MS    500   /* ... or this long (a window of a new load reaches the policy soon) */

typedef struct spec_client spec_client_t;

/* The client of worker actor a with default_k drafts per row (1..SPEC_MAX_K); has_dist: its
 * proposer gives each draft's probability (a draft model), so confidence decides per row. Reads
 * TROUPE_SPEC_POLICY. NULL with err (naming the variable) on a bad value, or out of memory. A
 * topology without a draft-scheduler (or a NULL actor, for tests) gets a client that never
 * reports; it applies a policy handed to spec_client_on_policy all the same. */
/* TROUPE_SPEC_POLICY: 1 scheduled (unset, "" or "scheduled"), 0 fixed, -1 with why naming it. */
int spec_client_scheduled_from_env(char *err, size_t errlen);
/* TROUPE_SPEC_EXPLORE_SHARE into share (unset or "": SPEC_EXPLORE_SHARE): 0, or -1 with why
 * naming it when it is not a number in (0, 1]. */
int spec_client_explore_share_from_env(double *share, char *err, size_t errlen);
spec_client_t *spec_client_new(actor_t *a, int default_k, int has_dist, char *err, size_t errlen);
void spec_client_destroy(spec_client_t **self_p);

/* A draft_policy arrived: it is in force for its valid_ms from now (unless fixed). -1 with why
 * when it cannot be applied (more buckets than the worker holds); the previous one stays. */
int spec_client_on_policy(spec_client_t *c, const msg_draft_policy_t *p, char *err, size_t errlen);

/* Drafts a row of a step with `batch` decode rows asks its proposer for (0: none). */
int spec_client_ask(spec_client_t *c, int batch);
/* The most drafts a row of any step may ask for now: the policy's most at any batch (the default
 * k while none is in force), and at least 1 where exploration steps come (spec_client_explore). */
int spec_client_max_ask(const spec_client_t *c);
/* The prefix confidence below which a row of a `batch`-row step may stop drafting (0: never). */
float spec_client_stop_below(const spec_client_t *c, int batch);
/* Called once per decode-only step of `batch` rows: -1 (ask as usual), or the drafts every row
 * of this step asks for and verifies, whatever the policy (spec_explore_next: two plain steps in
 * 2 x SPEC_EXPLORE_EVERY, two one-draft steps in SPEC_EXPLORE_ONE_EVERY steps of the batch
 * bucket, backing off where this worker's measured cells say drafting loses by far there), while
 * a draft-scheduler is there to learn from them (not with TROUPE_SPEC_POLICY=fixed); a due
 * one-draft pair waits while exploration has spent its share of the decode time
 * (TROUPE_SPEC_EXPLORE_SHARE, default SPEC_EXPLORE_SHARE: engine/spec_policy.h). */
int spec_client_explore(spec_client_t *c, int batch);
/* A decode-only step's whole cycle took seconds; explored: it was a one-draft exploration step.
 * What the exploration budget earns and spends (spec_explore_cycle). */
void spec_client_cycle(spec_client_t *c, int explored, double seconds);
/* Of the n drafts a row got, with their probabilities probs (NULL: a point mass), how many it
 * verifies (<= n). */
int spec_client_keep(spec_client_t *c, int batch, const float *probs, int n);
/* A row verified n drafts and accepted the first n_accepted (probs as given to keep). */
void spec_client_verified(spec_client_t *c, int n, int n_accepted, const float *probs);
/* A decode-only step of `rows` rows in cost cell k (drafts per row: spec_cost_t) emitted
 * `emitted` tokens (< 0: not counted) and took `seconds`; sends the window's report when it is
 * full. */
void spec_client_step(spec_client_t *c, int rows, int k, long emitted, double seconds);

/* 1 while a pushed policy is in force. */
int spec_client_active(const spec_client_t *c);

/* spec_policy_active, spec_policy_epoch, spec_chosen_verify_len (mean drafts per row the policy,
 * or the default, let rows verify since the last stats), spec_reports_total,
 * spec_policies_total, spec_explore_backoffs_total (explorations that doubled a bucket's
 * one-draft interval), spec_explore_plain_backoffs_total (plain pairs that doubled a bucket's
 * plain interval, where drafting wins by far), spec_explore_share (the budget's share of decode time),
 * spec_explore_held_total (due one-draft pairs that waited for the budget). */
void spec_client_stats(spec_client_t *c, actor_t *a, msg_stats_t *st);

#endif
