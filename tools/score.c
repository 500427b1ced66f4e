/* tools/score.c — troupe-score: the quality measure. Mean negative log-likelihood per token of a
 * text under teacher forcing, so a quantized format can be compared with bf16 (and with
 * transformers) on the same text.
 *
 *   troupe-score MODEL_DIR --text FILE [--window N] [--sep-id ID] [--max-windows N]
 *                [--backend cpu|cuda] [--threads N] [--quantize fp8|int8|int4|nvfp4]
 *                [--kv-dtype auto|f32|bf16|f16|fp8] [--kv-scales auto|checkpoint|calibrate|one]
 *
 * The text is split into chapters at blank lines; each chapter is tokenized on its own (no special
 * tokens) and the chapters are joined by --sep-id (default 0, the end-of-text token of the KJV
 * models). The token stream is cut into non-overlapping windows of --window tokens (default 256;
 * a last partial window is left out); each window is one forward from an empty cache with logits
 * for every position, and position i's log-softmax scores token i + 1. So each window scores
 * window - 1 tokens with a context of 1 .. window - 1. Log-softmax is computed in double.
 * --quantize quantizes a plain checkpoint at load (model_opts_t.quantize). --kv-dtype sets the KV
 * cache's dtype (auto: the weights'), --kv-scales where an fp8 cache's scales come from
 * (engine/kvscale.h; default auto: the checkpoint's, else calibrated at load).
 *
 * --decode N (speed, not quality; no --text): a 128-token prompt of ids, then N greedy batch-1
 * decode steps (argmax on the backend), timed; prints tok/s and the weight bytes one step reads.
 * --dummy uses the 'dummy' load format (bf16 random weights of the config's shape; quantized with
 * --quantize): figures from dummy weights measure speed only.
 *
 * Prints: model, format, KV dtype and scales, windows, tokens scored, context length, mean NLL and
 * perplexity. */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/config.h"
#include "engine/engine_open.h"
#include "engine/kvcache.h"
#include "engine/kvscale.h"
#include "engine/model.h"
#include "engine/quant.h"
#include "engine/tokenizer.h"
#include "kernels/backend.h"
#include "tools/lib/args.h"

#define TOOL "troupe-score"

static int s_usage(void)
{
    fprintf(stderr, "usage: " TOOL " MODEL_DIR --text FILE [--window N] [--sep-id ID] [--max-windows N] "
                    "[--backend cpu|cuda] [--threads N] [--quantize fp8|int8|int4|nvfp4]\n"
                    "       [--kv-dtype auto|f32|bf16|f16|fp8] [--kv-scales auto|checkpoint|calibrate|one]\n"
                    "       " TOOL " MODEL_DIR --decode N [--dummy] [--backend ...] [--quantize ...]\n");
    return 2;
}

/* Chapters (split at blank lines, trailing newlines dropped) tokenized and joined by sep. */
static int s_tokens(const tokenizer_t *tok, char *text, size_t len, int32_t sep, int32_t **out, size_t *n_out)
{
    size_t cap = len + 16, n = 0;
    int32_t *all = malloc(cap * sizeof *all);
    if (!all)
        return -1;
    size_t at = 0;
    int chapters = 0;
    while (at < len) {
        char *end = strstr(text + at, "\n\n");
        size_t stop = end ? (size_t)(end - text) : len;
        size_t e = stop;
        while (e > at && (text[e - 1] == '\n' || text[e - 1] == '\r'))
            e--;
        while (at < e && text[at] == '\n')
            at++;
        if (e > at) {
            int32_t *ids;
            size_t k;
            if (tok_encode(tok, text + at, e - at, 0, &ids, &k) < 0) {
                free(all);
                return -1;
            }
            if (n + k + 1 > cap) {
                cap = 2 * (n + k + 1);
                int32_t *a = realloc(all, cap * sizeof *a);
                if (!a) {
                    free(ids);
                    free(all);
                    return -1;
                }
                all = a;
            }
            if (chapters++)
                all[n++] = sep;
            memcpy(all + n, ids, k * sizeof *ids);
            n += k;
            free(ids);
        }
        at = stop;
        while (at < len && text[at] == '\n')
            at++;
    }
    *out = all;
    *n_out = n;
    return 0;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The model as the workers and troupe-generate open it (engine_open): one sequence, `context`
 * tokens of KV, `logit_rows` rows of host logits; dummy: random bf16 weights of the config's shape. */
static dtype_t s_kv_dtype = DT_COUNT;   /* --kv-dtype (DT_COUNT: auto) */
static int s_kv_scales = 0;            /* --kv-scales: KV_SCALES_AUTO */

static engine_status_t s_load(engine_t *e, const char *backend, int threads, int dummy, int qfmt, int max_tokens,
                              int logit_rows, int context, char *err, size_t errlen)
{
    engine_spec_t sp;
    engine_spec_default(&sp);
    sp.kv_dtype = s_kv_dtype;
    sp.kv_dtype_option = "--kv-dtype";
    sp.kv_scales = s_kv_scales;
    sp.kv_scales_option = "--kv-scales";
    sp.backend = backend;
    sp.threads = threads;
    sp.dummy = dummy;
    if (dummy)
        sp.dtype = DT_BF16;
    sp.model = (model_opts_t){.max_tokens = max_tokens, .max_seqs = 1, .max_logit_rows = logit_rows,
                              .max_context = context, .kv_block_size = 16, .quantize = qfmt};
    sp.kv_blocks = (context + 15) / 16;
    sp.dummy_option = "--dummy";
    return engine_load(e, &sp, err, errlen);
}

/* --decode: batch-1 greedy decode speed. */
static int s_decode(engine_t *e, const char *backend, int threads, int qfmt, int dummy, int steps)
{
    enum { PROMPT = 128 };
    char err[1024];
    const double t0 = s_now();
    const char *dir = e->model_dir;
    const model_config_t *cfg = &e->cfg;
    kvseq_t *seq = NULL;
    if (s_load(e, backend, threads, dummy, qfmt, PROMPT, 1, PROMPT + steps + 16, err, sizeof err) != ENGINE_OK ||
        !(seq = kvseq_new(e->pool, PROMPT + steps + 1, 0))) {
        fprintf(stderr, TOOL ": %s\n", e->pool ? "out of memory" : err);
        return 1;
    }
    backend_t *be = e->be;
    model_t *m = e->model;
    float *logits = e->logits;   /* unused with argmax_out, by contract */
    const double t_load = s_now() - t0;
    int32_t prompt[PROMPT], tok = 0;
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 131 + 7) % cfg->vocab_size);
    model_seq_t q = {.kv = seq, .n_new = PROMPT};
    model_batch_t b = {.n_seqs = 1, .seqs = &q, .argmax_out = &tok};
    if (kvseq_append(seq, prompt, PROMPT) < 0 || model_forward(m, &b, logits, err, sizeof err) < 0) {
        fprintf(stderr, TOOL ": prefill: %s\n", err);
        return 1;
    }
    double t1 = 0;
    for (int s = 0; s <= steps; s++) {
        if (s == 1)
            t1 = s_now();                          /* step 0 warms up (graphs, scratch) */
        q.n_new = 1;
        int32_t t = tok;
        if (kvseq_append(seq, &t, 1) < 0 || model_forward(m, &b, logits, err, sizeof err) < 0) {
            fprintf(stderr, TOOL ": decode step %d: %s\n", s, err);
            return 1;
        }
    }
    const double dt = s_now() - t1;
    const double bytes = (double)model_weight_bytes(m);
    /* The copy bound: a device-to-device copy of 1 GiB (bytes read + written), best of 5. */
    double copy_bw = 0;
    const size_t cb = (size_t)1 << 30;
    void *ca = be->ops->copy ? be->ops->alloc(be, cb) : NULL, *cb2 = ca ? be->ops->alloc(be, cb) : NULL;
    for (int r = 0; cb2 && r < 6; r++) {
        be->ops->sync(be);
        const double c0 = s_now();
        be->ops->copy(be, cb2, ca, cb);
        be->ops->sync(be);
        const double bw = 2.0 * (double)cb / (s_now() - c0) / 1e9;
        copy_bw = r && bw > copy_bw ? bw : copy_bw;   /* the first is a warm-up */
    }
    if (cb2)
        be->ops->free(be, cb2);
    if (ca)
        be->ops->free(be, ca);
    printf("model %s\nweights %s%s\nbackend %s\nload_s %.1f\ndecode_steps %d\ntok_per_s %.1f\n"
           "weight_bytes_per_step %.3e\nweight_GB_per_s %.1f\ncopy_GB_per_s %.0f\nbound_tok_per_s %.0f\n",
           dir, dummy ? "dummy " : "",
           cfg->quant.present ? quant_format_name(cfg->quant.fmt) : qfmt ? quant_format_name(qfmt) : "plain",
           be->ops->name, t_load, steps, steps / dt, bytes, bytes * steps / dt / 1e9, copy_bw,
           copy_bw > 0 ? copy_bw * 1e9 / bytes : 0.0);
    kvseq_destroy(&seq);
    return 0;
}

/* What the command line asked for. */
typedef struct options {
    const char *dir;          /* MODEL_DIR */
    const char *text_path;    /* --text FILE; NULL with --decode */
    const char *backend;      /* --backend (default cpu) */
    int window;               /* --window N: tokens per window (default 256) */
    int sep;                  /* --sep-id ID: the token between chapters (default 0) */
    int max_windows;          /* --max-windows N; 0: every whole window */
    int threads;              /* --threads N; 0: the backend's default */
    int decode;               /* --decode N: the decode steps to time; 0: score the text */
    int dummy;                /* --dummy: random weights of the config's shape */
    int qfmt;                 /* --quantize parsed (quant_format_parse); 0: none */
} options_t;

#define GO_ON (-1)   /* not an exit code: this step went well, carry on */

/* Fills *o from argv; --kv-dtype and --kv-scales go to s_kv_dtype and s_kv_scales. Returns GO_ON,
 * or the exit code (2, after the usage or a message naming the option). */
static int s_parse_args(int argc, char **argv, options_t *o)
{
    *o = (options_t){.backend = "cpu", .window = 256};
    const char *quantize = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--text") && v)
            o->text_path = v, i++;
        else if (!strcmp(a, "--window") && v) {
            if (arg_int(TOOL, a, v, 2, 1 << 16, &o->window) < 0)
                return 2;
            i++;
        } else if (!strcmp(a, "--sep-id") && v) {
            if (arg_int(TOOL, a, v, 0, 1 << 30, &o->sep) < 0)
                return 2;
            i++;
        } else if (!strcmp(a, "--max-windows") && v) {
            if (arg_int(TOOL, a, v, 0, 1 << 30, &o->max_windows) < 0)
                return 2;
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            if (arg_int(TOOL, a, v, 0, 4096, &o->threads) < 0)
                return 2;
            i++;
        } else if (!strcmp(a, "--decode") && v) {
            if (arg_int(TOOL, a, v, 1, 1 << 20, &o->decode) < 0)
                return 2;
            i++;
        } else if (!strcmp(a, "--dummy"))
            o->dummy = 1;
        else if (!strcmp(a, "--backend") && v)
            o->backend = v, i++;
        else if (!strcmp(a, "--quantize") && v)
            quantize = v, i++;
        else if (!strcmp(a, "--kv-dtype") && v) {
            if (arg_kv_dtype(TOOL, a, v, &s_kv_dtype) < 0)
                return 2;
            i++;
        } else if (!strcmp(a, "--kv-scales") && v) {
            if (arg_kv_scales(TOOL, a, v, &s_kv_scales) < 0)
                return 2;
            i++;
        }
        else if (a[0] == '-')
            return s_usage();
        else if (!o->dir)
            o->dir = a;
        else
            return s_usage();
    }
    if (!o->dir || (!o->text_path && !o->decode) || (o->text_path && o->decode))
        return s_usage();
    if (quantize && (o->qfmt = quant_format_parse(quantize)) < 0) {
        fprintf(stderr, TOOL ": --quantize '%s': expected fp8, int8, int4 or nvfp4\n", quantize);
        return 2;
    }
    return GO_ON;
}

/* The text as scored, and the running sum. */
typedef struct score {
    int32_t *ids;      /* [n_ids] the chapters' tokens joined by --sep-id */
    size_t n_ids;
    int n_windows;     /* whole windows of --window tokens, at most --max-windows */
    double nll;        /* the sum of -log p over the positions scored */
    long scored;       /* positions scored */
} score_t;

/* --sep-id is checked against the model's vocabulary, known only once its config is read. */
static int s_check_sep(const engine_t *e, const options_t *o)
{
    if (o->sep >= e->cfg.vocab_size) {
        fprintf(stderr, TOOL ": --sep-id %d is outside the vocabulary (%d)\n", o->sep, e->cfg.vocab_size);
        return -1;
    }
    return 0;
}

/* The text's token stream (s_tokens), then how many windows it holds. -1 after saying why. */
static int s_text_ids(const options_t *o, score_t *sc)
{
    char err[1024];
    tokenizer_t *tok = tok_load(o->dir, err, sizeof err);
    if (!tok) {
        fprintf(stderr, TOOL ": %s\n", err);
        return -1;
    }
    size_t len = 0;
    char *text = util_read_file(o->text_path, &len);
    if (!text || s_tokens(tok, text, len, o->sep, &sc->ids, &sc->n_ids) < 0) {
        fprintf(stderr, TOOL ": %s: cannot read or tokenize\n", o->text_path);
        return -1;
    }
    free(text);
    tok_destroy(&tok);
    sc->n_windows = (int)(sc->n_ids / (size_t)o->window);
    if (o->max_windows > 0 && sc->n_windows > o->max_windows)
        sc->n_windows = o->max_windows;
    if (sc->n_windows < 1) {
        fprintf(stderr, TOOL ": %s: %zu tokens, fewer than one window of %d\n", o->text_path, sc->n_ids, o->window);
        return -1;
    }
    return 0;
}

/* Window w's positions 0 .. window - 2 (the logits of each scoring the next token of t) added to
 * the sum. -1 after saying so when a log-probability is not finite. */
static int s_window_nll(const float *logits, const int32_t *t, int window, int V, int w, score_t *sc)
{
    for (int i = 0; i + 1 < window; i++) {
        const float *row = logits + (size_t)i * V;
        double mx = -INFINITY, s = 0.0;
        for (int v = 0; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < V; v++)
            s += exp((double)row[v] - mx);
        const double lp = (double)row[t[i + 1]] - mx - log(s);
        if (!isfinite(lp)) {
            fprintf(stderr, TOOL ": window %d position %d: non-finite log-probability\n", w, i);
            return -1;
        }
        sc->nll -= lp;
        sc->scored++;
    }
    return 0;
}

/* Each window is one forward from an empty cache with logits for every position. -1 after
 * saying which window failed. */
static int s_score_windows(engine_t *e, const options_t *o, score_t *sc)
{
    char err[1024];
    const int window = o->window;
    for (int w = 0; w < sc->n_windows; w++) {
        const int32_t *t = sc->ids + (size_t)w * (size_t)window;
        kvseq_t *seq = kvseq_new(e->pool, window, 0);
        model_seq_t q = {.kv = seq, .n_new = window};
        model_batch_t b = {.n_seqs = 1, .seqs = &q, .all_logits = 1};
        if (!seq || kvseq_append(seq, t, window) < 0 || model_forward(e->model, &b, e->logits, err, sizeof err) < 0) {
            fprintf(stderr, TOOL ": window %d: %s\n", w, seq ? err : "out of memory");
            return -1;
        }
        if (s_window_nll(e->logits, t, window, e->cfg.vocab_size, w, sc) != 0)
            return -1;
        kvseq_destroy(&seq);
    }
    return 0;
}

static void s_print_score(const engine_t *e, const options_t *o, const score_t *sc)
{
    const model_config_t *cfg = &e->cfg;
    const double mean = sc->nll / (double)sc->scored;
    printf("model %s\nformat %s\nbackend %s\nkv_dtype %s\nkv_scales %s\ntext %s\ntokens %zu\nwindows %d\n"
           "context %d\nscored %ld\nmean_nll %.4f\nperplexity %.3f\n",
           o->dir, cfg->quant.present ? quant_format_name(cfg->quant.fmt) : o->qfmt ? quant_format_name(o->qfmt) : "plain",
           e->be->ops->name, dtype_name(e->kv_dtype), e->kv_scales ? kv_scales_name(e->kv_scales_from) : "none",
           o->text_path, sc->n_ids, sc->n_windows, o->window, sc->scored, mean, exp(mean));
}

int main(int argc, char **argv)
{
    options_t o;
    const int parsed = s_parse_args(argc, argv, &o);
    if (parsed != GO_ON)
        return parsed;

    char err[1024];
    engine_t *e = engine_new(o.dir, err, sizeof err);   /* the config now, the weights below */
    if (!e) {
        fprintf(stderr, TOOL ": %s\n", err);
        return 1;
    }
    if (o.decode) {
        const int rc = s_decode(e, o.backend, o.threads, o.qfmt, o.dummy, o.decode);
        engine_destroy(&e);
        return rc;
    }
    score_t sc = {0};
    /* A failed step leaves the cleanup to exit(). */
    if (s_check_sep(e, &o) != 0)
        return 2;
    if (s_text_ids(&o, &sc) != 0)
        return 1;
    if (s_load(e, o.backend, o.threads, 0, o.qfmt, o.window, o.window, o.window, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, TOOL ": %s\n", err);
        return 1;
    }
    if (s_score_windows(e, &o, &sc) != 0)
        return 1;
    s_print_score(e, &o, &sc);
    free(sc.ids);
    engine_destroy(&e);
    return 0;
}
