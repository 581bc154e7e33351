/* coord_observe.c - a job's figures for /metrics, the dashboard and job
 * trace (coord_observe.h). */
#include "coord_observe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_job.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

#define OBS_STAGES_MAX 256 /* (stage, device) pairs a job keeps figures for */
#define OBS_LINKS_MAX 512
#define OBS_RING 4         /* steps whose traces may be arriving at once */

struct coord_jobobs {
    coord_obs_stage *stage;
    int nstage;
    coord_obs_link *link;
    int nlink;
    uint64_t sync_raw[COORD_OBS_REPLICAS], sync_wire[COORD_OBS_REPLICAS]; /* by replica */
    uint64_t up_bytes, commits;
    double up_s;
    int up_step[COORD_ACC_STEPS];
    double up_t0[COORD_ACC_STEPS];
    coord_obs_trace *slot[OBS_RING]; /* traces of a step, arriving */
    int have[OBS_RING];
    coord_obs_trace *latest;         /* the latest step every stage traced */
};

void coord_jobobs_free(coord_jobobs *o)
{
    if (!o)
        return;
    free(o->stage);
    free(o->link);
    for (int i = 0; i < OBS_RING; i++)
        coord_trace_free(o->slot[i]);
    coord_trace_free(o->latest);
    free(o);
}

coord_jobobs *coord_jobobs_new(void)
{
    coord_jobobs *o = sl_xcalloc(1, sizeof *o);
    for (int i = 0; i < COORD_ACC_STEPS; i++)
        o->up_step[i] = -1;
    return o;
}

/* A duration from a device: 0 unless finite and plausible. */
static double obs_secs(double x) { return isfinite(x) && x > 0 && x < 1e7 ? x : 0; }

static void obs_link_add(coord_jobobs *o, int from, int to, uint64_t raw, uint64_t wire)
{
    if (!raw && !wire)
        return;
    coord_obs_link *l = NULL;
    for (int i = 0; i < o->nlink && !l; i++)
        if (o->link[i].from == from && o->link[i].to == to)
            l = &o->link[i];
    if (!l && o->nlink < OBS_LINKS_MAX) {
        o->link = sl_xrealloc(o->link, (size_t)(o->nlink + 1) * sizeof *o->link);
        l = &o->link[o->nlink++];
        *l = (coord_obs_link){.from = from, .to = to};
    }
    if (l) {
        l->raw += raw;
        l->wire += wire;
    }
}

static coord_obs_trace *obs_trace_new(int p)
{
    coord_obs_trace *t = sl_xcalloc(1, sizeof *t);
    t->p = p;
    t->step_s = sl_xcalloc((size_t)p, sizeof *t->step_s);
    t->device = sl_xcalloc((size_t)p, sizeof *t->device);
    t->nseg = sl_xcalloc((size_t)p, sizeof *t->nseg);
    t->seg = sl_xcalloc((size_t)p, sizeof *t->seg);
    return t;
}

/* A stage's ops as reported: NULL (and the trace ignored) when any is out
 * of range. */
static coord_obs_seg *obs_segs(const Skyloom__V1__ReportStepRequest *r, double step_s)
{
    if (r->n_ops == 0 || r->n_ops > COORD_TRACE_MAX_OPS || step_s <= 0)
        return NULL;
    coord_obs_seg *v = sl_xcalloc(r->n_ops, sizeof *v);
    for (size_t i = 0; i < r->n_ops; i++) {
        const Skyloom__V1__OpSegment *o = r->ops[i];
        double a = o->start_s, b = o->end_s;
        if ((int)o->kind < SKYLOOM__V1__OP_KIND__OP_RECV_ACT ||
            (int)o->kind > SKYLOOM__V1__OP_KIND__OP_OPTIMIZER || o->micro_batch < -1 ||
            o->micro_batch > (1 << 20) || !isfinite(a) || !isfinite(b) || a < 0 || b < a ||
            b > step_s + 1) {
            free(v);
            return NULL;
        }
        v[i] = (coord_obs_seg){(int)o->kind, o->micro_batch, a, b};
    }
    return v;
}

/* An accepted step report: the stage's time, its links' bytes, its ops. */
void coord_jobobs_report(coord_jobobs *o, const Skyloom__V1__ReportStepRequest *r, int p, int epoch,
                         int replica, const char *job)
{
    int i = (int)r->stage;
    coord_obs_stage *s = NULL;
    for (int k = 0; k < o->nstage && !s; k++)
        if (o->stage[k].stage == i && !strcmp(o->stage[k].device, r->device_id))
            s = &o->stage[k];
    if (!s && o->nstage < OBS_STAGES_MAX) {
        o->stage = sl_xrealloc(o->stage, (size_t)(o->nstage + 1) * sizeof *o->stage);
        s = &o->stage[o->nstage++];
        memset(s, 0, sizeof *s);
        s->stage = i;
        snprintf(s->device, sizeof s->device, "%s", r->device_id);
    }
    double busy = obs_secs(r->fwd_s) + obs_secs(r->bwd_s), send = obs_secs(r->send_s),
           recv = obs_secs(r->recv_s), sync = obs_secs(r->finish_s), step = obs_secs(r->step_s);
    if (s) {
        s->steps++;
        s->busy_s += busy;
        s->send_s += send;
        s->recv_s += recv;
        s->sync_s += sync;
        double idle = step - busy - send - recv - sync;
        s->idle_s += idle > 0 ? idle : 0;
    }
    if (i + 1 < p)
        obs_link_add(o, i, i + 1, r->raw_bytes, r->wire_bytes);
    if (i > 0)
        obs_link_add(o, i, i - 1, r->raw_bytes_up, r->wire_bytes_up);
    if (p > 2 && (i == 0 || i == p - 1))
        obs_link_add(o, i, i == 0 ? p - 1 : 0, r->raw_bytes_side, r->wire_bytes_side);
    if (replica >= 0 && replica < COORD_OBS_REPLICAS) {
        o->sync_raw[replica] = sl_add_sat_u64(o->sync_raw[replica], r->raw_bytes_sync);
        o->sync_wire[replica] = sl_add_sat_u64(o->sync_wire[replica], r->wire_bytes_sync);
    }
    coord_obs_seg *seg = obs_segs(r, step);
    if (!seg) {
        if (r->n_ops)
            sl_log_debug("coordinator: a step's ops ignored (out of range)", "job=%s device=%s "
                         "step=%u ops=%zu", job, r->device_id, r->step, r->n_ops);
        return;
    }
    int k = (int)(r->step % OBS_RING);
    coord_obs_trace *t = o->slot[k];
    if (!t || t->step != (int)r->step || t->epoch != epoch || t->p != p) {
        coord_trace_free(t);
        t = o->slot[k] = obs_trace_new(p);
        t->step = (int)r->step;
        t->epoch = epoch;
        o->have[k] = 0;
    }
    o->have[k] += t->seg[i] == NULL;
    free(t->seg[i]);
    t->seg[i] = seg;
    t->nseg[i] = (int)r->n_ops;
    t->step_s[i] = step;
    snprintf(t->device[i], sizeof t->device[i], "%s", r->device_id);
    if (o->have[k] == p && (!o->latest || o->latest->epoch < t->epoch ||
                            (o->latest->epoch == t->epoch && o->latest->step < t->step))) {
        coord_trace_free(o->latest);
        o->latest = t;
        o->slot[k] = NULL;
    }
}

void coord_obs_refused_add(coord_obs_count *refused, int *nrefused, const Skyloom__V1__ReportStepRequest *r)
{
    for (size_t n = 0; n < r->n_frames_refused && n < 64; n++) {
        const char *name = r->frames_refused[n]->name;
        uint64_t v = r->frames_refused[n]->value;
        size_t len = strlen(name);
        int ok = len >= 1 && len <= 32 && v > 0;
        for (size_t c = 0; ok && c < len; c++)
            ok = (name[c] >= 'a' && name[c] <= 'z') || (name[c] >= '0' && name[c] <= '9') ||
                 name[c] == '_';
        if (!ok)
            continue;
        coord_obs_count *e = NULL;
        for (int k = 0; k < *nrefused && !e; k++)
            if (!strcmp(refused[k].name, name))
                e = &refused[k];
        if (!e && *nrefused < COORD_OBS_NAMES) {
            e = &refused[(*nrefused)++];
            snprintf(e->name, sizeof e->name, "%s", name);
            e->value = 0;
        }
        if (e)
            e->value = sl_add_sat_u64(e->value, v);
    }
}

void coord_jobobs_upload(coord_jobobs *o, int step, size_t bytes)
{
    o->up_bytes += bytes;
    int k = step % COORD_ACC_STEPS;
    if (o->up_step[k] != step) {
        o->up_step[k] = step;
        o->up_t0[k] = sl_now_s();
    }
}

void coord_jobobs_commit(coord_jobobs *o, int step)
{
    int k = step % COORD_ACC_STEPS;
    o->commits++;
    if (o->up_step[k] == step) {
        o->up_s += sl_now_s() - o->up_t0[k];
        o->up_step[k] = -1;
    }
}

char *coord_jobobs_trace_text(const coord_jobobs *o, const char *job)
{
    char *t = o && o->latest ? coord_trace_json(job, o->latest) : NULL;
    return t ? t : sl_xstrdup("");
}

static coord_obs_trace *obs_trace_copy(const coord_obs_trace *t)
{
    if (!t)
        return NULL;
    coord_obs_trace *c = obs_trace_new(t->p);
    c->step = t->step;
    c->epoch = t->epoch;
    for (int i = 0; i < t->p; i++) {
        c->step_s[i] = t->step_s[i];
        memcpy(c->device[i], t->device[i], sizeof c->device[i]);
        c->nseg[i] = t->nseg[i];
        c->seg[i] = sl_xmalloc((size_t)(t->nseg[i] + 1) * sizeof **c->seg);
        if (t->nseg[i])
            memcpy(c->seg[i], t->seg[i], (size_t)t->nseg[i] * sizeof **c->seg);
    }
    return c;
}

void coord_jobobs_fill(const coord_jobobs *o, int detail, coord_obs_job *x)
{
    if (o) {
        x->nstage = o->nstage;
        x->stage = sl_xmalloc((size_t)(o->nstage + 1) * sizeof *x->stage);
        if (o->nstage)
            memcpy(x->stage, o->stage, (size_t)o->nstage * sizeof *x->stage);
        x->nlink = o->nlink;
        x->link = sl_xmalloc((size_t)(o->nlink + 1) * sizeof *x->link);
        if (o->nlink)
            memcpy(x->link, o->link, (size_t)o->nlink * sizeof *x->link);
        x->upload_bytes = o->up_bytes;
        x->upload_s = o->up_s;
        x->commits = o->commits;
        for (int r = 0; r < x->nrep && r < COORD_OBS_REPLICAS; r++) {
            x->rep[r].sync_raw = o->sync_raw[r];
            x->rep[r].sync_wire = o->sync_wire[r];
        }
    }
    if (detail)
        x->trace = o ? obs_trace_copy(o->latest) : NULL;
}
