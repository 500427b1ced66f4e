/* actors/router/relayed.h — what a streaming request's client has been sent, so that the request
 * can move to another worker mid-stream (the router's migration) and its stream go on at the next
 * `seq` with nothing repeated or missing.
 *
 * The worker's text of a token is not the token's own bytes: its detokenizer holds back an
 * unfinished UTF-8 character and its stop-string matcher holds back what may still become a stop
 * string (actors/worker/token_text.h). The ledger decodes the relayed tokens itself (ts) and
 * remembers the last point where the text relayed had caught up with them (clean_tokens): a greedy
 * request is migrated from there (relayed_cut), so the new worker starts in the state the old one
 * was in; the tokens it computes again, and their text, are checked against what was relayed and
 * dropped (relayed_resume).
 *
 * Out of memory the ids are given up (lost: the request can no longer migrate), never the request.
 * No allocation but the ids' array, which grows by doubling up to max_tokens. */
#ifndef TROUPE_ROUTER_RELAYED_H
#define TROUPE_ROUTER_RELAYED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"
#include "messages/msg.h"

typedef struct relayed {
    int32_t *ids;                /* [cap] the token ids relayed, n of them */
    uint32_t n;                  /* tokens the client has been sent (its completion so far) */
    uint32_t cap;                /* grows by doubling, never past max_tokens */
    uint32_t max_tokens;         /* the client's sampling.max_tokens: the worker stops there */
    int lost;                    /* out of memory once: ids are gone, the request cannot migrate */
    tok_stream_t ts;             /* the relayed tokens through the workers' detokenizer (ts.tok NULL: none) */
    uint64_t text_bytes;         /* text relayed */
    uint64_t decoded_bytes;      /* what the relayed tokens decode to (ts's output) */
    uint32_t clean_tokens;       /* tokens relayed at the last point the text relayed had caught up */
    uint64_t clean_text;         /* with their decoded bytes (nothing held back), and the text then */
    uint32_t base;               /* the client's index of the current attempt's seq 0 */
    uint64_t skip_text;          /* bytes of the current attempt's first text that were relayed already */
} relayed_t;

/* An empty ledger; tok NULL when the router has no tokenizer (text is then not tracked). */
void relayed_init(relayed_t *rl, const tokenizer_t *tok, uint32_t max_tokens);
void relayed_free(relayed_t *rl);

/* Records the token message t as about to be sent to the client (n grows by t->n_tokens).
 * scratch holds one token's decoded bytes: cap >= 3 * tok_max_token_bytes + 3. -1 when the ids
 * were given up just now (*why: out of memory, or more than max_tokens), else 0. */
int relayed_track(relayed_t *rl, const msg_token_t *t, char *scratch, size_t cap, const char **why);

/* The cut a migration resumes from: the last clean point for an exact (greedy, penalty-free)
 * request, else every token relayed. */
uint32_t relayed_cut(const relayed_t *rl, int exact);

/* A new attempt begins from `cut` (the prompt is the original one and ids[0..cut)): its seq 0 is
 * the client's token `cut`, and the text relayed after the cut is to be skipped (exact only). */
void relayed_restart(relayed_t *rl, uint32_t cut, int exact);

/* Text relayed after the cut that a new attempt from it will send again (exact only). */
uint64_t relayed_text_to_skip(const relayed_t *rl, int exact);

/* A migrated request's new attempt streams again, from its cut, the tokens the client was sent
 * after it, with their text: they must be the same (their ids, and as many text bytes as were
 * relayed after the cut), and are dropped; t is left with what the client has not seen, at its
 * next seq. 0: relay t; 1: nothing of it is new; -1: it differs, *why says how (the caller fails
 * the request). */
int relayed_resume(relayed_t *rl, msg_token_t *t, const char **why);

/* 1 when a migrated request's last attempt, ending after completion_tokens of its own, has
 * reproduced everything the client was sent before its done. */
int relayed_done_complete(const relayed_t *rl, uint32_t completion_tokens);

#endif
