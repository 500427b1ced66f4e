/* actors/worker/prompt_intake.h — a colocated decode worker (the topology has no prefill actors)
 * takes prompts itself. A module of its own because it is a prefill worker's front half living in
 * the decode worker: checking the prompt, making the request as if a prefill worker had handed it
 * over (the same handoff fields: sampling, reply_to, cache key), fetching its cached prefix blocks
 * from the host store first when that is cheaper than computing them (prefix_fetch.h), and giving
 * it, when its last chunk is sampled, what a hand-off carries (cached tokens, prefill time) and
 * its blocks to the cache-manager's index. The scheduler (engine/sched.h) computes the prompt in
 * chunks batched with the decode rows; a prompt waiting for its fetch is held there. */
#ifndef TROUPE_ACTORS_WORKER_PROMPT_INTAKE_H
#define TROUPE_ACTORS_WORKER_PROMPT_INTAKE_H

#include <stdint.h>

#include "actors/runtime/actor.h"
#include "actors/worker/worker.h"
#include "actors/worker/dc_req.h"
#include "actors/worker/prefix_fetch.h"
#include "engine/sched.h"

typedef struct prompt_intake {
    const char *self;            /* the worker's instance name */
    const char *cache_manager;   /* NULL when the topology has none */
    int colocated;               /* 0: prompts are refused (the topology has prefill workers) */
    worker_t *w;
    sched_t *sched;              /* the decode worker's: requests by id, prompts held for fetches */
    prefix_fetch_t fetch;        /* host-store blocks into our pool */
    uint64_t prompts;            /* prompts taken */
    uint64_t computed, cached;   /* prompt tokens computed here, adopted from the prefix cache */
    uint64_t ns;                 /* the prompt chunks' share of the forward time (their compute rate) */
} prompt_intake_t;

/* For worker w and its scheduler; -1 with why on a bad TROUPE_PREFILL_FETCH. */
int prompt_intake_init(prompt_intake_t *pi, worker_t *w, sched_t *sched, const char *self, const char *cache_manager,
                       int colocated, char *err, size_t errlen);

/* prefill_request m from `from`: the request joins the scheduler (PROMPTING), its prefix fetch
 * asked for; or `from` gets the error (bad request, or retryable when the worker cannot take it). */
void prompt_intake_take(prompt_intake_t *pi, actor_t *a, const actor_peer_t *from, const msg_t *m);
/* The chunk that ends r's prompt was computed: r gets a hand-off's cached tokens (and how many of
 * them its fetch brought from the host store's memory and disk) and prefill_ms,
 * its blocks are published to the cache-manager; the caller streams its first token next. */
void prompt_intake_done(prompt_intake_t *pi, actor_t *a, dc_req_t *r);
/* A forward computed `tokens` prompt tokens in ns (their share of it). */
void prompt_intake_computed(prompt_intake_t *pi, uint64_t tokens, uint64_t ns);

/* The cache-manager's answers to a fetch: its blocks (kv_announce: 1 when it was one, taken or
 * refused as late; 0 when k is not the cache-manager's), none of them (cache_fetch_reply with found
 * 0), or no answer in time (the scheduler's hold_expired hook). Each lets the prompt be scheduled
 * again. A cache_fetch_reply with blocks comes before them and says which were read from disk. */
int prompt_intake_on_announce(prompt_intake_t *pi, actor_t *a, const msg_kv_announce_t *k);
void prompt_intake_on_fetch_reply(prompt_intake_t *pi, const msg_t *m);
void prompt_intake_hold_expired(prompt_intake_t *pi, dc_req_t *r);

/* requests_prompting, prompts_total, computed_tokens_total, cached_tokens_total and the fetches'
 * (only when colocated). */
void prompt_intake_stats(const prompt_intake_t *pi, actor_t *a, msg_stats_t *st);

#endif
