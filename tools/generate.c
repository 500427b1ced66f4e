/* tools/generate.c — troupe-generate: one process, one request, the whole engine path.
 *
 *   troupe-generate MODEL_DIR [--prompt TEXT | --chat TEXT [--system TEXT] | --ids 1,2,3] [options]
 *
 * Loads the config and weights (or dummy weights of the config's shape), tokenizes, prefills the
 * prompt in chunks through model_forward, then decodes token by token with the sampler, streaming
 * complete UTF-8 text to stdout as it comes (or, with --json, printing one JSON object at the end
 * with ids, text, counts, finish reason, timings and optional log-probabilities).
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
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "kernels/backend.h"
#include "tools/lib/args.h"

#define KV_BLOCK 16

static const char *s_usage =
    "usage: troupe-generate MODEL_DIR [--prompt TEXT | --chat TEXT [--system TEXT] | --ids 1,2,3]\n"
    "         [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n"
    "         [--repetition-penalty R] [--presence-penalty X] [--frequency-penalty X] [--seed S]\n"
    "         [--stop STR]... [--stop-id ID]... [--ignore-eos] [--dtype f32|bf16|f16]\n"
    "         [--kv-dtype auto|f32|bf16|f16|fp8] [--load-format auto|dummy] [--tokenizer DIR]\n"
    "         [--threads N] [--chunk N]\n"
    "         [--backend cpu|cuda|cuda:N]\n"
    "         [--json] [--logprobs] [--logprobs-mode raw|processed] [--no-think] [-v]\n"
    "Sampling options left out take the model's generation_config.json defaults (greedy when it\n"
    "has none). --dtype sets the dummy weights' dtype (default: the config's). --kv-dtype sets the\n"
    "KV cache's: auto (default) keeps it in the weights' dtype; fp8 is E4M3 with scale 1.\n";

typedef struct gen_opts {
    const char *model_dir, *prompt, *chat, *system, *ids, *tokenizer_dir;
    int max_tokens;               /* -1: not given */
    int have_temperature, have_top_k, have_top_p, have_min_p, have_rep;
    sampler_params_t sp;
    int have_seed;
    const char *dtype;            /* NULL: config */
    dtype_t kv_dtype;             /* DT_COUNT: auto (the weights' dtype) */
    const char *backend;          /* backend_new kind: cpu (default), cuda, cuda:N */
    int dummy;                    /* --load-format dummy */
    int threads, chunk, json, logprobs, no_think, verbose;
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

static double s_ms(int64_t t0, int64_t t1) { return (double)(t1 - t0) / 1e6; }

int main(int argc, char **argv)
{
    gen_opts_t o;
    int rc = s_parse_args(argc, argv, &o);
    if (rc)
        return rc;
    log_init("generate", -1);
    if (o.verbose)
        log_set_verbose(1);

    char err[1024];
    int status = 1;
    model_config_t cfg;
    backend_t *be = NULL;
    ckpt_t *ck = NULL;
    model_t *m = NULL;
    tokenizer_t *tok = NULL;
    kvpool_t *pool = NULL;
    kvseq_t *seq = NULL;
    sampler_t *smp = NULL;
    int32_t *prompt = NULL, *out_ids = NULL;
    float *logits = NULL, *lps = NULL;
    char *rendered = NULL, *tbuf = NULL;
    out_ctx_t out = {.json = o.json};
    size_t n_prompt = 0;

    const int64_t t_start = now_ns();
    if (config_load(o.model_dir, &cfg, err, sizeof err) < 0) {
        fprintf(stderr, "troupe-generate: %s\n", err);
        goto done;
    }
    dtype_t wdt = cfg.dtype;
    if (o.dtype)
        dtype_parse(o.dtype, &wdt);

    /* Tokenizer: --tokenizer DIR, else MODEL_DIR when it has one; needed for text in and out. */
    const char *tok_dir = o.tokenizer_dir ? o.tokenizer_dir : (s_exists(o.model_dir, "tokenizer.json") ? o.model_dir : NULL);
    if (tok_dir && !(tok = tok_load(tok_dir, err, sizeof err))) {
        fprintf(stderr, "troupe-generate: %s\n", err);
        goto done;
    }
    if (!tok && (o.prompt || o.chat)) {
        fprintf(stderr, "troupe-generate: %s has no tokenizer.json: give token ids with --ids, or a tokenizer with "
                        "--tokenizer DIR\n", o.model_dir);
        status = 2;
        goto done;
    }
    if (!tok && o.sp.n_stops) {
        fprintf(stderr, "troupe-generate: --stop strings need a tokenizer (--tokenizer DIR)\n");
        status = 2;
        goto done;
    }

    /* Prompt ids. */
    if (o.ids) {
        if (s_parse_ids(o.ids, &prompt, &n_prompt) < 0) {
            status = 2;
            goto done;
        }
    } else {
        const char *text = o.prompt;
        int add_special = 1;
        if (o.chat) {
            chat_family_t fam = chat_family_detect(tok_dir);
            chat_msg_t msgs[2];
            size_t nm = 0;
            if (o.system)
                msgs[nm++] = (chat_msg_t){"system", o.system};
            msgs[nm++] = (chat_msg_t){"user", o.chat};
            if (chat_render(fam, msgs, nm, 1, !o.no_think, &rendered, err, sizeof err) < 0) {
                fprintf(stderr, "troupe-generate: --chat with the tokenizer in %s: %s\n", tok_dir, err);
                goto done;
            }
            text = rendered;
            add_special = 0;                       /* the template carries BOS itself, as apply_chat_template */
        }
        if (tok_encode(tok, text, strlen(text), add_special, &prompt, &n_prompt) < 0) {
            fprintf(stderr, "troupe-generate: the prompt is not valid UTF-8\n");
            goto done;
        }
    }
    if (n_prompt == 0) {
        fprintf(stderr, "troupe-generate: the prompt is empty\n");
        status = 2;
        goto done;
    }
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size) {
            fprintf(stderr, "troupe-generate: prompt token %d (at %zu) is outside the vocabulary [0, %d)\n", prompt[i], i,
                    cfg.vocab_size);
            status = 2;
            goto done;
        }

    /* Sampling: the command line over generation_config.json's defaults. */
    sampler_params_t sp = o.sp;
    if (!o.have_temperature)
        sp.temperature = cfg.gen.do_sample ? cfg.gen.temperature : 0.0;
    if (!o.have_top_k && cfg.gen.do_sample)
        sp.top_k = cfg.gen.top_k;
    if (!o.have_top_p && cfg.gen.do_sample)
        sp.top_p = cfg.gen.top_p;
    if (!o.have_min_p && cfg.gen.do_sample)
        sp.min_p = cfg.gen.min_p;
    if (!o.have_rep)
        sp.repetition_penalty = cfg.gen.repetition_penalty > 0 ? cfg.gen.repetition_penalty : 1.0;
    if (!o.have_seed)
        sp.seed = (uint64_t)now_ns();
    int max_tokens = o.max_tokens > 0 ? o.max_tokens : cfg.gen.max_new_tokens > 0 ? cfg.gen.max_new_tokens : 256;
    const int ctx = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 1 << 20;
    if ((long)n_prompt >= ctx) {
        fprintf(stderr, "troupe-generate: the prompt has %zu tokens; the model's context is %d\n", n_prompt, ctx);
        status = 2;
        goto done;
    }
    if ((long)n_prompt + max_tokens > ctx) {
        LOG_W("max tokens %d cut to %ld to stay within the context of %d", max_tokens, ctx - (long)n_prompt, ctx);
        max_tokens = ctx - (int)n_prompt;
    }
    sp.max_tokens = max_tokens;
    sp.n_eos = cfg.n_eos < SAMPLER_MAX_EOS ? cfg.n_eos : SAMPLER_MAX_EOS;
    memcpy(sp.eos_ids, cfg.eos_token_ids, (size_t)sp.n_eos * sizeof(int32_t));
    if (sp.n_eos == 0 && tok && tok_eos_id(tok) >= 0)
        sp.eos_ids[sp.n_eos++] = tok_eos_id(tok);
    if (!(smp = sampler_new(&sp, cfg.vocab_size, prompt, (int)n_prompt, err, sizeof err))) {
        fprintf(stderr, "troupe-generate: %s\n", err);
        status = 2;
        goto done;
    }

    /* Backend, weights, model. An unsupported KV cache fails before the weights are loaded. */
    if (!(be = backend_new(o.backend ? o.backend : "cpu", o.threads, err, sizeof err))) {
        fprintf(stderr, "troupe-generate: %s\n", err);
        goto done;
    }
    const dtype_t kvt = config_kv_dtype(&cfg, o.dummy ? wdt : DT_COUNT, o.kv_dtype);   /* the workers' rule */
    if (kvpool_check(be, kvt, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, err, sizeof err) != 0) {
        fprintf(stderr, "troupe-generate: --kv-dtype %s: %s\n", o.kv_dtype != DT_COUNT ? dtype_name(kvt) : "auto", err);
        goto done;
    }
    if (o.dummy) {
        ck = ckpt_dummy(wdt, 0);
    } else if (!s_exists(o.model_dir, "model.safetensors") && !s_exists(o.model_dir, "model.safetensors.index.json")) {
        fprintf(stderr, "troupe-generate: %s has no model.safetensors or model.safetensors.index.json; "
                        "--load-format dummy runs random weights of this shape\n", o.model_dir);
        goto done;
    } else if (!(ck = ckpt_open(o.model_dir, err, sizeof err))) {
        fprintf(stderr, "troupe-generate: %s\n", err);
        goto done;
    }
    const int total = (int)n_prompt + max_tokens;
    model_opts_t mo = {.max_tokens = o.chunk < (int)n_prompt ? o.chunk : (int)n_prompt, .max_seqs = 1,
                       .max_context = total, .kv_block_size = KV_BLOCK};
    if (!(m = model_load(o.model_dir, &cfg, ck, be, &mo, err, sizeof err))) {
        fprintf(stderr, "troupe-generate: %s\n", err);
        goto done;
    }
    const int n_blocks = (total + KV_BLOCK - 1) / KV_BLOCK;
    if (!(pool = kvpool_new(n_blocks, KV_BLOCK, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, kvt, be, err, sizeof err)) ||
        !(seq = kvseq_new(pool, total, 0))) {
        fprintf(stderr, "troupe-generate: %s\n", pool ? "out of memory" : err);
        goto done;
    }
    logits = malloc((size_t)cfg.vocab_size * sizeof(float));
    out_ids = malloc((size_t)max_tokens * sizeof(int32_t));
    lps = malloc((size_t)max_tokens * sizeof(float));
    size_t tcap = tok ? 3 * tok_max_token_bytes(tok) + 16 : 64;
    tbuf = malloc(tcap);
    out.cap = o.json ? (size_t)max_tokens * 8 + 64 : 0;
    out.text = o.json ? calloc(1, out.cap) : NULL;
    if (!logits || !out_ids || !lps || !tbuf || (o.json && !out.text)) {
        fprintf(stderr, "troupe-generate: out of memory\n");
        goto done;
    }
    const int64_t t_loaded = now_ns();

    /* Prefill in chunks, each one model_forward. */
    for (size_t at = 0; at < n_prompt; at += (size_t)o.chunk) {
        int k = (int)(n_prompt - at < (size_t)o.chunk ? n_prompt - at : (size_t)o.chunk);
        model_seq_t q = {.kv = seq, .n_new = k};
        model_batch_t b = {.n_seqs = 1, .seqs = &q};
        if (kvseq_append(seq, prompt + at, k) < 0 || model_forward(m, &b, logits, err, sizeof err) < 0) {
            fprintf(stderr, "troupe-generate: prefill: %s\n", err);
            goto done;
        }
    }
    const int64_t t_prefilled = now_ns();

    /* Decode: sample, stream, stop or run the next step. */
    tok_stream_t ts;
    if (tok) {
        tok_stream_init(&ts, tok);
        ts.skip_special = 1;                       /* as vLLM's skip_special_tokens default */
    }
    finish_reason_t fin = FINISH_NONE;
    int n_out = 0, n_decode_steps = 0;
    /* Greedy without log-probabilities: decode steps bring back the device's argmax, not logits. */
    const int device_greedy = sampler_is_greedy(smp) && !o.logprobs;
    int32_t dev_tok = 0;
    while (fin == FINISH_NONE) {
        float lp = 0;
        int32_t t = n_out > 0 && device_greedy ? dev_tok : sampler_sample(smp, logits, o.logprobs ? &lp : NULL);
        out_ids[n_out] = t;
        lps[n_out++] = lp;
        fin = sampler_accept(smp, t);
        int stop_token = fin == FINISH_STOP;       /* EOS or a stop id: not printed */
        if (!stop_token) {
            if (tok) {
                size_t nt = 0;
                if (tok_stream_feed(&ts, t, tbuf, tcap, &nt) == 0 && nt &&
                    sampler_text(smp, tbuf, nt, s_emit, &out))
                    fin = FINISH_STOP;
            } else if (!o.json) {                  /* no tokenizer: stream the ids */
                int nt = snprintf(tbuf, tcap, "%s%d", n_out > 1 ? " " : "", t);
                s_emit(&out, tbuf, (size_t)nt);
            }
        }
        if (fin != FINISH_NONE)
            break;
        model_seq_t q = {.kv = seq, .n_new = 1};
        model_batch_t b = {.n_seqs = 1, .seqs = &q, .argmax_out = device_greedy ? &dev_tok : NULL};
        if (kvseq_append(seq, &t, 1) < 0 || model_forward(m, &b, logits, err, sizeof err) < 0) {
            fprintf(stderr, "troupe-generate: decode step %d: %s\n", n_out, err);
            goto done;
        }
        n_decode_steps++;
    }
    if (tok) {
        size_t nt = 0;
        if (tok_stream_flush(&ts, tbuf, tcap, &nt) == 0 && nt)
            sampler_text(smp, tbuf, nt, s_emit, &out);
        sampler_text_flush(smp, s_emit, &out);
    }
    const int64_t t_end = now_ns();

    const double load_ms = s_ms(t_start, t_loaded), prefill_ms = s_ms(t_loaded, t_prefilled), decode_ms = s_ms(t_prefilled, t_end);
    const double decode_tps = n_decode_steps ? n_decode_steps / (decode_ms / 1e3) : 0;
    const double prompt_tps = n_prompt / (prefill_ms / 1e3);
    if (o.json) {
        json_t *j = json_object(), *ids = json_array(), *tm = json_object();
        for (int i = 0; i < n_out; i++)
            json_array_append_new(ids, json_integer(out_ids[i]));
        json_object_set_new(j, "ids", ids);
        json_object_set_new(j, "text", tok ? json_stringn(out.text ? out.text : "", out.n) : json_null());
        json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)n_prompt));
        json_object_set_new(j, "completion_tokens", json_integer(n_out));
        json_object_set_new(j, "finish_reason", json_string(finish_reason_name(fin)));
        json_object_set_new(tm, "load_ms", json_real(load_ms));
        json_object_set_new(tm, "prefill_ms", json_real(prefill_ms));
        json_object_set_new(tm, "prompt_tokens_per_s", json_real(prompt_tps));
        json_object_set_new(tm, "decode_ms", json_real(decode_ms));
        json_object_set_new(tm, "decode_steps", json_integer(n_decode_steps));
        json_object_set_new(tm, "decode_tokens_per_s", json_real(decode_tps));
        json_object_set_new(j, "timings", tm);
        json_t *md = json_object();
        json_object_set_new(md, "arch", json_string(config_arch_name(cfg.arch)));
        const tensor_view_t *emb = ckpt_get(ck, "model.embed_tokens.weight");
        json_object_set_new(md, "weights_dtype", json_string(dtype_name(emb ? emb->dtype : wdt)));
        json_object_set_new(md, "kv_dtype", json_string(dtype_name(kvt)));
        json_object_set_new(md, "weight_bytes_per_token", json_integer((json_int_t)model_active_weight_bytes(m)));
        json_object_set_new(md, "threads", json_integer(be->n_threads));
        json_object_set_new(md, "backend", json_string(be->ops->name));
        json_object_set_new(j, "model", md);
        if (o.logprobs) {
            json_t *l = json_array();
            for (int i = 0; i < n_out; i++)
                json_array_append_new(l, json_real(lps[i]));
            json_object_set_new(j, "logprobs", l);
            json_object_set_new(j, "logprobs_mode",
                                json_string(sp.logprobs_mode == SAMPLER_LOGPROBS_RAW ? "raw" : "processed"));
        }
        char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
        if (s)
            puts(s);
        free(s);
        json_decref(j);
    } else {
        fputc('\n', stdout);
        if (o.logprobs) {
            fprintf(stderr, "logprobs (%s):", sp.logprobs_mode == SAMPLER_LOGPROBS_RAW ? "raw" : "processed");
            for (int i = 0; i < n_out; i++)
                fprintf(stderr, " %d:%.4f", out_ids[i], lps[i]);
            fputc('\n', stderr);
        }
        LOG_I("%zu prompt + %d generated tokens (%s); load %.0f ms, prefill %.0f ms (%.1f tok/s), decode %.1f tok/s",
              n_prompt, n_out, finish_reason_name(fin), load_ms, prefill_ms, prompt_tps, decode_tps);
    }
    status = 0;
done:
    free(out.text);
    free(tbuf);
    free(lps);
    free(out_ids);
    free(logits);
    free(rendered);
    free(prompt);
    sampler_destroy(&smp);
    kvseq_destroy(&seq);
    kvpool_destroy(&pool);
    model_destroy(&m);
    ckpt_destroy(&ck);
    tok_destroy(&tok);
    backend_destroy(&be);
    return status;
}
