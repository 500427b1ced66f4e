/* actors/worker/chan_keys.c — see chan_keys.h. */
#include "actors/worker/chan_keys.h"

#include <string.h>

#include "actors/runtime/auth.h"
#include "common/util.h"
#include "topology/topology.h"

/* kvchan_cfg_t.peer_key: an instance's public key from its .pub file. */
static int s_peer_key(void *ctx, const char *instance, char *z85, char *err, size_t errlen)
{
    const chan_keys_t *k = ctx;
    if (!topo_find(k->topo, instance))
        return errf(err, errlen, "tcp hand-off from %s, which the topology does not name", instance);
    if (actor_public_key(k->topo, instance, z85, err, errlen) != 0)
        return -1;
    return 0;
}

int chan_keys_fill(actor_t *a, chan_keys_t *k, kvchan_cfg_t *cfg, char *err, size_t errlen)
{
    const topo_t *t = actor_topo(a);
    memset(k, 0, sizeof *k);
    k->topo = t;
    if (!t->security.curve_server_public[0])
        return 0;
    char pub[TOPO_PATH_MAX + 128], sec[TOPO_PATH_MAX + 128];
    if (actor_key_paths(t, actor_self(a)->name, pub, sec, sizeof pub) != 0 ||
        auth_key_read(pub, k->pub, err, errlen) != 0 || auth_key_read(sec, k->sec, err, errlen) != 0)
        return -1;
    cfg->curve_public = k->pub;
    cfg->curve_secret = k->sec;
    cfg->peer_key = s_peer_key;
    cfg->peer_key_ctx = k;
    return 0;
}
