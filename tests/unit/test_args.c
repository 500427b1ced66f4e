/* Checked command-line values of the tools (tools/lib/args.h): what is accepted, what is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tools/lib/args.h"

static void test_int_in_range(void **st)
{
    int x = -7;
    assert_int_equal(arg_int("t", "--n", "42", 1, 100, &x), 0);
    assert_int_equal(x, 42);
    assert_int_equal(arg_int("t", "--n", "-3", -5, 5, &x), 0);
    assert_int_equal(x, -3);
}

static void test_int_refused_leaves_value(void **st)
{
    const char *bad[] = {"", "x", "12x", "1.5", "0", "101", " 5", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int x = 7;
        assert_int_equal(arg_int("t", "--n", bad[i], 1, 100, &x), -1);
        assert_int_equal(x, 7);
    }
}

static void test_double(void **st)
{
    double d = 0;
    assert_int_equal(arg_double("t", "--bw", "4.23", 0, 10, &d), 0);
    assert_true(d == 4.23);
    assert_int_equal(arg_double("t", "--bw", "1e3", 0, 1e9, &d), 0);
    assert_true(d == 1000.0);
    const char *bad[] = {"", "nan", "inf", "-1", "11", "3,5", "1e400"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        d = 9;
        assert_int_equal(arg_double("t", "--bw", bad[i], 0, 10, &d), -1);
        assert_true(d == 9);
    }
}

static void test_list(void **st)
{
    int v[4] = {0};
    assert_int_equal(arg_int_list("t", "--c", "1,16,64", 1, 256, v, 4), 3);
    assert_int_equal(v[0], 1);
    assert_int_equal(v[1], 16);
    assert_int_equal(v[2], 64);
    assert_int_equal(arg_int_list("t", "--c", "256", 1, 256, v, 4), 1);
    assert_int_equal(v[0], 256);
    const char *bad[] = {"", ",", "1,", ",1", "1,,2", "1,0", "1,a", "1 2", "1,2,3,4,5", "257"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(arg_int_list("t", "--c", bad[i], 1, 256, v, 4), -1);
}

static void test_kv_dtype(void **st)
{
    dtype_t t = DT_F32;
    assert_int_equal(arg_kv_dtype("t", "--kv-dtype", "fp8", &t), 0);
    assert_int_equal(t, DT_F8E4M3);
    assert_int_equal(arg_kv_dtype("t", "--kv-dtype", "float8_e4m3fn", &t), 0);
    assert_int_equal(t, DT_F8E4M3);
    assert_int_equal(arg_kv_dtype("t", "--kv-dtype", "bf16", &t), 0);
    assert_int_equal(t, DT_BF16);
    assert_int_equal(arg_kv_dtype("t", "--kv-dtype", "auto", &t), 0);
    assert_int_equal(t, DT_COUNT);
    const char *bad[] = {"", "fp4", "e5m2", "fp8 ", "int8"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t = DT_F16;
        assert_int_equal(arg_kv_dtype("t", "--kv-dtype", bad[i], &t), -1);
        assert_int_equal(t, DT_F16);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int_in_range),
        cmocka_unit_test(test_int_refused_leaves_value),
        cmocka_unit_test(test_double),
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_kv_dtype),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
