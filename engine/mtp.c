/* engine/mtp.c — one step of DeepSeek-V3's MTP layer over a batch of MTP sequences (engine/mtp.h).
 *
 * Read it as the layer: embed the tokens with the MTP's own table, normalise the embedding (enorm)
 * and the given hidden states (hnorm), project both through eh_proj's two halves and add them; then
 * the decoder block (MLA over layer 0 of the MTP pool, DeepSeekMoE) with its residuals; then
 * shared_head's norm and head on the rows that get logits; with top_prob each row's draft and its
 * probability on the device (mtp_top), so that only ids, probabilities and the block's output
 * come back. Batches of equal rows per sequence replay step graphs (s_graph_step). */
#include "engine/mtp.h"

#include <stdlib.h>
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

/* The MTP step's ops from the embedding to the logits [R][V], and with top each row's draft and
 * its probability (mtp_top into t->top): everything an MTP step graph holds. The
 * hidden rows are in hid_in already. */
static void s_body(model_t *m, int T, int R, const bk_kv_t *kv, const bk_attn_meta_t *meta, const int32_t *ids,
                   const int32_t *rows, int top)
{
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const model_mtp_t *t = m->mtp;
    const model_layer_t *L = &t->layer;
    const int H = m->cfg.hidden_size;
    const float eps = (float)m->cfg.rms_norm_eps;
    /* The normed halves of the eh_proj input: mla_buf's last 2H per row (engine/mla_load.c). */
    float *en = m->mla_buf + (size_t)T * (mla_buf_floats(&m->cfg) - 2 * (size_t)H), *hn = en + (size_t)T * H;
    PROF(m, P_EMBED, op->embed(be, &t->embed, ids, T, m->xn));
    PROF(m, P_NORM, op->add_rmsnorm(be, m->xn, NULL, t->enorm, T, H, eps, en));
    PROF(m, P_NORM, op->add_rmsnorm(be, m->hid_in, NULL, t->hnorm, T, H, eps, hn));
    PROF(m, P_QKV, op->matmul(be, en, T, &t->eh_e, NULL, m->res));
    PROF(m, P_QKV, op->matmul(be, hn, T, &t->eh_h, NULL, m->delta));
    PROF(m, P_NORM, op->add_rmsnorm(be, m->res, m->delta, L->attn_norm, T, H, eps, m->xn));
    mla_attention(m, L, 0, T, kv, meta);
    PROF(m, P_NORM, op->add_rmsnorm(be, m->res, m->delta, L->mlp_norm, T, H, eps, m->xn));
    if (L->is_moe)
        mla_moe(m, L, -1, T);
    else
        model_mlp_dense(m, L, T);
    PROF(m, P_NORM, op->add_rmsnorm(be, m->res, m->delta, t->norm, T, H, eps, m->xn));
    PROF(m, P_LM_HEAD, op->gather_rows(be, m->xn, rows, R, H, m->rows));
    PROF(m, P_LM_HEAD, op->matmul(be, m->rows, R, &t->head, NULL, m->logits));
    if (top)
        PROF(m, P_ARGMAX, op->mtp_top(be, m->logits, R, m->cfg.vocab_size, t->top, (float *)(t->top + R)));
    if (top && T <= MTP_JOIN_ROWS)   /* the block's output beside them: one download (model_mtp_forward) */
        PROF(m, P_DOWNLOAD, op->copy(be, t->top + 2 * R, m->res, (size_t)T * H * sizeof(float)));
}

/* An MTP step of B sequences of n new rows each (logits of each one's last row, or of every row:
 * a padded feed, engine/spec_mtp.c), drafts and probabilities on the device (top),
 * through a graph as forward.c's s_graph_step does the target's decode steps: the first step of a
 * (B, n) bucket runs uncaptured, the second records, later ones replay. On a small model an MTP
 * step is mostly launches (one layer and the head: some 30 kernels), as long as a captured step
 * of the whole target; a draft costs one such step per position. 1 when the body was queued. */
static int s_graph_step(model_t *m, const model_batch_t *b, int T, int R, const bk_kv_t *kv,
                        const bk_attn_meta_t *meta, const int32_t *ids, const int32_t *rows, int top)
{
    const backend_ops_t *op = m->be->ops;
    model_mtp_t *t = m->mtp;
    const int B = b->n_seqs, n = T / B;
    if (!top || m->graph_off || m->opts.no_graphs || !op->graph_begin || m->prof || T % B != 0 ||
        n > MODEL_GRAPH_MAX_N || (R != B && R != T))
        return 0;
    for (int s = 0; s < B; s++)
        if (b->seqs[s].n_new != n)
            return 0;
    const size_t slots = (size_t)(m->opts.max_seqs + 1) * MODEL_GRAPH_MAX_N * 2;
    if (!t->graphs) {
        t->graphs = calloc(slots, sizeof *t->graphs);
        t->graph_runs = calloc(slots, 1);
        if (!t->graphs || !t->graph_runs) {
            free(t->graphs);
            free(t->graph_runs);
            t->graphs = NULL;
            t->graph_runs = NULL;
            return 0;
        }
    }
    if (t->graph_kv != kv->base) {   /* another pool: every graph addresses the old one */
        for (size_t i = 0; i < slots; i++)
            if (t->graphs[i]) {
                op->graph_free(m->be, t->graphs[i]);
                t->graphs[i] = NULL;
            }
        t->graph_kv = kv->base;
    }
    const size_t slot = (size_t)((n - 1) * 2 + (R == T && n > 1)) * (size_t)(m->opts.max_seqs + 1) + (size_t)B;
    void *g = t->graphs[slot];
    if (g && op->graph_launch(m->be, g) == 0) {
        m->graph_replays++;
        return 1;
    }
    if (g) {   /* stale: a scratch buffer it uses was reallocated by a larger step */
        op->graph_free(m->be, g);
        t->graphs[slot] = NULL;
        m->graph_rerecords++;
    } else if (t->graph_runs[slot] == 0) {
        t->graph_runs[slot] = 1;
        return 0;
    } else if (t->graph_runs[slot] == 2 ||
               (t->layer.is_moe && (!op->moe_graphable ||
                                    !op->moe_graphable(m->be, T, m->cfg.hidden_size, m->cfg.num_experts_per_tok,
                                                       t->layer.experts, m->cfg.num_experts)))) {
        t->graph_runs[slot] = 2;     /* never in this bucket */
        return 0;
    }
    if (op->graph_begin(m->be) != 0) {
        t->graph_runs[slot] = 2;     /* graphs are off in the backend (TROUPE_CUDA_GRAPHS=0) */
        return 0;
    }
    s_body(m, T, R, kv, meta, ids, rows, top);
    char why[256];
    g = op->graph_end(m->be, why, sizeof why);
    if (!g) {   /* nothing of the body ran: the caller runs it, and this bucket is not recorded again */
        t->graph_runs[slot] = 2;
        return 0;
    }
    t->graphs[slot] = g;
    m->graph_records++;
    if (op->graph_launch(m->be, g) != 0) {   /* cannot be stale: nothing ran since the recording */
        op->graph_free(m->be, g);
        t->graphs[slot] = NULL;
        t->graph_runs[slot] = 2;
        return 0;
    }
    m->graph_replays++;
    return 1;
}

int model_mtp_logits_rows(model_t *m, int row0, int n, float *out)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    return m->be->ops->download(m->be, out, m->logits + (size_t)row0 * V, (size_t)n * V * sizeof(float)) < 0 ? -1 : 0;
}

int model_mtp_forward(model_t *m, const model_batch_t *b, const float *hidden, float *logits, float *hidden_out,
                      float *top_prob, char *err, size_t errlen)
{
    int T = 0, R = 0;
    const bk_kv_t *kv = NULL;
    if (s_validate(m, b, &T, &R, &kv, err, errlen) < 0)
        return -1;
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const int top = top_prob != NULL;
    if (top && (!b->argmax_out || !op->mtp_top))
        return errf(err, errlen, "%s: MTP draft probabilities need argmax_out and the %s backend's mtp_top op",
                    m->where, op->name);
    bk_attn_meta_t meta;
    int32_t *ids, *rows;
    if (model_step_layout(m, b, T, R, &meta, &ids, &rows, err, errlen) < 0)
        return -1;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const size_t rowf = (size_t)H * sizeof(float);
    if (op->upload(be, m->hid_in, hidden, (size_t)T * rowf) < 0)
        return errf(err, errlen, "%s: cannot upload the MTP hidden states", m->where);
    if (!s_graph_step(m, b, T, R, kv, &meta, ids, rows, top))
        s_body(m, T, R, kv, &meta, ids, rows, top);
    if (b->argmax_out && !top)
        PROF(m, P_ARGMAX, op->argmax(be, m->logits, R, V, m->argmax));
    /* Each download waits for the stream: ids, probabilities and (small steps) the block's output
     * come down together. */
    const int joined = top && T <= MTP_JOIN_ROWS;
    int rc = 0;
    if (hidden_out && !joined)
        rc = op->download(be, hidden_out, m->res, (size_t)T * rowf);
    if (rc == 0 && top) {
        const int32_t *h = m->mtp->h_top;
        rc = op->download(be, m->mtp->h_top, m->mtp->top,
                          (2 * (size_t)R + (joined && hidden_out ? (size_t)T * H : 0)) * sizeof(int32_t));
        if (rc == 0) {
            memcpy(b->argmax_out, h, (size_t)R * sizeof(int32_t));
            memcpy(top_prob, h + R, (size_t)R * sizeof(float));
            if (joined && hidden_out)
                memcpy(hidden_out, h + 2 * R, (size_t)T * rowf);
        }
    } else if (rc == 0 && b->argmax_out) {
        rc = op->download(be, b->argmax_out, m->argmax, (size_t)R * sizeof(int32_t));
    }
    if (rc == 0 && logits)
        rc = op->download(be, logits, m->logits, (size_t)R * V * sizeof(float));
    if (rc < 0)
        return errf(err, errlen, "%s: the %s backend failed during the MTP step", m->where, op->name);
    return 0;
}
