/* transfer/kv_copier.h — copies KV blocks from a worker's pool into new shared-memory
 * segments on a thread of its own, so a decode worker's write-back of a finished sequence (often a
 * quarter of a gigabyte) runs beside its next steps instead of stalling every running request.
 *
 * The owner (one actor thread) submits a job naming the blocks, keeps those blocks unchanged until
 * the job comes back from kvcopier_poll, then announces the segment (or drops it). The copier
 * thread never touches the pool's bookkeeping: it gets device pointers computed at submit, creates
 * the segment and copies with the backend's download_side (download when the backend has none).
 * Jobs run in submission order. */
#ifndef TROUPE_KV_COPIER_H
#define TROUPE_KV_COPIER_H

#include <stddef.h>
#include <stdint.h>

#include "transfer/shm_chan.h"
#include "kernels/backend.h"

typedef struct kvcopier kvcopier_t;

typedef struct kvcopier_done {
    void *cookie;                /* as submitted */
    uint64_t transfer_id;
    int ok;                      /* 1: seg holds the blocks; 0: err says why (seg is closed) */
    tchan_seg_t seg;             /* the caller's now: announce it, then close it */
    char err[256];
} kvcopier_done_t;

/* A copier for `max_jobs` jobs at a time of blocks of block_bytes each; segments are named for
 * `cluster` (tchan_shm_create). NULL when the thread cannot start. */
kvcopier_t *kvcopier_new(backend_t *be, const char *cluster, size_t block_bytes, int max_jobs);
/* Stops the thread after the job it is running; jobs not yet done are dropped with their segments. */
void kvcopier_destroy(kvcopier_t **self_p);

/* Queues a copy of the n blocks at src[0..n) (device pointers of the pool; copied here) into a new
 * segment for transfer_id. 0, or -1 when max_jobs are queued or in flight (or no memory). */
int kvcopier_submit(kvcopier_t *c, uint64_t transfer_id, const void *const *src, int n, void *cookie);

/* One finished job into *out: 1; 0 when none has finished. Never waits. */
int kvcopier_poll(kvcopier_t *c, kvcopier_done_t *out);

/* Waits until every submitted job is done (kvcopier_poll then returns them all). */
void kvcopier_drain(kvcopier_t *c);

/* Jobs submitted and not yet returned by kvcopier_poll. */
int kvcopier_pending(const kvcopier_t *c);

#endif
