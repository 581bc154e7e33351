#include "sl_err.h"

#include <stdio.h>
#include <string.h>

int sl_err_set(sl_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return -1;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int sl_err_wrap(sl_err *err, const char *fmt, ...)
{
    if (!err)
        return -1;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* prefix + ": " + old, truncated to fit (done by hand: snprintf with two
     * %s of known sizes trips -Wformat-truncation). */
    size_t cap = sizeof err->msg - 1, n = 0;
    for (const char *p = prefix; *p && n < cap; p++)
        err->msg[n++] = *p;
    for (const char *p = ": "; *p && n < cap; p++)
        err->msg[n++] = *p;
    for (const char *p = old; *p && n < cap; p++)
        err->msg[n++] = *p;
    err->msg[n] = '\0';
    if (!err->code)
        err->code = SL_EINTERNAL;
    return -1;
}

void sl_err_clear(sl_err *err)
{
    if (err) {
        err->code = SL_OK;
        err->msg[0] = '\0';
    }
}

const char *sl_errcode_name(int code)
{
    switch (code) {
    case SL_OK: return "ok";
    case SL_EINVAL: return "invalid";
    case SL_EIO: return "io";
    case SL_ENOMEM: return "nomem";
    case SL_ECORRUPT: return "corrupt";
    case SL_EAUTH: return "auth";
    case SL_ENOTSUP: return "notsup";
    case SL_ESTATE: return "state";
    case SL_ECANCELED: return "canceled";
    default: return "internal";
    }
}
