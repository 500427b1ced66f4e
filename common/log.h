/* common/log.h — one line per event: time, role, id, pid, level, message.
 *
 * Every line is formatted into one buffer and written with a single write(2) so lines from
 * concurrent processes sharing a terminal or log file never interleave mid-line. */
#ifndef TROUPE_LOG_H
#define TROUPE_LOG_H

#include <stdarg.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } log_level_t;

/* Sets the identity printed on every line. role may be NULL ("troupe"); id < 0 omits it. */
void log_init(const char *role, int id);
/* Verbose mode prints LOG_DEBUG lines too. Also enabled by TROUPE_VERBOSE=1 in the environment. */
void log_set_verbose(int verbose);
int log_verbose(void);
void log_msg(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_vmsg(log_level_t level, const char *fmt, va_list ap);

#define LOG_D(...) do { if (log_verbose()) log_msg(LOG_DEBUG, __VA_ARGS__); } while (0)
#define LOG_I(...) log_msg(LOG_INFO, __VA_ARGS__)
#define LOG_W(...) log_msg(LOG_WARN, __VA_ARGS__)
#define LOG_E(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
