/* fuzz_job.c - libFuzzer target: the job state machine (coord_job.h) driven
 * by any sequence of events, its effects run as the driver runs them (a
 * plan, a commit and an epoch's reset each answered later, when the input
 * says). After every event: committed <= step <= steps, the epoch never
 * decreases, an ended job changes state only by the operator's resume, no second plan while
 * one is made, no commit while one runs, and every state change is one the
 * table allows. A broken property aborts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_job.h"
#include "coord_jobopts.h"
#include "sl_log.h"
#include "sl_mem.h"

#define NDEV 4

static const char *const ids[NDEV] = {"d0000000000000001", "d0000000000000002",
                                      "d0000000000000003", "d0000000000000004"};

static void die(const char *what, const coord_job *jb)
{
    fprintf(stderr, "fuzz_job: %s (state %s, epoch %d, step %d, committed %d of %d)\n", what,
            coord_job_state_name(jb->state), jb->epoch, jb->step, jb->committed, jb->steps);
    abort();
}

typedef struct world {
    coord_job jb;
    coord_dev dev[NDEV];
    coord_devs view;
    int64_t now_ms;
    int plan_mode;     /* a PLAN effect not answered: its mode + 1 */
    int commit_step, commit_epoch; /* a COMMIT effect not answered */
    int epoch_pending; /* an EPOCH effect not answered: its epoch */
    int last_state, last_epoch, ended;
} world;

/* What the driver does with the effects: remember what needs an answer. */
static void take(world *w, coord_fx_list *fx)
{
    coord_job *jb = &w->jb;
    for (int i = 0; i < fx->n; i++) {
        const coord_fx *f = &fx->v[i];
        if (f->kind == COORD_FX_PLAN) {
            if (w->plan_mode)
                die("a second plan while one is made", jb);
            w->plan_mode = f->mode + 1;
        } else if (f->kind == COORD_FX_COMMIT) {
            if (w->commit_step)
                die("a second commit while one runs", jb);
            w->commit_step = f->step;
            w->commit_epoch = f->epoch;
        } else if (f->kind == COORD_FX_EPOCH) {
            w->epoch_pending = f->epoch;
        } else if (f->kind == COORD_FX_STATE) {
            if (!coord_job_transition_ok((coord_job_state)w->last_state, (coord_job_state)f->state))
                die("a transition the table refuses", jb);
            w->last_state = f->state;
        }
    }
    coord_fx_list_free(fx);
    if (w->ended && (int)jb->state != w->last_state)
        die("an ended job changed state", jb);
    if (!(jb->committed <= jb->step && jb->step <= jb->steps))
        die("committed <= step <= steps broken", jb);
    if (jb->epoch < w->last_epoch)
        die("the epoch went back", jb);
    if ((int)jb->state != w->last_state)
        die("a state change without its effect", jb);
    w->last_epoch = jb->epoch;
    w->ended |= coord_job_state_final(jb->state);
}

static coord_plan_result some_plan(world *w, const uint8_t b)
{
    coord_plan_result r;
    memset(&r, 0, sizeof r);
    if (b % 5 == 0) {
        snprintf(r.why, sizeof r.why, "no plan");
        return r;
    }
    if (w->jb.nowner == 2) { /* two replicas, each its owner and, maybe, one more device */
        int half = 1 + (b >> 2) % 2, p = 2 * half;
        r.ok = 1;
        r.plan.p = p;
        r.plan.nrep = 2;
        r.plan.rep_first[1] = half;
        r.plan.rep_first[2] = p;
        r.plan.stage_dev = sl_xcalloc((size_t)p, sizeof *r.plan.stage_dev);
        r.plan.first_unit = sl_xcalloc((size_t)p, sizeof *r.plan.first_unit);
        r.plan.last_unit = sl_xcalloc((size_t)p, sizeof *r.plan.last_unit);
        for (int rep = 0; rep < 2; rep++)
            for (int i = 0; i < half; i++) {
                int s = rep * half + i;
                snprintf(r.plan.stage_dev[s], COORD_DEV_ID_LEN, "%s", ids[i == 0 ? rep : 2 + rep]);
                r.plan.first_unit[s] = i == 0 ? 0 : 3;
                r.plan.last_unit[s] = half == 1 ? 4 : i == 0 ? 2 : 4;
            }
        r.plan.ndev = p;
        r.plan.text = sl_xstrdup("{}");
        r.plan.sig = sl_xmalloc(1);
        r.plan.sig_len = 1;
        r.plan.seq = 8;
        r.plan.predicted = 0.1 + (b >> 4) * 0.05;
        return r;
    }
    int p = 1 + b % 3;
    r.ok = 1;
    r.plan.p = p;
    r.plan.stage_dev = sl_xcalloc((size_t)p, sizeof *r.plan.stage_dev);
    for (int i = 0; i < p; i++)
        snprintf(r.plan.stage_dev[i], COORD_DEV_ID_LEN, "%s", i == 0 ? ids[0] : ids[(b >> (2 * i)) % NDEV]);
    for (int a = 0; a < p; a++) {
        int seen = 0;
        for (int c = 0; c < a; c++)
            seen |= !strcmp(r.plan.stage_dev[a], r.plan.stage_dev[c]);
        r.plan.ndev += !seen;
    }
    r.plan.first_unit = sl_xcalloc((size_t)p, sizeof *r.plan.first_unit);
    r.plan.last_unit = sl_xcalloc((size_t)p, sizeof *r.plan.last_unit);
    for (int i = 0; i < p; i++) {
        r.plan.first_unit[i] = i == 0 ? 0 : 4 - p + i;
        r.plan.last_unit[i] = 4 - p + i;
    }
    r.plan.text = sl_xstrdup("{}");
    r.plan.sig = sl_xmalloc(1);
    r.plan.sig_len = 1;
    r.plan.seq = 8;
    r.plan.predicted = 0.1 + (b >> 4) * 0.05;
    r.n_devices = r.plan.ndev;
    (void)w;
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++)
        sl_log_set_level(SL_LOG_OFF);
    if (size < 2)
        return 0;
    world w;
    memset(&w, 0, sizeof w);
    w.now_ms = 1700000000000LL;
    for (int i = 0; i < NDEV; i++) {
        snprintf(w.dev[i].id, sizeof w.dev[i].id, "%s", ids[i]);
        snprintf(w.dev[i].site, sizeof w.dev[i].site, "%s", i < 2 ? "lab-a" : "lab-b");
        snprintf(w.dev[i].address, sizeof w.dev[i].address, "127.0.0.1:%d", 9000 + i);
        w.dev[i].has_key = 1;
        w.dev[i].seen = w.now_ms / 1000;
        w.dev[i].seen_ms = w.now_ms;
    }
    w.view = (coord_devs){w.dev, NDEV, 1000};
    coord_jobopts o;
    char why[200], opts[160];
    /* the first byte's top bit: a federation of two owners */
    int nowner = data[0] & 0x80 ? 2 : 1;
    snprintf(opts, sizeof opts, "{\"steps\": %d, \"batch\": 4, \"micro_batches\": 2, "
             "\"checkpoint_every\": %d%s}", 1 + data[0] % 40, data[1] % 8,
             nowner == 2 ? ", \"owner_batch\": [2, 4]" : "");
    if (coord_jobopts_parse(opts, &o, why, sizeof why))
        abort();
    coord_job *jb = &w.jb;
    coord_owner owners[2] = {{.batch = nowner == 2 ? 2 : 4}, {.batch = 4}};
    snprintf(owners[0].id, sizeof owners[0].id, "%s", ids[0]);
    snprintf(owners[0].dataset, sizeof owners[0].dataset, "wiki");
    snprintf(owners[1].id, sizeof owners[1].id, "%s", ids[1]);
    snprintf(owners[1].dataset, sizeof owners[1].dataset, "news");
    coord_job_init(jb, "j00000000000000ff", 255, sl_xstrdup("{}"), &o, owners, nowner, w.now_ms);
    coord_jobopts_free(&o);
    w.last_state = jb->state;
    coord_fx_list fx = {0};
    /* second byte's top bit: start from a job running its first plan, so
     * that the events from there on are reached from random inputs too */
    if (data[1] & 0x80) {
        for (int k = 0; k < nowner; k++)
            coord_job_check_done(jb, ids[k], 1, "", "{\"seq_len\": 8}", 8, 1, &w.view, w.now_ms,
                                 &fx);
        take(&w, &fx);
        for (int k = 0; k < jb->ncand; k++) {
            coord_job_profile_in(jb, jb->cand[k].id, COORD_PROFILE_LINKS, NULL, "[]", 0, &fx);
            coord_job_profile_in(jb, jb->cand[k].id, COORD_PROFILE_UNITS, "{}", NULL, 0, &fx);
        }
        take(&w, &fx);
        coord_job_tick(jb, &w.view, 1, w.now_ms, &fx);
        take(&w, &fx);
        if (w.plan_mode) {
            w.plan_mode = 0;
            coord_plan_result r = some_plan(&w, (uint8_t)(data[1] | 1));
            coord_job_plan_done(jb, COORD_PLAN_FIRST, &r, w.now_ms, &fx);
            take(&w, &fx);
        }
    }
    for (size_t i = 2; i + 2 < size; i += 3) {
        uint8_t op = data[i], a = data[i + 1], b = data[i + 2];
        const char *dev = ids[a % NDEV];
        switch (op % 16) {
        case 0: /* time passes; the devices heard from (bit by bit) */
            w.now_ms += (int64_t)a * 97 + (op >> 4) * 10000;
            for (int d = 0; d < NDEV; d++)
                if (b >> d & 1) {
                    w.dev[d].seen = w.now_ms / 1000;
                    w.dev[d].seen_ms = w.now_ms;
                }
            /* fallthrough */
        case 1:
            coord_job_tick(jb, &w.view, b & 0x80 ? 0 : 1, w.now_ms, &fx);
            break;
        case 2: /* an owner's check, or one the driver found unfit */
            if (b & 4)
                coord_job_check_unfit(jb, dev, "unfit", w.now_ms, &fx);
            else
                coord_job_check_done(jb, dev, a & 1, "refused", a & 2 ? "{\"seq_len\": 8}" : NULL,
                                     a & 2 ? (b & 2 ? 16 : 8) : 0, b & 1, &w.view, w.now_ms, &fx);
            break;
        case 3:
            coord_job_profile_in(jb, dev, b % 3, b & 8 ? "{\"units\": 1}" : "{}", "[]", b & 4, &fx);
            break;
        case 4: {
            coord_step_rep r;
            memset(&r, 0, sizeof r);
            r.loss = 5.0;
            r.step_s = 0.1;
            int step = a & 0x80 ? jb->step + 1 + (a & 0x3f) : (a & 0x3f);
            coord_job_step_report(jb, dev, b & 1 ? jb->epoch : b >> 4, (b >> 1) & 7, step, &r,
                                  w.now_ms, &fx);
            break;
        }
        case 5: /* every stage reports the next step */
            for (int s = 0; s < jb->plan.p; s++) {
                coord_step_rep r;
                memset(&r, 0, sizeof r);
                coord_job_step_report(jb, jb->plan.stage_dev[s], jb->epoch, s, jb->step + 1, &r,
                                      w.now_ms, &fx);
            }
            break;
        case 6:
            coord_job_parts_done(jb, b & 1 ? jb->epoch : b >> 1, a & 0x80 ? jb->step : a, &fx);
            break;
        case 7: /* the commit in flight is answered */
            if (w.commit_step) {
                int result = coord_job_commit_wanted(jb, w.commit_epoch, w.commit_step)
                                 ? (a % 3 == 0 ? COORD_COMMIT_FAILED : COORD_COMMIT_OK)
                                 : COORD_COMMIT_CANCELLED;
                int step = w.commit_step;
                w.commit_step = 0;
                coord_job_commit_done(jb, step, result, "disk full", w.now_ms, &fx);
            }
            break;
        case 8:
            if (w.epoch_pending) {
                coord_job_epoch_ready(jb, w.epoch_pending, 4.0, a % 5 == 0 ? "disk full" : NULL, w.now_ms, &fx);
                w.epoch_pending = 0;
            }
            break;
        case 9:
            coord_job_run_failure(jb, dev, b & 1 ? jb->epoch : b >> 1, "crashed",
                                  a & 0x40 ? ids[b % NDEV] : "", w.now_ms, &fx);
            break;
        case 10:
            if (b & 1)
                coord_job_stop_at_commit(jb, w.now_ms, &fx);
            else
                coord_job_stop(jb, w.now_ms, &fx);
            break;
        case 14: { /* the operator's resume: the one way out of an end */
            char why[200];
            if (coord_job_resume(jb, w.now_ms, why, sizeof why, &fx) == 0) {
                if (!w.ended)
                    die("a job that had not ended resumed", jb);
                w.ended = 0;
            }
            break;
        }
        case 11: /* the plan being made comes back */
            if (w.plan_mode) {
                int mode = w.plan_mode - 1;
                w.plan_mode = 0;
                coord_plan_result r = some_plan(&w, b);
                coord_job_plan_done(jb, mode, &r, w.now_ms, &fx);
            }
            break;
        case 12:
            coord_job_store_failed(jb, a, "no space", w.now_ms, &fx);
            break;
        case 13: { /* queries change nothing */
            coord_task_want t[2];
            int st = jb->state, ep = jb->epoch, sp = jb->step;
            coord_job_tasks(jb, dev, w.now_ms, t);
            coord_job_upload_check(jb, dev, jb->epoch, a, b & 1 ? "data.json" : "model.x.safetensors");
            if (st != (int)jb->state || ep != jb->epoch || sp != jb->step)
                die("a query changed the job", jb);
            break;
        }
        default:
            coord_job_tick(jb, &w.view, 1, w.now_ms, &fx);
        }
        take(&w, &fx);
    }
    coord_job_free(jb);
    return 0;
}
