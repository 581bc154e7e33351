/* coord_server.c - the Coordinator service: opening the coordinator,
 * enrollment, renewal, heartbeats and the device list (the job manager's
 * calls are in coord_jobs_rpc.c, authorization in coord_auth.c). Handlers
 * run on the rpc server's worker threads, several at a time, each on a
 * database connection of its own (coord_db_get); the CA key is used one
 * thread at a time. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bal.h"
#include "coord_internal.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

#define LOCK_FILE "coordinator.lock"

/* ---- exclusive use of the directories ------------------------------------------ */

/* Takes DIR/coordinator.lock; a second coordinator on the same directory is
 * refused, naming the holder. */
static int lock_dir(const char *dir, const char *what, int *fd_out, sl_err *err)
{
    char p[4200], desc[4300];
    if (cert_path(p, sizeof p, dir, LOCK_FILE, err))
        return -1;
    snprintf(desc, sizeof desc, "the %s directory %s", what, dir);
    return sl_lock_file(p, desc, "coordinator", fd_out, err);
}

static int same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The PKI directory and its spool hold the CA key and pending tokens. */
static int private_pki(const char *pki, sl_err *err)
{
    char spool[4200];
    if (cert_path(spool, sizeof spool, pki, "spool", err))
        return -1;
    const char *dirs[2] = {pki, spool};
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (stat(dirs[i], &st) != 0 || !S_ISDIR(st.st_mode))
            return sl_err_set(err, SL_EIO, "%s is missing: is %s a PKI directory (skyloom certs "
                              "init)?", dirs[i], pki);
        mode_t old;
        int r = sl_private_dir(dirs[i], &old, err);
        if (r < 0)
            return -1;
        if (r > 0)
            sl_log_warn("coordinator: a PKI directory was open to group or others; made it "
                        "private", "dir=%s old_mode=%04o mode=0700", dirs[i], (unsigned)old);
    }
    return 0;
}

coord *coord_open(const coord_opts *o, sl_err *err)
{
    coord *c = sl_xcalloc(1, sizeof *c);
    c->o = *o;
    c->lock_fd[0] = c->lock_fd[1] = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->spool_mu, NULL);
    pthread_mutex_init(&c->ca_mu, NULL);
    if (!c->o.max_message)
        c->o.max_message = COORD_DEFAULT_MAX_MESSAGE;
    if (!c->o.heartbeat_ms)
        c->o.heartbeat_ms = 5000;
    c->pki = sl_xstrdup(o->pki);
    mode_t old;
    int64_t def;
    /* a lifetime that cannot be read is named before anything is taken */
    int r = cert_pki_device_seconds(o->pki, &def, err) ? -1 : private_pki(o->pki, err);
    if (!r)
        r = lock_dir(o->pki, "PKI", &c->lock_fd[0], err);
    if (!r && (r = sl_private_dir(o->state, &old, err)) > 0) {
        sl_log_warn("coordinator: the state directory was open to group or others; made it "
                    "private", "dir=%s old_mode=%04o mode=0700", o->state, (unsigned)old);
        r = 0;
    }
    if (!r && !same_dir(o->pki, o->state))
        r = lock_dir(o->state, "state", &c->lock_fd[1], err);
    if (!r && cert_pair_recover(o->pki, "coordinator", err) < 0)
        r = -1;
    if (r || !(c->ca = cert_ca_load(o->pki, err)) || !(c->state = coord_state_open(o->state, err)) ||
        coord_import_spool(c, c->state, err) || !(c->jobs = coord_jobs_open(c, err))) {
        coord_close(c);
        return NULL;
    }
    return c;
}

int coord_start(coord *c, sl_err *err)
{
    char crt[4096], key[4096], ca[4096];
    if (cert_path(crt, sizeof crt, c->pki, "coordinator.crt", err) ||
        cert_path(key, sizeof key, c->pki, "coordinator.key", err) ||
        cert_path(ca, sizeof ca, c->pki, "ca.crt", err))
        return -1;
    rpc_server_opts so = {
        .listen = c->o.listen,
        .tls = {ca, crt, key},
        .client_auth = RPC_CLIENT_CERT_OPTIONAL,
        .max_message = c->o.max_message,
        /* anyone may connect here: a connection lives 10 minutes at most */
        .conn_age_ms = 10 * 60 * 1000,
        .shutdown_grace_ms = c->o.shutdown_grace_ms,
        .reload_tls = 1, /* certs rotate-coordinator applies without a restart */
    };
    /* Every method has workers of its own: heartbeats are never held up by
     * enrollments, listings, step reports or checkpoint uploads. */
    static const struct {
        const char *method;
        rpc_unary_fn fn;
        int workers;
    } handlers[] = {
        {RPC_M_ENROLL, coord_handle_enroll, 2},
        {RPC_M_HEARTBEAT, coord_handle_heartbeat, 2},
        {RPC_M_LIST_DEVICES, coord_handle_list_devices, 2},
        {RPC_M_RENEW, coord_handle_renew, 1},
        {RPC_M_SUBMIT_JOB, coord_handle_submit_job, 1},
        {RPC_M_LIST_JOBS, coord_handle_list_jobs, 1},
        {RPC_M_GET_JOB, coord_handle_get_job, 2},
        {RPC_M_STOP_JOB, coord_handle_stop_job, 1},
        {RPC_M_RESUME_JOB, coord_handle_resume_job, 1},
        {RPC_M_FETCH_FILE, coord_handle_fetch_file, 2},
        {RPC_M_REPORT_TASK, coord_handle_report_task, 2},
        {RPC_M_GET_PLAN, coord_handle_get_plan, 2},
        {RPC_M_REPORT_STEP, coord_handle_report_step, 2},
        {RPC_M_UPLOAD_CHUNK, coord_handle_upload_chunk, 2},
        {RPC_M_UPLOAD_INIT, coord_handle_upload_init, 1},
    };
    if (!(c->srv = rpc_server_create(&so, err)))
        return -1;
    for (size_t i = 0; i < sizeof handlers / sizeof handlers[0]; i++) {
        const rpc_unary_opts uo = {.workers = handlers[i].workers};
        if (rpc_server_add_unary_opts(c->srv, handlers[i].method, &uo, handlers[i].fn, c, err))
            return -1;
    }
    return rpc_server_start(c->srv, err);
}

int coord_close(coord *c)
{
    if (!c)
        return 0;
    if (rpc_server_destroy(c->srv) != 0)
        return -1; /* a handler still runs: it may use everything below */
    coord_jobs_close(c->jobs);
    for (int i = 0; i < c->n_pool; i++)
        coord_state_close(c->pool[i]);
    coord_state_close(c->state);
    cert_ca_free(c->ca);
    for (int i = 0; i < 2; i++)
        if (c->lock_fd[i] >= 0)
            close(c->lock_fd[i]);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->spool_mu);
    pthread_mutex_destroy(&c->ca_mu);
    free(c->pki);
    free(c);
    return 0;
}

/* The lifetime of a device certificate: the device's own (from its token),
 * else the coordinator's option, else the PKI's default, read each time so
 * that a change applies from the next certificate. */
static int cert_lifetime(coord *c, int64_t own, int64_t *seconds, sl_err *err)
{
    if (own > 0) {
        *seconds = own;
        return 0;
    }
    if (c->o.cert_days > 0) {
        *seconds = (int64_t)c->o.cert_days * 86400;
        return 0;
    }
    return cert_pki_device_seconds(c->pki, seconds, err);
}

/* ---- Enroll ------------------------------------------------------------------ */

const char *coord_enroll_reason_name(int reason)
{
    static const char *const names[COORD_ENROLL_NREASONS] = {
        "malformed", "unknown_token", "token_used", "token_expired", "wrong_site", "bad_csr",
        "revoked_key", "internal"};
    return reason >= 0 && reason < COORD_ENROLL_NREASONS ? names[reason] : "?";
}

void coord_enroll_counts(coord *c, uint64_t *accepted, uint64_t *refused)
{
    *accepted = atomic_load(&c->enrolled);
    for (int i = 0; i < COORD_ENROLL_NREASONS; i++)
        refused[i] = atomic_load(&c->enroll_refused[i]);
}

static int enroll(coord *c, const Skyloom__V1__EnrollRequest *r, rpc_buf *resp, rpc_status *st,
                  int *why);

int coord_handle_enroll(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                        rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    (void)peer;
    Skyloom__V1__EnrollRequest *r = rpc_unpack(&skyloom__v1__enroll_request__descriptor, req, len);
    int why = COORD_ENROLL_MALFORMED;
    int code = r ? enroll(c, r, resp, st, &why)
                 : rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed EnrollRequest");
    if (code == RPC_OK)
        atomic_fetch_add(&c->enrolled, 1);
    else
        atomic_fetch_add(&c->enroll_refused[why], 1);
    rpc_unpacked_free(r);
    return code;
}

/* Enroll's checks and work; *why is the refusal's reason (coord_obs.h). */
static int enroll(coord *c, const Skyloom__V1__EnrollRequest *r, rpc_buf *resp, rpc_status *st,
                  int *why)
{
    int code = RPC_OK;
    char *pem = NULL;
    char hash[CERT_HEX_LEN], tsite[CERT_SITE_MAX + 1] = "", id[CERT_ID_LEN];
    sl_err err = {0};
    coord_state *db = coord_db_get(c, &err);
    *why = COORD_ENROLL_INTERNAL;
    if (!db) {
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
        goto out;
    }
    *why = COORD_ENROLL_MALFORMED;
    if (strlen(r->token) != 64) {
        code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "token secret must be 64 hex digits");
        goto out;
    }
    if (!cert_valid_site(r->site)) {
        code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "bad site name");
        goto out;
    }
    if (strlen(r->name) > 255) {
        code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "name longer than 255 bytes");
        goto out;
    }
    *why = COORD_ENROLL_INTERNAL;
    if (coord_import_spool(c, db, &err)) {
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
        goto out;
    }
    cert_token_hash(r->token, hash);
    int64_t now = sl_unix_time(), cert_s = 0, life;
    switch (coord_state_check_token(db, hash, r->site, now, tsite, &cert_s, &err)) {
    case COORD_TOKEN_OK:
        break;
    case COORD_TOKEN_UNKNOWN:
        *why = COORD_ENROLL_UNKNOWN_TOKEN;
        code = rpc_status_set(st, RPC_UNAUTHENTICATED, "unknown enrollment token");
        goto out;
    case COORD_TOKEN_USED:
        *why = COORD_ENROLL_TOKEN_USED;
        code = rpc_status_set(st, RPC_UNAUTHENTICATED, "enrollment token already used");
        goto out;
    case COORD_TOKEN_EXPIRED:
        *why = COORD_ENROLL_TOKEN_EXPIRED;
        code = rpc_status_set(st, RPC_UNAUTHENTICATED, "enrollment token expired");
        goto out;
    case COORD_TOKEN_WRONG_SITE:
        *why = COORD_ENROLL_WRONG_SITE;
        code = rpc_status_set(st, RPC_PERMISSION_DENIED,
                              "token was issued for site '%s', not '%s'", tsite, r->site);
        goto out;
    default:
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
        goto out;
    }
    if (cert_lifetime(c, cert_s, &life, &err)) {
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
        goto out;
    }
    pthread_mutex_lock(&c->ca_mu);
    int signed_bad = cert_ca_issue(c->ca, r->csr_der.data, r->csr_der.len, r->site, life, NULL,
                                   NULL, id, &pem, &err);
    pthread_mutex_unlock(&c->ca_mu);
    if (signed_bad) {
        *why = COORD_ENROLL_BAD_CSR;
        code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "CSR refused: %s", err.msg);
        goto out;
    }
    int rev = coord_state_is_revoked(db, id, &err);
    if (rev) {
        *why = rev < 0 ? COORD_ENROLL_INTERNAL : COORD_ENROLL_REVOKED;
        code = rev < 0 ? rpc_status_set(st, RPC_INTERNAL, "%s", err.msg)
                       : rpc_status_set(st, RPC_PERMISSION_DENIED,
                                        "device %s (this key) is revoked; enroll with a new key", id);
        goto out;
    }
    rpc_buf prof = {0};
    if (r->profile)
        rpc_pack(r->profile, &prof);
    coord_device d = {.id = id, .site = r->site, .name = r->name, .cert_pem = pem,
                      .profile = prof.data, .profile_len = prof.len, .cert_seconds = cert_s};
    int rc = coord_state_enroll(db, hash, &d, now, &err);
    rpc_buf_free(&prof);
    if (rc) {
        *why = err.code == SL_EAUTH ? COORD_ENROLL_TOKEN_USED : COORD_ENROLL_INTERNAL;
        code = rpc_status_set(st, err.code == SL_EAUTH ? RPC_UNAUTHENTICATED : RPC_INTERNAL, "%s",
                              err.msg);
        goto out;
    }
    sl_log_info("coordinator: device enrolled", "device=%s site=%s name=%s", id, r->site, r->name);
    Skyloom__V1__EnrollResponse out = SKYLOOM__V1__ENROLL_RESPONSE__INIT;
    out.device_id = id;
    out.cert_pem.data = (uint8_t *)pem;
    out.cert_pem.len = strlen(pem);
    out.ca_pem.data = (uint8_t *)cert_ca_pem(c->ca);
    out.ca_pem.len = strlen(cert_ca_pem(c->ca));
    out.heartbeat_ms = c->o.heartbeat_ms;
    rpc_pack(&out, resp);
out:
    coord_db_put(c, db);
    free(pem);
    return code;
}

/* ---- Renew -------------------------------------------------------------------- */

/* A new certificate for an authorized device's new key: the same id and site,
 * the device's lifetime. */
static int renew(coord *c, coord_state *db, const Skyloom__V1__RenewRequest *r, rpc_buf *resp,
                 rpc_status *st)
{
    char site[CERT_SITE_MAX + 1], id[CERT_ID_LEN];
    char *old = NULL, *pem = NULL;
    int64_t own = 0, life;
    sl_err err = {0};
    int code = RPC_OK;
    int rc = coord_state_device_cert(db, r->device_id, site, &old, &own, &err);
    if (rc) {
        code = rc < 0 ? rpc_status_set(st, RPC_INTERNAL, "%s", err.msg)
                      : rpc_status_set(st, RPC_PERMISSION_DENIED, "device %s is not enrolled here",
                                       r->device_id);
        goto out;
    }
    if (cert_lifetime(c, own, &life, &err)) {
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
        goto out;
    }
    pthread_mutex_lock(&c->ca_mu);
    rc = cert_ca_issue(c->ca, r->csr_der.data, r->csr_der.len, site, life, r->device_id,
                       old[0] ? old : NULL, id, &pem, &err);
    pthread_mutex_unlock(&c->ca_mu);
    if (rc) {
        code = rpc_status_set(st, RPC_INVALID_ARGUMENT, "CSR refused: %s", err.msg);
        goto out;
    }
    if ((rc = coord_state_set_cert(db, r->device_id, pem, &err)) != 0) {
        code = rpc_status_set(st, rc < 0 ? RPC_INTERNAL : RPC_PERMISSION_DENIED, "%s",
                              rc < 0 ? err.msg : "device is not enrolled here");
        goto out;
    }
    sl_log_info("coordinator: certificate renewed", "device=%s site=%s lifetime_s=%lld",
                r->device_id, site, (long long)life);
    Skyloom__V1__RenewResponse out = SKYLOOM__V1__RENEW_RESPONSE__INIT;
    out.cert_pem.data = (uint8_t *)pem;
    out.cert_pem.len = strlen(pem);
    rpc_pack(&out, resp);
out:
    free(old);
    free(pem);
    return code;
}

int coord_handle_renew(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                       rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__RenewRequest *r = rpc_unpack(&skyloom__v1__renew_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed RenewRequest");
    sl_err err = {0};
    coord_state *db = coord_db_get(c, &err);
    int code = db ? coord_authorize_on(c, db, peer, r->device_id, COORD_ALLOW_DEVICE, st)
                  : rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    if (code == RPC_OK)
        code = renew(c, db, r, resp, st);
    coord_db_put(c, db);
    rpc_unpacked_free(r);
    return code;
}

/* ---- Heartbeat --------------------------------------------------------------- */

/* Room for one more element in an array of n that has room for *cap. */
static void *grow(void *v, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return v;
    *cap = *cap ? 2 * *cap : 16;
    return sl_xrealloc(v, *cap * elem);
}

typedef struct str_list {
    char **v;
    size_t n, cap;
} str_list;

static int add_revoked(void *ud, const char *id)
{
    str_list *l = ud;
    l->v = grow(l->v, l->n, &l->cap, sizeof *l->v);
    l->v[l->n++] = sl_xstrdup(id);
    return 0;
}

/* The PKI's current coordinator.crt, read again whenever the file changes
 * (a rotation renames a new one in place: another inode, another mtime). */
static struct {
    pthread_mutex_t mu;
    char *path;
    dev_t dev;
    ino_t ino;
    struct timespec mtime;
    off_t size;
    char *pem;
    size_t len;
} crt_cache = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* A copy of the current certificate into *pem (malloc'd), or NULL when it
 * cannot be read (logged; the reply goes out without it). */
static void current_cert(coord *c, char **pem, size_t *len)
{
    *pem = NULL;
    *len = 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/coordinator.crt", c->pki);
    struct stat sb;
    pthread_mutex_lock(&crt_cache.mu);
    if (stat(path, &sb) == 0 &&
        !(crt_cache.pem && crt_cache.path && !strcmp(crt_cache.path, path) &&
          crt_cache.dev == sb.st_dev && crt_cache.ino == sb.st_ino && crt_cache.size == sb.st_size &&
          crt_cache.mtime.tv_sec == sb.st_mtim.tv_sec &&
          crt_cache.mtime.tv_nsec == sb.st_mtim.tv_nsec)) {
        char *text = NULL;
        size_t n = 0;
        sl_err err = {0};
        if (sl_read_file(path, 1 << 20, &text, &n, &err) == 0) {
            free(crt_cache.pem);
            free(crt_cache.path);
            crt_cache.pem = text;
            crt_cache.len = n;
            crt_cache.path = sl_xstrdup(path);
            crt_cache.dev = sb.st_dev;
            crt_cache.ino = sb.st_ino;
            crt_cache.size = sb.st_size;
            crt_cache.mtime = sb.st_mtim;
        } else {
            sl_log_warn("coordinator: cannot read its certificate for heartbeats", "reason=\"%s\"",
                        err.msg);
        }
    }
    if (crt_cache.pem && crt_cache.path && !strcmp(crt_cache.path, path)) {
        *pem = sl_xmalloc(crt_cache.len + 1);
        memcpy(*pem, crt_cache.pem, crt_cache.len);
        *len = crt_cache.len;
    }
    pthread_mutex_unlock(&crt_cache.mu);
}

/* The heartbeat's answer: the server time, the interval, the revoked ids,
 * the device's tasks, the devices it may answer Ping for, and the
 * coordinator's current certificate. */
static int heartbeat_reply(coord *c, coord_state *db, const char *id, int64_t now, rpc_buf *resp,
                           rpc_status *st)
{
    Skyloom__V1__HeartbeatResponse out = SKYLOOM__V1__HEARTBEAT_RESPONSE__INIT;
    out.server_time = now;
    out.heartbeat_ms = c->o.heartbeat_ms;
    char *crt = NULL;
    size_t crt_len = 0;
    current_cert(c, &crt, &crt_len);
    out.coordinator_cert.data = (uint8_t *)crt;
    out.coordinator_cert.len = crt_len;
    str_list rev = {0};
    sl_err err = {0};
    int code = RPC_OK;
    void **tasks = NULL;
    char **pingers = NULL;
    size_t ntasks = 0, npingers = 0;
    if (coord_state_list_revoked(db, add_revoked, &rev, &err)) {
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    } else {
        coord_jobs_tasks(c->jobs, id, &tasks, &ntasks);
        coord_jobs_pingers(c->jobs, id, &pingers, &npingers);
        out.pingers = pingers;
        out.n_pingers = npingers;
        out.revoked = rev.v;
        out.n_revoked = rev.n;
        out.tasks = (Skyloom__V1__Task **)tasks;
        out.n_tasks = ntasks;
        rpc_pack(&out, resp);
    }
    coord_jobs_tasks_free(tasks, ntasks);
    for (size_t k = 0; k < npingers; k++)
        free(pingers[k]);
    free(pingers);
    for (size_t k = 0; k < rev.n; k++)
        free(rev.v[k]);
    free(rev.v);
    free(crt);
    return code;
}

/* Records an authorized device's heartbeat and answers it. */
static int heartbeat(coord *c, coord_state *db, const Skyloom__V1__HeartbeatRequest *r, rpc_buf *resp,
                     rpc_status *st)
{
    size_t alen = strlen(r->stage_address);
    if (alen > 255)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "stage_address longer than 255 bytes");
    /* plans carry the address and the devices refuse one that is not this */
    for (size_t i = 0; i < alen; i++)
        if ((unsigned char)r->stage_address[i] <= 0x20 || (unsigned char)r->stage_address[i] >= 0x7f)
            return rpc_status_set(st, RPC_INVALID_ARGUMENT, "stage_address has a space or a "
                                  "byte that is not printable ASCII");
    if (r->threads > 65536)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "threads: %u is over 65536", r->threads);
    rpc_buf prof = {0};
    if (r->profile)
        rpc_pack(r->profile, &prof);
    sl_err err = {0};
    int64_t now = sl_unix_time();
    int rc = coord_state_heartbeat(db, r->device_id, r->seq, r->profile ? prof.data : NULL,
                                   prof.len, r->stage_address, now, &err);
    rpc_buf_free(&prof);
    if (rc < 0) {
        /* the device is authorized (authorize read the registry); a failed
         * write of its liveness (a full disk, say) must not cut it off from
         * its tasks: the job manager keeps its view in memory */
        static _Atomic int64_t last_logged;
        if (now - last_logged >= 10) {
            last_logged = now;
            sl_log_error("coordinator: cannot record heartbeats", "device=%s reason=\"%s\"",
                         r->device_id, err.msg);
        }
        rc = 0;
    }
    if (rc > 0)
        return rpc_status_set(st, RPC_PERMISSION_DENIED, "device %s is not enrolled here",
                              r->device_id);
    if (r->n_datasets > 64 || (r->link_public_key.len && r->link_public_key.len != 32))
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "more than 64 datasets, or a link key "
                              "of %zu bytes (32 expected)", r->link_public_key.len);
    coord_seen seen = {.id = r->device_id, .stage_address = r->stage_address,
                       .datasets = r->datasets, .n_datasets = r->n_datasets,
                       .link_key = r->link_public_key.len == 32 ? r->link_public_key.data : NULL,
                       .threads = r->threads,
                       .memory_bytes = r->profile ? r->profile->memory_bytes : 0,
                       .backend = r->profile && r->profile->cuda ? "cuda" : "cpu"};
    if (r->policy) {
        if (r->policy->home_layers > BAL_MAX_LAYERS)
            return rpc_status_set(st, RPC_INVALID_ARGUMENT, "policy.home_layers: %u is over %d",
                                  r->policy->home_layers, BAL_MAX_LAYERS);
        seen.policy = (coord_policy){.known = 1, .home_layers = (int)r->policy->home_layers,
                                     .allow_unsealed = r->policy->allow_unsealed,
                                     .allow_labels_out = r->policy->allow_labels_out};
    }
    coord_jobs_seen(c->jobs, &seen, now);
    return heartbeat_reply(c, db, r->device_id, now, resp, st);
}

int coord_handle_heartbeat(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                           rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__HeartbeatRequest *r =
        rpc_unpack(&skyloom__v1__heartbeat_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed HeartbeatRequest");
    sl_err err = {0};
    coord_state *db = coord_db_get(c, &err);
    int code = db ? coord_authorize_on(c, db, peer, r->device_id, COORD_ALLOW_DEVICE, st)
                  : rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    if (code == RPC_OK)
        code = heartbeat(c, db, r, resp, st);
    coord_db_put(c, db);
    rpc_unpacked_free(r);
    return code;
}

/* ---- ListDevices ------------------------------------------------------------- */

typedef struct list_ctx {
    coord *c;
    coord_state *db;
    int64_t now;
    Skyloom__V1__ListDevicesResponse out;
    size_t cap;
} list_ctx;

static char *dup_or_empty(const char *s) { return sl_xstrdup(s ? s : ""); }

static int list_one(void *ud, const coord_device *d)
{
    list_ctx *l = ud;
    l->out.devices = grow(l->out.devices, l->out.n_devices, &l->cap, sizeof *l->out.devices);
    Skyloom__V1__DeviceInfo *i = sl_xmalloc(sizeof *i);
    skyloom__v1__device_info__init(i);
    i->device_id = dup_or_empty(d->id);
    i->site = dup_or_empty(d->site);
    i->name = dup_or_empty(d->name);
    i->stage_address = dup_or_empty(d->stage_address);
    int64_t stale = 3 * (int64_t)l->c->o.heartbeat_ms / 1000 + 1;
    i->state = sl_xstrdup(d->revoked ? "revoked"
                          : d->last_heartbeat && l->now - d->last_heartbeat <= stale ? "online"
                                                                                      : "offline");
    i->enrolled_at = d->enrolled_at;
    i->last_heartbeat = d->last_heartbeat;
    if (d->profile_len)
        i->profile = rpc_unpack(&skyloom__v1__device_profile__descriptor, d->profile, d->profile_len);
    coord_jobs_datasets(l->c->jobs, d->id, &i->datasets, &i->n_datasets);
    sl_err err = {0};
    if (coord_jobs_latest_profile(l->db, d->id, &i->job_profile, &err))
        sl_log_warn("coordinator: job profile not read", "device=%s reason=\"%s\"", d->id, err.msg);
    l->out.devices[l->out.n_devices++] = i;
    return 0;
}

int coord_handle_list_devices(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                              rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    Skyloom__V1__ListDevicesRequest *r =
        rpc_unpack(&skyloom__v1__list_devices_request__descriptor, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed ListDevicesRequest");
    sl_err err = {0};
    coord_state *db = coord_db_get(c, &err);
    int code = db ? coord_authorize_on(c, db, peer, r->device_id, COORD_ALLOW_DEVICE | COORD_ALLOW_ADMIN, st)
                  : rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    rpc_unpacked_free(r);
    if (code != RPC_OK) {
        coord_db_put(c, db);
        return code;
    }
    list_ctx l = {.c = c, .db = db, .now = sl_unix_time()};
    skyloom__v1__list_devices_response__init(&l.out);
    if (coord_state_list_devices(db, list_one, &l, &err))
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    else
        rpc_pack(&l.out, resp);
    for (size_t k = 0; k < l.out.n_devices; k++) {
        Skyloom__V1__DeviceInfo *i = l.out.devices[k];
        free(i->device_id);
        free(i->site);
        free(i->name);
        free(i->stage_address);
        free(i->state);
        rpc_unpacked_free(i->profile);
        coord_jobs_profile_free(i->job_profile);
        coord_jobs_datasets_free(i->datasets, i->n_datasets);
        free(i);
    }
    free(l.out.devices);
    coord_db_put(c, db);
    return code;
}
