/* engine/model_load.c — from a checkpoint to a model resident on a backend.
 *
 * Every tensor the config implies is asked for by its Hugging Face name with its exact shape
 * (ckpt_expect names the tensor, the file and both shapes on a mismatch), so a checkpoint that
 * does not fit the config fails at load with one clear line, never at run time. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/model_internal.h"

/* Remembers a device buffer to free at destroy; NULL stays NULL. */
static void *s_track(model_t *m, void *p)
{
    if (!p)
        return NULL;
    if (m->n_allocs == m->cap_allocs) {
        int cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
        void **a = realloc(m->allocs, (size_t)cap * sizeof(*a));
        if (!a) {
            m->be->ops->free(m->be, p);
            return NULL;
        }
        m->allocs = a;
        m->cap_allocs = cap;
    }
    m->allocs[m->n_allocs++] = p;
    return p;
}

int model_keep_weight(model_t *m, const void *dev, char *err, size_t errlen)
{
    if (m->n_weights == m->cap_weights) {
        int cap = m->cap_weights ? 2 * m->cap_weights : 256;
        const void **w = realloc(m->weights, (size_t)cap * sizeof(*w));
        if (!w) {
            m->be->ops->weight_release(m->be, dev);
            return errf(err, errlen, "%s: out of memory", m->where);
        }
        m->weights = w;
        m->cap_weights = cap;
    }
    m->weights[m->n_weights++] = dev;
    return 0;
}

void *model_alloc(model_t *m, size_t bytes, const char *what, char *err, size_t errlen)
{
    void *p = s_track(m, m->be->ops->alloc(m->be, bytes ? bytes : 64));
    if (!p)
        errf(err, errlen, "%s: cannot allocate %zu bytes for %s on the %s backend", m->where, bytes, what, m->be->ops->name);
    return p;
}

static int s_dtype_ok(model_t *m, const tensor_view_t *t, char *err, size_t errlen)
{
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
        return errf(err, errlen, "%s: tensor %s has dtype %d (expected f32, bf16 or f16)", m->where, t->name, (int)t->dtype);
    return 0;
}

/* 1 when the backend makes dummy weights in its own memory (fill_dummy), so the host never
 * generates them (model_opts_t.dummy_on_host turns it off; tests compare the two). */
static int s_device_dummy(const model_t *m, const ckpt_t *ck)
{
    return m->be->ops->fill_dummy && ckpt_is_dummy(ck) && !m->opts.dummy_on_host;
}

/* The tensor's view and, when the backend will make its values (s_device_dummy), the recipe;
 * else the bytes on the host. */
static const tensor_view_t *s_expect(model_t *m, ckpt_t *ck, const char *name, int ndim, const int64_t *shape,
                                     ckpt_dummy_recipe_t *r, int *device, char *err, size_t errlen)
{
    *device = s_device_dummy(m, ck);
    return *device ? ckpt_expect_recipe(ck, name, ndim, shape, r, err, errlen)
                   : ckpt_expect(ck, name, ndim, shape, err, errlen);
}

/* A 2-D weight [rows][cols] made resident as it is stored (or quantized: engine/model_quant.inc). */
static int s_mat(model_t *m, ckpt_t *ck, bk_mat_t *out, int64_t rows, int64_t cols, char *err, size_t errlen,
                 const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static int s_mat(model_t *m, ckpt_t *ck, bk_mat_t *out, int64_t rows, int64_t cols, char *err, size_t errlen,
                 const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (model_quant_of(m, ck, name))
        return model_qmat(m, ck, out, name, rows, cols, err, errlen);
    int64_t shape[2] = {rows, cols};
    ckpt_dummy_recipe_t r;
    int device;
    const tensor_view_t *t = s_expect(m, ck, name, 2, shape, &r, &device, err, errlen);
    if (!t || s_dtype_ok(m, t, err, errlen) < 0)
        return -1;
    const void *dev = m->be->ops->weight_put(m->be, device ? NULL : t->data, t->nbytes, dtype_size(t->dtype));
    if (!dev)
        return errf(err, errlen, "%s: cannot place tensor %s (%zu bytes) on the %s backend", m->where, name, t->nbytes,
                    m->be->ops->name);
    const dtype_t dt = t->dtype;
    if (device)
        m->be->ops->fill_dummy(m->be, (void *)dev, r.dtype, t->nbytes / dtype_size(r.dtype), r.key, r.center, r.scale);
    if (m->be->ops->weights_copied)
        ckpt_drop(ck, t);
    if (model_keep_weight(m, dev, err, errlen) < 0)
        return -1;
    *out = (bk_mat_t){.data = dev, .dtype = dt, .rows = rows, .cols = cols};
    return 0;
}


/* n 2-D weights [rows[i]][cols] placed one after another in ONE device buffer: *fused is the
 * whole [sum of rows][cols] matrix, *parts[i] its row ranges. A decode step of one row runs the
 * fused matrix (one launch instead of n, its output laid out as the parts' outputs one after
 * another); longer steps run the parts. Without fusion (model_opts_t.fuse_weights, else the
 * backend's choice) or when the parts' dtypes differ, fused->data stays NULL and each part is
 * placed on its own. */
static int s_mats_fused(model_t *m, ckpt_t *ck, bk_mat_t *fused, bk_mat_t *const parts[], const int64_t rows[],
                        int n, int64_t cols, const char *const names[], char *err, size_t errlen)
{
    const int fuse = m->opts.fuse_weights ? m->opts.fuse_weights > 0 : m->be->ops->fuse_weights;
    if (model_quant_of(m, ck, names[0])) {                 /* quantized: each part on its own (no fused path) */
        *fused = (bk_mat_t){0};
        for (int i = 0; i < n; i++)
            if (s_mat(m, ck, parts[i], rows[i], cols, err, errlen, "%s", names[i]) < 0)
                return -1;
        return 0;
    }
    const tensor_view_t *t[4];
    ckpt_dummy_recipe_t r[4];
    int device = 0;
    size_t total = 0;
    int same = 1;
    for (int i = 0; i < n; i++) {
        int64_t shape[2] = {rows[i], cols};
        if (!(t[i] = s_expect(m, ck, names[i], 2, shape, &r[i], &device, err, errlen)) ||
            s_dtype_ok(m, t[i], err, errlen) < 0)
            return -1;
        same &= t[i]->dtype == t[0]->dtype;
        total += t[i]->nbytes;
    }
    *fused = (bk_mat_t){0};
    if (!same || !fuse) {
        for (int i = 0; i < n; i++)
            if (s_mat(m, ck, parts[i], rows[i], cols, err, errlen, "%s", names[i]) < 0)
                return -1;
        return 0;
    }
    uint8_t *dev = model_alloc(m, total, names[0], err, errlen);
    if (!dev)
        return -1;
    size_t off = 0;
    int64_t all_rows = 0;
    for (int i = 0; i < n; i++) {
        if (device)
            m->be->ops->fill_dummy(m->be, dev + off, r[i].dtype, t[i]->nbytes / dtype_size(r[i].dtype), r[i].key,
                                   r[i].center, r[i].scale);
        else if (m->be->ops->upload(m->be, dev + off, t[i]->data, t[i]->nbytes) < 0)
            return errf(err, errlen, "%s: cannot upload %s", m->where, names[i]);
        *parts[i] = (bk_mat_t){.data = dev + off, .dtype = t[i]->dtype, .rows = rows[i], .cols = cols};
        off += t[i]->nbytes;
        all_rows += rows[i];
    }
    *fused = (bk_mat_t){.data = dev, .dtype = t[0]->dtype, .rows = all_rows, .cols = cols};
    for (int i = 0; i < n && m->be->ops->weights_copied; i++)
        ckpt_drop(ck, t[i]);
    return 0;
}

/* A 1-D tensor [n] (norm weight, bias) converted to f32 on the device. */
static float *s_vec(model_t *m, ckpt_t *ck, int64_t n, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static float *s_vec(model_t *m, ckpt_t *ck, int64_t n, char *err, size_t errlen, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const tensor_view_t *t = ckpt_expect(ck, name, 1, &n, err, errlen);
    if (!t || s_dtype_ok(m, t, err, errlen) < 0)
        return NULL;
    float *dev = model_alloc(m, (size_t)n * sizeof(float), name, err, errlen);
    if (!dev)
        return NULL;
    float *host = malloc((size_t)n * sizeof(float));
    if (!host)
        return errf(err, errlen, "%s: out of memory", m->where), NULL;
    dtype_to_f32(t->dtype, t->data, host, (size_t)n);
    if (m->be->ops->weights_copied)
        ckpt_drop(ck, t);
    int rc = m->be->ops->upload(m->be, dev, host, (size_t)n * sizeof(float));
    free(host);
    if (rc < 0)
        return errf(err, errlen, "%s: cannot upload %s", m->where, name), NULL;
    return dev;
}

static size_t s_bytes(const bk_mat_t *w) { return bk_mat_bytes(w); }

/* The experts of one MoE layer: per-expert tensors, or transformers 5's fused pair. */
static int s_experts(model_t *m, ckpt_t *ck, int l, model_layer_t *L, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int E = c->num_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    const int mixtral = c->arch == ARCH_MIXTRAL;
    char fused[128];
    snprintf(fused, sizeof fused, "model.layers.%d.mlp.experts.gate_up_proj", l);
    L->experts = calloc((size_t)E, sizeof(bk_expert_t));
    if (!L->experts)
        return errf(err, errlen, "%s: out of memory", m->where);
    if (ckpt_has(ck, fused)) {
        if (m->cfg.quant.present || m->opts.quantize)
            return errf(err, errlen, "%s: %s: quantized weights need per-expert tensors (not the fused layout)",
                        m->where, fused);
        /* [E][2I][H] and [E][H][I]: views of 3-D tensors as [E*2I][H] and [E*H][I] matrices. */
        int64_t gu_shape[3] = {E, 2 * (int64_t)I, H}, d_shape[3] = {E, H, I};
        char down[128];
        snprintf(down, sizeof down, "model.layers.%d.mlp.experts.down_proj", l);
        const tensor_view_t *gu = ckpt_expect(ck, fused, 3, gu_shape, err, errlen);
        const tensor_view_t *dn = gu ? ckpt_expect(ck, down, 3, d_shape, err, errlen) : NULL;
        if (!gu || !dn || s_dtype_ok(m, gu, err, errlen) < 0 || s_dtype_ok(m, dn, err, errlen) < 0)
            return -1;
        const uint8_t *gud = m->be->ops->weight_put(m->be, gu->data, gu->nbytes, dtype_size(gu->dtype));
        const uint8_t *dnd = m->be->ops->weight_put(m->be, dn->data, dn->nbytes, dtype_size(dn->dtype));
        if (!gud || !dnd)
            return errf(err, errlen, "%s: cannot place the fused experts of layer %d", m->where, l);
        if (m->n_weights + 2 > m->cap_weights) {
            int cap = m->cap_weights ? 2 * m->cap_weights : 256;
            const void **w = realloc(m->weights, (size_t)cap * sizeof(*w));
            if (!w)
                return errf(err, errlen, "%s: out of memory", m->where);
            m->weights = w;
            m->cap_weights = cap;
        }
        m->weights[m->n_weights++] = gud;
        m->weights[m->n_weights++] = dnd;
        size_t ges = dtype_size(gu->dtype), des = dtype_size(dn->dtype);
        for (int e = 0; e < E; e++) {
            const uint8_t *base = gud + (size_t)e * 2 * I * H * ges;
            L->experts[e].gate = (bk_mat_t){.data = base, .dtype = gu->dtype, .rows = I, .cols = H};
            L->experts[e].up = (bk_mat_t){.data = base + (size_t)I * H * ges, .dtype = gu->dtype, .rows = I, .cols = H};
            L->experts[e].down = (bk_mat_t){.data = dnd + (size_t)e * H * I * des, .dtype = dn->dtype, .rows = H, .cols = I};
        }
        return 0;
    }
    char probe[128];
    snprintf(probe, sizeof probe, mixtral ? "model.layers.%d.block_sparse_moe.experts.0.w1.weight"
                                          : "model.layers.%d.mlp.experts.0.gate_proj.weight", l);
    const int qfmt = !model_quant_of(m, ck, probe) ? 0 : m->cfg.quant.present ? m->cfg.quant.fmt : m->opts.quantize;
    if (qfmt && !(m->be->ops->quant_moe_formats & (1u << qfmt)))
        return errf(err, errlen, "%s: the %s backend has no kernels for %s-quantized MoE experts (%s)", m->where,
                    m->be->ops->name, quant_format_name(qfmt), probe);
    for (int e = 0; e < E; e++) {
        if (m->opts.expert_keep && !m->opts.expert_keep(m->opts.expert_ctx, l, e))
            continue;   /* another rank of an expert-parallel group holds it */
        if (model_load_expert(m, ck, l, e, &L->experts[e], err, errlen) < 0)
            return -1;
    }
    return 0;
}

int model_load_expert(model_t *m, ckpt_t *ck, int l, int e, bk_expert_t *x, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int H = c->hidden_size, I = c->moe_intermediate_size;
    const int rc = c->arch == ARCH_MIXTRAL
        ? (s_mat(m, ck, &x->gate, I, H, err, errlen, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e) ||
           s_mat(m, ck, &x->up, I, H, err, errlen, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e) ||
           s_mat(m, ck, &x->down, H, I, err, errlen, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e))
        : (s_mat(m, ck, &x->gate, I, H, err, errlen, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e) ||
           s_mat(m, ck, &x->up, I, H, err, errlen, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e) ||
           s_mat(m, ck, &x->down, H, I, err, errlen, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e));
    return rc ? -1 : 0;
}

void model_release_mat(model_t *m, const bk_mat_t *w)
{
    const void *const ptrs[2] = {w->data, w->qscale};
    for (int p = 0; p < 2; p++) {
        if (!ptrs[p])
            continue;
        for (int i = 0; i < m->n_weights; i++)
            if (m->weights[i] == ptrs[p]) {
                m->be->ops->weight_release(m->be, m->weights[i]);
                m->weights[i] = m->weights[--m->n_weights];
                break;
            }
        for (int i = 0; i < m->n_allocs; i++)
            if (m->allocs[i] == ptrs[p]) {
                m->be->ops->free(m->be, m->allocs[i]);
                m->allocs[i] = m->allocs[--m->n_allocs];
                break;
            }
    }
}

/* The MoE router: transformers 5 in memory calls the Mixtral block "mlp"; files say block_sparse_moe. */
static int s_router(model_t *m, ckpt_t *ck, int l, model_layer_t *L, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    char name[128];
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
    if (c->arch == ARCH_MIXTRAL && !ckpt_has(ck, name))
        return s_mat(m, ck, &L->router, c->num_experts, c->hidden_size, err, errlen,
                     "model.layers.%d.block_sparse_moe.gate.weight", l);
    return s_mat(m, ck, &L->router, c->num_experts, c->hidden_size, err, errlen, "%s", name);
}

static int s_check_config(const model_config_t *c, const char *where, char *err, size_t errlen)
{
    if (c->vocab_size < 1 || c->hidden_size < 1 || c->num_layers < 1 || c->num_heads < 1 || c->num_kv_heads < 1 ||
        c->head_dim < 2)
        return errf(err, errlen, "%s: config has a zero dimension", where);
    if (c->head_dim > BK_MAX_HEAD_DIM || c->head_dim % 2)
        return errf(err, errlen, "%s: head_dim %d must be even and <= %d", where, c->head_dim, BK_MAX_HEAD_DIM);
    if (c->num_heads % c->num_kv_heads)
        return errf(err, errlen, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", where,
                    c->num_heads, c->num_kv_heads);
    if (!c->mla.on && c->num_heads / c->num_kv_heads > BK_MAX_GQA_GROUP)
        return errf(err, errlen, "%s: %d query heads per kv head (at most %d)", where, c->num_heads / c->num_kv_heads,
                    BK_MAX_GQA_GROUP);
    if (c->num_experts > 0 && (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts ||
                               c->moe_intermediate_size < 1))
        return errf(err, errlen, "%s: MoE with %d experts, %d per token, moe_intermediate_size %d", where,
                    c->num_experts, c->num_experts_per_tok, c->moe_intermediate_size);
    return 0;
}

/* The quantization asked for (the checkpoint's own, or model_opts_t.quantize at load) must be one
 * the backend has kernels for and the checkpoint can provide. */
static int s_check_quant(const model_config_t *cfg, ckpt_t *ck, const backend_t *be, const model_opts_t *opts,
                         const char *where, char *err, size_t errlen)
{
    const int qfmt = cfg->quant.present ? cfg->quant.fmt : opts ? opts->quantize : 0;
    if (opts && opts->quantize && (opts->quantize < 0 || opts->quantize >= BK_Q_COUNT))
        return errf(err, errlen, "%s: quantization %d is not a format", where, opts->quantize);
    if (opts && opts->quantize && cfg->quant.present)
        return errf(err, errlen, "%s: the checkpoint is already quantized (quantization_config); drop the online "
                    "quantization (%s)", where, quant_format_name(opts->quantize));
    if (qfmt && !(be->ops->quant_formats & (1u << qfmt)))
        return errf(err, errlen, "%s: the %s backend has no kernels for %s weights", where, be->ops->name,
                    quant_format_name(qfmt));
    if (cfg->quant.present && ckpt_is_dummy(ck))
        return errf(err, errlen, "%s: load_format dummy cannot make a quantized checkpoint's tensors "
                    "(quantization_config); quantize dummy weights at load instead (model.quantization)", where);
    return 0;
}

/* The options with every size not set (<= 0) at its default. */
static model_opts_t s_opts_with_defaults(const model_opts_t *opts, const model_config_t *cfg)
{
    model_opts_t o = opts ? *opts : (model_opts_t){0};
    if (o.max_tokens <= 0) o.max_tokens = 512;
    if (o.max_seqs <= 0) o.max_seqs = 64;
    if (o.max_logit_rows <= 0) o.max_logit_rows = o.max_seqs;
    if (o.max_context <= 0) o.max_context = cfg->max_position_embeddings > 0 ? cfg->max_position_embeddings : 4096;
    if (o.kv_block_size <= 0) o.kv_block_size = 16;
    return o;
}

/* An empty model: config, backend, options; nothing placed yet. */
static model_t *s_new(const char *where, const model_config_t *cfg, backend_t *be, const model_opts_t *opts,
                      char *err, size_t errlen)
{
    model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return errf(err, errlen, "%s: out of memory", where), NULL;
    m->cfg = *cfg;
    m->be = be;
    snprintf(m->where, sizeof m->where, "%s", where);
    m->opts = s_opts_with_defaults(opts, cfg);
    const char *prof = getenv("TROUPE_PROFILE");
    m->prof = prof && *prof && strcmp(prof, "0") != 0;
    return m;
}

/* Adds bytes to the model's weight counts: all of them, and those one token's step reads. */
static void s_count(model_t *m, size_t all, size_t active)
{
    m->weight_bytes += all;
    m->active_weight_bytes += active;
}

/* q, k, v (fused into one matrix where the backend wants it) and o. */
static int s_load_qkvo(model_t *m, ckpt_t *ck, int l, model_layer_t *Ly, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int H = c->hidden_size, D = c->head_dim, nH = c->num_heads, nKV = c->num_kv_heads;
    char qn[96], kn[96], vn[96];
    snprintf(qn, sizeof qn, "model.layers.%d.self_attn.q_proj.weight", l);
    snprintf(kn, sizeof kn, "model.layers.%d.self_attn.k_proj.weight", l);
    snprintf(vn, sizeof vn, "model.layers.%d.self_attn.v_proj.weight", l);
    const char *const qkv_names[3] = {qn, kn, vn};
    bk_mat_t *const qkv_parts[3] = {&Ly->q, &Ly->k, &Ly->v};
    const int64_t qkv_rows[3] = {(int64_t)nH * D, (int64_t)nKV * D, (int64_t)nKV * D};
    if (s_mats_fused(m, ck, &Ly->qkv, qkv_parts, qkv_rows, 3, H, qkv_names, err, errlen) < 0 ||
        s_mat(m, ck, &Ly->o, H, (int64_t)nH * D, err, errlen, "model.layers.%d.self_attn.o_proj.weight", l) < 0)
        return -1;
    const size_t attn = s_bytes(&Ly->q) + s_bytes(&Ly->k) + s_bytes(&Ly->v) + s_bytes(&Ly->o);
    s_count(m, attn, attn);
    return 0;
}

/* DeepSeek-V3's MLA (engine/mla_load.c), with a MoE layer's extra tensors; counts their bytes. */
static int s_load_mla(model_t *m, ckpt_t *ck, int l, model_layer_t *Ly, char *err, size_t errlen)
{
    char prefix[48];
    snprintf(prefix, sizeof prefix, "model.layers.%d", l);
    size_t attn = 0;
    if (mla_load_attention(m, ck, prefix, Ly, &attn, err, errlen) < 0 ||
        (config_layer_is_moe(&m->cfg, l) && mla_load_moe_extra(m, ck, prefix, Ly, &attn, err, errlen) < 0))
        return -1;
    s_count(m, attn, attn);
    return 0;
}

/* Layer l's attention with its optional biases and q/k norms (each loader counts its own bytes: MLA's
 * o_proj is in mla_load_attention's total, and was counted a second time here). */
static int s_load_attention(model_t *m, ckpt_t *ck, int l, model_layer_t *Ly, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int H = c->hidden_size, D = c->head_dim, nH = c->num_heads, nKV = c->num_kv_heads;
    const int rc = c->mla.on ? s_load_mla(m, ck, l, Ly, err, errlen) : s_load_qkvo(m, ck, l, Ly, err, errlen);
    if (rc < 0)
        return -1;
    if (c->attention_bias &&
        (!(Ly->q_bias = s_vec(m, ck, (int64_t)nH * D, err, errlen, "model.layers.%d.self_attn.q_proj.bias", l)) ||
         !(Ly->k_bias = s_vec(m, ck, (int64_t)nKV * D, err, errlen, "model.layers.%d.self_attn.k_proj.bias", l)) ||
         !(Ly->v_bias = s_vec(m, ck, (int64_t)nKV * D, err, errlen, "model.layers.%d.self_attn.v_proj.bias", l)) ||
         !(Ly->o_bias = s_vec(m, ck, H, err, errlen, "model.layers.%d.self_attn.o_proj.bias", l))))
        return -1;
    if (c->has_qk_norm &&
        (!(Ly->q_norm = s_vec(m, ck, D, err, errlen, "model.layers.%d.self_attn.q_norm.weight", l)) ||
         !(Ly->k_norm = s_vec(m, ck, D, err, errlen, "model.layers.%d.self_attn.k_norm.weight", l))))
        return -1;
    return 0;
}

/* Layer l's router and experts: all experts count in the weights, num_experts_per_tok of them per step. */
static int s_load_layer_moe(model_t *m, ckpt_t *ck, int l, model_layer_t *Ly, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int E = c->num_experts;
    if (model_load_moe(m, ck, l, Ly, err, errlen) < 0)
        return -1;
    const bk_expert_t *x0 = &Ly->experts[0];   /* the first loaded (a rank may hold a few) */
    for (int e = 1; !x0->gate.data && e < E; e++)
        x0 = &Ly->experts[e];
    size_t one = s_bytes(&x0->gate) + s_bytes(&x0->up) + s_bytes(&x0->down);
    s_count(m, s_bytes(&Ly->router) + one * (size_t)E, s_bytes(&Ly->router) + one * (size_t)c->num_experts_per_tok);
    m->max_i = c->moe_intermediate_size > m->max_i ? c->moe_intermediate_size : m->max_i;
    return 0;
}

/* Layer l's dense MLP of intermediate_size. */
static int s_load_layer_mlp(model_t *m, ckpt_t *ck, int l, model_layer_t *Ly, char *err, size_t errlen)
{
    char prefix[48];
    snprintf(prefix, sizeof prefix, "model.layers.%d.mlp", l);
    if (model_load_dense_mlp(m, ck, prefix, m->cfg.intermediate_size, Ly, err, errlen) < 0)
        return -1;
    size_t mlp = s_bytes(&Ly->gate) + s_bytes(&Ly->up) + s_bytes(&Ly->down);
    s_count(m, mlp, mlp);
    return 0;
}

/* Decoder layer l: its two norms, attention, then its MoE block or dense MLP. */
static int s_load_layer(model_t *m, ckpt_t *ck, int l, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int H = c->hidden_size;
    model_layer_t *Ly = &m->layers[l];
    if (!(Ly->attn_norm = s_vec(m, ck, H, err, errlen, "model.layers.%d.input_layernorm.weight", l)) ||
        !(Ly->mlp_norm = s_vec(m, ck, H, err, errlen, "model.layers.%d.post_attention_layernorm.weight", l)))
        return -1;
    if (s_load_attention(m, ck, l, Ly, err, errlen) < 0)
        return -1;
    Ly->is_moe = c->num_experts > 0 && config_layer_is_moe(c, l);
    return Ly->is_moe ? s_load_layer_moe(m, ck, l, Ly, err, errlen) : s_load_layer_mlp(m, ck, l, Ly, err, errlen);
}

/* The final norm and the LM head; the head's bytes count in every step. */
static int s_load_head(model_t *m, ckpt_t *ck, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    if (!(m->final_norm = s_vec(m, ck, c->hidden_size, err, errlen, "model.norm.weight")))
        return -1;
    /* Tied only when the config says so: an untied model without lm_head.weight is refused (HF
     * would run it with a randomly initialised head). */
    if (c->tie_word_embeddings)
        m->lm_head = m->embed;
    else if (s_mat(m, ck, &m->lm_head, c->vocab_size, c->hidden_size, err, errlen, "lm_head.weight") < 0)
        return -1;
    s_count(m, s_bytes(&m->lm_head), s_bytes(&m->lm_head));
    return 0;
}

/* Every weight, in the checkpoint's order: embeddings, layers, final norm and head, then the
 * router skew on top. `where` is model_load's name for the model (m->where may cut it short). */
static int s_load_weights(model_t *m, ckpt_t *ck, const char *where, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    m->layers = calloc((size_t)c->num_layers, sizeof(model_layer_t));
    if (!m->layers)
        return errf(err, errlen, "%s: out of memory", where);
    if (s_mat(m, ck, &m->embed, c->vocab_size, c->hidden_size, err, errlen, "model.embed_tokens.weight") < 0)
        return -1;
    m->max_i = 0;
    for (int l = 0; l < c->num_layers; l++)
        if (s_load_layer(m, ck, l, err, errlen) < 0)
            return -1;
    if (s_load_head(m, ck, err, errlen) < 0 || model_router_skew_apply(m, ck, err, errlen) < 0)
        return -1;
    return 0;
}

/* RoPE's inverse frequencies on the device and the attention scale (MLA: engine/mla_load.c). */
static int s_load_rope(model_t *m, char *err, size_t errlen)
{
    if (m->cfg.mla.on)
        return mla_load_rope(m, err, errlen);
    const int D = m->cfg.head_dim;
    float inv[BK_MAX_HEAD_DIM / 2];
    if (rope_inv_freq(&m->cfg, inv, err, errlen) < 0)
        return -1;
    if (!(m->inv_freq = model_alloc(m, (size_t)(D / 2) * sizeof(float), "rope", err, errlen)))
        return -1;
    if (m->be->ops->upload(m->be, m->inv_freq, inv, (size_t)(D / 2) * sizeof(float)) < 0)
        return errf(err, errlen, "%s: cannot upload the rope frequencies", m->where);   /* as mla_load_rope says */
    m->scale = (float)(1.0 / sqrt((double)D));
    return 0;
}

/* The step buffers, sized for the largest step the options allow. `where` as in s_load_weights. */
static int s_alloc_step_buffers(model_t *m, const char *where, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const model_opts_t *o = &m->opts;
    const int H = c->hidden_size, V = c->vocab_size, D = c->head_dim, nH = c->num_heads, nKV = c->num_kv_heads;
    const size_t T = (size_t)o->max_tokens, R = (size_t)o->max_logit_rows, S = (size_t)o->max_seqs;
    m->max_bt = (int)(S * (size_t)((o->max_context + o->kv_block_size - 1) / o->kv_block_size));
    size_t meta_n = 3 * T + R + 2 * S + 1 + (size_t)m->max_bt;   /* forward.c's layout (model_internal.h) */
    m->h_meta = malloc(meta_n * sizeof(int32_t));
    if (!m->h_meta)
        return errf(err, errlen, "%s: out of memory for step metadata", where);
    const size_t f = sizeof(float);
    if (!(m->d_meta = model_alloc(m, meta_n * sizeof(int32_t), "step metadata", err, errlen)) ||
        !(m->res = model_alloc(m, T * H * f, "activations", err, errlen)) ||
        !(m->xn = model_alloc(m, T * H * f, "activations", err, errlen)) ||
        !(m->delta = model_alloc(m, T * H * f, "activations", err, errlen)) ||
        !(m->qkv = model_alloc(m, T * (size_t)(nH + 2 * nKV) * D * f, "activations", err, errlen)) ||
        !(m->att = model_alloc(m, T * nH * D * f, "activations", err, errlen)) ||
        !(m->gu = model_alloc(m, T * 2 * (size_t)m->max_i * f, "activations", err, errlen)) ||
        !(m->rows = model_alloc(m, R * H * f, "activations", err, errlen)) ||
        !(m->logits = model_alloc(m, R * V * f, "logits", err, errlen)) ||
        !(m->argmax = model_alloc(m, R * sizeof(int32_t), "argmax", err, errlen)))
        return -1;
    return 0;
}

/* A MoE model's router and routing buffers and the expert loader's state; nothing for a dense one.
 * num_experts_per_tok is at least 1 here (s_check_config). */
static int s_alloc_moe_buffers(model_t *m, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    const int E = c->num_experts, K = c->num_experts_per_tok, H = c->hidden_size;
    if (E <= 0)
        return 0;
    const size_t T = (size_t)m->opts.max_tokens, f = sizeof(float);
    if (!(m->rlogits = model_alloc(m, T * E * f, "router logits", err, errlen)) ||
        !(m->moe_ids = model_alloc(m, T * K * sizeof(int32_t), "routing", err, errlen)) ||
        !(m->moe_w = model_alloc(m, T * K * f, "routing", err, errlen)) ||
        !(m->moe_scratch = model_alloc(m, moe_scratch_bytes((int)T, K, H, c->moe_intermediate_size, E), "MoE scratch",
                                       err, errlen)) ||
        model_expert_load_init(m, err, errlen) != 0)
        return -1;
    return 0;
}

model_t *model_load(const char *model_dir, const model_config_t *cfg, ckpt_t *ck, backend_t *be,
                    const model_opts_t *opts, char *err, size_t errlen)
{
    const char *where = model_dir ? model_dir : "model";
    if (!cfg || !ck || !be)
        return errf(err, errlen, "%s: model_load needs a config, a checkpoint and a backend", where), NULL;
    if (s_check_config(cfg, where, err, errlen) < 0 || s_check_quant(cfg, ck, be, opts, where, err, errlen) < 0)
        return NULL;
    model_t *m = s_new(where, cfg, be, opts, err, errlen);
    if (!m)
        return NULL;
    /* One cleanup path: model_destroy frees whatever the steps before a failure placed. */
    if (s_load_weights(m, ck, where, err, errlen) < 0 || s_load_rope(m, err, errlen) < 0 ||
        s_alloc_step_buffers(m, where, err, errlen) < 0 || s_alloc_moe_buffers(m, err, errlen) < 0 ||
        (m->cfg.mla.on && mla_load_buffers(m, ck, err, errlen) < 0)) {
        model_destroy(&m);
        return NULL;
    }
    LOG_D("%s: %s loaded on %s: %.1f MB of weights per step", where, config_arch_name(m->cfg.arch), be->ops->name,
          (double)m->weight_bytes / 1e6);
    return m;
}

void model_destroy(model_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    model_t *m = *self_p;
    model_graphs_drop(m);
    free(m->graphs);
    free(m->graph_runs);
    for (int i = 0; i < m->n_weights; i++)
        m->be->ops->weight_release(m->be, m->weights[i]);
    for (int i = 0; i < m->n_allocs; i++)
        m->be->ops->free(m->be, m->allocs[i]);
    if (m->layers)
        for (int l = 0; l < m->cfg.num_layers; l++)
            free(m->layers[l].experts);
    mla_free(m);
    free(m->layers);
    free(m->weights);
    free(m->allocs);
    free(m->h_meta);
    free(m->skew_share);
    free(m->skew_bias);
    free(m);
    *self_p = NULL;
}

const model_config_t *model_config(const model_t *m) { return &m->cfg; }
backend_t *model_backend(const model_t *m) { return m->be; }
size_t model_weight_bytes(const model_t *m) { return m->weight_bytes; }
size_t model_active_weight_bytes(const model_t *m) { return m->active_weight_bytes; }

/* Loaders shared with engine/mla_load.c (model_internal.h). */
int model_mat(model_t *m, ckpt_t *ck, bk_mat_t *out, int64_t rows, int64_t cols, const char *name, char *err,
              size_t errlen)
{
    return s_mat(m, ck, out, rows, cols, err, errlen, "%s", name);
}

float *model_vec(model_t *m, ckpt_t *ck, int64_t n, const char *name, char *err, size_t errlen)
{
    return s_vec(m, ck, n, err, errlen, "%s", name);
}

int model_load_moe(model_t *m, ckpt_t *ck, int l, model_layer_t *L, char *err, size_t errlen)
{
    return s_router(m, ck, l, L, err, errlen) < 0 || s_experts(m, ck, l, L, err, errlen) < 0 ? -1 : 0;
}

int model_load_dense_mlp(model_t *m, ckpt_t *ck, const char *prefix, int I, model_layer_t *L, char *err,
                         size_t errlen)
{
    char gn[160], un[160];
    snprintf(gn, sizeof gn, "%s.gate_proj.weight", prefix);
    snprintf(un, sizeof un, "%s.up_proj.weight", prefix);
    const char *const names[2] = {gn, un};
    bk_mat_t *const parts[2] = {&L->gate, &L->up};
    const int64_t rows[2] = {I, I};
    if (s_mats_fused(m, ck, &L->gate_up, parts, rows, 2, m->cfg.hidden_size, names, err, errlen) < 0)
        return -1;
    if (s_mat(m, ck, &L->down, m->cfg.hidden_size, I, err, errlen, "%s.down_proj.weight", prefix) < 0)
        return -1;
    m->max_i = I > m->max_i ? I : m->max_i;
    return 0;
}
