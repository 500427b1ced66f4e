/* common/dtype.h — element types of tensors and the conversions between them.
 * bf16 -> f32 is exact; f32 -> bf16 rounds to nearest even (as PyTorch does); NaN stays NaN. */
#ifndef TROUPE_DTYPE_H
#define TROUPE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum { DT_F32 = 0, DT_BF16, DT_F16, DT_COUNT } dtype_t;

static inline size_t dtype_size(dtype_t t) { return t == DT_F32 ? 4 : 2; }
const char *dtype_name(dtype_t t);               /* "f32", "bf16", "f16" */
int dtype_parse(const char *s, dtype_t *out);    /* accepts f32/float32/F32, bf16/bfloat16/BF16, f16/float16/F16; -1 otherwise */

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

/* Converts n elements of type src_t at src (any alignment) to float. */
void dtype_to_f32(dtype_t src_t, const void *src, float *dst, size_t n);
/* Converts n floats to dst_t at dst (any alignment). */
void dtype_from_f32(dtype_t dst_t, const float *src, void *dst, size_t n);

#endif
