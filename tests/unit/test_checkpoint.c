/* tests/unit/test_checkpoint.c — tensors by name with shape checks: single-file and sharded
 * checkpoints (including lying indexes), the dummy load format, and — once the lead has generated
 * them — every Hugging Face fixture under tests/fixtures/models/ checked against its config. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "kernels/dummy_fill.h"

static char s_dir[256];

static int s_setup(void **state)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/troupe-ckpt-XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- writing small safetensors files ---- */

typedef struct { const char *name; int ndim; int64_t shape[4]; float base; } spec_t;

static int64_t s_numel(const spec_t *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        n *= s->shape[i];
    return n;
}

/* Writes an F32 safetensors file holding the specs; element j of a tensor is base + j. */
static void s_write_st(const char *path, const spec_t *specs, int n)
{
    char hdr[4096];
    size_t off = 0, data_len = 0;
    off += (size_t)snprintf(hdr + off, sizeof hdr - off, "{");
    for (int i = 0; i < n; i++) {
        size_t nb = (size_t)s_numel(&specs[i]) * 4;
        off += (size_t)snprintf(hdr + off, sizeof hdr - off, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", i ? "," : "",
                                specs[i].name);
        for (int d = 0; d < specs[i].ndim; d++)
            off += (size_t)snprintf(hdr + off, sizeof hdr - off, "%s%lld", d ? "," : "", (long long)specs[i].shape[d]);
        off += (size_t)snprintf(hdr + off, sizeof hdr - off, "],\"data_offsets\":[%zu,%zu]}", data_len, data_len + nb);
        data_len += nb;
    }
    off += (size_t)snprintf(hdr + off, sizeof hdr - off, "}");
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint64_t hl = off;
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(hl >> (8 * i));
    fwrite(le, 1, 8, fp);
    fwrite(hdr, 1, off, fp);
    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < s_numel(&specs[i]); j++) {
            float v = specs[i].base + (float)j;
            fwrite(&v, 4, 1, fp);
        }
    fclose(fp);
}

static void s_write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static const char *s_mkdir(const char *sub)
{
    static char d[400];
    snprintf(d, sizeof d, "%s/%s", s_dir, sub);
    mkdir(d, 0755);
    return d;
}

static void s_contains(const char *err, ...)
{
    va_list ap;
    va_start(ap, err);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        if (!strstr(err, frag))
            fail_msg("error \"%s\" lacks \"%s\"", err, frag);
    va_end(ap);
}

static const spec_t SPECS_A[] = {
    {"model.embed_tokens.weight", 2, {8, 4}, 100.0f},
    {"model.norm.weight", 1, {4}, 1.0f},
    {"model.layers.0.self_attn.q_proj.weight", 2, {2, 3}, -5.0f},
};

static void test_single_file(void **state)
{
    const char *dir = s_mkdir("single");
    char path[600], err[600] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    s_write_st(path, SPECS_A, 3);
    ckpt_t *c = ckpt_open(dir, err, sizeof err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(ckpt_count(c), 3);
    assert_int_equal(ckpt_is_dummy(c), 0);
    assert_true(ckpt_has(c, "model.norm.weight"));
    assert_false(ckpt_has(c, "lm_head.weight"));
    /* Listing is sorted by name. */
    assert_string_equal(ckpt_at(c, 0)->name, "model.embed_tokens.weight");
    assert_string_equal(ckpt_at(c, 2)->name, "model.norm.weight");

    const int64_t emb[2] = {8, 4};
    const tensor_view_t *v = ckpt_expect(c, "model.embed_tokens.weight", 2, emb, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(v->dtype, DT_F32);
    assert_int_equal(v->ndim, 2);
    assert_int_equal(v->nbytes, 8 * 4 * 4);
    float got[32];
    dtype_to_f32(v->dtype, v->data, got, 32);
    for (int j = 0; j < 32; j++)
        assert_true(got[j] == 100.0f + (float)j);
    assert_ptr_equal(ckpt_get(c, "model.embed_tokens.weight"), v);
    assert_string_equal(ckpt_file_of(c, "model.embed_tokens.weight"), path);

    /* Shape mismatch: the message names the tensor, the file and both shapes. */
    const int64_t wrong[2] = {3, 2};
    assert_null(ckpt_expect(c, "model.layers.0.self_attn.q_proj.weight", 2, wrong, err, sizeof err));
    s_contains(err, "model.layers.0.self_attn.q_proj.weight", path, "has shape [2, 3]", "expected [3, 2]", NULL);
    /* Rank mismatch too. */
    const int64_t flat[1] = {6};
    assert_null(ckpt_expect(c, "model.layers.0.self_attn.q_proj.weight", 1, flat, err, sizeof err));
    s_contains(err, "has shape [2, 3]", "expected [6]", NULL);
    /* Missing tensor. */
    assert_null(ckpt_expect(c, "lm_head.weight", 2, emb, err, sizeof err));
    s_contains(err, dir, "'lm_head.weight' not found", NULL);
    /* A rank the view cannot hold is refused, not written past shape[4]. */
    const int64_t five[5] = {1, 1, 1, 1, 1};
    assert_null(ckpt_expect(c, "model.norm.weight", 5, five, err, sizeof err));
    s_contains(err, "rank 5", NULL);
    ckpt_destroy(&c);
    assert_null(c);
    ckpt_destroy(&c);

    /* A path to the file itself works too. */
    c = ckpt_open(path, err, sizeof err);
    assert_non_null(c);
    assert_int_equal(ckpt_count(c), 3);
    ckpt_destroy(&c);
}

static void test_open_errors(void **state)
{
    char err[600] = "";
    const char *dir = s_mkdir("empty");
    assert_null(ckpt_open(dir, err, sizeof err));
    s_contains(err, dir, "no model.safetensors or model.safetensors.index.json", NULL);
    /* A corrupt single file: the safetensors error comes through with the path. */
    char path[600];
    dir = s_mkdir("corrupt");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *fp = fopen(path, "wb");
    fwrite("\x04\0\0\0\0\0\0\0{]  ", 1, 12, fp);      /* a 4-byte header "{]  " */
    fclose(fp);
    assert_null(ckpt_open(dir, err, sizeof err));
    s_contains(err, path, "not valid JSON", NULL);
    /* A tensor with more dimensions than a view holds. */
    dir = s_mkdir("rank5");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fp = fopen(path, "wb");
    const char *h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}";
    uint8_t le[8] = {(uint8_t)strlen(h)};
    float one = 1;
    fwrite(le, 1, 8, fp);
    fwrite(h, 1, strlen(h), fp);
    fwrite(&one, 4, 1, fp);
    fclose(fp);
    assert_null(ckpt_open(dir, err, sizeof err));
    s_contains(err, "'x' has 5 dimensions", NULL);
}

/* Two shards and an index as transformers writes them. */
static const char *s_sharded(const char *sub)
{
    const char *dir = s_mkdir(sub);
    char path[600];
    static const spec_t s1[] = {{"a.weight", 2, {2, 2}, 10.0f}, {"b.weight", 1, {3}, 20.0f}};
    static const spec_t s2[] = {{"c.weight", 2, {1, 4}, 30.0f}};
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    s_write_st(path, s1, 2);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    s_write_st(path, s2, 1);
    return dir;
}

static void s_index(const char *dir, const char *json)
{
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    s_write_text(path, json);
}

#define GOOD_MAP "\"a.weight\":\"model-00001-of-00002.safetensors\",\"b.weight\":\"model-00001-of-00002.safetensors\"," \
                 "\"c.weight\":\"model-00002-of-00002.safetensors\""

static void test_sharded(void **state)
{
    const char *dir = s_sharded("sharded");
    s_index(dir, "{\"metadata\":{\"total_size\":60},\"weight_map\":{" GOOD_MAP "}}");
    char err[600] = "";
    ckpt_t *c = ckpt_open(dir, err, sizeof err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(ckpt_count(c), 3);
    const int64_t sc[2] = {1, 4}, sb[1] = {3};
    const tensor_view_t *v = ckpt_expect(c, "c.weight", 2, sc, err, sizeof err);
    assert_non_null(v);
    float got[4];
    dtype_to_f32(DT_F32, v->data, got, 4);
    assert_true(got[0] == 30.0f && got[3] == 33.0f);
    v = ckpt_expect(c, "b.weight", 1, sb, err, sizeof err);
    assert_non_null(v);
    dtype_to_f32(DT_F32, v->data, got, 3);
    assert_true(got[0] == 20.0f && got[2] == 22.0f);
    assert_non_null(strstr(ckpt_file_of(c, "c.weight"), "model-00002-of-00002.safetensors"));
    assert_non_null(strstr(ckpt_file_of(c, "a.weight"), "model-00001-of-00002.safetensors"));
    /* The mismatch message names the shard. */
    assert_null(ckpt_expect(c, "c.weight", 2, (const int64_t[]){4, 1}, err, sizeof err));
    s_contains(err, "model-00002-of-00002.safetensors", "'c.weight'", "[1, 4]", "[4, 1]", NULL);
    ckpt_destroy(&c);
}

static void s_index_fail(const char *sub, const char *index, ...)
{
    const char *dir = s_sharded(sub);
    s_index(dir, index);
    char err[600] = "";
    ckpt_t *c = ckpt_open(dir, err, sizeof err);
    if (c)
        fail_msg("index accepted: %s", index);
    va_list ap;
    va_start(ap, index);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        if (!strstr(err, frag))
            fail_msg("error \"%s\" lacks \"%s\"", err, frag);
    va_end(ap);
}

static void test_lying_index(void **state)
{
    /* Maps a tensor to the wrong shard. */
    s_index_fail("lie1", "{\"weight_map\":{\"a.weight\":\"model-00002-of-00002.safetensors\","
                         "\"b.weight\":\"model-00001-of-00002.safetensors\",\"c.weight\":\"model-00002-of-00002.safetensors\"}}",
                 "model.safetensors.index.json", "'a.weight'", "but it is in", "model-00001-of-00002", NULL);
    /* Lists a tensor no shard has. */
    s_index_fail("lie2", "{\"weight_map\":{" GOOD_MAP ",\"d.weight\":\"model-00002-of-00002.safetensors\"}}",
                 "'d.weight'", "does not contain it", NULL);
    /* Omits a tensor a shard holds. */
    s_index_fail("lie3", "{\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\","
                         "\"c.weight\":\"model-00002-of-00002.safetensors\"}}",
                 "holds tensor 'b.weight'", "does not list", NULL);
    /* Names a shard that does not exist. */
    s_index_fail("lie4", "{\"weight_map\":{" GOOD_MAP ",\"e.weight\":\"model-00003-of-00003.safetensors\"}}",
                 "model-00003-of-00003.safetensors", "cannot open", NULL);
    /* Escapes the directory. */
    s_index_fail("lie5", "{\"weight_map\":{\"a.weight\":\"../single/model.safetensors\"}}", "'a.weight'",
                 "not a plain file name", NULL);
    s_index_fail("lie6", "{\"weight_map\":{\"a.weight\":\"/etc/passwd\"}}", "not a plain file name", NULL);
    s_index_fail("lie7", "{\"weight_map\":{\"a.weight\":\"..\"}}", "not a plain file name", NULL);
    s_index_fail("lie8", "{\"weight_map\":{\"a.weight\":5}}", "not a plain file name", NULL);
    /* Structure. */
    s_index_fail("lie9", "{\"metadata\":{}}", "\"weight_map\" missing", NULL);
    s_index_fail("lie10", "{\"weight_map\":{}}", "\"weight_map\" missing, empty", NULL);
    s_index_fail("lie11", "{\"weight_map\":{" GOOD_MAP "}", "model.safetensors.index.json", "not valid JSON", NULL);
    s_index_fail("lie12", "[]", "\"weight_map\"", NULL);
    s_index_fail("lie13", "{\"weight_map\":{" GOOD_MAP ",\"a.weight\":\"model-00001-of-00002.safetensors\"}}",
                 "duplicate", NULL);

    /* The same tensor stored in two shards. */
    const char *dir = s_sharded("twice");
    char path[600], err[600] = "";
    static const spec_t dup[] = {{"a.weight", 2, {2, 2}, 0.0f}, {"c.weight", 2, {1, 4}, 0.0f}};
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    s_write_st(path, dup, 2);
    s_index(dir, "{\"weight_map\":{" GOOD_MAP "}}");
    assert_null(ckpt_open(dir, err, sizeof err));
    s_contains(err, "'a.weight' is also in", NULL);
}

static void test_dummy(void **state)
{
    char err[600] = "";
    ckpt_t *a = ckpt_dummy(DT_F32, 42), *b = ckpt_dummy(DT_F32, 42), *d = ckpt_dummy(DT_F32, 43);
    assert_int_equal(ckpt_is_dummy(a), 1);
    const int64_t wq[2] = {96, 64}, nw[1] = {64}, emb[2] = {512, 64};
    assert_false(ckpt_has(a, "w"));
    /* Different call order in b: values depend on (seed, name) only. */
    const tensor_view_t *a_emb = ckpt_expect(a, "model.embed_tokens.weight", 2, emb, err, sizeof err);
    const tensor_view_t *a_q = ckpt_expect(a, "model.layers.0.self_attn.q_proj.weight", 2, wq, err, sizeof err);
    const tensor_view_t *a_n = ckpt_expect(a, "model.layers.0.input_layernorm.weight", 1, nw, err, sizeof err);
    const tensor_view_t *b_n = ckpt_expect(b, "model.layers.0.input_layernorm.weight", 1, nw, err, sizeof err);
    const tensor_view_t *b_q = ckpt_expect(b, "model.layers.0.self_attn.q_proj.weight", 2, wq, err, sizeof err);
    const tensor_view_t *b_emb = ckpt_expect(b, "model.embed_tokens.weight", 2, emb, err, sizeof err);
    const tensor_view_t *d_q = ckpt_expect(d, "model.layers.0.self_attn.q_proj.weight", 2, wq, err, sizeof err);
    assert_non_null(a_emb);
    assert_non_null(a_q);
    assert_non_null(a_n);
    assert_int_equal(a_q->nbytes, 96 * 64 * 4);
    assert_int_equal(a_q->ndim, 2);
    assert_int_equal(a_q->shape[0], 96);
    assert_int_equal(a_q->shape[1], 64);
    assert_memory_equal(a_q->data, b_q->data, a_q->nbytes);
    assert_memory_equal(a_n->data, b_n->data, a_n->nbytes);
    assert_memory_equal(a_emb->data, b_emb->data, a_emb->nbytes);
    assert_memory_not_equal(a_q->data, d_q->data, a_q->nbytes);       /* another seed, other values */
    assert_memory_not_equal(a_q->data, a_emb->data, 64 * 4);          /* another name, other values */

    /* Matrices: uniform in [-1/sqrt(64), 1/sqrt(64)], centred, spread out. */
    float *v = malloc(96 * 64 * sizeof *v);
    dtype_to_f32(DT_F32, a_q->data, v, 96 * 64);
    double sum = 0, sq = 0, lo = 1, hi = -1;
    for (int i = 0; i < 96 * 64; i++) {
        assert_true(fabsf(v[i]) <= 0.125f);
        sum += v[i];
        sq += (double)v[i] * v[i];
        lo = fmin(lo, v[i]);
        hi = fmax(hi, v[i]);
    }
    double mean = sum / (96 * 64), var = sq / (96 * 64) - mean * mean;
    assert_true(fabs(mean) < 0.005);
    assert_true(fabs(var - 0.125 * 0.125 / 3) < 0.0005);                /* variance of U(-s, s) is s^2/3 */
    assert_true(lo < -0.12 && hi > 0.12);
    free(v);
    /* Norm weights: 1 +- 0.1. */
    float n[64];
    dtype_to_f32(DT_F32, a_n->data, n, 64);
    int off_one = 0;
    for (int i = 0; i < 64; i++) {
        assert_true(n[i] >= 0.9f && n[i] <= 1.1f);
        off_one += n[i] != 1.0f;
    }
    assert_true(off_one > 60);

    /* The same name again: same view; another shape: a clear error. */
    assert_ptr_equal(ckpt_expect(a, "model.layers.0.self_attn.q_proj.weight", 2, wq, err, sizeof err), a_q);
    assert_null(ckpt_expect(a, "model.layers.0.self_attn.q_proj.weight", 2, (const int64_t[]){64, 96}, err, sizeof err));
    s_contains(err, "dummy", "'model.layers.0.self_attn.q_proj.weight'", "[96, 64]", "[64, 96]", NULL);
    assert_true(ckpt_has(a, "model.layers.0.self_attn.q_proj.weight"));
    assert_int_equal(ckpt_count(a), 3);
    assert_string_equal(ckpt_file_of(a, "model.embed_tokens.weight"), "dummy");
    /* Views stay put while more tensors are made (pointers handed out must not move). */
    char name[64];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "extra.%d.bias", i);
        assert_non_null(ckpt_expect(a, name, 1, (const int64_t[]){3}, err, sizeof err));
    }
    assert_ptr_equal(ckpt_get(a, "model.embed_tokens.weight"), a_emb);
    assert_int_equal(a_emb->shape[0], 512);
    assert_int_equal(ckpt_count(a), 303);

    /* bf16 dummy: half the bytes, same values rounded. */
    ckpt_t *h = ckpt_dummy(DT_BF16, 42);
    const tensor_view_t *h_q = ckpt_expect(h, "model.layers.0.self_attn.q_proj.weight", 2, wq, err, sizeof err);
    assert_int_equal(h_q->dtype, DT_BF16);
    assert_int_equal(h_q->nbytes, 96 * 64 * 2);
    float f32v[8], bf[8];
    dtype_to_f32(DT_F32, a_q->data, f32v, 8);
    dtype_to_f32(DT_BF16, h_q->data, bf, 8);
    for (int i = 0; i < 8; i++)
        assert_true(bf[i] == bf16_to_f32(f32_to_bf16(f32v[i])));
    /* A 0-d and an empty tensor are fine. */
    assert_non_null(ckpt_expect(h, "scalar", 0, NULL, err, sizeof err));
    const tensor_view_t *e = ckpt_expect(h, "empty", 2, (const int64_t[]){0, 7}, err, sizeof err);
    assert_non_null(e);
    assert_int_equal(e->nbytes, 0);
    /* Absurd shapes fail cleanly. */
    assert_null(ckpt_expect(h, "huge", 2, (const int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40}, err, sizeof err));
    s_contains(err, "'huge'", NULL);
    assert_null(ckpt_expect(h, "neg", 1, (const int64_t[]){-1}, err, sizeof err));
    s_contains(err, "'neg'", "negative", NULL);

    assert_null(ckpt_dummy(DT_F8E4M3, 1));
    ckpt_destroy(&a);
    ckpt_destroy(&b);
    ckpt_destroy(&d);
    ckpt_destroy(&h);
}

/* ---- the Hugging Face fixtures: every tensor the architecture needs, with the right shape, and
 * nothing else (catches a transformers release that saves another layout, e.g. fused experts). ---- */

static int s_expect2(ckpt_t *c, const char *name, int64_t d0, int64_t d1, int *used)
{
    char err[600];
    const int64_t sh[2] = {d0, d1};
    if (!ckpt_expect(c, name, 2, sh, err, sizeof err))
        fail_msg("%s", err);
    (*used)++;
    return 0;
}

static int s_expect1(ckpt_t *c, const char *name, int64_t d0, int *used)
{
    char err[600];
    if (!ckpt_expect(c, name, 1, &d0, err, sizeof err))
        fail_msg("%s", err);
    (*used)++;
    return 0;
}

/* DeepSeek-V3's MLA tensors of layer l (engine/mla_load.c), and its MoE layers' extras. */
static void s_expect_mla(ckpt_t *c, const model_config_t *cfg, int l, int *used)
{
    char n[256];
    const int64_t H = cfg->hidden_size, nH = cfg->num_heads, qr = cfg->mla.q_lora_rank, r = cfg->mla.kv_lora_rank,
                  dr = cfg->mla.qk_rope_head_dim, qk = cfg->mla.qk_nope_head_dim + dr, dv = cfg->mla.v_head_dim;
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    if (qr > 0) {
        s_expect2(c, NAME("model.layers.%d.self_attn.q_a_proj.weight", l), qr, H, used);
        s_expect1(c, NAME("model.layers.%d.self_attn.q_a_layernorm.weight", l), qr, used);
        s_expect2(c, NAME("model.layers.%d.self_attn.q_b_proj.weight", l), nH * qk, qr, used);
    } else {
        s_expect2(c, NAME("model.layers.%d.self_attn.q_proj.weight", l), nH * qk, H, used);
    }
    s_expect2(c, NAME("model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l), r + dr, H, used);
    s_expect1(c, NAME("model.layers.%d.self_attn.kv_a_layernorm.weight", l), r, used);
    s_expect2(c, NAME("model.layers.%d.self_attn.kv_b_proj.weight", l), nH * (qk - dr + dv), r, used);
    s_expect2(c, NAME("model.layers.%d.self_attn.o_proj.weight", l), H, nH * dv, used);
    if (config_layer_is_moe(cfg, l)) {
        const int64_t I = (int64_t)cfg->moe_intermediate_size * cfg->mla.n_shared_experts;
        s_expect1(c, NAME("model.layers.%d.mlp.gate.e_score_correction_bias", l), cfg->num_experts, used);
        if (I > 0) {
            s_expect2(c, NAME("model.layers.%d.mlp.shared_experts.gate_proj.weight", l), I, H, used);
            s_expect2(c, NAME("model.layers.%d.mlp.shared_experts.up_proj.weight", l), I, H, used);
            s_expect2(c, NAME("model.layers.%d.mlp.shared_experts.down_proj.weight", l), H, I, used);
        }
    }
#undef NAME
}

static void s_check_fixture(const char *dir)
{
    model_config_t cfg;
    char err[600] = "", n[256];
    if (config_load(dir, &cfg, err, sizeof err) != 0)
        fail_msg("%s", err);
    ckpt_t *c = ckpt_open(dir, err, sizeof err);
    if (!c)
        fail_msg("%s", err);
    int used = 0;
    int64_t H = cfg.hidden_size, V = cfg.vocab_size, q = (int64_t)cfg.num_heads * cfg.head_dim,
            kv = (int64_t)cfg.num_kv_heads * cfg.head_dim;
    s_expect2(c, "model.embed_tokens.weight", V, H, &used);
    s_expect1(c, "model.norm.weight", H, &used);
    if (!cfg.tie_word_embeddings || ckpt_has(c, "lm_head.weight"))
        s_expect2(c, "lm_head.weight", V, H, &used);
    for (int l = 0; l < cfg.num_layers; l++) {
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
        s_expect1(c, NAME("model.layers.%d.input_layernorm.weight", l), H, &used);
        s_expect1(c, NAME("model.layers.%d.post_attention_layernorm.weight", l), H, &used);
        if (cfg.mla.on) {
            s_expect_mla(c, &cfg, l, &used);
        } else {
            s_expect2(c, NAME("model.layers.%d.self_attn.q_proj.weight", l), q, H, &used);
            s_expect2(c, NAME("model.layers.%d.self_attn.k_proj.weight", l), kv, H, &used);
            s_expect2(c, NAME("model.layers.%d.self_attn.v_proj.weight", l), kv, H, &used);
            s_expect2(c, NAME("model.layers.%d.self_attn.o_proj.weight", l), H, q, &used);
        }
        if (cfg.attention_bias) {
            s_expect1(c, NAME("model.layers.%d.self_attn.q_proj.bias", l), q, &used);
            s_expect1(c, NAME("model.layers.%d.self_attn.k_proj.bias", l), kv, &used);
            s_expect1(c, NAME("model.layers.%d.self_attn.v_proj.bias", l), kv, &used);
            if (ckpt_has(c, NAME("model.layers.%d.self_attn.o_proj.bias", l)))
                s_expect1(c, n, H, &used);
        }
        if (cfg.has_qk_norm) {
            s_expect1(c, NAME("model.layers.%d.self_attn.q_norm.weight", l), cfg.head_dim, &used);
            s_expect1(c, NAME("model.layers.%d.self_attn.k_norm.weight", l), cfg.head_dim, &used);
        }
        /* An fp8 KV cache's scales (engine/kvscale.h), when the export stores them (llama-gqa-kvscales). */
        used += ckpt_has(c, NAME("model.layers.%d.self_attn.k_scale", l));
        used += ckpt_has(c, NAME("model.layers.%d.self_attn.v_scale", l));
        int64_t E = cfg.num_experts;
        if (cfg.arch == ARCH_MIXTRAL) {
            int64_t I = cfg.moe_intermediate_size;
            s_expect2(c, NAME("model.layers.%d.block_sparse_moe.gate.weight", l), E, H, &used);
            for (int e = 0; e < E; e++) {
                s_expect2(c, NAME("model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e), I, H, &used);
                s_expect2(c, NAME("model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e), I, H, &used);
                s_expect2(c, NAME("model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e), H, I, &used);
            }
        } else if (config_layer_is_moe(&cfg, l)) {
            int64_t I = cfg.moe_intermediate_size;
            s_expect2(c, NAME("model.layers.%d.mlp.gate.weight", l), E, H, &used);
            for (int e = 0; e < E; e++) {
                s_expect2(c, NAME("model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e), I, H, &used);
                s_expect2(c, NAME("model.layers.%d.mlp.experts.%d.up_proj.weight", l, e), I, H, &used);
                s_expect2(c, NAME("model.layers.%d.mlp.experts.%d.down_proj.weight", l, e), H, I, &used);
            }
        } else {
            int64_t I = cfg.intermediate_size;
            s_expect2(c, NAME("model.layers.%d.mlp.gate_proj.weight", l), I, H, &used);
            s_expect2(c, NAME("model.layers.%d.mlp.up_proj.weight", l), I, H, &used);
            s_expect2(c, NAME("model.layers.%d.mlp.down_proj.weight", l), H, I, &used);
        }
#undef NAME
    }
    if (used != ckpt_count(c)) {
        for (int i = 0; i < ckpt_count(c); i++)
            print_message("  %s: %s\n", dir, ckpt_at(c, i)->name);
        fail_msg("%s: the checkpoint has %d tensors, the architecture uses %d", dir, ckpt_count(c), used);
    }
    /* Weight dtype matches the config's. */
    assert_int_equal(ckpt_at(c, 0)->dtype, cfg.dtype);
    ckpt_destroy(&c);
}

/* ckpt_drop: a dummy tensor's bytes go and come back identical on the next expect; the other
 * tensors are untouched; dropping a tensor of a mapped file changes nothing. */
static void test_drop(void **state)
{
    char err[256];
    ckpt_t *c = ckpt_dummy(DT_BF16, 9);
    int64_t shape[2] = {33, 70}, other_shape[1] = {16};
    const tensor_view_t *t = ckpt_expect(c, "model.layers.0.mlp.down_proj.weight", 2, shape, err, sizeof err);
    const tensor_view_t *o = ckpt_expect(c, "model.norm.weight", 1, other_shape, err, sizeof err);
    assert_non_null(t);
    assert_non_null(o);
    uint8_t *keep = malloc(t->nbytes), *keep_o = malloc(o->nbytes);
    memcpy(keep, t->data, t->nbytes);
    memcpy(keep_o, o->data, o->nbytes);
    ckpt_drop(c, t);
    assert_null(t->data);
    assert_memory_equal(o->data, keep_o, o->nbytes);
    const tensor_view_t *t2 = ckpt_expect(c, "model.layers.0.mlp.down_proj.weight", 2, shape, err, sizeof err);
    assert_ptr_equal(t2, t);
    assert_non_null(t2->data);
    assert_memory_equal(t2->data, keep, t->nbytes);
    ckpt_drop(c, NULL);   /* harmless */
    free(keep), free(keep_o);
    ckpt_destroy(&c);
}

/* ckpt_expect_recipe: the recipe reproduces ckpt_expect's bytes through kernels/dummy_fill.h (what a
 * backend's fill_dummy computes); the entry gets no host data until an expect asks for it; a shape
 * that disagrees is refused as by ckpt_expect; a checkpoint of files is plain ckpt_expect. */
static void test_recipe(void **state)
{
    char err[256];
    const dtype_t dts[3] = {DT_BF16, DT_F16, DT_F32};
    for (int d = 0; d < 3; d++) {
        ckpt_t *a = ckpt_dummy(dts[d], 5), *b = ckpt_dummy(dts[d], 5);
        int64_t shape[2] = {37, 129}, norm[1] = {77};
        const char *names[2] = {"model.layers.2.self_attn.o_proj.weight", "model.layers.2.input_layernorm.weight"};
        for (int k = 0; k < 2; k++) {
            const int64_t *sh = k ? norm : shape;
            const tensor_view_t *h = ckpt_expect(a, names[k], k ? 1 : 2, sh, err, sizeof err);
            ckpt_dummy_recipe_t r = {0};
            const tensor_view_t *v = ckpt_expect_recipe(b, names[k], k ? 1 : 2, sh, &r, err, sizeof err);
            assert_non_null(h);
            assert_non_null(v);
            assert_null(v->data);
            assert_int_equal(v->nbytes, h->nbytes);
            assert_true(ckpt_has(b, names[k]));
            const size_t es = dtype_size(r.dtype), n = h->nbytes / es;
            uint8_t *mine = malloc(h->nbytes);
            for (size_t i = 0; i < n; i++) {
                float f = dummy_value(r.key, i, r.center, r.scale);
                dtype_from_f32(r.dtype, &f, mine + i * es, 1);
            }
            assert_memory_equal(mine, h->data, h->nbytes);
            free(mine);
            /* Asked for again with the wrong shape: refused, naming both. */
            int64_t wrong[2] = {38, 129};
            if (!k)
                assert_null(ckpt_expect_recipe(b, names[k], 2, wrong, &r, err, sizeof err));
            /* A plain expect now makes the bytes, the same. */
            const tensor_view_t *v2 = ckpt_expect(b, names[k], k ? 1 : 2, sh, err, sizeof err);
            assert_non_null(v2->data);
            assert_memory_equal(v2->data, h->data, h->nbytes);
        }
        ckpt_destroy(&a);
        ckpt_destroy(&b);
    }
}

static void test_hf_fixtures(void **state)
{
    const char *root = "tests/fixtures/models";
    DIR *d = opendir(root);
    int checked = 0;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            char dir[512], p1[600], p2[600];
            if (de->d_name[0] == '.')
                continue;
            snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
            snprintf(p1, sizeof p1, "%s/model.safetensors", dir);
            snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", dir);
            if (access(p1, R_OK) != 0 && access(p2, R_OK) != 0)
                continue;                          /* config-only (dummy-shape) directories */
            print_message("checking %s\n", dir);
            s_check_fixture(dir);
            checked++;
        }
        closedir(d);
    }
    if (!checked)
        skip();                                    /* fixtures not generated yet */
}

/* The shape-only configs drive the dummy format: a whole Qwen3-0.6B layer is made and checked. */
static void test_dummy_from_shape_config(void **state)
{
    model_config_t cfg;
    char err[600] = "";
    if (config_load("tests/fixtures/models/qwen3-0.6b-shape", &cfg, err, sizeof err) != 0)
        fail_msg("%s", err);
    ckpt_t *c = ckpt_dummy(cfg.dtype, 7);
    const int64_t q[2] = {(int64_t)cfg.num_heads * cfg.head_dim, cfg.hidden_size};
    const tensor_view_t *v = ckpt_expect(c, "model.layers.0.self_attn.q_proj.weight", 2, q, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(v->shape[0], 2048);
    assert_int_equal(v->shape[1], 1024);
    assert_int_equal(v->dtype, DT_BF16);
    assert_int_equal(v->nbytes, 2048 * 1024 * 2);
    assert_false(ckpt_has(c, "lm_head.weight"));
    ckpt_destroy(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_file),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_lying_index),
        cmocka_unit_test(test_dummy),
        cmocka_unit_test(test_dummy_from_shape_config),
        cmocka_unit_test(test_drop),
        cmocka_unit_test(test_recipe),
        cmocka_unit_test(test_hf_fixtures),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
