/* tools/bench.c — troupe-bench: a serving load generator in the style of `vllm bench serve`.
 *
 *   troupe-bench [--endpoint EP | --topology FILE] [--input-len N] [--output-len N]
 *                [--concurrency 1,8,32,64] [--prompts-per-level N | --rounds R] [--warmup N] [--vocab N]
 *                [--generate MODEL_DIR [--generate-args "..."]] [--json FILE] [--seed S] [--gpus N]
 *                [--copy-bw GBps] [--model DIR [--dtype bf16]] [--kv-dtype auto|f32|bf16|f16|fp8]
 *                [--weight-bytes N] [--kv-bytes-per-token N]
 *   troupe-bench --http URL [--http-model NAME] ...   (the same load through the OpenAI gateway)
 *   troupe-bench ... [--prompt-text FILE]   (prompts cut from a text file instead of random ids)
 *   troupe-bench --multi-turn [--turns T] [--system-len S] [--turn-len N] [--output-len M]
 *                [--concurrency ...] [--prompts-per-level CONVERSATIONS] [--retention DUR] ...
 *
 * Random token-id prompts of a fixed input length, a fixed output length (EOS ignored), a warm-up,
 * then one run per concurrency level (that many client threads, each with its own connection,
 * each sending its next request when the last one ends; 4 x concurrency requests per level, or
 * --prompts-per-level N, or --rounds R = R x concurrency). Per level: TTFT, ITL and end-to-end
 * latency (p50, p99), output and total tokens/s, output tokens/s per user and per GPU (--gpus).
 * With --generate it first times the one-process troupe-generate on the same lengths (median of 3)
 * and prints the ratio of the cluster's tokens/s per user at concurrency 1 to it. Written in C so
 * that the load generator is never the bottleneck at high concurrency. Exit 1 if any request failed.
 *
 * --http URL (http://host:port of a gateway, endpoints.http) sends the same requests as streamed
 * POST /v1/completions (token-id prompt, temperature 0, ignore_eos, include_usage), one keep-alive
 * connection per client thread, so the two columns of a run on one cluster differ only by the
 * gateway. TTFT is the first token's event, ITL the gaps between token events (the gateway sends one
 * per token message, text or not); the output count is the usage's.
 * The model name is the --topology's model directory name, or --http-model.
 *
 * Decode bandwidth (a column when the model's bytes are known, its fraction of --copy-bw, the
 * device-to-device copy bandwidth of one GPU measured by the caller in the same run, read + write
 * counted as bench_cuda and troupe-membw count it). Bytes come from --weight-bytes and
 * --kv-bytes-per-token, else from a config.json read without loading any weight: --model DIR
 * (weights at --dtype, default the config's torch_dtype), else the --topology's model section
 * (weights at its dtype with load_format dummy, else at the config's). The count is
 * config_weight_bytes, which a unit test holds equal to model_weight_bytes; KV bytes per token are
 * layers x kv_heads x head_dim x 2 at the workers' KV dtype (config_kv_dtype: --kv-dtype, else the
 * topology's model.kv_dtype, else its auto rule; fp8 is one byte per element). It is an estimate from the
 * client's side, not a measurement of the decode worker:
 *   - the decode batch is taken to be the concurrency (steady state), so steps/s = output tokens/s /
 *     concurrency. While some users wait for prefill the real batch is smaller and there are more
 *     steps, so the weight term is a lower bound; the KV term (output tokens/s x context x KV bytes
 *     per token) does not depend on the batch size;
 *   - every sequence's context is the mean over its output: input_len + output_len / 2;
 *   - output tokens/s includes each request's first token, which prefill produces (1/output_len);
 *   - MoE: a step of batch B reads E x (1 - (1 - k/E)^B) experts per layer (uniform routing);
 *     --weight-bytes replaces the whole count;
 *   - activations, logits and the embedding rows are not counted; with --gpus N the fraction is of
 *     N x --copy-bw, the weights counted once per step (one model split over the GPUs).
 *
 * --prompt-text FILE: each request's prompt is a passage of the text file (from a line start picked
 * by the seed, about 4 bytes per --input-len token, cut at a space), sent as text for the router to
 * tokenize, so that a real model continues real text (speculation's acceptance means something).
 *
 * Speculation: with --topology (whose monitor answers inspect), the decode workers' speculation
 * counters are read before and after every level, and the level reports the acceptance rate
 * (accepted / drafts), the mean tokens per verify step (1 + accepted / verify steps) and the
 * mean verify length the workers chose (spec_chosen_verify_len, averaged over the workers); the
 * output tokens/s column is already the effective rate (every token the clients received). Levels
 * in which no worker speculated show "-".
 *
 * Multi-turn (--multi-turn): every simulated user (one per concurrency slot) holds conversations
 * of --turns turns. All conversations of a level begin with the same --system-len token ids; each
 * turn appends --turn-len new random user tokens to the history, submits the whole history, and
 * appends the answer's tokens (greedy, EOS ignored, --output-len of them) for the next turn.
 * --prompts-per-level is the number of conversations (default: the concurrency). Each level runs
 * twice on the same token sequences:
 *   with reuse     one tenant per level (so no earlier run's cache is hit) and a prompt_cache_key per
 *                  conversation, pinned for --retention (default: the topology's cache retention);
 *   without reuse  a fresh tenant for every request: block hashes are salted per tenant, so nothing
 *                  can be reused (the cluster has no switch that turns the prefix cache off).
 * The cache hit rate is the cluster's own count: the sum of usage.cached_tokens (the prompt tokens
 * the prefill worker took from a cache, its pool or the cache-manager's store) over the sum of
 * usage.prompt_tokens of every done message; the router's cached_tokens_total adds up the same.
 * Where the cached tokens came from is the usage's split, summed the same way: the worker's own KV
 * pool (device), the cache-manager's memory (host), its disk tier (disk).
 * The pins outlive the run by their retention and hold their blocks in the cache-manager's host
 * store meanwhile (a later run's tenants differ, so it never hits them). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "actors/gateway/gw_sse_client.h"
#include "common/util.h"
#include "engine/config.h"
#include "tools/lib/args.h"
#include "tools/lib/client.h"
#include "topology/topology.h"

#define MAX_TURN_STATS 16       /* turns whose TTFT the multi-turn summary reports one by one */
#define MAX_LEVELS 16

typedef struct req_result {
    double ttft_ms, e2e_ms;
    int n_out;
    uint32_t prompt_tokens, cached_tokens;   /* the done message's usage */
    uint32_t cached_from[3];                 /* its cached tokens by source: device, host, disk */
    uint32_t queue_ms, prefill_ms;           /* the done message's timings: router queue, prefill */
    int failed;
} req_result_t;

/* One run at one concurrency level: random single prompts, or multi-turn conversations. */
typedef struct level {
    const char *ep;
    const char *http, *http_model; /* --http: the gateway's URL and the model name; NULL: ZeroMQ */
    int in_len, out_len, concurrency, vocab;
    int n_prompts;              /* requests, or conversations when turns > 0 */
    uint64_t seed;
    int turns;                  /* 0: single prompts; else requests per conversation */
    int turn_len;               /* new user tokens per turn */
    const uint32_t *system;     /* [sys_len] the head of every conversation */
    int sys_len;
    int reuse;                  /* 1: per-conversation prompt_cache_key; 0: a fresh tenant per request */
    const char *text;           /* --prompt-text: the file's bytes (NUL-terminated), or NULL */
    size_t text_len;
    uint32_t retention_s;       /* with reuse; 0 = the topology's default */
    char tag[64];               /* unique to this run and level: tenant and cache-key names */
    _Atomic int next;
    req_result_t *res;          /* [n_requests] (conversation-major) */
    float *itl;                 /* [n_requests][out_len] ms, -1 unused */
    char first_error[512];
    _Atomic int n_lost;         /* requests that ended with the client library's lost-connection error */
    pthread_mutex_t lock;
} level_t;

static int s_n_requests(const level_t *L) { return L->n_prompts * (L->turns > 0 ? L->turns : 1); }

static uint64_t s_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint32_t s_token(uint64_t *st, int vocab) { return 10 + (uint32_t)(s_rng(st) % (uint64_t)(vocab - 10)); }

static void s_fail(level_t *L, req_result_t *r, const char *err)
{
    r->failed = 1;
    pthread_mutex_lock(&L->lock);
    if (!L->first_error[0])
        snprintf(L->first_error, sizeof L->first_error, "%s", err);
    pthread_mutex_unlock(&L->lock);
}

/* One streamed greedy request of n prompt tokens; fills res[idx] and its ITL row, and the answer's
 * ids into answer[0..out_len) when not NULL. The number of answer ids, or -1 when it failed. */
static int s_request(level_t *L, client_t *c, int idx, const uint32_t *prompt, int n, const char *cache_key,
                     const char *tenant, uint32_t *answer)
{
    msg_t m;
    msg_init(&m, MSG_SUBMIT, 0);
    if (L->text) {   /* s_worker put the passage's text in prompt's place */
        m.u.submit.prompt = (const char *)prompt;
    } else {
        m.u.submit.tokens = prompt;
        m.u.submit.n_tokens = (uint32_t)n;
    }
    m.u.submit.stream = true;
    m.u.submit.sampling.temperature = 0;
    m.u.submit.sampling.ignore_eos = true;
    m.u.submit.sampling.max_tokens = (uint32_t)L->out_len;
    m.u.submit.prompt_cache_key = cache_key;
    m.u.submit.cache_retention_s = cache_key ? L->retention_s : 0;
    m.u.submit.tenant = tenant;
    req_result_t *r = &L->res[idx];
    float *itl = L->itl + (size_t)idx * (size_t)L->out_len;
    char err[512];
    uint64_t id;
    int64_t t0 = now_ns(), last = 0;
    if (client_send(c, &m, &id, err, sizeof err) != 0)
        goto fail;
    for (;;) {
        msg_t rep;
        int rc = client_recv(c, &rep, 600000, err, sizeof err);
        if (rc != 0) {
            if (rc == 1)
                snprintf(err, sizeof err, "no reply in 600 s");
            goto fail;
        }
        int64_t now = now_ns();
        if (rep.id != id) {
            msg_free(&rep);
            continue;
        }
        if (rep.type == MSG_TOKEN) {
            if (r->n_out == 0)
                r->ttft_ms = (double)(now - t0) / 1e6;
            else if (r->n_out - 1 < L->out_len)
                itl[r->n_out - 1] = (float)((double)(now - last) / 1e6);
            for (uint32_t k = 0; answer && k < rep.u.token.n_tokens && r->n_out + (int)k < L->out_len; k++)
                answer[r->n_out + (int)k] = rep.u.token.tokens[k];
            r->n_out += (int)rep.u.token.n_tokens;
            last = now;
        } else if (rep.type == MSG_DONE || rep.type == MSG_ERROR) {
            int failed = rep.type == MSG_ERROR;
            if (failed)
                snprintf(err, sizeof err, "%s: %s", msg_error_code_name(rep.u.error.code), rep.u.error.message);
            else
            {
                const msg_usage_t *u = &rep.u.done.usage;
                r->prompt_tokens = u->prompt_tokens, r->cached_tokens = u->cached_tokens;
                r->cached_from[0] = u->cached_device_tokens, r->cached_from[1] = u->cached_host_tokens;
                r->cached_from[2] = u->cached_disk_tokens;
                r->queue_ms = rep.u.done.timings.queue_ms, r->prefill_ms = rep.u.done.timings.prefill_ms;
            }
            msg_free(&rep);
            r->e2e_ms = (double)(now - t0) / 1e6;
            if (failed)
                goto fail;
            return r->n_out < L->out_len ? r->n_out : L->out_len;
        }
        msg_free(&rep);
    }
fail:
    s_fail(L, r, err);
    return -1;
}

/* The HTTP variant of s_request (--http): one streamed completion through the gateway. */
typedef struct http_req {
    level_t *L;
    req_result_t *r;
    float *itl;
    int64_t t0, last;
    int events;                 /* token events so far */
} http_req_t;

static int s_http_event(void *arg, json_t *ev)
{
    http_req_t *h = arg;
    if (!ev)
        return 0;
    int64_t now = now_ns();
    json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
    if (ch && json_is_null(json_object_get(ch, "finish_reason"))) {   /* a token's event (its text may be empty) */
        if (h->events == 0)
            h->r->ttft_ms = (double)(now - h->t0) / 1e6;
        else if (h->events - 1 < h->L->out_len)
            h->itl[h->events - 1] = (float)((double)(now - h->last) / 1e6);
        h->events++;
        h->last = now;
    }
    json_t *u = json_object_get(ev, "usage");
    if (json_is_object(u)) {
        h->r->n_out = (int)json_integer_value(json_object_get(u, "completion_tokens"));
        h->r->prompt_tokens = (uint32_t)json_integer_value(json_object_get(u, "prompt_tokens"));
        json_t *details = json_object_get(u, "prompt_tokens_details");
        h->r->cached_tokens = (uint32_t)json_integer_value(json_object_get(details, "cached_tokens"));
        static const char *const from[3] = {"cached_device_tokens", "cached_host_tokens", "cached_disk_tokens"};
        for (int k = 0; k < 3; k++)   /* absent (a gateway that does not split): 0 */
            h->r->cached_from[k] = (uint32_t)json_integer_value(json_object_get(details, from[k]));
    }
    return 0;
}

static void s_request_http(level_t *L, gw_sse_client_t *c, int idx, const uint32_t *prompt, int n)
{
    json_t *ids = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(ids, json_integer(prompt[i]));
    json_t *b = json_pack("{s:s,s:o,s:i,s:i,s:b,s:b,s:{s:b}}", "model", L->http_model, "prompt", ids, "max_tokens",
                          L->out_len, "temperature", 0, "ignore_eos", 1, "stream", 1, "stream_options",
                          "include_usage", 1);
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    http_req_t h = {.L = L, .r = &L->res[idx], .itl = L->itl + (size_t)idx * (size_t)L->out_len, .t0 = now_ns()};
    char err[512];
    int rc = body ? gw_sse_post(c, "/v1/completions", body, s_http_event, &h, err, sizeof err) : -1;
    free(body);
    h.r->e2e_ms = (double)(now_ns() - h.t0) / 1e6;
    if (rc != 0 || h.events == 0)
        s_fail(L, h.r, rc != 0 ? err : "no token came back");
}

/* Conversation `conv`: the system prompt, then per turn new user tokens, the whole history
 * submitted, the answer appended. hist holds sys_len + turns x (turn_len + out_len) ids. */
static void s_conversation(level_t *L, client_t *c, int conv, uint32_t *hist)
{
    uint64_t st = L->seed * 1000003u + (uint64_t)conv;
    char key[96], tenant[128];
    snprintf(key, sizeof key, "%s-conv%d", L->tag, conv);
    memcpy(hist, L->system, (size_t)L->sys_len * sizeof *hist);
    int n = L->sys_len;
    for (int t = 0; t < L->turns; t++) {
        for (int i = 0; i < L->turn_len; i++)
            hist[n++] = s_token(&st, L->vocab);
        if (!L->reuse)
            snprintf(tenant, sizeof tenant, "%s-conv%d-turn%d", L->tag, conv, t);
        int got = s_request(L, c, conv * L->turns + t, hist, n, L->reuse ? key : NULL, L->reuse ? L->tag : tenant,
                            hist + n);
        if (got < 0) {   /* the history has no answer to go on with: the rest of it fails too */
            for (int k = t + 1; k < L->turns; k++)
                s_fail(L, &L->res[conv * L->turns + k], "an earlier turn of the conversation failed");
            return;
        }
        n += got;
    }
}

/* A passage of --prompt-text into out (cap bytes with its NUL): from the line start at or after a
 * point the seed picks, up to cap - 1 bytes, cut back to the last space; never empty. */
static void s_passage(const level_t *L, uint64_t *st, char *out, size_t cap)
{
    size_t at = (size_t)(s_rng(st) % (uint64_t)L->text_len);
    while (at < L->text_len && L->text[at] != '\n')
        at++;
    while (at < L->text_len && (L->text[at] == '\n' || L->text[at] == ' '))
        at++;
    if (at >= L->text_len)
        at = 0;
    size_t n = L->text_len - at < cap - 1 ? L->text_len - at : cap - 1;
    while (n > cap / 2 && at + n < L->text_len && L->text[at + n] != ' ')
        n--;
    while (n > 1 && (unsigned char)L->text[at + n - 1] >= 0x80)
        n--;   /* never end inside a UTF-8 sequence */
    memcpy(out, L->text + at, n);
    out[n] = 0;
    for (size_t i = 0; i < n; i++)   /* control bytes other than newline out, NULs cannot be sent */
        if ((unsigned char)out[i] < 0x20 && out[i] != '\n')
            out[i] = ' ';
}

static void *s_worker(void *arg)
{
    level_t *L = arg;
    char err[256];
    if (L->http) {
        gw_sse_client_t *hc = gw_sse_connect(L->http, err, sizeof err);
        uint32_t *ids = malloc((size_t)L->in_len * sizeof *ids);
        for (int i; hc && ids && (i = atomic_fetch_add(&L->next, 1)) < L->n_prompts;) {
            uint64_t st = L->seed * 1000003u + (uint64_t)i;
            for (int k = 0; k < L->in_len; k++)
                ids[k] = s_token(&st, L->vocab);
            s_request_http(L, hc, i, ids, L->in_len);
        }
        for (int i; !hc && (i = atomic_fetch_add(&L->next, 1)) < L->n_prompts;)
            s_fail(L, &L->res[i], err);
        free(ids);
        gw_sse_destroy(&hc);
        return NULL;
    }
    client_t *c = client_connect(L->ep, err, sizeof err);
    size_t cap = L->turns > 0 ? (size_t)L->sys_len + (size_t)L->turns * (size_t)(L->turn_len + L->out_len)
                              : (size_t)L->in_len;
    if (L->text && cap < (size_t)L->in_len + 1)
        cap = (size_t)L->in_len + 1;   /* 4 bytes a token: the passage fits in the ids' room */
    uint32_t *buf = malloc(cap * sizeof *buf);
    for (int i; c && buf && (i = atomic_fetch_add(&L->next, 1)) < L->n_prompts;) {
        if (L->turns > 0) {
            s_conversation(L, c, i, buf);
            continue;
        }
        uint64_t st = L->seed * 1000003u + (uint64_t)i;
        if (L->text) {
            s_passage(L, &st, (char *)buf, (size_t)L->in_len * 4);
            s_request(L, c, i, buf, 0, NULL, NULL, NULL);
            continue;
        }
        for (int k = 0; k < L->in_len; k++)
            buf[k] = s_token(&st, L->vocab);
        s_request(L, c, i, buf, L->in_len, NULL, NULL, NULL);
    }
    free(buf);
    if (c)
        atomic_fetch_add(&L->n_lost, (int)client_requests_lost(c));
    client_destroy(&c);
    return NULL;
}

static int s_cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, s_cmpd);
    return v[(size_t)(p * (double)(n - 1) + 0.5)];
}

typedef struct summary {
    int concurrency, requests, errors;
    int lost;                   /* of the errors: requests lost with the router connection (it died) */
    double wall_s, out_tps, total_tps, per_user, ttft50, ttft99, itl50, itl99, e2e50, e2e99;
    long prompt_tokens, cached_tokens;
    long cached_from[3];        /* of cached_tokens: from the device, the host store, the disk tier */
    double hit_rate;            /* cached_tokens / prompt_tokens */
    /* Where TTFT goes (p50 of each part): queued at the router, prefill (start to hand-off sent),
     * and the rest (routing, the KV hand-off, decode admission, the first token's trip back). */
    double queue50, prefill50, rest50;
    /* Multi-turn: TTFT of each turn over the conversations (p50 and the largest), turns up to
     * MAX_TURN_STATS: which turn a large p99 comes from. */
    int n_turns;
    double turn_ttft50[MAX_TURN_STATS], turn_ttft_max[MAX_TURN_STATS];
    /* Speculation over the level (the decode workers' counters): acceptance, tokens per verify step,
     * the workers' mean chosen verify length; spec 0 when no worker verified a draft. */
    int spec;
    double spec_acceptance, spec_tokens_per_step, spec_chosen_len, spec_drafts;
} summary_t;

static summary_t s_run_level(level_t *L)
{
    summary_t S = {.concurrency = L->concurrency};
    const int n_req = s_n_requests(L);
    L->res = calloc((size_t)n_req, sizeof *L->res);
    L->itl = malloc((size_t)n_req * (size_t)L->out_len * sizeof *L->itl);
    for (size_t i = 0; i < (size_t)n_req * (size_t)L->out_len; i++)
        L->itl[i] = -1;
    atomic_store(&L->next, 0);
    atomic_store(&L->n_lost, 0);
    pthread_mutex_init(&L->lock, NULL);
    pthread_t *th = calloc((size_t)L->concurrency, sizeof *th);
    int64_t t0 = now_ns();
    for (int i = 0; i < L->concurrency; i++)
        pthread_create(&th[i], NULL, s_worker, L);
    for (int i = 0; i < L->concurrency; i++)
        pthread_join(th[i], NULL);
    S.wall_s = (double)(now_ns() - t0) / 1e9;
    double *ttft = malloc((size_t)n_req * sizeof *ttft), *e2e = malloc((size_t)n_req * sizeof *e2e);
    double *itl = malloc((size_t)n_req * (size_t)L->out_len * sizeof *itl);
    double *qms = malloc((size_t)n_req * sizeof *qms), *pms = malloc((size_t)n_req * sizeof *pms);
    double *rest = malloc((size_t)n_req * sizeof *rest);
    size_t n_ok = 0, n_itl = 0;
    long out_tokens = 0;
    double per_user = 0;
    for (int i = 0; i < n_req; i++) {
        req_result_t *r = &L->res[i];
        if (r->failed) {
            S.errors++;
            continue;
        }
        qms[n_ok] = r->queue_ms, pms[n_ok] = r->prefill_ms;
        rest[n_ok] = r->ttft_ms - r->queue_ms - r->prefill_ms;
        ttft[n_ok] = r->ttft_ms;
        e2e[n_ok++] = r->e2e_ms;
        out_tokens += r->n_out;
        S.prompt_tokens += r->prompt_tokens;
        S.cached_tokens += r->cached_tokens;
        for (int k = 0; k < 3; k++)
            S.cached_from[k] += r->cached_from[k];
        if (r->n_out > 1 && r->e2e_ms > r->ttft_ms)
            per_user += (r->n_out - 1) / ((r->e2e_ms - r->ttft_ms) / 1000.0);
        for (int k = 0; k < L->out_len; k++)
            if (L->itl[(size_t)i * (size_t)L->out_len + (size_t)k] >= 0)
                itl[n_itl++] = L->itl[(size_t)i * (size_t)L->out_len + (size_t)k];
    }
    S.requests = (int)n_ok;
    S.out_tps = (double)out_tokens / S.wall_s;
    S.total_tps = (double)(out_tokens + S.prompt_tokens) / S.wall_s;
    S.per_user = n_ok ? per_user / (double)n_ok : 0;
    S.hit_rate = S.prompt_tokens ? (double)S.cached_tokens / (double)S.prompt_tokens : 0;
    S.ttft50 = s_pct(ttft, n_ok, 0.5), S.ttft99 = s_pct(ttft, n_ok, 0.99);
    S.e2e50 = s_pct(e2e, n_ok, 0.5), S.e2e99 = s_pct(e2e, n_ok, 0.99);
    S.itl50 = s_pct(itl, n_itl, 0.5), S.itl99 = s_pct(itl, n_itl, 0.99);
    S.queue50 = s_pct(qms, n_ok, 0.5), S.prefill50 = s_pct(pms, n_ok, 0.5), S.rest50 = s_pct(rest, n_ok, 0.5);
    S.n_turns = L->turns < MAX_TURN_STATS ? L->turns : MAX_TURN_STATS;
    for (int t = 0; t < S.n_turns; t++) {          /* request conv * turns + t is turn t of conversation conv */
        size_t n = 0;
        for (int conv = 0; conv < L->n_prompts; conv++) {
            const req_result_t *r = &L->res[conv * L->turns + t];
            if (!r->failed)
                ttft[n++] = r->ttft_ms;
        }
        S.turn_ttft50[t] = s_pct(ttft, n, 0.5);
        S.turn_ttft_max[t] = s_pct(ttft, n, 1.0);
    }
    S.lost = atomic_load(&L->n_lost);
    if (S.errors)
        fprintf(stderr, "troupe-bench: %d requests failed at concurrency %d (%d lost with the router "
                "connection); first: %s\n", S.errors, L->concurrency, S.lost, L->first_error);
    free(ttft), free(e2e), free(itl), free(qms), free(pms), free(rest), free(th), free(L->res), free(L->itl);
    pthread_mutex_destroy(&L->lock);
    return S;
}

/* ---- speculation: the decode workers' counters, through the monitor ----------------------------- */

typedef struct spec_read {
    int ok;                     /* the monitor answered */
    int workers;                /* decode workers with speculation counters */
    double verify_steps, drafts, accepted;   /* summed over them */
    double chosen;              /* spec_chosen_verify_len summed over the workers that have it */
    int chosen_workers;
} spec_read_t;

static double s_stat(const msg_stats_t *st, const char *name, int *has)
{
    for (uint32_t i = 0; i < st->n_metrics; i++)
        if (strcmp(st->metrics[i].name, name) == 0) {
            *has = 1;
            return st->metrics[i].value;
        }
    return 0;
}

/* The counters now. Stats are published once a second: the caller waits that long after a level so
 * that its last steps are counted. */
static spec_read_t s_spec_read(const char *inspect_ep)
{
    spec_read_t r = {0};
    char err[256];
    client_t *c = inspect_ep ? client_connect(inspect_ep, err, sizeof err) : NULL;
    if (!c)
        return r;
    msg_t q, rep;
    msg_init(&q, MSG_INSPECT, 0);
    q.u.inspect.what = MSG_INSPECT_ACTORS;
    if (client_call(c, &q, &rep, 3000, err, sizeof err) == 0) {
        r.ok = rep.type == MSG_INSPECT_REPLY;
        for (uint32_t i = 0; r.ok && i < rep.u.inspect_reply.n_actors; i++) {
            const msg_stats_t *st = &rep.u.inspect_reply.actors[i];
            int has = 0;
            if (st->role != MSG_ROLE_DECODE)
                continue;
            r.verify_steps += s_stat(st, "spec_verify_steps_total", &has);
            r.drafts += s_stat(st, "spec_draft_tokens_total", &has);
            r.accepted += s_stat(st, "spec_accepted_tokens_total", &has);
            int chosen = 0;
            r.chosen += s_stat(st, "spec_chosen_verify_len", &chosen);
            r.chosen_workers += chosen;
            r.workers += has;
        }
        msg_free(&rep);
    }
    client_destroy(&c);
    return r;
}

/* ---- decode bandwidth: bytes one decode step reads ---------------------------------------------- */

typedef struct bytes_model {
    int have_cfg;               /* cfg was read from a config.json */
    model_config_t cfg;
    dtype_t weights, kv;        /* element types of the weights and of the KV cache */
    char source[1100];          /* where the figures came from, for the report */
    double weight_bytes;        /* --weight-bytes: per step, whatever the batch; 0 = from cfg */
    double kv_per_token;        /* bytes of KV per token of context; 0 = unknown */
    double copy_bw;             /* bytes/s of one GPU (read + write); 0 = not given */
    int gpus;
} bytes_model_t;

/* Weight bytes a step of `batch` sequences reads (0 when unknown). */
static double s_step_weight_bytes(const bytes_model_t *b, int batch)
{
    if (b->weight_bytes > 0 || !b->have_cfg)
        return b->weight_bytes;
    const model_config_t *c = &b->cfg;
    double experts = 0;
    if (c->num_experts > 0)
        experts = c->num_experts * (1 - pow(1 - (double)c->num_experts_per_tok / c->num_experts, batch));
    return config_weight_bytes(c, dtype_size(b->weights), experts);
}

/* Reads the model's shape: --model DIR (dtype: --dtype or the config's), else the topology's model
 * section; kv_dtype (--kv-dtype; DT_COUNT: auto) overrides the topology's. 0 when read, 1 when
 * there is nothing to read, -1 on an error. */
static int s_bytes_from_config(bytes_model_t *b, const char *model_dir, const char *dtype, dtype_t kv_dtype,
                               const char *topology, char *err, size_t errlen)
{
    dtype_t wdt = DT_COUNT, topo_dt = DT_COUNT, topo_kv = kv_dtype;
    char path[1024];
    if (dtype && dtype_parse(dtype, &wdt) != 0)
        return errf(err, errlen, "--dtype '%s': expected f32, bf16 or f16", dtype);
    if (model_dir) {
        snprintf(path, sizeof path, "%s", model_dir);
    } else if (topology) {
        topo_t *t = NULL;
        topo_errors_t *e = calloc(1, sizeof *e);
        if (!e || topo_load_file(topology, &t, e) != 0) {
            errf(err, errlen, "%s", e && e->count ? e->msg[0] : "invalid topology");
            free(e);
            return -1;
        }
        free(e);
        snprintf(path, sizeof path, "%s", t->model.path);
        topo_dt = t->model.dtype;
        if (topo_kv == DT_COUNT)
            topo_kv = t->model.kv_dtype;
        int dummy = t->model.load_format == TOPO_LOAD_DUMMY;
        topo_destroy(&t);
        if (!path[0])
            return 1;
        if (dummy && wdt == DT_COUNT)
            wdt = topo_dt;
    } else {
        return 1;
    }
    if (config_load(path, &b->cfg, err, errlen) != 0)
        return -1;
    b->have_cfg = 1;
    b->weights = wdt != DT_COUNT ? wdt : b->cfg.dtype;
    /* The workers' KV dtype (config_kv_dtype): the topology's model.kv_dtype, else the dummy
     * weights' dtype or the config's. */
    b->kv = config_kv_dtype(&b->cfg, wdt, topo_kv);
    snprintf(b->source, sizeof b->source, "%s, %s weights, %s KV", path, dtype_name(b->weights), dtype_name(b->kv));
    return 0;
}

/* ---- troupe-generate, for the ratio at concurrency 1 -------------------------------------------- */

/* Median decode tokens/s of 3 troupe-generate runs with the same lengths. */
static double s_generate(const char *bin_dir, const char *model, const char *extra, int in_len, int out_len, int vocab)
{
    double rates[3];
    int n = 0;
    uint64_t st = 77;
    for (int rep = 0; rep < 3; rep++) {
        size_t cap = (size_t)in_len * 8 + 4096;
        char *cmd = malloc(cap);
        int k = snprintf(cmd, cap, "'%s/troupe-generate' '%s' %s --max-tokens %d --temperature 0 --ignore-eos --json --ids ",
                         bin_dir, model, extra ? extra : "", out_len);
        for (int i = 0; i < in_len; i++)
            k += snprintf(cmd + k, cap - (size_t)k, "%s%u", i ? "," : "", s_token(&st, vocab));
        FILE *p = popen(cmd, "r");
        free(cmd);
        if (!p)
            continue;
        json_error_t je;
        json_t *j = json_loadf(p, JSON_DISABLE_EOF_CHECK, &je);
        pclose(p);
        json_t *tps = j ? json_object_get(json_object_get(j, "timings"), "decode_tokens_per_s") : NULL;
        if (tps)
            rates[n++] = json_number_value(tps);
        json_decref(j);
    }
    if (!n)
        return 0;
    qsort(rates, (size_t)n, sizeof *rates, s_cmpd);
    return rates[n / 2];
}

static json_t *s_summary_json(const summary_t *s)
{
    json_t *j = json_pack("{s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:f,s:f,s:f,s:f}",
                     "concurrency", s->concurrency, "requests", s->requests, "errors", s->errors, "wall_s", s->wall_s,
                     "output_tokens_per_s", s->out_tps, "total_tokens_per_s", s->total_tps,
                     "tokens_per_s_per_user", s->per_user, "ttft_ms_p50", s->ttft50, "ttft_ms_p99", s->ttft99,
                     "itl_ms_p50", s->itl50, "itl_ms_p99", s->itl99, "e2e_ms_p50", s->e2e50, "e2e_ms_p99", s->e2e99,
                     "prompt_tokens", (json_int_t)s->prompt_tokens, "cached_tokens", (json_int_t)s->cached_tokens,
                     "cache_hit_rate", s->hit_rate, "ttft_queue_ms_p50", s->queue50,
                     "ttft_prefill_ms_p50", s->prefill50, "ttft_rest_ms_p50", s->rest50);
    if (j)
        json_object_set_new(j, "errors_router_lost", json_integer(s->lost));
    if (j)
        json_object_update_new(j, json_pack("{s:I,s:I,s:I}", "cached_device_tokens", (json_int_t)s->cached_from[0],
                                            "cached_host_tokens", (json_int_t)s->cached_from[1],
                                            "cached_disk_tokens", (json_int_t)s->cached_from[2]));
    if (j && s->n_turns > 0) {
        json_t *turns = json_array();
        for (int t = 0; t < s->n_turns; t++)
            json_array_append_new(turns, json_pack("{s:i, s:f, s:f}", "turn", t + 1, "ttft_ms_p50", s->turn_ttft50[t],
                                                   "ttft_ms_max", s->turn_ttft_max[t]));
        json_object_set_new(j, "ttft_by_turn", turns);
    }
    if (j && s->spec)
        json_object_update_new(j, json_pack("{s:f,s:f,s:f,s:f}", "spec_acceptance_rate", s->spec_acceptance,
                                            "spec_tokens_per_verify_step", s->spec_tokens_per_step,
                                            "spec_chosen_verify_len", s->spec_chosen_len,
                                            "spec_draft_tokens", s->spec_drafts));
    return j;
}

/* The level's speculation from the counters before (a) and after (b) it. */
static void s_spec_level(summary_t *S, const spec_read_t *a, const spec_read_t *b)
{
    const double steps = b->verify_steps - a->verify_steps, drafts = b->drafts - a->drafts,
                 acc = b->accepted - a->accepted;
    S->spec = a->ok && b->ok && steps > 0 && drafts > 0;
    if (!S->spec)
        return;
    S->spec_acceptance = acc / drafts;
    S->spec_tokens_per_step = 1.0 + acc / steps;
    S->spec_chosen_len = b->chosen_workers ? b->chosen / b->chosen_workers : -1;   /* -1: not reported */
    S->spec_drafts = drafts;
}

/* ---- the command line --------------------------------------------------------------------------- */
static void s_usage(FILE *f)
{
    fprintf(f, "usage: troupe-bench [--endpoint EP | --topology FILE] [--input-len N] [--output-len N]\n"
               "       [--concurrency 1,8,32,64] [--prompts-per-level N | --rounds R] [--warmup N] [--vocab N]\n"
               "       [--generate MODEL_DIR [--generate-args \"...\"]] [--json FILE] [--seed S] [--gpus N]\n"
               "       [--copy-bw GBps] [--model DIR [--dtype bf16]] [--kv-dtype auto|f32|bf16|f16|fp8]\n"
               "       [--weight-bytes N] [--kv-bytes-per-token N]\n"
               "       [--multi-turn [--turns T] [--system-len S] [--turn-len N] [--retention DUR]]\n"
               "       [--http URL [--http-model NAME]]   (through the OpenAI gateway instead of ZeroMQ)\n"
               "       [--prompt-text FILE]   (prompts are passages of a text file)\n");
}


/* What the command line asks for, the defaults filled in. */
typedef struct options {
    const char *ep;             /* --endpoint; NULL: the --topology's routers */
    const char *topology;
    const char *gen_model, *gen_args;   /* --generate, --generate-args */
    const char *json_path;
    const char *model_dir, *dtype;      /* --model, --dtype: the config.json of the bytes model */
    dtype_t kv_dtype;           /* --kv-dtype; DT_COUNT: auto */
    int in_len, out_len;
    int per_level, rounds;      /* --prompts-per-level, --rounds; 0: not given */
    int warmup, vocab;
    int levels[MAX_LEVELS], n_levels;   /* --concurrency */
    int multi, turns, sys_len, turn_len;   /* --multi-turn and its shape */
    int64_t retention;          /* --retention in seconds; 0: the topology's */
    uint64_t seed;
    const char *http, *http_model, *prompt_text;
    int gpus;
    double copy_bw;             /* bytes/s (--copy-bw is in GB/s); 0: not given */
    double weight_bytes, kv_per_token;   /* --weight-bytes, --kv-bytes-per-token; 0: not given */
} options_t;

/* The defaults, then the command line. Returns the exit status when troupe-bench stops here (0
 * after --help, 2 on a bad option), else -1. */
static int s_parse_args(options_t *o, int argc, char **argv)
{
    *o = (options_t){.gen_args = "", .kv_dtype = DT_COUNT, .in_len = 64, .out_len = 64, .warmup = 2, .vocab = 500,
                     .levels = {1, 8, 32, 64}, .n_levels = 4, .turns = 4, .sys_len = 256, .turn_len = 64,
                     .seed = 1, .gpus = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { s_usage(stdout); return 0; }
        if (!strcmp(a, "--multi-turn")) { o->multi = 1; continue; }
        if (!v) { fprintf(stderr, "troupe-bench: %s needs a value\n", a); return 2; }
        i++;
        static const char *T = "troupe-bench";
        const int BIG = 1 << 30;
        int rc = 0;
        if (!strcmp(a, "--endpoint")) o->ep = v;
        else if (!strcmp(a, "--topology")) o->topology = v;
        else if (!strcmp(a, "--input-len")) rc = arg_int(T, a, v, 1, BIG, &o->in_len);
        else if (!strcmp(a, "--output-len")) rc = arg_int(T, a, v, 1, BIG, &o->out_len);
        else if (!strcmp(a, "--concurrency"))
            rc = (o->n_levels = arg_int_list(T, a, v, 1, 1 << 16, o->levels, MAX_LEVELS)) < 0;
        else if (!strcmp(a, "--prompts-per-level")) rc = arg_int(T, a, v, 1, BIG, &o->per_level);
        else if (!strcmp(a, "--rounds")) rc = arg_int(T, a, v, 1, BIG, &o->rounds);
        else if (!strcmp(a, "--warmup")) rc = arg_int(T, a, v, 0, BIG, &o->warmup);
        else if (!strcmp(a, "--vocab")) rc = arg_int(T, a, v, 11, BIG, &o->vocab);
        else if (!strcmp(a, "--generate")) o->gen_model = v;
        else if (!strcmp(a, "--generate-args")) o->gen_args = v;
        else if (!strcmp(a, "--json")) o->json_path = v;
        else if (!strcmp(a, "--seed")) { long long x; rc = arg_ll(T, a, v, 0, INT64_MAX, &x); o->seed = (uint64_t)x; }
        else if (!strcmp(a, "--gpus")) rc = arg_int(T, a, v, 1, 1 << 16, &o->gpus);
        else if (!strcmp(a, "--copy-bw")) { rc = arg_double(T, a, v, 0, 1e9, &o->copy_bw); o->copy_bw *= 1e9; }
        else if (!strcmp(a, "--model")) o->model_dir = v;
        else if (!strcmp(a, "--dtype")) o->dtype = v;
        else if (!strcmp(a, "--kv-dtype")) rc = arg_kv_dtype(T, a, v, &o->kv_dtype);
        else if (!strcmp(a, "--weight-bytes")) rc = arg_double(T, a, v, 0, 1e18, &o->weight_bytes);
        else if (!strcmp(a, "--kv-bytes-per-token")) rc = arg_double(T, a, v, 0, 1e12, &o->kv_per_token);
        else if (!strcmp(a, "--turns")) rc = arg_int(T, a, v, 1, BIG, &o->turns);
        else if (!strcmp(a, "--system-len")) rc = arg_int(T, a, v, 0, BIG, &o->sys_len);
        else if (!strcmp(a, "--turn-len")) rc = arg_int(T, a, v, 1, BIG, &o->turn_len);
        else if (!strcmp(a, "--retention")) o->retention = client_parse_duration_s(v);
        else if (!strcmp(a, "--http")) o->http = v;
        else if (!strcmp(a, "--http-model")) o->http_model = v;
        else if (!strcmp(a, "--prompt-text")) o->prompt_text = v;
        else { fprintf(stderr, "troupe-bench: unknown option '%s'\n", a); s_usage(stderr); return 2; }
        if (rc)
            return 2;
    }
    /* Only the multi-turn run pins cache keys; single prompts ignore --retention. */
    if (o->multi && (o->retention < 0 || o->retention > MSG_MAX_RETENTION_S)) {
        fprintf(stderr, "troupe-bench: --retention: expected a duration of at most %u s\n", MSG_MAX_RETENTION_S);
        return 2;
    }
    return -1;
}

/* ---- the run: what main works out before the levels, and their results -------------------------- */

typedef struct bench {
    options_t o;
    const char *ep;             /* the routers: --endpoint, else epbuf */
    char epbuf[CLIENT_ROUTERS_MAX * TOPO_ENDPOINT_MAX];
    const char *http_model;     /* --http-model, else model_name */
    char model_name[256];       /* the --topology's model directory name */
    const char *inspect_ep;     /* the monitor (inspect_buf), for the speculation counters; NULL: none */
    char inspect_buf[256];
    char *text;                 /* --prompt-text's bytes (NUL-terminated), or NULL */
    size_t text_len;
    bytes_model_t bm;           /* the decode bytes: the options' figures, else a config.json's */
    int have_bytes;             /* weight and KV bytes both known: the decode-bytes columns */
    double gen_tps;             /* troupe-generate's decode tok/s (--generate); 0: none */
    summary_t S[MAX_LEVELS];    /* per level; multi-turn: with reuse */
    summary_t N[MAX_LEVELS];    /* multi-turn without reuse */
    int errors;                 /* failed requests over every level: exit 1 */
} bench_t;

/* --http names the model in every request: --http-model, else the topology's model directory
 * name. 0, or -1 (said on stderr) when there is none or the mode is multi-turn. */
static int s_http_model(bench_t *b)
{
    const options_t *o = &b->o;
    b->http_model = o->http_model;
    if (o->http && o->multi) {
        fprintf(stderr, "troupe-bench: --http runs single prompts only (not --multi-turn)\n");
        return -1;
    }
    if (!o->http || o->http_model)
        return 0;
    topo_t *ht = NULL;
    if (o->topology && topo_load_file(o->topology, &ht, NULL) == 0) {
        const char *sl = strrchr(ht->model.path, '/');
        snprintf(b->model_name, sizeof b->model_name, "%.255s", sl ? sl + 1 : ht->model.path);
        topo_destroy(&ht);
    }
    if (!b->model_name[0]) {
        fprintf(stderr, "troupe-bench: --http needs the model's name: --topology FILE or --http-model NAME\n");
        return -1;
    }
    b->http_model = b->model_name;
    return 0;
}

/* The routers (--endpoint, else the topology's) and the monitor, whose inspect answers carry the
 * speculation counters: only a topology names it, and without one the levels report none. */
static int s_endpoints(bench_t *b)
{
    const options_t *o = &b->o;
    char err[512];
    b->ep = o->ep;
    if (!b->ep) {
        if (client_endpoints_from_topology(o->topology, b->epbuf, NULL, sizeof b->epbuf, err, sizeof err) != 0) {
            fprintf(stderr, "troupe-bench: %s\n", err);
            return -1;
        }
        b->ep = b->epbuf;
    }
    b->inspect_ep = o->topology && client_endpoints_from_topology(o->topology, NULL, b->inspect_buf,
                                                                  sizeof b->inspect_buf, err, sizeof err) == 0
                        ? b->inspect_buf : NULL;
    return 0;
}

/* --prompt-text's file, read once: every request's passage is cut from it. */
static int s_prompt_text(bench_t *b)
{
    const options_t *o = &b->o;
    if (!o->prompt_text)
        return 0;
    if (o->http || o->multi) {
        fprintf(stderr, "troupe-bench: --prompt-text runs single prompts over ZeroMQ only\n");
        return -1;
    }
    b->text = util_read_file(o->prompt_text, &b->text_len);
    if (!b->text || b->text_len < 2) {
        fprintf(stderr, "troupe-bench: --prompt-text %s: %s\n", o->prompt_text, b->text ? "empty" : strerror(errno));
        free(b->text);
        b->text = NULL;
        return -1;
    }
    return 0;
}

/* The decode-bytes model (header comment): the given figures, the rest from a config.json. A
 * config that cannot be read is an error only where the bytes were asked for (--model, --copy-bw);
 * otherwise the columns are left out. */
static int s_bytes_model(bench_t *b)
{
    const options_t *o = &b->o;
    bytes_model_t *bm = &b->bm;
    *bm = (bytes_model_t){.gpus = o->gpus, .copy_bw = o->copy_bw, .weight_bytes = o->weight_bytes,
                          .kv_per_token = o->kv_per_token};
    if (!o->multi) {
        char err[512];
        int rc = s_bytes_from_config(bm, o->model_dir, o->dtype, o->kv_dtype, o->topology, err, sizeof err);
        if (rc < 0 && (o->model_dir || bm->copy_bw > 0)) {
            fprintf(stderr, "troupe-bench: %s\n", err);
            return -1;
        }
        if (bm->have_cfg && bm->kv_per_token == 0)
            bm->kv_per_token = (double)config_kv_bytes_per_token(&bm->cfg, dtype_size(bm->kv));
    }
    b->have_bytes = s_step_weight_bytes(bm, 1) > 0 && bm->kv_per_token > 0;
    if (!o->multi && bm->copy_bw > 0 && !b->have_bytes) {
        fprintf(stderr, "troupe-bench: --copy-bw needs the model's bytes: --model DIR, a --topology with a model, "
                        "or --weight-bytes and --kv-bytes-per-token\n");
        return -1;
    }
    return 0;
}

/* troupe-generate is the one beside this binary (the same build), else the one in ".". */
static void s_bin_dir(char *bin_dir, size_t cap)
{
    char self[1024];
    snprintf(bin_dir, cap, ".");
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl > 0) {
        self[sl] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(bin_dir, cap, "%s", self);
        }
    }
}

/* ---- the levels --------------------------------------------------------------------------------- */

/* A level's settings common to both modes; the seed differs per level so that levels do not
 * share prompts. */
static level_t s_level(const bench_t *b, int concurrency, int out_len, uint64_t seed)
{
    const options_t *o = &b->o;
    return (level_t){.ep = b->ep, .http = o->http, .http_model = b->http_model, .in_len = o->in_len,
                     .out_len = out_len, .concurrency = concurrency, .vocab = o->vocab, .seed = seed,
                     .text = b->text, .text_len = b->text_len};
}

/* A few short requests first, so that the first level does not pay for the cluster's cold start;
 * one failing means the cluster is not there. */
static int s_warmup(const bench_t *b)
{
    const options_t *o = &b->o;
    if (!o->warmup)
        return 0;
    level_t W = s_level(b, 1, o->out_len < 8 ? o->out_len : 8, o->seed + 999);
    W.n_prompts = o->warmup;
    summary_t ws = s_run_level(&W);
    if (ws.errors) {
        fprintf(stderr, "troupe-bench: warm-up failed (is the cluster at %s running?)\n", b->ep);
        return -1;
    }
    return 0;
}

/* One level of single prompts, with the decode workers' speculation counters read around it. */
static void s_single_level(bench_t *b, int l)
{
    const options_t *o = &b->o;
    const int c = o->levels[l];
    level_t L = s_level(b, c, o->out_len, o->seed + (uint64_t)c);
    L.n_prompts = o->per_level > 0 ? o->per_level : o->rounds > 0 ? o->rounds * c : (4 * c > 8 ? 4 * c : 8);
    summary_t *S = &b->S[l];
    const spec_read_t before = s_spec_read(b->inspect_ep);
    *S = s_run_level(&L);
    b->errors += S->errors;
    if (b->inspect_ep) {
        usleep(1200 * 1000);   /* the workers' next stats carry the level's last steps */
        const spec_read_t after = s_spec_read(b->inspect_ep);
        s_spec_level(S, &before, &after);
    }
    fprintf(stderr, "  concurrency %4d: %9.1f out tok/s, %7.1f tok/s/user, TTFT p50 %8.1f ms (queue %.1f, "
                    "prefill %.1f, rest %.1f), ITL p50 %6.2f ms\n",
            S->concurrency, S->out_tps, S->per_user, S->ttft50, S->queue50, S->prefill50, S->rest50, S->itl50);
    if (S->spec)
        fprintf(stderr, "  concurrency %4d: speculation: acceptance %.1f%%, %.2f tokens per verify step, "
                        "chosen verify length %.2f\n", S->concurrency, 100 * S->spec_acceptance,
                S->spec_tokens_per_step, S->spec_chosen_len);
}

/* One level of conversations, run twice on the same token sequences: with reuse (cache keys),
 * then without (a fresh tenant per request). The tags carry run_id so that no other run's cache
 * is hit. */
static void s_multi_level(bench_t *b, int l, uint64_t run_id)
{
    const options_t *o = &b->o;
    const int c = o->levels[l];
    level_t L = s_level(b, c, o->out_len, o->seed + (uint64_t)c);
    uint32_t *sys = malloc(((size_t)o->sys_len + 1) * sizeof *sys);
    uint64_t st = L.seed ^ 0x5157454e;
    for (int i = 0; i < o->sys_len; i++)
        sys[i] = s_token(&st, o->vocab);
    L.n_prompts = o->per_level > 0 ? o->per_level : c;
    L.turns = o->turns, L.turn_len = o->turn_len, L.system = sys, L.sys_len = o->sys_len;
    L.retention_s = (uint32_t)o->retention;
    for (int reuse = 1; reuse >= 0; reuse--) {
        L.reuse = reuse;
        snprintf(L.tag, sizeof L.tag, "bench-%016llx-c%d-%s", (unsigned long long)run_id, c, reuse ? "reuse" : "fresh");
        summary_t *s = reuse ? &b->S[l] : &b->N[l];
        *s = s_run_level(&L);
        b->errors += s->errors;
        fprintf(stderr, "  concurrency %4d, %s reuse: cache hit rate %5.1f%% (cached tokens from device %ld, host "
                "%ld, disk %ld), TTFT p50 %8.1f ms, p99 %8.1f ms\n", c, reuse ? "with" : "without",
                100 * s->hit_rate, s->cached_from[0], s->cached_from[1], s->cached_from[2], s->ttft50, s->ttft99);
    }
    free(sys);
}

/* The levels in --concurrency order. */
static void s_run_levels(bench_t *b)
{
    /* Tenants and cache keys of this run: a later run on the same cluster must not hit its cache. */
    uint64_t run_id = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 32);
    for (int l = 0; l < b->o.n_levels; l++) {
        if (b->o.multi)
            s_multi_level(b, l, run_id);
        else
            s_single_level(b, l);
    }
}

/* ---- the multi-turn report ---------------------------------------------------------------------- */

/* Per level, with and without reuse side by side; then each turn's TTFT, which tells which turn a
 * large p99 comes from. */
static void s_print_multi(const bench_t *b)
{
    const options_t *o = &b->o;
    const summary_t *S = b->S, *N = b->N;
    printf("\nmulti-turn: %d turns; %d system tokens shared by every conversation, %d new user tokens and %d "
           "output tokens per turn; endpoint %s\n", o->turns, o->sys_len, o->turn_len, o->out_len, b->ep);
    printf("%5s %5s %5s | %-41s | %-41s | %4s\n", "", "", "", "                 with reuse",
           "               without reuse", "");
    printf("%5s %5s %5s | %8s %9s %9s %11s | %8s %9s %9s %11s | %4s\n", "conc", "convs", "reqs", "hit rate",
           "TTFT p50", "TTFT p99", "out tok/s", "hit rate", "TTFT p50", "TTFT p99", "out tok/s", "err");
    for (int l = 0; l < o->n_levels; l++) {
        int convs = o->per_level > 0 ? o->per_level : o->levels[l];
        printf("%5d %5d %5d | %7.1f%% %9.1f %9.1f %11.1f | %7.1f%% %9.1f %9.1f %11.1f | %4d\n", o->levels[l], convs,
               convs * o->turns, 100 * S[l].hit_rate, S[l].ttft50, S[l].ttft99, S[l].out_tps, 100 * N[l].hit_rate,
               N[l].ttft50, N[l].ttft99, N[l].out_tps, S[l].errors + N[l].errors);
    }
    printf("TTFT by turn, p50 / largest ms (with reuse | without):\n");
    for (int l = 0; l < o->n_levels; l++) {
        printf("%5d", o->levels[l]);
        for (int t = 0; t < S[l].n_turns; t++)
            printf("  t%d %.1f/%.1f | %.1f/%.1f", t + 1, S[l].turn_ttft50[t], S[l].turn_ttft_max[t],
                   N[l].turn_ttft50[t], N[l].turn_ttft_max[t]);
        printf("\n");
    }
}

/* Per level both summaries (reuse, no_reuse); the run's conversation shape beside them. */
static void s_json_multi(const bench_t *b, json_t *j, json_t *arr)
{
    const options_t *o = &b->o;
    for (int l = 0; l < o->n_levels; l++) {
        int convs = o->per_level > 0 ? o->per_level : o->levels[l];
        json_array_append_new(arr, json_pack("{s:i, s:i, s:o, s:o}", "concurrency", o->levels[l], "conversations",
                                             convs, "reuse", s_summary_json(&b->S[l]),
                                             "no_reuse", s_summary_json(&b->N[l])));
    }
    json_object_update_new(j, json_pack("{s:i, s:i, s:i, s:i}", "turns", o->turns, "system_len", o->sys_len,
                                        "turn_len", o->turn_len, "retention_s", (int)o->retention));
}

/* ---- the single-prompt report ------------------------------------------------------------------- */

/* Decode bytes per level (header comment): steps/s = out tok/s / concurrency; a step reads the
 * weights once and every sequence's KV at the mean context. Zeros without the model's bytes. */
typedef struct decode_bytes {
    double ctx;                 /* the mean context of a sequence: input_len + output_len / 2 */
    double bw;                  /* copy bandwidth of all the GPUs, bytes/s */
    double step[MAX_LEVELS];    /* bytes a decode step reads */
    double per_s[MAX_LEVELS];   /* bytes/s at the level's rate */
} decode_bytes_t;

static decode_bytes_t s_decode_bytes(const bench_t *b)
{
    const options_t *o = &b->o;
    decode_bytes_t d = {.ctx = o->in_len + o->out_len / 2.0, .bw = b->bm.copy_bw * b->bm.gpus};
    for (int l = 0; b->have_bytes && l < o->n_levels; l++) {
        d.step[l] = s_step_weight_bytes(&b->bm, o->levels[l]) + o->levels[l] * d.ctx * b->bm.kv_per_token;
        d.per_s[l] = b->S[l].out_tps / o->levels[l] * d.step[l];
    }
    return d;
}

/* The speculation columns appear when any level speculated; "-" where this one did not, or its
 * workers did not report a chosen length. */
static void s_print_spec_cells(const summary_t *S, int any_spec)
{
    if (any_spec && S->spec && S->spec_chosen_len >= 0)
        printf(" %6.1f%% %8.2f %7.2f", 100 * S->spec_acceptance, S->spec_tokens_per_step, S->spec_chosen_len);
    else if (any_spec && S->spec)
        printf(" %6.1f%% %8.2f %7s", 100 * S->spec_acceptance, S->spec_tokens_per_step, "-");
    else if (any_spec)
        printf(" %7s %8s %7s", "-", "-", "-");
}

/* One row per level; the per-GPU, decode-bytes and speculation columns only where they mean
 * something. */
static void s_print_single(const bench_t *b, const decode_bytes_t *d)
{
    const options_t *o = &b->o;
    const bytes_model_t *bm = &b->bm;
    printf("\ninput %d / output %d tokens, endpoint %s\n", o->in_len, o->out_len, b->ep);
    if (b->have_bytes)
        printf("decode bytes: weights %.3f GB per step, KV %.0f bytes per token (%s); copy bandwidth %s\n",
               s_step_weight_bytes(bm, 1) / 1e9, bm->kv_per_token, bm->have_cfg ? bm->source : "given",
               bm->copy_bw > 0 ? "given" : "not given");
    printf("%5s %5s %10s %11s %10s %9s %9s %8s %8s %9s %9s", "conc", "reqs", "out tok/s", "total tok/s",
           "tok/s/user", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "E2E p50", "E2E p99");
    if (bm->gpus > 1)
        printf(" %9s", "tok/s/GPU");
    if (b->have_bytes)
        printf(" %8s", "dec GB/s");
    if (bm->copy_bw > 0)
        printf(" %7s", "of copy");
    int any_spec = 0;
    for (int l = 0; l < o->n_levels; l++)
        any_spec |= b->S[l].spec;
    if (any_spec)
        printf(" %7s %8s %7s", "accept%", "tok/step", "verify");
    printf(" %4s\n", "err");
    for (int l = 0; l < o->n_levels; l++) {
        const summary_t *S = &b->S[l];
        printf("%5d %5d %10.1f %11.1f %10.1f %9.1f %9.1f %8.2f %8.2f %9.1f %9.1f", S->concurrency, S->requests,
               S->out_tps, S->total_tps, S->per_user, S->ttft50, S->ttft99, S->itl50, S->itl99, S->e2e50, S->e2e99);
        if (bm->gpus > 1)
            printf(" %9.1f", S->out_tps / bm->gpus);
        if (b->have_bytes)
            printf(" %8.1f", d->per_s[l] / 1e9);
        if (bm->copy_bw > 0)
            printf(" %6.1f%%", 100 * d->per_s[l] / d->bw);
        s_print_spec_cells(S, any_spec);
        printf(" %4d\n", S->errors);
    }
}

/* The cluster's tokens/s per user at concurrency 1 over troupe-generate's (the last level of
 * concurrency 1 gives it; 0 without one), printed for every such level. */
static double s_print_generate(const bench_t *b)
{
    double ratio = 0;
    printf("troupe-generate (one process): %.1f decode tok/s", b->gen_tps);
    for (int l = 0; l < b->o.n_levels; l++)
        if (b->S[l].concurrency == 1 && b->gen_tps > 0) {
            ratio = b->S[l].per_user / b->gen_tps;
            printf("; cluster at concurrency 1: %.1f tok/s/user = %.1f%% of it", b->S[l].per_user, 100 * ratio);
        }
    printf("\n");
    return ratio;
}

/* Per level the summary and its decode bytes; the run's lengths, bytes model and the
 * troupe-generate ratio beside them. */
static void s_json_single(const bench_t *b, const decode_bytes_t *d, double gen_ratio, json_t *j, json_t *arr)
{
    const options_t *o = &b->o;
    const bytes_model_t *bm = &b->bm;
    for (int l = 0; l < o->n_levels; l++) {
        json_t *lj = s_summary_json(&b->S[l]);
        json_object_set_new(lj, "output_tokens_per_s_per_gpu", json_real(b->S[l].out_tps / bm->gpus));
        if (b->have_bytes) {
            json_object_set_new(lj, "decode_bytes_per_step", json_real(d->step[l]));
            json_object_set_new(lj, "decode_bytes_per_s", json_real(d->per_s[l]));
        }
        if (bm->copy_bw > 0)
            json_object_set_new(lj, "copy_bandwidth_fraction", json_real(d->per_s[l] / d->bw));
        json_array_append_new(arr, lj);
    }
    json_object_set_new(j, "input_len", json_integer(o->in_len));
    if (b->have_bytes) {
        json_object_set_new(j, "weight_bytes_per_step", json_real(s_step_weight_bytes(bm, 1)));
        json_object_set_new(j, "kv_bytes_per_token", json_real(bm->kv_per_token));
        json_object_set_new(j, "decode_context_tokens", json_real(d->ctx));
        if (bm->have_cfg)
            json_object_set_new(j, "model_bytes_source", json_string(bm->source));
    }
    if (bm->copy_bw > 0)
        json_object_set_new(j, "copy_bandwidth_GBps", json_real(bm->copy_bw / 1e9));
    if (o->gen_model) {
        json_object_set_new(j, "generate_decode_tokens_per_s", json_real(b->gen_tps));
        json_object_set_new(j, "cluster_c1_over_generate", json_real(gen_ratio));
    }
}

/* The table on stdout and, with --json, the same figures in a file (a write failure is reported,
 * not fatal: the table has been printed). */
static void s_report(const bench_t *b)
{
    const options_t *o = &b->o;
    json_t *j = json_pack("{s:s, s:i, s:s, s:i}", "mode", o->multi ? "multi-turn" : "single", "output_len", o->out_len,
                          "endpoint", b->ep, "gpus", b->bm.gpus);
    json_t *arr = json_array();
    if (o->multi) {
        s_print_multi(b);
        s_json_multi(b, j, arr);
    } else {
        const decode_bytes_t d = s_decode_bytes(b);
        s_print_single(b, &d);
        double ratio = o->gen_model ? s_print_generate(b) : 0;
        s_json_single(b, &d, ratio, j, arr);
    }
    json_object_set_new(j, "levels", arr);
    if (o->json_path && json_dump_file(j, o->json_path, JSON_INDENT(1)) != 0)
        fprintf(stderr, "troupe-bench: cannot write %s\n", o->json_path);
    json_decref(j);
}

/* The options; what they name (the model for --http, the endpoints, the prompt text, the decode
 * bytes), each refused with exit 2 when wrong; troupe-generate's rate; a warm-up; the levels; the
 * report. Exit 1 when a request failed. */
int main(int argc, char **argv)
{
    bench_t b = {0};
    int rc = s_parse_args(&b.o, argc, argv);
    if (rc >= 0)
        return rc;
    if (s_http_model(&b) != 0 || s_endpoints(&b) != 0 || s_prompt_text(&b) != 0 || s_bytes_model(&b) != 0)
        return 2;
    char bin_dir[1024];
    s_bin_dir(bin_dir, sizeof bin_dir);
    const options_t *o = &b.o;
    if (o->gen_model && !o->multi)
        b.gen_tps = s_generate(bin_dir, o->gen_model, o->gen_args, o->in_len, o->out_len, o->vocab);
    if (s_warmup(&b) != 0)
        return 1;
    s_run_levels(&b);
    s_report(&b);
    free(b.text);
    return b.errors ? 1 : 0;
}
