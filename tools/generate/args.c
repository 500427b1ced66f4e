/* tools/generate/args.c — troupe-generate's command line (gen.h). */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/generate/gen.h"
#include "tools/lib/args.h"

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

int gen_parse_args(int argc, char **argv, gen_opts_t *o)
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

int gen_parse_ids(const char *s, int32_t **ids, size_t *n)
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
