/* The job manager against devices that misbehave, through its handlers
 * (coord_fake.h): an enrolled device outside the job, and devices of the
 * job posing as another or reaching past their own units. Each call is
 * refused with PERMISSION_DENIED (or RESOURCE_EXHAUSTED), counted by
 * reason, and changes nothing: the attacked job ends with the checkpoint of
 * one nobody attacked. */
#define NDEV 4
#include "coord_fake.h"
#include "coord_ckpt.h"
#include "coord_jobs_int.h"

static const char *E_ID(void) { return D[3].id; }

static uint64_t denied(int reason)
{
    coord_snapshot s;
    coord_jobs_snapshot(C->jobs, NULL, &s);
    uint64_t v = s.denied[reason];
    coord_snapshot_free(&s);
    return v;
}

static char *opts_abc(void)
{
    char *o = sl_xmalloc(512);
    snprintf(o, 512, "{\"steps\": 6, \"batch\": 4, \"micro_batches\": 2, \"checkpoint_every\": 2, "
             "\"algo\": \"even\", \"u_shape\": false, \"devices\": [\"%s\", \"%s\", \"%s\"]}",
             D[0].id, D[1].id, D[2].id);
    return o;
}

static int report_failure(const fdev *by, const char *job, int epoch, const char *lost)
{
    Skyloom__V1__ReportTaskRequest q = SKYLOOM__V1__REPORT_TASK_REQUEST__INIT;
    char res[96];
    snprintf(res, sizeof res, "{\"lost\": \"%s\"}", lost);
    q.device_id = (char *)by->id;
    q.job_id = (char *)job;
    q.kind = "run";
    q.epoch = (uint32_t)epoch;
    q.ok = 0;
    q.reason = "the link broke";
    q.result = res;
    rpc_status st;
    return call(coord_handle_report_task, by->id, &q, NULL, NULL, &st);
}

/* The names device `dev` is given when it lists the committed step. */
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

static int fetch_one(const fdev *dev, const char *job, const char *name)
{
    Skyloom__V1__FetchFileRequest q = SKYLOOM__V1__FETCH_FILE_REQUEST__INIT;
    q.device_id = (char *)dev->id;
    q.job_id = (char *)job;
    q.step = UINT32_MAX;
    q.name = (char *)name;
    rpc_status st;
    return call(coord_handle_fetch_file, dev->id, &q, NULL, NULL, &st);
}

static void test_outsider_and_impostors(void)
{
    char *o = opts_abc(), *job = submit(o), *clean = submit(o);
    free(o);
    CHECK(pump_until(job, "running", 1) && pump_until(clean, "running", 1));
    CHECK(train(job, 2, 2) == RPC_OK && train(clean, 6, 2) == RPC_OK);
    jview v;
    view(job, &v);
    const char *mid = v.stage_dev[1];
    fdev *M = dev_by_id(mid), *A = &D[0];
    CHECKF(v.p == 3 && M && M != A, "%d stages", v.p);
    /* an enrolled device in no part of the job: every call refused */
    uint64_t d0 = denied(COORD_DENY_NOT_MEMBER);
    CHECK(report_failure(&D[3], job, v.epoch, mid) == RPC_PERMISSION_DENIED);
    Skyloom__V1__GetPlanRequest gq = SKYLOOM__V1__GET_PLAN_REQUEST__INIT;
    gq.device_id = (char *)E_ID();
    gq.job_id = job;
    rpc_status st;
    CHECK(call(coord_handle_get_plan, E_ID(), &gq, NULL, NULL, &st) == RPC_PERMISSION_DENIED);
    char name[96];
    snprintf(name, sizeof name, "model.%s.safetensors", E_ID());
    CHECK(upload(&D[3], &v, job, v.epoch, 4, name) == RPC_PERMISSION_DENIED);
    CHECK(fetch_one(&D[3], job, "config.json") == RPC_PERMISSION_DENIED);
    CHECK(denied(COORD_DENY_NOT_MEMBER) == d0 + 4);
    jview w;
    view(job, &w);
    CHECK(!strcmp(w.state, "running") && w.epoch == v.epoch);
    free(w.plan);
    /* a device of the job: another's tag, and tensors of units it does not run */
    d0 = denied(COORD_DENY_NOT_OWN_PART);
    snprintf(name, sizeof name, "model.%s.safetensors", A->id);
    CHECK(upload(M, &v, job, v.epoch, 4, name) == RPC_PERMISSION_DENIED);
    CHECK(upload(M, &v, job, v.epoch, 4, "data.json") == RPC_PERMISSION_DENIED);
    jview lie = v; /* it claims the first stage's units */
    snprintf(lie.stage_dev[0], CERT_ID_LEN, "%s", M->id);
    snprintf(name, sizeof name, "model.%s-u0.safetensors", M->id);
    CHECK(upload(M, &lie, job, v.epoch, 4, name) == RPC_PERMISSION_DENIED);
    CHECK(denied(COORD_DENY_NOT_OWN_PART) == d0 + 3);
    /* a failure report naming a device it exchanges nothing with (here one
     * of no stage) is not weighed */
    d0 = denied(COORD_DENY_NOT_NEIGHBOUR);
    CHECK(report_failure(M, job, v.epoch, E_ID()) == RPC_OK);
    CHECK(denied(COORD_DENY_NOT_NEIGHBOUR) == d0 + 1);
    /* that report still ends the epoch (its own failure), and loses nobody */
    CHECK(pump_until(job, "running", v.epoch + 1));
    Skyloom__V1__GetJobRequest jq = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    jq.job_id = job;
    Skyloom__V1__JobInfo *ji = NULL;
    CHECK(call(coord_handle_get_job, CERT_ADMIN_CN, &jq, &skyloom__v1__job_info__descriptor,
               (void **)&ji, &st) == RPC_OK && ji && !strstr(ji->events, "\"kind\":\"lost\""));
    rpc_unpacked_free(ji);
    free(v.plan);
    CHECK(train(job, 6, 2) == RPC_OK);
    CHECK(pump_until(job, "done", 1) && pump_until(clean, "done", 1));
    /* the attacked job ends with the checkpoint of the one nobody attacked */
    char p1[4096], p2[4096], *m1 = NULL, *m2 = NULL;
    size_t n1 = 0, n2 = 0;
    sl_err err = {0};
    snprintf(p1, sizeof p1, "%s/jobs/%s/ckpt/step-6/manifest.json", state, job);
    snprintf(p2, sizeof p2, "%s/jobs/%s/ckpt/step-6/manifest.json", state, clean);
    CHECK(!sl_read_file(p1, 1 << 20, &m1, &n1, &err) && !sl_read_file(p2, 1 << 20, &m2, &n2, &err) &&
          !strcmp(m1, m2));
    free(m1);
    free(m2);
    /* what each device may fetch of the committed step: its own units' parts */
    char names[32][96];
    view(job, &v);
    for (int i = 0; i < 3; i++) {
        int n = list_files(&D[i], job, names), own = 0, other = 0, data = 0;
        for (int k = 0; k < n; k++) {
            int part = !strncmp(names[k], "model.", 6) || !strncmp(names[k], "optim.", 6);
            own += part && strstr(names[k], D[i].id) != NULL;
            other += part && !strstr(names[k], D[i].id);
            data += !strcmp(names[k], "data.json");
        }
        /* the fake devices upload a model and an optimizer part each */
        CHECKF(n > 0 && own == 2 && other == 0 && data == (i == 0),
               "device %s lists %d files: %d its parts, %d others'", D[i].name, n, own, other);
    }
    d0 = denied(COORD_DENY_FETCH);
    snprintf(name, sizeof name, "model.%s.safetensors", A->id);
    CHECK(fetch_one(M, job, name) == RPC_PERMISSION_DENIED);
    CHECK(fetch_one(M, job, "data.json") == RPC_PERMISSION_DENIED);
    CHECK(fetch_one(A, job, "data.json") == RPC_OK);
    CHECK(fetch_one(M, job, "config.json") == RPC_OK);
    CHECK(denied(COORD_DENY_FETCH) == d0 + 2);
    free(v.plan);
    free(job);
    free(clean);
}

/* The store keeps a device to its own steps and shares: a piece of a far
 * step does not reset another device's part under way, five steps at once
 * are refused, and so are pieces past a quota. */
static void test_store_shares(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/shares", root);
    CHECK(mkdir(dir, 0700) == 0);
    coord_ckpt *k = coord_ckpt_new(dir, NULL);
    coord_ckpt_set_model(k, 4, 1000, 1500);
    uint8_t all[4] = {1, 1, 1, 1}, buf[900] = {0};
    char why[600];
    int complete;
    coord_piece a = {"d000000000000000a", 10, "data.json", 0, buf, 100, 0, 0, NULL, 0, all, 4, 0};
    CHECK(coord_ckpt_piece(k, &a, &complete, why, sizeof why) == COORD_PIECE_OK);
    coord_piece b = a;
    b.device = "d000000000000000b";
    b.step = 10 + 32; /* the same slot of a ring of 32 steps */
    CHECK(coord_ckpt_piece(k, &b, &complete, why, sizeof why) == COORD_PIECE_OK);
    CHECK(coord_ckpt_part_size(k, "d000000000000000a", 10, "data.json") == 100);
    for (int s = 1; s <= 3; s++) {
        b.step = 10 + 32 + 2 * s;
        CHECK(coord_ckpt_piece(k, &b, &complete, why, sizeof why) == COORD_PIECE_OK);
    }
    b.step = 100;
    CHECKF(coord_ckpt_piece(k, &b, &complete, why, sizeof why) == COORD_PIECE_QUOTA &&
           strstr(why, "4 steps under way"), "%s", why);
    /* a's device has 900 bytes of 1000 left; the job 1000 of 1500 (b's 400) */
    a.offset = 100;
    a.len = 800;
    CHECK(coord_ckpt_piece(k, &a, &complete, why, sizeof why) == COORD_PIECE_OK);
    a.offset = 900;
    a.len = 200;
    CHECKF(coord_ckpt_piece(k, &a, &complete, why, sizeof why) == COORD_PIECE_QUOTA &&
           strstr(why, "device's share"), "%s", why);
    b.step = 10 + 32; /* its device has 600 bytes left, the job 200 */
    b.offset = 100;
    b.len = 201;
    CHECKF(coord_ckpt_piece(k, &b, &complete, why, sizeof why) == COORD_PIECE_QUOTA &&
           strstr(why, "job's share"), "%s", why);
    coord_ckpt_drop_partials(k);
    coord_ckpt_free(k);
}

static void test_tensor_units(void)
{
    CHECK(coord_tensor_unit("bert.embeddings.word_embeddings.weight", 2) == 0);
    CHECK(coord_tensor_unit("bert.encoder.layer.1.output.dense.weight.exp_avg", 2) == 2);
    CHECK(coord_tensor_unit("bert.encoder.layer.2.output.dense.weight", 2) == -1);
    CHECK(coord_tensor_unit("bert.encoder.layer.-1.x", 2) == -1);
    CHECK(coord_tensor_unit("bert.encoder.layer.0", 2) == -1);
    CHECK(coord_tensor_unit("cls.predictions.decoder.weight", 2) == 3);
    CHECK(coord_tensor_unit("classifier.bias", 2) == 3);
    CHECK(coord_tensor_unit("../../etc/passwd", 2) == -1);
    /* a federation's sync state: the unit of the name after its prefix */
    CHECK(coord_tensor_unit("outer.bert.encoder.layer.1.output.dense.weight.momentum", 2) == 2);
    CHECK(coord_tensor_unit("outer.cls.predictions.decoder.weight", 2) == 3);
    CHECK(coord_tensor_unit("replica.1.bert.embeddings.word_embeddings.weight.residual", 2) == 0);
    CHECK(coord_tensor_unit("replica.12.bert.encoder.layer.0.attention.self.query.weight", 2) == 1);
    CHECK(coord_tensor_unit("replica.123.bert.embeddings.x", 2) == -1);
    CHECK(coord_tensor_unit("replica.x.bert.embeddings.x", 2) == -1);
    CHECK(coord_tensor_unit("replica.1bert.embeddings.x", 2) == -1);
    CHECK(coord_tensor_unit("outer.outer.bert.embeddings.x", 2) == -1);
    CHECK(coord_tensor_unit("outer.replica.1.bert.embeddings.x", 2) == -1);
    /* and its part names */
    CHECK(coord_part_name_ok("fed.d0123456789abcdef-u3.safetensors") &&
          coord_part_name_ok("model.d0123456789abcdef-u3.safetensors"));
    CHECK(!coord_part_name_ok("fed..safetensors") && !coord_part_name_ok("fed.a.b.safetensors") &&
          !coord_part_name_ok("fed/x.safetensors") && !coord_part_name_ok("feds.d01-u3.safetensors"));
}

/* The data owner's policy, stated in its heartbeats: a job that contradicts
 * it is refused at submit, naming the option and what would lift it; a job
 * within it is planned with the owner's home layers on the owner. */
static void test_owner_policy(void)
{
    Skyloom__V1__OwnerPolicy pol = SKYLOOM__V1__OWNER_POLICY__INIT;
    pol.home_layers = 1;
    D[0].policy = &pol;
    heartbeat_all();
    char opts[512], *id;
    rpc_status st;
    snprintf(opts, sizeof opts, "{\"steps\": 2, \"batch\": 4, \"micro_batches\": 2, "
             "\"checkpoint_every\": 2, \"algo\": \"even\", \"u_shape\": false, \"devices\": "
             "[\"%s\", \"%s\", \"%s\"]}", D[0].id, D[1].id, D[2].id);
    CHECKF(submit_code(opts, &id, &st) == RPC_FAILED_PRECONDITION && !*id &&
           strstr(st.details, "drop --no-u-shape (or its device runs with --allow-labels-out)") &&
           strstr(st.details, D[0].id), "%s", st.details);
    free(id);
    char *sealed_off = strstr(opts, "\"u_shape\": false");
    memcpy(sealed_off, "\"sealed\":  false", strlen("\"sealed\":  false"));
    CHECKF(submit_code(opts, &id, &st) == RPC_FAILED_PRECONDITION && !*id &&
           strstr(st.details, "drop --no-seal (or its device runs with --allow-unsealed)"),
           "%s", st.details);
    free(id);
    /* within the policy: units 0..1 on the owner, the head too (U-shaped) */
    memcpy(sealed_off, "\"sealed\":   true", strlen("\"sealed\":   true"));
    char *job = submit(opts);
    CHECK(pump_until(job, "running", 1));
    jview v;
    CHECK(view(job, &v) == 0 && v.p >= 2);
    CHECKF(!strcmp(v.stage_dev[0], D[0].id) && v.first_unit[0] == 0 && v.last_unit[0] >= 1 &&
           !strcmp(v.stage_dev[v.p - 1], D[0].id) && v.last_unit[v.p - 1] == 3,
           "stage 0: %s units %d..%d", v.stage_dev[0], v.first_unit[0], v.last_unit[0]);
    free(v.plan);
    CHECK(train(job, 2, 2) == RPC_OK && pump_until(job, "done", 1));
    free(job);
    /* a policy that allows it: the plain chain is taken */
    pol.allow_labels_out = 1;
    heartbeat_all();
    snprintf(opts, sizeof opts, "{\"steps\": 2, \"batch\": 4, \"micro_batches\": 2, "
             "\"checkpoint_every\": 2, \"algo\": \"even\", \"u_shape\": false, \"devices\": "
             "[\"%s\", \"%s\", \"%s\"]}", D[0].id, D[1].id, D[2].id);
    job = submit(opts);
    CHECK(pump_until(job, "running", 1) && view(job, &v) == 0 && v.p >= 2 &&
          strcmp(v.stage_dev[v.p - 1], D[0].id) && v.last_unit[0] >= 1);
    free(v.plan);
    CHECK(train(job, 2, 2) == RPC_OK && pump_until(job, "done", 1));
    free(job);
    D[0].policy = NULL;
    heartbeat_all();
}

int main(void)
{
    sl_log_set_level(SL_LOG_OFF);
    cf_open("ctrust", 1000);
    RUN(test_tensor_units);
    RUN(test_store_shares);
    RUN(test_outsider_and_impostors);
    RUN(test_owner_policy);
    cf_close();
    tu_rmtree(root);
    return sl_test_done();
}
