/* engine/checkpoint.h — the weights of a model, by tensor name, with their shapes checked.
 *
 * A checkpoint is either a Hugging Face model directory (model.safetensors, or the shards listed in
 * model.safetensors.index.json, memory-mapped read-only) or the 'dummy' load format: no files,
 * every tensor is made on its first ckpt_expect with deterministic random values. Dummy values
 * depend only on (seed, tensor name, shape), never on the order of calls, so two processes (a
 * prefill and a decode actor, or expert-parallel workers loading different experts) that use the
 * same seed see the same weights.
 *
 * Data pointers stay valid until ckpt_destroy. Mapped data may be unaligned: read it with memcpy or
 * dtype_to_f32, never by casting to float *. Tensors are in the checkpoint's own dtype (a view's
 * dtype), which need not match config.dtype.
 *
 * Known limit: a mapped file that another process truncates while we run raises SIGBUS. */
#ifndef TROUPE_ENGINE_CHECKPOINT_H
#define TROUPE_ENGINE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

typedef struct ckpt ckpt_t;
typedef struct tensor_view {
    const char *name;
    dtype_t dtype;
    int ndim;                     /* 0..4 (ckpt_open refuses files holding tensors of higher rank) */
    int64_t shape[4];
    const void *data;             /* may be unaligned */
    size_t nbytes;
} tensor_view_t;

/* model.safetensors or the sharded index; mmap, read-only. Every file is validated completely. */
ckpt_t *ckpt_open(const char *model_dir, char *err, size_t errlen);
/* The 'dummy' load format: tensors appear on first ckpt_expect. NULL for a dtype out of range. */
ckpt_t *ckpt_dummy(dtype_t dtype, uint64_t seed);
/* Returns the named tensor after checking its shape is exactly shape[0..ndim) (error names the tensor,
 * the file and both shapes). For a dummy checkpoint it creates deterministic random data of that shape
 * (uniform in [-scale, scale], scale = 1/sqrt(shape[ndim-1]) for matrices and other tensors, 1.0 +- 0.1
 * for 1-D tensors whose name ends in "norm.weight" — real-shaped numbers that keep activations finite);
 * a later expect of the same name must give the same shape. NULL with err set on any mismatch. */
const tensor_view_t *ckpt_expect(ckpt_t *c, const char *name, int ndim, const int64_t *shape, char *err, size_t errlen);
/* 1 when the tensor is present (e.g. lm_head.weight absent when tied). A dummy checkpoint has only
 * the tensors already made by ckpt_expect. */
int  ckpt_has(const ckpt_t *c, const char *name);
/* The caller is done with t's bytes (a backend copied them to the device): a dummy tensor's data
 * is freed now, not at destroy, so a GPU worker never holds the whole model in host memory; a
 * later ckpt_expect of the name makes the same values again. Mapped file data is left alone. */
void ckpt_drop(ckpt_t *c, const tensor_view_t *t);

/* How a dummy tensor's values are made (kernels/dummy_fill.h): element i is dummy_value(key, i,
 * center, scale) rounded to dtype. */
typedef struct ckpt_dummy_recipe {
    dtype_t dtype;
    uint64_t key;
    float center, scale;
} ckpt_dummy_recipe_t;
/* ckpt_expect for a caller that can make a dummy tensor's values itself (a backend that fills
 * device memory): for a dummy checkpoint *recipe says how, and a tensor not made yet gets no host
 * data (t->data NULL; the view has its dtype, shape and nbytes); for a checkpoint of files it is
 * ckpt_expect and *recipe is untouched. */
const tensor_view_t *ckpt_expect_recipe(ckpt_t *c, const char *name, int ndim, const int64_t *shape,
                                        ckpt_dummy_recipe_t *recipe, char *err, size_t errlen);
void ckpt_destroy(ckpt_t **self_p);

/* Additions beyond the model's needs: listing and description. */
int ckpt_count(const ckpt_t *c);                                   /* number of tensors (dummy: made so far) */
const tensor_view_t *ckpt_at(const ckpt_t *c, int i);              /* i in [0, ckpt_count); sorted by name for files */
const tensor_view_t *ckpt_get(const ckpt_t *c, const char *name);  /* no shape check; NULL when absent */
const char *ckpt_file_of(const ckpt_t *c, const char *name);       /* the file holding it ("dummy" for dummy); NULL when absent */
int ckpt_is_dummy(const ckpt_t *c);

#endif
