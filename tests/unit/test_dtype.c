/* tests/unit/test_dtype.c — the element types' names and conversions (common/dtype.h), above all
 * FP8 E4M3: every code decoded against the format's definition, the encoder against a brute-force
 * nearest-code search (ties to the even code, saturation at +-448 like CUDA's satfinite), and the
 * hand-picked edges where a rounding bug would show: ties in the normal and subnormal ranges, the
 * carry into the next binade, the smallest subnormal and half of it, signed zero, NaN. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"

/* The E4M3 value of a code from the format's definition, in double: 4 exponent bits (bias 7),
 * 3 mantissa bits, subnormals at e = 0, S.1111.111 NaN, no infinities. */
static double s_e4m3_def(uint8_t b)
{
    const int e = (b >> 3) & 0xf, m = b & 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1 + m / 8.0, e - 7);
    return (b & 0x80) ? -v : v;
}

/* The code f32_to_f8e4m3 must give, by search: the nearest of the 127 finite magnitudes
 * (0x00..0x7e), a tie to the one with the even code, anything at or past 448 clamped to 0x7e. */
static uint8_t s_e4m3_nearest(float f)
{
    if (isnan(f))
        return signbit(f) ? 0xff : 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const double a = fabs((double)f);
    if (a >= 448)
        return sign | 0x7e;
    static double mag[0x7f];
    if (mag[0x7e] == 0)
        for (int c = 0; c <= 0x7e; c++)
            mag[c] = s_e4m3_def((uint8_t)c);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        double dc = fabs(mag[c] - a), db = fabs(mag[best] - a);
        if (dc < db || (dc == db && !(c & 1)))
            best = c;
    }
    return sign | (uint8_t)best;
}

static void test_names(void **state)
{
    dtype_t t = DT_F32;
    assert_string_equal(dtype_name(DT_F8E4M3), "fp8");
    assert_int_equal(dtype_size(DT_F8E4M3), 1);
    assert_int_equal(dtype_size(DT_BF16), 2);
    assert_int_equal(dtype_size(DT_F32), 4);
    static const char *const fp8[] = {"fp8", "FP8", "f8e4m3", "fp8_e4m3", "float8_e4m3fn"};
    for (size_t i = 0; i < sizeof fp8 / sizeof fp8[0]; i++) {
        t = DT_F32;
        assert_int_equal(dtype_parse_kv(fp8[i], &t), 0);
        assert_int_equal(t, DT_F8E4M3);
    }
    assert_int_equal(dtype_parse_kv("bfloat16", &t), 0);
    assert_int_equal(t, DT_BF16);
    /* fp8 is a KV type only: the weight parser refuses it; nobody takes e5m2. */
    t = DT_F16;
    assert_int_equal(dtype_parse("fp8", &t), -1);
    assert_int_equal(dtype_parse_kv("fp8_e5m2", &t), -1);
    assert_int_equal(dtype_parse_kv("auto", &t), -1);
    assert_int_equal(t, DT_F16);
}

/* All 256 codes: decoded exactly as the definition says; re-encoded to themselves; NaN codes
 * (0x7f, 0xff) decode to NaN of their sign; the finite codes are in strictly increasing order. */
static void test_fp8_every_code(void **state)
{
    for (int c = 0; c < 256; c++) {
        const uint8_t b = (uint8_t)c;
        const float f = f8e4m3_to_f32(b);
        if ((b & 0x7f) == 0x7f) {
            if (!isnan(f))
                fail_msg("code 0x%02x decodes to %g, expected NaN", c, f);
            assert_int_equal(!!signbit(f), !!(b & 0x80));
        } else if ((double)f != s_e4m3_def(b) || !!signbit(f) != !!(b & 0x80)) {
            fail_msg("code 0x%02x decodes to %a, expected %a", c, f, s_e4m3_def(b));
        }
        if (f32_to_f8e4m3(f) != b)
            fail_msg("code 0x%02x -> %a -> 0x%02x", c, f, f32_to_f8e4m3(f));
    }
    for (int c = 1; c <= 0x7e; c++)
        assert_true(f8e4m3_to_f32((uint8_t)c) > f8e4m3_to_f32((uint8_t)(c - 1)));
    assert_true(f8e4m3_to_f32(0x7e) == 448.0f);
    assert_true(f8e4m3_to_f32(0x01) == ldexpf(1, -9));
    assert_true(f8e4m3_to_f32(0x08) == ldexpf(1, -6));

    /* The array conversions use the same codes, one byte per element. */
    uint8_t codes[256], back[256];
    float f[256];
    for (int c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    dtype_to_f32(DT_F8E4M3, codes, f, 256);
    dtype_from_f32(DT_F8E4M3, f, back, 256);
    assert_memory_equal(codes, back, 256);
}

static void s_expect_code(float f, uint8_t want)
{
    const uint8_t got = f32_to_f8e4m3(f);
    if (got != want)
        fail_msg("f32_to_f8e4m3(%a = %.9g) = 0x%02x, expected 0x%02x", f, f, got, want);
}

static void test_fp8_rounding_edges(void **state)
{
    /* Normal range, ties to even: 1 = 0x38, 1.125 = 0x39, 1.25 = 0x3a. */
    s_expect_code(1.0625f, 0x38);                       /* tie: even 0x38 */
    s_expect_code(nextafterf(1.0625f, 2), 0x39);
    s_expect_code(1.1875f, 0x3a);                       /* tie: even 0x3a */
    s_expect_code(nextafterf(1.1875f, 0), 0x39);
    s_expect_code(-1.1875f, 0xba);
    s_expect_code(1.9375f, 0x40);                       /* tie between 1.875 and 2: carries into 2^1 */
    s_expect_code(ldexpf(1.0625f, -6), 0x08);           /* tie in the smallest normal binade */
    s_expect_code(ldexpf(1.1875f, -6), 0x0a);
    s_expect_code(432.0f, 0x7e);                        /* tie between 416 (0x7d) and 448: even 0x7e */
    s_expect_code(nextafterf(432.0f, 0), 0x7d);

    /* Subnormals: multiples of 2^-9, ties to even. */
    s_expect_code(ldexpf(1, -9), 0x01);                 /* the smallest subnormal */
    s_expect_code(ldexpf(1, -10), 0x00);                /* half of it: a tie, to even 0 */
    s_expect_code(nextafterf(ldexpf(1, -10), 1), 0x01);
    s_expect_code(-ldexpf(1, -10), 0x80);               /* to zero, keeping the sign */
    s_expect_code(ldexpf(3, -10), 0x02);                /* 1.5 x 2^-9: tie, even 2 */
    s_expect_code(ldexpf(5, -10), 0x02);                /* 2.5 x 2^-9: tie, even 2 */
    s_expect_code(ldexpf(7, -10), 0x04);                /* 3.5 x 2^-9: tie, even 4 */
    s_expect_code(ldexpf(15, -10), 0x08);               /* 7.5 x 2^-9: tie, up to the smallest normal */
    s_expect_code(1e-40f, 0x00);                        /* an f32 subnormal */

    /* Saturation (satfinite): the largest finite value and everything past it. */
    s_expect_code(448.0f, 0x7e);
    s_expect_code(464.0f, 0x7e);                        /* the tie that round-to-nearest would take to 512 */
    s_expect_code(1e9f, 0x7e);
    s_expect_code(INFINITY, 0x7e);
    s_expect_code(-INFINITY, 0xfe);
    s_expect_code(-500.0f, 0xfe);

    /* Signed zero and NaN. */
    s_expect_code(0.0f, 0x00);
    s_expect_code(-0.0f, 0x80);
    assert_true(signbit(f8e4m3_to_f32(0x80)) && f8e4m3_to_f32(0x80) == 0);
    s_expect_code(NAN, 0x7f);
    s_expect_code(-NAN, 0xff);
}

/* f32_to_f8e4m3 against the search on 2^18 f32 values around the format's range (exponents
 * 2^-12 .. 2^10, any mantissa bits, both signs), plus every f32 tie point between neighbours. */
static void test_fp8_against_search(void **state)
{
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < (1 << 18); i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        uint32_t u = (uint32_t)(r & 0x807fffffu) | ((uint32_t)(127 - 12 + (r >> 40) % 23) << 23);
        float f;
        memcpy(&f, &u, 4);
        uint8_t want = s_e4m3_nearest(f);
        if (f32_to_f8e4m3(f) != want)
            fail_msg("f32_to_f8e4m3(%a) = 0x%02x, search says 0x%02x", f, f32_to_f8e4m3(f), want);
    }
    for (int c = 0; c < 0x7e; c++) {
        float mid = (float)((s_e4m3_def((uint8_t)c) + s_e4m3_def((uint8_t)(c + 1))) / 2);   /* exact in f32 */
        s_expect_code(mid, s_e4m3_nearest(mid));
        s_expect_code(-mid, s_e4m3_nearest(-mid));
        assert_int_equal(f32_to_f8e4m3(mid), c & 1 ? c + 1 : c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_fp8_every_code),
        cmocka_unit_test(test_fp8_rounding_edges),
        cmocka_unit_test(test_fp8_against_search),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
