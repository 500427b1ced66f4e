/* kernels/dummy_fill.h — the values of the 'dummy' load format, shared by the host
 * (engine/checkpoint.c) and a device fill (a backend's fill_dummy: kernels/cuda/cuda_dummy.cu),
 * so a weight made on the GPU has the same bits as the one the checkpoint would have made on the
 * host. Tests pin its values (test_checkpoint, test_model; tests/gpu/test_dummy_fill).
 *
 * Element i of a tensor is a pure function of (key, i): u = splitmix64's finaliser of
 * key + (i + 1) * golden, unit = the top 24 bits of u / 2^24 (exactly representable), and the value
 * center + scale * (2 unit - 1), each product and sum rounded separately (no fused multiply-add on
 * either side: the device code spells the roundings out). */
#ifndef TROUPE_KERNELS_DUMMY_FILL_H
#define TROUPE_KERNELS_DUMMY_FILL_H

#include <stdint.h>

#ifdef __CUDACC__
#define DUMMY_HD __host__ __device__
#else
#define DUMMY_HD
#endif

static inline DUMMY_HD uint64_t dummy_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;   /* splitmix64 finaliser */
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline DUMMY_HD float dummy_value(uint64_t key, uint64_t i, float center, float scale)
{
    const uint64_t u = dummy_mix(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    const float unit = (float)(u >> 40) * (1.0f / 16777216.0f);   /* 24 bits: [0, 1) exactly */
#ifdef __CUDA_ARCH__
    return __fadd_rn(center, __fmul_rn(scale, __fsub_rn(__fmul_rn(2.0f, unit), 1.0f)));
#else
    return center + scale * (2.0f * unit - 1.0f);
#endif
}

#endif
