/* actors/worker/dc_req.h — one request as a decode worker holds it, from its arrival (a prefill
 * worker's hand-off, or a colocated prompt) to its terminal reply. A header of its own because the
 * decode worker's intake paths (actors/worker/handoff_in.h, actors/worker/prompt_intake.h) make
 * requests and the decode step runs them; the scheduler's handle comes first, so a sched_req_t of
 * the decode worker's scheduler is a dc_req_t. */
#ifndef TROUPE_ACTORS_WORKER_DC_REQ_H
#define TROUPE_ACTORS_WORKER_DC_REQ_H

#include <stddef.h>
#include <stdint.h>

#include "actors/worker/worker.h"
#include "actors/worker/prefix_fetch.h"
#include "engine/sched.h"

typedef struct dc_req {
    sched_req_t sr;              /* first: the scheduler's handle (id, state, tokens, progress) */
    msg_t handoff;               /* clone: owns prompt, sampling, reply_to (colocated: made here) */
    kvseq_t *kv;                 /* the tokens whose KV is (to be) computed */
    int32_t *toks;               /* [max_model_len] prompt, then generated ids (sr.toks) */
    sampler_t *smp;
    tok_stream_t ts;             /* streaming detokenizer (set up when the worker has a tokenizer) */
    int n_gen;                   /* generated tokens */
    int64_t admitted_ms;         /* arrival; then its first token (decode time starts) */
    struct {                     /* colocated: the prompt's cached prefix in the host store */
        uint64_t *hints;         /* [n_hints] the router's hint hashes (a copy) */
        int n_hints;
        int active;              /* the prompt is held for hints[src.from..] (sched_hold) */
        fetch_src_t src;         /* the first hint asked for, the blocks taken, which came from disk */
        int64_t sent_ms;
    } fetch;
    int kv_keep;                 /* > 0 while a verify step's tokens are streamed: the KV length that
                                    is right for the tokens streamed so far (rejected drafts past it);
                                    0 otherwise */
} dc_req_t;
_Static_assert(offsetof(dc_req_t, sr) == 0, "the scheduler's handle is the request");

/* A request of worker w for handoff message h (cloned; its prompt, sampling, reply_to): its token
 * buffer holding the prompt, an empty KV sequence in w's pool, its sampler, its detokenizer. Not
 * in a scheduler yet. NULL with why (out of memory, or the sampling parameters). */
dc_req_t *dc_req_new(const worker_t *w, const msg_t *h, char *err, size_t errlen);
/* Frees r and everything it holds; r must be out of the scheduler. NULL: nothing. */
void dc_req_destroy(dc_req_t **self_p);

#endif
