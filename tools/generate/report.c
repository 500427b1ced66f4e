/* tools/generate/report.c — what troupe-generate says at the end (gen.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "tools/generate/gen.h"

static double s_ms(int64_t t0, int64_t t1) { return (double)(t1 - t0) / 1e6; }

static const char *s_lp_mode(const gen_t *g) { return g->sp.logprobs_mode == SAMPLER_LOGPROBS_RAW ? "raw" : "processed"; }

/* --json: one object with the ids, text, counts, finish reason, timings and the model's facts. */
void gen_report_json(const gen_opts_t *o, const gen_t *g)
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
void gen_report_text(const gen_opts_t *o, const gen_t *g)
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
