#include "topology/topology.h"
#include "tools/lib/launch.h"
#include <stdint.h>
#include <stdlib.h>
static topo_errors_t e;
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    topo_t *t = NULL;
    topo_errors_clear(&e);
    if (topo_load_string((const char *)data, size, "fuzz", &t, &e) == 0) {
        FILE *f = fopen("/dev/null", "w"); topo_print(t, f); fclose(f);
        for (int i = 0; i < t->n_instances; i++) { char **argv; char err[256];
            if (launch_build_argv(t, &t->instances[i], "/b", "/t.yaml", &argv, err, sizeof err) == 0) launch_free_argv(&argv); }
        topo_destroy(&t);
    } else if (e.count == 0) abort();
    return 0;
}
