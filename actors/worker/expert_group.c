/* actors/worker/expert_group.c — starting and stopping a worker's expert-parallel ranks
 * (expert_group.h). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "actors/worker/expert_group.h"
#include "common/log.h"
#include "common/util.h"

#define EG_FD_BASE 200            /* a rank's socket towards rank p is fd EG_FD_BASE + p */
#define EG_MEET_MS 120000         /* members meeting at start: every one has loaded its model by then */
#define EG_CHOOSE_MS 30000        /* each exchange of the transport's choice, once the members have met */
#define EG_NCCL_INIT_MS 15000     /* the group's NCCL communicator up, then its check trade, each within this:
                                     one node's init takes seconds, and the fallback must fit the
                                     supervisor's ready timeout (60 s by default) */

extern char **environ;

struct expert_group {
    int n;
    int member;                   /* 1: one of ep topology instances (rendezvous); 0: rank 0 of spawned ranks */
    char name[TOPO_NAME_MAX];     /* member: the group's name, its rank 0 instance's */
    char dir[TOPO_PATH_MAX];      /* member: where the ranks meet (the topology's run_dir) */
    int device;                   /* member: its GPU's ordinal (the backend's cuda:N), -1 on the CPU backend */
    ep_keep_t keep;
    pid_t pids[EP_MAX_RANKS];
    int fds[EP_MAX_RANKS];        /* rank 0's ends */
    ep_t *ep;
    int exit_on_fail;
};

void expert_group_exit_on_fail(expert_group_t *g) { g->exit_on_fail = 1; }

static void s_reap(expert_group_t *g, int kill_first)
{
    for (int r = 1; r < g->n; r++) {
        if (g->pids[r] <= 0)
            continue;
        int st;
        for (int i = 0; i < 200 && waitpid(g->pids[r], &st, WNOHANG) == 0; i++) {
            if (kill_first || i == 100)
                kill(g->pids[r], i == 100 ? SIGKILL : SIGTERM);
            kill_first = 0;
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        g->pids[r] = 0;
    }
}

expert_group_t *expert_group_spawn(int n, int n_experts, const char *model_dir, engine_spec_t *spec, const char *exe,
                                   char *err, size_t errlen)
{
    if (n < 2 || n > EP_MAX_RANKS) {
        errf(err, errlen, "expert parallelism: %d ranks (2..%d)", n, EP_MAX_RANKS);
        return NULL;
    }
    if (n_experts < n || n_experts % n != 0) {
        errf(err, errlen, "expert parallelism: the model's %d routed experts do not divide evenly over %d ranks",
             n_experts, n);
        return NULL;
    }
    expert_group_t *g = calloc(1, sizeof *g);
    int *pairs = malloc((size_t)n * (size_t)n * sizeof(int));
    if (!g || !pairs) {
        free(g);
        free(pairs);
        errf(err, errlen, "expert parallelism: out of memory");
        return NULL;
    }
    g->n = n;
    for (int r = 0; r < EP_MAX_RANKS; r++)
        g->fds[r] = -1;
    char self_bin[PATH_MAX];
    if (!exe) {
        ssize_t k = readlink("/proc/self/exe", self_bin, sizeof self_bin - 64);
        if (k <= 0) {
            errf(err, errlen, "expert parallelism: cannot find this program's directory: %s", strerror(errno));
            goto fail;
        }
        self_bin[k] = 0;
        char *slash = strrchr(self_bin, '/');
        snprintf(slash ? slash + 1 : self_bin, 64, "troupe-expert-rank");
        exe = self_bin;
    }
    if (access(exe, X_OK) != 0) {
        errf(err, errlen, "expert parallelism: %s: %s (built with the workers)", exe, strerror(errno));
        goto fail;
    }
    if (ep_sock_pairs(n, pairs, err, errlen) < 0)
        goto fail;
    for (int i = 0; i < n * n; i++)
        if (pairs[i] >= EG_FD_BASE) {
            errf(err, errlen, "expert parallelism: socket fd %d is above %d", pairs[i], EG_FD_BASE);
            goto fail_pairs;
        }
    for (int r = 1; r < n; r++) {
        char a_model[PATH_MAX + 16], a_rank[32], a_ranks[32], a_threads[32], a_tokens[32], a_dtype[48];
        snprintf(a_model, sizeof a_model, "%s", model_dir);
        snprintf(a_rank, sizeof a_rank, "%d", r);
        snprintf(a_ranks, sizeof a_ranks, "%d", n);
        snprintf(a_threads, sizeof a_threads, "%d", spec->threads);
        snprintf(a_tokens, sizeof a_tokens, "%d", spec->model.max_tokens > 0 ? spec->model.max_tokens : 512);
        snprintf(a_dtype, sizeof a_dtype, "%s", spec->dtype == DT_COUNT ? "auto" : dtype_name(spec->dtype));
        char *argv[] = {(char *)exe, "--model", a_model, "--backend", (char *)(spec->backend ? spec->backend : "cpu"),
                        "--threads", a_threads, "--rank", a_rank, "--ranks", a_ranks, "--max-tokens", a_tokens,
                        "--dtype", a_dtype, spec->dummy ? "--dummy" : NULL, NULL};
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        for (int p = 0; p < n; p++)
            if (p != r)
                posix_spawn_file_actions_adddup2(&fa, pairs[r * n + p], EG_FD_BASE + p);
        int rc = posix_spawn(&g->pids[r], exe, &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) {
            g->pids[r] = 0;
            errf(err, errlen, "expert parallelism: cannot start rank %d (%s): %s", r, exe, strerror(rc));
            goto fail_pairs;
        }
    }
    for (int a = 0; a < n; a++)   /* the children's ends are theirs now */
        for (int b = 0; b < n; b++)
            if (a != 0 && a != b)
                close(pairs[a * n + b]);
    for (int p = 1; p < n; p++)
        g->fds[p] = pairs[p];
    free(pairs);
    g->keep = (ep_keep_t){.rank = 0, .n_ranks = n, .n_experts = n_experts};
    spec->model.expert_keep = ep_keep_initial;
    spec->model.expert_ctx = &g->keep;
    LOG_I("expert-parallel group of %d ranks: started ranks 1..%d (%s)", n, n - 1, exe);
    return g;
fail_pairs:
    for (int i = 0; i < n * n; i++)
        if (pairs[i] >= 0)
            close(pairs[i]);
fail:
    free(pairs);
    s_reap(g, 1);
    free(g);
    return NULL;
}

/* A worker whose group failed exits: its supervisor restarts it with a fresh group, and the
 * router ends or re-routes what it was serving. */
static void s_on_fail(void *ctx, const char *error)
{
    (void)ctx;
    LOG_E("expert-parallel group failed, exiting for a fresh one: %s", error);
    fflush(NULL);
    _exit(1);
}

expert_group_t *expert_group_member(const topo_t *t, const topo_instance_t *self, const model_config_t *cfg,
                                    engine_spec_t *spec, char *err, size_t errlen)
{
    const int n = self->actor >= 0 && self->actor < t->n_actors ? t->actors[self->actor].ep : 1, n_experts = cfg->num_experts;
    if (n < 2)
        return NULL;
    if (n > EP_MAX_RANKS || n_experts < n || n_experts % n != 0) {
        errf(err, errlen, "actors[%d].ep: the model's %d routed experts do not divide evenly over %d ranks", self->actor,
             n_experts, n);
        return NULL;
    }
    /* A transport the group cannot be told to use is the configuration's fault: found here, before
     * the model loads, so the worker exits as misconfigured instead of being restarted to fail again
     * at its group's meeting. */
    ep_want_t want;
    if (ep_want_parse(getenv("TROUPE_EP_TRANSPORT"), &want, err, errlen) < 0)
        return NULL;
    expert_group_t *g = calloc(1, sizeof *g);
    if (!g) {
        errf(err, errlen, "expert parallelism: out of memory");
        return NULL;
    }
    g->n = n;
    g->member = 1;
    for (int r = 0; r < EP_MAX_RANKS; r++)
        g->fds[r] = -1;
    const int rank = self->index % n, first = self->index - rank;
    for (int i = 0; i < t->n_instances; i++)
        if (t->instances[i].actor == self->actor && t->instances[i].index == first)
            snprintf(g->name, sizeof g->name, "%s", t->instances[i].name);
    snprintf(g->dir, sizeof g->dir, "%s", t->endpoints.run_dir);
    g->device = t->model.backend == TOPO_BACKEND_CUDA ? (self->gpu > 0 ? self->gpu : 0) : -1;   /* as worker_load's cuda:N */
    g->keep = (ep_keep_t){.rank = rank, .n_ranks = n, .n_experts = n_experts};
    spec->model.expert_keep = ep_keep_initial;
    spec->model.expert_ctx = &g->keep;
    LOG_I("expert-parallel group %s: rank %d of %d", g->name, rank, n);
    return g;
}

int expert_group_attach(expert_group_t *g, engine_t *eng, char *err, size_t errlen)
{
    if (g->member) {
        ep_comm_t *c = ep_sock_rendezvous(g->dir, g->name, g->keep.rank, g->n, EG_MEET_MS, err, errlen);
        if (!c)
            return -1;
        LOG_I("expert-parallel group %s: all %d ranks connected", g->name, g->n);
        /* NCCL for the dispatch and the combine where every rank is on its own GPU, else the
         * sockets (ep_meet). */
        const ep_meet_opts_t mo = {.group = g->name, .want = getenv("TROUPE_EP_TRANSPORT"), .device = g->device,
                                   .visible = getenv("CUDA_VISIBLE_DEVICES"), .meet_ms = EG_CHOOSE_MS,
                                   .init_ms = EG_NCCL_INIT_MS};
        char why[400];
        if (!(c = ep_meet(c, eng->be, &mo, why, sizeof why, err, errlen)) ||
            !(g->ep = ep_new(eng->model, eng->ck, c, err, errlen)))
            return -1;
        if (g->exit_on_fail)
            ep_on_fail(g->ep, s_on_fail, g);
        LOG_I("expert-parallel group %s: rank %d of %d, transport %s (%s)", g->name, g->keep.rank, g->n,
              c->ops->device ? "nccl" : "sock", why);
        return 0;
    }
    ep_comm_t *c = ep_sock_new(0, g->n, g->fds, err, errlen);
    if (!c)
        return -1;
    for (int p = 0; p < g->n; p++)
        g->fds[p] = -1;   /* the comm owns them */
    if (!(g->ep = ep_new(eng->model, eng->ck, c, err, errlen)))
        return -1;
    if (g->exit_on_fail)
        ep_on_fail(g->ep, s_on_fail, g);
    return 0;
}

int expert_group_watch(expert_group_t *g, actor_t *a)
{
    int fds[EP_MAX_RANKS];
    const int n = g && g->member && g->ep ? ep_poll_fds(g->ep, fds) : 0;
    for (int i = 0; i < n; i++)
        if (actor_add_wake_fd(a, fds[i]) != 0)
            return -1;
    return 0;
}

int expert_group_idle(expert_group_t *g, int done)
{
    if (!g || !g->member || !g->ep || ep_all_done(g->ep))
        return 0;
    char err[600];
    if (ep_error(g->ep, err, sizeof err) == 0) {
        if (!ep_pending(g->ep) && !(done && !ep_done_sent(g->ep)))
            return 0;
        if (ep_join(g->ep, done) == 0)
            return 1;
        ep_error(g->ep, err, sizeof err);
    }
    if (g->exit_on_fail)   /* no rows of ours were in the step: nothing to answer first */
        s_on_fail(g, err);
    return 0;
}

int expert_group_drained(const expert_group_t *g)
{
    return !g || !g->member || !g->ep || ep_all_done(g->ep) || ep_error(g->ep, NULL, 0) != 0;
}

ep_t *expert_group_ep(expert_group_t *g) { return g ? g->ep : NULL; }

pid_t expert_group_pid(const expert_group_t *g, int r) { return r > 0 && r < g->n ? g->pids[r] : 0; }

void expert_group_destroy(expert_group_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    expert_group_t *g = *self_p;
    const int well = g->ep && ep_error(g->ep, NULL, 0) == 0;
    if (!g->member)
        ep_stop(g->ep);   /* stop to the spawned ranks, when the group is still well */
    ep_destroy(&g->ep);
    for (int p = 0; p < g->n; p++)
        if (g->fds[p] >= 0)
            close(g->fds[p]);
    s_reap(g, !well);
    free(g);
    *self_p = NULL;
}
