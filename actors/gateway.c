/* actors/gateway.c — the gateway: the OpenAI HTTP API in front of the router.
 *
 * Duties:
 *   - serve HTTP/1.1 on endpoints.http (libmicrohttpd: keep-alive, chunked streaming):
 *     POST /v1/chat/completions and /v1/completions, GET /v1/models[/<id>], /health, /metrics;
 *   - check the API key (Authorization: Bearer) against gateway.api_keys: no or wrong key -> 401
 *     when keys are configured; the key's tenant goes into the submit (the per-tenant cache salt);
 *     its requests / tokens per minute -> 429 with Retry-After;
 *   - turn each call into a router submit (the client protocol, through the C client library
 *     tools/lib/client.h connected to every router's endpoint of endpoints.clients, many requests
 *     in flight at once), relay the tokens as Server-Sent Events or collect them into one reply,
 *     with usage (prompt_tokens_details.cached_tokens) and OpenAI finish reasons;
 *   - map the router's errors onto HTTP: overloaded / unavailable / a lost worker -> 503 with
 *     Retry-After, bad request -> 400 (a prompt longer than the context: context_length_exceeded);
 *   - cancel the request at the router when its client goes away mid-stream;
 *   - when a router is lost (our connection to it drops: it died, or answered no ZMTP heartbeat),
 *     fail over as every client does (the library's rule, one place): a request of it that has had
 *     no reply yet, so nothing was sent to its HTTP client, goes to the next router whose
 *     connection is up (same id; at most CLIENT_MAX_RESUBMITS moves; requests_moved_total); a
 *     non-streamed one that has (its tokens collected here, none sent) starts again there from the
 *     beginning, its collected tokens dropped (requests_restarted_total, counted in moved too); a
 *     stream that has begun, or any call with no router left, ends with 503 / an SSE error event,
 *     retryable;
 *   - bound everything a client controls: body size (413), time to send the body (408), idle
 *     connections (closed), unread stream output (the request is cancelled).
 *
 * Threads: libmicrohttpd runs its own epoll threads (the "HTTP threads", s_http_threads of them,
 * each with its share of the connections: every MHD callback of a connection runs on its thread);
 * the actor loop (the "actor thread") owns the router socket and the table of requests in flight.
 * They meet in one place, gw_call_t: an HTTP thread hands a parsed call to the actor thread over
 * an inproc PUSH/PULL pair (op + pointer; the PUSH end under push_mu), the actor thread writes the
 * bytes to send into the call's buffer under its lock and resumes the suspended connection. A call
 * has two references, one per side; the last to let go frees it.
 *
 * n > 1: one call, n requests at the router (ids id .. id + n - 1, seeds seed + i), each a choice
 * of its own: collected into one reply, or streamed as chunks carrying their choice's index, ended
 * once every choice is done; an error in any ends the call and cancels the others.
 *
 * Known limits: a client that goes away
 * while its reply is being computed (before its stream began, or a non-streamed one) is noticed
 * within a second (s_liveness), mid-stream at the next token. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/gateway/gw_keys.h"
#include "actors/gateway/gw_reply.h"
#include "actors/gateway/gw_request.h"
#include "actors/runtime/actor.h"
#include "common/log.h"
#include "common/u64map.h"
#include "common/util.h"
#include "engine/tokenizer.h"
#include "tools/lib/client.h"

#define GW_MAX_PENDING   (8u << 20)   /* unsent stream bytes before a non-reading client is cut off */
#define GW_RETRY_AFTER_S 1            /* Retry-After for a full or unavailable cluster */
#define GW_MAX_METRICS_FETCHES 4      /* concurrent /metrics proxy fetches */
#define GW_ROUTER_BATCH  256          /* router replies read per turn of the loop (submits go between) */
#define GW_MAX_RESTARTS  CLIENT_MAX_RESUBMITS   /* a non-streamed choice starts again at most this often */

typedef enum { OP_SUBMIT = 1, OP_ABORT = 2 } gw_op_t;

typedef enum { EP_NONE, EP_CHAT, EP_COMPLETION, EP_MODELS, EP_MODEL, EP_HEALTH, EP_METRICS } gw_ep_t;

typedef struct gateway gateway_t;

/* One choice of a call: its own request at the router (id = the call's id + its index). Actor thread. */
typedef struct gw_choice {
    int live;                    /* its request is at the router: no done or error came yet */
    int started;                 /* its first token seen (a chat stream sent its role chunk) */
    int restarts;                /* times started again after its router was lost (s_restart_choice) */
    const char *finish;          /* "stop" / "length" once its done came */
    msg_usage_t usage;           /* from its done */
    char *text;                  /* [text_cap] collected text (non-streamed) */
    size_t text_len, text_cap;
    gw_logprob_t *lp;            /* [n_lp] logprobs collected (non-streamed), or this message's (streamed) */
    uint32_t n_lp, cap_lp;
    gw_logprob_t *alt;           /* [n_alt] their alternatives, lp[i].n_top each, in lp's order */
    uint32_t n_alt, cap_alt;
} gw_choice_t;

/* One HTTP request. Fields are owned by one thread unless marked "mu". */
typedef struct gw_call {
    atomic_int refs;             /* 1 for the HTTP side until its request completes, 1 for the actor side */
    pthread_mutex_t mu;
    gateway_t *g;
    struct MHD_Connection *conn;
    /* HTTP thread */
    gw_ep_t ep;
    int64_t t0_ms;               /* first byte of the request seen (monotonic) */
    char *body;                  /* [body_cap] the upload so far */
    size_t body_len, body_cap;
    int too_big;                 /* the body passed gateway.max_body_bytes: answered 413 at its end */
    int submitted;               /* handed to the actor thread */
    int fd;                      /* the connection's socket (for s_liveness; -1: unknown) */
    gw_key_t *key;               /* the caller's key (NULL: open API) */
    /* set before submit, read-only after */
    gw_request_t req;
    uint64_t id;                 /* the router request id */
    char oid[40];                /* "chatcmpl-..." */
    int64_t created;
    /* mu */
    int ready;                   /* status and kind of response are decided: the HTTP side may respond */
    int finished;                /* the last byte is in out (or the call failed) */
    int failed;                  /* end the stream with an error (cut off, cluster lost) */
    int streaming;               /* respond with SSE from out */
    int status;                  /* HTTP status of a non-streamed response */
    int retry_after_s;           /* > 0: send Retry-After */
    char *out;                   /* [out_cap] bytes to send, out[out_off..out_len) unsent */
    size_t out_len, out_off, out_cap;
    int suspended;               /* the HTTP side suspended the connection waiting for ready/out */
    int gone;                    /* the HTTP side is done with the call */
    /* actor thread */
    int in_table;                /* its ids are in g->calls (requests at the router) */
    int cancel_sent;             /* cancels went to the router (the client is gone) */
    int started;                 /* a first token seen (the stream began) */
    gw_choice_t *choices;        /* [req.n] */
    uint32_t n_done;             /* choices whose done came */
} gw_call_t;

struct gateway {
    const topo_t *topo;
    actor_t *a;
    struct MHD_Daemon *httpd;
    client_t *routers;           /* every router's client endpoint, with failover (actor thread) */
    uint64_t routers_lost_seen;  /* client_connections_lost(routers) last logged */
    void *push, *pull;           /* inproc: HTTP threads -> actor thread */
    pthread_mutex_t push_mu;     /* push is one socket for every HTTP thread (libzmq's are not thread-safe) */
    tokenizer_t *tok;            /* the model's, for the text of logprobs' tokens (NULL: "token_id:<id>") */
    char model[256];             /* the model id served: the model directory's name */
    int64_t started_s;           /* unix time, for /v1/models */
    gw_parse_opts_t opts;
    gw_keys_t keys;              /* guarded by keys_mu (the HTTP thread admits, the actor thread debits) */
    pthread_mutex_t keys_mu;
    u64map_t calls;              /* router id -> gw_call_t * (actor thread) */
    uint64_t next_id;
    atomic_int draining;
    atomic_int metrics_fetches;
    /* stats (atomics: both threads count) */
    atomic_ullong n_http, n_2xx, n_4xx, n_5xx, n_401, n_429, n_503, n_cancelled, n_cutoff;
    uint64_t n_router_lost;      /* calls failed because their router was lost (actor thread) */
    uint64_t n_restarted;        /* non-streamed choices started again after their router was lost (actor thread) */
    atomic_ullong prompt_tokens, cached_tokens, completion_tokens;
};

/* ---- calls: references, output --------------------------------------------------------------- */

static gw_call_t *s_call_new(gateway_t *g, struct MHD_Connection *conn)
{
    gw_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    c->g = g;
    c->conn = conn;
    c->t0_ms = now_ms();
    c->fd = -1;
    return c;
}

static void s_call_unref(gw_call_t *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    for (uint32_t i = 0; c->choices && i < c->req.n; i++) {
        free(c->choices[i].lp);
        free(c->choices[i].alt);
        free(c->choices[i].text);
    }
    free(c->choices);
    gw_request_free(&c->req);
    free(c->body);
    free(c->out);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Appends to a growable buffer; -1 when out of memory or past limit. */
static int s_append(char **b, size_t *len, size_t *cap, const char *s, size_t n, size_t limit)
{
    if (*len + n + 1 > limit)
        return -1;
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 4096;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = realloc(*b, nc);
        if (!nb)
            return -1;
        *b = nb;
        *cap = nc;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = '\0';
    return 0;
}

/* Actor thread: adds bytes to send (mu held by the caller). Drops what was sent already first. */
static int s_out_locked(gw_call_t *c, const char *s, size_t n)
{
    if (c->out_off && c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    return s_append(&c->out, &c->out_len, &c->out_cap, s, n, GW_MAX_PENDING + c->out_off);
}

/* Actor thread: the HTTP side may go on; resumes its connection if it was waiting. Call after
 * changing the call under mu, without mu held (resume takes the library's own locks). */
static void s_wake(gw_call_t *c, int was_suspended)
{
    if (was_suspended)
        MHD_resume_connection(c->conn);
}

/* Under mu: 1 if the connection is suspended (and now counts as resumed). */
static int s_take_suspended(gw_call_t *c)
{
    int s = c->suspended && !c->gone;
    c->suspended = 0;
    return s;
}

static const char *s_finish_name(msg_finish_t f)
{
    return f == MSG_FINISH_LENGTH ? "length" : "stop";
}

/* The call's one non-streamed answer (or the error before a stream began). Actor thread, or the
 * /metrics fetch thread. */
static void s_answer(gw_call_t *c, int status, int retry_after_s, char *json)
{
    pthread_mutex_lock(&c->mu);
    c->status = status;
    c->retry_after_s = retry_after_s;
    c->out_off = c->out_len = 0;
    if (!json || s_out_locked(c, json, strlen(json)) != 0) {
        c->status = 500;
        const char *oom = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        c->out_len = 0;
        s_out_locked(c, oom, strlen(oom));
    }
    c->ready = c->finished = 1;
    c->streaming = 0;
    int s = s_take_suspended(c);
    pthread_mutex_unlock(&c->mu);
    free(json);
    s_wake(c, s);
}

/* Actor thread: an error (status, code, message) as the call's answer, or as the stream's last
 * event when the stream has begun. */
static void s_fail_call(gw_call_t *c, int status, const char *code, int retry_after_s, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void s_fail_call(gw_call_t *c, int status, const char *code, int retry_after_s, const char *fmt, ...)
{
    gw_error_t e;
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof e.message];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gw_error_set(&e, status, code, NULL, "%s", msg);
    if (status == 503 || status == 504)
        e.type = "server_error";
    char *json = gw_error_json(&e);
    pthread_mutex_lock(&c->mu);
    int streaming = c->streaming;
    pthread_mutex_unlock(&c->mu);
    if (!streaming) {
        s_answer(c, status, retry_after_s, json);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (json) {
        s_out_locked(c, "data: ", 6);
        s_out_locked(c, json, strlen(json));
        s_out_locked(c, "\n\n", 2);
    }
    c->finished = 1;
    c->failed = 1;
    int s = s_take_suspended(c);
    pthread_mutex_unlock(&c->mu);
    free(json);
    s_wake(c, s);
}

/* ---- the actor thread: router replies ----------------------------------------------------------- */

/* The call leaves the table (every choice's id; replies that come later for them are dropped). */
static void s_forget(gateway_t *g, gw_call_t *c)
{
    if (!c->in_table)
        return;
    for (uint32_t i = 0; i < c->req.n; i++)
        u64map_del(&g->calls, c->id + i);
    c->in_table = 0;
    s_call_unref(c);   /* the actor side's reference */
}

static gw_reply_ctx_t s_ctx(const gw_call_t *c, uint32_t index)
{
    return (gw_reply_ctx_t){.kind = c->req.kind, .id = c->oid, .created = c->created, .model = c->g->model,
                            .index = index};
}

/* Asks the router to cancel every choice still at it: 0 when all were sent. */
static int s_cancel(gateway_t *g, gw_call_t *c)
{
    int rc = 0;
    for (uint32_t i = 0; i < c->req.n; i++) {
        if (c->choices && !c->choices[i].live)
            continue;
        char err[256];
        if (client_cancel(g->routers, c->id + i, err, sizeof err) != 0)   /* to the router that holds it */
            rc = -1;
    }
    return rc;
}

/* The call ends before all its choices did (an error, a cut-off, a cancel): the others' requests
 * are cancelled at the router (their replies find no call), and the call leaves the table. */
static void s_end_early(gateway_t *g, gw_call_t *c)
{
    if (!c->cancel_sent)
        s_cancel(g, c);
    c->cancel_sent = 1;
    s_forget(g, c);
}

/* Actor thread, mu held: one SSE event. */
static void s_event_locked(gw_call_t *c, char *json)
{
    if (!json || s_out_locked(c, "data: ", 6) || s_out_locked(c, json, strlen(json)) ||
        s_out_locked(c, "\n\n", 2))
        c->failed = 1;   /* out of memory, or the client is not reading: cut off below */
    free(json);
}

/* Room for need entries in *v (of *cap); -1 when out of memory. */
static int s_reserve(gw_logprob_t **v, uint32_t *cap, uint64_t need)
{
    if (need <= *cap)
        return 0;
    uint64_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    if (nc > UINT32_MAX)
        return -1;
    gw_logprob_t *n = realloc(*v, (size_t)nc * sizeof *n);
    if (!n)
        return -1;
    *v = n;
    *cap = (uint32_t)nc;
    return 0;
}

/* A token as a logprobs entry: its bytes from the model's tokenizer (which outlives every call). */
static gw_logprob_t s_lp_entry(const gateway_t *g, uint32_t id, float logprob)
{
    size_t n = 0;
    const uint8_t *b = g->tok && id <= INT32_MAX ? tok_token_bytes(g->tok, (int32_t)id, &n) : NULL;
    return (gw_logprob_t){.logprob = logprob, .bytes = b, .n_bytes = (uint32_t)n, .id = id};
}

/* Appends t's tokens to the choice's logprobs and their alternatives to its alt; -1 when out of
 * memory. The entries' top pointers are set by s_link_top, once the arrays stop moving. */
static int s_collect_lp(gateway_t *g, gw_choice_t *c, const msg_token_t *t)
{
    const uint32_t k = t->n_top_tokens / t->n_tokens;   /* the codec checked: whole rows */
    if (s_reserve(&c->lp, &c->cap_lp, (uint64_t)c->n_lp + t->n_tokens) != 0 ||
        s_reserve(&c->alt, &c->cap_alt, (uint64_t)c->n_alt + t->n_top_tokens) != 0)
        return -1;
    for (uint32_t i = 0; i < t->n_tokens; i++) {
        gw_logprob_t e = s_lp_entry(g, t->tokens[i], t->logprobs[i]);
        e.n_top = k;
        c->lp[c->n_lp++] = e;
    }
    for (uint32_t j = 0; j < t->n_top_tokens; j++)
        c->alt[c->n_alt++] = s_lp_entry(g, t->top_tokens[j], t->top_logprobs[j]);
    return 0;
}

static void s_link_top(gw_choice_t *c)
{
    uint32_t at = 0;
    for (uint32_t i = 0; i < c->n_lp; i++) {
        c->lp[i].top = c->lp[i].n_top ? c->alt + at : NULL;
        at += c->lp[i].n_top;
    }
}

/* Actor thread, mu held: a chat stream's first chunk of choice i (its role), once. */
static void s_role_locked(gw_call_t *c, uint32_t i)
{
    gw_choice_t *ch = &c->choices[i];
    if (ch->started)
        return;
    ch->started = 1;
    gw_reply_ctx_t x = s_ctx(c, i);
    if (c->req.kind == GW_CHAT)
        s_event_locked(c, gw_chunk_json(&x, "", NULL, 1, c->req.include_usage, NULL, 0));
}

/* Actor thread, mu held: the stream's answer is decided (200, SSE) at its first event. */
static void s_stream_begin_locked(gw_call_t *c)
{
    c->streaming = 1;
    c->ready = 1;
    c->status = 200;
    c->started = 1;
}

static void s_on_token(gateway_t *g, gw_call_t *c, uint32_t i, const msg_token_t *t)
{
    gw_choice_t *ch = &c->choices[i];
    const char *text = t->text ? t->text : "";
    const int has_lp = c->req.logprobs && t->n_logprobs;
    if (!c->req.stream) {
        if (s_append(&ch->text, &ch->text_len, &ch->text_cap, text, strlen(text), MSG_MAX_FRAME) != 0)
            goto cut;
        if (has_lp && s_collect_lp(g, ch, t) != 0)
            goto cut;
        c->started = ch->started = 1;
        return;
    }
    gw_reply_ctx_t x = s_ctx(c, i);
    ch->n_lp = ch->n_alt = 0;   /* a stream's chunk lists its own message's tokens */
    if (has_lp && s_collect_lp(g, ch, t) != 0)
        goto cut;
    s_link_top(ch);
    pthread_mutex_lock(&c->mu);
    if (!c->started)
        s_stream_begin_locked(c);
    s_role_locked(c, i);
    /* One event per token message, even when its text is empty (a model without a tokenizer, text
     * held back at a possible stop string or an incomplete character): clients see every step. */
    s_event_locked(c, gw_chunk_json(&x, text, NULL, 0, c->req.include_usage, has_lp ? ch->lp : NULL, ch->n_lp));
    int cut = c->failed;
    int s = s_take_suspended(c);
    pthread_mutex_unlock(&c->mu);
    s_wake(c, s);
    if (!cut)
        return;
cut:
    /* The client does not read (or memory ran out): stop the work, end its stream. */
    atomic_fetch_add(&g->n_cutoff, 1);
    s_fail_call(c, 500, "output_overflow", 0, "the reply could not be delivered: the client is not reading it");
    s_end_early(g, c);
}

static void s_debit(gateway_t *g, gw_call_t *c, const msg_usage_t *u)
{
    atomic_fetch_add(&g->prompt_tokens, u->prompt_tokens);
    atomic_fetch_add(&g->cached_tokens, u->cached_tokens);
    atomic_fetch_add(&g->completion_tokens, u->completion_tokens);
    if (!c->key)
        return;
    pthread_mutex_lock(&g->keys_mu);
    gw_bucket_debit(&c->key->tokens, (double)u->prompt_tokens + u->completion_tokens, now_ms());
    pthread_mutex_unlock(&g->keys_mu);
}

/* The call's usage over its choices, as OpenAI counts n: the prompt once, the completions summed.
 * cached_tokens (with its split by source) is the choice that took the fewest from cache: what
 * every copy of the prompt reused (the choices' prompts run as requests of their own, so a later
 * one may find the earlier's blocks). */
static gw_usage_t s_usage(const gw_call_t *c)
{
    const msg_usage_t *least = &c->choices[0].usage;
    uint32_t completion = 0;
    for (uint32_t i = 0; i < c->req.n; i++) {
        completion += c->choices[i].usage.completion_tokens;
        if (c->choices[i].usage.cached_tokens < least->cached_tokens)
            least = &c->choices[i].usage;
    }
    return (gw_usage_t){least->prompt_tokens, least->cached_tokens, completion, least->cached_device_tokens,
                        least->cached_host_tokens, least->cached_disk_tokens};
}

/* Choice i's done: its finish (a stream's last chunk for it); once every choice is done, the
 * answer (non-streamed) or the usage and [DONE]. 1 when the call is over. */
static int s_on_done(gateway_t *g, gw_call_t *c, uint32_t i, const msg_done_t *d)
{
    s_debit(g, c, &d->usage);
    if (d->finish == MSG_FINISH_CANCELLED) {
        /* Our own cancel (the client went away) came back, or the router gave up on it: nobody is
         * listening, or the call cannot be whole. */
        atomic_fetch_add(&g->n_cancelled, 1);
        s_fail_call(c, 499, "cancelled", 0, "the request was cancelled");
        return -1;
    }
    gw_choice_t *ch = &c->choices[i];
    ch->live = 0;
    ch->finish = s_finish_name(d->finish);
    ch->usage = d->usage;
    c->n_done++;
    const int all = c->n_done == c->req.n;
    gw_usage_t u = all ? s_usage(c) : (gw_usage_t){0};
    gw_reply_ctx_t x = s_ctx(c, i);
    if (!c->req.stream) {
        if (!all)
            return 0;
        gw_choice_out_t out[GW_MAX_N];
        for (uint32_t k = 0; k < c->req.n; k++) {
            s_link_top(&c->choices[k]);
            out[k] = (gw_choice_out_t){.text = c->choices[k].text ? c->choices[k].text : "",
                                       .finish = c->choices[k].finish, .lp = c->req.logprobs ? c->choices[k].lp : NULL,
                                       .n_lp = c->choices[k].n_lp};
        }
        s_answer(c, 200, 0, gw_completion_n_json(&x, out, c->req.n, &u));
        return 1;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->started)   /* done before any token (the router sends at least one; be safe) */
        s_stream_begin_locked(c);
    s_role_locked(c, i);
    s_event_locked(c, gw_chunk_json(&x, "", ch->finish, 0, c->req.include_usage, NULL, 0));
    if (all) {
        if (c->req.include_usage)
            s_event_locked(c, gw_usage_chunk_json(&x, &u));
        if (s_out_locked(c, "data: [DONE]\n\n", 14) != 0)
            c->failed = 1;
        c->finished = 1;
    }
    int s = s_take_suspended(c);
    pthread_mutex_unlock(&c->mu);
    s_wake(c, s);
    return all;
}

/* The router's error codes as HTTP. */
static void s_on_error(gw_call_t *c, const msg_error_t *e)
{
    int status = 500, retry = 0;
    const char *code = msg_error_code_name(e->code);
    switch (e->code) {
    case MSG_ERR_BAD_REQUEST:
        status = 400;
        code = NULL;
        if (e->field && strcmp(e->field, "sampling.max_tokens") == 0 && strstr(e->message, "max_model_len"))
            code = "context_length_exceeded";
        break;
    case MSG_ERR_OVERLOADED:
    case MSG_ERR_UNAVAILABLE:
        status = 503;
        retry = GW_RETRY_AFTER_S;
        break;
    case MSG_ERR_TIMEOUT:
        status = 504;
        break;
    default:
        status = e->retryable ? 503 : 500;
        retry = e->retryable ? GW_RETRY_AFTER_S : 0;
        break;
    }
    if (status == 400 && code == NULL) {
        /* Name the OpenAI field when the router named its own. */
        gw_error_t ge;
        const char *param = e->field && strstr(e->field, "prompt") ? (c->req.kind == GW_CHAT ? "messages" : "prompt")
                          : e->field && strstr(e->field, "messages") ? "messages" : NULL;
        gw_error_set(&ge, 400, NULL, param, "%s", e->message);
        s_answer(c, 400, 0, gw_error_json(&ge));
        return;
    }
    if (code && strcmp(code, "context_length_exceeded") == 0) {
        gw_error_t ge;
        gw_error_set(&ge, 400, code, c->req.kind == GW_CHAT ? "messages" : "prompt", "%s", e->message);
        s_answer(c, 400, 0, gw_error_json(&ge));
        return;
    }
    s_fail_call(c, status, code, retry, "%s", e->message);
}

/* A router's connection was lost (the library noticed it while reading): say so once per loss,
 * with how many requests moved to another router so far. */
static void s_log_router_loss(gateway_t *g)
{
    const uint64_t lost = client_connections_lost(g->routers);
    if (lost == g->routers_lost_seen)
        return;
    g->routers_lost_seen = lost;
    LOG_W("a router was lost (its client connection dropped): loss %llu; so far %llu requests moved to another "
          "router, %llu calls failed with 503",
          (unsigned long long)lost, (unsigned long long)client_requests_retried(g->routers),
          (unsigned long long)g->n_router_lost);
}

static int s_restart_choice(gateway_t *g, gw_call_t *c, uint32_t i);

/* Before the loop sleeps: the routers' replies, GW_ROUTER_BATCH at most (calls from the HTTP
 * threads go between batches), dispatched to their calls. The library's descriptors woke the loop
 * (client_fds); they are edge-triggered, so a full batch asks the loop to come round at once.
 * A request lost with its router, not moved, comes back as the library's own error (unavailable):
 * it is told from the router's errors by client_requests_lost, which counts those alone. */
static int s_on_routers(actor_t *a, void *state)
{
    gateway_t *g = state;
    for (int k = 0; k < GW_ROUTER_BATCH; k++) {
        msg_t m;
        char err[256];
        const uint64_t lost_before = client_requests_lost(g->routers);
        int rc = client_recv(g->routers, &m, 0, err, sizeof err);
        if (rc == 1) {
            s_log_router_loss(g);
            return 0;
        }
        if (rc != 0) {
            LOG_W("reply from a router: %s", err);
            continue;
        }
        const int router_lost = client_requests_lost(g->routers) != lost_before;
        uint64_t *v = u64map_get(&g->calls, m.id);
        gw_call_t *c = v ? (gw_call_t *)(uintptr_t)*v : NULL;
        const uint32_t i = c ? (uint32_t)(m.id - c->id) : 0;   /* the choice: ids are id + index */
        if (c) {
            switch (m.type) {
            case MSG_TOKEN:
                s_on_token(g, c, i, &m.u.token);
                break;
            case MSG_DONE: {
                const int over = s_on_done(g, c, i, &m.u.done);
                if (over > 0)
                    s_forget(g, c);
                else if (over < 0)
                    s_end_early(g, c);
                break;
            }
            case MSG_ERROR:
                c->choices[i].live = 0;
                if (router_lost && s_restart_choice(g, c, i) == 0)
                    break;
                if (router_lost) {
                    g->n_router_lost++;
                    s_fail_call(c, 503, "unavailable", GW_RETRY_AFTER_S, "the router was lost; retry the request");
                } else {
                    s_on_error(c, &m.u.error);
                }
                s_end_early(g, c);
                break;
            default:
                LOG_W("unexpected '%s' from the router", msg_type_name(m.type));
                break;
            }
        }
        msg_free(&m);
    }
    s_log_router_loss(g);
    return 1;   /* more may be queued: come round without sleeping */
}

/* ---- the actor thread: calls from the HTTP thread ------------------------------------------------ */

/* Choice i's submit to the routers (client_send's return), with timeout_ms for the router. */
static int s_send_choice(gateway_t *g, gw_call_t *c, uint32_t i, uint32_t timeout_ms, char *err, size_t errlen)
{
    msg_t m;
    msg_init(&m, MSG_SUBMIT, c->id + i);
    m.u.submit = c->req.submit;
    m.u.submit.sampling.seed = gw_choice_seed(c->req.submit.sampling.seed, i);
    if (c->key)
        m.u.submit.tenant = c->key->cfg->tenant;
    m.u.submit.timeout_ms = timeout_ms;
    return client_send(g->routers, &m, NULL, err, errlen);
}

/* A non-streamed call's choice whose router was lost after its first token (the library moves
 * only requests with no reply yet, since a stream's tokens cannot be taken back): nothing of it
 * has reached the HTTP client, so it starts again, same request and seed, at the router the
 * library sends to now, and what it had collected is dropped (requests_restarted_total). It keeps
 * what is left of the gateway's request timeout. 0 when it went; -1 when it fails as a stream
 * would: a stream, its client gone, GW_MAX_RESTARTS restarts already, no time left, or no router
 * took it. */
static int s_restart_choice(gateway_t *g, gw_call_t *c, uint32_t i)
{
    gw_choice_t *ch = &c->choices[i];
    const int64_t limit_ms = (int64_t)g->topo->gateway.request_timeout_s * 1000;   /* 0: none */
    const int64_t left_ms = limit_ms ? limit_ms - (now_ms() - c->t0_ms) : 0;
    if (c->req.stream || c->cancel_sent || ch->restarts >= GW_MAX_RESTARTS || (limit_ms && left_ms < 1000))
        return -1;
    char err[512];
    if (s_send_choice(g, c, i, (uint32_t)left_ms, err, sizeof err) != 0) {
        LOG_W("request %llu: no router took its restart: %s", (unsigned long long)(c->id + i), err);
        return -1;
    }
    if (ch->text)
        ch->text[0] = 0;
    ch->text_len = 0;
    ch->n_lp = ch->n_alt = 0;
    ch->started = 0;
    ch->live = 1;
    ch->restarts++;
    g->n_restarted++;
    return 0;
}

/* Submits the call's n choices, ids id .. id + n - 1; any that cannot go fails the call (and
 * cancels those that went). */
static void s_submit(gateway_t *g, gw_call_t *c)
{
    c->choices = calloc(c->req.n, sizeof *c->choices);
    if (!c->choices) {
        s_fail_call(c, 503, "overloaded", GW_RETRY_AFTER_S, "the gateway is out of memory");
        s_call_unref(c);
        return;
    }
    for (uint32_t i = 0; i < c->req.n; i++) {
        char err[512];
        if (u64map_put(&g->calls, c->id + i, (uint64_t)(uintptr_t)c) != 0) {
            s_fail_call(c, 503, "overloaded", GW_RETRY_AFTER_S, "the gateway is out of memory");
            goto fail;
        }
        c->in_table = 1;   /* s_forget takes every id out, present or not */
        const int sent = s_send_choice(g, c, i, (uint32_t)g->topo->gateway.request_timeout_s * 1000u, err, sizeof err);
        if (sent == -2) {
            /* The parser's checks should have caught it: say what the protocol refused. */
            gw_error_t e;
            gw_error_set(&e, 400, NULL, NULL, "%s", err);
            s_answer(c, 400, 0, gw_error_json(&e));
            goto fail;
        }
        if (sent != 0) {   /* no router's connection takes it now (every router down or restarting) */
            s_fail_call(c, 503, "unavailable", GW_RETRY_AFTER_S, "the router is not reachable (%s)", err);
            goto fail;
        }
        c->choices[i].live = 1;
    }
    return;
fail:
    if (c->in_table)
        s_end_early(g, c);   /* the actor side's reference goes with the table */
    else
        s_call_unref(c);
}

/* The client went away before its request ended: cancel it at the router. The router answers
 * with done (cancelled), which releases the call. */
static void s_abort(gateway_t *g, gw_call_t *c)
{
    if (c->in_table) {
        if (c->cancel_sent || s_cancel(g, c) == 0)
            LOG_D("request %llu: client gone, cancelled", (unsigned long long)c->id);
        else
            s_forget(g, c);
        c->cancel_sent = 1;
    }
    s_call_unref(c);   /* the reference the abort carried (the HTTP side's) */
}

static int s_on_pull(actor_t *a, void *state, void *sock)
{
    gateway_t *g = state;
    uint8_t buf[1 + sizeof(void *)];
    while (zmq_recv(sock, buf, sizeof buf, ZMQ_DONTWAIT) == (int)sizeof buf) {
        gw_call_t *c;
        memcpy(&c, buf + 1, sizeof c);
        if (buf[0] == OP_SUBMIT)
            s_submit(g, c);
        else
            s_abort(g, c);
    }
    return 0;
}

/* HTTP thread: hands a call to the actor thread. */
static int s_push(gateway_t *g, gw_op_t op, gw_call_t *c)
{
    uint8_t buf[1 + sizeof(void *)];
    buf[0] = (uint8_t)op;
    memcpy(buf + 1, &c, sizeof c);
    pthread_mutex_lock(&g->push_mu);
    const int rc = zmq_send(g->push, buf, sizeof buf, ZMQ_DONTWAIT) == (int)sizeof buf ? 0 : -1;
    pthread_mutex_unlock(&g->push_mu);
    return rc;
}

/* Once a second: the library does not watch a suspended connection, so a client that went away
 * while waiting for its answer (a non-streamed reply, or a stream before its first token) would
 * go unnoticed until the answer is written. Its socket is looked at here instead (a peek, while
 * the connection is suspended and so cannot be closed under us); a closed one cancels the request
 * at the router, whose done (cancelled) then ends the call. */
static int s_liveness(actor_t *a, void *state)
{
    gateway_t *g = state;
    for (size_t i = 0; i < g->calls.cap; i++) {
        if (!g->calls.keys[i])
            continue;
        gw_call_t *c = (gw_call_t *)(uintptr_t)g->calls.vals[i];
        if (c->cancel_sent || g->calls.keys[i] != c->id)   /* once per call: its first choice's entry */
            continue;
        int closed = 0;
        pthread_mutex_lock(&c->mu);
        if (c->suspended && !c->gone && c->fd >= 0) {
            struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
            char b;
            if (poll(&p, 1, 0) == 1 && ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) ||
                                        recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0))
                closed = 1;
        }
        pthread_mutex_unlock(&c->mu);
        if (closed && s_cancel(g, c) == 0) {
            c->cancel_sent = 1;
            LOG_D("request %llu: client gone while waiting, cancelled", (unsigned long long)c->id);
        }
    }
    return 0;
}

/* ---- the HTTP thread ----------------------------------------------------------------------------- */

static enum MHD_Result s_respond_as(gateway_t *g, struct MHD_Connection *conn, int status, char *json,
                                     int retry_after_s, const char *type)
{
    atomic_fetch_add(&g->n_http, 1);
    atomic_fetch_add(status < 300 ? &g->n_2xx : status < 500 ? &g->n_4xx : &g->n_5xx, 1);
    if (status == 401)
        atomic_fetch_add(&g->n_401, 1);
    if (status == 429)
        atomic_fetch_add(&g->n_429, 1);
    if (status == 503)
        atomic_fetch_add(&g->n_503, 1);
    if (!json)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (retry_after_s > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after_s);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result s_respond(gateway_t *g, struct MHD_Connection *conn, int status, char *json, int retry_after_s)
{
    return s_respond_as(g, conn, status, json, retry_after_s, "application/json");
}

static enum MHD_Result s_error(gateway_t *g, struct MHD_Connection *conn, const gw_error_t *e, int retry_after_s)
{
    return s_respond(g, conn, e->status, gw_error_json(e), retry_after_s);
}

static enum MHD_Result s_simple_error(gateway_t *g, struct MHD_Connection *conn, int status, const char *type,
                                      const char *code, const char *msg, int retry_after_s)
{
    gw_error_t e;
    gw_error_set(&e, status, code, NULL, "%s", msg);
    if (type)
        e.type = type;
    return s_error(g, conn, &e, retry_after_s);
}

/* The stream's bytes, from the call's buffer; suspends the connection when there are none yet. */
static ssize_t s_read_stream(void *cls, uint64_t pos, char *buf, size_t max)
{
    gw_call_t *c = cls;
    pthread_mutex_lock(&c->mu);
    size_t avail = c->out_len - c->out_off;
    ssize_t n;
    if (avail) {
        n = (ssize_t)(avail < max ? avail : max);
        memcpy(buf, c->out + c->out_off, (size_t)n);
        c->out_off += (size_t)n;
    } else if (c->finished) {
        n = c->failed ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        c->suspended = 1;
        MHD_suspend_connection(c->conn);
        n = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Once the call is ready: the answer, or the stream. */
static enum MHD_Result s_respond_call(gateway_t *g, gw_call_t *c)
{
    pthread_mutex_lock(&c->mu);
    if (!c->ready) {
        c->suspended = 1;
        MHD_suspend_connection(c->conn);
        pthread_mutex_unlock(&c->mu);
        return MHD_YES;
    }
    if (!c->streaming) {
        char *json = malloc(c->out_len - c->out_off + 1);
        if (json) {
            memcpy(json, c->out + c->out_off, c->out_len - c->out_off);
            json[c->out_len - c->out_off] = '\0';
        }
        int status = c->status, retry = c->retry_after_s;
        pthread_mutex_unlock(&c->mu);
        /* Prometheus' text format for the monitor's page; JSON for everything else. */
        return s_respond_as(g, c->conn, status, json, retry,
                            c->ep == EP_METRICS && status == 200 ? "text/plain; version=0.0.4" : "application/json");
    }
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(&g->n_http, 1);
    atomic_fetch_add(&g->n_2xx, 1);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, s_read_stream, c, NULL);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(c->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

static gw_ep_t s_route(const char *method, const char *url, int *bad_method)
{
    *bad_method = 0;
    static const struct {
        const char *url, *method;
        gw_ep_t ep;
    } table[] = {
        {"/v1/chat/completions", "POST", EP_CHAT}, {"/v1/completions", "POST", EP_COMPLETION},
        {"/v1/models", "GET", EP_MODELS},          {"/health", "GET", EP_HEALTH},
        {"/metrics", "GET", EP_METRICS},
    };
    size_t ul = strcspn(url, "?");
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        if (strlen(table[i].url) != ul || strncmp(url, table[i].url, ul) != 0)
            continue;
        if (strcmp(method, table[i].method) == 0)
            return table[i].ep;
        *bad_method = 1;
        return EP_NONE;
    }
    if (strncmp(url, "/v1/models/", 11) == 0) {
        if (strcmp(method, "GET") == 0)
            return EP_MODEL;
        *bad_method = 1;
    }
    return EP_NONE;
}

/* Authorization for the API: 0, or -1 with the response queued (401 / 429). */
static int s_admit(gateway_t *g, gw_call_t *c, enum MHD_Result *rc)
{
    if (gw_keys_open(&g->keys))
        return 0;
    size_t len = 0;
    const char *tok = gw_bearer(MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
                                &len);
    if (!tok) {
        *rc = s_simple_error(g, c->conn, 401, NULL, "invalid_api_key",
                             "You didn't provide an API key: send it as 'Authorization: Bearer <key>'", 0);
        return -1;
    }
    pthread_mutex_lock(&g->keys_mu);
    gw_key_t *k = gw_keys_find(&g->keys, tok, len);
    int retry = 0, limited = 0;
    const char *what = NULL;
    if (k) {
        int64_t now = now_ms();
        if (gw_bucket_check(&k->tokens, now, &retry) != 0)
            what = "tokens";
        else if (gw_bucket_take(&k->requests, 1, now, &retry) != 0)
            what = "requests";
        limited = what != NULL;
        k->n_requests += !limited;
        k->n_limited += limited;
    }
    pthread_mutex_unlock(&g->keys_mu);
    if (!k) {
        *rc = s_simple_error(g, c->conn, 401, NULL, "invalid_api_key", "Incorrect API key provided", 0);
        return -1;
    }
    if (limited) {
        char msg[256];
        snprintf(msg, sizeof msg, "Rate limit reached for %s per minute of tenant '%s': retry in %d s", what,
                 k->cfg->tenant, retry);
        *rc = s_simple_error(g, c->conn, 429, what, "rate_limit_exceeded", msg, retry);
        return -1;
    }
    c->key = k;
    return 0;
}

/* ---- /metrics: the monitor's Prometheus page, fetched by a short-lived thread ------------------- */

/* Blocking HTTP GET of the monitor's page (loopback or the cluster's network), bounded by 2 s. */
static void *s_metrics_thread(void *arg)
{
    gw_call_t *c = arg;
    gateway_t *g = c->g;
    const char *ep = g->topo->endpoints.metrics + strlen("tcp://");
    char host[256];
    const char *colon = strrchr(ep, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - ep), ep);
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    char *page = NULL;
    size_t len = 0, cap = 0;
    int fd = -1, ok = 0;
    if (getaddrinfo(host, colon + 1, &hints, &ai) == 0 && ai) {
        fd = socket(ai->ai_family, SOCK_STREAM, 0);
        struct timeval tv = {.tv_sec = 2};
        if (fd >= 0) {
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        }
        const char *req = "GET /metrics HTTP/1.0\r\nHost: monitor\r\nConnection: close\r\n\r\n";
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && write(fd, req, strlen(req)) == (ssize_t)strlen(req)) {
            char b[16384];
            ssize_t n;
            int64_t until = now_ms() + 2000;
            while (now_ms() < until && (n = read(fd, b, sizeof b)) > 0)
                if (s_append(&page, &len, &cap, b, (size_t)n, 4u << 20) != 0)
                    break;
            ok = page != NULL;
        }
    }
    if (ai)
        freeaddrinfo(ai);
    if (fd >= 0)
        close(fd);
    char *body = ok ? strstr(page, "\r\n\r\n") : NULL;
    if (body) {
        s_answer(c, 200, 0, strdup(body + 4));
    } else {
        gw_error_t e;
        gw_error_set(&e, 503, "unavailable", NULL, "the monitor's metrics endpoint did not answer");
        s_answer(c, 503, GW_RETRY_AFTER_S, gw_error_json(&e));
    }
    free(page);
    atomic_fetch_sub(&g->metrics_fetches, 1);
    s_call_unref(c);
    return NULL;
}

static enum MHD_Result s_get(gateway_t *g, gw_call_t *c, const char *url)
{
    switch (c->ep) {
    case EP_MODELS:
        return s_respond(g, c->conn, 200, gw_models_json(g->model, g->started_s), 0);
    case EP_MODEL:
        if (strcmp(url + 11, g->model) == 0)
            return s_respond(g, c->conn, 200, gw_model_json(g->model, g->started_s), 0);
        return s_simple_error(g, c->conn, 404, NULL, "model_not_found", "The model does not exist", 0);
    case EP_HEALTH:
        if (atomic_load(&g->draining))
            return s_simple_error(g, c->conn, 503, "server_error", "draining", "the gateway is shutting down",
                                  GW_RETRY_AFTER_S);
        return s_respond(g, c->conn, 200, strdup("{\"status\":\"ok\"}"), 0);
    case EP_METRICS: {
        if (!g->topo->endpoints.metrics[0])
            return s_simple_error(g, c->conn, 404, NULL, "unknown_url",
                                  "this cluster serves no Prometheus metrics (set endpoints.metrics)", 0);
        if (atomic_fetch_add(&g->metrics_fetches, 1) >= GW_MAX_METRICS_FETCHES) {
            atomic_fetch_sub(&g->metrics_fetches, 1);
            return s_simple_error(g, c->conn, 503, "server_error", "busy", "too many /metrics requests at once",
                                  GW_RETRY_AFTER_S);
        }
        atomic_fetch_add(&c->refs, 1);
        c->submitted = 1;
        pthread_t th;
        if (pthread_create(&th, NULL, s_metrics_thread, c) != 0) {
            atomic_fetch_sub(&g->metrics_fetches, 1);
            s_call_unref(c);
            return s_simple_error(g, c->conn, 503, "server_error", "busy", "cannot fetch the metrics now", 1);
        }
        pthread_detach(th);
        return s_respond_call(g, c);
    }
    default:
        return MHD_NO;
    }
}

/* The upload is complete: parse, then hand the request to the actor thread. */
static enum MHD_Result s_start(gateway_t *g, gw_call_t *c)
{
    if (c->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %d bytes", g->topo->gateway.max_body_bytes);
        return s_simple_error(g, c->conn, 413, NULL, "request_too_large", msg, 0);
    }
    gw_error_t e;
    if (gw_request_parse(c->ep == EP_CHAT ? GW_CHAT : GW_COMPLETION, c->body ? c->body : "", c->body_len, &g->opts,
                         &c->req, &e) != 0)
        return s_error(g, c->conn, &e, 0);
    free(c->body);
    c->body = NULL;
    c->body_len = c->body_cap = 0;
    /* n ids, one per choice: id .. id + n - 1 (never 0, the map's empty key) */
    c->id = (__atomic_fetch_add(&g->next_id, c->req.n, __ATOMIC_RELAXED) & 0x3fffffffffffffffULL) | (1ULL << 62);
    snprintf(c->oid, sizeof c->oid, "%s%016llx", c->ep == EP_CHAT ? "chatcmpl-" : "cmpl-", (unsigned long long)c->id);
    c->created = (int64_t)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = ci ? ci->connect_fd : -1;
    atomic_fetch_add(&c->refs, 1);   /* the actor side's */
    if (s_push(g, OP_SUBMIT, c) != 0) {
        atomic_fetch_sub(&c->refs, 1);
        return s_simple_error(g, c->conn, 503, "server_error", "overloaded", "the gateway is overloaded",
                              GW_RETRY_AFTER_S);
    }
    c->submitted = 1;
    return s_respond_call(g, c);
}

static enum MHD_Result s_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    gateway_t *g = cls;
    gw_call_t *c = *con_cls;
    if (!c) {   /* headers only, first call */
        c = s_call_new(g, conn);
        if (!c)
            return MHD_NO;
        *con_cls = c;
        int bad_method;
        c->ep = s_route(method, url, &bad_method);
        if (c->ep == EP_NONE)
            return bad_method ? s_simple_error(g, conn, 405, NULL, "method_not_allowed", "method not allowed here", 0)
                              : s_simple_error(g, conn, 404, NULL, "unknown_url", "unknown URL", 0);
        if (c->ep != EP_CHAT && c->ep != EP_COMPLETION)
            return MHD_YES;   /* GETs answer on the next call */
        if (atomic_load(&g->draining))
            return s_simple_error(g, conn, 503, "server_error", "draining", "the gateway is shutting down",
                                  GW_RETRY_AFTER_S);
        enum MHD_Result rc;
        if (s_admit(g, c, &rc) != 0)
            return rc;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > (unsigned long long)g->topo->gateway.max_body_bytes) {
            c->too_big = 1;
            return s_start(g, c);
        }
        return MHD_YES;
    }
    if (c->submitted)   /* resumed: the answer or the stream is ready */
        return s_respond_call(g, c);
    if (*upload_size) {
        if (now_ms() - c->t0_ms > (int64_t)g->topo->gateway.body_timeout_s * 1000) {
            LOG_D("request body not complete within %d s: connection closed", g->topo->gateway.body_timeout_s);
            return MHD_NO;   /* a slow sender: close (no reply can be queued mid-upload) */
        }
        if (!c->too_big && s_append(&c->body, &c->body_len, &c->body_cap, upload, *upload_size,
                                    (size_t)g->topo->gateway.max_body_bytes + 1) != 0) {
            c->too_big = 1;   /* keep reading (discarding) so the 413 can be sent at the end */
            free(c->body);
            c->body = NULL;
            c->body_len = c->body_cap = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->ep == EP_CHAT || c->ep == EP_COMPLETION)
        return s_start(g, c);
    return s_get(g, c, url);
}

/* The HTTP side is done with a request: normally, or because the client went away. */
static void s_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    gateway_t *g = cls;
    gw_call_t *c = *con_cls;
    if (!c)
        return;
    *con_cls = NULL;
    pthread_mutex_lock(&c->mu);
    c->gone = 1;
    int unfinished = c->submitted && !c->finished;
    pthread_mutex_unlock(&c->mu);
    if (unfinished && c->ep != EP_METRICS && s_push(g, OP_ABORT, c) == 0)
        return;   /* the abort carries our reference */
    s_call_unref(c);
}

static void s_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    /* Mostly clients that went away mid-reply: worth a line, not a warning. */
    LOG_I("http: %s", line);
}

/* ---- the actor ------------------------------------------------------------------------------------ */

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    gateway_t *g = state;
    actor_stat_queue(a, st, "requests", g->calls.n, 0);
    actor_stat_metric(a, st, "http_requests_total", (double)atomic_load(&g->n_http), 1);
    actor_stat_metric(a, st, "http_2xx_total", (double)atomic_load(&g->n_2xx), 1);
    actor_stat_metric(a, st, "http_4xx_total", (double)atomic_load(&g->n_4xx), 1);
    actor_stat_metric(a, st, "http_5xx_total", (double)atomic_load(&g->n_5xx), 1);
    actor_stat_metric(a, st, "http_401_total", (double)atomic_load(&g->n_401), 1);
    actor_stat_metric(a, st, "http_429_total", (double)atomic_load(&g->n_429), 1);
    actor_stat_metric(a, st, "http_503_total", (double)atomic_load(&g->n_503), 1);
    actor_stat_metric(a, st, "requests_cancelled_by_client", (double)atomic_load(&g->n_cancelled), 1);
    actor_stat_metric(a, st, "requests_cut_off", (double)atomic_load(&g->n_cutoff), 1);
    /* Failover between routers (tools/lib/client.h): requests sent again to another router after
     * theirs was lost; calls failed because theirs was lost (streamed, or no router left). */
    actor_stat_metric(a, st, "requests_moved_total", (double)(client_requests_retried(g->routers) + g->n_restarted), 1);
    actor_stat_metric(a, st, "requests_restarted_total", (double)g->n_restarted, 1);
    actor_stat_metric(a, st, "requests_router_lost_total", (double)g->n_router_lost, 1);
    actor_stat_metric(a, st, "router_connections_lost_total", (double)client_connections_lost(g->routers), 1);
    actor_stat_metric(a, st, "prompt_tokens_total", (double)atomic_load(&g->prompt_tokens), 1);
    actor_stat_metric(a, st, "cached_tokens_total", (double)atomic_load(&g->cached_tokens), 1);
    actor_stat_metric(a, st, "generation_tokens_total", (double)atomic_load(&g->completion_tokens), 1);
}

static int s_drained(actor_t *a, void *state)
{
    gateway_t *g = state;
    atomic_store(&g->draining, 1);   /* new requests get 503 from now on */
    return g->calls.n == 0;
}

static const actor_handler_t s_handlers[] = {{MSG_NONE, NULL}};

/* How many HTTP threads (libmicrohttpd event loops, each with its share of the connections): one
 * per 4 online CPUs, 1 to 4; TROUPE_GATEWAY_HTTP_THREADS=N (1..16) overrides. Each streamed token
 * message is one send() on its connection's thread, with the wake-up of the client it reaches,
 * and each request's parse and admission runs there too: at ~80k tokens a second over 64 streams
 * one thread was busy enough that a request's first token, and a new request's admission, queued
 * behind the other streams' tokens (docs/gateway.md, Performance). */
static unsigned s_http_threads(void)
{
    const char *env = getenv("TROUPE_GATEWAY_HTTP_THREADS");
    if (env && *env) {
        char *end;
        long n = strtol(env, &end, 10);
        if (*end == '\0' && n >= 1 && n <= 16)
            return (unsigned)n;
        LOG_W("TROUPE_GATEWAY_HTTP_THREADS='%s' is not a number 1..16: ignored", env);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long n = cpus / 4;
    return n < 1 ? 1u : n > 4 ? 4u : (unsigned)n;
}

/* The client library's hook for each router's socket: the cluster's limits, deep queues (a
 * stream's tokens), sends that never wait (ZMQ_IMMEDIATE: no queueing for a router whose
 * connection is down, SNDTIMEO 0: the actor loop never blocks), and under CURVE our own keypair
 * (the router admits gateway instances by their keys, docs/security.md). */
static int s_router_sock(void *sock, void *arg)
{
    actor_t *a = arg;
    int one = 1, hwm = 100000, zero = 0;
    actor_sock_defaults(sock, &actor_topo(a)->limits);
    if (zmq_setsockopt(sock, ZMQ_IMMEDIATE, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDTIMEO, &zero, sizeof zero) != 0)
        return -1;
    return actor_curve_client_endpoint(a, sock);
}

/* The listening address of endpoints.http ("tcp://host:port"). */
static int s_listen_addr(const char *ep, struct sockaddr_storage *ss, int *family)
{
    if (strncmp(ep, "tcp://", 6) != 0)
        return -1;
    const char *h = ep + 6, *colon = strrchr(h, ':');
    if (!colon)
        return -1;
    char host[256];
    snprintf(host, sizeof host, "%.*s", (int)(colon - h), h);
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    if (strcmp(host, "*") == 0)
        snprintf(host, sizeof host, "0.0.0.0");
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
        return -1;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *family = ai->ai_family;
    freeaddrinfo(ai);
    return 0;
}

/* The HTTP port's listening socket, bound here rather than by libmicrohttpd so that a bind that
 * fails is known as one, with its own errno (after the library's NULL, errno is whatever its last
 * call left): the gateway then says so as every actor does (actor_bind_failed) and exits
 * ACTOR_EXIT_CONFIG instead of being restarted. Options as the library's own listening socket
 * (SO_REUSEADDR; v6 only for a v6 address). -1 on failure. */
static int s_http_listen(const char *ep, const struct sockaddr_storage *ss, int family)
{
    const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        actor_bind_failed(ep, "endpoints.http", errno);
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    const socklen_t len = family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        actor_bind_failed(ep, "endpoints.http", errno);
        close(fd);
        return -1;
    }
    return fd;
}

/* The state before any socket: the model's name and tokenizer, the request parser's options, the
 * API keys, the first request id. -1 after saying why. */
static int s_init(gateway_t *g, actor_t *a)
{
    const topo_t *t = actor_topo(a);
    g->topo = t;
    g->a = a;
    g->started_s = (int64_t)time(NULL);
    pthread_mutex_init(&g->keys_mu, NULL);
    pthread_mutex_init(&g->push_mu, NULL);
    u64map_init(&g->calls, 256);
    const char *slash = strrchr(t->model.path, '/');
    snprintf(g->model, sizeof g->model, "%.255s", slash && slash[1] ? slash + 1 : t->model.path[0] ? t->model.path : "troupe");
    /* The tokenizer the workers use, for the text and bytes of logprobs' tokens (without one, a
     * token shows as "token_id:<id>", as the workers then send no text either). */
    const char *tokdir = t->model.tokenizer[0] ? t->model.tokenizer : t->model.path;
    char terr[512];
    if (!(g->tok = tok_load(tokdir, terr, sizeof terr)))
        LOG_W("no tokenizer (%s): logprobs name tokens by id", terr);
    const topo_instance_t *cm = topo_first(t, ROLE_CACHE_MANAGER);
    g->opts = (gw_parse_opts_t){.model = g->model, .can_retain = cm && t->cache.host_store_blocks > 0,
                                .max_retention_s = MSG_MAX_RETENTION_S,
                                .default_retention_s = (uint32_t)t->cache.default_retention_s};
    if (gw_keys_init(&g->keys, &t->gateway, now_ms()) != 0) {
        LOG_E("out of memory");
        return -1;
    }
    FILE *r = fopen("/dev/urandom", "rb");
    if (!r || fread(&g->next_id, sizeof g->next_id, 1, r) != 1)
        g->next_id = (uint64_t)now_ns();
    if (r)
        fclose(r);
    g->next_id &= 0x3fffffffffffffffULL;
    return 0;
}

/* Every router, as any client reaches it (the C client library: one connection each, ZMTP
 * heartbeats, failover). Its sockets wake the actor loop. -1 after saying why. */
static int s_connect_routers(gateway_t *g)
{
    char eps[TOPO_ROUTERS_MAX * (TOPO_ENDPOINT_MAX + 1)], cerr[512];
    client_opts_t copts = {.sock_setup = s_router_sock, .sock_setup_arg = g->a};
    client_opts_from_topo(g->topo, &copts);
    if (client_endpoints_of_topo(g->topo, eps, sizeof eps, cerr, sizeof cerr) != 0 ||
        !(g->routers = client_connect_opts(eps, &copts, cerr, sizeof cerr))) {
        LOG_E("the routers' client endpoints: %s", cerr);
        return -1;
    }
    int fds[2 * CLIENT_ROUTERS_MAX];
    const int n_fds = client_fds(g->routers, fds, 2 * CLIENT_ROUTERS_MAX);
    for (int i = 0; i < n_fds; i++)
        if (actor_add_wake_fd(g->a, fds[i]) != 0) {
            LOG_E("too many descriptors for the actor loop");
            return -1;
        }
    return 0;
}

/* The inproc PUSH/PULL pair that carries calls from the HTTP threads to the actor thread, and the
 * once-a-second check for clients gone away (s_liveness). -1 after saying why. */
static int s_open_calls(gateway_t *g)
{
    actor_t *a = g->a;
    int hwm = 100000;
    char inproc[128];
    snprintf(inproc, sizeof inproc, "inproc://gateway-calls-%d", (int)getpid());
    g->pull = zmq_socket(actor_zmq_ctx(a), ZMQ_PULL);
    g->push = zmq_socket(actor_zmq_ctx(a), ZMQ_PUSH);
    int linger = 0;
    zmq_setsockopt(g->push, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(g->pull, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(g->push, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(g->pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (zmq_bind(g->pull, inproc) != 0 || zmq_connect(g->push, inproc) != 0) {
        LOG_E("inproc %s: %s", inproc, zmq_strerror(errno));
        return -1;
    }
    /* Calls from the HTTP threads between batches of the routers' replies: a new request goes to
     * a router before the next batch of other streams' tokens is relayed, not after every token
     * queued (s_on_routers reads GW_ROUTER_BATCH at a time, before the loop sleeps). */
    actor_add_reader(a, g->pull, s_on_pull);
    actor_timer_add(a, 1000, s_liveness);
    return 0;
}

/* libmicrohttpd on endpoints.http, on our own listening socket (s_http_listen). Returns 0, -1
 * after saying why, or ACTOR_EXIT_CONFIG when the port cannot be bound. */
static int s_serve_http(gateway_t *g)
{
    const topo_t *t = g->topo;
    struct sockaddr_storage ss;
    int family = AF_INET;
    if (s_listen_addr(t->endpoints.http, &ss, &family) != 0) {
        LOG_E("endpoints.http '%s': cannot resolve its host", t->endpoints.http);
        return -1;
    }
    const int listen_fd = s_http_listen(t->endpoints.http, &ss, family);
    if (listen_fd < 0)
        return ACTOR_EXIT_CONFIG;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     (family == AF_INET6 ? MHD_USE_IPv6 : 0);
    unsigned n_http = s_http_threads();
    if (t->gateway.max_connections > 0 && n_http > (unsigned)t->gateway.max_connections)
        n_http = (unsigned)t->gateway.max_connections;   /* the library splits the limit over its threads */
    g->httpd = MHD_start_daemon(flags, 0, NULL, NULL, s_access, g,
                                MHD_OPTION_THREAD_POOL_SIZE, n_http > 1 ? n_http : 0u,
                                MHD_OPTION_EXTERNAL_LOGGER, s_mhd_log, g,
                                MHD_OPTION_LISTEN_SOCKET, (MHD_socket)listen_fd,   /* the daemon closes it */
                                MHD_OPTION_NOTIFY_COMPLETED, s_completed, g,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)t->gateway.idle_timeout_s,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)t->gateway.max_connections,
                                MHD_OPTION_END);
    if (!g->httpd) {
        LOG_E("cannot serve HTTP at %s (libmicrohttpd's error is above)", t->endpoints.http);
        return -1;   /* listen_fd is the library's now, closed or not; we exit */
    }
    LOG_I("OpenAI API at http://%s/v1 (model '%s', %s, %u HTTP thread%s)", t->endpoints.http + 6, g->model,
          gw_keys_open(&g->keys) ? "no API keys: open" : "API keys required", n_http, n_http > 1 ? "s" : "");
    return 0;
}

/* The actor loop until TERM: no message handlers of its own (the routers' replies are read before
 * each sleep, the calls by s_on_pull). Returns actor_run's result. */
static int s_run(gateway_t *g)
{
    actor_ops_t ops = {.handlers = s_handlers, .n_handlers = 0, .before_sleep = s_on_routers,
                       .fill_stats = s_fill_stats, .drained = s_drained};
    return actor_run(g->a, &ops, g);
}

/* Whatever s_init and the steps after it got to; g may be NULL. */
static void s_destroy(gateway_t *g)
{
    if (!g)
        return;
    atomic_store(&g->draining, 1);
    if (g->httpd) {
        /* Calls still in flight end now (the grace period ran out): their connections resume,
         * then the library closes every connection. */
        for (size_t i = 0; i < g->calls.cap; i++)
            if (g->calls.keys[i] && g->calls.keys[i] == ((gw_call_t *)(uintptr_t)g->calls.vals[i])->id)
                s_fail_call((gw_call_t *)(uintptr_t)g->calls.vals[i], 503, "draining", GW_RETRY_AFTER_S,
                            "the gateway is shutting down");
        usleep(100 * 1000);
        MHD_stop_daemon(g->httpd);
    }
    if (g->push)
        zmq_close(g->push);
    if (g->pull)
        zmq_close(g->pull);
    client_destroy(&g->routers);
    gw_keys_free(&g->keys);
    tok_destroy(&g->tok);
    u64map_free(&g->calls);
    free(g);
}

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_GATEWAY);
    if (!a)
        return 2;
    gateway_t *g = calloc(1, sizeof *g);
    int rc = -1;
    if (g && s_init(g, a) == 0 && s_connect_routers(g) == 0 && s_open_calls(g) == 0 &&
        (rc = s_serve_http(g)) == 0)
        rc = s_run(g);
    s_destroy(g);
    actor_destroy(&a);
    return rc == 0 || rc == ACTOR_EXIT_CONFIG ? rc : 1;
}
