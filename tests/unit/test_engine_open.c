/* tests/unit/test_engine_open.c — engine_open, the one place a model is opened (engine/engine_open.h):
 *   - every fixture checkpoint opens on the CPU: model, pool of the blocks asked for, logits rows,
 *     the stored weights' dtype, and its greedy first token is transformers' (expected.json);
 *   - the KV dtype rule: auto keeps a checkpoint's config dtype (f32, bf16), the dummy weights'
 *     dtype under the dummy load format, and an explicit choice wins;
 *   - the dummy load format: no weight files needed, the same weights twice, the config's dtype
 *     by default;
 *   - errors name the file or the option, and say whose fault: a missing or broken config.json, a
 *     directory without weights (with the dummy hint), a broken model.safetensors, a KV dtype the
 *     backend refuses, a pool of no blocks — all ENGINE_ERR_CONFIG. */
#include <jansson.h>
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

#include "engine/engine_open.h"
#include "tests/unit/expected_fixture.h"

#define FIXTURES "tests/fixtures/models"

static char s_tmp[256];

static int s_setup(void **state)
{
    snprintf(s_tmp, sizeof s_tmp, "/tmp/test_engine_open.XXXXXX");
    return mkdtemp(s_tmp) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void s_write(const char *dir, const char *name, const void *data, size_t n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A fresh directory under s_tmp holding a copy of fixture's config.json (fixture NULL: nothing). */
static const char *s_dir(const char *name, const char *fixture)
{
    static char d[512];
    snprintf(d, sizeof d, "%s/%s", s_tmp, name);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'%s%s%s%s", d, fixture ? " && cp " FIXTURES "/" : "", fixture ? fixture : "",
             fixture ? "/config.json " : "", fixture ? d : "");
    assert_int_equal(system(cmd), 0);
    return d;
}

static engine_spec_t s_spec(long blocks)
{
    engine_spec_t s;
    engine_spec_default(&s);
    s.threads = 2;
    s.model = (model_opts_t){.max_tokens = 64, .max_seqs = 2, .max_context = 128, .kv_block_size = 16};
    s.kv_blocks = blocks;
    return s;
}

/* Greedy first token of fixture prompt 0 through e's model. */
static int32_t s_first_token(engine_t *e, const expected_t *x)
{
    char err[512];
    kvseq_t *seq = kvseq_new(e->pool, 128, 0);
    assert_non_null(seq);
    assert_int_equal(kvseq_append(seq, x->ids[0], x->n_ids[0]), 0);
    model_seq_t q = {.kv = seq, .n_new = x->n_ids[0]};
    model_batch_t b = {.n_seqs = 1, .seqs = &q};
    assert_int_equal(model_forward(e->model, &b, e->logits, err, sizeof err), 0);
    int32_t best = 0;
    for (int i = 1; i < e->cfg.vocab_size; i++)
        if (e->logits[i] > e->logits[best])
            best = i;
    kvseq_destroy(&seq);
    return best;
}

static void test_opens_every_fixture(void **state)
{
    static const struct {
        const char *name;
        dtype_t weights;
    } cases[] = {{"llama-gqa-f32", DT_F32}, {"llama-tied-bf16", DT_BF16}, {"qwen3-f32", DT_F32},
                 {"qwen3-moe-f32", DT_F32}, {"mixtral-f32", DT_F32},    {"qwen3-sharded-f32", DT_F32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[256], path[300], err[1024];
        snprintf(dir, sizeof dir, FIXTURES "/%s", cases[i].name);
        const engine_spec_t s = s_spec(24);
        engine_status_t st = ENGINE_ERR_RUNTIME;
        engine_t *e = engine_open(dir, &s, &st, err, sizeof err);
        if (!e)
            fail_msg("%s: %s", dir, err);
        assert_int_equal(st, ENGINE_OK);
        assert_non_null(e->model);
        assert_string_equal(e->be->ops->name, "cpu");
        assert_int_equal(kvpool_n_blocks(e->pool), 24);
        assert_int_equal(kvpool_block_size(e->pool), 16);
        assert_int_equal(e->logit_rows, 2);
        assert_int_equal(e->weights_dtype, cases[i].weights);
        assert_int_equal(e->kv_dtype, e->cfg.dtype);            /* auto: the config's dtype */
        expected_t x = {0};
        snprintf(path, sizeof path, "%s/expected.json", dir);
        s_load_expected(path, &x);
        assert_int_equal(s_first_token(e, &x), x.greedy[0][0]);
        s_free_expected(&x);
        engine_destroy(&e);
        assert_null(e);
        engine_destroy(&e);                                     /* idempotent */
    }
}

static void test_kv_dtype_rule(void **state)
{
    static const struct {
        const char *fixture;
        int dummy;
        dtype_t dtype, kv, want;
    } cases[] = {
        {"qwen3-f32", 0, DT_COUNT, DT_COUNT, DT_F32},             /* a checkpoint: its config's dtype */
        {"llama-tied-bf16", 0, DT_COUNT, DT_COUNT, DT_BF16},
        {"llama-tied-bf16", 0, DT_F16, DT_COUNT, DT_BF16},        /* --dtype is the dummy weights' only */
        {"qwen3-f32", 0, DT_COUNT, DT_F8E4M3, DT_F8E4M3},         /* chosen wins */
        {"llama-tied-bf16", 0, DT_COUNT, DT_F32, DT_F32},
        {"qwen3-f32", 1, DT_BF16, DT_COUNT, DT_BF16},             /* dummy: the dummy weights' dtype */
        {"qwen3-f32", 1, DT_COUNT, DT_COUNT, DT_F32},             /* dummy of the config's dtype */
        {"llama-tied-bf16", 1, DT_F16, DT_F32, DT_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[256], err[1024];
        snprintf(dir, sizeof dir, FIXTURES "/%s", cases[i].fixture);
        engine_spec_t s = s_spec(8);
        s.dummy = cases[i].dummy;
        s.dtype = cases[i].dtype;
        s.kv_dtype = cases[i].kv;
        engine_t *e = engine_open(dir, &s, NULL, err, sizeof err);
        if (!e)
            fail_msg("case %zu: %s", i, err);
        assert_int_equal(e->kv_dtype, cases[i].want);
        assert_int_equal(kvpool_view(e->pool)->dtype, cases[i].want);
        engine_destroy(&e);
    }
}

static void test_dummy_load_format(void **state)
{
    /* A directory with a config and nothing else opens with dummy weights of the config's dtype. */
    const char *dir = s_dir("config-only", "qwen3-f32");
    char err[1024];
    engine_spec_t s = s_spec(8);
    s.dummy = 1;
    engine_t *a = engine_open(dir, &s, NULL, err, sizeof err);
    if (!a)
        fail_msg("%s", err);
    assert_true(ckpt_is_dummy(a->ck));
    assert_int_equal(a->weights_dtype, DT_F32);
    s.dtype = DT_BF16;
    engine_t *b = engine_open(dir, &s, NULL, err, sizeof err);
    assert_non_null(b);
    assert_int_equal(b->weights_dtype, DT_BF16);
    engine_destroy(&b);
    /* The same weights in a second engine: the same logits, bit for bit. */
    s.dtype = DT_COUNT;
    b = engine_open(dir, &s, NULL, err, sizeof err);
    assert_non_null(b);
    expected_t x = {.n = 1, .n_ids = {5}};
    int32_t ids[5] = {3, 4, 5, 6, 7};
    x.ids[0] = ids;
    s_first_token(a, &x);
    s_first_token(b, &x);
    assert_memory_equal(a->logits, b->logits, (size_t)a->cfg.vocab_size * sizeof(float));
    for (int i = 0; i < a->cfg.vocab_size; i++)
        assert_true(isfinite(a->logits[i]));
    engine_destroy(&a);
    engine_destroy(&b);
}

/* engine_open's error for dir fails with status `want`, and err contains every needle. */
static void s_expect_error(const char *dir, const engine_spec_t *s, engine_status_t want, ...)
{
    char err[1024] = "";
    engine_status_t st = ENGINE_OK;
    engine_t *e = engine_open(dir, s, &st, err, sizeof err);
    assert_null(e);
    assert_int_equal(st, want);
    print_message("%s: %s\n", dir, err);
    va_list ap;
    va_start(ap, want);
    for (const char *needle; (needle = va_arg(ap, const char *));)
        if (!strstr(err, needle))
            fail_msg("error '%s' does not contain '%s'", err, needle);
    va_end(ap);
}

static void test_config_errors(void **state)
{
    engine_spec_t s = s_spec(8);
    char err[1024];
    /* No config.json: engine_new already fails, naming the file. */
    const char *dir = s_dir("empty", NULL);
    assert_null(engine_new(dir, err, sizeof err));
    assert_non_null(strstr(err, "config.json"));
    assert_non_null(strstr(err, dir));
    s_expect_error(dir, &s, ENGINE_ERR_CONFIG, dir, "config.json", NULL);
    /* A config.json that is not JSON, and one with a field out of range. */
    dir = s_dir("broken-config", NULL);
    s_write(dir, "config.json", "{\"architectures\": [", 19);
    s_expect_error(dir, &s, ENGINE_ERR_CONFIG, dir, "config.json", NULL);
    const char *bad = "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 64, \"hidden_size\": 16,"
                      " \"intermediate_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": -2}";
    s_write(dir, "config.json", bad, strlen(bad));
    s_expect_error(dir, &s, ENGINE_ERR_CONFIG, "config.json", "num_attention_heads", NULL);
}

static void test_checkpoint_errors(void **state)
{
    engine_spec_t s = s_spec(8);
    /* No weights: the directory named, and how to run it anyway. */
    const char *dir = s_dir("no-weights", "qwen3-f32");
    s_expect_error(dir, &s, ENGINE_ERR_CONFIG, dir, "no model.safetensors or model.safetensors.index.json",
                   "load_format: dummy", NULL);
    s.dummy_option = "--load-format dummy";
    s_expect_error(dir, &s, ENGINE_ERR_CONFIG, "(--load-format dummy runs random weights", NULL);
    /* A model.safetensors whose header is cut short: the file named. */
    const uint8_t junk[12] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '"', 'a', '"'};
    s_write(dir, "model.safetensors", junk, sizeof junk);
    s_expect_error(dir, &s, ENGINE_ERR_CONFIG, "model.safetensors", NULL);
    /* Weights of another shape than config.json says: the tensor named. */
    dir = s_dir("other-shape", "qwen3-f32");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp " FIXTURES "/llama-gqa-f32/model.safetensors '%s'/", dir);
    assert_int_equal(system(cmd), 0);
    s_expect_error(dir, &s, ENGINE_ERR_CONFIG, "model.safetensors", "q_proj.weight' has shape", NULL);
}

static void test_option_errors(void **state)
{
    /* A KV dtype the backend refuses, named as the caller's option. */
    engine_spec_t s = s_spec(8);
    s.kv_dtype = (dtype_t)99;
    s.kv_dtype_option = "model.kv_dtype";
    s_expect_error(FIXTURES "/qwen3-f32", &s, ENGINE_ERR_CONFIG, "model.kv_dtype", NULL);
    /* A pool of no blocks. */
    s = s_spec(0);
    s_expect_error(FIXTURES "/qwen3-f32", &s, ENGINE_ERR_CONFIG, "KV pool of 0 blocks", NULL);
    /* An unknown backend: the moment's fault, not the model's. */
    s = s_spec(8);
    s.backend = "tpu";
    s_expect_error(FIXTURES "/qwen3-f32", &s, ENGINE_ERR_RUNTIME, "tpu", NULL);
}

static void test_kv_fit(void **state)
{
    /* kv_fit on the CPU: the blocks asked for when a quarter of the host's memory holds them. */
    engine_spec_t s = s_spec(40);
    s.kv_fit = 1;
    s.kv_sharers = 3;
    s.kv_share = 0.25;
    char err[1024];
    engine_t *e = engine_open(FIXTURES "/llama-gqa-f32", &s, NULL, err, sizeof err);
    if (!e)
        fail_msg("%s", err);
    assert_int_equal(e->mem_at_start, 0);                   /* the CPU cannot tell */
    assert_int_equal(kvpool_n_blocks(e->pool), 40);
    engine_destroy(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opens_every_fixture), cmocka_unit_test(test_kv_dtype_rule),
        cmocka_unit_test(test_dummy_load_format),   cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_checkpoint_errors),   cmocka_unit_test(test_option_errors),
        cmocka_unit_test(test_kv_fit),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
