/* coord_jobs_rpc.c - the job manager's calls (service Coordinator): submit,
 * list, status, stop, the devices' task and step reports, plans, checkpoint
 * uploads and fetches.
 *
 * Every call goes through serve(): it unpacks the request, authorizes the
 * caller for the device the request speaks for, finds the job the request
 * names, and hands the body a `call`; the body changes the job only through
 * its state machine's events, under the manager's lock, and does its I/O
 * outside it. */
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
#include "coord_jobs_int.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

/* ---- the one way in ----------------------------------------------------------------- */

typedef struct call {
    coord *c;
    coord_jobs *j;
    const rpc_peer *peer;
    void *req;
    const char *device; /* the device the request speaks for ("" the admin) */
    const char *job_id;
    cjob *jb;           /* the job it names, when found */
    rpc_buf *resp;
    rpc_status *st;
} call;

typedef struct method {
    const char *name;
    const ProtobufCMessageDescriptor *desc;
    int allow;        /* COORD_ALLOW_* */
    int need_job;     /* a job_id that is no job: NOT_FOUND before the body runs */
    int roles;        /* a device caller must be one of these to its job (COORD_MEMBER_*) */
    int (*body)(call *k);
} method;

/* A string field of a request by name ("" when the message has none). */
static const char *str_field(const ProtobufCMessage *m, const char *name)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
    if (!f || f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED)
        return "";
    const char *v = *(const char *const *)((const char *)m + f->offset);
    return v ? v : "";
}

static int reply(call *k, const void *msg)
{
    rpc_pack(msg, k->resp);
    return RPC_OK;
}

static int serve(const method *m, void *ud, const rpc_peer *peer, const uint8_t *req, size_t len,
                 rpc_buf *resp, rpc_status *st)
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

#define HANDLER(fn, type, desc, allow, need_job, roles, body)                                    \
    int fn(void *ud, const rpc_peer *peer, const uint8_t *req, size_t len, rpc_buf *resp,          \
           rpc_status *st)                                                                         \
    {                                                                                              \
        static const method m = {type, &desc, allow, need_job, roles, body};                       \
        return serve(&m, ud, peer, req, len, resp, st);                                            \
    }

/* Applies an event's effects: queued under the lock, run after it. */
static void settle(coord_jobs *j, cjob *jb, coord_fx_list *fx)
{
    coord_jobs_queue(j, jb, fx);
    pthread_mutex_unlock(&j->mu);
    coord_jobs_drain(j, jb);
}

/* ---- submitting --------------------------------------------------------------------------- */

static int valid_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

static char *path_of(const char *a, const char *b)
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
        char *p = path_of(dir, files[i]);
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
    char *dir = path_of(j->root, sm->id), *cfg = path_of(dir, "config.json");
    int code = sl_mkdir(j->root, 0700, &err) || sl_mkdir(dir, 0700, &err) ||
                       sl_write_file_atomic(cfg, sm->config, strlen(sm->config), &err)
                   ? rpc_status_set(st, RPC_INTERNAL, "%s", err.msg)
                   : RPC_OK;
    if (code == RPC_OK && init_upload && *init_upload) {
        char *ck = path_of(dir, "ckpt"), *s0 = path_of(dir, "ckpt/step-0"),
             *m = path_of(dir, "ckpt/step-0/model.safetensors");
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
        if (!colon || len >= 150 || !cert_valid_device_id(id) || !valid_name(colon + 1, 64))
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
        reply(k, &out);
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
                                       "vocab_size", "vocab_hash", "shard_hash", "cased", NULL};
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
    reply(k, &out);
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
        json_array_append_new(stages, x);
    }
    return json_pack("{s:i, s:f, s:f, s:o}", "step", jb->last_step, "step_s", jb->last_step_s,
                     "tokens_per_s", jb->tokens_s, "stages", stages);
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
    reply(k, &out);
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
    settle(j, k->jb, &fx);
    if (rc)
        return rpc_status_set(k->st, RPC_FAILED_PRECONDITION, "job %s has ended (%s)", k->job_id, state);
    Skyloom__V1__StopJobResponse out = SKYLOOM__V1__STOP_JOB_RESPONSE__INIT;
    out.state = state;
    return reply(k, &out);
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
    settle(j, k->jb, &fx);
    if (rc)
        return rpc_status_set(k->st, RPC_FAILED_PRECONDITION, "%s", why);
    sl_log_info("coordinator: job resumed", "job=%s from_step=%d", k->job_id, from + 1);
    Skyloom__V1__ResumeJobResponse out = SKYLOOM__V1__RESUME_JOB_RESPONSE__INIT;
    out.from_step = (uint32_t)from;
    out.epoch = (uint32_t)epoch;
    return reply(k, &out);
}
HANDLER(coord_handle_resume_job, "ResumeJobRequest", skyloom__v1__resume_job_request__descriptor,
        COORD_ALLOW_ADMIN, 1, 0, resume_job)

/* ---- checkpoints ------------------------------------------------------------------------------ */

/* Who asks FetchFile: a device's units, its data record's name (its
 * owner's, "" for others) and, with replicas, the files of its replica
 * (from the committed manifest; NULL: every file). */
typedef struct fetcher {
    uint8_t units[BAL_MAX_LAYERS + 2];
    int nunits;
    char data[96];
    json_t *replica_files; /* names (object keys) */
} fetcher;

/* The names of the manifest's files of replica r (an object, keys the
 * names; empty without a readable manifest). */
static json_t *replica_files(const char *dir, int r)
{
    char *mp = path_of(dir, "manifest.json"), *text = NULL;
    size_t len = 0;
    sl_err err = {0};
    json_t *names = json_object();
    if (!sl_read_file(mp, 16u << 20, &text, &len, &err)) {
        json_error_t je;
        json_t *m = json_loadb(text, len, 0, &je), *f;
        size_t i;
        json_array_foreach(json_object_get(m, "files"), i, f) {
            json_t *rv = json_object_get(f, "replica");
            const char *n = json_string_value(json_object_get(f, "name"));
            if (n && json_is_integer(rv) && json_integer_value(rv) == r)
                json_object_set_new(names, n, json_true());
        }
        json_decref(m);
    }
    free(text);
    free(mp);
    return names;
}

/* Whether the device `w` describes may have checkpoint file `name` of dir:
 * the config and manifest, the start model, its owner's data record only
 * its owner, and a part only when it is of its replica and every tensor in
 * it is of one of its units (so that the data owner's layers and
 * embeddings stay the owner's). */
static int fetchable(const char *dir, const char *name, const fetcher *w)
{
    if (!strcmp(name, "config.json") || !strcmp(name, "manifest.json") ||
        !strcmp(name, "model.safetensors"))
        return 1;
    if (!strncmp(name, "data.", 5))
        return w->data[0] && !strcmp(name, w->data);
    if (w->replica_files && !json_object_get(w->replica_files, name))
        return 0;
    const uint8_t *units = w->units;
    int nunits = w->nunits;
    uint8_t in[BAL_MAX_LAYERS + 2];
    char why[300], *p = path_of(dir, name);
    if (access(p, F_OK) != 0) { /* not there: the read says so */
        free(p);
        return 1;
    }
    int ok = nunits > 0 && !coord_ckpt_file_units(p, nunits, in, why, sizeof why);
    for (int u = 0; ok && u < nunits; u++)
        ok = !in[u] || units[u];
    free(p);
    return ok;
}

static int fetch_file(call *k)
{
    const Skyloom__V1__FetchFileRequest *r = k->req;
    coord_jobs *j = k->j;
    int code = RPC_OK, step = -1;
    char *dir = NULL;
    fetcher w = {0};
    int device = *r->device_id != 0, rep = -1;
    pthread_mutex_lock(&j->mu);
    const coord_job *sm = &k->jb->sm;
    if (device) {
        w.nunits = coord_job_nunits(sm);
        coord_job_fetch_units(sm, r->device_id, w.units, w.nunits);
        int o = coord_job_owner_index(sm, r->device_id);
        if (o >= 0)
            snprintf(w.data, sizeof w.data, sm->nowner == 1 ? "data.json" : "data.%s.json",
                     r->device_id);
        if (sm->nowner > 1)
            rep = coord_job_stage_replica(sm, coord_job_stage_of(sm, r->device_id));
    }
    if (device && coord_job_stage_of(sm, r->device_id) < 0) {
        code = rpc_status_set(k->st, RPC_PERMISSION_DENIED, "device %s has no stage of job %s",
                              r->device_id, sm->id);
    } else {
        step = r->step == UINT32_MAX ? sm->committed : (int)r->step;
        if (step != 0 && step != sm->committed)
            code = rpc_status_set(k->st, RPC_NOT_FOUND, "job %s: step %u is not its committed "
                                  "step (%d)", sm->id, r->step, sm->committed);
        else
            dir = coord_ckpt_step_dir(k->jb->ck, step, 0);
    }
    pthread_mutex_unlock(&j->mu);
    Skyloom__V1__FetchFileResponse out = SKYLOOM__V1__FETCH_FILE_RESPONSE__INIT;
    out.step = (uint32_t)(step < 0 ? 0 : step);
    uint8_t *data = NULL;
    if (code == RPC_OK && rep >= 0)
        w.replica_files = replica_files(dir, rep);
    if (code == RPC_OK && !*r->name) { /* the list */
        DIR *d = opendir(dir);
        if (!d)
            code = rpc_status_set(k->st, RPC_NOT_FOUND, "job %s has no checkpoint at step %d",
                                  r->job_id, step);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.' || !coord_ckpt_servable(e->d_name) ||
                (device && !fetchable(dir, e->d_name, &w)))
                continue;
            out.names = sl_xrealloc(out.names, (out.n_names + 1) * sizeof *out.names);
            out.names[out.n_names++] = sl_xstrdup(e->d_name);
        }
        if (d)
            closedir(d);
    } else if (code == RPC_OK && !coord_ckpt_servable(r->name)) {
        code = rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "'%.80s' is not a checkpoint file", r->name);
    } else if (code == RPC_OK && device && !fetchable(dir, r->name, &w)) {
        coord_jobs_denied(j, COORD_DENY_FETCH);
        code = rpc_status_set(k->st, RPC_PERMISSION_DENIED, "device %s may not fetch %.80s of job %s: "
                              "it holds what the device does not run", r->device_id, r->name,
                              r->job_id);
    } else if (code == RPC_OK) {
        char *p = path_of(dir, r->name);
        int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        struct stat sb;
        size_t max = k->c->o.max_message;
        uint32_t lim = (uint32_t)(max > 8192 ? max - 4096 : 4096);
        uint32_t want = r->max_bytes && r->max_bytes < lim ? r->max_bytes : lim;
        if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
            code = rpc_status_set(k->st, RPC_NOT_FOUND, "%s: no such file at step %d", r->name, step);
        } else {
            out.size = (uint64_t)sb.st_size;
            uint64_t left = r->offset < out.size ? out.size - r->offset : 0;
            size_t n = left < want ? (size_t)left : want;
            data = sl_xmalloc(n ? n : 1);
            ssize_t got = n ? pread(fd, data, n, (off_t)r->offset) : 0;
            if (got != (ssize_t)n)
                code = rpc_status_set(k->st, RPC_INTERNAL, "%s: read failed", r->name);
            out.data.data = data;
            out.data.len = n;
        }
        if (fd >= 0)
            close(fd);
        free(p);
    }
    if (code == RPC_OK)
        reply(k, &out);
    for (size_t i = 0; i < out.n_names; i++)
        free(out.names[i]);
    free(out.names);
    free(data);
    free(dir);
    json_decref(w.replica_files);
    return code;
}
HANDLER(coord_handle_fetch_file, "FetchFileRequest", skyloom__v1__fetch_file_request__descriptor,
        COORD_ALLOW_ADMIN | COORD_ALLOW_DEVICE, 1, COORD_MEMBER_STAGE, fetch_file)

static int upload_init(call *k)
{
    int code = coord_uploads_piece(k->j->uploads, k->req, k->st);
    if (code != RPC_OK)
        return code;
    Skyloom__V1__UploadInitResponse o = SKYLOOM__V1__UPLOAD_INIT_RESPONSE__INIT;
    return reply(k, &o);
}
HANDLER(coord_handle_upload_init, "UploadInitRequest", skyloom__v1__upload_init_request__descriptor,
        COORD_ALLOW_ADMIN, 0, 0, upload_init)

/* Whether device may write the piece now: the state machine's answer,
 * after the job's pending effects ran when it asks for them (a new epoch's
 * files being reset). */
static int upload_allowed(coord_jobs *j, cjob *jb, const Skyloom__V1__UploadChunkRequest *r)
{
    for (int tries = 0;; tries++) {
        pthread_mutex_lock(&j->mu);
        int v = coord_job_upload_check(&jb->sm, r->device_id, (int)r->epoch, (int)r->step, r->name);
        pthread_mutex_unlock(&j->mu);
        if (v != COORD_UPLOAD_LATER || tries == 100)
            return v == COORD_UPLOAD_LATER ? COORD_UPLOAD_NOT_RUNNING : v;
        coord_jobs_drain(j, jb);
    }
}

static int upload_chunk(call *k)
{
    const Skyloom__V1__UploadChunkRequest *r = k->req;
    coord_jobs *j = k->j;
    cjob *jb = k->jb;
    int v = jb ? upload_allowed(j, jb, r) : COORD_UPLOAD_NOT_RUNNING;
    uint8_t units[BAL_MAX_LAYERS + 2];
    int nunits = 0, replica = 0, nrep = 1;
    if (v == COORD_UPLOAD_OK) {
        /* the check again under the job's I/O lock: no epoch's reset can
         * run while the piece is written */
        pthread_mutex_lock(&jb->io_mu);
        pthread_mutex_lock(&j->mu);
        v = coord_job_upload_check(&jb->sm, r->device_id, (int)r->epoch, (int)r->step, r->name);
        nunits = coord_job_nunits(&jb->sm);
        coord_job_units_of(&jb->sm, r->device_id, units, nunits);
        replica = coord_job_stage_replica(&jb->sm, coord_job_stage_of(&jb->sm, r->device_id));
        nrep = jb->sm.nowner;
        pthread_mutex_unlock(&j->mu);
        if (v != COORD_UPLOAD_OK)
            pthread_mutex_unlock(&jb->io_mu);
    }
    if (v == COORD_UPLOAD_NOT_RUNNING || v == COORD_UPLOAD_LATER)
        return rpc_status_set(k->st, RPC_FAILED_PRECONDITION, "job %.40s is not running epoch %u",
                              r->job_id, r->epoch);
    if (v == COORD_UPLOAD_REFUSED) {
        coord_jobs_denied(j, COORD_DENY_NOT_OWN_PART);
        return rpc_status_set(k->st, RPC_PERMISSION_DENIED, "device %s may not upload '%.80s' for "
                              "step %u (its parts are model.%s-uUNIT.safetensors and "
                              "optim.%s-uUNIT.safetensors; data.json or data.OWNER.json is the "
                              "data owner's)",
                              r->device_id, r->name, r->step, r->device_id, r->device_id);
    }
    Skyloom__V1__UploadChunkResponse o = SKYLOOM__V1__UPLOAD_CHUNK_RESPONSE__INIT;
    if (v == COORD_UPLOAD_COMMITTED) { /* a retry of a committed step: nothing to do */
        o.committed = 1;
        return reply(k, &o);
    }
    char why[4400] = "";
    int complete = 0;
    /* at most 4 checkpoint steps' parts of the whole model (weights and two
     * moments, in a federation also its sync state: the outer parameters,
     * their momentum and the error-feedback residual; and slack for
     * headers) per device and per job */
    uint64_t quota = 4 * ((nrep > 1 ? 6 : 3) * jb->model_bytes + (4u << 20));
    coord_ckpt_set_model(jb->ck, nunits, quota, quota * (uint64_t)nrep);
    coord_ckpt_set_replicas(jb->ck, nrep);
    coord_piece q = {r->device_id, (int)r->step, r->name, r->offset, r->data.data, r->data.len,
                     r->last, r->size, r->blake2b.data, r->blake2b.len, units, nunits, replica};
    int rc = coord_ckpt_piece(jb->ck, &q, &complete, why, sizeof why);
    pthread_mutex_unlock(&jb->io_mu);
    coord_fx_list fx = {0};
    int code = RPC_OK;
    pthread_mutex_lock(&j->mu);
    coord_job *sm = &jb->sm;
    if (rc == COORD_PIECE_OK || rc == COORD_PIECE_DAMAGED)
        coord_jobobs_upload(jb->obs, (int)r->step, r->data.len);
    if (rc == COORD_PIECE_OK && complete)
        coord_job_parts_done(sm, (int)r->epoch, (int)r->step, &fx);
    if (rc == COORD_PIECE_REFUSED || rc == COORD_PIECE_QUOTA) {
        j->denied[rc == COORD_PIECE_QUOTA ? COORD_DENY_QUOTA : COORD_DENY_NOT_OWN_PART]++;
        code = rpc_status_set(k->st, rc == COORD_PIECE_QUOTA ? RPC_RESOURCE_EXHAUSTED
                                                             : RPC_PERMISSION_DENIED, "%s", why);
    } else if (rc == COORD_PIECE_RANGE)
        code = rpc_status_set(k->st, RPC_OUT_OF_RANGE, "%s", why);
    else if (rc == COORD_PIECE_DAMAGED)
        code = rpc_status_set(k->st, RPC_DATA_LOSS, "%s", why);
    else if (rc == COORD_PIECE_STORE) {
        coord_job_store_failed(sm, (int)r->step, why, sl_unix_ms(), &fx);
        code = rpc_status_set(k->st, RPC_UNAVAILABLE, "%s", sm->state == COORD_JOB_WAITING ? sm->reason : why);
    }
    settle(j, jb, &fx);
    if (code != RPC_OK)
        return code;
    pthread_mutex_lock(&j->mu);
    o.committed = jb->sm.committed >= (int)r->step;
    pthread_mutex_unlock(&j->mu);
    return reply(k, &o);
}
HANDLER(coord_handle_upload_chunk, "UploadChunkRequest", skyloom__v1__upload_chunk_request__descriptor,
        COORD_ALLOW_DEVICE, 0, COORD_MEMBER_CAND | COORD_MEMBER_STAGE, upload_chunk)

/* ---- what devices report ------------------------------------------------------------------ */

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
    settle(j, k->jb, &fx);
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
        char why[600] = "", want[65], from[200], *vocab = NULL;
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
        if (ok && info && o >= 0 && k->jb->sm.state == COORD_JOB_CHECKING)
            coord_jobs_ds_record(j, r->device_id, k->jb->sm.owner[o].dataset, info, k->job_id,
                                 sl_unix_time());
        coord_job_check_done(&k->jb->sm, r->device_id, ok, why[0] ? why : r->reason, info, seq,
                             coord_jobs_settled(j), &devs, sl_unix_ms(), &fx);
        pthread_cond_broadcast(&j->cv); /* the engine starts profiling once settled */
        settle(j, k->jb, &fx);
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
        settle(j, k->jb, &fx);
        json_decref(res);
    }
    Skyloom__V1__ReportTaskResponse out = SKYLOOM__V1__REPORT_TASK_RESPONSE__INIT;
    return reply(k, &out);
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
    char *crt_path = path_of(c->pki, "coordinator.crt"), *key_path = path_of(c->pki, "coordinator.key");
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
        reply(k, &out);
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
                          r->masked};
    coord_fx_list fx = {0};
    pthread_mutex_lock(&j->mu);
    coord_job *sm = &k->jb->sm;
    int v = coord_job_step_report(sm, r->device_id, (int)r->epoch, (int)r->stage, (int)r->step,
                                  &rep, sl_unix_ms(), &fx);
    if (v == COORD_REPORT_TAKEN)
        coord_jobobs_report(k->jb->obs, r, sm->plan.p, sm->epoch, sm->id);
    if (v != COORD_REPORT_REFUSED)
        coord_obs_refused_add(j->refused, &j->nrefused, r);
    settle(j, k->jb, &fx);
    if (v == COORD_REPORT_REFUSED)
        return rpc_status_set(k->st, RPC_INVALID_ARGUMENT, "device %s does not run stage %u, or "
                              "step %u is out of range", r->device_id, r->stage, r->step);
    Skyloom__V1__ReportStepResponse out = SKYLOOM__V1__REPORT_STEP_RESPONSE__INIT;
    out.stop = v == COORD_REPORT_STOP;
    return reply(k, &out);
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
