/* What the coordinator shows about itself, without devices processes: two
 * devices enrolled through the handlers, a job checked, profiled and
 * planned, step reports with ops and frame refusals, a checkpoint piece.
 * Checked: the snapshot (stage figures, link bytes, the refusals summed
 * over devices, the trace of the latest step every stage traced, a bad
 * trace ignored), the trace through GetJob and back, the Prometheus text,
 * the dashboard's pages, enrollment refusals by reason, and the HTTP
 * server: routes, methods, loopback only without a token, the token
 * required with one. */
#include <arpa/inet.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "cert.h"
#include "coord.h"
#include "coord_internal.h"
#include "coord_obs.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_test.h"
#include "sl_time.h"
#include "trust_util.h"

static char root[256], pki[512], state[512];
static coord *C;
static coord_opts O;

typedef int (*handler_fn)(void *, const rpc_peer *, const uint8_t *, size_t, rpc_buf *, rpc_status *);

/* Calls a handler with a packed message; the reply unpacked into *out. */
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

static int enroll(const char *key, const char *site, const char *secret, char id[CERT_ID_LEN])
{
    sl_err err = {0};
    uint8_t *csr = NULL;
    size_t len = 0;
    if (cert_key_generate(key, &err) || cert_csr_create(key, "host", &csr, &len, &err)) {
        fprintf(stderr, "key: %s\n", err.msg);
        exit(1);
    }
    Skyloom__V1__EnrollRequest q = SKYLOOM__V1__ENROLL_REQUEST__INIT;
    q.token = (char *)secret;
    q.csr_der.data = csr;
    q.csr_der.len = len;
    q.site = (char *)site;
    q.name = "host";
    Skyloom__V1__EnrollResponse *r = NULL;
    rpc_status st;
    int code = call(coord_handle_enroll, NULL, &q, &skyloom__v1__enroll_response__descriptor,
                    (void **)&r, &st);
    if (r && id)
        snprintf(id, CERT_ID_LEN, "%s", r->device_id);
    rpc_unpacked_free(r);
    free(csr);
    return code;
}

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

/* A heartbeat of device `id` (serving `dataset` if not NULL); the reply with
 * its tasks. */
static Skyloom__V1__HeartbeatResponse *heartbeat_reply(const char *id, const char *dataset)
{
    Skyloom__V1__HeartbeatRequest q = SKYLOOM__V1__HEARTBEAT_REQUEST__INIT;
    uint8_t key[32];
    memset(key, id[1], sizeof key);
    char *ds[1] = {(char *)dataset};
    q.device_id = (char *)id;
    q.seq = 1;
    q.stage_address = "127.0.0.1:9";
    q.datasets = ds;
    q.n_datasets = dataset ? 1 : 0;
    q.link_public_key.data = key;
    q.link_public_key.len = 32;
    q.threads = 2;
    rpc_status st;
    void *r = NULL;
    CHECKF(call(coord_handle_heartbeat, id, &q, &skyloom__v1__heartbeat_response__descriptor, &r,
                &st) == RPC_OK, "%s", st.details);
    return r;
}

static void heartbeat(const char *id, const char *dataset)
{
    rpc_unpacked_free(heartbeat_reply(id, dataset));
}

static void report_task(const char *dev, const char *job, const char *kind, const char *result)
{
    Skyloom__V1__ReportTaskRequest q = SKYLOOM__V1__REPORT_TASK_REQUEST__INIT;
    q.device_id = (char *)dev;
    q.job_id = (char *)job;
    q.kind = (char *)kind;
    q.ok = 1;
    q.result = (char *)result;
    rpc_status st;
    CHECKF(call(coord_handle_report_task, dev, &q, NULL, NULL, &st) == RPC_OK, "%s", st.details);
}

/* A state of job `id` within `secs`. */
static int wait_state_for(const char *id, const char *want, double secs)
{
    for (double t0 = sl_now_s();; usleep(20 * 1000)) {
        coord_snapshot s;
        int rc = coord_jobs_snapshot(C->jobs, id, &s);
        int ok = rc == 0 && !strcmp(s.job[0].state, want);
        coord_snapshot_free(&s);
        if (ok)
            return 1;
        if (sl_now_s() - t0 >= secs)
            return 0;
    }
}

static int wait_state(const char *id, const char *want) { return wait_state_for(id, want, 15); }

/* Submits a 4-step job on devices a (data owner of `dataset`) and the
 * others in `devices` (a JSON array of them all) into job[32], placed by
 * `algo`. */
static void submit_algo(const char *a, const char *devices, const char *dataset, const char *algo,
                        char *job)
{
    Skyloom__V1__SubmitJobRequest sq = SKYLOOM__V1__SUBMIT_JOB_REQUEST__INIT;
    char data[96], opts[1024];
    snprintf(data, sizeof data, "%s:%s", a, dataset);
    snprintf(opts, sizeof opts, "{\"steps\": 4, \"batch\": 4, \"micro_batches\": 2, \"algo\": \"%s\","
             " \"u_shape\": false, \"devices\": %s, \"checkpoint_every\": 0}", algo, devices);
    sq.config = "{\"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
                " \"intermediate_size\": 32, \"vocab_size\": 100, \"max_position_embeddings\": 16}";
    sq.data = data;
    sq.options = opts;
    Skyloom__V1__SubmitJobResponse *sr = NULL;
    rpc_status st;
    CHECKF(call(coord_handle_submit_job, CERT_ADMIN_CN, &sq, &skyloom__v1__submit_job_response__descriptor,
                (void **)&sr, &st) == RPC_OK, "%s", st.details);
    if (sr)
        snprintf(job, 32, "%s", sr->job_id);
    rpc_unpacked_free(sr);
}

/* submit_on() devices a and b. */
static void submit(const char *a, const char *b, const char *dataset, char *job)
{
    char devs[96];
    snprintf(devs, sizeof devs, "[\"%s\", \"%s\"]", a, b);
    submit_algo(a, devs, dataset, "even", job);
}

/* submit(), and a checks it: the job is then profiling. */
static void submit_checked(const char *a, const char *b, const char *dataset, char *job)
{
    submit(a, b, dataset, job);
    heartbeat(a, dataset); /* online when the job looks for candidates */
    heartbeat(b, NULL);
    report_task(a, job, "check", "{\"sequences\": 100, \"seq_len\": 8, \"first\": 0, \"vocab_size\": 100}");
    CHECK(wait_state(job, "profiling"));
}

/* Both devices report their units (a profile of round `round`, or whole
 * with NULL): the job is then planned and running. */
static void profiled(const char *a, const char *b, const char *job, const char *round)
{
    char prof[512];
    snprintf(prof, sizeof prof, "{%s%s%s\"unit_fwd_s\": [0.001, 0.002, 0.002, 0.001], "
             "\"unit_bwd_s\": [0.002, 0.004, 0.004, 0.002], \"memory_bytes\": 1000000000,"
             " \"threads\": 2, \"backend\": \"cpu\", \"links\": []}", round ? "\"round\": \"" : "",
             round ? round : "", round ? "\", " : "");
    report_task(a, job, "profile", prof);
    report_task(b, job, "profile", prof);
    CHECK(wait_state(job, "running"));
}

typedef struct seg {
    int kind, mb;
    double a, b;
} seg;

static int report_step(const char *dev, const char *job, int epoch, int stage, int step,
                       const seg *ops, int nops, const char *const *names, const uint64_t *counts,
                       int ncounts)
{
    Skyloom__V1__ReportStepRequest q = SKYLOOM__V1__REPORT_STEP_REQUEST__INIT;
    q.device_id = (char *)dev;
    q.job_id = (char *)job;
    q.epoch = (uint32_t)epoch;
    q.stage = (uint32_t)stage;
    q.step = (uint32_t)step;
    q.loss = 5.5;
    q.fwd_s = 0.010;
    q.bwd_s = 0.020;
    q.recv_s = 0.005;
    q.send_s = 0.004;
    q.finish_s = 0.001;
    q.step_s = 0.050;
    q.raw_bytes = stage == 0 ? 1000 : 0;
    q.wire_bytes = stage == 0 ? 1100 : 0;
    q.raw_bytes_up = stage == 1 ? 500 : 0;
    q.wire_bytes_up = stage == 1 ? 560 : 0;
    q.masked = 10;
    Skyloom__V1__OpSegment sv[16], *sp[16];
    for (int i = 0; i < nops; i++) {
        skyloom__v1__op_segment__init(&sv[i]);
        sv[i].kind = (Skyloom__V1__OpKind)ops[i].kind;
        sv[i].micro_batch = ops[i].mb;
        sv[i].start_s = ops[i].a;
        sv[i].end_s = ops[i].b;
        sp[i] = &sv[i];
    }
    q.ops = sp;
    q.n_ops = (size_t)nops;
    Skyloom__V1__Count cv[8], *cp[8];
    for (int i = 0; i < ncounts; i++) {
        skyloom__v1__count__init(&cv[i]);
        cv[i].name = (char *)names[i];
        cv[i].value = counts[i];
        cp[i] = &cv[i];
    }
    q.frames_refused = cp;
    q.n_frames_refused = (size_t)ncounts;
    rpc_status st;
    void *r = NULL;
    int code = call(coord_handle_report_step, dev, &q, &skyloom__v1__report_step_response__descriptor,
                    &r, &st);
    CHECKF(code == RPC_OK, "%s", st.details);
    rpc_unpacked_free(r);
    return code;
}

/* A step report of stage `stage` that says it sent raw and wire bytes for a
 * replica sync: the call's code. */
static int report_sync(const char *dev, const char *job, int epoch, int stage, int step, uint64_t raw,
                       uint64_t wire, rpc_status *st)
{
    Skyloom__V1__ReportStepRequest q = SKYLOOM__V1__REPORT_STEP_REQUEST__INIT;
    q.device_id = (char *)dev;
    q.job_id = (char *)job;
    q.epoch = (uint32_t)epoch;
    q.stage = (uint32_t)stage;
    q.step = (uint32_t)step;
    q.loss = 5.5;
    q.step_s = 0.050;
    q.raw_bytes_sync = raw;
    q.wire_bytes_sync = wire;
    void *r = NULL;
    int code = call(coord_handle_report_step, dev, &q, &skyloom__v1__report_step_response__descriptor,
                    &r, st);
    rpc_unpacked_free(r);
    return code;
}

/* metrics.csv's row of `step` (the effects that write it may lag the call
 * that made it): 1 and the row in out. */
static int metrics_row(const char *job, int step, char *out, size_t cap)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/jobs/%s/metrics.csv", state, job);
    for (double t0 = sl_now_s(); sl_now_s() - t0 < 15; usleep(20 * 1000)) {
        char *buf = NULL;
        size_t n = 0;
        sl_err err = {0};
        if (sl_read_file(path, 1 << 20, &buf, &n, &err))
            continue;
        for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (nl)
                *nl = 0;
            if (line != buf && atoi(line) == step) {
                snprintf(out, cap, "%s", line);
                free(buf);
                return 1;
            }
        }
        free(buf);
    }
    return 0;
}

/* ---- HTTP, by hand -------------------------------------------------------------- */

/* One request to 127.0.0.1:port (Host: host, or 127.0.0.1:port when NULL);
 * the status, and the body into *body. */
static int http_host(int port, const char *host, const char *method, const char *path,
                     const char *auth, char **body)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    char req[1024];
    char hbuf[64];
    snprintf(hbuf, sizeof hbuf, "127.0.0.1:%d", port);
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: %s\r\n%s%s%sConnection: close\r\n\r\n",
                     method, path, host ? host : hbuf, auth ? "Authorization: " : "", auth ? auth : "",
                     auth ? "\r\n" : "");
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = sl_xmalloc(cap);
    for (ssize_t k; (k = read(fd, buf + len, cap - len - 1)) > 0;) {
        len += (size_t)k;
        if (len + 1 == cap)
            buf = sl_xrealloc(buf, cap *= 2);
    }
    buf[len] = 0;
    close(fd);
    int status = -1;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    char *b = strstr(buf, "\r\n\r\n");
    if (body)
        *body = sl_xstrdup(b ? b + 4 : "");
    free(buf);
    return status;
}

static int http(int port, const char *method, const char *path, const char *auth, char **body)
{
    return http_host(port, NULL, method, path, auth, body);
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p++)
        n++;
    return n;
}

/* A checkpoint file sent in pieces: pieces out of order are refused, a file
 * whose sum (or size) differs at its last piece is refused and removed, and
 * the same file sent again from its start is taken. */
static int upload_piece(const char *dev, const char *job, int epoch, const char *name,
                        const uint8_t *p, size_t off, size_t n, int last, size_t size,
                        const uint8_t sum[32], rpc_status *st)
{
    Skyloom__V1__UploadChunkRequest q = SKYLOOM__V1__UPLOAD_CHUNK_REQUEST__INIT;
    q.device_id = (char *)dev;
    q.job_id = (char *)job;
    q.epoch = (uint32_t)epoch;
    q.step = 4;
    q.name = (char *)name;
    q.offset = off;
    q.data.data = (uint8_t *)p + off;
    q.data.len = n;
    q.last = last;
    q.size = size;
    if (last) {
        q.blake2b.data = (uint8_t *)sum;
        q.blake2b.len = 32;
    }
    return call(coord_handle_upload_chunk, dev, &q, NULL, NULL, st);
}

static void test_upload_damaged(const char *dev, const char *job, int epoch)
{
    enum { SIZE = 300 };
    uint8_t file[SIZE + 1], sum[32], wrong[32]; /* (one byte more for a piece past the end) */
    for (size_t i = 0; i < sizeof file; i++)
        file[i] = (uint8_t)(i * 7 + 3);
    /* a safetensors header naming no tensor (the store reads it at the last piece) */
    memcpy(file, "\x02\0\0\0\0\0\0\0{}", 10);
    crypto_generichash(sum, sizeof sum, file, SIZE, NULL, 0);
    memcpy(wrong, sum, sizeof wrong);
    wrong[5] ^= 1;
    char name[64], path[PATH_MAX];
    snprintf(name, sizeof name, "optim.%s.safetensors", dev);
    snprintf(path, sizeof path, "%s/jobs/%s/ckpt/step-4.partial/%s", state, job, name);
    rpc_status st;
    struct stat sb;
    CHECKF(upload_piece(dev, job, epoch, name, file, 0, 100, 0, 0, NULL, &st) == RPC_OK, "%s", st.details);
    CHECK(upload_piece(dev, job, epoch, name, file, 150, 50, 0, 0, NULL, &st) == RPC_OUT_OF_RANGE &&
          strstr(st.details, "expected 100"));
    CHECKF(upload_piece(dev, job, epoch, name, file, 100, 100, 0, 0, NULL, &st) == RPC_OK, "%s", st.details);
    /* the last piece: the sum differs */
    CHECK(upload_piece(dev, job, epoch, name, file, 200, 100, 1, SIZE, wrong, &st) ==
              RPC_DATA_LOSS && strstr(st.details, "arrived damaged"));
    CHECK(stat(path, &sb) != 0);
    /* a piece of the old attempt is refused: the file starts again at 0 */
    CHECK(upload_piece(dev, job, epoch, name, file, 100, 100, 0, 0, NULL, &st) == RPC_OUT_OF_RANGE);
    /* the size differs */
    CHECKF(upload_piece(dev, job, epoch, name, file, 0, 200, 0, 0, NULL, &st) == RPC_OK, "%s", st.details);
    CHECK(upload_piece(dev, job, epoch, name, file, 200, 100, 1, SIZE + 1, sum, &st) ==
          RPC_DATA_LOSS);
    /* sent again whole: taken, the bytes on disk are the file's */
    CHECKF(upload_piece(dev, job, epoch, name, file, 0, 120, 0, 0, NULL, &st) == RPC_OK, "%s", st.details);
    CHECKF(upload_piece(dev, job, epoch, name, file, 120, 180, 1, SIZE, sum, &st) == RPC_OK,
           "%s", st.details);
    char *back = NULL;
    size_t n = 0;
    sl_err err = {0};
    CHECKF(sl_read_file(path, 1 << 20, &back, &n, &err) == 0 && n == SIZE &&
               !memcmp(back, file, n), "%s", err.msg);
    free(back);
    /* and once done, no piece more */
    CHECK(upload_piece(dev, job, epoch, name, file, 300, 1, 0, 0, NULL, &st) == RPC_OUT_OF_RANGE);
}

static void test_http(const char *job)
{
    sl_err err = {0};
    coord_http_opts ho = {.listen = "127.0.0.1:0"};
    coord_http *h = coord_http_start(C, &ho, &err);
    CHECKF(h != NULL, "%s", err.msg);
    if (!h)
        return;
    int port = coord_http_port(h);
    CHECK(port > 0);
    char *body = NULL, path[64];
    CHECK(http(port, "GET", "/metrics", NULL, &body) == 200 &&
          strstr(body, "skyloom_frames_refused_total{reason=\"replay\"} 3\n"));
    free(body);
    CHECK(http(port, "GET", "/", NULL, &body) == 200 && strstr(body, job) &&
          strstr(body, "<table id=\"devices\">"));
    free(body);
    snprintf(path, sizeof path, "/job/%s", job);
    CHECK(http(port, "GET", path, NULL, &body) == 200 && strstr(body, job) &&
          count(body, "<svg") == 4 && strstr(body, "class=\"measured\"") &&
          strstr(body, "class=\"predicted\""));
    free(body);
    CHECK(http(port, "HEAD", "/metrics", NULL, NULL) == 200);
    CHECK(http(port, "POST", "/metrics", NULL, NULL) == 405);
    CHECK(http(port, "GET", "/job/j0000000000000000", NULL, NULL) == 404);
    CHECK(http(port, "GET", "/job/../../etc/passwd", NULL, NULL) == 404);
    CHECK(http(port, "GET", "/nothing", NULL, NULL) == 404);
    /* a name a web page pointed here is refused; the loopback names are not */
    char lh[64];
    snprintf(lh, sizeof lh, "localhost:%d", port);
    CHECK(http_host(port, lh, "GET", "/metrics", NULL, NULL) == 200);
    CHECK(http_host(port, "evil.example", "GET", "/", NULL, NULL) == 403);
    snprintf(lh, sizeof lh, "evil.example:%d", port);
    CHECK(http_host(port, lh, "GET", "/metrics", NULL, NULL) == 403);
    snprintf(lh, sizeof lh, "127.0.0.1:%d", port + 1);
    CHECK(http_host(port, lh, "GET", "/metrics", NULL, NULL) == 403);
    coord_http_stop(h);
    ho.name = "dash.example";
    h = coord_http_start(C, &ho, &err);
    CHECKF(h != NULL, "%s", err.msg);
    if (!h)
        return;
    port = coord_http_port(h);
    snprintf(lh, sizeof lh, "dash.example:%d", port);
    CHECK(http_host(port, lh, "GET", "/metrics", NULL, NULL) == 200);
    CHECK(http_host(port, "other.example", "GET", "/metrics", NULL, NULL) == 403);
    coord_http_stop(h);
    ho.name = NULL;

    /* anything but loopback needs a token, and with one every request carries it */
    ho.listen = "0.0.0.0:0";
    CHECK(coord_http_start(C, &ho, &err) == NULL && strstr(err.msg, "not a loopback address") &&
          strstr(err.msg, "--http-token"));
    ho.listen = "[::]:0";
    CHECK(coord_http_start(C, &ho, &err) == NULL && strstr(err.msg, "not a loopback address"));
    ho.listen = "127.0.0.1";
    CHECK(coord_http_start(C, &ho, &err) == NULL && strstr(err.msg, "HOST:PORT"));
    ho.listen = "127.0.0.1:70000";
    CHECK(coord_http_start(C, &ho, &err) == NULL && strstr(err.msg, "0..65535"));
    ho.listen = "0.0.0.0:0";
    ho.token = "0123456789abcdef0123";
    h = coord_http_start(C, &ho, &err);
    CHECKF(h != NULL, "%s", err.msg);
    if (!h)
        return;
    port = coord_http_port(h);
    CHECK(http(port, "GET", "/metrics", NULL, &body) == 401 && strstr(body, "bearer token"));
    free(body);
    CHECK(http(port, "GET", "/metrics", "Bearer 0123456789abcdef0124", NULL) == 401);
    CHECK(http(port, "GET", "/metrics", "Bearer 0123456789abcdef012", NULL) == 401);
    CHECK(http(port, "GET", "/", "Bearer 0123456789abcdef0123", NULL) == 200);
    CHECK(http(port, "GET", "/metrics", "Bearer 0123456789abcdef0123", &body) == 200 &&
          strstr(body, "skyloom_jobs{state=\"running\"} 1\n"));
    free(body);
    coord_http_stop(h);

    /* token files: one line of at least 16 printable characters */
    char *tok = NULL;
    FILE *f = fopen(tu_path(root, "tok"), "w");
    fprintf(f, "short\n");
    fclose(f);
    CHECK(coord_http_read_token(tu_path(root, "tok"), &tok, &err) == -1 && strstr(err.msg, "16"));
    f = fopen(tu_path(root, "tok"), "w");
    fprintf(f, "abcdefghijklmnopqrstuvwxyz\n");
    fclose(f);
    chmod(tu_path(root, "tok"), 0600);
    CHECK(coord_http_read_token(tu_path(root, "tok"), &tok, &err) == 0 && tok &&
          !strcmp(tok, "abcdefghijklmnopqrstuvwxyz"));
    free(tok);
}

static void test_observe(void)
{
    char sec[CERT_HEX_LEN], a[CERT_ID_LEN], b[CERT_ID_LEN], job[32] = "";
    /* enrollments, and refusals by reason */
    CHECK(enroll(tu_path(root, "a.key"), "lab-a", token_secret("lab-a", sec), a) == RPC_OK);
    CHECK(enroll(tu_path(root, "x.key"), "lab-a", sec, NULL) == RPC_UNAUTHENTICATED); /* used */
    CHECK(enroll(tu_path(root, "z.key"), "lab-b", token_secret("lab-a", sec), NULL) ==
          RPC_PERMISSION_DENIED); /* wrong site */
    CHECK(enroll(tu_path(root, "b.key"), "lab-b", token_secret("lab-b", sec), b) == RPC_OK);
    CHECK(enroll(tu_path(root, "y.key"), "lab-a",
                 "1111111111111111111111111111111111111111111111111111111111111111", NULL) ==
          RPC_UNAUTHENTICATED);
    uint8_t junk[3] = {0xff, 0xff, 0xff};
    rpc_peer nobody = {0};
    rpc_buf resp = {0};
    rpc_status st = {0};
    CHECK(coord_handle_enroll(C, &nobody, junk, sizeof junk, &resp, &st) == RPC_INVALID_ARGUMENT);
    uint64_t ok, refused[COORD_ENROLL_NREASONS];
    coord_enroll_counts(C, &ok, refused);
    CHECKF(ok == 2 && refused[COORD_ENROLL_TOKEN_USED] == 1 && refused[COORD_ENROLL_WRONG_SITE] == 1 &&
           refused[COORD_ENROLL_UNKNOWN_TOKEN] == 1 && refused[COORD_ENROLL_MALFORMED] == 1,
           "enrolled %llu, used %llu, site %llu, unknown %llu, malformed %llu",
           (unsigned long long)ok, (unsigned long long)refused[COORD_ENROLL_TOKEN_USED],
           (unsigned long long)refused[COORD_ENROLL_WRONG_SITE],
           (unsigned long long)refused[COORD_ENROLL_UNKNOWN_TOKEN],
           (unsigned long long)refused[COORD_ENROLL_MALFORMED]);
    heartbeat(a, "wiki");
    heartbeat(b, NULL);

    /* a job: checked by a, profiled by both, planned on both (a first) */
    submit_checked(a, b, "wiki", job);
    profiled(a, b, job, NULL);
    coord_snapshot s;
    CHECK(coord_jobs_snapshot(C->jobs, job, &s) == 0 && s.job[0].p == 2 && s.job[0].plan);
    int epoch = s.job[0].epoch;
    coord_snapshot_free(&s);
    CHECK(coord_jobs_snapshot(C->jobs, "jffffffffffffffff", &s) == -1 && s.njob == 0);
    coord_snapshot_free(&s);

    /* step 1: both stages with their ops; refusals from both devices */
    const seg s0[] = {{7, -1, 0, 0.001}, {2, 0, 0.001, 0.006}, {3, 0, 0.006, 0.007},
                      {4, 0, 0.010, 0.012}, {5, 0, 0.012, 0.022}, {9, -1, 0.03, 0.04},
                      {10, -1, 0.04, 0.05}};
    const seg s1[] = {{1, 0, 0, 0.007}, {2, 0, 0.007, 0.012}, {5, 0, 0.012, 0.022},
                      {6, 0, 0.022, 0.023}, {9, -1, 0.03, 0.045}};
    const char *ra[] = {"replay"}, *rb[] = {"tampered_payload", "replay", "Bad Name!"};
    const uint64_t ca[] = {2}, cb[] = {1, 1, 5};
    report_step(a, job, epoch, 0, 1, s0, 7, ra, ca, 1);
    report_step(b, job, epoch, 1, 1, s1, 5, rb, cb, 3);
    /* step 2: stage 0's ops out of range: the trace stays step 1's */
    const seg bad[] = {{99, 0, 0, 0.001}};
    const seg late[] = {{2, 0, 0.001, 9.0}};
    report_step(a, job, epoch, 0, 2, bad, 1, NULL, NULL, 0);
    report_step(b, job, epoch, 1, 2, s1, 5, NULL, NULL, 0);
    /* step 3: stage 1's op ends after its step: ignored too */
    report_step(a, job, epoch, 0, 3, s0, 7, NULL, NULL, 0);
    report_step(b, job, epoch, 1, 3, late, 1, NULL, NULL, 0);

    CHECK(coord_jobs_snapshot(C->jobs, job, &s) == 0);
    const coord_obs_job *j = &s.job[0];
    CHECKF(j->step == 3 && j->nstage == 2, "step %d, %d stages", j->step, j->nstage);
    for (int i = 0; i < j->nstage; i++) {
        const coord_obs_stage *x = &j->stage[i];
        CHECKF(x->steps == 3 && fabs(x->busy_s - 0.09) < 1e-9 && fabs(x->send_s - 0.012) < 1e-9 &&
               fabs(x->recv_s - 0.015) < 1e-9 && fabs(x->sync_s - 0.003) < 1e-9 &&
               fabs(x->idle_s - 0.03) < 1e-9,
               "stage %d: %llu steps, busy %g send %g recv %g sync %g idle %g", x->stage,
               (unsigned long long)x->steps, x->busy_s, x->send_s, x->recv_s, x->sync_s, x->idle_s);
    }
    int links = 0;
    for (int i = 0; i < j->nlink; i++) {
        const coord_obs_link *l = &j->link[i];
        links += (l->from == 0 && l->to == 1 && l->raw == 3000 && l->wire == 3300) ||
                 (l->from == 1 && l->to == 0 && l->raw == 1500 && l->wire == 1680);
    }
    CHECKF(links == 2 && j->nlink == 2, "%d links", j->nlink);
    CHECKF(s.nrefused == 2, "%d refusal reasons", s.nrefused);
    for (int i = 0; i < s.nrefused; i++)
        CHECKF((!strcmp(s.refused[i].name, "replay") && s.refused[i].value == 3) ||
               (!strcmp(s.refused[i].name, "tampered_payload") && s.refused[i].value == 1),
               "%s %llu", s.refused[i].name, (unsigned long long)s.refused[i].value);
    const coord_obs_trace *t = j->trace;
    CHECKF(t && t->step == 1 && t->p == 2 && t->nseg[0] == 7 && t->nseg[1] == 5 &&
           t->seg[0][1].kind == 2 && t->seg[0][1].mb == 0 && t->seg[1][4].end == 0.045 &&
           !strcmp(t->device[1], b), "trace of step %d", t ? t->step : -1);

    /* the dashboard's job page: id, loss, plan, measured and predicted */
    sl_buf page = {0};
    coord_dash_job(&s, "step,epoch,loss\n1,1,5.5\n2,1,5.25\n3,1,5.0\n", &page);
    CHECK(strstr(page.s, job) && count(page.s, "<svg") == 4 && strstr(page.s, "class=\"loss\"") &&
          strstr(page.s, "class=\"chain\"") && strstr(page.s, "class=\"measured\"") &&
          strstr(page.s, "class=\"predicted\"") && strstr(page.s, "<polyline"));
    /* one data owner: no replicas on the page, none in the snapshot */
    CHECK(!strstr(page.s, "id=\"replicas\"") && j->nrep == 0);
    free(page.s);
    coord_snapshot_free(&s);
    /* nor sync bytes: a report of them is refused, the rows say 0 */
    CHECKF(report_sync(a, job, epoch, 0, 4, 100, 140, &st) == RPC_INVALID_ARGUMENT &&
               strstr(st.details, "bytes of replica sync in job") &&
               strstr(st.details, "which has one data owner"), "%s", st.details);
    char row[1024] = "";
    CHECKF(metrics_row(job, 3, row, sizeof row) && strlen(row) > 5 &&
               !strcmp(row + strlen(row) - 5, ",,0,0"), "step 3's row: %s", row);

    /* the trace through GetJob, parsed back and drawn */
    Skyloom__V1__GetJobRequest gq = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    gq.job_id = job;
    Skyloom__V1__JobInfo *ji = NULL;
    CHECK(call(coord_handle_get_job, CERT_ADMIN_CN, &gq, &skyloom__v1__job_info__descriptor,
               (void **)&ji, &st) == RPC_OK && ji && !strcmp(ji->trace, ""));
    rpc_unpacked_free(ji);
    gq.trace = 1;
    CHECK(call(coord_handle_get_job, CERT_ADMIN_CN, &gq, &skyloom__v1__job_info__descriptor,
               (void **)&ji, &st) == RPC_OK && ji && *ji->trace);
    sl_err err = {0};
    coord_obs_trace *back = ji ? coord_trace_parse(ji->trace, &err) : NULL;
    CHECKF(back && back->step == 1 && back->p == 2 && back->nseg[0] == 7 &&
           back->seg[0][6].kind == SKYLOOM__V1__OP_KIND__OP_OPTIMIZER, "%s", err.msg);
    char *svg = back ? coord_trace_svg(back, 0.03) : NULL;
    CHECK(svg && !strncmp(svg, "<svg", 4) && strstr(svg, "stage 1 ") && strstr(svg, "predicted 0.0300 s") &&
          count(svg, "<rect") >= 12);
    free(svg);
    coord_trace_free(back);
    rpc_unpacked_free(ji);
    CHECK(coord_trace_parse("{\"stages\": [{\"ops\": [[1, 0, 2, 1]]}]}", &err) == NULL);
    CHECK(coord_trace_parse("[]", &err) == NULL);

    /* a checkpoint piece counts its bytes */
    Skyloom__V1__UploadChunkRequest uq = SKYLOOM__V1__UPLOAD_CHUNK_REQUEST__INIT;
    char name[64];
    uint8_t bytes[100] = {0};
    snprintf(name, sizeof name, "model.%s.safetensors", a);
    uq.device_id = a;
    uq.job_id = job;
    uq.epoch = (uint32_t)epoch;
    uq.step = 4;
    uq.name = name;
    uq.data.data = bytes;
    uq.data.len = sizeof bytes;
    void *ur = NULL;
    CHECKF(call(coord_handle_upload_chunk, a, &uq, &skyloom__v1__upload_chunk_response__descriptor,
                &ur, &st) == RPC_OK, "%s", st.details);
    rpc_unpacked_free(ur);

    /* the Prometheus text */
    CHECK(coord_jobs_snapshot(C->jobs, NULL, &s) == 0);
    sl_buf m = {0};
    coord_state *db = coord_state_attach(C->state, &err);
    CHECK(db && coord_metrics_text(C, db, &s, &m, &err) == 0);
    coord_state_close(db);
    char want[256];
    const char *lines[] = {"skyloom_enrollments_total 2\n",
                           "skyloom_enrollment_refusals_total{reason=\"token_used\"} 1\n",
                           "skyloom_enrollment_refusals_total{reason=\"bad_csr\"} 0\n",
                           "skyloom_frames_refused_total{reason=\"replay\"} 3\n",
                           "skyloom_frames_refused_total{reason=\"tampered_payload\"} 1\n",
                           "skyloom_devices{site=\"lab-a\",state=\"online\"} 1\n",
                           "skyloom_jobs{state=\"running\"} 1\n",
                           "# TYPE skyloom_job_stage_seconds_total counter\n"};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
        CHECKF(m.s && strstr(m.s, lines[i]), "metrics lack %s", lines[i]);
    snprintf(want, sizeof want, "skyloom_job_step{job_id=\"%s\"} 3\n", job);
    CHECKF(m.s && strstr(m.s, want), "metrics lack %s", want);
    snprintf(want, sizeof want, "skyloom_job_link_bytes_total{job_id=\"%s\",from_stage=\"0\","
             "to_stage=\"1\",encoding=\"wire\"} 3300\n", job);
    CHECKF(m.s && strstr(m.s, want), "metrics lack %s", want);
    snprintf(want, sizeof want, "skyloom_job_checkpoint_upload_bytes_total{job_id=\"%s\"} 100\n", job);
    CHECKF(m.s && strstr(m.s, want), "metrics lack %s", want);
    snprintf(want, sizeof want, "skyloom_job_stage_steps_total{job_id=\"%s\",stage=\"1\",device=\"%s\"} 3\n",
             job, b);
    CHECKF(m.s && strstr(m.s, want), "metrics lack %s", want);
    CHECK(m.s && !strstr(m.s, "Bad"));
    CHECK(m.s && !strstr(m.s, "skyloom_job_sync_bytes_total{"));
    /* every sample line is NAME{labels} VALUE or NAME VALUE, every family announced */
    int bad_lines = 0;
    for (char *line = m.s; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (line[0] != '#') {
            char fam[128];
            sscanf(line, "%127[a-z_]", fam);
            char type[160];
            snprintf(type, sizeof type, "# TYPE %s ", fam);
            bad_lines += strncmp(line, "skyloom_", 8) != 0 || !strstr(m.s, type);
        }
        if (nl)
            *nl = '\n';
        line = nl ? nl + 1 : NULL;
    }
    CHECKF(bad_lines == 0, "%d malformed metric lines", bad_lines);
    free(m.s);
    sl_buf idx = {0};
    db = coord_state_attach(C->state, &err);
    CHECK(db && coord_dash_index(C, db, &s, &idx, &err) == 0 && strstr(idx.s, job) &&
          strstr(idx.s, a) && strstr(idx.s, "lab-b") && strstr(idx.s, "<progress"));
    coord_state_close(db);
    free(idx.s);
    coord_snapshot_free(&s);

    test_upload_damaged(a, job, epoch);
    test_http(job);
}

/* What the dashboard shows from devices is escaped: no markup gets through. */
static void test_escaping(void)
{
    sl_buf b = {0};
    sl_buf_xml(&b, "<script>alert('x')</script> & \"q\"");
    CHECK(b.s && !strchr(b.s, '<') && !strchr(b.s, '\'') && strstr(b.s, "&lt;script&gt;") &&
          strstr(b.s, "&amp;") && strstr(b.s, "&quot;q&quot;"));
    free(b.s);
    sl_buf l = {0};
    coord_loss_svg("garbage\n1,1,nan\n", &l);
    CHECK(l.s && strstr(l.s, "no step reported yet"));
    free(l.s);
    sl_buf c = {0};
    coord_chain_svg("{\"stages\": 7}", &c);
    CHECK(c.s && strstr(c.s, "no plan yet"));
    free(c.s);
}

/* The round of the profile task `dev` is given for `job` now: "links",
 * "units", "both" (no round), or NULL (none). */
static const char *profile_round(const char *dev, const char *dataset, const char *job)
{
    Skyloom__V1__HeartbeatResponse *r = heartbeat_reply(dev, dataset);
    static char out[16];
    const char *got = NULL;
    for (size_t i = 0; r && i < r->n_tasks; i++)
        if (!strcmp(r->tasks[i]->job_id, job) && !strcmp(r->tasks[i]->kind, "profile")) {
            json_error_t je;
            json_t *spec = json_loads(r->tasks[i]->spec, 0, &je);
            const char *rd = json_string_value(json_object_get(spec, "round"));
            snprintf(out, sizeof out, "%s", rd ? rd : "both");
            got = out;
            json_decref(spec);
        }
    rpc_unpacked_free(r);
    return got;
}

/* Profiling in two rounds: every candidate measures its links, and only
 * then are the units timed (no device computes while others measure their
 * links to it); the profile kept has the links of the first round. */
static void test_profile_rounds(void)
{
    char sec[CERT_HEX_LEN], a[CERT_ID_LEN], b[CERT_ID_LEN], job[32] = "";
    CHECK(enroll(tu_path(root, "ra.key"), "lab-a", token_secret("lab-a", sec), a) == RPC_OK);
    CHECK(enroll(tu_path(root, "rb.key"), "lab-b", token_secret("lab-b", sec), b) == RPC_OK);
    heartbeat(a, "books");
    heartbeat(b, NULL);
    submit_checked(a, b, "books", job);
    rpc_status st;
    const char *ra = profile_round(a, "books", job), *rb = profile_round(b, NULL, job);
    CHECKF(ra && !strcmp(ra, "links"), "a is asked for %s", ra ? ra : "nothing");
    CHECKF(rb && !strcmp(rb, "links"), "b is asked for %s", rb ? rb : "nothing");
    char links[256];
    snprintf(links, sizeof links, "{\"round\": \"links\", \"links\": [{\"peer\": \"%s\", \"rtt_s\": 0.002,"
             " \"bandwidth_Bps\": 5e8}]}", b);
    report_task(a, job, "profile", links);
    /* a has measured its links, b has not: nobody times units yet */
    for (int i = 0; i < 3; i++) {
        usleep(50 * 1000);
        ra = profile_round(a, "books", job);
        rb = profile_round(b, NULL, job);
        CHECKF(!ra, "a is asked for %s before b measured its links", ra);
        CHECKF(rb && !strcmp(rb, "links"), "b is asked for %s", rb ? rb : "nothing");
    }
    snprintf(links, sizeof links, "{\"round\": \"links\", \"links\": [{\"peer\": \"%s\", \"rtt_s\": 0.003,"
             " \"bandwidth_Bps\": 4e8}]}", a);
    report_task(b, job, "profile", links);
    ra = rb = NULL;
    for (double t0 = sl_now_s(); sl_now_s() - t0 < 10 && !(ra && rb);) {
        usleep(20 * 1000);
        ra = ra ? ra : profile_round(a, "books", job);
        rb = rb ? rb : profile_round(b, NULL, job);
    }
    CHECKF(ra && rb && !strcmp(ra, "units") && !strcmp(rb, "units"), "asked for %s and %s",
           ra ? ra : "nothing", rb ? rb : "nothing");
    profiled(a, b, job, "units");
    Skyloom__V1__GetJobRequest gq = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    gq.job_id = job;
    Skyloom__V1__JobInfo *ji = NULL;
    CHECKF(call(coord_handle_get_job, CERT_ADMIN_CN, &gq, &skyloom__v1__job_info__descriptor,
                (void **)&ji, &st) == RPC_OK && ji, "%s", st.details);
    json_error_t je;
    json_t *pr = ji ? json_loads(ji->profiles, 0, &je) : NULL;
    json_t *la = json_object_get(json_object_get(pr, a), "links");
    json_t *lb = json_object_get(json_object_get(pr, b), "links");
    CHECKF(json_array_size(la) == 1 && json_array_size(lb) == 1 &&
           !strcmp(json_string_value(json_object_get(json_array_get(la, 0), "peer")), b) &&
           json_number_value(json_object_get(json_array_get(lb, 0), "rtt_s")) == 0.003 &&
           !json_object_get(json_object_get(pr, a), "round") &&
           json_array_size(json_object_get(json_object_get(pr, a), "unit_fwd_s")) == 4,
           "profiles: %s", ji ? ji->profiles : "none");
    json_decref(pr);
    rpc_unpacked_free(ji);
}

/* The tasks device `dev` is given for `job` now, as "kind kind ..." */
static const char *tasks_of(const char *dev, const char *dataset, const char *job)
{
    Skyloom__V1__HeartbeatResponse *r = heartbeat_reply(dev, dataset);
    static char out[128];
    out[0] = 0;
    for (size_t i = 0; r && i < r->n_tasks; i++)
        if (!strcmp(r->tasks[i]->job_id, job))
            snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", *out ? " " : "",
                     r->tasks[i]->kind);
    rpc_unpacked_free(r);
    return out;
}

/* State `want` of job `id` within 15 s, devices a and b heartbeating. */
static int wait_state_online(const char *id, const char *want, const char *a, const char *dataset,
                             const char *b)
{
    for (double t0 = sl_now_s(); sl_now_s() - t0 < 15; usleep(100 * 1000)) {
        heartbeat(a, dataset);
        heartbeat(b, NULL);
        if (wait_state_for(id, want, 0))
            return 1;
    }
    return 0;
}

/* A coordinator restarted before a job's first plan: a job whose data owner
 * had checked it is profiled again once the devices had time to come back
 * (not with the first one to heartbeat); a job not checked yet is checked
 * again, and waited for from the restart, however long ago it was
 * submitted. */
static void test_restart_before_plan(void)
{
    char sec[CERT_HEX_LEN], a[CERT_ID_LEN], b[CERT_ID_LEN], job[32] = "", job2[32] = "";
    CHECK(enroll(tu_path(root, "sa.key"), "lab-a", token_secret("lab-a", sec), a) == RPC_OK);
    CHECK(enroll(tu_path(root, "sb.key"), "lab-b", token_secret("lab-b", sec), b) == RPC_OK);
    heartbeat(a, "films");
    heartbeat(b, NULL);
    submit_checked(a, b, "films", job);
    char links[256];
    snprintf(links, sizeof links, "{\"round\": \"links\", \"links\": [{\"peer\": \"%s\", \"rtt_s\": 0.002,"
             " \"bandwidth_Bps\": 5e8}]}", b);
    report_task(a, job, "profile", links);
    submit(a, b, "films", job2);
    coord_close(C);
    /* the second submitted long before the restart (more than the check's 120 s) */
    sqlite3 *db = NULL;
    char sql[128];
    snprintf(sql, sizeof sql, "UPDATE jobs SET created_at = created_at - 1000 WHERE id = '%s'", job2);
    CHECK(sqlite3_open(tu_path(state, "coordinator.db"), &db) == SQLITE_OK &&
          sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK && sqlite3_changes(db) == 1);
    sqlite3_close(db);
    sl_err err = {0};
    double t0 = sl_now_s();
    C = coord_open(&O, &err);
    CHECKF(C, "coord_open: %s", err.msg);
    if (!C)
        exit(1);
    /* a heartbeats first: the checked job does not start profiling with it alone */
    const char *ta = tasks_of(a, "films", job);
    CHECKF(!*ta, "a is given \"%s\" for the checked job", ta);
    ta = tasks_of(a, "films", job2);
    CHECKF(!strcmp(ta, "check"), "the data owner is given \"%s\", not the check", ta);
    usleep(1200 * 1000);
    CHECK(wait_state_for(job, "checking", 0) && wait_state_for(job2, "checking", 0));
    report_task(a, job2, "check", "{\"sequences\": 100, \"seq_len\": 8, \"first\": 0, \"vocab_size\": 100}");
    CHECK(wait_state_online(job, "profiling", a, "films", b));
    CHECK(wait_state_online(job2, "profiling", a, "films", b));
    CHECKF(sl_now_s() - t0 >= 3 * O.heartbeat_ms / 1000.0, "profiling again %.1f s after the restart",
           sl_now_s() - t0);
    const char *ra = profile_round(a, "films", job), *rb = profile_round(b, NULL, job);
    CHECKF(ra && !strcmp(ra, "links") && rb && !strcmp(rb, "links"),
           "asked for %s and %s after the restart", ra ? ra : "nothing", rb ? rb : "nothing");
    report_task(a, job, "profile", links);
    snprintf(links, sizeof links, "{\"round\": \"links\", \"links\": [{\"peer\": \"%s\", \"rtt_s\": 0.002,"
             " \"bandwidth_Bps\": 5e8}]}", a);
    report_task(b, job, "profile", links);
    ra = NULL;
    for (double t1 = sl_now_s(); sl_now_s() - t1 < 10 && !ra;) {
        usleep(20 * 1000);
        ra = profile_round(a, "films", job);
    }
    CHECKF(ra && !strcmp(ra, "units"), "a is asked for %s", ra ? ra : "nothing");
    profiled(a, b, job, "units");
}

/* The peers of the links-round task `dev` is given for `job`, into
 * peers[8] (their count; -1 if no such task). */
static int links_peers(const char *dev, const char *job, char peers[8][CERT_ID_LEN])
{
    Skyloom__V1__HeartbeatResponse *r = heartbeat_reply(dev, NULL);
    int n = -1;
    for (size_t i = 0; r && i < r->n_tasks; i++)
        if (!strcmp(r->tasks[i]->job_id, job) && !strcmp(r->tasks[i]->kind, "profile")) {
            json_error_t je;
            json_t *spec = json_loads(r->tasks[i]->spec, 0, &je), *p;
            size_t k;
            n = 0;
            json_array_foreach(json_object_get(spec, "peers"), k, p)
                if (n < 8)
                    snprintf(peers[n++], CERT_ID_LEN, "%s",
                             json_string_value(json_object_get(p, "id")) ?: "");
            json_decref(spec);
        }
    rpc_unpacked_free(r);
    return n;
}

/* The job's events (GetJob), into out. */
static void job_events(const char *job, char *out, size_t cap)
{
    Skyloom__V1__GetJobRequest gq = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    gq.job_id = (char *)job;
    Skyloom__V1__JobInfo *ji = NULL;
    rpc_status st;
    CHECKF(call(coord_handle_get_job, CERT_ADMIN_CN, &gq, &skyloom__v1__job_info__descriptor,
                (void **)&ji, &st) == RPC_OK && ji, "%s", st.details);
    snprintf(out, cap, "%s", ji && ji->events ? ji->events : "");
    rpc_unpacked_free(ji);
}

/* Enrolls n devices at site[i] (keys TAG0.key, ...; device 0 serves
 * `dataset`) into id[], submits a job placed by `optimal` that may use all
 * of them into job[32], the first `online` heartbeating, and has it
 * checked: it is then profiling. */
static void job_on_sites(int n, int online, const char *const *site, const char *tag,
                         const char *dataset, char (*id)[CERT_ID_LEN], char *job)
{
    char sec[CERT_HEX_LEN], devs[1024] = "[";
    for (int i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "%s%d.key", tag, i);
        CHECK(enroll(tu_path(root, key), site[i], token_secret(site[i], sec), id[i]) == RPC_OK);
        snprintf(devs + strlen(devs), sizeof devs - strlen(devs), "%s\"%s\"", i ? ", " : "", id[i]);
    }
    strcat(devs, "]");
    for (int i = 0; i < online; i++)
        heartbeat(id[i], i ? NULL : dataset);
    submit_algo(id[0], devs, dataset, "optimal", job);
    for (int i = 0; i < online; i++)
        heartbeat(id[i], i ? NULL : dataset);
    report_task(id[0], job, "check", "{\"sequences\": 100, \"seq_len\": 8, \"first\": 0, \"vocab_size\": 100}");
    CHECK(wait_state(job, "profiling"));
}

/* Every device of the job (n, device 0 serving `dataset`) reports its units
 * whenever asked, until the job is planned (up to 10 s). */
static void units_until_planned(int n, char (*id)[CERT_ID_LEN], const char *dataset,
                                const char *job)
{
    char prof[512];
    snprintf(prof, sizeof prof, "{\"round\": \"units\", \"unit_fwd_s\": [0.001, 0.002, 0.002, 0.001], "
             "\"unit_bwd_s\": [0.002, 0.004, 0.004, 0.002], \"memory_bytes\": 1000000000,"
             " \"threads\": 2, \"backend\": \"cpu\", \"links\": []}");
    for (double t0 = sl_now_s(); sl_now_s() - t0 < 10 && wait_state_for(job, "profiling", 0);) {
        usleep(50 * 1000);
        for (int i = 0; i < n; i++)
            if (profile_round(id[i], i ? NULL : dataset, job))
                report_task(id[i], job, "profile", prof);
    }
}

/* The links round: each pair of sites (a site with itself included) is
 * measured by one device, to as many as 3 peers on the other side, every
 * device pair at most once; a device joining later measures up to 3 of
 * each site. */
static void test_links_assigned(void)
{
    enum { N = 8 };
    static const char *const site[N + 1] = {"lab-a", "lab-a", "lab-a", "lab-b", "lab-b", "lab-b",
                                            "lab-b", "lab-c", "lab-b"};
    char id[N + 1][CERT_ID_LEN], job[32] = "";
    job_on_sites(N + 1, N, site, "la", "maps", id, job); /* the last one joins later */
    int measured[3][3] = {{0}}, by[3][3], pair[N][N] = {{0}}, most = 0, total = 0;
    memset(by, -1, sizeof by);
    for (int i = 0; i < N; i++) {
        char peers[8][CERT_ID_LEN];
        int n = links_peers(id[i], job, peers);
        CHECKF(n >= 0, "device %d is given no links task", i);
        most = n > most ? n : most;
        for (int k = 0; k < n; k++) {
            int q = -1;
            for (int t = 0; t < N; t++)
                q = !strcmp(peers[k], id[t]) ? t : q;
            CHECKF(q >= 0 && q != i, "device %d measures %s", i, peers[k]);
            if (q < 0 || q == i)
                continue;
            int a = site[i][4] - 'a', b = site[q][4] - 'a', lo = a < b ? a : b, hi = a < b ? b : a;
            CHECKF(by[lo][hi] < 0 || by[lo][hi] == i, "sites %d-%d measured by devices %d and %d",
                   lo, hi, by[lo][hi], i);
            by[lo][hi] = i;
            measured[lo][hi]++;
            CHECKF(!pair[i][q] && !pair[q][i], "devices %d and %d measured twice", i, q);
            pair[i][q] = 1;
            total++;
        }
    }
    /* a-a: 2 peers; b-b: 3 of 3; c-c: none; a-b, a-c, b-c: 3 */
    CHECKF(measured[0][0] == 2 && measured[1][1] == 3 && measured[2][2] == 0 && measured[0][1] == 3 &&
           measured[0][2] == 3 && measured[1][2] == 3 && total == 14,
           "measured a-a %d b-b %d c-c %d a-b %d a-c %d b-c %d", measured[0][0], measured[1][1],
           measured[2][2], measured[0][1], measured[0][2], measured[1][2]);
    /* lab-c's one device measures both its pairs (6), the others one each */
    CHECKF(most == 6, "one device measures %d links", most);
    /* profiled and planned; a device of lab-b joins: it measures up to 3
     * devices of each site (lab-a 3, lab-b 3 of 4, lab-c 1) */
    for (int i = 0; i < N; i++)
        report_task(id[i], job, "profile", "{\"round\": \"links\", \"links\": []}");
    units_until_planned(N, id, "maps", job);
    int running = wait_state_online(job, "running", id[0], "maps", id[1]);
    coord_snapshot snap;
    if (!running && coord_jobs_snapshot(C->jobs, job, &snap) == 0) {
        fprintf(stderr, "job %s: %s (%s)\n", job, snap.job[0].state, snap.job[0].reason);
        coord_snapshot_free(&snap);
    }
    CHECK(running);
    /* every links report was empty: the plan says which pairs it assumed */
    static char ev[65536];
    job_events(job, ev, sizeof ev);
    CHECKF(strstr(ev, "links_assumed") && strstr(ev, "lab-a-lab-a, lab-a-lab-b, lab-a-lab-c, "
                                                     "lab-b-lab-b, lab-b-lab-c"),
           "events: %s", ev);
    char peers[8][CERT_ID_LEN];
    int n = -1;
    for (double t0 = sl_now_s(); sl_now_s() - t0 < 10 && n < 0; usleep(100 * 1000))
        n = links_peers(id[N], job, peers);
    int per_site[3] = {0};
    for (int k = 0; k < n; k++)
        for (int t = 0; t < N; t++)
            per_site[site[t][4] - 'a'] += !strcmp(peers[k], id[t]);
    CHECKF(n == 7 && per_site[0] == 3 && per_site[1] == 3 && per_site[2] == 1,
           "the joiner measures %d peers: %d, %d and %d at lab-a, lab-b and lab-c", n, per_site[0],
           per_site[1], per_site[2]);
}

/* A re-plan takes the links every profiled candidate measured: the device
 * that measured the pair lab-a/lab-b is gone after a coordinator restart,
 * and the new plan still knows that pair (no links_assumed). */
static void test_replan_keeps_links(void)
{
    enum { N = 4 };
    static const char *const site[N] = {"lab-a", "lab-a", "lab-b", "lab-b"};
    char id[N][CERT_ID_LEN], job[32] = "";
    job_on_sites(N, N, site, "rk", "tunes", id, job);
    /* the links round as given: 80 ms and 200 Mbit/s between the sites */
    int measurer = -1;
    for (int i = 0; i < N; i++) {
        char peers[8][CERT_ID_LEN], res[2048];
        int n = links_peers(id[i], job, peers);
        snprintf(res, sizeof res, "{\"round\": \"links\", \"links\": [");
        for (int k = 0; k < n; k++) {
            int q = -1;
            for (int t = 0; t < N; t++)
                q = !strcmp(peers[k], id[t]) ? t : q;
            int cross = q >= 0 && strcmp(site[q], site[i]) != 0;
            if (cross)
                measurer = i;
            snprintf(res + strlen(res), sizeof res - strlen(res),
                     "%s{\"peer\": \"%s\", \"rtt_s\": %s, \"bandwidth_Bps\": %s}", k ? ", " : "",
                     peers[k], cross ? "0.08" : "0.0004", cross ? "2.5e7" : "1.25e9");
        }
        strcat(res, "]}");
        report_task(id[i], job, "profile", res);
    }
    CHECKF(measurer >= 0, "no device measures lab-a/lab-b");
    if (measurer < 0)
        return;
    units_until_planned(N, id, "tunes", job);
    CHECK(wait_state_online(job, "running", id[0], "tunes", id[1]));
    static char ev[65536];
    job_events(job, ev, sizeof ev);
    CHECKF(!strstr(ev, "links_assumed"), "the first plan assumed links: %s", ev);
    /* the coordinator restarts; every device but the measurer comes back */
    coord_close(C);
    sl_err err = {0};
    C = coord_open(&O, &err);
    CHECKF(C, "coord_open: %s", err.msg);
    if (!C)
        exit(1);
    int replanned = 0;
    for (double t0 = sl_now_s(); sl_now_s() - t0 < 15 && !replanned; usleep(200 * 1000)) {
        for (int i = 0; i < N; i++)
            if (i != measurer)
                heartbeat(id[i], i ? NULL : "tunes");
        job_events(job, ev, sizeof ev);
        replanned = strstr(ev, "epoch 2:") != NULL;
    }
    CHECKF(replanned, "no second plan: %s", ev);
    CHECKF(!strstr(ev, "links_assumed"), "the re-plan without device %d assumed links: %s",
           measurer, ev);
}

int main(void)
{
    sl_log_set_level(SL_LOG_WARN);
    tu_tmpdir(root, sizeof root, "obs");
    tu_pki(root, "pki", pki, sizeof pki);
    snprintf(state, sizeof state, "%s/state", root);
    rpc_global_init();
    sl_err err = {0};
    O = (coord_opts){.listen = "127.0.0.1:0", .pki = pki, .state = state, .heartbeat_ms = 1000};
    C = coord_open(&O, &err);
    if (!C) {
        fprintf(stderr, "coord_open: %s\n", err.msg);
        return 1;
    }
    RUN(test_observe);
    RUN(test_escaping);
    RUN(test_profile_rounds);
    RUN(test_restart_before_plan);
    RUN(test_links_assigned);
    RUN(test_replan_keeps_links);
    coord_close(C);
    rpc_global_shutdown();
    tu_rmtree(root);
    return sl_test_done();
}
