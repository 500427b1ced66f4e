/* engine/graph_warmup.c — the decode and verify steps' CUDA graphs recorded before serving
 * (model.h model_graph_warmup says when and why). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/model_internal.h"

int model_graph_warmup(model_t *m, kvpool_t *pool, int plain_rows, int verify_rows, int max_n, int *recorded,
                       char *err, size_t errlen)
{
    *recorded = 0;
    if (!m->be->ops->graph_begin || m->opts.no_graphs || m->graph_off || m->ep)
        return 0;   /* nothing is recorded (this backend, or an expert-parallel group's lockstep): nothing to warm */
    const int max_seqs = m->opts.max_seqs;
    plain_rows = plain_rows < max_seqs ? plain_rows : max_seqs;
    verify_rows = verify_rows < max_seqs ? verify_rows : max_seqs;
    max_n = max_n < MODEL_GRAPH_MAX_N ? max_n : MODEL_GRAPH_MAX_N;
    const int rows = plain_rows > verify_rows ? plain_rows : verify_rows;
    if (rows < 1)
        return 0;
    kvseq_t **kv = calloc((size_t)rows, sizeof *kv);
    model_seq_t *seqs = calloc((size_t)rows, sizeof *seqs);
    int32_t *ids = calloc((size_t)rows * (size_t)(max_n > 1 ? max_n : 1), sizeof *ids);
    int32_t toks[MODEL_GRAPH_MAX_N] = {0};   /* token 0: any id of the vocabulary does */
    int rc = 0;
    if (!kv || !seqs || !ids)
        rc = errf(err, errlen, "%s: graph warm-up: out of memory", m->where);
    for (int i = 0; rc == 0 && i < rows; i++)
        if (!(kv[i] = kvseq_new(pool, max_n, 0)))
            rc = errf(err, errlen, "%s: graph warm-up: no KV sequence for row %d", m->where, i);
    const uint64_t rec0 = m->graph_records;
    /* The largest steps first: the scratch buffers reach their size before the smaller shapes are
     * recorded. Each shape twice: run op by op, then recorded (engine/forward.c s_graph_step). */
    for (int n = max_n; rc == 0 && n >= 1; n--) {
        const int top = n == 1 ? plain_rows : verify_rows;
        for (int B = top; rc == 0 && B >= 1; B--) {
            if (B * n > m->opts.max_tokens || B * n > m->opts.max_logit_rows)
                continue;
            for (int rep = 0; rc == 0 && rep < 2 && !m->graph_off; rep++) {
                for (int i = 0; rc == 0 && i < B; i++) {
                    if (kvseq_truncate(kv[i], 0) != 0 || kvseq_append(kv[i], toks, n) != 0)
                        rc = errf(err, errlen, "%s: graph warm-up: the KV pool has no block for row %d", m->where, i);
                    seqs[i] = (model_seq_t){.kv = kv[i], .n_new = n, .n_logits = n > 1 ? n : 0};
                }
                const model_batch_t b = {.n_seqs = B, .seqs = seqs, .argmax_out = ids};
                if (rc == 0 && model_forward(m, &b, NULL, err, errlen) != 0)
                    rc = -1;
            }
        }
    }
    *recorded = (int)(m->graph_records - rec0);
    for (int i = 0; kv && i < rows; i++)
        kvseq_destroy(&kv[i]);
    free(kv);
    free(seqs);
    free(ids);
    return rc;
}
