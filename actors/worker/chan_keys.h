/* actors/worker/chan_keys.h — the CURVE keys a worker's KV hand-off channel uses across machines
 * (transfer/tcp_chan.h): when the cluster has keys, the tcp channel's sender is a CURVE server
 * with this actor's own keypair and serves a transfer only to the decode worker it is for; its
 * receiver is a CURVE client with this actor's keypair and takes the sender's public key from the
 * topology's key files (security.curve_keys_dir, default <run_dir>/keys), by the instance the
 * hand-off names. Without keys, nothing changes: plaintext. */
#ifndef TROUPE_ACTORS_WORKER_CHAN_KEYS_H
#define TROUPE_ACTORS_WORKER_CHAN_KEYS_H

#include <stddef.h>

#include "actors/runtime/actor.h"
#include "transfer/kv_chan.h"

typedef struct chan_keys {
    char pub[48], sec[48];       /* Z85, NUL-terminated */
    const topo_t *topo;
} chan_keys_t;

/* With CURVE in force (the topology has server keys): reads this actor's keypair into *k and points
 * cfg's curve fields at it (k must outlive the channel). Without: leaves cfg plaintext. -1 with why
 * when the keys cannot be read. */
int chan_keys_fill(actor_t *a, chan_keys_t *k, kvchan_cfg_t *cfg, char *err, size_t errlen);

#endif
