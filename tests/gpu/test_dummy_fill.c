/* The CUDA backend makes the 'dummy' load format's weights in device memory (backend.h fill_dummy)
 * with the bits the checkpoint makes on the host:
 *   - fill_dummy against ckpt_expect's host bytes for matrices and norm vectors in bf16, f16 and
 *     f32 (odd sizes);
 *   - the fp8 e4m3 fill (online-quantized dummy codes) against common/dtype.h's f32_to_f8e4m3 of
 *     the same values, and none of its codes NaN;
 *   - a whole dummy model (the Qwen3-0.6B shape, bf16) loaded with its weights made on the device
 *     and made on the host (model_opts_t.dummy_on_host): the logits of a prompt and 4 decode steps
 *     bit-identical; both load times printed.
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
#include "common/util.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "kernels/dummy_fill.h"
#include "tests/gpu/model_steps.h"


static void test_fill_matches_host(void **state)
{
    const dtype_t dts[3] = {DT_BF16, DT_F16, DT_F32};
    const struct { const char *name; int ndim; int64_t shape[2]; } ts[] = {
        {"model.layers.7.mlp.down_proj.weight", 2, {1000, 333}},
        {"model.layers.7.post_attention_layernorm.weight", 1, {4099, 0}},
        {"lm_head.weight", 2, {3, 5}},
    };
    char err[256];
    for (int d = 0; d < 3; d++) {
        ckpt_t *host = ckpt_dummy(dts[d], 0), *dev = ckpt_dummy(dts[d], 0);
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            const tensor_view_t *h = ckpt_expect(host, ts[i].name, ts[i].ndim, ts[i].shape, err, sizeof err);
            ckpt_dummy_recipe_t r;
            const tensor_view_t *v = ckpt_expect_recipe(dev, ts[i].name, ts[i].ndim, ts[i].shape, &r, err, sizeof err);
            assert_non_null(h);
            assert_non_null(v);
            assert_null(v->data);
            assert_int_equal(v->nbytes, h->nbytes);
            void *buf = s_gpu->ops->alloc(s_gpu, h->nbytes);
            s_gpu->ops->fill_dummy(s_gpu, buf, r.dtype, h->nbytes / dtype_size(r.dtype), r.key, r.center, r.scale);
            uint8_t *back = malloc(h->nbytes);
            assert_int_equal(s_gpu->ops->download(s_gpu, back, buf, h->nbytes), 0);
            size_t es = dtype_size(dts[d]);
            for (size_t k = 0; k < h->nbytes; k += es)
                if (memcmp(back + k, (const uint8_t *)h->data + k, es) != 0)
                    fail_msg("%s %s element %zu: device and host bytes differ", dtype_name(dts[d]), ts[i].name, k / es);
            free(back);
            s_gpu->ops->free(s_gpu, buf);
        }
        print_message("  fill_dummy %s: matrices and norms bit-identical to the host's\n", dtype_name(dts[d]));
        ckpt_destroy(&host);
        ckpt_destroy(&dev);
    }
}

static void test_fill_e4m3(void **state)
{
    const size_t n = 100003;
    const uint64_t key = 0x1234abcdull;
    uint8_t *buf = s_gpu->ops->alloc(s_gpu, n), *back = malloc(n);
    s_gpu->ops->fill_dummy(s_gpu, buf, DT_F8E4M3, n, key, 0.0f, 1.0f);
    assert_int_equal(s_gpu->ops->download(s_gpu, back, buf, n), 0);
    for (size_t i = 0; i < n; i++) {
        if ((back[i] & 0x7f) == 0x7f)
            fail_msg("fp8 fill element %zu: NaN code 0x%02x", i, back[i]);
        const uint8_t want = f32_to_f8e4m3(dummy_value(key, i, 0.0f, 1.0f));
        if (back[i] != want)
            fail_msg("fp8 fill element %zu: device 0x%02x, host 0x%02x", i, back[i], want);
    }
    print_message("  fill_dummy f8e4m3: %zu codes equal to the host's rounding, none NaN\n", n);
    free(back);
    s_gpu->ops->free(s_gpu, buf);
}

/* The dummy bf16 model of dir, its weights made on the host (on_host) or on the device: a prompt
 * then 4 one-row steps; logits [5][V]. */
static float *s_run(const char *dir, const model_config_t *cfg, int on_host, double *load_s)
{
    ckpt_t *ck = ckpt_dummy(DT_BF16, 0);
    model_opts_t o = {.max_tokens = 64, .max_seqs = 4, .max_context = 64, .kv_block_size = 16, .dummy_on_host = on_host};
    float *lg = model_steps(s_gpu, dir, cfg, ck, &o, 20, 4, load_s);
    ckpt_destroy(&ck);
    return lg;
}

static void test_model_same_bits(void **state)
{
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/qwen3-0.6b-shape", gpu_fixture_root());
    model_config_t cfg;
    if (config_load(dir, &cfg, err, sizeof err) < 0)
        fail_msg("%s", err);
    double t_host = 0, t_dev = 0;
    float *a = s_run(dir, &cfg, 1, &t_host), *b = s_run(dir, &cfg, 0, &t_dev);
    const size_t n = (size_t)5 * cfg.vocab_size;
    for (size_t k = 0; k < n; k++)
        if (memcmp(&a[k], &b[k], 4) != 0)
            fail_msg("step %zu logit %zu: device-made weights give %.9g, host-made %.9g", k / cfg.vocab_size,
                     k % cfg.vocab_size, b[k], a[k]);
    print_message("  qwen3-0.6b-shape dummy bf16: logits bit-identical; load %.2f s with the weights made on the "
                  "device, %.2f s made on the host and copied\n", t_dev, t_host);
    free(a), free(b);
}

static int s_setup(void **state)
{
    return gpu_setup(state) == 0 && s_gpu->ops->fill_dummy ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_matches_host),
        cmocka_unit_test(test_fill_e4m3),
        cmocka_unit_test(test_model_same_bits),
    };
    return cmocka_run_group_tests(tests, s_setup, gpu_teardown);
}
