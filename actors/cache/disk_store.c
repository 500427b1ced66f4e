#include "actors/cache/disk_store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/log.h"

static off_t s_off(const dstore_t *s, int64_t slot)
{
    return (off_t)(DF_FILE_HDR_BYTES + (uint64_t)slot * s->fh.slot_bytes);
}

static int s_mkdirs(const char *dir, char *err, size_t errlen)
{
    char p[1024];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
        snprintf(err, errlen, "cache.disk_dir '%s': path too long", dir);
        return -1;
    }
    for (char *c = p + 1;; c++) {
        if (*c == '/' || *c == '\0') {
            char keep = *c;
            *c = '\0';
            if (mkdir(p, 0700) != 0 && errno != EEXIST) {
                snprintf(err, errlen, "cache.disk_dir '%s': cannot create %s: %s", dir, p, strerror(errno));
                return -1;
            }
            *c = keep;
            if (!keep)
                break;
        }
    }
    return 0;
}

/* Allocates the slot arrays for fh.n_slots, every slot free. */
static int s_alloc_slots(dstore_t *s)
{
    uint64_t n = s->fh.n_slots;
    s->slots = calloc(n ? n : 1, sizeof *s->slots);
    s->free_stack = malloc((n ? n : 1) * sizeof *s->free_stack);
    s->dirty_stack = malloc((n ? n : 1) * sizeof *s->dirty_stack);
    s->n_dirty = 0;
    if (!s->slots || !s->free_stack || !s->dirty_stack)
        return -1;
    s->n_free = 0;
    for (uint64_t i = n; i-- > 0;)
        s->free_stack[s->n_free++] = i;   /* slot 0 on top: a fresh file fills front to back */
    return 0;
}

static void s_zero_rec(dstore_t *s, int64_t slot)
{
    static const uint8_t zero[DF_REC_HDR_BYTES];
    if (pwrite(s->fd, zero, sizeof zero, s_off(s, slot)) != (ssize_t)sizeof zero)
        LOG_W("disk tier %s: cannot clear slot %lld's header: %s", s->path, (long long)slot, strerror(errno));
}

/* Reads every slot header back into the index. Refused records are counted and their headers
 * zeroed, so the next start does not count them again. */
static void s_scan(dstore_t *s)
{
    uint8_t buf[DF_REC_HDR_BYTES];
    for (uint64_t i = 0; i < s->fh.n_slots; i++) {
        ssize_t got = pread(s->fd, buf, sizeof buf, s_off(s, (int64_t)i));
        if (got <= 0)
            break;   /* past the end of the file: never written */
        df_rec_t r;
        char why[128];
        df_status_t st = df_rec_decode(buf, (size_t)got, &r, why, sizeof why);
        if (st == DF_EMPTY)
            continue;
        if (st != DF_OK) {
            LOG_W("disk tier %s: slot %llu dropped: %s", s->path, (unsigned long long)i, why);
            s->dropped_corrupt++;
            s_zero_rec(s, (int64_t)i);
            continue;
        }
        if (r.fingerprint != s->fingerprint || r.dtype != s->fh.dtype || r.block_bytes != s->fh.block_bytes) {
            s->dropped_foreign++;
            s_zero_rec(s, (int64_t)i);
            continue;
        }
        uint64_t *prev = u64map_get(&s->index, r.hash);
        if (prev) {
            /* Two records of one block (written again after a restart): the newer one stays. */
            dslot_t *o = &s->slots[*prev - 1];
            if (o->seq > r.seq) {
                s_zero_rec(s, (int64_t)i);
                continue;
            }
            s_zero_rec(s, (int64_t)(*prev - 1));
            *o = (dslot_t){0};
        }
        s->slots[i] = (dslot_t){.hash = r.hash, .tenant = r.tenant, .lru = r.seq, .seq = r.seq,
                                .pin_until_ms = r.pin_until_ms, .written_ms = r.written_ms,
                                .payload_crc = r.payload_crc, .state = DSLOT_VALID};
        u64map_put(&s->index, r.hash, i + 1);
        if (r.seq >= s->next_seq)
            s->next_seq = r.seq + 1;
    }
    /* Rebuild the free stack without the slots in use (one pass, lowest free slot on top). */
    s->n_free = 0;
    for (uint64_t i = s->fh.n_slots; i-- > 0;)
        if (s->slots[i].state == DSLOT_FREE)
            s->free_stack[s->n_free++] = i;
    s->loaded = s->index.n;
    s->tick = s->next_seq;
}

dstore_t *dstore_open(const char *dir, uint64_t max_bytes, uint64_t fp, char *err, size_t errlen)
{
    if (s_mkdirs(dir, err, errlen) != 0)
        return NULL;
    dstore_t *s = calloc(1, sizeof *s);
    if (!s || u64map_init(&s->index, 1024) != 0) {
        snprintf(err, errlen, "disk tier: out of memory");
        free(s);
        return NULL;
    }
    s->fd = -1;
    s->max_bytes = max_bytes;
    s->fingerprint = fp;
    s->next_seq = 1;
    snprintf(s->path, sizeof s->path, "%s/%s", dir, DSTORE_FILE);
    s->fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->fd < 0) {
        snprintf(err, errlen, "cache.disk_dir: cannot open %s: %s", s->path, strerror(errno));
        dstore_destroy(&s);
        return NULL;
    }
    if (flock(s->fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen, "cache.disk_dir: %s is in use by another process (%s)", s->path, strerror(errno));
        dstore_destroy(&s);
        return NULL;
    }
    struct stat st;
    uint8_t hdr[DF_FILE_HDR_BYTES];
    if (fstat(s->fd, &st) != 0 || st.st_size == 0)
        return s;   /* a new file: formatted by the first write-back */
    ssize_t got = pread(s->fd, hdr, sizeof hdr, 0);
    char why[128] = "";
    df_file_hdr_t fh;
    if (got <= 0 || df_file_hdr_decode(hdr, (size_t)got, &fh, why, sizeof why) != DF_OK) {
        LOG_W("disk tier %s: %s; starting empty", s->path, why[0] ? why : "unreadable file header");
        s->dropped_corrupt++;
    } else {
        uint64_t limit = max_bytes > DF_FILE_HDR_BYTES ? (max_bytes - DF_FILE_HDR_BYTES) / fh.slot_bytes : 0;
        const uint64_t file_slots = fh.n_slots;
        if (fh.n_slots > limit)
            fh.n_slots = limit;   /* cache.disk_bytes shrank: the slots past it go */
        s->fh = fh;
        s->fingerprint = fh.fingerprint;   /* scan with the file's own, to count what it held */
        if (s_alloc_slots(s) != 0) {
            snprintf(err, errlen, "disk tier: out of memory for %llu slots", (unsigned long long)fh.n_slots);
            dstore_destroy(&s);
            return NULL;
        }
        s->formatted = 1;
        s_scan(s);
        s->fingerprint = fp;
        if (fh.fingerprint == fp && fh.n_slots > 0) {
            if (fh.n_slots != file_slots) {
                if (ftruncate(s->fd, s_off(s, (int64_t)fh.n_slots)) != 0 || dstore_write_file_hdr(s) != 0)
                    LOG_W("disk tier %s: cannot shrink to %llu slots: %s", s->path, (unsigned long long)fh.n_slots,
                          strerror(errno));
            }
            LOG_I("disk tier %s: %llu blocks of %llu bytes indexed, %llu slots (%.1f MiB); %llu refused as corrupt",
                  s->path, (unsigned long long)s->loaded, (unsigned long long)fh.block_bytes,
                  (unsigned long long)fh.n_slots, (double)s_off(s, (int64_t)fh.n_slots) / (1 << 20),
                  (unsigned long long)s->dropped_corrupt);
            return s;
        }
        /* Another model or KV setting: nothing in the file may be served. */
        if (fh.fingerprint == fp) {
            LOG_W("disk tier %s: cache.disk_bytes %llu holds no block of %llu bytes; starting empty", s->path,
                  (unsigned long long)max_bytes, (unsigned long long)fh.slot_bytes);
            s->loaded = 0;
        }
        s->dropped_foreign += s->loaded;
        if (s->loaded)
            LOG_W("disk tier %s: written for another model or KV dtype (fingerprint %016llx, ours %016llx): "
              "%llu blocks dropped", s->path, (unsigned long long)fh.fingerprint, (unsigned long long)fp,
              (unsigned long long)s->loaded);
        s->loaded = 0;
        free(s->slots);
        free(s->free_stack);
        free(s->dirty_stack);
        s->slots = NULL, s->free_stack = NULL, s->dirty_stack = NULL;
        u64map_free(&s->index);
        u64map_init(&s->index, 1024);
        s->formatted = 0;
        memset(&s->fh, 0, sizeof s->fh);
    }
    if (ftruncate(s->fd, 0) != 0) {
        snprintf(err, errlen, "cache.disk_dir: cannot reset %s: %s", s->path, strerror(errno));
        dstore_destroy(&s);
        return NULL;
    }
    return s;
}

void dstore_destroy(dstore_t **self_p)
{
    dstore_t *s = self_p ? *self_p : NULL;
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);   /* releases the flock */
    free(s->slots);
    free(s->free_stack);
    free(s->dirty_stack);
    u64map_free(&s->index);
    free(s);
    *self_p = NULL;
}

int dstore_format(dstore_t *s, dtype_t dtype, uint32_t n_layers, uint32_t block_size, uint32_t n_kv_heads,
                  uint32_t head_dim, uint64_t block_bytes, char *err, size_t errlen)
{
    if (s->formatted)
        return 0;
    if (!block_bytes || block_bytes > DF_MAX_BLOCK_BYTES) {
        snprintf(err, errlen, "disk tier: block of %llu bytes out of range", (unsigned long long)block_bytes);
        return -1;
    }
    df_file_hdr_t fh = {.fingerprint = s->fingerprint, .dtype = dtype, .n_layers = n_layers, .block_size = block_size,
                        .n_kv_heads = n_kv_heads, .head_dim = head_dim, .block_bytes = block_bytes,
                        .slot_bytes = df_slot_bytes(block_bytes)};
    fh.n_slots = s->max_bytes > DF_FILE_HDR_BYTES ? (s->max_bytes - DF_FILE_HDR_BYTES) / fh.slot_bytes : 0;
    if (fh.n_slots == 0) {
        snprintf(err, errlen, "cache.disk_bytes %llu: not one block of %llu bytes fits", (unsigned long long)s->max_bytes,
                 (unsigned long long)fh.slot_bytes);
        return -1;
    }
    s->fh = fh;
    if (s_alloc_slots(s) != 0) {
        snprintf(err, errlen, "disk tier: out of memory for %llu slots", (unsigned long long)fh.n_slots);
        return -1;
    }
    s->formatted = 1;
    return 0;
}

/* ---- the index ------------------------------------------------------------------------------- */

int64_t dstore_find(const dstore_t *s, uint64_t hash)
{
    const uint64_t *v = s->formatted ? u64map_get(&s->index, hash) : NULL;
    return v ? (int64_t)*v - 1 : -1;
}

int64_t dstore_alloc(dstore_t *s, uint64_t hash, int64_t now_wall_ms, uint64_t *victim)
{
    *victim = 0;
    if (!s->formatted || !hash)
        return -1;
    int64_t slot = -1;
    if (s->n_free) {
        slot = (int64_t)s->free_stack[--s->n_free];
    } else {
        for (uint64_t i = 0; i < s->fh.n_slots; i++) {
            const dslot_t *d = &s->slots[i];
            if (d->state != DSLOT_VALID || d->readers || d->pin_until_ms > now_wall_ms)
                continue;
            if (slot < 0 || d->lru < s->slots[slot].lru)
                slot = (int64_t)i;
        }
        if (slot < 0)
            return -1;
        *victim = s->slots[slot].hash;
        u64map_del(&s->index, *victim);
        s->evicted++;
    }
    s->slots[slot] = (dslot_t){.hash = hash, .lru = ++s->tick, .seq = s->next_seq++, .written_ms = 0,
                               .state = DSLOT_WRITING};
    u64map_put(&s->index, hash, (uint64_t)slot + 1);
    return slot;
}

void dstore_written(dstore_t *s, int64_t slot, int ok, uint32_t payload_crc)
{
    dslot_t *d = &s->slots[slot];
    if (d->state != DSLOT_WRITING)
        return;
    if (!ok) {
        dstore_drop(s, slot);
        return;
    }
    d->state = DSLOT_VALID;
    d->payload_crc = payload_crc;
}

void dstore_drop(dstore_t *s, int64_t slot)
{
    dslot_t *d = &s->slots[slot];
    if (d->state == DSLOT_FREE)
        return;
    uint64_t *v = u64map_get(&s->index, d->hash);
    if (v && (int64_t)*v - 1 == slot)
        u64map_del(&s->index, d->hash);
    *d = (dslot_t){0};
    s->free_stack[s->n_free++] = (uint64_t)slot;
}

void dstore_touch(dstore_t *s, int64_t slot)
{
    s->slots[slot].lru = ++s->tick;
}

void dstore_pin(dstore_t *s, int64_t slot, int64_t until_wall_ms, uint64_t tenant)
{
    dslot_t *d = &s->slots[slot];
    if (d->pin_until_ms == until_wall_ms && d->tenant == tenant)
        return;
    d->pin_until_ms = until_wall_ms;
    d->tenant = tenant;
    if (!d->dirty && s->n_dirty < s->fh.n_slots)   /* full only of stale entries: skipped */
        s->dirty_stack[s->n_dirty++] = (uint64_t)slot;
    d->dirty = 1;
}

int64_t dstore_take_dirty(dstore_t *s)
{
    /* A slot still being written keeps its place: its header goes out once its CRC is known. */
    for (uint64_t k = s->n_dirty; k-- > 0;) {
        const int64_t slot = (int64_t)s->dirty_stack[k];
        dslot_t *d = &s->slots[slot];
        if (d->state == DSLOT_WRITING)
            continue;
        s->dirty_stack[k] = s->dirty_stack[--s->n_dirty];
        if (d->state != DSLOT_VALID || !d->dirty)
            continue;   /* dropped since */
        d->dirty = 0;
        return slot;
    }
    return -1;
}

void dstore_rec(const dstore_t *s, int64_t slot, df_rec_t *r)
{
    const dslot_t *d = &s->slots[slot];
    *r = (df_rec_t){.hash = d->hash, .tenant = d->tenant, .fingerprint = s->fingerprint, .dtype = s->fh.dtype,
                    .payload_crc = d->payload_crc, .block_bytes = s->fh.block_bytes, .seq = d->seq,
                    .pin_until_ms = d->pin_until_ms, .written_ms = d->written_ms};
}

void dstore_usage(const dstore_t *s, int64_t now_wall_ms, uint64_t *used, uint64_t *pinned, uint64_t *bytes)
{
    uint64_t u = 0, p = 0;
    for (uint64_t i = 0; s->formatted && i < s->fh.n_slots; i++) {
        u += s->slots[i].state == DSLOT_VALID;
        p += s->slots[i].state == DSLOT_VALID && s->slots[i].pin_until_ms > now_wall_ms;
    }
    *used = u, *pinned = p;
    *bytes = u * (s->formatted ? s->fh.slot_bytes : 0);
}

/* ---- the file -------------------------------------------------------------------------------- */

int dstore_errno_full(int err)
{
    return err == ENOSPC || err == EFBIG || err == EDQUOT;
}

int dstore_write_file_hdr(dstore_t *s)
{
    uint8_t buf[DF_FILE_HDR_BYTES];
    df_file_hdr_encode(&s->fh, buf);
    if (pwrite(s->fd, buf, sizeof buf, 0) != (ssize_t)sizeof buf)
        return errno ? -errno : -EIO;
    return fdatasync(s->fd) == 0 ? 0 : -errno;
}

int dstore_write_slot(dstore_t *s, int64_t slot, df_rec_t *r, const void *payload)
{
    uint8_t hdr[DF_REC_HDR_BYTES];
    r->payload_crc = df_crc32c(0, payload, s->fh.block_bytes);
    df_rec_encode(r, hdr);
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)payload, s->fh.block_bytes}};
    const size_t want = sizeof hdr + s->fh.block_bytes;
    errno = 0;
    ssize_t n = pwritev(s->fd, iov, 2, s_off(s, slot));
    if (n == (ssize_t)want)
        return 0;
    return n < 0 ? -errno : -ENOSPC;   /* a short write: the file system ran out of room */
}

int dstore_write_rec(dstore_t *s, int64_t slot, const df_rec_t *r)
{
    uint8_t hdr[DF_REC_HDR_BYTES];
    df_rec_encode(r, hdr);
    errno = 0;
    ssize_t n = pwrite(s->fd, hdr, sizeof hdr, s_off(s, slot));
    return n == (ssize_t)sizeof hdr ? 0 : n < 0 ? -errno : -EIO;
}

dstore_read_t dstore_read_slot(dstore_t *s, int64_t slot, uint64_t hash, void *payload, char *why, size_t whylen)
{
    uint8_t hdr[DF_REC_HDR_BYTES];
    struct iovec iov[2] = {{hdr, sizeof hdr}, {payload, s->fh.block_bytes}};
    const size_t want = sizeof hdr + s->fh.block_bytes;
    ssize_t n = preadv(s->fd, iov, 2, s_off(s, slot));
    if (n < 0) {
        snprintf(why, whylen, "read: %s", strerror(errno));
        return DSTORE_READ_IOERR;
    }
    if ((size_t)n != want) {
        snprintf(why, whylen, "short read (%zd of %zu bytes): a torn write", n, want);
        return DSTORE_READ_CORRUPT;
    }
    df_rec_t r;
    if (df_rec_decode(hdr, sizeof hdr, &r, why, whylen) != DF_OK) {
        if (!why[0])
            snprintf(why, whylen, "record header: empty");
        return DSTORE_READ_CORRUPT;
    }
    if (r.fingerprint != s->fingerprint || r.dtype != s->fh.dtype || r.block_bytes != s->fh.block_bytes) {
        snprintf(why, whylen, "written for another model or KV dtype");
        return DSTORE_READ_FOREIGN;
    }
    if (r.hash != hash) {
        snprintf(why, whylen, "slot holds another block");
        return DSTORE_READ_CORRUPT;
    }
    if (df_crc32c(0, payload, s->fh.block_bytes) != r.payload_crc) {
        snprintf(why, whylen, "block checksum mismatch");
        return DSTORE_READ_CORRUPT;
    }
    return DSTORE_READ_OK;
}
