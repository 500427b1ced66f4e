/* actors/router/tokpool.h — a few threads that turn text and chat prompts into token ids off the
 * router's loop, so one long prompt does not stall every other client while it encodes.
 *
 * The router hands a job over (tokpool_submit); a thread runs prompt_ids on it and sends the
 * job's pointer back over an inproc PUSH to the router's PULL (tokpool_socket), which the router's
 * poll loop reads (tokpool_recv). Ownership: a job belongs to the router throughout; while a
 * thread holds it the thread only reads j->submit and writes the result fields, and the router
 * neither frees it nor reads those fields until the job has come back. A job the router gave up
 * on meanwhile (a cancel, a deadline) is only marked, and freed when it comes back.
 * The tokenizer is shared: tok_encode and chat_render write nothing outside their call. */
#ifndef TROUPE_ROUTER_TOKPOOL_H
#define TROUPE_ROUTER_TOKPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "actors/router/prompt.h"
#include "actors/runtime/actor.h"
#include "messages/msg.h"

typedef struct tokjob {
    msg_t submit;                /* a clone of the client's submit (owns its prompt) */
    actor_peer_t from;           /* where its replies go */
    int64_t arrived_ms;          /* monotonic: when the submit came in */
    int dead;                    /* router only: ended while tokenizing; the result is dropped */
    /* written by the thread, read by the router once the job is back */
    int rc;                      /* prompt_ids' */
    int32_t *ids;                /* malloc'd token ids (rc 0) */
    size_t n;
    char err[512];               /* rc -1: the reason, about the submit's field */
    const char *field;
    struct tokjob *queue_next;   /* the pool's queue (under its mutex) */
    struct tokjob *prev, *next;  /* router only: its list of jobs not yet back */
} tokjob_t;

typedef struct tokpool tokpool_t;

/* Starts n_threads threads encoding with pm (which must outlive the pool), and binds the PULL
 * socket their results come back on. NULL after writing err. */
tokpool_t *tokpool_new(void *zmq_ctx, const char *name, const prompt_model_t *pm, int n_threads, char *err,
                       size_t errlen);
/* Stops and joins the threads (a job being encoded is finished first) and closes their sockets;
 * call it before actor_destroy, which closes the PULL and ends the ZeroMQ context. Jobs are not
 * freed: the router frees its list after this. Idempotent; nulls *self_p. */
void tokpool_destroy(tokpool_t **self_p);
/* The PULL socket to poll: given to actor_add_reader, which closes it in actor_destroy. */
void *tokpool_socket(tokpool_t *p);
void tokpool_submit(tokpool_t *p, tokjob_t *j);
/* A job that came back, or NULL when none is waiting (never blocks). */
tokjob_t *tokpool_recv(tokpool_t *p);
/* Frees a job (after it is back, or after tokpool_destroy). */
void tokjob_free(tokjob_t **self_p);

#endif
