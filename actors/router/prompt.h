/* actors/router/prompt.h — a submit's prompt as token ids: token ids checked against the
 * vocabulary, a text prompt bounded in bytes (before any tokenizing: what one request can cost a
 * tokenizer thread is bounded) and encoded, or chat messages rendered with the model's template
 * and encoded. The router calls it inline for token ids and on its tokenizer threads for text and
 * chat (tokpool.h): it writes nothing shared, so it may run on several threads at once. */
#ifndef TROUPE_ROUTER_PROMPT_H
#define TROUPE_ROUTER_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "messages/msg.h"

typedef struct prompt_model {
    const tokenizer_t *tok;      /* NULL: token-id prompts only */
    chat_family_t chat;          /* CHAT_NONE: no chat messages */
    int vocab_size;
    int max_model_len;           /* bounds a text prompt's bytes */
} prompt_model_t;

/* The submit's prompt as token ids (malloc'd into *ids, *n of them). -1 with the reason in err
 * and the submit's field it is about in *field. */
int prompt_ids(const prompt_model_t *pm, const msg_submit_t *s, int32_t **ids, size_t *n, char *err, size_t errlen,
               const char **field);

#endif
