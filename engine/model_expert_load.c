/* engine/model_expert_load.c — the per-(layer, expert) token counts the expert-balancer reads.
 *
 * The MoE layer's moe_count op adds each step's routing into a device array of uint32 counters
 * (forward.c, after moe_route), so the step itself never waits on the host and a recorded
 * decode graph keeps counting when replayed. model_expert_load downloads and clears them once
 * per window. Known limit: a window longer than 2^32 routed tokens per expert would wrap. */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/model_internal.h"

static size_t s_n(const model_t *m)
{
    return (size_t)m->cfg.num_layers * (size_t)m->cfg.num_experts;
}

int model_expert_load_init(model_t *m, char *err, size_t errlen)
{
    const size_t n = s_n(m);
    if (!(m->moe_counts = model_alloc(m, n * sizeof(uint32_t), "MoE load counters", err, errlen)))
        return -1;
    uint32_t *zero = calloc(n, sizeof(uint32_t));
    int rc = zero ? m->be->ops->upload(m->be, m->moe_counts, zero, n * sizeof(uint32_t)) : -1;
    free(zero);
    if (rc != 0)
        return errf(err, errlen, "MoE load counters: cannot clear %zu counters", n);
    return 0;
}

int model_expert_load(model_t *m, uint64_t *load, char *err, size_t errlen)
{
    const size_t n = s_n(m);
    const backend_ops_t *op = m->be->ops;
    if (!m->moe_counts || n == 0)
        return errf(err, errlen, "expert load: the model has no MoE layers");
    if (!op->moe_count)
        return errf(err, errlen, "expert load: backend %s does not count routed tokens", op->name);
    uint32_t *h = malloc(n * sizeof(uint32_t));
    if (!h)
        return errf(err, errlen, "expert load: out of memory");
    int rc = op->sync(m->be) == 0 && op->download(m->be, h, m->moe_counts, n * sizeof(uint32_t)) == 0 ? 0 : -1;
    if (rc == 0) {
        for (size_t i = 0; i < n; i++)
            load[i] += h[i];
        memset(h, 0, n * sizeof(uint32_t));
        rc = op->upload(m->be, m->moe_counts, h, n * sizeof(uint32_t));
    }
    free(h);
    return rc == 0 ? 0 : errf(err, errlen, "expert load: device error reading the counters");
}
