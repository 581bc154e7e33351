/* sl_err.h - error values with messages.
 *
 * Library code never exits or prints an error itself: it fills an sl_err and
 * returns -1 (or NULL). The caller decides whether to log, retry or stop.
 * A NULL sl_err pointer is allowed; the message is then dropped. */
#ifndef SL_ERR_H
#define SL_ERR_H

#include <stdarg.h>
#include <stddef.h>

enum sl_errcode {
    SL_OK = 0,
    SL_EINVAL,   /* bad argument or malformed input */
    SL_EIO,      /* file system or socket failure */
    SL_ENOMEM,   /* allocation failed or size too large */
    SL_ECORRUPT, /* checksum, magic or length check failed */
    SL_EAUTH,    /* authentication or authorisation refused */
    SL_ENOTSUP,  /* feature not built in or not present on this machine */
    SL_ESTATE,   /* operation not valid in the current state */
    SL_EINTERNAL,
    SL_ECANCELED, /* stopped because another part failed first */
    SL_ESTOPPED   /* told to stop (a job's coordinator): not a failure */
};

typedef struct sl_err {
    int code;
    char msg[512];
} sl_err;

/* Messages never carry raw control characters: sl_err_set and sl_err_wrap
 * (like sl_log and sl_cli_fail) write them as \xNN (sl_escape_ctl), since
 * messages quote names and bytes from files and the network. */

/* Sets code and message; always returns -1 so callers can `return sl_err_set(...)`. */
int sl_err_set(sl_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefixes the existing message with more context ("reading x: " + old). */
int sl_err_wrap(sl_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sl_err_clear(sl_err *err);
const char *sl_errcode_name(int code);

/* Copies src into dst (cap bytes, always NUL-terminated, cut short if need
 * be) with C0 controls, DEL, C1 controls and bytes that are not UTF-8
 * written as \xNN, so text from a file cannot drive a terminal. Escaping
 * twice changes nothing. Returns dst. */
char *sl_escape_ctl(char *dst, size_t cap, const char *src);

#endif
