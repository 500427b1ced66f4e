/* tests/unit/actor_topo_harness.h — a run directory and a topology (monitor, router, decode on
 * 127.0.0.1, client endpoint on an ipc socket inside it) for tests that run actors in-process
 * (test_actor_peers.c, test_actor_outbox.c, test_actor_errors.c). `extra` is appended to the
 * topology as is (a limits section, or ""). Static functions only: each test includes it once. */
#ifndef TROUPE_TESTS_ACTOR_TOPO_HARNESS_H
#define TROUPE_TESTS_ACTOR_TOPO_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char s_dir[128], s_topo[192];

/* /tmp/troupe-<tag>-<pid> with its run/ folder and t.yaml; 0, or -1 when the file cannot be made. */
static int actor_topo_setup(const char *tag, const char *extra)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/troupe-%s-%d", tag, (int)getpid());
    mkdir(s_dir, 0700);
    char run[160];
    snprintf(run, sizeof run, "%s/run", s_dir);
    mkdir(run, 0700);
    snprintf(s_topo, sizeof s_topo, "%s/t.yaml", s_dir);
    FILE *f = fopen(s_topo, "w");
    if (!f)
        return -1;
    fprintf(f, "name: %s-%d\nmodel:\n  path: models/kjv-tiny\n  backend: cpu\n"
               "nodes:\n  - name: local\n    address: 127.0.0.1\n"
               "actors:\n  - role: monitor\n  - role: router\n  - role: decode\n"
               "endpoints:\n  client: ipc://%s/client.sock\n  run_dir: %s\n%s", tag, (int)getpid(), s_dir, run, extra);
    fclose(f);
    return 0;
}

static int actor_topo_teardown(void)
{
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
