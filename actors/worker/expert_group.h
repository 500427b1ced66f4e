/* actors/worker/expert_group.h — a worker's expert-parallel group on one host: the worker is rank
 * 0 (the leader, engine/ep.h) and starts ranks 1..n-1 as troupe-expert-rank processes, each
 * loading only its experts, connected by unix socket pairs (engine/ep_sock.c).
 *
 * Life: expert_group_spawn before the worker loads its model (it sets the spec's expert filter to
 * rank 0's experts and starts the other ranks, which load theirs meanwhile); expert_group_attach
 * once the model is loaded (the group takes the model's MoE layers); expert_group_destroy stops the
 * ranks and reaps them. A rank that dies or stalls fails the group: the forward that meets it
 * fails and the group's on_fail runs (a worker exits, so its supervisor restarts it with a fresh
 * group and the router re-routes or ends its requests). The ranks die with their leader
 * (PR_SET_PDEATHSIG), and one that finds its leader gone exits. */
#ifndef TROUPE_ACTORS_WORKER_EXPERT_GROUP_H
#define TROUPE_ACTORS_WORKER_EXPERT_GROUP_H

#include <sys/types.h>

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
ep_t *expert_group_ep(expert_group_t *g);
/* Before attach: the process exits (_exit(1)) at the first MoE layer after the group failed
 * (engine/ep.h ep_on_fail), once the failing step's requests were answered. Workers ask for it. */
void expert_group_exit_on_fail(expert_group_t *g);
/* Process id of rank r (1..n-1), for tests. */
pid_t expert_group_pid(const expert_group_t *g, int r);
void expert_group_destroy(expert_group_t **self_p);

#endif
