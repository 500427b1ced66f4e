/* The gateway's pieces without processes: request parsing and its errors, the cache contract,
 * reply JSON shapes, API keys and the rate limiter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "actors/gateway/gw_keys.h"
#include "actors/gateway/gw_limit.h"
#include "actors/gateway/gw_reply.h"
#include "actors/gateway/gw_request.h"
#include "topology/topology.h"

static const gw_parse_opts_t s_opts = {.model = "m", .can_retain = 1, .max_retention_s = 604800,
                                       .default_retention_s = 300};

static int s_parse(gw_kind_t k, const char *body, gw_request_t *r, gw_error_t *e)
{
    return gw_request_parse(k, body, strlen(body), &s_opts, r, e);
}

/* Parses a body that must fail: its status and param. */
static void s_bad(gw_kind_t k, const char *body, int status, const char *param)
{
    gw_request_t r;
    gw_error_t e;
    if (s_parse(k, body, &r, &e) == 0)
        fail_msg("accepted: %s", body);
    if (e.status != status || strcmp(e.param, param) != 0)
        fail_msg("%s: got %d param '%s' (%s), wanted %d '%s'", body, e.status, e.param, e.message, status, param);
    assert_true(e.message[0] != '\0');
    assert_null(r.root);
}

static void test_chat_ok(void **st)
{
    gw_request_t r;
    gw_error_t e;
    const char *b = "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hel\"},{\"type\":\"text\",\"text\":\"lo\"}]},"
                    "{\"role\":\"assistant\",\"content\":null}],"
                    "\"max_completion_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"seed\":42,\"stop\":[\"a\",\"bc\"],"
                    "\"presence_penalty\":1.5,\"frequency_penalty\":-1,\"stream\":true,"
                    "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":0,\"user\":\"x\","
                    "\"prompt_cache_key\":\"k1\",\"prompt_cache_options\":{\"ttl\":\"1h\"}}";
    assert_int_equal(s_parse(GW_CHAT, b, &r, &e), 0);
    assert_int_equal(r.submit.n_messages, 3);
    assert_int_equal(r.submit.messages[0].role, MSG_CHAT_SYSTEM);
    assert_string_equal(r.submit.messages[1].content, "hello");
    assert_string_equal(r.submit.messages[2].content, "");
    assert_int_equal(r.submit.sampling.max_tokens, 7);
    assert_true(r.submit.sampling.temperature == 0.0f);
    assert_true(r.submit.sampling.top_p == 0.5f);
    assert_int_equal(r.submit.sampling.seed, 42);
    assert_int_equal(r.submit.sampling.n_stop, 2);
    assert_string_equal(r.submit.sampling.stop[1], "bc");
    assert_true(r.submit.sampling.presence_penalty == 1.5f);
    assert_true(r.stream && r.include_usage && r.logprobs && r.submit.sampling.logprobs);
    assert_string_equal(r.submit.prompt_cache_key, "k1");
    assert_int_equal(r.submit.cache_retention_s, 3600);
    /* The whole submit passes the protocol's own checks. */
    msg_t m;
    msg_init(&m, MSG_SUBMIT, 1);
    m.u.submit = r.submit;
    char err[256];
    assert_int_equal(msg_validate(&m, err, sizeof err), 0);
    gw_request_free(&r);
}

static void test_completion_ok(void **st)
{
    gw_request_t r;
    gw_error_t e;
    assert_int_equal(s_parse(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"once\"],\"max_tokens\":3,\"logprobs\":0}", &r, &e), 0);
    assert_string_equal(r.submit.prompt, "once");
    assert_int_equal(r.submit.sampling.max_tokens, 3);
    assert_true(r.logprobs);
    assert_false(r.stream);
    gw_request_free(&r);
    assert_int_equal(s_parse(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":[5,6,7]}", &r, &e), 0);
    assert_int_equal(r.submit.n_tokens, 3);
    assert_int_equal(r.submit.tokens[2], 7);
    assert_int_equal(r.submit.sampling.max_tokens, 256);   /* the protocol's default */
    assert_int_equal(r.submit.sampling.seed, -1);
    gw_request_free(&r);
}

static void test_errors(void **st)
{
    s_bad(GW_CHAT, "{\"model\":\"m\",", 400, "");
    s_bad(GW_CHAT, "[1]", 400, "");
    s_bad(GW_CHAT, "{\"messages\":[]}", 400, "model");
    s_bad(GW_CHAT, "{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404, "model");
    s_bad(GW_CHAT, "{\"model\":\"m\"}", 400, "messages");
    s_bad(GW_CHAT, "{\"model\":\"m\",\"messages\":[]}", 400, "messages");
    s_bad(GW_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role");
    s_bad(GW_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content");
    s_bad(GW_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
          "messages[0].content");
    const char *u = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],";
    char b[512];
#define BAD_FIELD(extra, param)                     \
    do {                                            \
        snprintf(b, sizeof b, "%s%s}", u, extra);   \
        s_bad(GW_CHAT, b, 400, param);              \
    } while (0)
    BAD_FIELD("\"temperature\":\"hot\"", "temperature");
    BAD_FIELD("\"temperature\":3", "temperature");
    BAD_FIELD("\"top_p\":0", "top_p");
    BAD_FIELD("\"top_p\":1.5", "top_p");
    BAD_FIELD("\"max_tokens\":0", "max_tokens");
    BAD_FIELD("\"max_tokens\":1.5", "max_tokens");
    BAD_FIELD("\"max_tokens\":5,\"max_completion_tokens\":6", "max_completion_tokens");
    BAD_FIELD("\"n\":17", "n");   /* 1..GW_MAX_N */
    BAD_FIELD("\"n\":0", "n");
    BAD_FIELD("\"n\":\"two\"", "n");
    BAD_FIELD("\"presence_penalty\":-3", "presence_penalty");
    BAD_FIELD("\"stop\":[1]", "stop");
    BAD_FIELD("\"stop\":\"\"", "stop");
    BAD_FIELD("\"stream\":\"yes\"", "stream");
    BAD_FIELD("\"stream_options\":{\"include_usage\":true}", "stream_options");
    BAD_FIELD("\"stream\":true,\"stream_options\":{\"include_usage\":1}", "stream_options.include_usage");
    BAD_FIELD("\"logprobs\":true,\"top_logprobs\":21", "top_logprobs");   /* OpenAI's bound: 0..20 */
    BAD_FIELD("\"logprobs\":true,\"top_logprobs\":-1", "top_logprobs");
    BAD_FIELD("\"logprobs\":true,\"top_logprobs\":2.5", "top_logprobs");
    BAD_FIELD("\"top_logprobs\":3", "top_logprobs");                        /* without logprobs: true */
    BAD_FIELD("\"tools\":[{\"type\":\"function\"}]", "tools");
    BAD_FIELD("\"response_format\":{\"type\":\"json_object\"}", "response_format");
    BAD_FIELD("\"seed\":\"x\"", "seed");
    s_bad(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", 400, "prompt");
    s_bad(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,-2]}", 400, "prompt");
    s_bad(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"\"}", 400, "prompt");
    s_bad(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":6}", 400, "logprobs");   /* 0..5 */
    s_bad(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":true}", 400, "logprobs");
    s_bad(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"echo\":true}", 400, "echo");
    /* A duplicated key is ambiguous: refused. */
    s_bad(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"prompt\":\"y\"}", 400, "");
    /* An embedded NUL would cut the prompt short: refused. */
    s_bad(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"a\\u0000b\"}", 400, "");
}

/* An error quoting invalid bytes is still valid JSON (the parser's message names them). */
static void test_error_utf8(void **st)
{
    gw_request_t r;
    gw_error_t e;
    const char body[] = "{\"model\":\"m\",\"prompt\":\"\xcd\x9b\xa3\x8a\"}";
    assert_int_equal(gw_request_parse(GW_COMPLETION, body, sizeof body - 1, &s_opts, &r, &e), -1);
    char *j = gw_error_json(&e);
    assert_non_null(j);
    free(j);
    char s[] = "ok \xc3\xa9 \xc3 \xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x82\xac";
    gw_utf8_clean(s);
    assert_string_equal(s, "ok \xc3\xa9 ? ??? ???? \xe2\x82\xac");
}

static void test_cache_contract(void **st)
{
    gw_request_t r;
    gw_error_t e;
    const char *u = "{\"model\":\"m\",\"prompt\":\"x\",";
    char b[512];
    struct {
        const char *extra;
        uint32_t want;
    } ok[] = {
        {"\"prompt_cache_key\":\"k\"", 0},
        {"\"prompt_cache_key\":\"k\",\"prompt_cache_retention\":\"in_memory\"", 300},
        {"\"prompt_cache_key\":\"k\",\"prompt_cache_retention\":\"24h\"", 86400},
        {"\"prompt_cache_key\":\"k\",\"prompt_cache_options\":{\"ttl\":\"5m\"}", 300},
        {"\"prompt_cache_key\":\"k\",\"prompt_cache_options\":{\"ttl\":\"1h\"}", 3600},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        snprintf(b, sizeof b, "%s%s}", u, ok[i].extra);
        assert_int_equal(s_parse(GW_COMPLETION, b, &r, &e), 0);
        assert_int_equal(r.submit.cache_retention_s, ok[i].want);
        gw_request_free(&r);
    }
#define BAD_CACHE(extra, param)                          \
    do {                                                 \
        snprintf(b, sizeof b, "%s%s}", u, extra);        \
        s_bad(GW_COMPLETION, b, 400, param);             \
    } while (0)
    BAD_CACHE("\"prompt_cache_retention\":\"24h\"", "prompt_cache_key");
    BAD_CACHE("\"prompt_cache_key\":\"k\",\"prompt_cache_retention\":\"forever\"", "prompt_cache_retention");
    BAD_CACHE("\"prompt_cache_key\":\"k\",\"prompt_cache_options\":{\"ttl\":\"soon\"}", "prompt_cache_options.ttl");
    BAD_CACHE("\"prompt_cache_key\":\"k\",\"prompt_cache_options\":{\"ttl\":\"30d\"}", "prompt_cache_options.ttl");
    BAD_CACHE("\"prompt_cache_key\":\"k\",\"prompt_cache_options\":\"1h\"", "prompt_cache_options");
    BAD_CACHE("\"prompt_cache_key\":\"k\",\"prompt_cache_retention\":\"24h\",\"prompt_cache_options\":{\"ttl\":\"1h\"}",
              "prompt_cache_options");
    BAD_CACHE("\"prompt_cache_key\":7", "prompt_cache_key");
    /* A cluster without pins cannot honour any retention: 400, not a silent drop. */
    gw_parse_opts_t none = s_opts;
    none.can_retain = 0;
    snprintf(b, sizeof b, "%s\"prompt_cache_key\":\"k\",\"prompt_cache_retention\":\"24h\"}", u);
    assert_int_equal(gw_request_parse(GW_COMPLETION, b, strlen(b), &none, &r, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "prompt_cache_retention");
}

static json_t *s_load(char *s)
{
    assert_non_null(s);
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    free(s);
    assert_non_null(j);
    return j;
}

/* usage.prompt_tokens_details: cached_tokens is OpenAI's total; where those tokens came from is
 * added when the cluster said (the split adds up to it), and left out when it did not. */
static void test_usage_split(void **st)
{
    gw_reply_ctx_t c = {.kind = GW_COMPLETION, .id = "cmpl-1", .created = 5, .model = "m"};
    gw_usage_t u = {.prompt_tokens = 100, .cached_tokens = 80, .completion_tokens = 3, .cached_device_tokens = 16,
                    .cached_host_tokens = 32, .cached_disk_tokens = 32};
    json_t *j = s_load(gw_completion_json(&c, "x", "stop", &u, NULL, 0));
    json_t *d = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
    assert_int_equal(json_integer_value(json_object_get(d, "cached_tokens")), 80);
    assert_int_equal(json_integer_value(json_object_get(d, "cached_device_tokens")), 16);
    assert_int_equal(json_integer_value(json_object_get(d, "cached_host_tokens")), 32);
    assert_int_equal(json_integer_value(json_object_get(d, "cached_disk_tokens")), 32);
    json_decref(j);
    j = s_load(gw_usage_chunk_json(&c, &u));
    d = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
    assert_int_equal(json_integer_value(json_object_get(d, "cached_disk_tokens")), 32);
    json_decref(j);
    u.cached_device_tokens = u.cached_host_tokens = u.cached_disk_tokens = 0;   /* not split */
    j = s_load(gw_completion_json(&c, "x", "stop", &u, NULL, 0));
    d = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
    assert_int_equal(json_integer_value(json_object_get(d, "cached_tokens")), 80);
    assert_null(json_object_get(d, "cached_device_tokens"));
    assert_null(json_object_get(d, "cached_disk_tokens"));
    json_decref(j);
}

static void test_replies(void **st)
{
    gw_reply_ctx_t c = {.kind = GW_CHAT, .id = "chatcmpl-1", .created = 5, .model = "m"};
    gw_usage_t u = {.prompt_tokens = 40, .cached_tokens = 32, .completion_tokens = 3};
    gw_logprob_t lp[] = {{.token = "he", .logprob = -0.5f}, {.token = "llo", .logprob = -1.0f}};
    json_t *j = s_load(gw_completion_json(&c, "hello", "length", &u, lp, 2));
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "message"), "content")), "hello");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_t *content = json_object_get(json_object_get(ch, "logprobs"), "content");
    assert_int_equal(json_array_size(content), 2);
    assert_true(json_real_value(json_object_get(json_array_get(content, 1), "logprob")) == -1.0);
    json_t *us = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(us, "total_tokens")), 43);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(us, "prompt_tokens_details"), "cached_tokens")), 32);
    json_decref(j);

    j = s_load(gw_chunk_json(&c, "", NULL, 1, 1, NULL, 0));
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "delta"), "role")), "assistant");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    assert_true(json_is_null(json_object_get(j, "usage")));
    json_decref(j);
    j = s_load(gw_usage_chunk_json(&c, &u));
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    json_decref(j);

    c.kind = GW_COMPLETION;
    j = s_load(gw_completion_json(&c, "x", "stop", &u, lp, 2));
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "x");
    json_t *offs = json_object_get(json_object_get(ch, "logprobs"), "text_offset");
    assert_int_equal(json_integer_value(json_array_get(offs, 1)), 2);
    json_decref(j);

    gw_error_t e;
    gw_error_set(&e, 404, "model_not_found", "model", "no %s", "such");
    j = s_load(gw_error_json(&e));
    json_t *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "no such");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "model");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "model_not_found");
    json_decref(j);
    gw_error_set(&e, 500, NULL, NULL, "boom");
    j = s_load(gw_error_json(&e));
    assert_true(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    assert_true(json_is_null(json_object_get(json_object_get(j, "error"), "code")));
    json_decref(j);
    j = s_load(gw_models_json("m", 9));
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")), "m");
    json_decref(j);
}

/* top_logprobs: chat's 0..20 with logprobs, completions' logprobs 0..5, into the submit's sampling. */
static void test_top_logprobs_parse(void **st)
{
    gw_request_t r;
    gw_error_t e;
    const char *chat = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
                       "\"top_logprobs\":20}";
    assert_int_equal(s_parse(GW_CHAT, chat, &r, &e), 0);
    assert_true(r.logprobs && r.submit.sampling.logprobs);
    assert_int_equal(r.top_logprobs, 20);
    assert_int_equal(r.submit.sampling.top_logprobs, 20);
    msg_t m;
    msg_init(&m, MSG_SUBMIT, 1);
    m.u.submit = r.submit;
    char err[256];
    assert_int_equal(msg_validate(&m, err, sizeof err), 0);
    gw_request_free(&r);
    assert_int_equal(s_parse(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":5}", &r, &e), 0);
    assert_true(r.submit.sampling.logprobs);
    assert_int_equal(r.submit.sampling.top_logprobs, 5);
    gw_request_free(&r);
    assert_int_equal(s_parse(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\"}", &r, &e), 0);
    assert_false(r.submit.sampling.logprobs);
    assert_int_equal(r.submit.sampling.top_logprobs, 0);
    gw_request_free(&r);
}

/* Alternatives in OpenAI's shapes: chat's top_logprobs entries {token, logprob, bytes}; a token's
 * text from its bytes (part of a character shows U+FFFD, bytes keep the truth), or its id without
 * a tokenizer; completions' {text: logprob} map per position, the likelier of two same texts. */
static void test_top_logprobs_replies(void **st)
{
    static const uint8_t he[] = {'h', 'e'}, half[] = {0xe4, 0xbd}, sp[] = {' ', 'h'};
    const gw_logprob_t top0[] = {{.logprob = -0.25f, .bytes = he, .n_bytes = 2, .id = 9},
                                 {.logprob = -2.0f, .bytes = half, .n_bytes = 2, .id = 10},
                                 {.logprob = -3.0f, .id = 77}};
    const gw_logprob_t top1[] = {{.logprob = -0.5f, .bytes = sp, .n_bytes = 2, .id = 3},
                                 {.logprob = -0.75f, .bytes = sp, .n_bytes = 2, .id = 4}};
    const gw_logprob_t lp[] = {{.logprob = -0.25f, .bytes = he, .n_bytes = 2, .id = 9, .top = top0, .n_top = 3},
                               {.logprob = -0.75f, .bytes = sp, .n_bytes = 2, .id = 4, .top = top1, .n_top = 2}};
    gw_reply_ctx_t c = {.kind = GW_CHAT, .id = "chatcmpl-1", .created = 5, .model = "m"};
    gw_usage_t u = {.prompt_tokens = 4, .completion_tokens = 2};
    json_t *j = s_load(gw_completion_json(&c, "he h", "length", &u, lp, 2));
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"),
                                      "content");
    json_t *e0 = json_array_get(content, 0), *t0 = json_object_get(e0, "top_logprobs");
    assert_string_equal(json_string_value(json_object_get(e0, "token")), "he");
    assert_int_equal(json_array_size(t0), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(t0, 0), "token")), "he");
    assert_true(json_real_value(json_object_get(json_array_get(t0, 0), "logprob")) == -0.25);
    /* Two bytes of a three-byte character: one U+FFFD, as Python's decode("utf-8", "replace") */
    assert_string_equal(json_string_value(json_object_get(json_array_get(t0, 1), "token")), "\xef\xbf\xbd");
    json_t *b1 = json_object_get(json_array_get(t0, 1), "bytes");
    assert_int_equal(json_array_size(b1), 2);
    assert_int_equal(json_integer_value(json_array_get(b1, 0)), 0xe4);
    assert_string_equal(json_string_value(json_object_get(json_array_get(t0, 2), "token")), "token_id:77");
    assert_true(json_is_null(json_object_get(json_array_get(t0, 2), "bytes")));
    json_decref(j);

    c.kind = GW_COMPLETION;
    j = s_load(gw_completion_json(&c, "he h", "length", &u, lp, 2));
    json_t *l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *tops = json_object_get(l, "top_logprobs");
    assert_int_equal(json_array_size(tops), 2);
    assert_int_equal(json_object_size(json_array_get(tops, 0)), 3);
    assert_true(json_real_value(json_object_get(json_array_get(tops, 0), "he")) == -0.25);
    assert_int_equal(json_object_size(json_array_get(tops, 1)), 1);   /* two tokens " h": the likelier */
    assert_true(json_real_value(json_object_get(json_array_get(tops, 1), " h")) == -0.5);
    assert_string_equal(json_string_value(json_array_get(json_object_get(l, "tokens"), 1)), " h");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 1)), 2);
    json_decref(j);
    /* Streamed: the chunk's own tokens, the same shapes. */
    c.kind = GW_CHAT;
    j = s_load(gw_chunk_json(&c, "he", NULL, 0, 0, lp, 1));
    content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    assert_int_equal(json_array_size(json_object_get(json_array_get(content, 0), "top_logprobs")), 3);
    json_decref(j);
}

/* n: 1..GW_MAX_N choices; a fixed seed becomes seed + i per choice, a random one stays random. */
static void test_n_choices(void **st)
{
    gw_request_t r;
    gw_error_t e;
    assert_int_equal(s_parse(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\"}", &r, &e), 0);
    assert_int_equal(r.n, 1);
    gw_request_free(&r);
    assert_int_equal(s_parse(GW_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"n\":16,\"seed\":5}", &r, &e), 0);
    assert_int_equal(r.n, 16);
    gw_request_free(&r);
    assert_int_equal(gw_choice_seed(5, 0), 5);
    assert_int_equal(gw_choice_seed(5, 3), 8);
    assert_int_equal(gw_choice_seed(INT64_MAX, 1), 0);   /* stays a fixed (non-negative) seed */
    assert_int_equal(gw_choice_seed(-1, 4), -1);

    /* n choices in one reply, each its index; a chunk carries its choice's index. */
    gw_reply_ctx_t c = {.kind = GW_CHAT, .id = "chatcmpl-1", .created = 5, .model = "m"};
    gw_usage_t u = {.prompt_tokens = 10, .cached_tokens = 4, .completion_tokens = 7};
    const gw_choice_out_t ch[] = {{.text = "a", .finish = "stop"}, {.text = "bc", .finish = "length"}};
    json_t *j = s_load(gw_completion_n_json(&c, ch, 2, &u));
    json_t *cs = json_object_get(j, "choices");
    assert_int_equal(json_array_size(cs), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(cs, 1), "index")), 1);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(cs, 1), "message"), "content")), "bc");
    assert_string_equal(json_string_value(json_object_get(json_array_get(cs, 1), "finish_reason")), "length");
    assert_true(json_is_null(json_object_get(json_array_get(cs, 0), "logprobs")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 7);
    json_decref(j);
    c.kind = GW_COMPLETION;
    c.index = 3;
    j = s_load(gw_chunk_json(&c, "z", NULL, 0, 0, NULL, 0));
    assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "index")), 3);
    json_decref(j);
}

/* Stream chunks without logprobs are written directly, not through a jansson tree: byte for byte
 * what the tree dumps, for every kind, flag and awkward text (escapes, controls, DEL, non-ASCII,
 * past the BMP, invalid UTF-8 -> one U+FFFD). */
static void test_chunk_direct(void **st)
{
    static const char *const texts[] = {"", "hello", " world\n", "\"q\" \\ /", "\t\b\f\r\x01\x1f\x7f",
                                        "caf\xc3\xa9", "\xe2\x80\xa8 line sep", "\xf0\x9f\x98\x80 emoji",
                                        "bad \xff byte", "cut \xe2\x82", "surrogate \xed\xa0\x80", NULL};
    static const char *const finishes[] = {NULL, "stop", "length"};
    for (int kind = 0; kind < 2; kind++)
        for (size_t t = 0; t < sizeof texts / sizeof *texts; t++)
            for (int f = 0; f < 3; f++)
                for (int flags = 0; flags < 4; flags++) {
                    gw_reply_ctx_t c = {.kind = kind ? GW_CHAT : GW_COMPLETION, .id = "chatcmpl-4000000000000abc",
                                        .created = 1764633600, .model = t == 3 ? "m\"odel\xc3\xa9" : "kjv-dense",
                                        .index = (uint32_t)t};
                    char *fast = gw_chunk_json(&c, texts[t], finishes[f], flags & 1, flags >> 1, NULL, 0);
                    char *tree = gw_chunk_json_tree(&c, texts[t], finishes[f], flags & 1, flags >> 1, NULL, 0);
                    assert_non_null(fast);
                    assert_non_null(tree);
                    if (strcmp(fast, tree) != 0)
                        fail_msg("kind %d text %zu finish %d flags %d:\n direct %s\n tree   %s", kind, t, f, flags, fast, tree);
                    free(fast);
                    free(tree);
                }
}

static void test_keys(void **st)
{
    topo_api_key_t k[2] = {{.key = "sk-alpha-123", .tenant = "alpha", .requests_per_minute = 2},
                           {.key = "sk-beta-4567", .tenant = "beta"}};
    topo_gateway_t g = {.keys = k, .n_keys = 2};
    gw_keys_t keys;
    assert_int_equal(gw_keys_init(&keys, &g, 0), 0);
    assert_false(gw_keys_open(&keys));
    size_t n;
    const char *t = gw_bearer("Bearer  sk-beta-4567 ", &n);
    assert_non_null(t);
    assert_int_equal(n, 12);
    gw_key_t *hit = gw_keys_find(&keys, t, n);
    assert_non_null(hit);
    assert_string_equal(hit->cfg->tenant, "beta");
    assert_null(gw_keys_find(&keys, "sk-beta-456", 11));     /* a prefix is not the key */
    assert_null(gw_keys_find(&keys, "sk-beta-45678", 13));   /* nor is a longer one */
    assert_null(gw_bearer("Basic abc", &n));
    assert_null(gw_bearer("Bearer", &n));
    assert_null(gw_bearer("Bearer   ", &n));
    assert_null(gw_bearer(NULL, &n));
    assert_non_null(gw_bearer("bearer x", &n));
    gw_keys_free(&keys);
    topo_gateway_t open = {0};
    assert_int_equal(gw_keys_init(&keys, &open, 0), 0);
    assert_true(gw_keys_open(&keys));
    gw_keys_free(&keys);
}

static void test_limit(void **st)
{
    gw_bucket_t b;
    int retry = 0;
    gw_bucket_init(&b, 2, 0);   /* 2 a minute: one every 30 s */
    assert_int_equal(gw_bucket_take(&b, 1, 0, &retry), 0);
    assert_int_equal(gw_bucket_take(&b, 1, 0, &retry), 0);
    assert_int_equal(gw_bucket_take(&b, 1, 0, &retry), -1);
    assert_int_equal(retry, 30);
    assert_int_equal(gw_bucket_take(&b, 1, 10000, &retry), -1);
    assert_int_equal(retry, 20);
    assert_int_equal(gw_bucket_take(&b, 1, 30000, &retry), 0);
    /* Tokens: admitted while positive, debited after, in debt until refilled. */
    gw_bucket_init(&b, 600, 0);   /* 10 a second */
    assert_int_equal(gw_bucket_check(&b, 0, &retry), 0);
    gw_bucket_debit(&b, 700, 0);
    assert_int_equal(gw_bucket_check(&b, 0, &retry), -1);
    assert_int_equal(retry, 11);
    assert_int_equal(gw_bucket_check(&b, 10000, &retry), -1);
    assert_int_equal(retry, 1);
    assert_int_equal(gw_bucket_check(&b, 10100, &retry), 0);
    /* Unlimited. */
    gw_bucket_init(&b, 0, 0);
    gw_bucket_debit(&b, 1e9, 0);
    assert_int_equal(gw_bucket_check(&b, 0, &retry), 0);
    assert_int_equal(gw_bucket_take(&b, 1e9, 0, &retry), 0);
    /* Refill never passes the cap. */
    gw_bucket_init(&b, 60, 0);
    assert_int_equal(gw_bucket_take(&b, 60, 3600000, &retry), 0);
    assert_int_equal(gw_bucket_take(&b, 1, 3600000, &retry), -1);
}

/* The topology's gateway section and endpoints.http: defaults, keys, and each error named. */
#define TOPO "name: g\nmodel:\n  path: m\nactors:\n  - role: monitor\n  - role: router\n  - role: decode\n"

static topo_t *s_topo(const char *yaml, topo_errors_t *e)
{
    topo_t *t = NULL;
    topo_errors_clear(e);
    topo_load_string(yaml, strlen(yaml), "t.yaml", &t, e);
    return t;
}

static void test_topology(void **st)
{
    static topo_errors_t e;
    topo_t *t = s_topo(TOPO, &e);
    assert_non_null(t);
    assert_string_equal(t->endpoints.http, "");   /* no gateway: nothing bound */
    assert_int_equal(t->gateway.n_keys, 0);
    assert_int_equal(t->gateway.max_body_bytes, 8 << 20);
    topo_destroy(&t);
    t = s_topo(TOPO "  - role: gateway\ngateway:\n  idle_timeout_s: 5\n  api_keys:\n    - key: sk-0123456789\n"
                    "      tenant: acme\n      requests_per_minute: 10\n    - key: sk-abcdefghij\n", &e);
    if (!t)
        fail_msg("%s", e.msg[0]);
    assert_string_equal(t->endpoints.http, "tcp://127.0.0.1:8000");
    assert_int_equal(t->gateway.idle_timeout_s, 5);
    assert_int_equal(t->gateway.n_keys, 2);
    assert_string_equal(t->gateway.keys[0].tenant, "acme");
    assert_int_equal(t->gateway.keys[0].requests_per_minute, 10);
    assert_string_equal(t->gateway.keys[1].tenant, "key-1");
    assert_int_equal(t->gateway.keys[1].tokens_per_minute, 0);
    topo_destroy(&t);
    /* The shipped example. */
    t = NULL;
    topo_errors_clear(&e);
    if (topo_load_file("topology/examples/cpu-gateway.yaml", &t, &e) != 0)
        fail_msg("%s", e.msg[0]);
    assert_int_equal(topo_count_role(t, ROLE_GATEWAY), 1);
    assert_string_equal(t->endpoints.http, "tcp://127.0.0.1:8000");
    assert_int_equal(t->gateway.n_keys, 2);
    assert_string_equal(t->gateway.keys[1].tenant, "team-b");
    topo_destroy(&t);
    struct {
        const char *yaml, *want;
    } bad[] = {
        {TOPO "  - role: gateway\ngateway:\n  api_keys:\n    - key: short\n", "gateway.api_keys[0].key: too short"},
        {TOPO "  - role: gateway\ngateway:\n  api_keys:\n    - tenant: x\n", "gateway.api_keys[0].key: missing"},
        {TOPO "  - role: gateway\ngateway:\n  api_keys:\n    - key: sk-0123456789\n    - key: sk-0123456789\n",
         "gateway.api_keys[1].key: the same key as gateway.api_keys[0]"},
        {TOPO "  - role: gateway\ngateway:\n  api_keys:\n    - key: sk-0123456789\n      requests_per_minute: -1\n",
         "gateway.api_keys[0].requests_per_minute: -1 is out of range"},
        {TOPO "  - role: gateway\ngateway:\n  max_body_bytes: 10\n", "gateway.max_body_bytes: 10 is out of range"},
        {TOPO "  - role: gateway\nendpoints:\n  http: ipc:///tmp/x\n", "endpoints.http: 'ipc:///tmp/x': the gateway serves HTTP"},
        {TOPO "  - role: gateway\nendpoints:\n  http: tcp://0.0.0.0:8000\n", "needs security.allow_wildcard: true"},
        {TOPO "  - role: gateway\nendpoints:\n  http: tcp://127.0.0.1:5555\n", "endpoints.http: tcp://127.0.0.1:5555 is already bound"},
        {TOPO "  - role: gateway\n    count: 2\n", "at most one gateway instance (found 2)"},
        /* A default retention longer than a pin can carry would lose every pin: refused. */
        {TOPO "cache:\n  default_retention_s: 864000\n", "cache.default_retention_s: 864000 is out of range (0..604800)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t = s_topo(bad[i].yaml, &e);
        if (t || !topo_errors_contain(&e, bad[i].want))
            fail_msg("case %zu: wanted '%s', got '%s'", i, bad[i].want, e.count ? e.msg[0] : "(accepted)");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_ok),   cmocka_unit_test(test_completion_ok), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_cache_contract), cmocka_unit_test(test_replies), cmocka_unit_test(test_keys),
        cmocka_unit_test(test_usage_split),
        cmocka_unit_test(test_limit),     cmocka_unit_test(test_topology), cmocka_unit_test(test_error_utf8),
        cmocka_unit_test(test_top_logprobs_parse), cmocka_unit_test(test_top_logprobs_replies),
        cmocka_unit_test(test_n_choices), cmocka_unit_test(test_chunk_direct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
