/* tools/spec_policy_replay.c — the draft-scheduler's policy recomputed offline from the lines of
 * its TROUPE_SPEC_POLICY_LOG (engine/spec_policy.h spec_policy_log_line): what this build's
 * policy decides from the tables a run measured, next to what the run's scheduler decided.
 *
 *   troupe-spec-policy-replay [--all] [--batch B] LOG
 *
 * For each line with a computation (ok=1): its time, then per batch bucket the logged verify
 * length, the recomputed one, and the tokens/s this build expects of every k there (k = 0
 * first, as spec_policy_bucket_rates judges them: plain bounded, unmeasured gains capped), and
 * the plain cell's steps and mean cycle. Only the last line unless --all; --batch B shows the
 * bucket of batch B only, with the seconds a step of every k as spec_cost_estimate gives them
 * (measured cells marked). Ends with
 * the number of bucket decisions that differ; exit status 0, 1 when any differs, 2 on a usage or
 * parse error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/spec_policy.h"

/* prev: the line before's logged policy, the one in force when line was computed (empty: none). */
static int s_replay(const char *line, const char *prev, int batch, int *differ)
{
    spec_accept_t a;
    spec_cost_t c;
    spec_policy_t logged, p = {0};
    int max_k, max_batch;
    char why[256];
    if (spec_policy_log_parse(line, &a, &c, &max_k, &max_batch, &logged, why, sizeof why) != 0) {
        fprintf(stderr, "spec-policy-replay: %s\n", why);
        return -1;
    }
    if (prev[0]) {   /* the policy in force then (its hysteresis): the previous line's choice */
        spec_accept_t pa;
        spec_cost_t pc;
        int pk, pb;
        if (spec_policy_log_parse(prev, &pa, &pc, &pk, &pb, &p, why, sizeof why) != 0)
            p = (spec_policy_t){0};
    }
    const char *t = strstr(line, "t=");
    printf("%.*s", t ? (int)strcspn(t, " ") : 0, t ? t : "");
    if (spec_policy_compute(&a, &c, max_k, max_batch, &p, why, sizeof why) != 0) {
        printf(" no policy: %s\n", why);
        return 0;
    }
    float s[SPEC_MAX_K] = {0};
    spec_policy_survival(&a, max_k, s);
    printf(" survival");
    for (int i = 0; i < max_k; i++)
        printf(" %.3f", s[i]);
    printf("\n  batch  logged  now  min_conf  tokens/s by k (measured tokens per row in brackets)\n");
    for (int b = 0; b < p.n_buckets; b++) {
        const int B = p.buckets[b].max_batch;
        if (batch > 0 && spec_cost_bucket(batch) != b)
            continue;
        const spec_policy_bucket_t *lb = logged.n_buckets ? spec_policy_bucket(&logged, B) : NULL;
        const int same = lb && lb->max_draft == p.buckets[b].max_draft;
        *differ += lb && !same;
        printf("  %5d  %6d  %3d%s %8.3f ", B, lb ? lb->max_draft : -1, p.buckets[b].max_draft, same || !lb ? " " : "*",
               p.buckets[b].min_confidence);
        double r[SPEC_MAX_K + 1];
        if (spec_policy_bucket_rates(&a, &c, max_k, max_batch, b, s, r) != 0)
            for (int k = 0; k <= max_k; k++)
                r[k] = -1;
        for (int k = 0; k <= max_k; k++) {
            const double tpr = spec_cost_tokens_per_row(&c, b, k);
            printf(" %.0f", r[k]);
            if (tpr >= 0)
                printf("[%.2f]", tpr);
        }
        const double rd = spec_policy_drafting_rate(&c, b, B);
        if (rd >= 0)   /* every drafting cell together: what a proposer with a distribution is judged by */
            printf("  drafting %.0f", rd);
        if (c.steps[b][0])   /* how much the plain rate rests on */
            printf("  (k=0: %llu steps, %.3f ms)", (unsigned long long)c.steps[b][0], 1e3 * c.seconds[b][0] / (double)c.steps[b][0]);
        printf("\n");
        if (batch > 0) {   /* the step costs the rates rest on, to set beside a fixed-k run's */
            printf("         ms a step by k:");
            for (int k = 0; k <= max_k; k++)
                printf(" %.3f%s", 1e3 * spec_cost_estimate(&c, b, k),
                       c.steps[b][k] >= SPEC_POLICY_MIN_STEPS ? "m" : "");
            printf("  (m: measured)\n");
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int all = 0, batch = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--all"))
            all = 1;
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "usage: troupe-spec-policy-replay [--all] [--batch B] LOG\n");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: troupe-spec-policy-replay [--all] [--batch B] LOG\n");
        return 2;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return 2;
    }
    static char line[1 << 17], last[1 << 17], before[1 << 17];
    int n = 0, differ = 0, rc = 0;
    last[0] = before[0] = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, " ok=1"))
            continue;
        n++;
        if (all && s_replay(line, last, batch, &differ) != 0)
            rc = 2;
        memcpy(before, last, strlen(last) + 1);
        memcpy(last, line, strlen(line) + 1);
    }
    fclose(f);
    if (!all && last[0] && s_replay(last, before, batch, &differ) != 0)
        rc = 2;
    printf("%d computations in %s; %d bucket decisions differ from the logged ones (*)\n", n, path, differ);
    return rc ? rc : differ ? 1 : 0;
}
