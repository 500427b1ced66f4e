/* actors/decode.c — the decode worker: continuous batching over a paged KV pool.
 *
 * Duties:
 *   - take hand-offs: one handoff message, the request with its KV's transfer description (the
 *     blocks: in a shared-memory segment, in the prefill pool on our GPU, on an NCCL link from
 *     another GPU, or staged for the network on another node: transfer/kv_chan.h); receive the
 *     blocks into our pool, acknowledge (kv_ack) so the prefill side frees its copy, stream the
 *     first token (actors/worker/handoff_in.h);
 *   - colocated (the topology has no prefill actors): take prompts (prefill_request) and compute
 *     them here, in chunks batched with the decode rows, fetching cached prefix blocks from the
 *     host store first when that is cheaper than computing them (actors/worker/prompt_intake.h);
 *   - each step (the loop's before_sleep hook): schedule -> forward -> sample -> emit. The
 *     scheduler (engine/sched.h) picks the rows: one decode row for every running request, then
 *     prompt chunks within limits.prefill_chunk_tokens; out of blocks it preempts the newest
 *     request, whose KV it later recomputes through the same chunk path (as vLLM does). One
 *     forward for the whole batch; every sampled row streams its token (with its text: whole
 *     UTF-8 only, stop strings held back) and stops on EOS / stop ids / stop strings / max tokens
 *     (actors/worker/stream_out.h);
 *     with speculation the rows carry drafts, verified after the forward (actors/worker/spec_step.h);
 *   - write finished sequences' full blocks back to the cache-manager's host store
 *     (actors/worker/writeback.h), so the next turn of a conversation can reuse them;
 *   - cancel frees a request's blocks at once.
 *
 * Every request ends with exactly one done or error to its router. Its states, and every move
 * between them, are the scheduler's.
 *
 * Backpressure: nothing for a router is ever refused (actor_send_keep); instead a step runs only
 * while every live router's outbox has room for all the step may send it (router_watch_room). A router
 * that relays more slowly than this worker produces (one core against a fast GPU's batch) thus
 * slows the steps down rather than losing tokens. Known limit: one slow router holds the steps of
 * every router's requests (they share the batch). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "actors/runtime/actor.h"
#include "actors/worker/worker.h"
#include "actors/worker/chan_keys.h"
#include "actors/worker/dc_req.h"
#include "actors/worker/expert_apply.h"
#include "actors/worker/expert_group.h"
#include "actors/worker/expert_report.h"
#include "actors/worker/handoff_in.h"
#include "actors/worker/load_stats.h"
#include "actors/worker/prompt_intake.h"
#include "actors/worker/router_watch.h"
#include "actors/worker/spec_step.h"
#include "actors/worker/step_clock.h"
#include "actors/worker/step_scratch.h"
#include "actors/worker/step_trace.h"
#include "actors/worker/stream_out.h"
#include "actors/worker/writeback.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/sched.h"

typedef struct decode {
    actor_t *a;                  /* for the scheduler's and speculation's hooks */
    worker_t *w;                 /* the model, its KV pool, the tokenizer (worker.h) */
    const char *name, *cluster;  /* our instance's name; the topology's */
    const char *cache_manager;   /* NULL when the topology has none */
    sched_t *sched;              /* every request, by state */
    step_scratch_t step;         /* the step's scratch, a row each: sequences, sampling, ids (step_scratch.h) */
    /* Requests in and out, and what they travel on. */
    handoff_in_t handoffs;       /* prefill workers' hand-offs in, and the channels they come on (handoff_in.h) */
    prompt_intake_t prompts;     /* colocated: the prompts computed here (prompt_intake.h) */
    stream_out_t out;            /* tokens, done and errors to the routers (stream_out.h) */
    writeback_t *wb;             /* finished sequences to the host store */
    spec_step_t *spec;           /* speculation (actors/worker/spec_step.h); NULL: off */
    router_watch_t routers;      /* the routers our requests belong to: a lost one's are dropped, a slow
                                    one's hold the steps */
    expert_report_t *experts;    /* expert_load windows to the expert-balancer; NULL: none */
    step_trace_t trace;          /* TROUPE_STEP_TRACE: a line per step, arrival and end (step_trace.h) */
    int coalesce;                /* a verify step's run of a row's tokens is one token message (TROUPE_SPEC_COALESCE) */
    step_clock_t clock;          /* where the loop's time goes: steps, forwards, cycles (step_clock.h) */
} decode_t;

/* Frees a request and everything it holds, out of the scheduler first (NULL: nothing). */
static void s_req_free(decode_t *d, dc_req_t *r)
{
    if (!r)
        return;
    if (sched_find(d->sched, r->sr.id) == &r->sr)
        sched_remove(d->sched, &r->sr);
    step_trace_end(&d->trace, r->sr.id);   /* (one that never arrived, refused on the way in, too) */
    spec_step_forget(d->spec, r->sr.id);
    dc_req_destroy(&r);
}

static dc_req_t *s_find(decode_t *d, uint64_t id) { return (dc_req_t *)sched_find(d->sched, id); }

/* A handed-over request joins the scheduler with its prompt's KV (with_kv), or without it (no
 * room: it is recomputed here when blocks free up), and streams its first token. A full batch does
 * not refuse: the request waits here with its KV and joins at the next step with a free slot. */
static void s_admit(decode_t *d, dc_req_t *r, int with_kv, int32_t first, float lp)
{
    const msg_handoff_t *h = &r->handoff.u.handoff;
    if (sched_add_running(d->sched, &r->sr, r->sr.id, h->client_key, r->kv, r->toks, (int)h->n_tokens,
                          (int)h->cached_tokens, with_kv) != 0) {
        stream_out_error(&d->out, r, MSG_ERR_OVERLOADED, 1, "decode out of memory");
        s_req_free(d, r);
        return;
    }
    r->admitted_ms = now_ms();
    step_trace_arrive(&d->trace, r->sr.id, (int)h->n_tokens, 1);
    if (stream_out_first(&d->out, r, first, lp))
        s_req_free(d, r);
}

/* Blocks announced outside a hand-off: the cache-manager's answer to a colocated prompt's fetch,
 * or refused. */
static int s_on_kv_announce(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    if (!prompt_intake_on_announce(&d->prompts, a, &m->u.kv_announce))
        handoff_in_refuse_announce(&d->handoffs, a, &m->u.kv_announce);
    return 0;
}

static int s_on_handoff(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    int with_kv = 0;
    dc_req_t *r = handoff_in_take(&d->handoffs, a, m, s_find(d, m->id) != NULL, &with_kv);
    if (r && !router_watch_alive(&d->routers, m->u.handoff.reply_to)) {
        /* Its router died while it was handed over: taken (the sender frees its copy), then dropped. */
        s_req_free(d, r);
        router_watch_dropped(&d->routers, m->u.handoff.reply_to, 1);
    } else if (r) {
        s_admit(d, r, with_kv, (int32_t)m->u.handoff.first_token, m->u.handoff.first_logprob);
    }
    return 0;
}

/* Colocated (no prefill actors): the router sends the prompt here; it is PROMPTING until its
 * prompt is computed and its first token sampled. */
static int s_on_prefill_request(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    if (!router_watch_alive(&d->routers, m->u.prefill_request.reply_to)) {
        router_watch_dropped(&d->routers, m->u.prefill_request.reply_to, 1);   /* sent just before it died */
        return 0;
    }
    prompt_intake_take(&d->prompts, a, from, m);
    if (step_trace_on(&d->trace) && sched_find(d->sched, m->id))   /* taken, not refused */
        step_trace_arrive(&d->trace, m->id, (int)m->u.prefill_request.n_tokens, 0);
    return 0;
}

static int s_on_fetch_reply(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    prompt_intake_on_fetch_reply(&d->prompts, m);
    return 0;
}

static int s_on_cancel(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    dc_req_t *r = s_find(d, m->id);
    if (r)
        s_req_free(d, r);
    return 0;
}

/* The cache-manager has a write-back's copy (or refused it): its segment can go. */
static int s_on_kv_ack(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    writeback_on_ack(d->wb, m->u.kv_ack.transfer_id);
    return 0;
}

static int s_on_kv_link(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    return handoff_in_on_link(&d->handoffs, m);
}

/* The draft-scheduler's policy, applied from the next step (spec_step.h); one this worker cannot
 * apply is answered with bad_request (the scheduler counts it and never answers back). */
static int s_on_draft_policy(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    char err[256];
    if (spec_step_on_policy(d->spec, &m->u.draft_policy, err, sizeof err) == 0)
        return 0;
    return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "%s", err) < 0 ? -1 : 0;
}

/* The expert-balancer's placement for the group this worker leads (docs/experts.md): the group
 * switches to it at a step boundary; one it cannot take is answered with bad_request. */
static int s_on_placement(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    decode_t *d = state;
    char err[512];
    if (expert_apply(expert_group_ep(d->w->experts), d->w->eng->model, &m->u.expert_placement, err, sizeof err) == 0)
        return 0;
    LOG_W("expert placement refused: %s", err);
    return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "%s", err) < 0 ? -1 : 0;
}

static const actor_handler_t s_handlers[] = {
    {MSG_KV_ANNOUNCE, s_on_kv_announce},
    {MSG_HANDOFF, s_on_handoff},
    {MSG_PREFILL_REQUEST, s_on_prefill_request},
    {MSG_CACHE_FETCH_REPLY, s_on_fetch_reply},
    {MSG_CANCEL, s_on_cancel},
    {MSG_KV_ACK, s_on_kv_ack},
    {MSG_KV_LINK, s_on_kv_link},
    {MSG_EXPERT_PLACEMENT, s_on_placement},
    {MSG_DRAFT_POLICY, s_on_draft_policy},
};

/* Every KVLINK_POLL_MS where NCCL links can exist: links coming up move on. */
static int s_poll_links(actor_t *a, void *state)
{
    decode_t *d = state;
    handoff_in_poll(&d->handoffs);
    return 0;
}

/* Colocated: wakes the loop now and then, so a fetch that is never answered is given up on time
 * (the scheduler's hold) even when no message comes. */
static int s_wake(actor_t *a, void *state) { return 0; }

/* A prefill worker's process came or went: its NCCL link is aborted at once, or may come again. A
 * router that went away: its requests are dropped, their KV freed (router_watch.h). */
static void s_peer_event(actor_t *a, void *state, const char *peer, int up)
{
    decode_t *d = state;
    if (router_watch_event(&d->routers, peer, up)) {
        int n = 0;
        for (sched_state_t st = 0; st < SCHED_OUT; st++)
            for (dc_req_t *r = (dc_req_t *)sched_first(d->sched, st), *next; r; r = next) {
                next = (dc_req_t *)sched_next(&r->sr);
                if (strcmp(r->handoff.u.handoff.reply_to, peer) == 0) {
                    s_req_free(d, r);
                    n++;
                }
            }
        router_watch_dropped(&d->routers, peer, n);
        return;
    }
    handoff_in_peer_event(&d->handoffs, peer, up);
}

/* The scheduler's hooks: write-back copies give their blocks back; a fetch given up on at its
 * deadline; a request that can never fit the pool fails (retryable: another worker may hold it). */
static int s_reclaim(void *ctx)
{
    decode_t *d = ctx;
    return writeback_reclaim(d->wb, d->a);
}

static void s_hold_expired(void *ctx, sched_req_t *sr)
{
    decode_t *d = ctx;
    prompt_intake_hold_expired(&d->prompts, (dc_req_t *)sr);
}

static void s_drop(void *ctx, sched_req_t *sr, const char *why)
{
    decode_t *d = ctx;
    dc_req_t *r = (dc_req_t *)sr;
    stream_out_error(&d->out, r, MSG_ERR_OVERLOADED, 1, why);
    s_req_free(d, r);
}

/* Forward: the scheduler's rows in one model step, decode rows first, then prompt chunks (the
 * shape the CUDA path's n_single hint and graph replays expect). Rows take their token from the
 * device (argmax, or the backend's sample op: temperature, top-k, top-p, min-p, seed); only those
 * with penalties or log-probabilities bring their row of logits to the host (and every non-greedy
 * one on a backend without the op). -1 when it failed: its rows' requests are failed. */
static int s_forward(actor_t *a, decode_t *d, const sched_batch_t *b, int spec)
{
    const int dev_sample = d->w->eng->be->ops->sample != NULL;
    int any_sampled = 0;   /* a row the device samples (not greedy, no host logits needed) */
    uint64_t prompt_tokens = 0, recompute_tokens = 0;
    for (int i = 0; i < b->n; i++) {
        const dc_req_t *r = (const dc_req_t *)b->rows[i].req;
        const int used = b->rows[i].sample;   /* a chunk not ending its prompt: its token is not used */
        d->step.seqs[i] = (model_seq_t){.kv = r->kv, .n_new = b->rows[i].n_new + spec_step_drafts(d->spec, i)};
        if (i >= b->n_decode)
            *(r->sr.state == SCHED_PROMPTING ? &prompt_tokens : &recompute_tokens) += (uint64_t)b->rows[i].n_new;
        d->step.need_logits[i] = used && (sampler_needs_host(r->smp) || r->handoff.u.handoff.sampling.logprobs ||
                                          (!dev_sample && !sampler_is_greedy(r->smp)));
        any_sampled |= used && !d->step.need_logits[i] && !sampler_is_greedy(r->smp);
    }
    for (int i = 0; any_sampled && i < b->n; i++)
        sampler_device_params(((const dc_req_t *)b->rows[i].req)->smp, &d->step.sample[i]);
    /* An all-greedy step keeps the plain argmax (the sample op's greedy rows give the same ids). */
    model_batch_t mb = {.n_seqs = b->n, .seqs = d->step.seqs, .argmax_out = d->step.argmax,
                        .need_logits = d->step.need_logits, .sample = any_sampled ? d->step.sample : NULL};
    if (spec)   /* a verify step: every position's token, logits only where the acceptance reads them */
        spec_step_batch(d->spec, b, dev_sample, &mb);
    char err[512];
    uint64_t rec0 = 0, rep0 = 0, rec1 = 0, rep1 = 0;
    if (step_trace_on(&d->trace))
        model_graph_stats(d->w->eng->model, &rec0, &rep0);
    const int64_t t0 = now_ns();
    const int frc = model_forward(d->w->eng->model, &mb, d->w->eng->logits, err, sizeof err);
    const int64_t t1 = now_ns();
    /* The chunks' share of the step, by tokens: the prompts' compute rate, the recomputes' cost. */
    const uint64_t prompt_ns = step_clock_forward(&d->clock, (uint64_t)(t1 - t0), b->n_decode, prompt_tokens,
                                                  recompute_tokens);
    prompt_intake_computed(&d->prompts, prompt_tokens, prompt_ns);
    if (step_trace_on(&d->trace)) {   /* before rows are failed */
        model_graph_stats(d->w->eng->model, &rec1, &rep1);
        int pos = 0;
        for (int i = 0; i < b->n; i++)
            pos += d->step.seqs[i].n_new;
        step_trace_forward(&d->trace, b, t0, t1, (int)prompt_tokens, (int)recompute_tokens, pos,
                           rec1 > rec0 ? 'r' : rep1 > rep0 ? 'p' : 'e');
    }
    if (frc == 0)
        return 0;
    LOG_E("forward: %s", err);
    for (int i = 0; i < b->n; i++) {
        dc_req_t *r = (dc_req_t *)b->rows[i].req;
        stream_out_error(&d->out, r, MSG_ERR_INTERNAL, 1, err);
        s_req_free(d, r);
    }
    return -1;
}

/* Sample and emit: every row whose token is used takes it (the device's, or the host sampler's
 * from its logits); a decode row streams it, the chunk that ends a prompt gives its first token. */
static void s_sample_emit(actor_t *a, decode_t *d, const sched_batch_t *b)
{
    const size_t vocab = (size_t)d->w->eng->cfg.vocab_size;
    for (int i = 0; i < b->n; i++) {
        dc_req_t *r = (dc_req_t *)b->rows[i].req;
        if (!b->rows[i].sample)
            continue;
        /* The log-probability costs a softmax over the vocabulary: only when it was asked for. */
        float lp = 0;
        const float *row = d->step.need_logits[i] ? d->w->eng->logits + (size_t)i * vocab : NULL;
        const int32_t t = row ? sampler_sample(r->smp, row, r->handoff.u.handoff.sampling.logprobs ? &lp : NULL)
                              : d->step.argmax[i];
        sampler_top_t top;
        const sampler_top_t *alt = stream_out_top(r, row, &top);
        if (i >= b->n_decode)   /* a colocated prompt's last chunk: its first token, as a hand-off's */
            prompt_intake_done(&d->prompts, a, r);
        if (stream_out_token(&d->out, r, t, lp, alt, i < b->n_decode && kvseq_len(r->kv) + 1 >= d->w->max_model_len))
            s_req_free(d, r);
    }
}

/* Speculation's hooks (spec_step.h): a row's sampler; a verified token streamed, r's KV rolled
 * back to kv_keep if the token ends it. */
static sampler_t *s_spec_sampler(void *ctx, sched_req_t *sr, int *logprobs)
{
    dc_req_t *r = (dc_req_t *)sr;
    *logprobs = r->handoff.u.handoff.sampling.logprobs;
    return r->smp;
}

static int s_spec_emit(void *ctx, sched_req_t *sr, int32_t t, float lp, const float *row, int at_length, int kv_keep,
                       int more)
{
    decode_t *d = ctx;
    dc_req_t *r = (dc_req_t *)sr;
    r->kv_keep = kv_keep;
    sampler_top_t top;
    if (stream_out_token_more(&d->out, r, t, lp, stream_out_top(r, row, &top), at_length, more && d->coalesce)) {
        s_req_free(d, r);
        return 0;
    }
    r->kv_keep = 0;
    return 1;
}

/* One step: schedule -> propose -> forward -> sample -> emit. Returns 1 if it did work.
 *
 * The step-cost table of speculation gets each decode-only step's whole cycle, from its start to
 * the next step's start, before the next step proposes (step_clock.h says why not the forward). */
static int s_step(actor_t *a, void *state)
{
    decode_t *d = state;
    const int copying = writeback_poll(d->wb, a);   /* copies in flight: come back soon to announce them */
    /* Without a step of ours, an expert-parallel group's step a peer started still needs us. */
    if (sched_size(d->sched) > 0 &&
        !router_watch_room(&d->routers, a,
                           /* a verify step's run of a row is one message when coalesced (STREAM_OUT_HOLD) */
                           stream_out_step_messages(&d->out, d->coalesce ? 0 : spec_step_max_drafts(d->spec)))) {
        step_trace_hold(&d->trace);
        return copying | expert_group_idle(d->w->experts, 0);   /* a router is behind: no step until its outbox drains */
    }
    step_trace_begin(&d->trace);
    const sched_batch_t *b = sched_step(d->sched);
    if (b->n == 0) {
        step_clock_idle(&d->clock);
        step_trace_idle(&d->trace);
        return copying | expert_group_idle(d->w->experts, actor_draining(a) && sched_size(d->sched) == 0);
    }
    step_trace_scheduled(&d->trace, d->sched);
    double cycle_s;
    if (step_clock_begin(&d->clock, b->n == b->n_decode, &cycle_s))
        spec_step_cycle(d->spec, cycle_s);   /* the step before this one, whole */
    const int spec = spec_step_propose(d->spec, b);
    const int frc = s_forward(a, d, b, spec);
    if (spec) {
        /* A verify step commits after its emit: the rejected drafts leave the KV before it is
         * published (it has decode rows only: the commit just publishes). */
        if (frc == 0)
            spec_step_verify(d->spec, b, d->w->eng->logits, d->w->eng->cfg.vocab_size);
        sched_commit(d->sched);
    } else {
        sched_commit(d->sched);   /* after a failure its rows are gone: nothing to commit */
        if (frc == 0)
            s_sample_emit(a, d, b);
    }
    spec_step_done(d->spec, b);   /* its rows and drafts, for its cycle's report */
    step_trace_done(&d->trace);
    return 1;
}

static int s_drained(actor_t *a, void *state)
{
    decode_t *d = state;
    return sched_size(d->sched) == 0 && expert_group_drained(d->w->experts);   /* a group's ranks leave together */
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    decode_t *d = state;
    /* requests by state, the batch, the output, the KV pool */
    load_stats_fill(a, st, d->sched, d->w->max_seqs, d->clock.last_batch, &d->out, d->w->eng->pool);
    handoff_in_stats(&d->handoffs, a, st);
    router_watch_stats(a, st, &d->routers);
    writeback_stats(d->wb, a, st);
    step_clock_stats(&d->clock, d->w->eng->model, a, st);   /* steps, forwards, cycles, the target's CUDA graphs */
    expert_report_tick(&d->experts, a, d->w->eng->model, d->clock.steps);   /* an expert_load window per 1,000 steps */
    expert_apply_stats(a, st, expert_group_ep(d->w->experts));     /* the expert-parallel group, if any */
    spec_step_stats(d->spec, a, st);   /* speculation: acceptance of the drafts, tokens per verify step */
    prompt_intake_stats(&d->prompts, a, st);   /* colocated: the prompts it computes itself */
}

/* What a step needs, for the worker's max_seqs rows: its scratch, speculation (spec_cfg), the
 * write-back, the scheduler (the decode rows and up to chunk_tokens tokens of prompt chunks) and
 * the output. -1 with why (out of memory, or speculation that could not start); s_close frees
 * what was made. */
static int s_open_step(decode_t *d, spec_step_config_t *spec_cfg, int chunk_tokens, char *err, size_t errlen)
{
    const int max_seqs = d->w->max_seqs;
    const spec_hooks_t spec_hooks = {.ctx = d, .sampler = s_spec_sampler, .emit = s_spec_emit};
    if (spec_cfg->pad_max_rows < 0)   /* padding buys graph replays: worth it where there are graphs */
        spec_cfg->pad_max_rows = d->w->eng->be->ops->graph_begin ? SPEC_PAD_ROWS_GRAPHS : 0;
    d->spec = spec_step_new(spec_cfg, d->w->draft, max_seqs, d->w->max_logit_rows, d->w->max_model_len, &spec_hooks,
                            err, errlen);
    if (spec_step_policy_init(d->spec, d->a, err, errlen) != 0)
        spec_step_destroy(&d->spec);
    if (!d->spec && spec_cfg->method != SPEC_OFF)
        return -1;
    const int scratch_rc = step_scratch_init(&d->step, max_seqs);
    d->handoffs.wb = d->wb = writeback_new(d->w, d->name, d->cluster, d->cache_manager);
    sched_config_t sc = {.max_seqs = max_seqs, .max_running = max_seqs, .chunk_tokens = chunk_tokens, .now_ms = now_ms,
                         .ctx = d, .reclaim = s_reclaim, .hold_expired = s_hold_expired, .drop = s_drop};
    if (!(d->sched = sched_new(d->w->eng->pool, &sc, err, errlen)))
        return -1;
    if (scratch_rc != 0 || !d->wb || stream_out_init(&d->out, d->a, d->w, d->sched, d->wb) != 0)
        return errf(err, errlen, "out of memory for a batch of %d", max_seqs);
    return 0;
}

/* TROUPE_GRAPH_WARMUP: the target's graphs recorded before serving (model_graph_warmup): "all"
 * (the default) the decode steps of 1..max_seqs rows and the verify steps a speculating worker
 * pads (up to its padded rows x 2..SPEC_MAX_K + 1 positions), "verify" those verify steps only,
 * "0" none (each shape is then recorded the second time it comes, in the middle of serving: a
 * step run op by op and one recorded, a few ms each). A backend without graphs records nothing.
 * Why the default: on one H100 (2026-12-07, 7ea3ba5) the 8B shape's 256 decode graphs took 5.6 s
 * and 629 MB of device memory at start, and the KJV pair's plain cluster was 10-15% faster at 64
 * / 96 users with them (docs/speculation.md). A warm-up that fails (no device memory left for its
 * scratch, say) is not fatal: the worker serves and records shapes as they come, said in the log.
 * -2 with why for a value other than those. */
static int s_graph_warmup(decode_t *d, const spec_step_config_t *c, char *err, size_t errlen)
{
    const char *v = getenv("TROUPE_GRAPH_WARMUP");
    if (!v || !*v)
        v = "all";
    if (!strcmp(v, "0"))
        return 0;
    const int all = !strcmp(v, "all");
    if (!all && strcmp(v, "verify")) {
        errf(err, errlen, "TROUPE_GRAPH_WARMUP '%s': expected 0, verify or all", v);
        return -2;
    }
    const int verify_rows = d->spec ? c->pad_max_rows : 0;
    backend_t *be = d->w->eng->be;
    /* What the graphs and the scratch they grew took of the device, for the log line (0 where the
     * backend cannot say). */
    const size_t free0 = be->ops->mem_available ? be->ops->mem_available(be) : 0;
    const int64_t t0 = now_ns();
    int recorded = 0;
    char why[256] = "";
    if (model_graph_warmup(d->w->eng->model, d->w->eng->pool, all ? d->w->max_seqs : 0, verify_rows, SPEC_MAX_K + 1,
                           &recorded, why, sizeof why) != 0) {
        LOG_W("graph warm-up (%s) failed after %d graphs: %s; serving on, the other shapes recorded as they come "
              "(TROUPE_GRAPH_WARMUP=0 skips the warm-up)", v, recorded, why);
        return 0;
    }
    if (recorded == 0)
        return 0;   /* a backend without graphs: nothing to say */
    const size_t free1 = be->ops->mem_available ? be->ops->mem_available(be) : 0;
    LOG_I("graph warm-up (%s): %d graphs recorded in %.2f s, %.1f MB of device memory taken", v, recorded,
          (double)(now_ns() - t0) / 1e9, free0 > free1 ? (double)(free0 - free1) / 1e6 : 0.0);
    return 0;
}

/* Frees everything of main's opens and s_open_step, and the worker: the channels first, the
 * requests out of the scheduler before it goes. */
static void s_close(decode_t *d)
{
    handoff_in_close(&d->handoffs);
    writeback_destroy(&d->wb);
    for (sched_state_t st = 0; d->sched && st < SCHED_OUT; st++)
        while (sched_first(d->sched, st))
            s_req_free(d, (dc_req_t *)sched_first(d->sched, st));
    step_trace_close(&d->trace);   /* after the requests' end lines */
    sched_destroy(&d->sched);
    step_scratch_free(&d->step);
    spec_step_destroy(&d->spec);
    stream_out_free(&d->out);
    expert_report_destroy(&d->experts);
    worker_destroy(&d->w);
}

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_DECODE);
    if (!a)
        return 2;
    const topo_t *t = actor_topo(a);
    decode_t d = {.a = a, .name = actor_self(a)->name, .cluster = t->name};
    const topo_instance_t *cm = topo_first(t, ROLE_CACHE_MANAGER);
    d.cache_manager = cm ? cm->name : NULL;
    /* Colocated (no prefill actors): prompts come here (prefill_request). */
    const int colocated = topo_first(t, ROLE_PREFILL) == NULL;
    if (colocated && d.cache_manager)
        actor_timer_add(a, FETCH_TIMEOUT_MS / 10, s_wake);
    /* A step holds the decode rows and up to prefill_chunk_tokens tokens of prompt chunks (colocated
     * prompts, and every worker's recomputes of preempted requests). */
    const int max_seqs = t->limits.max_batch, chunk_tokens = t->limits.prefill_chunk_tokens;
    char err[1024];
    int rc = -1, exit_code = 1, config_error = 0, warm = 0;
    spec_step_config_t spec_cfg;
    const int spec_rc = spec_step_config_from_env(&spec_cfg, err, sizeof err);
    d.coalesce = spec_cfg.coalesce;
    if (spec_rc != 0) {
        LOG_E("%s", err);
        exit_code = ACTOR_EXIT_CONFIG;
    } else if (!(d.w = worker_load(t, ROLE_DECODE, actor_self(a), max_seqs + chunk_tokens, max_seqs,
                                   &config_error, err, sizeof err))) {
        LOG_E("cannot load the model: %s", err);
        exit_code = config_error ? ACTOR_EXIT_CONFIG : 1;
    } else if (handoff_in_open(&d.handoffs, a, d.w, t, err, sizeof err) != 0) {
        LOG_E("the hand-off channels: %s", err);
    } else if (router_watch_init(&d.routers, a, t) != 0) {
        LOG_E("cannot watch the routers");
    } else if (expert_group_watch(d.w->experts, a) != 0) {
        LOG_E("cannot watch the expert-parallel group");
    } else if (s_open_step(&d, &spec_cfg, chunk_tokens, err, sizeof err) != 0) {
        LOG_E("%s", err);
    } else if ((warm = s_graph_warmup(&d, &spec_cfg, err, sizeof err)) != 0) {
        LOG_E("%s", err);
        exit_code = warm == -2 ? ACTOR_EXIT_CONFIG : 1;
    } else if (prompt_intake_init(&d.prompts, d.w, d.sched, d.name, d.cache_manager, colocated, err, sizeof err) != 0) {
        LOG_E("%s", err);   /* a bad TROUPE_PREFILL_FETCH */
        exit_code = 2;
    } else if (step_trace_open(&d.trace, getenv("TROUPE_STEP_TRACE"), max_seqs, err, sizeof err) != 0) {
        LOG_E("%s", err);
        exit_code = ACTOR_EXIT_CONFIG;
    } else {
        if (step_trace_on(&d.trace))
            LOG_I("step trace: %s", getenv("TROUPE_STEP_TRACE"));
        if (d.handoffs.nccl)
            actor_timer_add(a, KVLINK_POLL_MS, s_poll_links);
        actor_ops_t ops = {.handlers = s_handlers, .n_handlers = ARRAY_LEN(s_handlers), .before_sleep = s_step,
                           .fill_stats = s_fill_stats, .drained = s_drained, .peer_event = s_peer_event};
        rc = actor_run(a, &ops, &d);
    }
    s_close(&d);
    actor_destroy(&a);
    return rc == 0 ? 0 : exit_code;
}
