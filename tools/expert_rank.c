/* tools/expert_rank.c — troupe-expert-rank: one follower rank of an expert-parallel group
 * (engine/ep.h). A worker that leads a group starts one per other rank (actors/worker/
 * expert_group.c); it loads the model with only its own experts, answers the leader's rounds and
 * exits when the leader stops the group or goes away (it dies with its parent: PR_SET_PDEATHSIG).
 *
 *     troupe-expert-rank --model DIR --rank R --ranks N [--backend cpu|cuda:N] [--threads T]
 *                        [--max-tokens M] [--dtype auto|bf16|...] [--dummy]
 * Its socket towards rank p is fd 200 + p. Exit 0 after a stop, 1 when the group failed, 2 on bad
 * arguments or a model that cannot be opened. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/engine_open.h"
#include "engine/ep.h"

#define FD_BASE 200

static int s_int(const char *v, int lo, int hi, const char *name, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == 0 || *end || x < lo || x > hi) {
        fprintf(stderr, "troupe-expert-rank: %s %s: expected %d..%d\n", name, v, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv)
{
    const pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)   /* the leader went before the line above */
        return 1;
    const char *model = NULL, *backend = "cpu", *dtype = "auto";
    int rank = -1, ranks = 0, threads = 0, max_tokens = 512, dummy = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--dummy")) {
            dummy = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "troupe-expert-rank: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--dtype"))
            dtype = v;
        else if (!strcmp(a, "--rank"))
            bad = s_int(v, 1, EP_MAX_RANKS - 1, a, &rank);
        else if (!strcmp(a, "--ranks"))
            bad = s_int(v, 2, EP_MAX_RANKS, a, &ranks);
        else if (!strcmp(a, "--threads"))
            bad = s_int(v, 0, 1024, a, &threads);
        else if (!strcmp(a, "--max-tokens"))
            bad = s_int(v, 1, 1 << 20, a, &max_tokens);
        else {
            fprintf(stderr, "troupe-expert-rank: unknown option %s\n", a);
            return 2;
        }
        if (bad)
            return 2;
        i++;
    }
    if (!model || rank < 1 || rank >= ranks) {
        fprintf(stderr, "troupe-expert-rank: --model, --rank (1..ranks-1) and --ranks are required\n");
        return 2;
    }
    char err[1024];
    engine_t *eng = engine_new(model, err, sizeof err);
    if (!eng) {
        fprintf(stderr, "troupe-expert-rank %d: %s\n", rank, err);
        return 2;
    }
    engine_spec_t s;
    engine_spec_default(&s);
    s.backend = backend;
    s.threads = threads;
    s.dummy = dummy;
    if (strcmp(dtype, "auto") != 0 && dtype_parse(dtype, &s.dtype) != 0) {
        fprintf(stderr, "troupe-expert-rank %d: --dtype %s: unknown\n", rank, dtype);
        engine_destroy(&eng);
        return 2;
    }
    ep_keep_t keep = {.rank = rank, .n_ranks = ranks, .n_experts = eng->cfg.num_experts};
    s.model = (model_opts_t){.max_tokens = max_tokens, .max_seqs = 1, .max_logit_rows = 1, .max_context = 16,
                             .kv_block_size = 16, .expert_keep = ep_keep_initial, .expert_ctx = &keep};
    s.kv_blocks = 1;
    int fds[EP_MAX_RANKS];
    for (int p = 0; p < ranks; p++)
        fds[p] = p == rank ? -1 : FD_BASE + p;
    if (engine_load(eng, &s, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "troupe-expert-rank %d: %s\n", rank, err);
        engine_destroy(&eng);
        return 2;
    }
    ep_comm_t *c = ep_sock_new(rank, ranks, fds, err, sizeof err);
    ep_t *ep = c ? ep_new(eng->model, eng->ck, c, err, sizeof err) : NULL;
    int rc = 2;
    if (ep) {
        rc = ep_follow(ep, err, sizeof err) == 0 ? 0 : 1;
        ep_destroy(&ep);
    }
    if (rc)
        fprintf(stderr, "troupe-expert-rank %d: %s\n", rank, err);
    engine_destroy(&eng);
    return rc;
}
