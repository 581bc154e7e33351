/* dev_job.c - a device's part in federated jobs (dev_job.h). */
#include "dev_job.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <omp.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bal.h"
#include "cert.h"
#include "dev_ckpt.h"
#include "dev_exch.h"
#include "dev_fed.h"
#include "dev_net.h"
#include "dev_plan.h"
#include "dev_profile.h"
#include "dev_shard.h"
#include "dev_run.h"
#include "dev_stagesvc.h"
#include "dev_unitprof.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_path.h"
#include "sl_time.h"

#define CHUNK (512u << 10) /* pieces under the coordinator's default 1 MiB message limit */
#define CALL_MS 30000
#define MAX_LOCAL DEV_PLAN_MAX_LOCAL

/* ---- datasets ------------------------------------------------------------- */

static int name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

int dev_dataset_parse(const char *arg, dev_dataset *d, sl_err *err)
{
    const char *eq = strchr(arg, '=');
    if (!eq || !name_ok(arg, (size_t)(eq - arg)) || !eq[1] || strlen(eq + 1) >= sizeof d->path)
        return sl_err_set(err, SL_EINVAL, "--data %.80s: expected NAME=PATH with NAME of 1..64 "
                          "letters, digits, '.', '_' or '-'", arg);
    snprintf(d->name, sizeof d->name, "%.*s", (int)(eq - arg), arg);
    snprintf(d->path, sizeof d->path, "%s", eq + 1);
    return 0;
}

/* ---- state ------------------------------------------------------------------ */

typedef struct upload_item {
    struct upload_item *next;
    int step;
    char sub[32];     /* part-STEP, in the job's directory */
    char dir[4200];   /* its path */
    char (*name)[96]; /* a model and an optimizer file per unit, the data record */
    int n;
} upload_item;

struct run_ctx;

typedef struct job_rt {
    struct dev_jobs *js;
    char job[24];
    uint32_t epoch;
    pthread_t thread;
    int finished;          /* the thread is done (joinable) */
    int joined;
    int refs;              /* Exchange handlers inside the net */
    dev_net *net;
    struct run_ctx *ctx;   /* the run thread's, while it runs: a stop fails it */
    int stop;
    struct job_rt *prev;   /* the run of an older epoch this one waits out */
    struct job_rt *next;
    int queued, uploaded;  /* the last step whose part was queued, and uploaded or given up */
    int mark;              /* dev_jobs_mark_uploads: wait for parts up to this step */
    int committed;         /* the job's committed step, as its run tasks say */
    int told_committed;    /* its run tasks say it (a coordinator older than that does not) */
} job_rt;

typedef struct side_job {  /* a check or profile in progress or done */
    char key[64];
    pthread_t thread;
    int finished, joined;
    int ran, rc;           /* the task ran: its outcome, kept to be reported again */
    char *result;
    char reason[sizeof ((sl_err *)0)->msg];
    int reports;
    struct dev_jobs *js;
    dev_task t;
    struct side_job *next;
} side_job;

struct dev_jobs {
    dev_jobs_opts o;
    dev_dataset *datasets;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_rt *runs;
    side_job *side;
    int closing;
    /* Exchange streams that got in but sent no hello in time, or a
     * malformed one (those refused at the door: dev_stagesvc_counts) */
    uint64_t no_hello, bad_hello;
};

static rpc_channel *channel(dev_jobs *js, sl_err *err) { return dev_agent_channel_new(js->o.agent, err); }
static const char *self(dev_jobs *js) { return dev_agent_id(js->o.agent); }
static const char *state_dir(dev_jobs *js) { return dev_agent_state_dir(js->o.agent); }

static void report_task(dev_jobs *js, rpc_channel *ch, const dev_task *t, int ok, const char *reason,
                        const char *result)
{
    Skyloom__V1__ReportTaskRequest r = SKYLOOM__V1__REPORT_TASK_REQUEST__INIT;
    r.device_id = (char *)self(js);
    r.job_id = (char *)t->job;
    r.kind = (char *)t->kind;
    r.epoch = t->epoch;
    r.ok = ok;
    r.reason = (char *)(reason ? reason : "");
    r.result = (char *)(result ? result : "");
    Skyloom__V1__ReportTaskResponse *resp = NULL;
    rpc_status st = {0};
    int code = rpc_call_pb(ch, RPC_M_REPORT_TASK, &r, &skyloom__v1__report_task_response__descriptor,
                           (void **)&resp, CALL_MS, &st);
    if (code != RPC_OK)
        sl_log_warn("device: report failed", "job=%s kind=%s code=%s reason=\"%s\"", t->job,
                    t->kind, rpc_code_name(code), st.details);
    rpc_unpacked_free(resp);
}

static const dev_dataset *dataset(dev_jobs *js, const char *name)
{
    for (int i = 0; i < js->o.n_datasets; i++)
        if (!strcmp(js->datasets[i].name, name))
            return &js->datasets[i];
    return NULL;
}

/* ---- check ------------------------------------------------------------------ */

static dev_feed_opts feed_opts(json_t *o)
{
    dev_feed_opts fo = {
        .batch = (int)json_integer_value(json_object_get(o, "batch")),
        .first = (uint64_t)json_integer_value(json_object_get(o, "first")),
        .sequences = (uint64_t)json_integer_value(json_object_get(o, "sequences")),
        .shuffle = json_object_get(o, "shuffle") ? json_is_true(json_object_get(o, "shuffle")) : 1,
        .seed = (uint64_t)json_integer_value(json_object_get(o, "seed")),
        .mask_prob = json_object_get(o, "mask_prob") ? (float)json_number_value(json_object_get(o, "mask_prob")) : 0.15f,
    };
    if (fo.batch < 1)
        fo.batch = 1;
    return fo;
}

/* A task spec's config, with the spec's "task" (absent: mlm) as its last
 * unit, checked for it. */
static int config_of(json_t *spec, dev_config *c, sl_err *err)
{
    json_t *cfg = json_object_get(spec, "config"), *task = json_object_get(spec, "task");
    char *text = cfg ? json_dumps(cfg, JSON_COMPACT) : NULL;
    int rc = text ? dev_config_parse(c, text, err) : sl_err_set(err, SL_EINVAL, "no config");
    free(text);
    if (rc)
        return -1;
    if (task && (!json_is_string(task) || (c->task = dev_task_parse(json_string_value(task))) < 0))
        return sl_err_set(err, SL_EINVAL, "task: not mlm or classify");
    return dev_config_validate(c, err) ? sl_err_wrap(err, "task %s", dev_task_name(c->task)) : 0;
}

/* To classify: the job config's class names (id2label) are the shard's
 * labels in their order, or Hugging Face's defaults, as skyloom train
 * requires; else the classes would be mixed up. */
static int config_names_fit(json_t *spec, const dev_labels *l, sl_err *err)
{
    char *text = json_dumps(json_object_get(spec, "config"), JSON_COMPACT);
    char **names = NULL;
    int n = 0;
    int rc = text ? bal_bert_label_names(text, "the job's config", &names, &n, err)
                  : sl_err_set(err, SL_EINVAL, "no config");
    free(text);
    if (!rc)
        rc = dev_config_check_names(names, n, l, "the job's config", err);
    dev_config_free_names(names, n);
    return rc;
}

/* What a check says of the shard besides the job's range: its size, its
 * vocabulary's hash and (up to CHECK_VOCAB_MAX bytes, for the exported
 * model's vocab.txt) the vocabulary itself, the file's checksum. A job
 * that names a vocabulary hash gets a shard of that vocabulary or a
 * refusal. */
#define CHECK_VOCAB_MAX (768u << 10)
/* To classify, a check gives the shard's label count and hash, and its
 * label names while their labels.txt is at most this size (the check's
 * result stays under the coordinator's 1 MiB). */
#define CHECK_LABELS_MAX (64u << 10)

static int describe_shard(const dev_shard *s, const char *name, const char *want, json_t *r,
                          sl_err *err)
{
    uint8_t h[32];
    char vh[65], sh[65];
    dev_shard_vocab_hash(s, h);
    dev_hash_hex(h, vh);
    dev_shard_checksum(s, h);
    dev_hash_hex(h, sh);
    if (want && strcmp(want, vh))
        return sl_err_set(err, SL_EINVAL, "the shard of '%.64s' was built with the vocabulary %s, "
                          "not the job's %.64s (--vocab-hash, --vocab or --init): the same size, "
                          "another vocab.txt", name, vh, want);
    json_object_set_new(r, "shard_sequences", json_integer((json_int_t)dev_shard_count(s)));
    json_object_set_new(r, "vocab_hash", json_string(vh));
    json_object_set_new(r, "shard_hash", json_string(sh));
    json_object_set_new(r, "cased", json_boolean(dev_shard_cased(s)));
    dev_vocab *v = dev_shard_vocab(s, err);
    if (!v)
        return -1;
    size_t n = 0;
    const char *text = dev_vocab_text(v, &n);
    if (n <= CHECK_VOCAB_MAX)
        json_object_set_new(r, "vocab", json_stringn(text, n));
    dev_vocab_free(v);
    return 0;
}

static int do_check(dev_jobs *js, const dev_task *t, char **result, sl_err *err)
{
    json_error_t je;
    json_t *spec = json_loads(t->spec, 0, &je);
    int rc = -1;
    dev_feed *f = NULL;
    const char *name = json_string_value(json_object_get(spec, "dataset"));
    const dev_dataset *d = name ? dataset(js, name) : NULL;
    dev_config c;
    if (!spec || !name) {
        sl_err_set(err, SL_EINVAL, "malformed check task");
    } else if (!d) {
        sl_err_set(err, SL_EINVAL, "this device serves no dataset '%.64s' (it serves only what "
                   "--data names)", name);
    } else if (json_is_boolean(json_object_get(spec, "sealed")) &&
               json_is_boolean(json_object_get(spec, "u_shape")) &&
               dev_policy_check_options(&js->o.policy, json_is_true(json_object_get(spec, "sealed")),
                                        json_is_true(json_object_get(spec, "u_shape")), err)) {
        /* refused before any work: the job's options break this owner's policy */
    } else if (!config_of(spec, &c, err)) {
        dev_feed_opts fo = feed_opts(spec);
        if ((f = dev_feed_open(d->path, &c, &fo, err))) {
            const dev_order *o = dev_feed_order(f);
            json_t *r = json_pack("{s:I, s:i, s:I, s:I, s:s}", "sequences", (json_int_t)o->count,
                                  "seq_len", dev_feed_seq_len(f), "first", (json_int_t)o->first,
                                  "vocab_size", (json_int_t)c.vocab, "task",
                                  dev_task_name(c.task));
            /* to classify, dev_feed_open refused a shard without labels or
             * another count than the config's */
            const dev_labels *l = c.task == DEV_TASK_CLASSIFY ? dev_feed_labels(f) : NULL;
            rc = l ? config_names_fit(spec, l, err) : 0;
            if (!rc && l) {
                uint8_t h[32];
                char hex[65];
                size_t len = 0;
                dev_labels_hash(l, h);
                dev_hash_hex(h, hex);
                json_object_set_new(r, "num_labels", json_integer(dev_labels_count(l)));
                json_object_set_new(r, "labels_hash", json_string(hex));
                dev_labels_text(l, &len);
                if (len <= CHECK_LABELS_MAX) { /* the names the exported config.json gives */
                    json_t *names = json_array();
                    for (int i = 0; i < dev_labels_count(l); i++)
                        json_array_append_new(names, json_string(dev_labels_name(l, i)));
                    json_object_set_new(r, "labels", names);
                }
            }
            if (!rc)
                rc = describe_shard(dev_feed_shard(f), name,
                                    json_string_value(json_object_get(spec, "vocab_hash")), r, err);
            if (!rc)
                *result = json_dumps(r, JSON_COMPACT);
            json_decref(r);
        }
    }
    dev_feed_close(f);
    json_decref(spec);
    return rc;
}

/* ---- profile ---------------------------------------------------------------- */

/* A link's round trip and bandwidth to a peer, as the link can carry them.
 * Other candidates measure their links at the same time, and a peer may be
 * busy (training, when this device joins a running job), so each sample
 * can only come out slower than the link: the RTT is the fastest of
 * several 64-byte pings, and the bandwidth comes from the fastest of
 * several payload pings (the payload goes there and back: 2 x bytes in
 * their time less the RTT). Two untimed payload pings first grow the
 * connection's windows (TCP's and HTTP/2's). The payload
 * starts at `bytes` and doubles (up to PING_MAX) until one ping takes
 * PING_MIN_S, so that fixed costs per call weigh little on fast links. */
#define PING_MAX (4u << 20)
#define PING_MIN_S 0.05
#define RTT_PINGS 9
#define BW_PINGS 5
/* timed forwards and backwards of each kind of unit: a device under a CPU
 * quota runs in slices of its period, so one timing can be off by a slice */
#define UNIT_REPS 9
/* how long a device waits for the others of its machine to finish timing */
#define PROFILE_LOCK_S 30

static double min_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static int ping_s(rpc_channel *ch, dev_jobs *js, const uint8_t *buf, size_t len, double *t)
{
    rpc_status st;
    double t0 = sl_now_s();
    int ok = dev_stagesvc_ping(ch, self(js), buf, len, len > 64 ? 30000 : 5000, &st) == RPC_OK;
    *t = sl_now_s() - t0;
    return ok ? 0 : -1;
}

/* The first ping of a link. A peer answers pings only from the devices the
 * coordinator named to it as measuring their link to it, in its heartbeat
 * reply: until its next heartbeat it refuses (FAILED_PRECONDITION), so the
 * refusal is asked again for three of this device's heartbeat intervals. */
static int ping_first(rpc_channel *ch, dev_jobs *js, const char *peer, const uint8_t *buf)
{
    double until = sl_now_s() + 3e-3 * dev_agent_heartbeat_ms(js->o.agent) + 1.0;
    for (;;) {
        rpc_status st = {0};
        int code = dev_stagesvc_ping(ch, self(js), buf, 64, 5000, &st);
        if (code == RPC_OK)
            return 0;
        pthread_mutex_lock(&js->mu);
        int closing = js->closing;
        pthread_mutex_unlock(&js->mu);
        if (code != RPC_FAILED_PRECONDITION || sl_now_s() >= until || closing) {
            sl_log_warn("device: ping refused", "peer=%s code=%s reason=\"%s\"", peer,
                        rpc_code_name(code), st.details);
            return -1;
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static int measure_link(dev_jobs *js, const char *peer, const char *addr, size_t bytes, double *rtt,
                        double *bw)
{
    sl_err err = {0};
    if (bytes < 4096)
        bytes = 4096;
    rpc_channel *ch = dev_stagesvc_connect(state_dir(js), addr, peer, PING_MAX + 4096, &err);
    if (!ch)
        return -1;
    uint8_t *buf = sl_xcalloc(PING_MAX, 1);
    double r[RTT_PINGS], b[BW_PINGS], t = 0;
    int rc = ping_first(ch, js, peer, buf); /* the connection */
    for (int i = 0; !rc && i < 2; i++) {  /* the windows; the payload's size */
        rc = ping_s(ch, js, buf, bytes, &t);
        while (!rc && t < PING_MIN_S && bytes < PING_MAX) {
            bytes = 2 * bytes < PING_MAX ? 2 * bytes : PING_MAX;
            rc = ping_s(ch, js, buf, bytes, &t);
        }
    }
    for (int i = 0; !rc && i < RTT_PINGS; i++)
        rc = ping_s(ch, js, buf, 64, &r[i]);
    for (int i = 0; !rc && i < BW_PINGS; i++)
        rc = ping_s(ch, js, buf, bytes, &b[i]);
    if (!rc) {
        *rtt = min_of(r, RTT_PINGS);
        double d = min_of(b, BW_PINGS) - *rtt;
        *bw = 2.0 * (double)bytes / (d > 1e-6 ? d : 1e-6);
    }
    free(buf);
    rpc_channel_destroy(ch);
    return rc;
}

/* The links to the peers the coordinator named, one after another: measured
 * before the units, while this device computes nothing. Where the list has
 * this device in it (one list for every candidate), it starts with the peer
 * after itself, so that the candidates do not all measure the same peer at
 * once. */
static json_t *profile_links(dev_jobs *js, json_t *peers, size_t bytes)
{
    json_t *links = json_array();
    size_t n = json_array_size(peers), me = 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(peers, i), "id")) ?: "", self(js)))
            me = i;
    for (size_t k = 1; k <= n; k++) {
        json_t *p = json_array_get(peers, (me + k) % n);
        const char *id = json_string_value(json_object_get(p, "id"));
        const char *addr = json_string_value(json_object_get(p, "address"));
        double rtt, bw;
        if (!id || !addr || !strcmp(id, self(js)) || !cert_valid_device_id(id))
            continue;
        if (measure_link(js, id, addr, bytes, &rtt, &bw) == 0)
            json_array_append_new(links, json_pack("{s:s, s:f, s:f}", "peer", id, "rtt_s", rtt,
                                                   "bandwidth_Bps", bw));
        else
            sl_log_warn("device: link not measured", "peer=%s address=%s", id, addr);
    }
    return links;
}

/* A profile task: the links to the other candidates, the units, or both
 * (`round` "links", "units" or "": the spec's, as start_side read it). The
 * coordinator asks for the links of every candidate before the units of
 * any, so that no device computes while the others measure their links to
 * it. */
static int do_profile(dev_jobs *js, const dev_task *t, const char *round, char **result,
                      sl_err *err)
{
    json_error_t je;
    json_t *spec = json_loads(t->spec, 0, &je);
    dev_config c;
    int bm = (int)json_integer_value(json_object_get(spec, "micro_batch"));
    int T = (int)json_integer_value(json_object_get(spec, "seq"));
    size_t bytes = (size_t)json_integer_value(json_object_get(spec, "ping_bytes"));
    int links_only = !strcmp(round, "links"), units_only = !strcmp(round, "units");
    if (!spec || config_of(spec, &c, err)) {
        json_decref(spec);
        return -1;
    }
    if (bytes > PING_MAX)
        bytes = PING_MAX;
    json_t *links = units_only ? json_array()
                               : profile_links(js, json_object_get(spec, "peers"), bytes);
    if (links_only) {
        json_t *r = json_pack("{s:s, s:O}", "round", "links", "links", links);
        *result = json_dumps(r, JSON_COMPACT);
        json_decref(r);
        json_decref(links);
        json_decref(spec);
        return 0;
    }
    int U = dev_unit_count(&c);
    double *fwd = sl_xcalloc((size_t)U, sizeof *fwd), *bwd = sl_xcalloc((size_t)U, sizeof *bwd),
           *opt = sl_xcalloc((size_t)U, sizeof *opt);
    /* the job's optimizer; a coordinator that does not say: AdamW, fp32 state */
    dev_optim o;
    dev_optim_default(&o);
    const char *okind = json_string_value(json_object_get(spec, "optimizer"));
    const char *ostate = json_string_value(json_object_get(spec, "optim_state"));
    if (okind && !strcmp(okind, "lamb"))
        o.kind = DEV_OPT_LAMB;
    unsigned flags = ostate && !strcmp(ostate, "bf16") ? DEV_STAGE_BF16_STATE : 0;
    /* the job's precision (absent: fp32): units are timed as the run computes them */
    const json_t *pj = json_object_get(spec, "precision");
    int pflags = pj ? dev_precision_flags(json_string_value(pj)) : 0;
    if (pflags < 0) {
        sl_err_set(err, SL_EINVAL, "profile: precision '%.40s' is not fp32 or bf16",
                   json_is_string(pj) ? json_string_value(pj) : "(not a string)");
        json_decref(links);
        json_decref(spec);
        return -1;
    }
    flags |= (unsigned)pflags;
    omp_set_num_threads(js->o.threads);
    /* The units are timed with the machine's cores to this device: devices
     * sharing them take turns, and the plan charges the sharing (cpu_pool). */
    int lock = dev_machine_lock(PROFILE_LOCK_S);
    if (lock < 0)
        sl_log_warn("device: profiling without the machine to itself",
                    "job=%s reason=\"another device held it for %d s, or /etc/machine-id cannot be "
                    "locked\"", t->job, PROFILE_LOCK_S);
    int rc = dev_unit_times(&c, bm, T, NULL, UNIT_REPS, &o, flags, fwd, bwd, opt, err);
    dev_machine_unlock(lock);
    dev_cpu_pool pool;
    dev_cpu_pool_probe(&pool, js->o.threads);
    if (!rc) {
        json_t *f = json_array(), *b = json_array(), *os = json_array();
        for (int u = 0; u < U; u++) {
            json_array_append_new(f, json_real(fwd[u]));
            json_array_append_new(b, json_real(bwd[u]));
            json_array_append_new(os, json_real(opt[u]));
        }
        json_t *r = json_pack("{s:o, s:o, s:o, s:I, s:i, s:s, s:s, s:O}", "unit_fwd_s", f,
                              "unit_bwd_s", b, "unit_optim_s", os, "memory_bytes",
                              (json_int_t)js->o.memory_bytes, "threads", js->o.threads, "backend",
                              "cpu", "precision", dev_precision_name(flags), "links", links);
        json_t *cp = json_pack("{s:s, s:f, s:f}", "name", pool.name, "pool_cpus",
                               pool.pool_cpus, "cpus", pool.cpus);
        if (pool.net_ns[0])
            json_object_set_new(cp, "net_ns", json_string(pool.net_ns));
        json_object_set_new(r, "cpu_pool", cp);
        json_object_set_new(r, "task", json_string(dev_task_name(c.task))); /* the head timed */
        if (units_only)
            json_object_set_new(r, "round", json_string("units"));
        *result = json_dumps(r, JSON_COMPACT);
        json_decref(r);
    }
    json_decref(links);
    free(fwd);
    free(bwd);
    free(opt);
    json_decref(spec);
    return rc ? -1 : 0;
}

/* A check or profile runs once; its outcome is reported, and reported again
 * whenever the coordinator asks for the task again (it asks until a report
 * arrives: a report that failed, or a coordinator restarted since). */
static void *side_main(void *arg)
{
    side_job *s = arg;
    dev_jobs *js = s->js;
    sl_err err = {0};
    const char *round = strrchr(s->key, '/') + 1; /* the key ends with the profile's round */
    if (!s->ran) {
        s->rc = !strcmp(s->t.kind, "check") ? do_check(js, &s->t, &s->result, &err)
                                            : do_profile(js, &s->t, round, &s->result, &err);
        snprintf(s->reason, sizeof s->reason, "%s", s->rc ? err.msg : "");
        s->ran = 1;
        if (s->rc)
            sl_log_warn("device: task refused", "job=%s kind=%s reason=\"%s\"", s->t.job,
                        s->t.kind, s->reason);
        else
            sl_log_info("device: task done", "job=%s kind=%s round=%s", s->t.job, s->t.kind,
                        *round ? round : "-");
    } else {
        sl_log_info("device: task reported again", "job=%s kind=%s round=%s report=%d",
                    s->t.job, s->t.kind, *round ? round : "-", s->reports + 1);
    }
    rpc_channel *ch = channel(js, &err);
    if (ch) {
        report_task(js, ch, &s->t, s->rc == 0, s->rc ? s->reason : NULL, s->result);
        rpc_channel_destroy(ch);
    } else {
        sl_log_warn("device: report failed", "job=%s kind=%s reason=\"%s\"", s->t.job, s->t.kind,
                    err.msg);
    }
    pthread_mutex_lock(&js->mu);
    s->reports++;
    s->finished = 1;
    pthread_mutex_unlock(&js->mu);
    return NULL;
}

/* ---- run: the plan ---------------------------------------------------------- */

typedef struct run_ctx {
    dev_jobs *js;
    char revoked[32];      /* a neighbour the plan names that the coordinator revoked */
    int cancel;            /* the device or the coordinator stopped the run (rt_stop) */
    int trained;           /* every step trained, its parts uploaded and reported */
    job_rt *rt;
    rpc_channel *ch;
    dev_plan pl;           /* the plan as dev_plan checked it: all a run reads of it */
    dev_config cfg;
    int p, steps, start, every, batch, T, micro, threads;
    int codec_act, codec_grad;
    double topk;
    uint64_t num;
    int local[MAX_LOCAL], nlocal;
    int first;             /* the first stage of this device's chain (its replica's) */
    int fed;               /* a federation: the pipes sync with the other replicas */
    dev_fed_cfg fc;
    dev_net_stage *stages;
    dev_net *net;
    dev_stage *st[MAX_LOCAL];
    dev_pipe *pipe[MAX_LOCAL];
    dev_feed *feed;
    dev_optim opt;
    int kind;
    char dir[4096];        /* state/jobs/JOB */
    int dirfd;             /* that directory (sl_dir_open); -1 before it is made */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t compute; /* the local stages compute one at a time */
    int at_barrier, barrier_gen;
    int failed;
    int fail_code;         /* an sl_errcode: SL_ESTOPPED when the coordinator said stop */
    char why[512];
    /* step reports */
    struct step_report *rh, *rt_tail;
    int reporting, report_stop;
    pthread_t reporter;
    int has_reporter;
    /* uploads */
    upload_item *uh, *ut;
    int uploading, upload_stop;
    pthread_t uploader;
    int has_uploader;
    uint64_t refused_sent[DEV_FR_NREASONS]; /* frames refused, as reported so far (reporter) */
    uint64_t sync_raw, sync_wire; /* a federation's sync payloads sent, and their frames' bytes */
} run_ctx;

/* Called from the stage threads, the reporter and the uploader. The net is
 * aborted under r->mu: release_net takes it away under that lock before
 * freeing it, while the reporter and uploader may still be running. */
static void run_fail(run_ctx *r, int code, const char *why)
{
    pthread_mutex_lock(&r->mu);
    if (!r->failed) {
        r->failed = 1;
        r->fail_code = code;
        snprintf(r->why, sizeof r->why, "%s", why);
    }
    pthread_cond_broadcast(&r->cv);
    if (r->net)
        dev_net_abort(r->net, why);
    pthread_mutex_unlock(&r->mu);
}

static int run_failed(run_ctx *r)
{
    pthread_mutex_lock(&r->mu);
    int f = r->failed;
    pthread_mutex_unlock(&r->mu);
    return f;
}

/* Stops a run (under js->mu): its net and, while it runs, the run itself, so
 * that no wait of its threads (a restore, an upload) outlasts one call. */
static void rt_stop(job_rt *rt, const char *why)
{
    rt->stop = 1;
    if (rt->net)
        dev_net_abort(rt->net, why);
    if (rt->ctx) {
        pthread_mutex_lock(&rt->ctx->mu);
        rt->ctx->cancel = 1;
        pthread_mutex_unlock(&rt->ctx->mu);
        run_fail(rt->ctx, SL_ECANCELED, why);
    }
}

static int fetch_plan(run_ctx *r, const dev_task *t, sl_err *err)
{
    Skyloom__V1__GetPlanRequest q = SKYLOOM__V1__GET_PLAN_REQUEST__INIT;
    q.device_id = (char *)self(r->js);
    q.job_id = (char *)t->job;
    Skyloom__V1__SignedPlan *sp = NULL;
    rpc_status st = {0};
    int code = rpc_call_pb(r->ch, RPC_M_GET_PLAN, &q, &skyloom__v1__signed_plan__descriptor,
                           (void **)&sp, CALL_MS, &st);
    if (code != RPC_OK)
        return sl_err_set(err, SL_EIO, "fetching the plan: %s: %s", rpc_code_name(code), st.details);
    char *ca = NULL, *path = NULL;
    size_t ca_len = 0;
    dev_identity_files f;
    int rc = dev_identity_files_init(&f, state_dir(r->js), err) ||
             sl_read_file(f.ca, 1 << 20, &ca, &ca_len, err) ||
             cert_verify_signed(ca, ca_len, (const char *)sp->coordinator_cert.data,
                                sp->coordinator_cert.len, sp->plan.data, sp->plan.len,
                                sp->signature.data, sp->signature.len, err);
    /* a signer older than the newest coordinator certificate this device
     * has seen holds a rotated-out key */
    if (!rc && dev_agent_plan_signer(r->js->o.agent, (const char *)sp->coordinator_cert.data,
                                     sp->coordinator_cert.len, err))
        rc = -1;
    if (rc)
        sl_err_wrap(err, "the plan of job %s is refused", t->job);
    if (!rc && dev_plan_parse((const char *)sp->plan.data, sp->plan.len, self(r->js), &r->pl, err))
        rc = sl_err_wrap(err, "the plan of job %s", t->job);
    if (!rc && dev_policy_check_plan(&r->js->o.policy, &r->pl, self(r->js), err))
        rc = sl_err_wrap(err, "the plan of job %s is refused", t->job);
    if (!rc && (r->pl.epoch != t->epoch || strcmp(r->pl.job, t->job)))
        rc = sl_err_set(err, SL_ESTATE, "the plan is of another job or epoch than the task (%u)",
                        t->epoch);
    free(ca);
    free(path);
    rpc_unpacked_free(sp);
    return rc;
}

/* The plan's numbers and this device's stages, as dev_plan checked them. */
static void read_plan(run_ctx *r)
{
    const dev_plan *pl = &r->pl;
    r->cfg = pl->config;
    r->num = pl->job_num;
    r->steps = pl->steps;
    r->start = pl->start_step;
    r->every = pl->checkpoint_every;
    r->batch = pl->batch;
    r->fed = pl->n_replicas > 1;
    if (r->fed) {
        /* this device's replica: its batch, its chain, and how replicas meet */
        const dev_plan_replica *rp = &pl->replica[pl->my_replica];
        r->batch = rp->batch;
        r->first = rp->first_stage;
        dev_fed_default(&r->fc);
        r->fc.mode = pl->sync.mode;
        r->fc.every = pl->sync.every;
        r->fc.outer_lr = (float)pl->sync.outer_lr;
        r->fc.outer_momentum = (float)pl->sync.outer_momentum;
        int b[DEV_PLAN_MAX_REPLICAS];
        for (int k = 0; k < pl->n_replicas; k++)
            b[k] = pl->replica[k].batch;
        dev_sync_weights(&r->fc.sync, b, pl->n_replicas);
        for (int k = 0; k < pl->n_replicas; k++)
            if (pl->replica[k].away) { /* for this whole epoch */
                r->fc.sync.away_from[k] = 1;
                r->fc.sync.away_to[k] = UINT64_MAX;
            }
        r->fc.sync.codec = pl->sync.codec;
        r->fc.sync.topk = pl->sync.topk;
    }
    r->T = pl->seq;
    r->micro = pl->micro_batches;
    r->codec_act = pl->codec_act;
    r->codec_grad = pl->codec_grad;
    r->topk = pl->topk;
    r->p = pl->n_stages;
    r->stages = sl_xcalloc((size_t)r->p, sizeof *r->stages);
    for (int i = 0; i < r->p; i++) {
        snprintf(r->stages[i].device, sizeof r->stages[i].device, "%s", pl->stage[i].device);
        snprintf(r->stages[i].address, sizeof r->stages[i].address, "%s", pl->stage[i].address);
        memcpy(r->stages[i].link_key, pl->stage[i].link_key, sizeof r->stages[i].link_key);
        r->stages[i].replica = pl->stage[i].replica;
        r->stages[i].first_unit = pl->stage[i].first_unit;
        r->stages[i].last_unit = pl->stage[i].last_unit;
    }
    r->nlocal = pl->n_local;
    memcpy(r->local, pl->local, sizeof r->local);
    r->kind = pl->options.optimizer;
    dev_optim_for_run(&r->opt, r->kind, pl->options.lr, pl->options.weight_decay, pl->options.clip,
                      r->steps, pl->options.warmup);
    /* the local stages take turns computing (compute_lock), each with all
     * the device's threads */
    r->threads = r->js->o.threads;
}

static int open_net(run_ctx *r, sl_err *err)
{
    int Bm = r->batch / r->micro;
    dev_net_cfg nc = {
        .job = r->num,
        .epoch = r->pl.epoch,
        .stages = r->p,
        .stage = r->stages,
        .self_id = self(r->js),
        .self_kp = r->js->o.link_kp,
        .state = state_dir(r->js),
        .codec_act = r->codec_act,
        .codec_grad = r->codec_grad,
        .topk = r->topk,
        .sealed = r->pl.sealed,
        .depth = r->micro,
        .act_floats = (size_t)Bm * r->T * r->cfg.hidden,
        .mask_ints = (size_t)Bm * r->T,
        .label_ints = (size_t)r->batch * r->T,
        .tied_floats = (size_t)r->cfg.vocab * r->cfg.hidden,
        .gather_max = 4096,
        .replicas = r->fed ? r->pl.n_replicas : 0,
        .model = &r->cfg,
        .sync = r->fc.sync,
    };
    if (!(r->net = dev_net_open(&nc, err)))
        return -1;
    /* a plan with a neighbour the coordinator revoked is not run */
    char peer[32];
    for (int k = 0; dev_net_neighbour(r->net, k, peer, sizeof peer); k++)
        if (dev_agent_is_revoked(r->js->o.agent, peer)) {
            snprintf(r->revoked, sizeof r->revoked, "%s", peer);
            return sl_err_set(err, SL_EAUTH, "the plan's device %s, a neighbour of this device, is "
                              "revoked", peer);
        }
    pthread_mutex_lock(&r->js->mu);
    r->rt->net = r->net;
    if (r->rt->stop)
        dev_net_abort(r->net, "the coordinator stopped this epoch");
    pthread_mutex_unlock(&r->js->mu);
    return dev_net_start(r->net, err);
}

static int open_stages(run_ctx *r, sl_err *err)
{
    const dev_plan *pl = &r->pl;
    unsigned flags = (pl->options.recompute ? DEV_STAGE_RECOMPUTE : 0) |
                     (pl->options.recompute_attention ? DEV_STAGE_RECOMPUTE_ATTN : 0) |
                     (pl->options.bf16_state ? DEV_STAGE_BF16_STATE : 0) |
                     (pl->options.bf16_compute ? DEV_STAGE_BF16_COMPUTE : 0);
    uint64_t seed = pl->options.seed;
    /* a federation's device runs stages of its replica's chain */
    int chain = r->fed ? pl->replica[pl->my_replica].n_stages : r->p;
    for (int k = 0; k < r->nlocal; k++) {
        int i = r->local[k];
        dev_pipe_cfg pc = {.stages = chain, .index = i - r->first, .schedule = pl->schedule,
                           .warmup = pl->stage[i].warmup,
                           .B = r->batch, .T = r->T, .micro = r->micro, .seed = seed,
                           .replica = r->fed ? pl->my_replica : 0,
                           .compute_lock = r->nlocal > 1 ? &r->compute : NULL};
        int slots = dev_pipe_slots(&pc);
        if (slots < 1)
            return sl_err_set(err, SL_EINVAL, "stage %d: a schedule without slots", i);
        if (!(r->st[k] = dev_stage_create(&r->cfg, pl->stage[i].first_unit, pl->stage[i].last_unit,
                                          r->batch / r->micro, r->T, slots, seed, NULL, flags, err)) ||
            !(r->pipe[k] = dev_pipe_create(r->st[k], &pc, dev_net_port(r->net, i), err)) ||
            (r->fed && dev_pipe_set_fed(r->pipe[k], &r->fc, dev_net_sync(r->net, i), err)))
            return sl_err_wrap(err, "stage %d", i);
    }
    return 0;
}

/* ---- run: files to and from the coordinator -------------------------------- */

/* Fetches a committed file into dirfd/name (a name sl_path_name_check
 * accepted). */
static int fetch_file(run_ctx *r, const char *name, int step, int dirfd, sl_err *err)
{
    const char *to = name;
    int fd = sl_file_create_at(dirfd, name, err);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return fd >= 0 ? sl_err_set(err, SL_EIO, "%s: %s", to, strerror(errno)) : -1;
    }
    uint64_t off = 0, size = 1;
    int rc = 0;
    while (!rc && off < size) {
        if (run_failed(r)) {
            rc = sl_err_set(err, SL_ECANCELED, "fetching %s: the run stopped", name);
            break;
        }
        Skyloom__V1__FetchFileRequest q = SKYLOOM__V1__FETCH_FILE_REQUEST__INIT;
        q.device_id = (char *)self(r->js);
        q.job_id = r->rt->job;
        q.step = (uint32_t)step;
        q.name = (char *)name;
        q.offset = off;
        q.max_bytes = 512u << 10;
        Skyloom__V1__FetchFileResponse *resp = NULL;
        rpc_status st = {0};
        int code = rpc_call_pb(r->ch, RPC_M_FETCH_FILE, &q, &skyloom__v1__fetch_file_response__descriptor,
                               (void **)&resp, CALL_MS, &st);
        if (code != RPC_OK)
            rc = sl_err_set(err, SL_EIO, "fetching %s: %s: %s", name, rpc_code_name(code), st.details);
        else if (resp->data.len == 0 && resp->size > off)
            rc = sl_err_set(err, SL_EIO, "fetching %s: an empty piece", name);
        else if (fwrite(resp->data.data, 1, resp->data.len, f) != resp->data.len)
            rc = sl_err_set(err, SL_EIO, "%s: %s", to, strerror(errno));
        if (!rc) {
            size = resp->size;
            off += resp->data.len;
        }
        rpc_unpacked_free(resp);
    }
    if (fclose(f) && !rc)
        rc = sl_err_set(err, SL_EIO, "%s: %s", to, strerror(errno));
    return rc;
}

/* The names of a committed step's files (0: the latest); 0 files when there
 * is none. */
static int list_files(run_ctx *r, int step, char ***names, int *n, int *got_step, sl_err *err)
{
    Skyloom__V1__FetchFileRequest q = SKYLOOM__V1__FETCH_FILE_REQUEST__INIT;
    q.device_id = (char *)self(r->js);
    q.job_id = r->rt->job;
    q.step = (uint32_t)step;
    q.name = "";
    Skyloom__V1__FetchFileResponse *resp = NULL;
    rpc_status st = {0};
    *n = 0;
    *names = NULL;
    int code = rpc_call_pb(r->ch, RPC_M_FETCH_FILE, &q, &skyloom__v1__fetch_file_response__descriptor,
                           (void **)&resp, CALL_MS, &st);
    if (code == RPC_NOT_FOUND)
        return 0;
    if (code != RPC_OK)
        return sl_err_set(err, SL_EIO, "listing the checkpoint: %s: %s", rpc_code_name(code), st.details);
    *names = sl_xcalloc(resp->n_names + 1, sizeof **names);
    for (size_t i = 0; i < resp->n_names; i++)
        (*names)[(*n)++] = sl_xstrdup(resp->names[i]);
    *got_step = (int)resp->step;
    rpc_unpacked_free(resp);
    return 0;
}

static void names_free(char **v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static int fed_extras(run_ctx *r, int k, char prefix[32], dev_ckpt_extra x[3]);

/* Weights to start from: the committed checkpoint (any cut loads from any
 * cut), or the job's initial model, or the seed's initialisation. */
static int restore(run_ctx *r, sl_err *err)
{
    char **names = NULL;
    int n = 0, step = 0, want = r->start - 1;
    /* back from away: the step holds no part and no data record of this
     * replica, which was checked when the job began */
    int back = r->fed && r->pl.replica[r->pl.my_replica].rejoin;
    double t0 = sl_now_s();
    if (list_files(r, want, &names, &n, &step, err))
        return -1;
    int rc = 0;
    if (n == 0 && want > 0)
        rc = sl_err_set(err, SL_ESTATE, "the plan starts at step %d but step %d is not committed",
                        r->start, want);
    /* the coordinator's names become paths here: each must be a plain name */
    for (int i = 0; !rc && i < n; i++)
        if (sl_path_name_check(names[i], strlen(names[i]), err))
            rc = sl_err_wrap(err, "the checkpoint of step %d lists a file", want);
    char sub[32], dir[4200];
    snprintf(sub, sizeof sub, "restore-%d", want);
    snprintf(dir, sizeof dir, "%s/%s", r->dir, sub);
    sl_dir_remove_at(r->dirfd, sub);
    int dfd = -1;
    if (!rc && n > 0 && (dfd = sl_dir_open(r->dirfd, sub, 0700, SL_DIR_CREATE, err)) < 0)
        rc = -1;
    for (int i = 0; !rc && i < n; i++)
        rc = fetch_file(r, names[i], want, dfd, err);
    for (int k = 0; !rc && n > 0 && k < r->nlocal; k++) {
        if (want == 0) {
            /* the job's initial model: to classify, an MLM one starts the head afresh */
            char m[4400], fresh[1024];
            snprintf(m, sizeof m, "%s/model.safetensors", dir);
            rc = dev_ckpt_init_model(r->st[k], m, fresh, sizeof fresh, err);
            if (!rc && fresh[0])
                sl_log_info("device: the initial model lacks the classification head; initialised",
                            "job=%s tensors=\"%s\"", r->rt->job, fresh);
        } else if (r->fed) {
            /* its replica's parameters and moments, and the sync's own state
             * (fed parts) where the federation keeps one */
            char prefix[32];
            dev_ckpt_extra x[3];
            int nx = fed_extras(r, k, prefix, x);
            /* a replica back from away loads the lowest present replica's
             * parts (the coordinator lists them): its residual starts at 0 */
            if (back && nx > 0 && !strcmp(x[nx - 1].suffix, ".residual"))
                nx--;
            rc = dev_ckpt_load_replica(r->st[k], r->kind, dir, NULL, x, nx, 1, err);
            if (!rc)
                dev_fed_set_ready(dev_pipe_fed(r->pipe[k]));
        } else {
            rc = dev_ckpt_load_fetched(r->st[k], r->kind, dir, err);
        }
    }
    if (!rc && n > 0 && want > 0 && r->feed && r->fed && !back) {
        /* a federation's owner checks its own record, data.OWNER.json */
        char from[4400], to[4400];
        snprintf(from, sizeof from, "%s/data.%s.json", dir, self(r->js));
        snprintf(to, sizeof to, "%s/data.json", dir);
        if (rename(from, to))
            rc = sl_err_set(err, SL_ESTATE, "the checkpoint of step %d has no data record of "
                            "this owner (%s): %s", want, from, strerror(errno));
    }
    if (!rc && n > 0 && want > 0 && r->feed && !back)
        rc = dev_feed_check_record(r->feed, dir, err);
    if (!rc && n > 0) {
        uint64_t bytes = 0;
        for (int i = 0; i < n; i++) {
            struct stat sb;
            if (fstatat(dfd, names[i], &sb, AT_SYMLINK_NOFOLLOW) == 0)
                bytes += (uint64_t)sb.st_size;
        }
        sl_log_info("device: restored", "job=%s step=%d files=%d bytes=%llu seconds=%.3f", r->rt->job,
                    want, n, (unsigned long long)bytes, sl_now_s() - t0);
    }
    if (dfd >= 0)
        close(dfd);
    sl_dir_remove_at(r->dirfd, sub);
    names_free(names, n);
    return rc;
}

/* Waits up to ms for the run to be cancelled or to fail; 1 if it was. */
static int cancel_wait(run_ctx *r, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&r->mu);
    while (!r->cancel && !r->failed && pthread_cond_timedwait(&r->cv, &r->mu, &ts) != ETIMEDOUT) {
    }
    int c = r->cancel || r->failed;
    pthread_mutex_unlock(&r->mu);
    return c;
}

/* How long a part waits for the coordinator to make room (a commit of the
 * steps this device has under way) before its run fails. */
#define QUOTA_WAIT_S 120.0

static int upload_file(run_ctx *r, const upload_item *u, const char *name, sl_err *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", u->dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    fstat(fileno(f), &sb);
    uint64_t size = (uint64_t)sb.st_size, off = 0;
    double give_up = sl_now_s() + QUOTA_WAIT_S;
    uint8_t *buf = sl_xmalloc(CHUNK);
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, 32);
    int rc = 0;
    do {
        pthread_mutex_lock(&r->mu);
        int stop = r->cancel;
        pthread_mutex_unlock(&r->mu);
        if (stop) {
            rc = sl_err_set(err, SL_ECANCELED, "uploading %s of step %d: the run stopped", name,
                            u->step);
            break;
        }
        size_t k = fread(buf, 1, CHUNK, f);
        crypto_generichash_update(&hs, buf, k);
        uint8_t sum[32];
        int last = off + k >= size;
        if (last)
            crypto_generichash_final(&hs, sum, sizeof sum);
        Skyloom__V1__UploadChunkRequest q = SKYLOOM__V1__UPLOAD_CHUNK_REQUEST__INIT;
        q.device_id = (char *)self(r->js);
        q.job_id = r->rt->job;
        q.epoch = r->pl.epoch;
        q.step = (uint32_t)u->step;
        q.name = (char *)name;
        q.offset = off;
        q.data.data = buf;
        q.data.len = k;
        q.last = last;
        q.size = size;
        q.blake2b.data = last ? sum : NULL;
        q.blake2b.len = last ? 32 : 0;
        Skyloom__V1__UploadChunkResponse *resp = NULL;
        rpc_status st = {0};
        int code = rpc_call_pb(r->ch, RPC_M_UPLOAD_CHUNK, &q,
                               &skyloom__v1__upload_chunk_response__descriptor, (void **)&resp,
                               CALL_MS, &st);
        if (code == RPC_RESOURCE_EXHAUSTED && off == 0 && sl_now_s() < give_up) {
            /* the coordinator holds as many of this device's steps as it
             * takes until one commits (every device uploads in step order,
             * so a commit comes): the part waits for room, from its start */
            rpc_unpacked_free(resp);
            if (cancel_wait(r, 200)) {
                rc = sl_err_set(err, SL_ECANCELED, "uploading %s of step %d: the run stopped", name,
                                u->step);
                break;
            }
            rewind(f);
            crypto_generichash_init(&hs, NULL, 0, 32);
            continue;
        }
        if (code != RPC_OK)
            rc = sl_err_set(err, SL_EIO, "uploading %s of step %d: %s: %s", name, u->step,
                            rpc_code_name(code), st.details);
        else if (resp->committed)
            sl_log_info("device: step committed", "job=%s step=%d", r->rt->job, u->step);
        rpc_unpacked_free(resp);
        off += k;
        if (!last && k == 0)
            rc = sl_err_set(err, SL_EIO, "%s: shorter than it was", path);
        if (last)
            break;
    } while (!rc);
    free(buf);
    fclose(f);
    return rc;
}

static void *uploader_main(void *arg)
{
    run_ctx *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->uh && !r->upload_stop && !r->cancel)
            pthread_cond_wait(&r->cv, &r->mu);
        upload_item *u = r->cancel ? NULL : r->uh;
        if (u) {
            r->uh = u->next;
            if (!r->uh)
                r->ut = NULL;
            r->uploading = 1;
        }
        pthread_mutex_unlock(&r->mu);
        if (!u)
            return NULL;
        sl_err err = {0};
        int rc = 0;
        double t0 = sl_now_s();
        for (int i = 0; i < u->n && !rc; i++)
            rc = upload_file(r, u, u->name[i], &err);
        if (rc)
            run_fail(r, err.code ? err.code : SL_EIO, err.msg);
        else
            sl_log_info("device: checkpoint part uploaded", "job=%s step=%d seconds=%.3f",
                        r->rt->job, u->step, sl_now_s() - t0);
        sl_dir_remove_at(r->dirfd, u->sub);
        pthread_mutex_lock(&r->js->mu);
        r->rt->uploaded = u->step;
        pthread_cond_broadcast(&r->js->cv);
        pthread_mutex_unlock(&r->js->mu);
        free(u->name);
        free(u);
        pthread_mutex_lock(&r->mu);
        r->uploading = 0;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
}

/* A federation's sync state of local stage k that a checkpoint keeps beside
 * its parameters and moments, under the trainer's names (docs/federation.md):
 * outer.NAME and outer.NAME.momentum under outer:H, replica.R.NAME.residual
 * with a lossy codec; none under step with codec none. prefix: storage. */
static int fed_extras(run_ctx *r, int k, char prefix[32], dev_ckpt_extra x[3])
{
    dev_fed *f = r->fed ? dev_pipe_fed(r->pipe[k]) : NULL;
    int n = 0;
    if (!f)
        return 0;
    snprintf(prefix, 32, "replica.%d.", r->pl.my_replica);
    if (dev_fed_outer_params(f)) {
        x[n++] = (dev_ckpt_extra){r->st[k], "outer.", "", dev_fed_outer_params(f)};
        x[n++] = (dev_ckpt_extra){r->st[k], "outer.", ".momentum", dev_fed_momentum(f)};
    }
    if (dev_fed_residual(f))
        x[n++] = (dev_ckpt_extra){r->st[k], prefix, ".residual", dev_fed_residual(f)};
    return n;
}

/* The fed parts of this device (fed.ID-uU.safetensors, a unit each) in dir,
 * appended to u's names; 0 files without sync state. */
static int write_fed_parts(run_ctx *r, upload_item *u, int step, sl_err *err)
{
    char prefix[MAX_LOCAL][32];
    dev_ckpt_extra x[3 * MAX_LOCAL];
    int nx = 0;
    for (int k = 0; k < r->nlocal; k++)
        nx += fed_extras(r, k, prefix[k], x + nx);
    if (nx == 0)
        return 0;
    for (int k = 0; k < r->nlocal; k++) {
        int u0, u1;
        dev_stage_units(r->st[k], &u0, &u1);
        for (int unit = u0; unit <= u1; unit++) {
            dev_ckpt_file f;
            char name[96];
            snprintf(name, sizeof name, "fed.%s-u%d.safetensors", self(r->js), unit);
            if (dev_ckpt_write_extra_unit(u->dir, name, x, nx, step, unit, &f, err))
                return -1;
            snprintf(u->name[u->n++], sizeof u->name[0], "%s", name);
        }
    }
    return 0;
}

/* This device's part of step `step`: written now (the local stages wait at
 * the barrier), uploaded by the uploader thread. */
static int write_part(run_ctx *r, int step, sl_err *err)
{
    upload_item *u = sl_xcalloc(1, sizeof *u);
    u->step = step;
    snprintf(u->sub, sizeof u->sub, "part-%d", step);
    snprintf(u->dir, sizeof u->dir, "%s/%s", r->dir, u->sub);
    sl_dir_remove_at(r->dirfd, u->sub);
    dev_ckpt_file *files = NULL;
    int nfiles = 0;
    double t0 = sl_now_s();
    int pfd = sl_dir_open(r->dirfd, u->sub, 0700, SL_DIR_CREATE, err);
    if (pfd >= 0)
        close(pfd);
    int rc = pfd < 0 ||
             dev_ckpt_write_unit_parts(r->st, r->nlocal, r->kind, u->dir, self(r->js), &files,
                                       &nfiles, err);
    if (!rc) {
        /* a federation's sync state first: the step commits once every unit's
         * model and optimizer files are in, and this device's come after */
        u->name = sl_xcalloc((size_t)nfiles + 2 + (size_t)dev_unit_count(&r->cfg), sizeof *u->name);
        rc = write_fed_parts(r, u, step, err);
    }
    if (!rc) {
        for (int i = 0; i < nfiles; i++)
            snprintf(u->name[u->n++], sizeof u->name[0], "%s", files[i].name);
        if (r->feed) {
            rc = dev_feed_write_record(r->feed, u->dir, err);
            snprintf(u->name[u->n++], sizeof u->name[0], "data.json");
            /* a federation's owners: data.OWNER.json, each its own */
            if (!rc && r->fed) {
                char from[4400], to[4400];
                snprintf(u->name[u->n - 1], sizeof u->name[0], "data.%s.json", self(r->js));
                snprintf(from, sizeof from, "%s/data.json", u->dir);
                snprintf(to, sizeof to, "%s/%s", u->dir, u->name[u->n - 1]);
                if (rename(from, to))
                    rc = sl_err_set(err, SL_EIO, "%s: %s", to, strerror(errno));
            }
        }
    }
    free(files);
    if (rc) {
        free(u->name);
        free(u);
        return -1;
    }
    sl_log_debug("device: checkpoint part written", "job=%s step=%d seconds=%.3f", r->rt->job,
                 step, sl_now_s() - t0);
    pthread_mutex_lock(&r->js->mu);
    r->rt->queued = step;
    pthread_mutex_unlock(&r->js->mu);
    pthread_mutex_lock(&r->mu);
    if (r->ut)
        r->ut->next = u;
    else
        r->uh = u;
    r->ut = u;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* ---- run: the stages ----------------------------------------------------- */

/* A step's figures for the coordinator, sent by the reporter thread so that
 * no stage waits for the call. */
typedef struct step_report {
    struct step_report *next;
    int stage, step;
    dev_step_info info;
    dev_pipe_times t;
    dev_net_bytes b;
    uint64_t refused[DEV_FR_NREASONS]; /* this device's, so far */
    int nseg;
    dev_pipe_seg seg[]; /* the step's ops, on traced steps */
} step_report;

/* Steps whose ops go to the coordinator (every stage traces the same ones):
 * every step while that is a few hundred segments, else every 10th and the
 * last; none past 4096 segments a stage. */
static int traced_step(const run_ctx *r, int step)
{
    if (r->micro > 680)
        return 0;
    return r->micro <= 40 || step % 10 == 0 || step == r->steps;
}

static void report_step(run_ctx *r, int k, int step, const dev_step_info *info)
{
    const dev_pipe_seg *seg = NULL;
    int nseg = traced_step(r, step) ? dev_pipe_segments(r->pipe[k], &seg) : 0;
    step_report *q = sl_xcalloc(1, sizeof *q + (size_t)nseg * sizeof *seg);
    q->stage = r->local[k];
    q->step = step;
    q->info = *info;
    dev_pipe_times_get(r->pipe[k], &q->t);
    dev_net_take_bytes(r->net, r->local[k], &q->b);
    dev_net_refused(r->net, q->refused);
    pthread_mutex_lock(&r->mu);
    r->sync_raw += q->b.raw_sync;
    r->sync_wire += q->b.wire_sync;
    pthread_mutex_unlock(&r->mu);
    q->nseg = nseg;
    if (nseg)
        memcpy(q->seg, seg, (size_t)nseg * sizeof *seg);
    pthread_mutex_lock(&r->mu);
    if (r->rt_tail)
        r->rt_tail->next = q;
    else
        r->rh = q;
    r->rt_tail = q;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int send_report(run_ctx *r, const step_report *s, int *stop)
{
    Skyloom__V1__ReportStepRequest q = SKYLOOM__V1__REPORT_STEP_REQUEST__INIT;
    q.device_id = (char *)self(r->js);
    q.job_id = r->rt->job;
    q.epoch = r->pl.epoch;
    q.stage = (uint32_t)s->stage;
    q.step = (uint32_t)s->step;
    q.loss = s->info.loss;
    q.grad_norm = s->info.grad_norm;
    q.lr = s->info.lr;
    q.masked = (uint32_t)s->info.masked;
    q.fwd_s = s->t.fwd_s;
    q.bwd_s = s->t.bwd_s;
    q.recv_s = s->t.recv_s;
    q.send_s = s->t.send_s;
    q.finish_s = s->t.finish_s;
    q.step_s = s->t.step_s;
    q.raw_bytes = s->b.raw_down;
    q.wire_bytes = s->b.wire_down;
    q.raw_bytes_up = s->b.raw_up;
    q.wire_bytes_up = s->b.wire_up;
    q.raw_bytes_side = s->b.raw_side;
    q.wire_bytes_side = s->b.wire_side;
    q.raw_bytes_sync = s->b.raw_sync;
    q.wire_bytes_sync = s->b.wire_sync;
    static const Skyloom__V1__OpKind op_kind[DEV_SEG_NKINDS] = {
        SKYLOOM__V1__OP_KIND__OP_RECV_ACT, SKYLOOM__V1__OP_KIND__OP_FORWARD,
        SKYLOOM__V1__OP_KIND__OP_SEND_ACT, SKYLOOM__V1__OP_KIND__OP_RECV_GRAD,
        SKYLOOM__V1__OP_KIND__OP_BACKWARD, SKYLOOM__V1__OP_KIND__OP_SEND_GRAD,
        SKYLOOM__V1__OP_KIND__OP_SEND_LABELS, SKYLOOM__V1__OP_KIND__OP_RECV_LABELS,
        SKYLOOM__V1__OP_KIND__OP_SYNC, SKYLOOM__V1__OP_KIND__OP_OPTIMIZER};
    Skyloom__V1__OpSegment *segs = sl_xcalloc((size_t)s->nseg + 1, sizeof *segs);
    Skyloom__V1__OpSegment **segp = sl_xcalloc((size_t)s->nseg + 1, sizeof *segp);
    for (int i = 0; i < s->nseg; i++) {
        skyloom__v1__op_segment__init(&segs[i]);
        int kd = s->seg[i].kind;
        segs[i].kind = kd >= 0 && kd < DEV_SEG_NKINDS ? op_kind[kd] : SKYLOOM__V1__OP_KIND__OP_UNKNOWN;
        segs[i].micro_batch = s->seg[i].mb;
        segs[i].start_s = s->seg[i].start;
        segs[i].end_s = s->seg[i].end;
        segp[i] = &segs[i];
    }
    q.ops = segp;
    q.n_ops = (size_t)s->nseg;
    /* the frames refused since the last report that reached the coordinator;
     * reports may be queued out of the order their counts were taken in */
    Skyloom__V1__Count cnt[DEV_FR_NREASONS], *cntp[DEV_FR_NREASONS];
    char names[DEV_FR_NREASONS][40];
    for (int i = 1; i < DEV_FR_NREASONS; i++) {
        if (s->refused[i] <= r->refused_sent[i])
            continue;
        size_t k = q.n_frames_refused++;
        skyloom__v1__count__init(&cnt[k]);
        snprintf(names[i], sizeof names[i], "%s", dev_frame_reason_name(i));
        for (char *c = names[i]; *c; c++)
            *c = *c == ' ' ? '_' : *c;
        cnt[k].name = names[i];
        cnt[k].value = s->refused[i] - r->refused_sent[i];
        cntp[k] = &cnt[k];
    }
    q.frames_refused = cntp;
    Skyloom__V1__ReportStepResponse *resp = NULL;
    rpc_status st = {0};
    int code = rpc_call_pb(r->ch, RPC_M_REPORT_STEP, &q, &skyloom__v1__report_step_response__descriptor,
                           (void **)&resp, CALL_MS, &st);
    for (int i = 1; code == RPC_OK && i < DEV_FR_NREASONS; i++)
        if (s->refused[i] > r->refused_sent[i])
            r->refused_sent[i] = s->refused[i];
    free(segs);
    free(segp);
    if (code == RPC_OK && resp->stop)
        *stop = 1;
    rpc_unpacked_free(resp);
    if (code != RPC_OK)
        sl_log_warn("device: step report failed", "job=%s step=%d code=%s reason=\"%s\"",
                    r->rt->job, s->step, rpc_code_name(code), st.details);
    return code;
}

static void *reporter_main(void *arg)
{
    run_ctx *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->rh && !r->report_stop)
            pthread_cond_wait(&r->cv, &r->mu);
        step_report *q = r->rh;
        if (q) {
            r->rh = q->next;
            if (!r->rh)
                r->rt_tail = NULL;
            r->reporting = 1;
        }
        pthread_mutex_unlock(&r->mu);
        if (!q)
            return NULL;
        /* the coordinator writes a step once every stage's report of it is
         * in: a report that did not go through is sent again a few times */
        int stop = 0;
        for (int tries = 0, code; (code = send_report(r, q, &stop)) != RPC_OK && tries < 4; tries++) {
            if (code != RPC_UNAVAILABLE && code != RPC_DEADLINE_EXCEEDED && code != RPC_INTERNAL &&
                code != RPC_RESOURCE_EXHAUSTED)
                break;
            pthread_mutex_lock(&r->mu);
            int give_up = r->failed || r->report_stop;
            pthread_mutex_unlock(&r->mu);
            if (give_up)
                break;
            struct timespec ts = {0, (100L << tries) * 1000000L};
            nanosleep(&ts, NULL);
        }
        free(q);
        pthread_mutex_lock(&r->mu);
        r->reporting = 0;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        if (stop)
            run_fail(r, SL_ESTOPPED, "the coordinator stopped the job");
    }
}

/* The local stages meet after a checkpoint step; the last to arrive writes
 * the part of all of them. */
static int barrier(run_ctx *r, int step, sl_err *err)
{
    pthread_mutex_lock(&r->mu);
    int gen = r->barrier_gen, rc = 0;
    if (++r->at_barrier == r->nlocal) {
        pthread_mutex_unlock(&r->mu);
        rc = write_part(r, step, err);
        pthread_mutex_lock(&r->mu);
        r->at_barrier = 0;
        r->barrier_gen++;
        pthread_cond_broadcast(&r->cv);
    } else {
        while (r->barrier_gen == gen && !r->failed)
            pthread_cond_wait(&r->cv, &r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

typedef struct stage_arg {
    run_ctx *r;
    int k;
} stage_arg;

static void *stage_main(void *arg)
{
    stage_arg *a = arg;
    run_ctx *r = a->r;
    int k = a->k, i = r->local[k];
    omp_set_num_threads(r->threads);
    sl_err err = {0};
    for (int step = r->start; step <= r->steps; step++) {
        pthread_mutex_lock(&r->mu);
        int failed = r->failed;
        pthread_mutex_unlock(&r->mu);
        if (failed)
            break;
        dev_batch b, *bp = NULL;
        if (i == r->first) {
            if (dev_feed_batch(r->feed, step, &b, &err)) {
                run_fail(r, err.code ? err.code : SL_EIO, err.msg);
                break;
            }
            bp = &b;
        }
        dev_step_info info;
        if (dev_pipe_step(r->pipe[k], bp, &r->opt, &info, &err)) {
            char why[600];
            snprintf(why, sizeof why, "step %d: %.560s", step, err.msg);
            run_fail(r, err.code ? err.code : SL_EIO, why);
            break;
        }
        report_step(r, k, step, &info);
        if ((r->every > 0 && step % r->every == 0) || step == r->steps) {
            if (barrier(r, step, &err)) {
                run_fail(r, err.code ? err.code : SL_EIO, err.msg);
                break;
            }
        }
    }
    return NULL;
}

static void run_free(run_ctx *r)
{
    if (r->has_reporter) {
        pthread_mutex_lock(&r->mu);
        r->report_stop = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->reporter, NULL);
    }
    while (r->rh) {
        struct step_report *q = r->rh;
        r->rh = q->next;
        free(q);
    }
    if (r->has_uploader) {
        pthread_mutex_lock(&r->mu);
        r->upload_stop = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->uploader, NULL);
    }
    while (r->uh) {
        upload_item *u = r->uh;
        r->uh = u->next;
        sl_dir_remove_at(r->dirfd, u->sub);
        free(u->name);
        free(u);
    }
    for (int k = 0; k < r->nlocal; k++) {
        dev_pipe_free(r->pipe[k]);
        dev_stage_free(r->st[k]);
    }
    dev_feed_close(r->feed);
    dev_plan_free(&r->pl);
    free(r->stages);
    if (r->ch)
        rpc_channel_destroy(r->ch);
    if (r->dirfd >= 0)
        close(r->dirfd);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->compute);
}

/* Takes the net away from new Exchange handlers and waits for the ones in it. */
static void release_net(run_ctx *r)
{
    pthread_mutex_lock(&r->mu);
    dev_net *n = r->net;
    r->net = NULL; /* a later run_fail (reporter, uploader) no longer reaches it */
    pthread_mutex_unlock(&r->mu);
    if (!n)
        return;
    dev_jobs *js = r->js;
    dev_net_abort(n, "the job ended here");
    pthread_mutex_lock(&js->mu);
    r->rt->net = NULL;
    while (r->rt->refs > 0)
        pthread_cond_wait(&js->cv, &js->mu);
    pthread_mutex_unlock(&js->mu);
    dev_net_free(n);
}

/* state/jobs/JOB, made once the signed plan named the job (fetch_plan):
 * the job id is a name from the network, and neither directory may be a
 * symbolic link or another user's. */
static int job_dir(run_ctx *r, const char *job, sl_err *err)
{
    if (sl_path_name_check(job, strlen(job), err))
        return sl_err_wrap(err, "job id");
    /* the state directory is the operator's (dev_agent_open checked it) */
    int sfd = open(state_dir(r->js), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sfd < 0)
        return sl_err_set(err, SL_EIO, "%s: %s", state_dir(r->js), strerror(errno));
    int jfd = sl_dir_open(sfd, "jobs", 0700, SL_DIR_CREATE, err);
    close(sfd);
    if (jfd < 0)
        return sl_err_wrap(err, "the device's jobs directory");
    r->dirfd = sl_dir_open(jfd, job, 0700, SL_DIR_CREATE, err);
    close(jfd);
    if (r->dirfd < 0)
        return sl_err_wrap(err, "the directory of job %s", job);
    snprintf(r->dir, sizeof r->dir, "%s/jobs/%s", state_dir(r->js), job);
    return 0;
}

static int run_job(run_ctx *r, const dev_task *t, sl_err *err)
{
    if (!(r->ch = channel(r->js, err)) || fetch_plan(r, t, err) || job_dir(r, t->job, err))
        return -1;
    read_plan(r);
    if (open_net(r, err) || open_stages(r, err))
        return -1;
    if (r->local[0] == r->first) { /* the data owner feeds its chain's first stage */
        const dev_plan_options *po = &r->pl.options;
        const dev_dataset *d = dataset(r->js, r->pl.dataset);
        dev_feed_opts fo = {.batch = r->batch, .first = po->first, .sequences = po->sequences,
                            .shuffle = po->shuffle, .seed = po->seed, .mask_prob = (float)po->mask_prob};
        if (!d)
            return sl_err_set(err, SL_EINVAL, "stage 0 is this device's but it serves no dataset "
                              "'%.64s'", r->pl.dataset);
        if (!(r->feed = dev_feed_open(d->path, &r->cfg, &fo, err)))
            return -1;
        if (dev_feed_seq_len(r->feed) != r->T)
            return sl_err_set(err, SL_ESTATE, "the dataset's sequences are %d tokens, the plan's %d",
                              dev_feed_seq_len(r->feed), r->T);
    }
    if (restore(r, err))
        return -1;
    if (pthread_create(&r->uploader, NULL, uploader_main, r))
        return sl_err_set(err, SL_ENOMEM, "cannot start the uploader");
    r->has_uploader = 1;
    if (pthread_create(&r->reporter, NULL, reporter_main, r))
        return sl_err_set(err, SL_ENOMEM, "cannot start the reporter");
    r->has_reporter = 1;
    sl_log_info("device: job running", "job=%s epoch=%u stages=%d local=%d start=%d steps=%d",
                t->job, t->epoch, r->p, r->nlocal, r->start, r->steps);
    pthread_t th[MAX_LOCAL];
    stage_arg args[MAX_LOCAL];
    int started = 0;
    for (int k = 0; k < r->nlocal; k++) {
        args[k] = (stage_arg){r, k};
        if (pthread_create(&th[k], NULL, stage_main, &args[k])) {
            run_fail(r, SL_ENOMEM, "cannot start a stage thread");
            break;
        }
        started++;
    }
    for (int k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    /* the last part uploaded and every step reported before the job is done here */
    pthread_mutex_lock(&r->mu);
    while (!r->failed && (r->uh || r->uploading || r->rh || r->reporting))
        pthread_cond_wait(&r->cv, &r->mu);
    int failed = r->failed;
    r->trained = !failed;
    pthread_mutex_unlock(&r->mu);
    if (failed)
        return sl_err_set(err, r->fail_code, "%s", r->why);
    /* a stop from the coordinator while the links close (it saw the job
     * done first) still leaves the job done here (run_main) */
    return dev_net_close(r->net, 60000, err);
}

static void *run_main(void *arg)
{
    job_rt *rt = arg;
    dev_jobs *js = rt->js;
    dev_task t = {0};
    snprintf(t.job, sizeof t.job, "%s", rt->job);
    snprintf(t.kind, sizeof t.kind, "run");
    t.epoch = rt->epoch;
    run_ctx r = {.js = js, .rt = rt, .dirfd = -1};
    pthread_mutex_init(&r.mu, NULL);
    pthread_mutex_init(&r.compute, NULL);
    pthread_cond_init(&r.cv, NULL);
    sl_err err = {0};
    /* the old epoch's stages leave first: one run of a job at a time */
    pthread_mutex_lock(&js->mu);
    while (rt->prev && !rt->prev->finished && !rt->stop && !js->closing)
        pthread_cond_wait(&js->cv, &js->mu);
    int stopped = rt->stop || js->closing;
    rt->ctx = stopped ? NULL : &r;
    pthread_mutex_unlock(&js->mu);
    int rc = stopped ? sl_err_set(&err, SL_ECANCELED, "stopped before it started") : run_job(&r, &t, &err);
    pthread_mutex_lock(&js->mu);
    stopped = rt->stop || js->closing;
    pthread_mutex_unlock(&js->mu);
    if (rc && !stopped && err.code != SL_ESTOPPED) {
        char lost[64] = "", result[128] = "";
        if (r.revoked[0])
            snprintf(lost, sizeof lost, "%s", r.revoked);
        if (lost[0] || (r.net && dev_net_lost_peer(r.net, lost, sizeof lost)))
            snprintf(result, sizeof result, "{\"lost\": \"%s\"}", lost);
        sl_log_error("device: job failed", "job=%s epoch=%u suspect=%s reason=\"%s\"", rt->job,
                     rt->epoch, lost[0] ? lost : "-", err.msg);
        if (!r.ch)
            r.ch = channel(js, &err);
        if (r.ch)
            report_task(js, r.ch, &t, 0, err.msg, result);
        dev_agent_poke(js->o.agent); /* the next epoch's task, soon */
    } else if (!rc || (stopped && r.trained)) {
        char got[200] = "";
        static const int kinds[] = {DEV_DIR_ACTIVATION, DEV_DIR_MASK, DEV_DIR_GRADIENT,
                                    DEV_DIR_LABELS, DEV_DIR_TIED, DEV_DIR_GATHER,
                                    DEV_DIR_GATHER_RESULT, DEV_DIR_SYNC};
        static const char *const names[] = {"act", "mask", "grad", "labels", "tied", "gather",
                                            "gather_result", "sync"};
        for (int k = 0; k < (r.fed ? 8 : 7) && r.net; k++) {
            uint64_t n = 0;
            for (int i = 0; i < r.nlocal; i++)
                n += dev_net_received(r.net, r.local[i], kinds[k]);
            size_t o = strlen(got);
            snprintf(got + o, sizeof got - o, "%s%s:%llu", k ? "," : "", names[k], (unsigned long long)n);
        }
        if (r.fed)
            sl_log_info("device: job done here", "job=%s epoch=%u received=%s sync_raw=%llu "
                        "sync_wire=%llu", rt->job, rt->epoch, got, (unsigned long long)r.sync_raw,
                        (unsigned long long)r.sync_wire);
        else
            sl_log_info("device: job done here", "job=%s epoch=%u received=%s", rt->job, rt->epoch,
                        got);
    }
    pthread_mutex_lock(&js->mu);
    rt->ctx = NULL;
    pthread_mutex_unlock(&js->mu);
    release_net(&r);
    run_free(&r);
    pthread_mutex_lock(&js->mu);
    rt->finished = 1;
    pthread_cond_broadcast(&js->cv);
    pthread_mutex_unlock(&js->mu);
    return NULL;
}

/* ---- tasks -------------------------------------------------------------------- */

dev_jobs *dev_jobs_open(const dev_jobs_opts *o, sl_err *err)
{
    (void)err;
    dev_jobs *js = sl_xcalloc(1, sizeof *js);
    js->o = *o;
    js->datasets = sl_xcalloc((size_t)o->n_datasets + 1, sizeof *js->datasets);
    memcpy(js->datasets, o->datasets, (size_t)o->n_datasets * sizeof *js->datasets);
    if (js->o.threads < 1)
        js->o.threads = 1;
    pthread_mutex_init(&js->mu, NULL);
    pthread_cond_init(&js->cv, NULL);
    return js;
}

/* Joins finished work (called with the lock held). */
static void reap(dev_jobs *js)
{
    /* a finished run stays on record (joined): its epoch is never run twice */
    for (job_rt *rt = js->runs; rt; rt = rt->next)
        if (rt->finished && !rt->joined) {
            pthread_mutex_unlock(&js->mu);
            pthread_join(rt->thread, NULL);
            pthread_mutex_lock(&js->mu);
            rt->joined = 1;
        }
}

static void side_free(side_job *s)
{
    free(s->t.spec);
    free(s->result);
    free(s);
}

static void start_side(dev_jobs *js, const dev_task *t)
{
    /* a device joining during the job profiles again, in that epoch; the
     * rounds of a profile are tasks of their own */
    char key[64];
    const char *round = "";
    json_error_t je;
    json_t *spec = !strcmp(t->kind, "profile") && t->spec ? json_loads(t->spec, 0, &je) : NULL;
    const char *r = json_string_value(json_object_get(spec, "round"));
    if (r && (!strcmp(r, "links") || !strcmp(r, "units")))
        round = r;
    snprintf(key, sizeof key, "%s/%s/%u/%s", t->job, t->kind, t->epoch, round);
    json_decref(spec);
    for (side_job *s = js->side; s; s = s->next) {
        if (strcmp(s->key, key))
            continue;
        if (!s->finished)
            return; /* in progress */
        /* done, and asked for again: its report again, from a thread of its
         * own (the finished one exits without taking the lock) */
        if (!s->joined)
            pthread_join(s->thread, NULL);
        s->joined = 1;
        if (pthread_create(&s->thread, NULL, side_main, s) == 0)
            s->finished = s->joined = 0;
        return;
    }
    side_job *s = sl_xcalloc(1, sizeof *s);
    snprintf(s->key, sizeof s->key, "%s", key);
    s->js = js;
    s->t = *t;
    s->t.spec = sl_xstrdup(t->spec ? t->spec : "{}");
    if (pthread_create(&s->thread, NULL, side_main, s)) {
        side_free(s);
        return;
    }
    s->next = js->side;
    js->side = s;
}

/* Leaves the job's runs of epochs before `epoch`; returns the newest of
 * them that has not finished yet. */
static job_rt *leave_older(dev_jobs *js, const char *job, uint32_t epoch, const char *why)
{
    job_rt *newest = NULL;
    for (job_rt *rt = js->runs; rt; rt = rt->next) {
        if (strcmp(rt->job, job) || rt->epoch >= epoch || rt->finished)
            continue;
        if (!rt->stop) {
            rt_stop(rt, why);
            sl_log_info("device: leaving job", "job=%s epoch=%u reason=\"%s\"", rt->job, rt->epoch, why);
        }
        if (!newest || rt->epoch > newest->epoch)
            newest = rt;
    }
    return newest;
}

/* The committed step a run task's spec gives, or -1 (none, or not a step). */
int dev_task_committed_step(const char *spec)
{
    json_error_t je;
    json_t *o = spec ? json_loads(spec, 0, &je) : NULL, *c = json_object_get(o, "committed_step");
    json_int_t v = json_is_integer(c) ? json_integer_value(c) : -1;
    json_decref(o);
    return v >= 0 && v <= INT32_MAX ? (int)v : -1;
}

/* A run task of rt's job and epoch said the job's committed step (-1: it
 * did not): it only ever raises what rt holds. Under js->mu. */
static void note_committed(job_rt *rt, int committed)
{
    if (committed < 0)
        return;
    rt->told_committed = 1;
    if (committed > rt->committed)
        rt->committed = committed;
}

static void start_run(dev_jobs *js, const dev_task *t)
{
    int committed = dev_task_committed_step(t->spec);
    for (job_rt *rt = js->runs; rt; rt = rt->next)
        if (!strcmp(rt->job, t->job) && rt->epoch >= t->epoch) {
            if (rt->epoch == t->epoch)
                note_committed(rt, committed);
            return; /* run or running: an epoch runs once */
        }
    job_rt *rt = sl_xcalloc(1, sizeof *rt);
    rt->js = js;
    note_committed(rt, committed);
    snprintf(rt->job, sizeof rt->job, "%s", t->job);
    rt->epoch = t->epoch;
    rt->prev = leave_older(js, t->job, t->epoch, "a new epoch of the job replaces this one");
    if (pthread_create(&rt->thread, NULL, run_main, rt)) {
        free(rt);
        return;
    }
    rt->next = js->runs;
    js->runs = rt;
}

/* "stop" with epoch E: the runs of the job's epochs before E end. */
static void stop_run(dev_jobs *js, const dev_task *t)
{
    leave_older(js, t->job, t->epoch, "the coordinator stopped the job");
}

void dev_jobs_note_run(dev_jobs *js, const dev_task *t)
{
    int committed = dev_task_committed_step(t->spec);
    pthread_mutex_lock(&js->mu);
    for (job_rt *rt = js->runs; rt; rt = rt->next)
        if (!strcmp(rt->job, t->job) && rt->epoch == t->epoch)
            note_committed(rt, committed);
    pthread_mutex_unlock(&js->mu);
}

void dev_jobs_task(dev_jobs *js, const dev_task *t)
{
    sl_err err = {0};
    /* a job id becomes a directory name: one that cannot is refused here */
    if (sl_path_name_check(t->job, strlen(t->job), &err)) {
        sl_log_warn("device: task refused", "kind=%s reason=\"job id: %s\"", t->kind, err.msg);
        return;
    }
    pthread_mutex_lock(&js->mu);
    reap(js);
    if (!js->closing) {
        if (!strcmp(t->kind, "check") || !strcmp(t->kind, "profile"))
            start_side(js, t);
        else if (!strcmp(t->kind, "run"))
            start_run(js, t);
        else if (!strcmp(t->kind, "stop"))
            stop_run(js, t);
    }
    pthread_mutex_unlock(&js->mu);
}

int dev_jobs_admit(void *ud, const char *peer_id, rpc_status *st)
{
    dev_jobs *js = ud;
    pthread_mutex_lock(&js->mu);
    int ok = 0, closing = js->closing;
    for (job_rt *rt = closing ? NULL : js->runs; rt && !ok; rt = rt->next)
        ok = rt->net && !rt->finished && !rt->stop && dev_net_serves_peer(rt->net, peer_id);
    pthread_mutex_unlock(&js->mu);
    if (ok)
        return RPC_OK;
    if (closing)
        return rpc_status_set(st, RPC_UNAVAILABLE, "this device is stopping");
    /* the caller may be a neighbour whose plan this device has not started
     * yet: it asks again */
    return rpc_status_set(st, RPC_FAILED_PRECONDITION, "device %s is not the neighbour of this "
                          "device in a plan it runs (yet)", peer_id);
}

int dev_jobs_exchange(void *ud, const char *peer_id, rpc_stream *s, rpc_status *st)
{
    dev_jobs *js = ud;
    sl_err err = {0};
    dev_exch_hello h;
    int bad = dev_exch_read_hello(s, DEV_EXCH_HELLO_MS, &h, &err);
    if (bad) {
        pthread_mutex_lock(&js->mu);
        uint64_t *c = bad == DEV_EXCH_NO_HELLO ? &js->no_hello : &js->bad_hello;
        uint64_t nth = ++*c;
        pthread_mutex_unlock(&js->mu);
        if ((nth & (nth - 1)) == 0) /* the 1st, 2nd, 4th, 8th, ... of each kind */
            sl_log_warn("device: Exchange stream closed", "peer=%s reason=\"%s\" count=%llu",
                        peer_id, err.msg, (unsigned long long)nth);
        return rpc_status_set(st, dev_exch_refusal_code(bad), "%s", err.msg);
    }
    char job[24];
    snprintf(job, sizeof job, "j%016llx", (unsigned long long)h.job);
    uint32_t epoch = h.epoch;
    pthread_mutex_lock(&js->mu);
    job_rt *rt = NULL;
    for (job_rt *x = js->closing ? NULL : js->runs; x; x = x->next)
        if (!strcmp(x->job, job) && x->epoch == epoch && x->net && !x->finished)
            rt = x;
    if (rt)
        rt->refs++;
    pthread_mutex_unlock(&js->mu);
    if (!rt)
        return rpc_status_set(st, RPC_FAILED_PRECONDITION, "job %s epoch %u is not running here "
                              "(yet)", job, epoch);
    int code = dev_net_accept(rt->net, peer_id, &h, s, st);
    pthread_mutex_lock(&js->mu);
    rt->refs--;
    pthread_cond_broadcast(&js->cv);
    pthread_mutex_unlock(&js->mu);
    return code;
}

void dev_jobs_revocations(dev_jobs *js)
{
    pthread_mutex_lock(&js->mu);
    for (job_rt *rt = js->runs; rt; rt = rt->next) {
        if (!rt->net || rt->finished || rt->stop)
            continue;
        char peer[32];
        for (int k = 0; dev_net_neighbour(rt->net, k, peer, sizeof peer); k++) {
            if (!dev_agent_is_revoked(js->o.agent, peer))
                continue;
            char why[160];
            snprintf(why, sizeof why, "the coordinator revoked device %s, a neighbour of this "
                     "device in the plan", peer);
            sl_log_warn("device: leaving job", "job=%s epoch=%u reason=\"%s\"", rt->job,
                        rt->epoch, why);
            /* the peer is named first, then the run fails: its report says
             * which neighbour, and every stream of the net is closed */
            dev_net_abort_peer(rt->net, peer, why);
            if (rt->ctx)
                run_fail(rt->ctx, SL_EAUTH, why);
            break;
        }
    }
    pthread_mutex_unlock(&js->mu);
}

void dev_jobs_counts(dev_jobs *js, uint64_t *no_hello, uint64_t *bad_hello)
{
    pthread_mutex_lock(&js->mu);
    *no_hello = js->no_hello;
    *bad_hello = js->bad_hello;
    pthread_mutex_unlock(&js->mu);
}

void dev_jobs_stop(dev_jobs *js)
{
    if (!js)
        return;
    pthread_mutex_lock(&js->mu);
    js->closing = 1;
    pthread_cond_broadcast(&js->cv);
    for (job_rt *rt = js->runs; rt; rt = rt->next)
        rt_stop(rt, "the device is stopping");
    while (js->runs || js->side) {
        job_rt *rt = js->runs;
        side_job *s = js->side;
        if (rt) {
            js->runs = rt->next;
            pthread_mutex_unlock(&js->mu);
            if (!rt->joined)
                pthread_join(rt->thread, NULL);
            pthread_mutex_lock(&js->mu);
            free(rt);
        } else {
            js->side = s->next;
            pthread_mutex_unlock(&js->mu);
            if (!s->joined)
                pthread_join(s->thread, NULL);
            pthread_mutex_lock(&js->mu);
            side_free(s);
        }
    }
    pthread_mutex_unlock(&js->mu);
}

int dev_jobs_mark_uploads(dev_jobs *js, char *what, size_t cap)
{
    int n = 0;
    what[0] = 0;
    if (!js)
        return 0;
    pthread_mutex_lock(&js->mu);
    for (job_rt *rt = js->runs; rt; rt = rt->next) {
        rt->mark = !rt->finished && rt->queued > rt->uploaded ? rt->queued : 0;
        if (!rt->mark)
            continue;
        size_t o = strlen(what);
        snprintf(what + o, cap - o, "%sjob %s step %d", n++ ? ", " : "", rt->job, rt->mark);
    }
    pthread_mutex_unlock(&js->mu);
    return n;
}

/* Whether every run's marked part is uploaded and, with need_commit, its
 * step committed (or the run ended). */
static int marked_done(dev_jobs *js, int need_commit)
{
    int done = 1;
    if (!js)
        return 1;
    pthread_mutex_lock(&js->mu);
    for (job_rt *rt = js->runs; rt && done; rt = rt->next)
        done = !rt->mark || rt->finished ||
               (rt->uploaded >= rt->mark &&
                (!need_commit || !rt->told_committed || rt->committed >= rt->mark));
    pthread_mutex_unlock(&js->mu);
    return done;
}

int dev_jobs_marked_uploaded(dev_jobs *js) { return marked_done(js, 0); }
int dev_jobs_marked_committed(dev_jobs *js) { return marked_done(js, 1); }

int dev_jobs_commit_told(dev_jobs *js)
{
    int told = 1;
    if (!js)
        return 1;
    pthread_mutex_lock(&js->mu);
    for (job_rt *rt = js->runs; rt; rt = rt->next)
        told &= !rt->mark || rt->told_committed;
    pthread_mutex_unlock(&js->mu);
    return told;
}

void dev_jobs_close(dev_jobs *js)
{
    if (!js)
        return;
    dev_jobs_stop(js);
    free(js->datasets);
    pthread_cond_destroy(&js->cv);
    pthread_mutex_destroy(&js->mu);
    free(js);
}
