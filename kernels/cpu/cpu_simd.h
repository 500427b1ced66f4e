/* kernels/cpu/cpu_simd.h — vector helpers shared by the CPU kernels (internal).
 *
 * With AVX-512 (F, BW, VL; -march=native on Zen 4, Skylake-SP / Sapphire Rapids and later) the kernels use 16-lane
 * f32 vectors; everywhere else they fall back to plain C with the same 16-lane summation order, so
 * results do not depend on the batch on either path. */
#ifndef TROUPE_KERNELS_CPU_SIMD_H
#define TROUPE_KERNELS_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define CPU_AVX512 1
#include <immintrin.h>
#else
#define CPU_AVX512 0
#endif

/* FP8 E4M3 (a KV cache type only) decodes by moving its bits into an f32: sign to bit 31, the 4
 * exponent and 3 mantissa bits to bits 23..26 and 20..22, so the f32 reads 2^(e-127) (1 + m/8), or
 * m 2^-129 for e = 0 (an f32 subnormal); times 2^120 that is exactly the E4M3 value, subnormals
 * included. Hazard: with the FPU's denormals-are-zero mode on (-ffast-math, DAZ) the E4M3
 * subnormals would read as 0. Codes 0x7f / 0xff are NaN, as in f8e4m3_to_f32. */
#define CPU_F8_SCALE 0x1p120f
static inline float cpu_f8_to_f32(uint8_t b)
{
    if ((b & 0x7f) == 0x7f)
        return NAN;
    uint32_t u = ((uint32_t)(b & 0x80) << 24) | ((uint32_t)(b & 0x7f) << 20);
    float f;
    memcpy(&f, &u, 4);
    return f * CPU_F8_SCALE;
}

/* One element of any supported dtype at p[i] (p may be unaligned). */
static inline float cpu_elem(dtype_t t, const void *p, int64_t i)
{
    const uint8_t *b = p;
    if (t == DT_F8E4M3)
        return cpu_f8_to_f32(b[i]);
    if (t == DT_F32) {
        float f;
        memcpy(&f, b + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, b + 2 * i, 2);
    return t == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static inline void cpu_store_elem(dtype_t t, void *p, int64_t i, float v)
{
    uint8_t *b = p;
    if (t == DT_F8E4M3) {
        b[i] = f32_to_f8e4m3(v);
    } else if (t == DT_F32) {
        memcpy(b + 4 * i, &v, 4);
    } else {
        uint16_t h = t == DT_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        memcpy(b + 2 * i, &h, 2);
    }
}

#if CPU_AVX512
static inline __mmask16 cpu_mask(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* 16 (masked: fewer, zeros elsewhere) elements of dtype t starting at p[i], as f32. */
static inline __m512 cpu_load16(dtype_t t, const void *p, int64_t i, __mmask16 m)
{
    if (t == DT_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    if (t == DT_F8E4M3) {                          /* cpu_f8_to_f32, 16 lanes */
        __m512i u = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, (const uint8_t *)p + i));
        __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7f));
        __m512i bits = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x80)), 24),
                                       _mm512_slli_epi32(mag, 20));
        __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(CPU_F8_SCALE));
        __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f));
        return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(NAN));
    }
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (t == DT_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* Stores 16 (masked) f32 values as dtype t at p[i]; bf16 rounds to nearest even like f32_to_bf16,
 * fp8 goes through f32_to_f8e4m3 lane by lane (no kernel stores fp8 on a hot path). */
static inline void cpu_store16(dtype_t t, void *p, int64_t i, __m512 v, __mmask16 m)
{
    if (t == DT_F8E4M3) {
        float f[16];
        _mm512_storeu_ps(f, v);
        for (int j = 0; j < 16; j++)
            if ((m >> j) & 1)
                ((uint8_t *)p)[i + j] = f32_to_f8e4m3(f[j]);
    } else if (t == DT_F32) {
        _mm512_mask_storeu_ps((float *)p + i, m, v);
    } else if (t == DT_F16) {
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
        __m512i u = _mm512_castps_si512(v);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
        /* NaN stays a quiet NaN (the rounding add could carry it into infinity). */
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtepi32_epi16(r));
    }
}

/* exp(x) for 16 lanes, within 2 ulp of expf over the normal range (Cephes polynomial on
 * x - n ln2, then scalef by 2^n: underflows to 0, overflows to inf, NaN stays NaN). */
static inline __m512 cpu_exp16(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);   /* NaN in x survives (second operand) */
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

#endif
