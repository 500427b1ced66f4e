/* engine/tokenizer_nfc.c — Unicode Normalization Form C (UAX #15), for Qwen3's NFC normalizer.
 *
 * Canonical decomposition (table + Hangul arithmetic), canonical ordering of combining marks
 * (stable by class), then canonical composition with blocking. The tables in
 * tokenizer_nfc_table.c are generated from the Unicode Character Database 15.0 shipped by
 * Debian's unicode-data package (engine/tokenizer_nfc_gen.py).
 *
 * Known limit: `tokenizers` may be built on a newer Unicode version; the only differences are
 * code points unassigned in 15.0, which this leaves untouched.
 *
 * Fast path: text below U+0300 is always NFC (no character there decomposes into, or composes
 * with, anything earlier than a combining mark), so it is copied as is. */
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer_internal.h"

enum {
    SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7,
    LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT,
};

static int s_ccc(uint32_t cp)
{
    if (cp < 0x300)
        return 0;
    size_t lo = 0, hi = tok_nfc_ccc_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < tok_nfc_ccc[mid][0])
            hi = mid;
        else if (cp > tok_nfc_ccc[mid][1])
            lo = mid + 1;
        else
            return (int)tok_nfc_ccc[mid][2];
    }
    return 0;
}

/* Full canonical decomposition of cp from the table; NULL if it has none. */
static const uint32_t *s_decomp(uint32_t cp, size_t *len)
{
    size_t lo = 0, hi = tok_nfc_decomp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < tok_nfc_decomp[mid][0])
            hi = mid;
        else if (cp > tok_nfc_decomp[mid][0])
            lo = mid + 1;
        else {
            *len = tok_nfc_decomp[mid][2];
            return &tok_nfc_decomp_cps[tok_nfc_decomp[mid][1]];
        }
    }
    return NULL;
}

/* Primary composite of (a, b), or 0 if they do not compose. */
static uint32_t s_compose(uint32_t a, uint32_t b)
{
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = tok_nfc_comp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = tok_nfc_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1]))
            hi = mid;
        else if (a > e[0] || b > e[1])
            lo = mid + 1;
        else
            return e[2];
    }
    return 0;
}

typedef struct {
    uint32_t *cp;
    uint8_t *cc;
    size_t n, cap;
} s_cps_t;

static int s_push(s_cps_t *v, uint32_t cp)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        uint32_t *p = realloc(v->cp, cap * sizeof *p);
        if (!p)
            return -1;
        v->cp = p;
        uint8_t *c = realloc(v->cc, cap);
        if (!c)
            return -1;
        v->cc = c;
        v->cap = cap;
    }
    v->cc[v->n] = (uint8_t)s_ccc(cp);
    v->cp[v->n++] = cp;
    return 0;
}

static int s_decompose_into(s_cps_t *v, uint32_t cp)
{
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        if (s_push(v, LBASE + s / NCOUNT) < 0 || s_push(v, VBASE + (s % NCOUNT) / TCOUNT) < 0)
            return -1;
        if (s % TCOUNT && s_push(v, TBASE + s % TCOUNT) < 0)
            return -1;
        return 0;
    }
    size_t len;
    const uint32_t *d = cp >= 0xC0 ? s_decomp(cp, &len) : NULL;
    if (!d)
        return s_push(v, cp);
    for (size_t i = 0; i < len; i++)
        if (s_push(v, d[i]) < 0)
            return -1;
    return 0;
}

int tok_nfc_append(const uint8_t *s, size_t n, tok_buf_t *out)
{
    size_t i = 0;
    while (i < n && s[i] < 0xCC)                  /* U+0300 is the first code point led by 0xCC */
        i++;
    if (i == n)
        return tok_buf_append(out, s, n);

    s_cps_t v = {0};
    int rc = -1;
    for (size_t k = 0; k < n;)
        if (s_decompose_into(&v, tok_utf8_next(s, &k)) < 0)
            goto done;

    /* Canonical ordering: insertion sort inside each run of non-starters, stable by class. */
    for (size_t k = 1; k < v.n; k++) {
        uint8_t c = v.cc[k];
        if (c == 0)
            continue;
        uint32_t cp = v.cp[k];
        size_t j = k;
        while (j > 0 && v.cc[j - 1] > c) {
            v.cp[j] = v.cp[j - 1];
            v.cc[j] = v.cc[j - 1];
            j--;
        }
        v.cp[j] = cp;
        v.cc[j] = c;
    }

    /* Composition: each character joins the last starter unless a character in between with
     * a class of 0 or >= its own blocks it. */
    size_t m = 0;
    long starter = -1;
    int last_cc = 0;
    for (size_t k = 0; k < v.n; k++) {
        uint32_t cp = v.cp[k];
        int cc = v.cc[k];
        if (starter >= 0 && (m == (size_t)starter + 1 || last_cc < cc)) {
            uint32_t comp = s_compose(v.cp[starter], cp);
            if (comp) {
                v.cp[starter] = comp;
                continue;
            }
        }
        if (cc == 0)
            starter = (long)m;
        last_cc = cc;
        v.cp[m] = cp;
        v.cc[m] = (uint8_t)cc;
        m++;
    }

    if (tok_buf_reserve(out, m * 4) < 0)
        goto done;
    for (size_t k = 0; k < m; k++)
        out->n += tok_utf8_put(v.cp[k], out->p + out->n);
    rc = 0;
done:
    free(v.cp);
    free(v.cc);
    return rc;
}
