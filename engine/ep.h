/* engine/ep.h — expert parallelism: the routed experts of every MoE layer spread over the ranks of
 * a group of processes, a token's hidden state sent to the ranks that hold its experts and the
 * weighted results sent back (dispatch / combine), and placements (which rank's slot holds which
 * expert, with replicas for hot experts) applied while the group keeps serving.
 *
 * The group's lockstep (docs/experts.md says why): every rank may run its own batch (attention
 * data-parallel: each worker its own requests, KV and schedule), and every forward of any rank is
 * one step of the whole group, every rank taking part, one with no rows too:
 *   1. step header: every rank sends every other rank a fixed header (ep_hdr_t) with the group's
 *      step number, its rows in this step (0 for a rank that only joins) and the placement it has
 *      loaded (ready_epoch); rank 0's also says the placement epoch the step computes with, and
 *      whether a new placement table follows (then sent in the same step). A step whose ranks all
 *      have no rows is empty (no MoE rounds): how draining ranks agree to leave together;
 *   2. then one round per MoE layer, in layer order: headers again (the layer, how many entries
 *      (token, expert) the sender sends that rank), dispatch (each entry's hidden state [H], its
 *      routing weight and the rank's slot index), every rank runs its slots' experts over the
 *      entries it received (the backend's moe_ffn with one expert per entry, so each result is
 *      weight * expert(x), rounded as moe_ffn rounds it; a sender's entries through moe_ffn_as
 *      with the sender's rows where the backend has it, so they get the arithmetic the sender's
 *      own moe_ffn over its rows would pick: CUDA's f32 or bf16 activations), and combine: the
 *      results go back, and each sender adds each token's results in ascending expert order, as
 *      moe_ffn does, so a rank's output is the single-process output for its rows (bit for bit
 *      on the CPU; on CUDA too while each expert has one replica: the host path's matmuls, f32
 *      experts past 64 rows, also depend on an expert's rows, which replicas split).
 * A rank with rows runs the step from model_forward (ep_moe_layer: the header at the first MoE
 * layer); a rank without rows joins when a peer's header arrives (ep_pending, then ep_join: an
 * empty round per MoE layer). A rank that has only ever joined (a troupe-expert-rank process
 * holding experts for a worker: ep_follow) is the same protocol with no rows ever.
 *
 * Placements: a table per MoE layer of n_slots = n_ranks * slots_per_rank expert ids (rank r
 * holds slots r*spr .. r*spr+spr-1; engine/eplb.h computes them). A token's choice of expert e
 * goes to one of e's replicas, the replicas taking turns within a rank's step, so a hot expert's
 * tokens split evenly. A new placement (ep_propose, on rank 0) goes to every rank with the next
 * step's header; each rank then loads the experts it lacks beside the ones it runs, one layer per
 * round, and reports it ready; when every rank is, rank 0 switches the whole group at the start
 * of a step (the epoch in its step header). Experts a rank no longer holds are released after the switch.
 *
 * The transport is an ep_comm_t: unix-socket pairs between the processes of one host (ep_sock.c),
 * or NCCL between GPUs (ep_nccl.c) for the dispatch and the combine, with the headers on the
 * sockets (ep_comm_t.ctrl); ep_meet picks one when the group meets. Over the sockets the dispatch
 * is packed and the combine added on the host; over NCCL both stay in device memory (gathered by
 * token into a block per rank, the results gathered back in expert order and added: the host's
 * additions in the host's order), unless TROUPE_EP_DEVICE_PACK=0 stages them through the host.
 * A peer that dies (EOF), a broken header or a deadline ends the
 * group: the call fails with the error naming the rank, and the group stays failed. */
#ifndef TROUPE_ENGINE_EP_H
#define TROUPE_ENGINE_EP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/checkpoint.h"
#include "engine/model.h"

#define EP_MAX_RANKS 64
#define EP_FIRST_DEADLINE_MS 300000   /* the first round waits for every rank to load its weights */
#define EP_ROUND_DEADLINE_MS 30000    /* any later exchange */

/* ---- transport ---------------------------------------------------------------------------- */

typedef struct ep_comm ep_comm_t;

typedef struct ep_comm_ops {
    const char *name;
    /* 1: the buffers given to exchange are device memory of the model's backend (NCCL), 0: host. */
    int device;
    /* One all-to-all: send[r] (send_n[r] bytes) to rank r, recv[r] (recv_n[r] bytes, known to both
     * sides beforehand) from rank r, own rank included (a copy). Waits at most deadline_ms for the
     * whole exchange. 0, or -1 with err naming the rank. */
    int (*exchange)(ep_comm_t *c, const void *const *send, const size_t *send_n, void *const *recv,
                    const size_t *recv_n, int deadline_ms, char *err, size_t errlen);
    void (*destroy)(ep_comm_t *c);
    /* The descriptors that become readable when a peer starts a step (or goes away), for a
     * caller's poll loop: up to EP_MAX_RANKS into fds, their number returned. NULL: none (the
     * rank cannot learn of a peer's step without a blocking call: ep_follow only). */
    int (*poll_fds)(const ep_comm_t *c, int *fds);
} ep_comm_ops_t;

struct ep_comm {
    const ep_comm_ops_t *ops;
    int rank, n_ranks;
    /* NULL, or a host comm (sockets) that carries the step and round headers and placement tables
     * and whose descriptors wake a poll loop, owned by this one: a device comm's (NCCL has no
     * descriptor to poll, and a rank waiting for a peer's step must not sit in an NCCL call).
     * ep.c sends only the dispatch and the combine through ops->exchange then. */
    ep_comm_t *ctrl;
};

/* Unix stream sockets: fds[r] is this rank's end of the pair it shares with rank r (fds[rank] is
 * unused, -1). The comm owns the fds. */
ep_comm_t *ep_sock_new(int rank, int n_ranks, const int *fds, char *err, size_t errlen);
/* The leader's side of a local group: makes the socket pairs of all n_ranks (pairs[a*n+b] is a's
 * end towards b), returns them for the caller to hand to its children. */
int ep_sock_pairs(int n_ranks, int *pairs, char *err, size_t errlen);

/* Ranks that are independent processes of one host (decode workers the supervisor starts, each
 * on its own): rank r listens at <dir>/<group>.ep<r>, connects to every lower rank's socket and
 * accepts every higher rank, each connection opened by a hello (the group's name, both ranks, the
 * group size) and its answer. A socket that refuses, is missing, or closes before its answer (a
 * peer of an earlier incarnation on its way out) is tried again until deadline_ms. The listening
 * socket is closed and removed once the group is whole, so a later incarnation of a peer never
 * reaches this one's. NULL with err naming the rank missing. */
ep_comm_t *ep_sock_rendezvous(const char *dir, const char *group, int rank, int n_ranks, int deadline_ms, char *err,
                              size_t errlen);

/* NCCL between GPUs of the model's backend (be->ops->nccl): rank `rank` of n_ranks with the unique
 * id the leader made (bk_nccl_ops_t.unique_id) and gave the others; the communicator must be up
 * within init_ms (every rank joined), else it is aborted. NULL with err where the backend has no
 * NCCL (the CPU) or it did not come up. Its ctrl (ep_comm_t) is set by the caller (ep_meet). */
ep_comm_t *ep_nccl_new(backend_t *be, const uint8_t *id, int rank, int n_ranks, int init_ms, char *err, size_t errlen);

/* ---- the transport a group of member processes uses (ep_meet.c) ------------------------------ */

/* TROUPE_EP_TRANSPORT: unset, "" or "auto" (NCCL where every rank can, else sockets), "sock"
 * (sockets always), "nccl" (NCCL or the group does not form). */
typedef enum { EP_WANT_AUTO = 0, EP_WANT_SOCK = 1, EP_WANT_NCCL = 2 } ep_want_t;
/* -1 with err naming the variable and the value when it is none of those. */
int ep_want_parse(const char *s, ep_want_t *out, char *err, size_t errlen);

/* What each rank tells the others at the meeting (on the wire between processes of one build). */
typedef struct ep_rank_info {
    uint32_t magic;
    uint32_t want;                /* ep_want_t: this rank's TROUPE_EP_TRANSPORT */
    uint32_t nccl;                /* 1: its backend is a GPU's with NCCL hooks (bk_nccl_ops_t) */
    int32_t device;               /* its GPU's ordinal (the topology's gpu), -1: none */
    uint64_t host;                /* a hash of its host name */
    uint64_t visible;             /* a hash of its CUDA_VISIBLE_DEVICES (0: unset): ordinals compare
                                     only where every rank numbers the GPUs alike */
} ep_rank_info_t;

/* The choice, made alike on every rank from every rank's info (info[r] is rank r's): 1 NCCL, when
 * no rank wants sockets and every rank has NCCL, on one host, with one numbering of the GPUs, each
 * on its own GPU; 0 sockets otherwise; why says which and, for sockets, what kept NCCL off (naming
 * the ranks). -1 when the group cannot form: a rank requires NCCL (EP_WANT_NCCL) where it cannot
 * be had, or one rank requires NCCL and another sockets. */
int ep_xport_choose(const ep_rank_info_t *info, int n, char *why, size_t whylen);

typedef struct ep_meet_opts {
    const char *group;            /* the group's name, for logs and errors */
    const char *want;             /* TROUPE_EP_TRANSPORT's value (NULL: auto) */
    int device;                   /* this rank's GPU ordinal, -1: none (a CPU rank) */
    const char *visible;          /* this process's CUDA_VISIBLE_DEVICES (NULL: unset) */
    int meet_ms;                  /* each exchange of the meeting over the sockets */
    int init_ms;                  /* NCCL: the communicator up, and then the check trade, each within this */
} ep_meet_opts_t;

/* Right after ep_sock_rendezvous, every rank of the group (the calls pair up over ctrl):
 *   1. the ranks trade their ep_rank_info_t over ctrl and each runs ep_xport_choose;
 *   2. sockets: ctrl is returned as it is;
 *   3. NCCL: rank 0 makes the unique id and sends it to every rank over ctrl; every rank inits its
 *      communicator (ep_nccl_new, within init_ms), then the group trades a pattern over it (a
 *      rank's bytes to each peer, checked on arrival: NCCL's connections come up here, not in the
 *      first step); every rank then tells every other whether all of that went well (over ctrl).
 *      All well: the NCCL comm is returned, with ctrl as its ctrl (headers on the sockets, the
 *      dispatch and the combine over NCCL). Anywhere not: every rank aborts its communicator and
 *      keeps ctrl, with a warning naming the group and the rank and step that failed (with
 *      EP_WANT_NCCL the group fails instead).
 * why gets the choice and its reason, for the caller's log line. NULL with err (ctrl destroyed)
 * when the group cannot go on: an exchange over the sockets failed (a rank died or never answered
 * within meet_ms), or NCCL was required and could not be had. */
ep_comm_t *ep_meet(ep_comm_t *ctrl, backend_t *be, const ep_meet_opts_t *o, char *why, size_t whylen, char *err,
                   size_t errlen);

/* ---- placements --------------------------------------------------------------------------- */

/* Experts in order, no replicas: expert e on slot e (rank e / (E / n_ranks)). Needs E % n_ranks
 * == 0. slot_expert [E]. */
int ep_identity(int n_experts, int n_ranks, int32_t *slot_expert, char *err, size_t errlen);

/* Whether rank `rank` holds expert e of layer l in the initial placement (experts in order): a
 * model_opts_t.expert_keep callback, ctx an ep_keep_t. */
typedef struct ep_keep {
    int rank, n_ranks, n_experts;
} ep_keep_t;
int ep_keep_initial(void *ctx, int layer, int expert);

/* ---- the group ---------------------------------------------------------------------------- */

typedef struct ep ep_t;

/* A rank of a group over model m (loaded with ep_keep_initial for this rank: it holds the experts
 * of the in-order placement) and comm (owned from here on). ck is the model's checkpoint, kept open
 * for loading the experts later placements move here. Every rank installs itself in the model
 * (every MoE layer of model_forward runs through the group). */
ep_t *ep_new(model_t *m, ckpt_t *ck, ep_comm_t *comm, char *err, size_t errlen);
/* Frees; says nothing to the peers (they see the connection close). */
void ep_destroy(ep_t **self_p);

/* A rank that leads followers (ep_follow): rank 0 tells them to stop, then they return 0. */
void ep_stop(ep_t *ep);
/* A follower's life: joins every step until rank 0 says stop (0) or the group fails (-1, err). */
int ep_follow(ep_t *ep, char *err, size_t errlen);

/* 1 when a peer has started a step this rank has not joined (its header is waiting, or a peer's
 * connection closed: ep_join then fails), else 0. Never blocks. */
int ep_pending(ep_t *ep);
/* Descriptors to poll for ep_pending (ep_comm_ops_t.poll_fds). */
int ep_poll_fds(const ep_t *ep, int *fds);
/* Takes part in a step with no rows: the step header, then an empty round per MoE layer (when any
 * rank has rows). done: this rank is draining with nothing left (the header says so). Starts the
 * step itself when no peer has. 0, or -1 once the group failed (ep_error). */
int ep_join(ep_t *ep, int done);
/* 1 once a step had every rank done (each then leaves; no rank starts another step), else 0. */
int ep_all_done(const ep_t *ep);
/* 1 when this rank's last step header said done (a draining rank need not announce again). */
int ep_done_sent(const ep_t *ep);

/* Rank 0: a new placement, n_slots per layer for every layer (MoE or not: dense layers' rows
 * are ignored), slot_expert [num_layers][n_slots]. It goes to the group at the next step's first
 * MoE layer; the switch comes some steps later. Refused (-1, err) when a layer leaves an expert
 * without a replica, n_slots does not divide over the ranks, or a rank would hold one expert
 * twice. A newer proposal replaces one not yet sent. */
int ep_propose(ep_t *ep, uint64_t epoch, int n_slots, const int32_t *slot_expert, char *err, size_t errlen);

/* What the group runs now and what it is moving to. */
typedef struct ep_status {
    int rank, n_ranks;
    uint64_t epoch;               /* the placement computed with (0: experts in order) */
    uint64_t pending_epoch;       /* a placement sent and loading (0: none) */
    int loading_layers;           /* this rank's layers still to load for it */
    uint64_t rounds;              /* exchange rounds */
    uint64_t entries_sent;        /* (token, expert) entries dispatched by this rank */
    uint64_t experts_loaded;      /* expert weights loaded for placements */
    uint64_t switches;            /* placements switched to */
    int nccl;                     /* 1: the dispatch and the combine go over NCCL, 0: over the host comm */
    int failed;
} ep_status_t;
void ep_status(const ep_t *ep, ep_status_t *out);
/* (token, expert) entries this rank dispatched to each rank in layer l since the last reset,
 * out [n_ranks] (with one rank running every row, the group's measured load per rank). */
void ep_rank_entries(const ep_t *ep, int layer, uint64_t *out);
void ep_rank_entries_reset(ep_t *ep);
/* Slots of layer l now: *n_slots, slot_expert (NULL for a dense layer). */
const int32_t *ep_placement(const ep_t *ep, int layer, int *n_slots);

/* forward.c's MoE layer through the group: delta [T][H] = the routed experts of layer l over xn
 * [T][H], with ids / w [T][k] already routed (all device memory of the model's backend). Once the
 * group failed it does nothing: model_forward asks ep_error after the body. */
void ep_moe_layer(ep_t *ep, int layer, int T, const float *xn, const int32_t *ids, const float *w, float *delta);
/* 0 while the group is well, else -1 with the error that ended it. */
int ep_error(const ep_t *ep, char *err, size_t errlen);
/* cb(ctx, error) runs once, at the first MoE layer after the group failed (so the failing step's
 * requests were answered first). A worker exits there: its supervisor restarts it with a fresh
 * group. */
void ep_on_fail(ep_t *ep, void (*cb)(void *ctx, const char *error), void *ctx);

#endif
