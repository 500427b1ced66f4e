/* tools/lib/args.c — checked command-line values (tools/lib/args.h). Whitespace is refused
 * (strtoll/strtod would skip it), so " 5" and "1, 2" are errors, not numbers. */
#include "tools/lib/args.h"

#include "engine/kvscale.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

int arg_ll(const char *tool, const char *opt, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || isspace((unsigned char)*v) || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "%s: %s '%s': expected an integer in [%lld, %lld]\n", tool, opt, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int arg_int(const char *tool, const char *opt, const char *v, int lo, int hi, int *out)
{
    long long x;
    if (arg_ll(tool, opt, v, lo, hi, &x) < 0)
        return -1;
    *out = (int)x;
    return 0;
}

int arg_double(const char *tool, const char *opt, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || isspace((unsigned char)*v) || *end || errno || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "%s: %s '%s': expected a number in [%g, %g]\n", tool, opt, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int arg_int_list(const char *tool, const char *opt, const char *v, int lo, int hi, int *out, int max)
{
    int n = 0;
    const char *p = v;
    for (;;) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || isspace((unsigned char)*p) || errno || x < lo || x > hi || (*end && *end != ',') || n == max) {
            fprintf(stderr, "%s: %s '%s': expected 1 to %d comma-separated integers in [%d, %d]\n", tool, opt, v, max,
                    lo, hi);
            return -1;
        }
        out[n++] = (int)x;
        if (!*end)
            return n;
        p = end + 1;
    }
}

int arg_kv_dtype(const char *tool, const char *opt, const char *v, dtype_t *out)
{
    if (strcasecmp(v, "auto") == 0) {
        *out = DT_COUNT;
        return 0;
    }
    dtype_t t;
    if (dtype_parse_kv(v, &t) != 0) {
        fprintf(stderr, "%s: %s '%s': expected auto, f32, bf16, f16 or fp8\n", tool, opt, v);
        return -1;
    }
    *out = t;
    return 0;
}

int arg_kv_scales(const char *tool, const char *opt, const char *v, int *out)
{
    const int m = kv_scales_parse(v);
    if (m < 0) {
        fprintf(stderr, "%s: %s '%s': expected auto, checkpoint, calibrate or one\n", tool, opt, v);
        return -1;
    }
    *out = m;
    return 0;
}
