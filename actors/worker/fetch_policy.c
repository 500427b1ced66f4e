#include "actors/worker/fetch_policy.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int fetch_policy_decide(fetch_policy_t *fp, int n_blocks, int block_tokens, double tokens_per_s)
{
    if (n_blocks <= 0)
        return 0;
    int fetch = 1;
    if (!fp->always && tokens_per_s > 0 && fp->ms_per_block > 0) {
        const double fetch_ms = FETCH_FIXED_MS + n_blocks * fp->ms_per_block;
        const double compute_ms = 1000.0 * n_blocks * block_tokens / tokens_per_s;
        fetch = fetch_ms <= compute_ms || fp->recomputed + 1 >= FETCH_EXPLORE;
    }
    fp->recomputed = fetch ? 0 : fp->recomputed + 1;
    return fetch;
}

void fetch_policy_observe(fetch_policy_t *fp, int n_blocks, double ms)
{
    if (n_blocks <= 0 || ms < 0)
        return;
    const double per = ms / n_blocks;
    fp->ms_per_block = fp->ms_per_block > 0 ? 0.75 * fp->ms_per_block + 0.25 * per : per;
}

int fetch_policy_from_env(fetch_policy_t *fp, char *err, size_t errlen)
{
    const char *v = getenv("TROUPE_PREFILL_FETCH");
    fp->always = v && strcmp(v, "always") == 0;
    if (v && *v && strcmp(v, "always") != 0 && strcmp(v, "cost") != 0)
        return errf(err, errlen, "TROUPE_PREFILL_FETCH='%s': expected 'cost' (the default: fetch cached blocks when "
                    "that is cheaper than computing them) or 'always'", v);
    return 0;
}
