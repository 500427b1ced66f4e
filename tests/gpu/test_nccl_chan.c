/* tests/gpu/test_nccl_chan.c — the NCCL tensor channel (transfer/nccl_chan.h) on real GPUs.
 * Built by `make gpu-tests` (build/gpu-tests/test_nccl_chan), run on the GPU node; cmocka.
 *
 * One GPU (NCCL cannot put two ranks on one GPU, so everything here is a one-rank link talking to
 * itself, or a link whose other rank never comes):
 *   test_self_blocks      a one-rank link on cuda:0 sends a set of KV blocks (every layer's K and V
 *                         of each block: bk_kv_t's layout) from scattered ids of one pool to other
 *                         ids of a second pool, several groups' worth; every byte arrives, every
 *                         block not named keeps its poison.
 *   test_self_bandwidth   1 GiB of Llama-3.1-8B-shaped blocks (2 MiB each) sent to itself, timed;
 *                         prints "nccl_self_bw <x> GB/s".
 *   test_init_deadline    a two-rank link whose second rank never comes fails at its deadline (not
 *                         later), aborted, the error naming the peer and the initialisation.
 *   test_recv_deadline    on a ready link, a receive no send matches ends within its deadline
 *                         (NCCL refuses it, or it times out): aborted, the error names the peer and
 *                         the receive, and the backend still works afterwards.
 * Two GPUs (skipped with a message when cudaGetDeviceCount < 2): this program runs itself again as
 * rank 1 on cuda:1 (a fresh process: CUDA does not survive fork); the unique id reaches it in an
 * encoded kv_link message through a pipe, as it would over ZeroMQ:
 *   test_two_gpu_blocks   rank 0 sends blocks, rank 1 receives them into other ids and checks every
 *                         byte (its exit status says); then timed transfers: "kv_handoff_nccl_bw <x> GB/s" (bench_nccl: NCCL's own).
 *   test_two_gpu_dead_peer rank 1 comes up and exits without receiving (as a killed decode worker):
 *                         rank 0's send fails within its deadline, aborted, naming the peer.
 * An alarm ends the whole program after ALARM_S seconds: a hang is a failure with a message, never
 * a wedged job. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "transfer/nccl_chan.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "messages/msg.h"

#define ALARM_S 110                /* tools/gpu-run.sh gives each GPU test 120 s */
#define POISON 0xa5

static backend_t *s_be;            /* cuda:0 */

/* ---- pools ------------------------------------------------------------------------------------ */

typedef struct pool {
    bk_kv_t kv;
    uint8_t *host;                  /* [n_blocks * block_bytes] */
} pool_t;

/* Layers x 2 x block_size x kv_heads x head_dim of bf16, as the engine lays a block out. */
static int s_pool_new(pool_t *p, int n_blocks, int layers, int block_size, int heads, int dim)
{
    memset(p, 0, sizeof *p);
    p->kv = (bk_kv_t){.dtype = DT_BF16, .n_blocks = n_blocks, .block_size = block_size, .n_layers = layers,
                      .n_kv_heads = heads, .head_dim = dim};
    p->kv.block_bytes = (size_t)layers * 2 * block_size * heads * dim * 2;
    p->kv.base = s_be->ops->alloc(s_be, (size_t)n_blocks * p->kv.block_bytes);
    p->host = malloc((size_t)n_blocks * p->kv.block_bytes);
    return p->kv.base && p->host ? 0 : -1;
}

static void s_pool_free(pool_t *p)
{
    if (p->kv.base)
        s_be->ops->free(s_be, p->kv.base);
    free(p->host);
    memset(p, 0, sizeof *p);
}

static uint8_t s_byte(int block, size_t off, unsigned seed)
{
    return (uint8_t)((unsigned)block * 131u + (unsigned)(off * 7u) + (unsigned)(off >> 9) + seed);
}

/* Fills every block with its pattern (seed >= 0) or the poison (seed < 0) and uploads. */
static void s_pool_fill(pool_t *p, int seed)
{
    size_t bb = p->kv.block_bytes;
    if (seed < 0)
        memset(p->host, POISON, (size_t)p->kv.n_blocks * bb);
    for (int b = 0; seed >= 0 && b < p->kv.n_blocks; b++)
        for (size_t o = 0; o < bb; o++)
            p->host[(size_t)b * bb + o] = s_byte(b, o, (unsigned)seed);
    assert_int_equal(s_be->ops->upload(s_be, p->kv.base, p->host, (size_t)p->kv.n_blocks * bb), 0);
}

/* Downloads the pool; dst block to[i] must hold src block from[i]'s pattern, the others poison. */
static int s_pool_check(pool_t *p, const int32_t *from, const int32_t *to, int n, unsigned seed, char *why, size_t wl)
{
    size_t bb = p->kv.block_bytes;
    if (s_be->ops->download(s_be, p->host, p->kv.base, (size_t)p->kv.n_blocks * bb) != 0)
        return errf(why, wl, "download failed");
    for (int b = 0; b < p->kv.n_blocks; b++) {
        int src = -1;
        for (int i = 0; i < n; i++)
            if (to[i] == b)
                src = from[i];
        for (size_t o = 0; o < bb; o++) {
            uint8_t want = src < 0 ? POISON : s_byte(src, o, seed), got = p->host[(size_t)b * bb + o];
            if (got != want)
                return errf(why, wl, "block %d byte %zu (layer %zu): %u, expected %u (%s)", b, o,
                            o / (bb / (size_t)p->kv.n_layers), got, want, src < 0 ? "poison" : "sent");
        }
    }
    return 0;
}

static int64_t s_ms_since(int64_t t0) { return now_ms() - t0; }

static void s_poll_ready(tchan_nccl_t *l)
{
    char err[512];
    tchan_nccl_state_t st;
    while ((st = tchan_nccl_poll(l, err, sizeof err)) != TCHAN_NCCL_READY && st != TCHAN_NCCL_FAILED)
        usleep(200);
    if (st != TCHAN_NCCL_READY)
        fail_msg("link to %s did not come up: %s", l->peer, err);
}

static void s_self_link(tchan_nccl_t *l)
{
    uint8_t id[TCHAN_NCCL_ID_BYTES];
    char err[512];
    if (tchan_nccl_unique_id(s_be, id, err, sizeof err) != 0 ||
        tchan_nccl_open(l, s_be, "self", 1, id, sizeof id, 1, 0, 30000, err, sizeof err) != 0)
        fail_msg("one-rank link: %s", err);
    s_poll_ready(l);
}

/* ---- one GPU ---------------------------------------------------------------------------------- */

static void test_self_blocks(void **st)
{
    /* A small model's blocks (8 layers, 16 tokens, 2 kv heads, 64 dims: 64 KiB) and enough of them
     * for three groups (BK_NCCL_GROUP_SPANS each way per group). */
    enum { N = 1200, SEND = 2 * BK_NCCL_GROUP_SPANS + 100 };
    pool_t src, dst;
    assert_int_equal(s_pool_new(&src, N, 8, 16, 2, 64), 0);
    assert_int_equal(s_pool_new(&dst, N, 8, 16, 2, 64), 0);
    s_pool_fill(&src, 17);
    s_pool_fill(&dst, -1);
    static int32_t from[SEND], to[SEND];
    for (int i = 0; i < SEND; i++) {
        from[i] = (int32_t)((i * 7 + 3) % N);   /* scattered, each once */
        to[i] = (int32_t)((N - 1 - i * 11 % N + N) % N);
    }
    /* to[] must not repeat: (i * 11) mod N is a bijection when gcd(11, N) = 1. */
    tchan_nccl_t l;
    s_self_link(&l);
    tchan_nccl_xfer_t x;
    char err[512];
    int64_t t0 = now_ms();
    assert_int_equal(tchan_nccl_sendrecv(&l, &src.kv, from, &dst.kv, to, SEND, 30000, &x, err, sizeof err), 0);
    if (tchan_nccl_wait(&l, &x, err, sizeof err) != 1)
        fail_msg("%s", err);
    printf("self transfer of %d blocks (%.1f MiB) in %lld ms\n", SEND, (double)SEND * src.kv.block_bytes / (1 << 20),
           (long long)s_ms_since(t0));
    char why[256];
    if (s_pool_check(&dst, from, to, SEND, 17, why, sizeof why) != 0)
        fail_msg("%s", why);
    assert_int_equal(l.transfers, 1);
    assert_int_equal(l.bytes, (uint64_t)SEND * src.kv.block_bytes);
    tchan_nccl_close(&l);
    s_pool_free(&src);
    s_pool_free(&dst);
}

static void test_self_bandwidth(void **st)
{
    /* Llama-3.1-8B: 32 layers x 2 x 16 tokens x 8 kv heads x 128 dims bf16 = 2 MiB a block. */
    enum { N = 512, ITERS = 10 };
    pool_t src, dst;
    assert_int_equal(s_pool_new(&src, N, 32, 16, 8, 128), 0);
    assert_int_equal(s_pool_new(&dst, N, 32, 16, 8, 128), 0);
    s_pool_fill(&src, 5);
    s_pool_fill(&dst, -1);
    static int32_t from[N], to[N];
    for (int i = 0; i < N; i++) {
        from[i] = i;
        to[i] = N - 1 - i;
    }
    tchan_nccl_t l;
    s_self_link(&l);
    tchan_nccl_xfer_t x;
    char err[512];
    assert_int_equal(tchan_nccl_sendrecv(&l, &src.kv, from, &dst.kv, to, N, 30000, &x, err, sizeof err), 0);
    if (tchan_nccl_wait(&l, &x, err, sizeof err) != 1)   /* warm: first-use costs */
        fail_msg("%s", err);
    char why[256];
    if (s_pool_check(&dst, from, to, N, 5, why, sizeof why) != 0)
        fail_msg("%s", why);
    int64_t t0 = now_ns();
    for (int i = 0; i < ITERS; i++) {
        assert_int_equal(tchan_nccl_sendrecv(&l, &src.kv, from, &dst.kv, to, N, 30000, &x, err, sizeof err), 0);
        if (tchan_nccl_wait(&l, &x, err, sizeof err) != 1)
            fail_msg("%s", err);
    }
    double s = (double)(now_ns() - t0) / 1e9, bytes = (double)ITERS * N * (double)src.kv.block_bytes;
    printf("self: %d x %d blocks of %zu bytes (%.2f GiB each) in %.3f s\n", ITERS, N, src.kv.block_bytes,
           (double)N * src.kv.block_bytes / (1 << 30), s);
    printf("nccl_self_bw %.1f GB/s\n", bytes / s / 1e9);
    fflush(stdout);
    tchan_nccl_close(&l);
    s_pool_free(&src);
    s_pool_free(&dst);
}

static void test_init_deadline(void **st)
{
    uint8_t id[TCHAN_NCCL_ID_BYTES];
    char err[512];
    tchan_nccl_t l;
    assert_int_equal(tchan_nccl_unique_id(s_be, id, err, sizeof err), 0);
    int64_t t0 = now_ms();
    assert_int_equal(tchan_nccl_open(&l, s_be, "decode-absent", 7, id, sizeof id, 2, 0, 2000, err, sizeof err), 0);
    tchan_nccl_state_t s;
    while ((s = tchan_nccl_poll(&l, err, sizeof err)) == TCHAN_NCCL_INIT)
        usleep(1000);
    int64_t took = s_ms_since(t0);
    printf("init without its peer: %s after %lld ms: %s\n", tchan_nccl_state_name(s), (long long)took, err);
    assert_int_equal(s, TCHAN_NCCL_FAILED);
    assert_true(took >= 2000 && took < 2000 + 5000);
    assert_non_null(strstr(err, "NCCL link to decode-absent"));
    assert_non_null(strstr(err, "initialisation (rank 0 of 2) not complete after"));
    assert_non_null(strstr(err, "communicator aborted"));
    assert_null(l.comm);
    tchan_nccl_close(&l);
}

static void test_recv_deadline(void **st)
{
    pool_t dst;
    assert_int_equal(s_pool_new(&dst, 4, 2, 16, 2, 64), 0);
    s_pool_fill(&dst, -1);
    tchan_nccl_t l;
    s_self_link(&l);
    int32_t blocks[2] = {1, 3};
    tchan_nccl_xfer_t x;
    char err[512];
    int64_t t0 = now_ms();
    int posted = tchan_nccl_recv(&l, &dst.kv, blocks, 2, 1500, &x, err, sizeof err);
    int s = posted == 0 ? tchan_nccl_wait(&l, &x, err, sizeof err) : -1;
    int64_t took = s_ms_since(t0);
    printf("receive with no send: %s after %lld ms: %s\n", posted ? "refused at posting" : "failed", (long long)took,
           err);
    assert_int_equal(s, -1);
    assert_true(took < 1500 + 5000);
    assert_int_equal(l.state, TCHAN_NCCL_FAILED);
    assert_null(l.comm);
    assert_non_null(strstr(err, "NCCL link to self"));
    assert_non_null(strstr(err, "receive of 2 blocks"));
    assert_non_null(strstr(err, "communicator aborted"));
    tchan_nccl_close(&l);
    /* The model's stream never waited for the link: the backend works on. */
    s_pool_fill(&dst, 3);
    int32_t same[4] = {0, 1, 2, 3};
    char why[256];
    if (s_pool_check(&dst, same, same, 4, 3, why, sizeof why) != 0)
        fail_msg("backend after the abort: %s", why);
    s_pool_free(&dst);
}

/* ---- two GPUs: rank 1 is this program again ---------------------------------------------------- */

enum { TWO_N = 256, TWO_SEND = 200, TWO_ITERS = 10 };   /* 2 MiB blocks: 400 MiB a transfer */
enum { DEAD_SEND = 256 };                                 /* the dead-peer send: 512 MiB */
#define TWO_SEED 29

static void s_two_blocks(int32_t *from, int32_t *to)
{
    for (int i = 0; i < TWO_SEND; i++) {
        from[i] = (int32_t)((i * 5 + 1) % TWO_N);
        to[i] = (int32_t)(TWO_N - 1 - i);
    }
}

static int s_device_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/* Rank 1: reads the offer from fd, joins on cuda:1, then either receives TWO_ITERS transfers and
 * checks the first ("recv"), or exits as soon as the link is up ("die"). Exit status 0: all well. */
static int s_rank1(const char *mode, int fd)
{
    uint8_t frame[4096];
    uint32_t len = 0;
    char err[512];
    if (read(fd, &len, sizeof len) != (ssize_t)sizeof len || len > sizeof frame ||
        read(fd, frame, len) != (ssize_t)len) {
        fprintf(stderr, "rank 1: no offer on fd %d\n", fd);
        return 2;
    }
    msg_t m;
    if (msg_decode(frame, len, &m, err, sizeof err) != 0 || m.type != MSG_KV_LINK) {
        fprintf(stderr, "rank 1: bad offer: %s\n", err);
        return 2;
    }
    s_be = backend_new("cuda:1", 1, err, sizeof err);
    if (!s_be) {
        fprintf(stderr, "rank 1: %s\n", err);
        return 2;
    }
    tchan_nccl_t l;
    const msg_kv_link_t *o = &m.u.kv_link;
    if (tchan_nccl_open(&l, s_be, o->src, o->link_id, o->handle, o->handle_len, (int)o->n_ranks, (int)o->rank, 30000,
                        err, sizeof err) != 0) {
        fprintf(stderr, "rank 1: %s\n", err);
        return 1;
    }
    tchan_nccl_state_t st;
    while ((st = tchan_nccl_poll(&l, err, sizeof err)) != TCHAN_NCCL_READY && st != TCHAN_NCCL_FAILED)
        usleep(200);
    if (st != TCHAN_NCCL_READY) {
        fprintf(stderr, "rank 1: %s\n", err);
        return 1;
    }
    if (strcmp(mode, "die") == 0) {
        printf("rank 1: link up, exiting without receiving (as a killed worker)\n");
        fflush(stdout);
        _exit(0);
    }
    pool_t dst;
    if (s_pool_new(&dst, TWO_N, 32, 16, 8, 128) != 0) {
        fprintf(stderr, "rank 1: no memory for the pool\n");
        return 1;
    }
    s_pool_fill(&dst, -1);
    static int32_t from[TWO_SEND], to[TWO_SEND];
    s_two_blocks(from, to);
    for (int it = 0; it < TWO_ITERS; it++) {
        tchan_nccl_xfer_t x;
        if (tchan_nccl_recv(&l, &dst.kv, to, TWO_SEND, 30000, &x, err, sizeof err) != 0 ||
            tchan_nccl_wait(&l, &x, err, sizeof err) != 1) {
            fprintf(stderr, "rank 1: transfer %d: %s\n", it, err);
            return 1;
        }
    }
    /* Checked after the loop, not between transfers: the host check of 400 MiB would sit inside the
     * sender's timing. Every transfer sends the same bytes to the same ids, so the last must match. */
    char why[256];
    if (s_pool_check(&dst, from, to, TWO_SEND, TWO_SEED, why, sizeof why) != 0) {
        fprintf(stderr, "rank 1: received bytes wrong: %s\n", why);
        return 1;
    }
    printf("rank 1: %d blocks received intact on cuda:1\n", TWO_SEND);
    fflush(stdout);
    tchan_nccl_close(&l);
    s_pool_free(&dst);
    backend_destroy(&s_be);
    msg_free(&m);
    return 0;
}

/* Rank 0's side of a two-process link: opens it, starts rank 1 (this program, `mode`), sends it
 * the offer as an encoded kv_link, polls until READY. Returns rank 1's pid. */
static pid_t s_start_rank1(tchan_nccl_t *l, const char *mode)
{
    uint8_t id[TCHAN_NCCL_ID_BYTES];
    char err[512];
    uint64_t link_id = 0x7e57000000000000ull | (uint64_t)getpid();
    if (tchan_nccl_unique_id(s_be, id, err, sizeof err) != 0 ||
        tchan_nccl_open(l, s_be, "rank1-on-cuda:1", link_id, id, sizeof id, 2, 0, 30000, err, sizeof err) != 0)
        fail_msg("rank 0: %s", err);
    msg_t m;
    msg_init(&m, MSG_KV_LINK, link_id);
    m.u.kv_link = (msg_kv_link_t){.link_id = link_id, .channel = MSG_CHAN_NCCL, .status = MSG_ACK_OK, .handle = id,
                                  .handle_len = sizeof id, .n_ranks = 2, .rank = 1, .src = "rank0-on-cuda:0",
                                  .deadline_ms = (uint64_t)(wall_ms() + 30000)};
    uint8_t frame[4096];
    size_t len;
    assert_int_equal(msg_encode(&m, frame, sizeof frame, &len, err, sizeof err), 0);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", fds[0]);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {   /* exec at once: nothing else may run in a forked copy of a CUDA process */
        close(fds[1]);
        execl("/proc/self/exe", "test_nccl_chan", "--rank1", mode, fd, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    uint32_t n = (uint32_t)len;
    assert_true(write(fds[1], &n, sizeof n) == (ssize_t)sizeof n && write(fds[1], frame, len) == (ssize_t)len);
    close(fds[1]);
    s_poll_ready(l);
    return pid;
}

/* Rank 1's exit status, waiting at most timeout_ms (then it is killed: a failure). */
static int s_wait_rank1(pid_t pid, int64_t timeout_ms)
{
    int64_t t0 = now_ms();
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0 && errno != EINTR)
            return -1;
        if (s_ms_since(t0) > timeout_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -2;
        }
        usleep(10000);
    }
}

static void test_two_gpu_blocks(void **st)
{
    if (s_device_count() < 2) {
        printf("test_two_gpu_blocks: SKIPPED: cudaGetDeviceCount says %d GPU(s); two processes on two GPUs need 2\n",
               s_device_count());
        skip();
    }
    pool_t src;
    assert_int_equal(s_pool_new(&src, TWO_N, 32, 16, 8, 128), 0);
    s_pool_fill(&src, TWO_SEED);
    static int32_t from[TWO_SEND], to[TWO_SEND];
    s_two_blocks(from, to);
    tchan_nccl_t l;
    pid_t pid = s_start_rank1(&l, "recv");
    char err[512];
    int64_t t1 = 0;
    for (int it = 0; it < TWO_ITERS; it++) {
        if (it == 1)
            t1 = now_ns();   /* the first transfer pays first-use costs */
        tchan_nccl_xfer_t x;
        if (tchan_nccl_send(&l, &src.kv, from, TWO_SEND, 30000, &x, err, sizeof err) != 0 ||
            tchan_nccl_wait(&l, &x, err, sizeof err) != 1)
            fail_msg("rank 0: transfer %d: %s", it, err);
    }
    double s = (double)(now_ns() - t1) / 1e9, bytes = (double)(TWO_ITERS - 1) * TWO_SEND * (double)src.kv.block_bytes;
    int rc = s_wait_rank1(pid, 60000);
    if (rc != 0)
        fail_msg("rank 1 (cuda:1) exited with %d (see its lines above)", rc);
    printf("kv_handoff_nccl_bw %.1f GB/s\n", bytes / s / 1e9);
    fflush(stdout);
    assert_int_equal(l.transfers, TWO_ITERS);
    tchan_nccl_close(&l);
    s_pool_free(&src);
}

static void test_two_gpu_dead_peer(void **st)
{
    if (s_device_count() < 2) {
        printf("test_two_gpu_dead_peer: SKIPPED: cudaGetDeviceCount says %d GPU(s); needs 2\n", s_device_count());
        skip();
    }
    pool_t src;
    assert_int_equal(s_pool_new(&src, DEAD_SEND, 32, 16, 8, 128), 0);
    s_pool_fill(&src, 1);
    tchan_nccl_t l;
    pid_t pid = s_start_rank1(&l, "die");
    assert_int_equal(s_wait_rank1(pid, 60000), 0);   /* gone before we send */
    /* 512 MiB: far more than NCCL's buffers hold, so the send needs its receiver. (16 MiB did not
     * do: over NVLink, NCCL's per-channel buffers took it all and the send completed in 1 ms.) */
    static int32_t blocks[DEAD_SEND];
    for (int i = 0; i < DEAD_SEND; i++)
        blocks[i] = i;
    tchan_nccl_xfer_t x;
    char err[512] = "";
    int64_t t0 = now_ms();
    int s = tchan_nccl_send(&l, &src.kv, blocks, DEAD_SEND, 3000, &x, err, sizeof err) == 0
                ? tchan_nccl_wait(&l, &x, err, sizeof err)
                : -1;
    int64_t took = s_ms_since(t0);
    printf("send to a dead peer: failed after %lld ms: %s\n", (long long)took, err);
    assert_int_equal(s, -1);
    assert_true(took < 3000 + 5000);
    assert_int_equal(l.state, TCHAN_NCCL_FAILED);
    assert_non_null(strstr(err, "NCCL link to rank1-on-cuda:1"));
    assert_non_null(strstr(err, "communicator aborted"));
    tchan_nccl_close(&l);
    s_pool_free(&src);
}

/* ---- main ------------------------------------------------------------------------------------- */

static void s_alarm(int sig)
{
    static const char msg[] = "test_nccl_chan: still running after the alarm: something hung\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(3);
}

static int setup(void **st)
{
    char err[512];
    s_be = backend_new("cuda:0", 1, err, sizeof err);
    if (!s_be) {
        fprintf(stderr, "test_nccl_chan: %s\n", err);
        return -1;
    }
    if (!tchan_nccl_available(s_be)) {
        fprintf(stderr, "test_nccl_chan: the CUDA backend was built without NCCL (no nccl.h at build time)\n");
        return -1;
    }
    return 0;
}

static int teardown(void **st)
{
    backend_destroy(&s_be);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGALRM, s_alarm);
    alarm(ALARM_S);
    if (argc == 4 && strcmp(argv[1], "--rank1") == 0)
        return s_rank1(argv[2], atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_blocks),
        cmocka_unit_test(test_self_bandwidth),
        cmocka_unit_test(test_init_deadline),
        cmocka_unit_test(test_recv_deadline),
        cmocka_unit_test(test_two_gpu_blocks),
        cmocka_unit_test(test_two_gpu_dead_peer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
