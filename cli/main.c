/* skyloom - one binary, many subcommands (like git). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "sl_log.h"

typedef struct command {
    const char *name;
    sl_cmd_fn fn;
    const char *summary;
} command;

/* One row per subcommand; `skyloom help` prints them in this order. */
static const command commands[] = {
    {"certs", cmd_certs, "site PKI: CA, enrollment tokens, revocation, show"},
    {"coordinator", cmd_coordinator, "run the coordinator (enrollment, device registry, jobs, HTTP dashboard and metrics)"},
    {"device", cmd_device, "run the agent on a device: enroll, heartbeat"},
    {"status", cmd_status, "list the devices a coordinator knows"},
    {"job", cmd_job, "submit, watch, stop, export and trace federated training jobs"},
    {"data", cmd_data, "corpus to WordPiece vocabulary and token shards; inspect shards"},
    {"plan", cmd_plan, "place a model on devices and simulate the pipeline (balancer)"},
    {"train", cmd_train, "train a BERT on this machine (the single-device reference)"},
    {"eval", cmd_eval, "mean masked-LM loss of a model on a shard, or a classifier's metrics"},
    {"fill-mask", cmd_fill_mask, "the most likely tokens at each [MASK] of a text"},
    {"predict", cmd_predict, "the labels of texts with their probabilities (a classifier)"},
    {"profile", cmd_profile, "show this machine's topology and compute backends"},
    {"version", cmd_version, "show version, libraries and what this machine has"},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f,
            "usage: skyloom [-q|-v] <command> [options]\n"
            "       skyloom help <command>\n"
            "       skyloom --version\n\n"
            "Train transformer models across heterogeneous devices.\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nglobal options:\n"
               "  -q, --quiet     only log errors\n"
               "  -v, --verbose   log debug messages\n"
               "  --log-level L   debug, info, warn, error or off\n");
}

static const command *find(const char *name)
{
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet"))
            sl_log_set_level(SL_LOG_ERROR);
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose"))
            sl_log_set_level(SL_LOG_DEBUG);
        else if (!strcmp(a, "--log-level") && i + 1 < argc) {
            int l = sl_log_level_parse(argv[++i]);
            if (l < 0)
                return sl_cli_fail("", 2, "unknown log level '%s' (debug, info, warn, error, off)",
                                   argv[i]);
            sl_log_set_level(l);
        } else if (!strcmp(a, "--version"))
            return cmd_version(1, (char *[]){"version", NULL});
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "skyloom: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[i], "help")) {
        if (i + 1 >= argc) {
            usage(stdout);
            return 0;
        }
        const command *c = find(argv[i + 1]);
        if (!c) {
            fprintf(stderr, "skyloom: unknown command '%s'; see 'skyloom help'\n", argv[i + 1]);
            return 2;
        }
        return c->fn(2, (char *[]){(char *)c->name, "--help", NULL});
    }
    const command *c = find(argv[i]);
    if (!c) {
        fprintf(stderr, "skyloom: unknown command '%s'; see 'skyloom help'\n", argv[i]);
        return 2;
    }
    /* A device's compute threads share the cores with its links, reports and
     * uploads (and often with other devices): OpenMP's default of spinning
     * while it waits takes those cores from them (docs/jobs.md, Limits has
     * the measurement). libgomp reads the policy
     * when it is loaded, so a device started without one starts again with
     * passive waiting; an explicit OMP_WAIT_POLICY is kept. */
    if (!strcmp(c->name, "device") && !getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv("/proc/self/exe", argv);
        sl_log_warn("device: cannot start again with OMP_WAIT_POLICY=passive", "reason=\"%s\"",
                    strerror(errno));
    }
    /* The commands that compute on their own threads spin a short while
     * before they sleep: libgomp's default spin takes the cores from whatever
     * else runs on a shared machine, and passive waiting costs every parallel
     * region a wake-up on an idle one (docs/jobs.md, Limits, measures all
     * three). An explicit policy or spin count is kept. */
    static const char *const computes[] = {"train", "eval", "fill-mask", "predict"};
    int compute = 0;
    for (size_t k = 0; k < sizeof computes / sizeof *computes; k++)
        compute |= !strcmp(c->name, computes[k]);
    if (compute && !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        setenv("GOMP_SPINCOUNT", "10000", 1);
        execv("/proc/self/exe", argv);
        sl_log_warn("cannot start again with GOMP_SPINCOUNT=10000", "command=%s reason=\"%s\"",
                    c->name, strerror(errno));
    }
    return c->fn(argc - i, argv + i);
}
