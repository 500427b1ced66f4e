/* topology/raw.h — internal: the topology file exactly as libcyaml loads it, before any checking.
 *
 * Every scalar is kept as a string (NULL when the key is absent) because libcyaml has no
 * defaults and its integer parser accepts trailing junk ("8x"): topology/build.c converts each
 * one with a strict parser and a range, so absent, malformed and out-of-range are three
 * different, clearly reported cases. Sections are pointers so an absent section is NULL too.
 *
 * raw_schema is the single description of the file's shape: libcyaml loads with it, and the
 * libyaml pre-pass (topology/prepass.c) walks the same tables to report every unknown key,
 * wrong kind of value and missing required key with its line, which libcyaml cannot (it stops
 * at the first problem and only logs where). */
#ifndef TROUPE_TOPOLOGY_RAW_H
#define TROUPE_TOPOLOGY_RAW_H

#include <cyaml/cyaml.h>

typedef struct raw_model {
    char *path, *tokenizer, *dtype, *kv_dtype, *kv_scales, *backend, *load_format, *threads, *quantization, *draft;
} raw_model_t;

typedef struct raw_node {
    char *name, *address, *gpus, *launch, *ssh, *workdir;
} raw_node_t;

typedef struct raw_actor {
    char *role, *name, *node, *count;
    char **gpus;                /* [gpus_count] */
    unsigned gpus_count;
    char *tp, *ep, *restart;
} raw_actor_t;

typedef struct raw_endpoints {
    char *client, *inspect, *metrics, *run_dir, *bind_interface, *base_port, *control, *http;
    char **clients;             /* [clients_count] */
    unsigned clients_count;
} raw_endpoints_t;

typedef struct raw_limits {
    char *max_message_bytes, *send_hwm, *recv_hwm, *admission_queue, *max_batch,
         *prefill_chunk_tokens, *kv_blocks, *max_model_len, *max_inflight_per_client, *outbox;
} raw_limits_t;

typedef struct raw_cache {
    char *block_size, *host_store_blocks, *default_retention_s, *disk_dir, *disk_bytes;
} raw_cache_t;

typedef struct raw_supervision {
    char *strategy, *max_restarts, *period_s, *ready_timeout_s, *grace_s, *heartbeat_ms, *liveness,
         *client_heartbeat_ms, *client_heartbeat_timeout_ms;
} raw_supervision_t;

typedef struct raw_security {
    char *curve_server_public, *curve_server_secret, *allow_wildcard;
    char *curve_clients, *curve_keys_dir;
} raw_security_t;

typedef struct raw_api_key {
    char *key, *tenant, *requests_per_minute, *tokens_per_minute;
} raw_api_key_t;

typedef struct raw_gateway {
    raw_api_key_t *api_keys;    /* [api_keys_count] */
    unsigned api_keys_count;
    char *max_body_bytes, *idle_timeout_s, *body_timeout_s, *max_connections, *request_timeout_s;
} raw_gateway_t;

typedef struct raw_experts {
    char *window_steps, *interval_steps, *redundant_slots, *load_half_life_windows;
} raw_experts_t;

typedef struct raw_topo {
    char *name;
    raw_model_t *model;
    raw_node_t *nodes;          /* [nodes_count] */
    unsigned nodes_count;
    raw_actor_t *actors;        /* [actors_count] */
    unsigned actors_count;
    raw_endpoints_t *endpoints;
    raw_limits_t *limits;
    raw_cache_t *cache;
    raw_supervision_t *supervision;
    raw_security_t *security;
    raw_gateway_t *gateway;
    raw_experts_t *experts;
} raw_topo_t;

/* The top-level schema (a mapping of raw_topo_t) and the config libcyaml loads with. */
extern const cyaml_schema_value_t raw_schema;
/* Hard bounds on list lengths, enforced by both passes. */
#define RAW_NODES_MAX  256
#define RAW_ACTORS_MAX 1024
#define RAW_API_KEYS_MAX 4096

struct topo_diag;
struct topo;
/* Converts, defaults, validates and expands raw into t (zeroed by the caller), reporting every
 * problem into d. Returns 0, or -1 when it reported any problem (t may be partly filled). */
int topo_build(struct topo_diag *d, const raw_topo_t *raw, struct topo *t);

#endif
