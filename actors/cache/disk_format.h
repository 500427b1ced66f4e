/* actors/cache/disk_format.h — the disk tier's bytes on disk: one file header, then fixed-size slots,
 * each a record header followed by one KV block.
 *
 *   offset 0            file header (DF_FILE_HDR_BYTES reserved): magic, version, the model
 *                       fingerprint, the KV dtype and block shape, block/slot bytes, slot count
 *   4096 + i*slot_bytes slot i: record header (DF_REC_HDR_BYTES reserved) then block_bytes of KV
 *
 * A record header carries everything the index needs (block hash, tenant, pin expiry in wall-clock
 * ms, the model fingerprint and KV dtype, the payload's CRC32C, a write sequence number) and its own
 * CRC32C, so the slot headers ARE the persistent index: reading them back at start rebuilds it, and
 * no second file can disagree with the blocks. All integers are little-endian, encoded field by
 * field (never a struct cast), and every field is checked when decoded: these bytes come from a
 * disk that may hold a torn write, a flipped bit or another program's file.
 *
 * Why these choices: a header and its payload go out in one pwritev, header first; a kill -9 in the
 * middle leaves a header whose payload CRC no longer matches (refused when read) or the old header
 * over a partly new payload (the same). CRC32C is the checksum storage systems use (iSCSI, ext4
 * metadata, RocksDB): the SSE4.2 instruction where the CPU has it, a table otherwise. */
#ifndef TROUPE_ACTORS_CACHE_DISK_FORMAT_H
#define TROUPE_ACTORS_CACHE_DISK_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

#define DF_FILE_HDR_BYTES 4096u       /* reserved for the file header; slot 0 starts here */
#define DF_REC_HDR_BYTES  128u        /* reserved for a record header at the start of a slot */
#define DF_SLOT_ALIGN     4096u       /* slot sizes are multiples of a page */
#define DF_MAX_BLOCK_BYTES (1ull << 30) /* a KV block larger than this is not a block */
#define DF_VERSION        1u

/* The file header: what every slot of the file holds. */
typedef struct df_file_hdr {
    uint64_t fingerprint;             /* model + KV settings (fingerprint.h); never 0 */
    dtype_t dtype;                    /* KV dtype of every block */
    uint32_t n_layers, block_size, n_kv_heads, head_dim;
    uint64_t block_bytes;             /* bytes of one KV block, 1..DF_MAX_BLOCK_BYTES */
    uint64_t slot_bytes;              /* DF_SLOT_ALIGN multiple >= DF_REC_HDR_BYTES + block_bytes */
    uint64_t n_slots;                 /* slots after the header */
} df_file_hdr_t;

/* One slot's record header. */
typedef struct df_rec {
    uint64_t hash;                    /* the block's chained prefix hash; never 0 */
    uint64_t tenant;                  /* hash of the tenant that pinned it; 0 = none */
    uint64_t fingerprint;             /* must equal the file's and the running model's */
    dtype_t dtype;                    /* must equal the file's */
    uint32_t payload_crc;             /* CRC32C of the block_bytes that follow */
    uint64_t block_bytes;             /* must equal the file's */
    uint64_t seq;                     /* write order: of two slots with one hash the higher wins */
    int64_t pin_until_ms;             /* wall-clock ms; 0 = not pinned */
    int64_t written_ms;               /* wall-clock ms of the write */
} df_rec_t;

typedef enum df_status {
    DF_OK = 0,
    DF_EMPTY,                         /* all zero: a slot never written */
    DF_CORRUPT,                       /* bad magic, version, CRC or a field out of range */
} df_status_t;

/* CRC32C (Castagnoli) of n bytes, continuing from crc (0 to start). */
uint32_t df_crc32c(uint32_t crc, const void *data, size_t n);

/* Encodes into buf[DF_FILE_HDR_BYTES] (zero-filled past the fields). */
void df_file_hdr_encode(const df_file_hdr_t *h, uint8_t *buf);
/* Decodes buf[n]; DF_CORRUPT with why on any check that fails (n too short included). */
df_status_t df_file_hdr_decode(const uint8_t *buf, size_t n, df_file_hdr_t *h, char *why, size_t whylen);

/* Encodes into buf[DF_REC_HDR_BYTES] (zero-filled past the fields). */
void df_rec_encode(const df_rec_t *r, uint8_t *buf);
/* Decodes buf[n]: DF_EMPTY for a slot never written, DF_CORRUPT with why. Fingerprint, dtype and
 * size are decoded, not compared: the store does that against its file header. */
df_status_t df_rec_decode(const uint8_t *buf, size_t n, df_rec_t *r, char *why, size_t whylen);

/* Slot size for a block size: the record header plus the block, rounded up to DF_SLOT_ALIGN. */
uint64_t df_slot_bytes(uint64_t block_bytes);

#endif
