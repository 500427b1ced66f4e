/* engine/mtp.c — one step of DeepSeek-V3's MTP layer over a batch of MTP sequences (engine/mtp.h).
 *
 * Read it as the layer: embed the tokens with the MTP's own table, normalise the embedding (enorm)
 * and the given hidden states (hnorm), project both through eh_proj's two halves and add them; then
 * the decoder block (MLA over layer 0 of the MTP pool, DeepSeekMoE) with its residuals; then
 * shared_head's norm and head on the rows that get logits. */
#include "engine/mtp.h"

#include <string.h>

#include "common/util.h"
#include "engine/model_internal.h"

int model_has_mtp(const model_t *m) { return m->mtp != NULL; }

size_t model_mtp_weight_bytes(const model_t *m) { return m->mtp ? m->mtp->weight_bytes : 0; }

kvpool_t *model_mtp_pool_new(const model_t *m, int n_blocks, int block_size, dtype_t dtype, char *err, size_t errlen)
{
    if (!m->mtp)
        return errf(err, errlen, "%s: the model has no MTP layer", m->where), NULL;
    return kvpool_new(n_blocks, block_size, 1, m->cfg.num_kv_heads, m->cfg.head_dim, dtype, m->be, err, errlen);
}

static int s_validate(const model_t *m, const model_batch_t *b, int *T_out, int *R_out, const bk_kv_t **kv_out,
                      char *err, size_t errlen)
{
    if (!m->mtp)
        return errf(err, errlen, "%s: the model has no MTP layer", m->where);
    if (!b || b->n_seqs < 1 || b->n_seqs > m->opts.max_seqs)
        return errf(err, errlen, "%s: MTP batch of %d sequences (1..%d)", m->where, b ? b->n_seqs : 0, m->opts.max_seqs);
    long T = 0, R = 0;
    const kvpool_t *pool = NULL;
    for (int s = 0; s < b->n_seqs; s++) {
        const model_seq_t *q = &b->seqs[s];
        if (!q->kv || q->n_new < 1 || q->n_new > kvseq_len(q->kv) || kvseq_len(q->kv) > m->opts.max_context)
            return errf(err, errlen, "%s: MTP sequence %d: bad length or new tokens", m->where, s);
        if (pool && kvseq_pool(q->kv) != pool)
            return errf(err, errlen, "%s: MTP sequence %d uses another KV pool than sequence 0", m->where, s);
        pool = kvseq_pool(q->kv);
        T += q->n_new;
        R += b->all_logits ? q->n_new : 1;
    }
    if (T > m->opts.max_tokens || R > m->opts.max_logit_rows)
        return errf(err, errlen, "%s: MTP batch of %ld tokens, %ld logits rows exceeds max_tokens %d / max_logit_rows %d",
                    m->where, T, R, m->opts.max_tokens, m->opts.max_logit_rows);
    const bk_kv_t *kv = kvpool_view(pool);
    if (!kv->base || kv->n_layers != 1 || kv->n_kv_heads != m->cfg.num_kv_heads || kv->head_dim != m->cfg.head_dim)
        return errf(err, errlen, "%s: the MTP pool must have KV memory and one layer of the model's KV shape", m->where);
    *T_out = (int)T;
    *R_out = (int)R;
    *kv_out = kv;
    return 0;
}

int model_mtp_forward(model_t *m, const model_batch_t *b, const float *hidden, float *logits, float *hidden_out,
                      char *err, size_t errlen)
{
    int T = 0, R = 0;
    const bk_kv_t *kv = NULL;
    if (s_validate(m, b, &T, &R, &kv, err, errlen) < 0)
        return -1;
    bk_attn_meta_t meta;
    int32_t *ids, *rows;
    if (model_step_layout(m, b, T, R, &meta, &ids, &rows, err, errlen) < 0)
        return -1;
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const model_mtp_t *t = m->mtp;
    const model_layer_t *L = &t->layer;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const float eps = (float)m->cfg.rms_norm_eps;
    const size_t rowf = (size_t)H * sizeof(float);
    /* The normed halves of the eh_proj input: mla_buf's last 2H per row (engine/mla_load.c). */
    float *en = m->mla_buf + (size_t)T * (mla_buf_floats(&m->cfg) - 2 * (size_t)H), *hn = en + (size_t)T * H;
    if (op->upload(be, m->hid_in, hidden, (size_t)T * rowf) < 0)
        return errf(err, errlen, "%s: cannot upload the MTP hidden states", m->where);
    PROF(m, P_EMBED, op->embed(be, &t->embed, ids, T, m->xn));
    PROF(m, P_NORM, op->add_rmsnorm(be, m->xn, NULL, t->enorm, T, H, eps, en));
    PROF(m, P_NORM, op->add_rmsnorm(be, m->hid_in, NULL, t->hnorm, T, H, eps, hn));
    PROF(m, P_QKV, op->matmul(be, en, T, &t->eh_e, NULL, m->res));
    PROF(m, P_QKV, op->matmul(be, hn, T, &t->eh_h, NULL, m->delta));
    PROF(m, P_NORM, op->add_rmsnorm(be, m->res, m->delta, L->attn_norm, T, H, eps, m->xn));
    mla_attention(m, L, 0, T, kv, &meta);
    PROF(m, P_NORM, op->add_rmsnorm(be, m->res, m->delta, L->mlp_norm, T, H, eps, m->xn));
    if (L->is_moe)
        mla_moe(m, L, -1, T);
    else
        model_mlp_dense(m, L, T);
    PROF(m, P_NORM, op->add_rmsnorm(be, m->res, m->delta, t->norm, T, H, eps, m->xn));
    PROF(m, P_LM_HEAD, op->gather_rows(be, m->xn, rows, R, H, m->rows));
    PROF(m, P_LM_HEAD, op->matmul(be, m->rows, R, &t->head, NULL, m->logits));
    int rc = 0;
    if (hidden_out)
        rc = op->download(be, hidden_out, m->res, (size_t)T * rowf);
    if (rc == 0 && b->argmax_out) {
        PROF(m, P_ARGMAX, op->argmax(be, m->logits, R, V, m->argmax));
        rc = op->download(be, b->argmax_out, m->argmax, (size_t)R * sizeof(int32_t));
    }
    if (rc == 0 && logits)
        rc = op->download(be, logits, m->logits, (size_t)R * V * sizeof(float));
    if (rc < 0)
        return errf(err, errlen, "%s: the %s backend failed during the MTP step", m->where, op->name);
    return 0;
}
