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

/* What the command line asked for. */
typedef struct options {
    const char *dir;          /* MODEL_DIR */
    const char *text_path;    /* --text FILE */
    const char *backend;      /* --backend (default cpu) */
    int window;               /* --window N: tokens per prefill (default 256) */
    int max_windows;          /* --max-windows N; 0: every whole window */
    int R;                    /* --ranks R: the group the placement is for (default 4) */
    int redundant;            /* --redundant S: slots beyond one per expert (default 4) */
    int threads;              /* --threads N; 0: the backend's default */
    int group;                /* --group: measure on a real expert-parallel group */
} options_t;

#define GO_ON (-1)   /* not an exit code: this step went well, carry on */

/* Fills *o from argv. Returns GO_ON, or the exit code (2, after the usage or a message naming
 * the option). */
static int s_parse_args(int argc, char **argv, options_t *o)
{
    *o = (options_t){.backend = "cpu", .window = 256, .R = 4, .redundant = 4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--group")) {
            o->group = 1;
            continue;
        }
        if (!strcmp(a, "--text"))
            o->text_path = v;
        else if (!strcmp(a, "--backend"))
            o->backend = v;
        else if (!strcmp(a, "--window"))
            rc = s_int(a, v, 2, &o->window);
        else if (!strcmp(a, "--max-windows"))
            rc = s_int(a, v, 0, &o->max_windows);
        else if (!strcmp(a, "--ranks"))
            rc = s_int(a, v, 1, &o->R);
        else if (!strcmp(a, "--redundant"))
            rc = s_int(a, v, 0, &o->redundant);
        else if (!strcmp(a, "--threads"))
            rc = s_int(a, v, 0, &o->threads);
        else if (a[0] != '-' && !o->dir) {
            o->dir = a;
            continue;
        } else
            return s_usage();
        if (rc != 0 || !v)
            return rc != 0 ? 2 : s_usage();
        i++;
    }
    if (!o->dir || !o->text_path || !o->backend)
        return s_usage();
    return GO_ON;
}

/* The run: the model, the text's windows, and what they routed. */
typedef struct run {
    engine_t *eng;            /* the config from engine_new, the weights from s_open */
    expert_group_t *eg;       /* --group: the other ranks; NULL: counted here alone */
    int E, L;                 /* experts per layer, layers */
    int32_t *ids;             /* [n_ids] the text's tokens */
    size_t n_ids;
    int n_windows;            /* whole windows of --window tokens, at most --max-windows */
    uint64_t *load;           /* [L][E] tokens routed to each (layer, expert) */
} run_t;

/* A MoE model this tool takes, with experts and slots that --ranks divides evenly. Returns GO_ON,
 * or the exit code after saying why. */
static int s_check_model(const run_t *r, const options_t *o)
{
    if (r->E < 1 || r->E > MAX_EXPERTS_TOOL) {
        fprintf(stderr, TOOL ": %s: %d experts per layer: not a MoE model this tool takes\n", o->dir, r->E);
        return 1;
    }
    if (r->E % o->R != 0 || (r->E + o->redundant) % o->R != 0) {
        fprintf(stderr, TOOL ": --ranks %d must divide the %d experts and the %d slots evenly\n", o->R, r->E,
                r->E + o->redundant);
        return 2;
    }
    return GO_ON;
}

/* The text tokenized whole, then how many windows it holds. -1 after saying why. */
static int s_text_ids(run_t *r, const options_t *o)
{
    char err[1024];
    tokenizer_t *tok = tok_load(o->dir, err, sizeof err);
    size_t len = 0;
    char *text = tok ? util_read_file(o->text_path, &len) : NULL;
    if (!tok || !text || tok_encode(tok, text, len, 0, &r->ids, &r->n_ids) < 0) {
        fprintf(stderr, TOOL ": %s\n", !tok ? err : !text ? "cannot read the text" : "cannot tokenize the text");
        return -1;
    }
    free(text);
    tok_destroy(&tok);
    r->n_windows = (int)(r->n_ids / (size_t)o->window);
    if (o->max_windows > 0 && r->n_windows > o->max_windows)
        r->n_windows = o->max_windows;
    if (r->n_windows < 1) {
        fprintf(stderr, TOOL ": %s: %zu tokens, fewer than one window of %d\n", o->text_path, r->n_ids, o->window);
        return -1;
    }
    return 0;
}

/* The model as the workers open it (engine_open): one sequence of one window. With --group the
 * other ranks are started first (expert_group_spawn sets the spec's expert filter to rank 0's
 * experts), then attached once our own share is loaded. -1 after saying why. */
static int s_open(run_t *r, const options_t *o)
{
    char err[1024];
    engine_spec_t sp;
    engine_spec_default(&sp);
    sp.backend = o->backend;
    sp.threads = o->threads;
    sp.model = (model_opts_t){.max_tokens = o->window, .max_seqs = 1, .max_logit_rows = 1, .max_context = o->window,
                              .kv_block_size = 16};
    sp.kv_blocks = (o->window + 15) / 16;
    if (o->group && (o->R < 2 || !(r->eg = expert_group_spawn(o->R, r->E, o->dir, &sp, NULL, err, sizeof err)))) {
        fprintf(stderr, TOOL ": --group: %s\n", o->R < 2 ? "needs --ranks 2 or more" : err);
        return -1;
    }
    const int loaded = engine_load(r->eng, &sp, err, sizeof err) == ENGINE_OK &&
                       (!r->eg || expert_group_attach(r->eg, r->eng, err, sizeof err) == 0);
    const kvpool_t *pool = loaded ? r->eng->pool : NULL;
    r->load = calloc((size_t)r->L * (size_t)r->E, sizeof(uint64_t));
    if (!pool || !r->eng->logits || !r->load) {
        fprintf(stderr, TOOL ": %s\n", pool ? "out of memory" : err);
        return -1;
    }
    return 0;
}

/* Every window's prefill here, then the MoE kernels' counts into r->load. -1 after saying why. */
static int s_count(run_t *r, const options_t *o)
{
    char err[1024];
    const int window = o->window;
    model_t *m = r->eng->model;
    for (int w = 0; w < r->n_windows; w++) {
        kvseq_t *seq = kvseq_new(r->eng->pool, window, 0);
        model_seq_t q = {.kv = seq, .n_new = window};
        model_batch_t b = {.n_seqs = 1, .seqs = &q};
        if (!seq || kvseq_append(seq, r->ids + (size_t)w * window, window) < 0 ||
            model_forward(m, &b, r->eng->logits, err, sizeof err) < 0) {
            fprintf(stderr, TOOL ": window %d: %s\n", w, seq ? err : "out of memory");
            return -1;
        }
        kvseq_destroy(&seq);
    }
    if (model_expert_load(m, r->load, err, sizeof err) != 0) {
        fprintf(stderr, TOOL ": %s\n", err);
        return -1;
    }
    return 0;
}

/* The counts per MoE layer, the busiest expert over the average, and the placement (s_layer).
 * Returns the exit code: 1 when eplb refused a layer (the others are still printed). */
static int s_report(const run_t *r, const options_t *o)
{
    const int E = r->E;
    printf("model %s\nbackend %s\ntext %s\ntokens %d\nexperts %d top-%d\nranks %d\nredundant %d\n", o->dir,
           r->eng->be->ops->name, o->text_path, r->n_windows * o->window, E, r->eng->cfg.num_experts_per_tok, o->R,
           o->redundant);
    int rc = 0;
    for (int l = 0; l < r->L; l++) {
        const uint64_t *c = r->load + (size_t)l * E;
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
        if (s_layer(l, c, E, o->R, o->redundant, &before, &after) != 0) {
            rc = 1;
            continue;
        }
        printf("layer %d rank_busiest_over_avg without %.3f after %.3f\n", l, before, after);
    }
    return rc;
}

/* The group first, then the engine it is attached to. */
static void s_destroy(run_t *r)
{
    expert_group_destroy(&r->eg);
    free(r->load);
    free(r->ids);
    engine_destroy(&r->eng);
}

int main(int argc, char **argv)
{
    options_t o;
    const int parsed = s_parse_args(argc, argv, &o);
    if (parsed != GO_ON)
        return parsed;

    char err[1024];
    run_t r = {.eng = engine_new(o.dir, err, sizeof err)};   /* the config now, the weights below */
    if (!r.eng) {
        fprintf(stderr, TOOL ": %s\n", err);
        return 1;
    }
    r.E = r.eng->cfg.num_experts;
    r.L = r.eng->cfg.num_layers;
    /* A failed step leaves the cleanup to exit(). */
    const int checked = s_check_model(&r, &o);
    if (checked != GO_ON)
        return checked;
    if (s_text_ids(&r, &o) != 0 || s_open(&r, &o) != 0 || (!r.eg && s_count(&r, &o) != 0))
        return 1;
    const int rc = r.eg ? s_group(r.eng->model, r.eng, expert_group_ep(r.eg), r.eng->pool, r.ids, o.window,
                                  r.n_windows, r.E, r.L, o.R, o.redundant, o.dir)
                        : s_report(&r, &o);
    s_destroy(&r);
    return rc;
}
