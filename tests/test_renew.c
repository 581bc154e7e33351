/* test_renew.c - certificates that last: lifetimes from the PKI and from
 * tokens, Renew (new key, same id, refused for a revoked device or the current
 * key), automatic renewal with lifetimes of seconds (heartbeats and a Stage
 * server go on past the first certificate's expiry), crash recovery of the
 * key/certificate pair, and rotating the coordinator's certificate (served to
 * new connections at once; a device enrolled before keeps working across a
 * restart). An in-process coordinator on 127.0.0.1 with a free port. */
#include <sys/stat.h>
#include <time.h>

#include "coord.h"
#include "dev_agent.h"
#include "dev_stagesvc.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_test.h"
#include "sl_time.h"
#include "trust_util.h"

#define T_MS 60000

static char root[256], pki[512], state[512], target[64];
static coord *co;

static void start_coordinator(void)
{
    coord_opts o = {.listen = "127.0.0.1:0", .pki = pki, .state = state, .heartbeat_ms = 1000};
    sl_err err = {0};
    co = coord_open(&o, &err);
    CHECKF(co != NULL, "%s", err.msg);
    int port = co ? coord_start(co, &err) : -1;
    CHECKF(port > 0, "%s", err.msg);
    if (port <= 0)
        exit(1);
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
}

static const char *newdir(const char *name)
{
    static char b[8][512];
    static int k;
    char *p = b[k++ & 7];
    snprintf(p, 512, "%s/%s", root, name);
    return p;
}

/* Enrolls a device in state dir `name` with a token naming cert_s (0: the
 * PKI's default); NULL on failure. */
static dev_agent *enroll(const char *name, int64_t cert_s)
{
    char tok[CERT_TOKEN_LEN];
    sl_err err = {0};
    CHECKF(cert_token_create_ex(pki, "lab", 3600, cert_s, tok, &err) == 0, "%s", err.msg);
    dev_agent_opts o = {.coordinator = target, .token = tok, .state = newdir(name), .site = "lab",
                        .name = name, .timeout_ms = T_MS};
    dev_agent *a = dev_agent_open(&o, &err);
    CHECKF(a != NULL, "%s: %s", name, err.msg);
    return a;
}

static dev_agent *reopen(const char *name)
{
    dev_agent_opts o = {.coordinator = target, .state = newdir(name), .site = "lab",
                        .timeout_ms = T_MS};
    sl_err err = {0};
    dev_agent *a = dev_agent_open(&o, &err);
    CHECKF(a != NULL, "%s: %s", name, err.msg);
    return a;
}

static char *slurp(const char *path)
{
    char *b = NULL;
    size_t n;
    sl_err err = {0};
    if (sl_read_file(path, 1u << 20, &b, &n, &err))
        return NULL;
    return b;
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static int hb(dev_agent *a, rpc_status *st)
{
    memset(st, 0, sizeof *st);
    return dev_agent_heartbeat(a, st);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A unary call on channel c with a packed request. */
static int call_renew(rpc_channel *c, const char *claimed, const uint8_t *csr, size_t n,
                      rpc_status *st)
{
    Skyloom__V1__RenewRequest req = SKYLOOM__V1__RENEW_REQUEST__INIT;
    req.device_id = (char *)claimed;
    req.csr_der.data = (uint8_t *)csr;
    req.csr_der.len = n;
    void *resp = NULL;
    memset(st, 0, sizeof *st);
    int code = rpc_call_pb(c, RPC_M_RENEW, &req, &skyloom__v1__renew_response__descriptor, &resp,
                           T_MS, st);
    rpc_unpacked_free(resp);
    return code;
}

static rpc_channel *channel(const char *crt, const char *key, const char *server_name)
{
    rpc_channel_opts o = {.target = target, .tls = {tu_path(pki, "ca.crt"), crt, key},
                          .server_name = server_name};
    sl_err err = {0};
    rpc_channel *c = rpc_channel_create(&o, &err);
    CHECKF(c != NULL, "%s", err.msg);
    return c;
}

static void test_lifetimes(void)
{
    sl_err err = {0};
    int64_t s;
    CHECK(cert_pki_device_seconds(pki, &s, &err) == 0 && s == 365 * 86400);
    CHECK(cert_pki_set_device_seconds(pki, 40, &err) == 0);
    CHECK(cert_pki_device_seconds(pki, &s, &err) == 0 && s == 40);
    CHECK(cert_pki_set_device_seconds(pki, 4, &err) == -1 && strstr(err.msg, "out of range"));
    int64_t nb, na, at;
    /* the PKI's default: 40 s, valid from 4 s before issue (a tenth) */
    dev_agent *a = enroll("life-default", 0);
    if (a) {
        dev_agent_cert_times(a, &nb, &na, &at);
        CHECKF(na - nb == 44, "lifetime %lld", (long long)(na - nb));
        CHECK(at == nb + 44 * 2 / 3);
        dev_agent_close(a);
    }
    /* the token's: 20 s, kept by the renewal */
    a = enroll("life-token", 20);
    if (a) {
        dev_agent_cert_times(a, &nb, &na, &at);
        CHECKF(na - nb == 22, "lifetime %lld", (long long)(na - nb));
        rpc_status st;
        CHECKF(dev_agent_renew(a, &st) == RPC_OK, "%s", st.details);
        dev_agent_cert_times(a, &nb, &na, &at);
        CHECKF(na - nb == 22, "renewed lifetime %lld", (long long)(na - nb));
        dev_agent_close(a);
    }
    char tok[CERT_TOKEN_LEN];
    CHECK(cert_token_create_ex(pki, "lab", 60, 4, tok, &err) == -1);
    CHECK(cert_pki_set_device_seconds(pki, 365 * 86400, &err) == 0);
}

static void test_renew_now(void)
{
    dev_agent *a = enroll("renew", 0);
    if (!a)
        return;
    const char *d = newdir("renew");
    char id[CERT_ID_LEN], key_id[CERT_ID_LEN], key_id2[CERT_ID_LEN];
    snprintf(id, sizeof id, "%s", dev_agent_id(a));
    sl_err err = {0};
    CHECK(cert_key_device_id(tu_path(d, "device.key"), key_id, &err) == 0 && !strcmp(key_id, id));
    char *old = slurp(tu_path(d, "device.crt"));
    rpc_status st;
    CHECKF(dev_agent_renew(a, &st) == RPC_OK, "%s", st.details);
    char *cur = slurp(tu_path(d, "device.crt"));
    CHECK(old && cur && strcmp(old, cur) != 0);
    /* a new key made here, the same id */
    CHECK(cert_key_device_id(tu_path(d, "device.key"), key_id2, &err) == 0 && strcmp(key_id2, id));
    CHECK(!strcmp(dev_agent_id(a), id));
    char cn[64];
    CHECK(cert_file_cn(tu_path(d, "device.crt"), cn, sizeof cn, &err) == 0 && !strcmp(cn, id));
    CHECK(cur && cert_pem_check(cur, strlen(cur), tu_path(d, "ca.crt"), tu_path(d, "device.key"), id,
                                NULL, NULL, &err) == 0);
    struct stat sb;
    CHECK(stat(tu_path(d, "device.key"), &sb) == 0 && (sb.st_mode & 0777) == 0600);
    CHECK(!exists(tu_path(d, "device.key.next")) && !exists(tu_path(d, "device.crt.next")));
    /* used from the next call, and by the next start */
    CHECKF(hb(a, &st) == RPC_OK, "%s", st.details);
    dev_agent_close(a);
    a = reopen("renew");
    if (a) {
        CHECK(!strcmp(dev_agent_id(a), id));
        CHECKF(hb(a, &st) == RPC_OK, "%s", st.details);
        dev_agent_close(a);
    }
    free(old);
    free(cur);
}

static void test_renew_refusals(void)
{
    dev_agent *a = enroll("refuse", 0), *b = enroll("refuse-b", 0);
    if (!a || !b) {
        dev_agent_close(a);
        dev_agent_close(b);
        return;
    }
    const char *d = newdir("refuse");
    char id[CERT_ID_LEN], idb[CERT_ID_LEN];
    snprintf(id, sizeof id, "%s", dev_agent_id(a));
    snprintf(idb, sizeof idb, "%s", dev_agent_id(b));
    sl_err err = {0};
    uint8_t *csr = NULL, *csr2 = NULL;
    size_t n = 0, n2 = 0;
    rpc_status st;
    rpc_channel *c = channel(tu_path(d, "device.crt"), tu_path(d, "device.key"), NULL);
    /* the current key again */
    CHECK(cert_csr_create(tu_path(d, "device.key"), id, &csr, &n, &err) == 0);
    CHECK(call_renew(c, id, csr, n, &st) == RPC_INVALID_ARGUMENT);
    CHECKF(strstr(st.details, "a renewal needs a new key"), "%s", st.details);
    /* a new key, but claiming another device */
    char kp[600];
    snprintf(kp, sizeof kp, "%s/other.key", root);
    CHECK(cert_key_generate(kp, &err) == 0 && cert_csr_create(kp, idb, &csr2, &n2, &err) == 0);
    CHECK(call_renew(c, idb, csr2, n2, &st) == RPC_PERMISSION_DENIED);
    CHECKF(strstr(st.details, "but the request claims device"), "%s", st.details);
    /* garbage */
    CHECK(call_renew(c, id, (const uint8_t *)"nope", 4, &st) == RPC_INVALID_ARGUMENT);
    CHECKF(strstr(st.details, "CSR refused"), "%s", st.details);
    rpc_buf resp = {0};
    CHECK(rpc_call_unary(c, RPC_M_RENEW, "\xff\xff", 2, T_MS, &resp, &st) == RPC_INVALID_ARGUMENT);
    CHECKF(strstr(st.details, "malformed RenewRequest"), "%s", st.details);
    rpc_buf_free(&resp);
    rpc_channel_destroy(c);
    /* the admin, and no certificate */
    c = channel(tu_path(pki, "admin.crt"), tu_path(pki, "admin.key"), NULL);
    CHECK(call_renew(c, "", csr2, n2, &st) == RPC_PERMISSION_DENIED);
    rpc_channel_destroy(c);
    c = channel(NULL, NULL, NULL);
    CHECK(call_renew(c, id, csr2, n2, &st) == RPC_UNAUTHENTICATED);
    rpc_channel_destroy(c);
    /* a revoked device cannot renew, and keeps its files as they were */
    char *before = slurp(tu_path(d, "device.crt"));
    CHECK(cert_revoke(pki, id, &err) == 0);
    CHECK(dev_agent_renew(a, &st) == RPC_UNAUTHENTICATED);
    CHECKF(strstr(st.details, "is revoked"), "%s", st.details);
    char *after = slurp(tu_path(d, "device.crt"));
    CHECK(before && after && !strcmp(before, after));
    CHECK(!exists(tu_path(d, "device.key.next")) && !exists(tu_path(d, "device.crt.next")));
    CHECK(hb(a, &st) == RPC_UNAUTHENTICATED);
    /* the other device is not affected */
    CHECKF(dev_agent_renew(b, &st) == RPC_OK, "%s", st.details);
    free(before);
    free(after);
    free(csr);
    free(csr2);
    dev_agent_close(a);
    dev_agent_close(b);
}

/* Lifetimes of seconds: a device renews on its own, again and again; its
 * heartbeats and its Stage server go on after the first certificate expired
 * (which TLS then refuses); a device that did not heartbeat in time is told
 * its certificate expired. */
static void test_automatic_renewal(void)
{
    dev_agent *a = enroll("auto", 6), *b = enroll("auto-neighbour", 0), *late = enroll("late", 5);
    if (!a || !b || !late) {
        dev_agent_close(a);
        dev_agent_close(b);
        dev_agent_close(late);
        return;
    }
    const char *d = newdir("auto");
    char id[CERT_ID_LEN];
    snprintf(id, sizeof id, "%s", dev_agent_id(a));
    /* the first pair, kept aside */
    char first_crt[600], first_key[600];
    snprintf(first_crt, sizeof first_crt, "%s/first.crt", root);
    snprintf(first_key, sizeof first_key, "%s/first.key", root);
    char *pc = slurp(tu_path(d, "device.crt")), *pk = slurp(tu_path(d, "device.key"));
    sl_err err = {0};
    CHECK(pc && pk && sl_write_file_atomic(first_crt, pc, strlen(pc), &err) == 0 &&
          sl_write_file_atomic(first_key, pk, strlen(pk), &err) == 0);
    free(pc);
    free(pk);
    dev_stagesvc_opts so = {.listen = "127.0.0.1:0", .state = d};
    int port = 0;
    dev_stagesvc *stage = dev_stagesvc_start(&so, &port, &err);
    CHECKF(stage != NULL, "%s", err.msg);
    int64_t nb, first_na, na, at, last_na;
    dev_agent_cert_times(a, &nb, &first_na, &at);
    last_na = first_na;
    int renewals = 0, failures = 0;
    rpc_status st;
    /* heartbeat every 200 ms until the first certificate is 2 s past its
     * end and two renewals happened (deadline 40 s) */
    int64_t deadline = sl_unix_time() + 40;
    while (sl_unix_time() < deadline && (renewals < 2 || sl_unix_time() <= first_na + 2)) {
        if (hb(a, &st) != RPC_OK && failures++ < 3)
            fprintf(stderr, "heartbeat: %s: %s\n", rpc_code_name(st.code), st.details);
        dev_agent_cert_times(a, &nb, &na, &at);
        if (na != last_na) {
            CHECKF(sl_unix_time() < last_na, "renewed at %lld, after the end %lld",
                   (long long)sl_unix_time(), (long long)last_na);
            renewals++;
            last_na = na;
        }
        sleep_ms(200);
    }
    CHECKF(failures == 0, "%d heartbeats failed", failures);
    CHECKF(renewals >= 2, "%d renewals", renewals);
    CHECK(sl_unix_time() > first_na);
    /* TLS refuses the first certificate now ... */
    rpc_channel *c = channel(first_crt, first_key, NULL);
    Skyloom__V1__HeartbeatRequest req = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    req.device_id = id;
    void *resp = NULL;
    CHECK(rpc_call_pb(c, RPC_M_HEARTBEAT, &req, &skyloom__v1__heartbeat_response__descriptor,
                      &resp, T_MS, &st) == RPC_UNAVAILABLE);
    rpc_unpacked_free(resp);
    rpc_channel_destroy(c);
    /* ... so the Stage server that a neighbour reaches now serves the renewed one */
    if (stage) {
        char t[64];
        snprintf(t, sizeof t, "127.0.0.1:%d", port);
        c = dev_stagesvc_connect(newdir("auto-neighbour"), t, id, 0, &err);
        CHECK(c && dev_stagesvc_ping(c, dev_agent_id(b), "ping", 4, T_MS, &st) == RPC_OK);
        rpc_channel_destroy(c);
        /* and the device, as a client, presents its renewed certificate */
        dev_stagesvc_opts sb = {.listen = "127.0.0.1:0", .state = newdir("auto-neighbour")};
        int pb = 0;
        dev_stagesvc *sbv = dev_stagesvc_start(&sb, &pb, &err);
        snprintf(t, sizeof t, "127.0.0.1:%d", pb);
        c = sbv ? dev_stagesvc_connect(d, t, dev_agent_id(b), 0, &err) : NULL;
        CHECK(c && dev_stagesvc_ping(c, id, "ping", 4, T_MS, &st) == RPC_OK);
        rpc_channel_destroy(c);
        dev_stagesvc_stop(sbv);
    }
    dev_stagesvc_stop(stage);
    /* the device that slept through its certificate's lifetime */
    CHECK(hb(late, &st) == RPC_UNAUTHENTICATED);
    CHECKF(strstr(st.details, "certificate expired"), "%s", st.details);
    dev_agent_close(a);
    dev_agent_close(b);
    dev_agent_close(late);
}

/* A crash while the new pair replaces the old: before the certificate was
 * stored the new key is dropped; after, the replacement is finished. */
static void test_recovery(void)
{
    dev_agent *a = enroll("crash", 0);
    if (!a)
        return;
    const char *d = newdir("crash");
    char id[CERT_ID_LEN], kid[CERT_ID_LEN];
    snprintf(id, sizeof id, "%s", dev_agent_id(a));
    dev_agent_close(a);
    sl_err err = {0};
    char kn[600];
    rpc_status st;
    /* 1. the new key only */
    char *crt0 = slurp(tu_path(d, "device.crt"));
    CHECK(cert_pair_new_key(d, "device", kn, sizeof kn, &err) == 0 && exists(kn));
    a = reopen("crash");
    CHECK(!exists(kn));
    char *crt1 = slurp(tu_path(d, "device.crt"));
    CHECK(crt0 && crt1 && !strcmp(crt0, crt1));
    if (a) {
        CHECKF(hb(a, &st) == RPC_OK, "%s", st.details);
        dev_agent_close(a);
    }
    /* 2. a complete new pair, not yet renamed; 3. the key renamed already */
    for (int k = 0; k < 2; k++) {
        cert_ca *ca = cert_ca_load(pki, &err);
        uint8_t *csr = NULL;
        size_t n = 0;
        char *pem = NULL, got[CERT_ID_LEN];
        CHECK(ca && cert_pair_new_key(d, "device", kn, sizeof kn, &err) == 0 &&
              cert_csr_create(kn, id, &csr, &n, &err) == 0 &&
              cert_ca_issue(ca, csr, n, "lab", 3600, id, NULL, got, &pem, &err) == 0);
        char cn[600];
        snprintf(cn, sizeof cn, "%s/device.crt.next", d);
        CHECK(pem && sl_write_file_atomic(cn, pem, strlen(pem), &err) == 0);
        if (k == 1)
            CHECK(rename(kn, tu_path(d, "device.key")) == 0);
        a = reopen("crash");
        char *now = slurp(tu_path(d, "device.crt"));
        CHECK(now && pem && !strcmp(now, pem));
        CHECK(!exists(cn) && !exists(kn));
        CHECK(cert_key_device_id(tu_path(d, "device.key"), kid, &err) == 0 && strcmp(kid, id));
        if (a) {
            CHECK(!strcmp(dev_agent_id(a), id));
            CHECKF(hb(a, &st) == RPC_OK, "%s", st.details);
            dev_agent_close(a);
        }
        free(now);
        free(pem);
        free(csr);
        cert_ca_free(ca);
    }
    free(crt0);
    free(crt1);
}

static void fingerprint(const char *path, char fp[CERT_HEX_LEN])
{
    char *p = slurp(path);
    sl_err err = {0};
    fp[0] = 0;
    CHECK(p && cert_pem_fingerprint(p, strlen(p), fp, &err) == 0);
    free(p);
}

static int heartbeat_on(rpc_channel *c, const char *id)
{
    Skyloom__V1__HeartbeatRequest req = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    req.device_id = (char *)id;
    void *resp = NULL;
    rpc_status st;
    int code = rpc_call_pb(c, RPC_M_HEARTBEAT, &req, &skyloom__v1__heartbeat_response__descriptor,
                           &resp, T_MS, &st);
    rpc_unpacked_free(resp);
    return code;
}

static void test_rotate_coordinator(void)
{
    dev_agent *a = enroll("rot", 0);
    if (!a)
        return;
    const char *d = newdir("rot");
    char id[CERT_ID_LEN];
    snprintf(id, sizeof id, "%s", dev_agent_id(a));
    char fp0[CERT_HEX_LEN], fp1[CERT_HEX_LEN], fp2[CERT_HEX_LEN], ca0[CERT_HEX_LEN], ca1[CERT_HEX_LEN];
    fingerprint(tu_path(pki, "coordinator.crt"), fp0);
    fingerprint(tu_path(pki, "ca.crt"), ca0);
    rpc_channel *named = channel(tu_path(d, "device.crt"), tu_path(d, "device.key"), "coord2.example");
    CHECK(heartbeat_on(named, id) == RPC_UNAVAILABLE); /* not a name of the certificate yet */
    rpc_channel_destroy(named);
    sl_err err = {0};
    CHECKF(cert_pki_rotate_coordinator(pki, "DNS:coord2.example", 30, &err) == 0, "%s", err.msg);
    fingerprint(tu_path(pki, "coordinator.crt"), fp1);
    fingerprint(tu_path(pki, "ca.crt"), ca1);
    CHECK(strcmp(fp0, fp1) != 0 && !strcmp(ca0, ca1));
    fingerprint(tu_path(pki, "coordinator.crt.prev"), fp2);
    CHECK(!strcmp(fp2, fp0));
    char *pem = slurp(tu_path(pki, "coordinator.crt"));
    char cn[64];
    CHECK(cert_file_cn(tu_path(pki, "coordinator.crt.prev"), cn, sizeof cn, &err) == 0);
    CHECK(pem && cert_pem_check(pem, strlen(pem), tu_path(pki, "ca.crt"),
                                tu_path(pki, "coordinator.key"), cn, NULL, NULL, &err) == 0);
    free(pem);
    /* the running coordinator serves the new certificate to new connections */
    int code = -1;
    for (int64_t end = sl_unix_time() + 15; code != RPC_OK && sl_unix_time() < end;) {
        named = channel(tu_path(d, "device.crt"), tu_path(d, "device.key"), "coord2.example");
        code = heartbeat_on(named, id);
        rpc_channel_destroy(named);
        if (code != RPC_OK)
            sleep_ms(200);
    }
    CHECKF(code == RPC_OK, "the new name is not served: %s", rpc_code_name(code));
    rpc_status st;
    CHECKF(hb(a, &st) == RPC_OK, "%s", st.details);
    dev_agent_close(a);
    /* a restart with it; the device enrolled before the rotation goes on */
    coord_close(co);
    start_coordinator();
    a = reopen("rot");
    if (a) {
        CHECKF(hb(a, &st) == RPC_OK, "%s", st.details);
        dev_agent_close(a);
    }
    /* rotating again keeps the names of the certificate it replaces */
    CHECKF(cert_pki_rotate_coordinator(pki, NULL, 30, &err) == 0, "%s", err.msg);
    coord_close(co);
    start_coordinator();
    named = channel(tu_path(d, "device.crt"), tu_path(d, "device.key"), "coord2.example");
    CHECK(heartbeat_on(named, id) == RPC_OK);
    rpc_channel_destroy(named);
    /* bad arguments */
    CHECK(cert_pki_rotate_coordinator(pki, "FOO:x", 30, &err) == -1);
    CHECK(cert_pki_rotate_coordinator(pki, NULL, 0, &err) == -1);
    CHECK(cert_pki_rotate_coordinator(newdir("nopki"), NULL, 30, &err) == -1);
}

/* The coordinator finishes a rotation a crash interrupted when it starts. */
static void test_rotation_recovery(void)
{
    sl_err err = {0};
    char fp0[CERT_HEX_LEN], fp1[CERT_HEX_LEN];
    coord_close(co);
    co = NULL;
    /* rotate into the .next files only, as a crash before the renames leaves them */
    CHECK(cert_pki_rotate_coordinator(pki, NULL, 30, &err) == 0);
    fingerprint(tu_path(pki, "coordinator.crt"), fp0);
    CHECK(rename(tu_path(pki, "coordinator.crt"), tu_path(pki, "coordinator.crt.next")) == 0);
    CHECK(rename(tu_path(pki, "coordinator.crt.prev"), tu_path(pki, "coordinator.crt")) == 0);
    start_coordinator();
    fingerprint(tu_path(pki, "coordinator.crt"), fp1);
    CHECK(!strcmp(fp0, fp1));
    CHECK(!exists(tu_path(pki, "coordinator.crt.next")));
    dev_agent *a = reopen("rot");
    rpc_status st;
    if (a) {
        CHECKF(hb(a, &st) == RPC_OK, "%s", st.details);
        dev_agent_close(a);
    }
}

/* Malformed lifetimes in the PKI: a spool entry goes to .bad, a default the
 * coordinator cannot read stops it with the reason. */
static void test_bad_lifetimes(void)
{
    char p[700];
    snprintf(p, sizeof p, "%s/spool/token-%064d", pki, 7);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) {
        fprintf(f, "lab 4000000000 3\n");
        fclose(f);
    }
    rpc_status st;
    dev_agent *a = reopen("rot"); /* any authorized call imports the spool */
    if (a) {
        CHECK(hb(a, &st) == RPC_OK);
        dev_agent_close(a);
    }
    char bad[720];
    snprintf(bad, sizeof bad, "%s.bad", p);
    CHECK(exists(bad) && !exists(p));
    sl_err err = {0};
    snprintf(p, sizeof p, "%s/device-cert-seconds", pki);
    CHECK(sl_write_file_atomic(p, "soon\n", 5, &err) == 0);
    coord_opts o = {.listen = "127.0.0.1:0", .pki = pki, .state = state};
    coord *c = coord_open(&o, &err);
    CHECK(c == NULL && strstr(err.msg, "device-cert-seconds: not a lifetime in seconds"));
    coord_close(c);
    unlink(p);
}

int main(void)
{
    sl_log_set_level(SL_LOG_ERROR);
    tu_tmpdir(root, sizeof root, "renew");
    tu_pki(root, "renew", pki, sizeof pki);
    snprintf(state, sizeof state, "%s/state", root);
    rpc_global_init();
    start_coordinator();
    RUN(test_lifetimes);
    RUN(test_renew_now);
    RUN(test_renew_refusals);
    RUN(test_automatic_renewal);
    RUN(test_recovery);
    RUN(test_rotate_coordinator);
    RUN(test_rotation_recovery);
    RUN(test_bad_lifetimes);
    coord_close(co);
    rpc_global_shutdown();
    tu_rmtree(root);
    return sl_test_done();
}
