/* tests/fuzz/fuzz_config.c — config_parse and config_parse_generation on arbitrary bytes: either an
 * error naming the input, or a config whose invariants hold (every dimension positive and bounded,
 * heads divisible by kv heads, top-k within the experts, layer indices in range). The input is split
 * at the first NUL byte: config.json before it, generation_config.json after it.
 * Seeds: tests/fuzz/corpus/config/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t n1 = nul ? (size_t)(nul - data) : size;
    char err[512];
    err[0] = '\0';
    model_config_t cfg;
    if (config_parse((const char *)data, n1, "fuzz", &cfg, err, sizeof err) != 0) {
        if (strncmp(err, "fuzz: ", 6) != 0)
            abort();
        return 0;
    }
    if (cfg.arch >= ARCH_COUNT || cfg.vocab_size <= 0 || cfg.hidden_size <= 0 || cfg.intermediate_size <= 0 ||
        cfg.num_layers <= 0 || cfg.num_heads <= 0 || cfg.num_kv_heads <= 0 || cfg.head_dim <= 0 ||
        cfg.head_dim % 2 || cfg.num_heads % cfg.num_kv_heads || !(cfg.rms_norm_eps > 0) || !(cfg.rope_theta > 0) ||
        cfg.n_eos < 0 || cfg.n_eos > CONFIG_MAX_EOS || cfg.dtype >= DT_WEIGHT_COUNT)
        abort();
    if (cfg.num_experts > 0 && (cfg.num_experts_per_tok < 1 || cfg.num_experts_per_tok > cfg.num_experts ||
                                cfg.moe_intermediate_size <= 0 || cfg.decoder_sparse_step < 1))
        abort();
    for (int i = 0; i < cfg.n_mlp_only_layers; i++)
        if (cfg.mlp_only_layers[i] < 0 || cfg.mlp_only_layers[i] >= cfg.num_layers)
            abort();
    for (int i = 0; i < cfg.n_eos; i++)
        if (cfg.eos_token_ids[i] < 0 || cfg.eos_token_ids[i] >= cfg.vocab_size)
            abort();
    for (int l = 0; l < cfg.num_layers; l++)
        (void)config_layer_is_moe(&cfg, l);
    if (nul) {
        model_config_t before = cfg;
        if (config_parse_generation((const char *)nul + 1, size - n1 - 1, "fuzz", &cfg, err, sizeof err) != 0) {
            if (strncmp(err, "fuzz: ", 6) != 0 || memcmp(&before, &cfg, sizeof cfg) != 0)
                abort();
        } else if (!(cfg.gen.top_p > 0 && cfg.gen.top_p <= 1) || cfg.gen.temperature < 0 || cfg.gen.top_k < 0 ||
                   cfg.n_eos > CONFIG_MAX_EOS) {
            abort();
        }
    }
    return 0;
}
