/* actors/worker/spec_policy_client.c — a decode worker's reports to the draft-scheduler and the
 * policy it applies (spec_policy_client.h). A report that cannot be sent (the scheduler away, its
 * outbox full) is dropped, never retried: the scheduler's tables are a sample, not a ledger. */
#include "actors/worker/spec_policy_client.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

struct spec_client {
    actor_t *a;
    char scheduler[TOPO_NAME_MAX];   /* the draft-scheduler's name; "" when the topology has none */
    int default_k;               /* drafts per row without a policy */
    int has_dist;                /* the proposer gives draft probabilities */
    int scheduled;               /* 0: TROUPE_SPEC_POLICY=fixed */
    spec_policy_t policy;        /* the latest pushed policy */
    int64_t policy_until_ms;     /* in force until then (now_ms); 0: none arrived */
    uint64_t policies, policies_refused;
    /* the window being measured, sent and cleared by s_report */
    spec_accept_t acc;
    spec_cost_t cost;
    spec_stats_t win;            /* verify steps, drafts, accepted of the window */
    uint64_t win_steps;
    int64_t win_start_ms;
    uint64_t reports, reports_dropped;
    /* the chosen verify length, for stats */
    uint64_t chosen_sum, chosen_rows;
    double chosen_mean;          /* over the rows since the stats before */
    spec_explore_t explore;      /* which steps explore k = 0 and k = 1 (spec_explore_next) */
    spec_cost_t seen;            /* every cell this worker measured, decaying (the window's are sent
                                  * and cleared): what the exploration's back-off reads */
};

#define SEEN_DECAY_STEPS 4000    /* steps in a cell of `seen` past which it halves (the draft-scheduler's rule) */

int spec_client_scheduled_from_env(char *err, size_t errlen)
{
    const char *v = getenv("TROUPE_SPEC_POLICY");
    if (!v || !*v || strcmp(v, "scheduled") == 0)
        return 1;
    if (strcmp(v, "fixed") == 0)
        return 0;
    return errf(err, errlen, "TROUPE_SPEC_POLICY '%s': expected scheduled or fixed", v);
}

int spec_client_explore_share_from_env(double *share, char *err, size_t errlen)
{
    *share = SPEC_EXPLORE_SHARE;
    const char *v = getenv("TROUPE_SPEC_EXPLORE_SHARE");
    if (!v || !*v)
        return 0;
    char *end;
    const double x = strtod(v, &end);
    if (*end || !(x > 0 && x <= 1))   /* 0 would never explore: the policy could not turn drafting on */
        return errf(err, errlen, "TROUPE_SPEC_EXPLORE_SHARE '%s': expected a share of decode time in (0, 1]", v);
    *share = x;
    return 0;
}

spec_client_t *spec_client_new(actor_t *a, int default_k, int has_dist, char *err, size_t errlen)
{
    const int scheduled = spec_client_scheduled_from_env(err, errlen);
    if (scheduled < 0)
        return NULL;
    double share;
    if (spec_client_explore_share_from_env(&share, err, errlen) != 0)
        return NULL;
    spec_client_t *c = calloc(1, sizeof *c);
    if (!c) {
        errf(err, errlen, "out of memory for the speculation policy client");
        return NULL;
    }
    c->a = a;
    c->default_k = default_k < 0 ? 0 : default_k > SPEC_MAX_K ? SPEC_MAX_K : default_k;
    c->has_dist = has_dist;
    c->scheduled = scheduled;
    const topo_instance_t *ds = a ? topo_first(actor_topo(a), ROLE_DRAFT_SCHEDULER) : NULL;
    if (ds)
        snprintf(c->scheduler, sizeof c->scheduler, "%s", ds->name);
    c->win_start_ms = now_ms();
    c->chosen_mean = c->default_k;
    c->explore.share = share;
    return c;
}

void spec_client_destroy(spec_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free(*self_p);
    *self_p = NULL;
}

int spec_client_on_policy(spec_client_t *c, const msg_draft_policy_t *m, char *err, size_t errlen)
{
    if (m->n_buckets > SPEC_COST_BATCHES) {
        c->policies_refused++;
        return errf(err, errlen, "draft_policy.buckets: %u buckets, this worker holds up to %d", m->n_buckets,
                    SPEC_COST_BATCHES);
    }
    spec_policy_t p = {.epoch = m->epoch, .n_buckets = (int)m->n_buckets};
    p.max_k = m->max_k > SPEC_MAX_K ? SPEC_MAX_K : (int)m->max_k;
    for (uint32_t i = 0; i < m->n_buckets; i++)
        p.buckets[i] = (spec_policy_bucket_t){
            .max_batch = m->buckets[i].max_batch > (uint32_t)INT32_MAX ? INT32_MAX : (int)m->buckets[i].max_batch,
            .max_draft = m->buckets[i].max_draft > SPEC_MAX_K ? SPEC_MAX_K : (int)m->buckets[i].max_draft,
            .min_confidence = m->buckets[i].min_confidence};
    p.n_survival = m->n_survival > SPEC_MAX_K ? SPEC_MAX_K : (int)m->n_survival;
    for (int i = 0; i < p.n_survival; i++)
        p.survival[i] = m->survival[i];
    if (m->n_calibration) {   /* the scheduler's bins onto ours, by our bins' centres */
        p.n_calibration = SPEC_CONF_BINS;
        for (int j = 0; j < SPEC_CONF_BINS; j++) {
            uint32_t src = (uint32_t)(((double)j + 0.5) / SPEC_CONF_BINS * m->n_calibration);
            p.calibration[j] = m->calibration[src < m->n_calibration ? src : m->n_calibration - 1];
        }
    }
    if (p.epoch != c->policy.epoch || !c->policy_until_ms)
        LOG_D("draft policy epoch %llu: %d buckets, batch 1 verifies %d", (unsigned long long)p.epoch, p.n_buckets,
              spec_policy_bucket(&p, 1)->max_draft);
    c->policy = p;
    c->policy_until_ms = now_ms() + (int64_t)m->valid_ms;
    c->policies++;
    return 0;
}

int spec_client_active(const spec_client_t *c)
{
    return c->scheduled && c->policy_until_ms && now_ms() < c->policy_until_ms;
}

int spec_client_ask(spec_client_t *c, int batch)
{
    const int k = spec_client_active(c) ? spec_policy_ask(&c->policy, batch, c->has_dist) : c->default_k;
    if (!c->has_dist || k == 0) {   /* a point mass verifies what it asked for, and nothing asked is nothing verified */
        c->chosen_sum += (uint64_t)k;
        c->chosen_rows++;
    }
    return k;
}

int spec_client_max_ask(const spec_client_t *c)
{
    int k = c->default_k;
    if (spec_client_active(c)) {
        k = 0;
        for (int i = 0; i < c->policy.n_buckets; i++) {
            const int a = spec_policy_ask(&c->policy, c->policy.buckets[i].max_batch, c->has_dist);
            k = a > k ? a : k;
        }
    }
    if (c->scheduled && c->scheduler[0] && k < 1)   /* an exploration step's one draft */
        k = 1;
    return k;
}

float spec_client_stop_below(const spec_client_t *c, int batch)
{
    return c->has_dist && spec_client_active(c) ? spec_policy_stop_below(&c->policy, batch) : 0;
}

int spec_client_explore(spec_client_t *c, int batch)
{
    if (!c->scheduled || !c->scheduler[0])
        return -1;
    c->explore.early = !spec_client_active(c);   /* plain pairs come oftener until a policy is in force */
    return spec_explore_next(&c->explore, batch, &c->seen);
}

void spec_client_cycle(spec_client_t *c, int explored, double seconds)
{
    spec_explore_cycle(&c->explore, explored, seconds);
}

int spec_client_keep(spec_client_t *c, int batch, const float *probs, int n)
{
    int keep = n;
    if (spec_client_active(c))
        keep = spec_policy_keep(&c->policy, batch, c->has_dist ? probs : NULL, n);
    keep = keep > n ? n : keep;
    if (c->has_dist) {
        c->chosen_sum += (uint64_t)keep;
        c->chosen_rows++;
    }
    return keep;
}

void spec_client_verified(spec_client_t *c, int n, int n_accepted, const float *probs)
{
    if (n <= 0)
        return;
    float conf[SPEC_MAX_K];
    const float *pc = NULL;
    if (c->has_dist && probs) {
        double prod = 1.0;
        for (int i = 0; i < n && i < SPEC_MAX_K; i++)
            conf[i] = (float)(prod *= probs[i]);
        pc = conf;
    }
    spec_accept_record(&c->acc, n, n_accepted, pc);
    c->win.verify_steps++;
    c->win.drafts += (uint64_t)n;
    c->win.accepted += (uint64_t)n_accepted;
    c->win.emitted += (uint64_t)n_accepted + 1;
}

/* Sends the window to the draft-scheduler and starts the next one. */
static void s_report(spec_client_t *c)
{
    uint64_t proposed[SPEC_MAX_K], accepted[SPEC_MAX_K], steps[SPEC_COST_BATCHES * (SPEC_MAX_K + 1)],
        us[SPEC_COST_BATCHES * (SPEC_MAX_K + 1)];
    uint32_t batch[SPEC_COST_BATCHES * (SPEC_MAX_K + 1)], drafts[SPEC_COST_BATCHES * (SPEC_MAX_K + 1)];
    uint64_t rows[SPEC_COST_BATCHES * (SPEC_MAX_K + 1)], emitted[SPEC_COST_BATCHES * (SPEC_MAX_K + 1)];
    int all_counted = 1;   /* cost_rows / cost_tokens go only when every cell's steps were counted */
    uint32_t n_pos = 0, n_cells = 0;
    for (int i = 0; i < SPEC_MAX_K; i++) {
        proposed[i] = c->acc.proposed[i];
        accepted[i] = c->acc.accepted[i];
        if (proposed[i])
            n_pos = (uint32_t)i + 1;
    }
    for (int b = 0; b < SPEC_COST_BATCHES; b++)
        for (int k = 0; k <= SPEC_MAX_K; k++)
            if (c->cost.steps[b][k]) {
                batch[n_cells] = (uint32_t)spec_cost_batch(b);
                drafts[n_cells] = (uint32_t)k;
                steps[n_cells] = c->cost.steps[b][k];
                rows[n_cells] = c->cost.rows[b][k];
                emitted[n_cells] = c->cost.emitted[b][k];
                all_counted &= c->cost.counted[b][k] == c->cost.steps[b][k];
                us[n_cells++] = (uint64_t)(c->cost.seconds[b][k] * 1e6 + 0.5);
            }
    int any_conf = 0;
    for (int j = 0; j < SPEC_CONF_BINS; j++)
        any_conf |= c->acc.conf_seen[j] != 0;
    msg_t m;
    msg_init(&m, MSG_SPEC_REPORT, c->reports + 1);
    m.u.spec_report = (msg_spec_report_t){
        .worker = actor_self(c->a)->name, .steps = c->win_steps, .verify_steps = c->win.verify_steps,
        .drafts = c->win.drafts, .accepted = c->win.accepted,
        .proposed_at = proposed, .n_proposed_at = n_pos, .accepted_at = accepted, .n_accepted_at = n_pos,
        .conf_seen = c->acc.conf_seen, .n_conf_seen = any_conf ? SPEC_CONF_BINS : 0,
        .conf_accepted = c->acc.conf_accepted, .n_conf_accepted = any_conf ? SPEC_CONF_BINS : 0,
        .cost_batch = batch, .n_cost_batch = n_cells, .cost_drafts = drafts, .n_cost_drafts = n_cells,
        .cost_steps = steps, .n_cost_steps = n_cells, .cost_us = us, .n_cost_us = n_cells,
        .cost_rows = rows, .n_cost_rows = all_counted ? n_cells : 0,
        .cost_tokens = emitted, .n_cost_tokens = all_counted ? n_cells : 0};
    if (actor_send(c->a, c->scheduler, &m) == 0)
        c->reports++;
    else
        c->reports_dropped++;
    memset(&c->acc, 0, sizeof c->acc);
    memset(&c->cost, 0, sizeof c->cost);
    memset(&c->win, 0, sizeof c->win);
    c->win_steps = 0;
    c->win_start_ms = now_ms();
}

void spec_client_step(spec_client_t *c, int rows, int k, long emitted, double seconds)
{
    spec_cost_record_step(&c->cost, rows, k, emitted, seconds);
    spec_cost_record_step(&c->seen, rows, k, emitted, seconds);
    const int b = spec_cost_bucket(rows < 1 ? 1 : rows), kk = k > SPEC_MAX_K ? SPEC_MAX_K : k;
    if (kk >= 0 && c->seen.steps[b][kk] > SEEN_DECAY_STEPS)
        spec_cost_decay(&c->seen);
    c->win_steps++;
    if (!c->scheduler[0])
        return;
    if (c->win_steps >= SPEC_REPORT_STEPS || now_ms() - c->win_start_ms >= SPEC_REPORT_MS)
        s_report(c);
}

void spec_client_stats(spec_client_t *c, actor_t *a, msg_stats_t *st)
{
    if (c->chosen_rows) {
        c->chosen_mean = (double)c->chosen_sum / (double)c->chosen_rows;
        c->chosen_sum = c->chosen_rows = 0;
    }
    actor_stat_metric(a, st, "spec_policy_active", spec_client_active(c), 0);
    actor_stat_metric(a, st, "spec_policy_epoch", (double)c->policy.epoch, 0);
    actor_stat_metric(a, st, "spec_chosen_verify_len", c->chosen_mean, 0);
    actor_stat_metric(a, st, "spec_reports_total", (double)c->reports, 1);
    actor_stat_metric(a, st, "spec_reports_dropped_total", (double)c->reports_dropped, 1);
    actor_stat_metric(a, st, "spec_policies_total", (double)c->policies, 1);
    actor_stat_metric(a, st, "spec_explore_backoffs_total", (double)c->explore.backoffs, 1);
    actor_stat_metric(a, st, "spec_explore_plain_backoffs_total", (double)c->explore.plain_backoffs, 1);
    actor_stat_metric(a, st, "spec_explore_share", c->explore.share, 0);
    actor_stat_metric(a, st, "spec_explore_held_total", (double)c->explore.held, 1);
}
