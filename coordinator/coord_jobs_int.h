/* coord_jobs_int.h - the job manager's driver, as its RPC handlers
 * (coord_jobs_rpc.c) use it.
 *
 * The rule of the driver: a job's state machine (coord_job.h) is changed
 * only under j->mu, by one of its event functions; the effects those
 * return are queued on the job, and run in order after j->mu is released,
 * by whichever thread finds the queue idle (coord_jobs_drain). Effects that
 * touch the job's files take its io_mu (never while holding j->mu: io_mu
 * comes first). Nothing does I/O under j->mu, so heartbeats, which take it
 * briefly, are never held up by a slow disk. Jobs are never freed while the
 * coordinator runs: a cjob pointer stays valid after the lock is released. */
#ifndef COORD_JOBS_INT_H
#define COORD_JOBS_INT_H

#include <pthread.h>

#include "coord_ckpt.h"
#include "coord_internal.h"
#include "coord_job.h"
#include "coord_jobstore.h"
#include "coord_observe.h"
#include "coord_upload.h"

#define COORD_MAX_JOBS 4096

typedef struct cjob {
    coord_job sm;          /* the state machine (j->mu) */
    coord_jobobs *obs;     /* figures for /metrics and the dashboard (j->mu) */
    coord_ckpt *ck;        /* the checkpoint store (io_mu) */
    pthread_mutex_t io_mu; /* the job's files */
    coord_fx_list fxq;     /* effects to run, in order (j->mu) */
    int draining;          /* a thread is running them (j->mu) */
    int plan_req;          /* COORD_PLAN_* + 1: a PLAN effect for the engine (j->mu) */
    uint64_t model_bytes;  /* the model's fp32 weights (its config's) */
    int layers, hidden;    /* its config's, for listings */
    /* for people, set at submit (j->mu) */
    char *name;            /* "" none */
    char **tags;
    int ntags;
} cjob;

/* What a data owner's check said of a dataset (the latest for it). */
typedef struct coord_dsdesc {
    char device[COORD_DEV_ID_LEN], name[65], job[COORD_JOB_ID_LEN];
    uint64_t sequences;
    int seq_len, vocab_size;
    char vocab_hash[65], shard_hash[65];
    int64_t at;
} coord_dsdesc;

struct coord_jobs {
    coord *c;
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* wakes the engine */
    pthread_cond_t fx_cv; /* a job's effects ran */
    pthread_t engine;
    int running, stop;
    coord_dev *dev;       /* the devices as their heartbeats describe them */
    int ndev, capdev;
    cjob **job;
    int njob, reserved;   /* jobs, and submits making their files */
    coord_jobstore *store;
    char *root;             /* STATE/jobs */
    coord_uploads *uploads; /* models for --init, until a submit claims them */
    int64_t settle_ms;      /* until then, devices may still be coming back after a restart */
    coord_obs_count refused[COORD_OBS_NAMES]; /* frames refused by reason, every job */
    int nrefused;
    uint64_t denied[COORD_DENY_N];            /* calls refused by reason (j->mu) */
    const coord_fileops *fileops; /* the checkpoint stores' file operations (tests) */
    coord_dsdesc *ds;             /* the datasets owners checked */
    int nds;
    coord_job_policy policy;      /* every job's */
};

/* The device view the state machine reads (call with j->mu held). */
coord_devs coord_jobs_devs(const coord_jobs *j);
/* The owners as the jobs row keeps them, and back (coord_jobs.c). */
void coord_owners_row(const coord_job *jb, char **ids, char **datasets, char **data_info);
int coord_owners_parse(const char *ids, const char *datasets, const coord_jobopts *o,
                       coord_owner *out, int *n, char *why, size_t cap);
/* Job `id`, or NULL (takes j->mu). */
cjob *coord_jobs_find(coord_jobs *j, const char *id);
/* Queues a job's effects (j->mu held); PLAN goes to the engine. */
void coord_jobs_queue(coord_jobs *j, cjob *jb, coord_fx_list *fx);
/* Runs the job's queued effects until none is left (j->mu not held). */
void coord_jobs_drain(coord_jobs *j, cjob *jb);
/* Counts a refused call (takes j->mu). */
void coord_jobs_denied(coord_jobs *j, int reason);
/* Whether devices had time to come back after a restart. */
int coord_jobs_settled(const coord_jobs *j);
/* Adds a new job (its files and row already written). */
void coord_jobs_add(coord_jobs *j, cjob *jb);
/* A job object around sm (taken), its store under root. */
cjob *coord_jobs_wrap(coord_jobs *j, coord_job *sm);
/* Records what `device`'s check of `dataset` for `job` said (its data
 * description, JSON text; j->mu held). */
void coord_jobs_ds_record(coord_jobs *j, const char *device, const char *dataset, const char *info,
                          const char *job, int64_t at);
/* The job's candidates and their profiles read back from the store, when
 * it has none in memory (an ended job after a restart; takes j->mu). */
int coord_jobs_load_profiles(coord_jobs *j, cjob *jb, sl_err *err);
/* The name and tags from the jobs row's meta JSON, or (NULL) none. */
void coord_jobs_set_meta(cjob *jb, const char *meta);
/* A job whose data owner refused it (or never answered) before anything
 * ran: the submit said so, and listings leave it out. */
int coord_jobs_refused(const coord_job *sm);
void coord_jobs_job_free(cjob *jb);

/* Tests: the file operations of every job's checkpoint store from here on
 * (ops must outlive the coordinator), and every job's policy. */
void coord_jobs_set_fileops(coord_jobs *j, const coord_fileops *ops);
void coord_jobs_set_policy(coord_jobs *j, const coord_job_policy *p);

#endif
