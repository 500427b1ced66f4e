/* actors/router/tokpool.c — see tokpool.h. */
#include "actors/router/tokpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"

#define TOKPOOL_MAX_THREADS 16

struct tokpool {
    const prompt_model_t *pm;    /* shared by the threads: read only */
    void *ctx;                   /* the actor's ZeroMQ context */
    char endpoint[128];          /* inproc://..., the PULL's */
    void *pull;                  /* router side: the jobs coming back */
    pthread_mutex_t mu;          /* guards queue_head/tail and stop */
    pthread_cond_t cv;           /* a job was queued, or stop */
    tokjob_t *queue_head, *queue_tail;
    int stop;
    pthread_t threads[TOKPOOL_MAX_THREADS];
    int n_threads;               /* started */
};

/* One thread: its own PUSH (ZeroMQ sockets are not shared between threads), jobs until stop. */
static void *s_thread(void *arg)
{
    tokpool_t *p = arg;
    void *push = zmq_socket(p->ctx, ZMQ_PUSH);
    int zero = 0;
    if (!push || zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(push, ZMQ_SNDHWM, &zero, sizeof zero) != 0 || zmq_connect(push, p->endpoint) != 0) {
        /* Nothing can come back from this thread: it takes no jobs (the others do). */
        LOG_E("tokenizer thread: cannot connect to %s: %s", p->endpoint, zmq_strerror(zmq_errno()));
        if (push)
            zmq_close(push);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && !p->queue_head)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        tokjob_t *j = p->queue_head;
        p->queue_head = j->queue_next;
        if (!p->queue_head)
            p->queue_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        j->rc = prompt_ids(p->pm, &j->submit.u.submit, &j->ids, &j->n, j->err, sizeof j->err, &j->field);
        /* SNDHWM 0 on an inproc pipe: the send does not block or fail short of memory. */
        while (zmq_send(push, &j, sizeof j, 0) < 0 && zmq_errno() == EINTR)
            ;
    }
    zmq_close(push);
    return NULL;
}

tokpool_t *tokpool_new(void *zmq_ctx, const char *name, const prompt_model_t *pm, int n_threads, char *err,
                       size_t errlen)
{
    if (n_threads < 1)
        n_threads = 1;
    if (n_threads > TOKPOOL_MAX_THREADS)
        n_threads = TOKPOOL_MAX_THREADS;
    tokpool_t *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "tokenizer pool: out of memory");
        return NULL;
    }
    p->pm = pm;
    p->ctx = zmq_ctx;
    snprintf(p->endpoint, sizeof p->endpoint, "inproc://tokpool-%s-%p", name, (void *)p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->pull = zmq_socket(zmq_ctx, ZMQ_PULL);
    int zero = 0;
    if (!p->pull || zmq_setsockopt(p->pull, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(p->pull, ZMQ_RCVHWM, &zero, sizeof zero) != 0 || zmq_bind(p->pull, p->endpoint) != 0) {
        snprintf(err, errlen, "tokenizer pool: cannot bind %s: %s", p->endpoint, zmq_strerror(zmq_errno()));
        if (p->pull)
            zmq_close(p->pull);
        p->pull = NULL;
        tokpool_destroy(&p);
        return NULL;
    }
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, s_thread, p) != 0) {
            snprintf(err, errlen, "tokenizer pool: cannot start thread %d", i);
            void *pull = p->pull;
            tokpool_destroy(&p);
            zmq_close(pull);
            return NULL;
        }
        p->n_threads++;
    }
    return p;
}

void tokpool_destroy(tokpool_t **self_p)
{
    tokpool_t *p = *self_p;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    *self_p = NULL;
}

void *tokpool_socket(tokpool_t *p)
{
    return p->pull;
}

void tokpool_submit(tokpool_t *p, tokjob_t *j)
{
    j->queue_next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->queue_tail)
        p->queue_tail->queue_next = j;
    else
        p->queue_head = j;
    p->queue_tail = j;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

tokjob_t *tokpool_recv(tokpool_t *p)
{
    tokjob_t *j = NULL;
    int rc = zmq_recv(p->pull, &j, sizeof j, ZMQ_DONTWAIT);
    return rc == (int)sizeof j ? j : NULL;
}

void tokjob_free(tokjob_t **self_p)
{
    tokjob_t *j = *self_p;
    if (!j)
        return;
    msg_free(&j->submit);
    free(j->ids);
    free(j);
    *self_p = NULL;
}
