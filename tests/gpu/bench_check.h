/* tests/gpu/bench_check.h — the GPU benchmarks' checked calls: a failed CUDA or cuBLAS call prints
 * the call, the library's message, the file and line, and exits 1 (a benchmark has nothing to
 * clean up that the process exit does not). BENCH_NAME names the program in the message. */
#ifndef TROUPE_TESTS_GPU_BENCH_CHECK_H
#define TROUPE_TESTS_GPU_BENCH_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(expr)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (expr);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "%s: %s failed: %s (%s:%d)\n", BENCH_NAME, #expr, cudaGetErrorString(e_), __FILE__, \
                    __LINE__);                                                                            \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)
#define CKB(expr)                                                                                         \
    do {                                                                                                  \
        cublasStatus_t s_ = (expr);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
            fprintf(stderr, "%s: %s failed: %s (%s:%d)\n", BENCH_NAME, #expr, cublasGetStatusString(s_), __FILE__, \
                    __LINE__);                                                                            \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

#endif
