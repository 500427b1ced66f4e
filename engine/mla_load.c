/* engine/mla_load.c — DeepSeek-V3's weights: Multi-head Latent Attention, the MoE extras
 * (e_score_correction_bias, shared experts), the RoPE part's frequencies (YaRN), the activation
 * buffers and the multi-token-prediction layer.
 *
 * Tensor names are transformers' (DeepseekV3ForCausalLM), which are DeepSeek's own:
 *   self_attn.q_a_proj [qr][H], q_a_layernorm [qr], q_b_proj [nH*qk][qr]   (q_lora_rank set)
 *   self_attn.q_proj [nH*qk][H]                                            (q_lora_rank null)
 *   self_attn.kv_a_proj_with_mqa [kvr+dr][H], kv_a_layernorm [kvr], kv_b_proj [nH*(dn+dv)][kvr]
 *   self_attn.o_proj [H][nH*dv]
 *   mlp.gate.weight [E][H], mlp.gate.e_score_correction_bias [E], mlp.experts.<e>.*, mlp.shared_experts.*
 * with qk = dn + dr. kv_b_proj is only used re-laid for the absorbed form (engine/mla.c): per head
 * h its K rows [dn][kvr] transposed to [kvr][dn] (w_uk_t) and its V rows [dv][kvr] (w_uv), each head
 * after the other, in the checkpoint's dtype (a transpose is exact). A quantized kv_b_proj (DeepSeek-V3's
 * fp8 checkpoints store it so, with 128 x 128 weight_scale_inv blocks) is decoded at load to bf16
 * (code times its f32 block scale, rounded to nearest even), as vLLM's absorbed MLA does too.
 *
 * The MTP layer (num_nextn_predict_layers > 0) is model.layers.<num_layers>.*: enorm, hnorm,
 * eh_proj [H][2H], embed_tokens, shared_head.norm, shared_head.head, and a decoder block (always
 * MoE: its index is >= first_k_dense_replace). Only the first MTP layer is loaded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/model_internal.h"
#include "engine/quant.h"

/* A quantized kv_b_proj [rows][cols] (fp8 or int8 codes, the config's scale blocks) decoded to bf16
 * host bytes (caller frees); NULL with why. */
static uint16_t *s_kvb_decode(model_t *m, ckpt_t *ck, const char *name, int64_t rows, int64_t cols, char *err,
                              size_t errlen)
{
    const quant_config_t *qc = &m->cfg.quant;
    if (qc->fmt != BK_Q_FP8 && qc->fmt != BK_Q_I8)
        return errf(err, errlen, "%s: %s: a %s kv_b_proj is not supported (fp8 and int8 are decoded for MLA's "
                    "absorbed form)", m->where, name, quant_format_name(qc->fmt)), NULL;
    const int64_t shape[2] = {rows, cols};
    const tensor_view_t *t = ckpt_expect(ck, name, 2, shape, err, errlen);
    if (!t)
        return NULL;
    const dtype_t want = qc->fmt == BK_Q_FP8 ? DT_F8E4M3 : DT_I8;
    if (t->dtype != want)
        return errf(err, errlen, "%s: tensor %s has dtype %s (expected %s)", m->where, name, dtype_name(t->dtype),
                    dtype_name(want)), NULL;
    char sn[200];
    snprintf(sn, sizeof sn, "%.*s.%s", (int)strlen(name) - 7, name,
             qc->method == QUANT_DEEPSEEK_FP8 ? "weight_scale_inv" : "weight_scale");
    int gr, gc;
    const size_t ns = quant_grid(rows, cols, qc->gr, qc->gc, &gr, &gc), n = (size_t)rows * (size_t)cols;
    const tensor_view_t *st = ckpt_get(ck, sn);
    size_t numel = 1;
    for (int i = 0; st && i < st->ndim; i++)
        numel *= (size_t)st->shape[i];
    if (!st || numel != ns || (st->dtype != DT_F32 && st->dtype != DT_BF16 && st->dtype != DT_F16))
        return errf(err, errlen, "%s: tensor %s missing, or not %zu f32/bf16/f16 scales", m->where, sn, ns), NULL;
    float *sc = malloc(ns * sizeof(float)), *w = malloc(n * sizeof(float));
    uint16_t *out = malloc(n * sizeof(uint16_t));
    if (!sc || !w || !out) {
        free(sc), free(w), free(out);
        return errf(err, errlen, "%s: out of memory", m->where), NULL;
    }
    dtype_to_f32(st->dtype, st->data, sc, ns);
    for (size_t i = 0; i < ns; i++)
        if (!isfinite(sc[i]) || sc[i] < 0.0f) {
            errf(err, errlen, "%s: tensor %s has a scale %g at %zu (scales are finite and >= 0)", m->where, sn,
                 (double)sc[i], i);
            free(sc), free(w), free(out);
            return NULL;
        }
    quant_decode(qc->fmt, t->data, sc, rows, cols, gr, gc, w);
    dtype_from_f32(DT_BF16, w, out, n);
    free(sc);
    free(w);
    if (m->be->ops->weights_copied)
        ckpt_drop(ck, t);
    return out;
}

/* kv_b_proj [nH*(dn+dv)][kvr] -> w_uk_t [nH*kvr][dn] and w_uv [nH*dv][kvr], on the device. */
static int s_absorb(model_t *m, ckpt_t *ck, const char *prefix, model_layer_t *L, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int nH = c->num_heads, dn = c->mla.qk_nope_head_dim, dv = c->mla.v_head_dim, r = c->mla.kv_lora_rank;
    char name[160];
    snprintf(name, sizeof name, "%s.self_attn.kv_b_proj.weight", prefix);
    const int64_t shape[2] = {(int64_t)nH * (dn + dv), r};
    uint16_t *decoded = NULL;                      /* a quantized kv_b_proj, decoded to bf16 */
    const tensor_view_t *t = NULL;
    dtype_t dt;
    if (model_quant_of(m, ck, name) && c->quant.present) {
        if (!(decoded = s_kvb_decode(m, ck, name, shape[0], shape[1], err, errlen)))
            return -1;
        dt = DT_BF16;
    } else {
        if (!(t = ckpt_expect(ck, name, 2, shape, err, errlen)))
            return -1;
        if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
            return errf(err, errlen, "%s: tensor %s has dtype %d (expected f32, bf16 or f16)", m->where, name,
                        (int)t->dtype);
        dt = t->dtype;
    }
    const size_t es = dtype_size(dt);
    const size_t uk_bytes = (size_t)nH * r * dn * es, uv_bytes = (size_t)nH * dv * r * es;
    uint8_t *host = malloc(uk_bytes + uv_bytes);
    if (!host) {
        free(decoded);
        return errf(err, errlen, "%s: out of memory", m->where);
    }
    const uint8_t *src = decoded ? (const uint8_t *)decoded : (const uint8_t *)t->data;
    for (int h = 0; h < nH; h++) {
        const uint8_t *kh = src + (size_t)h * (dn + dv) * r * es;          /* [dn][r] */
        for (int i = 0; i < dn; i++)
            for (int j = 0; j < r; j++)
                memcpy(host + (((size_t)h * r + j) * dn + i) * es, kh + ((size_t)i * r + j) * es, es);
        memcpy(host + uk_bytes + (size_t)h * dv * r * es, kh + (size_t)dn * r * es, (size_t)dv * r * es);
    }
    uint8_t *dev = model_alloc(m, uk_bytes + uv_bytes, name, err, errlen);
    int rc = dev && m->be->ops->upload(m->be, dev, host, uk_bytes + uv_bytes) == 0 ? 0 : -1;
    free(host);
    free(decoded);
    if (t && m->be->ops->weights_copied)
        ckpt_drop(ck, t);
    if (rc < 0)
        return dev ? errf(err, errlen, "%s: cannot upload %s", m->where, name) : -1;
    L->w_uk_t = (bk_mat_t){.data = dev, .dtype = dt, .rows = (int64_t)nH * r, .cols = dn};
    L->w_uv = (bk_mat_t){.data = dev + uk_bytes, .dtype = dt, .rows = (int64_t)nH * dv, .cols = r};
    return 0;
}

int mla_load_attention(model_t *m, ckpt_t *ck, const char *prefix, model_layer_t *L, size_t *bytes, char *err,
                       size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int H = c->hidden_size, nH = c->num_heads, qr = c->mla.q_lora_rank, r = c->mla.kv_lora_rank,
              dr = c->mla.qk_rope_head_dim, qk = c->mla.qk_nope_head_dim + dr, dv = c->mla.v_head_dim;
    char n[160];
#define NAME(suffix) (snprintf(n, sizeof n, "%s.self_attn." suffix, prefix), n)
    if (qr > 0) {
        if (model_mat(m, ck, &L->q_a, qr, H, NAME("q_a_proj.weight"), err, errlen) < 0 ||
            !(L->q_a_norm = model_vec(m, ck, qr, NAME("q_a_layernorm.weight"), err, errlen)) ||
            model_mat(m, ck, &L->q_b, (int64_t)nH * qk, qr, NAME("q_b_proj.weight"), err, errlen) < 0)
            return -1;
        *bytes += bk_mat_bytes(&L->q_a) + bk_mat_bytes(&L->q_b);
    } else {
        if (model_mat(m, ck, &L->q, (int64_t)nH * qk, H, NAME("q_proj.weight"), err, errlen) < 0)
            return -1;
        *bytes += bk_mat_bytes(&L->q);
    }
    if (model_mat(m, ck, &L->kv_a, r + dr, H, NAME("kv_a_proj_with_mqa.weight"), err, errlen) < 0 ||
        !(L->kv_a_norm = model_vec(m, ck, r, NAME("kv_a_layernorm.weight"), err, errlen)) ||
        s_absorb(m, ck, prefix, L, err, errlen) < 0 ||
        model_mat(m, ck, &L->o, H, (int64_t)nH * dv, NAME("o_proj.weight"), err, errlen) < 0)
        return -1;
#undef NAME
    *bytes += bk_mat_bytes(&L->kv_a) + bk_mat_bytes(&L->w_uk_t) + bk_mat_bytes(&L->w_uv) + bk_mat_bytes(&L->o);
    return 0;
}

int mla_load_moe_extra(model_t *m, ckpt_t *ck, const char *prefix, model_layer_t *L, size_t *bytes, char *err,
                       size_t errlen)
{
    const model_config_t *c = &m->cfg;
    char n[160];
    snprintf(n, sizeof n, "%s.mlp.gate.e_score_correction_bias", prefix);
    if (!(L->e_bias = model_vec(m, ck, c->num_experts, n, err, errlen)))
        return -1;
    if (c->mla.n_shared_experts == 0)
        return 0;
    snprintf(n, sizeof n, "%s.mlp.shared_experts", prefix);
    if (model_load_dense_mlp(m, ck, n, c->moe_intermediate_size * c->mla.n_shared_experts, L, err, errlen) < 0)
        return -1;
    L->has_shared = 1;
    *bytes += bk_mat_bytes(&L->gate) + bk_mat_bytes(&L->up) + bk_mat_bytes(&L->down);
    return 0;
}

/* transformers' yarn_get_mscale. */
static double s_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

int mla_inv_freq(const model_config_t *cfg, float *inv_freq, float *mul, char *err, size_t errlen)
{
    const int dim = cfg->mla.qk_rope_head_dim, half = dim / 2;
    model_config_t rc = *cfg;
    rc.head_dim = dim;
    *mul = 1.0f;
    if (cfg->rope_kind != ROPE_YARN)
        return rope_inv_freq(&rc, inv_freq, err, errlen);
    /* transformers 5.17's _compute_yarn_parameters: "factor" as given (the deepseek-v3-f32 fixture,
     * whose max_position_embeddings / original_max_position_embeddings is 8 with factor 4, pins
     * it); the correction range over original_max_position_embeddings, else max_position_embeddings. */
    const double base = cfg->rope_theta, factor = cfg->rope_factor;
    const double orig = cfg->rope_original_max_pos > 0 ? cfg->rope_original_max_pos : cfg->max_position_embeddings;
    double af = cfg->yarn_attention_factor;
    if (!(af > 0))
        af = cfg->yarn_mscale != 0 && cfg->yarn_mscale_all_dim != 0
                 ? s_mscale(factor, cfg->yarn_mscale) / s_mscale(factor, cfg->yarn_mscale_all_dim)
                 : s_mscale(factor, 1.0);
    *mul = (float)af;
    const double two_pi = 2 * M_PI;
    double low = (dim * log(orig / (cfg->yarn_beta_fast * two_pi))) / (2 * log(base));
    double high = (dim * log(orig / (cfg->yarn_beta_slow * two_pi))) / (2 * log(base));
    if (cfg->yarn_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high)
        high += 0.001;                        /* transformers: no singularity */
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)dim;
        float pos_freq = (float)pow(base, (double)e);
        float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
        float ramp = ((float)i - (float)low) / ((float)high - (float)low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ext_factor = 1.0f - ramp;
        inv_freq[i] = inter * (1.0f - ext_factor) + extra * ext_factor;
    }
    return 0;
}

int mla_load_rope(model_t *m, char *err, size_t errlen)
{
    const backend_ops_t *op = m->be->ops;
    if (!op->mla_rope_q || !op->mla_kv_store || !op->mla_attention || !op->head_matmul || !op->add ||
        !op->moe_route_sigmoid)
        return errf(err, errlen, "%s: the %s backend has no DeepSeek-V3 ops (MLA, sigmoid routing)", m->where, op->name);
    const int half = m->cfg.mla.qk_rope_head_dim / 2;
    float inv[BK_MAX_HEAD_DIM / 2];
    if (half > BK_MAX_HEAD_DIM / 2)
        return errf(err, errlen, "%s: qk_rope_head_dim %d exceeds %d", m->where, 2 * half, BK_MAX_HEAD_DIM);
    if (mla_inv_freq(&m->cfg, inv, &m->rope_mul, err, errlen) < 0)
        return -1;
    if (!(m->inv_freq = model_alloc(m, (size_t)half * sizeof(float), "rope", err, errlen)) ||
        m->be->ops->upload(m->be, m->inv_freq, inv, (size_t)half * sizeof(float)) < 0)
        return errf(err, errlen, "%s: cannot upload the rope frequencies", m->where);
    m->scale = (float)m->cfg.mla.softmax_scale;
    return 0;
}

/* Floats of mla_buf per row (engine/mla.c carves it in this order). */
size_t mla_buf_floats(const model_config_t *c)
{
    const size_t nH = (size_t)c->num_heads, qr = (size_t)c->mla.q_lora_rank, r = (size_t)c->mla.kv_lora_rank,
                 dr = (size_t)c->mla.qk_rope_head_dim, qk = (size_t)c->mla.qk_nope_head_dim + dr,
                 dv = (size_t)c->mla.v_head_dim, H = (size_t)c->hidden_size;
    /* qa, qa normed | q | ckv | q latent | q rope | out latent | att | routed | MTP concat (2H) */
    return 2 * qr + nH * qk + (r + dr) + nH * r + nH * dr + nH * r + nH * dv + H + 2 * H;
}

/* eh_proj [H][2H] applied to cat(enorm(embed), hnorm(h)) (DeepSeek's order) as two [H][H] halves:
 * y = E enorm(embed) + Hh hnorm(h), so the two normed vectors never need to be concatenated. */
static int s_split_eh(model_t *m, ckpt_t *ck, const char *name, model_mtp_t *t, char *err, size_t errlen)
{
    const int64_t H = m->cfg.hidden_size, shape[2] = {H, 2 * H};
    const tensor_view_t *v = ckpt_expect(ck, name, 2, shape, err, errlen);
    if (!v)
        return -1;
    if (v->dtype != DT_F32 && v->dtype != DT_BF16 && v->dtype != DT_F16)
        return errf(err, errlen, "%s: tensor %s has dtype %d (expected f32, bf16 or f16)", m->where, name, (int)v->dtype);
    const size_t es = dtype_size(v->dtype), half = (size_t)H * H * es;
    uint8_t *host = malloc(2 * half);
    if (!host)
        return errf(err, errlen, "%s: out of memory", m->where);
    for (int64_t r = 0; r < H; r++)
        for (int p = 0; p < 2; p++)
            memcpy(host + (size_t)p * half + (size_t)r * H * es,
                   (const uint8_t *)v->data + ((size_t)r * 2 * H + (size_t)p * H) * es, (size_t)H * es);
    uint8_t *dev = model_alloc(m, 2 * half, name, err, errlen);
    const int rc = dev && m->be->ops->upload(m->be, dev, host, 2 * half) == 0 ? 0 : -1;
    free(host);
    if (rc < 0)
        return dev ? errf(err, errlen, "%s: cannot upload %s", m->where, name) : -1;
    t->eh_e = (bk_mat_t){.data = dev, .dtype = v->dtype, .rows = H, .cols = H};
    t->eh_h = (bk_mat_t){.data = dev + half, .dtype = v->dtype, .rows = H, .cols = H};
    return 0;
}

/* model_mtp_t.top's words: ids and probabilities of max_logit_rows, and MTP_JOIN_ROWS rows of H. */
static size_t s_top_words(const model_t *m)
{
    return 2 * (size_t)m->opts.max_logit_rows + (size_t)MTP_JOIN_ROWS * m->cfg.hidden_size;
}

static int s_load_mtp(model_t *m, ckpt_t *ck, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int H = c->hidden_size, V = c->vocab_size, l = c->num_layers;
    char probe[96], n[160], prefix[64];
    snprintf(prefix, sizeof prefix, "model.layers.%d", l);
    snprintf(probe, sizeof probe, "%s.eh_proj.weight", prefix);
    if (c->mla.num_nextn_predict_layers < 1 || !ckpt_has(ck, probe))
        return 0;                             /* no MTP layer stored (transformers' save_pretrained drops it) */
    model_mtp_t *t = calloc(1, sizeof *t);
    if (!t)
        return errf(err, errlen, "%s: out of memory", m->where);
    m->mtp = t;
    size_t bytes = 0;
#define NAME(suffix) (snprintf(n, sizeof n, "%s." suffix, prefix), n)
    if (model_mat(m, ck, &t->embed, V, H, NAME("embed_tokens.weight"), err, errlen) < 0 ||
        s_split_eh(m, ck, NAME("eh_proj.weight"), t, err, errlen) < 0 ||
        model_mat(m, ck, &t->head, V, H, NAME("shared_head.head.weight"), err, errlen) < 0 ||
        !(t->enorm = model_vec(m, ck, H, NAME("enorm.weight"), err, errlen)) ||
        !(t->hnorm = model_vec(m, ck, H, NAME("hnorm.weight"), err, errlen)) ||
        !(t->norm = model_vec(m, ck, H, NAME("shared_head.norm.weight"), err, errlen)) ||
        !(t->layer.attn_norm = model_vec(m, ck, H, NAME("input_layernorm.weight"), err, errlen)) ||
        !(t->layer.mlp_norm = model_vec(m, ck, H, NAME("post_attention_layernorm.weight"), err, errlen)) ||
        mla_load_attention(m, ck, prefix, &t->layer, &bytes, err, errlen) < 0 ||
        !(t->top = model_alloc(m, s_top_words(m) * sizeof(int32_t), "MTP drafts", err, errlen)))
        return -1;
    if (!(t->h_top = malloc(s_top_words(m) * sizeof(int32_t))))
        return errf(err, errlen, "%s: out of memory", m->where);
#undef NAME
    t->layer.is_moe = c->num_experts > 0;
    if (t->layer.is_moe) {
        /* All its experts, whatever an expert-parallel group's filter (expert_keep): the MTP layer
         * runs on a drafting rank alone, never through the group (engine/mla.c, mla_moe). */
        int (*const keep)(void *, int, int) = m->opts.expert_keep;
        m->opts.expert_keep = NULL;
        const int rc = model_load_moe(m, ck, l, &t->layer, err, errlen);
        m->opts.expert_keep = keep;
        if (rc < 0 || mla_load_moe_extra(m, ck, prefix, &t->layer, &bytes, err, errlen) < 0)
            return -1;
    } else {
        snprintf(n, sizeof n, "%s.mlp", prefix);
        if (model_load_dense_mlp(m, ck, n, c->intermediate_size, &t->layer, err, errlen) < 0)
            return -1;
    }
    /* Its device bytes, for the KV pool's sizing (model_mtp_weight_bytes): every stored tensor of
     * the layer, as stored (the weights load in their checkpoint dtype). */
    const size_t plen = strlen(prefix);
    for (int i = 0; i < ckpt_count(ck); i++) {
        const tensor_view_t *v = ckpt_at(ck, i);
        if (v && v->name && !strncmp(v->name, prefix, plen) && v->name[plen] == '.')
            t->weight_bytes += v->nbytes;
    }
    return 0;
}

int mla_load_buffers(model_t *m, ckpt_t *ck, char *err, size_t errlen)
{
    const size_t T = (size_t)m->opts.max_tokens;
    if (!(m->mla_buf = model_alloc(m, T * mla_buf_floats(&m->cfg) * sizeof(float), "MLA activations", err, errlen)) ||
        !(m->hid_in = model_alloc(m, T * (size_t)m->cfg.hidden_size * sizeof(float), "MTP hidden states", err, errlen)))
        return -1;
    return s_load_mtp(m, ck, err, errlen);
}

void mla_free(model_t *m)
{
    model_mtp_t *t = m->mtp;
    for (size_t i = 0; t && t->graphs && i < (size_t)(m->opts.max_seqs + 1) * MODEL_GRAPH_MAX_N * 2; i++)
        if (t->graphs[i])
            m->be->ops->graph_free(m->be, t->graphs[i]);
    if (t) {
        free(t->graphs);
        free(t->graph_runs);
        free(t->h_top);
        free(t->layer.experts);
    }
    free(m->mtp);
    m->mtp = NULL;
}
