/* engine/sched.c — the batch scheduler (engine/sched.h says what it decides and why). */
#include "engine/sched.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"

const char *const sched_state_names[SCHED_STATE_COUNT] = {"waiting", "prompting", "running",
                                                          "preempted", "prompted", "out"};

typedef struct queue {
    sched_req_t *head, *tail;
    int n;
} queue_t;

/* One client's requests in the scheduler (fair order, sched.h); freed with its last request. */
struct sched_client {
    uint64_t key;                   /* its map key (the client key, 1 for client 0) */
    int n_req;                      /* its requests in the scheduler */
    int n_running, n_waiting;       /* of them, RUNNING / WAITING */
    int n_preempted;                /* of them, PREEMPTED (the chunk order counts them: fair order) */
    uint64_t last_run;              /* when one of its requests last entered RUNNING (sched_t.runs) */
    int turns;                      /* chunk-order turns taken in pass turn_pass */
    uint64_t turn_pass;
    sched_req_t *w_head, *w_tail;   /* its WAITING requests, oldest first (cw_prev / cw_next) */
    struct sched_client *wc_prev, *wc_next;   /* in sched_t's clients with waiting requests */
};

struct sched {
    sched_config_t cfg;
    kvpool_t *pool;
    queue_t q[SCHED_STATE_COUNT];   /* SCHED_OUT's stays empty */
    u64map_t by_id;                 /* id -> sched_req_t * (id 0 lives in zero_id) */
    sched_req_t *zero_id;
    u64map_t clients;               /* client key (0 as 1) -> sched_client_t * */
    uint64_t pass;                  /* chunk passes begun (s_prompt_rows): the chunk order's turns */
    uint64_t runs;                  /* moves into RUNNING (the promotion order's clock) */
    sched_client_t *wc_head;        /* the clients with WAITING requests (a promotion looks at these only) */
    uint64_t waits;                 /* moves into WAITING (sched_req_t.wait_seq) */
    uint64_t next_seq;
    uint64_t preemptions;
    sched_batch_t batch;            /* the last step's rows */
    int committed;                  /* the last step's rows were committed (or there were none) */
};

static void s_push(queue_t *q, sched_req_t *r)
{
    r->next = NULL;
    r->prev = q->tail;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->n++;
}

static void s_unlink(queue_t *q, sched_req_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        q->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        q->tail = r->prev;
    r->prev = r->next = NULL;
    q->n--;
}

/* A client's waiting requests, and the list of clients that have some: a promotion picks among
 * clients, not among every waiting request. */
static void s_wait_add(sched_t *s, sched_req_t *r)
{
    sched_client_t *c = r->cl;
    r->wait_seq = ++s->waits;
    r->cw_next = NULL;
    r->cw_prev = c->w_tail;
    *(c->w_tail ? &c->w_tail->cw_next : &c->w_head) = r;
    c->w_tail = r;
    if (r->cw_prev)
        return;
    c->wc_prev = NULL;   /* its first: the client joins the list */
    c->wc_next = s->wc_head;
    if (s->wc_head)
        s->wc_head->wc_prev = c;
    s->wc_head = c;
}

static void s_wait_del(sched_t *s, sched_req_t *r)
{
    sched_client_t *c = r->cl;
    *(r->cw_prev ? &r->cw_prev->cw_next : &c->w_head) = r->cw_next;
    *(r->cw_next ? &r->cw_next->cw_prev : &c->w_tail) = r->cw_prev;
    r->cw_prev = r->cw_next = NULL;
    if (c->w_head)
        return;
    *(c->wc_prev ? &c->wc_prev->wc_next : &s->wc_head) = c->wc_next;   /* its last: the client leaves */
    if (c->wc_next)
        c->wc_next->wc_prev = c->wc_prev;
    c->wc_prev = c->wc_next = NULL;
}

/* The one place a request changes state: its queue, the counts and the preemptions follow. A
 * queue stays in admission order only for requests entering it once; a request re-entering one
 * (RUNNING after a recompute) goes to the tail, which is what "newest first" preemption then sees
 * as its age. */
static void s_move(sched_t *s, sched_req_t *r, sched_state_t to, const char *event)
{
    LOG_D("request %llu: %s -> %s on %s", (unsigned long long)r->id, sched_state_names[r->state],
          sched_state_names[to], event);
    if (r->state != SCHED_OUT)
        s_unlink(&s->q[r->state], r);
    if (r->state == SCHED_WAITING)
        s_wait_del(s, r);
    if (to == SCHED_WAITING)
        s_wait_add(s, r);
    r->cl->n_running += (to == SCHED_RUNNING) - (r->state == SCHED_RUNNING);
    r->cl->n_waiting += (to == SCHED_WAITING) - (r->state == SCHED_WAITING);
    r->cl->n_preempted += (to == SCHED_PREEMPTED) - (r->state == SCHED_PREEMPTED);
    if (to == SCHED_RUNNING)
        r->cl->last_run = ++s->runs;
    r->state = to;
    s->preemptions += to == SCHED_PREEMPTED;
    if (to != SCHED_OUT)
        s_push(&s->q[to], r);
}

sched_t *sched_new(kvpool_t *pool, const sched_config_t *cfg, char *err, size_t errlen)
{
    if (!pool || cfg->max_seqs < 1 || cfg->max_running < 0 || cfg->max_running > cfg->max_seqs ||
        cfg->chunk_tokens < 0 || !cfg->now_ms || !cfg->drop) {
        snprintf(err, errlen, "scheduler: bad config (max_seqs %d, max_running %d, chunk_tokens %d)", cfg->max_seqs,
                 cfg->max_running, cfg->chunk_tokens);
        return NULL;
    }
    sched_t *s = calloc(1, sizeof *s);
    if (!s || !(s->batch.rows = calloc((size_t)cfg->max_seqs, sizeof *s->batch.rows)) ||
        u64map_init(&s->by_id, 64) != 0 || u64map_init(&s->clients, 64) != 0) {
        snprintf(err, errlen, "scheduler: out of memory");
        sched_destroy(&s);
        return NULL;
    }
    s->cfg = *cfg;
    s->pool = pool;
    s->committed = 1;
    return s;
}

void sched_destroy(sched_t **self_p)
{
    sched_t *s = *self_p;
    if (!s)
        return;
    for (size_t i = 0; i < s->clients.cap && s->clients.keys; i++)
        if (s->clients.keys[i])
            free((sched_client_t *)(uintptr_t)s->clients.vals[i]);
    u64map_free(&s->clients);
    u64map_free(&s->by_id);
    free(s->batch.rows);
    free(s);
    *self_p = NULL;
}

sched_req_t *sched_find(const sched_t *s, uint64_t id)
{
    if (id == 0)
        return s->zero_id;
    const uint64_t *v = u64map_get(&s->by_id, id);
    return v ? (sched_req_t *)(uintptr_t)*v : NULL;
}

/* client's counts, made at its first request (NULL: out of memory). */
static sched_client_t *s_client(sched_t *s, uint64_t client)
{
    const uint64_t key = client ? client : 1;
    const uint64_t *v = u64map_get(&s->clients, key);
    if (v)
        return (sched_client_t *)(uintptr_t)*v;
    sched_client_t *c = calloc(1, sizeof *c);
    if (!c || u64map_put(&s->clients, key, (uint64_t)(uintptr_t)c) != 0) {
        free(c);
        return NULL;
    }
    c->key = key;
    return c;
}

static int s_add(sched_t *s, sched_req_t *r, uint64_t id, uint64_t client, kvseq_t *kv, const int32_t *toks,
                 int n_prompt, int n_toks)
{
    if (sched_find(s, id))
        return -1;
    sched_client_t *cl = s_client(s, client);
    if (!cl)
        return -1;
    if (id == 0)
        s->zero_id = r;
    else if (u64map_put(&s->by_id, id, (uint64_t)(uintptr_t)r) != 0) {
        if (cl->n_req == 0) {
            u64map_del(&s->clients, cl->key);
            free(cl);
        }
        return -1;
    }
    *r = (sched_req_t){.id = id, .client = client, .cl = cl, .kv = kv, .toks = toks, .n_toks = n_toks,
                       .n_prompt = n_prompt, .n_done = -1, .arrived_ms = s->cfg.now_ms(), .seq = ++s->next_seq,
                       .state = SCHED_OUT};
    cl->n_req++;
    return 0;
}

int sched_add_prompt(sched_t *s, sched_req_t *r, uint64_t id, uint64_t client, kvseq_t *kv, const int32_t *toks,
                     int n_prompt)
{
    if (s_add(s, r, id, client, kv, toks, n_prompt, n_prompt) != 0)
        return -1;
    r->target = n_prompt;
    s_move(s, r, SCHED_PROMPTING, "prompt");
    return 0;
}

/* The state a request with its whole KV takes: a decode slot, or the wait for one. */
static sched_state_t s_ready_state(const sched_t *s)
{
    if (s->cfg.max_running == 0)
        return SCHED_PROMPTED;
    return s->q[SCHED_RUNNING].n < s->cfg.max_running ? SCHED_RUNNING : SCHED_WAITING;
}

int sched_add_running(sched_t *s, sched_req_t *r, uint64_t id, uint64_t client, kvseq_t *kv, const int32_t *toks,
                      int n_prompt, int n_cached, int with_kv)
{
    if (s_add(s, r, id, client, kv, toks, n_prompt, n_prompt) != 0)
        return -1;
    r->started = 1;
    r->n_cached = n_cached;
    r->started_ms = r->arrived_ms;
    if (!with_kv) {
        r->target = n_prompt;   /* its first token, appended next, is fed by its first decode row */
        s_move(s, r, SCHED_PREEMPTED, "hand-off without room for its KV");
    } else {
        s_move(s, r, s_ready_state(s), "hand-off");
    }
    return 0;
}

void sched_remove(sched_t *s, sched_req_t *r)
{
    if (r->id == 0)
        s->zero_id = NULL;
    else
        u64map_del(&s->by_id, r->id);
    /* A row of an uncommitted step must not be acted on once its request is gone. */
    for (int i = 0; i < s->batch.n; i++)
        if (s->batch.rows[i].req == r)
            s->batch.rows[i].req = NULL;
    s_move(s, r, SCHED_OUT, "removed");
    if (--r->cl->n_req == 0) {
        u64map_del(&s->clients, r->cl->key);
        free(r->cl);
    }
    r->cl = NULL;
}

void sched_hold(sched_t *s, sched_req_t *r, int64_t until_ms) { r->hold_until_ms = until_ms; }
void sched_unhold(sched_t *s, sched_req_t *r) { r->hold_until_ms = 0; }

int sched_count(const sched_t *s, sched_state_t st) { return st < SCHED_OUT ? s->q[st].n : 0; }
sched_req_t *sched_first(const sched_t *s, sched_state_t st) { return st < SCHED_OUT ? s->q[st].head : NULL; }
uint64_t sched_preemptions(const sched_t *s) { return s->preemptions; }

int sched_size(const sched_t *s)
{
    int n = 0;
    for (int i = 0; i < SCHED_OUT; i++)
        n += s->q[i].n;
    return n;
}

/* The fair order's rank of r: its client's other RUNNING, WAITING and PREEMPTED requests (r itself
 * is one of them unless it is PROMPTING). */
static int s_rank(const sched_req_t *r)
{
    const sched_client_t *c = r->cl;
    return c->n_running + c->n_waiting + c->n_preempted - (r->state != SCHED_PROMPTING);
}

/* Whether a comes before b in the fair order: a lower rank, or the same and admitted first. */
static int s_fair_before(const sched_req_t *a, const sched_req_t *b)
{
    return s_rank(a) < s_rank(b) || (s_rank(a) == s_rank(b) && a->seq < b->seq);
}

static int s_blocks_for(const sched_t *s, int tokens)
{
    const int bs = kvpool_block_size(s->pool);
    return (tokens + bs - 1) / bs;
}

/* A part-computed prompt (or recompute) other than keep gives its blocks back, the newest first:
 * it starts over later, reusing whatever of them is still cached. 1 if one did. */
static int s_release_prompt(sched_t *s, const sched_req_t *keep)
{
    static const sched_state_t from[] = {SCHED_PROMPTING, SCHED_PREEMPTED};
    for (int i = 0; i < 2; i++)
        for (sched_req_t *r = s->q[from[i]].tail; r; r = r->prev)
            if (r != keep && kvseq_n_blocks(r->kv) > 0) {
                LOG_I("request %llu: its part-computed prompt gives its KV blocks back (pool full)",
                      (unsigned long long)r->id);
                kvseq_release(r->kv);
                r->n_done = -1;
                return 1;
            }
    return 0;
}

/* Whose KV goes when blocks run short, of q's requests (with holding: those holding blocks): one
 * of the client the fair order ranks last (the most requests here), its newest admitted; among
 * clients alike, the newest admitted. A client's one request keeps its KV while another client
 * has several here: its progress is not what pays for their load. NULL: none. */
static sched_req_t *s_victim(const queue_t *q, int holding)
{
    sched_req_t *v = NULL;
    for (sched_req_t *r = q->head; r; r = r->next)
        if ((!holding || kvseq_n_blocks(r->kv) > 0) && (!v || s_fair_before(v, r)))
            v = r;
    return v;
}

/* r (RUNNING or WAITING) gives its blocks back: its KV is recomputed through the chunk path
 * before it runs (every token but its last, which its next decode row feeds). */
static void s_preempt(sched_t *s, sched_req_t *r, const char *event)
{
    LOG_I("request %llu preempted (KV pool full); its KV will be recomputed", (unsigned long long)r->id);
    kvseq_release(r->kv);
    r->target = r->n_toks - 1;
    r->n_done = -1;
    s_move(s, r, SCHED_PREEMPTED, event);
}

/* A WAITING request holding blocks gives them back (s_victim; 1 if one did). A waiting request
 * makes no progress with its KV, so its blocks go before any running request's: otherwise each
 * request promoted from a long waiting queue would be the newest running one, the next to be
 * preempted, and the queue would turn into preempted requests one promotion at a time while
 * the waiting ones kept their blocks. */
static int s_release_waiting(sched_t *s)
{
    sched_req_t *r = s_victim(&s->q[SCHED_WAITING], 1);
    if (!r)
        return 0;
    s_preempt(s, r, "KV pool full, waiting");
    return 1;
}

/* Frees blocks for a decode row: the owner's reclaim, a part-computed prompt, a waiting request's
 * KV, else a running request is preempted (never the last one); both by s_victim. 0 when blocks
 * were freed. */
static int s_free_blocks(sched_t *s)
{
    if (s->cfg.reclaim && s->cfg.reclaim(s->cfg.ctx))
        return 0;
    if (s_release_prompt(s, NULL))
        return 0;
    if (s_release_waiting(s))
        return 0;
    if (s->q[SCHED_RUNNING].n <= 1)
        return -1;
    s_preempt(s, s_victim(&s->q[SCHED_RUNNING], 0), "KV pool full");
    return 0;
}

/* Decode rows: every running request feeds its last token; out of blocks, blocks are freed. The
 * rows are taken first, so a request preempted after it got its row (the newest) leaves the batch
 * again, and a dropped one's row is cleared by sched_remove. */
static void s_decode_rows(sched_t *s)
{
    sched_batch_t *b = &s->batch;
    for (sched_req_t *r = s->q[SCHED_RUNNING].head; r; r = r->next)
        b->rows[b->n++] = (sched_row_t){.req = r, .n_new = 1, .sample = 1};
    for (int i = 0; i < b->n; i++) {
        sched_req_t *r = b->rows[i].req;
        while (r && r->state == SCHED_RUNNING && kvseq_append(r->kv, &r->toks[r->n_toks - 1], 1) != 0) {
            if (s_free_blocks(s) != 0) {
                /* Alone and still out of blocks: it can never finish here. */
                char why[128];
                snprintf(why, sizeof why, "KV pool exhausted at %d tokens", kvseq_len(r->kv));
                sched_remove(s, r);
                s->cfg.drop(s->cfg.ctx, r, why);
                break;
            }
        }
    }
    int m = 0;
    for (int i = 0; i < b->n; i++)
        if (b->rows[i].req && b->rows[i].req->state == SCHED_RUNNING)
            b->rows[m++] = b->rows[i];
    b->n = b->n_decode = m;
}

/* The chunk r gets within budget tokens, or 0 when it gets none now (held, or no room: *stuck),
 * or -1 when it never fits in the pool (dropped). */
static int s_chunk(sched_t *s, sched_req_t *r, int budget, int64_t now, sched_req_t **stuck)
{
    if (s_blocks_for(s, r->target) > kvpool_n_blocks(s->pool)) {
        char why[160];
        snprintf(why, sizeof why, "%d tokens need %d KV blocks, more than the pool has (%d)", r->target,
                 s_blocks_for(s, r->target), kvpool_n_blocks(s->pool));
        sched_remove(s, r);
        s->cfg.drop(s->cfg.ctx, r, why);
        return -1;
    }
    if (r->hold_until_ms) {
        if (now <= r->hold_until_ms)
            return 0;   /* its cached blocks are on their way */
        r->hold_until_ms = 0;
        if (s->cfg.hold_expired)
            s->cfg.hold_expired(s->cfg.ctx, r);
    }
    if (r->n_done < 0) {   /* first chunk: adopt every cached prefix block of the pool */
        int cached = kvseq_match_prefix(r->kv, r->toks, r->target);
        r->n_done = cached > 0 ? cached : 0;
        if (!r->started) {   /* not again after giving its blocks back (its own, then) */
            r->started = 1;
            r->n_cached = r->n_done;
            r->started_ms = now;
        }
    }
    const int k = r->target - r->n_done < budget ? r->target - r->n_done : budget;
    const int need = s_blocks_for(s, kvseq_len(r->kv) + k) - kvseq_n_blocks(r->kv);
    const int reserve = s->batch.n_decode;   /* one free block per decode row stays free */
    int room = kvpool_free_count(s->pool) - need >= reserve;
    if (!room && s->cfg.reclaim && s->cfg.reclaim(s->cfg.ctx))
        room = kvpool_free_count(s->pool) - need >= reserve;
    if (!room || kvseq_append(r->kv, r->toks + r->n_done, k) != 0) {
        *stuck = r;
        return 0;
    }
    return k;
}

/* The next request of q in this pass's chunk order, not yet taken in it: lowest rank (its client's
 * other RUNNING, WAITING and PREEMPTED requests + the turns its client already took in this pass),
 * the oldest of equal rank (q is in admission order; a recompute re-entering PREEMPTED goes by its
 * re-entry). Counting the preempted ones keeps a client with one preempted request from waiting
 * behind every older recompute of clients with several. */
static sched_req_t *s_next_chunk(sched_t *s, const queue_t *q)
{
    sched_req_t *best = NULL;
    int best_rank = 0;
    for (sched_req_t *r = q->head; r; r = r->next) {
        if (r->seen_pass == s->pass)
            continue;
        sched_client_t *c = r->cl;
        if (c->turn_pass != s->pass) {
            c->turn_pass = s->pass;
            c->turns = 0;
        }
        const int rank = s_rank(r) + c->turns;
        if (!best || rank < best_rank) {
            best = r;
            best_rank = rank;
        }
    }
    return best;
}

/* The waiting request a freed decode slot goes to: its client has the fewest RUNNING requests;
 * among equal counts, the client whose turn is the longest ago (round robin: a client new here
 * first), then the one whose oldest waiting request waited longest; within a client, the oldest.
 * O(clients with waiting requests), not O(waiting requests). */
static sched_req_t *s_next_waiting(const sched_t *s)
{
    const sched_client_t *b = NULL;
    for (const sched_client_t *c = s->wc_head; c; c = c->wc_next)
        if (!b || c->n_running < b->n_running ||
            (c->n_running == b->n_running &&
             (c->last_run < b->last_run || (c->last_run == b->last_run && c->w_head->wait_seq < b->w_head->wait_seq))))
            b = c;
    return b ? b->w_head : NULL;
}

/* While the free slots are owed to recomputes (RUNNING + PREEMPTED fill max_running): the waiting
 * request that goes into a free slot before them, or NULL. The candidate is the waiting request of
 * the lowest rank (each client's oldest; the oldest admitted among equal ranks); it goes first when
 * it ranks below the recompute the chunk order takes next, or ranks alike and was admitted before
 * it. Otherwise a client's one waiting request could wait for as long as other clients kept
 * requests preempted: its only way out was to be the newest waiting one when blocks ran short
 * (s_release_waiting), and under a flood of hand-offs a newer one always was (a short request
 * beside 80 flooding clients got no reply in 60 s, once in about a hundred runs of
 * tests/scenario/client_fairness_rr.sh). Older preempted work keeps its place against newer
 * hand-offs of clients as loaded. O(preempted + clients with waiting requests). */
static sched_req_t *s_waiting_before_recompute(const sched_t *s)
{
    const sched_req_t *p = NULL;   /* s_next_chunk's pick: lowest rank, the queue's first of equal ones */
    for (const sched_req_t *r = s->q[SCHED_PREEMPTED].head; r; r = r->next)
        if (!p || s_rank(r) < s_rank(p))
            p = r;
    sched_req_t *w = NULL;
    for (const sched_client_t *c = s->wc_head; c; c = c->wc_next)
        if (!w || s_fair_before(c->w_head, w))
            w = c->w_head;
    return w && p && !s_fair_before(w, p) ? NULL : w;
}

/* Prompt chunks after the decode rows, in the fair order (s_next_chunk), within chunk_tokens:
 * recomputes first (new prompts wait while any is left, else they would take its blocks), and only
 * while a decode slot is free for them. The first that finds no room keeps its turn: the ones
 * after it wait behind it. */
static sched_req_t *s_prompt_rows(sched_t *s)
{
    sched_batch_t *b = &s->batch;
    sched_req_t *stuck = NULL;
    int budget = s->cfg.chunk_tokens;
    const int64_t now = s->cfg.now_ms();
    s->pass++;
    queue_t *q = &s->q[SCHED_PREEMPTED];
    if (q->n == 0)
        q = &s->q[SCHED_PROMPTING];
    else if (s->q[SCHED_RUNNING].n >= s->cfg.max_running)
        return NULL;
    sched_req_t *r;
    while (budget > 0 && b->n < s->cfg.max_seqs && !stuck && (r = s_next_chunk(s, q))) {
        r->seen_pass = s->pass;   /* before s_chunk, which may drop it */
        r->cl->turns++;
        const int k = s_chunk(s, r, budget, now, &stuck);
        if (k <= 0)
            continue;
        budget -= k;
        b->rows[b->n++] = (sched_row_t){.req = r, .n_new = k,
                                        .sample = r->state == SCHED_PROMPTING && r->n_done + k == r->target};
    }
    return stuck;
}

/* A request that found no room in a step that runs nothing: other part-computed prompts give their
 * blocks back (1: try again); when none holds any and the pool holds nothing else either, it
 * never fits and is dropped. */
static int s_unstick(sched_t *s, sched_req_t *stuck)
{
    if (s_release_prompt(s, stuck) || s_release_waiting(s))
        return 1;
    const int own = kvseq_n_blocks(stuck->kv);
    if (kvpool_free_count(s->pool) + own < kvpool_n_blocks(s->pool))
        return 0;   /* blocks held elsewhere (hand-offs, copies) come back later */
    char why[160];
    snprintf(why, sizeof why, "KV pool exhausted: %d tokens need more blocks than the pool has (%d)", stuck->target,
             kvpool_n_blocks(s->pool));
    sched_remove(s, stuck);
    s->cfg.drop(s->cfg.ctx, stuck, why);
    return 1;
}

const sched_batch_t *sched_step(sched_t *s)
{
    sched_batch_t *b = &s->batch;
    if (!s->committed)   /* the caller's mistake: the last step's prompts would never advance */
        LOG_E("scheduler: a step's rows were never committed");
    b->n = b->n_decode = 0;
    /* Waiting requests take free slots, the client with the fewest running first; a slot a
     * preempted request waits for (its recompute, below, takes it) only when the waiting one comes
     * first in the fair order (s_waiting_before_recompute): preempted requests are older work, and
     * a stream of new hand-offs would otherwise keep them from ever running again. */
    while (s->q[SCHED_WAITING].n && s->q[SCHED_RUNNING].n < s->cfg.max_running) {
        sched_req_t *w = s->q[SCHED_RUNNING].n + s->q[SCHED_PREEMPTED].n < s->cfg.max_running
                             ? s_next_waiting(s)
                             : s_waiting_before_recompute(s);
        if (!w)
            break;
        s_move(s, w, SCHED_RUNNING, "a batch slot freed");
    }
    s_decode_rows(s);
    sched_req_t *stuck;
    while ((stuck = s_prompt_rows(s)) && b->n == 0 && s_unstick(s, stuck))
        ;
    s->committed = b->n == 0;
    return b;
}

void sched_commit(sched_t *s)
{
    sched_batch_t *b = &s->batch;
    for (int i = 0; i < b->n; i++) {
        sched_req_t *r = b->rows[i].req;
        if (!r)
            continue;
        kvseq_publish(r->kv);
        if (i < b->n_decode)
            continue;
        r->n_done += b->rows[i].n_new;
        if (r->n_done < r->target)
            continue;
        s_move(s, r, s_ready_state(s), r->state == SCHED_PREEMPTED ? "recomputed" : "prompt computed");
    }
    s->committed = 1;
}
