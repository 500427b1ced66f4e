/* tests/unit/test_ep.c — expert-parallel groups of real processes (troupe-expert-rank, over unix
 * socket pairs): greedy tokens and every logit bit of a group of 2 and of 4 equal one process with
 * every expert local (qwen3-moe-f32, mixtral-f32, and kjv-moe from TROUPE_MODELS when present); two
 * placements with redundant replicas applied while generating (experts loaded, the switch made,
 * output unchanged); a refused placement; kill -9 of a rank ends the next forward with an error
 * naming it, in bounded time. */
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/worker/expert_group.h"
#include "common/util.h"
#include "engine/engine_open.h"
#include "engine/eplb.h"

#define FIXTURES "tests/fixtures/models"
#define STEPS 10
#define SEQS 2

static char s_exe[PATH_MAX];

static engine_spec_t s_spec(void)
{
    engine_spec_t s;
    engine_spec_default(&s);
    s.threads = 1;
    s.model = (model_opts_t){.max_tokens = 64, .max_seqs = SEQS, .max_context = 128, .kv_block_size = 16};
    s.kv_blocks = 32;
    return s;
}

typedef struct {
    int32_t tok[SEQS][STEPS];
    float *logits;                /* [STEPS][SEQS][V] */
    uint64_t switches, loaded;
} run_t;

static const int32_t s_prompts[SEQS][5] = {{1, 5, 9, 14, 3}, {2, 7, 7, 30, 11}};

/* Greedy generation of SEQS sequences, batched; place: propose placements at steps 2 and 5. */
static void s_generate(engine_t *e, ep_t *ep, int place, run_t *out)
{
    const int V = e->cfg.vocab_size, L = e->cfg.num_layers, E = e->cfg.num_experts;
    char err[512];
    kvseq_t *kv[SEQS];
    model_seq_t q[SEQS];
    out->logits = malloc((size_t)STEPS * SEQS * V * sizeof(float));
    assert_non_null(out->logits);
    for (int s = 0; s < SEQS; s++) {
        assert_non_null(kv[s] = kvseq_new(e->pool, 128, 0));
        assert_int_equal(kvseq_append(kv[s], s_prompts[s], 5), 0);
        q[s] = (model_seq_t){.kv = kv[s], .n_new = 5};
    }
    for (int step = 0; step < STEPS; step++) {
        if (ep && place && (step == 2 || step == 5)) {
            ep_status_t st;
            ep_status(ep, &st);
            const int n_slots = E + st.n_ranks;   /* one redundant slot per rank */
            int32_t *tab = malloc((size_t)L * n_slots * sizeof(int32_t));
            double *load = malloc((size_t)E * sizeof(double));
            for (int l = 0; l < L; l++) {
                for (int x = 0; x < E; x++)   /* a skew that differs per layer and per proposal */
                    load[x] = 1.0 + (double)((x * 7 + l * 3 + step) % E) * ((x + step) % 3 == 0 ? 9.0 : 1.0);
                assert_int_equal(eplb_place(load, E, st.n_ranks, 1, n_slots, tab + (size_t)l * n_slots, err, sizeof err), 0);
            }
            assert_int_equal(ep_propose(ep, (uint64_t)step, n_slots, tab, err, sizeof err), 0);
            free(tab);
            free(load);
        }
        model_batch_t b = {.n_seqs = SEQS, .seqs = q};
        if (model_forward(e->model, &b, e->logits, err, sizeof err) != 0)
            fail_msg("forward at step %d: %s", step, err);
        memcpy(out->logits + (size_t)step * SEQS * V, e->logits, (size_t)SEQS * V * sizeof(float));
        for (int s = 0; s < SEQS; s++) {
            const float *lg = e->logits + (size_t)s * V;
            int32_t best = 0;
            for (int i = 1; i < V; i++)
                if (lg[i] > lg[best])
                    best = i;
            out->tok[s][step] = best;
            assert_int_equal(kvseq_append(kv[s], &best, 1), 0);
            q[s].n_new = 1;
        }
    }
    if (ep) {
        ep_status_t st;
        ep_status(ep, &st);
        out->switches = st.switches;
        out->loaded = st.experts_loaded;
    }
    for (int s = 0; s < SEQS; s++)
        kvseq_destroy(&kv[s]);
}

static engine_t *s_open_group(const char *dir, int n, expert_group_t **g)
{
    char err[1024];
    engine_spec_t s = s_spec();
    engine_t *e = engine_new(dir, err, sizeof err);
    if (!e)
        fail_msg("%s", err);
    *g = expert_group_spawn(n, e->cfg.num_experts, dir, &s, s_exe, err, sizeof err);
    if (!*g)
        fail_msg("%s", err);
    if (engine_load(e, &s, err, sizeof err) != ENGINE_OK || expert_group_attach(*g, e, err, sizeof err) != 0)
        fail_msg("%s", err);
    return e;
}

static void s_case(const char *dir)
{
    char err[1024];
    engine_spec_t s = s_spec();
    engine_status_t st;
    engine_t *ref = engine_open(dir, &s, &st, err, sizeof err);
    if (!ref)
        fail_msg("%s", err);
    run_t want;
    s_generate(ref, NULL, 0, &want);
    const size_t V = (size_t)ref->cfg.vocab_size;
    for (int n = 2; n <= 4; n *= 2) {
        if (ref->cfg.num_experts % n != 0)
            continue;
        for (int place = 0; place <= 1; place++) {
            expert_group_t *g;
            engine_t *e = s_open_group(dir, n, &g);
            run_t got;
            s_generate(e, expert_group_ep(g), place, &got);
            for (int q = 0; q < SEQS; q++)
                for (int t = 0; t < STEPS; t++)
                    if (got.tok[q][t] != want.tok[q][t])
                        fail_msg("%s, %d ranks%s: sequence %d token %d is %d, one process gave %d", dir, n,
                                 place ? ", placements applied" : "", q, t, got.tok[q][t], want.tok[q][t]);
            if (memcmp(got.logits, want.logits, STEPS * SEQS * V * sizeof(float)) != 0)
                fail_msg("%s, %d ranks%s: the logits differ from one process's", dir, n, place ? ", placements" : "");
            if (place) {   /* both placements switched to, experts moved */
                if (got.switches < 1 || got.loaded < 1)
                    fail_msg("%s, %d ranks: %llu switches, %llu experts loaded", dir, n,
                             (unsigned long long)got.switches, (unsigned long long)got.loaded);
                int ns;
                const int32_t *p = ep_placement(expert_group_ep(g), 0, &ns);
                if (p)
                    assert_int_equal(ns, ref->cfg.num_experts + n);
            }
            free(got.logits);
            expert_group_destroy(&g);
            engine_destroy(&e);
        }
    }
    free(want.logits);
    engine_destroy(&ref);
}

static void test_qwen3_moe(void **state)
{
    (void)state;
    s_case(FIXTURES "/qwen3-moe-f32");
}

static void test_mixtral(void **state)
{
    (void)state;
    s_case(FIXTURES "/mixtral-f32");
}

static void test_kjv_moe(void **state)
{
    (void)state;
    const char *root = getenv("TROUPE_MODELS");
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/kjv-moe", root && *root ? root : "../shared/models");
    if (access(dir, R_OK) != 0) {
        print_message("SKIP kjv-moe: %s is absent (set TROUPE_MODELS)\n", dir);
        skip();
    }
    s_case(dir);
}

static void test_refused_placement(void **state)
{
    (void)state;
    expert_group_t *g;
    engine_t *e = s_open_group(FIXTURES "/qwen3-moe-f32", 2, &g);
    ep_t *ep = expert_group_ep(g);
    const int L = e->cfg.num_layers, E = e->cfg.num_experts;
    int32_t tab[3 * 10];
    char err[512];
    for (int l = 0; l < L; l++)
        for (int s = 0; s < 10; s++)
            tab[l * 10 + s] = s % E;   /* slots 8, 9 repeat experts 0, 1 on rank 1: fine */
    for (int s = 0; s < 10; s++)
        tab[s] = s % 5;                 /* layer 0: experts 0..4 on each rank, 5..7 nowhere */
    assert_int_equal(ep_propose(ep, 1, 10, tab, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer 0 leaves expert 5 without a replica"));
    tab[1] = 0;                         /* rank 0: expert 0 twice */
    assert_int_equal(ep_propose(ep, 1, 10, tab, err, sizeof err), -1);
    assert_non_null(strstr(err, "rank 0 holds expert 0 twice"));
    for (int s = 0; s < 10; s++)
        tab[s] = s % E;
    assert_int_equal(ep_propose(ep, 1, 10, tab, err, sizeof err), 0);
    assert_int_equal(ep_propose(ep, 1, 10, tab, err, sizeof err), 0);   /* replaces the unsent one */
    (void)E;
    assert_int_equal(ep_propose(ep, 1, 9, tab, err, sizeof err), -1);   /* 9 slots over 2 ranks */
    assert_non_null(strstr(err, "do not divide"));
    expert_group_destroy(&g);
    engine_destroy(&e);
}

static void test_kill_rank(void **state)
{
    (void)state;
    expert_group_t *g;
    engine_t *e = s_open_group(FIXTURES "/qwen3-moe-f32", 4, &g);
    char err[512];
    kvseq_t *kv = kvseq_new(e->pool, 128, 0);
    assert_int_equal(kvseq_append(kv, s_prompts[0], 5), 0);
    model_seq_t q = {.kv = kv, .n_new = 5};
    model_batch_t b = {.n_seqs = 1, .seqs = &q};
    assert_int_equal(model_forward(e->model, &b, e->logits, err, sizeof err), 0);
    kill(expert_group_pid(g, 2), SIGKILL);
    int32_t t = 3;
    assert_int_equal(kvseq_append(kv, &t, 1), 0);
    q.n_new = 1;
    const int64_t t0 = now_ns();
    assert_int_equal(model_forward(e->model, &b, e->logits, err, sizeof err), -1);
    assert_true(now_ns() - t0 < 10ll * 1000000000);
    assert_non_null(strstr(err, "rank 2"));
    assert_int_equal(model_forward(e->model, &b, e->logits, err, sizeof err), -1);   /* stays failed */
    kvseq_destroy(&kv);
    expert_group_destroy(&g);   /* reaps the other ranks without waiting on them */
    engine_destroy(&e);
}

int main(void)
{
    const char *bin = getenv("TROUPE_BIN");
    if (bin && *bin) {
        snprintf(s_exe, sizeof s_exe, "%s/troupe-expert-rank", bin);
    } else {   /* tests/ beside bin/ in the build directory */
        ssize_t k = readlink("/proc/self/exe", s_exe, sizeof s_exe - 64);
        assert_true(k > 0);
        s_exe[k] = 0;
        char *slash = strrchr(s_exe, '/');
        *slash = 0;
        slash = strrchr(s_exe, '/');
        snprintf(slash + 1, 64, "bin/troupe-expert-rank");
    }
    if (access(s_exe, X_OK) != 0) {
        fprintf(stderr, "test_ep: %s is not built\n", s_exe);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_moe),   cmocka_unit_test(test_mixtral),   cmocka_unit_test(test_kjv_moe),
        cmocka_unit_test(test_refused_placement), cmocka_unit_test(test_kill_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
