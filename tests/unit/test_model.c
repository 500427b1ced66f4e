/* tests/unit/test_model.c — the forward pass against transformers and against a naive reference.
 *
 * 1. Fixtures (tests/fixtures/models/<name>/expected.json, written by transformers on the GPU
 *    machine; TROUPE_MODEL_FIXTURES=dir looks elsewhere): for every prompt, the last-position
 *    logits within 1e-4 relative error (||a-b|| / ||b||) and all greedy tokens identical; the same
 *    prompt prefilled in chunks gives bit-identical logits; all prompts in one batch (prefill, then
 *    decode in lockstep) give the single-sequence tokens and bit-identical logits. A missing
 *    fixture is SKIPPED with a line saying how to make it.
 * 2. Self-contained, always run: tiny random configs of all four architectures (the 'dummy' load
 *    format, f32 and bf16 weights, per-expert and fused expert layouts, biases, llama3 rope,
 *    qk-norm, mlp_only_layers) against a double-precision reference forward written here from the
 *    HF modeling code, at every step of a prefill + decode; plus chunking, batching and all_logits
 *    equalities, and the errors a bad batch or a mismatched checkpoint gives.
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/sampler.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "tests/unit/expected_fixture.h"

static backend_t *s_be;

static int s_setup(void **state)
{
    s_be = backend_cpu_new(0);
    return s_be ? 0 : -1;
}

static int s_teardown(void **state)
{
    backend_destroy(&s_be);
    return 0;
}

/* Prefills one sequence with tokens in chunks of `chunk` (0: all at once); logits of the last. */
static void s_prefill(model_t *m, kvseq_t *s, const int32_t *ids, int n, int chunk, float *logits)
{
    char err[512];
    if (chunk <= 0)
        chunk = n;
    for (int at = 0; at < n; at += chunk) {
        int k = n - at < chunk ? n - at : chunk;
        assert_int_equal(kvseq_append(s, ids + at, k), 0);
        model_seq_t q = {.kv = s, .n_new = k};
        model_batch_t b = {.n_seqs = 1, .seqs = &q};
        if (model_forward(m, &b, logits, err, sizeof err) < 0)
            fail_msg("model_forward: %s", err);
        kvseq_publish(s);
    }
}

/* ================================================================================================
 * Part 1: transformers fixtures
 * ============================================================================================== */

static const char *s_fixture_root(void)
{
    const char *r = getenv("TROUPE_MODEL_FIXTURES");
    return r && *r ? r : "tests/fixtures/models";
}

static void s_run_fixture(const char *name)
{
    char dir[1024], path[1100], err[512];
    snprintf(dir, sizeof dir, "%s/%s", s_fixture_root(), name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        print_message("SKIP %s: %s is missing (make it with tests/fixtures/make_model_fixtures.py on a machine with "
                      "transformers)\n", name, path);
        skip();
    }
    expected_t e = {0};
    s_load_expected(path, &e);
    model_config_t cfg;
    if (config_load(dir, &cfg, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(cfg.vocab_size, e.vocab);
    ckpt_t *ck = ckpt_open(dir, err, sizeof err);
    if (!ck)
        fail_msg("%s", err);
    /* Fused q|k|v and gate|up (what a GPU backend loads; the CPU backend's own choice is not to):
     * one-row steps run the fused matrices, longer ones their row ranges, and the chunks-of-1
     * comparison below holds them to the same bits. */
    model_opts_t o = {.max_tokens = 128, .max_seqs = 8, .max_context = 128, .kv_block_size = 4, .fuse_weights = 1};
    model_t *m = model_load(dir, &cfg, ck, s_be, &o, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    /* The loader's weight count (the workers size their KV pool after it) equals the shape-only one:
     * MLA's o_proj was once counted twice. */
    if (cfg.mla.on)
        assert_int_equal((size_t)config_weight_bytes(&cfg, dtype_size(cfg.dtype), cfg.num_experts), model_weight_bytes(m));
    const int V = cfg.vocab_size, bs = 4;
    kvpool_t *pool = kvpool_new(256, bs, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, DT_F32, s_be, err, sizeof err);
    assert_non_null(pool);
    float *lg = malloc((size_t)V * 8 * sizeof(float)), *lg2 = malloc((size_t)V * 8 * sizeof(float));
    float *first[8];

    /* Single sequence: prefill in one go, compare logits, then greedy. */
    for (int p = 0; p < e.n; p++) {
        kvseq_t *s = kvseq_new(pool, 128, 0);
        s_prefill(m, s, e.ids[p], e.n_ids[p], 0, lg);
        double rel = fixture_relerr(lg, e.last[p], V);
        print_message("%s prompt %d (%d tokens): last-position logits relative error %.3g\n", name, p, e.n_ids[p], rel);
        if (!(rel <= 1e-4))
            fail_msg("%s prompt %d: logits relative error %.3g exceeds 1e-4", name, p, rel);
        first[p] = malloc((size_t)V * sizeof(float));
        memcpy(first[p], lg, (size_t)V * sizeof(float));
        for (int i = 0; i < e.n_greedy[p]; i++) {
            int32_t t = fixture_argmax(lg, V);
            if (t != e.greedy[p][i])
                fail_msg("%s prompt %d: greedy token %d is %d, transformers says %d", name, p, i, t, e.greedy[p][i]);
            if (i + 1 == e.n_greedy[p])
                break;
            assert_int_equal(kvseq_append(s, &t, 1), 0);
            model_seq_t q = {.kv = s, .n_new = 1};
            model_batch_t b = {.n_seqs = 1, .seqs = &q};
            if (model_forward(m, &b, lg, err, sizeof err) < 0)
                fail_msg("%s", err);
        }
        kvseq_destroy(&s);

        /* The same prompt in chunks of 7 (and of 1): bit-identical logits. */
        const int chunks[2] = {7, 1};
        for (int c = 0; c < 2; c++) {
            s = kvseq_new(pool, 128, 0);
            s_prefill(m, s, e.ids[p], e.n_ids[p], chunks[c], lg);
            if (memcmp(lg, first[p], (size_t)V * sizeof(float)) != 0)
                fail_msg("%s prompt %d: prefill in chunks of %d differs from one chunk", name, p, chunks[c]);
            kvseq_destroy(&s);
        }
    }

    /* All prompts in one batch, then decoding in lockstep. */
    kvseq_t *seqs[8];
    model_seq_t qs[8];
    for (int p = 0; p < e.n; p++) {
        seqs[p] = kvseq_new(pool, 128, 0);
        assert_int_equal(kvseq_append(seqs[p], e.ids[p], e.n_ids[p]), 0);
        qs[p] = (model_seq_t){.kv = seqs[p], .n_new = e.n_ids[p]};
    }
    model_batch_t b = {.n_seqs = e.n, .seqs = qs};
    if (model_forward(m, &b, lg2, err, sizeof err) < 0)
        fail_msg("%s", err);
    for (int p = 0; p < e.n; p++)
        if (memcmp(lg2 + (size_t)p * V, first[p], (size_t)V * sizeof(float)) != 0)
            fail_msg("%s: prompt %d's logits in a batch of %d differ from its single-sequence logits", name, p, e.n);
    /* Decode steps take the backend's argmax (argmax_out) as the decode worker does; one row per
     * step also asks for its logits (need_logits): only that row may be written, and its argmax
     * must be the one argmax_out gave. The first token comes from the prefill's full logits. */
    int32_t dev[8];
    uint8_t need[8];
    for (int i = 0; i < e.n_greedy[0]; i++) {
        for (int p = 0; p < e.n; p++) {
            int32_t t = i == 0 ? fixture_argmax(lg2 + (size_t)p * V, V) : dev[p];
            if (i > 0 && need[p] && fixture_argmax(lg2 + (size_t)p * V, V) != t)
                fail_msg("%s: step %d, prompt %d: argmax_out %d disagrees with the row's logits (argmax %d)", name,
                         i, p, t, fixture_argmax(lg2 + (size_t)p * V, V));
            if (t != e.greedy[p][i])
                fail_msg("%s: batched greedy, prompt %d token %d is %d, expected %d", name, p, i, t, e.greedy[p][i]);
            assert_int_equal(kvseq_append(seqs[p], &t, 1), 0);
            qs[p].n_new = 1;
        }
        if (i + 1 == e.n_greedy[0])
            break;
        for (int p = 0; p < e.n; p++)
            need[p] = p == i % e.n;
        for (size_t k = 0; k < (size_t)e.n * V; k++)
            lg2[k] = NAN;
        b.argmax_out = dev;
        b.need_logits = need;
        if (model_forward(m, &b, lg2, err, sizeof err) < 0)
            fail_msg("%s", err);
        for (int p = 0; p < e.n; p++)
            if (!need[p] && (!isnan(lg2[(size_t)p * V]) || !isnan(lg2[(size_t)p * V + V - 1])))
                fail_msg("%s: step %d wrote the logits of prompt %d, which did not ask for them", name, i, p);
    }
    for (int p = 0; p < e.n; p++) {
        kvseq_destroy(&seqs[p]);
        free(first[p]);
    }
    /* Sampling on the device (model_batch_t.sample), as the decode worker runs it: every prompt in
     * one batch with its own parameters (greedy, temperature, top-k, top-p, min-p, combinations),
     * every row's logits brought back too; the op's id must be the host sampler's on that row at
     * the same step, for 6 steps. */
    {
        const sampler_params_t kinds[7] = {
            {.temperature = 0, .top_p = 1}, {.temperature = 0.8, .top_p = 1}, {.temperature = 1.3, .top_k = 5, .top_p = 1},
            {.temperature = 0.7, .top_p = 0.6}, {.temperature = 1.0, .top_p = 1, .min_p = 0.2},
            {.temperature = 0.9, .top_k = 40, .top_p = 0.8, .min_p = 0.05}, {.temperature = 2.0, .top_k = 3, .top_p = 0.5}};
        sampler_t *smp[8];
        bk_sample_t sp[8];
        int32_t ids[8];
        uint8_t all[8];
        for (int p = 0; p < e.n; p++) {
            sampler_params_t q = kinds[p % 7];
            q.repetition_penalty = 1.0;
            q.seed = 1000 + (uint64_t)p;
            smp[p] = sampler_new(&q, V, NULL, 0, err, sizeof err);
            if (!smp[p])
                fail_msg("%s", err);
            seqs[p] = kvseq_new(pool, 128, 0);
            assert_int_equal(kvseq_append(seqs[p], e.ids[p], e.n_ids[p]), 0);
            qs[p] = (model_seq_t){.kv = seqs[p], .n_new = e.n_ids[p]};
            all[p] = 1;
        }
        model_batch_t bsm = {.n_seqs = e.n, .seqs = qs, .argmax_out = ids, .need_logits = all, .sample = sp};
        for (int step = 0; step < 6; step++) {
            for (int p = 0; p < e.n; p++)
                sampler_device_params(smp[p], &sp[p]);
            if (model_forward(m, &bsm, lg2, err, sizeof err) < 0)
                fail_msg("%s", err);
            for (int p = 0; p < e.n; p++) {
                int32_t want = sampler_sample(smp[p], lg2 + (size_t)p * V, NULL);
                if (ids[p] != want)
                    fail_msg("%s: sampled step %d, prompt %d: the sample op gave %d, the host sampler %d", name, step, p,
                             ids[p], want);
                sampler_accept(smp[p], want);
                assert_int_equal(kvseq_append(seqs[p], &want, 1), 0);
                qs[p].n_new = 1;
            }
        }
        for (int p = 0; p < e.n; p++) {
            kvseq_destroy(&seqs[p]);
            sampler_destroy(&smp[p]);
        }
    }
    assert_int_equal(kvpool_free_count(pool), 256);
    free(lg2);
    free(lg);
    kvpool_destroy(&pool);
    model_destroy(&m);
    assert_null(m);
    ckpt_destroy(&ck);
    s_free_expected(&e);
}

static void test_fixture(void **state) { s_run_fixture((const char *)*state); }

/* Any other fixture directory with an expected.json (added later) runs too. */
static void test_fixture_others(void **state)
{
    static const char *const known[] = {"llama-gqa-f32", "llama-tied-bf16", "qwen3-f32", "qwen3-moe-f32", "mixtral-f32",
                                        "qwen3-sharded-f32"};
    DIR *d = opendir(s_fixture_root());
    if (!d) {
        print_message("SKIP: no fixture directory %s\n", s_fixture_root());
        skip();
    }
    struct dirent *de;
    int ran = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        int is_known = 0;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            is_known |= strcmp(de->d_name, known[i]) == 0;
        char path[1100];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s/expected.json", s_fixture_root(), de->d_name);
        if (is_known || stat(path, &st) != 0)
            continue;
        s_run_fixture(de->d_name);
        ran++;
    }
    closedir(d);
    if (!ran)
        print_message("no fixtures beyond the six known ones under %s\n", s_fixture_root());
}

/* ================================================================================================
 * Part 2: a double-precision reference forward (HF semantics) on dummy weights
 * ============================================================================================== */

typedef struct {
    const model_config_t *c;
    ckpt_t *ck;
    int fused;                    /* MoE experts stored as fused tensors */
} ref_t;

/* The named tensor as doubles (exact), or a test failure if absent. */
static double *s_w(ckpt_t *ck, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static double *s_w(ckpt_t *ck, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const tensor_view_t *t = ckpt_get(ck, name);
    if (!t)
        fail_msg("reference: tensor %s is not in the checkpoint", name);
    size_t n = t->nbytes / dtype_size(t->dtype);
    float *f = malloc(n * sizeof(float));
    double *d = malloc(n * sizeof(double));
    dtype_to_f32(t->dtype, t->data, f, n);
    for (size_t i = 0; i < n; i++)
        d[i] = f[i];
    free(f);
    return d;
}

/* y[n] = W[n][k] x[k] (+ b) */
static void s_mv(const double *W, const double *x, int N, int K, const double *b, double *y)
{
    for (int n = 0; n < N; n++) {
        double s = b ? b[n] : 0;
        for (int k = 0; k < K; k++)
            s += W[(size_t)n * K + k] * x[k];
        y[n] = s;
    }
}

static void s_rms(const double *x, const double *w, int n, double eps, double *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = w[i] * (x[i] * r);
}

/* HF's inverse frequencies, in double, from the formulas in modeling_rope_utils.py. */
static void s_ref_inv_freq(const model_config_t *c, double *inv)
{
    const int d = c->head_dim;
    for (int i = 0; i < d / 2; i++) {
        double f = 1.0 / pow(c->rope_theta, (2.0 * i) / d);
        if (c->rope_kind == ROPE_LINEAR)
            f /= c->rope_factor;
        if (c->rope_kind == ROPE_LLAMA3) {
            double lw = c->rope_original_max_pos / c->rope_low_freq_factor, hw = c->rope_original_max_pos / c->rope_high_freq_factor;
            double wl = 2 * M_PI / f;
            double scaled = wl > lw ? f / c->rope_factor : f;
            double sm = (c->rope_original_max_pos / wl - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
            if (!(wl < hw) && !(wl > lw))
                scaled = (1 - sm) * scaled / c->rope_factor + sm * scaled;
            f = scaled;
        }
        inv[i] = f;
    }
}

static void s_rope1(double *v, int d, int pos, const double *inv)
{
    for (int i = 0; i < d / 2; i++) {
        double a = pos * inv[i], lo = v[i], hi = v[i + d / 2];
        v[i] = lo * cos(a) - hi * sin(a);
        v[i + d / 2] = hi * cos(a) + lo * sin(a);
    }
}

/* One SwiGLU FFN: out = down(silu(gate x) * up x), gate/up [I][H], down [H][I]. */
static void s_ffn(const double *gate, const double *up, const double *down, const double *x, int H, int I, double *out)
{
    double *g = malloc((size_t)I * sizeof(double)), *u = malloc((size_t)I * sizeof(double));
    s_mv(gate, x, I, H, NULL, g);
    s_mv(up, x, I, H, NULL, u);
    for (int i = 0; i < I; i++)
        g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    s_mv(down, g, H, I, NULL, out);
    free(g);
    free(u);
}

/* Logits [V] of the last of tokens[0..n), computed from scratch. */
static void s_ref_forward(const ref_t *r, const int32_t *tok, int n, double *logits)
{
    const model_config_t *c = r->c;
    const int H = c->hidden_size, D = c->head_dim, nH = c->num_heads, nKV = c->num_kv_heads, V = c->vocab_size;
    const int G = nH / nKV;
    double *res = calloc((size_t)n * H, sizeof(double)), *x = malloc((size_t)n * H * sizeof(double));
    double *q = malloc((size_t)n * nH * D * sizeof(double)), *k = malloc((size_t)n * nKV * D * sizeof(double));
    double *v = malloc((size_t)n * nKV * D * sizeof(double)), *att = malloc((size_t)n * nH * D * sizeof(double));
    double *tmp = malloc((size_t)(H > nH * D ? H : nH * D) * sizeof(double)), *sc = malloc((size_t)n * sizeof(double));
    double inv[BK_MAX_HEAD_DIM / 2];
    s_ref_inv_freq(c, inv);
    double *emb = s_w(r->ck, "model.embed_tokens.weight");
    for (int t = 0; t < n; t++)
        memcpy(res + (size_t)t * H, emb + (size_t)tok[t] * H, (size_t)H * sizeof(double));
    for (int l = 0; l < c->num_layers; l++) {
        double *ln1 = s_w(r->ck, "model.layers.%d.input_layernorm.weight", l);
        double *ln2 = s_w(r->ck, "model.layers.%d.post_attention_layernorm.weight", l);
        double *wq = s_w(r->ck, "model.layers.%d.self_attn.q_proj.weight", l);
        double *wk = s_w(r->ck, "model.layers.%d.self_attn.k_proj.weight", l);
        double *wv = s_w(r->ck, "model.layers.%d.self_attn.v_proj.weight", l);
        double *wo = s_w(r->ck, "model.layers.%d.self_attn.o_proj.weight", l);
        double *bq = NULL, *bk = NULL, *bv = NULL, *bo = NULL, *qn = NULL, *kn = NULL;
        if (c->attention_bias) {
            bq = s_w(r->ck, "model.layers.%d.self_attn.q_proj.bias", l);
            bk = s_w(r->ck, "model.layers.%d.self_attn.k_proj.bias", l);
            bv = s_w(r->ck, "model.layers.%d.self_attn.v_proj.bias", l);
            bo = s_w(r->ck, "model.layers.%d.self_attn.o_proj.bias", l);
        }
        if (c->has_qk_norm) {
            qn = s_w(r->ck, "model.layers.%d.self_attn.q_norm.weight", l);
            kn = s_w(r->ck, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        for (int t = 0; t < n; t++) {
            s_rms(res + (size_t)t * H, ln1, H, c->rms_norm_eps, x + (size_t)t * H);
            s_mv(wq, x + (size_t)t * H, nH * D, H, bq, q + (size_t)t * nH * D);
            s_mv(wk, x + (size_t)t * H, nKV * D, H, bk, k + (size_t)t * nKV * D);
            s_mv(wv, x + (size_t)t * H, nKV * D, H, bv, v + (size_t)t * nKV * D);
            for (int h = 0; h < nH; h++) {
                double *qh = q + ((size_t)t * nH + h) * D;
                if (qn) {
                    s_rms(qh, qn, D, c->rms_norm_eps, tmp);
                    memcpy(qh, tmp, (size_t)D * sizeof(double));
                }
                s_rope1(qh, D, t, inv);
            }
            for (int h = 0; h < nKV; h++) {
                double *kh = k + ((size_t)t * nKV + h) * D;
                if (kn) {
                    s_rms(kh, kn, D, c->rms_norm_eps, tmp);
                    memcpy(kh, tmp, (size_t)D * sizeof(double));
                }
                s_rope1(kh, D, t, inv);
            }
        }
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nH; h++) {
                const double *qh = q + ((size_t)t * nH + h) * D;
                int g = h / G;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < D; d++)
                        s += qh[d] * k[((size_t)j * nKV + g) * D + d];
                    sc[j] = s / sqrt((double)D);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j <= t; j++)
                    sum += (sc[j] = exp(sc[j] - mx));
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++)
                        o += sc[j] / sum * v[((size_t)j * nKV + g) * D + d];
                    att[((size_t)t * nH + h) * D + d] = o;
                }
            }
        for (int t = 0; t < n; t++) {
            s_mv(wo, att + (size_t)t * nH * D, H, nH * D, bo, tmp);
            for (int i = 0; i < H; i++)
                res[(size_t)t * H + i] += tmp[i];
            s_rms(res + (size_t)t * H, ln2, H, c->rms_norm_eps, x + (size_t)t * H);
        }
        if (c->num_experts > 0 && config_layer_is_moe(c, l)) {
            const int E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
            const int mix = c->arch == ARCH_MIXTRAL;
            double *router = r->fused || !mix ? s_w(r->ck, "model.layers.%d.mlp.gate.weight", l)
                                               : s_w(r->ck, "model.layers.%d.block_sparse_moe.gate.weight", l);
            double *gu = NULL, *dn = NULL, *eg[64], *eu[64], *ed[64];
            if (r->fused) {
                gu = s_w(r->ck, "model.layers.%d.mlp.experts.gate_up_proj", l);
                dn = s_w(r->ck, "model.layers.%d.mlp.experts.down_proj", l);
            }
            for (int e = 0; e < E; e++) {
                if (r->fused) {
                    eg[e] = gu + (size_t)e * 2 * I * H;
                    eu[e] = eg[e] + (size_t)I * H;
                    ed[e] = dn + (size_t)e * H * I;
                } else if (mix) {
                    eg[e] = s_w(r->ck, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
                    eu[e] = s_w(r->ck, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
                    ed[e] = s_w(r->ck, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
                } else {
                    eg[e] = s_w(r->ck, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                    eu[e] = s_w(r->ck, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                    ed[e] = s_w(r->ck, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
                }
            }
            double lg[64], p[64], y[512];
            for (int t = 0; t < n; t++) {
                s_mv(router, x + (size_t)t * H, E, H, NULL, lg);
                double mx = -INFINITY, z = 0;
                for (int e = 0; e < E; e++)
                    mx = lg[e] > mx ? lg[e] : mx;
                for (int e = 0; e < E; e++)
                    z += (p[e] = exp(lg[e] - mx));
                int taken[64] = {0}, sel[8];
                double w[8], ws = 0;
                for (int j = 0; j < K; j++) {
                    int best = -1;
                    for (int e = 0; e < E; e++)
                        if (!taken[e] && (best < 0 || p[e] > p[best]))
                            best = e;
                    taken[best] = 1;
                    sel[j] = best;
                    ws += (w[j] = p[best] / z);
                }
                for (int j = 0; j < K; j++)
                    if (mix || c->norm_topk_prob)
                        w[j] /= ws;
                for (int j = 0; j < K; j++) {
                    s_ffn(eg[sel[j]], eu[sel[j]], ed[sel[j]], x + (size_t)t * H, H, I, y);
                    for (int i = 0; i < H; i++)
                        res[(size_t)t * H + i] += w[j] * y[i];
                }
            }
            if (r->fused) {
                free(gu);
                free(dn);
            } else {
                for (int e = 0; e < E; e++) {
                    free(eg[e]);
                    free(eu[e]);
                    free(ed[e]);
                }
            }
            free(router);
        } else {
            double *wg = s_w(r->ck, "model.layers.%d.mlp.gate_proj.weight", l);
            double *wu = s_w(r->ck, "model.layers.%d.mlp.up_proj.weight", l);
            double *wd = s_w(r->ck, "model.layers.%d.mlp.down_proj.weight", l);
            for (int t = 0; t < n; t++) {
                s_ffn(wg, wu, wd, x + (size_t)t * H, H, c->intermediate_size, tmp);
                for (int i = 0; i < H; i++)
                    res[(size_t)t * H + i] += tmp[i];
            }
            free(wg);
            free(wu);
            free(wd);
        }
        free(ln1); free(ln2); free(wq); free(wk); free(wv); free(wo);
        free(bq); free(bk); free(bv); free(bo); free(qn); free(kn);
    }
    double *fn = s_w(r->ck, "model.norm.weight");
    s_rms(res + (size_t)(n - 1) * H, fn, H, c->rms_norm_eps, x);
    double *head = c->tie_word_embeddings ? emb : s_w(r->ck, "lm_head.weight");
    s_mv(head, x, V, H, NULL, logits);
    if (head != emb)
        free(head);
    free(fn); free(emb); free(res); free(x); free(q); free(k); free(v); free(att); free(tmp); free(sc);
}

typedef struct {
    const char *name;
    const char *json;             /* config.json */
    dtype_t dtype;                /* weights */
    dtype_t kv;                   /* KV cache */
    int fused;                    /* pre-make fused expert tensors */
    double bound;                 /* logits relative error vs the double reference */
} tiny_t;

#define COMMON_JSON "\"vocab_size\":97,\"hidden_size\":64,\"intermediate_size\":96,\"num_attention_heads\":4," \
                    "\"num_key_value_heads\":2,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-5,"

static const tiny_t s_tiny[] = {
    {"llama (llama3 rope, biases, untied)",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\"," COMMON_JSON
     "\"num_hidden_layers\":2,\"rope_theta\":10000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
     "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":64},"
     "\"tie_word_embeddings\":false,\"attention_bias\":true,\"torch_dtype\":\"float32\"}",
     DT_F32, DT_F32, 0, 1e-4},
    {"qwen3 (qk-norm, head_dim 32, tied, bf16 weights)",
     "{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\"," COMMON_JSON
     "\"num_hidden_layers\":2,\"head_dim\":32,\"rope_theta\":1000000,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}",
     DT_BF16, DT_F32, 0, 1e-4},
    {"qwen3-moe (per-expert, no renorm, dense layer 0)",
     "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\"," COMMON_JSON
     "\"num_hidden_layers\":3,\"head_dim\":16,\"rope_theta\":1000000,\"num_experts\":6,\"num_experts_per_tok\":2,"
     "\"moe_intermediate_size\":32,\"norm_topk_prob\":false,\"decoder_sparse_step\":1,\"mlp_only_layers\":[0],"
     "\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}",
     DT_F32, DT_F32, 0, 1e-4},
    {"qwen3-moe (fused experts, renorm, bf16 weights)",
     "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\"," COMMON_JSON
     "\"num_hidden_layers\":2,\"head_dim\":16,\"rope_theta\":1000000,\"num_experts\":5,\"num_experts_per_tok\":3,"
     "\"moe_intermediate_size\":24,\"norm_topk_prob\":true,\"decoder_sparse_step\":1,"
     "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}",
     DT_BF16, DT_F32, 1, 1e-4},
    {"mixtral (per-expert w1/w2/w3)",
     "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\"," COMMON_JSON
     "\"num_hidden_layers\":2,\"rope_theta\":1000000.0,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
     "\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}",
     DT_F32, DT_F32, 0, 1e-4},
    {"mixtral (fused experts, f16 weights)",
     "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\"," COMMON_JSON
     "\"num_hidden_layers\":2,\"rope_theta\":1000000.0,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
     "\"tie_word_embeddings\":false,\"torch_dtype\":\"float16\"}",
     DT_F16, DT_F32, 1, 1e-4},
    {"qwen3 with a bf16 KV cache (K/V rounded: looser bound)",
     "{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\"," COMMON_JSON
     "\"num_hidden_layers\":2,\"head_dim\":32,\"rope_theta\":1000000,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}",
     DT_BF16, DT_BF16, 0, 2e-2},
};

static void s_parse(const char *json, model_config_t *cfg)
{
    char err[512];
    if (config_parse(json, strlen(json), "tiny config.json", cfg, err, sizeof err) < 0)
        fail_msg("%s", err);
}

static void test_tiny_against_reference(void **state)
{
    for (size_t ti = 0; ti < sizeof s_tiny / sizeof s_tiny[0]; ti++) {
        const tiny_t *tc = &s_tiny[ti];
        char err[512];
        model_config_t cfg;
        s_parse(tc->json, &cfg);
        ckpt_t *ck = ckpt_dummy(tc->dtype, 1000 + ti);
        if (tc->fused)
            for (int l = 0; l < cfg.num_layers; l++) {
                if (!config_layer_is_moe(&cfg, l))
                    continue;
                char name[128];
                int64_t gu[3] = {cfg.num_experts, 2 * (int64_t)cfg.moe_intermediate_size, cfg.hidden_size};
                int64_t dn[3] = {cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size};
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
                assert_non_null(ckpt_expect(ck, name, 3, gu, err, sizeof err));
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
                assert_non_null(ckpt_expect(ck, name, 3, dn, err, sizeof err));
                /* transformers 5 in memory names Mixtral's block "mlp" too. */
                int64_t rt[2] = {cfg.num_experts, cfg.hidden_size};
                snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
                assert_non_null(ckpt_expect(ck, name, 2, rt, err, sizeof err));
            }
        model_opts_t o = {.max_tokens = 64, .max_seqs = 4, .max_logit_rows = 32, .max_context = 64, .kv_block_size = 4};
        model_t *m = model_load(NULL, &cfg, ck, s_be, &o, err, sizeof err);
        if (!m)
            fail_msg("%s: %s", tc->name, err);
        /* The shape-only count (troupe-bench sizes its bandwidth figures with it) equals the loader's. */
        assert_int_equal((size_t)config_weight_bytes(&cfg, dtype_size(tc->dtype), cfg.num_experts), model_weight_bytes(m));
        assert_int_equal((size_t)config_weight_bytes(&cfg, dtype_size(tc->dtype), cfg.num_experts_per_tok),
                         model_active_weight_bytes(m));
        if (tc->fused) {                           /* the fused path was taken: no per-expert tensor was made */
            int l0 = config_layer_is_moe(&cfg, 0) ? 0 : 1;
            char name[128];
            snprintf(name, sizeof name, cfg.arch == ARCH_MIXTRAL ? "model.layers.%d.block_sparse_moe.experts.0.w1.weight"
                                                                 : "model.layers.%d.mlp.experts.0.gate_proj.weight", l0);
            assert_false(ckpt_has(ck, name));
        }
        const int V = cfg.vocab_size;
        kvpool_t *pool = kvpool_new(64, 4, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, tc->kv, s_be, err, sizeof err);
        assert_non_null(pool);
        ref_t ref = {.c = &cfg, .ck = ck, .fused = tc->fused};
        int32_t toks[64];
        uint64_t rng = 777 + ti;
        int n = 13;
        for (int i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            toks[i] = (int32_t)((rng >> 33) % (uint64_t)V);
        }
        float *lg = malloc((size_t)V * 32 * sizeof(float)), *first = malloc((size_t)V * sizeof(float));
        double *rl = malloc((size_t)V * sizeof(double));
        kvseq_t *s = kvseq_new(pool, 64, 0);
        s_prefill(m, s, toks, n, 0, lg);
        memcpy(first, lg, (size_t)V * sizeof(float));
        double worst = 0;
        for (int step = 0; step < 6; step++) {
            s_ref_forward(&ref, toks, n, rl);
            double e = fixture_relerr(lg, rl, V);
            worst = e > worst ? e : worst;
            if (!(e <= tc->bound))
                fail_msg("%s: step %d (%d tokens): logits relative error %.3g exceeds %.1g", tc->name, step, n, e, tc->bound);
            toks[n] = fixture_argmax(lg, V);
            assert_int_equal(kvseq_append(s, &toks[n], 1), 0);
            n++;
            model_seq_t q = {.kv = s, .n_new = 1};
            model_batch_t b = {.n_seqs = 1, .seqs = &q};
            if (model_forward(m, &b, lg, err, sizeof err) < 0)
                fail_msg("%s", err);
        }
        print_message("%-50s worst logits relative error vs double reference: %.2g\n", tc->name, worst);

        /* Chunked prefill (5 + 5 + 3): bit-identical to one chunk. */
        kvseq_t *c2 = kvseq_new(pool, 64, 0);
        s_prefill(m, c2, toks, 13, 5, lg);
        assert_memory_equal(lg, first, (size_t)V * sizeof(float));
        kvseq_destroy(&c2);

        /* A batch: another prompt first, then ours; ours is bit-identical. */
        kvseq_t *a = kvseq_new(pool, 64, 0), *bq = kvseq_new(pool, 64, 0);
        int32_t other[9] = {5, 6, 7, 8, 9, 10, 11, 12, 13};
        assert_int_equal(kvseq_append(a, other, 9), 0);
        assert_int_equal(kvseq_append(bq, toks, 13), 0);
        model_seq_t qs[2] = {{.kv = a, .n_new = 9}, {.kv = bq, .n_new = 13}};
        model_batch_t b2 = {.n_seqs = 2, .seqs = qs};
        if (model_forward(m, &b2, lg, err, sizeof err) < 0)
            fail_msg("%s", err);
        assert_memory_equal(lg + V, first, (size_t)V * sizeof(float));

        /* all_logits: every row of a prefill; the last equals the one-row result, row 7 the reference. */
        kvseq_t *al = kvseq_new(pool, 64, 0);
        assert_int_equal(kvseq_append(al, toks, 13), 0);
        model_seq_t qa = {.kv = al, .n_new = 13};
        model_batch_t ba = {.n_seqs = 1, .seqs = &qa, .all_logits = 1};
        if (model_forward(m, &ba, lg, err, sizeof err) < 0)
            fail_msg("%s", err);
        assert_memory_equal(lg + (size_t)12 * V, first, (size_t)V * sizeof(float));
        s_ref_forward(&ref, toks, 8, rl);
        assert_true(fixture_relerr(lg + (size_t)7 * V, rl, V) <= tc->bound);

        kvseq_destroy(&al);
        kvseq_destroy(&a);
        kvseq_destroy(&bq);
        kvseq_destroy(&s);
        assert_int_equal(kvpool_free_count(pool), 64);
        free(rl);
        free(first);
        free(lg);
        kvpool_destroy(&pool);
        model_destroy(&m);
        ckpt_destroy(&ck);
    }
}

static void test_rope_inv_freq(void **state)
{
    model_config_t cfg;
    s_parse("{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\"," COMMON_JSON
            "\"num_hidden_layers\":1,\"rope_theta\":10000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
            "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":64}}",
            &cfg);
    float inv[8];
    double ref[8];
    char err[256];
    assert_int_equal(rope_inv_freq(&cfg, inv, err, sizeof err), 0);
    s_ref_inv_freq(&cfg, ref);
    int bands[3] = {0};
    for (int i = 0; i < 8; i++) {
        assert_true(fabs(inv[i] - ref[i]) <= 1e-6 * ref[i]);
        double base = 1.0 / pow(10000.0, 2.0 * i / 16), wl = 2 * M_PI / base;
        bands[wl < 16 ? 0 : wl > 64 ? 2 : 1]++;
    }
    assert_true(bands[0] && bands[1] && bands[2]);   /* high, medium and low bands all occur */
    cfg.rope_kind = ROPE_LINEAR;
    cfg.rope_factor = 4;
    assert_int_equal(rope_inv_freq(&cfg, inv, err, sizeof err), 0);
    assert_float_equal(inv[3], 1.0 / pow(10000.0, 6.0 / 16) / 4, 1e-6 * inv[3]);
}

static void test_errors(void **state)
{
    char err[512];
    model_config_t cfg;
    s_parse("{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\"," COMMON_JSON
            "\"num_hidden_layers\":1,\"head_dim\":16,\"tie_word_embeddings\":true}", &cfg);
    /* A checkpoint whose tensor has another shape: the error names it and both shapes. */
    ckpt_t *ck = ckpt_dummy(DT_F32, 1);
    int64_t wrong[2] = {97, 65};
    assert_non_null(ckpt_expect(ck, "model.layers.0.self_attn.k_proj.weight", 2, wrong, err, sizeof err));
    assert_null(model_load("tiny", &cfg, ck, s_be, NULL, err, sizeof err));
    assert_non_null(strstr(err, "model.layers.0.self_attn.k_proj.weight"));
    ckpt_destroy(&ck);

    ck = ckpt_dummy(DT_F32, 2);
    model_opts_t o = {.max_tokens = 8, .max_seqs = 2, .max_context = 32, .kv_block_size = 4};
    model_t *m = model_load("tiny", &cfg, ck, s_be, &o, err, sizeof err);
    assert_non_null(m);
    kvpool_t *pool = kvpool_new(16, 4, 1, 2, 16, DT_F32, s_be, err, sizeof err);
    kvpool_t *meta_only = kvpool_new(16, 4, 1, 2, 16, DT_F32, NULL, err, sizeof err);
    kvpool_t *other = kvpool_new(16, 4, 2, 2, 16, DT_F32, s_be, err, sizeof err);
    /* The graph warm-up where the backend records no graphs (the CPU): nothing run, nothing taken. */
    int warmed = -1;
    assert_int_equal(model_graph_warmup(m, pool, 2, 2, 8, &warmed, err, sizeof err), 0);
    assert_int_equal(warmed, 0);
    assert_int_equal(kvpool_free_count(pool), 16);
    kvseq_t *s = kvseq_new(pool, 32, 0);
    float *lg = malloc(97 * 8 * sizeof(float));
    int32_t bad[2] = {3, 97};
    assert_int_equal(kvseq_append(s, bad, 2), 0);
    model_seq_t q = {.kv = s, .n_new = 2};
    model_batch_t b = {.n_seqs = 1, .seqs = &q};
    assert_int_equal(model_forward(m, &b, lg, err, sizeof err), -1);
    assert_non_null(strstr(err, "token 97"));
    q.n_new = 3;
    assert_int_equal(model_forward(m, &b, lg, err, sizeof err), -1);
    assert_non_null(strstr(err, "3 new tokens"));
    kvseq_release(s);
    int32_t many[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(kvseq_append(s, many, 9), 0);
    q.n_new = 9;
    assert_int_equal(model_forward(m, &b, lg, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_tokens"));
    kvseq_t *s2 = kvseq_new(meta_only, 32, 0);
    assert_int_equal(kvseq_append(s2, many, 2), 0);
    model_seq_t q2 = {.kv = s2, .n_new = 2};
    model_batch_t b2 = {.n_seqs = 1, .seqs = &q2};
    assert_int_equal(model_forward(m, &b2, lg, err, sizeof err), -1);
    assert_non_null(strstr(err, "bookkeeping"));
    kvseq_t *s3 = kvseq_new(other, 32, 0);
    assert_int_equal(kvseq_append(s3, many, 2), 0);
    q2.kv = s3;
    assert_int_equal(model_forward(m, &b2, lg, err, sizeof err), -1);
    assert_non_null(strstr(err, "2 layers"));
    model_seq_t twice[2] = {{.kv = s3, .n_new = 1}, {.kv = s3, .n_new = 1}};
    model_batch_t bt = {.n_seqs = 2, .seqs = twice};
    assert_int_equal(model_forward(m, &bt, lg, err, sizeof err), -1);
    assert_non_null(strstr(err, "same sequence"));
    model_batch_t empty = {.n_seqs = 0, .seqs = NULL};
    assert_int_equal(model_forward(m, &empty, lg, err, sizeof err), -1);
    kvseq_destroy(&s3);
    kvseq_destroy(&s2);
    kvseq_destroy(&s);
    free(lg);
    kvpool_destroy(&other);
    kvpool_destroy(&meta_only);
    kvpool_destroy(&pool);
    model_destroy(&m);
    ckpt_destroy(&ck);

    /* An untied config over a file without lm_head.weight is refused, not run with a guess. */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3-f32", s_fixture_root());
    struct stat st;
    if (stat(dir, &st) == 0) {
        assert_int_equal(config_load(dir, &cfg, err, sizeof err), 0);
        cfg.tie_word_embeddings = 0;
        ck = ckpt_open(dir, err, sizeof err);
        assert_non_null(ck);
        assert_null(model_load(dir, &cfg, ck, s_be, NULL, err, sizeof err));
        assert_non_null(strstr(err, "lm_head.weight"));
        ckpt_destroy(&ck);
    } else {
        print_message("(the untied-without-lm_head check needs %s)\n", dir);
    }
}

/* The step metadata's n_single (kernels/backend.h): the leading one-row sequences, which a device
 * backend may run through its decode attention apart from the prompt chunks after them. A spy
 * backend (the CPU's ops with attention wrapped) records what the model passes. */
static const backend_ops_t *s_cpu_ops;
static int s_spy_single = -1, s_spy_rows = -1, s_spy_calls;
static void s_spy_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q, int n_heads, float scale,
                            const bk_attn_meta_t *meta, float *out)
{
    if (s_spy_calls++ && (meta->n_single != s_spy_single || meta->n_tokens != s_spy_rows))
        fail_msg("layer %d: n_single %d of %d rows, another layer had %d of %d", layer, meta->n_single, meta->n_tokens,
                 s_spy_single, s_spy_rows);
    s_spy_single = meta->n_single;
    s_spy_rows = meta->n_tokens;
    s_cpu_ops->attention(be, kv, layer, q, n_heads, scale, meta, out);
}

static void test_single_rows_hint(void **state)
{
    char err[512];
    model_config_t cfg;
    s_parse("{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\"," COMMON_JSON
            "\"num_hidden_layers\":2,\"head_dim\":16,\"tie_word_embeddings\":true}", &cfg);
    s_cpu_ops = s_be->ops;
    backend_ops_t spy_ops = *s_be->ops;
    spy_ops.attention = s_spy_attention;
    backend_t spy = *s_be;                         /* the CPU backend's state, the ops wrapped */
    spy.ops = &spy_ops;
    ckpt_t *ck = ckpt_dummy(DT_F32, 3);
    model_opts_t o = {.max_tokens = 16, .max_seqs = 4, .max_context = 32, .kv_block_size = 4};
    model_t *m = model_load("tiny", &cfg, ck, &spy, &o, err, sizeof err);
    assert_non_null(m);
    kvpool_t *pool = kvpool_new(40, 4, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, DT_F32, &spy, err, sizeof err);
    assert_non_null(pool);
    kvseq_t *s[4];
    const int32_t ids[8] = {5, 9, 14, 2, 77, 31, 8, 60};
    float *lg = malloc((size_t)cfg.vocab_size * 16 * sizeof(float));
    for (int i = 0; i < 4; i++) {   /* each sequence's 8-token prompt: one multi-row sequence, 0 */
        s[i] = kvseq_new(pool, 32, (uint64_t)i);
        assert_int_equal(kvseq_append(s[i], ids, 8), 0);
        model_seq_t q = {.kv = s[i], .n_new = 8};
        model_batch_t b = {.n_seqs = 1, .seqs = &q};
        s_spy_calls = 0;
        assert_int_equal(model_forward(m, &b, lg, err, sizeof err), 0);
        assert_int_equal(s_spy_calls, cfg.num_layers);
        assert_int_equal(s_spy_single, 0);
    }
    /* Then steps of new rows per sequence (0: not in the step), in batch order, and n_single. */
    static const struct { int n_new[4]; int expect; } cases[] = {
        {{1, 8, 0, 0}, 1},    /* a decode row, then a prompt chunk: the colocated step's order */
        {{1, 1, 8, 0}, 2},
        {{1, 1, 1, 0}, 3},    /* decode rows only: all of them */
        {{2, 1, 1, 0}, 0},    /* a two-row sequence first */
        {{1, 3, 1, 1}, 1},    /* one-row sequences after a longer one are not counted */
        {{1, 1, 1, 1}, 4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        model_seq_t q[4];
        int n = 0;
        for (int i = 0; i < 4; i++)
            if (cases[c].n_new[i]) {
                assert_int_equal(kvseq_append(s[i], ids, cases[c].n_new[i]), 0);
                q[n++] = (model_seq_t){.kv = s[i], .n_new = cases[c].n_new[i]};
            }
        model_batch_t b = {.n_seqs = n, .seqs = q};
        s_spy_calls = 0;
        assert_int_equal(model_forward(m, &b, lg, err, sizeof err), 0);
        assert_int_equal(s_spy_calls, cfg.num_layers);
        if (s_spy_single != cases[c].expect)
            fail_msg("case %zu: n_single %d, expected %d", c, s_spy_single, cases[c].expect);
    }
    for (int i = 0; i < 4; i++)
        kvseq_destroy(&s[i]);
    free(lg);
    kvpool_destroy(&pool);
    model_destroy(&m);
    ckpt_destroy(&ck);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_fixture, (void *)"llama-gqa-f32"),
        cmocka_unit_test_prestate(test_fixture, (void *)"llama-tied-bf16"),
        cmocka_unit_test_prestate(test_fixture, (void *)"qwen3-f32"),
        cmocka_unit_test_prestate(test_fixture, (void *)"qwen3-moe-f32"),
        cmocka_unit_test_prestate(test_fixture, (void *)"mixtral-f32"),
        cmocka_unit_test_prestate(test_fixture, (void *)"qwen3-sharded-f32"),
        cmocka_unit_test(test_fixture_others),
        cmocka_unit_test(test_tiny_against_reference),
        cmocka_unit_test(test_rope_inv_freq),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_single_rows_hint),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
