/* tools/expert_load.c — troupe-expert-load: the per-(layer, expert) load a text puts on a MoE
 * model, and what the expert placement (engine/eplb.h) makes of it.
 *
 *   troupe-expert-load MODEL_DIR --text FILE [--window N] [--max-windows N] [--ranks R]
 *                      [--redundant S] [--backend cpu|cuda] [--threads N]
 *
 * The text is tokenized whole (no special tokens) and cut into windows of --window tokens
 * (default 256), each one prefill forward from an empty cache; the MoE kernels count every
 * routed (token, expert) pair (model_expert_load). Prints each layer's token counts per expert,
 * then, for a group of --ranks ranks (default 4): the busiest rank's load over the average with
 * the experts in order (n_experts / ranks per rank, no balancer) and after one placement with
 * --redundant redundant slots (default 4). Each replica of an expert is taken to carry an equal
 * share of its tokens.
 *
 * --group runs the text through a real expert-parallel group of --ranks processes (engine/ep.h,
 * troupe-expert-rank beside this binary) and measures what each rank computed: the first half of
 * the windows with the experts in order, then one placement computed from that half's load,
 * applied to the group while it runs, and the second half with it. Per layer it prints the
 * busiest/average rank load measured on the second half with the placement, against the same half
 * with the experts in order and the equal-split figure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/worker/expert_group.h"
#include "common/util.h"
#include "engine/config.h"
#include "engine/engine_open.h"
#include "engine/eplb.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/backend.h"

#define TOOL "troupe-expert-load"
#define MAX_EXPERTS_TOOL 1024   /* experts per layer this tool takes (messages/msg.h MSG_MAX_EXPERTS) */

static int s_usage(void)
{
    fprintf(stderr, "usage: " TOOL " MODEL_DIR --text FILE [--window N] [--max-windows N] [--ranks R] "
                    "[--redundant S] [--backend cpu|cuda] [--threads N] [--group]\n");
    return 2;
}

static int s_int(const char *opt, const char *v, int lo, int *out)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || end == v || x < lo || x > 1 << 20) {
        fprintf(stderr, TOOL ": %s '%s': expected an integer >= %d\n", opt, v ? v : "", lo);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* Prints one layer's ratio without and with the placement; returns 0, or -1 when eplb refuses. */
static int s_layer(int l, const uint64_t *counts, int E, int R, int redundant, double *before, double *after)
{
    double load[MAX_EXPERTS_TOOL];
    int32_t ident[MAX_EXPERTS_TOOL], slot[2 * MAX_EXPERTS_TOOL];
    char err[256];
    for (int e = 0; e < E; e++)
        load[e] = (double)counts[e];
    eplb_identity(E, ident);
    *before = eplb_imbalance(load, E, R, E, ident, NULL);
    if (eplb_place(load, E, R, 1, E + redundant, slot, err, sizeof err) != 0) {
        fprintf(stderr, TOOL ": layer %d: %s\n", l, err);
        return -1;
    }
    *after = eplb_imbalance(load, E, R, E + redundant, slot, NULL);
    printf("layer %d placement", l);
    for (int s = 0; s < E + redundant; s++)
        printf("%s%d", s % ((E + redundant) / R) ? "," : " | ", slot[s]);
    printf("\n");
    return 0;
}

/* One window's prefill forward from an empty cache. */
static int s_window(model_t *m, kvpool_t *pool, float *logits, const int32_t *ids, int window, char *err,
                    size_t errlen)
{
    kvseq_t *seq = kvseq_new(pool, window, 0);
    model_seq_t q = {.kv = seq, .n_new = window};
    model_batch_t b = {.n_seqs = 1, .seqs = &q};
    int rc = !seq || kvseq_append(seq, ids, window) < 0 ? errf(err, errlen, "out of memory")
                                                         : model_forward(m, &b, logits, err, errlen);
    kvseq_destroy(&seq);
    return rc;
}

static double s_ratio(const uint64_t *x, int n)
{
    double sum = 0, mx = 0;
    for (int i = 0; i < n; i++) {
        sum += (double)x[i];
        mx = (double)x[i] > mx ? (double)x[i] : mx;
    }
    return sum > 0 ? mx / (sum / n) : 1.0;
}

/* --group: the first half in order, a placement from its load, the second half with it. */
static int s_group(model_t *m, engine_t *eng, ep_t *ep, kvpool_t *pool, const int32_t *ids, int window, int n_windows,
                   int E, int L, int R, int redundant, const char *dir)
{
    char err[1024];
    const int half = n_windows / 2;
    uint64_t *la = calloc((size_t)L * E, sizeof(uint64_t)), *lb = calloc((size_t)L * E, sizeof(uint64_t));
    int32_t *tab = calloc((size_t)L * (E + redundant), sizeof(int32_t)), ident[MAX_EXPERTS_TOOL];
    double *load = calloc((size_t)E, sizeof(double));
    uint64_t re[EP_MAX_RANKS];
    int rc = 1;
    if (half < 1 || !la || !lb || !tab || !load) {
        fprintf(stderr, TOOL ": --group: %s\n", half < 1 ? "needs at least two windows" : "out of memory");
        goto done;
    }
    for (int w = 0; w < half; w++)
        if (s_window(m, pool, eng->logits, ids + (size_t)w * window, window, err, sizeof err) != 0)
            goto fail;
    if (model_expert_load(m, la, err, sizeof err) != 0)
        goto fail;
    for (int l = 0; l < L; l++) {
        double sum = 0;
        for (int e = 0; e < E; e++)
            sum += load[e] = (double)la[(size_t)l * E + e];
        int32_t *ls = tab + (size_t)l * (E + redundant);
        if (sum == 0) {   /* a dense layer: the group ignores its row */
            for (int s = 0; s < E + redundant; s++)
                ls[s] = s % E;
        } else if (eplb_place(load, E, R, 1, E + redundant, ls, err, sizeof err) != 0) {
            goto fail;
        }
    }
    if (ep_propose(ep, 1, E + redundant, tab, err, sizeof err) != 0)
        goto fail;
    ep_status_t st;
    int spins = 0;
    do {   /* the group loads a layer per round and switches at a step boundary */
        if (s_window(m, pool, eng->logits, ids, window, err, sizeof err) != 0)
            goto fail;
        ep_status(ep, &st);
    } while (st.epoch != 1 && ++spins < 4 * L + 4);
    if (st.epoch != 1) {
        fprintf(stderr, TOOL ": --group: the group did not switch to the placement\n");
        goto done;
    }
    ep_rank_entries_reset(ep);
    if (model_expert_load(m, lb, err, sizeof err) != 0)   /* clears the switch windows' counts */
        goto fail;
    memset(lb, 0, (size_t)L * E * sizeof(uint64_t));
    for (int w = half; w < 2 * half; w++)
        if (s_window(m, pool, eng->logits, ids + (size_t)w * window, window, err, sizeof err) != 0)
            goto fail;
    if (model_expert_load(m, lb, err, sizeof err) != 0)
        goto fail;
    printf("model %s\ngroup %d ranks, %d slots (%d redundant), %d experts top-%d\nplacement from %d tokens, "
           "measured on the next %d\n", dir, R, E + redundant, redundant, E, eng->cfg.num_experts_per_tok,
           half * window, half * window);
    eplb_identity(E, ident);
    for (int l = 0; l < L; l++) {
        double sum = 0;
        for (int e = 0; e < E; e++)
            sum += load[e] = (double)lb[(size_t)l * E + e];
        if (sum == 0)
            continue;
        ep_rank_entries(ep, l, re);
        printf("layer %d rank_busiest_over_avg in_order %.3f placed_equal_split %.3f placed_measured %.3f entries",
               l, eplb_imbalance(load, E, R, E, ident, NULL),
               eplb_imbalance(load, E, R, E + redundant, tab + (size_t)l * (E + redundant), NULL), s_ratio(re, R));
        for (int r = 0; r < R; r++)
            printf(" %llu", (unsigned long long)re[r]);
        printf("\n");
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, TOOL ": --group: %s\n", err);
done:
    free(la);
    free(lb);
    free(tab);
    free(load);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *text_path = NULL, *backend = "cpu";
    int window = 256, max_windows = 0, R = 4, redundant = 4, threads = 0, group = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--group")) {
            group = 1;
            continue;
        }
        if (!strcmp(a, "--text"))
            text_path = v;
        else if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--window"))
            rc = s_int(a, v, 2, &window);
        else if (!strcmp(a, "--max-windows"))
            rc = s_int(a, v, 0, &max_windows);
        else if (!strcmp(a, "--ranks"))
            rc = s_int(a, v, 1, &R);
        else if (!strcmp(a, "--redundant"))
            rc = s_int(a, v, 0, &redundant);
        else if (!strcmp(a, "--threads"))
            rc = s_int(a, v, 0, &threads);
        else if (a[0] != '-' && !dir) {
            dir = a;
            continue;
        } else
            return s_usage();
        if (rc != 0 || !v)
            return rc != 0 ? 2 : s_usage();
        i++;
    }
    if (!dir || !text_path || !backend)
        return s_usage();
    char err[1024];
    engine_t *eng = engine_new(dir, err, sizeof err);   /* the config now, the weights below */
    if (!eng) {
        fprintf(stderr, TOOL ": %s\n", err);
        return 1;
    }
    const model_config_t cfg = eng->cfg;
    const int E = cfg.num_experts, L = cfg.num_layers;
    if (E < 1 || E > MAX_EXPERTS_TOOL) {
        fprintf(stderr, TOOL ": %s: %d experts per layer: not a MoE model this tool takes\n", dir, E);
        return 1;
    }
    if (E % R != 0 || (E + redundant) % R != 0) {
        fprintf(stderr, TOOL ": --ranks %d must divide the %d experts and the %d slots evenly\n", R, E, E + redundant);
        return 2;
    }
    tokenizer_t *tok = tok_load(dir, err, sizeof err);
    size_t len = 0, n_ids = 0;
    char *text = tok ? util_read_file(text_path, &len) : NULL;
    int32_t *ids = NULL;
    if (!tok || !text || tok_encode(tok, text, len, 0, &ids, &n_ids) < 0) {
        fprintf(stderr, TOOL ": %s\n", !tok ? err : !text ? "cannot read the text" : "cannot tokenize the text");
        return 1;
    }
    free(text);
    tok_destroy(&tok);
    int n_windows = (int)(n_ids / (size_t)window);
    if (max_windows > 0 && n_windows > max_windows)
        n_windows = max_windows;
    if (n_windows < 1) {
        fprintf(stderr, TOOL ": %s: %zu tokens, fewer than one window of %d\n", text_path, n_ids, window);
        return 1;
    }
    /* The model as the workers open it (engine_open): one sequence of one window. */
    engine_spec_t sp;
    engine_spec_default(&sp);
    sp.backend = backend;
    sp.threads = threads;
    sp.model = (model_opts_t){.max_tokens = window, .max_seqs = 1, .max_logit_rows = 1, .max_context = window,
                              .kv_block_size = 16};
    sp.kv_blocks = (window + 15) / 16;
    expert_group_t *eg = NULL;
    if (group && (R < 2 || !(eg = expert_group_spawn(R, E, dir, &sp, NULL, err, sizeof err)))) {
        fprintf(stderr, TOOL ": --group: %s\n", R < 2 ? "needs --ranks 2 or more" : err);
        return 1;
    }
    const int loaded = engine_load(eng, &sp, err, sizeof err) == ENGINE_OK &&
                       (!eg || expert_group_attach(eg, eng, err, sizeof err) == 0);
    backend_t *be = eng->be;
    model_t *m = eng->model;
    kvpool_t *pool = loaded ? eng->pool : NULL;
    float *logits = eng->logits;
    uint64_t *load = calloc((size_t)L * (size_t)E, sizeof(uint64_t));
    if (!pool || !logits || !load) {
        fprintf(stderr, TOOL ": %s\n", pool ? "out of memory" : err);
        return 1;
    }
    if (eg) {
        const int rc = s_group(m, eng, expert_group_ep(eg), pool, ids, window, n_windows, E, L, R, redundant, dir);
        expert_group_destroy(&eg);
        free(load);
        free(ids);
        engine_destroy(&eng);
        return rc;
    }
    for (int w = 0; w < n_windows; w++) {
        kvseq_t *seq = kvseq_new(pool, window, 0);
        model_seq_t q = {.kv = seq, .n_new = window};
        model_batch_t b = {.n_seqs = 1, .seqs = &q};
        if (!seq || kvseq_append(seq, ids + (size_t)w * window, window) < 0 ||
            model_forward(m, &b, logits, err, sizeof err) < 0) {
            fprintf(stderr, TOOL ": window %d: %s\n", w, seq ? err : "out of memory");
            return 1;
        }
        kvseq_destroy(&seq);
    }
    if (model_expert_load(m, load, err, sizeof err) != 0) {
        fprintf(stderr, TOOL ": %s\n", err);
        return 1;
    }
    printf("model %s\nbackend %s\ntext %s\ntokens %d\nexperts %d top-%d\nranks %d\nredundant %d\n", dir,
           be->ops->name, text_path, n_windows * window, E, cfg.num_experts_per_tok, R, redundant);
    int rc = 0;
    for (int l = 0; l < L; l++) {
        const uint64_t *c = load + (size_t)l * E;
        uint64_t sum = 0, mx = 0;
        for (int e = 0; e < E; e++) {
            sum += c[e];
            mx = c[e] > mx ? c[e] : mx;
        }
        if (sum == 0)
            continue;   /* a dense layer */
        printf("layer %d tokens", l);
        for (int e = 0; e < E; e++)
            printf(" %llu", (unsigned long long)c[e]);
        printf("\nlayer %d expert_busiest_over_avg %.2f\n", l, (double)mx / ((double)sum / E));
        double before, after;
        if (s_layer(l, c, E, R, redundant, &before, &after) != 0) {
            rc = 1;
            continue;
        }
        printf("layer %d rank_busiest_over_avg without %.3f after %.3f\n", l, before, after);
    }
    free(load);
    free(ids);
    engine_destroy(&eng);
    return rc;
}
