/* coord_internal.h - what the coordinator's source files share: the server
 * object, the authorization every post-enrollment call goes through
 * (coord_auth.c), and the job manager's entry points (coord_jobs.c, its
 * handlers in coord_jobs_rpc.c). */
#ifndef COORD_INTERNAL_H
#define COORD_INTERNAL_H

#include "cert.h"
#include "coord.h"
#include "coord_jobopts.h"
#include "coord_obs.h"
#include "coord_state.h"

typedef struct coord_jobs coord_jobs;

#include <pthread.h>
#include <stdatomic.h>

#define COORD_POOL_MAX 16

struct coord {
    coord_opts o;
    char *pki;
    cert_ca *ca;
    coord_state *state; /* the first connection: opened, checked and migrated */
    rpc_server *srv;
    int lock_fd[2];
    pthread_mutex_t mu; /* pool */
    coord_state *pool[COORD_POOL_MAX];
    int n_pool;
    pthread_mutex_t spool_mu, ca_mu;
    coord_jobs *jobs;
    _Atomic uint64_t enrolled, enroll_refused[COORD_ENROLL_NREASONS]; /* for /metrics */
};

enum { COORD_ALLOW_DEVICE = 1, COORD_ALLOW_ADMIN = 2 };

/* ---- authorization and database connections (coord_auth.c) ---- */

/* Checks a post-enrollment call; returns RPC_OK or the refusal. `claimed`
 * is the device id the request names ("" with the admin certificate). */
int coord_authorize(coord *c, const rpc_peer *peer, const char *claimed, int allow, rpc_status *st);
/* The same on a connection the caller holds. */
int coord_authorize_on(coord *c, coord_state *db, const rpc_peer *peer, const char *claimed,
                       int allow, rpc_status *st);
/* A database connection of the pool (or a new one), and back. */
coord_state *coord_db_get(coord *c, sl_err *err);
void coord_db_put(coord *c, coord_state *s);
/* Tokens and revocations written by `skyloom certs` since the last call. */
int coord_import_spool(coord *c, coord_state *db, sl_err *err);

/* ---- jobs (coord_jobs.c) ---- */

coord_jobs *coord_jobs_open(coord *c, sl_err *err);
void coord_jobs_close(coord_jobs *j);
/* What a device said in its heartbeat, for choosing and reaching it. */
typedef struct coord_seen {
    const char *id, *site, *stage_address;
    char *const *datasets;
    size_t n_datasets;
    const uint8_t *link_key; /* 32 bytes or NULL */
    unsigned threads;
    uint64_t memory_bytes; /* from its profile, 0 if unknown */
    const char *backend;
    coord_policy policy;
} coord_seen;
void coord_jobs_seen(coord_jobs *j, const coord_seen *s, int64_t now);
/* A device revoked: never online again, so no job plans it and the jobs
 * that run on it recover without it at once. */
void coord_jobs_revoked(coord_jobs *j, const char *device_id);
/* The devices measuring their link to device_id now, in any job (its Ping
 * callers): *ids a malloc'd array of malloc'd ids. */
void coord_jobs_pingers(coord_jobs *j, const char *device_id, char ***ids, size_t *n);
/* The tasks for a device's heartbeat reply: *tasks is a malloc'd array of
 * malloc'd Skyloom__V1__Task; free with coord_jobs_tasks_free. */
void coord_jobs_tasks(coord_jobs *j, const char *device_id, void ***tasks, size_t *n);
void coord_jobs_tasks_free(void **tasks, size_t n);

int coord_handle_submit_job(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                            rpc_buf *resp, rpc_status *st);
int coord_handle_list_jobs(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                           rpc_buf *resp, rpc_status *st);
int coord_handle_get_job(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                         rpc_buf *resp, rpc_status *st);
int coord_handle_stop_job(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                          rpc_buf *resp, rpc_status *st);
int coord_handle_resume_job(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                            rpc_buf *resp, rpc_status *st);
int coord_handle_fetch_file(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                            rpc_buf *resp, rpc_status *st);
int coord_handle_report_task(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                             rpc_buf *resp, rpc_status *st);
int coord_handle_get_plan(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                          rpc_buf *resp, rpc_status *st);
int coord_handle_report_step(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                             rpc_buf *resp, rpc_status *st);
int coord_handle_upload_chunk(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                              rpc_buf *resp, rpc_status *st);
int coord_handle_upload_init(void *c, const rpc_peer *peer, const uint8_t *req, size_t len,
                              rpc_buf *resp, rpc_status *st);

/* The profile a device reported last (for whichever job), read on the
 * caller's database connection: *out is NULL when it has profiled for no
 * job; free with coord_jobs_profile_free. */
struct Skyloom__V1__JobProfile;
int coord_jobs_latest_profile(coord_state *db, const char *device,
                              struct Skyloom__V1__JobProfile **out, sl_err *err);
void coord_jobs_profile_free(struct Skyloom__V1__JobProfile *p);

/* The datasets device serves (its heartbeats' names) and what its checks
 * for jobs said of them: *out a malloc'd array of malloc'd DatasetInfo;
 * free with coord_jobs_datasets_free. */
struct Skyloom__V1__DatasetInfo;
void coord_jobs_datasets(coord_jobs *j, const char *device, struct Skyloom__V1__DatasetInfo ***out,
                         size_t *n);
void coord_jobs_datasets_free(struct Skyloom__V1__DatasetInfo **v, size_t n);

#endif
