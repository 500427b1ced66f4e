/* kernels/cuda/cuda_split.cuh — where a GEMV's or GEMM's output rows go when its weight is several
 * weights' rows stacked (q|k|v, gate|up): internal to cuda_matmul.cu and cuda_gemv_mma.cuh. */
#ifndef TROUPE_KERNELS_CUDA_SPLIT_CUH
#define TROUPE_KERNELS_CUDA_SPLIT_CUH

#include <stdint.h>

/* Outputs of a matrix whose rows are several weights' rows stacked (q|k|v): row n of the whole
 * goes to part p, the first with n < end[p], as column n - end[p-1] of y[p] ([M][end[p] - end[p-1]]).
 * One part (end[0] = N) is a plain y [M][N]. Used by the GEMV's epilogue and the GEMM's split. */
#define SPLIT_MAX_PARTS 4
typedef struct split_args {
    float *y[SPLIT_MAX_PARTS];
    int64_t end[SPLIT_MAX_PARTS];                  /* the part's last row + 1 in the whole */
    int parts;
} split_args_t;

/* Where row m, column n of the whole goes. Only constant indices into o: an array of a kernel's
 * parameters indexed by a variable is copied to local memory by every thread (measured: the 8B
 * step's GEMVs at batch 1 went from 4.26 to 7.82 ms with a `while (n >= o.end[p]) p++`). */
__device__ __forceinline__ float *dev_split_dst(const split_args_t &o, int64_t m, int64_t n)
{
    float *y = o.y[0];
    int64_t c0 = 0, width = o.end[0];
#pragma unroll
    for (int p = 1; p < SPLIT_MAX_PARTS; p++)
        if (p < o.parts && n >= o.end[p - 1]) {
            y = o.y[p];
            c0 = o.end[p - 1];
            width = o.end[p] - c0;
        }
    return y + m * width + (n - c0);
}

/* y [M][n] as the one part of a split_args_t. */
static inline split_args_t s_one_part(float *y, int64_t n)
{
    split_args_t o = {};
    o.y[0] = y;
    o.end[0] = n;
    o.parts = 1;
    return o;
}

#endif
