/* tests/gpu/test_spec_draft_cuda.c — the draft-model proposer on the CUDA backend (engine/spec_draft.c),
 * on the KJV pair of the shared models folder (TROUPE_MODELS, default ../shared/models; skipped
 * when absent): kjv-dense the target, kjv-draft the draft.
 *
 * 1. The three ways greedy drafts come from the device (TROUPE_DRAFT_DEVICE): 0 a row of logits
 *    and the argmax op per draft, the softmax on the host; 1 the mtp_top op per draft, one
 *    download each; 2 (default) the draft positions chained on the device, one download per
 *    proposal. Over a run of proposals (each keeping some drafts, as a verify would) and a batch
 *    of three sequences with different k: the same drafts, token for token, in all three (the
 *    argmax op's id and mtp_top's are the same by contract), probabilities within 1e-5 relative
 *    (the device's f32 sum against the host's double one); the same on the CPU backend.
 * 2. Timing lines (not checks): a steady batch-1 proposal (one token of catch-up, k drafts) in
 *    each mode for k = 1..7, beside the target's own decode step and verify step of k + 1
 *    positions at batch 1 (graphs replayed), so what a speculating step costs is laid out.
 * Runs on the GPU node; CI only compiles it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/util.h"
#include "engine/engine_open.h"
#include "engine/spec.h"

#define MAX_LEN 1024
#define N_PROMPT 40
#define RUN 24

static char s_target_dir[4096], s_draft_dir[4096];

static int s_have_models(void)
{
    const char *root = getenv("TROUPE_MODELS");
    snprintf(s_target_dir, sizeof s_target_dir, "%s/kjv-dense", root && *root ? root : "../shared/models");
    snprintf(s_draft_dir, sizeof s_draft_dir, "%s/kjv-draft", root && *root ? root : "../shared/models");
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", s_draft_dir);
    FILE *f = fopen(p, "r");
    if (f)
        fclose(f);
    return f != NULL;
}

static engine_t *s_target(const char *backend)
{
    engine_spec_t s;
    engine_spec_default(&s);
    s.backend = backend;
    s.model = (model_opts_t){.max_tokens = 256, .max_seqs = 4, .max_logit_rows = 4 * (1 + SPEC_MAX_K),
                             .max_context = MAX_LEN + SPEC_MAX_K, .kv_block_size = 16};
    s.kv_blocks = 4 * (MAX_LEN + 2 * SPEC_MAX_K) / 16;
    char err[512];
    engine_t *e = engine_open(s_target_dir, &s, NULL, err, sizeof err);
    if (!e)
        fail_msg("%s", err);
    return e;
}

static spec_proposer_t *s_draft(engine_t *t, int mode)
{
    char v[8];
    snprintf(v, sizeof v, "%d", mode);
    setenv("TROUPE_DRAFT_DEVICE", v, 1);   /* read when the proposer is made */
    spec_draft_opts_t o = {.model_dir = s_draft_dir, .target = t, .max_seqs = 4, .max_tokens = 256,
                           .max_model_len = MAX_LEN, .block_size = 16};
    char err[512];
    spec_proposer_t *p = spec_draft_new(&o, NULL, err, sizeof err);
    unsetenv("TROUPE_DRAFT_DEVICE");
    if (!p)
        fail_msg("%s", err);
    return p;
}

/* A deterministic "text": ids of the vocabulary's lower part. */
static void s_prompt(int32_t *seq, int n, int salt)
{
    for (int i = 0; i < n; i++)
        seq[i] = (int32_t)((salt * 131 + i * 37 + i * i * 7) % 3000 + 10);
}

/* RUN proposals of one sequence with k cycling 1..7, keeping j = step % (k + 1) drafts and a
 * token after them, as a verify would; drafts and probabilities of every proposal appended. */
static void s_run(spec_proposer_t *p, int32_t *drafts, float *probs, int *counts)
{
    int32_t seq[MAX_LEN];
    int n = N_PROMPT;
    s_prompt(seq, n, 1);
    for (int step = 0; step < RUN; step++) {
        const int k = 1 + step % 7;
        int32_t *d = drafts + (size_t)step * SPEC_MAX_K;
        float *q = probs + (size_t)step * SPEC_MAX_K;
        counts[step] = spec_propose(p, 9, seq, n, k, d, q);
        const int keep = counts[step] ? step % (counts[step] + 1) : 0;
        spec_accepted(p, 9, counts[step], keep);
        for (int i = 0; i < keep; i++)
            seq[n++] = d[i];
        seq[n++] = (int32_t)((d[keep < counts[step] ? keep : 0] + 1 + step) % 3000);
    }
}

static void s_modes_agree(const char *backend)
{
    engine_t *t = s_target(backend);
    int32_t dr[3][RUN * SPEC_MAX_K];
    float pr[3][RUN * SPEC_MAX_K];
    int cn[3][RUN];
    for (int m = 0; m < 3; m++) {
        spec_proposer_t *p = s_draft(t, m);
        s_run(p, dr[m], pr[m], cn[m]);
        spec_proposer_destroy(&p);
    }
    double worst = 0;
    for (int m = 1; m < 3; m++)
        for (int s = 0; s < RUN; s++) {
            if (cn[m][s] != cn[0][s])
                fail_msg("%s mode %d step %d: %d drafts, mode 0 %d", backend, m, s, cn[m][s], cn[0][s]);
            for (int i = 0; i < cn[0][s]; i++) {
                const size_t at = (size_t)s * SPEC_MAX_K + (size_t)i;
                if (dr[m][at] != dr[0][at])
                    fail_msg("%s mode %d step %d draft %d: %d, mode 0 %d", backend, m, s, i, dr[m][at], dr[0][at]);
                const double rel = fabs((double)pr[m][at] - pr[0][at]) / fmax(pr[0][at], 1e-30);
                worst = rel > worst ? rel : worst;
            }
        }
    print_message("%s: %d proposals, drafts equal in modes 0/1/2, worst probability %.2e relative\n", backend, RUN, worst);
    assert_true(worst <= 1e-5);
    /* A batch of three sequences with different k: chained equals per position and host. */
    int32_t seqs[3][N_PROMPT + 8], bd[3][3][SPEC_MAX_K];
    float bp[3][3][SPEC_MAX_K];
    for (int m = 0; m < 3; m++) {
        spec_proposer_t *p = s_draft(t, m);
        spec_ask_t asks[3];
        for (int s = 0; s < 3; s++) {
            s_prompt(seqs[s], N_PROMPT, 5 + s);
            asks[s] = (spec_ask_t){.id = 20 + (uint64_t)s, .tokens = seqs[s], .n = N_PROMPT - 3 * s, .k = 2 + 2 * s,
                                   .drafts = bd[m][s], .probs = bp[m][s]};
        }
        assert_int_equal(spec_propose_batch(p, asks, 3), 0);
        for (int s = 0; s < 3; s++) {
            assert_int_equal(asks[s].n_drafts, asks[s].k);
            if (m > 0)
                assert_memory_equal(bd[m][s], bd[0][s], (size_t)asks[s].k * sizeof(int32_t));
        }
        spec_proposer_destroy(&p);
    }
    engine_destroy(&t);
}

static void test_modes_agree(void **state)
{
    (void)state;
    if (!s_have_models())
        skip();
    s_modes_agree("cpu");
    s_modes_agree("cuda");
}

/* Mean microseconds of model_forward over `reps` steps of one sequence of n new positions (a
 * decode step n = 1, a verify step n = k + 1 with every row's argmax), rolled back after each. */
static double s_target_step_us(engine_t *t, int n, int reps)
{
    kvseq_t *kv = kvseq_new(t->pool, MAX_LEN + SPEC_MAX_K, 0);
    int32_t seq[N_PROMPT + SPEC_MAX_K], ids[SPEC_MAX_K + 1];
    s_prompt(seq, N_PROMPT + SPEC_MAX_K, 2);
    char err[256];
    assert_int_equal(kvseq_append(kv, seq, N_PROMPT), 0);
    model_seq_t q = {.kv = kv, .n_new = N_PROMPT};
    model_batch_t b = {.n_seqs = 1, .seqs = &q, .argmax_out = ids};
    assert_int_equal(model_forward(t->model, &b, t->logits, err, sizeof err), 0);
    int64_t t0 = 0;
    for (int r = -3; r < reps; r++) {   /* three warm-ups: uncaptured, recorded, replayed */
        if (r == 0)
            t0 = now_ns();
        assert_int_equal(kvseq_append(kv, seq + N_PROMPT, n), 0);
        q = (model_seq_t){.kv = kv, .n_new = n};
        b = (model_batch_t){.n_seqs = 1, .seqs = &q, .all_logits = n > 1, .argmax_out = ids};
        assert_int_equal(model_forward(t->model, &b, t->logits, err, sizeof err), 0);
        assert_int_equal(kvseq_truncate(kv, N_PROMPT), 0);
    }
    const double us = (double)(now_ns() - t0) / 1e3 / reps;
    kvseq_destroy(&kv);
    return us;
}

/* Mean microseconds of a steady batch-1 proposal of k drafts (one token of catch-up: nothing kept). */
static double s_propose_us(spec_proposer_t *p, int k, int reps, uint64_t id)
{
    int32_t seq[MAX_LEN], d[SPEC_MAX_K];
    float q[SPEC_MAX_K];
    int n = N_PROMPT;
    s_prompt(seq, n, 3);
    int64_t t0 = 0;
    for (int r = -4; r < reps; r++) {
        if (r == 0)
            t0 = now_ns();
        const int got = spec_propose(p, id, seq, n, k, d, q);
        assert_int_equal(got, k);
        spec_accepted(p, id, got, 0);
        seq[n++] = (int32_t)((d[0] + 1) % 3000);
    }
    const double us = (double)(now_ns() - t0) / 1e3 / reps;
    spec_forget(p, id);
    return us;
}

static void test_timings(void **state)
{
    (void)state;
    if (!s_have_models())
        skip();
    engine_t *t = s_target("cuda");
    spec_proposer_t *p[3];
    for (int m = 0; m < 3; m++)
        p[m] = s_draft(t, m);
    const int reps = 200;
    printf("target kjv-dense batch 1: decode step %.1f us\n", s_target_step_us(t, 1, reps));
    printf("k | verify step (k+1 positions) | draft proposal: host (0) | per position (1) | chained (2) us\n");
    for (int k = 1; k <= 7; k++) {
        const double v = s_target_step_us(t, k + 1, reps);
        double u[3];
        for (int m = 0; m < 3; m++)
            u[m] = s_propose_us(p[m], k, reps, 100 + (uint64_t)k);
        printf("%d | %.1f | %.1f | %.1f | %.1f\n", k, v, u[0], u[1], u[2]);
    }
    for (int m = 0; m < 3; m++)
        spec_proposer_destroy(&p[m]);
    engine_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes_agree),
        cmocka_unit_test(test_timings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
