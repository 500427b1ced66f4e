/* actors/gateway/gw_reply.h — OpenAI response bodies: completions, stream chunks, usage, errors.
 *
 * Each builder returns a malloc'd NUL-terminated JSON text (compact, one line, so it can be a
 * Server-Sent Events `data:` line as it is), or NULL when out of memory. Shapes follow OpenAI's
 * API: "chat.completion" / "chat.completion.chunk" / "text_completion", `usage` with
 * prompt_tokens_details.cached_tokens, errors as {"error": {"message", "type", "param", "code"}}. */
#ifndef TROUPE_GW_REPLY_H
#define TROUPE_GW_REPLY_H

#include <stdint.h>

#include "actors/gateway/gw_request.h"

/* Who the reply is for: the object fields every body repeats. */
typedef struct gw_reply_ctx {
    gw_kind_t kind;
    const char *id;              /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;             /* unix seconds */
    const char *model;
    uint32_t index;              /* a stream chunk's choice (n > 1: each chunk carries one choice) */
} gw_reply_ctx_t;

/* One token of a `logprobs` listing: the sampled one, with its position's most likely tokens in
 * top (each an entry whose own top is empty), or one of those. Its text is token when set, else
 * its bytes as UTF-8 (bytes that are no whole character, as a token holding part of one has, show
 * as U+FFFD, as a lossy decode writes them; `bytes` keeps the truth), else "token_id:<id>" (a model
 * without a tokenizer). */
typedef struct gw_logprob {
    const char *token;           /* its text; NULL: from bytes */
    float logprob;
    const uint8_t *bytes;        /* [n_bytes] what the token decodes to; NULL: token's own, or unknown */
    uint32_t n_bytes;
    uint32_t id;
    const struct gw_logprob *top;/* [n_top] the most likely tokens at its position, most likely first */
    uint32_t n_top;
} gw_logprob_t;

/* cached_tokens by source (msg_usage_t): prompt_tokens_details carries them next to cached_tokens
 * when they add up to it (all 0 with cached_tokens > 0: the cluster did not say, and they are left
 * out). */
typedef struct gw_usage {
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    uint32_t cached_device_tokens, cached_host_tokens, cached_disk_tokens;
} gw_usage_t;

char *gw_error_json(const gw_error_t *e);
char *gw_models_json(const char *model, int64_t created);
char *gw_model_json(const char *model, int64_t created);
/* The whole non-streamed reply. finish: "stop" / "length". lp may be NULL (no logprobs asked);
 * chat lists each entry's top as its top_logprobs, completions as a {text: logprob} map per
 * position (tokens of the same text keep the likelier), or null when no entry has any. */
char *gw_completion_json(const gw_reply_ctx_t *c, const char *text, const char *finish, const gw_usage_t *u,
                         const gw_logprob_t *lp, uint32_t n_lp);
/* One choice of a non-streamed reply with n of them. */
typedef struct gw_choice_out {
    const char *text;
    const char *finish;          /* "stop" / "length" */
    const gw_logprob_t *lp;      /* NULL: no logprobs asked */
    uint32_t n_lp;
} gw_choice_out_t;

/* The whole non-streamed reply of n choices (index 0..n-1, in order), with their usage summed. */
char *gw_completion_n_json(const gw_reply_ctx_t *c, const gw_choice_out_t *ch, uint32_t n, const gw_usage_t *u);
/* One stream chunk (for choice c->index): text (may be ""), finish NULL until the last, first: chat's role delta.
 * with_usage: the chunk carries "usage": null (stream_options.include_usage asked for it). */
char *gw_chunk_json(const gw_reply_ctx_t *c, const char *text, const char *finish, int first, int with_usage,
                    const gw_logprob_t *lp, uint32_t n_lp);
/* The same chunk built as a jansson tree and dumped: what gw_chunk_json does for a chunk with
 * logprobs, and the reference its direct writer (a chunk without them) is held to by the unit test. */
char *gw_chunk_json_tree(const gw_reply_ctx_t *c, const char *text, const char *finish, int first, int with_usage,
                         const gw_logprob_t *lp, uint32_t n_lp);
/* The stream's last chunk when include_usage: no choices, the usage. */
char *gw_usage_chunk_json(const gw_reply_ctx_t *c, const gw_usage_t *u);

#endif
