/* engine/config.h — a model's shape and defaults, read from a Hugging Face model directory.
 *
 * config_load reads <dir>/config.json and, when present, <dir>/generation_config.json. Both the
 * transformers 4 and transformers 5 spellings are accepted and give identical structs:
 *   torch_dtype | dtype;  rope_theta + rope_scaling | rope_parameters (rope_theta inside);
 *   num_experts (Qwen3-MoE, v4) | num_local_experts (Mixtral; Qwen3-MoE in v5);
 *   rope_scaling.rope_type | rope_scaling.type;  eos_token_id int | list.
 * Every value is range-checked; an error names the file and the key.
 *
 * Supported: LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM,
 * DeepseekV3ForCausalLM, with SiLU MLPs and rope types default / llama3 / linear (yarn for
 * DeepSeek-V3 only). Anything else (an unknown architecture, sliding-window attention, MLP biases)
 * is refused with an error rather than run wrongly.
 *
 * DeepSeek-V3 (Multi-head Latent Attention): the KV cache holds per token and layer one vector of
 * kv_lora_rank + qk_rope_head_dim values (the normed latent, then the RoPE'd key), shared by every
 * head. So that every pool, hand-off and store sized from (num_kv_heads, head_dim) holds exactly
 * that, config_parse sets num_kv_heads = 1 and head_dim = (kv_lora_rank + qk_rope_head_dim) / 2:
 * the KV shape, not the attention's head size (which is in cfg.mla). engine/mla.c says how the
 * vector sits in a block. */
#ifndef TROUPE_ENGINE_CONFIG_H
#define TROUPE_ENGINE_CONFIG_H

#include <stddef.h>

#include "common/dtype.h"
#include "engine/quant.h"

typedef enum { ARCH_LLAMA, ARCH_QWEN3, ARCH_QWEN3_MOE, ARCH_MIXTRAL, ARCH_DEEPSEEK_V3, ARCH_COUNT } model_arch_t;
typedef enum { ROPE_DEFAULT, ROPE_LLAMA3, ROPE_LINEAR, ROPE_YARN } rope_kind_t;

#define CONFIG_MAX_MLP_ONLY_LAYERS 64
#define CONFIG_MAX_EOS 8

typedef struct model_config {
    model_arch_t arch;            /* from "architectures"[0] / "model_type" */
    int vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim; /* head_dim explicit or hidden/heads */
    int max_position_embeddings;
    double rms_norm_eps, rope_theta;
    rope_kind_t rope_kind;        /* ROPE_DEFAULT: rope_factor 1 and the llama3 fields 0 */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor; int rope_original_max_pos;
    int tie_word_embeddings, attention_bias;  /* attention_bias: q/k/v/o have biases (Qwen2-style) */
    int num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob; /* 0 experts = dense */
    int decoder_sparse_step; int n_mlp_only_layers; int mlp_only_layers[CONFIG_MAX_MLP_ONLY_LAYERS];  /* Qwen3-MoE: which layers are dense */
    int has_qk_norm;              /* Qwen3 family: RMSNorm over head_dim on q and k before RoPE */
    dtype_t dtype;                /* torch_dtype / dtype; float32 when absent (transformers' default) */
    int bos_token_id, n_eos; int eos_token_ids[CONFIG_MAX_EOS];  /* bos -1 when absent; eos from generation_config.json when it has one */
    struct {
        int do_sample;            /* 0 = greedy */
        double temperature, top_p, min_p, repetition_penalty;  /* min_p 0 = off */
        int top_k;                /* 0 = off */
        int max_new_tokens;       /* 0 = not set */
    } gen;                        /* generation_config.json defaults, or HF's defaults when absent */
    quant_config_t quant;         /* quantization_config (engine/quant.h); quant.present 0 = plain weights */
    /* DeepSeek-V3 (arch ARCH_DEEPSEEK_V3; all 0 otherwise). */
    struct config_mla {
        int on;                   /* 1: MLA attention (num_kv_heads / head_dim are the KV shape, above) */
        int q_lora_rank;          /* 0: q_proj (q_lora_rank null), else q_a_proj / q_a_layernorm / q_b_proj */
        int kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
        int rope_interleave;      /* 1: the RoPE part's pairs are (2i, 2i+1) (DeepSeek's weights) */
        double softmax_scale;     /* qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under yarn */
        int first_k_dense_replace;/* layers [0, first_k) are dense MLPs of intermediate_size */
        int n_shared_experts;     /* shared experts' MLP is moe_intermediate_size x n_shared_experts wide */
        int n_group, topk_group;  /* group-limited routing */
        double routed_scaling_factor;
        int num_nextn_predict_layers;  /* MTP layers stored after the decoder (model.layers.{num_layers}.*) */
    } mla;
    /* yarn rope (ROPE_YARN): rope_factor is the factor; these as transformers reads them. */
    double yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim, yarn_attention_factor;
    int yarn_truncate;
} model_config_t;

/* Reads config.json (required) and generation_config.json (optional) from model_dir. */
int config_load(const char *model_dir, model_config_t *cfg, char *err, size_t errlen);
/* Parses a config.json image; name_for_errors (e.g. the path) starts every error message.
 * Sets gen to HF's GenerationConfig defaults (eos from config.json). */
int config_parse(const char *json, size_t len, const char *name_for_errors, model_config_t *cfg, char *err, size_t errlen);
/* Applies a generation_config.json image on top of a parsed config (its eos list replaces config.json's). */
int config_parse_generation(const char *json, size_t len, const char *name_for_errors, model_config_t *cfg, char *err, size_t errlen);

/* Whether decoder layer `layer` uses the sparse MoE block (1) or a dense MLP of intermediate_size (0).
 * Qwen3-MoE's rule: not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0. */
int config_layer_is_moe(const model_config_t *cfg, int layer);
/* Bytes of weights one forward step reads, from the shape alone (no checkpoint): every layer's
 * matrices at elem_bytes per element plus the LM head, counted as model_weight_bytes counts them
 * (norms, biases and the embedding rows are left out), with `experts` experts read per MoE layer:
 * num_experts gives model_weight_bytes, num_experts_per_tok model_active_weight_bytes (a unit test
 * checks both), a fractional count an expected number. For tools that size a run without loading. */
double config_weight_bytes(const model_config_t *cfg, size_t elem_bytes, double experts);
/* Bytes of KV one token keeps per sequence: layers x kv_heads x head_dim x 2 (K and V) x elem_bytes. */
size_t config_kv_bytes_per_token(const model_config_t *cfg, size_t elem_bytes);
/* The dtype of a KV pool, one rule for the workers and the tools (troupe-generate,
 * troupe-bench-engine, troupe-bench's byte counts), so a cluster and troupe-generate on the same
 * model keep the same cache: `chosen` when set (model.kv_dtype, --kv-dtype; DT_COUNT: auto), else
 * the model's own dtype as transformers keeps K and V: `dummy` for dummy weights of that dtype
 * (model.dtype, --dtype with load_format dummy; DT_COUNT: real weights), else the config's dtype. */
dtype_t config_kv_dtype(const model_config_t *cfg, dtype_t dummy, dtype_t chosen);
/* "llama", "qwen3", "qwen3_moe", "mixtral" (the HF model_type). */
const char *config_arch_name(model_arch_t arch);

#endif
