/* engine/model_quant.c — quantized 2-D weights at load: a checkpoint's formats (engine/quant.h) or
 * online quantization of a plain checkpoint (model_opts_t.quantize).
 *
 * Which weights: every Linear of the decoder layers (and an untied lm_head) that the config's
 * `ignore` list does not name; for DeepSeek's fp8, those that have a weight_scale_inv (its
 * checkpoints leave the routers in bf16 without listing them). The embedding is never quantized.
 * Online quantization leaves lm_head and the MoE routers plain, as vLLM's --quantization does.
 *
 * Every scale becomes f32 on the device (NVFP4: E4M3 block scale / global scale), checked finite
 * and non-negative: a checkpoint with a NaN or negative scale is refused, naming the tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/model_internal.h"
#include "engine/quant.h"
#include "engine/safetensors.h"

/* name minus ".weight" into module; 0 when name does not end so. */
static int s_module(const char *name, char *module, size_t len)
{
    size_t n = strlen(name);
    if (n < 8 || strcmp(name + n - 7, ".weight") != 0 || n - 7 >= len)
        return 0;
    memcpy(module, name, n - 7);
    module[n - 7] = 0;
    return 1;
}

static int s_ends(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int model_quant_of(const model_t *m, const ckpt_t *ck, const char *name)
{
    char module[256];
    if (!s_module(name, module, sizeof module) || strcmp(module, "model.embed_tokens") == 0)
        return 0;
    const quant_config_t *qc = &m->cfg.quant;
    if (qc->present) {
        if (quant_ignored(qc, module))
            return 0;
        if (qc->method == QUANT_DEEPSEEK_FP8) {
            char sn[300];
            snprintf(sn, sizeof sn, "%s.weight_scale_inv", module);
            return ckpt_has(ck, sn);
        }
        return 1;
    }
    if (!m->opts.quantize)
        return 0;
    return !(strcmp(module, "lm_head") == 0 || s_ends(module, ".mlp.gate") || s_ends(module, ".block_sparse_moe.gate"));
}

/* Places codes (host, any alignment) and f32 scales; fills *out. own_codes: the host codes are a
 * temporary buffer (online quantization), so they are copied, never used in place. */
static int s_place(model_t *m, bk_mat_t *out, const char *name, const void *codes, size_t code_bytes, int own_codes,
                   dtype_t code_dt, const float *scales, size_t n_scales, int fmt, int act, int gr, int gc,
                   int64_t rows, int64_t cols, char *err, size_t errlen)
{
    const void *dev;
    if (own_codes) {
        void *d = model_alloc(m, code_bytes, name, err, errlen);
        if (!d || m->be->ops->upload(m->be, d, codes, code_bytes) < 0)
            return d ? errf(err, errlen, "%s: cannot upload %s", m->where, name) : -1;
        dev = d;
    } else {
        if (!(dev = m->be->ops->weight_put(m->be, codes, code_bytes, 1)))
            return errf(err, errlen, "%s: cannot place tensor %s (%zu bytes) on the %s backend", m->where, name,
                        code_bytes, m->be->ops->name);
        if (model_keep_weight(m, dev, err, errlen) < 0)
            return -1;
    }
    float *ds = model_alloc(m, n_scales * sizeof(float), name, err, errlen);
    if (!ds || m->be->ops->upload(m->be, ds, scales, n_scales * sizeof(float)) < 0)
        return ds ? errf(err, errlen, "%s: cannot upload the scales of %s", m->where, name) : -1;
    *out = (bk_mat_t){.data = dev, .dtype = code_dt, .rows = rows, .cols = cols, .qfmt = (int8_t)fmt,
                      .qact = (int8_t)act, .qgr = gr, .qgc = gc, .qscale = ds};
    return 0;
}

/* The format's default blocks and activations for online quantization. */
static void s_online_scheme(int fmt, int *gr, int *gc, int *act)
{
    *gr = 1;
    *gc = fmt == BK_Q_I4 ? 128 : fmt == BK_Q_FP4 ? 16 : 0;
    *act = fmt == BK_Q_FP8 ? BK_QA_FP8_TOKEN : fmt == BK_Q_I8 ? BK_QA_I8_TOKEN : BK_QA_NONE;
}

/* Dummy weights made on the device (the backend's fill_dummy) in a quantized format: the codes are
 * the dummy generator's bytes taken as codes (an fp8 code may be NaN) and the scales positive
 * dummy values, so a speed measurement reads exactly the bytes a real checkpoint of the format
 * would, without the host making and quantizing them. The values mean nothing: speed only. */
static int s_device_dummy(model_t *m, ckpt_t *ck, bk_mat_t *out, const char *name, int64_t rows, int64_t cols,
                          char *err, size_t errlen)
{
    const int fmt = m->opts.quantize;
    int64_t shape[2] = {rows, cols};
    ckpt_dummy_recipe_t r;
    if (!ckpt_expect_recipe(ck, name, 2, shape, &r, err, errlen))
        return -1;
    int want_gr, want_gc, act, gr, gc;
    s_online_scheme(fmt, &want_gr, &want_gc, &act);
    const size_t ns = quant_grid(rows, cols, want_gr, want_gc, &gr, &gc);
    const size_t cb = quant_code_bytes(fmt, rows, cols);
    uint8_t *codes = model_alloc(m, cb + 2, name, err, errlen);
    float *sc = codes ? model_alloc(m, ns * sizeof(float), name, err, errlen) : NULL;
    if (!sc)
        return -1;
    /* fp8 codes are made as fp8 values: bf16 bytes would hold e4m3's NaN codes (0x7f, 0xff) in about
     * 1 of 128, turning every hidden state NaN, so MoE rows would all route alike. Any byte is a
     * valid int8, int4 pair or fp4 pair. */
    if (fmt == BK_Q_FP8)
        m->be->ops->fill_dummy(m->be, codes, DT_F8E4M3, cb, r.key, 0.0f, 1.0f);
    else
        m->be->ops->fill_dummy(m->be, codes, DT_BF16, (cb + 1) / 2, r.key, 0.0f, 1.0f);
    m->be->ops->fill_dummy(m->be, sc, DT_F32, ns, r.key ^ 0x5ca1eull, 0.01f, 0.005f);
    const dtype_t cdt = fmt == BK_Q_FP8 ? DT_F8E4M3 : fmt == BK_Q_I8 ? DT_I8 : DT_U8;
    *out = (bk_mat_t){.data = codes, .dtype = cdt, .rows = rows, .cols = cols, .qfmt = (int8_t)fmt,
                      .qact = (int8_t)act, .qgr = gr, .qgc = gc, .qscale = sc};
    return 0;
}

/* Online: the plain tensor quantized with the format's default blocks. */
static int s_online(model_t *m, ckpt_t *ck, bk_mat_t *out, const char *name, int64_t rows, int64_t cols, char *err,
                    size_t errlen)
{
    const int fmt = m->opts.quantize;
    int64_t shape[2] = {rows, cols};
    if (m->be->ops->fill_dummy && ckpt_is_dummy(ck) && !m->opts.dummy_on_host)
        return s_device_dummy(m, ck, out, name, rows, cols, err, errlen);
    const tensor_view_t *t = ckpt_expect(ck, name, 2, shape, err, errlen);
    if (!t)
        return -1;
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
        return errf(err, errlen, "%s: tensor %s has dtype %s (online quantization needs f32, bf16 or f16)", m->where,
                    name, dtype_name(t->dtype));
    if ((fmt == BK_Q_I4 || fmt == BK_Q_FP4) && cols % 16)
        return errf(err, errlen, "%s: tensor %s: %lld columns (4-bit formats need a multiple of 16)", m->where, name,
                    (long long)cols);
    int want_gr, want_gc, act, gr, gc;
    s_online_scheme(fmt, &want_gr, &want_gc, &act);
    const size_t ns = quant_grid(rows, cols, want_gr, want_gc, &gr, &gc), n = (size_t)rows * (size_t)cols;
    const size_t cb = quant_code_bytes(fmt, rows, cols);
    float *f = malloc(n * sizeof(float)), *sc = malloc(ns * sizeof(float));
    uint8_t *codes = malloc(cb);
    int rc = -1;
    if (!f || !sc || !codes) {
        errf(err, errlen, "%s: out of memory quantizing %s", m->where, name);
        goto out;
    }
    dtype_to_f32(t->dtype, t->data, f, n);
    ckpt_drop(ck, t);                              /* our f32 copy is all we read from here on */
    for (size_t i = 0; i < n; i++)
        if (!isfinite(f[i])) {
            errf(err, errlen, "%s: tensor %s has a non-finite value at %zu; cannot quantize it", m->where, name, i);
            goto out;
        }
    if (quant_encode(fmt, f, rows, cols, gr, gc, codes, sc, NULL, NULL) < 0) {
        errf(err, errlen, "%s: tensor %s [%lld, %lld] cannot be quantized to %s", m->where, name, (long long)rows,
             (long long)cols, quant_format_name(fmt));
        goto out;
    }
    const dtype_t cdt = fmt == BK_Q_FP8 ? DT_F8E4M3 : fmt == BK_Q_I8 ? DT_I8 : DT_U8;
    rc = s_place(m, out, name, codes, cb, 1, cdt, sc, ns, fmt, act, gr, gc, rows, cols, err, errlen);
out:
    free(f);
    free(sc);
    free(codes);
    return rc;
}

/* A scale tensor's values as f32 [ns]: shape [ngr][ngc], or any shape of ns elements when one of
 * the grid's dimensions is 1 ([1], [] for per tensor; [N] or [N][1] for per channel). */
static float *s_scales(model_t *m, ckpt_t *ck, const char *sn, size_t ns, int64_t ngr, int64_t ngc, int fp8,
                       char *err, size_t errlen)
{
    const tensor_view_t *st = ckpt_get(ck, sn);
    if (!st)
        return errf(err, errlen, "%s: tensor %s missing (the quantization_config needs it)", m->where, sn), NULL;
    size_t numel = 1;
    for (int i = 0; i < st->ndim; i++)
        numel *= (size_t)st->shape[i];
    const int exact = st->ndim == 2 && st->shape[0] == ngr && st->shape[1] == ngc;
    if (numel != ns || (!exact && ngr != 1 && ngc != 1)) {
        char sb[96];
        return errf(err, errlen, "%s: tensor %s has shape %s (expected [%lld, %lld]) in %s", m->where, sn,
                    st_shape_str(st->shape, st->ndim, sb, sizeof sb), (long long)ngr, (long long)ngc,
                    ckpt_file_of(ck, sn)), NULL;
    }
    if (fp8 ? st->dtype != DT_F8E4M3 : (st->dtype != DT_F32 && st->dtype != DT_BF16 && st->dtype != DT_F16))
        return errf(err, errlen, "%s: tensor %s has dtype %s (expected %s)", m->where, sn, dtype_name(st->dtype),
                    fp8 ? "F8_E4M3" : "f32, bf16 or f16"), NULL;
    float *h = malloc(ns * sizeof(float));
    if (!h)
        return errf(err, errlen, "%s: out of memory", m->where), NULL;
    dtype_to_f32(st->dtype, st->data, h, ns);
    for (size_t i = 0; i < ns; i++)
        if (!isfinite(h[i]) || h[i] < 0.0f) {
            errf(err, errlen, "%s: tensor %s has a scale %g at %zu (scales are finite and >= 0)", m->where, sn,
                 (double)h[i], i);
            free(h);
            return NULL;
        }
    return h;
}

int model_qmat(model_t *m, ckpt_t *ck, bk_mat_t *out, const char *name, int64_t rows, int64_t cols, char *err,
               size_t errlen)
{
    if (!m->cfg.quant.present)
        return s_online(m, ck, out, name, rows, cols, err, errlen);
    const quant_config_t *qc = &m->cfg.quant;
    const int fmt = qc->fmt;
    char module[256], cn[300], sn[300];
    s_module(name, module, sizeof module);
    int gr, gc;
    const size_t ns = quant_grid(rows, cols, qc->gr, qc->gc, &gr, &gc);
    const int64_t ngr = (rows + gr - 1) / gr, ngc = (cols + gc - 1) / gc;
    const tensor_view_t *codes;
    dtype_t want;
    if (fmt == BK_Q_FP8 || fmt == BK_Q_I8) {
        int64_t shape[2] = {rows, cols};
        snprintf(cn, sizeof cn, "%s.weight", module);
        codes = ckpt_expect(ck, cn, 2, shape, err, errlen);
        want = fmt == BK_Q_FP8 ? DT_F8E4M3 : DT_I8;
    } else {
        const int per = fmt == BK_Q_I4 ? 8 : 2;
        if (cols % per)
            return errf(err, errlen, "%s: %s: %lld columns do not pack %d to a word", m->where, module, (long long)cols,
                        per);
        int64_t shape[2] = {rows, cols / per};
        snprintf(cn, sizeof cn, "%s.weight_packed", module);
        codes = ckpt_expect(ck, cn, 2, shape, err, errlen);
        want = fmt == BK_Q_I4 ? DT_I32 : DT_U8;
    }
    if (!codes)
        return -1;
    if (codes->dtype != want)
        return errf(err, errlen, "%s: tensor %s has dtype %s (the quantization_config's %s format stores %s)", m->where,
                    cn, dtype_name(codes->dtype), quant_format_name(fmt), dtype_name(want));
    if (fmt == BK_Q_I4) {                          /* weight_shape, when present, must say [rows, cols] */
        char wn[300];
        snprintf(wn, sizeof wn, "%s.weight_shape", module);
        const tensor_view_t *ws = ckpt_get(ck, wn);
        if (ws) {
            int64_t v[2] = {0, 0};
            if (ws->ndim == 1 && ws->shape[0] == 2 && (ws->dtype == DT_I64 || ws->dtype == DT_I32)) {
                for (int i = 0; i < 2; i++) {
                    if (ws->dtype == DT_I64)
                        memcpy(&v[i], (const uint8_t *)ws->data + 8 * i, 8);
                    else {
                        int32_t x;
                        memcpy(&x, (const uint8_t *)ws->data + 4 * i, 4);
                        v[i] = x;
                    }
                }
            }
            if (v[0] != rows || v[1] != cols)
                return errf(err, errlen, "%s: tensor %s does not say [%lld, %lld]", m->where, wn, (long long)rows,
                            (long long)cols);
        }
    }
    char zn[300];
    snprintf(zn, sizeof zn, "%s.weight_zero_point", module);
    if (ckpt_has(ck, zn))
        return errf(err, errlen, "%s: tensor %s: zero points (asymmetric weights) are not supported", m->where, zn);
    snprintf(sn, sizeof sn, "%s.%s", module, qc->method == QUANT_DEEPSEEK_FP8 ? "weight_scale_inv" : "weight_scale");
    float *sc = s_scales(m, ck, sn, ns, ngr, ngc, fmt == BK_Q_FP4, err, errlen);
    if (!sc)
        return -1;
    if (fmt == BK_Q_FP4) {                         /* effective scale = E4M3 block scale / global */
        char gn[300];
        snprintf(gn, sizeof gn, "%s.weight_global_scale", module);
        float *g = s_scales(m, ck, gn, 1, 1, 1, 0, err, errlen);
        if (!g || !(g[0] > 0.0f)) {
            if (g)
                errf(err, errlen, "%s: tensor %s is %g (must be > 0)", m->where, gn, (double)g[0]);
            free(g);
            free(sc);
            return -1;
        }
        for (size_t i = 0; i < ns; i++)
            sc[i] /= g[0];
        free(g);
    }
    const dtype_t cdt = fmt == BK_Q_FP8 ? DT_F8E4M3 : fmt == BK_Q_I8 ? DT_I8 : DT_U8;
    int rc = s_place(m, out, cn, codes->data, codes->nbytes, 0, cdt, sc, ns, fmt, qc->act, gr, gc, rows, cols, err,
                     errlen);
    free(sc);
    if (rc == 0 && m->be->ops->weights_copied)
        ckpt_drop(ck, codes);
    return rc;
}
