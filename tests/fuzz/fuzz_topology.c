/* tests/fuzz/fuzz_topology.c — topo_load_string on arbitrary bytes.
 *
 * Properties checked on every input:
 *   - a refusal explains itself: at least one problem, each naming the input ("fuzz:...");
 *   - a loaded topology prints (topo_print), and what it prints is itself a valid topology file
 *     that loads into the same cluster: same instance count, and printing it again gives the
 *     same text byte for byte (print is the effective topology, so it is a fixed point);
 *   - every instance gets a launch command line (or a clear error), and everything is freed
 *     (ASan's leak check).
 * Loading only reads the text: nothing is started and no file is written.
 * Seeds: tests/fuzz/corpus/topology/ (the shipped examples and the unit tests' bad files);
 * dictionary: tests/fuzz/topology.dict (the schema's keys and enum values). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/lib/launch.h"
#include "topology/topology.h"

static topo_errors_t s_errs;   /* large (32 KiB): static, not on the stack */

static void s_die(const char *what)
{
    fprintf(stderr, "fuzz_topology: %s\n", what);
    abort();
}

/* topo_print into a malloc'd string (*len bytes). */
static char *s_print(const topo_t *t, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        s_die("open_memstream");
    topo_print(t, f);
    if (fclose(f) != 0)
        s_die("fclose");
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    topo_t *t = NULL;
    topo_errors_clear(&s_errs);
    if (topo_load_string((const char *)data, size, "fuzz", &t, &s_errs) != 0) {
        if (t || s_errs.count == 0)
            s_die("refused without a reason");
        for (int i = 0; i < s_errs.count; i++)
            if (strncmp(s_errs.msg[i], "fuzz", 4) != 0)
                s_die("a problem that does not name the file");
        return 0;
    }
    for (int i = 0; i < t->n_instances; i++) {
        char **argv;
        char err[256] = "";
        if (launch_build_argv(t, &t->instances[i], "/b", "/t.yaml", &argv, err, sizeof err) == 0)
            launch_free_argv(&argv);
        else if (!err[0])
            s_die("launch_build_argv failed without a reason");
    }

    size_t len1, len2;
    char *p1 = s_print(t, &len1);
    topo_t *t2 = NULL;
    topo_errors_clear(&s_errs);
    if (topo_load_string(p1, len1, "fuzz", &t2, &s_errs) != 0) {
        topo_errors_print(&s_errs, stderr);
        fprintf(stderr, "--- printed:\n%s", p1);
        s_die("the printed topology does not load");
    }
    if (t2->n_instances != t->n_instances)
        s_die("the printed topology has another instance count");
    char *p2 = s_print(t2, &len2);
    if (len1 != len2 || memcmp(p1, p2, len1) != 0) {
        fprintf(stderr, "--- first print:\n%s--- second print:\n%s", p1, p2);
        s_die("printing is not a fixed point");
    }
    free(p1);
    free(p2);
    topo_destroy(&t2);
    topo_destroy(&t);
    return 0;
}
