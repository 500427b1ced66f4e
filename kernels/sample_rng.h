/* engine/sampler_rng.h — the sampler's counter-based randomness, shared by the host sampler
 * (engine/sampler.c) and the device sampling kernel (kernels/cuda/cuda_sample.cu) so the two
 * cannot drift: u depends on (seed, step) alone, in integer arithmetic and one exact conversion.
 */
#ifndef TROUPE_ENGINE_SAMPLER_RNG_H
#define TROUPE_ENGINE_SAMPLER_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define SAMPLER_RNG_FN __host__ __device__ static inline
#else
#define SAMPLER_RNG_FN static inline
#endif

/* splitmix64's finaliser. */
SAMPLER_RNG_FN uint64_t sampler_rng_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* u in [0, 1) from (seed, step) alone: 53 random bits, exact in a double. */
SAMPLER_RNG_FN double sampler_rng_uniform(uint64_t seed, uint64_t step)
{
    uint64_t z = sampler_rng_mix(sampler_rng_mix(seed ^ 0x5851f42d4c957f2dull) + (step + 1) * 0x9e3779b97f4a7c15ull);
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

#endif
