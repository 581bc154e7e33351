/* cli_util.c - what the long-running commands share: "--name value"
 * options from a table, stopping on SIGINT/SIGTERM. */
#include <signal.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "sl_log.h"

int cli_opt_take(const char *cmd, int argc, char **argv, int *i, const cli_opt *opts)
{
    for (const cli_opt *o = opts; o->name; o++) {
        if (strcmp(argv[*i], o->name) != 0)
            continue;
        if (*i + 1 >= argc) {
            sl_cli_fail(cmd, 2, "%s needs a value", o->name);
            return -1;
        }
        *o->value = argv[++*i];
        return 1;
    }
    return 0;
}

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = sig; }

void cli_catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int cli_stop_signal(void) { return stop_flag; }

void cli_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t was = rl.rlim_cur;
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = was;
    }
    sl_log_debug("descriptor limit", "soft=%llu hard=%llu was=%llu",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                 (unsigned long long)was);
}
