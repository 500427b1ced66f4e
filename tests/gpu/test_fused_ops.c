/* The CUDA backend's fused ops give the bits of the ops they replace (backend.h):
 *   - gate_up_swiglu against matmul of the stacked gate|up matrix then swiglu, M = 1..8, f32 and
 *     bf16 weights, and it declines (returns 1, nothing queued) where the GEMV path does not run;
 *   - whole models: each f32/bf16 fixture's prompt and 8 one-row decode steps with the fused ops
 *     (rope_kv_store on every step, gate_up_swiglu on the one-row steps) against plain_ops:
 *     logits bit-identical.
 * Runs on the GPU node (tools/gpu-run.sh); CI only compiles it. */
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

static uint64_t s_rng = 0x9e3779b97f4a7c15ULL;
static float s_rand(void)
{
    s_rng ^= s_rng << 13, s_rng ^= s_rng >> 7, s_rng ^= s_rng << 17;
    return (float)((double)(s_rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0);
}

static void *s_up(const void *h, size_t n)
{
    void *d = s_gpu->ops->alloc(s_gpu, n);
    assert_non_null(d);
    assert_int_equal(s_gpu->ops->upload(s_gpu, d, h, n), 0);
    return d;
}

static void test_gate_up_swiglu(void **state)
{
    /* I large enough that the plain GEMV of each half takes 4 warps a row (the fused kernel's
     * split): fewer rows take 8 (cuda_matmul.cu s_gemv_warps) and the op declines, below. */
    const int I = 12000, K = 512, N = 2 * I;
    for (int dt = 0; dt < 2; dt++) {
        const dtype_t dtype = dt ? DT_BF16 : DT_F32;
        const size_t es = dt ? 2 : 4;
        uint8_t *hw = malloc((size_t)N * K * es);
        for (size_t i = 0; i < (size_t)N * K; i++) {
            const float v = s_rand() * 0.05f;
            if (dt) {
                uint16_t b = f32_to_bf16(v);
                memcpy(hw + i * 2, &b, 2);
            } else {
                memcpy(hw + i * 4, &v, 4);
            }
        }
        bk_mat_t w = {.data = s_up(hw, (size_t)N * K * es), .rows = N, .cols = K, .dtype = dtype};
        for (int M = 1; M <= 8; M++) {
            float *hx = malloc((size_t)M * K * sizeof(float));
            for (int i = 0; i < M * K; i++)
                hx[i] = s_rand() * 4.0f;
            float *x = s_up(hx, (size_t)M * K * sizeof(float));
            float *gu = s_gpu->ops->alloc(s_gpu, (size_t)M * N * sizeof(float));
            float *ref = s_gpu->ops->alloc(s_gpu, (size_t)M * I * sizeof(float));
            float *out = s_gpu->ops->alloc(s_gpu, (size_t)M * I * sizeof(float));
            /* The plain ops: gate|up for M rows is [M][2I]; swiglu wants gate [M][I] and up [M][I],
             * so run the two halves as their own matrices (what the engine does for M > 1). */
            bk_mat_t wg = w, wu = w;
            wg.rows = wu.rows = I;
            wu.data = (const uint8_t *)w.data + (size_t)I * K * es;
            s_gpu->ops->matmul(s_gpu, x, M, &wg, NULL, gu);
            s_gpu->ops->matmul(s_gpu, x, M, &wu, NULL, gu + (size_t)M * I);
            s_gpu->ops->swiglu(s_gpu, gu, gu + (size_t)M * I, M * I, ref);
            assert_int_equal(s_gpu->ops->gate_up_swiglu(s_gpu, x, M, &w, out), 0);
            float *a = malloc((size_t)M * I * sizeof(float)), *b = malloc((size_t)M * I * sizeof(float));
            assert_int_equal(s_gpu->ops->download(s_gpu, a, ref, (size_t)M * I * sizeof(float)), 0);
            assert_int_equal(s_gpu->ops->download(s_gpu, b, out, (size_t)M * I * sizeof(float)), 0);
            for (int i = 0; i < M * I; i++)
                if (memcmp(&a[i], &b[i], 4) != 0)
                    fail_msg("%s M=%d: element %d (row %d col %d): fused %.9g, plain %.9g", dtype_name(dtype), M, i,
                             i / I, i % I, b[i], a[i]);
            free(a), free(b), free(hx);
            s_gpu->ops->free(s_gpu, x), s_gpu->ops->free(s_gpu, gu), s_gpu->ops->free(s_gpu, ref);
            s_gpu->ops->free(s_gpu, out);
        }
        /* Beyond the GEMV path's rows it declines, and for halves of few rows (8 warps a row). */
        float *x = s_gpu->ops->alloc(s_gpu, (size_t)64 * K * sizeof(float));
        assert_int_equal(s_gpu->ops->gate_up_swiglu(s_gpu, x, 64, &w, NULL), 1);
        bk_mat_t small = w;
        small.rows = 2000;
        assert_int_equal(s_gpu->ops->gate_up_swiglu(s_gpu, x, 1, &small, NULL), 1);
        s_gpu->ops->free(s_gpu, x);
        s_gpu->ops->free(s_gpu, (void *)w.data);
        free(hw);
        print_message("  gate_up_swiglu %s: M = 1..8 bit-identical to matmul + swiglu\n", dtype_name(dtype));
    }
}

/* A prompt then 8 one-row steps; logits [9][V]. */
static float *s_run(const char *dir, const model_config_t *cfg, int plain)
{
    char err[512];
    ckpt_t *ck = ckpt_open(dir, err, sizeof err);
    if (!ck)
        fail_msg("%s", err);
    model_opts_t o = {.max_tokens = 64, .max_seqs = 4, .max_context = 64, .kv_block_size = 4, .plain_ops = plain};
    float *lg = model_steps(s_gpu, dir, cfg, ck, &o, 13, 8, NULL);
    ckpt_destroy(&ck);
    return lg;
}

static void test_models(void **state)
{
    const char *names[] = {"qwen3-f32", "llama-gqa-f32", "llama-tied-bf16"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char dir[1024], err[512];
        snprintf(dir, sizeof dir, "%s/%s", gpu_fixture_root(), names[i]);
        model_config_t cfg;
        if (config_load(dir, &cfg, err, sizeof err) < 0)
            fail_msg("%s", err);
        float *a = s_run(dir, &cfg, 1), *b = s_run(dir, &cfg, 0);
        const size_t n = (size_t)9 * cfg.vocab_size;
        for (size_t k = 0; k < n; k++)
            if (memcmp(&a[k], &b[k], 4) != 0)
                fail_msg("%s: step %zu logit %zu: fused %.9g, plain %.9g", names[i], k / cfg.vocab_size,
                         k % cfg.vocab_size, b[k], a[k]);
        print_message("  %-16s prompt + 8 one-row steps: fused ops' logits bit-identical to the plain ops'\n", names[i]);
        free(a), free(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_up_swiglu),
        cmocka_unit_test(test_models),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
