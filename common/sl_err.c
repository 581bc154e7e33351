#include "sl_err.h"

#include <stdio.h>
#include <string.h>

/* Length of the UTF-8 sequence at p that encodes a printable character
 * (not C1), or 0. */
static size_t utf8_ok(const unsigned char *p)
{
    unsigned c = p[0];
    size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (!n || c > 0xf4)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if (c == 0xc2 && p[1] < 0xa0) /* U+0080..U+009F */
        return 0;
    if ((c == 0xe0 && p[1] < 0xa0) || (c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] > 0x8f) ||
        (c == 0xed && p[1] > 0x9f))
        return 0; /* overlong, beyond U+10FFFF, surrogates */
    return n;
}

char *sl_escape_ctl(char *dst, size_t cap, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (!cap)
        return dst;
    for (const unsigned char *p = (const unsigned char *)src; *p;) {
        size_t n = *p >= 0x20 && *p < 0x7f ? 1 : *p >= 0x80 ? utf8_ok(p) : 0;
        if (n) {
            if (o + n >= cap)
                break;
            memcpy(dst + o, p, n);
            o += n;
            p += n;
            continue;
        }
        if (o + 4 >= cap)
            break;
        dst[o++] = '\\';
        dst[o++] = 'x';
        dst[o++] = hex[*p >> 4];
        dst[o++] = hex[*p & 15];
        p++;
    }
    dst[o] = 0;
    return dst;
}

static void clean(sl_err *err)
{
    char tmp[sizeof err->msg];
    for (const char *p = err->msg; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) {
            memcpy(tmp, err->msg, sizeof tmp);
            sl_escape_ctl(err->msg, sizeof err->msg, tmp);
            return;
        }
}

int sl_err_set(sl_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return -1;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    clean(err);
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
    clean(err);
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
    case SL_ESTOPPED: return "stopped";
    default: return "internal";
    }
}
