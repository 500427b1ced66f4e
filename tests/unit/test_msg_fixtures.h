/* tests/unit/test_msg_fixtures.h — one fully populated, valid message of every type.
 *
 * Every field holds a value that differs from msg_init's default (test_msg checks this through
 * the schema tables), so a round trip that dropped or mixed up any field would be caught.
 * Shared by tests/unit/test_msg.c and tests/fuzz/make_msg_corpus.c. Storage is static: the
 * messages point into it and must not be msg_free'd in a way that matters (they own no arena). */
#ifndef TROUPE_TEST_MSG_FIXTURES_H
#define TROUPE_TEST_MSG_FIXTURES_H

#include "messages/msg.h"

static const uint32_t fx_tokens[] = {128000, 9906, 11, 1917, 0, 4294967295u, 7};
static const uint64_t fx_hashes[] = {0x0123456789abcdefull, 1, 0xffffffffffffffffull, 42};
static const float fx_logprobs[] = {-0.25f, -1.5f, -0.0f, -3.0e-8f, -11.0f, -0.5f, -2.0f};
/* Two alternatives for each of fx_tokens' 7 positions, most likely first along each row. */
static const uint32_t fx_top_tokens[] = {128000, 3, 9906, 9907, 11, 12, 1917, 0, 0, 1, 4294967295u, 5, 7, 8};
static const float fx_top_logprobs[] = {-0.25f, -2.0f, -0.5f, -1.5f, -0.0f, -9.5f, -3.0e-8f, -20.0f,
                                        -0.75f, -0.75f, -0.5f, -1.0f, -1.0e-3f, -7.0f};
static const uint32_t fx_first_top[] = {791, 13, 220};
static const float fx_first_top_lp[] = {-0.125f, -2.25f, -4.0f};
static const char *const fx_stop[] = {"\n\nUser:", "</s>", "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"};
static const uint32_t fx_stop_ids[] = {128001, 128009};
static const msg_queue_depth_t fx_queues[] = {{"inbox", 3, 1024}, {"waiting", 17, 0}};
static const msg_metric_t fx_metrics[] = {
    {"tokens_total", 123456789.0, MSG_METRIC_COUNTER},
    {"batch_size", 12.0, MSG_METRIC_GAUGE},
    {"ttft_p99_ms", 0.125, MSG_METRIC_GAUGE},
};
static const msg_chat_t fx_chat[] = {
    {MSG_CHAT_USER, "Say \"hi\"\n\ttwice \xf0\x9f\x98\x80"},
    {MSG_CHAT_SYSTEM, "You are terse."},
    {MSG_CHAT_ASSISTANT, ""},
};
static const msg_cache_holder_t fx_holders[] = {
    {"prefill-0", MSG_TIER_HOST, 3},
    {"cache-store", MSG_TIER_DISK, 4},
};
static const uint8_t fx_handle[] = {0x2f, 0x74, 0x72, 0x6f, 0x75, 0x70, 0x65, 0x00, 0xff, 0x10};
static const uint8_t fx_nccl_id[128] = {0x02, 0x00, 0x9c, 0x41, 0x7f, 0x00, 0x00, 0x01, [64] = 0xee, [127] = 0x01};
static const uint8_t fx_tcp_handle[] = "tcp://127.0.0.2:41234";
/* The transfer description inside the handoff fixture (a network hand-off). */
static const msg_kv_announce_t fx_handoff_kv[1] = {{
    .transfer_id = 555, .request_id = 1234, .seq = 1, .last = true, .channel = MSG_CHAN_TCP, .n_layers = 2, .block_size = 16,
    .n_kv_heads = 2, .head_dim = 8, .dtype = DT_BF16, .block_ids = fx_stop_ids, .n_block_ids = 1,
    .total_bytes = 2ull * 2 * 16 * 2 * 8 * 2, .handle = fx_tcp_handle, .handle_len = sizeof fx_tcp_handle - 1,
    .src = "prefill-0", .deadline_ms = 1767225601000ull}};
static const uint32_t fx_offsets[] = {0, 1, 3, 4, 6};     /* 2 layers x 2 experts */
static const uint32_t fx_replicas[] = {0, 1, 2, 2, 0, 1};
static const char *const fx_workers[] = {"moe-0", "moe-1", "moe-2"};
static const msg_draft_bucket_t fx_buckets[] = {{4, 6, 0.25f}, {32, 3, 0.5f}, {256, 0, 1.0f}};
static const float fx_survival[] = {0.75f, 0.5f, 0.25f, 0.125f};
static const float fx_calibration[] = {0.05f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.55f, 0.6f, 0.7f, 0.9f};
static const uint64_t fx_proposed_at[] = {120, 100, 80, 40};
static const uint64_t fx_accepted_at[] = {90, 60, 30, 5};
static const uint64_t fx_conf_seen[] = {10, 0, 200, 7};
static const uint64_t fx_conf_accepted[] = {1, 0, 150, 7};
static const uint32_t fx_cost_batch[] = {1, 16, 256};
static const uint32_t fx_cost_drafts[] = {7, 2, 0};
static const uint64_t fx_cost_steps[] = {40, 3, 1000};
static const uint64_t fx_cost_us[] = {12345, 99, 40000000};
static const uint64_t fx_cost_rows[] = {40, 48, 256000};
static const uint64_t fx_cost_tokens[] = {130, 60, 256000};
static const uint64_t fx_counts[] = {5, 0, 12345678901ull, 7};
static const uint64_t fx_disk_mask[] = {0x5};   /* blocks 0 and 2 of 3 found */

static void fx_sampling(msg_sampling_t *s)
{
    s->temperature = 0.7f;
    s->top_k = 40;
    s->top_p = 0.95f;
    s->min_p = 0.05f;
    s->repetition_penalty = 1.1f;
    s->presence_penalty = -0.5f;
    s->frequency_penalty = 1.25f;
    s->seed = 1234567890123ll;
    s->max_tokens = 1000;
    s->stop = fx_stop;
    s->n_stop = 3;
    s->stop_token_ids = fx_stop_ids;
    s->n_stop_token_ids = 2;
    s->ignore_eos = true;
    s->logprobs = true;
    s->top_logprobs = 5;
}

static const msg_stats_t fx_stats_entries[2] = {
    {.role = MSG_ROLE_DECODE, .name = "decode-0", .pid = 4242, .uptime_ms = 99000,
     .state = MSG_STATE_DRAINING, .restarts = 2, .msgs_in = 10, .msgs_out = 20, .malformed = 1,
     .queues = fx_queues, .n_queues = 2, .metrics = fx_metrics, .n_metrics = 3},
    {.role = MSG_ROLE_MONITOR, .name = "monitor", .pid = 1, .uptime_ms = 5, .state = MSG_STATE_READY,
     .restarts = 1, .msgs_in = 1, .msgs_out = 1, .malformed = 1, .queues = fx_queues, .n_queues = 1,
     .metrics = fx_metrics, .n_metrics = 1},
};

/* Fills *m with the fixture for type t (all fields non-default). */
static void fx_fill(msg_t *m, msg_type_t t)
{
    msg_init(m, t, 0x1122334455667788ull + (uint64_t)t);
    switch (t) {
    case MSG_READY: {
        msg_ready_t *r = &m->u.ready;
        r->role = MSG_ROLE_PREFILL; r->name = "prefill-3"; r->pid = 31337; r->endpoint = "ipc:///tmp/troupe/p3";
        break;
    }
    case MSG_TERM:
        m->u.term.reason = "supervisor: cluster stopping (SIGTERM)";
        m->u.term.grace_ms = 5000;
        break;
    case MSG_HEARTBEAT: {
        msg_heartbeat_t *h = &m->u.heartbeat;
        h->seq = 77; h->steps = 1ull << 40; h->msgs_in = 3; h->msgs_out = 4; h->inflight = 9;
        break;
    }
    case MSG_STATS:
        m->u.stats = fx_stats_entries[0];
        break;
    case MSG_SUBMIT: {
        msg_submit_t *s = &m->u.submit;
        s->messages = fx_chat; s->n_messages = 3;
        s->model = "llama-3.1-8b";
        fx_sampling(&s->sampling);
        s->stream = true;
        s->prompt_cache_key = "tenant-a/system-v2";
        s->cache_retention_s = 3600;
        s->timeout_ms = 30000;
        s->tenant = "tenant-a";
        break;
    }
    case MSG_TOKEN: {
        msg_token_t *k = &m->u.token;
        k->seq = 12; k->tokens = fx_tokens; k->n_tokens = 7; k->text = " hello, w\xc3\xb6rld";
        k->logprobs = fx_logprobs; k->n_logprobs = 7;
        k->top_tokens = fx_top_tokens; k->n_top_tokens = 14;
        k->top_logprobs = fx_top_logprobs; k->n_top_logprobs = 14;
        break;
    }
    case MSG_DONE: {
        msg_done_t *d = &m->u.done;
        d->finish = MSG_FINISH_LENGTH;
        d->usage = (msg_usage_t){.prompt_tokens = 100, .cached_tokens = 64, .completion_tokens = 1000,
                                 .cached_device_tokens = 32, .cached_host_tokens = 16, .cached_disk_tokens = 16};
        d->timings = (msg_timings_t){.queue_ms = 1, .prefill_ms = 20, .ttft_ms = 25, .decode_ms = 9000, .e2e_ms = 9026};
        d->tokens = fx_tokens; d->n_tokens = 7; d->text = " hello, w\xc3\xb6rld";
        d->logprobs = fx_logprobs; d->n_logprobs = 7;
        break;
    }
    case MSG_ERROR: {
        msg_error_t *e = &m->u.error;
        e->code = MSG_ERR_OVERLOADED; e->message = "queue full (4096 waiting)"; e->retryable = true;
        e->field = "sampling.max_tokens";
        break;
    }
    case MSG_CANCEL:
        break;
    case MSG_PREFILL_REQUEST: {
        msg_prefill_request_t *p = &m->u.prefill_request;
        p->tokens = fx_tokens; p->n_tokens = 7;
        fx_sampling(&p->sampling);
        p->decode_worker = "decode-1"; p->reply_to = "router";
        p->tenant_salt = 0xdeadbeefcafef00dull; p->client_key = 0x0123456789abcdefull;
        p->prompt_cache_key = "k"; p->cache_retention_s = 300;
        p->hint_hashes = fx_hashes; p->n_hint_hashes = 4;
        p->hint_holders = fx_holders; p->n_hint_holders = 2;
        p->deadline_ms = 1767225600000ull; p->queue_ms = 3;
        break;
    }
    case MSG_HANDOFF: {
        msg_handoff_t *h = &m->u.handoff;
        h->tokens = fx_tokens; h->n_tokens = 7; h->first_token = 791; h->first_logprob = -0.125f;
        h->first_top_tokens = fx_first_top; h->n_first_top_tokens = 3;
        h->first_top_logprobs = fx_first_top_lp; h->n_first_top_logprobs = 3;
        fx_sampling(&h->sampling);
        h->tokens_left = 999; h->kv_tokens = 7; h->block_size = 16;
        h->reply_to = "router"; h->prefill_worker = "prefill-0"; h->tenant_salt = 99; h->client_key = 41;
        h->prompt_cache_key = "key"; h->cache_retention_s = 60; h->cached_tokens = 4;
        h->cached_host_tokens = 1; h->cached_disk_tokens = 2;
        h->queue_ms = 2; h->prefill_ms = 18; h->deadline_ms = 1767225600123ull;
        h->kv = fx_handoff_kv; h->n_kv = 1;
        break;
    }
    case MSG_KV_ANNOUNCE: {
        msg_kv_announce_t *a = &m->u.kv_announce;
        a->transfer_id = 555; a->request_id = 1234; a->seq = 2; a->last = true;
        a->channel = MSG_CHAN_CUDA_IPC; a->n_layers = 32; a->block_size = 16; a->n_kv_heads = 8;
        a->head_dim = 128; a->dtype = DT_BF16;
        a->block_ids = fx_tokens; a->n_block_ids = 7;
        a->total_bytes = 7ull * 32 * 2 * 16 * 8 * 128 * 2;
        a->handle = fx_handle; a->handle_len = sizeof fx_handle;
        a->src = "prefill-0"; a->deadline_ms = 1767225601000ull;
        break;
    }
    case MSG_KV_ACK: {
        msg_kv_ack_t *a = &m->u.kv_ack;
        a->transfer_id = 555; a->seq = 2; a->status = MSG_ACK_FAILED;
        a->message = "deadline passed after 3 of 7 blocks";
        a->dst_block_ids = fx_stop_ids; a->n_dst_block_ids = 2;
        break;
    }
    case MSG_CACHE_LOOKUP:
        m->u.cache_lookup.tenant_salt = 7;
        m->u.cache_lookup.hashes = fx_hashes;
        m->u.cache_lookup.n_hashes = 4;
        break;
    case MSG_CACHE_LOOKUP_REPLY:
        m->u.cache_lookup_reply.holders = fx_holders;
        m->u.cache_lookup_reply.n_holders = 2;
        break;
    case MSG_CACHE_PUT: {
        msg_cache_put_t *p = &m->u.cache_put;
        p->holder = "prefill-1"; p->tier = MSG_TIER_HOST; p->hashes = fx_hashes; p->n_hashes = 4;
        p->parent_hash = 0xabcdef;
        p->pool_blocks = 1040;
        break;
    }
    case MSG_CACHE_EVICT: {
        msg_cache_evict_t *e = &m->u.cache_evict;
        e->holder = "decode-0"; e->tier = MSG_TIER_DISK; e->hashes = fx_hashes; e->n_hashes = 2;
        break;
    }
    case MSG_CACHE_PIN: {
        msg_cache_pin_t *p = &m->u.cache_pin;
        p->tenant = "t1"; p->prompt_cache_key = "sys"; p->hashes = fx_hashes; p->n_hashes = 3;
        p->expires_in_ms = 3600000;
        break;
    }
    case MSG_CACHE_UNPIN: {
        msg_cache_unpin_t *p = &m->u.cache_unpin;
        p->tenant = "t1"; p->prompt_cache_key = "sys"; p->hashes = fx_hashes; p->n_hashes = 1;
        break;
    }
    case MSG_CACHE_FETCH: {
        msg_cache_fetch_t *f = &m->u.cache_fetch;
        f->hashes = fx_hashes; f->n_hashes = 4; f->channel = MSG_CHAN_TCP; f->reply_to = "prefill-2";
        f->handle = fx_handle; f->handle_len = 4; f->block_budget_ms = 0.59f;
        break;
    }
    case MSG_CACHE_FETCH_REPLY:
        m->u.cache_fetch_reply.found = 3;
        m->u.cache_fetch_reply.transfer_id = 987654321;
        m->u.cache_fetch_reply.found_disk = 2;
        m->u.cache_fetch_reply.disk_mask = fx_disk_mask;
        m->u.cache_fetch_reply.n_disk_mask = 1;
        break;
    case MSG_CACHE_EVENT: {
        msg_cache_event_t *e = &m->u.cache_event;
        e->kind = MSG_CEV_EXPIRED; e->holder = "cache-store"; e->tier = MSG_TIER_DISK;
        e->hashes = fx_hashes; e->n_hashes = 4;
        break;
    }
    case MSG_EXPERT_LOAD: {
        msg_expert_load_t *l = &m->u.expert_load;
        l->worker = "moe-1"; l->layer = 17; l->counts = fx_counts; l->n_counts = 4; l->window_ms = 1000;
        break;
    }
    case MSG_EXPERT_PLACEMENT: {
        msg_expert_placement_t *p = &m->u.expert_placement;
        p->epoch = 12; p->n_layers = 2; p->n_experts = 2;
        p->offsets = fx_offsets; p->n_offsets = 5;
        p->replicas = fx_replicas; p->n_replicas = 6;
        p->workers = fx_workers; p->n_workers = 3;
        break;
    }
    case MSG_DRAFT_POLICY: {
        msg_draft_policy_t *d = &m->u.draft_policy;
        d->epoch = 4; d->valid_ms = 10000; d->max_k = 7;
        d->buckets = fx_buckets; d->n_buckets = 3;
        d->survival = fx_survival; d->n_survival = 4;
        d->calibration = fx_calibration; d->n_calibration = 10;
        break;
    }
    case MSG_SPEC_REPORT: {
        msg_spec_report_t *d = &m->u.spec_report;
        d->worker = "decode-0"; d->steps = 1043; d->verify_steps = 120; d->drafts = 400; d->accepted = 185;
        d->proposed_at = fx_proposed_at; d->n_proposed_at = 4;
        d->accepted_at = fx_accepted_at; d->n_accepted_at = 4;
        d->conf_seen = fx_conf_seen; d->n_conf_seen = 4;
        d->conf_accepted = fx_conf_accepted; d->n_conf_accepted = 4;
        d->cost_batch = fx_cost_batch; d->n_cost_batch = 3;
        d->cost_drafts = fx_cost_drafts; d->n_cost_drafts = 3;
        d->cost_steps = fx_cost_steps; d->n_cost_steps = 3;
        d->cost_us = fx_cost_us; d->n_cost_us = 3;
        d->cost_rows = fx_cost_rows; d->n_cost_rows = 3;
        d->cost_tokens = fx_cost_tokens; d->n_cost_tokens = 3;
        break;
    }
    case MSG_INSPECT:
        m->u.inspect.what = MSG_INSPECT_ACTOR;
        m->u.inspect.name = "router";
        break;
    case MSG_INSPECT_REPLY:
        m->u.inspect_reply.uptime_ms = 86400000;
        m->u.inspect_reply.actors = fx_stats_entries;
        m->u.inspect_reply.n_actors = 2;
        break;
    case MSG_KV_LINK: {
        /* A refusal that still echoes the offer's bootstrap: every field set. */
        msg_kv_link_t *k = &m->u.kv_link;
        k->link_id = 0x1234567890abcdefull; k->channel = MSG_CHAN_NCCL; k->status = MSG_ACK_FAILED;
        k->handle = fx_nccl_id; k->handle_len = sizeof fx_nccl_id; k->n_ranks = 2; k->rank = 1;
        k->src = "decode-1"; k->message = "NCCL link to prefill-0: initialisation not complete after 20000 ms";
        k->deadline_ms = 1767225620000ull;
        break;
    }
    default:
        break;
    }
}

/* submit takes exactly one prompt form: the fixture uses messages, these the other two. */
static void fx_fill_submit_variant(msg_t *m, int variant)
{
    fx_fill(m, MSG_SUBMIT);
    m->u.submit.messages = NULL;
    m->u.submit.n_messages = 0;
    if (variant == 0) {
        m->u.submit.prompt = "Once upon a time,\n\"quoted\" \xe2\x82\xac";
    } else {
        m->u.submit.tokens = fx_tokens;
        m->u.submit.n_tokens = 7;
    }
}

#endif
