/* actors/worker/step_scratch.c — a decode step's per-row scratch (step_scratch.h). */
#include "actors/worker/step_scratch.h"

#include <stdlib.h>

int step_scratch_init(step_scratch_t *r, int max_seqs)
{
    r->seqs = calloc((size_t)max_seqs, sizeof *r->seqs);
    r->argmax = calloc((size_t)max_seqs, sizeof *r->argmax);
    r->sample = calloc((size_t)max_seqs, sizeof *r->sample);
    r->need_logits = calloc((size_t)max_seqs, 1);
    return r->seqs && r->argmax && r->sample && r->need_logits ? 0 : -1;
}

void step_scratch_free(step_scratch_t *r)
{
    free(r->seqs);
    free(r->argmax);
    free(r->sample);
    free(r->need_logits);
    *r = (step_scratch_t){0};
}
