/* coord_job.c - a job's state machine (coord_job.h). No I/O, no clock, no
 * lock: every function takes the time and appends effects. */
#include "coord_job.h"

#include "coord_links.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_log.h"
#include "sl_mem.h"

/* ---- states and transitions -------------------------------------------------------- */

static const char *const state_names[COORD_JOB_NSTATES] = {
    "checking", "profiling", "planning", "running", "recovering", "waiting", "done", "failed",
    "stopped",
};

#define B(s) (1u << COORD_JOB_##s)
/* The transitions the rules make: to = allowed[from]. Every state before
 * an end may be stopped; running again from running is a joiner's plan;
 * only the operator's resume leaves an end. */
static const unsigned allowed[COORD_JOB_NSTATES] = {
    [COORD_JOB_CHECKING] = B(PROFILING) | B(FAILED) | B(STOPPED),
    [COORD_JOB_PROFILING] = B(PLANNING) | B(STOPPED),
    [COORD_JOB_PLANNING] = B(RUNNING) | B(FAILED) | B(WAITING) | B(STOPPED),
    [COORD_JOB_RUNNING] = B(RUNNING) | B(RECOVERING) | B(WAITING) | B(FAILED) | B(DONE) | B(STOPPED),
    [COORD_JOB_RECOVERING] = B(PLANNING) | B(WAITING) | B(STOPPED),
    [COORD_JOB_WAITING] = B(RECOVERING) | B(STOPPED),
    [COORD_JOB_DONE] = 0,
    [COORD_JOB_FAILED] = B(RECOVERING), /* resumed */
    [COORD_JOB_STOPPED] = B(RECOVERING),
};
#undef B

const char *coord_job_state_name(coord_job_state s)
{
    return s >= 0 && s < COORD_JOB_NSTATES ? state_names[s] : "?";
}

int coord_job_state_parse(const char *s)
{
    for (int i = 0; i < COORD_JOB_NSTATES; i++)
        if (!strcmp(s, state_names[i]))
            return i;
    return -1;
}

int coord_job_state_final(coord_job_state s)
{
    return s == COORD_JOB_DONE || s == COORD_JOB_FAILED || s == COORD_JOB_STOPPED;
}

int coord_job_transition_ok(coord_job_state from, coord_job_state to)
{
    return from >= 0 && from < COORD_JOB_NSTATES && to >= 0 && to < COORD_JOB_NSTATES &&
           (allowed[from] >> to & 1u);
}

coord_job_policy coord_job_policy_default(void)
{
    return (coord_job_policy){.links_wait_s = 60, .profile_wait_s = 60, .check_wait_s = 120,
                              .ended_task_s = 600, .decide_ms = 1500, .max_stalls = 3,
                              .store_retry_ms = 10000, .wait_retry_ms = 5000};
}

/* ---- devices ------------------------------------------------------------------------- */

const coord_dev *coord_devs_find(const coord_devs *d, const char *id)
{
    for (int i = 0; d && i < d->n; i++)
        if (!strcmp(d->v[i].id, id))
            return &d->v[i];
    return NULL;
}

int coord_dev_online(const coord_devs *d, const coord_dev *x, int64_t now_s)
{
    return x && !x->revoked && x->seen && now_s - x->seen <= 3 * (int64_t)d->heartbeat_ms / 1000 + 1;
}

/* ---- effects ---------------------------------------------------------------------------- */

void coord_fx_free(coord_fx *f)
{
    free(f->text);
    free(f->reps);
    f->text = NULL;
    f->reps = NULL;
}

void coord_fx_list_free(coord_fx_list *l)
{
    for (int i = 0; i < l->n; i++)
        coord_fx_free(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

void coord_fx_list_move(coord_fx_list *dst, coord_fx_list *src)
{
    for (int i = 0; i < src->n; i++) {
        if (dst->n == dst->cap) {
            dst->cap = dst->cap ? 2 * dst->cap : 8;
            dst->v = sl_xrealloc(dst->v, (size_t)dst->cap * sizeof *dst->v);
        }
        dst->v[dst->n++] = src->v[i];
    }
    free(src->v);
    memset(src, 0, sizeof *src);
}

/* What an event is applied with. */
typedef struct ev {
    coord_job *jb;
    int64_t now_ms, now;
    coord_fx_list *fx;
    const coord_devs *devs;
} ev;

static ev ev_of(coord_job *jb, int64_t now_ms, coord_fx_list *fx, const coord_devs *devs)
{
    return (ev){jb, now_ms, now_ms / 1000, fx, devs};
}

static coord_fx *fx_push(ev *e, coord_fx_kind kind)
{
    coord_fx_list *l = e->fx;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 8;
        l->v = sl_xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    coord_fx *f = &l->v[l->n++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    return f;
}

static char *vfmt(const char *fmt, va_list ap)
{
    char buf[1200];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return sl_xstrdup(buf);
}

static void logf_(ev *e, int level, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void logf_(ev *e, int level, const char *msg, const char *fmt, ...)
{
    coord_fx *f = fx_push(e, COORD_FX_LOG);
    f->level = level;
    snprintf(f->name, sizeof f->name, "%s", msg);
    va_list ap;
    va_start(ap, fmt);
    f->text = vfmt(fmt, ap);
    va_end(ap);
}

/* Records what recovery decided and did: job status lists these. */
static void event(ev *e, const char *kind, const char *device, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void event(ev *e, const char *kind, const char *device, const char *fmt, ...)
{
    coord_job *jb = e->jb;
    coord_fx *f = fx_push(e, COORD_FX_EVENT);
    snprintf(f->name, sizeof f->name, "%s", kind);
    snprintf(f->device, sizeof f->device, "%s", device ? device : "");
    f->epoch = jb->epoch;
    f->step = jb->step;
    f->committed = jb->committed;
    f->at_ms = e->now_ms > jb->last_event_ms ? e->now_ms : jb->last_event_ms;
    jb->last_event_ms = f->at_ms;
    va_list ap;
    va_start(ap, fmt);
    f->text = vfmt(fmt, ap);
    va_end(ap);
}

static void save(ev *e) { fx_push(e, COORD_FX_SAVE); }

static void set_state(ev *e, coord_job_state to, const char *reason)
{
    coord_job *jb = e->jb;
    if (!coord_job_transition_ok(jb->state, to)) {
        logf_(e, SL_LOG_ERROR, "coordinator: a job transition refused", "job=%s from=%s to=%s",
              jb->id, coord_job_state_name(jb->state), coord_job_state_name(to));
        return;
    }
    jb->state = to;
    snprintf(jb->reason, sizeof jb->reason, "%s", reason ? reason : "");
    if (coord_job_state_final(to))
        jb->ended = e->now;
    coord_fx *f = fx_push(e, COORD_FX_STATE);
    f->state = to;
    f->text = sl_xstrdup(jb->reason);
}

/* ---- candidates ------------------------------------------------------------------------ */

static coord_cand *cand_add(coord_job *jb, const char *d, const char *site)
{
    int k = coord_job_cand_index(jb, d);
    if (k >= 0)
        return &jb->cand[k];
    jb->cand = sl_xrealloc(jb->cand, (size_t)(jb->ncand + 1) * sizeof *jb->cand);
    coord_cand *c = &jb->cand[jb->ncand++];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "%s", d);
    snprintf(c->site, sizeof c->site, "%s", site ? site : "");
    return c;
}

static void cands_free(coord_job *jb)
{
    for (int i = 0; i < jb->ncand; i++) {
        free(jb->cand[i].result);
        free(jb->cand[i].links);
        free(jb->cand[i].measure);
    }
    free(jb->cand);
    jb->cand = NULL;
    jb->ncand = 0;
}

/* ---- which links each candidate measures (coord_links.c) ------------------------------ */

static void assign_links(ev *e)
{
    if (!coord_links_sites_known(e->jb->cand, e->jb->ncand))
        logf_(e, SL_LOG_WARN, "coordinator: every candidate measures every link",
              "job=%s reason=\"the devices' sites are unknown: not enrolled\"", e->jb->id);
    coord_links_assign(e->jb->cand, e->jb->ncand);
}

static void assign_joiner_links(ev *e, int k)
{
    if (!coord_links_sites_known(e->jb->cand, e->jb->ncand))
        logf_(e, SL_LOG_WARN, "coordinator: every candidate measures every link",
              "job=%s reason=\"the devices' sites are unknown: not enrolled\"", e->jb->id);
    coord_links_assign_joiner(e->jb->cand, e->jb->ncand, k);
}

/* ---- making, reading back and ending a job ---------------------------------------------- */

static void acc_clear(coord_job *jb)
{
    for (int i = 0; i < COORD_ACC_STEPS; i++) {
        jb->acc_step[i] = -1;
        jb->acc_done[i] = 0;
        jb->up_step[i] = -1;
        jb->up_ready[i] = 0;
    }
}

void coord_job_init(coord_job *jb, const char *id, uint64_t num, char *config,
                    const coord_jobopts *opts, const coord_owner *owners, int nowner,
                    int64_t now_ms)
{
    memset(jb, 0, sizeof *jb);
    snprintf(jb->id, sizeof jb->id, "%s", id);
    jb->num = num;
    jb->state = COORD_JOB_CHECKING;
    jb->config = config;
    coord_jobopts_copy(&jb->opts, opts);
    jb->nowner = nowner < 1 ? 1 : nowner > COORD_MAX_OWNERS ? COORD_MAX_OWNERS : nowner;
    for (int i = 0; i < jb->nowner && i < nowner; i++) {
        jb->owner[i] = owners[i];
        jb->owner[i].data_info = NULL;
    }
    jb->steps = opts->steps;
    jb->batch = opts->batch;
    jb->created = jb->check_since = now_ms / 1000;
    jb->policy = coord_job_policy_default();
    acc_clear(jb);
}

static void plan_free(coord_job_plan *p)
{
    free(p->text);
    free(p->sig);
    free(p->stage_dev);
    free(p->first_unit);
    free(p->last_unit);
    memset(p, 0, sizeof *p);
}

void coord_job_free(coord_job *jb)
{
    if (!jb)
        return;
    free(jb->config);
    coord_jobopts_free(&jb->opts);
    for (int i = 0; i < jb->nowner; i++)
        free(jb->owner[i].data_info);
    plan_free(&jb->plan);
    cands_free(jb);
    free(jb->acc);
    free(jb->last);
    memset(jb, 0, sizeof *jb);
}

void coord_job_set_plan(coord_job *jb, coord_job_plan *pl)
{
    plan_free(&jb->plan);
    jb->plan = *pl;
    memset(pl, 0, sizeof *pl);
    jb->seq = jb->plan.seq;
    free(jb->last);
    jb->last = NULL;
    free(jb->acc);
    jb->acc = sl_xcalloc((size_t)COORD_ACC_STEPS * (size_t)jb->plan.p + 1, sizeof *jb->acc);
    for (int i = 0; i < COORD_ACC_STEPS; i++) {
        jb->acc_step[i] = -1;
        jb->acc_done[i] = 0;
    }
}

void coord_job_restarted(coord_job *jb, double loss, int64_t now_ms, coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, NULL);
    jb->check_since = e.now;
    /* checked (its data described) but not planned: profiled again, once
     * the devices had time to come back */
    if (!jb->plan.text && (jb->state == COORD_JOB_PLANNING || jb->state == COORD_JOB_PROFILING))
        jb->state = COORD_JOB_CHECKING;
    if (coord_job_state_final(jb->state) || !jb->plan.text || jb->state == COORD_JOB_CHECKING)
        return;
    /* a job that had a plan goes on from its committed step in a new epoch,
     * once the plan's devices are back */
    jb->loss = loss;
    jb->step = jb->committed;
    jb->rec.restarted = 1;
    jb->rec.detect_ms = jb->rec.wait_ms = now_ms;
    event(&e, "coordinator_restarted", "", "was %s; going on from step %d",
          coord_job_state_name(jb->state), jb->committed + 1);
    jb->state = COORD_JOB_RECOVERING;
    snprintf(jb->reason, sizeof jb->reason, "the coordinator restarted; waiting for the plan's devices");
}

int coord_job_stop(coord_job *jb, int64_t now_ms, coord_fx_list *fx)
{
    if (coord_job_state_final(jb->state))
        return -1;
    ev e = ev_of(jb, now_ms, fx, NULL);
    set_state(&e, COORD_JOB_STOPPED, "stopped by the operator");
    return 0;
}

int coord_job_stop_at_commit(coord_job *jb, int64_t now_ms, coord_fx_list *fx)
{
    if (coord_job_state_final(jb->state))
        return -1;
    ev e = ev_of(jb, now_ms, fx, NULL);
    if (!jb->stop_at_commit)
        event(&e, "stop_requested", "", "stops at its next commit (step %d is committed)",
              jb->committed);
    jb->stop_at_commit = 1;
    save(&e);
    return 0;
}

static void fail_reset(coord_job *jb);

int coord_job_resume(coord_job *jb, int64_t now_ms, char *why, size_t cap, coord_fx_list *fx)
{
    if (jb->state != COORD_JOB_STOPPED && jb->state != COORD_JOB_FAILED) {
        snprintf(why, cap, "job %s is %s: only a stopped or failed job resumes", jb->id,
                 coord_job_state_name(jb->state));
        return -1;
    }
    if (!jb->plan.text) {
        snprintf(why, cap, "job %s %s before it was planned: there is nothing to resume "
                 "(submit it again)", jb->id, coord_job_state_name(jb->state));
        return -1;
    }
    ev e = ev_of(jb, now_ms, fx, NULL);
    for (int i = 0; i < jb->ncand; i++) {
        jb->cand[i].lost_ms = 0;
        jb->cand[i].joining = 0;
    }
    fail_reset(jb);
    jb->stop_at_commit = 0;
    jb->ended = 0;
    jb->step = jb->committed;
    memset(&jb->rec, 0, offsetof(coord_job_recovery, n_lost));
    jb->rec.detect_ms = jb->rec.wait_ms = now_ms;
    event(&e, "resume", "", "resumed by the operator (it was %s); going on from step %d",
          coord_job_state_name(jb->state), jb->committed + 1);
    set_state(&e, COORD_JOB_RECOVERING, "resumed by the operator; re-planning");
    return 0;
}

/* ---- checking and profiling ------------------------------------------------------------- */

static void start_profiling(ev *e)
{
    coord_job *jb = e->jb;
    cands_free(jb);
    /* the data owners first, in order: the balancer's chains start with
     * their first device */
    for (int o = 0; o < jb->nowner; o++) {
        const coord_dev *d = coord_devs_find(e->devs, jb->owner[o].id);
        if (d && coord_dev_online(e->devs, d, e->now) && d->address[0] && d->has_key)
            cand_add(jb, d->id, d->site);
    }
    for (int i = 0; e->devs && i < e->devs->n; i++) {
        const coord_dev *d = &e->devs->v[i];
        if (coord_job_owner_index(jb, d->id) < 0 && coord_jobopts_allows(&jb->opts, "", d->id) &&
            coord_dev_online(e->devs, d, e->now) && d->address[0] && d->has_key)
            cand_add(jb, d->id, d->site);
    }
    assign_links(e);
    jb->started = e->now;
    jb->profile_round = COORD_PROFILE_LINKS;
    jb->round_started = e->now;
    set_state(e, COORD_JOB_PROFILING, NULL);
}

void coord_job_check_done(coord_job *jb, const char *device, int ok, const char *reason,
                          const char *info, int seq, int settled, const coord_devs *devs,
                          int64_t now_ms, coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, devs);
    int o = coord_job_owner_index(jb, device);
    if (jb->state != COORD_JOB_CHECKING || o < 0 || jb->owner[o].data_info)
        return;
    coord_owner *ow = &jb->owner[o];
    char why[700];
    if (!ok) {
        snprintf(why, sizeof why, "the data owner %s refused %s: %.400s", ow->id, ow->dataset,
                 reason ? reason : "");
        set_state(&e, COORD_JOB_FAILED, why);
        return;
    }
    if (!info || seq < 1 || seq > 65536) {
        snprintf(why, sizeof why, "the data owner %s sent no usable shard description", ow->id);
        set_state(&e, COORD_JOB_FAILED, why);
        return;
    }
    /* one model over every owner's data: one sequence length */
    for (int i = 0; i < jb->nowner; i++)
        if (i != o && jb->owner[i].data_info && seq != jb->seq) {
            snprintf(why, sizeof why, "the data owners' shards differ: %s's %s has sequences of %d "
                     "tokens, %s's %s of %d", jb->owner[i].id, jb->owner[i].dataset, jb->seq,
                     ow->id, ow->dataset, seq);
            set_state(&e, COORD_JOB_FAILED, why);
            return;
        }
    ow->data_info = sl_xstrdup(info);
    jb->seq = seq;
    if (settled && coord_job_checked(jb))
        start_profiling(&e);
}

void coord_job_check_unfit(coord_job *jb, const char *device, const char *why, int64_t now_ms,
                           coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, NULL);
    int o = coord_job_owner_index(jb, device);
    if (jb->state != COORD_JOB_CHECKING || o < 0 || jb->owner[o].data_info)
        return;
    set_state(&e, COORD_JOB_FAILED, why);
}

void coord_job_profile_in(coord_job *jb, const char *device, int round, const char *result,
                          const char *links, int failed, coord_fx_list *fx)
{
    ev e = ev_of(jb, 0, fx, NULL);
    int k = coord_job_cand_index(jb, device);
    if (k < 0 || jb->cand[k].result ||
        (jb->state != COORD_JOB_PROFILING && !(jb->cand[k].joining && !coord_job_state_final(jb->state))))
        return;
    coord_cand *c = &jb->cand[k];
    /* the first round of profiling: its links, kept for the second */
    if (round == COORD_PROFILE_LINKS) {
        if (!c->links && jb->state == COORD_JOB_PROFILING)
            c->links = sl_xstrdup(links ? links : "[]");
        return;
    }
    c->result = sl_xstrdup(result);
    c->failed = failed;
    if (c->joining)
        logf_(&e, SL_LOG_INFO, "coordinator: joining device profiled", "job=%s device=%s", jb->id,
              device);
    coord_fx *f = fx_push(&e, COORD_FX_PROFILE);
    snprintf(f->device, sizeof f->device, "%s", device);
    f->text = sl_xstrdup(result);
}

/* ---- the running epoch ----------------------------------------------------------------- */

static void fail_reset(coord_job *jb)
{
    jb->rec.fail_ms = 0;
    jb->rec.fail_why[0] = 0;
    jb->rec.fail_primary = 0;
    for (int i = 0; i < jb->ncand; i++)
        jb->cand[i].suspect = jb->cand[i].reported = 0;
}

/* The running epoch is over: every device leaves it (the step in flight is
 * applied nowhere) and the job is planned again from the committed step. */
static void recover(ev *e, const char *why)
{
    coord_job *jb = e->jb;
    fail_reset(jb);
    jb->rec.detect_ms = jb->rec.wait_ms = e->now_ms;
    jb->rec.wait_kind = COORD_WAIT_NONE;
    jb->rec.n_recoveries++;
    if (++jb->rec.stalls > jb->policy.max_stalls) {
        char m[700];
        snprintf(m, sizeof m, "%d recoveries without a step committed in between; the last: %.500s",
                 jb->policy.max_stalls, why);
        event(e, "failed", "", "%s", m);
        set_state(e, COORD_JOB_FAILED, m);
        return;
    }
    event(e, "recovering", "", "%s", why);
    set_state(e, COORD_JOB_RECOVERING, why);
}

/* Commits the earliest step whose parts are all in and every stage reported,
 * one at a time (so that a committed step always has its metrics row). */
static void issue_commits(ev *e)
{
    coord_job *jb = e->jb;
    if (jb->committing || jb->state != COORD_JOB_RUNNING)
        return;
    int best = -1;
    for (int k = 0; k < COORD_ACC_STEPS; k++)
        if (jb->up_ready[k] && jb->up_step[k] <= jb->step && (best < 0 || jb->up_step[k] < jb->up_step[best]))
            best = k;
    if (best < 0)
        return;
    jb->up_ready[best] = 0;
    jb->committing = jb->up_step[best];
    coord_fx *f = fx_push(e, COORD_FX_COMMIT);
    f->step = jb->committing;
    f->epoch = jb->epoch;
}

/* A step all stages reported: its metrics row and the status figures. */
static void step_complete(ev *e, int step, const coord_step_rep *rep)
{
    coord_job *jb = e->jb;
    int p = jb->plan.p;
    double step_s = 0;
    for (int i = 0; i < p; i++)
        step_s = rep[i].step_s > step_s ? rep[i].step_s : step_s;
    jb->step = step;
    jb->loss = coord_job_step_loss(jb, rep);
    jb->tokens_s = step_s > 0 ? (double)jb->batch * jb->seq / step_s : 0;
    coord_fx *f = fx_push(e, COORD_FX_METRICS);
    f->step = step;
    f->epoch = jb->epoch;
    f->p = p;
    f->reps = sl_xmalloc((size_t)p * sizeof *f->reps);
    memcpy(f->reps, rep, (size_t)p * sizeof *f->reps);
    f->tokens_s = jb->tokens_s;
    f->step_s = step_s;
    f->loss = jb->loss;
    f->nrep = jb->plan.nrep;
    memcpy(f->rep_first, jb->plan.rep_first, sizeof f->rep_first);
    for (int r = 0; r < (jb->plan.nrep ? jb->plan.nrep : 1); r++)
        if (!jb->plan.nrep || !jb->plan.away[r])
            f->masked += rep[(jb->plan.nrep ? jb->plan.rep_first[r + 1] : p) - 1].masked;
    if (!jb->last)
        jb->last = sl_xmalloc((size_t)p * sizeof *jb->last);
    memcpy(jb->last, rep, (size_t)p * sizeof *jb->last);
    jb->last_step = step;
    jb->last_step_s = step_s;
}

/* Takes the steps all stages reported, in order (a device's reports may
 * overtake another's), and commits a step whose parts were waiting for it. */
static void steps_complete(ev *e)
{
    coord_job *jb = e->jb;
    while (jb->state == COORD_JOB_RUNNING) {
        int s = jb->step + 1, k = s % COORD_ACC_STEPS;
        if (jb->acc_step[k] != s || !jb->acc_done[k])
            break;
        step_complete(e, s, jb->acc + (size_t)k * jb->plan.p);
        jb->acc_step[k] = -1;
        jb->acc_done[k] = 0;
        if (jb->rec.detect_ms) {
            event(e, "resumed", "", "step %d completed %.2f s after the failure was detected", s,
                  (double)(e->now_ms - jb->rec.detect_ms) / 1000);
            jb->rec.detect_ms = 0;
        }
        if (s % 10 == 0 || s == jb->steps)
            save(e);
        issue_commits(e);
    }
}

int coord_job_step_report(coord_job *jb, const char *device, int epoch, int stage, int step,
                          const coord_step_rep *rep, int64_t now_ms, coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, NULL);
    if (jb->state != COORD_JOB_RUNNING || epoch != jb->epoch)
        return COORD_REPORT_STOP;
    if (stage < 0 || stage >= jb->plan.p || strcmp(jb->plan.stage_dev[stage], device) || step < 1 ||
        step > jb->steps)
        return COORD_REPORT_REFUSED;
    if (step <= jb->step)
        return COORD_REPORT_OK; /* a report of a step already taken (sent twice) */
    if (step > jb->step + COORD_ACC_STEPS) {
        /* the reports of step jb->step + 1 cannot all come any more */
        char why[300];
        snprintf(why, sizeof why, "the reports of step %d did not all arrive; running again "
                 "from step %d", jb->step + 1, jb->committed + 1);
        recover(&e, why);
        return COORD_REPORT_OK;
    }
    int slot = step % COORD_ACC_STEPS, p = jb->plan.p;
    coord_step_rep *r = jb->acc + (size_t)slot * p;
    if (jb->acc_step[slot] != step) {
        jb->acc_step[slot] = step;
        jb->acc_done[slot] = 0;
        memset(r, 0, (size_t)p * sizeof *r);
    }
    r[stage] = *rep;
    r[stage].have = 1;
    int all = 1;
    for (int i = 0; i < p; i++)
        all &= r[i].have;
    jb->acc_done[slot] = all;
    steps_complete(&e);
    return COORD_REPORT_TAKEN;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

void coord_job_parts_done(coord_job *jb, int epoch, int step, coord_fx_list *fx)
{
    ev e = ev_of(jb, 0, fx, NULL);
    if (jb->state != COORD_JOB_RUNNING || epoch != jb->epoch || step <= jb->committed)
        return;
    int k = step % COORD_ACC_STEPS;
    jb->up_step[k] = step;
    jb->up_ready[k] = 1;
    issue_commits(&e);
}

/* The checkpoint store refused a write (disk full, an I/O error): the step
 * is not committed, the committed one stays as it is, and the job waits and
 * then runs again from it. */
static void store_failed(ev *e, int step, const char *what)
{
    coord_job *jb = e->jb;
    event(e, "store_failed", "", "step %d: %s", step, what);
    if (jb->state != COORD_JOB_RUNNING)
        return; /* the epoch is over already: it runs again from the committed step anyway */
    int64_t retry = jb->policy.store_retry_ms,
            wait = retry << (jb->rec.store_fails < 5 ? jb->rec.store_fails : 5);
    char why[COORD_REASON_LEN];
    snprintf(why, sizeof why, "the checkpoint store could not take step %d (%.300s); step %d "
             "stays committed; trying again in %g s", step, what, jb->committed, (double)wait / 1000);
    fail_reset(jb);
    jb->rec.store_fails++;
    jb->rec.wait_kind = COORD_WAIT_STORE;
    jb->rec.wait_ms = e->now_ms + (wait - retry);
    set_state(e, COORD_JOB_WAITING, why);
}

void coord_job_store_failed(coord_job *jb, int step, const char *what, int64_t now_ms,
                            coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, NULL);
    store_failed(&e, step, what);
}

void coord_job_commit_done(coord_job *jb, int step, int result, const char *why, int64_t now_ms,
                           coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, NULL);
    if (jb->committing == step)
        jb->committing = 0;
    if (result == COORD_COMMIT_CANCELLED)
        return;
    if (result == COORD_COMMIT_FAILED) {
        logf_(&e, SL_LOG_ERROR, "coordinator: commit failed", "job=%s step=%d reason=\"%s\"",
              jb->id, step, why ? why : "");
        store_failed(&e, step, why ? why : "");
        return;
    }
    jb->committed = step;
    jb->reason[0] = 0;
    jb->rec.stalls = 0;
    jb->rec.store_fails = 0;
    jb->rec.weigh_joiners = 1;
    logf_(&e, SL_LOG_INFO, "coordinator: step committed", "job=%s step=%d", jb->id, step);
    save(&e);
    if (jb->stop_at_commit && jb->state == COORD_JOB_RUNNING) {
        jb->stop_at_commit = 0;
        if (step < jb->steps) {
            char why[200];
            snprintf(why, sizeof why, "stopped by the operator at its commit of step %d", step);
            set_state(&e, COORD_JOB_STOPPED, why);
            return;
        }
    }
    issue_commits(&e);
}

void coord_job_epoch_ready(coord_job *jb, int epoch, double loss, const char *failed,
                           int64_t now_ms, coord_fx_list *fx)
{
    if (epoch != jb->epoch || !jb->epoch_pending)
        return;
    jb->epoch_pending = 0;
    if (failed) {
        ev e = ev_of(jb, now_ms, fx, NULL);
        store_failed(&e, jb->committed + 1, failed);
    } else if (jb->step == jb->committed) {
        jb->loss = loss;
    }
}

/* ---- failures --------------------------------------------------------------------------- */

int coord_job_run_failure(coord_job *jb, const char *device, int epoch, const char *reason,
                          const char *lost, int64_t now_ms, coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, NULL);
    if (jb->state != COORD_JOB_RUNNING || epoch != jb->epoch)
        return 0;
    int k = coord_job_cand_index(jb, device), s = lost && *lost ? coord_job_cand_index(jb, lost) : -1;
    int first = k >= 0 && !jb->cand[k].reported;
    /* a claim about a device it exchanges nothing with is not weighed */
    int refused = lost && *lost && !coord_job_neighbours(jb, device, lost);
    if (refused || s == k)
        s = -1;
    if (k >= 0)
        jb->cand[k].reported = 1;
    if (s >= 0 && first)
        jb->cand[s].suspect++;
    if (!jb->rec.fail_ms)
        jb->rec.fail_ms = now_ms;
    if (!jb->rec.fail_why[0] || (s < 0 && !jb->rec.fail_primary)) {
        snprintf(jb->rec.fail_why, sizeof jb->rec.fail_why, "device %s: %.500s", device, reason);
        jb->rec.fail_primary = s < 0;
    }
    logf_(&e, refused ? SL_LOG_WARN : SL_LOG_INFO, "coordinator: run failure reported",
          "job=%s epoch=%d device=%s suspect=%s%s reason=\"%.300s\"", jb->id, jb->epoch, device,
          s >= 0 ? lost : "-", refused ? " refused_claim=not_a_neighbour" : "", reason);
    return refused ? -1 : 0;
}

/* Declares a candidate lost (once). */
static void mark_lost(ev *e, int k, const char *how)
{
    coord_cand *c = &e->jb->cand[k];
    if (c->lost_ms)
        return;
    c->lost_ms = e->now_ms;
    c->joining = 0;
    e->jb->rec.n_lost++;
    event(e, "lost", c->id, "%s", how);
}

/* A running job: devices whose heartbeats stopped, and the failure reports
 * of the epoch once they are all in (or policy.decide_ms after the first).
 * A device its neighbours named is weighed against what else is known of
 * it: one that reported a failure itself is not lost (its own report says
 * why); one named by two of its neighbours is lost; one named by a single
 * neighbour is lost only when it has not heartbeated since the first report
 * for an interval and a second, and kept if it has (a device cannot make
 * another one lost alone). A heartbeat from before the reports is no proof
 * of life: one sent just before a kill may be handled after them. */
static void check_running(ev *e)
{
    coord_job *jb = e->jb;
    char lost[600] = "";
    for (int i = 0; i < jb->plan.p; i++) {
        int k = coord_job_cand_index(jb, jb->plan.stage_dev[i]);
        const coord_dev *d = coord_devs_find(e->devs, jb->plan.stage_dev[i]);
        if (k < 0 || jb->cand[k].lost_ms || (d && coord_dev_online(e->devs, d, e->now)))
            continue;
        char how[200];
        if (d && d->revoked)
            snprintf(how, sizeof how, "revoked");
        else
            snprintf(how, sizeof how, "no heartbeat for %lld s (3 intervals)",
                     d ? (long long)(e->now - d->seen) : -1LL);
        mark_lost(e, k, how);
        size_t o = strlen(lost);
        snprintf(lost + o, sizeof lost - o, "%s%.40s (%s)", o ? ", " : "", jb->cand[k].id,
                 d && d->revoked ? "revoked" : "no heartbeat");
    }
    if (jb->rec.fail_ms) {
        int all = 1;
        for (int i = 0; i < jb->plan.p; i++) {
            int k = coord_job_cand_index(jb, jb->plan.stage_dev[i]);
            all &= k >= 0 && (jb->cand[k].reported || jb->cand[k].lost_ms);
        }
        if (!lost[0] && !all && e->now_ms - jb->rec.fail_ms < jb->policy.decide_ms)
            return;
        int64_t hb = e->devs ? e->devs->heartbeat_ms : 0, waited = e->now_ms - jb->rec.fail_ms;
        const char *how[2] = {"its neighbours' links to it broke and it reported nothing",
                              "a neighbour's link to it broke, and it has not heartbeated since"};
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < jb->ncand; k++) {
                coord_cand *c = &jb->cand[k];
                if (!c->suspect || c->reported || c->lost_ms || coord_job_stage_of(jb, c->id) < 0)
                    continue;
                const coord_dev *d = coord_devs_find(e->devs, c->id);
                int heard = d && d->seen_ms > jb->rec.fail_ms;
                int verdict = c->suspect >= 2 ? 0 : heard ? -1 : waited >= hb + 1000 ? 1 : -2;
                if (pass == 0 && verdict == -2)
                    return; /* its heartbeat decides: wait for it */
                if (pass == 0 || verdict < 0)
                    continue;
                mark_lost(e, k, how[verdict]);
                size_t o = strlen(lost);
                snprintf(lost + o, sizeof lost - o, "%s%.40s (link broke)", o ? ", " : "", c->id);
            }
    }
    char why[800];
    if (lost[0])
        snprintf(why, sizeof why, "lost %.600s; running again from step %d", lost, jb->committed + 1);
    else if (jb->rec.fail_ms)
        snprintf(why, sizeof why, "%.600s; running again from step %d", jb->rec.fail_why,
                 jb->committed + 1);
    else
        return;
    recover(e, why);
}

/* Devices that came online during the job (enrolled, or back after being
 * lost) are profiled for it; a commit weighs them (COORD_PLAN_JOIN). */
static void find_joiners(ev *e)
{
    coord_job *jb = e->jb;
    for (int i = 0; e->devs && i < e->devs->n; i++) {
        const coord_dev *d = &e->devs->v[i];
        if (!coord_dev_online(e->devs, d, e->now) || !d->address[0] || !d->has_key ||
            coord_job_owner_index(jb, d->id) >= 0 || !coord_jobopts_allows(&jb->opts, "", d->id))
            continue;
        int k = coord_job_cand_index(jb, d->id);
        if (k >= 0 && !(jb->cand[k].lost_ms && d->seen_ms > jb->cand[k].lost_ms))
            continue;
        coord_cand *c = cand_add(jb, d->id, d->site);
        free(c->result);
        c->result = NULL;
        c->failed = 0;
        c->joining = 1;
        event(e, "joining", d->id, "%s; profiling it", c->lost_ms ? "back online" : "online");
        c->lost_ms = 0;
        assign_joiner_links(e, (int)(c - jb->cand));
    }
}

/* The first owner that is not back, or -1 when all are. */
static int owner_missing(ev *e)
{
    coord_job *jb = e->jb;
    for (int o = 0; o < jb->nowner; o++) {
        int k = coord_job_cand_index(jb, jb->owner[o].id);
        const coord_dev *d = coord_devs_find(e->devs, jb->owner[o].id);
        if (!(k >= 0 && d && coord_dev_online(e->devs, d, e->now) &&
              (!jb->cand[k].lost_ms || d->seen_ms > jb->cand[k].lost_ms)))
            return o;
    }
    return -1;
}

/* ---- planning ---------------------------------------------------------------------------- */

/* Owner o is offline, or lost and not heard from since. */
static int owner_gone(ev *e, int o)
{
    coord_job *jb = e->jb;
    int k = coord_job_cand_index(jb, jb->owner[o].id);
    const coord_dev *d = coord_devs_find(e->devs, jb->owner[o].id);
    return !(k >= 0 && d && coord_dev_online(e->devs, d, e->now) &&
             (!jb->cand[k].lost_ms || d->seen_ms > jb->cand[k].lost_ms));
}

/* Replica o has no committed parts of its own at the committed step: its
 * owner went away before it, or rejoins from that very step. */
static int replica_out(const coord_job *jb, int o)
{
    const coord_job_plan *pl = &jb->plan;
    return pl->nrep && ((pl->away[o] && jb->committed > pl->away_since[o]) ||
                        (pl->rejoin[o] && jb->committed == pl->start_step - 1));
}

/* Under outer:H, which owners the next plan leaves out and which rejoin: an
 * owner gone is left out (the others go on); a replica left out comes back
 * only from a committed outer step, where every replica holds the same
 * parameters, so it stays out after any other commit. Under step every
 * replica takes part (the job waits for an owner instead). */
static void plan_owners(ev *e, int mode)
{
    coord_job *jb = e->jb;
    int H = jb->opts.sync_every;
    for (int o = 0; o < COORD_MAX_OWNERS; o++) {
        jb->plan_away[o] = jb->plan_rejoin[o] = 0;
        if (o >= jb->nowner || H <= 0 || jb->nowner < 2 || mode == COORD_PLAN_FIRST)
            continue;
        int out = replica_out(jb, o);
        jb->plan_away[o] = owner_gone(e, o) || (out && jb->committed % H != 0);
        jb->plan_rejoin[o] = !jb->plan_away[o] && out && jb->committed > 0;
        jb->plan_away_since[o] = jb->plan.nrep && jb->plan.away[o] ? jb->plan.away_since[o]
                                 : out ? -1 : jb->committed;
    }
}

static void plan(ev *e, int mode)
{
    coord_job *jb = e->jb;
    jb->planning = mode + 1;
    jb->plan_epoch = jb->epoch;
    jb->plan_committed = jb->committed;
    plan_owners(e, mode);
    if (mode != COORD_PLAN_JOIN)
        set_state(e, COORD_JOB_PLANNING, NULL);
    coord_fx *f = fx_push(e, COORD_FX_PLAN);
    f->mode = mode;
}

/* A new epoch: what the old one left unfinished is dropped (parts of
 * uncommitted steps, their metrics rows, reports in flight); the steps after
 * the committed one are trained again. */
static void epoch_reset(ev *e)
{
    coord_job *jb = e->jb;
    acc_clear(jb);
    jb->step = jb->committed;
    free(jb->last);
    jb->last = NULL;
    jb->last_step = 0;
    jb->last_step_s = 0;
    fail_reset(jb);
    jb->epoch_pending = 1;
    coord_fx *f = fx_push(e, COORD_FX_EPOCH);
    f->epoch = jb->epoch;
    f->committed = jb->committed;
}

/* The joining candidates with a profile, as "a,b". */
static void joiners(const coord_job *jb, char *who, size_t cap)
{
    who[0] = 0;
    for (int i = 0; i < jb->ncand; i++)
        if (jb->cand[i].joining && jb->cand[i].result) {
            size_t o = strlen(who);
            snprintf(who + o, cap - o, "%s%.40s", o ? "," : "", jb->cand[i].id);
        }
}

void coord_job_plan_done(coord_job *jb, int mode, coord_plan_result *r, int64_t now_ms,
                         coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, NULL);
    jb->planning = 0;
    double pred = r->ok ? r->plan.predicted : 0, now_pred = jb->plan.predicted;
    int take = 1;
    if (mode == COORD_PLAN_JOIN) {
        char who[600];
        joiners(jb, who, sizeof who);
        if (jb->state != COORD_JOB_RUNNING || jb->epoch != jb->plan_epoch ||
            jb->committed != jb->plan_committed || jb->committing) {
            take = 0; /* the job moved on meanwhile: weighed again at the next commit */
        } else {
            for (int i = 0; i < jb->ncand; i++)
                if (jb->cand[i].joining && jb->cand[i].result)
                    jb->cand[i].joining = 0;
            double margin = jb->opts.replan_margin;
            if (!r->ok) {
                take = 0;
                event(&e, "weighed", who, "not taken: planning with them failed: %.400s", r->why);
            } else if (pred > (1 - margin) * now_pred) {
                take = 0;
                event(&e, "weighed", who, "not taken: predicted %.4f s per step with them, %.4f s "
                      "now (margin %.0f%%)", pred, now_pred, 100 * margin);
            } else {
                event(&e, "weighed", who, "taken: predicted %.4f s per step with them, %.4f s now",
                      pred, now_pred);
            }
        }
    } else if (jb->state != COORD_JOB_PLANNING) {
        take = 0; /* stopped meanwhile */
    }
    if (!take) {
        plan_free(&r->plan);
        return;
    }
    if (!r->ok) {
        char why[600];
        if (mode == COORD_PLAN_FIRST) {
            snprintf(why, sizeof why, "planning: %.560s", r->why);
            set_state(&e, COORD_JOB_FAILED, why);
        } else {
            snprintf(why, sizeof why, "no plan over the %d devices left (%.400s); waiting for "
                     "devices", r->n_devices, r->why);
            event(&e, "waiting", "", "%s", why);
            jb->rec.wait_kind = COORD_WAIT_DEVICES;
            jb->rec.wait_ms = now_ms;
            set_state(&e, COORD_JOB_WAITING, why);
        }
        return;
    }
    coord_job_set_plan(jb, &r->plan);
    jb->epoch = jb->plan_epoch + 1;
    if (mode != COORD_PLAN_FIRST)
        epoch_reset(&e);
    for (int i = 0; i < jb->ncand; i++) /* weighed by this plan */
        if (jb->cand[i].result)
            jb->cand[i].joining = 0;
    logf_(&e, SL_LOG_INFO, "coordinator: job planned", "job=%s epoch=%d stages=%d devices=%d "
          "predicted_s=%.4f planning_s=%.3f start=%d", jb->id, jb->epoch, jb->plan.p, jb->plan.ndev,
          jb->plan.predicted, r->seconds, r->start_step);
    if (mode != COORD_PLAN_FIRST) {
        char devs[600] = "";
        for (int i = 0; i < jb->plan.p; i++) {
            size_t o = strlen(devs);
            if (i == 0 || strcmp(jb->plan.stage_dev[i], jb->plan.stage_dev[i - 1]))
                snprintf(devs + o, sizeof devs - o, "%s%.40s", o ? "," : "", jb->plan.stage_dev[i]);
        }
        event(&e, "planned", "", "epoch %d: %d stage%s on %s, from step %d, predicted %.4f s per "
              "step, planned in %.3f s", jb->epoch, jb->plan.p, jb->plan.p == 1 ? "" : "s", devs,
              r->start_step, jb->plan.predicted, r->seconds);
    }
    if (r->unmeasured[0]) {
        logf_(&e, SL_LOG_WARN, "coordinator: links not measured", "job=%s pairs=\"%s\"", jb->id,
              r->unmeasured);
        event(&e, "links_assumed", "", "no link measured between the sites %s: planned with the "
              "defaults (inside a site 10 Gbit/s and 0.1 ms, between sites 1 Gbit/s and 50 ms)",
              r->unmeasured);
    }
    set_state(&e, COORD_JOB_RUNNING, NULL);
}

/* ---- the time ----------------------------------------------------------------------------- */

static void tick_profiling(ev *e)
{
    coord_job *jb = e->jb;
    int left = 0, links_left = 0;
    for (int k = 0; k < jb->ncand; k++) {
        left += !jb->cand[k].result;
        links_left += !jb->cand[k].result && !jb->cand[k].links;
    }
    if (jb->profile_round == COORD_PROFILE_LINKS &&
        (links_left == 0 || e->now - jb->round_started > jb->policy.links_wait_s)) {
        jb->profile_round = COORD_PROFILE_UNITS;
        jb->round_started = e->now;
        if (links_left)
            logf_(e, SL_LOG_WARN, "coordinator: timing units before every link was measured",
                  "job=%s unmeasured=%d wait_s=%d", jb->id, links_left, jb->policy.links_wait_s);
    }
    if (left == 0 ||
        (jb->profile_round == COORD_PROFILE_UNITS &&
         e->now - jb->round_started > jb->policy.profile_wait_s))
        plan(e, COORD_PLAN_FIRST);
}

static void tick_running(ev *e)
{
    coord_job *jb = e->jb;
    if (jb->committed >= jb->steps && jb->step >= jb->steps) {
        set_state(e, COORD_JOB_DONE, NULL);
        return;
    }
    check_running(e);
    if (jb->state != COORD_JOB_RUNNING)
        return;
    /* an owner away and back: its replica rejoins from a committed outer step */
    int H = jb->opts.sync_every;
    for (int o = 0; H > 0 && jb->plan.nrep && o < jb->nowner && !jb->committing; o++) {
        if (!jb->plan.away[o] || owner_gone(e, o) ||
            (jb->committed % H != 0 && jb->committed != jb->plan.away_since[o]))
            continue;
        coord_cand *c = &jb->cand[coord_job_cand_index(jb, jb->owner[o].id)];
        c->lost_ms = 0;
        /* nothing committed since it left: it goes on from its own parts */
        if (jb->committed == jb->plan.away_since[o])
            event(e, "returned", c->id, "the data owner is back before a step was committed "
                  "without it; its replica goes on from step %d", jb->committed + 1);
        else
            event(e, "returned", c->id, "the data owner is back; its replica rejoins from the "
                  "committed outer step %d", jb->committed);
        char why[200];
        snprintf(why, sizeof why, "the data owner %.40s is back; re-planning from step %d",
                 c->id, jb->committed + 1);
        recover(e, why);
        return;
    }
    find_joiners(e);
    if (jb->rec.weigh_joiners) {
        jb->rec.weigh_joiners = 0;
        char who[8];
        joiners(jb, who, sizeof who);
        if (who[0])
            plan(e, COORD_PLAN_JOIN);
    }
}

static void tick_recovering(ev *e, int64_t heartbeat_ms)
{
    coord_job *jb = e->jb;
    if (jb->rec.restarted) { /* the devices of the plan get a while to come back */
        int all = 1;
        for (int s = 0; s < jb->plan.p; s++)
            all &= coord_dev_online(e->devs, coord_devs_find(e->devs, jb->plan.stage_dev[s]), e->now);
        if (!all && e->now_ms - jb->rec.wait_ms < 3 * heartbeat_ms + 2000)
            return;
        jb->rec.restarted = 0;
    }
    if (jb->committing)
        return; /* a commit under way decides the step to start from */
    int missing = owner_missing(e);
    if (missing >= 0 && jb->opts.sync_every > 0 && jb->nowner > 1) {
        /* outer:H: the others go on without the replicas of the owners
         * gone, unless every owner is gone */
        int gone = 0;
        for (int o = 0; o < jb->nowner; o++)
            gone += owner_gone(e, o);
        if (gone < jb->nowner) {
            for (int o = 0; o < jb->nowner; o++)
                if (owner_gone(e, o) && !(jb->plan.nrep && jb->plan.away[o]))
                    event(e, "away", jb->owner[o].id, "the data owner %s is offline; the other "
                          "replicas go on from step %d, and its replica rejoins at a committed "
                          "outer step (a multiple of %d) once it is back", jb->owner[o].id,
                          jb->committed + 1, jb->opts.sync_every);
            missing = -1;
        }
    }
    for (int o = 0; missing < 0 && o < jb->nowner; o++) {
        coord_cand *c = &jb->cand[coord_job_cand_index(jb, jb->owner[o].id)];
        if (c->lost_ms && !owner_gone(e, o))
            c->lost_ms = 0; /* back before the plan */
    }
    if (missing >= 0) {
        char why[300];
        snprintf(why, sizeof why, "the data owner %s is offline; the job goes on from step %d "
                 "when it is back", jb->owner[missing].id, jb->committed + 1);
        event(e, "waiting", jb->owner[missing].id, "%s", why);
        jb->rec.wait_kind = COORD_WAIT_OWNER;
        jb->rec.wait_ms = e->now_ms;
        set_state(e, COORD_JOB_WAITING, why);
        return;
    }
    plan(e, COORD_PLAN_RECOVER);
}

static void tick_waiting(ev *e)
{
    coord_job *jb = e->jb;
    int go = 0;
    if (jb->rec.wait_kind == COORD_WAIT_OWNER) {
        go = owner_missing(e) < 0;
        for (int o = 0; go && o < jb->nowner; o++) {
            coord_cand *c = &jb->cand[coord_job_cand_index(jb, jb->owner[o].id)];
            if (c->lost_ms) {
                c->lost_ms = 0;
                event(e, "returned", c->id, "the data owner is back");
            }
        }
    } else if (jb->rec.wait_kind == COORD_WAIT_STORE) {
        go = e->now_ms - jb->rec.wait_ms >= jb->policy.store_retry_ms;
    } else {
        find_joiners(e);
        go = e->now_ms - jb->rec.wait_ms >= jb->policy.wait_retry_ms;
    }
    if (go) {
        jb->rec.detect_ms = jb->rec.wait_ms = e->now_ms;
        set_state(e, COORD_JOB_RECOVERING, "re-planning");
    }
}

void coord_job_tick(coord_job *jb, const coord_devs *devs, int settled, int64_t now_ms,
                    coord_fx_list *fx)
{
    ev e = ev_of(jb, now_ms, fx, devs);
    if (jb->planning)
        return;
    switch (jb->state) {
    case COORD_JOB_CHECKING:
        if (coord_job_checked(jb) && settled) {
            start_profiling(&e);
        } else if (!coord_job_checked(jb) && e.now - jb->check_since > jb->policy.check_wait_s) {
            int o = 0;
            while (o < jb->nowner - 1 && jb->owner[o].data_info)
                o++;
            char why[200];
            snprintf(why, sizeof why, "the data owner %.20s did not check %.64s within %d s (offline?)",
                     jb->owner[o].id, jb->owner[o].dataset, jb->policy.check_wait_s);
            set_state(&e, COORD_JOB_FAILED, why);
        }
        break;
    case COORD_JOB_PROFILING:
        tick_profiling(&e);
        break;
    case COORD_JOB_RUNNING:
        tick_running(&e);
        break;
    case COORD_JOB_RECOVERING:
        tick_recovering(&e, devs ? devs->heartbeat_ms : 0);
        break;
    case COORD_JOB_WAITING:
        tick_waiting(&e);
        break;
    default:
        break;
    }
}
