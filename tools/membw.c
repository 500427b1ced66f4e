/* tools/membw.c — troupe-membw: the machine's memory bandwidth, the ceiling for batch-1 decoding.
 *
 *   troupe-membw [--mb N] [--threads N] [--reps N] [--json]
 *
 * Copy: every thread memcpy's its slice of an N MB buffer into another (default 1024 MB, far
 * beyond any cache); bandwidth counts read + write (2 x N MB per pass), as STREAM's copy does.
 * Read: every thread sums its slice with wide loads, the access pattern of a weight-streaming
 * GEMV. Best of --reps passes (default 5) after one warm-up pass that also faults the pages in. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tools/lib/args.h"

static int s_int(const char *opt, const char *v, int lo, int hi, int *out)
{
    return arg_int("troupe-membw", opt, v, lo, hi, out);
}

/* Sum of the slice as 8 independent u64 lanes, so the loop is load-bound, not add-latency-bound. */
static uint64_t s_read(const uint64_t *p, size_t n)
{
    uint64_t a[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            a[j] += p[i + j];
    for (; i < n; i++)
        a[0] += p[i];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

int main(int argc, char **argv)
{
    int mb = 1024, threads = omp_get_max_threads(), reps = 5, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "troupe-membw: %s needs a value\nusage: troupe-membw [--mb N] [--threads N] [--reps N] [--json]\n", argv[i]);
            return 2;
        }
        int rc;
        if (!strcmp(argv[i], "--mb")) rc = s_int(argv[i], argv[i + 1], 16, 1 << 20, &mb);
        else if (!strcmp(argv[i], "--threads")) rc = s_int(argv[i], argv[i + 1], 1, 4096, &threads);
        else if (!strcmp(argv[i], "--reps")) rc = s_int(argv[i], argv[i + 1], 1, 1000, &reps);
        else {
            fprintf(stderr, "troupe-membw: unknown option '%s'\nusage: troupe-membw [--mb N] [--threads N] [--reps N] [--json]\n", argv[i]);
            return 2;
        }
        if (rc < 0)
            return 2;
        i++;
    }
    size_t bytes = (size_t)mb << 20;
    uint8_t *a = NULL, *b = NULL;
    if (posix_memalign((void **)&a, 4096, bytes) || posix_memalign((void **)&b, 4096, bytes)) {
        fprintf(stderr, "troupe-membw: cannot allocate 2 x %d MB\n", mb);
        return 1;
    }
    double best_copy = 0, best_read = 0;
    uint64_t sink = 0;
    for (int r = 0; r <= reps; r++) {
        int64_t t0 = now_ns();
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            size_t lo = bytes / n * t, hi = t == n - 1 ? bytes : bytes / n * (t + 1);
            if (r == 0)
                memset(a + lo, t + 1, hi - lo);    /* first touch by the thread that will copy it */
            memcpy(b + lo, a + lo, hi - lo);
        }
        int64_t t1 = now_ns();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            size_t lo = bytes / n * t, hi = t == n - 1 ? bytes : bytes / n * (t + 1);
            sink += s_read((const uint64_t *)(b + lo), (hi - lo) / 8);
        }
        int64_t t2 = now_ns();
        if (r == 0)
            continue;                              /* warm-up: page faults */
        double copy = 2.0 * (double)bytes / (double)(t1 - t0), read = (double)bytes / (double)(t2 - t1);
        best_copy = copy > best_copy ? copy : best_copy;
        best_read = read > best_read ? read : best_read;
    }
    if (json)
        printf("{\"copy_gb_per_s\":%.2f,\"read_gb_per_s\":%.2f,\"mb\":%d,\"threads\":%d,\"reps\":%d}\n", best_copy, best_read,
               mb, threads, reps);
    else
        printf("copy %.2f GB/s (read+write), read %.2f GB/s; %d MB, %d threads, best of %d%s\n", best_copy, best_read, mb,
               threads, reps, sink == 42 ? " " : "");
    free(a);
    free(b);
    return 0;
}
