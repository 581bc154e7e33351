/* fuzz_coord.h - a coordinator without a network for the fuzz targets: a
 * temporary PKI and state, opened on the first input, closed at exit. The
 * spool holds one token with a known secret (all '1') for site "lab". */
#ifndef FUZZ_COORD_H
#define FUZZ_COORD_H

#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <protobuf-c/protobuf-c.h>

#include "cert.h"
#include "coord.h"
#include "coord_internal.h"
#include "coord_obs.h"
#include "skyloom.pb-c.h"
#include "sl_time.h"
#include "rpc.h"
#include "sl_log.h"

static coord *fz_coord;
static char fz_root[128];
static char fz_device[CERT_ID_LEN]; /* an enrolled device id */
static uint8_t *fz_csr;             /* a valid CSR (of another key) to mutate */
static size_t fz_csr_len;

static inline int fz_rm(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static inline void fz_done(void)
{
    free(fz_csr);
    coord_close(fz_coord);
    nftw(fz_root, fz_rm, 16, FTW_DEPTH | FTW_PHYS);
}

static inline void fz_die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz setup: %s: %s\n", what, msg);
    abort();
}

static inline coord *fz_get(void)
{
    if (fz_coord)
        return fz_coord;
    sl_log_set_level(SL_LOG_OFF);
    snprintf(fz_root, sizeof fz_root, "/tmp/skyloom-fuzz-XXXXXX");
    if (!mkdtemp(fz_root))
        fz_die("mkdtemp", "failed");
    char pki[256], state[256], p[512];
    snprintf(pki, sizeof pki, "%s/pki", fz_root);
    snprintf(state, sizeof state, "%s/state", fz_root);
    sl_err err = {0};
    if (cert_pki_init(pki, NULL, NULL, &err))
        fz_die("cert_pki_init", err.msg);
    char secret[65], hash[CERT_HEX_LEN];
    memset(secret, '1', 64);
    secret[64] = 0;
    cert_token_hash(secret, hash);
    snprintf(p, sizeof p, "%s/spool/token-%s", pki, hash);
    FILE *f = fopen(p, "w");
    if (!f)
        fz_die("spool", p);
    fprintf(f, "lab 4000000000\n");
    fclose(f);
    coord_opts o = {.listen = "127.0.0.1:0", .pki = pki, .state = state};
    if (!(fz_coord = coord_open(&o, &err)))
        fz_die("coord_open", err.msg);
    /* One enrolled device, so that the device paths of the checks are reached. */
    snprintf(p, sizeof p, "%s/dev.key", fz_root);
    uint8_t *csr = NULL;
    size_t len = 0;
    if (cert_key_generate(p, &err) || cert_key_device_id(p, fz_device, &err) ||
        cert_csr_create(p, "x", &csr, &len, &err))
        fz_die("device key", err.msg);
    char tok[CERT_TOKEN_LEN];
    if (cert_token_create(pki, "lab", 3600, tok, &err))
        fz_die("token", err.msg);
    cert_token t;
    cert_token_parse(tok, &t, NULL);
    /* EnrollRequest by hand: token (1), csr_der (2), site (3). */
    size_t n = 0;
    uint8_t *req = malloc(len + 128);
    req[n++] = 0x0a;
    req[n++] = 64;
    memcpy(req + n, t.secret, 64);
    n += 64;
    req[n++] = 0x12;
    size_t v = len;
    do {
        req[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    memcpy(req + n, csr, len);
    n += len;
    req[n++] = 0x1a;
    req[n++] = 3;
    memcpy(req + n, "lab", 3);
    n += 3;
    rpc_peer peer = {0};
    rpc_buf resp = {0};
    rpc_status st = {0};
    if (coord_handle_enroll(fz_coord, &peer, req, n, &resp, &st) != RPC_OK)
        fz_die("enroll", st.details);
    rpc_buf_free(&resp);
    free(req);
    free(csr);
    snprintf(p, sizeof p, "%s/other.key", fz_root);
    if (cert_key_generate(p, &err) || cert_csr_create(p, "y", &fz_csr, &fz_csr_len, &err))
        fz_die("csr", err.msg);
    atexit(fz_done);
    return fz_coord;
}

/* The caller's identity from the first input byte: nobody, the admin, the
 * enrolled device, another device id, or a name that is not a device. */
static inline size_t fz_peer(const uint8_t *data, size_t size, rpc_peer *peer)
{
    memset(peer, 0, sizeof *peer);
    if (size == 0)
        return 0;
    switch (data[0] % 5) {
    case 0:
        break;
    case 1:
        peer->authenticated = 1;
        snprintf(peer->identity, sizeof peer->identity, "%s", CERT_ADMIN_CN);
        break;
    case 2:
        peer->authenticated = 1;
        snprintf(peer->identity, sizeof peer->identity, "%s", fz_device);
        break;
    case 3:
        peer->authenticated = 1;
        snprintf(peer->identity, sizeof peer->identity, "d0123456789abcdef");
        break;
    default:
        peer->authenticated = 1;
        snprintf(peer->identity, sizeof peer->identity, "skyloom-coordinator");
    }
    return 1;
}

/* A CSR to test from the input: a valid one with bytes of the input written
 * over it at an offset the input picks (the parsers are reached far more
 * often than from random bytes), or truncated, or the input itself. */
static inline uint8_t *fz_mutated_csr(const uint8_t *data, size_t size, size_t *len)
{
    uint8_t *out = malloc(fz_csr_len + size + 1);
    if (size < 3 || data[0] % 3 == 0) {
        memcpy(out, data, size);
        *len = size;
    } else {
        memcpy(out, fz_csr, fz_csr_len);
        size_t off = ((size_t)data[1] | (size_t)data[2] << 8) % fz_csr_len;
        if (data[0] % 3 == 1) {
            size_t n = size - 3 < fz_csr_len - off ? size - 3 : fz_csr_len - off;
            memcpy(out + off, data + 3, n);
            *len = fz_csr_len;
        } else {
            *len = off;
        }
    }
    return out;
}

/* Runs one handler over the input; a reply must only come with RPC_OK. */
static inline void fz_run(int (*h)(void *, const rpc_peer *, const uint8_t *, size_t, rpc_buf *,
                            rpc_status *),
                   const uint8_t *data, size_t size)
{
    coord *c = fz_get();
    rpc_peer peer;
    size_t skip = fz_peer(data, size, &peer);
    rpc_buf resp = {0};
    rpc_status st = {0};
    int code = h(c, &peer, data + skip, size - skip, &resp, &st);
    if (code != RPC_OK && (resp.data || !st.details[0])) {
        fprintf(stderr, "refusal with a reply or without a reason (code %d)\n", code);
        abort();
    }
    rpc_buf_free(&resp);
}

/* Second byte odd: the rest is parsed as the handler's request type and, if
 * it parses, its device_id is set to the caller's identity before the call,
 * so the calls that pass authorization (database paths) are fuzzed too.
 * Otherwise the bytes go in as they are. */
static inline void fz_run_claimed(int (*h)(void *, const rpc_peer *, const uint8_t *, size_t,
                                           rpc_buf *, rpc_status *),
                                  const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                  size_t size)
{
    if (size < 2 || !(data[1] & 1)) {
        fz_run(h, data, size);
        return;
    }
    coord *c = fz_get();
    rpc_peer peer;
    fz_peer(data, size, &peer);
    ProtobufCMessage *r = rpc_unpack(desc, data + 2, size - 2);
    if (!r)
        return;
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(desc, "device_id");
    if (!f || f->type != PROTOBUF_C_TYPE_STRING)
        abort();
    char **id = (char **)((char *)r + f->offset), *orig = *id;
    *id = peer.identity;
    rpc_buf in, resp = {0};
    rpc_pack(r, &in);
    *id = orig;
    rpc_unpacked_free(r);
    rpc_status st = {0};
    int code = h(c, &peer, in.data, in.len, &resp, &st);
    if (code != RPC_OK && (resp.data || !st.details[0]))
        abort();
    rpc_buf_free(&in);
    rpc_buf_free(&resp);
}

/* ---- a running job, for the job manager's calls --------------------------------- */

static char fz_job_id[32];

static inline int fz_call(int (*h)(void *, const rpc_peer *, const uint8_t *, size_t, rpc_buf *,
                                   rpc_status *),
                          const char *who, const void *msg, const ProtobufCMessageDescriptor *rdesc,
                          void **out)
{
    rpc_peer peer = {.authenticated = 1};
    snprintf(peer.identity, sizeof peer.identity, "%s", who);
    rpc_buf in, resp = {0};
    rpc_pack(msg, &in);
    rpc_status st = {0};
    int code = h(fz_coord, &peer, in.data, in.len, &resp, &st);
    if (out)
        *out = code == RPC_OK && rdesc ? rpc_unpack(rdesc, resp.data, resp.len) : NULL;
    rpc_buf_free(&in);
    rpc_buf_free(&resp);
    return code;
}

static inline void fz_heartbeat(void)
{
    Skyloom__V1__HeartbeatRequest q = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    uint8_t key[32];
    memset(key, 7, sizeof key);
    char *ds[1] = {"wiki"};
    q.device_id = fz_device;
    q.stage_address = "127.0.0.1:9";
    q.datasets = ds;
    q.n_datasets = 1;
    q.link_public_key.data = key;
    q.link_public_key.len = 32;
    q.threads = 1;
    fz_call(coord_handle_heartbeat, fz_device, &q, NULL, NULL);
}

static inline void fz_report(const char *kind, const char *result)
{
    Skyloom__V1__ReportTaskRequest q = SKYLOOM__V1__REPORT_TASK_REQUEST__INIT;
    q.device_id = fz_device;
    q.job_id = fz_job_id;
    q.kind = (char *)kind;
    q.ok = 1;
    q.result = (char *)result;
    if (fz_call(coord_handle_report_task, fz_device, &q, NULL, NULL) != RPC_OK)
        fz_die("report", kind);
}

static inline const char *fz_job_state(int *epoch)
{
    static char state[16];
    coord_snapshot s;
    state[0] = 0;
    if (coord_jobs_snapshot(fz_coord->jobs, fz_job_id, &s) == 0) {
        snprintf(state, sizeof state, "%s", s.job[0].state);
        if (epoch)
            *epoch = s.job[0].epoch;
    }
    coord_snapshot_free(&s);
    return state;
}

/* The running job's epoch and step. */
static inline void fz_job_step(int *epoch, int *step)
{
    coord_snapshot s;
    *epoch = *step = 0;
    if (coord_jobs_snapshot(fz_coord->jobs, fz_job_id, &s) == 0) {
        *epoch = s.job[0].epoch;
        *step = s.job[0].step;
    }
    coord_snapshot_free(&s);
}

/* Every stage of the running job (all the enrolled device's) reports the
 * steps up to `to`. */
static inline void fz_job_train(int to)
{
    coord_snapshot s;
    int epoch = 0, step = 0, p = 0;
    if (coord_jobs_snapshot(fz_coord->jobs, fz_job_id, &s) == 0) {
        epoch = s.job[0].epoch;
        step = s.job[0].step;
        p = s.job[0].p;
    }
    coord_snapshot_free(&s);
    for (int k = step + 1; k <= to; k++)
        for (int i = 0; i < p; i++) {
            Skyloom__V1__ReportStepRequest q = SKYLOOM__V1__REPORT_STEP_REQUEST__INIT;
            q.device_id = fz_device;
            q.job_id = fz_job_id;
            q.epoch = (uint32_t)epoch;
            q.stage = (uint32_t)i;
            q.step = (uint32_t)k;
            q.loss = 3.0;
            q.step_s = 0.1;
            fz_call(coord_handle_report_step, fz_device, &q, NULL, NULL);
        }
}

/* A job of the enrolled device alone (it owns the data and runs every
 * stage), checked, profiled and planned: running. */
static inline const char *fz_job(void)
{
    if (fz_job_id[0])
        return fz_job_id;
    fz_get();
    fz_heartbeat();
    Skyloom__V1__SubmitJobRequest q = SKYLOOM__V1__SUBMIT_JOB_REQUEST__INIT;
    char data[64];
    snprintf(data, sizeof data, "%s:wiki", fz_device);
    q.config = "{\"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
               " \"intermediate_size\": 32, \"vocab_size\": 100, \"max_position_embeddings\": 16}";
    q.data = data;
    q.options = "{\"steps\": 1000000, \"batch\": 2, \"micro_batches\": 1, \"checkpoint_every\": 3}";
    Skyloom__V1__SubmitJobResponse *r = NULL;
    if (fz_call(coord_handle_submit_job, CERT_ADMIN_CN, &q,
                &skyloom__v1__submit_job_response__descriptor, (void **)&r) != RPC_OK || !r)
        fz_die("submit", "refused");
    snprintf(fz_job_id, sizeof fz_job_id, "%s", r->job_id);
    rpc_unpacked_free(r);
    fz_report("check", "{\"sequences\": 100, \"seq_len\": 8, \"first\": 0, \"vocab_size\": 100}");
    fz_report("profile", "{\"round\": \"links\", \"links\": []}");
    fz_report("profile", "{\"round\": \"units\", \"unit_fwd_s\": [0.001, 0.002, 0.002, 0.001],"
                         " \"unit_bwd_s\": [0.002, 0.004, 0.004, 0.002], \"memory_bytes\": 1000000000,"
                         " \"threads\": 1, \"backend\": \"cpu\"}");
    for (double t0 = sl_now_s(); strcmp(fz_job_state(NULL), "running"); usleep(10 * 1000)) {
        fz_heartbeat();
        if (sl_now_s() - t0 > 20)
            fz_die("job", fz_job_state(NULL));
    }
    return fz_job_id;
}

/* Like fz_run_claimed, with the request's job_id (third byte odd) and
 * epoch (third byte & 2) those of the running job, so that the job
 * manager's own checks are fuzzed past the lookup. */
static inline void fz_run_job(int (*h)(void *, const rpc_peer *, const uint8_t *, size_t, rpc_buf *,
                                       rpc_status *),
                              const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                              size_t size)
{
    if (size < 3) {
        fz_run(h, data, size);
        return;
    }
    fz_job();
    fz_heartbeat();
    rpc_peer peer;
    fz_peer(data, size, &peer);
    ProtobufCMessage *r = rpc_unpack(desc, data + 3, size - 3);
    if (!r)
        return;
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field_by_name(desc, "device_id"),
                                   *fj = protobuf_c_message_descriptor_get_field_by_name(desc, "job_id"),
                                   *fe = protobuf_c_message_descriptor_get_field_by_name(desc, "epoch");
    if (!fd || !fj || !fe || fe->type != PROTOBUF_C_TYPE_UINT32)
        abort();
    char **id = (char **)((char *)r + fd->offset), *orig_id = *id;
    char **job = (char **)((char *)r + fj->offset), *orig_job = *job;
    uint32_t *ep = (uint32_t *)((char *)r + fe->offset);
    if (data[1] & 1)
        *id = peer.identity;
    if (data[2] & 1)
        *job = fz_job_id;
    int epoch = 0;
    fz_job_state(&epoch);
    if (data[2] & 2)
        *ep = (uint32_t)epoch;
    rpc_buf in, resp = {0};
    rpc_pack(r, &in);
    *id = orig_id;
    *job = orig_job;
    rpc_unpacked_free(r);
    rpc_status st = {0};
    int code = h(fz_coord, &peer, in.data, in.len, &resp, &st);
    if (code != RPC_OK && (resp.data || !st.details[0])) {
        fprintf(stderr, "refusal with a reply or without a reason (code %d)\n", code);
        abort();
    }
    rpc_buf_free(&in);
    rpc_buf_free(&resp);
}

#endif
