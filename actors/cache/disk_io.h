/* actors/cache/disk_io.h — the disk tier's I/O threads: the cache-manager's message loop hands them
 * jobs (write a block, rewrite a record header, read a block back, write the file header) and is
 * told when each is done, so no pread or pwrite ever runs in the loop.
 *
 * Jobs and their block buffers come from a bounded pool made at dio_new: when every job is in
 * flight a spill is shed and a read is not started (the caller counts both); nothing grows with
 * the load. A small, fixed set of threads (dio_new's n_threads) takes jobs from one queue in
 * submission order: a read starts while other reads run, so the reads of a long prefix's fetch
 * (queued together) run n_threads at a time instead of one after another; a write or header job
 * starts only when everything before it is over and runs alone, and nothing after it starts before
 * it ends. So jobs that could touch the same slot (a record header rewritten, a block written then
 * read) keep their order, the file header comes before any block, and only reads overlap. A
 * finished job goes onto a done list (in the order jobs finish: reads may pass each other) and one
 * byte onto an inproc ZeroMQ PAIR socket that the loop polls (dio_socket with actor_add_reader),
 * so a completion wakes the loop at once.
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

#define DIO_MAX_THREADS 64

/* Starts n_threads I/O threads (1..DIO_MAX_THREADS; 1: every job in order, one at a time) over
 * store s with n_jobs jobs, each with a buffer of block_bytes (0: the store is not formatted yet;
 * dio_set_block_bytes later). ctx: the actor's ZeroMQ context. NULL on error. */
dio_t *dio_new(dstore_t *s, void *ctx, int n_jobs, int n_threads, size_t block_bytes, char *err, size_t errlen);
/* Runs every queued job, stops the threads, syncs the file. */
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
/* The most reads that ran at once so far. */
int dio_reads_parallel_max(dio_t *d);
/* Tests: hook(arg, job) runs on the I/O thread before each read (to hold reads and see them
 * overlap). Set before submitting. */
void dio_set_read_hook(dio_t *d, void (*hook)(void *arg, const dio_job_t *j), void *arg);

#endif
