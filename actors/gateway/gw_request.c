#include "actors/gateway/gw_request.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/lib/client.h"

void gw_utf8_clean(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        int n = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 ? 4 : 0;
        int ok = n > 0;
        for (int k = 1; ok && k < n; k++)
            ok = (p[k] & 0xc0) == 0x80;
        if (ok && n > 1) {   /* overlong forms, surrogates and code points past U+10FFFF */
            unsigned cp = n == 2 ? (p[0] & 0x1fu) << 6 | (p[1] & 0x3fu)
                        : n == 3 ? (p[0] & 0x0fu) << 12 | (p[1] & 0x3fu) << 6 | (p[2] & 0x3fu)
                                 : (p[0] & 0x07u) << 18 | (p[1] & 0x3fu) << 12 | (p[2] & 0x3fu) << 6 | (p[3] & 0x3fu);
            ok = cp >= (n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u) && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
        }
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

int gw_error_set(gw_error_t *err, int status, const char *code, const char *param, const char *fmt, ...)
{
    err->status = status;
    err->type = status >= 500 ? "server_error" : "invalid_request_error";
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    /* Messages quote the input (a JSON parser's error names the bad bytes) and may be cut short
     * mid-character: always valid UTF-8, so the error itself can be sent. */
    gw_utf8_clean(err->message);
    gw_utf8_clean(err->param);
    return -1;
}

#define BAD(param, ...) gw_error_set(err, 400, NULL, param, __VA_ARGS__)

/* A JSON number in [lo, hi] (absent or null: leaves *out). */
static int s_number(json_t *o, const char *key, double lo, double hi, double *out, gw_error_t *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return BAD(key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return BAD(key, "'%s' is %g: it must be between %g and %g", key, x, lo, hi);
    *out = x;
    return 0;
}

/* A JSON integer in [lo, hi]; 1 when present, 0 when absent or null. */
static int s_integer(json_t *o, const char *key, long long lo, long long hi, long long *out, gw_error_t *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v))
        return BAD(key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return BAD(key, "'%s' is %lld: it must be between %lld and %lld", key, x, lo, hi);
    *out = x;
    return 1;
}

/* A JSON boolean; absent or null leaves *out. */
static int s_bool(json_t *o, const char *key, bool *out, gw_error_t *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return BAD(key, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* A string of 1..max bytes; absent or null: *out untouched. */
static int s_string(json_t *o, const char *key, size_t max, const char **out, gw_error_t *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return BAD(key, "'%s' must be a string", key);
    size_t n = json_string_length(v);
    if (n == 0 || n > max)
        return BAD(key, "'%s' must be 1 to %zu bytes long (it is %zu)", key, max, n);
    *out = json_string_value(v);
    return 0;
}

static const char *const s_roles[] = {"system", "user", "assistant", "tool"};

/* One message's content: a string, null (an assistant turn with tool calls), or an array of
 * {"type": "text", "text": ...} parts, joined. */
static int s_content(gw_request_t *r, uint32_t i, json_t *c, gw_error_t *err)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%u].content", i);
    if (!c || json_is_null(c)) {
        r->messages[i].content = "";
        return 0;
    }
    if (json_is_string(c)) {
        if (json_string_length(c) > MSG_MAX_PROMPT_BYTES)
            return BAD(param, "%s is longer than %u bytes", param, MSG_MAX_PROMPT_BYTES);
        r->messages[i].content = json_string_value(c);
        return 0;
    }
    if (!json_is_array(c))
        return BAD(param, "%s must be a string or an array of text parts", param);
    size_t total = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return BAD(param, "%s[%zu] must be an object with a type", param, k);
        if (strcmp(json_string_value(type), "text") != 0)
            return BAD(param, "%s[%zu]: content parts of type '%s' are not supported (text only)", param, k,
                       json_string_value(type));
        if (!json_is_string(text))
            return BAD(param, "%s[%zu].text must be a string", param, k);
        total += json_string_length(text);
        if (total > MSG_MAX_PROMPT_BYTES)
            return BAD(param, "%s is longer than %u bytes", param, MSG_MAX_PROMPT_BYTES);
    }
    char *s = malloc(total + 1);
    if (!s)
        return gw_error_set(err, 500, NULL, NULL, "out of memory");
    size_t at = 0;
    json_array_foreach(c, k, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = '\0';
    if (strlen(s) != at) {
        free(s);
        return BAD(param, "%s contains a NUL character", param);
    }
    r->joined[i] = s;
    r->messages[i].content = s;
    return 0;
}

static int s_messages(gw_request_t *r, json_t *root, gw_error_t *err)
{
    json_t *ms = json_object_get(root, "messages");
    if (!ms)
        return BAD("messages", "'messages' is required");
    if (!json_is_array(ms))
        return BAD("messages", "'messages' must be an array");
    size_t n = json_array_size(ms);
    if (n == 0 || n > MSG_MAX_CHAT_MESSAGES)
        return BAD("messages", "'messages' must hold 1 to %u messages (it has %zu)", MSG_MAX_CHAT_MESSAGES, n);
    r->messages = calloc(n, sizeof *r->messages);
    r->joined = calloc(n, sizeof *r->joined);
    if (!r->messages || !r->joined)
        return gw_error_set(err, 500, NULL, NULL, "out of memory");
    r->submit.n_messages = (uint32_t)n;
    r->submit.messages = r->messages;
    for (uint32_t i = 0; i < n; i++) {
        json_t *m = json_array_get(ms, i), *role = json_object_get(m, "role");
        char param[64];
        snprintf(param, sizeof param, "messages[%u].role", i);
        if (!json_is_object(m))
            return BAD("messages", "messages[%u] must be an object", i);
        if (!json_is_string(role))
            return BAD(param, "%s must be a string", param);
        const char *rs = json_string_value(role);
        int ri = -1;
        for (int k = 0; k < MSG_CHAT_ROLE_COUNT; k++)
            if (strcmp(rs, s_roles[k]) == 0)
                ri = k;
        if (strcmp(rs, "developer") == 0)   /* OpenAI's newer name for the system turn */
            ri = MSG_CHAT_SYSTEM;
        if (ri < 0)
            return BAD(param, "%s '%s' is not one of system, developer, user, assistant, tool", param, rs);
        r->messages[i].role = (msg_chat_role_t)ri;
        if (s_content(r, i, json_object_get(m, "content"), err) != 0)
            return -1;
    }
    return 0;
}

/* The completions prompt: a string, an array of one string, or an array of token ids. */
static int s_prompt(gw_request_t *r, json_t *root, gw_error_t *err)
{
    json_t *p = json_object_get(root, "prompt");
    if (!p)
        return BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) > MSG_MAX_PROMPT_BYTES)
            return BAD("prompt", "'prompt' is longer than %u bytes", MSG_MAX_PROMPT_BYTES);
        if (json_string_length(p) == 0)
            return BAD("prompt", "'prompt' is empty");
        r->submit.prompt = json_string_value(p);
        return 0;
    }
    if (!json_is_array(p))
        return BAD("prompt", "'prompt' must be a string or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0)
        return BAD("prompt", "'prompt' is empty");
    if (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))
        return BAD("prompt", "one prompt per request: a batch of %zu prompts is not supported", n);
    if (n > MSG_MAX_PROMPT_TOKENS)
        return BAD("prompt", "'prompt' has %zu token ids (at most %u)", n, MSG_MAX_PROMPT_TOKENS);
    r->tokens = malloc(n * sizeof *r->tokens);
    if (!r->tokens)
        return gw_error_set(err, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(p, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > UINT32_MAX)
            return BAD("prompt", "prompt[%zu] is not a token id (a non-negative integer)", i);
        r->tokens[i] = (uint32_t)json_integer_value(t);
    }
    r->submit.tokens = r->tokens;
    r->submit.n_tokens = (uint32_t)n;
    return 0;
}

static int s_stop(gw_request_t *r, json_t *root, gw_error_t *err)
{
    json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s))
        return 0;
    uint32_t n = 0;
    if (json_is_string(s)) {
        r->stop[n++] = json_string_value(s);
    } else if (json_is_array(s)) {
        if (json_array_size(s) > MSG_MAX_STOP)
            return BAD("stop", "'stop' has %zu strings (at most %u)", json_array_size(s), MSG_MAX_STOP);
        size_t i;
        json_t *v;
        json_array_foreach(s, i, v) {
            if (!json_is_string(v))
                return BAD("stop", "stop[%zu] must be a string", i);
            r->stop[n++] = json_string_value(v);
        }
    } else {
        return BAD("stop", "'stop' must be a string or an array of strings");
    }
    for (uint32_t i = 0; i < n; i++) {
        size_t l = strlen(r->stop[i]);
        if (l == 0 || l > MSG_MAX_NAME)
            return BAD("stop", "each stop string must be 1 to %u bytes long", MSG_MAX_NAME);
    }
    r->submit.sampling.stop = r->stop;
    r->submit.sampling.n_stop = n;
    return 0;
}

/* Fields we cannot honour: refused by name rather than ignored. */
static int s_unsupported(gw_request_t *r, json_t *root, gw_error_t *err)
{
    static const char *const never[] = {"tools", "functions", "logit_bias", "suffix"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
        json_t *v = json_object_get(root, never[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0) &&
            !(json_is_object(v) && json_object_size(v) == 0) && !(json_is_string(v) && json_string_length(v) == 0))
            return BAD(never[i], "'%s' is not supported by this server", never[i]);
    }
    json_t *rf = json_object_get(root, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *t = json_object_get(rf, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return BAD("response_format", "'response_format' other than {\"type\": \"text\"} is not supported");
    }
    json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc) && !(json_is_string(tc) && strcmp(json_string_value(tc), "none") == 0))
        return BAD("tool_choice", "'tool_choice' is not supported (tools are not)");
    long long v = 1;
    if (s_integer(root, "n", 1, GW_MAX_N, &v, err) < 0)
        return -1;
    r->n = (uint32_t)v;
    v = 1;
    if (s_integer(root, "best_of", 1, 1000000, &v, err) < 0)
        return -1;
    if (v != 1)
        return BAD("best_of", "'best_of' must be 1");
    bool echo = false;
    if (s_bool(root, "echo", &echo, err) != 0)
        return -1;
    if (echo)
        return BAD("echo", "'echo' is not supported");
    return 0;
}

int64_t gw_choice_seed(int64_t seed, uint32_t i)
{
    return seed < 0 ? seed : (int64_t)(((uint64_t)seed + i) & INT64_MAX);
}

/* logprobs: chat {"logprobs": true, "top_logprobs": 0..20}; completions {"logprobs": 0..5} (the
 * legacy API's bound). The sampled token's logprob, and that many of the most likely tokens at each
 * position (the sampler's top-N, carried by the token messages). */
static int s_logprobs(gw_request_t *r, json_t *root, gw_error_t *err)
{
    long long top = 0;
    if (r->kind == GW_CHAT) {
        if (s_bool(root, "logprobs", &r->logprobs, err) != 0)
            return -1;
        if (s_integer(root, "top_logprobs", 0, MSG_MAX_LOGPROBS, &top, err) < 0)
            return -1;
        if (top > 0 && !r->logprobs)
            return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        int has = s_integer(root, "logprobs", 0, 5, &top, err);
        if (has < 0)
            return -1;
        r->logprobs = has == 1;
    }
    r->top_logprobs = (uint32_t)top;
    r->submit.sampling.logprobs = r->logprobs;
    r->submit.sampling.top_logprobs = r->top_logprobs;
    /* vLLM's extension, for benchmarks of a fixed output length. */
    bool ignore_eos = false;
    if (s_bool(root, "ignore_eos", &ignore_eos, err) != 0)
        return -1;
    r->submit.sampling.ignore_eos = ignore_eos;
    return 0;
}

/* prompt_cache_key, prompt_cache_retention, prompt_cache_options.ttl -> key and pin length. */
static int s_cache(gw_request_t *r, json_t *root, const gw_parse_opts_t *o, gw_error_t *err)
{
    if (s_string(root, "prompt_cache_key", MSG_MAX_NAME - 1, &r->submit.prompt_cache_key, err) != 0)
        return -1;
    const char *ret = NULL;
    if (s_string(root, "prompt_cache_retention", 64, &ret, err) != 0)
        return -1;
    json_t *opts = json_object_get(root, "prompt_cache_options");
    const char *ttl = NULL;
    if (opts && !json_is_null(opts)) {
        if (!json_is_object(opts))
            return BAD("prompt_cache_options", "'prompt_cache_options' must be an object");
        json_t *t = json_object_get(opts, "ttl");
        if (!json_is_string(t))
            return BAD("prompt_cache_options.ttl", "'prompt_cache_options.ttl' must be a string such as \"5m\" or \"1h\"");
        ttl = json_string_value(t);
    }
    if (!ret && !ttl)
        return 0;
    if (ret && ttl)
        return BAD("prompt_cache_options", "give either 'prompt_cache_retention' or 'prompt_cache_options', not both");
    const char *param = ret ? "prompt_cache_retention" : "prompt_cache_options.ttl";
    int64_t s;
    if (ret) {
        if (strcmp(ret, "in_memory") == 0)
            s = o->default_retention_s;
        else if (strcmp(ret, "24h") == 0)
            s = 86400;
        else
            return BAD(param, "'prompt_cache_retention' must be \"in_memory\" or \"24h\" (got \"%s\")", ret);
    } else {
        s = client_parse_duration_s(ttl);
        if (s <= 0)
            return BAD(param, "'prompt_cache_options.ttl' \"%s\" is not a duration such as \"5m\" or \"1h\"", ttl);
    }
    if (!r->submit.prompt_cache_key)
        return BAD("prompt_cache_key", "a retention needs a 'prompt_cache_key' to pin the prefix under");
    if (!o->can_retain)
        return BAD(param, "this cluster keeps no pinned prefixes (no cache-manager host store): retention "
                   "cannot be honoured");
    if (s > o->max_retention_s)
        return BAD(param, "a retention of %lld s is longer than this cluster keeps a pin (%u s)", (long long)s,
                   o->max_retention_s);
    r->submit.cache_retention_s = (uint32_t)s;
    return 0;
}

static int s_sampling(gw_request_t *r, json_t *root, gw_error_t *err)
{
    msg_sampling_t *sp = &r->submit.sampling;
    double x = sp->temperature;
    if (s_number(root, "temperature", 0, 2, &x, err) != 0)
        return -1;
    sp->temperature = (float)x;
    x = sp->top_p;
    if (s_number(root, "top_p", 0, 1, &x, err) != 0)
        return -1;
    if (x <= 0)
        return BAD("top_p", "'top_p' must be greater than 0");
    sp->top_p = (float)x;
    x = 0;
    if (s_number(root, "presence_penalty", -2, 2, &x, err) != 0)
        return -1;
    sp->presence_penalty = (float)x;
    x = 0;
    if (s_number(root, "frequency_penalty", -2, 2, &x, err) != 0)
        return -1;
    sp->frequency_penalty = (float)x;
    long long v;
    if (s_integer(root, "seed", INT64_MIN, INT64_MAX, &v, err) < 0)
        return -1;
    if (json_is_integer(json_object_get(root, "seed")))
        sp->seed = json_integer_value(json_object_get(root, "seed")) & INT64_MAX;  /* >= 0: fixed */
    /* max_completion_tokens is the chat API's newer name; either may be given, not both different. */
    long long mt = 0, mct = 0;
    int h1 = s_integer(root, "max_tokens", 1, MSG_MAX_NEW_TOKENS, &mt, err);
    if (h1 < 0)
        return -1;
    int h2 = r->kind == GW_CHAT ? s_integer(root, "max_completion_tokens", 1, MSG_MAX_NEW_TOKENS, &mct, err) : 0;
    if (h2 < 0)
        return -1;
    if (h1 && h2 && mt != mct)
        return BAD("max_completion_tokens", "'max_tokens' (%lld) and 'max_completion_tokens' (%lld) disagree", mt, mct);
    if (h1 || h2)
        sp->max_tokens = (uint32_t)(h2 ? mct : mt);
    return s_stop(r, root, err);
}

int gw_request_parse(gw_kind_t kind, const char *body, size_t len, const gw_parse_opts_t *opts,
                     gw_request_t *out, gw_error_t *err)
{
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    out->n = 1;
    msg_t init;
    msg_init(&init, MSG_SUBMIT, 0);
    out->submit = init.u.submit;
    json_error_t je;
    out->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!out->root) {
        BAD(NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        goto fail;
    }
    if (!json_is_object(out->root)) {
        BAD(NULL, "the body must be a JSON object");
        goto fail;
    }
    json_t *root = out->root;
    json_t *model = json_object_get(root, "model");
    if (!model) {
        BAD("model", "'model' is required");
        goto fail;
    }
    if (!json_is_string(model)) {
        BAD("model", "'model' must be a string");
        goto fail;
    }
    if (strcmp(json_string_value(model), opts->model) != 0) {
        gw_error_set(err, 404, "model_not_found", "model", "The model '%.200s' does not exist; this server "
                     "serves '%.200s'", json_string_value(model), opts->model);
        goto fail;
    }
    out->submit.model = json_string_value(model);
    if ((kind == GW_CHAT ? s_messages(out, root, err) : s_prompt(out, root, err)) != 0 ||
        s_unsupported(out, root, err) != 0 || s_sampling(out, root, err) != 0 ||
        s_logprobs(out, root, err) != 0 || s_cache(out, root, opts, err) != 0 ||
        s_bool(root, "stream", &out->stream, err) != 0)
        goto fail;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            BAD("stream_options", "'stream_options' must be an object");
            goto fail;
        }
        if (!out->stream) {
            BAD("stream_options", "'stream_options' is only allowed with 'stream': true");
            goto fail;
        }
        if (s_bool(so, "include_usage", &out->include_usage, err) != 0) {
            snprintf(err->param, sizeof err->param, "stream_options.include_usage");
            goto fail;
        }
    }
    out->submit.stream = true;   /* the gateway always streams from the router (it relays or collects) */
    return 0;
fail:
    gw_request_free(out);
    return -1;
}

void gw_request_free(gw_request_t *r)
{
    if (r->joined)
        for (uint32_t i = 0; i < r->submit.n_messages; i++)
            free(r->joined[i]);
    free(r->joined);
    free(r->messages);
    free(r->tokens);
    if (r->root)
        json_decref(r->root);
    memset(r, 0, sizeof *r);
}
