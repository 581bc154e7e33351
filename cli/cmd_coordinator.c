/* skyloom coordinator: the control plane (enrollment and device registry). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cert.h"
#include "cli.h"
#include "coord.h"
#include "rpc.h"
#include "sl_log.h"

int cmd_coordinator(int argc, char **argv)
{
    coord_opts o = {0};
    const char *port_file = NULL, *heartbeat = NULL, *max_message = NULL;
    sl_err err = {0};
    const cli_opt table[] = {{"--listen", &o.listen},       {"--pki", &o.pki},
                             {"--state", &o.state},         {"--port-file", &port_file},
                             {"--heartbeat", &heartbeat},   {"--max-message", &max_message},
                             {NULL, NULL}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: skyloom coordinator --listen ADDR --pki DIR --state DIR\n"
                   "                           [--heartbeat 5s] [--max-message 1M] [--port-file F]\n\n"
                   "Serves the Coordinator service over mutual TLS on ADDR (HOST:PORT; port 0\n"
                   "picks a free one, written to --port-file). Devices without a certificate\n"
                   "may only call Enroll, with a one-time token from skyloom certs token; every\n"
                   "other call needs a certificate from the CA in --pki. State (devices, token\n"
                   "hashes, revocations) lives in DIR/coordinator.db (SQLite, WAL) and survives\n"
                   "restarts. Stops cleanly on SIGINT or SIGTERM.\n");
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
    if (!o.listen || !o.pki || !o.state)
        return sl_cli_fail("coordinator", 2, "--listen, --pki and --state are required");
    rpc_global_init();
    int status = 0;
    coord *c = coord_open(&o, &err);
    int port = c ? coord_start(c, &err) : -1;
    if (port < 0) {
        status = sl_cli_fail("coordinator", 1, "%s", err.msg);
    } else {
        cli_catch_stop_signals();
        sl_log_info("coordinator: serving", "listen=%s port=%d pki=%s state=%s", o.listen, port,
                    o.pki, o.state);
        if (port_file) {
            FILE *f = fopen(port_file, "w");
            if (f) {
                fprintf(f, "%d\n", port);
                fclose(f);
            } else {
                sl_log_warn("coordinator: cannot write port file", "path=%s", port_file);
            }
        }
        while (!cli_stop_signal())
            usleep(50 * 1000);
        sl_log_info("coordinator: stopping", "signal=%d", cli_stop_signal());
    }
    coord_close(c);
    rpc_global_shutdown();
    return status;
}
