/* Decode steps replayed from CUDA graphs (engine/forward.c, kernels/cuda/cuda_graph.cu) give the
 * bits of the same steps run op by op (model_opts_t.no_graphs), over a schedule of batch sizes
 * that records a graph per size and replays it (steps of 9 and 12 rows take the GEMM path, 1 and
 * 2 the GEMV). Each fixture: 12 prompts in one step, then 21 decode steps over the first k
 * sequences; the MoE fixture's steps go through the device-only expert path (its f32 weights: the
 * FMA path; dummy bf16 weights of its shape: the grouped tensor-core path from 9 rows). (The 258-row prompt
 * step grows every scratch buffer first, so no graph goes stale here: test_stale does that at the
 * backend's level.) Runs on the GPU node
 * (tools/gpu-run.sh); CI only compiles it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "tests/gpu/model_steps.h"

enum { N_SEQ = 12 };
static const int s_sched[] = {1, 1, 1, 2, 2, 2, 9, 9, 9, 12, 12, 12, 2, 2, 2, 1, 1, 9, 9, 12, 12};
#define N_STEPS ((int)(sizeof s_sched / sizeof s_sched[0]))

/* Every logits row of the run, in order: the 12 prompts' last rows, then each step's k rows.
 * dummy: DT_COUNT runs the fixture's weights, else dummy weights of its shape in that dtype. */
static int s_warm;   /* s_run: model_graph_warmup first (decode steps of 1..12 rows, verify steps of 1..2 x 2..3) */

static float *s_run(backend_t *gpu, const char *dir, const model_config_t *cfg, dtype_t dummy, int no_graphs,
                    uint64_t *records, uint64_t *replays, size_t *n_rows)
{
    char err[512];
    ckpt_t *ck = dummy == DT_COUNT ? ckpt_open(dir, err, sizeof err) : ckpt_dummy(dummy, 0);
    if (!ck)
        fail_msg("%s", err);
    model_opts_t o = {.max_tokens = 512, .max_seqs = 16, .max_context = 128, .kv_block_size = 4, .no_graphs = no_graphs};
    model_t *m = model_load(dir, cfg, ck, gpu, &o, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    const dtype_t kvt = cfg->dtype == DT_F32 ? DT_F32 : DT_BF16;
    kvpool_t *pool = kvpool_new(N_SEQ * (128 / 4 + 1), 4, cfg->num_layers, cfg->num_kv_heads, cfg->head_dim, kvt,
                                gpu, err, sizeof err);
    if (!pool)
        fail_msg("%s", err);
    int warmed = 0;
    if (s_warm && !no_graphs) {
        if (model_graph_warmup(m, pool, N_SEQ, 2, 3, &warmed, err, sizeof err) != 0)
            fail_msg("warm-up: %s", err);
        assert_int_equal(warmed, N_SEQ + 2 * 2);   /* every shape asked for, once */
        assert_int_equal(kvpool_free_count(pool), kvpool_n_blocks(pool));   /* its blocks given back */
    }
    const int V = cfg->vocab_size;
    size_t rows = N_SEQ;
    for (int i = 0; i < N_STEPS; i++)
        rows += (size_t)s_sched[i];
    float *lg = malloc(rows * V * sizeof(float));
    kvseq_t *seqs[N_SEQ];
    model_seq_t q[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
        seqs[s] = kvseq_new(pool, 128, 0);
        assert_non_null(seqs[s]);
        const int n = 5 + 3 * s;
        for (int i = 0; i < n; i++) {
            int32_t id = (int32_t)((i * 7919 + s * 104729 + 3) % V);
            assert_int_equal(kvseq_append(seqs[s], &id, 1), 0);
        }
        q[s] = (model_seq_t){.kv = seqs[s], .n_new = n};
    }
    model_batch_t b = {.n_seqs = N_SEQ, .seqs = q};
    if (model_forward(m, &b, lg, err, sizeof err) < 0)
        fail_msg("prompts: %s", err);
    size_t at = N_SEQ;
    for (int step = 0; step < N_STEPS; step++) {
        const int k = s_sched[step];
        for (int s = 0; s < k; s++) {
            kvseq_publish(seqs[s]);
            int32_t next = (int32_t)((step * 131 + s * 17 + 9) % V);
            assert_int_equal(kvseq_append(seqs[s], &next, 1), 0);
            q[s].n_new = 1;
        }
        b.n_seqs = k;
        if (model_forward(m, &b, lg + at * V, err, sizeof err) < 0)
            fail_msg("step %d (%d rows): %s", step, k, err);
        at += (size_t)k;
    }
    model_graph_stats(m, records, replays);
    if (warmed)   /* the run's decode steps (1, 2, 9, 12 rows) all had their graph already */
        assert_int_equal(*records, (uint64_t)warmed);
    *n_rows = rows;
    for (int s = 0; s < N_SEQ; s++)
        kvseq_destroy(&seqs[s]);
    kvpool_destroy(&pool);
    model_destroy(&m);
    ckpt_destroy(&ck);
    return lg;
}

/* One fixture (its weights, or dummy ones of its shape in `dummy`) with and without graphs on
 * gpu; returns the steps replayed from a graph. */
static uint64_t s_compare_w(backend_t *gpu, const char *name, dtype_t dummy, uint64_t min_records)
{
    {
        char dir[1024], err[512];
        snprintf(dir, sizeof dir, "%s/%s", gpu_fixture_root(), name);
        model_config_t cfg;
        if (config_load(dir, &cfg, err, sizeof err) < 0)
            fail_msg("%s", err);
        uint64_t rec0, rep0, rec1, rep1;
        size_t n0, n1;
        float *eager = s_run(gpu, dir, &cfg, dummy, 1, &rec0, &rep0, &n0),
              *graph = s_run(gpu, dir, &cfg, dummy, 0, &rec1, &rep1, &n1);
        assert_int_equal(n0, n1);
        assert_int_equal(rec0 + rep0, 0);
        const size_t n = n0 * (size_t)cfg.vocab_size;
        for (size_t k = 0; k < n; k++)
            if (memcmp(&eager[k], &graph[k], 4) != 0)
                fail_msg("%s: logits row %zu, id %zu: graphs %.9g, op by op %.9g", name, k / cfg.vocab_size,
                         k % cfg.vocab_size, graph[k], eager[k]);
        if (rec1 < min_records || rep1 < rec1)
            fail_msg("%s: %llu steps recorded (want >= %llu), %llu replayed", name, (unsigned long long)rec1,
                     (unsigned long long)min_records, (unsigned long long)rep1);
        print_message("  %-16s%s %d decode steps: logits bit-identical with and without graphs (%llu recorded, "
                      "%llu replayed)\n", name, dummy == DT_COUNT ? "" : " (dummy bf16)", N_STEPS,
                      (unsigned long long)rec1, (unsigned long long)rep1);
        free(eager), free(graph);
        return rep1;
    }
}

static uint64_t s_compare(backend_t *gpu, const char *name, uint64_t min_records)
{
    return s_compare_w(gpu, name, DT_COUNT, min_records);
}

static void test_models(void **state)
{
    /* sizes 1, 2, 9, 12 recorded (MoE too: its steps of up to 64 rows run on the device alone) */
    const char *names[] = {"qwen3-f32", "llama-gqa-f32", "llama-tied-bf16", "qwen3-moe-f32"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        s_compare(s_gpu, names[i], 4);
}

/* Graphs recorded before serving (model_graph_warmup): the same run records nothing more, and its
 * logits stay bit-identical to the op-by-op run's. */
static void test_warmup(void **state)
{
    s_warm = 1;
    s_compare(s_gpu, "llama-gqa-f32", 4);
    s_warm = 0;
}

/* bf16 experts: the steps of 9 and 12 rows take the grouped tensor-core path (cuda_moe_gemm.cu:
 * its sort and tile list on the device, its grid fixed by M), recorded and replayed like the rest. */
static void test_moe_grouped_path_recorded(void **state)
{
    s_compare_w(s_gpu, "qwen3-moe-f32", DT_BF16, 4);
}

/* With the device expert path limited to 4 rows, the MoE steps of 9 and 12 rows take the host
 * path (a host round trip): never recorded, still equal; only sizes 1 and 2 are. */
static void test_moe_host_path_not_recorded(void **state)
{
    char err[256];
    setenv("TROUPE_CUDA_MOE_DEVICE_MAX_M", "4", 1);
    backend_t *gpu = backend_new("cuda", 0, err, sizeof err);
    unsetenv("TROUPE_CUDA_MOE_DEVICE_MAX_M");
    if (!gpu)
        fail_msg("%s", err);
    /* the schedule has 11 steps of 1 or 2 rows and 10 of 9 or 12: only the former may replay */
    const uint64_t rep = s_compare(gpu, "qwen3-moe-f32", 2);
    if (rep > 11)
        fail_msg("%llu steps replayed: steps of 9 or 12 rows (the host expert path) were recorded", (unsigned long long)rep);
    backend_destroy(&gpu);
}

/* A graph recorded with a scratch buffer goes stale when a larger op reallocates it and frees the
 * old one (TROUPE_CUDA_SCRATCH_KEEP_MB=0): a 9-row matmul on bf16 weights (the split GEMM: gout
 * [18][N]) recorded and replayed, then a 30-row one run op by op (gout [60][N]) makes graph_launch
 * refuse it (1, nothing queued); recorded again it replays, and the outputs equal the op-by-op
 * ones. By default the replaced buffer is kept (up to 256 MB of them), and the graph replays
 * after the growth, bit-identical (s_stale_case keep = 1). A backend of its own each: fresh
 * scratch. */
static void s_stale_case(int keep);
static void test_stale(void **state)
{
    s_stale_case(0);
    s_stale_case(1);
}

static void s_stale_case(int keep)
{
    char err[256];
    setenv("TROUPE_CUDA_SCRATCH_KEEP_MB", keep ? "256" : "0", 1);
    backend_t *be = backend_new("cuda", 0, err, sizeof err);
    unsetenv("TROUPE_CUDA_SCRATCH_KEEP_MB");
    if (!be)
        fail_msg("%s", err);
    const backend_ops_t *op = be->ops;
    const int K = 512, N = 1024, M0 = 9, M1 = 30;
    uint16_t *hw = malloc((size_t)N * K * 2);
    float *hx = malloc((size_t)M1 * K * 4), *y_op = malloc((size_t)M0 * N * 4), *y_gr = malloc((size_t)M0 * N * 4);
    for (size_t i = 0; i < (size_t)N * K; i++)
        hw[i] = f32_to_bf16((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    for (size_t i = 0; i < (size_t)M1 * K; i++)
        hx[i] = (float)((i * 40503u) % 997) / 997.0f - 0.5f;
    void *w = op->alloc(be, (size_t)N * K * 2), *x = op->alloc(be, (size_t)M1 * K * 4), *y = op->alloc(be, (size_t)M1 * N * 4);
    assert_non_null(w), assert_non_null(x), assert_non_null(y);
    assert_int_equal(op->upload(be, w, hw, (size_t)N * K * 2), 0);
    assert_int_equal(op->upload(be, x, hx, (size_t)M1 * K * 4), 0);
    const bk_mat_t W = {.data = w, .dtype = DT_BF16, .rows = N, .cols = K};
    op->matmul(be, x, M0, &W, NULL, y);   /* op by op first: plans and scratch for 9 rows */
    assert_int_equal(op->download(be, y_op, y, (size_t)M0 * N * 4), 0);
    assert_int_equal(op->graph_begin(be), 0);
    op->matmul(be, x, M0, &W, NULL, y);
    void *g = op->graph_end(be, err, sizeof err);
    if (!g)
        fail_msg("%s", err);
    assert_int_equal(op->graph_launch(be, g), 0);
    assert_int_equal(op->download(be, y_gr, y, (size_t)M0 * N * 4), 0);
    assert_memory_equal(y_op, y_gr, (size_t)M0 * N * 4);
    op->matmul(be, x, M1, &W, NULL, y);   /* grows the scratch the graph uses */
    assert_int_equal(op->sync(be), 0);
    if (keep) {   /* the old buffer is still there: the graph replays, the same bits */
        memset(y_gr, 0, (size_t)M0 * N * 4);
        assert_int_equal(op->upload(be, y, y_gr, (size_t)M0 * N * 4), 0);
        assert_int_equal(op->graph_launch(be, g), 0);
        assert_int_equal(op->download(be, y_gr, y, (size_t)M0 * N * 4), 0);
        assert_memory_equal(y_op, y_gr, (size_t)M0 * N * 4);
        print_message("  scratch kept: the 9-row graph replays after a 30-row matmul grew its buffer, bit-identical\n");
        op->graph_free(be, g);
        op->free(be, w), op->free(be, x), op->free(be, y);
        free(hw), free(hx), free(y_op), free(y_gr);
        backend_destroy(&be);
        return;
    }
    assert_int_equal(op->graph_launch(be, g), 1);   /* stale: refused, nothing queued */
    op->graph_free(be, g);
    assert_int_equal(op->graph_begin(be), 0);
    op->matmul(be, x, M0, &W, NULL, y);
    g = op->graph_end(be, err, sizeof err);
    if (!g)
        fail_msg("%s", err);
    memset(y_gr, 0, (size_t)M0 * N * 4);
    assert_int_equal(op->graph_launch(be, g), 0);
    assert_int_equal(op->download(be, y_gr, y, (size_t)M0 * N * 4), 0);
    assert_memory_equal(y_op, y_gr, (size_t)M0 * N * 4);
    op->graph_free(be, g);
    print_message("  a recorded 9-row matmul: replayed bit-identical; stale after a 30-row one reallocated its "
                  "scratch (refused); recorded again, bit-identical\n");
    op->free(be, w), op->free(be, x), op->free(be, y);
    free(hw), free(hx), free(y_op), free(y_gr);
    backend_destroy(&be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_warmup),
        cmocka_unit_test(test_moe_grouped_path_recorded),
        cmocka_unit_test(test_moe_host_path_not_recorded),
        cmocka_unit_test(test_stale),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
