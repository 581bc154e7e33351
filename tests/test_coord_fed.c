/* test_coord_fed.c - a job of several data owners through the coordinator's
 * handlers (coord_fake.h): bad federations refused at submit with the
 * reason; each owner checks its own dataset; the plan has a replica per
 * owner, each starting (and, U-shaped, ending) at its owner, no device in
 * two; a step commits when every replica's parts are in; the manifest
 * names each file's replica and a device fetches only its replica's files
 * (and the data record of its own data). A classification job: its
 * config, the owners' checks (task, label count, the same labels) and the
 * profiles' task. */
#define NDEV 4
#include <math.h>

#include "coord_fake.h"

static void test_refusals(void)
{
    char data[128], bad[160], opts[256], *id;
    rpc_status st;
    snprintf(data, sizeof data, "%s:books,%s:news", D[0].id, D[1].id);
    static const struct {
        const char *opts, *why;
    } cases[] = {
        {"{\"steps\": 4}", "owner_batch has 0 entries for 2 data owners"},
        {"{\"steps\": 4, \"owner_batch\": [2, 2, 2]}", "owner_batch has 3 entries for 2 data owners"},
        {"{\"steps\": 4, \"micro_batches\": 2, \"owner_batch\": [3, 2]}",
         "owner_batch 3 is not a multiple of micro_batches 2"},
        {"{\"steps\": 4, \"owner_batch\": [2, 2], \"sync\": \"outer:10\"}",
         "sync outer:10 syncs less often than the job's 4 steps"},
        {"{\"steps\": 4, \"owner_batch\": [2, 2], \"sync\": \"outer:0\"}", "is not step or outer:H"},
        {"{\"steps\": 4, \"owner_batch\": [2, 2], \"codec_sync\": \"int4\"}",
         "codec_sync 'int4' is not none"},
        {"{\"steps\": 4, \"owner_batch\": [2, 2], \"placement\": \"fair\"}",
         "placement 'fair' is not balanced or equal"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int code = submit_data_code(data, cases[i].opts, &id, &st);
        CHECKF(code == RPC_INVALID_ARGUMENT && !*id && strstr(st.details, cases[i].why), "%s: %s",
               cases[i].opts, st.details);
        free(id);
    }
    snprintf(bad, sizeof bad, "%s:books,%s:news", D[0].id, D[0].id);
    CHECKF(submit_data_code(bad, "{\"steps\": 4, \"owner_batch\": [2, 2]}", &id, &st) ==
               RPC_INVALID_ARGUMENT && strstr(st.details, "is named by two data owners"),
           "%s", st.details);
    free(id);
    snprintf(opts, sizeof opts, "{\"steps\": 4, \"sync\": \"outer:2\"}");
    CHECKF(submit_code(opts, &id, &st) == RPC_INVALID_ARGUMENT &&
           strstr(st.details, "are for several data owners"), "%s", st.details);
    free(id);
    CHECKF(submit_code("{\"steps\": 4, \"placement\": \"equal\"}", &id, &st) ==
               RPC_INVALID_ARGUMENT && strstr(st.details, "placement equal is for several data owners"),
           "%s", st.details);
    free(id);
    snprintf(bad, sizeof bad, "%s:books,x", D[0].id);
    CHECKF(submit_data_code(bad, "{\"steps\": 4, \"owner_batch\": [2, 2]}", &id, &st) ==
               RPC_INVALID_ARGUMENT && strstr(st.details, "'x' is not DEVICE_ID:NAME"),
           "%s", st.details);
    free(id);
}

static int list_files(const fdev *dev, const char *job, char names[32][96])
{
    Skyloom__V1__FetchFileRequest q = SKYLOOM__V1__FETCH_FILE_REQUEST__INIT;
    q.device_id = (char *)dev->id;
    q.job_id = (char *)job;
    q.step = UINT32_MAX;
    q.name = "";
    Skyloom__V1__FetchFileResponse *r = NULL;
    rpc_status st;
    int n = -1;
    if (call(coord_handle_fetch_file, dev->id, &q, &skyloom__v1__fetch_file_response__descriptor,
             (void **)&r, &st) == RPC_OK && r) {
        n = 0;
        for (size_t i = 0; i < r->n_names && n < 32; i++)
            snprintf(names[n++], 96, "%s", r->names[i]);
    }
    rpc_unpacked_free(r);
    return n;
}

/* A step report of stage i of plan v that sent raw bytes of sync payloads
 * in wire bytes of frames; the call's code. */
static int report_sync(const jview *v, const char *job, int i, int step, double loss, uint64_t raw,
                       uint64_t wire, rpc_status *st)
{
    Skyloom__V1__ReportStepRequest q = SKYLOOM__V1__REPORT_STEP_REQUEST__INIT;
    q.device_id = (char *)v->stage_dev[i];
    q.job_id = (char *)job;
    q.epoch = (uint32_t)v->epoch;
    q.stage = (uint32_t)i;
    q.step = (uint32_t)step;
    q.loss = loss;
    q.step_s = 0.1;
    q.masked = 10;
    q.raw_bytes_sync = raw;
    q.wire_bytes_sync = wire;
    void *r = NULL;
    int code = call(coord_handle_report_step, v->stage_dev[i], &q,
                    &skyloom__v1__report_step_response__descriptor, &r, st);
    rpc_unpacked_free(r);
    return code;
}

/* Step 1 of a two-owner job whose stages report sync bytes (stage i: 100
 * (i + 1) payload bytes in 40 more as frames; replica r's loss 5 + r):
 * metrics.csv's row has each replica's loss and the bytes added up,
 * GetJob's last step, the snapshot, the dashboard's page and /metrics each
 * replica's; frames smaller than their payloads are refused. */
static void check_sync_bytes(const char *id, const jview *v, const int rep_first[3])
{
    rpc_status st;
    CHECKF(report_sync(v, id, 0, 1, 5, 100, 99, &st) == RPC_INVALID_ARGUMENT &&
               strstr(st.details, "100 bytes of replica sync payloads in 99 bytes of frames"),
           "%s", st.details);
    uint64_t sum = 0, per[2] = {0, 0};
    for (int i = v->p - 1; i >= 0; i--) {
        int r = i >= rep_first[1];
        uint64_t raw = 100 * (uint64_t)(i + 1);
        sum += raw;
        per[r] += raw;
        CHECKF(report_sync(v, id, i, 1, i == rep_first[r + 1] - 1 ? 5 + r : 0, raw, raw + 40,
                           &st) == RPC_OK, "%s", st.details);
    }
    char path[4096], *csv = NULL, want[256];
    size_t n = 0;
    sl_err err = {0};
    snprintf(path, sizeof path, "%s/jobs/%s/metrics.csv", state, id);
    snprintf(want, sizeof want, ",5.000000;6.000000,%llu,%llu\n", (unsigned long long)sum,
             (unsigned long long)(sum + 40 * (uint64_t)v->p));
    int found = 0;
    for (double t0 = sl_now_s(); !found && sl_now_s() - t0 < 15; usleep(20 * 1000)) {
        free(csv);
        csv = NULL;
        found = sl_read_file(path, 1 << 20, &csv, &n, &err) == 0 && strstr(csv, want);
    }
    CHECKF(found && strstr(csv, ",replica_loss,sync_raw_bytes,sync_wire_bytes\n1,"),
           "metrics.csv lacks %s: %s", want, csv ? csv : err.msg);
    free(csv);

    Skyloom__V1__GetJobRequest gq = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    gq.job_id = (char *)id;
    Skyloom__V1__JobInfo *ji = NULL;
    CHECKF(call(coord_handle_get_job, CERT_ADMIN_CN, &gq, &skyloom__v1__job_info__descriptor,
                (void **)&ji, &st) == RPC_OK, "%s", st.details);
    json_error_t je;
    json_t *ls = ji ? json_loads(ji->stages, 0, &je) : NULL, *reps = json_object_get(ls, "replicas");
    CHECKF(json_array_size(reps) == 2, "%s", ji ? ji->stages : "");
    for (int r = 0; r < 2 && json_array_size(reps) == 2; r++) {
        json_t *x = json_array_get(reps, (size_t)r);
        CHECKF(!strcmp(json_string_value(json_object_get(x, "owner")) ?: "", D[r].id) &&
                   json_number_value(json_object_get(x, "loss")) == 5 + r &&
                   json_integer_value(json_object_get(x, "sync_raw_bytes")) == (json_int_t)per[r] &&
                   json_integer_value(json_object_get(x, "first_stage")) == rep_first[r] &&
                   json_array_size(json_object_get(x, "devices")) ==
                       (size_t)(rep_first[r + 1] - rep_first[r]),
               "replica %d: %s", r, ji->stages);
    }
    json_t *s0 = json_array_get(json_object_get(ls, "stages"), 0);
    CHECK(json_integer_value(json_object_get(json_object_get(s0, "sync"), "wire_bytes")) == 140);
    json_decref(ls);
    rpc_unpacked_free(ji);

    coord_snapshot s;
    CHECK(coord_jobs_snapshot(C->jobs, id, &s) == 0);
    const coord_obs_job *j = &s.job[0];
    CHECKF(j->nrep == 2, "%d replicas", j->nrep);
    for (int r = 0; r < j->nrep && r < 2; r++)
        CHECKF(!strcmp(j->rep[r].owner, D[r].id) && j->rep[r].have_loss && j->rep[r].loss == 5 + r &&
                   j->rep[r].sync_raw == per[r] &&
                   j->rep[r].sync_wire == per[r] + 40 * (uint64_t)j->rep[r].stages &&
                   !strncmp(j->rep[r].devices, D[r].id, strlen(D[r].id)),
               "replica %d: %s %llu %s", r, j->rep[r].owner, (unsigned long long)j->rep[r].sync_raw,
               j->rep[r].devices);
    sl_buf page = {0};
    coord_dash_job(&s, "step,epoch,loss\n1,1,5.5\n", &page);
    char row[256];
    snprintf(row, sizeof row, "<tr class=\"replica\"><td class=\"n\">1</td><td><code>%s</code>",
             D[1].id);
    CHECKF(page.s && strstr(page.s, "<table id=\"replicas\">") && strstr(page.s, row) &&
               strstr(page.s, "<td class=\"n\">6.0000</td>"), "%s", page.s ? page.s : "");
    free(page.s);
    sl_buf m = {0};
    coord_state *db = coord_state_attach(C->state, &err);
    CHECK(db && coord_metrics_text(C, db, &s, &m, &err) == 0);
    coord_state_close(db);
    snprintf(want, sizeof want, "skyloom_job_sync_bytes_total{job_id=\"%s\",replica=\"1\","
             "encoding=\"raw\"} %llu\n", id, (unsigned long long)per[1]);
    CHECKF(m.s && strstr(m.s, want), "metrics lack %s", want);
    free(m.s);
    coord_snapshot_free(&s);
}

static void test_two_owners(void)
{
    D[1].dataset = "news";
    heartbeat_all();
    char data[128], *id;
    rpc_status st;
    snprintf(data, sizeof data, "%s:books,%s:news", D[0].id, D[1].id);
    CHECKF(submit_data_code(data, "{\"steps\": 4, \"micro_batches\": 2, \"owner_batch\": [2, 4], "
                            "\"checkpoint_every\": 2, \"algo\": \"even\"}", &id, &st) == RPC_OK,
           "%s", st.details);
    CHECK(pump_until(id, "running", 1));
    jview v;
    CHECK(view(id, &v) == 0 && v.nrep == 2 && v.nowner == 2 && !strcmp(v.owner[0], D[0].id) &&
          !strcmp(v.owner[1], D[1].id));
    /* each replica starts and ends at its owner; a device serves one replica */
    json_error_t je;
    json_t *pj = json_loads(v.plan, 0, &je), *reps = json_object_get(pj, "replicas");
    json_t *stages = json_object_get(pj, "stages");
    int replica_of[NDEV], rep_first[3] = {0, 0, v.p};
    for (int d = 0; d < NDEV; d++)
        replica_of[d] = -1;
    for (int r = 0; r < 2; r++) {
        json_t *rp = json_array_get(reps, (size_t)r);
        int first = (int)json_integer_value(json_object_get(rp, "first_stage"));
        int n = (int)json_integer_value(json_object_get(rp, "stages"));
        rep_first[r] = first;
        CHECK(json_integer_value(json_object_get(rp, "batch")) == (r ? 4 : 2));
        CHECKF(n >= 1 && !strcmp(v.stage_dev[first], D[r].id) && !strcmp(v.stage_dev[first + n - 1], D[r].id),
               "replica %d: stages %d.. (%d)", r, first, n);
        for (int i = first; i < first + n; i++) {
            json_t *s = json_array_get(stages, (size_t)i);
            CHECK(json_integer_value(json_object_get(s, "replica")) == r &&
                  json_integer_value(json_object_get(s, "index")) == i);
            CHECK(v.first_unit[i] == (i == first ? 0 : v.last_unit[i - 1] + 1));
            for (int d = 0; d < NDEV; d++)
                if (!strcmp(v.stage_dev[i], D[d].id)) {
                    CHECKF(replica_of[d] < 0 || replica_of[d] == r, "device %s in replicas %d and %d",
                           D[d].name, replica_of[d], r);
                    replica_of[d] = r;
                }
        }
        CHECK(v.last_unit[first + n - 1] == 3);
    }
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(pj, "sync"), "mode")), "step") &&
          json_integer_value(json_object_get(pj, "batch")) == 6);
    /* the units were timed at the larger replica's micro-batch (4 / 2), and
     * replica 0 (micro-batch 1) takes half of each time: the owners' first
     * stages (speed 1) against the fake's unit times */
    static const double unit_fwd[4] = {0.02, 0.04, 0.04, 0.03};
    CHECKF(D[0].profiled_micro == 2 && D[1].profiled_micro == 2, "profiled at micro-batch %d",
           D[0].profiled_micro);
    for (int r = 0; r < 2; r++) {
        json_t *rp = json_array_get(reps, (size_t)r);
        json_t *b0 = json_array_get(json_object_get(json_object_get(rp, "balancer"), "stages"), 0);
        int first = (int)json_integer_value(json_object_get(rp, "first_stage"));
        double want = 0;
        for (int u = v.first_unit[first]; u <= v.last_unit[first]; u++)
            want += unit_fwd[u] * (r ? 1.0 : 0.5);
        double got = json_number_value(json_object_get(b0, "fwd_s"));
        CHECKF(fabs(got - want) <= 1e-9, "replica %d: stage 0's forward %.6f s, the profile's %.6f",
               r, got, want);
    }
    /* the prediction: the slowest replica plus a sync round every step */
    json_t *sy = json_object_get(pj, "sync");
    double slowest = 0, round_s = json_number_value(json_object_get(sy, "predicted_round_s"));
    for (int r = 0; r < 2; r++) {
        double t = json_number_value(json_object_get(json_array_get(reps, (size_t)r),
                                                     "predicted_iteration_s"));
        slowest = t > slowest ? t : slowest;
    }
    double link_s = json_number_value(json_object_get(sy, "round_link_s")),
           cpu_s = json_number_value(json_object_get(sy, "round_cpu_s"));
    CHECKF(link_s > 0 && cpu_s > 0 && fabs(link_s + cpu_s - round_s) <= 1e-12 * round_s,
           "round %g: links %g, CPU %g", round_s, link_s, cpu_s);
    CHECKF(round_s > 0 && json_number_value(json_object_get(sy, "round_bytes")) > 0 &&
           fabs(json_number_value(json_object_get(sy, "slowest_replica_s")) - slowest) <= 1e-9 * slowest &&
           fabs(json_number_value(json_object_get(pj, "predicted_iteration_s")) - (slowest + round_s)) <=
               1e-9 * (slowest + round_s), "sync %s, slowest %g", json_dumps(sy, 0), slowest);
    json_decref(pj);
    free(v.plan);
    check_sync_bytes(id, &v, rep_first);
    /* the devices train; every replica's parts make the commits */
    int tc = train(id, 4, 2);
    CHECKF(tc == RPC_OK && pump_until(id, "done", 1), "train: %s", rpc_code_name(tc));
    char p[4096], *man = NULL;
    size_t n = 0;
    sl_err err = {0};
    snprintf(p, sizeof p, "%s/jobs/%s/ckpt/step-4/manifest.json", state, id);
    CHECKF(sl_read_file(p, 1 << 20, &man, &n, &err) == 0, "%s", err.msg);
    json_t *m = man ? json_loads(man, 0, &je) : NULL, *f;
    size_t i;
    int per_rep[2] = {0, 0}, datas = 0;
    json_array_foreach(json_object_get(m, "files"), i, f) {
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!strcmp(name, "config.json"))
            continue;
        int r = (int)json_integer_value(json_object_get(f, "replica"));
        CHECKF(json_is_integer(json_object_get(f, "replica")) && (r == 0 || r == 1), "%s", name);
        per_rep[r & 1]++;
        char want[64];
        snprintf(want, sizeof want, "data.%s.json", D[r & 1].id);
        datas += !strncmp(name, "data.", 5);
        if (!strncmp(name, "data.", 5))
            CHECKF(!strcmp(name, want), "%s in replica %d", name, r);
    }
    CHECK(per_rep[0] >= 3 && per_rep[1] >= 3 && datas == 2);
    json_decref(m);
    free(man);
    /* a device lists only its replica's files; an owner its own data record */
    for (int d = 0; d < NDEV; d++) {
        if (replica_of[d] < 0)
            continue;
        char names[32][96];
        int k = list_files(&D[d], id, names);
        CHECK(k > 0);
        for (int x = 0; x < k; x++) {
            int part = !strncmp(names[x], "model.", 6) || !strncmp(names[x], "optim.", 6);
            if (part) {
                int mine = 0;
                for (int e = 0; e < NDEV; e++)
                    if (strstr(names[x], D[e].id))
                        mine = replica_of[e] == replica_of[d];
                CHECKF(mine, "device %s (replica %d) is given %s", D[d].name, replica_of[d], names[x]);
            }
            if (!strncmp(names[x], "data.", 5))
                CHECKF(strstr(names[x], D[d].id) && d < 2, "device %s is given %s", D[d].name,
                       names[x]);
        }
    }
    free(id);
    D[1].dataset = NULL;
    heartbeat_all();
}

/* The job's state and reason after heartbeats until it is `want`. */
static int ended_as(const char *job, const char *want, char *reason, size_t cap)
{
    int ok = pump_until(job, want, 0);
    coord_snapshot s;
    reason[0] = 0;
    if (coord_jobs_snapshot(C->jobs, job, &s) == 0) {
        snprintf(reason, cap, "%s", s.job[0].reason);
        coord_snapshot_free(&s);
    }
    return ok;
}

static void stop(const char *job)
{
    Skyloom__V1__StopJobRequest q = SKYLOOM__V1__STOP_JOB_REQUEST__INIT;
    q.job_id = (char *)job;
    rpc_status st;
    CHECKF(call(coord_handle_stop_job, CERT_ADMIN_CN, &q, NULL, NULL, &st) == RPC_OK, "%s",
           st.details);
}

#define CHECK_MLM "{\"sequences\": 100, \"seq_len\": 8, \"first\": 0, \"vocab_size\": 100"
#define CHECK_CLS_BARE(n, h)                                                                       \
    CHECK_MLM ", \"task\": \"classify\", \"num_labels\": " #n ", \"labels_hash\": \"" h "\""
#define CHECK_CLS(n, h, names) CHECK_CLS_BARE(n, h) ", \"labels\": " names "}"
/* BLAKE2b-256 of the labels.txt images "a\nb\n", "b\na\n" and "a\nb\nc\n" */
#define HASH_A "e622f861cfb90d7fc2773ebf739fd5331515e652d2d3bad8d5a24ec90bf505fd"
#define HASH_B "456513920a00ccadfd9a6c53bc7a2df59383ed9142e570f2921a4c1a2b8ae34b"
#define HASH_C "3b4312af5a1f7e9eb79c27b4503f734d303e6664d2df2796ec034b4c34195dbf"
#define NAMES_A "[\"a\", \"b\"]"

/* A classification job (option task classify): a config that cannot be one
 * is refused at submit naming the option; the owner's check must describe
 * its shard for the job's task with the config's label count (the job
 * fails, saying what and whose, otherwise), several owners the same labels
 * (both named); a profile timed for another head is refused; the plan's
 * options carry the task. */
static void test_classify(void)
{
    char *id, why[512], data[128];
    rpc_status st;
    CHECKF(submit_code("{\"steps\": 4, \"task\": \"regress\"}", &id, &st) == RPC_INVALID_ARGUMENT &&
           strstr(st.details, "options: task 'regress' is not mlm or classify"), "%s", st.details);
    free(id);
    cf_config = "{\"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
                " \"intermediate_size\": 32, \"vocab_size\": 100, \"num_labels\": 1}";
    CHECKF(submit_code("{\"steps\": 4, \"task\": \"classify\"}", &id, &st) == RPC_INVALID_ARGUMENT &&
           strstr(st.details, "options: task classify: ") && strstr(st.details, "num_labels"),
           "%s", st.details);
    free(id);
    cf_config = NULL;
    static const struct {
        const char *task, *check, *why;
    } bad[] = {
        {"classify", CHECK_MLM "}", "checked books for task mlm, not the job's task classify"},
        {"mlm", CHECK_CLS(2, HASH_A, NAMES_A), "checked books for task classify, not the job's task mlm"},
        {"classify", CHECK_MLM ", \"task\": \"classify\"}", "described books without its labels"},
        {"classify", CHECK_CLS(3, HASH_C, "[\"a\", \"b\", \"c\"]"),
         "books has 3 labels, the job's config num_labels 2"},
        {"classify", CHECK_CLS(2, HASH_A, "[\"a\", \"c\"]"),
         "described books with label names that are not its labels_hash's 2 names"},
        {"classify", CHECK_CLS(2, HASH_A, "[\"a\"]"),
         "described books with label names that are not its labels_hash's 2 names"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char opts[96];
        snprintf(opts, sizeof opts, "{\"steps\": 4, \"task\": \"%s\"}", bad[i].task);
        D[0].check = bad[i].check;
        id = submit(opts);
        CHECKF(ended_as(id, "failed", why, sizeof why) && strstr(why, D[0].id) &&
               strstr(why, bad[i].why), "%s: %s", bad[i].check, why);
        free(id);
    }
    /* two owners whose labels differ */
    D[1].dataset = "news";
    D[0].check = CHECK_CLS(2, HASH_A, NAMES_A);
    D[1].check = CHECK_CLS(2, HASH_B, "[\"b\", \"a\"]");
    heartbeat_all();
    snprintf(data, sizeof data, "%s:books,%s:news", D[0].id, D[1].id);
    static const char *fed = "{\"steps\": 4, \"owner_batch\": [2, 2], \"task\": \"classify\", "
                             "\"algo\": \"even\"}";
    CHECKF(submit_data_code(data, fed, &id, &st) == RPC_OK, "%s", st.details);
    CHECKF(ended_as(id, "failed", why, sizeof why) && strstr(why, "the data owners' labels differ") &&
           strstr(why, D[0].id) && strstr(why, D[1].id) && strstr(why, "books") &&
           strstr(why, "news"), "%s", why);
    free(id);
    /* the same labels (the second owner's names left out, as a check leaves
     * out long ones): planned for the classification head; a device whose
     * profile timed the MLM head is refused */
    D[1].check = CHECK_CLS_BARE(2, HASH_A) "}";
    D[2].task = "mlm";
    CHECKF(submit_data_code(data, fed, &id, &st) == RPC_OK, "%s", st.details);
    CHECK(pump_until(id, "running", 1));
    jview v;
    CHECK(view(id, &v) == 0 && v.plan);
    json_error_t je;
    json_t *pj = v.plan ? json_loads(v.plan, 0, &je) : NULL;
    CHECKF(!strcmp(json_string_value(json_object_get(json_object_get(pj, "options"), "task")) ?: "",
                   "classify"), "%s", v.plan ? v.plan : "no plan");
    for (int i = 0; i < v.p; i++)
        CHECKF(strcmp(v.stage_dev[i], D[2].id), "stage %d on %s, whose profile was refused", i,
               D[2].name);
    json_decref(pj);
    free(v.plan);
    Skyloom__V1__GetJobRequest q = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    q.job_id = id;
    Skyloom__V1__JobInfo *ji = NULL;
    CHECKF(call(coord_handle_get_job, CERT_ADMIN_CN, &q, &skyloom__v1__job_info__descriptor,
                (void **)&ji, &st) == RPC_OK && ji, "%s", st.details);
    json_t *pr = ji ? json_loads(ji->profiles, 0, &je) : NULL, *pc = json_object_get(pr, D[2].id);
    CHECKF(json_is_true(json_object_get(pc, "failed")) &&
           strstr(json_string_value(json_object_get(pc, "reason")) ?: "",
                  "units profiled for task mlm, the job's task is classify"),
           "%s", ji ? ji->profiles : "");
    CHECK(json_is_string(json_object_get(json_object_get(pr, D[3].id), "task")));
    json_decref(pr);
    /* the job's data: each owner's label count and hash, and the names it gave */
    json_t *dj = ji ? json_loads(ji->data, 0, &je) : NULL;
    json_t *d0 = json_array_get(dj, 0), *d1 = json_array_get(dj, 1);
    CHECKF(json_integer_value(json_object_get(d0, "num_labels")) == 2 &&
           !strcmp(json_string_value(json_object_get(d1, "labels_hash")) ?: "", HASH_A) &&
           !strcmp(json_string_value(json_array_get(json_object_get(d0, "labels"), 1)) ?: "", "b") &&
           !json_object_get(d1, "labels"), "%s", ji ? ji->data : "");
    json_decref(dj);
    rpc_unpacked_free(ji);
    stop(id);
    free(id);
    D[0].check = D[1].check = NULL;
    D[2].task = NULL;
    D[1].dataset = NULL;
    heartbeat_all();
}

/* placement equal: the devices that own no data dealt to the replicas in
 * turn (one each here), the option in the plan; under outer:2 the plan
 * charges half a sync round per step. */
static void test_equal_share(void)
{
    D[1].dataset = "news";
    heartbeat_all();
    char data[128], *id;
    rpc_status st;
    snprintf(data, sizeof data, "%s:books,%s:news", D[0].id, D[1].id);
    CHECKF(submit_data_code(data, "{\"steps\": 4, \"micro_batches\": 2, \"owner_batch\": [2, 2], "
                            "\"placement\": \"equal\", \"sync\": \"outer:2\", \"codec_sync\": \"int8\"}",
                            &id, &st) == RPC_OK, "%s", st.details);
    CHECK(pump_until(id, "running", 1));
    jview v;
    CHECK(view(id, &v) == 0 && v.plan);
    json_error_t je;
    json_t *pj = v.plan ? json_loads(v.plan, 0, &je) : NULL, *reps = json_object_get(pj, "replicas");
    CHECKF(!strcmp(json_string_value(json_object_get(json_object_get(pj, "options"), "placement")) ?: "",
                   "equal"), "%s", v.plan ? v.plan : "no plan");
    /* bal_fed_even deals D2 to replica 0 and D3 to replica 1; a replica's
     * plan may leave its share out, never take the other's */
    for (int r = 0; r < 2; r++) {
        json_t *rp = json_array_get(reps, (size_t)r);
        int first = (int)json_integer_value(json_object_get(rp, "first_stage"));
        int n = (int)json_integer_value(json_object_get(rp, "stages"));
        for (int i = first; i < first + n; i++)
            CHECKF(!strcmp(v.stage_dev[i], D[r].id) || !strcmp(v.stage_dev[i], D[2 + r].id),
                   "replica %d: stage %d on %s", r, i, v.stage_dev[i]);
    }
    json_t *sy = json_object_get(pj, "sync");
    double round_s = json_number_value(json_object_get(sy, "predicted_round_s")),
           slowest = json_number_value(json_object_get(sy, "slowest_replica_s"));
    CHECKF(round_s > 0 && slowest > 0 &&
           fabs(json_number_value(json_object_get(pj, "predicted_iteration_s")) - (slowest + round_s / 2)) <=
               1e-9 * slowest, "%s", v.plan ? v.plan : "");
    json_decref(pj);
    free(v.plan);
    stop(id);
    free(id);
    D[1].dataset = NULL;
    heartbeat_all();
}

/* The first owner goes away under outer:H: the other replica goes on
 * alone, planned with the sync round of the replicas present (none but
 * itself: no bytes, no links, its own codec's CPU). */
static void test_first_owner_away(void)
{
    D[1].dataset = "news";
    heartbeat_all();
    char data[128], *id;
    rpc_status st;
    snprintf(data, sizeof data, "%s:books,%s:news", D[0].id, D[1].id);
    CHECKF(submit_data_code(data, "{\"steps\": 8, \"micro_batches\": 2, \"owner_batch\": [2, 2], "
                            "\"checkpoint_every\": 2, \"algo\": \"even\", \"sync\": \"outer:2\", "
                            "\"codec_sync\": \"int8\"}", &id, &st) == RPC_OK, "%s", st.details);
    CHECK(pump_until(id, "running", 1));
    CHECK(train(id, 2, 2) == RPC_OK);
    D[0].alive = 0;
    CHECK(pump_until(id, "running", 2));
    jview v;
    CHECK(view(id, &v) == 0 && v.plan);
    json_error_t je;
    json_t *pj = v.plan ? json_loads(v.plan, 0, &je) : NULL, *sy = json_object_get(pj, "sync");
    for (int i = 0; i < v.p; i++)
        CHECKF(strcmp(v.stage_dev[i], D[0].id), "stage %d on the owner away", i);
    CHECKF(v.p >= 1 && !strcmp(v.stage_dev[0], D[1].id) && sy &&
           json_number_value(json_object_get(sy, "round_bytes")) == 0 &&
           json_number_value(json_object_get(sy, "round_link_s")) == 0 &&
           json_number_value(json_object_get(sy, "predicted_round_s")) ==
               json_number_value(json_object_get(sy, "round_cpu_s")),
           "%s", v.plan ? v.plan : "no plan");
    json_decref(pj);
    free(v.plan);
    stop(id);
    free(id);
    D[0].alive = 1;
    D[1].dataset = NULL;
    heartbeat_all();
}

int main(void)
{
    sl_log_set_level(SL_LOG_OFF);
    cf_open("cfed", 1000);
    RUN(test_refusals);
    RUN(test_two_owners);
    RUN(test_classify);
    RUN(test_equal_share);
    RUN(test_first_owner_away);
    cf_close();
    tu_rmtree(root);
    return sl_test_done();
}
