/* engine/mtp.h — DeepSeek-V3's multi-token-prediction (MTP) layer, and the proposer built on it.
 *
 * The MTP layer (model.layers.<num_layers>.* of a checkpoint with num_nextn_predict_layers) is one
 * more decoder block with its own embedding and head. At MTP position p it reads the target's
 * final hidden state h_p (before the final norm: model_batch_t.hidden_out) and the embedding of
 * token p+1, and predicts token p+2:
 *     x      = eh_proj(cat(enorm(embed(t[p+1])), hnorm(h_p)))
 *     x      = decoder_block(x)          (MLA over the MTP layer's own KV, DeepSeekMoE)
 *     logits = shared_head.head(shared_head.norm(x))
 * For more drafts the MTP layer reuses itself: its own output x at position p stands in for the
 * target's h_{p+1} at position p+1, with the drafted token's embedding.
 *
 * The MTP layer keeps its KV in a pool of its own, one layer of the target's KV shape; an MTP
 * sequence's token j is the target sequence's token j+1 (the token MTP position j embeds). */
#ifndef TROUPE_ENGINE_MTP_H
#define TROUPE_ENGINE_MTP_H

#include "engine/model.h"
#include "engine/spec.h"

/* 1 when the model was loaded with an MTP layer. */
int model_has_mtp(const model_t *m);
/* The device bytes of its weights (0 without one): not in model_weight_bytes, which counts what a
 * step of the target reads; the KV pool's sizing takes both off the device's memory. */
size_t model_mtp_weight_bytes(const model_t *m);
/* A KV pool for the MTP layer (engine/kvcache.h's kvpool_new with one layer of the model's shape). */
kvpool_t *model_mtp_pool_new(const model_t *m, int n_blocks, int block_size, dtype_t dtype, char *err, size_t errlen);

/* One MTP step over a batch of MTP sequences (in one MTP pool), on model_forward's batch rules
 * (n_new rows each; logits of each sequence's last row, or all rows with all_logits; argmax_out
 * as in model_forward). hidden: host [T][H], row i the hidden state of new row i (the target's
 * h_p, or the MTP's own output for a chained draft). hidden_out (host [T][H], may be NULL): the
 * MTP block's output of every new row, the input of a chained draft. logits (host [R][V]) may be
 * NULL. top_prob (host [R], may be NULL; needs argmax_out): each row's argmax softmax
 * probability, computed on the device with the argmax (the backend's mtp_top), so that drafting
 * brings no logits to the host. A batch of B sequences of n rows each with top_prob runs through
 * a step graph where the backend has graphs (from its second step of that shape). 0, or -1 with err. */
/* Rows row0 .. row0 + n - 1 of the last MTP step's logits into out [n][V] (host), one copy;
 * valid until the model's next step. 0, or -1 when the backend fails. */
int model_mtp_logits_rows(model_t *m, int row0, int n, float *out);
int model_mtp_forward(model_t *m, const model_batch_t *b, const float *hidden, float *logits, float *hidden_out,
                      float *top_prob, char *err, size_t errlen);

/* The MTP proposer (spec_proposer_t): greedy drafts by the MTP layer of `target`, for up to
 * max_seqs sequences of up to max_context tokens, its KV in its own pool on the target's backend
 * (f32, one layer of the target's KV shape: spec_mtp_device_bytes).
 * The target's hidden states come in through spec_mtp_feed after each target forward; propose
 * then catches the MTP layer up on every position whose next token is known and drafts k tokens
 * (the first from the target's hidden state, the rest chained on the MTP's own), rolling its KV
 * back to the target-backed positions afterwards; propose_batch runs one MTP forward per draft
 * position for all asking sequences, and stops a sequence's drafts once the product of their
 * probabilities is below its stop_below. probs gets each draft's MTP softmax probability.
 * NULL with err (no MTP layer, out of memory). */
spec_proposer_t *spec_mtp_new(model_t *target, int max_seqs, int max_context, char *err, size_t errlen);
/* Hands the proposer the target's hidden states (model_batch_t.hidden_out rows) of sequence id at
 * target positions pos0 .. pos0+n-1, whose tokens are final (a prompt, or a verify step's rows up
 * to its last accepted draft: never a rejected draft's row); tokens[0..n_tokens) are the tokens
 * known now. Rows of positions the MTP layer already has are ignored. Positions whose next token
 * is known run through the MTP layer now, the others (at most SPEC_MAX_K + 2) wait for it.
 *
 * The MTP sequence begins at the first position fed: a sequence never fed before (or fed with a
 * gap, pos0 past what it has: its MTP KV is dropped) starts at pos0, and its MTP layer then
 * attends over positions pos0 on only. A decode worker that did not compute a prompt (the prefill
 * worker did, and handed over the target's KV but no hidden states) thus drafts from the positions
 * it computed itself. Its MTP positions count from 0 at pos0: RoPE scores depend on the distance
 * between positions only, so the shift changes nothing but rounding. 0, or -1 with err. */
int spec_mtp_feed(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n_tokens, int pos0, int n,
                  const float *hidden, char *err, size_t errlen);

/* spec_mtp_feed for several sequences (one feed each) at once: the rows that can run go through
 * the MTP layer together, in as few forwards as the model's buffers allow. A feed that fails (bad
 * rows) drops its sequence, which begins again at its next feed; the others go on. A new sequence
 * when all max_seqs are taken takes the place of the one fed longest ago (not in this call).
 * 0, or -1 with err naming the first failure. */
typedef struct spec_mtp_feed {
    uint64_t id;
    const int32_t *tokens;         /* [n_tokens] the tokens known now */
    int n_tokens;
    int pos0, n;                   /* the target positions of the hidden rows */
    const float *hidden;           /* [n][hidden_size] */
    int sampled;                   /* a drawing request's (sampler_draws): the MTP keeps the logits of
                                    * its newest position, so that a sampled proposal draws its drafts
                                    * from the MTP's distribution (spec_dist) instead of taking its argmax */
} spec_mtp_feed_t;
int spec_mtp_feed_batch(spec_proposer_t *p, const spec_mtp_feed_t *feeds, int n, char *err, size_t errlen);

/* A host buffer [*rows][*hidden_size] for model_batch_t.hidden_out of the target's forwards, rows =
 * the target model's max_tokens (a step's new rows at most), owned by the proposer; NULL when p is
 * not an MTP proposer. */
float *spec_mtp_hidden_buffer(spec_proposer_t *p, int *rows, int *hidden_size);

/* The device bytes spec_mtp_new(target with config c, max_seqs, max_context) places: its KV pool
 * (the MTP layer's weights are the target's, loaded with it). For a target that sizes its KV pool
 * from the free memory (engine_spec_t.kv_reserve_bytes), as spec_draft_device_bytes is. */
double spec_mtp_device_bytes(const model_config_t *c, int max_seqs, int max_context);

/* What an MTP proposer did, for stats and tests (all 0 for another proposer). */
typedef struct spec_mtp_stats {
    uint64_t forwards;             /* MTP forwards run (catch-up chunks and chained drafts) */
    uint64_t rows;                 /* positions they computed */
    uint64_t starts;               /* sequences begun (a first feed, or a gap) */
    uint64_t started_late;         /* of them, begun at a position > 0 (no hidden states before it) */
    uint64_t evicted;              /* sequences dropped to make room for another (every slot taken: the one
                                      fed longest ago goes, and begins again at its next feed) */
    int seqs;                      /* sequences tracked now */
    uint64_t padded;               /* forwards padded to equal rows per sequence (graph replays; spec_mtp.c) */
    uint64_t logits_copies;        /* copies of sampled sequences' logits to the host (one a forward where
                                      their rows lie close, else one a sequence) */
    double feed_seconds;           /* wall time in spec_mtp_feed(_batch): the kept positions' MTP forwards */
    double propose_seconds;        /* wall time in proposals: catch-up and the chained drafts' forwards */
} spec_mtp_stats_t;
void spec_mtp_stats(const spec_proposer_t *p, spec_mtp_stats_t *out);
/* Pads forwards of unequal rows (up to 16 sequences) to equal rows with filler positions, as the
 * proposer does on its own where the backend has graphs (on: 1), or never (0); for tests: the
 * drafts must not change. */
void spec_mtp_pad(spec_proposer_t *p, int on);
/* Target position the MTP sequence of id begins at (-1: not tracked); for tests. */
int spec_mtp_base(const spec_proposer_t *p, uint64_t id);

#endif
