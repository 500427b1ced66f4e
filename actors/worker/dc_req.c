/* actors/worker/dc_req.c — a decode worker's request: made, freed (dc_req.h). */
#include "actors/worker/dc_req.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

dc_req_t *dc_req_new(const worker_t *w, const msg_t *h, char *err, size_t errlen)
{
    const msg_handoff_t *hh = &h->u.handoff;
    dc_req_t *r = calloc(1, sizeof *r);
    char cerr[256];
    if (!r || msg_clone(h, &r->handoff, cerr, sizeof cerr) != 0 ||
        !(r->toks = malloc((size_t)w->max_model_len * sizeof *r->toks)) ||
        !(r->kv = kvseq_new(w->eng->pool, w->max_model_len, hh->tenant_salt))) {
        errf(err, errlen, "decode out of memory");
        dc_req_destroy(&r);
        return NULL;
    }
    r->sr.id = h->id;
    /* The prompt's ids are below vocab_size: valid int32, the same bytes. */
    memcpy(r->toks, hh->tokens, hh->n_tokens * sizeof *r->toks);
    sampler_params_t sp;
    if (worker_sampler_params(w, &hh->sampling, &sp, err, errlen) != 0 ||
        !(r->smp = sampler_new(&sp, w->eng->cfg.vocab_size, r->toks, (int)hh->n_tokens, err, errlen))) {
        dc_req_destroy(&r);
        return NULL;
    }
    if (w->tok) {
        tok_stream_init(&r->ts, w->tok);
        r->ts.skip_special = 1;
    }
    return r;
}

void dc_req_destroy(dc_req_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dc_req_t *r = *self_p;
    kvseq_destroy(&r->kv);
    sampler_destroy(&r->smp);
    msg_free(&r->handoff);
    free(r->toks);
    free(r->fetch.hints);
    fetch_src_clear(&r->fetch.src);
    free(r);
    *self_p = NULL;
}
