/* actors/worker/worker.h — what a prefill or decode actor holds of the engine: the model opened
 * from the topology's model section (engine/engine_open.h: a replica on a backend and its paged KV
 * pool) and the tokenizer; plus the bridges between wire messages and the engine (sampling
 * parameters, KV blocks).
 *
 * Sizing: the KV pool has limits.kv_blocks blocks, or (0) enough for max_batch sequences of
 * max_model_len tokens plus a prefix-cache margin, as far as this worker's share of the memory
 * goes (engine_open.h's rule: a quarter of host memory on the CPU; on a GPU, 90% of what was free
 * less every model worker's weights, split among the GPU's model workers, decode ones weighing 3). */
#ifndef TROUPE_WORKER_H
#define TROUPE_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "actors/runtime/actor.h"
#include "engine/engine_open.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "engine/tokenizer.h"
#include "messages/msg.h"
#include "topology/topology.h"
#include "transfer/kv_transfer.h"      /* KVX_IPC_HANDLE_BYTES */

typedef struct worker {
    engine_t *eng;               /* the open model: its config, backend, weights, KV pool (this worker's
                                    blocks) and the host buffer of logits ([max_logit_rows][vocab]) */
    tokenizer_t *tok;            /* NULL when the model directory has none (token-id prompts only) */
    int block_size;              /* tokens per KV block (topology cache.block_size) */
    int max_tokens;              /* tokens per forward (prefill chunk or decode batch) */
    int max_seqs;                /* sequences per forward */
    int max_model_len;           /* prompt + generation, tokens */
    int max_logit_rows;          /* rows of logits per forward: max_seqs, or for a decode worker that
                                    speculates (TROUPE_SPECULATION) max_seqs x (1 + k) within max_tokens,
                                    so a verify step's rows (a row and its drafts) fit */
    uint8_t *stage;              /* [block_bytes] host staging for block copies */
    spec_proposer_t *draft;      /* decode, TROUPE_SPECULATION=draft[:K]: the draft model (model.draft) on
                                    this worker's backend, its own KV pool; mtp[:K]: the model's MTP
                                    layer (engine/mtp.h), its own KV pool; NULL otherwise */
    int ipc_ok;                  /* the pool can be shared with processes on the same GPU */
    uint8_t ipc_handle[KVX_IPC_HANDLE_BYTES];   /* its CUDA IPC handle + size, when ipc_ok */
    struct expert_group *experts; /* the expert-parallel group this worker is a rank of (topology ep > 1), or NULL */
} worker_t;

/* Loads the model of topology t for instance self of `role` (prefill or decode: sizes its share
 * of the device's memory for KV) on its GPU (CUDA backend; -1 = device 0); a decode instance of an
 * actor with ep > 1 joins its expert-parallel group (actors/worker/expert_group.h). max_tokens / max_seqs
 * size the forward. A decode worker with TROUPE_SPECULATION=draft[:K] also opens model.draft
 * (engine/spec.h's draft proposer: max_seqs sequences of max_model_len), refusing a draft with
 * another tokenizer (a configuration error naming both models) and the knob without model.draft;
 * with mtp[:K] it makes the MTP proposer (a model without an MTP layer: a configuration error). On failure *config_error says whether the topology itself is at fault (the
 * model's config, its weights' files, dtype or shapes, a model the device cannot hold, the KV
 * dtype or pool: ENGINE_ERR_CONFIG, exit ACTOR_EXIT_CONFIG) rather than the moment (host memory,
 * the device). */
worker_t *worker_load(const topo_t *t, topo_role_t role, const topo_instance_t *self, int max_tokens, int max_seqs,
                      int *config_error, char *err, size_t errlen);
void worker_destroy(worker_t **self_p);

/* Engine sampling parameters from a request's wire parameters (EOS ids from the model). */
int worker_sampler_params(const worker_t *w, const msg_sampling_t *s, sampler_params_t *out,
                          char *err, size_t errlen);

/* Bytes of one KV block of this worker's pool. */
size_t worker_block_bytes(const worker_t *w);

/* Tells the cache-manager (none: nothing) that `holder` now holds kv's full blocks in its pool
 * (cache_put, device tier), so the router sends requests with the same prefix there. */
void worker_publish_blocks(actor_t *a, const char *holder, const char *cache_manager, const kvseq_t *kv, int block_size);

#endif
