/* tests/unit/test_step_trace.c — the decode worker's step trace (actors/worker/step_trace.h):
 * off, it writes nothing and every call is a no-op; on, each event is one line of the documented
 * form (parsed back field by field, the numbers checked), the chunks recorded before a step land
 * on its line in order and not on the next, holds are counted and reset, gap is -1 for the first
 * step and the time since the previous step's end after; "%p" becomes the pid; a path that cannot
 * be opened is an error naming the knob. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/worker/step_trace.h"

static char s_path[256];

static int s_setup(void **st)
{
    snprintf(s_path, sizeof s_path, "/tmp/troupe-test-step-trace-%ld.txt", (long)getpid());
    return 0;
}

static int s_teardown(void **st)
{
    unlink(s_path);
    return 0;
}

/* The file's lines (at most max, each up to 511 bytes); returns how many. */
static int s_lines(const char *path, char lines[][512], int max)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int n = 0;
    while (n < max && fgets(lines[n], 512, f))
        n++;
    fclose(f);
    return n;
}

static void test_off_writes_nothing(void **st)
{
    step_trace_t t;
    char err[256];
    assert_int_equal(step_trace_open(&t, NULL, 16, err, sizeof err), 0);
    assert_false(step_trace_on(&t));
    assert_int_equal(step_trace_open(&t, "", 16, err, sizeof err), 0);
    assert_false(step_trace_on(&t));
    step_trace_arrive(&t, 1, 10, 0);
    step_trace_chunk(&t, 1, 10);
    step_trace_hold(&t);
    step_trace_step(&t, &(step_trace_step_t){.dec = 1});
    step_trace_end(&t, 1);
    step_trace_idle(&t);
    assert_int_equal(t.n_chunks, 0);
    step_trace_close(&t);
    step_trace_close(&t);   /* idempotent */
}

static void test_lines_well_formed(void **st)
{
    step_trace_t t;
    char err[256];
    assert_int_equal(step_trace_open(&t, s_path, 4, err, sizeof err), 0);
    assert_true(step_trace_on(&t));
    step_trace_arrive(&t, 7, 1000, 0);
    step_trace_arrive(&t, 8, 300, 1);
    step_trace_chunk(&t, 7, 600);
    step_trace_chunk(&t, 9, 48);
    step_trace_hold(&t);
    step_trace_hold(&t);
    const int64_t base = 5000000000LL;   /* now_ns-like: 5 s */
    step_trace_step(&t, &(step_trace_step_t){.begin_ns = base, .fwd_begin_ns = base + 20000, .fwd_end_ns = base + 7020000,
                                             .end_ns = base + 7100000, .dec = 15, .prm = 2, .ptok = 600, .rtok = 48,
                                             .waiting = 1, .prompting = 3, .preempted = 1, .pos = 663,
                                             .graph = 'r'});
    /* No chunk recorded: "-"; holds back to 0; gap from the last end (7.1 ms) to this begin (8 ms). */
    step_trace_step(&t, &(step_trace_step_t){.begin_ns = base + 8000000, .fwd_begin_ns = base + 8010000,
                                             .fwd_end_ns = base + 9010000, .end_ns = base + 9050000, .dec = 16,
                                             .pos = 16, .graph = 'p'});
    /* More chunks than rows: the extra ones are left out, not written past the arrays. */
    for (int i = 0; i < 6; i++)
        step_trace_chunk(&t, 100 + (uint64_t)i, 10);
    step_trace_step(&t, &(step_trace_step_t){.begin_ns = base + 9050000, .fwd_begin_ns = base + 9050000,
                                             .fwd_end_ns = base + 9060000, .end_ns = base + 9070000, .prm = 6});
    step_trace_end(&t, 7);
    step_trace_idle(&t);   /* flushed: readable before the close */

    char lines[16][512];
    const int n = s_lines(s_path, lines, 16);
    assert_int_equal(n, 7);
    long pid = 0;
    assert_int_equal(sscanf(lines[0], "# troupe step trace v2 pid=%ld", &pid), 1);
    assert_int_equal(pid, (long)getpid());

    long long tt;
    unsigned long long id;
    int ntok;
    char src;
    assert_int_equal(sscanf(lines[1], "arrive t=%lld id=%llu ntok=%d src=%c", &tt, &id, &ntok, &src), 4);
    assert_true(tt > 0);
    assert_int_equal(id, 7);
    assert_int_equal(ntok, 1000);
    assert_int_equal(src, 'p');
    assert_int_equal(sscanf(lines[2], "arrive t=%lld id=%llu ntok=%d src=%c", &tt, &id, &ntok, &src), 4);
    assert_int_equal(id, 8);
    assert_int_equal(src, 'h');

    long long t0, gap, sch, fwd, post;
    int dec, prm, ptok, rtok, wait, prompting, pre, holds, pos;
    char graph, chunks[256];
    const char *fmt = "step t=%lld gap=%lld sched=%lld fwd=%lld post=%lld dec=%d prm=%d ptok=%d rtok=%d wait=%d "
                      "prompting=%d pre=%d holds=%d pos=%d graph=%c chunks=%255s";
    assert_int_equal(sscanf(lines[3], fmt, &t0, &gap, &sch, &fwd, &post, &dec, &prm, &ptok, &rtok, &wait, &prompting,
                            &pre, &holds, &pos, &graph, chunks), 16);
    assert_int_equal(t0, base / 1000);
    assert_int_equal(gap, -1);
    assert_int_equal(sch, 20);
    assert_int_equal(fwd, 7000);
    assert_int_equal(post, 80);
    assert_int_equal(dec, 15);
    assert_int_equal(prm, 2);
    assert_int_equal(ptok, 600);
    assert_int_equal(rtok, 48);
    assert_int_equal(wait, 1);
    assert_int_equal(prompting, 3);
    assert_int_equal(pre, 1);
    assert_int_equal(holds, 2);
    assert_int_equal(pos, 663);
    assert_int_equal(graph, 'r');
    assert_string_equal(chunks, "7:600,9:48");
    assert_int_equal(lines[3][strlen(lines[3]) - 1], '\n');

    assert_int_equal(sscanf(lines[4], fmt, &t0, &gap, &sch, &fwd, &post, &dec, &prm, &ptok, &rtok, &wait, &prompting,
                            &pre, &holds, &pos, &graph, chunks), 16);
    assert_int_equal(gap, 900);
    assert_int_equal(fwd, 1000);
    assert_int_equal(dec, 16);
    assert_int_equal(holds, 0);
    assert_int_equal(pos, 16);
    assert_int_equal(graph, 'p');
    assert_string_equal(chunks, "-");

    assert_int_equal(sscanf(lines[5], fmt, &t0, &gap, &sch, &fwd, &post, &dec, &prm, &ptok, &rtok, &wait, &prompting,
                            &pre, &holds, &pos, &graph, chunks), 16);
    assert_int_equal(gap, 0);
    assert_int_equal(graph, 'e');   /* none set: launched one by one */
    assert_string_equal(chunks, "100:10,101:10,102:10,103:10");

    assert_int_equal(sscanf(lines[6], "end t=%lld id=%llu", &tt, &id), 2);
    assert_int_equal(id, 7);
    step_trace_close(&t);
    assert_false(step_trace_on(&t));
}

static void test_pid_in_path(void **st)
{
    char pattern[256], expect[256], err[256];
    snprintf(pattern, sizeof pattern, "/tmp/troupe-test-step-trace-pid-%%p.txt");
    snprintf(expect, sizeof expect, "/tmp/troupe-test-step-trace-pid-%ld.txt", (long)getpid());
    unlink(expect);
    step_trace_t t;
    assert_int_equal(step_trace_open(&t, pattern, 1, err, sizeof err), 0);
    step_trace_close(&t);
    assert_int_equal(access(expect, R_OK), 0);
    unlink(expect);
}

static void test_bad_path_is_an_error(void **st)
{
    step_trace_t t;
    char err[256] = "";
    assert_int_equal(step_trace_open(&t, "/nonexistent-dir-of-troupe/trace.txt", 4, err, sizeof err), -1);
    assert_false(step_trace_on(&t));
    assert_non_null(strstr(err, "TROUPE_STEP_TRACE"));
    step_trace_close(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_writes_nothing),
        cmocka_unit_test(test_lines_well_formed),
        cmocka_unit_test(test_pid_in_path),
        cmocka_unit_test(test_bad_path_is_an_error),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
