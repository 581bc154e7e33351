/* dev_agent.c - enrollment, stored identity and heartbeats of a device. */
#include <errno.h>
#include <pthread.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cert.h"
#include "dev_agent.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

struct dev_agent {
    dev_agent_opts o;
    char id[CERT_ID_LEN];
    dev_identity_files f;
    rpc_channel *ch;
    unsigned heartbeat_ms;
    uint64_t seq;
    dev_profile profile;
    int have_profile;
    char stage_address[256];
    pthread_mutex_t mu; /* guards revoked and pingers */
    char *revoked;      /* the revoked ids of the last heartbeat, each followed by ' ' */
    char *pingers;      /* the devices it named as measuring their links to this one, alike */
    int64_t not_before, not_after, renew_at; /* the certificate in use */
    char **datasets;
    int n_datasets;
    uint8_t link_key[32];
    int has_key;
    unsigned threads;
    int has_policy;
    Skyloom__V1__OwnerPolicy policy;
    dev_task *tasks; /* of the last heartbeat reply */
    int n_tasks;
    pthread_mutex_t coord_mu; /* guards coord (heartbeats and runs' plans) */
    dev_coord_seen coord;     /* the newest coordinator certificate seen */
    _Atomic int poked; /* a heartbeat is wanted before the interval is up */
    int lock_fd;       /* DIR/device.lock, held while the agent is open */
};

#define LOCK_FILE "device.lock"
#define COORD_CERT_FILE "coordinator.crt"

/* Takes DIR/device.lock: a second agent on the same state directory would
 * take over the first one's identity, so it is refused, naming the holder. */
static int lock_state(const char *dir, int *fd_out, sl_err *err)
{
    char p[4200], what[4300];
    if (cert_path(p, sizeof p, dir, LOCK_FILE, err))
        return -1;
    snprintf(what, sizeof what, "the state directory %s", dir);
    return sl_lock_file(p, what, "device", fd_out, err);
}

void dev_profile_to_pb(const dev_profile *p, void *out)
{
    Skyloom__V1__DeviceProfile *pb = out;
    skyloom__v1__device_profile__init(pb);
    pb->cores = p->cores;
    pb->pus = p->pus;
    pb->memory_bytes = p->memory_bytes;
    pb->l2_bytes = p->l2_bytes;
    pb->l3_bytes = p->l3_bytes;
    pb->cuda = p->cuda;
    pb->gpu_name = p->cuda ? (char *)p->gpu : "";
    pb->gpu_memory_bytes = p->gpu_memory_bytes;
    pb->cpu_model = (char *)p->cpu_model;
    pb->numa_nodes = p->numa_nodes;
    pb->l1d_bytes = p->l1d_bytes;
}

int dev_identity_files_init(dev_identity_files *f, const char *state, sl_err *err)
{
    return cert_path(f->ca, sizeof f->ca, state, "ca.crt", err) ||
                   cert_path(f->crt, sizeof f->crt, state, "device.crt", err) ||
                   cert_path(f->key, sizeof f->key, state, "device.key", err)
               ? -1
               : 0;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static rpc_channel *connect_as(dev_agent *a, int with_cert, sl_err *err)
{
    rpc_channel_opts co = {.target = a->o.coordinator,
                           .tls = {a->f.ca, with_cert ? a->f.crt : NULL, with_cert ? a->f.key : NULL}};
    return rpc_channel_create(&co, err);
}

/* Checks device.crt against the pinned CA and device.key, takes the device id
 * from it and plans the renewal: at two thirds of the certificate's lifetime. */
static int load_identity(dev_agent *a, sl_err *err)
{
    char cn[128], *pem;
    size_t n;
    if (cert_file_cn(a->f.crt, cn, sizeof cn, err))
        return -1;
    if (!cert_valid_device_id(cn))
        return sl_err_set(err, SL_ECORRUPT, "%s is for '%s', not a device", a->f.crt, cn);
    if (sl_read_file(a->f.crt, 1u << 20, &pem, &n, err))
        return -1;
    int rc = cert_pem_check(pem, n, a->f.ca, a->f.key, cn, &a->not_before, &a->not_after, err);
    free(pem);
    if (rc)
        return sl_err_wrap(err, "%s", a->f.crt);
    memcpy(a->id, cn, CERT_ID_LEN); /* a device id: exactly CERT_ID_LEN with the NUL */
    a->renew_at = a->not_before + (a->not_after - a->not_before) * 2 / 3;
    return 0;
}

int dev_coord_cert_judge(const char *ca_pem, size_t ca_len, const dev_coord_seen *seen,
                         const char *pem, size_t len, int from_heartbeat, dev_coord_seen *out,
                         sl_err *err)
{
    memset(out, 0, sizeof *out);
    int64_t nb = 0;
    char fp[CERT_HEX_LEN];
    if (cert_coordinator_check(ca_pem, ca_len, pem, len, &nb, fp, err))
        return -1;
    out->have = 1;
    out->not_before = nb;
    memcpy(out->fp, fp, sizeof fp);
    if (!seen->have || nb > seen->not_before)
        return DEV_COORD_NEWER;
    if (nb == seen->not_before && !strcmp(fp, seen->fp))
        return DEV_COORD_SAME;
    if (nb == seen->not_before && from_heartbeat)
        return DEV_COORD_NEWER; /* the coordinator's word on which of two of one second */
    return sl_err_set(err, SL_EAUTH, "coordinator certificate %.16s (valid from %lld) is %s the "
                      "newest this device has seen, %.16s (valid from %lld): its key was rotated "
                      "out", fp, (long long)nb, nb < seen->not_before ? "older than" : "not",
                      seen->fp, (long long)seen->not_before);
}

/* Judges a coordinator certificate against the newest seen and adopts it
 * when it is newer (kept in the state directory for the next start).
 * Returns what dev_coord_cert_judge says. */
static int coord_learn(dev_agent *a, const char *pem, size_t len, int from_heartbeat, sl_err *err)
{
    char *ca = NULL;
    size_t ca_len = 0;
    if (sl_read_file(a->f.ca, 1 << 20, &ca, &ca_len, err))
        return -1;
    pthread_mutex_lock(&a->coord_mu);
    dev_coord_seen got;
    int v = dev_coord_cert_judge(ca, ca_len, &a->coord, pem, len, from_heartbeat, &got, err);
    if (v == DEV_COORD_NEWER) {
        char path[4300];
        sl_err werr = {0};
        if (cert_path(path, sizeof path, a->o.state, COORD_CERT_FILE, &werr) ||
            sl_write_file_atomic(path, pem, len, &werr))
            sl_log_warn("device: cannot keep the coordinator's certificate", "reason=\"%s\"",
                        werr.msg);
        if (a->coord.have)
            sl_log_info("device: the coordinator's certificate changed", "from=%.16s to=%.16s "
                        "not_before=%lld", a->coord.fp, got.fp, (long long)got.not_before);
        a->coord = got;
    }
    pthread_mutex_unlock(&a->coord_mu);
    free(ca);
    return v;
}

int dev_agent_plan_signer(dev_agent *a, const char *pem, size_t len, sl_err *err)
{
    return coord_learn(a, pem, len, 0, err) < 0 ? -1 : 0;
}

/* The coordinator certificate kept by an earlier run, if any (one that no
 * longer checks out is ignored, and replaced by the next heartbeat's). */
static void coord_load(dev_agent *a)
{
    char path[4300], *pem = NULL, *ca = NULL;
    size_t len = 0, ca_len = 0;
    sl_err err = {0};
    if (cert_path(path, sizeof path, a->o.state, COORD_CERT_FILE, &err) || !file_exists(path))
        return;
    dev_coord_seen none = {0};
    if (sl_read_file(path, 1 << 20, &pem, &len, &err) ||
        sl_read_file(a->f.ca, 1 << 20, &ca, &ca_len, &err) ||
        dev_coord_cert_judge(ca, ca_len, &none, pem, len, 0, &a->coord, &err) < 0)
        sl_log_warn("device: the coordinator certificate it kept is not used", "file=%s "
                    "reason=\"%s\"", path, err.msg);
    free(pem);
    free(ca);
}

static int enroll(dev_agent *a, sl_err *err)
{
    cert_token tok;
    if (cert_token_parse(a->o.token, &tok, err))
        return -1;
    if (!cert_valid_site(a->o.site))
        return sl_err_set(err, SL_EINVAL, "site '%s' must be 1..64 of A-Z a-z 0-9 . _ -", a->o.site);
    /* 1. Pin the CA by the token's fingerprint. */
    if (file_exists(a->f.ca)) {
        char *buf, fp[CERT_HEX_LEN];
        size_t n;
        if (sl_read_file(a->f.ca, 1u << 20, &buf, &n, err))
            return -1;
        int bad = cert_pem_fingerprint(buf, n, fp, err);
        free(buf);
        if (bad)
            return sl_err_wrap(err, "%s", a->f.ca);
        if (strcmp(fp, tok.ca_fp) != 0)
            return sl_err_set(err, SL_EAUTH,
                              "%s holds CA %s but the token pins %s: use a fresh state directory",
                              a->f.ca, fp, tok.ca_fp);
    } else if (cert_fetch_ca(a->o.coordinator, tok.ca_fp, a->f.ca, a->o.timeout_ms, err)) {
        return -1;
    }
    /* 2. Our own key, made here. */
    if (!file_exists(a->f.key) && cert_key_generate(a->f.key, err))
        return -1;
    if (cert_key_device_id(a->f.key, a->id, err))
        return -1;
    uint8_t *csr = NULL;
    size_t csr_len = 0;
    if (cert_csr_create(a->f.key, a->id, &csr, &csr_len, err))
        return -1;
    /* 3. Enroll over server-authenticated TLS. */
    rpc_channel *ch = connect_as(a, 0, err);
    if (!ch) {
        free(csr);
        return -1;
    }
    char host[256] = "";
    if (a->o.name)
        snprintf(host, sizeof host, "%s", a->o.name);
    else
        gethostname(host, sizeof host - 1);
    Skyloom__V1__DeviceProfile prof;
    dev_profile_to_pb(&a->profile, &prof);
    Skyloom__V1__EnrollRequest req = SKYLOOM__V1__ENROLL_REQUEST__INIT;
    req.token = tok.secret;
    req.csr_der.data = csr;
    req.csr_der.len = csr_len;
    req.site = (char *)a->o.site;
    req.name = host;
    req.profile = a->have_profile ? &prof : NULL;
    rpc_status st = {0};
    rpc_buf in, out = {0};
    rpc_pack(&req, &in);
    int code = rpc_call_unary(ch, RPC_M_ENROLL, in.data, in.len, a->o.timeout_ms, &out, &st);
    rpc_buf_free(&in);
    rpc_channel_destroy(ch);
    free(csr);
    if (code != RPC_OK)
        return sl_err_set(err, code == RPC_UNAVAILABLE ? SL_EIO : SL_EAUTH,
                          "Enroll refused: %s: %s", rpc_code_name(code), st.details);
    char *pem = NULL;
    size_t pem_len = 0;
    unsigned hb = 0;
    int rc = dev_enroll_reply_check(out.data, out.len, a->id, &hb, &pem, &pem_len, err);
    rpc_buf_free(&out);
    if (rc == 0 && (rc = cert_write_new(a->f.crt, pem, pem_len, 0644, err)) == 0 &&
        (rc = load_identity(a, err)) != 0)
        unlink(a->f.crt);
    free(pem);
    if (rc)
        return -1;
    if (hb)
        a->heartbeat_ms = hb;
    char p[4200];
    snprintf(p, sizeof p, "%s/device.json", a->o.state);
    json_t *j = json_pack("{s:s, s:s, s:s}", "device_id", a->id, "site", a->o.site, "coordinator",
                          a->o.coordinator);
    char *s = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    rc = sl_write_file_atomic(p, s, strlen(s), err); /* never a moment without device.json */
    free(s);
    if (rc == 0)
        sl_log_info("device: enrolled", "device=%s site=%s coordinator=%s", a->id, a->o.site,
                    a->o.coordinator);
    return rc;
}

dev_agent *dev_agent_open(const dev_agent_opts *o, sl_err *err)
{
    dev_agent *a = sl_xcalloc(1, sizeof *a);
    a->o = *o;
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->coord_mu, NULL);
    if (!a->o.timeout_ms)
        a->o.timeout_ms = 10000;
    a->heartbeat_ms = 5000;
    a->lock_fd = -1;
    mode_t old;
    int r = sl_private_dir(o->state, &old, err);
    if (r < 0) {
        pthread_mutex_destroy(&a->mu);
        pthread_mutex_destroy(&a->coord_mu);
        free(a);
        return NULL;
    }
    if (r > 0)
        sl_log_warn("device: the state directory was open to group or others; made it private",
                    "dir=%s old_mode=%04o mode=0700", o->state, (unsigned)old);
    if (lock_state(o->state, &a->lock_fd, err))
        goto fail;
    if (dev_identity_files_init(&a->f, o->state, err))
        goto fail;
    sl_err perr = {0};
    a->have_profile = dev_profile_probe(&a->profile, &perr) == 0;
    if (!a->have_profile)
        sl_log_warn("device: no profile", "reason=\"%s\"", perr.msg);
    int rec = cert_pair_recover(o->state, "device", err);
    if (rec < 0)
        goto fail;
    if (rec == 1)
        sl_log_info("device: finished storing a renewed certificate", "state=%s", o->state);
    if (!file_exists(a->f.crt)) {
        if (!o->token) {
            sl_err_set(err, SL_ESTATE, "%s is not enrolled yet: pass --token", o->state);
            goto fail;
        }
        if (enroll(a, err))
            goto fail;
    } else {
        if (o->token)
            sl_log_info("device: already enrolled, ignoring --token", "state=%s", o->state);
        if (load_identity(a, err))
            goto fail;
    }
    if (!(a->ch = connect_as(a, 1, err)))
        goto fail;
    coord_load(a);
    return a;
fail:
    dev_agent_close(a);
    return NULL;
}

void dev_agent_close(dev_agent *a)
{
    if (!a)
        return;
    rpc_channel_destroy(a->ch);
    pthread_mutex_destroy(&a->mu);
    pthread_mutex_destroy(&a->coord_mu);
    free(a->revoked);
    free(a->pingers);
    for (int i = 0; i < a->n_datasets; i++)
        free(a->datasets[i]);
    free(a->datasets);
    dev_tasks_free(a->tasks, a->n_tasks);
    if (a->lock_fd >= 0)
        close(a->lock_fd);
    free(a);
}

/* Whether id is in list (ids each followed by ' ', or NULL). */
static int id_listed(const char *list, const char *id)
{
    size_t n = strlen(id);
    for (const char *p = list; p && *p;) {
        const char *sp = strchr(p, ' ');
        if ((size_t)(sp - p) == n && !memcmp(p, id, n))
            return 1;
        p = sp + 1;
    }
    return 0;
}

/* ids as a list for id_listed: the device ids only (anything else could
 * never match one, nor split one). */
static char *id_list(char *const *ids, size_t n_ids)
{
    char *s = sl_xmalloc(n_ids * CERT_ID_LEN + 1), *p = s;
    for (size_t i = 0; i < n_ids; i++) {
        if (!cert_valid_device_id(ids[i]))
            continue;
        memcpy(p, ids[i], CERT_ID_LEN - 1);
        p[CERT_ID_LEN - 1] = ' ';
        p += CERT_ID_LEN;
    }
    *p = 0;
    return s;
}

int dev_agent_is_revoked(void *agent, const char *id)
{
    dev_agent *a = agent;
    pthread_mutex_lock(&a->mu);
    int found = id_listed(a->revoked, id);
    pthread_mutex_unlock(&a->mu);
    return found;
}

int dev_agent_may_ping(void *agent, const char *id, rpc_status *st)
{
    dev_agent *a = agent;
    pthread_mutex_lock(&a->mu);
    int found = id_listed(a->pingers, id);
    pthread_mutex_unlock(&a->mu);
    if (found)
        return RPC_OK;
    /* the coordinator names a pinger in this device's next heartbeat reply
     * after it gave the pinger its task: the pinger asks again */
    return rpc_status_set(st, RPC_FAILED_PRECONDITION, "device %s is not measuring its link to "
                          "this device for a job (yet)", id);
}

const char *dev_agent_id(const dev_agent *a) { return a->id; }
unsigned dev_agent_heartbeat_ms(const dev_agent *a) { return a->heartbeat_ms; }

void dev_agent_set_stage_address(dev_agent *a, const char *host_port)
{
    snprintf(a->stage_address, sizeof a->stage_address, "%s", host_port ? host_port : "");
}

void dev_agent_cert_times(const dev_agent *a, int64_t *not_before, int64_t *not_after,
                          int64_t *renew_at)
{
    *not_before = a->not_before;
    *not_after = a->not_after;
    *renew_at = a->renew_at;
}

int dev_agent_renew(dev_agent *a, rpc_status *st)
{
    sl_err err = {0};
    char knext[4300];
    uint8_t *csr = NULL;
    size_t csr_len = 0;
    if (cert_pair_new_key(a->o.state, "device", knext, sizeof knext, &err) ||
        cert_csr_create(knext, a->id, &csr, &csr_len, &err))
        return rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    Skyloom__V1__RenewRequest req = SKYLOOM__V1__RENEW_REQUEST__INIT;
    req.device_id = a->id;
    req.csr_der.data = csr;
    req.csr_der.len = csr_len;
    Skyloom__V1__RenewResponse *resp = NULL;
    int code = rpc_call_pb(a->ch, RPC_M_RENEW, &req, &skyloom__v1__renew_response__descriptor,
                           (void **)&resp, a->o.timeout_ms, st);
    free(csr);
    if (code != RPC_OK) {
        unlink(knext);
        return code;
    }
    int64_t nb, na;
    rpc_channel *ch = NULL;
    const char *pem = (const char *)resp->cert_pem.data;
    size_t n = resp->cert_pem.len;
    if (cert_pem_check(pem, n, a->f.ca, knext, a->id, &nb, &na, &err) ||
        cert_pair_commit(a->o.state, "device", pem, n, &err) || !(ch = connect_as(a, 1, &err))) {
        code = rpc_status_set(st, RPC_INTERNAL, "storing the renewed certificate: %s", err.msg);
    } else {
        /* from now on every connection presents the new certificate */
        rpc_channel_destroy(a->ch);
        a->ch = ch;
        a->not_before = nb;
        a->not_after = na;
        a->renew_at = nb + (na - nb) * 2 / 3;
        sl_log_info("device: certificate renewed", "device=%s not_after=%lld renew_at=%lld",
                    a->id, (long long)na, (long long)a->renew_at);
    }
    rpc_unpacked_free(resp);
    if (code != RPC_OK)
        cert_pair_recover(a->o.state, "device", NULL);
    return code;
}

/* The reply's tasks, replacing the previous reply's; ones with fields
 * out of shape are dropped. */
static void keep_tasks(dev_agent *a, Skyloom__V1__Task **t, size_t n)
{
    dev_tasks_free(a->tasks, a->n_tasks);
    a->tasks = sl_xcalloc(n + 1, sizeof *a->tasks);
    a->n_tasks = 0;
    for (size_t i = 0; i < n && i < 256; i++) {
        if (strlen(t[i]->job_id) >= sizeof a->tasks[0].job ||
            strlen(t[i]->kind) >= sizeof a->tasks[0].kind || strlen(t[i]->spec) > (4u << 20))
            continue;
        dev_task *d = &a->tasks[a->n_tasks++];
        snprintf(d->job, sizeof d->job, "%s", t[i]->job_id);
        snprintf(d->kind, sizeof d->kind, "%s", t[i]->kind);
        d->epoch = t[i]->epoch;
        d->spec = sl_xstrdup(t[i]->spec);
    }
}

int dev_enroll_reply_check(const uint8_t *reply, size_t len, const char *want_id,
                           unsigned *heartbeat_ms, char **cert_pem, size_t *cert_len, sl_err *err)
{
    *cert_pem = NULL;
    *cert_len = 0;
    *heartbeat_ms = 0;
    Skyloom__V1__EnrollResponse *r =
        rpc_unpack(&skyloom__v1__enroll_response__descriptor, reply, len);
    if (!r)
        return sl_err_set(err, SL_ECORRUPT, "malformed reply to Enroll");
    int rc = -1;
    char cn[128];
    if (strcmp(r->device_id, want_id) != 0) {
        sl_err_set(err, SL_EAUTH, "coordinator returned device id '%.40s', expected %s",
                   r->device_id, want_id);
    } else if (!r->cert_pem.len || memchr(r->cert_pem.data, 0, r->cert_pem.len)) {
        sl_err_set(err, SL_ECORRUPT, "the coordinator's reply holds no certificate");
    } else if (cert_pem_cn((const char *)r->cert_pem.data, r->cert_pem.len, cn, sizeof cn, err)) {
        sl_err_wrap(err, "the certificate in the coordinator's reply");
    } else if (strcmp(cn, want_id) != 0) {
        sl_err_set(err, SL_EAUTH, "the certificate is for '%.40s', not for %s", cn, want_id);
    } else {
        *cert_pem = sl_xmalloc(r->cert_pem.len);
        memcpy(*cert_pem, r->cert_pem.data, r->cert_pem.len);
        *cert_len = r->cert_pem.len;
        if (r->heartbeat_ms >= DEV_HEARTBEAT_MIN_MS && r->heartbeat_ms <= DEV_HEARTBEAT_MAX_MS)
            *heartbeat_ms = r->heartbeat_ms;
        rc = 0;
    }
    rpc_unpacked_free(r);
    return rc;
}

int dev_heartbeat_reply_parse(const uint8_t *reply, size_t len, unsigned *heartbeat_ms,
                              char **revoked, sl_err *err)
{
    *heartbeat_ms = 0;
    *revoked = NULL;
    Skyloom__V1__HeartbeatResponse *r =
        rpc_unpack(&skyloom__v1__heartbeat_response__descriptor, reply, len);
    if (!r)
        return sl_err_set(err, SL_ECORRUPT, "malformed reply to Heartbeat");
    if (r->heartbeat_ms >= DEV_HEARTBEAT_MIN_MS && r->heartbeat_ms <= DEV_HEARTBEAT_MAX_MS)
        *heartbeat_ms = r->heartbeat_ms;
    char *s = id_list(r->revoked, r->n_revoked);
    *revoked = s;
    rpc_unpacked_free(r);
    return 0;
}

int dev_agent_heartbeat(dev_agent *a, rpc_status *st)
{
    int64_t now = sl_unix_time();
    if (now >= a->not_after)
        return rpc_status_set(st, RPC_UNAUTHENTICATED,
                              "this device's certificate expired (not after %lld, now %lld): "
                              "enroll again with a new token in a fresh state directory",
                              (long long)a->not_after, (long long)now);
    if (now >= a->renew_at) {
        int code = dev_agent_renew(a, st);
        if (code == RPC_UNAUTHENTICATED || code == RPC_PERMISSION_DENIED)
            return code;
        if (code != RPC_OK)
            sl_log_warn("device: certificate renewal failed, retrying at the next heartbeat",
                        "code=%s reason=\"%s\" not_after=%lld", rpc_code_name(code), st->details,
                        (long long)a->not_after);
    }
    Skyloom__V1__DeviceProfile prof;
    dev_profile_to_pb(&a->profile, &prof);
    Skyloom__V1__HeartbeatRequest req = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    req.device_id = a->id;
    req.seq = ++a->seq;
    req.profile = a->seq == 1 && a->have_profile ? &prof : NULL;
    req.stage_address = a->stage_address;
    req.datasets = a->datasets;
    req.n_datasets = (size_t)a->n_datasets;
    req.link_public_key.data = a->has_key ? a->link_key : NULL;
    req.link_public_key.len = a->has_key ? 32 : 0;
    req.threads = a->threads;
    req.policy = a->has_policy ? &a->policy : NULL;
    rpc_buf in, out = {0};
    rpc_pack(&req, &in);
    int code = rpc_call_unary(a->ch, RPC_M_HEARTBEAT, in.data, in.len, a->o.timeout_ms, &out, st);
    rpc_buf_free(&in);
    if (code != RPC_OK)
        return code;
    unsigned hb;
    char *revoked;
    sl_err err = {0};
    if (dev_heartbeat_reply_parse(out.data, out.len, &hb, &revoked, &err)) {
        rpc_buf_free(&out);
        return rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    }
    Skyloom__V1__HeartbeatResponse *resp =
        rpc_unpack(&skyloom__v1__heartbeat_response__descriptor, out.data, out.len);
    char *pingers = id_list(resp ? resp->pingers : NULL, resp ? resp->n_pingers : 0);
    if (resp)
        keep_tasks(a, resp->tasks, resp->n_tasks);
    if (resp && resp->coordinator_cert.len &&
        coord_learn(a, (const char *)resp->coordinator_cert.data, resp->coordinator_cert.len, 1,
                    &err) < 0)
        sl_log_warn("device: the coordinator's certificate in its heartbeat reply is not used",
                    "reason=\"%s\"", err.msg);
    rpc_unpacked_free(resp);
    rpc_buf_free(&out);
    if (hb)
        a->heartbeat_ms = hb;
    pthread_mutex_lock(&a->mu);
    free(a->revoked);
    a->revoked = revoked;
    free(a->pingers);
    a->pingers = pingers;
    pthread_mutex_unlock(&a->mu);
    return RPC_OK;
}

void dev_agent_set_job_info(dev_agent *a, const char *const *datasets, int n, const uint8_t key[32],
                            unsigned threads)
{
    for (int i = 0; i < a->n_datasets; i++)
        free(a->datasets[i]);
    free(a->datasets);
    a->datasets = sl_xcalloc((size_t)n + 1, sizeof *a->datasets);
    for (int i = 0; i < n; i++)
        a->datasets[i] = sl_xstrdup(datasets[i]);
    a->n_datasets = n;
    if (key) {
        memcpy(a->link_key, key, 32);
        a->has_key = 1;
    }
    a->threads = threads;
}

void dev_agent_set_policy(dev_agent *a, int home_layers, int allow_unsealed, int allow_labels_out)
{
    skyloom__v1__owner_policy__init(&a->policy);
    a->policy.home_layers = home_layers < 0 ? 0 : (uint32_t)home_layers;
    a->policy.allow_unsealed = allow_unsealed != 0;
    a->policy.allow_labels_out = allow_labels_out != 0;
    a->has_policy = 1;
}

void dev_tasks_free(dev_task *t, int n)
{
    for (int i = 0; i < n; i++)
        free(t[i].spec);
    free(t);
}

void dev_agent_take_tasks(dev_agent *a, dev_task **tasks, int *n)
{
    *tasks = a->tasks;
    *n = a->n_tasks;
    a->tasks = NULL;
    a->n_tasks = 0;
}

rpc_channel *dev_agent_channel_new(dev_agent *a, sl_err *err) { return connect_as(a, 1, err); }
const char *dev_agent_state_dir(const dev_agent *a) { return a->o.state; }
int dev_agent_timeout_ms(const dev_agent *a) { return a->o.timeout_ms; }

void dev_agent_poke(dev_agent *a) { a->poked = 1; }

int dev_agent_take_poke(dev_agent *a)
{
    int p = a->poked;
    a->poked = 0;
    return p;
}
