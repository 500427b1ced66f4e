/* topology/topology.c — loading a topology: read, pre-pass, libcyaml, build; names and look-ups.
 *
 * The pipeline (each stage reports into one topo_diag_t, see topology/diag.h):
 *   1. read the file (bounded: a topology is small; a huge file is a mistake);
 *   2. topology/prepass.c walks it with libyaml: syntax and shape, every problem with its line;
 *   3. only if that found nothing, libcyaml loads it into raw_topo_t (strings);
 *   4. topology/build.c converts, defaults, validates and expands into the topo_t. */
#include "topology/topology.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "topology/diag.h"
#include "topology/raw.h"

#define TOPO_FILE_MAX (1 << 20)          /* 1 MiB: far beyond any real topology */

static const char *const s_role_names[ROLE_COUNT] = {
    [ROLE_ROUTER] = "router",
    [ROLE_PREFILL] = "prefill",
    [ROLE_DECODE] = "decode",
    [ROLE_CACHE_MANAGER] = "cache-manager",
    [ROLE_EXPERT_BALANCER] = "expert-balancer",
    [ROLE_DRAFT_SCHEDULER] = "draft-scheduler",
    [ROLE_MONITOR] = "monitor",
    [ROLE_GATEWAY] = "gateway",
};

const char *topo_role_name(topo_role_t r)
{
    return (unsigned)r < ROLE_COUNT ? s_role_names[r] : "?";
}

int topo_role_parse(const char *s, topo_role_t *out)
{
    if (!s)
        return -1;
    for (int i = 0; i < ROLE_COUNT; i++) {
        if (strcmp(s, s_role_names[i]) == 0) {
            *out = (topo_role_t)i;
            return 0;
        }
    }
    return -1;
}

const char *topo_backend_name(topo_backend_t b) { return b == TOPO_BACKEND_CUDA ? "cuda" : b == TOPO_BACKEND_CPU ? "cpu" : "?"; }
const char *topo_load_format_name(topo_load_format_t f) { return f == TOPO_LOAD_DUMMY ? "dummy" : f == TOPO_LOAD_AUTO ? "auto" : "?"; }

const char *topo_launch_name(topo_launch_t l)
{
    switch (l) {
    case TOPO_LAUNCH_LOCAL: return "local";
    case TOPO_LAUNCH_SSH: return "ssh";
    case TOPO_LAUNCH_SRUN: return "srun";
    }
    return "?";
}

const char *topo_restart_name(topo_restart_t r)
{
    switch (r) {
    case TOPO_RESTART_PERMANENT: return "permanent";
    case TOPO_RESTART_TRANSIENT: return "transient";
    case TOPO_RESTART_TEMPORARY: return "temporary";
    }
    return "?";
}

const char *topo_strategy_name(topo_strategy_t s)
{
    return s == TOPO_STRATEGY_ONE_FOR_ONE ? "one_for_one" : s == TOPO_STRATEGY_REST_FOR_ONE ? "rest_for_one" : "?";
}

/* libcyaml's messages arrive in pieces through its log callback; keep the last error line. */
typedef struct {
    char last[TOPO_ERROR_LEN / 2];
    char cur[TOPO_ERROR_LEN / 2];
} s_cyaml_log_t;

static void s_cyaml_log(cyaml_log_t level, void *ctx, const char *fmt, va_list args)
{
    s_cyaml_log_t *l = ctx;
    if (level < CYAML_LOG_ERROR)
        return;
    size_t used = strlen(l->cur);
    vsnprintf(l->cur + used, sizeof l->cur - used, fmt, args);
    char *nl = strchr(l->cur, '\n');
    if (nl) {
        *nl = '\0';
        if (l->cur[0])
            snprintf(l->last, sizeof l->last, "%s", l->cur);
        l->cur[0] = '\0';
    }
}

void topo_destroy(topo_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    topo_t *t = *self_p;
    free(t->nodes);
    free(t->actors);
    free(t->instances);
    free(t->gateway.keys);
    free(t);
    *self_p = NULL;
}

int topo_load_string(const char *yaml, size_t len, const char *name_for_errors, topo_t **out,
                     topo_errors_t *errs)
{
    *out = NULL;
    topo_diag_t d;
    topo_diag_init(&d, name_for_errors ? name_for_errors : "<string>");
    topo_t *t = NULL;
    raw_topo_t *raw = NULL;
    s_cyaml_log_t clog = { "", "" };
    const cyaml_config_t cfg = {
        .log_fn = s_cyaml_log,
        .log_ctx = &clog,
        .mem_fn = cyaml_mem,
        .log_level = CYAML_LOG_ERROR,
        .flags = CYAML_CFG_NO_ALIAS,
    };

    if (len > TOPO_FILE_MAX) {
        topo_diag_err_at(&d, 0, "", "%zu bytes: a topology file is at most %d", len, TOPO_FILE_MAX);
        goto done;
    }
    if (memchr(yaml, '\0', len)) {
        topo_diag_err_at(&d, 0, "", "contains a NUL byte: not a text file");
        goto done;
    }
    if (topo_prepass(&d, (const unsigned char *)yaml, len) > 0)
        goto done;
    cyaml_err_t ce = cyaml_load_data((const uint8_t *)yaml, len, &cfg, &raw_schema,
                                     (cyaml_data_t **)&raw, NULL);
    if (ce != CYAML_OK) {
        /* The pre-pass checks the same schema, so this is a case it does not know. */
        topo_diag_err_at(&d, 0, "", "libcyaml: %s%s%s", cyaml_strerror(ce), clog.last[0] ? ": " : "",
                         clog.last);
        raw = NULL;
        goto done;
    }
    if (!raw) {
        topo_diag_err_at(&d, 1, "", "the file is empty: a topology needs at least an actors: list");
        goto done;
    }
    t = calloc(1, sizeof *t);
    if (!t) {
        topo_diag_err_at(&d, 0, "", "out of memory");
        goto done;
    }
    snprintf(t->source, sizeof t->source, "%s", d.file);
    if (topo_build(&d, raw, t) != 0)
        topo_destroy(&t);

done:
    if (raw)
        cyaml_free(&cfg, &raw_schema, raw, 0);
    int rc = t ? 0 : -1;
    if (rc != 0 && d.n_problems == 0 && !d.dropped)
        topo_diag_err_at(&d, 0, "", "could not be loaded");    /* never fail silently */
    topo_diag_flush(&d, errs);
    topo_diag_fini(&d);
    *out = t;
    return rc;
}

int topo_load_file(const char *path, topo_t **out, topo_errors_t *errs)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0;
    const char *why = NULL;
    int saved = 0;
    if (!f) {
        why = "cannot open";
        saved = errno;
    } else {
        buf = malloc(TOPO_FILE_MAX + 1);
        if (!buf)
            why = "out of memory reading";
        else {
            len = fread(buf, 1, TOPO_FILE_MAX + 1, f);
            if (ferror(f)) {
                why = "cannot read";
                saved = errno;
            } else if (len > TOPO_FILE_MAX) {
                why = "too large (over 1 MiB) for";
            }
        }
        fclose(f);
    }
    if (why) {
        topo_diag_t d;
        topo_diag_init(&d, path);
        if (saved)
            topo_diag_err_at(&d, 0, "", "%s the topology file: %s", why, strerror(saved));
        else
            topo_diag_err_at(&d, 0, "", "%s the topology file", why);
        topo_diag_flush(&d, errs);
        topo_diag_fini(&d);
        free(buf);
        return -1;
    }
    int rc = topo_load_string(buf, len, path, out, errs);
    free(buf);
    return rc;
}

int topo_load_default(topo_t **out, topo_errors_t *errs)
{
    return topo_load_string(topo_default_yaml, topo_default_yaml_len, "<default>", out, errs);
}

const topo_instance_t *topo_find(const topo_t *t, const char *instance_name)
{
    if (!t || !instance_name)
        return NULL;
    for (int i = 0; i < t->n_instances; i++)
        if (strcmp(t->instances[i].name, instance_name) == 0)
            return &t->instances[i];
    return NULL;
}

const topo_instance_t *topo_first(const topo_t *t, topo_role_t role)
{
    if (!t)
        return NULL;
    for (int i = 0; i < t->n_instances; i++)
        if (t->instances[i].role == role)
            return &t->instances[i];
    return NULL;
}

int topo_tokenizer_expected(const topo_t *t)
{
    char p[TOPO_PATH_MAX + 32];
    if (t->model.tokenizer[0] && strcmp(t->model.tokenizer, t->model.path) != 0)
        return 1;   /* named apart from the model: it must load */
    snprintf(p, sizeof p, "%s/tokenizer.json", t->model.path);
    return access(p, F_OK) == 0;
}

int topo_count_role(const topo_t *t, topo_role_t role)
{
    int n = 0;
    for (int i = 0; t && i < t->n_instances; i++)
        n += t->instances[i].role == role;
    return n;
}

const char *topo_client_endpoint(const topo_t *t, const topo_instance_t *router)
{
    int k = 0;
    for (int i = 0; i < t->n_instances; i++) {
        if (t->instances[i].role != ROLE_ROUTER)
            continue;
        if (&t->instances[i] == router)
            return k < t->endpoints.n_clients ? t->endpoints.clients[k] : NULL;
        k++;
    }
    return NULL;
}
