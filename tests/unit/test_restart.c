/* Restart decisions of the supervisor: intensity window, OTP restart kinds, affected sets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "tools/lib/restart.h"

/* Builds wait statuses the way the kernel does, without forking. */
static int s_exited(int code) { return (code & 0xff) << 8; }
static int s_signaled(int sig) { return sig & 0x7f; }

static void test_window_limits_restarts_in_period(void **st)
{
    restart_window_t w;
    assert_int_equal(restart_window_init(&w, 3, 1000), 0);
    assert_true(restart_window_allow(&w, 0));
    assert_true(restart_window_allow(&w, 100));
    assert_true(restart_window_allow(&w, 200));
    assert_false(restart_window_allow(&w, 300));     /* 4th within 1 s: give up */
    restart_window_free(&w);
}

static void test_window_forgets_old_restarts(void **st)
{
    restart_window_t w;
    assert_int_equal(restart_window_init(&w, 2, 1000), 0);
    assert_true(restart_window_allow(&w, 0));
    assert_true(restart_window_allow(&w, 500));
    assert_false(restart_window_allow(&w, 999));
    assert_true(restart_window_allow(&w, 1000));     /* the one at 0 left the window */
    assert_true(restart_window_allow(&w, 1500));     /* and the one at 500 */
    assert_false(restart_window_allow(&w, 1600));
    /* A slow trickle never gives up. */
    for (int64_t t = 10000; t < 100000; t += 600)
        assert_true(restart_window_allow(&w, t));
    restart_window_free(&w);
}

static void test_window_zero_means_never(void **st)
{
    restart_window_t w;
    assert_int_equal(restart_window_init(&w, 0, 1000), 0);
    assert_false(restart_window_allow(&w, 0));
    restart_window_free(&w);
    assert_int_equal(restart_window_init(&w, -1, 1000), -1);
    assert_int_equal(restart_window_init(&w, 1, 0), -1);
}

static void test_restart_kinds(void **st)
{
    assert_true(WIFEXITED(s_exited(0)) && WEXITSTATUS(s_exited(3)) == 3);
    assert_true(WIFSIGNALED(s_signaled(SIGKILL)));
    assert_true(restart_wanted(TOPO_RESTART_PERMANENT, s_exited(0)));
    assert_true(restart_wanted(TOPO_RESTART_PERMANENT, s_signaled(SIGKILL)));
    assert_false(restart_wanted(TOPO_RESTART_TRANSIENT, s_exited(0)));
    assert_true(restart_wanted(TOPO_RESTART_TRANSIENT, s_exited(1)));
    assert_true(restart_wanted(TOPO_RESTART_TRANSIENT, s_signaled(SIGSEGV)));
    assert_false(restart_wanted(TOPO_RESTART_TEMPORARY, s_exited(1)));
    assert_false(restart_wanted(TOPO_RESTART_TEMPORARY, s_signaled(SIGKILL)));
}

static void test_affected_sets(void **st)
{
    int out[8];
    assert_int_equal(restart_affected(TOPO_STRATEGY_ONE_FOR_ONE, 2, 5, out), 1);
    assert_int_equal(out[0], 2);
    assert_int_equal(restart_affected(TOPO_STRATEGY_REST_FOR_ONE, 2, 5, out), 3);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 3);
    assert_int_equal(out[2], 4);
    assert_int_equal(restart_affected(TOPO_STRATEGY_REST_FOR_ONE, 4, 5, out), 1);
    assert_int_equal(restart_affected(TOPO_STRATEGY_ONE_FOR_ONE, 5, 5, out), 0);
    assert_int_equal(restart_affected(TOPO_STRATEGY_ONE_FOR_ONE, -1, 5, out), 0);
}

static void test_describe_status(void **st)
{
    char b[96];
    assert_string_equal(restart_describe_status(s_exited(1), b, sizeof b), "exit 1");
    assert_non_null(strstr(restart_describe_status(s_signaled(9), b, sizeof b), "signal 9"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_limits_restarts_in_period),
        cmocka_unit_test(test_window_forgets_old_restarts),
        cmocka_unit_test(test_window_zero_means_never),
        cmocka_unit_test(test_restart_kinds),
        cmocka_unit_test(test_affected_sets),
        cmocka_unit_test(test_describe_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
