/* tests/unit/test_mtp.c — DeepSeek-V3 on kjv-deepseek (TROUPE_MODELS, else ../shared/models; skipped
 * when absent): the compressed MLA cache under prefix reuse, and the MTP layer as a proposer.
 *
 * 1. Prefix reuse: a prompt whose first blocks are adopted from another sequence's published
 *    cache (kvseq_match_prefix) gives bit-identical logits to computing it all.
 * 2. MTP agreement: greedy decoding of the target, with the MTP proposer fed the target's hidden
 *    states each step; the MTP's guess of the token after next is compared with the token the
 *    target then emits (the README of the models folder: 73% for transformers).
 * 3. MTP speculation, k = 1..3: verify steps (the last token and k drafts, logits of every row),
 *    greedy acceptance, KV roll-back, the accepted rows' hidden states fed back: the output equals
 *    plain greedy decoding token for token; acceptance, tokens per verify step and tokens/s printed.
 * 4. A late start, as in a decode worker that did not compute the prompt (a prefill worker did):
 *    the MTP sequence begins at the first position fed (the first generated token's), drafts from
 *    the next step on, and the output still equals plain greedy decoding; a gap in the feeds (a
 *    step whose hidden states never came) begins the sequence again at the next position fed.
 * 5. Batched: two sequences speculating in step, their proposals in one spec_propose_batch and
 *    their feeds in one spec_mtp_feed_batch, give the drafts that one-sequence calls on a second
 *    proposer give; a stop_below ends a sequence's drafts where their confidence falls below it.
 * 6. Sampled drafts: a sequence fed as a sampled request's draws its drafts from the MTP's
 *    distribution under the request's sampling, and spec_dist gives that distribution (what the
 *    rejection sampling needs to stay lossless): over many seeds the first draft's frequencies
 *    approach q; fed as a greedy request's, the drafts are the argmax and there is no distribution. */
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

#include "common/util.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/mtp.h"
#include "engine/tokenizer.h"
#include "tests/unit/spec_dist_check.h"

#define N_NEW 32
#define MAX_CTX 256

static const char *const s_prompts[] = {
    "And God said",
    "In the beginning",
    "The LORD is my shepherd",
};
#define N_PROMPTS ((int)(sizeof s_prompts / sizeof s_prompts[0]))

typedef struct {
    char dir[4096];
    model_config_t cfg;
    ckpt_t *ck;
    backend_t *be;
    model_t *m;
    kvpool_t *pool;
    tokenizer_t *tok;
} s_env_t;

static s_env_t s_env;

static int s_setup(void **state)
{
    (void)state;
    const char *root = getenv("TROUPE_MODELS");
    snprintf(s_env.dir, sizeof s_env.dir, "%s/kjv-deepseek", root && *root ? root : "../shared/models");
    if (access(s_env.dir, R_OK) != 0)
        return 0;
    char err[1024];
    if (config_load(s_env.dir, &s_env.cfg, err, sizeof err) != 0 || !(s_env.ck = ckpt_open(s_env.dir, err, sizeof err)))
        fail_msg("%s", err);
    s_env.be = backend_cpu_new(0);
    model_opts_t o = {.max_tokens = 128, .max_seqs = 4, .max_logit_rows = 16, .max_context = MAX_CTX};
    if (!(s_env.m = model_load(s_env.dir, &s_env.cfg, s_env.ck, s_env.be, &o, err, sizeof err)))
        fail_msg("%s", err);
    if (!(s_env.pool = kvpool_new(128, 16, s_env.cfg.num_layers, s_env.cfg.num_kv_heads, s_env.cfg.head_dim, DT_BF16,
                                  s_env.be, err, sizeof err)) ||
        !(s_env.tok = tok_load(s_env.dir, err, sizeof err)))
        fail_msg("%s", err);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    tok_destroy(&s_env.tok);
    kvpool_destroy(&s_env.pool);
    model_destroy(&s_env.m);
    ckpt_destroy(&s_env.ck);
    backend_destroy(&s_env.be);
    return 0;
}

static void s_need_model(void)
{
    if (!s_env.m) {
        print_message("SKIP: %s is absent (set TROUPE_MODELS to the shared models folder)\n", s_env.dir);
        skip();
    }
}

static int s_encode(const char *text, int32_t *ids)
{
    int32_t *v = NULL;
    size_t n = 0;
    if (tok_encode(s_env.tok, text, strlen(text), 0, &v, &n) != 0)
        fail_msg("cannot encode '%s'", text);
    memcpy(ids, v, n * sizeof(int32_t));
    free(v);
    return (int)n;
}

static int32_t s_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

/* One forward of s's last n_new tokens; logits of every new row when all, hidden of every new row. */
static void s_step(kvseq_t *s, int n_new, int all, float *logits, float *hidden)
{
    char err[512];
    model_seq_t q = {.kv = s, .n_new = n_new};
    model_batch_t b = {.n_seqs = 1, .seqs = &q, .all_logits = all, .hidden_out = hidden};
    if (model_forward(s_env.m, &b, logits, err, sizeof err) < 0)
        fail_msg("%s", err);
}

static void test_prefix_reuse(void **state)
{
    (void)state;
    s_need_model();
    const int V = s_env.cfg.vocab_size;
    int32_t ids[MAX_CTX];
    int n = s_encode("And it came to pass, when the king heard these words, that he rent his clothes, and put "
                     "sackcloth upon his flesh, and fasted, and lay in sackcloth, and went softly.", ids);
    assert_true(n > 40);
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    kvseq_t *s1 = kvseq_new(s_env.pool, MAX_CTX, 0), *s2 = kvseq_new(s_env.pool, MAX_CTX, 0);
    assert_int_equal(kvseq_append(s1, ids, n), 0);
    s_step(s1, n, 0, a, NULL);
    kvseq_publish(s1);
    const int reused = kvseq_match_prefix(s2, ids, n);
    assert_true(reused >= 32);
    assert_int_equal(kvseq_append(s2, ids + reused, n - reused), 0);
    s_step(s2, n - reused, 0, b, NULL);
    if (memcmp(a, b, (size_t)V * sizeof(float)) != 0)
        fail_msg("logits after adopting %d cached tokens differ from computing all %d", reused, n);
    print_message("prefix reuse: %d of %d tokens adopted from the compressed cache, logits bit-identical\n", reused, n);
    kvseq_destroy(&s1);
    kvseq_destroy(&s2);
    free(a);
    free(b);
}

/* Plain greedy decoding; with mtp, the proposer is fed each step and its 1-draft guess compared. */
static double s_greedy(const int32_t *prompt, int np, int32_t *out, spec_proposer_t *mtp, int *agree, int *guesses)
{
    const int V = s_env.cfg.vocab_size, H = s_env.cfg.hidden_size;
    float *lg = malloc((size_t)V * sizeof(float)), *hid = malloc((size_t)MAX_CTX * H * sizeof(float));
    int32_t all[MAX_CTX];
    memcpy(all, prompt, (size_t)np * sizeof(int32_t));
    kvseq_t *s = kvseq_new(s_env.pool, MAX_CTX, 0);
    int n = np, pending = -1;
    char err[512];
    const int64_t t0 = now_ns();
    assert_int_equal(kvseq_append(s, all, n), 0);
    s_step(s, n, 0, lg, mtp ? hid : NULL);
    int fed_from = 0, fed_n = n;
    for (int i = 0; i < N_NEW; i++) {
        all[n] = s_argmax(lg, V);
        out[i] = all[n];
        if (pending >= 0) {
            (*guesses)++;
            *agree += pending == all[n];
        }
        n++;
        if (mtp) {
            if (spec_mtp_feed(mtp, 7, all, n, fed_from, fed_n, hid, err, sizeof err) < 0)
                fail_msg("%s", err);
            int32_t d;
            pending = spec_propose(mtp, 7, all, n, 1, &d, NULL) == 1 ? d : -1;
        }
        assert_int_equal(kvseq_append(s, &all[n - 1], 1), 0);
        s_step(s, 1, 0, lg, mtp ? hid : NULL);
        fed_from = n - 1;
        fed_n = 1;
    }
    const double secs = (now_ns() - t0) / 1e9;
    if (mtp)
        spec_forget(mtp, 7);
    kvseq_destroy(&s);
    free(lg);
    free(hid);
    return secs;
}

static void test_mtp_agreement(void **state)
{
    (void)state;
    s_need_model();
    char err[512];
    assert_true(model_has_mtp(s_env.m));
    /* The MTP layer's device bytes (the KV pool's sizing takes them off): its stored tensors, at
     * least its two [V][H] matrices (embedding and head) and eh_proj [H][2H] in bf16. */
    const size_t V = (size_t)s_env.cfg.vocab_size, H = (size_t)s_env.cfg.hidden_size;
    const size_t mtp_bytes = model_mtp_weight_bytes(s_env.m);
    assert_true(mtp_bytes >= 2 * (2 * V * H + 2 * H * H));
    assert_true(mtp_bytes < model_weight_bytes(s_env.m));   /* one layer and its head, not the model */
    const tensor_view_t *head = ckpt_get(s_env.ck, "model.layers.4.shared_head.head.weight");
    assert_non_null(head);
    assert_true(mtp_bytes > head->nbytes);
    spec_proposer_t *mtp = spec_mtp_new(s_env.m, 2, MAX_CTX, err, sizeof err);
    if (!mtp)
        fail_msg("%s", err);
    int agree = 0, guesses = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        int32_t ids[64], out[N_NEW], ref[N_NEW];
        const int np = s_encode(s_prompts[p], ids);
        s_greedy(ids, np, ref, NULL, NULL, NULL);
        s_greedy(ids, np, out, mtp, &agree, &guesses);
        assert_memory_equal(out, ref, sizeof out);      /* feeding the proposer changes nothing */
    }
    const double rate = (double)agree / guesses;
    print_message("kjv-deepseek MTP: the guess of the token after next equals the target's greedy token %d of %d "
                  "times (%.1f%%)\n", agree, guesses, 100 * rate);
    assert_true(rate > 0.5);
    spec_proposer_destroy(&mtp);
}

/* Greedy speculative decoding with k MTP drafts per verify step; the output must equal ref. late:
 * the prompt's hidden states are not fed (the MTP sequence begins at the first decode step); gap_at
 * > 0: the hidden states of the verify step that emits output token gap_at onwards are not fed
 * (a gap), *begun_at gets the position the sequence then begins again at (-1: no gap made). */
static void s_speculate_at(const int32_t *prompt, int np, int k, spec_proposer_t *mtp, const int32_t *ref,
                           spec_stats_t *st, double *secs, int late, int gap_at, int *begun_at)
{
    const int V = s_env.cfg.vocab_size, H = s_env.cfg.hidden_size;
    float *lg = malloc((size_t)(SPEC_MAX_K + 1) * V * sizeof(float)),
          *hid = malloc((size_t)MAX_CTX * H * sizeof(float));
    int32_t all[MAX_CTX + SPEC_MAX_K + 1];
    char err[512];
    memcpy(all, prompt, (size_t)np * sizeof(int32_t));
    kvseq_t *s = kvseq_new(s_env.pool, MAX_CTX + SPEC_MAX_K + 1, 0);
    int n = np, out = 0;
    const int64_t t0 = now_ns();
    assert_int_equal(kvseq_append(s, all, n), 0);
    s_step(s, n, 0, lg, hid);
    if (!late && spec_mtp_feed(mtp, 9, all, n, 0, n, hid, err, sizeof err) < 0)
        fail_msg("%s", err);
    all[n++] = s_argmax(lg, V);
    out++;
    int gapped = 0;
    if (begun_at)
        *begun_at = -1;
    while (out < N_NEW) {
        int32_t d[SPEC_MAX_K];
        int r = spec_propose(mtp, 9, all, n, k < N_NEW - out ? k : N_NEW - out, d, NULL);
        /* Verify: the last token and the r drafts, logits of every row. */
        memcpy(all + n, d, (size_t)r * sizeof(int32_t));
        assert_int_equal(kvseq_append(s, all + n - 1, 1 + r), 0);
        s_step(s, 1 + r, 1, lg, hid);
        int a = 0;
        while (a < r && s_argmax(lg + (size_t)a * V, V) == d[a])
            a++;
        const int32_t bonus = s_argmax(lg + (size_t)a * V, V);
        assert_int_equal(kvseq_truncate(s, n + a), 0);  /* rejected drafts' KV rolled back */
        all[n + a] = bonus;
        const int pos0 = n - 1;
        n += a + 1;
        out += a + 1;
        if (late && pos0 == np) {        /* the first step after the prompt: nothing fed yet, no drafts */
            assert_int_equal(r, 0);
            assert_int_equal(spec_mtp_base(mtp, 9), -1);
        }
        if (gap_at > 0 && !gapped && out > gap_at) {
            gapped = 1;                  /* this step's hidden states never reach the proposer */
        } else {
            if (spec_mtp_feed(mtp, 9, all, n, pos0, a + 1, hid, err, sizeof err) < 0)
                fail_msg("%s", err);
            if (late && !gapped)         /* it begins at the first position fed */
                assert_int_equal(spec_mtp_base(mtp, 9), np);
            if (gapped == 1) {
                gapped = 2;
                *begun_at = spec_mtp_base(mtp, 9);
                assert_int_equal(*begun_at, pos0);
            }
        }

        if (r > 0) {
            st->verify_steps++;
            st->drafts += (uint64_t)r;
            st->accepted += (uint64_t)a;
            st->emitted += (uint64_t)a + 1;
        }
    }
    *secs += (now_ns() - t0) / 1e9;
    for (int i = 0; i < N_NEW; i++)
        if (all[np + i] != ref[i])
            fail_msg("k=%d: token %d is %d, plain greedy gives %d", k, i, all[np + i], ref[i]);
    spec_forget(mtp, 9);
    kvseq_destroy(&s);
    free(lg);
    free(hid);
}

static void s_speculate(const int32_t *prompt, int np, int k, spec_proposer_t *mtp, const int32_t *ref,
                        spec_stats_t *st, double *secs)
{
    s_speculate_at(prompt, np, k, mtp, ref, st, secs, 0, 0, NULL);
}

static void test_mtp_speculation(void **state)
{
    (void)state;
    s_need_model();
    char err[512];
    spec_proposer_t *mtp = spec_mtp_new(s_env.m, 2, MAX_CTX + SPEC_MAX_K, err, sizeof err);
    if (!mtp)
        fail_msg("%s", err);
    int32_t ids[N_PROMPTS][64], ref[N_PROMPTS][N_NEW];
    int np[N_PROMPTS];
    double plain = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        np[p] = s_encode(s_prompts[p], ids[p]);
        plain += s_greedy(ids[p], np[p], ref[p], NULL, NULL, NULL);
    }
    print_message("kjv-deepseek plain greedy (CPU, %d prompts x %d tokens): %.1f tokens/s\n", N_PROMPTS, N_NEW,
                  N_PROMPTS * N_NEW / plain);
    for (int k = 1; k <= 3; k += 2) {
        spec_stats_t st = {0};
        double secs = 0;
        for (int p = 0; p < N_PROMPTS; p++)
            s_speculate(ids[p], np[p], k, mtp, ref[p], &st, &secs);
        print_message("kjv-deepseek MTP speculation k=%d: acceptance %.1f%%, %.2f tokens per verify step, %.1f "
                      "tokens/s, greedy output equal\n", k, 100 * spec_stats_acceptance(&st), spec_stats_mean_len(&st),
                      N_PROMPTS * N_NEW / secs);
        if (k == 1)
            assert_true(spec_stats_acceptance(&st) > 0.5);
    }
    spec_proposer_destroy(&mtp);
}

static void test_mtp_late_start(void **state)
{
    (void)state;
    s_need_model();
    char err[512];
    spec_proposer_t *mtp = spec_mtp_new(s_env.m, 2, MAX_CTX + SPEC_MAX_K, err, sizeof err);
    if (!mtp)
        fail_msg("%s", err);
    int32_t ids[64], ref[N_NEW];
    spec_stats_t full = {0}, late = {0}, gap = {0};
    double secs = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        const int np = s_encode(s_prompts[p], ids);
        s_greedy(ids, np, ref, NULL, NULL, NULL);
        s_speculate_at(ids, np, 2, mtp, ref, &full, &secs, 0, 0, NULL);
        s_speculate_at(ids, np, 2, mtp, ref, &late, &secs, 1, 0, NULL);
        int begun = -1;
        s_speculate_at(ids, np, 2, mtp, ref, &gap, &secs, 1, N_NEW / 2, &begun);
        assert_true(begun > np);
    }
    spec_mtp_stats_t ms;
    spec_mtp_stats(mtp, &ms);
    print_message("kjv-deepseek MTP k=2, output equal to plain greedy each time: prompt fed %.1f%% accepted "
                  "(%.2f tokens per verify step); begun at the first generated token %.1f%% (%.2f); with a gap "
                  "half-way %.1f%% (%.2f); %llu sequences begun, %llu past position 0\n",
                  100 * spec_stats_acceptance(&full), spec_stats_mean_len(&full), 100 * spec_stats_acceptance(&late),
                  spec_stats_mean_len(&late), 100 * spec_stats_acceptance(&gap), spec_stats_mean_len(&gap),
                  (unsigned long long)ms.starts, (unsigned long long)ms.started_late);
    assert_true(late.accepted > 0 && gap.accepted > 0);
    assert_int_equal(ms.starts, 4 * N_PROMPTS);         /* full, late, and the gap's two beginnings */
    assert_int_equal(ms.started_late, 3 * N_PROMPTS);
    /* Rows of tokens not known yet are refused, not read past the tokens. */
    float *h = calloc((size_t)s_env.cfg.hidden_size, sizeof(float));
    assert_int_equal(spec_mtp_feed(mtp, 11, ids, 3, 3, 1, h, err, sizeof err), -1);
    /* Every slot taken (2): a third sequence takes the place of the one fed longest ago. Each feed
     * is one row whose next token is not known yet, so it only waits (no MTP forward). */
    assert_int_equal(spec_mtp_feed(mtp, 21, ids, 3, 2, 1, h, err, sizeof err), 0);
    assert_int_equal(spec_mtp_feed(mtp, 22, ids, 3, 2, 1, h, err, sizeof err), 0);
    assert_int_equal(spec_mtp_feed(mtp, 21, ids, 3, 2, 1, h, err, sizeof err), 0);   /* 22 is now the oldest */
    assert_int_equal(spec_mtp_feed(mtp, 23, ids, 3, 2, 1, h, err, sizeof err), 0);
    spec_mtp_stats(mtp, &ms);
    assert_int_equal(ms.evicted, 1);
    assert_int_equal(spec_mtp_base(mtp, 22), -1);
    assert_int_equal(spec_mtp_base(mtp, 21), 2);
    assert_int_equal(spec_mtp_base(mtp, 23), 2);
    free(h);
    spec_proposer_destroy(&mtp);
}

static void test_mtp_batched(void **state)
{
    (void)state;
    s_need_model();
    enum { NS = 2, K = 3 };
    const int V = s_env.cfg.vocab_size, H = s_env.cfg.hidden_size;
    char err[512];
    spec_proposer_t *pb = spec_mtp_new(s_env.m, 4, MAX_CTX + SPEC_MAX_K, err, sizeof err),
                    *p1 = spec_mtp_new(s_env.m, 4, MAX_CTX + SPEC_MAX_K, err, sizeof err),
                    *pp = spec_mtp_new(s_env.m, 4, MAX_CTX + SPEC_MAX_K, err, sizeof err);
    if (!pb || !p1 || !pp)
        fail_msg("%s", err);
    spec_mtp_pad(pp, 1);   /* pb as the CPU runs it, pp padded as a backend with graphs runs it */
    int32_t all[NS][MAX_CTX + SPEC_MAX_K + 1], ref[NS][N_NEW];
    int n[NS], np[NS], out[NS];
    kvseq_t *kv[NS];
    float *hid[NS], *lg = malloc((size_t)(K + 1) * V * sizeof(float));
    for (int q = 0; q < NS; q++) {
        np[q] = n[q] = s_encode(s_prompts[q], all[q]);
        s_greedy(all[q], np[q], ref[q], NULL, NULL, NULL);
        kv[q] = kvseq_new(s_env.pool, MAX_CTX + SPEC_MAX_K + 1, 0);
        hid[q] = malloc((size_t)MAX_CTX * H * sizeof(float));
        assert_int_equal(kvseq_append(kv[q], all[q], n[q]), 0);
        s_step(kv[q], n[q], 0, lg, hid[q]);
        all[q][n[q]++] = s_argmax(lg, V);
        out[q] = 1;
    }
    spec_mtp_feed_t feeds[NS];
    for (int q = 0; q < NS; q++) {
        feeds[q] = (spec_mtp_feed_t){.id = 40 + q, .tokens = all[q], .n_tokens = n[q], .pos0 = 0, .n = np[q],
                                     .hidden = hid[q]};
        if (spec_mtp_feed(p1, 40 + q, all[q], n[q], 0, np[q], hid[q], err, sizeof err) < 0)
            fail_msg("%s", err);
    }
    if (spec_mtp_feed_batch(pb, feeds, NS, err, sizeof err) < 0 || spec_mtp_feed_batch(pp, feeds, NS, err, sizeof err) < 0)
        fail_msg("%s", err);
    int steps = 0, stopped = 0;
    while (out[0] < N_NEW || out[1] < N_NEW) {
        int32_t d[NS][SPEC_MAX_K], d1[SPEC_MAX_K], dp[NS][SPEC_MAX_K];
        float pr[NS][SPEC_MAX_K], pr1[SPEC_MAX_K], pp_pr[NS][SPEC_MAX_K];
        spec_ask_t asks[NS];
        int na = 0, row_of[NS];
        for (int q = 0; q < NS; q++)
            if (out[q] < N_NEW) {
                row_of[na] = q;
                asks[na++] = (spec_ask_t){.id = 40 + q, .tokens = all[q], .n = n[q],
                                          .k = K < N_NEW - out[q] ? K : N_NEW - out[q], .drafts = d[q], .probs = pr[q]};
            }
        /* A high stop_below first: no side effects, the drafts end where the confidence falls. */
        spec_ask_t cut[NS];
        int32_t dc[NS][SPEC_MAX_K];
        float pc[NS][SPEC_MAX_K];
        for (int a = 0; a < na; a++) {
            cut[a] = asks[a];
            cut[a].drafts = dc[a];
            cut[a].probs = pc[a];
            cut[a].stop_below = 0.9f;
        }
        assert_int_equal(spec_propose_batch(pb, cut, na), 0);
        assert_int_equal(spec_propose_batch(pb, asks, na), 0);
        spec_ask_t pad_asks[NS];
        for (int a = 0; a < na; a++) {
            pad_asks[a] = asks[a];
            pad_asks[a].drafts = dp[a];
            pad_asks[a].probs = pp_pr[a];
        }
        assert_int_equal(spec_propose_batch(pp, pad_asks, na), 0);
        for (int a = 0; a < na; a++) {
            assert_int_equal(pad_asks[a].n_drafts, asks[a].n_drafts);
            assert_memory_equal(dp[a], d[row_of[a]], (size_t)asks[a].n_drafts * sizeof(int32_t));
        }
        for (int a = 0; a < na; a++) {
            const int q = row_of[a];
            const int r1 = spec_propose(p1, 40 + q, all[q], n[q], asks[a].k, d1, pr1);
            assert_int_equal(asks[a].n_drafts, r1);
            assert_memory_equal(d[q], d1, (size_t)r1 * sizeof(int32_t));
            double cum = 1;
            for (int i = 0; i < cut[a].n_drafts; i++) {
                assert_int_equal(dc[a][i], d[q][i]);
                assert_true(i == 0 || cum >= 0.9);       /* drafted only while the product so far was high */
                cum *= pc[a][i];
            }
            stopped += cut[a].n_drafts < asks[a].n_drafts;
        }
        /* Verify each row, then feed the kept rows: together to pb, one by one to p1. */
        for (int a = 0; a < na; a++) {
            const int q = row_of[a], r = asks[a].n_drafts;
            memcpy(all[q] + n[q], d[q], (size_t)r * sizeof(int32_t));
            assert_int_equal(kvseq_append(kv[q], all[q] + n[q] - 1, 1 + r), 0);
            s_step(kv[q], 1 + r, 1, lg, hid[q]);
            int acc = 0;
            while (acc < r && s_argmax(lg + (size_t)acc * V, V) == d[q][acc])
                acc++;
            all[q][n[q] + acc] = s_argmax(lg + (size_t)acc * V, V);
            assert_int_equal(kvseq_truncate(kv[q], n[q] + acc), 0);
            feeds[a] = (spec_mtp_feed_t){.id = 40 + q, .tokens = all[q], .n_tokens = n[q] + acc + 1, .pos0 = n[q] - 1,
                                         .n = acc + 1, .hidden = hid[q]};
            if (spec_mtp_feed(p1, 40 + q, all[q], n[q] + acc + 1, n[q] - 1, acc + 1, hid[q], err, sizeof err) < 0)
                fail_msg("%s", err);
            n[q] += acc + 1;
            out[q] += acc + 1;
        }
        if (spec_mtp_feed_batch(pb, feeds, na, err, sizeof err) < 0 || spec_mtp_feed_batch(pp, feeds, na, err, sizeof err) < 0)
            fail_msg("%s", err);
        steps++;
    }
    for (int q = 0; q < NS; q++) {
        assert_memory_equal(all[q] + np[q], ref[q], sizeof ref[q]);
        kvseq_destroy(&kv[q]);
        free(hid[q]);
    }
    spec_mtp_stats_t sb, s1, sp;
    spec_mtp_stats(pb, &sb);
    spec_mtp_stats(p1, &s1);
    spec_mtp_stats(pp, &sp);
    print_message("padded: %llu of %llu MTP forwards padded to equal rows, drafts equal\n",
                  (unsigned long long)sp.padded, (unsigned long long)sp.forwards);
    assert_true(sp.padded > 0 && sb.padded == 0);
    assert_int_equal(sp.rows, sb.rows);
    print_message("kjv-deepseek MTP batched, 2 sequences, k=%d: %d steps, drafts equal to one-sequence proposals; "
                  "MTP forwards %llu batched against %llu one by one; stop_below 0.9 cut %d proposals short\n", K,
                  steps, (unsigned long long)sb.forwards, (unsigned long long)s1.forwards, stopped);
    assert_true(sb.forwards < s1.forwards);
    assert_true(stopped > 0);
    free(lg);
    spec_proposer_destroy(&pb);
    spec_proposer_destroy(&p1);
    spec_proposer_destroy(&pp);
}

/* The CPU's mtp_top (kernels/backend.h): the argmax op's id (the lowest index on ties, NaN never),
 * the probability within 1e-6 relative of 1 / sum exp(x - max) in double, NaN entries skipped, an all-NaN
 * row id 0 and probability 0. */
static void test_mtp_top(void **state)
{
    (void)state;
    enum { M = 4, N = 1000 };
    float *x = malloc((size_t)M * N * sizeof(float)), p[M];
    int32_t ids[M], want[M];
    assert_non_null(x);
    uint64_t r = 3;
    for (int i = 0; i < M * N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int)(r >> 40) % 3000 - 1500) / 150.0f;
    }
    x[17] = NAN;
    x[1 * N + 5] = x[1 * N + 900] = 20.0f;              /* a tie: the lower index */
    for (int j = 0; j < N; j++)
        x[3 * N + j] = NAN;
    s_env.be->ops->mtp_top(s_env.be, x, M, N, ids, p);
    s_env.be->ops->argmax(s_env.be, x, M, N, want);
    for (int m = 0; m < M; m++)
        assert_int_equal(ids[m], want[m]);
    assert_int_equal(ids[1], 5);
    for (int m = 0; m < 3; m++) {
        double sum = 0;
        for (int j = 0; j < N; j++)
            if (x[(size_t)m * N + j] == x[(size_t)m * N + j])
                sum += exp((double)x[(size_t)m * N + j] - x[(size_t)m * N + ids[m]]);
        if (!(fabs(p[m] * sum - 1.0) <= 1e-6))    /* f32 terms summed in double, then rounded */
            fail_msg("row %d: probability %.9g, %.9g in double", m, p[m], 1.0 / sum);
    }
    assert_true(ids[3] == 0 && p[3] == 0.0f);
    free(x);
}

/* 6. Sampled drafts (the header). Temperature 1 on the first prompt, 2 drafts a proposal: every
 * draft's q (spec_dist) sums to 1 and holds the draft with the probability the proposal gave;
 * the first draft's q is the same whatever the seed (a proposal leaves the sequence as it found
 * it), and its draws over the seeds approach it: total variation at 4,000 draws under 0.08 and
 * below that at 250; the same seed draws the same drafts. Fed without `sampled`, the same ask
 * takes the argmax drafts, with no distribution. */
static void test_mtp_sampled_draws(void **state)
{
    (void)state;
    s_need_model();
    const int V = s_env.cfg.vocab_size, H = s_env.cfg.hidden_size;
    enum { K = 2, SMALL = 250, BIG = 4000 };
    char err[512];
    spec_proposer_t *p = spec_mtp_new(s_env.m, 2, MAX_CTX + SPEC_MAX_K, err, sizeof err),
                    *g = spec_mtp_new(s_env.m, 2, MAX_CTX + SPEC_MAX_K, err, sizeof err);
    if (!p || !g)
        fail_msg("%s", err);
    int32_t all[MAX_CTX + SPEC_MAX_K + 1];
    const int np = s_encode(s_prompts[0], all);
    int n = np;
    kvseq_t *kv = kvseq_new(s_env.pool, MAX_CTX, 0);
    float *hid = malloc((size_t)MAX_CTX * H * sizeof(float)), *lg = malloc((size_t)V * sizeof(float)),
          *q0 = malloc((size_t)V * sizeof(float));
    double *seen = calloc((size_t)V, sizeof(double));
    assert_non_null(kv);
    assert_non_null(hid);
    assert_non_null(lg);
    assert_non_null(q0);
    assert_non_null(seen);
    assert_int_equal(kvseq_append(kv, all, n), 0);
    s_step(kv, n, 0, lg, hid);
    all[n++] = s_argmax(lg, V);
    spec_mtp_feed_t f = {.id = 50, .tokens = all, .n_tokens = n, .pos0 = 0, .n = np, .hidden = hid, .sampled = 1};
    if (spec_mtp_feed_batch(p, &f, 1, err, sizeof err) < 0)
        fail_msg("%s", err);
    f.sampled = 0;
    if (spec_mtp_feed_batch(g, &f, 1, err, sizeof err) < 0)
        fail_msg("%s", err);
    bk_sample_t sp = {.temperature = 1.0, .top_p = 1.0, .step = 5};
    double tv_small = -1;
    int32_t first[K] = {0};
    for (int seed = 1; seed <= BIG; seed++) {
        sp.seed = (uint64_t)seed;
        int32_t d[K];
        float pr[K];
        spec_ask_t a = {.id = 50, .tokens = all, .n = n, .k = K, .sample = &sp, .drafts = d, .probs = pr};
        spec_propose_batch(p, &a, 1);
        assert_int_equal(a.n_drafts, K);
        spec_check_dists(p, 50, d, pr, a.n_drafts, (size_t)V);
        const float *q = spec_dist(p, 50, 0);
        if (seed == 1) {
            memcpy(q0, q, (size_t)V * sizeof(float));
            memcpy(first, d, sizeof first);
        } else if (memcmp(q0, q, (size_t)V * sizeof(float)) != 0) {
            fail_msg("seed %d: the first draft's distribution moved", seed);
        }
        seen[d[0]] += 1;
        if (seed == SMALL || seed == BIG) {
            double tv = 0;
            for (int t = 0; t < V; t++)
                tv += fabs(seen[t] / seed - q0[t]);
            tv /= 2;
            print_message("sampled MTP drafts: total variation %.4f of the first draft's frequencies after %d draws\n",
                          tv, seed);
            if (seed == SMALL)
                tv_small = tv;
            else
                assert_true(tv < 0.08 && tv < tv_small);
        }
    }
    sp.seed = 1;   /* the same seed: the same drafts */
    int32_t d[K];
    spec_ask_t a = {.id = 50, .tokens = all, .n = n, .k = K, .sample = &sp, .drafts = d};
    spec_propose_batch(p, &a, 1);
    assert_memory_equal(d, first, sizeof first);
    /* fed as a greedy request's: the argmax drafts, whatever the ask, and no distribution */
    int32_t dg[K], dref[K];
    spec_ask_t ag = {.id = 50, .tokens = all, .n = n, .k = K, .sample = &sp, .drafts = dg},
               aref = {.id = 50, .tokens = all, .n = n, .k = K, .drafts = dref};
    spec_propose_batch(g, &ag, 1);
    assert_null(spec_dist(g, 50, 0));
    spec_propose_batch(g, &aref, 1);
    assert_int_equal(ag.n_drafts, aref.n_drafts);
    assert_memory_equal(dg, dref, (size_t)aref.n_drafts * sizeof(int32_t));
    kvseq_destroy(&kv);
    free(hid);
    free(lg);
    free(q0);
    free(seen);
    spec_proposer_destroy(&p);
    spec_proposer_destroy(&g);
}

/* 7. Two sampled sequences fed in one MTP forward: their logits come to the host in one copy
 * (spec_mtp_stats' logits_copies: 1, where it was a copy a sequence), each into its own sequence:
 * each one's first-draft distribution is the one it gets fed alone. */
static void test_mtp_sampled_batch_copy(void **state)
{
    (void)state;
    s_need_model();
    const int V = s_env.cfg.vocab_size, H = s_env.cfg.hidden_size;
    char err[512];
    spec_proposer_t *both = spec_mtp_new(s_env.m, 2, MAX_CTX + SPEC_MAX_K, err, sizeof err),
                    *alone = spec_mtp_new(s_env.m, 2, MAX_CTX + SPEC_MAX_K, err, sizeof err);
    if (!both || !alone)
        fail_msg("%s", err);
    int32_t all[2][MAX_CTX + SPEC_MAX_K + 1];
    int n[2];
    float *hid[2], *lg = malloc((size_t)V * sizeof(float)), *q = malloc((size_t)V * sizeof(float));
    kvseq_t *kv[2];
    spec_mtp_feed_t f[2];
    assert_non_null(lg);
    assert_non_null(q);
    for (int i = 0; i < 2; i++) {
        const int np = s_encode(s_prompts[i], all[i]);
        n[i] = np;
        kv[i] = kvseq_new(s_env.pool, MAX_CTX, 0);
        hid[i] = malloc((size_t)MAX_CTX * H * sizeof(float));
        assert_non_null(kv[i]);
        assert_non_null(hid[i]);
        assert_int_equal(kvseq_append(kv[i], all[i], np), 0);
        s_step(kv[i], np, 0, lg, hid[i]);
        all[i][n[i]++] = s_argmax(lg, V);
        f[i] = (spec_mtp_feed_t){.id = 60 + (uint64_t)i, .tokens = all[i], .n_tokens = n[i], .pos0 = 0, .n = np,
                                 .hidden = hid[i], .sampled = 1};
    }
    if (spec_mtp_feed_batch(both, f, 2, err, sizeof err) < 0)
        fail_msg("%s", err);
    spec_mtp_stats_t st;
    spec_mtp_stats(both, &st);
    assert_int_equal((int)st.logits_copies, 1);
    bk_sample_t sp = {.temperature = 1.0, .top_p = 1.0, .step = 5, .seed = 3};
    for (int i = 0; i < 2; i++) {
        int32_t d[2];
        spec_ask_t a = {.id = 60 + (uint64_t)i, .tokens = all[i], .n = n[i], .k = 1, .sample = &sp, .drafts = d};
        spec_propose_batch(both, &a, 1);
        assert_int_equal(a.n_drafts, 1);
        const float *qb = spec_dist(both, 60 + (uint64_t)i, 0);
        assert_non_null(qb);
        memcpy(q, qb, (size_t)V * sizeof(float));
        if (spec_mtp_feed_batch(alone, &f[i], 1, err, sizeof err) < 0)
            fail_msg("%s", err);
        spec_ask_t b = {.id = 60 + (uint64_t)i, .tokens = all[i], .n = n[i], .k = 1, .sample = &sp, .drafts = d};
        spec_propose_batch(alone, &b, 1);
        const float *qa = spec_dist(alone, 60 + (uint64_t)i, 0);
        assert_non_null(qa);
        double worst = 0;
        for (int t = 0; t < V; t++)
            worst = fmax(worst, fabs((double)q[t] - qa[t]));
        if (worst > 1e-5)
            fail_msg("sequence %d: its distribution fed with another differs from fed alone by %g", i, worst);
    }
    for (int i = 0; i < 2; i++) {
        kvseq_destroy(&kv[i]);
        free(hid[i]);
    }
    free(lg);
    free(q);
    spec_proposer_destroy(&both);
    spec_proposer_destroy(&alone);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mtp_top),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_mtp_agreement),
        cmocka_unit_test(test_mtp_speculation),
        cmocka_unit_test(test_mtp_late_start),
        cmocka_unit_test(test_mtp_batched),
        cmocka_unit_test(test_mtp_sampled_draws),
        cmocka_unit_test(test_mtp_sampled_batch_copy),
    };
    const char *only = getenv("TEST_FILTER");   /* e.g. TEST_FILTER=test_mtp_agreement */
    if (only && *only)
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
