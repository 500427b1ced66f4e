/* tests/gpu/bench_nccl.cu — NCCL's own point-to-point bandwidth between GPU 0 and GPU 1: the
 * baseline the KV hand-off over our NCCL channel (test_nccl_chan's "kv_handoff_nccl_bw") is
 * compared with (issue #6). One process drives both GPUs (ncclCommInitAll), as nccl-tests'
 * sendrecv does: a contiguous buffer sent 0 -> 1 in one group per iteration, after a warm-up.
 *   build/gpu-tests/bench_nccl [MiB per transfer, default 1024] [iterations, default 10]
 * Prints "nccl_raw_p2p_bw <x> GB/s", or a SKIPPED line with fewer than two GPUs (exit 0). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#if !__has_include(<nccl.h>)
int main(void)
{
    printf("nccl_raw_p2p: SKIPPED: built without nccl.h\n");
    return 0;
}
#else
#include <nccl.h>

#define CHECK_CUDA(x)                                                                                          \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "bench_nccl: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__);   \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)
#define CHECK_NCCL(x)                                                                                          \
    do {                                                                                                       \
        ncclResult_t r_ = (x);                                                                                 \
        if (r_ != ncclSuccess) {                                                                               \
            fprintf(stderr, "bench_nccl: %s: %s (%s:%d)\n", #x, ncclGetErrorString(r_), __FILE__, __LINE__);   \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)

int main(int argc, char **argv)
{
    const size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 1024;
    const int iters = argc > 2 ? atoi(argv[2]) : 10;
    int n_dev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&n_dev));
    if (n_dev < 2) {
        printf("nccl_raw_p2p: SKIPPED: cudaGetDeviceCount says %d GPU(s); needs 2\n", n_dev);
        return 0;
    }
    if (mib == 0 || iters < 1) {
        fprintf(stderr, "usage: bench_nccl [MiB per transfer >= 1] [iterations >= 1]\n");
        return 2;
    }
    const size_t bytes = mib << 20;
    int devs[2] = {0, 1};
    ncclComm_t comm[2];
    CHECK_NCCL(ncclCommInitAll(comm, 2, devs));
    void *buf[2];
    cudaStream_t st[2];
    for (int d = 0; d < 2; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaMalloc(&buf[d], bytes));
        CHECK_CUDA(cudaMemset(buf[d], d, bytes));
        CHECK_CUDA(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
    }
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    for (int it = -1; it < iters; it++) {   /* -1: warm-up (connection setup) */
        if (it == 0)
            CHECK_CUDA(cudaEventRecord(t0, st[0]));
        CHECK_NCCL(ncclGroupStart());
        CHECK_NCCL(ncclSend(buf[0], bytes, ncclChar, 1, comm[0], st[0]));
        CHECK_NCCL(ncclRecv(buf[1], bytes, ncclChar, 0, comm[1], st[1]));
        CHECK_NCCL(ncclGroupEnd());
        for (int d = 0; d < 2; d++) {
            CHECK_CUDA(cudaSetDevice(d));
            CHECK_CUDA(cudaStreamSynchronize(st[d]));
        }
        CHECK_CUDA(cudaSetDevice(0));
    }
    CHECK_CUDA(cudaEventRecord(t1, st[0]));
    CHECK_CUDA(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    /* The receiver got the sender's bytes (value 0 everywhere: set by device 0's memset). */
    unsigned char probe[2] = {1, 1};
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMemcpy(&probe[0], buf[1], 1, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&probe[1], (char *)buf[1] + bytes - 1, 1, cudaMemcpyDeviceToHost));
    if (probe[0] != 0 || probe[1] != 0) {
        fprintf(stderr, "bench_nccl: the receiver's buffer does not hold the sender's bytes\n");
        return 1;
    }
    printf("nccl_raw_p2p_bw %.1f GB/s (%zu MiB x %d, GPU 0 -> GPU 1)\n", (double)bytes * iters / (ms / 1e3) / 1e9, mib,
           iters);
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        cudaFree(buf[d]);
        cudaStreamDestroy(st[d]);
        ncclCommDestroy(comm[d]);
    }
    return 0;
}
#endif
