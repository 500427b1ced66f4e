/* tests/unit/test_msg.c — the wire protocol: round trips of every type, every rejection, limits.
 *
 * Frames for the rejection tests are built with msgpack-c's own packer (an independent encoder)
 * or byte by byte where the point is a lie msgpack-c would never write. Every rejection also
 * checks that the error names the field or the problem, and that a failed decode owns nothing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <msgpack.h>

#include "messages/msg.h"
#include "messages/msg_schema.h"
#include "tests/unit/test_msg_fixtures.h"

/* The fuzz target's property checks, called directly on every corpus file (it aborts on a
 * violation). Crash inputs saved under tests/fuzz/corpus/msg/ are replayed the same way. */
#include "tests/fuzz/fuzz_msg.c"
#include <dirent.h>

#define BUF_CAP (1u << 20)
static uint8_t g_buf[BUF_CAP];

/* ---- helpers ---- */

static size_t encode_ok(const msg_t *m, uint8_t *buf, size_t cap)
{
    char err[256] = "";
    size_t len = 0;
    int rc = msg_encode(m, buf, cap, &len, err, sizeof err);
    if (rc != 0)
        fail_msg("encode %s: %s", msg_type_name(m->type), err);
    return len;
}

/* Decodes and expects failure with an error containing every given fragment. */
static void expect_reject(const uint8_t *buf, size_t len, ...)
{
    char err[512] = "";
    msg_t m;
    int rc = msg_decode(buf, len, &m, err, sizeof err);
    if (rc == 0) {
        msg_print(&m, stderr);
        msg_free(&m);
        fail_msg("decode accepted a frame it should reject");
    }
    assert_int_equal(m.type, MSG_NONE);
    assert_null(m.arena_);
    va_list ap;
    va_start(ap, len);
    for (const char *frag; (frag = va_arg(ap, const char *)) != NULL;)
        if (!strstr(err, frag))
            fail_msg("error \"%s\" does not contain \"%s\"", err, frag);
    va_end(ap);
}
#define REJECT(buf, len, ...) expect_reject((buf), (len), __VA_ARGS__, (const char *)NULL)

static void decode_ok(const uint8_t *buf, size_t len, msg_t *m)
{
    char err[512] = "";
    if (msg_decode(buf, len, m, err, sizeof err) != 0)
        fail_msg("decode: %s", err);
}

/* A frame under construction with msgpack-c: map header written by the caller. */
typedef struct wb {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} wb_t;

static void wb_init(wb_t *w)
{
    msgpack_sbuffer_init(&w->sb);
    msgpack_packer_init(&w->pk, &w->sb, msgpack_sbuffer_write);
}
static void wb_free(wb_t *w) { msgpack_sbuffer_destroy(&w->sb); }
static void wb_str(wb_t *w, const char *s)
{
    msgpack_pack_str(&w->pk, strlen(s));
    msgpack_pack_str_body(&w->pk, s, strlen(s));
}
static void wb_kv_u(wb_t *w, const char *k, uint64_t v) { wb_str(w, k); msgpack_pack_uint64(&w->pk, v); }
static void wb_kv_s(wb_t *w, const char *k, const char *v) { wb_str(w, k); wb_str(w, v); }
static void wb_raw(wb_t *w, const void *p, size_t n) { msgpack_sbuffer_write(&w->sb, p, n); }
/* Map of n_fields + 3 pairs starting with v, t, id. */
static void wb_head(wb_t *w, unsigned n_fields, uint64_t v, uint64_t t, uint64_t id)
{
    msgpack_pack_map(&w->pk, n_fields + 3);
    wb_kv_u(w, "v", v);
    wb_kv_u(w, "t", t);
    wb_kv_u(w, "id", id);
}
/* A valid ready message's body after wb_head(w, 2 + extra, ...). */
static void wb_ready_body(wb_t *w)
{
    wb_kv_u(w, "role", MSG_ROLE_ROUTER);
    wb_kv_s(w, "name", "router");
}

static const uint8_t *wb_data(wb_t *w) { return (const uint8_t *)w->sb.data; }

/* ---- schema table invariants ---- */

static void test_schema_tables(void **state)
{
    (void)state;
    for (int t = 1; t < MSG_TYPE_COUNT; t++) {
        const msg_schema_t *s = msg_schema_of((msg_type_t)t);
        assert_non_null(s);
        assert_string_equal(s->name, msg_type_name((msg_type_t)t));
        msg_type_t back;
        assert_int_equal(msg_type_parse(msg_type_name((msg_type_t)t), &back), 0);
        assert_int_equal(back, t);
        assert_true(s->n_fields <= 64);
        for (unsigned i = 0; i < s->n_fields; i++) {
            const msg_field_t *f = &s->fields[i];
            assert_true(strcmp(f->key, "v") && strcmp(f->key, "t") && strcmp(f->key, "id"));
            for (unsigned j = 0; j < i; j++)
                assert_true(strcmp(f->key, s->fields[j].key) != 0);
            if (f->kind == MSG_F_ENUM)
                for (uint64_t v = 0; v < f->hi; v++)
                    assert_non_null(msg_field_enum_name(f, (unsigned)v));
            if (f->kind == MSG_F_U32)
                assert_true(f->hi <= UINT32_MAX);
        }
    }
    assert_null(msg_schema_of(MSG_NONE));
    assert_null(msg_schema_of(MSG_TYPE_COUNT));
    assert_string_equal(msg_type_name(MSG_TYPE_COUNT), "?");
    msg_type_t tt;
    assert_int_equal(msg_type_parse("none", &tt), -1);
    assert_int_equal(msg_type_parse("bogus", &tt), -1);
    msg_role_t r;
    assert_int_equal(msg_role_parse("cache_manager", &r), 0);
    assert_int_equal(r, MSG_ROLE_CACHE_MANAGER);
    assert_int_equal(msg_role_parse("none", &r), -1);
}

/* ---- every fixture really is non-default, field by field ---- */

/* Fields a single fixture cannot fill: submit's prompt forms exclude each other (the other two
 * are covered by test_round_trip_submit_variants). */
static bool s_exempt(const char *path)
{
    return strcmp(path, "submit.prompt") == 0 || strcmp(path, "submit.tokens") == 0;
}

static void assert_non_default(const msg_schema_t *s, const void *fx, const void *dflt, const char *path)
{
    for (unsigned i = 0; i < s->n_fields; i++) {
        const msg_field_t *f = &s->fields[i];
        const void *a = MSG_CAT(fx, f->off), *b = MSG_CAT(dflt, f->off);
        char sub[160];
        snprintf(sub, sizeof sub, "%s.%s", path, f->key);
        switch (f->kind) {
        case MSG_F_BOOL: case MSG_F_U32: case MSG_F_U64: case MSG_F_I64: case MSG_F_F32: case MSG_F_F64:
        case MSG_F_ENUM: {
            size_t n = f->kind == MSG_F_BOOL ? 1 : (f->kind == MSG_F_U64 || f->kind == MSG_F_I64 || f->kind == MSG_F_F64) ? 8 : 4;
            if (memcmp(a, b, n) == 0)
                fail_msg("fixture field %s has its default value", sub);
            break;
        }
        case MSG_F_STR:
            if (!msg_field_present(f, fx) && !s_exempt(sub))
                fail_msg("fixture field %s is absent", sub);
            break;
        case MSG_F_STRUCT:
            assert_non_default(f->sub, a, b, sub);
            break;
        default:
            if (!msg_field_present(f, fx)) {
                if (s_exempt(sub))
                    break;
                fail_msg("fixture field %s is empty", sub);
            }
            if (f->kind == MSG_F_STRUCT_ARR) {
                const void *elem;
                memcpy(&elem, a, sizeof elem);
                void *d0 = calloc(1, f->sub->size);
                msg_schema_init(f->sub, d0);
                assert_non_default(f->sub, elem, d0, sub);
                free(d0);
            }
        }
    }
}

static void test_fixtures_non_default(void **state)
{
    (void)state;
    for (int t = 1; t < MSG_TYPE_COUNT; t++) {
        msg_t fx, dflt;
        fx_fill(&fx, (msg_type_t)t);
        msg_init(&dflt, (msg_type_t)t, 0);
        char err[256] = "";
        if (msg_validate(&fx, err, sizeof err) != 0)
            fail_msg("fixture %s invalid: %s", msg_type_name((msg_type_t)t), err);
        assert_non_default(msg_schema_of((msg_type_t)t), &fx.u, &dflt.u, msg_type_name((msg_type_t)t));
    }
}

/* ---- round trips ---- */

static void test_round_trip_every_type(void **state)
{
    (void)state;
    for (int t = 1; t < MSG_TYPE_COUNT; t++) {
        msg_t fx, out;
        fx_fill(&fx, (msg_type_t)t);
        size_t len = encode_ok(&fx, g_buf, BUF_CAP);
        decode_ok(g_buf, len, &out);
        char diff[256] = "";
        if (!msg_equal(&fx, &out, diff, sizeof diff))
            fail_msg("%s round trip: %s", msg_type_name((msg_type_t)t), diff);

        /* Encoding the decoded copy gives the same bytes: the encoding is canonical. */
        static uint8_t again[BUF_CAP];
        size_t len2 = encode_ok(&out, again, BUF_CAP);
        assert_int_equal(len, len2);
        assert_memory_equal(g_buf, again, len);

        /* The reference implementation (msgpack-c) reads our frame whole. */
        msgpack_zone z;
        msgpack_object obj;
        size_t off = 0;
        msgpack_zone_init(&z, 4096);
        assert_int_equal(msgpack_unpack(( const char *)g_buf, len, &off, &z, &obj), MSGPACK_UNPACK_SUCCESS);
        assert_int_equal(off, len);
        assert_int_equal(obj.type, MSGPACK_OBJECT_MAP);
        msgpack_zone_destroy(&z);

        /* The decoded strings and arrays live in the message's arena, not the fixture's. */
        msg_free(&out);
        assert_null(out.arena_);
        msg_free(&out);                                  /* idempotent */
    }
}

static void test_round_trip_submit_variants(void **state)
{
    (void)state;
    for (int v = 0; v < 2; v++) {
        msg_t fx, out;
        fx_fill_submit_variant(&fx, v);
        size_t len = encode_ok(&fx, g_buf, BUF_CAP);
        decode_ok(g_buf, len, &out);
        char diff[256] = "";
        if (!msg_equal(&fx, &out, diff, sizeof diff))
            fail_msg("submit variant %d: %s", v, diff);
        if (v == 0)
            assert_string_equal(out.u.submit.prompt, fx.u.submit.prompt);
        else
            assert_memory_equal(out.u.submit.tokens, fx_tokens, sizeof fx_tokens);
        msg_free(&out);
    }
    /* msg_equal notices a difference and names it. */
    msg_t a, b;
    fx_fill_submit_variant(&a, 1);
    fx_fill_submit_variant(&b, 1);
    uint32_t other[7];
    memcpy(other, fx_tokens, sizeof other);
    other[6] = 8;
    b.u.submit.tokens = other;
    char diff[256] = "";
    assert_false(msg_equal(&a, &b, diff, sizeof diff));
    assert_string_equal(diff, "submit.tokens differs");
    b.u.submit.tokens = fx_tokens;
    const char *stop2[] = {"\n\nUser:", "</s>", "other"};
    b.u.submit.sampling.stop = stop2;
    assert_false(msg_equal(&a, &b, diff, sizeof diff));
    assert_string_equal(diff, "submit.sampling.stop[2] differs");
}

static void test_round_trip_hand_checks(void **state)
{
    (void)state;
    msg_t fx, out;
    size_t len;

    fx_fill(&fx, MSG_SUBMIT);
    len = encode_ok(&fx, g_buf, BUF_CAP);
    decode_ok(g_buf, len, &out);
    assert_int_equal(out.type, MSG_SUBMIT);
    assert_true(out.id == 0x1122334455667788ull + MSG_SUBMIT);
    assert_null(out.u.submit.prompt);
    assert_int_equal(out.u.submit.n_messages, 3);
    assert_int_equal(out.u.submit.messages[0].role, MSG_CHAT_USER);
    assert_int_equal(out.u.submit.messages[1].role, MSG_CHAT_SYSTEM);
    assert_string_equal(out.u.submit.messages[0].content, "Say \"hi\"\n\ttwice \xf0\x9f\x98\x80");
    assert_string_equal(out.u.submit.messages[2].content, "");
    assert_ptr_not_equal(out.u.submit.messages[0].content, fx_chat[0].content);
    assert_true(out.u.submit.sampling.temperature == 0.7f);
    assert_true(out.u.submit.sampling.seed == 1234567890123ll);
    assert_int_equal(out.u.submit.sampling.n_stop, 3);
    assert_string_equal(out.u.submit.sampling.stop[2], "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93");
    assert_int_equal(out.u.submit.sampling.stop_token_ids[1], 128009);
    assert_int_equal(out.u.submit.cache_retention_s, 3600);
    assert_string_equal(out.u.submit.tenant, "tenant-a");
    msg_free(&out);

    fx_fill(&fx, MSG_INSPECT_REPLY);
    len = encode_ok(&fx, g_buf, BUF_CAP);
    decode_ok(g_buf, len, &out);
    assert_int_equal(out.u.inspect_reply.n_actors, 2);
    assert_string_equal(out.u.inspect_reply.actors[0].metrics[0].name, "tokens_total");
    assert_true(out.u.inspect_reply.actors[0].metrics[0].value == 123456789.0);
    assert_int_equal(out.u.inspect_reply.actors[0].metrics[0].kind, MSG_METRIC_COUNTER);
    assert_true(out.u.inspect_reply.actors[0].metrics[2].value == 0.125);
    assert_int_equal(out.u.inspect_reply.actors[1].role, MSG_ROLE_MONITOR);
    assert_int_equal(out.u.inspect_reply.actors[1].n_queues, 1);
    msg_free(&out);

    fx_fill(&fx, MSG_KV_ANNOUNCE);
    len = encode_ok(&fx, g_buf, BUF_CAP);
    decode_ok(g_buf, len, &out);
    assert_int_equal(out.u.kv_announce.handle_len, sizeof fx_handle);
    assert_memory_equal(out.u.kv_announce.handle, fx_handle, sizeof fx_handle);  /* NUL inside bin is fine */
    assert_int_equal(out.u.kv_announce.dtype, DT_BF16);
    assert_int_equal(out.u.kv_announce.block_ids[5], 4294967295u);
    msg_free(&out);
    /* Blocks of an fp8 cache (model.kv_dtype: fp8) are announced as such. */
    fx_fill(&fx, MSG_KV_ANNOUNCE);
    fx.u.kv_announce.dtype = DT_F8E4M3;
    len = encode_ok(&fx, g_buf, BUF_CAP);
    decode_ok(g_buf, len, &out);
    assert_int_equal(out.u.kv_announce.dtype, DT_F8E4M3);
    msg_free(&out);

    /* kv_link carries the 128-byte ncclUniqueId intact (zeros and all), as bin. */
    fx_fill(&fx, MSG_KV_LINK);
    fx.u.kv_link.status = MSG_ACK_OK;
    fx.u.kv_link.message = NULL;
    len = encode_ok(&fx, g_buf, BUF_CAP);
    decode_ok(g_buf, len, &out);
    assert_int_equal(out.u.kv_link.handle_len, 128);
    assert_memory_equal(out.u.kv_link.handle, fx_nccl_id, 128);
    assert_true(out.u.kv_link.link_id == 0x1234567890abcdefull);
    assert_int_equal(out.u.kv_link.channel, MSG_CHAN_NCCL);
    assert_int_equal(out.u.kv_link.rank, 1);
    assert_int_equal(out.u.kv_link.n_ranks, 2);
    assert_null(out.u.kv_link.message);
    msg_free(&out);

    fx_fill(&fx, MSG_TOKEN);
    len = encode_ok(&fx, g_buf, BUF_CAP);
    decode_ok(g_buf, len, &out);
    uint32_t negzero;
    memcpy(&negzero, &out.u.token.logprobs[2], 4);
    assert_int_equal(negzero, 0x80000000u);                          /* -0.0f kept bit for bit */
    assert_true(out.u.token.logprobs[3] == -3.0e-8f);
    msg_free(&out);

    fx_fill(&fx, MSG_EXPERT_PLACEMENT);
    len = encode_ok(&fx, g_buf, BUF_CAP);
    decode_ok(g_buf, len, &out);
    assert_int_equal(out.u.expert_placement.offsets[4], 6);
    assert_string_equal(out.u.expert_placement.workers[2], "moe-2");
    msg_free(&out);
}

static void test_print_and_json(void **state)
{
    (void)state;
    static char json[BUF_CAP];
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    for (int t = 1; t < MSG_TYPE_COUNT; t++) {
        msg_t fx;
        fx_fill(&fx, (msg_type_t)t);
        const char *name = msg_type_name((msg_type_t)t);

        char *line = NULL;
        size_t line_len = 0;
        FILE *mem = open_memstream(&line, &line_len);
        msg_print(&fx, mem);
        fclose(mem);
        assert_true(strncmp(line, name, strlen(name)) == 0);
        assert_non_null(strstr(line, "id=1234605616436508"));
        assert_int_equal(line[line_len - 1], '\n');
        assert_null(memchr(line, '\n', line_len - 1));           /* one line */
        free(line);
        msg_print(&fx, devnull);

        int n = msg_to_json(&fx, json, sizeof json);
        assert_true(n > 0);
        assert_int_equal((size_t)n, strlen(json));
        json_error_t jerr;
        json_t *root = json_loads(json, JSON_DECODE_INT_AS_REAL, &jerr);
        if (!root)
            fail_msg("%s JSON does not parse: %s: %s", name, jerr.text, json);
        assert_string_equal(json_string_value(json_object_get(root, "type")), name);
        const msg_schema_t *s = msg_schema_of((msg_type_t)t);
        for (unsigned i = 0; i < s->n_fields; i++)       /* every present field is in the JSON */
            if (msg_field_present(&s->fields[i], &fx.u) && !json_object_get(root, s->fields[i].key))
                fail_msg("%s JSON lacks \"%s\": %s", name, s->fields[i].key, json);
        json_decref(root);

        /* Too small a buffer: -1, never an overrun. */
        char small[16];
        memset(small, 'x', sizeof small);
        assert_int_equal(msg_to_json(&fx, small, 8), -1);
        assert_int_equal(small[8], 'x');
    }
    fclose(devnull);

    /* Hand checks: enum names, escapes, u64 beyond INT64_MAX, bin as hex. */
    msg_t m;
    fx_fill(&m, MSG_SUBMIT);
    assert_true(msg_to_json(&m, json, sizeof json) > 0);
    assert_non_null(strstr(json, "\"role\":\"user\""));
    assert_non_null(strstr(json, "\"content\":\"Say \\\"hi\\\"\\n\\ttwice \xf0\x9f\x98\x80\""));
    fx_fill(&m, MSG_CACHE_LOOKUP);
    assert_true(msg_to_json(&m, json, sizeof json) > 0);
    assert_non_null(strstr(json, "18446744073709551615"));
    fx_fill(&m, MSG_KV_ANNOUNCE);
    assert_true(msg_to_json(&m, json, sizeof json) > 0);
    assert_non_null(strstr(json, "\"handle\":\"2f74726f75706500ff10\""));
    assert_non_null(strstr(json, "\"channel\":\"cuda_ipc\""));
    assert_non_null(strstr(json, "\"dtype\":\"bf16\""));
    m.u.kv_announce.dtype = DT_F8E4M3;
    assert_true(msg_to_json(&m, json, sizeof json) > 0);
    assert_non_null(strstr(json, "\"dtype\":\"fp8\""));

    /* Print shortens a long prompt and stays one line. */
    static char big[100000];
    memset(big, 'a', sizeof big - 1);
    msg_init(&m, MSG_SUBMIT, 9);
    m.u.submit.prompt = big;
    char *line = NULL;
    size_t line_len = 0;
    FILE *mem = open_memstream(&line, &line_len);
    msg_print(&m, mem);
    fclose(mem);
    assert_true(line_len < 4096);
    assert_non_null(strstr(line, "...(99999B)"));
    free(line);
}

/* ---- rejections ---- */

static void test_reject_version_type_id(void **state)
{
    (void)state;
    wb_t w;

    wb_init(&w); wb_head(&w, 2, 2, MSG_READY, 1); wb_ready_body(&w);
    REJECT(wb_data(&w), w.sb.size, "v:", "protocol version 2 not supported");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 0, MSG_READY, 1); wb_ready_body(&w);
    REJECT(wb_data(&w), w.sb.size, "protocol version 0");
    wb_free(&w);

    /* Version is reported before anything about the fields, wherever "v" sits. */
    wb_init(&w); msgpack_pack_map(&w.pk, 4);
    wb_kv_u(&w, "zzz", 1); wb_kv_u(&w, "t", MSG_READY); wb_kv_u(&w, "id", 1); wb_kv_u(&w, "v", 7);
    REJECT(wb_data(&w), w.sb.size, "protocol version 7");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 0, 1, 99, 1);
    REJECT(wb_data(&w), w.sb.size, "t: unknown message type 99");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 0, 1, MSG_NONE, 1);
    REJECT(wb_data(&w), w.sb.size, "t: unknown message type 0");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 0, 1, MSG_TYPE_COUNT, 1);
    REJECT(wb_data(&w), w.sb.size, "unknown message type");
    wb_free(&w);

    wb_init(&w); msgpack_pack_map(&w.pk, 2); wb_kv_u(&w, "t", MSG_CANCEL); wb_kv_u(&w, "id", 1);
    REJECT(wb_data(&w), w.sb.size, "v: missing protocol version");
    wb_free(&w);

    wb_init(&w); msgpack_pack_map(&w.pk, 2); wb_kv_u(&w, "v", 1); wb_kv_u(&w, "id", 1);
    REJECT(wb_data(&w), w.sb.size, "t: missing message type");
    wb_free(&w);

    wb_init(&w); msgpack_pack_map(&w.pk, 2); wb_kv_u(&w, "v", 1); wb_kv_u(&w, "t", MSG_CANCEL);
    REJECT(wb_data(&w), w.sb.size, "id: missing request id");
    wb_free(&w);

    wb_init(&w); msgpack_pack_map(&w.pk, 3); wb_kv_u(&w, "v", 1); wb_kv_u(&w, "t", MSG_CANCEL);
    wb_kv_s(&w, "id", "seven");
    REJECT(wb_data(&w), w.sb.size, "id: expected unsigned int, got str");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); wb_kv_u(&w, "id", 2);
    REJECT(wb_data(&w), w.sb.size, "id: duplicate key");
    wb_free(&w);
    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); wb_kv_u(&w, "v", 1);
    REJECT(wb_data(&w), w.sb.size, "v: duplicate key");
    wb_free(&w);
    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); wb_kv_u(&w, "t", MSG_CANCEL);
    REJECT(wb_data(&w), w.sb.size, "t: duplicate key");
    wb_free(&w);
    /* Header keys last (another encoder's order) with a repeat before them. */
    wb_init(&w); msgpack_pack_map(&w.pk, 4);
    wb_kv_u(&w, "id", 1); wb_kv_u(&w, "id", 2); wb_kv_u(&w, "t", MSG_CANCEL); wb_kv_u(&w, "v", 1);
    REJECT(wb_data(&w), w.sb.size, "id: duplicate key");
    wb_free(&w);

    /* cancel with just the header is valid */
    msg_t m;
    wb_init(&w); wb_head(&w, 0, 1, MSG_CANCEL, 77);
    decode_ok(wb_data(&w), w.sb.size, &m);
    assert_int_equal(m.type, MSG_CANCEL);
    assert_int_equal(m.id, 77);
    msg_free(&m);
    wb_free(&w);
}

static void test_reject_keys(void **state)
{
    (void)state;
    wb_t w;

    wb_init(&w); wb_head(&w, 3, 1, MSG_READY, 1); wb_ready_body(&w); wb_kv_u(&w, "bogus", 1);
    REJECT(wb_data(&w), w.sb.size, "ready: unknown key \"bogus\"");
    wb_free(&w);

    /* An unknown key with bytes that must not reach the terminal raw. */
    wb_init(&w); wb_head(&w, 3, 1, MSG_READY, 1); wb_ready_body(&w); wb_kv_u(&w, "a\"\n\x1b", 1);
    REJECT(wb_data(&w), w.sb.size, "unknown key \"a\\x22\\x0a\\x1b\"");
    wb_free(&w);

    /* Unknown key inside a nested struct names the full path. */
    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi");
    wb_str(&w, "sampling"); msgpack_pack_map(&w.pk, 1); wb_kv_u(&w, "temprature", 1);
    REJECT(wb_data(&w), w.sb.size, "submit.sampling: unknown key \"temprature\"");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 3, 1, MSG_READY, 1); wb_ready_body(&w); wb_kv_s(&w, "name", "x");
    REJECT(wb_data(&w), w.sb.size, "ready.name: duplicate key");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 1, 1, MSG_READY, 1); wb_kv_u(&w, "role", MSG_ROLE_ROUTER);
    REJECT(wb_data(&w), w.sb.size, "ready.name: missing required field");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_str(&w, "name");
    msgpack_pack_nil(&w.pk);
    REJECT(wb_data(&w), w.sb.size, "ready.name: missing required field (nil)");
    wb_free(&w);

    /* Missing required field inside an array element. */
    wb_init(&w); wb_head(&w, 1, 1, MSG_CACHE_LOOKUP_REPLY, 1); wb_str(&w, "holders");
    msgpack_pack_array(&w.pk, 2);
    msgpack_pack_map(&w.pk, 1); wb_kv_s(&w, "holder", "a");
    msgpack_pack_map(&w.pk, 1); wb_kv_u(&w, "tier", 1);
    REJECT(wb_data(&w), w.sb.size, "cache_lookup_reply.holders[1].holder: missing required field");
    wb_free(&w);

    /* A non-string key. */
    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); msgpack_pack_uint64(&w.pk, 5); msgpack_pack_uint64(&w.pk, 5);
    REJECT(wb_data(&w), w.sb.size, "cancel: key 3 is a unsigned int, not a string");
    wb_free(&w);
    wb_init(&w); msgpack_pack_map(&w.pk, 3); msgpack_pack_uint64(&w.pk, 5); msgpack_pack_uint64(&w.pk, 5);
    wb_kv_u(&w, "v", 1); wb_kv_u(&w, "t", MSG_CANCEL);
    REJECT(wb_data(&w), w.sb.size, "key 0 of the top-level map is a unsigned int, not a string");
    wb_free(&w);
    wb_init(&w); wb_head(&w, 1, 1, MSG_SUBMIT, 1); wb_str(&w, "sampling"); msgpack_pack_map(&w.pk, 1);
    msgpack_pack_true(&w.pk); msgpack_pack_uint64(&w.pk, 5);
    REJECT(wb_data(&w), w.sb.size, "submit.sampling: key 0 is a bool, not a string");
    wb_free(&w);

    /* A required array present but empty. */
    wb_init(&w); wb_head(&w, 1, 1, MSG_CACHE_LOOKUP, 1); wb_str(&w, "hashes"); msgpack_pack_array(&w.pk, 0);
    REJECT(wb_data(&w), w.sb.size, "cache_lookup.hashes: missing required field (empty)");
    wb_free(&w);
}

static void test_reject_values(void **state)
{
    (void)state;
    wb_t w;

    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 99); wb_kv_s(&w, "name", "x");
    REJECT(wb_data(&w), w.sb.size, "ready.role: enum value 99 out of range [1, 10]");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 0); wb_kv_s(&w, "name", "x");
    REJECT(wb_data(&w), w.sb.size, "ready.role: enum value 0 out of range");
    wb_free(&w);

    char longname[MSG_MAX_NAME + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_kv_s(&w, "name", longname);
    REJECT(wb_data(&w), w.sb.size, "ready.name: string of 257 bytes exceeds the limit of 256");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_kv_s(&w, "name", "");
    REJECT(wb_data(&w), w.sb.size, "ready.name: must not be empty");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_kv_u(&w, "name", 5);
    REJECT(wb_data(&w), w.sb.size, "ready.name: expected str, got unsigned int");
    wb_free(&w);

    /* bin where a str belongs */
    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_str(&w, "name");
    msgpack_pack_bin(&w.pk, 2); msgpack_pack_bin_body(&w.pk, "ab", 2);
    REJECT(wb_data(&w), w.sb.size, "ready.name: expected str, got bin");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_kv_s(&w, "name", "bad\xc3(");
    REJECT(wb_data(&w), w.sb.size, "ready.name: not valid UTF-8");
    wb_free(&w);

    /* An embedded NUL would silently cut the C string: refused. */
    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_str(&w, "name");
    msgpack_pack_str(&w.pk, 3); msgpack_pack_str_body(&w.pk, "a\0b", 3);
    REJECT(wb_data(&w), w.sb.size, "ready.name: not valid UTF-8");
    wb_free(&w);

    /* Overlong encoding and a UTF-16 surrogate. */
    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_kv_s(&w, "name", "\xc0\xaf");
    REJECT(wb_data(&w), w.sb.size, "not valid UTF-8");
    wb_free(&w);
    wb_init(&w); wb_head(&w, 2, 1, MSG_READY, 1); wb_kv_u(&w, "role", 1); wb_kv_s(&w, "name", "\xed\xa0\x80");
    REJECT(wb_data(&w), w.sb.size, "not valid UTF-8");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 3, 1, MSG_READY, 1); wb_ready_body(&w); wb_str(&w, "pid"); msgpack_pack_int64(&w.pk, -5);
    REJECT(wb_data(&w), w.sb.size, "ready.pid: -5 is negative");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 3, 1, MSG_READY, 1); wb_ready_body(&w); wb_kv_u(&w, "pid", 1ull << 32);
    REJECT(wb_data(&w), w.sb.size, "ready.pid: 4294967296 outside [0, 4294967295]");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 1); wb_str(&w, "top_p"); msgpack_pack_double(&w.pk, 1.5);
    REJECT(wb_data(&w), w.sb.size, "submit.sampling.top_p: 1.5 outside [0, 1]");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 1); wb_str(&w, "top_p"); msgpack_pack_double(&w.pk, 0.0);
    REJECT(wb_data(&w), w.sb.size, "submit.sampling.top_p: 0 must be greater than 0");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 1); wb_str(&w, "temperature"); msgpack_pack_double(&w.pk, NAN);
    REJECT(wb_data(&w), w.sb.size, "submit.sampling.temperature: NaN is not a finite number");
    wb_free(&w);

    /* A double beyond float range must be refused, not narrowed (that would be UB). */
    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 1); wb_str(&w, "temperature"); msgpack_pack_double(&w.pk, 1e300);
    REJECT(wb_data(&w), w.sb.size, "submit.sampling.temperature: 1e+300 outside the float32 range");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 1); wb_str(&w, "seed"); msgpack_pack_int64(&w.pk, -2);
    REJECT(wb_data(&w), w.sb.size, "submit.sampling.seed: -2 outside [-1, 9223372036854775807]");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 1); wb_kv_u(&w, "seed", 1ull << 63);
    REJECT(wb_data(&w), w.sb.size, "submit.sampling.seed: 9223372036854775808 does not fit");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "stream");
    msgpack_pack_uint64(&w.pk, 1);
    REJECT(wb_data(&w), w.sb.size, "submit.stream: expected bool, got unsigned int");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 1, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "sampling", "hot");
    REJECT(wb_data(&w), w.sb.size, "submit.sampling: expected map, got str");
    wb_free(&w);

    /* token id beyond 32 bits inside an array names the element */
    wb_init(&w); wb_head(&w, 1, 1, MSG_SUBMIT, 1); wb_str(&w, "tokens"); msgpack_pack_array(&w.pk, 3);
    msgpack_pack_uint64(&w.pk, 1); msgpack_pack_uint64(&w.pk, 2); msgpack_pack_uint64(&w.pk, 1ull << 33);
    REJECT(wb_data(&w), w.sb.size, "submit.tokens[2]: 8589934592 does not fit in 32 bits");
    wb_free(&w);
}

static void test_reject_cross_field(void **state)
{
    (void)state;
    wb_t w;
    char err[256];
    msg_t m;

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "tokens");
    msgpack_pack_array(&w.pk, 1); msgpack_pack_uint64(&w.pk, 1);
    REJECT(wb_data(&w), w.sb.size, "submit.prompt: exactly one of prompt, messages, tokens is required (got 2)");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 0, 1, MSG_SUBMIT, 1);
    REJECT(wb_data(&w), w.sb.size, "exactly one of prompt, messages, tokens is required (got 0)");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_kv_u(&w, "cache_retention_s", 300);
    REJECT(wb_data(&w), w.sb.size, "submit.cache_retention_s: 300 s of retention needs a prompt_cache_key");
    wb_free(&w);

    /* The same rules guard encode. */
    fx_fill(&m, MSG_TOKEN);
    m.u.token.n_logprobs = 3;
    assert_int_equal(msg_encode(&m, g_buf, BUF_CAP, &(size_t){0}, err, sizeof err), -1);
    assert_non_null(strstr(err, "token.logprobs: 3 entries for 7 tokens"));

    fx_fill(&m, MSG_EXPERT_PLACEMENT);
    static const uint32_t bad_off[] = {0, 1, 1, 4, 6};
    m.u.expert_placement.offsets = bad_off;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "expert_placement.offsets[2]: 1 not above offsets[1] = 1 (layer 0 expert 1"));
    static const uint32_t bad_rep[] = {0, 1, 2, 3, 0, 1};
    fx_fill(&m, MSG_EXPERT_PLACEMENT);
    m.u.expert_placement.replicas = bad_rep;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "expert_placement.replicas[3]: worker index 3, only 3 workers"));
    fx_fill(&m, MSG_EXPERT_PLACEMENT);
    m.u.expert_placement.n_layers = 3;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "expected n_layers * n_experts + 1 = 7"));

    fx_fill(&m, MSG_DRAFT_POLICY);
    msg_draft_bucket_t b[2] = {{8, 4, 0.5f}, {8, 2, 0.5f}};
    m.u.draft_policy.buckets = b;
    m.u.draft_policy.n_buckets = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "draft_policy.buckets[1].max_batch: 8 not above"));

    fx_fill(&m, MSG_DRAFT_POLICY);
    m.u.draft_policy.max_k = 5;   /* the first bucket's 6 drafts exceed it */
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "draft_policy.buckets[0].max_draft: 6 exceeds max_k 5"));
    fx_fill(&m, MSG_DRAFT_POLICY);
    static const float up[] = {0.5f, 0.6f};
    m.u.draft_policy.survival = up;
    m.u.draft_policy.n_survival = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "draft_policy.survival[1]"));
    fx_fill(&m, MSG_DRAFT_POLICY);
    m.u.draft_policy.valid_ms = 0;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);

    fx_fill(&m, MSG_SPEC_REPORT);
    static const uint64_t rising[] = {10, 20};
    m.u.spec_report.accepted_at = rising;
    m.u.spec_report.n_accepted_at = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.accepted_at: 2 entries, proposed_at has 4"));
    static const uint64_t prop2[] = {30, 30};
    m.u.spec_report.proposed_at = prop2;
    m.u.spec_report.n_proposed_at = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.accepted_at[1]: position 1 counts more than position 0"));
    static const uint64_t over[] = {40, 20};
    m.u.spec_report.accepted_at = over;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.accepted_at[0]: 40 exceeds proposed_at[0] = 30"));
    fx_fill(&m, MSG_SPEC_REPORT);
    m.u.spec_report.accepted = 401;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.accepted: 401 exceeds drafts 400"));
    fx_fill(&m, MSG_SPEC_REPORT);
    m.u.spec_report.n_conf_accepted = 3;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.conf_accepted: 3 entries, conf_seen has 4"));
    fx_fill(&m, MSG_SPEC_REPORT);
    m.u.spec_report.n_cost_us = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.cost_*: cost_batch has 3 entries"));
    fx_fill(&m, MSG_SPEC_REPORT);
    static const uint32_t zero_batch[] = {1, 0, 2};
    m.u.spec_report.cost_batch = zero_batch;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.cost_batch[1]: 0"));
    fx_fill(&m, MSG_SPEC_REPORT);
    static const uint32_t many_drafts[] = {1, 65, 2};
    m.u.spec_report.cost_drafts = many_drafts;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.cost_drafts[1]: 65 above 64"));
    fx_fill(&m, MSG_SPEC_REPORT);
    static const uint64_t no_steps[] = {1, 1, 0};
    m.u.spec_report.cost_steps = no_steps;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.cost_steps[2]: 0"));
    fx_fill(&m, MSG_SPEC_REPORT);
    m.u.spec_report.n_cost_rows = m.u.spec_report.n_cost_tokens = 0;   /* optional: none is fine */
    assert_int_equal(msg_validate(&m, err, sizeof err), 0);
    m.u.spec_report.n_cost_rows = m.u.spec_report.n_cost_tokens = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.cost_rows: 2 entries, cost_tokens 2, cost_batch 3"));
    fx_fill(&m, MSG_SPEC_REPORT);
    m.u.spec_report.n_cost_tokens = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.cost_rows: 3 entries, cost_tokens 2"));
    fx_fill(&m, MSG_SPEC_REPORT);
    static const uint64_t few_rows[] = {40, 2, 256000};
    m.u.spec_report.cost_rows = few_rows;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_report.cost_rows[1]: 2 rows in 3 steps"));

    fx_fill(&m, MSG_KV_ANNOUNCE);
    m.u.kv_announce.handle_len = 0;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "kv_announce.handle: required for a cuda_ipc channel"));

    fx_fill(&m, MSG_KV_ANNOUNCE);
    m.u.kv_announce.channel = MSG_CHAN_NCCL;
    m.u.kv_announce.handle_len = 0;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "kv_announce.handle: required for a nccl channel"));

    fx_fill(&m, MSG_KV_LINK);
    m.u.kv_link.message = NULL;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "kv_link.message: required when status is failed"));
    fx_fill(&m, MSG_KV_LINK);
    m.u.kv_link.status = MSG_ACK_OK;
    m.u.kv_link.handle_len = 0;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "kv_link.handle: an offer needs the channel's bootstrap"));
    fx_fill(&m, MSG_KV_LINK);
    m.u.kv_link.rank = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "kv_link.rank: 2 is not below n_ranks 2"));

    fx_fill(&m, MSG_KV_ACK);
    m.u.kv_ack.message = NULL;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "kv_ack.message: required when status is failed"));

    fx_fill(&m, MSG_INSPECT);
    m.u.inspect.name = NULL;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "inspect.name: required when what is actor"));

    fx_fill(&m, MSG_DONE);
    m.u.done.usage.cached_tokens = 101;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "done.usage.cached_tokens: 101 exceeds prompt_tokens 100"));
    /* cached_tokens by source: they add up to it, or are all 0 (a sender that does not split). */
    fx_fill(&m, MSG_DONE);
    m.u.done.usage.cached_disk_tokens = 17;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "done.usage.cached_device_tokens: device 32 + host 16 + disk 17 = 65, not cached_tokens 64"));
    fx_fill(&m, MSG_DONE);
    m.u.done.usage.cached_device_tokens = m.u.done.usage.cached_host_tokens = m.u.done.usage.cached_disk_tokens = 0;
    assert_int_equal(msg_validate(&m, err, sizeof err), 0);
    fx_fill(&m, MSG_DONE);
    m.u.done.usage.cached_device_tokens = 0xffffffffu;   /* the sum must not wrap around to 64 */
    m.u.done.usage.cached_host_tokens = 65;
    m.u.done.usage.cached_disk_tokens = 0;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);

    fx_fill(&m, MSG_HANDOFF);
    m.u.handoff.cached_disk_tokens = 4;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "handoff.cached_host_tokens: host 1 + disk 4 exceed cached_tokens 4"));

    /* A fetch reply's disk blocks: a count and a mask that agree, within the blocks found. */
    fx_fill(&m, MSG_CACHE_FETCH_REPLY);
    m.u.cache_fetch_reply.found_disk = 4;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "cache_fetch_reply.found_disk: 4 exceeds found 3"));
    fx_fill(&m, MSG_CACHE_FETCH_REPLY);
    m.u.cache_fetch_reply.found_disk = 1;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "cache_fetch_reply.disk_mask: 2 bits set, found_disk says 1"));
    const uint64_t past[] = {0x9};   /* block 3 of 3 found */
    fx_fill(&m, MSG_CACHE_FETCH_REPLY);
    m.u.cache_fetch_reply.disk_mask = past;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "cache_fetch_reply.disk_mask[0]: bits set past the 3 blocks found"));
    fx_fill(&m, MSG_CACHE_FETCH_REPLY);
    m.u.cache_fetch_reply.n_disk_mask = 0;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "cache_fetch_reply.disk_mask: 0 words, expected 1 for 3 blocks found, 2 from disk"));
    const uint64_t full[] = {~0ull, 0x1};   /* 65 blocks, all from disk */
    fx_fill(&m, MSG_CACHE_FETCH_REPLY);
    m.u.cache_fetch_reply.found = 65;
    m.u.cache_fetch_reply.found_disk = 65;
    m.u.cache_fetch_reply.disk_mask = full;
    m.u.cache_fetch_reply.n_disk_mask = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), 0);

    fx_fill(&m, MSG_HANDOFF);
    m.u.handoff.kv_tokens = 8;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "handoff.kv_tokens: 8 exceeds the 7 prompt tokens"));

    /* The hand-off's transfer description names its sender, and no other. */
    fx_fill(&m, MSG_HANDOFF);
    m.u.handoff.prefill_worker = "prefill-1";
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "handoff.kv.src: prefill-0, but the hand-off comes from prefill-1"));
    msg_kv_announce_t two[2] = {fx_handoff_kv[0], fx_handoff_kv[0]};
    fx_fill(&m, MSG_HANDOFF);
    m.u.handoff.kv = two;
    m.u.handoff.n_kv = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    msg_kv_announce_t no_handle = fx_handoff_kv[0];
    no_handle.handle_len = 0;
    fx_fill(&m, MSG_HANDOFF);
    m.u.handoff.kv = &no_handle;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "handoff.kv[0].handle: required for a tcp channel"));

    fx_fill(&m, MSG_SUBMIT);
    m.u.submit.sampling.logprobs = false;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "submit.sampling.top_logprobs: 5 needs logprobs set"));

    /* Caller mistakes encode refuses rather than sends. */
    fx_fill(&m, MSG_STATS);
    m.u.stats.queues = NULL;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "stats.queues: NULL with count 2"));
    fx_fill(&m, MSG_SUBMIT);
    m.u.submit.sampling.temperature = NAN;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "submit.sampling.temperature: NaN is not a finite number"));
    msg_init(&m, MSG_NONE, 0);
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown message type 0"));
}

/* Alternatives (top_logprobs): rows of k per token, most likely first, the tokens' own logprobs
 * present, at most MSG_MAX_LOGPROBS per position; a hand-off's first token's at most what its
 * sampling asked for. */
static void test_reject_top_logprobs(void **state)
{
    (void)state;
    msg_t m, out;
    char err[256];
    static const uint32_t ids[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    static const float sorted2[] = {-1, -2, -0.5f, -3, -1, -1, -2, -4, -1, -9, -2, -2, -0.25f, -0.5f};
    fx_fill(&m, MSG_TOKEN);
    m.u.token.top_logprobs = sorted2;              /* a row may start above the row before ended */
    assert_int_equal(msg_validate(&m, err, sizeof err), 0);
    size_t len = encode_ok(&m, g_buf, BUF_CAP);
    decode_ok(g_buf, len, &out);
    assert_int_equal(out.u.token.n_top_tokens, 14);
    assert_true(out.u.token.top_logprobs[12] == -0.25f && out.u.token.top_tokens[13] == 7 + 1);
    msg_free(&out);
    fx_fill(&m, MSG_TOKEN);
    m.u.token.n_top_logprobs = 12;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "token.top_logprobs: 12 entries for 14 top_tokens"));
    fx_fill(&m, MSG_TOKEN);
    m.u.token.n_top_tokens = m.u.token.n_top_logprobs = 13;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "token.top_tokens: 13 entries are not 1..20 per token for 7 tokens"));
    fx_fill(&m, MSG_TOKEN);
    m.u.token.n_logprobs = 0;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "token.top_tokens: alternatives without the tokens' logprobs"));
    static const float unsorted[] = {-1, -2, -3, -2.5f, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    fx_fill(&m, MSG_TOKEN);
    m.u.token.top_logprobs = unsorted;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "token.top_logprobs[3]: -2.5 above the -3 before it"));
    static const float positive[] = {0.5f, -2, -3, -3, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    fx_fill(&m, MSG_TOKEN);
    m.u.token.top_logprobs = positive;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "token.top_logprobs"));
    /* 21 per token: past OpenAI's (and the field's) bound, whatever the counts agree on. */
    static uint32_t many_ids[7 * 21];
    static float many_lp[7 * 21];
    for (unsigned i = 0; i < 7 * 21; i++)
        many_lp[i] = -(float)(i % 21);
    fx_fill(&m, MSG_TOKEN);
    m.u.token.top_tokens = many_ids; m.u.token.n_top_tokens = 7 * 21;
    m.u.token.top_logprobs = many_lp; m.u.token.n_top_logprobs = 7 * 21;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "token.top_tokens: 147 entries are not 1..20 per token for 7 tokens"));
    (void)ids;

    fx_fill(&m, MSG_HANDOFF);
    m.u.handoff.sampling.top_logprobs = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "handoff.first_top_tokens: 3 alternatives, sampling.top_logprobs asks for 2"));
    fx_fill(&m, MSG_HANDOFF);
    m.u.handoff.n_first_top_logprobs = 2;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "handoff.first_top_logprobs: 2 entries for 3 first_top_tokens"));
    static const float up[] = {-3, -2, -1};
    fx_fill(&m, MSG_HANDOFF);
    m.u.handoff.first_top_logprobs = up;
    assert_int_equal(msg_validate(&m, err, sizeof err), -1);
    assert_non_null(strstr(err, "handoff.first_top_logprobs[1]: -2 above the -3 before it"));

    /* On the wire: an array past the field's limit is refused before anything is allocated. */
    wb_t w;
    wb_init(&w); wb_head(&w, 2, 1, MSG_TOKEN, 1); wb_str(&w, "tokens");
    msgpack_pack_array(&w.pk, 1); msgpack_pack_uint64(&w.pk, 1);
    wb_str(&w, "top_tokens");
    msgpack_pack_array(&w.pk, MSG_MAX_TOKEN_CHUNK * MSG_MAX_LOGPROBS + 1);
    for (unsigned i = 0; i <= MSG_MAX_TOKEN_CHUNK * MSG_MAX_LOGPROBS; i++)
        msgpack_pack_uint64(&w.pk, 1);
    REJECT(wb_data(&w), w.sb.size, "token.top_tokens: 81921 elements exceed the limit of 81920");
    wb_free(&w);
    wb_init(&w); wb_head(&w, 3, 1, MSG_TOKEN, 1); wb_str(&w, "tokens");
    msgpack_pack_array(&w.pk, 1); msgpack_pack_uint64(&w.pk, 1);
    wb_str(&w, "logprobs"); msgpack_pack_array(&w.pk, 1); msgpack_pack_float(&w.pk, -1.0f);
    wb_str(&w, "top_logprobs"); msgpack_pack_array(&w.pk, 1); msgpack_pack_float(&w.pk, 0.25f);
    REJECT(wb_data(&w), w.sb.size, "token.top_logprobs[0]");
    wb_free(&w);
}

static void test_reject_limits(void **state)
{
    (void)state;
    wb_t w;

    /* Array count over its field's limit: refused before the arena is asked for it. */
    wb_init(&w); wb_head(&w, 1, 1, MSG_TOKEN, 1); wb_str(&w, "tokens");
    msgpack_pack_array(&w.pk, MSG_MAX_TOKEN_CHUNK + 1);
    for (unsigned i = 0; i <= MSG_MAX_TOKEN_CHUNK; i++)
        msgpack_pack_uint64(&w.pk, i);
    REJECT(wb_data(&w), w.sb.size, "token.tokens: 4097 elements exceed the limit of 4096");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 1); wb_str(&w, "stop"); msgpack_pack_array(&w.pk, MSG_MAX_STOP + 1);
    for (unsigned i = 0; i <= MSG_MAX_STOP; i++)
        wb_str(&w, "x");
    REJECT(wb_data(&w), w.sb.size, "submit.sampling.stop: 17 elements exceed the limit of 16");
    wb_free(&w);

    wb_init(&w); wb_head(&w, 2, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", "hi"); wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 1); wb_str(&w, "stop"); msgpack_pack_array(&w.pk, 2);
    wb_str(&w, "ok"); wb_str(&w, "");
    REJECT(wb_data(&w), w.sb.size, "submit.sampling.stop[1]: must not be empty");
    wb_free(&w);

    /* Prompt text over 4 MiB. */
    size_t big = MSG_MAX_PROMPT_BYTES + 1;
    char *text = malloc(big + 1);
    memset(text, 'p', big);
    text[big] = 0;
    wb_init(&w); wb_head(&w, 1, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", text);
    REJECT(wb_data(&w), w.sb.size, "submit.prompt: string of 4194305 bytes exceeds the limit of 4194304");
    wb_free(&w);
    /* ... and exactly 4 MiB is fine. */
    text[big - 1] = 0;
    wb_init(&w); wb_head(&w, 1, 1, MSG_SUBMIT, 1); wb_kv_s(&w, "prompt", text);
    msg_t m;
    decode_ok(wb_data(&w), w.sb.size, &m);
    assert_int_equal(strlen(m.u.submit.prompt), MSG_MAX_PROMPT_BYTES);
    msg_free(&m);
    wb_free(&w);
    free(text);

    /* Frame over 16 MiB, refused before it is even looked at. */
    uint8_t *huge = calloc(MSG_MAX_FRAME + 1, 1);
    huge[0] = 0x80;
    REJECT(huge, MSG_MAX_FRAME + 1, "frame of 16777217 bytes exceeds the limit of 16777216 bytes");
    /* More objects than MSG_MAX_ELEMENTS (an array of nils, well within the frame). */
    size_t n_el = MSG_MAX_ELEMENTS + 10;
    size_t k = 0;
    huge[k++] = 0x81; huge[k++] = 0xa1; huge[k++] = 'x'; huge[k++] = 0xdd;
    huge[k++] = (uint8_t)(n_el >> 24); huge[k++] = (uint8_t)(n_el >> 16);
    huge[k++] = (uint8_t)(n_el >> 8); huge[k++] = (uint8_t)n_el;
    memset(huge + k, 0xc0, n_el);
    REJECT(huge, k + n_el, "more than 4194304 objects in one frame");
    free(huge);
}

/* Frames that lie about their sizes: written byte by byte. */
static void test_reject_lying_counts(void **state)
{
    (void)state;
    wb_t w;

    /* `dd ff 00 00 00` as a field's value: an array claiming 4278190080 elements. */
    static const uint8_t arr32[] = {0xdd, 0xff, 0x00, 0x00, 0x00};
    wb_init(&w); wb_head(&w, 1, 1, MSG_SUBMIT, 1); wb_str(&w, "tokens"); wb_raw(&w, arr32, sizeof arr32);
    REJECT(wb_data(&w), w.sb.size, "array of 4278190080 elements at byte", "claims more than the 0 bytes left");
    wb_free(&w);

    /* The same five bytes as the whole frame. */
    REJECT(arr32, sizeof arr32, "top level is array, not a map");
    static const uint8_t map32[] = {0xdf, 0xff, 0x00, 0x00, 0x00};
    REJECT(map32, sizeof map32, "map of 4278190080 pairs at byte 0 claims more than the 0 bytes left");

    /* A str32 claiming 4 GB. */
    static const uint8_t str32[] = {0xdb, 0xff, 0xff, 0xff, 0xff, 'a', 'b'};
    wb_init(&w); wb_head(&w, 1, 1, MSG_SUBMIT, 1); wb_str(&w, "prompt"); wb_raw(&w, str32, sizeof str32);
    REJECT(wb_data(&w), w.sb.size, "str of 4294967295 bytes at byte", "exceeds the 2 bytes left");
    wb_free(&w);

    /* bin32 and ext32 likewise. */
    static const uint8_t bin32[] = {0xc6, 0x7f, 0xff, 0xff, 0xff, 1};
    wb_init(&w); wb_head(&w, 1, 1, MSG_CACHE_FETCH, 1); wb_str(&w, "handle"); wb_raw(&w, bin32, sizeof bin32);
    REJECT(wb_data(&w), w.sb.size, "bin of 2147483647 bytes");
    wb_free(&w);
    static const uint8_t ext32[] = {0xc9, 0x7f, 0xff, 0xff, 0xff, 1, 2};
    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); wb_str(&w, "x"); wb_raw(&w, ext32, sizeof ext32);
    REJECT(wb_data(&w), w.sb.size, "ext of 2147483647 bytes");
    wb_free(&w);

    /* A well-formed ext is still not part of the protocol. */
    static const uint8_t fixext[] = {0xd4, 0x01, 0x02};
    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); wb_str(&w, "x"); wb_raw(&w, fixext, sizeof fixext);
    REJECT(wb_data(&w), w.sb.size, "ext type at byte", "not part of the protocol");
    wb_free(&w);

    /* The reserved byte. */
    static const uint8_t c1[] = {0xc1};
    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); wb_str(&w, "x"); wb_raw(&w, c1, 1);
    REJECT(wb_data(&w), w.sb.size, "reserved byte 0xc1");
    wb_free(&w);

    /* Nesting: 8 levels is the limit (the top map is level 1). */
    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); wb_str(&w, "x");
    for (int i = 0; i < 8; i++)
        msgpack_pack_array(&w.pk, 1);
    msgpack_pack_nil(&w.pk);
    REJECT(wb_data(&w), w.sb.size, "nests deeper than 8 levels");
    wb_free(&w);
    /* Seven nested arrays inside the top map pass the pre-scan and fail on the unknown key. */
    wb_init(&w); wb_head(&w, 1, 1, MSG_CANCEL, 1); wb_str(&w, "x");
    for (int i = 0; i < 7; i++)
        msgpack_pack_array(&w.pk, 1);
    msgpack_pack_nil(&w.pk);
    REJECT(wb_data(&w), w.sb.size, "cancel: unknown key \"x\"");
    wb_free(&w);
}

static void test_reject_framing(void **state)
{
    (void)state;
    msg_t fx;

    /* Trailing bytes after a valid message. */
    fx_fill(&fx, MSG_HEARTBEAT);
    size_t len = encode_ok(&fx, g_buf, BUF_CAP);
    g_buf[len] = 0xc0;
    REJECT(g_buf, len + 1, "1 trailing bytes after the message");
    g_buf[len + 1] = 0x81;
    REJECT(g_buf, len + 2, "2 trailing bytes");

    /* Non-map top levels. */
    static const uint8_t arr[] = {0x92, 0x01, 0x02};
    REJECT(arr, sizeof arr, "top level is array, not a map");
    static const uint8_t num[] = {0x07};
    REJECT(num, 1, "top level is unsigned int, not a map");
    static const uint8_t str[] = {0xa2, 'h', 'i'};
    REJECT(str, sizeof str, "top level is str, not a map");
    REJECT(g_buf, 0, "empty frame");
    char err[64];
    msg_t m;
    assert_int_equal(msg_decode(NULL, 5, &m, err, sizeof err), -1);

    /* Every proper prefix of every type's frame is rejected cleanly. */
    for (int t = 1; t < MSG_TYPE_COUNT; t++) {
        fx_fill(&fx, (msg_type_t)t);
        len = encode_ok(&fx, g_buf, BUF_CAP);
        for (size_t cut = 0; cut < len; cut++) {
            /* A fresh heap copy so ASan would see a read past the cut. */
            uint8_t *p = malloc(cut ? cut : 1);
            memcpy(p, g_buf, cut);
            char e[256] = "";
            assert_int_equal(msg_decode(p, cut, &m, e, sizeof e), -1);
            assert_true(e[0] != 0);
            assert_null(m.arena_);
            free(p);
        }
    }
}

/* What other encoders write (Python's msgpack: small ints in any int format, floats as
 * float64, None for "not given", keys in any order) decodes to the same message. */
static void test_interop_encodings(void **state)
{
    (void)state;
    wb_t w;
    msg_t m;
    wb_init(&w);
    msgpack_pack_map(&w.pk, 6);
    wb_str(&w, "sampling");
    msgpack_pack_map(&w.pk, 5);
    wb_str(&w, "temperature"); msgpack_pack_double(&w.pk, 0.5);
    wb_str(&w, "top_p"); msgpack_pack_int8(&w.pk, 1);            /* an int where a float goes */
    wb_str(&w, "max_tokens"); wb_raw(&w, "\xd1\x00\x10", 3);     /* int16 16 */
    wb_str(&w, "seed"); msgpack_pack_nil(&w.pk);                  /* None: default */
    wb_str(&w, "min_p"); msgpack_pack_float(&w.pk, 0.25f);
    wb_str(&w, "model"); msgpack_pack_nil(&w.pk);
    wb_kv_s(&w, "prompt", "Hello");
    wb_kv_u(&w, "id", 5);
    wb_kv_u(&w, "t", MSG_SUBMIT);
    wb_str(&w, "v"); wb_raw(&w, "\xd3\x00\x00\x00\x00\x00\x00\x00\x01", 9);   /* int64 1 */
    decode_ok(wb_data(&w), w.sb.size, &m);
    assert_int_equal(m.type, MSG_SUBMIT);
    assert_int_equal(m.id, 5);
    assert_string_equal(m.u.submit.prompt, "Hello");
    assert_true(m.u.submit.sampling.temperature == 0.5f);
    assert_true(m.u.submit.sampling.top_p == 1.0f);
    assert_int_equal(m.u.submit.sampling.max_tokens, 16);
    assert_true(m.u.submit.sampling.seed == -1);
    assert_true(m.u.submit.sampling.min_p == 0.25f);
    assert_true(m.u.submit.sampling.repetition_penalty == 1.0f);  /* absent: default */
    assert_null(m.u.submit.model);

    /* msg_peek finds t and id even where decode fails. */
    msg_type_t t;
    uint64_t id = 0;
    assert_int_equal(msg_peek(wb_data(&w), w.sb.size, &t, &id), 0);
    assert_int_equal(t, MSG_SUBMIT);
    assert_int_equal(id, 5);
    msg_free(&m);
    wb_free(&w);

    wb_init(&w); msgpack_pack_map(&w.pk, 4);
    wb_str(&w, "junk"); msgpack_pack_array(&w.pk, 2); wb_str(&w, "t"); wb_str(&w, "id");
    wb_kv_u(&w, "t", MSG_SUBMIT); wb_str(&w, "id"); msgpack_pack_uint64(&w.pk, 424242);
    wb_str(&w, "prompt"); wb_raw(&w, "\xdb\xff\xff\xff\xff", 5);
    REJECT(wb_data(&w), w.sb.size, "exceeds");
    id = 0;
    assert_int_equal(msg_peek(wb_data(&w), w.sb.size, &t, &id), 0);
    assert_int_equal(t, MSG_SUBMIT);
    assert_int_equal(id, 424242);
    wb_free(&w);

    static const uint8_t lie[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa2, 'i', 'd'};
    assert_int_equal(msg_peek(lie, sizeof lie, &t, &id), -1);
    assert_int_equal(msg_peek(lie, 0, &t, &id), -1);
}

static void test_encode_small_buffer(void **state)
{
    (void)state;
    for (int t = 1; t < MSG_TYPE_COUNT; t++) {
        msg_t fx;
        fx_fill(&fx, (msg_type_t)t);
        size_t len = encode_ok(&fx, g_buf, BUF_CAP);
        static uint8_t small[BUF_CAP];
        for (size_t cap = 0; cap < len; cap += (cap < 64 ? 1 : 7)) {
            memset(small, 0xa5, len + 16);
            char err[256] = "";
            size_t got = 12345;
            assert_int_equal(msg_encode(&fx, small, cap, &got, err, sizeof err), -1);
            assert_non_null(strstr(err, "does not fit in"));
            assert_int_equal(got, 12345);                            /* untouched on failure */
            for (size_t i = cap; i < len + 16; i++)
                assert_int_equal(small[i], 0xa5);                   /* nothing past cap */
        }
        size_t got = 0;
        assert_int_equal(msg_encode(&fx, small, len, &got, NULL, 0), 0);   /* exactly enough */
        assert_int_equal(got, len);
    }
}

static void test_clone(void **state)
{
    (void)state;
    for (int t = 1; t < MSG_TYPE_COUNT; t++) {
        msg_t fx, dec, copy;
        char err[256] = "", diff[256] = "";
        fx_fill(&fx, (msg_type_t)t);
        size_t len = encode_ok(&fx, g_buf, BUF_CAP);
        decode_ok(g_buf, len, &dec);
        if (msg_clone(&dec, &copy, err, sizeof err) != 0)
            fail_msg("clone %s: %s", msg_type_name((msg_type_t)t), err);
        /* Wipe the source's arena and frame: the clone must not point into either (ASan would
         * also see a use after free). */
        memset(g_buf, 0xee, len);
        msg_free(&dec);
        if (!msg_equal(&fx, &copy, diff, sizeof diff))
            fail_msg("clone of %s: %s", msg_type_name((msg_type_t)t), diff);
        msg_free(&copy);
    }
    msg_t fx, copy;
    char err[256];
    fx_fill(&fx, MSG_SUBMIT);
    assert_int_equal(msg_clone(&fx, &copy, err, sizeof err), 0);
    assert_ptr_not_equal(copy.u.submit.sampling.stop, fx.u.submit.sampling.stop);
    assert_ptr_not_equal(copy.u.submit.sampling.stop[0], fx.u.submit.sampling.stop[0]);
    assert_ptr_not_equal(copy.u.submit.messages[0].content, fx.u.submit.messages[0].content);
    assert_string_equal(copy.u.submit.messages[0].content, fx.u.submit.messages[0].content);
    msg_free(&copy);
    fx.u.submit.sampling.top_p = 2.0f;                /* invalid source: refused, dst empty */
    assert_int_equal(msg_clone(&fx, &copy, err, sizeof err), -1);
    assert_non_null(strstr(err, "submit.sampling.top_p"));
    assert_int_equal(copy.type, MSG_NONE);
    assert_null(copy.arena_);
}

static void test_decode_reuses_and_frees(void **state)
{
    (void)state;
    msg_t fx, m;
    fx_fill(&fx, MSG_STATS);
    size_t len = encode_ok(&fx, g_buf, BUF_CAP);
    memset(&m, 0x5a, sizeof m);                  /* garbage: decode must not read *out */
    decode_ok(g_buf, len, &m);
    assert_non_null(m.arena_);
    msg_free(&m);
    assert_null(m.arena_);
    assert_int_equal(m.u.stats.n_queues, 0);    /* payload cleared */
    assert_int_equal(m.type, MSG_STATS);        /* type and id kept */
    msg_free(&m);
    msg_free(NULL);

    /* Defaults after msg_init. */
    msg_init(&m, MSG_HANDOFF, 3);
    assert_true(m.u.handoff.sampling.temperature == 1.0f);
    assert_true(m.u.handoff.sampling.top_p == 1.0f);
    assert_true(m.u.handoff.sampling.seed == -1);
    assert_int_equal(m.u.handoff.sampling.max_tokens, 256);
    assert_null(m.arena_);
}

static void test_fuzz_regressions(void **state)
{
    (void)state;
    const char *dir = "tests/fuzz/corpus/msg";
    DIR *d = opendir(dir);
    if (!d)
        fail_msg("cannot open %s (run from the repository root)", dir);
    int files = 0, valid = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        size_t n = fread(g_buf, 1, BUF_CAP, f);
        fclose(f);
        uint8_t *p = malloc(n ? n : 1);             /* exact-size copy: ASan sees overreads */
        memcpy(p, g_buf, n);
        LLVMFuzzerTestOneInput(p, n);
        msg_t m;
        char err[256];
        bool ok = msg_decode(p, n, &m, err, sizeof err) == 0;
        if (strncmp(e->d_name, "valid-", 6) == 0 && !ok)
            fail_msg("%s no longer decodes: %s", path, err);
        if (strncmp(e->d_name, "bad-", 4) == 0 && ok)
            fail_msg("%s decodes but should not", path);
        valid += ok;
        msg_free(&m);
        free(p);
        files++;
    }
    closedir(d);
    assert_true(files >= MSG_TYPE_COUNT - 1 + 8);
    assert_true(valid >= MSG_TYPE_COUNT - 1 + 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_tables),
        cmocka_unit_test(test_fixtures_non_default),
        cmocka_unit_test(test_round_trip_every_type),
        cmocka_unit_test(test_round_trip_submit_variants),
        cmocka_unit_test(test_round_trip_hand_checks),
        cmocka_unit_test(test_print_and_json),
        cmocka_unit_test(test_reject_version_type_id),
        cmocka_unit_test(test_reject_keys),
        cmocka_unit_test(test_reject_values),
        cmocka_unit_test(test_reject_cross_field),
        cmocka_unit_test(test_reject_top_logprobs),
        cmocka_unit_test(test_reject_limits),
        cmocka_unit_test(test_reject_lying_counts),
        cmocka_unit_test(test_reject_framing),
        cmocka_unit_test(test_interop_encodings),
        cmocka_unit_test(test_encode_small_buffer),
        cmocka_unit_test(test_clone),
        cmocka_unit_test(test_decode_reuses_and_frees),
        cmocka_unit_test(test_fuzz_regressions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
