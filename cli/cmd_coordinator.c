/* skyloom coordinator: the control plane (enrollment and device registry),
 * and `skyloom coordinator backup`, the copy of its state. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cert.h"
#include "cli.h"
#include "coord.h"
#include "coord_obs.h"
#include "coord_state.h"
#include "rpc.h"
#include "sl_file.h"
#include "sl_log.h"

static int backup(int argc, char **argv)
{
    const char *state = NULL, *out = NULL;
    const cli_opt table[] = {{"--state", &state}, {"--out", &out}, {NULL, NULL}};
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: skyloom coordinator backup --state DIR --out FILE\n\n"
                   "Copies the coordinator's state (DIR/coordinator.db with what its -wal file\n"
                   "holds) to FILE with SQLite's online backup, while the coordinator runs or\n"
                   "not, and checks the copy. Copying coordinator.db alone can lose the last\n"
                   "enrollments: they may be only in coordinator.db-wal. To restore, stop the\n"
                   "coordinator, put FILE in place of DIR/coordinator.db and delete\n"
                   "DIR/coordinator.db-wal and DIR/coordinator.db-shm.\n");
            return 0;
        }
        int r = cli_opt_take("coordinator backup", argc, argv, &i, table);
        if (r < 0)
            return 2;
        if (r == 0)
            return sl_cli_fail("coordinator backup", 2, "unknown option '%s'", argv[i]);
    }
    if (!state || !out)
        return sl_cli_fail("coordinator backup", 2, "--state and --out are required");
    sl_err err = {0};
    int64_t devices = 0;
    if (coord_state_backup(state, out, &devices, &err))
        return sl_cli_fail("coordinator backup", 1, "%s", err.msg);
    printf("backed up %s/coordinator.db (%" PRId64 " devices) to %s\n", state, devices, out);
    return 0;
}

#define HTTP_DEFAULT "127.0.0.1:7401"

/* The HTTP server: NULL when off, or when the default address is taken
 * (a warning: several coordinators on one machine must not fail for it);
 * a failure on an address the user named is an error (*failed). */
static coord_http *start_http(coord *c, const char *listen, const char *token_file,
                              const char *name, const char *port_file, int *failed)
{
    *failed = 0;
    if (!strcmp(listen, "off"))
        return NULL;
    sl_err err = {0};
    char *token = NULL;
    if (token_file && coord_http_read_token(token_file, &token, &err)) {
        *failed = sl_cli_fail("coordinator", 2, "%s", err.msg);
        return NULL;
    }
    coord_http_opts ho = {.listen = listen, .token = token, .name = name};
    coord_http *h = coord_http_start(c, &ho, &err);
    free(token);
    if (!h && err.code == SL_EIO && !strcmp(listen, HTTP_DEFAULT)) {
        sl_log_warn("coordinator: no dashboard or metrics", "reason=\"%s\" hint=\"--http-listen "
                    "HOST:PORT, or off\"", err.msg);
        return NULL;
    }
    if (!h) {
        *failed = sl_cli_fail("coordinator", err.code == SL_EINVAL ? 2 : 1, "%s", err.msg);
        return NULL;
    }
    int port = coord_http_port(h);
    sl_log_info("coordinator: HTTP serving", "listen=%s port=%d auth=%s", listen, port,
                token_file ? "bearer" : "none");
    char line[16];
    snprintf(line, sizeof line, "%d\n", port);
    if (port_file && sl_write_file_atomic(port_file, line, strlen(line), &err))
        sl_log_warn("coordinator: cannot write the HTTP port file", "reason=\"%s\"", err.msg);
    return h;
}

int cmd_coordinator(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "backup"))
        return backup(argc, argv);
    coord_opts o = {0};
    const char *port_file = NULL, *heartbeat = NULL, *max_message = NULL;
    const char *http = HTTP_DEFAULT, *http_token = NULL, *http_port_file = NULL, *http_name = NULL;
    sl_err err = {0};
    const cli_opt table[] = {{"--listen", &o.listen},       {"--pki", &o.pki},
                             {"--state", &o.state},         {"--port-file", &port_file},
                             {"--heartbeat", &heartbeat},   {"--max-message", &max_message},
                             {"--http-listen", &http},      {"--http-token", &http_token},
                             {"--http-port-file", &http_port_file}, {"--http-name", &http_name},
                             {NULL, NULL}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: skyloom coordinator --listen ADDR --pki DIR --state DIR\n"
                   "                           [--heartbeat 5s] [--max-message 1M] [--port-file F]\n"
                   "                           [--http-listen HOST:PORT|off] [--http-token FILE]\n"
                   "                           [--http-port-file F] [--http-name NAME]\n"
                   "       skyloom coordinator backup --state DIR --out FILE\n\n"
                   "Serves the Coordinator service over mutual TLS on ADDR (HOST:PORT; port 0\n"
                   "picks a free one, written to --port-file). Devices without a certificate\n"
                   "may only call Enroll, with a one-time token from skyloom certs token; every\n"
                   "other call needs a certificate from the CA in --pki. State (devices, token\n"
                   "hashes, revocations) lives in DIR/coordinator.db and DIR/coordinator.db-wal\n"
                   "(SQLite, WAL: both are the state; copy it with `backup`) and survives\n"
                   "restarts. One coordinator per PKI and state directory. Stops on SIGINT or\n"
                   "SIGTERM (within seconds, even with a call stuck on a hung disk).\n\n"
                   "HTTP (docs/operations.md): GET /metrics (Prometheus), GET / and /job/ID (a\n"
                   "dashboard), on --http-listen (default " HTTP_DEFAULT "; off: none; port 0\n"
                   "picks one, written to --http-port-file). If the default address is taken the\n"
                   "coordinator runs without it and says so. An address other than loopback\n"
                   "needs --http-token FILE (one line): every request must then carry\n"
                   "'Authorization: Bearer TOKEN'. Without a token, a request's Host must be the\n"
                   "listen address (on loopback also localhost) or --http-name NAME: a web page\n"
                   "that points a name of its own here (DNS rebinding) is refused.\n\n"
                   "Without --pki, the environment variable SKYLOOM_PKI gives the PKI directory;\n"
                   "an option wins. Clients (skyloom job, status, device) take the --listen\n"
                   "address as --coordinator, never the HTTP one.\n");
            return 0;
        }
        int r = cli_opt_take("coordinator", argc, argv, &i, table);
        if (r < 0)
            return 2;
        if (r == 0)
            return sl_cli_fail("coordinator", 2, "unknown option '%s'", a);
    }
    if (heartbeat) {
        int64_t s;
        if (sl_parse_duration("--heartbeat", heartbeat, &s, &err) || s < 1 || s > 3600)
            return sl_cli_fail("coordinator", 2, "--heartbeat must be 1s..1h");
        o.heartbeat_ms = (unsigned)(s * 1000);
    }
    if (max_message) {
        uint64_t b;
        if (sl_parse_bytes("--max-message", max_message, &b, &err) || b < 4096 || b > (1u << 30))
            return sl_cli_fail("coordinator", 2, "--max-message must be 4K..1G");
        o.max_message = (size_t)b;
    }
    o.pki = cli_env_default(o.pki, CLI_ENV_PKI);
    if (!o.listen || !o.pki || !o.state)
        return sl_cli_fail("coordinator", 2, "--listen, --pki (or the environment variable %s) and "
                           "--state are required", CLI_ENV_PKI);
    cli_raise_fd_limit();
    rpc_global_init();
    int status = 0, http_failed = 0;
    coord *c = coord_open(&o, &err);
    int port = c ? coord_start(c, &err) : -1;
    coord_http *h = port < 0 ? NULL : start_http(c, http, http_token, http_name, http_port_file, &http_failed);
    if (port < 0) {
        status = sl_cli_fail("coordinator", 1, "%s", err.msg);
    } else if (http_failed) {
        status = http_failed;
    } else {
        cli_catch_stop_signals();
        /* a file-size limit reached in the checkpoint store fails that write
         * (EFBIG, reported with the job) instead of killing the coordinator */
        signal(SIGXFSZ, SIG_IGN);
        sl_log_info("coordinator: serving", "listen=%s port=%d pki=%s state=%s", o.listen, port,
                    o.pki, o.state);
        char line[16];
        snprintf(line, sizeof line, "%d\n", port);
        if (port_file && sl_write_file_atomic(port_file, line, strlen(line), &err))
            sl_log_warn("coordinator: cannot write port file", "reason=\"%s\"", err.msg);
        while (!cli_stop_signal())
            usleep(50 * 1000);
        sl_log_info("coordinator: stopping", "signal=%d", cli_stop_signal());
    }
    coord_http_stop(h);
    if (coord_close(c) != 0) {
        /* gRPC's own teardown would wait for the stuck call: leave now. */
        sl_log_error("coordinator: exiting with a call still running", "%s", "");
        fflush(NULL);
        _exit(status ? status : 1);
    }
    rpc_global_shutdown();
    return status;
}
