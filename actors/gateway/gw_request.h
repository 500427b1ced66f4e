/* actors/gateway/gw_request.h — an OpenAI request body, parsed and checked into a submit.
 *
 * POST /v1/chat/completions and /v1/completions bodies (JSON) become one gw_request_t holding a
 * ready msg_submit_t for the router's client protocol. Every bad input gets an OpenAI-shaped
 * error (gw_error_t: HTTP status, type, code, param, message) naming the field: malformed JSON,
 * a wrong type, a value out of range, an unknown model, a feature the cluster does not have.
 * Unknown fields are ignored, as OpenAI's own API does, except those whose meaning we cannot
 * honour (tools, response_format other than text, logit_bias, n above GW_MAX_N, echo, suffix,
 * best_of > 1): those are refused rather than silently dropped.
 *
 * The cache contract: prompt_cache_key (<= 255 bytes) names the prefix; prompt_cache_retention
 * "in_memory" (the cluster's default pin, cache.default_retention_s) or "24h", or
 * prompt_cache_options {"ttl": "5m" | "1h" | any duration "90s", "30m", "2d"} set the pin's
 * length. A retention the cluster cannot honour (no cache-manager, or longer than the longest pin
 * it keeps) is a 400, never dropped. Pure: no I/O, no globals (unit-tested and fuzzed). */
#ifndef TROUPE_GW_REQUEST_H
#define TROUPE_GW_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "messages/msg.h"

typedef enum { GW_CHAT, GW_COMPLETION } gw_kind_t;

/* Choices one request may ask for (`n`): each is a request of its own at the router, so this bounds
 * the fan-out (admission slots, KV) one HTTP request can take. */
#define GW_MAX_N 16

typedef struct gw_error {
    int status;                  /* HTTP status: 400, 401, 404, 413, 429, 503, ... */
    const char *type;            /* "invalid_request_error", "server_error", "requests", ... */
    const char *code;            /* "model_not_found", "context_length_exceeded", NULL */
    char param[64];              /* the offending field ("messages[2].content"), "" = none */
    char message[512];
} gw_error_t;

/* What the cluster offers, for the checks that depend on it. */
typedef struct gw_parse_opts {
    const char *model;           /* the one model id served */
    int can_retain;              /* a cache-manager with a host store exists: pins are kept */
    uint32_t max_retention_s;    /* the longest pin it keeps */
    uint32_t default_retention_s;/* "in_memory": the topology's cache.default_retention_s */
} gw_parse_opts_t;

typedef struct gw_request {
    gw_kind_t kind;
    json_t *root;                /* the parsed body: owns every string the submit points at */
    msg_submit_t submit;         /* ready for msg_encode (prompt / messages / tokens, sampling, cache) */
    msg_chat_t *messages;        /* [n_messages] (submit.messages points here) */
    char **joined;               /* [n_messages] content assembled from parts (or NULL) */
    uint32_t *tokens;            /* a token-id prompt (submit.tokens points here) */
    const char *stop[MSG_MAX_STOP];
    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    bool logprobs;               /* chat: logprobs true; completions: logprobs given (0..5) */
    uint32_t top_logprobs;       /* alternatives per token: chat top_logprobs 0..20, completions logprobs */
    uint32_t n;                  /* choices, 1..GW_MAX_N: the gateway submits n requests (gw_choice_seed) */
} gw_request_t;

/* Parses body[0..len) for kind. 0 with *out filled (gw_request_free it), or -1 with *err set
 * and *out owning nothing. */
int gw_request_parse(gw_kind_t kind, const char *body, size_t len, const gw_parse_opts_t *opts,
                     gw_request_t *out, gw_error_t *err);
void gw_request_free(gw_request_t *r);

/* The sampling seed of choice i of n: a fixed seed gives seed + i (wrapping within int64's
 * non-negative range), so the choices differ and a repeated request gets them again; a random
 * one (-1) stays random, drawn per request by the router. */
int64_t gw_choice_seed(int64_t seed, uint32_t i);

/* Replaces every byte that does not start a valid UTF-8 sequence with '?', in place. */
void gw_utf8_clean(char *s);

/* Fills err (type invalid_request_error unless status >= 500) and returns -1. */
int gw_error_set(gw_error_t *err, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
