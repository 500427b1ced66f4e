/* transfer/tcp_chan.h — the network channel: KV blocks between processes on different machines, over
 * ZeroMQ on TCP (CPU workers on two nodes, or GPU workers whose NCCL link is not up).
 *
 * Pull, not push: the sender stages a transfer's bytes (the blocks copied out of its pool) and names
 * its own endpoint in the transfer description; the receiver, when it takes the hand-off, asks for
 * the transfer by id and waits for the reply with a deadline. So the bytes never arrive before the
 * receiver wants them (nothing to pair up), and a dead or stalled sender costs the receiver its
 * deadline, never a hang.
 *
 *   sender    tcpchan_server_new binds a ROUTER at tcp://<its node's address>:<ephemeral port> and
 *             serves it from a thread of its own (replies go out while the actor's loop runs a
 *             forward); tcpchan_put stages a buffer under a transfer id, tcpchan_drop forgets it
 *             (on the kv_ack, or past the transfer's deadline).
 *   receiver  tcpchan_fetch sends the 8-byte transfer id on a DEALER connected to the sender's
 *             endpoint (one per endpoint, kept) and waits for [header][bytes].
 * Wire: request = transfer id (u64 LE); reply = header (transfer id u64 LE, status u32 LE: 0 found,
 * 1 unknown, 2 refused to this peer, total bytes u64 LE: 20 bytes) then, when found, one frame of
 * exactly those bytes.
 *
 * CURVE (docs/security.md), when the cluster has keys: the sender's ROUTER is a CURVE server with
 * the sender actor's own keypair and ZAP domain "cluster" (the process's ZAP handler admits only the
 * cluster's actors' keys and names each connection by its instance); the receiver's DEALER is a
 * CURVE client with its own actor's keypair and the sender's public key, which it takes from the
 * topology's key files for the instance the hand-off names as its source, never from the
 * description. So the bytes are encrypted and authenticated on the wire (a tampered or corrupt frame
 * fails CURVE's MAC: libzmq drops the connection and the fetch fails with why, never returning the
 * bytes), only the intended receiver gets a transfer (one staged for decode-0 is refused, status 2,
 * to any other key), and only the real sender can answer (a peer without the sender's secret key
 * fails the handshake). A failed handshake, a key the other end refuses or a connection cut
 * mid-transfer ends the fetch at once with a reason (a socket monitor), not at its deadline.
 *
 * Known limits: a transfer travels as one ZeroMQ message (copied once into it by the server); a
 * receiver that gives up on a transfer closes its socket to that sender, so a late reply can never
 * be taken for the next one. */
#ifndef TROUPE_TCP_CHAN_H
#define TROUPE_TCP_CHAN_H

#include <stddef.h>
#include <stdint.h>

#define TCPCHAN_ENDPOINT_MAX 128
#define TCPCHAN_HEADER_BYTES 20

typedef struct tcpchan_server tcpchan_server_t;
typedef struct tcpchan_client tcpchan_client_t;

/* Binds tcp://host:* (host: an address or interface of this node) and starts the serving thread.
 * NULL with why. Plaintext. */
tcpchan_server_t *tcpchan_server_new(void *zmq_ctx, const char *host, char *err, size_t errlen);
/* The same as a CURVE server with our secret key (Z85; NULL: plaintext), ZAP domain "cluster": a
 * ZAP handler must run in zmq_ctx (the actor's), which admits and names the receivers. */
tcpchan_server_t *tcpchan_server_new_curve(void *zmq_ctx, const char *host, const char *secret_z85, char *err,
                                           size_t errlen);
/* Stops the thread, closes the socket, frees every staged buffer. Idempotent; nulls the pointer. */
void tcpchan_server_destroy(tcpchan_server_t **self_p);
/* "tcp://host:port", where receivers connect. */
const char *tcpchan_server_endpoint(const tcpchan_server_t *s);
/* Stages *buf_p (malloc'd, n bytes; ownership taken, *buf_p nulled) as transfer `id`. -1 when the
 * id is staged already or the table is full (the buffer is then freed). */
int tcpchan_put(tcpchan_server_t *s, uint64_t id, uint8_t **buf_p, size_t n);
/* The same, served only to `receiver` (a CURVE server: the ZAP handler's name for the fetching
 * key, i.e. the receiving instance; NULL: anyone). Others are answered status 2 (refused). */
int tcpchan_put_for(tcpchan_server_t *s, uint64_t id, uint8_t **buf_p, size_t n, const char *receiver);
/* Frees transfer id's buffer (no-op when unknown). A request for it is then answered `unknown`. */
void tcpchan_drop(tcpchan_server_t *s, uint64_t id);
/* Transfers staged now; requests served since the start. */
int tcpchan_staged(tcpchan_server_t *s);
uint64_t tcpchan_served(tcpchan_server_t *s);
/* Requests refused since the start: a transfer staged for another receiver. */
uint64_t tcpchan_refused(tcpchan_server_t *s);

/* max_bytes: the largest transfer this receiver accepts (its pool's size): a frame beyond it is
 * refused by ZeroMQ before it is allocated. */
tcpchan_client_t *tcpchan_client_new(void *zmq_ctx, int64_t max_bytes);
/* Our CURVE keypair (Z85, copied) for fetches that name a server key. -1 on a malformed key. */
int tcpchan_client_curve(tcpchan_client_t *c, const char *public_z85, const char *secret_z85);
void tcpchan_client_destroy(tcpchan_client_t **self_p);
/* Fetches transfer id (exactly n bytes) from endpoint into dst, waiting until deadline_ms (now_ms
 * clock) at most. -1 with why: a malformed endpoint, no reply in time (the sender is gone or
 * stalled), the sender no longer has it, or a size that is not n. */
int tcpchan_fetch(tcpchan_client_t *c, const char *endpoint, uint64_t id, void *dst, size_t n, int64_t deadline_ms,
                  char *err, size_t errlen);
/* The same over CURVE when server_z85 (the sender's public key, Z85) is given (needs
 * tcpchan_client_curve first); NULL: plaintext. Also -1 with why when the handshake fails (not the
 * sender's key, or our key refused), the sender refuses the transfer to us, or the connection is
 * cut mid-transfer (a frame that fails CURVE's authentication closes it). */
int tcpchan_fetch_from(tcpchan_client_t *c, const char *endpoint, const char *server_z85, uint64_t id, void *dst,
                       size_t n, int64_t deadline_ms, char *err, size_t errlen);

/* 0 when endpoint is "tcp://<host>:<port>" with printable host and a decimal port, and (host not
 * NULL) its host is `host`. */
int tcpchan_endpoint_check(const char *endpoint, const char *host, char *err, size_t errlen);

#endif
