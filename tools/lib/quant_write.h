/* tools/lib/quant_write.h — writes a quantized checkpoint (the hub's layouts, engine/quant.h) from
 * a plain (f32 / bf16 / f16) Hugging Face model directory, with no Python: troupe-quantize and the
 * tests use it.
 *
 * Quantized: every 2-D tensor under model.layers.* named *.weight except the MoE routers
 * (mlp.gate, block_sparse_moe.gate); the embedding, lm_head, norms and biases are copied as they
 * are. The output directory gets model.safetensors, config.json (the source's, with
 * quantization_config set, or removed for a dequantized copy) and the source's tokenizer and
 * generation files.
 *
 * A dequantized copy (dequantize = 1) stores each quantized weight decoded to f32
 * (code x f32 scale, exactly what the kernels compute), everything else as in the source: a
 * weight-only quantized checkpoint and its dequantized copy give the same logits bit for bit. */
#ifndef TROUPE_TOOLS_QUANT_WRITE_H
#define TROUPE_TOOLS_QUANT_WRITE_H

#include <stddef.h>

typedef struct quant_write_opts {
    int fmt;                      /* BK_Q_FP8, BK_Q_I8, BK_Q_I4, BK_Q_FP4 */
    int block;                    /* fp8 only: 1 = DeepSeek-V3's 128 x 128 blocks (quant_method fp8) */
    int per_tensor;               /* fp8 only: one scale per tensor (default: per channel) */
    int weight_only;              /* fp8 / int8: no input_activations (default: dynamic per token) */
    int dequantize;               /* write the dequantized f32 copy instead */
} quant_write_opts_t;

/* Returns 0, or -1 with err naming the file or tensor. dst_dir is created when missing. */
int quant_write(const char *src_dir, const char *dst_dir, const quant_write_opts_t *o, char *err, size_t errlen);

#endif
