/* kernels/cuda/cuda_moe.cu — mixture-of-experts routing and the routed experts' SwiGLU FFNs.
 *
 * Routing runs one thread per token with the CPU reference's exact algorithm (sequential max and
 * sum, selection by repeated scans comparing probabilities, ties to the lower index), so ids agree
 * with the CPU unless expf's last bit decides a near-tie.
 *
 * The FFN is grouped per expert like the CPU's: the routing comes back to the host (one stream
 * sync per MoE layer: the host must know each expert's token count to size its matmuls), is
 * counting-sorted by expert there, and the sorted token lists go up into the scratch. Then, for
 * each expert that has tokens, in ascending expert order: gather its rows, gate and up matmuls
 * (cuda_matmul: GEMV for a few rows, cuBLASLt for many), SwiGLU, down, and a scatter that adds
 * weight * row into out. One launch per expert, queued in expert order, so every token's sum is
 * accumulated in ascending expert order with a rounded product then a rounded add: HF's index_add_
 * order, as the CPU. A token appears at most once per expert, so a scatter has no write conflicts.
 *
 * Known limit: the host round trip and the per-expert launches make a many-expert prefill (128
 * experts) launch-bound; a grouped GEMM over all experts at once is the next step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"

__global__ void k_moe_route(const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights)
{
    DEV_PDL_ENTER();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= M)
        return;
    const float *r = logits + (size_t)t * E;
    int32_t *id = ids + (size_t)t * k;
    float *w = weights + (size_t)t * k;
    float mx = r[0], sum = 0.0f;
    for (int e = 1; e < E; e++)
        mx = r[e] > mx ? r[e] : mx;
    for (int e = 0; e < E; e++)
        sum += expf(r[e] - mx);
    for (int j = 0; j < k; j++) {
        int best = -1;
        float bp = 0.0f;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken |= id[i] == e;
            if (taken)
                continue;
            const float p = expf(r[e] - mx) / sum;
            if (best < 0 || p > bp) {
                best = e;
                bp = p;
            }
        }
        id[j] = best;
        w[j] = bp;
    }
    if (renorm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += w[j];
        for (int j = 0; j < k; j++)
            w[j] /= s;
    }
}

void cuda_moe_route(backend_t *be, const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights)
{
    if (M <= 0)
        return;
    cuda_launch(cuda_st(be), k_moe_route, (M + 63) / 64, 64, logits, M, E, k, renorm, ids, weights);
}

/* out[tok[i]] += weights[slot[i]] * y[i] for the c rows of one expert. */
__global__ void k_moe_scatter(const float *y, const int32_t *tok, const int32_t *slot, const float *weights, int H,
                              float *out)
{
    DEV_PDL_ENTER();
    const int i = blockIdx.x;
    const float w = weights[slot[i]];
    const float *yr = y + (size_t)i * H;
    float *o = out + (size_t)tok[i] * H;
    for (int h = threadIdx.x; h < H; h += blockDim.x)
        o[h] = __fadd_rn(o[h], __fmul_rn(yr[h], w));   /* rounded product, then the add: HF's order */
}

void cuda_moe_ffn(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                  const bk_expert_t *experts, int n_experts, void *scratch, float *out)
{
    if (M <= 0)
        return;
    cuda_state_t *st = cuda_st(be);
    cudaStream_t s = st->stream;
    int I = 0;
    for (int e = 0; e < n_experts; e++)
        I = experts[e].gate.rows > I ? (int)experts[e].gate.rows : I;
    const size_t rows = (size_t)M * (size_t)k;

    /* Host lists: ids [rows] | start [E+1] | tok [rows] | slot [rows]. */
    const size_t need = rows * 3 + (size_t)n_experts + 1;
    if (need > st->h_ids_cap) {
        int32_t *p = (int32_t *)realloc(st->h_ids, need * sizeof(int32_t));
        if (!p)
            cuda_die("realloc(moe routing lists)", "out of memory", __FILE__, __LINE__);
        st->h_ids = p;
        st->h_ids_cap = need;
    }
    int32_t *h_ids = st->h_ids, *start = h_ids + rows, *tok = start + n_experts + 1, *slot = tok + rows;
    CUDA_CHECK(cudaMemcpyAsync(h_ids, ids, rows * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    memset(start, 0, (size_t)(n_experts + 1) * sizeof(int32_t));
    for (size_t r = 0; r < rows; r++) {
        if (h_ids[r] < 0 || h_ids[r] >= n_experts) {   /* moe_route writes these: a bad one is our bug */
            fprintf(stderr, "troupe cuda: moe_ffn: routing entry %zu is expert %d of %d (%s:%d)\n", r, h_ids[r],
                    n_experts, __FILE__, __LINE__);
            exit(1);
        }
        start[h_ids[r] + 1]++;
    }
    for (int e = 0; e < n_experts; e++)
        start[e + 1] += start[e];
    for (size_t r = 0; r < rows; r++) {            /* stable: tokens stay in ascending order */
        const int at = start[h_ids[r]]++;
        tok[at] = (int32_t)(r / (size_t)k);
        slot[at] = (int32_t)r;
    }
    for (int e = n_experts; e > 0; e--)            /* undo the ++: start[e] is expert e's first entry again */
        start[e] = start[e - 1];
    start[0] = 0;

    /* Device scratch (moe_scratch_bytes): xg [M][H], yd [M][H], g [M][I], u [M][I] floats, then
     * tok [rows], slot [rows]. */
    float *xg = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *yd = xg + (size_t)M * H, *g = yd + (size_t)M * H, *u = g + (size_t)M * I;
    int32_t *d_tok = (int32_t *)(u + (size_t)M * I), *d_slot = d_tok + rows;
    /* From pageable memory the copy is staged before it returns: h_ids may be reused at once. */
    CUDA_CHECK(cudaMemcpyAsync(d_tok, tok, rows * 2 * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)M * H * sizeof(float), s));
    for (int e = 0; e < n_experts; e++) {
        const int c = start[e + 1] - start[e];
        if (c == 0)
            continue;
        const bk_expert_t *ex = &experts[e];
        cuda_launch_gather(st, x, d_tok + start[e], c, H, xg);
        cuda_matmul(be, xg, c, &ex->gate, NULL, g);
        cuda_matmul(be, xg, c, &ex->up, NULL, u);
        cuda_swiglu(be, g, u, c * (int)ex->gate.rows, g);
        cuda_matmul(be, g, c, &ex->down, NULL, yd);
        cuda_launch(st, k_moe_scatter, c, H >= 1024 ? 256 : 128, (const float *)yd, (const int32_t *)d_tok + start[e],
                    (const int32_t *)d_slot + start[e], weights, H, out);
    }
}
