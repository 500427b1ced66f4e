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

double fetch_policy_budget_ms(const fetch_policy_t *fp, int block_tokens, double tokens_per_s)
{
    if (fp->always)
        return FETCH_ALWAYS_BUDGET_MS;
    if (tokens_per_s <= 0 || block_tokens <= 0)
        return 0;
    const double compute = 1000.0 * block_tokens / tokens_per_s;
    /* A block from disk still crosses the host store's path after its read: what that costs is
     * spent either way, so the read itself must cost less than what remains. */
    const double budget = compute - fp->ms_per_block;
    return budget > compute / 100 ? budget : compute / 100;
}

double fetch_disk_wait_ms(int n_disk, double disk_ms_per_block, double budget_ms)
{
    if (n_disk <= 0)
        return 0;
    if (disk_ms_per_block > 0 && budget_ms > 0 && disk_ms_per_block > budget_ms)
        return 0;   /* each block read would cost more than computing it (fetch_policy.h) */
    double expected;
    if (disk_ms_per_block > 0)
        expected = n_disk * disk_ms_per_block;
    else if (budget_ms > 0)
        expected = n_disk * budget_ms;   /* not measured: as long as computing them, at most */
    else
        return FETCH_DISK_UNKNOWN_MS;
    const double wait = FETCH_DISK_FIXED_MS + FETCH_DISK_MARGIN * expected;
    const double cap = budget_ms > 0 ? FETCH_DISK_MAX_MS : FETCH_DISK_UNKNOWN_MS;
    return wait < cap ? wait : cap;
}

double fetch_policy_hold_ms(const fetch_policy_t *fp, int n_blocks, double block_mib, double budget_ms)
{
    if (n_blocks <= 0)
        return FETCH_HOLD_MIN_MS;
    /* The cache-manager reads only from a disk at most as slow as the budget, and its wait grows
     * with its estimate: the slowest disk it reads from sets the longest wait. */
    const double disk = fetch_disk_wait_ms(n_blocks, budget_ms, budget_ms);
    const double copy = block_mib * FETCH_COPY_MS_PER_MIB;
    const double per = fp->ms_per_block > copy ? fp->ms_per_block : copy;
    const double hold = disk + FETCH_ANSWER_SLACK_MS + 2.0 * n_blocks * per;
    return hold > FETCH_HOLD_MIN_MS ? hold : FETCH_HOLD_MIN_MS;
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
