/* kernels/cpu/cpu_attention.c — storing K/V into the paged cache and causal GQA attention over it.
 *
 * Attention runs one task per (row, kv head): the task walks the row's sequence block by block,
 * scores up to one block of keys for every query head that shares the kv head (so each K and V
 * row is read once per group, not once per query head), and keeps an online softmax per head:
 * running max m, running sum l, unnormalised accumulator acc, rescaled by exp(m_old - m_new) when
 * the max grows. Everything lives on the stack: no scratch, no allocation, any context length.
 *
 * The cache holds f32, bf16, f16 or fp8 (E4M3): K and V are rounded to it on store as
 * dtype_from_f32 does (nearest even; fp8 clamps to +-448 as CUDA's satfinite conversion does) and
 * read back exactly (cpu_load16 / cpu_elem), the products accumulated in f32 whatever the dtype.
 * An fp8 cache with scales (bk_kv_t.scale) stores f32(x / s) per layer, K or V, and kv head, and
 * the scales are folded in where CUDA folds them: K's into the score scale (scale * s_k), V's into
 * the output (out * s_v).
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_simd.h"

#define MAX_GROUP BK_MAX_GQA_GROUP
#define MAX_BLOCK BK_MAX_BLOCK_SIZE

/* Element offset of (block, layer, k-or-v, slot, head 0) in the pool. */
static inline uint8_t *s_row(const bk_kv_t *kv, int32_t block, int layer, int which, int slot)
{
    size_t es = dtype_size(kv->dtype);
    size_t elems = (((size_t)layer * 2 + (size_t)which) * (size_t)kv->block_size + (size_t)slot) *
                   (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
    return (uint8_t *)kv->base + (size_t)block * kv->block_bytes + elems * es;
}

static inline int32_t s_block_of(const bk_attn_meta_t *meta, int seq, int pos, int block_size)
{
    return meta->block_table[meta->seq_bt_start[seq] + pos / block_size];
}

/* K (which 0) or V (1) scale of layer, kv head h: 1 unless an fp8 cache has scales. */
static inline float s_scale(const bk_kv_t *kv, int layer, int which, int h)
{
    return kv->dtype == DT_F8E4M3 && kv->scale ? kv->scale[((size_t)layer * 2 + (size_t)which) * (size_t)kv->n_kv_heads + (size_t)h]
                                               : 1.0f;
}

/* n = n_kv_heads * head_dim values of one row into fp8 codes, each head divided by its scale. */
static void s_store_f8_scaled(const bk_kv_t *kv, int layer, int which, const float *x, uint8_t *dst)
{
    const int D = kv->head_dim;
    for (int h = 0; h < kv->n_kv_heads; h++) {
        const float s = s_scale(kv, layer, which, h);
        for (int d = 0; d < D; d++)
            dst[h * D + d] = f32_to_f8e4m3(x[h * D + d] / s);
    }
}

void cpu_kv_store(backend_t *be, const bk_kv_t *kv, int layer, const float *k, const float *v, const bk_attn_meta_t *meta)
{
    const int n = kv->n_kv_heads * kv->head_dim;
    const int scaled = kv->dtype == DT_F8E4M3 && kv->scale;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (meta->n_tokens > 16)
    for (int t = 0; t < meta->n_tokens; t++) {
        int seq = meta->tok_seq[t], pos = meta->tok_pos[t];
        int32_t blk = s_block_of(meta, seq, pos, kv->block_size);
        int slot = pos % kv->block_size;
        uint8_t *kd = s_row(kv, blk, layer, 0, slot), *vd = s_row(kv, blk, layer, 1, slot);
        if (kv->dtype == DT_F32) {
            memcpy(kd, k + (size_t)t * n, (size_t)n * 4);
            memcpy(vd, v + (size_t)t * n, (size_t)n * 4);
        } else if (scaled) {
            s_store_f8_scaled(kv, layer, 0, k + (size_t)t * n, kd);
            s_store_f8_scaled(kv, layer, 1, v + (size_t)t * n, vd);
        } else {
            dtype_from_f32(kv->dtype, k + (size_t)t * n, kd, (size_t)n);
            dtype_from_f32(kv->dtype, v + (size_t)t * n, vd, (size_t)n);
        }
    }
}

/* q . k over D elements, k in the cache's dtype. */
static inline float s_dot(const float *q, dtype_t dt, const void *k, int D)
{
#if CPU_AVX512
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        __mmask16 m = cpu_mask(D - d);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), cpu_load16(dt, k, d, m), acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0;
    for (int d = 0; d < D; d++)
        s += q[d] * cpu_elem(dt, k, d);
    return s;
#endif
}

#if CPU_AVX512
/* q . k_j for four keys at once, k_j = k + j*stride bytes; one combined horizontal reduction
 * (the single-key reduction costs as much as the dot product itself at head_dim 128). */
static inline void s_dot4(const float *q, dtype_t dt, const uint8_t *k, size_t stride, int D, float *out)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < D; d += 16) {
        __mmask16 m = cpu_mask(D - d);
        __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
        a0 = _mm512_fmadd_ps(qv, cpu_load16(dt, k, d, m), a0);
        a1 = _mm512_fmadd_ps(qv, cpu_load16(dt, k + stride, d, m), a1);
        a2 = _mm512_fmadd_ps(qv, cpu_load16(dt, k + 2 * stride, d, m), a2);
        a3 = _mm512_fmadd_ps(qv, cpu_load16(dt, k + 3 * stride, d, m), a3);
    }
    __m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm512_extractf32x8_ps(a0, 1));
    __m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm512_extractf32x8_ps(a1, 1));
    __m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
    __m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm512_extractf32x8_ps(a3, 1));
    __m256 c = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1)));
}
#endif

/* acc[0..D) = acc * corr + sum_j p[j] * v_j, v_j = vbase + j*stride elements. */
static inline void s_accumulate(float *acc, float corr, const float *p, int nk, dtype_t dt, const uint8_t *vbase,
                                size_t stride_bytes, int D)
{
#if CPU_AVX512
    for (int d = 0; d < D; d += 16) {
        __mmask16 m = cpu_mask(D - d);
        __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc + d), _mm512_set1_ps(corr));
        for (int j = 0; j < nk; j++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), cpu_load16(dt, vbase + (size_t)j * stride_bytes, d, m), a);
        _mm512_mask_storeu_ps(acc + d, m, a);
    }
#else
    for (int d = 0; d < D; d++) {
        float a = acc[d] * corr;
        for (int j = 0; j < nk; j++)
            a += p[j] * cpu_elem(dt, vbase + (size_t)j * stride_bytes, d);
        acc[d] = a;
    }
#endif
}

/* p[j] = exp(s[j] - mx) for j < n; returns their sum. */
static inline float s_exp_sum(float *s, int n, float mx)
{
#if CPU_AVX512
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = cpu_mask(n - j);
        __m512 e = cpu_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), _mm512_set1_ps(mx)));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(s + j, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
#else
    float sum = 0;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    return sum;
#endif
}

void cpu_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q, int n_heads, float scale,
                   const bk_attn_meta_t *meta, float *out)
{
    const int D = kv->head_dim, n_kv = kv->n_kv_heads, G = n_heads / n_kv, bs = kv->block_size;
    const dtype_t dt = kv->dtype;
    const size_t es = dtype_size(dt), key_stride = (size_t)n_kv * D * es;
    const int64_t tasks = (int64_t)meta->n_tokens * n_kv;
    assert(G >= 1 && G <= MAX_GROUP && D <= BK_MAX_HEAD_DIM && bs <= MAX_BLOCK);   /* the engine checks these at load */
#pragma omp parallel for schedule(dynamic, 1) num_threads(be->n_threads) if (tasks > 1)
    for (int64_t task = 0; task < tasks; task++) {
        const int t = (int)(task / n_kv), g = (int)(task % n_kv);
        const int seq = meta->tok_seq[t], n_keys = meta->tok_pos[t] + 1;
        const float kscale = scale * s_scale(kv, layer, 0, g), vscale = s_scale(kv, layer, 1, g);
        float acc[MAX_GROUP][BK_MAX_HEAD_DIM], mx[MAX_GROUP], l[MAX_GROUP], sc[MAX_GROUP][MAX_BLOCK];
        const float *qh[MAX_GROUP];
        for (int i = 0; i < G; i++) {
            qh[i] = q + ((size_t)t * n_heads + (size_t)g * G + i) * D;
            memset(acc[i], 0, (size_t)D * sizeof(float));
            mx[i] = -INFINITY;
            l[i] = 0;
        }
        for (int b = 0; b * bs < n_keys; b++) {
            const int nk = n_keys - b * bs < bs ? n_keys - b * bs : bs;
            const int32_t blk = meta->block_table[meta->seq_bt_start[seq] + b];
            const uint8_t *kb = s_row(kv, blk, layer, 0, 0) + (size_t)g * D * es;
            const uint8_t *vb = s_row(kv, blk, layer, 1, 0) + (size_t)g * D * es;
            int key = 0;
#if CPU_AVX512
            for (; key + 4 <= nk; key += 4)
                for (int i = 0; i < G; i++) {
                    s_dot4(qh[i], dt, kb + (size_t)key * key_stride, key_stride, D, &sc[i][key]);
                    for (int e = 0; e < 4; e++)
                        sc[i][key + e] *= kscale;
                }
#endif
            for (; key < nk; key++)
                for (int i = 0; i < G; i++)
                    sc[i][key] = s_dot(qh[i], dt, kb + (size_t)key * key_stride, D) * kscale;
            for (int i = 0; i < G; i++) {
                float bmax = sc[i][0];
                for (int j = 1; j < nk; j++)
                    bmax = sc[i][j] > bmax ? sc[i][j] : bmax;
                float m_new = bmax > mx[i] ? bmax : mx[i];
                float corr = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - m_new);
                float bsum = s_exp_sum(sc[i], nk, m_new);
                l[i] = l[i] * corr + bsum;
                mx[i] = m_new;
                s_accumulate(acc[i], corr, sc[i], nk, dt, vb, key_stride, D);
            }
        }
        for (int i = 0; i < G; i++) {
            float *o = out + ((size_t)t * n_heads + (size_t)g * G + i) * D, inv = vscale / l[i];
            for (int d = 0; d < D; d++)
                o[d] = acc[i][d] * inv;
        }
    }
}
