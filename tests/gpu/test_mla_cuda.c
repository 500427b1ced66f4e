/* tests/gpu/test_mla_cuda.c — DeepSeek-V3 on the CUDA backend against the CPU reference: the
 * fixtures deepseek-v3-f32 (q_lora, YaRN, groups, shared expert) and deepseek-v3-noqlora-bf16 (q_proj,
 * bf16, one group), and kjv-deepseek from TROUPE_MODELS when present. Each model runs a prompt of
 * 40 ids and 24 one-row decode steps on both backends (prefill: MLA over many rows; decode: the
 * absorbed attention of one row over the compressed cache, the sigmoid group routing on the
 * device); every step's logits must agree within a relative error of 2e-2 and have the same
 * argmax. The ops' own results are compared too: mla_attention and moe_route_sigmoid on random
 * inputs, ids equal and values close. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/gpu/model_steps.h"

static double s_relerr(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int s_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

static void s_compare(const char *dir)
{
    char err[512];
    if (access(dir, R_OK) != 0) {
        print_message("SKIP %s: absent\n", dir);
        return;
    }
    model_config_t cfg;
    if (config_load(dir, &cfg, err, sizeof err) != 0)
        fail_msg("%s", err);
    ckpt_t *ck = ckpt_open(dir, err, sizeof err);
    if (!ck)
        fail_msg("%s", err);
    backend_t *cpu = backend_cpu_new(0);
    const model_opts_t o = {.max_tokens = 64, .max_seqs = 1, .max_context = 128, .kv_block_size = 16};
    const int steps = 24, V = cfg.vocab_size;
    float *a = model_steps(cpu, dir, &cfg, ck, &o, 40, steps, NULL);
    float *b = model_steps(s_gpu, dir, &cfg, ck, &o, 40, steps, NULL);
    double worst = 0;
    for (int s = 0; s <= steps; s++) {
        const double e = s_relerr(b + (size_t)s * V, a + (size_t)s * V, (size_t)V);
        worst = e > worst ? e : worst;
        if (s_argmax(b + (size_t)s * V, V) != s_argmax(a + (size_t)s * V, V))
            fail_msg("%s step %d: CUDA argmax %d, CPU %d", dir, s, s_argmax(b + (size_t)s * V, V),
                     s_argmax(a + (size_t)s * V, V));
    }
    print_message("%s: CUDA vs CPU worst logits relative error %.2e over a 40-token prefill and %d decode steps\n",
                  dir, worst, steps);
    assert_true(worst < 2e-2);
    free(a);
    free(b);
    backend_destroy(&cpu);
    ckpt_destroy(&ck);
}

static void test_fixtures(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/deepseek-v3-f32", gpu_fixture_root());
    s_compare(dir);
    snprintf(dir, sizeof dir, "%s/deepseek-v3-noqlora-bf16", gpu_fixture_root());
    s_compare(dir);
    const char *root = getenv("TROUPE_MODELS");
    snprintf(dir, sizeof dir, "%s/kjv-deepseek", root && *root ? root : "../shared/models");
    s_compare(dir);
}

/* moe_route_sigmoid on random logits and biases: the same ids, weights within 1e-6. */
static void test_route(void **state)
{
    (void)state;
    backend_t *cpu = backend_cpu_new(1);
    const int M = 37, E = 64, k = 6, G = 8, TG = 3;
    float lg[37 * 64], bias[64], w_a[37 * 6], w_b[37 * 6];
    int32_t id_a[37 * 6], id_b[37 * 6];
    uint64_t r = 12345;
    for (int i = 0; i < M * E; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((int)(r >> 40) % 2000 - 1000) / 250.0f;
    }
    for (int e = 0; e < E; e++)
        bias[e] = (float)((e * 37) % 17 - 8) / 40.0f;
    cpu->ops->moe_route_sigmoid(cpu, lg, bias, M, E, k, G, TG, 1, 2.5f, id_a, w_a);
    float *d_lg = s_gpu->ops->alloc(s_gpu, sizeof lg), *d_bias = s_gpu->ops->alloc(s_gpu, sizeof bias),
          *d_w = s_gpu->ops->alloc(s_gpu, sizeof w_b);
    int32_t *d_id = s_gpu->ops->alloc(s_gpu, sizeof id_b);
    s_gpu->ops->upload(s_gpu, d_lg, lg, sizeof lg);
    s_gpu->ops->upload(s_gpu, d_bias, bias, sizeof bias);
    s_gpu->ops->moe_route_sigmoid(s_gpu, d_lg, d_bias, M, E, k, G, TG, 1, 2.5f, d_id, d_w);
    s_gpu->ops->download(s_gpu, id_b, d_id, sizeof id_b);
    s_gpu->ops->download(s_gpu, w_b, d_w, sizeof w_b);
    assert_memory_equal(id_a, id_b, sizeof id_a);
    for (int i = 0; i < M * k; i++)
        assert_true(fabsf(w_a[i] - w_b[i]) <= 1e-6f * fabsf(w_a[i]) + 1e-7f);
    s_gpu->ops->free(s_gpu, d_lg);
    s_gpu->ops->free(s_gpu, d_bias);
    s_gpu->ops->free(s_gpu, d_w);
    s_gpu->ops->free(s_gpu, d_id);
    backend_destroy(&cpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_fixtures),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
