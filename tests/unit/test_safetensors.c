/* tests/unit/test_safetensors.c — the safetensors validator: valid files read back exactly, and
 * every kind of malformed file is refused with an error that names the file and the problem. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "engine/safetensors.h"

static char s_dir[256];

static int s_setup(void **state)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/troupe-st-XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Builds 8-byte LE length + header + data; the caller frees. */
static uint8_t *s_image(const char *header, const void *data, size_t dlen, size_t *len)
{
    size_t n = strlen(header);
    *len = 8 + n + dlen;
    uint8_t *b = malloc(*len ? *len : 1);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, header, n);
    if (dlen)
        memcpy(b + 8 + n, data, dlen);
    return b;
}

static void s_write(const char *path, const void *buf, size_t len)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(buf, 1, len, fp), len);
    fclose(fp);
}

/* Parses header+data in memory and from a file; both must fail with err containing the name and
 * every fragment given. */
static void s_expect_fail(const char *header, size_t dlen, ...)
{
    uint8_t data[256];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 7 + 1);
    assert_true(dlen <= sizeof data);
    size_t len;
    uint8_t *img = s_image(header, data, dlen, &len);
    char err[512] = "", path[300];
    st_file_t *f = st_parse(img, len, "mem.safetensors", err, sizeof err);
    assert_null(f);
    assert_non_null(strstr(err, "mem.safetensors"));
    snprintf(path, sizeof path, "%s/bad.safetensors", s_dir);
    s_write(path, img, len);
    char err2[512] = "";
    f = st_open(path, err2, sizeof err2);
    assert_null(f);
    assert_non_null(strstr(err2, path));
    va_list ap;
    va_start(ap, dlen);
    for (const char *frag; (frag = va_arg(ap, const char *));) {
        if (!strstr(err, frag))
            fail_msg("error \"%s\" lacks \"%s\"", err, frag);
    }
    va_end(ap);
    free(img);
}

/* A valid image with all three dtypes; the data starts at an odd offset so pointers are unaligned. */
static const float s_f32[6] = {1.5f, -2.25f, 3.0e-8f, 1.0e30f, -0.0f, 65504.0f};
static const uint16_t s_bf16[4] = {0x3f80, 0xc049, 0x0001, 0x7f7f};   /* 1, -3.140625, denormal, max */
static const uint16_t s_f16[4] = {0x3c00, 0xc248, 0x0001, 0x7bff};    /* 1, -3.140625, denormal, 65504 */

static uint8_t *s_valid(size_t *len)
{
    uint8_t data[24 + 8 + 8];
    memcpy(data, s_f32, 24);
    memcpy(data + 24, s_bf16, 8);
    memcpy(data + 32, s_f16, 8);
    /* Header length 0x9b (odd) on purpose. */
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"c\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[32,40]}}";
    return s_image(hdr, data, sizeof data, len);
}

static void test_valid_values_exact(void **state)
{
    size_t len;
    uint8_t *img = s_valid(&len);
    char path[300], err[512] = "";
    snprintf(path, sizeof path, "%s/ok.safetensors", s_dir);
    s_write(path, img, len);
    st_file_t *f = st_open(path, err, sizeof err);
    assert_non_null(f);
    assert_int_equal(st_count(f), 3);
    assert_string_equal(st_metadata(f, "format"), "pt");
    assert_null(st_metadata(f, "nope"));

    const st_tensor_t *a = st_find(f, "a"), *b = st_find(f, "b"), *c = st_find(f, "c");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_null(st_find(f, "d"));
    assert_int_equal(a->dtype, DT_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nbytes, 24);
    assert_true(((uintptr_t)a->data & 3) != 0);     /* unaligned: header length is odd */
    float got[6];
    dtype_to_f32(DT_F32, a->data, got, 6);
    assert_memory_equal(got, s_f32, sizeof got);    /* bit-exact, including -0.0 */

    assert_int_equal(b->dtype, DT_BF16);
    assert_int_equal(b->ndim, 1);
    assert_int_equal(b->shape[0], 4);
    assert_memory_equal(b->data, s_bf16, 8);
    dtype_to_f32(DT_BF16, b->data, got, 4);
    assert_true(got[0] == 1.0f && got[1] == -3.140625f && got[2] > 0 && got[2] < 1e-38f);

    assert_int_equal(c->dtype, DT_F16);
    assert_int_equal(c->ndim, 2);
    assert_memory_equal(c->data, s_f16, 8);
    dtype_to_f32(DT_F16, c->data, got, 4);
    assert_true(got[0] == 1.0f && got[1] == -3.140625f && got[2] == 5.9604644775390625e-8f && got[3] == 65504.0f);

    /* Sorted by name, and the name is reported. */
    assert_string_equal(st_at(f, 0)->name, "a");
    assert_string_equal(st_at(f, 2)->name, "c");
    assert_null(st_at(f, 3));
    assert_string_equal(st_name(f), path);
    st_destroy(&f);
    assert_null(f);
    st_destroy(&f);                                  /* idempotent */
    free(img);
}

static void test_truncated_every_length(void **state)
{
    size_t len;
    uint8_t *img = s_valid(&len);
    char path[300];
    snprintf(path, sizeof path, "%s/trunc.safetensors", s_dir);
    for (size_t n = 0; n < len; n++) {
        char err[512] = "";
        uint8_t *copy = malloc(n ? n : 1);          /* exact size so ASan sees any over-read */
        memcpy(copy, img, n);
        st_file_t *f = st_parse(copy, n, "trunc", err, sizeof err);
        if (f)
            fail_msg("truncated image of %zu/%zu bytes was accepted", n, len);
        assert_non_null(strstr(err, "trunc"));
        if (n < 8)
            assert_non_null(strstr(err, "too short"));
        else if (n < len - 40)
            assert_non_null(strstr(err, "runs past the end"));
        else
            assert_non_null(strstr(err, "outside the data region"));
        s_write(path, img, n);
        err[0] = '\0';
        f = st_open(path, err, sizeof err);
        assert_null(f);
        assert_non_null(strstr(err, path));
        free(copy);
    }
    free(img);
}

static void test_header_length(void **state)
{
    uint8_t b[16] = {0};
    char err[512];
    /* 100,000,001 > limit */
    uint64_t n = 100000001ull;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(n >> (8 * i));
    assert_null(st_parse(b, sizeof b, "big", err, sizeof err));
    assert_non_null(strstr(err, "big: header length 100000001 exceeds"));
    /* Huge (2^64 - 1) must not wrap around in 8 + N. */
    memset(b, 0xff, 8);
    assert_null(st_parse(b, sizeof b, "huge", err, sizeof err));
    assert_non_null(strstr(err, "exceeds"));
    /* Within the limit but longer than the file. */
    n = 9;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(n >> (8 * i));
    b[8] = '{';
    assert_null(st_parse(b, sizeof b, "long", err, sizeof err));
    assert_non_null(strstr(err, "long: header length 9 runs past the end of the file (16 bytes)"));
    /* Zero-length header. */
    memset(b, 0, 8);
    assert_null(st_parse(b, 8, "zero", err, sizeof err));
    assert_non_null(strstr(err, "does not start with '{'"));
}

static void test_not_json_or_object(void **state)
{
    s_expect_fail("[1,2]", 0, "does not start with '{'", NULL);
    s_expect_fail(" {}", 0, "does not start with '{'", NULL);
    s_expect_fail("{\"a\":", 0, "not valid JSON", NULL);
    s_expect_fail("{} trailing", 0, "not valid JSON", NULL);
    s_expect_fail("{\"a\xff\":{}}", 0, "not valid JSON", NULL);          /* bad UTF-8 */
    s_expect_fail("{\"a\\u0000b\":{}}", 0, "not valid JSON", NULL);       /* NUL in a name */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "not valid JSON", "duplicate", NULL);
    s_expect_fail("{\"a\":[]}", 0, "tensor 'a'", "not an object", NULL);
    s_expect_fail("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__", "not a string", NULL);
    s_expect_fail("{\"__metadata__\":[]}", 0, "__metadata__", "not an object", NULL);
}

static void test_offsets(void **state)
{
    /* Outside the data region. */
    s_expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "tensor 'w'",
                  "outside the data region (4 bytes)", NULL);
    /* begin > end */
    s_expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "tensor 'w'",
                  "begin after end", NULL);
    /* A gap between two tensors. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "gap", "[4, 8)", "'b'", NULL);
    /* A gap at the start. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap", "[0, 4)", NULL);
    /* Overlap. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "'b'", "overlaps", "'a'", NULL);
    /* Same range twice (aliasing). */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "overlaps", NULL);
    /* Trailing bytes after the last tensor. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, "cover 4 bytes of a 6-byte",
                  NULL);
    s_expect_fail("{}", 3, "no tensors but a data region of 3 bytes", NULL);
    /* Wrong arity / type of data_offsets. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets", NULL);
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "data_offsets", NULL);
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "data_offsets", NULL);
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4, "data_offsets", NULL);
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets", NULL);
}

static void test_shapes_and_dtypes(void **state)
{
    /* Byte length != shape x dtype size. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "tensor 'a'",
                  "span 8 bytes but shape [3] x F32 (4 bytes) needs 12", NULL);
    s_expect_fail("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, "needs 8", NULL);
    /* Shape product overflow: [2^40, 2^40]. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,0]}}", 0,
                  "tensor 'a'", "overflows", NULL);
    /* Element count fits but bytes do not: 2^62 F32 elements. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                  "overflows", NULL);
    /* Negative / non-integer dims. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, "tensor 'a'",
                  "shape[0] is not a non-negative integer", NULL);
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,0]}}", 0, "shape[1]", NULL);
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,0]}}", 0, "\"shape\"", NULL);
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                  "9 dimensions", NULL);
    /* Unsupported and unknown dtypes name the tensor. */
    s_expect_fail("{\"ids\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "tensor 'ids'",
                  "unsupported dtype 'U64'", NULL);
    s_expect_fail("{\"q\":{\"dtype\":\"F8_E5M2\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "tensor 'q'",
                  "unsupported dtype 'F8_E5M2'", NULL);
    s_expect_fail("{\"q\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "unsupported dtype 'Q4_K'",
                  NULL);
    s_expect_fail("{\"q\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "\"dtype\"", NULL);
}

static void test_edge_valid(void **state)
{
    char err[512] = "";
    /* No tensors, no data. */
    size_t len;
    uint8_t *img = s_image("{}", NULL, 0, &len);
    st_file_t *f = st_parse(img, len, "empty", err, sizeof err);
    assert_non_null(f);
    assert_int_equal(st_count(f), 0);
    assert_null(st_find(f, "x"));
    st_destroy(&f);
    free(img);
    /* A scalar, a zero-size tensor sharing its offset, header padded with spaces (as writers do). */
    float one = 1.0f;
    img = s_image("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                  "\"z\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[4,4]}}     ", &one, 4, &len);
    f = st_parse(img, len, "edge", err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    const st_tensor_t *s = st_find(f, "s"), *z = st_find(f, "z");
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->nbytes, 4);
    assert_int_equal(z->nbytes, 0);
    assert_int_equal(z->shape[1], 5);
    float v;
    memcpy(&v, s->data, 4);
    assert_true(v == 1.0f);
    st_destroy(&f);
    free(img);
}

static void test_open_errors(void **state)
{
    char err[512] = "", path[300];
    snprintf(path, sizeof path, "%s/missing.safetensors", s_dir);
    assert_null(st_open(path, err, sizeof err));
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "cannot open"));
    assert_null(st_open(s_dir, err, sizeof err));
    assert_non_null(strstr(err, "not a regular file"));
}

/* Inputs the fuzzer found or that once broke parsers of this format (kept as regressions). */
static void test_regressions(void **state)
{
    /* A zero-size tensor placed inside another tensor's range is an overlap, not a free ride. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, "overlaps", NULL);
    /* An overflowing prefix is an error even when a later dimension is 0 (the reference's checked fold). */
    s_expect_fail("{\"e\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,4,0],\"data_offsets\":[0,0]}}", 0,
                  "overflows", NULL);
    /* An integer too large for int64 is refused by the JSON parser. */
    s_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,0]}}", 0,
                  "not valid JSON", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_values_exact),
        cmocka_unit_test(test_truncated_every_length),
        cmocka_unit_test(test_header_length),
        cmocka_unit_test(test_not_json_or_object),
        cmocka_unit_test(test_offsets),
        cmocka_unit_test(test_shapes_and_dtypes),
        cmocka_unit_test(test_edge_valid),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_regressions),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
