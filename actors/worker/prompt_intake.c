/* actors/worker/prompt_intake.c — a colocated decode worker's prompts (prompt_intake.h). */
#include "actors/worker/prompt_intake.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int prompt_intake_init(prompt_intake_t *pi, worker_t *w, sched_t *sched, const char *self, const char *cache_manager,
                       int colocated, char *err, size_t errlen)
{
    *pi = (prompt_intake_t){.self = self, .cache_manager = cache_manager, .colocated = colocated, .w = w,
                            .sched = sched};
    return prefix_fetch_init(&pi->fetch, self, cache_manager, err, errlen);
}

/* Why prompt q cannot be taken (a bad request's message in err), or 0 when it can; *code says which. */
static int s_check(const prompt_intake_t *pi, const msg_t *m, msg_error_code_t *code, int *retryable, char *err,
                   size_t errlen)
{
    const msg_prefill_request_t *q = &m->u.prefill_request;
    const worker_t *w = pi->w;
    *code = MSG_ERR_BAD_REQUEST;
    *retryable = 0;
    if (!pi->colocated)
        return errf(err, errlen, "prefill_request at decode worker %s: the topology has prefill workers", pi->self);
    if (sched_find(pi->sched, m->id))
        return errf(err, errlen, "request %llu is already here", (unsigned long long)m->id);
    if ((int)q->n_tokens + (int)q->sampling.max_tokens > w->max_model_len)
        return errf(err, errlen, "prompt (%u tokens) + max_tokens (%u) exceeds max_model_len %d", q->n_tokens,
                    q->sampling.max_tokens, w->max_model_len);
    for (uint32_t i = 0; i < q->n_tokens; i++)
        if (q->tokens[i] >= (uint32_t)w->eng->cfg.vocab_size)
            return errf(err, errlen, "token id %u at %u is outside the vocabulary (%d)", q->tokens[i], i,
                        w->eng->cfg.vocab_size);
    *code = MSG_ERR_OVERLOADED;
    *retryable = 1;
    const int pool_blocks = kvpool_n_blocks(w->eng->pool);
    if ((int)((q->n_tokens + (uint32_t)w->block_size - 1) / (uint32_t)w->block_size) + 1 > pool_blocks)
        return errf(err, errlen, "the prompt (%u tokens) needs more KV blocks than the decode pool has (%d)", q->n_tokens,
                    pool_blocks);
    return 0;
}

/* Blocks the host store holds and our pool lacks are fetched before the prompt's first chunk
 * (when that is cheaper than computing them, at the prompts' compute rate so far). */
static void s_fetch(prompt_intake_t *pi, actor_t *a, dc_req_t *r, const msg_prefill_request_t *q)
{
    if (!q->n_hint_hashes || !(r->fetch.hints = malloc(q->n_hint_hashes * sizeof *r->fetch.hints)))
        return;
    memcpy(r->fetch.hints, q->hint_hashes, q->n_hint_hashes * sizeof *r->fetch.hints);
    r->fetch.n_hints = (int)q->n_hint_hashes;
    const double rate = pi->ns ? (double)pi->computed * 1e9 / (double)pi->ns : 0;
    const int first = prefix_fetch_start(a, &pi->fetch, pi->w, r->sr.id, r->fetch.hints, r->fetch.n_hints, rate);
    if (first >= 0) {
        r->fetch.active = 1;
        r->fetch.src.from = first;
        r->fetch.sent_ms = now_ms();
        sched_hold(pi->sched, &r->sr, r->fetch.sent_ms + pi->fetch.hold_ms);
    }
}

void prompt_intake_take(prompt_intake_t *pi, actor_t *a, const actor_peer_t *from, const msg_t *m)
{
    const msg_prefill_request_t *q = &m->u.prefill_request;
    char err[512];
    msg_error_code_t code;
    int retryable;
    if (s_check(pi, m, &code, &retryable, err, sizeof err) != 0) {
        actor_reply_error(a, from, m->id, code, retryable, "%s", err);
        return;
    }
    msg_t h;
    msg_init(&h, MSG_HANDOFF, m->id);
    h.u.handoff = (msg_handoff_t){.tokens = q->tokens, .n_tokens = q->n_tokens, .sampling = q->sampling,
                                  .tokens_left = q->sampling.max_tokens > 0 ? q->sampling.max_tokens - 1 : 0,
                                  .kv_tokens = q->n_tokens,
                                  .block_size = (uint32_t)pi->w->block_size, .reply_to = q->reply_to,
                                  .prefill_worker = pi->self, .tenant_salt = q->tenant_salt,
                                  .client_key = q->client_key,
                                  .prompt_cache_key = q->prompt_cache_key, .cache_retention_s = q->cache_retention_s,
                                  .queue_ms = q->queue_ms, .deadline_ms = q->deadline_ms};
    dc_req_t *r = dc_req_new(pi->w, &h, err, sizeof err);
    if (r && sched_add_prompt(pi->sched, &r->sr, m->id, q->client_key, r->kv, r->toks, (int)q->n_tokens) != 0) {
        snprintf(err, sizeof err, "decode out of memory");
        dc_req_destroy(&r);
    }
    if (!r) {
        actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "%s", err);
        return;
    }
    r->admitted_ms = now_ms();
    s_fetch(pi, a, r, q);
    pi->prompts++;
}

void prompt_intake_done(prompt_intake_t *pi, actor_t *a, dc_req_t *r)
{
    msg_handoff_t *h = &r->handoff.u.handoff;
    h->cached_tokens = (uint32_t)r->sr.n_cached;
    prefix_fetch_split(&r->fetch.src, r->sr.n_cached, pi->w->block_size, &h->cached_host_tokens, &h->cached_disk_tokens);
    h->prefill_ms = (uint32_t)(now_ms() - r->admitted_ms);
    pi->cached += (uint64_t)r->sr.n_cached;
    worker_publish_blocks(a, pi->self, pi->cache_manager, r->kv, pi->w->block_size);
    r->admitted_ms = now_ms();
}

void prompt_intake_computed(prompt_intake_t *pi, uint64_t tokens, uint64_t ns)
{
    pi->computed += tokens;
    pi->ns += ns;
}

/* A prompt's fetch is answered (or given up): it is scheduled again. */
static void s_fetch_over(prompt_intake_t *pi, dc_req_t *r)
{
    r->fetch.active = 0;
    sched_unhold(pi->sched, &r->sr);
}

int prompt_intake_on_announce(prompt_intake_t *pi, actor_t *a, const msg_kv_announce_t *k)
{
    if (!pi->colocated || !pi->cache_manager || strcmp(k->src, pi->cache_manager) != 0)
        return 0;
    /* Late blocks, for a request that stopped waiting (or is gone), are refused. */
    dc_req_t *r = (dc_req_t *)sched_find(pi->sched, k->request_id);
    const int wanted = r && r->fetch.active;
    const int got = prefix_fetch_take(a, &pi->fetch, pi->w, k, wanted, wanted ? r->fetch.hints : NULL,
                                      wanted ? r->fetch.n_hints : 0, wanted ? r->fetch.src.from : 0,
                                      wanted ? r->fetch.sent_ms : 0);
    if (wanted) {
        r->fetch.src.got = got > 0 ? got : 0;
        s_fetch_over(pi, r);
    }
    return 1;
}

void prompt_intake_on_fetch_reply(prompt_intake_t *pi, const msg_t *m)
{
    dc_req_t *r = (dc_req_t *)sched_find(pi->sched, m->id);
    if (r && r->fetch.active && m->u.cache_fetch_reply.found == 0)
        s_fetch_over(pi, r);
    else if (r && r->fetch.active)   /* its blocks follow: which came from disk */
        prefix_fetch_on_reply(&r->fetch.src, &m->u.cache_fetch_reply);
}

void prompt_intake_hold_expired(prompt_intake_t *pi, dc_req_t *r)
{
    prefix_fetch_timed_out(&pi->fetch, r->fetch.n_hints - r->fetch.src.from, r->fetch.sent_ms);
    r->fetch.active = 0;
}

void prompt_intake_stats(const prompt_intake_t *pi, actor_t *a, msg_stats_t *st)
{
    if (!pi->colocated)
        return;
    actor_stat_metric(a, st, "requests_prompting", sched_count(pi->sched, SCHED_PROMPTING), 0);
    actor_stat_metric(a, st, "prompts_total", (double)pi->prompts, 1);
    actor_stat_metric(a, st, "computed_tokens_total", (double)pi->computed, 1);
    actor_stat_metric(a, st, "cached_tokens_total", (double)pi->cached, 1);
    prefix_fetch_stats(a, st, &pi->fetch);
}
