/* topology/print.c — the effective topology, after defaults, as a topology file.
 *
 * The output is itself a valid topology file with every field spelled out (loading it gives
 * the same topology: a unit test checks the round trip), followed by comments that show what
 * was derived: each instance with its node, GPU and inbox, and the cluster endpoints. */
#include "topology/topology.h"

#include <string.h>

/* A YAML double-quoted scalar: safe for any bytes a path may hold. */
static void s_q(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void s_kv(FILE *f, const char *indent, const char *key, const char *val)
{
    fprintf(f, "%s%s: ", indent, key);
    s_q(f, val);
    fputc('\n', f);
}

void topo_print(const topo_t *t, FILE *f)
{
    fprintf(f, "# effective topology of %s\n", t->source);
    s_kv(f, "", "name", t->name);
    fprintf(f, "model:\n");
    s_kv(f, "  ", "path", t->model.path);
    s_kv(f, "  ", "tokenizer", t->model.tokenizer);
    if (t->model.draft[0])
        s_kv(f, "  ", "draft", t->model.draft);
    static const char *const quants[] = {"none", "fp8", "int8", "int4", "nvfp4"};
    static const char *const kv_scales[] = {"auto", "checkpoint", "calibrate", "one"};
    fprintf(f, "  dtype: %s\n  kv_dtype: %s\n  backend: %s\n  load_format: %s\n  threads: %d\n  quantization: %s\n",
            dtype_name(t->model.dtype), t->model.kv_dtype == DT_COUNT ? "auto" : dtype_name(t->model.kv_dtype),
            topo_backend_name(t->model.backend), topo_load_format_name(t->model.load_format), t->model.threads,
            t->model.quantization >= 0 && t->model.quantization < 5 ? quants[t->model.quantization] : "?");
    fprintf(f, "  kv_scales: %s\n", t->model.kv_scales >= 0 && t->model.kv_scales < 4 ? kv_scales[t->model.kv_scales] : "?");
    fprintf(f, "nodes:\n");
    for (int i = 0; i < t->n_nodes; i++) {
        const topo_node_t *n = &t->nodes[i];
        fprintf(f, "  - name: ");
        s_q(f, n->name);
        fputc('\n', f);
        s_kv(f, "    ", "address", n->address);
        fprintf(f, "    gpus: %d\n    launch: %s\n", n->gpus, topo_launch_name(n->launch));
        s_kv(f, "    ", "ssh", n->ssh);
        if (n->workdir[0])
            s_kv(f, "    ", "workdir", n->workdir);
    }
    fprintf(f, "actors:\n");
    for (int i = 0; i < t->n_actors; i++) {
        const topo_actor_t *a = &t->actors[i];
        fprintf(f, "  - role: %s\n", topo_role_name(a->role));
        s_kv(f, "    ", "name", a->name);
        s_kv(f, "    ", "node", t->nodes[a->node].name);
        fprintf(f, "    count: %d\n", a->count);
        if (a->n_gpus) {
            fprintf(f, "    gpus: [");
            for (int g = 0; g < a->n_gpus; g++)
                fprintf(f, "%s%d", g ? ", " : "", a->gpus[g]);
            fprintf(f, "]\n");
        }
        fprintf(f, "    tp: %d\n    ep: %d\n    restart: %s\n", a->tp, a->ep,
                topo_restart_name(a->restart));
    }
    const topo_endpoints_t *e = &t->endpoints;
    fprintf(f, "endpoints:\n");
    s_kv(f, "  ", "client", e->client);
    if (e->n_clients > 1) {
        fprintf(f, "  clients:\n");
        for (int i = 0; i < e->n_clients; i++) {
            fprintf(f, "    - ");
            s_q(f, e->clients[i]);
            fputc('\n', f);
        }
    }
    s_kv(f, "  ", "inspect", e->inspect);
    if (e->metrics[0])
        s_kv(f, "  ", "metrics", e->metrics);
    if (e->http[0])
        s_kv(f, "  ", "http", e->http);
    s_kv(f, "  ", "run_dir", e->run_dir);
    if (e->bind_interface[0])
        s_kv(f, "  ", "bind_interface", e->bind_interface);
    fprintf(f, "  base_port: %d\n", e->base_port);
    s_kv(f, "  ", "control", e->control);
    const topo_limits_t *l = &t->limits;
    fprintf(f, "limits:\n  max_message_bytes: %lld\n  send_hwm: %d\n  recv_hwm: %d\n"
            "  admission_queue: %d\n  max_batch: %d\n  prefill_chunk_tokens: %d\n  kv_blocks: %d\n"
            "  max_model_len: %d\n  max_inflight_per_client: %d\n  outbox: %d\n", (long long)l->max_message_bytes, l->send_hwm,
            l->recv_hwm, l->admission_queue, l->max_batch, l->prefill_chunk_tokens, l->kv_blocks, l->max_model_len,
            l->max_inflight_per_client, l->outbox);
    fprintf(f, "cache:\n  block_size: %d\n  host_store_blocks: %d\n  default_retention_s: %d\n",
            t->cache.block_size, t->cache.host_store_blocks, t->cache.default_retention_s);
    if (t->cache.disk_dir[0]) {
        s_kv(f, "  ", "disk_dir", t->cache.disk_dir);
        fprintf(f, "  disk_bytes: %lld\n", (long long)t->cache.disk_bytes);
    }
    fprintf(f, "experts:\n  window_steps: %d\n  interval_steps: %d\n  redundant_slots: %d\n"
            "  load_half_life_windows: %d\n", t->experts.window_steps, t->experts.interval_steps, t->experts.redundant_slots,
            t->experts.load_half_life_windows);
    if (topo_first(t, ROLE_GATEWAY)) {
        /* The keys themselves are secrets: their tenants and limits only. */
        const topo_gateway_t *g = &t->gateway;
        fprintf(f, "gateway:\n  max_body_bytes: %d\n  idle_timeout_s: %d\n  body_timeout_s: %d\n"
                "  max_connections: %d\n  request_timeout_s: %d\n", g->max_body_bytes, g->idle_timeout_s,
                g->body_timeout_s, g->max_connections, g->request_timeout_s);
        for (int i = 0; i < g->n_keys; i++)
            fprintf(f, "  # api_keys[%d]: tenant %s, %d requests and %d tokens a minute (0: unlimited)\n", i,
                    g->keys[i].tenant, g->keys[i].requests_per_minute, g->keys[i].tokens_per_minute);
    }
    const topo_supervision_t *s = &t->supervision;
    fprintf(f, "supervision:\n  strategy: %s\n  max_restarts: %d\n  period_s: %d\n  ready_timeout_s: %d\n"
            "  grace_s: %d\n  heartbeat_ms: %d\n  liveness: %d\n  client_heartbeat_ms: %d\n"
            "  client_heartbeat_timeout_ms: %d\n", topo_strategy_name(s->strategy), s->max_restarts, s->period_s,
            s->ready_timeout_s, s->grace_s, s->heartbeat_ms, s->liveness, s->client_heartbeat_ms,
            s->client_heartbeat_timeout_ms);
    fprintf(f, "security:\n");
    if (t->security.curve_server_public[0]) {
        s_kv(f, "  ", "curve_server_public", t->security.curve_server_public);
        s_kv(f, "  ", "curve_server_secret", t->security.curve_server_secret);
        s_kv(f, "  ", "curve_clients", t->security.curve_clients);
        if (t->security.curve_keys_dir[0])
            s_kv(f, "  ", "curve_keys_dir", t->security.curve_keys_dir);
    }
    fprintf(f, "  allow_wildcard: %s\n", t->security.allow_wildcard ? "true" : "false");

    fprintf(f, "# derived (%s):\n", t->multi_node ? "multi-node, internal endpoints on tcp"
                                                  : "one node, internal endpoints on ipc");
    fprintf(f, "#   control %s (bind %s)\n", e->control, e->control_bind);
    fprintf(f, "#   stats   %s (bind %s)\n", e->stats, e->stats_bind);
    fprintf(f, "# instances, in start order:\n");
    for (int i = 0; i < t->n_instances; i++) {
        const topo_instance_t *in = &t->instances[i];
        fprintf(f, "#   %2d %-20s %-16s node %-10s gpu %2d  %-9s %s", in->order, in->name,
                topo_role_name(in->role), t->nodes[in->node].name, in->gpu,
                topo_restart_name(in->restart), in->inbox);
        if (strcmp(in->inbox, in->inbox_bind) != 0)
            fprintf(f, " (bind %s)", in->inbox_bind);
        fputc('\n', f);
    }
}
