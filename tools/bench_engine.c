/* tools/bench_engine.c — troupe-bench-engine: the engine alone (no actors, no sockets), its
 * prefill and its batched decode step, next to the memory-bandwidth bound.
 *
 *   troupe-bench-engine MODEL_DIR [--backend cpu|cuda|cuda:N] [--dtype bf16|f16|f32]
 *       [--kv-dtype auto|f32|bf16|f16|fp8] [--kv-scales auto|checkpoint|calibrate|one]
 *       [--load-format auto|dummy] [--threads N] [--prompt-len 1000] [--batch 1,16,64,256] [--steps 32] [--chunk 2048] [--mixed N]
 *       [--copy-bw TB/s] [--profile] [--json FILE] [--router-skew uniform|zipf:S|table:FILE]
 *       [--prompts distinct|shared] [--seed N] [--verify-table [--max-k 7] [--accept 0.6,0.8]]
 *       [--quantize fp8|int8|int4|nvfp4]
 *
 * --quantize quantizes a plain checkpoint (or the dummy weights) at load, as model.quantization
 * does (model_opts_t.quantize): every step's bytes then count the quantized weights' codes and
 * scales.
 *
 * What it measures, in one process with one weight load:
 *   - prefill: one --prompt-len prompt of random ids, prefilled in chunks of --chunk tokens
 *     (a warm-up, then the median of 3): the engine's part of the time to first token;
 *   - decode, per batch size B: B sequences of --prompt-len tokens of context, then --steps
 *     greedy steps of the whole batch (2 warm-up steps first), the device argmax bringing back
 *     only token ids (as the decode worker does). Reported: the step time (median), tokens/s,
 *     the bytes a step reads (below), the time those bytes take at --copy-bw (the copy bandwidth
 *     measured in the same run: the bound) and the bound over the step time.
 *     Contexts (--prompts): distinct (the default) gives every row its own prompt of random ids
 *     (row r's from a generator seeded by --seed and r, so a run repeats), all prefilled once
 *     before the first level (several rows per forward, up to --chunk tokens) and reused by every
 *     level, each cut back to its prompt after a level; shared gives every row a copy of one
 *     prompt's KV blocks (distinct memory, one content: cheap to set up, but an MoE model's rows
 *     then route alike, since a token's hidden state depends on its context). Each row decodes
 *     from its own random token.
 *     The bytes of a step: the dense weights once, each sequence's K and V at the KV cache's
 *     dtype (--kv-dtype, auto = the weights'), and of an MoE model's experts only those the step
 *     routed to: after every timed step (outside its time) the MoE load counters are read, and
 *     each MoE layer's distinct experts with at least one token count once. The mean over the
 *     timed steps is reported (with the range); the uniform-routing guess (1 - (1 - k/E)^B of
 *     the experts) stays in the JSON as bytes_per_step_uniform_routing, and is what is counted
 *     when the counters are off (TROUPE_MOE_COUNT=0; said). Dummy weights route as their random
 *     routers do unless --router-skew (or TROUPE_DUMMY_ROUTER_SKEW) biases them toward a named load
 *     distribution (engine/router_skew.h); the routing and the prompt mode used are printed, and
 *     each level prints the experts read per layer and the busiest/average expert load.
 *   - --mixed N: at the largest batch B, a colocated step (as a decode worker without prefill
 *     workers runs it): B decode rows and a fresh N-token prompt in ONE forward, next to the prompt
 *     alone; each the median of 3. mixed - prompt alone is what the decode rows cost inside a mixed
 *     step, to hold against the decode step alone (served ITL p99 comes from these steps).
 *   - --profile: after the timed steps, a few more steps (and one prefill) with the per-op
 *     profile on (engine/model.h: each op synced and timed), printed as ms per step by op.
 *   - --verify-table (instead of the decode table): the cost of a speculative verify step, for
 *     k = 0..--max-k drafts per sequence and each batch size B: B sequences of --prompt-len tokens
 *     of context each take k + 1 new rows (a token and its k drafts) in one forward with the
 *     logits of every row, their argmax on the device (a greedy verify step as the decode worker
 *     runs it: only ids come back), the median of --steps steps; every step is rolled back to
 *     the context it started from (kvseq_truncate), so all steps of a cell see the same context.
 *     k = 0 is the one-token decode step. Printed: the step times, each against the one-token
 *     step, and the speedup they imply at each acceptance rate a of --accept (the chance that a
 *     draft is accepted, each independently): a step of k drafts emits (1 - a^(k+1)) / (1 - a)
 *     tokens on average, so its tokens per second against plain decoding are that times
 *     t(0) / t(k); the best k per batch size. Only costs are measured: with --load-format dummy
 *     the weights are random (the output says so) and acceptance must come from a real pair.
 * Exit status 0, 2 on a usage error, 1 on any other error (with a message naming it). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/engine_open.h"
#include "engine/quant.h"
#include "tools/lib/args.h"

#define KV_BLOCK 16
#define MAX_LEVELS 16
#define WARMUP_STEPS 2
#define PREFILL_RUNS 3
#define VERIFY_MAX_K 15
#define MAX_ACCEPT 8

static const char *s_usage =
    "usage: troupe-bench-engine MODEL_DIR [--backend cpu|cuda|cuda:N] [--dtype bf16|f16|f32]\n"
    "         [--kv-dtype auto|f32|bf16|f16|fp8] [--kv-scales auto|checkpoint|calibrate|one]\n"
    "         [--load-format auto|dummy] [--threads N]\n"
    "         [--prompt-len N] [--batch 1,16,64,256] [--steps N] [--chunk N] [--mixed N]\n"
    "         [--copy-bw TB/s] [--profile] [--json FILE] [--router-skew uniform|zipf:S|table:FILE]\n"
    "         [--prompts distinct|shared] [--seed N] [--verify-table [--max-k 7] [--accept 0.6,0.8]]\n"
    "         [--quantize fp8|int8|int4|nvfp4]\n"
    "--kv-dtype auto (default) keeps the KV cache in the weights' dtype; fp8 is E4M3 with a scale per\n"
    "layer, K/V and kv head: --kv-scales auto (default: the checkpoint's, else calibrated), one (scale 1).\n"
    "--router-skew (dummy weights; default TROUPE_DUMMY_ROUTER_SKEW, else uniform): MoE routers biased so\n"
    "that expert choice follows a Zipf law of exponent S or a troupe-expert-load table (docs/experts.md).\n"
    "--prompts distinct (default): every row its own random prompt (from --seed, default 1), prefilled once;\n"
    "shared: every row a copy of one prompt's KV (an MoE model's rows then route alike).\n"
    "--verify-table: the step cost of k + 1 rows per sequence (k = 0..max-k) at each --batch, and the\n"
    "speedup each implies at acceptance rates --accept (default batches there 1,2,4,...,256).\n";

typedef struct opts {
    const char *model_dir, *backend, *json;
    const char *router_skew;      /* --router-skew, NULL: TROUPE_DUMMY_ROUTER_SKEW or none */
    int dummy, threads, prompt_len, steps, chunk, profile, mixed;
    int shared;                   /* --prompts shared: every row a copy of one prompt */
    long long seed;               /* --seed: the rows' prompts */
    dtype_t dtype;                /* the dummy weights'; DT_COUNT: the config's */
    dtype_t kv_dtype;             /* DT_COUNT: auto (the weights' dtype) */
    int kv_scales;                /* --kv-scales: KV_SCALES_* (engine/kvscale.h), 0 auto */
    int quantize;                 /* --quantize: BK_Q_* at load; 0 none */
    int batch[MAX_LEVELS], n_levels;
    double copy_bw;               /* TB/s, 0 = not given */
    int verify, max_k;            /* --verify-table, drafts 0..max_k */
    double accept[MAX_ACCEPT];
    int n_accept;
} opts_t;

static int s_bad(const char *opt, const char *v)
{
    fprintf(stderr, "troupe-bench-engine: %s '%s' is not valid\n%s", opt, v, s_usage);
    return 2;
}

/* --accept: a comma-separated list of rates in [0, 1). */
static int s_accept_list(const char *v, double *out, int *n)
{
    *n = 0;
    for (const char *p = v; *p;) {
        char *end;
        const double a = strtod(p, &end);
        if (end == p || !(a >= 0 && a < 1) || *n == MAX_ACCEPT || (*end && *end != ','))
            return -1;
        out[(*n)++] = a;
        p = *end ? end + 1 : end;
    }
    return *n > 0 ? 0 : -1;
}

static int s_parse(int argc, char **argv, opts_t *o)
{
    static const char *T = "troupe-bench-engine";
    *o = (opts_t){.backend = "cpu", .prompt_len = 1000, .steps = 32, .chunk = 2048, .threads = 0,
                  .batch = {1, 16, 64, 256}, .n_levels = 4, .dtype = DT_COUNT, .kv_dtype = DT_COUNT,
                  .max_k = 7, .accept = {0.6, 0.8}, .n_accept = 2, .seed = 1};
    int batch_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            if (o->model_dir)
                return s_bad("MODEL_DIR (a second one)", a);
            o->model_dir = a;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(s_usage, stdout);
            exit(0);
        }
        if (!strcmp(a, "--profile")) {
            o->profile = 1;
            continue;
        }
        if (!strcmp(a, "--verify-table")) {
            o->verify = 1;
            continue;
        }
        if (!v)
            return s_bad(a, "(missing value)");
        i++;
        int rc = 0;
        if (!strcmp(a, "--backend"))
            o->backend = v;
        else if (!strcmp(a, "--dtype")) {
            if (dtype_parse(v, &o->dtype) < 0)
                return s_bad(a, v);
        }
        else if (!strcmp(a, "--kv-dtype"))
            rc = arg_kv_dtype(T, a, v, &o->kv_dtype);
        else if (!strcmp(a, "--kv-scales"))
            rc = arg_kv_scales(T, a, v, &o->kv_scales);
        else if (!strcmp(a, "--json"))
            o->json = v;
        else if (!strcmp(a, "--router-skew"))
            o->router_skew = v;
        else if (!strcmp(a, "--quantize")) {
            if ((o->quantize = quant_format_parse(v)) < 0)
                return s_bad(a, v);
        }
        else if (!strcmp(a, "--prompts")) {
            if (strcmp(v, "distinct") && strcmp(v, "shared"))
                return s_bad(a, v);
            o->shared = !strcmp(v, "shared");
        } else if (!strcmp(a, "--seed"))
            rc = arg_ll(T, a, v, 0, 1LL << 62, &o->seed);
        else if (!strcmp(a, "--load-format")) {
            if (strcmp(v, "dummy") && strcmp(v, "auto"))
                return s_bad(a, v);
            o->dummy = !strcmp(v, "dummy");
        } else if (!strcmp(a, "--threads"))
            rc = arg_int(T, a, v, 0, 1024, &o->threads);
        else if (!strcmp(a, "--prompt-len"))
            rc = arg_int(T, a, v, 1, 1 << 20, &o->prompt_len);
        else if (!strcmp(a, "--steps"))
            rc = arg_int(T, a, v, 1, 100000, &o->steps);
        else if (!strcmp(a, "--chunk"))
            rc = arg_int(T, a, v, 1, 1 << 16, &o->chunk);
        else if (!strcmp(a, "--mixed"))
            rc = arg_int(T, a, v, 0, 1 << 16, &o->mixed);
        else if (!strcmp(a, "--copy-bw"))
            rc = arg_double(T, a, v, 1e-6, 1e6, &o->copy_bw);
        else if (!strcmp(a, "--batch")) {
            rc = (o->n_levels = arg_int_list(T, a, v, 1, 4096, o->batch, MAX_LEVELS)) < 0 ? -1 : 0;
            batch_given = 1;
        } else if (!strcmp(a, "--max-k"))
            rc = arg_int(T, a, v, 0, VERIFY_MAX_K, &o->max_k);
        else if (!strcmp(a, "--accept")) {
            rc = s_accept_list(v, o->accept, &o->n_accept);
            if (rc < 0)
                return s_bad(a, v);
        } else
            return s_bad("option", a);
        if (rc < 0)
            return 2;
    }
    if (!o->model_dir)
        return s_bad("MODEL_DIR", "(missing)");
    if (o->verify && !batch_given) {   /* the verify table's default: powers of two to 256 */
        o->n_levels = 9;
        for (int i = 0; i < 9; i++)
            o->batch[i] = 1 << i;
    }
    return 0;
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Weight bytes a decode step of B rows reads: all of a dense model; an MoE model's dense part plus
 * the experts some row routes to, 1 - (1 - k/E)^B of them on average for uniform routing (what
 * random weights give). From the model's total and per-token active bytes: each expert has
 * e = (total - active) / (E - k) bytes, the dense part is total - E e. */
static double s_step_weight_bytes(const model_config_t *c, size_t total, size_t active, int B)
{
    const int E = c->num_experts, k = c->num_experts_per_tok;
    if (E <= 0 || k <= 0 || k >= E)
        return (double)total;
    const double e = ((double)total - (double)active) / (E - k), dense = (double)total - E * e;
    return dense + E * e * (1.0 - pow(1.0 - (double)k / E, B));
}

/* The same with the experts a step actually routed to: used [L] distinct experts per layer (the
 * dense layers' entries ignored), from one step's MoE counters. Every MoE layer's experts are
 * taken to be of one size. */
static double s_step_weight_bytes_routed(const model_config_t *c, size_t total, size_t active, const int *used)
{
    const int E = c->num_experts, k = c->num_experts_per_tok;
    if (E <= 0 || k <= 0 || k >= E)
        return (double)total;
    const double e = ((double)total - (double)active) / (E - k), dense = (double)total - E * e;
    int moe_layers = 0;
    double routed = 0;
    for (int l = 0; l < c->num_layers; l++)
        if (config_layer_is_moe(c, l)) {
            moe_layers++;
            routed += used[l];
        }
    /* e is one expert index over every MoE layer: a layer's expert is e / moe_layers */
    return moe_layers ? dense + e * routed / moe_layers : (double)total;
}

static double s_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Row r's prompt generator (--prompts distinct): splitmix64 from --seed and r. */
static uint64_t s_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t s_rng = 0x9E3779B97F4A7C15ull;
static int32_t s_rand_id(int vocab)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (int32_t)(s_rng % (uint64_t)vocab);
}

/* Prints and clears the model's profile as ms per step ("-" when profiling found nothing). */
static void s_print_profile(model_t *m, const char *what, int n_steps, json_t *into)
{
    char buf[2048];
    if (!model_profile(m, buf, sizeof buf, 1))
        return;
    printf("  profile, %s (ms per step, each op synced):", what);
    json_t *jp = json_object();
    double total = 0;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[64];
        double ms;
        long long calls;
        if (sscanf(line, "%63s %lf %lld", name, &ms, &calls) == 3) {
            printf(" %s %.3f", name, ms / n_steps);
            json_object_set_new(jp, name, json_real(ms / n_steps));
            total += ms / n_steps;
        }
    }
    printf(" | total %.3f\n", total);
    json_object_set_new(into, "profile_ms_per_step", jp);
}

/* Prefills seq (already holding its prompt tokens via the caller's append) in chunks. */
static int s_prefill(model_t *m, kvseq_t *seq, const int32_t *ids, int n, int chunk, float *logits, char *err,
                     size_t errlen)
{
    for (int at = 0; at < n; at += chunk) {
        int k = n - at < chunk ? n - at : chunk;
        model_seq_t q = {.kv = seq, .n_new = k};
        model_batch_t b = {.n_seqs = 1, .seqs = &q};
        if (kvseq_append(seq, ids + at, k) < 0)
            return errf(err, errlen, "the KV pool is full");
        if (model_forward(m, &b, logits, err, errlen) < 0)
            return -1;
    }
    return 0;
}

typedef struct bench {
    const opts_t *o;
    engine_t *e;
    int max_b;                    /* the largest batch */
    int ctx;                      /* tokens per sequence: the prompt, every step, --mixed's prompt */
    int chunk;                    /* prefill chunk */
    int rows_per_prefill;         /* --prompts distinct: rows prefilled in one forward */
    kvseq_t **seqs;               /* [max_b + 2]: [0, max_b) decode, max_b the prefilled template, max_b + 1 --mixed's prompt */
    model_seq_t *ms;              /* [max_b + 1] */
    int32_t *ids;                 /* [prompt_len] the template's prompt */
    int32_t *out;                 /* [max_b + 1] each row's next id (the device argmax) */
    double *step_ms;              /* [steps] */
    double *step_bytes;           /* [steps] bytes each timed step read: weights (routed experts) + KV */
    double *step_kv;              /* [steps] of which KV */
    double *step_used;            /* [steps] distinct experts per MoE layer, mean over layers (0: not counted) */
    double *step_busiest;         /* [steps] busiest/average expert load, mean over MoE layers */
    uint64_t *cnt;                /* [layers][experts] one step's MoE counts; NULL: not an MoE model, or no counters */
    int *used;                    /* [layers] distinct experts of one step */
    size_t wbytes, abytes, kv_tok;    /* weight bytes (all, per token), KV bytes per token */
    json_t *root, *levels;
    char err[1024];
} bench_t;

/* A fresh n-token prompt of random ids in --mixed's sequence. */
static int s_fresh_prompt(bench_t *b, int n, uint64_t seed)
{
    kvseq_t **seq = &b->seqs[b->max_b + 1];
    kvseq_destroy(seq);
    if (!(*seq = kvseq_new(b->e->pool, b->ctx, seed)))
        return -1;
    for (int i = 0; i < n; i++) {
        const int32_t id = s_rand_id(b->e->cfg.vocab_size);
        if (kvseq_append(*seq, &id, 1) < 0)
            return -1;
    }
    return 0;
}

/* --mixed: seqs[0..B) hold decode contexts (out[] their next ids), seqs[max_b + 1] the prompt's.
 * The median of 3 (after a warm-up) of: the N-token prompt alone, and B decode rows plus the prompt
 * in one forward (rows in the decode worker's order: decode rows first). With --profile, one more
 * mixed step under the per-op profile. */
static int s_mixed(bench_t *b, int B, double *alone_ms, double *mixed_ms)
{
    model_t *m = b->e->model;
    backend_t *be = b->e->be;
    const int N = b->o->mixed, profile = b->o->profile;
    kvseq_t **seqs = b->seqs, **prompt = &b->seqs[b->max_b + 1];
    model_seq_t *ms = b->ms;
    double t_alone[PREFILL_RUNS], t_mixed[PREFILL_RUNS];
    for (int run = -1; run < PREFILL_RUNS + (profile ? 1 : 0); run++) {
        const int prof = run == PREFILL_RUNS;
        if (!prof) {
            if (s_fresh_prompt(b, N, 500 + (uint64_t)run) < 0)
                return errf(b->err, sizeof b->err, "the KV pool cannot hold the %d-token prompt", N);
            ms[0] = (model_seq_t){.kv = *prompt, .n_new = N};
            model_batch_t mb = {.n_seqs = 1, .seqs = ms, .argmax_out = b->out + B};
            be->ops->sync(be);
            int64_t t = now_ns();
            if (model_forward(m, &mb, b->e->logits, b->err, sizeof b->err) < 0)
                return -1;
            if (run >= 0)
                t_alone[run] = (now_ns() - t) / 1e6;
        }
        if (s_fresh_prompt(b, N, 600 + (uint64_t)run) < 0)
            return errf(b->err, sizeof b->err, "the KV pool cannot hold the %d-token prompt", N);
        for (int s = 0; s < B; s++) {
            if (kvseq_append(seqs[s], &b->out[s], 1) < 0)
                return errf(b->err, sizeof b->err, "the KV pool is full");
            ms[s] = (model_seq_t){.kv = seqs[s], .n_new = 1};
        }
        ms[B] = (model_seq_t){.kv = *prompt, .n_new = N};
        model_batch_t mb = {.n_seqs = B + 1, .seqs = ms, .argmax_out = b->out};
        be->ops->sync(be);
        model_profile_enable(m, prof);
        int64_t t = now_ns();
        if (model_forward(m, &mb, b->e->logits, b->err, sizeof b->err) < 0)
            return -1;
        model_profile_enable(m, 0);
        if (run >= 0 && !prof)
            t_mixed[run] = (now_ns() - t) / 1e6;
    }
    *alone_ms = s_median(t_alone, PREFILL_RUNS);
    *mixed_ms = s_median(t_mixed, PREFILL_RUNS);
    return 0;
}

/* ---- the run ----------------------------------------------------------------------------- */


/* Prints the error; -1. */
static int s_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int s_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("troupe-bench-engine: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

/* The model as the workers open it, sized for every batch level, --mixed and the template. */
static int s_open(bench_t *b)
{
    const opts_t *o = b->o;
    engine_spec_t s;
    engine_spec_default(&s);
    s.backend = o->backend;
    s.threads = o->threads;
    s.dummy = o->dummy;
    s.dtype = o->dtype;
    s.kv_dtype = o->kv_dtype;
    s.kv_dtype_option = "--kv-dtype";
    s.kv_scales = o->kv_scales;
    s.kv_scales_option = "--kv-scales";
    s.dummy_option = "--load-format dummy";
    int max_tokens = b->max_b + o->mixed > b->chunk ? b->max_b + o->mixed : b->chunk;
    const int rows_tokens = o->shared ? 0 : b->rows_per_prefill * b->chunk;   /* distinct rows' prefills */
    max_tokens = rows_tokens > max_tokens ? rows_tokens : max_tokens;
    const int verify_rows = o->verify ? b->max_b * (o->max_k + 1) : 0;   /* every row's logits */
    max_tokens = verify_rows > max_tokens ? verify_rows : max_tokens;
    s.model = (model_opts_t){.max_tokens = max_tokens, .max_seqs = b->max_b + 1, .max_context = b->ctx,
                             .kv_block_size = KV_BLOCK, .max_logit_rows = verify_rows > b->max_b + 1 ? verify_rows : 0,
                             .router_skew = o->router_skew, .quantize = o->quantize};
    if (o->router_skew && !o->dummy)
        return s_fail("--router-skew %s needs --load-format dummy (a checkpoint routes as trained)", o->router_skew);
    s.kv_blocks = (long)(b->max_b + 2) * ((b->ctx + KV_BLOCK - 1) / KV_BLOCK);
    int64_t t0 = now_ns();
    if (!(b->e = engine_open(o->model_dir, &s, NULL, b->err, sizeof b->err)))
        return s_fail("%s", b->err);
    b->e->be->ops->sync(b->e->be);
    const double load_s = (now_ns() - t0) / 1e9;
    b->wbytes = model_weight_bytes(b->e->model);
    b->abytes = model_active_weight_bytes(b->e->model);
    b->kv_tok = config_kv_bytes_per_token(&b->e->cfg, dtype_size(b->e->kv_dtype));
    printf("model %s (%s, %s%s%s), backend %s: %.2f GB of weights (%.2f GB active per token), KV %.1f KB per "
           "token (%s), loaded in %.1f s\n", o->model_dir, o->dummy ? "dummy weights" : "checkpoint",
           dtype_name(b->e->weights_dtype), o->quantize ? ", quantized at load to " : "",
           o->quantize ? quant_format_name(o->quantize) : "", b->e->be->ops->name, b->wbytes / 1e9, b->abytes / 1e9, b->kv_tok / 1e3,
           dtype_name(b->e->kv_dtype), load_s);
    if (b->e->cfg.num_experts > 0) {
        const char *skew = model_router_skew(b->e->model);
        const int uniform = !strcmp(skew, "uniform-random");
        double target = 0;
        for (int l = 0; l < b->e->cfg.num_layers; l++) {
            const double t = model_router_skew_target(b->e->model, l);
            target = t > target ? t : target;
        }
        if (uniform)
            printf("routing: %s\n",
                   o->dummy ? "uniform-random (dummy weights' routers, no skew)" : "the checkpoint's routers");
        else
            printf("routing: skew %s (router bias on dummy weights; target busiest/average expert load up to %.2f)\n",
                   skew, target);
        json_object_set_new(b->root, "routing", json_string(uniform && !o->dummy ? "checkpoint" : skew));
        if (!uniform)
            json_object_set_new(b->root, "routing_target", json_real(target));   /* busiest/average, largest layer */
        const size_t n = (size_t)b->e->cfg.num_layers * (size_t)b->e->cfg.num_experts;
        if (b->e->be->ops->moe_count && (!(b->cnt = calloc(n, sizeof *b->cnt)) ||
                                         !(b->used = calloc((size_t)b->e->cfg.num_layers, sizeof *b->used))))
            return s_fail("out of memory");
    }
    if (o->shared)
        printf("prompts: shared: every row's context a copy of one %d-token prompt's KV\n", o->prompt_len);
    json_object_set_new(b->root, "prompts", json_string(o->shared ? "shared" : "distinct"));
    if (!o->shared)
        json_object_set_new(b->root, "prompt_seed", json_integer(o->seed));
    return 0;
}

/* The template sequence: a random prompt prefilled (a warm-up, then the median of 3). */
static int s_bench_prefill(bench_t *b)
{
    const opts_t *o = b->o;
    engine_t *e = b->e;
    double pf_ms[PREFILL_RUNS];
    for (int run = -1; run < PREFILL_RUNS; run++) {
        for (int i = 0; i < o->prompt_len; i++)
            b->ids[i] = s_rand_id(e->cfg.vocab_size);
        kvseq_destroy(&b->seqs[b->max_b]);
        if (!(b->seqs[b->max_b] = kvseq_new(e->pool, b->ctx, (uint64_t)run + 7)))
            return s_fail("out of memory");
        e->be->ops->sync(e->be);
        int64_t t = now_ns();
        if (s_prefill(e->model, b->seqs[b->max_b], b->ids, o->prompt_len, b->chunk, e->logits, b->err, sizeof b->err) < 0)
            return s_fail("prefill: %s", b->err);
        if (run >= 0)
            pf_ms[run] = (now_ns() - t) / 1e6;
    }
    const double prefill_ms = s_median(pf_ms, PREFILL_RUNS);
    printf("prefill of %d tokens (chunks of %d): %.2f ms (median of %d), %.0f tokens/s\n", o->prompt_len, b->chunk,
           prefill_ms, PREFILL_RUNS, o->prompt_len / (prefill_ms / 1e3));
    json_object_set_new(b->root, "prefill_ms", json_real(prefill_ms));
    json_object_set_new(b->root, "prefill_tokens_per_s", json_real(o->prompt_len / (prefill_ms / 1e3)));
    return 0;
}

/* seqs[0, B) for a level, each with a random next id: --prompts distinct, the rows' own prompts
 * (prefilled once by s_prefill_rows) cut back to their prompt; shared, copies of the template's KV
 * blocks (distinct memory per sequence, one content). */
static int s_contexts(bench_t *b, int B)
{
    engine_t *e = b->e;
    const kvseq_t *tmpl = b->seqs[b->max_b];
    for (int s = 0; s < B; s++) {
        if (!b->o->shared) {
            if (kvseq_truncate(b->seqs[s], b->o->prompt_len) != 0)
                return s_fail("cannot cut row %d back to its %d-token prompt", s, b->o->prompt_len);
        } else {
            if (!(b->seqs[s] = kvseq_new(e->pool, b->ctx, 1000 + (uint64_t)s)) ||
                kvseq_append(b->seqs[s], kvseq_tokens(tmpl), b->o->prompt_len) < 0)
                return s_fail("the KV pool cannot hold %d sequences", B);
            for (int k = 0; k < kvseq_n_blocks(tmpl); k++)
                e->be->ops->copy(e->be, kvpool_block_ptr(e->pool, kvseq_blocks(b->seqs[s])[k]),
                                 kvpool_block_ptr(e->pool, kvseq_blocks(tmpl)[k]), kvpool_view(e->pool)->block_bytes);
        }
        b->out[s] = s_rand_id(e->cfg.vocab_size);
    }
    e->be->ops->sync(e->be);
    return 0;
}

/* After a level: shared contexts are freed; distinct rows stay for the next level. */
static void s_release_rows(bench_t *b, int B)
{
    for (int s = 0; b->o->shared && s < B; s++)
        kvseq_destroy(&b->seqs[s]);
}

/* --prompts distinct: rows [0, max_b) each get a prompt of random ids of their own (row r's from
 * --seed and r), prefilled rows_per_prefill rows per forward (a row alone in --chunk pieces when
 * its prompt is longer than a chunk). */
static int s_prefill_rows(bench_t *b)
{
    const opts_t *o = b->o;
    engine_t *e = b->e;
    const int n = o->prompt_len, per = b->rows_per_prefill;
    const int64_t t0 = now_ns();
    for (int r0 = 0; r0 < b->max_b; r0 += per) {
        const int nr = b->max_b - r0 < per ? b->max_b - r0 : per;
        for (int r = r0; r < r0 + nr; r++) {
            uint64_t x = (uint64_t)o->seed * 0x100000001b3ull + (uint64_t)r;
            for (int i = 0; i < n; i++)
                b->ids[i] = (int32_t)(s_splitmix(&x) % (uint64_t)e->cfg.vocab_size);
            if (!(b->seqs[r] = kvseq_new(e->pool, b->ctx, 1000 + (uint64_t)r)))
                return s_fail("the KV pool cannot hold %d sequences", b->max_b);
            if (nr == 1) {
                if (s_prefill(e->model, b->seqs[r], b->ids, n, b->chunk, e->logits, b->err, sizeof b->err) < 0)
                    return s_fail("prefill of row %d: %s", r, b->err);
                continue;
            }
            if (kvseq_append(b->seqs[r], b->ids, n) < 0)
                return s_fail("the KV pool is full");
            b->ms[r - r0] = (model_seq_t){.kv = b->seqs[r], .n_new = n};
        }
        model_batch_t mb = {.n_seqs = nr, .seqs = b->ms, .argmax_out = b->out};
        if (nr > 1 && model_forward(e->model, &mb, e->logits, b->err, sizeof b->err) < 0)
            return s_fail("prefill of rows %d..%d: %s", r0, r0 + nr - 1, b->err);
    }
    e->be->ops->sync(e->be);
    printf("prompts: distinct: every row its own %d random token ids (seed %lld); %d rows prefilled, %d per forward, "
           "in %.1f s\n", n, o->seed, b->max_b, per, (now_ns() - t0) / 1e9);
    return 0;
}

/* Reads and clears the MoE counters into b->cnt (a step's own counts when read before and after it). */
static int s_read_counts(bench_t *b)
{
    const model_config_t *c = &b->e->cfg;
    memset(b->cnt, 0, (size_t)c->num_layers * (size_t)c->num_experts * sizeof(uint64_t));
    char err[256];
    if (model_expert_load(b->e->model, b->cnt, err, sizeof err) < 0)
        return s_fail("reading the MoE counters: %s", err);
    return 0;
}

/* Timed step i of B rows, its counts in b->cnt: step_used / step_busiest from them, and
 * step_bytes the weights it read (the experts it routed to; the uniform guess when the counters
 * are off) plus kv. */
static void s_step_account(bench_t *b, int i, int B, double kv)
{
    const model_config_t *c = &b->e->cfg;
    double used = 0, busiest = 0;
    int moe_layers = 0;
    for (int l = 0; b->cnt && l < c->num_layers; l++) {
        uint64_t mx = 0, sum = 0;
        b->used[l] = 0;
        for (int x = 0; x < c->num_experts; x++) {
            const uint64_t n = b->cnt[(size_t)l * c->num_experts + x];
            b->used[l] += n > 0;
            mx = n > mx ? n : mx;
            sum += n;
        }
        if (config_layer_is_moe(c, l)) {
            moe_layers++;
            used += b->used[l];
            busiest += sum ? (double)mx * c->num_experts / (double)sum : 0;
        }
    }
    b->step_used[i] = moe_layers ? used / moe_layers : 0;
    b->step_busiest[i] = moe_layers ? busiest / moe_layers : 0;
    const double w = b->step_used[i] > 0 ? s_step_weight_bytes_routed(c, b->wbytes, b->abytes, b->used)
                                         : s_step_weight_bytes(c, b->wbytes, b->abytes, B);
    b->step_bytes[i] = w + kv;
    b->step_kv[i] = kv;
}

/* --steps greedy steps of B rows (after the warm-ups; with --profile 3 more under the profile):
 * step_ms, and with s_step_account what each timed step read (the counters are read between
 * steps, outside the timed forward). */
static int s_steps(bench_t *b, int B)
{
    const opts_t *o = b->o;
    engine_t *e = b->e;
    for (int step = -WARMUP_STEPS; step < o->steps + (o->profile ? 3 : 0); step++) {
        const int timed = step >= 0 && step < o->steps;
        if (step == o->steps)
            model_profile_enable(e->model, 1);
        double kv = 0;
        for (int s = 0; s < B; s++) {
            if (kvseq_append(b->seqs[s], &b->out[s], 1) < 0)
                return s_fail("the KV pool is full");
            b->ms[s] = (model_seq_t){.kv = b->seqs[s], .n_new = 1};
            kv += (double)kvseq_len(b->seqs[s]) * (double)b->kv_tok;
        }
        if (step == 0 && b->cnt && s_read_counts(b) < 0)   /* the warm-ups' counts are nobody's */
            return -1;
        model_batch_t mb = {.n_seqs = B, .seqs = b->ms, .argmax_out = b->out};
        int64_t t = now_ns();
        if (model_forward(e->model, &mb, e->logits, b->err, sizeof b->err) < 0)
            return s_fail("decode step at batch %d: %s", B, b->err);
        if (!timed)
            continue;
        b->step_ms[step] = (now_ns() - t) / 1e6;
        if (b->cnt && s_read_counts(b) < 0)
            return -1;
        s_step_account(b, step, B, kv);
    }
    model_profile_enable(e->model, 0);
    return 0;
}

/* --mixed at batch B (decode step alone: med ms): the colocated step against the prompt alone. */
static int s_bench_mixed(bench_t *b, int B, double med)
{
    const opts_t *o = b->o;
    engine_t *e = b->e;
    double alone = 0, mixed = 0;
    if (s_mixed(b, B, &alone, &mixed) < 0)
        return s_fail("--mixed %d at batch %d: %s", o->mixed, B, b->err);
    printf("  mixed step, %d decode rows + a %d-token prompt: %.3f ms; the prompt alone %.3f ms, so the decode "
           "rows cost %.3f ms in it (alone %.3f ms, x%.2f)\n", B, o->mixed, mixed, alone, mixed - alone, med,
           (mixed - alone) / med);
    json_t *jm = json_object();
    if (o->profile) {
        char what[96];
        snprintf(what, sizeof what, "mixed step (%d decode rows + %d prompt tokens)", B, o->mixed);
        s_print_profile(e->model, what, 1, jm);
    }
    json_object_set_new(jm, "prompt_tokens", json_integer(o->mixed));
    json_object_set_new(jm, "mixed_step_ms", json_real(mixed));
    json_object_set_new(jm, "prompt_alone_ms", json_real(alone));
    json_object_set_new(jm, "decode_rows_in_mixed_ms", json_real(mixed - alone));
    json_object_set_new(b->root, "mixed", jm);
    kvseq_destroy(&b->seqs[b->max_b + 1]);
    return 0;
}

static void s_range(const double *v, int n, double *mean, double *lo, double *hi)
{
    *mean = 0, *lo = v[0], *hi = v[0];
    for (int i = 0; i < n; i++) {
        *mean += v[i] / n;
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
    }
}

/* One batch level: its row of the table and of the JSON (--mixed at the last level). */
static int s_bench_level(bench_t *b, int lv)
{
    const opts_t *o = b->o;
    const model_config_t *cfg = &b->e->cfg;
    const int B = o->batch[lv], n = o->steps;
    if (s_contexts(b, B) < 0 || s_steps(b, B) < 0)
        return -1;
    double bytes, bytes_lo, bytes_hi, used, used_lo, used_hi, busiest, busiest_lo, busiest_hi;
    s_range(b->step_bytes, n, &bytes, &bytes_lo, &bytes_hi);
    s_range(b->step_used, n, &used, &used_lo, &used_hi);
    s_range(b->step_busiest, n, &busiest, &busiest_lo, &busiest_hi);
    const double med = s_median(b->step_ms, n);   /* sorts step_ms, which nothing reads after */
    const double tps = B / (med / 1e3), copy_bps = o->copy_bw * 1e12, bps = bytes / (med / 1e3);
    const double bound_ms = copy_bps > 0 ? bytes / copy_bps * 1e3 : 0;
    const int moe = cfg->num_experts > 0, routed = moe && used_lo > 0;
    printf("%6d %8d %10.3f %10.1f %10.2f %9.3f", B, o->prompt_len + 1, med, tps, bytes / 1e9, bps / 1e12);
    if (copy_bps > 0)
        printf(" %9.3f %7.0f%%", bound_ms, 100 * bound_ms / med);
    printf("\n");
    const double uniform_used =
        moe ? cfg->num_experts * (1.0 - pow(1.0 - (double)cfg->num_experts_per_tok / cfg->num_experts, B)) : 0;
    if (routed) {
        printf("         MoE: %.1f of %d experts per layer read per step (%.1f-%.1f over the %d steps; independent "
               "uniform routing: %.1f); GB/step counts those (%.2f-%.2f)\n",
               used, cfg->num_experts, used_lo, used_hi, n, uniform_used, bytes_lo / 1e9, bytes_hi / 1e9);
        printf("         MoE: busiest/average expert load %.2f (mean over layers and steps, %.2f-%.2f; %d routed "
               "(token, expert) pairs per layer per step)\n",
               busiest, busiest_lo, busiest_hi, B * cfg->num_experts_per_tok);
    } else if (moe) {
        printf("         MoE: the load counters are off (TROUPE_MOE_COUNT=0, or the backend does not count): GB/step "
               "assumes independent uniform routing (%.1f experts per layer)\n", uniform_used);
    }
    json_t *jl = json_object();
    if (moe) {
        json_object_set_new(jl, "bytes_counted", json_string(routed ? "routed" : "uniform-routing-guess"));
        double kv_mean = 0;
        for (int i = 0; i < n; i++)
            kv_mean += b->step_kv[i] / n;
        json_object_set_new(jl, "bytes_per_step_uniform_routing",
                            json_real(s_step_weight_bytes(cfg, b->wbytes, b->abytes, B) + kv_mean));
    }
    if (routed) {
        json_object_set_new(jl, "experts_routed_per_layer", json_real(used));
        json_object_set_new(jl, "experts_routed_per_layer_min", json_real(used_lo));
        json_object_set_new(jl, "experts_routed_per_layer_max", json_real(used_hi));
        json_object_set_new(jl, "expert_busiest_over_avg", json_real(busiest));
        json_object_set_new(jl, "bytes_per_step_min", json_real(bytes_lo));
        json_object_set_new(jl, "bytes_per_step_max", json_real(bytes_hi));
    }
    json_object_set_new(jl, "batch", json_integer(B));
    json_object_set_new(jl, "context", json_integer(o->prompt_len + 1));
    json_object_set_new(jl, "step_ms", json_real(med));
    json_object_set_new(jl, "tokens_per_s", json_real(tps));
    json_object_set_new(jl, "bytes_per_step", json_real(bytes));
    json_object_set_new(jl, "bytes_per_s", json_real(bps));
    if (copy_bps > 0) {
        json_object_set_new(jl, "bound_ms", json_real(bound_ms));
        json_object_set_new(jl, "fraction_of_copy_bw", json_real(bps / copy_bps));
    }
    json_array_append_new(b->levels, jl);
    if (o->profile) {
        char what[64];
        snprintf(what, sizeof what, "decode batch %d", B);
        s_print_profile(b->e->model, what, 3, jl);
    }
    if (o->mixed > 0 && lv == o->n_levels - 1 && s_bench_mixed(b, B, med) < 0)
        return -1;
    s_release_rows(b, B);
    return 0;
}

/* --profile: one more prefill of the template's prompt under the per-op profile. */
static int s_profile_prefill(bench_t *b)
{
    engine_t *e = b->e;
    kvseq_destroy(&b->seqs[b->max_b]);
    if (!(b->seqs[b->max_b] = kvseq_new(e->pool, b->ctx, 99)))
        return s_fail("out of memory");
    model_profile_enable(e->model, 1);
    if (s_prefill(e->model, b->seqs[b->max_b], b->ids, b->o->prompt_len, b->chunk, e->logits, b->err, sizeof b->err) < 0)
        return s_fail("prefill: %s", b->err);
    model_profile_enable(e->model, 0);
    s_print_profile(e->model, "prefill", 1, b->root);
    return 0;
}

/* ---- --verify-table ----------------------------------------------------------------------- */

/* --steps verify steps of B sequences with k drafts each (after the warm-ups), each rolled back to
 * the context it started from: *med the median step. */
static int s_verify_steps(bench_t *b, int B, int k, double *med)
{
    const opts_t *o = b->o;
    engine_t *e = b->e;
    for (int step = -WARMUP_STEPS; step < o->steps; step++) {
        for (int s = 0; s < B; s++) {
            int32_t ids[VERIFY_MAX_K + 1];
            ids[0] = b->out[s];
            for (int j = 1; j <= k; j++)
                ids[j] = s_rand_id(e->cfg.vocab_size);
            if (kvseq_append(b->seqs[s], ids, k + 1) < 0)
                return s_fail("the KV pool is full");
            b->ms[s] = (model_seq_t){.kv = b->seqs[s], .n_new = k + 1};
        }
        model_batch_t mb = {.n_seqs = B, .seqs = b->ms, .all_logits = 1, .argmax_out = b->out};
        int64_t t = now_ns();
        if (model_forward(e->model, &mb, e->logits, b->err, sizeof b->err) < 0)
            return s_fail("verify step at batch %d, k %d: %s", B, k, b->err);
        if (step >= 0)
            b->step_ms[step] = (now_ns() - t) / 1e6;
        for (int s = 0; s < B; s++) {
            if (kvseq_truncate(b->seqs[s], o->prompt_len) != 0)
                return s_fail("cannot roll sequence %d back to %d tokens", s, o->prompt_len);
            b->out[s] = b->out[(size_t)s * (k + 1) + k];   /* the last row's id: the next step's token */
        }
    }
    *med = s_median(b->step_ms, o->steps);
    return 0;
}

/* The table's header: batch, then a column per k (k = 0 labelled first), then tail. */
static void s_k_header(int K, const char *first, const char *tail)
{
    printf("%6s %9s", "batch", first);
    for (int k = 1; k < K; k++) {
        char col[16];
        snprintf(col, sizeof col, "k=%d", k);
        printf(" %9s", col);
    }
    printf("%s\n", tail);
}

/* Expected tokens a step of k drafts emits when each draft is accepted with probability a. */
static double s_expected_tokens(double a, int k) { return (1.0 - pow(a, k + 1)) / (1.0 - a); }

/* The table: one row per batch size, step ms for k = 0..max_k, then each against k = 0, then the
 * speedup at each acceptance rate. */
static int s_verify_table(bench_t *b)
{
    const opts_t *o = b->o;
    const int K = o->max_k + 1;
    double *ms = calloc((size_t)o->n_levels * K, sizeof *ms);
    int32_t *out = realloc(b->out, (size_t)b->max_b * K * sizeof *b->out + sizeof *b->out);
    if (!ms || !out) {
        free(ms);
        return s_fail("out of memory");
    }
    b->out = out;
    printf("verify step cost%s: B sequences x (k + 1) new rows, every row's logits and its argmax on the device, "
           "%d tokens of context, KV %s; median of %d steps (ms)\n",
           o->dummy ? " (dummy weights: step costs only, acceptance is not measured)" : "", o->prompt_len,
           dtype_name(b->e->kv_dtype), o->steps);
    s_k_header(K, "1-token", "");
    json_t *jt = json_array();
    for (int lv = 0; lv < o->n_levels; lv++) {
        const int B = o->batch[lv];
        if (s_contexts(b, B) < 0)
            return free(ms), json_decref(jt), -1;
        printf("%6d", B);
        for (int k = 0; k < K; k++) {
            if (s_verify_steps(b, B, k, &ms[lv * K + k]) < 0)
                return free(ms), json_decref(jt), -1;
            printf(" %9.3f", ms[lv * K + k]);
            fflush(stdout);
            json_t *jc = json_object();
            json_object_set_new(jc, "batch", json_integer(B));
            json_object_set_new(jc, "k", json_integer(k));
            json_object_set_new(jc, "rows_per_seq", json_integer(k + 1));
            json_object_set_new(jc, "step_ms", json_real(ms[lv * K + k]));
            json_object_set_new(jc, "cost_vs_one_token", json_real(ms[lv * K + k] / ms[lv * K]));
            json_array_append_new(jt, jc);
        }
        printf("\n");
        s_release_rows(b, B);
    }
    printf("step cost against the one-token step (t(k) / t(0))\n");
    s_k_header(K, "k=0", "");
    for (int lv = 0; lv < o->n_levels; lv++) {
        printf("%6d", o->batch[lv]);
        for (int k = 0; k < K; k++)
            printf(" %9.2f", ms[lv * K + k] / ms[lv * K]);
        printf("\n");
    }
    json_t *js = json_array();
    for (int ai = 0; ai < o->n_accept; ai++) {
        const double a = o->accept[ai];
        printf("implied speedup at acceptance a = %.3f (tokens/s against plain decoding: (1 - a^(k+1)) / (1 - a) "
               "x t(0) / t(k))\n", a);
        s_k_header(K, "k=0", "   best");
        for (int lv = 0; lv < o->n_levels; lv++) {
            int best = 0;
            double best_x = 0;
            printf("%6d", o->batch[lv]);
            for (int k = 0; k < K; k++) {
                const double x = s_expected_tokens(a, k) * ms[lv * K] / ms[lv * K + k];
                if (x > best_x)
                    best_x = x, best = k;
                printf(" %9.2f", x);
            }
            printf("   k=%d x%.2f\n", best, best_x);
            json_t *jb = json_object();
            json_object_set_new(jb, "accept", json_real(a));
            json_object_set_new(jb, "batch", json_integer(o->batch[lv]));
            json_object_set_new(jb, "best_k", json_integer(best));
            json_object_set_new(jb, "speedup", json_real(best_x));
            json_array_append_new(js, jb);
        }
    }
    json_object_set_new(b->root, "verify_table", jt);
    json_object_set_new(b->root, "verify_best", js);
    json_object_set_new(b->root, "weights", json_string(o->dummy ? "dummy" : "checkpoint"));
    free(ms);
    return 0;
}

static int s_write_json(bench_t *b)
{
    const opts_t *o = b->o;
    json_t *j = b->root;
    json_object_set_new(j, "model", json_string(o->model_dir));
    json_object_set_new(j, "backend", json_string(b->e->be->ops->name));
    json_object_set_new(j, "dtype", json_string(dtype_name(b->e->weights_dtype)));
    json_object_set_new(j, "quantize", json_string(o->quantize ? quant_format_name(o->quantize) : "none"));
    json_object_set_new(j, "weight_bytes", json_real((double)b->wbytes));
    json_object_set_new(j, "active_weight_bytes", json_real((double)b->abytes));
    json_object_set_new(j, "kv_dtype", json_string(dtype_name(b->e->kv_dtype)));
    json_object_set_new(j, "kv_bytes_per_token", json_real((double)b->kv_tok));
    json_object_set_new(j, "prompt_len", json_integer(o->prompt_len));
    json_object_set_new(j, "copy_bw_tbps", json_real(o->copy_bw));
    json_object_set_new(j, "decode", json_incref(b->levels));
    if (o->json && json_dump_file(j, o->json, JSON_INDENT(1)) < 0)
        return s_fail("cannot write %s", o->json);
    return 0;
}

static int s_run(bench_t *b)
{
    const opts_t *o = b->o;
    if (s_open(b) < 0 || s_bench_prefill(b) < 0 || (!o->shared && s_prefill_rows(b) < 0))
        return -1;
    if (o->verify)
        return s_verify_table(b) < 0 ? -1 : s_write_json(b);
    printf("%6s %8s %10s %10s %10s %9s", "batch", "context", "step ms", "tok/s", "GB/step", "TB/s");
    if (o->copy_bw > 0)
        printf(" %9s %8s   (bound: GB/step at the copy bandwidth, %.3f TB/s)", "bound ms", "of bound", o->copy_bw);
    printf("\n");
    for (int lv = 0; lv < o->n_levels; lv++)
        if (s_bench_level(b, lv) < 0)
            return -1;
    if (o->profile && s_profile_prefill(b) < 0)
        return -1;
    return s_write_json(b);
}

int main(int argc, char **argv)
{
    opts_t o;
    int rc = s_parse(argc, argv, &o);
    if (rc)
        return rc;
    log_init("bench-engine", -1);
    bench_t b = {.o = &o};
    for (int i = 0; i < o.n_levels; i++)
        b.max_b = o.batch[i] > b.max_b ? o.batch[i] : b.max_b;
    /* Context: the prompt, the timed, warm-up and profiled steps, and --mixed's prompt. */
    const int steps_ctx = o.prompt_len + WARMUP_STEPS + o.steps + 16;
    b.ctx = steps_ctx > o.mixed ? steps_ctx : o.mixed;
    b.chunk = o.chunk < o.prompt_len ? o.chunk : o.prompt_len;
    b.rows_per_prefill = o.prompt_len <= o.chunk ? o.chunk / o.prompt_len : 1;
    b.rows_per_prefill = b.rows_per_prefill < b.max_b ? b.rows_per_prefill : b.max_b;
    b.seqs = calloc((size_t)b.max_b + 2, sizeof *b.seqs);
    b.ms = calloc((size_t)b.max_b + 1, sizeof *b.ms);
    b.ids = malloc((size_t)o.prompt_len * sizeof *b.ids);
    b.out = calloc((size_t)b.max_b + 1, sizeof *b.out);
    b.step_ms = malloc((size_t)o.steps * sizeof *b.step_ms);
    b.step_bytes = calloc((size_t)o.steps, sizeof *b.step_bytes);
    b.step_kv = calloc((size_t)o.steps, sizeof *b.step_kv);
    b.step_used = calloc((size_t)o.steps, sizeof *b.step_used);
    b.step_busiest = calloc((size_t)o.steps, sizeof *b.step_busiest);
    b.root = json_object();
    b.levels = json_array();
    if (!b.seqs || !b.ms || !b.ids || !b.out || !b.step_ms || !b.step_bytes || !b.step_kv || !b.step_used ||
        !b.step_busiest || !b.root || !b.levels)
        rc = s_fail("out of memory");
    else
        rc = s_run(&b);
    for (int s = 0; b.seqs && s <= b.max_b + 1; s++)
        kvseq_destroy(&b.seqs[s]);
    engine_destroy(&b.e);
    json_decref(b.levels);
    json_decref(b.root);
    free(b.seqs);
    free(b.ms);
    free(b.ids);
    free(b.out);
    free(b.step_ms);
    free(b.step_bytes);
    free(b.step_kv);
    free(b.step_used);
    free(b.step_busiest);
    free(b.cnt);
    free(b.used);
    return rc < 0 ? 1 : 0;
}
