/* tools/generate/gen.h — the pieces of troupe-generate (tools/generate.c: the request from the
 * model's opening to the report): its options (args.c), the decode loop with speculation
 * (decode.c) and the report (report.c). One request, one process: nothing here is shared with the
 * cluster but the engine it calls. */
#ifndef TROUPE_TOOLS_GENERATE_GEN_H
#define TROUPE_TOOLS_GENERATE_GEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine_open.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "engine/tokenizer.h"

/* The command line, parsed (gen_parse_args). */
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

/* Where the generated text goes: stdout as it comes, or (--json) a buffer for the report. */
typedef struct out_ctx {
    int json;
    char *text;                   /* --json: the generated text, capacity cap */
    size_t n, cap;
} out_ctx_t;

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

/* The command line into o: 0, or the exit status (2, with the usage on stderr; --help exits 0). */
int gen_parse_args(int argc, char **argv, gen_opts_t *o);
/* "1,2,3" -> ids (malloc'd); -1 with a message on stderr. */
int gen_parse_ids(const char *s, int32_t **ids, size_t *n);

/* A line "troupe-generate: what: err" on stderr; returns status. */
static inline int gen_fail(int status, const char *what, const char *err)
{
    fprintf(stderr, "troupe-generate: %s%s%s\n", what ? what : "", what ? ": " : "", err);
    return status;
}
/* n bytes of text to the output (ctx: an out_ctx_t). */
void gen_emit(void *ctx, const char *t, size_t n);

/* The decode loop after the prefill (its logits in g->e->logits): sample, stream, stop, or the next
 * step, verifying drafts with speculation. 0, or the exit status. */
int gen_decode(const gen_opts_t *o, gen_t *g);

/* The report: --json's one object on stdout, else the text's newline and the figures on stderr. */
void gen_report_json(const gen_opts_t *o, const gen_t *g);
void gen_report_text(const gen_opts_t *o, const gen_t *g);

#endif
