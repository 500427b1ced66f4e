/* topology/build.c — from the strings libcyaml loaded to a checked, defaulted, expanded topo_t.
 *
 * Duties, in order: convert every scalar with a strict parser (no trailing junk, no overflow)
 * and check its range; apply defaults; check the cross-field rules (roles present, node names,
 * GPU indices, parallel degrees, backend vs GPUs); expand actors into named instances; derive
 * the run directory and every internal endpoint; check endpoints for clashes, socket path
 * length and wildcard binds without CURVE keys. Every problem is reported and checking goes on,
 * so one load shows the user everything that is wrong with the file.
 *
 * Known limits: GPU sharing between actors is allowed without checking whether NCCL would
 * refuse it; key files and model paths are not opened here (they are read, relative to the
 * reading process's directory, by the actors that use them). */
#include "topology/diag.h"
#include "topology/raw.h"

#include "common/util.h"
#include "messages/msg.h"       /* MSG_MAX_RETENTION_S: the one retention maximum */

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define INSTANCES_MAX   1024             /* processes per cluster */
#define COUNT_MAX       256              /* instances per actor entry */
#define IPC_PATH_MAX    107              /* sockaddr_un.sun_path minus its NUL */
#define DEFAULT_CLIENT  "tcp://127.0.0.1:5555"
#define DEFAULT_INSPECT "tcp://127.0.0.1:5556"
#define DEFAULT_BASE_PORT 5600

/* ---- scalars ----------------------------------------------------------------------------- */

static int s_problems(const topo_diag_t *d) { return d->n_problems + d->dropped; }

/* Copies src (or def when src is NULL) into dst; empty or too long is a problem. */
static void s_str(topo_diag_t *d, const char *path, const char *src, const char *def, char *dst,
                  size_t cap, int allow_empty)
{
    const char *v = src ? src : def;
    dst[0] = '\0';
    if (!v)
        return;
    size_t n = strlen(v);
    if (n >= cap) {
        topo_diag_err(d, path, "too long (%zu bytes, at most %zu)", n, cap - 1);
        return;
    }
    if (n == 0 && src && !allow_empty) {
        topo_diag_err(d, path, "empty value");
        return;
    }
    memcpy(dst, v, n + 1);
}

/* Strict decimal integer: optional sign, digits only. 0 ok, -1 junk, -2 overflow. */
static int s_parse_i64(const char *s, int64_t *out)
{
    const char *p = s;
    int neg = 0;
    if (*p == '+' || *p == '-')
        neg = *p++ == '-';
    if (!isdigit((unsigned char)*p))
        return -1;
    uint64_t v = 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned dig = (unsigned)(*p - '0');
        if (v > ((uint64_t)INT64_MAX - dig) / 10)
            return -2;
        v = v * 10 + dig;
    }
    if (*p)
        return -1;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

/* src (or def when absent) as an integer in lo..hi. */
static int64_t s_int(topo_diag_t *d, const char *path, const char *src, int64_t lo, int64_t hi,
                     int64_t def)
{
    if (!src)
        return def;
    int64_t v = 0;
    int rc = s_parse_i64(src, &v);
    if (rc == -1) {
        topo_diag_err(d, path, "'%s' is not a whole number", src);
        return def;
    }
    if (rc == -2 || v < lo || v > hi) {
        topo_diag_err(d, path, "%s is out of range (%" PRId64 "..%" PRId64 ")", src, lo, hi);
        return def;
    }
    return v;
}

/* src (or def) as the index of one of names[]; what names the kind in the message. */
static int s_enum(topo_diag_t *d, const char *path, const char *src, const char *const *names,
                  int n, int def, const char *what)
{
    if (!src)
        return def;
    for (int i = 0; i < n; i++)
        if (strcmp(src, names[i]) == 0)
            return i;
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
        if (w > 0 && (size_t)w < sizeof list - used)
            used += (size_t)w;
    }
    topo_diag_err(d, path, "unknown %s '%s' (expected one of %s)", what, src, list);
    return -1;
}

static int s_bool(topo_diag_t *d, const char *path, const char *src, int def)
{
    if (!src)
        return def;
    static const char *const yes[] = { "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On" };
    static const char *const no[] = { "false", "False", "FALSE", "no", "No", "NO", "off", "Off" };
    for (size_t i = 0; i < ARRAY_LEN(yes); i++)
        if (strcmp(src, yes[i]) == 0)
            return 1;
    for (size_t i = 0; i < ARRAY_LEN(no); i++)
        if (strcmp(src, no[i]) == 0)
            return 0;
    topo_diag_err(d, path, "'%s' is not true or false", src);
    return def;
}

/* Names end up in file names and endpoints: [A-Za-z0-9_.-], not starting with '.' or '-'. */
static int s_name_ok(const char *s)
{
    if (!s[0] || s[0] == '.' || s[0] == '-')
        return 0;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
            return 0;
    return 1;
}

static void s_name(topo_diag_t *d, const char *path, const char *src, const char *def, char *dst,
                   size_t cap)
{
    int before = s_problems(d);
    s_str(d, path, src, def, dst, cap, 0);
    if (s_problems(d) == before && dst[0] && !s_name_ok(dst))
        topo_diag_err(d, path, "'%s' is not a valid name (letters, digits, '_', '-', '.'; not "
                      "starting with '-' or '.')", dst);
}

/* ---- parsing one endpoint ---------------------------------------------------------------- */

typedef struct {
    int tcp;                             /* 1 tcp://host:port, 0 ipc://path */
    char host[TOPO_ENDPOINT_MAX];        /* without brackets */
    int port;
    const char *path;                    /* ipc: points into the endpoint string */
} s_ep_t;

static int s_wildcard_host(const char *h)
{
    return strcmp(h, "*") == 0 || strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0 ||
           strcmp(h, "::0") == 0 || strcmp(h, "0:0:0:0:0:0:0:0") == 0;
}

static int s_loopback_host(const char *h)
{
    return strncmp(h, "127.", 4) == 0 || strcmp(h, "localhost") == 0 || strcmp(h, "::1") == 0;
}

/* Parses a ZeroMQ endpoint; on failure writes why and returns -1. */
static int s_ep_parse(const char *ep, s_ep_t *out, char *why, size_t n)
{
    memset(out, 0, sizeof *out);
    if (strncmp(ep, "ipc://", 6) == 0) {
        out->path = ep + 6;
        if (!out->path[0])
            return errf(why, n, "'%s' has an empty socket path", ep);
        if (strlen(out->path) > IPC_PATH_MAX)
            return errf(why, n, "socket path of '%s' is %zu bytes; Unix sockets allow at most %d",
                        ep, strlen(out->path), IPC_PATH_MAX);
        return 0;
    }
    if (strncmp(ep, "tcp://", 6) != 0)
        return errf(why, n, "'%s' is not tcp://host:port or ipc://path", ep);
    out->tcp = 1;
    const char *h = ep + 6, *colon;
    size_t hl;
    if (*h == '[') {
        const char *close = strchr(h, ']');
        if (!close || close[1] != ':')
            return errf(why, n, "'%s': expected tcp://[ipv6]:port", ep);
        h++;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(h, ':');
        if (!colon)
            return errf(why, n, "'%s' has no port (tcp://host:port)", ep);
        hl = (size_t)(colon - h);
        if (memchr(h, ':', hl))
            return errf(why, n, "'%s': write IPv6 hosts in brackets, tcp://[::1]:port", ep);
    }
    if (hl == 0 || hl >= sizeof out->host)
        return errf(why, n, "'%s' has an empty or too long host", ep);
    memcpy(out->host, h, hl);
    out->host[hl] = '\0';
    int64_t port;
    if (s_parse_i64(colon + 1, &port) != 0 || colon[1] == '+' || colon[1] == '-' || port < 1 ||
        port > 65535)
        return errf(why, n, "'%s' has a bad port '%s' (1..65535)", ep, colon + 1);
    out->port = (int)port;
    return 0;
}

/* "tcp://host:port", bracketing IPv6 literals. Hosts are checked to be short enough (at most
 * TOPO_HOST_MAX), so this cannot truncate; an empty dst would show if it ever did. */
#define TOPO_HOST_MAX 200
static void s_tcp(char *dst, size_t cap, const char *host, int port)
{
    int n = strchr(host, ':') ? snprintf(dst, cap, "tcp://[%s]:%d", host, port)
                              : snprintf(dst, cap, "tcp://%s:%d", host, port);
    if (n < 0 || (size_t)n >= cap)
        dst[0] = '\0';
}

/* ---- sections ---------------------------------------------------------------------------- */

static const char *const s_backends[] = { "cpu", "cuda" };
static const char *const s_formats[] = { "auto", "dummy" };
/* model.quantization: the index is kernels/backend.h's BK_Q_* (engine/quant.h's names). */
static const char *const s_quants[] = { "none", "fp8", "int8", "int4", "nvfp4" };
/* KV_SCALES_* in order (engine/kvscale.h's kv_scales_name; tests/unit/test_topology.c checks both agree). */
static const char *const s_kv_scales[] = { "auto", "checkpoint", "calibrate", "one" };
static const char *const s_launches[] = { "local", "ssh", "srun" };
static const char *const s_restarts[] = { "permanent", "transient", "temporary" };
static const char *const s_strategies[] = { "one_for_one", "rest_for_one" };

static void s_model(topo_diag_t *d, const raw_model_t *m, topo_model_t *out)
{
    static const raw_model_t none;
    if (!m)
        m = &none;
    s_str(d, "model.path", m->path, NULL, out->path, sizeof out->path, 0);
    s_str(d, "model.tokenizer", m->tokenizer, out->path, out->tokenizer, sizeof out->tokenizer, 0);
    s_str(d, "model.draft", m->draft, NULL, out->draft, sizeof out->draft, 0);
    int b = s_enum(d, "model.backend", m->backend, s_backends, 2, TOPO_BACKEND_CPU, "backend");
    out->backend = b < 0 ? TOPO_BACKEND_CPU : (topo_backend_t)b;
    out->dtype = out->backend == TOPO_BACKEND_CUDA ? DT_BF16 : DT_F32;
    if (m->dtype && dtype_parse(m->dtype, &out->dtype) != 0)
        topo_diag_err(d, "model.dtype", "unknown dtype '%s' (expected one of f32, bf16, f16)", m->dtype);
    out->kv_dtype = DT_COUNT;
    if (m->kv_dtype && strcasecmp(m->kv_dtype, "auto") != 0 && dtype_parse_kv(m->kv_dtype, &out->kv_dtype) != 0)
        topo_diag_err(d, "model.kv_dtype", "unknown KV cache dtype '%s' (expected one of auto, f32, bf16, f16, fp8)",
                      m->kv_dtype);
    int ks = s_enum(d, "model.kv_scales", m->kv_scales, s_kv_scales, 4, 0, "KV scales source");
    out->kv_scales = ks < 0 ? 0 : ks;
    int f = s_enum(d, "model.load_format", m->load_format, s_formats, 2, TOPO_LOAD_AUTO, "load format");
    out->load_format = f < 0 ? TOPO_LOAD_AUTO : (topo_load_format_t)f;
    out->threads = (int)s_int(d, "model.threads", m->threads, 0, 1024, 0);
    int q = s_enum(d, "model.quantization", m->quantization, s_quants, 5, 0, "online quantization");
    out->quantization = q < 0 ? 0 : q;
}

/* Checks an ssh template's placeholders: only {address} and {node} exist. */
static void s_ssh_template(topo_diag_t *d, const char *path, const char *tpl)
{
    for (const char *p = strchr(tpl, '{'); p; p = strchr(p + 1, '{')) {
        if (strncmp(p, "{address}", 9) != 0 && strncmp(p, "{node}", 6) != 0) {
            const char *close = strchr(p, '}');
            int len = close ? (int)(close - p + 1) : (int)strlen(p);
            topo_diag_err(d, path, "unknown placeholder '%.*s' (expected {address} or {node})", len, p);
        }
    }
    int any = 0;
    for (const char *p = tpl; *p; p++)
        any |= !isspace((unsigned char)*p);
    if (!any)
        topo_diag_err(d, path, "empty command template");
}

static void s_nodes(topo_diag_t *d, const raw_topo_t *raw, topo_t *t)
{
    t->n_nodes = raw->nodes ? (int)raw->nodes_count : 1;
    t->nodes = calloc((size_t)t->n_nodes, sizeof *t->nodes);
    if (!t->nodes) {
        topo_diag_err(d, "nodes", "out of memory");
        t->n_nodes = 0;
        return;
    }
    if (!raw->nodes) {                   /* no nodes: list = this machine */
        topo_node_t *n = &t->nodes[0];
        snprintf(n->name, sizeof n->name, "local");
        snprintf(n->address, sizeof n->address, "127.0.0.1");
        n->launch = TOPO_LAUNCH_LOCAL;
        snprintf(n->ssh, sizeof n->ssh, "ssh -o BatchMode=yes {address}");
        return;
    }
    for (int i = 0; i < t->n_nodes; i++) {
        const raw_node_t *r = &raw->nodes[i];
        topo_node_t *n = &t->nodes[i];
        char p[TOPO_FIELD_PATH_MAX];
        snprintf(p, sizeof p, "nodes[%d].name", i);
        if (!r->name)
            topo_diag_err(d, p, "missing (every node needs a name)");
        s_name(d, p, r->name, NULL, n->name, sizeof n->name);
        for (int j = 0; j < i && n->name[0]; j++)
            if (strcmp(t->nodes[j].name, n->name) == 0)
                topo_diag_err(d, p, "node name '%s' is already used by nodes[%d]", n->name, j);
        snprintf(p, sizeof p, "nodes[%d].launch", i);
        int l = s_enum(d, p, r->launch, s_launches, 3, TOPO_LAUNCH_LOCAL, "launch method");
        n->launch = l < 0 ? TOPO_LAUNCH_LOCAL : (topo_launch_t)l;
        snprintf(p, sizeof p, "nodes[%d].address", i);
        if (!r->address && n->launch != TOPO_LAUNCH_LOCAL)
            topo_diag_err(d, p, "missing (a node launched by %s needs the address its peers reach "
                          "it at)", topo_launch_name(n->launch));
        s_str(d, p, r->address, "127.0.0.1", n->address, sizeof n->address, 0);
        if (n->address[0]) {
            if (s_wildcard_host(n->address))
                topo_diag_err(d, p, "'%s' is not an address peers can connect to (to bind all "
                              "interfaces use endpoints.bind_interface)", n->address);
            else if (strpbrk(n->address, "/[] \t") || strlen(n->address) > TOPO_HOST_MAX)
                topo_diag_err(d, p, "'%s' is not a host name or IP address", n->address);
        }
        snprintf(p, sizeof p, "nodes[%d].gpus", i);
        n->gpus = (int)s_int(d, p, r->gpus, 0, TOPO_GPUS_MAX, 0);
        snprintf(p, sizeof p, "nodes[%d].ssh", i);
        s_str(d, p, r->ssh, "ssh -o BatchMode=yes {address}", n->ssh, sizeof n->ssh, 0);
        if (r->ssh)
            s_ssh_template(d, p, n->ssh);
        snprintf(p, sizeof p, "nodes[%d].workdir", i);
        s_str(d, p, r->workdir, NULL, n->workdir, sizeof n->workdir, 0);
    }
}

static void s_actors(topo_diag_t *d, const raw_topo_t *raw, topo_t *t)
{
    t->n_actors = (int)raw->actors_count;
    t->actors = calloc((size_t)(t->n_actors ? t->n_actors : 1), sizeof *t->actors);
    if (!t->actors) {
        topo_diag_err(d, "actors", "out of memory");
        t->n_actors = 0;
        return;
    }
    for (int i = 0; i < t->n_actors; i++) {
        const raw_actor_t *r = &raw->actors[i];
        topo_actor_t *a = &t->actors[i];
        char p[TOPO_FIELD_PATH_MAX];
        snprintf(p, sizeof p, "actors[%d].role", i);
        a->role = ROLE_COUNT;            /* = unknown: role-based checks skip it */
        if (r->role && topo_role_parse(r->role, &a->role) != 0) {
            char list[160] = "";
            size_t used = 0;
            for (int k = 0; k < ROLE_COUNT; k++) {
                int w = snprintf(list + used, sizeof list - used, "%s%s", k ? ", " : "",
                                 topo_role_name((topo_role_t)k));
                if (w > 0 && (size_t)w < sizeof list - used)
                    used += (size_t)w;
            }
            topo_diag_err(d, p, "unknown role '%s' (expected one of %s)", r->role, list);
            a->role = ROLE_COUNT;
        }
        snprintf(p, sizeof p, "actors[%d].name", i);
        s_name(d, p, r->name, a->role < ROLE_COUNT ? topo_role_name(a->role) : NULL, a->name,
               sizeof a->name - 4 /* room for "-<i>" */);
        snprintf(p, sizeof p, "actors[%d].node", i);
        a->node = 0;
        if (r->node) {
            a->node = -1;
            for (int k = 0; k < t->n_nodes; k++)
                if (strcmp(t->nodes[k].name, r->node) == 0)
                    a->node = k;
            if (a->node < 0) {
                char list[192] = "";
                size_t used = 0;
                for (int k = 0; k < t->n_nodes; k++) {
                    int w = snprintf(list + used, sizeof list - used, "%s%s", k ? ", " : "",
                                     t->nodes[k].name);
                    if (w > 0 && (size_t)w < sizeof list - used)
                        used += (size_t)w;
                }
                topo_diag_err(d, p, "node '%s' is not declared in nodes: (declared: %s)", r->node, list);
            }
        }
        snprintf(p, sizeof p, "actors[%d].count", i);
        a->count = (int)s_int(d, p, r->count, 1, COUNT_MAX, 1);
        snprintf(p, sizeof p, "actors[%d].restart", i);
        int rs = s_enum(d, p, r->restart, s_restarts, 3, TOPO_RESTART_PERMANENT, "restart policy");
        a->restart = rs < 0 ? TOPO_RESTART_PERMANENT : (topo_restart_t)rs;

        int worker = a->role == ROLE_PREFILL || a->role == ROLE_DECODE;
        snprintf(p, sizeof p, "actors[%d].tp", i);
        a->tp = (int)s_int(d, p, r->tp, 1, COUNT_MAX, 1);
        if (a->tp > 1 && a->role < ROLE_COUNT && !worker)
            topo_diag_err(d, p, "only prefill and decode actors run tensor-parallel");
        else if (a->tp > 1 && a->count % a->tp != 0)
            topo_diag_err(d, p, "tp: %d does not divide count: %d (each tensor-parallel group is "
                          "tp instances)", a->tp, a->count);
        snprintf(p, sizeof p, "actors[%d].ep", i);
        a->ep = (int)s_int(d, p, r->ep, 1, 64, 1);
        if (a->ep > 1 && a->role < ROLE_COUNT && a->role != ROLE_DECODE)
            topo_diag_err(d, p, "only decode actors run expert-parallel groups");
        else if (a->ep > 1 && a->count % a->ep != 0)
            topo_diag_err(d, p, "ep: %d does not divide count: %d (each expert-parallel group is ep instances)",
                          a->ep, a->count);
        /* On a GPU too: the ranks' exchange goes through host memory over unix sockets (docs/experts.md). */

        a->n_gpus = (int)r->gpus_count;
        snprintf(p, sizeof p, "actors[%d].gpus", i);
        if (a->n_gpus > 0 && a->role < ROLE_COUNT && !worker)
            topo_diag_err(d, p, "only prefill and decode actors use GPUs");
        if (a->n_gpus > 1 && a->n_gpus != a->count)
            topo_diag_err(d, p, "%d GPUs for count: %d (give one GPU shared by every instance, or "
                          "exactly one per instance)", a->n_gpus, a->count);
        const topo_node_t *node = a->node >= 0 && a->node < t->n_nodes ? &t->nodes[a->node] : NULL;
        for (int g = 0; g < a->n_gpus && g < TOPO_GPUS_MAX; g++) {
            char gp[TOPO_FIELD_PATH_MAX];
            snprintf(gp, sizeof gp, "actors[%d].gpus[%d]", i, g);
            a->gpus[g] = (int)s_int(d, gp, r->gpus[g], 0, TOPO_GPUS_MAX - 1, -1);
            if (a->gpus[g] >= 0 && node && a->gpus[g] >= node->gpus) {
                if (node->gpus == 0)
                    topo_diag_err(d, gp, "GPU %d, but node '%s' has no GPUs (gpus: 0)", a->gpus[g],
                                  node->name);
                else
                    topo_diag_err(d, gp, "GPU %d, but node '%s' has gpus: %d (indices 0..%d)",
                                  a->gpus[g], node->name, node->gpus, node->gpus - 1);
            }
        }
        if (worker && t->model.backend == TOPO_BACKEND_CUDA && a->n_gpus == 0)
            topo_diag_err(d, p, "missing: model.backend is cuda, so a %s actor needs gpus: [index, ...]",
                          topo_role_name(a->role));
        if (a->n_gpus > 0 && t->model.backend == TOPO_BACKEND_CPU)
            topo_diag_err(d, p, "given, but model.backend is cpu (set backend: cuda, or drop gpus)");
    }
}

static void s_roles(topo_diag_t *d, topo_t *t)
{
    int n[ROLE_COUNT + 1] = { 0 };
    for (int i = 0; i < t->n_actors; i++)
        n[t->actors[i].role] += t->actors[i].count;
    if (n[ROLE_ROUTER] < 1 || n[ROLE_ROUTER] > TOPO_ROUTERS_MAX)
        topo_diag_err(d, "actors", "one to %d router instances are required (found %d)", TOPO_ROUTERS_MAX,
                      n[ROLE_ROUTER]);
    if (n[ROLE_MONITOR] != 1)
        topo_diag_err(d, "actors", "exactly one monitor instance is required (found %d)", n[ROLE_MONITOR]);
    /* No prefill actor: the decode workers compute the prompts themselves (colocated: one process,
     * one copy of the weights per GPU, prompt chunks batched with the decode steps). */
    if (n[ROLE_DECODE] < 1)
        topo_diag_err(d, "actors", "at least one decode actor is required");
    static const topo_role_t singletons[] = { ROLE_CACHE_MANAGER, ROLE_EXPERT_BALANCER,
                                              ROLE_DRAFT_SCHEDULER };
    for (size_t k = 0; k < ARRAY_LEN(singletons); k++)
        if (n[singletons[k]] > 1)
            topo_diag_err(d, "actors", "at most one %s instance (found %d): it owns cluster-wide state",
                          topo_role_name(singletons[k]), n[singletons[k]]);
    if (n[ROLE_GATEWAY] > 1)
        topo_diag_err(d, "actors", "at most one gateway instance (found %d): it binds endpoints.http",
                      n[ROLE_GATEWAY]);
    if ((n[ROLE_PREFILL] || n[ROLE_DECODE]) && !t->model.path[0])
        topo_diag_err(d, "model.path", "missing: prefill and decode actors load the model from it "
                      "(load_format: dummy still reads its config.json)");
}

static void s_limits(topo_diag_t *d, const raw_topo_t *raw, topo_t *t)
{
    static const raw_limits_t nl;
    static const raw_cache_t nc;
    static const raw_supervision_t ns;
    static const raw_security_t nsec;
    const raw_limits_t *l = raw->limits ? raw->limits : &nl;
    const raw_cache_t *c = raw->cache ? raw->cache : &nc;
    const raw_supervision_t *s = raw->supervision ? raw->supervision : &ns;
    const raw_security_t *sec = raw->security ? raw->security : &nsec;

    t->limits.max_message_bytes = s_int(d, "limits.max_message_bytes", l->max_message_bytes, 4096,
                                        INT32_MAX, 16777216);
    t->limits.send_hwm = (int)s_int(d, "limits.send_hwm", l->send_hwm, 1, 10000000, 1000);
    t->limits.recv_hwm = (int)s_int(d, "limits.recv_hwm", l->recv_hwm, 1, 10000000, 1000);
    t->limits.admission_queue = (int)s_int(d, "limits.admission_queue", l->admission_queue, 1, 1000000, 256);
    t->limits.max_batch = (int)s_int(d, "limits.max_batch", l->max_batch, 1, 4096, 64);
    t->limits.prefill_chunk_tokens = (int)s_int(d, "limits.prefill_chunk_tokens",
                                                l->prefill_chunk_tokens, 1, 1 << 20, 512);
    t->limits.kv_blocks = (int)s_int(d, "limits.kv_blocks", l->kv_blocks, 0, 1 << 26, 0);
    t->limits.max_model_len = (int)s_int(d, "limits.max_model_len", l->max_model_len, 1, 1 << 21, 4096);
    t->limits.max_inflight_per_client = (int)s_int(d, "limits.max_inflight_per_client", l->max_inflight_per_client,
                                                   0, 1000000, 0);
    t->limits.outbox = (int)s_int(d, "limits.outbox", l->outbox, 16, 1000000, 1024);

    t->cache.block_size = (int)s_int(d, "cache.block_size", c->block_size, 1, 1 << 20, 16);
    int bs = t->cache.block_size;
    if (bs != 8 && bs != 16 && bs != 32 && bs != 64 && bs != 128) {
        topo_diag_err(d, "cache.block_size", "%d is not one of 8, 16, 32, 64, 128", bs);
        t->cache.block_size = 16;
    }
    if (t->limits.max_model_len < t->cache.block_size)
        topo_diag_err(d, "limits.max_model_len", "%d is shorter than one KV block (cache.block_size: %d)",
                      t->limits.max_model_len, t->cache.block_size);
    t->cache.host_store_blocks = (int)s_int(d, "cache.host_store_blocks", c->host_store_blocks, 0,
                                            1 << 26, 4096);
    /* At most what a cache pin carries (messages/msg.h MSG_MAX_RETENTION_S, 7 days): a longer
     * default would make every pin message invalid, and the router's pins would be lost. */
    t->cache.default_retention_s = (int)s_int(d, "cache.default_retention_s", c->default_retention_s,
                                              0, MSG_MAX_RETENTION_S, 300);
    s_str(d, "cache.disk_dir", c->disk_dir, NULL, t->cache.disk_dir, sizeof t->cache.disk_dir, 0);
    t->cache.disk_bytes = s_int(d, "cache.disk_bytes", c->disk_bytes, 0, (int64_t)1 << 50, 0);
    if (t->cache.disk_bytes && t->cache.disk_bytes < (1 << 20))
        topo_diag_err(d, "cache.disk_bytes", "%lld is below the smallest disk tier (1048576 bytes)",
                      (long long)t->cache.disk_bytes);
    if (t->cache.disk_dir[0] && !t->cache.disk_bytes)
        t->cache.disk_bytes = (int64_t)10 << 30;   /* 10 GiB */
    if (t->cache.disk_dir[0] && t->cache.host_store_blocks == 0)
        topo_diag_err(d, "cache.disk_dir", "needs a host store (cache.host_store_blocks >= 1): "
                      "disk blocks are served through it");

    int st = s_enum(d, "supervision.strategy", s->strategy, s_strategies, 2,
                    TOPO_STRATEGY_ONE_FOR_ONE, "strategy");
    t->supervision.strategy = st < 0 ? TOPO_STRATEGY_ONE_FOR_ONE : (topo_strategy_t)st;
    t->supervision.max_restarts = (int)s_int(d, "supervision.max_restarts", s->max_restarts, 0, 10000, 5);
    t->supervision.period_s = (int)s_int(d, "supervision.period_s", s->period_s, 1, 86400, 10);
    t->supervision.ready_timeout_s = (int)s_int(d, "supervision.ready_timeout_s", s->ready_timeout_s,
                                                1, 3600, 60);
    t->supervision.grace_s = (int)s_int(d, "supervision.grace_s", s->grace_s, 0, 600, 5);
    t->supervision.heartbeat_ms = (int)s_int(d, "supervision.heartbeat_ms", s->heartbeat_ms, 10, 60000, 500);
    t->supervision.liveness = (int)s_int(d, "supervision.liveness", s->liveness, 1, 100, 3);
    t->supervision.client_heartbeat_ms = (int)s_int(d, "supervision.client_heartbeat_ms", s->client_heartbeat_ms,
                                                    10, 60000, 1000);
    t->supervision.client_heartbeat_timeout_ms = (int)s_int(d, "supervision.client_heartbeat_timeout_ms",
                                                            s->client_heartbeat_timeout_ms, 100, 600000, 3000);
    if (t->supervision.client_heartbeat_timeout_ms <= t->supervision.client_heartbeat_ms)
        topo_diag_err(d, "supervision.client_heartbeat_timeout_ms", "%d is not more than client_heartbeat_ms (%d): "
                      "the connection would be given up before a PING could be answered",
                      t->supervision.client_heartbeat_timeout_ms, t->supervision.client_heartbeat_ms);

    s_str(d, "security.curve_server_public", sec->curve_server_public, NULL,
          t->security.curve_server_public, sizeof t->security.curve_server_public, 0);
    s_str(d, "security.curve_server_secret", sec->curve_server_secret, NULL,
          t->security.curve_server_secret, sizeof t->security.curve_server_secret, 0);
    if (!t->security.curve_server_public[0] != !t->security.curve_server_secret[0])
        topo_diag_err(d, "security", "curve_server_public and curve_server_secret go together: give both");
    t->security.allow_wildcard = s_bool(d, "security.allow_wildcard", sec->allow_wildcard, 0);
    s_str(d, "security.curve_clients", sec->curve_clients, NULL, t->security.curve_clients,
          sizeof t->security.curve_clients, 0);
    s_str(d, "security.curve_keys_dir", sec->curve_keys_dir, NULL, t->security.curve_keys_dir,
          sizeof t->security.curve_keys_dir, 0);
    if (t->security.curve_server_public[0] && !t->security.curve_clients[0])
        topo_diag_err(d, "security.curve_clients", "required with CURVE keys: the file of client public keys "
                      "allowed to connect (one Z85 key a line)");
    if (!t->security.curve_server_public[0] && (t->security.curve_clients[0] || t->security.curve_keys_dir[0]))
        topo_diag_err(d, "security", "curve_clients and curve_keys_dir need curve_server_public and "
                      "curve_server_secret");
}

/* The expert-balancer's clock and slots (topology.h topo_experts_t). */
static void s_experts(topo_diag_t *d, const raw_topo_t *raw, topo_t *t)
{
    static const raw_experts_t none;
    const raw_experts_t *x = raw->experts ? raw->experts : &none;
    t->experts.window_steps = (int)s_int(d, "experts.window_steps", x->window_steps, 1, 1000000000, 1000);
    t->experts.interval_steps = (int)s_int(d, "experts.interval_steps", x->interval_steps, 1, 1000000000,
                                           10 * (int64_t)t->experts.window_steps);
    if (t->experts.interval_steps % t->experts.window_steps != 0)
        topo_diag_err(d, "experts.interval_steps", "%d is not a multiple of experts.window_steps (%d): placements "
                      "are computed at the end of a window", t->experts.interval_steps, t->experts.window_steps);
    t->experts.redundant_slots = (int)s_int(d, "experts.redundant_slots", x->redundant_slots, 0, 64, 1);
    /* 0 keeps every window at full weight forever (placements then follow history, not traffic). */
    t->experts.load_half_life_windows =
        (int)s_int(d, "experts.load_half_life_windows", x->load_half_life_windows, 0, 1000000, 10);
}

/* The gateway's keys and bounds (topology.h topo_gateway_t). */
static void s_gateway(topo_diag_t *d, const raw_topo_t *raw, topo_t *t)
{
    static const raw_gateway_t none;
    const raw_gateway_t *g = raw->gateway ? raw->gateway : &none;
    topo_gateway_t *out = &t->gateway;
    out->max_body_bytes = (int)s_int(d, "gateway.max_body_bytes", g->max_body_bytes, 1024, 64 << 20, 8 << 20);
    out->idle_timeout_s = (int)s_int(d, "gateway.idle_timeout_s", g->idle_timeout_s, 1, 3600, 30);
    out->body_timeout_s = (int)s_int(d, "gateway.body_timeout_s", g->body_timeout_s, 1, 3600, 10);
    out->max_connections = (int)s_int(d, "gateway.max_connections", g->max_connections, 1, 65536, 1024);
    out->request_timeout_s = (int)s_int(d, "gateway.request_timeout_s", g->request_timeout_s, 0, 86400, 0);
    if (!g->api_keys_count)
        return;
    out->keys = calloc(g->api_keys_count, sizeof *out->keys);
    if (!out->keys) {
        topo_diag_err(d, "gateway.api_keys", "out of memory");
        return;
    }
    out->n_keys = (int)g->api_keys_count;
    for (int i = 0; i < out->n_keys; i++) {
        const raw_api_key_t *r = &g->api_keys[i];
        topo_api_key_t *k = &out->keys[i];
        char p[64], def[32];
        snprintf(p, sizeof p, "gateway.api_keys[%d].key", i);
        s_str(d, p, r->key, NULL, k->key, sizeof k->key, 0);
        size_t kl = strlen(k->key);
        if (!r->key)
            topo_diag_err(d, p, "missing");
        else if (kl && kl < 8)
            topo_diag_err(d, p, "too short (%zu bytes, at least 8)", kl);
        for (size_t j = 0; j < kl; j++)
            if (k->key[j] <= ' ' || k->key[j] > '~') {
                topo_diag_err(d, p, "only printable ASCII without spaces");
                break;
            }
        for (int j = 0; j < i && kl; j++)
            if (strcmp(out->keys[j].key, k->key) == 0)
                topo_diag_err(d, p, "the same key as gateway.api_keys[%d]", j);
        snprintf(p, sizeof p, "gateway.api_keys[%d].tenant", i);
        snprintf(def, sizeof def, "key-%d", i);
        s_name(d, p, r->tenant, def, k->tenant, sizeof k->tenant);
        snprintf(p, sizeof p, "gateway.api_keys[%d].requests_per_minute", i);
        k->requests_per_minute = (int)s_int(d, p, r->requests_per_minute, 0, 100000000, 0);
        snprintf(p, sizeof p, "gateway.api_keys[%d].tokens_per_minute", i);
        k->tokens_per_minute = (int)s_int(d, p, r->tokens_per_minute, 0, 2000000000, 0);
    }
}

/* Instances in file order; names unique; reserved socket names refused. */
static void s_expand(topo_diag_t *d, topo_t *t)
{
    int total = 0;
    for (int i = 0; i < t->n_actors; i++)
        total += t->actors[i].count;
    if (total > INSTANCES_MAX) {
        topo_diag_err(d, "actors", "%d instances in all; at most %d", total, INSTANCES_MAX);
        return;
    }
    t->instances = calloc((size_t)(total ? total : 1), sizeof *t->instances);
    if (!t->instances) {
        topo_diag_err(d, "actors", "out of memory");
        return;
    }
    for (int i = 0; i < t->n_actors; i++) {
        const topo_actor_t *a = &t->actors[i];
        if (!a->name[0])
            continue;                    /* unknown role and no name: already reported */
        char p[TOPO_FIELD_PATH_MAX];
        snprintf(p, sizeof p, "actors[%d].name", i);
        for (int k = 0; k < a->count; k++) {
            topo_instance_t *in = &t->instances[t->n_instances];
            /* a->name leaves room for "-255" (COUNT_MAX), so this never truncates. */
            int w = a->count > 1 ? snprintf(in->name, sizeof in->name, "%s-%d", a->name, k)
                                 : snprintf(in->name, sizeof in->name, "%s", a->name);
            if (w < 0 || (size_t)w >= sizeof in->name) {
                topo_diag_err(d, p, "instance name '%s-%d' is too long", a->name, k);
                continue;
            }
            if (strcmp(in->name, "control") == 0 || strcmp(in->name, "stats") == 0) {
                topo_diag_err(d, p, "instance name '%s' is reserved (the supervisor's and monitor's "
                              "sockets use it)", in->name);
                continue;
            }
            int dup = 0;
            for (int j = 0; j < t->n_instances && !dup; j++) {
                if (strcmp(t->instances[j].name, in->name) == 0) {
                    topo_diag_err(d, p, "instance name '%s' is already used by actors[%d]; give this "
                                  "entry its own name", in->name, t->instances[j].actor);
                    dup = 1;
                }
            }
            if (dup)
                continue;
            in->role = a->role;
            in->index = k;
            in->actor = i;
            in->node = a->node < 0 ? 0 : a->node;
            in->gpu = a->n_gpus == 0 ? -1 : a->n_gpus == 1 ? a->gpus[0]
                    : k < a->n_gpus ? a->gpus[k] : -1;
            in->restart = a->restart;
            in->order = t->n_instances;
            t->n_instances++;
        }
    }
}

/* ---- the endpoints section: given, derived, checked -------------------------------------- */

/* The file's own client and inspect endpoints, parsed: derived ports step over their tcp ports,
 * so those must be known before any port is derived. */
typedef struct {
    s_ep_t ep[TOPO_ROUTERS_MAX + 1];     /* every client endpoint's, then inspect's */
    int ok[TOPO_ROUTERS_MAX + 1];        /* ep[i] parsed */
    int n;                               /* entries in use: n_clients + 1 */
} s_fixed_t;

/* Takes the next derived port, skipping the client (every router's) and inspect ports so derived endpoints never
 * clash with them. */
static int s_next_port(int *port, const s_fixed_t *f)
{
    for (int i = 0; i < f->n; i++)
        if (f->ok[i] && f->ep[i].tcp && *port == f->ep[i].port) {
            (*port)++;
            i = -1;   /* from the start: the next port may be another's */
        }
    return (*port)++;
}

/* A wildcard bind needs both the explicit opt-in and CURVE keys: say which are missing. */
static void s_wildcard(topo_diag_t *d, const topo_t *t, const char *path, const char *ep)
{
    int keys = t->security.curve_server_public[0] && t->security.curve_server_secret[0];
    if (t->security.allow_wildcard && keys)
        return;
    topo_diag_err(d, path, "%s binds all interfaces: that needs %s%s%s", ep,
                  t->security.allow_wildcard ? "" : "security.allow_wildcard: true",
                  !t->security.allow_wildcard && !keys ? " and " : "",
                  keys ? "" : "CURVE keys (security.curve_server_public and curve_server_secret)");
}

/* endpoints.clients: one a router, in instance order; with one router it may be left out
 * (endpoints.client alone). endpoints.client is its first entry. Each is parsed into f here so
 * a bad one is reported once, under the field the user wrote. */
static void s_clients(topo_diag_t *d, const raw_endpoints_t *e, topo_t *t, s_fixed_t *f)
{
    topo_endpoints_t *out = &t->endpoints;
    char why[TOPO_ERROR_LEN / 2];
    const int n_routers = topo_count_role(t, ROLE_ROUTER);
    s_str(d, "endpoints.client", e->client, e->clients_count ? NULL : DEFAULT_CLIENT, out->client,
          sizeof out->client, 0);
    out->n_clients = 0;
    if (e->clients_count) {
        if ((int)e->clients_count != n_routers)
            topo_diag_err(d, "endpoints.clients", "%u entries for %d router instances (one each, in order)",
                          e->clients_count, n_routers);
        for (unsigned i = 0; i < e->clients_count && i < TOPO_ROUTERS_MAX; i++) {
            char p[TOPO_FIELD_PATH_MAX];
            snprintf(p, sizeof p, "endpoints.clients[%u]", i);
            s_str(d, p, e->clients[i], NULL, out->clients[i], sizeof out->clients[i], 0);
            out->n_clients++;
        }
        if (out->client[0] && strcmp(out->client, out->clients[0]) != 0)
            topo_diag_err(d, "endpoints.client", "%s differs from endpoints.clients[0] (%s): it is the first "
                          "router's; leave it out", out->client, out->clients[0]);
        memcpy(out->client, out->clients[0], sizeof out->client);
    } else {
        if (n_routers > 1)
            topo_diag_err(d, "endpoints.clients", "missing: the topology has %d router instances: give each "
                          "its client endpoint, in order", n_routers);
        memcpy(out->clients[0], out->client, sizeof out->client);
        out->n_clients = 1;
    }
    for (int i = 0; i < out->n_clients; i++) {
        char p[TOPO_FIELD_PATH_MAX];
        if (e->clients_count)
            snprintf(p, sizeof p, "endpoints.clients[%d]", i);
        else
            snprintf(p, sizeof p, "endpoints.client");
        if (out->clients[i][0] && !(f->ok[i] = s_ep_parse(out->clients[i], &f->ep[i], why, sizeof why) == 0))
            topo_diag_err(d, p, "%s", why);
    }
}

/* inspect is the last fixed endpoint: it takes the entry after the clients'. */
static void s_inspect(topo_diag_t *d, const raw_endpoints_t *e, topo_endpoints_t *out, s_fixed_t *f)
{
    char why[TOPO_ERROR_LEN / 2];
    f->n = out->n_clients + 1;
    s_str(d, "endpoints.inspect", e->inspect, DEFAULT_INSPECT, out->inspect, sizeof out->inspect, 0);
    if (out->inspect[0] &&
        !(f->ok[out->n_clients] = s_ep_parse(out->inspect, &f->ep[out->n_clients], why, sizeof why) == 0))
        topo_diag_err(d, "endpoints.inspect", "%s", why);
}

/* Optional; Prometheus scrapes over HTTP, so only tcp:// will do. */
static void s_metrics(topo_diag_t *d, const raw_endpoints_t *e, topo_endpoints_t *out)
{
    char why[TOPO_ERROR_LEN / 2];
    s_str(d, "endpoints.metrics", e->metrics, "", out->metrics, sizeof out->metrics, 1);
    if (out->metrics[0]) {
        s_ep_t mep = { 0 };
        if (s_ep_parse(out->metrics, &mep, why, sizeof why) != 0)
            topo_diag_err(d, "endpoints.metrics", "%s", why);
        else if (!mep.tcp)
            topo_diag_err(d, "endpoints.metrics", "'%s': Prometheus scrapes over HTTP: give a tcp:// endpoint",
                          out->metrics);
    }
}

/* The gateway's HTTP endpoint: bound (and checked for clashes) only when a gateway exists. */
static void s_http(topo_diag_t *d, const raw_endpoints_t *e, topo_t *t)
{
    topo_endpoints_t *out = &t->endpoints;
    char why[TOPO_ERROR_LEN / 2];
    int gateway = topo_first(t, ROLE_GATEWAY) != NULL;
    s_str(d, "endpoints.http", e->http, gateway ? "tcp://127.0.0.1:8000" : "", out->http, sizeof out->http, 1);
    if (out->http[0]) {
        s_ep_t hep = { 0 };
        if (s_ep_parse(out->http, &hep, why, sizeof why) != 0)
            topo_diag_err(d, "endpoints.http", "%s", why);
        else if (!hep.tcp)
            topo_diag_err(d, "endpoints.http", "'%s': the gateway serves HTTP: give a tcp:// endpoint", out->http);
        else if (s_wildcard_host(hep.host) && !t->security.allow_wildcard)
            /* HTTP has no CURVE: the API keys guard it, and the file must opt in to all interfaces. */
            topo_diag_err(d, "endpoints.http", "%s binds all interfaces: that needs security.allow_wildcard: true",
                          out->http);
    }
}

/* What the derived endpoints are made from: the run dir (ipc), bind_interface and base_port (tcp). */
static void s_derive_inputs(topo_diag_t *d, const raw_endpoints_t *e, topo_t *t)
{
    topo_endpoints_t *out = &t->endpoints;
    char def_run[TOPO_PATH_MAX];
    snprintf(def_run, sizeof def_run, "/tmp/troupe-%s-%u", t->name, (unsigned)getuid());
    s_str(d, "endpoints.run_dir", e->run_dir, def_run, out->run_dir, sizeof out->run_dir, 0);
    size_t rl = strlen(out->run_dir);
    while (rl > 1 && out->run_dir[rl - 1] == '/')
        out->run_dir[--rl] = '\0';
    s_str(d, "endpoints.bind_interface", e->bind_interface, NULL, out->bind_interface,
          sizeof out->bind_interface, 0);
    if (strpbrk(out->bind_interface, "/[] \t") || strlen(out->bind_interface) > TOPO_HOST_MAX)
        topo_diag_err(d, "endpoints.bind_interface", "'%s' is not a host, IP address or interface name",
                      out->bind_interface);
    out->base_port = (int)s_int(d, "endpoints.base_port", e->base_port, 1024, 65535, DEFAULT_BASE_PORT);
}

/* Multi-node: any two nodes in use, or one reached by ssh/srun; then internal sockets are tcp. */
static int s_multi_node(const topo_t *t)
{
    int first_node = -1, multi = 0;
    for (int i = 0; i < t->n_instances; i++) {
        int nd = t->instances[i].node;
        if (first_node < 0)
            first_node = nd;
        if (nd != first_node || t->nodes[nd].launch != TOPO_LAUNCH_LOCAL)
            multi = 1;
    }
    return multi;
}

/* One machine: every internal socket is an ipc file in the run dir; control may be overridden. */
static void s_derive_ipc(topo_diag_t *d, const raw_endpoints_t *e, topo_t *t)
{
    topo_endpoints_t *out = &t->endpoints;
    snprintf(out->control, sizeof out->control, "ipc://%s/control.sock", out->run_dir);
    snprintf(out->stats, sizeof out->stats, "ipc://%s/stats.sock", out->run_dir);
    for (int i = 0; i < t->n_instances; i++) {
        topo_instance_t *in = &t->instances[i];
        snprintf(in->inbox, sizeof in->inbox, "ipc://%s/%s.sock", out->run_dir, in->name);
        memcpy(in->inbox_bind, in->inbox, sizeof in->inbox);
    }
    memcpy(out->control_bind, out->control, sizeof out->control);
    memcpy(out->stats_bind, out->stats, sizeof out->stats);
    if (e->control) {
        s_str(d, "endpoints.control", e->control, NULL, out->control, sizeof out->control, 0);
        memcpy(out->control_bind, out->control, sizeof out->control);
    }
}

/* The supervisor binds control on its own machine: the first node it launches locally (-1: none). */
static int s_supervisor_node(const topo_t *t)
{
    int sup = -1;
    for (int k = 0; k < t->n_nodes && sup < 0; k++)
        if (t->nodes[k].launch == TOPO_LAUNCH_LOCAL)
            sup = k;
    return sup;
}

/* Control over tcp: the file's own (which must be tcp, peers on other nodes connect to it), else
 * port p0 on the supervisor's node. bind_interface moves only where it binds. */
static void s_tcp_control(topo_diag_t *d, const raw_endpoints_t *e, topo_t *t, int sup, int p0)
{
    topo_endpoints_t *out = &t->endpoints;
    const char *bif = out->bind_interface;
    char why[TOPO_ERROR_LEN / 2];
    if (e->control) {
        s_str(d, "endpoints.control", e->control, NULL, out->control, sizeof out->control, 0);
        s_ep_t c;
        int parsed_ok = out->control[0] && s_ep_parse(out->control, &c, why, sizeof why) == 0;
        if (parsed_ok && !c.tcp)
            topo_diag_err(d, "endpoints.control", "'%s': actors on other nodes cannot reach an ipc "
                          "socket; use tcp://<supervisor host>:<port>", out->control);
        if (parsed_ok && c.tcp && bif[0])
            s_tcp(out->control_bind, sizeof out->control_bind, bif, c.port);
        else
            memcpy(out->control_bind, out->control, sizeof out->control);
    } else {
        if (sup < 0) {
            topo_diag_err(d, "endpoints", "control: missing: no node is launched locally, so the "
                          "supervisor's own address is unknown; set endpoints.control: "
                          "tcp://<supervisor host>:<port>");
        } else {
            s_tcp(out->control, sizeof out->control, t->nodes[sup].address, p0);
            s_tcp(out->control_bind, sizeof out->control_bind, bif[0] ? bif : t->nodes[sup].address, p0);
        }
    }
}

/* Remote peers cannot reach a loopback address: checked for every node in use, and for the
 * supervisor's when control is derived from it. */
static void s_remote_loopback(topo_diag_t *d, const raw_topo_t *raw, const raw_endpoints_t *e,
                              const topo_t *t, int sup)
{
    int remote = 0;
    for (int i = 0; i < t->n_instances; i++)
        remote |= t->nodes[t->instances[i].node].launch != TOPO_LAUNCH_LOCAL;
    if (!remote)
        return;
    for (int k = 0; k < t->n_nodes; k++) {
        int used = 0;
        for (int i = 0; i < t->n_instances; i++)
            used |= t->instances[i].node == k;
        /* An address left out defaults to loopback; that case is reported in s_nodes. */
        int given = !raw->nodes || raw->nodes[k].address;
        if ((used || (!e->control && k == sup)) && given && s_loopback_host(t->nodes[k].address)) {
            char p[TOPO_FIELD_PATH_MAX];
            snprintf(p, sizeof p, "nodes[%d].address", k);
            topo_diag_err(d, p, "'%s' is loopback, but actors on other machines must reach "
                          "node '%s': give its routable address", t->nodes[k].address,
                          t->nodes[k].name);
        }
    }
}

/* Several machines: control, stats and every inbox on tcp, ports counted up from base_port in
 * that order, stepping over the fixed ones. */
static void s_derive_tcp(topo_diag_t *d, const raw_topo_t *raw, const raw_endpoints_t *e, topo_t *t,
                         const s_fixed_t *f)
{
    topo_endpoints_t *out = &t->endpoints;
    const char *bif = out->bind_interface;
    int port = out->base_port;
    /* base_port+0 belongs to control even when the file names control itself, so the other
     * derived ports do not move when a printed topology (which spells control out) is reloaded. */
    int p0 = s_next_port(&port, f);
    int sup = s_supervisor_node(t);
    s_tcp_control(d, e, t, sup, p0);
    const topo_instance_t *mon = topo_first(t, ROLE_MONITOR);
    const topo_node_t *mn = &t->nodes[mon ? mon->node : 0];
    int ps = s_next_port(&port, f);
    s_tcp(out->stats, sizeof out->stats, mn->address, ps);
    s_tcp(out->stats_bind, sizeof out->stats_bind, bif[0] ? bif : mn->address, ps);
    for (int i = 0; i < t->n_instances; i++) {
        topo_instance_t *in = &t->instances[i];
        const topo_node_t *nd = &t->nodes[in->node];
        int pi = s_next_port(&port, f);
        s_tcp(in->inbox, sizeof in->inbox, nd->address, pi);
        s_tcp(in->inbox_bind, sizeof in->inbox_bind, bif[0] ? bif : nd->address, pi);
    }
    if (port - 1 > 65535) {
        topo_diag_err(d, "endpoints.base_port", "%d derived ports from %d run past 65535: lower it",
                      port - out->base_port, out->base_port);
    }
    s_remote_loopback(d, raw, e, t, sup);
}

typedef struct {
    const char *what;                    /* "endpoints.client", "instance 'router'" */
    const char *path;                    /* field path for the line */
    const char *ep;                      /* the bind string */
} s_bound_t;

/* Everything that binds, in reporting order: the file's own endpoints first, then derived ones. */
typedef struct {
    s_bound_t *b;                        /* [cap] */
    char (*labels)[TOPO_NAME_MAX + 16];  /* [cap]: storage for b[i].what of instances */
    char (*paths)[TOPO_FIELD_PATH_MAX];  /* [cap]: storage for b[i].path of clients and instances */
    s_ep_t *parsed;                      /* [n] */
    int *ok;                             /* [n]: parsed[i] is valid */
    int n;                               /* entries in use */
    int n_explicit;                      /* b[0 .. n_explicit): the file's clients and inspect */
} s_binds_t;

static void s_binds_free(s_binds_t *s)
{
    free(s->parsed);
    free(s->ok);
    free(s->b);
    free(s->labels);
    free(s->paths);
}

static void s_binds_collect(const raw_endpoints_t *e, const topo_t *t, s_binds_t *s)
{
    const topo_endpoints_t *out = &t->endpoints;
    int gateway = topo_first(t, ROLE_GATEWAY) != NULL;
    s_bound_t *b = s->b;
    int n = 0;
    if (e->clients_count) {
        for (int i = 0; i < out->n_clients; i++) {
            snprintf(s->paths[n], sizeof s->paths[n], "endpoints.clients[%d]", i);
            b[n] = (s_bound_t){ s->paths[n], s->paths[n], out->clients[i] };
            n++;
        }
    } else {
        b[n++] = (s_bound_t){ "endpoints.client", "endpoints.client", out->client };
    }
    b[n++] = (s_bound_t){ "endpoints.inspect", "endpoints.inspect", out->inspect };
    s->n_explicit = n;   /* the file's own endpoints (parse errors reported by s_clients, s_inspect) */
    if (out->metrics[0])
        b[n++] = (s_bound_t){ "endpoints.metrics", "endpoints.metrics", out->metrics };
    if (out->http[0] && gateway)
        b[n++] = (s_bound_t){ "endpoints.http", "endpoints.http", out->http };
    if (out->control_bind[0])
        b[n++] = (s_bound_t){ "the control endpoint", e->control ? "endpoints.control" : "endpoints",
                              out->control_bind };
    b[n++] = (s_bound_t){ "the stats endpoint", "endpoints", out->stats_bind };
    for (int i = 0; i < t->n_instances; i++) {
        snprintf(s->labels[n], sizeof s->labels[n], "instance '%s'", t->instances[i].name);
        snprintf(s->paths[n], sizeof s->paths[n], "actors[%d]", t->instances[i].actor);
        b[n] = (s_bound_t){ s->labels[n], s->paths[n], t->instances[i].inbox_bind };
        n++;
    }
    s->n = n;
}

/* Parses every bind into s->parsed; reports derived ones that fail (a too-long run_dir once, not
 * per socket) and wildcard binds the file did not opt in to. */
static void s_binds_parse(topo_diag_t *d, const topo_t *t, s_binds_t *s)
{
    const s_bound_t *b = s->b;
    char why[TOPO_ERROR_LEN / 2];
    int path_reported = 0;
    for (int i = 0; i < s->n; i++) {
        s->ok[i] = b[i].ep[0] && s_ep_parse(b[i].ep, &s->parsed[i], why, sizeof why) == 0;
        if (!s->ok[i] && b[i].ep[0] && i >= s->n_explicit) {
            /* Derived endpoints fail only on a too-long run_dir (or a bad control override). */
            int explicit_control = strcmp(b[i].path, "endpoints.control") == 0;
            if (strncmp(b[i].ep, "ipc://", 6) == 0 && !explicit_control && !path_reported) {
                topo_diag_err(d, "endpoints.run_dir", "'%s' is too long for Unix socket paths: %s",
                              t->endpoints.run_dir, why);
                path_reported = 1;
            } else if (strncmp(b[i].ep, "ipc://", 6) != 0 || explicit_control) {
                topo_diag_err(d, b[i].path, "%s", why);
            }
        }
        /* Derived endpoints bind wildcards only through bind_interface: reported once, by s_check_binds. */
        if (s->ok[i] && s->parsed[i].tcp && s_wildcard_host(s->parsed[i].host) &&
            (i < s->n_explicit || strcmp(b[i].path, "endpoints.control") == 0))
            s_wildcard(d, t, b[i].path, b[i].ep);
        /* /metrics is plain HTTP, never CURVE: all interfaces only by the explicit opt-in. */
        if (s->ok[i] && s->parsed[i].tcp && s_wildcard_host(s->parsed[i].host) &&
            strcmp(b[i].path, "endpoints.metrics") == 0 && !t->security.allow_wildcard)
            topo_diag_err(d, b[i].path, "%s binds all interfaces with plain HTTP (CURVE does not cover "
                          "/metrics): that needs security.allow_wildcard: true", b[i].ep);
    }
}

/* Two binds clash on the same tcp port (same host, or either a wildcard) or the same ipc path;
 * each is reported once, against the first earlier bind it clashes with. */
static void s_binds_clash(topo_diag_t *d, const s_binds_t *s)
{
    const s_bound_t *b = s->b;
    const s_ep_t *parsed = s->parsed;
    for (int i = 0; i < s->n; i++) {
        for (int j = 0; j < i; j++) {
            if (!s->ok[i] || !s->ok[j] || parsed[i].tcp != parsed[j].tcp)
                continue;
            int clash = parsed[i].tcp
                ? parsed[i].port == parsed[j].port &&
                  (strcmp(parsed[i].host, parsed[j].host) == 0 || s_wildcard_host(parsed[i].host) ||
                   s_wildcard_host(parsed[j].host))
                : strcmp(parsed[i].path, parsed[j].path) == 0;
            if (clash) {
                if (strcmp(b[i].what, b[i].path) == 0)
                    topo_diag_err(d, b[i].path, "%s is already bound by %s", b[i].ep, b[j].what);
                else
                    topo_diag_err(d, b[i].path, "%s binds %s, already bound by %s", b[i].what,
                                  b[i].ep, b[j].what);
                break;
            }
        }
    }
}

/* Everything that binds, for clash, wildcard and path-length checks: last, once every endpoint
 * is known. */
static void s_check_binds(topo_diag_t *d, const raw_endpoints_t *e, const topo_t *t)
{
    int cap = 6 + TOPO_ROUTERS_MAX + t->n_instances;
    s_binds_t s = { 0 };
    s.b = calloc((size_t)cap, sizeof *s.b);
    s.labels = calloc((size_t)cap, sizeof *s.labels);
    s.paths = calloc((size_t)cap, sizeof *s.paths);
    if (!s.b || !s.labels || !s.paths) {
        topo_diag_err(d, "endpoints", "out of memory");
        s_binds_free(&s);
        return;
    }
    s_binds_collect(e, t, &s);
    s.parsed = calloc((size_t)s.n, sizeof *s.parsed);
    s.ok = calloc((size_t)s.n, sizeof *s.ok);
    if (s.parsed && s.ok) {
        s_binds_parse(d, t, &s);
        s_binds_clash(d, &s);
    }
    if (s_wildcard_host(t->endpoints.bind_interface) && t->multi_node)
        s_wildcard(d, t, "endpoints.bind_interface", t->endpoints.bind_interface);
    if (!s.parsed || !s.ok)
        topo_diag_err(d, "endpoints", "out of memory");
    s_binds_free(&s);
}

/* Run dir, control, stats, inboxes; then clashes, wildcards and socket path lengths. The order
 * is the order problems are reported in, and the fixed endpoints come first because the derived
 * ports step over them. */
static void s_endpoints(topo_diag_t *d, const raw_topo_t *raw, topo_t *t)
{
    static const raw_endpoints_t none;
    const raw_endpoints_t *e = raw->endpoints ? raw->endpoints : &none;
    s_fixed_t fixed = { 0 };
    s_clients(d, e, t, &fixed);
    s_inspect(d, e, &t->endpoints, &fixed);
    s_metrics(d, e, &t->endpoints);
    s_http(d, e, t);
    s_derive_inputs(d, e, t);
    t->multi_node = s_multi_node(t);
    if (!t->multi_node)
        s_derive_ipc(d, e, t);
    else
        s_derive_tcp(d, raw, e, t, &fixed);
    s_check_binds(d, e, t);
}

int topo_build(topo_diag_t *d, const raw_topo_t *raw, topo_t *t)
{
    int before = s_problems(d);
    s_name(d, "name", raw->name, "troupe", t->name, sizeof t->name);
    if (!t->name[0])
        snprintf(t->name, sizeof t->name, "troupe");
    s_model(d, raw->model, &t->model);
    s_nodes(d, raw, t);
    s_actors(d, raw, t);
    s_roles(d, t);
    s_limits(d, raw, t);
    s_gateway(d, raw, t);
    s_experts(d, raw, t);
    s_expand(d, t);
    if (t->instances && t->n_nodes > 0)
        s_endpoints(d, raw, t);
    return s_problems(d) == before ? 0 : -1;
}
