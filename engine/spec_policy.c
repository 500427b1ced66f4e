/* engine/spec_policy.c — acceptance and cost tables, and the verify-length policy computed from
 * them (engine/spec_policy.h has the model). */
#include "engine/spec_policy.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int s_grid[SPEC_COST_BATCHES] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512,
                                              768, 1024};

static int s_conf_bin(float c)
{
    int j = (int)(c * SPEC_CONF_BINS);
    return j < 0 ? 0 : j >= SPEC_CONF_BINS ? SPEC_CONF_BINS - 1 : j;
}

void spec_accept_record(spec_accept_t *a, int n, int n_accepted, const float *prefix_conf)
{
    if (n > SPEC_MAX_K)
        n = SPEC_MAX_K;
    for (int i = 0; i < n; i++) {
        a->proposed[i]++;
        a->accepted[i] += i < n_accepted;
        if (prefix_conf) {
            const int j = s_conf_bin(prefix_conf[i]);
            a->conf_seen[j]++;
            a->conf_accepted[j] += i < n_accepted;
        }
    }
}

void spec_accept_add(spec_accept_t *into, const spec_accept_t *from)
{
    for (int i = 0; i < SPEC_MAX_K; i++) {
        into->proposed[i] += from->proposed[i];
        into->accepted[i] += from->accepted[i];
    }
    for (int j = 0; j < SPEC_CONF_BINS; j++) {
        into->conf_seen[j] += from->conf_seen[j];
        into->conf_accepted[j] += from->conf_accepted[j];
    }
}

void spec_accept_decay(spec_accept_t *a)
{
    /* accepted halves with proposed, rounding the same way, so accepted <= proposed stays true */
    for (int i = 0; i < SPEC_MAX_K; i++) {
        a->proposed[i] /= 2;
        a->accepted[i] /= 2;
    }
    for (int j = 0; j < SPEC_CONF_BINS; j++) {
        a->conf_seen[j] /= 2;
        a->conf_accepted[j] /= 2;
    }
}

int spec_cost_bucket(int b)
{
    for (int i = 0; i < SPEC_COST_BATCHES; i++)
        if (b <= s_grid[i])
            return i;
    return SPEC_COST_BATCHES - 1;
}

int spec_cost_batch(int bucket)
{
    return s_grid[bucket < 0 ? 0 : bucket >= SPEC_COST_BATCHES ? SPEC_COST_BATCHES - 1 : bucket];
}

void spec_cost_add_cell(spec_cost_t *c, int bucket, int k, uint64_t steps, double seconds)
{
    /* a cell's seconds stay finite (a report of absurd times is dropped, not summed to inf) and
     * belong to steps */
    if (bucket < 0 || bucket >= SPEC_COST_BATCHES || k < 0 || k > SPEC_MAX_K || steps == 0 || !(seconds >= 0) ||
        !isfinite(c->seconds[bucket][k] + seconds) || c->steps[bucket][k] + steps < steps)
        return;
    c->steps[bucket][k] += steps;
    c->seconds[bucket][k] += seconds;
}

void spec_cost_add_tokens(spec_cost_t *c, int bucket, int k, uint64_t steps, uint64_t rows, uint64_t emitted)
{
    if (bucket < 0 || bucket >= SPEC_COST_BATCHES || k < 0 || k > SPEC_MAX_K || rows == 0 || steps == 0)
        return;                                    /* rows of no counted step are nobody's */
    if (c->counted[bucket][k] + steps < steps || c->rows[bucket][k] + rows < rows ||
        c->emitted[bucket][k] + emitted < emitted)
        return;                                    /* counts that would wrap: dropped, not wrapped */
    c->counted[bucket][k] += steps;
    c->rows[bucket][k] += rows;
    c->emitted[bucket][k] += emitted;
}

void spec_cost_record_step(spec_cost_t *c, int batch, int k, long emitted, double seconds)
{
    if (batch < 1 || k < 0)
        return;
    const int b = spec_cost_bucket(batch);
    k = k > SPEC_MAX_K ? SPEC_MAX_K : k;
    spec_cost_add_cell(c, b, k, 1, seconds);
    if (emitted >= 0)
        spec_cost_add_tokens(c, b, k, 1, (uint64_t)batch, (uint64_t)emitted);
}

void spec_cost_record(spec_cost_t *c, int batch, int tokens, double seconds)
{
    if (batch < 1 || tokens < batch)
        return;
    const int k = (tokens - batch + batch / 2) / batch;   /* drafts per row, rounded */
    spec_cost_record_step(c, batch, k, -1, seconds);
}

void spec_cost_add(spec_cost_t *into, const spec_cost_t *from)
{
    for (int b = 0; b < SPEC_COST_BATCHES; b++)
        for (int k = 0; k <= SPEC_MAX_K; k++) {
            into->steps[b][k] += from->steps[b][k];
            into->seconds[b][k] += from->seconds[b][k];
            into->counted[b][k] += from->counted[b][k];
            into->rows[b][k] += from->rows[b][k];
            into->emitted[b][k] += from->emitted[b][k];
        }
}

void spec_cost_decay(spec_cost_t *c)
{
    for (int b = 0; b < SPEC_COST_BATCHES; b++)
        for (int k = 0; k <= SPEC_MAX_K; k++) {
            const uint64_t n = c->steps[b][k];
            if (n < 2 * SPEC_POLICY_MIN_STEPS)
                continue;
            c->seconds[b][k] = n > 1 ? c->seconds[b][k] * (double)(n / 2) / (double)n : c->seconds[b][k];
            c->steps[b][k] = n > 1 ? n / 2 : n;
            /* tokens per row kept as they were: rows and emitted scale with the counted steps */
            const uint64_t m = c->counted[b][k];
            if (m > 1) {
                c->rows[b][k] = (uint64_t)((double)c->rows[b][k] * (double)(m / 2) / (double)m + 0.5);
                c->emitted[b][k] = (uint64_t)((double)c->emitted[b][k] * (double)(m / 2) / (double)m + 0.5);
                c->counted[b][k] = m / 2;
            }
        }
}

int spec_cost_leave_out(int has_dist, int prev_asked, int asked)
{
    return has_dist && prev_asked != asked;
}

int spec_plain_guard_slow(spec_plain_guard_t *g, double seconds)
{
    if (!(seconds >= 0))
        return 1;
    const int slow = g->seen >= SPEC_POLICY_MIN_STEPS && seconds > SPEC_COST_PLAIN_SLOW * g->low;
    g->low = g->seen == 0 || seconds < g->low ? seconds : g->low * (1.0 + 1.0 / SPEC_COST_PLAIN_RISE);
    g->seen++;
    g->slow += (uint64_t)slow;
    return slow;
}

static double s_cell_rate(const spec_cost_t *c, int bucket, int k, uint64_t min_counted)
{
    if (bucket < 0 || bucket >= SPEC_COST_BATCHES || k < 0 || k > SPEC_MAX_K || c->counted[bucket][k] < min_counted ||
        c->steps[bucket][k] == 0 || !(c->seconds[bucket][k] > 0))
        return -1;
    return (double)c->emitted[bucket][k] / (double)c->counted[bucket][k] /
           (c->seconds[bucket][k] / (double)c->steps[bucket][k]);
}

double spec_cost_cell_rate(const spec_cost_t *c, int bucket, int k)
{
    return s_cell_rate(c, bucket, k, SPEC_POLICY_MIN_STEPS);
}

/* 1 when the measured cells of bucket b say drafting loses by far there: the plain cell measured,
 * a drafting cell with SPEC_EXPLORE_MIN_COUNTED counted steps, and the best of them below
 * 1 - SPEC_EXPLORE_WIDE of the plain one. Fewer steps than the policy needs: each exploration
 * adds one counted step (its first is the catch-up), a level of a GPU benchmark at concurrency
 * 96 is a few hundred steps, and a margin this wide is not the noise of two steps. */
#define SPEC_EXPLORE_MIN_COUNTED 2
/* 1 or 0 as above where bucket b's own cells tell; -1 where they do not (no measured plain cell,
 * or no drafting cell with SPEC_EXPLORE_MIN_COUNTED counted steps). */
static int s_verdict(const spec_cost_t *seen, int b)
{
    const double r0 = seen ? spec_cost_cell_rate(seen, b, 0) : -1;
    double best = -1;
    for (int k = 1; r0 > 0 && k <= SPEC_MAX_K; k++) {
        const double r = s_cell_rate(seen, b, k, SPEC_EXPLORE_MIN_COUNTED);
        best = r > best ? r : best;
    }
    if (!(r0 > 0) || best < 0)
        return -1;
    return best < r0 * (1.0 - SPEC_EXPLORE_WIDE);
}

/* Whether drafting loses by far at bucket b: its own cells' verdict, or where they have none yet
 * the nearest smaller bucket's that has one. A draft costs a larger share of a step as the batch
 * grows (the step turns compute-bound, the draft model's forward grows with its rows), so a
 * bucket where drafting loses by far tells the larger ones above it until they have their own
 * cells. Without it every bucket a level ramps through explored every 64 of its steps from the
 * start: on one H200 (kjv-dense with kjv-draft, 2026-12-03, cd61b16, policy off everywhere) the
 * timed run's 28 exploration steps took 1.713 ms a cycle against 0.370 for its 2,120 off steps,
 * 5.8% of its decode-only time, and batches 24-48 had no one-draft cell while batch 16's gave
 * half the plain rate and batch 64's a third. */
static int s_loses_by_far(const spec_cost_t *seen, int b)
{
    for (int bb = b; bb >= 0; bb--) {
        const int v = s_verdict(seen, bb);
        if (v >= 0)
            return v;
    }
    return 0;
}

/* 1 when bucket b's own measured cells say drafting wins by far there: the plain cell and a
 * drafting cell measured (SPEC_POLICY_MIN_STEPS counted steps each), the drafting one above 1 +
 * SPEC_EXPLORE_WIDE of the plain one's tokens/s. Own cells only: a plain pair at a bucket not
 * measured yet is what measures its plain cell. */
static int s_wins_by_far(const spec_cost_t *seen, int b)
{
    const double r0 = seen ? spec_cost_cell_rate(seen, b, 0) : -1;
    for (int k = 1; r0 > 0 && k <= SPEC_MAX_K; k++)
        if (spec_cost_cell_rate(seen, b, k) > r0 * (1.0 + SPEC_EXPLORE_WIDE))
            return 1;
    return 0;
}

/* 1 when this step of bucket b (its at-th) begins a plain pair, and sets the bucket's next one:
 * doubled interval where drafting wins by far, the start's otherwise (2 x SPEC_EXPLORE_EVERY, or
 * 2 x SPEC_EXPLORE_EARLY_EVERY while no policy is in force). A bucket's first step begins one. */
static int s_plain_due(spec_explore_t *e, int b, uint64_t at, const spec_cost_t *seen)
{
    const uint32_t start = 2 * (e->early ? SPEC_EXPLORE_EARLY_EVERY : SPEC_EXPLORE_EVERY);
    uint32_t *every = &e->plain_every[b];
    if (at < e->plain_next[b])
        return 0;
    if (*every == 0 || !s_wins_by_far(seen, b)) {
        *every = start;
    } else if (*every < SPEC_EXPLORE_PLAIN_MAX) {
        *every *= 2;
        e->plain_backoffs++;
    }
    e->plain_next[b] = at + *every;
    return 1;
}

int spec_explore_next(spec_explore_t *e, int batch, const spec_cost_t *seen)
{
    const int b = spec_cost_bucket(batch < 1 ? 1 : batch);
    const uint64_t at = e->at[b]++;
    e->steps++;
    if (e->one_left > 0) {   /* the pair's second step: it drafts as a one-draft policy would */
        e->one_left--;
        return 1;
    }
    if (e->plain_left > 0) {   /* the plain pair's second step: the one that measures the cell */
        e->plain_left--;
        return 0;
    }
    if (s_plain_due(e, b, at, seen)) {
        e->plain_left = 1;
        return 0;
    }
    if (e->one_every[b] == 0) {   /* the bucket's first step: its first pair comes half an interval on */
        e->one_every[b] = SPEC_EXPLORE_ONE_EVERY;
        /* where a smaller bucket already says drafting loses by far, from that bucket's interval */
        if (s_loses_by_far(seen, b))
            for (int bb = b - 1; bb >= 0; bb--)
                if (e->one_every[bb]) {
                    e->one_every[b] = e->one_every[bb] > e->one_every[b] ? e->one_every[bb] : e->one_every[b];
                    break;
                }
        e->one_next[b] = at + e->one_every[b] / 2;
    }
    if (at < e->one_next[b])
        return -1;
    if (e->credit < 0) {   /* due, but the last pairs are not paid for yet: it goes once they are */
        e->held += !e->one_held[b];
        e->one_held[b] = 1;
        return -1;
    }
    e->one_held[b] = 0;
    if (s_loses_by_far(seen, b)) {
        if (e->one_every[b] < SPEC_EXPLORE_ONE_MAX) {
            e->one_every[b] *= 2;
            e->backoffs++;
        }
    } else {
        e->one_every[b] = SPEC_EXPLORE_ONE_EVERY;
    }
    e->one_next[b] = at + e->one_every[b];
    e->one_left = 1;
    return 1;
}

void spec_explore_cycle(spec_explore_t *e, int explored, double seconds)
{
    if (!(seconds > 0))
        return;
    if (explored) {
        e->credit -= seconds;
        e->explore_seconds += seconds;
        return;
    }
    e->credit += (e->share > 0 ? e->share : SPEC_EXPLORE_SHARE) * seconds;
    e->credit = e->credit > 0 ? 0 : e->credit;   /* nothing saved up: no burst after a quiet stretch */
    e->other_seconds += seconds;
}

double spec_cost_tokens_per_row(const spec_cost_t *c, int bucket, int k)
{
    if (bucket < 0 || bucket >= SPEC_COST_BATCHES || k < 0 || k > SPEC_MAX_K ||
        c->counted[bucket][k] < SPEC_POLICY_MIN_STEPS || c->rows[bucket][k] == 0)
        return -1;
    return (double)c->emitted[bucket][k] / (double)c->rows[bucket][k];
}

static int s_measured(const spec_cost_t *c, int b, int k) { return c->steps[b][k] >= SPEC_POLICY_MIN_STEPS; }
/* time and tokens both measured: the cell's rate is what its steps gave */
static int s_counted(const spec_cost_t *c, int b, int k)
{
    return s_measured(c, b, k) && c->counted[b][k] >= SPEC_POLICY_MIN_STEPS && c->rows[b][k] > 0;
}
static double s_mean(const spec_cost_t *c, int b, int k) { return c->seconds[b][k] / (double)c->steps[b][k]; }

#define FIT_TERMS 4

/* Solves the n x n system m x = v (n <= FIT_TERMS) by Gaussian elimination with partial pivoting;
 * -1 when it is (nearly) singular. */
static int s_solve(int n, double m[FIT_TERMS][FIT_TERMS], double v[FIT_TERMS], double x[FIT_TERMS])
{
    double scale[FIT_TERMS] = {0};   /* each column's size before elimination: what "nearly 0" is relative to */
    for (int r = 0; r < n; r++)
        for (int j = 0; j < n; j++)
            scale[j] = fabs(m[r][j]) > scale[j] ? fabs(m[r][j]) : scale[j];
    for (int col = 0; col < n; col++) {
        int piv = col;
        for (int r = col + 1; r < n; r++)
            if (fabs(m[r][col]) > fabs(m[piv][col]))
                piv = r;
        if (!(fabs(m[piv][col]) > 1e-9 * scale[col]))
            return -1;
        for (int j = 0; j < n; j++) {
            const double t = m[col][j];
            m[col][j] = m[piv][j];
            m[piv][j] = t;
        }
        const double t = v[col];
        v[col] = v[piv];
        v[piv] = t;
        for (int r = col + 1; r < n; r++) {
            const double f = m[r][col] / m[col][col];
            for (int j = col; j < n; j++)
                m[r][j] -= f * m[col][j];
            v[r] -= f * v[col];
        }
    }
    for (int r = n - 1; r >= 0; r--) {
        double s = v[r];
        for (int j = r + 1; j < n; j++)
            s -= m[r][j] * x[j];
        x[r] = s / m[r][r];
    }
    return 0;
}

/* Least squares over the measured cells, one equation per cell: seconds = c0 + c1 T + c2 B + c3 k,
 * T = B (1 + k) the step's positions, B the bucket's batch, k the drafts per row (c3: what a draft
 * position costs whatever the batch: a draft-model forward, launches). Fewer terms when the cells
 * do not tell them apart (all at k = 0, say). Also the smallest measured mean. */
static int s_fit(const spec_cost_t *c, double coef[FIT_TERMS], double *min_mean)
{
    for (int n = FIT_TERMS; n >= 2; n--) {
        double m[FIT_TERMS][FIT_TERMS] = {{0}}, v[FIT_TERMS] = {0};
        int cells = 0;
        *min_mean = INFINITY;
        for (int b = 0; b < SPEC_COST_BATCHES; b++)
            for (int k = 0; k <= SPEC_MAX_K; k++) {
                if (!s_measured(c, b, k))
                    continue;
                const double B = s_grid[b], x[FIT_TERMS] = {1.0, B * (1 + k), B, k}, y = s_mean(c, b, k);
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < n; j++)
                        m[i][j] += x[i] * x[j];
                    v[i] += x[i] * y;
                }
                cells++;
                if (y < *min_mean)
                    *min_mean = y;
            }
        if (cells < 2)
            return -1;
        for (int i = n; i < FIT_TERMS; i++)
            coef[i] = 0;
        if (cells > n && s_solve(n, m, v, coef) == 0)
            return 0;
        if (n == 2 && s_solve(n, m, v, coef) == 0)
            return 0;
    }
    return -1;
}

/* The largest measured mean of a cell with at most `bucket`'s rows and at most k drafts a row. */
static double s_cost_floor(const spec_cost_t *c, int bucket, int k)
{
    double f = 0;
    for (int b = 0; b <= bucket; b++)
        for (int j = 0; j <= k; j++)
            if (s_measured(c, b, j) && s_mean(c, b, j) > f)
                f = s_mean(c, b, j);
    return f;
}

static double s_fit_at(const double coef[FIT_TERMS], int b, int k)
{
    const double B = s_grid[b];
    return coef[0] + coef[1] * B * (1 + k) + coef[2] * B + coef[3] * k;
}

/* The bucket's own measured drafting cells (k >= 1) nearest to k below and above it (-1: none).
 * Both carry what drafting costs at all (the draft forward, its catch-up) and differ only by
 * drafts a row, so between them the step grows linearly with its drafts at this bucket. */
static void s_drafting_neighbours(const spec_cost_t *c, int bucket, int k, int *lo, int *hi, int *top2)
{
    *lo = *hi = top2[0] = top2[1] = -1;
    for (int j = 1; j <= SPEC_MAX_K; j++) {
        if (!s_measured(c, bucket, j))
            continue;
        if (j < k)
            *lo = j;
        if (j > k && *hi < 0)
            *hi = j;
        top2[1] = top2[0];   /* the two largest measured drafting lengths, largest first */
        top2[0] = j;
    }
}

double spec_cost_estimate(const spec_cost_t *c, int bucket, int k)
{
    if (bucket < 0 || bucket >= SPEC_COST_BATCHES || k < 0 || k > SPEC_MAX_K)
        return -1;
    if (s_measured(c, bucket, k))
        return s_mean(c, bucket, k);
    /* The bucket's own measured drafting cells come first: the global fit is dominated by other
     * buckets' cells, and scaled to one neighbour it misses the bucket's own cost of a draft. On
     * one H200 (kjv-dense with kjv-draft, 2026-12-03, cd61b16) batch 1 had k = 1 measured at
     * 0.292 ms and k = 4 at 0.441 ms; the fit gave k = 2 the floor, 0.292 ms, k = 3 0.573 ms
     * (dearer than the measured k = 4) and k = 5-7 0.441 ms, where the fixed-k runs' concurrency-1
     * levels took 0.309 / 0.363 ms a step at k = 2 / 3 and 0.494 / 0.534 / 0.590 at k = 5 / 6 / 7
     * (the level's time less its TTFTs over its verify steps). Between two measured drafting cells
     * their line (0.342, 0.392); past the longest, its own slope (0.491, 0.541, 0.591). */
    int lo, hi, top[2];
    s_drafting_neighbours(c, bucket, k, &lo, &hi, top);
    double est;
    int own = 0;   /* est is from the bucket's own measured cells: the floor below guards the fit */
    if (k >= 1 && lo >= 1 && hi >= 1) {
        own = 1;
        const double at_lo = s_mean(c, bucket, lo), at_hi = s_mean(c, bucket, hi);
        est = at_lo + (at_hi - at_lo) * (double)(k - lo) / (double)(hi - lo);
    } else {
        double coef[FIT_TERMS], floor_s;
        if (s_fit(c, coef, &floor_s) != 0)
            return -1;
        est = s_fit_at(coef, bucket, k);
        /* The bucket's own level: the ratio of measured to fitted at its nearest measured cell. */
        for (int d = 1; d <= SPEC_MAX_K; d++) {
            const int kk[2] = {k - d, k + d};
            int found = 0;
            for (int i = 0; i < 2 && !found; i++)
                if (kk[i] >= 0 && kk[i] <= SPEC_MAX_K && s_measured(c, bucket, kk[i])) {
                    const double f = s_fit_at(coef, bucket, kk[i]);
                    if (f > 0)
                        est *= s_mean(c, bucket, kk[i]) / f;
                    found = 1;
                }
            if (found)
                break;
        }
        /* A fit may go below zero for small steps: never cheaper than a quarter of the cheapest step seen. */
        est = est > floor_s / 4 ? est : floor_s / 4;
        /* Past the longest measured drafting cell, the bucket's own cost of a draft, not the fit:
         * from its two longest drafting cells, or with one, from the line through its plain step,
         * which takes drafting's fixed cost (a draft model's forward) into the slope too, so it
         * errs dear. The fit is other buckets' steps: on one H100 (kjv-dense, n-gram, padding to
         * 128 rows, 2026-12-07) batch 16 measured 0.390 ms plain and 0.465 ms at k = 4, the fit
         * (dragged by larger batches' unpadded steps) made k = 7 1.928 ms, and the policy kept
         * k = 4 at 16 where the fixed k = 7 run was the fastest; the line gives 0.521 ms. */
        if (k > top[0] && top[0] >= 1 && (top[1] >= 1 || s_measured(c, bucket, 0))) {
            const int from = top[1] >= 1 ? top[1] : 0;
            const double per = (s_mean(c, bucket, top[0]) - s_mean(c, bucket, from)) / (double)(top[0] - from);
            est = s_mean(c, bucket, top[0]) + (per > 0 ? per : 0) * (double)(k - top[0]);
            own = 1;
        }
    }
    /* Never cheaper than a measured step of no more rows and no more drafts a row: a step does not
     * get cheaper as its batch or its drafts grow. Without this the fit ran away where nothing was
     * measured (one H200, kjv-deepseek with MTP, 2026-12-03, f25aa02: buckets 24-128 measured
     * nothing, the fit's cost fell to its floor as k grew, and batch 96 read 1,979,577 tokens/s at
     * k = 7 against 82,489 at k = 0, so a worker reaching batch 96 would have drafted 7). So an
     * unmeasured cell's tokens/s is at most its batch times its tokens per row over that measured
     * step's seconds. Only for the fit's estimates: a bucket's own cells are the more direct
     * measurement, and one slow cell of few steps at a smaller batch (batch 6 at k = 6, 2.0 ms, in
     * the H100 run above) would otherwise set every larger bucket's long steps. */
    double below = own ? 0 : s_cost_floor(c, bucket, k);
    /* And, from the fit, never cheaper than the same bucket's step with one draft less: the fit
     * scaled to the bucket's nearest measured cell is not monotone in k. On one H100 (kjv-dense,
     * n-gram, 2026-12-07, 1a4d520; tests/fixtures/spec-policy/h100-kjv-ngram-1a4d520.log) batch 16
     * had k = 0, 4 and 7 measured (0.407, 0.456, 0.540 ms); k = 1 and 2 came to 0.456 (capped
     * at k = 4's, below) and k = 3 to 0.407, the plain step's, so k = 3 read 70,177 tokens/s and
     * was chosen over the measured k = 4 (68,167). */
    if (!own && k >= 1) {
        const double prev = spec_cost_estimate(c, bucket, k - 1);
        below = prev > below ? prev : below;
    }
    est = est > below ? est : below;
    /* Nor dearer than the bucket's own measured step with more drafts a row, which is the more
     * direct measurement where the two disagree (cd61b16 above: batch 4's plain cell of 5 steps
     * read 2.888 ms, and made k = 1-3 at batch 16 dearer than its measured k = 4, 1.279 ms). */
    if (hi >= 1 && est > s_mean(c, bucket, hi))
        est = s_mean(c, bucket, hi);
    return est;
}

int spec_policy_survival(const spec_accept_t *a, int max_k, float *s)
{
    if (max_k > SPEC_MAX_K)
        max_k = SPEC_MAX_K;
    int last = -1;
    for (int i = 0; i < max_k; i++) {
        if (a->proposed[i] < SPEC_POLICY_MIN_SAMPLES)
            break;
        float v = (float)((double)a->accepted[i] / (double)a->proposed[i]);
        s[i] = i > 0 && v > s[i - 1] ? s[i - 1] : v;   /* a longer prefix never survives more often */
        last = i;
    }
    if (last < 0)
        return -1;
    /* Past the measured positions: the last measured conditional acceptance repeats. */
    const float ratio = last == 0 ? s[0] : s[last - 1] > 0 ? s[last] / s[last - 1] : 0.0f;
    for (int i = last + 1; i < max_k; i++)
        s[i] = s[i - 1] * ratio;
    return 0;
}

static double s_model_drafts(int k, const float *s)
{
    double d = 0;
    for (int i = 0; i < k; i++)
        d += s[i];
    return d;
}

/* A drafting cell's measured tokens per row as the policy reads them: with SPEC_POLICY_PRIOR_ROWS
 * rows more that emitted one token each (no draft kept), so a cell of a few steps at a small batch
 * (a handful of rows) cannot win on luck. On one H200 (kjv-deepseek, MTP, 2026-12-02, commit
 * b73d0f6) the batch-1 cell of two drafts had 7 steps that kept every draft (3.00 tokens a row,
 * 5,493 tokens/s against the plain cell's 4,886) and the policy drafted at 0.77x of no
 * speculation; with the prior rows it reads 1.93 (3,540 tokens/s), and a cell of hundreds of rows
 * (a larger batch, or a length the policy kept choosing) is all but unchanged. The prior errs
 * toward no speculation, the side the policy must err on. -1 when not measured. */
/* Tokens per row of drafting steps that emitted `emitted` over `rows` rows, with
 * SPEC_POLICY_PRIOR_ROWS rows of one token beside them. */
static double s_prior_tokens_per_row(uint64_t emitted, uint64_t rows)
{
    return ((double)emitted + SPEC_POLICY_PRIOR_ROWS) / ((double)rows + SPEC_POLICY_PRIOR_ROWS);
}

static double s_drafting_tokens_per_row(const spec_cost_t *c, int bucket, int k)
{
    const double tpr = spec_cost_tokens_per_row(c, bucket, k);
    if (tpr < 0 || k == 0)
        return tpr;
    return s_prior_tokens_per_row(c->emitted[bucket][k], c->rows[bucket][k]);
}

double spec_policy_rate(const spec_cost_t *c, int bucket, int batch, int k, const float *s)
{
    const double sec = spec_cost_estimate(c, bucket, k);
    if (sec <= 0)
        return -1;
    double per_row = s_drafting_tokens_per_row(c, bucket, k);
    if (per_row < 0) {
        /* The model, its accepted drafts scaled to what the bucket's counted k > 0 cells nearest
         * to k (one on each side where there are two) got of it, their rows pooled and the prior
         * rows counted once over the pool: a rarely explored cell next to a well-measured one
         * does not scale the model by its own few rows, halved by the prior. On one H200
         * (kjv-dense with kjv-draft, 2026-12-03, cd61b16) batch 1's k = 1 cell (9 rows, 1.78
         * tokens a row, 1.41 with the prior) scaled k = 2's model drafts by 0.65, beside a k = 4
         * cell of 172 rows that got 0.97 of the model. */
        double got = 0, model = 0, rows = 0;
        for (int dir = -1; dir <= 1; dir += 2)
            for (int j = k + dir; j >= 1 && j <= SPEC_MAX_K; j += dir) {
                const double tpr = spec_cost_tokens_per_row(c, bucket, j);
                if (tpr < 0)
                    continue;
                const double r = (double)c->rows[bucket][j];
                got += (tpr - 1.0) * r;
                model += s_model_drafts(j, s) * r;
                rows += r;
                break;
            }
        double eff = 1.0;
        if (rows > 0 && model > 0)
            eff = got / (model * (rows + SPEC_POLICY_PRIOR_ROWS) / rows);
        eff = eff < 0 ? 0 : eff > 1 ? 1 : eff;
        per_row = 1.0 + eff * s_model_drafts(k, s);
    }
    return (double)batch * per_row / sec;
}

/* The calibration: each bin's acceptance with one pseudo-draft at the bin's centre (an unmeasured
 * bin trusts the confidence), made non-decreasing by pooling adjacent violators (weighted by
 * drafts), so a higher confidence never calibrates lower and a well-measured bin is not overruled
 * by its unmeasured neighbours. */
static void s_calibrate(const spec_accept_t *a, float *cal)
{
    double v[SPEC_CONF_BINS], w[SPEC_CONF_BINS];
    int len[SPEC_CONF_BINS], n = 0;
    for (int j = 0; j < SPEC_CONF_BINS; j++) {
        const double centre = (j + 0.5) / SPEC_CONF_BINS, seen = (double)a->conf_seen[j];
        v[n] = ((double)a->conf_accepted[j] + centre) / (seen + 1.0);
        w[n] = seen + 1.0;
        len[n++] = 1;
        while (n > 1 && v[n - 2] > v[n - 1]) {
            v[n - 2] = (v[n - 2] * w[n - 2] + v[n - 1] * w[n - 1]) / (w[n - 2] + w[n - 1]);
            w[n - 2] += w[n - 1];
            len[n - 2] += len[n - 1];
            n--;
        }
    }
    for (int b = 0, j = 0; b < n; b++)
        for (int i = 0; i < len[b]; i++)
            cal[j++] = (float)v[b];
}

/* What drafting at bucket b gave, every drafting cell together: tokens per second of a step of
 * `batch` rows, its tokens per row pooled over the cells' counted steps (with the prior rows of
 * s_drafting_tokens_per_row) and its seconds per step over all their steps. -1 when fewer than
 * SPEC_POLICY_MIN_STEPS drafting steps were counted. */
double spec_policy_drafting_rate(const spec_cost_t *c, int bucket, int batch)
{
    if (bucket < 0 || bucket >= SPEC_COST_BATCHES)
        return -1;
    uint64_t counted = 0, rows = 0, emitted = 0, steps = 0;
    double seconds = 0;
    for (int k = 1; k <= SPEC_MAX_K; k++) {
        if (c->counted[bucket][k] == 0 || c->rows[bucket][k] == 0 || c->steps[bucket][k] == 0)
            continue;
        counted += c->counted[bucket][k];
        rows += c->rows[bucket][k];
        emitted += c->emitted[bucket][k];
        steps += c->steps[bucket][k];
        seconds += c->seconds[bucket][k];
    }
    if (counted < SPEC_POLICY_MIN_STEPS || !(seconds > 0))
        return -1;
    return (double)batch * s_prior_tokens_per_row(emitted, rows) / (seconds / (double)steps);
}

/* The measured plain rate of the bucket nearest to b in direction dir (-1 smaller, +1 larger,
 * up to last), as for a step of `batch` rows (its B / seconds scaled to batch); -1 when none. */
static double s_nearest_plain_rate(const spec_cost_t *c, int b, int dir, int last, int batch, const float *s)
{
    for (int bb = b + dir; bb >= 0 && bb <= last; bb += dir)
        if (s_counted(c, bb, 0))
            return spec_policy_rate(c, bb, s_grid[bb], 0, s) * batch / s_grid[bb];
    return -1;
}

/* 1 when the drafts' probabilities reached the calibration: the proposer has a distribution. */
static int s_has_dist(const spec_accept_t *a)
{
    for (int j = 0; j < SPEC_CONF_BINS; j++)
        if (a->conf_seen[j])
            return 1;
    return 0;
}

/* What drafting gave at bucket b where it was measured: the best drafting rate over the plain
 * rate (with a distribution every drafting cell together: spec_policy_drafting_rate), both counted;
 * -1 when either is not. */
static double s_measured_gain(const spec_cost_t *c, int b, const float *s, int has_dist)
{
    if (!s_counted(c, b, 0))
        return -1;
    const int B = s_grid[b];
    const double r0 = spec_policy_rate(c, b, B, 0, s);
    double best = has_dist ? spec_policy_drafting_rate(c, b, B) : -1;
    for (int k = 1; !has_dist && k <= SPEC_MAX_K; k++)
        if (s_counted(c, b, k)) {
            const double r = spec_policy_rate(c, b, B, k, s);
            best = r > best ? r : best;
        }
    return best > 0 && r0 > 0 ? best / r0 : -1;
}

/* The most drafting may gain at bucket b, as a factor of its plain rate, where b's own gain was
 * not measured: the larger of the measured gains of the nearest buckets below and above that have
 * one. -1 (no bound: the model alone) where b measured its own, or where no bucket did. On one
 * H200 (kjv-deepseek with MTP, 2026-12-03, f25aa02) the buckets 24-128 had measured nothing and the
 * model (the survival curve over a fitted cost) had k = 5-7 win there by 2-40x, where batch 16,
 * measured, gained nothing (drafting 43,277 tokens/s against a plain 43,800). */
static double s_gain_cap(const spec_cost_t *c, int b, const float *s, int has_dist)
{
    if (s_measured_gain(c, b, s, has_dist) >= 0)
        return -1;
    double cap = -1;
    for (int dir = -1; dir <= 1; dir += 2)
        for (int bb = b + dir; bb >= 0 && bb < SPEC_COST_BATCHES; bb += dir) {
            const double g = s_measured_gain(c, bb, s, has_dist);
            if (g >= 0) {
                cap = g > cap ? g : cap;
                break;
            }
        }
    return cap;
}

int spec_policy_bucket_rates(const spec_accept_t *a, const spec_cost_t *c, int max_k, int max_batch, int b,
                             const float *s, double *r)
{
    const int last = spec_cost_bucket(max_batch < 1 ? 1 : max_batch);
    if (b < 0 || b > last || max_k < 1 || max_k > SPEC_MAX_K)
        return -1;
    const int B = s_grid[b];
    double r0 = spec_policy_rate(c, b, B, 0, s);
    if (r0 <= 0)
        return -1;
    /* A plain step does not get cheaper as its batch grows, so where this bucket's plain step
     * was not measured, its rate is at most the nearest smaller bucket's measured plain rate
     * times B / B'. Drafting must beat that bound, not the fit: a fit of a table filled mostly
     * by drafting steps can underrate the plain step by far (one H200, KJV pair with n-gram
     * drafts, 2026-12-02: the fit's plain rate at batch 96 was a fifth of the bound from batch
     * 32's measured plain steps, and the policy drafted 7 there at 0.90x of no speculation).
     * The bound errs toward no speculation, the side the policy must err on. For the same
     * reason the nearest larger bucket's measured plain step, B / its seconds, is a rate this
     * one's plain step reaches at least: the only one a batch-1 bucket has, whose plain cell
     * exploration fills one step in 32 while the policy drafts (and whose fit rests on
     * drafting cells alone until then). */
    if (!s_counted(c, b, 0)) {
        const double below = s_nearest_plain_rate(c, b, -1, last, B, s);
        const double above = s_nearest_plain_rate(c, b, +1, last, B, s);
        r0 = below > r0 ? below : r0;
        r0 = above > r0 ? above : r0;
    }
    r[0] = r0;
    const double cap = s_gain_cap(c, b, s, s_has_dist(a));
    for (int k = 1; k <= max_k; k++) {
        r[k] = spec_policy_rate(c, b, B, k, s);
        if (cap >= 0 && r[k] > r0 * cap)
            r[k] = r0 * cap;
    }
    return 0;
}

int spec_policy_compute(const spec_accept_t *a, const spec_cost_t *c, int max_k, int max_batch, spec_policy_t *out,
                        char *why, int why_len)
{
    if (max_k < 1 || max_k > SPEC_MAX_K)
        return snprintf(why, (size_t)why_len, "max_k %d outside [1, %d]", max_k, SPEC_MAX_K), -1;
    spec_policy_t p = {.epoch = out->epoch, .max_k = max_k, .n_survival = max_k};
    if (spec_policy_survival(a, max_k, p.survival) != 0)
        return snprintf(why, (size_t)why_len, "fewer than %d drafts verified at position 0", SPEC_POLICY_MIN_SAMPLES),
               -1;
    const int last = spec_cost_bucket(max_batch < 1 ? 1 : max_batch);
    /* Drafting is judged against the plain step, so no policy until one is measured: a table of
     * drafting cells alone says nothing of what a step without drafts costs. The fit then stands
     * a drafting step's fixed cost (the draft model's forward, its catch-up) in for the plain
     * step, and every k looks nearly free. On one H200 (kjv-dense with kjv-draft, 2026-12-03,
     * 22dde92) the first computation had only k = 4 cells measured (1.97 ms a step at batch 64,
     * where plain steps take 0.35 ms): it gave k = 0 the same 2 ms and chose k = 7 at every
     * batch, and the next, still without a plain cell, 7 at batches 1-12. */
    int plain = 0;
    for (int b = 0; b <= last && !plain; b++)
        plain = s_measured(c, b, 0);
    if (!plain)
        return snprintf(why, (size_t)why_len, "no plain step measured yet (the cost of k = 0 is unknown)"), -1;
    int top_drafting = -1;   /* the largest bucket that measured drafting steps of its own */
    for (int b = 0; b <= last; b++)
        for (int k = 1; k <= SPEC_MAX_K; k++)
            if (s_measured(c, b, k))
                top_drafting = b;
    for (int b = 0; b <= last; b++) {
        const int B = s_grid[b];
        double rk[SPEC_MAX_K + 1];
        if (spec_policy_bucket_rates(a, c, max_k, max_batch, b, p.survival, rk) != 0)
            return snprintf(why, (size_t)why_len, "no step cost for batch %d (fewer than two measured cells)", B), -1;
        const double r0 = rk[0];
        int best = 0;
        double rbest = r0;
        for (int k = 1; k <= max_k; k++) {
            const double r = rk[k];
            if (r > rbest && r >= r0 * (1.0 + SPEC_POLICY_MIN_GAIN)) {
                rbest = r;
                best = k;
            }
        }
        /* No drafting past what was measured: a bucket above the largest one with drafting steps
         * of its own measured stays plain until its exploration pairs measure one (a one-draft
         * step, from which its own slope prices the longer lengths); between measured buckets the
         * model stands, bounded by their gains (s_gain_cap). A verify step's cost does not carry
         * up the batch sizes: past the rows a worker pads (TROUPE_SPEC_PAD_ROWS) rows with
         * different draft counts run op by op instead of from a CUDA graph. On one H100 (kjv-dense,
         * n-gram drafts, 2026-12-07; tests/fixtures/spec-policy/h100-kjv-ngram-sched.log) the
         * policy drafted 6, 3, 2 and 1 at batches 24-64 from the cells of batches 1-16; batch 64's
         * one-draft steps then took 1.18 ms against 0.40 ms plain, and the cluster ran 0.68x of no
         * speculation at concurrency 64. */
        if (best > 0 && b > top_drafting) {
            best = 0;
            rbest = r0;
        }
        /* Like for like: where this bucket's plain step and some of its drafting steps were
         * measured (times and emitted tokens), speculation stays on only if one of those drafting
         * cells really beat the plain one by the margin. An unmeasured length is the model's
         * interpolation between them, and cannot overrule what the cells themselves gave. */
        if (best > 0 && s_counted(c, b, 0)) {
            int any = 0, pays = 0;
            for (int k = 1; k <= SPEC_MAX_K; k++)
                if (s_counted(c, b, k)) {
                    any = 1;
                    pays |= spec_policy_rate(c, b, B, k, p.survival) >= r0 * (1.0 + SPEC_POLICY_MIN_GAIN);
                }
            if (any && !pays) {
                best = 0;
                rbest = r0;
            }
        }
        /* With a distribution (a draft model, an MTP layer: its drafts' confidence is calibrated)
         * the policy does not choose a cell. A bucket that drafts asks every row for max_k and
         * verifies what confidence keeps, so its steps fall in every drafting cell, among them
         * the steps that kept no draft or one (cell 1), which paid the proposer's forwards for
         * about a token a row: one cell that pays is not what drafting gives. So speculation
         * stays on only where the drafting cells together beat the plain rate by the margin.
         * On one H200 (kjv-deepseek, MTP, 2026-12-02, b73d0f6) the batch-1 cells were plain
         * 0.205 ms, one draft 0.357 ms for 1.14 tokens (207 steps, most of them kept none at the
         * policy's confidence of 0.82), two drafts 3.00 tokens in 0.546 ms (7 steps), four 2.41
         * tokens in 0.681 ms (94): the policy drafted, and the cluster ran 0.77x of no speculation. */
        if (best > 0 && s_has_dist(a)) {
            const double rd = spec_policy_drafting_rate(c, b, B);
            if (rd >= 0 && rd < r0 * (1.0 + SPEC_POLICY_MIN_GAIN)) {
                best = 0;
                rbest = r0;
            }
        }
        /* Hysteresis: a bucket that drafts keeps the length in force (out's, the policy the
         * workers run) unless the new best beats it by the margin. Each length is a graph shape of
         * its own at every batch size, recorded on first sight in the middle of serving: on one
         * H100 (kjv-dense, n-gram drafts, 2026-12-07) batch 16 went 7 -> 4 -> 7 -> 3 -> 4 over one
         * run with k = 4 and 7 within 4% of each other, and the scheduled entry gave 44,032 tokens/s
         * at concurrency 16 where the fixed k = 4 and 7 gave 56,148 and 57,629. */
        const spec_policy_bucket_t *was = out->n_buckets ? spec_policy_bucket(out, B) : NULL;
        if (best > 0 && !s_has_dist(a) && was && was->max_batch == B && was->max_draft > 0 &&
            was->max_draft <= max_k && was->max_draft != best &&
            rk[was->max_draft] * (1.0 + SPEC_POLICY_MIN_GAIN) >= rbest) {
            best = was->max_draft;
            rbest = rk[best];
        }
        /* The break-even survival at the optimum: seconds one more draft per row adds, per token,
         * times the tokens per second at best. The step's slope around the optimum (a central
         * difference where both sides exist: one noisy cell moves it less). */
        const int lo = best > 0 ? best - 1 : 0, hi = best < max_k ? best + 1 : max_k;
        const double dc = (spec_cost_estimate(c, b, hi) - spec_cost_estimate(c, b, lo)) / (double)(hi - lo) / (double)B;
        double theta = rbest * dc;
        /* NaN (an estimate that overflowed: inf - inf) as 1, keeping no draft: the side to err on */
        theta = theta < 0 ? 0 : theta <= 1 ? theta : 1;
        p.buckets[p.n_buckets++] = (spec_policy_bucket_t){.max_batch = B, .max_draft = best,
                                                          .min_confidence = (float)theta};
    }
    for (int j = 0; j < SPEC_CONF_BINS; j++)
        if (a->conf_seen[j] >= SPEC_POLICY_MIN_SAMPLES)
            p.n_calibration = SPEC_CONF_BINS;
    if (p.n_calibration)
        s_calibrate(a, p.calibration);
    *out = p;
    return 0;
}

const spec_policy_bucket_t *spec_policy_bucket(const spec_policy_t *p, int batch)
{
    for (int i = 0; i < p->n_buckets; i++)
        if (batch <= p->buckets[i].max_batch)
            return &p->buckets[i];
    return p->n_buckets ? &p->buckets[p->n_buckets - 1] : NULL;
}

float spec_policy_calibrate(const spec_policy_t *p, float conf)
{
    return p->n_calibration == SPEC_CONF_BINS ? p->calibration[s_conf_bin(conf)] : conf;
}

int spec_policy_ask(const spec_policy_t *p, int batch, int has_dist)
{
    const spec_policy_bucket_t *b = spec_policy_bucket(p, batch);
    if (!b)
        return 0;
    /* With a distribution a row drafts up to max_k and keeps what it is confident of; a bucket
     * where no draft pays (max_draft 0) drafts nothing: drafting alone costs a forward each. */
    return has_dist && b->max_draft > 0 ? p->max_k : b->max_draft;
}

float spec_policy_stop_below(const spec_policy_t *p, int batch)
{
    const spec_policy_bucket_t *b = spec_policy_bucket(p, batch);
    if (!b || b->min_confidence <= 0)
        return 0;
    if (p->n_calibration != SPEC_CONF_BINS)
        return b->min_confidence;
    /* the calibration is non-decreasing: the lowest bin that calibrates to the threshold */
    for (int j = 0; j < SPEC_CONF_BINS; j++)
        if (p->calibration[j] >= b->min_confidence)
            return j == 0 ? 0 : (float)j / SPEC_CONF_BINS;
    return 1.0f;
}

int spec_policy_keep(const spec_policy_t *p, int batch, const float *probs, int n)
{
    const spec_policy_bucket_t *b = spec_policy_bucket(p, batch);
    if (!b || n <= 0)
        return 0;
    if (!probs)
        return n < b->max_draft ? n : b->max_draft;
    double conf = 1.0;
    int keep = 0;
    while (keep < n && keep < p->max_k) {
        conf *= probs[keep];
        if (spec_policy_calibrate(p, (float)conf) < b->min_confidence)
            break;
        keep++;
    }
    return keep;
}

/* Appends to buf at *at; 0, or -1 once it does not fit (then *at stays past the end). */
static int s_put(char *buf, int len, int *at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int s_put(char *buf, int len, int *at, const char *fmt, ...)
{
    if (*at >= len)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf + *at, (size_t)(len - *at), fmt, ap);
    va_end(ap);
    *at += n < 0 ? len : n;
    return *at < len ? 0 : -1;
}

int spec_policy_log_line(char *buf, int len, double t, const spec_accept_t *a, const spec_cost_t *c, int max_k,
                         int max_batch, int ok, const spec_policy_t *p, const char *why)
{
    int at = 0, rc = 0;
    rc |= s_put(buf, len, &at, "t=%.3f epoch=%llu max_k=%d max_batch=%d ok=%d acc=", t,
                (unsigned long long)p->epoch, max_k, max_batch, ok);
    int n_pos = 0;
    for (int i = 0; i < SPEC_MAX_K; i++)
        if (a->proposed[i])
            n_pos = i + 1;
    for (int i = 0; i < n_pos; i++)
        rc |= s_put(buf, len, &at, "%s%llu/%llu", i ? "," : "", (unsigned long long)a->proposed[i],
                    (unsigned long long)a->accepted[i]);
    rc |= s_put(buf, len, &at, " conf=");
    for (int j = 0; j < SPEC_CONF_BINS; j++)
        rc |= s_put(buf, len, &at, "%s%llu/%llu", j ? "," : "", (unsigned long long)a->conf_seen[j],
                    (unsigned long long)a->conf_accepted[j]);
    rc |= s_put(buf, len, &at, " cells=");
    int first = 1;
    for (int b = 0; b < SPEC_COST_BATCHES; b++)
        for (int k = 0; k <= SPEC_MAX_K; k++)
            if (c->steps[b][k] || c->counted[b][k]) {
                rc |= s_put(buf, len, &at, "%s%d:%d:%llu:%.9g:%llu:%llu:%llu", first ? "" : ",", b, k,
                            (unsigned long long)c->steps[b][k], c->seconds[b][k], (unsigned long long)c->counted[b][k],
                            (unsigned long long)c->rows[b][k], (unsigned long long)c->emitted[b][k]);
                first = 0;
            }
    rc |= s_put(buf, len, &at, " rates=");
    float surv[SPEC_MAX_K] = {0};
    const int have_s = spec_policy_survival(a, max_k, surv) == 0;
    const int last = spec_cost_bucket(max_batch < 1 ? 1 : max_batch);
    for (int b = 0; have_s && b <= last; b++) {
        double r[SPEC_MAX_K + 1];
        if (spec_policy_bucket_rates(a, c, max_k, max_batch, b, surv, r) != 0)
            for (int k = 0; k <= max_k; k++)
                r[k] = -1;
        rc |= s_put(buf, len, &at, "%s%d:", b ? "," : "", b);
        for (int k = 0; k <= max_k; k++)
            rc |= s_put(buf, len, &at, "%s%.0f", k ? "/" : "", r[k]);
    }
    rc |= s_put(buf, len, &at, " choice=");
    for (int i = 0; i < p->n_buckets; i++)
        rc |= s_put(buf, len, &at, "%s%d:%d:%.4f", i ? "," : "", p->buckets[i].max_batch, p->buckets[i].max_draft,
                    p->buckets[i].min_confidence);
    rc |= s_put(buf, len, &at, " why=");
    for (const char *w = ok || !why ? "-" : why; *w; w++)   /* one token: spaces as '_' */
        rc |= s_put(buf, len, &at, "%c", *w == ' ' || *w == '\n' ? '_' : *w);
    return rc ? -1 : at;
}

/* The value of key `key=` in line (its first occurrence after a space or at the start), or NULL. */
static const char *s_field(const char *line, const char *key)
{
    const size_t n = strlen(key);
    for (const char *q = line; (q = strstr(q, key)) != NULL; q++)
        if ((q == line || q[-1] == ' ') && q[n] == '=')
            return q + n + 1;
    return NULL;
}

static int s_end(const char *q) { return *q == 0 || *q == ' ' || *q == '\n' || *q == '\r'; }

int spec_policy_log_parse(const char *line, spec_accept_t *a, spec_cost_t *c, int *max_k, int *max_batch,
                          spec_policy_t *choice, char *why, int why_len)
{
    memset(a, 0, sizeof *a);
    memset(c, 0, sizeof *c);
    const char *q = s_field(line, "max_k");
    char *end;
    long v = q ? strtol(q, &end, 10) : 0;
    if (!q || v < 1 || v > SPEC_MAX_K || !s_end(end))
        return snprintf(why, (size_t)why_len, "max_k: missing or outside [1, %d]", SPEC_MAX_K), -1;
    *max_k = (int)v;
    q = s_field(line, "max_batch");
    v = q ? strtol(q, &end, 10) : 0;
    if (!q || v < 1 || v > INT_MAX || !s_end(end))
        return snprintf(why, (size_t)why_len, "max_batch: missing or outside [1, %d]", INT_MAX), -1;
    *max_batch = (int)v;
    q = s_field(line, "acc");
    for (int i = 0; q && !s_end(q); i++) {
        unsigned long long pr, ac;
        int used;
        if (i >= SPEC_MAX_K || sscanf(q, "%llu/%llu%n", &pr, &ac, &used) != 2 || ac > pr)
            return snprintf(why, (size_t)why_len, "acc: entry %d does not read as PROPOSED/ACCEPTED", i), -1;
        a->proposed[i] = pr;
        a->accepted[i] = ac;
        q += used;
        q += *q == ',';
    }
    q = s_field(line, "conf");
    for (int j = 0; q && !s_end(q); j++) {
        unsigned long long se, ac;
        int used;
        if (j >= SPEC_CONF_BINS || sscanf(q, "%llu/%llu%n", &se, &ac, &used) != 2 || ac > se)
            return snprintf(why, (size_t)why_len, "conf: bin %d does not read as SEEN/ACCEPTED", j), -1;
        a->conf_seen[j] = se;
        a->conf_accepted[j] = ac;
        q += used;
        q += *q == ',';
    }
    q = s_field(line, "cells");
    for (int i = 0; q && !s_end(q); i++) {
        int b, k, used;
        unsigned long long st, co, ro, em;
        double sec;
        if (sscanf(q, "%d:%d:%llu:%lf:%llu:%llu:%llu%n", &b, &k, &st, &sec, &co, &ro, &em, &used) != 7 || b < 0 ||
            b >= SPEC_COST_BATCHES || k < 0 || k > SPEC_MAX_K || !(sec >= 0) || isinf(sec))
            return snprintf(why, (size_t)why_len, "cells: entry %d does not read as BUCKET:K:STEPS:SECONDS:COUNTED:ROWS:EMITTED",
                            i), -1;
        spec_cost_add_cell(c, b, k, st, sec);
        spec_cost_add_tokens(c, b, k, co, ro, em);
        q += used;
        q += *q == ',';
    }
    if (!choice)
        return 0;
    memset(choice, 0, sizeof *choice);
    choice->max_k = *max_k;
    q = s_field(line, "choice");
    for (int i = 0; q && !s_end(q); i++) {
        int mb, k, used;
        float conf;
        if (i >= SPEC_COST_BATCHES || sscanf(q, "%d:%d:%f%n", &mb, &k, &conf, &used) != 3)
            return snprintf(why, (size_t)why_len, "choice: entry %d does not read as MAX_BATCH:K:MIN_CONFIDENCE", i), -1;
        choice->buckets[choice->n_buckets++] = (spec_policy_bucket_t){.max_batch = mb, .max_draft = k,
                                                                      .min_confidence = conf};
        q += used;
        q += *q == ',';
    }
    return 0;
}
