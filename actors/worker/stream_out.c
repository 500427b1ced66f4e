/* actors/worker/stream_out.c — a decode worker's tokens, done and errors (stream_out.h). */
#include "actors/worker/stream_out.h"
#include "engine/spec.h"   /* SPEC_MAX_K */

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

int stream_out_init(stream_out_t *so, actor_t *a, const worker_t *w, const sched_t *sched, writeback_t *wb)
{
    *so = (stream_out_t){.a = a, .tok = w->tok, .sched = sched, .wb = wb, .max_seqs = w->max_seqs,
                         .max_logit_rows = w->max_logit_rows};
    return token_text_init(&so->text, 8192);
}

void stream_out_free(stream_out_t *so)
{
    token_text_free(&so->text);
    free(so->held.text);
    so->held.text = NULL;
}

static void s_send_held(stream_out_t *so);

void stream_out_error(stream_out_t *so, const dc_req_t *r, msg_error_code_t code, int retryable, const char *why)
{
    if (so->held.r == r)   /* its tokens before its end (a verify step ends each row's holding itself) */
        s_send_held(so);
    msg_t e;
    msg_init(&e, MSG_ERROR, r->sr.id);
    e.u.error.code = code;
    e.u.error.retryable = retryable;
    e.u.error.message = why;
    actor_send_keep(so->a, r->handoff.u.handoff.reply_to, &e);   /* terminal: the router waits for it */
}

/* Ends r: the write-back's blocks named, done to the router, the write-back's copy. */
static void s_finish(stream_out_t *so, dc_req_t *r, msg_finish_t fin)
{
    const msg_handoff_t *h = &r->handoff.u.handoff;
    /* Finished inside a verify step: its KV loses the drafts past what was streamed (never written
     * back), and what is left is computed: published now, its step's commit comes after. */
    if (r->kv_keep > 0 && r->kv) {
        if (kvseq_truncate(r->kv, r->kv_keep) != 0)
            LOG_E("request %llu: cannot roll its KV back to %d tokens", (unsigned long long)r->sr.id, r->kv_keep);
        kvseq_publish(r->kv);
    }
    /* A request without its KV (preempted) has nothing to write back. */
    wb_slot_t *wb = r->sr.state == SCHED_PREEMPTED
                        ? NULL
                        : writeback_put(so->wb, so->a, r->kv, r->sr.id, (int)h->cached_tokens,
                                        h->prompt_cache_key && *h->prompt_cache_key,
                                        2 * sched_count(so->sched, SCHED_RUNNING) >= so->max_seqs);
    msg_t m;
    msg_init(&m, MSG_DONE, r->sr.id);
    m.u.done.finish = fin;
    m.u.done.usage.prompt_tokens = h->n_tokens;
    m.u.done.usage.cached_tokens = h->cached_tokens;
    m.u.done.usage.cached_host_tokens = h->cached_host_tokens;
    m.u.done.usage.cached_disk_tokens = h->cached_disk_tokens;
    m.u.done.usage.cached_device_tokens = h->cached_tokens - h->cached_host_tokens - h->cached_disk_tokens;
    m.u.done.usage.completion_tokens = (uint32_t)r->n_gen;
    m.u.done.timings.queue_ms = h->queue_ms;
    m.u.done.timings.prefill_ms = h->prefill_ms;
    m.u.done.timings.decode_ms = (uint32_t)(now_ms() - r->admitted_ms);
    actor_send_keep(so->a, h->reply_to, &m);
    so->finished++;
    if (wb)
        writeback_copy(so->wb, wb, &r->kv);
}

_Static_assert(MSG_MAX_LOGPROBS <= SAMPLER_MAX_TOP, "a request's top_logprobs fit a sampler_top_t");
_Static_assert(STREAM_OUT_HOLD >= SPEC_MAX_K + 1, "a verify step's run of a row fits one held message");

const sampler_top_t *stream_out_top(const dc_req_t *r, const float *row, sampler_top_t *top)
{
    const uint32_t n = r->handoff.u.handoff.sampling.top_logprobs;
    if (n == 0 || !row)
        return NULL;
    sampler_top_logprobs(r->smp, row, (int)n, top);
    return top;
}

/* Token t alone as a token message, with the text token_text_accept gave it. */
static void s_send_one(stream_out_t *so, dc_req_t *r, int32_t t, float lp, const sampler_top_t *top)
{
    msg_t m;
    msg_init(&m, MSG_TOKEN, r->sr.id);
    uint32_t tok = (uint32_t)t;
    m.u.token.seq = (uint32_t)(r->n_gen - 1);
    m.u.token.tokens = &tok;
    m.u.token.n_tokens = 1;
    m.u.token.text = so->text.len ? so->text.buf : NULL;
    if (r->handoff.u.handoff.sampling.logprobs) {
        m.u.token.logprobs = &lp;
        m.u.token.n_logprobs = 1;
        if (top && top->n > 0) {
            m.u.token.top_tokens = (const uint32_t *)top->ids;   /* ids >= 0: the same bits */
            m.u.token.top_logprobs = top->logprobs;
            m.u.token.n_top_tokens = m.u.token.n_top_logprobs = (uint32_t)top->n;
        }
    }
    actor_send_keep(so->a, r->handoff.u.handoff.reply_to, &m);   /* never refused: the header says why */
    so->tokens_out++;
    so->messages_out++;
}

/* The held tokens as one token message, if any. */
static void s_send_held(stream_out_t *so)
{
    if (!so->held.r || so->held.n == 0) {
        so->held.r = NULL;
        return;
    }
    dc_req_t *r = so->held.r;
    msg_t m;
    msg_init(&m, MSG_TOKEN, r->sr.id);
    m.u.token.seq = so->held.seq;
    m.u.token.tokens = so->held.tokens;
    m.u.token.n_tokens = so->held.n;
    m.u.token.text = so->held.text_len ? so->held.text : NULL;
    if (so->held.logprobs) {
        m.u.token.logprobs = so->held.lps;
        m.u.token.n_logprobs = so->held.n;
        if (so->held.k > 0) {
            m.u.token.top_tokens = so->held.top_ids;
            m.u.token.top_logprobs = so->held.top_lps;
            m.u.token.n_top_tokens = m.u.token.n_top_logprobs = so->held.n * so->held.k;
        }
    }
    actor_send_keep(so->a, r->handoff.u.handoff.reply_to, &m);   /* never refused: the header says why */
    so->tokens_out += so->held.n;
    so->messages_out++;
    so->held.r = NULL;
    so->held.n = 0;
    so->held.text_len = 0;
}

/* Token t into the held message (sent first if it is another request's, full, or its tokens have
 * another number of alternatives). -1 when out of memory for its text: then it goes alone. */
static int s_hold(stream_out_t *so, dc_req_t *r, int32_t t, float lp, const sampler_top_t *top)
{
    const uint32_t k = r->handoff.u.handoff.sampling.logprobs && top && top->n > 0 ? (uint32_t)top->n : 0;
    if (so->held.r && (so->held.r != r || so->held.n == STREAM_OUT_HOLD || so->held.k != k))
        s_send_held(so);
    const size_t len = so->text.len;
    if (so->held.text_len + len + 1 > so->held.text_cap) {
        size_t cap = so->held.text_cap ? so->held.text_cap : 256;
        while (cap < so->held.text_len + len + 1)
            cap *= 2;
        char *b = realloc(so->held.text, cap);
        if (!b)
            return -1;
        so->held.text = b;
        so->held.text_cap = cap;
    }
    if (!so->held.r) {
        so->held.r = r;
        so->held.seq = (uint32_t)(r->n_gen - 1);
        so->held.k = k;
        so->held.logprobs = r->handoff.u.handoff.sampling.logprobs;
    }
    const uint32_t i = so->held.n++;
    so->held.tokens[i] = (uint32_t)t;
    so->held.lps[i] = lp;
    for (uint32_t j = 0; j < k; j++) {
        so->held.top_ids[i * k + j] = (uint32_t)top->ids[j];   /* ids >= 0: the same bits */
        so->held.top_lps[i * k + j] = top->logprobs[j];
    }
    memcpy(so->held.text + so->held.text_len, so->text.buf, len);
    so->held.text_len += len;
    so->held.text[so->held.text_len] = 0;
    return 0;
}

int stream_out_token_more(stream_out_t *so, dc_req_t *r, int32_t t, float lp, const sampler_top_t *top, int at_length,
                          int more)
{
    finish_reason_t fin = token_text_accept(&so->text, r->smp, so->tok ? &r->ts : NULL, t);
    r->toks[r->sr.n_toks++] = t;
    r->n_gen++;
    if (fin == FINISH_NONE && at_length)
        fin = FINISH_LENGTH;
    if (!more && !so->held.r) {
        s_send_one(so, r, t, lp, top);   /* a plain step's token: nothing held, nothing to hold */
    } else if (s_hold(so, r, t, lp, top) != 0) {   /* out of memory: what is held, then this one alone */
        s_send_held(so);
        s_send_one(so, r, t, lp, top);
    } else if (fin != FINISH_NONE || !more) {
        s_send_held(so);
    }
    if (fin == FINISH_NONE)
        return 0;
    s_finish(so, r, fin == FINISH_LENGTH ? MSG_FINISH_LENGTH : MSG_FINISH_STOP);
    return 1;
}

int stream_out_token(stream_out_t *so, dc_req_t *r, int32_t t, float lp, const sampler_top_t *top, int at_length)
{
    return stream_out_token_more(so, r, t, lp, top, at_length, 0);
}

int stream_out_first(stream_out_t *so, dc_req_t *r, int32_t first, float lp)
{
    const msg_handoff_t *h = &r->handoff.u.handoff;
    sampler_top_t top = {.n = (int)h->n_first_top_tokens};   /* <= top_logprobs: validated */
    if (top.n) {   /* the arrays are NULL without alternatives, and memcpy must not be given NULL */
        memcpy(top.ids, h->first_top_tokens, (size_t)top.n * sizeof top.ids[0]);
        memcpy(top.logprobs, h->first_top_logprobs, (size_t)top.n * sizeof top.logprobs[0]);
    }
    return stream_out_token(so, r, first, lp, top.n ? &top : NULL, 0);
}

long stream_out_step_messages(const stream_out_t *so, int drafts_per_row)
{
    const int n = sched_size(so->sched);
    const int rows = n < so->max_seqs ? n : so->max_seqs;
    long tokens = (long)rows * (1 + (drafts_per_row > 0 ? drafts_per_row : 0));
    if (tokens > so->max_logit_rows && so->max_logit_rows >= rows)
        tokens = so->max_logit_rows;
    return tokens + rows;
}

double stream_out_rate(stream_out_t *so)
{
    const int64_t now = now_ms();
    if (so->last_ms && now > so->last_ms)
        so->tokens_per_s = (double)(so->tokens_out - so->last_tokens) * 1000.0 / (double)(now - so->last_ms);
    so->last_ms = now;
    so->last_tokens = so->tokens_out;
    return so->tokens_per_s;
}
