/* engine/kvscale.c — an fp8 KV cache's scales: from the checkpoint, or calibrated (kvscale.h). */
#include "engine/kvscale.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <xxhash.h>

#include "common/util.h"
#include "engine/kvcache.h"

static const char *const s_names[KV_SCALES_COUNT] = {"auto", "checkpoint", "calibrate", "one"};

const char *kv_scales_name(int mode) { return mode >= 0 && mode < KV_SCALES_COUNT ? s_names[mode] : "?"; }

int kv_scales_parse(const char *s)
{
    for (int i = 0; s && i < KV_SCALES_COUNT; i++)
        if (strcasecmp(s, s_names[i]) == 0)
            return i;
    return -1;
}

/* ---- checkpoint ---------------------------------------------------------------------------------- */

/* How an export names layer l's K and V scales ("%d" the layer); v NULL: one tensor for both. */
typedef struct {
    const char *k, *v;
} s_naming_t;

static const s_naming_t s_namings[] = {
    {"model.layers.%d.self_attn.k_scale", "model.layers.%d.self_attn.v_scale"},
    {"model.layers.%d.self_attn.k_proj.output_scale", "model.layers.%d.self_attn.v_proj.output_scale"},
    {"model.layers.%d.self_attn.kv_scale", NULL},
};

/* Tensor `name` as n_kv scales into out (one value is broadcast to every head). */
static int s_read(const ckpt_t *ck, const char *name, int n_kv, float *out, char *err, size_t errlen)
{
    const tensor_view_t *t = ckpt_get(ck, name);
    if (!t)
        return errf(err, errlen, "%s: missing (the other layers have their K/V scales)", name);
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
        return errf(err, errlen, "%s: dtype %s (a K/V scale is f32, bf16 or f16)", name, dtype_name(t->dtype));
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    if (n != 1 && n != n_kv)
        return errf(err, errlen, "%s: %lld values (one per tensor, or one per kv head: %d)", name, (long long)n, n_kv);
    float v[1024];                                 /* n <= n_kv: any model's kv heads */
    if (n > (int64_t)(sizeof v / sizeof v[0]))
        return errf(err, errlen, "%s: %lld values, more than the %zu read", name, (long long)n, sizeof v / sizeof v[0]);
    dtype_to_f32(t->dtype, t->data, v, (size_t)n);
    for (int h = 0; h < n_kv; h++) {
        const float x = v[n == 1 ? 0 : h];
        if (!(x > 0.0f) || !isfinite(x))
            return errf(err, errlen, "%s: value %g (a scale must be positive and finite)", name, (double)x);
        out[h] = x;
    }
    return 0;
}

int kvscale_from_checkpoint(const ckpt_t *ck, const model_config_t *cfg, float *out, char *err, size_t errlen)
{
    if (cfg->mla.on || ckpt_is_dummy(ck))
        return 0;
    const int H = cfg->num_kv_heads;
    char k[256], v[256];
    for (size_t i = 0; i < sizeof s_namings / sizeof s_namings[0]; i++) {
        const s_naming_t *nm = &s_namings[i];
        snprintf(k, sizeof k, nm->k, 0);
        if (!ckpt_has(ck, k))
            continue;
        for (int l = 0; l < cfg->num_layers; l++) {
            snprintf(k, sizeof k, nm->k, l);
            snprintf(v, sizeof v, nm->v ? nm->v : nm->k, l);
            float *ks = out + (size_t)l * 2 * H, *vs = ks + H;
            if (s_read(ck, k, H, ks, err, errlen) < 0 || s_read(ck, v, H, vs, err, errlen) < 0)
                return -1;
        }
        return 1;
    }
    return 0;
}

/* ---- calibration --------------------------------------------------------------------------------- */

static uint64_t s_next(uint64_t *x)   /* splitmix64 */
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvscale_calib_ids(int vocab, int32_t *ids, size_t n)
{
    uint64_t rng = 0x6b767363616c65ull;            /* "kvscale" */
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)(s_next(&rng) % (uint64_t)(vocab > 0 ? vocab : 1));
}

/* amax [layers][2][kv heads] = max(amax, |x|) over the first n positions of a sequence's blocks,
 * read back from the pool (host copies of block_bytes each in buf). */
static int s_amax(backend_t *be, const kvpool_t *pool, const kvseq_t *seq, int n, uint8_t *buf, float *row,
                  float *amax, char *err, size_t errlen)
{
    const bk_kv_t *kv = kvpool_view(pool);
    const int bs = kv->block_size, H = kv->n_kv_heads, D = kv->head_dim;
    const size_t es = dtype_size(kv->dtype);
    for (int b = 0; b * bs < n; b++) {
        if (be->ops->download(be, buf, kvpool_block_ptr(pool, kvseq_blocks(seq)[b]), kv->block_bytes) < 0)
            return errf(err, errlen, "KV scales: calibration: cannot read the KV back from the %s backend", be->ops->name);
        const int slots = n - b * bs < bs ? n - b * bs : bs;
        for (int l = 0; l < kv->n_layers; l++)
            for (int which = 0; which < 2; which++)
                for (int j = 0; j < slots; j++) {
                    const size_t off = (((size_t)l * 2 + (size_t)which) * (size_t)bs + (size_t)j) * (size_t)H * (size_t)D;
                    dtype_to_f32(kv->dtype, buf + off * es, row, (size_t)H * D);
                    for (int h = 0; h < H; h++) {
                        float *a = &amax[((size_t)l * 2 + (size_t)which) * (size_t)H + (size_t)h];
                        for (int d = 0; d < D; d++) {
                            const float x = fabsf(row[h * D + d]);
                            if (!isfinite(x))
                                return errf(err, errlen, "KV scales: calibration: layer %d %s head %d is not finite",
                                            l, which ? "V" : "K", h);
                            *a = x > *a ? x : *a;
                        }
                    }
                }
    }
    return 0;
}

int kvscale_calibrate(model_t *m, const int32_t *ids, int n_seqs, int len, int chunk, int block_size, float *out,
                      float *amax_out, char *err, size_t errlen)
{
    const model_config_t *c = model_config(m);
    backend_t *be = model_backend(m);
    if (n_seqs < 1 || len < 1 || chunk < 1 || block_size < 1)
        return errf(err, errlen, "KV scales: calibration of %d prompts of %d tokens in chunks of %d", n_seqs, len, chunk);
    char why[512];
    dtype_t dt = DT_F32;
    if (kvpool_check(be, dt, c->head_dim, c->num_heads, c->num_kv_heads, why, sizeof why) < 0)
        dt = DT_BF16;
    const size_t n = kvscale_count(c);
    float *amax = calloc(n, sizeof *amax), *logits = malloc((size_t)c->vocab_size * sizeof(float));
    float *row = malloc((size_t)c->num_kv_heads * (size_t)c->head_dim * sizeof(float));
    kvpool_t *pool = kvpool_new((len + block_size - 1) / block_size, block_size, c->num_layers, c->num_kv_heads,
                                c->head_dim, dt, be, why, sizeof why);
    uint8_t *buf = pool ? malloc(kvpool_view(pool)->block_bytes) : NULL;
    int rc = 0;
    if (!pool)
        rc = errf(err, errlen, "KV scales: calibration pool: %s", why);
    else if (!amax || !logits || !row || !buf)
        rc = errf(err, errlen, "KV scales: calibration: out of memory");
    for (int s = 0; rc == 0 && s < n_seqs; s++) {
        kvseq_t *seq = kvseq_new(pool, len, 0);
        if (!seq) {
            rc = errf(err, errlen, "KV scales: calibration: out of memory");
            break;
        }
        for (int at = 0; rc == 0 && at < len; at += chunk) {
            const int k = len - at < chunk ? len - at : chunk;
            model_seq_t q = {.kv = seq, .n_new = k};
            model_batch_t b = {.n_seqs = 1, .seqs = &q};
            if (kvseq_append(seq, ids + (size_t)s * len + at, k) < 0)
                rc = errf(err, errlen, "KV scales: calibration: the pool cannot hold %d tokens", len);
            else if (model_forward(m, &b, logits, why, sizeof why) < 0)
                rc = errf(err, errlen, "KV scales: calibration: %s", why);
        }
        if (rc == 0)
            rc = s_amax(be, pool, seq, len, buf, row, amax, err, errlen);
        kvseq_destroy(&seq);
    }
    if (rc == 0 && c->num_experts > 0) {           /* the prompts' routing is no load: clear the counters */
        uint64_t *cnt = calloc((size_t)c->num_layers * (size_t)c->num_experts, sizeof *cnt);
        if (cnt)
            (void)model_expert_load(m, cnt, why, sizeof why);   /* -1: the backend does not count */
        free(cnt);
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        out[i] = amax[i] > 0.0f ? KVSCALE_CALIB_HEADROOM * amax[i] / KVSCALE_E4M3_MAX : 1.0f;
        if (amax_out)
            amax_out[i] = amax[i];
    }
    kvpool_destroy(&pool);
    free(buf);
    free(row);
    free(logits);
    free(amax);
    return rc;
}

uint64_t kvscale_digest(const float *scales, size_t n) { return XXH3_64bits(scales, n * sizeof(float)); }
