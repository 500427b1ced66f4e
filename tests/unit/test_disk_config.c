/* The disk tier's configuration: cache.disk_dir / cache.disk_bytes in the topology (defaults, the
 * errors that name the field, the one retention maximum) and the model fingerprint that keeps
 * another model's or KV setting's blocks off the disk (actors/cache/fingerprint.h).
 * Run from the repository root (the fixtures are opened by relative path). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/cache/fingerprint.h"
#include "messages/msg.h"
#include "topology/topology.h"

#define BASE "model:\n  path: tests/fixtures/models/qwen3-f32\nactors:\n  - role: monitor\n  - role: cache-manager\n" \
             "  - role: router\n  - role: prefill\n  - role: decode\n"

static topo_errors_t s_errs;

static topo_t *s_load(const char *extra, int ok)
{
    char yaml[2048];
    snprintf(yaml, sizeof yaml, "%s%s", BASE, extra);
    topo_t *t = NULL;
    topo_errors_clear(&s_errs);
    int rc = topo_load_string(yaml, strlen(yaml), "inline.yaml", &t, &s_errs);
    if (ok && rc != 0)
        topo_errors_print(&s_errs, stderr);
    assert_int_equal(rc, ok ? 0 : -1);
    return t;
}

static void test_disk_fields(void **st)
{
    topo_t *t = s_load("", 1);
    assert_string_equal(t->cache.disk_dir, "");
    assert_int_equal(t->cache.disk_bytes, 0);
    topo_destroy(&t);
    t = s_load("cache:\n  disk_dir: /var/tmp/kv\n", 1);
    assert_string_equal(t->cache.disk_dir, "/var/tmp/kv");
    assert_int_equal(t->cache.disk_bytes, (int64_t)10 << 30);   /* the default size */
    topo_destroy(&t);
    t = s_load("cache:\n  disk_dir: /var/tmp/kv\n  disk_bytes: 1099511627776\n", 1);
    assert_int_equal(t->cache.disk_bytes, (int64_t)1 << 40);
    topo_destroy(&t);
}

static void test_disk_field_errors(void **st)
{
    s_load("cache:\n  disk_dir: /var/tmp/kv\n  disk_bytes: 4096\n", 0);
    assert_true(topo_errors_contain(&s_errs, "cache.disk_bytes"));
    s_load("cache:\n  disk_dir: /var/tmp/kv\n  disk_bytes: 10G\n", 0);
    assert_true(topo_errors_contain(&s_errs, "cache.disk_bytes"));
    s_load("cache:\n  disk_dir: /var/tmp/kv\n  host_store_blocks: 0\n", 0);
    assert_true(topo_errors_contain(&s_errs, "cache.disk_dir"));
}

static void test_one_retention_maximum(void **st)
{
    char extra[128];
    snprintf(extra, sizeof extra, "cache:\n  default_retention_s: %u\n", MSG_MAX_RETENTION_S);
    topo_t *t = s_load(extra, 1);
    assert_int_equal(t->cache.default_retention_s, MSG_MAX_RETENTION_S);
    topo_destroy(&t);
    snprintf(extra, sizeof extra, "cache:\n  default_retention_s: %u\n", MSG_MAX_RETENTION_S + 1);
    s_load(extra, 0);
    assert_true(topo_errors_contain(&s_errs, "cache.default_retention_s"));
    assert_int_equal(MSG_MAX_RETENTION_S, 7 * 86400);   /* what docs/kv-cache.md promises */
}

static void test_fingerprint(void **st)
{
    topo_t *t = s_load("", 1);
    const uint64_t fp = kv_fingerprint(t);
    assert_true(fp != 0);
    assert_true(kv_fingerprint(t) == fp);   /* stable */
    t->model.kv_dtype = DT_F8E4M3;
    const uint64_t fp8 = kv_fingerprint(t);
    t->model.kv_dtype = DT_COUNT;
    t->cache.block_size = 32;
    const uint64_t bs32 = kv_fingerprint(t);
    t->cache.block_size = 16;
    snprintf(t->model.path, sizeof t->model.path, "tests/fixtures/models/llama-gqa-f32");
    const uint64_t other = kv_fingerprint(t);
    snprintf(t->model.path, sizeof t->model.path, "tests/fixtures/models/qwen3-sharded-f32");
    const uint64_t sharded = kv_fingerprint(t);
    assert_true(fp8 != fp && bs32 != fp && other != fp && sharded != fp && sharded != other);
    snprintf(t->model.path, sizeof t->model.path, "tests/fixtures/models/qwen3-f32");
    assert_true(kv_fingerprint(t) == fp);
    topo_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disk_fields),
        cmocka_unit_test(test_disk_field_errors),
        cmocka_unit_test(test_one_retention_maximum),
        cmocka_unit_test(test_fingerprint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
