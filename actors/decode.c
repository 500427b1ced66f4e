/* actors/decode.c — the decode worker: continuous batching over a paged KV pool.
 *
 * Duties:
 *   - take hand-offs: one handoff message, the request with its KV's transfer description (the
 *     blocks: in a shared-memory segment, in the prefill pool on our GPU, on an NCCL link from
 *     another GPU, or staged for the network on another node: transfer/kv_chan.h); receive the
 *     blocks into our pool, acknowledge (kv_ack) so the prefill side frees its copy, stream the
 *     first token;
 *   - each step (the loop's before_sleep hook), one forward for the whole running batch: every
 *     request feeds its last token, gets logits, samples, streams the token (with its text: whole
 *     UTF-8 only, stop strings held back) and stops on EOS / stop ids / stop strings / max tokens;
 *     requests join and leave at every step;
 *   - when the pool runs out of blocks, preempt the newest request (free its blocks) and recompute
 *     its KV later from its tokens (recompute, as vLLM does);
 *   - write finished sequences' full blocks back to the cache-manager's host store (cache_put plus a
 *     kv_announce on the shared-memory channel) so the next turn of a conversation can reuse them
 *     on any prefill worker. The copy runs on a thread of its own (kv_copier.h) beside the next
 *     steps, the finished sequence's blocks held until it is done. Under load (at least half of
 *     max_batch running) only requests that asked for retention (prompt_cache_key) are written
 *     back: the others are a cache's best effort, shed before their copies compete with the
 *     running requests for the host store and the memory bus, and so are any beyond a short copy
 *     queue;
 *   - cancel frees a request's blocks at once.
 *
 * Every request ends with exactly one done or error to its router.
 *
 * A request's life: (WAITING ->) RUNNING <-> PREEMPTED -> gone; every move goes through s_move. */
#include <stdlib.h>
#include <string.h>

#include "actors/runtime/actor.h"
#include "actors/runtime/prefix_fetch.h"
#include "actors/runtime/worker.h"
#include "common/log.h"
#include "common/util.h"
#include "transfer/kv_chan.h"
#include "transfer/kv_copier.h"
#include "transfer/kv_link.h"
#include "transfer/kv_transfer.h"

#define WRITEBACK_TIMEOUT_MS  2000
#define MAX_WRITEBACKS        64
/* Write-backs queued for the copier beyond which one without a prompt_cache_key is shed: a deep
 * queue only delays the copies a next turn is waiting for (a fetch parks 300 ms at most). */
#define WRITEBACK_QUEUE_MAX   4

/* WAITING: its KV is here but the batch is full; PREEMPTED: its blocks were taken back. */
/* PROMPT: a colocated request (the topology has no prefill actors) whose prompt is computed here,
 * in chunks batched with the decode steps; its first token then makes it RUNNING (or WAITING). */
typedef enum { DC_WAITING, DC_RUNNING, DC_PREEMPTED, DC_PROMPT, DC_STATE_COUNT } dc_state_t;
static const char *const s_state_names[DC_STATE_COUNT] = {"waiting", "running", "preempted", "prompt"};

typedef struct dc_req {
    uint64_t id;                 /* the router's request id */
    msg_t handoff;               /* clone: owns prompt, sampling, reply_to */
    kvseq_t *kv;                 /* prompt + generated tokens whose KV is (to be) computed */
    sampler_t *smp;
    tok_stream_t ts;             /* streaming detokenizer */
    int32_t next;                /* sampled, not yet fed to the model */
    int n_gen;                   /* generated tokens (next included) */
    int32_t *gen;                /* [max_model_len] generated ids, for recompute */
    dc_state_t state;
    int64_t admitted_ms, first_ms;
    int prompt_done;             /* PROMPT: prompt tokens whose KV exists (-1: prefix not matched yet) */
    int prompt_started;          /* PROMPT: its first chunk was scheduled (cached_tokens is set) */
    uint64_t *hints;             /* PROMPT: the router's host-store hint hashes (a copy), n_hints */
    int n_hints;
    int fetching;                /* PROMPT: waiting for hints[fetch_from..] from the host store */
    int fetch_from;
    int64_t fetch_sent_ms;
    struct dc_req *next_req;
} dc_req_t;

/* A slot is in use from cache_put until the copy is announced and acked (or its deadline). */
typedef struct writeback {
    uint64_t transfer_id, request_id;
    kvseq_t *kv;                 /* the finished sequence, its blocks held while the copier reads them */
    tchan_seg_t seg;             /* the announced copy, mapped until acked or past its deadline */
    int64_t deadline_ms;
    int skip, n;                 /* the sequence's blocks [skip, skip + n) */
    int reserved;                /* between cache_put and the copy's submission */
} writeback_t;

typedef struct decode {
    worker_t *w;
    const char *name, *cluster;
    const char *cache_manager;   /* NULL when the topology has none */
    dc_req_t *head;              /* every request, admission order */
    int n_state[DC_STATE_COUNT]; /* requests in each state */
    model_seq_t *seqs;           /* [max_seqs] step scratch */
    dc_req_t **batch;
    int32_t *argmax;             /* [max_seqs] the device's ids of a step (argmax or sampled) */
    bk_sample_t *sample;         /* [max_seqs] each row's sampling parameters for the device */
    uint8_t *need_logits;        /* [max_seqs] rows whose logits the host sampler needs */
    char *text;                  /* [text_cap] emitted text of one token */
    size_t text_cap, text_len;
    writeback_t wb[MAX_WRITEBACKS];
    kvcopier_t *copier;          /* the write-backs' copies, off the decode loop */
    uint64_t next_transfer;
    kvlinks_t *links;            /* NCCL links from prefill workers on other GPUs */
    kvchan_t *chan;              /* how hand-offs' blocks come in, every channel (kv_chan.h) */
    /* stats */
    uint64_t tokens_out, finished, preemptions, handoffs_in, handoff_refused, writebacks, handoffs_ipc;
    uint64_t writeback_blocks;   /* blocks copied to the host store */
    uint64_t writebacks_shed;    /* write-backs left out under load (s_writeback) */
    /* Where the decode loop's time goes (ns): model steps, taking hand-offs in (the KV copy
     * included), handing write-backs to the copier (the copies run on its thread), recomputing
     * preempted requests. */
    uint64_t steps, forward_ns, handoff_ns, writeback_ns, recompute_ns;
    int colocated;               /* no prefill actors: prompts come here (prefill_request) */
    int chunk_tokens;            /* colocated: prompt tokens per step, all prompts together */
    uint64_t prompts, prompt_tokens_computed, prompt_tokens_cached;
    uint64_t prompt_ns;          /* the prompt chunks' share of the forward time (their compute rate) */
    prefix_fetch_t fetch;        /* colocated: host-store blocks into our pool */
    uint64_t last_tokens;
    int64_t last_stats_ms;
    double tokens_per_s;
    int last_batch;
} decode_t;

static void s_emit_text(void *ctx, const char *t, size_t n)
{
    decode_t *d = ctx;
    if (d->text_len + n + 1 > d->text_cap)
        n = d->text_cap - d->text_len - 1;
    memcpy(d->text + d->text_len, t, n);
    d->text_len += n;
    d->text[d->text_len] = 0;
}

/* The one place a request changes state, so the counts stay right. */
static void s_move(decode_t *d, dc_req_t *r, dc_state_t to, const char *why)
{
    LOG_D("request %llu: %s -> %s on %s", (unsigned long long)r->id, s_state_names[r->state], s_state_names[to], why);
    d->n_state[r->state]--;
    d->n_state[to]++;
    r->state = to;
}

/* Frees a request and everything it holds (NULL: nothing). */
static void s_req_free(dc_req_t *r)
{
    if (!r)
        return;
    kvseq_destroy(&r->kv);
    sampler_destroy(&r->smp);
    msg_free(&r->handoff);
    free(r->gen);
    free(r->hints);
    free(r);
}

static void s_unlink(decode_t *d, dc_req_t *r)
{
    for (dc_req_t **pp = &d->head; *pp; pp = &(*pp)->next_req)
        if (*pp == r) {
            *pp = r->next_req;
            break;
        }
    d->n_state[r->state]--;
    s_req_free(r);
}

/* The oldest request in state st (the list is newest first), or NULL. */
static dc_req_t *s_oldest(decode_t *d, dc_state_t st)
{
    dc_req_t *oldest = NULL;
    for (dc_req_t *r = d->head; r; r = r->next_req)
        if (r->state == st)
            oldest = r;
    return oldest;
}

static dc_req_t *s_find(decode_t *d, uint64_t id)
{
    for (dc_req_t *r = d->head; r; r = r->next_req)
        if (r->id == id)
            return r;
    return NULL;
}

static void s_error(actor_t *a, const char *to, uint64_t id, msg_error_code_t code, int retryable, const char *why)
{
    msg_t e;
    msg_init(&e, MSG_ERROR, id);
    e.u.error.code = code;
    e.u.error.retryable = retryable;
    e.u.error.message = why;
    actor_send(a, to, &e);
}

/* Writing a finished sequence's full blocks to the cache-manager's host store (best effort: a
 * refused or lost write-back only costs a future cache miss), in two halves around the request's
 * done. The prompt's leading blocks that were cache hits are left out: the request that computed
 * them wrote them back already (a conversation's next turn then copies only its new blocks, not
 * its whole history).
 *
 * First half, before done: decide, reserve a slot, and name the blocks to the cache-manager
 * (cache_put). It tells the routers at once, so a next turn routed the moment done arrives is
 * pointed at these blocks, and its fetch waits for them there instead of missing them. */
static writeback_t *s_writeback_put(actor_t *a, decode_t *d, dc_req_t *r)
{
    const msg_handoff_t *h = &r->handoff.u.handoff;
    if (!d->cache_manager || r->state == DC_PREEMPTED)
        return NULL;
    if (!(h->prompt_cache_key && *h->prompt_cache_key) &&
        (2 * d->n_state[DC_RUNNING] >= d->w->max_seqs || kvcopier_pending(d->copier) >= WRITEBACK_QUEUE_MAX)) {
        d->writebacks_shed++;
        return NULL;
    }
    const int skip = (int)(h->cached_tokens / (uint32_t)d->w->block_size);
    int full = kvseq_len(r->kv) / d->w->block_size - skip;
    if (full <= 0)
        return NULL;
    if (full > MSG_MAX_BLOCKS)
        full = MSG_MAX_BLOCKS;
    writeback_t *wb = NULL;
    for (int i = 0; i < MAX_WRITEBACKS && !wb; i++)
        if (!d->wb[i].seg.ptr && !d->wb[i].kv && !d->wb[i].reserved)
            wb = &d->wb[i];
    uint64_t *hashes = wb ? malloc((size_t)full * sizeof *hashes) : NULL;
    if (!hashes)
        return NULL;   /* too many in flight (or no memory): skip this one */
    for (int i = 0; i < full; i++)
        hashes[i] = kvseq_hash(r->kv, skip + i);
    wb->transfer_id = ++d->next_transfer;
    wb->skip = skip;
    wb->n = full;
    /* cache_put.id == kv_announce.transfer_id: the cache-manager pairs them. */
    msg_t put;
    msg_init(&put, MSG_CACHE_PUT, wb->transfer_id);
    put.u.cache_put.holder = d->name;
    put.u.cache_put.tier = MSG_TIER_HOST;
    put.u.cache_put.hashes = hashes;
    put.u.cache_put.n_hashes = (uint32_t)full;
    put.u.cache_put.parent_hash = skip ? kvseq_hash(r->kv, skip - 1) : 0;
    int rc = actor_send(a, d->cache_manager, &put);
    free(hashes);
    wb->reserved = rc == 0;
    return rc == 0 ? wb : NULL;
}

/* Second half, after done: the sequence (its blocks) moves from the request to the write-back and
 * the copier thread copies the blocks into a shared-memory segment; s_writeback_announce sends
 * it when done. A failure leaves the cache-manager's put without its blocks: it drops it at its
 * deadline. */
static void s_writeback_copy(decode_t *d, dc_req_t *r, writeback_t *wb)
{
    wb->reserved = 0;
    const void **src = malloc((size_t)wb->n * sizeof *src);
    const int32_t *blocks = kvseq_blocks(r->kv) + wb->skip;
    for (int i = 0; src && i < wb->n; i++)
        src[i] = kvpool_block_ptr(d->w->pool, blocks[i]);
    int rc = src ? kvcopier_submit(d->copier, wb->transfer_id | (1ULL << 62), src, wb->n, wb) : -1;
    free(src);
    if (rc != 0) {
        LOG_W("write-back of request %llu: no copier slot", (unsigned long long)r->id);
        return;
    }
    wb->request_id = r->id;
    wb->kv = r->kv;
    r->kv = NULL;
}

/* The copies the copier finished: announced to the cache-manager (it acks when stored), and the
 * sequences' blocks freed. */
static void s_writeback_announce(actor_t *a, decode_t *d)
{
    kvcopier_done_t done;
    while (d->copier && kvcopier_poll(d->copier, &done)) {
        writeback_t *wb = done.cookie;
        if (!done.ok) {
            LOG_W("write-back of request %llu: %s", (unsigned long long)wb->request_id, done.err);
        } else {
            wb->seg = done.seg;
            msg_t an;
            kvx_announce(&an, wb->transfer_id, wb->request_id, kvpool_view(d->w->pool),
                         (const uint32_t *)kvseq_blocks(wb->kv) + wb->skip, (uint32_t)wb->n, MSG_CHAN_SHM,
                         (const uint8_t *)wb->seg.name, (uint32_t)strlen(wb->seg.name), d->name, WRITEBACK_TIMEOUT_MS);
            if (actor_send(a, d->cache_manager, &an) != 0) {
                tchan_shm_close(&wb->seg);
            } else {
                wb->deadline_ms = now_ms() + WRITEBACK_TIMEOUT_MS;
                d->writebacks++;
                d->writeback_blocks += (uint64_t)wb->n;
            }
        }
        kvseq_destroy(&wb->kv);
    }
}

/* Ends a request: the write-back's blocks named, done to the router, the write-back's copy, free. */
static void s_finish(actor_t *a, decode_t *d, dc_req_t *r, msg_finish_t fin)
{
    const msg_handoff_t *h = &r->handoff.u.handoff;
    writeback_t *wb = s_writeback_put(a, d, r);
    msg_t m;
    msg_init(&m, MSG_DONE, r->id);
    m.u.done.finish = fin;
    m.u.done.usage.prompt_tokens = h->n_tokens;
    m.u.done.usage.cached_tokens = h->cached_tokens;
    m.u.done.usage.completion_tokens = (uint32_t)r->n_gen;
    m.u.done.timings.queue_ms = h->queue_ms;
    m.u.done.timings.prefill_ms = h->prefill_ms;
    m.u.done.timings.decode_ms = (uint32_t)(now_ms() - r->admitted_ms);
    actor_send(a, h->reply_to, &m);
    d->finished++;
    if (wb) {
        int64_t t0 = now_ns();
        s_writeback_copy(d, r, wb);
        d->writeback_ns += (uint64_t)(now_ns() - t0);
    }
    s_unlink(d, r);
}

/* Streams token t (the request's n_gen-th) with its text; returns the finish reason. */
static finish_reason_t s_emit(actor_t *a, decode_t *d, dc_req_t *r, int32_t t, float lp)
{
    finish_reason_t fin = sampler_accept(r->smp, t);
    d->text_len = 0;
    d->text[0] = 0;
    if (fin != FINISH_STOP && d->w->tok) {
        char piece[1024];
        size_t n = 0;
        if (tok_stream_feed(&r->ts, t, piece, sizeof piece, &n) == 0 && n &&
            sampler_text(r->smp, piece, n, s_emit_text, d))
            fin = FINISH_STOP;
    }
    if (fin != FINISH_NONE && d->w->tok) {
        char piece[1024];
        size_t n = 0;
        if (fin != FINISH_STOP && tok_stream_flush(&r->ts, piece, sizeof piece, &n) == 0 && n)
            sampler_text(r->smp, piece, n, s_emit_text, d);
        sampler_text_flush(r->smp, s_emit_text, d);
    }
    r->gen[r->n_gen++] = t;
    msg_t m;
    msg_init(&m, MSG_TOKEN, r->id);
    uint32_t tok = (uint32_t)t;
    m.u.token.seq = (uint32_t)(r->n_gen - 1);
    m.u.token.tokens = &tok;
    m.u.token.n_tokens = 1;
    m.u.token.text = d->text_len ? d->text : NULL;
    if (r->handoff.u.handoff.sampling.logprobs) {
        m.u.token.logprobs = &lp;
        m.u.token.n_logprobs = 1;
    }
    actor_send(a, r->handoff.u.handoff.reply_to, &m);
    d->tokens_out++;
    r->next = t;
    return fin;
}

static int s_on_kv_announce(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    char err[256];
    const msg_kv_announce_t *k = &m->u.kv_announce;
    if (d->colocated && d->cache_manager && strcmp(k->src, d->cache_manager) == 0) {
        /* Colocated: host-store blocks a prompt asked for (late ones, for a request that stopped
         * waiting, are refused). */
        dc_req_t *r = s_find(d, k->request_id);
        const int wanted = r && r->state == DC_PROMPT && r->fetching;
        prefix_fetch_take(a, &d->fetch, d->w, k, wanted, wanted ? r->hints : NULL, wanted ? r->n_hints : 0,
                          wanted ? r->fetch_from : 0, wanted ? r->fetch_sent_ms : 0);
        if (wanted)
            r->fetching = 0;
        return 0;
    }
    /* A hand-off's blocks are described inside its handoff message: nothing else is announced to
     * a decode worker. Refused, so the sender frees what it holds for it. */
    snprintf(err, sizeof err, "%s takes KV only inside a handoff or from its cache-manager", d->name);
    LOG_W("kv_announce %llu from %s refused: %s", (unsigned long long)k->transfer_id, k->src, err);
    kvx_ack(a, k->src, k->transfer_id, 0, err, NULL, 0);
    return 0;
}

static int s_take_handoff(actor_t *a, decode_t *d, msg_t *m);
static int s_writeback_reclaim(actor_t *a, decode_t *d);

static int s_on_handoff(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    int64_t t0 = now_ns();
    int rc = s_take_handoff(a, d, m);
    d->handoff_ns += (uint64_t)(now_ns() - t0);
    return rc;
}

static int s_take_handoff(actor_t *a, decode_t *d, msg_t *m)
{
    const msg_handoff_t *h = &m->u.handoff;
    const msg_kv_announce_t *an = h->n_kv ? &h->kv[0] : NULL;   /* its src is h->prefill_worker (schema) */
    char err[512];
    dc_req_t *r = NULL;
    int no_room = 0;
    const char *why = NULL;
    if (!an) {
        why = "handoff without its KV's transfer description";
    } else if (an->request_id != m->id) {
        why = "the handoff's KV description is for another request";
    } else if (s_find(d, m->id)) {
        why = "request already here";
    } else if (kvchan_check(d->chan, an, err, sizeof err) != 0) {
        why = err;
    } else if (h->kv_tokens != h->n_tokens ||
               an->n_block_ids != (h->n_tokens + (uint32_t)d->w->block_size - 1) / (uint32_t)d->w->block_size) {
        why = "the handoff's tokens and its KV description disagree on the number of blocks";
    } else if ((int)h->n_tokens + (int)h->sampling.max_tokens > d->w->max_model_len) {
        why = "prompt + max_tokens exceeds this worker's max_model_len";
    } else if (!(r = calloc(1, sizeof *r)) || msg_clone(m, &r->handoff, err, sizeof err) != 0 ||
               !(r->gen = malloc((size_t)d->w->max_model_len * sizeof *r->gen))) {
        why = "decode out of memory";
    } else {
        const msg_handoff_t *hh = &r->handoff.u.handoff;
        r->id = m->id;
        r->kv = kvseq_new(d->w->pool, d->w->max_model_len, hh->tenant_salt);
        sampler_params_t sp;
        if (!r->kv) {
            why = "decode out of memory";
        } else if (worker_sampler_params(d->w, &hh->sampling, &sp, err, sizeof err) != 0 ||
                   !(r->smp = sampler_new(&sp, d->w->cfg.vocab_size, (const int32_t *)hh->tokens, (int)hh->n_tokens, err, sizeof err))) {
            why = err;
        } else if (kvseq_append(r->kv, (const int32_t *)hh->tokens, (int)hh->n_tokens) != 0 &&
                   !(s_writeback_reclaim(a, d) && kvseq_append(r->kv, (const int32_t *)hh->tokens, (int)hh->n_tokens) == 0)) {
            /* No room for its blocks now: take the request over all the same, without its KV, as
             * a preempted one; its prompt is recomputed here when blocks free up. Only a prompt
             * that could never fit is refused. */
            if (an->n_block_ids + 1 > (uint32_t)kvpool_n_blocks(d->w->pool))
                why = "the prompt needs more KV blocks than the decode pool has";
            else
                no_room = 1;
        } else if (kvchan_recv(d->chan, an, kvseq_blocks(r->kv), kvseq_n_blocks(r->kv), err, sizeof err) != 0) {
            why = err;   /* the channel's own deadline bounds the wait: a dead or stalled sender ends here */
        }
    }
    if (an)   /* an NCCL hand-off refused or taken without its KV still takes its bytes off the link */
        kvchan_settle(d->chan, an);
    if (why) {
        d->handoff_refused++;
        LOG_W("hand-off of request %llu refused: %s", (unsigned long long)m->id, why);
        if (an)
            kvx_ack(a, an->src, an->transfer_id, 0, why, NULL, 0);
        s_req_free(r);
    } else {
        kvseq_publish(r->kv);
        kvx_ack(a, an->src, an->transfer_id, 1, NULL, (const uint32_t *)kvseq_blocks(r->kv), (uint32_t)kvseq_n_blocks(r->kv));
        d->handoffs_in++;
        d->handoffs_ipc += an->channel == MSG_CHAN_CUDA_IPC;
        /* A full batch does not refuse: the request waits here with its KV, its first token
         * streamed, and joins at the next step with a free slot. */
        r->state = no_room ? DC_PREEMPTED : d->n_state[DC_RUNNING] < d->w->max_seqs ? DC_RUNNING : DC_WAITING;
        d->preemptions += no_room;
        d->n_state[r->state]++;
        r->admitted_ms = r->first_ms = now_ms();
        if (d->w->tok) {
            tok_stream_init(&r->ts, d->w->tok);
            r->ts.skip_special = 1;
        }
        r->next_req = d->head;
        d->head = r;
        finish_reason_t fin = s_emit(a, d, r, (int32_t)h->first_token, h->first_logprob);
        if (fin != FINISH_NONE)
            s_finish(a, d, r, fin == FINISH_LENGTH ? MSG_FINISH_LENGTH : MSG_FINISH_STOP);
    }
    return 0;
}

/* Colocated (no prefill actors): the router sends the prompt here. The request is kept as if a
 * prefill worker had handed it over (the same handoff fields: sampling, reply_to, cache key), in
 * state PROMPT until s_step has computed its prompt and sampled its first token. */
static int s_on_prefill_request(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    const msg_prefill_request_t *q = &m->u.prefill_request;
    char err[512] = "decode out of memory";
    if (!d->colocated)
        return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0,
                                 "prefill_request at decode worker %s: the topology has prefill workers", d->name), 0;
    if (s_find(d, m->id))
        return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "request %llu is already here",
                                 (unsigned long long)m->id), 0;
    if ((int)q->n_tokens + (int)q->sampling.max_tokens > d->w->max_model_len)
        return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0,
                                 "prompt (%u tokens) + max_tokens (%u) exceeds max_model_len %d", q->n_tokens,
                                 q->sampling.max_tokens, d->w->max_model_len), 0;
    for (uint32_t i = 0; i < q->n_tokens; i++)
        if (q->tokens[i] >= (uint32_t)d->w->cfg.vocab_size)
            return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "token id %u at %u is outside the vocabulary (%d)",
                                     q->tokens[i], i, d->w->cfg.vocab_size), 0;
    if ((int)((q->n_tokens + (uint32_t)d->w->block_size - 1) / (uint32_t)d->w->block_size) + 1 > kvpool_n_blocks(d->w->pool))
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1,
                                 "the prompt (%u tokens) needs more KV blocks than the decode pool has (%d)", q->n_tokens,
                                 kvpool_n_blocks(d->w->pool)), 0;
    msg_t h;
    msg_init(&h, MSG_HANDOFF, m->id);
    h.u.handoff = (msg_handoff_t){.tokens = q->tokens, .n_tokens = q->n_tokens, .sampling = q->sampling,
                                  .tokens_left = q->sampling.max_tokens > 0 ? q->sampling.max_tokens - 1 : 0,
                                  .kv_tokens = q->n_tokens,
                                  .block_size = (uint32_t)d->w->block_size, .reply_to = q->reply_to,
                                  .prefill_worker = d->name, .tenant_salt = q->tenant_salt,
                                  .prompt_cache_key = q->prompt_cache_key, .cache_retention_s = q->cache_retention_s,
                                  .queue_ms = q->queue_ms, .deadline_ms = q->deadline_ms};
    dc_req_t *r = calloc(1, sizeof *r);
    sampler_params_t sp;
    const char *why = NULL;
    if (!r || msg_clone(&h, &r->handoff, err, sizeof err) != 0 ||
        !(r->gen = malloc((size_t)d->w->max_model_len * sizeof *r->gen))) {
        why = err;
    } else if (!(r->kv = kvseq_new(d->w->pool, d->w->max_model_len, q->tenant_salt))) {
        why = "decode out of memory";
    } else if (worker_sampler_params(d->w, &q->sampling, &sp, err, sizeof err) != 0 ||
               !(r->smp = sampler_new(&sp, d->w->cfg.vocab_size, (const int32_t *)q->tokens, (int)q->n_tokens, err,
                                      sizeof err))) {
        why = err;
    }
    if (why) {
        s_req_free(r);
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "%s", why), 0;
    }
    r->id = m->id;
    r->state = DC_PROMPT;
    r->prompt_done = -1;
    r->admitted_ms = now_ms();
    /* Blocks the host store holds and our pool lacks are fetched before the prompt's first chunk
     * (when that is cheaper than computing them). */
    if (q->n_hint_hashes && (r->hints = malloc(q->n_hint_hashes * sizeof *r->hints))) {
        memcpy(r->hints, q->hint_hashes, q->n_hint_hashes * sizeof *r->hints);
        r->n_hints = (int)q->n_hint_hashes;
        const double rate = d->prompt_ns ? (double)d->prompt_tokens_computed * 1e9 / (double)d->prompt_ns : 0;
        const int first = prefix_fetch_start(a, &d->fetch, d->w, r->id, r->hints, r->n_hints, rate);
        if (first >= 0) {
            r->fetching = 1;
            r->fetch_from = first;
            r->fetch_sent_ms = now_ms();
        }
    }
    if (d->w->tok) {
        tok_stream_init(&r->ts, d->w->tok);
        r->ts.skip_special = 1;
    }
    d->n_state[DC_PROMPT]++;
    r->next_req = d->head;
    d->head = r;
    d->prompts++;
    return 0;
}

/* Colocated: adds prompt chunks of PROMPT requests (oldest first) to the step's batch after its
 * n decode rows (so rows from n on are prompt chunks), within d->chunk_tokens tokens and the
 * batch's sequence limit. Returns the new row count; *stuck is the prompt that found no room (it
 * waits for a later step), if any. */
static int s_add_prompts(actor_t *a, decode_t *d, int n, dc_req_t **stuck)
{
    *stuck = NULL;
    /* Preempted requests come back first (s_recompute): new prompts would take their blocks. */
    if (d->n_state[DC_PREEMPTED])
        return n;
    /* The 64 oldest prompts (the list is newest first: skip the newer ones). */
    enum { MAX_ORDER = 64 };
    dc_req_t *order[MAX_ORDER];
    int n_order = 0, skip = d->n_state[DC_PROMPT] - MAX_ORDER;
    for (dc_req_t *r = d->head; r && n_order < MAX_ORDER; r = r->next_req)
        if (r->state == DC_PROMPT && skip-- <= 0)
            order[n_order++] = r;
    /* Every running request keeps a free block for its next tokens: a prompt must not take the
     * blocks the batch it joins needs (that preempted running requests, or failed a lone one). */
    const int reserve = n, bs = d->w->block_size;
    int budget = d->chunk_tokens;
    const int64_t now = now_ms();
    for (int i = n_order - 1; i >= 0 && budget > 0 && n < d->w->max_seqs; i--) {
        dc_req_t *r = order[i];
        if (r->fetching && now - r->fetch_sent_ms <= FETCH_TIMEOUT_MS)
            continue;   /* its cached blocks are on their way */
        if (r->fetching) {
            prefix_fetch_timed_out(&d->fetch, r->n_hints - r->fetch_from, r->fetch_sent_ms);
            r->fetching = 0;
        }
        const msg_handoff_t *h = &r->handoff.u.handoff;
        const int32_t *prompt = (const int32_t *)h->tokens;
        const int n_prompt = (int)h->n_tokens;
        if (r->prompt_done < 0) {   /* first chunk: adopt every cached prefix block of the pool */
            int cached = kvseq_match_prefix(r->kv, prompt, n_prompt);
            r->prompt_done = cached > 0 ? cached : 0;
            if (!r->prompt_started) {   /* not again after giving its blocks back (its own, then) */
                r->prompt_started = 1;
                r->handoff.u.handoff.cached_tokens = (uint32_t)r->prompt_done;
                d->prompt_tokens_cached += (uint64_t)r->prompt_done;
            }
        }
        int k = n_prompt - r->prompt_done < budget ? n_prompt - r->prompt_done : budget;
        const int need = (kvseq_len(r->kv) + k + bs - 1) / bs - kvseq_n_blocks(r->kv);
        const int room = kvpool_free_count(d->w->pool) - need >= reserve ||
                         (s_writeback_reclaim(a, d) && kvpool_free_count(d->w->pool) - need >= reserve);
        if (!room || kvseq_append(r->kv, prompt + r->prompt_done, k) != 0) {
            *stuck = r;
            break;   /* no room now: the oldest prompt keeps its turn */
        }
        budget -= k;
        d->seqs[n] = (model_seq_t){.kv = r->kv, .n_new = k};
        d->batch[n++] = r;
    }
    return n;
}

/* Colocated: after the step, a prompt chunk's KV is published; the chunk that ends the prompt gives
 * the request its first token (t, lp), as a prefill worker's hand-off would. */
static void s_prompt_done(actor_t *a, decode_t *d, dc_req_t *r, int k, int32_t t, float lp)
{
    kvseq_publish(r->kv);
    r->prompt_done += k;
    d->prompt_tokens_computed += (uint64_t)k;
    if (r->prompt_done < (int)r->handoff.u.handoff.n_tokens)
        return;
    r->handoff.u.handoff.prefill_ms = (uint32_t)(now_ms() - r->admitted_ms);
    worker_publish_blocks(a, d->name, d->cache_manager, r->kv, d->w->block_size);
    s_move(d, r, d->n_state[DC_RUNNING] < d->w->max_seqs ? DC_RUNNING : DC_WAITING, "prompt computed");
    r->admitted_ms = r->first_ms = now_ms();
    finish_reason_t fin = s_emit(a, d, r, t, lp);
    if (fin != FINISH_NONE)
        s_finish(a, d, r, fin == FINISH_LENGTH ? MSG_FINISH_LENGTH : MSG_FINISH_STOP);
}

/* Colocated: the host store had none of the blocks asked for. */
static int s_on_fetch_reply(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    dc_req_t *r = s_find(d, m->id);
    if (r && r->state == DC_PROMPT && r->fetching && m->u.cache_fetch_reply.found == 0)
        r->fetching = 0;
    return 0;
}

static int s_on_cancel(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    dc_req_t *r = s_find(d, m->id);
    if (r)
        s_unlink(d, r);
    return 0;
}

static int s_on_kv_link(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    return kvlinks_on_msg(d->links, m);
}

static int s_poll_links(actor_t *a, void *state)
{
    decode_t *d = state;
    kvlinks_poll(d->links);
    return 0;
}

static int s_link_send(void *ctx, const char *to, const msg_t *m) { return actor_send(ctx, to, m); }

/* Colocated: wakes the loop now and then, so a fetch that is never answered is given up on time
 * (s_add_prompts) even when no message comes. */
static int s_wake(actor_t *a, void *state) { return 0; }

/* A prefill worker's process came or went: its NCCL link is aborted at once, or may come again. */
static void s_peer_event(actor_t *a, void *state, const char *peer, int up)
{
    decode_t *d = state;
    kvlinks_peer_event(d->links, peer, up);
}

static int s_on_kv_ack(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    for (int i = 0; i < MAX_WRITEBACKS; i++)
        if (d->wb[i].seg.ptr && d->wb[i].transfer_id == m->u.kv_ack.transfer_id)
            tchan_shm_close(&d->wb[i].seg);
    return 0;
}

/* Out of blocks: finished sequences still held by write-back copies give theirs back first (the
 * copies are waited for). 1 if that freed any. */
static int s_writeback_reclaim(actor_t *a, decode_t *d)
{
    int held = 0;
    for (int i = 0; i < MAX_WRITEBACKS; i++)
        held |= d->wb[i].kv != NULL;
    if (!held)
        return 0;
    kvcopier_drain(d->copier);
    s_writeback_announce(a, d);
    return 1;
}

/* Frees blocks: a part-computed prompt other than keep gives its blocks back (colocated), else the
 * newest running request is preempted (never the last one). 0 when blocks were freed. */
static int s_preempt_one(decode_t *d, const dc_req_t *keep)
{
    /* Colocated: a prompt part-way through gives its blocks back first (it starts over later,
     * reusing whatever of them is still cached), before a running request loses its KV. */
    dc_req_t *prompt = NULL;
    for (dc_req_t *r = d->head; r && !prompt; r = r->next_req)   /* the newest first */
        if (r->state == DC_PROMPT && r != keep && kvseq_n_blocks(r->kv) > 0)
            prompt = r;
    if (prompt) {
        LOG_I("request %llu: its part-computed prompt gives its KV blocks back (pool full)",
              (unsigned long long)prompt->id);
        kvseq_release(prompt->kv);
        prompt->prompt_done = -1;
        return 0;
    }
    dc_req_t *victim = NULL;
    for (dc_req_t *r = d->head; r; r = r->next_req)
        if (r->state == DC_RUNNING && (!victim || r->admitted_ms > victim->admitted_ms))
            victim = r;
    if (!victim || d->n_state[DC_RUNNING] <= 1)
        return -1;
    LOG_I("request %llu preempted (KV pool full); its KV will be recomputed", (unsigned long long)victim->id);
    kvseq_release(victim->kv);
    s_move(d, victim, DC_PREEMPTED, "KV pool full");
    d->preemptions++;
    return 0;
}

/* Brings a preempted request back: recomputes the KV of its prompt and every generated token but
 * the last (which the next step feeds), in chunks of the forward's token budget. */
static int s_recompute(actor_t *a, decode_t *d, dc_req_t *r)
{
    const msg_handoff_t *h = &r->handoff.u.handoff;
    int n_total = (int)h->n_tokens + r->n_gen - 1;
    int need = (n_total + 1 + d->w->block_size - 1) / d->w->block_size;
    if (kvpool_free_count(d->w->pool) < need + 1 && !(s_writeback_reclaim(a, d) && kvpool_free_count(d->w->pool) >= need + 1))
        return 0;
    int32_t *all = malloc((size_t)n_total * sizeof *all);
    if (!all)
        return 0;
    memcpy(all, h->tokens, h->n_tokens * sizeof *all);
    memcpy(all + h->n_tokens, r->gen, (size_t)(r->n_gen - 1) * sizeof *all);
    int done = kvseq_match_prefix(r->kv, all, n_total);
    if (done < 0)
        done = 0;
    char err[256];
    while (done < n_total) {
        int k = n_total - done < d->w->max_tokens ? n_total - done : d->w->max_tokens;
        model_seq_t s = {.kv = r->kv, .n_new = k};
        model_batch_t b = {.n_seqs = 1, .seqs = &s};
        if (kvseq_append(r->kv, all + done, k) != 0 || model_forward(d->w->model, &b, d->w->logits, err, sizeof err) != 0) {
            free(all);
            kvseq_release(r->kv);
            return 0;
        }
        done += k;
    }
    free(all);
    kvseq_publish(r->kv);
    s_move(d, r, DC_RUNNING, "recomputed");
    LOG_I("request %llu resumed after recomputing %d tokens", (unsigned long long)r->id, n_total);
    return 1;
}

/* One decode step for the whole running batch. Returns 1 if it did work. */
static int s_step(actor_t *a, void *state)
{
    decode_t *d = state;
    s_writeback_announce(a, d);
    int64_t now = now_ms();
    for (int i = 0; i < MAX_WRITEBACKS; i++)
        if (d->wb[i].seg.ptr && now > d->wb[i].deadline_ms)
            tchan_shm_close(&d->wb[i].seg);
    /* Copies in flight: come back soon (a busy loop, no sleep) to announce them. */
    const int copying = d->copier && kvcopier_pending(d->copier) > 0;
    /* Preempted requests come back first when blocks allow (oldest first). */
    if (d->n_state[DC_PREEMPTED] && d->n_state[DC_RUNNING] < d->w->max_seqs) {
        int64_t t0 = now_ns();
        int resumed = 0;
        for (dc_req_t *r = d->head; r && !resumed; r = r->next_req)
            if (r->state == DC_PREEMPTED)
                resumed = s_recompute(a, d, r);
        d->recompute_ns += (uint64_t)(now_ns() - t0);
        /* None came back and no other request holds KV: part-computed prompts give their blocks
         * back; when none holds any, the pool is empty and the oldest preempted request, which
         * does not fit in it, never will. */
        if (!resumed && d->n_state[DC_RUNNING] == 0 && d->n_state[DC_WAITING] == 0 && s_preempt_one(d, NULL) != 0) {
            dc_req_t *r = s_oldest(d, DC_PREEMPTED);
            char why[160];
            snprintf(why, sizeof why, "KV pool exhausted: %d tokens need more blocks than the pool has",
                     (int)r->handoff.u.handoff.n_tokens + r->n_gen);
            s_error(a, r->handoff.u.handoff.reply_to, r->id, MSG_ERR_OVERLOADED, 1, why);
            s_unlink(d, r);
            return 1;
        }
    }
    /* Waiting requests take free batch slots, oldest first (the list is newest first). */
    while (d->n_state[DC_WAITING] && d->n_state[DC_RUNNING] < d->w->max_seqs)
        s_move(d, s_oldest(d, DC_WAITING), DC_RUNNING, "a batch slot freed");
    if (d->n_state[DC_RUNNING] == 0 && d->n_state[DC_PROMPT] == 0)
        return copying;
    /* Each running request feeds its last token; preempt until everyone has a slot. */
    int n = 0;
    for (dc_req_t *r = d->head; r; r = r->next_req) {
        if (r->state != DC_RUNNING)
            continue;
        while (kvseq_append(r->kv, &r->next, 1) != 0) {
            if (s_writeback_reclaim(a, d))
                continue;
            if (s_preempt_one(d, NULL) != 0) {
                /* Alone and still out of blocks: it can never finish here. */
                char why[128];
                snprintf(why, sizeof why, "KV pool exhausted at %d tokens", kvseq_len(r->kv));
                s_error(a, r->handoff.u.handoff.reply_to, r->id, MSG_ERR_OVERLOADED, 1, why);
                s_unlink(d, r);
                return 1;
            }
            if (r->state != DC_RUNNING)
                break;
        }
        if (r->state != DC_RUNNING)
            continue;
        d->seqs[n] = (model_seq_t){.kv = r->kv, .n_new = 1};
        d->batch[n++] = r;
    }
    /* A request preempted after it was batched must leave the batch. */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (d->batch[i]->state == DC_RUNNING) {
            d->seqs[m] = d->seqs[i];
            d->batch[m++] = d->batch[i];
        }
    n = m;
    const int n_decode = n;
    dc_req_t *stuck = NULL;
    if (d->n_state[DC_PROMPT])
        n = s_add_prompts(a, d, n, &stuck);
    if (n == 0) {
        /* Nothing runs. The prompt that found no room gets the blocks other part-computed prompts
         * hold; when none holds any, it never fits here (prompts waiting for fetched blocks are
         * not out of room: the loop sleeps until the answer comes). */
        if (!stuck || d->n_state[DC_RUNNING] != 0)
            return copying;
        if (s_preempt_one(d, stuck) != 0) {
            s_error(a, stuck->handoff.u.handoff.reply_to, stuck->id, MSG_ERR_OVERLOADED, 1,
                    "the prompt needs more KV blocks than the decode pool has free");
            s_unlink(d, stuck);
        }
        return 1;
    }
    d->last_batch = n_decode;
    /* Requests take their token from the device (argmax, or the backend's sample op: temperature,
     * top-k, top-p, min-p, seed); only those with penalties or log-probabilities need their row of
     * logits brought to the host (and every non-greedy one on a backend without the op). */
    const int dev_sample = d->w->be->ops->sample != NULL;
    int any_sampled = 0;   /* a row the device samples (not greedy, no host logits needed) */
    for (int i = 0; i < n; i++) {
        const dc_req_t *r = d->batch[i];
        /* A prompt chunk that does not end its prompt: its row's token is not used. */
        const int used = i < n_decode || r->prompt_done + d->seqs[i].n_new == (int)r->handoff.u.handoff.n_tokens;
        d->need_logits[i] = used && (sampler_needs_host(r->smp) || r->handoff.u.handoff.sampling.logprobs ||
                                     (!dev_sample && !sampler_is_greedy(r->smp)));
        any_sampled |= used && !d->need_logits[i] && !sampler_is_greedy(r->smp);
    }
    for (int i = 0; any_sampled && i < n; i++)
        sampler_device_params(d->batch[i]->smp, &d->sample[i]);
    /* An all-greedy step keeps the plain argmax (the sample op's greedy rows give the same ids). */
    model_batch_t b = {.n_seqs = n, .seqs = d->seqs, .argmax_out = d->argmax, .need_logits = d->need_logits,
                       .sample = any_sampled ? d->sample : NULL};
    char err[512];
    int64_t t0 = now_ns();
    int frc = model_forward(d->w->model, &b, d->w->logits, err, sizeof err);
    const uint64_t step_ns = (uint64_t)(now_ns() - t0);
    d->forward_ns += step_ns;
    if (n > n_decode) {   /* the prompt chunks' share of the step, by tokens: their compute rate */
        uint64_t prompt_tokens = 0;
        for (int i = n_decode; i < n; i++)
            prompt_tokens += (uint64_t)d->seqs[i].n_new;
        d->prompt_ns += step_ns * prompt_tokens / (prompt_tokens + (uint64_t)n_decode);
    }
    d->steps++;
    if (frc != 0) {
        LOG_E("forward: %s", err);
        for (int i = 0; i < n; i++) {
            s_error(a, d->batch[i]->handoff.u.handoff.reply_to, d->batch[i]->id, MSG_ERR_INTERNAL, 1, err);
            s_unlink(d, d->batch[i]);
        }
        return 1;
    }
    for (int i = 0; i < n; i++) {
        dc_req_t *r = d->batch[i];
        /* The log-probability costs a softmax over the vocabulary: only when it was asked for. */
        float lp = 0;
        int32_t t = d->need_logits[i] ? sampler_sample(r->smp, d->w->logits + (size_t)i * (size_t)d->w->cfg.vocab_size,
                                                       r->handoff.u.handoff.sampling.logprobs ? &lp : NULL)
                                      : d->argmax[i];
        if (i >= n_decode) {   /* a prompt chunk */
            s_prompt_done(a, d, r, d->seqs[i].n_new, t, lp);
            continue;
        }
        kvseq_publish(r->kv);
        finish_reason_t fin = s_emit(a, d, r, t, lp);
        if (fin == FINISH_NONE && kvseq_len(r->kv) + 1 >= d->w->max_model_len)
            fin = FINISH_LENGTH;
        if (fin != FINISH_NONE)
            s_finish(a, d, r, fin == FINISH_LENGTH ? MSG_FINISH_LENGTH : MSG_FINISH_STOP);
    }
    return 1;
}

static int s_drained(actor_t *a, void *state)
{
    decode_t *d = state;
    return d->head == NULL;
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    decode_t *d = state;
    int64_t now = now_ms();
    if (d->last_stats_ms && now > d->last_stats_ms)
        d->tokens_per_s = (double)(d->tokens_out - d->last_tokens) * 1000.0 / (double)(now - d->last_stats_ms);
    d->last_stats_ms = now;
    d->last_tokens = d->tokens_out;
    actor_stat_queue(a, st, "running", (uint64_t)d->n_state[DC_RUNNING], (uint64_t)d->w->max_seqs);
    actor_stat_queue(a, st, "waiting", (uint64_t)d->n_state[DC_WAITING], 0);
    actor_stat_queue(a, st, "preempted", (uint64_t)d->n_state[DC_PREEMPTED], 0);
    actor_stat_metric(a, st, "requests_running", d->n_state[DC_RUNNING], 0);
    actor_stat_metric(a, st, "requests_waiting", d->n_state[DC_WAITING] + d->n_state[DC_PREEMPTED], 0);
    actor_stat_metric(a, st, "batch_size", d->n_state[DC_RUNNING] ? d->last_batch : 0, 0);
    actor_stat_metric(a, st, "tokens_per_s", d->tokens_per_s, 0);
    actor_stat_metric(a, st, "kv_blocks_free", kvpool_free_count(d->w->pool), 0);
    actor_stat_metric(a, st, "kv_blocks_used", kvpool_n_blocks(d->w->pool) - kvpool_free_count(d->w->pool), 0);
    actor_stat_metric(a, st, "generation_tokens_total", (double)d->tokens_out, 1);
    actor_stat_metric(a, st, "requests_finished_total", (double)d->finished, 1);
    actor_stat_metric(a, st, "preemptions_total", (double)d->preemptions, 1);
    actor_stat_metric(a, st, "transfers_total", (double)d->handoffs_in, 1);
    actor_stat_metric(a, st, "transfer_failures_total", (double)d->handoff_refused, 1);
    actor_stat_metric(a, st, "writebacks_total", (double)d->writebacks, 1);
    actor_stat_metric(a, st, "writeback_blocks_total", (double)d->writeback_blocks, 1);
    actor_stat_metric(a, st, "writebacks_shed_total", (double)d->writebacks_shed, 1);
    actor_stat_metric(a, st, "writebacks_copying", d->copier ? kvcopier_pending(d->copier) : 0, 0);
    actor_stat_metric(a, st, "transfers_cuda_ipc_total", (double)d->handoffs_ipc, 1);
    actor_stat_metric(a, st, "transfers_tcp_total", (double)kvchan_count(d->chan, MSG_CHAN_TCP), 1);
    actor_stat_metric(a, st, "transfers_nccl_total", (double)kvlinks_transfers(d->links), 1);
    actor_stat_metric(a, st, "nccl_links_ready", kvlinks_ready(d->links), 0);
    actor_stat_metric(a, st, "steps_total", (double)d->steps, 1);
    actor_stat_metric(a, st, "forward_seconds_total", (double)d->forward_ns / 1e9, 1);
    actor_stat_metric(a, st, "handoff_seconds_total", (double)d->handoff_ns / 1e9, 1);
    actor_stat_metric(a, st, "writeback_seconds_total", (double)d->writeback_ns / 1e9, 1);
    actor_stat_metric(a, st, "recompute_seconds_total", (double)d->recompute_ns / 1e9, 1);
    if (d->colocated) {   /* the prompts it computes itself */
        actor_stat_metric(a, st, "requests_prompting", d->n_state[DC_PROMPT], 0);
        actor_stat_metric(a, st, "prompts_total", (double)d->prompts, 1);
        actor_stat_metric(a, st, "computed_tokens_total", (double)d->prompt_tokens_computed, 1);
        actor_stat_metric(a, st, "cached_tokens_total", (double)d->prompt_tokens_cached, 1);
        prefix_fetch_stats(a, st, &d->fetch);
    }
}

static const actor_handler_t s_handlers[] = {
    {MSG_KV_ANNOUNCE, s_on_kv_announce},
    {MSG_HANDOFF, s_on_handoff},
    {MSG_PREFILL_REQUEST, s_on_prefill_request},
    {MSG_CACHE_FETCH_REPLY, s_on_fetch_reply},
    {MSG_CANCEL, s_on_cancel},
    {MSG_KV_ACK, s_on_kv_ack},
    {MSG_KV_LINK, s_on_kv_link},
};

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_DECODE);
    if (!a)
        return 2;
    const topo_t *t = actor_topo(a);
    decode_t d = {.name = actor_self(a)->name, .cluster = t->name};
    const topo_instance_t *cm = topo_first(t, ROLE_CACHE_MANAGER);
    d.cache_manager = cm ? cm->name : NULL;
    char err[1024];
    int max_seqs = t->limits.max_batch;
    /* Colocated: a step holds the decode rows and up to prefill_chunk_tokens prompt tokens. */
    d.colocated = topo_first(t, ROLE_PREFILL) == NULL;
    d.chunk_tokens = t->limits.prefill_chunk_tokens;
    if (prefix_fetch_init(&d.fetch, d.name, d.cache_manager, err, sizeof err) != 0) {
        LOG_E("%s", err);
        actor_destroy(&a);
        return 2;
    }
    if (d.colocated && d.cache_manager)
        actor_timer_add(a, FETCH_TIMEOUT_MS / 10, s_wake);
    const int max_tokens = d.colocated ? max_seqs + d.chunk_tokens
                                       : max_seqs > d.chunk_tokens ? max_seqs : d.chunk_tokens;
    int config_error;
    d.w = worker_load(t, ROLE_DECODE, actor_self(a)->gpu, max_tokens, max_seqs, &config_error, err, sizeof err);
    if (!d.w) {
        LOG_E("cannot load the model: %s", err);
        actor_destroy(&a);
        return config_error ? ACTOR_EXIT_CONFIG : 1;
    }
    d.links = kvlinks_new(d.w->be, d.name, worker_block_bytes(d.w), NULL, s_link_send, a);
    kvchan_cfg_t cc = {.be = d.w->be, .pool = d.w->pool, .topo = t, .self = actor_self(a), .cluster = t->name,
                       .zmq_ctx = actor_zmq_ctx(a), .links = d.links};
    d.chan = kvchan_new(&cc, err, sizeof err);
    if (tchan_nccl_available(d.w->be)) {
        actor_timer_add(a, KVLINK_POLL_MS, s_poll_links);
        for (int i = 0; i < t->n_instances; i++)
            if (t->instances[i].role == ROLE_PREFILL)
                actor_watch(a, t->instances[i].name);
    }
    d.seqs = calloc((size_t)max_seqs, sizeof *d.seqs);
    d.batch = calloc((size_t)max_seqs, sizeof *d.batch);
    d.argmax = calloc((size_t)max_seqs, sizeof *d.argmax);
    d.sample = calloc((size_t)max_seqs, sizeof *d.sample);
    d.need_logits = calloc((size_t)max_seqs, 1);
    d.next_transfer = kvx_first_id();
    d.text_cap = 8192;
    d.text = malloc(d.text_cap);
    /* Write-backs go to the cache-manager's store: no copier thread without one. */
    d.copier = d.cache_manager ? kvcopier_new(d.w->be, d.cluster, worker_block_bytes(d.w), MAX_WRITEBACKS) : NULL;
    int rc = -1;
    if (!d.links || !d.chan || !d.seqs || !d.batch || !d.argmax || !d.sample || !d.need_logits || !d.text ||
        (d.cache_manager && !d.copier)) {
        LOG_E("out of memory for a batch of %d", max_seqs);
    } else {
        tchan_shm_sweep(t->name);
        actor_ops_t ops = {.handlers = s_handlers, .n_handlers = ARRAY_LEN(s_handlers), .before_sleep = s_step,
                           .fill_stats = s_fill_stats, .drained = s_drained,
                           .peer_event = s_peer_event};
        rc = actor_run(a, &ops, &d);
    }
    kvchan_destroy(&d.chan);
    kvlinks_destroy(&d.links);
    kvcopier_destroy(&d.copier);   /* before the sequences it may be reading are freed */
    for (int i = 0; i < MAX_WRITEBACKS; i++)
        kvseq_destroy(&d.wb[i].kv);
    while (d.head)
        s_unlink(&d, d.head);
    for (int i = 0; i < MAX_WRITEBACKS; i++)
        tchan_shm_close(&d.wb[i].seg);
    free(d.seqs);
    free(d.batch);
    free(d.argmax);
    free(d.sample);
    free(d.need_logits);
    free(d.text);
    worker_destroy(&d.w);
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
