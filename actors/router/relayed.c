/* actors/router/relayed.c — see relayed.h. */
#include "actors/router/relayed.h"

#include <stdlib.h>
#include <string.h>

void relayed_init(relayed_t *rl, const tokenizer_t *tok, uint32_t max_tokens)
{
    memset(rl, 0, sizeof *rl);
    rl->max_tokens = max_tokens;
    if (tok) {
        tok_stream_init(&rl->ts, tok);
        rl->ts.skip_special = 1;   /* as the workers' (actors/worker/dc_req.c) */
    }
}

void relayed_free(relayed_t *rl)
{
    free(rl->ids);
    rl->ids = NULL;
    rl->cap = 0;
}

int relayed_track(relayed_t *rl, const msg_token_t *t, char *scratch, size_t cap, const char **why)
{
    int rc = 0;
    const uint64_t need = (uint64_t)rl->n + t->n_tokens;
    if (!rl->lost && need > rl->cap) {
        uint64_t c = rl->cap ? rl->cap : 64;
        while (c < need)
            c *= 2;
        if (c > rl->max_tokens)
            c = rl->max_tokens;
        int32_t *g = c >= need ? realloc(rl->ids, (size_t)c * sizeof *g) : NULL;
        if (!g) {
            *why = c >= need ? "out of memory" : "more than max_tokens";
            rc = -1;
            free(rl->ids);
            rl->ids = NULL;
            rl->cap = 0;
            rl->lost = 1;
        } else {
            rl->ids = g;
            rl->cap = (uint32_t)c;
        }
    }
    for (uint32_t i = 0; i < t->n_tokens; i++) {
        if (!rl->lost)
            rl->ids[rl->n + i] = (int32_t)t->tokens[i];
        size_t n = 0;
        if (rl->ts.tok && tok_stream_feed(&rl->ts, (int32_t)t->tokens[i], scratch, cap, &n) == 0)
            rl->decoded_bytes += n;
    }
    rl->text_bytes += t->text ? strlen(t->text) : 0;
    if (rl->ts.npend == 0 && rl->decoded_bytes == rl->text_bytes) {
        rl->clean_tokens = (uint32_t)need;
        rl->clean_text = rl->text_bytes;
    }
    rl->n = (uint32_t)need;
    return rc;
}

uint32_t relayed_cut(const relayed_t *rl, int exact)
{
    return exact ? rl->clean_tokens : rl->n;
}

uint64_t relayed_text_to_skip(const relayed_t *rl, int exact)
{
    return exact ? rl->text_bytes - rl->clean_text : 0;
}

void relayed_restart(relayed_t *rl, uint32_t cut, int exact)
{
    rl->base = cut;
    rl->skip_text = relayed_text_to_skip(rl, exact);
}

int relayed_resume(relayed_t *rl, msg_token_t *t, const char **why)
{
    const uint64_t at = (uint64_t)rl->base + t->seq;   /* the client's index of tokens[0] */
    if (at > rl->n) {
        *why = "skipped tokens";
        return -1;
    }
    const uint32_t drop = at + t->n_tokens <= rl->n ? t->n_tokens : (uint32_t)(rl->n - at);
    for (uint32_t i = 0; i < drop; i++)
        if (rl->lost || rl->ids[at + i] != (int32_t)t->tokens[i]) {
            *why = "differs from the tokens already sent";
            return -1;
        }
    const size_t tl = t->text ? strlen(t->text) : 0;
    if (drop == t->n_tokens) {
        if (tl > rl->skip_text) {
            *why = "has more text than was sent";
            return -1;
        }
        rl->skip_text -= tl;
        return 1;
    }
    if (rl->skip_text > tl) {   /* the repeated tokens' text must end by the first new token's */
        *why = "has less text than was sent";
        return -1;
    }
    t->text = tl > rl->skip_text ? t->text + rl->skip_text : NULL;   /* a cut the old worker made: whole UTF-8 */
    rl->skip_text = 0;
    if (drop) {
        const uint32_t k = t->n_top_tokens / t->n_tokens;   /* alternatives per position */
        t->tokens += drop;
        if (t->n_logprobs) {
            t->logprobs += drop;
            t->n_logprobs -= drop;
        }
        if (t->n_top_tokens) {
            t->top_tokens += (size_t)drop * k;
            t->top_logprobs += (size_t)drop * k;
            t->n_top_tokens -= drop * k;
            t->n_top_logprobs -= drop * k;
        }
        t->n_tokens -= drop;
    }
    t->seq = rl->n;
    return 0;
}

int relayed_done_complete(const relayed_t *rl, uint32_t completion_tokens)
{
    return (uint64_t)rl->base + completion_tokens >= rl->n && !rl->skip_text;
}
