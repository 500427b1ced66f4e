/* actors/prefill.c — the prefill worker: prompt forward passes, then the KV hand-off to decode.
 *
 * Duties:
 *   - queue prefill_requests from the router (FIFO);
 *   - each step, fill a token budget (limits.prefill_chunk_tokens) with prompt chunks of as many
 *     requests as fit (chunked prefill), reusing every cached prefix block of the local pool first
 *     (kvseq_match_prefix: blocks of earlier requests, or fetched from the cache-manager's store
 *     when that is cheaper than computing them again: actors/worker/fetch_policy.h);
 *   - when a prompt is complete: sample the first token and hand the request over to the decode
 *     worker the router chose (actors/worker/handoff_out.h: its KV blocks by the pair's channel,
 *     one handoff message carrying the transfer's description, an NCCL failure retried through
 *     the fallback); free the blocks once the decode side acknowledges, or fail the request with
 *     a retryable error when it refuses or does not answer within HANDOFF_TIMEOUT_MS;
 *   - tell the cache-manager which full blocks this worker now holds (cache_put, device tier,
 *     after the first hand-off);
 *   - cancel frees everything a request holds;
 *   - MoE models: every experts.window_steps forwards, the window's tokens per (layer, expert) to
 *     the expert-balancer as expert_load (actors/worker/expert_report.h), as decode workers do.
 *
 * A request's life is engine/sched.h's for a prompts-only worker: PROMPTING (held while a fetch
 * is in flight) -> PROMPTED (handing off) -> gone; the scheduler decides each step's chunks.
 *
 * Known limits: one backend stream; the whole prompt must fit in the KV pool at once. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "actors/runtime/actor.h"
#include "actors/worker/worker.h"
#include "actors/worker/expert_report.h"
#include "actors/worker/handoff_out.h"
#include "actors/worker/prefix_fetch.h"
#include "actors/worker/router_watch.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/sched.h"

typedef struct pf_req {
    sched_req_t sr;              /* first: the scheduler's handle (id, state, prompt = msg's token ids,
                                  * cached and computed tokens, arrival and start times) */
    msg_t msg;                   /* clone of the prefill_request: owns the prompt */
    kvseq_t *kv;                 /* its tokens and blocks in our pool */
    handoff_out_req_t ho;        /* PROMPTED: its hand-off (the message's body points into msg, first_top) */
    int32_t first_token;         /* sampled at the end of the prompt (kept for a retried hand-off) */
    float first_lp;
    sampler_top_t first_top;     /* its position's most likely tokens (sampling.top_logprobs) */
    int fetching;                /* its prompt is held for host-store blocks (sched_hold) */
    fetch_src_t fetched;         /* its fetch: the first hint block asked for, the blocks taken and
                                  * which came from disk (for the hand-off's cached tokens by source) */
    int64_t fetch_sent_ms;       /* fetching: when the fetch went out (its cost, for p->fetch_policy) */
} pf_req_t;
_Static_assert(offsetof(pf_req_t, sr) == 0, "the scheduler's handle is the request");

typedef struct prefill {
    worker_t *w;
    const char *name;            /* our instance name */
    actor_t *a;
    sched_t *sched;              /* every request: the prompts' chunks, then the hand-offs */
    model_seq_t *seqs;           /* [max_seqs] scratch for a step */
    handoff_out_t out;           /* the hand-offs in flight, and the ways their blocks go out */
    const char *cache_manager;   /* NULL when the topology has none */
    /* counters for stats */
    uint64_t prompts, prompt_tokens, computed_tokens, cached_tokens;
    uint64_t steps, forward_ns;  /* model forwards and the time they took */
    expert_report_t *experts;    /* expert_load windows to the expert-balancer, as decode sends; NULL: none */
    prefix_fetch_t fetch;        /* host-store blocks into our pool (and its counters) */
    double tokens_per_s;         /* computed tokens per second over the last stats interval */
    uint64_t last_computed;
    int64_t last_stats_ms;
    router_watch_t routers;      /* the routers our requests belong to: a lost one's are dropped */
} prefill_t;

static void s_remove(prefill_t *p, pf_req_t *r)
{
    sched_remove(p->sched, &r->sr);
    handoff_out_release(&p->out, &r->ho);
    kvseq_destroy(&r->kv);
    fetch_src_clear(&r->fetched);
    msg_free(&r->msg);
    free(r);
}

static pf_req_t *s_find(prefill_t *p, uint64_t id) { return (pf_req_t *)sched_find(p->sched, id); }
/* The requests in state st, oldest first (the scheduler's queue). */
static pf_req_t *s_first(prefill_t *p, sched_state_t st) { return (pf_req_t *)sched_first(p->sched, st); }
static pf_req_t *s_next(pf_req_t *r) { return (pf_req_t *)sched_next(&r->sr); }

/* Fails a request back to the router (which gives the client its one terminal reply). */
static void s_fail(actor_t *a, prefill_t *p, pf_req_t *r, msg_error_code_t code, int retryable, const char *why)
{
    msg_t e;
    msg_init(&e, MSG_ERROR, r->sr.id);
    e.u.error.code = code;
    e.u.error.retryable = retryable;
    e.u.error.message = why;
    actor_send_keep(a, r->msg.u.prefill_request.reply_to, &e);   /* terminal: never refused */
    LOG_W("request %llu failed: %s", (unsigned long long)r->sr.id, why);
    s_remove(p, r);
}

/* Prompt tokens computed per second of forward time (0 before the first forward). */
static double s_compute_rate(const prefill_t *p)
{
    return p->forward_ns ? (double)p->computed_tokens * 1e9 / (double)p->forward_ns : 0;
}

static int s_on_prefill_request(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    prefill_t *p = state;
    const msg_prefill_request_t *q = &m->u.prefill_request;
    char err[256];
    if (s_find(p, m->id))
        return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "request %llu is already here",
                                 (unsigned long long)m->id), 0;
    if ((int)q->n_tokens + 1 > p->w->max_model_len)
        return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "prompt of %u tokens exceeds max_model_len %d",
                                 q->n_tokens, p->w->max_model_len), 0;
    for (uint32_t i = 0; i < q->n_tokens; i++)
        if (q->tokens[i] >= (uint32_t)p->w->eng->cfg.vocab_size)
            return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "token id %u at %u is outside the vocabulary (%d)",
                                     q->tokens[i], i, p->w->eng->cfg.vocab_size), 0;
    if (!router_watch_alive(&p->routers, q->reply_to)) {
        /* Sent just before its router died: nobody would read the answer. */
        router_watch_dropped(&p->routers, q->reply_to, 1);
        return 0;
    }
    pf_req_t *r = calloc(1, sizeof *r);
    if (!r || msg_clone(m, &r->msg, err, sizeof err) != 0) {
        free(r);
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "prefill out of memory"), 0;
    }
    r->kv = kvseq_new(p->w->eng->pool, p->w->max_model_len, q->tenant_salt);
    /* uint32 ids below vocab_size (checked) are valid int32 ids: same bytes. */
    if (!r->kv || sched_add_prompt(p->sched, &r->sr, m->id, q->client_key, r->kv,
                                   (const int32_t *)r->msg.u.prefill_request.tokens, (int)q->n_tokens) != 0) {
        kvseq_destroy(&r->kv);
        msg_free(&r->msg);
        free(r);
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "prefill out of memory"), 0;
    }
    /* Blocks the host store holds and our pool lacks are fetched before the prompt runs. */
    const msg_prefill_request_t *rq = &r->msg.u.prefill_request;
    const int first = prefix_fetch_start(a, &p->fetch, p->w, m->id, rq->hint_hashes, (int)rq->n_hint_hashes,
                                         s_compute_rate(p));
    if (first >= 0) {
        r->fetching = 1;
        r->fetched.from = first;
        r->fetch_sent_ms = now_ms();
        sched_hold(p->sched, &r->sr, r->fetch_sent_ms + p->fetch.hold_ms);
    }
    p->prompts++;
    p->prompt_tokens += q->n_tokens;
    return 0;
}

static int s_on_cancel(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    prefill_t *p = state;
    pf_req_t *r = s_find(p, m->id);
    if (r) {
        LOG_D("request %llu cancelled in state %s", (unsigned long long)r->sr.id, sched_state_names[r->sr.state]);
        s_remove(p, r);
    }
    return 0;
}

/* The decode side answered a hand-off (handoff_out ends it through s_handed or s_handoff_failed). */
static int s_on_kv_ack(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    prefill_t *p = state;
    handoff_out_on_ack(&p->out, a, &m->u.kv_ack);
    return 0;
}

/* A prompt's fetch is answered (or given up): it is scheduled again. */
static void s_fetch_over(prefill_t *p, pf_req_t *r, const char *why)
{
    LOG_D("request %llu: fetch over on %s", (unsigned long long)r->sr.id, why);
    r->fetching = 0;
    sched_unhold(p->sched, &r->sr);
}

/* Blocks fetched from the host store: into free pool blocks, registered by hash and released at
 * once, so the request's kvseq_match_prefix adopts them like any cached prefix. */
static int s_on_kv_announce(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    prefill_t *p = state;
    const msg_kv_announce_t *k = &m->u.kv_announce;
    pf_req_t *r = s_find(p, k->request_id);
    const int wanted = r && r->fetching;
    const msg_prefill_request_t *q = wanted ? &r->msg.u.prefill_request : NULL;
    const int got = prefix_fetch_take(a, &p->fetch, p->w, k, wanted, q ? q->hint_hashes : NULL,
                                      q ? (int)q->n_hint_hashes : 0, wanted ? r->fetched.from : 0,
                                      wanted ? r->fetch_sent_ms : 0);
    if (got >= 0) {
        r->fetched.got = got;
        s_fetch_over(p, r, "blocks fetched");
    }
    return 0;
}

/* found 0: nothing comes; else the blocks follow, and the reply says which came from disk. */
static int s_on_fetch_reply(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    prefill_t *p = state;
    pf_req_t *r = s_find(p, m->id);
    if (r && r->fetching && m->u.cache_fetch_reply.found == 0)
        s_fetch_over(p, r, "nothing to fetch");
    else if (r && r->fetching)
        prefix_fetch_on_reply(&r->fetched, &m->u.cache_fetch_reply);
    return 0;
}

/* Samples the first token and hands the request over to its decode worker. */
static void s_handoff(actor_t *a, prefill_t *p, pf_req_t *r, const float *logits)
{
    const msg_prefill_request_t *q = &r->msg.u.prefill_request;
    char err[512];
    sampler_params_t sp;
    if (worker_sampler_params(p->w, &q->sampling, &sp, err, sizeof err) != 0) {
        s_fail(a, p, r, MSG_ERR_BAD_REQUEST, 0, err);
        return;
    }
    sampler_t *smp = sampler_new(&sp, p->w->eng->cfg.vocab_size, r->sr.toks, r->sr.n_prompt, err, sizeof err);
    if (!smp) {
        s_fail(a, p, r, MSG_ERR_BAD_REQUEST, 0, err);
        return;
    }
    float lp = 0;
    r->first_token = sampler_sample(smp, logits, q->sampling.logprobs ? &lp : NULL);
    r->first_lp = lp > 0 ? 0 : lp;
    r->first_top.n = 0;
    if (q->sampling.top_logprobs > 0)   /* before the sampler forgets this position's state */
        sampler_top_logprobs(smp, logits, (int)q->sampling.top_logprobs, &r->first_top);
    sampler_destroy(&smp);

    const int bs = kvpool_view(p->w->eng->pool)->block_size;
    msg_init(&r->ho.msg, MSG_HANDOFF, r->sr.id);
    msg_handoff_t *o = &r->ho.msg.u.handoff;
    o->tokens = q->tokens;
    o->n_tokens = q->n_tokens;
    o->first_token = (uint32_t)r->first_token;
    o->first_logprob = r->first_lp;
    o->first_top_tokens = (const uint32_t *)r->first_top.ids;   /* ids >= 0: the same bits */
    o->first_top_logprobs = r->first_top.logprobs;
    o->n_first_top_tokens = o->n_first_top_logprobs = (uint32_t)r->first_top.n;
    o->sampling = q->sampling;
    o->tokens_left = q->sampling.max_tokens > 0 ? q->sampling.max_tokens - 1 : 0;
    o->kv_tokens = (uint32_t)r->sr.n_prompt;
    o->block_size = (uint32_t)bs;
    o->reply_to = q->reply_to;
    o->tenant_salt = q->tenant_salt;
    o->client_key = q->client_key;
    o->prompt_cache_key = q->prompt_cache_key;
    o->cache_retention_s = q->cache_retention_s;
    o->cached_tokens = (uint32_t)r->sr.n_cached;
    prefix_fetch_split(&r->fetched, r->sr.n_cached, bs, &o->cached_host_tokens, &o->cached_disk_tokens);
    o->queue_ms = q->queue_ms + (uint32_t)(r->sr.started_ms - r->sr.arrived_ms);
    o->prefill_ms = (uint32_t)(now_ms() - r->sr.started_ms);
    o->deadline_ms = q->deadline_ms;
    r->ho.owner = r;
    r->ho.to = q->decode_worker;
    r->ho.kv = r->kv;
    handoff_out_start(&p->out, a, &r->ho);
}

/* handoff_out's hooks: a hand-off acknowledged (the request is done here), or failed. */
static void s_handed(void *ctx, handoff_out_req_t *x) { s_remove(ctx, x->owner); }

static void s_handoff_failed(void *ctx, handoff_out_req_t *x, msg_error_code_t code, const char *why)
{
    prefill_t *p = ctx;
    s_fail(p->a, p, x->owner, code, 1, why);
}

/* Every KVLINK_POLL_MS where NCCL exists: links coming up, NCCL sends in flight. */
static int s_poll_links(actor_t *a, void *state)
{
    prefill_t *p = state;
    handoff_out_poll(&p->out, a);
    return 0;
}

/* Drops every request of a router that went away, as its cancel would: nobody reads the answers
 * (a new incarnation knows none of its ids), and their KV goes back to the pool. */
static void s_drop_router(prefill_t *p, const char *router)
{
    int n = 0;
    for (sched_state_t st = 0; st < SCHED_OUT; st++)
        for (pf_req_t *r = s_first(p, st), *next; r; r = next) {
            next = s_next(r);
            if (strcmp(r->msg.u.prefill_request.reply_to, router) == 0) {
                s_remove(p, r);
                n++;
            }
        }
    router_watch_dropped(&p->routers, router, n);
}

/* A decode worker's process came or went: its NCCL link is aborted at once, or may be offered again
 * at once (s_poll_links does). A router that went away: its requests are dropped. */
static void s_peer_event(actor_t *a, void *state, const char *peer, int up)
{
    prefill_t *p = state;
    if (router_watch_event(&p->routers, peer, up)) {
        s_drop_router(p, peer);
        return;
    }
    handoff_out_peer_event(&p->out, peer, up);
}

static int s_on_kv_link(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    prefill_t *p = state;
    return handoff_out_on_link(&p->out, m);
}

/* One step: expire transfers, run the scheduler's prompt chunks, hand off the prompts they
 * completed. Returns 1 if it did work. */
static int s_step(actor_t *a, void *state)
{
    prefill_t *p = state;
    handoff_out_expire(&p->out);
    const sched_batch_t *b = sched_step(p->sched);
    if (b->n == 0)
        return 0;
    for (int i = 0; i < b->n; i++)
        p->seqs[i] = (model_seq_t){.kv = ((pf_req_t *)b->rows[i].req)->kv, .n_new = b->rows[i].n_new};
    model_batch_t mb = {.n_seqs = b->n, .seqs = p->seqs};
    char err[512];
    int64_t t0 = now_ns();
    int frc = model_forward(p->w->eng->model, &mb, p->w->eng->logits, err, sizeof err);
    p->forward_ns += (uint64_t)(now_ns() - t0);
    p->steps++;
    /* A window per experts.window_steps forwards, as decode workers send: a prefill step carries a
     * chunk of prompt tokens, so a window holds many more tokens than a decode one. */
    expert_report_tick(&p->experts, a, p->w->eng->model, p->steps);
    if (frc != 0) {
        LOG_E("forward: %s", err);
        for (int i = 0; i < b->n; i++)
            if (b->rows[i].req)   /* cleared when an earlier row's failure removed it */
                s_fail(a, p, (pf_req_t *)b->rows[i].req, MSG_ERR_INTERNAL, 1, err);
        sched_commit(p->sched);   /* its rows are gone: nothing to commit */
        return 1;
    }
    sched_commit(p->sched);
    for (int i = 0; i < b->n; i++) {
        pf_req_t *r = (pf_req_t *)b->rows[i].req;
        p->computed_tokens += (uint64_t)b->rows[i].n_new;
        if (b->rows[i].sample) {   /* the prompt's last chunk */
            p->cached_tokens += (uint64_t)r->sr.n_cached;
            s_handoff(a, p, r, p->w->eng->logits + (size_t)i * (size_t)p->w->eng->cfg.vocab_size);
        }
    }
    return 1;
}

static int s_drained(actor_t *a, void *state)
{
    prefill_t *p = state;
    return sched_size(p->sched) == 0;
}

/* Scheduler hooks: a fetch given up on at its deadline; a prompt that can never fit the pool. */
static void s_hold_expired(void *ctx, sched_req_t *sr)
{
    prefill_t *p = ctx;
    pf_req_t *r = (pf_req_t *)sr;
    prefix_fetch_timed_out(&p->fetch, (int)r->msg.u.prefill_request.n_hint_hashes - r->fetched.from, r->fetch_sent_ms);
    r->fetching = 0;
}

static void s_drop(void *ctx, sched_req_t *sr, const char *why)
{
    prefill_t *p = ctx;
    char msg[256];
    snprintf(msg, sizeof msg, "the prefill pool cannot hold the prompt: %s", why);
    s_fail(p->a, p, (pf_req_t *)sr, MSG_ERR_BAD_REQUEST, 0, msg);
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    prefill_t *p = state;
    int waiting = 0, running = 0;
    for (pf_req_t *r = s_first(p, SCHED_PROMPTING); r; r = s_next(r)) {
        waiting += !r->sr.started;
        running += r->sr.started;
    }
    const int handing = sched_count(p->sched, SCHED_PROMPTED);
    int64_t now = now_ms();
    if (p->last_stats_ms && now > p->last_stats_ms)
        p->tokens_per_s = (double)(p->computed_tokens - p->last_computed) * 1000.0 / (double)(now - p->last_stats_ms);
    p->last_stats_ms = now;
    p->last_computed = p->computed_tokens;
    actor_stat_queue(a, st, "waiting", (uint64_t)waiting, 0);
    actor_stat_queue(a, st, "running", (uint64_t)running, 0);
    actor_stat_metric(a, st, "requests_waiting", waiting, 0);
    actor_stat_metric(a, st, "requests_running", running, 0);
    actor_stat_metric(a, st, "handoffs_in_flight", handing, 0);
    actor_stat_metric(a, st, "tokens_per_s", p->tokens_per_s, 0);
    const kvpool_t *pool = p->w->eng->pool;
    actor_stat_metric(a, st, "kv_blocks_free", kvpool_free_count(pool), 0);
    actor_stat_metric(a, st, "kv_blocks_used", kvpool_n_blocks(pool) - kvpool_free_count(pool), 0);
    actor_stat_metric(a, st, "prompts_total", (double)p->prompts, 1);
    actor_stat_metric(a, st, "prompt_tokens_total", (double)p->prompt_tokens, 1);
    actor_stat_metric(a, st, "computed_tokens_total", (double)p->computed_tokens, 1);
    actor_stat_metric(a, st, "cached_tokens_total", (double)p->cached_tokens, 1);
    handoff_out_stats(&p->out, a, st);
    prefix_fetch_stats(a, st, &p->fetch);
    actor_stat_metric(a, st, "steps_total", (double)p->steps, 1);
    actor_stat_metric(a, st, "forward_seconds_total", (double)p->forward_ns / 1e9, 1);
    router_watch_stats(a, st, &p->routers);
}

static const actor_handler_t s_handlers[] = {
    {MSG_PREFILL_REQUEST, s_on_prefill_request},
    {MSG_CANCEL, s_on_cancel},
    {MSG_KV_ACK, s_on_kv_ack},
    {MSG_KV_ANNOUNCE, s_on_kv_announce},
    {MSG_CACHE_FETCH_REPLY, s_on_fetch_reply},
    {MSG_KV_LINK, s_on_kv_link},
};

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_PREFILL);
    if (!a)
        return 2;
    const topo_t *t = actor_topo(a);
    prefill_t p = {.a = a, .name = actor_self(a)->name};
    const topo_instance_t *cm = topo_first(t, ROLE_CACHE_MANAGER);
    p.cache_manager = cm ? cm->name : NULL;
    char err[1024];
    if (prefix_fetch_init(&p.fetch, p.name, p.cache_manager, err, sizeof err) != 0) {
        LOG_E("%s", err);
        actor_destroy(&a);
        return 2;
    }
    int max_seqs = t->limits.max_batch < 64 ? t->limits.max_batch : 64;
    int config_error;
    p.w = worker_load(t, ROLE_PREFILL, actor_self(a), t->limits.prefill_chunk_tokens, max_seqs, &config_error, err,
                      sizeof err);
    if (!p.w) {
        LOG_E("cannot load the model: %s", err);
        actor_destroy(&a);
        return config_error ? ACTOR_EXIT_CONFIG : 1;
    }
    p.seqs = calloc((size_t)max_seqs, sizeof *p.seqs);
    /* Prompt chunks only, oldest first, within the forward's token budget. */
    sched_config_t sc = {.max_seqs = max_seqs, .max_running = 0, .chunk_tokens = p.w->max_tokens, .now_ms = now_ms,
                         .ctx = &p, .hold_expired = s_hold_expired, .drop = s_drop};
    p.sched = sched_new(p.w->eng->pool, &sc, err, sizeof err);
    if (handoff_out_open(&p.out, a, p.w, t, p.cache_manager, err, sizeof err) != 0) {
        LOG_E("%s", err);
        handoff_out_close(&p.out);
        worker_destroy(&p.w);
        actor_destroy(&a);
        return 1;
    }
    p.out.ctx = &p;
    p.out.done = s_handed;
    p.out.fail = s_handoff_failed;
    if (p.out.nccl)
        actor_timer_add(a, KVLINK_POLL_MS, s_poll_links);
    int rc = -1;
    if (router_watch_init(&p.routers, a, t) != 0) {
        LOG_E("cannot watch the routers' connections");
    } else if (!p.seqs || !p.sched) {
        LOG_E("out of memory for a batch of %d", max_seqs);
    } else {
        actor_ops_t ops = {.handlers = s_handlers, .n_handlers = ARRAY_LEN(s_handlers), .before_sleep = s_step,
                           .fill_stats = s_fill_stats, .drained = s_drained,
                           .peer_event = s_peer_event};
        rc = actor_run(a, &ops, &p);
    }
    handoff_out_close_links(&p.out);   /* first: aborts the sends still in flight before their blocks go */
    for (sched_state_t st = 0; p.sched && st < SCHED_OUT; st++)
        while (sched_first(p.sched, st))
            s_remove(&p, s_first(&p, st));
    sched_destroy(&p.sched);
    handoff_out_close(&p.out);   /* after the requests: they release what they staged on its channels */
    expert_report_destroy(&p.experts);
    free(p.seqs);
    worker_destroy(&p.w);
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
