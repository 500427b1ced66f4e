/* engine/tokenizer_map.c — the tokenizer's containers: growable buffers, a string arena, and two
 * open-addressing hash maps (token bytes -> id, id pair -> merge).
 *
 * Vocabularies are 100k-300k entries loaded once and then only read, so the maps are plain
 * linear-probing tables kept at most half full; the string map keys point into the tokenizer's
 * arena instead of copying. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "engine/tokenizer_internal.h"

/* ---- growable buffers ---- */

int tok_buf_reserve(tok_buf_t *b, size_t more)
{
    if (more > SIZE_MAX / 2 - b->n)
        return -1;
    if (b->n + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + more)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tok_buf_append(tok_buf_t *b, const void *src, size_t len)
{
    if (tok_buf_reserve(b, len) < 0)
        return -1;
    if (len)
        memcpy(b->p + b->n, src, len);
    b->n += len;
    return 0;
}

int tok_ids_push(tok_ids_t *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return 0;
}

/* ---- arena ---- */

#define ARENA_BLOCK (1u << 20)

struct tok_arena_block {
    tok_arena_block_t *next;
    size_t used, cap;
    max_align_t data[];          /* aligned for any use */
};

void *tok_arena_alloc(tok_arena_t *a, size_t len)
{
    len = (len + 7) & ~(size_t)7;
    tok_arena_block_t *b = a->head;
    if (!b || b->cap - b->used < len) {
        size_t cap = len > ARENA_BLOCK ? len : ARENA_BLOCK;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += len;
    return p;
}

void tok_arena_free(tok_arena_t *a)
{
    while (a->head) {
        tok_arena_block_t *next = a->head->next;
        free(a->head);
        a->head = next;
    }
}

/* ---- bytes -> id ---- */

static size_t s_table_size(size_t expected)
{
    size_t n = 16;
    while (n < expected * 2 + 1)
        n *= 2;
    return n;
}

int tok_strmap_init(tok_strmap_t *m, size_t expected)
{
    size_t n = s_table_size(expected);
    m->slots = calloc(n, sizeof *m->slots);
    if (!m->slots)
        return -1;
    m->mask = n - 1;
    m->count = 0;
    return 0;
}

void tok_strmap_free(tok_strmap_t *m)
{
    free(m->slots);
    m->slots = NULL;
    m->mask = m->count = 0;
}

static int s_strmap_grow(tok_strmap_t *m)
{
    size_t n = (m->mask + 1) * 2;
    tok_strmap_slot_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return -1;
    for (size_t i = 0; i <= m->mask; i++) {
        tok_strmap_slot_t *s = &m->slots[i];
        if (!s->key)
            continue;
        size_t j = s->hash & (n - 1);
        while (slots[j].key)
            j = (j + 1) & (n - 1);
        slots[j] = *s;
    }
    free(m->slots);
    m->slots = slots;
    m->mask = n - 1;
    return 0;
}

int tok_strmap_put(tok_strmap_t *m, const uint8_t *key, size_t len, int32_t val)
{
    if ((m->count + 1) * 2 > m->mask + 1 && s_strmap_grow(m) < 0)
        return -1;
    /* A zero-length key still needs a non-NULL pointer: NULL marks an empty slot. */
    static const uint8_t empty_key[1];
    if (!key)
        key = empty_key;
    uint64_t h = XXH3_64bits(key, len);
    size_t i = h & m->mask;
    for (;;) {
        tok_strmap_slot_t *s = &m->slots[i];
        if (!s->key) {
            s->key = key;
            s->len = (uint32_t)len;
            s->val = val;
            s->hash = h;
            m->count++;
            return 1;
        }
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            s->val = val;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
}

int32_t tok_strmap_get(const tok_strmap_t *m, const uint8_t *key, size_t len)
{
    if (!m->slots)
        return -1;
    uint64_t h = XXH3_64bits(key ? (const void *)key : "", len);
    size_t i = h & m->mask;
    for (;;) {
        const tok_strmap_slot_t *s = &m->slots[i];
        if (!s->key)
            return -1;
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0)
            return s->val;
        i = (i + 1) & m->mask;
    }
}

/* ---- (id, id) -> merge ---- */

static inline uint64_t s_pair_hash(uint64_t k)
{
    /* splitmix64's finaliser: ids are small and dense, so spread them over the table. */
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebull;
    k ^= k >> 31;
    return k;
}

int tok_pairmap_init(tok_pairmap_t *m, size_t expected)
{
    size_t n = s_table_size(expected);
    m->slots = malloc(n * sizeof *m->slots);
    if (!m->slots)
        return -1;
    for (size_t i = 0; i < n; i++)
        m->slots[i].key = UINT64_MAX;
    m->mask = n - 1;
    m->count = 0;
    return 0;
}

void tok_pairmap_free(tok_pairmap_t *m)
{
    free(m->slots);
    m->slots = NULL;
    m->mask = m->count = 0;
}

/* The table is sized for every merge up front (tok_pairmap_init), so it never grows. A pair
 * listed twice keeps the later rank, as `tokenizers` does when it collects merges into a map. */
void tok_pairmap_put(tok_pairmap_t *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = s_pair_hash(k) & m->mask;
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != k)
        i = (i + 1) & m->mask;
    if (m->slots[i].key == UINT64_MAX)
        m->count++;
    m->slots[i].key = k;
    m->slots[i].rank = rank;
    m->slots[i].merged = merged;
}

const tok_pairmap_slot_t *tok_pairmap_get(const tok_pairmap_t *m, int32_t a, int32_t b)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = s_pair_hash(k) & m->mask;
    for (;;) {
        const tok_pairmap_slot_t *s = &m->slots[i];
        if (s->key == k)
            return s;
        if (s->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & m->mask;
    }
}
