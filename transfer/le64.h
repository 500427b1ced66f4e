/* transfer/le64.h — unsigned 64-bit integers as 8 little-endian bytes, the byte order of every
 * handle and header the channels put on the wire (an NCCL handle's link id and sequence, a CUDA IPC
 * handle's pool size, the tcp channel's request and reply headers). */
#ifndef TROUPE_LE64_H
#define TROUPE_LE64_H

#include <stdint.h>

static inline void le64_put(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t le64_get(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
