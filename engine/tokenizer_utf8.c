/* engine/tokenizer_utf8.c — UTF-8 validation and encoding, Unicode White_Space, and GPT-2's
 * byte-level alphabet (bytes_to_unicode): each byte maps to one printable code point so a BPE
 * vocabulary can be written as text. Printable Latin-1 bytes map to themselves; the other 68
 * (controls, space, DEL, NBSP, soft hyphen) map in order to U+0100.. ("Ġ" is the space). */
#include "engine/tokenizer_internal.h"

int tok_utf8_valid(const uint8_t *s, size_t n, size_t *bad_at)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;              /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;              /* overlong */
            if (c == 0xED) hi = 0x9F;              /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;              /* overlong */
            if (c == 0xF4) hi = 0x8F;              /* > U+10FFFF */
        } else
            goto bad;
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi)
            goto bad;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                goto bad;
        i += len;
    }
    return 1;
bad:
    if (bad_at)
        *bad_at = i;
    return 0;
}

size_t tok_utf8_put(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static int s_printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 non-printable bytes, in order: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD (1). */
uint32_t tok_byte_to_cp(uint8_t b)
{
    if (s_printable(b))
        return b;
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x100 + 33 + (b - 0x7F);
    return 0x100 + 67;                             /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 0x100)
        return s_printable((int)cp) ? (int)cp : -1;
    uint32_t k = cp - 0x100;
    if (k < 33)
        return (int)k;
    if (k < 67)
        return (int)(0x7F + (k - 33));
    if (k == 67)
        return 0xAD;
    return -1;
}
