/* kv_transfer: announces carry the pool's shape and encode/decode intact; CUDA IPC handles are
 * checked against the sender's pool size before any block is read; a receiving worker takes only
 * blocks of its own pool's shape and dtype (fp8 blocks included: one byte per element). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "engine/config.h"
#include "transfer/kv_blocks.h"
#include "transfer/kv_transfer.h"

static const bk_kv_t s_kv = {.dtype = DT_BF16, .n_blocks = 10, .block_size = 16, .n_layers = 4,
                             .n_kv_heads = 2, .head_dim = 64, .block_bytes = 4 * 2 * 16 * 2 * 64 * 2};

static void test_announce_roundtrip(void **st)
{
    uint32_t ids[3] = {7, 2, 9};
    const char *name = "/troupe-x-1-5";
    msg_t m, back;
    kvx_announce(&m, 5, 99, &s_kv, ids, 3, MSG_CHAN_SHM, (const uint8_t *)name, (uint32_t)strlen(name), "prefill-0", 2000);
    uint8_t buf[4096];
    size_t len;
    char err[256];
    assert_int_equal(msg_encode(&m, buf, sizeof buf, &len, err, sizeof err), 0);
    assert_int_equal(msg_decode(buf, len, &back, err, sizeof err), 0);
    const msg_kv_announce_t *k = &back.u.kv_announce;
    assert_int_equal(k->transfer_id, 5);
    assert_int_equal(k->request_id, 99);
    assert_int_equal(k->n_layers, 4);
    assert_int_equal(k->block_size, 16);
    assert_int_equal(k->n_kv_heads, 2);
    assert_int_equal(k->head_dim, 64);
    assert_int_equal(k->dtype, DT_BF16);
    assert_int_equal(k->total_bytes, 3 * s_kv.block_bytes);
    assert_int_equal(k->n_block_ids, 3);
    assert_int_equal(k->block_ids[2], 9);
    assert_string_equal(k->src, "prefill-0");
    assert_memory_equal(k->handle, name, strlen(name));
    msg_free(&back);
}

static void s_ipc_announce(msg_t *m, uint8_t *handle, uint64_t pool_bytes, const uint32_t *ids, uint32_t n)
{
    memset(handle, 0xab, BK_IPC_HANDLE_BYTES);
    for (int i = 0; i < 8; i++)
        handle[BK_IPC_HANDLE_BYTES + i] = (uint8_t)(pool_bytes >> (8 * i));
    kvx_announce(m, 1, 1, &s_kv, ids, n, MSG_CHAN_CUDA_IPC, handle, KVX_IPC_HANDLE_BYTES, "prefill-0", 1000);
}

static void test_ipc_check_bounds(void **st)
{
    uint8_t h[KVX_IPC_HANDLE_BYTES];
    char err[256];
    msg_t m;
    uint64_t pool = 10 * (uint64_t)s_kv.block_bytes;
    uint32_t ok_ids[2] = {0, 9};
    s_ipc_announce(&m, h, pool, ok_ids, 2);
    assert_true(kvx_ipc_check(&m.u.kv_announce, s_kv.block_bytes, err, sizeof err) == pool);
    uint32_t bad_ids[2] = {3, 10};      /* block 10 is past a 10-block pool */
    s_ipc_announce(&m, h, pool, bad_ids, 2);
    assert_true(kvx_ipc_check(&m.u.kv_announce, s_kv.block_bytes, err, sizeof err) == 0);
    assert_non_null(strstr(err, "outside"));
    s_ipc_announce(&m, h, 0, ok_ids, 1);  /* a lying size of 0 admits nothing */
    assert_true(kvx_ipc_check(&m.u.kv_announce, s_kv.block_bytes, err, sizeof err) == 0);
    m.u.kv_announce.handle_len = 10;
    assert_true(kvx_ipc_check(&m.u.kv_announce, s_kv.block_bytes, err, sizeof err) == 0);
    assert_non_null(strstr(err, "handle"));
}

static void test_first_ids_differ(void **st)
{
    uint64_t a = kvx_first_id(), b = kvx_first_id();
    assert_true(a != b);
    assert_true(a < (1ULL << 62) && b < (1ULL << 62));
}

/* An fp8 pool's announce says fp8 and counts 1-byte elements; a worker with an fp8 pool of that
 * shape takes it, one with a bf16 pool (or a different byte count) refuses it, naming both. */
static void test_check_announce_dtype(void **st)
{
    char err[256];
    kvpool_t *fp8 = kvpool_new(8, 16, 4, 2, 64, DT_F8E4M3, NULL, err, sizeof err);
    kvpool_t *bf16 = kvpool_new(8, 16, 4, 2, 64, DT_BF16, NULL, err, sizeof err);
    assert_non_null(fp8);
    assert_non_null(bf16);
    const bk_kv_t *v = kvpool_view(fp8);
    assert_int_equal(v->block_bytes, 4 * 2 * 16 * 2 * 64);
    uint32_t ids[2] = {1, 5};
    msg_t m;
    kvx_announce(&m, 3, 4, v, ids, 2, MSG_CHAN_SHM, (const uint8_t *)"/x", 2, "prefill-0", 1000);
    assert_int_equal(m.u.kv_announce.dtype, DT_F8E4M3);
    assert_int_equal(m.u.kv_announce.total_bytes, 2 * v->block_bytes);

    assert_int_equal(kvblocks_check(fp8, &m.u.kv_announce, err, sizeof err), 0);
    assert_int_equal(kvblocks_check(bf16, &m.u.kv_announce, err, sizeof err), -1);
    assert_non_null(strstr(err, "64 dims fp8"));
    assert_non_null(strstr(err, "64 bf16"));
    m.u.kv_announce.total_bytes = 2 * 2 * v->block_bytes;         /* as if the elements were 2 bytes */
    assert_int_equal(kvblocks_check(fp8, &m.u.kv_announce, err, sizeof err), -1);
    assert_non_null(strstr(err, "bytes for 2 blocks"));
    kvpool_destroy(&fp8);
    kvpool_destroy(&bf16);
}

/* The KV dtype, workers and tools alike: the choice, else the dummy weights' dtype, else the
 * config's (a real f32 checkpoint keeps an f32 cache on CUDA too, where model.dtype defaults to
 * bf16 for dummy weights: serve_exact on GPUs compares the cluster with troupe-generate). */
static void test_config_kv_dtype(void **st)
{
    model_config_t f32 = {.dtype = DT_F32}, bf16 = {.dtype = DT_BF16}, f16 = {.dtype = DT_F16};
    assert_int_equal(config_kv_dtype(&f32, DT_COUNT, DT_COUNT), DT_F32);
    assert_int_equal(config_kv_dtype(&bf16, DT_COUNT, DT_COUNT), DT_BF16);
    assert_int_equal(config_kv_dtype(&f16, DT_COUNT, DT_COUNT), DT_F16);
    assert_int_equal(config_kv_dtype(&f32, DT_BF16, DT_COUNT), DT_BF16);   /* dummy bf16 weights of an f32 config */
    assert_int_equal(config_kv_dtype(&bf16, DT_F32, DT_COUNT), DT_F32);
    assert_int_equal(config_kv_dtype(&f32, DT_F32, DT_F8E4M3), DT_F8E4M3);
    assert_int_equal(config_kv_dtype(&bf16, DT_COUNT, DT_F8E4M3), DT_F8E4M3);
    assert_int_equal(config_kv_dtype(&bf16, DT_BF16, DT_F32), DT_F32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_announce_roundtrip),
        cmocka_unit_test(test_ipc_check_bounds),
        cmocka_unit_test(test_first_ids_differ),
        cmocka_unit_test(test_check_announce_dtype),
        cmocka_unit_test(test_config_kv_dtype),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
