/* tests/unit/kvscale_harness.h — one attention step over a paged KV cache on any backend, for the
 * KV scale tests (tests/unit/test_kvscale.c on the CPU, tests/gpu/test_kvscale_cuda.c on CUDA).
 *
 * A case is a few sequences of len[s] positions each in blocks of bs slots (sequence s's blocks
 * after sequence s-1's, in reverse order so a wrong block table shows). kvs_run stores K and V of
 * every position with one kv_store call (or rope_kv_store), then runs attention for the last
 * rows[s] positions of each sequence, and returns the output; the pool's bytes come back too.
 * Static functions only: each test includes it once. */
#ifndef TROUPE_TESTS_KVSCALE_HARNESS_H
#define TROUPE_TESTS_KVSCALE_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "kernels/backend.h"

#define KVS_MAX_SEQS 4

typedef struct kvs_case {
    const char *name;
    int n_heads, n_kv, D, bs, n_layers, layer;
    int n_seqs;
    int len[KVS_MAX_SEQS];        /* positions per sequence */
    int rows[KVS_MAX_SEQS];       /* attention rows per sequence: its last rows[s] positions */
} kvs_case_t;

static int kvs_positions(const kvs_case_t *c)
{
    int n = 0;
    for (int s = 0; s < c->n_seqs; s++)
        n += c->len[s];
    return n;
}

static int kvs_rows(const kvs_case_t *c)
{
    int n = 0;
    for (int s = 0; s < c->n_seqs; s++)
        n += c->rows[s];
    return n;
}

static uint64_t kvs_rng = 0x9e3779b97f4a7c15ull;
static double kvs_uniform(void)                   /* in (-1, 1) */
{
    kvs_rng ^= kvs_rng << 13;
    kvs_rng ^= kvs_rng >> 7;
    kvs_rng ^= kvs_rng << 17;
    return 2.0 * (((kvs_rng >> 11) + 0.5) / 9007199254740992.0) - 1.0;
}

static float *kvs_rand(size_t n, double scale)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(kvs_uniform() * scale);
    return p;
}

static void *kvs_put(backend_t *be, const void *host, size_t bytes)
{
    void *p = be->ops->alloc(be, bytes ? bytes : 4);
    if (p && bytes)
        be->ops->upload(be, p, host, bytes);
    return p;
}

/* Per-layer, K or V, kv-head amax of kx / vx ([positions][n_kv][D] each, every layer the same
 * values) as scales amax / 448 ([n_layers][2][n_kv]). */
static float *kvs_amax_scales(const kvs_case_t *c, const float *kx, const float *vx)
{
    const int P = kvs_positions(c);
    float *s = calloc((size_t)c->n_layers * 2 * c->n_kv, sizeof(float));
    for (int which = 0; which < 2; which++)
        for (int h = 0; h < c->n_kv; h++) {
            float a = 0;
            const float *x = which ? vx : kx;
            for (int p = 0; p < P; p++)
                for (int d = 0; d < c->D; d++) {
                    const float v = fabsf(x[((size_t)p * c->n_kv + h) * c->D + d]);
                    a = v > a ? v : a;
                }
            for (int l = 0; l < c->n_layers; l++)
                s[((size_t)l * 2 + which) * c->n_kv + h] = a / 448.0f;
        }
    return s;
}

/* Stores kx, vx ([positions][n_kv][D], positions in sequence order) into a fresh pool of dtype dt
 * with scales (host [n_layers][2][n_kv], NULL: none), through kv_store; with inv_freq (host [D/2])
 * K is first rotated by RoPE at its position, by the backend's rope_kv_store when kvs_fused is 1
 * (a random q rotated with it and dropped), else by rope then kv_store. Then attention of q
 * ([rows][n_heads][D]). Returns the output (host [rows][n_heads][D]); *pool_out (may be NULL)
 * gets the pool's bytes, *pool_bytes their size. */
static int kvs_fused = 1;
static float *kvs_run(backend_t *be, const kvs_case_t *c, dtype_t dt, const float *scales, const float *kx,
                      const float *vx, const float *q, const float *inv_freq, uint8_t **pool_out, size_t *pool_bytes)
{
    const backend_ops_t *op = be->ops;
    const int P = kvs_positions(c), T = kvs_rows(c), D = c->D;
    int nb[KVS_MAX_SEQS], n_blocks = 0;
    for (int s = 0; s < c->n_seqs; s++)
        n_blocks += nb[s] = (c->len[s] + c->bs - 1) / c->bs;
    bk_kv_t kv = {.dtype = dt, .n_blocks = n_blocks, .block_size = c->bs, .n_layers = c->n_layers,
                  .n_kv_heads = c->n_kv, .head_dim = D};
    kv.block_bytes = (size_t)c->n_layers * 2 * c->bs * c->n_kv * D * dtype_size(dt);
    const size_t bytes = kv.block_bytes * (size_t)n_blocks;
    uint8_t *zero = calloc(1, bytes);
    kv.base = kvs_put(be, zero, bytes);
    free(zero);
    float *dscale = NULL;
    if (scales)
        kv.scale = dscale = kvs_put(be, scales, (size_t)c->n_layers * 2 * c->n_kv * sizeof(float));

    /* Metadata: [store rows: seq P | pos P] [attention rows: seq T | pos T] [bt_start S] [bt]. */
    const int S = c->n_seqs;
    int32_t *h = malloc((size_t)(2 * P + 2 * T + S + n_blocks) * 4);
    int32_t *sseq = h, *spos = h + P, *aseq = h + 2 * P, *apos = aseq + T, *bts = apos + T, *bt = bts + S;
    for (int s = 0, at = 0, r = 0, b0 = 0; s < S; s++) {
        bts[s] = b0;
        for (int b = 0; b < nb[s]; b++)
            bt[b0 + b] = n_blocks - 1 - (b0 + b);
        b0 += nb[s];
        for (int p = 0; p < c->len[s]; p++, at++)
            sseq[at] = s, spos[at] = p;
        for (int p = c->len[s] - c->rows[s]; p < c->len[s]; p++, r++)
            aseq[r] = s, apos[r] = p;
    }
    int32_t *dm = kvs_put(be, h, (size_t)(2 * P + 2 * T + S + n_blocks) * 4);
    free(h);
    bk_attn_meta_t sm = {.n_tokens = P, .n_seqs = S, .tok_seq = dm, .tok_pos = dm + P,
                         .seq_bt_start = dm + 2 * P + 2 * T, .block_table = dm + 2 * P + 2 * T + S};
    bk_attn_meta_t am = sm;
    am.n_tokens = T;
    am.tok_seq = dm + 2 * P;
    am.tok_pos = dm + 2 * P + T;

    const size_t kvn = (size_t)P * c->n_kv * D, qn = (size_t)T * c->n_heads * D;
    float *dk = kvs_put(be, kx, kvn * 4), *dv = kvs_put(be, vx, kvn * 4), *dq = kvs_put(be, q, qn * 4);
    float *dout = op->alloc(be, qn * 4);
    if (inv_freq) {
        float *qr = kvs_rand((size_t)P * c->n_heads * D, 1.0);
        float *dqr = kvs_put(be, qr, (size_t)P * c->n_heads * D * 4), *dif = kvs_put(be, inv_freq, (size_t)D / 2 * 4);
        if (kvs_fused && op->rope_kv_store) {
            op->rope_kv_store(be, &kv, c->layer, dqr, dk, dv, c->n_heads, dif, &sm);
        } else {
            op->rope(be, dk, sm.tok_pos, dif, P, c->n_kv, D);
            op->kv_store(be, &kv, c->layer, dk, dv, &sm);
        }
        op->free(be, dqr);
        op->free(be, dif);
        free(qr);
    } else {
        op->kv_store(be, &kv, c->layer, dk, dv, &sm);
    }
    op->attention(be, &kv, c->layer, dq, c->n_heads, 1.0f / sqrtf((float)D), &am, dout);
    float *out = malloc(qn * 4);
    op->download(be, out, dout, qn * 4);
    if (pool_out) {
        *pool_out = malloc(bytes);
        op->download(be, *pool_out, kv.base, bytes);
    }
    if (pool_bytes)
        *pool_bytes = bytes;
    op->free(be, dout);
    op->free(be, dq);
    op->free(be, dv);
    op->free(be, dk);
    op->free(be, dm);
    if (dscale)
        op->free(be, dscale);
    op->free(be, kv.base);
    return out;
}

/* Relative RMS error of got against ref; NaN gives +inf. */
static double kvs_rel_err(const float *got, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i]))
            return INFINITY;
        const double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
