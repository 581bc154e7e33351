/* coord_jobs_rpc.c - the job manager's calls (service Coordinator): submit,
 * list, status, stop, resume, the devices' task and step reports and plans
 * (the checkpoint files' calls are in coord_jobs_files.c), and the one way
 * into all of them, coord_call_serve (coord_call.h). */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bal.h"
#include "coord_call.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

/* ---- the one way in ----------------------------------------------------------------- */

/* A string field of a request by name ("" when the message has none). */
static const char *str_field(const ProtobufCMessage *m, const char *name)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
    if (!f || f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED)
        return "";
    const char *v = *(const char *const *)((const char *)m + f->offset);
    return v ? v : "";
}

int coord_call_reply(call *k, const void *msg)
{
    rpc_pack(msg, k->resp);
    return RPC_OK;
}

int coord_call_serve(const method *m, void *ud, const rpc_peer *peer, const uint8_t *req,
                     size_t len, rpc_buf *resp, rpc_status *st)
{
    coord *c = ud;
    ProtobufCMessage *r = rpc_unpack(m->desc, req, len);
    if (!r)
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "malformed %s", m->name);
    call k = {.c = c, .j = c->jobs, .peer = peer, .req = r, .resp = resp, .st = st};
    k.device = str_field(r, "device_id");
    k.job_id = str_field(r, "job_id");
    int code = coord_authorize(c, peer, k.device, m->allow, st);
    if (code == RPC_OK && *k.job_id)
        k.jb = coord_jobs_find(k.j, k.job_id);
    if (code == RPC_OK && m->need_job && !k.jb)
        code = rpc_status_set(st, RPC_NOT_FOUND, "no job '%.40s'", k.job_id);
    /* a device speaks only about the jobs it is part of, in the role the call is for */
    if (code == RPC_OK && k.jb && *k.device) {
        pthread_mutex_lock(&k.j->mu);
        int role = coord_job_member(&k.jb->sm, k.device);
        pthread_mutex_unlock(&k.j->mu);
        if (!(role & m->roles)) {
            coord_jobs_denied(k.j, COORD_DENY_NOT_MEMBER);
            code = rpc_status_set(st, RPC_PERMISSION_DENIED, "device %s has no part in job %s "
                                  "that makes this call", k.device, k.job_id);
        }
    }
    if (code == RPC_OK)
        code = m->body(&k);
    rpc_unpacked_free(r);
    return code;
}

void coord_call_settle(coord_jobs *j, cjob *jb, coord_fx_list *fx)
{
    coord_jobs_queue(j, jb, fx);
    pthread_mutex_unlock(&j->mu);
    coord_jobs_drain(j, jb);
}

/* ---- submitting --------------------------------------------------------------------------- */

char *coord_path_of(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

/* What a refused submit had written: config.json and the start model. */
static void unmake_job_dir(const char *dir)
{
    static const char *const files[] = {"ckpt/step-0/model.safetensors", "ckpt/step-0", "ckpt",
                                        "config.json", NULL};
    for (int i = 0; files[i]; i++) {
        char *p = coord_path_of(dir, files[i]);
        remove(p);
        free(p);
    }
    rmdir(dir);
}

/* The job's directory with config.json and the start model, and its row. */
static int make_job(coord_jobs *j, const coord_job *sm, const char *init_upload, const char *meta,
                    rpc_status *st)
{
    sl_err err = {0};
    char *dir = coord_path_of(j->root, sm->id), *cfg = coord_path_of(dir, "config.json");
    int code = sl_mkdir(j->root, 0700, &err) || sl_mkdir(dir, 0700, &err) ||
                       sl_write_file_atomic(cfg, sm->config, strlen(sm->config), &err)
                   ? rpc_status_set(st, RPC_INTERNAL, "%s", err.msg)
                   : RPC_OK;
    if (code == RPC_OK && init_upload && *init_upload) {
        char *ck = coord_path_of(dir, "ckpt"), *s0 = coord_path_of(dir, "ckpt/step-0"),
             *m = coord_path_of(dir, "ckpt/step-0/model.safetensors");
        if (sl_mkdir(ck, 0700, &err) || sl_mkdir(s0, 0700, &err))
            code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
        else
            code = coord_uploads_claim(j->uploads, init_upload, m, st);
        free(ck);
        free(s0);
        free(m);
    }
    coord_jobrow row = {.id = (char *)sm->id, .num = sm->num, .state = "checking", .reason = "",
                        .config = sm->config, .created = sm->created, .meta = (char *)meta};
    row.options = coord_jobopts_text(&sm->opts, 0);
    coord_owners_row(sm, &row.owner, &row.dataset, &row.data_info);
    if (code == RPC_OK && coord_jobstore_save(j->store, &row, sl_unix_time(), &err))
        code = rpc_status_set(st, RPC_INTERNAL, "%s", err.msg);
    free(row.options);
    free(row.owner);
    free(row.dataset);
    free(row.data_info);
    if (code != RPC_OK)
        unmake_job_dir(dir);
    free(cfg);
    free(dir);
    return code;
}

/* A job's name and tags: for people, shown in listings and HTML. */
#define NAME_MAX_BYTES 128
#define TAGS_MAX 16
#define TAG_MAX_BYTES 64

static int tag_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > TAG_MAX_BYTES)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || strchr("._-:=+/", s[i])))
            return 0;
    return 1;
}

static int meta_check(const Skyloom__V1__SubmitJobRequest *r, char *why, size_t cap)
{
    size_t n = strlen(r->name);
    int ok = n <= NAME_MAX_BYTES;
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)r->name[i] >= 0x20 && r->name[i] != 0x7f;
    json_t *utf8 = ok && n ? json_string(r->name) : NULL; /* NULL: not UTF-8 */
    if (n && !utf8)
        ok = 0;
    json_decref(utf8);
    if (!ok) {
        snprintf(why, cap, "--name: at most %d bytes of UTF-8 text without control characters",
                 NAME_MAX_BYTES);
        return -1;
    }
    if (r->n_tags > TAGS_MAX) {
        snprintf(why, cap, "--tag: at most %d tags, got %zu", TAGS_MAX, r->n_tags);
        return -1;
    }
    for (size_t i = 0; i < r->n_tags; i++)
        if (!tag_ok(r->tags[i])) {
            snprintf(why, cap, "--tag '%.80s': 1..%d letters, digits or . _ - : = + /", r->tags[i],
                     TAG_MAX_BYTES);
            return -1;
        }
    return 0;
}

static char *meta_of(const Skyloom__V1__SubmitJobRequest *r)
{
    json_t *tags = json_array();
    for (size_t i = 0; i < r->n_tags; i++)
        json_array_append_new(tags, json_string(r->tags[i]));
    json_t *m = json_pack("{s:s, s:o, s:b}", "name", r->name, "tags", tags, "stop_at_checkpoint", 0);
    char *t = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(m);
    return t;
}

/* Why a data owner cannot check its dataset now, as its heartbeats tell
 * (j->mu held): offline, no Stage service, or no such dataset. A submit is
 * refused at once rather than waiting for a check that cannot come. Right
 * after a restart a device not heard from yet may still be coming back. */
static int owner_unfit(const coord_jobs *j, const coord_devs *devs, const coord_dev *od,
                       const char *owner, const char *dataset, char *why, size_t cap)
{
    int64_t now = sl_unix_time();
    if (!od) {
        if (!coord_jobs_settled(j))
            return 0;
        snprintf(why, cap, "the data owner %.40s is offline: it has sent no heartbeat since the "
                 "coordinator started (is its skyloom device running?)", owner);
        return -1;
    }
    if (!coord_dev_online(devs, od, now)) {
        snprintf(why, cap, "the data owner %.40s is offline: its last heartbeat was %lld s ago", owner,
                 (long long)(now - od->seen));
        return -1;
    }
    if (!od->address[0] || !od->has_key) {
        snprintf(why, cap, "the data owner %.40s serves no Stage (its skyloom device runs without "
                 "--stage-listen), so it cannot take part in a job", owner);
        return -1;
    }
    for (int i = 0; i < od->n_datasets; i++)
        if (!strcmp(od->datasets[i], dataset))
            return 0;
    char list[300] = "";
    for (int i = 0; i < od->n_datasets; i++) {
        size_t o = strlen(list);
        snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", od->datasets[i]);
    }
    snprintf(why, cap, "the data owner %.40s serves no dataset '%.64s' (%s%s)", owner, dataset,
             od->n_datasets ? "it serves " : "it serves none: its skyloom device has no --data",
             list);
    return -1;
}

static int submit(call *k)
{
    const Skyloom__V1__SubmitJobRequest *r = k->req;
    coord_jobs *j = k->j;
    sl_err err = {0};
    bal_bert b;
    if (bal_bert_parse(&b, r->config, "config.json", &err))
        return rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "%s", err.msg);
    coord_jobopts opts;
    char why[400];
    if (meta_check(r, why, sizeof why))
        return rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "%s", why);
    if (coord_jobopts_parse(r->options, &opts, why, sizeof why)) {
        coord_jobopts_free(&opts);
        return rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "%s", why);
    }
    b.task = coord_jobopts_task(&opts); /* the config must suit the task's head */
    if (bal_bert_check(&b, &err)) {
        int code = rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "options: task %s: %s", opts.task,
                                  err.msg);
        coord_jobopts_free(&opts);
        return code;
    }
    /* DEVICE_ID:NAME, or several joined by commas (a federation) */
    coord_owner owners[COORD_MAX_OWNERS];
    int nowner = 0, code = RPC_OK;
    for (const char *d = r->data; code == RPC_OK && *d;) {
        size_t len = strcspn(d, ",");
        char one[160];
        snprintf(one, sizeof one, "%.*s", (int)(len < 150 ? len : 150), d);
        const char *colon = strchr(one, ':');
        char id[CERT_ID_LEN + 8] = "";
        if (colon)
            snprintf(id, sizeof id, "%.*s", (int)(colon - one), one);
        if (!colon || len >= 150 || !cert_valid_device_id(id) || !coord_name_ok(colon + 1, 64))
            code = rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "data '%.80s' is not DEVICE_ID:NAME",
                                  one);
        else if (nowner == COORD_MAX_OWNERS)
            code = rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "more than %d data owners",
                                  COORD_MAX_OWNERS);
        for (int o = 0; code == RPC_OK && o < nowner; o++)
            if (!strcmp(owners[o].id, id))
                code = rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "device %s is named by two data "
                                      "owners (%s and %s): a device serves one replica", id,
                                      owners[o].dataset, colon + 1);
        if (code == RPC_OK) {
            coord_owner *w = &owners[nowner++];
            memset(w, 0, sizeof *w);
            snprintf(w->id, sizeof w->id, "%s", id);
            snprintf(w->dataset, sizeof w->dataset, "%s", colon + 1);
        }
        d += len + (d[len] == ',');
    }
    if (code == RPC_OK && nowner == 0)
        code = rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "data '' is not DEVICE_ID:NAME");
    if (code == RPC_OK && coord_jobopts_check_owners(&opts, nowner, why, sizeof why))
        code = rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "%s", why);
    if (code != RPC_OK)
        goto out;
    for (int o = 0; o < nowner; o++)
        owners[o].batch = nowner == 1 ? opts.batch : opts.owner_batch[o];
    coord_state *db = coord_db_get(k->c, &err);
    for (int o = 0; code == RPC_OK && o < nowner; o++) {
        const char *owner = owners[o].id;
        int known = db ? coord_state_device_known(db, owner, &err) : -1;
        int rev = db ? coord_state_is_revoked(db, owner, &err) : -1;
        if (known <= 0 || rev)
            code = rpc_status_set(k->st, RPC_FAILED_PRECONDITION, "data owner %s is %s", owner,
                                  known < 0 || rev < 0 ? "unknown (database error)"
                                  : rev              ? "revoked"
                                                     : "not enrolled here");
    }
    coord_db_put(k->c, db);
    if (code != RPC_OK)
        goto out;
    pthread_mutex_lock(&j->mu);
    coord_devs devs = coord_jobs_devs(j);
    for (int o = 0; o < nowner; o++) {
        const coord_dev *od = coord_devs_find(&devs, owners[o].id);
        if (owner_unfit(j, &devs, od, owners[o].id, owners[o].dataset, why, sizeof why)) {
            pthread_mutex_unlock(&j->mu);
            code = rpc_status_set(k->st, RPC_FAILED_PRECONDITION, "%s", why);
            goto out;
        }
        if (od && coord_policy_check(&od->policy, &opts, why, sizeof why)) {
            pthread_mutex_unlock(&j->mu);
            code = rpc_status_set(k->st, RPC_FAILED_PRECONDITION, "%s (owner %s)", why, owners[o].id);
            goto out;
        }
    }
    if (j->njob + j->reserved >= COORD_MAX_JOBS) {
        pthread_mutex_unlock(&j->mu);
        code = rpc_status_set(k->st, RPC_RESOURCE_EXHAUSTED, "%d jobs already", COORD_MAX_JOBS);
        goto out;
    }
    j->reserved++;
    pthread_mutex_unlock(&j->mu);
    uint8_t rnd[8];
    randombytes_buf(rnd, sizeof rnd);
    uint64_t num = 0;
    for (int i = 0; i < 8; i++)
        num = num << 8 | rnd[i];
    num &= 0x7fffffffffffffffull; /* fits SQLite's integer */
    char id[COORD_JOB_ID_LEN];
    snprintf(id, sizeof id, "j%016llx", (unsigned long long)num);
    coord_job sm;
    coord_job_init(&sm, id, num, sl_xstrdup(r->config), &opts, owners, nowner, sl_unix_ms());
    char *meta = meta_of(r);
    code = make_job(j, &sm, r->init_upload, meta, k->st);
    cjob *jb = code == RPC_OK ? coord_jobs_wrap(j, &sm) : NULL;
    coord_job_free(&sm);
    if (jb)
        coord_jobs_set_meta(jb, meta);
    free(meta);
    pthread_mutex_lock(&j->mu);
    j->reserved--;
    if (jb)
        coord_jobs_add(j, jb);
    pthread_mutex_unlock(&j->mu);
    if (jb) {
        sl_log_info("coordinator: job submitted", "job=%s data=%s steps=%d", id, r->data, opts.steps);
        Skyloom__V1__SubmitJobResponse out = SKYLOOM__V1__SUBMIT_JOB_RESPONSE__INIT;
        out.job_id = id;
        coord_call_reply(k, &out);
    }
out:
    coord_jobopts_free(&opts);
    return code;
}
HANDLER(coord_handle_submit_job, "SubmitJobRequest", skyloom__v1__submit_job_request__descriptor,
        COORD_ALLOW_ADMIN, 0, 0, submit)

/* The vocabulary an owner sends with its check: its vocab.txt image. */
#define VOCAB_MAX_BYTES (768u << 10)

static int hex64(const char *s)
{
    if (!s || strlen(s) != 64)
        return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* The owner's check: its shard's description as compact JSON (without the
 * vocabulary, which goes to *vocab), and its sequence length (0 when
 * unusable). What the coordinator itself refuses goes to why (the job
 * expects another vocabulary, the vocabulary does not hash to its hash). */
static char *check_info(const char *result, const char *want_hash, const char *want_from, int *seq,
                        char **vocab, char *why, size_t cap)
{
    json_error_t je;
    json_t *info = json_loads(result, 0, &je);
    json_int_t T = json_integer_value(json_object_get(info, "seq_len"));
    *seq = info && T >= 1 && T <= 65536 ? (int)T : 0;
    *vocab = NULL;
    why[0] = 0;
    const char *vh = json_string_value(json_object_get(info, "vocab_hash"));
    const char *sh = json_string_value(json_object_get(info, "shard_hash"));
    const char *vt = json_string_value(json_object_get(info, "vocab"));
    json_int_t ns = json_integer_value(json_object_get(info, "shard_sequences"));
    if (!*seq) {
        json_decref(info);
        return NULL;
    }
    if ((vh && !hex64(vh)) || (sh && !hex64(sh)) || ns < 0 ||
        (json_object_get(info, "vocab") && (!vt || !vh || strlen(vt) > VOCAB_MAX_BYTES))) {
        snprintf(why, cap, "the data owner's check result is malformed (vocab_hash, shard_hash, "
                 "shard_sequences or vocab)");
    } else if (want_hash[0] && (!vh || strcmp(vh, want_hash))) {
        snprintf(why, cap, "its shard's vocabulary (hash %.64s) is not the job's (%s, from %s): "
                 "the shard was built with another vocabulary", vh ? vh : "not reported",
                 want_hash, want_from);
    } else if (vt) {
        uint8_t h[32];
        char hex[65];
        crypto_generichash(h, sizeof h, (const unsigned char *)vt, strlen(vt), NULL, 0);
        sodium_bin2hex(hex, sizeof hex, h, sizeof h);
        if (strcmp(hex, vh))
            snprintf(why, cap, "the vocabulary the data owner sent does not hash to its shard's "
                     "vocabulary hash");
        else
            *vocab = sl_xstrdup(vt);
    }
    json_object_del(info, "vocab");
    char *text = why[0] ? NULL : json_dumps(info, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(info);
    if (why[0]) {
        free(*vocab);
        *vocab = NULL;
    }
    return text;
}

/* An owner's checked vocabulary hash into h ("" before its check). */
static void owner_vocab_hash(const coord_owner *w, char h[65])
{
    json_error_t je;
    json_t *info = w->data_info ? json_loads(w->data_info, 0, &je) : NULL;
    const char *vh = json_string_value(json_object_get(info, "vocab_hash"));
    snprintf(h, 65, "%s", vh ? vh : "");
    json_decref(info);
}

/* The vocabulary device's shard must have (j->mu held): the one the submit
 * names, else one another owner of the job checked already (the owners of a
 * job train one model: one vocabulary); "" any. */
static void job_vocab_want(const coord_job *sm, const char *device, char want[65], char *from,
                           size_t cap)
{
    snprintf(want, 65, "%s", sm->opts.vocab_hash);
    snprintf(from, cap, "--vocab-hash, --vocab or --init");
    for (int o = 0; !want[0] && o < sm->nowner; o++)
        if (strcmp(sm->owner[o].id, device)) {
            owner_vocab_hash(&sm->owner[o], want);
            snprintf(from, cap, "the vocabulary of the data owner %s's %s: the owners of a job "
                     "share one", sm->owner[o].id, sm->owner[o].dataset);
        }
}

/* The job's vocabulary hash: its owners' shards' once checked, else the
 * one its submit expects ("" neither); malloc'd. */
static char *job_vocab_hash(const coord_job *sm)
{
    char h[65] = "";
    for (int o = 0; !h[0] && o < sm->nowner; o++)
        owner_vocab_hash(&sm->owner[o], h);
    return sl_xstrdup(h[0] ? h : sm->opts.vocab_hash);
}

/* Per data owner, what its check said of its shard (JSON text). */
static char *data_json(const coord_job *sm)
{
    static const char *const keys[] = {"sequences", "shard_sequences", "seq_len", "first",
                                       "vocab_size", "vocab_hash", "shard_hash", "cased",
                                       "num_labels", "labels_hash", "labels", NULL};
    json_t *a = json_array();
    for (int w = 0; w < sm->nowner; w++) {
        json_error_t je;
        const coord_owner *ow = &sm->owner[w];
        json_t *info = ow->data_info ? json_loads(ow->data_info, 0, &je) : NULL;
        json_t *o = json_pack("{s:s, s:s, s:i}", "owner", ow->id, "dataset", ow->dataset, "batch",
                              ow->batch);
        for (int i = 0; keys[i] && info; i++) {
            json_t *v = json_object_get(info, keys[i]);
            if (v)
                json_object_set(o, keys[i], v);
        }
        json_decref(info);
        json_array_append_new(a, o);
    }
    char *t = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return t;
}

static char *vocab_path(coord_jobs *j, const char *job)
{
    size_t n = strlen(j->root) + strlen(job) + 16;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s/vocab.txt", j->root, job);
    return p;
}

/* The vocab.txt the owner sent with its check ("" when none). */
static char *job_vocab(coord_jobs *j, cjob *jb)
{
    char *p = vocab_path(j, jb->sm.id), *text = NULL;
    size_t n = 0;
    sl_err err = {0};
    if (sl_read_file(p, VOCAB_MAX_BYTES + 1, &text, &n, &err))
        text = sl_xstrdup("");
    free(p);
    return text;
}

/* ---- reading jobs --------------------------------------------------------------------------- */

static Skyloom__V1__JobSummary *summary_of(const cjob *c, int64_t now)
{
    const coord_job *jb = &c->sm;
    Skyloom__V1__JobSummary *s = sl_xmalloc(sizeof *s);
    skyloom__v1__job_summary__init(s);
    s->ended_at = jb->ended;
    int64_t end = jb->ended ? jb->ended : now;
    s->wall_s = end > jb->created ? (double)(end - jb->created) : 0;
    s->name = sl_xstrdup(c->name ? c->name : "");
    s->n_tags = (size_t)c->ntags;
    s->tags = sl_xcalloc(s->n_tags + 1, sizeof *s->tags);
    for (int i = 0; i < c->ntags; i++)
        s->tags[i] = sl_xstrdup(c->tags[i]);
    s->n_data = (size_t)jb->nowner;
    s->data = sl_xcalloc(s->n_data + 1, sizeof *s->data);
    for (int o = 0; o < jb->nowner; o++) {
        size_t dn = strlen(jb->owner[o].id) + strlen(jb->owner[o].dataset) + 2;
        s->data[o] = sl_xmalloc(dn);
        snprintf(s->data[o], dn, "%s:%s", jb->owner[o].id, jb->owner[o].dataset);
    }
    s->layers = (uint32_t)c->layers;
    s->hidden = (uint32_t)c->hidden;
    s->stop_at_checkpoint = jb->stop_at_commit;
    s->job_id = sl_xstrdup(jb->id);
    s->state = sl_xstrdup(coord_job_state_name(jb->state));
    s->step = (uint32_t)jb->step;
    s->steps = (uint32_t)jb->steps;
    s->committed_step = (uint32_t)jb->committed;
    s->loss = jb->loss;
    s->created_at = jb->created;
    s->reason = sl_xstrdup(jb->reason);
    return s;
}

static void summary_free(Skyloom__V1__JobSummary *s)
{
    if (!s)
        return;
    free(s->job_id);
    free(s->state);
    free(s->reason);
    free(s->name);
    for (size_t i = 0; i < s->n_tags; i++)
        free(s->tags[i]);
    free(s->tags);
    for (size_t i = 0; i < s->n_data; i++)
        free(s->data[i]);
    free(s->data);
    free(s);
}

static int list_jobs(call *k)
{
    coord_jobs *j = k->j;
    Skyloom__V1__ListJobsResponse out = SKYLOOM__V1__LIST_JOBS_RESPONSE__INIT;
    int64_t now = sl_unix_time();
    pthread_mutex_lock(&j->mu);
    out.jobs = sl_xcalloc((size_t)j->njob + 1, sizeof *out.jobs);
    for (int i = 0; i < j->njob; i++)
        if (!coord_jobs_refused(&j->job[i]->sm))
            out.jobs[out.n_jobs++] = summary_of(j->job[i], now);
    pthread_mutex_unlock(&j->mu);
    coord_call_reply(k, &out);
    for (size_t i = 0; i < out.n_jobs; i++)
        summary_free(out.jobs[i]);
    free(out.jobs);
    return RPC_OK;
}
HANDLER(coord_handle_list_jobs, "ListJobsRequest", skyloom__v1__list_jobs_request__descriptor,
        COORD_ALLOW_ADMIN, 0, 0, list_jobs)

static json_t *profiles_json(const coord_job *jb)
{
    json_t *o = json_object();
    for (int i = 0; i < jb->ncand; i++) {
        json_error_t je;
        json_t *r = jb->cand[i].result ? json_loads(jb->cand[i].result, 0, &je) : NULL;
        if (r)
            json_object_set_new(o, jb->cand[i].id, r);
    }
    return o;
}

/* A byte count a device reported, as JSON (which has no unsigned 64 bits). */
static json_t *bytes_json(uint64_t v) { return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v); }


/* The latest step every stage reported: its figures per stage and link. */
static json_t *last_stages(const coord_job *jb)
{
    if (!jb->last)
        return NULL;
    json_t *stages = json_array();
    const coord_step_rep *rep = jb->last;
    for (int i = 0; i < jb->plan.p; i++) {
        const coord_step_rep *s = &rep[i];
        json_t *x = json_pack("{s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "stage", i, "device",
                              jb->plan.stage_dev[i], "fwd_s", s->fwd, "bwd_s", s->bwd, "recv_s",
                              s->recv, "send_s", s->send, "finish_s", s->finish, "step_s", s->step_s,
                              "busy", s->step_s > 0 ? (s->fwd + s->bwd) / s->step_s : 0.0);
        if (i + 1 < jb->plan.p)
            json_object_set_new(x, "link_next",
                                json_pack("{s:I, s:I, s:I, s:I}", "raw_bytes", (json_int_t)s->raw,
                                          "wire_bytes", (json_int_t)s->wire, "raw_bytes_back",
                                          (json_int_t)rep[i + 1].raw_up, "wire_bytes_back",
                                          (json_int_t)rep[i + 1].wire_up));
        if (jb->plan.nrep > 1)
            json_object_set_new(x, "sync", json_pack("{s:o, s:o}", "raw_bytes", bytes_json(s->raw_sync),
                                                     "wire_bytes", bytes_json(s->wire_sync)));
        json_array_append_new(stages, x);
    }
    json_t *out = json_pack("{s:i, s:f, s:f, s:o}", "step", jb->last_step, "step_s", jb->last_step_s,
                            "tokens_per_s", jb->tokens_s, "stages", stages);
    if (jb->plan.nrep > 1) {
        /* each replica: its owner, its stages and their devices, its own
         * loss (its last stage's) and what its stages sent for the sync */
        json_t *reps = json_array();
        for (int r = 0; r < jb->plan.nrep && r < jb->nowner; r++) {
            int lo = jb->plan.rep_first[r], hi = jb->plan.rep_first[r + 1];
            uint64_t raw = 0, wire = 0;
            json_t *devs = json_array();
            for (int i = lo; i < hi; i++) {
                raw = sl_add_sat_u64(raw, rep[i].raw_sync);
                wire = sl_add_sat_u64(wire, rep[i].wire_sync);
                json_array_append_new(devs, json_string(jb->plan.stage_dev[i]));
            }
            double loss = rep[hi - 1].loss;
            json_array_append_new(reps, json_pack("{s:i, s:s, s:s, s:i, s:i, s:o, s:o, s:o, s:o}",
                                                  "replica", r, "owner", jb->owner[r].id, "dataset",
                                                  jb->owner[r].dataset, "first_stage", lo, "stages",
                                                  hi - lo, "devices", devs, "loss",
                                                  isfinite(loss) ? json_real(loss) : json_null(),
                                                  "sync_raw_bytes", bytes_json(raw),
                                                  "sync_wire_bytes", bytes_json(wire)));
        }
        json_object_set_new(out, "replicas", reps);
    }
    return out;
}

static int get_job(call *k)
{
    const Skyloom__V1__GetJobRequest *r = k->req;
    coord_jobs *j = k->j;
    cjob *jb = k->jb;
    Skyloom__V1__JobInfo out = SKYLOOM__V1__JOB_INFO__INIT;
    pthread_mutex_lock(&j->mu);
    const coord_job *sm = &jb->sm;
    out.summary = summary_of(jb, sl_unix_time());
    out.data = data_json(sm);
    out.vocab_hash = job_vocab_hash(sm);
    out.options = coord_jobopts_text(&sm->opts, 0);
    out.plan = sl_xstrdup(sm->plan.text ? sm->plan.text : "");
    out.epoch = (uint32_t)sm->epoch;
    json_t *ls = last_stages(sm), *pj = profiles_json(sm);
    out.stages = ls ? json_dumps(ls, JSON_COMPACT) : sl_xstrdup("");
    out.profiles = json_dumps(pj, JSON_COMPACT);
    out.trace = r->trace ? coord_jobobs_trace_text(jb->obs, sm->id) : sl_xstrdup("");
    pthread_mutex_unlock(&j->mu);
    json_decref(ls);
    json_decref(pj);
    pthread_mutex_lock(&jb->io_mu);
    out.metrics = coord_ckpt_metrics_from(jb->ck, (int)r->metrics_from);
    pthread_mutex_unlock(&jb->io_mu);
    out.events = coord_jobstore_events(j->store, jb->sm.id);
    out.vocab = r->vocab ? job_vocab(j, jb) : sl_xstrdup("");
    coord_call_reply(k, &out);
    free(out.data);
    free(out.vocab);
    free(out.vocab_hash);
    free(out.trace);
    summary_free(out.summary);
    free(out.options);
    free(out.plan);
    free(out.stages);
    free(out.metrics);
    free(out.profiles);
    free(out.events);
    return RPC_OK;
}
HANDLER(coord_handle_get_job, "GetJobRequest", skyloom__v1__get_job_request__descriptor,
        COORD_ALLOW_ADMIN, 1, 0, get_job)

static int stop_job(call *k)
{
    const Skyloom__V1__StopJobRequest *r = k->req;
    coord_jobs *j = k->j;
    coord_fx_list fx = {0};
    pthread_mutex_lock(&j->mu);
    int rc = r->at_checkpoint ? coord_job_stop_at_commit(&k->jb->sm, sl_unix_ms(), &fx)
                              : coord_job_stop(&k->jb->sm, sl_unix_ms(), &fx);
    char state[16];
    snprintf(state, sizeof state, "%s", coord_job_state_name(k->jb->sm.state));
    coord_call_settle(j, k->jb, &fx);
    if (rc)
        return rpc_status_set(k->st, RPC_FAILED_PRECONDITION, "job %s has ended (%s)", k->job_id, state);
    Skyloom__V1__StopJobResponse out = SKYLOOM__V1__STOP_JOB_RESPONSE__INIT;
    out.state = state;
    return coord_call_reply(k, &out);
}
HANDLER(coord_handle_stop_job, "StopJobRequest", skyloom__v1__stop_job_request__descriptor,
        COORD_ALLOW_ADMIN, 1, 0, stop_job)

/* A job that ended with its profiles not read back (a coordinator restart
 * reads only those of jobs that go on): read them before it resumes, so
 * that it plans over its measured candidates. */
static int resume_profiles(coord_jobs *j, cjob *jb, sl_err *err)
{
    pthread_mutex_lock(&j->mu);
    int have = jb->sm.ncand > 0;
    pthread_mutex_unlock(&j->mu);
    return have ? 0 : coord_jobs_load_profiles(j, jb, err);
}

static int resume_job(call *k)
{
    coord_jobs *j = k->j;
    sl_err err = {0};
    if (resume_profiles(j, k->jb, &err))
        return rpc_status_set(k->st, RPC_INTERNAL, "%s", err.msg);
    coord_fx_list fx = {0};
    char why[400];
    pthread_mutex_lock(&j->mu);
    coord_job *sm = &k->jb->sm;
    int epoch = sm->epoch, from = sm->committed;
    int rc = coord_job_resume(sm, sl_unix_ms(), why, sizeof why, &fx);
    pthread_cond_broadcast(&j->cv); /* the engine plans it */
    coord_call_settle(j, k->jb, &fx);
    if (rc)
        return rpc_status_set(k->st, RPC_FAILED_PRECONDITION, "%s", why);
    sl_log_info("coordinator: job resumed", "job=%s from_step=%d", k->job_id, from + 1);
    Skyloom__V1__ResumeJobResponse out = SKYLOOM__V1__RESUME_JOB_RESPONSE__INIT;
    out.from_step = (uint32_t)from;
    out.epoch = (uint32_t)epoch;
    return coord_call_reply(k, &out);
}
HANDLER(coord_handle_resume_job, "ResumeJobRequest", skyloom__v1__resume_job_request__descriptor,
        COORD_ALLOW_ADMIN, 1, 0, resume_job)

/* ---- what devices report ------------------------------------------------------------------ */

/* Whether an owner's label names (absent: fine, a check leaves out long
 * ones) are n names of 1..BAL_MAX_LABEL_BYTES bytes without a newline whose
 * labels.txt image ("name\n" each) hashes to hash (hex BLAKE2b-256). */
static int labels_match(const json_t *names, int n, const char *hash)
{
    if (!names)
        return 1;
    if (!json_is_array(names) || json_array_size(names) != (size_t)n)
        return 0;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    for (int i = 0; i < n; i++) {
        const char *v = json_string_value(json_array_get(names, (size_t)i));
        size_t len = v ? strlen(v) : 0;
        if (!len || len > BAL_MAX_LABEL_BYTES || strchr(v, '\n'))
            return 0;
        crypto_generichash_update(&st, (const unsigned char *)v, len);
        crypto_generichash_update(&st, (const unsigned char *)"\n", 1);
    }
    uint8_t h[32];
    char hex[65];
    crypto_generichash_final(&st, h, sizeof h);
    sodium_bin2hex(hex, sizeof hex, h, sizeof h);
    return !strcmp(hex, hash);
}

/* Whether owner `device`'s check description fits job jb: its task (absent:
 * mlm, as devices without the classification head describe a shard) is the
 * job's; to classify, it counts the config's num_labels, its label names
 * (where given) hash to its labels_hash, and its labels (labels_hash: the
 * names in order) are those of every owner that checked before it, one
 * classifier needing one label vocabulary. 0, or -1 with
 * why. Reads the other owners' descriptions: under j->mu. */
static int check_fits(const coord_job *jb, const char *device, const char *info, char *why,
                      size_t cap)
{
    int o = coord_job_owner_index(jb, device);
    if (o < 0)
        return 0; /* not an owner: the state machine ignores it */
    const coord_owner *ow = &jb->owner[o];
    json_error_t je;
    json_t *in = json_loads(info, 0, &je);
    const char *task = json_string_value(json_object_get(in, "task"));
    const char *hash = json_string_value(json_object_get(in, "labels_hash"));
    json_t *nl = json_object_get(in, "num_labels");
    int rc = 0;
    bal_bert b;
    sl_err err = {0};
    if (strcmp(task ? task : "mlm", jb->opts.task)) {
        snprintf(why, cap, "the data owner %s checked %s for task %.20s, not the job's task %s "
                 "(a device without the classification head?)", ow->id, ow->dataset,
                 task ? task : "mlm", jb->opts.task);
        rc = -1;
    } else if (strcmp(jb->opts.task, "classify")) {
        rc = 0;
    } else if (bal_bert_parse(&b, jb->config, "config.json", &err)) {
        snprintf(why, cap, "the job's config: %.300s", err.msg);
        rc = -1;
    } else if (!json_is_integer(nl) || !hash || strlen(hash) != 64) {
        snprintf(why, cap, "the data owner %s described %s without its labels (num_labels, "
                 "labels_hash)", ow->id, ow->dataset);
        rc = -1;
    } else if (json_integer_value(nl) != b.num_labels) {
        snprintf(why, cap, "the data owner %s's %s has %lld labels, the job's config num_labels "
                 "%d", ow->id, ow->dataset, (long long)json_integer_value(nl), b.num_labels);
        rc = -1;
    } else if (!labels_match(json_object_get(in, "labels"), b.num_labels, hash)) {
        snprintf(why, cap, "the data owner %s described %s with label names that are not its "
                 "labels_hash's %d names", ow->id, ow->dataset, b.num_labels);
        rc = -1;
    }
    for (int i = 0; rc == 0 && hash && i < jb->nowner; i++) {
        json_t *other = i != o && jb->owner[i].data_info ? json_loads(jb->owner[i].data_info, 0, &je)
                                                         : NULL;
        const char *h = json_string_value(json_object_get(other, "labels_hash"));
        if (other && (!h || strcmp(h, hash))) {
            snprintf(why, cap, "the data owners' labels differ: %s's %s (labels hash %.12s) and "
                     "%s's %s (%.12s); one classifier needs the same labels in the same order "
                     "(one labels.txt)", jb->owner[i].id, jb->owner[i].dataset, h ? h : "none",
                     ow->id, ow->dataset, hash);
            rc = -1;
        }
        json_decref(other);
    }
    json_decref(in);
    return rc;
}

static void report_profile(call *k)
{
    const Skyloom__V1__ReportTaskRequest *r = k->req;
    coord_jobs *j = k->j;
    json_error_t je;
    json_t *res = r->ok ? json_loads(r->result, 0, &je) : NULL;
    if (!res || !json_is_object(res)) {
        json_decref(res);
        sl_log_warn("coordinator: profile refused", "job=%s device=%s reason=\"%.200s\"", k->job_id,
                    r->device_id, r->ok ? "malformed result" : r->reason);
        res = json_pack("{s:b, s:s}", "failed", 1, "reason", r->ok ? "malformed result" : r->reason);
    }
    const char *rd = json_string_value(json_object_get(res, "round"));
    int round = !rd ? COORD_PROFILE_BOTH : !strcmp(rd, "links") ? COORD_PROFILE_LINKS : COORD_PROFILE_UNITS;
    /* unit times are the head's the device timed: the job's task's (absent:
     * mlm, as devices without the classification head report), or useless
     * to its plan (the options never change after submit) */
    const char *task = json_string_value(json_object_get(res, "task"));
    if (round != COORD_PROFILE_LINKS && !json_object_get(res, "failed") &&
        strcmp(task ? task : "mlm", k->jb->sm.opts.task)) {
        char why[160];
        snprintf(why, sizeof why, "units profiled for task %.20s, the job's task is %s",
                 task ? task : "mlm", k->jb->sm.opts.task);
        sl_log_warn("coordinator: profile refused", "job=%s device=%s reason=\"%s\"", k->job_id,
                    r->device_id, why);
        json_decref(res);
        res = json_pack("{s:b, s:s}", "failed", 1, "reason", why);
    }
    json_t *links = json_object_get(res, "links");
    char *links_text = round == COORD_PROFILE_LINKS && json_is_array(links)
                           ? json_dumps(links, JSON_COMPACT) : NULL;
    coord_fx_list fx = {0};
    pthread_mutex_lock(&j->mu);
    char *text = NULL;
    if (round == COORD_PROFILE_UNITS) { /* the second round: the units, with the first's links */
        const char *l1 = coord_job_cand_links(&k->jb->sm, r->device_id);
        json_t *l = l1 ? json_loads(l1, 0, &je) : NULL;
        json_object_set_new(res, "links", l ? l : json_array());
        json_object_del(res, "round");
    }
    if (round != COORD_PROFILE_LINKS)
        text = json_dumps(res, JSON_COMPACT);
    coord_job_profile_in(&k->jb->sm, r->device_id, round, text, links_text,
                         json_object_get(res, "failed") != NULL, &fx);
    pthread_cond_broadcast(&j->cv);
    coord_call_settle(j, k->jb, &fx);
    free(text);
    free(links_text);
    json_decref(res);
}

static int report_task(call *k)
{
    const Skyloom__V1__ReportTaskRequest *r = k->req;
    coord_jobs *j = k->j;
    if (strlen(r->result) > (1u << 20) || strlen(r->reason) > 4096)
        return rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "report too large");
    coord_fx_list fx = {0};
    if (!strcmp(r->kind, "check")) {
        int seq = 0, ok = r->ok;
        char why[800] = "", want[65], from[200], *vocab = NULL;
        pthread_mutex_lock(&j->mu);
        job_vocab_want(&k->jb->sm, r->device_id, want, from, sizeof from);
        pthread_mutex_unlock(&j->mu);
        char *info = ok ? check_info(r->result, want, from, &seq, &vocab, why, sizeof why) : NULL;
        if (why[0])
            ok = 0;
        if (vocab) { /* kept for the export beside the model (the owners' is one vocabulary) */
            char *p = vocab_path(j, k->job_id);
            sl_err err = {0};
            if (sl_write_file_atomic(p, vocab, strlen(vocab), &err))
                sl_log_warn("coordinator: the job's vocabulary not kept", "job=%s reason=\"%s\"",
                            k->job_id, err.msg);
            free(p);
            free(vocab);
        }
        pthread_mutex_lock(&j->mu);
        coord_devs devs = coord_jobs_devs(j);
        int o = coord_job_owner_index(&k->jb->sm, r->device_id);
        if (ok && info && check_fits(&k->jb->sm, r->device_id, info, why, sizeof why)) {
            coord_job_check_unfit(&k->jb->sm, r->device_id, why, sl_unix_ms(), &fx);
        } else {
            if (ok && info && o >= 0 && k->jb->sm.state == COORD_JOB_CHECKING)
                coord_jobs_ds_record(j, r->device_id, k->jb->sm.owner[o].dataset, info, k->job_id,
                                     sl_unix_time());
            coord_job_check_done(&k->jb->sm, r->device_id, ok, why[0] ? why : r->reason, info, seq,
                                 coord_jobs_settled(j), &devs, sl_unix_ms(), &fx);
        }
        pthread_cond_broadcast(&j->cv); /* the engine starts profiling once settled */
        coord_call_settle(j, k->jb, &fx);
        free(info);
    } else if (!strcmp(r->kind, "profile")) {
        report_profile(k);
    } else if (!strcmp(r->kind, "run") && !r->ok) {
        json_error_t je;
        json_t *res = *r->result ? json_loads(r->result, 0, &je) : NULL;
        const char *lost = json_string_value(json_object_get(res, "lost"));
        pthread_mutex_lock(&j->mu);
        if (coord_job_run_failure(&k->jb->sm, r->device_id, (int)r->epoch, r->reason,
                                  lost ? lost : "", sl_unix_ms(), &fx))
            j->denied[COORD_DENY_NOT_NEIGHBOUR]++;
        pthread_cond_broadcast(&j->cv);
        coord_call_settle(j, k->jb, &fx);
        json_decref(res);
    }
    Skyloom__V1__ReportTaskResponse out = SKYLOOM__V1__REPORT_TASK_RESPONSE__INIT;
    return coord_call_reply(k, &out);
}
HANDLER(coord_handle_report_task, "ReportTaskRequest", skyloom__v1__report_task_request__descriptor,
        COORD_ALLOW_DEVICE, 1, COORD_MEMBER_OWNER | COORD_MEMBER_CAND | COORD_MEMBER_STAGE, report_task)

/* The plan signed by the coordinator's key of now, with its certificate of
 * now: a key that a rotation replaced signs nothing a device is handed from
 * then on (devices refuse a signer older than the newest coordinator
 * certificate their heartbeats brought). The key and the certificate are
 * read one after the other; a rotation between the two reads is caught by
 * checking the signature against that certificate, and both are read
 * again. */
static int sign_current(coord *c, const char *plan, char **crt, size_t *crt_len, uint8_t **sig,
                        size_t *sig_len, sl_err *err)
{
    char *crt_path = coord_path_of(c->pki, "coordinator.crt"), *key_path = coord_path_of(c->pki, "coordinator.key");
    const char *ca = cert_ca_pem(c->ca);
    int rc = -1;
    for (int attempt = 0; attempt < 3 && rc; attempt++) {
        free(*crt);
        free(*sig);
        *crt = NULL;
        *sig = NULL;
        if (sl_read_file(crt_path, 1 << 20, crt, crt_len, err) ||
            cert_sign_data(key_path, plan, strlen(plan), sig, sig_len, err))
            break;
        rc = cert_verify_signed(ca, strlen(ca), *crt, *crt_len, plan, strlen(plan), *sig, *sig_len,
                                err);
    }
    free(crt_path);
    free(key_path);
    return rc;
}

static int get_plan(call *k)
{
    const Skyloom__V1__GetPlanRequest *r = k->req;
    coord_jobs *j = k->j;
    char *crt = NULL;
    size_t crt_len = 0;
    sl_err err = {0};
    int code = RPC_OK;
    char *plan = NULL;
    uint8_t *sig = NULL;
    size_t sig_len = 0;
    pthread_mutex_lock(&j->mu);
    const coord_job *sm = k->jb ? &k->jb->sm : NULL;
    if (!sm || !sm->plan.text)
        code = rpc_status_set(k->st, RPC_NOT_FOUND, "job '%.40s' has no plan", r->job_id);
    else if (coord_job_stage_of(sm, r->device_id) < 0)
        code = rpc_status_set(k->st, RPC_PERMISSION_DENIED, "device %s has no stage in job %s",
                              r->device_id, sm->id);
    else
        plan = sl_xstrdup(sm->plan.text);
    pthread_mutex_unlock(&j->mu);
    if (code == RPC_OK && sign_current(k->c, plan, &crt, &crt_len, &sig, &sig_len, &err))
        code = rpc_status_set(k->st, RPC_INTERNAL, "signing the plan: %s", err.msg);
    if (code == RPC_OK) {
        Skyloom__V1__SignedPlan out = SKYLOOM__V1__SIGNED_PLAN__INIT;
        out.plan.data = (uint8_t *)plan;
        out.plan.len = strlen(plan);
        out.signature.data = sig;
        out.signature.len = sig_len;
        out.coordinator_cert.data = (uint8_t *)crt;
        out.coordinator_cert.len = crt_len;
        coord_call_reply(k, &out);
    }
    free(plan);
    free(sig);
    free(crt);
    return code;
}
HANDLER(coord_handle_get_plan, "GetPlanRequest", skyloom__v1__get_plan_request__descriptor,
        COORD_ALLOW_DEVICE, 0, COORD_MEMBER_STAGE, get_plan)

static int report_step(call *k)
{
    const Skyloom__V1__ReportStepRequest *r = k->req;
    coord_jobs *j = k->j;
    coord_step_rep rep = {1, r->loss, r->grad_norm, r->lr, r->fwd_s, r->bwd_s, r->recv_s,
                          r->send_s, r->finish_s, r->step_s, r->raw_bytes, r->wire_bytes,
                          r->raw_bytes_up, r->wire_bytes_up, r->raw_bytes_side, r->wire_bytes_side,
                          r->raw_bytes_sync, r->wire_bytes_sync, r->masked};
    coord_fx_list fx = {0};
    pthread_mutex_lock(&j->mu);
    coord_job *sm = &k->jb->sm;
    /* sync payloads cross only between the devices of different replicas,
     * always as frames (a header and, sealed, a tag beyond the payload) */
    if ((r->raw_bytes_sync || r->wire_bytes_sync) && sm->nowner < 2) {
        pthread_mutex_unlock(&j->mu);
        return rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "device %s reports %llu bytes of "
                              "replica sync in job %s, which has one data owner", r->device_id,
                              (unsigned long long)r->wire_bytes_sync, sm->id);
    }
    if (r->wire_bytes_sync < r->raw_bytes_sync) {
        pthread_mutex_unlock(&j->mu);
        return rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "device %s reports %llu bytes of "
                              "replica sync payloads in %llu bytes of frames", r->device_id,
                              (unsigned long long)r->raw_bytes_sync,
                              (unsigned long long)r->wire_bytes_sync);
    }
    int v = coord_job_step_report(sm, r->device_id, (int)r->epoch, (int)r->stage, (int)r->step,
                                  &rep, sl_unix_ms(), &fx);
    if (v == COORD_REPORT_TAKEN)
        coord_jobobs_report(k->jb->obs, r, sm->plan.p, sm->epoch,
                            coord_job_stage_replica(sm, (int)r->stage), sm->id);
    if (v != COORD_REPORT_REFUSED)
        coord_obs_refused_add(j->refused, &j->nrefused, r);
    coord_call_settle(j, k->jb, &fx);
    if (v == COORD_REPORT_REFUSED)
        return rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "device %s does not run stage %u, or "
                              "step %u is out of range", r->device_id, r->stage, r->step);
    Skyloom__V1__ReportStepResponse out = SKYLOOM__V1__REPORT_STEP_RESPONSE__INIT;
    out.stop = v == COORD_REPORT_STOP;
    return coord_call_reply(k, &out);
}
HANDLER(coord_handle_report_step, "ReportStepRequest", skyloom__v1__report_step_request__descriptor,
        COORD_ALLOW_DEVICE, 1, COORD_MEMBER_CAND | COORD_MEMBER_STAGE, report_step)

/* ---- a device's latest profile (skyloom status) ----------------------------------------------- */

static double *doubles_of(const json_t *a, size_t *n)
{
    *n = json_array_size(a) < 4096 ? json_array_size(a) : 4096;
    double *v = sl_xcalloc(*n + 1, sizeof *v);
    for (size_t i = 0; i < *n; i++)
        v[i] = json_number_value(json_array_get(a, i));
    return v;
}

int coord_jobs_latest_profile(coord_state *db, const char *device, Skyloom__V1__JobProfile **out,
                              sl_err *err)
{
    *out = NULL;
    char *job = NULL, *result = NULL, *options = NULL, *data_info = NULL;
    int64_t at = 0;
    int rc = coord_jobstore_latest_profile(db, device, &job, &result, &at, &options, &data_info, err);
    if (rc <= 0)
        return rc;
    json_error_t je;
    json_t *res = json_loads(result, 0, &je), *opts = json_loads(options, 0, &je),
           *info = json_loads(data_info, 0, &je);
    Skyloom__V1__JobProfile *p = sl_xmalloc(sizeof *p);
    skyloom__v1__job_profile__init(p);
    p->job_id = job;
    p->measured_at = at;
    json_int_t batch = json_integer_value(json_object_get(opts, "batch"));
    json_int_t micro = json_integer_value(json_object_get(opts, "micro_batches"));
    p->micro_batch = micro > 0 && batch > 0 ? (uint32_t)(batch / micro) : 0;
    p->seq = (uint32_t)json_integer_value(json_object_get(info, "seq_len"));
    const char *why = json_string_value(json_object_get(res, "reason"));
    if (!res || json_object_get(res, "failed"))
        p->failed = sl_xstrdup(why && *why ? why : "no usable profile");
    else
        p->failed = sl_xstrdup("");
    p->unit_fwd_s = doubles_of(json_object_get(res, "unit_fwd_s"), &p->n_unit_fwd_s);
    p->unit_bwd_s = doubles_of(json_object_get(res, "unit_bwd_s"), &p->n_unit_bwd_s);
    p->unit_optim_s = doubles_of(json_object_get(res, "unit_optim_s"), &p->n_unit_optim_s);
    p->memory_bytes = (uint64_t)json_integer_value(json_object_get(res, "memory_bytes"));
    p->threads = (uint32_t)json_integer_value(json_object_get(res, "threads"));
    const char *be = json_string_value(json_object_get(res, "backend"));
    p->backend = sl_xstrdup(be ? be : "");
    json_t *links = json_object_get(res, "links");
    size_t nl = json_array_size(links) < 4096 ? json_array_size(links) : 4096;
    p->links = sl_xcalloc(nl + 1, sizeof *p->links);
    for (size_t i = 0; i < nl; i++) {
        json_t *l = json_array_get(links, i);
        const char *peer = json_string_value(json_object_get(l, "peer"));
        Skyloom__V1__LinkProfile *x = sl_xmalloc(sizeof *x);
        skyloom__v1__link_profile__init(x);
        x->peer = sl_xstrdup(peer && cert_valid_device_id(peer) ? peer : "?");
        x->rtt_s = json_number_value(json_object_get(l, "rtt_s"));
        x->bandwidth_bytes_per_s = json_number_value(json_object_get(l, "bandwidth_Bps"));
        p->links[p->n_links++] = x;
    }
    json_decref(res);
    json_decref(opts);
    json_decref(info);
    free(result);
    free(options);
    free(data_info);
    *out = p;
    return 0;
}

void coord_jobs_profile_free(Skyloom__V1__JobProfile *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_links; i++) {
        free(p->links[i]->peer);
        free(p->links[i]);
    }
    free(p->links);
    free(p->unit_fwd_s);
    free(p->unit_bwd_s);
    free(p->unit_optim_s);
    free(p->job_id);
    free(p->failed);
    free(p->backend);
    free(p);
}
