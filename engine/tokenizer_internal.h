/* engine/tokenizer_internal.h — what the tokenizer's source files share; not a public API.
 *
 *   tokenizer.c          loading tokenizer.json / tokenizer_config.json, accessors
 *   tokenizer_encode.c   added tokens, normalizer, pre-tokenizers, post-processor
 *   tokenizer_bpe.c      the BPE merge loop
 *   tokenizer_map.c      hash maps (bytes -> id, id pair -> merge) and the string arena
 *   tokenizer_decode.c   decode, streaming decode, lossy UTF-8
 *   tokenizer_nfc.c      NFC over tokenizer_nfc_table.c (generated from the UCD) */
#ifndef TROUPE_TOKENIZER_INTERNAL_H
#define TROUPE_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

/* ---- limits on untrusted files (every count is checked against these before allocating) ---- */
#define TOK_MAX_VOCAB      (1 << 22)    /* ids and vocab entries: 4 M, 25x Llama 3's */
#define TOK_MAX_MERGES     (1 << 23)    /* 8 M merges */
#define TOK_MAX_ADDED      (1 << 16)    /* added tokens */
#define TOK_MAX_TOKEN_LEN  (1 << 16)    /* bytes in one token's spelling */
#define TOK_MAX_PRE        16           /* pre-tokenizers / normalizers / processors in a Sequence */
#define TOK_MAX_TEMPLATE   64           /* ids a post-processor template may add */

/* ---- growable buffers ---- */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} tok_buf_t;

typedef struct {
    int32_t *p;
    size_t n, cap;
} tok_ids_t;

int tok_buf_reserve(tok_buf_t *b, size_t more);          /* room for n + more bytes */
int tok_buf_append(tok_buf_t *b, const void *src, size_t len);
int tok_ids_push(tok_ids_t *v, int32_t id);

/* ---- arena: stable pointers, freed all at once ---- */
typedef struct tok_arena_block tok_arena_block_t;
typedef struct {
    tok_arena_block_t *head;     /* newest block first */
} tok_arena_t;

void *tok_arena_alloc(tok_arena_t *a, size_t len);      /* NULL on out of memory */
void tok_arena_free(tok_arena_t *a);

/* ---- bytes -> int32 map (keys point into memory the owner keeps alive) ---- */
typedef struct {
    const uint8_t *key;
    uint32_t len;
    int32_t val;
    uint64_t hash;
} tok_strmap_slot_t;

typedef struct {
    tok_strmap_slot_t *slots;    /* [mask + 1]; key NULL = empty */
    size_t mask, count;
} tok_strmap_t;

int tok_strmap_init(tok_strmap_t *m, size_t expected);
void tok_strmap_free(tok_strmap_t *m);
/* Inserts or overwrites. Returns 1 if the key was new, 0 if overwritten, -1 out of memory. */
int tok_strmap_put(tok_strmap_t *m, const uint8_t *key, size_t len, int32_t val);
int32_t tok_strmap_get(const tok_strmap_t *m, const uint8_t *key, size_t len);   /* -1 if absent */

/* ---- (left id, right id) -> (rank, merged id) ---- */
typedef struct {
    uint64_t key;                /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t merged;
} tok_pairmap_slot_t;

typedef struct {
    tok_pairmap_slot_t *slots;   /* [mask + 1] */
    size_t mask, count;
} tok_pairmap_t;

int tok_pairmap_init(tok_pairmap_t *m, size_t expected);
void tok_pairmap_free(tok_pairmap_t *m);
void tok_pairmap_put(tok_pairmap_t *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
const tok_pairmap_slot_t *tok_pairmap_get(const tok_pairmap_t *m, int32_t a, int32_t b);

/* ---- the parts of a tokenizer.json we implement ---- */
typedef struct {
    int32_t id;
    const uint8_t *content;      /* in the arena; NUL-terminated too */
    uint32_t len;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added_t;

/* Byte trie over added-token contents: leftmost-longest matching. */
typedef struct {
    int32_t child;               /* first child node, -1 if none */
    int32_t sibling;             /* next node with the same parent, -1 if none */
    int32_t term;                /* index into tokenizer.added of the token ending here, or -1 */
    uint8_t byte;
} tok_trie_node_t;

typedef struct {
    int32_t root[256];           /* node for each first byte, -1 if none starts with it */
    tok_trie_node_t *nodes;
    size_t n, cap;
} tok_trie_t;

typedef enum {
    TOK_SPLIT_REMOVED = 0,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
} tok_split_behavior_t;

typedef enum { TOK_PRE_SPLIT = 0, TOK_PRE_BYTELEVEL } tok_pre_kind_t;

typedef struct {
    tok_pre_kind_t kind;
    void *regex;                 /* OnigRegex (Split with Regex, ByteLevel with use_regex) */
    uint8_t *literal;            /* Split with String: the literal (malloc'd), else NULL */
    size_t literal_len;
    tok_split_behavior_t behavior;
    int invert;
    int add_prefix_space;        /* ByteLevel */
} tok_pre_t;

struct tokenizer {
    char path[512];              /* tokenizer.json, for messages */
    tok_arena_t arena;           /* every token string and byte string below */

    /* ids */
    int32_t n_ids;               /* largest id + 1 */
    const char **id_str;         /* [n_ids] spelling as in the file, NULL where no token */
    const uint8_t **id_bytes;    /* [n_ids] bytes the ByteLevel decoder gives the token */
    uint32_t *id_bytes_len;      /* [n_ids] */
    uint8_t *id_flags;           /* [n_ids] TOK_F_* */
    size_t max_token_bytes;

    /* model (BPE) */
    tok_strmap_t vocab;          /* spelling -> id, model vocab then added tokens over it */
    tok_strmap_t vocab_bytes;    /* raw bytes -> id, for model tokens made only of byte chars */
    tok_pairmap_t merges;
    int32_t byte_id[256];        /* id of the one-byte token for each byte, -1 if absent */
    int ignore_merges;           /* a pre-token that is itself in the vocab is one token */

    /* added tokens */
    tok_added_t *added;          /* [n_added] */
    size_t n_added;
    tok_trie_t trie_raw;         /* normalized == false: matched on the input text */
    tok_trie_t trie_norm;        /* normalized == true: matched on the normalized text */
    void *word_re;               /* OnigRegex for a word character (single_word tokens), or NULL */

    /* normalizer */
    int nfc;

    /* pre-tokenizers, applied in order */
    tok_pre_t pre[TOK_MAX_PRE];
    int n_pre;

    /* post-processor: ids around the text when add_special */
    int32_t tmpl_pre[TOK_MAX_TEMPLATE], tmpl_post[TOK_MAX_TEMPLATE];
    int n_tmpl_pre, n_tmpl_post;

    int32_t bos_id, eos_id;
};

enum { TOK_F_ADDED = 1, TOK_F_SPECIAL = 2 };

/* ---- encoding pieces ---- */
typedef struct {
    int32_t *ids;                /* symbol id */
    int32_t *prev, *next;        /* linked list over symbols; -1 ends */
    uint8_t *alive;
    struct tok_merge_item *heap;
    size_t cap, heap_cap;
} tok_bpe_scratch_t;

void tok_bpe_scratch_free(tok_bpe_scratch_t *s);
/* Appends the ids of one pre-token (raw bytes) to out. -1 on out of memory. */
int tok_bpe_word(const tokenizer_t *t, const uint8_t *s, size_t n, tok_bpe_scratch_t *scr,
                 tok_ids_t *out);

/* ---- byte-level alphabet (GPT-2's bytes_to_unicode) ---- */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);                          /* -1 if cp is not in the alphabet */

/* ---- UTF-8 ---- */
/* 1 if s[0..n) is valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF); else 0 and *bad_at. */
int tok_utf8_valid(const uint8_t *s, size_t n, size_t *bad_at);
/* Decodes one code point of VALID UTF-8 at s[*i], advancing *i. */
static inline uint32_t tok_utf8_next(const uint8_t *s, size_t *i)
{
    uint8_t c = s[*i];
    if (c < 0x80) { (*i)++; return c; }
    if (c < 0xE0) { uint32_t cp = ((uint32_t)(c & 0x1F) << 6) | (s[*i + 1] & 0x3F); *i += 2; return cp; }
    if (c < 0xF0) {
        uint32_t cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[*i + 1] & 0x3F) << 6) | (s[*i + 2] & 0x3F);
        *i += 3;
        return cp;
    }
    uint32_t cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[*i + 1] & 0x3F) << 12) |
                  ((uint32_t)(s[*i + 2] & 0x3F) << 6) | (s[*i + 3] & 0x3F);
    *i += 4;
    return cp;
}
/* Writes cp as UTF-8 into out (room for 4); returns the length. */
size_t tok_utf8_put(uint32_t cp, uint8_t *out);
/* Unicode White_Space (what Rust's char::is_whitespace and regex \s accept). */
int tok_is_white_space(uint32_t cp);

/* ---- NFC ---- */
extern const char tok_nfc_unicode_version[];
extern const uint32_t tok_nfc_ccc[][3];
extern const size_t tok_nfc_ccc_n;
extern const uint32_t tok_nfc_decomp[][3];
extern const size_t tok_nfc_decomp_n;
extern const uint32_t tok_nfc_decomp_cps[];
extern const uint32_t tok_nfc_comp[][3];
extern const size_t tok_nfc_comp_n;

/* Appends NFC(s[0..n)) to out; s must be valid UTF-8. -1 on out of memory. */
int tok_nfc_append(const uint8_t *s, size_t n, tok_buf_t *out);

#endif
