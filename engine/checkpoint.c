/* engine/checkpoint.c — tensors by name from safetensors files, or made up for the dummy format.
 *
 * Files: every shard is mapped and validated completely at open, and the index is cross-checked
 * against the shards in both directions (each listed tensor is where the index says; no shard holds
 * a tensor the index does not give to it), so a lying or stale index fails at start-up rather than
 * loading the wrong bytes. Shard names from the index may not leave the model directory.
 *
 * Dummy: values come from a counter-based generator keyed by (seed, name), so they do not depend on
 * the order tensors are asked for, and large tensors are filled in parallel. */
#include "engine/checkpoint.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"
#include "engine/safetensors.h"
#include "kernels/dummy_fill.h"

#define CKPT_MAX_INDEX (256u << 20)  /* an index.json of a 1T-parameter model is a few MB */

typedef struct {
    tensor_view_t view;
    int file;                     /* index into files[], -1 for dummy */
    int real_ndim;                /* the stored rank (view.ndim caps at 4) */
    void *owned;                  /* dummy data, freed at destroy */
} entry_t;

struct ckpt {
    char *where;                  /* the model directory (or file), or "dummy", for messages */
    st_file_t **files;            /* [n_files] mapped shards */
    int n_files;
    entry_t **entries;            /* [n] stable pointers: views handed out must not move */
    int n, cap;
    int *slots;                   /* open-addressing hash: entry index or -1; size n_slots (power of 2) */
    int n_slots;
    int dummy;
    dtype_t dummy_dtype;
    uint64_t seed;
};

/* ---- name -> entry hash ---- */

static uint64_t s_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int s_find(const ckpt_t *c, const char *name)
{
    if (!c->n_slots)
        return -1;
    for (size_t i = s_hash(name) & (size_t)(c->n_slots - 1);; i = (i + 1) & (size_t)(c->n_slots - 1)) {
        int e = c->slots[i];
        if (e < 0)
            return -1;
        if (strcmp(c->entries[e]->view.name, name) == 0)
            return e;
    }
}

static int s_rehash(ckpt_t *c, int n_slots)
{
    int *slots = malloc((size_t)n_slots * sizeof *slots);
    if (!slots)
        return -1;
    for (int i = 0; i < n_slots; i++)
        slots[i] = -1;
    for (int e = 0; e < c->n; e++) {
        size_t i = s_hash(c->entries[e]->view.name) & (size_t)(n_slots - 1);
        while (slots[i] >= 0)
            i = (i + 1) & (size_t)(n_slots - 1);
        slots[i] = e;
    }
    free(c->slots);
    c->slots = slots;
    c->n_slots = n_slots;
    return 0;
}

/* Appends e and indexes it (load factor kept under 1/2). */
static int s_add(ckpt_t *c, entry_t *e)
{
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 64;
        entry_t **ne = realloc(c->entries, (size_t)cap * sizeof *ne);
        if (!ne)
            return -1;
        c->entries = ne;
        c->cap = cap;
    }
    c->entries[c->n++] = e;
    if (2 * c->n > c->n_slots)
        return s_rehash(c, c->n_slots ? c->n_slots * 2 : 128);
    size_t i = s_hash(e->view.name) & (size_t)(c->n_slots - 1);
    while (c->slots[i] >= 0)
        i = (i + 1) & (size_t)(c->n_slots - 1);
    c->slots[i] = c->n - 1;
    return 0;
}

/* ---- open ---- */

static ckpt_t *s_new(const char *where)
{
    ckpt_t *c = calloc(1, sizeof *c);
    if (!c || !(c->where = strdup(where))) {
        free(c);
        return NULL;
    }
    return c;
}

static int s_add_file(ckpt_t *c, st_file_t **fp, char *err, size_t errlen)
{
    st_file_t **nf = realloc(c->files, (size_t)(c->n_files + 1) * sizeof *nf);
    if (!nf)
        return errf(err, errlen, "%s: out of memory", st_name(*fp));
    c->files = nf;
    c->files[c->n_files++] = *fp;
    *fp = NULL;
    return 0;
}

/* Makes entries for every tensor of files[fi] (names are unique within a file by construction). */
static int s_index_file(ckpt_t *c, int fi, char *err, size_t errlen)
{
    const st_file_t *f = c->files[fi];
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        int prev = s_find(c, t->name);
        if (prev >= 0)
            return errf(err, errlen, "%s: tensor '%s' is also in %s", st_name(f), t->name,
                        st_name(c->files[c->entries[prev]->file]));
        if (t->ndim > 4)
            return errf(err, errlen, "%s: tensor '%s' has %d dimensions (at most 4 supported)", st_name(f), t->name,
                        t->ndim);
        entry_t *e = calloc(1, sizeof *e);
        if (!e)
            return errf(err, errlen, "%s: out of memory", st_name(f));
        e->view.name = t->name;
        e->view.dtype = t->dtype;
        e->view.ndim = t->ndim;
        memcpy(e->view.shape, t->shape, sizeof e->view.shape);
        e->view.data = t->data;
        e->view.nbytes = t->nbytes;
        e->file = fi;
        e->real_ndim = t->ndim;
        if (s_add(c, e) != 0) {
            free(e);
            return errf(err, errlen, "%s: out of memory", st_name(f));
        }
    }
    return 0;
}

static int s_is_file(const char *path) { struct stat sb; return stat(path, &sb) == 0 && S_ISREG(sb.st_mode); }

/* A shard name from the index: a plain file name inside the model directory. */
static int s_safe_shard_name(const char *s)
{
    return s[0] && strchr(s, '/') == NULL && strchr(s, '\\') == NULL && strstr(s, "..") == NULL;
}

static int s_read_small(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > CKPT_MAX_INDEX) {
        fclose(fp);
        return errf(err, errlen, "%s: not a regular file of at most %u bytes", path, CKPT_MAX_INDEX);
    }
    *len = (size_t)sb.st_size;
    *buf = malloc(*len ? *len : 1);
    if (!*buf || fread(*buf, 1, *len, fp) != *len) {
        free(*buf);
        *buf = NULL;
        fclose(fp);
        return errf(err, errlen, "%s: read failed", path);
    }
    fclose(fp);
    return 0;
}

static int s_cmp_entry(const void *a, const void *b)
{
    return strcmp((*(entry_t *const *)a)->view.name, (*(entry_t *const *)b)->view.name);
}

static int s_open_sharded(ckpt_t *c, const char *dir, const char *index_path, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    if (s_read_small(index_path, &buf, &len, err, errlen) != 0)
        return -1;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    int rc = -1;
    json_t *names = NULL;
    if (!root) {
        errf(err, errlen, "%s: not valid JSON (line %d, column %d: %s)", index_path, jerr.line, jerr.column, jerr.text);
        goto out;
    }
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        errf(err, errlen, "%s: \"weight_map\" missing, empty or not an object", index_path);
        goto out;
    }
    /* The distinct shard names, each opened once, in first-seen order. */
    names = json_object();
    const char *tname;
    json_t *fv;
    json_object_foreach(wm, tname, fv) {
        if (!json_is_string(fv) || !s_safe_shard_name(json_string_value(fv))) {
            errf(err, errlen, "%s: \"weight_map\" entry for '%s' is not a plain file name in the model directory",
                 index_path, tname);
            goto out;
        }
        const char *shard = json_string_value(fv);
        if (json_object_get(names, shard))
            continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, shard) >= sizeof path) {
            errf(err, errlen, "%s: path of shard '%s' too long", index_path, shard);
            goto out;
        }
        st_file_t *f = st_open(path, err, errlen);
        if (!f || s_add_file(c, &f, err, errlen) != 0) {
            st_destroy(&f);
            goto out;
        }
        json_object_set_new(names, shard, json_integer(c->n_files - 1));
        if (s_index_file(c, c->n_files - 1, err, errlen) != 0)
            goto out;
    }
    /* Both directions: the index's claims hold, and the shards hold nothing else. */
    json_object_foreach(wm, tname, fv) {
        int fi = (int)json_integer_value(json_object_get(names, json_string_value(fv)));
        int e = s_find(c, tname);
        if (e < 0) {
            errf(err, errlen, "%s: index maps tensor '%s' to %s, which does not contain it", index_path, tname,
                 json_string_value(fv));
            goto out;
        }
        if (c->entries[e]->file != fi) {
            errf(err, errlen, "%s: index maps tensor '%s' to %s, but it is in %s", index_path, tname,
                 json_string_value(fv), st_name(c->files[c->entries[e]->file]));
            goto out;
        }
    }
    for (int e = 0; e < c->n; e++)
        if (!json_object_get(wm, c->entries[e]->view.name)) {
            errf(err, errlen, "%s: shard %s holds tensor '%s', which the index does not list", index_path,
                 st_name(c->files[c->entries[e]->file]), c->entries[e]->view.name);
            goto out;
        }
    rc = 0;
out:
    json_decref(names);
    json_decref(root);
    return rc;
}

ckpt_t *ckpt_open(const char *model_dir, char *err, size_t errlen)
{
    ckpt_t *c = s_new(model_dir);
    if (!c) {
        errf(err, errlen, "%s: out of memory", model_dir);
        return NULL;
    }
    char single[4096], index[4096];
    if ((size_t)snprintf(single, sizeof single, "%s/model.safetensors", model_dir) >= sizeof single ||
        (size_t)snprintf(index, sizeof index, "%s/model.safetensors.index.json", model_dir) >= sizeof index) {
        errf(err, errlen, "%s: path too long", model_dir);
        goto fail;
    }
    const char *one = s_is_file(model_dir) ? model_dir : s_is_file(single) ? single : NULL;
    if (one) {
        st_file_t *f = st_open(one, err, errlen);
        if (!f || s_add_file(c, &f, err, errlen) != 0 || s_index_file(c, 0, err, errlen) != 0) {
            st_destroy(&f);
            goto fail;
        }
    } else if (s_is_file(index)) {
        if (s_open_sharded(c, model_dir, index, err, errlen) != 0)
            goto fail;
    } else {
        errf(err, errlen, "%s: no model.safetensors or model.safetensors.index.json", model_dir);
        goto fail;
    }
    /* Listing order is by name, whatever the shard layout; rebuild the hash for the new order. */
    qsort(c->entries, (size_t)c->n, sizeof *c->entries, s_cmp_entry);
    if (c->n && s_rehash(c, c->n_slots) != 0) {
        errf(err, errlen, "%s: out of memory", model_dir);
        goto fail;
    }
    return c;
fail:
    ckpt_destroy(&c);
    return NULL;
}

/* ---- dummy ---- */

ckpt_t *ckpt_dummy(dtype_t dtype, uint64_t seed)
{
    if ((unsigned)dtype >= DT_WEIGHT_COUNT)
        return NULL;
    ckpt_t *c = s_new("dummy");
    if (!c)
        return NULL;
    c->dummy = 1;
    c->dummy_dtype = dtype;
    c->seed = seed;
    return c;
}


static int s_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Element i is a pure function of (key, i): uniform in [center - scale, center + scale). */
static void s_fill(void *dst, dtype_t dt, size_t numel, uint64_t key, float center, float scale)
{
    uint8_t *p = dst;
    size_t esz = dtype_size(dt);
#pragma omp parallel for schedule(static) if (numel > (1u << 16))
    for (size_t i = 0; i < numel; i++) {
        float v = dummy_value(key, i, center, scale);
        dtype_from_f32(dt, &v, p + i * esz, 1);
    }
}

/* How dummy tensor `name` is made: a pure function of the name, the seed and the shape. */
static void s_dummy_recipe(const ckpt_t *c, const char *name, int ndim, const int64_t *shape, ckpt_dummy_recipe_t *r)
{
    int norm = ndim == 1 && s_ends_with(name, "norm.weight");
    r->dtype = c->dummy_dtype;
    r->key = dummy_mix(c->seed ^ s_hash(name));
    r->center = norm ? 1.0f : 0.0f;
    r->scale = norm ? 0.1f : ndim > 0 && shape[ndim - 1] > 0 ? 1.0f / sqrtf((float)shape[ndim - 1]) : 1.0f;
}

static void s_dummy_fill(const ckpt_t *c, const char *name, int ndim, const int64_t *shape, void *data, size_t numel)
{
    ckpt_dummy_recipe_t r;
    s_dummy_recipe(c, name, ndim, shape, &r);
    s_fill(data, r.dtype, numel, r.key, r.center, r.scale);
}

/* A dummy tensor's entry, with its values (with_data) or without (a caller makes them). */
static const tensor_view_t *s_dummy_make(ckpt_t *c, const char *name, int ndim, const int64_t *shape, int with_data,
                                         char *err, size_t errlen)
{
    size_t numel = 1, nbytes;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(numel, (size_t)shape[i], &numel)) {
            errf(err, errlen, "dummy: tensor '%s': shape overflows", name);
            return NULL;
        }
    if (__builtin_mul_overflow(numel, dtype_size(c->dummy_dtype), &nbytes)) {
        errf(err, errlen, "dummy: tensor '%s': shape overflows", name);
        return NULL;
    }
    entry_t *e = calloc(1, sizeof *e);
    char *nm = strdup(name);
    void *data = NULL;
    if (!e || !nm || (with_data && posix_memalign(&data, 64, nbytes ? nbytes : 64) != 0)) {
        free(e);
        free(nm);
        errf(err, errlen, "dummy: out of memory for tensor '%s' (%zu bytes)", name, nbytes);
        return NULL;
    }
    if (with_data)
        s_dummy_fill(c, name, ndim, shape, data, numel);
    e->view.name = nm;
    e->view.dtype = c->dummy_dtype;
    e->view.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->view.shape[i] = shape[i];
    e->view.data = data;
    e->view.nbytes = nbytes;
    e->file = -1;
    e->real_ndim = ndim;
    e->owned = data;
    if (s_add(c, e) != 0) {
        free(data);
        free(nm);
        free(e);
        errf(err, errlen, "dummy: out of memory for tensor '%s'", name);
        return NULL;
    }
    return &e->view;
}

/* ---- lookup ---- */

const tensor_view_t *ckpt_expect(ckpt_t *c, const char *name, int ndim, const int64_t *shape, char *err,
                                 size_t errlen)
{
    char want[160], have[160];
    if (ndim < 0 || ndim > 4) {
        errf(err, errlen, "%s: tensor '%s': expected rank %d is not in [0, 4]", c->where, name, ndim);
        return NULL;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) {
            errf(err, errlen, "%s: tensor '%s': expected shape has a negative dimension", c->where, name);
            return NULL;
        }
    int e = s_find(c, name);
    if (e < 0) {
        if (c->dummy)
            return s_dummy_make(c, name, ndim, shape, 1, err, errlen);
        errf(err, errlen, "%s: tensor '%s' not found (expected shape %s)", c->where, name,
             st_shape_str(shape, ndim, want, sizeof want));
        return NULL;
    }
    entry_t *en = c->entries[e];
    int same = en->real_ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = en->view.shape[i] == shape[i];
    if (!same) {
        const st_tensor_t *t = en->file >= 0 ? st_find(c->files[en->file], name) : NULL;
        errf(err, errlen, "%s: tensor '%s' has shape %s, expected %s",
             en->file >= 0 ? st_name(c->files[en->file]) : "dummy", name,
             t ? st_shape_str(t->shape, t->ndim, have, sizeof have)
               : st_shape_str(en->view.shape, en->view.ndim, have, sizeof have),
             st_shape_str(shape, ndim, want, sizeof want));
        return NULL;
    }
    if (en->file < 0 && !en->view.data) {   /* a dropped dummy tensor: made again, same values */
        void *data = NULL;
        if (posix_memalign(&data, 64, en->view.nbytes ? en->view.nbytes : 64) != 0) {
            errf(err, errlen, "dummy: out of memory for tensor '%s' (%zu bytes)", name, en->view.nbytes);
            return NULL;
        }
        size_t numel = en->view.nbytes / dtype_size(c->dummy_dtype);
        s_dummy_fill(c, name, ndim, shape, data, numel);
        en->view.data = en->owned = data;
    }
    return &en->view;
}

const tensor_view_t *ckpt_expect_recipe(ckpt_t *c, const char *name, int ndim, const int64_t *shape,
                                        ckpt_dummy_recipe_t *recipe, char *err, size_t errlen)
{
    if (!c->dummy || ndim < 0 || ndim > 4)
        return ckpt_expect(c, name, ndim, shape, err, errlen);
    int e = s_find(c, name);
    const tensor_view_t *t = NULL;
    if (e < 0) {
        /* Only the entry (name, shape), without data: a later ckpt_expect makes the bytes, like a
         * dropped tensor's. */
        t = s_dummy_make(c, name, ndim, shape, 0, err, errlen);
    } else {
        const entry_t *en = c->entries[e];
        int same = en->real_ndim == ndim;
        for (int i = 0; same && i < ndim; i++)
            same = en->view.shape[i] == shape[i];
        t = same ? &en->view : ckpt_expect(c, name, ndim, shape, err, errlen);   /* the mismatch's error */
    }
    if (t)
        s_dummy_recipe(c, name, ndim, shape, recipe);
    return t;
}

void ckpt_drop(ckpt_t *c, const tensor_view_t *t)
{
    int e = t && t->name ? s_find(c, t->name) : -1;
    if (e < 0 || c->entries[e]->file >= 0 || &c->entries[e]->view != t)
        return;
    free(c->entries[e]->owned);
    c->entries[e]->owned = NULL;
    c->entries[e]->view.data = NULL;
}

int ckpt_has(const ckpt_t *c, const char *name) { return s_find(c, name) >= 0; }

const tensor_view_t *ckpt_get(const ckpt_t *c, const char *name)
{
    int e = s_find(c, name);
    return e >= 0 ? &c->entries[e]->view : NULL;
}

const char *ckpt_file_of(const ckpt_t *c, const char *name)
{
    int e = s_find(c, name);
    if (e < 0)
        return NULL;
    return c->entries[e]->file >= 0 ? st_name(c->files[c->entries[e]->file]) : "dummy";
}

int ckpt_count(const ckpt_t *c) { return c->n; }

const tensor_view_t *ckpt_at(const ckpt_t *c, int i) { return i >= 0 && i < c->n ? &c->entries[i]->view : NULL; }

int ckpt_is_dummy(const ckpt_t *c) { return c->dummy; }

void ckpt_destroy(ckpt_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ckpt_t *c = *self_p;
    for (int i = 0; i < c->n; i++) {
        if (c->entries[i]->owned) {
            free(c->entries[i]->owned);
            free((char *)c->entries[i]->view.name);
        }
        free(c->entries[i]);
    }
    free(c->entries);
    free(c->slots);
    for (int i = 0; i < c->n_files; i++)
        st_destroy(&c->files[i]);
    free(c->files);
    free(c->where);
    free(c);
    *self_p = NULL;
}
