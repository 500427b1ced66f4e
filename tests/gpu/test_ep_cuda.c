/* tests/gpu/test_ep_cuda.c — an expert-parallel group's routed experts on CUDA round as one process's.
 *
 * A group rank runs its slots' experts over the entries every rank sent it, one expert per entry
 * (engine/ep.c, s_compute). CUDA's moe_ffn picks its arithmetic by the call's size: bf16 experts
 * take the FMA device path (f32 activations) below TROUPE_CUDA_MOE_GROUPED_MIN_M (9) tokens and the
 * grouped tensor-core path (x and the SwiGLU activations rounded to bf16) from there. Counted in
 * entries, a step of 4 rows of top-3 is 12 entries: the group computed in bf16 what one process
 * computes in f32, and on kjv-deepseek that flipped a routing near-tie later on (ep_exact.sh on the
 * H200, 2026-12-03: prompt 2, token 19; the last MoE layer's 4th and 5th experts 1.9e-4 apart in
 * sigmoid score + bias). The group now computes each sender's entries through moe_ffn_as with the
 * sender's rows (the path its own moe_ffn would take).
 *
 * Here: deepseek-v3-noqlora-bf16 (bf16 experts, DeepSeekMoE with a shared expert, a dense first
 * layer) on CUDA, 4 and then 12 sequences (decode steps of 4 rows: the FMA path in one process, 12
 * entries per step in the group; of 12 rows: the grouped path in both), a 5-token prompt each, then
 * 8 one-row steps of fixed ids; the same model through a group of one rank (a loopback transport in
 * this process: every entry dispatched, computed by s_compute and combined on the host) must give
 * every logit bit of the one-process run, at every step. Before the change the 4-row steps differ.
 * Runs on the GPU node (tools/gpu-run.sh); CI only compiles it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine_open.h"
#include "engine/ep.h"
#include "tests/gpu/model_steps.h"

#define MODEL "deepseek-v3-noqlora-bf16"
#define MAX_SEQS 12
#define PROMPT 5
#define STEPS 8

/* One rank's transport: every exchange is the rank's own part, a copy. */
static int s_loop_exchange(ep_comm_t *c, const void *const *send, const size_t *send_n, void *const *recv,
                           const size_t *recv_n, int deadline_ms, char *err, size_t errlen)
{
    (void)c;
    (void)deadline_ms;
    if (send_n[0] != recv_n[0]) {
        snprintf(err, errlen, "loopback: %zu bytes sent, %zu expected", send_n[0], recv_n[0]);
        return -1;
    }
    if (send_n[0])
        memcpy(recv[0], send[0], send_n[0]);
    return 0;
}

static void s_loop_destroy(ep_comm_t *c) { free(c); }

static const ep_comm_ops_t s_loop_ops = {.name = "loopback", .device = 0, .exchange = s_loop_exchange,
                                         .destroy = s_loop_destroy};

static ep_comm_t *s_loop_new(void)
{
    ep_comm_t *c = calloc(1, sizeof *c);
    assert_non_null(c);
    *c = (ep_comm_t){.ops = &s_loop_ops, .rank = 0, .n_ranks = 1};
    return c;
}

/* n sequences: a prompt of PROMPT fixed ids each, then STEPS one-row steps of fixed ids; returns the
 * logits [1 + STEPS][n][V] (malloc'd). */
static float *s_run(engine_t *e, int n)
{
    char err[512];
    const int V = e->cfg.vocab_size;
    kvseq_t *kv[MAX_SEQS];
    model_seq_t q[MAX_SEQS];
    float *lg = malloc((size_t)(1 + STEPS) * n * V * sizeof(float));
    assert_non_null(lg);
    for (int s = 0; s < n; s++) {
        int32_t ids[PROMPT];
        for (int i = 0; i < PROMPT; i++)
            ids[i] = (s * 37 + i * 7919 + 3) % V;
        assert_non_null(kv[s] = kvseq_new(e->pool, PROMPT + STEPS + 1, 0));
        assert_int_equal(kvseq_append(kv[s], ids, PROMPT), 0);
        q[s] = (model_seq_t){.kv = kv[s], .n_new = PROMPT};
    }
    for (int step = 0; step <= STEPS; step++) {
        model_batch_t b = {.n_seqs = n, .seqs = q};
        if (model_forward(e->model, &b, e->logits, err, sizeof err) != 0)
            fail_msg("%d sequences, step %d: %s", n, step, err);
        memcpy(lg + (size_t)step * n * V, e->logits, (size_t)n * V * sizeof(float));
        if (step == STEPS)
            break;
        for (int s = 0; s < n; s++) {
            kvseq_publish(kv[s]);
            const int32_t next = (step * 131 + s * 17 + 9) % V;
            assert_int_equal(kvseq_append(kv[s], &next, 1), 0);
            q[s].n_new = 1;
        }
    }
    for (int s = 0; s < n; s++)
        kvseq_destroy(&kv[s]);
    return lg;
}

static void test_group_rounds_as_one_process(void **state)
{
    (void)state;
    char dir[1024], err[1024];
    snprintf(dir, sizeof dir, "%s/" MODEL, gpu_fixture_root());
    engine_spec_t spec;
    engine_spec_default(&spec);
    spec.be = s_gpu;
    /* No CUDA graphs on either side: a group rank never records one (its exchange waits on the
     * host), and graphs recorded by the one-process runs would otherwise be replayed or recorded
     * once the group is attached. Graph replays equal op-by-op steps bit for bit (test_graphs). */
    spec.model = (model_opts_t){.max_tokens = MAX_SEQS * PROMPT, .max_seqs = MAX_SEQS, .max_context = 64,
                                .kv_block_size = 16, .no_graphs = 1};
    spec.kv_blocks = 4 * MAX_SEQS;
    engine_status_t st;
    engine_t *e = engine_open(dir, &spec, &st, err, sizeof err);
    if (!e)
        fail_msg("%s", err);
    assert_true(e->cfg.mla.on && e->cfg.num_experts > 0);
    assert_true(s_gpu->ops->moe_ffn_as != NULL);
    const int V = e->cfg.vocab_size;
    const int sizes[2] = {4, MAX_SEQS};   /* decode steps of 4 rows (FMA path) and of 12 (grouped) */
    float *want[2];
    for (int i = 0; i < 2; i++)
        want[i] = s_run(e, sizes[i]);
    ep_t *ep = ep_new(e->model, e->ck, s_loop_new(), err, sizeof err);
    if (!ep)
        fail_msg("%s", err);
    for (int i = 0; i < 2; i++) {
        const int n = sizes[i];
        float *got = s_run(e, n);
        assert_int_equal(ep_error(ep, err, sizeof err), 0);
        for (int step = 0; step <= STEPS; step++) {
            const float *a = got + (size_t)step * n * V, *b = want[i] + (size_t)step * n * V;
            if (memcmp(a, b, (size_t)n * V * sizeof(float)) == 0)
                continue;
            float most = 0.0f;
            for (size_t j = 0; j < (size_t)n * V; j++)
                most = fabsf(a[j] - b[j]) > most ? fabsf(a[j] - b[j]) : most;
            fail_msg("%s, %d sequences, %s %d: the group's logits differ from one process's (largest difference "
                     "%g): its routed experts rounded otherwise", MODEL, n, step ? "decode step" : "prompt step",
                     step, (double)most);
        }
        print_message("%d sequences: %d steps, every logit bit equal\n", n, 1 + STEPS);
        free(got);
        free(want[i]);
    }
    ep_status_t es;
    ep_status(ep, &es);
    assert_true(es.entries_sent > 0);   /* the MoE layers went through the group */
    ep_destroy(&ep);
    engine_destroy(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_rounds_as_one_process),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
