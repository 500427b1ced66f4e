/* actors/router/collected.h — the completion of a request that does not stream (submit.stream
 * false): the router keeps its token messages instead of relaying them, and its one reply, the
 * done, carries them whole (done.tokens, done.text, done.logprobs; messages/msg.h).
 *
 * What is collected is what the client would have been sent: the router adds a token message
 * after its migration checks (relayed_resume) have dropped the repeats. The arrays grow by doubling
 * (a request's length is known only at its end; one that streams allocates nothing here). Past
 * MSG_MAX_NEW_TOKENS tokens or MSG_MAX_COMPLETION_TEXT bytes of text (which keep the done inside
 * one frame), or out of memory, collecting fails and the router fails the request: a done without
 * its completion would read as an empty answer. Known limit: alternatives (top_logprobs) are not
 * collected; the router refuses them for a request that does not stream. */
#ifndef TROUPE_ROUTER_COLLECTED_H
#define TROUPE_ROUTER_COLLECTED_H

#include <stddef.h>
#include <stdint.h>

#include "messages/msg.h"

typedef struct collected {
    uint32_t *ids;               /* [cap] the token ids, n of them */
    float *logprobs;             /* [cap] theirs, with_logprobs only */
    uint32_t n, cap;
    int with_logprobs;           /* sampling.logprobs: keep them (0 once a token message lacked them) */
    char *text;                  /* [text_cap] their text: text_len bytes and a NUL (NULL: none yet) */
    size_t text_len, text_cap;
} collected_t;

/* An empty collection; logprobs: keep each token's logprob (sampling.logprobs). */
void collected_init(collected_t *c, int logprobs);
void collected_free(collected_t *c);

/* Adds token message t. 0, or -1 with *why (the request cannot be answered whole: fail it);
 * *overloaded is 1 when that was out of memory (retryable), 0 when a limit was passed. */
int collected_add(collected_t *c, const msg_token_t *t, const char **why, int *overloaded);

/* Points d's completion fields at the collection (valid until collected_free or the next add). */
void collected_fill(const collected_t *c, msg_done_t *d);

#endif
