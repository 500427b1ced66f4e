/* tests/fuzz/fuzz_quant_config.c — quant_config_parse_text (config.json's quantization_config) on
 * arbitrary bytes.
 *
 * Properties checked on every input:
 *   - a refusal explains itself: a non-empty message that starts with the name given ("fuzz"),
 *     and leaves the config zeroed (present 0);
 *   - an accepted config is one the kernels can run: a format in range, activations in range, a
 *     block grid of non-negative sizes, at most QUANT_MAX_IGNORE ignore entries, each terminated;
 *     and quant_ignored answers for any module name without crashing (the "re:" patterns compile).
 * Seeds: tests/fuzz/corpus/quant_config/ (each format as the hub writes it, and refusals). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"

static void s_die(const char *what)
{
    fprintf(stderr, "fuzz_quant_config: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    quant_config_t qc;
    char err[512] = "";
    int rc = quant_config_parse_text((const char *)data, size, "fuzz", &qc, err, sizeof err);
    if (rc < 0) {
        if (strncmp(err, "fuzz", 4) != 0)
            s_die("a refusal does not name its input");
        if (qc.present)
            s_die("a refused config is marked present");
        return 0;
    }
    if (rc != 0)
        s_die("return code other than 0 / -1");
    if (!qc.present)
        return 0;                                  /* null: no quantization */
    if (qc.fmt <= BK_Q_NONE || qc.fmt >= BK_Q_COUNT || qc.act < 0 || qc.act >= BK_QA_COUNT || qc.gr < 0 || qc.gc < 0)
        s_die("an accepted config is out of range");
    if (qc.n_ignore < 0 || qc.n_ignore > QUANT_MAX_IGNORE)
        s_die("ignore count out of range");
    for (int i = 0; i < qc.n_ignore; i++)
        if (memchr(qc.ignore[i], 0, QUANT_MAX_NAME) == NULL)
            s_die("an ignore entry is not terminated");
    (void)quant_ignored(&qc, "model.layers.0.mlp.gate");
    (void)quant_ignored(&qc, "lm_head");
    return 0;
}
