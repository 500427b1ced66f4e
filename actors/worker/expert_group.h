/* actors/worker/expert_group.h — a worker's expert-parallel group on one host (engine/ep.h), of
 * one of two kinds:
 *   - members: ep decode instances of the topology (actors[].ep: instances index g*ep ..
 *     g*ep+ep-1 form group g, rank = index mod ep), each a whole worker with its own requests, KV
 *     pool and steps, started by the supervisor; they meet at start by ep_sock_rendezvous in the
 *     topology's run_dir (the group named after its rank 0 instance), then pick the transport
 *     (ep_meet: NCCL for the dispatch and the combine when every rank is on its own GPU of a CUDA
 *     backend with NCCL and TROUPE_EP_TRANSPORT is not sock; the sockets otherwise, and when NCCL
 *     does not come up; logged, and ep_transport_nccl in the stats). A member with no rows takes
 *     part in its peers' steps from its loop (expert_group_idle, woken by expert_group_watch), and
 *     the members drain together (expert_group_drained);
 *   - spawned: the process is rank 0 and starts ranks 1..n-1 as troupe-expert-rank processes that
 *     hold experts only, connected by unix socket pairs (tools: troupe-expert-load --group, tests).
 * Each rank loads only its experts.
 *
 * Life: expert_group_member / expert_group_spawn before the worker loads its model (it sets the spec's expert filter to
 * rank 0's experts and starts the other ranks, which load theirs meanwhile); expert_group_attach
 * once the model is loaded (the group takes the model's MoE layers); expert_group_destroy stops the
 * ranks and reaps them. A rank that dies or stalls fails the group: the forward that meets it
 * fails and the group's on_fail runs (a worker exits, so its supervisor restarts it with a fresh
 * group and the router re-routes or ends its requests). The ranks die with their leader
 * (PR_SET_PDEATHSIG), and one that finds its leader gone exits. */
#ifndef TROUPE_ACTORS_WORKER_EXPERT_GROUP_H
#define TROUPE_ACTORS_WORKER_EXPERT_GROUP_H

#include <sys/types.h>

#include "actors/runtime/actor.h"
#include "engine/engine_open.h"
#include "engine/ep.h"

typedef struct expert_group expert_group_t;

/* n ranks (2..EP_MAX_RANKS; they must divide the model's n_experts) over model_dir opened as spec says. exe: the troupe-expert-rank binary
 * (NULL: the one beside this process's own binary). Sets spec->model.expert_keep/expert_ctx
 * (pointing into the group: keep it until the model is loaded). NULL with err. */
expert_group_t *expert_group_spawn(int n, int n_experts, const char *model_dir, engine_spec_t *spec, const char *exe,
                                   char *err, size_t errlen);
/* The leader's side over the loaded engine: 0, or -1 with err (the group is stopped then). */
int expert_group_attach(expert_group_t *g, engine_t *eng, char *err, size_t errlen);
/* Instance self of topology t when its actor entry has ep > 1 (NULL and no error otherwise): its
 * rank in its group; sets spec's expert filter to that rank's experts. NULL with err (a config
 * error) when the model cfg's experts do not divide over the ranks. */
expert_group_t *expert_group_member(const topo_t *t, const topo_instance_t *self, const model_config_t *cfg,
                                    engine_spec_t *spec, char *err, size_t errlen);
/* A member: its peers' connections wake the actor's loop (actor_add_wake_fd). */
int expert_group_watch(expert_group_t *g, actor_t *a);
/* A member, from its loop when it runs no step of its own: takes part in a step a peer has started
 * (or, done = draining with nothing left, announces it once). 1 when it took part in one. A group
 * that has failed exits the process here (expert_group_exit_on_fail). NULL g: 0. */
int expert_group_idle(expert_group_t *g, int done);
/* 1 when the worker may exit after a drain: no group, a spawned one, or every member done. */
int expert_group_drained(const expert_group_t *g);
ep_t *expert_group_ep(expert_group_t *g);
/* Before attach: the process exits (_exit(1)) at the first MoE layer after the group failed
 * (engine/ep.h ep_on_fail), once the failing step's requests were answered. Workers ask for it. */
void expert_group_exit_on_fail(expert_group_t *g);
/* Process id of rank r (1..n-1), for tests. */
pid_t expert_group_pid(const expert_group_t *g, int r);
void expert_group_destroy(expert_group_t **self_p);

#endif
