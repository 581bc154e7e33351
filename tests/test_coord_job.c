/* The job state machine (coordinator/coord_job.h) on its own: no threads,
 * no sleeps, no files. The clock is a number the test moves; devices are a
 * table it edits; every decision is read from the effects returned. Covered:
 * the check's timeout, both profiling rounds and their waits, step reports
 * out of order and past their window, the device-loss decision (link
 * reports, heartbeats, a device's own failure), stalls, the store's retry
 * back-off, a joiner weighed against the replan margin, a stale plan
 * dropped, the grace after a restart, waiting for the data owner. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "coord_job.h"
#include "coord_jobopts.h"
#include "sl_mem.h"
#include "sl_test.h"

#define OWNER "d0000000000000001"
#define DEV_B "d0000000000000002"
#define DEV_C "d0000000000000003"
#define DEV_D "d0000000000000004"

/* ---- the world around one job ------------------------------------------------------ */

static int64_t now_ms;
static coord_dev devs[8];
static int ndev;
static coord_devs view;

static coord_dev *add_dev(const char *id, const char *site)
{
    coord_dev *d = &devs[ndev++];
    memset(d, 0, sizeof *d);
    snprintf(d->id, sizeof d->id, "%s", id);
    snprintf(d->site, sizeof d->site, "%s", site);
    snprintf(d->address, sizeof d->address, "127.0.0.1:%d", 9000 + ndev);
    d->has_key = 1;
    d->threads = 1;
    d->seen = now_ms / 1000;
    d->seen_ms = now_ms;
    view = (coord_devs){devs, ndev, 1000};
    return d;
}

static coord_dev *dev_of(const char *id)
{
    for (int i = 0; i < ndev; i++)
        if (!strcmp(devs[i].id, id))
            return &devs[i];
    return NULL;
}

/* Every device but the silent ones heartbeats now. */
static const char *silent[4];
static void heartbeats(void)
{
    for (int i = 0; i < ndev; i++) {
        int quiet = 0;
        for (int k = 0; k < 4; k++)
            quiet |= silent[k] && !strcmp(silent[k], devs[i].id);
        if (!quiet) {
            devs[i].seen = now_ms / 1000;
            devs[i].seen_ms = now_ms;
        }
    }
}

/* Time passes (ms), heartbeats as they come. */
static void pass(int64_t ms)
{
    now_ms += ms;
    heartbeats();
}

static coord_fx_list fx;

static void fx_reset(void) { coord_fx_list_free(&fx); }

/* The effects of kind k (and name, for events) since the last reset. */
static int count(coord_fx_kind k, const char *name)
{
    int n = 0;
    for (int i = 0; i < fx.n; i++)
        n += fx.v[i].kind == k && (!name || !strcmp(fx.v[i].name, name));
    return n;
}

static const coord_fx *find(coord_fx_kind k, const char *name)
{
    for (int i = 0; i < fx.n; i++)
        if (fx.v[i].kind == k && (!name || !strcmp(fx.v[i].name, name)))
            return &fx.v[i];
    return NULL;
}

static void tick(coord_job *jb) { coord_job_tick(jb, &view, 1, now_ms, &fx); }

/* ---- a job ------------------------------------------------------------------------- */

static void make_job(coord_job *jb, const char *opts_text)
{
    coord_jobopts o;
    char why[300];
    if (coord_jobopts_parse(opts_text, &o, why, sizeof why)) {
        fprintf(stderr, "options: %s\n", why);
        exit(1);
    }
    coord_owner ow = {.batch = o.batch};
    snprintf(ow.id, sizeof ow.id, "%s", OWNER);
    snprintf(ow.dataset, sizeof ow.dataset, "wiki");
    coord_job_init(jb, "j00000000000000aa", 170, sl_xstrdup("{}"), &o, &ow, 1, now_ms);
    coord_jobopts_free(&o);
}

static void check(coord_job *jb)
{
    coord_job_check_done(jb, OWNER, 1, "", "{\"seq_len\": 8}", 8, 1, &view, now_ms, &fx);
}

static char *units(double s)
{
    char *t = sl_xmalloc(256);
    snprintf(t, 256, "{\"unit_fwd_s\": [%g, %g, %g], \"unit_bwd_s\": [%g, %g, %g], \"links\": []}",
             s, s, s, 2 * s, 2 * s, 2 * s);
    return t;
}

/* A plan over stage devices `devs` (comma-separated), predicted `pred` s. */
static coord_plan_result plan_result(const char *stage_devs, double pred)
{
    coord_plan_result r;
    memset(&r, 0, sizeof r);
    r.ok = 1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", stage_devs);
    int p = 1;
    for (char *c = buf; *c; c++)
        p += *c == ',';
    r.plan.p = p;
    r.plan.stage_dev = sl_xcalloc((size_t)p, sizeof *r.plan.stage_dev);
    char *save = NULL;
    int i = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save), i++)
        snprintf(r.plan.stage_dev[i], COORD_DEV_ID_LEN, "%s", t);
    for (int a = 0; a < p; a++) {
        int seen = 0;
        for (int b = 0; b < a; b++)
            seen |= !strcmp(r.plan.stage_dev[a], r.plan.stage_dev[b]);
        r.plan.ndev += !seen;
    }
    /* 4 units (2 layers): the first stage the first ones, then one each */
    r.plan.first_unit = sl_xcalloc((size_t)p, sizeof *r.plan.first_unit);
    r.plan.last_unit = sl_xcalloc((size_t)p, sizeof *r.plan.last_unit);
    for (int a = 0; a < p; a++) {
        r.plan.first_unit[a] = a == 0 ? 0 : 4 - p + a;
        r.plan.last_unit[a] = 4 - p + a;
    }
    r.plan.text = sl_xstrdup("{\"plan\": true}");
    r.plan.sig = sl_xmalloc(4);
    r.plan.sig_len = 4;
    r.plan.seq = 8;
    r.plan.predicted = pred;
    r.n_devices = r.plan.ndev;
    return r;
}

/* Checked, profiled (every candidate's units at once) and planned over
 * stage_devs: the job is then running epoch 1. */
static void to_running(coord_job *jb, const char *stage_devs)
{
    check(jb);
    for (int i = 0; i < jb->ncand; i++)
        coord_job_profile_in(jb, jb->cand[i].id, COORD_PROFILE_LINKS, NULL, "[]", 0, &fx);
    tick(jb);
    char *u = units(0.01);
    for (int i = 0; i < jb->ncand; i++)
        coord_job_profile_in(jb, jb->cand[i].id, COORD_PROFILE_UNITS, u, NULL, 0, &fx);
    free(u);
    tick(jb);
    CHECK(jb->state == COORD_JOB_PLANNING && jb->planning == COORD_PLAN_FIRST + 1);
    coord_plan_result r = plan_result(stage_devs, 1.0);
    coord_job_plan_done(jb, COORD_PLAN_FIRST, &r, now_ms, &fx);
    CHECK(jb->state == COORD_JOB_RUNNING && jb->epoch == 1);
}

static coord_step_rep rep(double loss)
{
    coord_step_rep r;
    memset(&r, 0, sizeof r);
    r.loss = loss;
    r.step_s = 0.1;
    r.fwd = 0.02;
    r.bwd = 0.04;
    return r;
}

/* Every stage of the running plan reports steps from..to. */
static void report_steps(coord_job *jb, int from, int to)
{
    for (int s = from; s <= to; s++)
        for (int i = 0; i < jb->plan.p; i++) {
            coord_step_rep r = rep(5.0 - 0.01 * s);
            coord_job_step_report(jb, jb->plan.stage_dev[i], jb->epoch, i, s, &r, now_ms, &fx);
        }
}

/* Every part of step arrived and the COMMIT effect succeeded. */
static void commit(coord_job *jb, int step)
{
    coord_job_parts_done(jb, jb->epoch, step, &fx);
    CHECKF(jb->committing == step, "committing %d, not %d", jb->committing, step);
    coord_job_commit_done(jb, step, COORD_COMMIT_OK, NULL, now_ms, &fx);
}

static void setup(void)
{
    fx_reset();
    now_ms = 1700000000000LL;
    ndev = 0;
    memset(silent, 0, sizeof silent);
    add_dev(OWNER, "lab-a");
    add_dev(DEV_B, "lab-a");
    add_dev(DEV_C, "lab-b");
}

static const char *const OPTS = "{\"steps\": 40, \"batch\": 4, \"micro_batches\": 2, "
                                "\"checkpoint_every\": 10}";

/* How many candidates may Ping device (coord_job_pingers). */
static int pingers_of(const coord_job *jb, const char *device)
{
    int who[8];
    return coord_job_pingers(jb, device, now_ms, who, 8);
}

/* Every candidate's pingers are the candidates asked for their links (but
 * `done`) that measure it. */
static int pingers_match(const coord_job *jb, int done)
{
    int ok = 1;
    for (int k = 0; k < jb->ncand; k++) {
        int who[8], n = coord_job_pingers(jb, jb->cand[k].id, now_ms, who, 8), want = 0;
        for (int i = 0; i < jb->ncand; i++) {
            coord_task_want w[2];
            int m = 0, nw = coord_job_tasks(jb, jb->cand[i].id, now_ms, w), asked = 0;
            for (int x = 0; x < nw; x++)
                asked |= w[x].kind == COORD_TASK_PROFILE && w[x].round != COORD_PROFILE_UNITS;
            for (int x = 0; asked && i != done && x < jb->cand[i].nmeasure; x++)
                m |= jb->cand[i].measure[x] == k && i != k;
            int listed = 0;
            for (int y = 0; y < n; y++)
                listed |= who[y] == i;
            ok &= m == listed;
            want += m;
        }
        ok &= n == want;
    }
    return ok;
}

/* ---- the tests ----------------------------------------------------------------------- */

static void test_transitions(void)
{
    for (int s = 0; s < COORD_JOB_NSTATES; s++) {
        CHECK(coord_job_state_parse(coord_job_state_name((coord_job_state)s)) == s);
        int final = coord_job_state_final((coord_job_state)s);
        /* only the operator's resume leaves an end: a stopped or failed job recovers */
        for (int t = 0; t < COORD_JOB_NSTATES; t++)
            CHECKF(!final || coord_job_transition_ok((coord_job_state)s, (coord_job_state)t) ==
                                 (s != COORD_JOB_DONE && t == COORD_JOB_RECOVERING),
                   "an end state leads to %s", coord_job_state_name((coord_job_state)t));
        CHECK(final || coord_job_transition_ok((coord_job_state)s, COORD_JOB_STOPPED));
    }
    CHECK(coord_job_state_parse("paused") == -1);
    CHECK(!coord_job_transition_ok(COORD_JOB_CHECKING, COORD_JOB_RUNNING));
}

static void test_check_timeout(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    coord_task_want w[2];
    CHECK(coord_job_tasks(&jb, OWNER, now_ms, w) == 1 && w[0].kind == COORD_TASK_CHECK);
    CHECK(coord_job_tasks(&jb, DEV_B, now_ms, w) == 0);
    pass(120 * 1000);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_CHECKING);
    pass(1000);
    tick(&jb);
    CHECKF(jb.state == COORD_JOB_FAILED && strstr(jb.reason, "did not check wiki within 120 s"),
           "%s: %s", coord_job_state_name(jb.state), jb.reason);
    const coord_fx *st = find(COORD_FX_STATE, NULL);
    CHECK(st && st->state == COORD_JOB_FAILED);
    /* an answer after the end changes nothing */
    check(&jb);
    CHECK(jb.state == COORD_JOB_FAILED && jb.ncand == 0);
    coord_job_free(&jb);
}

/* A check the driver found unfit for the job fails it with the driver's
 * reason; from a device that is not the owner, or once the owner's check is
 * in, it changes nothing. */
static void test_check_unfit(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    int n0 = fx.n;
    coord_job_check_unfit(&jb, DEV_B, "not the owner", now_ms, &fx);
    CHECK(jb.state == COORD_JOB_CHECKING && fx.n == n0);
    coord_job_check_unfit(&jb, OWNER, "the labels differ", now_ms, &fx);
    CHECKF(jb.state == COORD_JOB_FAILED && !strcmp(jb.reason, "the labels differ"), "%s: %s",
           coord_job_state_name(jb.state), jb.reason);
    const coord_fx *st = find(COORD_FX_STATE, NULL);
    CHECK(st && st->state == COORD_JOB_FAILED);
    coord_job_free(&jb);
    setup();
    make_job(&jb, OPTS);
    check(&jb);
    coord_job_check_unfit(&jb, OWNER, "too late", now_ms, &fx);
    CHECK(jb.state == COORD_JOB_PROFILING);
    coord_job_free(&jb);
}

static void test_profiling_rounds(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    silent[0] = DEV_D;
    add_dev(DEV_D, "lab-b")->seen = 0; /* never heard from: not a candidate */
    check(&jb);
    CHECK(jb.state == COORD_JOB_PROFILING && jb.profile_round == COORD_PROFILE_LINKS);
    CHECK(jb.ncand == 3 && !strcmp(jb.cand[0].id, OWNER));
    /* round one: the links; lab-a's pair and the pair across are each measured by one device */
    coord_task_want w[2];
    int measured = 0;
    for (int i = 0; i < 3; i++) {
        int n = coord_job_tasks(&jb, jb.cand[i].id, now_ms, w);
        CHECK(n == 1 && w[0].kind == COORD_TASK_PROFILE && w[0].round == COORD_PROFILE_LINKS);
        measured += jb.cand[i].nmeasure;
    }
    CHECKF(measured == 3, "%d links measured", measured);
    /* each device answers Ping from exactly the candidates measuring it */
    CHECK(pingers_match(&jb, -1) && pingers_of(&jb, DEV_D) == 0);
    CHECK(pingers_of(&jb, OWNER) + pingers_of(&jb, DEV_B) + pingers_of(&jb, DEV_C) == 3);
    coord_job_profile_in(&jb, OWNER, COORD_PROFILE_LINKS, NULL, "[{\"peer\": 1}]", 0, &fx);
    CHECK(coord_job_tasks(&jb, OWNER, now_ms, w) == 0); /* done with round one */
    CHECK(pingers_match(&jb, 0)); /* the owner measures no more */
    coord_job_profile_in(&jb, DEV_B, COORD_PROFILE_LINKS, NULL, "[]", 0, &fx);
    tick(&jb);
    CHECK(jb.profile_round == COORD_PROFILE_LINKS); /* C has not measured its links */
    pass(60 * 1000);
    tick(&jb);
    CHECK(jb.profile_round == COORD_PROFILE_LINKS);
    pass(1000);
    tick(&jb);
    CHECK(jb.profile_round == COORD_PROFILE_UNITS && find(COORD_FX_LOG, "coordinator: timing units "
                                                          "before every link was measured"));
    CHECK(coord_job_tasks(&jb, DEV_C, now_ms, w) == 1 && w[0].round == COORD_PROFILE_UNITS);
    CHECK(pingers_of(&jb, OWNER) + pingers_of(&jb, DEV_B) + pingers_of(&jb, DEV_C) == 0);
    /* round two: C never answers; the plan goes ahead without it after the wait */
    char *u = units(0.01);
    coord_job_profile_in(&jb, OWNER, COORD_PROFILE_UNITS, u, NULL, 0, &fx);
    coord_job_profile_in(&jb, DEV_B, COORD_PROFILE_UNITS, u, NULL, 0, &fx);
    free(u);
    CHECK(count(COORD_FX_PROFILE, NULL) == 2);
    pass(60 * 1000);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PROFILING);
    pass(1000);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PLANNING && count(COORD_FX_PLAN, NULL) == 1);
    /* at most one plan in flight */
    pass(1000);
    tick(&jb);
    CHECK(count(COORD_FX_PLAN, NULL) == 1);
    coord_plan_result r = plan_result(OWNER "," DEV_B "," OWNER, 0.5);
    coord_job_plan_done(&jb, COORD_PLAN_FIRST, &r, now_ms, &fx);
    CHECK(jb.state == COORD_JOB_RUNNING && jb.epoch == 1 && jb.plan.p == 3 && jb.plan.ndev == 2);
    CHECK(coord_job_nunits(&jb) == 4);
    uint8_t units[4];
    coord_job_units_of(&jb, OWNER, units, 4);
    CHECK(units[0] && units[1] && !units[2] && units[3]);
    coord_job_fetch_units(&jb, DEV_B, units, 4);
    CHECK(!units[0] && !units[1] && units[2] && !units[3]);
    CHECK(coord_job_tasks(&jb, OWNER, now_ms, w) == 1 && w[0].kind == COORD_TASK_RUN && w[0].epoch == 1);
    /* a candidate left out of the plan is told to stop the epoch */
    CHECK(coord_job_tasks(&jb, DEV_C, now_ms, w) >= 1 && w[0].kind == COORD_TASK_STOP);
    coord_job_free(&jb);
}

static void test_first_plan_fails(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    check(&jb);
    for (int i = 0; i < jb.ncand; i++)
        coord_job_profile_in(&jb, jb.cand[i].id, COORD_PROFILE_LINKS, NULL, "[]", 0, &fx);
    tick(&jb);
    char *u = units(0.01);
    for (int i = 0; i < jb.ncand; i++)
        coord_job_profile_in(&jb, jb.cand[i].id, COORD_PROFILE_UNITS, u, NULL, 0, &fx);
    free(u);
    tick(&jb);
    coord_plan_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.why, sizeof r.why, "no device fits the model");
    coord_job_plan_done(&jb, COORD_PLAN_FIRST, &r, now_ms, &fx);
    CHECK(jb.state == COORD_JOB_FAILED && !strcmp(jb.reason, "planning: no device fits the model"));
    coord_job_free(&jb);
}

static void test_reports_out_of_order(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B "," DEV_C);
    fx_reset();
    coord_step_rep r1 = rep(4.0), r2 = rep(3.0);
    /* the last stage's step 2 before anyone's step 1 */
    CHECK(coord_job_step_report(&jb, DEV_C, 1, 2, 2, &r2, now_ms, &fx) == COORD_REPORT_TAKEN);
    CHECK(coord_job_step_report(&jb, OWNER, 1, 0, 2, &r2, now_ms, &fx) == COORD_REPORT_TAKEN);
    CHECK(coord_job_step_report(&jb, DEV_B, 1, 1, 2, &r2, now_ms, &fx) == COORD_REPORT_TAKEN);
    CHECK(jb.step == 0 && count(COORD_FX_METRICS, NULL) == 0);
    for (int i = 0; i < 3; i++)
        coord_job_step_report(&jb, jb.plan.stage_dev[i], 1, i, 1, &r1, now_ms, &fx);
    CHECK(jb.step == 2 && jb.loss == 3.0 && count(COORD_FX_METRICS, NULL) == 2);
    CHECK(fx.v[fx.n - 1].kind == COORD_FX_METRICS && fx.v[fx.n - 1].step == 2);
    /* sent twice, another device's stage, another epoch */
    CHECK(coord_job_step_report(&jb, DEV_C, 1, 2, 2, &r2, now_ms, &fx) == COORD_REPORT_OK);
    CHECK(coord_job_step_report(&jb, DEV_B, 1, 2, 3, &r2, now_ms, &fx) == COORD_REPORT_REFUSED);
    CHECK(coord_job_step_report(&jb, DEV_C, 1, 7, 3, &r2, now_ms, &fx) == COORD_REPORT_REFUSED);
    CHECK(coord_job_step_report(&jb, DEV_C, 1, 2, 41, &r2, now_ms, &fx) == COORD_REPORT_REFUSED);
    CHECK(coord_job_step_report(&jb, DEV_C, 0, 2, 3, &r2, now_ms, &fx) == COORD_REPORT_STOP);
    /* a report past the window: step 3's reports cannot all come any more */
    CHECK(coord_job_step_report(&jb, DEV_C, 1, 2, 3 + COORD_ACC_STEPS, &r2, now_ms, &fx) ==
          COORD_REPORT_OK);
    CHECKF(jb.state == COORD_JOB_RECOVERING &&
           strstr(jb.reason, "the reports of step 3 did not all arrive; running again from step 1"),
           "%s: %s", coord_job_state_name(jb.state), jb.reason);
    CHECK(jb.step <= jb.steps && jb.committed <= jb.step);
    coord_job_free(&jb);
}

static void test_commit_waits_for_reports(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B);
    fx_reset();
    report_steps(&jb, 1, 9);
    /* step 10's parts before its reports: the commit waits for them */
    coord_job_parts_done(&jb, 1, 10, &fx);
    CHECK(jb.committing == 0 && count(COORD_FX_COMMIT, NULL) == 0);
    CHECK(coord_job_upload_check(&jb, OWNER, 1, 10, "data.json") == COORD_UPLOAD_OK);
    CHECK(coord_job_upload_check(&jb, DEV_B, 1, 10, "data.json") == COORD_UPLOAD_REFUSED);
    CHECK(coord_job_upload_check(&jb, DEV_B, 1, 10, "../x.safetensors") == COORD_UPLOAD_REFUSED);
    CHECK(coord_job_upload_check(&jb, DEV_B, 1, 10, "model." OWNER ".safetensors") ==
          COORD_UPLOAD_REFUSED); /* another device's tag */
    CHECK(coord_job_upload_check(&jb, DEV_B, 1, 10, "model." DEV_B "-u2.safetensors") ==
          COORD_UPLOAD_OK);
    CHECK(coord_job_upload_check(&jb, DEV_B, 1, 10, "optim." DEV_B "-ux.safetensors") ==
          COORD_UPLOAD_REFUSED);
    CHECK(coord_job_upload_check(&jb, DEV_C, 1, 10, "model." DEV_C ".safetensors") ==
          COORD_UPLOAD_REFUSED);
    CHECK(coord_job_upload_check(&jb, DEV_B, 2, 10, "model." DEV_B ".safetensors") ==
          COORD_UPLOAD_NOT_RUNNING);
    report_steps(&jb, 10, 11);
    const coord_fx *c = find(COORD_FX_COMMIT, NULL);
    CHECK(c && c->step == 10 && c->epoch == 1 && jb.committing == 10);
    /* its metrics row comes before the commit */
    int metrics10 = -1, commit10 = -1;
    for (int i = 0; i < fx.n; i++) {
        if (fx.v[i].kind == COORD_FX_METRICS && fx.v[i].step == 10)
            metrics10 = i;
        if (fx.v[i].kind == COORD_FX_COMMIT)
            commit10 = i;
    }
    CHECK(metrics10 >= 0 && metrics10 < commit10);
    CHECK(coord_job_commit_wanted(&jb, 1, 10) && !coord_job_commit_wanted(&jb, 2, 10));
    coord_job_commit_done(&jb, 10, COORD_COMMIT_OK, NULL, now_ms, &fx);
    CHECK(jb.committed == 10 && jb.committing == 0 && jb.rec.weigh_joiners);
    CHECK(coord_job_upload_check(&jb, DEV_B, 1, 10, "model." DEV_B ".safetensors") ==
          COORD_UPLOAD_COMMITTED);
    coord_job_free(&jb);
}

/* The epoch's failure reports weighed together: a device its neighbours'
 * links lost and that said nothing is lost; one that reported its own
 * failure is not. */
static void test_loss_decision(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B "," DEV_C);
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    report_steps(&jb, 11, 12);
    fx_reset();
    coord_job_run_failure(&jb, OWNER, 1, "link to B broke", DEV_B, now_ms, &fx);
    coord_job_run_failure(&jb, DEV_C, 1, "link to B broke", DEV_B, now_ms, &fx);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RUNNING); /* B may still report */
    pass(1499);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RUNNING);
    pass(1);
    tick(&jb);
    const coord_fx *lost = find(COORD_FX_EVENT, "lost");
    CHECKF(jb.state == COORD_JOB_RECOVERING && lost && !strcmp(lost->device, DEV_B) &&
           strstr(lost->text, "its neighbours' links to it broke"), "%s", jb.reason);
    CHECK(strstr(jb.reason, "lost " DEV_B " (link broke); running again from step 11"));
    CHECK(jb.rec.n_lost == 1 && jb.rec.n_recoveries == 1);
    /* recovering: planned at once over the usable candidates (not B) */
    fx_reset();
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PLANNING && count(COORD_FX_PLAN, NULL) == 1);
    int k = coord_job_cand_index(&jb, DEV_B);
    CHECK(k >= 0 && !coord_job_cand_usable(&jb, k, &view, now_ms / 1000));
    coord_plan_result r = plan_result(OWNER "," DEV_C, 0.6);
    coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
    const coord_fx *ep = find(COORD_FX_EPOCH, NULL);
    CHECK(jb.state == COORD_JOB_RUNNING && jb.epoch == 2 && jb.step == 10 && jb.epoch_pending &&
          ep && ep->epoch == 2 && ep->committed == 10);
    CHECK(coord_job_upload_check(&jb, OWNER, 2, 20, "data.json") == COORD_UPLOAD_LATER);
    coord_job_epoch_ready(&jb, 2, 4.9, NULL, now_ms, &fx);
    CHECK(!jb.epoch_pending && jb.loss == 4.9);
    /* this time B reports its own failure: its reason, nobody lost */
    fx_reset();
    coord_job_run_failure(&jb, OWNER, 2, "link broke", DEV_C, now_ms, &fx);
    coord_job_run_failure(&jb, DEV_C, 2, "out of memory", "", now_ms, &fx);
    tick(&jb); /* every device of the plan reported: decided at once */
    CHECKF(jb.state == COORD_JOB_RECOVERING && count(COORD_FX_EVENT, "lost") == 0 &&
           strstr(jb.reason, "device " DEV_C ": out of memory"), "%s", jb.reason);
    coord_job_free(&jb);
}

/* A claim against one device, from one neighbour, is weighed against its
 * heartbeats; a claim against a device the reporter exchanges nothing with
 * is refused. */
static void test_loss_weighed(void)
{
    setup();
    coord_job jb;
    add_dev(DEV_D, "lab-b");
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B "," DEV_C "," DEV_D);
    CHECK(coord_job_neighbours(&jb, DEV_B, OWNER) && coord_job_neighbours(&jb, DEV_B, DEV_C) &&
          !coord_job_neighbours(&jb, DEV_B, DEV_D) && coord_job_neighbours(&jb, OWNER, DEV_D));
    CHECK(coord_job_member(&jb, OWNER) == (COORD_MEMBER_OWNER | COORD_MEMBER_CAND | COORD_MEMBER_STAGE));
    CHECK(coord_job_member(&jb, "d00000000000000ff") == 0);
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    /* B names D, which is not its neighbour: refused, B's own failure */
    fx_reset();
    CHECK(coord_job_run_failure(&jb, DEV_B, 1, "my link broke", DEV_D, now_ms, &fx) == -1);
    CHECK(jb.cand[coord_job_cand_index(&jb, DEV_D)].suspect == 0);
    pass(1500);
    tick(&jb);
    CHECKF(jb.state == COORD_JOB_RECOVERING && count(COORD_FX_EVENT, "lost") == 0 &&
           strstr(jb.reason, "device " DEV_B ": my link broke"), "%s", jb.reason);
    tick(&jb);
    coord_plan_result r = plan_result(OWNER "," DEV_B "," DEV_C "," DEV_D, 1.0);
    coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
    coord_job_epoch_ready(&jb, 2, 4.0, NULL, now_ms, &fx);
    /* C named by B alone while it heartbeats: kept */
    fx_reset();
    CHECK(coord_job_run_failure(&jb, DEV_B, 2, "link broke", DEV_C, now_ms, &fx) == 0);
    pass(1500); /* C heartbeats, as every live device does */
    tick(&jb);
    CHECKF(jb.state == COORD_JOB_RECOVERING && count(COORD_FX_EVENT, "lost") == 0, "%s", jb.reason);
    tick(&jb);
    r = plan_result(OWNER "," DEV_B "," DEV_C "," DEV_D, 1.0);
    coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
    coord_job_epoch_ready(&jb, 3, 4.0, NULL, now_ms, &fx);
    report_steps(&jb, 11, 20);
    commit(&jb, 20);
    /* C named by B alone and silent since: lost an interval and a second after the report */
    fx_reset();
    silent[0] = DEV_C;
    coord_job_run_failure(&jb, DEV_B, 3, "link broke", DEV_C, now_ms, &fx);
    pass(1500);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RUNNING); /* its heartbeat decides */
    pass(500);
    tick(&jb);
    const coord_fx *lost = find(COORD_FX_EVENT, "lost");
    CHECKF(lost && !strcmp(lost->device, DEV_C) && strstr(lost->text, "has not heartbeated since") &&
           jb.state == COORD_JOB_RECOVERING, "%s", jb.reason);
    coord_job_free(&jb);
}

static void test_heartbeat_loss(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B "," DEV_C);
    fx_reset();
    silent[0] = DEV_C;
    pass(4000);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RUNNING); /* 3 intervals and a second */
    pass(1000);
    tick(&jb);
    const coord_fx *lost = find(COORD_FX_EVENT, "lost");
    CHECKF(lost && !strcmp(lost->device, DEV_C) && strstr(lost->text, "no heartbeat for 5 s"),
           "%s", lost ? lost->text : "no lost event");
    CHECK(jb.state == COORD_JOB_RECOVERING && strstr(jb.reason, "(no heartbeat)"));
    coord_job_free(&jb);
}

/* A device revoked is lost at once, named as revoked (heartbeats still
 * recent), and no new job takes it as a candidate. */
static void test_revoked(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B "," DEV_C);
    fx_reset();
    pass(100);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RUNNING);
    dev_of(DEV_C)->revoked = 1;
    pass(100);
    tick(&jb);
    const coord_fx *lost = find(COORD_FX_EVENT, "lost");
    CHECKF(lost && !strcmp(lost->device, DEV_C) && !strcmp(lost->text, "revoked"), "%s",
           lost ? lost->text : "no lost event");
    CHECK(jb.state == COORD_JOB_RECOVERING && strstr(jb.reason, DEV_C " (revoked)"));
    coord_job_free(&jb);

    coord_job next;
    make_job(&next, OPTS);
    check(&next);
    CHECK(next.state == COORD_JOB_PROFILING && next.ncand == 2 &&
          coord_job_cand_index(&next, DEV_C) < 0);
    coord_job_free(&next);
}

static void test_stalls(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B);
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    for (int round = 1; round <= 4; round++) {
        fx_reset();
        coord_job_run_failure(&jb, DEV_B, jb.epoch, "crashed", "", now_ms, &fx);
        coord_job_run_failure(&jb, OWNER, jb.epoch, "crashed too", "", now_ms, &fx);
        tick(&jb);
        if (round == 4)
            break;
        CHECK(jb.state == COORD_JOB_RECOVERING && jb.rec.stalls == round);
        tick(&jb);
        coord_plan_result r = plan_result(OWNER "," DEV_B, 1.0);
        coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
        coord_job_epoch_ready(&jb, jb.epoch, 4.0, NULL, now_ms, &fx);
        CHECK(jb.state == COORD_JOB_RUNNING && jb.epoch == round + 1);
    }
    CHECKF(jb.state == COORD_JOB_FAILED &&
           strstr(jb.reason, "3 recoveries without a step committed in between"), "%s", jb.reason);
    CHECK(find(COORD_FX_EVENT, "failed") != NULL);
    /* the end is final */
    tick(&jb);
    CHECK(coord_job_stop(&jb, now_ms, &fx) == -1 && jb.state == COORD_JOB_FAILED);
    coord_job_free(&jb);
}

static void test_store_backoff(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B);
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    report_steps(&jb, 11, 20);
    int64_t waits[3] = {10000, 20000, 40000};
    for (int f = 0; f < 3; f++) {
        fx_reset();
        coord_job_parts_done(&jb, jb.epoch, 20, &fx);
        coord_job_commit_done(&jb, 20, COORD_COMMIT_FAILED, "writing x: No space left on device",
                              now_ms, &fx);
        char want[160];
        snprintf(want, sizeof want, "step 10 stays committed; trying again in %lld s",
                 (long long)waits[f] / 1000);
        CHECKF(jb.state == COORD_JOB_WAITING && jb.committed == 10 && strstr(jb.reason, want),
               "%s", jb.reason);
        CHECK(find(COORD_FX_EVENT, "store_failed") != NULL);
        pass(waits[f] - 1);
        tick(&jb);
        CHECK(jb.state == COORD_JOB_WAITING);
        pass(1);
        tick(&jb);
        CHECK(jb.state == COORD_JOB_RECOVERING);
        tick(&jb);
        coord_plan_result r = plan_result(OWNER "," DEV_B, 1.0);
        coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
        coord_job_epoch_ready(&jb, jb.epoch, 4.0, NULL, now_ms, &fx);
        CHECK(jb.state == COORD_JOB_RUNNING && jb.step == 10);
        report_steps(&jb, 11, 20);
    }
    /* a commit resets the back-off */
    commit(&jb, 20);
    CHECK(jb.committed == 20 && jb.rec.store_fails == 0 && jb.reason[0] == 0);
    coord_job_free(&jb);
}

/* A device that comes online while the job runs is profiled and weighed at
 * the next commit: taken only when faster by the margin. */
static void test_joiner_margin(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B);
    fx_reset();
    add_dev(DEV_D, "lab-b");
    tick(&jb);
    const coord_fx *join = find(COORD_FX_EVENT, "joining");
    CHECK(join && !strcmp(join->device, DEV_D) && !strcmp(join->text, "online; profiling it"));
    coord_task_want w[2];
    CHECK(coord_job_tasks(&jb, DEV_D, now_ms, w) == 2 && w[1].kind == COORD_TASK_PROFILE &&
          w[1].round == COORD_PROFILE_BOTH);
    /* the running devices it measures answer its pings while it profiles */
    int kd = coord_job_cand_index(&jb, DEV_D), who[8];
    CHECK(kd >= 0 && jb.cand[kd].nmeasure > 0 && pingers_match(&jb, -1));
    int target = jb.cand[kd].measure[0];
    CHECK(coord_job_pingers(&jb, jb.cand[target].id, now_ms, who, 8) == 1 && who[0] == kd);
    char *u = units(0.005);
    coord_job_profile_in(&jb, DEV_D, COORD_PROFILE_BOTH, u, NULL, 0, &fx);
    free(u);
    CHECK(pingers_of(&jb, jb.cand[target].id) == 0);
    tick(&jb);
    CHECK(count(COORD_FX_PLAN, NULL) == 0); /* weighed at a commit */
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    fx_reset();
    tick(&jb);
    CHECK(count(COORD_FX_PLAN, NULL) == 1 && jb.planning == COORD_PLAN_JOIN + 1 &&
          jb.state == COORD_JOB_RUNNING);
    /* predicted 0.95 s against 1 s: under the 10% margin, not taken */
    coord_plan_result r = plan_result(OWNER "," DEV_D, 0.95);
    coord_job_plan_done(&jb, COORD_PLAN_JOIN, &r, now_ms, &fx);
    const coord_fx *wg = find(COORD_FX_EVENT, "weighed");
    CHECK(wg && strstr(wg->text, "not taken: predicted 0.9500 s per step with them, 1.0000 s now "
                       "(margin 10%)"));
    CHECK(jb.epoch == 1 && jb.plan.ndev == 2 && !strcmp(jb.plan.stage_dev[1], DEV_B));
    /* back again: a new profile (it is joining once more), a faster plan */
    fx_reset();
    dev_of(DEV_D)->seen_ms = now_ms + 1;
    jb.cand[coord_job_cand_index(&jb, DEV_D)].joining = 1;
    report_steps(&jb, 11, 20);
    commit(&jb, 20);
    tick(&jb);
    r = plan_result(OWNER "," DEV_D, 0.5);
    coord_job_plan_done(&jb, COORD_PLAN_JOIN, &r, now_ms, &fx);
    CHECK(jb.epoch == 2 && !strcmp(jb.plan.stage_dev[1], DEV_D) && jb.step == 20 &&
          find(COORD_FX_EPOCH, NULL) && find(COORD_FX_EVENT, "planned"));
    coord_job_free(&jb);
}

/* Plans that come back after the job moved on are dropped. */
static void test_stale_plans(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B);
    add_dev(DEV_D, "lab-b");
    tick(&jb);
    char *u = units(0.005);
    coord_job_profile_in(&jb, DEV_D, COORD_PROFILE_BOTH, u, NULL, 0, &fx);
    free(u);
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    tick(&jb);
    CHECK(jb.planning == COORD_PLAN_JOIN + 1);
    /* a commit in flight while the joiner's plan is made */
    report_steps(&jb, 11, 20);
    coord_job_parts_done(&jb, 1, 20, &fx);
    CHECK(jb.committing == 20);
    fx_reset();
    coord_plan_result r = plan_result(OWNER "," DEV_D, 0.1);
    coord_job_plan_done(&jb, COORD_PLAN_JOIN, &r, now_ms, &fx);
    CHECK(jb.epoch == 1 && count(COORD_FX_EVENT, "weighed") == 0 && jb.planning == 0);
    coord_job_commit_done(&jb, 20, COORD_COMMIT_OK, NULL, now_ms, &fx);
    /* a recovery's plan that comes back after the operator stopped the job */
    coord_job_run_failure(&jb, DEV_B, 1, "crashed", "", now_ms, &fx);
    coord_job_run_failure(&jb, OWNER, 1, "crashed", "", now_ms, &fx);
    tick(&jb);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PLANNING);
    CHECK(coord_job_stop(&jb, now_ms, &fx) == 0 && jb.state == COORD_JOB_STOPPED);
    r = plan_result(OWNER "," DEV_B, 1.0);
    coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
    CHECK(jb.state == COORD_JOB_STOPPED && jb.epoch == 1);
    /* a recovery does not start while a commit is in flight */
    coord_job jb2;
    make_job(&jb2, OPTS);
    to_running(&jb2, OWNER "," DEV_B);
    report_steps(&jb2, 1, 10);
    coord_job_parts_done(&jb2, 1, 10, &fx);
    coord_job_run_failure(&jb2, DEV_B, 1, "crashed", "", now_ms, &fx);
    coord_job_run_failure(&jb2, OWNER, 1, "crashed", "", now_ms, &fx);
    tick(&jb2);
    CHECK(jb2.state == COORD_JOB_RECOVERING && !coord_job_commit_wanted(&jb2, 1, 10));
    fx_reset();
    tick(&jb2);
    CHECK(jb2.state == COORD_JOB_RECOVERING && count(COORD_FX_PLAN, NULL) == 0);
    coord_job_commit_done(&jb2, 10, COORD_COMMIT_CANCELLED, NULL, now_ms, &fx);
    tick(&jb2);
    CHECK(jb2.state == COORD_JOB_PLANNING && jb2.committed == 0);
    coord_job_free(&jb2);
    coord_job_free(&jb);
}

static void test_restart_grace(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B "," DEV_C);
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    report_steps(&jb, 11, 12);
    /* what a restart reads back: the row, the plan, the profiles */
    fx_reset();
    silent[0] = DEV_C;
    pass(10 * 1000); /* the coordinator was down a while */
    coord_job_restarted(&jb, 4.9, now_ms, &fx);
    const coord_fx *ev = find(COORD_FX_EVENT, "coordinator_restarted");
    CHECK(ev && !strcmp(ev->text, "was running; going on from step 11") && ev->step == 10);
    CHECK(jb.state == COORD_JOB_RECOVERING && jb.step == 10 && jb.loss == 4.9);
    /* C is not back: the plan's devices get 3 intervals and 2 s */
    pass(4999);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RECOVERING && count(COORD_FX_PLAN, NULL) == 0);
    pass(1);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PLANNING && count(COORD_FX_PLAN, NULL) == 1);
    coord_job_free(&jb);
    /* every device back: planned at once */
    setup();
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B);
    coord_job_restarted(&jb, 0, now_ms, &fx);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PLANNING);
    coord_job_free(&jb);
    /* checked but not planned: checked again */
    setup();
    make_job(&jb, OPTS);
    check(&jb);
    CHECK(jb.state == COORD_JOB_PROFILING);
    coord_job_restarted(&jb, 0, now_ms, &fx);
    CHECK(jb.state == COORD_JOB_CHECKING && jb.owner[0].data_info);
    coord_job_tick(&jb, &view, 0, now_ms, &fx); /* not settled: devices may be coming back */
    CHECK(jb.state == COORD_JOB_CHECKING);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PROFILING);
    coord_job_free(&jb);
}

static void test_owner_waits(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B "," OWNER);
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    fx_reset();
    silent[0] = OWNER;
    pass(5000);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RECOVERING);
    tick(&jb);
    const coord_fx *w = find(COORD_FX_EVENT, "waiting");
    CHECKF(jb.state == COORD_JOB_WAITING && w && !strcmp(w->device, OWNER) &&
           strstr(jb.reason, "the data owner " OWNER " is offline; the job goes on from step 11"),
           "%s", jb.reason);
    pass(60 * 1000);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_WAITING);
    silent[0] = NULL;
    pass(1);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RECOVERING && find(COORD_FX_EVENT, "returned"));
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PLANNING);
    coord_job_free(&jb);
}

static void fed_plan(coord_job_plan *pl, int away);

/* Two owners, OWNER's replica on OWNER and DEV_C's on DEV_C (each one
 * stage of the whole model), under `sync` and a checkpoint every 2 steps. */
static void fed_running(coord_job *jb, const char *sync)
{
    char opts[300];
    snprintf(opts, sizeof opts, "{\"steps\": 40, \"micro_batches\": 2, \"owner_batch\": [2, 4], "
             "\"checkpoint_every\": 2, \"sync\": \"%s\"}", sync);
    coord_jobopts o;
    char why[300];
    CHECKF(coord_jobopts_parse(opts, &o, why, sizeof why) == 0, "%s", why);
    coord_owner ow[2] = {{.batch = 2}, {.batch = 4}};
    snprintf(ow[0].id, sizeof ow[0].id, "%s", OWNER);
    snprintf(ow[0].dataset, sizeof ow[0].dataset, "wiki");
    snprintf(ow[1].id, sizeof ow[1].id, "%s", DEV_C);
    snprintf(ow[1].dataset, sizeof ow[1].dataset, "news");
    coord_job_init(jb, "j00000000000000ab", 171, sl_xstrdup("{}"), &o, ow, 2, now_ms);
    coord_jobopts_free(&o);
    coord_job_check_done(jb, DEV_C, 1, "", "{\"seq_len\": 8}", 8, 1, &view, now_ms, &fx);
    to_running(jb, OWNER "," DEV_C);
    fed_plan(&jb->plan, 0);
}

/* The running plan made a federation's: replica r on stage r, each the
 * whole model; replica `away` (1-based, 0: none) has no stage. */
static void fed_plan(coord_job_plan *pl, int away)
{
    pl->nrep = 2;
    pl->rep_first[0] = 0;
    pl->rep_first[1] = away == 1 ? 0 : 1;
    pl->rep_first[2] = pl->p;
    for (int i = 0; i < pl->p; i++) {
        pl->first_unit[i] = 0;
        pl->last_unit[i] = 3;
    }
    pl->away[1] = away == 2;
    pl->away[0] = away == 1;
    pl->away_since[0] = pl->away_since[1] = 6;
}

/* Under outer:H an owner that goes away leaves its replica out and the
 * others go on; back, its replica rejoins only from a committed outer step
 * (not from step 10 under outer:4, from step 12), or at once if nothing
 * was committed without it. Under step the job waits. */
static void test_owner_away(void)
{
    setup();
    coord_job jb;
    fed_running(&jb, "outer:4");
    report_steps(&jb, 1, 6);
    commit(&jb, 2);
    commit(&jb, 4);
    commit(&jb, 6);
    fx_reset();
    silent[0] = DEV_C;
    pass(5000);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RECOVERING);
    tick(&jb);
    const coord_fx *a = find(COORD_FX_EVENT, "away");
    CHECKF(jb.state == COORD_JOB_PLANNING && a && !strcmp(a->device, DEV_C) &&
           strstr(a->text, "the other replicas go on from step 7") && !find(COORD_FX_EVENT, "waiting"),
           "%s: %s", coord_job_state_name(jb.state), a ? a->text : "no away event");
    CHECK(jb.plan_away[1] && !jb.plan_away[0] && !jb.plan_rejoin[0] && !jb.plan_rejoin[1] &&
          jb.plan_away_since[1] == 6);
    coord_plan_result r = plan_result(OWNER, 1.0);
    fed_plan(&r.plan, 2);
    r.plan.start_step = 7;
    coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
    coord_job_epoch_ready(&jb, jb.epoch, 4.9, NULL, now_ms, &fx);
    CHECK(jb.state == COORD_JOB_RUNNING && jb.epoch == 2 && jb.plan.away[1]);
    /* the replica present reports alone; its loss is the step's */
    fx_reset();
    report_steps(&jb, 7, 7);
    const coord_fx *m = find(COORD_FX_METRICS, NULL);
    CHECKF(m && m->loss == 5.0 - 0.01 * 7, "loss %g", m ? m->loss : -1.0);
    /* steps 8 (an outer step) and 10 committed without it, then its owner
     * back at step 10, between outer steps: it stays out, and a recovery
     * from step 10 (the present owner's own failure) plans it out still:
     * no replica holds parameters it could start from there */
    report_steps(&jb, 8, 10);
    commit(&jb, 8);
    commit(&jb, 10);
    silent[0] = NULL;
    pass(1);
    fx_reset();
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RUNNING && !find(COORD_FX_EVENT, "returned"));
    coord_job_run_failure(&jb, OWNER, 2, "a step failed", "", now_ms, &fx);
    for (int i = 0; i < 4 && jb.state != COORD_JOB_PLANNING; i++) {
        pass(1000);
        tick(&jb);
    }
    CHECKF(jb.state == COORD_JOB_PLANNING && jb.plan_away[1] && !jb.plan_rejoin[1] &&
           jb.plan_away_since[1] == 6, "%s", coord_job_state_name(jb.state));
    r = plan_result(OWNER, 1.0);
    fed_plan(&r.plan, 2);
    r.plan.start_step = 11;
    coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
    coord_job_epoch_ready(&jb, jb.epoch, 4.9, NULL, now_ms, &fx);
    CHECK(jb.state == COORD_JOB_RUNNING && jb.epoch == 3);
    /* the next outer step committed (12): it rejoins from there */
    report_steps(&jb, 11, 12);
    commit(&jb, 12);
    fx_reset();
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RECOVERING);
    tick(&jb);
    const coord_fx *b = find(COORD_FX_EVENT, "returned");
    CHECKF(jb.state == COORD_JOB_PLANNING && b && !strcmp(b->device, DEV_C) &&
           strstr(b->text, "rejoins from the committed outer step 12"), "%s",
           coord_job_state_name(jb.state));
    CHECK(jb.plan_rejoin[1] && !jb.plan_away[1] && !jb.plan_rejoin[0] && !jb.plan_away[0]);
    coord_job_free(&jb);

    /* back before anything was committed without it: it goes on from its
     * own parts at once (no rejoin) */
    setup();
    fed_running(&jb, "outer:4");
    report_steps(&jb, 1, 6);
    commit(&jb, 2);
    commit(&jb, 4);
    commit(&jb, 6);
    silent[0] = DEV_C;
    pass(5000);
    tick(&jb);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PLANNING && jb.plan_away[1]);
    r = plan_result(OWNER, 1.0);
    fed_plan(&r.plan, 2);
    r.plan.start_step = 7;
    coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
    coord_job_epoch_ready(&jb, jb.epoch, 4.9, NULL, now_ms, &fx);
    silent[0] = NULL;
    pass(1);
    fx_reset();
    tick(&jb);
    tick(&jb);
    b = find(COORD_FX_EVENT, "returned");
    CHECKF(jb.state == COORD_JOB_PLANNING && b && strstr(b->text, "goes on from step 7") &&
           !jb.plan_away[1] && !jb.plan_rejoin[1], "%s", coord_job_state_name(jb.state));
    coord_job_free(&jb);

    /* under step the job waits for the owner */
    setup();
    fed_running(&jb, "step");
    report_steps(&jb, 1, 2);
    commit(&jb, 2);
    fx_reset();
    silent[0] = DEV_C;
    pass(5000);
    tick(&jb);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_WAITING && find(COORD_FX_EVENT, "waiting") &&
          !find(COORD_FX_EVENT, "away"));
    coord_job_free(&jb);
}

static void test_done(void)
{
    setup();
    coord_job jb;
    make_job(&jb, "{\"steps\": 10, \"batch\": 4, \"micro_batches\": 2, \"checkpoint_every\": 5}");
    to_running(&jb, OWNER "," DEV_B);
    report_steps(&jb, 1, 10);
    commit(&jb, 5);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RUNNING); /* step 10 not committed yet */
    commit(&jb, 10);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_DONE && jb.committed == 10 && jb.step == 10);
    coord_task_want w[2];
    CHECK(coord_job_tasks(&jb, DEV_B, now_ms, w) == 1 && w[0].kind == COORD_TASK_STOP &&
          w[0].epoch == 2);
    pass(601 * 1000);
    CHECK(coord_job_tasks(&jb, DEV_B, now_ms, w) == 0);
    coord_job_free(&jb);
}

/* job stop --at-checkpoint: the job trains on to its next commit and stops
 * there; resume re-plans from that commit in a new epoch. */
static void test_stop_at_commit_and_resume(void)
{
    setup();
    coord_job jb;
    make_job(&jb, OPTS);
    char why[300];
    CHECK(coord_job_resume(&jb, now_ms, why, sizeof why, &fx) == -1 && strstr(why, "checking"));
    to_running(&jb, OWNER "," DEV_B);
    report_steps(&jb, 1, 12);
    commit(&jb, 10);
    fx_reset();
    CHECK(coord_job_stop_at_commit(&jb, now_ms, &fx) == 0 && jb.state == COORD_JOB_RUNNING &&
          jb.stop_at_commit && find(COORD_FX_EVENT, "stop_requested") && count(COORD_FX_SAVE, NULL));
    report_steps(&jb, 13, 20);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_RUNNING); /* draining: step 20 not committed yet */
    commit(&jb, 20);
    CHECKF(jb.state == COORD_JOB_STOPPED && jb.committed == 20 && !jb.stop_at_commit &&
           strstr(jb.reason, "at its commit of step 20"), "%s %s", coord_job_state_name(jb.state),
           jb.reason);
    CHECK(coord_job_stop_at_commit(&jb, now_ms, &fx) == -1);
    report_steps(&jb, 21, 22); /* reports of a stopped job are not taken */
    CHECK(jb.step == 20);
    /* resume: a new epoch from the committed step */
    int epoch = jb.epoch;
    fx_reset();
    CHECK(coord_job_resume(&jb, now_ms, why, sizeof why, &fx) == 0 &&
          jb.state == COORD_JOB_RECOVERING && !jb.ended && find(COORD_FX_EVENT, "resume"));
    CHECK(coord_job_resume(&jb, now_ms, why, sizeof why, &fx) == -1 && strstr(why, "recovering"));
    tick(&jb);
    CHECK(jb.state == COORD_JOB_PLANNING && jb.planning == COORD_PLAN_RECOVER + 1);
    coord_plan_result r = plan_result(OWNER "," DEV_C, 1.0);
    coord_job_plan_done(&jb, COORD_PLAN_RECOVER, &r, now_ms, &fx);
    coord_job_epoch_ready(&jb, jb.epoch, 4.0, NULL, now_ms, &fx);
    CHECK(jb.state == COORD_JOB_RUNNING && jb.epoch == epoch + 1 && jb.step == 20);
    report_steps(&jb, 21, 40);
    commit(&jb, 30);
    commit(&jb, 40);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_DONE && jb.committed == 40);
    CHECK(coord_job_resume(&jb, now_ms, why, sizeof why, &fx) == -1 && strstr(why, "done"));
    coord_job_free(&jb);
    /* a job asked before it runs stops at its first commit */
    make_job(&jb, OPTS);
    CHECK(coord_job_stop_at_commit(&jb, now_ms, &fx) == 0 && jb.state == COORD_JOB_CHECKING);
    to_running(&jb, OWNER "," DEV_B);
    report_steps(&jb, 1, 10);
    commit(&jb, 10);
    CHECK(jb.state == COORD_JOB_STOPPED && jb.committed == 10);
    coord_job_free(&jb);
    /* one stopped before it was planned has nothing to resume */
    make_job(&jb, OPTS);
    coord_job_stop(&jb, now_ms, &fx);
    CHECK(coord_job_resume(&jb, now_ms, why, sizeof why, &fx) == -1 && strstr(why, "submit it again"));
    coord_job_free(&jb);
    /* a stop asked for at the last step's commit: the job is done */
    make_job(&jb, "{\"steps\": 10, \"batch\": 4, \"micro_batches\": 2, \"checkpoint_every\": 0}");
    to_running(&jb, OWNER "," DEV_B);
    report_steps(&jb, 1, 10);
    coord_job_stop_at_commit(&jb, now_ms, &fx);
    commit(&jb, 10);
    tick(&jb);
    CHECK(jb.state == COORD_JOB_DONE);
    coord_job_free(&jb);
    /* a failed job resumes too, its stalls forgotten */
    make_job(&jb, OPTS);
    to_running(&jb, OWNER "," DEV_B);
    coord_job_stop(&jb, now_ms, &fx);
    jb.state = COORD_JOB_FAILED; /* as recovery leaves it */
    jb.rec.stalls = 4;
    CHECK(coord_job_resume(&jb, now_ms, why, sizeof why, &fx) == 0 && jb.rec.stalls == 0 &&
          jb.state == COORD_JOB_RECOVERING);
    coord_job_free(&jb);
}

static void test_options(void)
{
    coord_jobopts o;
    char why[300];
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"[1]", "options: not a JSON object"},
        {"{}", "options: steps must be 1..1e9"},
        {"{\"steps\": 5, \"batch\": 6, \"micro_batches\": 4}", "batch 6 is not a multiple of micro_batches 4"},
        {"{\"steps\": 5, \"codec_act\": \"int4\"}", "codec_act 'int4' is not a codec for activations"},
        {"{\"steps\": 5, \"codec_grad\": \"topk:2\"}", "codec_grad 'topk:2' is not a codec for gradients"},
        {"{\"steps\": 5, \"batchsize\": 4}", "options: 'batchsize' is not an option"},
        {"{\"steps\": 5, \"sealed\": \"yes\"}", "options: 'sealed' is of the wrong type"},
        {"{\"steps\": 5, \"checkpoint_every\": 2.5}", "options: 'checkpoint_every' must be a whole number"},
        {"{\"steps\": 5, \"devices\": [\"x\"]}", "options: devices must be a list of device ids"},
        {"{\"steps\": 5, \"precision\": \"fp16\"}", "options: precision must be fp32 or bf16"},
        {"{\"steps\": 5, \"task\": \"ner\"}", "options: task 'ner' is not mlm or classify"},
        {"{\"steps\": 5, \"task\": 1}", "options: 'task' is of the wrong type"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = coord_jobopts_parse(bad[i].text, &o, why, sizeof why);
        CHECKF(rc == -1 && strstr(why, bad[i].why), "%s: %s", bad[i].text, why);
        coord_jobopts_free(&o);
    }
    /* what is written back parses to the same options, every one present */
    CHECK(coord_jobopts_parse("{\"steps\": 7, \"lr\": 1, \"checkpoint_every\": 20.0, \"devices\": []}",
                              &o, why, sizeof why) == 0);
    char *t = coord_jobopts_text(&o, 0);
    CHECKF(strstr(t, "\"lr\":1.0") && strstr(t, "\"checkpoint_every\":20,") &&
           strstr(t, "\"devices\":[]") && strstr(t, "\"steps\":7"), "%s", t);
    coord_jobopts o2;
    CHECK(coord_jobopts_parse(t, &o2, why, sizeof why) == 0);
    char *t2 = coord_jobopts_text(&o2, 0);
    CHECK(!strcmp(t, t2));
    CHECK(coord_jobopts_allows(&o, "dX", "dY")); /* an empty list allows everyone */
    CHECK(!strcmp(o.precision, "fp32") && strstr(t, "\"precision\":\"fp32\""));
    coord_jobopts o3;
    CHECK(coord_jobopts_parse("{\"steps\": 1, \"precision\": \"bf16\"}", &o3, why, sizeof why) == 0 &&
          !strcmp(o3.precision, "bf16"));
    coord_jobopts_free(&o3);
    CHECK(!strcmp(o.task, "mlm") && strstr(t, "\"task\":\"mlm\"") &&
          coord_jobopts_task(&o) == BAL_TASK_MLM);
    CHECK(coord_jobopts_parse("{\"steps\": 1, \"task\": \"classify\"}", &o3, why, sizeof why) == 0 &&
          !strcmp(o3.task, "classify") && coord_jobopts_task(&o3) == BAL_TASK_CLASSIFY);
    char *t3 = coord_jobopts_text(&o3, 0);
    CHECKF(strstr(t3, "\"task\":\"classify\""), "%s", t3);
    free(t3);
    coord_jobopts_free(&o3);
    /* the data owner's policy against the options */
    coord_policy pol = {.known = 1, .home_layers = 1};
    CHECK(coord_policy_check(&pol, &o, why, sizeof why) == 0);
    o.u_shape = 0;
    CHECK(coord_policy_check(&pol, &o, why, sizeof why) == -1 && strstr(why, "--allow-labels-out"));
    pol.allow_labels_out = 1;
    o.sealed = 0;
    CHECK(coord_policy_check(&pol, &o, why, sizeof why) == -1 && strstr(why, "--allow-unsealed"));
    pol.known = 0;
    CHECK(coord_policy_check(&pol, &o, why, sizeof why) == 0); /* nothing known: nothing refused */
    free(t);
    free(t2);
    coord_jobopts_free(&o);
    coord_jobopts_free(&o2);
}

int main(void)
{
    RUN(test_transitions);
    RUN(test_options);
    RUN(test_check_timeout);
    RUN(test_check_unfit);
    RUN(test_profiling_rounds);
    RUN(test_first_plan_fails);
    RUN(test_reports_out_of_order);
    RUN(test_commit_waits_for_reports);
    RUN(test_loss_decision);
    RUN(test_loss_weighed);
    RUN(test_heartbeat_loss);
    RUN(test_revoked);
    RUN(test_stalls);
    RUN(test_store_backoff);
    RUN(test_joiner_margin);
    RUN(test_stale_plans);
    RUN(test_restart_grace);
    RUN(test_owner_waits);
    RUN(test_owner_away);
    RUN(test_done);
    RUN(test_stop_at_commit_and_resume);
    fx_reset();
    return sl_test_done();
}
