/* actors/cache/disk_io.h — the disk tier's I/O thread: the cache-manager's message loop hands it
 * jobs (write a block, rewrite a record header, read a block back, write the file header) and is
 * told when each is done, so no pread or pwrite ever runs in the loop.
 *
 * Jobs and their block buffers come from a bounded pool made at dio_new: when every job is in
 * flight a spill is shed and a read is not started (the caller counts both); nothing grows with
 * the load. Jobs run in submission order (the file header before any block). A finished job goes
 * onto a done list and one byte onto an inproc ZeroMQ PAIR socket that the loop polls
 * (dio_socket with actor_add_reader), so a completion wakes the loop at once.
 *
 * Ownership: between dio_submit and dio_next_done a job belongs to the thread; before and after,
 * to the loop, which returns it with dio_put. */
#ifndef TROUPE_ACTORS_CACHE_DISK_IO_H
#define TROUPE_ACTORS_CACHE_DISK_IO_H

#include <stddef.h>
#include <stdint.h>

#include "actors/cache/disk_store.h"

typedef enum dio_kind { DIO_FILE_HDR = 0, DIO_WRITE, DIO_WRITE_REC, DIO_READ } dio_kind_t;

typedef struct dio_job {
    dio_kind_t kind;
    int64_t slot;
    uint64_t hash;
    df_rec_t rec;                 /* DIO_WRITE / DIO_WRITE_REC: the record header to write */
    uint8_t *buf;                 /* [block_bytes]: the block to write, or where a read lands */
    /* results, set by the thread */
    int err;                      /* writes: 0 or -errno */
    dstore_read_t read;           /* DIO_READ */
    char why[160];
    double ms;                    /* time the I/O took */
    struct dio_job *next;         /* list link (pool, queue or done list) */
} dio_job_t;

typedef struct dio dio_t;

/* Starts the thread over store s with n_jobs jobs, each with a buffer of block_bytes (0: the store
 * is not formatted yet; dio_set_block_bytes later). ctx: the actor's ZeroMQ context. NULL on error. */
dio_t *dio_new(dstore_t *s, void *ctx, int n_jobs, size_t block_bytes, char *err, size_t errlen);
/* Runs every queued job, stops the thread, syncs the file. */
void dio_destroy(dio_t **self_p);
/* Gives the jobs their buffers once the block size is known; -1 out of memory. */
int dio_set_block_bytes(dio_t *d, size_t block_bytes);

/* A free job (its buffer ready), or NULL when all are in flight. */
dio_job_t *dio_get(dio_t *d);
void dio_put(dio_t *d, dio_job_t *j);
void dio_submit(dio_t *d, dio_job_t *j);
/* The next finished job, or NULL. Also drains the wake-up bytes. */
dio_job_t *dio_next_done(dio_t *d);
/* The loop's end of the wake-up socket. */
void *dio_socket(dio_t *d);
/* Jobs queued or running. */
int dio_in_flight(const dio_t *d);

#endif
