/* tests/fuzz/fuzz_msg.c — libFuzzer target for the message decoder.
 *
 * Properties checked on every input:
 *   - msg_decode never crashes, leaks or reads out of bounds (ASan/UBSan), and a failure
 *     leaves the msg_t empty with an error message;
 *   - msg_peek never crashes on the same bytes, and agrees with a successful decode;
 *   - a decoded message validates, prints, renders as JSON and clones into an equal copy that
 *     survives freeing the original;
 *   - it re-encodes, the re-encoding decodes to an equal message, and encoding that copy gives
 *     the same bytes again (the encoding is canonical).
 * Build and run: see messages/README.md. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "messages/msg.h"

static void s_die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_msg: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t enc[MSG_MAX_FRAME], enc2[MSG_MAX_FRAME];
    static char json[1 << 20];
    static FILE *devnull;
    char err[512] = "", diff[256] = "";
    msg_t m, m2;
    msg_type_t t;
    uint64_t id;

    if (!devnull && !(devnull = fopen("/dev/null", "w")))
        s_die("fopen", "/dev/null");
    int peeked = msg_peek(data, size, &t, &id);

    if (msg_decode(data, size, &m, err, sizeof err) != 0) {
        if (!err[0])
            s_die("decode failed", "without an error message");
        if (m.type != MSG_NONE || m.arena_)
            s_die("decode failed", "but left state behind");
        return 0;
    }
    if (msg_validate(&m, err, sizeof err) != 0)
        s_die("decoded message does not validate", err);
    if (peeked != 0 || t != m.type || id != m.id)
        s_die("msg_peek disagrees with msg_decode", msg_type_name(m.type));
    msg_print(&m, devnull);
    (void)msg_to_json(&m, json, sizeof json);       /* may not fit: that is allowed */

    size_t len = 0, len2 = 0;
    if (msg_encode(&m, enc, sizeof enc, &len, err, sizeof err) != 0)
        s_die("decoded message does not re-encode", err);
    if (msg_decode(enc, len, &m2, err, sizeof err) != 0)
        s_die("re-encoded message does not decode", err);
    if (!msg_equal(&m, &m2, diff, sizeof diff))
        s_die("round trip changed the message", diff);
    if (msg_encode(&m2, enc2, sizeof enc2, &len2, err, sizeof err) != 0)
        s_die("second encode failed", err);
    if (len != len2 || memcmp(enc, enc2, len) != 0)
        s_die("encoding is not canonical", msg_type_name(m.type));
    msg_t m3;
    if (msg_clone(&m, &m3, err, sizeof err) != 0)
        s_die("decoded message does not clone", err);
    msg_free(&m);                                   /* the clone must not depend on it */
    if (!msg_equal(&m2, &m3, diff, sizeof diff))
        s_die("clone differs", diff);
    msg_free(&m2);
    msg_free(&m3);
    return 0;
}
