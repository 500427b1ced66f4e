/* actors/runtime/auth.h — CURVE keys and the ZAP handler that says who may connect.
 *
 * CURVE alone only proves the server's identity to a client: any client keypair gets in unless
 * a ZAP handler (RFC 27, served on inproc://zeromq.zap.01 of the socket's context) checks the
 * client's public key. This module is that handler: a thread answering ZAP requests from a
 * table of allowed keys per ZAP domain, each mapped to the user id ZeroMQ then attaches to every
 * message from that connection (zmq_msg_gets(msg, "User-Id")) — so a peer's identity comes from
 * its authenticated key, not from the routing id it claims.
 *
 * Key files hold one Z85-encoded key (40 characters, as zmq_curve_keypair writes them) and an
 * optional newline; lines starting with '#' are skipped. An allow-list file holds one public key
 * per line. Secret key files are written 0600.
 *
 * Known limits: a ZAP handler belongs to one ZeroMQ context; a process with several contexts
 * needs one each. Refusals are logged for the first few and then every 100th (a flood of bad
 * handshakes must not flood the log); all are counted. */
#ifndef TROUPE_AUTH_H
#define TROUPE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define AUTH_Z85_LEN 40                 /* a Z85 key's characters, without the NUL */

typedef struct auth_keypair {
    char pub[AUTH_Z85_LEN + 1];         /* Z85, NUL-terminated */
    char sec[AUTH_Z85_LEN + 1];         /* Z85, NUL-terminated; "" when only the public key is known */
} auth_keypair_t;

/* 1 if this libzmq was built with CURVE. */
int auth_curve_available(void);

/* Reads the one key of a key file into z85 (AUTH_Z85_LEN + 1 bytes). -1 with the file and reason. */
int auth_key_read(const char *path, char *z85, char *err, size_t errlen);
/* kp written to pub_path and sec_path (both 0600, replaced if present). */
int auth_keypair_write(const char *pub_path, const char *sec_path, const auth_keypair_t *kp, char *err,
                       size_t errlen);
/* A new keypair written to pub_path and sec_path (both 0600, replaced if present). */
int auth_keypair_generate(const char *pub_path, const char *sec_path, auth_keypair_t *out, char *err,
                          size_t errlen);

/* Makes sock a CURVE server with kp whose clients are checked in ZAP domain `domain`. Call before
 * bind. */
int auth_server(void *sock, const auth_keypair_t *kp, const char *domain);
/* Makes sock a CURVE client with kp, talking to the server whose public key is server_pub (Z85).
 * Call before connect. */
int auth_client(void *sock, const auth_keypair_t *kp, const char *server_pub);

typedef struct auth auth_t;

/* A ZAP handler for context ctx, with an empty allow table. NULL with err when inproc://zeromq.zap.01
 * is taken (one handler per context) or memory runs out. Start it before binding server sockets. */
auth_t *auth_new(void *ctx, char *err, size_t errlen);
/* Lets the holder of public key pub_z85 into domain as user_id (at most 63 bytes). Before
 * auth_start only. -1 on a malformed key. */
int auth_allow(auth_t *au, const char *domain, const char *pub_z85, const char *user_id);
/* Every key of an allow-list file into domain, each as user id "client:<first 8 characters of the
 * key>". The number of keys, or -1 with the file, line and reason. */
int auth_allow_file(auth_t *au, const char *domain, const char *path, char *err, size_t errlen);
/* Starts answering ZAP requests (a thread). */
int auth_start(auth_t *au, char *err, size_t errlen);
/* Also counts (and logs) the failed handshakes of a server socket that never reach ZAP: a
 * plaintext peer, or one that does not know the server key. Call from the socket's thread,
 * before bind; at most 8 sockets. */
int auth_watch(auth_t *au, void *sock, const char *what);
/* Handshakes refused so far, by ZAP or failed on a watched socket (any thread may read it). */
uint64_t auth_refused(const auth_t *au);
/* Stops the thread and closes its socket; call before zmq_ctx_term. */
void auth_destroy(auth_t **self_p);

#endif
