/* kernels/cuda/cuda_backend.cu — the CUDA backend's table, memory and weight placement, and
 * backend_cuda_new (which backend_new("cuda" / "cuda:N") calls when this library is linked).
 *
 * Memory is plain cudaMalloc (256-byte aligned, more than the 64 the interface promises). All
 * copies and ops go on one non-blocking stream, so they run in the order the engine queued them;
 * upload copies from pageable host memory, which the driver stages before returning, so the
 * caller may reuse its buffer at once; download and sync wait for the stream.
 *
 * weight_put streams checkpoint bytes through two pinned staging buffers: while the DMA engine
 * copies one to the device, the host fills the other, and an event per buffer says when it may be
 * refilled. The host source may be unaligned (a mapped safetensors file): memcpy does not care.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

void cuda_die(const char *expr, const char *why, const char *file, int line)
{
    fprintf(stderr, "troupe cuda: %s failed: %s (%s:%d)\n", expr, why, file, line);
    fflush(stderr);
    exit(1);
}

int cuda_report(const char *expr, const char *why, const char *file, int line)
{
    fprintf(stderr, "troupe cuda: %s failed: %s (%s:%d)\n", expr, why, file, line);
    return -1;
}

/* The scratch buffers cuda_scratch kept after a growth, freed (graphs recorded with them are stale). */
static void s_free_retired(cuda_state_t *st)
{
    for (int i = 0; i < st->n_retired; i++)
        cudaFree(st->retired[i]);
    st->n_retired = 0;
    st->retired_bytes = 0;
}

void *cuda_scratch(backend_t *be, void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return *buf;
    cuda_state_t *st = cuda_st(be);
    if (st->capturing) {   /* the model records only shapes that ran before: a bug, said plainly */
        fprintf(stderr, "troupe cuda: scratch of %zu bytes needed while recording a graph (it has %zu)\n", bytes, *cap);
        abort();
    }
    size_t want = bytes + bytes / 4;
    if (*buf && st->n_retired < CUDA_RETIRED_MAX && st->retired_bytes + *cap <= st->scratch_keep_bytes) {
        /* kept: the graphs recorded with it stay valid (queued ops may still read it: no sync), and
         * a scheduled speculation worker, whose steps grow the buffers now and then all through
         * serving, does not record every graph again (one H100, 2026-12-07: 37 of its 112 records) */
        st->retired[st->n_retired++] = *buf;
        st->retired_bytes += *cap;
    } else {
        CUDA_CHECK(cudaStreamSynchronize(st->stream));   /* the old buffer may still be read by a queued op */
        if (*buf) {
            CUDA_CHECK(cudaFree(*buf));
            st->scratch_gen++;   /* graphs recorded with the old buffer are stale now */
        }
    }
    *buf = NULL;
    *cap = 0;
    cudaError_t e = cudaMalloc(buf, want);
    if (e == cudaErrorMemoryAllocation && st->n_retired > 0) {
        /* the kept buffers are what is missing: freed (every graph goes stale), then again */
        (void)cudaGetLastError();
        CUDA_CHECK(cudaStreamSynchronize(st->stream));
        s_free_retired(st);
        st->scratch_gen++;
        e = cudaMalloc(buf, want);
    }
    CUDA_CHECK(e);
    *cap = want;
    return *buf;
}

static void *s_alloc(backend_t *be, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();                  /* not sticky: clear it so the next check is clean */
        return NULL;
    }
    CUDA_CHECK(e);
    return p;
}

static void s_free(backend_t *be, void *p)
{
    if (p)
        CUDA_CHECK(cudaFree(p));
}

static int s_upload(backend_t *be, void *dst, const void *src, size_t n)
{
    if (n == 0)
        return 0;
    CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cuda_st(be)->stream));
    return 0;
}

static int s_download(backend_t *be, void *dst, const void *src, size_t n)
{
    cuda_state_t *st = cuda_st(be);
    if (n)
        CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st->stream));
    CUDA_TRY(cudaStreamSynchronize(st->stream));
    return 0;
}

/* download_side: the side stream is created at init; the runtime's current device is per thread,
 * so a copier thread sets it first. A pageable destination (a fresh shm segment) would make the
 * driver stage each copy itself, which measured ~0.25 GB/s beside a busy decode loop on the H200;
 * instead the bytes go through two pinned chunks: the DMA of chunk i+1 runs while the CPU copies
 * chunk i out. */
#define SIDE_CHUNK ((size_t)8 << 20)

static int s_download_side(backend_t *be, void *dst, const void *src, size_t n)
{
    cuda_state_t *st = cuda_st(be);
    CUDA_TRY(cudaSetDevice(st->device));
    if (n == 0)
        return 0;
    pthread_mutex_lock(&st->side_lock);
    int rc = 0;
    for (int b = 0; b < 2 && rc == 0; b++) {
        if (!st->side_buf[b] && (cudaMallocHost(&st->side_buf[b], SIDE_CHUNK) != cudaSuccess ||
                                 cudaEventCreateWithFlags(&st->side_ev[b], cudaEventDisableTiming) != cudaSuccess))
            rc = -1;
    }
    const size_t n_chunks = (n + SIDE_CHUNK - 1) / SIDE_CHUNK;
    for (size_t c = 0; rc == 0 && c <= n_chunks; c++) {
        if (c < n_chunks) {   /* queue chunk c */
            const size_t off = c * SIDE_CHUNK, len = n - off < SIDE_CHUNK ? n - off : SIDE_CHUNK;
            if (cudaMemcpyAsync(st->side_buf[c % 2], (const uint8_t *)src + off, len, cudaMemcpyDeviceToHost,
                                st->side) != cudaSuccess ||
                cudaEventRecord(st->side_ev[c % 2], st->side) != cudaSuccess)
                rc = -1;
        }
        if (rc == 0 && c > 0) {   /* copy chunk c - 1 out while chunk c streams in */
            const size_t p = c - 1, off = p * SIDE_CHUNK, len = n - off < SIDE_CHUNK ? n - off : SIDE_CHUNK;
            if (cudaEventSynchronize(st->side_ev[p % 2]) != cudaSuccess)
                rc = -1;
            else
                memcpy((uint8_t *)dst + off, st->side_buf[p % 2], len);
        }
    }
    if (rc != 0) {
        fprintf(stderr, "troupe cuda: download_side of %zu bytes: %s\n", n, cudaGetErrorString(cudaGetLastError()));
        cudaStreamSynchronize(st->side);   /* nothing of ours may still be in flight into the chunks */
    }
    pthread_mutex_unlock(&st->side_lock);
    return rc;
}

static int s_sync(backend_t *be)
{
    CUDA_TRY(cudaStreamSynchronize(cuda_st(be)->stream));
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* Appends p to a growing list of device buffers (weights, slabs). */
static int s_push(void ***list, int *n, int *cap, void *p)
{
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 256;
        void **w = (void **)realloc(*list, (size_t)c * sizeof(*w));
        if (!w)
            return -1;
        *list = w;
        *cap = c;
    }
    (*list)[(*n)++] = p;
    return 0;
}

static int s_track(cuda_state_t *st, void *p) { return s_push(&st->weights, &st->n_weights, &st->cap_weights, p); }

/* Small weights (an MoE layer's 3 MB experts: 18,432 of them in Qwen3-30B-A3B) are carved from
 * 256 MB slabs: one cudaMalloc each cost far more than its bytes (an H200 run ran out of memory with
 * two copies of that model, ~9 GB per process beyond weights and KV). A carved weight is freed with
 * the backend; weight_release frees only weights that have their own allocation. */
#define WEIGHT_SLAB ((size_t)256 << 20)
#define WEIGHT_SMALL ((size_t)16 << 20)

static const void *s_weight_put(backend_t *be, const void *host, size_t bytes, size_t elem_size)
{
    cuda_state_t *st = cuda_st(be);
    void *dev;
    if (bytes <= WEIGHT_SMALL) {
        const size_t need = (bytes + 255) & ~(size_t)255;
        if (!st->n_slabs || st->wslab_used + need > WEIGHT_SLAB) {
            void *slab = s_alloc(be, WEIGHT_SLAB);
            if (!slab)
                return NULL;
            if (s_push(&st->slabs, &st->n_slabs, &st->cap_slabs, slab) < 0) {
                CUDA_CHECK(cudaFree(slab));
                return NULL;
            }
            st->wslab_used = 0;
        }
        dev = (uint8_t *)st->slabs[st->n_slabs - 1] + st->wslab_used;
        st->wslab_used += need;
    } else {
        dev = s_alloc(be, bytes);
        if (!dev)
            return NULL;
        if (s_track(st, dev) < 0) {
            CUDA_CHECK(cudaFree(dev));
            return NULL;
        }
    }
    for (size_t off = 0; host && off < bytes; off += CUDA_STAGE_BYTES) {   /* host NULL: fill_dummy fills it */
        size_t n = bytes - off < CUDA_STAGE_BYTES ? bytes - off : CUDA_STAGE_BYTES;
        int b = st->stage_next;
        st->stage_next ^= 1;
        CUDA_CHECK(cudaEventSynchronize(st->stage_done[b]));   /* its previous copy has left the buffer */
        memcpy(st->stage[b], (const char *)host + off, n);
        CUDA_CHECK(cudaMemcpyAsync((char *)dev + off, st->stage[b], n, cudaMemcpyHostToDevice, st->stream));
        CUDA_CHECK(cudaEventRecord(st->stage_done[b], st->stream));
    }
    return dev;
}

static void s_weight_release(backend_t *be, const void *dev)
{
    cuda_state_t *st = cuda_st(be);
    for (int i = 0; i < st->n_weights; i++)
        if (st->weights[i] == dev) {
            CUDA_CHECK(cudaFree(st->weights[i]));
            st->weights[i] = st->weights[--st->n_weights];
            return;
        }
}

static void s_destroy(backend_t *be)
{
    cuda_state_t *st = cuda_st(be);
    if (st) {
        if (st->stream)
            cudaStreamSynchronize(st->stream);
        for (int i = 0; i < st->n_weights; i++)
            cudaFree(st->weights[i]);
        free(st->weights);
        for (int i = 0; i < st->n_slabs; i++)
            cudaFree(st->slabs[i]);
        free(st->slabs);
        cuda_plans_destroy(st);
        cuda_moe_destroy(st);
        for (int i = 0; i < 2; i++) {
            if (st->stage[i])
                cudaFreeHost(st->stage[i]);
            if (st->stage_done[i])
                cudaEventDestroy(st->stage_done[i]);
        }
        s_free_retired(st);
        if (st->conv)
            cudaFree(st->conv);
        if (st->gout)
            cudaFree(st->gout);
        if (st->quant_x)
            cudaFree(st->quant_x);
        if (st->quant_w)
            cudaFree(st->quant_w);
        if (st->sample_params)
            cudaFree(st->sample_params);
        if (st->part)
            cudaFree(st->part);
        if (st->mla_pf)
            cudaFree(st->mla_pf);
        if (st->lt_ws)
            cudaFree(st->lt_ws);
        if (st->lt)
            cublasLtDestroy(st->lt);
        if (st->blas)
            cublasDestroy(st->blas);
        if (st->stream)
            cudaStreamDestroy(st->stream);
        if (st->side)
            cudaStreamDestroy(st->side);
        for (int b = 0; b < 2; b++) {
            if (st->side_buf[b])
                cudaFreeHost(st->side_buf[b]);
            if (st->side_ev[b])
                cudaEventDestroy(st->side_ev[b]);
        }
        pthread_mutex_destroy(&st->side_lock);
        free(st->h_ids);
        free(st);
    }
    free(be);
}

static size_t cuda_mem_available(backend_t *be)
{
    (void)be;
    size_t free_b = 0, total_b = 0;
    return cudaMemGetInfo(&free_b, &total_b) == cudaSuccess ? free_b : 0;
}

/* CUDA IPC: the handle names the whole cudaMalloc allocation holding dev (the KV pool is one). */
static int cuda_ipc_export(backend_t *be, const void *dev, uint8_t *handle)
{
    (void)be;
    cudaIpcMemHandle_t h;
    static_assert(sizeof h == BK_IPC_HANDLE_BYTES, "IPC handle size");
    if (cudaIpcGetMemHandle(&h, (void *)dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    memcpy(handle, &h, sizeof h);
    return 0;
}

static void *cuda_ipc_open(backend_t *be, const uint8_t *handle)
{
    (void)be;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    void *p = NULL;
    if (cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
        (void)cudaGetLastError();   /* a peer that is gone, or another device: the caller falls back */
        return NULL;
    }
    return p;
}

static void cuda_ipc_close(backend_t *be, void *dev)
{
    (void)be;
    if (dev && cudaIpcCloseMemHandle(dev) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_copy(backend_t *be, void *dst, const void *src, size_t n)
{
    if (n)
        CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cuda_st(be)->stream));
    return 0;
}

static const backend_ops_t s_cuda_ops = {
    .name = "cuda",
    .fuse_weights = 1,
    .weights_copied = 1,
    .quant_formats = (1u << BK_Q_FP8) | (1u << BK_Q_I8) | (1u << BK_Q_I4) | (1u << BK_Q_FP4),
    .quant_moe_formats = (1u << BK_Q_FP8) | (1u << BK_Q_I8) | (1u << BK_Q_I4) | (1u << BK_Q_FP4),
    .destroy = s_destroy,
    .alloc = s_alloc,
    .free = s_free,
    .upload = s_upload,
    .download = s_download,
    .sync = s_sync,
    .download_side = s_download_side,
    .weight_put = s_weight_put,
    .weight_release = s_weight_release,
    .fill_dummy = cuda_fill_dummy,
    .embed = cuda_embed,
    .matmul = cuda_matmul,
    .matmul_n = cuda_matmul_n,
    .add_rmsnorm = cuda_add_rmsnorm,
    .head_rmsnorm = cuda_head_rmsnorm,
    .rope = cuda_rope,
    .swiglu = cuda_swiglu,
    .gate_up_swiglu = cuda_gate_up_swiglu,
    .mlp_swiglu = cuda_mlp_swiglu,
    .rope_kv_store = cuda_rope_kv_store,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .kv_supported = cuda_kv_supported,
    .moe_route = cuda_moe_route,
    .moe_ffn = cuda_moe_ffn,
    .moe_ffn_as = cuda_moe_ffn_as,
    .moe_count = cuda_moe_count,
    .gather_rows = cuda_gather_rows,
    .argmax = cuda_argmax,
    .sample = cuda_sample,
    .mem_available = cuda_mem_available,
    .ipc_export = cuda_ipc_export,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .copy = cuda_copy,
    .nccl = CUDA_NCCL_OPS,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .moe_graphable = cuda_moe_graphable,
    .mla_rope_q = cuda_mla_rope_q,
    .mla_kv_store = cuda_mla_kv_store,
    .mla_attention = cuda_mla_attention,
    .mla_prefill = cuda_mla_prefill,
    .head_matmul = cuda_head_matmul,
    .add = cuda_add,
    .moe_route_sigmoid = cuda_moe_route_sigmoid,
    .mtp_top = cuda_mtp_top,
};

/* TROUPE_CUDA_PDL_SKIP: each kernel's verdict found once from its (mangled) name, which holds the
 * source name verbatim, so "k_attn_merge" matches every instantiation of it. A diagnostic: with
 * the variable unset this is never called. Launches come from the backend's one thread. */
int cuda_pdl_skipped(const cuda_state_t *st, const void *kernel)
{
    enum { CACHE = 256 };
    static const void *seen[CACHE];
    static signed char verdict[CACHE];
    static int n_seen;
    for (int i = 0; i < n_seen; i++)
        if (seen[i] == kernel)
            return verdict[i];
    const char *name = NULL;
    int skip = 0;
    if (cudaFuncGetName(&name, kernel) == cudaSuccess && name) {
        for (const char *p = st->pdl_skip; *p && !skip;) {
            const char *end = strchr(p, ',');
            const size_t len = end ? (size_t)(end - p) : strlen(p);
            char part[128];
            if (len > 0 && len < sizeof part) {
                memcpy(part, p, len);
                part[len] = '\0';
                skip = strstr(name, part) != NULL;
            }
            p += len + (end ? 1 : 0);
        }
        if (skip)
            fprintf(stderr, "backend cuda: %s launches without PDL (TROUPE_CUDA_PDL_SKIP)\n", name);
    } else {
        (void)cudaGetLastError();
    }
    if (n_seen < CACHE) {
        seen[n_seen] = kernel;
        verdict[n_seen++] = (signed char)skip;
    }
    return skip;
}

/* An integer from the environment in [lo, hi], or def when unset; a bad value is an error. */
static int s_env_int(const char *name, int def, int lo, int hi, int *out, char *err, size_t errlen)
{
    const char *v = getenv(name);
    *out = def;
    if (!v || !*v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi)
        return errf(err, errlen, "backend cuda: %s='%s' (expected an integer in [%d, %d])", name, v, lo, hi);
    *out = (int)x;
    return 0;
}

/* TROUPE_CUDA_MLA_PREFILL: absorbed, decompressed or auto (unset or empty: auto). */
static int s_env_mla_prefill(int *out, char *err, size_t errlen)
{
    const char *v = getenv("TROUPE_CUDA_MLA_PREFILL");
    *out = CUDA_MLA_PF_AUTO;
    if (!v || !*v || !strcmp(v, "auto"))
        return 0;
    if (!strcmp(v, "absorbed"))
        *out = CUDA_MLA_PF_ABSORBED;
    else if (!strcmp(v, "decompressed"))
        *out = CUDA_MLA_PF_DECOMPRESSED;
    else
        return errf(err, errlen, "backend cuda: TROUPE_CUDA_MLA_PREFILL='%s' (expected absorbed, decompressed or auto)", v);
    return 0;
}

/* Device setup failures are reported, not fatal: a machine without a GPU gets a clear message. */
#define SETUP(expr, what)                                                                                 \
    do {                                                                                                  \
        cudaError_t e_ = (expr);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            errf(err, errlen, "backend cuda:%d: %s: %s (%s)", device, what, cudaGetErrorString(e_), #expr); \
            goto fail;                                                                                    \
        }                                                                                                 \
    } while (0)
#define SETUP_BLAS(expr, what)                                                                            \
    do {                                                                                                  \
        cublasStatus_t s_ = (expr);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
            errf(err, errlen, "backend cuda:%d: %s: %s (%s)", device, what, cublasGetStatusString(s_), #expr); \
            goto fail;                                                                                    \
        }                                                                                                 \
    } while (0)

extern "C" backend_t *backend_cuda_new(int device, char *err, size_t errlen)
{
    backend_t *be = (backend_t *)calloc(1, sizeof(*be));
    cuda_state_t *st = (cuda_state_t *)calloc(1, sizeof(*st));
    int n_dev = 0;
    cudaDeviceProp prop;
    if (!be || !st) {
        free(be);
        free(st);
        errf(err, errlen, "backend cuda:%d: out of memory", device);
        return NULL;
    }
    be->ops = &s_cuda_ops;
    be->n_threads = 1;
    be->impl = st;
    st->device = device;
    if (s_env_int("TROUPE_CUDA_GEMV_MAX_M", 8, 0, 64, &st->gemv_max_m, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_QGEMV_MAX_M",
                  getenv("TROUPE_CUDA_GEMV_MAX_M") && st->gemv_max_m < 16 ? st->gemv_max_m : 16, 0, 16,
                  &st->qgemv_max_m, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_GEMV_WARPS", 0, 0, 8, &st->gemv_warps, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_GEMV_MMA", 8, 0, 8, &st->gemv_mma, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_GEMV_MMA_MIN_M", 2, 1, 64, &st->gemv_mma_min_m, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_GEMV_MMA_KSTEP", 64, 64, 128, &st->gemv_mma_kstep, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_GEMM_SPLIT", 32, 0, 1 << 30, &st->gemm_split_max_m, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_GEMM_FUSE", 1, 0, 1, &st->gemm_fuse, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_MLP_FUSE", 1, 0, 1, &st->mlp_fuse, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_W8A8_MLP", 1, 0, 1, &st->w8a8_mlp, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_ATTN_SPLIT", 1, 0, 1, &st->attn_split, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_ATTN_SPLIT_BLOCKS", 1, 1, 64, &st->attn_split_blocks, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_ATTN_FLASH", 1, 0, 1, &st->attn_flash, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_ATTN_MMA", 1, 0, 1, &st->attn_mma, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_ATTN_MMA_DECODE", 1, 0, 1, &st->attn_mma_decode, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_ATTN_VERIFY", 2, 0, 2, &st->attn_verify, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_PDL", 1, 0, 1, &st->pdl, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_ATTN_DECODE_PDL", 2, 0, 2, &st->attn_decode_pdl, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_GRAPHS", 1, 0, 1, &st->graphs, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_SCRATCH_KEEP_MB", 256, 0, 1 << 20, &st->scratch_keep_mb, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_GRAPH_PDL", 1, 0, 1, &st->graph_pdl, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_MOE_DEVICE", 1, 0, 1, &st->moe_device, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_MOE_DEVICE_MAX_M", 64, 0, 1 << 30, &st->moe_device_max_m, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_MOE_GROUPED", 1, 0, 1, &st->moe_grouped, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_MOE_GROUPED_MIN_M", 9, 1, 1 << 30, &st->moe_grouped_min_m, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_MOE_GROUPED_BM", 0, 0, 128, &st->moe_grouped_bm, err, errlen) < 0 ||
        s_env_mla_prefill(&st->mla_prefill, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_MLA_PREFILL_KEYS", 0, 0, 1 << 30, &st->mla_pf_keys, err, errlen) < 0 ||
        s_env_int("TROUPE_CUDA_MLA_MMA", 1, 0, 2, &st->mla_mma, err, errlen) < 0)
        goto fail;
    st->scratch_keep_bytes = (size_t)st->scratch_keep_mb << 20;
    {
        const char *skip = getenv("TROUPE_CUDA_PDL_SKIP");
        st->pdl_skip = skip && *skip ? skip : NULL;
    }
    if (st->gemv_warps != 0 && st->gemv_warps != 1 && st->gemv_warps != 4 && st->gemv_warps != 8) {
        errf(err, errlen, "backend cuda: TROUPE_CUDA_GEMV_WARPS=%d (expected 0 = by the matrix, 1, 4 or 8)",
             st->gemv_warps);
        goto fail;
    }
    if (st->gemv_mma_kstep != 64 && st->gemv_mma_kstep != 128) {
        errf(err, errlen, "backend cuda: TROUPE_CUDA_GEMV_MMA_KSTEP=%d (expected 64 or 128)", st->gemv_mma_kstep);
        goto fail;
    }
    if (st->gemv_mma != 0 && st->gemv_mma != 4 && st->gemv_mma != 8) {
        errf(err, errlen, "backend cuda: TROUPE_CUDA_GEMV_MMA=%d (expected 0 = off, 4 or 8 warps per block)",
             st->gemv_mma);
        goto fail;
    }
    if (st->moe_grouped_bm != 0 && st->moe_grouped_bm != 32 && st->moe_grouped_bm != 64 && st->moe_grouped_bm != 128) {
        errf(err, errlen, "backend cuda: TROUPE_CUDA_MOE_GROUPED_BM=%d (expected 0, 32, 64 or 128)", st->moe_grouped_bm);
        goto fail;
    }
    {
        cudaError_t e = cudaGetDeviceCount(&n_dev);
        if (e != cudaSuccess || n_dev == 0) {
            errf(err, errlen, "backend cuda:%d: no CUDA device (%s)", device,
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0");
            goto fail;
        }
    }
    if (device < 0 || device >= n_dev) {
        errf(err, errlen, "backend cuda:%d: no such device (this machine has %d)", device, n_dev);
        goto fail;
    }
    SETUP(cudaSetDevice(device), "cannot select the device");
    SETUP(cudaGetDeviceProperties(&prop, device), "cannot read the device properties");
    st->n_sm = prop.multiProcessorCount;
    SETUP(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cannot create a stream");
    SETUP(cudaStreamCreateWithFlags(&st->side, cudaStreamNonBlocking), "cannot create the side stream");
    pthread_mutex_init(&st->side_lock, NULL);
    SETUP_BLAS(cublasCreate(&st->blas), "cannot create a cuBLAS handle");
    SETUP_BLAS(cublasSetStream(st->blas, st->stream), "cannot bind cuBLAS to the stream");
    SETUP_BLAS(cublasSetMathMode(st->blas, CUBLAS_PEDANTIC_MATH), "cannot turn TF32 off");
    SETUP_BLAS(cublasLtCreate(&st->lt), "cannot create a cuBLASLt handle");
    st->lt_ws_bytes = (size_t)32 << 20;
    SETUP(cudaMalloc(&st->lt_ws, st->lt_ws_bytes), "cannot allocate the cuBLASLt workspace");
    SETUP(cublasSetWorkspace(st->blas, st->lt_ws, st->lt_ws_bytes) == CUBLAS_STATUS_SUCCESS ? cudaSuccess
                                                                                             : cudaErrorUnknown,
          "cannot give cuBLAS its workspace");
    for (int i = 0; i < 2; i++) {
        SETUP(cudaHostAlloc(&st->stage[i], CUDA_STAGE_BYTES, cudaHostAllocDefault), "cannot pin the staging buffers");
        SETUP(cudaEventCreateWithFlags(&st->stage_done[i], cudaEventDisableTiming), "cannot create an event");
        SETUP(cudaEventRecord(st->stage_done[i], st->stream), "cannot record an event");
    }
    return be;
fail:
    s_destroy(be);
    return NULL;
}
