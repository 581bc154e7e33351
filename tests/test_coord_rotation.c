/* test_coord_rotation.c - rotating the coordinator's key ends the old key's
 * power to sign plans.
 *
 * The coordinator (coord_fake.h, handlers called in this process): GetPlan
 * signs the plan with the key of the moment, so after `certs
 * rotate-coordinator` the same plan text comes with the new certificate and
 * a signature that verifies against it; heartbeat replies carry the current
 * certificate, read again when the file changes.
 *
 * The device: dev_coord_cert_judge on every case (newer, the same, older, a
 * different one of the same second from a plan and from a heartbeat, a
 * device's certificate, another CA's, bytes that are no certificate); and a
 * real agent against the coordinator on a port: its heartbeats store the
 * newest certificate in its state directory, a plan signed by the rotated-out
 * one is refused, still after a restart of the agent, and still when a
 * coordinator with the old pair (a stolen key) answers its heartbeats. */
#include <time.h>

#include "coord_fake.h"
#include "dev_agent.h"

static char *opts_abc(void)
{
    char *o = sl_xmalloc(512);
    snprintf(o, 512, "{\"steps\": 6, \"batch\": 4, \"micro_batches\": 2, \"checkpoint_every\": 2, "
             "\"algo\": \"even\", \"u_shape\": false, \"devices\": [\"%s\", \"%s\", \"%s\"]}",
             D[0].id, D[1].id, D[2].id);
    return o;
}

static char *read_all(const char *path, size_t *len)
{
    char *b = NULL;
    sl_err err = {0};
    CHECKF(sl_read_file(path, 1 << 20, &b, len, &err) == 0, "%s", err.msg);
    return b;
}

static void fp_of(const char *pem, size_t len, char fp[CERT_HEX_LEN])
{
    sl_err err = {0};
    CHECKF(cert_pem_fingerprint(pem, len, fp, &err) == 0, "%s", err.msg);
}

/* GetPlan as device d: the plan, checked against the CA; the signer's
 * fingerprint to fp. */
static char *get_plan(const char *job, const fdev *d, char fp[CERT_HEX_LEN])
{
    Skyloom__V1__GetPlanRequest q = SKYLOOM__V1__GET_PLAN_REQUEST__INIT;
    q.device_id = (char *)d->id;
    q.job_id = (char *)job;
    Skyloom__V1__SignedPlan *sp = NULL;
    rpc_status st;
    CHECKF(call(coord_handle_get_plan, d->id, &q, &skyloom__v1__signed_plan__descriptor,
                (void **)&sp, &st) == RPC_OK, "%s", st.details);
    if (!sp)
        return NULL;
    size_t ca_len;
    char *ca = read_all(tu_path(pki, "ca.crt"), &ca_len);
    sl_err err = {0};
    CHECKF(cert_verify_signed(ca, ca_len, (const char *)sp->coordinator_cert.data,
                              sp->coordinator_cert.len, sp->plan.data, sp->plan.len,
                              sp->signature.data, sp->signature.len, &err) == 0,
           "%s", err.msg);
    fp_of((const char *)sp->coordinator_cert.data, sp->coordinator_cert.len, fp);
    char *plan = sl_xmalloc(sp->plan.len + 1);
    memcpy(plan, sp->plan.data, sp->plan.len);
    plan[sp->plan.len] = 0;
    free(ca);
    rpc_unpacked_free(sp);
    return plan;
}

/* The certificate a heartbeat reply carries, as its fingerprint. */
static void heartbeat_cert(const fdev *d, char fp[CERT_HEX_LEN])
{
    Skyloom__V1__HeartbeatRequest q = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    q.device_id = (char *)d->id;
    q.seq = 1;
    Skyloom__V1__HeartbeatResponse *r = NULL;
    rpc_status st;
    fp[0] = 0;
    CHECKF(call(coord_handle_heartbeat, d->id, &q, &skyloom__v1__heartbeat_response__descriptor,
                (void **)&r, &st) == RPC_OK, "%s", st.details);
    if (r && r->coordinator_cert.len)
        fp_of((const char *)r->coordinator_cert.data, r->coordinator_cert.len, fp);
    rpc_unpacked_free(r);
}

/* Rotates the coordinator's pair in a later second than the current one's
 * (so that the two certificates' notBefore differ). */
static void rotate(void)
{
    for (time_t t0 = time(NULL); time(NULL) == t0;)
        usleep(10 * 1000);
    sl_err err = {0};
    CHECKF(cert_pki_rotate_coordinator(pki, NULL, 825, &err) == 0, "%s", err.msg);
}

static char *old_pem, *new_pem;
static size_t old_len, new_len;

static void test_plans_signed_by_the_current_key(void)
{
    char *o = opts_abc(), *job = submit(o);
    free(o);
    CHECK(pump_until(job, "running", 1));
    jview v;
    view(job, &v);
    const fdev *s0 = dev_by_id(v.stage_dev[0]);
    CHECK(s0 != NULL);
    free(v.plan);
    if (!s0)
        return;
    old_pem = read_all(tu_path(pki, "coordinator.crt"), &old_len);
    char fp_old[CERT_HEX_LEN], fp[CERT_HEX_LEN], hb[CERT_HEX_LEN];
    fp_of(old_pem, old_len, fp_old);
    char *p1 = get_plan(job, s0, fp);
    CHECK(p1 && !strcmp(fp, fp_old));
    heartbeat_cert(s0, hb);
    CHECK(!strcmp(hb, fp_old));
    rotate();
    new_pem = read_all(tu_path(pki, "coordinator.crt"), &new_len);
    char fp_new[CERT_HEX_LEN];
    fp_of(new_pem, new_len, fp_new);
    CHECK(strcmp(fp_new, fp_old) != 0);
    /* the same plan, signed by the new key, with the new certificate */
    char *p2 = get_plan(job, s0, fp);
    CHECK(p1 && p2 && !strcmp(p1, p2));
    CHECKF(!strcmp(fp, fp_new), "signed by %.16s, the new certificate is %.16s", fp, fp_new);
    /* heartbeats bring the new certificate from now on */
    heartbeat_cert(s0, hb);
    CHECKF(!strcmp(hb, fp_new), "heartbeat carries %.16s", hb);
    free(p1);
    free(p2);
    free(job);
}

/* The device's rule, case by case. */
static void test_judge(void)
{
    if (!old_pem || !new_pem)
        return;
    size_t ca_len;
    char *ca = read_all(tu_path(pki, "ca.crt"), &ca_len);
    sl_err err = {0};
    dev_coord_seen none = {0}, seen_old, seen_new, x;
    CHECK(dev_coord_cert_judge(ca, ca_len, &none, old_pem, old_len, 0, &seen_old, &err) ==
          DEV_COORD_NEWER);
    CHECK(dev_coord_cert_judge(ca, ca_len, &seen_old, new_pem, new_len, 0, &seen_new, &err) ==
          DEV_COORD_NEWER);
    CHECK(seen_new.not_before > seen_old.not_before);
    CHECK(dev_coord_cert_judge(ca, ca_len, &seen_new, new_pem, new_len, 0, &x, &err) ==
          DEV_COORD_SAME);
    /* the rotated-out certificate: refused from a plan and from a heartbeat */
    CHECK(dev_coord_cert_judge(ca, ca_len, &seen_new, old_pem, old_len, 0, &x, &err) == -1 &&
          err.code == SL_EAUTH && strstr(err.msg, "older than") && strstr(err.msg, "rotated out"));
    CHECK(dev_coord_cert_judge(ca, ca_len, &seen_new, old_pem, old_len, 1, &x, &err) == -1);
    /* another certificate of the same notBefore: a plan's signer is refused,
     * the coordinator's heartbeat is believed */
    dev_coord_seen twin = seen_new;
    twin.fp[0] = twin.fp[0] == 'a' ? 'b' : 'a';
    CHECK(dev_coord_cert_judge(ca, ca_len, &twin, new_pem, new_len, 0, &x, &err) == -1 &&
          strstr(err.msg, "is not the newest"));
    CHECK(dev_coord_cert_judge(ca, ca_len, &twin, new_pem, new_len, 1, &x, &err) == DEV_COORD_NEWER);
    /* not a coordinator's: a device's certificate, another CA's, no certificate */
    char other[512];
    tu_pki(root, "other", other, sizeof other);
    size_t o_len, a_len;
    char *o_pem = read_all(tu_path(other, "coordinator.crt"), &o_len);
    char *a_pem = read_all(tu_path(pki, "admin.crt"), &a_len);
    CHECK(dev_coord_cert_judge(ca, ca_len, &none, o_pem, o_len, 1, &x, &err) == -1 &&
          strstr(err.msg, "does not verify against the pinned CA"));
    CHECK(dev_coord_cert_judge(ca, ca_len, &none, a_pem, a_len, 1, &x, &err) == -1 &&
          strstr(err.msg, "not the coordinator"));
    CHECK(dev_coord_cert_judge(ca, ca_len, &none, "-----BEGIN", 10, 1, &x, &err) == -1 &&
          strstr(err.msg, "does not parse"));
    CHECK(dev_coord_cert_judge(ca, ca_len, &none, new_pem, 40, 1, &x, &err) == -1);
    free(o_pem);
    free(a_pem);
    free(ca);
}

/* A real agent: heartbeats store the newest certificate; a plan signed by
 * the rotated-out one is refused, after a restart too, and when a
 * coordinator holding the old pair answers. */
static void test_agent(void)
{
    if (!old_pem || !new_pem)
        return;
    sl_err err = {0};
    int port = coord_start(C, &err);
    CHECKF(port > 0, "%s", err.msg);
    if (port <= 0)
        return;
    char target[64], tok[CERT_TOKEN_LEN], dir[600];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    snprintf(dir, sizeof dir, "%s/agent", root);
    CHECK(cert_token_create(pki, "lab-a", 3600, tok, &err) == 0);
    dev_agent_opts ao = {.coordinator = target, .token = tok, .state = dir, .site = "lab-a",
                         .name = "agent", .timeout_ms = 60000};
    dev_agent *a = dev_agent_open(&ao, &err);
    CHECKF(a != NULL, "%s", err.msg);
    if (!a)
        return;
    rpc_status st;
    CHECKF(dev_agent_heartbeat(a, &st) == RPC_OK, "%s", st.details);
    size_t kept_len = 0;
    char *kept = read_all(tu_path(dir, "coordinator.crt"), &kept_len);
    CHECK(kept && kept_len == new_len && !memcmp(kept, new_pem, new_len));
    free(kept);
    CHECK(dev_agent_plan_signer(a, old_pem, old_len, &err) == -1 && strstr(err.msg, "older than"));
    CHECKF(dev_agent_plan_signer(a, new_pem, new_len, &err) == 0, "%s", err.msg);
    /* the agent starts again: it remembers */
    dev_agent_close(a);
    ao.token = NULL;
    a = dev_agent_open(&ao, &err);
    CHECKF(a != NULL, "%s", err.msg);
    if (!a)
        return;
    CHECK(dev_agent_plan_signer(a, old_pem, old_len, &err) == -1);
    /* someone holding the old pair answers as the coordinator: its
     * heartbeats bring the old certificate, which is not taken */
    sl_err werr = {0};
    char *old_key = NULL;
    size_t old_key_len = 0;
    CHECK(sl_read_file(tu_path(pki, "coordinator.key.prev"), 1 << 20, &old_key, &old_key_len,
                       &werr) == 0 &&
          sl_write_file_atomic(tu_path(pki, "coordinator.key"), old_key, old_key_len, &werr) == 0 &&
          sl_write_file_atomic(tu_path(pki, "coordinator.crt"), old_pem, old_len, &werr) == 0);
    free(old_key);
    CHECKF(dev_agent_heartbeat(a, &st) == RPC_OK, "%s", st.details);
    kept = read_all(tu_path(dir, "coordinator.crt"), &kept_len);
    CHECK(kept && kept_len == new_len && !memcmp(kept, new_pem, new_len));
    free(kept);
    CHECK(dev_agent_plan_signer(a, old_pem, old_len, &err) == -1);
    dev_agent_close(a);
}

int main(void)
{
    sl_log_set_level(SL_LOG_OFF);
    cf_open("crotation", 1000);
    RUN(test_plans_signed_by_the_current_key);
    RUN(test_judge);
    RUN(test_agent);
    cf_close();
    free(old_pem);
    free(new_pem);
    tu_rmtree(root);
    return sl_test_done();
}
