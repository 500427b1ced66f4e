/* messages/msg_wire.h — private: a bounds-checked msgpack reader and the pre-scan.
 *
 * The reader never allocates and never reads past the end it is given: every length is checked
 * against the bytes left before the cursor moves. The pre-scan walks a whole frame with it (no
 * recursion, an explicit stack of MSG_MAX_DEPTH) so the decoder only ever sees frames whose
 * counts, lengths, depth and element total are already known to be sane. */
#ifndef TROUPE_MSG_WIRE_H
#define TROUPE_MSG_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum msg_wire_kind {
    MSG_WIRE_NIL = 0, MSG_WIRE_BOOL, MSG_WIRE_UINT, MSG_WIRE_INT, MSG_WIRE_F32, MSG_WIRE_F64,
    MSG_WIRE_STR, MSG_WIRE_BIN, MSG_WIRE_ARRAY, MSG_WIRE_MAP, MSG_WIRE_EXT
} msg_wire_kind_t;

/* One object header. Integers that are >= 0 come back as UINT whatever their encoding, so
 * int8..int64 formats from other encoders (Python packs small ints as it likes) compare as one. */
typedef struct msg_wire_obj {
    msg_wire_kind_t kind;
    bool b;                 /* BOOL */
    uint64_t u;             /* UINT */
    int64_t i;              /* INT (always < 0) */
    double f;               /* F32, F64 */
    uint32_t n;             /* STR/BIN/EXT bytes, ARRAY elements, MAP pairs */
    const uint8_t *data;    /* STR/BIN/EXT payload (not NUL-terminated) */
} msg_wire_obj_t;

typedef struct msg_wire_cur {
    const uint8_t *start;   /* frame start, for offsets in error messages */
    const uint8_t *p;
    const uint8_t *end;
} msg_wire_cur_t;

void msg_wire_cur_init(msg_wire_cur_t *c, const uint8_t *buf, size_t len);
/* Reads one header; for STR/BIN/EXT also steps over the payload. Containers' elements follow.
 * -1 with "truncated ..." / "reserved byte ..." / "... exceeds the N bytes left" in err. */
int msg_wire_next(msg_wire_cur_t *c, msg_wire_obj_t *o, char *err, size_t errlen);
/* Steps over one whole object, containers included. */
int msg_wire_skip(msg_wire_cur_t *c, char *err, size_t errlen);
/* Stage 1 of decoding: the whole frame must be exactly one map within the MSG_MAX_* frame
 * limits. Allocates nothing. */
int msg_wire_prescan(const uint8_t *buf, size_t len, char *err, size_t errlen);
const char *msg_wire_kind_name(msg_wire_kind_t k);

#endif
