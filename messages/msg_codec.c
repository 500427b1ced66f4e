/* messages/msg_codec.c — msg_encode / msg_decode: the one table-driven codec, and the arena.
 *
 * Decoding, in order:
 *   1. msg_wire_prescan: frame size, every length/count against the bytes left, depth, element
 *      total, exactly one map and no trailing bytes. Nothing is allocated before this passes.
 *   2. The top-level "v", "t", "id" are read first wherever they sit in the map, so a version
 *      mismatch is reported as such rather than as an unknown key.
 *   3. The type's schema maps each key into the struct: the kind must match, counts and
 *      lengths are checked against the field's limit BEFORE the arena is asked for memory,
 *      values against their range before they are stored, unknown and repeated keys refused.
 *   4. msg_validate runs over the result (required fields, cross-field rules).
 * Any failure frees what was allocated and leaves the msg_t empty.
 *
 * Encoding packs with msgpack-c's packer into the caller's buffer through a writer that refuses
 * to grow, so it never allocates. */
#include <float.h>
#include <math.h>
#include <msgpack.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "messages/msg_schema.h"
#include "messages/msg_wire.h"

/* ---- arena: a chain of chunks owned by the msg_t ---- */

struct msg_arena {
    struct msg_arena *next;
    size_t cap, used;
    size_t total;               /* bytes handed out over the whole chain (kept in the head) */
    alignas(max_align_t) unsigned char data[];
};

#define ARENA_CHUNK (64u << 10)

/* First chunk size for a frame of len bytes: most decoded messages need about the frame's size
 * (strings are copied, small ints widen), so a small frame gets a small chunk. */
static size_t s_first_chunk(size_t len)
{
    size_t c = 2 * len + 256;
    return c < ARENA_CHUNK ? c : ARENA_CHUNK;
}

static void *s_alloc(msg_t *m, size_t n, const char *path, char *err, size_t errlen)
{
    size_t need = (n + 15) & ~(size_t)15;   /* keep every allocation 16-byte aligned */
    struct msg_arena *a = m->arena_;
    size_t total = a ? a->total : 0;
    if (need > MSG_MAX_ARENA || total + need > MSG_MAX_ARENA) {
        errf(err, errlen, "%s: message needs more than %u bytes once decoded", path, MSG_MAX_ARENA);
        return NULL;
    }
    if (!a || a->cap - a->used < need) {
        size_t chunk = a ? ARENA_CHUNK : m->arena_hint_;
        size_t cap = need > chunk ? need : chunk;
        struct msg_arena *c = malloc(sizeof *c + cap);
        if (!c) {
            errf(err, errlen, "%s: out of memory allocating %zu bytes", path, cap);
            return NULL;
        }
        c->next = a;
        c->cap = cap;
        c->used = 0;
        m->arena_ = a = c;
    }
    void *p = a->data + a->used;
    a->used += need;
    a->total = total + need;
    return p;
}

void msg_free(msg_t *m)
{
    if (!m)
        return;
    struct msg_arena *a = m->arena_;
    while (a) {
        struct msg_arena *next = a->next;
        free(a);
        a = next;
    }
    m->arena_ = NULL;
    memset(&m->u, 0, sizeof m->u);
}

void msg_init(msg_t *m, msg_type_t t, uint64_t id)
{
    memset(m, 0, sizeof *m);
    m->type = t;
    m->id = id;
    const msg_schema_t *s = msg_schema_of(t);
    if (s)
        msg_schema_init(s, &m->u);
}

/* ---- field access ---- */

static const void *s_ptr(const void *base, const msg_field_t *f)
{
    const void *p;
    memcpy(&p, MSG_CAT(base, f->off), sizeof p);
    return p;
}

static uint32_t s_count(const void *base, const msg_field_t *f)
{
    uint32_t n;
    memcpy(&n, MSG_CAT(base, f->count_off), sizeof n);
    return n;
}

/* ---- clone ---- */

static int s_clone_struct(msg_t *dst, const msg_schema_t *s, void *base, char *err, size_t errlen);

static void *s_dup(msg_t *dst, const void *src, size_t n, char *err, size_t errlen)
{
    void *p = s_alloc(dst, n, "clone", err, errlen);
    if (p)
        memcpy(p, src, n);
    return p;
}

/* base is already a shallow copy: re-point every pointer at a copy in dst's arena. */
static int s_clone_struct(msg_t *dst, const msg_schema_t *s, void *base, char *err, size_t errlen)
{
    for (unsigned i = 0; i < s->n_fields; i++) {
        const msg_field_t *f = &s->fields[i];
        void *at = MSG_AT(base, f->off);
        if (f->kind == MSG_F_STRUCT) {
            if (s_clone_struct(dst, f->sub, at, err, errlen) < 0)
                return -1;
            continue;
        }
        if (f->kind < MSG_F_STR)                /* scalar: the shallow copy is the copy */
            continue;
        if (!msg_field_present(f, base)) {
            memset(at, 0, sizeof(void *));      /* absent: no stray pointer into src */
            continue;
        }
        const void *src;
        memcpy(&src, at, sizeof src);
        size_t n = f->kind == MSG_F_STR ? strlen(src) + 1 : (size_t)s_count(base, f) * msg_field_elem_size(f);
        void *copy = s_dup(dst, src, n, err, errlen);
        if (!copy)
            return -1;
        memcpy(at, &copy, sizeof copy);
        uint32_t count = f->kind == MSG_F_STR ? 0 : s_count(base, f);
        for (uint32_t k = 0; k < count && f->kind == MSG_F_STR_ARR; k++) {
            const char **strs = copy;
            if (!(strs[k] = s_dup(dst, strs[k], strlen(strs[k]) + 1, err, errlen)))
                return -1;
        }
        for (uint32_t k = 0; k < count && f->kind == MSG_F_STRUCT_ARR; k++)
            if (s_clone_struct(dst, f->sub, (char *)copy + (size_t)k * f->sub->size, err, errlen) < 0)
                return -1;
    }
    return 0;
}

int msg_clone(const msg_t *src, msg_t *dst, char *err, size_t errlen)
{
    msg_init(dst, MSG_NONE, 0);
    if (msg_validate(src, err, errlen) < 0)     /* bounds every strlen below */
        return -1;
    dst->type = src->type;
    dst->id = src->id;
    dst->u = src->u;
    dst->arena_hint_ = 4096;
    if (s_clone_struct(dst, msg_schema_of(src->type), &dst->u, err, errlen) < 0) {
        msg_free(dst);
        msg_init(dst, MSG_NONE, 0);
        return -1;
    }
    return 0;
}

/* ---- encode ---- */

typedef struct s_wbuf {
    uint8_t *buf;
    size_t cap, len;
    bool full;
} s_wbuf_t;

static int s_write(void *data, const char *p, size_t n)
{
    s_wbuf_t *w = data;
    if (w->full || n > w->cap - w->len) {
        w->full = true;
        return -1;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
    return 0;
}

static void s_pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void s_encode_struct(msgpack_packer *pk, const msg_schema_t *s, const void *base, unsigned extra);

static void s_encode_field(msgpack_packer *pk, const msg_field_t *f, const void *base)
{
    const void *at = MSG_CAT(base, f->off);
    switch (f->kind) {
    case MSG_F_BOOL: *(const bool *)at ? msgpack_pack_true(pk) : msgpack_pack_false(pk); return;
    case MSG_F_U32: { uint32_t v; memcpy(&v, at, 4); msgpack_pack_uint64(pk, v); return; }
    case MSG_F_U64: { uint64_t v; memcpy(&v, at, 8); msgpack_pack_uint64(pk, v); return; }
    case MSG_F_I64: { int64_t v; memcpy(&v, at, 8); msgpack_pack_int64(pk, v); return; }
    case MSG_F_F32: { float v; memcpy(&v, at, 4); msgpack_pack_float(pk, v); return; }
    case MSG_F_F64: { double v; memcpy(&v, at, 8); msgpack_pack_double(pk, v); return; }
    case MSG_F_ENUM: msgpack_pack_uint64(pk, msg_field_get_enum(base, f)); return;
    case MSG_F_STR: s_pack_str(pk, s_ptr(base, f)); return;
    case MSG_F_STRUCT: s_encode_struct(pk, f->sub, at, 0); return;
    case MSG_F_BIN:
        msgpack_pack_bin(pk, s_count(base, f));
        msgpack_pack_bin_body(pk, s_ptr(base, f), s_count(base, f));
        return;
    default: break;
    }
    uint32_t n = s_count(base, f);
    const void *p = s_ptr(base, f);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        switch (f->kind) {
        case MSG_F_U32_ARR: msgpack_pack_uint64(pk, ((const uint32_t *)p)[i]); break;
        case MSG_F_U64_ARR: msgpack_pack_uint64(pk, ((const uint64_t *)p)[i]); break;
        case MSG_F_F32_ARR: msgpack_pack_float(pk, ((const float *)p)[i]); break;
        case MSG_F_STR_ARR: s_pack_str(pk, ((const char *const *)p)[i]); break;
        case MSG_F_STRUCT_ARR:
            s_encode_struct(pk, f->sub, (const char *)p + (size_t)i * f->sub->size, 0);
            break;
        default: break;
        }
    }
}

/* extra: pairs the caller writes itself before the fields (the top level's v, t, id). */
static void s_encode_struct(msgpack_packer *pk, const msg_schema_t *s, const void *base, unsigned extra)
{
    unsigned n = extra;
    for (unsigned i = 0; i < s->n_fields; i++)
        n += msg_field_present(&s->fields[i], base);
    msgpack_pack_map(pk, n);
    if (extra)
        return;
    for (unsigned i = 0; i < s->n_fields; i++) {
        if (!msg_field_present(&s->fields[i], base))
            continue;
        s_pack_str(pk, s->fields[i].key);
        s_encode_field(pk, &s->fields[i], base);
    }
}

int msg_encode(const msg_t *m, uint8_t *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (msg_validate(m, err, errlen) < 0)
        return -1;
    const msg_schema_t *s = msg_schema_of(m->type);
    s_wbuf_t w = {.buf = buf, .cap = cap < MSG_MAX_FRAME ? cap : MSG_MAX_FRAME};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &w, s_write);

    s_encode_struct(&pk, s, &m->u, 3);      /* map header only: v, t, id come first */
    s_pack_str(&pk, "v");
    msgpack_pack_uint64(&pk, MSG_VERSION);
    s_pack_str(&pk, "t");
    msgpack_pack_uint64(&pk, (uint64_t)m->type);
    s_pack_str(&pk, "id");
    msgpack_pack_uint64(&pk, m->id);
    for (unsigned i = 0; i < s->n_fields; i++) {
        if (!msg_field_present(&s->fields[i], &m->u))
            continue;
        s_pack_str(&pk, s->fields[i].key);
        s_encode_field(&pk, &s->fields[i], &m->u);
    }
    if (w.full)
        return errf(err, errlen, "%s: encoded message does not fit in %zu bytes%s", s->name, w.cap,
                    w.cap == MSG_MAX_FRAME ? " (the frame limit)" : "");
    *len = w.len;
    return 0;
}

/* ---- decode ---- */

typedef struct s_dec {
    msg_t *m;
    msg_wire_cur_t cur;
    msg_path_t path;
    char *err;
    size_t errlen;
} s_dec_t;

static int s_next(s_dec_t *d, msg_wire_obj_t *o)
{
    return msg_wire_next(&d->cur, o, d->err, d->errlen);
}

static int s_kind_err(s_dec_t *d, const char *want, const msg_wire_obj_t *o)
{
    return errf(d->err, d->errlen, "%s: expected %s, got %s", d->path.s, want, msg_wire_kind_name(o->kind));
}

/* Unknown keys come from outside: print them escaped and shortened. */
static void s_quote_key(const msg_wire_obj_t *o, char *out, size_t cap)
{
    size_t k = 0;
    for (uint32_t i = 0; i < o->n && k + 5 < cap; i++) {
        unsigned char c = o->data[i];
        if (i == 32) {
            k += (size_t)snprintf(out + k, cap - k, "...");
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            out[k++] = (char)c;
        else
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
    }
    out[k < cap ? k : cap - 1] = 0;
}

static bool s_key_is(const msg_wire_obj_t *o, const char *key)
{
    size_t n = strlen(key);
    return o->n == n && memcmp(o->data, key, n) == 0;
}

static char *s_copy_str(s_dec_t *d, const msg_wire_obj_t *o)
{
    char *s = s_alloc(d->m, (size_t)o->n + 1, d->path.s, d->err, d->errlen);
    if (!s)
        return NULL;
    memcpy(s, o->data, o->n);
    s[o->n] = 0;
    return s;
}

static int s_read_str(s_dec_t *d, const msg_wire_obj_t *o, uint64_t lo, uint64_t hi, const char **out)
{
    if (o->kind != MSG_WIRE_STR)
        return s_kind_err(d, "str", o);
    /* Length first: the UTF-8 scan (which also refuses NUL) must not walk an over-long string. */
    if (msg_check_str((const char *)o->data, o->n, lo, hi, d->path.s, d->err, d->errlen) < 0)
        return -1;
    const char *s = s_copy_str(d, o);
    if (!s)
        return -1;
    *out = s;
    return 0;
}

static int s_read_uint(s_dec_t *d, const msg_wire_obj_t *o, uint64_t *v)
{
    if (o->kind == MSG_WIRE_INT)
        return errf(d->err, d->errlen, "%s: %lld is negative", d->path.s, (long long)o->i);
    if (o->kind != MSG_WIRE_UINT)
        return s_kind_err(d, "unsigned int", o);
    *v = o->u;
    return 0;
}

static int s_read_number(s_dec_t *d, const msg_wire_obj_t *o, double *v)
{
    switch (o->kind) {
    case MSG_WIRE_F32: case MSG_WIRE_F64: *v = o->f; return 0;
    case MSG_WIRE_UINT: *v = (double)o->u; return 0;
    case MSG_WIRE_INT: *v = (double)o->i; return 0;
    default: return s_kind_err(d, "number", o);
    }
}

/* Narrowing an out-of-range double to float is undefined behaviour: check first. */
static int s_to_f32(s_dec_t *d, const msg_field_t *f, double v, float *out)
{
    if (!isfinite(v))
        return msg_check_float(f, v, d->path.s, d->err, d->errlen);   /* names NaN/inf */
    if (fabs(v) > FLT_MAX)
        return errf(d->err, d->errlen, "%s: %g outside the float32 range", d->path.s, v);
    *out = (float)v;
    return msg_check_float(f, *out, d->path.s, d->err, d->errlen);
}

static int s_decode_map(s_dec_t *d, const msg_schema_t *s, void *base, uint32_t pairs, bool top);

static int s_decode_array(s_dec_t *d, const msg_field_t *f, void *base, const msg_wire_obj_t *o)
{
    if (o->kind != MSG_WIRE_ARRAY)
        return s_kind_err(d, "array", o);
    uint32_t n = o->n;
    if (msg_check_count(f, n, d->path.s, d->err, d->errlen) < 0)
        return -1;
    void *p = NULL;
    if (n > 0 && !(p = s_alloc(d->m, (size_t)n * msg_field_elem_size(f), d->path.s, d->err, d->errlen)))
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        msg_wire_obj_t e;
        uint64_t u = 0;
        double x = 0;
        if (s_next(d, &e) < 0)
            return -1;
        /* Token ids and hashes come by the hundred thousand: store the common case directly
         * and build the "[i]" path only for an element that is about to be reported. */
        if (e.kind == MSG_WIRE_UINT && f->kind == MSG_F_U64_ARR) {
            ((uint64_t *)p)[i] = e.u;
            continue;
        }
        if (e.kind == MSG_WIRE_UINT && f->kind == MSG_F_U32_ARR && e.u <= UINT32_MAX) {
            ((uint32_t *)p)[i] = (uint32_t)e.u;
            continue;
        }
        if (e.kind == MSG_WIRE_F32 && f->kind == MSG_F_F32_ARR && isfinite(e.f) && e.f >= f->flo &&
            e.f <= f->fhi) {
            ((float *)p)[i] = (float)e.f;  /* exact: it was a float32 on the wire */
            continue;
        }
        size_t mark = msg_path_index(&d->path, i);
        switch (f->kind) {
        case MSG_F_U32_ARR:
            if (s_read_uint(d, &e, &u) < 0)
                return -1;
            if (u > UINT32_MAX)
                return errf(d->err, d->errlen, "%s: %llu does not fit in 32 bits", d->path.s,
                            (unsigned long long)u);
            ((uint32_t *)p)[i] = (uint32_t)u;
            break;
        case MSG_F_U64_ARR:
            if (s_read_uint(d, &e, &((uint64_t *)p)[i]) < 0)
                return -1;
            break;
        case MSG_F_F32_ARR:
            if (s_read_number(d, &e, &x) < 0 || s_to_f32(d, f, x, &((float *)p)[i]) < 0)
                return -1;
            break;
        case MSG_F_STR_ARR:
            if (s_read_str(d, &e, f->elo, f->ehi, &((const char **)p)[i]) < 0)
                return -1;
            break;
        case MSG_F_STRUCT_ARR: {
            void *elem = (char *)p + (size_t)i * f->sub->size;
            msg_schema_init(f->sub, elem);
            if (e.kind != MSG_WIRE_MAP)
                return s_kind_err(d, "map", &e);
            if (s_decode_map(d, f->sub, elem, e.n, false) < 0)
                return -1;
            break;
        }
        default:
            return errf(d->err, d->errlen, "%s: internal: kind %d is not an array", d->path.s, f->kind);
        }
        msg_path_pop(&d->path, mark);
    }
    memcpy(MSG_AT(base, f->off), &p, sizeof p);
    memcpy(MSG_AT(base, f->count_off), &n, sizeof n);
    return 0;
}

static int s_decode_field(s_dec_t *d, const msg_field_t *f, void *base)
{
    msg_wire_obj_t o;
    if (s_next(d, &o) < 0)
        return -1;
    void *at = MSG_AT(base, f->off);
    uint64_t u = 0;
    double x = 0;
    if (o.kind == MSG_WIRE_NIL) {
        /* Other encoders write None for "not given": it means the default. */
        if (f->flags & MSG_FIELD_REQ)
            return errf(d->err, d->errlen, "%s: missing required field (nil)", d->path.s);
        return 0;
    }
    switch (f->kind) {
    case MSG_F_BOOL:
        if (o.kind != MSG_WIRE_BOOL)
            return s_kind_err(d, "bool", &o);
        *(bool *)at = o.b;
        return 0;
    case MSG_F_U32:
    case MSG_F_U64:
        if (s_read_uint(d, &o, &u) < 0 || msg_check_uint(f, u, d->path.s, d->err, d->errlen) < 0)
            return -1;
        if (f->kind == MSG_F_U32) {
            uint32_t v = (uint32_t)u;       /* hi <= UINT32_MAX for every U32 field */
            memcpy(at, &v, 4);
        } else {
            memcpy(at, &u, 8);
        }
        return 0;
    case MSG_F_I64: {
        int64_t v;
        if (o.kind == MSG_WIRE_UINT) {
            if (o.u > INT64_MAX)
                return errf(d->err, d->errlen, "%s: %llu does not fit in a signed 64-bit integer", d->path.s,
                            (unsigned long long)o.u);
            v = (int64_t)o.u;
        } else if (o.kind == MSG_WIRE_INT) {
            v = o.i;
        } else {
            return s_kind_err(d, "int", &o);
        }
        if (msg_check_i64(f, v, d->path.s, d->err, d->errlen) < 0)
            return -1;
        memcpy(at, &v, 8);
        return 0;
    }
    case MSG_F_F32: {
        float v;
        if (s_read_number(d, &o, &x) < 0 || s_to_f32(d, f, x, &v) < 0)
            return -1;
        memcpy(at, &v, 4);
        return 0;
    }
    case MSG_F_F64:
        if (s_read_number(d, &o, &x) < 0 || msg_check_float(f, x, d->path.s, d->err, d->errlen) < 0)
            return -1;
        memcpy(at, &x, 8);
        return 0;
    case MSG_F_ENUM: {
        if (s_read_uint(d, &o, &u) < 0 || msg_check_enum(f, u, d->path.s, d->err, d->errlen) < 0)
            return -1;
        unsigned v = (unsigned)u;
        memcpy(at, &v, sizeof v);
        return 0;
    }
    case MSG_F_STR: {
        const char *s;
        if (s_read_str(d, &o, f->lo, f->hi, &s) < 0)
            return -1;
        memcpy(at, &s, sizeof s);
        return 0;
    }
    case MSG_F_BIN: {
        if (o.kind != MSG_WIRE_BIN)
            return s_kind_err(d, "bin", &o);
        if (msg_check_count(f, o.n, d->path.s, d->err, d->errlen) < 0)
            return -1;
        uint8_t *p = NULL;
        if (o.n > 0) {
            if (!(p = s_alloc(d->m, o.n, d->path.s, d->err, d->errlen)))
                return -1;
            memcpy(p, o.data, o.n);
        }
        memcpy(at, &p, sizeof p);
        memcpy(MSG_AT(base, f->count_off), &o.n, sizeof o.n);
        return 0;
    }
    case MSG_F_STRUCT:
        if (o.kind != MSG_WIRE_MAP)
            return s_kind_err(d, "map", &o);
        return s_decode_map(d, f->sub, at, o.n, false);
    default:
        return s_decode_array(d, f, base, &o);
    }
}

static int s_decode_map(s_dec_t *d, const msg_schema_t *s, void *base, uint32_t pairs, bool top)
{
    uint64_t seen = 0;                      /* n_fields <= 64, checked by the tests */
    unsigned header_keys = 0;               /* top level: v, t, id seen (the first pass read them) */
    for (uint32_t i = 0; i < pairs; i++) {
        msg_wire_obj_t k;
        if (s_next(d, &k) < 0)
            return -1;
        if (k.kind != MSG_WIRE_STR)
            return errf(d->err, d->errlen, "%s: key %u is a %s, not a string", d->path.s, i,
                        msg_wire_kind_name(k.kind));
        if (top && (s_key_is(&k, "v") || s_key_is(&k, "t") || s_key_is(&k, "id"))) {
            unsigned bit = k.data[0] == 'v' ? 1u : k.data[0] == 't' ? 2u : 4u;
            if (header_keys & bit)
                return errf(d->err, d->errlen, "%.*s: duplicate key", (int)k.n, (const char *)k.data);
            header_keys |= bit;
            if (msg_wire_skip(&d->cur, d->err, d->errlen) < 0)
                return -1;
            continue;
        }
        unsigned fi = 0;
        while (fi < s->n_fields && !s_key_is(&k, s->fields[fi].key))
            fi++;
        if (fi == s->n_fields) {
            char q[160];
            s_quote_key(&k, q, sizeof q);
            return errf(d->err, d->errlen, "%s: unknown key \"%s\"", d->path.s, q);
        }
        size_t mark = msg_path_key(&d->path, s->fields[fi].key);
        if (seen & (1ull << fi))
            return errf(d->err, d->errlen, "%s: duplicate key", d->path.s);
        seen |= 1ull << fi;
        if (s_decode_field(d, &s->fields[fi], base) < 0)
            return -1;
        msg_path_pop(&d->path, mark);
    }
    for (unsigned fi = 0; fi < s->n_fields; fi++)
        if ((s->fields[fi].flags & MSG_FIELD_REQ) && !(seen & (1ull << fi)))
            return errf(d->err, d->errlen, "%s.%s: missing required field", d->path.s, s->fields[fi].key);
    return 0;
}

/* First pass over the top-level map: "v", "t" and "id", each exactly once, unsigned. */
static int s_read_header(const uint8_t *buf, size_t len, uint64_t *v, uint64_t *t, uint64_t *id, char *err,
                         size_t errlen)
{
    msg_wire_cur_t c;
    msg_wire_obj_t o, k;
    msg_wire_cur_init(&c, buf, len);
    if (msg_wire_next(&c, &o, err, errlen) < 0)
        return -1;
    if (o.kind != MSG_WIRE_MAP)
        return errf(err, errlen, "top level is %s, not a map", msg_wire_kind_name(o.kind));
    static const char *const keys[3] = {"v", "t", "id"};
    uint64_t *vals[3] = {v, t, id};
    bool got[3] = {false, false, false};
    for (uint32_t i = 0; i < o.n; i++) {
        if (msg_wire_next(&c, &k, err, errlen) < 0)
            return -1;
        if (k.kind != MSG_WIRE_STR)
            return errf(err, errlen, "key %u of the top-level map is a %s, not a string", i,
                        msg_wire_kind_name(k.kind));
        int which = -1;
        for (int j = 0; j < 3; j++)
            if (s_key_is(&k, keys[j]))
                which = j;
        if (which < 0) {
            if (msg_wire_skip(&c, err, errlen) < 0)
                return -1;
            continue;
        }
        if (got[which])
            return errf(err, errlen, "%s: duplicate key", keys[which]);
        got[which] = true;
        msg_wire_obj_t val;
        if (msg_wire_next(&c, &val, err, errlen) < 0)
            return -1;
        if (val.kind != MSG_WIRE_UINT)
            return errf(err, errlen, "%s: expected unsigned int, got %s", keys[which], msg_wire_kind_name(val.kind));
        *vals[which] = val.u;
        /* Our encoder writes them first: stop here rather than walk a large frame twice. A
         * repeat further on is caught by the second pass. */
        if (got[0] && got[1] && got[2])
            break;
    }
    if (!got[0])
        return errf(err, errlen, "v: missing protocol version");
    if (*v != MSG_VERSION)
        return errf(err, errlen, "v: protocol version %llu not supported (this build speaks %d)",
                    (unsigned long long)*v, MSG_VERSION);
    if (!got[1])
        return errf(err, errlen, "t: missing message type");
    if (*t == MSG_NONE || *t >= MSG_TYPE_COUNT)
        return errf(err, errlen, "t: unknown message type %llu", (unsigned long long)*t);
    if (!got[2])
        return errf(err, errlen, "id: missing request id");
    return 0;
}

int msg_decode(const uint8_t *buf, size_t len, msg_t *out, char *err, size_t errlen)
{
    msg_init(out, MSG_NONE, 0);
    if (!buf)
        return errf(err, errlen, "no frame");
    uint64_t v = 0, t = 0, id = 0;
    if (msg_wire_prescan(buf, len, err, errlen) < 0 || s_read_header(buf, len, &v, &t, &id, err, errlen) < 0)
        return -1;

    msg_init(out, (msg_type_t)t, id);
    out->arena_hint_ = s_first_chunk(len);
    const msg_schema_t *s = msg_schema_of(out->type);
    s_dec_t d = {.m = out, .err = err, .errlen = errlen};
    msg_wire_cur_init(&d.cur, buf, len);
    msg_path_init(&d.path, s->name);
    msg_wire_obj_t top;
    if (s_next(&d, &top) < 0 || s_decode_map(&d, s, &out->u, top.n, true) < 0 ||
        msg_validate(out, err, errlen) < 0) {
        msg_free(out);
        msg_init(out, MSG_NONE, 0);
        return -1;
    }
    return 0;
}

int msg_peek(const uint8_t *buf, size_t len, msg_type_t *type, uint64_t *id)
{
    if (!buf || len == 0 || len > MSG_MAX_FRAME)
        return -1;
    msg_wire_cur_t c;
    msg_wire_obj_t o, k, val;
    msg_wire_cur_init(&c, buf, len);
    if (msg_wire_next(&c, &o, NULL, 0) < 0 || o.kind != MSG_WIRE_MAP)
        return -1;
    bool got_id = false;
    *type = MSG_NONE;
    for (uint32_t i = 0; i < o.n; i++) {
        if (msg_wire_next(&c, &k, NULL, 0) < 0 || k.kind != MSG_WIRE_STR)
            break;
        bool is_t = s_key_is(&k, "t"), is_id = s_key_is(&k, "id");
        if (!is_t && !is_id) {
            if (msg_wire_skip(&c, NULL, 0) < 0)
                break;
            continue;
        }
        msg_wire_cur_t before = c;
        if (msg_wire_next(&c, &val, NULL, 0) < 0)
            break;
        if (val.kind != MSG_WIRE_UINT) {    /* step over it whole: it may be a container */
            c = before;
            if (msg_wire_skip(&c, NULL, 0) < 0)
                break;
            continue;
        }
        if (is_t && val.u > MSG_NONE && val.u < MSG_TYPE_COUNT)
            *type = (msg_type_t)val.u;
        if (is_id) {
            *id = val.u;
            got_id = true;
        }
    }
    return got_id ? 0 : -1;
}
