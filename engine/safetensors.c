/* engine/safetensors.c — parse and validate a .safetensors image; mmap files read-only.
 *
 * Everything in the file is untrusted: each number is range-checked before it is used for
 * arithmetic, and the data region is checked to be tiled exactly by the tensors (as the reference
 * implementation does) so that no two tensors alias and no byte is unaccounted for. The header's
 * JSON is parsed by jansson, which also rejects invalid UTF-8 and NUL characters in strings.
 *
 * Known limit: a mapped file that is truncated by another process while mapped raises SIGBUS on
 * access; model files are expected to be immutable while served. */
#include "engine/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

struct st_file {
    char *name;                   /* path or name_for_errors, for messages */
    json_t *header;               /* the parsed header; tensor names and metadata point into it */
    st_tensor_t *tensors;         /* [n] sorted by name */
    int n;
    void *map;                    /* the mapping when opened from a file, else NULL */
    size_t map_len;
};

/* The reference implementation's dtype names. F8_E4M3, I8, U8, I32 and I64 hold quantized weights'
 * codes, scales, packed nibbles and shapes (engine/quant.h); the model refuses them where it wants a
 * plain weight. */
static const struct { const char *name; int supported; dtype_t dt; } s_dtypes[] = {
    {"F32", 1, DT_F32}, {"BF16", 1, DT_BF16}, {"F16", 1, DT_F16},
    {"BOOL", 0, 0}, {"U8", 1, DT_U8}, {"I8", 1, DT_I8}, {"I16", 0, 0}, {"U16", 0, 0}, {"I32", 1, DT_I32},
    {"U32", 0, 0}, {"I64", 1, DT_I64}, {"U64", 0, 0}, {"F64", 0, 0}, {"C64", 0, 0}, {"F8_E5M2", 0, 0},
    {"F8_E4M3", 1, DT_F8E4M3}, {"F8_E8M0", 0, 0}, {"F4", 0, 0}, {"F6_E2M3", 0, 0}, {"F6_E3M2", 0, 0},
};

char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t buflen)
{
    size_t off = 0;
    if (!buflen)
        return buf;
    buf[0] = '\0';
    off += (size_t)snprintf(buf + off, buflen - off, "[");
    for (int i = 0; i < ndim && off < buflen; i++)
        off += (size_t)snprintf(buf + off, buflen - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < buflen)
        snprintf(buf + off, buflen - off, "]");
    return buf;
}

static int s_cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor_t *)a)->name, ((const st_tensor_t *)b)->name);
}

static int s_cmp_offset(const void *a, const void *b)
{
    const st_tensor_t *x = *(const st_tensor_t *const *)a, *y = *(const st_tensor_t *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Reads a JSON integer that must be >= 0 (jansson already refuses integers beyond int64). */
static int s_nonneg_int(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Fills t from one header entry; checks everything that does not need the other tensors. */
static int s_parse_tensor(const char *fname, const char *name, json_t *info, uint64_t data_len,
                          st_tensor_t *t, char *err, size_t errlen)
{
    if (!json_is_object(info))
        return errf(err, errlen, "%s: tensor '%s': entry is not an object", fname, name);
    t->name = name;

    json_t *dt = json_object_get(info, "dtype");
    if (!json_is_string(dt))
        return errf(err, errlen, "%s: tensor '%s': \"dtype\" missing or not a string", fname, name);
    const char *dts = json_string_value(dt);
    size_t k;
    for (k = 0; k < ARRAY_LEN(s_dtypes); k++)
        if (strcmp(dts, s_dtypes[k].name) == 0)
            break;
    if (k == ARRAY_LEN(s_dtypes) || !s_dtypes[k].supported)
        return errf(err, errlen, "%s: tensor '%s': unsupported dtype '%.32s' (supported: F32, BF16, F16, F8_E4M3, I8, U8, I32, I64)",
                    fname, name, dts);
    t->dtype = s_dtypes[k].dt;

    json_t *shape = json_object_get(info, "shape");
    if (!json_is_array(shape))
        return errf(err, errlen, "%s: tensor '%s': \"shape\" missing or not an array", fname, name);
    if (json_array_size(shape) > ST_MAX_DIMS)
        return errf(err, errlen, "%s: tensor '%s': shape has %zu dimensions (at most %d supported)",
                    fname, name, json_array_size(shape), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    /* A sequential checked product, as the reference does: an overflowing prefix is an error even
     * when a later dimension is 0. */
    uint64_t numel = 1, nbytes = 0;
    int overflow = 0;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d;
        if (s_nonneg_int(json_array_get(shape, (size_t)i), &d) != 0)
            return errf(err, errlen, "%s: tensor '%s': shape[%d] is not a non-negative integer", fname, name, i);
        t->shape[i] = (int64_t)d;
        overflow |= __builtin_mul_overflow(numel, d, &numel);
    }
    if (overflow || __builtin_mul_overflow(numel, (uint64_t)dtype_size(t->dtype), &nbytes)) {
        char sb[256];
        return errf(err, errlen, "%s: tensor '%s': shape %s overflows a 64-bit byte count", fname, name,
                    st_shape_str(t->shape, t->ndim, sb, sizeof sb));
    }

    json_t *offs = json_object_get(info, "data_offsets");
    uint64_t b, e;
    if (!json_is_array(offs) || json_array_size(offs) != 2 || s_nonneg_int(json_array_get(offs, 0), &b) != 0 ||
        s_nonneg_int(json_array_get(offs, 1), &e) != 0)
        return errf(err, errlen, "%s: tensor '%s': \"data_offsets\" must be [begin, end] of non-negative integers",
                    fname, name);
    if (b > e)
        return errf(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] has begin after end", fname, name,
                    (unsigned long long)b, (unsigned long long)e);
    if (e > data_len)
        return errf(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] outside the data region (%llu bytes)",
                    fname, name, (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_len);
    if (e - b != nbytes) {
        char sb[256];
        return errf(err, errlen,
                    "%s: tensor '%s': data_offsets span %llu bytes but shape %s x %s (%zu bytes) needs %llu",
                    fname, name, (unsigned long long)(e - b), st_shape_str(t->shape, t->ndim, sb, sizeof sb),
                    dts, dtype_size(t->dtype), (unsigned long long)nbytes);
    }
    t->begin = b;
    t->end = e;
    t->nbytes = (size_t)(e - b);
    return 0;
}

/* The tensors must tile [0, data_len) exactly: sorted by offset, each begins where the last ended. */
static int s_check_coverage(const st_file_t *f, uint64_t data_len, char *err, size_t errlen)
{
    if (f->n == 0) {
        if (data_len != 0)
            return errf(err, errlen, "%s: no tensors but a data region of %llu bytes", f->name,
                        (unsigned long long)data_len);
        return 0;
    }
    const st_tensor_t **by_off = malloc((size_t)f->n * sizeof *by_off);
    if (!by_off)
        return errf(err, errlen, "%s: out of memory", f->name);
    for (int i = 0; i < f->n; i++)
        by_off[i] = &f->tensors[i];
    qsort(by_off, (size_t)f->n, sizeof *by_off, s_cmp_offset);
    uint64_t at = 0;
    const char *prev = NULL;
    int rc = 0;
    for (int i = 0; i < f->n && rc == 0; i++) {
        const st_tensor_t *t = by_off[i];
        if (t->begin > at)
            rc = errf(err, errlen, "%s: gap in the data region: bytes [%llu, %llu) before tensor '%s' belong to no tensor",
                      f->name, (unsigned long long)at, (unsigned long long)t->begin, t->name);
        else if (t->begin < at)
            rc = errf(err, errlen, "%s: tensor '%s' at data_offsets [%llu, %llu] overlaps tensor '%s' ending at %llu",
                      f->name, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                      prev ? prev : "?", (unsigned long long)at);
        at = t->end;
        prev = t->name;
    }
    if (rc == 0 && at != data_len)
        rc = errf(err, errlen, "%s: the tensors cover %llu bytes of a %llu-byte data region (%llu trailing bytes)",
                  f->name, (unsigned long long)at, (unsigned long long)data_len,
                  (unsigned long long)(data_len - at));
    free(by_off);
    return rc;
}

st_file_t *st_parse(const void *buf, size_t len, const char *name_for_errors, char *err, size_t errlen)
{
    const char *fname = name_for_errors ? name_for_errors : "safetensors";
    const uint8_t *p = buf;
    if (len < 8) {
        errf(err, errlen, "%s: %zu bytes, too short for the 8-byte header length", fname, len);
        return NULL;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[i];
    if (n > ST_MAX_HEADER) {
        errf(err, errlen, "%s: header length %llu exceeds the limit of %llu bytes", fname, (unsigned long long)n,
             ST_MAX_HEADER);
        return NULL;
    }
    if (n > len - 8) {
        errf(err, errlen, "%s: header length %llu runs past the end of the file (%zu bytes)", fname,
             (unsigned long long)n, len);
        return NULL;
    }
    if (n == 0 || p[8] != '{') {
        errf(err, errlen, "%s: header does not start with '{'", fname);
        return NULL;
    }

    st_file_t *f = calloc(1, sizeof *f);
    if (!f || !(f->name = strdup(fname))) {
        free(f);
        errf(err, errlen, "%s: out of memory", fname);
        return NULL;
    }
    json_error_t jerr;
    f->header = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->header) {
        errf(err, errlen, "%s: header is not valid JSON (line %d, column %d: %s)", fname, jerr.line, jerr.column,
             jerr.text);
        goto fail;
    }
    if (!json_is_object(f->header)) {
        errf(err, errlen, "%s: header is not a JSON object", fname);
        goto fail;
    }

    uint64_t data_len = len - 8 - n;
    size_t cap = json_object_size(f->header);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    if (!f->tensors) {
        errf(err, errlen, "%s: out of memory for %zu tensors", fname, cap);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(f->header, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                errf(err, errlen, "%s: \"__metadata__\" is not an object", fname);
                goto fail;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    errf(err, errlen, "%s: \"__metadata__\" value for '%s' is not a string", fname, mk);
                    goto fail;
                }
            }
            continue;
        }
        st_tensor_t *t = &f->tensors[f->n];
        if (s_parse_tensor(fname, key, val, data_len, t, err, errlen) != 0)
            goto fail;
        t->data = p + 8 + n + t->begin;
        f->n++;
    }
    if (s_check_coverage(f, data_len, err, errlen) != 0)
        goto fail;
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, s_cmp_name);
    return f;

fail:
    st_destroy(&f);
    return NULL;
}

st_file_t *st_open(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        errf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        errf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {                 /* also keeps mmap away from an empty file */
        errf(err, errlen, "%s: %zu bytes, too short for the 8-byte header length", path, len);
        close(fd);
        return NULL;
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);                     /* the mapping keeps the file referenced */
    if (map == MAP_FAILED) {
        errf(err, errlen, "%s: cannot mmap %zu bytes: %s", path, len, strerror(errno));
        return NULL;
    }
    st_file_t *f = st_parse(map, len, path, err, errlen);
    if (!f) {
        munmap(map, len);
        return NULL;
    }
    f->map = map;
    f->map_len = len;
    return f;
}

void st_destroy(st_file_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    st_file_t *f = *self_p;
    if (f->map)
        munmap(f->map, f->map_len);
    free(f->tensors);
    if (f->header)
        json_decref(f->header);
    free(f->name);
    free(f);
    *self_p = NULL;
}

int st_count(const st_file_t *f) { return f->n; }

const st_tensor_t *st_at(const st_file_t *f, int i) { return i >= 0 && i < f->n ? &f->tensors[i] : NULL; }

const st_tensor_t *st_find(const st_file_t *f, const char *name)
{
    st_tensor_t key = {.name = name};
    return f->n ? bsearch(&key, f->tensors, (size_t)f->n, sizeof key, s_cmp_name) : NULL;
}

const char *st_metadata(const st_file_t *f, const char *key)
{
    json_t *m = json_object_get(f->header, "__metadata__");
    return m ? json_string_value(json_object_get(m, key)) : NULL;
}

const char *st_name(const st_file_t *f) { return f->name; }
