/* engine/quant.c — quantization_config parsing and the formats' reference encoding (engine/quant.h). */
#include "engine/quant.h"

#include <jansson.h>
#include <math.h>
#include <oniguruma.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"
#include "kernels/cpu/cpu_quant.h"

static const char *const s_fmt_names[BK_Q_COUNT] = {"none", "fp8", "int8", "int4", "nvfp4"};

int quant_format_parse(const char *s)
{
    for (int f = 1; s && f < BK_Q_COUNT; f++)
        if (strcasecmp(s, s_fmt_names[f]) == 0)
            return f;
    return -1;
}

const char *quant_format_name(int fmt) { return fmt >= 0 && fmt < BK_Q_COUNT ? s_fmt_names[fmt] : "?"; }

/* ---- parsing ---- */

static const char *s_str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* An integer field that must be present and equal one of the allowed values (n of them). */
static int s_int_in(json_t *o, const char *where, const char *path, const char *key, int *out, const int *allowed,
                    int n, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return errf(err, errlen, "%s: %s.%s missing or not an integer", where, path, key);
    json_int_t x = json_integer_value(v);
    for (int i = 0; i < n; i++)
        if (x == allowed[i]) {
            *out = (int)x;
            return 0;
        }
    return errf(err, errlen, "%s: %s.%s = %lld is not supported", where, path, key, (long long)x);
}

static int s_false_or_absent(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return !v || json_is_null(v) || json_is_false(v);
}

/* compressed-tensors' "weights" of the one config group. */
static int s_ct_weights(json_t *w, const char *where, const char *path, const char *format, quant_config_t *qc,
                        char *err, size_t errlen)
{
    if (!json_is_object(w))
        return errf(err, errlen, "%s: %s missing or not an object", where, path);
    const char *type = s_str(w, "type"), *strategy = s_str(w, "strategy");
    if (!type)
        return errf(err, errlen, "%s: %s.type missing or not a string", where, path);
    if (!strategy)
        return errf(err, errlen, "%s: %s.strategy missing or not a string", where, path);
    json_t *sym = json_object_get(w, "symmetric");
    if (sym && !json_is_null(sym) && !json_is_true(sym))
        return errf(err, errlen, "%s: %s.symmetric is not true (asymmetric weights with zero points are not supported)",
                    where, path);
    if (!s_false_or_absent(w, "dynamic"))
        return errf(err, errlen, "%s: %s.dynamic must be false for weights", where, path);
    const char *actorder = s_str(w, "actorder");
    if (actorder && strcmp(actorder, "static") != 0)
        return errf(err, errlen, "%s: %s.actorder '%.32s' is not supported (reordered groups)", where, path, actorder);
    int bits;
    if (strcmp(format, "float-quantized") == 0) {
        static const int b8[] = {8};
        if (s_int_in(w, where, path, "num_bits", &bits, b8, 1, err, errlen) < 0)
            return -1;
        if (strcmp(type, "float") != 0)
            return errf(err, errlen, "%s: %s.type '%.32s' (float-quantized needs float)", where, path, type);
        qc->fmt = BK_Q_FP8;
        if (strcmp(strategy, "tensor") == 0)
            qc->gr = 0, qc->gc = 0;
        else if (strcmp(strategy, "channel") == 0)
            qc->gr = 1, qc->gc = 0;
        else if (strcmp(strategy, "block") == 0) {
            json_t *bs = json_object_get(w, "block_structure");
            if (!json_is_array(bs) || json_array_size(bs) != 2 || json_integer_value(json_array_get(bs, 0)) != 128 ||
                json_integer_value(json_array_get(bs, 1)) != 128)
                return errf(err, errlen, "%s: %s.block_structure must be [128, 128]", where, path);
            qc->gr = 128, qc->gc = 128;
        } else
            return errf(err, errlen, "%s: %s.strategy '%.32s' is not supported for fp8 (tensor, channel, block)",
                        where, path, strategy);
    } else if (strcmp(format, "int-quantized") == 0) {
        static const int b8[] = {8};
        if (s_int_in(w, where, path, "num_bits", &bits, b8, 1, err, errlen) < 0)
            return -1;
        if (strcmp(type, "int") != 0)
            return errf(err, errlen, "%s: %s.type '%.32s' (int-quantized needs int)", where, path, type);
        if (strcmp(strategy, "channel") != 0)
            return errf(err, errlen, "%s: %s.strategy '%.32s' is not supported for int8 (channel)", where, path, strategy);
        qc->fmt = BK_Q_I8, qc->gr = 1, qc->gc = 0;
    } else if (strcmp(format, "pack-quantized") == 0) {
        static const int b4[] = {4};
        if (s_int_in(w, where, path, "num_bits", &bits, b4, 1, err, errlen) < 0)
            return -1;
        if (strcmp(type, "int") != 0)
            return errf(err, errlen, "%s: %s.type '%.32s' (pack-quantized needs int)", where, path, type);
        qc->fmt = BK_Q_I4, qc->gr = 1;
        if (strcmp(strategy, "group") == 0) {
            static const int gs[] = {32, 64, 128, 256};
            if (s_int_in(w, where, path, "group_size", &qc->gc, gs, 4, err, errlen) < 0)
                return -1;
        } else if (strcmp(strategy, "channel") == 0) {
            qc->gc = 0;
        } else
            return errf(err, errlen, "%s: %s.strategy '%.32s' is not supported for int4 (group, channel)", where, path,
                        strategy);
    } else if (strcmp(format, "nvfp4-pack-quantized") == 0) {
        static const int b4[] = {4}, g16[] = {16};
        if (s_int_in(w, where, path, "num_bits", &bits, b4, 1, err, errlen) < 0 ||
            s_int_in(w, where, path, "group_size", &qc->gc, g16, 1, err, errlen) < 0)
            return -1;
        if (strcmp(type, "float") != 0)
            return errf(err, errlen, "%s: %s.type '%.32s' (nvfp4 needs float)", where, path, type);
        if (strcmp(strategy, "tensor_group") != 0)
            return errf(err, errlen, "%s: %s.strategy '%.32s' (nvfp4 needs tensor_group)", where, path, strategy);
        qc->fmt = BK_Q_FP4, qc->gr = 1;
    } else {
        return errf(err, errlen, "%s: format '%.48s' is not supported (float-quantized, int-quantized, "
                    "pack-quantized, nvfp4-pack-quantized)", where, format);
    }
    return 0;
}

static int s_ct_acts(json_t *a, const char *where, const char *path, quant_config_t *qc, char *err, size_t errlen)
{
    qc->act = BK_QA_NONE;
    if (!a || json_is_null(a))
        return 0;
    if (!json_is_object(a))
        return errf(err, errlen, "%s: %s is not an object", where, path);
    if (qc->fmt == BK_Q_FP4 || qc->fmt == BK_Q_I4)
        return 0;                                  /* computed weight-only (engine/quant.h) */
    const char *type = s_str(a, "type"), *strategy = s_str(a, "strategy");
    json_t *dyn = json_object_get(a, "dynamic");
    if (!json_is_true(dyn))
        return errf(err, errlen, "%s: %s.dynamic is not true (static activation scales are not supported)", where, path);
    if (!strategy || strcmp(strategy, "token") != 0)
        return errf(err, errlen, "%s: %s.strategy '%.32s' is not supported (token)", where, path,
                    strategy ? strategy : "(missing)");
    json_t *sym = json_object_get(a, "symmetric");
    if (sym && !json_is_null(sym) && !json_is_true(sym))
        return errf(err, errlen, "%s: %s.symmetric is not true", where, path);
    int bits;
    static const int b8[] = {8};
    if (s_int_in(a, where, path, "num_bits", &bits, b8, 1, err, errlen) < 0)
        return -1;
    if (type && strcmp(type, "float") == 0 && qc->fmt == BK_Q_FP8)
        qc->act = BK_QA_FP8_TOKEN;
    else if (type && strcmp(type, "int") == 0 && qc->fmt == BK_Q_I8)
        qc->act = BK_QA_I8_TOKEN;
    else
        return errf(err, errlen, "%s: %s.type '%.32s' does not match the weights' format", where, path,
                    type ? type : "(missing)");
    return 0;
}

/* Python's re.match(pattern, s): a match anchored at the start (not the end), Python syntax, with
 * Oniguruma (what the tokenizer uses; libc's regcomp would collide with Oniguruma's POSIX names).
 * 1 match, 0 none, -1 the pattern does not compile. */
static pthread_once_t s_onig_once = PTHREAD_ONCE_INIT;
static void s_onig_init(void)
{
    OnigEncoding encs[1] = {ONIG_ENCODING_UTF8};
    onig_initialize(encs, 1);
}

static int s_re_match(const char *pattern, const char *s)
{
    pthread_once(&s_onig_once, s_onig_init);
    OnigRegex re;
    OnigErrorInfo einfo;
    if (onig_new(&re, (const OnigUChar *)pattern, (const OnigUChar *)pattern + strlen(pattern), ONIG_OPTION_NONE,
                 ONIG_ENCODING_UTF8, ONIG_SYNTAX_PYTHON, &einfo) != ONIG_NORMAL)
        return -1;
    const OnigUChar *b = (const OnigUChar *)s, *e = b + strlen(s);
    int r = onig_match(re, b, e, b, NULL, ONIG_OPTION_NONE);
    onig_free(re);
    return r >= 0 ? 1 : 0;
}

static int s_ignore(json_t *ig, const char *where, quant_config_t *qc, char *err, size_t errlen)
{
    qc->n_ignore = 0;
    if (!ig || json_is_null(ig))
        return 0;
    if (!json_is_array(ig))
        return errf(err, errlen, "%s: ignore is not an array", where);
    if (json_array_size(ig) > QUANT_MAX_IGNORE)
        return errf(err, errlen, "%s: ignore has %zu entries (at most %d)", where, json_array_size(ig), QUANT_MAX_IGNORE);
    for (size_t i = 0; i < json_array_size(ig); i++) {
        const char *s = json_string_value(json_array_get(ig, i));
        if (!s || strlen(s) >= QUANT_MAX_NAME)
            return errf(err, errlen, "%s: ignore[%zu] is not a string of at most %d bytes", where, i, QUANT_MAX_NAME - 1);
        if (strncmp(s, "re:", 3) == 0) {
            int hit = s_re_match(s + 3, "");
            if (hit < 0)
                return errf(err, errlen, "%s: ignore[%zu] '%.60s' is not a regular expression we can read", where, i, s);
        }
        snprintf(qc->ignore[qc->n_ignore++], QUANT_MAX_NAME, "%s", s);
    }
    return 0;
}

/* kv_cache_scheme: static FP8 K/V scales per tensor or per kv head, which the checkpoint stores as
 * self_attn.k_scale / v_scale (engine/kvscale.h reads them for an fp8 cache; model.kv_dtype chooses
 * the cache). Anything else is refused. */
static int s_ct_kv(json_t *kv, const char *where, char *err, size_t errlen)
{
    if (!kv || json_is_null(kv))
        return 0;
    const char *type = s_str(kv, "type"), *strategy = s_str(kv, "strategy");
    json_t *bits = json_object_get(kv, "num_bits"), *sym = json_object_get(kv, "symmetric");
    if (!json_is_object(kv) || !json_is_integer(bits) || json_integer_value(bits) != 8 || !type ||
        strcmp(type, "float") != 0 || !strategy || (strcmp(strategy, "tensor") != 0 && strcmp(strategy, "attn_head") != 0) ||
        !s_false_or_absent(kv, "dynamic") || (sym && !json_is_true(sym)))
        return errf(err, errlen, "%s: kv_cache_scheme is supported as static symmetric 8-bit float, strategy tensor or "
                    "attn_head (its k_scale / v_scale are read when model.kv_dtype is fp8)", where);
    return 0;
}

static int s_compressed_tensors(json_t *q, const char *where, quant_config_t *qc, char *err, size_t errlen)
{
    const char *format = s_str(q, "format");
    if (!format)
        return errf(err, errlen, "%s: format missing or not a string", where);
    json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0)
        return errf(err, errlen, "%s: config_groups missing or empty", where);
    if (json_object_size(groups) != 1)
        return errf(err, errlen, "%s: config_groups has %zu groups (one is supported)", where, json_object_size(groups));
    const char *gname = json_object_iter_key(json_object_iter(groups));
    json_t *g = json_object_iter_value(json_object_iter(groups));
    char path[96];
    if (!json_is_object(g))
        return errf(err, errlen, "%s: config_groups.%.32s is not an object", where, gname);
    json_t *targets = json_object_get(g, "targets");
    if (!json_is_array(targets) || json_array_size(targets) != 1 ||
        !json_is_string(json_array_get(targets, 0)) || strcmp(json_string_value(json_array_get(targets, 0)), "Linear"))
        return errf(err, errlen, "%s: config_groups.%.32s.targets must be [\"Linear\"]", where, gname);
    if (!s_false_or_absent(g, "output_activations"))
        return errf(err, errlen, "%s: config_groups.%.32s.output_activations is not supported", where, gname);
    snprintf(path, sizeof path, "config_groups.%.32s.weights", gname);
    if (s_ct_weights(json_object_get(g, "weights"), where, path, format, qc, err, errlen) < 0)
        return -1;
    snprintf(path, sizeof path, "config_groups.%.32s.input_activations", gname);
    if (s_ct_acts(json_object_get(g, "input_activations"), where, path, qc, err, errlen) < 0)
        return -1;
    if (s_ct_kv(json_object_get(q, "kv_cache_scheme"), where, err, errlen) < 0)
        return -1;
    qc->method = QUANT_CT;
    return s_ignore(json_object_get(q, "ignore"), where, qc, err, errlen);
}

/* DeepSeek-V3's own FP8 format. */
static int s_deepseek_fp8(json_t *q, const char *where, quant_config_t *qc, char *err, size_t errlen)
{
    const char *fmt = s_str(q, "fmt"), *act = s_str(q, "activation_scheme");
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return errf(err, errlen, "%s: fmt '%.32s' is not supported (e4m3)", where, fmt);
    if (act && strcmp(act, "dynamic") != 0)
        return errf(err, errlen, "%s: activation_scheme '%.32s' is not supported (dynamic)", where, act);
    json_t *bs = json_object_get(q, "weight_block_size");
    if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
        json_integer_value(json_array_get(bs, 0)) != 128 || json_integer_value(json_array_get(bs, 1)) != 128)
        return errf(err, errlen, "%s: weight_block_size must be [128, 128]", where);
    qc->method = QUANT_DEEPSEEK_FP8;
    qc->fmt = BK_Q_FP8, qc->gr = 128, qc->gc = 128, qc->act = BK_QA_NONE;
    json_t *ig = json_object_get(q, "modules_to_not_convert");
    return s_ignore(ig, where, qc, err, errlen);
}

int quant_config_parse(const void *json_obj, const char *where, quant_config_t *qc, char *err, size_t errlen)
{
    json_t *q = (json_t *)json_obj;
    memset(qc, 0, sizeof *qc);
    if (!q || json_is_null(q))
        return 0;
    if (!json_is_object(q))
        return errf(err, errlen, "%s is not an object", where);
    const char *method = s_str(q, "quant_method");
    if (!method)
        return errf(err, errlen, "%s: quant_method missing or not a string", where);
    int rc;
    if (strcmp(method, "compressed-tensors") == 0)
        rc = s_compressed_tensors(q, where, qc, err, errlen);
    else if (strcmp(method, "fp8") == 0)
        rc = s_deepseek_fp8(q, where, qc, err, errlen);
    else
        return errf(err, errlen, "%s: quant_method '%.48s' is not supported (compressed-tensors, fp8)", where, method);
    if (rc < 0) {
        memset(qc, 0, sizeof *qc);
        return -1;
    }
    qc->present = 1;
    return 0;
}

int quant_config_parse_text(const char *text, size_t len, const char *where, quant_config_t *qc, char *err,
                            size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        memset(qc, 0, sizeof *qc);
        return errf(err, errlen, "%s: line %d: %s", where, je.line, je.text);
    }
    int rc = quant_config_parse(root, where, qc, err, errlen);
    json_decref(root);
    return rc;
}

int quant_ignored(const quant_config_t *qc, const char *module)
{
    for (int i = 0; i < qc->n_ignore; i++) {
        const char *s = qc->ignore[i];
        if (strncmp(s, "re:", 3) != 0) {
            if (strcmp(s, module) == 0)
                return 1;
            continue;
        }
        if (s_re_match(s + 3, module) > 0)
            return 1;
    }
    return 0;
}

/* ---- encoding ---- */

size_t quant_grid(int64_t rows, int64_t cols, int gr, int gc, int *gr_out, int *gc_out)
{
    int64_t r = gr > 0 && gr < rows ? gr : rows, c = gc > 0 && gc < cols ? gc : cols;
    if (r < 1) r = 1;
    if (c < 1) c = 1;
    *gr_out = (int)r;
    *gc_out = (int)c;
    return (size_t)((rows + r - 1) / r) * (size_t)((cols + c - 1) / c);
}

size_t quant_code_bytes(int fmt, int64_t rows, int64_t cols)
{
    size_t n = (size_t)rows * (size_t)cols;
    return fmt == BK_Q_I4 || fmt == BK_Q_FP4 ? n / 2 : n;
}

float quant_fp4_to_f32(uint8_t nibble) { return cpu_fp4_value(nibble & 15); }

uint8_t quant_f32_to_fp4(float x)
{
    /* Midpoints between 0 .5 1 1.5 2 3 4 6; a tie goes to the even code (0, 2, 4, 6 mantissa 0). */
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const uint8_t sign = signbit(x) ? 8 : 0;
    const float a = fabsf(x);
    uint8_t c = 0;
    while (c < 7 && (a > mid[c] || (a == mid[c] && (c & 1))))
        c++;
    return sign | c;
}

float quant_code_value(int fmt, const uint8_t *codes, int64_t cols, int64_t r, int64_t c)
{
    return cpu_quant_code(fmt, codes, cols, r, c);
}

void quant_act_row(int act, const float *x, int64_t K, float *out) { cpu_quant_act_row(act, x, K, out); }

static void s_put_nibble(uint8_t *codes, int64_t cols, int64_t r, int64_t c, unsigned v)
{
    uint8_t *b = &codes[(r * cols + c) / 2];
    *b = (c & 1) ? (uint8_t)((*b & 0x0f) | (v << 4)) : (uint8_t)((*b & 0xf0) | (v & 15));
}

int quant_encode(int fmt, const float *w, int64_t rows, int64_t cols, int gr, int gc, uint8_t *codes, float *scales,
                 uint8_t *fp8_scales, float *global_scale)
{
    if (rows < 1 || cols < 1 || gr < 1 || gc < 1 || fmt <= BK_Q_NONE || fmt >= BK_Q_COUNT)
        return -1;
    if ((fmt == BK_Q_I4 || fmt == BK_Q_FP4) && cols % 2)
        return -1;
    if (fmt == BK_Q_FP4 && (gc != 16 || gr != 1))
        return -1;
    const int64_t ngr = (rows + gr - 1) / gr, ngc = (cols + gc - 1) / gc;
    float global = 1.0f;
    if (fmt == BK_Q_FP4) {
        float amax = 0.0f;
        for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++)
            amax = fabsf(w[i]) > amax ? fabsf(w[i]) : amax;
        global = amax > 0.0f ? 448.0f * 6.0f / amax : 1.0f;
        if (global_scale)
            *global_scale = global;
    }
    for (int64_t br = 0; br < ngr; br++)
        for (int64_t bc = 0; bc < ngc; bc++) {
            const int64_t r0 = br * gr, r1 = r0 + gr < rows ? r0 + gr : rows;
            const int64_t c0 = bc * gc, c1 = c0 + gc < cols ? c0 + gc : cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    amax = fabsf(w[r * cols + c]) > amax ? fabsf(w[r * cols + c]) : amax;
            float s;
            switch (fmt) {
            case BK_Q_FP8: s = amax / 448.0f; break;
            case BK_Q_I8: s = amax / 127.5f; break;
            case BK_Q_I4: s = amax / 7.5f; break;
            default: {                             /* fp4: the block scale as E4M3 times 1 / global */
                uint8_t s8 = f32_to_f8e4m3(amax / 6.0f * global);
                if (f8e4m3_to_f32(s8) == 0.0f)
                    s8 = 0x08;                     /* smallest normal: a zero block stays zero */
                if (fp8_scales)
                    fp8_scales[br * ngc + bc] = s8;
                s = f8e4m3_to_f32(s8) / global;
            }
            }
            if (!(s > 0.0f) || !isfinite(s))
                s = fmt == BK_Q_FP4 ? s : 1.0f;
            scales[br * ngc + bc] = s;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) {
                    const float v = w[r * cols + c] / s;
                    switch (fmt) {
                    case BK_Q_FP8: codes[r * cols + c] = f32_to_f8e4m3(v); break;
                    case BK_Q_I8: codes[r * cols + c] = (uint8_t)(int8_t)rintf(fminf(fmaxf(v, -128.0f), 127.0f)); break;
                    case BK_Q_I4:
                        s_put_nibble(codes, cols, r, c, (unsigned)((int)rintf(fminf(fmaxf(v, -8.0f), 7.0f)) + 8));
                        break;
                    default: s_put_nibble(codes, cols, r, c, quant_f32_to_fp4(v)); break;
                    }
                }
        }
    return 0;
}

void quant_decode(int fmt, const uint8_t *codes, const float *scales, int64_t rows, int64_t cols, int gr, int gc,
                  float *w)
{
    const bk_mat_t m = {.data = codes, .rows = rows, .cols = cols, .qfmt = (int8_t)fmt, .qgr = gr, .qgc = gc,
                        .qscale = scales};
    for (int64_t r = 0; r < rows; r++)
        cpu_quant_row(&m, r, 0, cols, w + r * cols);
}
