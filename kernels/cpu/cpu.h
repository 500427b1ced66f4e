/* kernels/cpu/cpu.h — the CPU backend's ops, shared between its files (internal).
 *
 * Each function implements the backend_ops_t entry of the same name; the semantics are written in
 * kernels/backend.h. They parallelise with OpenMP over be->n_threads threads. */
#ifndef TROUPE_KERNELS_CPU_H
#define TROUPE_KERNELS_CPU_H

#include "kernels/backend.h"

typedef struct cpu_state {
    const void **copies;          /* weights copied by weight_put (misaligned sources), to free */
    int n_copies, cap_copies;
    float *sample_scratch;        /* sample: per thread, work [N] | mass [N] | idx [N] (grown to the largest N x threads) */
    size_t sample_scratch_bytes;
    float *quant_scratch;         /* cpu_qmatmul: x fake-quantized [M][K] | per thread, W unit [16][K] | y unit [M][16] */
    size_t quant_scratch_n;       /* floats (grown to the largest call) */
} cpu_state_t;

void cpu_matmul(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y);
/* cpu_matmul for a quantized w (qfmt != 0): cpu_matmul calls it (kernels/cpu/cpu_quant.c). */
void cpu_qmatmul(backend_t *be, const float *x, int M, const bk_mat_t *w, const float *bias, float *y);

void cpu_embed(backend_t *be, const bk_mat_t *table, const int32_t *ids, int n, float *out);
void cpu_add_rmsnorm(backend_t *be, float *res, const float *x, const float *w, int M, int H, float eps, float *out);
void cpu_head_rmsnorm(backend_t *be, float *x, const float *w, int M, int n_heads, int head_dim, float eps);
void cpu_rope(backend_t *be, float *x, const int32_t *pos, const float *inv_freq, int M, int n_heads, int head_dim);
void cpu_swiglu(backend_t *be, const float *gate, const float *up, int n, float *out);
void cpu_gather_rows(backend_t *be, const float *src, const int32_t *rows, int n, int cols, float *dst);
void cpu_argmax(backend_t *be, const float *x, int M, int N, int32_t *out);
void cpu_sample(backend_t *be, const float *logits, int M, int N, const bk_sample_t *params, int32_t *out);

void cpu_kv_store(backend_t *be, const bk_kv_t *kv, int layer, const float *k, const float *v, const bk_attn_meta_t *meta);
void cpu_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q, int n_heads, float scale,
                   const bk_attn_meta_t *meta, float *out);

void cpu_moe_route(backend_t *be, const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights);
void cpu_moe_ffn(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                 const bk_expert_t *experts, int n_experts, void *scratch, float *out);
void cpu_moe_count(backend_t *be, const int32_t *ids, int n, uint32_t *counts);

/* DeepSeek-V3 (kernels/cpu/cpu_mla.c). */
void cpu_mla_rope_q(backend_t *be, const float *q, int M, int n_heads, int head_stride, int rope_off, int rope_dim,
                    const int32_t *pos, const float *inv_freq, float mul, int interleave, float *out);
void cpu_mla_kv_store(backend_t *be, const bk_kv_t *kv, int layer, const float *ckv, const float *norm_w, float eps,
                      int kv_lora, int rope_dim, const float *inv_freq, float mul, int interleave,
                      const bk_attn_meta_t *meta);
void cpu_mla_attention(backend_t *be, const bk_kv_t *kv, int layer, const float *q_lat, const float *q_pe, int n_heads,
                       int kv_lora, int rope_dim, float scale, const bk_attn_meta_t *meta, float *out);
void cpu_head_matmul(backend_t *be, const float *x, int M, int n_heads, int x_stride, int x_head, const bk_mat_t *w,
                     float *y, int y_stride, int y_head);
void cpu_add(backend_t *be, float *y, const float *x, int n);
void cpu_moe_route_sigmoid(backend_t *be, const float *logits, const float *bias, int M, int E, int k, int n_group,
                           int topk_group, int renorm, float scale, int32_t *ids, float *weights);
void cpu_mtp_top(backend_t *be, const float *x, int M, int N, int32_t *out, float *prob);

#endif
