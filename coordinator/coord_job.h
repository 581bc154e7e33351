/* coord_job.h - a job's state machine: events and `now` in, effects out.
 *
 * A job is checked by its data owner, its candidate devices profile
 * themselves (their links, then their units), a plan is made and signed,
 * and the plan's devices train it in epochs; every K steps their parts make
 * a committed checkpoint. A lost device, a failed run, a coordinator restart
 * or a failing checkpoint store ends the epoch, and the job is planned again
 * over the devices left, from its committed step.
 *
 * The functions here decide all of that and do nothing else: no I/O, no
 * clock, no lock. Each takes the time as an argument and appends what must
 * happen to a list of effects (save the job, record an event, save a
 * profile, plan, commit a step, append a metrics row, start an epoch); the
 * driver (coord_jobs.c) applies events under its lock, runs the effects
 * after unlocking, and feeds their results back as events (plan done,
 * commit done, epoch ready). What may live here: state, the rules that
 * change it, and the effects they ask for; what may not: SQLite, threads,
 * protobuf, files, the clock, JSON parsing.
 *
 * States (the strings are the contract of SQLite, protobuf and --json):
 *
 *   checking ──> profiling ──> planning ──> running ──> done
 *       │            │            │  ^  │       │ ^
 *       │            │            │  │  │       v │(a joiner's plan)
 *       │            │            v  │  v     recovering <──> waiting
 *       └────────────┴──────> failed, stopped (from any state before an end)
 *
 *   failed, stopped ──> recovering: the operator's resume (a job that had a plan)
 *
 * Invariants (checked by tests/fuzz/fuzz_job.c): committed <= step <= steps;
 * the epoch never decreases; an ended job changes state only by the
 * operator's resume; at most one plan is being made. */
#ifndef COORD_JOB_H
#define COORD_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "coord_jobopts.h"

#define COORD_JOB_ID_LEN 18 /* "j" + 16 hex + NUL */
#define COORD_SITE_LEN 65   /* CERT_SITE_MAX + 1 */
#define COORD_REASON_LEN 512
#define COORD_ACC_STEPS 32  /* steps whose reports may be in flight at once */

/* The policy's times and counts. */
typedef struct coord_job_policy {
    int links_wait_s;   /* profiling: units are asked for once every link is in, or then */
    int profile_wait_s; /* candidates whose units are not in this long after are left out */
    int check_wait_s;   /* the data owner must answer the check by then */
    int ended_task_s;   /* how long devices are told to stop an ended job */
    int decide_ms;      /* failure reports of one epoch gathered this long before deciding */
    int max_stalls;     /* recoveries in a row without a new committed step before failing */
    int store_retry_ms; /* a job paused by its checkpoint store tries again after this,
                         * doubling with each failure in a row (up to 32 times) */
    int wait_retry_ms;  /* a job waiting for devices re-plans this often */
} coord_job_policy;

/* 60 s, 60 s, 120 s, 600 s, 1.5 s, 3, 10 s, 5 s. */
coord_job_policy coord_job_policy_default(void);

#define COORD_LINK_SAMPLES 3    /* device pairs measured per pair of sites */

typedef enum coord_job_state {
    COORD_JOB_CHECKING,
    COORD_JOB_PROFILING,
    COORD_JOB_PLANNING,
    COORD_JOB_RUNNING,
    COORD_JOB_RECOVERING,
    COORD_JOB_WAITING,
    COORD_JOB_DONE,
    COORD_JOB_FAILED,
    COORD_JOB_STOPPED,
    COORD_JOB_NSTATES
} coord_job_state;

const char *coord_job_state_name(coord_job_state s);
/* The state named s, or -1. */
int coord_job_state_parse(const char *s);
int coord_job_state_final(coord_job_state s);
/* Whether the table of transitions allows from -> to. */
int coord_job_transition_ok(coord_job_state from, coord_job_state to);

/* ---- the devices, as their heartbeats describe them ------------------------- */

typedef struct coord_dev {
    char id[COORD_DEV_ID_LEN];
    char site[COORD_SITE_LEN];
    char address[256];
    uint8_t key[32];
    int has_key;
    unsigned threads;
    uint64_t memory;
    char backend[8];
    char **datasets;
    int n_datasets;
    int64_t seen, seen_ms; /* its last heartbeat (seconds, milliseconds); 0: none */
    int revoked;           /* revoked since: never online again */
    coord_policy policy;   /* as a data owner, from its last heartbeat */
} coord_dev;

typedef struct coord_devs {
    const coord_dev *v;
    int n;
    unsigned heartbeat_ms;
} coord_devs;

const coord_dev *coord_devs_find(const coord_devs *d, const char *id);
/* Not revoked, and heard from within three heartbeat intervals (and a second). */
int coord_dev_online(const coord_devs *d, const coord_dev *x, int64_t now_s);

/* ---- a job ---------------------------------------------------------------------- */

/* A data owner of the job: its device, the dataset it serves and the
 * sequences per step its replica trains on. A job has one owner, or
 * several (a federation: a replica per owner, coord_jobopts' sync). */
#define COORD_MAX_OWNERS 8
typedef struct coord_owner {
    char id[COORD_DEV_ID_LEN], dataset[65];
    int batch;
    char *data_info; /* its check's description of its shard (JSON text); NULL before */
} coord_owner;

/* A device the job may run on: its profile, and what recovery knows of it. */
typedef struct coord_cand {
    char id[COORD_DEV_ID_LEN];
    char site[COORD_SITE_LEN]; /* "" unknown */
    char *result;            /* its profile for this job (JSON text); NULL while one is asked */
    int failed;              /* that profile says it failed */
    char *links;             /* round one's links (JSON array text), kept for round two */
    int *measure, nmeasure;  /* the candidates whose links it measures in round one */
    int64_t lost_ms;         /* declared lost then (0: not lost) */
    int suspect;             /* neighbours that named it lost (this epoch) */
    int reported;            /* reported a failure (this epoch) */
    int joining;             /* came online during the job: weighed at the next commit */
} coord_cand;

/* One stage's report of a step. */
typedef struct coord_step_rep {
    int have;
    double loss, grad_norm, lr, fwd, bwd, recv, send, finish, step_s;
    uint64_t raw, wire, raw_up, wire_up, raw_side, wire_side;
    uint64_t raw_sync, wire_sync; /* to the other replicas (a federation) */
    uint32_t masked;
} coord_step_rep;

/* A signed plan as the job keeps it: the text and signature devices get,
 * and what the job needs of it. */
typedef struct coord_job_plan {
    char *text;
    uint8_t *sig;
    size_t sig_len;
    int p, ndev, seq;                    /* stages, distinct devices, sequence length */
    char (*stage_dev)[COORD_DEV_ID_LEN]; /* [p] */
    int *first_unit, *last_unit;         /* [p]: the units each stage runs (inclusive) */
    /* replicas (one per owner): stages rep_first[r] .. rep_first[r + 1] - 1
     * are replica r's chain, in the owners' order */
    int nrep;
    int rep_first[COORD_MAX_OWNERS + 1];
    /* under outer:H, an owner away: its replica has no stage in this plan
     * (rep_first[r] == rep_first[r + 1]); rejoin: it is back at start_step,
     * after an outer step, from the lowest present replica's parts */
    int away[COORD_MAX_OWNERS], rejoin[COORD_MAX_OWNERS];
    int away_since[COORD_MAX_OWNERS]; /* away: the last committed step holding its own
                                       * parts (-1: none, it left while rejoining) */
    int start_step;
    double predicted;                    /* the predicted iteration time */
} coord_job_plan;

enum { COORD_WAIT_NONE, COORD_WAIT_OWNER, COORD_WAIT_DEVICES, COORD_WAIT_STORE };
enum { COORD_PLAN_FIRST, COORD_PLAN_RECOVER, COORD_PLAN_JOIN };
/* What a profile task asks for: the links, the units, or (a device joining
 * a running job) both. */
enum { COORD_PROFILE_BOTH = 0, COORD_PROFILE_LINKS = 1, COORD_PROFILE_UNITS = 2 };

/* What recovery knows of the epoch and the job's last failures. */
typedef struct coord_job_recovery {
    int64_t fail_ms;      /* the epoch's first failure report (0: none) */
    char fail_why[600];   /* a failure that named no lost peer, else the first one */
    int fail_primary;     /* fail_why is a device's own failure */
    int stalls;           /* recoveries since the last committed step */
    int64_t detect_ms;    /* when the last recovery began; 0 once a step completed after it */
    int64_t wait_ms;      /* when the job last started waiting or recovering */
    int wait_kind;        /* COORD_WAIT_* */
    int weigh_joiners;    /* a step was committed: joiners with a profile are weighed */
    int store_fails;      /* checkpoint store failures since the last commit */
    int restarted;        /* recovering after a coordinator restart */
    uint64_t n_lost, n_recoveries; /* since the coordinator started */
} coord_job_recovery;

typedef struct coord_job {
    /* the jobs row */
    char id[COORD_JOB_ID_LEN];
    uint64_t num;
    coord_job_state state;
    char reason[COORD_REASON_LEN];
    char *config;           /* config.json text */
    coord_jobopts opts;
    int nowner;
    coord_owner owner[COORD_MAX_OWNERS];
    int epoch, step, committed;
    double loss;
    int64_t created, ended; /* seconds */
    coord_job_plan plan;    /* text NULL before the first plan */
    /* derived */
    int steps, batch, seq;
    double tokens_s;
    /* checking and profiling */
    int64_t check_since;    /* the owner's check is waited for from then (submit or restart) */
    int64_t started;        /* profiling began */
    int profile_round;      /* COORD_PROFILE_LINKS, then COORD_PROFILE_UNITS */
    int64_t round_started;
    int ncand;
    coord_cand *cand;
    /* the epoch's steps: reports by step, and steps whose every part is in */
    coord_step_rep *acc;    /* [COORD_ACC_STEPS][plan.p] */
    int acc_step[COORD_ACC_STEPS], acc_done[COORD_ACC_STEPS];
    int up_step[COORD_ACC_STEPS], up_ready[COORD_ACC_STEPS];
    coord_step_rep *last;   /* [plan.p] the latest step every stage reported, or NULL */
    int last_step;
    double last_step_s;
    /* effects under way */
    int planning;           /* COORD_PLAN_* + 1 while a plan is made, 0 none */
    int plan_epoch, plan_committed; /* what that plan started from */
    /* that plan's owners away and rejoining (outer:H; coord_job_plan's) */
    int plan_away[COORD_MAX_OWNERS], plan_rejoin[COORD_MAX_OWNERS];
    int plan_away_since[COORD_MAX_OWNERS];
    int committing;         /* the step being committed, 0 none */
    int epoch_pending;      /* a new epoch's files are being reset (COORD_FX_EPOCH) */
    int64_t last_event_ms;  /* events are ordered by time: never earlier than the last */
    coord_job_recovery rec;
    coord_job_policy policy;
    int stop_at_commit;     /* the operator asked it to stop at its next commit */
} coord_job;

/* ---- effects ---------------------------------------------------------------------- */

typedef enum coord_fx_kind {
    COORD_FX_SAVE,    /* write the jobs row as the job is when the effect runs */
    COORD_FX_STATE,   /* the job entered `state` (text: the reason): save and log */
    COORD_FX_EVENT,   /* record event `name` about `device` (text: the detail) */
    COORD_FX_LOG,     /* a log line: `name` the message, text the fields, level */
    COORD_FX_PROFILE, /* record device's profile (text) */
    COORD_FX_PLAN,    /* plan the job (mode) */
    COORD_FX_COMMIT,  /* commit step (of epoch) */
    COORD_FX_METRICS, /* append step's metrics row (reps, p, tokens_s, step_s) */
    COORD_FX_EPOCH,   /* epoch begins: drop the uncommitted parts and metrics rows after
                       * the committed step; answered by coord_job_epoch_ready */
} coord_fx_kind;

typedef struct coord_fx {
    coord_fx_kind kind;
    int level;                      /* LOG: an sl_log level */
    int state;                      /* STATE */
    int mode;                       /* PLAN */
    int step, epoch, committed;     /* EVENT: the job's then; COMMIT, METRICS: what */
    int64_t at_ms;                  /* EVENT */
    char name[96];                  /* EVENT kind, LOG message */
    char device[COORD_DEV_ID_LEN];  /* EVENT, PROFILE */
    char *text;
    coord_step_rep *reps;           /* METRICS: [p] */
    int p;
    double tokens_s, step_s;        /* METRICS */
    double loss;                    /* METRICS: the step's (coord_job_step_loss) */
    uint32_t masked;                /* METRICS: the masked tokens of every replica */
    int nrep;                       /* METRICS: replicas (0: none), their first stages */
    int rep_first[COORD_MAX_OWNERS + 1];
} coord_fx;

typedef struct coord_fx_list {
    coord_fx *v;
    int n, cap;
} coord_fx_list;

void coord_fx_list_free(coord_fx_list *l);
/* Moves the effects of src to the end of dst (src is left empty). */
void coord_fx_list_move(coord_fx_list *dst, coord_fx_list *src);
void coord_fx_free(coord_fx *f);

/* ---- making and ending a job -------------------------------------------------- */

/* A new job (checking) under the default policy. Takes config; copies
 * opts and the owners (1..COORD_MAX_OWNERS, data_info NULL). */
void coord_job_init(coord_job *jb, const char *id, uint64_t num, char *config,
                    const coord_jobopts *opts, const coord_owner *owners, int nowner,
                    int64_t now_ms);
/* The owner of device id (its index), or -1. */
int coord_job_owner_index(const coord_job *jb, const char *device);
/* The replica whose committed parts a replica rejoining in this plan
 * starts from: the lowest one neither away nor rejoining. */
int coord_job_rejoin_source(const coord_job *jb);
/* Every owner's check is in. */
int coord_job_checked(const coord_job *jb);
/* The replica of the plan's stage s (0 without replicas). */
int coord_job_stage_replica(const coord_job *jb, int s);
void coord_job_free(coord_job *jb);

/* Takes a plan (its text and signature: jb owns them from here) for the
 * current epoch; the step accumulators start empty. */
void coord_job_set_plan(coord_job *jb, coord_job_plan *pl);

/* A job read back from the state after a restart: one that had a plan goes
 * on from its committed step in a new epoch once the plan's devices are
 * back; checked but not planned, it is checked again. `loss` is the last
 * committed metrics row's. */
void coord_job_restarted(coord_job *jb, double loss, int64_t now_ms, coord_fx_list *fx);

/* ---- events ---------------------------------------------------------------------- */

/* A data owner answered the check: its shard's description (JSON text,
 * seq its sequence length, vocab its vocabulary size) or its refusal.
 * Profiling starts once every owner's is in, at once when `settled`
 * (devices had time to come back after a restart). The owners' shards
 * must agree on the sequence length and the vocabulary. */
void coord_job_check_done(coord_job *jb, const char *device, int ok, const char *reason,
                          const char *info, int seq, int settled, const coord_devs *devs,
                          int64_t now_ms, coord_fx_list *fx);

/* A data owner's check described a shard the job cannot use (the driver
 * compares the description with the job: its task, its labels; why names
 * the owners): the job fails with why. */
void coord_job_check_unfit(coord_job *jb, const char *device, const char *why, int64_t now_ms,
                           coord_fx_list *fx);

/* A device's profile: `round` COORD_PROFILE_LINKS (links: its links) or the
 * units (result: the whole profile, round one's links merged in by the
 * caller from coord_job_cand_links), failed when it could not profile. */
void coord_job_profile_in(coord_job *jb, const char *device, int round, const char *result,
                          const char *links, int failed, coord_fx_list *fx);
/* Round one's links of a candidate (NULL: none yet). */
const char *coord_job_cand_links(const coord_job *jb, const char *device);

enum {
    COORD_REPORT_OK,      /* nothing to do (a step already taken, sent again) or the epoch ends */
    COORD_REPORT_TAKEN,   /* kept with the step's other reports */
    COORD_REPORT_STOP,    /* not the running epoch: the device should stop */
    COORD_REPORT_REFUSED, /* not this device's stage, or the step is out of range */
};
/* A step's loss from its stages' reports (a federation's: each replica's,
 * weighed by its owner's sequences per step). */
double coord_job_step_loss(const coord_job *jb, const coord_step_rep *rep);
/* A stage's report of a step. */
int coord_job_step_report(coord_job *jb, const char *device, int epoch, int stage, int step,
                          const coord_step_rep *rep, int64_t now_ms, coord_fx_list *fx);

enum {
    COORD_UPLOAD_OK,        /* the piece may be written */
    COORD_UPLOAD_COMMITTED, /* a retry of a committed step: nothing to do */
    COORD_UPLOAD_NOT_RUNNING,
    COORD_UPLOAD_REFUSED,   /* not this device's to upload */
    COORD_UPLOAD_LATER,     /* the job's files are being reset: ask again after the effects */
};
/* Whether `device` may upload file `name` of `step` for `epoch`. */
int coord_job_upload_check(const coord_job *jb, const char *device, int epoch, int step,
                           const char *name);
/* A file name a part may have: model.TAG.safetensors, optim.TAG.safetensors,
 * data.json or data.DEVICE.json. */
int coord_part_name_ok(const char *name);
/* 1 if s is 1..max bytes of [A-Za-z0-9._-] (a dataset's or a part's name). */
int coord_name_ok(const char *s, size_t max);
/* Whether part `name` may be device's: data.json the owner's (of a job of
 * several owners, data.OWNER.json each owner's), the others tagged with
 * its id (TAG is DEVICE or DEVICE-uUNIT). */
int coord_part_is_of(const coord_job *jb, const char *name, const char *device);

/* The model's units (its plan's last unit + 1; 0 before a plan). */
int coord_job_nunits(const coord_job *jb);
/* units[u] = 1 for the units device runs in the current plan (nunits of them). */
void coord_job_units_of(const coord_job *jb, const char *device, uint8_t *units, int nunits);
/* The units whose checkpoint files device may fetch: its own, and where
 * the job is not U-shaped and it runs the head without the embeddings, the
 * embeddings' (the head's weights are tied to them). */
void coord_job_fetch_units(const coord_job *jb, const char *device, uint8_t *units, int nunits);

/* Every part of `step` arrived: it is committed once every stage reported it. */
void coord_job_parts_done(coord_job *jb, int epoch, int step, coord_fx_list *fx);
/* The checkpoint store could not take a piece of `step` (what: why). */
void coord_job_store_failed(coord_job *jb, int step, const char *what, int64_t now_ms,
                            coord_fx_list *fx);
/* The COMMIT effect's result: ok, or not (why), or cancelled (the epoch
 * moved on before it ran). */
enum { COORD_COMMIT_OK, COORD_COMMIT_FAILED, COORD_COMMIT_CANCELLED };
void coord_job_commit_done(coord_job *jb, int step, int result, const char *why, int64_t now_ms,
                           coord_fx_list *fx);
/* Whether a COMMIT effect of (epoch, step) should still run. */
int coord_job_commit_wanted(const coord_job *jb, int epoch, int step);

/* The EPOCH effect ran: the metrics rows after the committed step are gone,
 * the last kept one's loss is `loss`; or the store failed (failed: why). */
void coord_job_epoch_ready(coord_job *jb, int epoch, double loss, const char *failed,
                           int64_t now_ms, coord_fx_list *fx);

/* A device's run of `epoch` failed; `lost` is the neighbour whose link
 * broke first ("" if none). A device may name only its own neighbours (the
 * stages next to its own, or the first and last stage): -1 when `lost` is
 * not one (the report counts as the device's own failure), else 0. */
int coord_job_run_failure(coord_job *jb, const char *device, int epoch, const char *reason,
                          const char *lost, int64_t now_ms, coord_fx_list *fx);
/* Whether devices a and b exchange frames in the plan. */
int coord_job_neighbours(const coord_job *jb, const char *a, const char *b);

/* What a device is to a job: its data owner, a candidate (profiled for
 * it), a device of its current plan (COORD_MEMBER_* bits; 0: nothing). */
enum { COORD_MEMBER_OWNER = 1, COORD_MEMBER_CAND = 2, COORD_MEMBER_STAGE = 4 };
int coord_job_member(const coord_job *jb, const char *device);

/* The operator's stop: -1 when the job had ended. */
int coord_job_stop(coord_job *jb, int64_t now_ms, coord_fx_list *fx);
/* The operator's stop at the next commit (job stop --at-checkpoint): the
 * job trains on (one not running yet first gets there) and stops once its
 * next step is committed; a commit of its last step makes it done instead.
 * -1 when it had ended. */
int coord_job_stop_at_commit(coord_job *jb, int64_t now_ms, coord_fx_list *fx);
/* The operator's resume of a stopped or failed job that had a plan: it is
 * planned again over the devices online and trains on from its committed
 * step in a new epoch, as after a lost device. -1 with why when the job
 * cannot resume (another state, or never planned). */
int coord_job_resume(coord_job *jb, int64_t now_ms, char *why, size_t cap, coord_fx_list *fx);

/* What the planning driver made of a PLAN effect. */
typedef struct coord_plan_result {
    int ok;
    coord_job_plan plan;  /* ok: taken by the job, or freed */
    char why[600];        /* not ok */
    int n_devices;        /* the devices it planned over */
    int start_step;
    double seconds;       /* planning took */
    char unmeasured[512]; /* the pairs of sites no link was measured between */
} coord_plan_result;
void coord_job_plan_done(coord_job *jb, int mode, coord_plan_result *r, int64_t now_ms,
                         coord_fx_list *fx);

/* What the time and the devices' heartbeats decide: the check's timeout,
 * profiling's rounds, the end, lost devices and the epoch's failure reports,
 * joiners, re-planning, waiting. `settled`: devices had time to come back
 * after a restart. */
void coord_job_tick(coord_job *jb, const coord_devs *devs, int settled, int64_t now_ms,
                    coord_fx_list *fx);

/* ---- queries ------------------------------------------------------------------------ */

/* The tasks for device `device`'s heartbeat. */
typedef struct coord_task_want {
    int kind;  /* COORD_TASK_* */
    int epoch;
    int cand;  /* PROFILE: the candidate */
    int round; /* PROFILE: COORD_PROFILE_* */
} coord_task_want;
enum { COORD_TASK_CHECK, COORD_TASK_RUN, COORD_TASK_STOP, COORD_TASK_PROFILE };
/* Fills out[0..1]; returns how many. */
int coord_job_tasks(const coord_job *jb, const char *device, int64_t now_ms,
                    coord_task_want out[2]);

/* The candidates measuring their link to `device` now (asked for their
 * links, with `device` among the peers they measure): the devices whose
 * Ping it answers. Writes up to max candidate indices to out; returns how
 * many. */
int coord_job_pingers(const coord_job *jb, const char *device, int64_t now_ms, int *out, int max);

int coord_job_cand_index(const coord_job *jb, const char *device);
/* The plan's first stage of device d, or -1. */
int coord_job_stage_of(const coord_job *jb, const char *device);
/* A candidate a re-plan may use: profiled, not lost, online and reachable. */
int coord_job_cand_usable(const coord_job *jb, int k, const coord_devs *devs, int64_t now_s);

#endif
