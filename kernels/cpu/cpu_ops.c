/* kernels/cpu/cpu_ops.c — the elementwise and per-row ops: embedding, RMSNorm (+ residual),
 * per-head RMSNorm, RoPE, SwiGLU, row gather, argmax (sampling: cpu_sample.c). Semantics:
 * kernels/backend.h. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_simd.h"

void cpu_embed(backend_t *be, const bk_mat_t *table, const int32_t *ids, int n, float *out)
{
    const int64_t H = table->cols;
    const size_t row_bytes = (size_t)H * dtype_size(table->dtype);
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (n > 8)
    for (int t = 0; t < n; t++) {
        const uint8_t *src = (const uint8_t *)table->data + (size_t)ids[t] * row_bytes;
        dtype_to_f32(table->dtype, src, out + (size_t)t * H, (size_t)H);
    }
}

/* One row of RMSNorm: out = w * (r * 1/sqrt(mean(r^2) + eps)); the sum of squares in double. */
static void s_rmsnorm_row(const float *r, const float *w, int H, float eps, float *out)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= H; i += 4) {
        s0 += (double)r[i] * r[i];
        s1 += (double)r[i + 1] * r[i + 1];
        s2 += (double)r[i + 2] * r[i + 2];
        s3 += (double)r[i + 3] * r[i + 3];
    }
    for (; i < H; i++)
        s0 += (double)r[i] * r[i];
    float var = (float)((s0 + s1 + s2 + s3) / H);
    float scale = 1.0f / sqrtf(var + eps);
    for (i = 0; i < H; i++) {
        float n = r[i] * scale;
        out[i] = w[i] * n;
    }
}

void cpu_add_rmsnorm(backend_t *be, float *res, const float *x, const float *w, int M, int H, float eps, float *out)
{
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (M > 4)
    for (int m = 0; m < M; m++) {
        float *r = res + (size_t)m * H;
        if (x) {
            const float *xr = x + (size_t)m * H;
            for (int i = 0; i < H; i++)
                r[i] += xr[i];
        }
        s_rmsnorm_row(r, w, H, eps, out + (size_t)m * H);
    }
}

void cpu_head_rmsnorm(backend_t *be, float *x, const float *w, int M, int n_heads, int head_dim, float eps)
{
    const int64_t rows = (int64_t)M * n_heads;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (rows > 64)
    for (int64_t r = 0; r < rows; r++) {
        float *v = x + r * head_dim;
        s_rmsnorm_row(v, w, head_dim, eps, v);     /* in place is safe: each element read before written */
    }
}

void cpu_rope(backend_t *be, float *x, const int32_t *pos, const float *inv_freq, int M, int n_heads, int head_dim)
{
    const int half = head_dim / 2;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (M > 4)
    for (int t = 0; t < M; t++) {
        float c[BK_MAX_HEAD_DIM / 2], s[BK_MAX_HEAD_DIM / 2];
        float p = (float)pos[t];
        for (int i = 0; i < half; i++) {
            float a = p * inv_freq[i];             /* f32 product, as HF's inv_freq @ position_ids */
            c[i] = cosf(a);
            s[i] = sinf(a);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float lo = v[i], hi = v[i + half];
                /* Two rounded products and a rounded sum, like q*cos + rotate_half(q)*sin in torch
                 * (ISO C mode keeps the compiler from fusing them into an FMA). */
                float plo = lo * c[i], phi = hi * s[i], qlo = hi * c[i], qhi = lo * s[i];
                v[i] = plo - phi;
                v[i + half] = qlo + qhi;
            }
        }
    }
}

void cpu_swiglu(backend_t *be, const float *gate, const float *up, int n, float *out)
{
#if CPU_AVX512
    const int64_t chunks = ((int64_t)n + 15) / 16;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (n > 16384)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i = c * 16;
        __mmask16 m = cpu_mask(n - i);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        __m512 e = cpu_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, u));
    }
#else
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (n > 16384)
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
#endif
}

void cpu_gather_rows(backend_t *be, const float *src, const int32_t *rows, int n, int cols, float *dst)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * cols, src + (size_t)rows[i] * cols, (size_t)cols * sizeof(float));
}

void cpu_argmax(backend_t *be, const float *x, int M, int N, int32_t *out)
{
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (M > 1)
    for (int m = 0; m < M; m++) {
        const float *r = x + (size_t)m * N;
        int best = 0;
        float bv = -INFINITY;
        int found = 0;
        for (int i = 0; i < N; i++) {
            float v = r[i];
            if (v != v)
                continue;                          /* NaN is never the largest */
            if (!found || v > bv) {                /* strict: the lowest index wins a tie */
                bv = v;
                best = i;
                found = 1;
            }
        }
        out[m] = best;
    }
}
