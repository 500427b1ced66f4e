/* actors/worker/step_scratch.h — a decode step's scratch, a row each: what its forward takes (the
 * sequences, each row's sampling parameters for the device, the rows whose logits come to the
 * host) and what it gives back (the device's ids). Made once at start-up for the worker's max_seqs
 * rows, so the per-token path allocates nothing; the step fills them (actors/decode.c). */
#ifndef TROUPE_ACTORS_WORKER_STEP_SCRATCH_H
#define TROUPE_ACTORS_WORKER_STEP_SCRATCH_H

#include <stdint.h>

#include "engine/model.h"

typedef struct step_scratch {
    model_seq_t *seqs;           /* [max_seqs] the forward's sequences */
    int32_t *argmax;             /* [max_seqs] the device's ids of a step (argmax or sampled) */
    bk_sample_t *sample;         /* [max_seqs] each row's sampling parameters for the device */
    uint8_t *need_logits;        /* [max_seqs] rows whose logits the host sampler needs */
} step_scratch_t;

/* Zeroed rows for max_seqs; -1: out of memory (step_scratch_free frees what was made). */
int step_scratch_init(step_scratch_t *r, int max_seqs);
/* Frees them (again: nothing). */
void step_scratch_free(step_scratch_t *r);

#endif
