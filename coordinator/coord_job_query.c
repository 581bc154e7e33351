/* coord_job_query.c - what a job's state answers without changing it
 * (coord_job.h): who is a member and in which role, which stage or replica a
 * device runs, which checkpoint parts a device may upload and fetch, and
 * which tasks it is given. Pure functions of the job and the time passed in. */
#include "coord_job.h"

#include <stdio.h>
#include <string.h>

int coord_job_cand_index(const coord_job *jb, const char *d)
{
    for (int i = 0; i < jb->ncand; i++)
        if (!strcmp(jb->cand[i].id, d))
            return i;
    return -1;
}

int coord_job_stage_of(const coord_job *jb, const char *d)
{
    for (int i = 0; i < jb->plan.p; i++)
        if (!strcmp(jb->plan.stage_dev[i], d))
            return i;
    return -1;
}

const char *coord_job_cand_links(const coord_job *jb, const char *device)
{
    int k = coord_job_cand_index(jb, device);
    return k >= 0 ? jb->cand[k].links : NULL;
}

int coord_job_cand_usable(const coord_job *jb, int k, const coord_devs *devs, int64_t now_s)
{
    const coord_cand *c = &jb->cand[k];
    const coord_dev *d = coord_devs_find(devs, c->id);
    return c->result && !c->failed && !c->lost_ms && d && coord_dev_online(devs, d, now_s) &&
           d->address[0] && d->has_key;
}

int coord_job_rejoin_source(const coord_job *jb)
{
    for (int r = 0; r < jb->plan.nrep; r++)
        if (!jb->plan.away[r] && !jb->plan.rejoin[r])
            return r;
    return 0;
}

int coord_job_owner_index(const coord_job *jb, const char *device)
{
    for (int i = 0; i < jb->nowner; i++)
        if (!strcmp(jb->owner[i].id, device))
            return i;
    return -1;
}

int coord_job_checked(const coord_job *jb)
{
    int all = jb->nowner > 0;
    for (int i = 0; i < jb->nowner; i++)
        all &= jb->owner[i].data_info != NULL;
    return all;
}

double coord_job_step_loss(const coord_job *jb, const coord_step_rep *rep)
{
    const coord_job_plan *pl = &jb->plan;
    if (pl->nrep <= 1)
        return rep[pl->p - 1].loss;
    /* each replica's last stage holds its loss; weighed by its sequences,
     * over the replicas present (as their outer steps are) */
    double loss = 0, total = 0;
    int all = 1;
    for (int r = 0; r < pl->nrep; r++) {
        all &= !pl->away[r];
        total += pl->away[r] ? 0 : jb->owner[r].batch;
    }
    for (int r = 0; r < pl->nrep; r++)
        if (!pl->away[r])
            loss += (double)jb->owner[r].batch / (all ? jb->batch : total) *
                    rep[pl->rep_first[r + 1] - 1].loss;
    return loss;
}

int coord_name_ok(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

/* data.DEVICE.json: DEVICE's name, else NULL. */
static int data_part_of(const char *s, char *dev, size_t cap)
{
    size_t n = strlen(s);
    if (n < 11 || n > 80 || strncmp(s, "data.", 5) || strcmp(s + n - 5, ".json"))
        return 0;
    snprintf(dev, cap, "%.*s", (int)(n - 10), s + 5);
    return coord_name_ok(dev, 60) && !strchr(dev, '.');
}

int coord_part_name_ok(const char *s)
{
    char dev[80];
    if (!strcmp(s, "data.json") || data_part_of(s, dev, sizeof dev))
        return 1;
    size_t n = strlen(s);
    /* model.TAG, optim.TAG and a federation's fed.TAG (its sync state) */
    size_t pre = !strncmp(s, "fed.", 4) ? 4 : 6;
    if (n < pre + 14 || n > 80 || strcmp(s + n - 12, ".safetensors") ||
        (strncmp(s, "model.", 6) && strncmp(s, "optim.", 6) && strncmp(s, "fed.", 4)))
        return 0;
    char tag[80];
    snprintf(tag, sizeof tag, "%.*s", (int)(n - pre - 12), s + pre);
    return coord_name_ok(tag, 60) && !strchr(tag, '.');
}

int coord_part_is_of(const coord_job *jb, const char *name, const char *device)
{
    char dev[80];
    if (!strcmp(name, "data.json"))
        return jb->nowner == 1 && !strcmp(device, jb->owner[0].id);
    if (data_part_of(name, dev, sizeof dev))
        return jb->nowner > 1 && !strcmp(dev, device) && coord_job_owner_index(jb, device) >= 0;
    size_t n = strlen(device);
    const char *tag = name + (!strncmp(name, "fed.", 4) ? 4 : 6); /* model., optim. or fed. */
    if (!strncmp(name, "fed.", 4) && jb->nowner < 2)
        return 0;
    if (strncmp(tag, device, n))
        return 0;
    if (!strcmp(tag + n, ".safetensors"))
        return 1;
    if (strncmp(tag + n, "-u", 2) || !(tag[n + 2] >= '0' && tag[n + 2] <= '9'))
        return 0;
    const char *d = tag + n + 2;
    while (*d >= '0' && *d <= '9')
        d++;
    return !strcmp(d, ".safetensors");
}

int coord_job_nunits(const coord_job *jb)
{
    int n = 0;
    for (int i = 0; i < jb->plan.p && jb->plan.last_unit; i++)
        n = jb->plan.last_unit[i] + 1 > n ? jb->plan.last_unit[i] + 1 : n;
    return n;
}

void coord_job_units_of(const coord_job *jb, const char *device, uint8_t *units, int nunits)
{
    memset(units, 0, (size_t)nunits);
    for (int i = 0; i < jb->plan.p && jb->plan.first_unit; i++)
        if (!strcmp(jb->plan.stage_dev[i], device))
            for (int u = jb->plan.first_unit[i]; u <= jb->plan.last_unit[i] && u < nunits; u++)
                if (u >= 0)
                    units[u] = 1;
}

void coord_job_fetch_units(const coord_job *jb, const char *device, uint8_t *units, int nunits)
{
    coord_job_units_of(jb, device, units, nunits);
    if (nunits > 1 && units[nunits - 1] && !units[0] && !jb->opts.u_shape)
        units[0] = 1;
}

int coord_job_upload_check(const coord_job *jb, const char *device, int epoch, int step,
                           const char *name)
{
    /* a name that is not the device's own is refused whatever the job's state */
    if (coord_job_stage_of(jb, device) < 0 || !coord_part_name_ok(name) || step < 1 ||
        step > jb->steps || !coord_part_is_of(jb, name, device))
        return COORD_UPLOAD_REFUSED;
    if (jb->state != COORD_JOB_RUNNING || epoch != jb->epoch)
        return COORD_UPLOAD_NOT_RUNNING;
    if (step <= jb->committed)
        return COORD_UPLOAD_COMMITTED;
    if (jb->epoch_pending)
        return COORD_UPLOAD_LATER;
    return COORD_UPLOAD_OK;
}

int coord_job_commit_wanted(const coord_job *jb, int epoch, int step)
{
    return jb->committing == step && jb->epoch == epoch && jb->state == COORD_JOB_RUNNING;
}

int coord_job_stage_replica(const coord_job *jb, int s)
{
    for (int r = 0; r < jb->plan.nrep; r++)
        if (s >= jb->plan.rep_first[r] && s < jb->plan.rep_first[r + 1])
            return r;
    return 0;
}

int coord_job_neighbours(const coord_job *jb, const char *a, const char *b)
{
    for (int i = 0; i < jb->plan.p; i++) {
        if (strcmp(jb->plan.stage_dev[i], a))
            continue;
        /* within its replica's chain: the stages next to it, and the
         * chain's other end (labels, the tied gradient) */
        int r = coord_job_stage_replica(jb, i);
        int lo = jb->plan.nrep ? jb->plan.rep_first[r] : 0;
        int hi = jb->plan.nrep ? jb->plan.rep_first[r + 1] - 1 : jb->plan.p - 1;
        int nb[3] = {i - 1, i + 1, i == lo ? hi : i == hi ? lo : -1};
        for (int k = 0; k < 3; k++)
            if (nb[k] >= lo && nb[k] <= hi && nb[k] != i && !strcmp(jb->plan.stage_dev[nb[k]], b))
                return 1;
    }
    return 0;
}

int coord_job_member(const coord_job *jb, const char *device)
{
    return (coord_job_owner_index(jb, device) >= 0 ? COORD_MEMBER_OWNER : 0) |
           (coord_job_cand_index(jb, device) >= 0 ? COORD_MEMBER_CAND : 0) |
           (coord_job_stage_of(jb, device) >= 0 ? COORD_MEMBER_STAGE : 0);
}

int coord_job_tasks(const coord_job *jb, const char *device, int64_t now_ms,
                    coord_task_want out[2])
{
    int n = 0, k = coord_job_cand_index(jb, device), running = jb->state == COORD_JOB_RUNNING;
    int64_t now = now_ms / 1000;
    int profiling = jb->state == COORD_JOB_PROFILING;
    int profile = k >= 0 && !jb->cand[k].result &&
                  (profiling || (jb->cand[k].joining && (running || jb->state == COORD_JOB_WAITING)));
    /* profiling: the candidates measure their links first (assign_links),
     * and time their units once all have (so that no device computes while
     * others measure their links to it); a joiner does both at once */
    int round = profiling ? jb->profile_round : COORD_PROFILE_BOTH;
    if (profile && round == COORD_PROFILE_LINKS && jb->cand[k].links)
        profile = 0;
    int o = coord_job_owner_index(jb, device);
    if (jb->state == COORD_JOB_CHECKING && o >= 0 && !jb->owner[o].data_info) {
        out[n++] = (coord_task_want){COORD_TASK_CHECK, jb->epoch, -1, 0};
    } else if (running && coord_job_stage_of(jb, device) >= 0) {
        out[n++] = (coord_task_want){COORD_TASK_RUN, jb->epoch, -1, 0};
    } else if (coord_job_state_final(jb->state)) {
        if (jb->plan.p && (k >= 0 || coord_job_stage_of(jb, device) >= 0) &&
            now - jb->ended < jb->policy.ended_task_s)
            out[n++] = (coord_task_want){COORD_TASK_STOP, jb->epoch + 1, -1, 0};
    } else if (k >= 0 && jb->epoch > 0) {
        /* recovering, waiting, re-planning, or not in this epoch's plan */
        out[n++] = (coord_task_want){COORD_TASK_STOP, running ? jb->epoch : jb->epoch + 1, -1, 0};
    }
    if (profile)
        out[n++] = (coord_task_want){COORD_TASK_PROFILE, jb->epoch, k, round};
    return n;
}

int coord_job_pingers(const coord_job *jb, const char *device, int64_t now_ms, int *out, int max)
{
    int k = coord_job_cand_index(jb, device), n = 0;
    for (int i = 0; k >= 0 && i < jb->ncand && n < max; i++) {
        coord_task_want w[2];
        int nw = coord_job_tasks(jb, jb->cand[i].id, now_ms, w), asked = 0, names = 0;
        for (int x = 0; x < nw; x++)
            asked |= w[x].kind == COORD_TASK_PROFILE && w[x].round != COORD_PROFILE_UNITS;
        for (int x = 0; asked && i != k && x < jb->cand[i].nmeasure; x++)
            names |= jb->cand[i].measure[x] == k;
        if (names)
            out[n++] = i;
    }
    return n;
}
