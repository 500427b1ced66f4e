/* kernels/cpu/cpu_mla.c — DeepSeek-V3's ops on the CPU: MLA's RoPE, compressed-cache store and
 * absorbed attention, the per-head matmul, an elementwise add, the sigmoid group-limited MoE
 * router and the MTP layer's draft with its probability (mtp_top). Semantics: kernels/backend.h (the DeepSeek-V3 block of backend_ops_t). Plain scalar loops
 * in a fixed order: this is the reference the CUDA kernels are compared with. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_simd.h"

/* The element address of token slot `slot`'s W-vector of `layer` in block `block`. */
static inline uint8_t *s_slot(const bk_kv_t *kv, int32_t block, int layer, int slot)
{
    const size_t W = 2 * (size_t)kv->head_dim, es = dtype_size(kv->dtype);
    return (uint8_t *)kv->base + (size_t)block * kv->block_bytes +
           (((size_t)layer * (size_t)kv->block_size + (size_t)slot) * W) * es;
}

/* cos/sin of row position p for i < half, times mul (f32 at every step). */
static void s_angles(float p, const float *inv_freq, int half, float mul, float *c, float *s)
{
    for (int i = 0; i < half; i++) {
        float a = p * inv_freq[i];
        c[i] = cosf(a) * mul;
        s[i] = sinf(a) * mul;
    }
}

/* RoPE of one vector x [d] into out [d] (may not alias). */
static void s_rope_vec(const float *x, int d, int interleave, const float *c, const float *s, float *out)
{
    const int half = d / 2;
    for (int i = 0; i < half; i++) {
        float lo = interleave ? x[2 * i] : x[i], hi = interleave ? x[2 * i + 1] : x[i + half];
        float plo = lo * c[i], phi = hi * s[i], qlo = hi * c[i], qhi = lo * s[i];
        out[i] = plo - phi;
        out[i + half] = qlo + qhi;
    }
}

void cpu_mla_rope_q(backend_t *be, const float *q, int M, int n_heads, int head_stride, int rope_off, int rope_dim,
                    const int32_t *pos, const float *inv_freq, float mul, int interleave, float *out)
{
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (M > 4)
    for (int t = 0; t < M; t++) {
        float c[BK_MAX_HEAD_DIM / 2], s[BK_MAX_HEAD_DIM / 2];
        s_angles((float)pos[t], inv_freq, rope_dim / 2, mul, c, s);
        for (int h = 0; h < n_heads; h++)
            s_rope_vec(q + ((size_t)t * n_heads + h) * head_stride + rope_off, rope_dim, interleave, c, s,
                       out + ((size_t)t * n_heads + h) * rope_dim);
    }
}

void cpu_mla_kv_store(backend_t *be, const bk_kv_t *kv, int layer, const float *ckv, const float *norm_w, float eps,
                      int kv_lora, int rope_dim, const float *inv_freq, float mul, int interleave,
                      const bk_attn_meta_t *meta)
{
    const int W = kv_lora + rope_dim;
    assert(W == 2 * kv->head_dim && kv->n_kv_heads == 1);
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (meta->n_tokens > 16)
    for (int t = 0; t < meta->n_tokens; t++) {
        const int seq = meta->tok_seq[t], p = meta->tok_pos[t];
        const int32_t blk = meta->block_table[meta->seq_bt_start[seq] + p / kv->block_size];
        const float *x = ckv + (size_t)t * W;
        float v[2 * BK_MAX_HEAD_DIM], c[BK_MAX_HEAD_DIM / 2], s[BK_MAX_HEAD_DIM / 2];
        /* RMSNorm of the latent: add_rmsnorm's arithmetic (sum of squares in double). */
        cpu_add_rmsnorm(&(backend_t){.ops = be->ops, .n_threads = 1, .impl = be->impl}, (float *)x, NULL, norm_w, 1,
                        kv_lora, eps, v);
        s_angles((float)p, inv_freq, rope_dim / 2, mul, c, s);
        s_rope_vec(x + kv_lora, rope_dim, interleave, c, s, v + kv_lora);
        dtype_from_f32(kv->dtype, v, s_slot(kv, blk, layer, p % kv->block_size), (size_t)W);
    }
}

void cpu_mla_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q_lat, const float *q_pe, int n_heads,
                       int kv_lora, int rope_dim, float scale, const bk_attn_meta_t *meta, float *out)
{
    const int W = kv_lora + rope_dim, bs = kv->block_size;
    const dtype_t dt = kv->dtype;
    const int64_t tasks = (int64_t)meta->n_tokens * n_heads;
    assert(W == 2 * kv->head_dim && bs <= BK_MAX_BLOCK_SIZE);
#pragma omp parallel for schedule(dynamic, 1) num_threads(be->n_threads) if (tasks > 1)
    for (int64_t task = 0; task < tasks; task++) {
        const int t = (int)(task / n_heads), h = (int)(task % n_heads);
        const int seq = meta->tok_seq[t], n_keys = meta->tok_pos[t] + 1;
        const float *ql = q_lat + ((size_t)t * n_heads + h) * kv_lora, *qp = q_pe + ((size_t)t * n_heads + h) * rope_dim;
        float acc[2 * BK_MAX_HEAD_DIM], sc[BK_MAX_BLOCK_SIZE], mx = -INFINITY, l = 0;
        memset(acc, 0, (size_t)kv_lora * sizeof(float));
        for (int b = 0; b * bs < n_keys; b++) {
            const int nk = n_keys - b * bs < bs ? n_keys - b * bs : bs;
            const int32_t blk = meta->block_table[meta->seq_bt_start[seq] + b];
            const uint8_t *base = s_slot(kv, blk, layer, 0);
            const size_t stride = (size_t)W * dtype_size(dt);
            float bmax = -INFINITY;
            for (int j = 0; j < nk; j++) {
                const uint8_t *e = base + (size_t)j * stride;
                float sl = 0, sp = 0;
                for (int d = 0; d < kv_lora; d++)
                    sl += ql[d] * cpu_elem(dt, e, d);
                for (int d = 0; d < rope_dim; d++)
                    sp += qp[d] * cpu_elem(dt, e, kv_lora + d);
                sc[j] = (sl + sp) * scale;
                bmax = sc[j] > bmax ? sc[j] : bmax;
            }
            const float m_new = bmax > mx ? bmax : mx;
            const float corr = mx == -INFINITY ? 0.0f : expf(mx - m_new);
            float bsum = 0;
            for (int j = 0; j < nk; j++) {
                sc[j] = expf(sc[j] - m_new);
                bsum += sc[j];
            }
            l = l * corr + bsum;
            mx = m_new;
            for (int d = 0; d < kv_lora; d++) {
                float a = acc[d] * corr;
                for (int j = 0; j < nk; j++)
                    a += sc[j] * cpu_elem(dt, base + (size_t)j * stride, d);
                acc[d] = a;
            }
        }
        float *o = out + ((size_t)t * n_heads + h) * kv_lora, inv = 1.0f / l;
        for (int d = 0; d < kv_lora; d++)
            o[d] = acc[d] * inv;
    }
}

void cpu_head_matmul(backend_t *be, const float *x, int M, int n_heads, int x_stride, int x_head, const bk_mat_t *w,
                     float *y, int y_stride, int y_head)
{
    const int N = (int)(w->rows / n_heads), K = (int)w->cols;
    const size_t es = dtype_size(w->dtype);
    const int64_t tasks = (int64_t)M * n_heads;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (tasks * N * K > 65536)
    for (int64_t task = 0; task < tasks; task++) {
        const int m = (int)(task / n_heads), h = (int)(task % n_heads);
        const float *xv = x + (size_t)m * x_stride + (size_t)h * x_head;
        float *yv = y + (size_t)m * y_stride + (size_t)h * y_head;
        for (int n = 0; n < N; n++) {
            const uint8_t *row = (const uint8_t *)w->data + ((size_t)h * N + n) * (size_t)K * es;
            float s = 0;
            for (int k = 0; k < K; k++)
                s += xv[k] * cpu_elem(w->dtype, row, k);
            yv[n] = s;
        }
    }
}

void cpu_add(backend_t *be, float *y, const float *x, int n)
{
    (void)be;
    for (int i = 0; i < n; i++)
        y[i] += x[i];
}

void cpu_moe_route_sigmoid(backend_t *be, const float *logits, const float *bias, int M, int E, int k, int n_group,
                           int topk_group, int renorm, float scale, int32_t *ids, float *weights)
{
    (void)be;
    const int per = E / n_group;
    for (int t = 0; t < M; t++) {
        float s[4096], choice[4096], gs[4096];
        int keep[4096];
        assert(E <= 4096);
        for (int e = 0; e < E; e++) {
            const float x = logits[(size_t)t * E + e];
            s[e] = 1.0f / (1.0f + expf(-x));
            choice[e] = s[e] + bias[e];
        }
        for (int g = 0; g < n_group; g++) {      /* the two largest of the group, summed */
            float a = -INFINITY, b = -INFINITY;
            for (int j = 0; j < per; j++) {
                const float v = choice[g * per + j];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            gs[g] = a + b;
            keep[g] = 0;
        }
        for (int j = 0; j < topk_group; j++) {
            int best = -1;
            for (int g = 0; g < n_group; g++)
                if (!keep[g] && (best < 0 || gs[g] > gs[best]))
                    best = g;
            keep[best] = 1;
        }
        for (int e = 0; e < E; e++)
            if (!keep[e / per])
                choice[e] = 0.0f;
        int32_t *id = ids + (size_t)t * k;
        float *w = weights + (size_t)t * k, sum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++)
                    taken |= id[i] == e;
                if (!taken && (best < 0 || choice[e] > choice[best]))
                    best = e;
            }
            id[j] = best;
            w[j] = s[best];
            sum += w[j];
        }
        for (int j = 0; j < k; j++) {
            if (renorm)
                w[j] = w[j] / (sum + 1e-20f);
            w[j] = w[j] * scale;
        }
    }
}

void cpu_mtp_top(backend_t *be, const float *x, int M, int N, int32_t *out, float *prob)
{
    (void)be;
    for (int m = 0; m < M; m++) {
        const float *r = x + (size_t)m * N;
        int best = -1;
        for (int i = 0; i < N; i++)                /* strict >: the lowest index wins a tie */
            if (r[i] == r[i] && (best < 0 || r[i] > r[best]))
                best = i;
        double sum = 0.0;                          /* the reference: f32 terms, summed in double */
        for (int i = 0; best >= 0 && i < N; i++)
            if (r[i] == r[i])
                sum += expf(r[i] - r[best]);
        out[m] = best < 0 ? 0 : best;
        prob[m] = best < 0 ? 0.0f : (float)(1.0 / sum);
    }
}
