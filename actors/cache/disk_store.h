/* actors/cache/disk_store.h — the cache-manager's disk tier: one large file of fixed-size slots
 * (disk_format.h) and its in-memory index.
 *
 * Two halves with one owner each, so no lock is needed:
 *   - the index (slots' hash, tenant, pin expiry, LRU tick, state; hash -> slot) belongs to the
 *     cache-manager's message loop: dstore_find / _alloc / _written / _drop / _pin never touch
 *     the file;
 *   - the file belongs to the I/O thread (disk_io.h): dstore_write_file_hdr / _write_slot /
 *     _write_rec / _read_slot only read the immutable file header and the descriptor.
 * dstore_open is the exception: it reads the slot headers back at start (before the actor is
 * READY), which is how the index survives a restart.
 *
 * Eviction when the file is full: the least recently used slot that is neither pinned (its pin
 * expiry in the future) nor being written or read; when every slot is pinned or busy a spill
 * is shed (the caller counts it). Pins are wall-clock times so they mean the same after a restart.
 *
 * Known limits: one file per directory (a second cache-manager on the same directory is refused by
 * an flock); the scan at start reads every slot header (one pread each: ~1 s per ~100k slots on an
 * SSD); a slot whose header was half rewritten by a pin update is dropped, not repaired. */
#ifndef TROUPE_ACTORS_CACHE_DISK_STORE_H
#define TROUPE_ACTORS_CACHE_DISK_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "actors/cache/disk_format.h"
#include "common/u64map.h"

#define DSTORE_FILE "blocks.kvd"

typedef enum dslot_state { DSLOT_FREE = 0, DSLOT_WRITING, DSLOT_VALID } dslot_state_t;

typedef struct dslot {
    uint64_t hash;                /* 0 when free */
    uint64_t tenant;              /* hash of the tenant that pinned it (0: none) */
    uint64_t lru;                 /* last use tick */
    uint64_t seq;                 /* write sequence of its record */
    int64_t pin_until_ms;         /* wall clock; 0 = not pinned */
    int64_t written_ms;
    uint32_t payload_crc;         /* of the block, known once written */
    uint16_t readers;             /* reads in flight: never evicted meanwhile */
    uint8_t state;                /* dslot_state_t */
    uint8_t dirty;                /* its record header on disk is older than these fields (a pin change) */
} dslot_t;

typedef enum dstore_read {
    DSTORE_READ_OK = 0,
    DSTORE_READ_CORRUPT,          /* bad header, another block's header, or payload checksum mismatch */
    DSTORE_READ_FOREIGN,          /* written for another model fingerprint, KV dtype or block size */
    DSTORE_READ_IOERR,
} dstore_read_t;

typedef struct dstore {
    int fd;
    char path[1100];              /* <dir>/blocks.kvd */
    uint64_t max_bytes;           /* the file never grows past this (cache.disk_bytes) */
    uint64_t fingerprint;         /* of the running model (fingerprint.h) */
    int formatted;                /* fh and the slot arrays are set */
    df_file_hdr_t fh;             /* immutable once formatted */
    dslot_t *slots;               /* [fh.n_slots] */
    uint64_t *free_stack;         /* [fh.n_slots] free slot numbers, lowest on top */
    uint64_t n_free;
    uint64_t *dirty_stack;        /* [fh.n_slots] slots whose record header must be rewritten */
    uint64_t n_dirty;
    u64map_t index;               /* hash -> slot + 1 */
    uint64_t tick, next_seq;
    /* counted at open and afterwards */
    uint64_t loaded;              /* valid records found at open */
    uint64_t dropped_corrupt;     /* records refused: torn, bit flips, bad headers */
    uint64_t dropped_foreign;     /* records of another model / dtype / shape */
    uint64_t evicted;             /* valid slots reused for another block */
} dstore_t;

/* Opens (creating the directory and the file) the disk tier in dir, at most max_bytes, for the
 * model fingerprint fp; reads the slot headers back into the index when the file's header matches
 * fp, else counts what it held as foreign and starts empty. NULL with why in err. */
dstore_t *dstore_open(const char *dir, uint64_t max_bytes, uint64_t fp, char *err, size_t errlen);
void dstore_destroy(dstore_t **self_p);

/* Sets the block shape of an empty (unformatted) store: the slot count follows from max_bytes.
 * The file header itself is written by the I/O thread (dstore_write_file_hdr), before any block.
 * -1 with why when not even one slot fits. */
int dstore_format(dstore_t *s, dtype_t dtype, uint32_t n_layers, uint32_t block_size, uint32_t n_kv_heads,
                  uint32_t head_dim, uint64_t block_bytes, char *err, size_t errlen);

/* ---- the index (message loop only) ---- */
/* The slot holding hash (writing or valid), or -1. */
int64_t dstore_find(const dstore_t *s, uint64_t hash);
/* A slot for hash (state writing), its previous block evicted (*victim its hash, else 0); -1 when
 * every slot is pinned or busy. */
int64_t dstore_alloc(dstore_t *s, uint64_t hash, int64_t now_wall_ms, uint64_t *victim);
/* The write of slot ended: valid with its payload CRC, or (ok 0) free again. */
void dstore_written(dstore_t *s, int64_t slot, int ok, uint32_t payload_crc);
/* Frees a slot (a refused read, a block given up). */
void dstore_drop(dstore_t *s, int64_t slot);
void dstore_touch(dstore_t *s, int64_t slot);
/* Sets a slot's pin expiry (wall ms, 0 none) and tenant; marks its header dirty when it changed. */
void dstore_pin(dstore_t *s, int64_t slot, int64_t until_wall_ms, uint64_t tenant);
/* A valid slot whose header must be rewritten (its dirty mark cleared), or -1 when none is ready. */
int64_t dstore_take_dirty(dstore_t *s);
/* The record header the slot's fields describe (for a write or a header rewrite). */
void dstore_rec(const dstore_t *s, int64_t slot, df_rec_t *r);
/* Counts for stats: slots in use (valid), pinned now, bytes in use. */
void dstore_usage(const dstore_t *s, int64_t now_wall_ms, uint64_t *used, uint64_t *pinned, uint64_t *bytes);

/* ---- the file (I/O thread only) ---- */
/* Writes the file header and syncs; 0 or -errno. */
int dstore_write_file_hdr(dstore_t *s);
/* Writes slot's record header and its block in one pwritev; 0 or -errno (ENOSPC, EFBIG, EDQUOT:
 * the disk is full). r->payload_crc is filled in here. */
int dstore_write_slot(dstore_t *s, int64_t slot, df_rec_t *r, const void *payload);
/* Rewrites only slot's record header (a pin change); 0 or -errno. */
int dstore_write_rec(dstore_t *s, int64_t slot, const df_rec_t *r);
/* Reads slot into payload[block_bytes] and checks it is hash's block of this model, intact. */
dstore_read_t dstore_read_slot(dstore_t *s, int64_t slot, uint64_t hash, void *payload, char *why, size_t whylen);
/* 1 for an errno that means the disk (or the file's limit) is full. */
int dstore_errno_full(int err);

#endif
