/* messages/msg_check.c — msg_validate and msg_equal: two walks over the schema tables.
 *
 * Validation is the single home of the value rules (ranges, lengths, counts, UTF-8, required
 * fields, cross-field checks). The decoder applies the same per-value helpers before it stores
 * anything and runs msg_validate at the end, so a decoded message and one about to be encoded
 * obey exactly the same rules and report them in the same words. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "messages/msg_schema.h"

/* ---- paths ---- */

void msg_path_init(msg_path_t *p, const char *root)
{
    size_t k = strlen(root);
    if (k > sizeof p->s - 1)
        k = sizeof p->s - 1;
    memcpy(p->s, root, k);
    p->s[k] = 0;
    p->n = k;
}

size_t msg_path_push(msg_path_t *p, const char *fmt, ...)
{
    size_t mark = p->n;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(p->s + p->n, sizeof p->s - p->n, fmt, ap);
    va_end(ap);
    if (k > 0)
        p->n += (size_t)k < sizeof p->s - p->n ? (size_t)k : sizeof p->s - p->n - 1;
    return mark;
}

size_t msg_path_key(msg_path_t *p, const char *key)
{
    size_t mark = p->n, room = sizeof p->s - 1 - p->n, k = strlen(key);
    if (room > 0) {
        p->s[p->n++] = '.';
        room--;
        if (k > room)
            k = room;
        memcpy(p->s + p->n, key, k);
        p->n += k;
    }
    p->s[p->n] = 0;
    return mark;
}

size_t msg_path_index(msg_path_t *p, uint32_t i)
{
    char d[12];
    int k = 0;
    do
        d[k++] = (char)('0' + i % 10);
    while ((i /= 10) != 0);
    const size_t mark = p->n;
    if (p->n + (size_t)k + 2 > sizeof p->s - 1)
        return mark;   /* no room: the path stays as it is (as a cut printf would leave it, near enough) */
    p->s[p->n++] = '[';
    while (k > 0)
        p->s[p->n++] = d[--k];
    p->s[p->n++] = ']';
    p->s[p->n] = 0;
    return mark;
}

void msg_path_pop(msg_path_t *p, size_t mark)
{
    p->n = mark;
    p->s[mark] = 0;
}

/* ---- strings ---- */

size_t msg_strnlen(const char *s, size_t max)
{
    if (!s)
        return 0;
    const char *z = memchr(s, 0, max + 1);
    return z ? (size_t)(z - s) : max + 1;
}

bool msg_utf8_ok(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c == 0)
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (n - i < len)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

/* ---- value rules ---- */

int msg_check_uint(const msg_field_t *f, uint64_t v, const char *path, char *err, size_t errlen)
{
    if (v < f->lo || v > f->hi)
        return errf(err, errlen, "%s: %llu outside [%llu, %llu]", path, (unsigned long long)v,
                    (unsigned long long)f->lo, (unsigned long long)f->hi);
    return 0;
}

int msg_check_i64(const msg_field_t *f, int64_t v, const char *path, char *err, size_t errlen)
{
    if (v < f->ilo || v > f->ihi)
        return errf(err, errlen, "%s: %lld outside [%lld, %lld]", path, (long long)v, (long long)f->ilo,
                    (long long)f->ihi);
    return 0;
}

int msg_check_float(const msg_field_t *f, double v, const char *path, char *err, size_t errlen)
{
    if (isnan(v))
        return errf(err, errlen, "%s: NaN is not a finite number", path);
    if (!isfinite(v))
        return errf(err, errlen, "%s: %s is not a finite number", path, v > 0 ? "inf" : "-inf");
    if (v < f->flo || v > f->fhi)
        return errf(err, errlen, "%s: %g outside [%g, %g]", path, v, f->flo, f->fhi);
    return 0;
}

int msg_check_enum(const msg_field_t *f, uint64_t v, const char *path, char *err, size_t errlen)
{
    if (v < f->lo || v >= f->hi)
        return errf(err, errlen, "%s: enum value %llu out of range [%llu, %llu] (%s..%s)", path,
                    (unsigned long long)v, (unsigned long long)f->lo, (unsigned long long)(f->hi - 1),
                    f->names[f->lo], f->names[f->hi - 1]);
    return 0;
}

int msg_check_str(const char *s, size_t n, uint64_t lo, uint64_t hi, const char *path, char *err,
                  size_t errlen)
{
    if (n > hi)
        return errf(err, errlen, "%s: string of %zu bytes exceeds the limit of %llu", path, n,
                    (unsigned long long)hi);
    if (n < lo)
        return lo == 1 ? errf(err, errlen, "%s: must not be empty", path)
                       : errf(err, errlen, "%s: string of %zu bytes is shorter than %llu", path, n,
                              (unsigned long long)lo);
    if (!msg_utf8_ok(s, n))
        return errf(err, errlen, "%s: not valid UTF-8", path);
    return 0;
}

int msg_check_count(const msg_field_t *f, uint64_t n, const char *path, char *err, size_t errlen)
{
    const char *what = f->kind == MSG_F_BIN ? "bytes" : "elements";
    if (n == 0)
        return (f->flags & MSG_FIELD_REQ) ? errf(err, errlen, "%s: missing required field (empty)", path) : 0;
    if (n > f->hi)
        return errf(err, errlen, "%s: %llu %s exceed the limit of %llu", path, (unsigned long long)n, what,
                    (unsigned long long)f->hi);
    if (n < f->lo)
        return errf(err, errlen, "%s: %llu %s, at least %llu required", path, (unsigned long long)n, what,
                    (unsigned long long)f->lo);
    return 0;
}

/* ---- validate ---- */

static int s_validate_struct(const msg_schema_t *s, const void *base, msg_path_t *path, char *err,
                             size_t errlen);

static uint32_t s_count(const void *base, const msg_field_t *f)
{
    uint32_t n;
    memcpy(&n, MSG_CAT(base, f->count_off), sizeof n);
    return n;
}

static const void *s_ptr(const void *base, const msg_field_t *f)
{
    const void *p;
    memcpy(&p, MSG_CAT(base, f->off), sizeof p);
    return p;
}

static int s_validate_field(const msg_field_t *f, const void *base, msg_path_t *path, char *err, size_t errlen)
{
    const void *at = MSG_CAT(base, f->off);
    const char *ps = path->s;
    switch (f->kind) {
    case MSG_F_BOOL: {
        uint8_t b;                          /* read as a byte: a bool holding 2 would be UB */
        memcpy(&b, at, 1);
        return b <= 1 ? 0 : errf(err, errlen, "%s: bool holds %u", ps, b);
    }
    case MSG_F_U32: { uint32_t v; memcpy(&v, at, 4); return msg_check_uint(f, v, ps, err, errlen); }
    case MSG_F_U64: { uint64_t v; memcpy(&v, at, 8); return msg_check_uint(f, v, ps, err, errlen); }
    case MSG_F_I64: { int64_t v; memcpy(&v, at, 8); return msg_check_i64(f, v, ps, err, errlen); }
    case MSG_F_F32: { float v; memcpy(&v, at, 4); return msg_check_float(f, v, ps, err, errlen); }
    case MSG_F_F64: { double v; memcpy(&v, at, 8); return msg_check_float(f, v, ps, err, errlen); }
    case MSG_F_ENUM: return msg_check_enum(f, msg_field_get_enum(base, f), ps, err, errlen);
    case MSG_F_STR: {
        const char *s = s_ptr(base, f);
        if (!s)
            return (f->flags & MSG_FIELD_REQ) ? errf(err, errlen, "%s: missing required field", ps) : 0;
        return msg_check_str(s, msg_strnlen(s, f->hi), f->lo, f->hi, ps, err, errlen);
    }
    case MSG_F_STRUCT:
        return s_validate_struct(f->sub, at, path, err, errlen);
    default:
        break;
    }

    /* bin and arrays: pointer + count */
    uint32_t n = s_count(base, f);
    const void *p = s_ptr(base, f);
    if (msg_check_count(f, n, ps, err, errlen) < 0)
        return -1;
    if (n == 0)
        return 0;
    if (!p)
        return errf(err, errlen, "%s: NULL with count %u", ps, n);
    if (f->kind != MSG_F_F32_ARR && f->kind != MSG_F_STR_ARR && f->kind != MSG_F_STRUCT_ARR)
        return 0;                           /* integers and bytes: any value */
    for (uint32_t i = 0; i < n; i++) {
        int rc = 0;
        if (f->kind == MSG_F_F32_ARR) {     /* up to thousands: name the index only on failure */
            float v = ((const float *)p)[i];
            if (isfinite(v) && v >= f->flo && v <= f->fhi)
                continue;
        }
        size_t mark = msg_path_index(path, i);
        if (f->kind == MSG_F_F32_ARR) {
            rc = msg_check_float(f, ((const float *)p)[i], path->s, err, errlen);
        } else if (f->kind == MSG_F_STR_ARR) {
            const char *s = ((const char *const *)p)[i];
            rc = s ? msg_check_str(s, msg_strnlen(s, f->ehi), f->elo, f->ehi, path->s, err, errlen)
                   : errf(err, errlen, "%s: NULL string", path->s);
        } else {
            rc = s_validate_struct(f->sub, (const char *)p + (size_t)i * f->sub->size, path, err, errlen);
        }
        if (rc < 0)
            return -1;
        msg_path_pop(path, mark);
    }
    return 0;
}

static int s_validate_struct(const msg_schema_t *s, const void *base, msg_path_t *path, char *err, size_t errlen)
{
    for (unsigned i = 0; i < s->n_fields; i++) {
        size_t mark = msg_path_key(path, s->fields[i].key);
        if (s_validate_field(&s->fields[i], base, path, err, errlen) < 0)
            return -1;
        msg_path_pop(path, mark);
    }
    return s->check ? s->check(base, path->s, err, errlen) : 0;
}

int msg_validate(const msg_t *m, char *err, size_t errlen)
{
    const msg_schema_t *s = msg_schema_of(m->type);
    if (!s)
        return errf(err, errlen, "t: unknown message type %u", (unsigned)m->type);
    msg_path_t path;
    msg_path_init(&path, s->name);
    return s_validate_struct(s, &m->u, &path, err, errlen);
}

/* ---- equality ---- */

static bool s_equal_struct(const msg_schema_t *s, const void *a, const void *b, msg_path_t *path);

static bool s_str_eq(const char *x, const char *y)
{
    return (!x && !y) || (x && y && strcmp(x, y) == 0);
}

static bool s_equal_field(const msg_field_t *f, const void *a, const void *b, msg_path_t *path)
{
    const void *x = MSG_CAT(a, f->off), *y = MSG_CAT(b, f->off);
    switch (f->kind) {
    case MSG_F_BOOL: return *(const bool *)x == *(const bool *)y;
    case MSG_F_U32: case MSG_F_F32: case MSG_F_ENUM: return memcmp(x, y, 4) == 0;  /* floats bitwise */
    case MSG_F_U64: case MSG_F_I64: case MSG_F_F64: return memcmp(x, y, 8) == 0;
    case MSG_F_STR: return s_str_eq(s_ptr(a, f), s_ptr(b, f));
    case MSG_F_STRUCT: return s_equal_struct(f->sub, x, y, path);
    default: break;
    }
    uint32_t n = s_count(a, f);
    if (n != s_count(b, f))
        return false;
    if (n == 0)
        return true;
    const char *pa = s_ptr(a, f), *pb = s_ptr(b, f);
    if (!pa || !pb)
        return pa == pb;
    switch (f->kind) {
    case MSG_F_STR_ARR:
        for (uint32_t i = 0; i < n; i++)
            if (!s_str_eq(((const char *const *)(const void *)pa)[i], ((const char *const *)(const void *)pb)[i])) {
                msg_path_index(path, i);
                return false;
            }
        return true;
    case MSG_F_STRUCT_ARR:
        for (uint32_t i = 0; i < n; i++) {
            size_t mark = msg_path_index(path, i);
            size_t off = (size_t)i * f->sub->size;
            if (!s_equal_struct(f->sub, pa + off, pb + off, path))
                return false;
            msg_path_pop(path, mark);
        }
        return true;
    default:
        return memcmp(pa, pb, (size_t)n * msg_field_elem_size(f)) == 0;
    }
}

static bool s_equal_struct(const msg_schema_t *s, const void *a, const void *b, msg_path_t *path)
{
    for (unsigned i = 0; i < s->n_fields; i++) {
        size_t mark = msg_path_key(path, s->fields[i].key);
        if (!s_equal_field(&s->fields[i], a, b, path))
            return false;
        msg_path_pop(path, mark);
    }
    return true;
}

bool msg_equal(const msg_t *a, const msg_t *b, char *diff, size_t difflen)
{
    if (a->type != b->type) {
        errf(diff, difflen, "t: %s vs %s", msg_type_name(a->type), msg_type_name(b->type));
        return false;
    }
    if (a->id != b->id) {
        errf(diff, difflen, "id: %llu vs %llu", (unsigned long long)a->id, (unsigned long long)b->id);
        return false;
    }
    const msg_schema_t *s = msg_schema_of(a->type);
    if (!s)
        return true;
    msg_path_t path;
    msg_path_init(&path, s->name);
    if (s_equal_struct(s, &a->u, &b->u, &path))
        return true;
    errf(diff, difflen, "%s differs", path.s);
    return false;
}
