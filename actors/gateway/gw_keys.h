/* actors/gateway/gw_keys.h — the gateway's API keys: bearer token -> tenant and rate limits.
 *
 * Built from the topology's gateway.api_keys. With no keys the API is open (gw_keys_open).
 * Look-ups compare every key in constant time per byte, so the time taken does not tell how
 * much of a guessed key was right. Not thread-safe: the gateway guards it with one lock. */
#ifndef TROUPE_GW_KEYS_H
#define TROUPE_GW_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "actors/gateway/gw_limit.h"
#include "topology/topology.h"

typedef struct gw_key {
    const topo_api_key_t *cfg;   /* the topology's entry (key, tenant, limits) */
    gw_bucket_t requests;        /* requests_per_minute */
    gw_bucket_t tokens;          /* tokens_per_minute */
    uint64_t n_requests, n_limited; /* admitted / refused with 429 */
} gw_key_t;

typedef struct gw_keys {
    gw_key_t *keys;              /* [n] */
    int n;
} gw_keys_t;

int gw_keys_init(gw_keys_t *k, const topo_gateway_t *g, int64_t now_ms);
void gw_keys_free(gw_keys_t *k);
/* 1 when no keys are configured: every request is let in without a tenant. */
int gw_keys_open(const gw_keys_t *k);

/* The token of an Authorization header value ("Bearer sk-..."; the scheme is case-insensitive,
 * spaces around the token are ignored). NULL when the header is absent or not a bearer token;
 * else a pointer into value with *len set. */
const char *gw_bearer(const char *value, size_t *len);
/* The key entry whose key equals token[0..len), or NULL. */
gw_key_t *gw_keys_find(gw_keys_t *k, const char *token, size_t len);

#endif
