/* tools/top.c — troupe-top: the live view of a cluster, from its monitor actor.
 *
 *   troupe-top [--topology FILE | --endpoint EP] [--once] [--json] [--metrics] [--interval-ms N]
 *
 * Live mode (a terminal): an ncurses table refreshed every interval; q quits. --once prints one
 * plain-text snapshot (for scripts and logs); --json prints the monitor's reply as JSON.
 * Exit codes: 0 ok, 2 bad usage, 3 the monitor did not answer. */
#include <errno.h>
#include <locale.h>
#include <ncurses.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "tools/lib/client.h"

#define SILENT_MS 3000   /* stats older than this: the actor is down or wedged */

static double s_metric(const msg_stats_t *st, const char *name, double dflt)
{
    for (uint32_t i = 0; i < st->n_metrics; i++)
        if (strcmp(st->metrics[i].name, name) == 0)
            return st->metrics[i].value;
    return dflt;
}

static const char *s_state(const msg_stats_t *st)
{
    if (s_metric(st, "silent_ms", 0) > SILENT_MS)
        return "silent";
    return msg_state_name(st->state);
}

static int s_cmp(const void *a, const void *b)
{
    const msg_stats_t *x = a, *y = b;
    if (x->role != y->role)
        return (int)x->role - (int)y->role;
    return strcmp(x->name, y->name);
}

/* Appends a metric's value in a column of width w, or "-" where the actor has no such metric. */
static size_t s_col(char *buf, size_t cap, const msg_stats_t *st, const char *name, int w, int prec)
{
    for (uint32_t i = 0; i < st->n_metrics; i++)
        if (strcmp(st->metrics[i].name, name) == 0)
            return (size_t)snprintf(buf, cap, " %*.*f", w, prec, st->metrics[i].value);
    return (size_t)snprintf(buf, cap, " %*s", w, "-");
}

static int s_has(const msg_stats_t *st, const char *name)
{
    for (uint32_t i = 0; i < st->n_metrics; i++)
        if (strcmp(st->metrics[i].name, name) == 0)
            return 1;
    return 0;
}

/* The cache-manager's tiers, one line each: blocks and bytes held, pinned, blocks served by
 * fetches; then the disk tier's traffic and refusals (when it has one). */
static size_t s_tiers(const msg_stats_t *st, char *buf, size_t cap)
{
    static const struct { const char *tier, *blocks, *bytes, *pinned, *hits; } rows[] = {
        {"device", "device_blocks_indexed", "device_bytes_indexed", NULL, NULL},
        {"host", "host_blocks_used", "host_bytes_used", "host_blocks_pinned", "fetch_hits_host_total"},
        {"disk", "disk_blocks_used", "disk_bytes_used", "disk_blocks_pinned", "fetch_hits_disk_total"},
    };
    size_t n = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (!s_has(st, rows[i].blocks))
            continue;
        n += (size_t)snprintf(buf + n, cap - n, "%-18s %-6s", st->name, rows[i].tier);
        n += s_col(buf + n, cap - n, st, rows[i].blocks, 9, 0);
        n += (size_t)snprintf(buf + n, cap - n, " %9.1f", s_metric(st, rows[i].bytes, 0) / (1 << 20));
        n += rows[i].pinned ? s_col(buf + n, cap - n, st, rows[i].pinned, 7, 0) : (size_t)snprintf(buf + n, cap - n, " %7s", "-");
        n += rows[i].hits ? s_col(buf + n, cap - n, st, rows[i].hits, 9, 0) : (size_t)snprintf(buf + n, cap - n, " %9s", "-");
        n += (size_t)snprintf(buf + n, cap - n, "\n");
    }
    if (s_has(st, "disk_spills_total"))
        n += (size_t)snprintf(buf + n, cap - n,
                              "%-18s disk: %.0f spills, %.0f shed, %.0f reads (%.2f ms mean, %.2f ms max), "
                              "%.0f refused corrupt, %.0f of another model/dtype\n",
                              st->name, s_metric(st, "disk_spills_total", 0) + s_metric(st, "disk_persists_total", 0),
                              s_metric(st, "disk_spills_shed_total", 0), s_metric(st, "disk_reads_total", 0),
                              s_metric(st, "disk_read_ms", 0), s_metric(st, "disk_read_ms_max", 0),
                              s_metric(st, "disk_dropped_corrupt_total", 0), s_metric(st, "disk_dropped_foreign_total", 0));
    return n;
}

/* Renders one snapshot as lines of text into buf (shared by --once and the live view): every
 * actor's life (first table), then the serving view of the actors that serve (second table), then
 * with all_metrics every metric by name. */
/* Experts: each decode worker's expert-parallel group (ranks, the placement in use and the one
 * loading, switches, experts moved, the transport of its dispatch and combine) and the expert-balancer's view: its epoch, pushes, per-layer
 * busiest/average rank load in order -> placed, the shown layer's load share per expert and the
 * experts each rank holds in the latest placement. */
static size_t s_experts(const msg_stats_t *rows, uint32_t n_rows, char *buf, size_t cap)
{
    size_t n = 0;
    int groups = 0;
    for (uint32_t i = 0; i < n_rows && n + 512 < cap; i++) {
        const msg_stats_t *st = &rows[i];
        if (!s_has(st, "ep_ranks"))
            continue;
        if (!groups++)
            n += (size_t)snprintf(buf + n, cap - n, "\n%-18s %5s %6s %8s %8s %9s %7s %10s %5s\n", "EXPERT GROUP", "RANKS",
                                  "EPOCH", "PENDING", "LOADING", "SWITCHES", "MOVED", "ENTRIES", "XPORT");
        n += (size_t)snprintf(buf + n, cap - n, "%-18s", st->name);
        n += s_col(buf + n, cap - n, st, "ep_ranks", 5, 0);
        n += s_col(buf + n, cap - n, st, "ep_epoch", 6, 0);
        n += s_col(buf + n, cap - n, st, "ep_pending_epoch", 8, 0);
        n += s_col(buf + n, cap - n, st, "ep_loading_layers", 8, 0);
        n += s_col(buf + n, cap - n, st, "ep_switches_total", 9, 0);
        n += s_col(buf + n, cap - n, st, "ep_experts_loaded_total", 7, 0);
        n += s_col(buf + n, cap - n, st, "ep_entries_total", 10, 0);
        n += (size_t)snprintf(buf + n, cap - n, " %5s\n", !s_has(st, "ep_transport_nccl") ? "-"
                              : s_metric(st, "ep_transport_nccl", 0) > 0 ? "nccl" : "sock");
    }
    for (uint32_t i = 0; i < n_rows && n + 2048 < cap; i++) {
        const msg_stats_t *st = &rows[i];
        if (!s_has(st, "placement_epoch") || !s_has(st, "loads_refused"))
            continue;
        n += (size_t)snprintf(buf + n, cap - n, "\n%-18s epoch %.0f, %.0f ranks, %.0f groups, %.0f placements pushed\n",
                              "EXPERT BALANCER", s_metric(st, "placement_epoch", 0), s_metric(st, "ranks", 0),
                              s_metric(st, "groups", 0), s_metric(st, "placements_pushed", 0));
        for (int l = 0; l < 8; l++) {
            char a[48], b[48];
            snprintf(a, sizeof a, "layer%d_busiest_over_avg_in_order", l);
            snprintf(b, sizeof b, "layer%d_busiest_over_avg_placed", l);
            if (s_has(st, b))
                n += (size_t)snprintf(buf + n, cap - n, "  layer %d busiest/average rank: %.3f in order -> %.3f placed\n",
                                      l, s_metric(st, a, 0), s_metric(st, b, 0));
        }
        if (!s_has(st, "shown_layer"))
            continue;
        n += (size_t)snprintf(buf + n, cap - n, "  layer %.0f load per expert (%%):", s_metric(st, "shown_layer", 0));
        for (int e = 0; e < 64 && n + 64 < cap; e++) {
            char nm[32];
            snprintf(nm, sizeof nm, "expert%d_load_share", e);
            if (!s_has(st, nm))
                break;
            n += (size_t)snprintf(buf + n, cap - n, "%s%d:%.1f", e % 8 ? " " : "\n   ", e, 100 * s_metric(st, nm, 0));
        }
        int slots = 0;
        for (; slots < 64; slots++) {
            char nm[32];
            snprintf(nm, sizeof nm, "slot%d_expert", slots);
            if (!s_has(st, nm))
                break;
        }
        const int ranks = (int)s_metric(st, "ranks", 0);
        if (slots && ranks > 0 && slots % ranks == 0) {
            n += (size_t)snprintf(buf + n, cap - n, "\n  placement (experts per rank):");
            for (int s = 0; s < slots && n + 64 < cap; s++) {
                char nm[32];
                snprintf(nm, sizeof nm, "slot%d_expert", s);
                if (s % (slots / ranks) == 0)
                    n += (size_t)snprintf(buf + n, cap - n, "\n   rank %d:", s / (slots / ranks));
                n += (size_t)snprintf(buf + n, cap - n, " %.0f", s_metric(st, nm, 0));
            }
        }
        n += (size_t)snprintf(buf + n, cap - n, "\n");
    }
    return n;
}

static void s_render(const msg_t *r, char *buf, size_t cap, int all_metrics)
{
    const msg_inspect_reply_t *ir = &r->u.inspect_reply;
    msg_stats_t *rows = malloc(ir->n_actors * sizeof *rows + 1);
    memcpy(rows, ir->actors, ir->n_actors * sizeof *rows);
    qsort(rows, ir->n_actors, sizeof *rows, s_cmp);
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "troupe-top — %u actors, monitor up %.1f s\n",
                          ir->n_actors, (double)ir->uptime_ms / 1000.0);
    n += (size_t)snprintf(buf + n, cap - n, "%-18s %-16s %7s %9s %-9s %8s %9s %9s %9s %6s %6s\n",
                          "ACTOR", "ROLE", "PID", "UPTIME", "STATE", "RESTARTS", "MSGS_IN",
                          "MSGS_OUT", "MALFORMED", "QUEUE", "CPU%");
    for (uint32_t i = 0; i < ir->n_actors && n < cap - 512; i++) {
        const msg_stats_t *st = &rows[i];
        uint64_t q = 0;
        for (uint32_t k = 0; k < st->n_queues; k++)
            q += st->queues[k].depth;
        n += (size_t)snprintf(buf + n, cap - n, "%-18s %-16s %7u %8.1fs %-9s %8u %9llu %9llu %9llu %6llu",
                              st->name, msg_role_name(st->role), st->pid,
                              /* stats are up to a second old: age them to now */
                              (double)st->uptime_ms / 1000.0 + s_metric(st, "silent_ms", 0) / 1000.0,
                              s_state(st), st->restarts, (unsigned long long)st->msgs_in,
                              (unsigned long long)st->msgs_out, (unsigned long long)st->malformed,
                              (unsigned long long)q);
        /* its CPU over its last stats interval, all threads: an actor near 100% x its threads is
         * the cluster's limit (a router relaying every token) */
        n += s_col(buf + n, cap - n, st, "cpu_percent", 6, 0);
        n += (size_t)snprintf(buf + n, cap - n, "\n");
    }
    n += (size_t)snprintf(buf + n, cap - n, "\n%-18s %5s %5s %5s %8s %8s %8s %7s %7s %6s %8s %8s %7s %7s\n",
                          "SERVING", "RUN", "WAIT", "BATCH", "TOK/S", "KV_USED", "KV_FREE", "HIT%", "XFERS",
                          "XFAIL", "TTFT_P50", "TTFT_P99", "ITL_P50", "ITL_P99");
    for (uint32_t i = 0; i < ir->n_actors && n < cap - 512; i++) {
        const msg_stats_t *st = &rows[i];
        if (!s_has(st, "requests_running") && !s_has(st, "host_blocks_used"))
            continue;
        n += (size_t)snprintf(buf + n, cap - n, "%-18s", st->name);
        n += s_col(buf + n, cap - n, st, "requests_running", 5, 0);
        n += s_col(buf + n, cap - n, st, "requests_waiting", 5, 0);
        n += s_col(buf + n, cap - n, st, "batch_size", 5, 0);
        n += s_col(buf + n, cap - n, st, "tokens_per_s", 8, 1);
        n += s_col(buf + n, cap - n, st, s_has(st, "kv_blocks_used") ? "kv_blocks_used" : "host_blocks_used", 8, 0);
        n += s_col(buf + n, cap - n, st, s_has(st, "kv_blocks_free") ? "kv_blocks_free" : "host_blocks_free", 8, 0);
        /* Hit rate: the router's prefix look-ups (blocks found anywhere / blocks asked), the
         * prefill's reuse (cached / prompt tokens), the cache-manager's fetches. */
        double hits = -1, queries = 0;
        if (s_has(st, "prefix_cache_queries"))
            hits = s_metric(st, "prefix_cache_hits", 0), queries = s_metric(st, "prefix_cache_queries", 0);
        else if (s_has(st, "cached_tokens_total") && s_has(st, "prompt_tokens_total") && !s_has(st, "ttft_p50_ms"))
            hits = s_metric(st, "cached_tokens_total", 0), queries = s_metric(st, "prompt_tokens_total", 0);
        else if (s_has(st, "fetch_queries_total"))
            hits = s_metric(st, "fetch_hits_total", 0), queries = s_metric(st, "fetch_queries_total", 0);
        if (hits >= 0 && queries > 0)
            n += (size_t)snprintf(buf + n, cap - n, " %6.1f%%", 100.0 * hits / queries);
        else
            n += (size_t)snprintf(buf + n, cap - n, " %7s", "-");
        n += s_col(buf + n, cap - n, st, "transfers_total", 7, 0);
        n += s_col(buf + n, cap - n, st, "transfer_failures_total", 6, 0);
        n += s_col(buf + n, cap - n, st, "ttft_p50_ms", 8, 1);
        n += s_col(buf + n, cap - n, st, "ttft_p99_ms", 8, 1);
        n += s_col(buf + n, cap - n, st, "itl_p50_ms", 7, 1);
        n += s_col(buf + n, cap - n, st, "itl_p99_ms", 7, 1);
        n += (size_t)snprintf(buf + n, cap - n, "\n");
    }
    /* Speculation: the decode workers' acceptance and chosen verify length, the draft-scheduler's
     * view of the cluster and the length its policy gives a batch of 1 and of 64. */
    int specs = 0;
    for (uint32_t i = 0; i < ir->n_actors && n < cap - 512; i++) {
        const msg_stats_t *st = &rows[i];
        if (!s_has(st, "spec_draft_tokens_total"))
            continue;
        if (!specs++)
            n += (size_t)snprintf(buf + n, cap - n, "\n%-18s %8s %8s %7s %7s %6s %7s %7s\n", "SPECULATION", "DRAFTS",
                                  "ACCEPT%", "TOK/VER", "VERIFY", "POLICY", "K@B1", "K@B64");
        n += (size_t)snprintf(buf + n, cap - n, "%-18s", st->name);
        n += s_col(buf + n, cap - n, st, "spec_draft_tokens_total", 8, 0);
        n += (size_t)snprintf(buf + n, cap - n, " %7.1f%%", 100 * s_metric(st, "spec_acceptance_rate", 0));
        n += s_col(buf + n, cap - n, st, "spec_mean_accepted_length", 7, 2);
        n += s_col(buf + n, cap - n, st, "spec_chosen_verify_len", 7, 2);
        /* the scheduler's source (none, computed, pinned by file); a worker's pushed policy or default */
        static const char *const sources[] = {"none", "auto", "pinned"};
        const char *pol = "-";
        if (s_has(st, "policy_source"))
            pol = sources[(int)s_metric(st, "policy_source", 0) % 3];
        else if (s_has(st, "spec_policy_active"))
            pol = s_metric(st, "spec_policy_active", 0) ? "pushed" : "default";
        n += (size_t)snprintf(buf + n, cap - n, " %6s", pol);
        n += s_col(buf + n, cap - n, st, "verify_len_batch1", 7, 0);
        n += s_col(buf + n, cap - n, st, "verify_len_batch64", 7, 0);
        n += (size_t)snprintf(buf + n, cap - n, "\n");
    }
    n += s_experts(rows, ir->n_actors, buf + n, cap - n);
    int tiers = 0;
    for (uint32_t i = 0; i < ir->n_actors && n < cap - 1024; i++) {
        if (!s_has(&rows[i], "host_blocks_used"))
            continue;
        if (!tiers++)
            n += (size_t)snprintf(buf + n, cap - n, "\n%-18s %-6s %9s %9s %7s %9s\n", "KV CACHE", "TIER", "BLOCKS",
                                  "MIB", "PINNED", "HITS");
        n += s_tiers(&rows[i], buf + n, cap - n);
    }
    if (all_metrics) {
        n += (size_t)snprintf(buf + n, cap - n, "\nMETRICS\n");
        for (uint32_t i = 0; i < ir->n_actors && n < cap - 512; i++) {
            const msg_stats_t *st = &rows[i];
            n += (size_t)snprintf(buf + n, cap - n, "%-18s", st->name);
            for (uint32_t k = 0; k < st->n_metrics && n < cap - 256; k++)
                n += (size_t)snprintf(buf + n, cap - n, " %s=%g", st->metrics[k].name, st->metrics[k].value);
            n += (size_t)snprintf(buf + n, cap - n, "\n");
        }
    }
    free(rows);
}

static int s_query(client_t *c, msg_t *reply, char *err, size_t errlen)
{
    msg_t q;
    msg_init(&q, MSG_INSPECT, 0);
    q.u.inspect.what = MSG_INSPECT_ACTORS;
    return client_call(c, &q, reply, 3000, err, errlen);
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *topology = NULL;
    int once = 0, json = 0, all_metrics = 0;
    long interval = 1000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--endpoint") && i + 1 < argc) endpoint = argv[++i];
        else if (!strcmp(argv[i], "--topology") && i + 1 < argc) topology = argv[++i];
        else if (!strcmp(argv[i], "--once")) once = 1;
        else if (!strcmp(argv[i], "--json")) json = once = 1;
        else if (!strcmp(argv[i], "--metrics")) all_metrics = 1;
        else if (!strcmp(argv[i], "--interval-ms") && i + 1 < argc) {
            char *end;
            interval = strtol(argv[++i], &end, 10);
            if (*end || interval < 50 || interval > 3600000) {
                fprintf(stderr, "troupe-top: --interval-ms: 50..3600000\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: troupe-top [--topology FILE | --endpoint EP] [--once] [--json] [--metrics] [--interval-ms N]\n"
                   "  --once: one plain-text snapshot; --json: the monitor's reply as JSON;\n"
                   "  --metrics: every metric of every actor by name, after the tables\n");
            return 0;
        } else {
            fprintf(stderr, "troupe-top: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    char err[512], ep[256];
    if (!endpoint) {
        if (client_endpoints_from_topology(topology, NULL, ep, sizeof ep, err, sizeof err) != 0) {
            fprintf(stderr, "troupe-top: %s\n", err);
            return 2;
        }
        endpoint = ep;
    }
    client_t *c = client_connect(endpoint, err, sizeof err);
    if (!c) {
        fprintf(stderr, "troupe-top: %s\n", err);
        return 2;
    }
    static char text[1 << 20];
    int rc = 0;
    if (once || !isatty(STDOUT_FILENO)) {
        msg_t r;
        msg_init(&r, MSG_NONE, 0);
        if (s_query(c, &r, err, sizeof err) != 0) {
            fprintf(stderr, "troupe-top: monitor at %s: %s\n", endpoint, err);
            rc = 3;
        } else if (r.type != MSG_INSPECT_REPLY) {
            fprintf(stderr, "troupe-top: monitor answered %s\n", msg_type_name(r.type));
            rc = 3;
        } else if (json) {
            if (msg_to_json(&r, text, sizeof text) < 0)
                rc = 3;
            else
                printf("%s\n", text);
        } else {
            s_render(&r, text, sizeof text, all_metrics);
            fputs(text, stdout);
        }
        msg_free(&r);
        client_destroy(&c);
        return rc;
    }

    setlocale(LC_ALL, "");
    initscr();
    cbreak();
    noecho();
    curs_set(0);
    timeout((int)interval);
    for (;;) {
        msg_t r;
        msg_init(&r, MSG_NONE, 0);
        erase();
        if (s_query(c, &r, err, sizeof err) == 0 && r.type == MSG_INSPECT_REPLY) {
            s_render(&r, text, sizeof text, all_metrics);
            mvaddstr(0, 0, text);
        } else {
            mvprintw(0, 0, "troupe-top: monitor at %s: %s (retrying)", endpoint, err);
        }
        msg_free(&r);
        mvprintw(LINES - 1, 0, "q: quit   refresh every %ld ms", interval);
        refresh();
        int ch = getch();
        if (ch == 'q' || ch == 'Q')
            break;
    }
    endwin();
    client_destroy(&c);
    return 0;
}
