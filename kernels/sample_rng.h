/* kernels/sample_rng.h — the `sample` op's counter-based randomness, shared by its CPU reference
 * (kernels/cpu/cpu_sample.c, which the host sampler runs too) and the device kernel
 * (kernels/cuda/cuda_sample.cu) so the two cannot drift: u depends on (seed, step) alone, in
 * integer arithmetic and one exact conversion. Tests pin its values (test_sampler, test_sample_op).
 */
#ifndef TROUPE_KERNELS_SAMPLE_RNG_H
#define TROUPE_KERNELS_SAMPLE_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define SAMPLE_RNG_FN __host__ __device__ static inline
#else
#define SAMPLE_RNG_FN static inline
#endif

/* splitmix64's finaliser. */
SAMPLE_RNG_FN uint64_t sample_rng_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* u in [0, 1) from (seed, step) alone: 53 random bits, exact in a double. */
SAMPLE_RNG_FN double sample_rng_uniform(uint64_t seed, uint64_t step)
{
    uint64_t z = sample_rng_mix(sample_rng_mix(seed ^ 0x5851f42d4c957f2dull) + (step + 1) * 0x9e3779b97f4a7c15ull);
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

#endif
