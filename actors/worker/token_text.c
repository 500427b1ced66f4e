/* actors/worker/token_text.c — a streamed token's text (token_text.h). */
#include "actors/worker/token_text.h"

#include <stdlib.h>
#include <string.h>

int token_text_init(token_text_t *tt, size_t cap)
{
    tt->buf = malloc(cap);
    tt->cap = tt->buf ? cap : 0;
    tt->len = 0;
    return tt->buf && cap >= 2 ? 0 : -1;
}

void token_text_free(token_text_t *tt)
{
    free(tt->buf);
    memset(tt, 0, sizeof *tt);
}

/* The sampler's emit callback: text it lets through (cut at the buffer's end). */
static void s_append(void *ctx, const char *t, size_t n)
{
    token_text_t *tt = ctx;
    if (tt->len + n + 1 > tt->cap)
        n = tt->cap - tt->len - 1;
    memcpy(tt->buf + tt->len, t, n);
    tt->len += n;
    tt->buf[tt->len] = 0;
}

finish_reason_t token_text_accept(token_text_t *tt, sampler_t *smp, tok_stream_t *ts, int32_t t, int append)
{
    finish_reason_t fin = sampler_accept(smp, t);
    if (!append) {
        tt->len = 0;
        tt->buf[0] = 0;
    }
    if (!ts)
        return fin;
    char piece[1024];
    size_t n = 0;
    if (fin != FINISH_STOP && tok_stream_feed(ts, t, piece, sizeof piece, &n) == 0 && n &&
        sampler_text(smp, piece, n, s_append, tt))
        fin = FINISH_STOP;
    if (fin != FINISH_NONE) {
        n = 0;
        if (fin != FINISH_STOP && tok_stream_flush(ts, piece, sizeof piece, &n) == 0 && n)
            sampler_text(smp, piece, n, s_append, tt);
        sampler_text_flush(smp, s_append, tt);
    }
    return fin;
}
