#include "actors/gateway/gw_keys.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

int gw_keys_init(gw_keys_t *k, const topo_gateway_t *g, int64_t now_ms)
{
    k->n = 0;
    k->keys = NULL;
    if (g->n_keys == 0)
        return 0;
    k->keys = calloc((size_t)g->n_keys, sizeof *k->keys);
    if (!k->keys)
        return -1;
    for (int i = 0; i < g->n_keys; i++) {
        k->keys[i].cfg = &g->keys[i];
        gw_bucket_init(&k->keys[i].requests, g->keys[i].requests_per_minute, now_ms);
        gw_bucket_init(&k->keys[i].tokens, g->keys[i].tokens_per_minute, now_ms);
    }
    k->n = g->n_keys;
    return 0;
}

void gw_keys_free(gw_keys_t *k)
{
    free(k->keys);
    k->keys = NULL;
    k->n = 0;
}

int gw_keys_open(const gw_keys_t *k) { return k->n == 0; }

const char *gw_bearer(const char *value, size_t *len)
{
    if (!value)
        return NULL;
    while (*value == ' ' || *value == '\t')
        value++;
    if (strncasecmp(value, "bearer", 6) != 0 || (value[6] != ' ' && value[6] != '\t'))
        return NULL;
    const char *t = value + 6;
    while (*t == ' ' || *t == '\t')
        t++;
    size_t n = strlen(t);
    while (n && (t[n - 1] == ' ' || t[n - 1] == '\t'))
        n--;
    if (!n)
        return NULL;
    *len = n;
    return t;
}

/* Equality without an early exit on the first differing byte. */
static int s_equal(const char *a, size_t an, const char *b, size_t bn)
{
    unsigned diff = (unsigned)(an ^ bn);
    for (size_t i = 0; i < an; i++)
        diff |= (unsigned char)a[i] ^ (unsigned char)(i < bn ? b[i] : 0);
    return diff == 0;
}

gw_key_t *gw_keys_find(gw_keys_t *k, const char *token, size_t len)
{
    gw_key_t *hit = NULL;
    for (int i = 0; i < k->n; i++)
        if (s_equal(k->keys[i].cfg->key, strlen(k->keys[i].cfg->key), token, len) && !hit)
            hit = &k->keys[i];
    return hit;
}
