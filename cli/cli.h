/* cli.h - the subcommands of the `skyloom` binary. Each lives in its own
 * cmd_*.c file and is listed once in the table in main.c. */
#ifndef CLI_H
#define CLI_H

#include "sl_cli.h"

int cmd_version(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);

#endif
