/* engine/eplb.c — expert placement with redundant replicas: replicate by load per replica, then
 * balanced packing onto ranks (engine/eplb.h says the algorithm). Runs once per rebalance, off
 * any serving path, so it allocates its scratch per call. */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/eplb.h"

typedef struct {
    int expert;   /* index into the caller's expert list */
    double w;     /* the load this replica carries */
} s_item_t;

static int s_heavier(const void *a, const void *b)
{
    const s_item_t *x = a, *y = b;
    if (x->w != y->w)
        return x->w > y->w ? -1 : 1;
    return x->expert - y->expert;   /* deterministic: the lower expert first */
}

/* Steps 1-2 over ne experts (global ids ids[]), nr ranks, ns slots: out [ns] gets global ids. */
static int s_flat(const double *load, const int *ids, int ne, int nr, int ns, int32_t *out, char *err, size_t errlen)
{
    const int cap = ns / nr;
    int *cnt = calloc((size_t)ne, sizeof(int)), *fill = calloc((size_t)nr, sizeof(int));
    double *rl = calloc((size_t)nr, sizeof(double));
    unsigned char *holds = calloc((size_t)nr * (size_t)ne, 1);   /* [nr][ne] */
    s_item_t *items = calloc((size_t)ns, sizeof(s_item_t));
    int32_t *local = malloc((size_t)ns * sizeof(int32_t));       /* [ns] index into ids */
    int rc = -1;
    if (!cnt || !fill || !rl || !holds || !items || !local) {
        errf(err, errlen, "eplb: out of memory");
        goto done;
    }
    for (int i = 0; i < ne; i++)
        cnt[i] = 1;
    for (int s = ne; s < ns; s++) {   /* 1. each redundant slot to the highest load per replica */
        int best = -1;
        for (int i = 0; i < ne; i++)
            if (cnt[i] < nr && (best < 0 || load[ids[i]] / cnt[i] > load[ids[best]] / cnt[best]))
                best = i;
        if (best < 0) {
            errf(err, errlen, "eplb: %d slots for %d experts on %d ranks: more than one replica of an expert per rank",
                 ns, ne, nr);
            goto done;
        }
        cnt[best]++;
    }
    int n = 0;
    for (int i = 0; i < ne; i++)
        for (int j = 0; j < cnt[i]; j++)
            items[n++] = (s_item_t){i, load[ids[i]] / cnt[i]};
    qsort(items, (size_t)n, sizeof *items, s_heavier);
    for (int it = 0; it < n; it++) {   /* 2. heaviest first, to the least loaded rank that may take it */
        const int e = items[it].expert;
        int r = -1;
        for (int q = 0; q < nr; q++)
            if (fill[q] < cap && !holds[(size_t)q * ne + e] && (r < 0 || rl[q] < rl[r]))
                r = q;
        if (r < 0) {
            /* Every rank with room already holds e: move some expert f from a rank q without e to
             * a rank r with room that lacks f, and give q's freed slot to e. */
            int done_swap = 0;
            for (int rr = 0; rr < nr && !done_swap; rr++) {
                if (fill[rr] == cap)
                    continue;
                for (int q = 0; q < nr && !done_swap; q++) {
                    if (holds[(size_t)q * ne + e])
                        continue;
                    for (int s = 0; s < fill[q] && !done_swap; s++) {
                        const int f = local[q * cap + s];
                        if (holds[(size_t)rr * ne + f])
                            continue;
                        const double wf = load[ids[f]] / cnt[f];
                        local[rr * cap + fill[rr]++] = f;
                        holds[(size_t)rr * ne + f] = 1;
                        rl[rr] += wf;
                        holds[(size_t)q * ne + f] = 0;
                        rl[q] -= wf;
                        local[q * cap + s] = e;
                        holds[(size_t)q * ne + e] = 1;
                        rl[q] += items[it].w;
                        done_swap = 1;
                    }
                }
            }
            if (!done_swap) {
                errf(err, errlen, "eplb: no rank can take a replica of expert %d", ids[e]);
                goto done;
            }
            continue;
        }
        local[r * cap + fill[r]++] = e;
        holds[(size_t)r * ne + e] = 1;
        rl[r] += items[it].w;
    }
    for (int s = 0; s < ns; s++)
        out[s] = ids[local[s]];
    rc = 0;
done:
    free(cnt);
    free(fill);
    free(rl);
    free(holds);
    free(items);
    free(local);
    return rc;
}

int eplb_place(const double *load, int n_experts, int n_ranks, int n_nodes, int n_slots, int32_t *slot_expert,
               char *err, size_t errlen)
{
    if (n_experts < 1 || n_ranks < 1 || n_nodes < 1 || n_slots < 1)
        return errf(err, errlen, "eplb: experts %d, ranks %d, nodes %d, slots %d: each must be at least 1", n_experts,
                    n_ranks, n_nodes, n_slots);
    if (n_slots % n_ranks != 0)
        return errf(err, errlen, "eplb: %d slots do not divide evenly over %d ranks", n_slots, n_ranks);
    if (n_slots < n_experts)
        return errf(err, errlen, "eplb: %d slots cannot hold %d experts", n_slots, n_experts);
    if (n_ranks % n_nodes != 0 || n_experts % n_nodes != 0)
        return errf(err, errlen, "eplb: %d ranks and %d experts must both divide evenly over %d nodes", n_ranks,
                    n_experts, n_nodes);
    for (int e = 0; e < n_experts; e++)
        if (!(load[e] >= 0))
            return errf(err, errlen, "eplb: load of expert %d is negative or NaN", e);
    const int epn = n_experts / n_nodes, rpn = n_ranks / n_nodes, spn = n_slots / n_nodes;
    int *node_of = malloc((size_t)n_experts * sizeof(int)), *ids = malloc((size_t)n_experts * sizeof(int));
    int *per = calloc((size_t)n_nodes, sizeof(int));
    double *nl = calloc((size_t)n_nodes, sizeof(double));
    s_item_t *order = malloc((size_t)n_experts * sizeof(s_item_t));
    int rc = -1;
    if (!node_of || !ids || !per || !nl || !order) {
        errf(err, errlen, "eplb: out of memory");
        goto done;
    }
    /* 3. experts onto nodes, heaviest first, each node the same number of experts */
    for (int e = 0; e < n_experts; e++)
        order[e] = (s_item_t){e, load[e]};
    qsort(order, (size_t)n_experts, sizeof *order, s_heavier);
    for (int i = 0; i < n_experts; i++) {
        int best = -1;
        for (int d = 0; d < n_nodes; d++)
            if (per[d] < epn && (best < 0 || nl[d] < nl[best]))
                best = d;
        node_of[order[i].expert] = best;
        per[best]++;
        nl[best] += order[i].w;
    }
    for (int d = 0; d < n_nodes; d++) {
        int ne = 0;
        for (int e = 0; e < n_experts; e++)
            if (node_of[e] == d)
                ids[ne++] = e;
        if (s_flat(load, ids, ne, rpn, spn, slot_expert + (size_t)d * spn, err, errlen) != 0)
            goto done;
    }
    rc = 0;
done:
    free(node_of);
    free(ids);
    free(per);
    free(nl);
    free(order);
    return rc;
}

void eplb_identity(int n_experts, int32_t *slot_expert)
{
    for (int e = 0; e < n_experts; e++)
        slot_expert[e] = e;
}

double eplb_imbalance(const double *load, int n_experts, int n_ranks, int n_slots, const int32_t *slot_expert,
                      double *rank_load)
{
    int *cnt = calloc((size_t)n_experts, sizeof(int));
    double *rl = calloc((size_t)n_ranks, sizeof(double));
    double out = -1;
    if (!cnt || !rl || n_ranks < 1 || n_slots % n_ranks != 0)
        goto done;
    for (int s = 0; s < n_slots; s++) {
        if (slot_expert[s] < 0 || slot_expert[s] >= n_experts)
            goto done;
        cnt[slot_expert[s]]++;
    }
    for (int e = 0; e < n_experts; e++)
        if (cnt[e] == 0)
            goto done;
    const int cap = n_slots / n_ranks;
    double total = 0, mx = 0;
    for (int s = 0; s < n_slots; s++)
        rl[s / cap] += load[slot_expert[s]] / cnt[slot_expert[s]];
    for (int r = 0; r < n_ranks; r++) {
        total += rl[r];
        mx = rl[r] > mx ? rl[r] : mx;
        if (rank_load)
            rank_load[r] = rl[r];
    }
    out = total > 0 ? mx / (total / n_ranks) : 1.0;
done:
    free(cnt);
    free(rl);
    return out;
}
