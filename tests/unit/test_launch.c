/* tests/unit/test_launch.c — launch command construction for local, ssh and srun nodes.
 *
 * The quoting is proven by execution, not by string comparison alone: the ssh command string is
 * run through /bin/sh (exactly what the remote login shell does with it) against a fake actor
 * binary in a directory whose name holds spaces, quotes, $, backticks, a tab and a newline; the
 * fake binary writes its working directory and arguments, which must come back unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/lib/launch.h"

#define NODES_YAML                                                                       \
    "name: l\nmodel:\n  path: m\n"                                                       \
    "nodes:\n"                                                                           \
    "  - name: head\n    address: 10.0.0.1\n"                                            \
    "  - name: w1\n    address: 10.0.0.2\n    launch: ssh\n"                             \
    "    ssh: \"ssh -p 2222 -o 'ProxyCommand=ssh -W %h:%p bastion' {address}\"\n"        \
    "    workdir: /srv/troupe\n"                                                         \
    "  - name: gpu-17\n    address: 10.0.0.3\n    launch: srun\n"                        \
    "actors:\n  - role: monitor\n  - role: router\n"                                     \
    "  - role: prefill\n    node: w1\n  - role: decode\n    node: gpu-17\n    count: 2\n" \
    "  - role: cache-manager\n"

static topo_t *s_topo(void)
{
    topo_t *t = NULL;
    topo_errors_t *e = calloc(1, sizeof *e);
    assert_non_null(e);
    int rc = topo_load_string(NODES_YAML, strlen(NODES_YAML), "launch.yaml", &t, e);
    if (rc != 0)
        topo_errors_print(e, stderr);
    free(e);
    assert_int_equal(rc, 0);
    return t;
}

static void s_assert_argv(char **argv, const char *const *expected)
{
    int i = 0;
    for (; expected[i]; i++) {
        assert_non_null(argv[i]);
        assert_string_equal(argv[i], expected[i]);
    }
    assert_null(argv[i]);
}

static void test_quote_and_split(void **state)
{
    (void)state;
    char *q = launch_shell_quote("it's a $HOME `x`");
    assert_string_equal(q, "'it'\\''s a $HOME `x`'");
    free(q);
    q = launch_shell_quote("");
    assert_string_equal(q, "''");
    free(q);

    char **w = NULL;
    char err[256];
    assert_int_equal(launch_split_words("  ssh  -o 'A B' \"C \\\"D\\\" \\$E\" F\\ G {address} ", &w, err,
                                        sizeof err), 6);
    static const char *const want[] = { "ssh", "-o", "A B", "C \"D\" $E", "F G", "{address}", NULL };
    s_assert_argv(w, want);
    launch_free_argv(&w);
    assert_null(w);
    launch_free_argv(&w);                /* idempotent */
    assert_int_equal(launch_split_words("ssh 'open", &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "unterminated '"));
    assert_null(w);
    assert_int_equal(launch_split_words("ssh \"open", &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "unterminated \""));
    assert_int_equal(launch_split_words("   ", &w, err, sizeof err), 0);
    assert_null(w[0]);
    launch_free_argv(&w);
}

static void test_local(void **state)
{
    (void)state;
    topo_t *t = s_topo();
    char **argv = NULL;
    char err[256];
    assert_int_equal(launch_build_argv(t, topo_find(t, "router"), "/opt/troupe/bin", "/etc/c.yaml", &argv,
                                       err, sizeof err), 0);
    static const char *const want[] = { "/opt/troupe/bin/troupe-router", "--topology", "/etc/c.yaml",
                                        "--name", "router", NULL };
    s_assert_argv(argv, want);
    launch_free_argv(&argv);

    /* Relative paths become absolute (joined to the current directory). */
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(launch_build_argv(t, topo_find(t, "cache-manager"), "build/bin", "./topo.yaml", &argv,
                                       err, sizeof err), 0);
    char bin[4200], topo[4200];
    snprintf(bin, sizeof bin, "%s/build/bin/troupe-cache-manager", cwd);
    snprintf(topo, sizeof topo, "%s/topo.yaml", cwd);
    const char *const want2[] = { bin, "--topology", topo, "--name", "cache-manager", NULL };
    s_assert_argv(argv, want2);
    launch_free_argv(&argv);

    /* No topology path: the actor loads the embedded default. */
    assert_int_equal(launch_build_argv(t, topo_find(t, "monitor"), "/b", NULL, &argv, err, sizeof err), 0);
    static const char *const want3[] = { "/b/troupe-monitor", "--name", "monitor", NULL };
    s_assert_argv(argv, want3);
    launch_free_argv(&argv);

    assert_int_equal(launch_build_argv(t, topo_find(t, "monitor"), NULL, NULL, &argv, err, sizeof err), -1);
    assert_non_null(strstr(err, "no binary directory"));
    assert_null(argv);
    topo_destroy(&t);
}

static void test_ssh(void **state)
{
    (void)state;
    topo_t *t = s_topo();
    char **argv = NULL;
    char err[256];
    assert_int_equal(launch_build_argv(t, topo_find(t, "prefill"), "/opt/troupe/bin", "/etc/c.yaml", &argv,
                                       err, sizeof err), 0);
    static const char *const want[] = {
        "ssh", "-p", "2222", "-o", "ProxyCommand=ssh -W %h:%p bastion", "10.0.0.2", "--",
        "cd '/srv/troupe' && exec '/opt/troupe/bin/troupe-prefill' --topology '/etc/c.yaml' --name 'prefill'",
        NULL
    };
    s_assert_argv(argv, want);
    launch_free_argv(&argv);

    /* The default template, {node}, and no workdir: cd to the supervisor's directory. */
    snprintf(t->nodes[1].ssh, sizeof t->nodes[1].ssh, "ssh -o BatchMode=yes {address} -l {node}");
    t->nodes[1].workdir[0] = '\0';
    assert_int_equal(launch_build_argv(t, topo_find(t, "prefill"), "/b", NULL, &argv, err, sizeof err), 0);
    char cwd[4096], cmd[4300];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(cmd, sizeof cmd, "cd '%s' && exec '/b/troupe-prefill' --name 'prefill'", cwd);
    const char *const want2[] = { "ssh", "-o", "BatchMode=yes", "10.0.0.2", "-l", "w1", "--", cmd, NULL };
    s_assert_argv(argv, want2);
    launch_free_argv(&argv);

    snprintf(t->nodes[1].ssh, sizeof t->nodes[1].ssh, "ssh 'broken");
    assert_int_equal(launch_build_argv(t, topo_find(t, "prefill"), "/b", NULL, &argv, err, sizeof err), -1);
    assert_non_null(strstr(err, "unterminated"));
    assert_null(argv);
    topo_destroy(&t);
}

static void test_srun(void **state)
{
    (void)state;
    topo_t *t = s_topo();
    char **argv = NULL;
    char err[256];
    snprintf(t->nodes[2].workdir, sizeof t->nodes[2].workdir, "/scratch/my dir");
    assert_int_equal(launch_build_argv(t, topo_find(t, "decode-1"), "/opt/troupe/bin", "/etc/c.yaml", &argv,
                                       err, sizeof err), 0);
    static const char *const want[] = {
        "srun", "--nodes=1", "--ntasks=1", "--overlap", "--nodelist=gpu-17", "--job-name=troupe-decode-1",
        "--chdir=/scratch/my dir", "/opt/troupe/bin/troupe-decode", "--topology", "/etc/c.yaml",
        "--name", "decode-1", NULL
    };
    s_assert_argv(argv, want);
    launch_free_argv(&argv);
    topo_destroy(&t);
}

/* Creates dir (and parents are assumed to exist). */
static void s_mkdir(const char *dir)
{
    assert_int_equal(mkdir(dir, 0700), 0);
}

/* Runs argv (or "sh -c argv[last]" when via_shell) with TROUPE_LAUNCH_OUT=out, waits, returns
 * what the fake binary wrote. */
static char *s_run(char **argv, int via_shell, const char *out)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("TROUPE_LAUNCH_OUT", out, 1);
        if (via_shell) {
            int n = 0;
            while (argv[n])
                n++;
            execl("/bin/sh", "sh", "-c", argv[n - 1], (char *)NULL);
        } else {
            execv(argv[0], argv);
        }
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    FILE *f = fopen(out, "rb");
    assert_non_null(f);
    char *buf = calloc(1, 65536);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 65535, f);
    buf[n] = '\0';
    fclose(f);
    unlink(out);
    return buf;
}

static void test_hostile_paths_survive_the_shell(void **state)
{
    (void)state;
    char base[] = "/tmp/troupe-launch-XXXXXX";
    assert_non_null(mkdtemp(base));
    static const char hostile[] = "a b'c\"d$HOME`id`$(id);e&f|g\\h\ti\nj*k?~l";
    char bin_dir[512], work_dir[512], script[600], topo_path[600], out[600];
    snprintf(bin_dir, sizeof bin_dir, "%s/bin %s", base, hostile);
    snprintf(work_dir, sizeof work_dir, "%s/work %s", base, hostile);
    snprintf(topo_path, sizeof topo_path, "%s/topo %s.yaml", base, hostile);
    snprintf(out, sizeof out, "%s/out", base);
    s_mkdir(bin_dir);
    s_mkdir(work_dir);

    /* The fake actor: prints its working directory, then each argument, NUL-separated. */
    static const char *const roles[] = { "prefill", "router" };
    for (size_t r = 0; r < 2; r++) {
        snprintf(script, sizeof script, "%s/troupe-%s", bin_dir, roles[r]);
        FILE *f = fopen(script, "w");
        assert_non_null(f);
        fputs("#!/bin/sh\n{ printf '%s\\0' \"$(pwd)\"; for a in \"$@\"; do printf '%s\\0' \"$a\"; done; }"
              " > \"$TROUPE_LAUNCH_OUT\"\n", f);
        fclose(f);
        assert_int_equal(chmod(script, 0755), 0);
    }

    topo_t *t = s_topo();
    snprintf(t->nodes[1].workdir, sizeof t->nodes[1].workdir, "%s", work_dir);
    char **argv = NULL;
    char err[256];

    /* ssh: the last word goes through a shell on the remote side; run it through one here. */
    assert_int_equal(launch_build_argv(t, topo_find(t, "prefill"), bin_dir, topo_path, &argv, err,
                                       sizeof err), 0);
    char *got = s_run(argv, 1, out);
    char expect[4096];
    size_t n = 0;
    const char *const parts[] = { work_dir, "--topology", topo_path, "--name", "prefill" };
    for (size_t i = 0; i < 5; i++) {
        memcpy(expect + n, parts[i], strlen(parts[i]) + 1);
        n += strlen(parts[i]) + 1;
    }
    assert_memory_equal(got, expect, n);
    free(got);
    launch_free_argv(&argv);

    /* local: exec'd directly, no shell; the working directory is ours. */
    assert_int_equal(launch_build_argv(t, topo_find(t, "router"), bin_dir, topo_path, &argv, err,
                                       sizeof err), 0);
    got = s_run(argv, 0, out);
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    n = 0;
    const char *const lparts[] = { cwd, "--topology", topo_path, "--name", "router" };
    for (size_t i = 0; i < 5; i++) {
        memcpy(expect + n, lparts[i], strlen(lparts[i]) + 1);
        n += strlen(lparts[i]) + 1;
    }
    assert_memory_equal(got, expect, n);
    free(got);
    launch_free_argv(&argv);
    topo_destroy(&t);

    for (size_t r = 0; r < 2; r++) {
        snprintf(script, sizeof script, "%s/troupe-%s", bin_dir, roles[r]);
        unlink(script);
    }
    rmdir(bin_dir);
    rmdir(work_dir);
    rmdir(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quote_and_split),
        cmocka_unit_test(test_local),
        cmocka_unit_test(test_ssh),
        cmocka_unit_test(test_srun),
        cmocka_unit_test(test_hostile_paths_survive_the_shell),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
