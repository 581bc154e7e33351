/* coord_fake.h - a coordinator in this process and devices played by the
 * test through its handlers (tests/test_golden.c, test_coord_store.c): the
 * devices answer every task with fixed figures, train the running plan's
 * steps with fixed reports and upload fixed checkpoint parts. Nothing but
 * the coordinator's decisions varies from run to run. */
#ifndef COORD_FAKE_H
#define COORD_FAKE_H

#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cert.h"
#include "coord.h"
#include "coord_internal.h"
#include "coord_obs.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_buf.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_test.h"
#include "sl_time.h"
#include "trust_util.h"

#ifndef NDEV
#define NDEV 3 /* the devices of D[] this test uses (up to 4) */
#endif
#define WAIT_S 30.0

static char root[256], pki[512], state[512];
static coord *C;
static coord_opts O;

typedef int (*handler_fn)(void *, const rpc_peer *, const uint8_t *, size_t, rpc_buf *, rpc_status *);

static inline int call(handler_fn fn, const char *who, const void *msg, const void *rdesc, void **out,
                rpc_status *st)
{
    rpc_peer peer = {0};
    if (who) {
        peer.authenticated = 1;
        snprintf(peer.identity, sizeof peer.identity, "%s", who);
    }
    rpc_buf req = {0}, resp = {0};
    rpc_pack(msg, &req);
    memset(st, 0, sizeof *st);
    int code = fn(C, &peer, req.data, req.len, &resp, st);
    if (out)
        *out = code == RPC_OK && rdesc ? rpc_unpack(rdesc, resp.data, resp.len) : NULL;
    rpc_buf_free(&req);
    rpc_buf_free(&resp);
    return code;
}

/* The jobs' config.json: 2 layers, units 0..3; cf_config another */
#define CF_CONFIG                                                                                  \
    "{\"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"                \
    " \"intermediate_size\": 32, \"vocab_size\": 100, \"max_position_embeddings\": 16}"
static const char *cf_config;

/* ---- the devices ------------------------------------------------------------ */

typedef struct fdev {
    const char *name, *site, *dataset;
    char id[CERT_ID_LEN];
    double speed;  /* its units take this many times the base figures */
    int alive;     /* heartbeats and answers tasks */
    const Skyloom__V1__OwnerPolicy *policy; /* stated in its heartbeats; NULL: none */
    const char *check; /* its check's answer; NULL: an MLM shard's (below) */
    const char *task;  /* the task its profiles say they timed; NULL: the spec's */
    int profiled_micro; /* the micro_batch of the last profile task it was given */
} fdev;

static fdev D[4] = {
    {"A", "lab-a", "books", "", 1.0, 1, NULL, NULL, NULL, 0},
    {"B", "lab-a", NULL, "", 1.0, 1, NULL, NULL, NULL, 0},
    {"C", "lab-b", NULL, "", 1.5, 1, NULL, NULL, NULL, 0},
    {"E", "lab-b", NULL, "", 1.0, 1, NULL, NULL, NULL, 0},
};

static inline const char *token_secret(const char *site, char *out)
{
    char tok[CERT_TOKEN_LEN];
    cert_token t;
    sl_err err = {0};
    if (cert_token_create(pki, site, 3600, tok, &err) || cert_token_parse(tok, &t, &err)) {
        fprintf(stderr, "token: %s\n", err.msg);
        exit(1);
    }
    snprintf(out, CERT_HEX_LEN, "%s", t.secret);
    return out;
}

static inline void enroll(fdev *d)
{
    char sec[CERT_HEX_LEN], key[64];
    snprintf(key, sizeof key, "%s.key", d->name);
    sl_err err = {0};
    uint8_t *csr = NULL;
    size_t len = 0;
    if (cert_key_generate(tu_path(root, key), &err) ||
        cert_csr_create(tu_path(root, key), "host", &csr, &len, &err)) {
        fprintf(stderr, "key: %s\n", err.msg);
        exit(1);
    }
    Skyloom__V1__EnrollRequest q = SKYLOOM__V1__ENROLL_REQUEST__INIT;
    q.token = (char *)token_secret(d->site, sec);
    q.csr_der.data = csr;
    q.csr_der.len = len;
    q.site = (char *)d->site;
    q.name = (char *)d->name;
    Skyloom__V1__EnrollResponse *r = NULL;
    rpc_status st;
    int code = call(coord_handle_enroll, NULL, &q, &skyloom__v1__enroll_response__descriptor,
                    (void **)&r, &st);
    if (code != RPC_OK || !r) {
        fprintf(stderr, "enroll %s: %s\n", d->name, st.details);
        exit(1);
    }
    snprintf(d->id, sizeof d->id, "%s", r->device_id);
    rpc_unpacked_free(r);
    free(csr);
}

static inline fdev *dev_by_id(const char *id)
{
    for (int i = 0; i < NDEV; i++)
        if (!strcmp(D[i].id, id))
            return &D[i];
    return NULL;
}

static inline void report_task(const fdev *d, const char *job, const char *kind, uint32_t epoch, int ok,
                        const char *reason, const char *result)
{
    Skyloom__V1__ReportTaskRequest q = SKYLOOM__V1__REPORT_TASK_REQUEST__INIT;
    q.device_id = (char *)d->id;
    q.job_id = (char *)job;
    q.kind = (char *)kind;
    q.epoch = epoch;
    q.ok = ok;
    q.reason = (char *)(reason ? reason : "");
    q.result = (char *)(result ? result : "");
    rpc_status st;
    CHECKF(call(coord_handle_report_task, d->id, &q, NULL, NULL, &st) == RPC_OK, "%s", st.details);
}

/* What a device answers to a profile task: its links to the peers it is
 * given (inside a site 0.4 ms and 10 Gbit/s, across 20 ms and 1 Gbit/s), or
 * its units (4: embeddings, 2 layers, head). */
static inline char *profile_result(const fdev *d, json_t *spec)
{
    const char *round = json_string_value(json_object_get(spec, "round"));
    json_t *res = json_object();
    if (!round || !strcmp(round, "links")) {
        json_t *links = json_array(), *p;
        size_t k;
        json_array_foreach(json_object_get(spec, "peers"), k, p) {
            const fdev *q = dev_by_id(json_string_value(json_object_get(p, "id")) ?: "");
            if (!q)
                continue;
            int cross = strcmp(q->site, d->site) != 0;
            json_array_append_new(links, json_pack("{s:s, s:f, s:f}", "peer", q->id, "rtt_s",
                                                   cross ? 0.02 : 0.0004, "bandwidth_Bps",
                                                   cross ? 1.25e8 : 1.25e9));
        }
        json_object_set_new(res, "links", links);
    }
    if (!round || !strcmp(round, "units")) {
        double s = d->speed;
        json_object_set_new(res, "unit_fwd_s", json_pack("[f,f,f,f]", 0.02 * s, 0.04 * s,
                                                         0.04 * s, 0.03 * s));
        json_object_set_new(res, "unit_bwd_s", json_pack("[f,f,f,f]", 0.04 * s, 0.08 * s,
                                                         0.08 * s, 0.06 * s));
        json_object_set_new(res, "unit_optim_s", json_pack("[f,f,f,f]", 0.0005, 0.001, 0.001,
                                                           0.0005));
        json_object_set_new(res, "memory_bytes", json_integer(4000000000LL));
        json_object_set_new(res, "threads", json_integer(2));
        json_object_set_new(res, "backend", json_string("cpu"));
        const char *task = d->task ? d->task : json_string_value(json_object_get(spec, "task"));
        if (task) /* as a device echoes the head it timed */
            json_object_set_new(res, "task", json_string(task));
    }
    if (round)
        json_object_set_new(res, "round", json_string(round));
    char *text = json_dumps(res, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(res);
    return text;
}

/* One heartbeat of device d; its check and profile tasks answered. */
static inline void heartbeat(fdev *d)
{
    Skyloom__V1__HeartbeatRequest q = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    uint8_t key[32];
    memset(key, d->name[0], sizeof key);
    char *ds[1] = {(char *)d->dataset};
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", 9000 + d->name[0]);
    q.device_id = d->id;
    q.seq = 1;
    q.stage_address = addr;
    q.datasets = ds;
    q.n_datasets = d->dataset ? 1 : 0;
    q.link_public_key.data = key;
    q.link_public_key.len = 32;
    q.threads = 2;
    q.policy = (Skyloom__V1__OwnerPolicy *)d->policy;
    rpc_status st;
    Skyloom__V1__HeartbeatResponse *r = NULL;
    CHECKF(call(coord_handle_heartbeat, d->id, &q, &skyloom__v1__heartbeat_response__descriptor,
                (void **)&r, &st) == RPC_OK, "%s", st.details);
    for (size_t i = 0; r && i < r->n_tasks; i++) {
        const Skyloom__V1__Task *t = r->tasks[i];
        json_error_t je;
        json_t *spec = json_loads(t->spec, 0, &je);
        if (!strcmp(t->kind, "check")) {
            report_task(d, t->job_id, "check", t->epoch, 1, NULL,
                        d->check ? d->check
                                 : "{\"sequences\": 100, \"seq_len\": 8, \"first\": 0, "
                                   "\"vocab_size\": 100}");
        } else if (!strcmp(t->kind, "profile")) {
            d->profiled_micro = (int)json_integer_value(json_object_get(spec, "micro_batch"));
            char *res = profile_result(d, spec);
            report_task(d, t->job_id, "profile", t->epoch, 1, NULL, res);
            free(res);
        }
        json_decref(spec);
    }
    rpc_unpacked_free(r);
}

static inline void heartbeat_all(void)
{
    for (int i = 0; i < NDEV; i++)
        if (D[i].alive)
            heartbeat(&D[i]);
}

/* ---- the job, as the devices see it ----------------------------------------- */

typedef struct jview {
    char state[16];
    int epoch, step, committed, p;
    char stage_dev[8][CERT_ID_LEN];
    int first_unit[8], last_unit[8];
    int nrep;                     /* replicas (0: the plan has none, one owner) */
    char owner[4][CERT_ID_LEN];   /* the plan's data owners */
    int nowner;
    char *plan;
} jview;

static inline int view(const char *job, jview *v)
{
    coord_snapshot s;
    memset(v, 0, sizeof *v);
    if (coord_jobs_snapshot(C->jobs, job, &s))
        return -1;
    snprintf(v->state, sizeof v->state, "%s", s.job[0].state);
    v->epoch = s.job[0].epoch;
    v->step = s.job[0].step;
    v->committed = s.job[0].committed;
    if (s.job[0].plan) {
        v->plan = sl_xstrdup(s.job[0].plan);
        json_error_t je;
        json_t *pj = json_loads(v->plan, 0, &je), *st;
        size_t k;
        json_array_foreach(json_object_get(pj, "stages"), k, st) if (k < 8) {
            snprintf(v->stage_dev[k], CERT_ID_LEN, "%s",
                     json_string_value(json_object_get(st, "device")) ?: "");
            v->first_unit[k] = (int)json_integer_value(json_object_get(st, "first_unit"));
            v->last_unit[k] = (int)json_integer_value(json_object_get(st, "last_unit"));
            v->p = (int)k + 1;
        }
        json_t *reps = json_object_get(pj, "replicas"), *r;
        v->nrep = (int)json_array_size(reps);
        json_array_foreach(reps, k, r) if (k < 4) snprintf(v->owner[v->nowner++], CERT_ID_LEN, "%s",
                                                         json_string_value(json_object_get(r, "owner")) ?: "");
        if (!v->nrep)
            snprintf(v->owner[v->nowner++], CERT_ID_LEN, "%s",
                     json_string_value(json_object_get(json_object_get(pj, "data"), "owner")) ?: "");
        json_decref(pj);
    }
    coord_snapshot_free(&s);
    return 0;
}

/* Heartbeats until job's state is `want` (and, for running, its epoch at
 * least `epoch`); 0 after WAIT_S. */
static inline int pump_until(const char *job, const char *want, int epoch)
{
    for (double t0 = sl_now_s(); sl_now_s() - t0 < WAIT_S; usleep(20 * 1000)) {
        heartbeat_all();
        jview v;
        if (view(job, &v) == 0) {
            int ok = !strcmp(v.state, want) && v.epoch >= epoch;
            free(v.plan);
            if (ok)
                return 1;
        }
    }
    jview v;
    view(job, &v);
    fprintf(stderr, "job %s: %s in epoch %d, not %s\n", job, v.state, v.epoch, want);
    free(v.plan);
    return 0;
}

/* Heartbeats until device d joined the job and it has d's profile. */
static inline int pump_until_profiled(const char *job, const fdev *d)
{
    for (double t0 = sl_now_s(); sl_now_s() - t0 < WAIT_S; usleep(20 * 1000)) {
        heartbeat_all();
        Skyloom__V1__GetJobRequest q = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
        q.job_id = (char *)job;
        Skyloom__V1__JobInfo *ji = NULL;
        rpc_status st;
        if (call(coord_handle_get_job, CERT_ADMIN_CN, &q, &skyloom__v1__job_info__descriptor,
                 (void **)&ji, &st) != RPC_OK || !ji)
            return 0;
        json_error_t je;
        json_t *pr = json_loads(ji->profiles, 0, &je), *ev = json_loads(ji->events, 0, &je), *e;
        int joining = 0;
        size_t k;
        json_array_foreach(ev, k, e) joining |=
            !strcmp(json_string_value(json_object_get(e, "kind")) ?: "", "joining") &&
            !strcmp(json_string_value(json_object_get(e, "device")) ?: "", d->id);
        int have = joining && json_object_get(json_object_get(pr, d->id), "unit_fwd_s") != NULL;
        json_decref(pr);
        json_decref(ev);
        rpc_unpacked_free(ji);
        if (have)
            return 1;
    }
    fprintf(stderr, "job %s: no profile of %s\n", job, d->name);
    return 0;
}

static inline void report_step(const char *dev, const char *job, int epoch, int stage, int p, int step)
{
    Skyloom__V1__ReportStepRequest q = SKYLOOM__V1__REPORT_STEP_REQUEST__INIT;
    q.device_id = (char *)dev;
    q.job_id = (char *)job;
    q.epoch = (uint32_t)epoch;
    q.stage = (uint32_t)stage;
    q.step = (uint32_t)step;
    q.loss = stage == p - 1 ? 7.0 - 0.125 * step : 0;
    q.grad_norm = 1.5;
    q.lr = 1e-3 * step;
    q.fwd_s = 0.010 * (stage + 1);
    q.bwd_s = 0.020 * (stage + 1);
    q.recv_s = 0.005;
    q.send_s = 0.004;
    q.finish_s = 0.001;
    q.step_s = 0.100;
    q.raw_bytes = stage + 1 < p ? 4096 : 0;
    q.wire_bytes = stage + 1 < p ? 4200 : 0;
    q.raw_bytes_up = stage > 0 ? 2048 : 0;
    q.wire_bytes_up = stage > 0 ? 2100 : 0;
    q.masked = 10;
    rpc_status st;
    void *r = NULL;
    CHECKF(call(coord_handle_report_step, dev, &q, &skyloom__v1__report_step_response__descriptor,
                &r, &st) == RPC_OK, "%s", st.details);
    rpc_unpacked_free(r);
}

/* The bytes of a device's checkpoint part: a safetensors file with one
 * small tensor for each unit the device runs in plan v (a model part, or
 * with ".exp_avg" names an optimizer part), or data.json's text; fixed by
 * the device, the step and the name. */
static inline size_t part_bytes(const fdev *d, const jview *v, int step, const char *name,
                                uint8_t *out, size_t cap)
{
    if (!strncmp(name, "data.", 5))
        return (size_t)snprintf((char *)out, cap, "{\"device\": \"%s\", \"step\": %d}", d->name, step);
    sl_buf h = {0};
    int n = 0, layers = 2, optim = !strncmp(name, "optim.", 6);
    sl_buf_printf(&h, "{");
    for (int i = 0; i < v->p; i++) {
        if (strcmp(v->stage_dev[i], d->id))
            continue;
        for (int u = v->first_unit[i]; u <= v->last_unit[i]; u++, n++) {
            char t[96];
            if (u == 0)
                snprintf(t, sizeof t, "bert.embeddings.LayerNorm.bias");
            else if (u <= layers)
                snprintf(t, sizeof t, "bert.encoder.layer.%d.output.LayerNorm.bias", u - 1);
            else
                snprintf(t, sizeof t, "cls.predictions.bias");
            sl_buf_printf(&h, "%s\"%s%s\": {\"dtype\": \"F32\", \"shape\": [4], "
                          "\"data_offsets\": [%d, %d]}", n ? ", " : "", t, optim ? ".exp_avg" : "",
                          16 * n, 16 * n + 16);
        }
    }
    sl_buf_printf(&h, "}");
    size_t hl = h.n, total = 8 + hl + 16 * (size_t)n;
    if (total > cap)
        total = cap;
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(out + 8, h.s, hl);
    for (size_t i = 8 + hl; i < total; i++)
        out[i] = (uint8_t)(d->name[0] * 7 + step * 13 + name[0] + i);
    free(h.s);
    return total;
}

/* One file of a device's checkpoint part, in two pieces: the code of the
 * first refusal, or RPC_OK. */
static inline int upload(const fdev *d, const jview *v, const char *job, int epoch, int step,
                         const char *name)
{
    uint8_t data[4096], sum[32];
    size_t n = part_bytes(d, v, step, name, data, sizeof data), first = n / 3;
    crypto_generichash(sum, sizeof sum, data, n, NULL, 0);
    for (int piece = 0; piece < 2; piece++) {
        Skyloom__V1__UploadChunkRequest q = SKYLOOM__V1__UPLOAD_CHUNK_REQUEST__INIT;
        q.device_id = (char *)d->id;
        q.job_id = (char *)job;
        q.epoch = (uint32_t)epoch;
        q.step = (uint32_t)step;
        q.name = (char *)name;
        q.offset = piece ? first : 0;
        q.data.data = data + q.offset;
        q.data.len = piece ? n - first : first;
        q.last = piece;
        q.size = n;
        if (piece) {
            q.blake2b.data = sum;
            q.blake2b.len = 32;
        }
        rpc_status st;
        int code = call(coord_handle_upload_chunk, d->id, &q, NULL, NULL, &st);
        if (code != RPC_OK)
            return code;
    }
    return RPC_OK;
}

/* The devices of the running plan train steps up to `to` (reports, then
 * the parts of checkpoint steps, waiting for each commit). Returns RPC_OK,
 * the code of the first upload refused, or RPC_ABORTED when the epoch ended
 * before a commit or before they began (they stop there). */
static inline int train(const char *job, int to, int every)
{
    jview v;
    if (view(job, &v) || strcmp(v.state, "running")) {
        /* the epoch ended before its devices started (a store failure, say) */
        free(v.plan);
        return RPC_ABORTED;
    }
    int code = RPC_OK;
    for (int s = v.step + 1; s <= to && code == RPC_OK; s++) {
        for (int i = v.p - 1; i >= 0; i--)
            report_step(v.stage_dev[i], job, v.epoch, i, v.p, s);
        if (every && s % every == 0) {
            for (int i = 0; i < NDEV; i++) {
                int in = 0;
                for (int k = 0; k < v.p; k++)
                    in |= !strcmp(v.stage_dev[k], D[i].id);
                if (!in)
                    continue;
                char model[96], optim[96];
                snprintf(model, sizeof model, "model.%s.safetensors", D[i].id);
                snprintf(optim, sizeof optim, "optim.%s.safetensors", D[i].id);
                if (code == RPC_OK)
                    code = upload(&D[i], &v, job, v.epoch, s, model);
                if (code == RPC_OK)
                    code = upload(&D[i], &v, job, v.epoch, s, optim);
                int owns = 0;
                for (int o = 0; o < v.nowner; o++)
                    owns |= !strcmp(v.owner[o], D[i].id);
                char data[64];
                snprintf(data, sizeof data, v.nrep > 1 ? "data.%s.json" : "data.json", D[i].id);
                if (code == RPC_OK && owns)
                    code = upload(&D[i], &v, job, v.epoch, s, data);
            }
            if (code != RPC_OK)
                break;
            int committed = 0, ended = 0;
            for (double t0 = sl_now_s(); !committed && !ended && sl_now_s() - t0 < WAIT_S;
                 usleep(10 * 1000)) {
                jview w;
                committed = view(job, &w) == 0 && w.committed >= s;
                ended = !committed && (strcmp(w.state, "running") || w.epoch != v.epoch);
                free(w.plan);
            }
            if (ended) {
                code = RPC_ABORTED;
                break;
            }
            CHECKF(committed, "step %d committed", s);
        }
        heartbeat_all();
    }
    free(v.plan);
    return code;
}

/* Submits a job on data ("ID:NAME[,ID:NAME...]") with options opts: the
 * code, the job id in *id (malloc'd, "" when refused), the refusal in st.
 * submit_code: on D[0]'s "books". */
static inline int submit_data_code(const char *data, const char *opts, char **id, rpc_status *st)
{
    Skyloom__V1__SubmitJobRequest q = SKYLOOM__V1__SUBMIT_JOB_REQUEST__INIT;
    q.config = (char *)(cf_config ? cf_config : CF_CONFIG);
    q.data = (char *)data;
    q.options = (char *)opts;
    Skyloom__V1__SubmitJobResponse *r = NULL;
    int code = call(coord_handle_submit_job, CERT_ADMIN_CN, &q,
                    &skyloom__v1__submit_job_response__descriptor, (void **)&r, st);
    *id = sl_xstrdup(r ? r->job_id : "");
    rpc_unpacked_free(r);
    return code;
}

static inline int submit_code(const char *opts, char **id, rpc_status *st)
{
    char data[96];
    snprintf(data, sizeof data, "%s:books", D[0].id);
    return submit_data_code(data, opts, id, st);
}

static inline char *submit(const char *opts)
{
    char *id;
    rpc_status st;
    CHECKF(submit_code(opts, &id, &st) == RPC_OK, "%s", st.details);
    return id;
}


/* A PKI and state under a new temporary root, the coordinator open on them,
 * the devices enrolled and heard from. */
static inline void cf_open(const char *tag, unsigned heartbeat_ms)
{
    tu_tmpdir(root, sizeof root, tag);
    tu_pki(root, "pki", pki, sizeof pki);
    snprintf(state, sizeof state, "%s/state", root);
    rpc_global_init();
    if (sodium_init() < 0)
        exit(1);
    sl_err err = {0};
    O = (coord_opts){.listen = "127.0.0.1:0", .pki = pki, .state = state, .heartbeat_ms = heartbeat_ms};
    C = coord_open(&O, &err);
    if (!C) {
        fprintf(stderr, "coord_open: %s\n", err.msg);
        exit(1);
    }
    for (int i = 0; i < NDEV; i++)
        enroll(&D[i]);
    heartbeat_all();
}

static inline void cf_close(void)
{
    coord_close(C);
    rpc_global_shutdown();
}

#endif
