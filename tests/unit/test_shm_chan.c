/* The shared-memory tensor channel: segments carry bytes intact, lying announces are refused,
 * and segments of dead processes are swept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transfer/shm_chan.h"

static void test_roundtrip(void **st)
{
    tchan_seg_t out, in;
    char err[256];
    assert_int_equal(tchan_shm_create(&out, "unit", 42, 1 << 20, err, sizeof err), 0);
    for (size_t i = 0; i < (1 << 20); i++)
        ((uint8_t *)out.ptr)[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(tchan_shm_open(&in, (const uint8_t *)out.name, strlen(out.name), 1 << 20, err, sizeof err), 0);
    assert_memory_equal(in.ptr, out.ptr, 1 << 20);
    tchan_shm_close(&in);
    char name[TCHAN_HANDLE_MAX];
    strcpy(name, out.name);
    tchan_shm_close(&out);
    tchan_shm_close(&out);   /* idempotent */
    /* The owner's close unlinked it: a late receiver gets a clear error. */
    assert_int_equal(tchan_shm_open(&in, (const uint8_t *)name, strlen(name), 1 << 20, err, sizeof err), -1);
    assert_non_null(strstr(err, name));
}

static void test_lying_announce(void **st)
{
    tchan_seg_t out, in;
    char err[256];
    assert_int_equal(tchan_shm_create(&out, "unit", 43, 4096, err, sizeof err), 0);
    /* Bigger than the segment: refused, never mapped past its end. */
    assert_int_equal(tchan_shm_open(&in, (const uint8_t *)out.name, strlen(out.name), 8192, err, sizeof err), -1);
    assert_non_null(strstr(err, "4096"));
    /* Names that are not ours or try to escape. */
    const char *bad[] = {"/etc/passwd", "troupe-x", "/troupe-a/../b", "/other-1-2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(tchan_shm_open(&in, (const uint8_t *)bad[i], strlen(bad[i]), 4096, err, sizeof err), -1);
    uint8_t nul[] = {'/', 't', 0, 'x'};
    assert_int_equal(tchan_shm_open(&in, nul, sizeof nul, 4096, err, sizeof err), -1);
    assert_int_equal(tchan_shm_create(&in, "unit", 44, 0, err, sizeof err), -1);
    tchan_shm_close(&out);
}

static void test_sweep_dead_creator(void **st)
{
    /* A child creates a segment and dies without unlinking (as after kill -9). */
    pid_t pid = fork();
    if (pid == 0) {
        tchan_seg_t seg;
        char err[256];
        _exit(tchan_shm_create(&seg, "unitsweep", 1, 4096, err, sizeof err) == 0 ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* A live creator's segment (ours) is kept. */
    tchan_seg_t mine;
    char err[256];
    assert_int_equal(tchan_shm_create(&mine, "unitsweep", 2, 4096, err, sizeof err), 0);
    assert_int_equal(tchan_shm_sweep("unitsweep"), 1);
    assert_int_equal(tchan_shm_sweep("unitsweep"), 0);
    char name[64];
    snprintf(name, sizeof name, "/troupe-unitsweep-%d-1", (int)pid);
    assert_int_equal(shm_open(name, O_RDONLY, 0), -1);
    tchan_shm_close(&mine);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_lying_announce),
        cmocka_unit_test(test_sweep_dead_creator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
