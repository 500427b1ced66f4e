#include "actors/cache/disk_io.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"
#include "common/util.h"

struct dio {
    dstore_t *store;
    pthread_t *threads;           /* [n_threads] */
    int n_threads;                /* started */
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* a job was queued, or one finished (the head may run now) */
    dio_job_t *jobs;              /* [n_jobs] */
    int n_jobs;
    dio_job_t *free_list;         /* loop only */
    dio_job_t *queue_head, *queue_tail; /* under mu */
    dio_job_t *done_head, *done_tail;   /* under mu */
    int in_flight;                /* loop only: got from the thread's side and not back */
    int stop;                     /* under mu */
    int reads_running;            /* under mu: reads taken from the queue and not finished */
    int other_running;            /* under mu: 1 while a write or header job runs (it runs alone) */
    int reads_parallel_max;       /* under mu: the most reads seen running at once */
    int dirty;                    /* written since the last sync (only the job running alone, and
                                   * dio_destroy after the threads are gone, touch it) */
    int64_t last_sync_ms;         /* as dirty */
    void (*read_hook)(void *, const dio_job_t *); /* tests: called before each read, on its thread */
    void *read_hook_arg;
    void *wake_loop;              /* PAIR the loop reads */
    void *wake_thread;            /* PAIR the threads write, one at a time: only under mu */
    char ep[64];
};

static void s_run_job(dio_t *d, dio_job_t *j)
{
    int64_t t0 = now_ns();
    j->why[0] = '\0';
    switch (j->kind) {
    case DIO_FILE_HDR:
        j->err = dstore_write_file_hdr(d->store);
        break;
    case DIO_WRITE:
        j->rec.written_ms = wall_ms();
        j->err = dstore_write_slot(d->store, j->slot, &j->rec, j->buf);
        break;
    case DIO_WRITE_REC:
        j->err = dstore_write_rec(d->store, j->slot, &j->rec);
        break;
    case DIO_READ:
        j->read = dstore_read_slot(d->store, j->slot, j->hash, j->buf, j->why, sizeof j->why);
        break;
    }
    j->ms = (double)(now_ns() - t0) / 1e6;
}

/* Whether the queue's head may start now: a read while no write or header job runs (reads never
 * conflict with each other: each has its own slot and buffer, and preadv needs no shared offset);
 * any other job only once everything before it is over. So every job that could conflict with
 * another runs in submission order, and a run of reads overlaps. */
static int s_can_start(const dio_t *d, const dio_job_t *j)
{
    return j->kind == DIO_READ ? !d->other_running : !d->other_running && !d->reads_running;
}

static void *s_thread(void *arg)
{
    dio_t *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        dio_job_t *j = d->queue_head;
        if (!j && d->stop)
            break;   /* stop, and nothing left to do */
        if (!j || !s_can_start(d, j)) {
            pthread_cond_wait(&d->cv, &d->mu);
            continue;
        }
        d->queue_head = j->next;
        if (!d->queue_head)
            d->queue_tail = NULL;
        const int read = j->kind == DIO_READ;
        if (read && ++d->reads_running > d->reads_parallel_max)
            d->reads_parallel_max = d->reads_running;
        if (!read)
            d->other_running = 1;
        pthread_mutex_unlock(&d->mu);
        if (read && d->read_hook)
            d->read_hook(d->read_hook_arg, j);
        s_run_job(d, j);
        if (!read) {
            /* Survives a process kill as is (the page cache); a sync now and then bounds what a
             * power loss takes. Alone here: no other job runs. */
            d->dirty = 1;
            if (now_ms() - d->last_sync_ms > 5000) {
                fdatasync(d->store->fd);
                d->last_sync_ms = now_ms(), d->dirty = 0;
            }
        }
        pthread_mutex_lock(&d->mu);
        if (read)
            d->reads_running--;
        else
            d->other_running = 0;
        j->next = NULL;
        if (d->done_tail)
            d->done_tail->next = j;
        else
            d->done_head = j;
        d->done_tail = j;
        zmq_send(d->wake_thread, "", 0, ZMQ_DONTWAIT);   /* at the HWM the loop is awake anyway */
        pthread_cond_broadcast(&d->cv);   /* a job waiting for this one may start */
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

dio_t *dio_new(dstore_t *s, void *ctx, int n_jobs, int n_threads, size_t block_bytes, char *err, size_t errlen)
{
    static int s_count;
    dio_t *d = calloc(1, sizeof *d);
    if (!d || n_jobs < 1 || n_threads < 1 || n_threads > DIO_MAX_THREADS) {
        snprintf(err, errlen, d ? "disk tier: %d jobs and %d I/O threads (1..%d)" : "disk tier: out of memory", n_jobs,
                 n_threads, DIO_MAX_THREADS);
        free(d);
        return NULL;
    }
    d->store = s;
    d->n_jobs = n_jobs;
    d->last_sync_ms = now_ms();
    d->jobs = calloc((size_t)n_jobs, sizeof *d->jobs);
    d->threads = calloc((size_t)n_threads, sizeof *d->threads);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    snprintf(d->ep, sizeof d->ep, "inproc://disk-io-%d-%d", (int)getpid(), s_count++);
    d->wake_loop = zmq_socket(ctx, ZMQ_PAIR);
    d->wake_thread = zmq_socket(ctx, ZMQ_PAIR);
    int linger = 0, hwm = 1000;
    if (!d->jobs || !d->threads || !d->wake_loop || !d->wake_thread) {
        snprintf(err, errlen, "disk tier: out of memory or sockets");
        dio_destroy(&d);
        return NULL;
    }
    zmq_setsockopt(d->wake_loop, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(d->wake_thread, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(d->wake_thread, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (zmq_bind(d->wake_loop, d->ep) != 0 || zmq_connect(d->wake_thread, d->ep) != 0) {
        snprintf(err, errlen, "disk tier: wake-up socket: %s", zmq_strerror(zmq_errno()));
        dio_destroy(&d);
        return NULL;
    }
    for (int i = n_jobs; i-- > 0;) {
        d->jobs[i].next = d->free_list;
        d->free_list = &d->jobs[i];
    }
    if (block_bytes && dio_set_block_bytes(d, block_bytes) != 0) {
        snprintf(err, errlen, "disk tier: out of memory for %d buffers of %zu bytes", n_jobs, block_bytes);
        dio_destroy(&d);
        return NULL;
    }
    for (; d->n_threads < n_threads; d->n_threads++)
        if (pthread_create(&d->threads[d->n_threads], NULL, s_thread, d) != 0) {
            snprintf(err, errlen, "disk tier: cannot start I/O thread %d of %d", d->n_threads + 1, n_threads);
            dio_destroy(&d);
            return NULL;
        }
    return d;
}

void dio_set_read_hook(dio_t *d, void (*hook)(void *arg, const dio_job_t *j), void *arg)
{
    pthread_mutex_lock(&d->mu);
    d->read_hook = hook;
    d->read_hook_arg = arg;
    pthread_mutex_unlock(&d->mu);
}

int dio_reads_parallel_max(dio_t *d)
{
    pthread_mutex_lock(&d->mu);
    const int n = d->reads_parallel_max;
    pthread_mutex_unlock(&d->mu);
    return n;
}

int dio_set_block_bytes(dio_t *d, size_t block_bytes)
{
    for (int i = 0; i < d->n_jobs; i++) {
        if (d->jobs[i].buf)
            continue;
        d->jobs[i].buf = malloc(block_bytes);
        if (!d->jobs[i].buf)
            return -1;
    }
    return 0;
}

void dio_destroy(dio_t **self_p)
{
    dio_t *d = self_p ? *self_p : NULL;
    if (!d)
        return;
    if (d->n_threads) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        for (int i = 0; i < d->n_threads; i++)
            pthread_join(d->threads[i], NULL);
        if (d->dirty)
            fdatasync(d->store->fd);
    }
    if (d->wake_loop)
        zmq_close(d->wake_loop);
    if (d->wake_thread)
        zmq_close(d->wake_thread);
    for (int i = 0; d->jobs && i < d->n_jobs; i++)
        free(d->jobs[i].buf);
    free(d->jobs);
    free(d->threads);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
    *self_p = NULL;
}

dio_job_t *dio_get(dio_t *d)
{
    dio_job_t *j = d->free_list;
    if (!j || !j->buf)
        return NULL;
    d->free_list = j->next;
    j->next = NULL;
    return j;
}

void dio_put(dio_t *d, dio_job_t *j)
{
    j->next = d->free_list;
    d->free_list = j;
}

void dio_submit(dio_t *d, dio_job_t *j)
{
    j->next = NULL;
    d->in_flight++;
    pthread_mutex_lock(&d->mu);
    if (d->queue_tail)
        d->queue_tail->next = j;
    else
        d->queue_head = j;
    d->queue_tail = j;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

dio_job_t *dio_next_done(dio_t *d)
{
    char b;
    while (zmq_recv(d->wake_loop, &b, 1, ZMQ_DONTWAIT) >= 0)
        ;
    pthread_mutex_lock(&d->mu);
    dio_job_t *j = d->done_head;
    if (j) {
        d->done_head = j->next;
        if (!d->done_head)
            d->done_tail = NULL;
        j->next = NULL;
    }
    pthread_mutex_unlock(&d->mu);
    if (j)
        d->in_flight--;
    return j;
}

void *dio_socket(dio_t *d)
{
    return d->wake_loop;
}

int dio_in_flight(const dio_t *d)
{
    return d->in_flight;
}
