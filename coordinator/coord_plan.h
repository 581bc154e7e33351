/* coord_plan.h - the planning driver: what a PLAN effect runs. The job's
 * candidates, profiles and options are copied under the job manager's lock
 * (coord_plan_in_of); the balancer plans on them and the plan is signed
 * outside it (coord_plan_make), and the result goes back to the state
 * machine (coord_job_plan_done). */
#ifndef COORD_PLAN_H
#define COORD_PLAN_H

#include <stdint.h>

#include "coord_job.h"
#include "coord_jobstore.h"
#include "sl_err.h"

typedef struct coord_plan_in coord_plan_in;

/* What planning needs of jb: the first plan takes every candidate that
 * reported a profile, a re-plan (replan) only the usable ones. */
coord_plan_in *coord_plan_in_of(const coord_job *jb, const coord_devs *devs, int replan,
                                int64_t now_s);
void coord_plan_in_free(coord_plan_in *in);

/* Plans and signs with PKI/coordinator.key; r->ok with the plan, or the
 * reason. Reads the devices' sites from the registry (store). */
void coord_plan_make(coord_plan_in *in, coord_jobstore *store, const char *pki,
                     coord_plan_result *r);

/* A signed plan read back (at a restart): takes text and sig (freed on
 * error). */
int coord_plan_read(char *text, uint8_t *sig, size_t sig_len, coord_job_plan *pl, sl_err *err);

#endif
