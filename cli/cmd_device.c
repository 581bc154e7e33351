/* skyloom device: the agent on a node: enrollment, heartbeats, the Stage
 * service, and its part in jobs (device/node/dev_job.h). */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "dev_agent.h"
#include "dev_job.h"
#include "dev_plan.h"
#include "dev_profile.h"
#include "dev_stagesvc.h"
#include "sl_log.h"
#include "sl_time.h"

/* How long a device asked to stop waits for its checkpoint parts to upload. */
#define DRAIN_MAX_S 120

static void usage(void)
{
    printf("usage: skyloom device --coordinator HOST:PORT --state DIR --site S\n"
           "                      [--token TOKEN] [--name N] [--once]\n"
           "                      [--stage-listen HOST:PORT [--stage-advertise HOST:PORT]]\n"
           "                      [--data NAME=PATH]... [--threads N] [--memory BYTES]\n"
           "                      [--home-layers N] [--allow-unsealed] [--allow-labels-out]\n\n"
           "Joins a coordinator. The first start needs a one-time --token (from\n"
           "skyloom certs token): the device makes its own key in DIR, pins the CA by\n"
           "the token's fingerprint, sends a CSR and stores the certificate it gets.\n"
           "Later starts use the stored certificate. Then it heartbeats (with its\n"
           "hardware profile first) until SIGINT/SIGTERM; --once sends one heartbeat\n"
           "and exits. With --stage-listen it also serves the Stage service to its\n"
           "pipeline neighbours (mutual TLS, device certificates only) and reports\n"
           "that address (or --stage-advertise) in its heartbeats, and takes part in\n"
           "jobs: it checks the datasets jobs name, profiles itself, trains the stages\n"
           "the coordinator's signed plan gives it and uploads its checkpoints.\n\n"
           "  --data NAME=PATH  a token shard this device serves as NAME (repeatable);\n"
           "                    a job names DEVICE_ID:NAME and can read nothing else\n"
           "  --threads N       compute threads for training and profiling (default:\n"
           "                    the cores hwloc sees)\n"
           "  --memory BYTES    usable memory to report to the planner (default: the\n"
           "                    machine's, from hwloc)\n\n"
           "The data owner's policy, for jobs on its --data (it refuses a plan that\n"
           "breaks it, saying why; the coordinator plans within it):\n"
           "  --home-layers N   encoder layers that run here besides the embeddings\n"
           "                    (default %d; docs/security.md says what a middle device\n"
           "                    learns at each N)\n"
           "  --allow-unsealed  let jobs send its frames unsealed (default: sealed only)\n"
           "  --allow-labels-out let the head, with its labels and the tied embedding's\n"
           "                    gradient, run on another device (default: here)\n\n"
           "--coordinator is the coordinator's gRPC address (its --listen); without it,\n"
           "the environment variable SKYLOOM_COORDINATOR gives it. One device per state\n"
           "directory: a second one on DIR is refused, naming the pid that holds it.\n"
           "Without --stage-listen the device serves no job, so its --data cannot be\n"
           "trained on (it says so when it starts).\n", DEV_POLICY_HOME_LAYERS);
}

int cmd_device(int argc, char **argv)
{
    dev_agent_opts o = {0};
    int once = 0;
    const char *stage_listen = NULL, *stage_advertise = NULL, *threads_s = NULL, *memory_s = NULL,
               *home_s = NULL;
    dev_policy policy = dev_policy_default();
    dev_dataset data[64];
    int n_data = 0;
    const cli_opt table[] = {{"--coordinator", &o.coordinator},
                             {"--token", &o.token},
                             {"--state", &o.state},
                             {"--site", &o.site},
                             {"--name", &o.name},
                             {"--stage-listen", &stage_listen},
                             {"--stage-advertise", &stage_advertise},
                             {"--threads", &threads_s},
                             {"--memory", &memory_s},
                             {"--home-layers", &home_s},
                             {NULL, NULL}};
    sl_err err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--once")) {
            once = 1;
            continue;
        }
        if (!strcmp(a, "--allow-unsealed") || !strcmp(a, "--allow-labels-out")) {
            *(a[8] == 'u' ? &policy.allow_unsealed : &policy.allow_labels_out) = 1;
            continue;
        }
        if (!strcmp(a, "--data")) {
            if (i + 1 >= argc)
                return sl_cli_fail("device", 2, "--data needs NAME=PATH");
            if (n_data == 64)
                return sl_cli_fail("device", 2, "at most 64 --data");
            if (dev_dataset_parse(argv[++i], &data[n_data], &err))
                return sl_cli_fail("device", 2, "%s", err.msg);
            for (int k = 0; k < n_data; k++)
                if (!strcmp(data[k].name, data[n_data].name))
                    return sl_cli_fail("device", 2, "--data %s given twice", data[k].name);
            n_data++;
            continue;
        }
        int r = cli_opt_take("device", argc, argv, &i, table);
        if (r < 0)
            return 2;
        if (r == 0)
            return sl_cli_fail("device", 2, "unknown option '%s'", a);
    }
    o.coordinator = cli_env_default(o.coordinator, CLI_ENV_COORDINATOR);
    if (!o.coordinator || !o.state || !o.site)
        return sl_cli_fail("device", 2, "--coordinator (or the environment variable %s), --state "
                           "and --site are required", CLI_ENV_COORDINATOR);
    if (cli_check_address("--coordinator", o.coordinator, &err))
        return sl_cli_fail("device", 2, "%s", err.msg);
    int threads = 0;
    uint64_t memory = 0;
    if (threads_s && sl_parse_int("--threads", threads_s, 1, 1024, &threads, &err))
        return sl_cli_fail("device", 2, "%s", err.msg);
    if (memory_s && sl_parse_bytes("--memory", memory_s, &memory, &err))
        return sl_cli_fail("device", 2, "%s", err.msg);
    if (home_s && sl_parse_int("--home-layers", home_s, 0, DEV_POLICY_MAX_HOME_LAYERS,
                               &policy.home_layers, &err))
        return sl_cli_fail("device", 2, "%s", err.msg);
    for (int k = 0; k < n_data; k++)
        if (access(data[k].path, R_OK) != 0)
            return sl_cli_fail("device", 2, "--data %s=%s: %s", data[k].name, data[k].path,
                               strerror(errno));
    if (!threads) {
        dev_profile prof;
        threads = dev_profile_probe(&prof, NULL) == 0 && prof.cores > 0 ? (int)prof.cores : 1;
        if (!memory)
            memory = prof.memory_bytes;
    } else if (!memory) {
        dev_profile prof;
        if (dev_profile_probe(&prof, NULL) == 0)
            memory = prof.memory_bytes;
    }
    if (n_data && !stage_listen) {
        char names[64 * 66] = "";
        for (int k = 0; k < n_data; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%.64s", k ? "," : "",
                     data[k].name);
        sl_log_warn("device: --data without --stage-listen: this device serves no Stage, so no "
                    "job can train on its data", "datasets=%s hint=\"add --stage-listen HOST:PORT "
                    "(port 0: a free one)\"", names);
    }
    cli_raise_fd_limit();
    rpc_global_init();
    int status = 0;
    dev_kx_keypair kp;
    dev_agent *a = dev_kx_keypair_generate(&kp, &err) ? NULL : dev_agent_open(&o, &err);
    dev_stagesvc *stage = NULL;
    dev_jobs *jobs = NULL;
    if (a) {
        dev_jobs_opts jo = {.agent = a, .datasets = data, .n_datasets = n_data,
                            .threads = threads, .memory_bytes = memory, .link_kp = &kp,
                            .policy = policy};
        jobs = dev_jobs_open(&jo, &err);
        const char *names[64];
        for (int k = 0; k < n_data; k++)
            names[k] = data[k].name;
        dev_agent_set_job_info(a, names, n_data, stage_listen ? kp.pk : NULL, (unsigned)threads);
        dev_agent_set_policy(a, policy.home_layers, policy.allow_unsealed, policy.allow_labels_out);
    }
    if (a && stage_listen) {
        dev_stagesvc_opts so = {.listen = stage_listen, .state = o.state,
                                .exchange = dev_jobs_exchange, .admit = dev_jobs_admit, .ud = jobs,
                                .revoked = dev_agent_is_revoked, .revoked_ud = a,
                                .ping = dev_agent_may_ping};
        int port = 0;
        if (!(stage = dev_stagesvc_start(&so, &port, &err))) {
            status = sl_cli_fail("device", 1, "Stage service: %s", err.msg);
            dev_jobs_close(jobs);
            jobs = NULL;
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
        int failures = 0, draining = 0;
        double fast_until = 0, drain_until = 0;
        for (;;) {
            /* a stop with checkpoint parts still to upload: the device
             * trains and heartbeats on until they are up and the job has
             * committed their step, which needs the other devices' parts
             * too (a second signal stops at once) */
            if (cli_stop_signal() && !draining) {
                char what[512];
                if (cli_stop_signals() > 1 || !dev_jobs_mark_uploads(jobs, what, sizeof what))
                    break;
                sl_log_info("device: stopping once its checkpoint parts are uploaded",
                            "parts=\"%s\" at_most_s=%d hint=\"a second SIGINT or SIGTERM stops at once\"",
                            what, DRAIN_MAX_S);
                draining = 1;
                drain_until = sl_now_s() + DRAIN_MAX_S;
            }
            if (draining && (cli_stop_signals() > 1 || dev_jobs_marked_committed(jobs) ||
                             sl_now_s() > drain_until)) {
                sl_log_info("device: stopping", "parts_uploaded=%s committed=%s",
                            dev_jobs_marked_uploaded(jobs) ? "yes" : "no",
                            !dev_jobs_commit_told(jobs)        ? "unknown (the coordinator's run "
                                                                 "tasks do not say it)"
                            : dev_jobs_marked_committed(jobs) ? "yes"
                                                              : "no");
                break;
            }
            rpc_status st;
            int code = dev_agent_heartbeat(a, &st);
            failures = code == RPC_OK ? 0 : failures + 1;
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
            if (code == RPC_OK && stage)
                dev_jobs_revocations(jobs); /* the reply's revoked list is the latest */
            dev_task *tasks;
            int nt;
            dev_agent_take_tasks(a, &tasks, &nt);
            for (int k = 0; k < nt && stage; k++)
                if (!draining || !strcmp(tasks[k].kind, "stop")) /* stopping: no new work */
                    dev_jobs_task(jobs, &tasks[k]);
                else if (!strcmp(tasks[k].kind, "run"))
                    dev_jobs_note_run(jobs, &tasks[k]); /* the committed step it says */
            dev_tasks_free(tasks, nt);
            if (once)
                break;
            /* after a failed heartbeat (the coordinator restarting, say) the
             * next comes sooner, backing off to the interval: 250 ms, 500 ms, ... */
            unsigned wait_ms = dev_agent_heartbeat_ms(a);
            if (failures > 0 && failures < 8 && (250u << (failures - 1)) < wait_ms)
                wait_ms = 250u << (failures - 1);
            /* a job that failed here pokes: heartbeats every 500 ms for 10 s,
             * so that the re-planned epoch starts without waiting an interval */
            if (sl_now_s() < fast_until && wait_ms > 500)
                wait_ms = 500;
            for (unsigned t = 0; t < wait_ms; t += 50) {
                if (draining ? cli_stop_signals() > 1 || dev_jobs_marked_committed(jobs)
                             : cli_stop_signal() != 0)
                    break;
                if (dev_agent_take_poke(a)) {
                    fast_until = sl_now_s() + 10;
                    break;
                }
                usleep(50 * 1000);
            }
        }
    }
    dev_jobs_stop(jobs); /* the jobs' streams end, so the Stage service can stop */
    if (stage) {
        rpc_stream_counts sc;
        uint64_t no_hello, bad_hello;
        dev_stagesvc_counts(stage, &sc);
        dev_jobs_counts(jobs, &no_hello, &bad_hello);
        sl_log_info("device: Exchange streams refused", "not_admitted=%ld over_peer_cap=%ld "
                    "server_full=%ld no_hello=%llu bad_hello=%llu", sc.admit, sc.per_peer, sc.full,
                    (unsigned long long)no_hello, (unsigned long long)bad_hello);
    }
    if (dev_stagesvc_stop(stage) != 0) {
        sl_log_error("device: exiting with a Stage call still running", "%s", "");
        fflush(NULL);
        _exit(status ? status : 1);
    }
    dev_jobs_close(jobs);
    dev_agent_close(a);
    sodium_memzero(&kp, sizeof kp);
    rpc_global_shutdown();
    return status;
}
