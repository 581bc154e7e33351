#include "sl_cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int sl_cli_fail(const char *cmd, int status, const char *fmt, ...)
{
    char msg[2048], safe[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "skyloom %s: %s\n", cmd, sl_escape_ctl(safe, sizeof safe, msg));
    return status;
}

int sl_parse_i64(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out, sl_err *err)
{
    if (!s || !*s)
        return sl_err_set(err, SL_EINVAL, "%s needs a value", opt);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || isspace((unsigned char)s[0]))
        return sl_err_set(err, SL_EINVAL, "%s must be an integer, got '%s'", opt, s);
    if (v < min || v > max)
        return sl_err_set(err, SL_EINVAL, "%s must be between %lld and %lld, got %lld", opt,
                          (long long)min, (long long)max, v);
    *out = v;
    return 0;
}

int sl_parse_int(const char *opt, const char *s, int min, int max, int *out, sl_err *err)
{
    int64_t v;
    if (sl_parse_i64(opt, s, min, max, &v, err))
        return -1;
    *out = (int)v;
    return 0;
}

int sl_parse_double(const char *opt, const char *s, double min, double max, double *out, sl_err *err)
{
    if (!s || !*s)
        return sl_err_set(err, SL_EINVAL, "%s needs a value", opt);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || isspace((unsigned char)s[0]))
        return sl_err_set(err, SL_EINVAL, "%s must be a number, got '%s'", opt, s);
    if (v < min || v > max)
        return sl_err_set(err, SL_EINVAL, "%s must be between %g and %g, got %g", opt, min, max, v);
    *out = v;
    return 0;
}

static int parse_scaled(const char *opt, const char *s, const char *const *units,
                        const uint64_t *mult, int nunits, const char *what, uint64_t *out,
                        sl_err *err)
{
    if (!s || !*s)
        return sl_err_set(err, SL_EINVAL, "%s needs a value", opt);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0 || isspace((unsigned char)s[0]))
        return sl_err_set(err, SL_EINVAL, "%s must be %s, got '%s'", opt, what, s);
    uint64_t m = 0;
    for (int i = 0; i < nunits; i++)
        if (strcasecmp(end, units[i]) == 0) {
            m = mult[i];
            break;
        }
    if (!m)
        return sl_err_set(err, SL_EINVAL, "%s: unknown unit '%s' in '%s'", opt, end, s);
    double r = v * (double)m;
    if (r >= 18446744073709551615.0)
        return sl_err_set(err, SL_EINVAL, "%s: '%s' is too large", opt, s);
    *out = (uint64_t)r;
    return 0;
}

int sl_parse_bytes(const char *opt, const char *s, uint64_t *out, sl_err *err)
{
    static const char *const u[] = {"", "b", "k", "kb", "kib", "m", "mb", "mib",
                                    "g", "gb", "gib", "t", "tb", "tib"};
    static const uint64_t m[] = {1, 1, 1ull << 10, 1000, 1ull << 10, 1ull << 20, 1000000,
                                 1ull << 20, 1ull << 30, 1000000000, 1ull << 30, 1ull << 40,
                                 1000000000000ull, 1ull << 40};
    return parse_scaled(opt, s, u, m, 14, "a size such as 512MiB", out, err);
}

int sl_parse_duration(const char *opt, const char *s, int64_t *out, sl_err *err)
{
    static const char *const u[] = {"", "s", "m", "h", "d"};
    static const uint64_t m[] = {1, 1, 60, 3600, 86400};
    uint64_t v;
    if (parse_scaled(opt, s, u, m, 5, "a duration such as 30m or 1h", &v, err))
        return -1;
    if (v > INT64_MAX)
        return sl_err_set(err, SL_EINVAL, "%s: '%s' is too large", opt, s);
    *out = (int64_t)v;
    return 0;
}

bool sl_cli_stdout_is_tty(void) { return isatty(STDOUT_FILENO); }
