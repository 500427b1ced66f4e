/* tests/unit/test_spec_draft.c — the draft-model proposer (engine/spec_draft.c) and the
 * rejection rule with a draft distribution (sampler_verify_dist):
 *   - a draft that is the target itself proposes the target's own greedy continuation;
 *   - KV bookkeeping: after a proposal of k drafts the draft KV holds the sequence and k - 1
 *     drafts; `accepted` rolls it back to what the target kept; a sequence the caller changed is
 *     recomputed from where it differs; `forget` frees it; every pool block comes back;
 *   - batched proposals equal one-at-a-time proposals, token for token;
 *   - a pool too small for every sequence: the one without blocks gets no drafts, nothing leaks;
 *   - sampled drafts: q rows that sum to 1, probs = q(draft), and with the target as its own
 *     draft (q = p) the verify accepts every draft;
 *   - a draft with another vocabulary or tokenizer is refused, naming both directories;
 *   - statistics: tokens emitted by sampler_verify_dist with drafts drawn from q follow the
 *     target's processed distribution p (total variation shrinking with the samples, acceptance
 *     sum min(p, q)); a verify told the wrong q fails the same bound. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/engine_open.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "kernels/sample_rng.h"
#include "tests/unit/spec_dist_check.h"

#define FIXTURES "tests/fixtures/models"
#define TARGET FIXTURES "/llama-gqa-f32"
#define DRAFT FIXTURES "/llama-tied-bf16"
#define MAX_LEN 96

static engine_t *s_target(void)
{
    engine_spec_t s;
    engine_spec_default(&s);
    s.threads = 1;
    s.model = (model_opts_t){.max_tokens = 64, .max_seqs = 4, .max_logit_rows = 4 * (1 + SPEC_MAX_K),
                             .max_context = MAX_LEN + SPEC_MAX_K, .kv_block_size = 16};
    s.kv_blocks = 64;
    char err[512];
    engine_t *e = engine_open(TARGET, &s, NULL, err, sizeof err);
    if (!e)
        fail_msg("%s", err);
    return e;
}

static spec_proposer_t *s_draft(engine_t *t, const char *dir, long kv_blocks)
{
    spec_draft_opts_t o = {.model_dir = dir, .target = t, .max_seqs = 4, .max_tokens = 16, .max_model_len = MAX_LEN,
                           .block_size = 16, .kv_blocks = kv_blocks};
    char err[512];
    spec_proposer_t *p = spec_draft_new(&o, NULL, err, sizeof err);
    if (!p)
        fail_msg("%s", err);
    return p;
}

/* The target's greedy continuation of toks[0..n) by n_out plain decode steps. */
static void s_greedy(engine_t *e, const int32_t *toks, int n, int n_out, int32_t *out)
{
    kvseq_t *kv = kvseq_new(e->pool, MAX_LEN, 0);
    assert_non_null(kv);
    char err[256];
    int32_t t;
    assert_int_equal(kvseq_append(kv, toks, n), 0);
    for (int i = 0, new = n; i < n_out; i++, new = 1) {
        model_seq_t q = {.kv = kv, .n_new = new};
        model_batch_t b = {.n_seqs = 1, .seqs = &q, .argmax_out = &t};
        assert_int_equal(model_forward(e->model, &b, e->logits, err, sizeof err), 0);
        out[i] = t;
        assert_int_equal(kvseq_append(kv, &t, 1), 0);
    }
    kvseq_destroy(&kv);
}

static const int32_t s_prompt[] = {3, 17, 200, 41, 5, 99, 99, 12, 300, 7, 64, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
#define NP ((int)(sizeof s_prompt / sizeof s_prompt[0]))

static void test_self_draft_is_the_target(void **state)
{
    (void)state;
    engine_t *t = s_target();
    spec_proposer_t *p = s_draft(t, TARGET, 0);
    assert_string_equal(p->ops->name, "draft");
    int32_t want[8], d[8];
    float q[8];
    s_greedy(t, s_prompt, NP, 8, want);
    assert_int_equal(spec_propose(p, 7, s_prompt, NP, 6, d, q), 6);
    assert_memory_equal(d, want, 6 * sizeof *d);
    /* Greedy: the draft's softmax probability of each draft, a confidence in (0, 1]. */
    for (int i = 0; i < 6; i++)
        assert_true(q[i] > 0 && q[i] <= 1.0f);
    assert_null(spec_dist(p, 7, 0));               /* greedy drafts: a point mass for the verify */
    /* The same as the probability the target (the same model) gives its own greedy token. */
    int32_t one;
    assert_int_equal(spec_propose(p, 8, s_prompt, NP, 1, &one, q), 1);
    kvseq_t *kv = kvseq_new(t->pool, MAX_LEN, 0);
    assert_int_equal(kvseq_append(kv, s_prompt, NP), 0);
    model_seq_t ms = {.kv = kv, .n_new = NP};
    model_batch_t mb = {.n_seqs = 1, .seqs = &ms};
    char err[256];
    assert_int_equal(model_forward(t->model, &mb, t->logits, err, sizeof err), 0);
    double z = 0, mx = t->logits[one];
    for (int v = 0; v < t->cfg.vocab_size; v++)
        z += exp(t->logits[v] - mx);
    assert_true(fabs(q[0] - 1 / z) < 1e-5);
    kvseq_destroy(&kv);
    spec_proposer_destroy(&p);
    engine_destroy(&t);
}

static void test_kv_bookkeeping(void **state)
{
    (void)state;
    engine_t *t = s_target();
    spec_proposer_t *p = s_draft(t, DRAFT, 0);
    spec_draft_stats_t st;
    spec_draft_stats(p, &st);
    assert_int_equal(st.blocks_used, 0);
    int32_t seq[MAX_LEN], d[SPEC_MAX_K];
    memcpy(seq, s_prompt, sizeof s_prompt);
    int n = NP;
    assert_int_equal(spec_draft_kv_len(p, 5), -1);
    assert_int_equal(spec_propose(p, 5, seq, n, 4, d, NULL), 4);
    assert_int_equal(spec_draft_kv_len(p, 5), n + 3);      /* the last draft is never computed */
    /* The target keeps 2 drafts and emits a token of its own. */
    spec_accepted(p, 5, 2, 2);
    assert_int_equal(spec_draft_kv_len(p, 5), n + 2);
    seq[n] = d[0], seq[n + 1] = d[1], seq[n + 2] = (d[2] + 1) % 512;
    n += 3;
    spec_draft_stats(p, &st);
    const uint64_t tokens_before = st.tokens;
    assert_int_equal(spec_propose(p, 5, seq, n, 3, d, NULL), 3);
    spec_draft_stats(p, &st);
    assert_int_equal(st.tokens - tokens_before, 1 + 2);     /* catch-up: only the target's token; 2 drafts */
    assert_int_equal(spec_draft_kv_len(p, 5), n + 2);
    /* Everything kept: the last draft is computed by the next catch-up with the target's token. */
    spec_accepted(p, 5, 3, 3);
    assert_int_equal(spec_draft_kv_len(p, 5), n + 2);
    memcpy(seq + n, d, 3 * sizeof *d);
    seq[n + 3] = 9;
    n += 4;
    spec_draft_stats(p, &st);
    const uint64_t t2 = st.tokens;
    assert_int_equal(spec_propose(p, 5, seq, n, 2, d, NULL), 2);
    spec_draft_stats(p, &st);
    assert_int_equal(st.tokens - t2, 2 + 1);
    /* No `accepted`, and the caller changed an early token: recomputed from there, same drafts as a
     * fresh sequence. */
    seq[4] = 100;
    int32_t fresh[SPEC_MAX_K];
    assert_int_equal(spec_propose(p, 5, seq, n, 4, d, NULL), 4);
    assert_int_equal(spec_draft_kv_len(p, 5), n + 3);
    assert_int_equal(spec_propose(p, 6, seq, n, 4, fresh, NULL), 4);
    assert_memory_equal(d, fresh, 4 * sizeof *d);
    /* Asked again with the same tokens (the verify never happened): the same drafts. */
    assert_int_equal(spec_propose(p, 6, seq, n, 4, d, NULL), 4);
    assert_memory_equal(d, fresh, 4 * sizeof *d);
    spec_draft_stats(p, &st);
    assert_int_equal(st.seqs, 2);
    assert_true(st.blocks_used > 0);
    spec_forget(p, 5);
    spec_forget(p, 6);
    spec_forget(p, 6);                             /* unknown now: nothing */
    spec_draft_stats(p, &st);
    assert_int_equal(st.seqs, 0);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(spec_draft_kv_len(p, 5), -1);
    /* k and the room: no drafts past max_model_len. */
    int32_t longseq[MAX_LEN];
    for (int i = 0; i < MAX_LEN; i++)
        longseq[i] = (i * 7) % 500;
    assert_int_equal(spec_propose(p, 8, longseq, MAX_LEN - 2, 6, d, NULL), 3);
    assert_int_equal(spec_propose(p, 8, longseq, MAX_LEN, 6, d, NULL), 1);
    spec_proposer_destroy(&p);
    engine_destroy(&t);
}

static void test_batch_equals_single(void **state)
{
    (void)state;
    engine_t *t = s_target();
    spec_proposer_t *a = s_draft(t, DRAFT, 0), *b = s_draft(t, DRAFT, 0);
    /* Six sequences (more than max_seqs 4: two groups), of different lengths and k. */
    int32_t toks[6][40], single[6][SPEC_MAX_K], batched[6][SPEC_MAX_K];
    spec_ask_t asks[6];
    for (int s = 0; s < 6; s++) {
        for (int i = 0; i < 40; i++)
            toks[s][i] = (int32_t)((s * 31 + i * 13 + i * i) % 511);
        const int n = 5 + 6 * s, k = 1 + s % 5;
        assert_int_equal(spec_propose(a, 100 + s, toks[s], n, k, single[s], NULL), k);
        asks[s] = (spec_ask_t){.id = 100 + (uint64_t)s, .tokens = toks[s], .n = n, .k = k, .drafts = batched[s]};
    }
    assert_int_equal(spec_propose_batch(b, asks, 6), 0);
    for (int s = 0; s < 6; s++) {
        assert_int_equal(asks[s].n_drafts, asks[s].k);
        assert_memory_equal(single[s], batched[s], (size_t)asks[s].k * sizeof(int32_t));
        assert_int_equal(spec_draft_kv_len(b, 100 + s), asks[s].n + asks[s].k - 1);
    }
    /* The next step: no draft kept, one token of the target's each. Every sequence's catch-up is
     * one token: per group of 4, one catch-up forward and one per further draft position. */
    spec_draft_stats_t st0, st;
    spec_draft_stats(b, &st0);
    for (int s = 0; s < 6; s++) {
        spec_accepted(a, 100 + s, 0, 0);
        spec_accepted(b, 100 + s, 0, 0);
        toks[s][asks[s].n] = (batched[s][0] + 1) % 511;
        asks[s].n++;
        asks[s].k = 5 - s % 5;                     /* group 1: 5 4 3 2; group 2: 1 5 */
        assert_int_equal(spec_propose(a, 100 + s, toks[s], asks[s].n, asks[s].k, single[s], NULL), asks[s].k);
    }
    assert_int_equal(spec_propose_batch(b, asks, 6), 0);
    spec_draft_stats(b, &st);
    print_message("second step, batched: %llu forwards, %llu tokens\n", (unsigned long long)(st.forwards - st0.forwards),
                  (unsigned long long)(st.tokens - st0.tokens));
    assert_int_equal(st.forwards - st0.forwards, (1 + 4) + (1 + 4));
    assert_int_equal(st.tokens - st0.tokens, 6 + (4 + 3 + 2 + 1) + (0 + 4));
    for (int s = 0; s < 6; s++) {
        assert_int_equal(asks[s].n_drafts, asks[s].k);
        assert_memory_equal(single[s], batched[s], (size_t)asks[s].k * sizeof(int32_t));
    }
    /* stop_below: a row stops drafting once its drafts' probability product is below it (the
     * policy would not verify the rest). The same sequence proposed twice gives the same greedy
     * drafts and probabilities: a threshold just above the first two drafts' product stops it
     * after those two, one that low drafts all k. */
    float probs[SPEC_MAX_K];
    spec_accepted(b, 100, 0, 0);
    spec_ask_t full = {.id = 100, .tokens = toks[0], .n = asks[0].n, .k = 6, .drafts = batched[0], .probs = probs,
                       .stop_below = 1e-30f};
    assert_int_equal(spec_propose_batch(b, &full, 1), 0);
    assert_int_equal(full.n_drafts, 6);
    const double two = (double)probs[0] * probs[1];
    assert_true(probs[1] < 0.9999f);
    spec_accepted(b, 100, 0, 0);
    spec_ask_t cut = full;
    cut.stop_below = (float)(two * 1.0001);
    assert_int_equal(spec_propose_batch(b, &cut, 1), 0);
    assert_int_equal(cut.n_drafts, 2);
    spec_proposer_destroy(&a);
    spec_proposer_destroy(&b);
    engine_destroy(&t);
}

/* max_catch_up: a sequence whose draft KV lacks more than that many tokens computes only its last
 * max_catch_up, a window: its drafts are those of a fresh proposer asked with the window alone,
 * the catch-up costs the window's tokens, and the sequence's next steps stay in step within it;
 * an ask without max_catch_up computes the whole sequence again and drafts as a fresh proposer
 * asked with all of it. */
static void test_windowed_catch_up(void **state)
{
    (void)state;
    engine_t *t = s_target();
    spec_proposer_t *a = s_draft(t, DRAFT, 0), *ref = s_draft(t, DRAFT, 0);
    int32_t toks[64], got[SPEC_MAX_K], want[SPEC_MAX_K];
    for (int i = 0; i < 64; i++)
        toks[i] = (int32_t)((i * 13 + i * i + 5) % 511);
    /* In step at 10 tokens, then 30 tokens later (a plain stretch): a window of 8. */
    assert_int_equal(spec_propose(a, 7, toks, 10, 2, got, NULL), 2);
    spec_accepted(a, 7, 0, 0);
    spec_draft_stats_t st0, st;
    spec_draft_stats(a, &st0);
    spec_ask_t w = {.id = 7, .tokens = toks, .n = 40, .k = 3, .drafts = got, .max_catch_up = 8};
    assert_int_equal(spec_propose_batch(a, &w, 1), 0);
    spec_draft_stats(a, &st);
    assert_int_equal(w.n_drafts, 3);
    assert_int_equal(st.windows - st0.windows, 1);
    assert_int_equal(st.tokens - st0.tokens, 8 + 2);   /* the window, then two draft positions */
    assert_int_equal(spec_draft_kv_len(a, 7), 8 + 2);
    assert_int_equal(spec_propose(ref, 1, toks + 32, 8, 3, want, NULL), 3);
    assert_memory_equal(got, want, 3 * sizeof(int32_t));
    /* The next step (one draft kept, the target's own token): still in step inside the window. */
    spec_accepted(a, 7, 1, 1);
    spec_accepted(ref, 1, 1, 1);
    toks[41] = (got[1] + 1) % 511;
    toks[40] = got[0];
    w.n = 42;
    spec_draft_stats(a, &st0);
    assert_int_equal(spec_propose_batch(a, &w, 1), 0);
    spec_draft_stats(a, &st);
    assert_int_equal(st.windows - st0.windows, 0);
    assert_int_equal(st.tokens - st0.tokens, 1 + 2);
    assert_int_equal(spec_propose(ref, 1, toks + 32, 10, 3, want, NULL), 3);
    assert_memory_equal(got, want, 3 * sizeof(int32_t));
    /* Without max_catch_up: the whole sequence again, as a fresh proposer would. */
    spec_accepted(a, 7, 0, 0);
    spec_ask_t f = {.id = 7, .tokens = toks, .n = 42, .k = 3, .drafts = got};
    spec_draft_stats(a, &st0);
    assert_int_equal(spec_propose_batch(a, &f, 1), 0);
    spec_draft_stats(a, &st);
    assert_int_equal(st.tokens - st0.tokens, 42 + 2);
    assert_int_equal(spec_propose(ref, 2, toks, 42, 3, want, NULL), 3);
    assert_memory_equal(got, want, 3 * sizeof(int32_t));
    assert_int_equal(spec_draft_kv_len(a, 7), 42 + 2);
    spec_proposer_destroy(&a);
    spec_proposer_destroy(&ref);
    engine_destroy(&t);
}

/* A window kept by asks with a bound it holds, and one with a larger bound (a drafting step after
 * an exploration's window): that ask computes its own window of the last max_catch_up tokens,
 * once, drafting as a fresh proposer asked with them; the asks after it keep it. */
static void test_window_grows_to_a_larger_bound(void **state)
{
    (void)state;
    engine_t *t = s_target();
    spec_proposer_t *a = s_draft(t, DRAFT, 0), *ref = s_draft(t, DRAFT, 0);
    int32_t toks[64], got[SPEC_MAX_K], want[SPEC_MAX_K];
    for (int i = 0; i < 64; i++)
        toks[i] = (int32_t)((i * 7 + i * i * 3 + 11) % 509);
    spec_draft_stats_t st0, st;
    /* An exploration's window of 8 at 40 tokens. */
    spec_ask_t w = {.id = 9, .tokens = toks, .n = 40, .k = 1, .drafts = got, .max_catch_up = 8};
    assert_int_equal(spec_propose_batch(a, &w, 1), 0);
    spec_accepted(a, 9, 0, 0);
    /* Its second step asks with the same bound: kept, one token more. */
    w.n = 41;
    spec_draft_stats(a, &st0);
    assert_int_equal(spec_propose_batch(a, &w, 1), 0);
    spec_draft_stats(a, &st);
    assert_int_equal(st.windows - st0.windows, 0);
    assert_int_equal(st.tokens - st0.tokens, 1);
    spec_accepted(a, 9, 0, 0);
    /* The policy drafts with a bound of 16: a window of the last 16 tokens, once. */
    spec_ask_t p = {.id = 9, .tokens = toks, .n = 42, .k = 3, .drafts = got, .max_catch_up = 16};
    spec_draft_stats(a, &st0);
    assert_int_equal(spec_propose_batch(a, &p, 1), 0);
    spec_draft_stats(a, &st);
    assert_int_equal(st.windows - st0.windows, 1);
    assert_int_equal(st.tokens - st0.tokens, 16 + 2);
    assert_int_equal(spec_propose(ref, 1, toks + 26, 16, 3, want, NULL), 3);
    assert_memory_equal(got, want, 3 * sizeof(int32_t));
    /* The next ask, same bound: in step inside that window (two tokens more: a kept draft and the
     * target's own). */
    spec_accepted(a, 9, 1, 1);
    spec_accepted(ref, 1, 1, 1);
    toks[42] = got[0];
    toks[43] = (got[1] + 3) % 509;
    p.n = 44;
    spec_draft_stats(a, &st0);
    assert_int_equal(spec_propose_batch(a, &p, 1), 0);
    spec_draft_stats(a, &st);
    assert_int_equal(st.windows - st0.windows, 0);
    assert_int_equal(st.tokens - st0.tokens, 1 + 2);
    assert_int_equal(spec_propose(ref, 1, toks + 26, 18, 3, want, NULL), 3);
    assert_memory_equal(got, want, 3 * sizeof(int32_t));
    /* An exploration's smaller bound keeps it too (it holds more than 8 tokens). */
    spec_accepted(a, 9, 0, 0);
    spec_ask_t e = {.id = 9, .tokens = toks, .n = 45, .k = 1, .drafts = got, .max_catch_up = 8};
    spec_draft_stats(a, &st0);
    assert_int_equal(spec_propose_batch(a, &e, 1), 0);
    spec_draft_stats(a, &st);
    assert_int_equal(st.windows - st0.windows, 0);
    assert_true(st.tokens - st0.tokens <= 2);
    spec_proposer_destroy(&a);
    spec_proposer_destroy(&ref);
    engine_destroy(&t);
}

/* spec_draft_device_bytes, from the config alone, against what spec_draft_new then places: the
 * draft's weights (model_weight_bytes of the same checkpoint) and its pool (blocks x block bytes),
 * for a sized pool and the default one (max_seqs sequences of max_model_len). */
static void test_device_bytes(void **state)
{
    (void)state;
    engine_t *t = s_target();
    char err[512];
    engine_spec_t es;
    engine_spec_default(&es);
    es.threads = 1;
    es.model = (model_opts_t){.max_tokens = 16, .max_seqs = 4, .max_context = MAX_LEN, .kv_block_size = 16};
    es.kv_blocks = 4;
    engine_t *d = engine_open(DRAFT, &es, NULL, err, sizeof err);
    if (!d)
        fail_msg("%s", err);
    const double weights = (double)model_weight_bytes(d->model),
                 block = 16.0 * (double)config_kv_bytes_per_token(&d->cfg, dtype_size(d->kv_dtype));
    for (long kvb = 0; kvb <= 10; kvb += 10) {
        spec_proposer_t *p = s_draft(t, DRAFT, kvb);
        spec_draft_stats_t st;
        spec_draft_stats(p, &st);
        const spec_draft_opts_t o = {.model_dir = DRAFT, .max_seqs = 4, .max_tokens = 16, .max_model_len = MAX_LEN,
                                     .block_size = 16, .kv_blocks = kvb};
        double bytes = 0;
        assert_int_equal(spec_draft_device_bytes(&o, DT_COUNT, &bytes, err, sizeof err), 0);
        const double placed = weights + st.blocks_total * block;
        print_message("kv_blocks %ld: estimated %.0f bytes, placed %.0f (%d blocks)\n", kvb, bytes, placed,
                      st.blocks_total);
        assert_true(fabs(bytes - placed) <= 0.02 * placed);
        spec_proposer_destroy(&p);
    }
    const spec_draft_opts_t bad = {.model_dir = FIXTURES "/no-such-model", .max_seqs = 4, .max_model_len = MAX_LEN};
    double bytes = 0;
    assert_int_equal(spec_draft_device_bytes(&bad, DT_COUNT, &bytes, err, sizeof err), -1);
    assert_non_null(strstr(err, "no-such-model"));
    engine_destroy(&d);
    engine_destroy(&t);
}

static void test_pool_runs_out(void **state)
{
    (void)state;
    engine_t *t = s_target();
    spec_proposer_t *p = s_draft(t, DRAFT, 3);     /* 48 token slots */
    int32_t toks[2][40], d[2][4];
    for (int i = 0; i < 40; i++)
        toks[0][i] = i + 1, toks[1][i] = 200 + i;
    spec_ask_t asks[2] = {
        {.id = 1, .tokens = toks[0], .n = 30, .k = 4, .drafts = d[0]},
        {.id = 2, .tokens = toks[1], .n = 30, .k = 4, .drafts = d[1]},
    };
    spec_propose_batch(p, asks, 2);
    assert_int_equal(asks[0].n_drafts, 4);
    assert_int_equal(asks[1].n_drafts, 0);         /* no blocks left for it */
    spec_draft_stats_t st;
    spec_draft_stats(p, &st);
    assert_int_equal(st.blocks_used, 3);
    spec_forget(p, 1);
    /* Now it fits. */
    spec_propose_batch(p, asks + 1, 1);
    assert_int_equal(asks[1].n_drafts, 4);
    spec_forget(p, 2);
    spec_draft_stats(p, &st);
    assert_int_equal(st.blocks_used, 0);
    spec_proposer_destroy(&p);
    engine_destroy(&t);
}

static void test_sampled_self_draft_is_accepted(void **state)
{
    (void)state;
    engine_t *t = s_target();
    spec_proposer_t *p = s_draft(t, TARGET, 0);
    sampler_params_t sp;
    sampler_params_default(&sp);
    sp.temperature = 0.9;
    sp.top_k = 50;
    sp.seed = 11;
    char err[256];
    sampler_t *smp = sampler_new(&sp, t->cfg.vocab_size, s_prompt, NP, err, sizeof err);
    assert_non_null(smp);
    kvseq_t *kv = kvseq_new(t->pool, MAX_LEN + SPEC_MAX_K, 0);
    int32_t seq[MAX_LEN + SPEC_MAX_K + 2], d[4];
    float probs[4];
    memcpy(seq, s_prompt, sizeof s_prompt);
    int n = NP, drafts = 0, accepted = 0;
    assert_int_equal(kvseq_append(kv, seq, n - 1), 0);
    model_seq_t pre = {.kv = kv, .n_new = n - 1};
    model_batch_t pb = {.n_seqs = 1, .seqs = &pre};
    assert_int_equal(model_forward(t->model, &pb, t->logits, err, sizeof err), 0);
    const size_t V = (size_t)t->cfg.vocab_size;
    while (n < 60) {
        bk_sample_t bs;
        sampler_device_params(smp, &bs);
        spec_ask_t a = {.id = 3, .tokens = seq, .n = n, .k = 4, .sample = &bs, .drafts = d, .probs = probs};
        assert_int_equal(spec_propose_batch(p, &a, 1), 0);
        assert_int_equal(a.n_drafts, 4);
        spec_check_dists(p, 3, d, probs, 4, V);
        assert_null(spec_dist(p, 3, 4));
        /* The verify: the last token and the drafts through the target. */
        const int base = kvseq_len(kv);
        assert_int_equal(kvseq_append(kv, seq + n - 1, 1), 0);
        assert_int_equal(kvseq_append(kv, d, 4), 0);
        model_seq_t ms = {.kv = kv, .n_new = 5};
        model_batch_t b = {.n_seqs = 1, .seqs = &ms, .all_logits = 1};
        assert_int_equal(model_forward(t->model, &b, t->logits, err, sizeof err), 0);
        int j = 0, acc = 0;
        for (;; j++) {
            const int32_t y = sampler_verify_dist(smp, t->logits + (size_t)j * V, j < 4 ? d[j] : -1,
                                                  j < 4 ? spec_dist(p, 3, j) : NULL, NULL, &acc);
            sampler_accept(smp, y);
            seq[n++] = y;
            if (!acc || j == 4)
                break;
        }
        drafts += 4;
        accepted += j;
        spec_accepted(p, 3, j, j);
        assert_int_equal(kvseq_truncate(kv, base + 1 + j), 0);
    }
    print_message("self draft, sampled: %d of %d drafts accepted\n", accepted, drafts);
    assert_true(accepted >= drafts - 1);           /* q = p: rejection needs u >= p/q = 1 up to rounding */
    assert_null(spec_dist(p, 99, 0));
    spec_forget(p, 3);
    assert_null(spec_dist(p, 3, 0));
    kvseq_destroy(&kv);
    sampler_destroy(&smp);
    spec_proposer_destroy(&p);
    engine_destroy(&t);
}

/* ---- refusals ------------------------------------------------------------------------------ */

static char s_tmp[256];

static void s_sh(const char *fmt, const char *a, const char *b)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    assert_int_equal(system(cmd), 0);
}

static void s_expect_refusal(engine_t *t, const char *target_tok, const char *dir, const char *want1,
                             const char *want2)
{
    spec_draft_opts_t o = {.model_dir = dir, .target = t, .target_tokenizer = target_tok, .max_seqs = 1,
                           .max_tokens = 8, .max_model_len = 64};
    char err[1024] = "";
    int cfg = -1;
    spec_proposer_t *p = spec_draft_new(&o, &cfg, err, sizeof err);
    print_message("refused: %s\n", err);
    assert_null(p);
    assert_int_equal(cfg, 1);
    assert_non_null(strstr(err, want1));
    if (want2)
        assert_non_null(strstr(err, want2));
}

static void test_refuses_another_vocabulary(void **state)
{
    (void)state;
    engine_t *t = s_target();
    s_expect_refusal(t, NULL, FIXTURES "/qwen3-0.6b-shape", "qwen3-0.6b-shape", "llama-gqa-f32");
    s_expect_refusal(t, NULL, FIXTURES "/no-such-model", "no-such-model", NULL);
    engine_destroy(&t);
}

/* An unknown TROUPE_DRAFT_DEVICE is a configuration error naming the variable, not the default. */
static void test_refuses_unknown_device_mode(void **state)
{
    (void)state;
    engine_t *t = s_target();
    const char *was = getenv("TROUPE_DRAFT_DEVICE");
    char keep[16] = "";
    if (was)
        snprintf(keep, sizeof keep, "%s", was);
    setenv("TROUPE_DRAFT_DEVICE", "3", 1);
    s_expect_refusal(t, NULL, TARGET, "TROUPE_DRAFT_DEVICE=3", "expected 0");
    setenv("TROUPE_DRAFT_DEVICE", "chained", 1);
    s_expect_refusal(t, NULL, TARGET, "TROUPE_DRAFT_DEVICE=chained", NULL);
    if (was)
        setenv("TROUPE_DRAFT_DEVICE", keep, 1);   /* the mode the rest of the run was given */
    else
        unsetenv("TROUPE_DRAFT_DEVICE");
    engine_destroy(&t);
}

static void test_refuses_another_tokenizer(void **state)
{
    (void)state;
    snprintf(s_tmp, sizeof s_tmp, "/tmp/test_spec_draft.%d", (int)getpid());
    char tt[300], dd[300], same[300];
    snprintf(tt, sizeof tt, "%s/target-tok", s_tmp);
    snprintf(dd, sizeof dd, "%s/draft", s_tmp);
    snprintf(same, sizeof same, "%s/draft-same", s_tmp);
    s_sh("mkdir -p '%s' '%s'", tt, dd);
    s_sh("mkdir -p '%s'%s", same, "");
    s_sh("cp tests/fixtures/tokenizer/synth/flags/tokenizer.json '%s'/%s", tt, "");
    s_sh("cp " DRAFT "/config.json " DRAFT "/model.safetensors '%s'/%s", dd, "");
    s_sh("cp " DRAFT "/config.json " DRAFT "/model.safetensors '%s'/%s", same, "");
    s_sh("cp tests/fixtures/tokenizer/synth/invert/tokenizer.json '%s'/%s", dd, "");
    /* The same tokenizer, other bytes (a trailing newline): accepted. */
    s_sh("{ cat tests/fixtures/tokenizer/synth/flags/tokenizer.json; echo; } > '%s'/tokenizer.json%s", same, "");
    engine_t *t = s_target();
    s_expect_refusal(t, tt, dd, dd, tt);
    spec_draft_opts_t o = {.model_dir = same, .target = t, .target_tokenizer = tt, .max_seqs = 1, .max_tokens = 8,
                           .max_model_len = 64};
    char err[1024];
    spec_proposer_t *p = spec_draft_new(&o, NULL, err, sizeof err);
    if (!p)
        fail_msg("%s", err);
    spec_proposer_destroy(&p);
    engine_destroy(&t);
    s_sh("rm -rf '%s'%s", s_tmp, "");
}

/* ---- the rule with a draft distribution, statistically ------------------------------------- */

enum { SV = 6 };
static const float s_logits[SV] = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.8f};
static const float s_q[SV] = {0.30f, 0.05f, 0.25f, 0.10f, 0.20f, 0.10f};   /* the draft, far from p */
static const float s_q_told[SV] = {0.10f, 0.25f, 0.05f, 0.30f, 0.20f, 0.10f};

/* The target's processed distribution: temperature 0.8, top-k 5 (token 4 dropped). */
static void s_target_p(double *p)
{
    double z = 0;
    for (int t = 0; t < SV; t++)
        z += (p[t] = t == 4 ? 0 : exp(s_logits[t] / 0.8));
    for (int t = 0; t < SV; t++)
        p[t] /= z;
}

/* n verify calls, drafts drawn from s_q, the verify told q_told; TV of the emitted tokens from p. */
static double s_tv(int n, const float *q_told, double *accept_rate)
{
    sampler_params_t sp;
    sampler_params_default(&sp);
    sp.temperature = 0.8;
    sp.top_k = 5;
    sp.seed = 0xd1a5;
    char err[256];
    sampler_t *s = sampler_new(&sp, SV, NULL, 0, err, sizeof err);
    assert_non_null(s);
    double p[SV];
    s_target_p(p);
    long count[SV] = {0}, n_acc = 0;
    for (int i = 0; i < n; i++) {
        const double u = spec_rng_uniform(sp.seed, SPEC_RNG_DRAFT, (uint64_t)i);
        double c = 0;
        int32_t x = SV - 1;
        for (int t = 0; t < SV; t++)
            if ((c += s_q[t]) > u) {
                x = t;
                break;
            }
        int a;
        const int32_t y = sampler_verify_dist(s, s_logits, x, q_told, NULL, &a);
        assert_true(y >= 0 && y < SV);
        if (a)
            assert_int_equal(y, x);
        sampler_accept(s, y);                      /* the counter moves: a fresh u each time */
        count[y]++;
        n_acc += a;
    }
    sampler_destroy(&s);
    double tv = 0;
    for (int t = 0; t < SV; t++)
        tv += fabs((double)count[t] / n - p[t]);
    *accept_rate = (double)n_acc / n;
    return tv / 2;
}

static void test_verify_dist_follows_target(void **state)
{
    (void)state;
    double p[SV], want_rate = 0, rate = 0, prev = 1;
    s_target_p(p);
    for (int t = 0; t < SV; t++)
        want_rate += p[t] < s_q[t] ? p[t] : s_q[t];
    const int ns[] = {1000, 10000, 200000};
    for (int i = 0; i < 3; i++) {
        const double tv = s_tv(ns[i], s_q, &rate);
        print_message("n=%d tv=%.5f accept=%.4f (sum min(p, q) %.4f)\n", ns[i], tv, rate, want_rate);
        assert_true(tv < 2.5 * sqrt((double)SV / ns[i]));
        assert_true(tv < prev);
        prev = tv;
    }
    assert_true(fabs(rate - want_rate) < 0.01);
    /* The control: a verify given another q than the drafts came from is caught. */
    const double bad = s_tv(200000, s_q_told, &rate);
    print_message("wrong q: tv=%.5f\n", bad);
    assert_true(bad > 2.5 * sqrt((double)SV / 200000));
}

int main(void)
{
    if (access(TARGET "/model.safetensors", R_OK) != 0) {
        fprintf(stderr, "run from the repository root (%s not found)\n", TARGET);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_draft_is_the_target),      cmocka_unit_test(test_kv_bookkeeping),
        cmocka_unit_test(test_batch_equals_single),           cmocka_unit_test(test_device_bytes),
        cmocka_unit_test(test_pool_runs_out),                 cmocka_unit_test(test_windowed_catch_up),
        cmocka_unit_test(test_sampled_self_draft_is_accepted), cmocka_unit_test(test_refuses_another_vocabulary),
        cmocka_unit_test(test_refuses_another_tokenizer),     cmocka_unit_test(test_verify_dist_follows_target),
        cmocka_unit_test(test_refuses_unknown_device_mode),   cmocka_unit_test(test_window_grows_to_a_larger_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
