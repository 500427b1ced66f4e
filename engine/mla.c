/* engine/mla.c — DeepSeek-V3's attention and MoE block, read as the model.
 *
 * Multi-head Latent Attention (transformers' DeepseekV3Attention), for x = the normed input:
 *     q      = q_b(norm_qa(q_a(x)))          or q_proj(x) when q_lora_rank is null; [nH][dn + dr]
 *     ckv    = kv_a_proj_with_mqa(x)         [kvr + dr]: the latent, then one RoPE key for all heads
 *     latent = kv_a_layernorm(ckv[:kvr]);  k_pe = rope(ckv[kvr:]);  q_pe = rope(q[h][dn:])
 *     k[h]   = [W_UK[h] latent, k_pe],  v[h] = W_UV[h] latent      (kv_b_proj = [W_UK; W_UV] per head)
 *     o      = o_proj(concat_h softmax(q[h] . k[h] * scale) v[h])
 * The cache keeps only [latent, k_pe] per token (kvr + dr values, engine/config.h), and every step
 * runs the absorbed form: q[h][:dn] . W_UK[h] latent = (W_UK[h]^T q[h][:dn]) . latent, so the query
 * goes into the latent space once (q_lat, head_matmul through w_uk_t), attention runs over the
 * cached vectors directly (mla_attention: q_lat . latent + q_pe . k_pe), and its latent output goes
 * through W_UV[h] (head_matmul through w_uv) before o_proj. Nothing per head is ever cached.
 * scale = qk_head_dim^-0.5 (times mscale^2 under YaRN, engine/config.c).
 * A prompt chunk (a sequence with more rows than any graph-replayed step has, MODEL_GRAPH_MAX_N)
 * is offered to the backend's mla_prefill, the decompressed form (K and V per head from the
 * cached latents, ordinary attention: kernels/backend.h); the rows it declines, and every other
 * row, run the absorbed form, sequence runs of them in one call.
 *
 * DeepSeekMoE (DeepseekV3MoE): the router's sigmoid scores plus e_score_correction_bias choose the
 * experts (group-limited: kernels/backend.h, moe_route_sigmoid), the unbiased scores weight them
 * (normalised when norm_topk_prob, times routed_scaling_factor), and the shared experts' MLP is
 * added to the routed sum. In an expert-parallel group the routed sum comes from the group
 * (ep_moe_layer, the same per-expert moe_ffn results added in the same order), the router and the
 * shared experts run on each rank for its own rows; the MTP layer's MoE never goes through the
 * group (only a drafting rank runs it), so each rank loads all of its experts (mla_load.c). */
#include "engine/model_internal.h"

#include "common/util.h"
#include "engine/ep.h"

/* The step's MLA activations, carved from mla_buf for T rows (mla_buf_floats' order). */
typedef struct {
    float *qa, *qan, *q, *ckv, *q_lat, *q_pe, *o_lat, *att, *routed, *cat;
} s_bufs_t;

static s_bufs_t s_bufs(const model_t *m, int T)
{
    const model_config_t *c = &m->cfg;
    const size_t t = (size_t)T, nH = (size_t)c->num_heads, qr = (size_t)c->mla.q_lora_rank,
                 r = (size_t)c->mla.kv_lora_rank, dr = (size_t)c->mla.qk_rope_head_dim,
                 qk = (size_t)c->mla.qk_nope_head_dim + dr, dv = (size_t)c->mla.v_head_dim;
    s_bufs_t b;
    b.qa = m->mla_buf;
    b.qan = b.qa + t * qr;
    b.q = b.qan + t * qr;
    b.ckv = b.q + t * nH * qk;
    b.q_lat = b.ckv + t * (r + dr);
    b.q_pe = b.q_lat + t * nH * r;
    b.o_lat = b.q_pe + t * nH * dr;
    b.att = b.o_lat + t * nH * r;
    b.routed = b.att + t * nH * dv;
    b.cat = b.routed + t * (size_t)c->hidden_size;
    return b;
}

/* The step's host copy of one of meta's device sections: forward.c's s_layout uploads m->h_meta
 * to m->d_meta in one piece, so a section sits at the same offset in both. */
static const int32_t *s_host(const model_t *m, const int32_t *dev)
{
    return m->h_meta + (dev - m->d_meta);
}

/* meta restricted to rows r0 .. r0 + n - 1 (their sequences' block tables unchanged). */
static bk_attn_meta_t s_rows(const bk_attn_meta_t *meta, int r0, int n)
{
    bk_attn_meta_t s = *meta;
    s.n_tokens = n;
    s.tok_seq += r0;
    s.tok_pos += r0;
    s.n_single = r0 < meta->n_single ? (meta->n_single - r0 < n ? meta->n_single - r0 : n) : 0;
    s.seq_row0 = NULL;   /* indexed by sequence from row 0: meaningless for a part */
    s.max_rows = 0;
    return s;
}

/* The absorbed form for rows r0 .. r0 + n - 1: q into the latent space, attention over the
 * compressed cache, the latent output through W_UV into att. */
static void s_absorbed(model_t *m, const model_layer_t *L, int kv_layer, const s_bufs_t *b, int r0, int n,
                       const bk_kv_t *kv, const bk_attn_meta_t *meta)
{
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const struct config_mla *a = &m->cfg.mla;
    const int nH = m->cfg.num_heads, r = a->kv_lora_rank, dr = a->qk_rope_head_dim, qk = a->qk_nope_head_dim + dr,
              dv = a->v_head_dim;
    const size_t o = (size_t)r0 * nH;
    const bk_attn_meta_t part = r0 == 0 && n == meta->n_tokens ? *meta : s_rows(meta, r0, n);
    PROF(m, P_QKV, op->head_matmul(be, b->q + o * qk, n, nH, nH * qk, qk, &L->w_uk_t, b->q_lat + o * r, nH * r, r));
    PROF(m, P_ATTENTION, op->mla_attention(be, kv, kv_layer, b->q_lat + o * r, b->q_pe + o * dr, nH, r, dr, m->scale,
                                           &part, b->o_lat + o * r));
    PROF(m, P_O, op->head_matmul(be, b->o_lat + o * r, n, nH, nH * r, r, &L->w_uv, b->att + o * dv, nH * dv, dv));
}

void mla_attention(model_t *m, const model_layer_t *L, int kv_layer, int T, const bk_kv_t *kv,
                   const bk_attn_meta_t *meta)
{
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const struct config_mla *a = &m->cfg.mla;
    const int nH = m->cfg.num_heads, r = a->kv_lora_rank, dr = a->qk_rope_head_dim, dn = a->qk_nope_head_dim,
              qk = dn + dr, dv = a->v_head_dim;
    const float eps = (float)m->cfg.rms_norm_eps;
    s_bufs_t b = s_bufs(m, T);
    if (a->q_lora_rank > 0) {
        PROF(m, P_QKV, op->matmul(be, m->xn, T, &L->q_a, NULL, b.qa));
        PROF(m, P_QK_NORM, op->add_rmsnorm(be, b.qa, NULL, L->q_a_norm, T, a->q_lora_rank, eps, b.qan));
        PROF(m, P_QKV, op->matmul(be, b.qan, T, &L->q_b, NULL, b.q));
    } else {
        PROF(m, P_QKV, op->matmul(be, m->xn, T, &L->q, NULL, b.q));
    }
    PROF(m, P_QKV, op->matmul(be, m->xn, T, &L->kv_a, NULL, b.ckv));
    PROF(m, P_KV_STORE, op->mla_kv_store(be, kv, kv_layer, b.ckv, L->kv_a_norm, eps, r, dr, m->inv_freq, m->rope_mul,
                                         a->rope_interleave, meta));
    PROF(m, P_ROPE, op->mla_rope_q(be, b.q, T, nH, qk, dn, dr, meta->tok_pos, m->inv_freq, m->rope_mul,
                                   a->rope_interleave, b.q_pe));
    int from = 0;   /* the first row not computed yet: rows from..a0-1 go absorbed together */
    if (op->mla_prefill && meta->seq_row0 && meta->max_rows > MODEL_GRAPH_MAX_N) {
        const int32_t *row0 = s_host(m, meta->seq_row0), *pos = s_host(m, meta->tok_pos);
        for (int s = 0; s < meta->n_seqs; s++) {
            const int a0 = row0[s], n = row0[s + 1] - a0;
            if (n <= MODEL_GRAPH_MAX_N)
                continue;
            /* s_layout's rows of a sequence are its last n positions in order: the last one's
             * position + 1 is the context's length. */
            const bk_attn_meta_t part = s_rows(meta, a0, n);
            const size_t o = (size_t)a0 * nH;
            int rc;
            PROF(m, P_ATTENTION, rc = op->mla_prefill(be, kv, kv_layer, b.q + o * qk, b.q_pe + o * dr, nH, r, dn, dr, dv,
                                                      &L->w_uk_t, &L->w_uv, m->scale, &part, pos[a0 + n - 1] + 1,
                                                      b.att + o * dv));
            if (rc != 0)
                continue;
            if (a0 > from)
                s_absorbed(m, L, kv_layer, &b, from, a0 - from, kv, meta);
            from = a0 + n;
        }
    }
    if (from < T)
        s_absorbed(m, L, kv_layer, &b, from, T - from, kv, meta);
    PROF(m, P_O, op->matmul(be, b.att, T, &L->o, NULL, m->delta));
}

void mla_moe(model_t *m, const model_layer_t *L, int l, int T)
{
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const model_config_t *c = &m->cfg;
    const int E = c->num_experts, k = c->num_experts_per_tok, H = c->hidden_size;
    float *routed = L->has_shared ? s_bufs(m, T).routed : m->delta;
    PROF(m, P_MOE_ROUTE, op->matmul(be, m->xn, T, &L->router, NULL, m->rlogits));
    PROF(m, P_MOE_ROUTE, op->moe_route_sigmoid(be, m->rlogits, L->e_bias, T, E, k, c->mla.n_group, c->mla.topk_group,
                                               c->norm_topk_prob, (float)c->mla.routed_scaling_factor, m->moe_ids,
                                               m->moe_w));
    if (m->ep && l >= 0)   /* through the group (engine/ep.h); the MTP layer (l < 0) holds all its experts */
        PROF(m, P_MOE_FFN, ep_moe_layer(m->ep, l, T, m->xn, m->moe_ids, m->moe_w, routed));
    else
        PROF(m, P_MOE_FFN, op->moe_ffn(be, m->xn, T, H, m->moe_ids, m->moe_w, k, L->experts, E, m->moe_scratch, routed));
    if (op->moe_count && l >= 0 && model_moe_count_on())
        op->moe_count(be, m->moe_ids, T * k, m->moe_counts + (size_t)l * E);
    if (!L->has_shared)
        return;
    model_mlp_dense(m, L, T);     /* the shared experts, into delta */
    PROF(m, P_MOE_FFN, op->add(be, m->delta, routed, T * H));
}
