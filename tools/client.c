/* tools/client.c — troupe-client: submit a request to a cluster and stream the answer.
 *
 *   troupe-client [--endpoint EP[,EP...] | --topology FILE] [--server-key FILE --key PREFIX] [--json]
 *                 [--timeout-ms N] [--heartbeat-ms N] [--heartbeat-timeout-ms N] submit [opts] TEXT
 *   troupe-client [...] cancel ID
 *
 * Text streams to stdout as it arrives (with submit --no-stream, all of it at the end, from the done);
 * --json prints every reply as one JSON object per line.
 * Exit codes: 0 done, 1 the cluster answered with an error (or the connection to the router was
 * lost mid-request: the library's retryable `unavailable` error, tools/lib/client.h), 2 bad usage,
 * 3 no reply in time, or no connection to any router within the heartbeat timeout (a cluster that
 * is not running: said at once, not after --timeout-ms of silence). */
#include <float.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tools/lib/args.h"
#include "tools/lib/client.h"
#include "topology/topology.h"

#define MAX_IDS 65536

static void s_usage(FILE *f)
{
    fprintf(f,
        "usage: troupe-client [--endpoint EP[,EP...] | --topology FILE] [--server-key FILE --key PREFIX] [--json]\n"
        "                     [--timeout-ms N] [--heartbeat-ms N] [--heartbeat-timeout-ms N] COMMAND\n"
        "  --endpoint EP,EP    several routers (a topology's endpoints.clients; --topology gives them all): a\n"
        "                      request that has no reply yet when its router is lost is sent to the next\n"
        "  --timeout-ms N      wait this long for the terminal reply (default 120000)\n"
        "  --heartbeat-ms N    a heartbeat to the router this often (default %d; 0: none, so only a closed\n"
        "                      connection is noticed)\n"
        "  --heartbeat-timeout-ms N  no answer this long: the connection is lost and the request ends with a\n"
        "                      retryable unavailable error (default %d); no connection this long at the\n"
        "                      start: exit 3 (is the cluster running?)\n"
        "  --server-key FILE   the cluster's CURVE public key (default with --topology: security.curve_server_public)\n"
        "  --key PREFIX        our CURVE keypair, PREFIX.pub and PREFIX.key (make one with troupe-keygen)\n"
        "commands:\n"
        "  submit [options] TEXT   generate from TEXT, streaming the answer\n"
        "    --chat                TEXT is a user chat message (the model's chat template applies)\n"
        "    --system TEXT         a system message before it (implies --chat)\n"
        "    --ids                 TEXT is a comma-separated list of token ids\n"
        "    --max-tokens N  --temperature T  --top-k K  --top-p P  --min-p P  --seed S\n"
        "    --repetition-penalty R  --presence-penalty P  --frequency-penalty P\n"
        "    --stop STR (repeatable)  --stop-id ID (repeatable)  --ignore-eos  --logprobs\n"
        "    --cache-key KEY       prompt_cache_key: retain this prompt's prefix\n"
        "    --retention DUR       how long: 300, 5m, 1h (needs --cache-key)\n"
        "    --tenant NAME         cache isolation domain\n"
        "    --timeout DUR         the request's deadline at the cluster\n"
        "    --no-stream           no token messages: one final reply (done) carries the whole text\n"
        "    --cancel-after-ms N   send a cancel N ms after submitting\n"
        "  cancel ID               send a cancel for request ID; the router honours a cancel only from the\n"
        "                          connection that submitted the request, so this separate connection's\n"
        "                          cancel is ignored: use submit --cancel-after-ms\n"
        "default endpoint: the client endpoints of the embedded default topology\n",
        CLIENT_HEARTBEAT_IVL_MS, CLIENT_HEARTBEAT_TIMEOUT_MS);
}

static int s_parse_f(const char *opt, const char *v, float *out)
{
    double d;
    if (arg_double("troupe-client", opt, v, -FLT_MAX, FLT_MAX, &d) < 0)
        return -1;
    *out = (float)d;
    return 0;
}

static int s_parse_u(const char *opt, const char *v, long long lo, long long hi, long long *out)
{
    return arg_ll("troupe-client", opt, v, lo, hi, out);
}

static int s_print_reply(const msg_t *r, int json, int *done)
{
    if (json) {
        static char buf[1 << 20];
        if (msg_to_json(r, buf, sizeof buf) >= 0) {
            printf("%s\n", buf);
            fflush(stdout);   /* a stream: each message readable as it comes, also in a file or pipe */
        }
    }
    switch (r->type) {
    case MSG_TOKEN:
        if (!json && r->u.token.text) {
            fputs(r->u.token.text, stdout);
            fflush(stdout);
        }
        return 0;
    case MSG_DONE: {
        *done = 1;
        if (!json && r->u.done.text) {   /* --no-stream: the whole text comes here */
            fputs(r->u.done.text, stdout);
            fflush(stdout);
        }
        const msg_usage_t *u = &r->u.done.usage;
        char from[96] = "";   /* where the cached tokens came from, when the cluster said */
        if (u->cached_tokens && u->cached_device_tokens + u->cached_host_tokens + u->cached_disk_tokens)
            snprintf(from, sizeof from, ": device %u, host %u, disk %u", u->cached_device_tokens, u->cached_host_tokens,
                     u->cached_disk_tokens);
        if (!json)
            fprintf(stderr, "\n[done: %s; prompt %u (cached %u%s), completion %u tokens; ttft %u ms, e2e %u ms]\n",
                    msg_finish_name(r->u.done.finish), u->prompt_tokens, u->cached_tokens, from, u->completion_tokens,
                    r->u.done.timings.ttft_ms, r->u.done.timings.e2e_ms);
        return 0;
    }
    case MSG_ERROR:
        *done = 1;
        if (!json)
            fprintf(stderr, "troupe-client: error %s%s: %s%s%s\n", msg_error_code_name(r->u.error.code),
                    r->u.error.retryable ? " (retryable)" : "", r->u.error.message,
                    r->u.error.field ? " — field " : "", r->u.error.field ? r->u.error.field : "");
        return 1;
    default:
        return 0;
    }
}

#define GO_ON (-1)   /* not an exit code: this step went well, carry on */

/* The global options, before the command; the topology fills in what they leave out. */
typedef struct options {
    const char *endpoint;     /* --endpoint EP[,EP...]; NULL = the topology's client endpoints */
    const char *topology;     /* --topology FILE; NULL = the embedded default */
    client_opts_t copts;      /* keys, heartbeats and frame limit for client_connect_opts */
    int json;                 /* --json: every reply as one JSON object per line */
    long long timeout_ms;     /* --timeout-ms: how long to wait for the terminal reply */
    char ep[CLIENT_ROUTERS_MAX * TOPO_ENDPOINT_MAX];   /* the topology's endpoints, when endpoint points here */
    char server_key[1024];    /* the topology's server key, when copts.server_key points here */
} options_t;

/* What to send. The SUBMIT's pointers point into argv, into chat, or into the arrays below. */
typedef struct request {
    msg_t m;                  /* SUBMIT or CANCEL */
    long long cancel_after;   /* --cancel-after-ms: cancel it ourselves this long after sending; -1 never */
    msg_chat_t chat[2];       /* with --chat: the --system message, if any, then the user's */
} request_t;

/* Static, not on the stack: 256 KB of token ids. */
static uint32_t s_ids[MAX_IDS];                        /* --ids: the prompt's tokens */
static uint32_t s_stop_ids[MSG_MAX_STOP_TOKENS];       /* --stop-id */
static const char *s_stops[MSG_MAX_STOP];              /* --stop */

/* What `submit` reads besides the sampling and request fields, which go straight into the message. */
typedef struct submit_args {
    int as_chat;              /* --chat or --system: TEXT is a user chat message */
    int as_ids;               /* --ids: TEXT is comma-separated token ids */
    const char *system;       /* --system TEXT; NULL none */
    const char *text;         /* the one TEXT */
} submit_args_t;

/* Global options come before the command. Leaves *cmd at the command's index in argv. Returns
 * GO_ON, or the exit code for --help (0) and bad usage. */
static int s_parse_global(int argc, char **argv, options_t *o, int *cmd)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--endpoint") && i + 1 < argc) o->endpoint = argv[++i];
        else if (!strcmp(argv[i], "--topology") && i + 1 < argc) o->topology = argv[++i];
        else if (!strcmp(argv[i], "--server-key") && i + 1 < argc) o->copts.server_key = argv[++i];
        else if (!strcmp(argv[i], "--key") && i + 1 < argc) o->copts.key = argv[++i];
        else if (!strcmp(argv[i], "--json")) o->json = 1;
        else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc) {
            if (s_parse_u("--timeout-ms", argv[++i], 1, 86400000, &o->timeout_ms) != 0)
                return 2;
        } else if (!strcmp(argv[i], "--heartbeat-ms") && i + 1 < argc) {
            long long v;
            if (s_parse_u("--heartbeat-ms", argv[++i], 0, 3600000, &v) != 0)
                return 2;
            o->copts.heartbeat_ivl_ms = v ? (int)v : -1;
        } else if (!strcmp(argv[i], "--heartbeat-timeout-ms") && i + 1 < argc) {
            long long v;
            if (s_parse_u("--heartbeat-timeout-ms", argv[++i], 1, 3600000, &v) != 0)
                return 2;
            o->copts.heartbeat_timeout_ms = (int)v;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { s_usage(stdout); return 0; }
        else { fprintf(stderr, "troupe-client: unknown option '%s'\n", argv[i]); s_usage(stderr); return 2; }
    }
    if (i >= argc) { s_usage(stderr); return 2; }
    *cmd = i;
    return GO_ON;
}

/* Without --endpoint, the routers are the topology's. The topology also gives the frame limit
 * (checked before sending) and the server key, unless --server-key (or the environment) gave one. */
static int s_resolve_cluster(options_t *o)
{
    char err[512];
    if (!o->endpoint) {
        if (client_endpoints_from_topology(o->topology, o->ep, NULL, sizeof o->ep, err, sizeof err) != 0) {
            fprintf(stderr, "troupe-client: %s\n", err);
            return -1;
        }
        o->endpoint = o->ep;
    }
    const char *given_server_key = o->copts.server_key;
    if ((o->topology || !o->endpoint || o->endpoint == o->ep) &&
        client_opts_from_topology(o->topology, &o->copts, o->server_key, sizeof o->server_key, err, sizeof err) != 0) {
        fprintf(stderr, "troupe-client: %s\n", err);
        return -1;
    }
    if (given_server_key)
        o->copts.server_key = given_server_key;
    return 0;
}

/* `cancel ID`: a CANCEL for request ID. */
static int s_parse_cancel(int argc, char **argv, int i, request_t *r)
{
    long long id;
    if (i >= argc || s_parse_u("cancel", argv[i], 1, INT64_MAX, &id) != 0)
        return -1;
    msg_init(&r->m, MSG_CANCEL, (uint64_t)id);
    return 0;
}

/* One argument of `submit`: a, with v the one after it (NULL at the end). Returns how many of
 * the arguments after a it used (0 or 1), or -1 on bad usage, its message printed. The flags are
 * matched before the value check: any other --option last on the line needs a value (an unknown
 * one too). */
static int s_submit_arg(request_t *r, submit_args_t *sa, const char *a, const char *v)
{
    msg_submit_t *s = &r->m.u.submit;
    msg_sampling_t *sp = &s->sampling;
    long long x;
    if (!strcmp(a, "--chat")) { sa->as_chat = 1; return 0; }
    if (!strcmp(a, "--ids")) { sa->as_ids = 1; return 0; }
    if (!strcmp(a, "--ignore-eos")) { sp->ignore_eos = true; return 0; }
    if (!strcmp(a, "--logprobs")) { sp->logprobs = true; return 0; }
    if (!strcmp(a, "--no-stream")) { s->stream = false; return 0; }
    if (a[0] == '-' && a[1] == '-' && !v) { fprintf(stderr, "troupe-client: %s needs a value\n", a); return -1; }
    if (!strcmp(a, "--system")) { sa->system = v; sa->as_chat = 1; }
    else if (!strcmp(a, "--max-tokens")) { if (s_parse_u(a, v, 1, MSG_MAX_NEW_TOKENS, &x)) return -1; sp->max_tokens = (uint32_t)x; }
    else if (!strcmp(a, "--temperature")) { if (s_parse_f(a, v, &sp->temperature)) return -1; }
    else if (!strcmp(a, "--top-k")) { if (s_parse_u(a, v, 0, UINT32_MAX, &x)) return -1; sp->top_k = (uint32_t)x; }
    else if (!strcmp(a, "--top-p")) { if (s_parse_f(a, v, &sp->top_p)) return -1; }
    else if (!strcmp(a, "--min-p")) { if (s_parse_f(a, v, &sp->min_p)) return -1; }
    else if (!strcmp(a, "--repetition-penalty")) { if (s_parse_f(a, v, &sp->repetition_penalty)) return -1; }
    else if (!strcmp(a, "--presence-penalty")) { if (s_parse_f(a, v, &sp->presence_penalty)) return -1; }
    else if (!strcmp(a, "--frequency-penalty")) { if (s_parse_f(a, v, &sp->frequency_penalty)) return -1; }
    else if (!strcmp(a, "--seed")) { if (s_parse_u(a, v, 0, INT64_MAX, &x)) return -1; sp->seed = x; }
    else if (!strcmp(a, "--stop")) { if (sp->n_stop >= MSG_MAX_STOP) { fprintf(stderr, "troupe-client: at most %d --stop\n", MSG_MAX_STOP); return -1; } s_stops[sp->n_stop++] = v; sp->stop = s_stops; }
    else if (!strcmp(a, "--stop-id")) { if (sp->n_stop_token_ids >= MSG_MAX_STOP_TOKENS || s_parse_u(a, v, 0, UINT32_MAX, &x)) return -1; s_stop_ids[sp->n_stop_token_ids++] = (uint32_t)x; sp->stop_token_ids = s_stop_ids; }
    else if (!strcmp(a, "--cache-key")) { s->prompt_cache_key = v; }
    else if (!strcmp(a, "--retention")) { int64_t d = client_parse_duration_s(v); if (d < 0) { fprintf(stderr, "troupe-client: --retention: '%s' is not a duration (300, 5m, 1h)\n", v); return -1; } s->cache_retention_s = (uint32_t)d; }
    else if (!strcmp(a, "--tenant")) { s->tenant = v; }
    else if (!strcmp(a, "--timeout")) { int64_t d = client_parse_duration_s(v); if (d < 0) { fprintf(stderr, "troupe-client: --timeout: '%s' is not a duration\n", v); return -1; } s->timeout_ms = (uint32_t)(d * 1000); }
    else if (!strcmp(a, "--cancel-after-ms")) { if (s_parse_u(a, v, 0, 86400000, &r->cancel_after)) return -1; }
    else if (a[0] == '-' && a[1] == '-') { fprintf(stderr, "troupe-client: unknown option '%s'\n", a); return -1; }
    else { if (sa->text) { fprintf(stderr, "troupe-client: one TEXT only (quote it)\n"); return -1; } sa->text = a; return 0; }
    return 1;
}

/* TEXT becomes the prompt in the shape asked for: token ids, chat messages, or plain text. */
static int s_submit_prompt(request_t *r, const submit_args_t *sa)
{
    msg_submit_t *s = &r->m.u.submit;
    if (sa->as_ids) {
        char *copy = strdup(sa->text), *save = NULL;
        for (char *t = strtok_r(copy, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
            long long x;
            if (s->n_tokens >= MAX_IDS || s_parse_u("--ids", t, 0, UINT32_MAX, &x)) return -1;
            s_ids[s->n_tokens++] = (uint32_t)x;
        }
        s->tokens = s_ids;
    } else if (sa->as_chat) {
        int n = 0;
        if (sa->system) r->chat[n++] = (msg_chat_t){.role = MSG_CHAT_SYSTEM, .content = sa->system};
        r->chat[n++] = (msg_chat_t){.role = MSG_CHAT_USER, .content = sa->text};
        s->messages = r->chat;
        s->n_messages = (uint32_t)n;
    } else {
        s->prompt = sa->text;
    }
    return 0;
}

/* `submit [options] TEXT`: a streamed SUBMIT unless --no-stream. */
static int s_parse_submit(int argc, char **argv, int i, request_t *r)
{
    msg_init(&r->m, MSG_SUBMIT, 0);
    r->m.u.submit.stream = true;
    submit_args_t sa = {0};
    for (; i < argc; i++) {
        const int used = s_submit_arg(r, &sa, argv[i], i + 1 < argc ? argv[i + 1] : NULL);
        if (used < 0)
            return -1;
        i += used;
    }
    if (!sa.text) { fprintf(stderr, "troupe-client: submit needs TEXT\n"); return -1; }
    return s_submit_prompt(r, &sa);
}

/* The command at argv[i] and its arguments, into *r. Returns 0, or -1 on bad usage. */
static int s_parse_command(int argc, char **argv, int i, request_t *r)
{
    const char *cmd = argv[i++];
    if (!strcmp(cmd, "cancel"))
        return s_parse_cancel(argc, argv, i, r);
    if (!strcmp(cmd, "submit"))
        return s_parse_submit(argc, argv, i, r);
    fprintf(stderr, "troupe-client: unknown command '%s'\n", cmd);
    s_usage(stderr);
    return -1;
}

/* Waits for the request's terminal reply (done or error), printing every reply to it as it comes,
 * and sends the --cancel-after-ms cancel when its time comes. Returns the exit code. */
static int s_stream_replies(client_t *c, uint64_t id, const options_t *o, const request_t *r)
{
    char err[512];
    int64_t start = now_ms(), deadline = start + o->timeout_ms;
    int done = 0, rc = 0, cancelled = 0;
    while (!done) {
        int64_t left = deadline - now_ms();
        if (r->cancel_after >= 0 && !cancelled) {
            int64_t until = start + r->cancel_after - now_ms();
            if (until <= 0) {
                client_cancel(c, id, err, sizeof err);
                cancelled = 1;
                continue;
            }
            if (until < left)
                left = until;
        }
        if (left <= 0 && now_ms() >= deadline) {
            fprintf(stderr, "troupe-client: no terminal reply for request %llu within %lld ms\n",
                    (unsigned long long)id, o->timeout_ms);
            return 3;
        }
        msg_t reply;
        int got = client_recv(c, &reply, (int)(left > 0 ? left : 1), err, sizeof err);
        if (got == 1)
            continue;
        if (got < 0) { fprintf(stderr, "troupe-client: %s\n", err); return 1; }
        if (reply.id == id)
            rc = s_print_reply(&reply, o->json, &done);
        msg_free(&reply);
    }
    return rc;
}

/* Said on stderr, whatever the outcome: a request that had to go to another router means one
 * router's connection was lost, which the answer alone would not show. */
static void s_report_retries(client_t *c, uint64_t id)
{
    if (client_requests_retried(c))
        fprintf(stderr, "troupe-client: request %llu was sent again to another router %llu time(s): its router's "
                "connection was lost before any reply\n", (unsigned long long)id,
                (unsigned long long)client_requests_retried(c));
}

int main(int argc, char **argv)
{
    options_t o = {.copts = {.server_key = getenv("TROUPE_CURVE_SERVER_KEY"), .key = getenv("TROUPE_CURVE_KEY")},
                   .timeout_ms = 120000};
    int cmd = 0;
    const int parsed = s_parse_global(argc, argv, &o, &cmd);
    if (parsed != GO_ON)
        return parsed;
    if (s_resolve_cluster(&o) != 0)
        return 2;
    request_t r = {.cancel_after = -1};
    if (s_parse_command(argc, argv, cmd, &r) != 0)
        return 2;

    char err[512];
    client_t *c = client_connect_opts(o.endpoint, &o.copts, err, sizeof err);
    if (!c) { fprintf(stderr, "troupe-client: %s\n", err); return 2; }
    /* ZeroMQ connects in the background and queues what is sent: against a cluster that is not
     * running, a request would wait in silence for the whole --timeout-ms, and a cancel would be
     * dropped unsent at exit while this says nothing. */
    int connect_ms = o.copts.heartbeat_timeout_ms > 0 ? o.copts.heartbeat_timeout_ms : CLIENT_HEARTBEAT_TIMEOUT_MS;
    if (connect_ms > o.timeout_ms)
        connect_ms = (int)o.timeout_ms;
    if (!client_wait_connected(c, connect_ms)) {
        fprintf(stderr, "troupe-client: no connection to the router at %s within %d ms: is the cluster running, "
                "and is that its client endpoint (endpoints.client)?%s\n", o.endpoint, connect_ms,
                o.copts.server_key && *o.copts.server_key ? " (or its CURVE allow-list lacks our key)" : "");
        client_destroy(&c);
        return 3;
    }
    uint64_t id;
    if (client_send(c, &r.m, &id, err, sizeof err) != 0) {
        fprintf(stderr, "troupe-client: %s\n", err);
        client_destroy(&c);
        return 2;
    }
    if (r.m.type == MSG_CANCEL) {
        /* Fire and forget: the request's own stream gets its terminal reply (done, cancelled). */
        client_destroy(&c);
        return 0;
    }
    const int rc = s_stream_replies(c, id, &o, &r);
    s_report_retries(c, id);
    client_destroy(&c);
    return rc;
}
