#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char s_role[32] = "troupe";
static int s_id = -1;
static int s_verbose = -1;   /* -1: not decided yet, read TROUPE_VERBOSE on first use */

static const char *const s_level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void log_init(const char *role, int id)
{
    snprintf(s_role, sizeof s_role, "%s", role ? role : "troupe");
    s_id = id;
}

void log_set_verbose(int verbose) { s_verbose = verbose ? 1 : 0; }

int log_verbose(void)
{
    if (s_verbose < 0) {
        const char *v = getenv("TROUPE_VERBOSE");
        s_verbose = v && *v && strcmp(v, "0") != 0;
    }
    return s_verbose;
}

void log_vmsg(log_level_t level, const char *fmt, va_list ap)
{
    char line[2048];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (long)(tv.tv_usec / 1000), s_role);
    if (s_id >= 0)
        n += snprintf(line + n, sizeof line - n, "/%d", s_id);
    n += snprintf(line + n, sizeof line - n, " [%d] %-5s ", (int)getpid(),
                  s_level_names[level <= LOG_ERROR ? level : LOG_ERROR]);
    if (n < (int)sizeof line - 2) {
        int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
        n = (m < 0) ? n : (n + m > (int)sizeof line - 2 ? (int)sizeof line - 2 : n + m);
    }
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

void log_msg(log_level_t level, const char *fmt, ...)
{
    if (level == LOG_DEBUG && !log_verbose())
        return;
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(level, fmt, ap);
    va_end(ap);
}
