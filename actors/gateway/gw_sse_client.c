#include "actors/gateway/gw_sse_client.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/util.h"

#define RBUF (1 << 16)
#define EVENT_MAX (1 << 20)

struct gw_sse_client {
    char host[256], port[16];
    int fd;
    char buf[RBUF];              /* read buffer: buf[r..w) unread */
    size_t r, w;
    char *ev;                    /* [EVENT_MAX] the SSE text not yet split into events */
    size_t ev_len;
};

static int s_open(gw_sse_client_t *c, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(c->host, c->port, &hints, &ai);
    if (rc != 0)
        return errf(err, errlen, "%s: %s", c->host, gai_strerror(rc));
    c->fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (c->fd < 0 || connect(c->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        freeaddrinfo(ai);
        if (c->fd >= 0)
            close(c->fd);
        c->fd = -1;
        return errf(err, errlen, "connect %s:%s: %s", c->host, c->port, strerror(errno));
    }
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->r = c->w = 0;
    return 0;
}

gw_sse_client_t *gw_sse_connect(const char *url, char *err, size_t errlen)
{
    if (strncmp(url, "http://", 7) != 0) {
        errf(err, errlen, "'%s' is not http://host:port", url);
        return NULL;
    }
    const char *h = url + 7, *colon = strrchr(h, ':');
    gw_sse_client_t *c = calloc(1, sizeof *c);
    if (!c || !(c->ev = malloc(EVENT_MAX))) {
        free(c);
        errf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(c->host, sizeof c->host, "%.*s", colon ? (int)(colon - h) : (int)strlen(h), h);
    snprintf(c->port, sizeof c->port, "%.15s", colon ? colon + 1 : "80");
    c->port[strcspn(c->port, "/")] = '\0';
    if (s_open(c, err, errlen) != 0) {
        gw_sse_destroy(&c);
        return NULL;
    }
    return c;
}

void gw_sse_destroy(gw_sse_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    if ((*self_p)->fd >= 0)
        close((*self_p)->fd);
    free((*self_p)->ev);
    free(*self_p);
    *self_p = NULL;
}

/* At least one more byte in buf; -1 on EOF or error. */
static int s_fill(gw_sse_client_t *c)
{
    if (c->r == c->w)
        c->r = c->w = 0;
    if (c->w == RBUF) {
        memmove(c->buf, c->buf + c->r, c->w - c->r);
        c->w -= c->r;
        c->r = 0;
    }
    ssize_t n;
    do
        n = read(c->fd, c->buf + c->w, RBUF - c->w);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return -1;
    c->w += (size_t)n;
    return 0;
}

/* One CRLF-terminated line (without the CRLF) into line[cap]; -1 on EOF or a line too long. */
static int s_line(gw_sse_client_t *c, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        while (c->r < c->w) {
            char ch = c->buf[c->r++];
            if (ch == '\n') {
                if (n && line[n - 1] == '\r')
                    n--;
                line[n] = '\0';
                return 0;
            }
            if (n + 1 >= cap)
                return -1;
            line[n++] = ch;
        }
        if (s_fill(c) != 0)
            return -1;
    }
}

/* Adds SSE text and calls fn for each complete event. 1 after [DONE], 0 to go on, -1 to stop. */
static int s_events(gw_sse_client_t *c, const char *p, size_t n, gw_sse_event_fn fn, void *arg)
{
    if (c->ev_len + n + 1 > EVENT_MAX)
        return -1;
    memcpy(c->ev + c->ev_len, p, n);
    c->ev_len += n;
    c->ev[c->ev_len] = '\0';
    char *start = c->ev, *end;
    int rc = 0;
    while (rc == 0 && (end = strstr(start, "\n\n"))) {
        *end = '\0';
        if (strncmp(start, "data: ", 6) == 0) {
            if (strcmp(start + 6, "[DONE]") == 0) {
                fn(arg, NULL);
                rc = 1;
            } else {
                json_t *j = json_loads(start + 6, 0, NULL);
                rc = j ? fn(arg, j) : -1;
                json_decref(j);
            }
        }
        start = end + 2;
    }
    c->ev_len -= (size_t)(start - c->ev);
    memmove(c->ev, start, c->ev_len);
    return rc;
}

/* Writes iov[0] then iov[1] whole (a short write goes on where it stopped); -1 on an error. */
static int s_writev_all(int fd, struct iovec iov[2])
{
    int at = 0;
    while (at < 2) {
        ssize_t n = writev(fd, iov + at, 2 - at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        size_t left = (size_t)n;
        while (at < 2 && left >= iov[at].iov_len)
            left -= iov[at++].iov_len;
        if (at < 2) {
            iov[at].iov_base = (char *)iov[at].iov_base + left;
            iov[at].iov_len -= left;
        }
    }
    return 0;
}

int gw_sse_post(gw_sse_client_t *c, const char *path, const char *body, gw_sse_event_fn fn, void *arg, char *err,
                size_t errlen)
{
    char head[512], line[4096];
    size_t bl = strlen(body);
    int hl = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n", path, c->host, bl);
    for (int attempt = 0;; attempt++) {
        if (c->fd < 0 && s_open(c, err, errlen) != 0)
            return -1;
        /* Head and body in one write: two (under TCP_NODELAY two segments) had the server wake for
         * the head alone, then again for the body. */
        struct iovec iov[2] = {{.iov_base = head, .iov_len = (size_t)hl}, {.iov_base = (void *)body, .iov_len = bl}};
        if (s_writev_all(c->fd, iov) == 0 && s_line(c, line, sizeof line) == 0)
            break;
        close(c->fd);   /* a kept-alive connection the server had closed: once more on a fresh one */
        c->fd = -1;
        if (attempt)
            return errf(err, errlen, "no reply from %s:%s", c->host, c->port);
    }
    int status = 0;
    sscanf(line, "HTTP/1.%*d %d", &status);
    long clen = -1;
    int chunked = 0;
    while (s_line(c, line, sizeof line) == 0 && line[0]) {
        if (!strncasecmp(line, "Content-Length:", 15))
            clen = strtol(line + 15, NULL, 10);
        if (!strncasecmp(line, "Transfer-Encoding:", 18) && strstr(line, "chunked"))
            chunked = 1;
    }
    if (status != 200) {
        /* The error body, for the message (Content-Length bodies only: errors are never chunked). */
        char msg[1024] = "";
        size_t got = 0;
        while (clen > 0 && got < (size_t)clen && got < sizeof msg - 1) {
            if (c->r == c->w && s_fill(c) != 0)
                break;
            msg[got++] = c->buf[c->r++];
        }
        msg[got] = '\0';
        close(c->fd);
        c->fd = -1;
        return errf(err, errlen, "HTTP %d: %s", status, msg);
    }
    if (!chunked) {
        close(c->fd);
        c->fd = -1;
        return errf(err, errlen, "a stream reply was not chunked");
    }
    c->ev_len = 0;
    int done = 0;
    for (;;) {
        if (s_line(c, line, sizeof line) != 0)
            break;
        long size = strtol(line, NULL, 16);
        if (size == 0) {                  /* the last chunk, then the (empty) trailer */
            s_line(c, line, sizeof line);
            return done ? 0 : errf(err, errlen, "the stream ended without [DONE]");
        }
        while (size > 0) {
            if (c->r == c->w && s_fill(c) != 0)
                goto broken;
            size_t take = c->w - c->r < (size_t)size ? c->w - c->r : (size_t)size;
            int rc = s_events(c, c->buf + c->r, take, fn, arg);
            c->r += take;
            size -= (long)take;
            if (rc < 0)
                goto broken;
            done |= rc == 1;
        }
        if (s_line(c, line, sizeof line) != 0)   /* the CRLF after the chunk */
            break;
    }
broken:
    close(c->fd);
    c->fd = -1;
    return errf(err, errlen, "the stream broke off");
}
