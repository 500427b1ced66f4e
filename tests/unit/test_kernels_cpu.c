/* tests/unit/test_kernels_cpu.c — every CPU backend op against a naive double-precision reference.
 *
 * Inputs are random and never zero; outputs are poisoned with NaN first and followed by guard
 * words, so an element the op forgot stays NaN (and fails), and a write past the end changes a
 * guard (and fails). Errors are relative, ||got - ref|| / ||ref||, with a bound per case; the
 * reference reads weights and KV exactly as stored (bf16 / f16 / fp8 values are exact in double),
 * so the bounds only cover f32 accumulation. Built with AVX-512 the kernels' vector paths are
 * checked; test_kernels_cpu_novec (the Makefile) is this file again over the plain C paths. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_simd.h"

#define GUARD 16
static const uint32_t GUARD_BITS = 0x7fbadbadu;   /* a signalling-NaN pattern no op produces */

static uint64_t s_rng = 88172645463325252ull;
static double s_uniform(void)                      /* in (-1, 1), never 0 */
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    double u = ((s_rng >> 11) + 0.5) / 9007199254740992.0;   /* (0, 1) */
    return 2 * u - 1;
}

static float *s_rand_f32(size_t n, double scale)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(s_uniform() * scale);
    return p;
}

/* A random non-zero finite fp8 code of magnitude at most scale, every such code equally likely:
 * uniform over codes, so every binade below scale and the subnormals are drawn, not only the top
 * two binades that a uniform value would mostly land in. */
static uint8_t s_rand_fp8(double scale)
{
    int top = 1;
    while (top < 0x7e && f8e4m3_to_f32((uint8_t)(top + 1)) <= scale)
        top++;
    uint8_t code = (uint8_t)(1 + (int)((s_uniform() + 1) / 2 * top) % top);
    return s_uniform() < 0 ? code | 0x80 : code;
}

/* Random data of dtype t; a double copy of exactly the stored values goes to *exact. */
static void *s_rand_dt(dtype_t t, size_t n, double scale, double **exact)
{
    void *p = malloc(n * dtype_size(t) + 8);
    *exact = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        float v = (float)(s_uniform() * scale);
        if (t == DT_F8E4M3)
            v = f8e4m3_to_f32(s_rand_fp8(scale));
        dtype_from_f32(t, &v, (uint8_t *)p + i * dtype_size(t), 1);
        float back;
        dtype_to_f32(t, (uint8_t *)p + i * dtype_size(t), &back, 1);
        (*exact)[i] = back;
    }
    return p;
}

/* An output buffer of n floats: NaN-poisoned, then GUARD guard words. */
static float *s_out(size_t n)
{
    float *p = malloc((n + GUARD) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    for (size_t i = 0; i < GUARD; i++)
        memcpy(&p[n + i], &GUARD_BITS, 4);
    return p;
}

static void s_check_guard(const float *p, size_t n, const char *what)
{
    for (size_t i = 0; i < GUARD; i++)
        if (memcmp(&p[n + i], &GUARD_BITS, 4) != 0)
            fail_msg("%s: guard word %zu after %zu outputs was overwritten", what, i, n);
}

/* Relative error of got vs ref over n elements; fails on any NaN in got. */
static double s_relerr(const float *got, const double *ref, size_t n, const char *what)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]))
            fail_msg("%s: element %zu is NaN (never written?)", what, i);
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void s_expect_close(const float *got, const double *ref, size_t n, double bound, const char *what)
{
    double e = s_relerr(got, ref, n, what);
    if (!(e <= bound))
        fail_msg("%s: relative error %.3g exceeds %.3g", what, e, bound);
}

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

/* ---- matmul ------------------------------------------------------------------------------ */

static void s_matmul_case(dtype_t dt, int M, int N, int K, int with_bias)
{
    double *wx;
    void *w = s_rand_dt(dt, (size_t)N * K, 0.5, &wx);
    float *x = s_rand_f32((size_t)M * K, 1.0), *bias = with_bias ? s_rand_f32((size_t)N, 1.0) : NULL;
    float *y = s_out((size_t)M * N);
    bk_mat_t W = {.data = w, .dtype = dt, .rows = N, .cols = K};
    s_be->ops->matmul(s_be, x, M, &W, bias, y);

    double *ref = malloc((size_t)M * N * sizeof(double));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0;
            for (int k = 0; k < K; k++)
                s += (double)x[(size_t)m * K + k] * wx[(size_t)n * K + k];
            ref[(size_t)m * N + n] = s;
        }
    char what[96];
    snprintf(what, sizeof what, "matmul %s M=%d N=%d K=%d bias=%d", dtype_name(dt), M, N, K, with_bias);
    s_expect_close(y, ref, (size_t)M * N, 2e-6 * sqrt(K), what);
    s_check_guard(y, (size_t)M * N, what);

    /* Batch invariance: every row computed alone is bit-identical to the batched row. */
    float *y1 = s_out((size_t)N);
    for (int m = 0; m < M; m++) {
        s_be->ops->matmul(s_be, x + (size_t)m * K, 1, &W, bias, y1);
        if (memcmp(y1, y + (size_t)m * N, (size_t)N * sizeof(float)) != 0)
            fail_msg("%s: row %d computed alone differs from the batched result", what, m);
        s_check_guard(y1, (size_t)N, what);
    }
    free(y1);
    free(ref);
    free(y);
    free(bias);
    free(x);
    free(wx);
    free(w);
}

static void test_matmul(void **state)
{
    static const int shapes[][3] = {{1, 7, 5}, {1, 3, 16}, {2, 50, 33}, {3, 49, 64}, {5, 100, 17},
                                    {9, 97, 130}, {17, 64, 48}, {40, 151, 300}, {64, 200, 1024}};
    for (int dt = 0; dt < DT_WEIGHT_COUNT; dt++)
        for (size_t i = 0; i < ARRAY_LEN(shapes); i++)
            s_matmul_case((dtype_t)dt, shapes[i][0], shapes[i][1], shapes[i][2], (int)(i & 1));
}

/* Weights at an odd address (as an mmap of a safetensors file may give) still multiply right. */
static void test_matmul_unaligned_weights(void **state)
{
    const int M = 3, N = 20, K = 37;
    double *wx;
    void *w = s_rand_dt(DT_F32, (size_t)N * K, 0.5, &wx);
    uint8_t *raw = malloc((size_t)N * K * 4 + 8);
    memcpy(raw + 3, w, (size_t)N * K * 4);
    const void *dev = s_be->ops->weight_put(s_be, raw + 3, (size_t)N * K * 4, 4);
    assert_non_null(dev);
    assert_true(((uintptr_t)dev & 3) == 0);
    float *x = s_rand_f32((size_t)M * K, 1), *y = s_out((size_t)M * N);
    bk_mat_t W = {.data = dev, .dtype = DT_F32, .rows = N, .cols = K};
    s_be->ops->matmul(s_be, x, M, &W, NULL, y);
    double ref[3 * 20];
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)x[m * K + k] * wx[n * K + k];
            ref[m * N + n] = s;
        }
    s_expect_close(y, ref, (size_t)M * N, 1e-5, "matmul unaligned");
    s_be->ops->weight_release(s_be, dev);
    free(y);
    free(x);
    free(raw);
    free(wx);
    free(w);
}

/* ---- per-row ops ------------------------------------------------------------------------- */

static void test_embed(void **state)
{
    for (int dt = 0; dt < DT_WEIGHT_COUNT; dt++) {
        const int V = 50, H = 37, n = 9;
        double *tx;
        void *table = s_rand_dt((dtype_t)dt, (size_t)V * H, 1, &tx);
        int32_t ids[9] = {0, 49, 3, 3, 17, 25, 48, 1, 0};
        float *out = s_out((size_t)n * H);
        bk_mat_t T = {.data = table, .dtype = (dtype_t)dt, .rows = V, .cols = H};
        s_be->ops->embed(s_be, &T, ids, n, out);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < H; h++)
                assert_true(out[t * H + h] == (float)tx[ids[t] * H + h]);
        s_check_guard(out, (size_t)n * H, "embed");
        free(out);
        free(tx);
        free(table);
    }
}

static void s_ref_rmsnorm(const double *r, const float *w, int H, double eps, double *out)
{
    double ss = 0;
    for (int i = 0; i < H; i++)
        ss += r[i] * r[i];
    double scale = 1 / sqrt(ss / H + eps);
    for (int i = 0; i < H; i++)
        out[i] = w[i] * r[i] * scale;
}

static void test_add_rmsnorm(void **state)
{
    const int M = 7, H = 333;
    const float eps = 1e-5f;
    for (int with_x = 0; with_x < 2; with_x++) {
        float *res = s_rand_f32((size_t)M * H, 3), *x = s_rand_f32((size_t)M * H, 2), *w = s_rand_f32(H, 1);
        double *rsum = malloc((size_t)M * H * sizeof(double)), *ref = malloc((size_t)M * H * sizeof(double));
        for (int i = 0; i < M * H; i++)
            rsum[i] = (double)res[i] + (with_x ? x[i] : 0);
        for (int m = 0; m < M; m++)
            s_ref_rmsnorm(rsum + m * H, w, H, eps, ref + m * H);
        float *out = s_out((size_t)M * H);
        s_be->ops->add_rmsnorm(s_be, res, with_x ? x : NULL, w, M, H, eps, out);
        s_expect_close(out, ref, (size_t)M * H, 1e-6, "add_rmsnorm out");
        s_expect_close(res, rsum, (size_t)M * H, 1e-7, "add_rmsnorm residual");
        s_check_guard(out, (size_t)M * H, "add_rmsnorm");
        free(out);
        free(ref);
        free(rsum);
        free(w);
        free(x);
        free(res);
    }
}

static void test_head_rmsnorm(void **state)
{
    const int M = 5, nh = 6, D = 40;
    float *x = s_rand_f32((size_t)M * nh * D + GUARD, 2), *w = s_rand_f32(D, 1);
    for (int i = 0; i < GUARD; i++)
        memcpy(&x[M * nh * D + i], &GUARD_BITS, 4);
    double *ref = malloc((size_t)M * nh * D * sizeof(double)), tmp[40];
    for (int r = 0; r < M * nh; r++) {
        for (int d = 0; d < D; d++)
            tmp[d] = x[r * D + d];
        s_ref_rmsnorm(tmp, w, D, 1e-6, ref + r * D);
    }
    s_be->ops->head_rmsnorm(s_be, x, w, M, nh, D, 1e-6f);
    s_expect_close(x, ref, (size_t)M * nh * D, 1e-6, "head_rmsnorm");
    s_check_guard(x, (size_t)M * nh * D, "head_rmsnorm");
    free(ref);
    free(w);
    free(x);
}

static void test_rope(void **state)
{
    const int M = 6, nh = 3, D = 64, half = D / 2;
    int32_t pos[6] = {0, 1, 7, 100, 4095, 40000};
    float inv_freq[32];
    for (int i = 0; i < half; i++)
        inv_freq[i] = (float)(1.0 / pow(10000.0, 2.0 * i / D));
    float *x = s_rand_f32((size_t)M * nh * D + GUARD, 1);
    for (int i = 0; i < GUARD; i++)
        memcpy(&x[M * nh * D + i], &GUARD_BITS, 4);
    double *ref = malloc((size_t)M * nh * D * sizeof(double));
    for (int t = 0; t < M; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < half; i++) {
                const float *v = x + (t * nh + h) * D;
                double a = (float)((float)pos[t] * inv_freq[i]);   /* the angle is an f32 product (HF) */
                ref[(t * nh + h) * D + i] = v[i] * cos(a) - v[i + half] * sin(a);
                ref[(t * nh + h) * D + i + half] = v[i + half] * cos(a) + v[i] * sin(a);
            }
    s_be->ops->rope(s_be, x, pos, inv_freq, M, nh, D);
    s_expect_close(x, ref, (size_t)M * nh * D, 1e-6, "rope");
    s_check_guard(x, (size_t)M * nh * D, "rope");
    free(ref);
    free(x);
}

static void test_swiglu(void **state)
{
    const int n = 1000 + 7;
    float *g = s_rand_f32(n, 12), *u = s_rand_f32(n, 2), *out = s_out(n);
    g[0] = 90.0f;                                  /* exp(-g) underflow side */
    g[1] = -90.0f;                                 /* exp(-g) overflow side: silu -> -0 */
    double *ref = malloc(n * sizeof(double));
    for (int i = 0; i < n; i++)
        ref[i] = g[i] / (1 + exp(-(double)g[i])) * u[i];
    s_be->ops->swiglu(s_be, g, u, n, out);
    s_expect_close(out, ref, n, 1e-6, "swiglu");
    for (int i = 0; i < n; i++)
        if (fabs(out[i] - ref[i]) > 1e-6 * (fabs(ref[i]) + 1e-30) + 1e-37)
            fail_msg("swiglu element %d: %.9g vs %.9g (g=%g)", i, out[i], ref[i], g[i]);
    s_check_guard(out, n, "swiglu");
    free(ref);
    free(out);
    free(u);
    free(g);
}

static void test_gather_and_argmax(void **state)
{
    const int R = 6, C = 21;
    float *src = s_rand_f32((size_t)R * C, 1), *dst = s_out(3 * C);
    int32_t rows[3] = {5, 0, 5};
    s_be->ops->gather_rows(s_be, src, rows, 3, C, dst);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(dst + i * C, src + rows[i] * C, C * sizeof(float));
    s_check_guard(dst, 3 * C, "gather_rows");

    float x[4][6] = {{1, 3, 2, 3, -1, 0}, {NAN, -5, -2, -2, NAN, -7}, {NAN, NAN, NAN, NAN, NAN, NAN}, {-1, -1, -1, -1, -1, 4}};
    int32_t am[4 + GUARD];
    for (int i = 0; i < 4 + GUARD; i++)
        am[i] = -12345;
    s_be->ops->argmax(s_be, &x[0][0], 4, 6, am);
    assert_int_equal(am[0], 1);                    /* tie 3 at 1 and 3: the lower index */
    assert_int_equal(am[1], 2);                    /* NaN skipped; tie -2 at 2 and 3 */
    assert_int_equal(am[2], 0);                    /* all NaN: 0 */
    assert_int_equal(am[3], 5);
    for (int i = 4; i < 4 + GUARD; i++)
        assert_int_equal(am[i], -12345);
    free(dst);
    free(src);
}

/* ---- paged KV + attention ---------------------------------------------------------------- */

static void s_attention_case(dtype_t kvt, int n_heads, int n_kv, int D, int bs)
{
    const int n_layers = 2, layer = 1, n_seqs = 3;
    const int seq_len[3] = {1, 2 * bs + 3, 5 * bs};        /* total positions per sequence */
    int n_blocks_needed = 0;
    for (int s = 0; s < n_seqs; s++)
        n_blocks_needed += (seq_len[s] + bs - 1) / bs;
    const int n_blocks = n_blocks_needed + 4;
    bk_kv_t kv = {.dtype = kvt, .n_blocks = n_blocks, .block_size = bs, .n_layers = n_layers, .n_kv_heads = n_kv, .head_dim = D};
    kv.block_bytes = (size_t)n_layers * 2 * bs * n_kv * D * dtype_size(kvt);
    kv.base = s_be->ops->alloc(s_be, kv.block_bytes * n_blocks);
    memset(kv.base, 0xff, kv.block_bytes * n_blocks);       /* NaN everywhere not stored */

    /* Block tables: a shuffled set of distinct pool blocks. */
    int32_t perm[256], bt[256], bt_start[3];
    for (int i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)((s_uniform() + 1) / 2 * (i + 1)) % (i + 1);
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    int nbt = 0;
    for (int s = 0; s < n_seqs; s++) {
        bt_start[s] = nbt;
        for (int b = 0; b < (seq_len[s] + bs - 1) / bs; b++, nbt++)
            bt[nbt] = perm[nbt];
    }

    /* Every position's K and V (exact as stored), stored in two steps: a "prefill" of all but
     * the last few positions in one batch, then the rest, rows of sequences interleaved. */
    int total = 0;
    for (int s = 0; s < n_seqs; s++)
        total += seq_len[s];
    const int kvw = n_kv * D;
    double *kx, *vx;
    void *kraw = s_rand_dt(kvt, (size_t)total * kvw, 1, &kx), *vraw = s_rand_dt(kvt, (size_t)total * kvw, 1, &vx);
    float *kf = malloc((size_t)total * kvw * sizeof(float)), *vf = malloc((size_t)total * kvw * sizeof(float));
    for (size_t i = 0; i < (size_t)total * kvw; i++) {
        kf[i] = (float)kx[i];
        vf[i] = (float)vx[i];
    }
    int32_t *tseq = malloc(total * sizeof(int32_t)), *tpos = malloc(total * sizeof(int32_t));
    int row = 0, base_row[3];
    for (int s = 0; s < n_seqs; s++) {
        base_row[s] = row;
        for (int p = 0; p < seq_len[s]; p++, row++) {
            tseq[row] = s;
            tpos[row] = p;
        }
    }
    bk_attn_meta_t meta = {.n_tokens = total, .n_seqs = n_seqs, .tok_seq = tseq, .tok_pos = tpos,
                           .seq_bt_start = bt_start, .block_table = bt};
    s_be->ops->kv_store(s_be, &kv, layer, kf, vf, &meta);

    /* The stored bytes sit where bk_kv_t documents them. */
    for (int r = 0; r < total; r++) {
        int s = tseq[r], p = tpos[r];
        int32_t blk = bt[bt_start[s] + p / bs];
        size_t off = (size_t)blk * kv.block_bytes + ((((size_t)layer * 2 + 0) * bs + p % bs) * kvw) * dtype_size(kvt);
        size_t voff = (size_t)blk * kv.block_bytes + ((((size_t)layer * 2 + 1) * bs + p % bs) * kvw) * dtype_size(kvt);
        assert_memory_equal((uint8_t *)kv.base + off, (uint8_t *)kraw + (size_t)r * kvw * dtype_size(kvt), kvw * dtype_size(kvt));
        assert_memory_equal((uint8_t *)kv.base + voff, (uint8_t *)vraw + (size_t)r * kvw * dtype_size(kvt), kvw * dtype_size(kvt));
    }

    /* Queries: every row (each attends to its own prefix). */
    const float scale = 1.0f / sqrtf((float)D);
    float *q = s_rand_f32((size_t)total * n_heads * D, 1), *out = s_out((size_t)total * n_heads * D);
    s_be->ops->attention(s_be, &kv, layer, q, n_heads, scale, &meta, out);
    double *ref = malloc((size_t)total * n_heads * D * sizeof(double)), *sc = malloc(total * sizeof(double));
    const int G = n_heads / n_kv;
    for (int r = 0; r < total; r++) {
        int s = tseq[r], n_keys = tpos[r] + 1;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + ((size_t)r * n_heads + h) * D;
            int g = h / G;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n_keys; j++) {
                const double *kr = kx + ((size_t)(base_row[s] + j) * kvw + g * D);
                double d = 0;
                for (int e = 0; e < D; e++)
                    d += qh[e] * kr[e];
                sc[j] = d * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j < n_keys; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int e = 0; e < D; e++) {
                double o = 0;
                for (int j = 0; j < n_keys; j++)
                    o += sc[j] * vx[(size_t)(base_row[s] + j) * kvw + g * D + e];
                ref[((size_t)r * n_heads + h) * D + e] = o / sum;
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attention kv=%s heads=%d/%d D=%d bs=%d", dtype_name(kvt), n_heads, n_kv, D, bs);
    s_expect_close(out, ref, (size_t)total * n_heads * D, 2e-6, what);
    s_check_guard(out, (size_t)total * n_heads * D, what);

    /* A decode-shaped step (one row per sequence, different order) gives the same rows. */
    int32_t dseq[3] = {2, 0, 1}, dpos[3] = {seq_len[2] - 1, seq_len[0] - 1, seq_len[1] - 1};
    float *dq = malloc((size_t)3 * n_heads * D * sizeof(float)), *dout = s_out((size_t)3 * n_heads * D);
    for (int i = 0; i < 3; i++)
        memcpy(dq + (size_t)i * n_heads * D, q + (size_t)(base_row[dseq[i]] + dpos[i]) * n_heads * D, (size_t)n_heads * D * sizeof(float));
    bk_attn_meta_t dmeta = {.n_tokens = 3, .n_seqs = n_seqs, .tok_seq = dseq, .tok_pos = dpos, .seq_bt_start = bt_start, .block_table = bt};
    s_be->ops->attention(s_be, &kv, layer, dq, n_heads, scale, &dmeta, dout);
    for (int i = 0; i < 3; i++)
        if (memcmp(dout + (size_t)i * n_heads * D, out + (size_t)(base_row[dseq[i]] + dpos[i]) * n_heads * D, (size_t)n_heads * D * sizeof(float)))
            fail_msg("%s: decode-shaped row %d differs from the prefill-shaped result", what, i);
    s_check_guard(dout, (size_t)3 * n_heads * D, what);

    free(dout); free(dq); free(sc); free(ref); free(out); free(q); free(tpos); free(tseq);
    free(vf); free(kf); free(vraw); free(kraw); free(vx); free(kx);
    s_be->ops->free(s_be, kv.base);
}

static void test_attention(void **state)
{
    s_attention_case(DT_F32, 4, 2, 64, 16);
    s_attention_case(DT_BF16, 8, 2, 24, 16);      /* head_dim not a multiple of 16 */
    s_attention_case(DT_F16, 6, 6, 32, 4);        /* MHA, tiny blocks */
    s_attention_case(DT_F32, 16, 1, 128, 32);     /* MQA, group 16 */
    s_attention_case(DT_F8E4M3, 8, 2, 64, 16);    /* fp8: a shape the CUDA kernels take too */
    s_attention_case(DT_F8E4M3, 6, 3, 40, 8);     /* fp8, head_dim not a multiple of 16: masked byte loads */
    s_attention_case(DT_F8E4M3, 16, 1, 128, 32);  /* fp8, MQA, group 16 */
}

/* Both ways the kernels read an fp8 cache (cpu_elem, and cpu_load16 with AVX-512) decode every
 * code as f8e4m3_to_f32 does, bit for bit (NaN codes to NaN), at any offset; a masked load leaves
 * zeros in the lanes it does not read. */
static void s_same_f32(float got, float want, int code, const char *how)
{
    if (isnan(want) ? !isnan(got) : memcmp(&got, &want, 4) != 0)
        fail_msg("%s: code 0x%02x reads as %a, f8e4m3_to_f32 says %a", how, code, got, want);
}

static void test_fp8_loads(void **state)
{
    uint8_t codes[256 + 32];
    for (int i = 0; i < 256 + 32; i++)
        codes[i] = (uint8_t)(i * 37 + 11);              /* every code, shuffled, then some again */
    for (int i = 0; i < 256 + 32; i++)
        s_same_f32(cpu_elem(DT_F8E4M3, codes, i), f8e4m3_to_f32(codes[i]), codes[i], "cpu_elem");
#if CPU_AVX512
    for (int off = 0; off < 16; off++)                  /* unaligned starts */
        for (int i = off; i + 16 <= 256 + 32; i += 16) {
            float lane[16];
            _mm512_storeu_ps(lane, cpu_load16(DT_F8E4M3, codes, i, 0xffff));
            for (int j = 0; j < 16; j++)
                s_same_f32(lane[j], f8e4m3_to_f32(codes[i + j]), codes[i + j], "cpu_load16");
        }
    for (int n = 0; n < 16; n++) {                      /* a tail of n elements */
        float lane[16];
        _mm512_storeu_ps(lane, cpu_load16(DT_F8E4M3, codes, 100, cpu_mask(n)));
        for (int j = 0; j < 16; j++)
            s_same_f32(lane[j], j < n ? f8e4m3_to_f32(codes[100 + j]) : 0.0f, codes[100 + j], "cpu_load16 masked");
    }
#endif
}

/* kv_store into an fp8 cache rounds as f32_to_f8e4m3 does: nearest even, subnormals kept, +-448
 * and beyond (infinities too) clamped to +-448, -0 kept, NaN to the NaN code. */
static void test_kv_store_fp8_rounding(void **state)
{
    enum { N_KV = 2, D = 8, BS = 4, ROWS = 2 };
    static const float k[ROWS][N_KV * D] = {
        {1.0625f, 1.1875f, 1.9375f, 0x1p-9f, 0x1p-10f, 0x3p-10f, 432.0f, 448.0f,
         464.0f, 1e9f, -INFINITY, -0.0f, 0.0f, -0x1p-11f, 1.0f, -2.5f},
        {0.3f, -0.3f, 100.0f, -100.0f, 0x1.1p-6f, 0x7.8p-9f, 447.0f, -449.0f,
         INFINITY, NAN, 1e-40f, 2.0f, 3.0f, 5.0f, 7.0f, 9.0f},
    };
    static const uint8_t want_k[ROWS][N_KV * D] = {
        {0x38, 0x3a, 0x40, 0x01, 0x00, 0x02, 0x7e, 0x7e, 0x7e, 0x7e, 0xfe, 0x80, 0x00, 0x80, 0x38, 0xc2},
        {0x2a, 0xaa, 0x6c, 0xec, 0x08, 0x08, 0x7e, 0xfe, 0x7e, 0x7f, 0x00, 0x40, 0x44, 0x4a, 0x4e, 0x51},
    };
    float v[ROWS][N_KV * D];
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < N_KV * D; i++)
            v[r][i] = -k[r][i];
    bk_kv_t kv = {.dtype = DT_F8E4M3, .n_blocks = 2, .block_size = BS, .n_layers = 1, .n_kv_heads = N_KV,
                  .head_dim = D};
    kv.block_bytes = (size_t)2 * BS * N_KV * D;
    kv.base = s_be->ops->alloc(s_be, kv.block_bytes * 2);
    memset(kv.base, 0xa5, kv.block_bytes * 2);
    int32_t seq[ROWS] = {0, 0}, pos[ROWS] = {5, 6}, bt_start[1] = {0}, bt[2] = {1, 0};   /* block 0, slots 1, 2 */
    bk_attn_meta_t meta = {.n_tokens = ROWS, .n_seqs = 1, .tok_seq = seq, .tok_pos = pos, .seq_bt_start = bt_start,
                           .block_table = bt};
    s_be->ops->kv_store(s_be, &kv, 0, &k[0][0], &v[0][0], &meta);
    const uint8_t *b0 = kv.base;
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < N_KV * D; i++) {
            const int slot = pos[r] % BS;
            const uint8_t kg = b0[(size_t)slot * N_KV * D + i], vg = b0[(size_t)(BS + slot) * N_KV * D + i];
            if (kg != want_k[r][i])
                fail_msg("row %d K[%d] = %a stored as 0x%02x, expected 0x%02x", r, i, k[r][i], kg, want_k[r][i]);
            if (vg != (want_k[r][i] ^ 0x80))
                fail_msg("row %d V[%d] = %a stored as 0x%02x, expected 0x%02x", r, i, v[r][i], vg, want_k[r][i] ^ 0x80);
        }
    /* Nothing else was written: slots 0 and 3 of block 0, and all of block 1. */
    for (size_t i = 0; i < kv.block_bytes * 2; i++) {
        const size_t slot = (i / (N_KV * D)) % BS;
        if (i < kv.block_bytes && (slot == 1 || slot == 2))
            continue;
        if (b0[i] != 0xa5)
            fail_msg("byte %zu outside the stored rows was written (0x%02x)", i, b0[i]);
    }
    s_be->ops->free(s_be, kv.base);
}

/* ---- MoE --------------------------------------------------------------------------------- */

static void test_moe_route(void **state)
{
    const int M = 9, E = 12, k = 3;
    float *lg = s_rand_f32((size_t)M * E, 4);
    /* Row 8: ties everywhere; the lower expert index must win. */
    for (int e = 0; e < E; e++)
        lg[8 * E + e] = (e % 4 == 1) ? 2.0f : 0.5f;
    for (int renorm = 0; renorm < 2; renorm++) {
        int32_t ids[9 * 3];
        float *w = s_out((size_t)M * k);
        s_be->ops->moe_route(s_be, lg, M, E, k, renorm, ids, w);
        for (int t = 0; t < M; t++) {
            double p[12], mx = -INFINITY, sum = 0;
            for (int e = 0; e < E; e++)
                mx = lg[t * E + e] > mx ? lg[t * E + e] : mx;
            for (int e = 0; e < E; e++)
                sum += (p[e] = exp(lg[t * E + e] - mx));
            int taken[12] = {0};
            double sel[3], ssum = 0;
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!taken[e] && (best < 0 || p[e] > p[best]))
                        best = e;
                taken[best] = 1;
                assert_int_equal(ids[t * k + j], best);
                sel[j] = p[best] / sum;
                ssum += sel[j];
            }
            for (int j = 0; j < k; j++) {
                double ref = renorm ? sel[j] / ssum : sel[j];
                if (fabs(w[t * k + j] - ref) > 1e-6 * ref)
                    fail_msg("moe_route renorm=%d token %d slot %d: %.9g vs %.9g", renorm, t, j, w[t * k + j], ref);
            }
        }
        assert_int_equal(ids[8 * k + 0], 1);
        assert_int_equal(ids[8 * k + 1], 5);
        assert_int_equal(ids[8 * k + 2], 9);
        s_check_guard(w, (size_t)M * k, "moe_route");
        free(w);
    }
    free(lg);
}

static void test_moe_ffn(void **state)
{
    const int M = 7, H = 40, I = 24, E = 5, k = 2;
    bk_expert_t ex[5];
    double *gx[5], *ux[5], *dx[5];
    void *gw[5], *uw[5], *dw[5];
    for (int e = 0; e < E; e++) {
        gw[e] = s_rand_dt(DT_BF16, (size_t)I * H, 0.3, &gx[e]);
        uw[e] = s_rand_dt(DT_BF16, (size_t)I * H, 0.3, &ux[e]);
        dw[e] = s_rand_dt(DT_BF16, (size_t)H * I, 0.3, &dx[e]);
        ex[e].gate = (bk_mat_t){.data = gw[e], .dtype = DT_BF16, .rows = I, .cols = H};
        ex[e].up = (bk_mat_t){.data = uw[e], .dtype = DT_BF16, .rows = I, .cols = H};
        ex[e].down = (bk_mat_t){.data = dw[e], .dtype = DT_BF16, .rows = H, .cols = I};
    }
    float *x = s_rand_f32((size_t)M * H, 1), w[7 * 2];
    int32_t ids[7 * 2] = {0, 3, 3, 0, 4, 2, 1, 3, 3, 4, 2, 0, 0, 1};   /* expert 3 has tokens 0, 1, 3, 4 */
    for (int i = 0; i < M * k; i++)
        w[i] = (float)(0.5 + 0.5 * fabs(s_uniform()));
    void *scratch = malloc(moe_scratch_bytes(M, k, H, I, E));
    float *out = s_out((size_t)M * H);
    s_be->ops->moe_ffn(s_be, x, M, H, ids, w, k, ex, E, scratch, out);

    double *ref = calloc((size_t)M * H, sizeof(double)), act[24];
    for (int t = 0; t < M; t++)
        for (int j = 0; j < k; j++) {
            int e = ids[t * k + j];
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    g += x[t * H + h] * gx[e][i * H + h];
                    u += x[t * H + h] * ux[e][i * H + h];
                }
                act[i] = g / (1 + exp(-g)) * u;
            }
            for (int h = 0; h < H; h++) {
                double d = 0;
                for (int i = 0; i < I; i++)
                    d += act[i] * dx[e][h * I + i];
                ref[t * H + h] += w[t * k + j] * d;
            }
        }
    s_expect_close(out, ref, (size_t)M * H, 1e-5, "moe_ffn");
    s_check_guard(out, (size_t)M * H, "moe_ffn");

    /* A token alone gives the same bits as in the batch. */
    float *o1 = s_out(H);
    s_be->ops->moe_ffn(s_be, x + 4 * H, 1, H, ids + 4 * k, w + 4 * k, k, ex, E, scratch, o1);
    assert_memory_equal(o1, out + 4 * H, H * sizeof(float));
    free(o1);
    free(ref);
    free(out);
    free(scratch);
    free(x);
    for (int e = 0; e < E; e++) {
        free(gx[e]); free(ux[e]); free(dx[e]); free(gw[e]); free(uw[e]); free(dw[e]);
    }
}

static void test_backend_new(void **state)
{
    char err[256];
    backend_t *be = backend_new("cpu", 1, err, sizeof err);
    assert_non_null(be);
    assert_string_equal(be->ops->name, "cpu");
    assert_int_equal(be->n_threads, 1);
    backend_destroy(&be);
    assert_null(be);
    backend_destroy(&be);                          /* idempotent */
    assert_null(backend_new("tpu", 1, err, sizeof err));
    assert_non_null(strstr(err, "tpu"));
    assert_null(backend_new("cuda:x", 1, err, sizeof err));
    assert_non_null(strstr(err, "cuda:x"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_unaligned_weights),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_head_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_gather_and_argmax),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_fp8_loads),
        cmocka_unit_test(test_kv_store_fp8_rounding),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_ffn),
        cmocka_unit_test(test_backend_new),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
