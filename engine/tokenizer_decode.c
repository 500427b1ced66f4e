/* engine/tokenizer_decode.c — ids back to text, one-shot and streaming.
 *
 * `tokenizers` decodes by concatenating every token's bytes (ByteLevel decoder) and converting
 * the whole with Rust's String::from_utf8_lossy. That conversion replaces each "maximal
 * subpart" of an ill-formed sequence with one U+FFFD (Unicode §3.9, the W3C/WHATWG practice;
 * Python's errors='replace' does the same). It is a left-to-right automaton that needs at most
 * three bytes of look-behind, which is what lets the stream below emit exactly the same text
 * while holding back no more than an unfinished sequence: s_utf8_step is shared by both. */
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer_internal.h"

static const uint8_t REPLACEMENT[3] = {0xEF, 0xBF, 0xBD};

/* Expected sequence length for a lead byte, and the allowed range of the second byte. */
static int s_lead(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Feeds one byte through the automaton. pend/npend hold an unfinished sequence. Writes what
 * becomes final into out (at most 6 bytes: a U+FFFD for the abandoned prefix, then the byte's
 * own result) and returns how many bytes it wrote. */
static size_t s_utf8_step(uint8_t *pend, uint8_t *npend, uint8_t b, uint8_t *out)
{
    size_t w = 0;
    if (*npend) {
        uint8_t lo, hi;
        int need = s_lead(pend[0], &lo, &hi);
        if (*npend == 1 ? (b >= lo && b <= hi) : (b & 0xC0) == 0x80) {
            pend[(*npend)++] = b;
            if (*npend == need) {
                memcpy(out, pend, (size_t)need);
                *npend = 0;
                return (size_t)need;
            }
            return 0;
        }
        /* b cannot continue the sequence: the held prefix is one maximal subpart. */
        memcpy(out, REPLACEMENT, 3);
        w = 3;
        *npend = 0;
    }
    if (b < 0x80) {
        out[w] = b;
        return w + 1;
    }
    uint8_t lo, hi;
    if (s_lead(b, &lo, &hi)) {
        pend[0] = b;
        *npend = 1;
        return w;
    }
    memcpy(out + w, REPLACEMENT, 3);
    return w + 3;
}

static int s_skip(const tokenizer_t *t, int32_t id, int skip_special)
{
    return id < 0 || id >= t->n_ids || !t->id_bytes[id] ||
           (skip_special && (t->id_flags[id] & TOK_F_SPECIAL));
}

int tok_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
               char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (!s_skip(t, ids[i], skip_special))
            total += t->id_bytes_len[ids[i]];
    /* Worst case: every byte becomes a 3-byte U+FFFD. */
    if (total > (SIZE_MAX - 4) / 3)
        return -1;
    uint8_t *out = malloc(total * 3 + 4);
    if (!out)
        return -1;
    size_t w = 0;
    uint8_t pend[4];
    uint8_t npend = 0;
    for (size_t i = 0; i < n; i++) {
        if (s_skip(t, ids[i], skip_special))
            continue;
        const uint8_t *b = t->id_bytes[ids[i]];
        uint32_t blen = t->id_bytes_len[ids[i]];
        for (uint32_t k = 0; k < blen; k++) {
            if (npend == 0 && b[k] < 0x80) {     /* the common case, without the call */
                out[w++] = b[k];
                continue;
            }
            w += s_utf8_step(pend, &npend, b[k], out + w);
        }
    }
    if (npend) {
        memcpy(out + w, REPLACEMENT, 3);
        w += 3;
    }
    out[w] = 0;
    *text = (char *)out;
    *len = w;
    return 0;
}

void tok_stream_init(tok_stream_t *s, const tokenizer_t *t)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
}

int tok_stream_feed(tok_stream_t *s, int32_t id, char *out, size_t cap, size_t *out_len)
{
    const tokenizer_t *t = s->tok;
    *out_len = 0;
    if (s_skip(t, id, s->skip_special))
        return 0;
    const uint8_t *b = t->id_bytes[id];
    uint32_t blen = t->id_bytes_len[id];
    tok_stream_t saved = *s;
    size_t w = 0;
    uint8_t tmp[8];
    for (uint32_t k = 0; k < blen; k++) {
        size_t got = s_utf8_step(s->pend, &s->npend, b[k], tmp);
        if (got > cap - w) {
            *s = saved;                           /* unchanged: the caller may retry */
            return -1;
        }
        memcpy(out + w, tmp, got);
        w += got;
    }
    *out_len = w;
    return 0;
}

int tok_stream_flush(tok_stream_t *s, char *out, size_t cap, size_t *out_len)
{
    *out_len = 0;
    if (s->npend) {
        if (cap < 3)
            return -1;
        memcpy(out, REPLACEMENT, 3);
        *out_len = 3;
    }
    s->npend = 0;
    return 0;
}
