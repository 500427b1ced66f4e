/* engine/ep_sock.c — the expert-parallel group's transport between processes of one host: a unix
 * stream socket pair between every two ranks. An exchange is one poll loop over all peers at once
 * (sending and receiving together, so two ranks sending each other large buffers never wait on
 * each other); a peer's EOF or error fails it at once, naming the rank. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "engine/ep.h"

typedef struct {
    ep_comm_t base;
    int fds[EP_MAX_RANKS];
} ep_sock_t;

static int s_exchange(ep_comm_t *c, const void *const *sbuf, const size_t *send_n, void *const *rbuf,
                      const size_t *recv_n, int deadline_ms, char *err, size_t errlen)
{
    ep_sock_t *s = (ep_sock_t *)c;
    const int n = c->n_ranks, me = c->rank;
    size_t sent[EP_MAX_RANKS] = {0}, got[EP_MAX_RANKS] = {0};
    if (send_n[me] != recv_n[me])
        return errf(err, errlen, "rank %d: %zu bytes to itself, %zu expected", me, send_n[me], recv_n[me]);
    if (send_n[me])
        memcpy(rbuf[me], sbuf[me], send_n[me]);
    const int64_t end = deadline_ms < 0 ? -1 : now_ns() + (int64_t)deadline_ms * 1000000;
    for (;;) {
        struct pollfd pf[EP_MAX_RANKS];
        int who[EP_MAX_RANKS], np = 0;
        for (int r = 0; r < n; r++) {
            if (r == me)
                continue;
            short ev = (short)((sent[r] < send_n[r] ? POLLOUT : 0) | (got[r] < recv_n[r] ? POLLIN : 0));
            if (!ev)
                continue;
            pf[np] = (struct pollfd){.fd = s->fds[r], .events = ev};
            who[np++] = r;
        }
        if (np == 0)
            return 0;
        int wait = -1;
        if (end >= 0) {
            int64_t left = (end - now_ns()) / 1000000;
            if (left <= 0) {
                for (int i = 0; i < np; i++)
                    if (got[who[i]] < recv_n[who[i]] || sent[who[i]] < send_n[who[i]])
                        return errf(err, errlen, "rank %d: nothing from rank %d for %d ms (%zu of %zu bytes received, "
                                    "%zu of %zu sent)", me, who[i], deadline_ms, got[who[i]], recv_n[who[i]],
                                    sent[who[i]], send_n[who[i]]);
            }
            wait = (int)(left > 1000 ? 1000 : left);
        }
        int k = poll(pf, (nfds_t)np, wait);
        if (k < 0 && errno != EINTR)
            return errf(err, errlen, "rank %d: poll: %s", me, strerror(errno));
        for (int i = 0; k > 0 && i < np; i++) {
            const int r = who[i];
            if (pf[i].revents & POLLOUT) {
                ssize_t w = send(s->fds[r], (const char *)sbuf[r] + sent[r], send_n[r] - sent[r], MSG_NOSIGNAL);
                if (w < 0 && errno != EAGAIN && errno != EINTR)
                    return errf(err, errlen, "rank %d: sending to rank %d: %s (it has gone)", me, r, strerror(errno));
                if (w > 0)
                    sent[r] += (size_t)w;
            }
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) {
                if (got[r] >= recv_n[r]) {
                    if (pf[i].revents & (POLLHUP | POLLERR))
                        return errf(err, errlen, "rank %d: rank %d closed its connection", me, r);
                    continue;
                }
                ssize_t g = recv(s->fds[r], (char *)rbuf[r] + got[r], recv_n[r] - got[r], 0);
                if (g == 0)
                    return errf(err, errlen, "rank %d: rank %d closed its connection (%zu of %zu bytes received)", me, r,
                                got[r], recv_n[r]);
                if (g < 0 && errno != EAGAIN && errno != EINTR)
                    return errf(err, errlen, "rank %d: receiving from rank %d: %s", me, r, strerror(errno));
                if (g > 0)
                    got[r] += (size_t)g;
            }
        }
    }
}

static void s_destroy(ep_comm_t *c)
{
    ep_sock_t *s = (ep_sock_t *)c;
    for (int r = 0; r < c->n_ranks; r++)
        if (s->fds[r] >= 0)
            close(s->fds[r]);
    free(s);
}

static const ep_comm_ops_t s_ops = {.name = "unix sockets", .device = 0, .exchange = s_exchange, .destroy = s_destroy};

ep_comm_t *ep_sock_new(int rank, int n_ranks, const int *fds, char *err, size_t errlen)
{
    if (n_ranks < 1 || n_ranks > EP_MAX_RANKS || rank < 0 || rank >= n_ranks) {
        errf(err, errlen, "expert parallelism: rank %d of %d (1..%d ranks)", rank, n_ranks, EP_MAX_RANKS);
        return NULL;
    }
    ep_sock_t *s = calloc(1, sizeof *s);
    if (!s) {
        errf(err, errlen, "expert parallelism: out of memory");
        return NULL;
    }
    s->base = (ep_comm_t){.ops = &s_ops, .rank = rank, .n_ranks = n_ranks};
    for (int r = 0; r < EP_MAX_RANKS; r++)
        s->fds[r] = -1;
    for (int r = 0; r < n_ranks; r++) {
        if (r == rank)
            continue;
        if (fds[r] < 0 || fcntl(fds[r], F_SETFL, fcntl(fds[r], F_GETFL) | O_NONBLOCK) < 0) {
            errf(err, errlen, "expert parallelism: rank %d: no usable socket towards rank %d (fd %d)", rank, r, fds[r]);
            s->base.n_ranks = r;
            s_destroy(&s->base);
            return NULL;
        }
        s->fds[r] = fds[r];
    }
    return &s->base;
}

int ep_sock_pairs(int n_ranks, int *pairs, char *err, size_t errlen)
{
    for (int i = 0; i < n_ranks * n_ranks; i++)
        pairs[i] = -1;
    for (int a = 0; a < n_ranks; a++)
        for (int b = a + 1; b < n_ranks; b++) {
            int sv[2];
            if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
                for (int i = 0; i < n_ranks * n_ranks; i++)
                    if (pairs[i] >= 0)
                        close(pairs[i]);
                return errf(err, errlen, "expert parallelism: socketpair: %s", strerror(errno));
            }
            pairs[a * n_ranks + b] = sv[0];
            pairs[b * n_ranks + a] = sv[1];
        }
    return 0;
}
