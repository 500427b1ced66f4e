/* messages/msg_wire.c — bounds-checked msgpack reading and the allocation-free pre-scan.
 *
 * Why our own reader: msgpack-c's unpacker allocates from a container's declared count before
 * the elements arrive (`dd ff 00 00 00` asks for ~96 GB, msgpack-c #1013) and has no limits
 * (#985). Here a count is only a number until the bytes behind it have been seen. */
#include "messages/msg_wire.h"

#include <string.h>

#include "common/util.h"
#include "messages/msg.h"

static uint64_t s_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static size_t s_off(const msg_wire_cur_t *c) { return (size_t)(c->p - c->start); }

const char *msg_wire_kind_name(msg_wire_kind_t k)
{
    static const char *const names[] = {"nil", "bool", "unsigned int", "negative int", "float32",
                                        "float64", "str", "bin", "array", "map", "ext"};
    return (unsigned)k < ARRAY_LEN(names) ? names[k] : "?";
}

void msg_wire_cur_init(msg_wire_cur_t *c, const uint8_t *buf, size_t len)
{
    c->start = buf;
    c->p = buf;
    c->end = buf + len;
}

/* Takes n bytes of header from the cursor, or fails naming where the frame ran out. */
static int s_take(msg_wire_cur_t *c, size_t n, const uint8_t **out, char *err, size_t errlen)
{
    if ((size_t)(c->end - c->p) < n)
        return errf(err, errlen, "frame truncated at byte %zu (needs %zu more bytes, %zu left)",
                    s_off(c), n, (size_t)(c->end - c->p));
    *out = c->p;
    c->p += n;
    return 0;
}

/* A payload (str/bin/ext) of n bytes must fit in what is left of the frame. */
static int s_payload(msg_wire_cur_t *c, msg_wire_obj_t *o, uint64_t n, size_t hdr_off, char *err, size_t errlen)
{
    size_t left = (size_t)(c->end - c->p);
    if (n > left)
        return errf(err, errlen, "%s of %llu bytes at byte %zu exceeds the %zu bytes left in the frame",
                    msg_wire_kind_name(o->kind), (unsigned long long)n, hdr_off, left);
    o->n = (uint32_t)n;
    o->data = c->p;
    c->p += n;
    return 0;
}

int msg_wire_next(msg_wire_cur_t *c, msg_wire_obj_t *o, char *err, size_t errlen)
{
    const uint8_t *h = NULL, *q = NULL;
    size_t at = s_off(c);
    memset(o, 0, sizeof *o);
    if (s_take(c, 1, &h, err, errlen) < 0)
        return -1;
    uint8_t b = h[0];
    if (b <= 0x7f) { o->kind = MSG_WIRE_UINT; o->u = b; return 0; }
    if (b >= 0xe0) { o->kind = MSG_WIRE_INT; o->i = (int8_t)b; return 0; }
    if ((b & 0xf0) == 0x80) { o->kind = MSG_WIRE_MAP; o->n = b & 0x0f; return 0; }
    if ((b & 0xf0) == 0x90) { o->kind = MSG_WIRE_ARRAY; o->n = b & 0x0f; return 0; }
    if ((b & 0xe0) == 0xa0) { o->kind = MSG_WIRE_STR; return s_payload(c, o, b & 0x1f, at, err, errlen); }

    switch (b) {
    case 0xc0: o->kind = MSG_WIRE_NIL; return 0;
    case 0xc2: case 0xc3: o->kind = MSG_WIRE_BOOL; o->b = b == 0xc3; return 0;
    case 0xc4: case 0xc5: case 0xc6: {                      /* bin 8/16/32 */
        int w = 1 << (b - 0xc4);
        o->kind = MSG_WIRE_BIN;
        if (s_take(c, (size_t)w, &q, err, errlen) < 0) return -1;
        return s_payload(c, o, s_be(q, w), at, err, errlen);
    }
    case 0xc7: case 0xc8: case 0xc9: {                      /* ext 8/16/32: length, type, data */
        int w = 1 << (b - 0xc7);
        o->kind = MSG_WIRE_EXT;
        if (s_take(c, (size_t)w + 1, &q, err, errlen) < 0) return -1;
        return s_payload(c, o, s_be(q, w), at, err, errlen);
    }
    case 0xca: {
        uint32_t u; float f;
        if (s_take(c, 4, &q, err, errlen) < 0) return -1;
        u = (uint32_t)s_be(q, 4);
        memcpy(&f, &u, 4);
        o->kind = MSG_WIRE_F32; o->f = f;
        return 0;
    }
    case 0xcb: {
        uint64_t u; double d;
        if (s_take(c, 8, &q, err, errlen) < 0) return -1;
        u = s_be(q, 8);
        memcpy(&d, &u, 8);
        o->kind = MSG_WIRE_F64; o->f = d;
        return 0;
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {          /* uint 8/16/32/64 */
        int w = 1 << (b - 0xcc);
        if (s_take(c, (size_t)w, &q, err, errlen) < 0) return -1;
        o->kind = MSG_WIRE_UINT; o->u = s_be(q, w);
        return 0;
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {          /* int 8/16/32/64 */
        int w = 1 << (b - 0xd0);
        if (s_take(c, (size_t)w, &q, err, errlen) < 0) return -1;
        uint64_t u = s_be(q, w);
        int64_t v;
        if (w < 8 && (u >> (8 * w - 1)))                      /* sign-extend */
            u |= ~0ull << (8 * w);
        memcpy(&v, &u, 8);
        if (v >= 0) { o->kind = MSG_WIRE_UINT; o->u = (uint64_t)v; }
        else { o->kind = MSG_WIRE_INT; o->i = v; }
        return 0;
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: /* fixext 1/2/4/8/16: type, data */
        o->kind = MSG_WIRE_EXT;
        if (s_take(c, 1, &q, err, errlen) < 0) return -1;
        return s_payload(c, o, 1u << (b - 0xd4), at, err, errlen);
    case 0xd9: case 0xda: case 0xdb: {                      /* str 8/16/32 */
        int w = 1 << (b - 0xd9);
        o->kind = MSG_WIRE_STR;
        if (s_take(c, (size_t)w, &q, err, errlen) < 0) return -1;
        return s_payload(c, o, s_be(q, w), at, err, errlen);
    }
    case 0xdc: case 0xdd:                                   /* array 16/32 */
        if (s_take(c, b == 0xdc ? 2 : 4, &q, err, errlen) < 0) return -1;
        o->kind = MSG_WIRE_ARRAY; o->n = (uint32_t)s_be(q, b == 0xdc ? 2 : 4);
        return 0;
    case 0xde: case 0xdf:                                   /* map 16/32 */
        if (s_take(c, b == 0xde ? 2 : 4, &q, err, errlen) < 0) return -1;
        o->kind = MSG_WIRE_MAP; o->n = (uint32_t)s_be(q, b == 0xde ? 2 : 4);
        return 0;
    default:                                                /* 0xc1 is the only byte left */
        return errf(err, errlen, "reserved byte 0x%02x at byte %zu", b, at);
    }
}

int msg_wire_skip(msg_wire_cur_t *c, char *err, size_t errlen)
{
    /* Objects still to step over; a container adds its elements. Bounded by the frame because
     * every object consumes at least one byte and the count only grows by what a header claims. */
    uint64_t need = 1;
    msg_wire_obj_t o;
    while (need > 0) {
        if (msg_wire_next(c, &o, err, errlen) < 0)
            return -1;
        need--;
        if (o.kind == MSG_WIRE_ARRAY)
            need += o.n;
        else if (o.kind == MSG_WIRE_MAP)
            need += 2ull * o.n;
        if (need > (uint64_t)(c->end - c->p))
            return errf(err, errlen, "%llu objects claimed at byte %zu but only %zu bytes left",
                        (unsigned long long)need, s_off(c), (size_t)(c->end - c->p));
    }
    return 0;
}

int msg_wire_prescan(const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    if (len == 0)
        return errf(err, errlen, "empty frame");
    if (len > MSG_MAX_FRAME)
        return errf(err, errlen, "frame of %zu bytes exceeds the limit of %u bytes", len, MSG_MAX_FRAME);

    msg_wire_cur_t c;
    msg_wire_cur_init(&c, buf, len);
    /* left[d]: objects still to read in the container open at depth d (depth 0 = the frame). */
    uint64_t left[MSG_MAX_DEPTH + 1];
    int depth = 0;
    uint64_t elements = 0;
    left[0] = 1;
    while (depth >= 0) {
        if (left[depth] == 0) {
            depth--;
            continue;
        }
        left[depth]--;
        size_t at = s_off(&c);
        msg_wire_obj_t o;
        if (msg_wire_next(&c, &o, err, errlen) < 0)
            return -1;
        if (++elements > MSG_MAX_ELEMENTS)
            return errf(err, errlen, "more than %u objects in one frame", MSG_MAX_ELEMENTS);
        if (depth == 0 && o.kind != MSG_WIRE_MAP)
            return errf(err, errlen, "top level is %s, not a map", msg_wire_kind_name(o.kind));
        if (o.kind == MSG_WIRE_EXT)
            return errf(err, errlen, "ext type at byte %zu is not part of the protocol", at);
        if (o.kind != MSG_WIRE_ARRAY && o.kind != MSG_WIRE_MAP)
            continue;
        /* Every element takes at least one byte: a count beyond the bytes left is a lie. */
        uint64_t objs = o.kind == MSG_WIRE_MAP ? 2ull * o.n : o.n;
        size_t rest = (size_t)(c.end - c.p);
        if (objs > rest)
            return errf(err, errlen, "%s of %u %s at byte %zu claims more than the %zu bytes left",
                        msg_wire_kind_name(o.kind), o.n, o.kind == MSG_WIRE_MAP ? "pairs" : "elements",
                        at, rest);
        if (depth + 1 > MSG_MAX_DEPTH)
            return errf(err, errlen, "%s at byte %zu nests deeper than %d levels",
                        msg_wire_kind_name(o.kind), at, MSG_MAX_DEPTH);
        left[++depth] = objs;
    }
    if (c.p != c.end)
        return errf(err, errlen, "%zu trailing bytes after the message (byte %zu)",
                    (size_t)(c.end - c.p), s_off(&c));
    return 0;
}
