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
 * The pieces: tools/generate/args.c (the command line), tools/generate/decode.c (the decode loop,
 * speculation's verify steps included), tools/generate/report.c (the JSON or text report); this
 * file opens the model, the tokenizer, the prompt and the sampler, prefills, and runs them.
 *
 * Exit status: 0 on success, 2 on a usage error, 1 on any other error (always with a message on
 * stderr naming what was wrong). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/chat_template.h"
#include "engine/mtp.h"
#include "tools/generate/gen.h"

#define KV_BLOCK 16

static int s_exists(const char *dir, const char *file)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return stat(path, &st) == 0;
}

/* --tokenizer DIR, else MODEL_DIR when it has one; needed for text in and out. */
static int s_tokenizer(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    g->tok_dir = o->tokenizer_dir ? o->tokenizer_dir : s_exists(o->model_dir, "tokenizer.json") ? o->model_dir : NULL;
    if (g->tok_dir && !(g->tok = tok_load(g->tok_dir, err, sizeof err)))
        return gen_fail(1, NULL, err);
    if (!g->tok && (o->prompt || o->chat)) {
        fprintf(stderr, "troupe-generate: %s has no tokenizer.json: give token ids with --ids, or a tokenizer with "
                        "--tokenizer DIR\n", o->model_dir);
        return 2;
    }
    if (!g->tok && o->sp.n_stops)
        return gen_fail(2, NULL, "--stop strings need a tokenizer (--tokenizer DIR)");
    return 0;
}

/* The prompt's ids: --ids, or the text (--chat: through the family's chat template) encoded. */
static int s_prompt(const gen_opts_t *o, gen_t *g)
{
    char err[1024];
    if (o->ids) {
        if (gen_parse_ids(o->ids, &g->prompt, &g->n_prompt) < 0)
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
            return gen_fail(1, NULL, "the prompt is not valid UTF-8");
    }
    if (g->n_prompt == 0)
        return gen_fail(2, NULL, "the prompt is empty");
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
        return gen_fail(2, NULL, err);
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
        return gen_fail(1, NULL, err);
    g->seq = kvseq_new(g->e->pool, total, 0);
    if (o->spec == SPEC_DRAFT) {
        const int64_t t0 = now_ns();
        spec_draft_opts_t d = {.model_dir = o->draft_dir, .target = g->e, .target_tokenizer = g->tok_dir, .max_seqs = 1,
                               .max_tokens = o->chunk, .max_model_len = total, .block_size = KV_BLOCK, .dummy = o->dummy};
        if (!(g->prop = spec_draft_new(&d, NULL, err, sizeof err)))
            return gen_fail(1, NULL, err);
        g->draft_load_ns = now_ns() - t0;
    }
    if (o->mtp) {
        if (!(g->prop = spec_mtp_new(g->e->model, 1, total, err, sizeof err)))
            return gen_fail(1, NULL, err);
        if (!(g->hid = malloc((size_t)step_tokens * g->e->cfg.hidden_size * sizeof(float))))
            return gen_fail(1, NULL, "out of memory");
    }
    if (o->spec != SPEC_OFF && (g->all = malloc((size_t)total * sizeof *g->all)))
        memcpy(g->all, g->prompt, g->n_prompt * sizeof *g->all);
    if (o->spec != SPEC_OFF && !g->all)
        return gen_fail(1, NULL, "out of memory");
    g->out_ids = malloc((size_t)g->max_tokens * sizeof(int32_t));
    g->lps = malloc((size_t)g->max_tokens * sizeof(float));
    g->tcap = g->tok ? 3 * tok_max_token_bytes(g->tok) + 16 : 64;
    g->tbuf = malloc(g->tcap);
    g->out = (out_ctx_t){.json = o->json, .cap = o->json ? (size_t)g->max_tokens * 8 + 64 : 0};
    g->out.text = o->json ? calloc(1, g->out.cap) : NULL;
    if (!g->seq || !g->out_ids || !g->lps || !g->tbuf || (o->json && !g->out.text))
        return gen_fail(1, NULL, "out of memory");
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
            return gen_fail(1, "prefill", err);
        const spec_mtp_feed_t f = {.id = 1, .tokens = g->prompt, .n_tokens = (int)g->n_prompt, .pos0 = (int)at,
                                   .n = k, .hidden = g->hid, .sampled = sampler_draws(g->smp)};
        if (g->hid && spec_mtp_feed_batch(g->prop, &f, 1, err, sizeof err) < 0)
            return gen_fail(1, "mtp", err);
    }
    return 0;
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
        return gen_fail(1, NULL, err);
    if ((rc = s_tokenizer(o, g)) || (rc = s_prompt(o, g)) || (rc = s_sampling(o, g)) || (rc = s_load(o, g)))
        return rc;
    g->t_loaded = now_ns();
    if ((rc = s_prefill(o, g)))
        return rc;
    g->t_prefilled = now_ns();
    if ((rc = gen_decode(o, g)))
        return rc;
    g->t_end = now_ns();
    (o->json ? gen_report_json : gen_report_text)(o, g);
    return 0;
}

int main(int argc, char **argv)
{
    gen_opts_t o;
    int rc = gen_parse_args(argc, argv, &o);
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
