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
    PROF(m, P_QKV, op->head_matmul(be, b.q, T, nH, nH * qk, qk, &L->w_uk_t, b.q_lat, nH * r, r));
    PROF(m, P_ATTENTION, op->mla_attention(be, kv, kv_layer, b.q_lat, b.q_pe, nH, r, dr, m->scale, meta, b.o_lat));
    PROF(m, P_O, op->head_matmul(be, b.o_lat, T, nH, nH * r, r, &L->w_uv, b.att, nH * dv, dv));
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
    if (op->moe_count && l >= 0)
        op->moe_count(be, m->moe_ids, T * k, m->moe_counts + (size_t)l * E);
    if (!L->has_shared)
        return;
    model_mlp_dense(m, L, T);     /* the shared experts, into delta */
    PROF(m, P_MOE_FFN, op->add(be, m->delta, routed, T * H));
}
