#include "common/dtype.h"

#include <math.h>
#include <strings.h>

const char *dtype_name(dtype_t t)
{
    static const char *const names[] = {"f32", "bf16", "f16", "fp8"};
    return t < DT_COUNT ? names[t] : t == DT_I8 ? "i8" : t == DT_U8 ? "u8" : t == DT_I32 ? "i32" : t == DT_I64 ? "i64" : "?";
}

int dtype_parse(const char *s, dtype_t *out)
{
    static const struct { const char *name; dtype_t t; } tab[] = {
        {"f32", DT_F32}, {"float32", DT_F32}, {"float", DT_F32},
        {"bf16", DT_BF16}, {"bfloat16", DT_BF16},
        {"f16", DT_F16}, {"float16", DT_F16}, {"half", DT_F16},
    };
    for (size_t i = 0; s && i < sizeof tab / sizeof tab[0]; i++)
        if (strcasecmp(s, tab[i].name) == 0) {
            *out = tab[i].t;
            return 0;
        }
    return -1;
}

int dtype_parse_kv(const char *s, dtype_t *out)
{
    static const char *const fp8[] = {"fp8", "f8e4m3", "fp8_e4m3", "float8_e4m3fn"};
    for (size_t i = 0; s && i < sizeof fp8 / sizeof fp8[0]; i++)
        if (strcasecmp(s, fp8[i]) == 0) {
            *out = DT_F8E4M3;
            return 0;
        }
    return dtype_parse(s, out);
}

float f8e4m3_to_f32(uint8_t b)
{
    const int e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 0xf && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);                  /* subnormal: m * 2^-9 */
    else
        v = ldexpf((float)(8 + m), e - 10);        /* 2^(e-7) * (1 + m/8) */
    return (b & 0x80) ? -v : v;
}

uint8_t f32_to_f8e4m3(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7f;                        /* NaN */
    if (a >= 0x43e00000u)                          /* >= 448 (and inf): saturate */
        return sign | 0x7e;
    const int e = (int)(a >> 23) - 127;
    if (e >= -6) {                                 /* normal: keep 3 of the 23 mantissa bits */
        const uint32_t m = a & 0x7fffffu, rem = m & 0xfffffu, mid = 0x80000u;
        uint32_t r = ((uint32_t)(e + 7) << 3) | (m >> 20);
        if (rem > mid || (rem == mid && (r & 1)))
            r++;                                   /* may carry into the exponent: correct; < 448 stays <= 0x7e */
        return sign | (uint8_t)r;
    }
    /* subnormal: the nearest multiple of 2^-9 (ties to even); 8 * 2^-9 is the smallest normal, 0x08 */
    float mag;
    memcpy(&mag, &a, 4);
    return sign | (uint8_t)rintf(mag * 512.0f);
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {                                   /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            u = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff)                /* inf / NaN */
        return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {                                /* subnormal or zero */
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;                                       /* may carry into the exponent: correct */
    return (uint16_t)h;
}

void dtype_to_f32(dtype_t t, const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        if (t == DT_F8E4M3) {
            dst[i] = f8e4m3_to_f32(p[i]);
        } else if (t == DT_F32) {
            memcpy(&dst[i], p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = t == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
}

void dtype_from_f32(dtype_t t, const float *src, void *dst, size_t n)
{
    uint8_t *p = dst;
    for (size_t i = 0; i < n; i++) {
        if (t == DT_F8E4M3) {
            p[i] = f32_to_f8e4m3(src[i]);
        } else if (t == DT_F32) {
            memcpy(p + 4 * i, &src[i], 4);
        } else {
            uint16_t h = t == DT_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
    }
}
