/* coord_jobs.c - federated pipeline jobs: a job is checked by its data
 * owner, its candidate devices profile themselves, the balancer plans it
 * (off the request thread), the coordinator signs the plan and hands it out
 * by epoch, devices train and report every step, and upload their
 * checkpoint parts; a step is committed when every part of it arrived.
 *
 * State: a job's row in SQLite (its own connection to coordinator.db) is
 * the truth for what must survive a restart (options, state, epoch, plan,
 * committed step), the profiles (job_profiles) and what recovery decided
 * (job_events); the rest (step reports, parts arriving, failure reports of
 * the epoch) lives here, under one mutex. Files: STATE/jobs/ID/ holds
 * config.json, the init model, metrics.csv and ckpt/step-N/ (committed)
 * and ckpt/step-N.partial/ (arriving).
 *
 * Recovery (docs/recovery.md): a device lost (its neighbours' reports, or
 * no heartbeat), a failure of the epoch, a coordinator restart or a failing
 * checkpoint store end the epoch; the engine re-plans over the devices left
 * in a new epoch from the committed step (or waits for the data owner), and
 * devices that come online are profiled and weighed at the next commit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bal.h"
#include "coord_internal.h"
#include "coord_obs.h"
#include "coord_state_internal.h"
#include "coord_upload.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

#define JOB_ID_LEN 18        /* "j" + 16 hex + NUL */
#define ACC_STEPS 32         /* steps whose reports may be in flight at once */
#define MAX_FILE (64ull << 30)
#define LINKS_WAIT_S 60      /* profiling: the units are asked for once every link is measured, or then */
#define PROFILE_WAIT_S 60    /* candidates whose units are not in this long after are left out */
#define CHECK_WAIT_S 120     /* the data owner must answer the check by then */
#define ENDED_TASK_S 600     /* how long devices are told to stop an ended job */
#define MAX_JOBS 4096
#define DECIDE_MS 1500       /* failure reports of one epoch gathered this long before deciding */
#define MAX_STALLS 3         /* recoveries in a row without a new committed step before failing */
#define STORE_RETRY_S 10     /* a job paused by its checkpoint store tries again after this */
#define WAIT_RETRY_S 5       /* a job waiting for devices re-plans this often */
#define LINK_SAMPLES 3       /* device pairs measured per pair of sites */

typedef struct cdev {
    char id[CERT_ID_LEN];
    char address[256];
    char **datasets;
    int n_datasets;
    uint8_t key[32];
    int has_key;
    unsigned threads;
    uint64_t memory;
    char backend[8];
    int64_t seen, seen_ms;
} cdev;

typedef struct stage_rep {
    int have;
    double loss, grad_norm, lr, fwd, bwd, recv, send, finish, step_s;
    uint64_t raw, wire, raw_up, wire_up, raw_side, wire_side;
    uint32_t masked;
} stage_rep;

typedef struct part {
    char name[96];
    uint64_t size;
    crypto_generichash_state hash; /* of the pieces written so far, in order */
    uint8_t sum[32]; /* BLAKE2b-256, checked when the last piece arrived */
    int done;
} part;

typedef struct upload {
    int step;
    part *parts;
    int n;
    int ready;                /* every part is in; committed once the step's reports are */
} upload;

/* A device the job may run on: its profile, and what recovery knows of it. */
typedef struct cand {
    char id[CERT_ID_LEN];
    json_t *result;           /* the profile for this job; NULL while one is asked */
    json_t *links;            /* its links, measured in the first round of profiling */
    int *measure, nmeasure;   /* the candidates whose links it measures in that round */
    int64_t lost_ms;          /* declared lost then (0: not lost) */
    int suspect, reported;    /* named by a failed neighbour; reported a failure (this epoch) */
    int joining;              /* came online during the job: weighed at the next commit */
} cand;

typedef struct cjob {
    char id[JOB_ID_LEN];
    uint64_t num;
    char state[16];
    char reason[512];
    char *config;
    json_t *opts;
    char owner[CERT_ID_LEN], dataset[65];
    json_t *data_info;
    int epoch;
    char *plan;
    uint8_t *sig;
    size_t sig_len;
    json_t *plan_json;
    int p, ndev;              /* stages and distinct devices of the plan */
    char (*stage_dev)[CERT_ID_LEN];
    int steps, step, committed, batch, seq;
    double loss, tokens_s;
    int64_t created, started, ended;
    int64_t check_since;      /* the data owner's check is waited for from then (submit or restart) */
    int profile_round;        /* profiling: 1 the links, 2 the units (PROFILE_*) */
    int64_t round_started;    /* when that round began */
    int ncand;
    cand *cand;
    stage_rep *acc;           /* [ACC_STEPS][p] */
    int acc_step[ACC_STEPS];
    int acc_done[ACC_STEPS];  /* every stage reported it; written once the steps before are */
    json_t *last_stages;
    upload up[ACC_STEPS];
    char *dir;
    int planning;             /* the engine is planning it, outside the lock */
    /* recovery */
    int64_t fail_ms;          /* first failure report of this epoch (0: none) */
    char fail_why[600];       /* a failure that named no lost peer, else the first one */
    int fail_primary;         /* fail_why is a device's own failure */
    int stalls;               /* recoveries since the last committed step */
    int64_t detect_ms;        /* when the last recovery began; 0 once a step completed after it */
    int64_t wait_ms;          /* when the job last started waiting or recovering */
    int wait_kind;            /* WAIT_* */
    int weigh_joiners;        /* a step was committed: joiners with a profile are weighed */
    int store_fails;          /* checkpoint store failures since the last commit */
    uint64_t n_lost, n_recoveries; /* since the coordinator started (for /metrics) */
    int restarted;            /* recovering after a coordinator restart */
    double predicted;         /* the plan's predicted iteration time */
    struct job_obs *obs;      /* figures for /metrics and the dashboard */
} cjob;

enum { WAIT_NONE, WAIT_OWNER, WAIT_DEVICES, WAIT_STORE };

struct coord_jobs {
    coord *c;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t engine;
    int running, stop;
    cdev *dev;
    int ndev, capdev;
    cjob **job;
    int njob;
    coord_state *db;
    char *root;
    coord_uploads *uploads; /* models for --init, until a submit claims them */
    int64_t settle_ms;      /* until then, devices may still be coming back after a restart */
    coord_obs_count refused[COORD_OBS_NAMES]; /* frames refused by reason, every job */
    int nrefused;
};

/* observation (the end of this file) */
static void obs_free(struct job_obs *o);
static void obs_report(cjob *jb, const Skyloom__V1__ReportStepRequest *r);
static void obs_refused(coord_jobs *j, const Skyloom__V1__ReportStepRequest *r);
static void obs_upload(cjob *jb, int step, size_t bytes);
static void obs_commit(cjob *jb, int step);
static char *obs_trace_text(const cjob *jb);

static const char *const job_schema =
    "CREATE TABLE IF NOT EXISTS jobs(id TEXT PRIMARY KEY, num INTEGER NOT NULL,"
    "  state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', config TEXT NOT NULL,"
    "  options TEXT NOT NULL, owner TEXT NOT NULL, dataset TEXT NOT NULL,"
    "  data_info TEXT NOT NULL DEFAULT '', epoch INTEGER NOT NULL DEFAULT 0,"
    "  plan TEXT NOT NULL DEFAULT '', plan_sig BLOB, step INTEGER NOT NULL DEFAULT 0,"
    "  committed_step INTEGER NOT NULL DEFAULT 0, loss REAL NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS job_profiles(job TEXT NOT NULL, device TEXT NOT NULL,"
    "  result TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY(job, device));"
    "CREATE TABLE IF NOT EXISTS job_events(job TEXT NOT NULL, at_ms INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL, step INTEGER NOT NULL, committed_step INTEGER NOT NULL,"
    "  kind TEXT NOT NULL, device TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX IF NOT EXISTS job_events_job ON job_events(job, at_ms);";

/* ---- small helpers -------------------------------------------------------- */

static char *path_of(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int db_exec(coord_jobs *j, const char *sql, sl_err *err)
{
    char *msg = NULL;
    if (sqlite3_exec(coord_state_db(j->db), sql, NULL, NULL, &msg) != SQLITE_OK) {
        sl_err_set(err, SL_EIO, "sqlite: %s", msg ? msg : "?");
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

/* Writes the job's durable fields. */
static int job_save(coord_jobs *j, cjob *jb, sl_err *err)
{
    sqlite3 *db = coord_state_db(j->db);
    sqlite3_stmt *st = NULL;
    const char *sql =
        "INSERT OR REPLACE INTO jobs(id, num, state, reason, config, options, owner, dataset,"
        " data_info, epoch, plan, plan_sig, step, committed_step, loss, created_at, updated_at)"
        " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return sl_err_set(err, SL_EIO, "sqlite prepare: %s", sqlite3_errmsg(db));
    char *opts = json_dumps(jb->opts, JSON_COMPACT | JSON_SORT_KEYS);
    char *info = jb->data_info ? json_dumps(jb->data_info, JSON_COMPACT) : NULL;
    sqlite3_bind_text(st, 1, jb->id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)jb->num);
    sqlite3_bind_text(st, 3, jb->state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, jb->reason, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, jb->config, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, opts ? opts : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, jb->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, jb->dataset, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, info ? info : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 10, jb->epoch);
    sqlite3_bind_text(st, 11, jb->plan ? jb->plan : "", -1, SQLITE_STATIC);
    if (jb->sig)
        sqlite3_bind_blob(st, 12, jb->sig, (int)jb->sig_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 12);
    sqlite3_bind_int(st, 13, jb->step);
    sqlite3_bind_int(st, 14, jb->committed);
    sqlite3_bind_double(st, 15, jb->loss);
    sqlite3_bind_int64(st, 16, jb->created);
    sqlite3_bind_int64(st, 17, sl_unix_time());
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    free(opts);
    free(info);
    return rc == SQLITE_DONE ? 0 : sl_err_set(err, SL_EIO, "sqlite: %s", sqlite3_errmsg(db));
}

static void job_persist(coord_jobs *j, cjob *jb)
{
    sl_err err = {0};
    if (job_save(j, jb, &err))
        sl_log_error("coordinator: cannot record job", "job=%s reason=\"%s\"", jb->id, err.msg);
}

static void set_state(coord_jobs *j, cjob *jb, const char *state, const char *reason)
{
    snprintf(jb->state, sizeof jb->state, "%s", state);
    snprintf(jb->reason, sizeof jb->reason, "%s", reason ? reason : "");
    if (!strcmp(state, "done") || !strcmp(state, "failed") || !strcmp(state, "stopped"))
        jb->ended = sl_unix_time();
    job_persist(j, jb);
    if (reason && *reason)
        sl_log_info("coordinator: job", "job=%s state=%s reason=\"%s\"", jb->id, state, reason);
    else
        sl_log_info("coordinator: job", "job=%s state=%s", jb->id, state);
}

static int job_ended(const cjob *jb)
{
    return !strcmp(jb->state, "done") || !strcmp(jb->state, "failed") ||
           !strcmp(jb->state, "stopped");
}

/* Records what recovery decided and did: job status lists these. */
static void job_event(coord_jobs *j, const cjob *jb, const char *kind, const char *device,
                      const char *fmt, ...)
{
    char detail[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    sqlite3 *db = coord_state_db(j->db);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "INSERT INTO job_events(job, at_ms, epoch, step, committed_step,"
                                " kind, device, detail) VALUES(?,?,?,?,?,?,?,?)", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, jb->id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, sl_unix_ms());
        sqlite3_bind_int(st, 3, jb->epoch);
        sqlite3_bind_int(st, 4, jb->step);
        sqlite3_bind_int(st, 5, jb->committed);
        sqlite3_bind_text(st, 6, kind, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 7, device ? device : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 8, detail, -1, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        sl_log_error("coordinator: cannot record a job event", "job=%s kind=%s reason=\"%s\"",
                     jb->id, kind, sqlite3_errmsg(db));
    sl_log_info("coordinator: job event", "job=%s kind=%s device=%s epoch=%d committed=%d detail=\"%s\"",
                jb->id, kind, device && *device ? device : "-", jb->epoch, jb->committed, detail);
}

/* The job's events, oldest first, as JSON. */
static json_t *events_json(coord_jobs *j, const cjob *jb)
{
    json_t *a = json_array();
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(coord_state_db(j->db), "SELECT at_ms, epoch, step, committed_step, kind,"
                           " device, detail FROM job_events WHERE job = ? ORDER BY at_ms, rowid",
                           -1, &st, NULL) != SQLITE_OK)
        return a;
    sqlite3_bind_text(st, 1, jb->id, -1, SQLITE_STATIC);
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(a, json_pack("{s:I, s:i, s:i, s:i, s:s, s:s, s:s}", "at_ms",
                                           (json_int_t)sqlite3_column_int64(st, 0), "epoch",
                                           sqlite3_column_int(st, 1), "step", sqlite3_column_int(st, 2),
                                           "committed_step", sqlite3_column_int(st, 3), "kind",
                                           (const char *)sqlite3_column_text(st, 4), "device",
                                           (const char *)sqlite3_column_text(st, 5), "detail",
                                           (const char *)sqlite3_column_text(st, 6)));
    sqlite3_finalize(st);
    return a;
}

static void job_free(cjob *jb)
{
    if (!jb)
        return;
    free(jb->config);
    json_decref(jb->opts);
    json_decref(jb->data_info);
    free(jb->plan);
    free(jb->sig);
    json_decref(jb->plan_json);
    free(jb->stage_dev);
    for (int i = 0; i < jb->ncand; i++) {
        json_decref(jb->cand[i].result);
        json_decref(jb->cand[i].links);
        free(jb->cand[i].measure);
    }
    free(jb->cand);
    free(jb->acc);
    json_decref(jb->last_stages);
    for (int i = 0; i < ACC_STEPS; i++)
        free(jb->up[i].parts);
    free(jb->dir);
    obs_free(jb->obs);
    free(jb);
}

static cjob *find_job(coord_jobs *j, const char *id)
{
    for (int i = 0; i < j->njob; i++)
        if (!strcmp(j->job[i]->id, id))
            return j->job[i];
    return NULL;
}

static cdev *find_dev(coord_jobs *j, const char *id)
{
    for (int i = 0; i < j->ndev; i++)
        if (!strcmp(j->dev[i].id, id))
            return &j->dev[i];
    return NULL;
}

static int dev_online(const coord_jobs *j, const cdev *d, int64_t now)
{
    return d->seen && now - d->seen <= 3 * (int64_t)j->c->o.heartbeat_ms / 1000 + 1;
}

/* A restarted coordinator has seen no device yet: the candidates of a job are
 * chosen once every device online before it had time to heartbeat again. */
static int settled(const coord_jobs *j) { return sl_unix_ms() >= j->settle_ms; }

static int oint(const cjob *jb, const char *k) { return (int)json_integer_value(json_object_get(jb->opts, k)); }
static const char *ostr(const cjob *jb, const char *k) { return json_string_value(json_object_get(jb->opts, k)); }

/* The plan's stage index of device d's stages, or -1. */
static int in_plan(const cjob *jb, const char *d)
{
    for (int i = 0; i < jb->p; i++)
        if (!strcmp(jb->stage_dev[i], d))
            return i;
    return -1;
}

static int is_candidate(const cjob *jb, const char *d)
{
    for (int i = 0; i < jb->ncand; i++)
        if (!strcmp(jb->cand[i].id, d))
            return i;
    return -1;
}

static cand *cand_add(cjob *jb, const char *d)
{
    int k = is_candidate(jb, d);
    if (k >= 0)
        return &jb->cand[k];
    jb->cand = sl_xrealloc(jb->cand, (size_t)(jb->ncand + 1) * sizeof *jb->cand);
    cand *c = &jb->cand[jb->ncand++];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "%s", d);
    return c;
}

/* A device the job's options let it use. */
static int allowed(const cjob *jb, const char *d)
{
    json_t *want = json_object_get(jb->opts, "devices");
    if (!strcmp(d, jb->owner) || !want || json_array_size(want) == 0)
        return 1;
    for (size_t k = 0; k < json_array_size(want); k++)
        if (!strcmp(json_string_value(json_array_get(want, k)), d))
            return 1;
    return 0;
}

/* ---- devices as their heartbeats describe them ----------------------------- */

void coord_jobs_seen(coord_jobs *j, const coord_seen *s, int64_t now)
{
    pthread_mutex_lock(&j->mu);
    cdev *d = find_dev(j, s->id);
    if (!d) {
        if (j->ndev == j->capdev) {
            j->capdev = j->capdev ? 2 * j->capdev : 16;
            j->dev = sl_xrealloc(j->dev, (size_t)j->capdev * sizeof *j->dev);
        }
        d = &j->dev[j->ndev++];
        memset(d, 0, sizeof *d);
        snprintf(d->id, sizeof d->id, "%s", s->id);
    }
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
    d->seen = now;
    d->seen_ms = sl_unix_ms();
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ---- tasks ------------------------------------------------------------------ */

typedef struct task_list {
    Skyloom__V1__Task **v;
    size_t n, cap;
} task_list;

static void add_task(task_list *l, const cjob *jb, const char *kind, int epoch, json_t *spec)
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

static json_t *check_spec(const cjob *jb)
{
    json_error_t je;
    json_t *cfg = json_loads(jb->config, 0, &je);
    json_t *s = json_pack("{s:s, s:O, s:O, s:O, s:O}", "dataset", jb->dataset, "config", cfg,
                          "batch", json_object_get(jb->opts, "batch"), "first",
                          json_object_get(jb->opts, "first"), "sequences",
                          json_object_get(jb->opts, "sequences"));
    json_decref(cfg);
    return s;
}

/* What a profile task asks for: the links, the units, or (a device joining
 * a running job) both. */
enum { PROFILE_BOTH = 0, PROFILE_LINKS = 1, PROFILE_UNITS = 2 };
static const char *const profile_round_name[3] = {NULL, "links", "units"};

/* The task of candidate k. The peers are those it measures its links to
 * (assign_links, or assign_joiner_links for a device joining, which does
 * both rounds at once); in the units round none. */
static json_t *profile_spec(coord_jobs *j, const cjob *jb, int k, int round)
{
    json_error_t je;
    json_t *cfg = json_loads(jb->config, 0, &je), *peers = json_array();
    const cand *c = &jb->cand[k];
    int n = round == PROFILE_UNITS ? 0 : c->nmeasure;
    for (int x = 0; x < n; x++) {
        int i = c->measure[x];
        const cdev *d = i != k && i < jb->ncand ? find_dev(j, jb->cand[i].id) : NULL;
        if (d)
            json_array_append_new(peers, json_pack("{s:s, s:s}", "id", d->id, "address", d->address));
    }
    json_t *s = json_pack("{s:o, s:i, s:i, s:o, s:i, s:s?, s:s?}", "config", cfg, "micro_batch",
                          jb->batch / oint(jb, "micro_batches"), "seq", jb->seq, "peers", peers,
                          "ping_bytes", 1 << 20, "optimizer", ostr(jb, "optimizer"),
                          "optim_state", ostr(jb, "optim_state"));
    if (round != PROFILE_BOTH)
        json_object_set_new(s, "round", json_string(profile_round_name[round]));
    return s;
}

void coord_jobs_tasks(coord_jobs *j, const char *device_id, void ***tasks, size_t *n)
{
    task_list l = {0};
    int64_t now = sl_unix_time();
    pthread_mutex_lock(&j->mu);
    /* "stop" with epoch E: leave the job's runs of epochs before E */
    for (int i = 0; i < j->njob; i++) {
        cjob *jb = j->job[i];
        int k = is_candidate(jb, device_id);
        int profiling = !strcmp(jb->state, "profiling");
        int profile = k >= 0 && !jb->cand[k].result &&
                      (profiling ||
                       (jb->cand[k].joining && (!strcmp(jb->state, "running") || !strcmp(jb->state, "waiting"))));
        /* profiling: the candidates measure their links first (assign_links),
         * and time their units once all have (so that no device computes
         * while others measure their links to it); a joiner does both at once */
        int round = profiling ? jb->profile_round : PROFILE_BOTH;
        if (profile && round == PROFILE_LINKS && jb->cand[k].links)
            profile = 0;
        if (!strcmp(jb->state, "checking") && !jb->data_info && !strcmp(jb->owner, device_id)) {
            add_task(&l, jb, "check", jb->epoch, check_spec(jb));
        } else if (!strcmp(jb->state, "running") && in_plan(jb, device_id) >= 0) {
            add_task(&l, jb, "run", jb->epoch, NULL);
        } else if (job_ended(jb)) {
            if (jb->p && (k >= 0 || in_plan(jb, device_id) >= 0) && now - jb->ended < ENDED_TASK_S)
                add_task(&l, jb, "stop", jb->epoch + 1, NULL);
        } else if (k >= 0 && jb->epoch > 0) {
            /* recovering, waiting, re-planning, or not in this epoch's plan */
            add_task(&l, jb, "stop", !strcmp(jb->state, "running") ? jb->epoch : jb->epoch + 1, NULL);
        }
        if (profile)
            add_task(&l, jb, "profile", jb->epoch, profile_spec(j, jb, k, round));
    }
    pthread_mutex_unlock(&j->mu);
    *tasks = (void **)l.v;
    *n = l.n;
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

/* ---- options ------------------------------------------------------------------ */

static int valid_name(const char *s, size_t max)
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

static int codec_ok(const char *s, int grad)
{
    if (!strcmp(s, "none") || !strcmp(s, "fp16") || !strcmp(s, "bf16") || !strcmp(s, "int8"))
        return 1;
    if (grad && !strncmp(s, "topk:", 5)) {
        char *end;
        double f = strtod(s + 5, &end);
        return *end == 0 && f > 0 && f <= 1;
    }
    return 0;
}

/* The options with their defaults; NULL and a reason in st when one is bad. */
static json_t *job_options(const char *text, rpc_status *st)
{
    json_error_t je;
    json_t *in = json_loads(text && *text ? text : "{}", 0, &je);
    if (!in || !json_is_object(in)) {
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: not a JSON object (%s)", je.text);
        json_decref(in);
        return NULL;
    }
    json_t *o = json_pack(
        "{s:i, s:i, s:s, s:s, s:b, s:s, s:s, s:i, s:f, s:i, s:I, s:s, s:s, s:f, s:f, s:f, s:I, "
        "s:I, s:b, s:b, s:b, s:b, s:f}",
        "batch", 8, "micro_batches", 1, "codec_act", "none", "codec_grad", "none", "sealed", 1,
        "algo", "optimal", "schedule", "1f1b", "checkpoint_every", 50, "lr", -1.0, "warmup", -1,
        "seed", (json_int_t)1, "optimizer", "adamw", "optim_state", "fp32", "weight_decay", 0.01,
        "clip", 1.0, "mask_prob", 0.15, "first", (json_int_t)0, "sequences", (json_int_t)0,
        "shuffle", 1, "recompute", 0, "recompute_attention", 0, "u_shape", 1, "replan_margin", 0.10);
    const char *key;
    json_t *v;
    json_object_foreach(in, key, v) {
        if (!strcmp(key, "steps") || !strcmp(key, "devices")) {
            json_object_set(o, key, v);
            continue;
        }
        json_t *def = json_object_get(o, key);
        int same = def && (json_typeof(def) == json_typeof(v) ||
                           (json_is_number(def) && json_is_number(v)) ||
                           (json_is_boolean(def) && json_is_boolean(v)));
        if (!same) {
            rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: '%.60s' is %s", key,
                           def ? "of the wrong type" : "not an option");
            goto bad;
        }
        if (json_is_real(def) && json_is_integer(v))
            json_object_set_new(o, key, json_real((double)json_integer_value(v)));
        else
            json_object_set(o, key, v);
    }
    json_int_t steps = json_integer_value(json_object_get(o, "steps"));
    json_int_t batch = json_integer_value(json_object_get(o, "batch"));
    json_int_t micro = json_integer_value(json_object_get(o, "micro_batches"));
    const char *ca = json_string_value(json_object_get(o, "codec_act"));
    const char *cg = json_string_value(json_object_get(o, "codec_grad"));
    const char *opt = json_string_value(json_object_get(o, "optimizer"));
    const char *os = json_string_value(json_object_get(o, "optim_state"));
    if (!json_is_integer(json_object_get(o, "steps")) || steps < 1 || steps > 1000000000)
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: steps must be 1..1e9");
    else if (batch < 1 || batch > 65536 || micro < 1 || micro > batch || batch % micro)
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: batch %lld is not a multiple of "
                       "micro_batches %lld", (long long)batch, (long long)micro);
    else if (!codec_ok(ca, 0) || !codec_ok(cg, 1))
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: codec_act '%.40s' or codec_grad "
                       "'%.40s' unknown (none, fp16, bf16, int8; gradients also topk:F)", ca, cg);
    else if (bal_algo_parse(json_string_value(json_object_get(o, "algo"))) < 0)
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: algo must be optimal, sky or even");
    else if (bal_schedule_parse(json_string_value(json_object_get(o, "schedule"))) < 0)
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: schedule must be 1f1b or gpipe");
    else if ((strcmp(opt, "adamw") && strcmp(opt, "lamb")) ||
             (strcmp(os, "fp32") && strcmp(os, "bf16")) || (!strcmp(os, "bf16") && strcmp(opt, "adamw")))
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: optimizer adamw|lamb, optim_state "
                       "fp32|bf16 (bf16 with adamw only)");
    else if (json_integer_value(json_object_get(o, "warmup")) < -1 ||
             json_integer_value(json_object_get(o, "warmup")) > INT_MAX ||
             json_integer_value(json_object_get(o, "checkpoint_every")) > INT_MAX)
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: warmup must be -1 (10%% of the steps) "
                       "or more, and warmup and checkpoint_every at most %d", INT_MAX);
    else if (json_integer_value(json_object_get(o, "checkpoint_every")) < 0 ||
             json_integer_value(json_object_get(o, "first")) < 0 ||
             json_integer_value(json_object_get(o, "sequences")) < 0 ||
             json_real_value(json_object_get(o, "mask_prob")) <= 0 ||
             json_real_value(json_object_get(o, "mask_prob")) >= 1 ||
             json_real_value(json_object_get(o, "replan_margin")) < 0 ||
             json_real_value(json_object_get(o, "replan_margin")) >= 1)
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: checkpoint_every, first and sequences "
                       "must not be negative, mask_prob and replan_margin in (0, 1) and [0, 1)");
    else {
        json_t *devs = json_object_get(o, "devices");
        size_t i;
        json_t *d;
        int ok = !devs || json_is_array(devs);
        json_array_foreach(devs, i, d) ok &= json_is_string(d) && cert_valid_device_id(json_string_value(d));
        if (ok) {
            json_decref(in);
            return o;
        }
        rpc_status_set(st, RPC_INVALID_ARGUMENT, "options: devices must be a list of device ids");
    }
bad:
    json_decref(in);
    json_decref(o);
    return NULL;
}

/* ---- submitting ------------------------------------------------------------------ */

static cjob *job_new(coord_jobs *j)
{
    cjob *jb = sl_xcalloc(1, sizeof *jb);
    uint8_t r[8];
    randombytes_buf(r, sizeof r);
    jb->num = 0;
    for (int i = 0; i < 8; i++)
        jb->num = jb->num << 8 | r[i];
    jb->num &= 0x7fffffffffffffffull; /* fits SQLite's integer */
    snprintf(jb->id, sizeof jb->id, "j%016llx", (unsigned long long)jb->num);
    jb->created = jb->check_since = sl_unix_time();
    jb->dir = path_of(j->root, jb->id);
    for (int i = 0; i < ACC_STEPS; i++)
        jb->acc_step[i] = -1;
    return jb;
}

/* The numbers of the config the coordinator needs, from the reader the
 * devices use too (so a job the devices would refuse fails at submit). */
static int config_numbers(const char *text, int *layers, int *max_pos, int *vocab, rpc_status *st)
{
    sl_err err = {0};
    bal_bert b;
    if (bal_bert_parse(&b, text, "config.json", &err))
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "%s", err.msg);
    *layers = b.layers;
    *max_pos = b.max_pos;
    *vocab = b.vocab;
    return RPC_OK;
}

/* What a refused submit had written: config.json and the start model. */
static void unmake_job_dir(const char *dir)
{
    static const char *const files[] = {"ckpt/step-0/model.safetensors", "ckpt/step-0", "ckpt",
                                        "config.json", NULL};
    for (int i = 0; files[i]; i++) {
        char *p = path_of(dir, files[i]);
        remove(p);
        free(p);
    }
    rmdir(dir);
}

int coord_handle_submit_job(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                            rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    coord_jobs *j = c->jobs;
    Skyloom__V1__SubmitJobRequest *r = rpc_unpack(&skyloom__v1__submit_job_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed SubmitJobRequest");
    int code = coord_authorize(c, peer, "", COORD_ALLOW_ADMIN, st);
    cjob *jb = NULL;
    json_t *opts = NULL;
    int layers = 0, max_pos = 0, vocab = 0;
    if (code != RPC_OK)
        goto out;
    if ((code = config_numbers(r->config, &layers, &max_pos, &vocab, st)) != RPC_OK)
        goto out;
    if (!(opts = job_options(r->options, st))) {
        code = st->code;
        goto out;
    }
    const char *colon = strchr(r->data, ':');
    char owner[CERT_ID_LEN + 8] = "";
    if (colon)
        snprintf(owner, sizeof owner, "%.*s", (int)(colon - r->data), r->data);
    if (!colon || !cert_valid_device_id(owner) || !valid_name(colon + 1, 64)) {
        code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "data '%.80s' is not DEVICE_ID:NAME", r->data);
        goto out;
    }
    sl_err err = {0};
    int known = coord_state_device_known(c->state, owner, &err), rev = coord_state_is_revoked(c->state, owner, &err);
    if (known <= 0 || rev) {
        code = rpc_status_set(st, RPC_FAILED_PRECONDITION, "data owner %s is %s", owner,
                              known < 0 || rev < 0 ? "unknown (database error)" : rev ? "revoked" : "not enrolled here");
        goto out;
    }
    pthread_mutex_lock(&j->mu);
    if (j->njob >= MAX_JOBS) {
        pthread_mutex_unlock(&j->mu);
        code = rpc_status_set(st, RPC_RESOURCE_EXHAUSTED, "%d jobs already", MAX_JOBS);
        goto out;
    }
    jb = job_new(j);
    jb->config = sl_xstrdup(r->config);
    jb->opts = opts;
    opts = NULL;
    snprintf(jb->owner, sizeof jb->owner, "%.*s", (int)sizeof jb->owner - 1, owner);
    snprintf(jb->dataset, sizeof jb->dataset, "%s", colon + 1);
    jb->steps = oint(jb, "steps");
    jb->batch = oint(jb, "batch");
    snprintf(jb->state, sizeof jb->state, "checking");
    /* the files first: a job on record has its directory */
    char *cfg = path_of(jb->dir, "config.json");
    int rc = sl_mkdir(j->root, 0700, &err) || sl_mkdir(jb->dir, 0700, &err) ||
             sl_write_file_atomic(cfg, r->config, strlen(r->config), &err);
    free(cfg);
    code = rc ? rpc_status_set(st, RPC_INTERNAL, "%s", err.msg) : RPC_OK;
    if (code == RPC_OK && r->init_upload && *r->init_upload) {
        char *ck = path_of(jb->dir, "ckpt"), *s0 = path_of(jb->dir, "ckpt/step-0"),
             *m = path_of(jb->dir, "ckpt/step-0/model.safetensors");
        if (sl_mkdir(ck, 0700, &err) || sl_mkdir(s0, 0700, &err))
            code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
        else
            code = coord_uploads_claim(j->uploads, r->init_upload, m, st);
        free(ck);
        free(s0);
        free(m);
    }
    if (code == RPC_OK && job_save(j, jb, &err))
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    if (code != RPC_OK) {
        pthread_mutex_unlock(&j->mu);
        unmake_job_dir(jb->dir);
        goto out;
    }
    j->job = sl_xrealloc(j->job, (size_t)(j->njob + 1) * sizeof *j->job);
    j->job[j->njob++] = jb;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    sl_log_info("coordinator: job submitted", "job=%s data=%s steps=%d", jb->id, r->data, jb->steps);
    Skyloom__V1__SubmitJobResponse out = SKYLOOM__V1__SUBMIT_JOB_RESPONSE__INIT;
    out.job_id = jb->id;
    rpc_pack(&out, resp);
    jb = NULL;
out:
    job_free(jb);
    json_decref(opts);
    rpc_unpacked_free(r);
    return code;
}

/* ---- reading jobs ------------------------------------------------------------ */

static Skyloom__V1__JobSummary *summary_of(const cjob *jb)
{
    Skyloom__V1__JobSummary *s = sl_xmalloc(sizeof *s);
    skyloom__v1__job_summary__init(s);
    s->job_id = sl_xstrdup(jb->id);
    s->state = sl_xstrdup(jb->state);
    s->step = (uint32_t)jb->step;
    s->steps = (uint32_t)jb->steps;
    s->committed_step = (uint32_t)jb->committed;
    s->loss = jb->loss;
    s->created_at = jb->created;
    s->reason = sl_xstrdup(jb->reason);
    return s;
}

static void summary_free(Skyloom__V1__JobSummary *s)
{
    if (!s)
        return;
    free(s->job_id);
    free(s->state);
    free(s->reason);
    free(s);
}

int coord_handle_list_jobs(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                           rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    (void)req;
    (void)len;
    int code = coord_authorize(c, peer, "", COORD_ALLOW_ADMIN, st);
    if (code != RPC_OK)
        return code;
    coord_jobs *j = c->jobs;
    Skyloom__V1__ListJobsResponse out = SKYLOOM__V1__LIST_JOBS_RESPONSE__INIT;
    pthread_mutex_lock(&j->mu);
    out.n_jobs = (size_t)j->njob;
    out.jobs = sl_xcalloc(out.n_jobs + 1, sizeof *out.jobs);
    for (int i = 0; i < j->njob; i++)
        out.jobs[i] = summary_of(j->job[i]);
    pthread_mutex_unlock(&j->mu);
    rpc_pack(&out, resp);
    for (size_t i = 0; i < out.n_jobs; i++)
        summary_free(out.jobs[i]);
    free(out.jobs);
    return RPC_OK;
}

/* metrics.csv rows from step `from` on (without the header). */
static char *metrics_from(const cjob *jb, int from)
{
    char *p = path_of(jb->dir, "metrics.csv"), *buf = NULL;
    size_t n = 0;
    sl_err err = {0};
    int rc = sl_read_file(p, 64u << 20, &buf, &n, &err);
    free(p);
    if (rc || from <= 0) {
        free(buf);
        return sl_xstrdup("");
    }
    /* rows start with their step: keep the ones >= from */
    size_t o = 0, k = 0;
    char *out = sl_xmalloc(n + 1);
    for (char *line = buf; line < buf + n;) {
        char *nl = memchr(line, '\n', (size_t)(buf + n - line));
        size_t l = nl ? (size_t)(nl - line) + 1 : (size_t)(buf + n - line);
        if (k++ > 0 && atoi(line) >= from) {
            memcpy(out + o, line, l);
            o += l;
        }
        line += l;
    }
    out[o] = 0;
    free(buf);
    return out;
}

static json_t *profiles_json(const cjob *jb)
{
    json_t *o = json_object();
    for (int i = 0; i < jb->ncand; i++)
        if (jb->cand[i].result)
            json_object_set(o, jb->cand[i].id, jb->cand[i].result);
    return o;
}

int coord_handle_get_job(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                         rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__GetJobRequest *r = rpc_unpack(&skyloom__v1__get_job_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed GetJobRequest");
    int code = coord_authorize(c, peer, "", COORD_ALLOW_ADMIN, st);
    if (code != RPC_OK) {
        rpc_unpacked_free(r);
        return code;
    }
    coord_jobs *j = c->jobs;
    pthread_mutex_lock(&j->mu);
    cjob *jb = find_job(j, r->job_id);
    if (!jb) {
        pthread_mutex_unlock(&j->mu);
        code = rpc_status_set(st, RPC_NOT_FOUND, "no job '%.40s'", r->job_id);
        rpc_unpacked_free(r);
        return code;
    }
    Skyloom__V1__JobInfo out = SKYLOOM__V1__JOB_INFO__INIT;
    out.summary = summary_of(jb);
    out.options = json_dumps(jb->opts, JSON_COMPACT | JSON_SORT_KEYS);
    out.plan = sl_xstrdup(jb->plan ? jb->plan : "");
    out.epoch = (uint32_t)jb->epoch;
    out.stages = jb->last_stages ? json_dumps(jb->last_stages, JSON_COMPACT) : sl_xstrdup("");
    out.metrics = metrics_from(jb, (int)r->metrics_from);
    json_t *pj = profiles_json(jb), *ev = events_json(j, jb);
    out.profiles = json_dumps(pj, JSON_COMPACT);
    out.events = json_dumps(ev, JSON_COMPACT);
    json_decref(pj);
    json_decref(ev);
    out.trace = r->trace ? obs_trace_text(jb) : sl_xstrdup("");
    pthread_mutex_unlock(&j->mu);
    rpc_pack(&out, resp);
    free(out.trace);
    summary_free(out.summary);
    free(out.options);
    free(out.plan);
    free(out.stages);
    free(out.metrics);
    free(out.profiles);
    free(out.events);
    rpc_unpacked_free(r);
    return RPC_OK;
}

int coord_handle_stop_job(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                          rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__StopJobRequest *r = rpc_unpack(&skyloom__v1__stop_job_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed StopJobRequest");
    int code = coord_authorize(c, peer, "", COORD_ALLOW_ADMIN, st);
    coord_jobs *j = c->jobs;
    if (code == RPC_OK) {
        pthread_mutex_lock(&j->mu);
        cjob *jb = find_job(j, r->job_id);
        if (!jb)
            code = rpc_status_set(st, RPC_NOT_FOUND, "no job '%.40s'", r->job_id);
        else if (job_ended(jb))
            code = rpc_status_set(st, RPC_FAILED_PRECONDITION, "job %s has ended (%s)", jb->id,
                                  jb->state);
        else
            set_state(j, jb, "stopped", "stopped by the operator");
        pthread_mutex_unlock(&j->mu);
    }
    if (code == RPC_OK) {
        Skyloom__V1__StopJobResponse out = SKYLOOM__V1__STOP_JOB_RESPONSE__INIT;
        rpc_pack(&out, resp);
    }
    rpc_unpacked_free(r);
    return code;
}

/* ---- checkpoints: files ---------------------------------------------------- */

static char *step_dir(const cjob *jb, int step, int partial)
{
    char sub[64];
    snprintf(sub, sizeof sub, "ckpt/step-%d%s", step, partial ? ".partial" : "");
    return path_of(jb->dir, sub);
}

/* Removes a directory of files (checkpoint directories hold no subdirectories). */
static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *f = path_of(dir, e->d_name);
        unlink(f);
        free(f);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Drops the parts of steps that were never committed. */
static void drop_partials(const cjob *jb)
{
    char *ck = path_of(jb->dir, "ckpt");
    DIR *d = opendir(ck);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "step-", 5) || n < 8 || strcmp(e->d_name + n - 8, ".partial"))
            continue;
        char *p = path_of(ck, e->d_name);
        rm_dir(p);
        free(p);
    }
    if (d)
        closedir(d);
    free(ck);
}

/* metrics.csv keeps the rows of the steps up to the committed one: the
 * steps after it are trained again. Returns the loss of the last row kept. */
static double metrics_truncate(const cjob *jb)
{
    char *p = path_of(jb->dir, "metrics.csv"), *buf = NULL;
    size_t n = 0, o = 0;
    double loss = 0;
    sl_err err = {0};
    if (sl_read_file(p, 256u << 20, &buf, &n, &err)) {
        free(p);
        return 0;
    }
    char *out = sl_xmalloc(n + 1);
    int row = 0;
    for (char *line = buf; line < buf + n; row++) {
        char *nl = memchr(line, '\n', (size_t)(buf + n - line));
        size_t l = nl ? (size_t)(nl - line) + 1 : (size_t)(buf + n - line);
        if (row == 0 || (nl && atoi(line) <= jb->committed)) {
            memcpy(out + o, line, l);
            o += l;
            const char *c = row ? strchr(line, ',') : NULL;
            if (c && (c = strchr(c + 1, ',')))
                loss = atof(c + 1);
        }
        line += l;
    }
    if (o != n && sl_write_file_atomic(p, out, o, &err))
        sl_log_error("coordinator: cannot truncate metrics", "job=%s reason=\"%s\"", jb->id, err.msg);
    free(out);
    free(buf);
    free(p);
    return loss;
}

/* A part's file name: model.TAG.safetensors, optim.TAG.safetensors, data.json. */
static int part_name_ok(const char *s)
{
    if (!strcmp(s, "data.json"))
        return 1;
    size_t n = strlen(s);
    if (n < 20 || n > 80 || strcmp(s + n - 12, ".safetensors") ||
        (strncmp(s, "model.", 6) && strncmp(s, "optim.", 6)))
        return 0;
    char tag[80];
    snprintf(tag, sizeof tag, "%.*s", (int)(n - 18), s + 6);
    return valid_name(tag, 60) && !strchr(tag, '.');
}

int coord_handle_fetch_file(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                            rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__FetchFileRequest *r = rpc_unpack(&skyloom__v1__fetch_file_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed FetchFileRequest");
    int code = coord_authorize(c, peer, r->device_id, COORD_ALLOW_ADMIN | COORD_ALLOW_DEVICE, st);
    coord_jobs *j = c->jobs;
    char *dir = NULL;
    int step = -1;
    if (code == RPC_OK) {
        pthread_mutex_lock(&j->mu);
        cjob *jb = find_job(j, r->job_id);
        if (!jb)
            code = rpc_status_set(st, RPC_NOT_FOUND, "no job '%.40s'", r->job_id);
        else if (*r->device_id && in_plan(jb, r->device_id) < 0)
            code = rpc_status_set(st, RPC_PERMISSION_DENIED, "device %s has no stage of job %s",
                                  r->device_id, jb->id);
        else {
            step = r->step == UINT32_MAX ? jb->committed : (int)r->step;
            if (step != 0 && step != jb->committed)
                code = rpc_status_set(st, RPC_NOT_FOUND, "job %s: step %u is not its committed "
                                      "step (%d)", jb->id, r->step, jb->committed);
            else
                dir = step_dir(jb, step, 0);
        }
        pthread_mutex_unlock(&j->mu);
    }
    Skyloom__V1__FetchFileResponse out = SKYLOOM__V1__FETCH_FILE_RESPONSE__INIT;
    out.step = (uint32_t)(step < 0 ? 0 : step);
    uint8_t *data = NULL;
    if (code == RPC_OK && !*r->name) { /* the list */
        DIR *d = opendir(dir);
        if (!d)
            code = rpc_status_set(st, RPC_NOT_FOUND, "job %s has no checkpoint at step %d", r->job_id, step);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.' || (!part_name_ok(e->d_name) && strcmp(e->d_name, "manifest.json") &&
                                        strcmp(e->d_name, "config.json") && strcmp(e->d_name, "model.safetensors")))
                continue;
            out.names = sl_xrealloc(out.names, (out.n_names + 1) * sizeof *out.names);
            out.names[out.n_names++] = sl_xstrdup(e->d_name);
        }
        if (d)
            closedir(d);
    } else if (code == RPC_OK) {
        if (!part_name_ok(r->name) && strcmp(r->name, "manifest.json") && strcmp(r->name, "config.json") &&
            strcmp(r->name, "model.safetensors")) {
            code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "'%.80s' is not a checkpoint file", r->name);
        } else {
            char *p = path_of(dir, r->name);
            int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
            struct stat sb;
            uint32_t lim = (uint32_t)(c->o.max_message > 8192 ? c->o.max_message - 4096 : 4096);
            uint32_t want = r->max_bytes && r->max_bytes < lim ? r->max_bytes : lim;
            if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
                code = rpc_status_set(st, RPC_NOT_FOUND, "%s: no such file at step %d", r->name, step);
            } else {
                out.size = (uint64_t)sb.st_size;
                uint64_t left = r->offset < out.size ? out.size - r->offset : 0;
                size_t n = left < want ? (size_t)left : want;
                data = sl_xmalloc(n ? n : 1);
                ssize_t got = n ? pread(fd, data, n, (off_t)r->offset) : 0;
                if (got != (ssize_t)n)
                    code = rpc_status_set(st, RPC_INTERNAL, "%s: read failed", r->name);
                out.data.data = data;
                out.data.len = n;
            }
            if (fd >= 0)
                close(fd);
            free(p);
        }
    }
    if (code == RPC_OK)
        rpc_pack(&out, resp);
    for (size_t i = 0; i < out.n_names; i++)
        free(out.names[i]);
    free(out.names);
    free(data);
    free(dir);
    rpc_unpacked_free(r);
    return code;
}

/* Writes the manifest of a complete step and makes it the committed one.
 * Called with the lock held; the files are small (the parts are on disk). */
static int commit_step(coord_jobs *j, cjob *jb, upload *u, sl_err *err)
{
    char *part = step_dir(jb, u->step, 1), *final = step_dir(jb, u->step, 0);
    char *cfg = path_of(part, "config.json");
    int rc = sl_write_file_atomic(cfg, jb->config, strlen(jb->config), err);
    free(cfg);
    /* the manifest lists every file with its sum: dev_ckpt_write_manifest's
     * format; the parts' sums were checked as they arrived */
    json_t *files = json_array();
    for (int i = 0; !rc && i <= u->n; i++) {
        char hex[65];
        uint8_t cs[32];
        const uint8_t *sum = i < u->n ? u->parts[i].sum : cs;
        uint64_t size = i < u->n ? u->parts[i].size : strlen(jb->config);
        if (i == u->n)
            crypto_generichash(cs, sizeof cs, (const uint8_t *)jb->config, strlen(jb->config), NULL, 0);
        for (int k = 0; k < 32; k++)
            snprintf(hex + 2 * k, 3, "%02x", sum[k]);
        json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "name",
                                               i < u->n ? u->parts[i].name : "config.json",
                                               "bytes", (json_int_t)size, "blake2b", hex));
    }
    json_t *m = json_pack("{s:s, s:i, s:i, s:s, s:s, s:o}", "format", "skyloom-checkpoint",
                          "version", 1, "step", u->step, "optimizer", ostr(jb, "optimizer"),
                          "optim_state", ostr(jb, "optim_state"), "files", files);
    char *text = json_dumps(m, JSON_INDENT(2));
    json_decref(m);
    char *mp = path_of(part, "manifest.json");
    if (!rc)
        rc = sl_write_file_atomic(mp, text, strlen(text), err);
    free(mp);
    free(text);
    if (!rc && rename(part, final) != 0)
        rc = sl_err_set(err, SL_EIO, "%s: %s", final, strerror(errno));
    if (!rc) {
        int was = jb->committed;
        jb->committed = u->step;
        if ((rc = job_save(j, jb, err)))
            jb->committed = was;
        else if (was > 0 && was != u->step) { /* one committed step is kept */
            char *old = step_dir(jb, was, 0);
            rm_dir(old);
            free(old);
        }
    }
    free(part);
    free(final);
    return rc;
}

static void fail_reset(cjob *jb)
{
    jb->fail_ms = 0;
    jb->fail_why[0] = 0;
    jb->fail_primary = 0;
    for (int i = 0; i < jb->ncand; i++)
        jb->cand[i].suspect = jb->cand[i].reported = 0;
}

/* The running epoch is over: every device leaves it (the step in flight is
 * applied nowhere) and the engine re-plans from the committed step. */
static void job_recover(coord_jobs *j, cjob *jb, const char *why)
{
    fail_reset(jb);
    jb->detect_ms = jb->wait_ms = sl_unix_ms();
    jb->wait_kind = WAIT_NONE;
    jb->n_recoveries++;
    if (++jb->stalls > MAX_STALLS) {
        char m[700];
        snprintf(m, sizeof m, "%d recoveries without a step committed in between; the last: %.500s",
                 MAX_STALLS, why);
        job_event(j, jb, "failed", "", "%s", m);
        set_state(j, jb, "failed", m);
        return;
    }
    job_event(j, jb, "recovering", "", "%s", why);
    set_state(j, jb, "recovering", why);
}

/* The checkpoint store refused a write (disk full, an I/O error): the step
 * is not committed, the committed one stays as it is, and the job waits and
 * then runs again from it. */
static int store_failed(coord_jobs *j, cjob *jb, int step, const char *what, rpc_status *st)
{
    int wait_s = STORE_RETRY_S << (jb->store_fails < 5 ? jb->store_fails : 5);
    char why[512];
    snprintf(why, sizeof why, "the checkpoint store could not take step %d (%.300s); step %d "
             "stays committed; trying again in %d s", step, what, jb->committed, wait_s);
    job_event(j, jb, "store_failed", "", "step %d: %s", step, what);
    fail_reset(jb);
    jb->store_fails++;
    jb->wait_kind = WAIT_STORE;
    jb->wait_ms = sl_unix_ms() + (int64_t)(wait_s - STORE_RETRY_S) * 1000;
    set_state(j, jb, "waiting", why);
    return rpc_status_set(st, RPC_UNAVAILABLE, "%s", why);
}

/* Commits step u->step once every part of it and every stage's report of it
 * are in, so that a committed step always has its metrics row. */
static int try_commit(coord_jobs *j, cjob *jb, upload *u, int *committed, rpc_status *st)
{
    sl_err err = {0};
    if (jb->step < u->step) {
        u->ready = 1;
        return RPC_OK;
    }
    u->ready = 0;
    if (commit_step(j, jb, u, &err)) {
        sl_log_error("coordinator: commit failed", "job=%s step=%d reason=\"%s\"", jb->id, u->step,
                     err.msg);
        return store_failed(j, jb, u->step, err.msg, st);
    }
    *committed = 1;
    obs_commit(jb, u->step);
    jb->reason[0] = 0;
    jb->stalls = 0;
    jb->store_fails = 0;
    jb->weigh_joiners = 1;
    pthread_cond_broadcast(&j->cv);
    sl_log_info("coordinator: step committed", "job=%s step=%d", jb->id, u->step);
    return RPC_OK;
}

static upload *upload_of(cjob *jb, int step)
{
    upload *u = &jb->up[step % ACC_STEPS];
    if (u->step != step) {
        free(u->parts);
        memset(u, 0, sizeof *u);
        u->step = step;
    }
    return u;
}

int coord_handle_upload_init(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                             rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__UploadInitRequest *r = rpc_unpack(&skyloom__v1__upload_init_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed UploadInitRequest");
    int code = coord_authorize(c, peer, "", COORD_ALLOW_ADMIN, st);
    if (code == RPC_OK)
        code = coord_uploads_piece(c->jobs->uploads, r, st);
    if (code == RPC_OK) {
        Skyloom__V1__UploadInitResponse o = SKYLOOM__V1__UPLOAD_INIT_RESPONSE__INIT;
        rpc_pack(&o, resp);
    }
    rpc_unpacked_free(r);
    return code;
}

int coord_handle_upload_chunk(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                              rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__UploadChunkRequest *r = rpc_unpack(&skyloom__v1__upload_chunk_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed UploadChunkRequest");
    int code = coord_authorize(c, peer, r->device_id, COORD_ALLOW_DEVICE, st);
    coord_jobs *j = c->jobs;
    int committed = 0;
    if (code != RPC_OK)
        goto out;
    pthread_mutex_lock(&j->mu);
    cjob *jb = find_job(j, r->job_id);
    sl_err err = {0};
    if (!jb || strcmp(jb->state, "running") || (int)r->epoch != jb->epoch) {
        code = rpc_status_set(st, RPC_FAILED_PRECONDITION, "job %.40s is not running epoch %u",
                              r->job_id, r->epoch);
    } else if (in_plan(jb, r->device_id) < 0 || !part_name_ok(r->name) || r->step < 1 ||
               (int)r->step > jb->steps || (!strcmp(r->name, "data.json") && strcmp(r->device_id, jb->owner))) {
        code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "device %s may not upload '%.80s' for "
                              "step %u", r->device_id, r->name, r->step);
    } else if ((int)r->step <= jb->committed) {
        committed = 1; /* a retry of a committed step: nothing to do */
    } else {
        upload *u = upload_of(jb, (int)r->step);
        part *pt = NULL;
        for (int i = 0; i < u->n; i++)
            if (!strcmp(u->parts[i].name, r->name))
                pt = &u->parts[i];
        char *dir = step_dir(jb, (int)r->step, 1), *ck = path_of(jb->dir, "ckpt");
        if (!pt && r->offset == 0) {
            u->parts = sl_xrealloc(u->parts, (size_t)(u->n + 1) * sizeof *u->parts);
            pt = &u->parts[u->n++];
            memset(pt, 0, sizeof *pt);
            /* a copy, not snprintf: GCC at -O2 with the sanitizers sees a null
             * destination on its instrumented path and warns */
            memcpy(pt->name, r->name, strnlen(r->name, sizeof pt->name - 1));
        }
        if (!pt || pt->done || r->offset != pt->size || r->offset + r->data.len > MAX_FILE) {
            code = rpc_status_set(st, RPC_OUT_OF_RANGE, "%s: chunk at %llu, expected %llu",
                                  r->name, (unsigned long long)r->offset,
                                  (unsigned long long)(pt ? pt->size : 0));
        } else if (sl_mkdir(ck, 0700, &err) || sl_mkdir(dir, 0700, &err)) {
            code = store_failed(j, jb, (int)r->step, err.msg, st);
        } else {
            char *p = path_of(dir, r->name);
            int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | (r->offset ? 0 : O_TRUNC), 0600);
            if (fd < 0 || sl_pwrite_all(fd, r->data.data, r->data.len, (off_t)r->offset) ||
                (r->last && fsync(fd))) {
                char what[4400];
                snprintf(what, sizeof what, "%s: %s", p, strerror(errno));
                code = store_failed(j, jb, (int)r->step, what, st);
            } else {
                /* hashed as it arrives (pieces come in order: offset == size),
                 * so the last piece needs no read of the whole file under the lock */
                if (r->offset == 0)
                    crypto_generichash_init(&pt->hash, NULL, 0, sizeof pt->sum);
                crypto_generichash_update(&pt->hash, r->data.data, r->data.len);
                pt->size += r->data.len;
                obs_upload(jb, (int)r->step, r->data.len);
            }
            if (fd >= 0)
                close(fd);
            if (code == RPC_OK && r->last) {
                int bad = r->size != pt->size || r->blake2b.len != 32;
                if (!bad) {
                    crypto_generichash_final(&pt->hash, pt->sum, sizeof pt->sum);
                    bad = sodium_memcmp(pt->sum, r->blake2b.data, 32) != 0;
                }
                if (bad) { /* start the file again */
                    unlink(p);
                    pt->size = 0;
                    code = rpc_status_set(st, RPC_DATA_LOSS, "%s of step %u arrived damaged "
                                          "(size or checksum differs); send it again", r->name, r->step);
                } else {
                    pt->done = 1;
                }
            }
            free(p);
        }
        free(dir);
        free(ck);
        int done = 0;
        for (int i = 0; i < u->n; i++)
            done += u->parts[i].done;
        if (code == RPC_OK && done == 2 * jb->ndev + 1)
            code = try_commit(j, jb, u, &committed, st);
    }
    pthread_mutex_unlock(&j->mu);
    if (code == RPC_OK) {
        Skyloom__V1__UploadChunkResponse o = SKYLOOM__V1__UPLOAD_CHUNK_RESPONSE__INIT;
        o.committed = committed;
        rpc_pack(&o, resp);
    }
out:
    rpc_unpacked_free(r);
    return code;
}

/* ---- what devices report ---------------------------------------------------- */

/* The sites of devices ids[0..n-1], from the registry. */
typedef struct site_of_ctx {
    char (*ids)[CERT_ID_LEN];
    char (*sites)[CERT_SITE_MAX + 1];
    int n;
} site_of_ctx;

static int take_site(void *ud, const coord_device *d)
{
    site_of_ctx *s = ud;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->ids[i], d->id))
            snprintf(s->sites[i], CERT_SITE_MAX + 1, "%s", d->site);
    return 0;
}

/* The candidate of the pair of sites (a, b) (a == b: inside site a) that
 * measures it: the one with the most peers on the other side (up to
 * LINK_SAMPLES), then the fewest measurements so far; -1 if there is no
 * pair. */
static int link_measurer(int n, char (*sites)[CERT_SITE_MAX + 1], const int *load, const char *a,
                         const char *b)
{
    int best = -1, best_peers = 0;
    for (int i = 0; i < n; i++) {
        int in_a = !strcmp(sites[i], a), in_b = !strcmp(sites[i], b);
        if (!in_a && !in_b)
            continue;
        const char *other = in_a ? b : a;
        int peers = 0;
        for (int q = 0; q < n; q++)
            peers += q != i && !strcmp(sites[q], other);
        peers = peers < LINK_SAMPLES ? peers : LINK_SAMPLES;
        if (peers > best_peers || (peers && peers == best_peers && load[i] < load[best])) {
            best = i;
            best_peers = peers;
        }
    }
    return best;
}

/* Which candidates each candidate measures its links to in the first round
 * of profiling. The plan takes the median of each pair of sites (a site
 * with itself included), so for each pair one device measures up to
 * LINK_SAMPLES devices of the other side, one after another: the round's
 * length grows with the pairs of sites, not the devices, and no two
 * measurements share a site-to-site link at once (their shaping is per
 * pair of sites). Each pair gets as many samples as its sites allow (a
 * site of one device measures the others), and measurers and peers are
 * spread: the fewest so far first. Without the sites (the registry unreadable) every candidate
 * measures every other. */
/* The candidates' sites into sites[ncand] (allocated); 0 if one is unknown
 * (logged: then every candidate measures every other). */
static int cand_sites(coord_jobs *j, const cjob *jb, char (**sites)[CERT_SITE_MAX + 1])
{
    int n = jb->ncand;
    char (*ids)[CERT_ID_LEN] = sl_xcalloc((size_t)n + 1, sizeof *ids);
    *sites = sl_xcalloc((size_t)n + 1, sizeof **sites);
    for (int i = 0; i < n; i++)
        snprintf(ids[i], CERT_ID_LEN, "%s", jb->cand[i].id);
    site_of_ctx sc = {ids, *sites, n};
    sl_err err = {0};
    int known = !coord_state_list_devices(j->db, take_site, &sc, &err);
    for (int i = 0; i < n && known; i++)
        known = (*sites)[i][0] != 0;
    if (!known)
        sl_log_warn("coordinator: every candidate measures every link", "job=%s reason=\"the "
                    "devices' sites are unknown: %s\"", jb->id, err.msg[0] ? err.msg : "not enrolled");
    free(ids);
    return known;
}

/* Candidate k measures every other candidate. */
static void measure_all(cjob *jb, int k)
{
    cand *c = &jb->cand[k];
    free(c->measure);
    c->measure = sl_xcalloc((size_t)jb->ncand + 1, sizeof *c->measure);
    c->nmeasure = 0;
    for (int q = 0; q < jb->ncand; q++)
        if (q != k)
            c->measure[c->nmeasure++] = q;
}

static void assign_links(coord_jobs *j, cjob *jb)
{
    int n = jb->ncand;
    char (*sites)[CERT_SITE_MAX + 1] = NULL;
    int known = cand_sites(j, jb, &sites);
    int *load = sl_xcalloc((size_t)n + 1, sizeof *load), *hit = sl_xcalloc((size_t)n + 1, sizeof *hit);
    for (int i = 0; i < n; i++) {
        if (!known) {
            measure_all(jb, i);
            continue;
        }
        free(jb->cand[i].measure);
        jb->cand[i].measure = sl_xcalloc((size_t)n, sizeof *jb->cand[i].measure);
        jb->cand[i].nmeasure = 0;
    }
    for (int a = 0; a < n && known; a++) {
        int first_a = 1;
        for (int x = 0; x < a; x++)
            first_a &= strcmp(sites[x], sites[a]) != 0;
        for (int b = a; b < n && first_a; b++) {
            int first_b = b == a || strcmp(sites[a], sites[b]);
            for (int x = 0; x < b && first_b; x++)
                first_b = strcmp(sites[x], sites[b]) != 0;
            int m = first_b ? link_measurer(n, sites, load, sites[a], sites[b]) : -1;
            if (m < 0)
                continue;
            const char *other = !strcmp(sites[m], sites[a]) ? sites[b] : sites[a];
            for (int k = 0; k < LINK_SAMPLES; k++) {
                int q = -1;
                for (int t = 0; t < n; t++) {
                    int taken = 0;
                    for (int u = 0; u < jb->cand[m].nmeasure; u++)
                        taken |= jb->cand[m].measure[u] == t;
                    if (t != m && !taken && !strcmp(sites[t], other) && (q < 0 || hit[t] < hit[q]))
                        q = t;
                }
                if (q < 0)
                    break;
                jb->cand[m].measure[jb->cand[m].nmeasure++] = q;
                load[m]++;
                hit[q]++;
            }
        }
    }
    free(sites);
    free(load);
    free(hit);
}

/* A device joining a running job (candidate k) measures up to LINK_SAMPLES
 * candidates of each site, its own included: the pairs of sites it adds
 * or joins. */
static void assign_joiner_links(coord_jobs *j, cjob *jb, int k)
{
    char (*sites)[CERT_SITE_MAX + 1] = NULL;
    if (!cand_sites(j, jb, &sites)) {
        measure_all(jb, k);
        free(sites);
        return;
    }
    cand *c = &jb->cand[k];
    free(c->measure);
    c->measure = sl_xcalloc((size_t)jb->ncand + 1, sizeof *c->measure);
    c->nmeasure = 0;
    for (int q = 0; q < jb->ncand; q++) {
        int same = 0;
        for (int u = 0; u < c->nmeasure; u++)
            same += !strcmp(sites[c->measure[u]], sites[q]);
        if (q != k && !jb->cand[q].lost_ms && same < LINK_SAMPLES)
            c->measure[c->nmeasure++] = q;
    }
    free(sites);
}

static void start_profiling(coord_jobs *j, cjob *jb)
{
    int64_t now = sl_unix_time();
    for (int i = 0; i < jb->ncand; i++) {
        json_decref(jb->cand[i].result);
        json_decref(jb->cand[i].links);
        free(jb->cand[i].measure);
    }
    free(jb->cand);
    jb->cand = NULL;
    jb->ncand = 0;
    /* the data owner first: the balancer's chains start with their first device */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < j->ndev; i++) {
            const cdev *d = &j->dev[i];
            int owner = !strcmp(d->id, jb->owner);
            if (owner == !pass && allowed(jb, d->id) && dev_online(j, d, now) && d->address[0] &&
                d->has_key)
                cand_add(jb, d->id);
        }
    assign_links(j, jb);
    jb->started = now;
    jb->profile_round = PROFILE_LINKS;
    jb->round_started = now;
    set_state(j, jb, "profiling", NULL);
}

static void report_check(coord_jobs *j, cjob *jb, const Skyloom__V1__ReportTaskRequest *r)
{
    if (strcmp(jb->state, "checking"))
        return;
    char why[600];
    if (!r->ok) {
        snprintf(why, sizeof why, "the data owner %s refused %s: %.400s", jb->owner, jb->dataset,
                 r->reason);
        set_state(j, jb, "failed", why);
        return;
    }
    json_error_t je;
    json_t *info = json_loads(r->result, 0, &je);
    json_int_t T = json_integer_value(json_object_get(info, "seq_len"));
    if (!info || T < 1 || T > 65536) {
        snprintf(why, sizeof why, "the data owner %s sent no usable shard description", jb->owner);
        json_decref(info);
        set_state(j, jb, "failed", why);
        return;
    }
    json_decref(jb->data_info);
    jb->data_info = info;
    jb->seq = (int)T;
    if (settled(j))
        start_profiling(j, jb);
    else
        pthread_cond_broadcast(&j->cv); /* the engine starts it once settled */
}

static void report_profile(coord_jobs *j, cjob *jb, const Skyloom__V1__ReportTaskRequest *r)
{
    int k = is_candidate(jb, r->device_id);
    if (k < 0 || jb->cand[k].result || (strcmp(jb->state, "profiling") &&
                                         !(jb->cand[k].joining && !job_ended(jb))))
        return;
    json_error_t je;
    json_t *res = r->ok ? json_loads(r->result, 0, &je) : NULL;
    if (!res) {
        sl_log_warn("coordinator: profile refused", "job=%s device=%s reason=\"%.200s\"", jb->id,
                    r->device_id, r->ok ? "malformed result" : r->reason);
        res = json_pack("{s:b, s:s}", "failed", 1, "reason", r->ok ? "malformed result" : r->reason);
    }
    /* the first round of profiling: its links, kept for the second */
    const char *round = json_string_value(json_object_get(res, "round"));
    json_t *links = json_object_get(res, "links");
    if (round && !strcmp(round, "links")) {
        if (!jb->cand[k].links && !strcmp(jb->state, "profiling"))
            jb->cand[k].links = json_is_array(links) ? json_incref(links) : json_array();
        json_decref(res);
        pthread_cond_broadcast(&j->cv);
        return;
    }
    if (round) { /* the second: the units, with the links of the first */
        json_object_set_new(res, "links",
                            jb->cand[k].links ? json_incref(jb->cand[k].links) : json_array());
        json_object_del(res, "round");
    }
    jb->cand[k].result = res;
    if (jb->cand[k].joining)
        sl_log_info("coordinator: joining device profiled", "job=%s device=%s", jb->id, r->device_id);
    sqlite3_stmt *st = NULL;
    sqlite3 *db = coord_state_db(j->db);
    char *text = json_dumps(res, JSON_COMPACT);
    if (sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO job_profiles(job, device, result, at) "
                           "VALUES(?,?,?,?)", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, jb->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, r->device_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, text, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, sl_unix_time());
        sqlite3_step(st);
    }
    sqlite3_finalize(st);
    free(text);
    pthread_cond_broadcast(&j->cv);
}

/* A device's run of this epoch failed. Its report names the neighbour whose
 * link broke first, if that was the cause; the engine weighs the reports of
 * the epoch together (check_running). */
static void report_run_failure(coord_jobs *j, cjob *jb, const Skyloom__V1__ReportTaskRequest *r)
{
    json_error_t je;
    json_t *res = *r->result ? json_loads(r->result, 0, &je) : NULL;
    const char *lost = json_string_value(json_object_get(res, "lost"));
    int k = is_candidate(jb, r->device_id), s = lost ? is_candidate(jb, lost) : -1;
    if (k >= 0)
        jb->cand[k].reported = 1;
    if (s >= 0 && s != k && in_plan(jb, lost) >= 0)
        jb->cand[s].suspect = 1;
    if (!jb->fail_ms)
        jb->fail_ms = sl_unix_ms();
    if (!jb->fail_why[0] || (s < 0 && !jb->fail_primary)) {
        snprintf(jb->fail_why, sizeof jb->fail_why, "device %s: %.500s", r->device_id, r->reason);
        jb->fail_primary = s < 0;
    }
    sl_log_info("coordinator: run failure reported", "job=%s epoch=%d device=%s suspect=%s reason=\"%.300s\"",
                jb->id, jb->epoch, r->device_id, s >= 0 ? lost : "-", r->reason);
    json_decref(res);
    pthread_cond_broadcast(&j->cv);
}

int coord_handle_report_task(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                             rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__ReportTaskRequest *r = rpc_unpack(&skyloom__v1__report_task_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed ReportTaskRequest");
    int code = coord_authorize(c, peer, r->device_id, COORD_ALLOW_DEVICE, st);
    coord_jobs *j = c->jobs;
    if (code == RPC_OK && (strlen(r->result) > (1u << 20) || strlen(r->reason) > 4096))
        code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "report too large");
    if (code == RPC_OK) {
        pthread_mutex_lock(&j->mu);
        cjob *jb = find_job(j, r->job_id);
        if (!jb)
            code = rpc_status_set(st, RPC_NOT_FOUND, "no job '%.40s'", r->job_id);
        else if (!strcmp(r->kind, "check") && !strcmp(r->device_id, jb->owner))
            report_check(j, jb, r);
        else if (!strcmp(r->kind, "profile"))
            report_profile(j, jb, r);
        else if (!strcmp(r->kind, "run") && !r->ok && !strcmp(jb->state, "running") &&
                 (int)r->epoch == jb->epoch)
            report_run_failure(j, jb, r);
        pthread_mutex_unlock(&j->mu);
    }
    if (code == RPC_OK) {
        Skyloom__V1__ReportTaskResponse out = SKYLOOM__V1__REPORT_TASK_RESPONSE__INIT;
        rpc_pack(&out, resp);
    }
    rpc_unpacked_free(r);
    return code;
}

int coord_handle_get_plan(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                          rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__GetPlanRequest *r = rpc_unpack(&skyloom__v1__get_plan_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed GetPlanRequest");
    int code = coord_authorize(c, peer, r->device_id, COORD_ALLOW_DEVICE, st);
    coord_jobs *j = c->jobs;
    char *crt = NULL, *crt_path = path_of(c->pki, "coordinator.crt");
    size_t crt_len = 0;
    sl_err err = {0};
    if (code == RPC_OK && sl_read_file(crt_path, 1 << 20, &crt, &crt_len, &err))
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    if (code == RPC_OK) {
        pthread_mutex_lock(&j->mu);
        cjob *jb = find_job(j, r->job_id);
        if (!jb || !jb->plan)
            code = rpc_status_set(st, RPC_NOT_FOUND, "job '%.40s' has no plan", r->job_id);
        else if (in_plan(jb, r->device_id) < 0)
            code = rpc_status_set(st, RPC_PERMISSION_DENIED, "device %s has no stage in job %s",
                                  r->device_id, jb->id);
        else {
            Skyloom__V1__SignedPlan out = SKYLOOM__V1__SIGNED_PLAN__INIT;
            out.plan.data = (uint8_t *)jb->plan;
            out.plan.len = strlen(jb->plan);
            out.signature.data = jb->sig;
            out.signature.len = jb->sig_len;
            out.coordinator_cert.data = (uint8_t *)crt;
            out.coordinator_cert.len = crt_len;
            rpc_pack(&out, resp);
        }
        pthread_mutex_unlock(&j->mu);
    }
    free(crt);
    free(crt_path);
    rpc_unpacked_free(r);
    return code;
}

/* A step all stages reported: metrics.csv and the status figures. */
static void step_complete(cjob *jb, int step, const stage_rep *rep)
{
    const stage_rep *last = &rep[jb->p - 1];
    double step_s = 0;
    for (int i = 0; i < jb->p; i++)
        step_s = rep[i].step_s > step_s ? rep[i].step_s : step_s;
    jb->step = step;
    jb->loss = last->loss;
    jb->tokens_s = step_s > 0 ? (double)jb->batch * jb->seq / step_s : 0;
    char *p = path_of(jb->dir, "metrics.csv");
    FILE *f = fopen(p, "a");
    free(p);
    if (f) {
        if (ftell(f) == 0)
            fprintf(f, "step,epoch,loss,masked,grad_norm,lr,step_s,tokens_per_s,stage_busy,"
                       "link_raw_bytes,link_wire_bytes,link_raw_bytes_back,link_wire_bytes_back,"
                       "side_raw_bytes,side_wire_bytes\n");
        fprintf(f, "%d,%d,%.6f,%u,%.6f,%.6g,%.4f,%.1f,", step, jb->epoch, last->loss, last->masked,
                last->grad_norm, last->lr, step_s, jb->tokens_s);
        for (int i = 0; i < jb->p; i++)
            fprintf(f, "%s%.3f", i ? ";" : "", rep[i].step_s > 0 ? (rep[i].fwd + rep[i].bwd) / rep[i].step_s : 0);
        for (int w = 0; w < 4; w++) {
            fputc(',', f);
            for (int i = 0; i + 1 < jb->p; i++) {
                uint64_t v = w == 0 ? rep[i].raw : w == 1 ? rep[i].wire : w == 2 ? rep[i + 1].raw_up : rep[i + 1].wire_up;
                fprintf(f, "%s%llu", i ? ";" : "", (unsigned long long)v);
            }
        }
        uint64_t side_raw = 0, side_wire = 0;
        for (int i = 0; i < jb->p; i++) {
            side_raw += rep[i].raw_side;
            side_wire += rep[i].wire_side;
        }
        fprintf(f, ",%llu,%llu\n", (unsigned long long)side_raw, (unsigned long long)side_wire);
        fclose(f);
    }
    json_t *stages = json_array();
    for (int i = 0; i < jb->p; i++) {
        const stage_rep *s = &rep[i];
        json_t *x = json_pack("{s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "stage", i, "device",
                              jb->stage_dev[i], "fwd_s", s->fwd, "bwd_s", s->bwd, "recv_s", s->recv,
                              "send_s", s->send, "finish_s", s->finish, "step_s", s->step_s, "busy",
                              s->step_s > 0 ? (s->fwd + s->bwd) / s->step_s : 0.0);
        if (i + 1 < jb->p)
            json_object_set_new(x, "link_next", json_pack("{s:I, s:I, s:I, s:I}", "raw_bytes",
                                                          (json_int_t)s->raw, "wire_bytes",
                                                          (json_int_t)s->wire, "raw_bytes_back",
                                                          (json_int_t)rep[i + 1].raw_up,
                                                          "wire_bytes_back",
                                                          (json_int_t)rep[i + 1].wire_up));
        json_array_append_new(stages, x);
    }
    json_decref(jb->last_stages);
    jb->last_stages = json_pack("{s:i, s:f, s:f, s:o}", "step", step, "step_s", step_s,
                                "tokens_per_s", jb->tokens_s, "stages", stages);
}

/* Writes the steps all stages reported, in order (a device's reports may
 * overtake another's), and commits a step whose parts were waiting for it. */
static void steps_complete(coord_jobs *j, cjob *jb)
{
    while (!strcmp(jb->state, "running")) {
        int s = jb->step + 1, k = s % ACC_STEPS;
        if (jb->acc_step[k] != s || !jb->acc_done[k])
            break;
        step_complete(jb, s, jb->acc + (size_t)k * jb->p);
        jb->acc_step[k] = -1;
        jb->acc_done[k] = 0;
        if (jb->detect_ms) {
            job_event(j, jb, "resumed", "", "step %d completed %.2f s after the failure was "
                      "detected", s, (double)(sl_unix_ms() - jb->detect_ms) / 1000);
            jb->detect_ms = 0;
        }
        if (s % 10 == 0 || s == jb->steps)
            job_persist(j, jb);
        upload *u = &jb->up[s % ACC_STEPS];
        if (u->step == s && u->ready) {
            int committed = 0;
            rpc_status st = {0};
            try_commit(j, jb, u, &committed, &st);
        }
        pthread_cond_broadcast(&j->cv);
    }
}

int coord_handle_report_step(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                             rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__ReportStepRequest *r = rpc_unpack(&skyloom__v1__report_step_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed ReportStepRequest");
    int code = coord_authorize(c, peer, r->device_id, COORD_ALLOW_DEVICE, st);
    coord_jobs *j = c->jobs;
    int stop = 0;
    if (code == RPC_OK) {
        pthread_mutex_lock(&j->mu);
        cjob *jb = find_job(j, r->job_id);
        if (!jb) {
            code = rpc_status_set(st, RPC_NOT_FOUND, "no job '%.40s'", r->job_id);
        } else if (strcmp(jb->state, "running") || (int)r->epoch != jb->epoch) {
            stop = 1;
        } else if ((int)r->stage >= jb->p || strcmp(jb->stage_dev[r->stage], r->device_id) ||
                   r->step < 1 || (int)r->step > jb->steps) {
            code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "device %s does not run stage %u, "
                                  "or step %u is out of range", r->device_id, r->stage, r->step);
        } else if ((int)r->step <= jb->step) {
            /* a report of a step already written (sent twice): nothing to do */
        } else if ((int)r->step > jb->step + ACC_STEPS) {
            /* the reports of step jb->step + 1 cannot all come any more */
            char why[300];
            snprintf(why, sizeof why, "the reports of step %d did not all arrive; running again "
                     "from step %d", jb->step + 1, jb->committed + 1);
            job_recover(j, jb, why);
        } else {
            int slot = (int)r->step % ACC_STEPS;
            stage_rep *rep = jb->acc + (size_t)slot * jb->p;
            if (jb->acc_step[slot] != (int)r->step) {
                jb->acc_step[slot] = (int)r->step;
                jb->acc_done[slot] = 0;
                memset(rep, 0, (size_t)jb->p * sizeof *rep);
            }
            rep[r->stage] = (stage_rep){1, r->loss, r->grad_norm, r->lr, r->fwd_s, r->bwd_s,
                                        r->recv_s, r->send_s, r->finish_s, r->step_s, r->raw_bytes,
                                        r->wire_bytes, r->raw_bytes_up, r->wire_bytes_up,
                                        r->raw_bytes_side, r->wire_bytes_side, r->masked};
            obs_report(jb, r);
            int all = 1;
            for (int i = 0; i < jb->p; i++)
                all &= rep[i].have;
            jb->acc_done[slot] = all;
            steps_complete(j, jb);
        }
        if (code == RPC_OK)
            obs_refused(j, r);
        pthread_mutex_unlock(&j->mu);
    }
    if (code == RPC_OK) {
        Skyloom__V1__ReportStepResponse out = SKYLOOM__V1__REPORT_STEP_RESPONSE__INIT;
        out.stop = stop;
        rpc_pack(&out, resp);
    }
    rpc_unpacked_free(r);
    return code;
}

/* ---- planning ----------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median bandwidth and one-way latency of the measured links between two
 * sets of sites (a == b: inside site a); 0 when none was measured. */
static int link_median(json_t **res, char (*sites)[CERT_SITE_MAX + 1], char (*ids)[CERT_ID_LEN],
                       int n, const char *a, const char *b, double *bw, double *lat)
{
    double *vb = sl_xmalloc((size_t)n * n * sizeof *vb), *vl = sl_xmalloc((size_t)n * n * sizeof *vl);
    int k = 0;
    for (int i = 0; i < n; i++) {
        json_t *links = json_object_get(res[i], "links");
        size_t x;
        json_t *l;
        json_array_foreach(links, x, l) {
            const char *peer = json_string_value(json_object_get(l, "peer"));
            int q = -1;
            for (int t = 0; peer && t < n; t++)
                if (!strcmp(ids[t], peer))
                    q = t;
            if (q < 0 || q == i)
                continue;
            int match = (!strcmp(sites[i], a) && !strcmp(sites[q], b)) ||
                        (!strcmp(sites[i], b) && !strcmp(sites[q], a));
            double rtt = json_number_value(json_object_get(l, "rtt_s"));
            double w = json_number_value(json_object_get(l, "bandwidth_Bps"));
            if (match && rtt > 0 && w > 0) {
                vb[k] = w;
                vl[k++] = rtt / 2;
            }
        }
    }
    if (k) {
        qsort(vb, (size_t)k, sizeof *vb, cmp_d);
        qsort(vl, (size_t)k, sizeof *vl, cmp_d);
        *bw = vb[k / 2];
        *lat = vl[k / 2];
    }
    free(vb);
    free(vl);
    return k;
}

static json_t *link_json(double bw, double lat)
{
    return json_pack("{s:f, s:f}", "bandwidth_gbps", bw * 8 / 1e9, "latency_ms",
                     lat * 1e3 < 1e-6 ? 1e-6 : lat * 1e3);
}

/* Everything planning needs, copied out of the job under the lock. */
typedef struct plan_in {
    char id[JOB_ID_LEN];
    uint64_t num;
    int epoch, start_step;
    char *config;
    json_t *opts;
    char owner[CERT_ID_LEN], dataset[65];
    int seq, n;
    char (*ids)[CERT_ID_LEN];
    char (*sites)[CERT_SITE_MAX + 1];
    json_t **res;
    cdev *dev;
    /* Where the links come from: every candidate that reported a profile,
     * planned or not. A pair of sites is measured by one device; when it is
     * gone, its measurements still describe the sites' network. */
    int nl;
    char (*lids)[CERT_ID_LEN];
    char (*lsites)[CERT_SITE_MAX + 1];
    json_t **lres;
} plan_in;

/* The pairs of sites (a site with itself where it has two candidates) that
 * the profiles measured no link between, as "a-b, c-c" into out; the plan
 * assumes the balancer's defaults for them. */
static void unmeasured_links(const plan_in *in, char *out, size_t cap)
{
    out[0] = 0;
    double bw, lat;
    for (int i = 0; i < in->n; i++) {
        int first_i = 1, count_i = 0;
        for (int x = 0; x < in->n; x++) {
            first_i &= x >= i || strcmp(in->sites[x], in->sites[i]) != 0;
            count_i += !strcmp(in->sites[x], in->sites[i]);
        }
        for (int k = i; k < in->n && first_i; k++) {
            int first_k = 1;
            for (int x = 0; x < k; x++)
                first_k &= strcmp(in->sites[x], in->sites[k]) != 0;
            int same = k == i;
            if (!(same ? count_i >= 2 : first_k && strcmp(in->sites[i], in->sites[k])))
                continue;
            if (!link_median(in->lres, in->lsites, in->lids, in->nl, in->sites[i], in->sites[k],
                             &bw, &lat)) {
                size_t o = strlen(out);
                if (o + 1 < cap)
                    snprintf(out + o, cap - o, "%s%s-%s", o ? ", " : "", in->sites[i], in->sites[k]);
            }
        }
    }
}

static void plan_in_free(plan_in *in)
{
    free(in->config);
    json_decref(in->opts);
    free(in->ids);
    free(in->sites);
    for (int i = 0; i < in->n; i++)
        json_decref(in->res[i]);
    free(in->res);
    free(in->dev);
    free(in->lids);
    free(in->lsites);
    for (int i = 0; i < in->nl; i++)
        json_decref(in->lres[i]);
    free(in->lres);
}

/* A profile's cpu pool into the balancer's device d, if it is well formed.
 * A device cannot make planning fail with it: a malformed pool is left out,
 * and a pool's size is what its first device said. */
static void pool_of(json_t *devs, json_t *cp, json_t *d)
{
    const char *name = json_string_value(json_object_get(cp, "name"));
    double cpus = json_number_value(json_object_get(cp, "cpus"));
    double size = json_number_value(json_object_get(cp, "pool_cpus"));
    if (!name || !*name || strlen(name) >= BAL_NAME_MAX || !(cpus >= 1e-3 && cpus <= 1e6) ||
        !(size >= 1e-3 && size <= 1e6))
        return;
    const char *ns = json_string_value(json_object_get(cp, "net_ns"));
    for (const char *c = name; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return;
    int ns_ok = ns && *ns && strlen(ns) < BAL_NAME_MAX;
    for (const char *c = ns; ns_ok && *c; c++)
        ns_ok = (unsigned char)*c >= 0x20 && *c != 0x7f;
    size_t k;
    json_t *o;
    json_array_foreach(devs, k, o) {
        const char *other = json_string_value(json_object_get(o, "cpu_pool"));
        if (other && !strcmp(other, name)) {
            size = json_number_value(json_object_get(o, "pool_cpus"));
            break;
        }
    }
    json_object_set_new(d, "cpu_pool", json_string(name));
    json_object_set_new(d, "pool_cpus", json_real(size));
    json_object_set_new(d, "cpus", json_real(cpus));
    if (ns_ok)
        json_object_set_new(d, "net_ns", json_string(ns));
}

/* Bytes a codec puts on the wire per byte of an fp32 tensor in rows of
 * `hidden` (device/wire/dev_codec.h): int8 adds a 4-byte scale per row,
 * topk:F sends F of the values with their indices. Frame headers, tags and
 * the valid masks beside the activations are left out (under 1% here). */
static double wire_ratio(const char *codec, int hidden)
{
    if (!codec || !strcmp(codec, "none"))
        return 1;
    if (!strcmp(codec, "fp16") || !strcmp(codec, "bf16"))
        return 0.5;
    if (!strcmp(codec, "int8"))
        return hidden > 0 ? (4.0 + hidden) / (4.0 * hidden) : 0.25;
    if (!strncmp(codec, "topk:", 5)) {
        double f = strtod(codec + 5, NULL);
        return f > 0 && f <= 1 ? 2 * f : 1;
    }
    return 1;
}

/* The balancer's inputs from the measured profiles. */
static bal_problem *problem_of(const plan_in *in, int bm, sl_err *err)
{
    json_t *devs = json_array();
    for (int i = 0; i < in->n; i++) {
        json_t *r = in->res[i];
        json_t *f = json_object_get(r, "unit_fwd_s"), *b = json_object_get(r, "unit_bwd_s");
        size_t U = json_array_size(f);
        json_t *us = json_pack("{s:[f,f], s:[f,f], s:[f,f]}", "embeddings",
                               json_number_value(json_array_get(f, 0)),
                               json_number_value(json_array_get(b, 0)), "encoder",
                               json_number_value(json_array_get(f, 1)),
                               json_number_value(json_array_get(b, 1)), "head",
                               json_number_value(json_array_get(f, U - 1)),
                               json_number_value(json_array_get(b, U - 1)));
        json_t *d = json_pack("{s:s, s:s, s:s, s:I, s:o}", "id", in->ids[i], "site", in->sites[i],
                              "backend", in->dev[i].backend, "memory_bytes",
                              json_integer_value(json_object_get(r, "memory_bytes")),
                              "unit_seconds", us);
        /* the optimizer step as measured; a device that did not time it
         * gets the balancer's estimate */
        json_t *o = json_object_get(r, "unit_optim_s");
        if (json_array_size(o) == U && U >= 2)
            json_object_set_new(d, "optim_seconds",
                                json_pack("{s:f, s:f, s:f}", "embeddings",
                                          json_number_value(json_array_get(o, 0)), "encoder",
                                          json_number_value(json_array_get(o, 1)), "head",
                                          json_number_value(json_array_get(o, U - 1))));
        pool_of(devs, json_object_get(r, "cpu_pool"), d);
        json_array_append_new(devs, d);
    }
    json_t *dj = json_pack("{s:o}", "devices", devs), *net = json_object(), *sites = json_object(),
           *links = json_array();
    double bw, lat;
    for (int i = 0; i < in->n; i++) {
        const char *s = in->sites[i];
        if (!json_object_get(sites, s) &&
            link_median(in->lres, in->lsites, in->lids, in->nl, s, s, &bw, &lat))
            json_object_set_new(sites, s, link_json(bw, lat));
        for (int k = i + 1; k < in->n; k++) {
            const char *t = in->sites[k];
            int seen = !strcmp(s, t);
            for (size_t x = 0; !seen && x < json_array_size(links); x++) {
                json_t *l = json_array_get(links, x);
                const char *a = json_string_value(json_object_get(l, "a")),
                           *b = json_string_value(json_object_get(l, "b"));
                seen = (!strcmp(a, s) && !strcmp(b, t)) || (!strcmp(a, t) && !strcmp(b, s));
            }
            if (!seen && link_median(in->lres, in->lsites, in->lids, in->nl, s, t, &bw, &lat)) {
                json_t *l = link_json(bw, lat);
                json_object_set_new(l, "a", json_string(s));
                json_object_set_new(l, "b", json_string(t));
                json_array_append_new(links, l);
            }
        }
    }
    json_object_set_new(net, "sites", sites);
    json_object_set_new(net, "links", links);
    char *dt = json_dumps(dj, JSON_COMPACT), *nt = json_dumps(net, JSON_COMPACT);
    json_decref(dj);
    json_decref(net);
    bal_problem *pb = bal_problem_parse(in->config, "config.json", bm, in->seq, dt,
                                        "the profiled devices", nt, "the measured links", err);
    free(dt);
    free(nt);
    /* the embeddings' output is the (bm x seq) x hidden fp32 activation */
    int hidden = pb ? (int)(bal_problem_unit(pb, 0)->out_bytes / (4 * (uint64_t)bm * in->seq)) : 0;
    const char *ca = json_string_value(json_object_get(in->opts, "codec_act"));
    const char *cg = json_string_value(json_object_get(in->opts, "codec_grad"));
    if (pb && bal_problem_set_wire(pb, wire_ratio(ca, hidden), wire_ratio(cg, hidden), err)) {
        bal_problem_free(pb);
        return NULL;
    }
    return pb;
}

static int owner_index(const plan_in *in)
{
    for (int i = 0; i < in->n; i++)
        if (!strcmp(in->ids[i], in->owner))
            return i;
    return -1;
}

/* The plan devices get: who runs which units, where to reach them, with
 * which keys, codecs and options; the balancer's plan and prediction too. */
static char *plan_text(const plan_in *in, const bal_plan *pl, const bal_timeline *tl)
{
    json_error_t je;
    json_t *cfg = json_loads(in->config, 0, &je), *bj = bal_plan_json(pl, tl);
    json_t *stages = json_array(), *bst = json_object_get(bj, "stages");
    for (int i = 0; i < pl->n_stages; i++) {
        const cdev *d = &in->dev[pl->stage[i].device];
        char hex[65];
        for (int k = 0; k < 32; k++)
            snprintf(hex + 2 * k, 3, "%02x", d->key[k]);
        json_t *b = json_array_get(bst, (size_t)i);
        json_array_append_new(stages, json_pack("{s:i, s:s, s:s, s:O, s:O, s:i, s:s, s:i}", "index",
                                                i, "device", d->id, "address", d->address,
                                                "first_unit", json_object_get(b, "first_unit"),
                                                "last_unit", json_object_get(b, "last_unit"),
                                                "warmup", pl->stage[i].warmup, "link_key", hex,
                                                "threads", d->threads ? (int)d->threads : 1));
    }
    json_t *o = in->opts;
    json_t *plan = json_pack(
        "{s:s, s:I, s:i, s:o, s:{s:s, s:s}, s:O, s:i, s:i, s:s, s:O, s:i, s:O, s:O, s:O, s:O, "
        "s:o, s:f, s:o}",
        "job", in->id, "job_num", (json_int_t)in->num, "epoch", in->epoch, "config", cfg, "data",
        "owner", in->owner, "dataset", in->dataset, "batch", json_object_get(o, "batch"), "seq",
        in->seq, "micro_batches", pl->micro_batches, "schedule", bal_schedule_name(pl->schedule),
        "steps", json_object_get(o, "steps"), "start_step", in->start_step, "checkpoint_every",
        json_object_get(o, "checkpoint_every"), "codec_act", json_object_get(o, "codec_act"),
        "codec_grad", json_object_get(o, "codec_grad"), "sealed", json_object_get(o, "sealed"),
        "stages", stages, "predicted_iteration_s", tl ? tl->iteration_s : pl->est_iter_s,
        "balancer", bj);
    json_object_set(plan, "options", o);
    char *text = json_dumps(plan, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(plan);
    return text;
}

/* Plans a job (no lock held): the balancer on the measured devices and
 * links, the data owner first. Returns the signed plan text or NULL with
 * the reason. */
static char *plan_job(coord_jobs *j, plan_in *in, uint8_t **sig, size_t *sig_len, sl_err *err)
{
    int m = (int)json_integer_value(json_object_get(in->opts, "micro_batches"));
    int B = (int)json_integer_value(json_object_get(in->opts, "batch"));
    bal_problem *pb = problem_of(in, B / m, err);
    if (!pb)
        return NULL;
    bal_opts bo = bal_opts_default();
    bo.micro_batches = m;
    bo.schedule = bal_schedule_parse(json_string_value(json_object_get(in->opts, "schedule")));
    int algo = bal_algo_parse(json_string_value(json_object_get(in->opts, "algo")));
    int owner = owner_index(in);
    if (json_is_true(json_object_get(in->opts, "u_shape")))
        bo.data_owner = owner;
    else
        bo.first_device = owner; /* its tokens stay home: it holds unit 0 */
    char *text = NULL;
    bal_timeline *tl = NULL;
    bal_plan *pl = owner < 0 ? NULL : bal_plan_make(pb, algo, &bo, err);
    if (owner < 0)
        sl_err_set(err, SL_ESTATE, "the data owner %s did not report a profile", in->owner);
    else if (pl && pl->stage[0].device != owner)
        sl_err_set(err, SL_ESTATE, "the plan does not start at the data owner %s", in->owner);
    else if (pl && (tl = bal_simulate(pl, pl->schedule, 0, err)))
        text = plan_text(in, pl, tl);
    if (text) {
        char *key = path_of(j->c->pki, "coordinator.key");
        if (cert_sign_data(key, text, strlen(text), sig, sig_len, err)) {
            free(text);
            text = NULL;
        }
        free(key);
    }
    bal_timeline_free(tl);
    bal_plan_free(pl);
    bal_problem_free(pb);
    return text;
}

/* Takes the plan: its stages' devices, the step accumulators. */
static int adopt_plan(cjob *jb, char *text, uint8_t *sig, size_t sig_len, sl_err *err)
{
    json_error_t je;
    json_t *pj = json_loads(text, 0, &je);
    json_t *st = json_object_get(pj, "stages");
    int p = (int)json_array_size(st);
    if (!pj || p < 1)
        return sl_err_set(err, SL_EINTERNAL, "plan of job %s has no stages", jb->id);
    free(jb->plan);
    free(jb->sig);
    json_decref(jb->plan_json);
    jb->plan = text;
    jb->sig = sig;
    jb->sig_len = sig_len;
    jb->plan_json = pj;
    jb->p = p;
    free(jb->stage_dev);
    jb->stage_dev = sl_xcalloc((size_t)p, sizeof *jb->stage_dev);
    jb->ndev = 0;
    for (int i = 0; i < p; i++) {
        const char *d = json_string_value(json_object_get(json_array_get(st, (size_t)i), "device"));
        snprintf(jb->stage_dev[i], CERT_ID_LEN, "%s", d ? d : "");
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= !strcmp(jb->stage_dev[k], jb->stage_dev[i]);
        jb->ndev += !seen;
    }
    jb->seq = (int)json_integer_value(json_object_get(pj, "seq"));
    free(jb->acc);
    jb->acc = sl_xcalloc((size_t)ACC_STEPS * p, sizeof *jb->acc);
    for (int i = 0; i < ACC_STEPS; i++) {
        jb->acc_step[i] = -1;
        jb->acc_done[i] = 0;
    }
    return 0;
}

/* A candidate a re-plan may use: profiled, not lost, online and reachable. */
static int usable(const coord_jobs *j, const cjob *jb, int k, int64_t now)
{
    const cand *c = &jb->cand[k];
    const cdev *d = NULL;
    for (int i = 0; i < j->ndev && !d; i++)
        if (!strcmp(j->dev[i].id, c->id))
            d = &j->dev[i];
    return c->result && !json_object_get(c->result, "failed") && !c->lost_ms && d &&
           dev_online(j, d, now) && d->address[0] && d->has_key;
}

/* Under the lock: what plan_job needs. The first plan takes every candidate
 * that reported a profile; a re-plan only the usable ones. */
static void plan_in_of(coord_jobs *j, cjob *jb, plan_in *in, int replan)
{
    int64_t now = sl_unix_time();
    memset(in, 0, sizeof *in);
    snprintf(in->id, sizeof in->id, "%s", jb->id);
    in->num = jb->num;
    in->epoch = jb->epoch + 1;
    in->start_step = jb->committed + 1;
    in->config = sl_xstrdup(jb->config);
    in->opts = json_deep_copy(jb->opts);
    snprintf(in->owner, sizeof in->owner, "%s", jb->owner);
    snprintf(in->dataset, sizeof in->dataset, "%s", jb->dataset);
    in->seq = jb->seq;
    in->ids = sl_xcalloc((size_t)jb->ncand + 1, sizeof *in->ids);
    in->sites = sl_xcalloc((size_t)jb->ncand + 1, sizeof *in->sites);
    in->res = sl_xcalloc((size_t)jb->ncand + 1, sizeof *in->res);
    in->dev = sl_xcalloc((size_t)jb->ncand + 1, sizeof *in->dev);
    in->lids = sl_xcalloc((size_t)jb->ncand + 1, sizeof *in->lids);
    in->lsites = sl_xcalloc((size_t)jb->ncand + 1, sizeof *in->lsites);
    in->lres = sl_xcalloc((size_t)jb->ncand + 1, sizeof *in->lres);
    for (int i = 0; i < jb->ncand; i++) {
        json_t *r = jb->cand[i].result;
        const cdev *d = find_dev(j, jb->cand[i].id);
        if (!r || json_object_get(r, "failed"))
            continue;
        snprintf(in->lids[in->nl], CERT_ID_LEN, "%s", jb->cand[i].id);
        in->lres[in->nl++] = json_incref(r);
        if (!d || (replan && !usable(j, jb, i, now)))
            continue;
        snprintf(in->ids[in->n], CERT_ID_LEN, "%s", jb->cand[i].id);
        in->res[in->n] = json_incref(r);
        in->dev[in->n] = *d;
        in->dev[in->n].datasets = NULL;
        in->dev[in->n].n_datasets = 0;
        in->n++;
    }
}

/* The sites of in's devices from the registry (outside the lock): one read
 * for the link sources; the planned devices are among them, in the same
 * order (plan_in_of). */
static int plan_in_sites(coord_jobs *j, plan_in *in, sl_err *err)
{
    site_of_ctx sc = {in->lids, in->lsites, in->nl};
    if (coord_state_list_devices(j->db, take_site, &sc, err))
        return -1;
    for (int i = 0, k = 0; i < in->n; i++, k++) {
        while (k < in->nl && strcmp(in->lids[k], in->ids[i]))
            k++;
        if (k < in->nl)
            memcpy(in->sites[i], in->lsites[k], sizeof in->sites[i]);
    }
    return 0;
}

static double predicted_of(const json_t *plan)
{
    return json_number_value(json_object_get(plan, "predicted_iteration_s"));
}

/* A new epoch: what the old one left unfinished is dropped (parts of
 * uncommitted steps, their metrics rows, reports in flight); the steps after
 * the committed one are trained again. */
static void epoch_reset(cjob *jb)
{
    for (int i = 0; i < ACC_STEPS; i++) {
        free(jb->up[i].parts);
        memset(&jb->up[i], 0, sizeof jb->up[i]);
    }
    drop_partials(jb);
    jb->loss = metrics_truncate(jb);
    jb->step = jb->committed;
    json_decref(jb->last_stages);
    jb->last_stages = NULL;
    fail_reset(jb);
}

enum { PLAN_FIRST, PLAN_RECOVER, PLAN_JOIN };

/* Plans the job outside the lock (called and returns with it held).
 * PLAN_FIRST: the profiled candidates; a failure fails the job.
 * PLAN_RECOVER: the usable candidates, from the committed step, with the
 * epoch bumped; a failure makes the job wait for devices.
 * PLAN_JOIN: as PLAN_RECOVER with the joiners, while the job runs on; taken
 * only when predicted faster than the running plan by the job's margin. */
static void engine_plan(coord_jobs *j, cjob *jb, int mode)
{
    plan_in in;
    plan_in_of(j, jb, &in, mode != PLAN_FIRST);
    int epoch = jb->epoch, committed = jb->committed;
    jb->planning = 1;
    if (mode != PLAN_JOIN)
        set_state(j, jb, "planning", mode == PLAN_RECOVER ? jb->reason : NULL);
    pthread_mutex_unlock(&j->mu);
    sl_err err = {0};
    uint8_t *sig = NULL;
    size_t sig_len = 0;
    char *text = NULL;
    double t0 = sl_now_s();
    char unmeasured[512] = "";
    if (!plan_in_sites(j, &in, &err))
        text = plan_job(j, &in, &sig, &sig_len, &err);
    if (text)
        unmeasured_links(&in, unmeasured, sizeof unmeasured);
    double dt = sl_now_s() - t0;
    pthread_mutex_lock(&j->mu);
    jb->planning = 0;
    json_error_t je;
    json_t *pj = text ? json_loads(text, 0, &je) : NULL;
    double pred = predicted_of(pj), now_pred = predicted_of(jb->plan_json);
    json_decref(pj);
    int take = 1;
    if (mode == PLAN_JOIN) {
        char who[600] = "";
        for (int i = 0; i < jb->ncand; i++)
            if (jb->cand[i].joining && jb->cand[i].result) {
                size_t o = strlen(who);
                snprintf(who + o, sizeof who - o, "%s%.40s", o ? "," : "", jb->cand[i].id);
            }
        if (strcmp(jb->state, "running") || jb->epoch != epoch || jb->committed != committed) {
            take = 0; /* the job moved on meanwhile: weighed again at the next commit */
        } else {
            for (int i = 0; i < jb->ncand; i++)
                if (jb->cand[i].joining && jb->cand[i].result)
                    jb->cand[i].joining = 0;
            double margin = json_number_value(json_object_get(jb->opts, "replan_margin"));
            if (!text) {
                take = 0;
                job_event(j, jb, "weighed", who, "not taken: planning with them failed: %.400s", err.msg);
            } else if (pred > (1 - margin) * now_pred) {
                take = 0;
                job_event(j, jb, "weighed", who, "not taken: predicted %.4f s per step with them, "
                          "%.4f s now (margin %.0f%%)", pred, now_pred, 100 * margin);
            } else {
                job_event(j, jb, "weighed", who, "taken: predicted %.4f s per step with them, "
                          "%.4f s now", pred, now_pred);
            }
        }
    } else if (strcmp(jb->state, "planning")) {
        take = 0; /* stopped meanwhile */
    }
    if (!take) {
        free(text);
        free(sig);
    } else if (!text || adopt_plan(jb, text, sig, sig_len, &err)) {
        if (text) {
            free(text);
            free(sig);
        }
        char why[600];
        if (mode == PLAN_FIRST) {
            snprintf(why, sizeof why, "planning: %.560s", err.msg);
            set_state(j, jb, "failed", why);
        } else {
            snprintf(why, sizeof why, "no plan over the %d devices left (%.400s); waiting for "
                     "devices", in.n, err.msg);
            job_event(j, jb, "waiting", "", "%s", why);
            jb->wait_kind = WAIT_DEVICES;
            jb->wait_ms = sl_unix_ms();
            set_state(j, jb, "waiting", why);
        }
    } else {
        jb->epoch = in.epoch;
        if (mode != PLAN_FIRST)
            epoch_reset(jb);
        for (int i = 0; i < jb->ncand; i++) /* weighed by this plan */
            if (jb->cand[i].result)
                jb->cand[i].joining = 0;
        sl_log_info("coordinator: job planned", "job=%s epoch=%d stages=%d devices=%d "
                    "predicted_s=%.4f planning_s=%.3f start=%d", jb->id, jb->epoch, jb->p, jb->ndev,
                    predicted_of(jb->plan_json), dt, in.start_step);
        if (mode != PLAN_FIRST) {
            char devs[600] = "";
            for (int i = 0; i < jb->p; i++) {
                size_t o = strlen(devs);
                if (i == 0 || strcmp(jb->stage_dev[i], jb->stage_dev[i - 1]))
                    snprintf(devs + o, sizeof devs - o, "%s%.40s", o ? "," : "", jb->stage_dev[i]);
            }
            job_event(j, jb, "planned", "", "epoch %d: %d stage%s on %s, from step %d, predicted "
                      "%.4f s per step, planned in %.3f s", jb->epoch, jb->p, jb->p == 1 ? "" : "s",
                      devs, in.start_step,
                      predicted_of(jb->plan_json), dt);
        }
        if (unmeasured[0]) {
            sl_log_warn("coordinator: links not measured", "job=%s pairs=\"%s\"", jb->id, unmeasured);
            job_event(j, jb, "links_assumed", "", "no link measured between the sites %s: planned "
                      "with the defaults (inside a site 10 Gbit/s and 0.1 ms, between sites 1 "
                      "Gbit/s and 50 ms)", unmeasured);
        }
        set_state(j, jb, "running", NULL);
    }
    plan_in_free(&in);
}

/* Declares a candidate lost (once). */
static void mark_lost(coord_jobs *j, cjob *jb, int k, const char *how)
{
    cand *c = &jb->cand[k];
    if (c->lost_ms)
        return;
    c->lost_ms = sl_unix_ms();
    c->joining = 0;
    jb->n_lost++;
    job_event(j, jb, "lost", c->id, "%s", how);
}

/* A running job: devices whose heartbeats stopped, and the failure reports
 * of the epoch once they are all in (or DECIDE_MS after the first). A device
 * named by a neighbour whose link to it broke is lost unless it reported a
 * failure itself (then its own report says why). A heartbeat is no proof of
 * life here: one sent just before a kill may be handled after the reports. */
static void check_running(coord_jobs *j, cjob *jb, int64_t now)
{
    int64_t now_ms = sl_unix_ms();
    char lost[600] = "";
    for (int i = 0; i < jb->p; i++) {
        int k = is_candidate(jb, jb->stage_dev[i]);
        const cdev *d = find_dev(j, jb->stage_dev[i]);
        if (k < 0 || jb->cand[k].lost_ms || (d && dev_online(j, d, now)))
            continue;
        char how[200];
        snprintf(how, sizeof how, "no heartbeat for %lld s (3 intervals)",
                 d ? (long long)(now - d->seen) : -1LL);
        mark_lost(j, jb, k, how);
        size_t o = strlen(lost);
        snprintf(lost + o, sizeof lost - o, "%s%.40s (no heartbeat)", o ? ", " : "", jb->cand[k].id);
    }
    if (jb->fail_ms) {
        int all = 1;
        for (int i = 0; i < jb->p; i++) {
            int k = is_candidate(jb, jb->stage_dev[i]);
            all &= k >= 0 && (jb->cand[k].reported || jb->cand[k].lost_ms);
        }
        if (!lost[0] && !all && now_ms - jb->fail_ms < DECIDE_MS)
            return;
        for (int k = 0; k < jb->ncand; k++) {
            cand *c = &jb->cand[k];
            if (!c->suspect || c->reported || c->lost_ms || in_plan(jb, c->id) < 0)
                continue;
            mark_lost(j, jb, k, "a neighbour's link to it broke and it reported nothing");
            size_t o = strlen(lost);
            snprintf(lost + o, sizeof lost - o, "%s%.40s (link broke)", o ? ", " : "", c->id);
        }
    }
    char why[800];
    if (lost[0])
        snprintf(why, sizeof why, "lost %.600s; running again from step %d", lost, jb->committed + 1);
    else if (jb->fail_ms)
        snprintf(why, sizeof why, "%.600s; running again from step %d", jb->fail_why, jb->committed + 1);
    else
        return;
    job_recover(j, jb, why);
}

/* Devices that came online during the job (enrolled, or back after being
 * lost) are profiled for it; a commit weighs them (PLAN_JOIN). */
static void find_joiners(coord_jobs *j, cjob *jb, int64_t now)
{
    for (int i = 0; i < j->ndev; i++) {
        const cdev *d = &j->dev[i];
        if (!dev_online(j, d, now) || !d->address[0] || !d->has_key || !strcmp(d->id, jb->owner) ||
            !allowed(jb, d->id))
            continue;
        int k = is_candidate(jb, d->id);
        if (k >= 0 && !(jb->cand[k].lost_ms && d->seen_ms > jb->cand[k].lost_ms))
            continue;
        cand *c = cand_add(jb, d->id);
        json_decref(c->result);
        c->result = NULL;
        c->joining = 1;
        job_event(j, jb, "joining", d->id, "%s; profiling it", c->lost_ms ? "back online" : "online");
        c->lost_ms = 0;
        assign_joiner_links(j, jb, (int)(c - jb->cand));
    }
}

static int owner_available(const coord_jobs *j, const cjob *jb, int64_t now)
{
    int k = is_candidate(jb, jb->owner);
    const cdev *d = NULL;
    for (int i = 0; i < j->ndev && !d; i++)
        if (!strcmp(j->dev[i].id, jb->owner))
            d = &j->dev[i];
    return k >= 0 && d && dev_online(j, d, now) && (!jb->cand[k].lost_ms || d->seen_ms > jb->cand[k].lost_ms);
}

/* One pass over the jobs: the steps that wait for no device. Returns 1 when
 * it planned (the lock was released: the caller starts over). */
static int engine_pass(coord_jobs *j)
{
    int64_t now = sl_unix_time(), now_ms = sl_unix_ms();
    for (int i = 0; i < j->njob; i++) {
        cjob *jb = j->job[i];
        if (jb->planning)
            continue;
        if (!strcmp(jb->state, "checking") && jb->data_info && settled(j)) {
            start_profiling(j, jb);
        } else if (!strcmp(jb->state, "checking") && !jb->data_info &&
                   now - jb->check_since > CHECK_WAIT_S) {
            char why[200];
            snprintf(why, sizeof why, "the data owner %s did not check %s within %d s (offline?)",
                     jb->owner, jb->dataset, CHECK_WAIT_S);
            set_state(j, jb, "failed", why);
        } else if (!strcmp(jb->state, "profiling")) {
            int left = 0, links_left = 0;
            for (int k = 0; k < jb->ncand; k++) {
                left += !jb->cand[k].result;
                links_left += !jb->cand[k].result && !jb->cand[k].links;
            }
            if (jb->profile_round == PROFILE_LINKS &&
                (links_left == 0 || now - jb->round_started > LINKS_WAIT_S)) {
                jb->profile_round = PROFILE_UNITS;
                jb->round_started = now;
                if (links_left)
                    sl_log_warn("coordinator: timing units before every link was measured",
                                "job=%s unmeasured=%d wait_s=%d", jb->id, links_left, LINKS_WAIT_S);
            }
            if (left == 0 || (jb->profile_round == PROFILE_UNITS &&
                              now - jb->round_started > PROFILE_WAIT_S)) {
                engine_plan(j, jb, PLAN_FIRST);
                return 1;
            }
        } else if (!strcmp(jb->state, "running")) {
            if (jb->committed >= jb->steps && jb->step >= jb->steps) {
                set_state(j, jb, "done", NULL);
                continue;
            }
            check_running(j, jb, now);
            if (strcmp(jb->state, "running"))
                continue;
            find_joiners(j, jb, now);
            if (jb->weigh_joiners) {
                jb->weigh_joiners = 0;
                for (int k = 0; k < jb->ncand; k++)
                    if (jb->cand[k].joining && jb->cand[k].result) {
                        engine_plan(j, jb, PLAN_JOIN);
                        return 1;
                    }
            }
        } else if (!strcmp(jb->state, "recovering")) {
            if (jb->restarted) { /* the devices of the plan get a while to come back */
                int all = 1;
                for (int s = 0; s < jb->p; s++) {
                    const cdev *d = find_dev(j, jb->stage_dev[s]);
                    all &= d && dev_online(j, d, now);
                }
                if (!all && now_ms - jb->wait_ms < 3 * (int64_t)j->c->o.heartbeat_ms + 2000)
                    continue;
                jb->restarted = 0;
            }
            if (!owner_available(j, jb, now)) {
                char why[300];
                snprintf(why, sizeof why, "the data owner %s is offline; the job goes on from step "
                         "%d when it is back", jb->owner, jb->committed + 1);
                job_event(j, jb, "waiting", jb->owner, "%s", why);
                jb->wait_kind = WAIT_OWNER;
                jb->wait_ms = now_ms;
                set_state(j, jb, "waiting", why);
                continue;
            }
            engine_plan(j, jb, PLAN_RECOVER);
            return 1;
        } else if (!strcmp(jb->state, "waiting")) {
            int go = 0;
            if (jb->wait_kind == WAIT_OWNER) {
                go = owner_available(j, jb, now);
                if (go) {
                    jb->cand[is_candidate(jb, jb->owner)].lost_ms = 0;
                    job_event(j, jb, "returned", jb->owner, "the data owner is back");
                }
            } else if (jb->wait_kind == WAIT_STORE) {
                go = now_ms - jb->wait_ms >= STORE_RETRY_S * 1000;
            } else {
                find_joiners(j, jb, now);
                go = now_ms - jb->wait_ms >= WAIT_RETRY_S * 1000;
            }
            if (go) {
                jb->detect_ms = jb->wait_ms = now_ms;
                set_state(j, jb, "recovering", "re-planning");
            }
        }
    }
    return 0;
}

static void *engine_main(void *arg)
{
    coord_jobs *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stop) {
        if (engine_pass(j))
            continue;
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

/* ---- open and close ---------------------------------------------------------- */

/* The candidates' profiles of a job, the data owner first. */
static int load_profiles(coord_jobs *j, cjob *jb, sl_err *err)
{
    sqlite3 *db = coord_state_db(j->db);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT device, result FROM job_profiles WHERE job = ?"
                           " ORDER BY device != ?, at, device", -1, &st, NULL) != SQLITE_OK)
        return sl_err_set(err, SL_EIO, "sqlite: %s", sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, jb->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, jb->owner, -1, SQLITE_STATIC);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *dev = (const char *)sqlite3_column_text(st, 0);
        json_error_t je;
        json_t *res = json_loads((const char *)sqlite3_column_text(st, 1), 0, &je);
        if (!dev || !cert_valid_device_id(dev) || !res) {
            json_decref(res);
            continue;
        }
        cand *c = cand_add(jb, dev);
        json_decref(c->result);
        c->result = res;
    }
    sqlite3_finalize(st);
    return 0;
}

static int load_jobs(coord_jobs *j, sl_err *err)
{
    sqlite3 *db = coord_state_db(j->db);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT id, num, state, reason, config, options, owner, dataset,"
                           " data_info, epoch, plan, plan_sig, step, committed_step, loss, created_at,"
                           " updated_at FROM jobs ORDER BY created_at", -1, &st, NULL) != SQLITE_OK)
        return sl_err_set(err, SL_EIO, "sqlite: %s", sqlite3_errmsg(db));
    int rc = 0;
    while (!rc && sqlite3_step(st) == SQLITE_ROW) {
        cjob *jb = sl_xcalloc(1, sizeof *jb);
        json_error_t je;
#define TXT(k) ((const char *)sqlite3_column_text(st, (k)) ? (const char *)sqlite3_column_text(st, (k)) : "")
        snprintf(jb->id, sizeof jb->id, "%s", TXT(0));
        jb->num = (uint64_t)sqlite3_column_int64(st, 1);
        snprintf(jb->state, sizeof jb->state, "%s", TXT(2));
        snprintf(jb->reason, sizeof jb->reason, "%s", TXT(3));
        jb->config = sl_xstrdup(TXT(4));
        jb->opts = json_loads(TXT(5), 0, &je);
        snprintf(jb->owner, sizeof jb->owner, "%s", TXT(6));
        snprintf(jb->dataset, sizeof jb->dataset, "%s", TXT(7));
        jb->data_info = *TXT(8) ? json_loads(TXT(8), 0, &je) : NULL;
        jb->epoch = sqlite3_column_int(st, 9);
        const char *plan = TXT(10);
        jb->step = sqlite3_column_int(st, 12);
        jb->committed = sqlite3_column_int(st, 13);
        jb->loss = sqlite3_column_double(st, 14);
        jb->created = sqlite3_column_int64(st, 15);
        jb->check_since = sl_unix_time();
#undef TXT
        jb->dir = path_of(j->root, jb->id);
        for (int i = 0; i < ACC_STEPS; i++)
            jb->acc_step[i] = -1;
        if (!jb->opts) {
            sl_log_error("coordinator: job with unreadable options left out", "job=%s", jb->id);
            job_free(jb);
            continue;
        }
        jb->steps = oint(jb, "steps");
        jb->batch = oint(jb, "batch");
        if (jb->data_info)
            jb->seq = (int)json_integer_value(json_object_get(jb->data_info, "seq_len"));
        if (*plan) {
            int n = sqlite3_column_bytes(st, 11);
            uint8_t *sig = sl_xmalloc((size_t)n + 1);
            memcpy(sig, sqlite3_column_blob(st, 11), (size_t)n);
            rc = adopt_plan(jb, sl_xstrdup(plan), sig, (size_t)n, err);
        }
        /* checked (its data described) but not planned: profiled again, once
         * the devices had time to come back */
        if (!*plan && (!strcmp(jb->state, "planning") || !strcmp(jb->state, "profiling")))
            snprintf(jb->state, sizeof jb->state, "checking");
        if (job_ended(jb))
            jb->ended = sqlite3_column_int64(st, 16);
        j->job = sl_xrealloc(j->job, (size_t)(j->njob + 1) * sizeof *j->job);
        j->job[j->njob++] = jb;
    }
    sqlite3_finalize(st);
    for (int i = 0; !rc && i < j->njob; i++) {
        cjob *jb = j->job[i];
        if (job_ended(jb) || !jb->plan || !strcmp(jb->state, "checking"))
            continue;
        /* a job that had a plan goes on from its committed step in a new
         * epoch, once the plan's devices are back */
        rc = load_profiles(j, jb, err);
        drop_partials(jb);
        jb->loss = metrics_truncate(jb);
        jb->step = jb->committed;
        jb->restarted = 1;
        jb->detect_ms = jb->wait_ms = sl_unix_ms();
        job_event(j, jb, "coordinator_restarted", "", "was %s; going on from step %d",
                  jb->state, jb->committed + 1);
        snprintf(jb->state, sizeof jb->state, "recovering");
        snprintf(jb->reason, sizeof jb->reason, "the coordinator restarted; waiting for the "
                 "plan's devices");
    }
    return rc;
}

/* Whether any enrolled device ever heartbeated: a restart, after which the
 * devices are coming back. */
static int devices_seen_before(coord_jobs *j)
{
    sqlite3_stmt *st = NULL;
    int seen = sqlite3_prepare_v2(coord_state_db(j->db), "SELECT 1 FROM devices WHERE "
                                  "last_heartbeat > 0 LIMIT 1", -1, &st, NULL) == SQLITE_OK &&
               sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    return seen;
}

coord_jobs *coord_jobs_open(coord *c, sl_err *err)
{
    coord_jobs *j = sl_xcalloc(1, sizeof *j);
    j->c = c;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->root = path_of(c->o.state, "jobs");
    if (sodium_init() < 0) {
        sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
        goto fail;
    }
    char *up = path_of(j->root, "uploads");
    int bad = !(j->db = coord_state_attach(c->state, err)) || db_exec(j, job_schema, err) ||
              sl_mkdir(j->root, 0700, err) || !(j->uploads = coord_uploads_open(up, err)) ||
              load_jobs(j, err);
    free(up);
    if (bad)
        goto fail;
    if (devices_seen_before(j))
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
        job_free(j->job[i]);
    free(j->job);
    for (int i = 0; i < j->ndev; i++) {
        for (int k = 0; k < j->dev[i].n_datasets; k++)
            free(j->dev[i].datasets[k]);
        free(j->dev[i].datasets);
    }
    free(j->dev);
    coord_state_close(j->db);
    coord_uploads_close(j->uploads);
    free(j->root);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* ---- observation: figures for /metrics and the dashboard ------------------- */

#define OBS_STAGES_MAX 256 /* (stage, device) pairs a job keeps figures for */
#define OBS_LINKS_MAX 512
#define OBS_RING 4         /* steps whose traces may be arriving at once */

struct job_obs {
    coord_obs_stage *stage;
    int nstage;
    coord_obs_link *link;
    int nlink;
    uint64_t up_bytes, commits;
    double up_s;
    int up_step[ACC_STEPS];
    double up_t0[ACC_STEPS];
    coord_obs_trace *slot[OBS_RING]; /* traces of a step, arriving */
    int have[OBS_RING];
    coord_obs_trace *latest;         /* the latest step every stage traced */
};

static void obs_free(struct job_obs *o)
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

static struct job_obs *obs_of(cjob *jb)
{
    if (!jb->obs) {
        jb->obs = sl_xcalloc(1, sizeof *jb->obs);
        for (int i = 0; i < ACC_STEPS; i++)
            jb->obs->up_step[i] = -1;
    }
    return jb->obs;
}

/* A duration from a device: 0 unless finite and plausible. */
static double obs_secs(double x) { return isfinite(x) && x > 0 && x < 1e7 ? x : 0; }

static void obs_link_add(struct job_obs *o, int from, int to, uint64_t raw, uint64_t wire)
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
static void obs_report(cjob *jb, const Skyloom__V1__ReportStepRequest *r)
{
    struct job_obs *o = obs_of(jb);
    int i = (int)r->stage, p = jb->p;
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
    coord_obs_seg *seg = obs_segs(r, step);
    if (!seg) {
        if (r->n_ops)
            sl_log_debug("coordinator: a step's ops ignored (out of range)", "job=%s device=%s "
                         "step=%u ops=%zu", jb->id, r->device_id, r->step, r->n_ops);
        return;
    }
    int k = (int)(r->step % OBS_RING);
    coord_obs_trace *t = o->slot[k];
    if (!t || t->step != (int)r->step || t->epoch != jb->epoch || t->p != p) {
        coord_trace_free(t);
        t = o->slot[k] = obs_trace_new(p);
        t->step = (int)r->step;
        t->epoch = jb->epoch;
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

/* Frame refusals a device counted, by reason name ([a-z0-9_], 1..32). */
static void obs_refused(coord_jobs *j, const Skyloom__V1__ReportStepRequest *r)
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
        for (int k = 0; k < j->nrefused && !e; k++)
            if (!strcmp(j->refused[k].name, name))
                e = &j->refused[k];
        if (!e && j->nrefused < COORD_OBS_NAMES) {
            e = &j->refused[j->nrefused++];
            snprintf(e->name, sizeof e->name, "%s", name);
            e->value = 0;
        }
        if (e)
            e->value = v > UINT64_MAX - e->value ? UINT64_MAX : e->value + v;
    }
}

static void obs_upload(cjob *jb, int step, size_t bytes)
{
    struct job_obs *o = obs_of(jb);
    o->up_bytes += bytes;
    int k = step % ACC_STEPS;
    if (o->up_step[k] != step) {
        o->up_step[k] = step;
        o->up_t0[k] = sl_now_s();
    }
}

static void obs_commit(cjob *jb, int step)
{
    struct job_obs *o = obs_of(jb);
    int k = step % ACC_STEPS;
    o->commits++;
    if (o->up_step[k] == step) {
        o->up_s += sl_now_s() - o->up_t0[k];
        o->up_step[k] = -1;
    }
}

static char *obs_trace_text(const cjob *jb)
{
    char *t = jb->obs && jb->obs->latest ? coord_trace_json(jb->id, jb->obs->latest) : NULL;
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

static void obs_job_fill(const cjob *jb, int detail, coord_obs_job *x)
{
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", jb->id);
    snprintf(x->state, sizeof x->state, "%s", jb->state);
    snprintf(x->reason, sizeof x->reason, "%s", jb->reason);
    snprintf(x->owner, sizeof x->owner, "%s", jb->owner);
    snprintf(x->dataset, sizeof x->dataset, "%s", jb->dataset);
    x->steps = jb->steps;
    x->step = jb->step;
    x->committed = jb->committed;
    x->epoch = jb->epoch;
    x->p = jb->p;
    x->batch = jb->batch;
    x->seq = jb->seq;
    x->loss = jb->loss;
    x->tokens_s = jb->tokens_s;
    x->step_s = json_number_value(json_object_get(jb->last_stages, "step_s"));
    x->created = jb->created;
    x->devices_lost = jb->n_lost;
    x->recoveries = jb->n_recoveries;
    const struct job_obs *o = jb->obs;
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
    }
    if (detail) {
        x->plan = jb->plan ? sl_xstrdup(jb->plan) : NULL;
        x->trace = o ? obs_trace_copy(o->latest) : NULL;
    }
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
    cjob *one = id ? find_job(j, id) : NULL;
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
        coord_trace_free(s->job[i].trace);
    }
    free(s->job);
    free(s->dev);
    memset(s, 0, sizeof *s);
}

/* ---- a device's latest profile (skyloom status) ----------------------------- */

static double *doubles_of(const json_t *a, size_t *n)
{
    *n = json_array_size(a) < 4096 ? json_array_size(a) : 4096;
    double *v = sl_xcalloc(*n + 1, sizeof *v);
    for (size_t i = 0; i < *n; i++)
        v[i] = json_number_value(json_array_get(a, i));
    return v;
}

int coord_jobs_latest_profile(coord_state *db, const char *device, Skyloom__V1__JobProfile **out,
                              sl_err *err)
{
    *out = NULL;
    sqlite3 *s = coord_state_db(db);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s, "SELECT p.job, p.result, p.at, j.options, j.data_info"
                           " FROM job_profiles p LEFT JOIN jobs j ON j.id = p.job"
                           " WHERE p.device = ? ORDER BY p.at DESC, p.rowid DESC LIMIT 1",
                           -1, &st, NULL) != SQLITE_OK)
        return sl_err_set(err, SL_EIO, "sqlite: %s", sqlite3_errmsg(s));
    sqlite3_bind_text(st, 1, device, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        return rc == SQLITE_DONE ? 0 : sl_err_set(err, SL_EIO, "sqlite: %s", sqlite3_errmsg(s));
    }
#define COL(k) ((const char *)sqlite3_column_text(st, (k)) ? (const char *)sqlite3_column_text(st, (k)) : "")
    json_error_t je;
    json_t *res = json_loads(COL(1), 0, &je), *opts = json_loads(COL(3), 0, &je),
           *info = json_loads(COL(4), 0, &je);
    Skyloom__V1__JobProfile *p = sl_xmalloc(sizeof *p);
    skyloom__v1__job_profile__init(p);
    p->job_id = sl_xstrdup(COL(0));
    p->measured_at = sqlite3_column_int64(st, 2);
#undef COL
    sqlite3_finalize(st);
    json_int_t batch = json_integer_value(json_object_get(opts, "batch"));
    json_int_t micro = json_integer_value(json_object_get(opts, "micro_batches"));
    p->micro_batch = micro > 0 && batch > 0 ? (uint32_t)(batch / micro) : 0;
    p->seq = (uint32_t)json_integer_value(json_object_get(info, "seq_len"));
    const char *why = json_string_value(json_object_get(res, "reason"));
    if (!res || json_object_get(res, "failed"))
        p->failed = sl_xstrdup(why && *why ? why : "no usable profile");
    else
        p->failed = sl_xstrdup("");
    p->unit_fwd_s = doubles_of(json_object_get(res, "unit_fwd_s"), &p->n_unit_fwd_s);
    p->unit_bwd_s = doubles_of(json_object_get(res, "unit_bwd_s"), &p->n_unit_bwd_s);
    p->unit_optim_s = doubles_of(json_object_get(res, "unit_optim_s"), &p->n_unit_optim_s);
    p->memory_bytes = (uint64_t)json_integer_value(json_object_get(res, "memory_bytes"));
    p->threads = (uint32_t)json_integer_value(json_object_get(res, "threads"));
    const char *be = json_string_value(json_object_get(res, "backend"));
    p->backend = sl_xstrdup(be ? be : "");
    json_t *links = json_object_get(res, "links");
    size_t nl = json_array_size(links) < 4096 ? json_array_size(links) : 4096;
    p->links = sl_xcalloc(nl + 1, sizeof *p->links);
    for (size_t i = 0; i < nl; i++) {
        json_t *l = json_array_get(links, i);
        const char *peer = json_string_value(json_object_get(l, "peer"));
        Skyloom__V1__LinkProfile *x = sl_xmalloc(sizeof *x);
        skyloom__v1__link_profile__init(x);
        x->peer = sl_xstrdup(peer && cert_valid_device_id(peer) ? peer : "?");
        x->rtt_s = json_number_value(json_object_get(l, "rtt_s"));
        x->bandwidth_bytes_per_s = json_number_value(json_object_get(l, "bandwidth_Bps"));
        p->links[p->n_links++] = x;
    }
    json_decref(res);
    json_decref(opts);
    json_decref(info);
    *out = p;
    return 0;
}

void coord_jobs_profile_free(Skyloom__V1__JobProfile *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_links; i++) {
        free(p->links[i]->peer);
        free(p->links[i]);
    }
    free(p->links);
    free(p->unit_fwd_s);
    free(p->unit_bwd_s);
    free(p->unit_optim_s);
    free(p->job_id);
    free(p->failed);
    free(p->backend);
    free(p);
}
