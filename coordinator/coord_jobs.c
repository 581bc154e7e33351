/* coord_jobs.c - the job manager's driver (coord_jobs_int.h): the devices as
 * their heartbeats describe them, their tasks, the queue of each job's
 * effects and what runs them, the engine (the clock's events and the
 * plans), reading jobs back at a restart, and the snapshot observers read.
 *
 * What a job does and when is decided by its state machine (coord_job.c);
 * here is only how: SQLite through the job store (coord_jobstore.c), files
 * through the checkpoint store (coord_ckpt.c), the balancer through the
 * planning driver (coord_plan.c). */
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bal.h"
#include "coord_jobs_int.h"
#include "coord_plan.h"
#include "skyloom.pb-c.h"
#include "sl_buf.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

_Static_assert(COORD_JOB_ID_LEN >= 18 && COORD_SITE_LEN == CERT_SITE_MAX + 1,
               "the state machine's sizes are the PKI's");

static char *path_of(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

/* ---- jobs ------------------------------------------------------------------------ */

static void meta_clear(cjob *jb);

cjob *coord_jobs_wrap(coord_jobs *j, coord_job *sm)
{
    cjob *jb = sl_xcalloc(1, sizeof *jb);
    jb->sm = *sm;
    memset(sm, 0, sizeof *sm);
    jb->sm.policy = j->policy;
    jb->obs = coord_jobobs_new();
    bal_bert b;
    bal_unit *u = NULL;
    int nu = 0;
    sl_err err = {0};
    if (!bal_bert_parse(&b, jb->sm.config, "config.json", &err)) {
        jb->layers = b.layers;
        jb->hidden = b.hidden;
        if (!bal_bert_units(&b, 1, 1, &u, &nu, &err))
            for (int i = 0; i < nu; i++)
                jb->model_bytes += u[i].param_bytes;
    }
    free(u);
    jb->name = sl_xstrdup("");
    char *dir = path_of(j->root, jb->sm.id);
    jb->ck = coord_ckpt_new(dir, j->fileops);
    free(dir);
    pthread_mutex_init(&jb->io_mu, NULL);
    return jb;
}

void coord_jobs_job_free(cjob *jb)
{
    if (!jb)
        return;
    coord_job_free(&jb->sm);
    coord_jobobs_free(jb->obs);
    coord_ckpt_free(jb->ck);
    coord_fx_list_free(&jb->fxq);
    pthread_mutex_destroy(&jb->io_mu);
    meta_clear(jb);
    free(jb);
}

static void meta_clear(cjob *jb)
{
    for (int i = 0; i < jb->ntags; i++)
        free(jb->tags[i]);
    free(jb->tags);
    jb->tags = NULL;
    jb->ntags = 0;
    free(jb->name);
    jb->name = NULL;
}

void coord_jobs_set_meta(cjob *jb, const char *meta)
{
    meta_clear(jb);
    json_error_t je;
    json_t *m = meta && *meta ? json_loads(meta, 0, &je) : NULL;
    const char *name = json_string_value(json_object_get(m, "name"));
    jb->name = sl_xstrdup(name ? name : "");
    json_t *tags = json_object_get(m, "tags"), *t;
    size_t i;
    jb->tags = sl_xcalloc(json_array_size(tags) + 1, sizeof *jb->tags);
    json_array_foreach(tags, i, t) if (json_is_string(t)) jb->tags[jb->ntags++] =
        sl_xstrdup(json_string_value(t));
    if (meta) /* read back: the stop the operator asked for survives a restart */
        jb->sm.stop_at_commit = json_is_true(json_object_get(m, "stop_at_checkpoint"));
    json_decref(m);
}

/* The jobs row's meta JSON (j->mu held). */
static char *meta_text(const cjob *jb)
{
    json_t *tags = json_array();
    for (int i = 0; i < jb->ntags; i++)
        json_array_append_new(tags, json_string(jb->tags[i]));
    json_t *m = json_pack("{s:s, s:o, s:b}", "name", jb->name ? jb->name : "", "tags", tags,
                          "stop_at_checkpoint", jb->sm.stop_at_commit);
    char *t = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(m);
    return t ? t : sl_xstrdup("");
}

int coord_jobs_refused(const coord_job *sm)
{
    int checked = 0;
    for (int o = 0; o < sm->nowner; o++)
        checked |= sm->owner[o].data_info != NULL;
    return sm->state == COORD_JOB_FAILED && !checked && !sm->plan.text;
}

cjob *coord_jobs_find(coord_jobs *j, const char *id)
{
    cjob *found = NULL;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->njob && !found; i++)
        if (!strcmp(j->job[i]->sm.id, id))
            found = j->job[i];
    pthread_mutex_unlock(&j->mu);
    return found;
}

void coord_jobs_add(coord_jobs *j, cjob *jb)
{
    j->job = sl_xrealloc(j->job, (size_t)(j->njob + 1) * sizeof *j->job);
    j->job[j->njob++] = jb;
    pthread_cond_broadcast(&j->cv);
}

int coord_jobs_settled(const coord_jobs *j) { return sl_unix_ms() >= j->settle_ms; }

void coord_jobs_denied(coord_jobs *j, int reason)
{
    pthread_mutex_lock(&j->mu);
    j->denied[reason]++;
    pthread_mutex_unlock(&j->mu);
}

const char *coord_denial_name(int reason)
{
    static const char *const names[COORD_DENY_N] = {"not_member", "not_neighbour", "not_own_part",
                                                    "quota", "fetch_not_own_units"};
    return reason >= 0 && reason < COORD_DENY_N ? names[reason] : "?";
}

void coord_jobs_set_fileops(coord_jobs *j, const coord_fileops *ops)
{
    pthread_mutex_lock(&j->mu);
    j->fileops = ops;
    int n = j->njob;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&j->mu);
        cjob *jb = j->job[i];
        pthread_mutex_unlock(&j->mu);
        pthread_mutex_lock(&jb->io_mu);
        coord_ckpt_set_ops(jb->ck, ops);
        pthread_mutex_unlock(&jb->io_mu);
    }
}

void coord_jobs_set_policy(coord_jobs *j, const coord_job_policy *p)
{
    pthread_mutex_lock(&j->mu);
    j->policy = *p;
    for (int i = 0; i < j->njob; i++)
        j->job[i]->sm.policy = *p;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ---- devices as their heartbeats describe them ---------------------------------- */

coord_devs coord_jobs_devs(const coord_jobs *j)
{
    return (coord_devs){j->dev, j->ndev, j->c->o.heartbeat_ms};
}

static coord_dev *find_dev(coord_jobs *j, const char *id)
{
    for (int i = 0; i < j->ndev; i++)
        if (!strcmp(j->dev[i].id, id))
            return &j->dev[i];
    return NULL;
}

void coord_jobs_seen(coord_jobs *j, const coord_seen *s, int64_t now)
{
    /* a device new to the view: its site from the registry, outside the lock */
    pthread_mutex_lock(&j->mu);
    int known = find_dev(j, s->id) != NULL;
    pthread_mutex_unlock(&j->mu);
    char ids[1][CERT_ID_LEN], sites[1][CERT_SITE_MAX + 1] = {""};
    sl_err err = {0};
    if (!known) {
        snprintf(ids[0], sizeof ids[0], "%s", s->id);
        if (coord_jobstore_sites(j->store, ids, sites, 1, &err))
            sl_log_warn("coordinator: a device's site is unknown", "device=%s reason=\"%s\"", s->id,
                        err.msg);
    }
    pthread_mutex_lock(&j->mu);
    coord_dev *d = find_dev(j, s->id);
    if (!d) {
        if (j->ndev == j->capdev) {
            j->capdev = j->capdev ? 2 * j->capdev : 16;
            j->dev = sl_xrealloc(j->dev, (size_t)j->capdev * sizeof *j->dev);
        }
        d = &j->dev[j->ndev++];
        memset(d, 0, sizeof *d);
        snprintf(d->id, sizeof d->id, "%s", s->id);
    }
    if (!d->site[0])
        snprintf(d->site, sizeof d->site, "%s", sites[0]);
    snprintf(d->address, sizeof d->address, "%s", s->stage_address ? s->stage_address : "");
    for (int i = 0; i < d->n_datasets; i++)
        free(d->datasets[i]);
    free(d->datasets);
    d->datasets = sl_xcalloc(s->n_datasets + 1, sizeof *d->datasets);
    d->n_datasets = 0;
    for (size_t i = 0; i < s->n_datasets; i++)
        if (strlen(s->datasets[i]) <= 64)
            d->datasets[d->n_datasets++] = sl_xstrdup(s->datasets[i]);
    if (s->link_key) {
        memcpy(d->key, s->link_key, 32);
        d->has_key = 1;
    }
    if (s->threads)
        d->threads = s->threads;
    if (s->memory_bytes)
        d->memory = s->memory_bytes;
    if (s->backend)
        snprintf(d->backend, sizeof d->backend, "%s", s->backend);
    d->policy = s->policy;
    d->seen = now;
    d->seen_ms = sl_unix_ms();
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void coord_jobs_revoked(coord_jobs *j, const char *device_id)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->ndev; i++)
        if (!strcmp(j->dev[i].id, device_id))
            j->dev[i].revoked = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void coord_jobs_ds_record(coord_jobs *j, const char *device, const char *dataset, const char *info,
                          const char *job, int64_t at)
{
    json_error_t je;
    json_t *o = info ? json_loads(info, 0, &je) : NULL;
    if (!o)
        return;
    coord_dsdesc *d = NULL;
    for (int i = 0; i < j->nds && !d; i++)
        if (!strcmp(j->ds[i].device, device) && !strcmp(j->ds[i].name, dataset))
            d = &j->ds[i];
    if (!d) {
        j->ds = sl_xrealloc(j->ds, (size_t)(j->nds + 1) * sizeof *j->ds);
        d = &j->ds[j->nds++];
    } else if (d->at > at) {
        json_decref(o);
        return; /* an older job's, read back after a newer one */
    }
    memset(d, 0, sizeof *d);
    snprintf(d->device, sizeof d->device, "%s", device);
    snprintf(d->name, sizeof d->name, "%s", dataset);
    snprintf(d->job, sizeof d->job, "%s", job);
    json_int_t n = json_integer_value(json_object_get(o, "shard_sequences"));
    d->sequences = (uint64_t)(n > 0 ? n : json_integer_value(json_object_get(o, "sequences")));
    d->seq_len = (int)json_integer_value(json_object_get(o, "seq_len"));
    d->vocab_size = (int)json_integer_value(json_object_get(o, "vocab_size"));
    const char *vh = json_string_value(json_object_get(o, "vocab_hash")),
               *sh = json_string_value(json_object_get(o, "shard_hash"));
    snprintf(d->vocab_hash, sizeof d->vocab_hash, "%s", vh ? vh : "");
    snprintf(d->shard_hash, sizeof d->shard_hash, "%s", sh ? sh : "");
    d->at = at;
    json_decref(o);
}

static char *dup0(const char *s) { return sl_xstrdup(s ? s : ""); }

void coord_jobs_datasets(coord_jobs *j, const char *device, Skyloom__V1__DatasetInfo ***out,
                         size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    const coord_dev *d = find_dev(j, device);
    int nd = d ? d->n_datasets : 0;
    Skyloom__V1__DatasetInfo **v = sl_xcalloc((size_t)nd + 1, sizeof *v);
    for (int i = 0; i < nd; i++) {
        Skyloom__V1__DatasetInfo *x = sl_xmalloc(sizeof *x);
        skyloom__v1__dataset_info__init(x);
        x->name = dup0(d->datasets[i]);
        const coord_dsdesc *c = NULL;
        for (int k = 0; k < j->nds && !c; k++)
            if (!strcmp(j->ds[k].device, device) && !strcmp(j->ds[k].name, d->datasets[i]))
                c = &j->ds[k];
        x->sequences = c ? c->sequences : 0;
        x->seq_len = c ? (uint32_t)c->seq_len : 0;
        x->vocab_size = c ? (uint32_t)c->vocab_size : 0;
        x->vocab_hash = dup0(c ? c->vocab_hash : "");
        x->shard_hash = dup0(c ? c->shard_hash : "");
        x->checked_at = c ? c->at : 0;
        x->job_id = dup0(c ? c->job : "");
        v[i] = x;
    }
    pthread_mutex_unlock(&j->mu);
    *out = v;
    *n = (size_t)nd;
}

void coord_jobs_datasets_free(Skyloom__V1__DatasetInfo **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i]->name);
        free(v[i]->vocab_hash);
        free(v[i]->shard_hash);
        free(v[i]->job_id);
        free(v[i]);
    }
    free(v);
}

/* ---- tasks ------------------------------------------------------------------------- */

typedef struct task_list {
    Skyloom__V1__Task **v;
    size_t n, cap;
} task_list;

static void add_task(task_list *l, const coord_job *jb, const char *kind, int epoch, json_t *spec)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 4;
        l->v = sl_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    Skyloom__V1__Task *t = sl_xmalloc(sizeof *t);
    skyloom__v1__task__init(t);
    t->job_id = sl_xstrdup(jb->id);
    t->kind = sl_xstrdup(kind);
    t->epoch = (uint32_t)epoch;
    t->spec = spec ? json_dumps(spec, JSON_COMPACT) : sl_xstrdup("{}");
    json_decref(spec);
    l->v[l->n++] = t;
}

/* The check of owner o: its dataset read as its replica will read it. */
static json_t *check_spec(const coord_job *jb, int o)
{
    json_error_t je;
    json_t *cfg = json_loads(jb->config, 0, &je);
    json_t *s = json_pack("{s:s, s:O, s:i, s:I, s:I, s:b, s:b, s:s}", "dataset",
                          jb->owner[o].dataset, "config", cfg, "batch", jb->owner[o].batch, "first",
                          (json_int_t)jb->opts.first, "sequences", (json_int_t)jb->opts.sequences,
                          "sealed", jb->opts.sealed, "u_shape", jb->opts.u_shape, "task",
                          jb->opts.task);
    if (jb->opts.vocab_hash[0]) /* the owner refuses a shard of another vocabulary */
        json_object_set_new(s, "vocab_hash", json_string(jb->opts.vocab_hash));
    json_decref(cfg);
    return s;
}

static const char *const profile_round_name[3] = {NULL, "links", "units"};

/* The profile task of candidate k. The peers are those it measures its
 * links to; in the units round none. */
static json_t *profile_spec(const coord_devs *devs, const coord_job *jb, int k, int round)
{
    json_error_t je;
    json_t *cfg = json_loads(jb->config, 0, &je), *peers = json_array();
    const coord_cand *c = &jb->cand[k];
    int n = round == COORD_PROFILE_UNITS ? 0 : c->nmeasure;
    for (int x = 0; x < n; x++) {
        int i = c->measure[x];
        const coord_dev *d = i != k && i < jb->ncand ? coord_devs_find(devs, jb->cand[i].id) : NULL;
        if (d)
            json_array_append_new(peers, json_pack("{s:s, s:s}", "id", d->id, "address", d->address));
    }
    json_t *s = json_pack("{s:o, s:i, s:i, s:o, s:i, s:s, s:s, s:s, s:s}", "config", cfg,
                          "micro_batch", coord_jobopts_profile_micro(&jb->opts), "seq", jb->seq, "peers",
                          peers, "ping_bytes", 1 << 20, "optimizer", jb->opts.optimizer,
                          "optim_state", jb->opts.optim_state, "precision", jb->opts.precision,
                          "task", jb->opts.task);
    if (round != COORD_PROFILE_BOTH)
        json_object_set_new(s, "round", json_string(profile_round_name[round]));
    return s;
}

void coord_jobs_tasks(coord_jobs *j, const char *device_id, void ***tasks, size_t *n)
{
    static const char *const kinds[] = {"check", "run", "stop", "profile"};
    task_list l = {0};
    int64_t now_ms = sl_unix_ms();
    pthread_mutex_lock(&j->mu);
    coord_devs devs = coord_jobs_devs(j);
    for (int i = 0; i < j->njob; i++) {
        const coord_job *jb = &j->job[i]->sm;
        coord_task_want want[2];
        int nw = coord_job_tasks(jb, device_id, now_ms, want);
        for (int w = 0; w < nw; w++) {
            json_t *spec = want[w].kind == COORD_TASK_CHECK
                               ? check_spec(jb, coord_job_owner_index(jb, device_id))
                           : want[w].kind == COORD_TASK_PROFILE ? profile_spec(&devs, jb, want[w].cand,
                                                                               want[w].round)
                           /* a device draining before it stops waits for this */
                           : want[w].kind == COORD_TASK_RUN ? json_pack("{s:i}", "committed_step",
                                                                        jb->committed)
                                                            : NULL;
            add_task(&l, jb, kinds[want[w].kind], want[w].epoch, spec);
        }
    }
    pthread_mutex_unlock(&j->mu);
    *tasks = (void **)l.v;
    *n = l.n;
}

void coord_jobs_pingers(coord_jobs *j, const char *device_id, char ***ids, size_t *n)
{
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    int64_t now_ms = sl_unix_ms();
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->njob; i++) {
        const coord_job *jb = &j->job[i]->sm;
        int who[64];
        int m = coord_job_pingers(jb, device_id, now_ms, who, 64);
        for (int x = 0; x < m; x++) {
            const char *id = jb->cand[who[x]].id;
            int dup = 0;
            for (size_t y = 0; y < *n && !dup; y++)
                dup = !strcmp((*ids)[y], id);
            if (dup)
                continue;
            if (*n == cap) {
                cap = cap ? 2 * cap : 8;
                *ids = sl_xrealloc(*ids, cap * sizeof **ids);
            }
            (*ids)[(*n)++] = sl_xstrdup(id);
        }
    }
    pthread_mutex_unlock(&j->mu);
}

void coord_jobs_tasks_free(void **tasks, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Skyloom__V1__Task *t = tasks[i];
        free(t->job_id);
        free(t->kind);
        free(t->spec);
        free(t);
    }
    free(tasks);
}

/* ---- effects ------------------------------------------------------------------------ */

void coord_jobs_queue(coord_jobs *j, cjob *jb, coord_fx_list *fx)
{
    int k = 0;
    for (int i = 0; i < fx->n; i++) {
        if (fx->v[i].kind == COORD_FX_PLAN) {
            jb->plan_req = fx->v[i].mode + 1;
            coord_fx_free(&fx->v[i]);
        } else {
            fx->v[k++] = fx->v[i];
        }
    }
    fx->n = k;
    if (fx->n || jb->plan_req)
        pthread_cond_broadcast(&j->cv);
    coord_fx_list_move(&jb->fxq, fx);
}

/* The owners as the jobs row keeps them: ids and datasets joined by
 * commas, data_info the one owner's description or (several owners) a JSON
 * array of them, null for one not in; all malloc'd. */
void coord_owners_row(const coord_job *jb, char **ids, char **datasets, char **data_info)
{
    sl_buf a = {0}, b = {0};
    for (int i = 0; i < jb->nowner; i++) {
        sl_buf_printf(&a, "%s%s", i ? "," : "", jb->owner[i].id);
        sl_buf_printf(&b, "%s%s", i ? "," : "", jb->owner[i].dataset);
    }
    *ids = a.s ? a.s : sl_xstrdup("");
    *datasets = b.s ? b.s : sl_xstrdup("");
    if (jb->nowner == 1) {
        *data_info = sl_xstrdup(jb->owner[0].data_info ? jb->owner[0].data_info : "");
        return;
    }
    int any = 0;
    json_t *arr = json_array();
    for (int i = 0; i < jb->nowner; i++) {
        json_error_t je;
        json_t *v = jb->owner[i].data_info ? json_loads(jb->owner[i].data_info, 0, &je) : NULL;
        any |= v != NULL;
        json_array_append_new(arr, v ? v : json_null());
    }
    *data_info = any ? json_dumps(arr, JSON_COMPACT) : sl_xstrdup("");
    json_decref(arr);
}

/* The owners from a jobs row (ids and datasets joined by commas) and the
 * options' owner_batch; 0, or -1 with why. */
int coord_owners_parse(const char *ids, const char *datasets, const coord_jobopts *o,
                       coord_owner *out, int *n, char *why, size_t cap)
{
    *n = 0;
    const char *a = ids, *b = datasets;
    while (*a) {
        size_t la = strcspn(a, ","), lb = strcspn(b, ",");
        if (*n == COORD_MAX_OWNERS || la == 0 || la >= COORD_DEV_ID_LEN || lb == 0 || lb > 64) {
            snprintf(why, cap, "owners '%.80s' or datasets '%.80s' unreadable", ids, datasets);
            return -1;
        }
        coord_owner *w = &out[(*n)++];
        memset(w, 0, sizeof *w);
        snprintf(w->id, sizeof w->id, "%.*s", (int)la, a);
        snprintf(w->dataset, sizeof w->dataset, "%.*s", (int)lb, b);
        a += la + (a[la] == ',');
        b += lb + (b[lb] == ',');
    }
    if (*n == 0 || *b) {
        snprintf(why, cap, "owners '%.80s' and datasets '%.80s' do not pair up", ids, datasets);
        return -1;
    }
    for (int i = 0; i < *n; i++)
        out[i].batch = *n == 1 ? o->batch : i < o->n_owner_batch ? o->owner_batch[i] : 0;
    if (*n > 1 && o->n_owner_batch != *n) {
        snprintf(why, cap, "%d owners, %d owner_batch entries", *n, o->n_owner_batch);
        return -1;
    }
    return 0;
}

/* The jobs row as the job is now (j->mu held); strings malloc'd. */
static void row_of(const coord_job *jb, coord_jobrow *r)
{
    memset(r, 0, sizeof *r);
    r->id = sl_xstrdup(jb->id);
    r->num = jb->num;
    r->state = sl_xstrdup(coord_job_state_name(jb->state));
    r->reason = sl_xstrdup(jb->reason);
    r->config = sl_xstrdup(jb->config);
    r->options = coord_jobopts_text(&jb->opts, 0);
    coord_owners_row(jb, &r->owner, &r->dataset, &r->data_info);
    r->plan = sl_xstrdup(jb->plan.text ? jb->plan.text : "");
    if (jb->plan.sig) {
        r->sig = sl_xmalloc(jb->plan.sig_len + 1);
        memcpy(r->sig, jb->plan.sig, jb->plan.sig_len);
        r->sig_len = jb->plan.sig_len;
    }
    r->epoch = jb->epoch;
    r->step = jb->step;
    r->committed = jb->committed;
    r->loss = jb->loss;
    r->created = jb->created;
}

static void save_row(coord_jobs *j, cjob *jb)
{
    coord_jobrow r;
    pthread_mutex_lock(&j->mu);
    row_of(&jb->sm, &r);
    r.meta = meta_text(jb);
    pthread_mutex_unlock(&j->mu);
    sl_err err = {0};
    if (coord_jobstore_save(j->store, &r, sl_unix_time(), &err))
        sl_log_error("coordinator: cannot record job", "job=%s reason=\"%s\"", r.id, err.msg);
    coord_jobrow_free(&r);
}

static void feed(coord_jobs *j, cjob *jb, coord_fx_list *fx)
{
    coord_jobs_queue(j, jb, fx);
    pthread_mutex_unlock(&j->mu);
}

static void run_commit(coord_jobs *j, cjob *jb, const coord_fx *f)
{
    sl_err err = {0};
    pthread_mutex_lock(&jb->io_mu);
    pthread_mutex_lock(&j->mu);
    int wanted = coord_job_commit_wanted(&jb->sm, f->epoch, f->step), was = jb->sm.committed;
    char *config = sl_xstrdup(jb->sm.config), optimizer[8], optim_state[8];
    snprintf(optimizer, sizeof optimizer, "%s", jb->sm.opts.optimizer);
    snprintf(optim_state, sizeof optim_state, "%s", jb->sm.opts.optim_state);
    pthread_mutex_unlock(&j->mu);
    int result = COORD_COMMIT_CANCELLED;
    if (wanted) {
        int rc = coord_ckpt_commit(jb->ck, f->step, config, optimizer, optim_state, &err) ||
                 coord_jobstore_set_committed(j->store, jb->sm.id, f->step, sl_unix_time(), &err);
        if (!rc && was > 0 && was != f->step) /* one committed step is kept */
            coord_ckpt_prune(jb->ck, was);
        result = rc ? COORD_COMMIT_FAILED : COORD_COMMIT_OK;
    }
    pthread_mutex_unlock(&jb->io_mu);
    free(config);
    coord_fx_list fx = {0};
    pthread_mutex_lock(&j->mu);
    if (result == COORD_COMMIT_OK)
        coord_jobobs_commit(jb->obs, f->step);
    coord_job_commit_done(&jb->sm, f->step, result, err.msg, sl_unix_ms(), &fx);
    feed(j, jb, &fx);
}

static void run_effect(coord_jobs *j, cjob *jb, const coord_fx *f)
{
    const char *id = jb->sm.id; /* never changes */
    sl_err err = {0};
    switch (f->kind) {
    case COORD_FX_SAVE:
        save_row(j, jb);
        break;
    case COORD_FX_STATE:
        save_row(j, jb);
        if (f->text && *f->text)
            sl_log_info("coordinator: job", "job=%s state=%s reason=\"%s\"", id,
                        coord_job_state_name(f->state), f->text);
        else
            sl_log_info("coordinator: job", "job=%s state=%s", id, coord_job_state_name(f->state));
        break;
    case COORD_FX_EVENT:
        if (coord_jobstore_event(j->store, id, f->at_ms, f->epoch, f->step, f->committed, f->name,
                                 f->device, f->text, &err))
            sl_log_error("coordinator: cannot record a job event", "job=%s kind=%s reason=\"%s\"",
                         id, f->name, err.msg);
        sl_log_info("coordinator: job event", "job=%s kind=%s device=%s epoch=%d committed=%d "
                    "detail=\"%s\"", id, f->name, f->device[0] ? f->device : "-", f->epoch,
                    f->committed, f->text);
        break;
    case COORD_FX_LOG:
        sl_log(f->level, f->name, "%s", f->text ? f->text : "");
        break;
    case COORD_FX_PROFILE:
        if (coord_jobstore_profile(j->store, id, f->device, f->text, sl_unix_time(), &err))
            sl_log_error("coordinator: cannot record a profile", "job=%s device=%s reason=\"%s\"", id,
                         f->device, err.msg);
        break;
    case COORD_FX_COMMIT:
        run_commit(j, jb, f);
        break;
    case COORD_FX_METRICS: {
        /* a step's row lost would leave a committed step without it: the
         * store failed, and the steps after the committed one run again */
        pthread_mutex_lock(&jb->io_mu);
        int rc = coord_ckpt_metrics_append(jb->ck, f, &err);
        pthread_mutex_unlock(&jb->io_mu);
        if (rc) {
            coord_fx_list fx = {0};
            pthread_mutex_lock(&j->mu);
            if (jb->sm.epoch == f->epoch)
                coord_job_store_failed(&jb->sm, f->step, err.msg, sl_unix_ms(), &fx);
            feed(j, jb, &fx);
        }
        break;
    }
    case COORD_FX_EPOCH: {
        pthread_mutex_lock(&jb->io_mu);
        coord_ckpt_drop_partials(jb->ck);
        double loss = 0;
        int rc = coord_ckpt_metrics_truncate(jb->ck, f->committed, &loss, &err);
        pthread_mutex_unlock(&jb->io_mu);
        coord_fx_list fx = {0};
        pthread_mutex_lock(&j->mu);
        coord_job_epoch_ready(&jb->sm, f->epoch, loss, rc ? err.msg : NULL, sl_unix_ms(), &fx);
        feed(j, jb, &fx);
        break;
    }
    case COORD_FX_PLAN:
        break;
    }
}

void coord_jobs_drain(coord_jobs *j, cjob *jb)
{
    pthread_mutex_lock(&j->mu);
    while (jb->draining || jb->fxq.n) {
        if (jb->draining) {
            pthread_cond_wait(&j->fx_cv, &j->mu);
            continue;
        }
        coord_fx f = jb->fxq.v[0];
        memmove(jb->fxq.v, jb->fxq.v + 1, (size_t)(jb->fxq.n - 1) * sizeof *jb->fxq.v);
        jb->fxq.n--;
        jb->draining = 1;
        pthread_mutex_unlock(&j->mu);
        run_effect(j, jb, &f);
        coord_fx_free(&f);
        pthread_mutex_lock(&j->mu);
        jb->draining = 0;
        pthread_cond_broadcast(&j->fx_cv);
    }
    pthread_mutex_unlock(&j->mu);
}

/* ---- the engine ------------------------------------------------------------------------ */

/* Runs job jb's plan request (j->mu not held). */
static void run_plan(coord_jobs *j, cjob *jb)
{
    pthread_mutex_lock(&j->mu);
    int mode = jb->plan_req - 1;
    jb->plan_req = 0;
    coord_devs devs = coord_jobs_devs(j);
    coord_plan_in *in = coord_plan_in_of(&jb->sm, &devs, mode != COORD_PLAN_FIRST, sl_unix_time());
    pthread_mutex_unlock(&j->mu);
    coord_plan_result r;
    coord_plan_make(in, j->store, j->c->pki, &r);
    coord_plan_in_free(in);
    coord_fx_list fx = {0};
    pthread_mutex_lock(&j->mu);
    coord_job_plan_done(&jb->sm, mode, &r, sl_unix_ms(), &fx);
    feed(j, jb, &fx);
    coord_jobs_drain(j, jb);
}

/* One pass: every job's tick, then its effects and its plan. */
static void engine_pass(coord_jobs *j)
{
    int64_t now_ms = sl_unix_ms();
    int settled = now_ms >= j->settle_ms;
    coord_devs devs = coord_jobs_devs(j);
    for (int i = 0; i < j->njob; i++) {
        coord_fx_list fx = {0};
        coord_job_tick(&j->job[i]->sm, &devs, settled, now_ms, &fx);
        coord_jobs_queue(j, j->job[i], &fx);
    }
    for (int i = 0; i < j->njob && !j->stop; i++) {
        cjob *jb = j->job[i];
        if (!jb->fxq.n && !jb->plan_req)
            continue;
        pthread_mutex_unlock(&j->mu);
        coord_jobs_drain(j, jb);
        pthread_mutex_lock(&j->mu);
        if (jb->plan_req) {
            pthread_mutex_unlock(&j->mu);
            run_plan(j, jb);
            pthread_mutex_lock(&j->mu);
        }
    }
}

static void *engine_main(void *arg)
{
    coord_jobs *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stop) {
        engine_pass(j);
        if (j->stop)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* ---- reading the jobs back ---------------------------------------------------------------- */

typedef struct load_ctx {
    coord_jobs *j;
    sl_err *err;
} load_ctx;

static int load_profile(void *ud, const char *device, const char *result)
{
    coord_job *jb = ud;
    json_error_t je;
    json_t *res = json_loads(result, 0, &je);
    if (!res)
        return 0;
    int k = coord_job_cand_index(jb, device);
    if (k < 0) {
        jb->cand = sl_xrealloc(jb->cand, (size_t)(jb->ncand + 1) * sizeof *jb->cand);
        k = jb->ncand++;
        memset(&jb->cand[k], 0, sizeof jb->cand[k]);
        snprintf(jb->cand[k].id, sizeof jb->cand[k].id, "%s", device);
    }
    free(jb->cand[k].result);
    jb->cand[k].result = sl_xstrdup(result);
    jb->cand[k].failed = json_object_get(res, "failed") != NULL;
    json_decref(res);
    return 0;
}

/* The candidates' profiles of a job and their sites, the data owner first
 * (the job not yet shared with other threads, or a copy of it). */
static int load_profiles(coord_jobs *j, coord_job *jb, sl_err *err)
{
    if (coord_jobstore_load_profiles(j->store, jb->id, jb->owner[0].id, load_profile, jb, err))
        return -1;
    char (*ids)[CERT_ID_LEN] = sl_xcalloc((size_t)jb->ncand + 1, sizeof *ids);
    char (*sites)[CERT_SITE_MAX + 1] = sl_xcalloc((size_t)jb->ncand + 1, sizeof *sites);
    for (int i = 0; i < jb->ncand; i++)
        snprintf(ids[i], sizeof ids[i], "%s", jb->cand[i].id);
    sl_err e2 = {0};
    if (!coord_jobstore_sites(j->store, ids, sites, jb->ncand, &e2))
        for (int i = 0; i < jb->ncand; i++)
            snprintf(jb->cand[i].site, sizeof jb->cand[i].site, "%s", sites[i]);
    free(ids);
    free(sites);
    return 0;
}

int coord_jobs_load_profiles(coord_jobs *j, cjob *c, sl_err *err)
{
    coord_job tmp;
    memset(&tmp, 0, sizeof tmp);
    pthread_mutex_lock(&j->mu);
    snprintf(tmp.id, sizeof tmp.id, "%s", c->sm.id);
    tmp.nowner = 1;
    snprintf(tmp.owner[0].id, sizeof tmp.owner[0].id, "%s", c->sm.owner[0].id);
    pthread_mutex_unlock(&j->mu);
    if (load_profiles(j, &tmp, err)) {
        coord_job_free(&tmp);
        return -1;
    }
    pthread_mutex_lock(&j->mu);
    if (c->sm.ncand == 0) { /* swap the candidates in: tmp frees the job's empty list */
        coord_cand *v = c->sm.cand;
        int n = c->sm.ncand;
        c->sm.cand = tmp.cand;
        c->sm.ncand = tmp.ncand;
        tmp.cand = v;
        tmp.ncand = n;
    }
    pthread_mutex_unlock(&j->mu);
    coord_job_free(&tmp);
    return 0;
}

static int load_one(void *ud, coord_jobrow *r)
{
    load_ctx *x = ud;
    coord_jobs *j = x->j;
    coord_jobopts opts;
    char why[400];
    int state = coord_job_state_parse(r->state);
    if (coord_jobopts_parse(r->options, &opts, why, sizeof why) || state < 0) {
        sl_log_error("coordinator: job with unreadable options or state left out", "job=%s "
                     "reason=\"%s\"", r->id, state < 0 ? r->state : why);
        coord_jobopts_free(&opts);
        return 0;
    }
    coord_owner owners[COORD_MAX_OWNERS];
    int nowner;
    if (coord_owners_parse(r->owner, r->dataset, &opts, owners, &nowner, why, sizeof why)) {
        sl_log_error("coordinator: job with unreadable owners left out", "job=%s reason=\"%s\"",
                     r->id, why);
        coord_jobopts_free(&opts);
        return 0;
    }
    coord_job sm;
    coord_job_init(&sm, r->id, r->num, r->config, &opts, owners, nowner, sl_unix_ms());
    r->config = NULL;
    coord_jobopts_free(&opts);
    sm.state = (coord_job_state)state;
    snprintf(sm.reason, sizeof sm.reason, "%s", r->reason);
    sm.created = r->created;
    sm.epoch = r->epoch;
    sm.step = r->step;
    sm.committed = r->committed;
    sm.loss = r->loss;
    if (coord_job_state_final(sm.state))
        sm.ended = r->updated;
    if (*r->data_info) {
        json_error_t je;
        json_t *info = json_loads(r->data_info, 0, &je);
        for (int i = 0; i < sm.nowner; i++) {
            json_t *one = sm.nowner == 1 ? info : json_array_get(info, (size_t)i);
            if (json_is_object(one)) {
                sm.owner[i].data_info = sm.nowner == 1 ? sl_xstrdup(r->data_info)
                                                       : json_dumps(one, JSON_COMPACT);
                sm.seq = (int)json_integer_value(json_object_get(one, "seq_len"));
                coord_jobs_ds_record(j, sm.owner[i].id, sm.owner[i].dataset, sm.owner[i].data_info,
                                     r->id, r->created);
            }
        }
        json_decref(info);
    }
    if (*r->plan) {
        coord_job_plan pl;
        if (coord_plan_read(r->plan, r->sig, r->sig_len, &pl, x->err)) {
            r->plan = NULL;
            r->sig = NULL;
            sl_err_wrap(x->err, "job %s", r->id);
            coord_job_free(&sm);
            return -1;
        }
        r->plan = NULL;
        r->sig = NULL;
        coord_job_set_plan(&sm, &pl);
    }
    cjob *jb = coord_jobs_wrap(j, &sm);
    coord_jobs_set_meta(jb, r->meta);
    coord_jobs_add(j, jb);
    return 0;
}

static int load_jobs(coord_jobs *j, sl_err *err)
{
    load_ctx x = {j, err};
    if (coord_jobstore_load(j->store, load_one, &x, err))
        return -1;
    int64_t now_ms = sl_unix_ms();
    for (int i = 0; i < j->njob; i++) {
        cjob *jb = j->job[i];
        coord_job *sm = &jb->sm;
        double loss = 0;
        if (!coord_job_state_final(sm->state) && sm->plan.text && sm->state != COORD_JOB_CHECKING) {
            /* a job that had a plan goes on from its committed step */
            if (load_profiles(j, sm, err))
                return -1;
            coord_ckpt_drop_partials(jb->ck);
            sl_err terr = {0};
            if (coord_ckpt_metrics_truncate(jb->ck, sm->committed, &loss, &terr))
                sl_log_error("coordinator: cannot truncate metrics", "job=%s reason=\"%s\"",
                             sm->id, terr.msg);
        }
        coord_fx_list fx = {0};
        coord_job_restarted(sm, loss, now_ms, &fx);
        coord_jobs_queue(j, jb, &fx);
        coord_jobs_drain(j, jb);
    }
    return 0;
}

/* ---- open and close ------------------------------------------------------------------------- */

coord_jobs *coord_jobs_open(coord *c, sl_err *err)
{
    coord_jobs *j = sl_xcalloc(1, sizeof *j);
    j->c = c;
    j->policy = coord_job_policy_default();
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_cond_init(&j->fx_cv, NULL);
    j->root = path_of(c->o.state, "jobs");
    if (sodium_init() < 0) {
        sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
        goto fail;
    }
    char *up = path_of(j->root, "uploads");
    int bad = !(j->store = coord_jobstore_open(c->state, err)) || sl_mkdir(j->root, 0700, err) ||
              !(j->uploads = coord_uploads_open(up, err)) || load_jobs(j, err);
    free(up);
    if (bad)
        goto fail;
    if (coord_jobstore_devices_seen(j->store))
        j->settle_ms = sl_unix_ms() + 3 * (int64_t)c->o.heartbeat_ms + 2000;
    if (pthread_create(&j->engine, NULL, engine_main, j)) {
        sl_err_set(err, SL_ENOMEM, "cannot start the job engine");
        goto fail;
    }
    j->running = 1;
    return j;
fail:
    coord_jobs_close(j);
    return NULL;
}

void coord_jobs_close(coord_jobs *j)
{
    if (!j)
        return;
    if (j->running) {
        pthread_mutex_lock(&j->mu);
        j->stop = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        pthread_join(j->engine, NULL);
    }
    for (int i = 0; i < j->njob; i++)
        coord_jobs_drain(j, j->job[i]);
    for (int i = 0; i < j->njob; i++)
        coord_jobs_job_free(j->job[i]);
    free(j->job);
    for (int i = 0; i < j->ndev; i++) {
        for (int k = 0; k < j->dev[i].n_datasets; k++)
            free(j->dev[i].datasets[k]);
        free(j->dev[i].datasets);
    }
    free(j->dev);
    free(j->ds);
    coord_jobstore_close(j->store);
    coord_uploads_close(j->uploads);
    free(j->root);
    pthread_cond_destroy(&j->fx_cv);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* ---- the snapshot ---------------------------------------------------------------------------- */

_Static_assert(COORD_OBS_REPLICAS >= COORD_MAX_OWNERS, "a snapshot holds every replica");

static void obs_job_fill(const cjob *c, int detail, coord_obs_job *x)
{
    const coord_job *jb = &c->sm;
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", jb->id);
    snprintf(x->state, sizeof x->state, "%s", coord_job_state_name(jb->state));
    snprintf(x->reason, sizeof x->reason, "%s", jb->reason);
    snprintf(x->owner, sizeof x->owner, "%s", jb->owner[0].id);
    snprintf(x->dataset, sizeof x->dataset, "%s", jb->owner[0].dataset);
    x->steps = jb->steps;
    x->step = jb->step;
    x->committed = jb->committed;
    x->epoch = jb->epoch;
    x->p = jb->plan.p;
    x->batch = jb->batch;
    x->seq = jb->seq;
    x->loss = jb->loss;
    x->tokens_s = jb->tokens_s;
    x->step_s = jb->last ? jb->last_step_s : 0;
    x->created = jb->created;
    x->ended = jb->ended;
    snprintf(x->name, sizeof x->name, "%s", c->name ? c->name : "");
    x->layers = c->layers;
    x->hidden = c->hidden;
    x->refused = coord_jobs_refused(jb);
    x->devices_lost = jb->rec.n_lost;
    x->recoveries = jb->rec.n_recoveries;
    const coord_job_plan *pl = &jb->plan;
    for (int r = 0; pl->nrep > 1 && r < pl->nrep && r < jb->nowner && r < COORD_OBS_REPLICAS; r++) {
        coord_obs_replica *y = &x->rep[x->nrep++];
        snprintf(y->owner, sizeof y->owner, "%s", jb->owner[r].id);
        snprintf(y->dataset, sizeof y->dataset, "%s", jb->owner[r].dataset);
        y->first_stage = pl->rep_first[r];
        y->stages = pl->rep_first[r + 1] - pl->rep_first[r];
        sl_buf d = {0};
        for (int i = pl->rep_first[r]; i < pl->rep_first[r + 1]; i++)
            sl_buf_printf(&d, "%s%s", i > pl->rep_first[r] ? "," : "", pl->stage_dev[i]);
        y->devices = d.s ? d.s : sl_xstrdup("");
        y->have_loss = jb->last != NULL;
        y->loss = jb->last ? jb->last[pl->rep_first[r + 1] - 1].loss : 0;
    }
    coord_jobobs_fill(c->obs, detail, x);
    if (detail)
        x->plan = jb->plan.text ? sl_xstrdup(jb->plan.text) : NULL;
}

int coord_jobs_snapshot(coord_jobs *j, const char *id, coord_snapshot *s)
{
    memset(s, 0, sizeof *s);
    s->now = sl_unix_time();
    int rc = 0;
    pthread_mutex_lock(&j->mu);
    s->ndev = j->ndev;
    s->dev = sl_xcalloc((size_t)j->ndev + 1, sizeof *s->dev);
    for (int i = 0; i < j->ndev; i++) {
        coord_obs_dev *d = &s->dev[i];
        snprintf(d->id, sizeof d->id, "%s", j->dev[i].id);
        snprintf(d->backend, sizeof d->backend, "%s", j->dev[i].backend);
        d->threads = j->dev[i].threads;
        d->seen = j->dev[i].seen;
    }
    s->nrefused = j->nrefused;
    memcpy(s->refused, j->refused, sizeof s->refused);
    memcpy(s->denied, j->denied, sizeof s->denied);
    cjob *one = NULL;
    for (int i = 0; id && i < j->njob && !one; i++)
        if (!strcmp(j->job[i]->sm.id, id))
            one = j->job[i];
    if (id && !one) {
        rc = -1;
    } else {
        int n = one ? 1 : j->njob;
        s->job = sl_xcalloc((size_t)n + 1, sizeof *s->job);
        for (int i = 0; i < n; i++)
            obs_job_fill(one ? one : j->job[i], one != NULL, &s->job[s->njob++]);
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

void coord_snapshot_free(coord_snapshot *s)
{
    for (int i = 0; i < s->njob; i++) {
        free(s->job[i].stage);
        free(s->job[i].link);
        free(s->job[i].plan);
        for (int r = 0; r < s->job[i].nrep; r++)
            free(s->job[i].rep[r].devices);
        coord_trace_free(s->job[i].trace);
    }
    free(s->job);
    free(s->dev);
    memset(s, 0, sizeof *s);
}
