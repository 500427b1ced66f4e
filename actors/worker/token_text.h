/* actors/worker/token_text.h — the text a decode worker streams with each sampled token.
 *
 * A token is accepted by its request's sampler (stop ids, max tokens); with a tokenizer, its bytes
 * go through the request's streaming detokenizer (whole UTF-8 characters only) and then through
 * the sampler's stop-string matcher, which holds back text that may still become a stop string
 * and ends the request when one matches. On the last token everything held back is flushed (but
 * the stop string itself). */
#ifndef TROUPE_ACTORS_WORKER_TOKEN_TEXT_H
#define TROUPE_ACTORS_WORKER_TOKEN_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "engine/tokenizer.h"

typedef struct token_text {
    char *buf;                   /* [cap] the text of the last token (or run of tokens), NUL-terminated */
    size_t cap, len;
} token_text_t;

/* A buffer of cap bytes (at least 2). -1 when out of memory. */
int token_text_init(token_text_t *tt, size_t cap);
void token_text_free(token_text_t *tt);

/* Accepts token t: its finish reason, and its text in tt (len 0: none; ts NULL: no tokenizer),
 * after the text already there with append (a run of tokens streamed as one message), else alone. */
finish_reason_t token_text_accept(token_text_t *tt, sampler_t *smp, tok_stream_t *ts, int32_t t, int append);

#endif
