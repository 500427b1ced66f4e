/* u64map against a brute-force model under random puts and deletes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "common/u64map.h"

static void test_against_model(void **st)
{
    enum { N = 4000 };
    static uint64_t keys[N], vals[N];
    static int present[N];
    u64map_t m;
    assert_int_equal(u64map_init(&m, 4), 0);
    srand(7);
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)(i % 50 == 0 ? (uint64_t)i + 1 : ((uint64_t)rand() << 32 | (uint64_t)rand()) | 1);
    for (int step = 0; step < 200000; step++) {
        int i = rand() % N;
        if (rand() % 3) {
            vals[i] = (uint64_t)rand();
            assert_int_equal(u64map_put(&m, keys[i], vals[i]), 0);
            present[i] = 1;
        } else {
            assert_int_equal(u64map_del(&m, keys[i]), present[i]);
            present[i] = 0;
        }
        if (step % 997 == 0) {
            size_t n = 0;
            for (int k = 0; k < N; k++) {
                uint64_t *v = u64map_get(&m, keys[k]);
                if (present[k]) {
                    assert_non_null(v);
                    assert_true(*v == vals[k]);
                    n++;
                } else {
                    assert_null(v);
                }
            }
            assert_int_equal(n, m.n);
        }
    }
    assert_int_equal(u64map_put(&m, 0, 1), -1);
    assert_null(u64map_get(&m, 0));
    u64map_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_model)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
