/* tests/unit/test_ep.c — expert-parallel groups of real processes (troupe-expert-rank, over unix
 * socket pairs): greedy tokens and every logit bit of a group of 2 and of 4 equal one process with
 * every expert local (qwen3-moe-f32, mixtral-f32, and kjv-moe from TROUPE_MODELS when present); two
 * placements with redundant replicas applied while generating (experts loaded, the switch made,
 * output unchanged); a refused placement; kill -9 of a rank ends the next forward with an error
 * naming it, in bounded time.
 *
 * Data-parallel groups (every rank its own batch, engine/ep.h): 2 and 4 processes that meet by
 * ep_sock_rendezvous, each this program again (--dp-rank), each running its own sequences: the
 * ranks' steps differ in rows (a prompt step of 10 rows, then decode steps of 2), one rank starts
 * late (it joins the others' steps with no rows first), one of the group of 4 never has a row, and
 * a placement with replicas is switched to halfway; every rank's greedy tokens and logits equal
 * one process with every expert running the same sequences. Then they drain together (the done
 * step) and exit 0. kill -9 of one rank of a group of 4: the stepping rank's next forward fails
 * naming a rank within seconds and the idle ranks exit on their own. */
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <spawn.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/worker/expert_group.h"
#include "common/util.h"
#include "engine/engine_open.h"
#include "engine/eplb.h"
#include "engine/model_internal.h"   /* the MTP layer's experts (test_deepseek_v3) */

#define FIXTURES "tests/fixtures/models"
#define STEPS 10
#define SEQS 2

static char s_exe[PATH_MAX];
static char s_self[PATH_MAX];   /* this test binary, for the data-parallel ranks */

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
            const model_mtp_t *mtp = e->model->mtp;   /* DeepSeek's MTP layer runs outside the group: whole */
            for (int x = 0; mtp && mtp->layer.is_moe && x < ref->cfg.num_experts; x++)
                if (!mtp->layer.experts[x].gate.data)
                    fail_msg("%s, %d ranks: rank 0 lacks expert %d of the MTP layer", dir, n, x);
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

/* The directory of model `name` under TROUPE_MODELS (../shared/models when unset), in a static
 * buffer that the next call overwrites; the calling test is skipped when it is absent, as these
 * models are not in the tree. */
static const char *s_models_dir(const char *name)
{
    static char dir[PATH_MAX];
    const char *root = getenv("TROUPE_MODELS");
    snprintf(dir, sizeof dir, "%s/%s", root && *root ? root : "../shared/models", name);
    if (access(dir, R_OK) != 0) {
        print_message("SKIP %s: %s is absent (set TROUPE_MODELS)\n", name, dir);
        skip();
    }
    return dir;
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
    s_case(s_models_dir("kjv-moe"));
}

/* DeepSeek-V3 (MLA attention, DeepSeekMoE: group-limited sigmoid routing, a shared expert added to
 * the routed sum, a dense first layer, an MTP layer loaded whole on every rank). */
static void test_deepseek_v3(void **state)
{
    (void)state;
    s_case(FIXTURES "/deepseek-v3-f32");
}

static void test_kjv_deepseek(void **state)
{
    (void)state;
    s_case(s_models_dir("kjv-deepseek"));
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

/* A rank computes each sender's entries rounded as that sender's own moe_ffn over its rows would be
 * (engine/ep.c, s_compute: moe_ffn_as with the rows of the sender's step header), where a backend
 * has moe_ffn_as (CUDA: its arithmetic follows the call's size, and the entries of a step are not
 * its rows: tests/gpu/test_ep_cuda.c has the numerics). The CPU has none, so rank 0's backend gets
 * a recording one here, which computes as moe_ffn does: every call of rank 0's own entries (its
 * peer has no rows) names the rows of the step they came from, the prompt step's or a decode
 * step's, and holds at most rows x top-k entries of one expert each. */
static const backend_ops_t *s_rec_base;
static int s_rec_calls, s_rec_bad, s_rec_prompt, s_rec_decode;
static int s_rec_k;   /* the model's top-k */

static void s_rec_ffn_as(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                         const bk_expert_t *experts, int n_experts, void *scratch, float *out, int as_m)
{
    s_rec_calls++;
    s_rec_prompt += as_m == SEQS * 5;
    s_rec_decode += as_m == SEQS;
    s_rec_bad += k != 1 || (as_m != SEQS * 5 && as_m != SEQS) || M > as_m * s_rec_k;
    s_rec_base->moe_ffn(be, x, M, H, ids, weights, k, experts, n_experts, scratch, out);
}

static void test_rows_for_rounding(void **state)
{
    (void)state;
    expert_group_t *g;
    engine_t *e = s_open_group(FIXTURES "/qwen3-moe-f32", 2, &g);
    static backend_ops_t ops;
    s_rec_base = e->be->ops;
    assert_null(s_rec_base->moe_ffn_as);   /* the CPU's result does not depend on the call's size */
    ops = *s_rec_base;
    ops.moe_ffn_as = s_rec_ffn_as;
    e->be->ops = &ops;
    s_rec_k = e->cfg.num_experts_per_tok;
    s_rec_calls = s_rec_bad = s_rec_prompt = s_rec_decode = 0;
    run_t got;
    s_generate(e, expert_group_ep(g), 0, &got);
    e->be->ops = s_rec_base;
    if (s_rec_calls == 0 || s_rec_bad || !s_rec_prompt || !s_rec_decode)
        fail_msg("moe_ffn_as: %d calls, %d without the sender's rows (%d x %d prompt rows, %d x %d decode rows) or "
                 "with more entries than rows x top-k", s_rec_calls, s_rec_bad, s_rec_prompt, SEQS * 5, s_rec_decode,
                 SEQS);
    free(got.logits);
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

/* ---- data-parallel ranks --------------------------------------------------------------------- */

#define DP_STEPS 8

/* Rank r's sequences: none for the last rank of a group of 4 (it only joins), else two prompts of
 * its own. Rank 1 starts after it has joined 3 of the others' steps. */
static int s_dp_seqs(int r, int n) { return n == 4 && r == n - 1 ? 0 : SEQS; }

static void s_dp_prompt(int r, int s, int32_t *p)
{
    for (int i = 0; i < 5; i++)
        p[i] = (int32_t)(1 + (r * 13 + s * 7 + i * 5) % 40);
}

/* One step of rank r's batch: the prompts at step 0, then a token each. tok [SEQS][DP_STEPS]. */
static int s_dp_step(engine_t *e, kvseq_t **kv, model_seq_t *q, int ns, int step, int32_t tok[][DP_STEPS],
                     float *logits, char *err, size_t errlen)
{
    const int V = e->cfg.vocab_size;
    model_batch_t b = {.n_seqs = ns, .seqs = q};
    if (model_forward(e->model, &b, e->logits, err, errlen) != 0)
        return -1;
    memcpy(logits + (size_t)step * ns * V, e->logits, (size_t)ns * V * sizeof(float));
    for (int s = 0; s < ns; s++) {
        const float *lg = e->logits + (size_t)s * V;
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (lg[i] > lg[best])
                best = i;
        tok[s][step] = best;
        if (kvseq_append(kv[s], &best, 1) != 0)
            return errf(err, errlen, "kv full");
        q[s].n_new = 1;
    }
    return 0;
}

static int s_dp_open_seqs(engine_t *e, int r, int ns, kvseq_t **kv, model_seq_t *q)
{
    for (int s = 0; s < ns; s++) {
        int32_t p[5];
        s_dp_prompt(r, s, p);
        if (!(kv[s] = kvseq_new(e->pool, 128, 0)) || kvseq_append(kv[s], p, 5) != 0)
            return -1;
        q[s] = (model_seq_t){.kv = kv[s], .n_new = 5};
    }
    return 0;
}

/* A rank's life (this program with --dp-rank): the reference first, one process with every expert,
 * then the same sequences in the group. Exit 0 when every token and logit matched. */
static int s_dp_rank(const char *dir, const char *sockdir, int r, int n)
{
    char err[1024];
    const int ns = s_dp_seqs(r, n);
    engine_spec_t sp = s_spec();
    engine_status_t est;
    engine_t *ref = engine_open(dir, &sp, &est, err, sizeof err);
    if (!ref) {
        fprintf(stderr, "rank %d: %s\n", r, err);
        return 2;
    }
    const int V = ref->cfg.vocab_size, L = ref->cfg.num_layers, E = ref->cfg.num_experts;
    float *want = calloc((size_t)DP_STEPS * SEQS * V, sizeof(float)), *got = calloc((size_t)DP_STEPS * SEQS * V, sizeof(float));
    int32_t wtok[SEQS][DP_STEPS], gtok[SEQS][DP_STEPS];
    kvseq_t *kv[SEQS];
    model_seq_t q[SEQS];
    if (s_dp_open_seqs(ref, r, ns, kv, q) != 0)
        return 2;
    for (int step = 0; ns && step < DP_STEPS; step++)
        if (s_dp_step(ref, kv, q, ns, step, wtok, want, err, sizeof err) != 0) {
            fprintf(stderr, "rank %d, reference: %s\n", r, err);
            return 2;
        }
    for (int s = 0; s < ns; s++)
        kvseq_destroy(&kv[s]);
    engine_destroy(&ref);

    engine_t *e = engine_new(dir, err, sizeof err);
    ep_keep_t keep = {.rank = r, .n_ranks = n, .n_experts = e ? e->cfg.num_experts : 0};
    sp = s_spec();
    sp.model.expert_keep = ep_keep_initial;
    sp.model.expert_ctx = &keep;
    ep_comm_t *c = NULL;
    ep_t *ep = NULL;
    if (!e || engine_load(e, &sp, err, sizeof err) != ENGINE_OK ||
        !(c = ep_sock_rendezvous(sockdir, "dp", r, n, 60000, err, sizeof err)) ||
        !(ep = ep_new(e->model, e->ck, c, err, sizeof err)) || s_dp_open_seqs(e, r, ns, kv, q) != 0) {
        fprintf(stderr, "rank %d: %s\n", r, err);
        return 2;
    }
    int own = 0, joined = 0, rc = 0;
    const int delay = r == 1 ? 3 : 0;
    uint64_t proposed = 0;
    while (!ep_all_done(ep)) {
        if (r == 0 && !proposed && own == DP_STEPS / 2) {   /* one redundant slot per rank, a skew per layer */
            const int n_slots = E + n;
            int32_t *tab = malloc((size_t)L * n_slots * sizeof(int32_t));
            double *load = malloc((size_t)E * sizeof(double));
            for (int l = 0; l < L; l++) {
                for (int x = 0; x < E; x++)
                    load[x] = 1.0 + (double)((x * 7 + l * 3) % E) * (x % 3 == 0 ? 9.0 : 1.0);
                if (eplb_place(load, E, n, 1, n_slots, tab + (size_t)l * n_slots, err, sizeof err) != 0)
                    return 2;
            }
            if (ep_propose(ep, 1, n_slots, tab, err, sizeof err) != 0) {
                fprintf(stderr, "rank 0: %s\n", err);
                return 2;
            }
            proposed = 1;
            free(tab);
            free(load);
        }
        if (own < (ns ? DP_STEPS : 0) && joined >= delay) {
            if (s_dp_step(e, kv, q, ns, own, gtok, got, err, sizeof err) != 0) {
                fprintf(stderr, "rank %d, group step %d: %s\n", r, own, err);
                return 1;
            }
            own++;
            continue;
        }
        const int done = own >= (ns ? DP_STEPS : 0);
        if (ep_pending(ep) || (done && !ep_done_sent(ep))) {
            if (ep_join(ep, done) != 0) {
                ep_error(ep, err, sizeof err);
                fprintf(stderr, "rank %d: %s\n", r, err);
                return 1;
            }
            joined++;
            continue;
        }
        int fds[EP_MAX_RANKS];
        struct pollfd pf[EP_MAX_RANKS];
        const int nf = ep_poll_fds(ep, fds);
        for (int i = 0; i < nf; i++)
            pf[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        poll(pf, (nfds_t)nf, 1000);
    }
    for (int s = 0; s < ns; s++)
        for (int t = 0; t < DP_STEPS; t++)
            if (gtok[s][t] != wtok[s][t]) {
                fprintf(stderr, "%s, rank %d of %d: sequence %d token %d is %d, one process gave %d\n", dir, r, n, s, t,
                        gtok[s][t], wtok[s][t]);
                rc = 1;
            }
    if (ns && memcmp(got, want, (size_t)DP_STEPS * ns * V * sizeof(float)) != 0) {
        fprintf(stderr, "%s, rank %d of %d: the logits differ from one process's\n", dir, r, n);
        rc = 1;
    }
    ep_status_t st;
    ep_status(ep, &st);
    if (st.switches != 1) {
        fprintf(stderr, "%s, rank %d of %d: %llu placement switches, want 1\n", dir, r, n,
                (unsigned long long)st.switches);
        rc = 1;
    }
    printf("rank %d of %d: %d own steps, %d joined, %llu rounds, %llu entries sent, epoch %llu%s\n", r, n, own, joined,
           (unsigned long long)st.rounds, (unsigned long long)st.entries_sent, (unsigned long long)st.epoch,
           rc ? "" : ", exact");
    for (int s = 0; s < ns; s++)
        kvseq_destroy(&kv[s]);
    ep_destroy(&ep);
    engine_destroy(&e);
    free(want);
    free(got);
    return rc;
}

extern char **environ;

static void s_dp_case(const char *dir)
{
    engine_t *probe;
    char err[512], tmp[] = "/tmp/test-ep-dp-XXXXXX";
    if (!(probe = engine_new(dir, err, sizeof err)))
        fail_msg("%s", err);
    const int E = probe->cfg.num_experts;
    engine_destroy(&probe);
    assert_non_null(mkdtemp(tmp));
    for (int n = 2; n <= 4; n *= 2) {
        if (E % n)
            continue;
        pid_t pids[4];
        for (int r = 0; r < n; r++) {
            char a_r[16], a_n[16];
            snprintf(a_r, sizeof a_r, "%d", r);
            snprintf(a_n, sizeof a_n, "%d", n);
            char *argv[] = {s_self, "--dp-rank", a_r, (char *)"--ranks", a_n, (char *)dir, tmp, NULL};
            assert_int_equal(posix_spawn(&pids[r], s_self, NULL, NULL, argv, environ), 0);
        }
        int bad = 0;
        for (int r = 0; r < n; r++) {
            int st;
            assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
            bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
        if (bad)
            fail_msg("%s, a data-parallel group of %d: a rank failed (its message above)", dir, n);
    }
    rmdir(tmp);
}

static void test_dp_qwen3_moe(void **state)
{
    (void)state;
    s_dp_case(FIXTURES "/qwen3-moe-f32");
}

static void test_dp_mixtral(void **state)
{
    (void)state;
    s_dp_case(FIXTURES "/mixtral-f32");
}

static void test_dp_deepseek_v3(void **state)
{
    (void)state;
    s_dp_case(FIXTURES "/deepseek-v3-f32");
}

static void test_dp_kjv_moe(void **state)
{
    (void)state;
    s_dp_case(s_models_dir("kjv-moe"));
}

/* A member that only joins (this program with --dp-idle): rank r of n over dir, its peers' steps
 * joined until the group fails. */
static int s_dp_idle(const char *dir, const char *sockdir, int r, int n)
{
    char err[1024];
    engine_t *e = engine_new(dir, err, sizeof err);
    ep_keep_t keep = {.rank = r, .n_ranks = n, .n_experts = e ? e->cfg.num_experts : 0};
    engine_spec_t sp = s_spec();
    sp.model.expert_keep = ep_keep_initial;
    sp.model.expert_ctx = &keep;
    ep_comm_t *c = NULL;
    ep_t *ep = NULL;
    if (!e || engine_load(e, &sp, err, sizeof err) != ENGINE_OK ||
        !(c = ep_sock_rendezvous(sockdir, "kill", r, n, 60000, err, sizeof err)) ||
        !(ep = ep_new(e->model, e->ck, c, err, sizeof err)))
        return 2;
    for (;;) {
        int fds[EP_MAX_RANKS];
        struct pollfd pf[EP_MAX_RANKS];
        const int nf = ep_poll_fds(ep, fds);
        for (int i = 0; i < nf; i++)
            pf[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        poll(pf, (nfds_t)nf, 1000);
        if (ep_pending(ep) && ep_join(ep, 0) != 0)
            return 1;
    }
}

/* kill -9 of a rank of a data-parallel group of 4 (rank 0 here, running steps; ranks 1..3 joining
 * them): rank 0's next step fails naming it within seconds, and the idle ranks learn at once (a
 * readable socket, a failed join: they exit 1): no rank waits for a step that never comes. */
static void test_dp_kill(void **state)
{
    (void)state;
    char err[1024], tmp[] = "/tmp/test-ep-kill-XXXXXX";
    const char *dir = FIXTURES "/qwen3-moe-f32";
    assert_non_null(mkdtemp(tmp));
    pid_t pids[4] = {0};
    for (int r = 1; r < 4; r++) {
        char a_r[16];
        snprintf(a_r, sizeof a_r, "%d", r);
        char *argv[] = {s_self, "--dp-idle", a_r, (char *)"--ranks", (char *)"4", (char *)dir, tmp, NULL};
        assert_int_equal(posix_spawn(&pids[r], s_self, NULL, NULL, argv, environ), 0);
    }
    engine_t *e = engine_new(dir, err, sizeof err);
    assert_non_null(e);
    ep_keep_t keep = {.rank = 0, .n_ranks = 4, .n_experts = e->cfg.num_experts};
    engine_spec_t sp = s_spec();
    sp.model.expert_keep = ep_keep_initial;
    sp.model.expert_ctx = &keep;
    ep_comm_t *c = NULL;
    ep_t *ep = NULL;
    if (engine_load(e, &sp, err, sizeof err) != ENGINE_OK || !(c = ep_sock_rendezvous(tmp, "kill", 0, 4, 60000, err, sizeof err)) ||
        !(ep = ep_new(e->model, e->ck, c, err, sizeof err)))
        fail_msg("%s", err);
    kvseq_t *kv = kvseq_new(e->pool, 128, 0);
    assert_int_equal(kvseq_append(kv, s_prompts[0], 5), 0);
    model_seq_t q = {.kv = kv, .n_new = 5};
    model_batch_t b = {.n_seqs = 1, .seqs = &q};
    assert_int_equal(model_forward(e->model, &b, e->logits, err, sizeof err), 0);
    kill(pids[2], SIGKILL);
    assert_int_equal(waitpid(pids[2], NULL, 0), pids[2]);
    for (int r = 1; r < 4; r++) {   /* the idle ranks exit 1 on their own (rank 0 starts no step), in bounded time */
        if (r == 2)
            continue;
        int st = 0, gone = 0;
        for (int i = 0; i < 1000 && !gone; i++) {
            gone = waitpid(pids[r], &st, WNOHANG) == pids[r];
            if (!gone)
                usleep(10000);
        }
        if (!gone) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], NULL, 0);
            fail_msg("idle rank %d still runs 10 s after rank 2 died", r);
        }
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    }
    int32_t t = 3;
    assert_int_equal(kvseq_append(kv, &t, 1), 0);
    q.n_new = 1;
    const int64_t t0 = now_ns();
    assert_int_equal(model_forward(e->model, &b, e->logits, err, sizeof err), -1);
    assert_true(now_ns() - t0 < 10ll * 1000000000);
    if (!strstr(err, "rank 2") && !strstr(err, "rank 1") && !strstr(err, "rank 3"))
        fail_msg("the failed step names no rank: %s", err);
    kvseq_destroy(&kv);
    ep_destroy(&ep);
    engine_destroy(&e);
    rmdir(tmp);
}

/* Rendezvous with a peer that never comes: refused within its deadline, naming the rank. */
static void test_dp_rendezvous_refused(void **state)
{
    (void)state;
    char err[512], tmp[] = "/tmp/test-ep-rv-XXXXXX";
    assert_non_null(mkdtemp(tmp));
    const int64_t t0 = now_ns();
    assert_null(ep_sock_rendezvous(tmp, "lonely", 1, 2, 300, err, sizeof err));
    assert_non_null(strstr(err, "rank 0 did not answer"));
    assert_null(ep_sock_rendezvous(tmp, "lonely", 0, 2, 300, err, sizeof err));
    assert_non_null(strstr(err, "rank 1 did not connect"));
    assert_true(now_ns() - t0 < 3ll * 1000000000);
    rmdir(tmp);
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "--dp-rank"))
        return s_dp_rank(argv[5], argv[6], atoi(argv[2]), atoi(argv[4]));
    if (argc == 7 && !strcmp(argv[1], "--dp-idle"))
        return s_dp_idle(argv[5], argv[6], atoi(argv[2]), atoi(argv[4]));
    ssize_t sk = readlink("/proc/self/exe", s_self, sizeof s_self - 1);
    assert_true(sk > 0);
    s_self[sk] = 0;
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
        cmocka_unit_test(test_deepseek_v3), cmocka_unit_test(test_kjv_deepseek),
        cmocka_unit_test(test_refused_placement), cmocka_unit_test(test_rows_for_rounding),
        cmocka_unit_test(test_kill_rank),
        cmocka_unit_test(test_dp_qwen3_moe), cmocka_unit_test(test_dp_mixtral), cmocka_unit_test(test_dp_kjv_moe),
        cmocka_unit_test(test_dp_deepseek_v3),
        cmocka_unit_test(test_dp_kill),            cmocka_unit_test(test_dp_rendezvous_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
