/* messages/msg.h — every control message Troupe's actors exchange, and the one codec for them.
 *
 * Wire format: one ZeroMQ frame = one msgpack map with short string keys:
 *     "v"  protocol version (MSG_VERSION; any other is rejected)
 *     "t"  message type (msg_type_t as an unsigned int; numbers never change, new types append)
 *     "id" u64 request or correlation id
 * then the type's fields by name (the key is the struct field's name). The schema is closed:
 * an unknown or repeated key is an error. Enums travel as unsigned ints and are range-checked.
 *
 * Decoding is bounded in two stages: a pre-scan of the raw bytes checks the frame size, every
 * length and count against the bytes left, nesting depth and the total element count BEFORE
 * anything is allocated; only then are the fields mapped into the struct, each against its
 * own limit (MSG_MAX_*). A decoded message has always passed msg_validate.
 *
 * Variable-length fields are pointer + count. Strings are NUL-terminated UTF-8 (no embedded NUL)
 * and NULL means absent; arrays with count 0 are absent (the pointer is ignored). After
 * msg_decode they point into an arena owned by the msg_t (freed by msg_free); for msg_encode
 * the caller points them at its own memory, which must outlive the call.
 *
 * Times: *_ms durations are relative milliseconds; deadline_ms is an absolute wall-clock time
 * (milliseconds since the epoch, common/util.h wall_ms()), 0 meaning none. */
#ifndef TROUPE_MSG_H
#define TROUPE_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/dtype.h"

/* ---- limits: a frame or field beyond any of these is rejected with an error naming it ---- */
#define MSG_VERSION            1
#define MSG_MAX_FRAME          (16u << 20)  /* bytes in one frame */
#define MSG_MAX_DEPTH          8            /* nested maps/arrays, the top-level map is depth 1 */
#define MSG_MAX_ELEMENTS       (1u << 22)   /* msgpack objects in one frame (keys included) */
#define MSG_MAX_ARENA          (64u << 20)  /* bytes a decoded message may own */
#define MSG_MAX_NAME           256          /* actor/model/tenant names, keys, stop strings (bytes) */
#define MSG_MAX_TEXT           4096         /* human-readable text: error messages, reasons */
#define MSG_MAX_PROMPT_BYTES   (4u << 20)   /* prompt text or one chat message's content */
#define MSG_MAX_PROMPT_TOKENS  262144       /* token ids in one prompt */
#define MSG_MAX_NEW_TOKENS     262144       /* max_tokens */
#define MSG_MAX_PIECE          65536        /* text of one token message */
#define MSG_MAX_COMPLETION_TEXT (8u << 20)  /* a done's whole text (a request that did not stream) */
#define MSG_MAX_TOKEN_CHUNK    4096         /* token ids in one token message */
#define MSG_MAX_CHAT_MESSAGES  1024
#define MSG_MAX_STOP           16           /* stop strings */
#define MSG_MAX_STOP_TOKENS    64           /* stop token ids */
#define MSG_MAX_LOGPROBS       20           /* top_logprobs */
#define MSG_MAX_BLOCKS         65536        /* block ids or block hashes in one message */
#define MSG_MAX_HANDLE         256          /* bytes of a channel handle (shm name, CUDA IPC handle) */
#define MSG_MAX_HOLDERS        256          /* holders in a cache look-up reply or hint */
#define MSG_MAX_QUEUES         64           /* queue depths in one stats message */
#define MSG_MAX_METRICS        256          /* metrics in one stats message */
#define MSG_MAX_ACTORS         1024         /* stats entries in one inspect reply */
#define MSG_MAX_LAYERS         256
#define MSG_MAX_EXPERTS        1024         /* experts per layer */
#define MSG_MAX_WORKERS        1024         /* workers named in an expert placement */
#define MSG_MAX_REPLICAS       (1u << 20)   /* replica entries in one expert placement */
#define MSG_MAX_DRAFT_BUCKETS  64
#define MSG_MAX_DRAFT_POS      64           /* draft positions tracked */
#define MSG_MAX_CONF_BINS      32           /* draft confidence bins */
#define MSG_MAX_COST_CELLS     1024         /* step-cost cells in one spec_report */
#define MSG_MAX_RETENTION_S    604800u      /* cache retention: 7 days */
#define MSG_MAX_TEMPERATURE    100.0f

/* ---- message types: wire numbers, append only ---- */
typedef enum msg_type {
    MSG_NONE = 0,
    /* lifecycle / supervision */
    MSG_READY,             /* actor -> supervisor: bound, loaded, allocated */
    MSG_TERM,              /* supervisor -> actor: drain and exit 0 */
    MSG_HEARTBEAT,         /* both ways: liveness with progress counters */
    MSG_STATS,             /* actor -> monitor: periodic state and metrics */
    /* client-facing */
    MSG_SUBMIT,            /* client -> router: a generation request (id = request id) */
    MSG_TOKEN,             /* router -> client: streamed tokens */
    MSG_DONE,              /* router -> client: terminal, success */
    MSG_ERROR,             /* anyone -> requester: terminal, failure (id = the failed request) */
    MSG_CANCEL,            /* client -> router -> workers: abandon request id */
    /* serving path */
    MSG_PREFILL_REQUEST,   /* router -> prefill */
    MSG_HANDOFF,           /* prefill -> decode: continue this request */
    MSG_KV_ANNOUNCE,       /* sender -> receiver of KV blocks: what is coming on the tensor channel */
    MSG_KV_ACK,            /* receiver -> sender: the blocks arrived (or did not) */
    /* cache-manager */
    MSG_CACHE_LOOKUP,
    MSG_CACHE_LOOKUP_REPLY,
    MSG_CACHE_PUT,
    MSG_CACHE_EVICT,
    MSG_CACHE_PIN,
    MSG_CACHE_UNPIN,
    MSG_CACHE_FETCH,
    MSG_CACHE_FETCH_REPLY,
    MSG_CACHE_EVENT,
    /* expert-balancer */
    MSG_EXPERT_LOAD,
    MSG_EXPERT_PLACEMENT,
    /* draft-scheduler */
    MSG_DRAFT_POLICY,      /* draft-scheduler -> decode: how many drafts to verify per row */
    MSG_SPEC_REPORT,       /* decode -> draft-scheduler: acceptance and step costs of a window */
    /* monitor / inspection */
    MSG_INSPECT,
    MSG_INSPECT_REPLY,
    /* tensor channel */
    MSG_KV_LINK,           /* worker <-> worker: set up (or give up) a link for KV transfers (NCCL) */
    MSG_TYPE_COUNT
} msg_type_t;

/* ---- enums carried in fields (wire numbers, append only) ---- */
typedef enum msg_role {
    MSG_ROLE_NONE = 0, MSG_ROLE_SUPERVISOR, MSG_ROLE_ROUTER, MSG_ROLE_PREFILL, MSG_ROLE_DECODE,
    MSG_ROLE_CACHE_MANAGER, MSG_ROLE_EXPERT_BALANCER, MSG_ROLE_DRAFT_SCHEDULER, MSG_ROLE_MONITOR,
    MSG_ROLE_CLIENT, MSG_ROLE_GATEWAY, MSG_ROLE_COUNT
} msg_role_t;

typedef enum msg_state {
    MSG_STATE_STARTING = 0, MSG_STATE_READY, MSG_STATE_DRAINING, MSG_STATE_STOPPING, MSG_STATE_COUNT
} msg_state_t;

typedef enum msg_metric_kind { MSG_METRIC_GAUGE = 0, MSG_METRIC_COUNTER, MSG_METRIC_KIND_COUNT } msg_metric_kind_t;

typedef enum msg_chat_role {
    MSG_CHAT_SYSTEM = 0, MSG_CHAT_USER, MSG_CHAT_ASSISTANT, MSG_CHAT_TOOL, MSG_CHAT_ROLE_COUNT
} msg_chat_role_t;

typedef enum msg_finish { MSG_FINISH_STOP = 0, MSG_FINISH_LENGTH, MSG_FINISH_CANCELLED, MSG_FINISH_COUNT } msg_finish_t;

typedef enum msg_error_code {
    MSG_ERR_BAD_REQUEST = 0, MSG_ERR_MALFORMED, MSG_ERR_OVERLOADED, MSG_ERR_UNAVAILABLE,
    MSG_ERR_TIMEOUT, MSG_ERR_CANCELLED, MSG_ERR_TRANSFER_FAILED, MSG_ERR_WORKER_LOST,
    MSG_ERR_INTERNAL, MSG_ERR_COUNT
} msg_error_code_t;

typedef enum msg_channel { MSG_CHAN_SHM = 0, MSG_CHAN_CUDA_IPC, MSG_CHAN_NCCL, MSG_CHAN_TCP, MSG_CHAN_COUNT } msg_channel_t;

typedef enum msg_ack_status { MSG_ACK_OK = 0, MSG_ACK_FAILED, MSG_ACK_COUNT } msg_ack_status_t;

typedef enum msg_tier { MSG_TIER_DEVICE = 0, MSG_TIER_HOST, MSG_TIER_DISK, MSG_TIER_COUNT } msg_tier_t;

typedef enum msg_cache_event_kind {
    MSG_CEV_STORED = 0, MSG_CEV_REMOVED, MSG_CEV_PINNED, MSG_CEV_EXPIRED, MSG_CEV_COUNT
} msg_cache_event_kind_t;

typedef enum msg_inspect_what {
    MSG_INSPECT_ACTORS = 0, MSG_INSPECT_ACTOR, MSG_INSPECT_CACHE, MSG_INSPECT_EXPERTS, MSG_INSPECT_COUNT
} msg_inspect_what_t;

/* ---- nested structs ---- */
typedef struct msg_queue_depth {
    const char *name;            /* required: "inbox", "waiting", "running", ... */
    uint64_t depth;
    uint64_t capacity;           /* 0: unbounded */
} msg_queue_depth_t;

typedef struct msg_metric {
    const char *name;            /* required: "batch_size", "tokens_per_s", "ttft_p50_ms", ... */
    double value;                /* finite */
    msg_metric_kind_t kind;      /* gauge (default) or counter (monotonic, for Prometheus _total) */
} msg_metric_t;

typedef struct msg_chat {
    msg_chat_role_t role;
    const char *content;         /* required, <= MSG_MAX_PROMPT_BYTES (may be "") */
} msg_chat_t;

/* Sampling parameters, shared by submit, prefill_request and handoff. msg_init sets defaults. */
typedef struct msg_sampling {
    float temperature;           /* [0, 100]; 0 = greedy; default 1 */
    uint32_t top_k;              /* 0 = off */
    float top_p;                 /* (0, 1]; default 1 */
    float min_p;                 /* [0, 1]; default 0 */
    float repetition_penalty;    /* (0, 10]; default 1 */
    float presence_penalty;      /* [-2, 2] */
    float frequency_penalty;     /* [-2, 2] */
    int64_t seed;                /* -1 (default): random */
    uint32_t max_tokens;         /* [1, MSG_MAX_NEW_TOKENS]; default 256 */
    const char *const *stop;     /* stop strings, each 1..MSG_MAX_NAME bytes */
    uint32_t n_stop;             /* <= MSG_MAX_STOP */
    const uint32_t *stop_token_ids;
    uint32_t n_stop_token_ids;   /* <= MSG_MAX_STOP_TOKENS */
    bool ignore_eos;
    bool logprobs;               /* return the sampled token's logprob */
    uint32_t top_logprobs;       /* alternatives per token (token.top_tokens); <= MSG_MAX_LOGPROBS, needs logprobs */
} msg_sampling_t;

/* cached_tokens is every prompt token whose KV was not computed for this request; the three
 * cached_*_tokens say where they came from: blocks already in the worker's own KV pool (device),
 * fetched from the cache-manager's memory (host) or read back from its disk tier (disk). They sum
 * to cached_tokens, or are all 0 from a sender that does not split it (a build before the split). */
typedef struct msg_usage {
    uint32_t prompt_tokens;
    uint32_t cached_tokens;      /* <= prompt_tokens */
    uint32_t completion_tokens;
    uint32_t cached_device_tokens, cached_host_tokens, cached_disk_tokens;
} msg_usage_t;

typedef struct msg_timings {
    uint32_t queue_ms, prefill_ms, ttft_ms, decode_ms, e2e_ms;
} msg_timings_t;

/* One holder of cached blocks: where a prefix lives and how much of it. */
typedef struct msg_cache_holder {
    const char *holder;          /* required: worker or store name */
    msg_tier_t tier;
    uint32_t matched_blocks;     /* leading blocks of the looked-up prefix it holds */
} msg_cache_holder_t;

typedef struct msg_draft_bucket {
    uint32_t max_batch;          /* applies to batch sizes up to this (ascending across buckets) */
    uint32_t max_draft;          /* drafts per row for proposers without a distribution (n-gram),
                                  * <= MSG_MAX_DRAFT_POS; 0: no speculation at these batch sizes */
    float min_confidence;        /* [0, 1]: rows with a draft distribution verify their leading drafts
                                  * while the calibrated prefix confidence is at least this */
} msg_draft_bucket_t;

/* ---- per-type payloads ---- */
typedef struct msg_ready {
    msg_role_t role;             /* required, not NONE */
    const char *name;            /* required: actor instance name ("decode-0") */
    uint32_t pid;
    const char *endpoint;        /* optional: where it listens */
} msg_ready_t;

typedef struct msg_term {
    const char *reason;          /* optional */
    uint32_t grace_ms;           /* drain budget before hard exit; 0 = actor's default */
} msg_term_t;

typedef struct msg_heartbeat {
    uint64_t seq;
    uint64_t steps;              /* main-loop iterations / engine steps: stalls show as no change */
    uint64_t msgs_in, msgs_out;
    uint32_t inflight;           /* requests in progress */
} msg_heartbeat_t;

typedef struct msg_stats {
    msg_role_t role;             /* required, not NONE */
    const char *name;            /* required */
    uint32_t pid;
    uint64_t uptime_ms;
    msg_state_t state;
    uint32_t restarts;
    uint64_t msgs_in, msgs_out, malformed;
    const msg_queue_depth_t *queues;
    uint32_t n_queues;           /* <= MSG_MAX_QUEUES */
    const msg_metric_t *metrics;
    uint32_t n_metrics;          /* <= MSG_MAX_METRICS */
} msg_stats_t;

typedef struct msg_submit {
    /* exactly one of prompt, messages, tokens */
    const char *prompt;          /* <= MSG_MAX_PROMPT_BYTES */
    const msg_chat_t *messages;
    uint32_t n_messages;         /* <= MSG_MAX_CHAT_MESSAGES */
    const uint32_t *tokens;
    uint32_t n_tokens;           /* <= MSG_MAX_PROMPT_TOKENS */
    const char *model;           /* optional */
    msg_sampling_t sampling;
    bool stream;                 /* send token messages; false: none, the done carries the whole
                                    completion (its tokens, text and logprobs) */
    const char *prompt_cache_key;/* optional; names a prefix to retain */
    uint32_t cache_retention_s;  /* <= MSG_MAX_RETENTION_S; > 0 needs prompt_cache_key */
    uint32_t timeout_ms;         /* relative budget, 0 = none; the router turns it into a deadline */
    const char *tenant;          /* optional; isolates cache sharing */
} msg_submit_t;

typedef struct msg_token {
    uint32_t seq;                /* index of tokens[0] among the request's generated tokens */
    const uint32_t *tokens;
    uint32_t n_tokens;           /* 1..MSG_MAX_TOKEN_CHUNK (required) */
    const char *text;            /* optional: decoded text of these tokens, whole UTF-8 only */
    const float *logprobs;
    uint32_t n_logprobs;         /* 0 or n_tokens */
    /* The most likely tokens at each position (sampling.top_logprobs asked for them), most likely
     * first: [n_tokens][k] with k = n_top_tokens / n_tokens, row i for tokens[i]'s position. */
    const uint32_t *top_tokens;
    uint32_t n_top_tokens;       /* 0, or n_tokens * k for k in 1..MSG_MAX_LOGPROBS; needs logprobs */
    const float *top_logprobs;   /* [n_tokens][k] theirs: <= 0, non-increasing along a row */
    uint32_t n_top_logprobs;     /* == n_top_tokens */
} msg_token_t;

/* The completion fields are set only for a request that did not stream (submit.stream false):
 * every token it made (up to a cancel, too), which no token message carried. */
typedef struct msg_done {
    msg_finish_t finish;
    msg_usage_t usage;
    msg_timings_t timings;
    const uint32_t *tokens;      /* optional: the completion's token ids */
    uint32_t n_tokens;           /* <= MSG_MAX_NEW_TOKENS */
    const char *text;            /* optional: their text, <= MSG_MAX_COMPLETION_TEXT */
    const float *logprobs;       /* optional (sampling.logprobs): each token's */
    uint32_t n_logprobs;         /* 0 or n_tokens */
} msg_done_t;

typedef struct msg_error {
    msg_error_code_t code;
    const char *message;         /* required, <= MSG_MAX_TEXT */
    bool retryable;
    const char *field;           /* optional: the offending field ("sampling.top_p") */
} msg_error_t;

typedef struct msg_cancel {
    uint8_t reserved_;           /* no fields: the id names the request */
} msg_cancel_t;

typedef struct msg_prefill_request {
    const uint32_t *tokens;
    uint32_t n_tokens;           /* 1..MSG_MAX_PROMPT_TOKENS (required) */
    msg_sampling_t sampling;
    const char *decode_worker;   /* required: where to hand off */
    const char *reply_to;        /* required: the router */
    uint64_t tenant_salt;        /* mixed into block hashes */
    uint64_t client_key;         /* who submitted it (the router's hash of credential and tenant),
                                  * for fair admission at the workers; 0 = not known */
    const char *prompt_cache_key;
    uint32_t cache_retention_s;
    const uint64_t *hint_hashes; /* cached prefix hint: block hashes (chained) */
    uint32_t n_hint_hashes;      /* <= MSG_MAX_BLOCKS */
    const msg_cache_holder_t *hint_holders; /* where they live */
    uint32_t n_hint_holders;     /* <= MSG_MAX_HOLDERS */
    uint64_t deadline_ms;
    uint32_t queue_ms;           /* time spent queued at the router so far */
} msg_prefill_request_t;

/* What is coming on the tensor channel: the blocks, their shape, the channel and its handle. Its
 * own message for write-backs and fetches (kv_announce); inside the handoff for a hand-off. */
typedef struct msg_kv_announce {
    uint64_t transfer_id;
    uint64_t request_id;
    uint32_t seq;                /* chunk number within the transfer, from 0 */
    bool last;                   /* final chunk of the transfer */
    msg_channel_t channel;
    uint32_t n_layers;           /* 1..MSG_MAX_LAYERS */
    uint32_t block_size;         /* >= 1 */
    uint32_t n_kv_heads;         /* >= 1 */
    uint32_t head_dim;           /* >= 1 */
    dtype_t dtype;
    const uint32_t *block_ids;   /* sender's block ids, in prefix order */
    uint32_t n_block_ids;        /* 1..MSG_MAX_BLOCKS (required) */
    uint64_t total_bytes;        /* bytes on the tensor channel for this chunk, >= 1 */
    const uint8_t *handle;       /* shm name, CUDA IPC handle, NCCL link id + sequence, tcp endpoint */
    uint32_t handle_len;         /* <= MSG_MAX_HANDLE */
    const char *src;             /* required: sending actor */
    uint64_t deadline_ms;
} msg_kv_announce_t;

typedef struct msg_handoff {
    const uint32_t *tokens;      /* prompt token ids */
    uint32_t n_tokens;           /* 1..MSG_MAX_PROMPT_TOKENS (required) */
    uint32_t first_token;
    float first_logprob;         /* <= 0 */
    const uint32_t *first_top_tokens;  /* first_token's position's most likely tokens, most likely first */
    uint32_t n_first_top_tokens;       /* <= sampling.top_logprobs */
    const float *first_top_logprobs;   /* theirs: <= 0, non-increasing */
    uint32_t n_first_top_logprobs;     /* == n_first_top_tokens */
    msg_sampling_t sampling;
    uint32_t tokens_left;        /* generation budget after first_token */
    uint32_t kv_tokens;          /* tokens whose KV travels (<= n_tokens) */
    uint32_t block_size;         /* tokens per KV block, >= 1 */
    const char *reply_to;        /* required: router that streams to the client */
    const char *prefill_worker;  /* required: the sender, for the kv_ack */
    uint64_t tenant_salt;
    uint64_t client_key;         /* the prefill_request's */
    const char *prompt_cache_key;
    uint32_t cache_retention_s;
    uint32_t cached_tokens;      /* prompt tokens served from cache, for usage */
    uint32_t cached_host_tokens; /* of those, fetched from the cache-manager's memory */
    uint32_t cached_disk_tokens; /* and read back from its disk (host + disk <= cached_tokens: the
                                  * rest were in the prefill worker's own pool) */
    uint32_t queue_ms, prefill_ms; /* timings so far, for done */
    uint64_t deadline_ms;
    /* The KV's transfer description (transfer id, blocks, channel, handle): one when the KV
     * travels with the hand-off (always from a prefill worker), none for a request whose KV is
     * computed where it runs. Its src must be prefill_worker. */
    const msg_kv_announce_t *kv;
    uint32_t n_kv;               /* 0..1 */
} msg_handoff_t;

/* A link between two workers for KV transfers (NCCL between GPUs: actors/runtime/kv_link.h). The
 * offering side creates the channel's bootstrap (an ncclUniqueId) and sends it with status ok; the
 * receiver joins as `rank` of `n_ranks`. Either side sends status failed (message says why) when it
 * cannot join or the link broke, and both abort it. A later offer from the same src replaces the
 * link; transfers name their link by link_id (their kv_announce handle). */
typedef struct msg_kv_link {
    uint64_t link_id;            /* the offerer's id for this link */
    msg_channel_t channel;       /* nccl */
    msg_ack_status_t status;     /* ok: an offer; failed: refused or broken */
    const uint8_t *handle;       /* the offer's bootstrap (NCCL unique id, 128 bytes); required with ok */
    uint32_t handle_len;         /* <= MSG_MAX_HANDLE */
    uint32_t n_ranks;            /* ranks of the link, 1..MSG_MAX_WORKERS */
    uint32_t rank;               /* the receiver's rank, < n_ranks */
    const char *src;             /* required: the sending actor */
    const char *message;         /* required when failed: why */
    uint64_t deadline_ms;        /* offer: the offerer gives up waiting for the link after this */
} msg_kv_link_t;

typedef struct msg_kv_ack {
    uint64_t transfer_id;
    uint32_t seq;
    msg_ack_status_t status;
    const char *message;         /* optional (why it failed) */
    const uint32_t *dst_block_ids;
    uint32_t n_dst_block_ids;    /* <= MSG_MAX_BLOCKS */
} msg_kv_ack_t;

typedef struct msg_cache_lookup {
    uint64_t tenant_salt;
    const uint64_t *hashes;
    uint32_t n_hashes;           /* 1..MSG_MAX_BLOCKS (required) */
} msg_cache_lookup_t;

typedef struct msg_cache_lookup_reply {
    const msg_cache_holder_t *holders;
    uint32_t n_holders;          /* <= MSG_MAX_HOLDERS; 0: nowhere */
} msg_cache_lookup_reply_t;

typedef struct msg_cache_put {
    const char *holder;          /* required */
    msg_tier_t tier;
    const uint64_t *hashes;
    uint32_t n_hashes;           /* required */
    uint64_t parent_hash;        /* hash of the block before hashes[0]; 0 = start of sequence */
    uint32_t pool_blocks;        /* tier device: the holder's KV pool size in blocks, which bounds what the
                                    cache-manager keeps of its hashes (actors/cache/dev_index.h); 0 = not said */
} msg_cache_put_t;

typedef struct msg_cache_evict {
    const char *holder;          /* required */
    msg_tier_t tier;
    const uint64_t *hashes;
    uint32_t n_hashes;           /* required */
} msg_cache_evict_t;

typedef struct msg_cache_pin {
    const char *tenant;          /* optional */
    const char *prompt_cache_key;/* required */
    const uint64_t *hashes;
    uint32_t n_hashes;           /* required */
    uint64_t expires_in_ms;      /* >= 1, <= MSG_MAX_RETENTION_S * 1000 */
} msg_cache_pin_t;

typedef struct msg_cache_unpin {
    const char *tenant;          /* optional */
    const char *prompt_cache_key;/* required */
    const uint64_t *hashes;
    uint32_t n_hashes;           /* optional: none = every block pinned under the key */
} msg_cache_unpin_t;

typedef struct msg_cache_fetch {
    const uint64_t *hashes;
    uint32_t n_hashes;           /* required */
    msg_channel_t channel;       /* how to send the blocks back */
    const char *reply_to;        /* required */
    const uint8_t *handle;       /* receiver's channel handle, if the channel needs one */
    uint32_t handle_len;         /* <= MSG_MAX_HANDLE */
    float block_budget_ms;       /* 0..1e6: a block only the store's disk holds is read for this
                                  * fetch when reading one takes less (the worker's compute time of
                                  * a block less its fetch time of one, actors/worker/fetch_policy.h);
                                  * 0: unknown, read and waited for at most 1 s */
} msg_cache_fetch_t;

/* Sent before the kv_announce it describes, so the worker knows each block's tier when the blocks
 * land. */
typedef struct msg_cache_fetch_reply {
    uint32_t found;              /* leading blocks found (a kv_announce follows if > 0) */
    uint64_t transfer_id;
    uint32_t found_disk;         /* <= found: of those, read back from disk for this fetch (the rest
                                  * were in the store's memory) */
    const uint64_t *disk_mask;   /* bit j % 64 of word j / 64: found block j came from disk; exactly
                                  * found_disk bits, none at or past found */
    uint32_t n_disk_mask;        /* 0 when found_disk is 0, else (found + 63) / 64 */
} msg_cache_fetch_reply_t;

typedef struct msg_cache_event {
    msg_cache_event_kind_t kind;
    const char *holder;          /* required */
    msg_tier_t tier;
    const uint64_t *hashes;
    uint32_t n_hashes;           /* required */
} msg_cache_event_t;

typedef struct msg_expert_load {
    const char *worker;          /* required */
    uint32_t layer;              /* < MSG_MAX_LAYERS */
    const uint64_t *counts;      /* tokens routed to each expert in the window */
    uint32_t n_counts;           /* 1..MSG_MAX_EXPERTS (required) */
    uint32_t window_ms;
} msg_expert_load_t;

/* Replicas of (layer l, expert e) are replicas[offsets[l*n_experts+e] .. offsets[l*n_experts+e+1]),
 * each an index into workers[]. Every expert has at least one replica. */
typedef struct msg_expert_placement {
    uint64_t epoch;              /* workers switch to it at a step boundary */
    uint32_t n_layers;           /* 1..MSG_MAX_LAYERS */
    uint32_t n_experts;          /* 1..MSG_MAX_EXPERTS */
    const uint32_t *offsets;
    uint32_t n_offsets;          /* n_layers * n_experts + 1 (required) */
    const uint32_t *replicas;
    uint32_t n_replicas;         /* == offsets[n_offsets-1], <= MSG_MAX_REPLICAS (required) */
    const char *const *workers;
    uint32_t n_workers;          /* <= MSG_MAX_WORKERS (required) */
} msg_expert_placement_t;

/* The draft-scheduler's policy (engine/spec_policy.h). A worker applies it for valid_ms after it
 * arrives and then falls back to its own default, so a policy from a scheduler that went away
 * does not stay in force. */
typedef struct msg_draft_policy {
    uint64_t epoch;
    uint32_t valid_ms;           /* >= 1: how long the policy holds */
    uint32_t max_k;              /* 1..MSG_MAX_DRAFT_POS: drafts per row with a distribution at most */
    const msg_draft_bucket_t *buckets;
    uint32_t n_buckets;          /* 1..MSG_MAX_DRAFT_BUCKETS, max_batch strictly ascending (required) */
    const float *survival;       /* [0, 1], non-increasing: prefix survival by draft position it used */
    uint32_t n_survival;         /* <= MSG_MAX_DRAFT_POS */
    const float *calibration;    /* [0, 1] by equal confidence bins over [0, 1]: measured survival of a
                                  * prefix of that confidence; none: confidence taken as is */
    uint32_t n_calibration;      /* <= MSG_MAX_CONF_BINS */
} msg_draft_policy_t;

/* A decode worker's speculation over one window. Acceptance by draft position: proposed_at[i]
 * row-steps verified at least i + 1 drafts and accepted_at[i] of them kept their first i + 1
 * (both non-increasing in i). conf_seen[j] / conf_accepted[j]: drafts whose prefix confidence
 * (cumulative product of draft probabilities) fell in bin j of n_conf_seen equal bins over [0, 1],
 * and those accepted. Step costs of decode-only steps: cell c is cost_steps[c] steps of about
 * cost_batch[c] rows with cost_drafts[c] drafts per row (engine/spec_policy.h spec_cost_t: the
 * length every row asked for, or the rounded mean verified with a distribution) taking cost_us[c]
 * microseconds in all, and (optional: none, or one per cell) cost_rows[c] decode rows that
 * emitted cost_tokens[c] tokens over those steps. */
typedef struct msg_spec_report {
    const char *worker;          /* required */
    uint64_t steps;              /* decode-only steps in the window */
    uint64_t verify_steps;       /* row-steps that verified drafts */
    uint64_t drafts, accepted;   /* accepted <= drafts */
    const uint64_t *proposed_at;
    uint32_t n_proposed_at;      /* <= MSG_MAX_DRAFT_POS */
    const uint64_t *accepted_at;
    uint32_t n_accepted_at;      /* == n_proposed_at */
    const uint64_t *conf_seen;
    uint32_t n_conf_seen;        /* <= MSG_MAX_CONF_BINS */
    const uint64_t *conf_accepted;
    uint32_t n_conf_accepted;    /* == n_conf_seen */
    const uint32_t *cost_batch;  /* each >= 1 */
    uint32_t n_cost_batch;       /* <= MSG_MAX_COST_CELLS */
    const uint32_t *cost_drafts; /* each <= MSG_MAX_DRAFT_POS */
    uint32_t n_cost_drafts;      /* == n_cost_batch */
    const uint64_t *cost_steps;  /* each >= 1 */
    uint32_t n_cost_steps;       /* == n_cost_batch */
    const uint64_t *cost_us;
    uint32_t n_cost_us;          /* == n_cost_batch */
    const uint64_t *cost_rows;   /* each >= cost_steps[c] */
    uint32_t n_cost_rows;        /* 0 or n_cost_batch */
    const uint64_t *cost_tokens;
    uint32_t n_cost_tokens;      /* == n_cost_rows */
} msg_spec_report_t;

typedef struct msg_inspect {
    msg_inspect_what_t what;
    const char *name;            /* required when what == MSG_INSPECT_ACTOR */
} msg_inspect_t;

typedef struct msg_inspect_reply {
    uint64_t uptime_ms;          /* cluster uptime */
    const msg_stats_t *actors;
    uint32_t n_actors;           /* <= MSG_MAX_ACTORS */
} msg_inspect_reply_t;

struct msg_arena;                /* private */

typedef struct msg {
    msg_type_t type;
    uint64_t id;                 /* request or correlation id */
    union {
        msg_ready_t ready;
        msg_term_t term;
        msg_heartbeat_t heartbeat;
        msg_stats_t stats;
        msg_submit_t submit;
        msg_token_t token;
        msg_done_t done;
        msg_error_t error;
        msg_cancel_t cancel;
        msg_prefill_request_t prefill_request;
        msg_handoff_t handoff;
        msg_kv_announce_t kv_announce;
        msg_kv_ack_t kv_ack;
        msg_cache_lookup_t cache_lookup;
        msg_cache_lookup_reply_t cache_lookup_reply;
        msg_cache_put_t cache_put;
        msg_cache_evict_t cache_evict;
        msg_cache_pin_t cache_pin;
        msg_cache_unpin_t cache_unpin;
        msg_cache_fetch_t cache_fetch;
        msg_cache_fetch_reply_t cache_fetch_reply;
        msg_cache_event_t cache_event;
        msg_expert_load_t expert_load;
        msg_expert_placement_t expert_placement;
        msg_draft_policy_t draft_policy;
        msg_spec_report_t spec_report;
        msg_inspect_t inspect;
        msg_inspect_reply_t inspect_reply;
        msg_kv_link_t kv_link;
    } u;
    struct msg_arena *arena_;    /* private: owns variable-length fields after decode */
    size_t arena_hint_;          /* private: first arena chunk size for this decode */
} msg_t;

/* "ready", "submit", ...; "?" when out of range. */
const char *msg_type_name(msg_type_t t);
/* Inverse of msg_type_name; -1 if unknown. */
int msg_type_parse(const char *name, msg_type_t *out);
const char *msg_role_name(msg_role_t r);          /* "router", "cache_manager", ... */
int msg_role_parse(const char *name, msg_role_t *out);
const char *msg_state_name(msg_state_t s);
const char *msg_error_code_name(msg_error_code_t c); /* "bad_request", "overloaded", ... */
const char *msg_finish_name(msg_finish_t f);
const char *msg_channel_name(msg_channel_t c);
const char *msg_tier_name(msg_tier_t t);

/* Zeroes *m (no arena) and sets the type's defaults (sampling: temperature 1, top_p 1,
 * repetition_penalty 1, seed -1, max_tokens 256). */
void msg_init(msg_t *m, msg_type_t t, uint64_t id);

/* Validates, then writes one frame into buf (no allocation). -1 with a message if the message
 * is invalid or the frame does not fit in cap (or would exceed MSG_MAX_FRAME). */
int msg_encode(const msg_t *m, uint8_t *buf, size_t cap, size_t *len, char *err, size_t errlen);

/* Decodes one frame. *out need not be initialised and is overwritten: msg_free it first if it
 * held a decoded message. On success *out is valid and owns an arena (msg_free it). On failure
 * returns -1, leaves *out as msg_init(MSG_NONE, 0) owning nothing, and err names the field
 * and the problem ("submit.sampling.top_p: 1.5 outside [0, 1]"). */
int msg_decode(const uint8_t *buf, size_t len, msg_t *out, char *err, size_t errlen);

/* Best-effort read of "t" and "id" from a frame that may fail msg_decode, so a malformed
 * request can still get an error reply. Bounded, allocates nothing. -1 if not found. */
int msg_peek(const uint8_t *buf, size_t len, msg_type_t *type, uint64_t *id);

/* Deep copy: dst gets its own arena holding every string and array, so it outlives src (a
 * router keeps a request's submit after the frame is gone). dst must not be src and need not
 * be initialised; msg_free(dst) when done. On failure (src invalid, out of memory) dst is left
 * as msg_init(MSG_NONE, 0). */
int msg_clone(const msg_t *src, msg_t *dst, char *err, size_t errlen);

/* Enums in range, counts within limits, required fields present, cross-field rules. */
int msg_validate(const msg_t *m, char *err, size_t errlen);

/* Field-by-field equality (contents, not pointers). If they differ and diff is non-NULL,
 * names the first differing field. */
bool msg_equal(const msg_t *a, const msg_t *b, char *diff, size_t difflen);

/* One readable line (long strings and arrays shortened), newline-terminated, one write. */
void msg_print(const msg_t *m, FILE *f);

/* Full JSON object {"type":"submit","id":1,...} (enums by name, bin as hex), NUL-terminated.
 * Returns its length, or -1 if it does not fit in cap. */
int msg_to_json(const msg_t *m, char *buf, size_t cap);

/* Frees the decode arena and clears the payload (type and id stay); idempotent. */
void msg_free(msg_t *m);

#endif
