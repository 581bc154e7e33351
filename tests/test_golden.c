/* Whole jobs through the coordinator's handlers, with devices played by
 * this process, compared with recorded traces (tests/golden/NAME.txt): the
 * job's state transitions, its events (kind, device, epoch, step, committed
 * step and detail), every plan it signed, its metrics.csv and the manifest
 * of its last committed step. The devices answer every task with fixed
 * figures, so a trace depends only on what the job manager decides: the
 * traces hold it to the same decisions whatever shape its code takes.
 *
 * Jobs: one that runs to the end; one whose run fails on a device (every
 * device reports it); one that loses a device (no heartbeat, nobody
 * reports; it comes back); one across a coordinator restart; one whose
 * checkpoint store refuses a step.
 *
 * SKYLOOM_GOLDEN_WRITE=1 writes the traces instead of comparing them. */
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

#define NDEV 3
#define WAIT_S 30.0

static char root[256], pki[512], state[512], logpath[600], golden_dir[4096];
static coord *C;
static coord_opts O;
static int saved_stderr = -1;

typedef int (*handler_fn)(void *, const rpc_peer *, const uint8_t *, size_t, rpc_buf *, rpc_status *);

static int call(handler_fn fn, const char *who, const void *msg, const void *rdesc, void **out,
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

/* ---- the devices ------------------------------------------------------------ */

typedef struct fdev {
    const char *name, *site, *dataset;
    char id[CERT_ID_LEN];
    double speed;  /* its units take this many times the base figures */
    int alive;     /* heartbeats and answers tasks */
} fdev;

static fdev D[NDEV] = {
    {"A", "lab-a", "books", "", 1.0, 1},
    {"B", "lab-a", NULL, "", 1.0, 1},
    {"C", "lab-b", NULL, "", 1.5, 1},
};

static const char *token_secret(const char *site, char *out)
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

static void enroll(fdev *d)
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

static fdev *dev_by_id(const char *id)
{
    for (int i = 0; i < NDEV; i++)
        if (!strcmp(D[i].id, id))
            return &D[i];
    return NULL;
}

static void report_task(const fdev *d, const char *job, const char *kind, uint32_t epoch, int ok,
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
static char *profile_result(const fdev *d, json_t *spec)
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
    }
    if (round)
        json_object_set_new(res, "round", json_string(round));
    char *text = json_dumps(res, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(res);
    return text;
}

/* One heartbeat of device d; its check and profile tasks answered. */
static void heartbeat(fdev *d)
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
                        "{\"sequences\": 100, \"seq_len\": 8, \"first\": 0, \"vocab_size\": 100}");
        } else if (!strcmp(t->kind, "profile")) {
            char *res = profile_result(d, spec);
            report_task(d, t->job_id, "profile", t->epoch, 1, NULL, res);
            free(res);
        }
        json_decref(spec);
    }
    rpc_unpacked_free(r);
}

static void heartbeat_all(void)
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
    char *plan;
} jview;

static int view(const char *job, jview *v)
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
            v->p = (int)k + 1;
        }
        json_decref(pj);
    }
    coord_snapshot_free(&s);
    return 0;
}

/* Heartbeats until job's state is `want` (and, for running, its epoch at
 * least `epoch`); 0 after WAIT_S. */
static int pump_until(const char *job, const char *want, int epoch)
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
static int pump_until_profiled(const char *job, const fdev *d)
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

static void report_step(const char *dev, const char *job, int epoch, int stage, int p, int step)
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

/* One file of a device's checkpoint part, in two pieces: the code of the
 * first refusal, or RPC_OK. */
static int upload(const fdev *d, const char *job, int epoch, int step, const char *name)
{
    uint8_t data[300], sum[32];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(d->name[0] * 7 + step * 13 + name[0] + i);
    crypto_generichash(sum, sizeof sum, data, sizeof data, NULL, 0);
    for (int piece = 0; piece < 2; piece++) {
        Skyloom__V1__UploadChunkRequest q = SKYLOOM__V1__UPLOAD_CHUNK_REQUEST__INIT;
        q.device_id = (char *)d->id;
        q.job_id = (char *)job;
        q.epoch = (uint32_t)epoch;
        q.step = (uint32_t)step;
        q.name = (char *)name;
        q.offset = piece ? 100 : 0;
        q.data.data = data + q.offset;
        q.data.len = piece ? sizeof data - 100 : 100;
        q.last = piece;
        q.size = sizeof data;
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
 * or the code of the first upload refused (it stops there). */
static int train(const char *job, int to, int every)
{
    jview v;
    CHECK(view(job, &v) == 0 && !strcmp(v.state, "running"));
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
                    code = upload(&D[i], job, v.epoch, s, model);
                if (code == RPC_OK)
                    code = upload(&D[i], job, v.epoch, s, optim);
                if (code == RPC_OK && D[i].dataset)
                    code = upload(&D[i], job, v.epoch, s, "data.json");
            }
            if (code != RPC_OK)
                break;
            int committed = 0;
            for (double t0 = sl_now_s(); !committed && sl_now_s() - t0 < WAIT_S; usleep(10 * 1000)) {
                jview w;
                committed = view(job, &w) == 0 && w.committed >= s;
                free(w.plan);
            }
            CHECKF(committed, "step %d committed", s);
        }
        heartbeat_all();
    }
    free(v.plan);
    return code;
}

static char *submit(const char *opts)
{
    Skyloom__V1__SubmitJobRequest q = SKYLOOM__V1__SUBMIT_JOB_REQUEST__INIT;
    char data[96];
    snprintf(data, sizeof data, "%s:books", D[0].id);
    q.config = "{\"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
               " \"intermediate_size\": 32, \"vocab_size\": 100, \"max_position_embeddings\": 16}";
    q.data = data;
    q.options = (char *)opts;
    Skyloom__V1__SubmitJobResponse *r = NULL;
    rpc_status st;
    CHECKF(call(coord_handle_submit_job, CERT_ADMIN_CN, &q,
                &skyloom__v1__submit_job_response__descriptor, (void **)&r, &st) == RPC_OK,
           "%s", st.details);
    char *id = sl_xstrdup(r ? r->job_id : "");
    rpc_unpacked_free(r);
    return id;
}

/* ---- the trace ---------------------------------------------------------------- */

/* s with every occurrence of `from` replaced by `to`. */
static char *replace(char *s, const char *from, const char *to)
{
    size_t nf = strlen(from), nt = strlen(to);
    if (!nf)
        return s;
    sl_buf b = {0};
    for (const char *p = s;;) {
        const char *q = strstr(p, from);
        if (!q) {
            sl_buf_printf(&b, "%s", p);
            break;
        }
        sl_buf_printf(&b, "%.*s%.*s", (int)(q - p), p, (int)nt, to);
        p = q + nf;
    }
    free(s);
    return b.s ? b.s : sl_xstrdup("");
}

/* The number after each `marker` replaced by '#' (a duration measured). */
static char *blank_after(char *s, const char *marker)
{
    size_t n = strlen(marker);
    for (char *p = s; (p = strstr(p, marker));) {
        p += n;
        char *e = p;
        while ((*e >= '0' && *e <= '9') || *e == '.' || *e == '-')
            e++;
        if (e > p) {
            *p = '#';
            memmove(p + 1, e, strlen(e) + 1);
        }
    }
    return s;
}

static char *normalize(char *s, const char *job)
{
    s = replace(s, state, "STATE");
    s = replace(s, job, "J");
    for (int i = 0; i < NDEV; i++)
        s = replace(s, D[i].id, D[i].name);
    s = blank_after(s, "planned in ");
    s = blank_after(s, "completed ");
    s = blank_after(s, "no heartbeat for ");
    return s;
}

/* The lines of the log that say job's state, as "state reason". */
static void trace_states(sl_buf *out, const char *job)
{
    fflush(stderr);
    char *text = NULL;
    size_t n = 0;
    sl_err err = {0};
    if (sl_read_file(logpath, 64u << 20, &text, &n, &err))
        return;
    char want[64];
    snprintf(want, sizeof want, "coordinator: job job=%s state=", job);
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        char *p = strstr(line, want);
        if (p)
            sl_buf_printf(out, "state %s\n", p + strlen(want));
        line = nl ? nl + 1 : NULL;
    }
    free(text);
}

static void trace_events(sl_buf *out, const char *job)
{
    Skyloom__V1__GetJobRequest q = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    q.job_id = (char *)job;
    q.metrics_from = 1;
    Skyloom__V1__JobInfo *ji = NULL;
    rpc_status st;
    CHECKF(call(coord_handle_get_job, CERT_ADMIN_CN, &q, &skyloom__v1__job_info__descriptor,
                (void **)&ji, &st) == RPC_OK && ji, "%s", st.details);
    if (!ji)
        return;
    json_error_t je;
    json_t *ev = json_loads(ji->events, 0, &je), *e;
    size_t k;
    json_array_foreach(ev, k, e)
        sl_buf_printf(out, "event %s device=%s epoch=%lld step=%lld committed=%lld: %s\n",
                      json_string_value(json_object_get(e, "kind")),
                      json_string_value(json_object_get(e, "device")),
                      (long long)json_integer_value(json_object_get(e, "epoch")),
                      (long long)json_integer_value(json_object_get(e, "step")),
                      (long long)json_integer_value(json_object_get(e, "committed_step")),
                      json_string_value(json_object_get(e, "detail")));
    json_decref(ev);
    sl_buf_printf(out, "summary state=%s step=%u committed=%u loss=%.4f reason=%s\n",
                  ji->summary->state, ji->summary->step, ji->summary->committed_step,
                  ji->summary->loss, ji->summary->reason);
    rpc_unpacked_free(ji);
}

/* A signed plan without what changes from run to run (the job's number, the
 * devices' indexes). */
static void trace_plan(sl_buf *out, const char *plan)
{
    json_error_t je;
    json_t *pj = json_loads(plan, 0, &je);
    if (!pj)
        return;
    json_object_set_new(pj, "job_num", json_integer(0));
    /* the candidates' order after a restart follows their ids, which are
     * random: the balancer's index of a device with it */
    json_t *st;
    size_t k;
    json_array_foreach(json_object_get(json_object_get(pj, "balancer"), "stages"), k, st)
        json_object_del(st, "device_index");
    char *t = json_dumps(pj, JSON_INDENT(1) | JSON_SORT_KEYS);
    sl_buf_printf(out, "plan\n%s\n", t);
    free(t);
    json_decref(pj);
}

static void trace_file(sl_buf *out, const char *job, const char *sub)
{
    char p[4096], *text = NULL;
    size_t n = 0;
    sl_err err = {0};
    snprintf(p, sizeof p, "%s/jobs/%s/%s", state, job, sub);
    if (sl_read_file(p, 1 << 20, &text, &n, &err)) {
        sl_buf_printf(out, "file %s: none\n", sub);
        return;
    }
    sl_buf_printf(out, "file %s\n%s\n", sub, text);
    free(text);
}

/* Compares (or writes) the trace of `name`. */
static void golden(const char *name, const char *job, char **plans, int nplans, int committed)
{
    sl_buf b = {0};
    trace_states(&b, job);
    trace_events(&b, job);
    for (int i = 0; i < nplans; i++)
        trace_plan(&b, plans[i]);
    trace_file(&b, job, "metrics.csv");
    char sub[64];
    snprintf(sub, sizeof sub, "ckpt/step-%d/manifest.json", committed);
    trace_file(&b, job, sub);
    char *got = normalize(b.s ? b.s : sl_xstrdup(""), job);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.txt", golden_dir, name);
    sl_err err = {0};
    if (getenv("SKYLOOM_GOLDEN_WRITE")) {
        CHECKF(!sl_write_file_atomic(path, got, strlen(got), &err), "%s", err.msg);
    } else {
        char *want = NULL;
        size_t n = 0;
        int rc = sl_read_file(path, 1 << 24, &want, &n, &err);
        CHECKF(rc == 0, "%s", err.msg);
        if (rc == 0 && strcmp(want, got)) {
            char out[4300];
            snprintf(out, sizeof out, "%s/%s.got", root, name);
            sl_write_file_atomic(out, got, strlen(got), &err);
            char cmd[9000];
            snprintf(cmd, sizeof cmd, "diff -u %s %s >&%d", path, out, saved_stderr);
            CHECKF(0, "trace %s differs:", name);
            if (system(cmd) < 0)
                perror("diff");
        }
        free(want);
    }
    free(got);
}

/* Adds the plan of the job's current epoch to plans[] if it is new. */
static void keep_plan(const char *job, char **plans, int *n)
{
    jview v;
    if (view(job, &v) || !v.plan)
        return;
    if (*n == 0 || strcmp(plans[*n - 1], v.plan))
        plans[(*n)++] = v.plan;
    else
        free(v.plan);
}

/* ---- the jobs ------------------------------------------------------------------- */

static const char *const OPTS = "{\"steps\": 6, \"batch\": 4, \"micro_batches\": 2, "
                                "\"checkpoint_every\": 2, \"algo\": \"optimal\"}";

static void test_runs(void)
{
    char *job = submit(OPTS), *plans[4];
    int np = 0;
    CHECK(pump_until(job, "running", 1));
    keep_plan(job, plans, &np);
    CHECK(train(job, 6, 2) == RPC_OK);
    CHECK(pump_until(job, "done", 1));
    golden("runs", job, plans, np, 6);
    for (int i = 0; i < np; i++)
        free(plans[i]);
    free(job);
}

/* Every device of the plan reports that its run failed (one of them its own
 * failure): the job runs again from its committed step in a new epoch. */
static void test_run_failure(void)
{
    char *job = submit(OPTS), *plans[4];
    int np = 0;
    CHECK(pump_until(job, "running", 1));
    keep_plan(job, plans, &np);
    CHECK(train(job, 3, 2) == RPC_OK);
    jview v;
    view(job, &v);
    for (int i = 0; i < v.p; i++) {
        const fdev *d = dev_by_id(v.stage_dev[i]);
        if (!d || (i && !strcmp(v.stage_dev[i], v.stage_dev[i - 1])))
            continue;
        if (d == &D[1])
            report_task(d, job, "run", (uint32_t)v.epoch, 0, "out of memory in stage 1", "");
        else {
            char lost[64];
            snprintf(lost, sizeof lost, "{\"lost\": \"%s\"}", D[1].id);
            report_task(d, job, "run", (uint32_t)v.epoch, 0, "the link to a neighbour broke", lost);
        }
    }
    free(v.plan);
    CHECK(pump_until(job, "running", 2));
    keep_plan(job, plans, &np);
    CHECK(train(job, 6, 2) == RPC_OK);
    CHECK(pump_until(job, "done", 2));
    golden("run_failure", job, plans, np, 6);
    for (int i = 0; i < np; i++)
        free(plans[i]);
    free(job);
}

/* Device B stops (no heartbeat) and nobody reports: it is lost, and the job
 * runs on without it from its committed step. Then it comes back: it is
 * profiled as a joiner and weighed at the next commit. */
static void test_device_lost(void)
{
    char *job = submit(OPTS), *plans[4];
    int np = 0;
    CHECK(pump_until(job, "running", 1));
    keep_plan(job, plans, &np);
    CHECK(train(job, 3, 2) == RPC_OK);
    D[1].alive = 0;
    CHECK(pump_until(job, "running", 2));
    keep_plan(job, plans, &np);
    CHECK(train(job, 3, 2) == RPC_OK);
    /* B comes back: it is profiled, and weighed at the next commit */
    D[1].alive = 1;
    CHECK(pump_until_profiled(job, &D[1]));
    CHECK(train(job, 4, 2) == RPC_OK);
    CHECK(pump_until(job, "running", 3));
    keep_plan(job, plans, &np);
    CHECK(train(job, 6, 2) == RPC_OK);
    CHECK(pump_until(job, "done", 3));
    golden("device_lost", job, plans, np, 6);
    for (int i = 0; i < np; i++)
        free(plans[i]);
    free(job);
}

/* The coordinator restarts after step 3 (step 2 committed): the job goes on
 * from step 3 in a new epoch once the plan's devices are back. */
static void test_restart(void)
{
    char *job = submit(OPTS), *plans[4];
    int np = 0;
    CHECK(pump_until(job, "running", 1));
    keep_plan(job, plans, &np);
    CHECK(train(job, 3, 2) == RPC_OK);
    coord_close(C);
    sl_err err = {0};
    C = coord_open(&O, &err);
    CHECKF(C, "coord_open: %s", err.msg);
    if (!C)
        exit(1);
    CHECK(pump_until(job, "running", 2));
    keep_plan(job, plans, &np);
    CHECK(train(job, 6, 2) == RPC_OK);
    CHECK(pump_until(job, "done", 2));
    golden("restart", job, plans, np, 6);
    for (int i = 0; i < np; i++)
        free(plans[i]);
    free(job);
}

/* The checkpoint store cannot take step 4 (its directory's name is taken
 * by a file): the job waits, keeps step 2 committed, and runs again from it
 * once the store takes writes. */
static void test_store_failed(void)
{
    char *job = submit(OPTS), *plans[4];
    int np = 0;
    CHECK(pump_until(job, "running", 1));
    keep_plan(job, plans, &np);
    CHECK(train(job, 3, 2) == RPC_OK);
    char blocker[4096];
    snprintf(blocker, sizeof blocker, "%s/jobs/%s/ckpt/step-4.partial", state, job);
    FILE *f = fopen(blocker, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    CHECK(train(job, 4, 2) == RPC_UNAVAILABLE);
    CHECK(pump_until(job, "waiting", 1));
    unlink(blocker);
    CHECK(pump_until(job, "running", 2));
    keep_plan(job, plans, &np);
    CHECK(train(job, 6, 2) == RPC_OK);
    CHECK(pump_until(job, "done", 2));
    golden("store_failed", job, plans, np, 6);
    for (int i = 0; i < np; i++)
        free(plans[i]);
    free(job);
}

int main(int argc, char **argv)
{
    snprintf(golden_dir, sizeof golden_dir, "%s", argc > 1 ? argv[1] : "tests/golden");
    tu_tmpdir(root, sizeof root, "golden");
    tu_pki(root, "pki", pki, sizeof pki);
    snprintf(state, sizeof state, "%s/state", root);
    snprintf(logpath, sizeof logpath, "%s/log", root);
    /* the coordinator's log says each state it gives a job */
    saved_stderr = dup(2);
    if (!freopen(logpath, "w", stderr)) {
        perror(logpath);
        return 1;
    }
    setvbuf(stderr, NULL, _IOLBF, 0);
    sl_log_set_level(SL_LOG_INFO);
    rpc_global_init();
    if (sodium_init() < 0)
        return 1;
    sl_err err = {0};
    O = (coord_opts){.listen = "127.0.0.1:0", .pki = pki, .state = state, .heartbeat_ms = 1000};
    C = coord_open(&O, &err);
    if (!C) {
        fprintf(stderr, "coord_open: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < NDEV; i++)
        enroll(&D[i]);
    heartbeat_all();
    RUN(test_runs);
    RUN(test_run_failure);
    RUN(test_device_lost);
    RUN(test_restart);
    RUN(test_store_failed);
    coord_close(C);
    rpc_global_shutdown();
    fflush(stderr);
    /* what the test itself said goes back to its stderr */
    char *text = NULL;
    size_t n = 0;
    if (!sl_read_file(logpath, 64u << 20, &text, &n, &err))
        for (char *line = text; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl)
                *nl = 0;
            if (strstr(line, "CHECK failed") || strstr(line, "differs") || !strncmp(line, "job ", 4))
                dprintf(saved_stderr, "%s\n", line);
            line = nl ? nl + 1 : NULL;
        }
    free(text);
    if (!getenv("SKYLOOM_GOLDEN_KEEP"))
        tu_rmtree(root);
    return sl_test_done();
}
