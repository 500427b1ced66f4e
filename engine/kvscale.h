/* engine/kvscale.h — the scales of an fp8 (E4M3) KV cache: one f32 per layer, K or V, and kv head.
 *
 * An fp8 cache stores K and V as e4m3 codes of x / s and reads them as code * s (bk_kv_t.scale in
 * kernels/backend.h), so s sets the range: |x| up to 448 s is kept, larger values saturate. With
 * s = 1 (what the cache did before scales) a model whose K or V exceed 448, or whose values sit far
 * below 1 in e4m3's coarse subnormal steps, loses them. Where the scales come from
 * (model.kv_scales, --kv-scales):
 *   checkpoint  the checkpoint's per-layer tensors, as FP8 exports store them: 
 *               model.layers.N.self_attn.k_scale / v_scale (compressed-tensors, ModelOpt, vLLM's
 *               naming), else self_attn.k_proj.output_scale / v_proj.output_scale (some ModelOpt
 *               exports), else one self_attn.kv_scale for both (AutoFP8). Each holds one value (per
 *               tensor) or num_key_value_heads (per head), f32/bf16/f16; every layer must have
 *               them, positive and finite. Missing: an error naming the first tensor looked for.
 *   calibrate   measured at load: KVSCALE_CALIB_SEQS prompts of KVSCALE_CALIB_LEN pseudo-random
 *               token ids (a fixed seed) run through the model in an f32 cache, in chunks of
 *               KVSCALE_CALIB_CHUNK tokens, and s = KVSCALE_CALIB_HEADROOM * amax / 448 per layer, K
 *               or V, and kv head (a head whose values are all 0 keeps 1). The headroom: ids are not
 *               text, and text reaches further (kjv-dense, 1,024 tokens of its held-out text against
 *               the 512 ids: up to 1.5x the ids' amax, 2026-12-02); e4m3's relative precision is
 *               the same over its whole normal range, so a larger s costs only where values fall
 *               below 2^-6 s into its subnormals (absolute error <= 2^-10 s, ~1/100,000 of amax
 *               at headroom 4), while a value past 448 s saturates.
 *   one         every scale 1 (the cache as it was).
 *   auto        (the default) the checkpoint's when it has them, else calibrate (else one where no
 *               process holds every expert: an expert-parallel group, engine_spec_t.kv_no_calibrate).
 * Only an fp8 cache of a model with ordinary attention has scales: other dtypes ignore them, and
 * MLA's latent cache (DeepSeek-V3) keeps scale 1.
 *
 * Workers must agree: a prefill worker's KV is handed to a decode worker, kept in the host store
 * and on disk as codes, unchanged. The scales are therefore never shipped but derived the same way
 * by every process: the checkpoint's are fixed, and calibration is deterministic (fixed ids, fixed
 * chunks independent of the worker's max_tokens, batch-invariant ops), so processes of one
 * topology (same model, backend and options) compute the same bits. kvscale_digest gives a short
 * fingerprint that workers log at load for an operator to compare, and model.kv_scales is part of
 * the disk tier's fingerprint (actors/cache/fingerprint.c), so blocks written under other scales
 * are never read back.
 *
 * Known limits: pseudo-random ids are not text; a text whose K/V reach past the calibrated range
 * (4x the ids' amax) saturates there. docs/gpus.md has the measured figures.
 */
#ifndef TROUPE_ENGINE_KVSCALE_H
#define TROUPE_ENGINE_KVSCALE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/model.h"

typedef enum { KV_SCALES_AUTO = 0, KV_SCALES_CHECKPOINT, KV_SCALES_CALIBRATE, KV_SCALES_ONE, KV_SCALES_COUNT } kv_scales_t;

#define KVSCALE_E4M3_MAX 448.0f
#define KVSCALE_CALIB_SEQS 4      /* calibration prompts */
#define KVSCALE_CALIB_LEN 128     /* tokens per prompt (the model's context when shorter) */
#define KVSCALE_CALIB_CHUNK 64    /* tokens per forward (engine_load sizes the model for it) */
#define KVSCALE_CALIB_HEADROOM 4.0f   /* calibrated s = headroom * amax / 448 (above: why) */

/* "auto", "checkpoint", "calibrate", "one"; "?" out of range. */
const char *kv_scales_name(int mode);
/* The mode by name (case-insensitive), or -1. */
int kv_scales_parse(const char *s);

/* Entries of a scale table: [num_layers][2 (K, V)][num_kv_heads]. */
static inline size_t kvscale_count(const model_config_t *cfg)
{
    return (size_t)cfg->num_layers * 2 * (size_t)cfg->num_kv_heads;
}

/* The checkpoint's scales into out [kvscale_count]: 1 when it has them, 0 when it has none (out
 * untouched), -1 with err when they are incomplete or malformed (err names the tensor). */
int kvscale_from_checkpoint(const ckpt_t *ck, const model_config_t *cfg, float *out, char *err, size_t errlen);

/* The calibration prompts' ids: KVSCALE_CALIB_SEQS x KVSCALE_CALIB_LEN, in [0, vocab). */
void kvscale_calib_ids(int vocab, int32_t *ids, size_t n);

/* Calibrates on m: n_seqs prompts of len tokens each (ids [n_seqs][len]) run from an empty cache in
 * chunks of `chunk` tokens, in a temporary f32 pool of block_size blocks on m's backend (bf16 when
 * the backend has no f32 attention); out [kvscale_count] = KVSCALE_CALIB_HEADROOM * amax / 448,
 * amax (may be NULL) the amax itself. 0, or -1 with err. */
int kvscale_calibrate(model_t *m, const int32_t *ids, int n_seqs, int len, int chunk, int block_size, float *out,
                      float *amax, char *err, size_t errlen);

/* A 64-bit digest of a table (XXH3 of its bytes), for logs. */
uint64_t kvscale_digest(const float *scales, size_t n);

#endif
