/* tests/unit/test_spec_step.c — a decode worker's speculation (actors/worker/spec_step.c) driven
 * step by step as actors/decode.c drives it, without a target forward: the target's token after
 * each input token is made up (s_target_of), since what is checked is what the proposer is asked
 * to do, not what the drafts are worth:
 *   - a worker whose policy is off at its batch runs plain steps and never calls its proposer (a
 *     counting proposer), and its steps count as off (spec_step_counts); with no policy in force
 *     (the default k) and with a policy that drafts, every step calls it, the policy's asks
 *     bounded (max_catch_up: SPEC_RESUME_TOKENS over the rows, at most SPEC_RESUME_CATCH_UP);
 *   - plain cycles far slower than the worker's plain steps so far stay out of the cost table;
 *   - the draft model (fixture checkpoints): a stretch of off steps runs not one draft forward,
 *     and the step the policy turns drafting on again computes at most its bound a row (a window)
 *     where the whole stretch is longer, then the next step only the
 *     row's new tokens (fails with the catch-up of every token since);
 *   - MTP (kjv-deepseek from TROUPE_MODELS; skipped when absent): off steps are plain steps (no
 *     hidden states asked, no feed, no MTP forward), and the step drafting resumes in feeds each
 *     row's one position, beginning its MTP sequence again there: nothing of the stretch is
 *     computed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/worker/spec_step.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/engine_open.h"
#include "engine/model.h"
#include "engine/mtp.h"

#define ROWS 6
/* the policy's catch-up bound a row at ROWS drafting rows (spec_step.c s_propose) */
#define RESUME (SPEC_RESUME_TOKENS / ROWS < SPEC_EXPLORE_CATCH_UP ? SPEC_EXPLORE_CATCH_UP \
                : SPEC_RESUME_TOKENS / ROWS > SPEC_RESUME_CATCH_UP ? SPEC_RESUME_CATCH_UP : SPEC_RESUME_TOKENS / ROWS)
#define MAX_TOKS 512
#define PROMPT 20
#define MAX_K 2

/* ---- a decode worker's rows, stepped as decode.c s_step does -------------------------------- */

typedef struct {
    int V;
    kvpool_t *pool;                /* bookkeeping only: no target forward runs */
    sched_req_t req[ROWS];
    int32_t toks[ROWS][MAX_TOKS];
    sched_row_t rows[ROWS];
    sched_batch_t b;
    sampler_t *smp;                /* greedy */
} h_t;

static int32_t s_target_of(const h_t *h, int32_t t) { return (int32_t)(((int64_t)t * 17 + 5) % h->V); }

static sampler_t *s_sampler(void *ctx, sched_req_t *r, int *logprobs)
{
    *logprobs = 0;
    return ((h_t *)ctx)->smp;
}

/* The row whose emit said more follows (-1: none): its next token must come before any other's. */
static int s_more_row = -1;

static int s_emit(void *ctx, sched_req_t *r, int32_t t, float lp, const float *row, int at_length, int kv_keep,
                  int more)
{
    h_t *h = ctx;
    if (s_more_row >= 0)
        assert_int_equal(s_more_row, (int)(r - h->req));
    s_more_row = more ? (int)(r - h->req) : -1;
    int32_t *toks = h->toks[r - h->req];
    assert_true(r->n_toks < MAX_TOKS);
    toks[r->n_toks++] = t;
    return 1;
}

static void s_rows_init(h_t *h, int V)
{
    memset(h, 0, sizeof *h);
    h->V = V;
    char err[256];
    h->pool = kvpool_new(ROWS * (MAX_TOKS / 16 + 2), 16, 1, 1, 1, DT_F32, NULL, err, sizeof err);
    assert_non_null(h->pool);
    sampler_params_t sp;
    sampler_params_default(&sp);
    h->smp = sampler_new(&sp, V, NULL, 0, err, sizeof err);
    assert_non_null(h->smp);
    for (int i = 0; i < ROWS; i++) {
        sched_req_t *r = &h->req[i];
        for (int j = 0; j < PROMPT; j++)
            h->toks[i][j] = (int32_t)((j * 31 + i * 7 + 1) % V);
        *r = (sched_req_t){.id = 100 + (uint64_t)i, .toks = h->toks[i], .n_toks = PROMPT, .n_prompt = PROMPT,
                           .state = SCHED_RUNNING};
        r->kv = kvseq_new(h->pool, MAX_TOKS + SPEC_MAX_K, 0);
        assert_non_null(r->kv);
        assert_int_equal(kvseq_append(r->kv, h->toks[i], PROMPT - 1), 0);   /* a RUNNING request's last token is not fed yet */
        h->rows[i] = (sched_row_t){.req = r, .n_new = 1, .sample = 1};
    }
    h->b = (sched_batch_t){.n = ROWS, .n_decode = ROWS, .rows = h->rows};
}

static void s_rows_free(h_t *h)
{
    for (int i = 0; i < ROWS; i++)
        kvseq_destroy(&h->req[i].kv);
    sampler_destroy(&h->smp);
    kvpool_destroy(&h->pool);
}

static double s_cycle_s = 1e-4;   /* each step's cycle as s_step reports it */

/* Fills a verify step's hidden rows (an MTP proposer's buffer) as the target's forward would. */
typedef void (*s_hidden_fn)(float *hidden, int rows, void *arg);

/* One decode step: the scheduler's token in, drafts, the "forward", verification or the plain
 * emit, the step's end and its cycle. Returns what spec_step_propose said (1: a verify step). */
static int s_step(h_t *h, spec_step_t *s, s_hidden_fn fill, void *arg)
{
    for (int i = 0; i < ROWS; i++)
        assert_int_equal(kvseq_append(h->req[i].kv, &h->toks[i][h->req[i].n_toks - 1], 1), 0);
    const int verify = spec_step_propose(s, &h->b);
    if (verify) {
        model_batch_t mb = {0};
        spec_step_batch(s, &h->b, 0, &mb);
        int row = 0;
        for (int i = 0; i < ROWS; i++) {
            const sched_req_t *r = &h->req[i];
            const int32_t *kt = kvseq_tokens(r->kv);
            for (int j = 0; j <= spec_step_drafts(s, i); j++, row++)
                mb.argmax_out[row] = s_target_of(h, kt[r->n_toks - 1 + j]);   /* its last token, then its drafts */
        }
        if (mb.hidden_out && fill)
            fill(mb.hidden_out, row, arg);
        spec_step_verify(s, &h->b, NULL, h->V);
    } else {
        for (int i = 0; i < ROWS; i++)
            s_emit(h, &h->req[i], s_target_of(h, h->toks[i][h->req[i].n_toks - 1]), 0, NULL, 0, 0, 0);
    }
    spec_step_done(s, &h->b);
    spec_step_cycle(s, s_cycle_s);
    for (int i = 0; i < ROWS; i++)   /* the KV holds every token but the last, as after a decode step */
        assert_int_equal(kvseq_len(h->req[i].kv), h->req[i].n_toks - 1);
    return verify;
}

/* The draft-scheduler's policy: every batch up to 1,024 drafts `k` (0: off), max_k MAX_K. */
static void s_push(spec_step_t *s, uint32_t k)
{
    const msg_draft_bucket_t b[1] = {{.max_batch = 1024, .max_draft = k, .min_confidence = 0}};
    const msg_draft_policy_t p = {.epoch = 1 + k, .valid_ms = 600000, .max_k = MAX_K, .buckets = b, .n_buckets = 1};
    char err[256];
    assert_int_equal(spec_step_on_policy(s, &p, err, sizeof err), 0);
}

static spec_step_t *s_spec(spec_method_t m, spec_proposer_t *p, h_t *h, int max_rows)
{
    unsetenv("TROUPE_SPEC_POLICY");
    const spec_step_config_t c = {.method = m, .k = MAX_K, .pad_max_rows = 0};
    const spec_hooks_t hooks = {.ctx = h, .sampler = s_sampler, .emit = s_emit};
    char err[256];
    spec_step_t *s = spec_step_new(&c, p, ROWS, max_rows, MAX_TOKS, &hooks, err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    /* no actor: no draft-scheduler, so no exploration steps (spec_explore_next has its own tests) */
    assert_int_equal(spec_step_policy_init(s, NULL, err, sizeof err), 0);
    return s;
}

/* ---- a proposer that counts what it is asked --------------------------------------------------- */

typedef struct {
    int V;
    int calls;                     /* propose_batch calls */
    int asks;                      /* sequences asked */
    int catch_up[ROWS];            /* the last call's max_catch_up per ask */
} counting_t;

static int s_count_batch(spec_proposer_t *p, spec_ask_t *asks, int n)
{
    counting_t *c = p->impl;
    c->calls++;
    c->asks += n;
    for (int i = 0; i < n; i++) {
        spec_ask_t *a = &asks[i];
        c->catch_up[i < ROWS ? i : ROWS - 1] = a->max_catch_up;
        for (int j = 0; j < a->k; j++) {
            a->drafts[j] = (int32_t)(((int64_t)(j ? a->drafts[j - 1] : a->tokens[a->n - 1]) * 17 + 5) % c->V);
            if (a->probs)
                a->probs[j] = 0.9f;
        }
        a->n_drafts = a->k;
    }
    return 0;
}

static void s_count_destroy(spec_proposer_t *p) { (void)p; }

static const spec_proposer_ops_t s_count_ops = {.name = "counting", .propose_batch = s_count_batch,
                                                .destroy = s_count_destroy};

static void test_off_policy_calls_no_proposer(void **state)
{
    (void)state;
    h_t h;
    s_rows_init(&h, 512);
    counting_t c = {.V = 512};
    spec_proposer_t p = {.ops = &s_count_ops, .impl = &c};
    spec_step_t *s = s_spec(SPEC_DRAFT, &p, &h, ROWS * (1 + SPEC_MAX_K));
    spec_step_counts_t n;
    /* No policy yet: the default k, a proposal every step (the counter counts). */
    for (int i = 0; i < 4; i++)
        assert_int_equal(s_step(&h, s, NULL, NULL), 1);
    assert_int_equal(c.calls, 4);
    assert_int_equal(spec_step_max_drafts(s), MAX_K);
    /* The policy off at this batch: plain steps, the proposer untouched, and a step waits for the
     * router's room of a plain step's messages. */
    s_push(s, 0);
    assert_int_equal(spec_step_max_drafts(s), 0);
    for (int i = 0; i < 300; i++)
        assert_int_equal(s_step(&h, s, NULL, NULL), 0);
    assert_int_equal(c.calls, 4);
    spec_step_counts(s, &n);
    assert_int_equal(n.steps[SPEC_STEP_OFF], 300);
    assert_int_equal(n.proposer_calls[SPEC_STEP_OFF], 0);
    assert_true(n.proposer_seconds[SPEC_STEP_OFF] == 0);
    assert_int_equal(n.steps[SPEC_STEP_DRAFTING], 4);
    assert_int_equal(n.proposer_calls[SPEC_STEP_DRAFTING], 4);
    assert_int_equal(n.steps[SPEC_STEP_EXPLORE], 0);
    assert_true(n.host_seconds > 0);
    /* Drafting again: one proposal a step, every ask's catch-up bounded. */
    s_push(s, MAX_K);
    assert_int_equal(spec_step_max_drafts(s), MAX_K);
    assert_int_equal(s_step(&h, s, NULL, NULL), 1);
    assert_int_equal(c.calls, 5);
    assert_int_equal(c.asks, 5 * ROWS);
    for (int i = 0; i < ROWS; i++)
        assert_int_equal(c.catch_up[i], RESUME);
    /* Off again. */
    s_push(s, 0);
    for (int i = 0; i < 50; i++)
        assert_int_equal(s_step(&h, s, NULL, NULL), 0);
    assert_int_equal(c.calls, 5);
    spec_step_counts(s, &n);
    assert_int_equal(n.steps[SPEC_STEP_OFF], 350);
    assert_int_equal(n.steps[SPEC_STEP_DRAFTING], 5);
    assert_int_equal(n.proposer_calls[SPEC_STEP_OFF], 0);
    spec_step_destroy(&s);
    s_rows_free(&h);
}

/* A worker whose policy is off: plain cycles far slower than its plain steps so far (the H200's
 * batch-1 cell got 7 of 0.79 ms among steps of 0.2 ms, engine/spec_policy.h) are left out of the
 * cost table and counted; drafting cycles as slow are kept (fails without spec_plain_guard_slow). */
static void test_slow_plain_cycles_left_out(void **state)
{
    (void)state;
    h_t h;
    s_rows_init(&h, 512);
    counting_t c = {.V = 512};
    spec_proposer_t p = {.ops = &s_count_ops, .impl = &c};
    spec_step_t *s = s_spec(SPEC_DRAFT, &p, &h, ROWS * (1 + SPEC_MAX_K));
    s_push(s, 0);
    for (int i = 0; i < 12; i++)
        assert_int_equal(s_step(&h, s, NULL, NULL), 0);
    s_cycle_s = 8e-4;
    for (int i = 0; i < 3; i++)
        assert_int_equal(s_step(&h, s, NULL, NULL), 0);
    spec_step_counts_t n;
    spec_step_counts(s, &n);
    assert_int_equal(n.plain_slow, 3);
    assert_int_equal(n.steps[SPEC_STEP_OFF], 15);   /* still counted as off steps, with their cycles */
    s_cycle_s = 1.1e-4;
    assert_int_equal(s_step(&h, s, NULL, NULL), 0);
    s_push(s, MAX_K);
    s_cycle_s = 8e-4;
    for (int i = 0; i < 4; i++)
        assert_int_equal(s_step(&h, s, NULL, NULL), 1);
    spec_step_counts(s, &n);
    assert_int_equal(n.plain_slow, 3);
    s_cycle_s = 1e-4;
    spec_step_destroy(&s);
    s_rows_free(&h);
}

/* ---- the draft model --------------------------------------------------------------------------- */

#define FIXTURES "tests/fixtures/models"

static engine_t *s_target_engine(void)
{
    engine_spec_t es;
    engine_spec_default(&es);
    es.threads = 1;
    es.model = (model_opts_t){.max_tokens = 64, .max_seqs = ROWS, .max_logit_rows = ROWS * (1 + SPEC_MAX_K),
                              .max_context = MAX_TOKS + SPEC_MAX_K, .kv_block_size = 16};
    es.kv_blocks = 8;
    char err[512];
    engine_t *e = engine_open(FIXTURES "/llama-gqa-f32", &es, NULL, err, sizeof err);
    if (!e)
        fail_msg("%s", err);
    return e;
}

static void test_draft_resumes_within_window(void **state)
{
    (void)state;
    engine_t *t = s_target_engine();
    spec_draft_opts_t o = {.model_dir = FIXTURES "/llama-tied-bf16", .target = t, .max_seqs = ROWS, .max_tokens = 64,
                           .max_model_len = MAX_TOKS, .block_size = 16};
    char err[512];
    spec_proposer_t *d = spec_draft_new(&o, NULL, err, sizeof err);
    if (!d)
        fail_msg("%s", err);
    h_t h;
    s_rows_init(&h, t->cfg.vocab_size);
    spec_step_t *s = s_spec(SPEC_DRAFT, d, &h, ROWS * (1 + SPEC_MAX_K));
    s_push(s, MAX_K);
    for (int i = 0; i < 3; i++)   /* in step: the prompt (shorter than the window), then a few tokens a step */
        assert_int_equal(s_step(&h, s, NULL, NULL), 1);
    spec_draft_stats_t st0, st;
    spec_draft_stats(d, &st0);
    /* A stretch of off steps longer than the window: not one draft forward. */
    const int off = RESUME + 100;
    s_push(s, 0);
    for (int i = 0; i < off; i++)
        assert_int_equal(s_step(&h, s, NULL, NULL), 0);
    spec_draft_stats(d, &st);
    assert_int_equal(st.forwards, st0.forwards);
    assert_int_equal(st.tokens, st0.tokens);
    spec_step_counts_t n;
    spec_step_counts(s, &n);
    assert_int_equal(n.proposer_calls[SPEC_STEP_OFF], 0);
    /* Drafting again: each row computes its last RESUME tokens (a window; SPEC_RESUME_TOKENS in
     * all), not the 100 + RESUME it lacks, then its MAX_K - 1 draft positions. */
    assert_true(ROWS * RESUME <= SPEC_RESUME_TOKENS);
    for (int i = 0; i < ROWS; i++)
        assert_true(spec_draft_kv_len(d, h.req[i].id) < h.req[i].n_toks - RESUME);
    s_push(s, MAX_K);
    assert_int_equal(s_step(&h, s, NULL, NULL), 1);
    spec_draft_stats(d, &st);
    assert_int_equal(st.windows - st0.windows, ROWS);
    assert_true(st.tokens - st0.tokens <= (uint64_t)ROWS * (RESUME + MAX_K - 1));
    assert_true(st.tokens - st0.tokens >= (uint64_t)ROWS * RESUME);
    /* The next step: in step within the window, the row's new tokens and its draft positions. */
    spec_draft_stats(d, &st0);
    assert_int_equal(s_step(&h, s, NULL, NULL), 1);
    spec_draft_stats(d, &st);
    assert_int_equal(st.windows, st0.windows);
    assert_true(st.tokens - st0.tokens <= (uint64_t)ROWS * (MAX_K + 1 + MAX_K - 1));
    spec_step_destroy(&s);
    s_rows_free(&h);
    spec_proposer_destroy(&d);
    engine_destroy(&t);
}

/* ---- MTP ----------------------------------------------------------------------------------------- */

static void s_fill_hidden(float *hidden, int rows, void *arg)
{
    const int H = *(const int *)arg;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < H; j++)
            hidden[(size_t)r * H + j] = 0.5f * sinf(0.37f * (float)(r * H + j));
}

static void test_mtp_off_is_plain_and_restarts(void **state)
{
    (void)state;
    const char *root = getenv("TROUPE_MODELS");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/kjv-deepseek", root && *root ? root : "../shared/models");
    if (access(dir, R_OK) != 0) {
        print_message("SKIP: %s is absent (set TROUPE_MODELS to the shared models folder)\n", dir);
        skip();
    }
    model_config_t cfg;
    char err[1024];
    ckpt_t *ck = NULL;
    if (config_load(dir, &cfg, err, sizeof err) != 0 || !(ck = ckpt_open(dir, err, sizeof err)))
        fail_msg("%s", err);
    backend_t *be = backend_cpu_new(1);
    model_opts_t mo = {.max_tokens = 64, .max_seqs = ROWS, .max_logit_rows = ROWS * (1 + SPEC_MAX_K),
                       .max_context = MAX_TOKS + SPEC_MAX_K};
    model_t *m = model_load(dir, &cfg, ck, be, &mo, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    spec_proposer_t *mtp = spec_mtp_new(m, ROWS, MAX_TOKS + SPEC_MAX_K, err, sizeof err);
    if (!mtp)
        fail_msg("%s", err);
    h_t h;
    s_rows_init(&h, cfg.vocab_size);
    spec_step_t *s = s_spec(SPEC_MTP, mtp, &h, ROWS * (1 + MAX_K));
    int H = cfg.hidden_size;
    s_push(s, MAX_K);
    /* The first step only feeds (no MTP sequence yet), the next ones draft. */
    assert_int_equal(s_step(&h, s, s_fill_hidden, &H), 1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(s_step(&h, s, s_fill_hidden, &H), 1);
    spec_mtp_stats_t st0, st;
    spec_mtp_stats(mtp, &st0);
    assert_int_equal(st0.starts, ROWS);
    /* Off: plain steps, nothing of the MTP layer runs. */
    s_push(s, 0);
    for (int i = 0; i < 60; i++)
        assert_int_equal(s_step(&h, s, s_fill_hidden, &H), 0);
    spec_mtp_stats(mtp, &st);
    assert_int_equal(st.forwards, st0.forwards);
    assert_int_equal(st.rows, st0.rows);
    spec_step_counts_t n;
    spec_step_counts(s, &n);
    assert_int_equal(n.proposer_calls[SPEC_STEP_OFF], 0);
    /* Drafting again: a verify step that feeds one position a row and begins each row's MTP
     * sequence there (no drafts yet), then drafts from the step after. */
    s_push(s, MAX_K);
    spec_mtp_stats(mtp, &st0);
    assert_int_equal(s_step(&h, s, s_fill_hidden, &H), 1);
    spec_mtp_stats(mtp, &st);
    assert_int_equal(st.starts - st0.starts, ROWS);
    assert_int_equal(st.rows - st0.rows, ROWS);
    assert_int_equal(st.forwards - st0.forwards, 1);
    for (int i = 0; i < ROWS; i++)
        assert_int_equal(spec_mtp_base(mtp, h.req[i].id), h.req[i].n_toks - 2);
    s_step(&h, s, s_fill_hidden, &H);
    spec_step_counts(s, &n);
    assert_true(n.proposer_calls[SPEC_STEP_DRAFTING] >= 2);
    spec_step_destroy(&s);
    s_rows_free(&h);
    spec_proposer_destroy(&mtp);
    model_destroy(&m);
    ckpt_destroy(&ck);
    backend_destroy(&be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_policy_calls_no_proposer),
        cmocka_unit_test(test_slow_plain_cycles_left_out),
        cmocka_unit_test(test_draft_resumes_within_window),
        cmocka_unit_test(test_mtp_off_is_plain_and_restarts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
