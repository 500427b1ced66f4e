/* kernels/cpu/cpu_sample.h — the `sample` op's reference on one row of logits, as plain functions:
 * the CPU backend's op runs it per row, and the host sampler (engine/sampler.c) runs it after the
 * request's penalties, so the host and the CPU backend cannot disagree. Semantics: the `sample`
 * op in kernels/backend.h (engine/sampler.h's steps 3-7); randomness: kernels/sample_rng.h. */
#ifndef TROUPE_KERNELS_CPU_SAMPLE_H
#define TROUPE_KERNELS_CPU_SAMPLE_H

#include <stdint.h>

#include "kernels/backend.h"

/* Steps 3-7 on one row of V logits (no penalties): the token, and (lp_processed, may be NULL) the
 * log of the probability it was drawn with (greedy: log_softmax of the row). Scratch: work [V]
 * (may be logits itself, which is then overwritten), mass [V], idx [V]. Never allocates. */
int32_t cpu_sample_row(const float *logits, int V, const bk_sample_t *sp, float *work, float *mass, int32_t *idx,
                       float *lp_processed);
/* Steps 3-6 on one row (no penalties): the distribution cpu_sample_row draws from, as the kept
 * tokens' masses (exp(l / T - max)) in work [V], 0 for every token dropped (temperature 0: 1 at
 * the argmax), and their total, summed in ascending id in double, returned: p = work / total.
 * Speculative decoding's rejection rule needs the whole distribution (engine/spec.h). Scratch as
 * cpu_sample_row (work may be logits itself). */
double cpu_sample_mass(const float *logits, int V, const bk_sample_t *sp, float *work, float *mass, int32_t *idx);
/* log_softmax(v)[t] over all n entries, the sum in double. */
float cpu_log_softmax_at(const float *v, int n, int32_t t);

#endif
