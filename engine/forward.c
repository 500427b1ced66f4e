/* engine/forward.c — one step of the decoder over a batch of sequences.
 *
 * Read it top to bottom as the model: embed, then per layer
 *     x = norm(res);  res += o(attention(rope(norm_qk(q(x))), rope(norm_qk(k(x))), v(x)))
 *     x = norm(res);  res += mlp(x)        (SwiGLU, or routed experts)
 * then the final norm and the LM head on the rows that want logits. The residual add is fused
 * into the next norm (add_rmsnorm), so `delta` carries each block's output to the next norm.
 *
 * Duties of model_forward: validate the batch (nothing is computed on a bad one), lay out the
 * step's metadata (token ids, each row's sequence and position, the block tables, the rows that
 * get logits) in one host array and upload it once, run the layers, download the logits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/ep.h"
#include "engine/model_internal.h"

static const char *const s_prof_names[P_COUNT] = {
    "embed", "rmsnorm", "qkv_proj", "qk_norm", "rope", "kv_store", "attention", "o_proj",
    "gate_up_proj", "swiglu", "down_proj", "moe_route", "moe_experts", "lm_head", "argmax", "download"};

void model_profile_enable(model_t *m, int on) { m->prof = on != 0; }

size_t model_profile(model_t *m, char *buf, size_t len, int reset)
{
    size_t n = 0;
    if (len)
        buf[0] = 0;
    for (int i = 0; i < P_COUNT; i++) {
        if (m->prof_calls[i] && n < len)
            n += (size_t)snprintf(buf + n, len - n, "%s %.3f %lld\n", s_prof_names[i], m->prof_ns[i] / 1e6,
                                  (long long)m->prof_calls[i]);
        if (reset)
            m->prof_ns[i] = m->prof_calls[i] = 0;
    }
    return n < len ? n : len;
}

/* Rows of logits of sequence s of the batch: its n_logits, else the batch's rule (the last new
 * token, or every one with all_logits). */
static int s_logit_rows(const model_batch_t *b, int s)
{
    const model_seq_t *q = &b->seqs[s];
    return q->n_logits > 0 ? q->n_logits : b->all_logits ? q->n_new : 1;
}

/* Builds the step's metadata into m->h_meta and its bk_attn_meta_t view (device pointers). */
static int s_layout(model_t *m, const model_batch_t *b, int T, int R, bk_attn_meta_t *meta, int32_t **d_ids,
                    int32_t **d_rows, char *err, size_t errlen)
{
    const int S = b->n_seqs;
    int32_t *ids = m->h_meta, *tseq = ids + T, *tpos = tseq + T, *rows = tpos + T, *bt_start = rows + R,
            *row0 = bt_start + S, *bt = row0 + S + 1;
    int row = 0, n_bt = 0, r = 0, max_rows = 0;
    for (int s = 0; s < S; s++) {
        const kvseq_t *kv = b->seqs[s].kv;
        const int len = kvseq_len(kv), n_new = b->seqs[s].n_new, nb = kvseq_n_blocks(kv);
        const int32_t *tok = kvseq_tokens(kv);
        if (n_bt + nb > m->max_bt)
            return errf(err, errlen, "%s: the batch's block tables need more than %d entries (model_opts max_seqs x "
                        "max_context / kv_block_size)", m->where, m->max_bt);
        bt_start[s] = n_bt;
        memcpy(bt + n_bt, kvseq_blocks(kv), (size_t)nb * sizeof(int32_t));
        n_bt += nb;
        row0[s] = row;
        max_rows = n_new > max_rows ? n_new : max_rows;
        const int first_logit = len - s_logit_rows(b, s);   /* positions from here get logits */
        for (int i = len - n_new; i < len; i++, row++) {
            if (tok[i] < 0 || tok[i] >= m->cfg.vocab_size)
                return errf(err, errlen, "%s: sequence %d token %d at position %d is outside the vocabulary [0, %d)",
                            m->where, s, tok[i], i, m->cfg.vocab_size);
            ids[row] = tok[i];
            tseq[row] = s;
            tpos[row] = i;
            if (i >= first_logit)
                rows[r++] = row;
        }
    }
    row0[S] = row;
    /* One upload of the used part of each section (the sections are contiguous in both copies). */
    size_t used = (size_t)(3 * T + R + 2 * S + 1 + n_bt);
    if (m->be->ops->upload(m->be, m->d_meta, m->h_meta, used * sizeof(int32_t)) < 0)
        return errf(err, errlen, "%s: cannot upload the step metadata", m->where);
    int32_t *d = m->d_meta;
    *d_ids = d;
    int n_single = 0;   /* the leading one-row sequences: decode rows before prompt chunks */
    while (n_single < S && b->seqs[n_single].n_new == 1)
        n_single++;
    *meta = (bk_attn_meta_t){.n_tokens = T, .n_seqs = S, .tok_seq = d + T, .tok_pos = d + 2 * T,
                             .seq_bt_start = d + 3 * T + R, .block_table = d + 3 * T + R + 2 * S + 1,
                             .n_single = n_single, .seq_row0 = d + 3 * T + R + S, .max_rows = max_rows};
    *d_rows = d + 3 * T;
    return 0;
}

static int s_validate(const model_t *m, const model_batch_t *b, int *T_out, int *R_out, const bk_kv_t **kv_out,
                      char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    if (!b || b->n_seqs < 1 || !b->seqs)
        return errf(err, errlen, "%s: empty batch", m->where);
    if (b->n_seqs > m->opts.max_seqs)
        return errf(err, errlen, "%s: batch of %d sequences exceeds max_seqs %d", m->where, b->n_seqs, m->opts.max_seqs);
    const kvpool_t *pool = NULL;
    long T = 0, R = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const model_seq_t *q = &b->seqs[s];
        if (!q->kv)
            return errf(err, errlen, "%s: sequence %d has no KV sequence", m->where, s);
        if (q->n_new < 1 || q->n_new > kvseq_len(q->kv))
            return errf(err, errlen, "%s: sequence %d: %d new tokens of %d recorded", m->where, s, q->n_new, kvseq_len(q->kv));
        if (q->n_logits < 0 || q->n_logits > q->n_new)
            return errf(err, errlen, "%s: sequence %d: %d rows of logits of %d new tokens", m->where, s, q->n_logits,
                        q->n_new);
        if (kvseq_len(q->kv) > m->opts.max_context)
            return errf(err, errlen, "%s: sequence %d has %d tokens, beyond max_context %d", m->where, s,
                        kvseq_len(q->kv), m->opts.max_context);
        for (int r = 0; r < s; r++)
            if (b->seqs[r].kv == q->kv)
                return errf(err, errlen, "%s: sequences %d and %d of the batch are the same sequence", m->where, r, s);
        if (pool && kvseq_pool(q->kv) != pool)
            return errf(err, errlen, "%s: sequence %d uses another KV pool than sequence 0", m->where, s);
        pool = kvseq_pool(q->kv);
        T += q->n_new;
        R += s_logit_rows(b, s);
    }
    if (T > m->opts.max_tokens)
        return errf(err, errlen, "%s: batch of %ld new tokens exceeds max_tokens %d", m->where, T, m->opts.max_tokens);
    if (R > m->opts.max_logit_rows)
        return errf(err, errlen, "%s: %ld rows of logits exceed max_logit_rows %d", m->where, R, m->opts.max_logit_rows);
    const bk_kv_t *kv = kvpool_view(pool);
    if (!kv->base)
        return errf(err, errlen, "%s: the KV pool has no memory (a bookkeeping-only pool)", m->where);
    if (kv->n_layers != c->num_layers || kv->n_kv_heads != c->num_kv_heads || kv->head_dim != c->head_dim)
        return errf(err, errlen, "%s: KV pool shaped for %d layers x %d kv heads x %d, the model has %d x %d x %d",
                    m->where, kv->n_layers, kv->n_kv_heads, kv->head_dim, c->num_layers, c->num_kv_heads, c->head_dim);
    *T_out = (int)T;
    *R_out = (int)R;
    *kv_out = kv;
    return 0;
}

/* x = xn [T][H] -> delta [T][H]: causal self-attention of layer l. */
static void s_attention(model_t *m, int l, int T, const bk_kv_t *kv, const bk_attn_meta_t *meta)
{
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const model_config_t *c = &m->cfg;
    const model_layer_t *L = &m->layers[l];
    if (c->mla.on) {              /* DeepSeek-V3: latent attention over the compressed cache */
        mla_attention(m, L, l, T, kv, meta);
        return;
    }
    /* q, k, v one after another: with one row that is exactly the fused matrix's output. */
    float *q = m->qkv, *k = q + (size_t)T * L->q.rows, *v = k + (size_t)T * L->k.rows;
    if (T == 1 && L->qkv.data && !L->q_bias) {
        PROF(m, P_QKV, op->matmul(be, m->xn, 1, &L->qkv, NULL, q));
    } else if (op->matmul_n) {
        const bk_mat_t *const w[3] = {&L->q, &L->k, &L->v};
        const float *const bias[3] = {L->q_bias, L->k_bias, L->v_bias};
        float *const y[3] = {q, k, v};
        PROF(m, P_QKV, op->matmul_n(be, m->xn, T, 3, w, bias, y));
    } else {
        PROF(m, P_QKV, op->matmul(be, m->xn, T, &L->q, L->q_bias, q));
        PROF(m, P_QKV, op->matmul(be, m->xn, T, &L->k, L->k_bias, k));
        PROF(m, P_QKV, op->matmul(be, m->xn, T, &L->v, L->v_bias, v));
    }
    if (L->q_norm) {
        PROF(m, P_QK_NORM, op->head_rmsnorm(be, q, L->q_norm, T, c->num_heads, c->head_dim, (float)c->rms_norm_eps));
        PROF(m, P_QK_NORM, op->head_rmsnorm(be, k, L->k_norm, T, c->num_kv_heads, c->head_dim, (float)c->rms_norm_eps));
    }
    if (op->rope_kv_store && !m->opts.plain_ops) {
        PROF(m, P_ROPE, op->rope_kv_store(be, kv, l, q, k, v, c->num_heads, m->inv_freq, meta));
    } else {
        PROF(m, P_ROPE, op->rope(be, q, meta->tok_pos, m->inv_freq, T, c->num_heads, c->head_dim));
        PROF(m, P_ROPE, op->rope(be, k, meta->tok_pos, m->inv_freq, T, c->num_kv_heads, c->head_dim));
        PROF(m, P_KV_STORE, op->kv_store(be, kv, l, k, v, meta));
    }
    PROF(m, P_ATTENTION, op->attention(be, kv, l, q, c->num_heads, m->scale, meta, m->att));
    PROF(m, P_O, op->matmul(be, m->att, T, &L->o, L->o_bias, m->delta));
}

void model_mlp_dense(model_t *m, const model_layer_t *L, int T)
{
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    {
        /* gate then up: with one row, the fused matrix's output. */
        float *g = m->gu, *u = g + (size_t)T * L->gate.rows;
        int fused = 0;   /* gate|up and SwiGLU in one pass (one row, a backend that can) */
        if (T == 1 && L->gate_up.data && op->gate_up_swiglu && !m->opts.plain_ops)
            PROF(m, P_GATE_UP, fused = op->gate_up_swiglu(be, m->xn, 1, &L->gate_up, g) == 0);
        if (T > 1 && op->mlp_swiglu && !m->opts.plain_ops) {   /* the whole MLP (profiled as gate_up) */
            int whole = 0;
            PROF(m, P_GATE_UP, whole = op->mlp_swiglu(be, m->xn, T, &L->gate, &L->up, &L->down, g, u, m->delta) == 0);
            if (whole)
                return;
        }
        if (fused) {
            /* g holds silu(gate) * up */
        } else if (T == 1 && L->gate_up.data) {
            PROF(m, P_GATE_UP, op->matmul(be, m->xn, 1, &L->gate_up, NULL, g));
        } else if (op->matmul_n) {
            const bk_mat_t *const w[2] = {&L->gate, &L->up};
            float *const y[2] = {g, u};
            PROF(m, P_GATE_UP, op->matmul_n(be, m->xn, T, 2, w, NULL, y));
        } else {
            PROF(m, P_GATE_UP, op->matmul(be, m->xn, T, &L->gate, NULL, g));
            PROF(m, P_GATE_UP, op->matmul(be, m->xn, T, &L->up, NULL, u));
        }
        if (!fused)
            PROF(m, P_SWIGLU, op->swiglu(be, g, u, T * (int)L->gate.rows, g));
        PROF(m, P_DOWN, op->matmul(be, g, T, &L->down, NULL, m->delta));
    }
}

/* TROUPE_MOE_COUNT=0 leaves the MoE load counters out of every step (the expert-balancer then gets
 * no load): to measure what counting costs. Read once. The MLA models' MoE layers (mla.c) ask too. */
int model_moe_count_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("TROUPE_MOE_COUNT");
        on = !(v && strcmp(v, "0") == 0);
    }
    return on;
}

/* xn -> delta: the feed-forward block of layer l (dense SwiGLU, or the routed experts). */
static void s_mlp(model_t *m, int l, int T)
{
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const model_config_t *c = &m->cfg;
    const model_layer_t *L = &m->layers[l];
    if (!L->is_moe) {
        model_mlp_dense(m, L, T);
        return;
    }
    if (c->mla.on) {              /* DeepSeek-V3: sigmoid group-limited routing, shared experts */
        mla_moe(m, L, l, T);
        return;
    }
    const int renorm = c->arch == ARCH_MIXTRAL || c->norm_topk_prob;
    PROF(m, P_MOE_ROUTE, op->matmul(be, m->xn, T, &L->router, L->router_bias, m->rlogits));
    PROF(m, P_MOE_ROUTE, op->moe_route(be, m->rlogits, T, c->num_experts, c->num_experts_per_tok, renorm, m->moe_ids, m->moe_w));
    if (m->ep)                    /* expert-parallel: dispatch to the group's ranks, combine back (engine/ep.h) */
        PROF(m, P_MOE_FFN, ep_moe_layer(m->ep, l, T, m->xn, m->moe_ids, m->moe_w, m->delta));
    else
        PROF(m, P_MOE_FFN, op->moe_ffn(be, m->xn, T, c->hidden_size, m->moe_ids, m->moe_w, c->num_experts_per_tok,
                                       L->experts, c->num_experts, m->moe_scratch, m->delta));
    if (op->moe_count && model_moe_count_on())   /* the expert-balancer's load: device work, read once per window */
        op->moe_count(be, m->moe_ids, T * c->num_experts_per_tok, m->moe_counts + (size_t)l * c->num_experts);
}

/* Brings the step's results to the host: every row's logits, or (argmax_out) the argmax or sampled
 * id of every row (computed by the caller into m->argmax) plus the logits of the rows marked in need_logits,
 * in runs of consecutive rows. */
static int s_results(model_t *m, const model_batch_t *b, int R, float *logits)
{
    const backend_ops_t *op = m->be->ops;
    const size_t V = (size_t)m->cfg.vocab_size;
    if (!b->argmax_out)
        return op->download(m->be, logits, m->logits, (size_t)R * V * sizeof(float));
    for (int r = 0; r < R;) {
        if (!b->need_logits || !b->need_logits[r]) {
            r++;
            continue;
        }
        int e = r + 1;
        while (e < R && b->need_logits[e])
            e++;
        if (op->download(m->be, logits + (size_t)r * V, m->logits + (size_t)r * V, (size_t)(e - r) * V * sizeof(float)) < 0)
            return -1;
        r = e;
    }
    return op->download(m->be, b->argmax_out, m->argmax, (size_t)R * sizeof(int32_t));
}

/* The step's ops from the embedding to the logits [R][V]: everything a decode-step graph holds. */
static void s_body(model_t *m, int T, int R, const bk_kv_t *kv, const bk_attn_meta_t *meta, const int32_t *ids,
                   const int32_t *rows)
{
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const model_config_t *c = &m->cfg;
    const int H = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;

    PROF(m, P_EMBED, op->embed(be, &m->embed, ids, T, m->res));
    for (int l = 0; l < c->num_layers; l++) {
        PROF(m, P_NORM, op->add_rmsnorm(be, m->res, l ? m->delta : NULL, m->layers[l].attn_norm, T, H, eps, m->xn));
        s_attention(m, l, T, kv, meta);
        PROF(m, P_NORM, op->add_rmsnorm(be, m->res, m->delta, m->layers[l].mlp_norm, T, H, eps, m->xn));
        s_mlp(m, l, T);
    }
    PROF(m, P_NORM, op->add_rmsnorm(be, m->res, m->delta, m->final_norm, T, H, eps, m->xn));
    PROF(m, P_LM_HEAD, op->gather_rows(be, m->xn, rows, R, H, m->rows));
    PROF(m, P_LM_HEAD, op->matmul(be, m->rows, R, &m->lm_head, NULL, m->logits));
}

/* Graph slots: one per (batch size B, new tokens per sequence n, logits of every row or only the
 * last one's): ((n - 1) * 2 + every) * (max_seqs + 1) + B. */
static size_t s_graph_slots(const model_t *m) { return (size_t)(m->opts.max_seqs + 1) * MODEL_GRAPH_MAX_N * 2; }

void model_graphs_drop(model_t *m)
{
    for (size_t i = 0; m->graphs && i < s_graph_slots(m); i++)
        if (m->graphs[i]) {
            m->be->ops->graph_free(m->be, m->graphs[i]);
            m->graphs[i] = NULL;
        }
}

uint64_t model_graph_rerecords(const model_t *m) { return m->graph_rerecords; }

void model_graph_stats(const model_t *m, uint64_t *records, uint64_t *replays)
{
    if (records)
        *records = m->graph_records;
    if (replays)
        *replays = m->graph_replays;
}

/* Whether every op of a T-row step may be recorded: the MoE layers' experts only where the backend
 * runs them on the device alone (CUDA: every step of bf16/f16 experts; f32 experts only up to
 * TROUPE_CUDA_MOE_DEVICE_MAX_M tokens, larger steps sort on the host). */
static int s_graphable(model_t *m, int T)
{
    const backend_ops_t *op = m->be->ops;
    const model_config_t *c = &m->cfg;
    if (m->ep)   /* the group's exchange waits on the host */
        return 0;
    for (int l = 0; l < c->num_layers; l++) {
        const model_layer_t *L = &m->layers[l];
        if (L->is_moe && (!op->moe_graphable || !op->moe_graphable(m->be, T, c->hidden_size, c->num_experts_per_tok,
                                                                     L->experts, c->num_experts)))
            return 0;
    }
    return 1;
}

/* A decode step (B sequences, one new row each, one logits row each) or a verify step (B
 * sequences of n new rows each, n <= MODEL_GRAPH_MAX_N: a token and its n - 1 drafts; logits of
 * every row or of the last) through a graph: the second step of a (B, n, rows of logits) bucket
 * records its ops (the first ran them uncaptured, so every scratch buffer they need exists:
 * recording must not allocate), later ones replay. The graph holds every device address and
 * launch shape of the step; what changes between steps of one bucket (ids, positions, block
 * tables) is in m->d_meta, uploaded before and read by the ops, at offsets fixed by the bucket;
 * the weights (the MoE experts arrays too) are fixed after load. Returns 1 when the body was
 * queued (recorded and replayed, or replayed), 0 when the caller runs it. */
static int s_graph_step(model_t *m, const model_batch_t *b, int T, int R, const bk_kv_t *kv,
                        const bk_attn_meta_t *meta, const int32_t *ids, const int32_t *rows)
{
    const backend_ops_t *op = m->be->ops;
    const int B = b->n_seqs, n = T / B;
    if (m->graph_off || !op->graph_begin || m->prof || T % B != 0 || n > MODEL_GRAPH_MAX_N || (R != B && R != T))
        return 0;
    for (int s = 0; s < B; s++)
        if (b->seqs[s].n_new != n)
            return 0;
    if (!m->graphs) {
        m->graph_off = m->opts.no_graphs;
        m->graphs = m->graph_off ? NULL : calloc(s_graph_slots(m), sizeof *m->graphs);
        m->graph_runs = m->graph_off ? NULL : calloc(s_graph_slots(m), 1);
        if (!m->graphs || !m->graph_runs) {
            m->graph_off = 1;
            return 0;
        }
    }
    if (m->graph_kv != kv->base) {   /* another pool: every graph addresses the old one */
        model_graphs_drop(m);
        m->graph_kv = kv->base;
    }
    const size_t slot = (size_t)((n - 1) * 2 + (R == T && n > 1)) * (size_t)(m->opts.max_seqs + 1) + (size_t)B;
    void *g = m->graphs[slot];
    if (g && op->graph_launch(m->be, g) == 0) {
        m->graph_replays++;
        return 1;
    }
    if (g) {   /* stale: a scratch buffer it uses was reallocated by a larger step */
        op->graph_free(m->be, g);
        m->graphs[slot] = NULL;
        m->graph_rerecords++;
    } else if (m->graph_runs[slot] == 0) {
        m->graph_runs[slot] = 1;
        return 0;
    } else if (m->graph_runs[slot] == 2 || !s_graphable(m, T)) {
        m->graph_runs[slot] = 2;   /* never in this bucket */
        return 0;
    }
    if (op->graph_begin(m->be) != 0) {
        m->graph_off = 1;
        return 0;
    }
    s_body(m, T, R, kv, meta, ids, rows);
    char why[256];
    g = op->graph_end(m->be, why, sizeof why);
    if (!g) {   /* nothing of the body ran: the caller runs it, and no step is recorded again */
        fprintf(stderr, "%s: decode steps run without graphs: %s\n", m->where, why);
        m->graph_off = 1;
        return 0;
    }
    m->graphs[slot] = g;
    m->graph_records++;
    if (op->graph_launch(m->be, g) != 0) {   /* cannot be stale: nothing ran since the recording */
        fprintf(stderr, "%s: a graph just recorded is stale; decode steps run without graphs\n", m->where);
        m->graph_off = 1;
        return 0;
    }
    m->graph_replays++;
    return 1;
}

int model_forward(model_t *m, const model_batch_t *batch, float *logits, char *err, size_t errlen)
{
    int T = 0, R = 0;
    const bk_kv_t *kv = NULL;
    if (s_validate(m, batch, &T, &R, &kv, err, errlen) < 0)
        return -1;
    if (batch->sample && !m->be->ops->sample)
        return errf(err, errlen, "%s: the %s backend has no sample op", m->where, m->be->ops->name);
    bk_attn_meta_t meta;
    int32_t *ids = NULL, *rows = NULL;
    if (s_layout(m, batch, T, R, &meta, &ids, &rows, err, errlen) < 0)
        return -1;

    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    const model_config_t *c = &m->cfg;
    if (!s_graph_step(m, batch, T, R, kv, &meta, ids, rows))
        s_body(m, T, R, kv, &meta, ids, rows);
    if (batch->argmax_out && batch->sample)
        PROF(m, P_ARGMAX, op->sample(be, m->logits, R, c->vocab_size, batch->sample, m->argmax));
    else if (batch->argmax_out)
        PROF(m, P_ARGMAX, op->argmax(be, m->logits, R, c->vocab_size, m->argmax));
    if (m->ep && ep_error(m->ep, err, errlen) < 0)
        return -1;
    int rc = 0;
    if (batch->hidden_out)        /* before the logits: the download waits for the whole step */
        PROF(m, P_DOWNLOAD, rc = op->download(be, batch->hidden_out, m->res, (size_t)T * c->hidden_size * sizeof(float)));
    if (rc == 0)
        PROF(m, P_DOWNLOAD, rc = s_results(m, batch, R, logits));
    if (rc < 0)
        return errf(err, errlen, "%s: the %s backend failed during the forward pass", m->where, op->name);
    return 0;
}

int model_forward_top(model_t *m, const model_batch_t *batch, const int32_t *dev_ids, int32_t *dev_top,
                      float *dev_prob, char *err, size_t errlen)
{
    int T = 0, R = 0;
    const bk_kv_t *kv = NULL;
    if (s_validate(m, batch, &T, &R, &kv, err, errlen) < 0)
        return -1;
    const backend_ops_t *op = m->be->ops;
    backend_t *be = m->be;
    if (!op->mtp_top)
        return errf(err, errlen, "%s: the %s backend has no mtp_top op", m->where, op->name);
    bk_attn_meta_t meta;
    int32_t *ids = NULL, *rows = NULL;
    if (s_layout(m, batch, T, R, &meta, &ids, &rows, err, errlen) < 0)
        return -1;
    /* Over the uploaded ids, before the body reads them (the same stream: in order). */
    if (dev_ids && op->copy(be, ids, dev_ids, (size_t)T * sizeof(int32_t)) != 0)
        return errf(err, errlen, "%s: cannot copy the step's token ids on the %s backend", m->where, op->name);
    if (!s_graph_step(m, batch, T, R, kv, &meta, ids, rows))
        s_body(m, T, R, kv, &meta, ids, rows);
    PROF(m, P_ARGMAX, op->mtp_top(be, m->logits, R, m->cfg.vocab_size, dev_top, dev_prob));
    if (m->ep && ep_error(m->ep, err, errlen) < 0)
        return -1;
    return 0;
}

int model_step_layout(model_t *m, const model_batch_t *b, int T, int R, bk_attn_meta_t *meta, int32_t **d_ids,
                      int32_t **d_rows, char *err, size_t errlen)
{
    return s_layout(m, b, T, R, meta, d_ids, d_rows, err, errlen);
}
