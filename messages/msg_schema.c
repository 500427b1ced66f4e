/* messages/msg_schema.c — the names of every type and enum, and one field table per message.
 *
 * To add a field: add it to the struct in msg.h and one line to its table here; encode, decode,
 * validate, equality, print, JSON and the round-trip test pick it up. Cross-field rules that a
 * table cannot say (exactly one prompt form, offsets that must be monotonic) live in the
 * schema's check function. Wire keys are the C field names, so the two cannot drift apart. */
#include "messages/msg_schema.h"

#include <float.h>
#include <string.h>

#include "common/util.h"

/* ---- names (wire numbers are the array indexes) ---- */

static const char *const s_type_names[MSG_TYPE_COUNT] = {
    "none", "ready", "term", "heartbeat", "stats", "submit", "token", "done", "error", "cancel",
    "prefill_request", "handoff", "kv_announce", "kv_ack", "cache_lookup", "cache_lookup_reply",
    "cache_put", "cache_evict", "cache_pin", "cache_unpin", "cache_fetch", "cache_fetch_reply",
    "cache_event", "expert_load", "expert_placement", "draft_policy", "spec_report", "inspect",
    "inspect_reply", "kv_link",
};
static const char *const s_role_names[MSG_ROLE_COUNT] = {
    "none", "supervisor", "router", "prefill", "decode", "cache_manager", "expert_balancer",
    "draft_scheduler", "monitor", "client", "gateway",
};
static const char *const s_state_names[MSG_STATE_COUNT] = {"starting", "ready", "draining", "stopping"};
static const char *const s_metric_kind_names[MSG_METRIC_KIND_COUNT] = {"gauge", "counter"};
static const char *const s_chat_role_names[MSG_CHAT_ROLE_COUNT] = {"system", "user", "assistant", "tool"};
static const char *const s_finish_names[MSG_FINISH_COUNT] = {"stop", "length", "cancelled"};
static const char *const s_error_code_names[MSG_ERR_COUNT] = {
    "bad_request", "malformed", "overloaded", "unavailable", "timeout", "cancelled",
    "transfer_failed", "worker_lost", "internal",
};
static const char *const s_channel_names[MSG_CHAN_COUNT] = {"shm", "cuda_ipc", "nccl", "tcp"};
static const char *const s_ack_names[MSG_ACK_COUNT] = {"ok", "failed"};
static const char *const s_tier_names[MSG_TIER_COUNT] = {"device", "host", "disk"};
static const char *const s_cev_names[MSG_CEV_COUNT] = {"stored", "removed", "pinned", "expired"};
static const char *const s_inspect_names[MSG_INSPECT_COUNT] = {"actors", "actor", "cache", "experts"};
static const char *const s_dtype_names[DT_COUNT] = {"f32", "bf16", "f16", "fp8"};

/* Enum fields are read as unsigned int: every enum here has that storage. */
_Static_assert(sizeof(msg_role_t) == sizeof(unsigned) && sizeof(dtype_t) == sizeof(unsigned) &&
               sizeof(msg_tier_t) == sizeof(unsigned), "enum storage is not unsigned int");

#define NAME_OF(arr, v) ((unsigned)(v) < ARRAY_LEN(arr) ? arr[(unsigned)(v)] : "?")
const char *msg_type_name(msg_type_t t) { return NAME_OF(s_type_names, t); }
const char *msg_role_name(msg_role_t r) { return NAME_OF(s_role_names, r); }
const char *msg_state_name(msg_state_t s) { return NAME_OF(s_state_names, s); }
const char *msg_error_code_name(msg_error_code_t c) { return NAME_OF(s_error_code_names, c); }
const char *msg_finish_name(msg_finish_t f) { return NAME_OF(s_finish_names, f); }
const char *msg_channel_name(msg_channel_t c) { return NAME_OF(s_channel_names, c); }
const char *msg_tier_name(msg_tier_t t) { return NAME_OF(s_tier_names, t); }

static int s_parse(const char *const *names, unsigned n, const char *s, unsigned *out)
{
    for (unsigned i = 0; s && i < n; i++)
        if (strcmp(names[i], s) == 0) {
            *out = i;
            return 0;
        }
    return -1;
}

int msg_type_parse(const char *name, msg_type_t *out)
{
    unsigned v;
    if (s_parse(s_type_names, MSG_TYPE_COUNT, name, &v) < 0 || v == MSG_NONE)
        return -1;
    *out = (msg_type_t)v;
    return 0;
}

int msg_role_parse(const char *name, msg_role_t *out)
{
    unsigned v;
    if (s_parse(s_role_names, MSG_ROLE_COUNT, name, &v) < 0 || v == MSG_ROLE_NONE)
        return -1;
    *out = (msg_role_t)v;
    return 0;
}

/* ---- field table macros: (struct type, field name, flags, limits...) ---- */

#define F_BOOL(T, nm, fl) {.key = #nm, .kind = MSG_F_BOOL, .flags = (fl), .off = offsetof(T, nm)}
#define F_U32(T, nm, fl, l, h) \
    {.key = #nm, .kind = MSG_F_U32, .flags = (fl), .off = offsetof(T, nm), .lo = (l), .hi = (h)}
#define F_U64(T, nm, fl, l, h) \
    {.key = #nm, .kind = MSG_F_U64, .flags = (fl), .off = offsetof(T, nm), .lo = (l), .hi = (h)}
#define F_I64(T, nm, fl, l, h) \
    {.key = #nm, .kind = MSG_F_I64, .flags = (fl), .off = offsetof(T, nm), .ilo = (l), .ihi = (h)}
#define F_F32(T, nm, fl, l, h) \
    {.key = #nm, .kind = MSG_F_F32, .flags = (fl), .off = offsetof(T, nm), .flo = (l), .fhi = (h)}
#define F_F64(T, nm, fl, l, h) \
    {.key = #nm, .kind = MSG_F_F64, .flags = (fl), .off = offsetof(T, nm), .flo = (l), .fhi = (h)}
#define F_ENUM(T, nm, fl, l, names_) \
    {.key = #nm, .kind = MSG_F_ENUM, .flags = (fl), .off = offsetof(T, nm), .lo = (l), \
     .hi = ARRAY_LEN(names_), .names = (names_)}
#define F_STR(T, nm, fl, l, h) \
    {.key = #nm, .kind = MSG_F_STR, .flags = (fl), .off = offsetof(T, nm), .lo = (l), .hi = (h)}
#define F_BIN(T, nm, cnt, fl, h) \
    {.key = #nm, .kind = MSG_F_BIN, .flags = (fl), .off = offsetof(T, nm), \
     .count_off = offsetof(T, cnt), .hi = (h)}
#define F_ARR(K, T, nm, cnt, fl, l, h) \
    {.key = #nm, .kind = (K), .flags = (fl), .off = offsetof(T, nm), .count_off = offsetof(T, cnt), \
     .lo = (l), .hi = (h)}
#define F_U32A(T, nm, cnt, fl, l, h) F_ARR(MSG_F_U32_ARR, T, nm, cnt, fl, l, h)
#define F_U64A(T, nm, cnt, fl, l, h) F_ARR(MSG_F_U64_ARR, T, nm, cnt, fl, l, h)
#define F_F32A(T, nm, cnt, fl, l, h, fl_, fh_) \
    {.key = #nm, .kind = MSG_F_F32_ARR, .flags = (fl), .off = offsetof(T, nm), \
     .count_off = offsetof(T, cnt), .lo = (l), .hi = (h), .flo = (fl_), .fhi = (fh_)}
#define F_STRA(T, nm, cnt, fl, l, h, el, eh) \
    {.key = #nm, .kind = MSG_F_STR_ARR, .flags = (fl), .off = offsetof(T, nm), \
     .count_off = offsetof(T, cnt), .lo = (l), .hi = (h), .elo = (el), .ehi = (eh)}
#define F_STRUCT(T, nm, fl, sub_) \
    {.key = #nm, .kind = MSG_F_STRUCT, .flags = (fl), .off = offsetof(T, nm), .sub = &(sub_)}
#define F_STRUCTA(T, nm, cnt, fl, l, h, sub_) \
    {.key = #nm, .kind = MSG_F_STRUCT_ARR, .flags = (fl), .off = offsetof(T, nm), \
     .count_off = offsetof(T, cnt), .lo = (l), .hi = (h), .sub = &(sub_)}

#define SCHEMA(nm, T, tbl, dflt, chk) \
    {.name = (nm), .size = sizeof(T), .fields = (tbl), .n_fields = ARRAY_LEN(tbl), .defaults = (dflt), \
     .check = (chk)}

#define REQ MSG_FIELD_REQ
#define U32MAX UINT32_MAX
#define U64MAX UINT64_MAX

/* ---- cross-field rules ---- */

static int s_retention_needs_key(const char *path, uint32_t retention_s, const char *key, char *err,
                                 size_t errlen)
{
    if (retention_s > 0 && !key)
        return errf(err, errlen, "%s.cache_retention_s: %u s of retention needs a prompt_cache_key",
                    path, retention_s);
    return 0;
}

static void s_sampling_defaults(void *p)
{
    msg_sampling_t *s = p;
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
    s->seed = -1;
    s->max_tokens = 256;
}

static int s_sampling_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_sampling_t *s = p;
    if (!(s->top_p > 0.0f))
        return errf(err, errlen, "%s.top_p: %g must be greater than 0", path, (double)s->top_p);
    if (!(s->repetition_penalty > 0.0f))
        return errf(err, errlen, "%s.repetition_penalty: %g must be greater than 0", path,
                    (double)s->repetition_penalty);
    if (s->top_logprobs > 0 && !s->logprobs)
        return errf(err, errlen, "%s.top_logprobs: %u needs logprobs set", path, s->top_logprobs);
    return 0;
}

static int s_usage_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_usage_t *u = p;
    if (u->cached_tokens > u->prompt_tokens)
        return errf(err, errlen, "%s.cached_tokens: %u exceeds prompt_tokens %u", path, u->cached_tokens,
                    u->prompt_tokens);
    /* All 0: a sender that does not split cached_tokens by source. */
    const uint64_t split = (uint64_t)u->cached_device_tokens + u->cached_host_tokens + u->cached_disk_tokens;
    if (split != 0 && split != u->cached_tokens)
        return errf(err, errlen, "%s.cached_device_tokens: device %u + host %u + disk %u = %llu, not cached_tokens %u",
                    path, u->cached_device_tokens, u->cached_host_tokens, u->cached_disk_tokens,
                    (unsigned long long)split, u->cached_tokens);
    return 0;
}

static int s_submit_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_submit_t *s = p;
    int forms = (s->prompt != NULL) + (s->n_messages > 0) + (s->n_tokens > 0);
    if (forms != 1)
        return errf(err, errlen, "%s.prompt: exactly one of prompt, messages, tokens is required (got %d)",
                    path, forms);
    return s_retention_needs_key(path, s->cache_retention_s, s->prompt_cache_key, err, errlen);
}

/* Alternatives: n_ids ids and n_lps logprobs in rows of k, each row most likely first. */
static int s_top_check(const char *path, const char *ids, uint32_t n_ids, const char *lps, const float *lp,
                       uint32_t n_lps, uint32_t k, char *err, size_t errlen)
{
    if (n_ids != n_lps)
        return errf(err, errlen, "%s.%s: %u entries for %u %s", path, lps, n_lps, n_ids, ids);
    for (uint32_t i = 1; i < n_lps; i++)
        if (i % k && lp[i] > lp[i - 1])
            return errf(err, errlen, "%s.%s[%u]: %g above the %g before it (most likely first)", path, lps, i,
                        (double)lp[i], (double)lp[i - 1]);
    return 0;
}

static int s_token_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_token_t *t = p;
    if (t->n_logprobs != 0 && t->n_logprobs != t->n_tokens)
        return errf(err, errlen, "%s.logprobs: %u entries for %u tokens", path, t->n_logprobs, t->n_tokens);
    if (t->n_top_tokens == 0 && t->n_top_logprobs == 0)
        return 0;
    if (t->n_logprobs == 0)
        return errf(err, errlen, "%s.top_tokens: alternatives without the tokens' logprobs", path);
    const uint32_t k = t->n_top_tokens / t->n_tokens;
    if (t->n_top_tokens % t->n_tokens || k > MSG_MAX_LOGPROBS)
        return errf(err, errlen, "%s.top_tokens: %u entries are not 1..%u per token for %u tokens", path,
                    t->n_top_tokens, MSG_MAX_LOGPROBS, t->n_tokens);
    return s_top_check(path, "top_tokens", t->n_top_tokens, "top_logprobs", t->top_logprobs, t->n_top_logprobs,
                       k ? k : 1, err, errlen);
}

static int s_done_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_done_t *d = p;
    if (d->n_logprobs != 0 && d->n_logprobs != d->n_tokens)
        return errf(err, errlen, "%s.logprobs: %u entries for %u tokens", path, d->n_logprobs, d->n_tokens);
    return 0;
}

static int s_prefill_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_prefill_request_t *r = p;
    return s_retention_needs_key(path, r->cache_retention_s, r->prompt_cache_key, err, errlen);
}

static int s_handoff_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_handoff_t *h = p;
    if (h->n_first_top_tokens > h->sampling.top_logprobs)
        return errf(err, errlen, "%s.first_top_tokens: %u alternatives, sampling.top_logprobs asks for %u", path,
                    h->n_first_top_tokens, h->sampling.top_logprobs);
    if (s_top_check(path, "first_top_tokens", h->n_first_top_tokens, "first_top_logprobs", h->first_top_logprobs,
                    h->n_first_top_logprobs, MSG_MAX_LOGPROBS, err, errlen) != 0)
        return -1;
    if (h->kv_tokens > h->n_tokens)
        return errf(err, errlen, "%s.kv_tokens: %u exceeds the %u prompt tokens", path, h->kv_tokens,
                    h->n_tokens);
    if (h->cached_tokens > h->n_tokens)
        return errf(err, errlen, "%s.cached_tokens: %u exceeds the %u prompt tokens", path,
                    h->cached_tokens, h->n_tokens);
    if ((uint64_t)h->cached_host_tokens + h->cached_disk_tokens > h->cached_tokens)
        return errf(err, errlen, "%s.cached_host_tokens: host %u + disk %u exceed cached_tokens %u", path,
                    h->cached_host_tokens, h->cached_disk_tokens, h->cached_tokens);
    if (h->n_kv && h->prefill_worker && strcmp(h->kv->src, h->prefill_worker) != 0)
        return errf(err, errlen, "%s.kv.src: %s, but the hand-off comes from %s", path, h->kv->src,
                    h->prefill_worker);
    return s_retention_needs_key(path, h->cache_retention_s, h->prompt_cache_key, err, errlen);
}

static int s_fetch_reply_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_cache_fetch_reply_t *r = p;
    if (r->found_disk > r->found)
        return errf(err, errlen, "%s.found_disk: %u exceeds found %u", path, r->found_disk, r->found);
    const uint32_t words = r->found_disk ? (r->found + 63) / 64 : 0;
    if (r->n_disk_mask != words)
        return errf(err, errlen, "%s.disk_mask: %u words, expected %u for %u blocks found, %u from disk", path,
                    r->n_disk_mask, words, r->found, r->found_disk);
    uint32_t bits = 0;
    for (uint32_t i = 0; i < r->n_disk_mask; i++) {
        uint64_t w = r->disk_mask[i];
        if (i == r->n_disk_mask - 1 && r->found % 64 && w >> (r->found % 64))
            return errf(err, errlen, "%s.disk_mask[%u]: bits set past the %u blocks found", path, i, r->found);
        bits += (uint32_t)__builtin_popcountll(w);
    }
    if (bits != r->found_disk)
        return errf(err, errlen, "%s.disk_mask: %u bits set, found_disk says %u", path, bits, r->found_disk);
    return 0;
}

static int s_kv_announce_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_kv_announce_t *a = p;
    if (a->handle_len == 0)   /* every channel names where its bytes are: segment, pool, link or endpoint */
        return errf(err, errlen, "%s.handle: required for a %s channel", path, msg_channel_name(a->channel));
    return 0;
}

static int s_kv_link_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_kv_link_t *k = p;
    if (k->status == MSG_ACK_FAILED && !k->message)
        return errf(err, errlen, "%s.message: required when status is failed", path);
    if (k->status == MSG_ACK_OK && k->handle_len == 0)
        return errf(err, errlen, "%s.handle: an offer needs the channel's bootstrap", path);
    if (k->rank >= k->n_ranks)
        return errf(err, errlen, "%s.rank: %u is not below n_ranks %u", path, k->rank, k->n_ranks);
    return 0;
}

static int s_kv_ack_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_kv_ack_t *a = p;
    if (a->status == MSG_ACK_FAILED && !a->message)
        return errf(err, errlen, "%s.message: required when status is failed", path);
    return 0;
}

static int s_placement_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_expert_placement_t *e = p;
    uint64_t slots = (uint64_t)e->n_layers * e->n_experts;
    if (e->n_offsets != slots + 1)
        return errf(err, errlen, "%s.offsets: %u entries, expected n_layers * n_experts + 1 = %llu", path,
                    e->n_offsets, (unsigned long long)(slots + 1));
    if (e->offsets[0] != 0)
        return errf(err, errlen, "%s.offsets[0]: %u, must be 0", path, e->offsets[0]);
    for (uint32_t i = 1; i < e->n_offsets; i++)
        if (e->offsets[i] <= e->offsets[i - 1])
            return errf(err, errlen, "%s.offsets[%u]: %u not above offsets[%u] = %u (layer %llu expert %llu "
                        "needs at least one replica)", path, i, e->offsets[i], i - 1, e->offsets[i - 1],
                        (unsigned long long)((i - 1) / e->n_experts), (unsigned long long)((i - 1) % e->n_experts));
    if (e->offsets[e->n_offsets - 1] != e->n_replicas)
        return errf(err, errlen, "%s.offsets[%u]: %u, must equal the %u replicas", path, e->n_offsets - 1,
                    e->offsets[e->n_offsets - 1], e->n_replicas);
    for (uint32_t i = 0; i < e->n_replicas; i++)
        if (e->replicas[i] >= e->n_workers)
            return errf(err, errlen, "%s.replicas[%u]: worker index %u, only %u workers", path, i,
                        e->replicas[i], e->n_workers);
    return 0;
}

static int s_draft_policy_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_draft_policy_t *d = p;
    for (uint32_t i = 0; i < d->n_buckets; i++) {
        if (i > 0 && d->buckets[i].max_batch <= d->buckets[i - 1].max_batch)
            return errf(err, errlen, "%s.buckets[%u].max_batch: %u not above the previous bucket's %u", path,
                        i, d->buckets[i].max_batch, d->buckets[i - 1].max_batch);
        if (d->buckets[i].max_draft > d->max_k)
            return errf(err, errlen, "%s.buckets[%u].max_draft: %u exceeds max_k %u", path, i,
                        d->buckets[i].max_draft, d->max_k);
    }
    for (uint32_t i = 1; i < d->n_survival; i++)
        if (d->survival[i] > d->survival[i - 1])
            return errf(err, errlen, "%s.survival[%u]: %g exceeds position %u's %g (a longer prefix cannot "
                        "survive more often)", path, i, (double)d->survival[i], i - 1, (double)d->survival[i - 1]);
    return 0;
}

/* A[i] <= B[i] (a subset's counts) for arrays of equal length, and both non-increasing when asked. */
static int s_counts_check(const char *path, const char *an, const uint64_t *a, uint32_t na, const char *bn,
                          const uint64_t *b, uint32_t nb, int decreasing, char *err, size_t errlen)
{
    if (na != nb)
        return errf(err, errlen, "%s.%s: %u entries, %s has %u", path, an, na, bn, nb);
    for (uint32_t i = 0; i < na; i++) {
        if (a[i] > b[i])
            return errf(err, errlen, "%s.%s[%u]: %llu exceeds %s[%u] = %llu", path, an, i, (unsigned long long)a[i],
                        bn, i, (unsigned long long)b[i]);
        if (decreasing && i > 0 && (a[i] > a[i - 1] || b[i] > b[i - 1]))
            return errf(err, errlen, "%s.%s[%u]: position %u counts more than position %u (a draft is verified "
                        "only after every earlier one was accepted)", path, a[i] > a[i - 1] ? an : bn, i, i, i - 1);
    }
    return 0;
}

static int s_spec_report_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_spec_report_t *d = p;
    if (d->accepted > d->drafts)
        return errf(err, errlen, "%s.accepted: %llu exceeds drafts %llu", path,
                    (unsigned long long)d->accepted, (unsigned long long)d->drafts);
    if (s_counts_check(path, "accepted_at", d->accepted_at, d->n_accepted_at, "proposed_at", d->proposed_at,
                       d->n_proposed_at, 1, err, errlen) != 0 ||
        s_counts_check(path, "conf_accepted", d->conf_accepted, d->n_conf_accepted, "conf_seen", d->conf_seen,
                       d->n_conf_seen, 0, err, errlen) != 0)
        return -1;
    const uint32_t n = d->n_cost_batch;
    if (d->n_cost_drafts != n || d->n_cost_steps != n || d->n_cost_us != n)
        return errf(err, errlen, "%s.cost_*: cost_batch has %u entries, cost_drafts %u, cost_steps %u, cost_us %u "
                    "(one per cell in each)", path, n, d->n_cost_drafts, d->n_cost_steps, d->n_cost_us);
    for (uint32_t i = 0; i < n; i++) {
        if (d->cost_batch[i] < 1)
            return errf(err, errlen, "%s.cost_batch[%u]: 0, a step has at least one row", path, i);
        if (d->cost_drafts[i] > MSG_MAX_DRAFT_POS)
            return errf(err, errlen, "%s.cost_drafts[%u]: %u above %u", path, i, d->cost_drafts[i], MSG_MAX_DRAFT_POS);
        if (d->cost_steps[i] < 1)
            return errf(err, errlen, "%s.cost_steps[%u]: 0, a cell has at least one step", path, i);
    }
    if ((d->n_cost_rows != 0 && d->n_cost_rows != n) || d->n_cost_tokens != d->n_cost_rows)
        return errf(err, errlen, "%s.cost_rows: %u entries, cost_tokens %u, cost_batch %u (none, or one per cell in each)",
                    path, d->n_cost_rows, d->n_cost_tokens, n);
    for (uint32_t i = 0; i < d->n_cost_rows; i++)
        if (d->cost_rows[i] < d->cost_steps[i])
            return errf(err, errlen, "%s.cost_rows[%u]: %llu rows in %llu steps, a step has at least one row", path, i,
                        (unsigned long long)d->cost_rows[i], (unsigned long long)d->cost_steps[i]);
    return 0;
}

static int s_inspect_check(const void *p, const char *path, char *err, size_t errlen)
{
    const msg_inspect_t *q = p;
    if (q->what == MSG_INSPECT_ACTOR && !q->name)
        return errf(err, errlen, "%s.name: required when what is actor", path);
    return 0;
}

/* ---- nested structs ---- */

static const msg_field_t s_queue_f[] = {
    F_STR(msg_queue_depth_t, name, REQ, 1, MSG_MAX_NAME),
    F_U64(msg_queue_depth_t, depth, 0, 0, U64MAX),
    F_U64(msg_queue_depth_t, capacity, 0, 0, U64MAX),
};
static const msg_schema_t s_queue_s = SCHEMA("queue", msg_queue_depth_t, s_queue_f, NULL, NULL);

static const msg_field_t s_metric_f[] = {
    F_STR(msg_metric_t, name, REQ, 1, MSG_MAX_NAME),
    F_F64(msg_metric_t, value, REQ, -DBL_MAX, DBL_MAX),
    F_ENUM(msg_metric_t, kind, 0, 0, s_metric_kind_names),
};
static const msg_schema_t s_metric_s = SCHEMA("metric", msg_metric_t, s_metric_f, NULL, NULL);

static const msg_field_t s_chat_f[] = {
    F_ENUM(msg_chat_t, role, REQ, 0, s_chat_role_names),
    F_STR(msg_chat_t, content, REQ, 0, MSG_MAX_PROMPT_BYTES),
};
static const msg_schema_t s_chat_s = SCHEMA("chat", msg_chat_t, s_chat_f, NULL, NULL);

static const msg_field_t s_sampling_f[] = {
    F_F32(msg_sampling_t, temperature, 0, 0.0, MSG_MAX_TEMPERATURE),
    F_U32(msg_sampling_t, top_k, 0, 0, 1u << 20),
    F_F32(msg_sampling_t, top_p, 0, 0.0, 1.0),
    F_F32(msg_sampling_t, min_p, 0, 0.0, 1.0),
    F_F32(msg_sampling_t, repetition_penalty, 0, 0.0, 10.0),
    F_F32(msg_sampling_t, presence_penalty, 0, -2.0, 2.0),
    F_F32(msg_sampling_t, frequency_penalty, 0, -2.0, 2.0),
    F_I64(msg_sampling_t, seed, 0, -1, INT64_MAX),
    F_U32(msg_sampling_t, max_tokens, 0, 1, MSG_MAX_NEW_TOKENS),
    F_STRA(msg_sampling_t, stop, n_stop, 0, 0, MSG_MAX_STOP, 1, MSG_MAX_NAME),
    F_U32A(msg_sampling_t, stop_token_ids, n_stop_token_ids, 0, 0, MSG_MAX_STOP_TOKENS),
    F_BOOL(msg_sampling_t, ignore_eos, 0),
    F_BOOL(msg_sampling_t, logprobs, 0),
    F_U32(msg_sampling_t, top_logprobs, 0, 0, MSG_MAX_LOGPROBS),
};
static const msg_schema_t s_sampling_s =
    SCHEMA("sampling", msg_sampling_t, s_sampling_f, s_sampling_defaults, s_sampling_check);

static const msg_field_t s_usage_f[] = {
    F_U32(msg_usage_t, prompt_tokens, 0, 0, U32MAX),
    F_U32(msg_usage_t, cached_tokens, 0, 0, U32MAX),
    F_U32(msg_usage_t, completion_tokens, 0, 0, U32MAX),
    F_U32(msg_usage_t, cached_device_tokens, 0, 0, U32MAX),
    F_U32(msg_usage_t, cached_host_tokens, 0, 0, U32MAX),
    F_U32(msg_usage_t, cached_disk_tokens, 0, 0, U32MAX),
};
static const msg_schema_t s_usage_s = SCHEMA("usage", msg_usage_t, s_usage_f, NULL, s_usage_check);

static const msg_field_t s_timings_f[] = {
    F_U32(msg_timings_t, queue_ms, 0, 0, U32MAX),
    F_U32(msg_timings_t, prefill_ms, 0, 0, U32MAX),
    F_U32(msg_timings_t, ttft_ms, 0, 0, U32MAX),
    F_U32(msg_timings_t, decode_ms, 0, 0, U32MAX),
    F_U32(msg_timings_t, e2e_ms, 0, 0, U32MAX),
};
static const msg_schema_t s_timings_s = SCHEMA("timings", msg_timings_t, s_timings_f, NULL, NULL);

static const msg_field_t s_holder_f[] = {
    F_STR(msg_cache_holder_t, holder, REQ, 1, MSG_MAX_NAME),
    F_ENUM(msg_cache_holder_t, tier, 0, 0, s_tier_names),
    F_U32(msg_cache_holder_t, matched_blocks, 0, 0, MSG_MAX_BLOCKS),
};
static const msg_schema_t s_holder_s = SCHEMA("holder", msg_cache_holder_t, s_holder_f, NULL, NULL);

static const msg_field_t s_bucket_f[] = {
    F_U32(msg_draft_bucket_t, max_batch, REQ, 1, 1u << 20),
    F_U32(msg_draft_bucket_t, max_draft, 0, 0, MSG_MAX_DRAFT_POS),
    F_F32(msg_draft_bucket_t, min_confidence, 0, 0.0, 1.0),
};
static const msg_schema_t s_bucket_s = SCHEMA("bucket", msg_draft_bucket_t, s_bucket_f, NULL, NULL);

/* ---- message payloads ---- */

static const msg_field_t s_ready_f[] = {
    F_ENUM(msg_ready_t, role, REQ, 1, s_role_names),
    F_STR(msg_ready_t, name, REQ, 1, MSG_MAX_NAME),
    F_U32(msg_ready_t, pid, 0, 0, U32MAX),
    F_STR(msg_ready_t, endpoint, 0, 1, MSG_MAX_NAME),
};

static const msg_field_t s_term_f[] = {
    F_STR(msg_term_t, reason, 0, 0, MSG_MAX_TEXT),
    F_U32(msg_term_t, grace_ms, 0, 0, U32MAX),
};

static const msg_field_t s_heartbeat_f[] = {
    F_U64(msg_heartbeat_t, seq, 0, 0, U64MAX),
    F_U64(msg_heartbeat_t, steps, 0, 0, U64MAX),
    F_U64(msg_heartbeat_t, msgs_in, 0, 0, U64MAX),
    F_U64(msg_heartbeat_t, msgs_out, 0, 0, U64MAX),
    F_U32(msg_heartbeat_t, inflight, 0, 0, U32MAX),
};

static const msg_field_t s_stats_f[] = {
    F_ENUM(msg_stats_t, role, REQ, 1, s_role_names),
    F_STR(msg_stats_t, name, REQ, 1, MSG_MAX_NAME),
    F_U32(msg_stats_t, pid, 0, 0, U32MAX),
    F_U64(msg_stats_t, uptime_ms, 0, 0, U64MAX),
    F_ENUM(msg_stats_t, state, 0, 0, s_state_names),
    F_U32(msg_stats_t, restarts, 0, 0, U32MAX),
    F_U64(msg_stats_t, msgs_in, 0, 0, U64MAX),
    F_U64(msg_stats_t, msgs_out, 0, 0, U64MAX),
    F_U64(msg_stats_t, malformed, 0, 0, U64MAX),
    F_STRUCTA(msg_stats_t, queues, n_queues, 0, 0, MSG_MAX_QUEUES, s_queue_s),
    F_STRUCTA(msg_stats_t, metrics, n_metrics, 0, 0, MSG_MAX_METRICS, s_metric_s),
};
static const msg_schema_t s_stats_s = SCHEMA("stats", msg_stats_t, s_stats_f, NULL, NULL);

static const msg_field_t s_submit_f[] = {
    F_STR(msg_submit_t, prompt, 0, 0, MSG_MAX_PROMPT_BYTES),
    F_STRUCTA(msg_submit_t, messages, n_messages, 0, 0, MSG_MAX_CHAT_MESSAGES, s_chat_s),
    F_U32A(msg_submit_t, tokens, n_tokens, 0, 0, MSG_MAX_PROMPT_TOKENS),
    F_STR(msg_submit_t, model, 0, 1, MSG_MAX_NAME),
    F_STRUCT(msg_submit_t, sampling, 0, s_sampling_s),
    F_BOOL(msg_submit_t, stream, 0),
    F_STR(msg_submit_t, prompt_cache_key, 0, 1, MSG_MAX_NAME),
    F_U32(msg_submit_t, cache_retention_s, 0, 0, MSG_MAX_RETENTION_S),
    F_U32(msg_submit_t, timeout_ms, 0, 0, U32MAX),
    F_STR(msg_submit_t, tenant, 0, 1, MSG_MAX_NAME),
};

static const msg_field_t s_token_f[] = {
    F_U32(msg_token_t, seq, 0, 0, U32MAX),
    F_U32A(msg_token_t, tokens, n_tokens, REQ, 1, MSG_MAX_TOKEN_CHUNK),
    F_STR(msg_token_t, text, 0, 0, MSG_MAX_PIECE),
    F_F32A(msg_token_t, logprobs, n_logprobs, 0, 0, MSG_MAX_TOKEN_CHUNK, -FLT_MAX, 0.0),
    F_U32A(msg_token_t, top_tokens, n_top_tokens, 0, 0, MSG_MAX_TOKEN_CHUNK * MSG_MAX_LOGPROBS),
    F_F32A(msg_token_t, top_logprobs, n_top_logprobs, 0, 0, MSG_MAX_TOKEN_CHUNK * MSG_MAX_LOGPROBS, -FLT_MAX, 0.0),
};

static const msg_field_t s_done_f[] = {
    F_ENUM(msg_done_t, finish, REQ, 0, s_finish_names),
    F_STRUCT(msg_done_t, usage, 0, s_usage_s),
    F_STRUCT(msg_done_t, timings, 0, s_timings_s),
    F_U32A(msg_done_t, tokens, n_tokens, 0, 0, MSG_MAX_NEW_TOKENS),
    F_STR(msg_done_t, text, 0, 0, MSG_MAX_COMPLETION_TEXT),
    F_F32A(msg_done_t, logprobs, n_logprobs, 0, 0, MSG_MAX_NEW_TOKENS, -FLT_MAX, 0.0),
};

static const msg_field_t s_error_f[] = {
    F_ENUM(msg_error_t, code, REQ, 0, s_error_code_names),
    F_STR(msg_error_t, message, REQ, 1, MSG_MAX_TEXT),
    F_BOOL(msg_error_t, retryable, 0),
    F_STR(msg_error_t, field, 0, 1, MSG_MAX_NAME),
};

static const msg_field_t s_prefill_f[] = {
    F_U32A(msg_prefill_request_t, tokens, n_tokens, REQ, 1, MSG_MAX_PROMPT_TOKENS),
    F_STRUCT(msg_prefill_request_t, sampling, 0, s_sampling_s),
    F_STR(msg_prefill_request_t, decode_worker, REQ, 1, MSG_MAX_NAME),
    F_STR(msg_prefill_request_t, reply_to, REQ, 1, MSG_MAX_NAME),
    F_U64(msg_prefill_request_t, tenant_salt, 0, 0, U64MAX),
    F_U64(msg_prefill_request_t, client_key, 0, 0, U64MAX),
    F_STR(msg_prefill_request_t, prompt_cache_key, 0, 1, MSG_MAX_NAME),
    F_U32(msg_prefill_request_t, cache_retention_s, 0, 0, MSG_MAX_RETENTION_S),
    F_U64A(msg_prefill_request_t, hint_hashes, n_hint_hashes, 0, 0, MSG_MAX_BLOCKS),
    F_STRUCTA(msg_prefill_request_t, hint_holders, n_hint_holders, 0, 0, MSG_MAX_HOLDERS, s_holder_s),
    F_U64(msg_prefill_request_t, deadline_ms, 0, 0, U64MAX),
    F_U32(msg_prefill_request_t, queue_ms, 0, 0, U32MAX),
};

static const msg_field_t s_kv_announce_f[] = {
    F_U64(msg_kv_announce_t, transfer_id, REQ, 0, U64MAX),
    F_U64(msg_kv_announce_t, request_id, 0, 0, U64MAX),
    F_U32(msg_kv_announce_t, seq, 0, 0, U32MAX),
    F_BOOL(msg_kv_announce_t, last, 0),
    F_ENUM(msg_kv_announce_t, channel, REQ, 0, s_channel_names),
    F_U32(msg_kv_announce_t, n_layers, REQ, 1, MSG_MAX_LAYERS),
    F_U32(msg_kv_announce_t, block_size, REQ, 1, 65536),
    F_U32(msg_kv_announce_t, n_kv_heads, REQ, 1, 1024),
    F_U32(msg_kv_announce_t, head_dim, REQ, 1, 4096),
    F_ENUM(msg_kv_announce_t, dtype, REQ, 0, s_dtype_names),
    F_U32A(msg_kv_announce_t, block_ids, n_block_ids, REQ, 1, MSG_MAX_BLOCKS),
    F_U64(msg_kv_announce_t, total_bytes, REQ, 1, U64MAX),
    F_BIN(msg_kv_announce_t, handle, handle_len, 0, MSG_MAX_HANDLE),
    F_STR(msg_kv_announce_t, src, REQ, 1, MSG_MAX_NAME),
    F_U64(msg_kv_announce_t, deadline_ms, 0, 0, U64MAX),
};
static const msg_schema_t s_kv_announce_s =
    SCHEMA("kv_announce", msg_kv_announce_t, s_kv_announce_f, NULL, s_kv_announce_check);

static const msg_field_t s_handoff_f[] = {
    F_U32A(msg_handoff_t, tokens, n_tokens, REQ, 1, MSG_MAX_PROMPT_TOKENS),
    F_U32(msg_handoff_t, first_token, REQ, 0, U32MAX),
    F_F32(msg_handoff_t, first_logprob, 0, -FLT_MAX, 0.0),
    F_U32A(msg_handoff_t, first_top_tokens, n_first_top_tokens, 0, 0, MSG_MAX_LOGPROBS),
    F_F32A(msg_handoff_t, first_top_logprobs, n_first_top_logprobs, 0, 0, MSG_MAX_LOGPROBS, -FLT_MAX, 0.0),
    F_STRUCT(msg_handoff_t, sampling, 0, s_sampling_s),
    F_U32(msg_handoff_t, tokens_left, 0, 0, MSG_MAX_NEW_TOKENS),
    F_U32(msg_handoff_t, kv_tokens, 0, 0, MSG_MAX_PROMPT_TOKENS),
    F_U32(msg_handoff_t, block_size, REQ, 1, 65536),
    F_STR(msg_handoff_t, reply_to, REQ, 1, MSG_MAX_NAME),
    F_STR(msg_handoff_t, prefill_worker, REQ, 1, MSG_MAX_NAME),
    F_U64(msg_handoff_t, tenant_salt, 0, 0, U64MAX),
    F_U64(msg_handoff_t, client_key, 0, 0, U64MAX),
    F_STR(msg_handoff_t, prompt_cache_key, 0, 1, MSG_MAX_NAME),
    F_U32(msg_handoff_t, cache_retention_s, 0, 0, MSG_MAX_RETENTION_S),
    F_U32(msg_handoff_t, cached_tokens, 0, 0, MSG_MAX_PROMPT_TOKENS),
    F_U32(msg_handoff_t, cached_host_tokens, 0, 0, MSG_MAX_PROMPT_TOKENS),
    F_U32(msg_handoff_t, cached_disk_tokens, 0, 0, MSG_MAX_PROMPT_TOKENS),
    F_U32(msg_handoff_t, queue_ms, 0, 0, U32MAX),
    F_U32(msg_handoff_t, prefill_ms, 0, 0, U32MAX),
    F_U64(msg_handoff_t, deadline_ms, 0, 0, U64MAX),
    F_STRUCTA(msg_handoff_t, kv, n_kv, 0, 0, 1, s_kv_announce_s),
};


static const msg_field_t s_kv_ack_f[] = {
    F_U64(msg_kv_ack_t, transfer_id, REQ, 0, U64MAX),
    F_U32(msg_kv_ack_t, seq, 0, 0, U32MAX),
    F_ENUM(msg_kv_ack_t, status, REQ, 0, s_ack_names),
    F_STR(msg_kv_ack_t, message, 0, 1, MSG_MAX_TEXT),
    F_U32A(msg_kv_ack_t, dst_block_ids, n_dst_block_ids, 0, 0, MSG_MAX_BLOCKS),
};

static const msg_field_t s_kv_link_f[] = {
    F_U64(msg_kv_link_t, link_id, REQ, 0, U64MAX),
    F_ENUM(msg_kv_link_t, channel, REQ, 0, s_channel_names),
    F_ENUM(msg_kv_link_t, status, REQ, 0, s_ack_names),
    F_BIN(msg_kv_link_t, handle, handle_len, 0, MSG_MAX_HANDLE),
    F_U32(msg_kv_link_t, n_ranks, REQ, 1, MSG_MAX_WORKERS),
    F_U32(msg_kv_link_t, rank, 0, 0, MSG_MAX_WORKERS - 1),
    F_STR(msg_kv_link_t, src, REQ, 1, MSG_MAX_NAME),
    F_STR(msg_kv_link_t, message, 0, 1, MSG_MAX_TEXT),
    F_U64(msg_kv_link_t, deadline_ms, 0, 0, U64MAX),
};

static const msg_field_t s_cache_lookup_f[] = {
    F_U64(msg_cache_lookup_t, tenant_salt, 0, 0, U64MAX),
    F_U64A(msg_cache_lookup_t, hashes, n_hashes, REQ, 1, MSG_MAX_BLOCKS),
};

static const msg_field_t s_cache_lookup_reply_f[] = {
    F_STRUCTA(msg_cache_lookup_reply_t, holders, n_holders, 0, 0, MSG_MAX_HOLDERS, s_holder_s),
};

static const msg_field_t s_cache_put_f[] = {
    F_STR(msg_cache_put_t, holder, REQ, 1, MSG_MAX_NAME),
    F_ENUM(msg_cache_put_t, tier, 0, 0, s_tier_names),
    F_U64A(msg_cache_put_t, hashes, n_hashes, REQ, 1, MSG_MAX_BLOCKS),
    F_U64(msg_cache_put_t, parent_hash, 0, 0, U64MAX),
    F_U32(msg_cache_put_t, pool_blocks, 0, 0, 1u << 26),
};

static const msg_field_t s_cache_evict_f[] = {
    F_STR(msg_cache_evict_t, holder, REQ, 1, MSG_MAX_NAME),
    F_ENUM(msg_cache_evict_t, tier, 0, 0, s_tier_names),
    F_U64A(msg_cache_evict_t, hashes, n_hashes, REQ, 1, MSG_MAX_BLOCKS),
};

static const msg_field_t s_cache_pin_f[] = {
    F_STR(msg_cache_pin_t, tenant, 0, 1, MSG_MAX_NAME),
    F_STR(msg_cache_pin_t, prompt_cache_key, REQ, 1, MSG_MAX_NAME),
    F_U64A(msg_cache_pin_t, hashes, n_hashes, REQ, 1, MSG_MAX_BLOCKS),
    F_U64(msg_cache_pin_t, expires_in_ms, REQ, 1, (uint64_t)MSG_MAX_RETENTION_S * 1000u),
};

static const msg_field_t s_cache_unpin_f[] = {
    F_STR(msg_cache_unpin_t, tenant, 0, 1, MSG_MAX_NAME),
    F_STR(msg_cache_unpin_t, prompt_cache_key, REQ, 1, MSG_MAX_NAME),
    F_U64A(msg_cache_unpin_t, hashes, n_hashes, 0, 0, MSG_MAX_BLOCKS),
};

static const msg_field_t s_cache_fetch_f[] = {
    F_U64A(msg_cache_fetch_t, hashes, n_hashes, REQ, 1, MSG_MAX_BLOCKS),
    F_ENUM(msg_cache_fetch_t, channel, REQ, 0, s_channel_names),
    F_STR(msg_cache_fetch_t, reply_to, REQ, 1, MSG_MAX_NAME),
    F_BIN(msg_cache_fetch_t, handle, handle_len, 0, MSG_MAX_HANDLE),
    F_F32(msg_cache_fetch_t, block_budget_ms, 0, 0, 1e6),
};

static const msg_field_t s_cache_fetch_reply_f[] = {
    F_U32(msg_cache_fetch_reply_t, found, 0, 0, MSG_MAX_BLOCKS),
    F_U64(msg_cache_fetch_reply_t, transfer_id, 0, 0, U64MAX),
    F_U32(msg_cache_fetch_reply_t, found_disk, 0, 0, MSG_MAX_BLOCKS),
    F_U64A(msg_cache_fetch_reply_t, disk_mask, n_disk_mask, 0, 0, MSG_MAX_BLOCKS / 64),
};

static const msg_field_t s_cache_event_f[] = {
    F_ENUM(msg_cache_event_t, kind, REQ, 0, s_cev_names),
    F_STR(msg_cache_event_t, holder, REQ, 1, MSG_MAX_NAME),
    F_ENUM(msg_cache_event_t, tier, 0, 0, s_tier_names),
    F_U64A(msg_cache_event_t, hashes, n_hashes, REQ, 1, MSG_MAX_BLOCKS),
};

static const msg_field_t s_expert_load_f[] = {
    F_STR(msg_expert_load_t, worker, REQ, 1, MSG_MAX_NAME),
    F_U32(msg_expert_load_t, layer, 0, 0, MSG_MAX_LAYERS - 1),
    F_U64A(msg_expert_load_t, counts, n_counts, REQ, 1, MSG_MAX_EXPERTS),
    F_U32(msg_expert_load_t, window_ms, 0, 0, U32MAX),
};

static const msg_field_t s_expert_placement_f[] = {
    F_U64(msg_expert_placement_t, epoch, 0, 0, U64MAX),
    F_U32(msg_expert_placement_t, n_layers, REQ, 1, MSG_MAX_LAYERS),
    F_U32(msg_expert_placement_t, n_experts, REQ, 1, MSG_MAX_EXPERTS),
    F_U32A(msg_expert_placement_t, offsets, n_offsets, REQ, 2, MSG_MAX_LAYERS * MSG_MAX_EXPERTS + 1),
    F_U32A(msg_expert_placement_t, replicas, n_replicas, REQ, 1, MSG_MAX_REPLICAS),
    F_STRA(msg_expert_placement_t, workers, n_workers, REQ, 1, MSG_MAX_WORKERS, 1, MSG_MAX_NAME),
};

static const msg_field_t s_draft_policy_f[] = {
    F_U64(msg_draft_policy_t, epoch, 0, 0, U64MAX),
    F_U32(msg_draft_policy_t, valid_ms, REQ, 1, U32MAX),
    F_U32(msg_draft_policy_t, max_k, REQ, 1, MSG_MAX_DRAFT_POS),
    F_STRUCTA(msg_draft_policy_t, buckets, n_buckets, REQ, 1, MSG_MAX_DRAFT_BUCKETS, s_bucket_s),
    F_F32A(msg_draft_policy_t, survival, n_survival, 0, 0, MSG_MAX_DRAFT_POS, 0.0, 1.0),
    F_F32A(msg_draft_policy_t, calibration, n_calibration, 0, 0, MSG_MAX_CONF_BINS, 0.0, 1.0),
};

static const msg_field_t s_spec_report_f[] = {
    F_STR(msg_spec_report_t, worker, REQ, 1, MSG_MAX_NAME),
    F_U64(msg_spec_report_t, steps, 0, 0, U64MAX),
    F_U64(msg_spec_report_t, verify_steps, 0, 0, U64MAX),
    F_U64(msg_spec_report_t, drafts, 0, 0, U64MAX),
    F_U64(msg_spec_report_t, accepted, 0, 0, U64MAX),
    F_U64A(msg_spec_report_t, proposed_at, n_proposed_at, 0, 0, MSG_MAX_DRAFT_POS),
    F_U64A(msg_spec_report_t, accepted_at, n_accepted_at, 0, 0, MSG_MAX_DRAFT_POS),
    F_U64A(msg_spec_report_t, conf_seen, n_conf_seen, 0, 0, MSG_MAX_CONF_BINS),
    F_U64A(msg_spec_report_t, conf_accepted, n_conf_accepted, 0, 0, MSG_MAX_CONF_BINS),
    F_U32A(msg_spec_report_t, cost_batch, n_cost_batch, 0, 0, MSG_MAX_COST_CELLS),
    F_U32A(msg_spec_report_t, cost_drafts, n_cost_drafts, 0, 0, MSG_MAX_COST_CELLS),
    F_U64A(msg_spec_report_t, cost_steps, n_cost_steps, 0, 0, MSG_MAX_COST_CELLS),
    F_U64A(msg_spec_report_t, cost_us, n_cost_us, 0, 0, MSG_MAX_COST_CELLS),
    F_U64A(msg_spec_report_t, cost_rows, n_cost_rows, 0, 0, MSG_MAX_COST_CELLS),
    F_U64A(msg_spec_report_t, cost_tokens, n_cost_tokens, 0, 0, MSG_MAX_COST_CELLS),
};

static const msg_field_t s_inspect_f[] = {
    F_ENUM(msg_inspect_t, what, REQ, 0, s_inspect_names),
    F_STR(msg_inspect_t, name, 0, 1, MSG_MAX_NAME),
};

static const msg_field_t s_inspect_reply_f[] = {
    F_U64(msg_inspect_reply_t, uptime_ms, 0, 0, U64MAX),
    F_STRUCTA(msg_inspect_reply_t, actors, n_actors, 0, 0, MSG_MAX_ACTORS, s_stats_s),
};

static const msg_schema_t s_schemas[MSG_TYPE_COUNT] = {
    [MSG_READY] = SCHEMA("ready", msg_ready_t, s_ready_f, NULL, NULL),
    [MSG_TERM] = SCHEMA("term", msg_term_t, s_term_f, NULL, NULL),
    [MSG_HEARTBEAT] = SCHEMA("heartbeat", msg_heartbeat_t, s_heartbeat_f, NULL, NULL),
    [MSG_STATS] = SCHEMA("stats", msg_stats_t, s_stats_f, NULL, NULL),
    [MSG_SUBMIT] = SCHEMA("submit", msg_submit_t, s_submit_f, NULL, s_submit_check),
    [MSG_TOKEN] = SCHEMA("token", msg_token_t, s_token_f, NULL, s_token_check),
    [MSG_DONE] = SCHEMA("done", msg_done_t, s_done_f, NULL, s_done_check),
    [MSG_ERROR] = SCHEMA("error", msg_error_t, s_error_f, NULL, NULL),
    [MSG_CANCEL] = {.name = "cancel", .size = sizeof(msg_cancel_t)},  /* no fields: the id says which */
    [MSG_PREFILL_REQUEST] = SCHEMA("prefill_request", msg_prefill_request_t, s_prefill_f, NULL, s_prefill_check),
    [MSG_HANDOFF] = SCHEMA("handoff", msg_handoff_t, s_handoff_f, NULL, s_handoff_check),
    [MSG_KV_ANNOUNCE] = SCHEMA("kv_announce", msg_kv_announce_t, s_kv_announce_f, NULL, s_kv_announce_check),
    [MSG_KV_ACK] = SCHEMA("kv_ack", msg_kv_ack_t, s_kv_ack_f, NULL, s_kv_ack_check),
    [MSG_CACHE_LOOKUP] = SCHEMA("cache_lookup", msg_cache_lookup_t, s_cache_lookup_f, NULL, NULL),
    [MSG_CACHE_LOOKUP_REPLY] = SCHEMA("cache_lookup_reply", msg_cache_lookup_reply_t, s_cache_lookup_reply_f, NULL, NULL),
    [MSG_CACHE_PUT] = SCHEMA("cache_put", msg_cache_put_t, s_cache_put_f, NULL, NULL),
    [MSG_CACHE_EVICT] = SCHEMA("cache_evict", msg_cache_evict_t, s_cache_evict_f, NULL, NULL),
    [MSG_CACHE_PIN] = SCHEMA("cache_pin", msg_cache_pin_t, s_cache_pin_f, NULL, NULL),
    [MSG_CACHE_UNPIN] = SCHEMA("cache_unpin", msg_cache_unpin_t, s_cache_unpin_f, NULL, NULL),
    [MSG_CACHE_FETCH] = SCHEMA("cache_fetch", msg_cache_fetch_t, s_cache_fetch_f, NULL, NULL),
    [MSG_CACHE_FETCH_REPLY] = SCHEMA("cache_fetch_reply", msg_cache_fetch_reply_t, s_cache_fetch_reply_f, NULL, s_fetch_reply_check),
    [MSG_CACHE_EVENT] = SCHEMA("cache_event", msg_cache_event_t, s_cache_event_f, NULL, NULL),
    [MSG_EXPERT_LOAD] = SCHEMA("expert_load", msg_expert_load_t, s_expert_load_f, NULL, NULL),
    [MSG_EXPERT_PLACEMENT] = SCHEMA("expert_placement", msg_expert_placement_t, s_expert_placement_f, NULL, s_placement_check),
    [MSG_DRAFT_POLICY] = SCHEMA("draft_policy", msg_draft_policy_t, s_draft_policy_f, NULL, s_draft_policy_check),
    [MSG_SPEC_REPORT] = SCHEMA("spec_report", msg_spec_report_t, s_spec_report_f, NULL, s_spec_report_check),
    [MSG_INSPECT] = SCHEMA("inspect", msg_inspect_t, s_inspect_f, NULL, s_inspect_check),
    [MSG_INSPECT_REPLY] = SCHEMA("inspect_reply", msg_inspect_reply_t, s_inspect_reply_f, NULL, NULL),
    [MSG_KV_LINK] = SCHEMA("kv_link", msg_kv_link_t, s_kv_link_f, NULL, s_kv_link_check),
};

const msg_schema_t *msg_schema_of(msg_type_t t)
{
    if ((unsigned)t >= MSG_TYPE_COUNT || t == MSG_NONE)
        return NULL;
    return &s_schemas[t];
}

void msg_schema_init(const msg_schema_t *s, void *base)
{
    memset(base, 0, s->size);
    for (unsigned i = 0; i < s->n_fields; i++)
        if (s->fields[i].kind == MSG_F_STRUCT)
            msg_schema_init(s->fields[i].sub, MSG_AT(base, s->fields[i].off));
    if (s->defaults)
        s->defaults(base);
}

size_t msg_field_elem_size(const msg_field_t *f)
{
    switch (f->kind) {
    case MSG_F_U32_ARR: return sizeof(uint32_t);
    case MSG_F_U64_ARR: return sizeof(uint64_t);
    case MSG_F_F32_ARR: return sizeof(float);
    case MSG_F_STR_ARR: return sizeof(const char *);
    case MSG_F_STRUCT_ARR: return f->sub->size;
    case MSG_F_BIN: return 1;
    default: return 0;
    }
}

unsigned msg_field_get_enum(const void *base, const msg_field_t *f)
{
    unsigned v;
    memcpy(&v, MSG_CAT(base, f->off), sizeof v);
    return v;
}

const char *msg_field_enum_name(const msg_field_t *f, unsigned v)
{
    return v < f->hi ? f->names[v] : NULL;
}

bool msg_field_present(const msg_field_t *f, const void *base)
{
    const void *p;
    uint32_t n;
    switch (f->kind) {
    case MSG_F_STR:
        memcpy(&p, MSG_CAT(base, f->off), sizeof p);
        return p != NULL;
    case MSG_F_BIN: case MSG_F_U32_ARR: case MSG_F_U64_ARR: case MSG_F_F32_ARR: case MSG_F_STR_ARR:
    case MSG_F_STRUCT_ARR:
        memcpy(&n, MSG_CAT(base, f->count_off), sizeof n);
        return n > 0;
    default:
        return true;
    }
}
