/* actors/runtime/auth.c — key files, CURVE socket options and the ZAP handler (see auth.h). */
#include "actors/runtime/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"
#include "common/util.h"

#define ZAP_ENDPOINT  "inproc://zeromq.zap.01"
#define DOMAIN_MAX    32
#define USER_MAX      64
#define ZAP_FRAMES    8                 /* version, id, domain, address, identity, mechanism, credentials */
#define MAX_WATCHED   8

typedef struct allowed {
    char domain[DOMAIN_MAX];
    uint8_t key[32];                    /* binary public key */
    char user[USER_MAX];                /* the User-Id ZeroMQ attaches to the connection's messages */
} allowed_t;

struct auth {
    void *ctx;
    void *rep;                          /* REP bound at ZAP_ENDPOINT; owned by the thread once started */
    allowed_t *keys;                    /* [n_keys], fixed once started */
    int n_keys, cap_keys;
    pthread_t thread;
    int started;
    _Atomic int stop;
    _Atomic uint64_t refused;
    pthread_mutex_t lock;               /* guards the watched sockets' list (added after start) */
    void *watch[MAX_WATCHED];           /* PAIRs receiving socket-monitor events; used by the thread */
    char watch_what[MAX_WATCHED][32];
    int n_watch;
};

int auth_curve_available(void) { return zmq_has("curve"); }

/* ---- key files ------------------------------------------------------------------------------ */

/* The next key-looking line of f (comments and blank lines skipped) into z85; 1 found, 0 at end,
 * -1 on a malformed line (err says which). */
static int s_next_key(FILE *f, const char *path, int *line, char *z85, char *err, size_t errlen)
{
    char buf[256];
    while (fgets(buf, sizeof buf, f)) {
        (*line)++;
        size_t n = strcspn(buf, "\r\n");
        buf[n] = 0;
        while (n && (buf[n - 1] == ' ' || buf[n - 1] == '\t'))
            buf[--n] = 0;
        if (n == 0 || buf[0] == '#')
            continue;
        uint8_t bin[32];
        if (n != AUTH_Z85_LEN || !zmq_z85_decode(bin, buf))
            return errf(err, errlen, "%s:%d: not a Z85 CURVE key (40 characters, as zmq_curve_keypair writes)",
                        path, *line);
        memcpy(z85, buf, AUTH_Z85_LEN + 1);
        return 1;
    }
    return 0;
}

int auth_key_read(const char *path, char *z85, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errf(err, errlen, "%s: %s", path, strerror(errno));
    int line = 0, rc = s_next_key(f, path, &line, z85, err, errlen);
    fclose(f);
    if (rc == 0)
        return errf(err, errlen, "%s: no key in the file", path);
    return rc == 1 ? 0 : -1;
}

static int s_write_key(const char *path, const char *z85, char *err, size_t errlen)
{
    unlink(path);   /* O_EXCL below: never write a secret into a file someone else made */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return errf(err, errlen, "%s: %s", path, strerror(errno));
    char line[AUTH_Z85_LEN + 2];
    int n = snprintf(line, sizeof line, "%s\n", z85);
    int ok = write(fd, line, (size_t)n) == n;
    if (close(fd) != 0)
        ok = 0;
    return ok ? 0 : errf(err, errlen, "%s: write failed", path);
}

int auth_keypair_write(const char *pub_path, const char *sec_path, const auth_keypair_t *kp, char *err,
                       size_t errlen)
{
    return s_write_key(sec_path, kp->sec, err, errlen) != 0 || s_write_key(pub_path, kp->pub, err, errlen) != 0 ? -1 : 0;
}

int auth_keypair_generate(const char *pub_path, const char *sec_path, auth_keypair_t *out, char *err,
                          size_t errlen)
{
    auth_keypair_t kp;
    if (zmq_curve_keypair(kp.pub, kp.sec) != 0)
        return errf(err, errlen, "zmq_curve_keypair: %s", zmq_strerror(errno));
    if (auth_keypair_write(pub_path, sec_path, &kp, err, errlen) != 0)
        return -1;
    if (out)
        *out = kp;
    return 0;
}

/* ---- socket options ------------------------------------------------------------------------- */

int auth_server(void *sock, const auth_keypair_t *kp, const char *domain)
{
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kp->sec, AUTH_Z85_LEN) != 0)
        return -1;
    return 0;
}

int auth_client(void *sock, const auth_keypair_t *kp, const char *server_pub)
{
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_pub, AUTH_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, kp->pub, AUTH_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kp->sec, AUTH_Z85_LEN) != 0)
        return -1;
    return 0;
}

/* ---- the ZAP handler ------------------------------------------------------------------------ */

auth_t *auth_new(void *ctx, char *err, size_t errlen)
{
    auth_t *au = calloc(1, sizeof *au);
    if (!au)
        return errf(err, errlen, "out of memory"), NULL;
    au->ctx = ctx;
    pthread_mutex_init(&au->lock, NULL);
    au->rep = zmq_socket(ctx, ZMQ_REP);
    int linger = 0;
    if (au->rep)
        zmq_setsockopt(au->rep, ZMQ_LINGER, &linger, sizeof linger);
    if (!au->rep || zmq_bind(au->rep, ZAP_ENDPOINT) != 0) {
        errf(err, errlen, "ZAP handler %s: %s", ZAP_ENDPOINT, zmq_strerror(errno));
        auth_destroy(&au);
        return NULL;
    }
    return au;
}

int auth_allow(auth_t *au, const char *domain, const char *pub_z85, const char *user_id)
{
    if (au->started || strlen(domain) >= DOMAIN_MAX || strlen(user_id) >= USER_MAX ||
        strlen(pub_z85) != AUTH_Z85_LEN)
        return -1;
    if (au->n_keys == au->cap_keys) {
        int cap = au->cap_keys ? au->cap_keys * 2 : 64;
        allowed_t *k = realloc(au->keys, (size_t)cap * sizeof *k);
        if (!k)
            return -1;
        au->keys = k;
        au->cap_keys = cap;
    }
    allowed_t *k = &au->keys[au->n_keys];
    if (!zmq_z85_decode(k->key, pub_z85))
        return -1;
    snprintf(k->domain, sizeof k->domain, "%s", domain);
    snprintf(k->user, sizeof k->user, "%s", user_id);
    au->n_keys++;
    return 0;
}

int auth_allow_file(auth_t *au, const char *domain, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errf(err, errlen, "%s: %s", path, strerror(errno));
    int line = 0, n = 0, rc;
    char z85[AUTH_Z85_LEN + 1], user[USER_MAX];
    while ((rc = s_next_key(f, path, &line, z85, err, errlen)) == 1) {
        snprintf(user, sizeof user, "client:%s", z85);   /* the whole key: a cancel is scoped by it */
        if (auth_allow(au, domain, z85, user) != 0) {
            rc = errf(err, errlen, "%s:%d: cannot add the key", path, line);
            break;
        }
        n++;
    }
    fclose(f);
    return rc < 0 ? -1 : n;
}

static const allowed_t *s_lookup(const auth_t *au, const char *domain, size_t dlen, const uint8_t *key)
{
    for (int i = 0; i < au->n_keys; i++) {
        const allowed_t *k = &au->keys[i];
        if (strlen(k->domain) == dlen && memcmp(k->domain, domain, dlen) == 0 && memcmp(k->key, key, 32) == 0)
            return k;
    }
    return NULL;
}

static void s_refused(auth_t *au, const char *what, const char *addr, const char *why);

/* Answers one ZAP request already received as frames f[0..n). */
static void s_answer(auth_t *au, zmq_msg_t *f, int n)
{
    const char *status = "400", *text = "not allowed", *user = "";
    const allowed_t *k = NULL;
    if (n >= 7 && zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
        zmq_msg_size(&f[6]) == 32)
        k = s_lookup(au, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), zmq_msg_data(&f[6]));
    if (k) {
        status = "200";
        text = "OK";
        user = k->user;
    } else {
        char z85[AUTH_Z85_LEN + 1] = "(none)", addr[128], what[64], why[128];
        if (n >= 7 && zmq_msg_size(&f[6]) == 32)
            zmq_z85_encode(z85, zmq_msg_data(&f[6]), 32);
        snprintf(addr, sizeof addr, "%.*s", n >= 4 ? (int)zmq_msg_size(&f[3]) : 0,
                 n >= 4 ? (const char *)zmq_msg_data(&f[3]) : "");
        snprintf(what, sizeof what, "'%.*s' domain", n >= 3 ? (int)zmq_msg_size(&f[2]) : 0,
                 n >= 3 ? (const char *)zmq_msg_data(&f[2]) : "");
        snprintf(why, sizeof why, "CURVE key %s is not allowed", z85);
        s_refused(au, what, addr, why);
    }
    const void *parts[6] = {"1.0", n >= 2 ? zmq_msg_data(&f[1]) : "", status, text, user, ""};
    size_t lens[6] = {3, n >= 2 ? zmq_msg_size(&f[1]) : 0, 3, strlen(text), strlen(user), 0};
    for (int i = 0; i < 6; i++)
        zmq_send(au->rep, parts[i], lens[i], i < 5 ? ZMQ_SNDMORE : 0);
}

static void s_refused(auth_t *au, const char *what, const char *addr, const char *why)
{
    uint64_t nref = atomic_fetch_add(&au->refused, 1) + 1;
    if (nref <= 10 || nref % 100 == 0)
        LOG_W("refused a connection from %s to the %s: %s (%llu refused)", addr, what, why, (unsigned long long)nref);
}

/* Socket-monitor events of a watched socket: frame 1 = u16 event + u32 value, frame 2 = the
 * peer's endpoint. */
static void s_read_watch(auth_t *au, void *pair, const char *what)
{
    uint8_t ev[6];
    char addr[256];
    while (zmq_recv(pair, ev, sizeof ev, ZMQ_DONTWAIT) >= 0) {
        int n = zmq_recv(pair, addr, sizeof addr - 1, ZMQ_DONTWAIT);
        addr[n > 0 ? (n < (int)sizeof addr - 1 ? n : (int)sizeof addr - 1) : 0] = 0;
        uint16_t e;
        memcpy(&e, ev, 2);
        s_refused(au, what, addr, e == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "not a CURVE handshake for this server"
                                                                          : "the handshake failed");
    }
}

int auth_watch(auth_t *au, void *sock, const char *what)
{
    char ep[64];
    pthread_mutex_lock(&au->lock);
    int i = au->n_watch;
    pthread_mutex_unlock(&au->lock);
    if (i >= MAX_WATCHED)
        return -1;
    snprintf(ep, sizeof ep, "inproc://auth-watch-%p", sock);
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0)
        return -1;
    void *pair = zmq_socket(au->ctx, ZMQ_PAIR);
    int linger = 0;
    if (!pair || zmq_setsockopt(pair, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(pair, ep) != 0) {
        if (pair)
            zmq_close(pair);
        zmq_socket_monitor(sock, NULL, 0);
        return -1;
    }
    pthread_mutex_lock(&au->lock);
    au->watch[i] = pair;   /* handed to the thread: the lock orders it */
    snprintf(au->watch_what[i], sizeof au->watch_what[i], "%s", what);
    au->n_watch = i + 1;
    pthread_mutex_unlock(&au->lock);
    return 0;
}

static void *s_main(void *arg)
{
    auth_t *au = arg;
    while (!atomic_load(&au->stop)) {
        zmq_pollitem_t items[1 + MAX_WATCHED] = {{.socket = au->rep, .events = ZMQ_POLLIN}};
        pthread_mutex_lock(&au->lock);
        int nw = au->n_watch;
        for (int i = 0; i < nw; i++)
            items[1 + i] = (zmq_pollitem_t){.socket = au->watch[i], .events = ZMQ_POLLIN};
        pthread_mutex_unlock(&au->lock);
        if (zmq_poll(items, 1 + nw, 100) <= 0)
            continue;
        for (int i = 0; i < nw; i++)
            if (items[1 + i].revents & ZMQ_POLLIN)
                s_read_watch(au, au->watch[i], au->watch_what[i]);
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        zmq_msg_t f[ZAP_FRAMES];
        int n = 0, more = 1;
        while (more) {
            zmq_msg_t part;
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, au->rep, 0) < 0) {
                zmq_msg_close(&part);
                break;
            }
            more = zmq_msg_more(&part);
            if (n < ZAP_FRAMES) {
                zmq_msg_init(&f[n]);
                zmq_msg_move(&f[n++], &part);
            }
            zmq_msg_close(&part);
        }
        s_answer(au, f, n);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
    return NULL;
}

int auth_start(auth_t *au, char *err, size_t errlen)
{
    if (au->started)
        return 0;
    if (pthread_create(&au->thread, NULL, s_main, au) != 0)
        return errf(err, errlen, "cannot start the ZAP handler thread");
    au->started = 1;
    return 0;
}

uint64_t auth_refused(const auth_t *au) { return au ? atomic_load(&au->refused) : 0; }

void auth_destroy(auth_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    auth_t *au = *self_p;
    if (au->started) {
        atomic_store(&au->stop, 1);
        pthread_join(au->thread, NULL);
    }
    if (au->rep)
        zmq_close(au->rep);
    for (int i = 0; i < au->n_watch; i++)
        zmq_close(au->watch[i]);
    pthread_mutex_destroy(&au->lock);
    free(au->keys);
    free(au);
    *self_p = NULL;
}
