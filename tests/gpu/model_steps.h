/* tests/gpu/model_steps.h — for GPU tests that compare two ways of running one model: load it on a
 * backend with given options, run a prompt of fixed ids and then one-row steps feeding fixed ids,
 * and keep every step's logits; the fixtures' folder; the CUDA backend a test file shares (cmocka
 * group setup and teardown). Included by test_fused_ops.c, test_dummy_fill.c and test_graphs.c. */
#ifndef TROUPE_TESTS_GPU_MODEL_STEPS_H
#define TROUPE_TESTS_GPU_MODEL_STEPS_H

#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "kernels/backend.h"

/* The engine fixtures' folder: TROUPE_MODEL_FIXTURES, else tests/fixtures/models. */
static inline const char *gpu_fixture_root(void)
{
    const char *r = getenv("TROUPE_MODEL_FIXTURES");
    return r && *r ? r : "tests/fixtures/models";
}

/* The CUDA backend the tests of a file share, made and destroyed around the group. */
static backend_t *s_gpu __attribute__((unused));

static inline int gpu_setup(void **state)
{
    (void)state;
    char err[256];
    s_gpu = backend_new("cuda", 0, err, sizeof err);
    if (!s_gpu)
        fprintf(stderr, "%s\n", err);
    return s_gpu ? 0 : -1;
}

static inline int gpu_teardown(void **state)
{
    (void)state;
    backend_destroy(&s_gpu);
    return 0;
}

/* The model of cfg from ck on be with options o: a prompt of n_prompt ids, then `steps` one-row
 * steps; returns the logits [1 + steps][vocab] (malloc'd), *load_s the load time (synced). Ids are
 * fixed functions of their position, so two runs feed the same tokens. Fails the test on error. */
static inline float *model_steps(backend_t *be, const char *dir, const model_config_t *cfg, ckpt_t *ck, const model_opts_t *o,
                          int n_prompt, int steps, double *load_s)
{
    char err[512];
    int64_t t0 = now_ns();
    model_t *m = model_load(dir, cfg, ck, be, o, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    assert_int_equal(be->ops->sync(be), 0);
    if (load_s)
        *load_s = (double)(now_ns() - t0) / 1e9;
    const dtype_t kvt = cfg->dtype == DT_F32 ? DT_F32 : DT_BF16;
    const int bs = o->kv_block_size, blocks = (n_prompt + steps + bs) / bs + 1;
    kvpool_t *pool = kvpool_new(blocks, bs, cfg->num_layers, cfg->num_kv_heads, cfg->head_dim, kvt, be, err, sizeof err);
    if (!pool)
        fail_msg("%s", err);
    const int V = cfg->vocab_size;
    float *lg = malloc((size_t)(1 + steps) * V * sizeof(float));
    kvseq_t *s = kvseq_new(pool, n_prompt + steps + 1, 0);
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    for (int i = 0; i < n_prompt; i++)
        ids[i] = (i * 7919 + 3) % V;
    assert_int_equal(kvseq_append(s, ids, n_prompt), 0);
    free(ids);
    model_seq_t q = {.kv = s, .n_new = n_prompt};
    model_batch_t b = {.n_seqs = 1, .seqs = &q};
    for (int step = 0; step <= steps; step++) {
        if (model_forward(m, &b, lg + (size_t)step * V, err, sizeof err) < 0)
            fail_msg("model_forward: %s", err);
        if (step == steps)
            break;
        kvseq_publish(s);
        int32_t next = (step * 131 + 9) % V;
        assert_int_equal(kvseq_append(s, &next, 1), 0);
        q.n_new = 1;
    }
    kvseq_destroy(&s);
    kvpool_destroy(&pool);
    model_destroy(&m);
    return lg;
}

#endif
