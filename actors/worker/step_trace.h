/* actors/worker/step_trace.h — a decode worker's per-step trace, for seeing when requests arrive
 * and how their prompts fall into steps (issue 15: the same scheduler composing different steps on
 * a GPU than on the CPU). TROUPE_STEP_TRACE=FILE turns it on ("%p" in FILE: the process id, for
 * topologies with several decode workers); unset, every call is one test of a NULL pointer.
 *
 * One text line per event, space-separated key=value after the event's name; times are
 * CLOCK_MONOTONIC microseconds (comparable across the processes of one machine):
 *
 *   # troupe step trace v2 pid=P
 *   arrive t=T id=ID ntok=N src=p|h   a request joined: a prompt to compute here (p), or a
 *                                     prefill worker's hand-off with its KV (h)
 *   step t=T gap=G sched=S fwd=F post=E dec=D prm=R ptok=PT rtok=RT wait=W prompting=P pre=X
 *        holds=H pos=Q graph=r|p|e chunks=ID:N,ID:N|-
 *                                     one model step: T when scheduling began, G since the previous
 *                                     step's end (-1: the first), S scheduling, F the forward, E
 *                                     sampling and emitting (all us); D decode rows, R prompt-chunk
 *                                     rows (new prompts and recomputes), PT / RT their tokens; W / P
 *                                     / X requests waiting / prompting / preempted after scheduling
 *                                     (the step's own prompts included); H loop passes held since
 *                                     the last step for a router's outbox; Q the forward's positions
 *                                     (rows' tokens, a verify step's drafts and fillers included); how
 *                                     the forward ran: recorded into a CUDA graph (r), replayed from
 *                                     one (p), or its ops launched one by one (e); the chunks in row
 *                                     order
 *   end t=T id=ID                     a request left (finished, failed or cancelled)
 *
 * An arrival's t is when the worker's loop read the message, which it does between steps: one
 * that reached the socket during a forward shows up at that step's end.
 *
 * tools/bench/step_trace.py summarises a trace. Lines go through stdio's buffer and are flushed
 * when the worker goes idle and at close: a worker killed mid-run loses the buffer's tail
 * (SIGTERM drains and closes). Known limit: the trace file is not rotated or bounded. */
#ifndef TROUPE_ACTORS_WORKER_STEP_TRACE_H
#define TROUPE_ACTORS_WORKER_STEP_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/sched.h"

/* The timings and counts of one step (now_ns times; counts as the worker's scheduler has them). */
typedef struct step_trace_step {
    int64_t begin_ns, fwd_begin_ns, fwd_end_ns, end_ns;
    int dec, prm, ptok, rtok;
    int waiting, prompting, preempted;
    int pos;                   /* the forward's positions */
    char graph;                /* 'r' recorded, 'p' replayed, 'e' no graph (0 in a step that set none: 'e') */
} step_trace_step_t;

typedef struct step_trace {
    FILE *f;                   /* NULL: off */
    uint64_t *chunk_id;        /* [cap] this step's prompt chunks: request ids */
    int *chunk_n;              /* [cap] their tokens */
    int cap, n_chunks;         /* cap: the worker's rows per step */
    int holds;                 /* steps held for a router's outbox since the last step */
    int64_t last_end_ns;       /* the last step's end (now_ns); 0: none yet */
    int dirty;                 /* lines written since the last flush */
    step_trace_step_t cur;     /* the step being run, for its line (step_trace_begin .. step_trace_done) */
} step_trace_t;

/* Opens the trace at path (NULL or "": off, returns 0), for steps of up to max_rows rows. -1 with
 * why (the file cannot be made, out of memory); t is then off. */
int step_trace_open(step_trace_t *t, const char *path, int max_rows, char *err, size_t errlen);
/* Flushes and closes (off: nothing). */
void step_trace_close(step_trace_t *t);

static inline int step_trace_on(const step_trace_t *t) { return t->f != NULL; }

void step_trace_arrive(step_trace_t *t, uint64_t id, int n_tokens, int handoff);
void step_trace_end(step_trace_t *t, uint64_t id);
/* A loop pass that held the step for a router's outbox. */
static inline void step_trace_hold(step_trace_t *t) { t->holds++; }
/* One prompt chunk of the step being built (step_trace_forward records the batch's, while their
 * requests are there: a failed forward frees them). */
void step_trace_chunk(step_trace_t *t, uint64_t id, int n_tokens);
/* The step's line, with the chunks recorded since the last one. */
void step_trace_step(step_trace_t *t, const step_trace_step_t *s);
/* The step being run, in the worker's order (off: nothing, and no clock read): its scheduling
 * begins; its scheduler's counts of requests waiting, prompting and preempted once it is
 * scheduled; its forward, from begin_ns to end_ns, of batch b's rows, its prompt chunks of ptok /
 * rtok tokens (new prompts / recomputes) recorded in row order, its positions and graph use (step_trace_chunk: so before a
 * failed forward frees their requests); its end, which writes its line. */
void step_trace_begin(step_trace_t *t);
void step_trace_scheduled(step_trace_t *t, const sched_t *s);
void step_trace_forward(step_trace_t *t, const sched_batch_t *b, int64_t begin_ns, int64_t end_ns, int ptok, int rtok,
                        int pos, char graph);
void step_trace_done(step_trace_t *t);
/* The worker has nothing to step: the lines so far reach the file. */
void step_trace_idle(step_trace_t *t);

#endif
