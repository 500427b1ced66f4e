/* tests/gpu/bench_check.h — the GPU benchmarks' checked calls: a failed CUDA or cuBLAS call prints
 * the call, the library's message, the file and line, and exits 1 (a benchmark has nothing to
 * clean up that the process exit does not). BENCH_NAME names the program in the message. */
#ifndef TROUPE_TESTS_GPU_BENCH_CHECK_H
#define TROUPE_TESTS_GPU_BENCH_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* expr's status of type T, ok when it equals OK; MSG turns a status into text. */
#define BENCH_CHECK(expr, T, OK, MSG)                                                                     \
    do {                                                                                                  \
        T s_ = (expr);                                                                                    \
        if (s_ != (OK)) {                                                                                 \
            fprintf(stderr, "%s: %s failed: %s (%s:%d)\n", BENCH_NAME, #expr, MSG(s_), __FILE__, __LINE__); \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)
#define CK(expr) BENCH_CHECK(expr, cudaError_t, cudaSuccess, cudaGetErrorString)
#define CKB(expr) BENCH_CHECK(expr, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)

#endif
