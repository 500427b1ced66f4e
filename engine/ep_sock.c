/* engine/ep_sock.c — the expert-parallel group's transport between processes of one host: a unix
 * stream socket pair between every two ranks. An exchange is one poll loop over all peers at once
 * (sending and receiving together, so two ranks sending each other large buffers never wait on
 * each other); a peer's EOF or error fails it at once, naming the rank. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
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

static int s_poll_fds(const ep_comm_t *c, int *fds)
{
    const ep_sock_t *s = (const ep_sock_t *)c;
    int n = 0;
    for (int r = 0; r < c->n_ranks; r++)
        if (s->fds[r] >= 0)
            fds[n++] = s->fds[r];
    return n;
}

static const ep_comm_ops_t s_ops = {.name = "unix sockets", .device = 0, .exchange = s_exchange, .destroy = s_destroy,
                                    .poll_fds = s_poll_fds};

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

/* ---- rendezvous of independent processes ---------------------------------------------------- */

#define EP_HELLO_MAGIC 0x45504831u   /* "EPH1" */

typedef struct {
    uint32_t magic, from, to, n_ranks;
    uint64_t group;               /* a hash of the group's name */
} ep_hello_t;

static uint64_t s_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int s_path(char *out, size_t cap, const char *dir, const char *group, int rank)
{
    struct sockaddr_un un;
    const int k = snprintf(out, cap, "%s/%s.ep%d", dir, group, rank);
    return k > 0 && (size_t)k < cap && (size_t)k < sizeof un.sun_path ? 0 : -1;
}

/* Whole hello within the deadline: 1 read, 0 the peer went away or sent garbage, -1 out of time. */
static int s_hello_io(int fd, ep_hello_t *h, int write_it, int64_t end)
{
    size_t done = 0;
    while (done < sizeof *h) {
        int64_t left = (end - now_ns()) / 1000000;
        if (left <= 0)
            return -1;
        struct pollfd pf = {.fd = fd, .events = write_it ? POLLOUT : POLLIN};
        if (poll(&pf, 1, (int)(left > 200 ? 200 : left)) <= 0)
            continue;
        ssize_t k = write_it ? send(fd, (const char *)h + done, sizeof *h - done, MSG_NOSIGNAL)
                             : recv(fd, (char *)h + done, sizeof *h - done, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
            return 0;
        if (k > 0)
            done += (size_t)k;
    }
    return 1;
}

static void s_close_all(int *fds, int n)
{
    for (int r = 0; r < n; r++)
        if (fds[r] >= 0) {
            close(fds[r]);
            fds[r] = -1;
        }
}

ep_comm_t *ep_sock_rendezvous(const char *dir, const char *group, int rank, int n_ranks, int deadline_ms, char *err,
                              size_t errlen)
{
    if (n_ranks < 2 || n_ranks > EP_MAX_RANKS || rank < 0 || rank >= n_ranks) {
        errf(err, errlen, "expert parallelism: rank %d of %d (2..%d ranks)", rank, n_ranks, EP_MAX_RANKS);
        return NULL;
    }
    char mine[PATH_MAX];
    if (s_path(mine, sizeof mine, dir, group, rank) < 0) {
        errf(err, errlen, "expert parallelism: the socket path %s/%s.ep%d is too long", dir, group, rank);
        return NULL;
    }
    const uint64_t gh = s_hash(group);
    const int64_t end = now_ns() + (int64_t)deadline_ms * 1000000;
    int fds[EP_MAX_RANKS], lfd = -1;
    for (int r = 0; r < EP_MAX_RANKS; r++)
        fds[r] = -1;
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    memcpy(un.sun_path, mine, strlen(mine) + 1);   /* s_path checked the length */
    unlink(mine);   /* an earlier incarnation's */
    if ((lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0 ||
        bind(lfd, (struct sockaddr *)&un, sizeof un) < 0 || listen(lfd, EP_MAX_RANKS) < 0) {
        errf(err, errlen, "expert parallelism: rank %d cannot listen at %s: %s", rank, mine, strerror(errno));
        if (lfd >= 0)
            close(lfd);
        return NULL;
    }
    /* Lower ranks first, by connecting (each lower rank is listening from its start), then the
     * higher ones by accepting: connections only go downwards, so no two ranks wait on each other. */
    for (int p = 0; p < rank; p++) {
        char path[PATH_MAX];
        s_path(path, sizeof path, dir, group, p);
        while (fds[p] < 0) {
            if (now_ns() >= end) {
                errf(err, errlen, "expert parallelism: rank %d of group %s: rank %d did not answer at %s within %d ms",
                     rank, group, p, path, deadline_ms);
                goto fail;
            }
            struct sockaddr_un pa = {.sun_family = AF_UNIX};
            memcpy(pa.sun_path, path, strlen(path) + 1);
            int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, (struct sockaddr *)&pa, sizeof pa) == 0) {
                fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
                ep_hello_t h = {.magic = EP_HELLO_MAGIC, .from = (uint32_t)rank, .to = (uint32_t)p,
                                .n_ranks = (uint32_t)n_ranks, .group = gh};
                const int64_t hend = end < now_ns() + 2000000000ll ? end : now_ns() + 2000000000ll;
                if (s_hello_io(fd, &h, 1, hend) == 1 && s_hello_io(fd, &h, 0, hend) == 1 && h.magic == EP_HELLO_MAGIC &&
                    h.from == (uint32_t)p && h.to == (uint32_t)rank && h.n_ranks == (uint32_t)n_ranks && h.group == gh) {
                    fds[p] = fd;
                    break;
                }
            }
            if (fd >= 0)
                close(fd);   /* missing, refused, or a peer on its way out: again shortly */
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
    }
    for (int got = rank + 1; got < n_ranks;) {
        const int64_t left = (end - now_ns()) / 1000000;
        if (left <= 0) {
            int missing = rank + 1;
            while (missing < n_ranks && fds[missing] >= 0)
                missing++;
            errf(err, errlen, "expert parallelism: rank %d of group %s: rank %d did not connect within %d ms", rank,
                 group, missing, deadline_ms);
            goto fail;
        }
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        if (poll(&pf, 1, (int)(left > 200 ? 200 : left)) <= 0)
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            continue;
        ep_hello_t h;
        const int64_t hend = end < now_ns() + 2000000000ll ? end : now_ns() + 2000000000ll;
        if (s_hello_io(fd, &h, 0, hend) != 1 || h.magic != EP_HELLO_MAGIC || h.to != (uint32_t)rank ||
            h.n_ranks != (uint32_t)n_ranks || h.group != gh || h.from <= (uint32_t)rank || h.from >= (uint32_t)n_ranks) {
            LOG_W("expert parallelism: rank %d of group %s: a connection without a valid hello, dropped", rank, group);
            close(fd);
            continue;
        }
        const int from = (int)h.from;
        ep_hello_t back = {.magic = EP_HELLO_MAGIC, .from = (uint32_t)rank, .to = (uint32_t)from,
                           .n_ranks = (uint32_t)n_ranks, .group = gh};
        if (s_hello_io(fd, &back, 1, hend) != 1) {
            close(fd);
            continue;
        }
        if (fds[from] >= 0)   /* that rank again: its earlier connection was an incarnation gone since */
            close(fds[from]);
        else
            got++;
        fds[from] = fd;
    }
    close(lfd);
    unlink(mine);
    ep_comm_t *c = ep_sock_new(rank, n_ranks, fds, err, errlen);
    if (!c)
        s_close_all(fds, n_ranks);
    return c;
fail:
    close(lfd);
    unlink(mine);
    s_close_all(fds, n_ranks);
    return NULL;
}
