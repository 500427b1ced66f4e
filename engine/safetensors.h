/* engine/safetensors.h — a validated view of one .safetensors file (or an in-memory image).
 *
 * Format: an 8-byte little-endian header length N, N bytes of JSON, then the data region.
 * Validated as the reference implementation does, before anything is trusted: the file is at least
 * 8 bytes; N <= 100,000,000 and 8 + N <= the file size; the header starts with '{' and is valid
 * UTF-8 JSON (an object; duplicate keys are refused); "__metadata__", when present, maps strings to
 * strings; every tensor has a dtype, a shape of non-negative integers whose byte size does not
 * overflow, and data_offsets [begin, end] with begin <= end <= the data size and end - begin ==
 * product(shape) x dtype size; sorted by offset, the tensors cover the data region exactly — no
 * gap, no overlap, nothing left over at the end.
 *
 * F32, BF16 and F16 tensors are accepted, and F8_E4M3, I8, U8, I32 and I64 for quantized weights
 * (engine/quant.h); any other dtype is an "unsupported dtype" error that names the tensor. At most ST_MAX_DIMS dimensions. Data pointers may be unaligned. */
#ifndef TROUPE_ENGINE_SAFETENSORS_H
#define TROUPE_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

#define ST_MAX_HEADER 100000000ull  /* the reference implementation's limit on N */
#define ST_MAX_DIMS 8

typedef struct st_tensor {
    const char *name;             /* owned by the st_file */
    dtype_t dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;          /* byte offsets into the data region */
    const void *data;             /* start of this tensor's bytes; may be unaligned */
    size_t nbytes;                /* end - begin */
} st_tensor_t;

typedef struct st_file st_file_t;

/* Maps path read-only and validates it; the error starts with the path. */
st_file_t *st_open(const char *path, char *err, size_t errlen);
/* Validates an in-memory image of len bytes. The result borrows buf (it must outlive the st_file);
 * name_for_errors starts every error message. Used by st_open and by the fuzzer. */
st_file_t *st_parse(const void *buf, size_t len, const char *name_for_errors, char *err, size_t errlen);
void st_destroy(st_file_t **self_p);

int st_count(const st_file_t *f);
const st_tensor_t *st_at(const st_file_t *f, int i);                 /* sorted by name */
const st_tensor_t *st_find(const st_file_t *f, const char *name);    /* NULL when absent */
const char *st_metadata(const st_file_t *f, const char *key);        /* "__metadata__"[key] or NULL */
const char *st_name(const st_file_t *f);                             /* path or name_for_errors */

/* Formats shape as "[2, 3]" into buf (always terminated); returns buf. */
char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t buflen);

#endif
