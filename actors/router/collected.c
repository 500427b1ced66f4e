/* actors/router/collected.c — see collected.h. */
#include "actors/router/collected.h"

#include <stdlib.h>
#include <string.h>

void collected_init(collected_t *c, int logprobs)
{
    memset(c, 0, sizeof *c);
    c->with_logprobs = logprobs != 0;
}

void collected_free(collected_t *c)
{
    free(c->ids);
    free(c->logprobs);
    free(c->text);
    memset(c, 0, sizeof *c);
}

/* Room for n more tokens. */
static int s_grow_ids(collected_t *c, uint32_t more)
{
    const uint64_t need = (uint64_t)c->n + more;
    if (need <= c->cap)
        return 0;
    uint64_t cap = c->cap ? c->cap : 64;
    while (cap < need)
        cap *= 2;
    if (cap > MSG_MAX_NEW_TOKENS)
        cap = MSG_MAX_NEW_TOKENS;
    uint32_t *ids = realloc(c->ids, (size_t)cap * sizeof *ids);
    if (!ids)
        return -1;
    c->ids = ids;
    if (c->with_logprobs) {
        float *lp = realloc(c->logprobs, (size_t)cap * sizeof *lp);
        if (!lp)
            return -1;   /* ids grew: cap stays, so the next try asks again */
        c->logprobs = lp;
    }
    c->cap = (uint32_t)cap;
    return 0;
}

static int s_grow_text(collected_t *c, size_t more)
{
    const size_t need = c->text_len + more + 1;
    if (need <= c->text_cap)
        return 0;
    size_t cap = c->text_cap ? c->text_cap : 256;
    while (cap < need)
        cap *= 2;
    char *t = realloc(c->text, cap);
    if (!t)
        return -1;
    c->text = t;
    c->text_cap = cap;
    return 0;
}

int collected_add(collected_t *c, const msg_token_t *t, const char **why, int *overloaded)
{
    *overloaded = 0;
    const size_t tl = t->text ? strlen(t->text) : 0;
    if ((uint64_t)c->n + t->n_tokens > MSG_MAX_NEW_TOKENS) {
        *why = "more tokens than a done carries (MSG_MAX_NEW_TOKENS)";
        return -1;
    }
    if (c->text_len + tl > MSG_MAX_COMPLETION_TEXT) {
        *why = "its text is longer than a done carries (8 MiB): stream it";
        return -1;
    }
    if (s_grow_ids(c, t->n_tokens) != 0 || s_grow_text(c, tl) != 0) {
        *why = "router out of memory";
        *overloaded = 1;
        return -1;
    }
    memcpy(c->ids + c->n, t->tokens, (size_t)t->n_tokens * sizeof *c->ids);
    if (c->with_logprobs && t->n_logprobs == t->n_tokens)
        memcpy(c->logprobs + c->n, t->logprobs, (size_t)t->n_tokens * sizeof *c->logprobs);
    else
        c->with_logprobs = 0;   /* a worker that sent none: none for the whole, rather than a gap */
    c->n += t->n_tokens;
    memcpy(c->text + c->text_len, t->text ? t->text : "", tl);
    c->text_len += tl;
    c->text[c->text_len] = 0;
    return 0;
}

void collected_fill(const collected_t *c, msg_done_t *d)
{
    d->tokens = c->n ? c->ids : NULL;
    d->n_tokens = c->n;
    d->text = c->text_len ? c->text : NULL;
    d->logprobs = c->with_logprobs && c->n ? c->logprobs : NULL;
    d->n_logprobs = c->with_logprobs ? c->n : 0;
}
