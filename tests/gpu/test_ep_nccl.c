/* tests/gpu/test_ep_nccl.c — an expert-parallel group of two processes on two GPUs over NCCL
 * (engine/ep_nccl.c, chosen and set up by engine/ep_meet.c) computes what the same group computes
 * over the unix sockets, bit for bit.
 *
 * This program is rank 0 on cuda:0 and runs itself again as rank 1 on cuda:1 (a fresh process:
 * CUDA does not survive fork). Each loads deepseek-v3-noqlora-bf16 (6 routed experts, 3 a rank:
 * DeepSeekMoE with a shared expert, bf16 experts) with only its experts, meets the other by
 * ep_sock_rendezvous in a temporary folder and ep_meet, three times: with TROUPE_EP_TRANSPORT=nccl
 * (the group must come up on NCCL: ep_status says nccl, else the set-up's error fails the test),
 * the dispatch kept in device memory (engine/ep.c s_dev_round, the default); again with
 * TROUPE_EP_DEVICE_PACK=0 (staged through the host); then with =sock. Each time every rank runs its own sequences (rank 0 four, rank 1 three: steps of
 * different rows on the two ranks; a 5-token prompt each, the prompt step on the grouped path,
 * then 8 one-row steps), every forward one step of the group; then both end the group together
 * (a done step). Every logit of every step of each rank must be bit equal to the sockets' in
 * both NCCL runs: the same entries reach the same experts, and the combine adds the same results
 * in the same order (on the device: gathered from zeros and added in expert id order), so a
 * difference is a transport that lost or moved bytes or a device combine that strayed.
 *
 * One GPU: skipped with "needs 2 GPUs" (NCCL cannot put two ranks on one GPU). An alarm ends the
 * program after ALARM_S: a hang is a failure with a message. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/engine_open.h"
#include "engine/ep.h"
#include "tests/gpu/model_steps.h"

#define MODEL "deepseek-v3-noqlora-bf16"
#define ALARM_S 110                /* tools/gpu-run.sh gives each GPU test 120 s */
#define MAX_SEQS 4
#define PROMPT 5
#define STEPS 8

static int s_device_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

static int s_seqs(int rank) { return rank == 0 ? 4 : 3; }

/* This rank's sequences through 1 + STEPS forwards (each a group step); logits [1 + STEPS][n][V]
 * into lg. 0, or -1 with err. */
static int s_run(engine_t *e, int rank, float *lg, char *err, size_t errlen)
{
    const int V = e->cfg.vocab_size, n = s_seqs(rank);
    kvseq_t *kv[MAX_SEQS];
    model_seq_t q[MAX_SEQS];
    for (int s = 0; s < n; s++) {
        int32_t ids[PROMPT];
        for (int i = 0; i < PROMPT; i++)
            ids[i] = (rank * 101 + s * 37 + i * 7919 + 3) % V;
        if (!(kv[s] = kvseq_new(e->pool, PROMPT + STEPS + 1, 0)) || kvseq_append(kv[s], ids, PROMPT) != 0)
            return errf(err, errlen, "rank %d: no KV for sequence %d", rank, s);
        q[s] = (model_seq_t){.kv = kv[s], .n_new = PROMPT};
    }
    int rc = 0;
    for (int step = 0; step <= STEPS && rc == 0; step++) {
        model_batch_t b = {.n_seqs = n, .seqs = q};
        char why[600];
        if (model_forward(e->model, &b, e->logits, why, sizeof why) != 0) {
            rc = errf(err, errlen, "rank %d, step %d: %s", rank, step, why);
            break;
        }
        memcpy(lg + (size_t)step * n * V, e->logits, (size_t)n * V * sizeof(float));
        for (int s = 0; step < STEPS && s < n; s++) {
            kvseq_publish(kv[s]);
            const int32_t next = (step * 131 + s * 17 + rank * 5 + 9) % V;
            if (kvseq_append(kv[s], &next, 1) != 0)
                rc = errf(err, errlen, "rank %d: KV full", rank);
            q[s].n_new = 1;
        }
    }
    for (int s = 0; s < n; s++)
        kvseq_destroy(&kv[s]);
    return rc;
}

/* One rank's whole part on backend be (cuda:rank). Exit status: 0 all well, 1 a difference or a
 * failure (printed). */
static int s_rank(int rank, const char *sockdir, backend_t *be)
{
    char dir[1024], err[1200];
    snprintf(dir, sizeof dir, "%s/" MODEL, gpu_fixture_root());
    engine_t *e = engine_new(dir, err, sizeof err);
    if (!e) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    ep_keep_t keep = {.rank = rank, .n_ranks = 2, .n_experts = e->cfg.num_experts};
    engine_spec_t spec;
    engine_spec_default(&spec);
    spec.be = be;
    /* No CUDA graphs: a group rank never records one (its exchange waits on the host). */
    spec.model = (model_opts_t){.max_tokens = MAX_SEQS * PROMPT, .max_seqs = MAX_SEQS, .max_context = 64,
                                .kv_block_size = 16, .no_graphs = 1, .expert_keep = ep_keep_initial,
                                .expert_ctx = &keep};
    spec.kv_blocks = 4 * MAX_SEQS;
    if (engine_load(e, &spec, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    const int V = e->cfg.vocab_size, n = s_seqs(rank);
    const size_t cnt = (size_t)(1 + STEPS) * n * V;
    float *lg[3] = {malloc(cnt * sizeof(float)), malloc(cnt * sizeof(float)), malloc(cnt * sizeof(float))};
    /* NCCL with the dispatch kept on the device (the default), NCCL staged through the host
     * (TROUPE_EP_DEVICE_PACK=0, read by ep_new), the sockets. */
    const char *const want[3] = {"nccl", "nccl", "sock"};
    for (int t = 0; t < 3; t++) {
        char group[32], why[600];
        snprintf(group, sizeof group, "ep-%s-%d", want[t], t);
        if (t == 1)
            setenv("TROUPE_EP_DEVICE_PACK", "0", 1);
        else
            unsetenv("TROUPE_EP_DEVICE_PACK");
        ep_comm_t *c = ep_sock_rendezvous(sockdir, group, rank, 2, 60000, err, sizeof err);
        const ep_meet_opts_t o = {.group = group, .want = want[t], .device = rank,
                                  .visible = getenv("CUDA_VISIBLE_DEVICES"), .meet_ms = 30000, .init_ms = 30000};
        ep_t *ep = NULL;
        if (!c || !(c = ep_meet(c, be, &o, why, sizeof why, err, sizeof err)) ||
            !(ep = ep_new(e->model, e->ck, c, err, sizeof err))) {
            fprintf(stderr, "rank %d, group over %s: %s\n", rank, want[t], err);
            return 1;
        }
        ep_status_t st;
        ep_status(ep, &st);
        printf("rank %d on cuda:%d: group %s: %s; ep_transport_nccl %d\n", rank, rank, group, why, st.nccl);
        if (st.nccl != (t < 2)) {
            fprintf(stderr, "rank %d: asked for %s, got ep_transport_nccl %d\n", rank, want[t], st.nccl);
            return 1;
        }
        if (s_run(e, rank, lg[t], err, sizeof err) != 0) {
            fprintf(stderr, "rank %d, group over %s: %s\n", rank, want[t], err);
            return 1;
        }
        if (ep_join(ep, 1) != 0 || !ep_all_done(ep)) {   /* both done: the group ends together */
            if (ep_error(ep, err, sizeof err) == 0)
                snprintf(err, sizeof err, "the done step did not end the group");
            fprintf(stderr, "rank %d, group over %s, ending: %s\n", rank, want[t], err);
            return 1;
        }
        ep_status(ep, &st);
        printf("rank %d: %llu rounds, %llu entries dispatched over %s\n", rank, (unsigned long long)st.rounds,
               (unsigned long long)st.entries_sent, want[t]);
        ep_destroy(&ep);
    }
    int rc = 0;
    for (int v = 0; v < 2; v++)
        for (int step = 0; step <= STEPS; step++) {
            const float *a = lg[v] + (size_t)step * n * V, *b = lg[2] + (size_t)step * n * V;
            if (memcmp(a, b, (size_t)n * V * sizeof(float)) == 0)
                continue;
            float most = 0.0f;
            for (size_t j = 0; j < (size_t)n * V; j++)
                most = fabsf(a[j] - b[j]) > most ? fabsf(a[j] - b[j]) : most;
            fprintf(stderr, "rank %d, %s %d: logits over NCCL (%s) differ from the sockets' (largest difference %g)\n",
                    rank, step ? "decode step" : "prompt step", step, v ? "staged through the host" : "on the device",
                    (double)most);
            rc = 1;
        }
    if (rc == 0)
        printf("rank %d: %d sequences, %d steps: every logit bit equal over NCCL (on the device, and staged through "
               "the host) and over the sockets\n", rank, n, 1 + STEPS);
    fflush(stdout);
    for (int v = 0; v < 3; v++)
        free(lg[v]);
    engine_destroy(&e);
    return rc;
}

static void s_alarm(int sig)
{
    (void)sig;
    static const char m[] = "test_ep_nccl: still running after the alarm: a hang\n";
    (void)!write(2, m, sizeof m - 1);
    _exit(3);
}

static void test_two_gpu_group(void **state)
{
    (void)state;
    const int gpus = s_device_count();
    if (gpus < 2) {
        printf("test_two_gpu_group: SKIPPED: needs 2 GPUs (cudaGetDeviceCount says %d)\n", gpus);
        fflush(stdout);
        skip();
    }
    char tmp[] = "/tmp/test-ep-nccl-XXXXXX";
    assert_non_null(mkdtemp(tmp));
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {   /* exec at once: nothing else may run in a forked copy of a CUDA process */
        execl("/proc/self/exe", "test_ep_nccl", "--rank1", tmp, (char *)NULL);
        _exit(127);
    }
    const int rc0 = s_rank(0, tmp, s_gpu);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    const int rc1 = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    rmdir(tmp);
    if (rc0 != 0 || rc1 != 0)
        fail_msg("rank 0 (cuda:0) %s, rank 1 (cuda:1) exited with %d (see their lines above)",
                 rc0 ? "failed" : "passed", rc1);
}

int main(int argc, char **argv)
{
    signal(SIGALRM, s_alarm);
    alarm(ALARM_S);
    if (argc == 3 && strcmp(argv[1], "--rank1") == 0) {
        char err[256];
        backend_t *be = backend_new("cuda:1", 1, err, sizeof err);
        if (!be) {
            fprintf(stderr, "rank 1: %s\n", err);
            return 1;
        }
        const int rc = s_rank(1, argv[2], be);
        backend_destroy(&be);
        return rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_gpu_group),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
