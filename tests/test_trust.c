/* test_trust.c - the security matrix of enrollment and the registry, each
 * case asserting the exact refusal (code and reason), against an
 * in-process coordinator on 127.0.0.1 with a free port. */
#include "coord.h"
#include "dev_agent.h"
#include "dev_stagesvc.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_log.h"
#include "sl_test.h"
#include "trust_util.h"

/* Deadline of every call: generous, so that slow runs (valgrind, loaded
 * machines) fail on what they check, not on time. */
#define T_MS 60000

static char root[256], pki[512], other[512], state[512], target[64];
static coord *co;

static void start_coordinator(void)
{
    coord_opts o = {.listen = "127.0.0.1:0", .pki = pki, .state = state, .heartbeat_ms = 60000};
    sl_err err = {0};
    co = coord_open(&o, &err);
    CHECKF(co != NULL, "%s", err.msg);
    int port = co ? coord_start(co, &err) : -1;
    CHECKF(port > 0, "%s", err.msg);
    if (port <= 0)
        exit(1);
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
}

static const char *token(const char *dir, const char *site, int64_t ttl)
{
    static char t[4][CERT_TOKEN_LEN];
    static int k;
    char *out = t[k++ & 3];
    sl_err err = {0};
    CHECKF(cert_token_create(dir, site, ttl, out, &err) == 0, "%s", err.msg);
    return out;
}

static const char *newdir(const char *name)
{
    static char b[8][512];
    static int k;
    char *p = b[k++ & 7];
    snprintf(p, 512, "%s/%s", root, name);
    return p;
}

/* Enrolls a device in state dir `name`; NULL on refusal (reason in err). */
static dev_agent *enroll(const char *name, const char *tok, const char *site, sl_err *err)
{
    dev_agent_opts o = {.coordinator = target, .token = tok, .state = newdir(name), .site = site,
                        .name = name, .timeout_ms = T_MS};
    memset(err, 0, sizeof *err);
    return dev_agent_open(&o, err);
}

/* A channel with the given files (cert/key may be NULL). */
static rpc_channel *channel(const char *ca, const char *crt, const char *key)
{
    rpc_channel_opts o = {.target = target, .tls = {ca, crt, key}};
    sl_err err = {0};
    rpc_channel *c = rpc_channel_create(&o, &err);
    CHECKF(c != NULL, "%s", err.msg);
    return c;
}

static int heartbeat_as(rpc_channel *c, const char *claimed, rpc_status *st)
{
    Skyloom__V1__HeartbeatRequest req = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    req.device_id = (char *)claimed;
    req.seq = 1;
    void *resp = NULL;
    int code = rpc_call_pb(c, RPC_M_HEARTBEAT, &req, &skyloom__v1__heartbeat_response__descriptor,
                           &resp, T_MS, st);
    rpc_unpacked_free(resp);
    return code;
}

static Skyloom__V1__ListDevicesResponse *list_as_admin(const char *pkidir, int *code)
{
    rpc_channel *c = channel(tu_path(pki, "ca.crt"), tu_path(pkidir, "admin.crt"),
                             tu_path(pkidir, "admin.key"));
    Skyloom__V1__ListDevicesRequest req = SKYLOOM__V1__LIST_DEVICES_REQUEST__INIT;
    void *resp = NULL;
    rpc_status st;
    *code = rpc_call_pb(c, RPC_M_LIST_DEVICES, &req, &skyloom__v1__list_devices_response__descriptor,
                        &resp, T_MS, &st);
    rpc_channel_destroy(c);
    return resp;
}

static const char *state_of(Skyloom__V1__ListDevicesResponse *r, const char *id)
{
    for (size_t i = 0; r && i < r->n_devices; i++)
        if (!strcmp(r->devices[i]->device_id, id))
            return r->devices[i]->state;
    return "absent";
}

static char id1[CERT_ID_LEN], id2[CERT_ID_LEN];

static void test_enroll_and_heartbeat(void)
{
    sl_err err;
    dev_agent *a = enroll("dev1", token(pki, "lab", 3600), "lab", &err);
    CHECKF(a != NULL, "%s", err.msg);
    if (!a)
        return;
    snprintf(id1, sizeof id1, "%s", dev_agent_id(a));
    CHECK(cert_valid_device_id(id1));
    rpc_status st;
    CHECK(dev_agent_heartbeat(a, &st) == RPC_OK);
    CHECK(dev_agent_heartbeat_ms(a) == 60000);
    dev_agent_close(a);
    /* the private key never left: 0600 in the device's state */
    struct stat sb;
    CHECK(stat(tu_path(newdir("dev1"), "device.key"), &sb) == 0 && (sb.st_mode & 0777) == 0600);
    /* a restart without a token uses the stored certificate */
    a = enroll("dev1", NULL, "lab", &err);
    CHECKF(a != NULL, "%s", err.msg);
    CHECK(a && !strcmp(dev_agent_id(a), id1));
    CHECK(a && dev_agent_heartbeat(a, &st) == RPC_OK);
    dev_agent_close(a);
    int code;
    Skyloom__V1__ListDevicesResponse *r = list_as_admin(pki, &code);
    CHECK(code == RPC_OK && r && r->n_devices == 1);
    CHECK(!strcmp(state_of(r, id1), "online"));
    CHECK(r && r->n_devices == 1 && r->devices[0]->profile && r->devices[0]->profile->cores > 0);
    CHECK(r && r->n_devices == 1 && !strcmp(r->devices[0]->site, "lab"));
    rpc_unpacked_free(r);
    /* a second device for the cases below */
    a = enroll("dev2", token(pki, "lab", 3600), "lab", &err);
    CHECKF(a != NULL, "%s", err.msg);
    if (a)
        snprintf(id2, sizeof id2, "%s", dev_agent_id(a));
    dev_agent_close(a);
}

static void test_token_refusals(void)
{
    sl_err err;
    /* reused token */
    const char *t = token(pki, "lab", 3600);
    dev_agent *a = enroll("reuse1", t, "lab", &err);
    CHECKF(a != NULL, "%s", err.msg);
    dev_agent_close(a);
    CHECK(enroll("reuse2", t, "lab", &err) == NULL);
    CHECKF(!strcmp(err.msg, "Enroll refused: UNAUTHENTICATED: enrollment token already used"), "%s",
           err.msg);
    /* expired token */
    CHECK(enroll("expired", token(pki, "lab", -5), "lab", &err) == NULL);
    CHECKF(!strcmp(err.msg, "Enroll refused: UNAUTHENTICATED: enrollment token expired"), "%s",
           err.msg);
    /* token for another site */
    CHECK(enroll("site", token(pki, "lab", 3600), "elsewhere", &err) == NULL);
    CHECKF(strstr(err.msg, "PERMISSION_DENIED: token was issued for site 'lab', not 'elsewhere'"),
           "%s", err.msg);
    /* a token that was never issued (right CA fingerprint, made-up secret) */
    char fake[CERT_TOKEN_LEN];
    cert_token tk;
    CHECK(cert_token_parse(token(pki, "lab", 3600), &tk, NULL) == 0);
    snprintf(fake, sizeof fake, "skyloom1.%s.%064d", tk.ca_fp, 7);
    CHECK(enroll("fake", fake, "lab", &err) == NULL);
    CHECKF(!strcmp(err.msg, "Enroll refused: UNAUTHENTICATED: unknown enrollment token"), "%s",
           err.msg);
    /* token of another CA: the device refuses before sending anything */
    CHECK(enroll("otherca", token(other, "lab", 3600), "lab", &err) == NULL);
    CHECK(err.code == SL_EAUTH);
    CHECKF(strstr(err.msg, "CA fingerprint mismatch") != NULL, "%s", err.msg);
    CHECK(access(tu_path(newdir("otherca"), "ca.crt"), F_OK) != 0);
    /* malformed token */
    CHECK(enroll("bad", "skyloom1.xyz", "lab", &err) == NULL && err.code == SL_EINVAL);
}

static void test_call_refusals(void)
{
    rpc_status st;
    /* no client certificate */
    rpc_channel *c = channel(tu_path(pki, "ca.crt"), NULL, NULL);
    CHECK(heartbeat_as(c, id1, &st) == RPC_UNAUTHENTICATED);
    CHECKF(strstr(st.details, "client certificate from the project CA is required"), "%s", st.details);
    rpc_channel_destroy(c);
    /* a certificate from another CA: the handshake itself fails */
    c = channel(tu_path(pki, "ca.crt"), tu_path(other, "admin.crt"), tu_path(other, "admin.key"));
    CHECK(heartbeat_as(c, "", &st) == RPC_UNAVAILABLE);
    rpc_channel_destroy(c);
    int code;
    void *r = list_as_admin(other, &code);
    CHECK(code == RPC_UNAVAILABLE && r == NULL);
    /* a valid device certificate claiming another device's id */
    const char *d2 = newdir("dev2");
    c = channel(tu_path(d2, "ca.crt"), tu_path(d2, "device.crt"), tu_path(d2, "device.key"));
    CHECK(heartbeat_as(c, id1, &st) == RPC_PERMISSION_DENIED);
    char want[256];
    snprintf(want, sizeof want, "certificate is for device %s but the request claims device '%s'",
             id2, id1);
    CHECKF(!strcmp(st.details, want), "%s", st.details);
    CHECK(heartbeat_as(c, id2, &st) == RPC_OK);
    /* an over-long stage address is refused, not stored cut short */
    char addr[300];
    memset(addr, 'a', sizeof addr - 1);
    addr[sizeof addr - 1] = 0;
    Skyloom__V1__HeartbeatRequest req = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    req.device_id = (char *)id2;
    req.seq = 2;
    req.stage_address = addr;
    void *resp = NULL;
    CHECK(rpc_call_pb(c, RPC_M_HEARTBEAT, &req, &skyloom__v1__heartbeat_response__descriptor,
                      &resp, T_MS, &st) == RPC_INVALID_ARGUMENT);
    CHECKF(strstr(st.details, "longer than 255 bytes"), "%s", st.details);
    rpc_unpacked_free(resp);
    rpc_channel_destroy(c);
    /* the admin certificate may list, not act as a device */
    c = channel(tu_path(pki, "ca.crt"), tu_path(pki, "admin.crt"), tu_path(pki, "admin.key"));
    CHECK(heartbeat_as(c, id1, &st) == RPC_PERMISSION_DENIED);
    CHECKF(strstr(st.details, "admin certificate may not act as device"), "%s", st.details);
    rpc_channel_destroy(c);
    /* the coordinator's own certificate is not a device */
    c = channel(tu_path(pki, "ca.crt"), tu_path(pki, "coordinator.crt"),
                tu_path(pki, "coordinator.key"));
    CHECK(heartbeat_as(c, "skyloom-coordinator", &st) == RPC_PERMISSION_DENIED);
    CHECKF(strstr(st.details, "is not a device"), "%s", st.details);
    rpc_channel_destroy(c);
}

static void test_wire_refusals(void)
{
    rpc_channel *c = channel(tu_path(pki, "ca.crt"), NULL, NULL);
    rpc_buf r;
    rpc_status st;
    /* an unknown method */
    CHECK(rpc_call_unary(c, "/skyloom.v1.Coordinator/Teleport", "", 0, T_MS, &r, &st) ==
          RPC_UNIMPLEMENTED);
    CHECKF(strstr(st.details, "/skyloom.v1.Coordinator/Teleport is not implemented"), "%s",
           st.details);
    /* a message over the coordinator's 1 MiB limit */
    size_t n = 2u << 20;
    uint8_t *big = calloc(1, n);
    CHECK(rpc_call_unary(c, RPC_M_ENROLL, big, n, T_MS, &r, &st) == RPC_RESOURCE_EXHAUSTED);
    free(big);
    /* bytes that are not an EnrollRequest */
    CHECK(rpc_call_unary(c, RPC_M_ENROLL, "\xff\xff\xff", 3, T_MS, &r, &st) == RPC_INVALID_ARGUMENT);
    CHECK(!strcmp(st.details, "malformed EnrollRequest"));
    /* a valid token with a CSR that is garbage: refused, token not used up */
    const char *t = token(pki, "lab", 3600);
    cert_token tk;
    cert_token_parse(t, &tk, NULL);
    Skyloom__V1__EnrollRequest req = SKYLOOM__V1__ENROLL_REQUEST__INIT;
    req.token = tk.secret;
    req.site = "lab";
    req.csr_der.data = (uint8_t *)"not a csr";
    req.csr_der.len = 9;
    void *resp = NULL;
    CHECK(rpc_call_pb(c, RPC_M_ENROLL, &req, &skyloom__v1__enroll_response__descriptor, &resp, T_MS,
                      &st) == RPC_INVALID_ARGUMENT);
    CHECKF(strstr(st.details, "CSR refused"), "%s", st.details);
    rpc_channel_destroy(c);
    sl_err err;
    dev_agent *a = enroll("after-bad-csr", t, "lab", &err);
    CHECKF(a != NULL, "token still usable after a refused CSR: %s", err.msg);
    dev_agent_close(a);
}

static void test_stage_service(void)
{
    const char *d1 = newdir("dev1"), *d2 = newdir("dev2");
    dev_stagesvc_opts so = {.listen = "127.0.0.1:0", .state = d2};
    sl_err err = {0};
    int port = 0;
    dev_stagesvc *stage = dev_stagesvc_start(&so, &port, &err);
    CHECKF(stage != NULL, "%s", err.msg);
    if (!stage)
        return;
    char t[64];
    snprintf(t, sizeof t, "127.0.0.1:%d", port);
    rpc_status st;
    /* a neighbour that expects device 2 reaches it */
    rpc_channel *c = dev_stagesvc_connect(d1, t, id2, 0, &err);
    CHECK(dev_stagesvc_ping(c, id1, "ping", 4, T_MS, &st) == RPC_OK);
    /* claiming to be someone else */
    CHECK(dev_stagesvc_ping(c, id2, "ping", 4, T_MS, &st) == RPC_PERMISSION_DENIED);
    CHECKF(strstr(st.details, "but the request claims device"), "%s", st.details);
    /* Exchange without a stage assigned */
    rpc_stream *s = rpc_stream_open(c, RPC_M_STAGE_EXCHANGE, T_MS, &err);
    rpc_buf m;
    CHECK(s && rpc_stream_recv(s, &m, &err) == 0);
    CHECK(s && rpc_stream_finish(s, &st) == RPC_FAILED_PRECONDITION);
    rpc_channel_destroy(c);
    /* expecting device 1 at device 2's address: the name check fails */
    c = dev_stagesvc_connect(d1, t, id1, 0, &err);
    CHECK(dev_stagesvc_ping(c, id1, "ping", 4, T_MS, &st) == RPC_UNAVAILABLE);
    rpc_channel_destroy(c);
    /* the admin certificate is from our CA but is not a device */
    rpc_channel_opts co = {.target = t,
                           .tls = {tu_path(pki, "ca.crt"), tu_path(pki, "admin.crt"),
                                   tu_path(pki, "admin.key")},
                           .server_name = id2};
    c = rpc_channel_create(&co, &err);
    CHECK(dev_stagesvc_ping(c, CERT_ADMIN_CN, "x", 1, T_MS, &st) == RPC_PERMISSION_DENIED);
    CHECKF(strstr(st.details, "is not a device"), "%s", st.details);
    rpc_channel_destroy(c);
    /* another CA, and no certificate at all: the handshake fails */
    co.tls.cert = tu_path(other, "admin.crt");
    co.tls.key = tu_path(other, "admin.key");
    c = rpc_channel_create(&co, &err);
    CHECK(dev_stagesvc_ping(c, id1, "x", 1, T_MS, &st) == RPC_UNAVAILABLE);
    rpc_channel_destroy(c);
    co.tls.cert = co.tls.key = NULL;
    c = rpc_channel_create(&co, &err);
    CHECK(dev_stagesvc_ping(c, id1, "x", 1, T_MS, &st) == RPC_UNAVAILABLE);
    rpc_channel_destroy(c);
    dev_stagesvc_stop(stage);
}

static void test_revocation_and_restart(void)
{
    sl_err err = {0};
    CHECK(cert_revoke(pki, id1, &err) == 0);
    const char *d1 = newdir("dev1");
    rpc_channel *c =
        channel(tu_path(d1, "ca.crt"), tu_path(d1, "device.crt"), tu_path(d1, "device.key"));
    rpc_status st;
    CHECK(heartbeat_as(c, id1, &st) == RPC_UNAUTHENTICATED);
    char want[128];
    snprintf(want, sizeof want, "device %s is revoked", id1);
    CHECKF(!strcmp(st.details, want), "%s", st.details);
    rpc_channel_destroy(c);
    CHECK(cert_revoke(pki, "not-an-id", &err) == -1 && err.code == SL_EINVAL);

    /* restart: devices and revocations survive */
    coord_close(co);
    start_coordinator();
    int code;
    Skyloom__V1__ListDevicesResponse *r = list_as_admin(pki, &code);
    CHECK(code == RPC_OK);
    CHECK(!strcmp(state_of(r, id1), "revoked"));
    CHECK(strcmp(state_of(r, id2), "absent") != 0 && strcmp(state_of(r, id2), "revoked") != 0);
    CHECK(r && r->n_devices == 4); /* dev1, dev2, reuse1, after-bad-csr */
    rpc_unpacked_free(r);
    /* the revoked device, restarted against the new port, is still refused */
    dev_agent *a = enroll("dev1", NULL, "lab", &err);
    CHECK(a != NULL);
    CHECK(a && dev_agent_heartbeat(a, &st) == RPC_UNAUTHENTICATED);
    dev_agent_close(a);
    a = enroll("dev2", NULL, "lab", &err);
    CHECK(a && dev_agent_heartbeat(a, &st) == RPC_OK);
    /* the heartbeat reply announced the revocation: device 2's Stage server,
     * fed by its agent, now refuses device 1 */
    CHECK(a && dev_agent_is_revoked(a, id1) && !dev_agent_is_revoked(a, id2));
    dev_stagesvc_opts so = {.listen = "127.0.0.1:0", .state = newdir("dev2"),
                         .revoked = dev_agent_is_revoked, .revoked_ud = a};
    int port = 0;
    dev_stagesvc *stage = a ? dev_stagesvc_start(&so, &port, &err) : NULL;
    CHECKF(stage != NULL, "%s", err.msg);
    char t2[64];
    snprintf(t2, sizeof t2, "127.0.0.1:%d", port);
    c = dev_stagesvc_connect(d1, t2, id2, 0, &err);
    CHECK(c && dev_stagesvc_ping(c, id1, "x", 1, T_MS, &st) == RPC_UNAUTHENTICATED);
    CHECKF(!strcmp(st.details, want), "%s", st.details);
    rpc_channel_destroy(c);
    dev_stagesvc_stop(stage);
    dev_agent_close(a);
    /* a revoked key cannot come back with a fresh token */
    const char *t = token(pki, "lab", 3600);
    cert_token tk;
    cert_token_parse(t, &tk, NULL);
    uint8_t *csr;
    size_t len;
    CHECK(cert_csr_create(tu_path(d1, "device.key"), "x", &csr, &len, &err) == 0);
    Skyloom__V1__EnrollRequest req = SKYLOOM__V1__ENROLL_REQUEST__INIT;
    req.token = tk.secret;
    req.site = "lab";
    req.csr_der.data = csr;
    req.csr_der.len = len;
    c = channel(tu_path(pki, "ca.crt"), NULL, NULL);
    void *resp = NULL;
    CHECK(rpc_call_pb(c, RPC_M_ENROLL, &req, &skyloom__v1__enroll_response__descriptor, &resp, T_MS,
                      &st) == RPC_PERMISSION_DENIED);
    CHECKF(strstr(st.details, "is revoked"), "%s", st.details);
    free(csr);
    rpc_channel_destroy(c);
}

static void test_csr_identity(void)
{
    /* Whatever name a CSR asks for, the certificate names the key's id. */
    sl_err err = {0};
    cert_ca *ca = cert_ca_load(pki, &err);
    CHECK(ca != NULL);
    const char *kp = newdir("k.key");
    CHECK(cert_key_generate(kp, &err) == 0);
    CHECK(cert_key_generate(kp, &err) == -1); /* never overwrites */
    char want[CERT_ID_LEN], got[CERT_ID_LEN];
    CHECK(cert_key_device_id(kp, want, &err) == 0);
    uint8_t *csr;
    size_t len;
    CHECK(cert_csr_create(kp, CERT_ADMIN_CN, &csr, &len, &err) == 0);
    char *pem = NULL;
    CHECK(cert_ca_sign_csr(ca, csr, len, "lab", 30, got, &pem, &err) == 0);
    CHECK(!strcmp(got, want));
    CHECK(pem && strstr(pem, "BEGIN CERTIFICATE"));
    /* a CSR whose signature does not verify */
    csr[len - 5] ^= 0x55;
    free(pem);
    pem = NULL;
    CHECK(cert_ca_sign_csr(ca, csr, len, "lab", 30, got, &pem, &err) == -1);
    CHECK(cert_ca_sign_csr(ca, csr, 3, "lab", 30, got, &pem, &err) == -1);
    free(csr);
    cert_ca_free(ca);
}

int main(void)
{
    sl_log_set_level(SL_LOG_WARN);
    tu_tmpdir(root, sizeof root, "trust");
    tu_pki(root, "pki", pki, sizeof pki);
    tu_pki(root, "other", other, sizeof other);
    snprintf(state, sizeof state, "%s/state", root);
    rpc_global_init();
    start_coordinator();
    RUN(test_enroll_and_heartbeat);
    RUN(test_token_refusals);
    RUN(test_call_refusals);
    RUN(test_wire_refusals);
    RUN(test_stage_service);
    RUN(test_revocation_and_restart);
    RUN(test_csr_identity);
    coord_close(co);
    rpc_global_shutdown();
    tu_rmtree(root);
    return sl_test_done();
}
