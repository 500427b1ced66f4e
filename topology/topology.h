/* topology/topology.h — the cluster's topology file: loaded, defaulted, validated, expanded.
 *
 * A topology file (YAML, schema in topology/README.md) says which actors run where. Loading it
 * yields a topo_t in which every optional field already holds its default, every number has
 * been range-checked, and every actor entry has been EXPANDED into its instances (an entry with
 * count: 3 becomes three instances with their own names, GPUs and inbox endpoints). Every
 * process of the cluster loads the same file and finds itself by instance name (topo_find), so
 * the derived names and endpoints must be a pure function of the file: they are.
 *
 * Relative paths in the file (model.path, model.tokenizer, security key files) are relative to
 * the CURRENT DIRECTORY of the process that reads them (the supervisor starts actors in its own
 * directory, or in nodes[].workdir on remote nodes), not to the topology file's directory.
 *
 * Errors: a load collects EVERY problem it finds (not just the first) into a topo_errors_t, each
 * as "file:line: field.path: what is wrong". */
#ifndef TROUPE_TOPOLOGY_H
#define TROUPE_TOPOLOGY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/dtype.h"

#define TOPO_NAME_MAX     64     /* cluster, node, actor and instance names, with the NUL */
#define TOPO_ENDPOINT_MAX 256    /* a ZeroMQ endpoint string, with the NUL */
#define TOPO_PATH_MAX     1024   /* a file or directory path, with the NUL */
#define TOPO_GPUS_MAX     64     /* GPUs per node, and entries of actors[].gpus */
#define TOPO_ROUTERS_MAX  8      /* router instances, each with its own client endpoint */
#define TOPO_ERRORS_MAX   64     /* problems kept per load; more are counted in .dropped */
#define TOPO_ERROR_LEN    512    /* one problem's text, with the NUL */

typedef enum {
    ROLE_ROUTER, ROLE_PREFILL, ROLE_DECODE, ROLE_CACHE_MANAGER, ROLE_EXPERT_BALANCER,
    ROLE_DRAFT_SCHEDULER, ROLE_MONITOR, ROLE_GATEWAY, ROLE_COUNT
} topo_role_t;

typedef enum { TOPO_BACKEND_CPU, TOPO_BACKEND_CUDA } topo_backend_t;
typedef enum { TOPO_LOAD_AUTO, TOPO_LOAD_DUMMY } topo_load_format_t;       /* dummy: random weights from config.json */
typedef enum { TOPO_LAUNCH_LOCAL, TOPO_LAUNCH_SSH, TOPO_LAUNCH_SRUN } topo_launch_t;
/* OTP semantics: permanent restarts always, transient only after an abnormal exit (non-zero
 * status or a signal), temporary never. */
typedef enum { TOPO_RESTART_PERMANENT, TOPO_RESTART_TRANSIENT, TOPO_RESTART_TEMPORARY } topo_restart_t;
typedef enum { TOPO_STRATEGY_ONE_FOR_ONE, TOPO_STRATEGY_REST_FOR_ONE } topo_strategy_t;

const char *topo_role_name(topo_role_t r);                 /* "cache-manager"; "?" when out of range */
int topo_role_parse(const char *s, topo_role_t *out);      /* 0, or -1 for an unknown name */
const char *topo_backend_name(topo_backend_t b);           /* "cpu", "cuda" */
const char *topo_load_format_name(topo_load_format_t f);   /* "auto", "dummy" */
const char *topo_launch_name(topo_launch_t l);             /* "local", "ssh", "srun" */
const char *topo_restart_name(topo_restart_t r);           /* "permanent", ... */
const char *topo_strategy_name(topo_strategy_t s);         /* "one_for_one", "rest_for_one" */

typedef struct topo_model {
    char path[TOPO_PATH_MAX];            /* HF checkpoint directory; "" only when no prefill/decode exists */
    char tokenizer[TOPO_PATH_MAX];       /* directory with tokenizer.json; default = path */
    dtype_t dtype;                       /* default bf16 on cuda, f32 on cpu */
    dtype_t kv_dtype;                    /* KV cache; DT_COUNT: auto (config_kv_dtype: the dummy weights' or the config's dtype) */
    int kv_scales;                       /* an fp8 cache's scales: KV_SCALES_* (engine/kvscale.h), default 0 auto */
    topo_backend_t backend;              /* default cpu */
    topo_load_format_t load_format;      /* default auto */
    int threads;                         /* CPU threads per worker, 0 = auto; 0..1024 */
    int quantization;                    /* online quantization at load: BK_Q_* (kernels/backend.h), 0 none */
    char draft[TOPO_PATH_MAX];           /* a draft model for speculative decoding (docs/speculation.md); "" = none */
} topo_model_t;

typedef struct topo_node {
    char name[TOPO_NAME_MAX];            /* unique; also the Slurm node name for launch: srun */
    char address[TOPO_ENDPOINT_MAX];     /* host/IP peers connect to (and where its tcp endpoints bind); default 127.0.0.1 */
    int gpus;                            /* GPUs it has; 0..TOPO_GPUS_MAX */
    topo_launch_t launch;                /* default local */
    char ssh[TOPO_PATH_MAX];             /* command template for launch: ssh; default "ssh -o BatchMode=yes {address}" */
    char workdir[TOPO_PATH_MAX];         /* "" = none; remote launches cd here before exec */
} topo_node_t;

/* One entry of the file's actors: list, before expansion. */
typedef struct topo_actor {
    topo_role_t role;
    char name[TOPO_NAME_MAX];            /* base name; default = role name */
    int node;                            /* index into topo_t.nodes; default 0 */
    int count;                           /* instances; >= 1 */
    int gpus[TOPO_GPUS_MAX];             /* GPU indices on its node */
    int n_gpus;                          /* 0 (none), 1 (shared by every instance) or count (one each) */
    int tp;                              /* tensor-parallel degree; divides count */
    int ep;                              /* decode instances per expert-parallel group; divides count
                                            (instances g*ep .. g*ep+ep-1 form group g, each a rank with its own
                                            requests: docs/experts.md); 1 = none */
    topo_restart_t restart;              /* default permanent */
} topo_actor_t;

/* One process of the cluster. */
typedef struct topo_instance {
    char name[TOPO_NAME_MAX];            /* unique: "prefill-0" (role-<i>, or <name>-<i>, when count > 1) */
    topo_role_t role;
    int index;                           /* index within its actor entry (0..count-1) */
    int actor;                           /* index into topo_t.actors */
    int node;                            /* index into topo_t.nodes */
    int gpu;                             /* -1 = none */
    char inbox[TOPO_ENDPOINT_MAX];       /* where peers connect: ipc://<run_dir>/<name>.sock, or tcp://<node address>:<port> when multi-node */
    char inbox_bind[TOPO_ENDPOINT_MAX];  /* where the instance itself binds (differs from inbox when endpoints.bind_interface is set) */
    topo_restart_t restart;              /* permanent/transient/temporary */
    int order;                           /* start order = position in this list (file order); the supervisor stops in reverse */
} topo_instance_t;

typedef struct topo_endpoints {
    char client[TOPO_ENDPOINT_MAX];      /* the (first) router binds it; clients connect. default tcp://127.0.0.1:5555 */
    /* One client endpoint per router instance, in instance order: clients[0] is client. The file
     * lists them (endpoints.clients) when it has more than one router; clients fail over between
     * them (tools/lib/client.h). */
    char clients[TOPO_ROUTERS_MAX][TOPO_ENDPOINT_MAX];
    int n_clients;
    char inspect[TOPO_ENDPOINT_MAX];     /* the monitor's inspection endpoint for `top`; default tcp://127.0.0.1:5556 */
    char metrics[TOPO_ENDPOINT_MAX];     /* the monitor's Prometheus endpoint (HTTP GET /metrics), tcp:// only; "" (default) = off */
    char http[TOPO_ENDPOINT_MAX];        /* the gateway's OpenAI HTTP API, tcp:// only; default tcp://127.0.0.1:8000 (used only with a gateway) */
    char run_dir[TOPO_PATH_MAX];         /* ipc sockets live here; default /tmp/troupe-<name>-<uid>; the supervisor creates it 0700 */
    char bind_interface[TOPO_ENDPOINT_MAX]; /* "" = bind internal tcp endpoints on each node's address; else this host/interface */
    int base_port;                       /* first port of derived internal tcp endpoints (multi-node); default 5600 */
    /* control: the supervisor's ROUTER (connect side). Derived: ipc://<run_dir>/control.sock on one
     * node; multi-node, tcp://<address of the first node with launch: local>:<base_port>. The
     * file may set it (endpoints.control) when the supervisor runs elsewhere. */
    char control[TOPO_ENDPOINT_MAX];
    char control_bind[TOPO_ENDPOINT_MAX];/* derived: where the supervisor binds it */
    char stats[TOPO_ENDPOINT_MAX];       /* derived: the monitor's SUB (actors' PUBs connect here); ipc://<run_dir>/stats.sock, or tcp://<monitor's node>:<base_port+1> */
    char stats_bind[TOPO_ENDPOINT_MAX];  /* derived: where the monitor binds it */
} topo_endpoints_t;

typedef struct topo_limits {
    int64_t max_message_bytes;           /* ZMQ_MAXMSGSIZE per frame; default 16 MiB; 4096..2^31-1 */
    int send_hwm;                        /* ZMQ high-water marks; default 1000; 1..10^7 */
    int recv_hwm;
    int admission_queue;                 /* router's waiting requests before 'overloaded'; default 256; 1..10^6 */
    int max_batch;                       /* decode batch size; default 64; 1..4096 */
    int prefill_chunk_tokens;            /* prefill token budget per step; default 512; 1..2^20 */
    int kv_blocks;                       /* KV blocks per worker; 0 = derive from memory; 0..2^26 */
    int max_model_len;                   /* default 4096; block_size..2^21 */
    int max_inflight_per_client;         /* router: requests one client (credential, tenant) may have in
                                            flight before 'overloaded'; 0 (default) = no cap but admission_queue */
    int outbox;                          /* messages an actor queues for one peer past its send_hwm (and the
                                            router for one client connection) before sends are refused or,
                                            for a stream's tokens, its producer waits; default 1024; 16..10^6 */
} topo_limits_t;

typedef struct topo_cache {
    int block_size;                      /* tokens per KV block; one of 8, 16, 32, 64, 128; default 16 */
    int host_store_blocks;               /* cache-manager's host store; default 4096; 0..2^26 */
    int default_retention_s;             /* retention when a client names a cache key without a time; default 300; 0..7 days (the longest pin) */
    char disk_dir[TOPO_PATH_MAX];        /* cache-manager's disk tier (actors/cache/); "" = none (default) */
    int64_t disk_bytes;                  /* its size limit; default 0 = 10 GiB when disk_dir is set; 0 or 2^20..2^50 */
} topo_cache_t;

typedef struct topo_supervision {
    topo_strategy_t strategy;            /* default one_for_one */
    int max_restarts;                    /* at most this many restarts ...  default 5; 0..10000 */
    int period_s;                        /* ... within this many seconds; default 10; 1..86400 */
    int ready_timeout_s;                 /* default 60; 1..3600 */
    int grace_s;                         /* SIGTERM -> wait -> SIGKILL; default 5; 0..600 */
    int heartbeat_ms;                    /* default 500; 10..60000 */
    int liveness;                        /* missed heartbeats before an actor counts as wedged; default 3; 1..100 */
    /* A client's (and the gateway's) ZMTP heartbeats to a router, for clients that read the
     * topology (troupe-client --topology, troupe-bench; tools/lib/client.h) and the gateway. */
    int client_heartbeat_ms;             /* a PING this often; default 1000; 10..60000 */
    int client_heartbeat_timeout_ms;     /* no answer this long: the connection is lost; default 3000;
                                            100..600000, more than client_heartbeat_ms */
} topo_supervision_t;

typedef struct topo_security {
    char curve_server_public[TOPO_PATH_MAX]; /* "" = none; required when any endpoint binds a wildcard */
    char curve_server_secret[TOPO_PATH_MAX];
    int allow_wildcard;                  /* 0/1; a wildcard bind also needs this set */
    /* With the server keys set, CURVE is in force on every ZeroMQ socket of the cluster (tcp and
     * ipc; not the plain-HTTP /metrics). See docs/security.md. */
    char curve_clients[TOPO_PATH_MAX];   /* allow-list of client public keys (one Z85 key a line); required with the keys */
    char curve_keys_dir[TOPO_PATH_MAX];  /* actors' own keypairs <instance>.pub/.key (and supervisor.*); default <run_dir>/keys, made fresh at each launch */
} topo_security_t;

/* The gateway's API keys (docs/gateway.md): each names a tenant (the per-tenant cache salt) and
 * its own rate limits. No keys: the API is open and requests carry no tenant. */
#define TOPO_KEY_MAX 128                 /* an API key, with the NUL */
typedef struct topo_api_key {
    char key[TOPO_KEY_MAX];              /* the bearer token, 8..127 printable bytes */
    char tenant[TOPO_NAME_MAX];          /* default: the key's entry name "key-<i>" */
    int requests_per_minute;             /* 0 = unlimited (default) */
    int tokens_per_minute;               /* prompt + completion tokens; 0 = unlimited (default) */
} topo_api_key_t;

typedef struct topo_gateway {
    topo_api_key_t *keys;                /* [n_keys] */
    int n_keys;
    int max_body_bytes;                  /* request bodies beyond this get 413; default 8 MiB; 1 KiB..64 MiB */
    int idle_timeout_s;                  /* a connection silent this long is closed; default 30; 1..3600 */
    int body_timeout_s;                  /* a request body must arrive within this; default 10; 1..3600 */
    int max_connections;                 /* open HTTP connections; default 1024; 1..65536 */
    int request_timeout_s;               /* each request's budget at the router (timeout_ms); 0 = none (default) */
} topo_gateway_t;

typedef struct topo_experts {
    int window_steps;                    /* decode steps per expert_load window; default 1000; 1..10^9 */
    int interval_steps;                  /* steps between placements, a multiple of window_steps; default 10000 */
    int redundant_slots;                 /* replica slots per rank beyond the experts' share; default 1; 0..64 */
    int load_half_life_windows;          /* windows for a window's weight in the balancer's totals to halve;
                                            default 10; 0 = never aged; 0..10^6 */
} topo_experts_t;

typedef struct topo {
    char name[TOPO_NAME_MAX];            /* cluster name; [A-Za-z0-9._-] */
    char source[TOPO_PATH_MAX];          /* file it was loaded from ("<default>" for the embedded one) */
    topo_model_t model;
    topo_node_t *nodes;                  /* [n_nodes] */
    int n_nodes;
    topo_actor_t *actors;                /* [n_actors], file order */
    int n_actors;
    topo_instance_t *instances;          /* [n_instances], start order */
    int n_instances;
    int multi_node;                      /* 1 when instances span nodes or any used node is launched remotely: internal endpoints are tcp */
    topo_endpoints_t endpoints;
    topo_limits_t limits;
    topo_cache_t cache;
    topo_supervision_t supervision;
    topo_security_t security;
    topo_gateway_t gateway;
    topo_experts_t experts;
} topo_t;

/* Every problem of one load. Zero-initialize (or topo_errors_clear) before use. */
typedef struct topo_errors {
    int count;                           /* entries in msg[] */
    int dropped;                         /* problems beyond TOPO_ERRORS_MAX, counted only */
    char msg[TOPO_ERRORS_MAX][TOPO_ERROR_LEN]; /* "file:line: field.path: what is wrong" */
} topo_errors_t;

void topo_errors_clear(topo_errors_t *e);
/* Writes every problem, one per line (and "... and N more" when some were dropped). */
void topo_errors_print(const topo_errors_t *e, FILE *f);
/* 1 when some entry contains needle (tests and callers that branch on a problem). */
int topo_errors_contain(const topo_errors_t *e, const char *needle);

/* Load, default, validate and expand. On success *out owns a topo_t and 0 is returned. On failure
 * *out is NULL, -1 is returned and errs (if not NULL) holds every problem; with errs NULL the
 * problems are logged with LOG_E instead. */
int  topo_load_file(const char *path, topo_t **out, topo_errors_t *errs);
int  topo_load_string(const char *yaml, size_t len, const char *name_for_errors, topo_t **out,
                      topo_errors_t *errs);
/* Loads the embedded default (topo_default_yaml). */
int  topo_load_default(topo_t **out, topo_errors_t *errs);
void topo_destroy(topo_t **self_p);

/* The instance with that name, or NULL. */
const topo_instance_t *topo_find(const topo_t *t, const char *instance_name);
/* The first instance of a role (index 0 of the first entry with that role), or NULL. */
const topo_instance_t *topo_first(const topo_t *t, topo_role_t role);
/* 1 when the model should have a tokenizer: model.tokenizer is set or model.path holds a
 * tokenizer.json. One that then fails to load is a configuration error, not "token ids only". */
int topo_tokenizer_expected(const topo_t *t);
/* How many instances have that role. */
int topo_count_role(const topo_t *t, topo_role_t role);
/* The client endpoint a router instance binds (endpoints.clients[its index among the routers]);
 * NULL for an instance that is not a router. */
const char *topo_client_endpoint(const topo_t *t, const topo_instance_t *router);

/* The embedded default: the one-machine CPU topology, byte for byte topology/examples/cpu-default.yaml
 * (a unit test checks they are equal). */
extern const char topo_default_yaml[];
extern const size_t topo_default_yaml_len;

/* The effective topology after defaults and expansion, as readable YAML-like text. */
void topo_print(const topo_t *t, FILE *f);

#endif
