/* messages/msg_text.c — msg_print (one readable line) and msg_to_json (the whole message).
 *
 * Both are one walk over the schema tables with a bounded writer; they differ only in syntax
 * and in that print shortens long strings and arrays. Either may be handed a message that never
 * passed validation (a debugging aid must not crash on the bug it is showing), so strings are
 * read at most to their field's limit and invalid UTF-8 is escaped byte by byte. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "messages/msg_schema.h"

#define PRINT_STR_MAX 80        /* bytes of a string shown by msg_print */
#define PRINT_ARR_MAX 8         /* elements of an array shown by msg_print */
#define PRINT_LINE_MAX 4096

typedef struct s_out {
    char *buf;
    size_t cap, len;            /* len counts what would have been written */
    bool json;
} s_out_t;

static void s_putn(s_out_t *o, const char *s, size_t n)
{
    if (o->len < o->cap) {
        size_t k = o->cap - o->len < n ? o->cap - o->len : n;
        memcpy(o->buf + o->len, s, k);
    }
    o->len += n;
}

static void s_puts(s_out_t *o, const char *s) { s_putn(o, s, strlen(s)); }

static void s_printf(s_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_printf(s_out_t *o, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0)
        s_putn(o, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* A quoted string: JSON escapes, or the print form cut at a character boundary. */
static void s_str(s_out_t *o, const char *s, size_t max)
{
    size_t n = msg_strnlen(s, max);
    if (n > max)
        n = max;
    size_t shown = n;
    if (!o->json && shown > PRINT_STR_MAX) {
        shown = PRINT_STR_MAX;
        while (shown > 0 && ((unsigned char)s[shown] & 0xc0) == 0x80)
            shown--;                                /* do not split a UTF-8 sequence */
    }
    bool utf8 = msg_utf8_ok(s, n);
    s_putn(o, "\"", 1);
    for (size_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': s_puts(o, "\\\""); break;
        case '\\': s_puts(o, "\\\\"); break;
        case '\n': s_puts(o, "\\n"); break;
        case '\r': s_puts(o, "\\r"); break;
        case '\t': s_puts(o, "\\t"); break;
        default:
            if (c < 0x20 || c == 0x7f || (c >= 0x80 && !utf8))
                s_printf(o, o->json ? "\\u%04x" : "\\x%02x", c);
            else
                s_putn(o, (const char *)&c, 1);
        }
    }
    s_putn(o, "\"", 1);
    if (shown < n)
        s_printf(o, "...(%zuB)", n);
}

static void s_float(s_out_t *o, double v, bool f32)
{
    if (!isfinite(v))
        s_puts(o, o->json ? "null" : (isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"));
    else
        s_printf(o, f32 ? "%.9g" : "%.17g", v);
}

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

static void s_struct(s_out_t *o, const msg_schema_t *s, const void *base, bool open);

static void s_field(s_out_t *o, const msg_field_t *f, const void *base)
{
    const void *at = MSG_CAT(base, f->off);
    switch (f->kind) {
    case MSG_F_BOOL: { uint8_t b; memcpy(&b, at, 1); s_puts(o, b ? "true" : "false"); return; }
    case MSG_F_U32: { uint32_t v; memcpy(&v, at, 4); s_printf(o, "%u", v); return; }
    case MSG_F_U64: { uint64_t v; memcpy(&v, at, 8); s_printf(o, "%llu", (unsigned long long)v); return; }
    case MSG_F_I64: { int64_t v; memcpy(&v, at, 8); s_printf(o, "%lld", (long long)v); return; }
    case MSG_F_F32: { float v; memcpy(&v, at, 4); s_float(o, v, true); return; }
    case MSG_F_F64: { double v; memcpy(&v, at, 8); s_float(o, v, false); return; }
    case MSG_F_ENUM: {
        unsigned v = msg_field_get_enum(base, f);
        const char *name = msg_field_enum_name(f, v);
        if (!name)
            s_printf(o, "%u", v);
        else if (o->json)
            s_printf(o, "\"%s\"", name);
        else
            s_puts(o, name);
        return;
    }
    case MSG_F_STR: s_str(o, s_ptr(base, f), f->hi); return;
    case MSG_F_STRUCT: s_struct(o, f->sub, at, true); return;
    default: break;
    }

    uint32_t n = s_count(base, f);
    const void *p = s_ptr(base, f);
    if (!p)
        n = 0;
    uint32_t shown = o->json ? n : (n < PRINT_ARR_MAX ? n : PRINT_ARR_MAX);
    if (f->kind == MSG_F_BIN) {
        s_putn(o, "\"", 1);
        for (uint32_t i = 0; i < (o->json ? n : (n < 32 ? n : 32)); i++)
            s_printf(o, "%02x", ((const uint8_t *)p)[i]);
        s_putn(o, "\"", 1);
        if (!o->json && n > 32)
            s_printf(o, "...(%uB)", n);
        return;
    }
    s_putn(o, "[", 1);
    for (uint32_t i = 0; i < shown; i++) {
        if (i)
            s_puts(o, o->json ? "," : " ");
        switch (f->kind) {
        case MSG_F_U32_ARR: s_printf(o, "%u", ((const uint32_t *)p)[i]); break;
        case MSG_F_U64_ARR: s_printf(o, "%llu", (unsigned long long)((const uint64_t *)p)[i]); break;
        case MSG_F_F32_ARR: s_float(o, ((const float *)p)[i], true); break;
        case MSG_F_STR_ARR: s_str(o, ((const char *const *)p)[i], f->ehi); break;
        case MSG_F_STRUCT_ARR: s_struct(o, f->sub, (const char *)p + (size_t)i * f->sub->size, true); break;
        default: break;
        }
    }
    if (shown < n)
        s_printf(o, " ...(+%u)", n - shown);
    s_putn(o, "]", 1);
}

/* open: write the braces (nested structs); the top level writes its own. */
static void s_struct(s_out_t *o, const msg_schema_t *s, const void *base, bool open)
{
    bool first = open;               /* the top level follows "type" and "id" */
    if (open)
        s_putn(o, "{", 1);
    for (unsigned i = 0; i < s->n_fields; i++) {
        const msg_field_t *f = &s->fields[i];
        if (!msg_field_present(f, base))
            continue;
        if (o->json)
            s_printf(o, first ? "\"%s\":" : ",\"%s\":", f->key);
        else
            s_printf(o, first ? "%s=" : " %s=", f->key);
        first = false;
        s_field(o, f, base);
    }
    if (open)
        s_putn(o, "}", 1);
}

static void s_message(s_out_t *o, const msg_t *m)
{
    const msg_schema_t *s = msg_schema_of(m->type);
    if (o->json)
        s_printf(o, "{\"type\":\"%s\",\"id\":%llu", msg_type_name(m->type), (unsigned long long)m->id);
    else
        s_printf(o, "%s id=%llu", msg_type_name(m->type), (unsigned long long)m->id);
    if (s)
        s_struct(o, s, &m->u, false);
    if (o->json)
        s_putn(o, "}", 1);
}

void msg_print(const msg_t *m, FILE *f)
{
    char line[PRINT_LINE_MAX];
    s_out_t o = {.buf = line, .cap = sizeof line - 5, .json = false};
    s_message(&o, m);
    size_t n = o.len;
    if (n > o.cap) {                /* too long: end with a visible cut */
        n = o.cap;
        memcpy(line + n, "...", 3);
        n += 3;
    }
    line[n++] = '\n';
    fwrite(line, 1, n, f);
}

int msg_to_json(const msg_t *m, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return -1;
    s_out_t o = {.buf = buf, .cap = cap - 1, .json = true};
    s_message(&o, m);
    if (o.len > o.cap || o.len > INT32_MAX) {
        buf[0] = 0;
        return -1;
    }
    buf[o.len] = 0;
    return (int)o.len;
}
