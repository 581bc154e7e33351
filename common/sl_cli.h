/* sl_cli.h - what every subcommand shares: the command signature, strict
 * option-value parsing with messages that name the option, and the one-line
 * error convention ("skyloom train: --steps must be ...").
 *
 * A subcommand is `int cmd(int argc, char **argv)` returning the process exit
 * status: 0 success, 1 runtime failure, 2 usage error. argv[0] is the command
 * name. */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "sl_err.h"

typedef int (*sl_cmd_fn)(int argc, char **argv);

/* Prints "skyloom CMD: message" to stderr and returns `status`. */
int sl_cli_fail(const char *cmd, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Each parser accepts the whole string or fails with a message naming `opt`. */
int sl_parse_i64(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out, sl_err *err);
int sl_parse_int(const char *opt, const char *s, int min, int max, int *out, sl_err *err);
int sl_parse_double(const char *opt, const char *s, double min, double max, double *out, sl_err *err);
/* Byte sizes: plain number or with suffix K, M, G, T (powers of 1024), KiB, MB... */
int sl_parse_bytes(const char *opt, const char *s, uint64_t *out, sl_err *err);
/* Durations: 90, 90s, 15m, 1h, 2d -> seconds. */
int sl_parse_duration(const char *opt, const char *s, int64_t *out, sl_err *err);

/* True when stdout is a terminal (progress lines) rather than a file. */
bool sl_cli_stdout_is_tty(void);

#endif
