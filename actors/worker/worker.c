#include "actors/worker/worker.h"
#include "actors/worker/expert_group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/kvscale.h"
#include "engine/mtp.h"

/* Threads: the topology's, or the cores shared evenly by the model workers of this node. */
static int s_threads(const topo_t *t)
{
    if (t->model.threads > 0)
        return t->model.threads;
    int workers = topo_count_role(t, ROLE_PREFILL) + topo_count_role(t, ROLE_DECODE);
    long threads = sysconf(_SC_NPROCESSORS_ONLN) / (workers > 0 ? workers : 1);
    return threads < 1 ? 1 : (int)threads;
}

/* This worker's part of its GPU's memory for KV (engine_open.h's rule): a decode worker holds the
 * whole KV of every running sequence (max_batch x max_model_len), a prefill worker only the prompts
 * it is prefilling and cached prefixes, so decode workers weigh 3 and prefill workers 1; every
 * model worker of the GPU places its own copy of the weights. */
static void s_kv_share(const topo_t *t, topo_role_t role, int gpu, engine_spec_t *s)
{
    int shares = 0, same_gpu = 0;
    for (int i = 0; i < t->n_instances; i++) {
        const topo_instance_t *in = &t->instances[i];
        if ((in->role != ROLE_DECODE && in->role != ROLE_PREFILL) || (gpu >= 0 && in->gpu >= 0 && in->gpu != gpu))
            continue;
        shares += in->role == ROLE_DECODE ? 3 : 1;
        same_gpu++;
    }
    s->kv_sharers = same_gpu;
    s->kv_share = (role == ROLE_DECODE ? 3.0 : 1.0) / (shares > 0 ? shares : 1);
}

/* The device bytes the proposers of gpu's decode workers will place (TROUPE_SPECULATION=draft:
 * each decode worker loads model.draft beside its target; mtp: each makes the MTP layer's KV
 * pool), for every model worker of that GPU to take off before it sizes its KV pool: without it
 * the target's pool takes the room the proposer then needs. 0 without such speculation or when the
 * draft's config cannot be read (s_draft reports that). */
static double s_draft_reserve(const topo_t *t, int gpu, const spec_draft_opts_t *o, const model_config_t *cfg)
{
    spec_method_t m;
    int k;
    char err[256];
    if (spec_knob_parse("TROUPE_SPECULATION", getenv("TROUPE_SPECULATION"), &m, &k, err, sizeof err) != 0 ||
        (m != SPEC_MTP && (m != SPEC_DRAFT || !t->model.draft[0])))
        return 0;
    double bytes = 0;
    if (m == SPEC_MTP)
        bytes = cfg->mla.num_nextn_predict_layers > 0 ? spec_mtp_device_bytes(cfg, o->max_seqs, o->max_model_len) : 0;
    else if (spec_draft_device_bytes(o, t->model.load_format == TOPO_LOAD_DUMMY ? t->model.dtype : DT_COUNT, &bytes,
                                     err, sizeof err) != 0)
        return 0;
    int decoders = 0;
    for (int i = 0; i < t->n_instances; i++)
        decoders += t->instances[i].role == ROLE_DECODE &&
                    (gpu < 0 || t->instances[i].gpu < 0 || t->instances[i].gpu == gpu);
    return bytes * decoders;
}

/* A decode worker's draft model, or its model's MTP layer as the proposer, when TROUPE_SPECULATION
 * asks for one (spec_knob_parse). */
static int s_draft(worker_t *w, const topo_t *t, topo_role_t role, const char *tokdir, int *config_error, char *err,
                   size_t errlen)
{
    spec_method_t m;
    int k;
    if (role != ROLE_DECODE || spec_knob_parse("TROUPE_SPECULATION", getenv("TROUPE_SPECULATION"), &m, &k, err,
                                               errlen) != 0 || (m != SPEC_DRAFT && m != SPEC_MTP))
        return 0;   /* a bad knob is the decode step's to report */
    if (m == SPEC_MTP) {   /* the MTP layer was loaded with the model (engine/mtp.h) */
        if (!model_has_mtp(w->eng->model)) {
            *config_error = 1;
            return errf(err, errlen, "TROUPE_SPECULATION=%s: model %s has no MTP layer (num_nextn_predict_layers "
                        "and model.layers.%d.* in its checkpoint)", getenv("TROUPE_SPECULATION"), t->model.path,
                        w->eng->cfg.num_layers);
        }
        if (!(w->draft = spec_mtp_new(w->eng->model, w->max_seqs, w->max_model_len, err, errlen)))
            return -1;
        LOG_I("MTP proposer: %d sequences of %d tokens, %.1f MiB of MTP KV", w->max_seqs, w->max_model_len,
              spec_mtp_device_bytes(&w->eng->cfg, w->max_seqs, w->max_model_len) / (1 << 20));
        return 0;
    }
    if (!t->model.draft[0]) {
        *config_error = 1;
        return errf(err, errlen, "TROUPE_SPECULATION=%s needs a draft model: model.draft in the topology",
                    getenv("TROUPE_SPECULATION"));
    }
    spec_draft_opts_t o = {.model_dir = t->model.draft, .target = w->eng, .target_tokenizer = tokdir,
                           .max_seqs = w->max_seqs, .max_tokens = w->max_tokens, .max_model_len = w->max_model_len,
                           .block_size = w->block_size, .dummy = t->model.load_format == TOPO_LOAD_DUMMY};
    if (!(w->draft = spec_draft_new(&o, config_error, err, errlen)))
        return -1;
    spec_draft_stats_t st;
    spec_draft_stats(w->draft, &st);
    LOG_I("draft model %s: %d KV blocks of %d tokens", t->model.draft, st.blocks_total, w->block_size);
    return 0;
}

worker_t *worker_load(const topo_t *t, topo_role_t role, const topo_instance_t *self, int max_tokens, int max_seqs,
                      int *config_error, char *err, size_t errlen)
{
    const int gpu = self->gpu;
    *config_error = 0;
    worker_t *w = calloc(1, sizeof *w);
    if (!w) {
        errf(err, errlen, "out of memory");
        return NULL;
    }
    const topo_model_t *tm = &t->model;
    w->block_size = t->cache.block_size;
    w->max_tokens = max_tokens;
    w->max_seqs = max_seqs;
    if (!(w->eng = engine_new(tm->path, err, errlen))) {
        *config_error = 1;
        goto fail;
    }
    w->max_model_len = t->limits.max_model_len;   /* within the model's own context */
    if (w->eng->cfg.max_position_embeddings > 0 && w->eng->cfg.max_position_embeddings < w->max_model_len)
        w->max_model_len = w->eng->cfg.max_position_embeddings;

    engine_spec_t s;
    engine_spec_default(&s);
    char kind[32];
    snprintf(kind, sizeof kind, "cuda:%d", gpu > 0 ? gpu : 0);
    s.backend = tm->backend == TOPO_BACKEND_CUDA ? kind : "cpu";
    s.threads = s_threads(t);
    s.dummy = tm->load_format == TOPO_LOAD_DUMMY;
    s.dtype = tm->dtype;                          /* dummy weights'; a checkpoint's load as stored */
    s.kv_dtype = tm->kv_dtype;
    s.kv_dtype_option = "model.kv_dtype";
    s.kv_scales = tm->kv_scales;
    s.kv_scales_option = "model.kv_scales";
    for (int i = 0; i < t->n_actors; i++)         /* an expert-parallel group cannot calibrate: none of it, alike */
        s.kv_no_calibrate |= t->actors[i].role == ROLE_DECODE && t->actors[i].ep > 1;
    s.quiet = 1;                                  /* the scales are logged below */
    s.dummy_option = "load_format: dummy";
    /* A speculating decode worker's verify steps compute every draft's row of logits. */
    spec_method_t spec_m;
    int spec_k;
    w->max_logit_rows = max_seqs;
    if (role == ROLE_DECODE && spec_knob_parse("TROUPE_SPECULATION", getenv("TROUPE_SPECULATION"), &spec_m, &spec_k,
                                               err, errlen) == 0 && spec_m != SPEC_OFF) {
        const long rows = (long)max_seqs * (1 + spec_k);
        w->max_logit_rows = rows < max_tokens ? (int)rows : max_tokens;
    }
    s.model = (model_opts_t){.max_tokens = max_tokens, .max_seqs = max_seqs, .max_logit_rows = w->max_logit_rows,
                             .max_context = w->max_model_len, .kv_block_size = w->block_size,
                             .quantize = tm->quantization};   /* model.quantization: online, at load */
    /* The pool: limits.kv_blocks, or (0) max_batch sequences of max_model_len and one more for
     * cached prefixes, as far as this worker's share of the memory goes. */
    const long per_seq = (w->max_model_len + w->block_size - 1) / w->block_size;
    s.kv_blocks = t->limits.kv_blocks > 0 ? t->limits.kv_blocks : (long)t->limits.max_batch * per_seq + per_seq;
    s.kv_fit = t->limits.kv_blocks <= 0;
    s_kv_share(t, role, gpu, &s);
    if (tm->backend == TOPO_BACKEND_CUDA) {
        const spec_draft_opts_t dop = {.model_dir = t->model.draft, .max_seqs = max_seqs, .max_tokens = max_tokens,
                                       .max_model_len = w->max_model_len, .block_size = w->block_size};
        s.kv_reserve_bytes = s_draft_reserve(t, gpu, &dop, &w->eng->cfg);
    }
    /* A decode instance of an actor with ep > 1 is a rank of its group: only its experts load. */
    err[0] = 0;
    if (role == ROLE_DECODE && !(w->experts = expert_group_member(t, self, &w->eng->cfg, &s, err, errlen)) &&
        err[0]) {
        *config_error = 1;   /* the model's experts do not divide over the ranks, or a bad TROUPE_EP_TRANSPORT */
        goto fail;
    }
    if (w->experts)
        expert_group_exit_on_fail(w->experts);
    const engine_status_t st = engine_load(w->eng, &s, err, errlen);
    if (st != ENGINE_OK) {
        *config_error = st == ENGINE_ERR_CONFIG;
        goto fail;
    }
    if (w->experts && expert_group_attach(w->experts, w->eng, err, errlen) != 0)
        goto fail;   /* a rank that could not load: the moment (its own log says why) */

    w->ipc_ok = kvx_ipc_handle(w->eng->be, kvpool_view(w->eng->pool), w->ipc_handle) == 0;
    const char *tokdir = tm->tokenizer[0] ? tm->tokenizer : tm->path;
    char terr[512];
    w->tok = tok_load(tokdir, terr, sizeof terr);
    if (!w->tok && topo_tokenizer_expected(t)) {
        errf(err, errlen, "model.tokenizer: %s", terr);
        *config_error = 1;
        goto fail;
    }
    if (!w->tok)
        LOG_W("no tokenizer (%s): token-id prompts only, no text in the stream", terr);
    if (s_draft(w, t, role, tokdir, config_error, err, errlen) != 0)
        goto fail;
    const bk_kv_t *kv = kvpool_view(w->eng->pool);
    if (!(w->stage = malloc(kv->block_bytes))) {
        errf(err, errlen, "out of memory");
        goto fail;
    }
    LOG_I("model %s: %d layers, hidden %d, vocab %d, %s weights; KV pool %d blocks of %d tokens, %s (%.1f MiB)",
          tm->path, w->eng->cfg.num_layers, w->eng->cfg.hidden_size, w->eng->cfg.vocab_size,
          dtype_name(w->eng->weights_dtype), kv->n_blocks, kv->block_size, dtype_name(kv->dtype),
          (double)kv->n_blocks * (double)kv->block_bytes / (1 << 20));
    if (w->eng->kv_scales)   /* every worker of the topology must print the same digest (engine/kvscale.h) */
        LOG_I("KV scales (model.kv_scales %s): %s, digest %016llx", kv_scales_name(tm->kv_scales),
              kv_scales_name(w->eng->kv_scales_from),
              (unsigned long long)kvscale_digest(w->eng->kv_scales, kvscale_count(&w->eng->cfg)));
    return w;
fail:
    worker_destroy(&w);
    return NULL;
}

void worker_destroy(worker_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    worker_t *w = *self_p;
    spec_proposer_destroy(&w->draft);             /* on the target's backend: before the engine */
    tok_destroy(&w->tok);
    expert_group_destroy(&w->experts);            /* stops the ranks before the model goes */
    engine_destroy(&w->eng);                      /* the pool, the model, the backend: after their users */
    free(w->stage);
    free(w);
    *self_p = NULL;
}

int worker_sampler_params(const worker_t *w, const msg_sampling_t *s, sampler_params_t *p, char *err,
                          size_t errlen)
{
    sampler_params_default(p);
    p->temperature = s->temperature;
    p->top_k = (int)s->top_k;
    p->top_p = s->top_p;
    p->min_p = s->min_p;
    p->repetition_penalty = s->repetition_penalty;
    p->presence_penalty = s->presence_penalty;
    p->frequency_penalty = s->frequency_penalty;
    p->seed = (uint64_t)s->seed;
    p->max_tokens = (int)s->max_tokens;
    p->ignore_eos = s->ignore_eos;
    p->n_eos = w->eng->cfg.n_eos < SAMPLER_MAX_EOS ? w->eng->cfg.n_eos : SAMPLER_MAX_EOS;
    memcpy(p->eos_ids, w->eng->cfg.eos_token_ids, (size_t)p->n_eos * sizeof(int32_t));
    if (p->n_eos == 0 && w->tok && tok_eos_id(w->tok) >= 0)
        p->eos_ids[p->n_eos++] = tok_eos_id(w->tok);
    if (s->n_stop_token_ids > SAMPLER_MAX_STOP_IDS)
        return errf(err, errlen, "sampling.stop_token_ids: at most %d", SAMPLER_MAX_STOP_IDS);
    for (uint32_t i = 0; i < s->n_stop_token_ids; i++)
        p->stop_ids[p->n_stop_ids++] = (int32_t)s->stop_token_ids[i];
    if (s->n_stop > SAMPLER_MAX_STOPS)
        return errf(err, errlen, "sampling.stop: at most %d stop strings", SAMPLER_MAX_STOPS);
    for (uint32_t i = 0; i < s->n_stop; i++)
        p->stops[p->n_stops++] = s->stop[i];
    p->logprobs_mode = SAMPLER_LOGPROBS_RAW;
    return sampler_params_check(p, w->eng->cfg.vocab_size, err, errlen);
}

size_t worker_block_bytes(const worker_t *w) { return kvpool_view(w->eng->pool)->block_bytes; }

void worker_publish_blocks(actor_t *a, const char *holder, const char *cache_manager, const kvseq_t *kv, int block_size)
{
    int full = kvseq_len(kv) / block_size;
    if (full <= 0 || !cache_manager)
        return;
    uint64_t hashes[512];
    int n = full < 512 ? full : 512;
    for (int i = 0; i < n; i++)
        hashes[i] = kvseq_hash(kv, i);
    msg_t m;
    msg_init(&m, MSG_CACHE_PUT, 0);
    m.u.cache_put.holder = holder;
    m.u.cache_put.tier = MSG_TIER_DEVICE;
    m.u.cache_put.hashes = hashes;
    m.u.cache_put.n_hashes = (uint32_t)n;
    m.u.cache_put.pool_blocks = (uint32_t)kvpool_n_blocks(kvseq_pool(kv));   /* bounds what the index keeps of ours */
    actor_send(a, cache_manager, &m);
}
