#include "common/u64map.h"

#include <stdlib.h>
#include <string.h>

/* Keys are hashes already; one extra mix keeps structured keys (tests: 1, 2, 3...) spread. */
static size_t s_slot(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

int u64map_init(u64map_t *m, size_t cap)
{
    size_t c = 16;
    while (c < cap)
        c <<= 1;
    m->keys = calloc(c, sizeof *m->keys);
    m->vals = calloc(c, sizeof *m->vals);
    m->cap = c;
    m->n = 0;
    if (!m->keys || !m->vals) {
        u64map_free(m);
        return -1;
    }
    return 0;
}

void u64map_free(u64map_t *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

uint64_t *u64map_get(const u64map_t *m, uint64_t key)
{
    if (!key || !m->cap)
        return NULL;
    for (size_t i = s_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key)
            return &m->vals[i];
        if (!m->keys[i])
            return NULL;
    }
}

static int s_grow(u64map_t *m)
{
    u64map_t g;
    if (u64map_init(&g, m->cap * 2) != 0)
        return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i])
            u64map_put(&g, m->keys[i], m->vals[i]);
    u64map_free(m);
    *m = g;
    return 0;
}

int u64map_put(u64map_t *m, uint64_t key, uint64_t val)
{
    if (!key)
        return -1;
    if ((m->n + 1) * 10 > m->cap * 7 && s_grow(m) != 0)
        return -1;
    size_t i = s_slot(key, m->cap);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i]) {
        m->keys[i] = key;
        m->n++;
    }
    m->vals[i] = val;
    return 0;
}

int u64map_del(u64map_t *m, uint64_t key)
{
    if (!key || !m->cap)
        return 0;
    size_t i = s_slot(key, m->cap);
    while (m->keys[i] != key) {
        if (!m->keys[i])
            return 0;
        i = (i + 1) & (m->cap - 1);
    }
    /* Backward-shift deletion: move later entries of the probe run into the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        size_t home = s_slot(m->keys[j], m->cap);
        /* j's entry may move to hole if hole lies cyclically in [home, j). */
        if (((j - home) & (m->cap - 1)) >= ((j - hole) & (m->cap - 1))) {
            m->keys[hole] = m->keys[j];
            m->vals[hole] = m->vals[j];
            hole = j;
        }
    }
    m->keys[hole] = 0;
    m->vals[hole] = 0;
    m->n--;
    return 1;
}
