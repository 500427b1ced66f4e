/* engine/engine_open.h — opening a model for inference, in one place:
 *
 *     config.json -> backend -> the KV cache's dtype (config_kv_dtype), checked against the backend
 *     -> checkpoint (the files, or the 'dummy' load format) -> weights on the backend (model_load)
 *     -> the KV pool, and a host buffer for the logits.
 *
 * The prefill and decode workers (actors/worker/worker.c), troupe-generate and troupe-bench-engine
 * all open their model here, so a cluster and the single-process tools on the same model and
 * options run the same weights with the same KV cache.
 *
 * Two steps, because callers size a run from the model's shape: engine_new reads the config (cheap,
 * no device), engine_load does the rest; engine_open is both. An unsupported KV cache fails before
 * any weight is read. Every error names the file or the option at fault, and engine_load says
 * whose fault it is: ENGINE_ERR_CONFIG when the model's files or the options are (retrying cannot
 * help: a worker exits ACTOR_EXIT_CONFIG), ENGINE_ERR_RUNTIME when it is the moment (no device, out
 * of host memory).
 *
 * An fp8 pool gets its scales last (engine/kvscale.h, spec.kv_scales): the checkpoint's, or
 * calibrated on the loaded model, with a line on stderr saying which and the table's digest.
 *
 * Pool sizing: spec.kv_blocks blocks; with kv_fit, at most what memory allows: a quarter of the
 * host's memory on a backend that cannot tell its free memory (the CPU), else kv_share of 90% of
 * the device memory free before the weights were placed, less kv_sharers copies of the weights and
 * a 3 GB working reserve each, less kv_reserve_bytes (the draft models of the device's workers) (the model processes of one device start together: counting them
 * all, not just those that have loaded so far, keeps a fast loader from taking a slow one's room).
 */
#ifndef TROUPE_ENGINE_ENGINE_OPEN_H
#define TROUPE_ENGINE_ENGINE_OPEN_H

#include <stddef.h>

#include "common/dtype.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "kernels/backend.h"

typedef enum {
    ENGINE_OK = 0,
    ENGINE_ERR_CONFIG,            /* the model's files or the options: retrying cannot help */
    ENGINE_ERR_RUNTIME,           /* the device, host memory: another attempt may succeed */
} engine_status_t;

/* How to open a model: start from engine_spec_default (DT_COUNT dtypes); zero fields are defaults. */
typedef struct engine_spec {
    const char *backend;          /* backend_new kind: "cpu" (NULL: "cpu"), "cuda", "cuda:N" */
    backend_t *be;                /* an open backend to run on instead (a draft model on its target's):
                                     not opened, and not destroyed with the engine; backend and
                                     threads are then unused */
    int threads;                  /* host threads; <= 0: the backend's default */
    int dummy;                    /* the 'dummy' load format: random weights of the config's shape */
    dtype_t dtype;                /* the dummy weights' dtype; DT_COUNT: the config's */
    dtype_t kv_dtype;             /* the KV cache's; DT_COUNT: auto (config_kv_dtype) */
    model_opts_t model;           /* sizes the forward; model.kv_block_size is also the pool's (0: 16) */
    long kv_blocks;               /* blocks in the pool (>= 1), or with kv_fit the most wanted */
    int kv_fit;                   /* 1: fewer blocks when memory is short (the header's rule) */
    int kv_sharers;               /* kv_fit: model processes placing these weights on this device (0: 1) */
    double kv_share;              /* kv_fit: this process's fraction of the device's KV memory (0: 1) */
    double kv_reserve_bytes;      /* kv_fit: device bytes the device's model processes place besides
                                     their weights and pools (draft models), taken off first */
    const char *kv_dtype_option;  /* names the KV option in errors (NULL: "kv_dtype"): "model.kv_dtype" */
    int kv_scales;                /* an fp8 cache's scales, KV_SCALES_* (engine/kvscale.h); 0: auto */
    const char *kv_scales_option; /* names it in errors (NULL: "kv_scales"): "model.kv_scales" */
    int kv_no_calibrate;          /* 1: never calibrate (every process of a topology with an expert-parallel
                                     group, where no process holds every expert): auto without the
                                     checkpoint's scales takes 1, calibrate is refused. Also when
                                     model.expert_keep is set */
    int quiet;                    /* 1: no progress lines on stderr (the KV scales' calibration) */
    const char *dummy_option;     /* names the dummy load format in hints (NULL: "load_format: dummy") */
} engine_spec_t;

/* An open model: model_dir and cfg set by engine_new, the rest by engine_load; read-only after. */
typedef struct engine {
    char *model_dir;
    model_config_t cfg;           /* config.json and generation_config.json */
    dtype_t weights_dtype;        /* the dummy weights', or the checkpoint's embedding's as stored */
    dtype_t kv_dtype;             /* the pool's */
    backend_t *be;
    int be_borrowed;              /* spec.be: the backend is the caller's */
    ckpt_t *ck;                   /* outlives the model (the CPU backend reads the mapped files) */
    model_t *model;
    kvpool_t *pool;               /* [n_blocks][layers][2][block_size][kv_heads][head_dim] kv_dtype */
    float *kv_scales;             /* host [layers][2][kv_heads]: the fp8 pool's scales; NULL: none (1) */
    int kv_scales_from;           /* where they came from: KV_SCALES_CHECKPOINT, _CALIBRATE or _ONE */
    float *logits;                /* host [logit_rows][vocab_size]: where forwards put their logits */
    int logit_rows;
    size_t mem_at_start;          /* device memory free before the weights (0: the backend cannot tell) */
} engine_t;

/* DT_COUNT dtypes (the config's, auto), everything else zero. */
void engine_spec_default(engine_spec_t *spec);

/* Reads model_dir's config (config.json, generation_config.json): NULL with the error naming the
 * file and key (always the model's fault, or out of memory). */
engine_t *engine_new(const char *model_dir, char *err, size_t errlen);
/* Opens the backend, checks the KV dtype, opens the checkpoint, loads the weights, makes the pool
 * and the logits buffer. On an error, what was opened stays for engine_destroy to free. */
engine_status_t engine_load(engine_t *e, const engine_spec_t *spec, char *err, size_t errlen);
/* engine_new then engine_load; NULL with *status (may be NULL) and err on an error. */
engine_t *engine_open(const char *model_dir, const engine_spec_t *spec, engine_status_t *status, char *err,
                      size_t errlen);
void engine_destroy(engine_t **self_p);

#endif
