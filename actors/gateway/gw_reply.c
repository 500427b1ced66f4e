#include "actors/gateway/gw_reply.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The UTF-8 sequence at p[0..n): its length, and *ok whether it is a whole valid character; when
 * not, the length of its maximal subpart (the lead byte and the continuation bytes that could still
 * follow it), which becomes one U+FFFD, as Rust's from_utf8_lossy and Python's "replace" do. */
static size_t s_utf8_step(const uint8_t *p, size_t n, int *ok)
{
    const uint8_t b = p[0];
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xbf;                  /* the second byte's range */
    if (b < 0x80) {
        *ok = 1;
        return 1;
    } else if (b >= 0xc2 && b <= 0xdf) {
        need = 1;
    } else if (b >= 0xe0 && b <= 0xef) {
        need = 2;
        lo = b == 0xe0 ? 0xa0 : 0x80;              /* no overlong forms */
        hi = b == 0xed ? 0x9f : 0xbf;              /* no surrogates */
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 3;
        lo = b == 0xf0 ? 0x90 : 0x80;
        hi = b == 0xf4 ? 0x8f : 0xbf;              /* nothing past U+10FFFF */
    }
    size_t k = 1;
    for (; k <= need && k < n; k++)
        if (p[k] < (k == 1 ? lo : 0x80) || p[k] > (k == 1 ? hi : 0xbf))
            break;
    *ok = need > 0 && k == need + 1;
    return k;
}

/* An entry's text (gw_logprob_t's rule); NULL when out of memory. */
static json_t *s_tok_text(const gw_logprob_t *e)
{
    if (e->token)
        return s_str(e->token);
    if (!e->bytes) {
        char b[32];
        snprintf(b, sizeof b, "token_id:%u", e->id);
        return json_string(b);
    }
    char *t = malloc((size_t)e->n_bytes * 3 + 1), *o = t;   /* U+FFFD is 3 bytes for at least 1 */
    if (!t)
        return NULL;
    for (size_t i = 0, k; i < e->n_bytes; i += k) {
        int ok;
        k = s_utf8_step(e->bytes + i, e->n_bytes - i, &ok);
        memcpy(o, ok ? (const char *)e->bytes + i : "\xef\xbf\xbd", ok ? k : 3);
        o += ok ? k : 3;
    }
    json_t *v = json_stringn(t, (size_t)(o - t));
    free(t);
    return v;
}

/* OpenAI's `bytes`: the token's bytes as integers, null when unknown. */
static json_t *s_tok_bytes(const gw_logprob_t *e)
{
    const uint8_t *p = e->token ? (const uint8_t *)e->token : e->bytes;
    const size_t n = e->token ? strlen(e->token) : e->n_bytes;
    if (!p)
        return json_null();
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer(p[i]));
    return a;
}

static json_t *s_tok_entry(const gw_logprob_t *e)
{
    return json_pack("{s:o,s:f,s:o}", "token", s_tok_text(e), "logprob", (double)e->logprob, "bytes", s_tok_bytes(e));
}

/* Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}; completions:
 * parallel arrays, top_logprobs a {text: logprob} map per position (null without alternatives). */
static json_t *s_logprobs(gw_kind_t kind, const gw_logprob_t *lp, uint32_t n)
{
    if (!lp)
        return json_null();
    if (kind == GW_CHAT) {
        json_t *content = json_array();
        for (uint32_t i = 0; i < n; i++) {
            json_t *e = s_tok_entry(&lp[i]), *top = json_array();
            for (uint32_t k = 0; k < lp[i].n_top; k++)
                json_array_append_new(top, s_tok_entry(&lp[i].top[k]));
            if (e)
                json_object_set_new(e, "top_logprobs", top);
            else
                json_decref(top);
            json_array_append_new(content, e);
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *values = json_array(), *offsets = json_array(), *tops = json_array();
    size_t at = 0;
    int any_top = 0;
    for (uint32_t i = 0; i < n; i++) {
        json_t *text = s_tok_text(&lp[i]);
        json_array_append_new(offsets, json_integer((json_int_t)at));
        at += text ? json_string_length(text) : 0;
        json_array_append_new(tokens, text);
        json_array_append_new(values, json_real(lp[i].logprob));
        json_t *map = json_object();
        for (uint32_t k = 0; k < lp[i].n_top; k++) {
            json_t *t = s_tok_text(&lp[i].top[k]);
            if (t && map && !json_object_getn(map, json_string_value(t), json_string_length(t)))
                json_object_setn_new(map, json_string_value(t), json_string_length(t), json_real(lp[i].top[k].logprob));
            json_decref(t);
        }
        any_top |= lp[i].n_top > 0;
        json_array_append_new(tops, map);
    }
    if (!any_top) {
        json_decref(tops);
        tops = json_null();
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", values, "top_logprobs", tops,
                     "text_offset", offsets);
}

static json_t *s_head(const gw_reply_ctx_t *c, const char *object)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:n}", "id", c->id, "object", object, "created", (json_int_t)c->created,
                     "model", c->model, "system_fingerprint");
}

char *gw_completion_n_json(const gw_reply_ctx_t *c, const gw_choice_out_t *ch, uint32_t n, const gw_usage_t *u)
{
    json_t *o = s_head(c, c->kind == GW_CHAT ? "chat.completion" : "text_completion"), *choices = json_array();
    for (uint32_t i = 0; o && choices && i < n; i++) {
        json_t *choice = c->kind == GW_CHAT
            ? json_pack("{s:i,s:{s:s,s:o,s:n},s:o,s:s}", "index", (int)i, "message", "role", "assistant", "content",
                        s_str(ch[i].text), "refusal", "logprobs", s_logprobs(c->kind, ch[i].lp, ch[i].n_lp),
                        "finish_reason", ch[i].finish)
            : json_pack("{s:i,s:o,s:o,s:s}", "index", (int)i, "text", s_str(ch[i].text), "logprobs",
                        s_logprobs(c->kind, ch[i].lp, ch[i].n_lp), "finish_reason", ch[i].finish);
        if (!choice || json_array_append_new(choices, choice) != 0) {
            json_decref(choices);
            choices = NULL;
        }
    }
    if (!o || !choices) {
        json_decref(o);
        json_decref(choices);
        return NULL;
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", s_usage(u));
    return s_dump(o);
}

char *gw_completion_json(const gw_reply_ctx_t *c, const char *text, const char *finish, const gw_usage_t *u,
                         const gw_logprob_t *lp, uint32_t n_lp)
{
    const gw_choice_out_t one = {.text = text, .finish = finish, .lp = lp, .n_lp = n_lp};
    return gw_completion_n_json(c, &one, 1, u);
}

char *gw_chunk_json_tree(const gw_reply_ctx_t *c, const char *text, const char *finish, int first, int with_usage,
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
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", (int)c->index, "delta", delta, "logprobs",
                           s_logprobs(c->kind, lp, n_lp), "finish_reason", finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", (int)c->index, "text", s_str(text), "logprobs",
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

/* ---- stream chunks without logprobs, written directly ------------------------------------------- */

/* A growing text for s_direct (never past its cap: *ok turns 0 instead). */
typedef struct {
    char *p;
    size_t n, cap;
    int ok;
} s_out_t;

static void s_put(s_out_t *o, const char *s, size_t n)
{
    if (!o->ok || o->n + n >= o->cap) {
        o->ok = 0;
        return;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void s_puts(s_out_t *o, const char *s) { s_put(o, s, strlen(s)); }

/* s as a JSON string the way json_dumps(JSON_ENSURE_ASCII) writes it (\" \\ \b \f \n \r \t,
 * other controls and every non-ASCII character as \uXXXX, upper-case hex, UTF-16 pairs past the
 * BMP); -1 (nothing written) when s is not valid UTF-8, which jansson would refuse. */
static int s_put_str(s_out_t *o, const char *s)
{
    const uint8_t *p = (const uint8_t *)s;
    const size_t n = strlen(s), at = o->n;
    s_put(o, "\"", 1);
    for (size_t i = 0, k; i < n; i += k) {
        int ok;
        k = s_utf8_step(p + i, n - i, &ok);
        if (!ok) {
            o->n = at;
            return -1;
        }
        const uint8_t b = p[i];
        if (k == 1 && b >= 0x20 && b != '"' && b != '\\') {
            size_t run = 1;   /* a run of plain ASCII in one copy */
            while (i + run < n && p[i + run] >= 0x20 && p[i + run] < 0x80 && p[i + run] != '"' && p[i + run] != '\\')
                run++;
            s_put(o, s + i, run);
            k = run;
            continue;
        }
        char seq[16];
        const char *esc = b == '"' ? "\\\"" : b == '\\' ? "\\\\" : b == '\b' ? "\\b" : b == '\f' ? "\\f"
                        : b == '\n' ? "\\n" : b == '\r' ? "\\r" : b == '\t' ? "\\t" : NULL;
        if (!esc) {
            uint32_t cp = k == 1 ? b
                        : k == 2 ? (uint32_t)(b & 0x1f) << 6 | (p[i + 1] & 0x3f)
                        : k == 3 ? (uint32_t)(b & 0x0f) << 12 | (uint32_t)(p[i + 1] & 0x3f) << 6 | (p[i + 2] & 0x3f)
                                 : (uint32_t)(b & 0x07) << 18 | (uint32_t)(p[i + 1] & 0x3f) << 12 |
                                       (uint32_t)(p[i + 2] & 0x3f) << 6 | (p[i + 3] & 0x3f);
            if (cp < 0x10000) {
                snprintf(seq, sizeof seq, "\\u%04X", (unsigned)cp);
            } else {
                cp -= 0x10000;
                snprintf(seq, sizeof seq, "\\u%04X\\u%04X", (unsigned)(0xD800 | (cp >> 10)), (unsigned)(0xDC00 | (cp & 0x3ff)));
            }
            esc = seq;
        }
        s_puts(o, esc);
    }
    s_put(o, "\"", 1);
    return 0;
}

/* gw_chunk_json without logprobs, byte for byte what the jansson tree dumps (keys in insertion
 * order, compact), written straight into one buffer: a stream relays one such chunk per token
 * message, tens of thousands a second at high concurrency, on the actor thread that every
 * stream's tokens pass through; the tree cost a dozen allocations and a dump each. NULL when the
 * id or model are no valid UTF-8 (the tree builder then decides) or out of memory. */
static char *s_chunk_direct(const gw_reply_ctx_t *c, const char *text, const char *finish, int first, int with_usage)
{
    const size_t tl = text ? strlen(text) : 0;
    s_out_t o = {.cap = 12 * tl + strlen(c->id) * 12 + strlen(c->model) * 12 + 256, .ok = 1};
    if (!(o.p = malloc(o.cap)))
        return NULL;
    char num[64];
    s_puts(&o, "{\"id\":");
    if (s_put_str(&o, c->id) != 0)
        goto bad;
    const int chat = c->kind == GW_CHAT;
    snprintf(num, sizeof num, ",\"object\":\"%s\",\"created\":%lld,\"model\":",
             chat ? "chat.completion.chunk" : "text_completion", (long long)c->created);
    s_puts(&o, num);
    if (s_put_str(&o, c->model) != 0)
        goto bad;
    snprintf(num, sizeof num, ",\"system_fingerprint\":null,\"choices\":[{\"index\":%d,", (int)c->index);
    s_puts(&o, num);
    const int with_text = chat ? !finish || (text && *text) : 1;
    if (chat) {
        s_puts(&o, "\"delta\":{");
        if (first)
            s_puts(&o, with_text ? "\"role\":\"assistant\"," : "\"role\":\"assistant\"");
        if (with_text)
            s_puts(&o, "\"content\":");
    } else {
        s_puts(&o, "\"text\":");
    }
    if (with_text && s_put_str(&o, text ? text : "") != 0)
        s_puts(&o, "\"\\uFFFD\"");   /* as s_str: text that is no valid UTF-8 becomes one U+FFFD */
    if (chat)
        s_puts(&o, "}");
    s_puts(&o, ",\"logprobs\":null,\"finish_reason\":");
    if (finish) {
        if (s_put_str(&o, finish) != 0)
            goto bad;
    } else {
        s_puts(&o, "null");
    }
    s_puts(&o, with_usage ? "}],\"usage\":null}" : "}]}");
    if (!o.ok)
        goto bad;
    o.p[o.n] = '\0';
    return o.p;
bad:
    free(o.p);
    return NULL;
}

char *gw_chunk_json(const gw_reply_ctx_t *c, const char *text, const char *finish, int first, int with_usage,
                    const gw_logprob_t *lp, uint32_t n_lp)
{
    char *s = lp ? NULL : s_chunk_direct(c, text, finish, first, with_usage);
    return s ? s : gw_chunk_json_tree(c, text, finish, first, with_usage, lp, n_lp);
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
