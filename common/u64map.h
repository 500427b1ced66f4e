/* common/u64map.h — an open-addressing hash map from uint64 keys to uint64 values.
 *
 * For block-hash indexes (router, cache-manager): keys are already well-mixed hashes, so the slot
 * is the key itself masked; linear probing; tombstone-free deletion (backward shift). Key 0 is
 * reserved (empty slot). Grows by doubling at 70% load; never shrinks. */
#ifndef TROUPE_U64MAP_H
#define TROUPE_U64MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct u64map {
    uint64_t *keys;     /* [cap], 0 = empty */
    uint64_t *vals;     /* [cap] */
    size_t cap, n;      /* cap is a power of two */
} u64map_t;

int  u64map_init(u64map_t *m, size_t initial_cap);
void u64map_free(u64map_t *m);
/* Pointer to the value of key, or NULL. */
uint64_t *u64map_get(const u64map_t *m, uint64_t key);
/* Inserts or overwrites; -1 on out of memory or key 0. */
int  u64map_put(u64map_t *m, uint64_t key, uint64_t val);
/* Removes key; 1 if it was there. */
int  u64map_del(u64map_t *m, uint64_t key);

#endif
