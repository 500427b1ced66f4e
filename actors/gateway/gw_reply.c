#include "actors/gateway/gw_reply.h"

#include <jansson.h>
#include <string.h>

/* Dumps and releases o. */
static char *s_dump(json_t *o)
{
    if (!o)
        return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    return s;
}

/* A string value that never fails on bad UTF-8 (token text is whole UTF-8 from the router, but
 * a stray byte must not lose the reply): invalid input becomes U+FFFD. */
static json_t *s_str(const char *s)
{
    json_t *v = json_string(s ? s : "");
    return v ? v : json_string("\xef\xbf\xbd");
}

char *gw_error_json(const gw_error_t *e)
{
    return s_dump(json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type",
                            e->type ? e->type : "invalid_request_error", "param",
                            e->param[0] ? json_string(e->param) : json_null(), "code",
                            e->code ? json_string(e->code) : json_null()));
}

static json_t *s_model(const char *model, int64_t created)
{
    return json_pack("{s:s,s:s,s:I,s:s}", "id", model, "object", "model", "created", (json_int_t)created,
                     "owned_by", "troupe");
}

char *gw_models_json(const char *model, int64_t created)
{
    return s_dump(json_pack("{s:s,s:[o]}", "object", "list", "data", s_model(model, created)));
}

char *gw_model_json(const char *model, int64_t created) { return s_dump(s_model(model, created)); }

/* OpenAI's usage; prompt_tokens_details.cached_tokens stays OpenAI's total, and Troupe adds where
 * those tokens came from (docs/gateway.md). */
static json_t *s_usage(const gw_usage_t *u)
{
    json_t *details = json_pack("{s:i}", "cached_tokens", (int)u->cached_tokens);
    const uint64_t split = (uint64_t)u->cached_device_tokens + u->cached_host_tokens + u->cached_disk_tokens;
    if (details && split == u->cached_tokens)
        json_object_update_new(details, json_pack("{s:i,s:i,s:i}", "cached_device_tokens", (int)u->cached_device_tokens,
                                                  "cached_host_tokens", (int)u->cached_host_tokens,
                                                  "cached_disk_tokens", (int)u->cached_disk_tokens));
    return json_pack("{s:i,s:i,s:i,s:o}", "prompt_tokens", (int)u->prompt_tokens, "completion_tokens",
                     (int)u->completion_tokens, "total_tokens", (int)(u->prompt_tokens + u->completion_tokens),
                     "prompt_tokens_details", details);
}

/* Chat: {"content": [{token, logprob, bytes, top_logprobs: []}]}; completions: parallel arrays. */
static json_t *s_logprobs(gw_kind_t kind, const gw_logprob_t *lp, uint32_t n)
{
    if (!lp)
        return json_null();
    if (kind == GW_CHAT) {
        json_t *content = json_array();
        for (uint32_t i = 0; i < n; i++) {
            json_t *bytes = json_array();
            for (const unsigned char *p = (const unsigned char *)lp[i].token; p && *p; p++)
                json_array_append_new(bytes, json_integer(*p));
            json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:[]}", "token", s_str(lp[i].token), "logprob",
                                                     (double)lp[i].logprob, "bytes", bytes, "top_logprobs"));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *values = json_array(), *offsets = json_array();
    size_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        json_array_append_new(tokens, s_str(lp[i].token));
        json_array_append_new(values, json_real(lp[i].logprob));
        json_array_append_new(offsets, json_integer((json_int_t)at));
        at += lp[i].token ? strlen(lp[i].token) : 0;
    }
    return json_pack("{s:o,s:o,s:n,s:o}", "tokens", tokens, "token_logprobs", values, "top_logprobs", "text_offset",
                     offsets);
}

static json_t *s_head(const gw_reply_ctx_t *c, const char *object)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:n}", "id", c->id, "object", object, "created", (json_int_t)c->created,
                     "model", c->model, "system_fingerprint");
}

char *gw_completion_json(const gw_reply_ctx_t *c, const char *text, const char *finish, const gw_usage_t *u,
                         const gw_logprob_t *lp, uint32_t n_lp)
{
    json_t *o = s_head(c, c->kind == GW_CHAT ? "chat.completion" : "text_completion");
    json_t *choice = c->kind == GW_CHAT
        ? json_pack("{s:i,s:{s:s,s:o,s:n},s:o,s:s}", "index", 0, "message", "role", "assistant", "content",
                    s_str(text), "refusal", "logprobs", s_logprobs(c->kind, lp, n_lp), "finish_reason", finish)
        : json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "text", s_str(text), "logprobs",
                    s_logprobs(c->kind, lp, n_lp), "finish_reason", finish);
    if (!o || !choice) {
        json_decref(o);
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", s_usage(u));
    return s_dump(o);
}

char *gw_chunk_json(const gw_reply_ctx_t *c, const char *text, const char *finish, int first, int with_usage,
                    const gw_logprob_t *lp, uint32_t n_lp)
{
    json_t *o = s_head(c, c->kind == GW_CHAT ? "chat.completion.chunk" : "text_completion");
    json_t *choice;
    if (c->kind == GW_CHAT) {
        json_t *delta = json_object();
        if (first)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (!finish || (text && *text))
            json_object_set_new(delta, "content", s_str(text));
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs",
                           s_logprobs(c->kind, lp, n_lp), "finish_reason", finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "text", s_str(text), "logprobs",
                           s_logprobs(c->kind, lp, n_lp), "finish_reason", finish ? json_string(finish) : json_null());
    }
    if (!o || !choice) {
        json_decref(o);
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (with_usage)
        json_object_set_new(o, "usage", json_null());
    return s_dump(o);
}

char *gw_usage_chunk_json(const gw_reply_ctx_t *c, const gw_usage_t *u)
{
    json_t *o = s_head(c, c->kind == GW_CHAT ? "chat.completion.chunk" : "text_completion");
    if (!o)
        return NULL;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", s_usage(u));
    return s_dump(o);
}
