/* messages/msg_schema.h — private: the field descriptor tables that drive the one generic codec.
 *
 * Each message type (and each nested struct) is a schema: a list of fields, each with its wire
 * key, kind, offset in the C struct, limits and, for nested structs, the nested schema. Encode,
 * decode, validate, equality, print and JSON each walk these tables; none knows a message type. */
#ifndef TROUPE_MSG_SCHEMA_H
#define TROUPE_MSG_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "messages/msg.h"

/* Order matters: the scalar kinds come first; every kind from MSG_F_STR on holds a pointer,
 * except MSG_F_STRUCT (an embedded struct). */
typedef enum msg_fkind {
    MSG_F_BOOL,        /* bool */
    MSG_F_U32,         /* uint32_t in [lo, hi] */
    MSG_F_U64,         /* uint64_t in [lo, hi] */
    MSG_F_I64,         /* int64_t in [ilo, ihi] */
    MSG_F_F32,         /* float, finite, in [flo, fhi] */
    MSG_F_F64,         /* double, finite, in [flo, fhi] */
    MSG_F_ENUM,        /* C enum (unsigned int) in [lo, hi); names[] has hi entries */
    MSG_F_STR,         /* const char *, NUL-terminated UTF-8, length in [lo, hi] bytes */
    MSG_F_BIN,         /* const uint8_t * + uint32_t length at count_off, length <= hi */
    MSG_F_U32_ARR,     /* const uint32_t * + uint32_t count; count in [lo, hi] */
    MSG_F_U64_ARR,     /* const uint64_t * + count */
    MSG_F_F32_ARR,     /* const float * + count; elements finite in [flo, fhi] */
    MSG_F_STR_ARR,     /* const char *const * + count; each string length in [elo, ehi] */
    MSG_F_STRUCT,      /* nested struct at off, wire map of schema sub */
    MSG_F_STRUCT_ARR,  /* const T * + count, each a map of schema sub */
} msg_fkind_t;

/* Required: the key must be on the wire; a string must be non-NULL; an array non-empty. Arrays
 * and strings that are absent (count 0 / NULL) are simply not encoded. */
#define MSG_FIELD_REQ 1u

typedef struct msg_schema msg_schema_t;

typedef struct msg_field {
    const char *key;
    msg_fkind_t kind;
    unsigned flags;
    size_t off;                 /* value, pointer or nested struct */
    size_t count_off;           /* arrays and bin: the uint32_t count */
    uint64_t lo, hi;            /* integer range, string bytes, array count, enum count */
    int64_t ilo, ihi;           /* MSG_F_I64 range */
    double flo, fhi;            /* float range (value or each element) */
    uint32_t elo, ehi;          /* MSG_F_STR_ARR: bytes of each string */
    const msg_schema_t *sub;    /* MSG_F_STRUCT, MSG_F_STRUCT_ARR */
    const char *const *names;   /* MSG_F_ENUM: hi names */
} msg_field_t;

struct msg_schema {
    const char *name;           /* type name, or the nested struct's name */
    size_t size;                /* sizeof the C struct */
    const msg_field_t *fields;
    unsigned n_fields;          /* <= 64: decode tracks seen keys in a bitmask */
    void (*defaults)(void *s);  /* after zeroing; NULL = all zero */
    /* Cross-field rules after every field passed; path names the struct ("submit"). */
    int (*check)(const void *s, const char *path, char *err, size_t errlen);
};

/* Schema of a message type's payload (in msg_t.u); NULL for MSG_NONE or out of range. */
const msg_schema_t *msg_schema_of(msg_type_t t);
/* Zeroes a struct and applies defaults, nested structs included. */
void msg_schema_init(const msg_schema_t *s, void *base);
/* Size in bytes of one element of an array field. */
size_t msg_field_elem_size(const msg_field_t *f);

/* Absent strings (NULL) and empty arrays/bin are left off the wire and out of print/JSON;
 * scalars and nested structs are always present. */
bool msg_field_present(const msg_field_t *f, const void *base);

/* Reads a MSG_F_ENUM field (every enum here is stored as unsigned int). */
unsigned msg_field_get_enum(const void *base, const msg_field_t *f);
/* The enum's name for value v, or NULL if v is out of range. */
const char *msg_field_enum_name(const msg_field_t *f, unsigned v);

/* A field path for error messages: "submit.sampling.stop[2]". push returns the mark to pop to. */
typedef struct msg_path {
    char s[192];
    size_t n;
} msg_path_t;
void msg_path_init(msg_path_t *p, const char *root);
size_t msg_path_push(msg_path_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* push(".key") and push("[%u]") without printf: they run for every field and element of every
 * message (init once per message: also without printf). */
size_t msg_path_key(msg_path_t *p, const char *key);
size_t msg_path_index(msg_path_t *p, uint32_t i);
void msg_path_pop(msg_path_t *p, size_t mark);

/* The value-level rules, shared by decode (before storing) and validate, so both report alike. */
int msg_check_uint(const msg_field_t *f, uint64_t v, const char *path, char *err, size_t errlen);
int msg_check_i64(const msg_field_t *f, int64_t v, const char *path, char *err, size_t errlen);
int msg_check_float(const msg_field_t *f, double v, const char *path, char *err, size_t errlen);
int msg_check_enum(const msg_field_t *f, uint64_t v, const char *path, char *err, size_t errlen);
/* A string of n bytes (already known not to hold NUL) against [lo, hi] and UTF-8. */
int msg_check_str(const char *s, size_t n, uint64_t lo, uint64_t hi, const char *path, char *err,
                  size_t errlen);
/* An array or bin count against [lo, hi]; count 0 only matters if the field is required. */
int msg_check_count(const msg_field_t *f, uint64_t n, const char *path, char *err, size_t errlen);

/* Pointer to a field's storage. */
#define MSG_AT(base, off) ((void *)((char *)(base) + (off)))
#define MSG_CAT(base, off) ((const void *)((const char *)(base) + (off)))

/* Shared by the checkers: a (possibly NULL) string of at most max bytes; its length, or
 * max + 1 if longer. */
size_t msg_strnlen(const char *s, size_t max);
/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF) and no NUL byte. */
bool msg_utf8_ok(const char *s, size_t n);

#endif
