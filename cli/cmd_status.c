/* skyloom status: the devices a coordinator knows, asked with the admin certificate. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cert.h"
#include "cli.h"
#include "rpc.h"
#include "skyloom.pb-c.h"

static json_t *profile_json(const Skyloom__V1__DeviceProfile *p)
{
    if (!p)
        return json_null();
    return json_pack("{s:s, s:I, s:I, s:I, s:I, s:b, s:s}", "cpu_model", p->cpu_model, "cores",
                     (json_int_t)p->cores, "pus", (json_int_t)p->pus, "memory_bytes",
                     (json_int_t)p->memory_bytes, "l3_bytes", (json_int_t)p->l3_bytes, "cuda",
                     p->cuda, "gpu", p->gpu_name);
}

static json_t *doubles_json(const double *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

/* The device's latest job profile, or null. */
static json_t *job_profile_json(const Skyloom__V1__JobProfile *p)
{
    if (!p)
        return json_null();
    json_t *links = json_array();
    for (size_t i = 0; i < p->n_links; i++)
        json_array_append_new(links, json_pack("{s:s, s:f, s:f}", "peer", p->links[i]->peer,
                                               "rtt_s", p->links[i]->rtt_s, "bandwidth_Bps",
                                               p->links[i]->bandwidth_bytes_per_s));
    json_t *o = json_pack("{s:s, s:I, s:i, s:i, s:o, s:o, s:I, s:i, s:s, s:o}", "job_id", p->job_id,
                          "measured_at", (json_int_t)p->measured_at, "micro_batch",
                          (int)p->micro_batch, "seq", (int)p->seq, "unit_fwd_s",
                          doubles_json(p->unit_fwd_s, p->n_unit_fwd_s), "unit_bwd_s",
                          doubles_json(p->unit_bwd_s, p->n_unit_bwd_s), "memory_bytes",
                          (json_int_t)p->memory_bytes, "threads", (int)p->threads, "backend",
                          p->backend, "links", links);
    if (p->n_unit_optim_s)
        json_object_set_new(o, "unit_optim_s", doubles_json(p->unit_optim_s, p->n_unit_optim_s));
    if (*p->failed)
        json_object_set_new(o, "failed", json_string(p->failed));
    return o;
}

/* The datasets a device serves, with what its last check for a job said. */
static json_t *datasets_json(const Skyloom__V1__DeviceInfo *d)
{
    json_t *a = json_array();
    for (size_t i = 0; i < d->n_datasets; i++) {
        const Skyloom__V1__DatasetInfo *x = d->datasets[i];
        json_t *o = json_pack("{s:s}", "name", x->name);
        if (x->checked_at) {
            json_object_set_new(o, "sequences", json_integer((json_int_t)x->sequences));
            json_object_set_new(o, "seq_len", json_integer(x->seq_len));
            json_object_set_new(o, "vocab_size", json_integer(x->vocab_size));
            json_object_set_new(o, "vocab_hash", json_string(x->vocab_hash));
            json_object_set_new(o, "shard_hash", json_string(x->shard_hash));
            json_object_set_new(o, "checked_at", json_integer((json_int_t)x->checked_at));
            json_object_set_new(o, "job_id", json_string(x->job_id));
        }
        json_array_append_new(a, o);
    }
    return a;
}

/* Milliseconds per unit: the embeddings | the encoder layers | the head. */
static void print_units(const char *what, const double *v, size_t n)
{
    printf("    %-9s ms:", what);
    for (size_t u = 0; u < n; u++)
        printf("%s%.3g", u == 1 || (u + 1 == n && n > 1) ? " | " : " ", 1e3 * v[u]);
    printf("\n");
}

static void print_job_profile(const Skyloom__V1__DeviceInfo *d)
{
    const Skyloom__V1__JobProfile *p = d->job_profile;
    char when[32] = "?";
    time_t t = (time_t)p->measured_at;
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("  %s  job %s, %s\n", d->device_id, p->job_id, when);
    if (*p->failed) {
        printf("    failed: %s\n", p->failed);
        return;
    }
    printf("    micro-batch %u x %u tokens, %u thread%s, %s, %.1f GiB usable\n", p->micro_batch,
           p->seq, p->threads, p->threads == 1 ? "" : "s", p->backend,
           (double)p->memory_bytes / (1u << 30));
    print_units("forward", p->unit_fwd_s, p->n_unit_fwd_s);
    print_units("backward", p->unit_bwd_s, p->n_unit_bwd_s);
    if (p->n_unit_optim_s)
        print_units("optimizer", p->unit_optim_s, p->n_unit_optim_s);
    for (size_t i = 0; i < p->n_links; i++)
        printf("    link to %s: rtt %.3f ms, %.1f MB/s\n", p->links[i]->peer,
               1e3 * p->links[i]->rtt_s, p->links[i]->bandwidth_bytes_per_s / 1e6);
}

int cmd_status(int argc, char **argv)
{
    const char *target = NULL, *pki = NULL;
    int json = 0;
    const cli_opt table[] = {{"--coordinator", &target}, {"--pki", &pki}, {NULL, NULL}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: skyloom status --coordinator HOST:PORT --pki DIR [--json]\n\n"
                   "Lists the devices a coordinator has enrolled: name, site, state (online,\n"
                   "offline, revoked), last heartbeat, Stage address, the datasets it serves\n"
                   "(--data; with sequences and vocabulary hash once it checked one for a job)\n"
                   "and a profile summary, and what each\n"
                   "device measured when it last profiled for a job: seconds per unit\n"
                   "(embeddings | encoder layers | head) forward, backward and optimizer step\n"
                   "for that job's micro-batch, its threads and memory, and the round trip and bandwidth of\n"
                   "its links to the other candidates. Authenticates with DIR/admin.crt from\n"
                   "skyloom certs init.\n\n"
                   "--coordinator is the coordinator's gRPC address (its --listen). Without\n"
                   "the options, the environment variables SKYLOOM_COORDINATOR and SKYLOOM_PKI\n"
                   "give them; an option wins.\n");
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        int r = cli_opt_take("status", argc, argv, &i, table);
        if (r < 0)
            return 2;
        if (r == 0)
            return sl_cli_fail("status", 2, "unknown option '%s'", a);
    }
    target = cli_env_default(target, CLI_ENV_COORDINATOR);
    pki = cli_env_default(pki, CLI_ENV_PKI);
    if (cli_need_connection("status", target, pki))
        return 2;
    char ca[4200], crt[4200], key[4200];
    sl_err err = {0};
    if (cli_check_address("--coordinator", target, &err))
        return sl_cli_fail("status", 2, "%s", err.msg);
    if (cert_path(ca, sizeof ca, pki, "ca.crt", &err) ||
        cert_path(crt, sizeof crt, pki, "admin.crt", &err) ||
        cert_path(key, sizeof key, pki, "admin.key", &err))
        return sl_cli_fail("status", 2, "%s", err.msg);
    rpc_global_init();
    int status = 0;
    rpc_channel_opts co = {.target = target, .tls = {ca, crt, key}};
    rpc_channel *ch = rpc_channel_create(&co, &err);
    Skyloom__V1__ListDevicesResponse *r = NULL;
    if (!ch) {
        status = sl_cli_fail("status", 1, "%s", err.msg);
    } else {
        Skyloom__V1__ListDevicesRequest req = SKYLOOM__V1__LIST_DEVICES_REQUEST__INIT;
        rpc_status st;
        int code = rpc_call_pb(ch, RPC_M_LIST_DEVICES, &req,
                               &skyloom__v1__list_devices_response__descriptor, (void **)&r, 10000,
                               &st);
        if (code != RPC_OK) {
            cli_call_error(&err, target, pki, code, st.details);
            status = sl_cli_fail("status", 1, "%s", err.msg);
        }
    }
    if (r && json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < r->n_devices; i++) {
            Skyloom__V1__DeviceInfo *d = r->devices[i];
            json_array_append_new(
                arr, json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:o, s:o, s:o}", "device_id",
                               d->device_id, "site", d->site, "name", d->name, "state", d->state,
                               "stage_address", d->stage_address,
                               "enrolled_at", (json_int_t)d->enrolled_at, "last_heartbeat",
                               (json_int_t)d->last_heartbeat, "profile",
                               profile_json(d->profile), "job_profile",
                               job_profile_json(d->job_profile), "datasets", datasets_json(d)));
        }
        json_t *o = json_pack("{s:s, s:o}", "coordinator", target, "devices", arr);
        char *s = json_dumps(o, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(o);
    } else if (r) {
        printf("%-18s %-16s %-12s %-8s %-20s %-21s %-16s %s\n", "DEVICE", "NAME", "SITE", "STATE",
               "LAST HEARTBEAT", "STAGE", "DATASETS", "PROFILE");
        for (size_t i = 0; i < r->n_devices; i++) {
            Skyloom__V1__DeviceInfo *d = r->devices[i];
            char when[32] = "never";
            if (d->last_heartbeat) {
                time_t t = (time_t)d->last_heartbeat;
                struct tm tm;
                gmtime_r(&t, &tm);
                strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
            }
            char prof[160] = "-";
            if (d->profile)
                snprintf(prof, sizeof prof, "%u cores, %.1f GiB, %s", d->profile->cores,
                         (double)d->profile->memory_bytes / (1u << 30),
                         d->profile->cuda ? d->profile->gpu_name : "no GPU");
            char ds[200] = "";
            for (size_t k = 0; k < d->n_datasets; k++) {
                size_t o = strlen(ds);
                snprintf(ds + o, sizeof ds - o, "%s%s", k ? "," : "", d->datasets[k]->name);
            }
            printf("%-18s %-16s %-12s %-8s %-20s %-21s %-16s %s\n", d->device_id,
                   d->name[0] ? d->name : "-", d->site, d->state, when,
                   d->stage_address[0] ? d->stage_address : "-", ds[0] ? ds : "-", prof);
        }
        if (r->n_devices == 0)
            printf("(no devices enrolled)\n");
        int dh = 0;
        for (size_t i = 0; i < r->n_devices; i++)
            for (size_t k = 0; k < r->devices[i]->n_datasets; k++) {
                const Skyloom__V1__DatasetInfo *x = r->devices[i]->datasets[k];
                if (!dh++)
                    printf("\ndatasets (as each device last checked them for a job):\n");
                if (!x->checked_at) {
                    printf("  %s:%s  not checked for a job yet\n", r->devices[i]->device_id, x->name);
                    continue;
                }
                printf("  %s:%s  %llu sequences of %u tokens, vocabulary %u (hash %.16s...), "
                       "checked for job %s\n", r->devices[i]->device_id, x->name,
                       (unsigned long long)x->sequences, x->seq_len, x->vocab_size, x->vocab_hash,
                       x->job_id);
            }
        int header = 0;
        for (size_t i = 0; i < r->n_devices; i++) {
            if (!r->devices[i]->job_profile)
                continue;
            if (!header++)
                printf("\nmeasured for a job (each device's latest profile; per unit: "
                       "embeddings | layers | head):\n");
            print_job_profile(r->devices[i]);
        }
    }
    rpc_unpacked_free(r);
    rpc_channel_destroy(ch);
    rpc_global_shutdown();
    return status;
}
