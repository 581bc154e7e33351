/* skyloom device: the agent on a node (enrollment and heartbeats for now). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "dev_agent.h"
#include "dev_stagesvc.h"
#include "sl_log.h"

int cmd_device(int argc, char **argv)
{
    dev_agent_opts o = {0};
    int once = 0;
    const char *stage_listen = NULL, *stage_advertise = NULL;
    const cli_opt table[] = {{"--coordinator", &o.coordinator},
                             {"--token", &o.token},
                             {"--state", &o.state},
                             {"--site", &o.site},
                             {"--name", &o.name},
                             {"--stage-listen", &stage_listen},
                             {"--stage-advertise", &stage_advertise},
                             {NULL, NULL}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: skyloom device --coordinator HOST:PORT --state DIR --site S\n"
                   "                      [--token TOKEN] [--name N] [--once]\n"
                   "                      [--stage-listen HOST:PORT [--stage-advertise HOST:PORT]]\n\n"
                   "Joins a coordinator. The first start needs a one-time --token (from\n"
                   "skyloom certs token): the device makes its own key in DIR, pins the CA by\n"
                   "the token's fingerprint, sends a CSR and stores the certificate it gets.\n"
                   "Later starts use the stored certificate. Then it heartbeats (with its\n"
                   "hardware profile first) until SIGINT/SIGTERM; --once sends one heartbeat\n"
                   "and exits. With --stage-listen it also serves the Stage service to its\n"
                   "pipeline neighbours (mutual TLS, device certificates only) and reports\n"
                   "that address (or --stage-advertise) in its heartbeats.\n");
            return 0;
        }
        if (!strcmp(a, "--once")) {
            once = 1;
            continue;
        }
        int r = cli_opt_take("device", argc, argv, &i, table);
        if (r < 0)
            return 2;
        if (r == 0)
            return sl_cli_fail("device", 2, "unknown option '%s'", a);
    }
    if (!o.coordinator || !o.state || !o.site)
        return sl_cli_fail("device", 2, "--coordinator, --state and --site are required");
    cli_raise_fd_limit();
    rpc_global_init();
    sl_err err = {0};
    int status = 0;
    dev_agent *a = dev_agent_open(&o, &err);
    dev_stagesvc *stage = NULL;
    if (a && stage_listen) {
        dev_stagesvc_opts so = {.listen = stage_listen, .state = o.state,
                             .revoked = dev_agent_is_revoked, .revoked_ud = a};
        int port = 0;
        if (!(stage = dev_stagesvc_start(&so, &port, &err))) {
            status = sl_cli_fail("device", 1, "Stage service: %s", err.msg);
            dev_agent_close(a);
            a = NULL;
        } else {
            char adv[300];
            const char *colon = strrchr(stage_listen, ':');
            snprintf(adv, sizeof adv, "%.*s:%d", colon ? (int)(colon - stage_listen) : 0,
                     stage_listen, port);
            dev_agent_set_stage_address(a, stage_advertise ? stage_advertise : adv);
            sl_log_info("device: serving Stage", "listen=%s port=%d", stage_listen, port);
        }
    }
    if (!a) {
        if (!status)
            status = sl_cli_fail("device", 1, "%s", err.msg);
    } else {
        cli_catch_stop_signals();
        printf("device %s\n", dev_agent_id(a));
        fflush(stdout);
        while (!cli_stop_signal()) {
            rpc_status st;
            int code = dev_agent_heartbeat(a, &st);
            if (code == RPC_UNAUTHENTICATED || code == RPC_PERMISSION_DENIED) {
                status = sl_cli_fail("device", 1, "coordinator refused %s: %s: %s",
                                     dev_agent_id(a), rpc_code_name(code), st.details);
                break;
            }
            if (code != RPC_OK) {
                sl_log_warn("device: heartbeat failed", "code=%s reason=\"%s\"",
                            rpc_code_name(code), st.details);
                if (once) {
                    status = sl_cli_fail("device", 1, "heartbeat failed: %s: %s",
                                         rpc_code_name(code), st.details);
                    break;
                }
            }
            if (once)
                break;
            for (unsigned t = 0; t < dev_agent_heartbeat_ms(a) && !cli_stop_signal(); t += 50)
                usleep(50 * 1000);
        }
        dev_agent_close(a);
    }
    if (dev_stagesvc_stop(stage) != 0) {
        sl_log_error("device: exiting with a Stage call still running", "%s", "");
        fflush(NULL);
        _exit(status ? status : 1);
    }
    rpc_global_shutdown();
    return status;
}
