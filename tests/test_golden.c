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
#include "coord_fake.h"
#include "coord_jobs_int.h"

static char logpath[600], golden_dir[4096];
static int saved_stderr = -1;

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

/* The lines of the log that say job's state, as "state reason". The
 * driver logs a state after the job entered it (its effects run after the
 * lock is released): the log is read once its last state is the job's. */
static void trace_states(sl_buf *out, const char *job)
{
    char *text = NULL, want[64], now[96];
    size_t n = 0;
    sl_err err = {0};
    snprintf(want, sizeof want, "coordinator: job job=%s state=", job);
    jview v;
    view(job, &v);
    free(v.plan);
    snprintf(now, sizeof now, "%s%s", want, v.state);
    for (double t0 = sl_now_s(); sl_now_s() - t0 < WAIT_S; usleep(10 * 1000)) {
        fflush(stderr);
        free(text);
        text = NULL;
        if (sl_read_file(logpath, 64u << 20, &text, &n, &err))
            return;
        char *last = NULL;
        for (char *p = strstr(text, want); p; p = strstr(p + 1, want))
            last = p;
        if (last && !strncmp(last, now, strlen(now)) &&
            (last[strlen(now)] == ' ' || last[strlen(now)] == '\n' || !last[strlen(now)]))
            break;
    }
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
    /* C, which the plan leaves out, back first: the re-plan, made once the
     * plan's devices are back, weighs it again whatever the timing */
    heartbeat(&D[2]);
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
    /* the job tries again after 1 s rather than the default 10: the same
     * decisions, without 10 s of nothing to decide */
    coord_job_policy pol = coord_job_policy_default();
    pol.store_retry_ms = 1000;
    coord_jobs_set_policy(C->jobs, &pol);
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
    /* the coordinator's log says each state it gives a job */
    char logdir[] = "/tmp/skyloom-golden-log-XXXXXX";
    if (!mkdtemp(logdir))
        return 1;
    snprintf(logpath, sizeof logpath, "%s/log", logdir);
    saved_stderr = dup(2);
    if (!freopen(logpath, "w", stderr)) {
        perror(logpath);
        return 1;
    }
    setvbuf(stderr, NULL, _IOLBF, 0);
    sl_log_set_level(SL_LOG_INFO);
    cf_open("golden", 1000);
    RUN(test_runs);
    RUN(test_run_failure);
    RUN(test_device_lost);
    RUN(test_store_failed);
    RUN(test_restart); /* last: the reopened coordinator holds a new job for 3 heartbeats + 2 s */
    cf_close();
    fflush(stderr);
    /* what the test itself said goes back to its stderr */
    char *text = NULL;
    size_t n = 0;
    sl_err err = {0};
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
    if (!getenv("SKYLOOM_GOLDEN_KEEP")) {
        tu_rmtree(root);
        tu_rmtree(logdir);
    }
    return sl_test_done();
}
