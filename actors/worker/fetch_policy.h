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
 * prefill workers, and decode workers that compute prompts (colocated). */
#ifndef TROUPE_ACTORS_RUNTIME_FETCH_POLICY_H
#define TROUPE_ACTORS_RUNTIME_FETCH_POLICY_H

#include <stddef.h>

#define FETCH_FIXED_MS 1.0        /* a fetch's messages and scheduling, whatever its size */
#define FETCH_EXPLORE 32          /* fetch once after this many recomputations in a row */

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

/* Sets fp->always from TROUPE_PREFILL_FETCH ("cost", the default, or "always"); -1 with why for
 * any other value. */
int fetch_policy_from_env(fetch_policy_t *fp, char *err, size_t errlen);

#endif
