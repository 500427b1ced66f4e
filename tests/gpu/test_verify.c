/* tests/gpu/test_verify.c — speculative verify steps on the GPU: k + 1 rows per sequence (a token
 * and its k drafts) at full speed.
 *
 * 1. Attention (backend op) with the meta naming each sequence's rows (seq_row0, max_rows), as
 *    engine/forward.c lays a step out: the CUDA backend's tensor-core decode kernel takes a
 *    sequence's rows together (kernels/cuda/cuda_attention_decode_mma.cu), against the CPU backend
 *    (the reference), for k = 0..7, batch sizes 1, 5 and 24, bf16 and fp8 caches, on the 8B shape's
 *    heads (32 over 8, head_dim 128) and on G = 8 (D 64), G = 16 and G = 1; contexts from a single
 *    key (the rows' own) to ~600, blocks of 16 and 5 slots; steps where some sequences verify k
 *    drafts and others have one row or fewer drafts. Bound: relative L2 error 5e-3 over the call
 *    and 3e-2 per row (bf16 q and p, like the decode kernel's own test); an error of f32 size on
 *    a bf16 cache means the rows went to the f32 flash kernel instead, and fails.
 * 2. Timing lines (not checks): verify attention over 1,000 keys per sequence, 8B heads (and G = 8)
 *    at batch 64 x 1..8 rows, on the default path, TROUPE_CUDA_ATTN_VERIFY=1 and =0, and without
 *    the hint; one-row decode with and without split-KV at batch 16..256.
 * 3. The model: a verify step (every sequence with k + 1 new rows, logits of every row) replayed
 *    from a CUDA graph gives the bits of the same step op by op, for k = 1..7 at batch 1, 3 and
 *    8, bucket by bucket (recorded the second time a bucket comes); the device argmax of each row
 *    equals the argmax of its downloaded logits; n_logits takes the last rows' logits only.
 * Runs on the GPU node (tools/gpu-run.sh, VERIFY_TABLE=1 with the cost table); CI only compiles it. */
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
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "tests/gpu/model_steps.h"

static backend_t *s_cpu;
static backend_t *s_gpu1;         /* TROUPE_CUDA_ATTN_VERIFY=1: one m16 tile per block, else the prefill kernel */
static backend_t *s_gpu0;         /* TROUPE_CUDA_ATTN_VERIFY=0: verify rows as any rows (the kernels before) */
static backend_t *s_gpu_nosplit;  /* TROUPE_CUDA_ATTN_SPLIT=0 (timings only) */
static backend_t *s_gpu_split[3]; /* TROUPE_CUDA_ATTN_SPLIT_BLOCKS=8, 4, 2 (timings only) */

static uint64_t s_rng = 0x2545F4914F6CDD1Dull;
static double s_uniform(void)   /* [-1, 1) */
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (double)(s_rng >> 11) / (double)(1ull << 52) - 1.0;
}
static int s_randint(int n) { return (int)((s_uniform() + 1.0) / 2.0 * n) % n; }

static void *s_put(backend_t *be, const void *host, size_t bytes)
{
    void *p = be->ops->alloc(be, bytes ? bytes : 4);
    if (!p || (bytes && be->ops->upload(be, p, host, bytes) != 0))
        fail_msg("%s: cannot place %zu bytes", be->ops->name, bytes);
    return p;
}
static float *s_get(backend_t *be, const void *dev, size_t n)
{
    float *h = malloc(n * sizeof(float));
    if (be->ops->download(be, h, dev, n * sizeof(float)) != 0)
        fail_msg("%s: download failed (a device error in the op?)", be->ops->name);
    return h;
}

/* ---- 1, 2: attention ------------------------------------------------------------------------ */

typedef struct vcase {
    dtype_t dt;
    int n_heads, n_kv, D, bs;
    int B;                        /* sequences */
    int k;                        /* drafts of the verifying sequences */
    int mixed;                    /* 1: every third sequence one row, every third k / 2 drafts */
    int max_ctx;                  /* contexts 1 .. max_ctx (at least the sequence's rows) */
} vcase_t;

typedef struct vsetup {
    int T, S, n_bt, max_rows;
    int32_t *meta;                /* tok_seq [T] | tok_pos [T] | bt_start [S] | seq_row0 [S + 1] | bt [n_bt] */
    bk_kv_t kv;
    size_t pool_bytes;
    uint8_t *pool;
} vsetup_t;

static void s_vsetup(const vcase_t *c, vsetup_t *v)
{
    memset(v, 0, sizeof *v);
    int len[256], rows[256], total = 0;
    assert_true(c->B <= 256);
    for (int s = 0; s < c->B; s++) {
        rows[s] = c->k + 1;
        if (c->mixed && s % 3 == 1)
            rows[s] = 1;
        if (c->mixed && s % 3 == 2)
            rows[s] = c->k / 2 + 1;
        len[s] = rows[s] + s_randint(c->max_ctx);
        if (s == 0)
            len[s] = rows[s];           /* no cached key: the rows attend to themselves alone */
        v->T += rows[s];
        v->max_rows = rows[s] > v->max_rows ? rows[s] : v->max_rows;
        total += (len[s] + c->bs - 1) / c->bs;
    }
    v->S = c->B;
    v->n_bt = total;
    const int n_blocks = total + 3;
    v->meta = malloc((size_t)(2 * v->T + 2 * v->S + 1 + v->n_bt) * sizeof(int32_t));
    int32_t *tseq = v->meta, *tpos = tseq + v->T, *bt_start = tpos + v->T, *row0 = bt_start + v->S,
            *bt = row0 + v->S + 1;
    int *perm = malloc((size_t)n_blocks * sizeof(int));
    for (int i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = s_randint(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0, at = 0, t = 0, b = 0; s < c->B; s++) {
        bt_start[s] = b;
        for (int i = 0; i < (len[s] + c->bs - 1) / c->bs; i++)
            bt[b++] = perm[at++];
        row0[s] = t;
        for (int p = len[s] - rows[s]; p < len[s]; p++, t++) {
            tseq[t] = s;
            tpos[t] = p;
        }
    }
    row0[v->S] = v->T;
    free(perm);
    const size_t es = dtype_size(c->dt);
    v->kv = (bk_kv_t){.dtype = c->dt, .n_blocks = n_blocks, .block_size = c->bs, .n_layers = 1,
                      .n_kv_heads = c->n_kv, .head_dim = c->D};
    v->kv.block_bytes = (size_t)2 * c->bs * c->n_kv * c->D * es;
    v->pool_bytes = v->kv.block_bytes * (size_t)n_blocks;
    const size_t n = v->pool_bytes / es;
    v->pool = malloc(v->pool_bytes);
    for (size_t i = 0; i < n; i++) {
        const float x = (float)s_uniform();
        dtype_from_f32(c->dt, &x, v->pool + i * es, 1);
    }
}

/* The meta on be (one upload); hint 0 leaves seq_row0 / max_rows out (the rows as any rows). */
static int32_t *s_vmeta(backend_t *be, const vsetup_t *v, int hint, bk_attn_meta_t *meta)
{
    int32_t *d = s_put(be, v->meta, (size_t)(2 * v->T + 2 * v->S + 1 + v->n_bt) * sizeof(int32_t));
    *meta = (bk_attn_meta_t){.n_tokens = v->T, .n_seqs = v->S, .tok_seq = d, .tok_pos = d + v->T,
                             .seq_bt_start = d + 2 * v->T, .block_table = d + 2 * v->T + 2 * v->S + 1};
    if (hint) {
        meta->seq_row0 = d + 2 * v->T + v->S;
        meta->max_rows = v->max_rows;
    }
    return d;
}

/* out [T][n_heads][D] of case c on be (the hint given). */
static float *s_vrun(backend_t *be, const vcase_t *c, const vsetup_t *v, const float *q, int hint)
{
    const size_t n = (size_t)v->T * c->n_heads * c->D;
    bk_kv_t kv = v->kv;
    kv.base = s_put(be, v->pool, v->pool_bytes);
    bk_attn_meta_t meta;
    int32_t *dm = s_vmeta(be, v, hint, &meta);
    float *dq = s_put(be, q, n * sizeof(float)), *dout = be->ops->alloc(be, n * sizeof(float));
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        nan[i] = NAN;
    assert_int_equal(be->ops->upload(be, dout, nan, n * sizeof(float)), 0);
    free(nan);
    be->ops->attention(be, &kv, 0, dq, c->n_heads, 1.0f / sqrtf((float)c->D), &meta, dout);
    float *out = s_get(be, dout, n);
    be->ops->free(be, kv.base);
    be->ops->free(be, dm);
    be->ops->free(be, dq);
    be->ops->free(be, dout);
    return out;
}

/* got (from gpu) against ref: fails beyond the bounds, prints the errors. */
static void s_vcheck(backend_t *gpu, const vcase_t *c, const vsetup_t *vs, const float *q, const float *ref)
{
    const vsetup_t v = *vs;
    const size_t row = (size_t)c->n_heads * c->D;
    float *got = s_vrun(gpu, c, &v, q, 1);
    double num = 0, den = 0, worst = 0;
    int worst_t = 0;
    for (int t = 0; t < v.T; t++) {
        double rn = 0, rd = 0;
        for (size_t i = 0; i < row; i++) {
            const double g = got[t * row + i], r = ref[t * row + i];
            if (isnan(g))
                fail_msg("%s G=%d D=%d B=%d k=%d: row %d element %zu is NaN (never written?)", dtype_name(c->dt),
                         c->n_heads / c->n_kv, c->D, c->B, c->k, t, i);
            rn += (g - r) * (g - r);
            rd += r * r;
        }
        num += rn;
        den += rd;
        const double e = sqrt(rn / rd);
        if (e > worst)
            worst = e, worst_t = t;
    }
    const double e = sqrt(num / den);
    char what[160];
    snprintf(what, sizeof what, "%s heads %d/%d D=%d block %d B=%d k=%d%s (%d rows)%s", dtype_name(c->dt), c->n_heads,
             c->n_kv, c->D, c->bs, c->B, c->k, c->mixed ? " mixed" : "", v.T, gpu == s_gpu1 ? " [verify 1]" : "");
    if (!(e <= 5e-3) || !(worst <= 3e-2))
        fail_msg("%s: relative error %.3g (bound 5e-3), row %d (position %d) %.3g (bound 3e-2)", what, e, worst_t,
                 v.meta[v.T + worst_t], worst);
    if (c->dt == DT_BF16 && v.max_rows > 1 && e < 1e-5)
        fail_msg("%s: relative error %.3g is f32-sized: the rows did not take the tensor-core kernel", what, e);
    print_message("  %-70s rel err %.2e, worst row %.2e\n", what, e, worst);
    free(got);
}

static void s_vcase(const vcase_t *c)
{
    vsetup_t v;
    s_vsetup(c, &v);
    const size_t n = (size_t)v.T * c->n_heads * c->D;
    float *q = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        q[i] = (float)(3.0 * s_uniform());
    float *ref = s_vrun(s_cpu, c, &v, q, 1);
    s_vcheck(s_gpu, c, &v, q, ref);
    if (v.max_rows * (c->n_heads / c->n_kv) > 16)   /* the prefill kernel's way with them too */
        s_vcheck(s_gpu1, c, &v, q, ref);
    free(q), free(ref), free(v.meta), free(v.pool);
}

static void test_verify_attention(void **state)
{
    (void)state;
    static const struct { dtype_t dt; int n_heads, n_kv, D, bs, max_ctx; } shapes[] = {
        {DT_BF16, 32, 8, 128, 16, 600}, {DT_F8E4M3, 32, 8, 128, 16, 600}, {DT_BF16, 32, 4, 64, 5, 300},
        {DT_F8E4M3, 32, 4, 64, 16, 300}, {DT_BF16, 16, 1, 128, 16, 200}, {DT_BF16, 4, 4, 64, 16, 200},
        {DT_F8E4M3, 16, 1, 128, 5, 200},
    };
    static const int batches[] = {1, 5, 24};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int k = 0; k <= 7; k++)
            for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                if (si > 1 && bi == 2 && k % 2 == 0)   /* keep the CPU reference's time down */
                    continue;
                const vcase_t c = {shapes[si].dt, shapes[si].n_heads, shapes[si].n_kv, shapes[si].D, shapes[si].bs,
                                   batches[bi], k, 0, shapes[si].max_ctx};
                s_vcase(&c);
            }
    /* Sequences that verify k drafts, fewer, or none (one row), in one step. */
    for (int k = 2; k <= 7; k += 5)
        for (size_t si = 0; si < 4; si++) {
            const vcase_t c = {shapes[si].dt, shapes[si].n_heads, shapes[si].n_kv, shapes[si].D, shapes[si].bs, 9, k, 1,
                               shapes[si].max_ctx};
            s_vcase(&c);
        }
}

/* Mean time of `reps` attention calls of case c (1,000 keys each) on gpu, the hint given. */
static double s_vtime(backend_t *gpu, const vcase_t *c, const vsetup_t *v, int hint, int reps)
{
    const size_t n = (size_t)v->T * c->n_heads * c->D;
    bk_kv_t kv = v->kv;
    kv.base = s_put(gpu, v->pool, v->pool_bytes);
    bk_attn_meta_t meta;
    int32_t *dm = s_vmeta(gpu, v, hint, &meta);
    float *q = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        q[i] = (float)s_uniform();
    float *dq = s_put(gpu, q, n * sizeof(float)), *dout = gpu->ops->alloc(gpu, n * sizeof(float));
    const float scale = 1.0f / sqrtf((float)c->D);
    gpu->ops->attention(gpu, &kv, 0, dq, c->n_heads, scale, &meta, dout);   /* warm-up */
    gpu->ops->sync(gpu);
    const int64_t t0 = now_ns();
    for (int r = 0; r < reps; r++)
        gpu->ops->attention(gpu, &kv, 0, dq, c->n_heads, scale, &meta, dout);
    gpu->ops->sync(gpu);
    const double us = (double)(now_ns() - t0) / 1e3 / reps;
    free(q);
    gpu->ops->free(gpu, kv.base);
    gpu->ops->free(gpu, dm);
    gpu->ops->free(gpu, dq);
    gpu->ops->free(gpu, dout);
    return us;
}

/* One timing line: case (dt, heads, B, rows per sequence) over 1,000 keys per sequence, on the
 * default backend, TROUPE_CUDA_ATTN_VERIFY=1 and =0, without the hint, and (one row) without
 * split-KV. */
static void s_time_case(dtype_t dt, int n_heads, int n_kv, int B, int rows)
{
    const vcase_t c = {dt, n_heads, n_kv, 128, 16, B, rows - 1, 0, 1};
    vsetup_t v;
    s_vsetup(&c, &v);
    for (int t = 0; t < v.T; t++)   /* every sequence's rows: the last of 1,000 positions */
        v.meta[v.T + t] = 1000 - rows + t % rows;
    free(v.pool);
    const int nb = (1000 + c.bs - 1) / c.bs;
    v.n_bt = c.B * nb;
    v.meta = realloc(v.meta, (size_t)(2 * v.T + 2 * v.S + 1 + v.n_bt) * sizeof(int32_t));
    int32_t *bt_start = v.meta + 2 * v.T, *bt = bt_start + 2 * v.S + 1;
    for (int s = 0; s < c.B; s++) {
        bt_start[s] = s * nb;
        for (int i = 0; i < nb; i++)
            bt[s * nb + i] = s * nb + i;
    }
    v.kv.n_blocks = v.n_bt;
    v.pool_bytes = v.kv.block_bytes * (size_t)v.n_bt;
    v.pool = calloc(1, v.pool_bytes);
    const double t2 = s_vtime(s_gpu, &c, &v, 1, 20), t1 = s_vtime(s_gpu1, &c, &v, 1, 20),
                 t0 = s_vtime(s_gpu0, &c, &v, 1, 20), th = s_vtime(s_gpu, &c, &v, 0, 20);
    char extra[64] = "";
    if (rows == 1)
        snprintf(extra, sizeof extra, ", %.1f us without split-KV", s_vtime(s_gpu_nosplit, &c, &v, 1, 20));
    print_message("  time: %s heads %d/%d, batch %d x %d rows, 1,000 keys: %.1f us (default), %.1f us "
                  "(TROUPE_CUDA_ATTN_VERIFY=1), %.1f us (=0), %.1f us without the hint%s\n", dtype_name(dt), n_heads, n_kv,
                  B, rows, t2, t1, t0, th, extra);
    free(v.meta), free(v.pool);
}

/* The decode kernel's split-KV target (TROUPE_CUDA_ATTN_SPLIT_BLOCKS) on one-row decode: batch B,
 * ctx keys per sequence, 8B heads, bf16. */
static void s_split_sweep(int B, int ctx)
{
    const vcase_t c = {DT_BF16, 32, 8, 128, 16, B, 0, 0, 1};
    vsetup_t v;
    s_vsetup(&c, &v);
    for (int t = 0; t < v.T; t++)
        v.meta[v.T + t] = ctx - 1;
    free(v.pool);
    const int nb = (ctx + c.bs - 1) / c.bs;
    v.n_bt = c.B * nb;
    v.meta = realloc(v.meta, (size_t)(2 * v.T + 2 * v.S + 1 + v.n_bt) * sizeof(int32_t));
    int32_t *bt_start = v.meta + 2 * v.T, *bt = bt_start + 2 * v.S + 1;
    for (int s = 0; s < c.B; s++) {
        bt_start[s] = s * nb;
        for (int i = 0; i < nb; i++)
            bt[s * nb + i] = s * nb + i;
    }
    v.kv.n_blocks = v.n_bt;
    v.pool_bytes = v.kv.block_bytes * (size_t)v.n_bt;
    v.pool = calloc(1, v.pool_bytes);
    double t[5];
    backend_t *be[5] = {s_gpu, s_gpu_split[0], s_gpu_split[1], s_gpu_split[2], s_gpu_nosplit};
    for (int i = 0; i < 5; i++)
        t[i] = s_vtime(be[i], &c, &v, 1, 20);
    print_message("  split: batch %d, %d keys: %.1f us (1 block per SM, default), %.1f (8), %.1f (4), %.1f (2), "
                  "%.1f (no split)\n", B, ctx, t[0], t[1], t[2], t[3], t[4]);
    free(v.meta), free(v.pool);
}

static void test_verify_attention_time(void **state)
{
    for (int B = 1; B <= 64; B *= 2) {
        s_split_sweep(B, 1000);
        s_split_sweep(B, 4000);
    }
    (void)state;
    for (int di = 0; di < 2; di++)
        for (int rows = 1; rows <= 8; rows++)
            s_time_case(di ? DT_F8E4M3 : DT_BF16, 32, 8, 64, rows);
    for (int rows = 1; rows <= 8; rows *= 2)
        s_time_case(DT_BF16, 32, 4, 64, rows);
    s_time_case(DT_BF16, 32, 4, 64, 6);
    for (int B = 16; B <= 256; B *= 2)
        if (B != 64)
            s_time_case(DT_BF16, 32, 8, B, 1);
    s_time_case(DT_BF16, 32, 8, 256, 4);
    s_time_case(DT_BF16, 32, 8, 1, 4);
}

/* ---- 3: the model: graphs, argmax, n_logits ------------------------------------------------- */

enum { M_SEQ = 8 };

/* A verify run on dummy bf16 weights of the fixture's shape: prompts, then steps of (B, k) from
 * the schedule, every row's logits; returns them all, *n_rows their count. */
static float *s_mrun(const char *dir, const model_config_t *cfg, int no_graphs, const int (*sched)[2], int n_steps,
                     uint64_t *records, uint64_t *replays, size_t *n_rows, int check_argmax)
{
    char err[512];
    ckpt_t *ck = ckpt_dummy(DT_BF16, 0);
    model_opts_t o = {.max_tokens = 256, .max_seqs = M_SEQ, .max_logit_rows = 256, .max_context = 256,
                      .kv_block_size = 4, .no_graphs = no_graphs};
    model_t *m = model_load(dir, cfg, ck, s_gpu, &o, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    kvpool_t *pool = kvpool_new(M_SEQ * (256 / 4 + 1), 4, cfg->num_layers, cfg->num_kv_heads, cfg->head_dim, DT_BF16,
                                s_gpu, err, sizeof err);
    if (!pool)
        fail_msg("%s", err);
    const int V = cfg->vocab_size;
    size_t rows = M_SEQ;
    for (int i = 0; i < n_steps; i++)
        rows += (size_t)sched[i][0] * (sched[i][1] + 1);
    float *lg = malloc(rows * V * sizeof(float));
    kvseq_t *seqs[M_SEQ];
    model_seq_t q[M_SEQ];
    for (int s = 0; s < M_SEQ; s++) {
        seqs[s] = kvseq_new(pool, 256, 0);
        assert_non_null(seqs[s]);
        for (int i = 0; i < 6 + 5 * s; i++) {
            const int32_t id = (int32_t)((i * 7919 + s * 104729 + 3) % V);
            assert_int_equal(kvseq_append(seqs[s], &id, 1), 0);
        }
        q[s] = (model_seq_t){.kv = seqs[s], .n_new = 6 + 5 * s};
    }
    model_batch_t b = {.n_seqs = M_SEQ, .seqs = q};
    if (model_forward(m, &b, lg, err, sizeof err) < 0)
        fail_msg("prompts: %s", err);
    size_t at = M_SEQ;
    int32_t ids[256];
    uint8_t need[256];
    for (int step = 0; step < n_steps; step++) {
        const int B = sched[step][0], k = sched[step][1];
        for (int s = 0; s < B; s++) {
            kvseq_publish(seqs[s]);
            for (int j = 0; j <= k; j++) {
                const int32_t id = (int32_t)((step * 131 + s * 17 + j * 5 + 9) % V);
                assert_int_equal(kvseq_append(seqs[s], &id, 1), 0);
            }
            q[s] = (model_seq_t){.kv = seqs[s], .n_new = k + 1};
        }
        const int R = B * (k + 1);
        memset(need, 1, (size_t)R);
        b = (model_batch_t){.n_seqs = B, .seqs = q, .all_logits = 1, .argmax_out = ids, .need_logits = need};
        if (model_forward(m, &b, lg + at * V, err, sizeof err) < 0)
            fail_msg("step %d (batch %d, k %d): %s", step, B, k, err);
        for (int r = 0; check_argmax && r < R; r++) {
            const float *x = lg + (at + (size_t)r) * V;
            int best = 0;
            for (int i = 1; i < V; i++)
                if (x[i] > x[best])
                    best = i;
            if (ids[r] != best)
                fail_msg("step %d row %d: device argmax %d, the logits' %d", step, r, ids[r], best);
        }
        at += (size_t)R;
        for (int s = 0; s < B; s++)   /* roll back to k / 2 drafts accepted, as a verify step does */
            assert_int_equal(kvseq_truncate(seqs[s], kvseq_len(seqs[s]) - (k - k / 2)), 0);
    }
    /* n_logits: the last 2 rows of a 4-row step, next to the same step's every row. */
    for (int s = 0; s < 2; s++) {
        for (int j = 0; j < 4; j++) {
            const int32_t id = (int32_t)(j * 31 + s + 1);
            assert_int_equal(kvseq_append(seqs[s], &id, 1), 0);
        }
        q[s] = (model_seq_t){.kv = seqs[s], .n_new = 4, .n_logits = 2};
    }
    float *two = malloc((size_t)4 * V * sizeof(float)), *all = malloc((size_t)8 * V * sizeof(float));
    b = (model_batch_t){.n_seqs = 2, .seqs = q};
    if (model_forward(m, &b, two, err, sizeof err) < 0)
        fail_msg("n_logits step: %s", err);
    q[0].n_logits = q[1].n_logits = 0;
    b.all_logits = 1;
    if (model_forward(m, &b, all, err, sizeof err) < 0)
        fail_msg("all_logits step: %s", err);
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 2; j++) {
            const float *x = two + (size_t)(2 * s + j) * V, *y = all + (size_t)(4 * s + 2 + j) * V;
            double num = 0, den = 0;
            for (int i = 0; i < V; i++)
                num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]), den += (double)y[i] * y[i];
            if (!(sqrt(num / den) < 1e-2))   /* 2 or 8 rows of logits: the LM head's GEMM path may differ */
                fail_msg("n_logits: sequence %d row %d differs from the all_logits step's (%.3g)", s, 2 + j,
                         sqrt(num / den));
        }
    free(two), free(all);
    model_graph_stats(m, records, replays);
    *n_rows = rows;
    for (int s = 0; s < M_SEQ; s++)
        kvseq_destroy(&seqs[s]);
    kvpool_destroy(&pool);
    model_destroy(&m);
    ckpt_destroy(&ck);
    return lg;
}

static void test_verify_graphs(void **state)
{
    (void)state;
    static const int sched[][2] = {{1, 3}, {1, 3}, {1, 3}, {3, 1}, {3, 1}, {3, 1}, {8, 7}, {8, 7}, {8, 7},
                                   {3, 5}, {3, 5}, {8, 2}, {8, 2}, {8, 2}, {1, 7}, {1, 7}, {3, 1}};
    const int n_steps = (int)(sizeof sched / sizeof sched[0]);
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/%s", gpu_fixture_root(), "llama-gqa-f32");
    model_config_t cfg;
    if (config_load(dir, &cfg, err, sizeof err) < 0)
        fail_msg("%s", err);
    uint64_t rec0, rep0, rec1, rep1;
    size_t n0, n1;
    float *eager = s_mrun(dir, &cfg, 1, sched, n_steps, &rec0, &rep0, &n0, 1);
    float *graph = s_mrun(dir, &cfg, 0, sched, n_steps, &rec1, &rep1, &n1, 0);
    assert_int_equal(n0, n1);
    assert_int_equal(rec0 + rep0, 0);
    const size_t n = n0 * (size_t)cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&eager[i], &graph[i], 4) != 0)
            fail_msg("logits row %zu, id %zu: graphs %.9g, op by op %.9g", i / cfg.vocab_size, i % cfg.vocab_size,
                     graph[i], eager[i]);
    /* buckets (1,3) (3,1) (8,7) (8,2) recorded (each came 3 times), (3,5) and (1,7) twice */
    if (rec1 < 6 || rep1 < rec1 + 4)
        fail_msg("%llu verify steps recorded (want >= 6), %llu replayed", (unsigned long long)rec1,
                 (unsigned long long)rep1);
    print_message("  llama-gqa (dummy bf16) %d verify steps: logits bit-identical with and without graphs (%llu "
                  "recorded, %llu replayed); device argmax = host argmax; n_logits rows\n", n_steps,
                  (unsigned long long)rec1, (unsigned long long)rep1);
    free(eager), free(graph);
}

/* A CUDA backend made with name=value in the environment. */
static backend_t *s_gpu_env(const char *name, const char *value)
{
    char err[256];
    setenv(name, value, 1);
    backend_t *be = backend_new("cuda", 0, err, sizeof err);
    unsetenv(name);
    if (!be)
        fprintf(stderr, "%s\n", err);
    return be;
}

static int s_setup(void **state)
{
    char err[256];
    s_cpu = backend_new("cpu", 0, err, sizeof err);
    if (!s_cpu) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    s_gpu1 = s_gpu_env("TROUPE_CUDA_ATTN_VERIFY", "1");
    s_gpu0 = s_gpu_env("TROUPE_CUDA_ATTN_VERIFY", "0");
    s_gpu_nosplit = s_gpu_env("TROUPE_CUDA_ATTN_SPLIT", "0");
    s_gpu_split[0] = s_gpu_env("TROUPE_CUDA_ATTN_SPLIT_BLOCKS", "8");
    s_gpu_split[1] = s_gpu_env("TROUPE_CUDA_ATTN_SPLIT_BLOCKS", "4");
    s_gpu_split[2] = s_gpu_env("TROUPE_CUDA_ATTN_SPLIT_BLOCKS", "2");
    return s_gpu1 && s_gpu0 && s_gpu_nosplit && s_gpu_split[0] && s_gpu_split[1] && s_gpu_split[2] ? gpu_setup(state) : -1;
}

static int s_teardown(void **state)
{
    backend_destroy(&s_cpu);
    backend_destroy(&s_gpu1);
    backend_destroy(&s_gpu0);
    backend_destroy(&s_gpu_nosplit);
    for (int i = 0; i < 3; i++)
        backend_destroy(&s_gpu_split[i]);
    return gpu_teardown(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_attention),
        cmocka_unit_test(test_verify_attention_time),
        cmocka_unit_test(test_verify_graphs),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
