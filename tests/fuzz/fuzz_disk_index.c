/* tests/fuzz/fuzz_disk_index.c — the disk tier's parsers on arbitrary bytes (actors/cache/): the file
 * header and record-header decoders, and the whole start-up path that reads a file's slot headers
 * back into the index (dstore_open). Either a refusal, or a result whose invariants hold: decoded
 * fields within their bounds and encoding them again gives the same bytes' meaning; an index whose
 * every entry is a nonzero hash in a slot of the file. Seeds: tests/fuzz/corpus/disk_index/ (a
 * valid three-record file and damaged copies). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/cache/disk_format.h"
#include "actors/cache/disk_store.h"

static void s_check_rec(const uint8_t *p, size_t n)
{
    df_rec_t r, again;
    char why[128];
    uint8_t buf[DF_REC_HDR_BYTES];
    if (df_rec_decode(p, n, &r, why, sizeof why) != DF_OK)
        return;
    if (!r.hash || !r.block_bytes || r.block_bytes > DF_MAX_BLOCK_BYTES || r.dtype >= DT_COUNT || r.pin_until_ms < 0)
        abort();
    df_rec_encode(&r, buf);
    if (df_rec_decode(buf, sizeof buf, &again, why, sizeof why) != DF_OK || memcmp(&r, &again, sizeof r) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dir[64];
    if (!dir[0])   /* tmpfs where there is one: the file is written and read back once per input */
        snprintf(dir, sizeof dir, "%s/fuzz-disk-index-%d", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
                 (int)getpid());
    df_file_hdr_t fh;
    char why[128];
    int hdr_ok = df_file_hdr_decode(data, size, &fh, why, sizeof why) == DF_OK;
    if (hdr_ok && (!fh.fingerprint || fh.dtype >= DT_COUNT || fh.slot_bytes != df_slot_bytes(fh.block_bytes) ||
                   fh.block_bytes > DF_MAX_BLOCK_BYTES))
        abort();
    for (size_t off = 0; off + 76 <= size && off < 64 * DF_REC_HDR_BYTES; off += DF_REC_HDR_BYTES)
        s_check_rec(data + off, size - off);
    if (size > DF_FILE_HDR_BYTES)
        s_check_rec(data + DF_FILE_HDR_BYTES, size - DF_FILE_HDR_BYTES);

    /* The file as the cache-manager finds it at start, under its own fingerprint (so it is scanned). */
    char path[128], err[256];
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/%s", dir, DSTORE_FILE);
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    dstore_t *s = dstore_open(dir, 1u << 20, hdr_ok ? fh.fingerprint : 1, err, sizeof err);
    if (!s) {
        unlink(path);
        rmdir(dir);
        return 0;
    }
    if (s->formatted) {
        if (s->index.n > s->fh.n_slots || s->loaded != s->index.n)
            abort();
        for (size_t i = 0; i < s->index.cap; i++) {
            if (!s->index.keys[i])
                continue;
            uint64_t slot = s->index.vals[i] - 1;
            if (slot >= s->fh.n_slots || s->slots[slot].hash != s->index.keys[i] || s->slots[slot].state != DSLOT_VALID)
                abort();
        }
    } else if (s->index.n) {
        abort();
    }
    dstore_destroy(&s);
    unlink(path);
    rmdir(dir);
    return 0;
}
