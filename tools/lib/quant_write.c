/* tools/lib/quant_write.c — quantized (or dequantized) checkpoints from a plain one (quant_write.h).
 *
 * Two passes over the source's tensors: the first plans every output tensor (name, dtype, shape,
 * bytes) so the safetensors header can be written first; the second encodes each weight and
 * appends its tensors in the planned order. Only one weight's f32 copy is in memory at a time. */
#include "tools/lib/quant_write.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dtype.h"
#include "common/util.h"
#include "engine/checkpoint.h"
#include "engine/quant.h"

typedef struct {
    char name[300];
    const char *dtype;            /* safetensors spelling */
    int ndim;
    int64_t shape[2];
    size_t bytes;
} out_tensor_t;

typedef struct {
    out_tensor_t *t;
    int n, cap;
} plan_t;

static int s_push(plan_t *p, const char *name, const char *suffix, const char *dtype, int ndim, int64_t d0, int64_t d1,
                  size_t bytes)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        out_tensor_t *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t)
            return -1;
        p->t = t;
        p->cap = cap;
    }
    out_tensor_t *o = &p->t[p->n++];
    snprintf(o->name, sizeof o->name, "%s%s", name, suffix);
    o->dtype = dtype;
    o->ndim = ndim;
    o->shape[0] = d0;
    o->shape[1] = d1;
    o->bytes = bytes;
    return 0;
}

static const char *s_st_dtype(dtype_t t)
{
    switch (t) {
    case DT_F32: return "F32";
    case DT_BF16: return "BF16";
    case DT_F16: return "F16";
    case DT_F8E4M3: return "F8_E4M3";
    case DT_I8: return "I8";
    case DT_U8: return "U8";
    case DT_I32: return "I32";
    case DT_I64: return "I64";
    default: return NULL;
    }
}

static int s_ends(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The weights that get quantized: 2-D Linear weights of the decoder layers, not the routers, nor a
 * DeepSeek MTP layer's embedding copy and eh_proj (loaded plain: engine/mla_load.c). */
static int s_quantized(const tensor_view_t *t)
{
    return t->ndim == 2 && strncmp(t->name, "model.layers.", 13) == 0 && s_ends(t->name, ".weight") &&
           !s_ends(t->name, ".mlp.gate.weight") && !s_ends(t->name, ".block_sparse_moe.gate.weight") &&
           !s_ends(t->name, ".embed_tokens.weight") && !s_ends(t->name, ".eh_proj.weight") &&
           (t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16);
}

/* The scale grid this writer uses for fmt (engine/quant.h's quant_grid blocks; 0 = whole). */
static void s_blocks(const quant_write_opts_t *o, int *gr, int *gc)
{
    switch (o->fmt) {
    case BK_Q_FP8: *gr = o->block ? 128 : o->per_tensor ? 0 : 1; *gc = o->block ? 128 : 0; break;
    case BK_Q_I8: *gr = 1; *gc = 0; break;
    case BK_Q_I4: *gr = 1; *gc = 128; break;
    default: *gr = 1; *gc = 16; break;
    }
}

static int s_plan(const ckpt_t *ck, const quant_write_opts_t *o, plan_t *p, char *err, size_t errlen)
{
    for (int i = 0; i < ckpt_count(ck); i++) {
        const tensor_view_t *t = ckpt_at(ck, i);
        const int64_t N = t->ndim == 2 ? t->shape[0] : 0, K = t->ndim == 2 ? t->shape[1] : 0;
        char module[300];
        snprintf(module, sizeof module, "%.*s", (int)strlen(t->name) - 7, t->name);
        int rc = 0;
        if (!s_quantized(t)) {
            const char *dt = s_st_dtype(t->dtype);
            if (!dt || t->ndim > 2)
                return errf(err, errlen, "%s: tensor %s (dtype %s, %d dimensions) cannot be copied", ckpt_file_of(ck, t->name),
                            t->name, dtype_name(t->dtype), t->ndim);
            rc = s_push(p, t->name, "", dt, t->ndim, t->ndim > 0 ? t->shape[0] : 0, t->ndim > 1 ? t->shape[1] : 0,
                        t->nbytes);
        } else if (o->dequantize) {
            rc = s_push(p, t->name, "", "F32", 2, N, K, (size_t)N * (size_t)K * 4);
        } else {
            if ((o->fmt == BK_Q_I4 && K % 8) || (o->fmt == BK_Q_FP4 && K % 16))
                return errf(err, errlen, "tensor %s: %lld columns (the %s format packs %d)", t->name, (long long)K,
                            quant_format_name(o->fmt), o->fmt == BK_Q_I4 ? 8 : 16);
            int gr, gc, er, ec;
            s_blocks(o, &gr, &gc);
            quant_grid(N, K, gr, gc, &er, &ec);
            const int64_t ngr = (N + er - 1) / er, ngc = (K + ec - 1) / ec;
            switch (o->fmt) {
            case BK_Q_FP8:
            case BK_Q_I8:
                rc = s_push(p, module, ".weight", o->fmt == BK_Q_FP8 ? "F8_E4M3" : "I8", 2, N, K, (size_t)(N * K));
                if (o->block)
                    rc |= s_push(p, module, ".weight_scale_inv", "F32", 2, ngr, ngc, (size_t)(ngr * ngc) * 4);
                else if (ngr == 1)
                    rc |= s_push(p, module, ".weight_scale", "F32", 1, 1, 0, 4);
                else
                    rc |= s_push(p, module, ".weight_scale", "F32", 2, N, 1, (size_t)N * 4);
                break;
            case BK_Q_I4:
                rc = s_push(p, module, ".weight_packed", "I32", 2, N, K / 8, (size_t)(N * K / 2));
                rc |= s_push(p, module, ".weight_scale", "F32", 2, N, ngc, (size_t)(N * ngc) * 4);
                rc |= s_push(p, module, ".weight_shape", "I64", 1, 2, 0, 16);
                break;
            default:
                rc = s_push(p, module, ".weight_packed", "U8", 2, N, K / 2, (size_t)(N * K / 2));
                rc |= s_push(p, module, ".weight_scale", "F8_E4M3", 2, N, K / 16, (size_t)(N * K / 16));
                rc |= s_push(p, module, ".weight_global_scale", "F32", 1, 1, 0, 4);
                break;
            }
        }
        if (rc)
            return errf(err, errlen, "out of memory");
    }
    return 0;
}

static int s_write_header(FILE *f, const plan_t *p, char *err, size_t errlen)
{
    json_t *h = json_object();
    size_t off = 0;
    for (int i = 0; i < p->n; i++) {
        const out_tensor_t *t = &p->t[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(h, t->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", t->dtype, "shape", shape,
                                                  "data_offsets", (json_int_t)off, (json_int_t)(off + t->bytes)));
        off += t->bytes;
    }
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *text = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (!text)
        return errf(err, errlen, "out of memory");
    size_t n = strlen(text), padded = (n + 7) & ~(size_t)7;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(text, 1, n, f) == n;
    for (size_t i = n; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    free(text);
    return ok ? 0 : errf(err, errlen, "write failed: %s", strerror(errno));
}

/* Encodes one weight and writes its tensors in s_plan's order. */
static int s_write_weight(FILE *f, const tensor_view_t *t, const quant_write_opts_t *o, char *err, size_t errlen)
{
    const int64_t N = t->shape[0], K = t->shape[1];
    const size_t n = (size_t)N * (size_t)K;
    int gr, gc, er, ec;
    s_blocks(o, &gr, &gc);
    const size_t ns = quant_grid(N, K, gr, gc, &er, &ec);
    float *w = malloc(n * 4), *sc = malloc(ns * 4);
    uint8_t *codes = malloc(quant_code_bytes(o->fmt, N, K)), *s8 = malloc(ns);
    float global = 1.0f;
    int rc = -1;
    if (!w || !sc || !codes || !s8) {
        errf(err, errlen, "out of memory");
        goto out;
    }
    dtype_to_f32(t->dtype, t->data, w, n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(w[i])) {
            errf(err, errlen, "tensor %s has a non-finite value at %zu", t->name, i);
            goto out;
        }
    if (quant_encode(o->fmt, w, N, K, er, ec, codes, sc, s8, &global) < 0) {
        errf(err, errlen, "tensor %s cannot be quantized to %s", t->name, quant_format_name(o->fmt));
        goto out;
    }
    int ok;
    if (o->dequantize) {
        quant_decode(o->fmt, codes, sc, N, K, er, ec, w);
        ok = fwrite(w, 4, n, f) == n;              /* little-endian hosts only (x86, arm64) */
    } else {
        ok = fwrite(codes, 1, quant_code_bytes(o->fmt, N, K), f) == quant_code_bytes(o->fmt, N, K);
        if (o->fmt == BK_Q_FP4) {
            ok = ok && fwrite(s8, 1, ns, f) == ns && fwrite(&global, 4, 1, f) == 1;
        } else {
            ok = ok && fwrite(sc, 4, ns, f) == ns;
            if (o->fmt == BK_Q_I4) {
                int64_t shape[2] = {N, K};
                ok = ok && fwrite(shape, 8, 2, f) == 2;
            }
        }
    }
    rc = ok ? 0 : errf(err, errlen, "write failed: %s", strerror(errno));
out:
    free(w), free(sc), free(codes), free(s8);
    return rc;
}

static json_t *s_quant_config(const quant_write_opts_t *o)
{
    if (o->fmt == BK_Q_FP8 && o->block)
        return json_pack("{s:s, s:s, s:s, s:[i, i]}", "quant_method", "fp8", "fmt", "e4m3", "activation_scheme",
                         "dynamic", "weight_block_size", 128, 128);
    const char *format = o->fmt == BK_Q_FP8 ? "float-quantized" : o->fmt == BK_Q_I8 ? "int-quantized"
                         : o->fmt == BK_Q_I4 ? "pack-quantized" : "nvfp4-pack-quantized";
    const int bits = o->fmt == BK_Q_FP8 || o->fmt == BK_Q_I8 ? 8 : 4;
    const char *type = o->fmt == BK_Q_I8 || o->fmt == BK_Q_I4 ? "int" : "float";
    json_t *w = json_pack("{s:i, s:s, s:b, s:b}", "num_bits", bits, "type", type, "symmetric", 1, "dynamic", 0);
    switch (o->fmt) {
    case BK_Q_FP8: json_object_set_new(w, "strategy", json_string(o->per_tensor ? "tensor" : "channel")); break;
    case BK_Q_I8: json_object_set_new(w, "strategy", json_string("channel")); break;
    case BK_Q_I4:
        json_object_set_new(w, "strategy", json_string("group"));
        json_object_set_new(w, "group_size", json_integer(128));
        break;
    default:
        json_object_set_new(w, "strategy", json_string("tensor_group"));
        json_object_set_new(w, "group_size", json_integer(16));
        break;
    }
    json_t *a = json_null();
    if (!o->weight_only && (o->fmt == BK_Q_FP8 || o->fmt == BK_Q_I8)) {
        json_decref(a);
        a = json_pack("{s:i, s:s, s:b, s:s, s:b}", "num_bits", 8, "type", type, "symmetric", 1, "strategy", "token",
                      "dynamic", 1);
    }
    json_t *g = json_pack("{s:[s], s:o, s:o}", "targets", "Linear", "weights", w, "input_activations", a);
    return json_pack("{s:s, s:s, s:s, s:[s, s, s], s:{s:o}}", "quant_method", "compressed-tensors", "format", format,
                     "quantization_status", "compressed", "ignore", "lm_head", "re:.*mlp\\.gate$",
                     "re:.*block_sparse_moe\\.gate$", "config_groups", "group_0", g);
}

static int s_copy_file(const char *src_dir, const char *dst_dir, const char *name, char *err, size_t errlen)
{
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s/%s", src_dir, name);
    snprintf(b, sizeof b, "%s/%s", dst_dir, name);
    FILE *in = fopen(a, "rb");
    if (!in)
        return 0;                                  /* optional files */
    FILE *out = fopen(b, "wb");
    if (!out) {
        fclose(in);
        return errf(err, errlen, "%s: %s", b, strerror(errno));
    }
    char buf[65536];
    size_t k;
    int ok = 1;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0)
        ok &= fwrite(buf, 1, k, out) == k;
    fclose(in);
    ok &= fclose(out) == 0;
    return ok ? 0 : errf(err, errlen, "%s: write failed", b);
}

int quant_write(const char *src_dir, const char *dst_dir, const quant_write_opts_t *o, char *err, size_t errlen)
{
    if (o->fmt <= BK_Q_NONE || o->fmt >= BK_Q_COUNT || ((o->block || o->per_tensor) && o->fmt != BK_Q_FP8))
        return errf(err, errlen, "quant_write: bad format options");
    if (mkdir(dst_dir, 0755) != 0 && errno != EEXIST)
        return errf(err, errlen, "%s: %s", dst_dir, strerror(errno));
    ckpt_t *ck = ckpt_open(src_dir, err, errlen);
    if (!ck)
        return -1;
    plan_t p = {0};
    int rc = -1;
    FILE *f = NULL;
    char path[1024];
    if (s_plan(ck, o, &p, err, errlen) < 0)
        goto out;
    snprintf(path, sizeof path, "%s/model.safetensors", dst_dir);
    if (!(f = fopen(path, "wb"))) {
        errf(err, errlen, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (s_write_header(f, &p, err, errlen) < 0)
        goto out;
    for (int i = 0; i < ckpt_count(ck); i++) {
        const tensor_view_t *t = ckpt_at(ck, i);
        if (s_quantized(t)) {
            if (s_write_weight(f, t, o, err, errlen) < 0)
                goto out;
        } else if (fwrite(t->data, 1, t->nbytes, f) != t->nbytes) {
            errf(err, errlen, "%s: write failed", path);
            goto out;
        }
    }
    if (fclose(f) != 0) {
        f = NULL;
        errf(err, errlen, "%s: write failed", path);
        goto out;
    }
    f = NULL;
    /* config.json: the source's, quantization_config set (or dropped for the dequantized copy). */
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        errf(err, errlen, "%s: line %d: %s", path, je.line, je.text);
        goto out;
    }
    if (o->dequantize)
        json_object_del(cfg, "quantization_config");
    else
        json_object_set_new(cfg, "quantization_config", s_quant_config(o));
    snprintf(path, sizeof path, "%s/config.json", dst_dir);
    int dumped = json_dump_file(cfg, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(cfg);
    if (dumped != 0) {
        errf(err, errlen, "%s: write failed", path);
        goto out;
    }
    static const char *const extra[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                        "chat_template.jinja", "expected.json"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (s_copy_file(src_dir, dst_dir, extra[i], err, errlen) < 0)
            goto out;
    rc = 0;
out:
    if (f)
        fclose(f);
    free(p.t);
    ckpt_destroy(&ck);
    return rc;
}
