#include "actors/runtime/worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/util.h"

static int s_has_weights(const char *dir)
{
    char p[2048];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (access(p, R_OK) == 0)
        return 1;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    return access(p, R_OK) == 0;
}

worker_t *worker_load(const topo_t *t, topo_role_t role, int gpu, int max_tokens, int max_seqs, int *config_error,
                      char *err, size_t errlen)
{
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
    if (config_load(tm->path, &w->cfg, err, errlen) != 0) {
        *config_error = 1;
        goto fail;
    }
    w->max_model_len = t->limits.max_model_len;
    if (w->cfg.max_position_embeddings > 0 && w->cfg.max_position_embeddings < w->max_model_len)
        w->max_model_len = w->cfg.max_position_embeddings;

    /* Threads: the topology's, or the cores shared evenly by the model workers of this node. */
    int threads = tm->threads;
    if (threads <= 0) {
        int workers = topo_count_role(t, ROLE_PREFILL) + topo_count_role(t, ROLE_DECODE);
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(cores / (workers > 0 ? workers : 1));
        if (threads < 1)
            threads = 1;
    }
    if (tm->backend == TOPO_BACKEND_CUDA) {
        char kind[32];
        snprintf(kind, sizeof kind, "cuda:%d", gpu > 0 ? gpu : 0);
        w->be = backend_new(kind, threads, err, errlen);
    } else {
        w->be = backend_new("cpu", threads, err, errlen);
    }
    if (!w->be)
        goto fail;
    /* Free device memory before any model worker of this GPU has placed its weights (they start
     * together): the KV budget below is taken from it, so it does not depend on who loads first. */
    const size_t free_at_start = w->be->ops->mem_available ? w->be->ops->mem_available(w->be) : 0;

    /* An unsupported KV cache fails here, before the weights are loaded, naming the option. */
    /* model.dtype is the dtype of dummy weights; a checkpoint's weights load as stored. */
    const bool dummy = tm->load_format == TOPO_LOAD_DUMMY;
    dtype_t wdt = tm->dtype, kvt = config_kv_dtype(&w->cfg, dummy ? wdt : DT_COUNT, tm->kv_dtype);
    char kerr[256];
    if (kvpool_check(w->be, kvt, w->cfg.head_dim, w->cfg.num_heads, w->cfg.num_kv_heads, kerr, sizeof kerr) != 0) {
        errf(err, errlen, "model.kv_dtype %s%s%s: %s", tm->kv_dtype == DT_COUNT ? "auto (" : "", dtype_name(kvt),
             tm->kv_dtype == DT_COUNT ? ")" : "", kerr);
        *config_error = 1;
        goto fail;
    }
    if (tm->load_format == TOPO_LOAD_DUMMY) {
        w->ck = ckpt_dummy(wdt, 0);
    } else if (!s_has_weights(tm->path)) {
        errf(err, errlen, "%s: no model.safetensors or model.safetensors.index.json (load_format: dummy runs "
                          "random weights of this shape)", tm->path);
        *config_error = 1;
        goto fail;
    } else {
        w->ck = ckpt_open(tm->path, err, errlen);
    }
    if (!w->ck) {
        *config_error = 1;                         /* unreadable or malformed weight files */
        goto fail;
    }
    model_opts_t mo = {.max_tokens = max_tokens, .max_seqs = max_seqs, .max_logit_rows = max_seqs,
                       .max_context = w->max_model_len, .kv_block_size = w->block_size};
    w->model = model_load(tm->path, &w->cfg, w->ck, w->be, &mo, err, errlen);
    if (!w->model) {
        *config_error = 1;   /* weights that disagree with config.json, or a model that does not fit */
        goto fail;
    }

    /* Shares of the device's free memory for KV: a decode worker holds the whole KV of every
     * running sequence (max_batch x max_model_len), a prefill worker only the prompts it is
     * prefilling and cached prefixes, so decode workers weigh 3 and prefill workers 1. */
    int shares = 0, mine = role == ROLE_DECODE ? 3 : 1, same_gpu = 0;
    for (int i = 0; i < t->n_instances; i++) {
        const topo_instance_t *in = &t->instances[i];
        if ((in->role != ROLE_DECODE && in->role != ROLE_PREFILL) || (gpu >= 0 && in->gpu >= 0 && in->gpu != gpu))
            continue;
        shares += in->role == ROLE_DECODE ? 3 : 1;
        same_gpu++;
    }
    size_t block_bytes = (size_t)w->cfg.num_layers * 2 * (size_t)w->block_size *
                         (size_t)w->cfg.num_kv_heads * (size_t)w->cfg.head_dim * dtype_size(kvt);
    long n_blocks = t->limits.kv_blocks;
    if (n_blocks <= 0) {
        long per_seq = (w->max_model_len + w->block_size - 1) / w->block_size;
        n_blocks = (long)t->limits.max_batch * per_seq + per_seq;   /* + room for cached prefixes */
        /* Capped by memory: a quarter of the host's on the CPU; on a GPU, this worker's share of
         * 90% of what the GPU had free at start less every model worker's weights and a working
         * reserve (the workers of a GPU run the same model; counting them all, not just those
         * that have loaded so far, keeps a fast loader from taking a slow one's room). */
        const double reserve = 3e9;   /* activations, logits, cuBLAS workspace, CUDA context */
        const double left = (double)free_at_start - same_gpu * ((double)model_weight_bytes(w->model) + reserve);
        long mem = free_at_start ? (long)(left > 0 ? left * 0.9 * mine / (shares > 0 ? shares : 1) : 0)
                                 : sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / 4;
        if (n_blocks * (long)block_bytes > mem)
            n_blocks = mem / (long)block_bytes;
    }
    w->pool = kvpool_new((int)n_blocks, w->block_size, w->cfg.num_layers, w->cfg.num_kv_heads,
                         w->cfg.head_dim, kvt, w->be, err, errlen);
    if (!w->pool) {
        *config_error = 1;   /* limits.kv_blocks (or the memory left) too small for one sequence */
        goto fail;
    }

    w->ipc_ok = kvx_ipc_handle(w->be, kvpool_view(w->pool), w->ipc_handle) == 0;
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
    w->logits = malloc((size_t)max_seqs * (size_t)w->cfg.vocab_size * sizeof(float));
    w->stage = malloc(block_bytes);
    if (!w->logits || !w->stage) {
        errf(err, errlen, "out of memory");
        goto fail;
    }
    LOG_I("model %s: %d layers, hidden %d, vocab %d, %s weights; KV pool %ld blocks of %d tokens, %s (%.1f MiB)",
          tm->path, w->cfg.num_layers, w->cfg.hidden_size, w->cfg.vocab_size, dtype_name(wdt), n_blocks,
          w->block_size, dtype_name(kvt), (double)n_blocks * (double)block_bytes / (1 << 20));
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
    kvpool_destroy(&w->pool);
    model_destroy(&w->model);
    ckpt_destroy(&w->ck);
    tok_destroy(&w->tok);
    backend_destroy(&w->be);
    free(w->logits);
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
    p->n_eos = w->cfg.n_eos < SAMPLER_MAX_EOS ? w->cfg.n_eos : SAMPLER_MAX_EOS;
    memcpy(p->eos_ids, w->cfg.eos_token_ids, (size_t)p->n_eos * sizeof(int32_t));
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
    return sampler_params_check(p, w->cfg.vocab_size, err, errlen);
}

size_t worker_block_bytes(const worker_t *w) { return kvpool_view(w->pool)->block_bytes; }

uint64_t worker_tenant_salt(const char *tenant)
{
    if (!tenant || !*tenant)
        return 0;
    return XXH3_64bits_withSeed(tenant, strlen(tenant), 0x74726f757065ULL);
}

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
    actor_send(a, cache_manager, &m);
}
