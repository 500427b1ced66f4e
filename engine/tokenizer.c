/* engine/tokenizer.c — loading a Hugging Face tokenizer.json (+ tokenizer_config.json) and the
 * read-only accessors.
 *
 * The file is untrusted input: every field is type-checked, every id and count is bounded
 * (TOK_MAX_* in tokenizer_internal.h) before anything is sized from it, and every reference
 * (merge halves, template tokens, bos/eos) must resolve. A failure names the file, the JSON
 * path of the field and the problem. Components this engine does not implement are refused
 * by name rather than approximated, so a loaded tokenizer is one we reproduce exactly. */
#include <errno.h>
#include <jansson.h>
#include <oniguruma.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"
#include "engine/tokenizer_internal.h"

#define TOK_MAX_FILE_BYTES (512u << 20)

/* GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true. */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
    tokenizer_t *t;
    char *err;
    size_t errlen;
} s_ctx_t;

__attribute__((format(printf, 2, 3)))
static int s_fail(s_ctx_t *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return errf(c->err, c->errlen, "%s: %s", c->t->path, msg);
}

/* ---- JSON field helpers: each either fills *out or fails naming the field ---- */

static int s_get_bool(s_ctx_t *c, json_t *obj, const char *where, const char *key, int dflt, int *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return s_fail(c, "%s.%s: expected true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

/* A string field (or NULL when absent/null and optional). */
static int s_get_str(s_ctx_t *c, json_t *obj, const char *where, const char *key, int required,
                     const char **out, size_t *len)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return s_fail(c, "%s.%s: missing", where, key);
        *out = NULL;
        if (len)
            *len = 0;
        return 0;
    }
    if (!json_is_string(v))
        return s_fail(c, "%s.%s: expected a string", where, key);
    *out = json_string_value(v);
    if (len)
        *len = json_string_length(v);
    return 0;
}

static const char *s_type(json_t *obj)
{
    json_t *v = json_object_get(obj, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static char *s_arena_strdup(tokenizer_t *t, const void *s, size_t len)
{
    char *p = tok_arena_alloc(&t->arena, len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = 0;
    }
    return p;
}

/* Bytes a token spelling stands for under the byte-level alphabet. Returns 1 and fills
 * out/outlen when every character is in the alphabet, 0 when some character is not (the
 * decoder then uses the spelling's own UTF-8 bytes, as `tokenizers` does). */
static int s_unmap(const uint8_t *s, size_t len, uint8_t *out, size_t *outlen)
{
    size_t i = 0, k = 0;
    while (i < len) {
        uint32_t cp = tok_utf8_next(s, &i);
        int b = tok_cp_to_byte(cp);
        if (b < 0)
            return 0;
        out[k++] = (uint8_t)b;
    }
    *outlen = k;
    return 1;
}

/* ---- model ---- */

static int s_load_vocab(s_ctx_t *c, json_t *model, int32_t *max_id)
{
    tokenizer_t *t = c->t;
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return s_fail(c, "model.vocab: expected an object of token -> id");
    size_t n = json_object_size(vocab);
    if (n == 0)
        return s_fail(c, "model.vocab: empty");
    if (n > TOK_MAX_VOCAB)
        return s_fail(c, "model.vocab: %zu entries exceed the limit of %d", n, TOK_MAX_VOCAB);
    if (tok_strmap_init(&t->vocab, n) < 0 || tok_strmap_init(&t->vocab_bytes, n) < 0)
        return s_fail(c, "out of memory for %zu vocab entries", n);

    const char *key;
    json_t *val;
    *max_id = -1;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val))
            return s_fail(c, "model.vocab[\"%.60s\"]: id is not an integer", key);
        json_int_t id = json_integer_value(val);
        if (id < 0 || id >= TOK_MAX_VOCAB)
            return s_fail(c, "model.vocab[\"%.60s\"]: id %lld out of range [0, %d)", key,
                          (long long)id, TOK_MAX_VOCAB);
        size_t len = strlen(key);
        if (len > TOK_MAX_TOKEN_LEN)
            return s_fail(c, "model.vocab: a token of %zu bytes exceeds %d", len, TOK_MAX_TOKEN_LEN);
        if (id > *max_id)
            *max_id = (int32_t)id;
    }
    return 0;
}

/* Fills the id tables from model.vocab once n_ids is known. */
static int s_fill_vocab(s_ctx_t *c, json_t *model)
{
    tokenizer_t *t = c->t;
    json_t *vocab = json_object_get(model, "vocab");
    const char *key;
    json_t *val;
    uint8_t *tmp = malloc(TOK_MAX_TOKEN_LEN + 1);
    if (!tmp)
        return s_fail(c, "out of memory");
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t len = strlen(key);
        if (t->id_str[id]) {
            free(tmp);
            return s_fail(c, "model.vocab: id %d is given to both \"%.60s\" and \"%.60s\"", id,
                          t->id_str[id], key);
        }
        char *s = s_arena_strdup(t, key, len);
        if (!s)
            goto oom;
        t->id_str[id] = s;
        if (tok_strmap_put(&t->vocab, (const uint8_t *)s, len, id) < 0)
            goto oom;
        size_t blen;
        if (s_unmap((const uint8_t *)s, len, tmp, &blen)) {
            uint8_t *b = tok_arena_alloc(&t->arena, blen ? blen : 1);
            if (!b)
                goto oom;
            memcpy(b, tmp, blen);
            t->id_bytes[id] = b;
            t->id_bytes_len[id] = (uint32_t)blen;
            if (tok_strmap_put(&t->vocab_bytes, b, blen, id) < 0)
                goto oom;
            if (blen == 1)
                t->byte_id[b[0]] = id;
        } else {
            t->id_bytes[id] = (const uint8_t *)s;
            t->id_bytes_len[id] = (uint32_t)len;
        }
    }
    free(tmp);
    return 0;
oom:
    free(tmp);
    return s_fail(c, "out of memory loading model.vocab");
}

static int s_merge_id(s_ctx_t *c, size_t rank, const char *part, size_t len)
{
    int32_t id = tok_strmap_get(&c->t->vocab, (const uint8_t *)part, len);
    if (id < 0)
        s_fail(c, "model.merges[%zu]: token \"%.*s\" is not in model.vocab", rank,
               (int)(len > 60 ? 60 : len), part);
    return id;
}

static int s_load_merges(s_ctx_t *c, json_t *model)
{
    tokenizer_t *t = c->t;
    json_t *merges = json_object_get(model, "merges");
    if (!merges || json_is_null(merges))
        merges = NULL;
    else if (!json_is_array(merges))
        return s_fail(c, "model.merges: expected an array");
    size_t n = merges ? json_array_size(merges) : 0;
    if (n > TOK_MAX_MERGES)
        return s_fail(c, "model.merges: %zu merges exceed the limit of %d", n, TOK_MAX_MERGES);
    if (tok_pairmap_init(&t->merges, n) < 0)
        return s_fail(c, "out of memory for %zu merges", n);
    char *cat = malloc(2 * TOK_MAX_TOKEN_LEN + 1);
    if (!cat)
        return s_fail(c, "out of memory");
    for (size_t r = 0; r < n; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) {
            /* "a b": byte-level tokens never contain U+0020, so the space is unambiguous. */
            const char *s = json_string_value(m);
            size_t len = json_string_length(m);
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s))) {
                free(cat);
                return s_fail(c, "model.merges[%zu]: \"%.60s\" is not two tokens separated by one space", r, s);
            }
            a = s;
            la = (size_t)(sp - s);
            b = sp + 1;
            lb = len - la - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            la = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            lb = json_string_length(json_array_get(m, 1));
        } else {
            free(cat);
            return s_fail(c, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", r);
        }
        if (la > TOK_MAX_TOKEN_LEN || lb > TOK_MAX_TOKEN_LEN) {
            free(cat);
            return s_fail(c, "model.merges[%zu]: token longer than %d bytes", r, TOK_MAX_TOKEN_LEN);
        }
        int32_t ia = s_merge_id(c, r, a, la);
        int32_t ib = ia < 0 ? -1 : s_merge_id(c, r, b, lb);
        if (ia < 0 || ib < 0) {
            free(cat);
            return -1;
        }
        memcpy(cat, a, la);
        memcpy(cat + la, b, lb);
        int32_t im = tok_strmap_get(&t->vocab, (const uint8_t *)cat, la + lb);
        if (im < 0) {
            s_fail(c, "model.merges[%zu]: merged token \"%.*s\" is not in model.vocab", r,
                   (int)(la + lb > 60 ? 60 : la + lb), cat);
            free(cat);
            return -1;
        }
        tok_pairmap_put(&t->merges, ia, ib, (int32_t)r, im);
    }
    free(cat);
    return 0;
}

static int s_check_model_options(s_ctx_t *c, json_t *model)
{
    const char *type = s_type(model);
    if (type && strcmp(type, "BPE") != 0)
        return s_fail(c, "model.type: \"%s\" is not supported (only BPE)", type);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return s_fail(c, "model.dropout: BPE dropout is not supported (must be null)");
    int byte_fallback = 0;
    if (s_get_bool(c, model, "model", "byte_fallback", 0, &byte_fallback) < 0)
        return -1;
    if (byte_fallback)
        return s_fail(c, "model.byte_fallback: true is not supported");
    const char *affix;
    size_t len;
    if (s_get_str(c, model, "model", "continuing_subword_prefix", 0, &affix, &len) < 0)
        return -1;
    if (affix && len)
        return s_fail(c, "model.continuing_subword_prefix: \"%s\" is not supported (null or \"\")", affix);
    if (s_get_str(c, model, "model", "end_of_word_suffix", 0, &affix, &len) < 0)
        return -1;
    if (affix && len)
        return s_fail(c, "model.end_of_word_suffix: \"%s\" is not supported (null or \"\")", affix);
    return s_get_bool(c, model, "model", "ignore_merges", 0, &c->t->ignore_merges);
}

/* ---- added tokens ---- */

static int s_trie_add(tok_trie_t *tr, const uint8_t *s, size_t len, int32_t term)
{
    if (tr->n + len > tr->cap) {                  /* room for the whole path up front */
        size_t cap = tr->cap ? tr->cap : 256;
        while (cap < tr->n + len)
            cap *= 2;
        tok_trie_node_t *p = realloc(tr->nodes, cap * sizeof *p);
        if (!p)
            return -1;
        tr->nodes = p;
        tr->cap = cap;
    }
    int32_t node = -1;
    for (size_t i = 0; i < len; i++) {
        int32_t *link = i == 0 ? &tr->root[s[0]] : &tr->nodes[node].child;
        while (*link >= 0 && tr->nodes[*link].byte != s[i])
            link = &tr->nodes[*link].sibling;
        if (*link < 0) {
            int32_t k = (int32_t)tr->n++;
            tr->nodes[k] = (tok_trie_node_t){.child = -1, .sibling = -1, .term = -1, .byte = s[i]};
            *link = k;
        }
        node = *link;
    }
    tr->nodes[node].term = term;
    return 0;
}

static int s_load_added(s_ctx_t *c, json_t *root, int32_t *max_id)
{
    tokenizer_t *t = c->t;
    json_t *arr = json_object_get(root, "added_tokens");
    if (!arr || json_is_null(arr))
        return 0;
    if (!json_is_array(arr))
        return s_fail(c, "added_tokens: expected an array");
    size_t n = json_array_size(arr);
    if (n > TOK_MAX_ADDED)
        return s_fail(c, "added_tokens: %zu entries exceed the limit of %d", n, TOK_MAX_ADDED);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added)
        return s_fail(c, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!json_is_object(o))
            return s_fail(c, "%s: expected an object", where);
        json_t *idv = json_object_get(o, "id");
        if (!json_is_integer(idv))
            return s_fail(c, "%s.id: expected an integer", where);
        json_int_t id = json_integer_value(idv);
        if (id < 0 || id >= TOK_MAX_VOCAB)
            return s_fail(c, "%s.id: %lld out of range [0, %d)", where, (long long)id, TOK_MAX_VOCAB);
        const char *content;
        size_t len;
        if (s_get_str(c, o, where, "content", 1, &content, &len) < 0)
            return -1;
        if (len > TOK_MAX_TOKEN_LEN)
            return s_fail(c, "%s.content: %zu bytes exceed %d", where, len, TOK_MAX_TOKEN_LEN);
        if (!tok_utf8_valid((const uint8_t *)content, len, NULL))
            return s_fail(c, "%s.content: not valid UTF-8", where);
        tok_added_t *a = &t->added[t->n_added];
        int special = 0, lstrip = 0, rstrip = 0, single_word = 0, normalized = 0;
        if (s_get_bool(c, o, where, "special", 0, &special) < 0 ||
            s_get_bool(c, o, where, "lstrip", 0, &lstrip) < 0 ||
            s_get_bool(c, o, where, "rstrip", 0, &rstrip) < 0 ||
            s_get_bool(c, o, where, "single_word", 0, &single_word) < 0 ||
            s_get_bool(c, o, where, "normalized", !special, &normalized) < 0)
            return -1;
        if (len == 0)
            continue;                             /* `tokenizers` ignores empty added tokens */
        char *s = s_arena_strdup(t, content, len);
        if (!s)
            return s_fail(c, "out of memory");
        *a = (tok_added_t){.id = (int32_t)id, .content = (const uint8_t *)s, .len = (uint32_t)len,
                           .special = (uint8_t)special, .lstrip = (uint8_t)lstrip,
                           .rstrip = (uint8_t)rstrip, .single_word = (uint8_t)single_word,
                           .normalized = (uint8_t)normalized};
        t->n_added++;
        if (id > *max_id)
            *max_id = (int32_t)id;
    }
    return 0;
}

/* Added tokens take their ids over (a spelling and decode bytes of their own) and go into the
 * trie they are matched with. A token listed twice keeps its last entry, as in `tokenizers`. */
static int s_fill_added(s_ctx_t *c)
{
    tokenizer_t *t = c->t;
    for (int i = 0; i < 256; i++)
        t->trie_raw.root[i] = t->trie_norm.root[i] = -1;
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added_t *a = &t->added[i];
        t->id_str[a->id] = (const char *)a->content;
        t->id_flags[a->id] = TOK_F_ADDED | (a->special ? TOK_F_SPECIAL : 0);
        uint8_t *b = tok_arena_alloc(&t->arena, a->len);
        if (!b)
            return s_fail(c, "out of memory");
        size_t blen;
        if (s_unmap(a->content, a->len, b, &blen)) {
            t->id_bytes[a->id] = b;
            t->id_bytes_len[a->id] = (uint32_t)blen;
        } else {
            t->id_bytes[a->id] = a->content;
            t->id_bytes_len[a->id] = a->len;
        }
    }
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added_t *a = &t->added[i];
        int rc;
        if (!a->normalized) {
            rc = s_trie_add(&t->trie_raw, a->content, a->len, (int32_t)i);
        } else {
            /* Matched against normalized text, so the pattern is normalized too. */
            tok_buf_t nb = {0};
            rc = t->nfc ? tok_nfc_append(a->content, a->len, &nb) : tok_buf_append(&nb, a->content, a->len);
            if (rc == 0 && nb.n)
                rc = s_trie_add(&t->trie_norm, nb.p, nb.n, (int32_t)i);
            free(nb.p);
        }
        if (rc < 0)
            return s_fail(c, "out of memory");
    }
    return 0;
}

/* ---- components ---- */

typedef int (*s_loader_fn)(s_ctx_t *c, json_t *o, const char *where, int depth);

/* A "Sequence" component (normalizer, pre-tokenizer or post-processor): loads every element of
 * o[key] with `load` at depth 1, where a nested Sequence is refused. At most TOK_MAX_PRE. */
static int s_load_sequence(s_ctx_t *c, json_t *o, const char *key, const char *where, s_loader_fn load)
{
    json_t *arr = json_object_get(o, key);
    if (!json_is_array(arr))
        return s_fail(c, "%s.%s: expected an array", where, key);
    if (json_array_size(arr) > TOK_MAX_PRE)
        return s_fail(c, "%s.%s: more than %d entries", where, key, TOK_MAX_PRE);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        char w[64];
        snprintf(w, sizeof w, "%s.%s[%zu]", where, key, i);
        if (load(c, json_array_get(arr, i), w, 1) < 0)
            return -1;
    }
    return 0;
}

/* ---- normalizer ---- */

static int s_load_normalizer(s_ctx_t *c, json_t *n, const char *where, int depth)
{
    if (!n || json_is_null(n))
        return 0;
    if (!json_is_object(n))
        return s_fail(c, "%s: expected an object or null", where);
    const char *type = s_type(n);
    if (!type)
        return s_fail(c, "%s.type: missing", where);
    if (strcmp(type, "NFC") == 0) {
        c->t->nfc = 1;
        return 0;
    }
    if (strcmp(type, "Sequence") == 0 && depth == 0)
        return s_load_sequence(c, n, "normalizers", where, s_load_normalizer);
    return s_fail(c, "%s.type: normalizer \"%s\" is not supported (NFC or a Sequence of NFC)", where, type);
}

/* ---- pre-tokenizers ---- */

/* Oniguruma initialises its encoding tables on first use, which is not safe to race; do it
 * once, explicitly, as its documentation asks of multi-threaded programs. */
static pthread_once_t s_onig_once = PTHREAD_ONCE_INIT;

static void s_onig_init(void)
{
    OnigEncoding encs[1] = {ONIG_ENCODING_UTF8};
    onig_initialize(encs, 1);
}

static int s_compile(s_ctx_t *c, const char *where, const char *pattern, size_t len, void **out)
{
    pthread_once(&s_onig_once, s_onig_init);
    OnigRegex re;
    OnigErrorInfo einfo;
    int r = onig_new(&re, (const OnigUChar *)pattern, (const OnigUChar *)pattern + len,
                     ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &einfo);
    if (r != ONIG_NORMAL) {
        OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, r, &einfo);
        return s_fail(c, "%s: regex does not compile: %s", where, (const char *)msg);
    }
    *out = re;
    return 0;
}

static int s_load_split(s_ctx_t *c, json_t *o, const char *where, tok_pre_t *p)
{
    json_t *pat = json_object_get(o, "pattern");
    if (!json_is_object(pat))
        return s_fail(c, "%s.pattern: expected {\"Regex\": ...} or {\"String\": ...}", where);
    json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    char w[96];
    if (json_is_string(rx)) {
        snprintf(w, sizeof w, "%s.pattern.Regex", where);
        if (s_compile(c, w, json_string_value(rx), json_string_length(rx), &p->regex) < 0)
            return -1;
    } else if (json_is_string(lit)) {
        size_t len = json_string_length(lit);
        if (len == 0)
            return s_fail(c, "%s.pattern.String: empty", where);
        p->literal = malloc(len);
        if (!p->literal)
            return s_fail(c, "out of memory");
        memcpy(p->literal, json_string_value(lit), len);
        p->literal_len = len;
    } else
        return s_fail(c, "%s.pattern: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}", where);

    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *beh;
    if (s_get_str(c, o, where, "behavior", 1, &beh, NULL) < 0)
        return -1;
    size_t k = 0;
    while (k < ARRAY_LEN(names) && strcmp(names[k], beh) != 0)
        k++;
    if (k == ARRAY_LEN(names))
        return s_fail(c, "%s.behavior: \"%s\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous", where, beh);
    p->behavior = (tok_split_behavior_t)k;
    return s_get_bool(c, o, where, "invert", 0, &p->invert);
}

static int s_load_pre(s_ctx_t *c, json_t *o, const char *where, int depth)
{
    tokenizer_t *t = c->t;
    if (!o || json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return s_fail(c, "%s: expected an object or null", where);
    const char *type = s_type(o);
    if (!type)
        return s_fail(c, "%s.type: missing", where);
    if (strcmp(type, "Sequence") == 0 && depth == 0)
        return s_load_sequence(c, o, "pretokenizers", where, s_load_pre);
    if (t->n_pre == TOK_MAX_PRE)
        return s_fail(c, "%s: more than %d pre-tokenizers", where, TOK_MAX_PRE);
    if (t->n_pre > 0 && t->pre[t->n_pre - 1].kind == TOK_PRE_BYTELEVEL)
        return s_fail(c, "%s: a pre-tokenizer after ByteLevel is not supported (ByteLevel must come last)", where);
    tok_pre_t *p = &t->pre[t->n_pre];
    *p = (tok_pre_t){0};
    if (strcmp(type, "Split") == 0) {
        p->kind = TOK_PRE_SPLIT;
        t->n_pre++;                                /* counted first so destroy frees a regex */
        return s_load_split(c, o, where, p);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        int use_regex = 0;
        p->kind = TOK_PRE_BYTELEVEL;
        t->n_pre++;
        if (s_get_bool(c, o, where, "add_prefix_space", 1, &p->add_prefix_space) < 0 ||
            s_get_bool(c, o, where, "use_regex", 1, &use_regex) < 0)
            return -1;
        p->behavior = TOK_SPLIT_ISOLATED;
        if (use_regex)
            return s_compile(c, where, GPT2_REGEX, sizeof GPT2_REGEX - 1, &p->regex);
        return 0;
    }
    return s_fail(c, "%s.type: pre-tokenizer \"%s\" is not supported (Split, ByteLevel or a Sequence of them)", where, type);
}

/* ---- post-processor ---- */

static int s_template_ids(s_ctx_t *c, json_t *o, const char *where)
{
    tokenizer_t *t = c->t;
    json_t *single = json_object_get(o, "single");
    json_t *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single))
        return s_fail(c, "%s.single: expected an array", where);
    if (specials && !json_is_null(specials) && !json_is_object(specials))
        return s_fail(c, "%s.special_tokens: expected an object", where);
    int seen_seq = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i);
        json_t *seq = json_object_get(item, "Sequence");
        json_t *sp = json_object_get(item, "SpecialToken");
        if (json_is_object(seq)) {
            if (seen_seq)
                return s_fail(c, "%s.single[%zu]: the sequence appears twice", where, i);
            seen_seq = 1;
            continue;
        }
        if (!json_is_object(sp) || !json_is_string(json_object_get(sp, "id")))
            return s_fail(c, "%s.single[%zu]: expected {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}", where, i);
        const char *name = json_string_value(json_object_get(sp, "id"));
        json_t *def = specials ? json_object_get(specials, name) : NULL;
        json_t *ids = def ? json_object_get(def, "ids") : NULL;
        if (!json_is_array(ids))
            return s_fail(c, "%s.special_tokens[\"%.60s\"].ids: missing (the template names it)", where, name);
        for (size_t k = 0; k < json_array_size(ids); k++) {
            json_t *v = json_array_get(ids, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= t->n_ids)
                return s_fail(c, "%s.special_tokens[\"%.60s\"].ids[%zu]: not an id of this vocabulary", where, name, k);
            int32_t *arr = seen_seq ? t->tmpl_post : t->tmpl_pre;
            int *cnt = seen_seq ? &t->n_tmpl_post : &t->n_tmpl_pre;
            if (*cnt == TOK_MAX_TEMPLATE)
                return s_fail(c, "%s.single: more than %d template ids", where, TOK_MAX_TEMPLATE);
            arr[(*cnt)++] = (int32_t)json_integer_value(v);
        }
    }
    if (!seen_seq)
        return s_fail(c, "%s.single: no {\"Sequence\": ...} item", where);
    return 0;
}

static int s_load_post(s_ctx_t *c, json_t *o, const char *where, int depth)
{
    if (!o || json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return s_fail(c, "%s: expected an object or null", where);
    const char *type = s_type(o);
    if (!type)
        return s_fail(c, "%s.type: missing", where);
    if (strcmp(type, "ByteLevel") == 0)
        return 0;                                 /* only trims offsets; ids are unchanged */
    if (strcmp(type, "TemplateProcessing") == 0) {
        if (c->t->n_tmpl_pre || c->t->n_tmpl_post)
            return s_fail(c, "%s: a second TemplateProcessing is not supported", where);
        return s_template_ids(c, o, where);
    }
    if (strcmp(type, "Sequence") == 0 && depth == 0)
        return s_load_sequence(c, o, "processors", where, s_load_post);
    return s_fail(c, "%s.type: post-processor \"%s\" is not supported (TemplateProcessing, ByteLevel or a Sequence of them)", where, type);
}

static int s_check_decoder(s_ctx_t *c, json_t *o)
{
    if (!json_is_object(o))
        return s_fail(c, "decoder: missing (a ByteLevel decoder is required)");
    const char *type = s_type(o);
    if (!type || strcmp(type, "ByteLevel") != 0)
        return s_fail(c, "decoder.type: \"%s\" is not supported (ByteLevel)", type ? type : "(none)");
    return 0;
}

/* ---- tokenizer_config.json ---- */

/* bos_token / eos_token: a string, an AddedToken object {"content": ...}, or null. */
static int s_config_token(s_ctx_t *c, const char *cfg_path, json_t *cfg, const char *key, int32_t *out)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v))
        return 0;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return errf(c->err, c->errlen, "%s: %s: expected a string, {\"content\": ...} or null", cfg_path, key);
    int id = tok_token_id(c->t, json_string_value(v));
    if (id < 0)
        return errf(c->err, c->errlen, "%s: %s: \"%.60s\" is not a token of %s", cfg_path, key,
                    json_string_value(v), c->t->path);
    *out = id;
    return 0;
}

/* A JSON file, opened here so that one that cannot be read says why ("cannot open: Permission
 * denied", "read failed: Is a directory"): jansson's message for a file it cannot open has no
 * position (line and column -1) and names the file twice, and a directory reads to it as an
 * empty file. A parse error gets "file:line:column: " only where jansson knows the position. */
static json_t *s_load_json_file(const char *path, size_t flags, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    json_error_t jerr;
    errno = 0;
    json_t *root = json_loadf(f, flags, &jerr);
    const int read_errno = ferror(f) ? (errno ? errno : EIO) : 0;
    fclose(f);
    if (root)
        return root;
    if (read_errno)
        errf(err, errlen, "%s: read failed: %s", path, strerror(read_errno));
    else if (jerr.line >= 1 && jerr.column >= 0)
        errf(err, errlen, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    else
        errf(err, errlen, "%s: %s", path, jerr.text);
    return NULL;
}

static int s_load_config(s_ctx_t *c, const char *cfg_path)
{
    struct stat st;
    if (stat(cfg_path, &st) != 0)
        return 0;                                 /* optional */
    if (st.st_size > (off_t)TOK_MAX_FILE_BYTES)
        return errf(c->err, c->errlen, "%s: %lld bytes is larger than %u", cfg_path,
                    (long long)st.st_size, TOK_MAX_FILE_BYTES);
    /* As reals: model_max_length is often 1e30 written as an integer, too big for json_int_t;
     * only strings are read from this file. */
    json_t *cfg = s_load_json_file(cfg_path, JSON_DECODE_INT_AS_REAL, c->err, c->errlen);
    if (!cfg)
        return -1;
    int rc = -1;
    if (!json_is_object(cfg)) {
        errf(c->err, c->errlen, "%s: expected a JSON object", cfg_path);
        goto done;
    }
    int32_t bos = -1, eos = -1;
    if (s_config_token(c, cfg_path, cfg, "bos_token", &bos) < 0 ||
        s_config_token(c, cfg_path, cfg, "eos_token", &eos) < 0)
        goto done;
    /* The config names the model's tokens; where it says nothing, the template's stand. */
    if (json_object_get(cfg, "bos_token"))
        c->t->bos_id = bos;
    if (json_object_get(cfg, "eos_token"))
        c->t->eos_id = eos;
    rc = 0;
done:
    json_decref(cfg);
    return rc;
}

/* ---- tok_load ---- */

static int s_load_json(s_ctx_t *c, json_t *root)
{
    tokenizer_t *t = c->t;
    if (!json_is_object(root))
        return s_fail(c, "expected a JSON object at the top level");
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return s_fail(c, "model: missing or not an object");
    if (s_check_model_options(c, model) < 0)
        return -1;
    if (s_check_decoder(c, json_object_get(root, "decoder")) < 0)
        return -1;

    int32_t max_vocab = -1, max_added = -1;
    if (s_load_vocab(c, model, &max_vocab) < 0 || s_load_added(c, root, &max_added) < 0)
        return -1;
    t->n_ids = (max_vocab > max_added ? max_vocab : max_added) + 1;
    t->id_str = calloc((size_t)t->n_ids, sizeof *t->id_str);
    t->id_bytes = calloc((size_t)t->n_ids, sizeof *t->id_bytes);
    t->id_bytes_len = calloc((size_t)t->n_ids, sizeof *t->id_bytes_len);
    t->id_flags = calloc((size_t)t->n_ids, 1);
    if (!t->id_str || !t->id_bytes || !t->id_bytes_len || !t->id_flags)
        return s_fail(c, "out of memory for %d ids", t->n_ids);
    for (int i = 0; i < 256; i++)
        t->byte_id[i] = -1;
    if (s_fill_vocab(c, model) < 0 || s_load_merges(c, model) < 0)
        return -1;

    const char *unk = NULL;
    if (s_get_str(c, model, "model", "unk_token", 0, &unk, NULL) < 0)
        return -1;
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0 && unk)
            return s_fail(c, "model.vocab: byte 0x%02x has no token and unk_token is set (not supported)", b);

    if (s_load_normalizer(c, json_object_get(root, "normalizer"), "normalizer", 0) < 0)
        return -1;
    if (s_fill_added(c) < 0)
        return -1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].single_word) {
            /* Rust regex's Unicode \w, which `tokenizers` uses to tell word boundaries. */
            static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
            if (s_compile(c, "added_tokens (single_word)", word, sizeof word - 1, &t->word_re) < 0)
                return -1;
            break;
        }
    if (s_load_pre(c, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", 0) < 0)
        return -1;
    if (t->n_pre == 0 || t->pre[t->n_pre - 1].kind != TOK_PRE_BYTELEVEL)
        return s_fail(c, "pre_tokenizer: no ByteLevel pre-tokenizer (only byte-level BPE is supported)");
    if (s_load_post(c, json_object_get(root, "post_processor"), "post_processor", 0) < 0)
        return -1;

    for (int32_t i = 0; i < t->n_ids; i++)
        if (t->id_bytes[i] && t->id_bytes_len[i] > t->max_token_bytes)
            t->max_token_bytes = t->id_bytes_len[i];
    t->bos_id = t->n_tmpl_pre ? t->tmpl_pre[t->n_tmpl_pre - 1] : -1;
    t->eos_id = t->n_tmpl_post ? t->tmpl_post[0] : -1;
    return 0;
}

tokenizer_t *tok_load(const char *path, char *err, size_t errlen)
{
    if (!path)
        return errf(err, errlen, "tok_load: no path"), NULL;
    tokenizer_t *t = calloc(1, sizeof *t);
    if (!t)
        return errf(err, errlen, "tok_load: out of memory"), NULL;
    s_ctx_t c = {t, err, errlen};
    char cfg[sizeof t->path];

    struct stat st;
    if (stat(path, &st) != 0) {
        errf(err, errlen, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(t->path, sizeof t->path, "%s/tokenizer.json", path) >= sizeof t->path ||
            (size_t)snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", path) >= sizeof cfg) {
            errf(err, errlen, "%s: path too long", path);
            goto fail;
        }
        if (stat(t->path, &st) != 0) {
            errf(err, errlen, "%s: %s", t->path, strerror(errno));
            goto fail;
        }
    } else {
        if ((size_t)snprintf(t->path, sizeof t->path, "%s", path) >= sizeof t->path) {
            errf(err, errlen, "%s: path too long", path);
            goto fail;
        }
        const char *slash = strrchr(path, '/');
        int dirlen = slash ? (int)(slash - path) : 1;
        snprintf(cfg, sizeof cfg, "%.*s/tokenizer_config.json", dirlen, slash ? path : ".");
    }
    if (st.st_size > (off_t)TOK_MAX_FILE_BYTES) {
        errf(err, errlen, "%s: %lld bytes is larger than %u", t->path, (long long)st.st_size, TOK_MAX_FILE_BYTES);
        goto fail;
    }

    json_t *root = s_load_json_file(t->path, 0, err, errlen);
    if (!root)
        goto fail;
    int rc = s_load_json(&c, root);
    json_decref(root);
    if (rc < 0 || s_load_config(&c, cfg) < 0)
        goto fail;
    return t;
fail:
    tok_destroy(&t);
    return NULL;
}

void tok_destroy(tokenizer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    tokenizer_t *t = *self_p;
    for (int i = 0; i < t->n_pre; i++) {
        if (t->pre[i].regex)
            onig_free((OnigRegex)t->pre[i].regex);
        free(t->pre[i].literal);
    }
    if (t->word_re)
        onig_free((OnigRegex)t->word_re);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    free(t->added);
    tok_strmap_free(&t->vocab);
    tok_strmap_free(&t->vocab_bytes);
    tok_pairmap_free(&t->merges);
    free(t->id_str);
    free(t->id_bytes);
    free(t->id_bytes_len);
    free(t->id_flags);
    tok_arena_free(&t->arena);
    free(t);
    *self_p = NULL;
}

/* ---- accessors ---- */

int tok_vocab_size(const tokenizer_t *t) { return t->n_ids; }
int tok_bos_id(const tokenizer_t *t) { return t->bos_id; }
int tok_eos_id(const tokenizer_t *t) { return t->eos_id; }
size_t tok_max_token_bytes(const tokenizer_t *t) { return t->max_token_bytes; }

int tok_token_id(const tokenizer_t *t, const char *token)
{
    if (!token)
        return -1;
    size_t len = strlen(token);
    for (size_t i = t->n_added; i-- > 0;)         /* the last entry for a spelling wins */
        if (t->added[i].len == len && memcmp(t->added[i].content, token, len) == 0)
            return t->added[i].id;
    return tok_strmap_get(&t->vocab, (const uint8_t *)token, len);
}

const char *tok_token_str(const tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_ids ? t->id_str[id] : NULL;
}

const uint8_t *tok_token_bytes(const tokenizer_t *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->id_bytes[id]) {
        *len = 0;
        return NULL;
    }
    *len = t->id_bytes_len[id];
    return t->id_bytes[id];
}

int tok_is_special(const tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && (t->id_flags[id] & TOK_F_SPECIAL);
}
