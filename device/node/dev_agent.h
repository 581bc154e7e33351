/* dev_agent.h - a device's membership: enrollment with a one-time token,
 * the stored identity (key, certificate, pinned CA) and heartbeats.
 *
 * State directory (0700):
 *   device.key   EC P-256 private key, made here, never sent anywhere (0600)
 *   device.crt   certificate from the coordinator (CN = device id)
 *   ca.crt       the project CA, pinned by the token's fingerprint
 *   device.json  {"device_id", "site", "coordinator"}
 *   device.lock  the pid of the process whose agent has the directory open
 *                (flock: one agent per state directory)
 *
 * Certificates are renewed before they expire: at two thirds of the way from
 * notBefore to notAfter a heartbeat first calls Renew (a new key made here,
 * its CSR, over the connection of the current certificate); the new pair
 * replaces device.key and device.crt together (cert_pair_commit; a crash in
 * between is finished by the next dev_agent_open) and every connection made
 * from then on presents it. The device id stays the one of the enrollment
 * key. */
#ifndef DEV_AGENT_H
#define DEV_AGENT_H

#include <stdint.h>

#include "cert.h"
#include "dev_profile.h"
#include "rpc.h"
#include "sl_err.h"

/* The identity files in a device's state directory. */
typedef struct dev_identity_files {
    char ca[4200], crt[4200], key[4200];
} dev_identity_files;
int dev_identity_files_init(dev_identity_files *f, const char *state, sl_err *err);

typedef struct dev_agent_opts {
    const char *coordinator; /* HOST:PORT */
    const char *token;       /* needed only until enrolled */
    const char *state;
    const char *site;
    const char *name;        /* reported host name; NULL: gethostname */
    int timeout_ms;          /* per call; 0: 10000 */
} dev_agent_opts;

typedef struct dev_agent dev_agent;

/* Locks the state directory (a directory another agent holds is refused
 * with SL_ESTATE, naming the holder's pid), enrolls (when the state has no
 * certificate yet) or loads the stored identity, then connects with mutual
 * TLS. Refusals from the coordinator come back as "Enroll refused: CODE:
 * reason" with SL_EAUTH. */
dev_agent *dev_agent_open(const dev_agent_opts *o, sl_err *err);
void dev_agent_close(dev_agent *a);
const char *dev_agent_id(const dev_agent *a);
/* Milliseconds between heartbeats the coordinator asked for. */
unsigned dev_agent_heartbeat_ms(const dev_agent *a);
/* Asks for the next heartbeat now (from any thread): a job that failed
 * here wants its next task without waiting out the interval. */
void dev_agent_poke(dev_agent *a);
/* 1 if a heartbeat was asked for since the last call (clears it). */
int dev_agent_take_poke(dev_agent *a);
/* Where this device serves Stage, reported with every heartbeat. */
void dev_agent_set_stage_address(dev_agent *a, const char *host_port);
/* One heartbeat (the first one carries the profile); returns the rpc code.
 * Renews the certificate first when it is due: a failed renewal is logged
 * and tried again at the next heartbeat, a refused one (revoked) is returned.
 * An expired certificate gives UNAUTHENTICATED without calling. */
int dev_agent_heartbeat(dev_agent *a, rpc_status *st);
/* Renews the certificate now; returns the rpc code (RPC_OK: stored and in use). */
int dev_agent_renew(dev_agent *a, rpc_status *st);
/* The certificate in use: validity (UNIX seconds) and when it is renewed. */
void dev_agent_cert_times(const dev_agent *a, int64_t *not_before, int64_t *not_after,
                          int64_t *renew_at);
/* 1 if the coordinator's last heartbeat reply listed `id` as revoked.
 * Thread-safe (a Stage server asks from its own thread). */
int dev_agent_is_revoked(void *agent, const char *id);
/* RPC_OK if the coordinator's last heartbeat reply named `id` among the
 * devices measuring their link to this one (its Ping callers); otherwise
 * FAILED_PRECONDITION in st. Thread-safe. */
int dev_agent_may_ping(void *agent, const char *id, rpc_status *st);

/* What heartbeats tell the coordinator for jobs: the datasets this device
 * serves, its X25519 link key, its compute threads. */
void dev_agent_set_job_info(dev_agent *a, const char *const *datasets, int n_datasets,
                            const uint8_t link_key[32], unsigned threads);
/* The data-owner policy heartbeats state (dev_policy, dev_plan.h), so
 * that the coordinator plans within it. */
void dev_agent_set_policy(dev_agent *a, int home_layers, int allow_unsealed, int allow_labels_out);
/* A task the coordinator's last heartbeat reply asked for. */
typedef struct dev_task {
    char job[24];
    char kind[16];
    uint32_t epoch;
    char *spec; /* JSON */
} dev_task;
/* Moves the tasks of the last heartbeat reply to the caller (free each spec
 * and the array with dev_tasks_free). */
void dev_agent_take_tasks(dev_agent *a, dev_task **tasks, int *n);
void dev_tasks_free(dev_task *t, int n);
/* A new mutual-TLS channel to the coordinator with this device's current
 * certificate (for work on other threads than the heartbeat's). */
rpc_channel *dev_agent_channel_new(dev_agent *a, sl_err *err);
const char *dev_agent_state_dir(const dev_agent *a);
int dev_agent_timeout_ms(const dev_agent *a);
/* The heartbeat interval a coordinator may ask for; anything else is ignored. */
#define DEV_HEARTBEAT_MIN_MS 100
#define DEV_HEARTBEAT_MAX_MS 3600000

/* The coordinator's EnrollResponse, checked before anything is written:
 * the device id must be want_id and the certificate a PEM whose common name
 * is want_id. *cert_pem (malloc'd) gets the certificate, *heartbeat_ms the
 * interval asked for (0: none, or out of range). */
int dev_enroll_reply_check(const uint8_t *reply, size_t len, const char *want_id,
                           unsigned *heartbeat_ms, char **cert_pem, size_t *cert_len, sl_err *err);
/* The coordinator's HeartbeatResponse: *heartbeat_ms as above, *revoked
 * (malloc'd) the revoked device ids, each followed by ' ' (entries that are
 * not device ids are dropped). */
int dev_heartbeat_reply_parse(const uint8_t *reply, size_t len, unsigned *heartbeat_ms,
                              char **revoked, sl_err *err);

/* The newest coordinator certificate a device has seen: heartbeat replies
 * carry the coordinator's current one, and a plan's signer must not be
 * older (a key a rotation replaced signs no plan the device runs). Kept in
 * the state directory as coordinator.crt. */
typedef struct dev_coord_seen {
    int have;
    int64_t not_before;    /* UNIX seconds */
    char fp[CERT_HEX_LEN]; /* SHA-256 of the certificate, hex */
} dev_coord_seen;
enum { DEV_COORD_SAME = 0, DEV_COORD_NEWER = 1 };
/* Judges pem (its first certificate; it must chain to the CA in ca_pem and
 * be a coordinator's: cert_coordinator_check) against the newest seen:
 * DEV_COORD_NEWER (take it: *out), DEV_COORD_SAME, or -1 with the reason:
 * an older notBefore, or (for a plan's signer) another certificate of the
 * same notBefore. from_heartbeat: a certificate of the same notBefore that
 * the coordinator sends is taken. */
int dev_coord_cert_judge(const char *ca_pem, size_t ca_len, const dev_coord_seen *seen,
                         const char *pem, size_t len, int from_heartbeat, dev_coord_seen *out,
                         sl_err *err);
/* A plan's signer certificate, judged against the newest seen (a newer one
 * becomes the newest): 0, or -1 refused with the reason. Thread-safe. */
int dev_agent_plan_signer(dev_agent *a, const char *pem, size_t len, sl_err *err);

/* dev_profile -> skyloom.v1.DeviceProfile (pb is a Skyloom__V1__DeviceProfile;
 * its strings point into p). */
void dev_profile_to_pb(const dev_profile *p, void *pb);

#endif
