/* tests/unit/test_router_skew.c — realistic routing for dummy MoE weights (engine/router_skew.h):
 *   - specs: uniform, zipf:S, table:FILE parse; bad ones fail naming the spec, the file and line;
 *   - targets: shares sum to 1, none above 1/k, a table of the model's expert count keeps its ids,
 *     a stretched one keeps its busiest/average ratio, zipf's hot expert moves between layers;
 *   - the fit: top-k of fresh normal logits plus the bias picks each expert as often as the target;
 *   - end to end on the CPU: a dummy Qwen3-MoE shape (32 experts, top-4) prefilling random tokens
 *     routes, per layer, with the busiest/average expert load of the target (within 20%), its
 *     busiest expert within 20% of its share and the whole distribution within 0.08 in total
 *     variation; zipf:0 routes much closer to even than no bias (which is printed: random routers
 *     are not even); a real checkpoint refuses a skew, naming it. */
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
#include "engine/router_skew.h"

#define KJV_TABLE "tests/fixtures/expert-load/kjv-moe-valid.txt"

static char s_tmp[256];

static int s_setup(void **state)
{
    snprintf(s_tmp, sizeof s_tmp, "/tmp/test_router_skew.XXXXXX");
    return mkdtemp(s_tmp) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *s_file(const char *name, const char *text)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", s_tmp, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static void s_parse_fails(const char *spec, const char *want1, const char *want2)
{
    router_skew_t s;
    char err[512] = "";
    assert_int_equal(router_skew_parse(spec, &s, err, sizeof err), -1);
    if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
        fail_msg("'%s': error '%s' should name '%s' and '%s'", spec, err, want1, want2 ? want2 : "");
    assert_null(s.table);
}

static void test_parse(void **state)
{
    router_skew_t s;
    char err[512];
    assert_int_equal(router_skew_parse(NULL, &s, err, sizeof err), 0);
    assert_int_equal(s.kind, ROUTER_SKEW_UNIFORM);
    assert_int_equal(router_skew_parse("uniform", &s, err, sizeof err), 0);
    assert_int_equal(s.kind, ROUTER_SKEW_UNIFORM);
    assert_int_equal(router_skew_parse("zipf:1.25", &s, err, sizeof err), 0);
    assert_int_equal(s.kind, ROUTER_SKEW_ZIPF);
    assert_true(fabs(s.exponent - 1.25) < 1e-12);
    assert_string_equal(s.name, "zipf:1.25");
    assert_int_equal(router_skew_parse("table:" KJV_TABLE, &s, err, sizeof err), 0);
    assert_int_equal(s.kind, ROUTER_SKEW_TABLE);
    assert_int_equal(s.n_layers, 4);
    assert_int_equal(s.n_experts, 16);
    assert_true(s.table[0] == 17439 && s.table[3 * 16 + 6] == 35880);   /* layer 0 expert 0, layer 3 expert 6 */
    router_skew_free(&s);
    assert_null(s.table);

    s_parse_fails("zipf:-1", "zipf:-1", "[0, 8]");
    s_parse_fails("zipf:9", "zipf:9", "[0, 8]");
    s_parse_fails("zipf:1x", "zipf:1x", NULL);
    s_parse_fails("zipf:", "zipf:", NULL);
    s_parse_fails("pareto:2", "pareto:2", "zipf:S");
    s_parse_fails("table:", "table:", "zipf:S");
    s_parse_fails("table:/nonexistent/t.txt", "/nonexistent/t.txt", NULL);
    char spec[600];
    snprintf(spec, sizeof spec, "table:%s", s_file("empty.txt", "# nothing\nlayer 0 placement | 1,2\n"));
    s_parse_fails(spec, "empty.txt", "no 'layer L tokens");
    snprintf(spec, sizeof spec, "table:%s", s_file("ragged.txt", "layer 0 tokens 1 2 3\nlayer 1 tokens 1 2\n"));
    s_parse_fails(spec, "ragged.txt:2", "layer 1 has 2 counts");
    snprintf(spec, sizeof spec, "table:%s", s_file("neg.txt", "layer 0 tokens 1 -2 3\n"));
    s_parse_fails(spec, "neg.txt:1", "count 1");
    snprintf(spec, sizeof spec, "table:%s", s_file("order.txt", "layer 1 tokens 1 2 3\n"));
    s_parse_fails(spec, "order.txt:1", "layer 0 was expected");
    snprintf(spec, sizeof spec, "table:%s", s_file("zero.txt", "layer 0 tokens 0 0 0\n"));
    s_parse_fails(spec, "zero.txt:1", "positive sum");
}

static double s_sum(const double *v, int n)
{
    double t = 0;
    for (int i = 0; i < n; i++)
        t += v[i];
    return t;
}

static int s_argmax(const double *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        b = v[i] > v[b] ? i : b;
    return b;
}

static void test_targets(void **state)
{
    router_skew_t s;
    char err[512];
    double share[128];
    /* zipf:1 over 32 experts top-4 is 7.88 uncapped: under the cap (8 x 0.995) it stays. */
    assert_int_equal(router_skew_parse("zipf:1", &s, err, sizeof err), 0);
    assert_int_equal(router_skew_target(&s, 0, 4, 32, 4, share, err, sizeof err), 0);
    assert_true(fabs(s_sum(share, 32) - 1) < 1e-9);
    double h = 0;
    for (int r = 1; r <= 32; r++)
        h += 1.0 / r;
    assert_true(fabs(router_skew_busiest_over_avg(share, 32) - 32 / h) < 1e-9);
    const int hot0 = s_argmax(share, 32);
    assert_int_equal(router_skew_target(&s, 1, 4, 32, 4, share, err, sizeof err), 0);
    assert_int_not_equal(s_argmax(share, 32), hot0);   /* a shuffle per layer */
    /* 128 experts top-8: zipf:1 would give the busiest 23.6 x the average, more than every token;
     * capped just under 1/k and the rest spread, still summing to 1. */
    assert_int_equal(router_skew_target(&s, 0, 48, 128, 8, share, err, sizeof err), 0);
    assert_true(fabs(s_sum(share, 128) - 1) < 1e-9);
    for (int e = 0; e < 128; e++)
        assert_true(share[e] <= 0.995 / 8 + 1e-12);
    assert_true(router_skew_busiest_over_avg(share, 128) > 15.8);
    assert_int_equal(router_skew_target(&s, 0, 4, 8, 8, share, err, sizeof err), -1);   /* k = E: nothing to skew */
    assert_non_null(strstr(err, "zipf:1"));

    /* The kjv table on its own shape keeps each expert's id and share; stretched onto 128 experts
     * (and 48 layers) it keeps each layer's busiest/average. */
    assert_int_equal(router_skew_parse("table:" KJV_TABLE, &s, err, sizeof err), 0);
    const double kjv_busiest[4] = {2.93, 3.79, 3.12, 6.03};   /* the file's expert_busiest_over_avg lines */
    for (int l = 0; l < 4; l++) {
        assert_int_equal(router_skew_target(&s, l, 4, 16, 2, share, err, sizeof err), 0);
        const int hot = s_argmax(s.table + l * 16, 16);
        assert_int_equal(s_argmax(share, 16), hot);
        assert_true(fabs(share[hot] - s.table[l * 16 + hot] / s_sum(s.table + l * 16, 16)) < 1e-4);
        assert_true(fabs(router_skew_busiest_over_avg(share, 16) - kjv_busiest[l]) < 0.01);
        assert_int_equal(router_skew_target(&s, l * 12, 48, 128, 8, share, err, sizeof err), 0);
        assert_true(fabs(s_sum(share, 128) - 1) < 1e-9);
        assert_true(fabs(router_skew_busiest_over_avg(share, 128) - kjv_busiest[l]) < 0.01);
    }
    router_skew_free(&s);
}

/* The fit against fresh draws (not the fit's own sample): each expert's pick rate within 10% of
 * its target, or 0.002 absolute for the rare ones. */
static void test_fit(void **state)
{
    router_skew_t s;
    char err[512];
    double share[128];
    float bias[128];
    static const struct { const char *spec; int E, k; } cases[] = {
        {"zipf:1", 32, 4}, {"zipf:0.6", 128, 8}, {"table:" KJV_TABLE, 16, 2}, {"table:" KJV_TABLE, 128, 8}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int E = cases[c].E, k = cases[c].k;
        assert_int_equal(router_skew_parse(cases[c].spec, &s, err, sizeof err), 0);
        assert_int_equal(router_skew_target(&s, 3, 4, E, k, share, err, sizeof err), 0);
        const double left = router_skew_fit(share, E, k, bias);
        assert_true(left >= 0);
        long picked[128] = {0};
        const int N = 40000;
        uint64_t x = 12345;
        for (int n = 0; n < N; n++) {
            double v[128];
            for (int e = 0; e < E; e += 2) {          /* Box-Muller with a different generator */
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                const double u1 = ((x >> 11) + 0.5) / 9007199254740992.0;
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                const double u2 = ((x >> 11) + 0.5) / 9007199254740992.0;
                v[e] = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2) + bias[e];
                v[e + 1] = sqrt(-2 * log(u1)) * sin(2 * M_PI * u2) + bias[e + 1];
            }
            for (int j = 0; j < k; j++) {
                const int b = s_argmax(v, E);
                picked[b]++;
                v[b] = -INFINITY;
            }
        }
        for (int e = 0; e < E; e++) {
            const double want = k * share[e], got = (double)picked[e] / N;
            if (fabs(got - want) > 0.1 * want && fabs(got - want) > 0.002)
                fail_msg("%s, %d experts top-%d: expert %d picked by %.4f of tokens, target %.4f", cases[c].spec, E, k,
                         e, got, want);
        }
        router_skew_free(&s);
    }
}

#define VOCAB 512
#define VOCAB_STR "512"

/* A dummy Qwen3-MoE: 2 MoE layers of 32 experts top-4, hidden 128 (small: the fit prefills 49,152 tokens). */
static const char *s_moe_dir(void)
{
    static char d[512];
    snprintf(d, sizeof d, "%s/moe", s_tmp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", d);
    assert_int_equal(system(cmd), 0);
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", d);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"torch_dtype\": \"float32\","
          " \"hidden_size\": 128, \"intermediate_size\": 128, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 2,"
          " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 64, \"num_experts\": 32,"
          " \"num_experts_per_tok\": 4, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
          " \"vocab_size\": " VOCAB_STR ", \"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-06,"
          " \"rope_theta\": 10000.0,"
          " \"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2}\n", f);
    fclose(f);
    return d;
}

#define SEQS 128
#define SEQ_LEN 32
#define BATCH_SEQS 64             /* prompts per forward, here and in the load-time refinement (its
                                     most): the same tokens as one prompt per forward, in 1/64 of
                                     the forwards (each a fixed cost of the CPU backend's threads) */

/* Per-layer shares of routed (token, expert) pairs over SEQS prompts of random ids, BATCH_SEQS per
 * forward; the model's target ratio per layer in target (0 without a skew). */
static void s_measure(const char *skew, double share[2][32], double target[2], char *routing, size_t routing_len)
{
    engine_spec_t s;
    engine_spec_default(&s);
    s.threads = 2;
    s.dummy = 1;
    s.model = (model_opts_t){.max_tokens = BATCH_SEQS * SEQ_LEN, .max_seqs = BATCH_SEQS, .max_context = SEQ_LEN,
                             .router_skew = skew};
    s.kv_blocks = BATCH_SEQS * SEQ_LEN / 16;
    char err[1024];
    engine_t *e = engine_open(s_moe_dir(), &s, NULL, err, sizeof err);
    if (!e)
        fail_msg("engine_open: %s", err);
    snprintf(routing, routing_len, "%s", model_router_skew(e->model));
    uint64_t load[2 * 32] = {0};
    assert_int_equal(model_expert_load(e->model, load, err, sizeof err), 0);   /* restart the count */
    memset(load, 0, sizeof load);
    uint64_t x = 99;
    for (int q0 = 0; q0 < SEQS; q0 += BATCH_SEQS) {
        kvseq_t *seq[BATCH_SEQS];
        model_seq_t ms[BATCH_SEQS];
        for (int j = 0; j < BATCH_SEQS; j++) {
            int32_t ids[SEQ_LEN];
            for (int i = 0; i < SEQ_LEN; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                ids[i] = (int32_t)(x % VOCAB);
            }
            seq[j] = kvseq_new(e->pool, SEQ_LEN, (uint64_t)(q0 + j));
            assert_non_null(seq[j]);
            assert_int_equal(kvseq_append(seq[j], ids, SEQ_LEN), 0);
            ms[j] = (model_seq_t){.kv = seq[j], .n_new = SEQ_LEN};
        }
        model_batch_t b = {.n_seqs = BATCH_SEQS, .seqs = ms};
        if (model_forward(e->model, &b, e->logits, err, sizeof err) < 0)
            fail_msg("forward: %s", err);
        for (int j = 0; j < BATCH_SEQS; j++)
            kvseq_destroy(&seq[j]);
    }
    assert_int_equal(model_expert_load(e->model, load, err, sizeof err), 0);
    for (int l = 0; l < 2; l++) {
        uint64_t sum = 0;
        for (int x2 = 0; x2 < 32; x2++)
            sum += load[l * 32 + x2];
        assert_int_equal(sum, SEQS * SEQ_LEN * 4);   /* top-4: every token routed 4 times */
        for (int x2 = 0; x2 < 32; x2++)
            share[l][x2] = (double)load[l * 32 + x2] / (double)sum;
        target[l] = model_router_skew_target(e->model, l);
    }
    engine_destroy(&e);
}

/* Total variation distance between two distributions over 32 experts. */
static double s_tv(const double *a, const double *b)
{
    double tv = 0;
    for (int e = 0; e < 32; e++)
        tv += fabs(a[e] - b[e]) / 2;
    return tv;
}

/* The tolerances are what the fit achieves, not sampling noise alone: besides the component all
 * random prompts share (which the fit cancels), each prompt has its own (its attention's mean), so
 * the load of SEQS prompts moves by about 5% per expert from one sample to the next. */
static void test_dummy_model_routes_skewed(void **state)
{
    double share[2][32], raw[2][32], target[2], want[32], even[32];
    char routing[200], err[512];
    for (int e = 0; e < 32; e++)
        even[e] = 1.0 / 32;
    /* Random routers as they come are not even: random prompts share a hidden-state component,
     * and each router row's product with it favours some experts (printed for the record). */
    s_measure(NULL, raw, target, routing, sizeof routing);
    assert_string_equal(routing, "uniform-random");
    for (int l = 0; l < 2; l++) {
        print_message("uniform-random (no bias): layer %d busiest/average %.3f, total variation from even %.3f\n", l,
                      router_skew_busiest_over_avg(raw[l], 32), s_tv(raw[l], even));
        assert_true(target[l] == 0);
    }
    /* zipf:0 is an even target, fitted on the model: on every layer a lower busiest/average than no
     * bias, and well under its distance from even. */
    s_measure("zipf:0", share, target, routing, sizeof routing);
    for (int l = 0; l < 2; l++) {
        const double r = router_skew_busiest_over_avg(share[l], 32), tv = s_tv(share[l], even);
        print_message("zipf:0: layer %d busiest/average %.3f, total variation from even %.3f\n", l, r, tv);
        assert_true(fabs(target[l] - 1) < 1e-9);
        assert_true(r < router_skew_busiest_over_avg(raw[l], 32));
        assert_true(tv < 0.6 * s_tv(raw[l], even));
    }
    static const char *const skews[] = {"zipf:1", "table:" KJV_TABLE};
    for (int i = 0; i < 2; i++) {
        s_measure(skews[i], share, target, routing, sizeof routing);
        assert_string_equal(routing, skews[i]);
        router_skew_t s;
        assert_int_equal(router_skew_parse(skews[i], &s, err, sizeof err), 0);
        for (int l = 0; l < 2; l++) {
            assert_int_equal(router_skew_target(&s, l, 2, 32, 4, want, err, sizeof err), 0);
            const double r = router_skew_busiest_over_avg(share[l], 32), t = router_skew_busiest_over_avg(want, 32);
            const double tv = s_tv(share[l], want);
            const int hot = s_argmax(want, 32);
            print_message("%s: layer %d busiest/average %.3f, target %.3f; the target's busiest expert at %.3f of its "
                          "share; total variation %.3f\n", skews[i], l, r, t, share[l][hot] / want[hot], tv);
            assert_true(fabs(target[l] - t) < 1e-9);
            assert_true(fabs(r - t) < 0.2 * t);
            assert_true(fabs(share[l][hot] / want[hot] - 1) < 0.2);
            assert_true(tv < 0.08);
        }
        router_skew_free(&s);
    }
}

static void test_checkpoint_refuses(void **state)
{
    engine_spec_t s;
    engine_spec_default(&s);
    s.threads = 1;
    s.model = (model_opts_t){.max_tokens = 16, .max_seqs = 1, .max_context = 64, .router_skew = "zipf:1"};
    s.kv_blocks = 4;
    char err[1024];
    engine_status_t st;
    engine_t *e = engine_open("tests/fixtures/models/qwen3-moe-f32", &s, &st, err, sizeof err);
    assert_null(e);
    assert_int_equal(st, ENGINE_ERR_CONFIG);
    if (!strstr(err, "zipf:1") || !strstr(err, "dummy weights"))
        fail_msg("error '%s' should name the skew and say it is for dummy weights", err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse), cmocka_unit_test(test_targets), cmocka_unit_test(test_fit),
        cmocka_unit_test(test_dummy_model_routes_skewed), cmocka_unit_test(test_checkpoint_refuses)};
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
