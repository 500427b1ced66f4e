/* engine/engine_open.c — config -> backend -> KV dtype -> checkpoint -> weights -> pool (engine_open.h). */
#include "engine/engine_open.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
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
    return access(p, R_OK) == 0;
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
    model_destroy(&e->model);
    ckpt_destroy(&e->ck);
    if (!e->be_borrowed)
        backend_destroy(&e->be);
    free(e->logits);
    free(e->model_dir);
    free(e);
    *self_p = NULL;
}
