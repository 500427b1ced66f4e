/* engine/model_internal.h — the model's state, shared by model_load.c and forward.c (internal).
 * Every pointer named "device" belongs to the backend and is only passed to its ops. */
#ifndef TROUPE_ENGINE_MODEL_INTERNAL_H
#define TROUPE_ENGINE_MODEL_INTERNAL_H

#include "engine/model.h"

#define MODEL_PROF_SLOTS 16       /* profile categories (engine/forward.c) */
#define MODEL_GRAPH_MAX_N 16      /* new rows per sequence a step graph may have (a token and 15 drafts) */
#define MTP_JOIN_ROWS 64          /* MTP steps of up to this many rows bring their outputs in one download */

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
    float *router_bias;           /* MoE, dummy weights with a router skew: device [E] f32 added to the
                                     router logits (engine/router_skew.h); else NULL */
    double skew_target;           /* the busiest/average expert load that bias aims at (0: none) */
    double skew_sigma;            /* the spread of this layer's router logits the bias is scaled by */
    double skew_measured;         /* busiest/average measured in the last round of the fit on the model */
    bk_expert_t *experts;         /* MoE: host [E], each pointing at device weights */
    /* DeepSeek-V3 (engine/mla_load.c). MLA: q_a [qr][H] and q_b [nH*qk][qr], or q [nH*qk][H] when
     * q_lora_rank is null; kv_a [kvr+dr][H]; kv_b [nH*(dn+dv)][kvr] re-laid per head for the
     * absorbed form as w_uk_t [nH*kvr][dn] (head h's K rows, transposed) and w_uv [nH*dv][kvr];
     * o [H][nH*dv]. MoE: e_bias [E] (e_score_correction_bias); shared experts in gate/up/down. */
    bk_mat_t q_a, q_b, kv_a, w_uk_t, w_uv;
    float *q_a_norm, *kv_a_norm;  /* device f32 [qr], [kvr] */
    float *e_bias;                /* device f32 [E] */
    int has_shared;
} model_layer_t;

/* DeepSeek-V3's multi-token-prediction layer (engine/mla_load.c, engine/mtp.c): the MTP block is
 * layer num_layers of the checkpoint; its KV lives in a pool of its own (one layer). */
typedef struct model_mtp {
    model_layer_t layer;
    bk_mat_t embed, head;            /* [V][H] each */
    bk_mat_t eh_e, eh_h;             /* eh_proj [H][2H]'s column halves [H][H]: on enorm(embed), on hnorm(h) */
    float *enorm, *hnorm, *norm;     /* device f32 [H] */
    size_t weight_bytes;             /* the checkpoint's bytes of layer num_layers, all of it placed */
    int32_t *top;                    /* device, 2 max_logit_rows + MTP_JOIN_ROWS x H words: mtp_top's ids
                                        [R], its f32 probabilities [R], then (T <= MTP_JOIN_ROWS) a copy
                                        of the block's output [T][H]: one download for the three */
    int32_t *h_top;                  /* host, the same */
    /* MTP step graphs (engine/mtp.c, as the decode-step graphs below): graphs[slot] replays the
     * ops from the embedding to the drafts of B sequences of n new rows each (logits of each
     * one's last row, or of every row); graph_runs as graph_runs below.
     * [(opts.max_seqs + 1) x MODEL_GRAPH_MAX_N x 2], made at the first such step. */
    void **graphs;
    uint8_t *graph_runs;
    const void *graph_kv;            /* the MTP pool the graphs address (another: all dropped) */
} model_mtp_t;

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
    int32_t *h_meta;              /* host: ids [T] | tok_seq [T] | tok_pos [T] | out_rows [R] | bt_start [S] |
                                     seq_row0 [S + 1] | bt [max_bt] */
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
    char router_skew[160];        /* model_router_skew: "uniform-random" or the skew's spec */
    double *skew_share;           /* router skew: host [layers][E] target share per expert, or NULL */
    float *skew_bias;             /* router skew: host [layers][E] the bias as last uploaded */
    long skew_tokens;             /* tokens the fit on the model prefilled (model_router_skew_calibrate) */

    /* DeepSeek-V3 (engine/mla.c): MLA and routed-MoE activations, sized for T rows; the RoPE
     * part's cos/sin multiplier (YaRN's attention factor); the MTP layer, or NULL. */
    float *mla_buf;
    float rope_mul;
    model_mtp_t *mtp;
    float *hid_in;                /* [T][H] MTP: the target's hidden states of this step's rows */

    /* Decode- and verify-step graphs (the backend's graph hooks; forward.c): graphs[slot] replays
     * the ops from the embedding to the logits of a step of B sequences of n new rows each (n up
     * to MODEL_GRAPH_MAX_N), with logits of every row or of each sequence's last; graph_runs[slot]:
     * 0 none of that bucket yet, 1 one ran uncaptured, 2 never recorded (an op of it may not be:
     * MoE's host path). Both [(opts.max_seqs + 1) x MODEL_GRAPH_MAX_N x 2], made at the first
     * such step. */
    void **graphs;
    uint8_t *graph_runs;
    const void *graph_kv;         /* the KV pool the graphs address (another pool: all dropped) */
    int graph_off;                /* 1: never (opts.no_graphs, the backend refused, a recording failed) */
    uint64_t graph_records, graph_replays;
    uint64_t graph_rerecords;     /* records of a shape whose graph went stale (a scratch buffer grew) */

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

/* The router bias of opts.router_skew on every MoE layer (engine/router_skew.c), after the
 * weights are placed; 0, or -1 with err (a real checkpoint, a bad spec or table). */
int model_router_skew_apply(model_t *m, ckpt_t *ck, char *err, size_t errlen);

/* Allocates and zeroes moe_counts (engine/model_expert_load.c); 0, or -1 with err. */
int model_expert_load_init(model_t *m, char *err, size_t errlen);
/* 0 when TROUPE_MOE_COUNT=0: no MoE layer counts its experts' load (engine/forward.c). */
int model_moe_count_on(void);
int model_keep_weight(model_t *m, const void *dev, char *err, size_t errlen);
/* Quantized weights (engine/model_quant.c). model_quant_of: 1 when the 2-D weight `name` is loaded
 * quantized (the checkpoint's quantization_config, or online quantization at load), else 0.
 * model_qmat: loads it so (codes, f32 scales), or quantizes the plain tensor; errors name the tensor. */
int model_quant_of(const model_t *m, const ckpt_t *ck, const char *name);
int model_qmat(model_t *m, ckpt_t *ck, bk_mat_t *out, const char *name, int64_t rows, int64_t cols, char *err,
               size_t errlen);

/* Frees every decode-step graph (forward.c). */
void model_graphs_drop(model_t *m);

/* Profile categories (TROUPE_PROFILE=1): PROF(m, cat, op call) syncs the backend around the call. */
enum { P_EMBED, P_NORM, P_QKV, P_QK_NORM, P_ROPE, P_KV_STORE, P_ATTENTION, P_O, P_GATE_UP, P_SWIGLU, P_DOWN,
       P_MOE_ROUTE, P_MOE_FFN, P_LM_HEAD, P_ARGMAX, P_DOWNLOAD, P_COUNT };
_Static_assert(P_COUNT <= MODEL_PROF_SLOTS, "profile categories fit model_t's arrays");

#define PROF(m, cat, call)                                                                                \
    do {                                                                                                  \
        if (!(m)->prof) {                                                                                 \
            call;                                                                                         \
            break;                                                                                        \
        }                                                                                                 \
        (m)->be->ops->sync((m)->be);                                                                      \
        int64_t t0_ = now_ns();                                                                           \
        call;                                                                                             \
        (m)->be->ops->sync((m)->be);                                                                      \
        (m)->prof_ns[cat] += now_ns() - t0_;                                                              \
        (m)->prof_calls[cat]++;                                                                           \
    } while (0)

/* DeepSeek-V3 (engine/mla_load.c, engine/mla.c). mla_load_attention: layer l's MLA weights
 * (`prefix` "model.layers.<l>"), adding their bytes to *bytes; mla_load_moe_extra: the MoE layer's
 * e_score_correction_bias and shared experts; mla_load_rope: inv_freq and rope_mul for the RoPE
 * part; mla_load_buffers: mla_buf (and the MTP layer when the checkpoint has one). All 0 or -1 with err. */
int mla_load_attention(model_t *m, ckpt_t *ck, const char *prefix, model_layer_t *L, size_t *bytes, char *err,
                       size_t errlen);
int mla_load_moe_extra(model_t *m, ckpt_t *ck, const char *prefix, model_layer_t *L, size_t *bytes, char *err,
                       size_t errlen);
int mla_load_rope(model_t *m, char *err, size_t errlen);
int mla_load_buffers(model_t *m, ckpt_t *ck, char *err, size_t errlen);
size_t mla_buf_floats(const model_config_t *c);   /* mla_buf floats per row */
void mla_free(model_t *m);                        /* host memory of the MTP layer (model_destroy) */
/* model_load.c's loaders, for engine/mla_load.c: one 2-D weight (quantized when the model
 * quantizes it), one 1-D tensor as f32, a layer's router and routed experts (layer index l in
 * the names), and a SwiGLU MLP <prefix>.{gate,up,down}_proj of width I into L's gate/up/down. */
int model_mat(model_t *m, ckpt_t *ck, bk_mat_t *out, int64_t rows, int64_t cols, const char *name, char *err,
              size_t errlen);
float *model_vec(model_t *m, ckpt_t *ck, int64_t n, const char *name, char *err, size_t errlen);
int model_load_moe(model_t *m, ckpt_t *ck, int l, model_layer_t *L, char *err, size_t errlen);
int model_load_dense_mlp(model_t *m, ckpt_t *ck, const char *prefix, int I, model_layer_t *L, char *err,
                         size_t errlen);
/* YaRN / default / linear inverse frequencies [qk_rope_head_dim / 2] and the cos/sin multiplier. */
int mla_inv_freq(const model_config_t *cfg, float *inv_freq, float *mul, char *err, size_t errlen);
/* xn -> delta: MLA attention of layer L (its KV in layer kv_layer of kv). */
void mla_attention(model_t *m, const model_layer_t *L, int kv_layer, int T, const bk_kv_t *kv,
                   const bk_attn_meta_t *meta);
/* xn -> delta: DeepSeek-V3's MoE block of layer L: sigmoid, group-limited routing, the routed
 * experts, plus the shared experts (counted under expert-load layer l, or not when l < 0). */
void mla_moe(model_t *m, const model_layer_t *L, int l, int T);
/* xn -> delta: L's dense SwiGLU MLP (gate, up, down) over T rows (engine/forward.c). */
void model_mlp_dense(model_t *m, const model_layer_t *L, int T);
/* forward.c's step metadata for another stack of layers on the same batch rules (engine/mtp.c):
 * the batch's ids, positions, block tables and logits rows uploaded, meta pointing at them. */
int model_step_layout(model_t *m, const model_batch_t *b, int T, int R, bk_attn_meta_t *meta, int32_t **d_ids,
                      int32_t **d_rows, char *err, size_t errlen);

#endif
