/* test_coord_fed.c - a job of several data owners through the coordinator's
 * handlers (coord_fake.h): bad federations refused at submit with the
 * reason; each owner checks its own dataset; the plan has a replica per
 * owner, each starting (and, U-shaped, ending) at its owner, no device in
 * two; a step commits when every replica's parts are in; the manifest
 * names each file's replica and a device fetches only its replica's files
 * (and the data record of its own data). */
#define NDEV 4
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
    int replica_of[NDEV];
    for (int d = 0; d < NDEV; d++)
        replica_of[d] = -1;
    for (int r = 0; r < 2; r++) {
        json_t *rp = json_array_get(reps, (size_t)r);
        int first = (int)json_integer_value(json_object_get(rp, "first_stage"));
        int n = (int)json_integer_value(json_object_get(rp, "stages"));
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
    json_decref(pj);
    free(v.plan);
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

int main(void)
{
    sl_log_set_level(SL_LOG_OFF);
    cf_open("cfed", 1000);
    RUN(test_refusals);
    RUN(test_two_owners);
    cf_close();
    tu_rmtree(root);
    return sl_test_done();
}
