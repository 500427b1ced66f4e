/* transfer/kv_copier.c — the write-back copier thread (kv_copier.h).
 *
 * A fixed ring of job slots under one mutex: submit fills the tail, the thread takes the oldest
 * queued job, works on it without the lock (segment creation and the copies are the slow part),
 * then marks it done; poll hands done jobs back in order. */
#include "transfer/kv_copier.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { JOB_FREE, JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state_t;

typedef struct job {
    job_state_t state;
    uint64_t transfer_id;
    const void **src;            /* [n] device pointers of the blocks */
    int n;
    void *cookie;
    int ok;
    tchan_seg_t seg;
    char err[256];
} job_t;

struct kvcopier {
    backend_t *be;
    char cluster[64];
    size_t block_bytes;
    int max_jobs;
    job_t *jobs;                 /* ring [max_jobs]: head is the oldest */
    int head, count;
    int stop;
    pthread_mutex_t lock;
    pthread_cond_t wake;         /* to the thread: a job is queued, or stop */
    pthread_cond_t finished;     /* from the thread: a job is done */
    pthread_t thread;
};

static void s_run(kvcopier_t *c, job_t *j)
{
    if (tchan_shm_create(&j->seg, c->cluster, j->transfer_id, (size_t)j->n * c->block_bytes, j->err, sizeof j->err) != 0)
        return;
    int (*down)(backend_t *, void *, const void *, size_t) = c->be->ops->download_side ? c->be->ops->download_side
                                                                                        : c->be->ops->download;
    uint8_t *dst = j->seg.ptr;
    for (int i = 0; i < j->n; i++)
        if (down(c->be, dst + (size_t)i * c->block_bytes, j->src[i], c->block_bytes) != 0) {
            snprintf(j->err, sizeof j->err, "copy of block %d of %d to the host failed", i, j->n);
            tchan_shm_close(&j->seg);
            return;
        }
    j->ok = 1;
}

static void *s_thread(void *arg)
{
    kvcopier_t *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        job_t *j = NULL;
        for (int k = 0; k < c->count && !j; k++) {
            job_t *x = &c->jobs[(c->head + k) % c->max_jobs];
            if (x->state == JOB_QUEUED)
                j = x;
        }
        if (c->stop)
            break;
        if (!j) {
            pthread_cond_wait(&c->wake, &c->lock);
            continue;
        }
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&c->lock);
        s_run(c, j);
        pthread_mutex_lock(&c->lock);
        j->state = JOB_DONE;
        pthread_cond_broadcast(&c->finished);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

kvcopier_t *kvcopier_new(backend_t *be, const char *cluster, size_t block_bytes, int max_jobs)
{
    kvcopier_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->be = be;
    snprintf(c->cluster, sizeof c->cluster, "%s", cluster);
    c->block_bytes = block_bytes;
    c->max_jobs = max_jobs;
    c->jobs = calloc((size_t)max_jobs, sizeof *c->jobs);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->finished, NULL);
    if (!c->jobs || pthread_create(&c->thread, NULL, s_thread, c) != 0) {
        pthread_cond_destroy(&c->wake);
        pthread_cond_destroy(&c->finished);
        pthread_mutex_destroy(&c->lock);
        free(c->jobs);
        free(c);
        return NULL;
    }
    return c;
}

void kvcopier_destroy(kvcopier_t **self_p)
{
    kvcopier_t *c = *self_p;
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    for (int i = 0; i < c->max_jobs; i++) {
        tchan_shm_close(&c->jobs[i].seg);
        free(c->jobs[i].src);
    }
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->finished);
    pthread_mutex_destroy(&c->lock);
    free(c->jobs);
    free(c);
    *self_p = NULL;
}

int kvcopier_submit(kvcopier_t *c, uint64_t transfer_id, const void *const *src, int n, void *cookie)
{
    const void **copy = n > 0 ? malloc((size_t)n * sizeof *copy) : NULL;
    if (!copy)
        return -1;
    memcpy(copy, src, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&c->lock);
    if (c->count == c->max_jobs) {
        pthread_mutex_unlock(&c->lock);
        free(copy);
        return -1;
    }
    job_t *j = &c->jobs[(c->head + c->count++) % c->max_jobs];
    free(j->src);
    *j = (job_t){.state = JOB_QUEUED, .transfer_id = transfer_id, .src = copy, .n = n, .cookie = cookie};
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

int kvcopier_poll(kvcopier_t *c, kvcopier_done_t *out)
{
    pthread_mutex_lock(&c->lock);
    job_t *j = c->count ? &c->jobs[c->head] : NULL;
    if (!j || j->state != JOB_DONE) {   /* in order: the oldest first */
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    *out = (kvcopier_done_t){.cookie = j->cookie, .transfer_id = j->transfer_id, .ok = j->ok, .seg = j->seg};
    memcpy(out->err, j->err, sizeof out->err);
    free(j->src);
    *j = (job_t){.state = JOB_FREE};
    c->head = (c->head + 1) % c->max_jobs;
    c->count--;
    pthread_mutex_unlock(&c->lock);
    return 1;
}

int kvcopier_pending(const kvcopier_t *c)
{
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    int n = c->count;
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
    return n;
}

void kvcopier_drain(kvcopier_t *c)
{
    pthread_mutex_lock(&c->lock);
    for (;;) {
        int busy = 0;
        for (int k = 0; k < c->count; k++)
            busy |= c->jobs[(c->head + k) % c->max_jobs].state != JOB_DONE;
        if (!busy)
            break;
        pthread_cond_wait(&c->finished, &c->lock);
    }
    pthread_mutex_unlock(&c->lock);
}
