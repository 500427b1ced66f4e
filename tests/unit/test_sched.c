/* tests/unit/test_sched.c — the batch scheduler (engine/sched.h) on a bookkeeping-only KV pool (no
 * KV memory) and a fake clock: admission order, the step's token budget, decode rows before prompt
 * chunks, prefix reuse, preemption and resume through the chunk path, prompts larger than the
 * pool, fairness between old and new prompts and round robin across clients, holds, promotion, prompts-only workers, no leaks.
 * No model and no processes: a step's "forward" is the commit, and a sampled row's token is made
 * up by the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sched.h"

enum { MAX_REQ = 48, MAX_TOKS = 512 };

typedef struct req {
    sched_req_t sr;            /* first: the scheduler's pointer is the request's */
    kvseq_t *kv;
    int32_t toks[MAX_TOKS];
    int dropped;
    char why[160];
} req_t;

typedef struct fix {
    kvpool_t *pool;
    sched_t *s;
    req_t req[MAX_REQ];
    int n_drops, n_reclaims, n_expired;
    int reclaim_frees;         /* blocks the reclaim hook frees once (from reclaim_kv) */
    kvseq_t *reclaim_kv;
} fix_t;

static int64_t s_clock;
static fix_t *s_fx;
static int64_t s_now(void) { return s_clock; }

static void s_drop(void *ctx, sched_req_t *sr, const char *why)
{
    fix_t *f = ctx;
    req_t *r = (req_t *)sr;
    r->dropped = 1;
    snprintf(r->why, sizeof r->why, "%s", why);
    f->n_drops++;
}

static int s_reclaim(void *ctx)
{
    fix_t *f = ctx;
    f->n_reclaims++;
    if (!f->reclaim_kv)
        return 0;
    kvseq_destroy(&f->reclaim_kv);
    return 1;
}

static void s_expired(void *ctx, sched_req_t *r)
{
    fix_t *f = ctx;
    f->n_expired++;
}

static fix_t *s_fix(int n_blocks, int block_size, int max_seqs, int max_running, int chunk_tokens)
{
    static fix_t f;
    char err[256];
    memset(&f, 0, sizeof f);
    s_clock = 1000;
    f.pool = kvpool_new(n_blocks, block_size, 1, 1, 8, DT_F32, NULL, err, sizeof err);
    assert_non_null(f.pool);
    sched_config_t cfg = {.max_seqs = max_seqs, .max_running = max_running, .chunk_tokens = chunk_tokens,
                          .now_ms = s_now, .ctx = &f, .reclaim = s_reclaim, .hold_expired = s_expired, .drop = s_drop};
    f.s = sched_new(f.pool, &cfg, err, sizeof err);
    assert_non_null(f.s);
    s_fx = &f;
    return &f;
}

static void s_unfix(fix_t *f)
{
    for (int i = 0; i < MAX_REQ; i++) {
        if (f->req[i].kv && !f->req[i].dropped && f->req[i].sr.state != SCHED_OUT)
            sched_remove(f->s, &f->req[i].sr);
        kvseq_destroy(&f->req[i].kv);
    }
    kvseq_destroy(&f->reclaim_kv);
    /* Nothing leaked: every block is back. */
    assert_int_equal(kvpool_free_count(f->pool), kvpool_n_blocks(f->pool));
    sched_destroy(&f->s);
    assert_null(f->s);
    kvpool_destroy(&f->pool);
}

/* Request i of a client (the router's client key) with a prompt of n tokens (token j of request
 * i: 100 * base + j + 1, so prompts differ unless `base` says otherwise). */
static req_t *s_prompt_of(fix_t *f, uint64_t client, int i, int n, int base)
{
    req_t *r = &f->req[i];
    r->kv = kvseq_new(f->pool, MAX_TOKS, 0);
    assert_non_null(r->kv);
    for (int j = 0; j < n; j++)
        r->toks[j] = (int32_t)(100 * base + j + 1);
    assert_int_equal(sched_add_prompt(f->s, &r->sr, (uint64_t)i + 1, client, r->kv, r->toks, n), 0);
    return r;
}

static req_t *s_prompt(fix_t *f, int i, int n, int base) { return s_prompt_of(f, 0, i, n, base); }

/* A client's hand-off: prompt of n tokens whose KV is in the pool, plus its first token (not fed
 * yet). */
static req_t *s_handoff_of(fix_t *f, uint64_t client, int i, int n)
{
    req_t *r = &f->req[i];
    r->kv = kvseq_new(f->pool, MAX_TOKS, 0);
    for (int j = 0; j <= n; j++)
        r->toks[j] = (int32_t)(100 * i + j + 1);
    assert_int_equal(kvseq_append(r->kv, r->toks, n), 0);
    kvseq_publish(r->kv);
    assert_int_equal(sched_add_running(f->s, &r->sr, (uint64_t)i + 1, client, r->kv, r->toks, n, 0, 1), 0);
    r->sr.n_toks++;
    return r;
}

static req_t *s_handoff(fix_t *f, int i, int n) { return s_handoff_of(f, 0, i, n); }

/* One step: its rows written as "id:n_new[d|s]" (d decode row, s a sampled prompt chunk),
 * committed, and every sampled row given a next token, as an actor's emit would. */
static const char *s_step(fix_t *f)
{
    static char out[512];
    const sched_batch_t *b = sched_step(f->s);
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < b->n; i++) {
        const sched_row_t *row = &b->rows[i];
        assert_int_equal(i < b->n_decode, row->n_new == 1 && row->req->state == SCHED_RUNNING);
        len += (size_t)snprintf(out + len, sizeof out - len, "%s%llu:%d%s", i ? " " : "",
                                (unsigned long long)row->req->id, row->n_new,
                                i < b->n_decode ? "d" : row->sample ? "s" : "");
    }
    sched_commit(f->s);
    for (int i = 0; i < b->n; i++) {
        sched_req_t *sr = b->rows[i].req;
        if (b->rows[i].sample) {
            req_t *r = (req_t *)sr;
            r->toks[sr->n_toks] = 7000 + sr->n_toks;
            sr->n_toks++;
        }
    }
    return out;
}

/* Prompts are scheduled oldest first, each whole when the budget allows; a computed prompt runs
 * as a decode row from the next step on, and decode rows come before prompt chunks. */
static void test_admission_order(void **st)
{
    fix_t *f = s_fix(64, 4, 8, 8, 8);
    s_prompt(f, 0, 8, 0);
    s_prompt(f, 1, 8, 1);
    s_prompt(f, 2, 8, 2);
    assert_int_equal(sched_count(f->s, SCHED_PROMPTING), 3);
    assert_string_equal(s_step(f), "1:8s");
    assert_int_equal(f->req[0].sr.state, SCHED_RUNNING);
    assert_string_equal(s_step(f), "1:1d 2:8s");
    assert_string_equal(s_step(f), "1:1d 2:1d 3:8s");
    assert_string_equal(s_step(f), "1:1d 2:1d 3:1d");
    assert_int_equal(sched_count(f->s, SCHED_RUNNING), 3);
    /* A running request's KV covers every token but its newest. */
    assert_int_equal(kvseq_len(f->req[0].kv), f->req[0].sr.n_toks - 1);
    assert_memory_equal(kvseq_tokens(f->req[0].kv), f->req[0].toks, (size_t)kvseq_len(f->req[0].kv) * 4);
    s_unfix(f);
}

/* chunk_tokens bounds the prompt tokens of a step, all chunks together; decode rows are outside
 * it; max_seqs bounds the rows. */
static void test_budget(void **st)
{
    fix_t *f = s_fix(64, 4, 3, 3, 10);
    s_prompt(f, 0, 25, 0);
    s_prompt(f, 1, 7, 1);
    assert_string_equal(s_step(f), "1:10");
    assert_string_equal(s_step(f), "1:10");
    assert_string_equal(s_step(f), "1:5s 2:5");
    assert_string_equal(s_step(f), "1:1d 2:2s");
    s_prompt(f, 2, 30, 2);
    s_prompt(f, 3, 30, 3);
    /* Two decode rows leave one row of three for a prompt chunk: request 4 waits. */
    assert_string_equal(s_step(f), "1:1d 2:1d 3:10");
    assert_int_equal(f->req[3].sr.n_done, -1);
    s_unfix(f);
}

/* A prompt's first chunk adopts the pool's cached prefix blocks (never the whole prompt), and
 * n_cached says how many tokens that saved. */
static void test_prefix_reuse(void **st)
{
    fix_t *f = s_fix(64, 4, 8, 8, 64);
    req_t *a = s_prompt(f, 0, 12, 5);
    assert_string_equal(s_step(f), "1:12s");
    sched_remove(f->s, &a->sr);
    kvseq_destroy(&a->kv);   /* its published blocks stay cached */
    req_t *b = s_prompt(f, 1, 16, 5);   /* the same 12 tokens, and 4 more */
    assert_string_equal(s_step(f), "2:4s");
    assert_int_equal(b->sr.n_cached, 12);
    req_t *c = s_prompt(f, 2, 12, 5);   /* all of it cached: the last block is computed again */
    assert_string_equal(s_step(f), "2:1d 3:4s");
    assert_int_equal(c->sr.n_cached, 8);
    s_unfix(f);
}

/* Out of blocks, the newest running request is preempted (its blocks freed); it comes back
 * through prompt chunks (rows after the decode rows, their logits unused), recomputing every
 * token but its newest, before any new prompt gets a chunk; then it runs again with its tokens. */
static void test_preempt_and_resume(void **st)
{
    fix_t *f = s_fix(6, 4, 4, 4, 16);
    req_t *a = s_handoff(f, 0, 7);   /* 2 blocks each, the 8th token next */
    req_t *b = s_handoff(f, 1, 7);
    assert_string_equal(s_step(f), "1:1d 2:1d");   /* tokens 8: still 2 blocks */
    assert_int_equal(kvpool_free_count(f->pool), 2);
    assert_string_equal(s_step(f), "1:1d 2:1d");   /* tokens 9: a third block each */
    assert_int_equal(kvpool_free_count(f->pool), 0);
    for (int i = 0; i < 3; i++)
        s_step(f);                                  /* tokens 10..12 */
    assert_int_equal(sched_preemptions(f->s), 0);
    /* Token 13 needs a fourth block each: request 2 (the newest) gives its 3 back. */
    assert_string_equal(s_step(f), "1:1d");
    assert_int_equal(sched_preemptions(f->s), 1);
    assert_int_equal(b->sr.state, SCHED_PREEMPTED);
    assert_int_equal(b->sr.target, b->sr.n_toks - 1);
    /* Its recompute began in the same step: it adopted what of its blocks is still cached (not
     * the one request 1 took) and found no room for the rest. */
    assert_true(b->sr.n_done >= 0 && b->sr.n_done < 12 && b->sr.n_done % 4 == 0);
    assert_int_equal(kvseq_n_blocks(b->kv), b->sr.n_done / 4);
    assert_true(f->n_reclaims > 0);   /* the owner was asked first */
    /* Its recompute does not fit yet (the block request 1 took was one of its cached ones), and a
     * new prompt that would fit waits behind it. */
    s_prompt(f, 2, 4, 2);
    assert_string_equal(s_step(f), "1:1d");
    assert_int_equal(f->req[2].sr.n_done, -1);
    /* Request 1 leaves: the rest of request 2's 12 tokens are recomputed in one chunk (its logits
     * unused: its next token is the one it had). */
    sched_remove(f->s, &a->sr);
    kvseq_destroy(&a->kv);
    char want[32];
    snprintf(want, sizeof want, "2:%d", 12 - b->sr.n_done);
    assert_string_equal(s_step(f), want);
    assert_int_equal(b->sr.state, SCHED_RUNNING);
    assert_int_equal(kvseq_len(b->kv), b->sr.n_toks - 1);
    assert_memory_equal(kvseq_tokens(b->kv), b->toks, (size_t)kvseq_len(b->kv) * 4);
    assert_string_equal(s_step(f), "2:1d 3:4s");
    s_unfix(f);
}

/* A prompt larger than the whole pool is dropped with a reason (never waits forever); one that
 * fills the pool exactly is dropped when, alone, its first decode token finds no block. */
static void test_prompt_larger_than_pool(void **st)
{
    fix_t *f = s_fix(4, 4, 4, 4, 64);
    req_t *big = s_prompt(f, 0, 17, 0);
    req_t *ok = s_prompt(f, 1, 4, 1);
    assert_string_equal(s_step(f), "2:4s");
    assert_true(big->dropped);
    assert_non_null(strstr(big->why, "more than the pool has"));
    assert_null(sched_find(f->s, 1));
    assert_int_equal(sched_count(f->s, SCHED_PROMPTING), 0);
    sched_remove(f->s, &ok->sr);
    kvseq_destroy(&ok->kv);
    req_t *full = s_prompt(f, 2, 16, 2);
    assert_string_equal(s_step(f), "3:16s");
    assert_string_equal(s_step(f), "");
    assert_true(full->dropped);
    assert_non_null(strstr(full->why, "KV pool exhausted at 16 tokens"));
    assert_int_equal(f->n_drops, 2);
    s_unfix(f);
}

/* An old prompt being chunked keeps the budget while new ones arrive at every step: nothing
 * newer overtakes it, and the next oldest follows it. */
static void test_fairness_old_before_new(void **st)
{
    fix_t *f = s_fix(128, 4, 8, 8, 8);
    s_prompt(f, 0, 40, 0);
    const char *want[] = {"1:8", "1:8", "1:8", "1:8", "1:8s"};
    for (int i = 0; i < 5; i++) {
        s_prompt(f, 1 + i, 8, 1 + i);
        s_clock += 10;
        assert_string_equal(s_step(f), want[i]);
    }
    assert_string_equal(s_step(f), "1:1d 2:8s");
    assert_string_equal(s_step(f), "1:1d 2:1d 3:8s");
    s_unfix(f);
}

/* The oldest prompt that finds no room keeps its turn: a newer one that would fit waits too
 * (else a stream of small prompts starves a large one); one free block per decode row stays free. */
static void test_stuck_oldest_keeps_turn(void **st)
{
    fix_t *f = s_fix(9, 4, 8, 8, 64);
    s_handoff(f, 0, 8);   /* 2 blocks now, a third for its 9th token */
    s_handoff(f, 1, 8);
    assert_string_equal(s_step(f), "1:1d 2:1d");   /* 3 blocks free */
    req_t *big = s_prompt(f, 2, 8, 2);   /* needs 2: 1 left for 2 decode rows */
    req_t *small = s_prompt(f, 3, 4, 3);   /* needs 1: would fit, 2 left */
    assert_string_equal(s_step(f), "1:1d 2:1d");
    assert_int_equal(big->sr.n_done, 0);
    assert_int_equal(kvseq_n_blocks(big->kv), 0);
    assert_int_equal(small->sr.n_done, -1);
    /* A running request leaves: the oldest prompt goes first. */
    sched_remove(f->s, &f->req[0].sr);
    kvseq_destroy(&f->req[0].kv);
    assert_string_equal(s_step(f), "2:1d 3:8s 4:4s");
    s_unfix(f);
}

/* A held prompt (a fetch in flight) is skipped, the others go on; past its deadline (the fake
 * clock) the owner is told and it is scheduled; an unheld one goes at once. */
static void test_hold(void **st)
{
    fix_t *f = s_fix(64, 4, 8, 8, 64);
    req_t *a = s_prompt(f, 0, 4, 0);
    req_t *b = s_prompt(f, 1, 4, 1);
    req_t *c = s_prompt(f, 2, 4, 2);
    sched_hold(f->s, &a->sr, s_clock + 100);
    sched_hold(f->s, &c->sr, s_clock + 100);
    assert_string_equal(s_step(f), "2:4s");
    sched_unhold(f->s, &c->sr);
    assert_string_equal(s_step(f), "2:1d 3:4s");
    assert_int_equal(f->n_expired, 0);
    s_clock += 101;
    assert_string_equal(s_step(f), "2:1d 3:1d 1:4s");
    assert_int_equal(f->n_expired, 1);
    assert_int_equal(b->sr.state, SCHED_RUNNING);
    s_unfix(f);
}

/* Beyond max_running, requests with their KV wait; a freed slot takes the oldest waiting one
 * (not the newest), and the counts follow every move. */
static void test_waiting_promotion(void **st)
{
    fix_t *f = s_fix(64, 4, 4, 2, 16);
    s_handoff(f, 0, 4);
    s_handoff(f, 1, 4);
    s_handoff(f, 2, 4);
    s_handoff(f, 3, 4);
    assert_int_equal(sched_count(f->s, SCHED_RUNNING), 2);
    assert_int_equal(sched_count(f->s, SCHED_WAITING), 2);
    assert_string_equal(s_step(f), "1:1d 2:1d");
    sched_remove(f->s, &f->req[0].sr);
    assert_int_equal(sched_count(f->s, SCHED_RUNNING), 1);
    assert_string_equal(s_step(f), "2:1d 3:1d");
    assert_int_equal(sched_count(f->s, SCHED_WAITING), 1);
    assert_int_equal(f->req[3].sr.state, SCHED_WAITING);
    s_unfix(f);
}

/* Requests are found by id (id 0 too); an id already there is refused; a removed one is gone. */
static void test_find_by_id(void **st)
{
    fix_t *f = s_fix(256, 4, 8, 8, 8);
    for (int i = 0; i < 12; i++)
        s_prompt(f, i, 4, i);
    for (int i = 0; i < 12; i++)
        assert_ptr_equal(sched_find(f->s, (uint64_t)i + 1), &f->req[i].sr);
    req_t dup = {0};
    assert_int_equal(sched_add_prompt(f->s, &dup.sr, 5, 0, f->req[4].kv, dup.toks, 4), -1);
    assert_ptr_equal(sched_find(f->s, 5), &f->req[4].sr);
    req_t *z = &f->req[12];
    z->kv = kvseq_new(f->pool, MAX_TOKS, 0);
    z->toks[0] = 1;
    assert_null(sched_find(f->s, 0));
    assert_int_equal(sched_add_prompt(f->s, &z->sr, 0, 0, z->kv, z->toks, 1), 0);
    assert_ptr_equal(sched_find(f->s, 0), &z->sr);
    sched_remove(f->s, &f->req[4].sr);
    assert_null(sched_find(f->s, 5));
    assert_int_equal(f->req[4].sr.state, SCHED_OUT);
    assert_int_equal(sched_count(f->s, SCHED_PROMPTING), 12);
    sched_remove(f->s, &z->sr);
    assert_null(sched_find(f->s, 0));
    s_unfix(f);
}

/* A decode row out of blocks takes a part-computed prompt's blocks before it preempts a running
 * request, and the owner's reclaim hook goes before both. */
static void test_prompt_gives_back_first(void **st)
{
    fix_t *f = s_fix(6, 4, 4, 4, 8);
    s_handoff(f, 0, 8);                       /* 2 blocks, a third for its next token */
    s_handoff(f, 1, 4);                       /* 1 block, a second for its next token */
    req_t *p = s_prompt(f, 2, 16, 2);
    assert_string_equal(s_step(f), "1:1d 2:1d");   /* 5 blocks used: no room for the prompt */
    sched_remove(f->s, &f->req[1].sr);
    kvseq_destroy(&f->req[1].kv);
    assert_string_equal(s_step(f), "1:1d 3:8");    /* 4 free - 2 needed >= 1 row */
    assert_int_equal(kvseq_n_blocks(p->kv), 2);
    for (int i = 0; i < 2; i++)
        s_step(f);                                  /* the prompt waits, request 1 reaches 12 */
    assert_int_equal(kvpool_free_count(f->pool), 1);
    /* Token 13 of request 1: the reclaim hook frees a held sequence's block first. */
    f->reclaim_kv = kvseq_new(f->pool, 8, 0);
    int32_t t[4] = {1, 2, 3, 4};
    assert_int_equal(kvseq_append(f->reclaim_kv, t, 4), 0);
    assert_int_equal(kvpool_free_count(f->pool), 0);
    assert_string_equal(s_step(f), "1:1d");
    assert_null(f->reclaim_kv);
    assert_int_equal(kvseq_n_blocks(p->kv), 2);
    /* Token 17: nothing to reclaim; the prompt gives its 2 blocks back, nobody is preempted. */
    for (int i = 0; i < 4; i++)
        s_step(f);
    assert_true(p->sr.n_done < 8);   /* it lost what it had computed (but what is still cached) */
    assert_true(kvseq_n_blocks(p->kv) < 2);
    assert_int_equal(sched_preemptions(f->s), 0);
    assert_int_equal(f->req[0].sr.state, SCHED_RUNNING);
    s_unfix(f);
}

/* A prompts-only worker (max_running 0, the prefill actor): a computed prompt leaves the queues
 * (PROMPTED, still found by id, its KV kept) and gets no decode rows. */
static void test_prompts_only(void **st)
{
    fix_t *f = s_fix(64, 4, 8, 0, 8);
    req_t *a = s_prompt(f, 0, 12, 0);
    s_prompt(f, 1, 4, 1);
    assert_string_equal(s_step(f), "1:8");
    assert_string_equal(s_step(f), "1:4s 2:4s");
    assert_int_equal(a->sr.state, SCHED_PROMPTED);
    assert_int_equal(sched_count(f->s, SCHED_PROMPTED), 2);
    assert_ptr_equal(sched_first(f->s, SCHED_PROMPTED), &a->sr);
    assert_ptr_equal(sched_next(&a->sr), &f->req[1].sr);
    assert_string_equal(s_step(f), "");
    assert_int_equal(kvseq_len(a->kv), 12);
    assert_ptr_equal(sched_find(f->s, 1), &a->sr);
    s_unfix(f);
}

/* Nothing runs and the prompt that found no room is blocked by another part-computed prompt's
 * blocks: that one gives them back, and the older goes on (no deadlock between two halves). */
static void test_two_half_prompts_no_deadlock(void **st)
{
    fix_t *f = s_fix(4, 4, 4, 4, 8);
    req_t *a = s_prompt(f, 0, 16, 0);
    req_t *b = s_prompt(f, 1, 16, 1);
    assert_string_equal(s_step(f), "1:8");
    /* Make b part-computed ahead of a: a waits for a fetch meanwhile. */
    sched_hold(f->s, &a->sr, s_clock + 1000);
    assert_string_equal(s_step(f), "2:8");
    sched_unhold(f->s, &a->sr);
    assert_int_equal(kvpool_free_count(f->pool), 0);
    assert_string_equal(s_step(f), "1:8s");
    assert_int_equal(kvseq_n_blocks(b->kv), 0);
    assert_int_equal(b->sr.n_done, -1);
    assert_int_equal(f->n_drops, 0);
    s_unfix(f);
}

/* A hand-off that found no room for its KV starts PREEMPTED: its prompt is computed through the
 * chunk path (no token sampled from it), then its first token is fed by a decode row. */
static void test_handoff_without_room(void **st)
{
    fix_t *f = s_fix(16, 4, 4, 4, 4);
    req_t *r = &f->req[0];
    r->kv = kvseq_new(f->pool, MAX_TOKS, 0);
    for (int j = 0; j < 10; j++)
        r->toks[j] = j + 1;
    assert_int_equal(sched_add_running(f->s, &r->sr, 1, 0, r->kv, r->toks, 9, 0, 0), 0);
    r->sr.n_toks++;   /* its first token, from the prefill worker */
    assert_int_equal(r->sr.state, SCHED_PREEMPTED);
    assert_int_equal(sched_preemptions(f->s), 1);
    assert_int_equal(sched_size(f->s), 1);
    assert_string_equal(s_step(f), "1:4");
    assert_string_equal(s_step(f), "1:4");
    assert_string_equal(s_step(f), "1:1");
    assert_int_equal(r->sr.state, SCHED_RUNNING);
    assert_int_equal(r->sr.n_toks, 10);   /* nothing sampled from the recompute */
    assert_string_equal(s_step(f), "1:1d");
    assert_memory_equal(kvseq_tokens(r->kv), r->toks, 10 * 4);
    s_unfix(f);
}

enum { CLIENT_A = 0xa11ce, CLIENT_B = 0xb0b, CLIENT_C = 0xc0c, CLIENT_D = 0xd0d };

/* A freed decode slot goes to the client with the fewest running requests: client A's 40 waiting
 * requests do not stand in front of client B's one (oldest first would promote all of A's first);
 * with the running counts equal again, the oldest waiting goes, A's. */
static void test_promotion_round_robin(void **st)
{
    fix_t *f = s_fix(256, 4, 4, 2, 16);
    for (int i = 0; i < 42; i++)
        s_handoff_of(f, CLIENT_A, i, 4);
    s_handoff_of(f, CLIENT_B, 42, 4);
    assert_int_equal(sched_count(f->s, SCHED_RUNNING), 2);
    assert_int_equal(sched_count(f->s, SCHED_WAITING), 41);
    assert_string_equal(s_step(f), "1:1d 2:1d");
    sched_remove(f->s, &f->req[0].sr);
    assert_string_equal(s_step(f), "2:1d 43:1d");
    assert_int_equal(f->req[42].sr.state, SCHED_RUNNING);
    assert_int_equal(f->req[2].sr.state, SCHED_WAITING);
    sched_remove(f->s, &f->req[1].sr);
    assert_string_equal(s_step(f), "43:1d 3:1d");
    /* B has nothing waiting: A's requests follow one another, oldest first. */
    sched_remove(f->s, &f->req[42].sr);
    assert_string_equal(s_step(f), "3:1d 4:1d");
    s_unfix(f);
}

/* Among clients with as many running, the one whose last turn is the longest ago goes first: a
 * client new here before client A's older waiting request, then A again. */
static void test_promotion_turns(void **st)
{
    fix_t *f = s_fix(64, 4, 4, 1, 16);
    s_handoff_of(f, CLIENT_A, 0, 4);
    s_handoff_of(f, CLIENT_A, 1, 4);
    s_handoff_of(f, CLIENT_C, 2, 4);
    assert_string_equal(s_step(f), "1:1d");
    sched_remove(f->s, &f->req[0].sr);
    assert_string_equal(s_step(f), "3:1d");
    sched_remove(f->s, &f->req[2].sr);
    assert_string_equal(s_step(f), "2:1d");
    s_unfix(f);
}

/* Clients that never ran tie: the one whose oldest waiting request waited longest goes first,
 * whatever order the clients came in, also after a cancel left a client with a later head (B's
 * first request cancelled: C's, older than B's second, goes first; then B's before D's). */
static void test_promotion_tie_oldest_waiting(void **st)
{
    fix_t *f = s_fix(64, 4, 4, 1, 16);
    s_handoff_of(f, CLIENT_A, 0, 4);
    s_handoff_of(f, CLIENT_B, 1, 4);
    s_handoff_of(f, CLIENT_C, 2, 4);
    s_handoff_of(f, CLIENT_B, 3, 4);
    s_handoff_of(f, CLIENT_D, 4, 4);
    assert_string_equal(s_step(f), "1:1d");
    sched_remove(f->s, &f->req[1].sr);   /* B's first, still waiting */
    sched_remove(f->s, &f->req[0].sr);
    assert_string_equal(s_step(f), "3:1d");
    sched_remove(f->s, &f->req[2].sr);
    assert_string_equal(s_step(f), "4:1d");
    sched_remove(f->s, &f->req[3].sr);
    assert_string_equal(s_step(f), "5:1d");
    assert_int_equal(sched_count(f->s, SCHED_WAITING), 0);
    s_unfix(f);
}

/* Prompt chunks go round robin across clients: client A's 40 prompts, then client B's one and
 * client C's one: a step's budget (three prompts) takes A's oldest, then B's and C's (each client's
 * first turn), not A's next two (oldest first would). Within A, oldest first. A later client's
 * prompt goes ahead of A's next while A has more in service. */
static void test_prompt_round_robin(void **st)
{
    fix_t *f = s_fix(256, 4, 8, 8, 24);
    for (int i = 0; i < 40; i++)
        s_prompt_of(f, CLIENT_A, i, 8, i);
    s_prompt_of(f, CLIENT_B, 40, 8, 40);
    s_prompt_of(f, CLIENT_C, 41, 8, 41);
    assert_string_equal(s_step(f), "1:8s 41:8s 42:8s");
    assert_string_equal(s_step(f), "1:1d 41:1d 42:1d 2:8s 3:8s 4:8s");
    /* Client D's prompt goes ahead of A's fifth: A has 4 in service, D none. */
    s_prompt_of(f, 0xd, 42, 8, 42);
    assert_string_equal(s_step(f), "1:1d 41:1d 42:1d 2:1d 3:1d 4:1d 43:8s 5:8s");
    s_unfix(f);
}

/* An old prompt of client A being chunked keeps the budget against client A's newer prompts and
 * against a newer client with as much in service (equal rank: the older goes); once A runs a
 * request, client B's prompt goes before A's second. */
static void test_round_robin_keeps_old_prompt(void **st)
{
    fix_t *f = s_fix(128, 4, 8, 8, 8);
    s_prompt_of(f, CLIENT_A, 0, 24, 0);
    assert_string_equal(s_step(f), "1:8");
    s_prompt_of(f, CLIENT_A, 1, 8, 1);
    s_prompt_of(f, CLIENT_B, 2, 8, 2);
    assert_string_equal(s_step(f), "1:8");   /* A's rank 0 (oldest) ties B's: the older goes */
    assert_string_equal(s_step(f), "1:8s");
    assert_string_equal(s_step(f), "1:1d 3:8s");   /* A runs one now: B's before A's second */
    assert_string_equal(s_step(f), "1:1d 3:1d 2:8s");
    s_unfix(f);
}

/* The colocated benchmark's shape (tools/bench/h200-8b-colo-fp8.yaml under troupe-bench: every
 * connection a client of its own with one request at a time, 1,000-token prompts, a 2,048-token
 * budget), scaled down: the fair order is then admission order and the budget is filled to its
 * last token, the last prompt split, as fd93cd4's decode worker (oldest first) composed its steps;
 * a finished request's client's next prompt is taken at the next step beside the decode rows.
 * Issue 15's conc-16 comparison rests on these steps being the same in both trees. */
static void test_one_request_clients_fill_budget(void **st)
{
    fix_t *f = s_fix(256, 4, 8, 8, 21);
    for (int i = 0; i < 6; i++)
        s_prompt_of(f, 0x100 + (uint64_t)i, i, 10, i);
    assert_string_equal(s_step(f), "1:10s 2:10s 3:1");
    assert_string_equal(s_step(f), "1:1d 2:1d 3:9s 4:10s 5:2");
    assert_string_equal(s_step(f), "1:1d 2:1d 3:1d 4:1d 5:8s 6:10s");
    assert_string_equal(s_step(f), "1:1d 2:1d 3:1d 4:1d 5:1d 6:1d");
    sched_remove(f->s, &f->req[0].sr);   /* done: its client sends its next prompt */
    sched_remove(f->s, &f->req[1].sr);
    s_prompt_of(f, 0x100, 6, 10, 6);
    s_prompt_of(f, 0x101, 7, 10, 7);
    assert_string_equal(s_step(f), "3:1d 4:1d 5:1d 6:1d 7:10s 8:10s");
    assert_string_equal(s_step(f), "3:1d 4:1d 5:1d 6:1d 7:1d 8:1d");
    s_unfix(f);
}

/* A hand-off whose KV could not be taken: it starts PREEMPTED (client given). */
static req_t *s_handoff_no_room_of(fix_t *f, uint64_t client, int i, int n)
{
    req_t *r = &f->req[i];
    r->kv = kvseq_new(f->pool, MAX_TOKS, 0);
    for (int j = 0; j <= n; j++)
        r->toks[j] = (int32_t)(100 * i + j + 1);
    assert_int_equal(sched_add_running(f->s, &r->sr, (uint64_t)i + 1, client, r->kv, r->toks, n, 0, 0), 0);
    r->sr.n_toks++;
    assert_int_equal(r->sr.state, SCHED_PREEMPTED);
    return r;
}

/* Out of blocks for a decode row, a WAITING request's KV goes before a running request's: it
 * makes no progress with it. (Preempting the newest running one instead made each request
 * promoted from a long waiting queue the next victim: under load every waiting request turned
 * into a preempted one, one promotion at a time, while the others kept their blocks.) */
static void test_waiting_gives_blocks_before_running(void **st)
{
    fix_t *f = s_fix(7, 4, 4, 2, 16);
    req_t *a = s_handoff(f, 0, 7);   /* 2 blocks each, the 8th token next */
    req_t *b = s_handoff(f, 1, 7);
    req_t *c = s_handoff(f, 2, 7);   /* no slot: WAITING, holding its 2 blocks */
    assert_int_equal(c->sr.state, SCHED_WAITING);
    assert_string_equal(s_step(f), "1:1d 2:1d");   /* tokens 8: still 2 blocks */
    assert_int_equal(kvpool_free_count(f->pool), 1);
    /* Token 9 needs a third block each: a takes the free one, b's comes from c. */
    assert_string_equal(s_step(f), "1:1d 2:1d");
    assert_int_equal(a->sr.state, SCHED_RUNNING);
    assert_int_equal(b->sr.state, SCHED_RUNNING);
    assert_int_equal(c->sr.state, SCHED_PREEMPTED);
    assert_int_equal(kvseq_n_blocks(c->kv), 0);
    assert_int_equal(c->sr.target, c->sr.n_toks - 1);
    assert_int_equal(sched_preemptions(f->s), 1);
    /* a leaves: c is recomputed into its slot (its first block is still cached: 3 of its 7
     * tokens are computed) and runs with its own next token. */
    sched_remove(f->s, &a->sr);
    kvseq_destroy(&a->kv);
    assert_string_equal(s_step(f), "2:1d 3:3");
    assert_int_equal(c->sr.state, SCHED_RUNNING);
    assert_string_equal(s_step(f), "2:1d 3:1d");
    assert_memory_equal(kvseq_tokens(c->kv), c->toks, 8 * 4);
    s_unfix(f);
}

/* A freed decode slot goes to a preempted request's recompute before any waiting request: a
 * stream of hand-offs arriving with their KV would otherwise take every slot while the preempted
 * request (older work) waits for the waiting queue to run dry. */
static void test_preempted_before_waiting(void **st)
{
    fix_t *f = s_fix(64, 4, 4, 2, 16);
    req_t *a = s_handoff(f, 0, 4);
    s_handoff(f, 1, 4);
    req_t *p = s_handoff_no_room_of(f, 0, 2, 4);   /* older than the waiting ones below */
    req_t *w1 = s_handoff(f, 3, 4);
    req_t *w2 = s_handoff(f, 4, 4);
    assert_int_equal(w1->sr.state, SCHED_WAITING);
    assert_string_equal(s_step(f), "1:1d 2:1d");   /* no free slot: nothing recomputed yet */
    sched_remove(f->s, &a->sr);
    assert_string_equal(s_step(f), "2:1d 3:4");    /* the slot is the recompute's */
    assert_int_equal(p->sr.state, SCHED_RUNNING);
    assert_int_equal(w1->sr.state, SCHED_WAITING);
    assert_int_equal(w2->sr.state, SCHED_WAITING);
    s_unfix(f);
}

/* Recomputes go round robin over clients counting their preempted requests: client B's one
 * preempted request is recomputed before client A's three older ones (oldest first among equal
 * ranks would put it behind all of them; with many such clients it waited for minutes). */
static void test_light_client_recompute_first(void **st)
{
    fix_t *f = s_fix(64, 4, 4, 1, 16);
    req_t *run = s_handoff_of(f, CLIENT_C, 0, 4);
    for (int i = 1; i <= 3; i++)
        s_handoff_no_room_of(f, CLIENT_A, i, 4);
    req_t *b = s_handoff_no_room_of(f, CLIENT_B, 4, 4);
    assert_string_equal(s_step(f), "1:1d");
    sched_remove(f->s, &run->sr);
    /* Every recompute fits the step's budget; B's comes first and takes the slot, A's wait. */
    assert_string_equal(s_step(f), "5:4 2:4 3:4 4:4");
    assert_int_equal(b->sr.state, SCHED_RUNNING);
    assert_int_equal(f->req[1].sr.state, SCHED_WAITING);
    sched_remove(f->s, &b->sr);
    assert_string_equal(s_step(f), "2:1d");          /* then A's, oldest first */
    s_unfix(f);
}

/* A freed slot owed to recomputes goes to a waiting request of a less loaded client first: B's one
 * waiting hand-off runs before client A's two older preempted requests (before, B could only leave
 * WAITING by being the newest waiting request when blocks ran short; under a flood of hand-offs a
 * newer one always was, and B waited as long as the flood lasted). Against a recompute of a
 * client as loaded, the one admitted first goes first: D's older preempted request before E's
 * waiting one. */
static void test_light_waiting_before_recompute(void **st)
{
    fix_t *f = s_fix(64, 4, 4, 1, 16);
    req_t *run = s_handoff_of(f, CLIENT_C, 0, 4);
    s_handoff_no_room_of(f, CLIENT_A, 1, 4);
    s_handoff_no_room_of(f, CLIENT_A, 2, 4);
    req_t *b = s_handoff_of(f, CLIENT_B, 3, 4);
    assert_int_equal(b->sr.state, SCHED_WAITING);
    assert_string_equal(s_step(f), "1:1d");
    sched_remove(f->s, &run->sr);
    assert_string_equal(s_step(f), "4:1d");           /* B's hand-off, not A's recomputes */
    assert_int_equal(b->sr.state, SCHED_RUNNING);
    assert_int_equal(f->req[1].sr.state, SCHED_PREEMPTED);
    sched_remove(f->s, &b->sr);
    assert_string_equal(s_step(f), "2:4 3:4");         /* then A's, oldest first, into the slot */
    assert_int_equal(f->req[1].sr.state, SCHED_RUNNING);
    sched_remove(f->s, &f->req[1].sr);
    sched_remove(f->s, &f->req[2].sr);
    /* Equal ranks: D's preempted request was admitted before E's waiting one. */
    req_t *run2 = s_handoff_of(f, CLIENT_C, 4, 4);
    req_t *d = s_handoff_no_room_of(f, CLIENT_D, 5, 4);
    req_t *e = s_handoff_of(f, 0xe, 6, 4);
    assert_int_equal(e->sr.state, SCHED_WAITING);
    sched_remove(f->s, &run2->sr);
    assert_string_equal(s_step(f), "6:4");
    assert_int_equal(d->sr.state, SCHED_RUNNING);
    assert_int_equal(e->sr.state, SCHED_WAITING);
    s_unfix(f);
}

/* Out of blocks, the running request preempted is the newest of the client with the most requests
 * here, not the newest overall: B's one request (admitted last) keeps its KV, A's newer of two
 * gives its blocks back. Among clients alike the newest goes, as before (test_preempt_and_resume). */
static void test_preempt_heaviest_client(void **st)
{
    fix_t *f = s_fix(9, 4, 4, 4, 16);
    req_t *a1 = s_handoff_of(f, CLIENT_A, 0, 7);   /* 2 blocks each, the 8th token next */
    req_t *a2 = s_handoff_of(f, CLIENT_A, 1, 7);
    req_t *b = s_handoff_of(f, CLIENT_B, 2, 7);
    for (int i = 0; i < 5; i++)
        assert_string_equal(s_step(f), "1:1d 2:1d 3:1d");   /* tokens 8..12: 3 blocks each */
    assert_int_equal(kvpool_free_count(f->pool), 0);
    assert_int_equal(sched_preemptions(f->s), 0);
    /* Token 13 needs a fourth block each: A's newer request gives its 3 back. */
    assert_string_equal(s_step(f), "1:1d 3:1d");
    assert_int_equal(sched_preemptions(f->s), 1);
    assert_int_equal(a2->sr.state, SCHED_PREEMPTED);
    assert_int_equal(a1->sr.state, SCHED_RUNNING);
    assert_int_equal(b->sr.state, SCHED_RUNNING);
    s_unfix(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_order),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_preempt_and_resume),
        cmocka_unit_test(test_prompt_larger_than_pool),
        cmocka_unit_test(test_fairness_old_before_new),
        cmocka_unit_test(test_stuck_oldest_keeps_turn),
        cmocka_unit_test(test_hold),
        cmocka_unit_test(test_waiting_promotion),
        cmocka_unit_test(test_find_by_id),
        cmocka_unit_test(test_prompt_gives_back_first),
        cmocka_unit_test(test_prompts_only),
        cmocka_unit_test(test_two_half_prompts_no_deadlock),
        cmocka_unit_test(test_handoff_without_room),
        cmocka_unit_test(test_promotion_round_robin),
        cmocka_unit_test(test_promotion_turns),
        cmocka_unit_test(test_promotion_tie_oldest_waiting),
        cmocka_unit_test(test_prompt_round_robin),
        cmocka_unit_test(test_round_robin_keeps_old_prompt),
        cmocka_unit_test(test_one_request_clients_fill_budget),
        cmocka_unit_test(test_waiting_gives_blocks_before_running),
        cmocka_unit_test(test_preempted_before_waiting),
        cmocka_unit_test(test_light_client_recompute_first),
        cmocka_unit_test(test_light_waiting_before_recompute),
        cmocka_unit_test(test_preempt_heaviest_client),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
