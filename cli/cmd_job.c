/* skyloom job: submit, list, status, watch, stop, export and trace federated jobs
 * on a coordinator, with the admin certificate of the PKI. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bal.h"
#include "cert.h"
#include "cli.h"
#include "coord_obs.h"
#include "dev_ckpt.h"
#include "dev_config.h"
#include "dev_plan.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"
#include "sl_mem.h"
#include "sl_time.h"

/* One usage text per job command: `skyloom job CMD --help` prints CMD's,
 * `skyloom job --help` (and `skyloom help job`) all of them. */
typedef struct job_cmd {
    const char *name, *synopsis, *text;
} job_cmd;

static const char conn_text[] =
    "The coordinator and the PKI: --coordinator HOST:PORT is the coordinator's gRPC\n"
    "address (its --listen), --pki DIR the PKI whose admin certificate the command\n"
    "uses (skyloom certs init). Without the options, the environment variables\n"
    "SKYLOOM_COORDINATOR and SKYLOOM_PKI give them; an option wins. Options may come\n"
    "before or after the job id.\n";

static const char submit_text[] =
    "A job trains a BERT across the devices of a coordinator: the data owner\n"
    "checks its dataset, the candidate devices profile themselves, the balancer\n"
    "places the layers (by default the data owner holds the first and the last\n"
    "unit, so token ids and labels never leave it), and the devices train 1F1B\n"
    "over sealed, compressed links, uploading checkpoints every K steps. The\n"
    "config is read here first (the reader skyloom train uses): a bad field or an\n"
    "unknown key is refused naming the file and the key.\n\n"
    "submit options:\n"
    "  --batch B, --micro-batches M   sequences per step and their split (8, 1)\n"
    "  --codec-act C      none (default), fp16, bf16, int8\n"
    "  --codec-grad C     none (default), fp16, bf16, int8, topk:F (0 < F <= 1)\n"
    "  --no-seal          plaintext frames (still inside mutual TLS)\n"
    "  --algo A           optimal (default), sky or even\n"
    "  --schedule S       1f1b (default) or gpipe\n"
    "  --checkpoint-every K   commit a checkpoint every K steps (default 50) and at\n"
    "                     the end\n"
    "  --init FILE        start from this model (safetensors, HF names)\n"
    "  --devices ID,...   the candidate devices (default: every online one)\n"
    "  --no-u-shape       a plain chain: the data owner holds unit 0 only, and the\n"
    "                     labels and the tied gradient travel to the last stage\n"
    "  --replan-margin F  a device that joins during the job is taken in when the\n"
    "                     plan with it is predicted F faster (default 0.10)\n"
    "  --lr X --warmup N --seed S --optimizer adamw|lamb --optim-state fp32|bf16\n"
    "  --precision fp32|bf16\n"
    "  --weight-decay X --clip X --mask-prob P --first N --sequences K\n"
    "  --no-shuffle --recompute --recompute-attention\n"
    "                     as for skyloom train: the job's result is the same\n"
    "federation (several data owners, a replica around each):\n"
    "  --data ID:NAME --data ID:NAME ...   one per owner; --owner-batch B1,B2,...\n"
    "                     each owner's sequences per step (instead of --batch)\n"
    "  --sync step|outer:H   average the gradients every step (default), or\n"
    "                     DiLoCo: H steps alone, then an outer step\n"
    "  --codec-sync C     what the replicas exchange: none (default), fp16, bf16,\n"
    "                     int8, topk:F, with error feedback\n"
    "  --outer-lr X --outer-momentum X   outer SGD with Nesterov momentum (0.7, 0.9)\n"
    "  --no-wait          return once submitted (default: wait until it runs or\n"
    "                     fails, and print the plan)\n"
    "  --json             print the job's summary and plan as JSON\n";

static const job_cmd job_cmds[] = {
    {"submit",
     "skyloom job submit --coordinator HOST:PORT --pki DIR --config C\n"
     "                          --data DEVICE_ID:NAME --steps N [options]",
     submit_text},
    {"list", "skyloom job list --coordinator HOST:PORT --pki DIR [--json]",
     "Every job of the coordinator: state, step of steps, committed step, loss, and the\n"
     "reason of a failure.\n"},
    {"status", "skyloom job status JOB --coordinator HOST:PORT --pki DIR [--json]",
     "One job: state, step, committed step, loss; the plan (stages, units, devices,\n"
     "sites, addresses, the predicted step); the last step's time and tokens/s, per\n"
     "stage busy share, seconds and bytes to the next stage; the recovery events.\n"
     "--json adds the options, the whole plan, the profiles and metrics.csv.\n"},
    {"watch", "skyloom job watch JOB --coordinator HOST:PORT --pki DIR",
     "Follows the job until it ends: a line per step (on a terminal one line\n"
     "rewritten in place) and the recovery events; exits 0 when it is done, 1 when\n"
     "it failed or was stopped.\n"},
    {"stop", "skyloom job stop JOB --coordinator HOST:PORT --pki DIR",
     "Stops the job: its devices leave it at their next heartbeat or step report;\n"
     "what was committed stays exportable.\n"},
    {"export", "skyloom job export JOB --coordinator HOST:PORT --pki DIR --out DIR",
     "Writes the committed step as DIR/model.safetensors (every tensor, Hugging Face\n"
     "BERT names) and DIR/config.json, for skyloom eval, fill-mask and PyTorch.\n"},
    {"trace", "skyloom job trace JOB --coordinator HOST:PORT --pki DIR --svg F [--json]",
     "The measured timeline of a recent step (every stage's forward, backward,\n"
     "send, receive and sync, idle between), as the devices reported it, to an SVG\n"
     "file (--svg), with the plan's predicted step marked; --json prints the ops.\n"},
    {"metrics", "skyloom job metrics JOB --coordinator HOST:PORT --pki DIR",
     "Prints the job's metrics.csv: a header, then one row per step (step, epoch,\n"
     "loss, masked tokens, gradient norm, learning rate, seconds, tokens/s, each\n"
     "stage's busy share, bytes per link raw and on the wire). docs/jobs.md\n"
     "describes the columns.\n"},
    {"compare", "skyloom job compare JOB JOB... --coordinator HOST:PORT --pki DIR [--svg F] [--json]",
     "Jobs side by side: their state, steps and last loss, then every option (and\n"
     "the config's fields) in a row, a column per job; '*' marks the rows whose\n"
     "values differ. --svg F writes their loss curves in one chart (a colour per\n"
     "job, the step across, the loss up; at most 4000 points per curve, the mean of\n"
     "each run of steps beyond). --json prints the same as JSON.\n"},
};
#define N_JOB_CMDS (int)(sizeof job_cmds / sizeof job_cmds[0])

static const job_cmd *job_cmd_find(const char *name)
{
    for (int i = 0; i < N_JOB_CMDS; i++)
        if (!strcmp(job_cmds[i].name, name))
            return &job_cmds[i];
    return NULL;
}

static void usage(FILE *f)
{
    for (int i = 0; i < N_JOB_CMDS; i++)
        fprintf(f, "%s %s\n", i ? "      " : "usage:", job_cmds[i].synopsis);
    fprintf(f, "\n%s\n", submit_text);
    for (int i = 1; i < N_JOB_CMDS; i++)
        fprintf(f, "%s:\n%s\n", job_cmds[i].name, job_cmds[i].text);
    fputs(conn_text, f);
}

static void usage_of(const job_cmd *jc)
{
    printf("usage: %s\n\n%s\n%s", jc->synopsis, jc->text, conn_text);
}

typedef struct client {
    rpc_channel *ch;
    const char *target, *pki;
    int code; /* of the last call that failed */
    char details[384];
} client;

static int connect_admin(client *c, const char *target, const char *pki, sl_err *err)
{
    char ca[4200], crt[4200], key[4200];
    if (cert_path(ca, sizeof ca, pki, "ca.crt", err) || cert_path(crt, sizeof crt, pki, "admin.crt", err) ||
        cert_path(key, sizeof key, pki, "admin.key", err))
        return -1;
    rpc_channel_opts co = {.target = target, .tls = {ca, crt, key}, .max_message = 256u << 20};
    c->target = target;
    c->pki = pki;
    return (c->ch = rpc_channel_create(&co, err)) ? 0 : -1;
}

static int call(client *c, const char *method, const void *req, const void *desc, void **resp,
                sl_err *err)
{
    rpc_status st = {0};
    int code = rpc_call_pb(c->ch, method, req, desc, resp, 60000, &st);
    if (code != RPC_OK) {
        c->code = code;
        snprintf(c->details, sizeof c->details, "%s", st.details);
        return cli_call_error(err, c->target, c->pki, code, st.details);
    }
    return 0;
}

#define UPLOAD_ID_LEN 32
#define UPLOAD_PIECE (512u << 10) /* under the coordinator's smallest message limit */
#define UPLOAD_RETRY_S 120        /* a piece is sent again while the coordinator is away this long */

/* One piece; sent again while the coordinator cannot be reached (a
 * restarted coordinator goes on with the upload, and takes a piece it
 * already wrote once). */
static int upload_piece(client *c, const Skyloom__V1__UploadInitRequest *q, sl_err *err)
{
    double waited = 0, pause = 0.25;
    for (;;) {
        rpc_status st = {0};
        void *r = NULL;
        int code = rpc_call_pb(c->ch, RPC_M_UPLOAD_INIT, q,
                               &skyloom__v1__upload_init_response__descriptor, &r, 60000, &st);
        rpc_unpacked_free(r);
        if (code == RPC_OK)
            return 0;
        if ((code != RPC_UNAVAILABLE && code != RPC_DEADLINE_EXCEEDED) || waited >= UPLOAD_RETRY_S ||
            !cli_call_may_pass(code, st.details))
            return cli_call_error(err, c->target, c->pki, code, st.details);
        if (waited == 0)
            fprintf(stderr, "skyloom job: %s unavailable (%s); sending the piece again for up to "
                    "%d s\n", c->target, st.details, UPLOAD_RETRY_S);
        usleep((useconds_t)(pause * 1e6));
        waited += pause;
        pause = pause < 4 ? 2 * pause : 4;
    }
}

/* Sends the model at `path` to the coordinator a piece at a time; the
 * upload's id (drawn here) in id, for the submit to name. */
static int upload_init(client *c, const char *path, char *id, sl_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
    unsigned char rnd[UPLOAD_ID_LEN / 2], sum[crypto_generichash_BYTES];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(id, UPLOAD_ID_LEN + 1, rnd, sizeof rnd);
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, sizeof sum);
    uint8_t *buf = sl_xmalloc(UPLOAD_PIECE);
    uint64_t off = 0;
    int rc = 0;
    for (;;) {
        size_t n = 0;
        ssize_t k = 1;
        while (n < UPLOAD_PIECE && (k = read(fd, buf + n, UPLOAD_PIECE - n)) != 0) {
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0)
                break;
            n += (size_t)k;
        }
        if (k < 0) {
            rc = sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
            break;
        }
        Skyloom__V1__UploadInitRequest q = SKYLOOM__V1__UPLOAD_INIT_REQUEST__INIT;
        q.upload_id = id;
        q.offset = off;
        q.data.data = buf;
        q.data.len = n;
        crypto_generichash_update(&h, buf, n);
        off += n;
        q.last = n < UPLOAD_PIECE;
        if (q.last) {
            crypto_generichash_final(&h, sum, sizeof sum);
            q.size = off;
            q.blake2b.data = sum;
            q.blake2b.len = sizeof sum;
        }
        rc = upload_piece(c, &q, err);
        if (rc) {
            sl_err_wrap(err, "--init %s: uploading at byte %llu", path, (unsigned long long)(off - n));
            break;
        }
        if (q.last)
            break;
    }
    free(buf);
    close(fd);
    return rc;
}

static Skyloom__V1__JobInfo *get_job(client *c, const char *id, uint32_t metrics_from, sl_err *err)
{
    Skyloom__V1__GetJobRequest q = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    q.job_id = (char *)id;
    q.metrics_from = metrics_from;
    Skyloom__V1__JobInfo *j = NULL;
    if (call(c, RPC_M_GET_JOB, &q, &skyloom__v1__job_info__descriptor, (void **)&j, err))
        return NULL;
    return j;
}

static json_t *summary_json(const Skyloom__V1__JobSummary *s)
{
    return json_pack("{s:s, s:s, s:i, s:i, s:i, s:f, s:I, s:s}", "job_id", s->job_id, "state",
                     s->state, "step", (int)s->step, "steps", (int)s->steps, "committed_step",
                     (int)s->committed_step, "loss", s->loss, "created_at",
                     (json_int_t)s->created_at, "reason", s->reason);
}

static json_t *loads_or_null(const char *s)
{
    json_error_t je;
    json_t *j = s && *s ? json_loads(s, 0, &je) : NULL;
    return j ? j : json_null();
}

static void print_plan(const char *plan_text)
{
    json_error_t je;
    json_t *p = json_loads(plan_text, 0, &je);
    if (!p)
        return;
    json_t *st = json_object_get(p, "stages"), *bst = json_object_get(json_object_get(p, "balancer"), "stages");
    printf("plan (epoch %lld, %s, %lld micro-batches, predicted %.3f s per step):\n",
           (long long)json_integer_value(json_object_get(p, "epoch")),
           json_string_value(json_object_get(json_object_get(p, "balancer"), "algo")),
           (long long)json_integer_value(json_object_get(p, "micro_batches")),
           json_number_value(json_object_get(p, "predicted_iteration_s")));
    size_t i;
    json_t *s;
    json_array_foreach(st, i, s) {
        json_t *b = json_array_get(bst, i);
        printf("  stage %zu  units %lld-%lld  device %s (%s)  %s\n", i,
               (long long)json_integer_value(json_object_get(s, "first_unit")),
               (long long)json_integer_value(json_object_get(s, "last_unit")),
               json_string_value(json_object_get(s, "device")),
               json_string_value(json_object_get(b, "site")) ?: "?",
               json_string_value(json_object_get(s, "address")));
    }
    json_array_foreach(json_object_get(json_object_get(p, "balancer"), "left_out"), i, s)
        printf("  left out: %s (%s)\n", json_string_value(json_object_get(s, "device")) ?: "?",
               json_string_value(json_object_get(s, "reason")) ?: "?");
    json_decref(p);
}

/* ---- submit ------------------------------------------------------------------ */

typedef struct sopt {
    const char *name, *key;
    int kind; /* 0 int, 1 real, 2 string, 3 flag true, 4 flag false */
} sopt;

static const sopt submit_opts[] = {
    {"--steps", "steps", 0},           {"--batch", "batch", 0},
    {"--micro-batches", "micro_batches", 0}, {"--codec-act", "codec_act", 2},
    {"--codec-grad", "codec_grad", 2}, {"--no-seal", "sealed", 4},
    {"--algo", "algo", 2},             {"--schedule", "schedule", 2},
    {"--checkpoint-every", "checkpoint_every", 0}, {"--lr", "lr", 1},
    {"--warmup", "warmup", 0},         {"--seed", "seed", 0},
    {"--optimizer", "optimizer", 2},   {"--optim-state", "optim_state", 2},
    {"--weight-decay", "weight_decay", 1}, {"--clip", "clip", 1},
    {"--mask-prob", "mask_prob", 1},   {"--first", "first", 0},
    {"--sequences", "sequences", 0},   {"--no-shuffle", "shuffle", 4},
    {"--recompute", "recompute", 3},   {"--recompute-attention", "recompute_attention", 3},
    {"--no-u-shape", "u_shape", 4},    {"--replan-margin", "replan_margin", 1},
    {"--precision", "precision", 2},   {"--sync", "sync", 2},
    {"--codec-sync", "codec_sync", 2}, {"--outer-lr", "outer_lr", 1},
    {"--outer-momentum", "outer_momentum", 1},
    {NULL, NULL, 0},
};

static int submit(client *c, int argc, char **argv)
{
    const char *config = NULL, *init = NULL, *devices = NULL, *owner_batch = NULL;
    char data[1200] = "";
    int json = 0, wait = 1, ndata = 0;
    json_t *o = json_object();
    sl_err err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--no-wait")) {
            wait = 0;
            continue;
        }
        const sopt *s = NULL;
        for (const sopt *x = submit_opts; x->name; x++)
            if (!strcmp(a, x->name))
                s = x;
        if (s && s->kind >= 3) {
            json_object_set_new(o, s->key, json_boolean(s->kind == 3));
            continue;
        }
        if (i + 1 >= argc)
            return sl_cli_fail("job", 2, "%s needs a value (see --help)", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--data")) {
            /* several: a federation, one replica per owner */
            if (strchr(v, ',') || strlen(data) + strlen(v) + 2 > sizeof data)
                return sl_cli_fail("job", 2, "--data %.80s: one DEVICE_ID:NAME per --data", v);
            snprintf(data + strlen(data), sizeof data - strlen(data), "%s%s", ndata++ ? "," : "", v);
        } else if (!strcmp(a, "--owner-batch"))
            owner_batch = v;
        else if (!strcmp(a, "--init"))
            init = v;
        else if (!strcmp(a, "--devices"))
            devices = v;
        else if (!s)
            return sl_cli_fail("job", 2, "unknown option '%s'", a);
        else if (s->kind == 0) {
            int64_t x;
            if (sl_parse_i64(a, v, -1, INT64_MAX, &x, &err))
                return sl_cli_fail("job", 2, "%s", err.msg);
            json_object_set_new(o, s->key, json_integer(x));
        } else if (s->kind == 1) {
            double x;
            if (sl_parse_double(a, v, 0, 1e9, &x, &err))
                return sl_cli_fail("job", 2, "%s", err.msg);
            json_object_set_new(o, s->key, json_real(x));
        } else {
            json_object_set_new(o, s->key, json_string(v));
        }
    }
    const char *prec = json_string_value(json_object_get(o, "precision"));
    if (prec && dev_precision_flags(prec) < 0) {
        json_decref(o);
        return sl_cli_fail("job", 2, "--precision must be fp32 or bf16, got '%s'", prec);
    }
    if (owner_batch) {
        if (json_object_get(o, "batch")) {
            json_decref(o);
            return sl_cli_fail("job", 2, "--batch and --owner-batch: give one (--owner-batch is "
                               "each owner's sequences per step)");
        }
        json_t *ob = json_array();
        char buf[256];
        snprintf(buf, sizeof buf, "%s", owner_batch);
        for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
            int64_t x;
            if (sl_parse_i64("--owner-batch", t, 1, 65536, &x, &err)) {
                json_decref(ob);
                json_decref(o);
                return sl_cli_fail("job", 2, "%s", err.msg);
            }
            json_array_append_new(ob, json_integer(x));
        }
        if ((int)json_array_size(ob) != ndata) {
            int rc = sl_cli_fail("job", 2, "--owner-batch has %zu entries for %d --data", json_array_size(ob),
                                 ndata);
            json_decref(ob);
            json_decref(o);
            return rc;
        }
        json_object_set_new(o, "owner_batch", ob);
    } else if (ndata > 1) {
        json_decref(o);
        return sl_cli_fail("job", 2, "several --data need --owner-batch B1,B2,... (each owner's "
                           "sequences per step)");
    }
    if (!config || !*data || !json_object_get(o, "steps")) {
        json_decref(o);
        return sl_cli_fail("job", 2, "submit needs --config, --data and --steps (see --help)");
    }
    /* what can be checked here is, so that a refusal names the option */
    const char *ca = json_string_value(json_object_get(o, "codec_act"));
    const char *cg = json_string_value(json_object_get(o, "codec_grad"));
    double frac;
    if ((ca && dev_plan_codec(ca, 0, &frac) < 0) || (cg && dev_plan_codec(cg, 1, &frac) < 0)) {
        int act = ca && dev_plan_codec(ca, 0, &frac) < 0;
        int rc = sl_cli_fail("job", 2, "--codec-%s '%s' is not a codec for %s (none, fp16, bf16, "
                             "int8%s)", act ? "act" : "grad", act ? ca : cg,
                             act ? "activations" : "gradients", act ? "" : ", topk:F with 0 < F <= 1");
        json_decref(o);
        return rc;
    }
    if (devices) {
        json_t *d = json_array();
        char buf[8192];
        snprintf(buf, sizeof buf, "%s", devices);
        for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv))
            json_array_append_new(d, json_string(t));
        json_object_set_new(o, "devices", d);
    }
    char *ctext = NULL, upload[UPLOAD_ID_LEN + 1] = "";
    size_t clen = 0;
    dev_config cfg;
    bal_bert bert;
    /* the config by the reader the coordinator and the devices use, its
     * errors naming this file */
    if (sl_read_file(config, 1 << 20, &ctext, &clen, &err) || bal_bert_parse(&bert, ctext, config, &err) ||
        (init && (dev_config_parse(&cfg, ctext, &err) || dev_ckpt_check_model(&cfg, init, &err) ||
                  upload_init(c, init, upload, &err)))) {
        free(ctext);
        json_decref(o);
        return sl_cli_fail("job", 1, "%s", err.msg);
    }
    char *otext = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    Skyloom__V1__SubmitJobRequest q = SKYLOOM__V1__SUBMIT_JOB_REQUEST__INIT;
    q.config = ctext;
    q.data = (char *)data;
    q.options = otext;
    q.init_upload = upload;
    Skyloom__V1__SubmitJobResponse *r = NULL;
    int rc = call(c, RPC_M_SUBMIT_JOB, &q, &skyloom__v1__submit_job_response__descriptor, (void **)&r, &err);
    free(ctext);
    free(otext);
    if (rc)
        return sl_cli_fail("job", 1, "%s", err.msg);
    char id[64];
    snprintf(id, sizeof id, "%s", r->job_id);
    rpc_unpacked_free(r);
    if (!wait) {
        printf("%s\n", id);
        return 0;
    }
    /* until it runs (or fails): the owner's check, profiles, the plan */
    const char *shown = "";
    for (;;) {
        Skyloom__V1__JobInfo *j = get_job(c, id, 0, &err);
        if (!j)
            return sl_cli_fail("job", 1, "%s", err.msg);
        const char *state = j->summary->state;
        int waiting = !strcmp(state, "checking") || !strcmp(state, "profiling") || !strcmp(state, "planning");
        if (!json && strcmp(shown, state) && waiting) {
            fprintf(stderr, "job %s: %s\n", id, state);
            shown = !strcmp(state, "checking") ? "checking" : !strcmp(state, "profiling") ? "profiling" : "planning";
        }
        if (!waiting) {
            int ok = strcmp(state, "failed") != 0;
            if (json) {
                json_t *out = summary_json(j->summary);
                json_object_set_new(out, "plan", loads_or_null(j->plan));
                char *s = json_dumps(out, JSON_INDENT(2));
                printf("%s\n", s);
                free(s);
                json_decref(out);
            } else if (ok) {
                printf("%s\n", id);
                print_plan(j->plan);
            }
            int status = ok ? 0 : sl_cli_fail("job", 1, "job %s %s: %s", id, state, j->summary->reason);
            rpc_unpacked_free(j);
            return status;
        }
        rpc_unpacked_free(j);
        usleep(200 * 1000);
    }
}

/* ---- list, status, watch, stop ------------------------------------------------- */

static int list(client *c, int json)
{
    Skyloom__V1__ListJobsRequest q = SKYLOOM__V1__LIST_JOBS_REQUEST__INIT;
    Skyloom__V1__ListJobsResponse *r = NULL;
    sl_err err = {0};
    if (call(c, RPC_M_LIST_JOBS, &q, &skyloom__v1__list_jobs_response__descriptor, (void **)&r, &err))
        return sl_cli_fail("job", 1, "%s", err.msg);
    if (json) {
        json_t *a = json_array();
        for (size_t i = 0; i < r->n_jobs; i++)
            json_array_append_new(a, summary_json(r->jobs[i]));
        char *s = json_dumps(a, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(a);
    } else {
        printf("%-18s %-10s %12s %10s %8s  %s\n", "JOB", "STATE", "STEP", "COMMITTED", "LOSS", "REASON");
        for (size_t i = 0; i < r->n_jobs; i++) {
            const Skyloom__V1__JobSummary *s = r->jobs[i];
            char step[32];
            snprintf(step, sizeof step, "%u/%u", s->step, s->steps);
            printf("%-18s %-10s %12s %10u %8.4f  %s\n", s->job_id, s->state, step, s->committed_step,
                   s->loss, s->reason);
        }
    }
    rpc_unpacked_free(r);
    return 0;
}

/* One recovery event: when (UTC), what, on which device, the epoch. */
static void print_event(const json_t *e)
{
    int64_t ms = json_integer_value(json_object_get(e, "at_ms"));
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    char when[32];
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%H:%M:%S", &tm);
    const char *dev = json_string_value(json_object_get(e, "device"));
    printf("  %s.%03d  epoch %lld  %-21s %s%s%s\n", when, (int)(ms % 1000),
           (long long)json_integer_value(json_object_get(e, "epoch")),
           json_string_value(json_object_get(e, "kind")), dev && *dev ? dev : "", dev && *dev ? ": " : "",
           json_string_value(json_object_get(e, "detail")));
}

static int status(client *c, const char *id, int json)
{
    sl_err err = {0};
    Skyloom__V1__JobInfo *j = get_job(c, id, 1, &err);
    if (!j)
        return sl_cli_fail("job", 1, "%s", err.msg);
    if (json) {
        json_t *out = summary_json(j->summary);
        json_object_set_new(out, "epoch", json_integer(j->epoch));
        json_object_set_new(out, "options", loads_or_null(j->options));
        json_object_set_new(out, "plan", loads_or_null(j->plan));
        json_object_set_new(out, "last_step", loads_or_null(j->stages));
        json_object_set_new(out, "profiles", loads_or_null(j->profiles));
        json_object_set_new(out, "metrics_csv", json_string(j->metrics));
        json_object_set_new(out, "events", loads_or_null(j->events));
        char *s = json_dumps(out, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(out);
    } else {
        const Skyloom__V1__JobSummary *s = j->summary;
        printf("job %s: %s, step %u of %u, committed %u, loss %.4f%s%s\n", s->job_id, s->state,
               s->step, s->steps, s->committed_step, s->loss, *s->reason ? ", " : "", s->reason);
        if (*j->plan)
            print_plan(j->plan);
        json_error_t je;
        json_t *ls = *j->stages ? json_loads(j->stages, 0, &je) : NULL;
        if (ls) {
            printf("last step %lld: %.3f s, %.0f tokens/s\n",
                   (long long)json_integer_value(json_object_get(ls, "step")),
                   json_number_value(json_object_get(ls, "step_s")),
                   json_number_value(json_object_get(ls, "tokens_per_s")));
            size_t i;
            json_t *x;
            json_array_foreach(json_object_get(ls, "stages"), i, x) {
                json_t *ln = json_object_get(x, "link_next");
                printf("  stage %zu  busy %3.0f%%  fwd %.3f s  bwd %.3f s  recv %.3f s  send %.3f s",
                       i, 100 * json_number_value(json_object_get(x, "busy")),
                       json_number_value(json_object_get(x, "fwd_s")),
                       json_number_value(json_object_get(x, "bwd_s")),
                       json_number_value(json_object_get(x, "recv_s")),
                       json_number_value(json_object_get(x, "send_s")));
                if (ln)
                    printf("  -> next: %lld B raw, %lld B on the wire",
                           (long long)json_integer_value(json_object_get(ln, "raw_bytes")),
                           (long long)json_integer_value(json_object_get(ln, "wire_bytes")));
                printf("\n");
            }
            json_decref(ls);
        }
        json_error_t je2;
        json_t *ev = *j->events ? json_loads(j->events, 0, &je2) : NULL;
        if (json_array_size(ev))
            printf("events:\n");
        for (size_t i = 0; i < json_array_size(ev); i++)
            print_event(json_array_get(ev, i));
        json_decref(ev);
    }
    rpc_unpacked_free(j);
    return 0;
}

static int ended(const char *state)
{
    return !strcmp(state, "done") || !strcmp(state, "failed") || !strcmp(state, "stopped");
}

static int watch(client *c, const char *id)
{
    int tty = sl_cli_stdout_is_tty();
    uint32_t next = 1;
    size_t nev = (size_t)-1; /* events already shown (-1: none looked at yet) */
    double t0 = sl_now_s();
    sl_err err = {0};
    for (;;) {
        Skyloom__V1__JobInfo *j = get_job(c, id, next, &err);
        if (!j)
            return sl_cli_fail("job", 1, "%s", err.msg);
        const Skyloom__V1__JobSummary *s = j->summary;
        /* recovery: the events since the last look; after a re-plan the steps
         * from the committed one on are trained (and shown) again */
        json_error_t je;
        json_t *ev = *j->events ? json_loads(j->events, 0, &je) : NULL;
        for (size_t i = nev == (size_t)-1 ? json_array_size(ev) : nev; i < json_array_size(ev); i++) {
            const json_t *e = json_array_get(ev, i);
            if (tty)
                printf("\n");
            print_event(e);
            if (!strcmp(json_string_value(json_object_get(e, "kind")) ?: "", "planned"))
                next = (uint32_t)json_integer_value(json_object_get(e, "committed_step")) + 1;
        }
        nev = json_array_size(ev);
        json_decref(ev);
        /* rows: step,epoch,loss,masked,grad_norm,lr,step_s,tokens_per_s,stage_busy,... */
        for (char *line = j->metrics, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (nl)
                *nl = 0;
            int step, epoch;
            double loss, gn, lr, step_s, tok;
            unsigned masked;
            char busy[256] = "";
            if (sscanf(line, "%d,%d,%lf,%u,%lf,%lf,%lf,%lf,%255[^,]", &step, &epoch, &loss, &masked,
                       &gn, &lr, &step_s, &tok, busy) >= 8) {
                double eta = tok > 0 ? step_s * (s->steps - (uint32_t)step) : 0;
                if (tty)
                    printf("\rstep %d/%u  loss %.4f  %.0f tok/s  ETA %.0f s  busy %s   ", step,
                           s->steps, loss, tok, eta, busy);
                else
                    printf("step=%d loss=%.4f tokens_per_s=%.0f eta_s=%.0f busy=%s\n", step, loss, tok,
                           eta, busy);
                next = (uint32_t)step + 1;
            }
        }
        fflush(stdout);
        if (ended(s->state)) {
            if (tty)
                printf("\n");
            printf("job %s %s after %.0f s%s%s\n", id, s->state, sl_now_s() - t0,
                   *s->reason ? ": " : "", s->reason);
            int rc = !strcmp(s->state, "done") ? 0 : 1;
            rpc_unpacked_free(j);
            return rc;
        }
        rpc_unpacked_free(j);
        usleep(500 * 1000);
    }
}

static int stop(client *c, const char *id)
{
    Skyloom__V1__StopJobRequest q = SKYLOOM__V1__STOP_JOB_REQUEST__INIT;
    q.job_id = (char *)id;
    Skyloom__V1__StopJobResponse *r = NULL;
    sl_err err = {0};
    if (call(c, RPC_M_STOP_JOB, &q, &skyloom__v1__stop_job_response__descriptor, (void **)&r, &err))
        return sl_cli_fail("job", 1, "%s", err.msg);
    rpc_unpacked_free(r);
    printf("job %s stopped\n", id);
    return 0;
}

/* ---- trace -------------------------------------------------------------------- */

static int trace(client *c, const char *id, const char *svg, int json)
{
    sl_err err = {0};
    Skyloom__V1__GetJobRequest q = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    q.job_id = (char *)id;
    q.trace = 1;
    Skyloom__V1__JobInfo *j = NULL;
    if (call(c, RPC_M_GET_JOB, &q, &skyloom__v1__job_info__descriptor, (void **)&j, &err))
        return sl_cli_fail("job", 1, "%s", err.msg);
    if (!j->trace || !*j->trace) {
        int rc = sl_cli_fail("job", 1, "job %s (%s, step %u) has no traced step yet: the devices "
                             "send one with their step reports", id, j->summary->state,
                             j->summary->step);
        rpc_unpacked_free(j);
        return rc;
    }
    coord_obs_trace *t = coord_trace_parse(j->trace, &err);
    json_t *plan = loads_or_null(j->plan);
    double predicted = json_number_value(json_object_get(plan, "predicted_iteration_s"));
    json_decref(plan);
    int rc = 0;
    if (!t) {
        rc = sl_cli_fail("job", 1, "job %s: %s", id, err.msg);
    } else if (json) {
        json_t *x = loads_or_null(j->trace);
        char *text = json_dumps(x, JSON_INDENT(1));
        printf("%s\n", text);
        free(text);
        json_decref(x);
    }
    if (t && svg) {
        char *doc = coord_trace_svg(t, predicted);
        if (sl_write_file_atomic(svg, doc, strlen(doc), &err))
            rc = sl_cli_fail("job", 1, "%s", err.msg);
        else if (!json)
            printf("job %s: step %d (epoch %d, %d stages) written to %s\n", id, t->step, t->epoch,
                   t->p, svg);
        free(doc);
    }
    coord_trace_free(t);
    rpc_unpacked_free(j);
    return rc;
}

/* ---- export ------------------------------------------------------------------ */

static int fetch(client *c, const char *id, int step, const char *name, const char *to, sl_err *err)
{
    FILE *f = fopen(to, "wb");
    if (!f)
        return sl_err_set(err, SL_EIO, "%s: %s", to, strerror(errno));
    uint64_t off = 0, size = 1;
    int rc = 0;
    while (!rc && off < size) {
        Skyloom__V1__FetchFileRequest q = SKYLOOM__V1__FETCH_FILE_REQUEST__INIT;
        q.device_id = "";
        q.job_id = (char *)id;
        q.step = (uint32_t)step;
        q.name = (char *)name;
        q.offset = off;
        q.max_bytes = 512u << 10;
        Skyloom__V1__FetchFileResponse *r = NULL;
        rc = call(c, RPC_M_FETCH_FILE, &q, &skyloom__v1__fetch_file_response__descriptor, (void **)&r, err);
        if (!rc && r->data.len == 0 && r->size > off)
            rc = sl_err_set(err, SL_EIO, "%s: an empty piece", name);
        if (!rc && fwrite(r->data.data, 1, r->data.len, f) != r->data.len)
            rc = sl_err_set(err, SL_EIO, "%s: %s", to, strerror(errno));
        if (!rc) {
            size = r->size;
            off += r->data.len;
        }
        rpc_unpacked_free(r);
    }
    if (fclose(f) && !rc)
        rc = sl_err_set(err, SL_EIO, "%s: %s", to, strerror(errno));
    return rc;
}

/* Export of a job that has committed no step: says so, with when it
 * commits (its options) and where it is. */
static int no_commit(client *c, const char *id)
{
    sl_err err = {0};
    Skyloom__V1__JobInfo *j = get_job(c, id, 0, &err);
    if (!j)
        return sl_cli_fail("job", 1, "%s", err.msg);
    json_t *o = loads_or_null(j->options);
    long long k = json_integer_value(json_object_get(o, "checkpoint_every"));
    json_decref(o);
    const Skyloom__V1__JobSummary *s = j->summary;
    char when[64];
    if (k > 0 && k < s->steps)
        snprintf(when, sizeof when, "it commits every %lld steps", k);
    else
        snprintf(when, sizeof when, "it commits at its last step, %u", s->steps);
    int rc = ended(s->state)
                 ? sl_cli_fail("job", 1, "job %s has no committed step: it %s before its first "
                               "commit (%s)", id, s->state, when)
                 : sl_cli_fail("job", 1, "job %s has no committed step yet (%s; it is %s, at step "
                               "%u of %u)", id, when, s->state, s->step, s->steps);
    rpc_unpacked_free(j);
    return rc;
}

/* The committed step's parts, assembled into one model.safetensors (a stage
 * of the whole model loads every part; any cut loads from any cut). */
static int export_job(client *c, const char *id, const char *out)
{
    sl_err err = {0};
    Skyloom__V1__FetchFileRequest q = SKYLOOM__V1__FETCH_FILE_REQUEST__INIT;
    q.device_id = "";
    q.job_id = (char *)id;
    q.name = "";
    q.step = UINT32_MAX; /* whatever is committed */
    Skyloom__V1__FetchFileResponse *r = NULL;
    if (call(c, RPC_M_FETCH_FILE, &q, &skyloom__v1__fetch_file_response__descriptor, (void **)&r, &err)) {
        /* the step FetchFile names when nothing is committed is step 0,
         * which holds a model only for a job started from one */
        if (c->code != RPC_NOT_FOUND)
            return sl_cli_fail("job", 1, "%s", err.msg);
        Skyloom__V1__JobInfo *j = get_job(c, id, 0, &err);
        int none = j && j->summary->committed_step == 0;
        rpc_unpacked_free(j);
        return none ? no_commit(c, id) : sl_cli_fail("job", 1, "%s", err.msg);
    }
    int step = (int)r->step, status = 1;
    if (step == 0 || r->n_names == 0) {
        rpc_unpacked_free(r);
        return no_commit(c, id);
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s/.export-%s", out, id);
    dev_stage *s = NULL;
    dev_config cfg;
    if (sl_mkdir(out, 0755, &err) || sl_mkdir(tmp, 0700, &err))
        goto fail;
    for (size_t i = 0; i < r->n_names; i++) {
        char to[4400];
        snprintf(to, sizeof to, "%s/%s", tmp, r->names[i]);
        if (fetch(c, id, step, r->names[i], to, &err))
            goto fail;
    }
    char p[4400], m[4400];
    snprintf(p, sizeof p, "%s/config.json", tmp);
    if (dev_config_load(&cfg, p, &err))
        goto fail;
    snprintf(p, sizeof p, "%s/manifest.json", tmp);
    char *mtext = NULL;
    size_t mlen = 0;
    json_error_t je;
    json_t *man = sl_read_file(p, 1 << 20, &mtext, &mlen, &err) ? NULL : json_loadb(mtext, mlen, 0, &je);
    free(mtext);
    const char *os = json_string_value(json_object_get(man, "optim_state"));
    const char *opt = json_string_value(json_object_get(man, "optimizer"));
    unsigned flags = os && !strcmp(os, "bf16") ? DEV_STAGE_BF16_STATE : 0;
    int kind = opt && !strcmp(opt, "lamb") ? DEV_OPT_LAMB : DEV_OPT_ADAMW;
    json_decref(man);
    if (!(s = dev_stage_create(&cfg, 0, dev_unit_head(&cfg), 1, 1, 1, 1, NULL, flags, &err)) ||
        dev_ckpt_load(s, kind, tmp, &err))
        goto fail;
    snprintf(m, sizeof m, "%s/model.safetensors", out);
    snprintf(p, sizeof p, "%s/config.json", out);
    if (dev_ckpt_save_model(s, m, &err) || dev_config_save(&cfg, p, &err))
        goto fail;
    printf("job %s: step %d exported to %s (model.safetensors, config.json)\n", id, step, out);
    status = 0;
fail:
    if (status)
        sl_cli_fail("job", 1, "export: %s", err.msg);
    dev_stage_free(s);
    for (size_t i = 0; i < r->n_names; i++) {
        char f[4400];
        snprintf(f, sizeof f, "%s/%s", tmp, r->names[i]);
        unlink(f);
    }
    rmdir(tmp);
    rpc_unpacked_free(r);
    return status;
}

int cmd_job(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    const job_cmd *jc = job_cmd_find(sub);
    if (!jc)
        return sl_cli_fail("job", 2, "unknown job command '%s' (submit, list, status, watch, stop, "
                           "export, trace, metrics, compare)", sub);
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_of(jc);
            return 0;
        }
    int is_submit = !strcmp(sub, "submit"), is_compare = !strcmp(sub, "compare");
    int takes_id = strcmp(sub, "list") && !is_submit && !is_compare;
    int takes_svg = !strcmp(sub, "trace") || is_compare;
    const char *target = NULL, *pki = NULL, *out = NULL, *svg = NULL;
    int json = 0;
    /* the connection options, --out and --svg anywhere; submit's own go to
     * submit; the other commands take job ids, before or after options */
    char **rest = sl_xcalloc((size_t)argc, sizeof *rest), **pos = sl_xcalloc((size_t)argc, sizeof *pos);
    int nrest = 0, npos = 0, rc = -1;
    for (int i = 2; i < argc && rc < 0; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--coordinator") ? &target : !strcmp(a, "--pki") ? &pki
                           : !strcmp(a, "--out") && !strcmp(sub, "export") ? &out
                           : !strcmp(a, "--svg") && takes_svg ? &svg : NULL;
        if (dst) {
            if (i + 1 >= argc)
                rc = sl_cli_fail("job", 2, "%s needs a value", a);
            else
                *dst = argv[++i];
        } else if (!strcmp(a, "--json")) {
            json = 1;
            rest[nrest++] = argv[i];
        } else if (is_submit) {
            rest[nrest++] = argv[i];
        } else if (a[0] == '-' && a[1]) {
            rc = sl_cli_fail("job", 2, "job %s: unknown option '%s'", sub, a);
        } else {
            pos[npos++] = argv[i];
        }
    }
    target = cli_env_default(target, CLI_ENV_COORDINATOR);
    pki = cli_env_default(pki, CLI_ENV_PKI);
    sl_err err = {0};
    if (rc >= 0) {
        /* refused above */
    } else if (takes_id && npos != 1) {
        rc = npos ? sl_cli_fail("job", 2, "job %s takes one JOB id, not '%s' too", sub, pos[1])
                  : sl_cli_fail("job", 2, "job %s needs a JOB id (usage: %s)", sub, jc->synopsis);
    } else if (is_compare && npos < 2) {
        rc = sl_cli_fail("job", 2, "job compare needs two JOB ids or more");
    } else if (!takes_id && !is_compare && npos) {
        rc = sl_cli_fail("job", 2, "job %s: unexpected argument '%s'", sub, pos[0]);
    } else if (cli_need_connection("job", target, pki)) {
        rc = 2;
    } else if (cli_check_address("--coordinator", target, &err)) {
        rc = sl_cli_fail("job", 2, "%s", err.msg);
    } else if (!strcmp(sub, "export") && !out) {
        rc = sl_cli_fail("job", 2, "job export needs --out DIR");
    } else if (!strcmp(sub, "trace") && !svg && !json) {
        rc = sl_cli_fail("job", 2, "job trace needs --svg FILE (or --json)");
    } else {
        const char *id = takes_id ? pos[0] : NULL;
        client c = {0};
        rpc_global_init();
        if (connect_admin(&c, target, pki, &err))
            rc = sl_cli_fail("job", 1, "%s", err.msg);
        else if (is_submit)
            rc = submit(&c, nrest, rest);
        else if (!strcmp(sub, "list"))
            rc = list(&c, json);
        else if (!strcmp(sub, "status"))
            rc = status(&c, id, json);
        else if (!strcmp(sub, "watch"))
            rc = watch(&c, id);
        else if (!strcmp(sub, "stop"))
            rc = stop(&c, id);
        else if (!strcmp(sub, "trace"))
            rc = trace(&c, id, svg, json);
        else if (!strcmp(sub, "metrics"))
            rc = cmd_job_metrics(c.ch, target, pki, id);
        else if (is_compare)
            rc = cmd_job_compare(c.ch, target, pki, (const char *const *)pos, npos, svg, json);
        else
            rc = export_job(&c, id, out);
        if (c.ch)
            rpc_channel_destroy(c.ch);
        rpc_global_shutdown();
    }
    free(rest);
    free(pos);
    return rc;
}
