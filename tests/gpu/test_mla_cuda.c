/* tests/gpu/test_mla_cuda.c — DeepSeek-V3 on the CUDA backend against the CPU reference: the
 * fixtures deepseek-v3-f32 (q_lora, YaRN, groups, shared expert) and deepseek-v3-noqlora-bf16 (q_proj,
 * bf16, one group), and kjv-deepseek from TROUPE_MODELS when present. Each model runs a prompt of
 * 40 ids and 24 one-row decode steps on both backends (prefill: MLA over many rows; decode: the
 * absorbed attention of one row over the compressed cache, the sigmoid group routing on the
 * device); every step's logits must have the same argmax and agree within the bounds at
 * s_compare. The ops' own results are compared too: mla_attention (the CUDA-core kernels, and the
 * tensor-core one, the default: TROUPE_CUDA_MLA_MMA) and moe_route_sigmoid on random inputs, ids equal and
 * values close. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/mtp.h"
#include "tests/gpu/model_steps.h"

static double s_relerr(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int s_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

static int s_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One model on both backends. f32 weights: every step within F32_BOUND. bf16 weights (bf16
 * activations in the GEMMs and a bf16 compressed cache): the median step within BF16_MEDIAN, what
 * test_backend_cuda.c allows a bf16 fixture's logits (BF16_ACT_LOGITS), and the worst within
 * BF16_WORST. Measured on one H200 (2026-12-02): deepseek-v3-f32 worst 2.0e-6;
 * deepseek-v3-noqlora-bf16 median 1.4e-2, worst 6.6e-2 (the first decode step: the random fixture's
 * logits are small there, so the same absolute rounding is a larger share of them). A wrong
 * kernel is an error of order 1 and moves the argmax, which must agree at every step. */
#define F32_BOUND 1e-4
#define BF16_MEDIAN 3e-2
#define BF16_WORST 1e-1

static void s_compare(const char *dir)
{
    char err[512];
    if (access(dir, R_OK) != 0) {
        print_message("SKIP %s: absent\n", dir);
        return;
    }
    model_config_t cfg;
    if (config_load(dir, &cfg, err, sizeof err) != 0)
        fail_msg("%s", err);
    ckpt_t *ck = ckpt_open(dir, err, sizeof err);
    if (!ck)
        fail_msg("%s", err);
    backend_t *cpu = backend_cpu_new(0);
    const model_opts_t o = {.max_tokens = 64, .max_seqs = 1, .max_context = 128, .kv_block_size = 16};
    enum { STEPS = 24 };
    const int V = cfg.vocab_size;
    float *a = model_steps(cpu, dir, &cfg, ck, &o, 40, STEPS, NULL);
    float *b = model_steps(s_gpu, dir, &cfg, ck, &o, 40, STEPS, NULL);
    double e[STEPS + 1], worst = 0;
    int argmax_bad = -1;
    for (int s = 0; s <= STEPS; s++) {
        e[s] = s_relerr(b + (size_t)s * V, a + (size_t)s * V, (size_t)V);
        worst = e[s] > worst ? e[s] : worst;
        print_message("  %s step %2d (%s): rel err %.2e\n", dir, s, s == 0 ? "prefill" : "decode", e[s]);
        if (argmax_bad < 0 && s_argmax(b + (size_t)s * V, V) != s_argmax(a + (size_t)s * V, V))
            argmax_bad = s;
    }
    qsort(e, STEPS + 1, sizeof e[0], s_cmp_double);
    const double median = e[STEPS / 2];
    print_message("%s: CUDA vs CPU logits relative error median %.2e, worst %.2e over a 40-token prefill and %d "
                  "decode steps\n", dir, median, worst, STEPS);
    if (argmax_bad >= 0)
        fail_msg("%s step %d: CUDA argmax %d, CPU %d", dir, argmax_bad, s_argmax(b + (size_t)argmax_bad * V, V),
                 s_argmax(a + (size_t)argmax_bad * V, V));
    if (cfg.dtype == DT_F32) {
        if (!(worst <= F32_BOUND))
            fail_msg("%s (f32): worst relative error %.3g exceeds %.0e", dir, worst, F32_BOUND);
    } else if (!(median <= BF16_MEDIAN && worst <= BF16_WORST)) {
        fail_msg("%s (bf16): relative error median %.3g, worst %.3g exceed %.0e, %.0e", dir, median, worst,
                 BF16_MEDIAN, BF16_WORST);
    }
    free(a);
    free(b);
    backend_destroy(&cpu);
    ckpt_destroy(&ck);
}

static void test_fixtures(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/deepseek-v3-f32", gpu_fixture_root());
    s_compare(dir);
    snprintf(dir, sizeof dir, "%s/deepseek-v3-noqlora-bf16", gpu_fixture_root());
    s_compare(dir);
    const char *root = getenv("TROUPE_MODELS");
    snprintf(dir, sizeof dir, "%s/kjv-deepseek", root && *root ? root : "../shared/models");
    s_compare(dir);
}

/* One mla_attention call's output [T][n_heads][kv_lora] on be: the same cache bytes, block
 * tables and queries uploaded to it. */
typedef struct attn_case {
    dtype_t dt;
    int bs, n_heads, T, n_seqs;
    const int32_t *seq, *pos;     /* [T] */
    int lora, rope;               /* kv_lora_rank, qk_rope_head_dim */
    float scale;
} attn_case_t;

enum { A_LORA = 512, A_ROPE = 64, A_LAYERS = 2, A_LAYER = 1 };

static float *s_attn_run(backend_t *be, const attn_case_t *c, const void *cache, size_t cache_bytes, int n_blocks,
                         const int32_t *bt_start, const int32_t *bt, int n_bt, const float *ql, const float *qp)
{
    const backend_ops_t *op = be->ops;
    const int L = c->lora, R = c->rope;
    const size_t nq = (size_t)c->T * c->n_heads, out_bytes = nq * L * sizeof(float);
    bk_kv_t kv = {.dtype = c->dt, .n_blocks = n_blocks, .block_size = c->bs, .n_layers = A_LAYERS, .n_kv_heads = 1,
                  .head_dim = (L + R) / 2, .block_bytes = (size_t)A_LAYERS * c->bs * (L + R) * dtype_size(c->dt)};
    kv.base = op->alloc(be, cache_bytes);
    int32_t *d_seq = op->alloc(be, (size_t)c->T * 4), *d_pos = op->alloc(be, (size_t)c->T * 4),
            *d_bts = op->alloc(be, (size_t)c->n_seqs * 4), *d_bt = op->alloc(be, (size_t)n_bt * 4);
    float *d_ql = op->alloc(be, nq * L * 4), *d_qp = op->alloc(be, nq * R * 4), *d_out = op->alloc(be, out_bytes);
    float *out = malloc(out_bytes);
    assert_non_null(out);
    for (size_t i = 0; i < nq * L; i++)
        out[i] = NAN;                              /* an output the op does not write fails the check */
    assert_int_equal(op->upload(be, kv.base, cache, cache_bytes), 0);
    assert_int_equal(op->upload(be, d_seq, c->seq, (size_t)c->T * 4), 0);
    assert_int_equal(op->upload(be, d_pos, c->pos, (size_t)c->T * 4), 0);
    assert_int_equal(op->upload(be, d_bts, bt_start, (size_t)c->n_seqs * 4), 0);
    assert_int_equal(op->upload(be, d_bt, bt, (size_t)n_bt * 4), 0);
    assert_int_equal(op->upload(be, d_ql, ql, nq * L * 4), 0);
    assert_int_equal(op->upload(be, d_qp, qp, nq * R * 4), 0);
    assert_int_equal(op->upload(be, d_out, out, out_bytes), 0);
    const bk_attn_meta_t meta = {.n_tokens = c->T, .n_seqs = c->n_seqs, .tok_seq = d_seq, .tok_pos = d_pos,
                                 .seq_bt_start = d_bts, .block_table = d_bt};
    op->mla_attention(be, &kv, A_LAYER, d_ql, d_qp, c->n_heads, L, R, c->scale, &meta, d_out);
    assert_int_equal(op->download(be, out, d_out, out_bytes), 0);
    op->free(be, kv.base);
    op->free(be, d_seq);
    op->free(be, d_pos);
    op->free(be, d_bts);
    op->free(be, d_bt);
    op->free(be, d_ql);
    op->free(be, d_qp);
    op->free(be, d_out);
    return out;
}

static float s_rand(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int)(*r >> 40) % 2000 - 1000) / 1000.0f;
}

/* One mla_attention case on the CPU and on gpu: random cache values (never zeros) and queries,
 * each sequence's blocks numbered backwards (tables are not the identity). Returns the worst
 * (row, head) relative error of gpu's output against the CPU's (NaN if any is NaN). */
static double s_attn_case(backend_t *cpu, backend_t *gpu, const attn_case_t *c, uint64_t seed)
{
    const int L = c->lora, R = c->rope, W = L + R;
    int32_t bt_start[64], bt[512];
    int n_bt = 0;
    assert_true(c->n_seqs <= 64);
    for (int s = 0; s < c->n_seqs; s++) {
        int max_pos = 0;
        for (int t = 0; t < c->T; t++)
            max_pos = c->seq[t] == s && c->pos[t] > max_pos ? c->pos[t] : max_pos;
        bt_start[s] = n_bt;
        n_bt += max_pos / c->bs + 1;
    }
    assert_true(n_bt <= 512);
    for (int i = 0; i < n_bt; i++)
        bt[i] = n_bt - 1 - i;
    const size_t block_bytes = (size_t)A_LAYERS * c->bs * W * dtype_size(c->dt);
    const size_t n_el = (size_t)n_bt * A_LAYERS * c->bs * W, nq = (size_t)c->T * c->n_heads;
    float *f = malloc(n_el * 4), *ql = malloc(nq * L * 4), *qp = malloc(nq * R * 4);
    void *cache = malloc((size_t)n_bt * block_bytes);
    assert_true(f && ql && qp && cache);
    uint64_t r = seed;
    for (size_t i = 0; i < n_el; i++)
        f[i] = s_rand(&r);
    for (size_t i = 0; i < nq * L; i++)
        ql[i] = 4.0f * s_rand(&r);                 /* scores of a few units: the max matters */
    for (size_t i = 0; i < nq * R; i++)
        qp[i] = 4.0f * s_rand(&r);
    dtype_from_f32(c->dt, f, cache, n_el);
    float *a = s_attn_run(cpu, c, cache, (size_t)n_bt * block_bytes, n_bt, bt_start, bt, n_bt, ql, qp);
    float *b = s_attn_run(gpu, c, cache, (size_t)n_bt * block_bytes, n_bt, bt_start, bt, n_bt, ql, qp);
    double worst = 0;
    for (size_t i = 0; i < nq; i++) {
        const double e = s_relerr(b + i * L, a + i * L, (size_t)L);
        worst = e > worst || e != e ? e : worst;
    }
    free(a);
    free(b);
    free(f);
    free(ql);
    free(qp);
    free(cache);
    return worst;
}

/* mla_attention at DeepSeek's shape (kv_lora 512, rope 64) over 1,000+ keys: decode rows of
 * sequences of very different lengths (1 key: the other key ranges are empty; ranges ending
 * mid-tile), a prefill-shaped call of 40 rows, 16 heads (one group a block) and 20 (a partial
 * second group), block sizes 16 and 64, f32 / bf16 / fp8 caches. The cache holds the same bits on
 * both backends, so only the summation order differs: relative error within 1e-5. */
static backend_t *s_gpu_env(const char *n1, const char *v1, const char *n2, const char *v2);   /* below */

static void test_attention(void **state)
{
    (void)state;
    /* the CUDA-core kernels (f32 sums): the tensor-core one, the default, has test_attention_mma */
    backend_t *cpu = backend_cpu_new(0), *cc = s_gpu_env("TROUPE_CUDA_MLA_MMA", "0", NULL, NULL);
    static const int32_t dec_seq[] = {0, 1, 2, 3}, dec_pos[] = {1036, 0, 517, 1200};
    int32_t pre_seq[40], pre_pos[40];
    for (int i = 0; i < 40; i++) {
        pre_seq[i] = 0;
        pre_pos[i] = 1000 + i;
    }
    const dtype_t dts[] = {DT_F32, DT_BF16, DT_F8E4M3};
    const int bss[] = {16, 64}, heads[] = {16, 20};
    const float sc = 1.0f / sqrtf(192.0f);
    for (int di = 0; di < 3; di++)
        for (int bi = 0; bi < 2; bi++)
            for (int hi = 0; hi < 2; hi++)
                for (int shape = 0; shape < 2; shape++) {
                    const attn_case_t c = shape == 0 ? (attn_case_t){dts[di], bss[bi], heads[hi], 4, 4, dec_seq, dec_pos, A_LORA, A_ROPE, sc}
                                                     : (attn_case_t){dts[di], bss[bi], heads[hi], 40, 1, pre_seq, pre_pos, A_LORA, A_ROPE, sc};
                    const double worst = s_attn_case(cpu, cc, &c, 777 + (uint64_t)(di * 8 + bi * 4 + hi * 2 + shape));
                    print_message("  mla_attention %s bs %d heads %d %s: worst (row, head) rel err %.2e\n",
                                  dtype_name(c.dt), c.bs, c.n_heads, shape == 0 ? "decode x4" : "prefill x40", worst);
                    if (!(worst <= 1e-5))
                        fail_msg("mla_attention %s bs %d heads %d %s: rel err %.3g exceeds 1e-5", dtype_name(c.dt), c.bs,
                                 c.n_heads, shape == 0 ? "decode" : "prefill", worst);
                }
    backend_destroy(&cc);
    backend_destroy(&cpu);
}

/* moe_route_sigmoid on random logits and biases: the same ids, weights within 1e-6. levels > 0
 * draws the logits from that many values only, so that equal choice values (and the 0.0 of the
 * dropped groups, below the negative biases' experts) test the ties to the lower expert. */
static void s_route_case(backend_t *cpu, int M, int E, int k, int G, int TG, int renorm, int levels)
{
    const size_t nl = (size_t)M * E, nk = (size_t)M * k;
    float *lg = malloc(nl * 4), *bias = malloc((size_t)E * 4), *w_a = malloc(nk * 4), *w_b = malloc(nk * 4);
    int32_t *id_a = malloc(nk * 4), *id_b = malloc(nk * 4);
    assert_true(lg && bias && w_a && w_b && id_a && id_b);
    uint64_t r = 12345 + (uint64_t)E;
    for (size_t i = 0; i < nl; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int v = (int)(r >> 40) % 2000;
        lg[i] = levels > 0 ? (float)(v % levels - levels / 2) / 2.0f : (float)(v - 1000) / 250.0f;
    }
    for (int e = 0; e < E; e++)
        bias[e] = (float)((e * 37) % 17 - 8) / 40.0f;
    cpu->ops->moe_route_sigmoid(cpu, lg, bias, M, E, k, G, TG, renorm, 2.5f, id_a, w_a);
    float *d_lg = s_gpu->ops->alloc(s_gpu, nl * 4), *d_bias = s_gpu->ops->alloc(s_gpu, (size_t)E * 4),
          *d_w = s_gpu->ops->alloc(s_gpu, nk * 4);
    int32_t *d_id = s_gpu->ops->alloc(s_gpu, nk * 4);
    s_gpu->ops->upload(s_gpu, d_lg, lg, nl * 4);
    s_gpu->ops->upload(s_gpu, d_bias, bias, (size_t)E * 4);
    s_gpu->ops->moe_route_sigmoid(s_gpu, d_lg, d_bias, M, E, k, G, TG, renorm, 2.5f, d_id, d_w);
    s_gpu->ops->download(s_gpu, id_b, d_id, nk * 4);
    s_gpu->ops->download(s_gpu, w_b, d_w, nk * 4);
    for (size_t i = 0; i < nk; i++)
        if (id_a[i] != id_b[i])
            fail_msg("route M %d E %d k %d groups %d/%d levels %d: row %zu pick %zu: CUDA expert %d, CPU %d", M, E, k,
                     TG, G, levels, i / k, i % k, id_b[i], id_a[i]);
    for (size_t i = 0; i < nk; i++)
        assert_true(fabsf(w_a[i] - w_b[i]) <= 1e-6f * fabsf(w_a[i]) + 1e-7f);
    s_gpu->ops->free(s_gpu, d_lg);
    s_gpu->ops->free(s_gpu, d_bias);
    s_gpu->ops->free(s_gpu, d_w);
    s_gpu->ops->free(s_gpu, d_id);
    free(lg);
    free(bias);
    free(w_a);
    free(w_b);
    free(id_a);
    free(id_b);
}

/* Shapes: 64 experts in 8 groups; DeepSeek-V3's 256 / top-8 / 4 of 8 groups; V2-Lite's 64 / top-6
 * in one group; 1,024 experts (32 a lane) in 64 groups; rows not a multiple of the rows a block. */
static void test_route(void **state)
{
    (void)state;
    backend_t *cpu = backend_cpu_new(1);
    s_route_case(cpu, 37, 64, 6, 8, 3, 1, 0);
    s_route_case(cpu, 37, 64, 6, 8, 3, 1, 5);
    s_route_case(cpu, 65, 256, 8, 8, 4, 1, 0);
    s_route_case(cpu, 65, 256, 8, 8, 4, 0, 7);
    s_route_case(cpu, 3, 64, 6, 1, 1, 0, 0);
    s_route_case(cpu, 3, 64, 6, 1, 1, 1, 3);
    s_route_case(cpu, 9, 1024, 40, 64, 40, 1, 0);
    s_route_case(cpu, 9, 1024, 40, 64, 40, 1, 4);
    backend_destroy(&cpu);
}

/* mtp_top on random rows: the CPU's ids exactly (ties to the lower index: levels > 0 draws each
 * value from that many only), probabilities within the rounding of the device's f32 sum of
 * positive terms (a thread's ceil(N / 256) terms in a row, then 8 + 5 levels of the block's
 * reduction: that many additions' relative error, 2^-24 each, doubled for expf's own ulps)
 * of the CPU's, which sums in double (on one H200 a CPU sum in f32 index order was 1.9e-5 away at
 * N = 4,096 with many equal terms, outside 1e-5);
 * NaN entries skipped, an all-NaN row id 0 and probability 0. Vocabularies of kjv-deepseek
 * (4,096), DeepSeek-V3 (129,280) and one below a warp. */
static void s_top_case(backend_t *cpu, int M, int N, int levels, int nans)
{
    const size_t n = (size_t)M * N;
    float *x = malloc(n * 4), *p_a = malloc((size_t)M * 4), *p_b = malloc((size_t)M * 4);
    int32_t *i_a = malloc((size_t)M * 4), *i_b = malloc((size_t)M * 4);
    assert_true(x && p_a && p_b && i_a && i_b);
    uint64_t r = 99 + (uint64_t)N;
    for (size_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int v = (int)(r >> 40) % 4000;
        x[i] = levels > 0 ? (float)(v % levels) : (float)(v - 2000) / 200.0f;
        if (nans && v % 97 == 0)
            x[i] = NAN;
    }
    if (nans)
        for (int j = 0; j < N; j++)
            x[(size_t)(M - 1) * N + j] = NAN;      /* the last row all NaN */
    cpu->ops->mtp_top(cpu, x, M, N, i_a, p_a);
    float *d_x = s_gpu->ops->alloc(s_gpu, n * 4), *d_p = s_gpu->ops->alloc(s_gpu, (size_t)M * 4);
    int32_t *d_i = s_gpu->ops->alloc(s_gpu, (size_t)M * 4);
    for (int m = 0; m < M; m++) {
        p_b[m] = -1.0f;                            /* a row the op does not write fails */
        i_b[m] = -1;
    }
    s_gpu->ops->upload(s_gpu, d_x, x, n * 4);
    s_gpu->ops->upload(s_gpu, d_p, p_b, (size_t)M * 4);
    s_gpu->ops->upload(s_gpu, d_i, i_b, (size_t)M * 4);
    s_gpu->ops->mtp_top(s_gpu, d_x, M, N, d_i, d_p);
    assert_int_equal(s_gpu->ops->download(s_gpu, i_b, d_i, (size_t)M * 4), 0);
    assert_int_equal(s_gpu->ops->download(s_gpu, p_b, d_p, (size_t)M * 4), 0);
    const double bound = 2.0 * ((N + 255) / 256 + 8 + 5) * ldexp(1.0, -24);
    for (int m = 0; m < M; m++) {
        if (i_a[m] != i_b[m])
            fail_msg("mtp_top M %d N %d levels %d: row %d CUDA id %d, CPU %d", M, N, levels, m, i_b[m], i_a[m]);
        if (!(fabs((double)p_a[m] - p_b[m]) <= bound * p_a[m] + 1e-30))
            fail_msg("mtp_top M %d N %d levels %d: row %d CUDA prob %.9g, CPU %.9g", M, N, levels, m, p_b[m], p_a[m]);
    }
    if (nans)
        assert_true(i_a[M - 1] == 0 && p_a[M - 1] == 0.0f);
    s_gpu->ops->free(s_gpu, d_x);
    s_gpu->ops->free(s_gpu, d_p);
    s_gpu->ops->free(s_gpu, d_i);
    free(x);
    free(p_a);
    free(p_b);
    free(i_a);
    free(i_b);
}

static void test_mtp_top(void **state)
{
    (void)state;
    backend_t *cpu = backend_cpu_new(1);
    s_top_case(cpu, 7, 4096, 0, 0);
    s_top_case(cpu, 7, 4096, 3, 0);
    s_top_case(cpu, 5, 4096, 0, 1);
    s_top_case(cpu, 3, 129280, 0, 1);
    s_top_case(cpu, 3, 129280, 50, 0);
    s_top_case(cpu, 9, 21, 0, 1);
    backend_destroy(&cpu);
}

/* MTP steps through graphs (engine/mtp.c) on kjv-deepseek: two sequences take the same one-row
 * step four times (append, model_mtp_forward with top_prob, truncate): the first runs
 * uncaptured, the second records, the last two replay; every run's drafts, probabilities and
 * MTP outputs must equal the first's bit for bit, and a graph must have been recorded and
 * replayed. The drafts equal the CPU's and the probabilities agree within 2e-2 (bf16 weights). */
static void test_mtp_graph(void **state)
{
    (void)state;
    const char *root = getenv("TROUPE_MODELS");
    char dir[4096], err[512];
    snprintf(dir, sizeof dir, "%s/kjv-deepseek", root && *root ? root : "../shared/models");
    if (access(dir, R_OK) != 0) {
        print_message("SKIP %s: absent\n", dir);
        return;
    }
    model_config_t cfg;
    if (config_load(dir, &cfg, err, sizeof err) != 0)
        fail_msg("%s", err);
    ckpt_t *ck = ckpt_open(dir, err, sizeof err);
    if (!ck)
        fail_msg("%s", err);
    backend_t *cpu = backend_cpu_new(0);
    backend_t *bes[2] = {cpu, s_gpu};
    enum { B = 2, PRE = 6, RUNS = 4 };
    const int H = cfg.hidden_size;
    const model_opts_t o = {.max_tokens = 64, .max_seqs = 4, .max_context = 128, .kv_block_size = 16};
    float *hid = malloc((size_t)B * PRE * H * 4), *out[2][RUNS], prob[2][RUNS][B];
    int32_t ids[2][RUNS][B];
    uint64_t r = 7;
    for (size_t i = 0; i < (size_t)B * PRE * H; i++)
        hid[i] = s_rand(&r);
    for (int e = 0; e < 2; e++) {
        model_t *m = model_load(dir, &cfg, ck, bes[e], &o, err, sizeof err);
        if (!m)
            fail_msg("%s", err);
        assert_true(model_has_mtp(m));
        kvpool_t *pool = model_mtp_pool_new(m, 16, 16, DT_F32, err, sizeof err);
        if (!pool)
            fail_msg("%s", err);
        kvseq_t *kv[B];
        model_seq_t q[B];
        for (int s = 0; s < B; s++) {
            kv[s] = kvseq_new(pool, 64, 0);
            int32_t t[PRE];
            for (int i = 0; i < PRE; i++)
                t[i] = (s * 101 + i * 37 + 5) % cfg.vocab_size;
            assert_int_equal(kvseq_append(kv[s], t, PRE), 0);
            q[s] = (model_seq_t){.kv = kv[s], .n_new = PRE};
        }
        int32_t pre_ids[B];
        float pre_prob[B], *pre_out = malloc((size_t)B * PRE * H * 4);
        model_batch_t b = {.n_seqs = B, .seqs = q, .argmax_out = pre_ids};
        if (model_mtp_forward(m, &b, hid, NULL, pre_out, pre_prob, err, sizeof err) < 0)
            fail_msg("model_mtp_forward: %s", err);
        uint64_t rec0 = 0, rep0 = 0, rec1 = 0, rep1 = 0;
        model_graph_stats(m, &rec0, &rep0);
        for (int run = 0; run < RUNS; run++) {
            float h1[B * 256];
            assert_true(H <= 256);
            for (int s = 0; s < B; s++) {
                assert_int_equal(kvseq_append(kv[s], &pre_ids[s], 1), 0);
                q[s].n_new = 1;
                memcpy(h1 + (size_t)s * H, pre_out + ((size_t)s * PRE + PRE - 1) * H, (size_t)H * 4);
            }
            out[e][run] = malloc((size_t)B * H * 4);
            b.argmax_out = ids[e][run];
            if (model_mtp_forward(m, &b, h1, NULL, out[e][run], prob[e][run], err, sizeof err) < 0)
                fail_msg("model_mtp_forward: %s", err);
            for (int s = 0; s < B; s++)
                assert_int_equal(kvseq_truncate(kv[s], PRE), 0);
        }
        model_graph_stats(m, &rec1, &rep1);
        print_message("%s: MTP one-row steps of %d sequences: %llu graphs recorded, %llu replays\n", bes[e]->ops->name,
                      B, (unsigned long long)(rec1 - rec0), (unsigned long long)(rep1 - rep0));
        if (e == 1 && !(rec1 - rec0 == 1 && rep1 - rep0 == RUNS - 1))
            fail_msg("CUDA: %llu MTP graphs recorded and %llu replays in %d runs (expected 1 and %d)",
                     (unsigned long long)(rec1 - rec0), (unsigned long long)(rep1 - rep0), RUNS, RUNS - 1);
        for (int run = 1; run < RUNS; run++)
            for (int s = 0; s < B; s++) {
                assert_int_equal(ids[e][run][s], ids[e][0][s]);
                assert_true(prob[e][run][s] == prob[e][0][s]);
                assert_memory_equal(out[e][run], out[e][0], (size_t)B * H * 4);
            }
        free(pre_out);
        for (int s = 0; s < B; s++)
            kvseq_destroy(&kv[s]);
        kvpool_destroy(&pool);
        model_destroy(&m);
    }
    for (int s = 0; s < B; s++) {
        print_message("sequence %d: draft %d (CPU %d), probability %.5f (CPU %.5f)\n", s, ids[1][0][s], ids[0][0][s],
                      prob[1][0][s], prob[0][0][s]);
        assert_int_equal(ids[1][0][s], ids[0][0][s]);
        assert_true(fabsf(prob[1][0][s] - prob[0][0][s]) <= 2e-2f);
    }
    for (int e = 0; e < 2; e++)
        for (int run = 0; run < RUNS; run++)
            free(out[e][run]);
    free(hid);
    backend_destroy(&cpu);
    ckpt_destroy(&ck);
}

/* head_matmul on random inputs against the CPU: f32 / bf16 / f16 weights; DeepSeek-V3's q
 * absorption (128 heads, K 128 into N 512: x rows with a stride past the heads) and latent output
 * (K 512 into N 128), V2-Lite's 16 heads, kjv-deepseek's 4, row counts of one, a partial block of
 * rows and many blocks; relative error within 1e-5 (the same products, summed in another order).
 * The output is poisoned first, and the columns past each head's N are checked untouched. */
static void s_head_case(backend_t *cpu, dtype_t dt, int M, int nH, int N, int K, int x_pad)
{
    const int x_head = K, x_stride = nH * K + x_pad, y_head = N + 3, y_stride = nH * y_head;
    const size_t nx = (size_t)M * x_stride, nw = (size_t)nH * N * K, ny = (size_t)M * y_stride;
    float *x = malloc(nx * 4), *wf = malloc(nw * 4), *ya = malloc(ny * 4), *yb = malloc(ny * 4);
    void *wd = malloc(nw * 4);
    assert_true(x && wf && ya && yb && wd);
    uint64_t r = 5 + (uint64_t)M * 31 + (uint64_t)K;
    for (size_t i = 0; i < nx; i++)
        x[i] = s_rand(&r);
    for (size_t i = 0; i < nw; i++)
        wf[i] = s_rand(&r);
    for (size_t i = 0; i < nw; i++) {
        if (dt == DT_F32)
            ((float *)wd)[i] = wf[i];
        else if (dt == DT_BF16)
            ((uint16_t *)wd)[i] = f32_to_bf16(wf[i]);
        else
            ((uint16_t *)wd)[i] = f32_to_f16(wf[i]);
    }
    for (size_t i = 0; i < ny; i++)
        ya[i] = yb[i] = NAN;
    const size_t wbytes = nw * dtype_size(dt);
    bk_mat_t wc = {.data = wd, .dtype = dt, .rows = (int64_t)nH * N, .cols = K};
    cpu->ops->head_matmul(cpu, x, M, nH, x_stride, x_head, &wc, ya, y_stride, y_head);
    float *d_x = s_gpu->ops->alloc(s_gpu, nx * 4), *d_y = s_gpu->ops->alloc(s_gpu, ny * 4);
    void *d_w = s_gpu->ops->alloc(s_gpu, wbytes);
    s_gpu->ops->upload(s_gpu, d_x, x, nx * 4);
    s_gpu->ops->upload(s_gpu, d_w, wd, wbytes);
    s_gpu->ops->upload(s_gpu, d_y, yb, ny * 4);
    bk_mat_t wg = wc;
    wg.data = d_w;
    s_gpu->ops->head_matmul(s_gpu, d_x, M, nH, x_stride, x_head, &wg, d_y, y_stride, y_head);
    assert_int_equal(s_gpu->ops->download(s_gpu, yb, d_y, ny * 4), 0);
    double num = 0, den = 0;
    for (int m = 0; m < M; m++)
        for (int h = 0; h < nH; h++)
            for (int n = 0; n < y_head; n++) {
                const size_t i = (size_t)m * y_stride + (size_t)h * y_head + n;
                if (n >= N) {                      /* past the head's outputs: never written */
                    if (!isnan(yb[i]))
                        fail_msg("head_matmul M %d heads %d N %d K %d: column %d of head %d written", M, nH, N, K, n, h);
                    continue;
                }
                if (isnan(yb[i]))
                    fail_msg("head_matmul M %d heads %d N %d K %d: output (%d, %d, %d) not written", M, nH, N, K, m, h, n);
                num += ((double)yb[i] - ya[i]) * ((double)yb[i] - ya[i]);
                den += (double)ya[i] * ya[i];
            }
    const double e = sqrt(num / den);
    print_message("head_matmul %s M %d heads %d N %d K %d: rel err %.2e\n", dtype_name(dt), M, nH, N, K, e);
    assert_true(e <= 1e-5);
    s_gpu->ops->free(s_gpu, d_x);
    s_gpu->ops->free(s_gpu, d_y);
    s_gpu->ops->free(s_gpu, d_w);
    free(x);
    free(wf);
    free(ya);
    free(yb);
    free(wd);
}

static void test_head_matmul(void **state)
{
    (void)state;
    backend_t *cpu = backend_cpu_new(0);
    s_head_case(cpu, DT_BF16, 1, 128, 512, 128, 64);
    s_head_case(cpu, DT_BF16, 13, 128, 128, 512, 0);
    s_head_case(cpu, DT_F32, 64, 16, 512, 128, 64);
    s_head_case(cpu, DT_F16, 3, 16, 128, 512, 0);
    s_head_case(cpu, DT_BF16, 37, 4, 64, 32, 16);
    s_head_case(cpu, DT_F32, 1, 4, 32, 64, 0);
    backend_destroy(&cpu);
}

/* ---- mla_prefill: the decompressed form for prompt chunks ------------------------------------------ */

/* Sets (value NULL: unsets) environment variable name, keeping its old value in keep (have: set). */
static void s_env_swap(const char *name, const char *value, char keep[64], int *have)
{
    const char *old = getenv(name);
    *have = old != NULL;
    snprintf(keep, 64, "%s", old ? old : "");
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* A CUDA backend made with environment variables n1 = v1 and n2 = v2 (a value NULL: unset; n2 NULL:
 * none; the knobs are read at creation), the variables restored after. */
static backend_t *s_gpu_env(const char *n1, const char *v1, const char *n2, const char *v2)
{
    char err[512], k1[64], k2[64];
    int h1, h2;
    s_env_swap(n1, v1, k1, &h1);
    if (n2)
        s_env_swap(n2, v2, k2, &h2);
    backend_t *be = backend_new("cuda", 0, err, sizeof err);
    int unused;
    char tmp[64];
    s_env_swap(n1, h1 ? k1 : NULL, tmp, &unused);
    if (n2)
        s_env_swap(n2, h2 ? k2 : NULL, tmp, &unused);
    if (!be)
        fail_msg("%s", err);
    return be;
}

/* TROUPE_CUDA_MLA_PREFILL = mode and TROUPE_CUDA_MLA_PREFILL_KEYS = keys. */
static backend_t *s_gpu_knobs(const char *mode, const char *keys)
{
    return s_gpu_env("TROUPE_CUDA_MLA_PREFILL", mode, "TROUPE_CUDA_MLA_PREFILL_KEYS", keys);
}

static backend_t *s_gpu_mode(const char *mode) { return s_gpu_knobs(mode, NULL); }

/* ---- mla_attention on the tensor cores (TROUPE_CUDA_MLA_MMA, cuda_mla_decode_mma.cu) ------------------ */

/* Bounds for the tensor-core kernel against the CPU, per (row, head): q is rounded to 16 bits once,
 * each p before P V. A relative rounding error e of q moves a score (raw dot product of 576
 * products, q up to 4, cache values up to 1: RMS ~32) by ~sqrt(576 (16/3)(1/3)) e_rms, times
 * scale 1/sqrt(192): 2.6e-3 for bf16 (e_rms = 2^-9 / sqrt 3), so each p is off by that factor
 * relatively, p's own rounding adds 1.1e-3; the output's relative error is about that RMS,
 * ~3e-3, and its 512 dims average the per-key noise. f16 (the fp8 cache's mma type) has 2^-11:
 * ~4x less. A CPU emulation of the kernel's arithmetic (64-key tiles, q and p rounded, f32
 * scores and sums) on these inputs, against a double-precision softmax, 40 heads at 1 to 1,201
 * keys (2026-12-03): bf16 RMS 2.2-3.2e-3, worst 6.8e-3; f16 RMS 2.9-3.8e-4, worst 7.1e-4; kjv's
 * shape 3.6e-3 and 4.4e-4 worst. The bounds allow ~2x (bf16) and ~4x (f16) that worst: the test
 * draws more (row, head) pairs than the emulation did. A dropped or repeated key among n moves the
 * output by ~1 / sqrt(n) relative (3e-2 at n = 1,000), a wrong mask, fragment or tile by O(1). */
#define MMA_BF16_BOUND 1.5e-2
#define MMA_F16_BOUND 3e-3

/* The tensor-core kernel with TROUPE_CUDA_MLA_MMA=2, so that a shape it refused would be fatal
 * rather than quietly run by k_mla_split: DeepSeek-V2-Lite's heads (16: one m16 tile), 40 (two
 * groups and a partial third, V3's 128 in miniature) and kjv-deepseek's (4 heads, kv_lora 64, rope
 * 16); bf16 and fp8 caches; a batch of 1 at 1,201 keys (split over up to 64 ranges: most of a
 * range's tile masked), 6 decode rows of 1, 15, 64, 1,037, 518 and 128 keys (lengths at, below and
 * past a 64-key tile; ranges that are empty), and 4 rows of one sequence (a verify step's shape);
 * split (the default rule) and unsplit (TROUPE_CUDA_ATTN_SPLIT=0: one range, out written
 * directly). */
static void test_attention_mma(void **state)
{
    (void)state;
    backend_t *cpu = backend_cpu_new(0);
    backend_t *gpus[2] = {s_gpu_env("TROUPE_CUDA_MLA_MMA", "2", "TROUPE_CUDA_ATTN_SPLIT", NULL),
                          s_gpu_env("TROUPE_CUDA_MLA_MMA", "2", "TROUPE_CUDA_ATTN_SPLIT", "0")};
    static const int32_t one_seq[] = {0}, one_pos[] = {1200};
    static const int32_t dec_seq[] = {0, 1, 2, 3, 4, 5}, dec_pos[] = {0, 14, 63, 1036, 517, 127};
    static const int32_t ver_seq[] = {0, 0, 0, 0}, ver_pos[] = {97, 98, 99, 100};
    static const struct {
        const char *name;
        int n_heads, lora, rope;
        float scale;
    } heads[] = {
        {"V2-Lite heads", 16, 512, 64, 0.07216878f},   /* 1 / sqrt(192) */
        {"40 heads", 40, 512, 64, 0.07216878f},
        {"kjv-deepseek heads", 4, 64, 16, 0.14433757f}, /* 1 / sqrt(48) */
    };
    static const dtype_t dts[] = {DT_BF16, DT_F8E4M3};
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
        for (int di = 0; di < 2; di++)
            for (int rows = 0; rows < 3; rows++)
                for (int split = 0; split < 2; split++) {
                    const int bs = di == 0 ? 16 : 64;
                    attn_case_t c = {dts[di], bs, heads[hi].n_heads, 1, 1, one_seq, one_pos, heads[hi].lora,
                                     heads[hi].rope, heads[hi].scale};
                    if (rows == 1)
                        c.T = c.n_seqs = 6, c.seq = dec_seq, c.pos = dec_pos;
                    else if (rows == 2)
                        c.T = 4, c.seq = ver_seq, c.pos = ver_pos;
                    static const char *row_names[] = {"batch 1, 1,201 keys", "6 decode rows", "4 rows of one sequence"};
                    const double bound = dts[di] == DT_BF16 ? MMA_BF16_BOUND : MMA_F16_BOUND;
                    const double worst =
                        s_attn_case(cpu, gpus[split], &c, 4242 + (uint64_t)(hi * 16 + di * 8 + rows * 2 + split));
                    print_message("  mla_attention (tensor cores) %s, %s, %s, %s: worst (row, head) rel err %.2e\n",
                                  heads[hi].name, dtype_name(c.dt), row_names[rows], split ? "unsplit" : "split", worst);
                    if (!(worst <= bound))
                        fail_msg("mla_attention (tensor cores) %s, %s, %s, %s: rel err %.3g exceeds %.0e",
                                 heads[hi].name, dtype_name(c.dt), row_names[rows], split ? "unsplit" : "split", worst,
                                 bound);
                }
    backend_destroy(&gpus[0]);
    backend_destroy(&gpus[1]);
    backend_destroy(&cpu);
}

/* One head configuration and one call: T rows of sequence 1 of two (the other's table first, so
 * the sequence index matters) at positions p0 .. p0 + T - 1, keys 0 .. p0 + T - 1 in the cache. */
typedef struct pf_case {
    const char *name;
    int nH, r, dr, dn, dv;
    int T, p0, bs;
    dtype_t dt;                   /* the cache's */
    float scale;
} pf_case_t;

/* The case's inputs, host (the same bytes go to every backend). */
typedef struct pf_in {
    void *cache;
    size_t cache_bytes;
    int n_blocks, n_bt;
    int32_t bt_start[2], bt[256], seq[512], pos[512];
    uint16_t *w_uk_t, *w_uv;      /* bf16 [nH*r][dn], [nH*dv][r] */
    float *q, *q_pe;              /* [T][nH][dn + dr], [T][nH][dr] */
} pf_in_t;

enum { PF_LAYERS = 2, PF_LAYER = 1 };

static void s_pf_inputs(const pf_case_t *c, pf_in_t *in)
{
    const int W = c->r + c->dr, n_ctx = c->p0 + c->T, qk = c->dn + c->dr;
    assert_true(c->T <= 512);
    /* sequence 0: 2 blocks of its own; sequence 1: the context's blocks, numbered backwards */
    const int nb1 = (n_ctx + c->bs - 1) / c->bs;
    in->bt_start[0] = 0;
    in->bt_start[1] = 2;
    in->n_bt = 2 + nb1;
    in->n_blocks = in->n_bt;
    assert_true(in->n_bt <= 256);
    in->bt[0] = in->n_blocks - 1;
    in->bt[1] = in->n_blocks - 2;
    for (int i = 0; i < nb1; i++)
        in->bt[2 + i] = nb1 - 1 - i;
    for (int t = 0; t < c->T; t++) {
        in->seq[t] = 1;
        in->pos[t] = c->p0 + t;
    }
    const size_t n_el = (size_t)in->n_blocks * PF_LAYERS * c->bs * W;
    in->cache_bytes = n_el * dtype_size(c->dt);
    float *f = malloc(n_el * 4);
    in->cache = malloc(in->cache_bytes);
    const size_t nuk = (size_t)c->nH * c->r * c->dn, nuv = (size_t)c->nH * c->dv * c->r;
    const size_t nq = (size_t)c->T * c->nH * qk, np = (size_t)c->T * c->nH * c->dr;
    in->w_uk_t = malloc(nuk * 2);
    in->w_uv = malloc(nuv * 2);
    in->q = malloc(nq * 4);
    in->q_pe = malloc(np * 4);
    assert_true(f && in->cache && in->w_uk_t && in->w_uv && in->q && in->q_pe);
    uint64_t rs = 4242 + (uint64_t)c->nH * 7 + (uint64_t)c->p0;
    for (size_t i = 0; i < n_el; i++)
        f[i] = s_rand(&rs);
    dtype_from_f32(c->dt, f, in->cache, n_el);
    /* Weights ~ U(-1, 1) / sqrt(kv_lora) and queries ~ 4 U(-1, 1): scores of a few units. */
    const float ws = 1.0f / sqrtf((float)c->r);
    for (size_t i = 0; i < nuk; i++)
        in->w_uk_t[i] = f32_to_bf16(ws * s_rand(&rs));
    for (size_t i = 0; i < nuv; i++)
        in->w_uv[i] = f32_to_bf16(ws * s_rand(&rs));
    for (size_t i = 0; i < nq; i++)
        in->q[i] = 4.0f * s_rand(&rs);
    for (size_t i = 0; i < np; i++)
        in->q_pe[i] = 4.0f * s_rand(&rs);
    free(f);
}

static void s_pf_free(pf_in_t *in)
{
    free(in->cache);
    free(in->w_uk_t);
    free(in->w_uv);
    free(in->q);
    free(in->q_pe);
}

/* att [T][nH][dv] on be: decompressed (mla_prefill; *rc its return, out poisoned with NaN) or the
 * absorbed ops (head_matmul, mla_attention, head_matmul), as engine/mla.c runs them. */
static float *s_pf_run(backend_t *be, const pf_case_t *c, const pf_in_t *in, int decompressed, int *rc)
{
    const backend_ops_t *op = be->ops;
    const int W = c->r + c->dr, qk = c->dn + c->dr, T = c->T, nH = c->nH;
    const size_t nuk = (size_t)nH * c->r * c->dn, nuv = (size_t)nH * c->dv * c->r;
    const size_t nq = (size_t)T * nH * qk, np = (size_t)T * nH * c->dr, nl = (size_t)T * nH * c->r,
                 no = (size_t)T * nH * c->dv;
    bk_kv_t kv = {.dtype = c->dt, .n_blocks = in->n_blocks, .block_size = c->bs, .n_layers = PF_LAYERS,
                  .n_kv_heads = 1, .head_dim = W / 2,
                  .block_bytes = (size_t)PF_LAYERS * c->bs * W * dtype_size(c->dt)};
    kv.base = op->alloc(be, in->cache_bytes);
    int32_t *d_seq = op->alloc(be, (size_t)T * 4), *d_pos = op->alloc(be, (size_t)T * 4),
            *d_bts = op->alloc(be, 2 * 4), *d_bt = op->alloc(be, (size_t)in->n_bt * 4);
    void *d_uk = op->alloc(be, nuk * 2), *d_uv = op->alloc(be, nuv * 2);
    float *d_q = op->alloc(be, nq * 4), *d_qp = op->alloc(be, np * 4), *d_lat = op->alloc(be, nl * 4),
          *d_olat = op->alloc(be, nl * 4), *d_out = op->alloc(be, no * 4);
    float *out = malloc(no * 4);
    assert_non_null(out);
    for (size_t i = 0; i < no; i++)
        out[i] = NAN;
    assert_int_equal(op->upload(be, kv.base, in->cache, in->cache_bytes), 0);
    assert_int_equal(op->upload(be, d_seq, in->seq, (size_t)T * 4), 0);
    assert_int_equal(op->upload(be, d_pos, in->pos, (size_t)T * 4), 0);
    assert_int_equal(op->upload(be, d_bts, in->bt_start, 2 * 4), 0);
    assert_int_equal(op->upload(be, d_bt, in->bt, (size_t)in->n_bt * 4), 0);
    assert_int_equal(op->upload(be, d_uk, in->w_uk_t, nuk * 2), 0);
    assert_int_equal(op->upload(be, d_uv, in->w_uv, nuv * 2), 0);
    assert_int_equal(op->upload(be, d_q, in->q, nq * 4), 0);
    assert_int_equal(op->upload(be, d_qp, in->q_pe, np * 4), 0);
    assert_int_equal(op->upload(be, d_out, out, no * 4), 0);
    const bk_mat_t uk = {.data = d_uk, .dtype = DT_BF16, .rows = (int64_t)nH * c->r, .cols = c->dn};
    const bk_mat_t uv = {.data = d_uv, .dtype = DT_BF16, .rows = (int64_t)nH * c->dv, .cols = c->r};
    const bk_attn_meta_t meta = {.n_tokens = T, .n_seqs = 2, .tok_seq = d_seq, .tok_pos = d_pos,
                                 .seq_bt_start = d_bts, .block_table = d_bt};
    *rc = 0;
    if (decompressed) {
        *rc = op->mla_prefill(be, &kv, PF_LAYER, d_q, d_qp, nH, c->r, c->dn, c->dr, c->dv, &uk, &uv, c->scale, &meta,
                              c->p0 + T, d_out);
    } else {
        op->head_matmul(be, d_q, T, nH, nH * qk, qk, &uk, d_lat, nH * c->r, c->r);
        op->mla_attention(be, &kv, PF_LAYER, d_lat, d_qp, nH, c->r, c->dr, c->scale, &meta, d_olat);
        op->head_matmul(be, d_olat, T, nH, nH * c->r, c->r, &uv, d_out, nH * c->dv, c->dv);
    }
    assert_int_equal(op->download(be, out, d_out, no * 4), 0);
    void *bufs[] = {kv.base, d_seq, d_pos, d_bts, d_bt, d_uk, d_uv, d_q, d_qp, d_lat, d_olat, d_out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        op->free(be, bufs[i]);
    return out;
}

/* The worst relative error over the (row, head) vectors of dv; NaN (an output not written) wins. */
static double s_pf_worst(const float *x, const float *ref, const pf_case_t *c)
{
    double worst = 0;
    for (size_t i = 0; i < (size_t)c->T * c->nH; i++) {
        const double e = s_relerr(x + i * c->dv, ref + i * c->dv, (size_t)c->dv);
        worst = e > worst || e != e ? e : worst;
    }
    return worst;
}

/* mla_prefill against the CPU's absorbed ops and CUDA's: kjv-deepseek's heads (4 x (32 + 16), v 32,
 * kv_lora 64) and DeepSeek-V2-Lite's (16 x (128 + 64), v 128, kv_lora 512, with its YaRN softmax
 * scale: 192^-0.5 x mscale(40, 0.707)^2), chunks of 100 and 70 rows with no context before them
 * and after 200 positions (prefix-cached or earlier chunks: the rows' causal window starts
 * mid-context), bf16 and fp8 caches, block sizes 16 and 64. The absorbed CUDA path agrees with the
 * CPU within 1e-5 (test_attention's bound); the decompressed one rounds q, K, V and p to bf16, so
 * within PF_BOUND of both: a CPU emulation of exactly that rounding (f64 otherwise) over these
 * shapes and input ranges gives worst (row, head) errors of 5.6e-3 / 4.4e-3 (kjv, without / with
 * context) and 7.8e-3 / 6.5e-3 (V2-Lite): the scores are a few units, so q's and K's rounding moves
 * them by ~1e-2 absolute. A wrong mask, scale (without YaRN's mscale^2: 1.59x) or head layout is
 * an error of order 1e-1 or more. Each case runs again in passes of 96 keys
 * (TROUPE_CUDA_MLA_PREFILL_KEYS=96: 2 passes over 100 keys, 3 over 270, the softmax state carried
 * between them), within the same bound. TROUPE_CUDA_MLA_PREFILL=absorbed
 * declines (-1, nothing written); decompressed takes a 20-row chunk that auto declines. */
#define PF_BOUND 2e-2

static void test_prefill(void **state)
{
    (void)state;
    backend_t *cpu = backend_cpu_new(0), *dec = s_gpu_mode("decompressed"), *abs_be = s_gpu_mode("absorbed"),
              *aut = s_gpu_mode("auto"), *passes = s_gpu_knobs("decompressed", "96"),
              *cc = s_gpu_env("TROUPE_CUDA_MLA_MMA", "0", NULL, NULL);   /* absorbed on the CUDA cores: f32 sums */
    const float yarn = 0.1f * 0.707f * logf(40.0f) + 1.0f;
    const pf_case_t cases[] = {
        {"kjv heads, no context", 4, 64, 16, 32, 32, 100, 0, 16, DT_BF16, 1.0f / sqrtf(48.0f)},
        {"kjv heads, 200 before", 4, 64, 16, 32, 32, 70, 200, 16, DT_BF16, 1.0f / sqrtf(48.0f)},
        {"V2-Lite heads, no context", 16, 512, 64, 128, 128, 100, 0, 64, DT_BF16, yarn * yarn / sqrtf(192.0f)},
        {"V2-Lite heads, 200 before", 16, 512, 64, 128, 128, 70, 200, 16, DT_BF16, yarn * yarn / sqrtf(192.0f)},
        {"V2-Lite heads, 200 before, fp8", 16, 512, 64, 128, 128, 70, 200, 64, DT_F8E4M3,
         yarn * yarn / sqrtf(192.0f)},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const pf_case_t *c = &cases[k];
        pf_in_t in;
        s_pf_inputs(c, &in);
        int rc_ref, rc_abs, rc_dec;
        float *ref = s_pf_run(cpu, c, &in, 0, &rc_ref);
        float *ab = s_pf_run(cc, c, &in, 0, &rc_abs);
        float *de = s_pf_run(dec, c, &in, 1, &rc_dec);
        assert_int_equal(rc_dec, 0);
        int rc_pass;
        float *dp = s_pf_run(passes, c, &in, 1, &rc_pass);
        assert_int_equal(rc_pass, 0);
        const double e_abs = s_pf_worst(ab, ref, c), e_dec = s_pf_worst(de, ref, c), e_da = s_pf_worst(de, ab, c),
                     e_pass = s_pf_worst(dp, ref, c);
        print_message("  mla_prefill %s (%d rows, %s cache): worst (row, head) rel err: CUDA absorbed vs CPU %.2e, "
                      "decompressed vs CPU %.2e, vs CUDA absorbed %.2e; in passes of 96 keys vs CPU %.2e\n", c->name,
                      c->T, dtype_name(c->dt), e_abs, e_dec, e_da, e_pass);
        if (!(e_abs <= 1e-5))
            fail_msg("%s: CUDA absorbed vs CPU %.3g exceeds 1e-5", c->name, e_abs);
        if (!(e_dec <= PF_BOUND && e_da <= PF_BOUND))
            fail_msg("%s: decompressed vs CPU %.3g, vs CUDA absorbed %.3g: beyond %.0e", c->name, e_dec, e_da, PF_BOUND);
        if (!(e_pass <= PF_BOUND))
            fail_msg("%s: decompressed in passes of 96 keys vs CPU %.3g: beyond %.0e", c->name, e_pass, PF_BOUND);
        free(dp);
        if (k == 0) {   /* the knob: absorbed declines and writes nothing */
            int rc;
            float *no = s_pf_run(abs_be, c, &in, 1, &rc);
            assert_int_equal(rc, -1);
            for (size_t i = 0; i < (size_t)c->T * c->nH * c->dv; i++)
                assert_true(isnan(no[i]));
            free(no);
        }
        free(ref);
        free(ab);
        free(de);
        s_pf_free(&in);
    }
    /* 20 rows: auto leaves them to the absorbed form, decompressed takes them. */
    const pf_case_t small = {"kjv heads, 20 rows", 4, 64, 16, 32, 32, 20, 37, 16, DT_BF16, 1.0f / sqrtf(48.0f)};
    pf_in_t in;
    s_pf_inputs(&small, &in);
    int rc_a, rc_d, rc_r;
    float *fa = s_pf_run(aut, &small, &in, 1, &rc_a), *fd = s_pf_run(dec, &small, &in, 1, &rc_d),
          *fr = s_pf_run(cpu, &small, &in, 0, &rc_r);
    assert_int_equal(rc_a, -1);
    assert_int_equal(rc_d, 0);
    const double e = s_pf_worst(fd, fr, &small);
    print_message("  mla_prefill %s: decompressed vs CPU %.2e\n", small.name, e);
    if (!(e <= PF_BOUND))
        fail_msg("%s: decompressed vs CPU %.3g exceeds %.0e", small.name, e, PF_BOUND);
    free(fa);
    free(fd);
    free(fr);
    s_pf_free(&in);
    backend_destroy(&passes);
    backend_destroy(&cc);
    backend_destroy(&aut);
    backend_destroy(&abs_be);
    backend_destroy(&dec);
    backend_destroy(&cpu);
}

/* Logits of one model through chunked prefill with the decompressed form on and off: sequence A's
 * prompt of 60 ids, then its next 40 (60 positions before them) beside B's first 20 (a chunk auto
 * leaves absorbed: rows of both forms in one step); then A one decode row beside B's next 30;
 * then C, whose first 48 ids are A's, adopts those positions from the prefix cache
 * (kvseq_match_prefix) and computes 40 more. Under auto, A's chunks and C's go decompressed, B's
 * (20 and 30 rows) absorbed; under decompressed every chunk. The last row of each sequence of each step gives logits: [PF_ROWS_OUT][vocab]. */
enum { PF_ROWS_OUT = 6 };

static float *s_pf_model(backend_t *be, const char *dir, const model_config_t *cfg, ckpt_t *ck)
{
    char err[512];
    const model_opts_t o = {.max_tokens = 128, .max_seqs = 2, .max_context = 160, .kv_block_size = 16};
    model_t *m = model_load(dir, cfg, ck, be, &o, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    const dtype_t kvt = cfg->dtype == DT_F32 ? DT_F32 : DT_BF16;
    kvpool_t *pool = kvpool_new(32, 16, cfg->num_layers, cfg->num_kv_heads, cfg->head_dim, kvt, be, err, sizeof err);
    if (!pool)
        fail_msg("%s", err);
    const int V = cfg->vocab_size;
    float *lg = malloc((size_t)PF_ROWS_OUT * V * sizeof(float));
    assert_non_null(lg);
    kvseq_t *A = kvseq_new(pool, 128, 0), *B = kvseq_new(pool, 128, 0), *C = kvseq_new(pool, 128, 0);
    int32_t ids[128];
    for (int i = 0; i < 128; i++)
        ids[i] = (i * 7919 + 3) % V;
    int32_t idb[64];
    for (int i = 0; i < 64; i++)
        idb[i] = (i * 104729 + 11) % V;
    model_seq_t q[2];
    model_batch_t b = {.seqs = q};
    /* step 1: A's 60 */
    assert_int_equal(kvseq_append(A, ids, 60), 0);
    q[0] = (model_seq_t){.kv = A, .n_new = 60};
    b.n_seqs = 1;
    if (model_forward(m, &b, lg, err, sizeof err) < 0)
        fail_msg("model_forward: %s", err);
    kvseq_publish(A);
    /* step 2: B's 20, A's next 40 */
    assert_int_equal(kvseq_append(B, idb, 20), 0);
    assert_int_equal(kvseq_append(A, ids + 60, 40), 0);
    q[0] = (model_seq_t){.kv = B, .n_new = 20};
    q[1] = (model_seq_t){.kv = A, .n_new = 40};
    b.n_seqs = 2;
    if (model_forward(m, &b, lg + (size_t)1 * V, err, sizeof err) < 0)
        fail_msg("model_forward: %s", err);
    kvseq_publish(A);
    kvseq_publish(B);
    /* step 3: A one row, B's next 30 */
    assert_int_equal(kvseq_append(A, ids + 100, 1), 0);
    assert_int_equal(kvseq_append(B, idb + 20, 30), 0);
    q[0] = (model_seq_t){.kv = A, .n_new = 1};
    q[1] = (model_seq_t){.kv = B, .n_new = 30};
    if (model_forward(m, &b, lg + (size_t)3 * V, err, sizeof err) < 0)
        fail_msg("model_forward: %s", err);
    /* step 4: C = A's first 48 ids (three published blocks) and 40 of its own */
    int32_t idc[88];
    for (int i = 0; i < 88; i++)
        idc[i] = i < 48 ? ids[i] : (i * 31337 + 5) % V;
    assert_int_equal(kvseq_match_prefix(C, idc, 88), 48);
    assert_int_equal(kvseq_append(C, idc + 48, 40), 0);
    q[0] = (model_seq_t){.kv = C, .n_new = 40};
    b.n_seqs = 1;
    if (model_forward(m, &b, lg + (size_t)5 * V, err, sizeof err) < 0)
        fail_msg("model_forward: %s", err);
    kvseq_destroy(&A);
    kvseq_destroy(&B);
    kvseq_destroy(&C);
    kvpool_destroy(&pool);
    model_destroy(&m);
    return lg;
}

/* The gap between a row's largest and second largest logit, over the row's RMS. */
static double s_margin(const float *x, int n)
{
    const int b = s_argmax(x, n);
    double second = -INFINITY, ss = 0;
    for (int i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
        if (i != b && x[i] > second)
            second = x[i];
    }
    return ((double)x[b] - second) / sqrt(ss / n + 1e-30);
}

/* s_pf_model on the CPU and on CUDA with TROUPE_CUDA_MLA_PREFILL absorbed, auto and decompressed,
 * for the bf16 DeepSeek models (kjv-deepseek when present, the deepseek-v3-noqlora-bf16 fixture):
 * the relative error within test_fixtures' bf16 bounds (median BF16_MEDIAN, worst BF16_WORST: the
 * GEMMs' bf16 activations dominate, absorbed or not) and every row's argmax equal to the CPU's
 * where the CPU's top two logits are further apart than rounding can move them: PF_MARGIN_ERRS
 * times the worst relative error the absorbed run of the same model measures here (at least
 * 1e-2), in units of the row's RMS. A relative error e is an RMS error of e x RMS(row) per logit;
 * single logits of a row reach ~3 times that, and a flip takes two of them moving apart. Rows
 * under the bar are printed, not checked, and at least half of the rows must be checked. Why not
 * a fixed 1% (798ae43): the fixture's row 2 (A's 40-row chunk after 60 positions) has CPU top
 * two 182 / 228 at 6.2997 / 6.2461, 0.021 RMS apart, and its absorbed run's worst error is
 * 2.2e-2; a CPU emulation of the decompressed form's bf16 rounding of q, K, V and p (f32
 * otherwise) flips that row to 228 as well (relative error 1.5e-2), while the GPU's absorbed run
 * happened to keep 182. The other rows' margins: 0.60, 0.19, 0.45, 0.13, 0.021 (fixture) and
 * 0.055 or more (kjv-deepseek, absorbed worst 8.1e-3: all six checked). */
#define PF_MARGIN_ERRS 4.0
static void test_prefill_model(void **state)
{
    (void)state;
    char dirs[2][4096];
    const char *root = getenv("TROUPE_MODELS");
    snprintf(dirs[0], sizeof dirs[0], "%s/kjv-deepseek", root && *root ? root : "../shared/models");
    snprintf(dirs[1], sizeof dirs[1], "%s/deepseek-v3-noqlora-bf16", gpu_fixture_root());
    const char *modes[] = {"absorbed", "auto", "decompressed"};
    for (int d = 0; d < 2; d++) {
        const char *dir = dirs[d];
        char err[512];
        if (access(dir, R_OK) != 0) {
            print_message("SKIP %s: absent\n", dir);
            continue;
        }
        model_config_t cfg;
        if (config_load(dir, &cfg, err, sizeof err) != 0)
            fail_msg("%s", err);
        ckpt_t *ck = ckpt_open(dir, err, sizeof err);
        if (!ck)
            fail_msg("%s", err);
        backend_t *cpu = backend_cpu_new(0);
        float *ref = s_pf_model(cpu, dir, &cfg, ck);
        const int V = cfg.vocab_size;
        double bar = 0;   /* the margin under which argmax is not checked: from modes[0], absorbed */
        for (int k = 0; k < 3; k++) {
            backend_t *be = s_gpu_mode(modes[k]);
            float *x = s_pf_model(be, dir, &cfg, ck);
            double e[PF_ROWS_OUT], worst = 0;
            for (int r = 0; r < PF_ROWS_OUT; r++) {
                e[r] = s_relerr(x + (size_t)r * V, ref + (size_t)r * V, (size_t)V);
                worst = e[r] > worst || e[r] != e[r] ? e[r] : worst;
            }
            qsort(e, PF_ROWS_OUT, sizeof e[0], s_cmp_double);
            const double median = (e[PF_ROWS_OUT / 2 - 1] + e[PF_ROWS_OUT / 2]) / 2;
            print_message("%s, TROUPE_CUDA_MLA_PREFILL=%s: chunked-prefill logits vs CPU, median %.2e, worst %.2e\n",
                          dir, modes[k], median, worst);
            if (!(median <= BF16_MEDIAN && worst <= BF16_WORST))
                fail_msg("%s, %s: relative error median %.3g, worst %.3g exceed %.0e, %.0e", dir, modes[k], median,
                         worst, BF16_MEDIAN, BF16_WORST);
            if (k == 0)
                bar = fmax(1e-2, PF_MARGIN_ERRS * worst);
            int checked = 0;
            for (int r = 0; r < PF_ROWS_OUT; r++) {
                const int want = s_argmax(ref + (size_t)r * V, V), got = s_argmax(x + (size_t)r * V, V);
                const double margin = s_margin(ref + (size_t)r * V, V);
                if (margin < bar) {
                    print_message("  %s, %s: row %d: argmax %d, CPU %d, not checked: CPU top-2 margin %.3g RMS under "
                                  "%.3g\n", dir, modes[k], r, got, want, margin, bar);
                    continue;
                }
                checked++;
                if (got != want)
                    fail_msg("%s, %s: row %d: CUDA argmax %d, CPU %d (CPU top-2 margin %.3g RMS, bar %.3g)", dir,
                             modes[k], r, got, want, margin, bar);
            }
            if (2 * checked < PF_ROWS_OUT)
                fail_msg("%s, %s: argmax checked on %d of %d rows only (bar %.3g)", dir, modes[k], checked,
                         PF_ROWS_OUT, bar);
            free(x);
            backend_destroy(&be);
        }
        free(ref);
        backend_destroy(&cpu);
        ckpt_destroy(&ck);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_matmul),
        cmocka_unit_test(test_mtp_top),
        cmocka_unit_test(test_mtp_graph),
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_mma),
        cmocka_unit_test(test_prefill),
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_prefill_model),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
