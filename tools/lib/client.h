/* tools/lib/client.h — the C client library: talk to a Troupe cluster over ZeroMQ.
 *
 * One DEALER socket to the router's client endpoint (or the monitor's inspection endpoint); with
 * several routers (a topology's endpoints.clients), one to each, the endpoints given
 * comma-separated ("tcp://h:5555,tcp://h:5557"; client_endpoints_from_topology writes them so).
 * A cluster with CURVE keys (docs/security.md) needs the server's public key and a keypair of
 * ours whose public key is in its allow-list: client_opts_t, or for client_connect the
 * environment (TROUPE_CURVE_SERVER_KEY = the server's .pub file, TROUPE_CURVE_KEY = our key
 * files' prefix: PREFIX.pub and PREFIX.key).
 * Requests are msg_t values (messages/msg.h); replies come back as decoded msg_t. Every call is
 * bounded by a timeout: nothing here can hang on a dead cluster.
 *
 * Liveness: the socket sends ZMTP heartbeats (libzmq answers them at the router, in its I/O
 * thread) and watches its own connection (a socket monitor). When the connection is lost (the
 * router died, or did not answer heartbeats for heartbeat_timeout_ms: stopped, wedged, cut off),
 * every request still in flight on this client ends, exactly once, with an `error` from
 * client_recv: code unavailable, retryable, "the connection to the router at EP was lost: the
 * request's outcome is unknown". Replies that come later for such a request are dropped. ZeroMQ
 * reconnects by itself, so new requests go to the restarted router. A request is in flight from
 * client_send (any type but cancel) until its done, error or inspect_reply is received.
 *
 * Failover, with several routers: new requests go to the first router until its connection is
 * lost, then to the next whose connection is up. When a router's connection is lost, each of its
 * submits that has had no reply yet (no token: it has not streamed) is sent again, unchanged (its
 * id too), to the next router whose connection is up, and ends there: it is not lost, and counts
 * in client_requests_retried. One that has streamed ends with the error above (its tokens came
 * from a generation that cannot go on elsewhere); so does every request when no other router's
 * connection is up, or after CLIENT_MAX_RESUBMITS moves. Either way one terminal reply each.
 * A caller that has shown nothing of such a request's tokens to anyone (the gateway's non-streamed
 * calls) may start it again: client_send of the same submit, same id, after its error; the
 * request is then the new send's, and a late reply from the router it was lost with is dropped.
 * A reply for a moved request from a router it has left is dropped, unless it moved back there.
 * A cancel goes to the router that holds the request. Known limit: a router that is down when the client starts (no
 * connection ever made) is not failed over from: its requests wait for it (ZeroMQ queues them)
 * until their timeout or until it comes up; the supervisor restarts a router within seconds.
 *
 *     client_t *c = client_connect("tcp://127.0.0.1:5555", err, sizeof err);
 *     msg_t m; msg_init(&m, MSG_SUBMIT, 0); m.u.submit.prompt = "Hello"; m.u.submit.stream = true;
 *     uint64_t id; client_send(c, &m, &id, err, sizeof err);
 *     msg_t r; while (client_recv(c, &r, 30000, err, sizeof err) == 0) { ...; if terminal break; msg_free(&r); }
 */
#ifndef TROUPE_CLIENT_H
#define TROUPE_CLIENT_H

#include <stdint.h>

#include "messages/msg.h"

typedef struct client client_t;

typedef struct client_opts {
    const char *server_key;     /* file with the server's public key (Z85); NULL = no CURVE */
    const char *key;            /* our keypair's prefix: key.pub and key.key; needed with server_key */
    int64_t max_frame;          /* the cluster's limits.max_message_bytes: larger requests are refused
                                   here, before sending; 0 = MSG_MAX_FRAME */
    int heartbeat_ivl_ms;       /* a ZMTP PING this often; 0 = CLIENT_HEARTBEAT_IVL_MS, < 0 = no heartbeats
                                   (a dead peer is then noticed only when its connection closes) */
    int heartbeat_timeout_ms;   /* no traffic for this long after a PING: the connection is lost;
                                   0 = CLIENT_HEARTBEAT_TIMEOUT_MS */
    /* Called for each router's socket after the options above, before it connects: a caller's own
     * (an actor's limits, its CURVE keypair, ZMQ_IMMEDIATE and ZMQ_SNDTIMEO 0 so that no send
     * waits: the gateway). 0, or -1 to fail client_connect_opts. NULL = none. */
    int (*sock_setup)(void *sock, void *arg);
    void *sock_setup_arg;
} client_opts_t;

#define CLIENT_HEARTBEAT_IVL_MS     1000
#define CLIENT_HEARTBEAT_TIMEOUT_MS 3000
#define CLIENT_ROUTERS_MAX          8      /* endpoints one client connects to */
#define CLIENT_MAX_RESUBMITS        3      /* a request that has not streamed moves at most this often */

/* endpoints: one, or several comma-separated (one a router, at most CLIENT_ROUTERS_MAX). */
client_t *client_connect(const char *endpoints, char *err, size_t errlen);
client_t *client_connect_opts(const char *endpoints, const client_opts_t *opts, char *err, size_t errlen);
void client_destroy(client_t **self_p);

/* Sends m. If m->id is 0 a fresh id is assigned (random 63-bit); it is returned in *id_out.
 * A request the active router's connection cannot take (EAGAIN: its queue is full, or with
 * ZMQ_IMMEDIATE no connection is up) goes to the next router whose connection is up.
 * 0; -1 when no router took it (err says why); -2 when m itself was refused before sending (it
 * does not encode, or is larger than the cluster's limit: sending it again cannot help). */
int client_send(client_t *c, msg_t *m, uint64_t *id_out, char *err, size_t errlen);
/* Waits up to timeout_ms for the next message. 0 with *out decoded (msg_free it); 1 on timeout;
 * -1 on a receive or decode error (err says which). After a lost connection, *out is the
 * synthesized error of one request that was in flight (one per call, each request once). */
int client_recv(client_t *c, msg_t *out, int timeout_ms, char *err, size_t errlen);
/* For a caller's own event loop (the gateway's actor loop): the descriptors (ZMQ_FD) of every
 * socket of c, at most cap; returns how many. One becoming readable means client_recv may have
 * something: call client_recv(c, &m, 0, ...) until it returns 1. They are edge-triggered (libzmq):
 * a loop that stops reading before that must come round again without waiting on them. */
int client_fds(const client_t *c, int *fds, int cap);
/* Waits up to timeout_ms until a connection to one of the routers has completed its handshake
 * (now or before). 1 once one has; 0 when none did in time: nothing listens at the endpoints (the
 * cluster is not running, or they are not its), or a CURVE server refused our keys. A request sent
 * meanwhile is not lost: ZeroMQ queues it for the connection. */
int client_wait_connected(client_t *c, int timeout_ms);
/* Sends a cancel for request id. */
int client_cancel(client_t *c, uint64_t id, char *err, size_t errlen);
/* One request, one reply with the same id (other messages are skipped): for inspect. */
int client_call(client_t *c, msg_t *req, msg_t *reply, int timeout_ms, char *err, size_t errlen);

/* How many requests ended with the synthesized lost-connection error, and how many connection
 * losses were seen, since client_connect. */
uint64_t client_requests_lost(const client_t *c);
uint64_t client_connections_lost(const client_t *c);
/* How many times a request was sent again to another router after its router's connection was lost. */
uint64_t client_requests_retried(const client_t *c);

/* "5m" -> 300, "1h" -> 3600, "90" / "90s" -> 90, "2d" -> 172800. -1 on junk or overflow. */
int64_t client_parse_duration_s(const char *s);

/* From a topology file (NULL = embedded default): max_frame, the heartbeats where o has none set
 * (supervision.client_heartbeat_ms / client_heartbeat_timeout_ms) and, when it has CURVE keys, the
 * server key file (server_key gets "" otherwise). */
int client_opts_from_topology(const char *topology_path, client_opts_t *o, char *server_key, size_t cap,
                              char *err, size_t errlen);

/* The client endpoints (every router's, comma-separated) or the inspection endpoint of a topology
 * file (NULL = embedded default). */
int client_endpoints_from_topology(const char *topology_path, char *client_ep, char *inspect_ep,
                                   size_t cap, char *err, size_t errlen);

/* The same from a topology already loaded (an actor's): max_frame and the heartbeats (no CURVE:
 * an actor uses its own keypair, through sock_setup), and every router's client endpoint. */
struct topo;
void client_opts_from_topo(const struct topo *t, client_opts_t *o);
int client_endpoints_of_topo(const struct topo *t, char *client_ep, size_t cap, char *err, size_t errlen);

#endif
