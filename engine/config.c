/* engine/config.c — model_config_t from config.json (+ generation_config.json), both spellings.
 *
 * A key that is absent takes the default of the transformers config class for that architecture,
 * exactly as transformers would when it loads the same file, so a hand-written config means the
 * same thing to us as to the oracle. A key that is present but wrong (type, range, an option we do
 * not implement) is an error naming the file and the key: running a model with silently different
 * semantics is worse than refusing it.
 *
 * Sanity ceilings (CFG_MAX_*) bound every dimension so that the products the engine computes from
 * them (hidden x vocab, heads x head_dim, ...) can never overflow, whatever the file says. */
#include "engine/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define CFG_MAX_FILE (16u << 20)  /* config files are a few KB; refuse anything absurd */
#define CFG_MAX_VOCAB (1 << 22)
#define CFG_MAX_HIDDEN (1 << 17)
#define CFG_MAX_INTERMEDIATE (1 << 20)
#define CFG_MAX_LAYERS 1024
#define CFG_MAX_HEADS 1024
#define CFG_MAX_HEAD_DIM 1024
#define CFG_MAX_EXPERTS 4096
#define CFG_MAX_POS (1 << 30)

/* transformers' class defaults per architecture (configuration_<model>.py). */
typedef struct {
    const char *arch_class, *model_type;
    int vocab, hidden, intermediate, layers, heads;
    int kv_heads;                 /* 0: same as heads */
    int head_dim;                 /* 0: hidden / heads */
    int max_pos;
    double rms_eps, rope_theta;
    int bos, eos;                 /* -1: none */
    int experts, experts_per_tok, moe_intermediate, norm_topk;  /* moe_intermediate 0: intermediate */
    int qk_norm;
} arch_defaults_t;

static const arch_defaults_t s_arch[ARCH_COUNT] = {
    [ARCH_LLAMA] = {"LlamaForCausalLM", "llama", 32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, 10000.0, 1, 2,
                    0, 0, 0, 0, 0},
    [ARCH_QWEN3] = {"Qwen3ForCausalLM", "qwen3", 151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, 10000.0, -1, -1,
                    0, 0, 0, 0, 1},
    [ARCH_QWEN3_MOE] = {"Qwen3MoeForCausalLM", "qwen3_moe", 151936, 2048, 6144, 24, 32, 4, 0, 32768, 1e-6, 10000.0,
                        -1, -1, 128, 8, 768, 0, 1},
    /* Mixtral always renormalises its top-k routing weights, i.e. norm_topk_prob is 1. */
    [ARCH_MIXTRAL] = {"MixtralForCausalLM", "mixtral", 32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-5, 1e6, 1, 2,
                      8, 2, 0, 1, 0},
    /* DeepseekV3Config: kv heads = heads; head_dim is the KV shape, set from the MLA fields. */
    [ARCH_DEEPSEEK_V3] = {"DeepseekV3ForCausalLM", "deepseek_v3", 129280, 7168, 18432, 61, 128, 0, 0, 4096, 1e-6,
                          10000.0, 0, 1, 256, 8, 2048, 1, 0},
};

const char *config_arch_name(model_arch_t arch) { return arch < ARCH_COUNT ? s_arch[arch].model_type : "?"; }

/* ---- typed getters: absent or null -> default; present with the wrong type or range -> error ---- */

typedef struct {
    json_t *root;
    const char *file;
    char *err;
    size_t errlen;
    const char *scope;            /* "" or "rope_scaling." : prefixes key names in messages */
} ctx_t;

static int s_present(json_t *obj, const char *key) { json_t *v = json_object_get(obj, key); return v && !json_is_null(v); }

static int s_int(ctx_t *c, json_t *obj, const char *key, int def, int lo, int hi, int *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return errf(c->err, c->errlen, "%s: \"%s%s\" must be an integer", c->file, c->scope, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return errf(c->err, c->errlen, "%s: \"%s%s\" is %lld, outside [%d, %d]", c->file, c->scope, key, (long long)x,
                    lo, hi);
    *out = (int)x;
    return 0;
}

static int s_num(ctx_t *c, json_t *obj, const char *key, double def, int *found, double *out)
{
    json_t *v = json_object_get(obj, key);
    if (found)
        *found = 0;
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return errf(c->err, c->errlen, "%s: \"%s%s\" must be a number", c->file, c->scope, key);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return errf(c->err, c->errlen, "%s: \"%s%s\" is not finite", c->file, c->scope, key);
    if (found)
        *found = 1;
    return 0;
}

static int s_bool(ctx_t *c, json_t *obj, const char *key, int def, int *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        *out = def;
    else if (json_is_boolean(v))
        *out = json_is_true(v);
    else if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1))
        *out = (int)json_integer_value(v);
    else
        return errf(c->err, c->errlen, "%s: \"%s%s\" must be true or false", c->file, c->scope, key);
    return 0;
}

/* eos_token_id: an int or a list of ints; null leaves the list empty. */
static int s_token_list(ctx_t *c, json_t *obj, const char *key, int vocab, int *ids, int *n)
{
    json_t *v = json_object_get(obj, key);
    *n = 0;
    if (!v || json_is_null(v))
        return 0;
    size_t cnt = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_integer(v))
        return errf(c->err, c->errlen, "%s: \"%s\" must be an integer or a list of integers", c->file, key);
    if (cnt > CONFIG_MAX_EOS)
        return errf(c->err, c->errlen, "%s: \"%s\" lists %zu tokens (at most %d)", c->file, key, cnt, CONFIG_MAX_EOS);
    for (size_t i = 0; i < cnt; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e))
            return errf(c->err, c->errlen, "%s: \"%s\" must be an integer or a list of integers", c->file, key);
        json_int_t x = json_integer_value(e);
        if (x < 0 || x >= vocab)
            return errf(c->err, c->errlen, "%s: \"%s\" token %lld is outside the vocabulary [0, %d)", c->file, key,
                        (long long)x, vocab);
        ids[(*n)++] = (int)x;
    }
    return 0;
}

/* ---- rope ---- */

/* YaRN (DeepSeek-V3): factor required; original_max_position_embeddings, beta_fast (32), beta_slow
 * (1), mscale, mscale_all_dim, attention_factor, truncate (true) optional, as transformers reads
 * them. rope_original_max_pos 0 = absent (transformers then uses max_position_embeddings). */
static int s_yarn(ctx_t *c, ctx_t *rc, json_t *r, const char *scope, model_config_t *cfg)
{
    cfg->rope_kind = ROPE_YARN;
    if (!s_present(r, "factor"))
        return errf(c->err, c->errlen, "%s: \"%sfactor\" is required for rope_type yarn", c->file, scope);
    int found = 0;
    if (s_num(rc, r, "factor", 1.0, NULL, &cfg->rope_factor) != 0 ||
        s_int(rc, r, "original_max_position_embeddings", 0, 1, CFG_MAX_POS, &cfg->rope_original_max_pos) != 0 ||
        s_num(rc, r, "beta_fast", 32.0, NULL, &cfg->yarn_beta_fast) != 0 ||
        s_num(rc, r, "beta_slow", 1.0, NULL, &cfg->yarn_beta_slow) != 0 ||
        s_num(rc, r, "mscale", 0.0, NULL, &cfg->yarn_mscale) != 0 ||
        s_num(rc, r, "mscale_all_dim", 0.0, NULL, &cfg->yarn_mscale_all_dim) != 0 ||
        s_num(rc, r, "attention_factor", 0.0, &found, &cfg->yarn_attention_factor) != 0 ||
        s_bool(rc, r, "truncate", 1, &cfg->yarn_truncate) != 0)
        return -1;
    if (!(cfg->rope_factor > 0))
        return errf(c->err, c->errlen, "%s: \"%sfactor\" must be > 0", c->file, scope);
    if (!(cfg->yarn_beta_fast > 0) || !(cfg->yarn_beta_slow > 0))
        return errf(c->err, c->errlen, "%s: \"%sbeta_fast\" and \"%sbeta_slow\" must be > 0", c->file, scope, scope);
    if (found && !(cfg->yarn_attention_factor > 0))
        return errf(c->err, c->errlen, "%s: \"%sattention_factor\" must be > 0", c->file, scope);
    if (!found)
        cfg->yarn_attention_factor = 0;   /* derived from factor and mscale (engine/mla.c) */
    return 0;
}

/* Reads transformers 4's rope_scaling or transformers 5's rope_parameters. As transformers 5 does,
 * rope_scaling wins when both are given; rope_theta inside the object beats a top-level one. */
static int s_rope(ctx_t *c, model_config_t *cfg, double def_theta, model_arch_t arch)
{
    json_t *root = c->root;
    if (s_num(c, root, "rope_theta", def_theta, NULL, &cfg->rope_theta) != 0)
        return -1;
    cfg->rope_kind = ROPE_DEFAULT;
    cfg->rope_factor = 1.0;
    const char *objkey = s_present(root, "rope_scaling") ? "rope_scaling"
                       : s_present(root, "rope_parameters") ? "rope_parameters" : NULL;
    if (objkey) {
        json_t *r = json_object_get(root, objkey);
        if (!json_is_object(r))
            return errf(c->err, c->errlen, "%s: \"%s\" must be an object", c->file, objkey);
        char scope[32];
        snprintf(scope, sizeof scope, "%s.", objkey);
        ctx_t rc = *c;
        rc.scope = scope;          /* messages say "rope_scaling.factor" */

        const char *tkey = s_present(r, "rope_type") ? "rope_type" : s_present(r, "type") ? "type" : NULL;
        const char *type = "default";
        if (tkey) {
            json_t *t = json_object_get(r, tkey);
            if (!json_is_string(t))
                return errf(c->err, c->errlen, "%s: \"%s%s\" must be a string", c->file, scope, tkey);
            type = json_string_value(t);
        } else {
            /* transformers 5 also allows one rope object per layer type; no model we serve uses it. */
            const char *k;
            json_t *v;
            json_object_foreach(r, k, v) {
                if (json_is_object(v))
                    return errf(c->err, c->errlen, "%s: \"%s%s\": per-layer-type rope parameters are not supported",
                                c->file, scope, k);
            }
        }
        if (s_num(&rc, r, "rope_theta", cfg->rope_theta, NULL, &cfg->rope_theta) != 0)
            return -1;
        double prf;
        if (s_num(&rc, r, "partial_rotary_factor", 1.0, NULL, &prf) != 0)
            return -1;
        if (prf != 1.0)
            return errf(c->err, c->errlen, "%s: \"%spartial_rotary_factor\" must be 1 (partial rotary is not supported)",
                        c->file, scope);
        if (strcmp(type, "default") == 0) {
            cfg->rope_kind = ROPE_DEFAULT;
        } else if (strcmp(type, "linear") == 0 || strcmp(type, "llama3") == 0) {
            cfg->rope_kind = strcmp(type, "linear") == 0 ? ROPE_LINEAR : ROPE_LLAMA3;
            if (!s_present(r, "factor"))
                return errf(c->err, c->errlen, "%s: \"%sfactor\" is required for rope_type %s", c->file, scope, type);
            if (s_num(&rc, r, "factor", 1.0, NULL, &cfg->rope_factor) != 0)
                return -1;
            if (cfg->rope_factor < 1.0)
                return errf(c->err, c->errlen, "%s: \"%sfactor\" must be >= 1", c->file, scope);
        } else if (strcmp(type, "yarn") == 0 && arch == ARCH_DEEPSEEK_V3) {
            if (s_yarn(c, &rc, r, scope, cfg) != 0)
                return -1;
        } else {
            return errf(c->err, c->errlen, "%s: \"%s%s\" '%.40s' is not supported (default, linear, llama3%s)", c->file,
                        scope, tkey, type, arch == ARCH_DEEPSEEK_V3 ? ", yarn" : "");
        }
        if (cfg->rope_kind == ROPE_LLAMA3) {
            static const char *const need[] = {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
            for (size_t i = 0; i < ARRAY_LEN(need); i++)
                if (!s_present(r, need[i]))
                    return errf(c->err, c->errlen, "%s: \"%s%s\" is required for rope_type llama3", c->file, scope,
                                need[i]);
            if (s_num(&rc, r, "low_freq_factor", 0, NULL, &cfg->rope_low_freq_factor) != 0 ||
                s_num(&rc, r, "high_freq_factor", 0, NULL, &cfg->rope_high_freq_factor) != 0 ||
                s_int(&rc, r, "original_max_position_embeddings", 0, 1, CFG_MAX_POS, &cfg->rope_original_max_pos) != 0)
                return -1;
            if (!(cfg->rope_low_freq_factor > 0))
                return errf(c->err, c->errlen, "%s: \"%slow_freq_factor\" must be > 0", c->file, scope);
            /* The smoothing divides by (high - low). */
            if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
                return errf(c->err, c->errlen, "%s: \"%shigh_freq_factor\" must be > low_freq_factor", c->file, scope);
        }
    }
    if (!(cfg->rope_theta > 0))
        return errf(c->err, c->errlen, "%s: \"rope_theta\" must be > 0", c->file);
    return 0;
}

/* ---- architecture ---- */

static int s_arch_of(ctx_t *c, model_arch_t *out)
{
    json_t *archs = json_object_get(c->root, "architectures");
    json_t *mt = json_object_get(c->root, "model_type");
    int by_class = -1, by_type = -1;
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs) || json_array_size(archs) == 0 || !json_is_string(json_array_get(archs, 0)))
            return errf(c->err, c->errlen, "%s: \"architectures\" must be a non-empty list of strings", c->file);
        const char *name = json_string_value(json_array_get(archs, 0));
        for (int a = 0; a < ARCH_COUNT; a++)
            if (strcmp(name, s_arch[a].arch_class) == 0)
                by_class = a;
        if (by_class < 0)
            return errf(c->err, c->errlen,
                        "%s: \"architectures\" '%.60s' is not supported (LlamaForCausalLM, Qwen3ForCausalLM, "
                        "Qwen3MoeForCausalLM, MixtralForCausalLM, DeepseekV3ForCausalLM)", c->file, name);
    }
    if (mt && !json_is_null(mt)) {
        if (!json_is_string(mt))
            return errf(c->err, c->errlen, "%s: \"model_type\" must be a string", c->file);
        for (int a = 0; a < ARCH_COUNT; a++)
            if (strcmp(json_string_value(mt), s_arch[a].model_type) == 0)
                by_type = a;
        if (by_type < 0 && by_class < 0)
            return errf(c->err, c->errlen, "%s: \"model_type\" '%.60s' is not supported (llama, qwen3, qwen3_moe, mixtral, deepseek_v3)",
                        c->file, json_string_value(mt));
        if (by_type >= 0 && by_class >= 0 && by_type != by_class)
            return errf(c->err, c->errlen, "%s: \"model_type\" '%s' contradicts \"architectures\" '%s'", c->file,
                        json_string_value(mt), s_arch[by_class].arch_class);
    }
    if (by_class < 0 && by_type < 0)
        return errf(c->err, c->errlen, "%s: neither \"architectures\" nor \"model_type\" names the model", c->file);
    *out = (model_arch_t)(by_class >= 0 ? by_class : by_type);
    return 0;
}

/* ---- options we do not implement: refuse rather than run a different model ---- */

static int s_unsupported(ctx_t *c, model_arch_t arch)
{
    json_t *act = json_object_get(c->root, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return errf(c->err, c->errlen, "%s: \"hidden_act\" must be \"silu\" (the only activation supported)", c->file);
    int on;
    if (s_bool(c, c->root, "mlp_bias", 0, &on) != 0)
        return -1;
    if (on)
        return errf(c->err, c->errlen, "%s: \"mlp_bias\" true is not supported", c->file);
    if (arch == ARCH_QWEN3 || arch == ARCH_QWEN3_MOE) {
        if (s_bool(c, c->root, "use_sliding_window", 0, &on) != 0)
            return -1;
        if (on)
            return errf(c->err, c->errlen, "%s: \"use_sliding_window\" true is not supported", c->file);
    }
    json_t *lt = json_object_get(c->root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt))
            return errf(c->err, c->errlen, "%s: \"layer_types\" must be a list", c->file);
        for (size_t i = 0; i < json_array_size(lt); i++) {
            json_t *e = json_array_get(lt, i);
            if (!json_is_string(e) || strcmp(json_string_value(e), "full_attention") != 0)
                return errf(c->err, c->errlen, "%s: \"layer_types\"[%zu] is not \"full_attention\" (only full attention is supported)",
                            c->file, i);
        }
    }
    if (arch == ARCH_MIXTRAL && s_present(c->root, "sliding_window"))
        return errf(c->err, c->errlen, "%s: \"sliding_window\" is set; sliding-window attention is not supported", c->file);
    return 0;
}

/* DeepSeek-V3's MLA and DeepSeekMoE fields (DeepseekV3Config defaults); called after the common
 * fields. Sets num_kv_heads / head_dim to the KV shape (engine/config.h). */
static int s_deepseek(ctx_t *c, model_config_t *cfg)
{
    json_t *root = c->root;
    struct config_mla *a = &cfg->mla;
    a->on = 1;
    json_t *ql = json_object_get(root, "q_lora_rank");
    if (s_int(c, root, "q_lora_rank", ql && json_is_null(ql) ? 0 : 1536, 1, CFG_MAX_HIDDEN, &a->q_lora_rank) ||
        s_int(c, root, "kv_lora_rank", 512, 2, CFG_MAX_HEAD_DIM, &a->kv_lora_rank) ||
        s_int(c, root, "qk_nope_head_dim", 128, 1, CFG_MAX_HEAD_DIM, &a->qk_nope_head_dim) ||
        s_int(c, root, "qk_rope_head_dim", 64, 2, CFG_MAX_HEAD_DIM, &a->qk_rope_head_dim) ||
        s_int(c, root, "v_head_dim", 128, 1, CFG_MAX_HEAD_DIM, &a->v_head_dim) ||
        s_bool(c, root, "rope_interleave", 1, &a->rope_interleave) ||
        s_int(c, root, "first_k_dense_replace", 3, 0, CFG_MAX_LAYERS, &a->first_k_dense_replace) ||
        s_int(c, root, "n_shared_experts", 1, 0, CFG_MAX_EXPERTS, &a->n_shared_experts) ||
        s_int(c, root, "n_group", 8, 1, CFG_MAX_EXPERTS, &a->n_group) ||
        s_int(c, root, "topk_group", 4, 1, CFG_MAX_EXPERTS, &a->topk_group) ||
        s_num(c, root, "routed_scaling_factor", 2.5, NULL, &a->routed_scaling_factor) ||
        s_int(c, root, "num_nextn_predict_layers", 0, 0, 16, &a->num_nextn_predict_layers) ||
        s_int(c, root, "n_routed_experts", 256, 1, CFG_MAX_EXPERTS, &cfg->num_experts) ||
        s_int(c, root, "num_experts_per_tok", 8, 1, CFG_MAX_EXPERTS, &cfg->num_experts_per_tok) ||
        s_int(c, root, "moe_intermediate_size", 2048, 1, CFG_MAX_INTERMEDIATE, &cfg->moe_intermediate_size) ||
        s_bool(c, root, "norm_topk_prob", 1, &cfg->norm_topk_prob))
        return -1;
    if (a->qk_rope_head_dim % 2)
        return errf(c->err, c->errlen, "%s: \"qk_rope_head_dim\" (%d) must be even for rotary embeddings", c->file,
                    a->qk_rope_head_dim);
    if ((a->kv_lora_rank + a->qk_rope_head_dim) % 2 || (a->kv_lora_rank + a->qk_rope_head_dim) / 2 > CFG_MAX_HEAD_DIM)
        return errf(c->err, c->errlen, "%s: \"kv_lora_rank\" + \"qk_rope_head_dim\" (%d) must be even and at most %d",
                    c->file, a->kv_lora_rank + a->qk_rope_head_dim, 2 * CFG_MAX_HEAD_DIM);
    if (!(a->routed_scaling_factor > 0))
        return errf(c->err, c->errlen, "%s: \"routed_scaling_factor\" must be > 0", c->file);
    if (cfg->num_experts_per_tok > cfg->num_experts)
        return errf(c->err, c->errlen, "%s: \"num_experts_per_tok\" (%d) exceeds \"n_routed_experts\" (%d)", c->file,
                    cfg->num_experts_per_tok, cfg->num_experts);
    if (cfg->num_experts % a->n_group || cfg->num_experts / a->n_group < 2)
        return errf(c->err, c->errlen, "%s: \"n_group\" (%d) must divide \"n_routed_experts\" (%d) into groups of at "
                    "least 2", c->file, a->n_group, cfg->num_experts);
    if (a->topk_group > a->n_group)
        return errf(c->err, c->errlen, "%s: \"topk_group\" (%d) exceeds \"n_group\" (%d)", c->file, a->topk_group,
                    a->n_group);
    if (cfg->num_experts_per_tok > a->topk_group * (cfg->num_experts / a->n_group))
        return errf(c->err, c->errlen, "%s: \"num_experts_per_tok\" (%d) exceeds the experts of \"topk_group\" groups (%d)",
                    c->file, cfg->num_experts_per_tok, a->topk_group * (cfg->num_experts / a->n_group));
    if (cfg->attention_bias)
        return errf(c->err, c->errlen, "%s: \"attention_bias\" true is not supported for DeepSeek-V3", c->file);
    /* Fields of DeepSeek's own config that transformers does not read: only the values it implies. */
    json_t *v;
    if ((v = json_object_get(root, "scoring_func")) && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "sigmoid") != 0))
        return errf(c->err, c->errlen, "%s: \"scoring_func\" must be \"sigmoid\" (DeepSeek-V3 routing)", c->file);
    if ((v = json_object_get(root, "topk_method")) && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "noaux_tc") != 0))
        return errf(c->err, c->errlen, "%s: \"topk_method\" must be \"noaux_tc\" (DeepSeek-V3 routing)", c->file);
    int freq;
    if (s_int(c, root, "moe_layer_freq", 1, 1, CFG_MAX_LAYERS, &freq))
        return -1;
    if (freq != 1)
        return errf(c->err, c->errlen, "%s: \"moe_layer_freq\" %d is not supported (1: every layer from "
                    "first_k_dense_replace on is MoE)", c->file, freq);
    const double qk = a->qk_nope_head_dim + a->qk_rope_head_dim;
    a->softmax_scale = pow(qk, -0.5);
    if (cfg->rope_kind != ROPE_DEFAULT && cfg->yarn_mscale_all_dim != 0 && cfg->rope_factor > 1) {
        const double ms = 0.1 * cfg->yarn_mscale_all_dim * log(cfg->rope_factor) + 1.0;
        a->softmax_scale *= ms * ms;
    }
    if (cfg->rope_kind == ROPE_LLAMA3)
        return errf(c->err, c->errlen, "%s: rope_type llama3 is not supported for DeepSeek-V3 (default, linear, yarn)",
                    c->file);
    cfg->num_kv_heads = 1;
    cfg->head_dim = (a->kv_lora_rank + a->qk_rope_head_dim) / 2;
    return 0;
}

static void s_gen_defaults(model_config_t *cfg)
{
    /* transformers' GenerationConfig defaults. */
    cfg->gen.do_sample = 0;
    cfg->gen.temperature = 1.0;
    cfg->gen.top_p = 1.0;
    cfg->gen.min_p = 0.0;
    cfg->gen.repetition_penalty = 1.0;
    cfg->gen.top_k = 50;
    cfg->gen.max_new_tokens = 0;
}

static json_t *s_load_object(const char *json, size_t len, const char *file, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        errf(err, errlen, "%s: not valid JSON (line %d, column %d: %s)", file, jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        errf(err, errlen, "%s: top level is not a JSON object", file);
        return NULL;
    }
    return root;
}

/* ---- config_parse's steps, in the order it runs them; each returns 0, or -1 with the error ---- */

static int s_sizes(ctx_t *c, const arch_defaults_t *d, model_config_t *cfg)
{
    json_t *root = c->root;
    if (s_int(c, root, "vocab_size", d->vocab, 1, CFG_MAX_VOCAB, &cfg->vocab_size) ||
        s_int(c, root, "hidden_size", d->hidden, 1, CFG_MAX_HIDDEN, &cfg->hidden_size) ||
        s_int(c, root, "intermediate_size", d->intermediate, 1, CFG_MAX_INTERMEDIATE, &cfg->intermediate_size) ||
        s_int(c, root, "num_hidden_layers", d->layers, 1, CFG_MAX_LAYERS, &cfg->num_layers) ||
        s_int(c, root, "num_attention_heads", d->heads, 1, CFG_MAX_HEADS, &cfg->num_heads) ||
        s_int(c, root, "max_position_embeddings", d->max_pos, 1, CFG_MAX_POS, &cfg->max_position_embeddings))
        return -1;
    return 0;
}

static int s_kv_heads(ctx_t *c, const arch_defaults_t *d, model_config_t *cfg)
{
    /* A null num_key_value_heads means MHA in every class; an absent one takes the class default. */
    json_t *kv = json_object_get(c->root, "num_key_value_heads");
    int kv_def = (kv && json_is_null(kv)) || d->kv_heads == 0 ? cfg->num_heads : d->kv_heads;
    if (s_int(c, c->root, "num_key_value_heads", kv_def, 1, CFG_MAX_HEADS, &cfg->num_kv_heads))
        return -1;
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return errf(c->err, c->errlen, "%s: \"num_key_value_heads\" (%d) must divide \"num_attention_heads\" (%d)",
                    c->file, cfg->num_kv_heads, cfg->num_heads);
    return 0;
}

static int s_head_dim(ctx_t *c, const arch_defaults_t *d, model_config_t *cfg)
{
    /* head_dim: explicit wins; null means hidden/heads; absent takes the class default (Qwen3: 128). */
    json_t *hd = json_object_get(c->root, "head_dim");
    if ((!hd && d->head_dim == 0) || (hd && json_is_null(hd))) {
        if (cfg->hidden_size % cfg->num_heads != 0)
            return errf(c->err, c->errlen,
                        "%s: \"hidden_size\" (%d) is not a multiple of \"num_attention_heads\" (%d) and no \"head_dim\" is given",
                        c->file, cfg->hidden_size, cfg->num_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    } else if (s_int(c, c->root, "head_dim", d->head_dim, 1, CFG_MAX_HEAD_DIM, &cfg->head_dim)) {
        return -1;
    }
    if (cfg->head_dim % 2 != 0)
        return errf(c->err, c->errlen, "%s: \"head_dim\" (%d) must be even for rotary embeddings", c->file,
                    cfg->head_dim);
    return 0;
}

static int s_norm_eps(ctx_t *c, const arch_defaults_t *d, model_config_t *cfg)
{
    if (s_num(c, c->root, "rms_norm_eps", d->rms_eps, NULL, &cfg->rms_norm_eps))
        return -1;
    if (!(cfg->rms_norm_eps > 0) || cfg->rms_norm_eps >= 1)
        return errf(c->err, c->errlen, "%s: \"rms_norm_eps\" must be in (0, 1)", c->file);
    return 0;
}

/* tie_word_embeddings, attention_bias; q/k norms come with the class. */
static int s_flags(ctx_t *c, const arch_defaults_t *d, model_config_t *cfg)
{
    if (s_bool(c, c->root, "tie_word_embeddings", 0, &cfg->tie_word_embeddings) ||
        s_bool(c, c->root, "attention_bias", 0, &cfg->attention_bias))
        return -1;
    cfg->has_qk_norm = d->qk_norm;
    return 0;
}

static int s_mlp_only_layers(ctx_t *c, model_config_t *cfg)
{
    json_t *mol = json_object_get(c->root, "mlp_only_layers");
    if (!mol || json_is_null(mol))
        return 0;
    if (!json_is_array(mol))
        return errf(c->err, c->errlen, "%s: \"mlp_only_layers\" must be a list of layer indices", c->file);
    if (json_array_size(mol) > CONFIG_MAX_MLP_ONLY_LAYERS)
        return errf(c->err, c->errlen, "%s: \"mlp_only_layers\" lists %zu layers (at most %d)", c->file,
                    json_array_size(mol), CONFIG_MAX_MLP_ONLY_LAYERS);
    for (size_t i = 0; i < json_array_size(mol); i++) {
        json_t *e = json_array_get(mol, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= cfg->num_layers)
            return errf(c->err, c->errlen, "%s: \"mlp_only_layers\"[%zu] is not a layer index in [0, %d)", c->file, i,
                        cfg->num_layers);
        cfg->mlp_only_layers[cfg->n_mlp_only_layers++] = (int)json_integer_value(e);
    }
    return 0;
}

/* Qwen3-MoE's expert width, routing normalisation and which layers are sparse. */
static int s_qwen3_moe(ctx_t *c, const arch_defaults_t *d, model_config_t *cfg)
{
    json_t *root = c->root;
    if (s_int(c, root, "moe_intermediate_size", d->moe_intermediate, 1, CFG_MAX_INTERMEDIATE,
              &cfg->moe_intermediate_size) ||
        s_bool(c, root, "norm_topk_prob", d->norm_topk, &cfg->norm_topk_prob) ||
        s_int(c, root, "decoder_sparse_step", 1, 1, CFG_MAX_LAYERS, &cfg->decoder_sparse_step))
        return -1;
    return s_mlp_only_layers(c, cfg);
}

/* MoE: Qwen3-MoE writes num_experts (v4) or num_local_experts (v5); Mixtral num_local_experts.
 * DeepSeek-V3's experts are s_deepseek's. */
static int s_moe(ctx_t *c, const arch_defaults_t *d, model_config_t *cfg)
{
    json_t *root = c->root;
    const model_arch_t arch = cfg->arch;
    cfg->decoder_sparse_step = 1;
    if (arch != ARCH_QWEN3_MOE && arch != ARCH_MIXTRAL)
        return 0;
    int ne_a = -1, ne_b = -1;
    if (s_int(c, root, "num_experts", -1, 0, CFG_MAX_EXPERTS, &ne_a) ||
        s_int(c, root, "num_local_experts", -1, 0, CFG_MAX_EXPERTS, &ne_b))
        return -1;
    if (ne_a >= 0 && ne_b >= 0 && ne_a != ne_b)
        return errf(c->err, c->errlen, "%s: \"num_experts\" (%d) and \"num_local_experts\" (%d) disagree", c->file,
                    ne_a, ne_b);
    cfg->num_experts = ne_b >= 0 ? ne_b : ne_a >= 0 ? ne_a : d->experts;
    if (arch == ARCH_MIXTRAL && cfg->num_experts == 0)
        return errf(c->err, c->errlen, "%s: \"num_local_experts\" must be > 0 for Mixtral", c->file);
    if (s_int(c, root, "num_experts_per_tok", d->experts_per_tok, 1, CFG_MAX_EXPERTS, &cfg->num_experts_per_tok))
        return -1;
    if (cfg->num_experts > 0 && cfg->num_experts_per_tok > cfg->num_experts)
        return errf(c->err, c->errlen, "%s: \"num_experts_per_tok\" (%d) exceeds the number of experts (%d)", c->file,
                    cfg->num_experts_per_tok, cfg->num_experts);
    if (arch == ARCH_MIXTRAL) {
        cfg->moe_intermediate_size = cfg->intermediate_size;   /* Mixtral's experts are intermediate_size wide */
        cfg->norm_topk_prob = 1;
    } else if (s_qwen3_moe(c, d, cfg) != 0) {
        return -1;
    }
    if (cfg->num_experts == 0)
        cfg->num_experts_per_tok = 0;     /* every layer dense */
    return 0;
}

static int s_dtype(ctx_t *c, model_config_t *cfg)
{
    json_t *root = c->root;
    if (!s_present(root, "torch_dtype") && !s_present(root, "dtype")) {
        cfg->dtype = DT_F32;
        return 0;
    }
    const char *key = s_present(root, "dtype") ? "dtype" : "torch_dtype";
    json_t *v = json_object_get(root, key);
    if (!json_is_string(v) || dtype_parse(json_string_value(v), &cfg->dtype) != 0)
        return errf(c->err, c->errlen, "%s: \"%s\" must be \"float32\", \"bfloat16\" or \"float16\"", c->file, key);
    return 0;
}

static int s_special_tokens(ctx_t *c, const arch_defaults_t *d, model_config_t *cfg)
{
    json_t *root = c->root;
    /* Explicit null means "no such token"; only an absent key takes the class default. */
    json_t *bos = json_object_get(root, "bos_token_id");
    if (s_int(c, root, "bos_token_id", bos ? -1 : d->bos, -1, cfg->vocab_size - 1, &cfg->bos_token_id))
        return -1;
    if (json_object_get(root, "eos_token_id"))
        return s_token_list(c, root, "eos_token_id", cfg->vocab_size, cfg->eos_token_ids, &cfg->n_eos);
    if (d->eos >= 0 && d->eos < cfg->vocab_size) {
        cfg->eos_token_ids[0] = d->eos;
        cfg->n_eos = 1;
    }
    return 0;
}

/* Quantized weights (engine/quant.h): refused here, naming the field, when unsupported. */
static int s_quant(ctx_t *c, model_config_t *cfg)
{
    char qwhere[300];
    snprintf(qwhere, sizeof qwhere, "%s: quantization_config", c->file);
    if (quant_config_parse(json_object_get(c->root, "quantization_config"), qwhere, &cfg->quant, c->err, c->errlen) < 0)
        return -1;
    return 0;
}

/* The order matters twice: a step reads what earlier ones set (head_dim the heads, the MoE fields
 * the layers, DeepSeek's the rope and attention_bias, the tokens the vocabulary), and the first
 * error found is the one reported. */
static int s_parse_root(ctx_t *c, model_config_t *cfg)
{
    model_arch_t arch = ARCH_LLAMA;
    if (s_arch_of(c, &arch) != 0 || s_unsupported(c, arch) != 0)
        return -1;
    const arch_defaults_t *d = &s_arch[arch];
    cfg->arch = arch;
    if (s_sizes(c, d, cfg) || s_kv_heads(c, d, cfg) || s_head_dim(c, d, cfg) || s_norm_eps(c, d, cfg) ||
        s_rope(c, cfg, d->rope_theta, arch) || s_flags(c, d, cfg) || s_moe(c, d, cfg) ||
        (arch == ARCH_DEEPSEEK_V3 && s_deepseek(c, cfg) != 0) || s_dtype(c, cfg) || s_special_tokens(c, d, cfg))
        return -1;
    s_gen_defaults(cfg);
    return s_quant(c, cfg);
}

int config_parse(const char *json, size_t len, const char *name_for_errors, model_config_t *cfg, char *err,
                 size_t errlen)
{
    const char *file = name_for_errors ? name_for_errors : "config.json";
    memset(cfg, 0, sizeof *cfg);
    json_t *root = s_load_object(json, len, file, err, errlen);
    if (!root)
        return -1;
    ctx_t c = {root, file, err, errlen, ""};
    int rc = s_parse_root(&c, cfg);
    json_decref(root);
    return rc;
}

int config_parse_generation(const char *json, size_t len, const char *name_for_errors, model_config_t *cfg, char *err,
                            size_t errlen)
{
    const char *file = name_for_errors ? name_for_errors : "generation_config.json";
    json_t *root = s_load_object(json, len, file, err, errlen);
    if (!root)
        return -1;
    ctx_t c = {root, file, err, errlen, ""};
    model_config_t g = *cfg;      /* applied only when the whole file is valid */
    int rc = -1;
    if (s_bool(&c, root, "do_sample", g.gen.do_sample, &g.gen.do_sample) ||
        s_num(&c, root, "temperature", g.gen.temperature, NULL, &g.gen.temperature) ||
        s_num(&c, root, "top_p", g.gen.top_p, NULL, &g.gen.top_p) ||
        s_num(&c, root, "min_p", g.gen.min_p, NULL, &g.gen.min_p) ||
        s_num(&c, root, "repetition_penalty", g.gen.repetition_penalty, NULL, &g.gen.repetition_penalty) ||
        s_int(&c, root, "top_k", g.gen.top_k, 0, CFG_MAX_VOCAB, &g.gen.top_k) ||
        s_int(&c, root, "max_new_tokens", g.gen.max_new_tokens, 0, CFG_MAX_POS, &g.gen.max_new_tokens) ||
        s_int(&c, root, "bos_token_id", g.bos_token_id, -1, g.vocab_size - 1, &g.bos_token_id))
        goto out;
    if (g.gen.temperature < 0) {
        errf(err, errlen, "%s: \"temperature\" must be >= 0", file);
        goto out;
    }
    if (!(g.gen.top_p > 0 && g.gen.top_p <= 1)) {
        errf(err, errlen, "%s: \"top_p\" must be in (0, 1]", file);
        goto out;
    }
    if (g.gen.min_p < 0 || g.gen.min_p > 1) {
        errf(err, errlen, "%s: \"min_p\" must be in [0, 1]", file);
        goto out;
    }
    if (!(g.gen.repetition_penalty > 0)) {
        errf(err, errlen, "%s: \"repetition_penalty\" must be > 0", file);
        goto out;
    }
    if (s_present(root, "eos_token_id") &&
        s_token_list(&c, root, "eos_token_id", g.vocab_size, g.eos_token_ids, &g.n_eos))
        goto out;
    *cfg = g;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int config_layer_is_moe(const model_config_t *cfg, int layer)
{
    if (cfg->num_experts <= 0 || layer < 0 || layer >= cfg->num_layers)
        return 0;
    if (cfg->mla.on)
        return layer >= cfg->mla.first_k_dense_replace;
    for (int i = 0; i < cfg->n_mlp_only_layers; i++)
        if (cfg->mlp_only_layers[i] == layer)
            return 0;
    return (layer + 1) % cfg->decoder_sparse_step == 0;
}

double config_weight_bytes(const model_config_t *cfg, size_t elem_bytes, double experts)
{
    const double H = cfg->hidden_size, D = cfg->head_dim, es = (double)elem_bytes;
    double attn = (2.0 * cfg->num_heads * D + 2.0 * cfg->num_kv_heads * D) * H;   /* q, o; k, v */
    double shared = 0;
    if (cfg->mla.on) {                                  /* MLA: as engine/mla_load.c counts them */
        const double nH = cfg->num_heads, qk = cfg->mla.qk_nope_head_dim + cfg->mla.qk_rope_head_dim,
                     r = cfg->mla.kv_lora_rank, qr = cfg->mla.q_lora_rank;
        attn = (qr > 0 ? qr * H + nH * qk * qr : nH * qk * H) + (r + cfg->mla.qk_rope_head_dim) * H +
               nH * (cfg->mla.qk_nope_head_dim + cfg->mla.v_head_dim) * r + H * nH * cfg->mla.v_head_dim;
        shared = 3.0 * cfg->moe_intermediate_size * cfg->mla.n_shared_experts * H;
    }
    double elems = (double)cfg->vocab_size * H;                                         /* LM head */
    for (int l = 0; l < cfg->num_layers; l++)
        elems += attn + (config_layer_is_moe(cfg, l)
                             ? (double)cfg->num_experts * H + experts * 3.0 * cfg->moe_intermediate_size * H + shared
                             : 3.0 * cfg->intermediate_size * H);
    return elems * es;
}

dtype_t config_kv_dtype(const model_config_t *cfg, dtype_t dummy, dtype_t chosen)
{
    if (chosen != DT_COUNT)
        return chosen;
    return dummy != DT_COUNT ? dummy : cfg->dtype;
}

size_t config_kv_bytes_per_token(const model_config_t *cfg, size_t elem_bytes)
{
    return (size_t)cfg->num_layers * (size_t)cfg->num_kv_heads * (size_t)cfg->head_dim * 2 * elem_bytes;
}

/* Reads a whole small file; *missing is set (and 0 returned) when it does not exist and may_miss. */
static int s_read_file(const char *path, int may_miss, char **buf, size_t *len, int *missing, char *err, size_t errlen)
{
    *buf = NULL;
    *len = 0;
    if (missing)
        *missing = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        if (may_miss && errno == ENOENT) {
            *missing = 1;
            return 0;
        }
        return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n == cap) {
            if (cap >= CFG_MAX_FILE) {
                free(b);
                fclose(fp);
                return errf(err, errlen, "%s: larger than %u bytes", path, CFG_MAX_FILE);
            }
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t got = fread(b + n, 1, cap - n, fp);
        n += got;
        if (got == 0)
            break;
    }
    const int e = !b ? ENOMEM : ferror(fp) ? errno : 0;   /* EISDIR for a directory named config.json */
    fclose(fp);
    if (e) {
        free(b);
        return errf(err, errlen, "%s: read failed: %s", path, strerror(e));
    }
    *buf = b;
    *len = n;
    return 0;
}

int config_load(const char *model_dir, model_config_t *cfg, char *err, size_t errlen)
{
    char path[4096];
    char *buf;
    size_t len;
    int missing;
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", model_dir) >= sizeof path)
        return errf(err, errlen, "%s: path too long", model_dir);
    if (s_read_file(path, 0, &buf, &len, NULL, err, errlen) != 0)
        return -1;
    int rc = config_parse(buf, len, path, cfg, err, errlen);
    free(buf);
    if (rc != 0)
        return -1;
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    if (s_read_file(path, 1, &buf, &len, &missing, err, errlen) != 0)
        return -1;
    if (missing)
        return 0;
    rc = config_parse_generation(buf, len, path, cfg, err, errlen);
    free(buf);
    return rc;
}
