/* tools/generate.c — troupe-generate: one process, one request, the whole engine path.
 *
 *   troupe-generate MODEL_DIR [--prompt TEXT | --chat TEXT [--system TEXT] | --ids 1,2,3] [options]
 *
 * The single-process reference the cluster is checked against: opens the model as the workers do
 * (engine/engine_open.h: the config, the weights or dummy weights of the config's shape, the KV
 * dtype rule), tokenizes, prefills the prompt in chunks through model_forward, then decodes token
 * by token with the sampler, streaming complete UTF-8 text to stdout as it comes (or, with --json,
 * printing one JSON object at the end with ids, text, counts, finish reason, timings and optional
 * log-probabilities).
 *
 * Speculative decoding (engine/spec.h) with --speculation ngram[:K] or draft[:K] (--draft DIR: a
 * smaller checkpoint with the same tokenizer; --draft alone means draft:4) or mtp[:K] (a DeepSeek-V3
 * checkpoint's own MTP layer, engine/mtp.h: greedy drafts from the target's hidden states): each decode step
 * verifies the proposer's drafts in one forward over the last token and K drafts, emitting 1 to
 * K + 1 tokens, the same tokens as without speculation when greedy (sampled: the same law). --json
 * then reports the acceptance rate and tokens per verify step.
 *
 * Exit status: 0 on success, 2 on a usage error, 1 on any other error (always with a message on
 * stderr naming what was wrong). */
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/chat_template.h"
#include "engine/engine_open.h"
#include "engine/sampler.h"
#include "engine/mtp.h"
#include "engine/spec.h"
#include "engine/tokenizer.h"
#include "tools/lib/args.h"

#define KV_BLOCK 16

static const char *s_usage =
    "usage: troupe-generate MODEL_DIR [--prompt TEXT | --chat TEXT [--system TEXT] | --ids 1,2,3]\n"
    "         [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n"
    "         [--repetition-penalty R] [--presence-penalty X] [--frequency-penalty X] [--seed S]\n"
    "         [--stop STR]... [--stop-id ID]... [--ignore-eos] [--dtype f32|bf16|f16]\n"
    "         [--kv-dtype auto|f32|bf16|f16|fp8] [--kv-scales auto|checkpoint|calibrate|one]\n"
    "         [--load-format auto|dummy] [--tokenizer DIR]\n"
    "         [--threads N] [--chunk N] [--speculation off|ngram[:K]|draft[:K]|mtp[:K]] [--draft DIR]\n"
    "         [--backend cpu|cuda|cuda:N]\n"
    "         [--json] [--logprobs] [--logprobs-mode raw|processed] [--no-think] [-v]\n"
    "Sampling options left out take the model's generation_config.json defaults (greedy when it\n"
    "has none). --dtype sets the dummy weights' dtype (default: the config's). --kv-dtype sets the\n"
    "KV cache's: auto (default) keeps it in the weights' dtype; fp8 is E4M3 with a scale per layer,\n"
    "K or V and kv head, which --kv-scales takes from the checkpoint, calibrates at load, or sets\n"
    "to 1 (auto, the default: the checkpoint's when it has them, else calibrated).\n";

typedef struct gen_opts {
    const char *model_dir, *prompt, *chat, *system, *ids, *tokenizer_dir;
    int max_tokens;               /* -1: not given */
    int have_temperature, have_top_k, have_top_p, have_min_p, have_rep;
    sampler_params_t sp;
    int have_seed;
    const char *dtype;            /* NULL: config */
    dtype_t kv_dtype;             /* DT_COUNT: auto (the weights' dtype) */
    int kv_scales;                /* --kv-scales: KV_SCALES_* (engine/kvscale.h), 0 auto */
    const char *backend;          /* backend_new kind: cpu (default), cuda, cuda:N */
    int dummy;                    /* --load-format dummy */
    int threads, chunk, json, logprobs, no_think, verbose;
    const char *speculation;      /* --speculation: the knob's text (spec_knob_parse) */
    const char *draft_dir;        /* --draft: the draft model */
    spec_method_t spec;           /* parsed */
    int mtp;                      /* --speculation mtp[:K]: the model's MTP layer proposes (spec ngram's machinery) */
    int spec_k;
} gen_opts_t;

static int s_usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "troupe-generate: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", s_usage);
    return 2;
}

static int s_parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    return arg_int("troupe-generate", opt, s, (int)lo, (int)hi, out);
}

/* Any finite number: the sampler's checks give the ranges (sampler_params_check). */
static int s_parse_double(const char *opt, const char *s, double *out)
{
    return arg_double("troupe-generate", opt, s, -DBL_MAX, DBL_MAX, out);
}

static int s_parse_args(int argc, char **argv, gen_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    sampler_params_default(&o->sp);
    o->max_tokens = -1;
    o->chunk = 512;
    o->kv_dtype = DT_COUNT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (o->model_dir)
                return s_usage_error("unexpected argument '%s' (one MODEL_DIR only)", a);
            o->model_dir = a;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(s_usage, stdout);
            exit(0);
        }
        /* Flags without a value. */
        if (!strcmp(a, "--ignore-eos")) { o->sp.ignore_eos = 1; continue; }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--logprobs")) { o->logprobs = 1; continue; }
        if (!strcmp(a, "--no-think")) { o->no_think = 1; continue; }
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { o->verbose = 1; continue; }
        if (i + 1 >= argc)
            return s_usage_error("%s needs a value", a);
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--chat")) o->chat = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--ids")) o->ids = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer_dir = v;
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--speculation")) o->speculation = v;
        else if (!strcmp(a, "--draft")) o->draft_dir = v;
        else if (!strcmp(a, "--max-tokens")) rc = s_parse_int(a, v, 1, INT_MAX / 2, &o->max_tokens);
        else if (!strcmp(a, "--temperature")) { rc = s_parse_double(a, v, &o->sp.temperature); o->have_temperature = 1; }
        else if (!strcmp(a, "--top-k")) { rc = s_parse_int(a, v, -1, INT_MAX, &o->sp.top_k); o->have_top_k = 1; }
        else if (!strcmp(a, "--top-p")) { rc = s_parse_double(a, v, &o->sp.top_p); o->have_top_p = 1; }
        else if (!strcmp(a, "--min-p")) { rc = s_parse_double(a, v, &o->sp.min_p); o->have_min_p = 1; }
        else if (!strcmp(a, "--repetition-penalty")) { rc = s_parse_double(a, v, &o->sp.repetition_penalty); o->have_rep = 1; }
        else if (!strcmp(a, "--presence-penalty")) rc = s_parse_double(a, v, &o->sp.presence_penalty);
        else if (!strcmp(a, "--frequency-penalty")) rc = s_parse_double(a, v, &o->sp.frequency_penalty);
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->sp.seed = strtoull(v, &end, 10);
            if (!*v || *end || errno || v[0] == '-')
                return s_usage_error("--seed '%s': expected a non-negative integer", v);
            o->have_seed = 1;
        } else if (!strcmp(a, "--stop")) {
            if (o->sp.n_stops == SAMPLER_MAX_STOPS)
                return s_usage_error("too many --stop strings (at most 8; '%s')", v);
            o->sp.stops[o->sp.n_stops++] = v;
        } else if (!strcmp(a, "--stop-id")) {
            if (o->sp.n_stop_ids == SAMPLER_MAX_STOP_IDS)
                return s_usage_error("too many --stop-id values (at most 16; '%s')", v);
            rc = s_parse_int(a, v, 0, INT_MAX, &o->sp.stop_ids[o->sp.n_stop_ids++]);
        } else if (!strcmp(a, "--dtype")) {
            dtype_t t;
            if (dtype_parse(v, &t) < 0)
                return s_usage_error("--dtype '%s': expected f32, bf16 or f16", v);
            o->dtype = v;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (arg_kv_dtype("troupe-generate", a, v, &o->kv_dtype) < 0) {
                fprintf(stderr, "\n%s", s_usage);
                return 2;
            }
        } else if (!strcmp(a, "--kv-scales")) {
            if (arg_kv_scales("troupe-generate", a, v, &o->kv_scales) < 0) {
                fprintf(stderr, "\n%s", s_usage);
                return 2;
            }
        } else if (!strcmp(a, "--load-format")) {
            if (!strcmp(v, "dummy")) o->dummy = 1;
            else if (!strcmp(v, "auto")) o->dummy = 0;
            else return s_usage_error("--load-format '%s': expected auto or dummy", v);
        } else if (!strcmp(a, "--logprobs-mode")) {
            if (!strcmp(v, "raw")) o->sp.logprobs_mode = SAMPLER_LOGPROBS_RAW;
            else if (!strcmp(v, "processed")) o->sp.logprobs_mode = SAMPLER_LOGPROBS_PROCESSED;
            else return s_usage_error("--logprobs-mode '%s': expected raw or processed", v);
        } else if (!strcmp(a, "--threads")) rc = s_parse_int(a, v, 1, 4096, &o->threads);
        else if (!strcmp(a, "--chunk")) rc = s_parse_int(a, v, 1, 1 << 20, &o->chunk);
        else return s_usage_error("unknown option '%s'", a);
        if (rc < 0)
            return 2;
    }
    if (!o->model_dir)
        return s_usage_error("%s", "MODEL_DIR is required");
    int sources = !!o->prompt + !!o->chat + !!o->ids;
    if (sources != 1)
        return s_usage_error("%s", "give exactly one of --prompt, --chat, --ids");
    if (o->system && !o->chat)
        return s_usage_error("%s", "--system goes with --chat");
    char err[256], knob[32];
    const char *sv = o->speculation ? o->speculation : o->draft_dir ? "draft" : NULL;
    if (sv && strncmp(sv, "mtp", 3) == 0 && (sv[3] == 0 || sv[3] == ':') && strlen(sv) < sizeof knob - 2) {
        o->mtp = 1;               /* DeepSeek-V3's MTP layer drafts (engine/mtp.h); k parsed as ngram's */
        snprintf(knob, sizeof knob, "ngram%s", sv + 3);
        sv = knob;
    }
    if (spec_knob_parse("--speculation", sv, &o->spec, &o->spec_k, err, sizeof err) != 0)
        return s_usage_error("%s", err);
    if (o->spec == SPEC_DRAFT && !o->draft_dir)
        return s_usage_error("%s", "--speculation draft needs --draft DIR (the draft model)");
    if (o->draft_dir && o->spec != SPEC_DRAFT)
        return s_usage_error("--draft goes with --speculation draft[:K] (not '%s')", o->speculation);
    return 0;
}

/* "1,2,3" -> ids (malloc'd). */
static int s_parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof(int32_t));
    const char *p = s;
    while (v) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "troupe-generate: --ids '%s': expected comma-separated non-negative integers (at '%s')\n", s, p);
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *w = realloc(v, (cap *= 2) * sizeof(int32_t));
            if (!w)
                break;
            v = w;
        }
        v[k++] = (int32_t)x;
        if (!*end)
            break;
        p = end + 1;
    }
    if (!v)
        return -1;
    *ids = v;
    *n = k;
    return 0;
}

static int s_exists(const char *dir, const char *file)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return stat(path, &st) == 0;
}

/* ---- output ------------------------------------------------------------------------------ */

typedef struct out_ctx {
    int json;
    char *text;                   /* --json: the generated text, capacity cap */
    size_t n, cap;
} out_ctx_t;

static void s_emit(void *ctx, const char *t, size_t n)
{
    out_ctx_t *o = ctx;
    if (!o->json) {
        fwrite(t, 1, n, stdout);
        fflush(stdout);
        return;
    }
    if (o->n + n + 1 > o->cap) {                   /* rare: sized for the common case up front */
        size_t cap = (o->n + n + 1) * 2;
        char *p = realloc(o->text, cap);
        if (!p)
            return;
        o->text = p;
        o->cap = cap;
    }
    memcpy(o->text + o->n, t, n);
    o->n += n;
    o->text[o->n] = 0;
}

/* ---- the run ----------------------------------------------------------------------------- */

/* One request through the engine. Functions return 0 to go on, else the exit status. */
typedef struct gen {
    engine_t *e;                  /* config, then (s_load) weights and pool */
    tokenizer_t *tok;             /* NULL: ids in, ids out */
    const char *tok_dir;
    int32_t *prompt;              /* [n_prompt] */
    size_t n_prompt;
    char *rendered;               /* --chat: the prompt through the chat template */
    sampler_params_t sp;
    sampler_t *smp;
    int max_tokens;
    kvseq_t *seq;
    int32_t *out_ids;             /* [max_tokens] */
    float *lps;                   /* [max_tokens] log-probabilities */
    char *tbuf;                   /* [tcap] detokenised text of one token */
    size_t tcap;
    out_ctx_t out;
    finish_reason_t fin;
    int n_out, n_decode_steps;
    int64_t t_start, t_loaded, t_prefilled, t_end;
    /* speculation */
    spec_proposer_t *prop;        /* --speculation draft: the draft model; mtp: the MTP layer; NULL for n-gram */
    float *hid;                   /* --speculation mtp: [step rows][hidden] the target's hidden states */
    int hid_pos, hid_n;           /* the last forward's rows not yet fed to the MTP proposer */
    int32_t *all;                 /* [n_prompt + max_tokens] prompt, then the output: what proposers read */
    spec_stats_t spec;
    int64_t draft_load_ns;
} gen_t;

static int s_fail(int status, const char *what, const char *err)
{
    fprintf(stderr, "troupe-generate: %s%s%s\n", what ? what : "", what ? ": " : "", err);
    return status;
}

/* --tokenizer DIR, else MODEL_DIR when it has one; needed for text in and out. */
static int s_tokenizer(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    g->tok_dir = o->tokenizer_dir ? o->tokenizer_dir : s_exists(o->model_dir, "tokenizer.json") ? o->model_dir : NULL;
    if (g->tok_dir && !(g->tok = tok_load(g->tok_dir, err, sizeof err)))
        return s_fail(1, NULL, err);
    if (!g->tok && (o->prompt || o->chat)) {
        fprintf(stderr, "troupe-generate: %s has no tokenizer.json: give token ids with --ids, or a tokenizer with "
                        "--tokenizer DIR\n", o->model_dir);
        return 2;
    }
    if (!g->tok && o->sp.n_stops)
        return s_fail(2, NULL, "--stop strings need a tokenizer (--tokenizer DIR)");
    return 0;
}

/* The prompt's ids: --ids, or the text (--chat: through the family's chat template) encoded. */
static int s_prompt(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    if (o->ids) {
        if (s_parse_ids(o->ids, &g->prompt, &g->n_prompt) < 0)
            return 2;
    } else {
        const char *text = o->prompt;
        int add_special = 1;
        if (o->chat) {
            chat_msg_t msgs[2];
            size_t nm = 0;
            if (o->system)
                msgs[nm++] = (chat_msg_t){"system", o->system};
            msgs[nm++] = (chat_msg_t){"user", o->chat};
            if (chat_render(chat_family_detect(g->tok_dir), msgs, nm, 1, !o->no_think, &g->rendered, err, sizeof err) < 0) {
                fprintf(stderr, "troupe-generate: --chat with the tokenizer in %s: %s\n", g->tok_dir, err);
                return 1;
            }
            text = g->rendered;
            add_special = 0;                       /* the template carries BOS itself, as apply_chat_template */
        }
        if (tok_encode(g->tok, text, strlen(text), add_special, &g->prompt, &g->n_prompt) < 0)
            return s_fail(1, NULL, "the prompt is not valid UTF-8");
    }
    if (g->n_prompt == 0)
        return s_fail(2, NULL, "the prompt is empty");
    const int vocab = g->e->cfg.vocab_size;
    for (size_t i = 0; i < g->n_prompt; i++)
        if (g->prompt[i] < 0 || g->prompt[i] >= vocab) {
            fprintf(stderr, "troupe-generate: prompt token %d (at %zu) is outside the vocabulary [0, %d)\n",
                    g->prompt[i], i, vocab);
            return 2;
        }
    return 0;
}

/* Sampling: the command line over generation_config.json's defaults; max tokens within the context. */
static int s_sampling(const gen_opts_t *o, gen_t *g)
{
    const model_config_t *cfg = &g->e->cfg;
    sampler_params_t *sp = &g->sp;
    *sp = o->sp;
    if (!o->have_temperature)
        sp->temperature = cfg->gen.do_sample ? cfg->gen.temperature : 0.0;
    if (!o->have_top_k && cfg->gen.do_sample)
        sp->top_k = cfg->gen.top_k;
    if (!o->have_top_p && cfg->gen.do_sample)
        sp->top_p = cfg->gen.top_p;
    if (!o->have_min_p && cfg->gen.do_sample)
        sp->min_p = cfg->gen.min_p;
    if (!o->have_rep)
        sp->repetition_penalty = cfg->gen.repetition_penalty > 0 ? cfg->gen.repetition_penalty : 1.0;
    if (!o->have_seed)
        sp->seed = (uint64_t)now_ns();
    int max_tokens = o->max_tokens > 0 ? o->max_tokens : cfg->gen.max_new_tokens > 0 ? cfg->gen.max_new_tokens : 256;
    const int ctx = cfg->max_position_embeddings > 0 ? cfg->max_position_embeddings : 1 << 20;
    if ((long)g->n_prompt >= ctx) {
        fprintf(stderr, "troupe-generate: the prompt has %zu tokens; the model's context is %d\n", g->n_prompt, ctx);
        return 2;
    }
    if ((long)g->n_prompt + max_tokens > ctx) {
        LOG_W("max tokens %d cut to %ld to stay within the context of %d", max_tokens, ctx - (long)g->n_prompt, ctx);
        max_tokens = ctx - (int)g->n_prompt;
    }
    g->max_tokens = sp->max_tokens = max_tokens;
    sp->n_eos = cfg->n_eos < SAMPLER_MAX_EOS ? cfg->n_eos : SAMPLER_MAX_EOS;
    memcpy(sp->eos_ids, cfg->eos_token_ids, (size_t)sp->n_eos * sizeof(int32_t));
    if (sp->n_eos == 0 && g->tok && tok_eos_id(g->tok) >= 0)
        sp->eos_ids[sp->n_eos++] = tok_eos_id(g->tok);
    char err[1024];
    if (!(g->smp = sampler_new(sp, cfg->vocab_size, g->prompt, (int)g->n_prompt, err, sizeof err)))
        return s_fail(2, NULL, err);
    return 0;
}

/* Backend, KV dtype, weights and a pool for this one sequence (engine_load), and the buffers. */
static int s_load(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    const int total = (int)g->n_prompt + g->max_tokens;
    engine_spec_t s;
    engine_spec_default(&s);
    s.backend = o->backend;
    s.threads = o->threads;
    s.dummy = o->dummy;
    if (o->dtype)
        dtype_parse(o->dtype, &s.dtype);
    s.kv_dtype = o->kv_dtype;
    s.kv_dtype_option = "--kv-dtype";
    s.kv_scales = o->kv_scales;
    s.kv_scales_option = "--kv-scales";
    s.dummy_option = "--load-format dummy";
    int step_tokens = o->chunk < (int)g->n_prompt ? o->chunk : (int)g->n_prompt;
    if (o->spec != SPEC_OFF && step_tokens < 1 + o->spec_k)
        step_tokens = 1 + o->spec_k;                  /* a verify step: the last token and K drafts */
    s.model = (model_opts_t){.max_tokens = step_tokens, .max_seqs = 1, .max_context = total, .kv_block_size = KV_BLOCK,
                             .max_logit_rows = o->spec != SPEC_OFF ? 1 + o->spec_k : 0};
    s.kv_blocks = (total + KV_BLOCK - 1) / KV_BLOCK;
    if (engine_load(g->e, &s, err, sizeof err) != ENGINE_OK)
        return s_fail(1, NULL, err);
    g->seq = kvseq_new(g->e->pool, total, 0);
    if (o->spec == SPEC_DRAFT) {
        const int64_t t0 = now_ns();
        spec_draft_opts_t d = {.model_dir = o->draft_dir, .target = g->e, .target_tokenizer = g->tok_dir, .max_seqs = 1,
                               .max_tokens = o->chunk, .max_model_len = total, .block_size = KV_BLOCK, .dummy = o->dummy};
        if (!(g->prop = spec_draft_new(&d, NULL, err, sizeof err)))
            return s_fail(1, NULL, err);
        g->draft_load_ns = now_ns() - t0;
    }
    if (o->mtp) {
        if (!(g->prop = spec_mtp_new(g->e->model, 1, total, err, sizeof err)))
            return s_fail(1, NULL, err);
        if (!(g->hid = malloc((size_t)step_tokens * g->e->cfg.hidden_size * sizeof(float))))
            return s_fail(1, NULL, "out of memory");
    }
    if (o->spec != SPEC_OFF && (g->all = malloc((size_t)total * sizeof *g->all)))
        memcpy(g->all, g->prompt, g->n_prompt * sizeof *g->all);
    if (o->spec != SPEC_OFF && !g->all)
        return s_fail(1, NULL, "out of memory");
    g->out_ids = malloc((size_t)g->max_tokens * sizeof(int32_t));
    g->lps = malloc((size_t)g->max_tokens * sizeof(float));
    g->tcap = g->tok ? 3 * tok_max_token_bytes(g->tok) + 16 : 64;
    g->tbuf = malloc(g->tcap);
    g->out = (out_ctx_t){.json = o->json, .cap = o->json ? (size_t)g->max_tokens * 8 + 64 : 0};
    g->out.text = o->json ? calloc(1, g->out.cap) : NULL;
    if (!g->seq || !g->out_ids || !g->lps || !g->tbuf || (o->json && !g->out.text))
        return s_fail(1, NULL, "out of memory");
    return 0;
}

/* The prompt in chunks of --chunk tokens, each one model_forward. */
static int s_prefill(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    for (size_t at = 0; at < g->n_prompt; at += (size_t)o->chunk) {
        int k = (int)(g->n_prompt - at < (size_t)o->chunk ? g->n_prompt - at : (size_t)o->chunk);
        model_seq_t q = {.kv = g->seq, .n_new = k};
        model_batch_t b = {.n_seqs = 1, .seqs = &q, .hidden_out = g->hid};
        if (kvseq_append(g->seq, g->prompt + at, k) < 0 || model_forward(g->e->model, &b, g->e->logits, err, sizeof err) < 0)
            return s_fail(1, "prefill", err);
        if (g->hid && spec_mtp_feed(g->prop, 1, g->prompt, (int)g->n_prompt, (int)at, k, g->hid, err, sizeof err) < 0)
            return s_fail(1, "mtp", err);
    }
    return 0;
}

/* Streams token t's text (or, without a tokenizer and not --json, its id); 1 when a stop string
 * completed. */
static int s_stream(gen_t *g, tok_stream_t *ts, int32_t t)
{
    if (g->tok) {
        size_t nt = 0;
        return tok_stream_feed(ts, t, g->tbuf, g->tcap, &nt) == 0 && nt && sampler_text(g->smp, g->tbuf, nt, s_emit, &g->out);
    }
    if (!g->out.json) {
        int nt = snprintf(g->tbuf, g->tcap, "%s%d", g->n_out > 1 ? " " : "", t);
        s_emit(&g->out, g->tbuf, (size_t)nt);
    }
    return 0;
}

/* Records token t (log-probability lp): the output, the sampler's counters, the stream. 1 when
 * the request finished with it. */
static int s_take(gen_t *g, tok_stream_t *ts, int32_t t, float lp)
{
    if (g->all)
        g->all[g->n_prompt + (size_t)g->n_out] = t;
    g->out_ids[g->n_out] = t;
    g->lps[g->n_out++] = lp;
    g->fin = sampler_accept(g->smp, t);
    if (g->fin != FINISH_STOP && s_stream(g, ts, t))   /* EOS or a stop id is not printed */
        g->fin = FINISH_STOP;
    return g->fin != FINISH_NONE;
}

/* Up to K drafts after the output so far; 0: decode the plain way. q rows (spec_dist) when the
 * draft model sampled them. */
static int s_drafts(const gen_opts_t *o, gen_t *g, int32_t *drafts, const float **q)
{
    int k = o->spec_k < g->max_tokens - g->n_out ? o->spec_k : g->max_tokens - g->n_out;   /* the KV's room */
    const int n = (int)g->n_prompt + g->n_out;
    for (int i = 0; i < k; i++)
        q[i] = NULL;
    if (k <= 0)
        return 0;
    if (!g->prop)
        return spec_ngram_propose(g->all, n, 1, 3, k, drafts);
    bk_sample_t sp;
    sampler_device_params(g->smp, &sp);
    spec_ask_t a = {.id = 1, .tokens = g->all, .n = n, .k = k, .sample = sp.temperature > 0 ? &sp : NULL,
                    .drafts = drafts};
    spec_propose_batch(g->prop, &a, 1);
    for (int i = 0; i < a.n_drafts; i++)
        q[i] = spec_dist(g->prop, 1, i);
    return a.n_drafts;
}

/* Sample, stream, stop or run the next step. Greedy without log-probabilities: decode steps bring
 * back the device's argmax, not logits. With speculation, a step that has drafts verifies them:
 * one forward over the last token and the drafts, every position's logits, the target's token at
 * each position in order (sampler_verify_draft, or sampler_verify_dist for a draft distribution)
 * until one disagrees or the request ends; the KV of the rejected drafts is rolled back. */
static int s_decode(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    tok_stream_t ts;
    if (g->tok) {
        tok_stream_init(&ts, g->tok);
        ts.skip_special = 1;                       /* as vLLM's skip_special_tokens default */
    }
    const int device_greedy = sampler_is_greedy(g->smp) && !o->logprobs;
    const size_t V = (size_t)g->e->cfg.vocab_size;
    int32_t dev_tok = 0, drafts[SPEC_MAX_K];
    const float *q[SPEC_MAX_K];
    g->fin = FINISH_NONE;
    float lp = 0;
    int32_t t = sampler_sample(g->smp, g->e->logits, o->logprobs ? &lp : NULL);
    while (!s_take(g, &ts, t, lp)) {
        if (g->hid && g->hid_n > 0 &&               /* the last step's rows whose tokens are final */
            spec_mtp_feed(g->prop, 1, g->all, (int)g->n_prompt + g->n_out, g->hid_pos, g->hid_n, g->hid, err,
                          sizeof err) < 0)
            return s_fail(1, "mtp", err);
        const int r = o->spec != SPEC_OFF ? s_drafts(o, g, drafts, q) : 0;
        const int base = kvseq_len(g->seq);
        model_seq_t qs = {.kv = g->seq, .n_new = 1 + r};
        model_batch_t b = {.n_seqs = 1, .seqs = &qs, .argmax_out = device_greedy && !r ? &dev_tok : NULL,
                           .all_logits = r > 0, .hidden_out = g->hid};
        g->hid_pos = base;
        g->hid_n = 1;
        if (kvseq_append(g->seq, &t, 1) < 0 || (r && kvseq_append(g->seq, drafts, r) < 0) ||
            model_forward(g->e->model, &b, g->e->logits, err, sizeof err) < 0) {
            fprintf(stderr, "troupe-generate: decode step %d: %s\n", g->n_out, err);
            return 1;
        }
        g->n_decode_steps++;
        if (!r) {
            lp = 0;
            t = device_greedy ? dev_tok : sampler_sample(g->smp, g->e->logits, o->logprobs ? &lp : NULL);
            continue;
        }
        /* Verify: position j's logits check draft j; the last position (j == r) has no draft. */
        int j = 0, acc = 0;
        for (;; j++) {
            lp = 0;
            t = sampler_verify_dist(g->smp, g->e->logits + (size_t)j * V, j < r ? drafts[j] : -1, j < r ? q[j] : NULL,
                                    o->logprobs ? &lp : NULL, &acc);
            if (!acc || j == r)
                break;
            if (s_take(g, &ts, t, lp))
                break;                             /* finished on an accepted draft */
        }
        g->spec.verify_steps++;
        g->spec.drafts += (uint64_t)r;
        g->spec.accepted += (uint64_t)j;
        g->spec.emitted += (uint64_t)(j + (g->fin == FINISH_NONE));
        g->hid_n = 1 + j;                         /* the input row and the accepted drafts' rows */
        if (g->prop)
            spec_accepted(g->prop, 1, j);
        /* The KV keeps the step's input and the accepted drafts; t (the target's own token, not
         * yet taken) is the next step's input. */
        if (kvseq_truncate(g->seq, base + 1 + j) != 0)
            return s_fail(1, "speculation", "cannot roll the KV back");
        if (g->fin != FINISH_NONE)
            break;
    }
    if (g->tok) {
        size_t nt = 0;
        if (tok_stream_flush(&ts, g->tbuf, g->tcap, &nt) == 0 && nt)
            sampler_text(g->smp, g->tbuf, nt, s_emit, &g->out);
        sampler_text_flush(g->smp, s_emit, &g->out);
    }
    return 0;
}

/* ---- the report -------------------------------------------------------------------------- */

static double s_ms(int64_t t0, int64_t t1) { return (double)(t1 - t0) / 1e6; }

static const char *s_lp_mode(const gen_t *g) { return g->sp.logprobs_mode == SAMPLER_LOGPROBS_RAW ? "raw" : "processed"; }

/* --json: one object with the ids, text, counts, finish reason, timings and the model's facts. */
static void s_report_json(const gen_opts_t *o, const gen_t *g)
{
    const double prefill_ms = s_ms(g->t_loaded, g->t_prefilled), decode_ms = s_ms(g->t_prefilled, g->t_end);
    json_t *j = json_object(), *ids = json_array(), *tm = json_object(), *md = json_object();
    for (int i = 0; i < g->n_out; i++)
        json_array_append_new(ids, json_integer(g->out_ids[i]));
    json_object_set_new(j, "ids", ids);
    json_object_set_new(j, "text", g->tok ? json_stringn(g->out.text ? g->out.text : "", g->out.n) : json_null());
    json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)g->n_prompt));
    json_object_set_new(j, "completion_tokens", json_integer(g->n_out));
    json_object_set_new(j, "finish_reason", json_string(finish_reason_name(g->fin)));
    json_object_set_new(tm, "load_ms", json_real(s_ms(g->t_start, g->t_loaded)));
    json_object_set_new(tm, "prefill_ms", json_real(prefill_ms));
    json_object_set_new(tm, "prompt_tokens_per_s", json_real(g->n_prompt / (prefill_ms / 1e3)));
    json_object_set_new(tm, "decode_ms", json_real(decode_ms));
    json_object_set_new(tm, "decode_steps", json_integer(g->n_decode_steps));
    json_object_set_new(tm, "decode_tokens_per_s", json_real(g->n_out > 1 ? (g->n_out - 1) / (decode_ms / 1e3) : 0));
    json_object_set_new(j, "timings", tm);
    if (o->spec != SPEC_OFF) {
        json_t *sp = json_object();
        json_object_set_new(sp, "method", json_string(o->mtp ? "mtp" : spec_method_name(o->spec)));
        json_object_set_new(sp, "k", json_integer(o->spec_k));
        json_object_set_new(sp, "verify_steps", json_integer((json_int_t)g->spec.verify_steps));
        json_object_set_new(sp, "drafts", json_integer((json_int_t)g->spec.drafts));
        json_object_set_new(sp, "accepted", json_integer((json_int_t)g->spec.accepted));
        json_object_set_new(sp, "acceptance_rate", json_real(spec_stats_acceptance(&g->spec)));
        json_object_set_new(sp, "mean_accepted_length", json_real(spec_stats_mean_len(&g->spec)));
        if (g->prop && !o->mtp) {
            spec_draft_stats_t ds;
            spec_draft_stats(g->prop, &ds);
            json_object_set_new(sp, "draft_load_ms", json_real((double)g->draft_load_ns / 1e6));
            json_object_set_new(sp, "draft_forwards", json_integer((json_int_t)ds.forwards));
            json_object_set_new(sp, "draft_ms", json_real((double)ds.ns / 1e6));
        }
        json_object_set_new(j, "speculation", sp);
    }
    json_object_set_new(md, "arch", json_string(config_arch_name(g->e->cfg.arch)));
    json_object_set_new(md, "weights_dtype", json_string(dtype_name(g->e->weights_dtype)));
    json_object_set_new(md, "kv_dtype", json_string(dtype_name(g->e->kv_dtype)));
    json_object_set_new(md, "weight_bytes_per_token", json_integer((json_int_t)model_active_weight_bytes(g->e->model)));
    json_object_set_new(md, "threads", json_integer(g->e->be->n_threads));
    json_object_set_new(md, "backend", json_string(g->e->be->ops->name));
    json_object_set_new(j, "model", md);
    if (o->logprobs) {
        json_t *l = json_array();
        for (int i = 0; i < g->n_out; i++)
            json_array_append_new(l, json_real(g->lps[i]));
        json_object_set_new(j, "logprobs", l);
        json_object_set_new(j, "logprobs_mode", json_string(s_lp_mode(g)));
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s)
        puts(s);
    free(s);
    json_decref(j);
}

/* Text mode: the streamed text ends with a newline; log-probabilities and timings go to stderr. */
static void s_report_text(const gen_opts_t *o, const gen_t *g)
{
    const double prefill_ms = s_ms(g->t_loaded, g->t_prefilled), decode_ms = s_ms(g->t_prefilled, g->t_end);
    fputc('\n', stdout);
    if (o->logprobs) {
        fprintf(stderr, "logprobs (%s):", s_lp_mode(g));
        for (int i = 0; i < g->n_out; i++)
            fprintf(stderr, " %d:%.4f", g->out_ids[i], g->lps[i]);
        fputc('\n', stderr);
    }
    LOG_I("%zu prompt + %d generated tokens (%s); load %.0f ms, prefill %.0f ms (%.1f tok/s), decode %.1f tok/s",
          g->n_prompt, g->n_out, finish_reason_name(g->fin), s_ms(g->t_start, g->t_loaded), prefill_ms,
          g->n_prompt / (prefill_ms / 1e3), g->n_out > 1 ? (g->n_out - 1) / (decode_ms / 1e3) : 0);
    if (o->spec != SPEC_OFF)
        LOG_I("speculation %s:%d: %llu verify steps, acceptance %.1f%%, %.2f tokens per verify step",
              (o->mtp ? "mtp" : spec_method_name(o->spec)), o->spec_k, (unsigned long long)g->spec.verify_steps,
              100 * spec_stats_acceptance(&g->spec), spec_stats_mean_len(&g->spec));
}

static void s_gen_free(gen_t *g)
{
    free(g->out.text);
    free(g->tbuf);
    free(g->lps);
    free(g->out_ids);
    free(g->rendered);
    free(g->prompt);
    sampler_destroy(&g->smp);
    kvseq_destroy(&g->seq);
    spec_proposer_destroy(&g->prop);              /* before the target, whose backend it runs on */
    free(g->all);
    free(g->hid);
    tok_destroy(&g->tok);
    engine_destroy(&g->e);                         /* after the sequence, which holds pool blocks */
}

/* The whole request: config, tokenizer, prompt and sampling (checked before any weight is read),
 * then the weights, the prefill, the decode loop and the report. */
static int s_run(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    int rc;
    if (!(g->e = engine_new(o->model_dir, err, sizeof err)))
        return s_fail(1, NULL, err);
    if ((rc = s_tokenizer(o, g)) || (rc = s_prompt(o, g)) || (rc = s_sampling(o, g)) || (rc = s_load(o, g)))
        return rc;
    g->t_loaded = now_ns();
    if ((rc = s_prefill(o, g)))
        return rc;
    g->t_prefilled = now_ns();
    if ((rc = s_decode(o, g)))
        return rc;
    g->t_end = now_ns();
    (o->json ? s_report_json : s_report_text)(o, g);
    return 0;
}

int main(int argc, char **argv)
{
    gen_opts_t o;
    int rc = s_parse_args(argc, argv, &o);
    if (rc)
        return rc;
    log_init("generate", -1);
    if (o.verbose)
        log_set_verbose(1);
    gen_t g = {.t_start = now_ns()};
    rc = s_run(&o, &g);
    s_gen_free(&g);
    return rc;
}
