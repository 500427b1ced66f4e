/* tools/lib/args.h — checked command-line values for the tools: a bad value is refused with a
 * message naming the tool, the option and the value ("troupe-bench: --rounds 'x': expected an
 * integer in [1, 1000000]"), never read as 0 the way atoi would. Each returns 0, or -1 after
 * printing that message to stderr. */
#ifndef TROUPE_TOOLS_ARGS_H
#define TROUPE_TOOLS_ARGS_H

#include "common/dtype.h"

int arg_ll(const char *tool, const char *opt, const char *v, long long lo, long long hi, long long *out);
int arg_int(const char *tool, const char *opt, const char *v, int lo, int hi, int *out);
/* A finite number in [lo, hi]. */
int arg_double(const char *tool, const char *opt, const char *v, double lo, double hi, double *out);
/* "1,16,64": 1..max integers in [lo, hi] into out; the count, or -1. */
int arg_int_list(const char *tool, const char *opt, const char *v, int lo, int hi, int *out, int max);
/* A KV cache dtype (--kv-dtype): auto (DT_COUNT, the tool's default rule) or one dtype_parse_kv
 * takes (f32, bf16, f16, fp8 and their other names). */
int arg_kv_dtype(const char *tool, const char *opt, const char *v, dtype_t *out);
/* An fp8 KV cache's scales (--kv-scales): auto, checkpoint, calibrate or one (KV_SCALES_*,
 * engine/kvscale.h). */
int arg_kv_scales(const char *tool, const char *opt, const char *v, int *out);

#endif
