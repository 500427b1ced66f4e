/* topology/schema.c — the libcyaml schema of the topology file (see topology/raw.h for why every
 * scalar is a string). Adding a key here is all it takes for both the pre-pass and libcyaml to
 * accept it; topology/build.c then gives it a meaning, a default and a range. */
#include "topology/raw.h"
#include "topology/topology.h"

#include <stddef.h>

/* Sequences are allocated arrays, so they carry CYAML_FLAG_POINTER (without it libcyaml
 * writes the entries inline, over the neighbouring fields). */
#define OPT CYAML_FLAG_OPTIONAL
#define STR(key, type, member) CYAML_FIELD_STRING_PTR(key, OPT, type, member, 0, CYAML_UNLIMITED)
#define SECTION(key, member, fields) \
    CYAML_FIELD_MAPPING_PTR(key, OPT, raw_topo_t, member, fields)

static const cyaml_schema_field_t s_model_fields[] = {
    STR("path", raw_model_t, path),
    STR("tokenizer", raw_model_t, tokenizer),
    STR("dtype", raw_model_t, dtype),
    STR("kv_dtype", raw_model_t, kv_dtype),
    STR("kv_scales", raw_model_t, kv_scales),
    STR("backend", raw_model_t, backend),
    STR("load_format", raw_model_t, load_format),
    STR("threads", raw_model_t, threads),
    STR("quantization", raw_model_t, quantization),
    STR("draft", raw_model_t, draft),
    CYAML_FIELD_END
};

static const cyaml_schema_field_t s_node_fields[] = {
    STR("name", raw_node_t, name),
    STR("address", raw_node_t, address),
    STR("gpus", raw_node_t, gpus),
    STR("launch", raw_node_t, launch),
    STR("ssh", raw_node_t, ssh),
    STR("workdir", raw_node_t, workdir),
    CYAML_FIELD_END
};

static const cyaml_schema_value_t s_node_entry = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, raw_node_t, s_node_fields),
};

static const cyaml_schema_value_t s_string_entry = {
    CYAML_VALUE_STRING(CYAML_FLAG_POINTER, char, 0, CYAML_UNLIMITED),
};

static const cyaml_schema_field_t s_actor_fields[] = {
    /* role is required: the pre-pass reports its absence with the entry's line. */
    CYAML_FIELD_STRING_PTR("role", CYAML_FLAG_DEFAULT, raw_actor_t, role, 0, CYAML_UNLIMITED),
    STR("name", raw_actor_t, name),
    STR("node", raw_actor_t, node),
    STR("count", raw_actor_t, count),
    CYAML_FIELD_SEQUENCE("gpus", OPT | CYAML_FLAG_POINTER, raw_actor_t, gpus, &s_string_entry, 0, 64),
    STR("tp", raw_actor_t, tp),
    STR("ep", raw_actor_t, ep),
    STR("restart", raw_actor_t, restart),
    CYAML_FIELD_END
};

static const cyaml_schema_value_t s_actor_entry = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, raw_actor_t, s_actor_fields),
};

static const cyaml_schema_field_t s_endpoints_fields[] = {
    STR("client", raw_endpoints_t, client),
    STR("inspect", raw_endpoints_t, inspect),
    STR("metrics", raw_endpoints_t, metrics),
    STR("run_dir", raw_endpoints_t, run_dir),
    STR("bind_interface", raw_endpoints_t, bind_interface),
    STR("base_port", raw_endpoints_t, base_port),
    STR("control", raw_endpoints_t, control),
    STR("http", raw_endpoints_t, http),
    CYAML_FIELD_SEQUENCE("clients", OPT | CYAML_FLAG_POINTER, raw_endpoints_t, clients, &s_string_entry, 1,
                         TOPO_ROUTERS_MAX),
    CYAML_FIELD_END
};

static const cyaml_schema_field_t s_limits_fields[] = {
    STR("max_message_bytes", raw_limits_t, max_message_bytes),
    STR("send_hwm", raw_limits_t, send_hwm),
    STR("recv_hwm", raw_limits_t, recv_hwm),
    STR("admission_queue", raw_limits_t, admission_queue),
    STR("max_batch", raw_limits_t, max_batch),
    STR("prefill_chunk_tokens", raw_limits_t, prefill_chunk_tokens),
    STR("kv_blocks", raw_limits_t, kv_blocks),
    STR("max_model_len", raw_limits_t, max_model_len),
    STR("max_inflight_per_client", raw_limits_t, max_inflight_per_client),
    STR("outbox", raw_limits_t, outbox),
    CYAML_FIELD_END
};

static const cyaml_schema_field_t s_experts_fields[] = {
    STR("window_steps", raw_experts_t, window_steps),
    STR("interval_steps", raw_experts_t, interval_steps),
    STR("redundant_slots", raw_experts_t, redundant_slots),
    STR("load_half_life_windows", raw_experts_t, load_half_life_windows),
    CYAML_FIELD_END
};

static const cyaml_schema_field_t s_cache_fields[] = {
    STR("block_size", raw_cache_t, block_size),
    STR("host_store_blocks", raw_cache_t, host_store_blocks),
    STR("default_retention_s", raw_cache_t, default_retention_s),
    STR("disk_dir", raw_cache_t, disk_dir),
    STR("disk_bytes", raw_cache_t, disk_bytes),
    CYAML_FIELD_END
};

static const cyaml_schema_field_t s_supervision_fields[] = {
    STR("strategy", raw_supervision_t, strategy),
    STR("max_restarts", raw_supervision_t, max_restarts),
    STR("period_s", raw_supervision_t, period_s),
    STR("ready_timeout_s", raw_supervision_t, ready_timeout_s),
    STR("grace_s", raw_supervision_t, grace_s),
    STR("heartbeat_ms", raw_supervision_t, heartbeat_ms),
    STR("liveness", raw_supervision_t, liveness),
    STR("client_heartbeat_ms", raw_supervision_t, client_heartbeat_ms),
    STR("client_heartbeat_timeout_ms", raw_supervision_t, client_heartbeat_timeout_ms),
    CYAML_FIELD_END
};

static const cyaml_schema_field_t s_security_fields[] = {
    STR("curve_server_public", raw_security_t, curve_server_public),
    STR("curve_server_secret", raw_security_t, curve_server_secret),
    STR("allow_wildcard", raw_security_t, allow_wildcard),
    STR("curve_clients", raw_security_t, curve_clients),
    STR("curve_keys_dir", raw_security_t, curve_keys_dir),
    CYAML_FIELD_END
};

static const cyaml_schema_field_t s_api_key_fields[] = {
    STR("key", raw_api_key_t, key),
    STR("tenant", raw_api_key_t, tenant),
    STR("requests_per_minute", raw_api_key_t, requests_per_minute),
    STR("tokens_per_minute", raw_api_key_t, tokens_per_minute),
    CYAML_FIELD_END
};

static const cyaml_schema_value_t s_api_key_entry = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, raw_api_key_t, s_api_key_fields),
};

static const cyaml_schema_field_t s_gateway_fields[] = {
    CYAML_FIELD_SEQUENCE("api_keys", OPT | CYAML_FLAG_POINTER, raw_gateway_t, api_keys, &s_api_key_entry, 0,
                         RAW_API_KEYS_MAX),
    STR("max_body_bytes", raw_gateway_t, max_body_bytes),
    STR("idle_timeout_s", raw_gateway_t, idle_timeout_s),
    STR("body_timeout_s", raw_gateway_t, body_timeout_s),
    STR("max_connections", raw_gateway_t, max_connections),
    STR("request_timeout_s", raw_gateway_t, request_timeout_s),
    CYAML_FIELD_END
};

static const cyaml_schema_field_t s_top_fields[] = {
    STR("name", raw_topo_t, name),
    SECTION("model", model, s_model_fields),
    CYAML_FIELD_SEQUENCE("nodes", OPT | CYAML_FLAG_POINTER, raw_topo_t, nodes, &s_node_entry, 1, RAW_NODES_MAX),
    CYAML_FIELD_SEQUENCE("actors", CYAML_FLAG_POINTER, raw_topo_t, actors, &s_actor_entry, 1,
                         RAW_ACTORS_MAX),
    SECTION("endpoints", endpoints, s_endpoints_fields),
    SECTION("limits", limits, s_limits_fields),
    SECTION("cache", cache, s_cache_fields),
    SECTION("supervision", supervision, s_supervision_fields),
    SECTION("security", security, s_security_fields),
    SECTION("gateway", gateway, s_gateway_fields),
    SECTION("experts", experts, s_experts_fields),
    CYAML_FIELD_END
};

const cyaml_schema_value_t raw_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_POINTER, raw_topo_t, s_top_fields),
};
