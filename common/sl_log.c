#include "sl_log.h"

#include "sl_err.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int g_level = SL_LOG_INFO;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void sl_log_set_level(int level) { g_level = level; }

int sl_log_level_parse(const char *s)
{
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

void sl_log(int level, const char *msg, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info ", "warn ", "error"};
    if (level < g_level || level < 0 || level > SL_LOG_ERROR)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    char fields[2048] = "", safe[2048], safe_msg[512];
    if (fmt && fmt[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(fields, sizeof fields, fmt, ap);
        va_end(ap);
    }
    sl_escape_ctl(safe, sizeof safe, fields);
    sl_escape_ctl(safe_msg, sizeof safe_msg, msg);
    pthread_mutex_lock(&g_lock);
    fprintf(stderr, "%s.%03ldZ %s %s%s%s\n", when, ts.tv_nsec / 1000000, names[level], safe_msg,
            safe[0] ? " " : "", safe);
    pthread_mutex_unlock(&g_lock);
}
