/* tests/unit/test_topology.c — the topology loader: examples, defaults, expansion, derived
 * endpoints, and every bad file's messages (field path, line, and all problems at once).
 * Run from the repository root (fixtures and examples are opened by relative path). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "topology/topology.h"

#define MIN_ACTORS "actors:\n  - role: monitor\n  - role: router\n  - role: prefill\n  - role: decode\n"
#define MINIMAL "model:\n  path: m\n" MIN_ACTORS

static topo_errors_t s_errs;             /* 32 KiB: static rather than on the stack */

static topo_t *s_ok(const char *yaml)
{
    topo_t *t = NULL;
    topo_errors_clear(&s_errs);
    int rc = topo_load_string(yaml, strlen(yaml), "inline.yaml", &t, &s_errs);
    if (rc != 0)
        topo_errors_print(&s_errs, stderr);
    assert_int_equal(rc, 0);
    assert_non_null(t);
    assert_int_equal(s_errs.count, 0);
    return t;
}

/* Loads yaml expecting failure; the problems are left in s_errs. */
static void s_bad(const char *yaml)
{
    topo_t *t = (topo_t *)0x1;
    topo_errors_clear(&s_errs);
    assert_int_equal(topo_load_string(yaml, strlen(yaml), "inline.yaml", &t, &s_errs), -1);
    assert_null(t);
    assert_true(s_errs.count > 0);
}

static void s_bad_file(const char *path)
{
    topo_t *t = (topo_t *)0x1;
    topo_errors_clear(&s_errs);
    assert_int_equal(topo_load_file(path, &t, &s_errs), -1);
    assert_null(t);
    assert_true(s_errs.count > 0);
}

/* Asserts some problem contains needle, printing them all when none does. */
#define assert_err(needle)                                                               \
    do {                                                                                 \
        if (!topo_errors_contain(&s_errs, (needle))) {                                   \
            fprintf(stderr, "no problem contains \"%s\"; got:\n", (needle));             \
            topo_errors_print(&s_errs, stderr);                                          \
            fail();                                                                      \
        }                                                                                \
    } while (0)

static void test_role_names(void **state)
{
    (void)state;
    for (int r = 0; r < ROLE_COUNT; r++) {
        topo_role_t back;
        assert_int_equal(topo_role_parse(topo_role_name((topo_role_t)r), &back), 0);
        assert_int_equal(back, r);
    }
    assert_string_equal(topo_role_name(ROLE_CACHE_MANAGER), "cache-manager");
    assert_string_equal(topo_role_name(ROLE_COUNT), "?");
    topo_role_t r;
    assert_int_equal(topo_role_parse("decoder", &r), -1);
    assert_int_equal(topo_role_parse("Router", &r), -1);
    assert_int_equal(topo_role_parse(NULL, &r), -1);
}

static void test_examples_load(void **state)
{
    (void)state;
    topo_t *t = NULL;
    topo_errors_clear(&s_errs);
    assert_int_equal(topo_load_file("topology/examples/cpu-default.yaml", &t, &s_errs), 0);
    assert_string_equal(t->name, "cpu-default");
    assert_int_equal(t->model.backend, TOPO_BACKEND_CPU);
    /* The real model in the repository, its tokenizer beside it, weights as stored. */
    assert_string_equal(t->model.path, "models/kjv-tiny");
    assert_string_equal(t->model.tokenizer, "models/kjv-tiny");
    assert_int_equal(t->model.load_format, TOPO_LOAD_AUTO);
    assert_int_equal(t->limits.max_model_len, 1024);
    assert_int_equal(t->n_instances, 7);
    for (int r = 0; r < ROLE_COUNT; r++)   /* every role once; the gateway is optional */
        assert_int_equal(topo_count_role(t, (topo_role_t)r), r == ROLE_GATEWAY ? 0 : 1);
    assert_int_equal(t->multi_node, 0);
    topo_destroy(&t);
    assert_null(t);
    topo_destroy(&t);                    /* idempotent */

    /* The same cluster on the Qwen3-shaped random-weight model. */
    assert_int_equal(topo_load_file("topology/examples/qwen3-shape-random.yaml", &t, &s_errs), 0);
    assert_string_equal(t->name, "qwen3-shape-random");
    assert_int_equal(t->model.dtype, DT_BF16);
    assert_int_equal(t->model.load_format, TOPO_LOAD_DUMMY);
    assert_string_equal(t->model.path, "tests/fixtures/models/qwen3-demo-shape");
    assert_string_equal(t->model.tokenizer, "third_party/tokenizers/qwen3");
    assert_int_equal(t->n_instances, 7);
    topo_destroy(&t);

    assert_int_equal(topo_load_file("topology/examples/h200-1gpu.yaml", &t, &s_errs), 0);
    assert_int_equal(t->model.backend, TOPO_BACKEND_CUDA);
    assert_int_equal(t->model.dtype, DT_BF16);
    assert_string_equal(t->model.path, "models/Llama-3.1-8B-Instruct");
    assert_int_equal(t->nodes[0].gpus, 1);
    assert_int_equal(topo_find(t, "prefill")->gpu, 0);
    assert_int_equal(topo_find(t, "decode")->gpu, 0);
    assert_int_equal(topo_find(t, "router")->gpu, -1);
    topo_destroy(&t);

    assert_int_equal(topo_load_file("topology/examples/moe-8gpu.yaml", &t, &s_errs), 0);
    assert_int_equal(t->nodes[0].gpus, 8);
    assert_int_equal(topo_count_role(t, ROLE_PREFILL), 2);
    assert_int_equal(topo_count_role(t, ROLE_DECODE), 6);
    assert_int_equal(topo_count_role(t, ROLE_EXPERT_BALANCER), 1);
    assert_int_equal(topo_find(t, "prefill-1")->gpu, 1);
    for (int i = 0; i < 6; i++) {
        char name[16];
        snprintf(name, sizeof name, "decode-%d", i);
        const topo_instance_t *in = topo_find(t, name);
        assert_non_null(in);
        assert_int_equal(in->gpu, 2 + i);
        assert_int_equal(in->index, i);
        assert_int_equal(t->actors[in->actor].ep, 1);
    }
    assert_null(topo_find(t, "decode"));
    assert_int_equal(t->supervision.strategy, TOPO_STRATEGY_REST_FOR_ONE);
    topo_destroy(&t);

    assert_int_equal(topo_load_file("topology/examples/cpu-moe-ep.yaml", &t, &s_errs), 0);
    assert_int_equal(topo_count_role(t, ROLE_DECODE), 4);
    for (int i = 0; i < 4; i++) {   /* one group: decode-0 .. decode-3, ranks 0..3 */
        char name[16];
        snprintf(name, sizeof name, "decode-%d", i);
        const topo_instance_t *in = topo_find(t, name);
        assert_non_null(in);
        assert_int_equal(in->index, i);
        assert_int_equal(t->actors[in->actor].ep, 4);
    }
    assert_int_equal(t->experts.redundant_slots, 1);
    topo_destroy(&t);
}

static void test_defaults(void **state)
{
    (void)state;
    topo_t *t = s_ok(MINIMAL);
    assert_string_equal(t->name, "troupe");
    assert_string_equal(t->source, "inline.yaml");
    assert_string_equal(t->model.path, "m");
    assert_string_equal(t->model.tokenizer, "m");
    assert_int_equal(t->model.backend, TOPO_BACKEND_CPU);
    assert_int_equal(t->model.dtype, DT_F32);
    assert_int_equal(t->model.kv_dtype, DT_COUNT);          /* auto */
    assert_int_equal(t->model.load_format, TOPO_LOAD_AUTO);
    assert_int_equal(t->model.threads, 0);
    assert_int_equal(t->experts.window_steps, 1000);
    assert_int_equal(t->experts.load_half_life_windows, 10);
    assert_int_equal(t->n_nodes, 1);
    assert_string_equal(t->nodes[0].name, "local");
    assert_string_equal(t->nodes[0].address, "127.0.0.1");
    assert_int_equal(t->nodes[0].launch, TOPO_LAUNCH_LOCAL);
    assert_int_equal(t->nodes[0].gpus, 0);
    assert_string_equal(t->nodes[0].ssh, "ssh -o BatchMode=yes {address}");
    assert_string_equal(t->nodes[0].workdir, "");
    for (int i = 0; i < t->n_actors; i++) {
        assert_int_equal(t->actors[i].count, 1);
        assert_int_equal(t->actors[i].tp, 1);
        assert_int_equal(t->actors[i].ep, 1);
        assert_int_equal(t->actors[i].node, 0);
        assert_int_equal(t->actors[i].n_gpus, 0);
        assert_int_equal(t->actors[i].restart, TOPO_RESTART_PERMANENT);
        assert_string_equal(t->actors[i].name, topo_role_name(t->actors[i].role));
    }
    assert_string_equal(t->endpoints.client, "tcp://127.0.0.1:5555");
    assert_string_equal(t->endpoints.inspect, "tcp://127.0.0.1:5556");
    char run_dir[128];
    snprintf(run_dir, sizeof run_dir, "/tmp/troupe-troupe-%u", (unsigned)getuid());
    assert_string_equal(t->endpoints.run_dir, run_dir);
    assert_string_equal(t->endpoints.bind_interface, "");
    assert_int_equal(t->endpoints.base_port, 5600);
    assert_int_equal(t->limits.max_message_bytes, 16777216);
    assert_int_equal(t->limits.send_hwm, 1000);
    assert_int_equal(t->limits.recv_hwm, 1000);
    assert_int_equal(t->limits.outbox, 1024);
    assert_int_equal(t->limits.admission_queue, 256);
    assert_int_equal(t->limits.max_batch, 64);
    assert_int_equal(t->limits.prefill_chunk_tokens, 512);
    assert_int_equal(t->limits.kv_blocks, 0);
    assert_int_equal(t->limits.max_model_len, 4096);
    assert_int_equal(t->cache.block_size, 16);
    assert_int_equal(t->cache.host_store_blocks, 4096);
    assert_int_equal(t->cache.default_retention_s, 300);
    assert_int_equal(t->supervision.strategy, TOPO_STRATEGY_ONE_FOR_ONE);
    assert_int_equal(t->supervision.max_restarts, 5);
    assert_int_equal(t->supervision.period_s, 10);
    assert_int_equal(t->supervision.ready_timeout_s, 60);
    assert_int_equal(t->supervision.grace_s, 5);
    assert_int_equal(t->supervision.heartbeat_ms, 500);
    assert_int_equal(t->supervision.liveness, 3);
    assert_string_equal(t->security.curve_server_public, "");
    assert_int_equal(t->security.allow_wildcard, 0);
    topo_destroy(&t);

    /* The dtype default follows the backend; an explicit value wins. */
    t = s_ok("model:\n  path: m\n  backend: cuda\n  tokenizer: tok\n"
             "nodes:\n  - name: g\n    gpus: 2\n"
             "actors:\n  - role: monitor\n  - role: router\n  - role: prefill\n    gpus: [0]\n"
             "  - role: decode\n    gpus: [1]\n");
    assert_int_equal(t->model.dtype, DT_BF16);
    assert_string_equal(t->model.tokenizer, "tok");
    topo_destroy(&t);
    /* model.draft: none unless given (a path, like model.path). */
    t = s_ok("model:\n  path: m\n" MIN_ACTORS);
    assert_string_equal(t->model.draft, "");
    topo_destroy(&t);
    t = s_ok("model:\n  path: m\n  draft: d/small\n" MIN_ACTORS);
    assert_string_equal(t->model.draft, "d/small");
    topo_destroy(&t);
    t = s_ok("model:\n  path: m\n  dtype: bf16\n  load_format: dummy\n" MIN_ACTORS);
    assert_int_equal(t->model.dtype, DT_BF16);
    assert_int_equal(t->model.load_format, TOPO_LOAD_DUMMY);
    topo_destroy(&t);
}

/* model.kv_dtype: auto (the workers' rule) unless given; fp8 under any of its names; printed so
 * that the printed topology loads back to the same choice. */
static void test_kv_dtype(void **state)
{
    (void)state;
    static const struct { const char *yaml; dtype_t want; } cases[] = {
        {"fp8", DT_F8E4M3}, {"float8_e4m3fn", DT_F8E4M3}, {"FP8_E4M3", DT_F8E4M3}, {"f8e4m3", DT_F8E4M3},
        {"bf16", DT_BF16}, {"f16", DT_F16}, {"float32", DT_F32}, {"auto", DT_COUNT}, {"AUTO", DT_COUNT},
    };
    char yaml[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(yaml, sizeof yaml, "model:\n  path: m\n  kv_dtype: %s\n" MIN_ACTORS, cases[i].yaml);
        topo_t *t = s_ok(yaml);
        assert_int_equal(t->model.kv_dtype, cases[i].want);
        assert_int_equal(t->model.dtype, DT_F32);          /* the weights' dtype is a separate choice */
        char *a = NULL;
        size_t alen = 0;
        FILE *f = open_memstream(&a, &alen);
        topo_print(t, f);
        fclose(f);
        assert_non_null(strstr(a, cases[i].want == DT_COUNT ? "  kv_dtype: auto\n" : "  kv_dtype: "));
        topo_t *t2 = NULL;
        assert_int_equal(topo_load_string(a, alen, "printed", &t2, &s_errs), 0);
        assert_int_equal(t2->model.kv_dtype, cases[i].want);
        free(a);
        topo_destroy(&t);
        topo_destroy(&t2);
    }
    topo_t *t = s_ok("model:\n  path: m\n  kv_dtype: fp8\n" MIN_ACTORS);
    char *a = NULL;
    size_t alen = 0;
    FILE *f = open_memstream(&a, &alen);
    topo_print(t, f);
    fclose(f);
    assert_non_null(strstr(a, "  kv_dtype: fp8\n"));
    free(a);
    topo_destroy(&t);

    /* Bad values name the field and its line; fp8 stays refused as a weight dtype. */
    s_bad("model:\n  path: m\n  kv_dtype: fp4\n" MIN_ACTORS);
    assert_int_equal(s_errs.count, 1);
    assert_string_equal(s_errs.msg[0], "inline.yaml:3: model.kv_dtype: unknown KV cache dtype 'fp4' (expected one of "
                                       "auto, f32, bf16, f16, fp8)");
    s_bad("model:\n  path: m\n  kv_dtype: ''\n" MIN_ACTORS);
    assert_err("inline.yaml:3: model.kv_dtype: unknown KV cache dtype ''");
    s_bad("model:\n  path: m\n  dtype: fp8\n  kv_dtype: fp8_e5m2\n" MIN_ACTORS);
    assert_err("inline.yaml:3: model.dtype: unknown dtype 'fp8'");
    assert_err("inline.yaml:4: model.kv_dtype: unknown KV cache dtype 'fp8_e5m2'");
    assert_int_equal(s_errs.count, 2);
}

/* model.quantization: online quantization at load (the index is BK_Q_*), printed so that the
 * printed topology loads back to the same choice; a bad value names the field. */
static void test_quantization(void **state)
{
    (void)state;
    static const struct { const char *yaml; int want; } cases[] = {
        {"none", 0}, {"fp8", 1}, {"int8", 2}, {"int4", 3}, {"nvfp4", 4},
    };
    char yaml[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(yaml, sizeof yaml, "model:\n  path: m\n  quantization: %s\n" MIN_ACTORS, cases[i].yaml);
        topo_t *t = s_ok(yaml);
        assert_int_equal(t->model.quantization, cases[i].want);
        char *a = NULL;
        size_t alen = 0;
        FILE *f = open_memstream(&a, &alen);
        topo_print(t, f);
        fclose(f);
        char want[64];
        snprintf(want, sizeof want, "  quantization: %s\n", cases[i].yaml);
        assert_non_null(strstr(a, want));
        topo_t *t2 = NULL;
        assert_int_equal(topo_load_string(a, alen, "printed", &t2, &s_errs), 0);
        assert_int_equal(t2->model.quantization, cases[i].want);
        free(a);
        topo_destroy(&t);
        topo_destroy(&t2);
    }
    topo_t *t = s_ok("model:\n  path: m\n" MIN_ACTORS);
    assert_int_equal(t->model.quantization, 0);
    topo_destroy(&t);
    s_bad("model:\n  path: m\n  quantization: fp4\n" MIN_ACTORS);
    assert_int_equal(s_errs.count, 1);
    assert_string_equal(s_errs.msg[0], "inline.yaml:3: model.quantization: unknown online quantization 'fp4' "
                                       "(expected one of none, fp8, int8, int4, nvfp4)");
}

static void test_default_embedded_equals_example(void **state)
{
    (void)state;
    FILE *f = fopen("topology/examples/cpu-default.yaml", "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(n < sizeof buf);
    if (n != topo_default_yaml_len || memcmp(buf, topo_default_yaml, n) != 0)
        fail_msg("topology/default.c is stale: run topology/gen-default.sh");
    assert_int_equal(strlen(topo_default_yaml), topo_default_yaml_len);
    topo_t *t = NULL;
    assert_int_equal(topo_load_default(&t, &s_errs), 0);
    assert_string_equal(t->name, "cpu-default");
    assert_string_equal(t->source, "<default>");
    assert_int_equal(t->n_instances, 7);
    topo_destroy(&t);
}

static void test_expansion_and_naming(void **state)
{
    (void)state;
    topo_t *t = s_ok("model:\n  path: m\n  backend: cuda\n"
                     "nodes:\n  - name: n0\n    gpus: 4\n"
                     "actors:\n"
                     "  - role: monitor\n"
                     "  - role: prefill\n    name: pf\n    count: 3\n    gpus: [1]\n    restart: transient\n"
                     "  - role: decode\n    count: 2\n    gpus: [2, 3]\n    tp: 2\n"
                     "  - role: router\n    restart: temporary\n");
    assert_int_equal(t->n_instances, 7);
    static const char *const names[] = { "monitor", "pf-0", "pf-1", "pf-2", "decode-0", "decode-1", "router" };
    static const int gpus[] = { -1, 1, 1, 1, 2, 3, -1 };
    static const int index[] = { 0, 0, 1, 2, 0, 1, 0 };
    for (int i = 0; i < t->n_instances; i++) {
        assert_string_equal(t->instances[i].name, names[i]);
        assert_int_equal(t->instances[i].order, i);
        assert_int_equal(t->instances[i].gpu, gpus[i]);
        assert_int_equal(t->instances[i].index, index[i]);
        assert_ptr_equal(topo_find(t, names[i]), &t->instances[i]);
    }
    assert_int_equal(t->instances[1].restart, TOPO_RESTART_TRANSIENT);
    assert_int_equal(t->instances[1].actor, 1);
    assert_int_equal(t->instances[6].restart, TOPO_RESTART_TEMPORARY);
    assert_int_equal(t->instances[4].role, ROLE_DECODE);
    assert_ptr_equal(topo_first(t, ROLE_PREFILL), &t->instances[1]);
    assert_null(topo_first(t, ROLE_CACHE_MANAGER));
    assert_int_equal(topo_count_role(t, ROLE_PREFILL), 3);
    assert_null(topo_find(t, "pf"));
    assert_null(topo_find(t, NULL));
    topo_destroy(&t);
}

/* Every endpoint of a topology, for uniqueness checks. */
static void s_assert_unique_endpoints(const topo_t *t)
{
    int n = 2 + t->n_instances;
    const char **eps = calloc((size_t)n, sizeof *eps);
    assert_non_null(eps);
    eps[0] = t->endpoints.control;
    eps[1] = t->endpoints.stats;
    for (int i = 0; i < t->n_instances; i++)
        eps[2 + i] = t->instances[i].inbox;
    for (int i = 0; i < n; i++) {
        assert_true(strlen(eps[i]) > 6);
        assert_string_not_equal(eps[i], t->endpoints.client);
        assert_string_not_equal(eps[i], t->endpoints.inspect);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(eps[i], eps[j]);
    }
    free(eps);
}

static void test_derived_endpoints_single_node(void **state)
{
    (void)state;
    topo_t *t = s_ok("name: c1\nmodel:\n  path: m\nendpoints:\n  run_dir: /tmp/rd/\n"
                     "actors:\n  - role: monitor\n  - role: router\n  - role: prefill\n    count: 4\n"
                     "  - role: decode\n    count: 4\n");
    assert_int_equal(t->multi_node, 0);
    assert_string_equal(t->endpoints.run_dir, "/tmp/rd");
    assert_string_equal(t->endpoints.control, "ipc:///tmp/rd/control.sock");
    assert_string_equal(t->endpoints.control_bind, t->endpoints.control);
    assert_string_equal(t->endpoints.stats, "ipc:///tmp/rd/stats.sock");
    assert_string_equal(topo_find(t, "prefill-3")->inbox, "ipc:///tmp/rd/prefill-3.sock");
    assert_string_equal(topo_find(t, "decode-0")->inbox_bind, "ipc:///tmp/rd/decode-0.sock");
    s_assert_unique_endpoints(t);
    topo_destroy(&t);
}

static void test_derived_endpoints_multi_node(void **state)
{
    (void)state;
    /* The client port sits at base_port+1: derived ports must step over it. */
    const char *yaml =
        "name: mn\nmodel: {path: m}\n"
        "nodes:\n"
        "  - name: head\n    address: 10.0.0.1\n"
        "  - name: w1\n    address: 10.0.0.2\n    launch: ssh\n    workdir: /srv/t\n"
        "actors:\n  - role: monitor\n  - role: router\n  - role: prefill\n    count: 2\n"
        "  - role: decode\n    node: w1\n    count: 2\n"
        "endpoints:\n  client: tcp://10.0.0.1:5601\n  base_port: 5600\n";
    topo_t *t = s_ok(yaml);
    assert_int_equal(t->multi_node, 1);
    assert_string_equal(t->endpoints.control, "tcp://10.0.0.1:5600");
    assert_string_equal(t->endpoints.stats, "tcp://10.0.0.1:5602");
    assert_string_equal(topo_find(t, "monitor")->inbox, "tcp://10.0.0.1:5603");
    assert_string_equal(topo_find(t, "router")->inbox, "tcp://10.0.0.1:5604");
    assert_string_equal(topo_find(t, "prefill-1")->inbox, "tcp://10.0.0.1:5606");
    assert_string_equal(topo_find(t, "decode-0")->inbox, "tcp://10.0.0.2:5607");
    assert_string_equal(topo_find(t, "decode-1")->inbox_bind, "tcp://10.0.0.2:5608");
    assert_int_equal(topo_find(t, "decode-1")->node, 1);
    assert_string_equal(t->nodes[1].workdir, "/srv/t");
    s_assert_unique_endpoints(t);
    /* The printed form (control spelled out) reloads to the same ports. */
    char *a = NULL;
    size_t alen = 0;
    FILE *f = open_memstream(&a, &alen);
    topo_print(t, f);
    fclose(f);
    topo_t *t2 = s_ok(a);
    free(a);
    for (int i = 0; i < t->n_instances; i++)
        assert_string_equal(t2->instances[i].inbox, t->instances[i].inbox);
    assert_string_equal(t2->endpoints.stats, t->endpoints.stats);
    assert_string_equal(t2->endpoints.control, t->endpoints.control);
    topo_destroy(&t2);
    topo_destroy(&t);
    char bad_control[2048];
    snprintf(bad_control, sizeof bad_control, "%s  control: ipc:///tmp/c.sock\n", yaml);
    s_bad(bad_control);
    assert_err("inline.yaml:21: endpoints.control: 'ipc:///tmp/c.sock': actors on other nodes cannot reach");
    snprintf(bad_control, sizeof bad_control, "%s  base_port: 65530\n", yaml);
    s_bad(bad_control);
    assert_err("endpoints.base_port: given twice");

    /* bind_interface changes where things bind, not where peers connect. */
    char with_if[2048];
    snprintf(with_if, sizeof with_if, "%s  bind_interface: eth0\n", yaml);
    t = s_ok(with_if);
    assert_string_equal(topo_find(t, "decode-0")->inbox, "tcp://10.0.0.2:5607");
    assert_string_equal(topo_find(t, "decode-0")->inbox_bind, "tcp://eth0:5607");
    assert_string_equal(t->endpoints.control_bind, "tcp://eth0:5600");
    topo_destroy(&t);

    /* Two local nodes on one machine (a multi-node test rig): tcp on loopback is fine. IPv6 is bracketed. */
    t = s_ok("model: {path: m}\nnodes:\n  - name: a\n  - name: b\n    address: \"::1\"\n"
             "actors:\n  - role: monitor\n  - role: router\n  - role: prefill\n  - role: decode\n    node: b\n");
    assert_int_equal(t->multi_node, 1);
    assert_string_equal(topo_find(t, "decode")->inbox, "tcp://[::1]:5605");
    s_assert_unique_endpoints(t);
    topo_destroy(&t);

    /* Nothing launched locally: the supervisor's address must be given. */
    s_bad("model: {path: m}\nnodes:\n  - name: s\n    address: 10.1.1.1\n    launch: srun\n" MIN_ACTORS);
    assert_err("inline.yaml:1: endpoints: control: missing: no node is launched locally");
    t = s_ok("model: {path: m}\nnodes:\n  - name: s\n    address: 10.1.1.1\n    launch: srun\n" MIN_ACTORS
             "endpoints:\n  control: tcp://10.9.9.9:7000\n");
    assert_string_equal(t->endpoints.control, "tcp://10.9.9.9:7000");
    assert_string_equal(topo_find(t, "monitor")->inbox, "tcp://10.1.1.1:5602");
    topo_destroy(&t);
}

/* topo_print writes a valid topology: loading it gives the same effective topology. */
static void test_print_round_trip(void **state)
{
    (void)state;
    static const char *const files[] = { "topology/examples/cpu-default.yaml",
                                         "topology/examples/qwen3-shape-random.yaml",
                                         "topology/examples/h200-1gpu.yaml",
                                         "topology/examples/moe-8gpu.yaml",
                                         "topology/examples/cpu-moe-ep.yaml" };
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        topo_t *t = NULL, *t2 = NULL;
        assert_int_equal(topo_load_file(files[k], &t, &s_errs), 0);
        char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        FILE *f = open_memstream(&a, &alen);
        topo_print(t, f);
        fclose(f);
        assert_int_equal(topo_load_string(a, alen, files[k], &t2, &s_errs), 0);
        f = open_memstream(&b, &blen);
        topo_print(t2, f);
        fclose(f);
        assert_string_equal(a, b);
        assert_non_null(strstr(a, "block_size: 16"));
        assert_non_null(strstr(a, "# instances, in start order:"));
        free(a);
        free(b);
        topo_destroy(&t);
        topo_destroy(&t2);
    }
    /* Hostile strings survive printing as quoted YAML. */
    topo_t *t = s_ok("model:\n  path: \"we\\\"ird \\\\ path: #x\\t'q'\"\n" MIN_ACTORS);
    assert_string_equal(t->model.path, "we\"ird \\ path: #x\t'q'");
    char *a = NULL;
    size_t alen = 0;
    FILE *f = open_memstream(&a, &alen);
    topo_print(t, f);
    fclose(f);
    topo_t *t2 = NULL;
    assert_int_equal(topo_load_string(a, alen, "printed", &t2, &s_errs), 0);
    assert_string_equal(t2->model.path, t->model.path);
    free(a);
    topo_destroy(&t);
    topo_destroy(&t2);
}

static void test_bad_role(void **state)
{
    (void)state;
    s_bad_file("tests/fixtures/topology/bad-role.yaml");
    assert_int_equal(s_errs.count, 1);
    assert_string_equal(s_errs.msg[0],
                        "tests/fixtures/topology/bad-role.yaml:7: actors[2].role: unknown role 'decoder' "
                        "(expected one of router, prefill, decode, cache-manager, expert-balancer, "
                        "draft-scheduler, monitor, gateway)");
}

static void test_multi_error_reports_all(void **state)
{
    (void)state;
    s_bad_file("tests/fixtures/topology/multi-error.yaml");
#define F "tests/fixtures/topology/multi-error.yaml:"
    static const char *const expected[] = {
        F "14: actors[2].gpus[0]: GPU 3, but node 'gpu-node' has gpus: 1",
        F "16: actors[3].node: node 'nowhere' is not declared in nodes:",
        F "19: actors[4].name: instance name 'decode' is already used by actors[3]",
        F "22: actors[5].count: 0 is out of range (1..256)",
        F "23: actors[6].role: unknown role 'balancer'",
        F "25: limits.max_batch: 0 is out of range (1..4096)",
        F "26: limits.max_model_len: '8x' is not a whole number",
        F "28: cache.block_size: 24 is not one of 8, 16, 32, 64, 128",
        F "30: supervision.strategy: unknown strategy 'one_for_all' (expected one of one_for_one, rest_for_one)",
        F "31: supervision.grace_s: -3 is out of range (0..600)",
        F "34: endpoints.inspect: tcp://127.0.0.1:7000 is already bound by endpoints.client",
    };
#undef F
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        assert_err(expected[i]);
    assert_int_equal(s_errs.count, (int)(sizeof expected / sizeof expected[0]));
    /* Sorted by line: "<file>:<line>: ...". */
    for (int i = 1; i < s_errs.count; i++)
        assert_true(atoi(strchr(s_errs.msg[i - 1], ':') + 1) <= atoi(strchr(s_errs.msg[i], ':') + 1));
}

static void test_shape_errors(void **state)
{
    (void)state;
    s_bad_file("tests/fixtures/topology/shape.yaml");
#define F "tests/fixtures/topology/shape.yaml:"
    assert_err(F "4: model: unknown field 'dtpye' (expected one of path, tokenizer, dtype,");
    assert_err(F "7: nodes[0].gpus: expected a single value, found a list");
    assert_err(F "10: actors[0]: unknown field 'colour'");
    assert_err(F "11: actors[1].role: missing (required)");
    assert_err(F "13: limits: expected a mapping (indented keys), found a single value");
    assert_err(F "14: unknown field 'supervisor' (expected one of name, model, nodes, actors,");
#undef F
    assert_int_equal(s_errs.count, 6);

    s_bad_file("tests/fixtures/topology/syntax.yaml");
    assert_err("syntax.yaml:6: YAML syntax error: found unexpected end of stream (while scanning a quoted "
               "scalar started on line 3)");
    s_bad_file("tests/fixtures/topology/empty.yaml");
    assert_err("empty.yaml:1: the file is empty");

    s_bad("name: x\nname: y\n" MINIMAL);
    assert_err("inline.yaml:2: name: given twice");
    s_bad("model:\n  path: m\n");
    assert_err("inline.yaml:1: actors: missing (required)");
    s_bad("model:\n  path: m\nactors: []\n");
    assert_err("inline.yaml:3: actors: needs at least 1 entry");
    s_bad("a: &x 1\n");
    assert_err("unknown field 'a'");
    s_bad(MINIMAL "name: *anchor\n");
    assert_err("name: YAML aliases (*name) are not supported");
    s_bad(MINIMAL "---\n" MINIMAL);
    assert_err("more than one YAML document");
    s_bad("- 1\n- 2\n");
    assert_err("inline.yaml:1: expected a mapping (indented keys), found a list");
}

/* Several routers: each binds its own entry of endpoints.clients (clients fail over between them);
 * the list must name one a router, agree with endpoints.client, and clash with nothing. */
static void test_multi_router(void **state)
{
    (void)state;
#define TWO_ROUTERS "model:\n  path: m\nactors:\n  - role: monitor\n  - role: router\n    count: 2\n" \
                    "  - role: decode\n"
    topo_t *t = s_ok(TWO_ROUTERS "endpoints:\n  clients: [tcp://127.0.0.1:7001, 'ipc:///tmp/r1.sock']\n");
    assert_int_equal(topo_count_role(t, ROLE_ROUTER), 2);
    assert_int_equal(t->endpoints.n_clients, 2);
    assert_string_equal(t->endpoints.client, "tcp://127.0.0.1:7001");
    assert_string_equal(topo_client_endpoint(t, topo_find(t, "router-0")), "tcp://127.0.0.1:7001");
    assert_string_equal(topo_client_endpoint(t, topo_find(t, "router-1")), "ipc:///tmp/r1.sock");
    assert_null(topo_client_endpoint(t, topo_find(t, "decode")));
    char *a = NULL, *b = NULL;   /* printed, it loads back the same */
    size_t alen = 0, blen = 0;
    FILE *f = open_memstream(&a, &alen);
    topo_print(t, f);
    fclose(f);
    topo_t *t2 = NULL;
    assert_int_equal(topo_load_string(a, alen, "printed", &t2, &s_errs), 0);
    assert_string_equal(topo_client_endpoint(t2, topo_find(t2, "router-1")), "ipc:///tmp/r1.sock");
    f = open_memstream(&b, &blen);
    topo_print(t2, f);
    fclose(f);
    assert_string_equal(strchr(a, '\n'), strchr(b, '\n'));   /* but the first line's source name */
    free(a);
    free(b);
    topo_destroy(&t2);
    topo_destroy(&t);
    t = s_ok(MINIMAL);   /* one router: endpoints.client is its entry */
    assert_int_equal(t->endpoints.n_clients, 1);
    assert_string_equal(topo_client_endpoint(t, topo_first(t, ROLE_ROUTER)), "tcp://127.0.0.1:5555");
    topo_destroy(&t);

    s_bad(TWO_ROUTERS);
    assert_err("endpoints.clients: missing: the topology has 2 router instances");
    s_bad(TWO_ROUTERS "endpoints:\n  clients: [tcp://127.0.0.1:7001]\n");
    assert_err("endpoints.clients: 1 entries for 2 router instances (one each, in order)");
    s_bad(TWO_ROUTERS "endpoints:\n  client: tcp://127.0.0.1:7000\n  clients: [tcp://127.0.0.1:7001, tcp://127.0.0.1:7002]\n");
    assert_err("endpoints.client: tcp://127.0.0.1:7000 differs from endpoints.clients[0] (tcp://127.0.0.1:7001)");
    s_bad(TWO_ROUTERS "endpoints:\n  inspect: tcp://127.0.0.1:7002\n  clients: [tcp://127.0.0.1:7001, tcp://127.0.0.1:7001]\n");
    assert_err("endpoints.clients[1]: tcp://127.0.0.1:7001 is already bound by endpoints.clients[0]");
    s_bad(TWO_ROUTERS "endpoints:\n  clients: [tcp://127.0.0.1:7001, 'http://x:1']\n");
    assert_err("endpoints.clients[1]: 'http://x:1' is not tcp://host:port or ipc://path");
    s_bad(TWO_ROUTERS "endpoints:\n  clients: [tcp://127.0.0.1:7001, 'tcp://*:7002']\n");
    assert_err("endpoints.clients[1]: tcp://*:7002 binds all interfaces");
    s_bad("model:\n  path: m\nactors:\n  - role: monitor\n  - role: router\n    count: 9\n  - role: decode\n");
    assert_err("actors: one to 8 router instances are required (found 9)");
#undef TWO_ROUTERS
}

/* The clients' heartbeats: defaults, the range, and a timeout that must exceed the interval. */
static void test_client_heartbeats(void **state)
{
    (void)state;
    topo_t *t = s_ok(MINIMAL);
    assert_int_equal(t->supervision.client_heartbeat_ms, 1000);
    assert_int_equal(t->supervision.client_heartbeat_timeout_ms, 3000);
    topo_destroy(&t);
    t = s_ok(MINIMAL "supervision:\n  client_heartbeat_ms: 200\n  client_heartbeat_timeout_ms: 900\n");
    assert_int_equal(t->supervision.client_heartbeat_ms, 200);
    assert_int_equal(t->supervision.client_heartbeat_timeout_ms, 900);
    topo_destroy(&t);
    s_bad(MINIMAL "supervision:\n  client_heartbeat_ms: 5\n");
    assert_err("supervision.client_heartbeat_ms");
    s_bad(MINIMAL "supervision:\n  client_heartbeat_timeout_ms: 99\n");
    assert_err("supervision.client_heartbeat_timeout_ms");
    s_bad(MINIMAL "supervision:\n  client_heartbeat_ms: 2000\n  client_heartbeat_timeout_ms: 2000\n");
    assert_err("supervision.client_heartbeat_timeout_ms: 2000 is not more than client_heartbeat_ms (2000)");
}

/* No prefill actor: a colocated cluster (the decode workers compute the prompts); no decode actor
 * is still an error. */
static void test_colocated(void **state)
{
    (void)state;
    topo_t *t = s_ok("model:\n  path: m\nactors:\n  - role: monitor\n  - role: router\n  - role: decode\n    count: 2\n");
    assert_int_equal(topo_count_role(t, ROLE_PREFILL), 0);
    assert_int_equal(topo_count_role(t, ROLE_DECODE), 2);
    assert_null(topo_first(t, ROLE_PREFILL));
    topo_destroy(&t);
    s_bad("model:\n  path: m\nactors:\n  - role: monitor\n  - role: router\n  - role: prefill\n");
    assert_err("inline.yaml:3: actors: at least one decode actor is required");
}

static void test_semantic_errors(void **state)
{
    (void)state;
    s_bad_file("tests/fixtures/topology/roles.yaml");
    assert_err("roles.yaml:1: model.path: missing: prefill and decode actors load the model");
    assert_err("roles.yaml:1: endpoints.clients: missing: the topology has 2 router instances: give each its "
               "client endpoint, in order");
    assert_err("roles.yaml:2: actors: exactly one monitor instance is required (found 0)");
    assert_err("roles.yaml:2: actors: at least one decode actor is required");
    assert_err("roles.yaml:2: actors: at most one cache-manager instance (found 2)");
    assert_int_equal(s_errs.count, 5);

    s_bad_file("tests/fixtures/topology/wildcard.yaml");
    assert_err("wildcard.yaml:10: endpoints.client: tcp://*:5555 binds all interfaces: that needs "
               "security.allow_wildcard: true and CURVE keys");
    assert_err("wildcard.yaml:11: endpoints.inspect: tcp://0.0.0.0:5556 binds all interfaces");
    assert_int_equal(s_errs.count, 2);
    s_bad(MINIMAL "endpoints:\n  client: tcp://*:5555\nsecurity:\n  allow_wildcard: true\n");
    assert_err("endpoints.client: tcp://*:5555 binds all interfaces: that needs CURVE keys");
    s_bad(MINIMAL "endpoints:\n  client: tcp://[::]:5555\nsecurity:\n  curve_server_public: p\n"
          "  curve_server_secret: s\n");
    assert_err("endpoints.client: tcp://[::]:5555 binds all interfaces: that needs security.allow_wildcard: true");
    topo_t *t = s_ok(MINIMAL "endpoints:\n  client: tcp://*:5555\nsecurity:\n  allow_wildcard: yes\n"
                     "  curve_server_public: keys/server.pub\n  curve_server_secret: keys/server.key\n"
                     "  curve_clients: keys/clients\n");
    assert_int_equal(t->security.allow_wildcard, 1);
    assert_string_equal(t->security.curve_server_secret, "keys/server.key");
    topo_destroy(&t);
    s_bad(MINIMAL "security:\n  curve_server_public: p\n");
    assert_err("security: curve_server_public and curve_server_secret go together");
    s_bad(MINIMAL "security:\n  curve_server_public: p\n  curve_server_secret: s\n");
    assert_err("security.curve_clients: required with CURVE keys");
    s_bad(MINIMAL "security:\n  curve_keys_dir: k\n");
    assert_err("security: curve_clients and curve_keys_dir need curve_server_public");
    s_bad(MINIMAL "endpoints:\n  metrics: tcp://0.0.0.0:9100\n");
    assert_err("endpoints.metrics: tcp://0.0.0.0:9100 binds all interfaces with plain HTTP");

    s_bad_file("tests/fixtures/topology/remote.yaml");
    assert_err("remote.yaml:6: nodes[0].address: '127.0.0.1' is loopback, but actors on other machines");
    assert_err("remote.yaml:7: nodes[1].address: missing (a node launched by ssh needs the address");
    assert_err("remote.yaml:9: nodes[1].ssh: unknown placeholder '{host}'");
    assert_err("remote.yaml:10: nodes[2].name: node name 'head' is already used by nodes[0]");
    assert_err("remote.yaml:12: nodes[2].launch: unknown launch method 'teleport'");
    assert_int_equal(s_errs.count, 5);

    s_bad_file("tests/fixtures/topology/long-run-dir.yaml");
    assert_err("long-run-dir.yaml:10: endpoints.run_dir: '/tmp/this/run");
    assert_err("Unix sockets allow at most 107");
    assert_int_equal(s_errs.count, 1);

    /* GPUs against the backend, the node and the instance count. */
    s_bad("model:\n  path: m\n  backend: cuda\nnodes:\n  - name: g\n    gpus: 2\n"
          "actors:\n  - role: monitor\n  - role: router\n    gpus: [0]\n  - role: prefill\n"
          "  - role: decode\n    count: 3\n    gpus: [0, 1]\n");
    assert_err("inline.yaml:10: actors[1].gpus: only prefill and decode actors use GPUs");
    assert_err("inline.yaml:11: actors[2].gpus: missing: model.backend is cuda, so a prefill actor needs gpus");
    assert_err("inline.yaml:14: actors[3].gpus: 2 GPUs for count: 3");
    s_bad("model:\n  path: m\nactors:\n  - role: monitor\n  - role: router\n  - role: prefill\n"
          "    gpus: [0]\n  - role: decode\n");
    assert_err("inline.yaml:7: actors[2].gpus[0]: GPU 0, but node 'local' has no GPUs (gpus: 0)");
    assert_err("inline.yaml:7: actors[2].gpus: given, but model.backend is cpu");

    /* Parallel degrees, names, reserved names, dtype, clashes among ipc sockets. */
    s_bad("model:\n  path: m\nactors:\n  - role: monitor\n    tp: 2\n  - role: router\n"
          "  - role: prefill\n    count: 3\n    tp: 2\n    ep: 2\n  - role: decode\n    count: 4\n    ep: 3\n");
    assert_err("actors[0].tp: only prefill and decode actors run tensor-parallel");
    assert_err("actors[2].tp: tp: 2 does not divide count: 3");
    assert_err("actors[2].ep: only decode actors run expert-parallel groups");
    assert_err("actors[3].ep: ep: 3 does not divide count: 4");
    s_bad("model:\n  path: m\nactors:\n  - role: monitor\n  - role: router\n  - role: prefill\n  - role: decode\n"
          "    ep: 65\nexperts:\n  window_steps: 100\n  interval_steps: 250\n  redundant_slots: -1\n"
          "  load_half_life_windows: -3\n");
    assert_err("actors[3].ep:");
    assert_err("experts.interval_steps: 250 is not a multiple of experts.window_steps (100)");
    assert_err("experts.redundant_slots:");
    assert_err("experts.load_half_life_windows: -3 is out of range (0..1000000)");
    s_bad("model:\n  path: m\n" MIN_ACTORS "experts:\n  load_half_life_windows: soon\n");
    assert_err("experts.load_half_life_windows: 'soon' is not a whole number");
    s_bad("model:\n  path: m\nactors:\n  - role: monitor\n    name: control\n  - role: router\n"
          "    name: ../etc\n  - role: prefill\n  - role: decode\n    name: prefill\n");
    assert_err("actors[0].name: instance name 'control' is reserved");
    assert_err("actors[1].name: '../etc' is not a valid name");
    assert_err("actors[3].name: instance name 'prefill' is already used by actors[2]");
    s_bad("name: a/b\nmodel:\n  path: m\n  dtype: fp8\n  backend: tpu\n" MIN_ACTORS);
    assert_err("inline.yaml:1: name: 'a/b' is not a valid name");
    assert_err("inline.yaml:4: model.dtype: unknown dtype 'fp8' (expected one of f32, bf16, f16)");
    assert_err("inline.yaml:5: model.backend: unknown backend 'tpu' (expected one of cpu, cuda)");
    s_bad(MINIMAL "endpoints:\n  client: ipc:///tmp/x.sock\n  inspect: ipc:///tmp/x.sock\n");
    assert_err("endpoints.inspect: ipc:///tmp/x.sock is already bound by endpoints.client");
    s_bad(MINIMAL "endpoints:\n  client: http://127.0.0.1:80\n  inspect: tcp://127.0.0.1:70000\n");
    assert_err("endpoints.client: 'http://127.0.0.1:80' is not tcp://host:port or ipc://path");
    assert_err("endpoints.inspect: 'tcp://127.0.0.1:70000' has a bad port '70000' (1..65535)");
    s_bad(MINIMAL "limits:\n  max_model_len: 8\ncache:\n  block_size: 16\n");
    assert_err("limits.max_model_len: 8 is shorter than one KV block (cache.block_size: 16)");
    s_bad(MINIMAL "model:\n  path: x\n");
    assert_err("model: given twice");
}

static void test_junk_numbers(void **state)
{
    (void)state;
    s_bad_file("tests/fixtures/topology/junk-numbers.yaml");
#define F "tests/fixtures/topology/junk-numbers.yaml:"
    assert_err(F "4: model.threads: '4 cores' is not a whole number");
    assert_err(F "9: actors[2].count: '1e3' is not a whole number");
    assert_err(F "11: actors[3].count: '0x10' is not a whole number");
    assert_err(F "13: limits.send_hwm: '1000.5' is not a whole number");
    assert_err(F "14: limits.recv_hwm: '12abc' is not a whole number");
    assert_err(F "15: limits.admission_queue: 99999999999999999999999 is out of range (1..1000000)");
    assert_err(F "16: limits.kv_blocks: -1 is out of range (0..67108864)");
    assert_err(F "18: security.allow_wildcard: 'maybe' is not true or false");
#undef F
    assert_int_equal(s_errs.count, 8);

    static const char *const junk[] = { "8x", "'8 '", "' 8'", "'+'", "'-'", "1_000", "0b11", "\"\"",
                                        "'4\\n'", "9223372036854775808", "1.0", "true", "~" };
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml, MINIMAL "limits:\n  max_batch: %s\n", junk[i]);
        s_bad(yaml);
        assert_err("inline.yaml:9: limits.max_batch: ");
        assert_int_equal(s_errs.count, 1);
    }
    /* Signs and quoting that are fine. */
    topo_t *t = s_ok(MINIMAL "limits:\n  max_batch: '+32'\n  kv_blocks: \"100\"\n");
    assert_int_equal(t->limits.max_batch, 32);
    assert_int_equal(t->limits.kv_blocks, 100);
    topo_destroy(&t);
}

static void test_errors_api(void **state)
{
    (void)state;
    /* More problems than fit: the rest are counted, never silently lost. */
    char *yaml = malloc(1 << 16);
    assert_non_null(yaml);
    int n = snprintf(yaml, 1 << 16, "model:\n  path: m\nactors:\n");
    for (int i = 0; i < 100; i++)
        n += snprintf(yaml + n, (size_t)((1 << 16) - n), "  - role: r%d\n", i);
    s_bad(yaml);
    free(yaml);
    assert_int_equal(s_errs.count, TOPO_ERRORS_MAX);
    assert_true(s_errs.dropped >= 100 - TOPO_ERRORS_MAX);
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    topo_errors_print(&s_errs, f);
    fclose(f);
    assert_non_null(strstr(out, "inline.yaml:4: actors[0].role: unknown role 'r0'"));
    assert_non_null(strstr(out, "more problems"));
    free(out);
    assert_int_equal(topo_errors_contain(NULL, "x"), 0);

    /* A missing file names the file and the reason. */
    s_bad_file("tests/fixtures/topology/no-such-file.yaml");
    assert_err("tests/fixtures/topology/no-such-file.yaml: cannot open the topology file: No such file");

    /* With errs NULL the load still fails cleanly (the problems go to the log). */
    topo_t *t = (topo_t *)0x1;
    assert_int_equal(topo_load_string("x: 1\n", 5, "nul.yaml", &t, NULL), -1);
    assert_null(t);
}

/* Garbage never crashes the loader and always yields at least one message. */
static void test_hostile_input(void **state)
{
    (void)state;
    static const char binary[] = "\x00\x01\x02name: x";
    topo_t *t = (topo_t *)0x1;
    assert_int_equal(topo_load_string(binary, sizeof binary - 1, "bin", &t, &s_errs), -1);
    assert_err("bin: contains a NUL byte");
    char *deep = malloc(200001);
    assert_non_null(deep);
    memset(deep, '[', 100000);
    memset(deep + 100000, ']', 100000);
    deep[200000] = '\0';
    s_bad(deep);
    assert_err("nesting deeper than 64 levels");
    memset(deep, '{', 100000);
    deep[100000] = '\0';
    s_bad(deep);
    free(deep);
    s_bad("\t\t: : :\n");
    s_bad("name: \"\\xff\\xfe\"\n" MIN_ACTORS);
    s_bad("\xff\xfe\xfd");
    s_bad(MINIMAL "actors:\n  - {role: [a, {b: c}]}\n");
    srand(7);
    char buf[256];
    for (int round = 0; round < 2000; round++) {
        /* Random mutations of a valid file. */
        size_t len = strlen(MINIMAL);
        memcpy(buf, MINIMAL, len);
        for (int k = 0; k < 3; k++)
            buf[rand() % (int)len] = (char)(" :-[]{}'\"\n#&*!|>%@`x0"[rand() % 22]);
        t = NULL;
        topo_errors_t *e = &s_errs;
        topo_errors_clear(e);
        int rc = topo_load_string(buf, len, "mut", &t, e);
        if (rc == 0)
            topo_destroy(&t);
        else
            assert_true(e->count > 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_role_names),
        cmocka_unit_test(test_examples_load),
        cmocka_unit_test(test_kv_dtype),
        cmocka_unit_test(test_quantization),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_default_embedded_equals_example),
        cmocka_unit_test(test_expansion_and_naming),
        cmocka_unit_test(test_derived_endpoints_single_node),
        cmocka_unit_test(test_derived_endpoints_multi_node),
        cmocka_unit_test(test_print_round_trip),
        cmocka_unit_test(test_bad_role),
        cmocka_unit_test(test_multi_error_reports_all),
        cmocka_unit_test(test_shape_errors),
        cmocka_unit_test(test_colocated),
        cmocka_unit_test(test_multi_router),
        cmocka_unit_test(test_client_heartbeats),
        cmocka_unit_test(test_semantic_errors),
        cmocka_unit_test(test_junk_numbers),
        cmocka_unit_test(test_errors_api),
        cmocka_unit_test(test_hostile_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
