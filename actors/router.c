/* actors/router.c — the router: the cluster's front door and every request's owner.
 *
 * Duties:
 *   - admit client requests (text, chat messages or token ids) into a bounded table
 *     (limits.admission_queue; past it an immediate `overloaded` error), tokenize them, check them
 *     against the model (vocabulary, max_model_len); text and chat prompts are encoded by
 *     TOKENIZER_THREADS threads (actors/router/tokpool.h), so a long one does not stall the loop,
 *     and the submit goes on when its ids come back (s_on_tokenized); token-id prompts inline;
 *   - choose a prefill worker by prefix overlap against load (the block hashes of the prompt
 *     against the cache-manager's index, mirrored here from its cache events) and a decode worker
 *     by load; send the prefill_request; pin the prefix when the client asked for retention;
 *   - relay token / done / error messages from the workers to the client, rewriting the router's
 *     internal id to the client's own; none is dropped on the way: a reply a client's connection
 *     cannot take now waits in its backlog (actor_reply_stream), and a client that does not read
 *     (its backlog at limits.outbox) has its requests failed with an error saying so, queued
 *     behind what it has not read: one slow client costs only its own requests; a request that
 *     does not stream (submit.stream false) gets no token messages: they are collected
 *     (actors/router/collected.h) and its one reply, the done, carries them whole;
 *   - enforce deadlines and cancellation; when a worker's process goes away (runtime peer watch,
 *     milliseconds), re-send its requests that have not streamed yet to live workers, and migrate
 *     the ones already streaming (s_migrate): a new prefill_request, under a new id of ours, whose
 *     prompt is the original prompt and the tokens already relayed, with max_tokens reduced by
 *     them, to a live prefill / decode pair chosen as for a new request (where its prefix is
 *     cached); the client's stream goes on at the next seq. At most MAX_MIGRATIONS a request;
 *     past them, or with no live worker to take it, it fails with a retryable error;
 *   - give every request exactly one terminal reply (done or error), never more.
 *
 * A request's life: PREFILL -> DECODE -> (removed), and DECODE -> PREFILL on a migration. Every
 * transition is logged in verbose mode.
 *
 * Migration and the text (actors/router/relayed.h): what each client has been sent is kept, with
 * the last point where the text relayed had caught up with the tokens; a greedy request is migrated
 * from there, and the tokens the new worker computes again are checked against what was relayed and
 * dropped (a mismatch fails the request, retryable: nothing wrong was sent). Greedy output without
 * presence/frequency penalties is thus the uninterrupted run's, token for token and byte for byte
 * (tests/scenario/decode_migrate.sh).
 *
 * Known limits: a sampled request (temperature > 0), or one with presence or frequency penalties
 * (they count output tokens only, and the relayed ones become prompt), is migrated from its last
 * relayed token: it continues with a valid sample of its own (its seed mixed with the tokens
 * already made, so the random stream is not replayed) that differs from the run it would have had;
 * text held back at that point (part of a character, the start of a possible stop string) is lost,
 * and a stop string that began before the migration is not matched. The generated tokens' KV died
 * with the worker: they are computed again (the prompt's blocks usually come from a cache). Text
 * prompts get no BOS unless the tokenizer's post-processor adds one. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <xxhash.h>
#include <zmq.h>

#include "actors/router/collected.h"
#include "actors/router/prompt.h"
#include "actors/router/relayed.h"
#include "actors/router/tokpool.h"
#include "actors/runtime/actor.h"
#include "common/log.h"
#include "common/u64map.h"
#include "common/util.h"
#include "engine/chat_template.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "engine/tokenizer.h"

#define MAX_WORKERS   64          /* prefill + decode instances the index can name */
#define HOST_BIT      63          /* index bit: the block is in the cache-manager's host store */
#define LAT_SAMPLES   2048
#define TOKENIZER_THREADS 2       /* encode text / chat prompts off the loop (tokpool.h) */
#define MAX_MIGRATIONS 2          /* a streaming request moved to other workers at most this often */

typedef enum { RQ_PREFILL, RQ_DECODE, RQ_STATE_COUNT } rq_state_t;
static const char *const s_state_names[RQ_STATE_COUNT] = {"prefill", "decode"};

typedef struct rq {
    uint64_t id;                 /* ours, unique in the cluster's life of this router */
    uint64_t client_id;          /* the client's id, restored on every reply */
    actor_peer_t client;         /* where replies go */
    uint8_t owner[ACTOR_ID_MAX]; /* the credential it was submitted under (s_owner): only a cancel */
    size_t owner_len;            /* under the same one reaches it */
    uint64_t client_key;         /* s_fair_key: its client's entry in router_t.per_client */
    rq_state_t state;
    int prefill, decode;         /* worker indices (into router_t.workers) */
    uint32_t prompt_tokens, cached_tokens;
    int64_t arrived_ms, first_ms, last_ms, deadline_ms;   /* monotonic; deadline 0 = none */
    msg_t pr;                    /* the prefill_request as sent, owning its prompt: re-sent elsewhere
                                    when a worker is lost before the first token, the base of a
                                    migration's (MSG_NONE: not kept) */
    int rerouted;                /* re-sent once already */
    uint32_t load_tokens;        /* prompt tokens of the attempt now in prefill (its prefill load) */
    uint32_t max_tokens;         /* the client's sampling.max_tokens */
    relayed_t sent;              /* what the client has been sent (sent.n: its completion), for a migration */
    int migrations;              /* times moved while streaming */
    int stream;                  /* submit.stream: relay its token messages; else collect them (got) */
    collected_t got;             /* !stream: the completion so far, for its done */
    struct rq *prev, *next;      /* every request (router_t.head), for the sweeps */
} rq_t;

typedef struct wk {
    const char *name;            /* instance name */
    topo_role_t role;
    int up;                      /* its process is connected */
    int inflight;                /* our requests it holds */
    uint64_t inflight_tokens;    /* prompt tokens queued at it (prefill load) */
} wk_t;

typedef struct router {
    const topo_t *topo;
    const char *name;
    const char *cache_manager;   /* NULL when none */
    void *clients;               /* ROUTER at our endpoints.clients entry */
    tokenizer_t *tok;            /* NULL: token-id prompts only */
    chat_family_t chat;
    prompt_model_t prompt;       /* tok, chat, vocabulary and max_model_len, for prompt_ids */
    tokpool_t *pool;             /* NULL without a tokenizer: every prompt is token ids */
    tokjob_t *tokenizing;        /* submits whose prompt is being encoded (dead ones too, until back) */
    int n_tokenizing;            /* of them, not dead: they count against the admission limits */
    model_config_t cfg;
    int max_model_len, block_size;
    int colocated;               /* no prefill actors: a decode worker computes its requests' prompts */
    wk_t workers[MAX_WORKERS];
    int n_workers;
    u64map_t index;              /* block hash -> bitmask of holders (worker index bits, HOST_BIT) */
    rq_t *head;
    int n_reqs;
    u64map_t by_id;              /* our id -> rq_t * */
    u64map_t by_client;          /* s_client_key(owner, client id) -> rq_t * */
    u64map_t per_client;         /* s_fair_key(owner, tenant) -> requests in flight (limits.max_inflight_per_client) */
    uint64_t next_id;            /* starts at a random point of a 62-bit space: a restarted router (or a
                                    second one) never reuses ids that workers may still be running */
    /* stats */
    uint64_t submitted, rejected, completed, failed, cancelled, rerouted, prompt_tokens, cached_tokens, gen_tokens;
    uint64_t migrated;           /* migrations done (a request moved twice counts twice) */
    uint64_t migrate_failed;     /* streaming requests that lost their worker and could not move */
    uint64_t migrate_diverged;   /* migrated requests whose recomputed tokens differed from the relayed */
    char *text_scratch;          /* [text_scratch_cap] one token's decoded bytes (relayed_track) */
    size_t text_scratch_cap;
    uint64_t cached_by_tier[MSG_TIER_COUNT]; /* of cached_tokens, by source (msg_usage_t's split) */
    uint64_t cancels_refused;    /* cancels naming another credential's request */
    uint64_t client_capped;      /* submits refused at limits.max_inflight_per_client */
    uint64_t stale_cancelled;    /* workers told to drop a request we do not know (an old incarnation's) */
    uint64_t cache_queries, cache_hits;      /* blocks looked up / found anywhere */
    float ttft[LAT_SAMPLES], itl[LAT_SAMPLES];
    int n_ttft, n_itl;
} router_t;

/* ---- bookkeeping ------------------------------------------------------------------------- */

/* A random starting id in [0, 2^62): two incarnations collide only if their 2^62-wide ranges'
 * starts fall within the number of requests one of them served. */
static uint64_t s_random_id_base(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = (uint64_t)now_ns() * 0x9e3779b97f4a7c15ULL;
    return v >> 2;
}

static rq_t *s_find(router_t *r, uint64_t id)
{
    const uint64_t *v = u64map_get(&r->by_id, id);
    return v ? (rq_t *)(uintptr_t)*v : NULL;
}

/* Who a client's request belongs to: the key it came in under when CURVE is in force (the ZAP
 * handler's name for it: "client:<public key>", or a gateway's instance name), else its connection
 * (routing id). A client may cancel only its own requests: the ids are its own choice, so another
 * client's request may carry the same one. With CURVE a client's second connection (a reconnect)
 * can cancel what its first one submitted; without CURVE, only the submitting connection can. */
static void s_owner(const actor_peer_t *from, const uint8_t **p, size_t *n)
{
    if (from->user[0]) {
        *p = (const uint8_t *)from->user;
        *n = strlen(from->user);
    } else {
        *p = from->id;
        *n = from->id_len;
    }
}

/* A client's request is named by its owner and its own id. The key is a hash of both: a collision
 * (2^-64 a pair) is caught by the comparison below, and then only costs that request its duplicate
 * check and its cancel. */
static uint64_t s_client_key(const uint8_t *owner, size_t owner_len, uint64_t client_id)
{
    const uint64_t k = XXH3_64bits_withSeed(owner, owner_len, client_id);
    return k ? k : 1;
}

static rq_t *s_find_owned(router_t *r, const uint8_t *owner, size_t owner_len, uint64_t client_id)
{
    const uint64_t *v = u64map_get(&r->by_client, s_client_key(owner, owner_len, client_id));
    rq_t *q = v ? (rq_t *)(uintptr_t)*v : NULL;
    return q && q->client_id == client_id && q->owner_len == owner_len && memcmp(q->owner, owner, owner_len) == 0
               ? q
               : NULL;
}

/* A client for the in-flight cap: its credential and its tenant (behind one gateway, every API
 * key's tenant is a client of its own). Never 0. */
static uint64_t s_fair_key(const uint8_t *owner, size_t owner_len, const char *tenant)
{
    const uint64_t k = XXH3_64bits_withSeed(owner, owner_len, XXH3_64bits(tenant ? tenant : "", tenant ? strlen(tenant) : 0));
    return k ? k : 1;
}

static rq_t *s_find_client(router_t *r, const actor_peer_t *from, uint64_t client_id)
{
    const uint8_t *o;
    size_t n;
    s_owner(from, &o, &n);
    return s_find_owned(r, o, n, client_id);
}

static int s_worker(router_t *r, const char *name)
{
    for (int i = 0; i < r->n_workers; i++)
        if (strcmp(r->workers[i].name, name) == 0)
            return i;
    return -1;
}

static void s_sample(float *ring, int *n, float v)
{
    ring[*n % LAT_SAMPLES] = v;
    (*n)++;
}

static void s_transition(rq_t *q, rq_state_t to, const char *on)
{
    LOG_D("request %llu: %s -> %s on %s", (unsigned long long)q->id, s_state_names[q->state], s_state_names[to], on);
    q->state = to;
}

/* A request's load on its workers, which the routing scores read: taken when it is assigned; its
 * prefill part given back once, when it leaves prefill (first token, done, re-route, removal);
 * its decode part when it ends or moves. */
static void s_load_take(router_t *r, rq_t *q, int pi, int di)
{
    q->prefill = pi;
    q->decode = di;
    r->workers[pi].inflight++;
    r->workers[pi].inflight_tokens += q->load_tokens;
    r->workers[di].inflight++;
}

/* Its prefill worker's share of q's load, given back while q is in prefill (not on `lost`: -1
 * none, a lost worker whose counts are reset). The one place it is. */
static void s_prefill_load_off(router_t *r, rq_t *q, int lost)
{
    if (q->state == RQ_PREFILL && q->prefill >= 0 && q->prefill != lost) {
        r->workers[q->prefill].inflight--;
        r->workers[q->prefill].inflight_tokens -= q->load_tokens;
    }
}

/* Gives back q's load on its workers, but on `lost`. */
static void s_load_release(router_t *r, rq_t *q, int lost)
{
    s_prefill_load_off(r, q, lost);
    if (q->decode >= 0 && q->decode != lost)
        r->workers[q->decode].inflight--;
}

/* Its first token (or its end) came: its prefill worker's load is over. */
static void s_leave_prefill(router_t *r, rq_t *q, const char *on)
{
    if (q->state != RQ_PREFILL)
        return;
    s_prefill_load_off(r, q, -1);
    s_transition(q, RQ_DECODE, on);
}

/* Removes a request after its terminal reply went out. */
static void s_remove(router_t *r, rq_t *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        r->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    u64map_del(&r->by_id, q->id);
    if (s_find_owned(r, q->owner, q->owner_len, q->client_id) == q)
        u64map_del(&r->by_client, s_client_key(q->owner, q->owner_len, q->client_id));
    uint64_t *in_flight = q->client_key ? u64map_get(&r->per_client, q->client_key) : NULL;
    if (in_flight && --*in_flight == 0)
        u64map_del(&r->per_client, q->client_key);
    s_load_release(r, q, -1);
    r->n_reqs--;
    msg_free(&q->pr);
    relayed_free(&q->sent);
    collected_free(&q->got);
    free(q);
}

/* The one terminal error of a request; tells its workers to let go of it. */
static void s_fail(actor_t *a, router_t *r, rq_t *q, msg_error_code_t code, int retryable, const char *why)
{
    msg_t c;
    msg_init(&c, MSG_CANCEL, q->id);
    if (q->prefill >= 0 && r->workers[q->prefill].up)
        actor_send_keep(a, r->workers[q->prefill].name, &c);   /* the worker must let go: never refused */
    if (q->decode >= 0 && q->decode != q->prefill && r->workers[q->decode].up)
        actor_send_keep(a, r->workers[q->decode].name, &c);
    msg_t e;
    msg_init(&e, MSG_ERROR, q->client_id);
    e.u.error.code = code;
    e.u.error.retryable = retryable != 0;
    e.u.error.message = why;
    actor_reply_stream(a, &q->client, &e, 1);   /* terminal: queued behind its stream, whatever the backlog */
    r->failed++;
    s_remove(r, q);
}

/* ---- admission --------------------------------------------------------------------------- */

/* Leading blocks of the prompt found in the index for holder bit `bit` (or anywhere with -1). */
static int s_matched(router_t *r, const uint64_t *hashes, int n, int bit)
{
    int k = 0;
    for (; k < n; k++) {
        uint64_t *v = u64map_get(&r->index, hashes[k]);
        if (!v || (bit >= 0 ? !(*v & (1ULL << bit)) : !*v))
            break;
    }
    return k;
}

/* A prefill_request's hint: the leading blocks of the prompt the cache-manager's host store holds,
 * so the prefill worker fetches what its own pool lacks instead of recomputing it (none: no hint).
 * holder is the caller's and must live until p is sent. */
static void s_host_hint(router_t *r, msg_prefill_request_t *p, const uint64_t *hashes, int n_hashes,
                        msg_cache_holder_t *holder)
{
    const int host = r->cache_manager ? s_matched(r, hashes, n_hashes, HOST_BIT) : 0;
    *holder = (msg_cache_holder_t){.holder = r->cache_manager, .tier = MSG_TIER_HOST, .matched_blocks = (uint32_t)host};
    p->hint_hashes = host > 0 ? hashes : NULL;
    p->n_hint_hashes = host > 0 ? (uint32_t)host : 0;
    p->hint_holders = host > 0 ? holder : NULL;
    p->n_hint_holders = host > 0 ? 1 : 0;
}

/* Prefill choice: the most prompt already cached there (own pool; the host store helps every
 * worker equally) minus the prompt tokens already queued there. Decode: the fewest requests.
 * Colocated (no prefill actors): the decode worker is chosen as the prefill one is, and computes
 * the prompt too. */
static void s_choose(router_t *r, const uint64_t *hashes, int n_hashes, int *prefill, int *decode, int *hit_blocks)
{
    long best = 0;
    *prefill = *decode = -1;
    *hit_blocks = s_matched(r, hashes, n_hashes, -1);
    const topo_role_t prefill_role = r->colocated ? ROLE_DECODE : ROLE_PREFILL;
    for (int i = 0; i < r->n_workers; i++) {
        wk_t *w = &r->workers[i];
        if (!w->up)
            continue;
        if (w->role == prefill_role) {
            long score = (long)s_matched(r, hashes, n_hashes, i) * r->block_size - (long)w->inflight_tokens;
            /* Colocated, the worker's running requests are its load too (inflight_tokens counts
             * prompts only until their first token): a block's worth of tokens each; ties go to
             * the fewest requests. */
            if (r->colocated)
                score -= (long)w->inflight * r->block_size;
            if (*prefill < 0 || score > best ||
                (score == best && r->colocated && w->inflight < r->workers[*prefill].inflight)) {
                best = score;
                *prefill = i;
            }
        }
        if (w->role == ROLE_DECODE && (*decode < 0 || w->inflight < r->workers[*decode].inflight))
            *decode = i;
    }
    if (r->colocated)   /* where the prefix is, less the prompt tokens queued there */
        *decode = *prefill;
}

/* A submit whose prompt is being encoded, by its client's credential and id (dead ones skipped). */
static tokjob_t *s_find_tokenizing(router_t *r, const actor_peer_t *from, uint64_t client_id)
{
    const uint8_t *owner, *o;
    size_t owner_len, o_len;
    s_owner(from, &owner, &owner_len);
    for (tokjob_t *j = r->tokenizing; j; j = j->next) {
        if (j->dead || j->submit.id != client_id)
            continue;
        s_owner(&j->from, &o, &o_len);
        if (o_len == owner_len && memcmp(o, owner, o_len) == 0)
            return j;
    }
    return NULL;
}

/* Submits being encoded under one s_fair_key (the per-client cap counts them). */
static uint64_t s_tokenizing_of(router_t *r, uint64_t client_key)
{
    uint64_t n = 0;
    const uint8_t *o;
    size_t o_len;
    for (tokjob_t *j = r->tokenizing; j; j = j->next) {
        if (j->dead)
            continue;
        s_owner(&j->from, &o, &o_len);
        n += s_fair_key(o, o_len, j->submit.u.submit.tenant) == client_key;
    }
    return n;
}

/* A tokenizing submit got its one terminal reply here: its result, when it comes, is dropped. */
static void s_tokenizing_end(router_t *r, tokjob_t *j)
{
    j->dead = 1;
    r->n_tokenizing--;
}

static void s_tokenizing_unlink(router_t *r, tokjob_t *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        r->tokenizing = j->next;
    if (j->next)
        j->next->prev = j->prev;
    j->prev = j->next = NULL;
}

static int s_submit_ids(actor_t *a, router_t *r, const actor_peer_t *from, const msg_t *m, int64_t arrived_ms,
                        int32_t *ids, size_t n);

static int s_on_submit(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    router_t *r = state;
    const msg_submit_t *s = &m->u.submit;
    r->submitted++;
    char err[512];
    const char *field = NULL;
    if (actor_draining(a)) {
        r->rejected++;
        return actor_reply_error(a, from, m->id, MSG_ERR_UNAVAILABLE, 1, "router is draining"), 0;
    }
    if (r->n_reqs + r->n_tokenizing >= r->topo->limits.admission_queue) {
        r->rejected++;
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "%d requests in flight (admission_queue)",
                                 r->n_reqs + r->n_tokenizing), 0;
    }
    const uint8_t *owner;
    size_t owner_len;
    s_owner(from, &owner, &owner_len);
    const uint64_t client_key = s_fair_key(owner, owner_len, s->tenant);
    const uint64_t *in_flight_p = u64map_get(&r->per_client, client_key);
    const uint64_t in_flight = (in_flight_p ? *in_flight_p : 0) + (r->n_tokenizing ? s_tokenizing_of(r, client_key) : 0);
    const int cap = r->topo->limits.max_inflight_per_client;
    if (cap > 0 && in_flight >= (uint64_t)cap) {
        /* One client cannot take the whole admission queue (and the workers' batches) from others. */
        r->rejected++;
        r->client_capped++;
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1,
                                 "this client has %d requests in flight (limits.max_inflight_per_client)", cap), 0;
    }
    if (!s->stream && s->sampling.top_logprobs) {
        /* The done that answers a request that does not stream carries no alternatives. */
        r->rejected++;
        msg_t e;
        msg_init(&e, MSG_ERROR, m->id);
        e.u.error.code = MSG_ERR_BAD_REQUEST;
        e.u.error.message = "sampling.top_logprobs needs stream: a request that does not stream gets its "
                            "tokens' logprobs in its done, without alternatives";
        e.u.error.field = "sampling.top_logprobs";
        actor_reply(a, from, &e);
        return 0;
    }
    if (s_find_client(r, from, m->id) || (r->n_tokenizing && s_find_tokenizing(r, from, m->id))) {
        r->rejected++;
        return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "request id %llu is already in flight",
                                 (unsigned long long)m->id), 0;
    }
    if (r->pool && !s->n_tokens) {
        /* Text or chat: encoded by the pool, the submit goes on in s_on_tokenized. */
        tokjob_t *j = calloc(1, sizeof *j);
        if (!j || msg_clone(m, &j->submit, err, sizeof err) != 0) {
            free(j);
            r->rejected++;
            return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "router out of memory"), 0;
        }
        j->from = *from;
        j->arrived_ms = now_ms();
        j->next = r->tokenizing;
        if (r->tokenizing)
            r->tokenizing->prev = j;
        r->tokenizing = j;
        r->n_tokenizing++;
        tokpool_submit(r->pool, j);
        return 0;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_ids(&r->prompt, s, &ids, &n, err, sizeof err, &field) != 0) {
        r->rejected++;
        msg_t e;
        msg_init(&e, MSG_ERROR, m->id);
        e.u.error.code = MSG_ERR_BAD_REQUEST;
        e.u.error.message = err;
        e.u.error.field = field;
        actor_reply(a, from, &e);
        return 0;
    }
    return s_submit_ids(a, r, from, m, now_ms(), ids, n);
}

/* The prompt's encoded results of a pool job, on the router's loop: each job either goes on to
 * s_submit_ids, gets the error prompt_ids gave, or (ended meanwhile) is dropped. */
static int s_on_tokenized(actor_t *a, void *state, void *sock)
{
    router_t *r = state;
    (void)sock;
    tokjob_t *j;
    while ((j = tokpool_recv(r->pool)) != NULL) {
        s_tokenizing_unlink(r, j);
        if (j->dead) {
            tokjob_free(&j);
            continue;
        }
        r->n_tokenizing--;
        if (j->rc != 0) {
            r->rejected++;
            msg_t e;
            msg_init(&e, MSG_ERROR, j->submit.id);
            e.u.error.code = MSG_ERR_BAD_REQUEST;
            e.u.error.message = j->err;
            e.u.error.field = j->field;
            actor_reply(a, &j->from, &e);
        } else {
            int32_t *ids = j->ids;
            j->ids = NULL;
            s_submit_ids(a, r, &j->from, &j->submit, j->arrived_ms, ids, j->n);
        }
        tokjob_free(&j);
    }
    return 0;
}

/* The rest of a submit once its prompt is token ids (ids: taken): checked against the model,
 * routed and sent. arrived_ms: when the submit came in (its deadline counts from there). */
static int s_submit_ids(actor_t *a, router_t *r, const actor_peer_t *from, const msg_t *m, int64_t arrived_ms,
                        int32_t *ids, size_t n)
{
    const msg_submit_t *s = &m->u.submit;
    char err[512];
    const uint8_t *owner;
    size_t owner_len;
    s_owner(from, &owner, &owner_len);
    const uint64_t client_key = s_fair_key(owner, owner_len, s->tenant);
    const uint64_t *in_flight_p = u64map_get(&r->per_client, client_key);
    const uint64_t in_flight = in_flight_p ? *in_flight_p : 0;
    if (n == 0 || (long)n + (long)s->sampling.max_tokens > r->max_model_len) {
        r->rejected++;
        free(ids);
        msg_t e;
        msg_init(&e, MSG_ERROR, m->id);
        e.u.error.code = MSG_ERR_BAD_REQUEST;
        snprintf(err, sizeof err, n == 0 ? "the prompt is empty" :
                 "prompt (%zu tokens) + max_tokens (%u) exceeds max_model_len (%d)", n, s->sampling.max_tokens,
                 r->max_model_len);
        e.u.error.message = err;
        e.u.error.field = n == 0 ? "prompt" : "sampling.max_tokens";
        actor_reply(a, from, &e);
        return 0;
    }

    /* Prefix hashes of the full blocks, salted by tenant. */
    uint64_t salt = kv_tenant_salt(s->tenant);
    int n_hashes = (int)n / r->block_size;
    uint64_t *hashes = calloc((size_t)n_hashes + 1, sizeof *hashes);
    if (!hashes) {
        r->rejected++;
        free(ids);
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "router out of memory"), 0;
    }
    for (int i = 0; i < n_hashes; i++)
        hashes[i] = kv_block_hash(salt, i ? hashes[i - 1] : 0, ids + (size_t)i * r->block_size, r->block_size);
    int pi, di, hit;
    s_choose(r, hashes, n_hashes, &pi, &di, &hit);
    r->cache_queries += (uint64_t)n_hashes;
    r->cache_hits += (uint64_t)hit;
    if (pi < 0 || di < 0) {
        r->rejected++;
        free(ids);
        free(hashes);
        return actor_reply_error(a, from, m->id, MSG_ERR_UNAVAILABLE, 1, "no %s worker is up",
                                 pi < 0 && !r->colocated ? "prefill" : "decode"), 0;
    }

    rq_t *q = calloc(1, sizeof *q);
    if (!q) {
        r->rejected++;
        free(ids);
        free(hashes);
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "router out of memory"), 0;
    }
    q->id = ++r->next_id;
    q->client_id = m->id;
    q->client = *from;
    q->owner_len = owner_len;
    memcpy(q->owner, owner, owner_len);
    q->prompt_tokens = q->load_tokens = (uint32_t)n;
    q->max_tokens = s->sampling.max_tokens;
    relayed_init(&q->sent, r->tok, q->max_tokens);
    q->stream = s->stream;
    collected_init(&q->got, s->sampling.logprobs);
    q->arrived_ms = arrived_ms;
    q->deadline_ms = s->timeout_ms ? q->arrived_ms + s->timeout_ms : 0;
    q->state = RQ_PREFILL;

    msg_t pr;
    msg_init(&pr, MSG_PREFILL_REQUEST, q->id);
    msg_prefill_request_t *p = &pr.u.prefill_request;
    p->tokens = (const uint32_t *)ids;
    p->n_tokens = (uint32_t)n;
    p->sampling = s->sampling;
    if (p->sampling.seed < 0) {
        /* Resolve "random" here so prefill and decode continue one random stream. */
        p->sampling.seed = (int64_t)((uint64_t)now_ns() * 0x9e3779b97f4a7c15ULL >> 1);
    }
    p->decode_worker = r->workers[di].name;
    p->reply_to = r->name;
    p->tenant_salt = salt;
    p->client_key = client_key;   /* the workers' fair admission (engine/sched.h) */
    p->prompt_cache_key = s->prompt_cache_key;
    p->cache_retention_s = s->cache_retention_s;
    p->deadline_ms = s->timeout_ms ? (uint64_t)(wall_ms() + q->deadline_ms - now_ms()) : 0;
    msg_cache_holder_t holder;
    s_host_hint(r, p, hashes, n_hashes, &holder);
    int rc = actor_send(a, r->workers[pi].name, &pr);
    if (rc == 0 && msg_clone(&pr, &q->pr, err, sizeof err) != 0)
        msg_init(&q->pr, MSG_NONE, 0);   /* no copy: this request just cannot be re-routed */
    if (rc == 0 && s->prompt_cache_key && r->cache_manager && n_hashes > 0) {
        uint32_t retention = s->cache_retention_s ? s->cache_retention_s : (uint32_t)r->topo->cache.default_retention_s;
        msg_t pin;
        msg_init(&pin, MSG_CACHE_PIN, q->id);
        pin.u.cache_pin.tenant = s->tenant;
        pin.u.cache_pin.prompt_cache_key = s->prompt_cache_key;
        pin.u.cache_pin.hashes = hashes;
        pin.u.cache_pin.n_hashes = (uint32_t)n_hashes;
        pin.u.cache_pin.expires_in_ms = (uint64_t)retention * 1000;
        actor_send(a, r->cache_manager, &pin);
    }
    free(ids);
    free(hashes);
    if (rc != 0) {
        free(q);
        r->rejected++;
        return actor_reply_error(a, from, m->id, MSG_ERR_OVERLOADED, 1, "prefill worker %s is not accepting work",
                                 r->workers[pi].name), 0;
    }
    q->next = r->head;
    if (r->head)
        r->head->prev = q;
    r->head = q;
    r->n_reqs++;
    s_load_take(r, q, pi, di);
    /* Not found by our id, its workers' replies would be dropped: out of memory, it fails now. */
    if (u64map_put(&r->by_id, q->id, (uint64_t)(uintptr_t)q) != 0 ||
        u64map_put(&r->by_client, s_client_key(q->owner, q->owner_len, m->id), (uint64_t)(uintptr_t)q) != 0 ||
        u64map_put(&r->per_client, client_key, in_flight + 1) != 0) {
        s_fail(a, r, q, MSG_ERR_OVERLOADED, 1, "router out of memory");
        return 0;
    }
    q->client_key = client_key;   /* counted: s_remove gives it back */
    r->prompt_tokens += n;
    LOG_D("request %llu (client %llu): %zu prompt tokens, %d cached blocks known -> %s / %s",
          (unsigned long long)q->id, (unsigned long long)m->id, n, hit, r->workers[pi].name, r->workers[di].name);
    return 0;
}

static int s_on_cancel(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    router_t *r = state;
    /* Only the credential that submitted a request may cancel it (s_owner): ids are chosen by
     * clients, so another client's request may carry the same one. */
    rq_t *q = s_find_client(r, from, m->id);
    tokjob_t *j = q || !r->n_tokenizing ? NULL : s_find_tokenizing(r, from, m->id);
    if (j) {
        /* Still being encoded: ended here, its result dropped when it comes back. */
        msg_t d;
        msg_init(&d, MSG_DONE, m->id);
        d.u.done.finish = MSG_FINISH_CANCELLED;
        d.u.done.timings.e2e_ms = (uint32_t)(now_ms() - j->arrived_ms);
        actor_reply_stream(a, &j->from, &d, 1);
        r->cancelled++;
        s_tokenizing_end(r, j);
        return 0;
    }
    if (!q) {
        int others = 0;
        for (rq_t *o = r->head; o; o = o->next)
            others |= o->client_id == m->id;
        for (tokjob_t *o = r->tokenizing; o; o = o->next)
            others |= !o->dead && o->submit.id == m->id;
        if (others) {
            /* In flight, but someone else's: refused, and said so (nothing of that request
             * changes; its owner hears nothing of it). */
            r->cancels_refused++;
            return actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0,
                                     "cancel refused: request %llu was not submitted under this client's %s",
                                     (unsigned long long)m->id, from->user[0] ? "key" : "connection"), 0;
        }
        /* Already finished (its one terminal reply is out) or never known: a cancel is idempotent,
         * and answering it would look like a second terminal reply for that id. */
        LOG_D("cancel of request %llu, not in flight: ignored", (unsigned long long)m->id);
        return 0;
    }
    msg_t c;
    msg_init(&c, MSG_CANCEL, q->id);
    if (q->prefill >= 0)
        actor_send_keep(a, r->workers[q->prefill].name, &c);
    if (q->decode >= 0 && q->decode != q->prefill)
        actor_send_keep(a, r->workers[q->decode].name, &c);
    msg_t d;
    msg_init(&d, MSG_DONE, q->client_id);
    d.u.done.finish = MSG_FINISH_CANCELLED;
    d.u.done.usage.prompt_tokens = q->prompt_tokens;
    d.u.done.usage.cached_tokens = q->cached_tokens;
    d.u.done.usage.completion_tokens = q->sent.n;
    d.u.done.timings.e2e_ms = (uint32_t)(now_ms() - q->arrived_ms);
    if (!q->stream)
        collected_fill(&q->got, &d.u.done);   /* what it made before the cancel */
    actor_reply_stream(a, &q->client, &d, 1);
    r->cancelled++;
    s_remove(r, q);
    return 0;
}

/* ---- from the workers -------------------------------------------------------------------- */

/* Worker messages come on the inbox; the same types arriving from a client are refused (a client
 * must not be able to end or feed someone else's request). */
static int s_from_client(actor_t *a, router_t *r, const actor_peer_t *from, const msg_t *m)
{
    if (from->sock != r->clients)
        return 0;
    actor_reply_error(a, from, m->id, MSG_ERR_BAD_REQUEST, 0, "'%s' is not a client message",
                      msg_type_name(m->type));
    return 1;
}

/* 1 if `from` is the worker the request is assigned to now. After a re-route, or from a worker's
 * new incarnation fed stale messages, another worker may still speak for the request: it is told
 * to drop it and is not heard. */
static int s_from_assigned(actor_t *a, router_t *r, rq_t *q, const actor_peer_t *from)
{
    for (int k = 0; k < 2; k++) {
        int w = k ? q->prefill : q->decode;
        if (w >= 0 && strlen(r->workers[w].name) == from->id_len &&
            memcmp(r->workers[w].name, from->id, from->id_len) == 0)
            return 1;
    }
    msg_t c;
    msg_init(&c, MSG_CANCEL, q->id);
    actor_reply(a, from, &c);
    LOG_D("request %llu: message from %.*s, not its worker: told to drop it", (unsigned long long)q->id,
          (int)from->id_len, (const char *)from->id);
    return 0;
}

/* The request a worker's token / done / error message is about, or NULL when the message must be
 * dropped: it came from a client, the request is over (cancelled or failed), or the sender is not
 * the request's worker (s_from_assigned). */
static rq_t *s_worker_msg(actor_t *a, router_t *r, const actor_peer_t *from, const msg_t *m)
{
    if (s_from_client(a, r, from, m))
        return NULL;
    rq_t *q = s_find(r, m->id);
    if (!q && m->type == MSG_TOKEN) {
        /* Not ours (any more): ended here already (its cancel is on its way), or a request of an
         * earlier incarnation of this router that its worker did not see die. Either way the
         * worker is told to drop it, so nobody's KV is spent on a stream nobody reads. */
        msg_t c;
        msg_init(&c, MSG_CANCEL, m->id);
        actor_reply(a, from, &c);
        r->stale_cancelled++;
        return NULL;
    }
    return q && s_from_assigned(a, r, q, from) ? q : NULL;
}

/* ---- migration --------------------------------------------------------------------------- */

/* A migrated request whose new attempt did not reproduce what the client was sent: it fails,
 * retryable (what the client has is right, only its continuation is not to be had here). */
static void s_diverged(actor_t *a, router_t *r, rq_t *q, const char *what)
{
    char why[200];
    snprintf(why, sizeof why, "request moved after losing its worker: its recomputed stream %s; retry the request",
             what);
    LOG_W("request %llu: %s", (unsigned long long)q->id, why);
    r->migrate_diverged++;
    s_fail(a, r, q, MSG_ERR_WORKER_LOST, 1, why);
}

static int s_on_token(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    router_t *r = state;
    rq_t *q = s_worker_msg(a, r, from, m);
    if (!q)
        return 0;   /* from a client, for a request that is over, or not from its worker: drop */
    int64_t now = now_ms();
    if (q->state == RQ_PREFILL) {
        s_leave_prefill(r, q, q->migrations ? "first token after migration" : "first token");
        if (!q->first_ms) {
            q->first_ms = now;
            s_sample(r->ttft, &r->n_ttft, (float)(now - q->arrived_ms));
        }
    }
    msg_token_t *t = &m->u.token;
    if (q->migrations) {
        const char *why = NULL;
        const int rc = relayed_resume(&q->sent, t, &why);
        if (rc < 0)
            s_diverged(a, r, q, why);
        if (rc != 0)
            return 0;   /* a repeat, dropped; or the request failed */
    }
    if (q->last_ms)   /* 0 before the first token; after a migration the gap counts */
        s_sample(r->itl, &r->n_itl, (float)(now - q->last_ms));
    q->last_ms = now;
    const char *lost = NULL;
    if (relayed_track(&q->sent, t, r->text_scratch, r->text_scratch_cap, &lost) != 0)
        LOG_W("request %llu: its tokens cannot be kept (%s): it cannot migrate", (unsigned long long)q->id, lost);
    r->gen_tokens += t->n_tokens;
    if (!q->stream) {   /* kept for its done, which carries the whole completion */
        int overloaded;
        if (collected_add(&q->got, t, &lost, &overloaded) != 0)
            s_fail(a, r, q, overloaded ? MSG_ERR_OVERLOADED : MSG_ERR_BAD_REQUEST, overloaded, lost);
        return 0;
    }
    m->id = q->client_id;
    const int rc = actor_reply_stream(a, &q->client, m, 0);
    if (rc == ACTOR_REFUSED) {
        /* The client does not read: its connection's backlog is full. Its request stops here, with
         * an error it reads after the tokens it has not read yet (not a silent gap in its stream). */
        char why[160];
        snprintf(why, sizeof why, "the client does not read its replies: %d wait for its connection "
                 "(limits.outbox); request cancelled", actor_outbox_cap(a));
        s_fail(a, r, q, MSG_ERR_CANCELLED, 0, why);
    } else if (rc != 0) {
        s_fail(a, r, q, MSG_ERR_CANCELLED, 0, "client unreachable");   /* gone: stop the work */
    }
    return 0;
}

static int s_on_done(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    router_t *r = state;
    rq_t *q = s_worker_msg(a, r, from, m);
    if (!q)
        return 0;   /* from a client, for a request that is over, or not from its worker: drop */
    int64_t now = now_ms();
    msg_done_t *d = &m->u.done;
    if (q->migrations) {
        /* The last attempt's usage counts the tokens relayed before its cut as prompt: the client's
         * is its own prompt and every token it was sent; cached, the last attempt's hits (at most
         * the prompt). An attempt that ended before the tokens already sent did not reproduce them. */
        if (!relayed_done_complete(&q->sent, d->usage.completion_tokens)) {
            s_diverged(a, r, q, "ended before the tokens already sent");
            return 0;
        }
        msg_usage_t *u = &d->usage;
        u->prompt_tokens = q->prompt_tokens;
        u->completion_tokens = q->sent.n;
        if (u->cached_tokens > u->prompt_tokens) {
            uint32_t left = u->cached_tokens = u->prompt_tokens;
            uint32_t *tier[] = {&u->cached_device_tokens, &u->cached_host_tokens, &u->cached_disk_tokens};
            for (int i = 0; i < 3; i++) {   /* the split still sums to cached_tokens (or is all 0) */
                if (*tier[i] > left)
                    *tier[i] = left;
                left -= *tier[i];
            }
        }
    }
    d->timings.ttft_ms = q->first_ms ? (uint32_t)(q->first_ms - q->arrived_ms) : 0;
    d->timings.e2e_ms = (uint32_t)(now - q->arrived_ms);
    r->cached_tokens += d->usage.cached_tokens;
    r->cached_by_tier[MSG_TIER_DEVICE] += d->usage.cached_device_tokens;
    r->cached_by_tier[MSG_TIER_HOST] += d->usage.cached_host_tokens;
    r->cached_by_tier[MSG_TIER_DISK] += d->usage.cached_disk_tokens;
    if (!q->stream)
        collected_fill(&q->got, d);   /* freed with q, after the reply is encoded */
    m->id = q->client_id;
    actor_reply_stream(a, &q->client, m, 1);   /* terminal: never refused */
    r->completed++;
    s_leave_prefill(r, q, "done");   /* finished on its first token */
    s_remove(r, q);
    return 0;
}

static int s_on_error(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    router_t *r = state;
    rq_t *q = s_worker_msg(a, r, from, m);
    if (!q)
        return 0;   /* from a client, for a request that is over, or not from its worker: drop */
    s_fail(a, r, q, m->u.error.code, m->u.error.retryable, m->u.error.message);
    return 0;
}

/* The cache-manager's index events, mirrored for routing. */
static int s_on_cache_event(actor_t *a, void *state, const actor_peer_t *from, msg_t *m)
{
    router_t *r = state;
    if (s_from_client(a, r, from, m))
        return 0;
    const msg_cache_event_t *e = &m->u.cache_event;
    int bit = e->tier == MSG_TIER_HOST ? HOST_BIT : s_worker(r, e->holder);
    if (bit < 0)
        return 0;
    for (uint32_t i = 0; i < e->n_hashes; i++) {
        uint64_t *v = u64map_get(&r->index, e->hashes[i]);
        if (e->kind == MSG_CEV_STORED || e->kind == MSG_CEV_PINNED) {
            u64map_put(&r->index, e->hashes[i], (v ? *v : 0) | (1ULL << bit));
        } else if (v) {
            *v &= ~(1ULL << bit);
            if (!*v)
                u64map_del(&r->index, e->hashes[i]);
        }
    }
    return 0;
}

/* The up worker of a role with the least work, other than `not`; -1 if none. */
static int s_least_loaded(router_t *r, topo_role_t role, int not)
{
    int best = -1;
    for (int i = 0; i < r->n_workers; i++) {
        wk_t *w = &r->workers[i];
        if (i == not || !w->up || w->role != role)
            continue;
        if (best < 0 || (role == ROLE_PREFILL ? w->inflight_tokens < r->workers[best].inflight_tokens
                                              : w->inflight < r->workers[best].inflight))
            best = i;
    }
    return best;
}

/* A request that lost a worker before its first token is sent again, to live workers: nothing
 * reached the client yet, so it is recomputed elsewhere (its prompt blocks are usually still
 * cached at the prefill worker). Once only. Returns 1 if it was re-sent. */
static int s_reroute(actor_t *a, router_t *r, rq_t *q, int lost)
{
    if (q->state != RQ_PREFILL || q->rerouted || q->pr.type != MSG_PREFILL_REQUEST)
        return 0;
    int pi = q->prefill == lost ? s_least_loaded(r, ROLE_PREFILL, lost) : q->prefill;
    int di = q->decode == lost ? s_least_loaded(r, ROLE_DECODE, lost) : q->decode;
    if (r->colocated)   /* one worker does both */
        pi = di;
    if (pi < 0 || di < 0)
        return 0;
    if (q->prefill != lost && q->prefill >= 0) {
        /* It may still sit at its (live) prefill worker, mid-hand-off to the dead decode worker:
         * cancel it there first; the same connection delivers the cancel before the new request. */
        msg_t c;
        msg_init(&c, MSG_CANCEL, q->id);
        actor_send(a, r->workers[q->prefill].name, &c);
    }
    q->pr.u.prefill_request.decode_worker = r->workers[di].name;
    if (actor_send(a, r->workers[pi].name, &q->pr) != 0)
        return 0;
    s_load_release(r, q, lost);
    s_load_take(r, q, pi, di);
    q->rerouted = 1;
    r->rerouted++;
    LOG_I("request %llu re-routed to %s / %s after losing %s", (unsigned long long)q->id, r->workers[pi].name,
          r->workers[di].name, r->workers[lost].name);
    return 1;
}

/* A request whose tokens already say it is over (max_tokens of them, or a stop or EOS id last):
 * its worker died between its last token and its done. */
static int s_ended_already(router_t *r, const rq_t *q, msg_finish_t *fin)
{
    *fin = MSG_FINISH_LENGTH;
    if (q->sent.n >= q->max_tokens)
        return 1;
    if (q->sent.n == 0 || q->sent.lost)
        return 0;
    *fin = MSG_FINISH_STOP;
    const int32_t last = q->sent.ids[q->sent.n - 1];
    const msg_sampling_t *s = &q->pr.u.prefill_request.sampling;
    for (uint32_t i = 0; i < s->n_stop_token_ids; i++)
        if ((int32_t)s->stop_token_ids[i] == last)
            return 1;
    if (s->ignore_eos)
        return 0;
    for (int i = 0; i < r->cfg.n_eos; i++)   /* the workers' EOS ids (worker_sampler_params) */
        if (r->cfg.eos_token_ids[i] == last)
            return 1;
    return r->cfg.n_eos == 0 && r->tok && tok_eos_id(r->tok) == last;
}

/* The done its lost worker did not send. */
static void s_end_here(actor_t *a, router_t *r, rq_t *q, msg_finish_t fin)
{
    msg_t d;
    msg_init(&d, MSG_DONE, q->client_id);
    d.u.done.finish = fin;
    d.u.done.usage.prompt_tokens = q->prompt_tokens;
    d.u.done.usage.completion_tokens = q->sent.n;
    d.u.done.timings.ttft_ms = q->first_ms ? (uint32_t)(q->first_ms - q->arrived_ms) : 0;
    d.u.done.timings.e2e_ms = (uint32_t)(now_ms() - q->arrived_ms);
    if (!q->stream)
        collected_fill(&q->got, &d.u.done);
    actor_reply_stream(a, &q->client, &d, 1);
    r->completed++;
    LOG_I("request %llu: its worker was lost after its last token; done (%s) sent here", (unsigned long long)q->id,
          fin == MSG_FINISH_STOP ? "stop" : "length");
    s_remove(r, q);
}

/* A request that lost a worker after its stream began continues elsewhere: a new prefill_request
 * (a new id of ours: anything still on its way for the old one is dropped as stale) whose prompt is
 * the original prompt and the tokens relayed up to the cut, max_tokens reduced by them, to a live
 * prefill / decode pair chosen as for a new request (the prompt's blocks are usually cached where
 * it was prefilled, or in the host store). The cut is where the text relayed had caught up with the
 * tokens (relayed_track), for a request whose next tokens do not depend on where its output began
 * (greedy, no presence / frequency penalty): the new attempt then starts in the state the old one
 * was in and its repeats are checked and dropped (relayed_resume); otherwise the cut is the last token
 * relayed and the seed is mixed with the tokens already made. Returns 1 if the request moved (or
 * was over: its done is sent here, and it is gone). */
static int s_migrate(actor_t *a, router_t *r, rq_t *q, int lost)
{
    if (q->migrations >= MAX_MIGRATIONS || q->sent.lost || q->pr.type != MSG_PREFILL_REQUEST)
        return 0;
    msg_finish_t fin;
    if (s_ended_already(r, q, &fin)) {
        s_end_here(a, r, q, fin);
        return 1;
    }
    const msg_prefill_request_t *op = &q->pr.u.prefill_request;
    const int exact = op->sampling.temperature == 0 && op->sampling.presence_penalty == 0 &&
                      op->sampling.frequency_penalty == 0;
    const uint32_t cut = relayed_cut(&q->sent, exact);
    const uint32_t n = op->n_tokens + cut;
    const int n_hashes = (int)n / r->block_size;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    uint64_t *hashes = calloc((size_t)n_hashes + 1, sizeof *hashes);
    if (!ids || !hashes) {
        free(ids);
        free(hashes);
        return 0;
    }
    memcpy(ids, op->tokens, (size_t)op->n_tokens * sizeof *ids);   /* ids < vocab_size: the same bits */
    memcpy(ids + op->n_tokens, q->sent.ids, (size_t)cut * sizeof *ids);
    for (int i = 0; i < n_hashes; i++)
        hashes[i] = kv_block_hash(op->tenant_salt, i ? hashes[i - 1] : 0, ids + (size_t)i * r->block_size,
                                  r->block_size);
    int pi, di, hit, rc = -1;
    s_choose(r, hashes, n_hashes, &pi, &di, &hit);
    const uint64_t id = r->next_id + 1;
    if (pi >= 0 && di >= 0 && u64map_put(&r->by_id, id, (uint64_t)(uintptr_t)q) == 0) {
        msg_t pr;
        msg_init(&pr, MSG_PREFILL_REQUEST, id);
        msg_prefill_request_t *p = &pr.u.prefill_request;
        *p = *op;   /* its strings and stop lists stay q->pr's */
        p->tokens = (const uint32_t *)ids;
        p->n_tokens = n;
        p->sampling.max_tokens = q->max_tokens - cut;
        if (!exact)   /* the counter-based draws restart at 0: not the ones already used */
            p->sampling.seed = (int64_t)(XXH3_64bits_withSeed(&q->sent.n, sizeof q->sent.n,
                                                              (uint64_t)op->sampling.seed) >> 1);
        p->decode_worker = r->workers[di].name;
        msg_cache_holder_t holder;
        s_host_hint(r, p, hashes, n_hashes, &holder);
        rc = actor_send(a, r->workers[pi].name, &pr);
        if (rc != 0)
            u64map_del(&r->by_id, id);
    }
    free(ids);
    free(hashes);
    if (rc != 0)
        return 0;
    r->next_id = id;
    r->cache_queries += (uint64_t)n_hashes;
    r->cache_hits += (uint64_t)hit;
    /* The old attempt, where it may still sit at a live worker (lost before its first token again). */
    msg_t c;
    msg_init(&c, MSG_CANCEL, q->id);
    if (q->state == RQ_PREFILL && q->prefill >= 0 && q->prefill != lost && r->workers[q->prefill].up)
        actor_send_keep(a, r->workers[q->prefill].name, &c);
    if (q->state == RQ_PREFILL && q->decode >= 0 && q->decode != lost && q->decode != q->prefill &&
        r->workers[q->decode].up)
        actor_send_keep(a, r->workers[q->decode].name, &c);
    LOG_I("request %llu (client %llu) migrated as %llu to %s / %s after losing %s: %u tokens sent, resumed "
          "after %u, %llu text bytes to skip (migration %d of at most %d)", (unsigned long long)q->id,
          (unsigned long long)q->client_id, (unsigned long long)id, r->workers[pi].name, r->workers[di].name,
          r->workers[lost].name, q->sent.n, cut,
          (unsigned long long)relayed_text_to_skip(&q->sent, exact), q->migrations + 1, MAX_MIGRATIONS);
    u64map_del(&r->by_id, q->id);
    q->id = id;
    s_load_release(r, q, lost);
    if (q->state != RQ_PREFILL)
        s_transition(q, RQ_PREFILL, "migration");
    q->load_tokens = n;
    s_load_take(r, q, pi, di);
    relayed_restart(&q->sent, cut, exact);
    q->migrations++;
    r->migrated++;
    return 1;
}

static void s_peer_event(actor_t *a, void *state, const char *peer, int up)
{
    router_t *r = state;
    int w = s_worker(r, peer);
    if (w < 0)
        return;
    r->workers[w].up = up;
    if (up)
        return;
    /* Its process is gone: a request that has not streamed yet goes to other workers, one that
     * has migrates (s_migrate); one that can do neither fails now, retryable. Its cached blocks
     * are forgotten. */
    int n = 0, moved = 0, migrated = 0;
    for (rq_t *q = r->head, *next; q; q = next) {
        next = q->next;
        if (q->decode == w || (q->prefill == w && q->state == RQ_PREFILL)) {
            if (q->sent.n == 0 && s_reroute(a, r, q, w)) {
                moved++;
                continue;
            }
            const int streamed = q->sent.n > 0, past_limit = q->migrations >= MAX_MIGRATIONS;
            if (streamed && s_migrate(a, r, q, w)) {
                migrated++;
                continue;
            }
            r->migrate_failed += streamed;
            char why[160];
            if (past_limit)
                snprintf(why, sizeof why, "worker %s was lost, after the request had moved %d times (the limit); "
                         "retry the request", peer, MAX_MIGRATIONS);
            else
                snprintf(why, sizeof why, "worker %s was lost; retry the request", peer);
            if (q->decode == w)
                q->decode = -1;   /* no cancel to the dead one */
            if (q->prefill == w)
                q->prefill = -1;
            s_fail(a, r, q, MSG_ERR_WORKER_LOST, 1, why);
            n++;
        }
    }
    r->workers[w].inflight = 0;   /* every request it held has just failed or moved */
    r->workers[w].inflight_tokens = 0;
    for (size_t i = 0; i < r->index.cap; i++)
        if (r->index.keys[i])
            r->index.vals[i] &= ~(1ULL << w);
    LOG_W("worker %s lost: %d requests re-routed, %d migrated, %d failed with a retryable error", peer, moved,
          migrated, n);
}

/* ---- timers and stats -------------------------------------------------------------------- */

static int s_deadlines(actor_t *a, void *state)
{
    router_t *r = state;
    int64_t now = now_ms();
    for (rq_t *q = r->head, *next; q; q = next) {
        next = q->next;
        if (q->deadline_ms && now > q->deadline_ms)
            s_fail(a, r, q, MSG_ERR_TIMEOUT, 1, "deadline exceeded");
    }
    for (tokjob_t *j = r->tokenizing; j; j = j->next) {
        uint32_t timeout = j->submit.u.submit.timeout_ms;
        if (j->dead || !timeout || now <= j->arrived_ms + timeout)
            continue;
        msg_t e;
        msg_init(&e, MSG_ERROR, j->submit.id);
        e.u.error.code = MSG_ERR_TIMEOUT;
        e.u.error.retryable = 1;
        e.u.error.message = "deadline exceeded";
        actor_reply_stream(a, &j->from, &e, 1);
        r->failed++;
        s_tokenizing_end(r, j);
    }
    return 0;
}

static int s_cmpf(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return a < b ? -1 : a > b;
}

static double s_pct(const float *ring, int n, double p)
{
    int k = n < LAT_SAMPLES ? n : LAT_SAMPLES;
    if (k == 0)
        return 0;
    float tmp[LAT_SAMPLES];
    memcpy(tmp, ring, (size_t)k * sizeof *tmp);
    qsort(tmp, (size_t)k, sizeof *tmp, s_cmpf);
    int i = (int)(p * (k - 1) + 0.5);
    return tmp[i];
}

static void s_fill_stats(actor_t *a, void *state, msg_stats_t *st)
{
    router_t *r = state;
    int prefilling = 0, decoding = 0;
    for (rq_t *q = r->head; q; q = q->next) {
        prefilling += q->state == RQ_PREFILL;
        decoding += q->state == RQ_DECODE;
    }
    actor_stat_queue(a, st, "requests", (uint64_t)r->n_reqs, (uint64_t)r->topo->limits.admission_queue);
    actor_stat_metric(a, st, "requests_waiting", prefilling, 0);
    actor_stat_metric(a, st, "requests_tokenizing", r->n_tokenizing, 0);
    actor_stat_metric(a, st, "requests_running", decoding, 0);
    actor_stat_metric(a, st, "requests_submitted", (double)r->submitted, 1);
    actor_stat_metric(a, st, "requests_rejected", (double)r->rejected, 1);
    actor_stat_metric(a, st, "requests_completed", (double)r->completed, 1);
    actor_stat_metric(a, st, "requests_failed", (double)r->failed, 1);
    actor_stat_metric(a, st, "requests_cancelled", (double)r->cancelled, 1);
    actor_stat_metric(a, st, "requests_rerouted", (double)r->rerouted, 1);
    actor_stat_metric(a, st, "requests_migrated", (double)r->migrated, 1);
    actor_stat_metric(a, st, "migrations_failed", (double)r->migrate_failed, 1);
    actor_stat_metric(a, st, "migrations_diverged", (double)r->migrate_diverged, 1);
    actor_stat_metric(a, st, "cancels_refused", (double)r->cancels_refused, 1);
    actor_stat_metric(a, st, "requests_client_capped", (double)r->client_capped, 1);
    actor_stat_metric(a, st, "stale_requests_cancelled", (double)r->stale_cancelled, 1);
    actor_stat_metric(a, st, "prompt_tokens_total", (double)r->prompt_tokens, 1);
    actor_stat_metric(a, st, "cached_tokens_total", (double)r->cached_tokens, 1);
    actor_stat_metric(a, st, "cached_device_tokens_total", (double)r->cached_by_tier[MSG_TIER_DEVICE], 1);
    actor_stat_metric(a, st, "cached_host_tokens_total", (double)r->cached_by_tier[MSG_TIER_HOST], 1);
    actor_stat_metric(a, st, "cached_disk_tokens_total", (double)r->cached_by_tier[MSG_TIER_DISK], 1);
    actor_stat_metric(a, st, "generation_tokens_total", (double)r->gen_tokens, 1);
    actor_stat_metric(a, st, "prefix_cache_queries", (double)r->cache_queries, 1);
    actor_stat_metric(a, st, "prefix_cache_hits", (double)r->cache_hits, 1);
    /* Blocks it knows a holder of: after a restart, the cache-manager's announcement has arrived once
     * this reaches the store's size (a request routed before gets no hint). */
    actor_stat_metric(a, st, "prefix_index_blocks", (double)r->index.n, 0);
    actor_stat_metric(a, st, "ttft_p50_ms", s_pct(r->ttft, r->n_ttft, 0.5), 0);
    actor_stat_metric(a, st, "ttft_p99_ms", s_pct(r->ttft, r->n_ttft, 0.99), 0);
    actor_stat_metric(a, st, "itl_p50_ms", s_pct(r->itl, r->n_itl, 0.5), 0);
    actor_stat_metric(a, st, "itl_p99_ms", s_pct(r->itl, r->n_itl, 0.99), 0);
}

static int s_drained(actor_t *a, void *state)
{
    const router_t *r = state;
    return r->n_reqs == 0 && r->n_tokenizing == 0;
}

static const actor_handler_t s_handlers[] = {
    {MSG_SUBMIT, s_on_submit},
    {MSG_CANCEL, s_on_cancel},
    {MSG_TOKEN, s_on_token},
    {MSG_DONE, s_on_done},
    {MSG_ERROR, s_on_error},
    {MSG_CACHE_EVENT, s_on_cache_event},
};

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_ROUTER);
    if (!a)
        return 2;
    const topo_t *t = actor_topo(a);
    router_t *r = calloc(1, sizeof *r);
    r->topo = t;
    r->name = actor_self(a)->name;
    r->block_size = t->cache.block_size;
    const topo_instance_t *cm = topo_first(t, ROLE_CACHE_MANAGER);
    r->cache_manager = cm ? cm->name : NULL;
    char err[1024];
    int rc = -1;
    u64map_init(&r->index, 1024);
    u64map_init(&r->by_id, 256);
    u64map_init(&r->by_client, 256);
    u64map_init(&r->per_client, 256);
    r->next_id = s_random_id_base();
    if (config_load(t->model.path, &r->cfg, err, sizeof err) != 0) {
        LOG_E("%s", err);
        rc = ACTOR_EXIT_CONFIG;
        goto out;
    }
    r->max_model_len = t->limits.max_model_len;
    if (r->cfg.max_position_embeddings > 0 && r->cfg.max_position_embeddings < r->max_model_len)
        r->max_model_len = r->cfg.max_position_embeddings;
    const char *tokdir = t->model.tokenizer[0] ? t->model.tokenizer : t->model.path;
    r->tok = tok_load(tokdir, err, sizeof err);
    if (!r->tok && topo_tokenizer_expected(t)) {
        LOG_E("model.tokenizer: %s", err);   /* a broken tokenizer is the topology's fault: no restart */
        rc = ACTOR_EXIT_CONFIG;
        goto out;
    }
    if (!r->tok)
        LOG_W("no tokenizer (%s): only token-id prompts are accepted", err);
    r->chat = r->tok ? chat_family_detect(tokdir) : CHAT_NONE;
    r->prompt = (prompt_model_t){.tok = r->tok, .chat = r->chat, .vocab_size = r->cfg.vocab_size,
                                 .max_model_len = r->max_model_len};
    if (r->tok) {   /* one token's decoded bytes (relayed_track): what tok_stream_feed says always suffices */
        r->text_scratch_cap = 3 * tok_max_token_bytes(r->tok) + 3;
        r->text_scratch = malloc(r->text_scratch_cap);
        if (!r->text_scratch) {
            LOG_E("router out of memory");
            goto out;
        }
    }
    r->colocated = topo_first(t, ROLE_PREFILL) == NULL;
    if (r->colocated)
        LOG_I("no prefill actors: each request's decode worker computes its prompt too (colocated)");
    for (int i = 0; i < t->n_instances && r->n_workers < MAX_WORKERS - 1; i++) {
        const topo_instance_t *in = &t->instances[i];
        if (in->role != ROLE_PREFILL && in->role != ROLE_DECODE)
            continue;
        /* Up until its connection is seen to drop: a worker that is still starting gets its
         * first requests queued (the runtime's outbox) rather than refused. */
        r->workers[r->n_workers++] = (wk_t){.name = in->name, .role = in->role, .up = 1};
        actor_watch(a, in->name);
    }
    const char *client_ep = topo_client_endpoint(t, actor_self(a));   /* this router's of endpoints.clients */
    if (!client_ep) {
        LOG_E("no client endpoint for %s in endpoints.clients", r->name);
        rc = ACTOR_EXIT_CONFIG;
        goto out;
    }
    char what[64] = "endpoints.client";
    if (t->endpoints.n_clients > 1)
        snprintf(what, sizeof what, "endpoints.clients[%d]", (int)((client_ep - t->endpoints.clients[0]) / TOPO_ENDPOINT_MAX));
    r->clients = actor_bind_router(a, client_ep, what);
    if (!r->clients) {
        rc = ACTOR_EXIT_CONFIG;   /* a port another program holds stays taken: no restart (actor_bind) */
        goto out;
    }
    actor_reply_backlog(a, r->clients);   /* every reply waits for a slow client, never lost */
    if (r->tok) {
        r->pool = tokpool_new(actor_zmq_ctx(a), r->name, &r->prompt, TOKENIZER_THREADS, err, sizeof err);
        if (!r->pool) {
            LOG_E("%s", err);
            goto out;
        }
        if (actor_add_reader(a, tokpool_socket(r->pool), s_on_tokenized) != 0) {
            void *pull = tokpool_socket(r->pool);
            tokpool_destroy(&r->pool);
            zmq_close(pull);   /* not the runtime's to close */
            LOG_E("cannot poll the tokenizer pool's socket");
            goto out;
        }
    }
    actor_timer_add(a, 50, s_deadlines);
    actor_ops_t ops = {.handlers = s_handlers, .n_handlers = ARRAY_LEN(s_handlers), .fill_stats = s_fill_stats,
                       .drained = s_drained, .peer_event = s_peer_event};
    rc = actor_run(a, &ops, r);
    /* Drained with requests in flight (their work outlasted supervision.grace_s): each client
     * gets its one terminal reply, retryable, flushed by the sockets' linger, instead of a
     * dropped connection. */
    while (rc == 0 && r->head)
        s_fail(a, r, r->head, MSG_ERR_UNAVAILABLE, 1,
               "the cluster is stopping and the request did not finish within its grace period (supervision.grace_s); "
               "retry it");
out:
    tokpool_destroy(&r->pool);   /* joined before the jobs they may hold are freed */
    while (r->tokenizing) {
        tokjob_t *j = r->tokenizing;
        s_tokenizing_unlink(r, j);
        tokjob_free(&j);
    }
    while (r->head)
        s_remove(r, r->head);
    tok_destroy(&r->tok);
    free(r->text_scratch);
    u64map_free(&r->index);
    u64map_free(&r->by_id);
    u64map_free(&r->by_client);
    u64map_free(&r->per_client);
    free(r);
    actor_destroy(&a);
    return rc == 0 || rc == ACTOR_EXIT_CONFIG ? rc : 1;
}
