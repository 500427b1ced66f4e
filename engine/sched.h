/* engine/sched.h — the batch scheduler: which requests compute what in a worker's next forward.
 *
 * Pure logic over a KV pool (engine/kvcache.h): no sockets, no model, no backend. Used by the
 * prefill actor (prompt chunks only) and the decode actor (continuous batching: decode rows, plus
 * prompt chunks when it computes prompts itself).
 *
 * A request's life, one queue per state (each in admission order):
 *
 *     PROMPTING --prompt computed--> RUNNING (or WAITING while the batch is full)
 *         |                          PROMPTED (a prompts-only worker: max_running 0)
 *     WAITING --a batch slot freed--> RUNNING --KV pool full--> PREEMPTED --recomputed--> RUNNING
 *
 * and out (sched_remove) from any state. Every move goes through one function, which keeps the
 * per-state counts and the preemptions (sched_preemptions: every move into PREEMPTED) and logs
 * `request N: from -> to on event` (debug level).
 *
 * A step (sched_step) is: decode rows first, one token for every RUNNING request, then prompt
 * chunks, up to chunk_tokens tokens in all (Sarathi / vLLM chunked prefill). A PREEMPTED request
 * is recomputed through the same chunk path as a new prompt, before any new prompt gets a chunk
 * (new prompts would take the blocks it needs), and a freed decode slot goes to it before a
 * WAITING request of a client as loaded admitted after it (a stream of hand-offs would otherwise
 * keep it from ever running again); a waiting request of a less loaded client, or an older one,
 * goes first (else it could wait for as long as other clients kept requests preempted). A prompt's first chunk adopts every cached prefix
 * block of the pool (kvseq_match_prefix). Blocks are reserved as the chunks go: a chunk is only
 * taken when the pool keeps one free block per decode row after it, so a prompt never takes the
 * blocks the batch it joins needs next.
 *
 * Fair across clients (the router's client key: credential and tenant): a freed decode slot goes
 * to the waiting request whose client has the fewest RUNNING requests, among equals the client
 * whose last turn is the longest ago (round robin). Prompt chunks go round robin too: a client's
 * k-th prompt in this step's order ranks as its other RUNNING + WAITING + PREEMPTED requests + k, lowest rank
 * first, the oldest among equal ranks (an old prompt being chunked keeps the budget ahead of new
 * ones: a part-computed prompt holds blocks). Within one client everything goes oldest first, so
 * for one client the order is admission order. One client's 40 waiting requests thus do not stand
 * in front of another client's one.
 *
 * Out of blocks for a decode row: the owner's reclaim hook first (finished sequences it still
 * holds), then a part-computed prompt gives its blocks back (it starts over later, reusing those
 * still cached), then a WAITING request's KV (it makes no progress with it: it becomes
 * PREEMPTED), then a running request is preempted (never the last one); each time the newest of
 * the client with the most requests here (RUNNING + WAITING + PREEMPTED), so a light client's one
 * request is not the one recomputed. A request
 * that can never fit (alone and still out of blocks, or a prompt larger than the whole pool) is
 * dropped through the owner's drop hook.
 *
 * Requests are found by id in O(1) (common/u64map); queue moves are O(1); a promotion scans the
 * waiting queue and each prompt chunk the prompt queue (fair order is decided at the step, from
 * per-client counts kept by every move). The caller owns each sched_req_t (embedded in its own
 * request struct), its kvseq and its tokens.
 *
 * Known limits: a prompt held for a fetch (sched_hold) is noticed past its deadline only when the
 * step's chunk loop reaches it. Fairness counts requests, not their tokens (a client's long prompts
 * weigh as one each, in admission and in the choice of a preemption's victim). */
#ifndef TROUPE_ENGINE_SCHED_H
#define TROUPE_ENGINE_SCHED_H

#include <stdint.h>

#include "common/u64map.h"
#include "engine/kvcache.h"

typedef enum {
    SCHED_WAITING,     /* its KV is complete; waits for a decode slot */
    SCHED_PROMPTING,   /* its prompt's KV is computed in chunks (held: not before hold_until_ms) */
    SCHED_RUNNING,     /* one decode row every step */
    SCHED_PREEMPTED,   /* its blocks were taken back; its KV is recomputed in chunks before it runs */
    SCHED_PROMPTED,    /* prompt computed on a prompts-only worker; not scheduled (handed off) */
    SCHED_OUT,         /* not in the scheduler */
    SCHED_STATE_COUNT
} sched_state_t;

extern const char *const sched_state_names[SCHED_STATE_COUNT];

typedef struct sched_client sched_client_t;   /* one client's counts (sched.c) */

typedef struct sched_req {
    uint64_t id;               /* the router's request id */
    uint64_t client;           /* the router's client key (0: not known, one client for all such) */
    sched_client_t *cl;        /* its client's counts */
    uint64_t seen_pass;        /* the last chunk pass that took it (sched.c) */
    kvseq_t *kv;               /* its tokens and blocks (the owner's; the scheduler appends) */
    const int32_t *toks;       /* [n_toks] prompt, then generated tokens (the owner's buffer) */
    int n_toks;                /* prompt + generated (the owner appends); a RUNNING request's last
                                * one is not fed yet */
    int n_prompt;
    int target;                /* PROMPTING / PREEMPTED: tokens the chunks compute */
    int n_done;                /* of target, computed (-1: the prefix cache not consulted yet) */
    int n_cached;              /* prompt tokens adopted from the prefix cache by its first chunk */
    int started;               /* its first chunk was scheduled (or it arrived with its KV) */
    int64_t arrived_ms;        /* sched_add_* time */
    int64_t started_ms;        /* its first chunk's time */
    int64_t hold_until_ms;     /* PROMPTING: skipped until then (a fetch in flight); 0 = not held */
    uint64_t seq;              /* admission order */
    sched_state_t state;
    struct sched_req *prev, *next;   /* its state's queue */
    struct sched_req *cw_prev, *cw_next;   /* WAITING: its client's waiting requests, oldest first */
    uint64_t wait_seq;         /* WAITING: when it entered (the waiting queue's order) */
} sched_req_t;

/* One row of a step: n_new tokens of req computed. */
typedef struct sched_row {
    sched_req_t *req;
    int n_new;
    int sample;                /* its logits give a token: a decode row, or the chunk ending a prompt */
} sched_row_t;

typedef struct sched_batch {
    int n;                     /* rows */
    int n_decode;              /* rows [0, n_decode) are decode rows (one token), then prompt chunks */
    sched_row_t *rows;         /* [max_seqs] */
} sched_batch_t;

typedef struct sched_config {
    int max_seqs;              /* rows per step */
    int max_running;           /* RUNNING requests at most (0: a prompts-only worker) */
    int chunk_tokens;          /* prompt tokens per step, every chunk together */
    int64_t (*now_ms)(void);   /* the clock (tests give a fake one) */
    void *ctx;                 /* the hooks' first argument */
    /* Out of blocks: frees blocks held outside the schedule; 1 if it freed any. NULL: none. */
    int (*reclaim)(void *ctx);
    /* A held prompt passed its deadline and is scheduled again (the owner counts the lost wait). */
    void (*hold_expired)(void *ctx, sched_req_t *r);
    /* r can never run in this pool (why); it has left the scheduler: the owner replies, frees it. */
    void (*drop)(void *ctx, sched_req_t *r, const char *why);
} sched_config_t;

typedef struct sched sched_t;

/* NULL with err on a bad config or out of memory. */
sched_t *sched_new(kvpool_t *pool, const sched_config_t *cfg, char *err, size_t errlen);
void sched_destroy(sched_t **self_p);

/* A prompt whose KV is computed here: toks[0..n_prompt), kv empty; client: who submitted it (the
 * router's client key, 0 = not known). -1 when the id is taken or out of memory. */
int sched_add_prompt(sched_t *s, sched_req_t *r, uint64_t id, uint64_t client, kvseq_t *kv, const int32_t *toks,
                     int n_prompt);
/* A request arriving with its KV (a hand-off): kv holds toks[0..n_prompt); the caller appends its
 * first token (toks[n_prompt], n_toks++) before the next step, which feeds it. with_kv 0: its KV
 * could not be taken (no room): it starts PREEMPTED, recomputed when blocks free up. n_cached: of
 * its prompt, tokens that were cache hits. -1 when the id is taken. */
int sched_add_running(sched_t *s, sched_req_t *r, uint64_t id, uint64_t client, kvseq_t *kv, const int32_t *toks,
                      int n_prompt, int n_cached, int with_kv);
/* A computed prompt (PROMPTING -> RUNNING / WAITING) has n_toks == kvseq_len: the caller appends
 * its first token (from the prompt's last chunk) the same way. */
/* Out of the scheduler (finished, cancelled, failed); r's kv is left to the owner. */
void sched_remove(sched_t *s, sched_req_t *r);
sched_req_t *sched_find(const sched_t *s, uint64_t id);

/* r (PROMPTING) gets no chunk before until_ms, or until sched_unhold (a prefix fetch in flight). */
void sched_hold(sched_t *s, sched_req_t *r, int64_t until_ms);
void sched_unhold(sched_t *s, sched_req_t *r);

/* The next step's rows; tokens are appended to the rows' sequences (n == 0: nothing to run). */
const sched_batch_t *sched_step(sched_t *s);
/* Ends the step. Its forward succeeded: its KV is published and its prompts advance (a prompt's
 * last chunk moves it on); call before acting on the rows. A failed forward: remove its rows'
 * requests first (sched_remove clears their rows), then commit what is left (nothing). */
void sched_commit(sched_t *s);

int sched_count(const sched_t *s, sched_state_t st);
int sched_size(const sched_t *s);   /* requests in the scheduler, every state */
/* Its state's queue, in admission order (r must not be removed while it is the cursor). */
sched_req_t *sched_first(const sched_t *s, sched_state_t st);
static inline sched_req_t *sched_next(const sched_req_t *r) { return r->next; }
uint64_t sched_preemptions(const sched_t *s);

#endif
