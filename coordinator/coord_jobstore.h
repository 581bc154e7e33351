/* coord_jobstore.h - what survives a coordinator restart of its jobs, in
 * SQLite (a connection of its own to coordinator.db, used by one thread at a
 * time): the jobs table (one row a job), job_profiles (each candidate's
 * profile) and job_events (what recovery decided). */
#ifndef COORD_JOBSTORE_H
#define COORD_JOBSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "cert.h"
#include "coord_state.h"
#include "sl_err.h"

typedef struct coord_jobstore coord_jobstore;

/* A job's row. Text fields are borrowed (saving) or malloc'd (loading:
 * coord_jobrow_free). */
typedef struct coord_jobrow {
    char *id;
    uint64_t num;
    char *state, *reason, *config, *options, *owner, *dataset, *data_info, *plan;
    uint8_t *sig;
    size_t sig_len;
    int epoch, step, committed;
    double loss;
    int64_t created, updated;
    char *meta; /* JSON: what is for people (name, tags) and the operator's pending stop */
} coord_jobrow;
void coord_jobrow_free(coord_jobrow *r);

/* A connection of its own to the state's database, the schema created. */
coord_jobstore *coord_jobstore_open(coord_state *first, sl_err *err);
void coord_jobstore_close(coord_jobstore *s);

int coord_jobstore_save(coord_jobstore *s, const coord_jobrow *r, int64_t now, sl_err *err);
int coord_jobstore_set_committed(coord_jobstore *s, const char *id, int committed, int64_t now,
                                 sl_err *err);
int coord_jobstore_event(coord_jobstore *s, const char *job, int64_t at_ms, int epoch, int step,
                         int committed, const char *kind, const char *device, const char *detail,
                         sl_err *err);
/* The job's events, oldest first, as a JSON array text (free()). */
char *coord_jobstore_events(coord_jobstore *s, const char *job);
int coord_jobstore_profile(coord_jobstore *s, const char *job, const char *device,
                           const char *result, int64_t at, sl_err *err);

/* Every job, oldest first. */
int coord_jobstore_load(coord_jobstore *s, int (*fn)(void *ud, coord_jobrow *r), void *ud,
                        sl_err *err);
/* A job's profiles, the data owner's first. */
int coord_jobstore_load_profiles(coord_jobstore *s, const char *job, const char *owner,
                                 int (*fn)(void *ud, const char *device, const char *result),
                                 void *ud, sl_err *err);
/* The enrolled sites of devices ids[0..n-1] into sites[i] ("" unknown). */
int coord_jobstore_sites(coord_jobstore *s, char (*ids)[CERT_ID_LEN], char (*sites)[CERT_SITE_MAX + 1],
                        int n, sl_err *err);
/* The profile device reported last, for whichever job, read on the caller's
 * connection: 1 with its job, result, time and that job's options and
 * data description (malloc'd), 0 when it profiled for no job, -1. */
int coord_jobstore_latest_profile(coord_state *db, const char *device, char **job, char **result,
                                  int64_t *at, char **options, char **data_info, sl_err *err);
/* Whether any enrolled device ever heartbeated (the coordinator is
 * restarting: devices are coming back). */
int coord_jobstore_devices_seen(coord_jobstore *s);

#endif
