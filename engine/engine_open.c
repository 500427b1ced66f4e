/* engine/engine_open.c — config -> backend -> KV dtype -> checkpoint -> weights -> pool (engine_open.h). */
#include "engine/engine_open.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "engine/kvscale.h"
#include "engine/mtp.h"

#define DEFAULT_KV_BLOCK 16
#define DEVICE_RESERVE 3e9        /* bytes per model process: activations, logits, cuBLAS workspace, context */

void engine_spec_default(engine_spec_t *spec)
{
    *spec = (engine_spec_t){.dtype = DT_COUNT, .kv_dtype = DT_COUNT};
}

engine_t *engine_new(const char *model_dir, char *err, size_t errlen)
{
    engine_t *e = calloc(1, sizeof *e);
    if (!e || !(e->model_dir = strdup(model_dir))) {
        free(e);
        errf(err, errlen, "out of memory");
        return NULL;
    }
    if (config_load(model_dir, &e->cfg, err, errlen) != 0)
        engine_destroy(&e);
    return e;
}

static int s_exists(const char *dir, const char *file)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return access(p, F_OK) == 0;   /* not R_OK: an unreadable file is there, and opening it says why */
}

/* The KV dtype by config_kv_dtype's rule, refused here (before any weight is read) when the
 * backend has no attention over it. */
static engine_status_t s_kv_dtype(engine_t *e, const engine_spec_t *s, dtype_t wdt, char *err, size_t errlen)
{
    e->kv_dtype = config_kv_dtype(&e->cfg, s->dummy ? wdt : DT_COUNT, s->kv_dtype);
    char why[512];
    if (e->cfg.mla.on)            /* MLA's own ops read every dtype (kernels/backend.h) */
        return ENGINE_OK;
    if (kvpool_check(e->be, e->kv_dtype, e->cfg.head_dim, e->cfg.num_heads, e->cfg.num_kv_heads, why, sizeof why) == 0)
        return ENGINE_OK;
    const char *opt = s->kv_dtype_option ? s->kv_dtype_option : "kv_dtype";
    if (s->kv_dtype == DT_COUNT)
        errf(err, errlen, "%s auto (%s): %s", opt, dtype_name(e->kv_dtype), why);
    else
        errf(err, errlen, "%s %s: %s", opt, dtype_name(e->kv_dtype), why);
    return ENGINE_ERR_CONFIG;
}

/* The dummy load format, or the model directory's safetensors (with a hint when it has none). */
static engine_status_t s_checkpoint(engine_t *e, const engine_spec_t *s, dtype_t wdt, char *err, size_t errlen)
{
    if (s->dummy) {
        if (!(e->ck = ckpt_dummy(wdt, 0)))
            return errf(err, errlen, "dummy weights of dtype %s: not a weight dtype", dtype_name(wdt)), ENGINE_ERR_CONFIG;
        return ENGINE_OK;
    }
    if (!s_exists(e->model_dir, "model.safetensors") && !s_exists(e->model_dir, "model.safetensors.index.json"))
        return errf(err, errlen, "%s: no model.safetensors or model.safetensors.index.json (%s runs random weights of "
                    "this shape)", e->model_dir, s->dummy_option ? s->dummy_option : "load_format: dummy"),
               ENGINE_ERR_CONFIG;
    return (e->ck = ckpt_open(e->model_dir, err, errlen)) ? ENGINE_OK : ENGINE_ERR_CONFIG;
}

/* Blocks for the pool: spec.kv_blocks, or with kv_fit at most what memory allows (the header's rule). */
static long s_pool_blocks(const engine_t *e, const engine_spec_t *s, size_t block_bytes)
{
    long n = s->kv_blocks;
    if (!s->kv_fit)
        return n;
    const int sharers = s->kv_sharers > 0 ? s->kv_sharers : 1;
    const double share = s->kv_share > 0 ? s->kv_share : 1.0;
    long mem;
    if (e->mem_at_start) {
        /* every worker of a checkpoint with an MTP layer places it too (prefill workers as well) */
        const double weights = (double)model_weight_bytes(e->model) + (double)model_mtp_weight_bytes(e->model);
        const double left = (double)e->mem_at_start - sharers * (weights + DEVICE_RESERVE) -
                            (s->kv_reserve_bytes > 0 ? s->kv_reserve_bytes : 0);
        mem = left > 0 ? (long)(left * 0.9 * share) : 0;
    } else {
        mem = sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / 4;
    }
    if (n * (long)block_bytes > mem)
        n = mem / (long)block_bytes;
    return n;
}

/* Calibration prompts' length: KVSCALE_CALIB_LEN, or the model's whole context when shorter. */
static int s_calib_len(const model_config_t *c)
{
    const int ctx = c->max_position_embeddings;
    return ctx > 0 && ctx < KVSCALE_CALIB_LEN ? ctx : KVSCALE_CALIB_LEN;
}

/* Where an fp8 pool's scales come from (spec.kv_scales, engine/kvscale.h), decided before the
 * weights are loaded: the checkpoint's are read into e->kv_scales now; a calibration makes the
 * model's buffers big enough for its prompts (*mo), whatever the caller sized them for, so that every
 * process of a model calibrates on the same chunks and gets the same scales. */
static engine_status_t s_kv_scales_source(engine_t *e, const engine_spec_t *s, model_opts_t *mo, char *err,
                                          size_t errlen)
{
    const model_config_t *c = &e->cfg;
    if (e->kv_dtype != DT_F8E4M3 || c->mla.on)
        return ENGINE_OK;
    const char *opt = s->kv_scales_option ? s->kv_scales_option : "kv_scales";
    const int mode = s->kv_scales;
    if (mode < 0 || mode >= KV_SCALES_COUNT)
        return errf(err, errlen, "%s: unknown mode %d", opt, mode), ENGINE_ERR_CONFIG;
    if (!(e->kv_scales = malloc(kvscale_count(c) * sizeof(float))))
        return errf(err, errlen, "out of memory for the KV scales"), ENGINE_ERR_RUNTIME;
    e->kv_scales_from = mode;
    if (mode == KV_SCALES_AUTO || mode == KV_SCALES_CHECKPOINT) {
        char why[512];
        const int found = kvscale_from_checkpoint(e->ck, c, e->kv_scales, why, sizeof why);
        if (found < 0)
            return errf(err, errlen, "%s %s: %s", opt, kv_scales_name(mode), why), ENGINE_ERR_CONFIG;
        if (!found && mode == KV_SCALES_CHECKPOINT)
            return errf(err, errlen, "%s checkpoint: %s has no K/V scales (model.layers.0.self_attn.k_scale / v_scale, "
                        "k_proj.output_scale / v_proj.output_scale or kv_scale); use calibrate or one", opt,
                        e->model_dir), ENGINE_ERR_CONFIG;
        e->kv_scales_from = found ? KV_SCALES_CHECKPOINT : KV_SCALES_CALIBRATE;
    }
    if (e->kv_scales_from == KV_SCALES_CALIBRATE && (s->kv_no_calibrate || mo->expert_keep)) {
        if (mode == KV_SCALES_CALIBRATE)
            return errf(err, errlen, "%s calibrate: not with an expert-parallel group (no process holds every expert "
                        "to run the calibration); use checkpoint or one", opt), ENGINE_ERR_CONFIG;
        e->kv_scales_from = KV_SCALES_ONE;        /* auto: the same choice in every process of the topology */
    }
    if (e->kv_scales_from == KV_SCALES_CALIBRATE) {
        const int len = s_calib_len(c);
        if (mo->max_tokens > 0 && mo->max_tokens < KVSCALE_CALIB_CHUNK)
            mo->max_tokens = KVSCALE_CALIB_CHUNK;
        if (mo->max_context > 0 && mo->max_context < len)
            mo->max_context = len;
    }
    return ENGINE_OK;
}

/* The scales into the pool: calibrated on the loaded model when that is their source, else the
 * checkpoint's; all 1 leaves the pool without a table (the unscaled kernels' bits). */
static engine_status_t s_kv_scales(engine_t *e, const engine_spec_t *s, int block_size, char *err, size_t errlen)
{
    if (!e->kv_scales)
        return ENGINE_OK;
    const model_config_t *c = &e->cfg;
    const char *opt = s->kv_scales_option ? s->kv_scales_option : "kv_scales";
    const size_t n = kvscale_count(c);
    char why[512];
    if (e->kv_scales_from == KV_SCALES_CALIBRATE) {
        const int len = s_calib_len(c);
        int32_t ids[KVSCALE_CALIB_SEQS * KVSCALE_CALIB_LEN];
        kvscale_calib_ids(c->vocab_size, ids, (size_t)KVSCALE_CALIB_SEQS * (size_t)len);
        if (!s->quiet)
            fprintf(stderr, "%s: KV scales: calibrating the fp8 cache on %d prompts of %d token ids...\n", e->model_dir,
                    KVSCALE_CALIB_SEQS, len);
        if (kvscale_calibrate(e->model, ids, KVSCALE_CALIB_SEQS, len, KVSCALE_CALIB_CHUNK, block_size, e->kv_scales,
                              NULL, why, sizeof why) < 0)
            return errf(err, errlen, "%s %s: %s", opt, kv_scales_name(s->kv_scales), why), ENGINE_ERR_RUNTIME;
    } else if (e->kv_scales_from == KV_SCALES_ONE) {
        for (size_t i = 0; i < n; i++)
            e->kv_scales[i] = 1.0f;
    }
    if (e->kv_scales_from != KV_SCALES_ONE && kvpool_set_scales(e->pool, e->kv_scales, why, sizeof why) < 0)
        return errf(err, errlen, "%s: %s", opt, why), ENGINE_ERR_CONFIG;
    if (!s->quiet) {
        float lo = e->kv_scales[0], hi = lo;
        for (size_t i = 1; i < n; i++)
            lo = e->kv_scales[i] < lo ? e->kv_scales[i] : lo, hi = e->kv_scales[i] > hi ? e->kv_scales[i] : hi;
        const int f = e->kv_scales_from;
        fprintf(stderr, "%s: KV scales (%s): %s, %zu in [%.4g, %.4g], digest %016llx\n", e->model_dir,
                kv_scales_name(s->kv_scales), f == KV_SCALES_CHECKPOINT ? "from the checkpoint"
                                              : f == KV_SCALES_CALIBRATE ? "calibrated (4 amax / 448)" : "all 1",
                n, (double)lo, (double)hi, (unsigned long long)kvscale_digest(e->kv_scales, n));
    }
    return ENGINE_OK;
}

engine_status_t engine_load(engine_t *e, const engine_spec_t *s, char *err, size_t errlen)
{
    e->be_borrowed = s->be != NULL;
    if (!(e->be = s->be ? s->be : backend_new(s->backend ? s->backend : "cpu", s->threads, err, errlen)))
        return ENGINE_ERR_RUNTIME;
    /* Free device memory before any weight of this process is placed: the KV budget is taken from
     * it, so it does not depend on which of a device's model processes loads first. */
    e->mem_at_start = e->be->ops->mem_available ? e->be->ops->mem_available(e->be) : 0;

    const dtype_t wdt = s->dtype != DT_COUNT ? s->dtype : e->cfg.dtype;   /* the dummy weights' */
    engine_status_t st;
    if ((st = s_kv_dtype(e, s, wdt, err, errlen)) != ENGINE_OK || (st = s_checkpoint(e, s, wdt, err, errlen)) != ENGINE_OK)
        return st;
    model_opts_t mo = s->model;
    if (mo.kv_block_size <= 0)
        mo.kv_block_size = DEFAULT_KV_BLOCK;
    /* Random routers do not route as a trained model does; TROUPE_DUMMY_ROUTER_SKEW gives every
     * process of a cluster a named skew (engine/router_skew.h) unless the caller named one. */
    if (s->dummy && !mo.router_skew)
        mo.router_skew = getenv("TROUPE_DUMMY_ROUTER_SKEW");
    if ((st = s_kv_scales_source(e, s, &mo, err, errlen)) != ENGINE_OK)
        return st;
    /* Weights that disagree with config.json, or a model the device cannot hold: the model's fault. */
    if (!(e->model = model_load(e->model_dir, &e->cfg, e->ck, e->be, &mo, err, errlen)))
        return ENGINE_ERR_CONFIG;
    const tensor_view_t *emb = s->dummy ? NULL : ckpt_get(e->ck, "model.embed_tokens.weight");
    e->weights_dtype = emb ? emb->dtype : s->dummy ? wdt : e->cfg.dtype;

    const size_t block_bytes = config_kv_bytes_per_token(&e->cfg, dtype_size(e->kv_dtype)) * (size_t)mo.kv_block_size;
    const long n_blocks = s_pool_blocks(e, s, block_bytes);
    char why[512];
    if (!(e->pool = kvpool_new((int)(n_blocks < 1L << 30 ? n_blocks : 1L << 30), mo.kv_block_size, e->cfg.num_layers,
                               e->cfg.num_kv_heads, e->cfg.head_dim, e->kv_dtype, e->be, why, sizeof why))) {
        /* kv_blocks (or the memory left) too small for one block, or more than the device holds. */
        errf(err, errlen, "KV pool of %ld blocks of %d tokens (%s, %zu bytes each): %s", n_blocks, mo.kv_block_size,
             dtype_name(e->kv_dtype), block_bytes, why);
        return ENGINE_ERR_CONFIG;
    }
    if (model_router_skew_calibrate(e->model, e->pool, err, errlen) < 0)
        return ENGINE_ERR_CONFIG;
    if ((st = s_kv_scales(e, s, mo.kv_block_size, err, errlen)) != ENGINE_OK)
        return st;
    e->logit_rows = mo.max_logit_rows > 0 ? mo.max_logit_rows : mo.max_seqs > 0 ? mo.max_seqs : 64;
    if (!(e->logits = malloc((size_t)e->logit_rows * (size_t)e->cfg.vocab_size * sizeof(float))))
        return errf(err, errlen, "out of memory for %d rows of logits", e->logit_rows), ENGINE_ERR_RUNTIME;
    return ENGINE_OK;
}

engine_t *engine_open(const char *model_dir, const engine_spec_t *spec, engine_status_t *status, char *err,
                      size_t errlen)
{
    engine_status_t st = ENGINE_ERR_CONFIG;
    engine_t *e = engine_new(model_dir, err, errlen);
    if (e && (st = engine_load(e, spec, err, errlen)) != ENGINE_OK)
        engine_destroy(&e);
    if (status)
        *status = st;
    return e;
}

void engine_destroy(engine_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    engine_t *e = *self_p;
    kvpool_destroy(&e->pool);
    free(e->kv_scales);
    model_destroy(&e->model);
    ckpt_destroy(&e->ck);
    if (!e->be_borrowed)
        backend_destroy(&e->be);
    free(e->logits);
    free(e->model_dir);
    free(e);
    *self_p = NULL;
}
