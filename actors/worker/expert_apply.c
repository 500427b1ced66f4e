/* actors/worker/expert_apply.c — expert placements between the balancer's tables and the message
 * (expert_apply.h). */
#include <stdlib.h>
#include <string.h>

#include "actors/worker/expert_apply.h"
#include "common/util.h"

int expert_placement_encode(const int32_t *slots, int n_layers, int n_experts, int n_slots, int n_ranks,
                            uint32_t **offsets, uint32_t **replicas, uint32_t *n_replicas)
{
    const size_t n_off = (size_t)n_layers * (size_t)n_experts + 1;
    uint32_t *off = calloc(n_off, sizeof(uint32_t)), *rep = malloc((size_t)n_layers * (size_t)n_slots * sizeof(uint32_t));
    if (!off || !rep) {
        free(off);
        free(rep);
        return -1;
    }
    const int spr = n_slots / n_ranks;
    uint32_t n = 0;
    for (int l = 0; l < n_layers; l++)
        for (int e = 0; e < n_experts; e++) {
            off[(size_t)l * n_experts + e] = n;
            for (int s = 0; s < n_slots; s++)   /* ascending slots: ascending ranks */
                if (slots[(size_t)l * n_slots + s] == e)
                    rep[n++] = (uint32_t)(s / spr);
        }
    off[n_off - 1] = n;
    *offsets = off;
    *replicas = rep;
    *n_replicas = n;
    return 0;
}

int expert_placement_decode(const msg_expert_placement_t *p, int n_ranks, int model_layers, int model_experts,
                            const uint8_t *is_moe, int32_t **slots_out, int *n_slots_out, char *err, size_t errlen)
{
    if ((int)p->n_experts != model_experts)
        return errf(err, errlen, "expert_placement.n_experts: %u, the model has %d", p->n_experts, model_experts);
    if ((int)p->n_workers != n_ranks)
        return errf(err, errlen, "expert_placement.workers: %u ranks, this group has %d", p->n_workers, n_ranks);
    if ((int)p->n_layers > model_layers)
        return errf(err, errlen, "expert_placement.n_layers: %u, the model has %d", p->n_layers, model_layers);
    const int E = model_experts, PL = (int)p->n_layers;
    int n_slots = -1;
    for (int l = 0; l < PL; l++) {
        const uint32_t a = p->offsets[(size_t)l * E], b = p->offsets[(size_t)(l + 1) * E];
        if (b < a || b > p->n_replicas)
            return errf(err, errlen, "expert_placement.offsets: layer %d's range [%u, %u) is not within the %u "
                        "replicas", l, a, b, p->n_replicas);
        if (n_slots < 0)
            n_slots = (int)(b - a);
        else if ((int)(b - a) != n_slots)
            return errf(err, errlen, "expert_placement: layer %d has %u replicas, layer 0 %d", l, b - a, n_slots);
    }
    if (n_slots < E || n_slots % n_ranks != 0)
        return errf(err, errlen, "expert_placement: %d replicas per layer do not divide over %d ranks", n_slots, n_ranks);
    for (int l = PL; l < model_layers; l++)
        if (is_moe[l])
            return errf(err, errlen, "expert_placement.n_layers: %u, but layer %d is an MoE layer", p->n_layers, l);
    const int spr = n_slots / n_ranks;
    int32_t *slots = malloc((size_t)model_layers * (size_t)n_slots * sizeof(int32_t));
    int *fill = malloc((size_t)n_ranks * sizeof(int));
    if (!slots || !fill) {
        free(slots);
        free(fill);
        return errf(err, errlen, "expert_placement: out of memory");
    }
    int rc = 0;
    for (int l = 0; l < model_layers && rc == 0; l++) {
        int32_t *ls = slots + (size_t)l * n_slots;
        if (l >= PL) {   /* a dense layer past the message: anything valid */
            for (int s = 0; s < n_slots; s++)
                ls[s] = s % E;   /* the group ignores a dense layer's table */
            continue;
        }
        memset(fill, 0, (size_t)n_ranks * sizeof(int));
        for (int e = 0; e < E && rc == 0; e++)
            for (uint32_t i = p->offsets[(size_t)l * E + e]; i < p->offsets[(size_t)l * E + e + 1] && rc == 0; i++) {
                const uint32_t r = p->replicas[i];
                if (r >= (uint32_t)n_ranks)
                    rc = errf(err, errlen, "expert_placement.replicas[%u]: rank %u of %d", i, r, n_ranks);
                else if (fill[r] == spr)
                    rc = errf(err, errlen, "expert_placement: layer %d gives rank %u more than %d slots", l, r, spr);
                else
                    ls[(int)r * spr + fill[r]++] = e;
            }
    }
    free(fill);
    if (rc) {
        free(slots);
        return -1;
    }
    *slots_out = slots;
    *n_slots_out = n_slots;
    return 0;
}

int expert_apply(ep_t *ep, const model_t *m, const msg_expert_placement_t *p, char *err, size_t errlen)
{
    if (!ep)
        return errf(err, errlen, "expert_placement: this worker leads no expert-parallel group (topology ep: 1)");
    const model_config_t *c = model_config(m);
    uint8_t is_moe[MSG_MAX_LAYERS];
    if (c->num_layers > MSG_MAX_LAYERS)
        return errf(err, errlen, "expert_placement: the model has more than %d layers", MSG_MAX_LAYERS);
    for (int l = 0; l < c->num_layers; l++)
        is_moe[l] = (uint8_t)config_layer_is_moe(c, l);
    ep_status_t st;
    ep_status(ep, &st);
    int32_t *slots = NULL;
    int n_slots = 0;
    if (expert_placement_decode(p, st.n_ranks, c->num_layers, c->num_experts, is_moe, &slots, &n_slots, err,
                                errlen) != 0)
        return -1;
    const int rc = ep_propose(ep, p->epoch, n_slots, slots, err, errlen);
    free(slots);
    return rc;
}

void expert_apply_stats(actor_t *a, msg_stats_t *st, const ep_t *ep)
{
    if (!ep)
        return;
    ep_status_t s;
    ep_status(ep, &s);
    actor_stat_metric(a, st, "ep_ranks", s.n_ranks, 0);
    actor_stat_metric(a, st, "ep_epoch", (double)s.epoch, 0);
    actor_stat_metric(a, st, "ep_pending_epoch", (double)s.pending_epoch, 0);
    actor_stat_metric(a, st, "ep_loading_layers", s.loading_layers, 0);
    actor_stat_metric(a, st, "ep_switches_total", (double)s.switches, 1);
    actor_stat_metric(a, st, "ep_experts_loaded_total", (double)s.experts_loaded, 1);
    actor_stat_metric(a, st, "ep_entries_total", (double)s.entries_sent, 1);
    actor_stat_metric(a, st, "ep_transport_nccl", s.nccl, 0);   /* 1: dispatch/combine over NCCL, 0: sockets */
}
