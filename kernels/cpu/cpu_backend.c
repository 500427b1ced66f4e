/* kernels/cpu/cpu_backend.c — the CPU backend's table and memory, and backend_new by name.
 *
 * "Device" memory is host memory (64-byte aligned), so upload and download are memcpy and every
 * op finishes before it returns. Checkpoint weights are used in place (the mmap of the
 * safetensors file) when naturally aligned, which is the common case; a misaligned tensor is
 * copied once into aligned memory and freed by weight_release.
 *
 * backend_new lives here because kernels/cpu/ is what every build links; the CUDA backend comes
 * from libtroupe_cuda.a through a weak symbol, so a CPU-only binary links and says so clearly. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/cpu.h"

static void *s_alloc(backend_t *be, size_t bytes)
{
    void *p = NULL;
    size_t n = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, n ? n : 64) != 0)
        return NULL;
    return p;
}

static void s_free(backend_t *be, void *p) { free(p); }

static int s_upload(backend_t *be, void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
    return 0;
}

static int s_download(backend_t *be, void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
    return 0;
}

static int s_sync(backend_t *be) { return 0; }

static const void *s_weight_put(backend_t *be, const void *host, size_t bytes, size_t elem_size)
{
    if (host && ((uintptr_t)host % elem_size) == 0)
        return host;
    cpu_state_t *st = be->impl;
    if (st->n_copies == st->cap_copies) {
        int cap = st->cap_copies ? st->cap_copies * 2 : 64;
        const void **c = realloc(st->copies, (size_t)cap * sizeof(*c));
        if (!c)
            return NULL;
        st->copies = c;
        st->cap_copies = cap;
    }
    void *p = s_alloc(be, bytes);
    if (!p)
        return NULL;
    if (host)
        memcpy(p, host, bytes);
    st->copies[st->n_copies++] = p;
    return p;
}

static void s_weight_release(backend_t *be, const void *dev)
{
    cpu_state_t *st = be->impl;
    for (int i = 0; i < st->n_copies; i++)
        if (st->copies[i] == dev) {
            free((void *)dev);
            st->copies[i] = st->copies[--st->n_copies];
            return;
        }
}

static void s_destroy(backend_t *be)
{
    cpu_state_t *st = be->impl;
    for (int i = 0; i < st->n_copies; i++)
        free((void *)st->copies[i]);
    free(st->copies);
    free(st->sample_scratch);
    free(st->quant_scratch);
    free(st);
    free(be);
}

static int cpu_copy(backend_t *be, void *dst, const void *src, size_t n)
{
    (void)be;
    if (n)
        memcpy(dst, src, n);
    return 0;
}

static const backend_ops_t s_cpu_ops = {
    .name = "cpu",
    .quant_formats = (1u << BK_Q_FP8) | (1u << BK_Q_I8) | (1u << BK_Q_I4) | (1u << BK_Q_FP4),
    .quant_moe_formats = (1u << BK_Q_FP8) | (1u << BK_Q_I8) | (1u << BK_Q_I4) | (1u << BK_Q_FP4),
    .destroy = s_destroy,
    .alloc = s_alloc,
    .free = s_free,
    .upload = s_upload,
    .download = s_download,
    .sync = s_sync,
    .download_side = s_download,   /* a memcpy: no queue to wait for */
    .weight_put = s_weight_put,
    .weight_release = s_weight_release,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .add_rmsnorm = cpu_add_rmsnorm,
    .head_rmsnorm = cpu_head_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .moe_route = cpu_moe_route,
    .moe_ffn = cpu_moe_ffn,
    .moe_count = cpu_moe_count,
    .gather_rows = cpu_gather_rows,
    .argmax = cpu_argmax,
    .sample = cpu_sample,
    .copy = cpu_copy,
    .mla_rope_q = cpu_mla_rope_q,
    .mla_kv_store = cpu_mla_kv_store,
    .mla_attention = cpu_mla_attention,
    .head_matmul = cpu_head_matmul,
    .add = cpu_add,
    .moe_route_sigmoid = cpu_moe_route_sigmoid,
    .mtp_top = cpu_mtp_top,
};

backend_t *backend_cpu_new(int n_threads)
{
    backend_t *be = calloc(1, sizeof(*be));
    cpu_state_t *st = calloc(1, sizeof(*st));
    if (!be || !st) {
        free(be);
        free(st);
        return NULL;
    }
    be->ops = &s_cpu_ops;
    be->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    be->impl = st;
    return be;
}

backend_t *backend_new(const char *kind, int n_threads, char *err, size_t errlen)
{
    if (!kind || strcmp(kind, "cpu") == 0) {
        backend_t *be = backend_cpu_new(n_threads);
        if (!be)
            errf(err, errlen, "backend cpu: out of memory");
        return be;
    }
    if (strncmp(kind, "cuda", 4) == 0 && (kind[4] == 0 || kind[4] == ':')) {
        int device = 0;
        if (kind[4] == ':') {
            char *end;
            long d = strtol(kind + 5, &end, 10);
            if (end == kind + 5 || *end || d < 0 || d > 1024) {
                errf(err, errlen, "backend '%s': bad device index (expected cuda or cuda:N)", kind);
                return NULL;
            }
            device = (int)d;
        }
        if (!backend_cuda_new) {
            errf(err, errlen, "backend '%s': this binary was built without libtroupe_cuda (no nvcc at build time)", kind);
            return NULL;
        }
        return backend_cuda_new(device, err, errlen);
    }
    errf(err, errlen, "backend '%s': unknown (expected cpu, cuda or cuda:N)", kind);
    return NULL;
}

void backend_destroy(backend_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    (*self_p)->ops->destroy(*self_p);
    *self_p = NULL;
}
