/* engine/model_internal.h — the model's state, shared by model_load.c and forward.c (internal).
 * Every pointer named "device" belongs to the backend and is only passed to its ops. */
#ifndef TROUPE_ENGINE_MODEL_INTERNAL_H
#define TROUPE_ENGINE_MODEL_INTERNAL_H

#include "engine/model.h"

#define MODEL_PROF_SLOTS 16       /* profile categories (engine/forward.c) */

typedef struct model_layer {
    float *attn_norm;             /* device [H] f32: input_layernorm */
    float *mlp_norm;              /* device [H] f32: post_attention_layernorm */
    bk_mat_t q, k, v, o;          /* [nH*D][H], [nKV*D][H], [nKV*D][H], [H][nH*D] */
    bk_mat_t qkv;                 /* q, k, v as one matrix (they are its row ranges), or data NULL */
    float *q_bias, *k_bias, *v_bias, *o_bias;   /* device f32, or NULL without attention_bias */
    float *q_norm, *k_norm;       /* device [D] f32 (Qwen3), or NULL */
    int is_moe;
    bk_mat_t gate, up, down;      /* dense MLP: [I][H], [I][H], [H][I] */
    bk_mat_t gate_up;             /* dense MLP: gate, up as one matrix (row ranges), or data NULL */
    bk_mat_t router;              /* MoE: [E][H] */
    bk_expert_t *experts;         /* MoE: host [E], each pointing at device weights */
} model_layer_t;

struct model {
    model_config_t cfg;
    model_opts_t opts;
    backend_t *be;
    char where[256];              /* the model directory, for messages */

    bk_mat_t embed;               /* [V][H] model.embed_tokens.weight */
    bk_mat_t lm_head;             /* [V][H]: lm_head.weight, or embed when tied */
    float *final_norm;            /* device [H] f32: model.norm.weight */
    model_layer_t *layers;        /* host [num_layers] */
    float *inv_freq;              /* device [D/2] f32 */
    float scale;                  /* head_dim^-0.5 */
    int max_i;                    /* widest FFN (dense or expert), sizes g/u */

    const void **weights;         /* host [n_weights]: device pointers from weight_put, to release */
    int n_weights, cap_weights;
    void **allocs;                /* host [n_allocs]: device buffers from alloc, to free */
    int n_allocs, cap_allocs;

    /* Per-step metadata: host staging and its device copy (sizes from opts). */
    int max_bt;                   /* block-table entries per step */
    int32_t *h_meta;              /* host: ids [T] | tok_seq [T] | tok_pos [T] | out_rows [R] | bt_start [S] | bt [max_bt] */
    int32_t *d_meta;              /* device, same layout */

    /* Activations (device, f32), T = opts.max_tokens rows. */
    float *res;                   /* [T][H] residual stream */
    float *xn;                    /* [T][H] normed input of the current block */
    float *delta;                 /* [T][H] the current block's output, added to res by the next norm */
    float *qkv;                   /* q [T][nH*D], then k [T][nKV*D], then v [T][nKV*D] (T of the step) */
    float *att;                   /* [T][nH*D] */
    float *gu;                    /* gate [T][I], then up [T][I] (T of the step, I of the layer) */
    float *rlogits;               /* [T][E] router logits */
    int32_t *moe_ids;             /* [T][k] */
    float *moe_w;                 /* [T][k] */
    void *moe_scratch;            /* moe_scratch_bytes(T, k, H, moe_I, E) */
    struct ep *ep;                /* expert parallelism: the MoE layers run through the group (engine/ep.h); NULL: local */
    uint32_t *moe_counts;         /* [layers][E] tokens routed to each expert since the last model_expert_load (device) */
    float *rows;                  /* [R][H] final-normed rows that get logits */
    float *logits;                /* [R][V] */
    int32_t *argmax;              /* [R] (reserved for device-side greedy) */

    size_t weight_bytes, active_weight_bytes;

    /* Decode-step graphs (the backend's graph hooks; forward.c): graphs[B] replays the ops from the
     * embedding to the logits of a step of B one-row sequences; graph_runs[B]: 0 none of that size
     * yet, 1 one ran uncaptured, 2 never recorded (an op of it may not be: MoE's host path). Both
     * [opts.max_seqs + 1], made at the first such step. */
    void **graphs;
    uint8_t *graph_runs;
    const void *graph_kv;         /* the KV pool the graphs address (another pool: all dropped) */
    int graph_off;                /* 1: never (opts.no_graphs, the backend refused, a recording failed) */
    uint64_t graph_records, graph_replays;

    /* TROUPE_PROFILE=1: wall time per op category (forward.c's P_* list). */
    int prof;
    int64_t prof_ns[MODEL_PROF_SLOTS];
    int64_t prof_calls[MODEL_PROF_SLOTS];
};

/* model_load.c's placement helpers, shared with model_quant.c: a device buffer freed at destroy
 * (NULL with err naming `what`), and a weight_put pointer released at destroy (-1: released now). */
void *model_alloc(model_t *m, size_t bytes, const char *what, char *err, size_t errlen);
/* One routed expert's weights from ck (engine/model_load.c), e.g. an expert a new placement moves
 * here; they stay the model's until model_release_mat. 0, or -1 with err. */
int model_load_expert(model_t *m, ckpt_t *ck, int l, int e, bk_expert_t *x, char *err, size_t errlen);
/* Releases one weight matrix the model placed (its data and scales) before model_destroy. */
void model_release_mat(model_t *m, const bk_mat_t *w);

/* Allocates and zeroes moe_counts (engine/model_expert_load.c); 0, or -1 with err. */
int model_expert_load_init(model_t *m, char *err, size_t errlen);
int model_keep_weight(model_t *m, const void *dev, char *err, size_t errlen);
/* Quantized weights (engine/model_quant.c). model_quant_of: 1 when the 2-D weight `name` is loaded
 * quantized (the checkpoint's quantization_config, or online quantization at load), else 0.
 * model_qmat: loads it so (codes, f32 scales), or quantizes the plain tensor; errors name the tensor. */
int model_quant_of(const model_t *m, const ckpt_t *ck, const char *name);
int model_qmat(model_t *m, ckpt_t *ck, bk_mat_t *out, const char *name, int64_t rows, int64_t cols, char *err,
               size_t errlen);

/* Frees every decode-step graph (forward.c). */
void model_graphs_drop(model_t *m);

#endif
