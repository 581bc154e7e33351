/* cli.h - the subcommands of the `skyloom` binary. Each lives in its own
 * cmd_*.c file and is listed once in the table in main.c. */
#ifndef CLI_H
#define CLI_H

#include "sl_cli.h"

int cmd_version(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_data(int argc, char **argv);
/* trust (issue #6) */
int cmd_certs(int argc, char **argv);
int cmd_coordinator(int argc, char **argv);
int cmd_device(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_job(int argc, char **argv);
/* Helpers for the commands above (cli_util.c). */
/* Makes SIGINT and SIGTERM set a flag instead of killing the process; the
 * flag (the signal number, 0 before any) is what cli_stop_signal returns. */
void cli_catch_stop_signals(void);
int cli_stop_signal(void);
/* Raises the soft descriptor limit to the hard one (servers: every
 * connection is a descriptor). */
void cli_raise_fd_limit(void);
/* Options that take a value. */
typedef struct cli_opt {
    const char *name;
    const char **value;
} cli_opt;
/* If argv[*i] is in opts (ended by a NULL name), stores the next argument
 * in its value, advances *i and returns 1; 0 if it is not in the table; -1
 * after printing "skyloom CMD: OPT needs a value" (a usage error). */
int cli_opt_take(const char *cmd, int argc, char **argv, int *i, const cli_opt *opts);
int cmd_plan(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_fill_mask(int argc, char **argv);

#endif
