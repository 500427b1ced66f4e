/* kernels/cpu/cpu_moe.c — mixture-of-experts routing and the routed experts' SwiGLU FFNs.
 *
 * The FFN groups tokens by expert (a counting sort of the (token, slot) pairs), then runs each
 * expert that has tokens over exactly those rows with the ordinary matmul, in ascending expert
 * order, adding weight * output into out as HF's index_add_ does. Experts run one after another,
 * each matmul using every thread; all buffers come from the caller's scratch. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void cpu_moe_route(backend_t *be, const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights)
{
    for (int t = 0; t < M; t++) {
        const float *r = logits + (size_t)t * E;
        int32_t *id = ids + (size_t)t * k;
        float *w = weights + (size_t)t * k;
        float mx = r[0], sum = 0;
        for (int e = 1; e < E; e++)
            mx = r[e] > mx ? r[e] : mx;
        for (int e = 0; e < E; e++)
            sum += expf(r[e] - mx);
        /* Selection by repeated scans (k is small): the largest probability not taken yet, the
         * lower index on ties. Probabilities are compared, not logits, as HF's topk on softmax
         * output does (rounding can tie two different logits). */
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bp = 0;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++)
                    taken |= id[i] == e;
                if (taken)
                    continue;
                float p = expf(r[e] - mx) / sum;
                if (best < 0 || p > bp) {
                    best = e;
                    bp = p;
                }
            }
            id[j] = best;
            w[j] = bp;
        }
        if (renorm) {
            float s = 0;
            for (int j = 0; j < k; j++)
                s += w[j];
            for (int j = 0; j < k; j++)
                w[j] /= s;
        }
    }
}

void cpu_moe_count(backend_t *be, const int32_t *ids, int n, uint32_t *counts)
{
    (void)be;
    for (int i = 0; i < n; i++)
        counts[ids[i]]++;
}

void cpu_moe_ffn(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                 const bk_expert_t *experts, int n_experts, void *scratch, float *out)
{
    int I = 0;
    for (int e = 0; e < n_experts; e++)
        I = experts[e].gate.rows > I ? (int)experts[e].gate.rows : I;
    const size_t rows = (size_t)M * (size_t)k;
    /* Scratch layout (moe_scratch_bytes): xg [M][H], yd [M][H], g [M][I], u [M][I] floats, then
     * start [E+1], tok [M*k], slot [M*k] ints. */
    float *xg = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *yd = xg + (size_t)M * H, *g = yd + (size_t)M * H, *u = g + (size_t)M * I;
    int32_t *start = (int32_t *)(u + (size_t)M * I), *tok = start + n_experts + 1, *slot = tok + rows;

    memset(start, 0, (size_t)(n_experts + 1) * sizeof(int32_t));
    for (size_t r = 0; r < rows; r++)
        start[ids[r] + 1]++;
    for (int e = 0; e < n_experts; e++)
        start[e + 1] += start[e];
    for (size_t r = 0; r < rows; r++) {           /* stable: tokens stay in ascending order */
        int e = ids[r];
        int at = start[e]++;
        tok[at] = (int32_t)(r / (size_t)k);
        slot[at] = (int32_t)r;
    }
    for (int e = n_experts; e > 0; e--)           /* undo the ++: start[e] is expert e's first entry again */
        start[e] = start[e - 1];
    start[0] = 0;

    memset(out, 0, (size_t)M * H * sizeof(float));
    for (int e = 0; e < n_experts; e++) {
        const int c = start[e + 1] - start[e];
        if (c == 0)
            continue;
        const int32_t *te = tok + start[e], *se = slot + start[e];
        const bk_expert_t *ex = &experts[e];
        const int Ie = (int)ex->gate.rows;
        for (int i = 0; i < c; i++)
            memcpy(xg + (size_t)i * H, x + (size_t)te[i] * H, (size_t)H * sizeof(float));
        cpu_matmul(be, xg, c, &ex->gate, NULL, g);
        cpu_matmul(be, xg, c, &ex->up, NULL, u);
        cpu_swiglu(be, g, u, c * Ie, g);
        cpu_matmul(be, g, c, &ex->down, NULL, yd);
        for (int i = 0; i < c; i++) {
            float *o = out + (size_t)te[i] * H, w = weights[se[i]];
            const float *y = yd + (size_t)i * H;
            for (int h = 0; h < H; h++) {
                float p = y[h] * w;                /* rounded product, then the add: HF's order */
                o[h] += p;
            }
        }
    }
}
