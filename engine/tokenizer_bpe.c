/* engine/tokenizer_bpe.c — byte-level BPE for one pre-token, the way `tokenizers` does it.
 *
 * A pre-token starts as one symbol per byte. Every adjacent pair that has a merge goes into a
 * min-heap keyed by (rank, position); the loop pops the best, skips entries made stale by an
 * earlier merge (the pair at that position is no longer the one queued), merges, and queues the
 * two new pairs with its neighbours. O(n log n) in the pre-token's length.
 *
 * Ties matter for exactness: equal ranks pop the leftmost position first ("aaa" with the merge
 * "a a" gives "aa a"), exactly as `tokenizers`' Word::merge_all orders its BinaryHeap. */
#include <stdlib.h>

#include "engine/tokenizer_internal.h"

struct tok_merge_item {
    int32_t rank;
    int32_t pos;                 /* left symbol */
    int32_t merged;              /* the id the pair merges into, to recognise stale entries */
};

void tok_bpe_scratch_free(tok_bpe_scratch_t *s)
{
    free(s->ids);
    free(s->prev);
    free(s->next);
    free(s->alive);
    free(s->heap);
    *s = (tok_bpe_scratch_t){0};
}

static int s_reserve(tok_bpe_scratch_t *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *ids = realloc(s->ids, cap * sizeof *ids);
    if (ids)
        s->ids = ids;
    int32_t *prev = realloc(s->prev, cap * sizeof *prev);
    if (prev)
        s->prev = prev;
    int32_t *next = realloc(s->next, cap * sizeof *next);
    if (next)
        s->next = next;
    uint8_t *alive = realloc(s->alive, cap);
    if (alive)
        s->alive = alive;
    if (!ids || !prev || !next || !alive)
        return -1;
    s->cap = cap;
    return 0;
}

static inline int s_less(const struct tok_merge_item *a, const struct tok_merge_item *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int s_heap_push(tok_bpe_scratch_t *s, size_t *n, struct tok_merge_item it)
{
    if (*n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 64;
        struct tok_merge_item *h = realloc(s->heap, cap * sizeof *h);
        if (!h)
            return -1;
        s->heap = h;
        s->heap_cap = cap;
    }
    struct tok_merge_item *h = s->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!s_less(&it, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
    return 0;
}

static struct tok_merge_item s_heap_pop(tok_bpe_scratch_t *s, size_t *n)
{
    struct tok_merge_item *h = s->heap;
    struct tok_merge_item top = h[0];
    struct tok_merge_item last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && s_less(&h[c + 1], &h[c]))
            c++;
        if (!s_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static int s_queue_pair(const tokenizer_t *t, tok_bpe_scratch_t *s, size_t *nheap, int32_t pos)
{
    int32_t nx = s->next[pos];
    if (nx < 0)
        return 0;
    const tok_pairmap_slot_t *m = tok_pairmap_get(&t->merges, s->ids[pos], s->ids[nx]);
    if (!m)
        return 0;
    return s_heap_push(s, nheap, (struct tok_merge_item){m->rank, pos, m->merged});
}

int tok_bpe_word(const tokenizer_t *t, const uint8_t *w, size_t n, tok_bpe_scratch_t *s,
                 tok_ids_t *out)
{
    if (n == 0)
        return 0;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab_bytes, w, n);
        if (id >= 0)
            return tok_ids_push(out, id);
    }
    if (n > INT32_MAX / 2 || s_reserve(s, n) < 0)
        return -1;

    /* Bytes with no single-byte token are dropped, as `tokenizers` drops characters it has no
     * token for when the model has no unk_token (byte-level vocabularies have all 256). */
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id < 0)
            continue;
        s->ids[m] = id;
        s->prev[m] = m - 1;
        s->next[m] = m + 1;
        s->alive[m] = 1;
        m++;
    }
    if (m == 0)
        return 0;
    s->next[m - 1] = -1;

    size_t nheap = 0;
    for (int32_t i = 0; i + 1 < m; i++)
        if (s_queue_pair(t, s, &nheap, i) < 0)
            return -1;

    while (nheap) {
        struct tok_merge_item top = s_heap_pop(s, &nheap);
        int32_t pos = top.pos;
        if (!s->alive[pos])
            continue;
        int32_t nx = s->next[pos];
        if (nx < 0)
            continue;
        const tok_pairmap_slot_t *cur = tok_pairmap_get(&t->merges, s->ids[pos], s->ids[nx]);
        if (!cur || cur->merged != top.merged)
            continue;                               /* stale: the pair here has changed */
        s->ids[pos] = top.merged;
        s->alive[nx] = 0;
        s->next[pos] = s->next[nx];
        if (s->next[nx] >= 0)
            s->prev[s->next[nx]] = pos;
        if (s->prev[pos] >= 0 && s_queue_pair(t, s, &nheap, s->prev[pos]) < 0)
            return -1;
        if (s_queue_pair(t, s, &nheap, pos) < 0)
            return -1;
    }

    for (int32_t i = 0; i >= 0; i = s->next[i])
        if (tok_ids_push(out, s->ids[i]) < 0)
            return -1;
    return 0;
}
