/* actors/worker/fetch_policy.h — should a prefill worker fetch a prompt's cached blocks from the
 * cache-manager's host store, or compute them again?
 *
 * A fetch is a round trip: the request goes to the cache-manager, which may first wait for the
 * blocks' write-back from a decode worker (the previous answer of a conversation), then the blocks
 * cross shared memory and are uploaded into the pool. On a CPU that always beats recomputing; on an
 * H200, which prefills ~32K tokens/s, recomputing the 8 blocks of a 128-token answer (~4 ms) beat
 * waiting for them (one user's multi-turn TTFT was 59.7 ms with reuse, 46.1 ms without). So the
 * worker measures both costs and takes the cheaper: the fetch time per block (an average of what
 * its fetches took, from the request to the blocks in the pool) against the blocks' tokens at its
 * own compute rate (prompt tokens per second of forward time). With no measurement yet it fetches;
 * after FETCH_EXPLORE recomputations in a row it fetches once anyway, so a store that got faster is
 * noticed. Blocks the worker's own pool holds cost nothing either way and are not counted here.
 * TROUPE_PREFILL_FETCH=always in a worker's environment turns the choice off (fetch all): the
 * prefill workers, and decode workers that compute prompts (colocated).
 *
 * Blocks that only the cache-manager's disk tier holds cost a disk read more, and only the
 * cache-manager knows which blocks those are and how fast its disk reads (it times its own reads).
 * So the fetch carries the worker's budget for one such block (cache_fetch.block_budget_ms:
 * computing a block at its rate, less fetching one from memory, fetch_policy_budget_ms), and the
 * cache-manager reads them only when its measured read time of a block is below that
 * (fetch_disk_wait_ms). Measured on one H200 with the 8B shape (docs/kv-cache.md): a 2 MiB block
 * computes in ~0.6 ms and reads in ~1.4 ms from a 1.4 GiB/s disk, so there the worker recomputes.
 * The comparison is per block because the cache-manager answers with the leading blocks that
 * arrived when its wait ends, and the worker computes the rest: waiting t ms for n blocks at d ms a
 * block, then computing the others at c ms a block costs t + (n - t / d) c, which falls with t when
 * d < c (wait for all of them) and grows when d > c (do not wait at all). The wait is therefore the
 * expected read time with a margin (FETCH_DISK_MARGIN, FETCH_DISK_FIXED_MS), which only guards
 * against a wrong estimate, bounded by FETCH_DISK_MAX_MS; before any read is measured it is what
 * computing the blocks would take, with the same margin (reading cannot lose more than that, and
 * the first reads give the measurement, which ends the wait early when the disk is too slow). The
 * worker holds the prompt for the longest wait the cache-manager can choose plus the answer's copy
 * (fetch_policy_hold_ms), so the answer, whole or partial, always finds the prompt waiting. */
#ifndef TROUPE_ACTORS_RUNTIME_FETCH_POLICY_H
#define TROUPE_ACTORS_RUNTIME_FETCH_POLICY_H

#include <stddef.h>

#define FETCH_FIXED_MS 1.0        /* a fetch's messages and scheduling, whatever its size */
#define FETCH_EXPLORE 32          /* fetch once after this many recomputations in a row */
#define FETCH_HOLD_MIN_MS 1000    /* the shortest hold of a prompt for its fetch (a write-back's wait
                                   * of up to 300 ms at the cache-manager and the copy fit in it) */
#define FETCH_DISK_MARGIN 1.5     /* the disk wait: this times the expected read time ... */
#define FETCH_DISK_FIXED_MS 20.0  /* ... plus this (the first reads' latency, the queue) */
#define FETCH_DISK_MAX_MS 10000.0 /* the longest wait for disk reads, whatever the estimate */
#define FETCH_DISK_UNKNOWN_MS 1000.0 /* the longest wait when the worker's budget is unknown (0) */
#define FETCH_ALWAYS_BUDGET_MS 1e6   /* TROUPE_PREFILL_FETCH=always: any disk read pays */
#define FETCH_ANSWER_SLACK_MS 150.0 /* the hold's allowance for the cache-manager's timer (it looks
                                     * at waits that ended every 100 ms) and the messages */
#define FETCH_COPY_MS_PER_MIB 1.0 /* the hold's allowance for the answer's copies (into the segment,
                                   * into the pool) per MiB, when the measured fetch time is lower */

typedef struct fetch_policy {
    int always;                   /* 1: every fetch (TROUPE_PREFILL_FETCH=always: tests of the fetch path) */
    double ms_per_block;          /* moving average of measured fetch time per block; 0 = none yet */
    int recomputed;               /* decisions to recompute since the last fetch */
} fetch_policy_t;

/* 1: fetch n_blocks (of block_tokens tokens each); 0: compute them. tokens_per_s: the worker's
 * compute rate (<= 0: unknown). Counts the decision (the exploration above). */
int fetch_policy_decide(fetch_policy_t *fp, int n_blocks, int block_tokens, double tokens_per_s);

/* A fetch of n_blocks took ms (request sent to blocks in the pool). */
void fetch_policy_observe(fetch_policy_t *fp, int n_blocks, double ms);

/* The fetch's block_budget_ms: what reading one block from disk may cost for the read to pay, the
 * block's compute time at tokens_per_s less the measured fetch time of one (at least a hundredth
 * of the compute time: the fetch was judged worth it, and the disk must then beat computing by
 * the measured margin); FETCH_ALWAYS_BUDGET_MS when fp->always; 0 when the rate is unknown. */
double fetch_policy_budget_ms(const fetch_policy_t *fp, int block_tokens, double tokens_per_s);

/* The cache-manager's side: how long a fetch waits for the reads of its n_disk blocks that only
 * the disk holds, or 0: do not read them (computing them is faster). disk_ms_per_block: the disk
 * tier's measured read time of one block at its parallelism (<= 0: nothing measured yet);
 * budget_ms: the fetch's block_budget_ms (<= 0: unknown, the wait is then at most
 * FETCH_DISK_UNKNOWN_MS). */
double fetch_disk_wait_ms(int n_disk, double disk_ms_per_block, double budget_ms);

/* How long the worker holds a prompt for a fetch of n_blocks of block_mib MiB each that carried
 * budget_ms: the longest disk wait the cache-manager may choose for it (a disk as slow as the
 * budget: a slower one is not read), plus the answer's copies, at least FETCH_HOLD_MIN_MS. */
double fetch_policy_hold_ms(const fetch_policy_t *fp, int n_blocks, double block_mib, double budget_ms);

/* Sets fp->always from TROUPE_PREFILL_FETCH ("cost", the default, or "always"); -1 with why for
 * any other value. */
int fetch_policy_from_env(fetch_policy_t *fp, char *err, size_t errlen);

#endif
