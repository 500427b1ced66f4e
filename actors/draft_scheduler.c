/* actors/draft_scheduler.c — the draft-scheduler actor: collects the decode workers' speculation
 * reports and pushes the verify-length policy computed from them (engine/spec_policy.h).
 *
 * Duties:
 *   - every `spec_report` (a worker's window): acceptance by draft position, confidence
 *     calibration and step-cost cells added into one table for the cluster (old windows decay);
 *     a report that does not fit (a cell outside the table) is answered with bad_request;
 *   - every DS_PUSH_MS: recompute the policy when reports came in, and push `draft_policy` to
 *     every decode worker of the topology, changed or not, so that a worker knows the scheduler
 *     is there (a worker applies a policy for valid_ms, DS_VALID_PUSHES pushes, then falls back
 *     to its own default: a scheduler that died or hangs takes its policy with it);
 *   - in the periodic stats: reports, the policy's epoch and source, the cluster's acceptance,
 *     mean accepted length, the survival of the first positions, and the verify length and
 *     break-even confidence it chose at a few batch sizes.
 *
 * TROUPE_DRAFT_POLICY_FILE (optional) names a file read at every push that pins the policy:
 * "auto" (or no file): computed from the reports; "none": push nothing (workers use their
 * default); otherwise buckets "MAX_BATCH:K[:MIN_CONFIDENCE] ..." in ascending MAX_BATCH. A file
 * that does not parse is logged and treated as "auto". TROUPE_DRAFT_POLICY_VALID_MS overrides
 * valid_ms (default DS_VALID_PUSHES x DS_PUSH_MS). TROUPE_SPEC_POLICY_LOG (optional) names a file
 * that gets one line per computation: every acceptance count and cost cell it read, the tokens/s
 * it expected of each k at each batch bucket, and what it chose (spec_policy_log_line), for
 * replaying offline (tools/spec-policy-replay).
 *
 * Known limits: one policy for every worker (they are assumed to run the same model on the same
 * kind of device); the cost table learns only the (batch, drafts per row) the workers run, the
 * rest comes from a linear fit (no exploration); the policy's max_k is a constant. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/runtime/actor.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/spec_policy.h"

#define DS_PUSH_MS          250    /* policy pushes (and recomputes): a level of a GPU benchmark
                                    * can be over in half a second */
#define DS_VALID_PUSHES     20     /* a pushed policy holds this many push intervals (5 s) */
#define DS_MAX_K            7      /* drafts per row the policy considers */
#define DS_DECAY_DRAFTS     200000 /* position-0 drafts past which the acceptance counts halve */
#define DS_DECAY_STEPS      4000   /* steps in a cost cell past which the table halves: the cells
                                    * compared stay recent (a few seconds of steps on a GPU) */
#define DS_MAX_WORKERS      64

typedef enum { DS_SRC_NONE = 0, DS_SRC_COMPUTED, DS_SRC_FILE } ds_source_t;

typedef struct {
    actor_t *a;
    spec_accept_t acc;            /* acceptance by position, calibration: the cluster's, decaying */
    spec_cost_t cost;             /* step costs: the cluster's, decaying */
    spec_stats_t totals;          /* every report's verify steps, drafts, accepted (never decays) */
    spec_policy_t policy;         /* the latest policy (valid when source != DS_SRC_NONE) */
    ds_source_t source;
    int dirty;                    /* reports since the last computation */
    uint64_t reports, refused, pushes, push_failures, push_errors;
    char why[160];                /* why there is no computed policy yet */
    const char *pin_file;         /* TROUPE_DRAFT_POLICY_FILE or NULL */
    FILE *log;                    /* TROUPE_SPEC_POLICY_LOG: a line per computation (spec_policy_log_line); NULL: none */
    int64_t start_ms;             /* the log's time origin */
    uint32_t valid_ms;
    int max_batch;                /* the topology's limits.max_batch */
    char workers[DS_MAX_WORKERS][TOPO_NAME_MAX];   /* the decode workers it pushes to */
    int n_workers;
} ds_state_t;

static int s_on_report(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    ds_state_t *s = state;
    const msg_spec_report_t *r = &m->u.spec_report;
    for (uint32_t i = 0; i < r->n_cost_batch; i++)
        if (r->cost_drafts[i] > SPEC_MAX_K) {
            s->refused++;
            return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0,
                                     "spec_report.cost_drafts[%u]: %u drafts per row, the table holds up to %d", i,
                                     r->cost_drafts[i], SPEC_MAX_K) < 0 ? -1 : 0;
        }
    spec_accept_t w = {0};
    for (uint32_t i = 0; i < r->n_proposed_at && i < SPEC_MAX_K; i++) {
        w.proposed[i] = r->proposed_at[i];
        w.accepted[i] = r->accepted_at[i];
    }
    /* the worker's bins, whatever their number, folded into ours by their centres */
    for (uint32_t j = 0; j < r->n_conf_seen; j++) {
        int bin = (int)(((double)j + 0.5) / r->n_conf_seen * SPEC_CONF_BINS);
        bin = bin >= SPEC_CONF_BINS ? SPEC_CONF_BINS - 1 : bin;
        w.conf_seen[bin] += r->conf_seen[j];
        w.conf_accepted[bin] += r->conf_accepted[j];
    }
    spec_accept_add(&s->acc, &w);
    for (uint32_t i = 0; i < r->n_cost_batch; i++) {
        const int b = spec_cost_bucket((int)r->cost_batch[i]);
        spec_cost_add_cell(&s->cost, b, (int)r->cost_drafts[i], r->cost_steps[i], (double)r->cost_us[i] / 1e6);
        if (i < r->n_cost_rows)
            spec_cost_add_tokens(&s->cost, b, (int)r->cost_drafts[i], r->cost_steps[i], r->cost_rows[i],
                                 r->cost_tokens[i]);
    }
    if (s->acc.proposed[0] > DS_DECAY_DRAFTS)
        spec_accept_decay(&s->acc);
    for (int b = 0; b < SPEC_COST_BATCHES; b++)
        for (int k = 0; k <= SPEC_MAX_K; k++)
            if (s->cost.steps[b][k] > DS_DECAY_STEPS) {
                spec_cost_decay(&s->cost);
                b = SPEC_COST_BATCHES;
                break;
            }
    s->totals.verify_steps += r->verify_steps;
    s->totals.drafts += r->drafts;
    s->totals.accepted += r->accepted;
    s->totals.emitted += r->verify_steps + r->accepted;
    s->reports++;
    s->dirty = 1;
    return 0;
}

/* A worker answered a push with an error (one that does not take draft_policy): counted and
 * logged, never answered, so that two actors cannot trade errors. */
static int s_on_error(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    ds_state_t *s = state;
    if (++s->push_errors <= 5 || s->push_errors % 1000 == 0)
        LOG_W("a worker refused draft_policy: %s (%llu refusals)", m->u.error.message,
              (unsigned long long)s->push_errors);
    return 0;
}

/* The pin file's policy into p: 1 pinned buckets, 0 "auto" or no file, -1 "none". A file that
 * does not parse is logged (once per change of its text) and counts as "auto". */
static int s_read_pin(ds_state_t *s, spec_policy_t *p)
{
    static char last_bad[256];
    char text[1024];
    FILE *f = s->pin_file ? fopen(s->pin_file, "r") : NULL;
    if (!f)
        return 0;
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *c = text;
    while (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r')
        c++;
    if (!*c || !strncmp(c, "auto", 4))
        return 0;
    if (!strncmp(c, "none", 4))
        return -1;
    spec_policy_t q = {.max_k = 1};
    const char *bad = NULL;
    while (*c && !bad) {
        char *end;
        errno = 0;
        const long mb = strtol(c, &end, 10);
        long k = -1;
        double conf = 0;
        if (end != c && *end == ':') {
            c = end + 1;
            k = strtol(c, &end, 10);
            if (end != c && *end == ':') {
                c = end + 1;
                conf = strtod(c, &end);
            }
        }
        if (errno || end == c || mb < 1 || k < 0 || k > SPEC_MAX_K || !(conf >= 0 && conf <= 1) ||
            q.n_buckets == SPEC_COST_BATCHES || (q.n_buckets && mb <= q.buckets[q.n_buckets - 1].max_batch)) {
            bad = c;
            break;
        }
        q.buckets[q.n_buckets++] = (spec_policy_bucket_t){.max_batch = (int)mb, .max_draft = (int)k,
                                                          .min_confidence = (float)conf};
        q.max_k = k > q.max_k ? (int)k : q.max_k;
        c = end;
        while (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r' || *c == ',')
            c++;
    }
    if (bad || !q.n_buckets) {
        if (strncmp(last_bad, text, sizeof last_bad - 1) != 0) {
            snprintf(last_bad, sizeof last_bad, "%.255s", text);
            LOG_W("TROUPE_DRAFT_POLICY_FILE %s: cannot read a bucket at '%.40s' (expected auto, none or "
                  "MAX_BATCH:K[:MIN_CONFIDENCE] ... ascending, K <= %d); computing the policy instead",
                  s->pin_file, bad ? bad : text, SPEC_MAX_K);
        }
        return 0;
    }
    q.epoch = p->epoch;
    *p = q;
    return 1;
}

/* The policy of this push: the pin file's, or a new computation when reports came in. */
static void s_update(ds_state_t *s)
{
    spec_policy_t p = s->policy;
    const int pin = s_read_pin(s, &p);
    if (pin < 0) {
        s->source = DS_SRC_NONE;
        snprintf(s->why, sizeof s->why, "TROUPE_DRAFT_POLICY_FILE says none");
        return;
    }
    if (pin > 0) {
        const int changed = s->source != DS_SRC_FILE || p.n_buckets != s->policy.n_buckets ||
                            memcmp(p.buckets, s->policy.buckets, sizeof p.buckets) != 0;
        p.epoch = s->policy.epoch + (uint64_t)changed;
        s->policy = p;
        s->source = DS_SRC_FILE;
        s->dirty = 1;   /* back to computing once the pin goes */
        return;
    }
    if (!s->dirty && s->source == DS_SRC_COMPUTED)
        return;
    p.epoch = s->policy.epoch + 1;
    const int ok = spec_policy_compute(&s->acc, &s->cost, DS_MAX_K, s->max_batch, &p, s->why, (int)sizeof s->why) == 0;
    if (s->log) {
        static char line[65536];   /* any table: 340 cells of about 50 characters, the rates */
        const int n = spec_policy_log_line(line, (int)sizeof line - 1, (double)(now_ms() - s->start_ms) / 1e3, &s->acc,
                                           &s->cost, DS_MAX_K, s->max_batch, ok, ok ? &p : &s->policy, s->why);
        if (n > 0) {
            line[n] = '\n';
            fwrite(line, 1, (size_t)n + 1, s->log);
            fflush(s->log);
        }
    }
    if (ok) {
        if (s->source != DS_SRC_COMPUTED)
            LOG_I("policy computed from %llu reports (epoch %llu)", (unsigned long long)s->reports,
                  (unsigned long long)p.epoch);
        s->policy = p;
        s->source = DS_SRC_COMPUTED;
        s->dirty = 0;
    } else if (s->source == DS_SRC_FILE) {
        s->source = DS_SRC_NONE;
    }
}

static int s_push(actor_t *a, void *state)
{
    ds_state_t *s = state;
    s_update(s);
    if (s->source == DS_SRC_NONE)
        return 0;
    const spec_policy_t *p = &s->policy;
    msg_draft_bucket_t b[SPEC_COST_BATCHES];
    for (int i = 0; i < p->n_buckets; i++)
        b[i] = (msg_draft_bucket_t){.max_batch = (uint32_t)p->buckets[i].max_batch,
                                    .max_draft = (uint32_t)p->buckets[i].max_draft,
                                    .min_confidence = p->buckets[i].min_confidence};
    msg_t m;
    msg_init(&m, MSG_DRAFT_POLICY, p->epoch);
    m.u.draft_policy = (msg_draft_policy_t){.epoch = p->epoch, .valid_ms = s->valid_ms, .max_k = (uint32_t)p->max_k,
                                            .buckets = b, .n_buckets = (uint32_t)p->n_buckets,
                                            .survival = p->survival, .n_survival = (uint32_t)p->n_survival,
                                            .calibration = p->calibration,
                                            .n_calibration = (uint32_t)p->n_calibration};
    for (int w = 0; w < s->n_workers; w++) {
        if (actor_send(a, s->workers[w], &m) == 0)
            s->pushes++;
        else
            s->push_failures++;   /* a worker away or behind: the next push tries again */
    }
    return 0;
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    ds_state_t *s = state;
    actor_stat_metric(a, st, "reports_total", (double)s->reports, 1);
    actor_stat_metric(a, st, "reports_refused_total", (double)s->refused, 1);
    actor_stat_metric(a, st, "policy_pushes_total", (double)s->pushes, 1);
    actor_stat_metric(a, st, "policy_push_failures_total", (double)s->push_failures, 1);
    actor_stat_metric(a, st, "policy_refusals_total", (double)s->push_errors, 1);
    actor_stat_metric(a, st, "policy_epoch", (double)s->policy.epoch, 0);
    actor_stat_metric(a, st, "policy_source", s->source, 0);   /* 0 none, 1 computed, 2 pinned by file */
    actor_stat_metric(a, st, "spec_draft_tokens_total", (double)s->totals.drafts, 1);
    actor_stat_metric(a, st, "spec_accepted_tokens_total", (double)s->totals.accepted, 1);
    actor_stat_metric(a, st, "spec_acceptance_rate", spec_stats_acceptance(&s->totals), 0);
    actor_stat_metric(a, st, "spec_mean_accepted_length", spec_stats_mean_len(&s->totals), 0);
    float surv[SPEC_MAX_K];
    if (spec_policy_survival(&s->acc, 4, surv) == 0) {
        static const char *const names[] = {"survival_pos0", "survival_pos1", "survival_pos2", "survival_pos3"};
        for (int i = 0; i < 4; i++)
            actor_stat_metric(a, st, names[i], surv[i], 0);
    }
    if (s->source == DS_SRC_NONE)
        return;
    /* the choice at a few batch sizes */
    static const int shown[] = {1, 16, 64, 96, 256};
    static const char *const k_names[] = {"verify_len_batch1", "verify_len_batch16", "verify_len_batch64",
                                          "verify_len_batch96", "verify_len_batch256"};
    static const char *const c_names[] = {"min_confidence_batch1", "min_confidence_batch16",
                                          "min_confidence_batch64", "min_confidence_batch96",
                                          "min_confidence_batch256"};
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
        const spec_policy_bucket_t *b = spec_policy_bucket(&s->policy, shown[i]);
        actor_stat_metric(a, st, k_names[i], b->max_draft, 0);
        actor_stat_metric(a, st, c_names[i], b->min_confidence, 0);
    }
}

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_DRAFT_SCHEDULER);
    if (!a)
        return 2;
    const topo_t *t = actor_topo(a);
    ds_state_t *s = calloc(1, sizeof *s);
    if (!s) {
        actor_destroy(&a);
        return 1;
    }
    s->a = a;
    s->max_batch = t->limits.max_batch;
    s->pin_file = getenv("TROUPE_DRAFT_POLICY_FILE");
    s->start_ms = now_ms();
    const char *log_path = getenv("TROUPE_SPEC_POLICY_LOG");
    if (log_path && *log_path && !(s->log = fopen(log_path, "a"))) {
        LOG_E("TROUPE_SPEC_POLICY_LOG %s: %s", log_path, strerror(errno));
        free(s);
        actor_destroy(&a);
        return ACTOR_EXIT_CONFIG;
    }
    s->valid_ms = DS_VALID_PUSHES * DS_PUSH_MS;
    const char *v = getenv("TROUPE_DRAFT_POLICY_VALID_MS");
    if (v && *v) {
        char *end;
        const long ms = strtol(v, &end, 10);
        if (*end || ms < 1 || ms > 86400000) {
            LOG_E("TROUPE_DRAFT_POLICY_VALID_MS '%s': expected milliseconds in [1, 86400000]", v);
            if (s->log)
                fclose(s->log);
            free(s);
            actor_destroy(&a);
            return ACTOR_EXIT_CONFIG;
        }
        s->valid_ms = (uint32_t)ms;
    }
    snprintf(s->why, sizeof s->why, "no reports yet");
    for (int i = 0; i < t->n_instances && s->n_workers < DS_MAX_WORKERS; i++)
        if (t->instances[i].role == ROLE_DECODE)
            snprintf(s->workers[s->n_workers++], TOPO_NAME_MAX, "%s", t->instances[i].name);
    actor_timer_add(a, DS_PUSH_MS, s_push);
    static const actor_handler_t handlers[] = {{MSG_SPEC_REPORT, s_on_report}, {MSG_ERROR, s_on_error}};
    actor_ops_t ops = {.handlers = handlers, .n_handlers = 2, .fill_stats = s_fill_stats};
    int rc = actor_run(a, &ops, s);
    if (s->log)
        fclose(s->log);
    free(s);
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
