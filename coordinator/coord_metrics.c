/* coord_metrics.c - /metrics: the Prometheus text format (version 0.0.4),
 * names by Prometheus conventions: the skyloom_ prefix, base units
 * (seconds, bytes), counters ending in _total, one HELP and TYPE per
 * family. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coord_internal.h"
#include "coord_obs.h"
#include "sl_config.h"
#include "sl_mem.h"

static const char *const job_states[] = {"checking", "profiling",  "planning", "running", "recovering",
                                         "waiting",  "done",       "failed",   "stopped"};
static const char *const dev_states[] = {"online", "offline", "revoked"};

static void family(sl_buf *b, const char *name, const char *type, const char *help)
{
    sl_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslash, double quote and newline escaped. */
static void label(sl_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            sl_buf_printf(b, "\\%c", *s);
        else if (*s == '\n')
            sl_buf_printf(b, "\\n");
        else
            sl_buf_printf(b, "%c", *s);
    }
}

static void num(sl_buf *b, double v)
{
    if (isnan(v))
        sl_buf_printf(b, " NaN\n");
    else if (isinf(v))
        sl_buf_printf(b, v > 0 ? " +Inf\n" : " -Inf\n");
    else
        sl_buf_printf(b, " %.17g\n", v);
}

/* name{job_id="…"} v ("job" is the label Prometheus gives its scrape target) */
static void job_sample(sl_buf *b, const char *name, const char *job, double v)
{
    sl_buf_printf(b, "%s{job_id=\"", name);
    label(b, job);
    sl_buf_printf(b, "\"}");
    num(b, v);
}

typedef struct site_count {
    char site[CERT_SITE_MAX + 1];
    uint64_t n[3];
} site_count;

typedef struct dev_ctx {
    coord *c;
    int64_t now;
    site_count *sites;
    int nsites;
    sl_buf ages;
} dev_ctx;

static int dev_one(void *ud, const coord_device *d)
{
    dev_ctx *x = ud;
    int64_t stale = 3 * (int64_t)x->c->o.heartbeat_ms / 1000 + 1;
    int st = d->revoked ? 2 : d->last_heartbeat && x->now - d->last_heartbeat <= stale ? 0 : 1;
    int k = 0;
    while (k < x->nsites && strcmp(x->sites[k].site, d->site))
        k++;
    if (k == x->nsites) {
        x->sites = sl_xrealloc(x->sites, (size_t)(k + 1) * sizeof *x->sites);
        memset(&x->sites[k], 0, sizeof x->sites[k]);
        snprintf(x->sites[k].site, sizeof x->sites[k].site, "%s", d->site);
        x->nsites++;
    }
    x->sites[k].n[st]++;
    if (d->last_heartbeat) {
        sl_buf_printf(&x->ages, "skyloom_device_heartbeat_age_seconds{device=\"");
        label(&x->ages, d->id);
        sl_buf_printf(&x->ages, "\",site=\"");
        label(&x->ages, d->site);
        sl_buf_printf(&x->ages, "\"}");
        int64_t age = x->now - d->last_heartbeat;
        num(&x->ages, (double)(age > 0 ? age : 0));
    }
    return 0;
}

int coord_metrics_text(coord *c, coord_state *db, const coord_snapshot *s, sl_buf *b, sl_err *err)
{
    dev_ctx dx = {.c = c, .now = s->now};
    if (coord_state_list_devices(db, dev_one, &dx, err)) {
        free(dx.sites);
        free(dx.ages.s);
        return -1;
    }
    family(b, "skyloom_build_info", "gauge", "The coordinator's version (always 1).");
    sl_buf_printf(b, "skyloom_build_info{version=\"%s\"} 1\n", SKYLOOM_VERSION);

    family(b, "skyloom_devices", "gauge", "Enrolled devices by site and state.");
    for (int k = 0; k < dx.nsites; k++)
        for (int st = 0; st < 3; st++) {
            sl_buf_printf(b, "skyloom_devices{site=\"");
            label(b, dx.sites[k].site);
            sl_buf_printf(b, "\",state=\"%s\"} %" PRIu64 "\n", dev_states[st], dx.sites[k].n[st]);
        }
    family(b, "skyloom_device_heartbeat_age_seconds", "gauge",
           "Seconds since the device's last heartbeat (whole seconds).");
    if (dx.ages.s)
        sl_buf_printf(b, "%s", dx.ages.s);
    free(dx.sites);
    free(dx.ages.s);
    family(b, "skyloom_device_threads", "gauge",
           "Compute threads a device trains with, as its heartbeats say.");
    for (int i = 0; i < s->ndev; i++) {
        sl_buf_printf(b, "skyloom_device_threads{device=\"");
        label(b, s->dev[i].id);
        sl_buf_printf(b, "\",backend=\"");
        label(b, s->dev[i].backend[0] ? s->dev[i].backend : "unknown");
        sl_buf_printf(b, "\"} %u\n", s->dev[i].threads);
    }

    uint64_t ok, refused[COORD_ENROLL_NREASONS];
    coord_enroll_counts(c, &ok, refused);
    family(b, "skyloom_enrollments_total", "counter", "Devices enrolled since the coordinator started.");
    sl_buf_printf(b, "skyloom_enrollments_total %" PRIu64 "\n", ok);
    family(b, "skyloom_enrollment_refusals_total", "counter",
           "Enrollments refused since the coordinator started, by reason.");
    for (int i = 0; i < COORD_ENROLL_NREASONS; i++)
        sl_buf_printf(b, "skyloom_enrollment_refusals_total{reason=\"%s\"} %" PRIu64 "\n",
                         coord_enroll_reason_name(i), refused[i]);

    family(b, "skyloom_frames_refused_total", "counter",
           "Frames the devices refused on their links since the coordinator started, by reason.");
    for (int i = 0; i < s->nrefused; i++) {
        sl_buf_printf(b, "skyloom_frames_refused_total{reason=\"");
        label(b, s->refused[i].name);
        sl_buf_printf(b, "\"} %" PRIu64 "\n", s->refused[i].value);
    }

    family(b, "skyloom_calls_refused_total", "counter",
           "Calls about jobs refused since the coordinator started, by reason: a device in no "
           "role of the job, a failure report naming a device that is not the reporter's "
           "neighbour, a checkpoint part not the uploader's, a piece past a quota, a checkpoint "
           "file of units the device does not run.");
    for (int i = 0; i < COORD_DENY_N; i++)
        sl_buf_printf(b, "skyloom_calls_refused_total{reason=\"%s\"} %" PRIu64 "\n",
                      coord_denial_name(i), s->denied[i]);

    family(b, "skyloom_jobs", "gauge", "Jobs by state.");
    for (size_t k = 0; k < sizeof job_states / sizeof *job_states; k++) {
        int n = 0;
        for (int i = 0; i < s->njob; i++)
            n += !strcmp(s->job[i].state, job_states[k]);
        sl_buf_printf(b, "skyloom_jobs{state=\"%s\"} %d\n", job_states[k], n);
    }
    static const struct {
        const char *name, *help;
    } gauges[] = {
        {"skyloom_job_steps", "The steps a job trains for."},
        {"skyloom_job_step", "The last step every stage of a job reported."},
        {"skyloom_job_committed_step", "The step of a job's committed checkpoint."},
        {"skyloom_job_epoch", "The plan epoch a job runs (a new plan is a new epoch)."},
        {"skyloom_job_loss", "The masked-LM loss of a job's last step."},
        {"skyloom_job_tokens_per_second", "Tokens a job trained per second in its last step."},
        {"skyloom_job_step_duration_seconds", "Wall time of a job's last step (its slowest stage)."},
    };
    for (size_t g = 0; g < sizeof gauges / sizeof *gauges; g++) {
        family(b, gauges[g].name, "gauge", gauges[g].help);
        for (int i = 0; i < s->njob; i++) {
            const coord_obs_job *j = &s->job[i];
            double v = g == 0 ? j->steps : g == 1 ? j->step : g == 2 ? j->committed
                     : g == 3 ? j->epoch : g == 4 ? j->loss : g == 5 ? j->tokens_s : j->step_s;
            job_sample(b, gauges[g].name, j->id, v);
        }
    }

    family(b, "skyloom_job_stage_steps_total", "counter", "Steps a stage of a job reported.");
    for (int i = 0; i < s->njob; i++)
        for (int k = 0; k < s->job[i].nstage; k++) {
            const coord_obs_stage *x = &s->job[i].stage[k];
            sl_buf_printf(b, "skyloom_job_stage_steps_total{job_id=\"%s\",stage=\"%d\",device=\"",
                             s->job[i].id, x->stage);
            label(b, x->device);
            sl_buf_printf(b, "\"} %" PRIu64 "\n", (uint64_t)x->steps);
        }
    family(b, "skyloom_job_stage_seconds_total", "counter",
           "Time a stage of a job spent, by activity: busy (forward and backward), send and recv "
           "(in link calls, waiting for a neighbour included), sync (gradient norm, tied "
           "embeddings, optimizer) and idle (the rest of each step).");
    for (int i = 0; i < s->njob; i++)
        for (int k = 0; k < s->job[i].nstage; k++) {
            const coord_obs_stage *x = &s->job[i].stage[k];
            const double v[5] = {x->busy_s, x->send_s, x->recv_s, x->sync_s, x->idle_s};
            static const char *const act[5] = {"busy", "send", "recv", "sync", "idle"};
            for (int a = 0; a < 5; a++) {
                sl_buf_printf(b, "skyloom_job_stage_seconds_total{job_id=\"%s\",stage=\"%d\","
                                 "device=\"", s->job[i].id, x->stage);
                label(b, x->device);
                sl_buf_printf(b, "\",activity=\"%s\"}", act[a]);
                num(b, v[a]);
            }
        }
    family(b, "skyloom_job_link_bytes_total", "counter",
           "Bytes one stage of a job sent another: raw (before the codec) and wire (as frames).");
    for (int i = 0; i < s->njob; i++)
        for (int k = 0; k < s->job[i].nlink; k++) {
            const coord_obs_link *l = &s->job[i].link[k];
            for (int w = 0; w < 2; w++)
                sl_buf_printf(b, "skyloom_job_link_bytes_total{job_id=\"%s\",from_stage=\"%d\","
                                 "to_stage=\"%d\",encoding=\"%s\"} %" PRIu64 "\n", s->job[i].id,
                                 l->from, l->to, w ? "wire" : "raw", w ? l->wire : l->raw);
        }
    family(b, "skyloom_job_sync_bytes_total", "counter",
           "Bytes the stages of a replica (a data owner's pipeline) of a federated job sent the "
           "other replicas for the sync: raw (the payloads) and wire (as frames).");
    for (int i = 0; i < s->njob; i++)
        for (int r = 0; r < s->job[i].nrep; r++)
            for (int w = 0; w < 2; w++)
                sl_buf_printf(b, "skyloom_job_sync_bytes_total{job_id=\"%s\",replica=\"%d\","
                                 "encoding=\"%s\"} %" PRIu64 "\n", s->job[i].id, r,
                                 w ? "wire" : "raw", w ? s->job[i].rep[r].sync_wire
                                                       : s->job[i].rep[r].sync_raw);
    family(b, "skyloom_job_checkpoint_upload_bytes_total", "counter",
           "Checkpoint bytes the devices of a job uploaded to the coordinator.");
    for (int i = 0; i < s->njob; i++)
        job_sample(b, "skyloom_job_checkpoint_upload_bytes_total", s->job[i].id,
                   (double)s->job[i].upload_bytes);
    family(b, "skyloom_job_checkpoint_upload_seconds_total", "counter",
           "Seconds from the first uploaded piece of a checkpoint to its commit, over a job's "
           "committed checkpoints.");
    for (int i = 0; i < s->njob; i++)
        job_sample(b, "skyloom_job_checkpoint_upload_seconds_total", s->job[i].id, s->job[i].upload_s);
    family(b, "skyloom_job_devices_lost_total", "counter",
           "Devices a job declared lost (a neighbour's broken link, or no heartbeat) since the "
           "coordinator started.");
    for (int i = 0; i < s->njob; i++)
        job_sample(b, "skyloom_job_devices_lost_total", s->job[i].id, (double)s->job[i].devices_lost);
    family(b, "skyloom_job_recoveries_total", "counter",
           "Times a job left its epoch to run again from its committed step (device lost, a "
           "failure) since the coordinator started.");
    for (int i = 0; i < s->njob; i++)
        job_sample(b, "skyloom_job_recoveries_total", s->job[i].id, (double)s->job[i].recoveries);
    family(b, "skyloom_job_checkpoints_committed_total", "counter",
           "Checkpoints of a job committed since the coordinator started.");
    for (int i = 0; i < s->njob; i++)
        job_sample(b, "skyloom_job_checkpoints_committed_total", s->job[i].id,
                   (double)s->job[i].commits);
    return 0;
}
