/* engine/quant.h — quantized weights: config.json's quantization_config, the formats' tensors, and
 * the reference encoding and decoding that the loader, the kernels' tests and troupe-quantize share.
 *
 * Formats (kernels/backend.h's BK_Q_*), as the Hugging Face hub stores them:
 *   compressed-tensors "float-quantized": FP8 E4M3 `weight` [N][K], `weight_scale` [1] / [] (per
 *     tensor) or [N][1] (per channel); activations none or dynamic per token (fp8).
 *   compressed-tensors "int-quantized": INT8 `weight` [N][K], `weight_scale` [N][1] (per channel),
 *     symmetric; activations none or dynamic per token (int8): W8A8.
 *   compressed-tensors "pack-quantized": INT4 in `weight_packed` I32 [N][K/8] (8 values per word,
 *     value + 8, element i at bits 4i), `weight_scale` [N][K/group], `weight_shape` [2]; symmetric,
 *     groups of 32..K columns (128 usual); weight-only.
 *   compressed-tensors "nvfp4-pack-quantized": FP4 E2M1 in `weight_packed` U8 [N][K/2], `weight_scale`
 *     F8_E4M3 [N][K/16], `weight_global_scale` f32 [1]; w = fp4 * f32(weight_scale) / global. Any
 *     activation settings are computed weight-only (Hopper has no FP4 tensor cores).
 *   DeepSeek-V3 "fp8" (quant_method fp8, weight_block_size [128, 128]): FP8 `weight` and f32
 *     `weight_scale_inv` [ceil(N/128)][ceil(K/128)]; activations in f32 (weight-only).
 * Every scale is converted to f32 at load; the kernel multiplies each decoded code by its f32
 * scale, so "the dequantized weight" is one well-defined f32 matrix.
 *
 * Refused, with a message naming the field: other quant_methods and formats, more than one config
 * group, targets other than Linear, asymmetric weights (zero points), static activation scales,
 * other bit widths, strategies or group sizes.
 *
 * `ignore` entries are module names or "re:" patterns in Python's syntax, matched as re.match does
 * (anchored at the start only), with Oniguruma. */
#ifndef TROUPE_ENGINE_QUANT_H
#define TROUPE_ENGINE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define QUANT_MAX_IGNORE 32
#define QUANT_MAX_NAME 128

typedef enum { QUANT_CT = 1, QUANT_DEEPSEEK_FP8 } quant_method_t;

typedef struct quant_config {
    int present;                  /* 0: config.json has no quantization_config (plain weights) */
    quant_method_t method;
    int fmt;                      /* BK_Q_* */
    int act;                      /* BK_QA_*: activations of quantized layers */
    int gr, gc;                   /* scale block: 0 = the whole dimension (per tensor: 0 x 0, per channel 1 x 0) */
    int n_ignore;
    char ignore[QUANT_MAX_IGNORE][QUANT_MAX_NAME];  /* module names or "re:" patterns left unquantized */
} quant_config_t;

/* Parses a quantization_config object (a jansson json_t *, passed as void * so callers need not
 * include jansson). where starts every message ("config.json: quantization_config"). */
int quant_config_parse(const void *json_obj, const char *where, quant_config_t *qc, char *err, size_t errlen);
/* The same from JSON text of the object alone (the fuzz target's entry). */
int quant_config_parse_text(const char *text, size_t len, const char *where, quant_config_t *qc, char *err,
                            size_t errlen);
/* 1 when module (a tensor name without ".weight") stays unquantized by the config's ignore list. */
int quant_ignored(const quant_config_t *qc, const char *module);
/* "fp8", "int8", "int4", "nvfp4" (BK_Q_* by name, for options and messages); -1 when unknown. */
int quant_format_parse(const char *s);
const char *quant_format_name(int fmt);

/* The scale grid of a [rows][cols] weight with blocks gr x gc (0 = whole dimension): *gr_out, *gc_out
 * the effective block, returns the number of scales. */
size_t quant_grid(int64_t rows, int64_t cols, int gr, int gc, int *gr_out, int *gc_out);
/* Bytes of codes of a [rows][cols] weight in fmt. */
size_t quant_code_bytes(int fmt, int64_t rows, int64_t cols);

/* Reference encoding of w [rows][cols] f32 (finite values) into fmt with blocks gr x gc (effective,
 * from quant_grid): codes (quant_code_bytes) and scales f32 (quant_grid entries). Symmetric round
 * to nearest: fp8 scale = amax / 448; int8 amax / 127.5 clamped to [-128, 127]; int4 amax / 7.5
 * clamped to [-8, 7] (compressed-tensors' symmetric ranges); fp4 (gc 16): the NVFP4 two-level
 * scale, block scale f8(amax_block / 6 * global) / global with global = 448 * 6 / amax_tensor, and
 * then fp8_scales (may be NULL) gets the block scales' E4M3 bytes and *global_scale the global.
 * An all-zero block gets scale 1 (fp4: the E4M3 code of the smallest normal). -1 on bad shapes. */
int quant_encode(int fmt, const float *w, int64_t rows, int64_t cols, int gr, int gc, uint8_t *codes, float *scales,
                 uint8_t *fp8_scales, float *global_scale);
/* The dequantized weight: w [rows][cols] f32 = decode(code) * scale, as the kernels compute it. */
void quant_decode(int fmt, const uint8_t *codes, const float *scales, int64_t rows, int64_t cols, int gr, int gc,
                  float *w);
/* One code's value before scaling (fp8: e4m3; int8; int4: nibble - 8; fp4: e2m1). */
float quant_code_value(int fmt, const uint8_t *codes, int64_t cols, int64_t r, int64_t c);
/* The activation fake-quantization of kernels/backend.h's qact: x [K] -> out [K] (may alias). */
void quant_act_row(int act, const float *x, int64_t K, float *out);

float quant_fp4_to_f32(uint8_t nibble);
uint8_t quant_f32_to_fp4(float x);  /* round to nearest, ties to even; saturates at +-6 */

#endif
