/* kernels/cuda/cuda_dummy.cu — the 'dummy' load format's values made in device memory
 * (backend.h fill_dummy): bit for bit what engine/checkpoint.c makes on the host (both call
 * kernels/dummy_fill.h), so a GPU worker of a 61 GB model neither generates it on the host nor
 * copies it over PCIe. Rounding to bf16/f16 is round-to-nearest-even, as dtype_from_f32 (the
 * values are finite); to fp8 e4m3 as common/dtype.h's f32_to_f8e4m3. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/dummy_fill.h"

template <typename T>
__global__ void k_fill_dummy(T *out, uint64_t n, uint64_t key, float center, float scale)
{
    DEV_PDL_ENTER();
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
        dev_store(out + i, dummy_value(key, i, center, scale));
}

void cuda_fill_dummy(backend_t *be, void *dev, dtype_t dt, size_t n, uint64_t key, float center, float scale)
{
    if (n == 0)
        return;
    const cuda_state_t *st = cuda_st(be);
    const uint64_t blocks = (n + 255) / 256 < (uint64_t)st->n_sm * 16 ? (n + 255) / 256 : (uint64_t)st->n_sm * 16;
    switch (dt) {
    case DT_F32: cuda_launch(st, k_fill_dummy<float>, (unsigned)blocks, 256, (float *)dev, (uint64_t)n, key, center, scale); break;
    case DT_BF16:
        cuda_launch(st, k_fill_dummy<__nv_bfloat16>, (unsigned)blocks, 256, (__nv_bfloat16 *)dev, (uint64_t)n, key, center,
                    scale);
        break;
    case DT_F8E4M3:   /* online-quantized fp8 codes: values, never the NaN codes another type's bytes hold */
        cuda_launch(st, k_fill_dummy<__nv_fp8_e4m3>, (unsigned)blocks, 256, (__nv_fp8_e4m3 *)dev, (uint64_t)n, key, center,
                    scale);
        break;
    default: cuda_launch(st, k_fill_dummy<__half>, (unsigned)blocks, 256, (__half *)dev, (uint64_t)n, key, center, scale); break;
    }
}
