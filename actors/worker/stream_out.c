/* actors/worker/stream_out.c — a decode worker's tokens, done and errors (stream_out.h). */
#include "actors/worker/stream_out.h"
#include "engine/spec.h"   /* SPEC_MAX_K */

#include <stddef.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

int stream_out_init(stream_out_t *so, actor_t *a, const worker_t *w, const sched_t *sched, writeback_t *wb)
{
    *so = (stream_out_t){.a = a, .tok = w->tok, .sched = sched, .wb = wb, .max_seqs = w->max_seqs,
                         .max_logit_rows = w->max_logit_rows};
    return token_text_init(&so->text, 8192);
}

void stream_out_free(stream_out_t *so) { token_text_free(&so->text); }

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

const sampler_top_t *stream_out_top(const dc_req_t *r, const float *row, sampler_top_t *top)
{
    const uint32_t n = r->handoff.u.handoff.sampling.top_logprobs;
    if (n == 0 || !row)
        return NULL;
    sampler_top_logprobs(r->smp, row, (int)n, top);
    return top;
}

/* The held run as one token message (nothing when none is held); its text is the one the run's
 * tokens put together in so->text. */
static void s_send_held(stream_out_t *so)
{
    dc_req_t *r = so->held.r;
    if (!r)
        return;
    msg_t m;
    msg_init(&m, MSG_TOKEN, r->sr.id);
    m.u.token.seq = so->held.seq;
    m.u.token.tokens = so->held.tokens;
    m.u.token.n_tokens = so->held.n;
    m.u.token.text = so->text.len ? so->text.buf : NULL;
    if (r->handoff.u.handoff.sampling.logprobs) {
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
}

int stream_out_token_more(stream_out_t *so, dc_req_t *r, int32_t t, float lp, const sampler_top_t *top, int at_length,
                          int more)
{
    /* A run is one request's tokens with the same number of alternatives (a plain step's token is
     * a run of one): anything else held goes first. */
    const uint32_t k = r->handoff.u.handoff.sampling.logprobs && top && top->n > 0 ? (uint32_t)top->n : 0;
    if (so->held.r && (so->held.r != r || so->held.n == STREAM_OUT_HOLD || so->held.k != k))
        s_send_held(so);
    const int goes_on = so->held.r != NULL;   /* t's text joins the run's */
    finish_reason_t fin = token_text_accept(&so->text, r->smp, so->tok ? &r->ts : NULL, t, goes_on);
    r->toks[r->sr.n_toks++] = t;
    r->n_gen++;
    if (!goes_on) {
        so->held.r = r;
        so->held.seq = (uint32_t)(r->n_gen - 1);
        so->held.k = k;
    }
    const uint32_t i = so->held.n++;
    so->held.tokens[i] = (uint32_t)t;
    so->held.lps[i] = lp;
    for (uint32_t j = 0; j < k; j++) {
        so->held.top_ids[i * k + j] = (uint32_t)top->ids[j];   /* ids >= 0: the same bits */
        so->held.top_lps[i * k + j] = top->logprobs[j];
    }
    if (fin == FINISH_NONE && at_length)
        fin = FINISH_LENGTH;
    if (fin != FINISH_NONE || !more)
        s_send_held(so);
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
