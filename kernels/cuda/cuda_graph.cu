/* kernels/cuda/cuda_graph.cu — the backend's graph hooks (kernels/backend.h): a decode step's ops
 * recorded once by stream capture and replayed with one cudaGraphLaunch.
 *
 * Capture is per thread (cudaStreamCaptureModeThreadLocal): the write-back copier's thread keeps
 * using its side stream meanwhile. Nothing recorded may synchronise or allocate: the model records
 * only steps whose shape ran uncaptured before (so cuda_scratch has already grown the buffers the
 * step needs) and whose ops never wait for the host (no host-sorted MoE path).
 *
 * Staleness: cuda_scratch reallocates a buffer when a larger step needs more, keeping the old one
 * (up to TROUPE_CUDA_SCRATCH_KEEP_MB in all: the graphs recorded with it stay valid) or freeing it; a graph
 * recorded before still holds the old address. Every reallocation that frees one bumps
 * st->scratch_gen, a graph remembers the generation it was recorded in, and graph_launch refuses a
 * graph of an older one (returns 1): the model frees it and records the step again.
 *
 * PDL: kernels are recorded with the programmatic-serialisation attribute (programmatic edges,
 * CUDA 12.3+), so inside a graph too a GEMV streams its first weights while the kernel before it
 * ends (a graph launch saves the launches, not that overlap; +0.7% at batch 1 on an H200, measured 2026-11-29).
 * TROUPE_CUDA_GRAPH_PDL=0 records plain edges; tools/gpu-run.sh measures both. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda.h"

typedef struct cuda_graph {
    cudaGraphExec_t exec;
    uint64_t gen;                 /* st->scratch_gen when recorded */
} cuda_graph_t;

int cuda_graph_begin(backend_t *be)
{
    cuda_state_t *st = cuda_st(be);
    if (!st->graphs || st->capturing)
        return -1;
    if (cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    st->capturing = 1;
    return 0;
}

void *cuda_graph_end(backend_t *be, char *err, size_t errlen)
{
    cuda_state_t *st = cuda_st(be);
    if (!st->capturing) {
        errf(err, errlen, "backend cuda: graph_end without graph_begin");
        return NULL;
    }
    st->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(st->stream, &g);
    if (e != cudaSuccess || !g) {
        (void)cudaGetLastError();
        errf(err, errlen, "backend cuda: stream capture failed: %s", cudaGetErrorString(e));
        if (g)
            cudaGraphDestroy(g);
        return NULL;
    }
    cuda_graph_t *cg = (cuda_graph_t *)calloc(1, sizeof *cg);
    e = cg ? cudaGraphInstantiate(&cg->exec, g, 0) : cudaErrorMemoryAllocation;
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        errf(err, errlen, "backend cuda: cannot instantiate the recorded graph: %s", cudaGetErrorString(e));
        free(cg);
        return NULL;
    }
    cg->gen = st->scratch_gen;
    return cg;
}

int cuda_graph_launch(backend_t *be, void *graph)
{
    cuda_state_t *st = cuda_st(be);
    cuda_graph_t *cg = (cuda_graph_t *)graph;
    if (cg->gen != st->scratch_gen)
        return 1;
    CUDA_CHECK(cudaGraphLaunch(cg->exec, st->stream));
    return 0;
}

void cuda_graph_free(backend_t *be, void *graph)
{
    cuda_graph_t *cg = (cuda_graph_t *)graph;
    if (!cg)
        return;
    CUDA_CHECK(cudaStreamSynchronize(cuda_st(be)->stream));   /* no replay of it may still be queued */
    cudaGraphExecDestroy(cg->exec);
    free(cg);
}
