/* coord_observe.h - what the coordinator shows of a job beyond its state
 * (coord_obs.h's figures): time and bytes per stage and link added up over
 * the steps reported, upload times, and the measured timeline of the latest
 * step every stage traced. The driver keeps one per job, under its lock. */
#ifndef COORD_OBSERVE_H
#define COORD_OBSERVE_H

#include <stddef.h>

#include "coord_obs.h"
#include "skyloom.pb-c.h"

typedef struct coord_jobobs coord_jobobs;

coord_jobobs *coord_jobobs_new(void);
void coord_jobobs_free(coord_jobobs *o);
/* An accepted step report of a plan of p stages in `epoch`, by a stage of
 * `replica` (0 without replicas). */
void coord_jobobs_report(coord_jobobs *o, const Skyloom__V1__ReportStepRequest *r, int p, int epoch,
                         int replica, const char *job);
/* A piece of `step` arrived (bytes), and `step` was committed: the time
 * from its first piece to its commit is added up. */
void coord_jobobs_upload(coord_jobobs *o, int step, size_t bytes);
void coord_jobobs_commit(coord_jobobs *o, int step);
/* The latest trace as JSON text ("" without one). */
char *coord_jobobs_trace_text(const coord_jobobs *o, const char *job);
/* Copies the figures (and with detail the latest trace) into x; the
 * replicas' sync bytes into x->rep[0 .. x->nrep - 1]. */
void coord_jobobs_fill(const coord_jobobs *o, int detail, coord_obs_job *x);

/* Frame refusals a device counted, added to refused[*n] by reason name
 * ([a-z0-9_], 1..32; at most COORD_OBS_NAMES names). */
void coord_obs_refused_add(coord_obs_count *refused, int *n, const Skyloom__V1__ReportStepRequest *r);

#endif
