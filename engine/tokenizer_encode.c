/* engine/tokenizer_encode.c — text to ids, in the order `tokenizers` runs its pipeline:
 *
 *   1. added tokens with normalized=false are cut out of the raw text (leftmost-longest);
 *   2. each remaining piece is normalized (NFC), then tokens with normalized=true are cut out;
 *   3. each remaining piece goes through the pre-tokenizers (Split by regex, ByteLevel), each
 *      of which only ever splits further, never across an earlier cut;
 *   4. each pre-token is BPE-encoded on its raw bytes (ByteLevel's alphabet is a bijection, so
 *      mapping bytes to characters and back is skipped: the vocabulary is keyed by bytes);
 *   5. with add_special, the post-processor's template ids go around the result.
 *
 * Regexes run through Oniguruma, the engine `tokenizers` itself compiles them with, so Unicode
 * classes (\p{L}, \s, case-insensitive contractions) match identically. A regex only ever sees
 * one piece: lookaheads stop at an added token, as in `tokenizers`.
 *
 * Nothing here writes to the tokenizer; all scratch space belongs to the call. */
#include <oniguruma.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer_internal.h"

typedef struct {
    uint32_t off, len;
    int32_t added;               /* index into t->added, or -1 for text */
} s_piece_t;

typedef struct {
    s_piece_t *p;
    size_t n, cap;
} s_pieces_t;

typedef struct {
    const tokenizer_t *t;
    tok_ids_t out;
    tok_bpe_scratch_t bpe;
    tok_buf_t norm;              /* the normalized text of the current piece */
    tok_buf_t work;              /* text the pre-tokenizers split (prefix spaces appended here) */
    s_pieces_t raw, normd, cur, next;
    OnigRegion *region;
} s_enc_t;

static int s_push(s_pieces_t *v, size_t off, size_t len, int32_t added)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        s_piece_t *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = (s_piece_t){(uint32_t)off, (uint32_t)len, added};
    return 0;
}

/* ---- added tokens ---- */

/* Length of the white space that ends s[0..n) (what Rust's `\s*$` finds). */
static size_t s_trailing_ws(const uint8_t *s, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t k = end - 1;
        while (k > 0 && (s[k] & 0xC0) == 0x80)
            k--;
        size_t i = k;
        if (!tok_is_white_space(tok_utf8_next(s, &i)))
            break;
        end = k;
    }
    return n - end;
}

static size_t s_leading_ws(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = i;
        if (!tok_is_white_space(tok_utf8_next(s, &k)))
            break;
        i = k;
    }
    return i;
}

/* 1 if the character starting at s[i] (i < n) is a word character. */
static int s_word_at(const tokenizer_t *t, const uint8_t *s, size_t n, size_t i)
{
    return onig_match((OnigRegex)t->word_re, s, s + n, s + i, NULL, ONIG_OPTION_NONE) > 0;
}

static int s_word_before(const tokenizer_t *t, const uint8_t *s, size_t n, size_t end)
{
    size_t k = end - 1;
    while (k > 0 && (s[k] & 0xC0) == 0x80)
        k--;
    return s_word_at(t, s, n, k);
}

/* Leftmost-longest match of the trie in s[from..n): 1 with its start, length and term; or 0. */
static int s_trie_find(const tok_trie_t *tr, const uint8_t *s, size_t n, size_t from,
                       size_t *mstart, size_t *mlen, int32_t *term)
{
    for (size_t i = from; i < n; i++) {
        int32_t node = tr->root[s[i]];
        if (node < 0)
            continue;
        int32_t best = -1;
        size_t best_len = 0;
        for (size_t k = i;;) {
            if (tr->nodes[node].term >= 0) {
                best = tr->nodes[node].term;
                best_len = k - i + 1;
            }
            if (++k == n)
                break;
            int32_t c = tr->nodes[node].child;
            while (c >= 0 && tr->nodes[c].byte != s[k])
                c = tr->nodes[c].sibling;
            if (c < 0)
                break;
            node = c;
        }
        if (best >= 0) {
            *mstart = i;
            *mlen = best_len;
            *term = best;
            return 1;
        }
    }
    return 0;
}

/* Cuts the added tokens of trie tr out of s[0..n) (offsets relative to base_off), appending
 * text and token pieces to out; the same rules as `tokenizers`' AddedVocabulary::find_matches. */
static int s_split_added(const tokenizer_t *t, const tok_trie_t *tr, const uint8_t *s, size_t n,
                         size_t base_off, s_pieces_t *out)
{
    size_t start_offset = 0, from = 0, mstart, mlen;
    int32_t term;
    while (tr->n && from < n && s_trie_find(tr, s, n, from, &mstart, &mlen, &term)) {
        const tok_added_t *a = &t->added[term];
        size_t start = mstart, stop = mstart + mlen;
        from = stop;                              /* the search resumes after the raw match */
        if (a->single_word) {
            int start_space = start == 0 || !s_word_before(t, s, n, start);
            int stop_space = stop == n || !s_word_at(t, s, n, stop);
            if (!start_space || !stop_space)
                continue;
        }
        if (a->lstrip) {
            size_t ns = start - s_trailing_ws(s, start);
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip)
            stop += s_leading_ws(s + stop, n - stop);
        if (start < start_offset)                 /* only when a token begins with white space */
            start = start_offset;
        if (stop < start)
            stop = start;
        if (start_offset < start && s_push(out, base_off + start_offset, start - start_offset, -1) < 0)
            return -1;
        if (s_push(out, base_off + start, stop - start, term) < 0)
            return -1;
        start_offset = stop;
    }
    if (start_offset < n && s_push(out, base_off + start_offset, n - start_offset, -1) < 0)
        return -1;
    return 0;
}

/* ---- pre-tokenizers ---- */

/* The spans of s[0..n) the pattern matches, as (offset, length, is_match) pieces covering all
 * of s, like `tokenizers`' Pattern::find_matches. */
static int s_find_matches(s_enc_t *e, const tok_pre_t *p, const uint8_t *s, size_t n, size_t base,
                          s_pieces_t *out)
{
    size_t prev = 0;
    if (p->literal) {
        size_t pos = 0;
        while (pos + p->literal_len <= n) {
            const uint8_t *m = memmem(s + pos, n - pos, p->literal, p->literal_len);
            if (!m)
                break;
            size_t st = (size_t)(m - s);
            if (prev != st && s_push(out, base + prev, st - prev, 0) < 0)
                return -1;
            if (s_push(out, base + st, p->literal_len, 1) < 0)
                return -1;
            prev = pos = st + p->literal_len;
        }
    } else {
        OnigRegex re = (OnigRegex)p->regex;
        size_t pos = 0;
        long last_match_end = -1;
        while (pos <= n) {
            int r = onig_search(re, s, s + n, s + pos, s + n, e->region, ONIG_OPTION_NONE);
            if (r == ONIG_MISMATCH)
                break;
            if (r < 0)
                return -1;
            size_t st = (size_t)e->region->beg[0], en = (size_t)e->region->end[0];
            if (st == en && (long)en == last_match_end) {
                /* An empty match right after the previous one: step one character on, as the
                 * onig crate's find iterator does, instead of looping forever. */
                if (pos >= n)
                    break;
                size_t k = pos;
                (void)tok_utf8_next(s, &k);
                pos = k;
                continue;
            }
            pos = en;
            last_match_end = (long)en;
            if (prev != st && s_push(out, base + prev, st - prev, 0) < 0)
                return -1;
            if (s_push(out, base + st, en - st, 1) < 0)
                return -1;
            prev = en;
            if (st == en) {
                if (pos >= n)
                    break;
                size_t k = pos;
                (void)tok_utf8_next(s, &k);
                pos = k;
            }
        }
    }
    if (prev != n && s_push(out, base + prev, n - prev, 0) < 0)
        return -1;
    return 0;
}

/* Applies a Split pre-tokenizer to the span (off, len) of e->work, appending to e->next. The
 * behaviours follow `tokenizers`' NormalizedString::split. */
static int s_split(s_enc_t *e, const tok_pre_t *p, size_t off, size_t len, s_pieces_t *m)
{
    m->n = 0;
    if (s_find_matches(e, p, e->work.p + off, len, off, m) < 0)
        return -1;
    if (p->invert)
        for (size_t i = 0; i < m->n; i++)
            m->p[i].added = !m->p[i].added;

    /* In m, 'added' holds is_match. Build (piece, remove) in place into e->next. */
    s_pieces_t *o = &e->next;
    size_t first = o->n;
    int prev_match = 0;
    for (size_t i = 0; i < m->n; i++) {
        s_piece_t pc = m->p[i];
        int is_match = pc.added;
        switch (p->behavior) {
        case TOK_SPLIT_ISOLATED:
            if (s_push(o, pc.off, pc.len, 0) < 0)
                return -1;
            break;
        case TOK_SPLIT_REMOVED:
            if (s_push(o, pc.off, pc.len, is_match) < 0)
                return -1;
            break;
        case TOK_SPLIT_CONTIGUOUS:
            if (is_match == prev_match && o->n > first)
                o->p[o->n - 1].len = pc.off + pc.len - o->p[o->n - 1].off;
            else if (s_push(o, pc.off, pc.len, 0) < 0)
                return -1;
            break;
        case TOK_SPLIT_MERGED_WITH_PREVIOUS:
            if (is_match && !prev_match && o->n > first)
                o->p[o->n - 1].len = pc.off + pc.len - o->p[o->n - 1].off;
            else if (s_push(o, pc.off, pc.len, 0) < 0)
                return -1;
            break;
        case TOK_SPLIT_MERGED_WITH_NEXT:
            break;                                 /* handled below, right to left */
        }
        prev_match = is_match;
    }
    if (p->behavior == TOK_SPLIT_MERGED_WITH_NEXT) {
        prev_match = 0;
        for (size_t i = m->n; i-- > 0;) {
            s_piece_t pc = m->p[i];
            int is_match = pc.added;
            if (is_match && !prev_match && o->n > first) {
                s_piece_t *last = &o->p[o->n - 1];
                last->len = last->off + last->len - pc.off;
                last->off = pc.off;
            } else if (s_push(o, pc.off, pc.len, 0) < 0)
                return -1;
            prev_match = is_match;
        }
        for (size_t i = first, j = o->n - 1; i < j; i++, j--) {
            s_piece_t tmp = o->p[i];
            o->p[i] = o->p[j];
            o->p[j] = tmp;
        }
    }
    /* Drop removed and empty pieces. */
    size_t w = first;
    for (size_t i = first; i < o->n; i++)
        if (!o->p[i].added && o->p[i].len > 0)
            o->p[w++] = o->p[i];
    o->n = w;
    for (size_t i = first; i < o->n; i++)
        o->p[i].added = -1;
    return 0;
}

/* Runs the pre-tokenizers over text and BPE-encodes every pre-token. */
static int s_pretokenize_and_encode(s_enc_t *e, const uint8_t *text, size_t n)
{
    const tokenizer_t *t = e->t;
    if (n == 0)
        return 0;
    e->work.n = 0;
    if (tok_buf_append(&e->work, text, n) < 0)
        return -1;
    e->cur.n = 0;
    if (s_push(&e->cur, 0, n, -1) < 0)
        return -1;
    s_pieces_t matches = {0};
    for (int k = 0; k < t->n_pre; k++) {
        const tok_pre_t *p = &t->pre[k];
        e->next.n = 0;
        for (size_t i = 0; i < e->cur.n; i++) {
            size_t off = e->cur.p[i].off, len = e->cur.p[i].len;
            if (p->kind == TOK_PRE_BYTELEVEL && p->add_prefix_space && e->work.p[off] != ' ') {
                if (tok_buf_reserve(&e->work, len + 1) < 0)
                    goto oom;
                size_t noff = e->work.n;
                e->work.p[e->work.n++] = ' ';
                memcpy(e->work.p + e->work.n, e->work.p + off, len);
                e->work.n += len;
                off = noff;
                len++;
            }
            if (p->regex || p->literal) {
                if (s_split(e, p, off, len, &matches) < 0)
                    goto oom;
            } else if (s_push(&e->next, off, len, -1) < 0)
                goto oom;
        }
        s_pieces_t tmp = e->cur;
        e->cur = e->next;
        e->next = tmp;
    }
    free(matches.p);
    for (size_t i = 0; i < e->cur.n; i++)
        if (tok_bpe_word(t, e->work.p + e->cur.p[i].off, e->cur.p[i].len, &e->bpe, &e->out) < 0)
            return -1;
    return 0;
oom:
    free(matches.p);
    return -1;
}

/* One piece of raw text between raw added tokens: normalize, cut normalized added tokens,
 * pre-tokenize and encode the rest. */
static int s_encode_text(s_enc_t *e, const uint8_t *s, size_t n)
{
    const tokenizer_t *t = e->t;
    const uint8_t *ns = s;
    size_t nn = n;
    if (t->nfc) {
        e->norm.n = 0;
        if (tok_nfc_append(s, n, &e->norm) < 0)
            return -1;
        ns = e->norm.p;
        nn = e->norm.n;
    }
    if (t->trie_norm.n == 0)
        return s_pretokenize_and_encode(e, ns, nn);
    e->normd.n = 0;
    if (s_split_added(t, &t->trie_norm, ns, nn, 0, &e->normd) < 0)
        return -1;
    for (size_t i = 0; i < e->normd.n; i++) {
        s_piece_t pc = e->normd.p[i];
        int rc = pc.added >= 0 ? tok_ids_push(&e->out, t->added[pc.added].id)
                               : s_pretokenize_and_encode(e, ns + pc.off, pc.len);
        if (rc < 0)
            return -1;
    }
    return 0;
}

int tok_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
               int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!text && len)
        return -1;
    const uint8_t *s = (const uint8_t *)(text ? text : "");
    if (len > UINT32_MAX / 2 || !tok_utf8_valid(s, len, NULL))
        return -1;

    s_enc_t e = {.t = t};
    int rc = -1;
    e.region = onig_region_new();
    if (!e.region)
        goto done;
    if (add_special)
        for (int i = 0; i < t->n_tmpl_pre; i++)
            if (tok_ids_push(&e.out, t->tmpl_pre[i]) < 0)
                goto done;
    if (s_split_added(t, &t->trie_raw, s, len, 0, &e.raw) < 0)
        goto done;
    for (size_t i = 0; i < e.raw.n; i++) {
        s_piece_t pc = e.raw.p[i];
        if (pc.added >= 0) {
            if (tok_ids_push(&e.out, t->added[pc.added].id) < 0)
                goto done;
        } else if (s_encode_text(&e, s + pc.off, pc.len) < 0)
            goto done;
    }
    if (add_special)
        for (int i = 0; i < t->n_tmpl_post; i++)
            if (tok_ids_push(&e.out, t->tmpl_post[i]) < 0)
                goto done;
    if (!e.out.p && tok_ids_push(&e.out, 0) == 0)
        e.out.n = 0;                              /* a non-NULL, empty result */
    if (!e.out.p)
        goto done;
    *ids = e.out.p;
    *n = e.out.n;
    e.out.p = NULL;
    rc = 0;
done:
    if (e.region)
        onig_region_free(e.region, 1);
    free(e.out.p);
    tok_bpe_scratch_free(&e.bpe);
    free(e.norm.p);
    free(e.work.p);
    free(e.raw.p);
    free(e.normd.p);
    free(e.cur.p);
    free(e.next.p);
    return rc;
}
