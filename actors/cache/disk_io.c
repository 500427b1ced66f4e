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
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dio_job_t *jobs;              /* [n_jobs] */
    int n_jobs;
    dio_job_t *free_list;         /* loop only */
    dio_job_t *queue_head, *queue_tail; /* under mu */
    dio_job_t *done_head, *done_tail;   /* under mu */
    int in_flight;                /* loop only: got from the thread's side and not back */
    int stop;                     /* under mu */
    void *wake_loop;              /* PAIR the loop reads */
    void *wake_thread;            /* PAIR the thread writes (only the thread touches it) */
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

static void *s_thread(void *arg)
{
    dio_t *d = arg;
    int64_t last_sync = now_ms();
    int dirty = 0;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->queue_head && !d->stop)
            pthread_cond_wait(&d->cv, &d->mu);
        dio_job_t *j = d->queue_head;
        if (!j)
            break;   /* stop, and nothing left to do */
        d->queue_head = j->next;
        if (!d->queue_head)
            d->queue_tail = NULL;
        pthread_mutex_unlock(&d->mu);
        s_run_job(d, j);
        dirty |= j->kind != DIO_READ;
        /* Survives a process kill as is (the page cache); a sync now and then bounds what a power
         * loss takes. */
        if (dirty && now_ms() - last_sync > 5000) {
            fdatasync(d->store->fd);
            last_sync = now_ms(), dirty = 0;
        }
        pthread_mutex_lock(&d->mu);
        j->next = NULL;
        if (d->done_tail)
            d->done_tail->next = j;
        else
            d->done_head = j;
        d->done_tail = j;
        pthread_mutex_unlock(&d->mu);
        zmq_send(d->wake_thread, "", 0, ZMQ_DONTWAIT);   /* at the HWM the loop is awake anyway */
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    if (dirty)
        fdatasync(d->store->fd);
    return NULL;
}

dio_t *dio_new(dstore_t *s, void *ctx, int n_jobs, size_t block_bytes, char *err, size_t errlen)
{
    static int s_count;
    dio_t *d = calloc(1, sizeof *d);
    if (!d || n_jobs < 1) {
        snprintf(err, errlen, "disk tier: out of memory");
        free(d);
        return NULL;
    }
    d->store = s;
    d->n_jobs = n_jobs;
    d->jobs = calloc((size_t)n_jobs, sizeof *d->jobs);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    snprintf(d->ep, sizeof d->ep, "inproc://disk-io-%d-%d", (int)getpid(), s_count++);
    d->wake_loop = zmq_socket(ctx, ZMQ_PAIR);
    d->wake_thread = zmq_socket(ctx, ZMQ_PAIR);
    int linger = 0, hwm = 1000;
    if (!d->jobs || !d->wake_loop || !d->wake_thread) {
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
    if (pthread_create(&d->thread, NULL, s_thread, d) != 0) {
        snprintf(err, errlen, "disk tier: cannot start the I/O thread");
        d->thread = 0;
        dio_destroy(&d);
        return NULL;
    }
    return d;
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
    if (d->thread) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    if (d->wake_loop)
        zmq_close(d->wake_loop);
    if (d->wake_thread)
        zmq_close(d->wake_thread);
    for (int i = 0; d->jobs && i < d->n_jobs; i++)
        free(d->jobs[i].buf);
    free(d->jobs);
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
