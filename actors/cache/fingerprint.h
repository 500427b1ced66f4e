/* actors/cache/fingerprint.h — what a KV block on disk was computed by: a 64-bit fingerprint of the
 * model and the KV settings, written into the disk tier's file and every record, so blocks of
 * another checkpoint, dtype or block size are never served after the topology changes.
 *
 * It hashes (FNV-1a 64) the checkpoint's config.json, and for each *.safetensors file (by name
 * order) its name, size, JSON header and the first 4 KiB of tensor data (a fine-tune has the same
 * header but not the same weights), plus the topology's model dtype, KV dtype, load format (dummy
 * weights) and cache.block_size. It does not read whole checkpoints: two checkpoints that agree
 * in all of that are taken for one. */
#ifndef TROUPE_ACTORS_CACHE_FINGERPRINT_H
#define TROUPE_ACTORS_CACHE_FINGERPRINT_H

#include <stdint.h>

#include "topology/topology.h"

/* The fingerprint of t's model and KV settings; never 0. */
uint64_t kv_fingerprint(const topo_t *t);

#endif
