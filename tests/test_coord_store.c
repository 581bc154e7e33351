/* The checkpoint store failing under a running job, through its table of
 * file operations (coord_ckpt.h), with devices played by this process
 * (coord_fake.h):
 *  - fault loops: the Nth write, fsync or rename of a job fails (for N
 *    across the job's whole run): the job waits when the failure mattered,
 *    keeps its committed step readable, runs again from it, and ends with
 *    the same committed checkpoint and metrics.csv as a run without faults;
 *  - a stall: while a piece's fsync is held, heartbeats and the job list are
 *    answered (the order of events, not a time, is checked). */
#include <fcntl.h>
#include <pthread.h>
#include <time.h>

#include "coord_fake.h"
#include "coord_jobs_int.h"

enum { OP_WRITE, OP_FSYNC, OP_RENAME, NOPS };
static const char *const op_name[NOPS] = {"write", "fsync", "rename"};

/* The faults: op `op` fails from its `at`-th call on, `times` calls in a row. */
static struct {
    pthread_mutex_t mu;
    int armed, op, at, times, count[NOPS], failed;
} F = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int fault(int op)
{
    pthread_mutex_lock(&F.mu);
    int n = F.armed ? ++F.count[op] : 0;
    int fail = F.armed && op == F.op && n >= F.at && n < F.at + F.times;
    F.failed += fail;
    pthread_mutex_unlock(&F.mu);
    if (fail)
        errno = op == OP_RENAME ? EIO : ENOSPC;
    return fail;
}

/* A held fsync: the next one waits until released. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int hold, held, released;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int f_open(void *ud, const char *path, int flags, unsigned mode)
{
    (void)ud;
    return open(path, flags, (mode_t)mode);
}

static long f_pwrite(void *ud, int fd, const void *buf, size_t n, int64_t off)
{
    (void)ud;
    return fault(OP_WRITE) ? -1 : (long)pwrite(fd, buf, n, (off_t)off);
}

static int f_fsync(void *ud, int fd)
{
    (void)ud;
    pthread_mutex_lock(&S.mu);
    if (S.hold && !S.held) {
        S.held = 1;
        pthread_cond_broadcast(&S.cv);
        while (!S.released)
            pthread_cond_wait(&S.cv, &S.mu);
    }
    pthread_mutex_unlock(&S.mu);
    return fault(OP_FSYNC) ? -1 : fsync(fd);
}

static int f_rename(void *ud, const char *from, const char *to)
{
    (void)ud;
    return fault(OP_RENAME) ? -1 : rename(from, to);
}

static const coord_fileops OPS = {f_open, f_pwrite, f_fsync, f_rename, NULL};

static char *state_file(const char *job, const char *sub)
{
    char p[4096], *text = NULL;
    size_t n = 0;
    sl_err err = {0};
    snprintf(p, sizeof p, "%s/jobs/%s/%s", state, job, sub);
    return sl_read_file(p, 1 << 20, &text, &n, &err) ? NULL : text;
}

/* metrics.csv without its epoch column (a recovery runs steps again in a
 * new epoch) and its timing columns (the fake devices report fixed ones). */
static char *metrics_of(const char *job)
{
    char *m = state_file(job, "metrics.csv");
    if (!m)
        return sl_xstrdup("");
    sl_buf b = {0};
    for (char *line = m, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        char *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        if (c1 && c2)
            sl_buf_printf(&b, "%.*s%s\n", (int)(c1 - line), line, c2);
    }
    free(m);
    return b.s ? b.s : sl_xstrdup("");
}

static const char *const OPTS = "{\"steps\": 6, \"batch\": 4, \"micro_batches\": 2, "
                                "\"checkpoint_every\": 2, \"algo\": \"even\"}";

typedef struct outcome {
    char *job;
    int waited;     /* the store failed at least once (an event says so) */
    int kept;       /* every time, the committed step stayed and stayed readable */
    int done;
} outcome;

static int has_event(const char *job, const char *kind)
{
    Skyloom__V1__GetJobRequest q = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    q.job_id = (char *)job;
    Skyloom__V1__JobInfo *ji = NULL;
    rpc_status st;
    int found = 0;
    if (call(coord_handle_get_job, CERT_ADMIN_CN, &q, &skyloom__v1__job_info__descriptor,
             (void **)&ji, &st) == RPC_OK && ji) {
        char want[64];
        snprintf(want, sizeof want, "\"kind\":\"%s\"", kind);
        found = strstr(ji->events, want) != NULL;
    }
    rpc_unpacked_free(ji);
    return found;
}

/* One job to its end, its devices running each new epoch the coordinator
 * plans until it is done. */
static outcome run_job(void)
{
    outcome o = {.job = submit(OPTS), .kept = 1};
    if (!pump_until(o.job, "running", 1))
        return o;
    for (int epoch = 1, round = 0; round < 20; round++) {
        jview v;
        view(o.job, &v);
        int committed = v.committed;
        free(v.plan);
        if (train(o.job, 6, 2) == RPC_OK)
            break;
        /* the epoch ended: the committed step stays, its checkpoint readable */
        jview w;
        view(o.job, &w);
        char sub[64];
        snprintf(sub, sizeof sub, "ckpt/step-%d/manifest.json", committed);
        char *m = committed ? state_file(o.job, sub) : sl_xstrdup("");
        o.kept &= w.committed >= committed && m != NULL;
        free(m);
        free(w.plan);
        epoch = w.epoch + 1;
        if (!pump_until(o.job, "running", epoch))
            return o;
    }
    o.done = pump_until(o.job, "done", 1);
    o.waited = has_event(o.job, "store_failed");
    return o;
}

static void test_fault_loops(void)
{
    coord_job_policy pol = coord_job_policy_default();
    pol.store_retry_ms = 20;
    pol.wait_retry_ms = 20;
    pol.decide_ms = 20;
    coord_jobs_set_policy(C->jobs, &pol);
    coord_jobs_set_fileops(C->jobs, &OPS);
    /* the run without faults, counting the store's operations */
    F.armed = 1;
    F.op = -1;
    outcome ref = run_job();
    F.armed = 0;
    CHECK(ref.done && !ref.waited);
    char *ref_manifest = state_file(ref.job, "ckpt/step-6/manifest.json"), *ref_metrics = metrics_of(ref.job);
    CHECK(ref_manifest && strstr(ref_metrics, "\n6,"));
    int total[NOPS];
    memcpy(total, F.count, sizeof total);
    printf("     a job's store operations: %d writes, %d fsyncs, %d renames\n", total[0], total[1],
           total[2]);
    int runs = 0, waited = 0;
    for (int op = 0; op < NOPS; op++) {
        int stride = total[op] > 8 ? total[op] / 8 : 1;
        for (int at = 1; at <= total[op]; at += stride) {
            memset(F.count, 0, sizeof F.count);
            F.op = op;
            F.at = at;
            F.times = 1 + at % 3; /* a disk full for a while, not only once */
            F.failed = 0;
            F.armed = 1;
            outcome o = run_job();
            F.armed = 0;
            char *man = state_file(o.job, "ckpt/step-6/manifest.json"), *met = metrics_of(o.job);
            CHECKF(o.done && o.kept, "%s %d: done %d, committed step kept %d", op_name[op], at,
                   o.done, o.kept);
            CHECKF(man && ref_manifest && !strcmp(man, ref_manifest), "%s %d: another manifest",
                   op_name[op], at);
            CHECKF(!strcmp(met, ref_metrics), "%s %d: another metrics.csv:\n%s\nnot\n%s",
                   op_name[op], at, met, ref_metrics);
            char *part = state_file(o.job, "ckpt/step-4/manifest.json");
            CHECKF(!part, "%s %d: step 4 left beside the committed step 6", op_name[op], at);
            free(part);
            runs++;
            waited += o.waited;
            free(man);
            free(met);
            free(o.job);
        }
    }
    /* the faults that hit a piece, a commit or a metrics row made the job
     * wait (a directory's fsync after a rename is not one of them) */
    printf("     %d runs with a fault, %d of them waited for the store\n", runs, waited);
    CHECKF(waited * 4 >= runs * 3, "%d of %d runs waited", waited, runs);
    free(ref_manifest);
    free(ref_metrics);
    free(ref.job);
    coord_jobs_set_fileops(C->jobs, NULL);
}

/* ---- a stalled fsync -------------------------------------------------------------- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char seq[8][32];
    int n, calls_done;
} E = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void happened(const char *what)
{
    pthread_mutex_lock(&E.mu);
    if (E.n < 8)
        snprintf(E.seq[E.n++], sizeof E.seq[0], "%s", what);
    pthread_mutex_unlock(&E.mu);
}

/* A device's heartbeat and the operator's job list. */
static void *caller(void *arg)
{
    (void)arg;
    heartbeat(&D[1]);
    happened("heartbeat answered");
    Skyloom__V1__ListJobsRequest lq = SKYLOOM__V1__LIST_JOBS_REQUEST__INIT;
    rpc_status st;
    CHECK(call(coord_handle_list_jobs, CERT_ADMIN_CN, &lq, NULL, NULL, &st) == RPC_OK);
    happened("jobs listed");
    pthread_mutex_lock(&E.mu);
    E.calls_done = 1;
    pthread_cond_broadcast(&E.cv);
    pthread_mutex_unlock(&E.mu);
    return NULL;
}

typedef struct up_arg {
    const char *job;
    const jview *v;
    int epoch, code;
} up_arg;

static void *uploader(void *arg)
{
    up_arg *a = arg;
    char name[96];
    snprintf(name, sizeof name, "model.%s.safetensors", D[0].id);
    a->code = upload(&D[0], a->v, a->job, a->epoch, 2, name);
    happened("upload answered");
    return NULL;
}

static void test_heartbeat_during_stall(void)
{
    coord_jobs_set_fileops(C->jobs, &OPS);
    char *job = submit(OPTS);
    CHECK(pump_until(job, "running", 1));
    jview v;
    view(job, &v);
    for (int s = 1; s <= 2; s++)
        for (int i = v.p - 1; i >= 0; i--)
            report_step(v.stage_dev[i], job, v.epoch, i, v.p, s);
    pthread_mutex_lock(&S.mu);
    S.hold = 1;
    S.held = S.released = 0;
    pthread_mutex_unlock(&S.mu);
    up_arg a = {job, &v, v.epoch, -1};
    pthread_t t;
    pthread_create(&t, NULL, uploader, &a);
    /* the upload's last piece is in its fsync, held */
    pthread_mutex_lock(&S.mu);
    while (!S.held)
        pthread_cond_wait(&S.cv, &S.mu);
    pthread_mutex_unlock(&S.mu);
    happened("fsync held");
    /* the calls on a thread of their own: a manager that waited for the
     * store would answer them only after the release below (a deadline so
     * that it fails rather than hangs) */
    pthread_t c;
    pthread_create(&c, NULL, caller, NULL);
    pthread_mutex_lock(&E.mu);
    for (double t0 = sl_now_s(); !E.calls_done && sl_now_s() - t0 < 60;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&E.cv, &E.mu, &ts);
    }
    pthread_mutex_unlock(&E.mu);
    pthread_mutex_lock(&S.mu);
    S.released = 1;
    S.hold = 0;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    happened("fsync released");
    pthread_join(c, NULL);
    pthread_join(t, NULL);
    static const char *const want[] = {"fsync held", "heartbeat answered", "jobs listed",
                                       "fsync released", "upload answered"};
    CHECKF(E.n == 5, "%d events", E.n);
    for (int i = 0; i < E.n && i < 5; i++)
        CHECKF(!strcmp(E.seq[i], want[i]), "event %d: %s, not %s", i, E.seq[i], want[i]);
    CHECKF(a.code == RPC_OK, "the held upload: code %d", a.code);
    free(v.plan);
    free(job);
    coord_jobs_set_fileops(C->jobs, NULL);
}

/* A job's metrics.csv written by an older coordinator, whose header has
 * fewer columns: truncating it at an epoch (or a restart) gives it the
 * current header and its rows the new columns empty; a header of another
 * kind is kept as it is. */
static void test_metrics_old_header(void)
{
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/oldhdr", root);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    const char *cur = COORD_METRICS_HEADER;
    /* the header up to side_wire_bytes: the current one less its last three columns */
    const char *cut = strstr(cur, ",replica_loss");
    CHECK(cut != NULL);
    int old_cols = 1, pad = 0;
    for (const char *c = cur; c < cut; c++)
        old_cols += *c == ',';
    for (const char *c = cut; *c; c++)
        pad += *c == ',';
    sl_buf b = {0};
    sl_buf_printf(&b, "%.*s\n", (int)(cut - cur), cur);
    for (int step = 1; step <= 3; step++) {
        sl_buf_printf(&b, "%d,1,%.6f", step, 7.0 - step);
        for (int c = 3; c <= old_cols; c++)
            sl_buf_printf(&b, ",%d", c);
        sl_buf_printf(&b, "\n");
    }
    sl_err err = {0};
    CHECKF(sl_write_file_atomic(path, b.s, b.n, &err) == 0, "%s", err.msg);
    coord_ckpt *k = coord_ckpt_new(dir, NULL);
    double loss = 0;
    CHECKF(coord_ckpt_metrics_truncate(k, 2, &loss, &err) == 0, "%s", err.msg);
    char *text = NULL;
    size_t n = 0;
    CHECK(sl_read_file(path, 1 << 20, &text, &n, &err) == 0);
    sl_buf want = {0};
    sl_buf_printf(&want, "%s\n", cur);
    for (int step = 1; step <= 2; step++) {
        sl_buf_printf(&want, "%d,1,%.6f", step, 7.0 - step);
        for (int c = 3; c <= old_cols; c++)
            sl_buf_printf(&want, ",%d", c);
        sl_buf_printf(&want, "%.*s\n", pad, ",,,,,,,,");
    }
    CHECKF(pad == 3 && text && !strcmp(text, want.s) && loss == 5.0, "pad %d, loss %g:\n%s\nnot\n%s",
           pad, loss, text ? text : "", want.s);
    free(text);
    /* another kind of header: the rows after the committed step go, the rest stays */
    const char *other = "step,something_else\n1,a\n2,b\n";
    CHECK(sl_write_file_atomic(path, other, strlen(other), &err) == 0);
    CHECK(coord_ckpt_metrics_truncate(k, 1, &loss, &err) == 0);
    CHECK(sl_read_file(path, 1 << 20, &text, &n, &err) == 0 &&
          !strcmp(text, "step,something_else\n1,a\n"));
    free(text);
    coord_ckpt_free(k);
    free(b.s);
    free(want.s);
}

int main(void)
{
    sl_log_set_level(SL_LOG_OFF);
    cf_open("store", 1000);
    RUN(test_heartbeat_during_stall);
    RUN(test_fault_loops);
    RUN(test_metrics_old_header);
    cf_close();
    tu_rmtree(root);
    return sl_test_done();
}
