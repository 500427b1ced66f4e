/* actors/worker/stream_out.h — what a decode worker sends a request's router: each token it
 * produces (a token message with its text, its logprob and its position's top_logprobs), then the
 * one terminal reply: done (usage, timings; the finished sequence offered to the write-back) or
 * error.
 *
 * A module of its own because three paths stream tokens (a hand-off's or a colocated prompt's
 * first token, a plain step's sampled rows, speculation's verified tokens) and all of them must
 * stop alike: EOS, stop ids, stop strings (held back from the text until they cannot match),
 * max_tokens, or no room left in max_model_len; and every request must end with exactly one done
 * or error. The request itself stays the caller's: a call that ends it returns 1, and the caller
 * then frees it (out of its scheduler first).
 *
 * Nothing for a router is ever refused (actor_send_keep): the decode step makes room for what a
 * step may send before it runs (router_watch_room), and a hand-off's first token, sent outside a
 * step, is one per request. */
#ifndef TROUPE_ACTORS_WORKER_STREAM_OUT_H
#define TROUPE_ACTORS_WORKER_STREAM_OUT_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/worker/worker.h"
#include "actors/worker/dc_req.h"
#include "actors/worker/token_text.h"
#include "actors/worker/writeback.h"
#include "engine/sched.h"
#include "engine/spec.h"   /* SPEC_MAX_K */

#define STREAM_OUT_HOLD (SPEC_MAX_K + 1)   /* tokens of one row held for one message: a verify step's at most */

typedef struct stream_out {
    actor_t *a;
    const tokenizer_t *tok;      /* the worker's; NULL: tokens go out without text */
    const sched_t *sched;        /* the decode worker's: whether the batch is busy (write-back shedding) */
    writeback_t *wb;             /* finished sequences' blocks to the host store */
    int max_seqs;                /* the batch: at least half of it running is busy */
    int max_logit_rows;          /* the worker's rows of logits per forward (worker_t.max_logit_rows) */
    token_text_t text;           /* the text of the run being streamed (held) */
    /* The run of tokens going out as one token message (stream_out_token_more): a verify step's
     * accepted run of one row, or a plain step's one token. */
    struct {
        dc_req_t *r;             /* whose (NULL: none held) */
        uint32_t seq, n;         /* the first one's index among r's generated tokens; how many */
        uint32_t k;              /* alternatives per token (top_logprobs) */
        uint32_t tokens[STREAM_OUT_HOLD];
        float lps[STREAM_OUT_HOLD];
        uint32_t top_ids[STREAM_OUT_HOLD * MSG_MAX_LOGPROBS];
        float top_lps[STREAM_OUT_HOLD * MSG_MAX_LOGPROBS];
    } held;
    uint64_t tokens_out;         /* tokens streamed */
    uint64_t messages_out;       /* token messages they went in (fewer: a verify step's run is one) */
    uint64_t finished;           /* requests ended with done */
    uint64_t last_tokens;        /* tokens_out at the last stream_out_rate */
    int64_t last_ms;             /* its time (now_ms); 0: never */
    double tokens_per_s;         /* the last rate */
} stream_out_t;

/* The output of decode worker w (its tokenizer, its batch size), whose requests live in sched and
 * whose finished sequences go to wb. -1 when out of memory. */
int stream_out_init(stream_out_t *so, actor_t *a, const worker_t *w, const sched_t *sched, writeback_t *wb);
void stream_out_free(stream_out_t *so);

/* Ends r with an error to its router: its terminal reply (the caller then frees r). */
void stream_out_error(stream_out_t *so, const dc_req_t *r, msg_error_code_t code, int retryable, const char *why);

/* r's most likely tokens at the position whose logits are row, into *top, when its sampling asks
 * for them (top_logprobs); NULL when it does not, or the row stayed on the device. Between the
 * sampling of the position and stream_out_token (which records the token: the penalties must not
 * move). */
const sampler_top_t *stream_out_top(const dc_req_t *r, const float *row, sampler_top_t *top);

/* Streams token t (r's n_gen-th) with its text, its logprob lp and its position's alternatives top
 * (NULL: none), and ends r with done when it finished (at_length: no room for another token). 1
 * when r ended: the caller frees it. */
int stream_out_token(stream_out_t *so, dc_req_t *r, int32_t t, float lp, const sampler_top_t *top, int at_length);
/* The same, for a verify step's row: with more set (the row's next token follows in this step)
 * the token is held, and r's held tokens go out as one token message with the first token after
 * which more is 0, or when r ends: a row's run of accepted tokens costs its router (and the
 * clients after it) one message, not one a token. The order and the seqs are those of one message
 * a token. Holding is for one row at a time: a token of another request sends what is held. */
int stream_out_token_more(stream_out_t *so, dc_req_t *r, int32_t t, float lp, const sampler_top_t *top, int at_length,
                          int more);

/* Streams a hand-off's first token (sampled by the prefill worker: its alternatives come in the
 * handoff message). 1 when r ended: the caller frees it. */
int stream_out_first(stream_out_t *so, dc_req_t *r, int32_t first, float lp);

/* Backpressure (router_watch_room): the most messages the next step may send the routers: its
 * rows' tokens (with up to drafts_per_row drafts each when speculating a message a token,
 * spec_step_max_drafts; 0 when a row's run is one message; at most the rows of logits a forward
 * has) and a done per row. */
long stream_out_step_messages(const stream_out_t *so, int drafts_per_row);

/* Tokens streamed per second since the last call (the stats interval); the last rate when no time
 * has passed, 0 at the first call. */
double stream_out_rate(stream_out_t *so);

#endif
