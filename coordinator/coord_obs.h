/* coord_obs.h - what the coordinator shows about itself: a snapshot of the
 * job manager's state (copied under its lock, so that readers never hold
 * it), Prometheus text, the dashboard's HTML and SVG, and the HTTP server
 * that serves them (libmicrohttpd, threads of its own).
 *
 *   coord_snapshot s;
 *   coord_jobs_snapshot(c->jobs, NULL, &s);   every job, no plan or trace
 *   coord_jobs_snapshot(c->jobs, "j…", &s);   that job with its plan and trace
 *   ... coord_metrics_text(c, &s, ...) ...
 *   coord_snapshot_free(&s); */
#ifndef COORD_OBS_H
#define COORD_OBS_H

#include <stddef.h>
#include <stdint.h>

#include "cert.h"
#include "coord.h"
#include "coord_state.h"
#include "sl_buf.h"

typedef struct coord_jobs coord_jobs;

#define COORD_OBS_NAMES 32        /* frame refusal reasons kept at most */

/* metrics.csv's first line (without its newline): a row per step all
 * stages reported (GetJob returns the rows without it). */
#define COORD_METRICS_HEADER                                                                     \
    "step,epoch,loss,masked,grad_norm,lr,step_s,tokens_per_s,stage_busy,link_raw_bytes,"        \
    "link_wire_bytes,link_raw_bytes_back,link_wire_bytes_back,side_raw_bytes,side_wire_bytes,"  \
    "replica_loss,sync_raw_bytes,sync_wire_bytes"
#define COORD_TRACE_MAX_OPS 4096  /* segments of one stage's step at most */

typedef struct coord_obs_count {
    char name[40];
    uint64_t value;
} coord_obs_count;

/* A stage's time and bytes, added up over every step it reported (by
 * stage and device: a new plan that moves the stage starts new figures). */
typedef struct coord_obs_stage {
    int stage;
    char device[CERT_ID_LEN];
    uint64_t steps;
    double busy_s;  /* forward and backward */
    double send_s, recv_s; /* in port calls, waiting for a neighbour included */
    double sync_s;  /* gradient finish, tied exchange, the norm's gather, optimizer */
    double idle_s;  /* the rest of the step */
} coord_obs_stage;

/* Bytes one stage sent another, added up. */
typedef struct coord_obs_link {
    int from, to;
    uint64_t raw, wire;
} coord_obs_link;

typedef struct coord_obs_seg {
    int kind; /* Skyloom__V1__OpKind */
    int mb;   /* -1: step-wide */
    double start, end; /* seconds since the stage's step began */
} coord_obs_seg;

/* The measured timeline of one step: every stage's ops. */
typedef struct coord_obs_trace {
    int step, epoch, p;
    double *step_s;       /* [p] */
    char (*device)[CERT_ID_LEN]; /* [p] */
    int *nseg;            /* [p] */
    coord_obs_seg **seg;  /* [p][nseg] */
} coord_obs_trace;

/* A replica of a federation (a data owner's pipeline) in the current plan:
 * its owner, its stages and their devices, its own loss at the latest step,
 * and the bytes its stages sent the other replicas for the sync (added up
 * over the steps reported). */
#define COORD_OBS_REPLICAS 8
typedef struct coord_obs_replica {
    char owner[CERT_ID_LEN], dataset[65];
    int first_stage, stages;
    char *devices;   /* the stages' devices, ","-separated */
    int have_loss;   /* a step was reported in this plan */
    double loss;
    uint64_t sync_raw, sync_wire;
} coord_obs_replica;

typedef struct coord_obs_job {
    char id[24], state[16], reason[512];
    char owner[CERT_ID_LEN], dataset[65];
    int steps, step, committed, epoch, p, batch, seq;
    double loss, tokens_s, step_s;
    int64_t created;
    int nstage, nlink;
    coord_obs_stage *stage;
    coord_obs_link *link;
    uint64_t upload_bytes, commits;
    double upload_s;  /* first piece to commit, added over committed steps */
    uint64_t devices_lost, recoveries; /* since the coordinator started */
    char *plan;                /* detail: the plan's JSON text, NULL before planning */
    coord_obs_trace *trace;    /* detail: the latest step every stage traced, or NULL */
    char name[129];            /* for people ("" none) */
    int layers, hidden;        /* its config's */
    int64_t ended;             /* 0 while it has not ended */
    int refused;               /* its data owner refused it at submit: not listed */
    int nrep;                  /* replicas: 0 for a job of one data owner */
    coord_obs_replica rep[COORD_OBS_REPLICAS];
} coord_obs_job;

/* A device as its heartbeats describe it to the job manager. */
typedef struct coord_obs_dev {
    char id[CERT_ID_LEN];
    char backend[8];
    unsigned threads;
    int64_t seen;
} coord_obs_dev;

/* Calls the job manager refused, by reason (skyloom_calls_refused_total). */
enum coord_denial {
    COORD_DENY_NOT_MEMBER,    /* a device in no role of the job it names */
    COORD_DENY_NOT_NEIGHBOUR, /* a failure report naming a device it exchanges nothing with */
    COORD_DENY_NOT_OWN_PART,  /* a checkpoint part not the uploader's own */
    COORD_DENY_QUOTA,         /* a piece past the device's or the job's share of the store */
    COORD_DENY_FETCH,         /* a checkpoint file of units the device does not run */
    COORD_DENY_N
};
const char *coord_denial_name(int reason);

typedef struct coord_snapshot {
    int64_t now;
    int njob, ndev, nrefused;
    coord_obs_job *job;
    coord_obs_dev *dev;
    coord_obs_count refused[COORD_OBS_NAMES]; /* frames refused by reason, every job */
    uint64_t denied[COORD_DENY_N];            /* calls refused by reason */
} coord_snapshot;

/* Fills s: every job (id NULL), or only job `id` with its plan and trace.
 * Returns -1 (s empty but valid) when id is not a job. */
int coord_jobs_snapshot(coord_jobs *j, const char *id, coord_snapshot *s);
void coord_snapshot_free(coord_snapshot *s);

/* The trace as JSON text ({"job","epoch","step","stages":[{"stage","device",
 * "step_s","ops":[[kind,mb,start,end],...]}]}); NULL without a trace. */
char *coord_trace_json(const char *job, const coord_obs_trace *t);
/* The inverse (for skyloom job trace); NULL with the reason. */
coord_obs_trace *coord_trace_parse(const char *text, sl_err *err);
void coord_trace_free(coord_obs_trace *t);
/* The measured timeline as an SVG document (forward, backward, send,
 * receive, sync; idle as the background), a row per stage; free(). A
 * predicted iteration (> 0) is marked with a line. */
char *coord_trace_svg(const coord_obs_trace *t, double predicted_s);

/* ---- counters kept by the server (coord_server.c) ---- */

enum coord_enroll_reason {
    COORD_ENROLL_MALFORMED = 0, COORD_ENROLL_UNKNOWN_TOKEN, COORD_ENROLL_TOKEN_USED,
    COORD_ENROLL_TOKEN_EXPIRED, COORD_ENROLL_WRONG_SITE, COORD_ENROLL_BAD_CSR,
    COORD_ENROLL_REVOKED, COORD_ENROLL_INTERNAL, COORD_ENROLL_NREASONS
};
const char *coord_enroll_reason_name(int reason);
/* Enrollments accepted, and refused by reason (COORD_ENROLL_NREASONS). */
void coord_enroll_counts(coord *c, uint64_t *accepted, uint64_t *refused);

/* ---- rendering (coord_render.c, coord_metrics.c) ---- */


/* What /metrics serves; db is a connection of the caller's (devices). */
int coord_metrics_text(coord *c, coord_state *db, const coord_snapshot *s, sl_buf *out,
                       sl_err *err);
/* The dashboard: the overview, and one job's page (s holds only that job,
 * metrics_csv its metrics.csv text or NULL). */
int coord_dash_index(coord *c, coord_state *db, const coord_snapshot *s, sl_buf *out,
                     sl_err *err);
void coord_dash_job(const coord_snapshot *s, const char *metrics_csv, sl_buf *out);
/* The loss curve of metrics.csv text as SVG (into out). */
void coord_loss_svg(const char *metrics_csv, sl_buf *out);
/* The plan's chain across sites as SVG (into out). */
void coord_chain_svg(const char *plan_text, sl_buf *out);

/* ---- the HTTP server (coord_http.c) ---- */

typedef struct coord_http coord_http;
typedef struct coord_http_opts {
    const char *listen;     /* HOST:PORT (port 0 picks one) */
    const char *token;      /* bearer token every request must carry, or NULL */
    const char *name;       /* another name requests may give as Host (a DNS name), or NULL */
} coord_http_opts;
/* Serves c (started or not) until coord_http_stop, which must come before
 * coord_close. Refuses a non-loopback address without a token. Without a
 * token, a request's Host must be the listen address (on loopback also
 * localhost, 127.0.0.1 or [::1]) or `name`, with the port served, so that a
 * page of another site cannot reach the dashboard through a name it made
 * point here (DNS rebinding). */
coord_http *coord_http_start(coord *c, const coord_http_opts *o, sl_err *err);
int coord_http_port(const coord_http *h);
void coord_http_stop(coord_http *h);
/* Reads a token file: one line of at least 16 printable characters. */
int coord_http_read_token(const char *path, char **token, sl_err *err);

#endif
