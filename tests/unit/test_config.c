/* tests/unit/test_config.c — config.json in both transformers spellings gives identical structs;
 * absent keys take transformers' class defaults; bad values are errors naming the file and key. */
#include <setjmp.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/config.h"

static char s_dir[256];

static int s_setup(void **state)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/troupe-cfg-XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes <s_dir>/<sub>/<file> and returns the directory. */
static const char *s_put(const char *sub, const char *file, const char *text)
{
    static char dir[400];
    char path[600];
    snprintf(dir, sizeof dir, "%s/%s", s_dir, sub);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
    return dir;
}

static void s_load_ok(const char *dir, model_config_t *cfg)
{
    char err[512] = "";
    if (config_load(dir, cfg, err, sizeof err) != 0)
        fail_msg("%s: %s", dir, err);
}

static model_config_t s_parse_ok(const char *json)
{
    model_config_t cfg;
    char err[512] = "";
    if (config_parse(json, strlen(json), "t.json", &cfg, err, sizeof err) != 0)
        fail_msg("%s", err);
    return cfg;
}

/* config_parse must fail, naming the file and containing every fragment. */
static void s_parse_fail(const char *json, ...)
{
    model_config_t cfg;
    char err[512] = "";
    if (config_parse(json, strlen(json), "bad/config.json", &cfg, err, sizeof err) == 0)
        fail_msg("accepted: %s", json);
    assert_non_null(strstr(err, "bad/config.json"));
    va_list ap;
    va_start(ap, json);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        if (!strstr(err, frag))
            fail_msg("error \"%s\" lacks \"%s\"", err, frag);
    va_end(ap);
}

/* Llama 3.1 as transformers 4 writes it, and as transformers 5 does. */
static const char *LLAMA_V4 =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"attention_bias\":false,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\",\"hidden_size\":4096,"
    "\"intermediate_size\":14336,\"max_position_embeddings\":131072,\"mlp_bias\":false,\"num_attention_heads\":32,"
    "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,"
    "\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
    "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"vocab_size\":128256}";
static const char *LLAMA_V5 =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"attention_bias\":false,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\",\"hidden_size\":4096,"
    "\"head_dim\":128,\"intermediate_size\":14336,\"max_position_embeddings\":131072,\"mlp_bias\":false,"
    "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,"
    "\"rope_parameters\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
    "\"original_max_position_embeddings\":8192,\"rope_theta\":500000.0,\"rope_type\":\"llama3\"},"
    "\"tie_word_embeddings\":false,\"dtype\":\"bfloat16\",\"vocab_size\":128256}";

static void test_llama_both_spellings(void **state)
{
    model_config_t a, b;
    s_load_ok(s_put("llama4", "config.json", LLAMA_V4), &a);
    s_load_ok(s_put("llama5", "config.json", LLAMA_V5), &b);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(a.arch, ARCH_LLAMA);
    assert_int_equal(a.vocab_size, 128256);
    assert_int_equal(a.hidden_size, 4096);
    assert_int_equal(a.num_heads, 32);
    assert_int_equal(a.num_kv_heads, 8);
    assert_int_equal(a.head_dim, 128);
    assert_int_equal(a.rope_kind, ROPE_LLAMA3);
    assert_true(a.rope_theta == 500000.0 && a.rope_factor == 8.0);
    assert_true(a.rope_low_freq_factor == 1.0 && a.rope_high_freq_factor == 4.0);
    assert_int_equal(a.rope_original_max_pos, 8192);
    assert_true(a.rms_norm_eps == 1e-5);
    assert_int_equal(a.dtype, DT_BF16);
    assert_int_equal(a.bos_token_id, 128000);
    assert_int_equal(a.n_eos, 3);
    assert_int_equal(a.eos_token_ids[2], 128009);
    assert_int_equal(a.num_experts, 0);
    assert_int_equal(a.has_qk_norm, 0);
    assert_int_equal(a.tie_word_embeddings, 0);
    /* No generation_config.json: transformers' GenerationConfig defaults. */
    assert_int_equal(a.gen.do_sample, 0);
    assert_true(a.gen.temperature == 1.0 && a.gen.top_p == 1.0 && a.gen.min_p == 0.0);
    assert_int_equal(a.gen.top_k, 50);
    assert_int_equal(a.gen.max_new_tokens, 0);
}

static const char *QMOE_V4 =
    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"bos_token_id\":151643,"
    "\"decoder_sparse_step\":1,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_size\":2048,\"intermediate_size\":6144,"
    "\"max_position_embeddings\":40960,\"mlp_only_layers\":[0,47],\"moe_intermediate_size\":768,\"norm_topk_prob\":true,"
    "\"num_attention_heads\":32,\"num_experts\":128,\"num_experts_per_tok\":8,\"num_hidden_layers\":48,"
    "\"num_key_value_heads\":4,\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000.0,"
    "\"sliding_window\":null,\"use_sliding_window\":false,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
    "\"vocab_size\":151936}";
static const char *QMOE_V5 =
    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"bos_token_id\":151643,"
    "\"decoder_sparse_step\":1,\"eos_token_id\":[151645],\"head_dim\":128,\"hidden_size\":2048,\"intermediate_size\":6144,"
    "\"max_position_embeddings\":40960,\"mlp_only_layers\":[0,47],\"moe_intermediate_size\":768,\"norm_topk_prob\":true,"
    "\"num_attention_heads\":32,\"num_local_experts\":128,\"num_experts_per_tok\":8,\"num_hidden_layers\":48,"
    "\"num_key_value_heads\":4,\"rms_norm_eps\":1e-06,\"rope_parameters\":{\"rope_theta\":1000000.0,"
    "\"rope_type\":\"default\"},\"use_sliding_window\":false,\"tie_word_embeddings\":false,\"dtype\":\"bfloat16\","
    "\"vocab_size\":151936}";

static void test_qwen3_moe_both_spellings(void **state)
{
    model_config_t a = s_parse_ok(QMOE_V4), b = s_parse_ok(QMOE_V5);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(a.arch, ARCH_QWEN3_MOE);
    assert_int_equal(a.head_dim, 128);              /* explicit, != 2048 / 32 */
    assert_int_equal(a.num_experts, 128);
    assert_int_equal(a.num_experts_per_tok, 8);
    assert_int_equal(a.moe_intermediate_size, 768);
    assert_int_equal(a.norm_topk_prob, 1);
    assert_int_equal(a.has_qk_norm, 1);
    assert_true(a.rope_theta == 1e6);
    assert_int_equal(a.rope_kind, ROPE_DEFAULT);
    assert_int_equal(a.n_mlp_only_layers, 2);
    assert_int_equal(config_layer_is_moe(&a, 0), 0);
    assert_int_equal(config_layer_is_moe(&a, 1), 1);
    assert_int_equal(config_layer_is_moe(&a, 46), 1);
    assert_int_equal(config_layer_is_moe(&a, 47), 0);
    assert_int_equal(config_layer_is_moe(&a, 48), 0);
    assert_int_equal(a.n_eos, 1);
    assert_int_equal(a.eos_token_ids[0], 151645);
}

static void test_rope_variants(void **state)
{
    /* "type" (older) spelling of rope_type, linear scaling. */
    model_config_t a = s_parse_ok("{\"model_type\":\"llama\",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2},"
                                  "\"rope_theta\":20000}");
    model_config_t b = s_parse_ok("{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_type\":\"linear\","
                                  "\"factor\":2.0,\"rope_theta\":20000.0}}");
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(a.rope_kind, ROPE_LINEAR);
    assert_true(a.rope_factor == 2.0 && a.rope_theta == 20000.0);
    /* rope_scaling wins over rope_parameters when both are present (as transformers 5 does). */
    model_config_t c = s_parse_ok("{\"model_type\":\"llama\",\"rope_scaling\":{\"type\":\"linear\",\"factor\":3},"
                                  "\"rope_parameters\":{\"rope_type\":\"default\"}}");
    assert_int_equal(c.rope_kind, ROPE_LINEAR);
    assert_true(c.rope_factor == 3.0 && c.rope_theta == 10000.0);
    /* rope_parameters without rope_theta falls back to the top-level one, then to the default. */
    model_config_t d = s_parse_ok("{\"model_type\":\"mixtral\",\"rope_parameters\":{\"rope_type\":\"default\"}}");
    assert_true(d.rope_theta == 1e6);
}

static void test_defaults_per_arch(void **state)
{
    /* Llama: head_dim = hidden / heads, kv = heads, bos 1 / eos 2, untied, f32 when no dtype. */
    model_config_t l = s_parse_ok("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,"
                                  "\"num_attention_heads\":4}");
    assert_int_equal(l.head_dim, 16);
    assert_int_equal(l.num_kv_heads, 4);
    assert_int_equal(l.vocab_size, 32000);
    assert_int_equal(l.num_layers, 32);
    assert_int_equal(l.intermediate_size, 11008);
    assert_int_equal(l.max_position_embeddings, 2048);
    assert_true(l.rms_norm_eps == 1e-6 && l.rope_theta == 10000.0);
    assert_int_equal(l.bos_token_id, 1);
    assert_int_equal(l.n_eos, 1);
    assert_int_equal(l.eos_token_ids[0], 2);
    assert_int_equal(l.tie_word_embeddings, 0);
    assert_int_equal(l.dtype, DT_F32);
    assert_int_equal(l.rope_kind, ROPE_DEFAULT);
    assert_true(l.rope_factor == 1.0);
    /* Qwen3: head_dim 128 and kv 32 by class default; no bos/eos; q/k norm. */
    model_config_t q = s_parse_ok("{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,"
                                  "\"num_attention_heads\":4,\"num_key_value_heads\":2}");
    assert_int_equal(q.head_dim, 128);
    assert_int_equal(q.num_kv_heads, 2);
    assert_int_equal(q.bos_token_id, -1);
    assert_int_equal(q.n_eos, 0);
    assert_int_equal(q.has_qk_norm, 1);
    assert_int_equal(q.vocab_size, 151936);
    assert_int_equal(q.num_experts, 0);
    /* Qwen3 with head_dim null: hidden / heads. */
    model_config_t qn = s_parse_ok("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_attention_heads\":4,"
                                   "\"num_key_value_heads\":null,\"head_dim\":null}");
    assert_int_equal(qn.head_dim, 16);
    assert_int_equal(qn.num_kv_heads, 4);
    /* Qwen3-MoE class defaults. */
    model_config_t m = s_parse_ok("{\"model_type\":\"qwen3_moe\"}");
    assert_int_equal(m.num_experts, 128);
    assert_int_equal(m.num_experts_per_tok, 8);
    assert_int_equal(m.moe_intermediate_size, 768);
    assert_int_equal(m.norm_topk_prob, 0);
    assert_int_equal(m.num_kv_heads, 4);
    assert_int_equal(m.head_dim, 64);
    assert_int_equal(m.decoder_sparse_step, 1);
    assert_int_equal(m.n_mlp_only_layers, 0);
    /* Mixtral: experts use intermediate_size, routing renormalised, theta 1e6, eps 1e-5. */
    model_config_t x = s_parse_ok("{\"architectures\":[\"MixtralForCausalLM\"],\"intermediate_size\":128,"
                                  "\"num_local_experts\":4}");
    assert_int_equal(x.num_experts, 4);
    assert_int_equal(x.num_experts_per_tok, 2);
    assert_int_equal(x.moe_intermediate_size, 128);
    assert_int_equal(x.norm_topk_prob, 1);
    assert_int_equal(x.num_kv_heads, 8);
    assert_true(x.rope_theta == 1e6 && x.rms_norm_eps == 1e-5);
    assert_int_equal(x.max_position_embeddings, 131072);
    for (int i = 0; i < x.num_layers; i++)
        assert_int_equal(config_layer_is_moe(&x, i), 1);
    assert_int_equal(config_layer_is_moe(&l, 0), 0);
    /* Explicit nulls: no bos, no eos (not the class defaults 1 and 2). */
    model_config_t nb = s_parse_ok("{\"model_type\":\"llama\",\"bos_token_id\":null,\"eos_token_id\":null}");
    assert_int_equal(nb.bos_token_id, -1);
    assert_int_equal(nb.n_eos, 0);
    /* Explicit head_dim that is not hidden / heads, and hidden not a multiple of heads. */
    model_config_t h = s_parse_ok("{\"model_type\":\"llama\",\"hidden_size\":100,\"num_attention_heads\":8,"
                                  "\"head_dim\":32}");
    assert_int_equal(h.head_dim, 32);
    /* decoder_sparse_step 2: odd-numbered layers (1, 3, ...) are sparse. */
    model_config_t s = s_parse_ok("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":4,\"decoder_sparse_step\":2}");
    assert_int_equal(config_layer_is_moe(&s, 0), 0);
    assert_int_equal(config_layer_is_moe(&s, 1), 1);
    assert_int_equal(config_layer_is_moe(&s, 2), 0);
    assert_int_equal(config_layer_is_moe(&s, 3), 1);
    /* num_experts 0: a Qwen3-MoE config that is dense everywhere. */
    model_config_t z = s_parse_ok("{\"model_type\":\"qwen3_moe\",\"num_experts\":0}");
    assert_int_equal(z.num_experts_per_tok, 0);
    assert_int_equal(config_layer_is_moe(&z, 0), 0);
    assert_string_equal(config_arch_name(ARCH_QWEN3_MOE), "qwen3_moe");
}

/* DeepSeek-V3: the MLA and DeepSeekMoE fields, the KV shape (one vector of kv_lora + rope per
 * token and layer), DeepseekV3Config's defaults, YaRN's softmax correction, and refusals naming
 * the field. */
static void test_deepseek_v3(void **state)
{
    model_config_t a = s_parse_ok(
        "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"hidden_size\":256,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":4,\"num_hidden_layers\":4,\"q_lora_rank\":128,\"kv_lora_rank\":64,"
        "\"qk_nope_head_dim\":32,\"qk_rope_head_dim\":16,\"v_head_dim\":32,\"first_k_dense_replace\":1,"
        "\"n_routed_experts\":16,\"n_shared_experts\":1,\"num_experts_per_tok\":4,\"n_group\":4,"
        "\"topk_group\":2,\"routed_scaling_factor\":2.5,\"num_nextn_predict_layers\":1,\"head_dim\":16}");
    assert_int_equal(a.arch, ARCH_DEEPSEEK_V3);
    assert_int_equal(a.mla.on, 1);
    assert_int_equal(a.num_kv_heads, 1);
    assert_int_equal(a.head_dim, 40);                       /* (64 + 16) / 2: the KV shape */
    assert_int_equal(config_kv_bytes_per_token(&a, 2), 4 * 80 * 2);
    assert_int_equal(a.mla.q_lora_rank, 128);
    assert_int_equal(a.num_experts, 16);
    assert_int_equal(a.mla.n_group, 4);
    assert_int_equal(a.mla.rope_interleave, 1);             /* the default */
    assert_int_equal(a.norm_topk_prob, 1);
    assert_true(fabs(a.mla.softmax_scale - 1.0 / sqrt(48.0)) < 1e-12);
    assert_int_equal(config_layer_is_moe(&a, 0), 0);
    assert_int_equal(config_layer_is_moe(&a, 1), 1);
    assert_int_equal(config_layer_is_moe(&a, 3), 1);
    /* Defaults of DeepseekV3Config; q_lora_rank null = q_proj. */
    model_config_t d = s_parse_ok("{\"model_type\":\"deepseek_v3\",\"q_lora_rank\":null}");
    assert_int_equal(d.mla.q_lora_rank, 0);
    assert_int_equal(d.mla.kv_lora_rank, 512);
    assert_int_equal(d.head_dim, 288);
    assert_int_equal(d.num_experts, 256);
    assert_int_equal(d.num_experts_per_tok, 8);
    assert_int_equal(d.mla.first_k_dense_replace, 3);
    assert_int_equal(d.mla.topk_group, 4);
    /* YaRN as DeepSeek-V3 ships it: softmax scale times mscale(40, 1)^2. */
    model_config_t y = s_parse_ok(
        "{\"model_type\":\"deepseek_v3\",\"max_position_embeddings\":163840,\"rope_scaling\":{\"type\":\"yarn\","
        "\"factor\":40,\"original_max_position_embeddings\":4096,\"beta_fast\":32,\"beta_slow\":1,\"mscale\":1.0,"
        "\"mscale_all_dim\":1.0}}");
    assert_int_equal(y.rope_kind, ROPE_YARN);
    const double ms = 0.1 * log(40.0) + 1.0;
    assert_true(fabs(y.mla.softmax_scale - ms * ms / sqrt(192.0)) < 1e-12);
    assert_int_equal(y.rope_original_max_pos, 4096);
    s_parse_fail("{\"model_type\":\"deepseek_v3\",\"scoring_func\":\"softmax\"}", "scoring_func", NULL);
    s_parse_fail("{\"model_type\":\"deepseek_v3\",\"topk_method\":\"greedy\"}", "topk_method", NULL);
    s_parse_fail("{\"model_type\":\"deepseek_v3\",\"moe_layer_freq\":2}", "moe_layer_freq", NULL);
    s_parse_fail("{\"model_type\":\"deepseek_v3\",\"n_group\":3}", "n_group", NULL);
    s_parse_fail("{\"model_type\":\"deepseek_v3\",\"topk_group\":9}", "topk_group", NULL);
    s_parse_fail("{\"model_type\":\"deepseek_v3\",\"qk_rope_head_dim\":63}", "qk_rope_head_dim", NULL);
    s_parse_fail("{\"model_type\":\"deepseek_v3\",\"attention_bias\":true}", "attention_bias", NULL);
    s_parse_fail("{\"model_type\":\"deepseek_v3\",\"rope_scaling\":{\"type\":\"yarn\"}}", "rope_scaling.factor", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":2}}", "yarn", NULL);
    /* The DeepSeek-V2-Lite-sized shape (dummy weights): ~15.7B parameters, 2.7B read per token. */
    model_config_t v;
    s_load_ok("tests/fixtures/models/deepseek-v2-lite-shape", &v);
    assert_int_equal(v.mla.q_lora_rank, 0);
    assert_int_equal(v.head_dim, 288);
    const double all = config_weight_bytes(&v, 1, v.num_experts) + (double)v.vocab_size * v.hidden_size;
    const double active = config_weight_bytes(&v, 1, v.num_experts_per_tok) + (double)v.vocab_size * v.hidden_size;
    print_message("deepseek-v2-lite-shape: %.2fB parameters, %.2fB per token; KV %zu bytes per token in bf16\n",
                  all / 1e9, active / 1e9, config_kv_bytes_per_token(&v, 2));
    assert_true(all > 15.0e9 && all < 16.5e9);
    assert_int_equal(config_kv_bytes_per_token(&v, 2), 27 * 576 * 2);
}

static void test_generation_config(void **state)
{
    const char *dir = s_put("gen", "config.json", "{\"model_type\":\"qwen3\",\"eos_token_id\":151645}");
    s_put("gen", "generation_config.json",
          "{\"bos_token_id\":151643,\"do_sample\":true,\"eos_token_id\":[151645,151643],\"pad_token_id\":151643,"
          "\"temperature\":0.6,\"top_k\":20,\"top_p\":0.95,\"min_p\":0.05,\"repetition_penalty\":1.1,"
          "\"max_new_tokens\":256,\"transformers_version\":\"4.51.0\"}");
    model_config_t c;
    s_load_ok(dir, &c);
    assert_int_equal(c.gen.do_sample, 1);
    assert_true(c.gen.temperature == 0.6 && c.gen.top_p == 0.95 && c.gen.min_p == 0.05);
    assert_true(c.gen.repetition_penalty == 1.1);
    assert_int_equal(c.gen.top_k, 20);
    assert_int_equal(c.gen.max_new_tokens, 256);
    assert_int_equal(c.n_eos, 2);                   /* generation_config's eos list replaces config.json's */
    assert_int_equal(c.eos_token_ids[1], 151643);
    assert_int_equal(c.bos_token_id, 151643);

    /* A bad generation_config.json is an error naming it, and leaves the config untouched. */
    model_config_t before = c;
    char err[512] = "";
    const char *bad = "{\"top_p\":1.5,\"temperature\":0.1}";
    assert_int_equal(config_parse_generation(bad, strlen(bad), "g.json", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "g.json: \"top_p\""));
    assert_memory_equal(&c, &before, sizeof c);
    bad = "{\"eos_token_id\":[1,999999999]}";
    assert_int_equal(config_parse_generation(bad, strlen(bad), "g.json", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "eos_token_id"));
    bad = "{\"temperature\":-1}";
    assert_int_equal(config_parse_generation(bad, strlen(bad), "g.json", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "temperature"));
    bad = "{\"do_sample\":\"yes\"}";
    assert_int_equal(config_parse_generation(bad, strlen(bad), "g.json", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "do_sample"));

    dir = s_put("genbad", "config.json", "{\"model_type\":\"qwen3\"}");
    s_put("genbad", "generation_config.json", "{not json");
    assert_int_equal(config_load(dir, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "genbad/generation_config.json: not valid JSON"));
}

static void test_errors(void **state)
{
    s_parse_fail("{\"architectures\":[\"MistralForCausalLM\"]}", "\"architectures\"", "'MistralForCausalLM'",
                 "not supported", NULL);
    s_parse_fail("{\"model_type\":\"gpt2\"}", "\"model_type\"", "'gpt2'", NULL);
    s_parse_fail("{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"qwen3\"}", "contradicts", NULL);
    s_parse_fail("{}", "neither", NULL);
    s_parse_fail("{\"architectures\":[]}", "\"architectures\"", NULL);
    s_parse_fail("not json", "not valid JSON", NULL);
    s_parse_fail("[1]", "not a JSON object", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"model_type\":\"llama\"}", "duplicate", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"num_attention_heads\":8,\"num_key_value_heads\":3}",
                 "\"num_key_value_heads\" (3) must divide \"num_attention_heads\" (8)", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"hidden_size\":100,\"num_attention_heads\":8}", "\"hidden_size\"",
                 "no \"head_dim\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"hidden_size\":0}", "\"hidden_size\" is 0", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"vocab_size\":-5}", "\"vocab_size\" is -5", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"num_hidden_layers\":\"32\"}", "\"num_hidden_layers\" must be an integer",
                 NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"num_hidden_layers\":99999999999}", "\"num_hidden_layers\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"head_dim\":33}", "\"head_dim\" (33) must be even", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rms_norm_eps\":0}", "\"rms_norm_eps\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_theta\":-1}", "\"rope_theta\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"hidden_act\":\"gelu\"}", "\"hidden_act\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"mlp_bias\":true}", "\"mlp_bias\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"tie_word_embeddings\":\"no\"}", "\"tie_word_embeddings\"", NULL);
    s_parse_fail("{\"model_type\":\"qwen3\",\"use_sliding_window\":true}", "\"use_sliding_window\"", NULL);
    s_parse_fail("{\"model_type\":\"qwen3\",\"layer_types\":[\"full_attention\",\"sliding_attention\"]}",
                 "\"layer_types\"[1]", NULL);
    s_parse_fail("{\"model_type\":\"mixtral\",\"sliding_window\":4096}", "\"sliding_window\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
                 "\"rope_scaling.rope_type\" 'yarn' is not supported", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,"
                 "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192}}",
                 "\"rope_scaling.low_freq_factor\" is required", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8,"
                 "\"low_freq_factor\":4,\"high_freq_factor\":1,\"original_max_position_embeddings\":8192}}",
                 "\"rope_parameters.high_freq_factor\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_type\":\"linear\"}}",
                 "\"rope_parameters.factor\" is required", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":0.5}}",
                 "\"rope_parameters.factor\" must be >= 1", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":\"x\"}}",
                 "\"rope_parameters.rope_theta\" must be a number", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"}}}",
                 "per-layer-type", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_type\":\"default\","
                 "\"partial_rotary_factor\":0.5}}", "partial_rotary_factor", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"rope_scaling\":[1]}", "\"rope_scaling\" must be an object", NULL);
    s_parse_fail("{\"model_type\":\"qwen3_moe\",\"num_experts\":4,\"num_experts_per_tok\":5}",
                 "\"num_experts_per_tok\" (5) exceeds the number of experts (4)", NULL);
    s_parse_fail("{\"model_type\":\"qwen3_moe\",\"num_experts\":4,\"num_local_experts\":8}", "disagree", NULL);
    s_parse_fail("{\"model_type\":\"mixtral\",\"num_local_experts\":0}", "\"num_local_experts\"", NULL);
    s_parse_fail("{\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":0}", "\"moe_intermediate_size\"", NULL);
    s_parse_fail("{\"model_type\":\"qwen3_moe\",\"decoder_sparse_step\":0}", "\"decoder_sparse_step\"", NULL);
    s_parse_fail("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":4,\"mlp_only_layers\":[4]}",
                 "\"mlp_only_layers\"[0]", NULL);
    s_parse_fail("{\"model_type\":\"qwen3_moe\",\"mlp_only_layers\":3}", "\"mlp_only_layers\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"vocab_size\":100,\"eos_token_id\":100}", "\"eos_token_id\" token 100",
                 NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", "9 tokens", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"eos_token_id\":\"2\"}", "\"eos_token_id\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"vocab_size\":100,\"bos_token_id\":100}", "\"bos_token_id\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"torch_dtype\":\"float64\"}", "\"torch_dtype\"", NULL);
    s_parse_fail("{\"model_type\":\"llama\",\"dtype\":5}", "\"dtype\"", NULL);

    char err[512] = "";
    model_config_t c;
    char missing[400];
    snprintf(missing, sizeof missing, "%s/nowhere", s_dir);
    assert_int_equal(config_load(missing, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "nowhere/config.json: cannot open"));

    /* A config.json that opens but cannot be read (here a directory) says why. */
    char dir[300], cfg_dir[340];
    snprintf(dir, sizeof dir, "%s/dir-config", s_dir);
    snprintf(cfg_dir, sizeof cfg_dir, "%s/config.json", dir);
    assert_int_equal(mkdir(dir, 0700) == 0 || errno == EEXIST, 1);
    assert_int_equal(mkdir(cfg_dir, 0700) == 0 || errno == EEXIST, 1);
    assert_int_equal(config_load(dir, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "dir-config/config.json: read failed: Is a directory"));
    rmdir(cfg_dir);
    rmdir(dir);
}

/* The config-only fixture directories (shapes for the dummy load format) parse to the published values. */
static void test_shape_fixtures(void **state)
{
    model_config_t q, l, m;
    s_load_ok("tests/fixtures/models/qwen3-0.6b-shape", &q);
    assert_int_equal(q.arch, ARCH_QWEN3);
    assert_int_equal(q.hidden_size, 1024);
    assert_int_equal(q.num_layers, 28);
    assert_int_equal(q.num_heads, 16);
    assert_int_equal(q.num_kv_heads, 8);
    assert_int_equal(q.head_dim, 128);
    assert_int_equal(q.intermediate_size, 3072);
    assert_int_equal(q.vocab_size, 151936);
    assert_int_equal(q.tie_word_embeddings, 1);
    assert_true(q.rope_theta == 1e6 && q.rms_norm_eps == 1e-6);
    assert_int_equal(q.dtype, DT_BF16);

    s_load_ok("tests/fixtures/models/llama-3.1-8b-shape", &l);
    assert_int_equal(l.arch, ARCH_LLAMA);
    assert_int_equal(l.hidden_size, 4096);
    assert_int_equal(l.num_kv_heads, 8);
    assert_int_equal(l.head_dim, 128);
    assert_int_equal(l.vocab_size, 128256);
    assert_int_equal(l.rope_kind, ROPE_LLAMA3);
    assert_int_equal(l.rope_original_max_pos, 8192);
    assert_int_equal(l.n_eos, 3);

    s_load_ok("tests/fixtures/models/qwen3-30b-a3b-shape", &m);
    assert_int_equal(m.arch, ARCH_QWEN3_MOE);
    assert_int_equal(m.num_layers, 48);
    assert_int_equal(m.num_experts, 128);
    assert_int_equal(m.num_experts_per_tok, 8);
    assert_int_equal(m.moe_intermediate_size, 768);
    assert_int_equal(m.head_dim, 128);
    assert_int_equal(m.norm_topk_prob, 1);
    for (int i = 0; i < m.num_layers; i++)
        assert_int_equal(config_layer_is_moe(&m, i), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_both_spellings),
        cmocka_unit_test(test_qwen3_moe_both_spellings),
        cmocka_unit_test(test_rope_variants),
        cmocka_unit_test(test_defaults_per_arch),
        cmocka_unit_test(test_deepseek_v3),
        cmocka_unit_test(test_generation_config),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_shape_fixtures),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
