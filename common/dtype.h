/* common/dtype.h — element types of tensors and the conversions between them.
 * bf16 -> f32 is exact; f32 -> bf16 rounds to nearest even (as PyTorch does); NaN stays NaN. */
#ifndef TROUPE_DTYPE_H
#define TROUPE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* DT_F8E4M3 (OCP FP8 E4M3, "e4m3fn": 4 exponent bits, 3 mantissa bits, finite to +-448, one NaN
 * pattern per sign) is a KV cache type only: weights and activations are f32, bf16 or f16, the
 * first DT_WEIGHT_COUNT types. The storage types past DT_COUNT (DT_I8, DT_U8, DT_I32, DT_I64) are only the
 * bytes of quantized weights as a checkpoint stores them (engine/quant.h), never a KV, weight or
 * activation type: every check against DT_COUNT refuses them. */
typedef enum { DT_F32 = 0, DT_BF16, DT_F16, DT_F8E4M3, DT_COUNT, DT_I8 = 16, DT_U8, DT_I32, DT_I64 } dtype_t;
#define DT_WEIGHT_COUNT DT_F8E4M3

static inline size_t dtype_size(dtype_t t)
{
    return t == DT_I64 ? 8 : t == DT_F32 || t == DT_I32 ? 4 : t == DT_F8E4M3 || t == DT_I8 || t == DT_U8 ? 1 : 2;
}
const char *dtype_name(dtype_t t);               /* "f32", "bf16", "f16", "fp8" */
/* Weight types: f32/float32/F32, bf16/bfloat16/BF16, f16/float16/F16; -1 otherwise (fp8 too). */
int dtype_parse(const char *s, dtype_t *out);
/* KV cache types: dtype_parse's, and fp8 / f8e4m3 / fp8_e4m3 / float8_e4m3fn for DT_F8E4M3. */
int dtype_parse_kv(const char *s, dtype_t *out);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)          /* NaN: keep it quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);              /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
/* FP8 E4M3 as CUDA's cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float_to_fp8 with __NV_SATFINITE):
 * round to nearest even, subnormals kept (2^-9 steps below 2^-6), magnitudes past 448 (and
 * infinities) clamp to +-448, NaN becomes 0x7f with the sign. The conversion back is exact. */
float f8e4m3_to_f32(uint8_t b);
uint8_t f32_to_f8e4m3(float f);

/* Converts n elements of type src_t at src (any alignment) to float. */
void dtype_to_f32(dtype_t src_t, const void *src, float *dst, size_t n);
/* Converts n floats to dst_t at dst (any alignment). */
void dtype_from_f32(dtype_t dst_t, const float *src, void *dst, size_t n);

#endif
