/* common/util.h — small helpers every module uses: clocks, the process's CPU time, error strings. */
#ifndef TROUPE_UTIL_H
#define TROUPE_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Monotonic clock in milliseconds / nanoseconds (never jumps with wall-clock changes). */
int64_t now_ms(void);
int64_t now_ns(void);
/* Wall clock in milliseconds since the epoch (for timestamps that cross processes). */
int64_t wall_ms(void);

/* This process's CPU time (user + system, all its threads) for a stats report: *total the
 * seconds so far, *percent their rate since the meter's last read (the first: since start_ms,
 * monotonic ms), in % of one core. -1 when getrusage fails (nothing is set). */
typedef struct cpu_meter {
    double prev_s;
    int64_t prev_ms;   /* 0: never read */
} cpu_meter_t;
int cpu_meter_read(cpu_meter_t *cm, int64_t start_ms, double *total, double *percent);

/* Formats an error into err (may be NULL) and returns -1, so callers can write
 *     return errf(err, errlen, "%s: header length %llu exceeds 100 MB", path, n);   */
int errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A whole file, NUL-terminated (malloc'd; the caller frees); *len its size. NULL when it cannot be
 * opened or read (errno says why). For tools: actors read their inputs at start through their loaders. */
char *util_read_file(const char *path, size_t *len);

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
