/* skyloom job: submit, list, status, watch, stop, export and trace federated jobs
 * on a coordinator, with the admin certificate of the PKI. */
#include <errno.h>
#include <signal.h>
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
#include "dev_labels.h"
#include "dev_plan.h"
#include "dev_vocab.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_config.h"
#include "sl_file.h"
#include "sl_mem.h"
#include "sl_path.h"
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
    "--data DEVICE:NAME names the data owner by its device id or by its name\n"
    "(skyloom device --name; it must be unique among the enrolled devices) and the\n"
    "dataset it serves. An owner that is offline, serves no Stage or does not\n"
    "serve NAME is refused at once.\n\n"
    "submit options:\n"
    "  --batch B, --micro-batches M   sequences per step and their split (8, 1)\n"
    "  --codec-act C      none (default), fp16, bf16, int8\n"
    "  --codec-grad C     none (default), fp16, bf16, int8, topk:F (0 < F <= 1)\n"
    "  --no-seal          plaintext frames (still inside mutual TLS)\n"
    "  --algo A           optimal (default), sky or even\n"
    "  --schedule S       1f1b (default) or gpipe\n"
    "  --checkpoint-every K   commit a checkpoint every K steps (default 50) and at\n"
    "                     the end\n"
    "  --init FILE|DIR    start from this model (safetensors, HF names; DIR: an\n"
    "                     exported folder); a vocab.txt beside it is the vocabulary\n"
    "                     the data must have\n"
    "  --vocab FILE       the vocab.txt the model is for: a shard built with another\n"
    "                     vocabulary (even of the same size) is refused\n"
    "  --vocab-hash HEX   the same by its hash (skyloom data vocab prints it)\n"
    "  --name N, --tag T  a name and labels (repeatable) for job list, compare and\n"
    "                     the dashboard\n"
    "  --task T           mlm (default) or classify: fine-tune a sequence classifier\n"
    "                     (the config's num_labels; a labelled dataset; --init an\n"
    "                     MLM model starts the classification head afresh). Needs a\n"
    "                     coordinator that knows the option\n"
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
    "  --outer-lr X --outer-momentum X   outer SGD with Nesterov momentum (0.7, 0.5)\n"
    "  --placement P      balanced (default): the devices go to the replicas that\n"
    "                     gain most; equal: dealt in turn, an equal share each\n"
    "  --no-wait          return once submitted (default: wait until it runs or\n"
    "                     fails, and print the plan; an interrupt leaves the job\n"
    "                     running and says how to follow or stop it)\n"
    "  --json             print the job's summary and plan as JSON\n";

static const job_cmd job_cmds[] = {
    {"submit",
     "skyloom job submit --coordinator HOST:PORT --pki DIR --config C\n"
     "                          --data DEVICE:NAME --steps N [options]",
     submit_text},
    {"list", "skyloom job list --coordinator HOST:PORT --pki DIR [--json]",
     "Every job of the coordinator: name, state, step of steps, committed step, the\n"
     "last loss, the config (layers x hidden), the data, its start (UTC) and its wall\n"
     "time, and the reason of a failure (--json adds the tags). A submit its data\n"
     "owner refused is not listed.\n"},
    {"status", "skyloom job status JOB --coordinator HOST:PORT --pki DIR [--json]",
     "One job: state, step, committed step, loss; the plan (stages, units, devices,\n"
     "sites, addresses, the predicted step); the last step's time and tokens/s, per\n"
     "stage busy share, seconds and bytes to the next stage; several data owners:\n"
     "each stage's sync bytes, each replica's owner, loss and sync bytes; the\n"
     "recovery events. --json adds the options, the whole plan, the profiles and\n"
     "metrics.csv.\n"},
    {"watch", "skyloom job watch JOB --coordinator HOST:PORT --pki DIR",
     "Follows the job until it ends: while it is checked, profiled and planned its\n"
     "phase; then a line per step (on a terminal one line rewritten in place): the\n"
     "loss and its exponential moving average (factor 0.1), tokens/s and the ETA\n"
     "over the last 20 steps, the committed step, the job's wall time since its\n"
     "submit (the coordinator's clock) and each stage's busy share; several data\n"
     "owners: a line per replica (owner, dataset, stages, devices) once per plan,\n"
     "and per step each replica's loss and the sync bytes; and the recovery\n"
     "events. Exits 0 when it is done, 1 when it failed or was stopped.\n"},
    {"stop", "skyloom job stop JOB --coordinator HOST:PORT --pki DIR [--at-checkpoint]",
     "Stops the job: its devices leave it at their next heartbeat or step report;\n"
     "what was committed stays exportable. --at-checkpoint lets it train on to its\n"
     "next commit and stop there, so that no trained step is lost (a job that has\n"
     "not started training stops at its first commit).\n"},
    {"resume", "skyloom job resume JOB --coordinator HOST:PORT --pki DIR",
     "Trains a stopped or failed job on from its last committed step: the same job\n"
     "id, a new epoch, planned again over the devices online, the model, optimizer\n"
     "state, learning-rate schedule and data position of that step (the result is\n"
     "the one an uninterrupted job reaches).\n"},
    {"export", "skyloom job export JOB --coordinator HOST:PORT --pki DIR --out DIR",
     "Writes the committed step as a folder that skyloom eval --model DIR, fill-mask\n"
     "--model DIR and PyTorch load as it is: model.safetensors (every tensor, Hugging\n"
     "Face BERT names), config.json, vocab.txt (the data owner's vocabulary),\n"
     "tokenizer_config.json and special_tokens_map.json (BertTokenizer), and\n"
     "training.json (the options, the data and vocabulary hashes, Skyloom's version).\n"},
    {"trace", "skyloom job trace JOB --coordinator HOST:PORT --pki DIR --svg F [--json]",
     "The measured timeline of a recent step (every stage's forward, backward,\n"
     "send, receive and sync, idle between), as the devices reported it, to an SVG\n"
     "file (--svg), with the plan's predicted step marked; --json prints the ops.\n"},
    {"metrics", "skyloom job metrics JOB --coordinator HOST:PORT --pki DIR",
     "Prints the job's metrics.csv: a header, then one row per step (step, epoch,\n"
     "loss, masked tokens, gradient norm, learning rate, seconds, tokens/s, each\n"
     "stage's busy share, bytes per link raw and on the wire; several data owners:\n"
     "each replica's loss and the sync bytes). docs/jobs.md describes the columns.\n"},
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

static json_t *strings_json(char **v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

static json_t *summary_json(const Skyloom__V1__JobSummary *s)
{
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:f, s:I, s:s}", "job_id", s->job_id, "state",
                          s->state, "step", (int)s->step, "steps", (int)s->steps, "committed_step",
                          (int)s->committed_step, "loss", s->loss, "created_at",
                          (json_int_t)s->created_at, "reason", s->reason);
    json_object_set_new(o, "name", json_string(s->name));
    json_object_set_new(o, "tags", strings_json(s->tags, s->n_tags));
    json_object_set_new(o, "data", strings_json(s->data, s->n_data));
    json_object_set_new(o, "layers", json_integer(s->layers));
    json_object_set_new(o, "hidden", json_integer(s->hidden));
    json_object_set_new(o, "ended_at", s->ended_at ? json_integer((json_int_t)s->ended_at) : json_null());
    json_object_set_new(o, "wall_s", json_real(s->wall_s));
    json_object_set_new(o, "stop_at_checkpoint", json_boolean(s->stop_at_checkpoint));
    return o;
}

/* A duration as 45s, 12m05s, 3h02m. */
static void fmt_duration(char *out, size_t cap, double s)
{
    long t = (long)(s + 0.5);
    if (t < 60)
        snprintf(out, cap, "%lds", t);
    else if (t < 3600)
        snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(out, cap, "%ldh%02ldm", t / 3600, t % 3600 / 60);
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
    json_t *s, *reps = json_object_get(p, "replicas");
    json_array_foreach(st, i, s) {
        json_t *b = json_array_get(bst, i);
        /* a federation: each replica's balancer numbers its own stages */
        json_t *rv = json_object_get(s, "replica");
        if (json_is_integer(rv)) {
            json_t *rep = json_array_get(reps, (size_t)json_integer_value(rv));
            json_int_t first = json_integer_value(json_object_get(rep, "first_stage"));
            b = json_array_get(json_object_get(json_object_get(rep, "balancer"), "stages"),
                               (size_t)((json_int_t)i - first));
            if ((json_int_t)i == first)
                printf(" replica %lld: owner %s, dataset %s, %lld sequences per step, predicted "
                       "%.3f s per step%s\n", (long long)json_integer_value(rv),
                       json_string_value(json_object_get(rep, "owner")) ?: "?",
                       json_string_value(json_object_get(rep, "dataset")) ?: "?",
                       (long long)json_integer_value(json_object_get(rep, "batch")),
                       json_number_value(json_object_get(rep, "predicted_iteration_s")),
                       json_is_true(json_object_get(rep, "rejoin"))
                           ? " (rejoining from the committed outer step)" : "");
        }
        printf("  stage %zu  units %lld-%lld  device %s (%s)  %s\n", i,
               (long long)json_integer_value(json_object_get(s, "first_unit")),
               (long long)json_integer_value(json_object_get(s, "last_unit")),
               json_string_value(json_object_get(s, "device")),
               json_string_value(json_object_get(b, "site")) ?: "?",
               json_string_value(json_object_get(s, "address")));
    }
    json_array_foreach(reps, i, s)
        if (json_is_true(json_object_get(s, "away")))
            printf(" replica %zu: owner %s away (no stage; the others go on, it rejoins at a "
                   "committed outer step once back)\n", i,
                   json_string_value(json_object_get(s, "owner")) ?: "?");
    json_t *sy = json_object_get(p, "sync");
    if (json_is_number(json_object_get(sy, "predicted_round_s")))
        printf(" sync: a round of %.0f bytes predicted %.3f s (links %.3f s, CPU %.3f s), every "
               "%lld step%s\n", json_number_value(json_object_get(sy, "round_bytes")),
               json_number_value(json_object_get(sy, "predicted_round_s")),
               json_number_value(json_object_get(sy, "round_link_s")),
               json_number_value(json_object_get(sy, "round_cpu_s")),
               (long long)json_integer_value(json_object_get(sy, "every")),
               json_integer_value(json_object_get(sy, "every")) == 1 ? "" : "s");
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
    {"--mask-prob", "mask_prob", 1},   {"--first", "first", 0},   {"--task", "task", 2},
    {"--sequences", "sequences", 0},   {"--no-shuffle", "shuffle", 4},
    {"--recompute", "recompute", 3},   {"--recompute-attention", "recompute_attention", 3},
    {"--no-u-shape", "u_shape", 4},    {"--replan-margin", "replan_margin", 1},
    {"--precision", "precision", 2},   {"--sync", "sync", 2},
    {"--codec-sync", "codec_sync", 2}, {"--outer-lr", "outer_lr", 1},
    {"--outer-momentum", "outer_momentum", 1}, {"--placement", "placement", 2},
    {NULL, NULL, 0},
};

/* --data NAME_OR_ID:DATASET: a device id as it is, a name resolved among
 * the enrolled devices (ListDevices), refused when no device or several
 * have it. out gets ID:DATASET. */
static int resolve_one(client *c, const char *data, char *out, size_t cap, sl_err *err)
{
    const char *colon = strchr(data, ':');
    char who[256];
    snprintf(who, sizeof who, "%.*s", colon ? (int)(colon - data) : 0, data);
    if (!colon || !who[0] || cert_valid_device_id(who)) {
        snprintf(out, cap, "%s", data); /* the coordinator checks the form */
        return 0;
    }
    Skyloom__V1__ListDevicesRequest q = SKYLOOM__V1__LIST_DEVICES_REQUEST__INIT;
    Skyloom__V1__ListDevicesResponse *r = NULL;
    if (call(c, RPC_M_LIST_DEVICES, &q, &skyloom__v1__list_devices_response__descriptor, (void **)&r, err))
        return -1;
    char ids[600] = "";
    int n = 0;
    for (size_t i = 0; i < r->n_devices; i++) {
        const Skyloom__V1__DeviceInfo *d = r->devices[i];
        if (strcmp(d->name, who) || !strcmp(d->state, "revoked"))
            continue;
        if (!n++)
            snprintf(out, cap, "%s%s", d->device_id, colon);
        size_t o = strlen(ids);
        snprintf(ids + o, sizeof ids - o, "%s%s", o ? ", " : "", d->device_id);
    }
    rpc_unpacked_free(r);
    if (n == 1)
        return 0;
    if (n == 0)
        return sl_err_set(err, SL_EINVAL, "--data %s: no enrolled device is named '%s' and it is "
                          "not a device id (skyloom status lists the names and ids)", data, who);
    return sl_err_set(err, SL_EINVAL, "--data %s: %d devices are named '%s' (%s): give the device "
                      "id instead of the name", data, n, who, ids);
}

/* Every owner of "A,B,..." (the --data options joined) resolved. */
static int resolve_data(client *c, const char *data, char *out, size_t cap, sl_err *err)
{
    out[0] = 0;
    char buf[1200];
    snprintf(buf, sizeof buf, "%s", data);
    for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
        char one[400];
        if (resolve_one(c, t, one, sizeof one, err))
            return -1;
        size_t o = strlen(out);
        snprintf(out + o, cap - o, "%s%s", o ? "," : "", one);
    }
    return 0;
}

/* The hash of the vocabulary in vocab.txt `path` (hex). */
static int vocab_file_hash(const char *path, char hex[65], sl_err *err)
{
    dev_vocab *v = dev_vocab_load(path, err);
    if (!v)
        return -1;
    uint8_t h[32];
    dev_vocab_hash(v, h);
    dev_hash_hex(h, hex);
    dev_vocab_free(v);
    return 0;
}

/* An --init model's vocabulary, where one is known: the vocab.txt beside
 * the file (an export's folder, a Hugging Face model's). The safetensors
 * file itself records none. *hex is "" when there is none. */
static int init_vocab_hash(const char *init, char hex[65], sl_err *err)
{
    hex[0] = 0;
    char dir[4200], p[4300];
    snprintf(dir, sizeof dir, "%s", init);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    snprintf(p, sizeof p, "%s/vocab.txt", dir);
    if (access(p, F_OK) != 0)
        return 0;
    return vocab_file_hash(p, hex, err) ? sl_err_wrap(err, "--init %s: the vocab.txt beside it", init)
                                        : 0;
}

static volatile sig_atomic_t submit_interrupted;
static void on_submit_signal(int sig)
{
    (void)sig;
    submit_interrupted = 1;
}

static int submit(client *c, int argc, char **argv)
{
    const char *config = NULL, *init = NULL, *devices = NULL, *owner_batch = NULL, *name = "",
               *vocab = NULL, *vocab_hash = NULL;
    const char *tags[32];
    size_t ntags = 0;
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
        else if (!strcmp(a, "--name"))
            name = v;
        else if (!strcmp(a, "--tag") && ntags == sizeof tags / sizeof tags[0])
            return sl_cli_fail("job", 2, "--tag: at most 16 tags");
        else if (!strcmp(a, "--tag"))
            tags[ntags++] = v;
        else if (!strcmp(a, "--vocab"))
            vocab = v;
        else if (!strcmp(a, "--vocab-hash"))
            vocab_hash = v;
        else if (!strcmp(a, "--data")) {
            /* several: a federation, one replica per owner */
            if (strchr(v, ',') || strlen(data) + strlen(v) + 2 > sizeof data)
                return sl_cli_fail("job", 2, "--data %.80s: one DEVICE:NAME per --data", v);
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
    /* the vocabulary the data must have: --vocab-hash, --vocab's, the one
     * beside --init; two of them that differ are refused */
    char vh[3][65] = {"", "", ""}, init_file[4300] = "", data_id[1200];
    const char *vwhat[3] = {"--vocab-hash", "--vocab", "--init"};
    struct stat sb;
    if (init && !stat(init, &sb) && S_ISDIR(sb.st_mode)) /* an exported folder */
        snprintf(init_file, sizeof init_file, "%s/model.safetensors", init);
    else if (init)
        snprintf(init_file, sizeof init_file, "%s", init);
    if (vocab_hash)
        snprintf(vh[0], sizeof vh[0], "%s", vocab_hash);
    if ((vocab && vocab_file_hash(vocab, vh[1], &err)) || (init && init_vocab_hash(init_file, vh[2], &err)) ||
        resolve_data(c, data, data_id, sizeof data_id, &err)) {
        json_decref(o);
        return sl_cli_fail("job", vocab && !vh[1][0] ? 2 : 1, "%s", err.msg);
    }
    const char *want = "";
    for (int k = 0; k < 3; k++) {
        if (!vh[k][0])
            continue;
        for (int m = 0; m < k; m++)
            if (vh[m][0] && strcmp(vh[m], vh[k])) {
                json_decref(o);
                return sl_cli_fail("job", 2, "%s and %s name two vocabularies (%.16s... and "
                                   "%.16s...)", vwhat[m], vwhat[k], vh[m], vh[k]);
            }
        want = vh[k];
    }
    if (*want)
        json_object_set_new(o, "vocab_hash", json_string(want));
    init = init ? init_file : NULL;
    char *ctext = NULL, upload[UPLOAD_ID_LEN + 1] = "";
    size_t clen = 0;
    dev_config cfg;
    bal_bert bert;
    /* the config by the reader the coordinator and the devices use, its
     * errors naming this file */
    const char *task = json_string_value(json_object_get(o, "task"));
    if (task && dev_task_parse(task) < 0) {
        json_decref(o);
        return sl_cli_fail("job", 2, "--task must be mlm or classify, got '%s'", task);
    }
    if (task && dev_task_parse(task) == DEV_TASK_MLM)
        json_object_del(o, "task"); /* the default: the options say nothing */
    int bad = sl_read_file(config, 1 << 20, &ctext, &clen, &err) ||
              bal_bert_parse(&bert, ctext, config, &err) ||
              ((init || task) && dev_config_parse(&cfg, ctext, &err));
    if (!bad && task) { /* the config must suit the task's head */
        cfg.task = dev_task_parse(task);
        bad = dev_config_validate(&cfg, &err) && sl_err_wrap(&err, "%s: --task %s", config, task);
    }
    if (bad || (init && (dev_ckpt_check_model(&cfg, init, &err) ||
                         upload_init(c, init, upload, &err)))) {
        free(ctext);
        json_decref(o);
        return sl_cli_fail("job", 1, "%s", err.msg);
    }
    char *otext = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    Skyloom__V1__SubmitJobRequest q = SKYLOOM__V1__SUBMIT_JOB_REQUEST__INIT;
    q.config = ctext;
    q.data = data_id;
    q.options = otext;
    q.init_upload = upload;
    q.name = (char *)name;
    q.tags = (char **)tags;
    q.n_tags = ntags;
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
    /* until it runs (or fails): the owner's check, profiles, the plan. An
     * interrupt leaves the job as it is: the coordinator runs it. */
    const char *shown = "";
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_submit_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    for (;;) {
        Skyloom__V1__JobInfo *j = submit_interrupted ? NULL : get_job(c, id, 0, &err);
        if (submit_interrupted) {
            rpc_unpacked_free(j);
            sigaction(SIGINT, &old_int, NULL);
            sigaction(SIGTERM, &old_term, NULL);
            fprintf(stderr, "\njob %s goes on without this command: follow it with `skyloom job "
                    "watch %s`, stop it with `skyloom job stop %s`\n", id, id, id);
            printf("%s\n", id);
            return 130;
        }
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
        printf("%-18s %-16s %-10s %12s %9s %8s %-9s %-24s %-16s %8s  %s\n", "JOB", "NAME",
               "STATE", "STEP", "COMMITTED", "LOSS", "CONFIG", "DATA", "STARTED", "WALL", "REASON");
        for (size_t i = 0; i < r->n_jobs; i++) {
            const Skyloom__V1__JobSummary *s = r->jobs[i];
            char step[32], cfg[32], when[32] = "-", wall[32], data[200] = "";
            snprintf(step, sizeof step, "%u/%u", s->step, s->steps);
            snprintf(cfg, sizeof cfg, "L%u H%u", s->layers, s->hidden);
            time_t t = (time_t)s->created_at;
            struct tm tm;
            if (gmtime_r(&t, &tm))
                strftime(when, sizeof when, "%Y-%m-%d %H:%M", &tm);
            fmt_duration(wall, sizeof wall, s->wall_s);
            for (size_t k = 0; k < s->n_data; k++) {
                size_t o = strlen(data);
                snprintf(data + o, sizeof data - o, "%s%s", k ? "," : "", s->data[k]);
            }
            printf("%-18s %-16s %-10s %12s %9u %8.4f %-9s %-24s %-16s %8s  %s\n", s->job_id,
                   s->name[0] ? s->name : "-", s->state, step, s->committed_step, s->loss, cfg, data,
                   when, wall, s->reason);
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
        json_object_set_new(out, "data_owners", loads_or_null(j->data));
        json_object_set_new(out, "vocab_hash", json_string(j->vocab_hash));
        char *s = json_dumps(out, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(out);
    } else {
        const Skyloom__V1__JobSummary *s = j->summary;
        printf("job %s: %s, step %u of %u, committed %u, loss %.4f%s%s\n", s->job_id, s->state,
               s->step, s->steps, s->committed_step, s->loss, *s->reason ? ", " : "", s->reason);
        if (*s->name || s->n_tags) {
            printf("name %s", *s->name ? s->name : "-");
            for (size_t k = 0; k < s->n_tags; k++)
                printf("%s%s", k ? ", " : "  tags ", s->tags[k]);
            printf("\n");
        }
        json_t *dj = loads_or_null(j->data), *x;
        size_t k;
        json_array_foreach(dj, k, x) {
            printf("data %s:%s", json_string_value(json_object_get(x, "owner")),
                   json_string_value(json_object_get(x, "dataset")));
            if (json_object_get(x, "vocab_hash"))
                printf("  %lld of %lld sequences, %lld tokens each, vocabulary %lld (hash %s)",
                       (long long)json_integer_value(json_object_get(x, "sequences")),
                       (long long)json_integer_value(json_object_get(x, "shard_sequences")),
                       (long long)json_integer_value(json_object_get(x, "seq_len")),
                       (long long)json_integer_value(json_object_get(x, "vocab_size")),
                       json_string_value(json_object_get(x, "vocab_hash")));
            printf("\n");
        }
        json_decref(dj);
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
                json_t *sy = json_object_get(x, "sync");
                if (sy)
                    printf("  sync: %lld B raw, %lld B on the wire",
                           (long long)json_integer_value(json_object_get(sy, "raw_bytes")),
                           (long long)json_integer_value(json_object_get(sy, "wire_bytes")));
                printf("\n");
            }
            json_array_foreach(json_object_get(ls, "replicas"), i, x) {
                json_t *lv = json_object_get(x, "loss");
                printf("  replica %lld  owner %s  loss ", (long long)json_integer_value(json_object_get(x, "replica")),
                       json_string_value(json_object_get(x, "owner")) ?: "?");
                if (json_is_number(lv))
                    printf("%.4f", json_number_value(lv));
                else
                    printf("-");
                printf("  sync: %lld B raw, %lld B on the wire\n",
                       (long long)json_integer_value(json_object_get(x, "sync_raw_bytes")),
                       (long long)json_integer_value(json_object_get(x, "sync_wire_bytes")));
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

/* What job watch shows of the training: the loss smoothed by an EMA of
 * factor WATCH_EMA (the raw loss of one batch jumps), tokens/s and the ETA
 * over the last WATCH_WINDOW steps (one step's time swings). */
#define WATCH_EMA 0.1
#define WATCH_WINDOW 20

typedef struct watch_state {
    double ema, win_s[WATCH_WINDOW], win_tok[WATCH_WINDOW];
    int nwin, n;
} watch_state;

/* "s0 11% s1 46% ..." from a metrics row's "0.11;0.46;..." */
static void busy_labels(const char *busy, int tty, char *out, size_t cap)
{
    out[0] = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", busy);
    int i = 0;
    for (char *sv = NULL, *t = strtok_r(buf, ";", &sv); t; t = strtok_r(NULL, ";", &sv), i++) {
        size_t o = strlen(out);
        if (tty)
            snprintf(out + o, cap - o, "%ss%d %.0f%%", i ? " " : "", i, 100 * atof(t));
        else
            snprintf(out + o, cap - o, "%ss%d:%.2f", i ? "," : "", i, atof(t));
    }
}

/* A federation's plan: a line per replica (its owner, dataset, stages and
 * their devices), once per plan epoch (*shown: the epoch shown last). */
static void watch_replicas(const char *plan_text, int tty, json_int_t *shown)
{
    json_error_t je;
    json_t *p = *plan_text ? json_loads(plan_text, 0, &je) : NULL;
    json_t *reps = json_object_get(p, "replicas"), *st = json_object_get(p, "stages"), *x;
    json_int_t epoch = json_integer_value(json_object_get(p, "epoch"));
    size_t r;
    if (!p || epoch == *shown || json_array_size(reps) < 2) {
        json_decref(p);
        return;
    }
    *shown = epoch;
    json_array_foreach(reps, r, x) {
        json_int_t first = json_integer_value(json_object_get(x, "first_stage")),
                   n = json_integer_value(json_object_get(x, "stages"));
        char devs[512] = "";
        for (json_int_t i = first; i >= 0 && i < first + n && (size_t)i < json_array_size(st); i++) {
            const char *d = json_string_value(json_object_get(json_array_get(st, (size_t)i), "device"));
            size_t o = strlen(devs);
            snprintf(devs + o, sizeof devs - o, "%s%s", i > first ? "," : "", d ? d : "?");
        }
        const char *owner = json_string_value(json_object_get(x, "owner")),
                   *ds = json_string_value(json_object_get(x, "dataset"));
        if (tty)
            printf("\r\033[Kreplica %zu  owner %s  dataset %s  stages %lld-%lld  devices %s\n", r,
                   owner ?: "?", ds ?: "?", (long long)first, (long long)(first + n - 1), devs);
        else
            printf("replica=%zu owner=%s dataset=%s stages=%lld-%lld devices=%s epoch=%lld\n", r,
                   owner ?: "?", ds ?: "?", (long long)first, (long long)(first + n - 1), devs,
                   (long long)epoch);
    }
    json_decref(p);
}

/* A metrics row's last columns (replica_loss, sync_raw_bytes,
 * sync_wire_bytes), as job watch shows them: "" for a job of one owner. */
static void watch_sync(const char *row, int tty, char *out, size_t cap)
{
    out[0] = 0;
    const char *f[18];
    int n = 0;
    for (const char *c = row; n < 18; c++) {
        f[n++] = c;
        if (!(c = strchr(c, ',')))
            break;
    }
    if (n < 18 || f[15][0] == ',')
        return;
    unsigned long long raw = strtoull(f[16], NULL, 10), wire = strtoull(f[17], NULL, 10);
    size_t o = (size_t)snprintf(out, cap, tty ? "  replicas" : " replica_loss=");
    int r = 0;
    for (const char *c = f[15]; o < cap && *c && *c != ','; r++) {
        double v = strtod(c, NULL);
        o += (size_t)snprintf(out + o, cap - o, "%sr%d%s%.4f", tty ? " " : r ? "," : "", r,
                              tty ? " " : ":", v);
        const char *semi = strpbrk(c, ";,");
        if (!semi || *semi == ',')
            break;
        c = semi + 1;
    }
    if (o < cap)
        snprintf(out + o, cap - o, tty ? "  sync %llu B (%llu on the wire)" : " sync_raw=%llu sync_wire=%llu",
                 raw, wire);
}

/* The phase a job is in before (and between) its epochs, in words. */
static void phase_text(const Skyloom__V1__JobInfo *j, char *out, size_t cap)
{
    const Skyloom__V1__JobSummary *s = j->summary;
    json_t *data = loads_or_null(j->data), *prof = loads_or_null(j->profiles);
    json_t *o = json_array_get(data, 0);
    const char *owner = json_string_value(json_object_get(o, "owner")),
               *ds = json_string_value(json_object_get(o, "dataset"));
    if (!strcmp(s->state, "checking"))
        snprintf(out, cap, "checking: the data owner %s checks its dataset %s", owner ? owner : "?",
                 ds ? ds : "?");
    else if (!strcmp(s->state, "profiling"))
        snprintf(out, cap, "profiling: the candidate devices measure their links and units (%zu "
                 "measured)", json_object_size(prof));
    else if (!strcmp(s->state, "planning"))
        snprintf(out, cap, "planning: the balancer places the layers on %zu measured devices",
                 json_object_size(prof));
    else
        snprintf(out, cap, "%s%s%s", s->state, *s->reason ? ": " : "", s->reason);
    json_decref(data);
    json_decref(prof);
}

static int watch(client *c, const char *id)
{
    int tty = sl_cli_stdout_is_tty();
    uint32_t next = 1;
    size_t nev = (size_t)-1; /* events already shown (-1: none looked at yet) */
    watch_state w = {0};
    char last_phase[700] = "";
    json_int_t plan_shown = -1;
    sl_err err = {0};
    if (!tty)
        printf("# loss_ema: exponential moving average of the loss, factor %.2f; tokens_per_s and "
               "eta_s over the last %d steps; wall_s since the submit; several data owners: "
               "replica_loss each replica's own, sync_raw and sync_wire the step's sync bytes "
               "(payloads, frames)\n", WATCH_EMA, WATCH_WINDOW);
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
                printf("\r\033[K");
            print_event(e);
            if (!strcmp(json_string_value(json_object_get(e, "kind")) ?: "", "planned"))
                next = (uint32_t)json_integer_value(json_object_get(e, "committed_step")) + 1;
        }
        nev = json_array_size(ev);
        json_decref(ev);
        /* before (and between) epochs: the phase, rewritten in place on a terminal */
        if (strcmp(s->state, "running") && !ended(s->state)) {
            char ph[600];
            phase_text(j, ph, sizeof ph);
            if (tty)
                printf("\r\033[Kjob %s  %s  (%.0f s since submit)", id, ph, s->wall_s);
            else if (strcmp(ph, last_phase))
                printf("phase=%s wall_s=%.0f\n", ph, s->wall_s);
            snprintf(last_phase, sizeof last_phase, "%s", ph);
        }
        if (!strcmp(s->state, "running"))
            watch_replicas(j->plan, tty, &plan_shown);
        /* rows: step,epoch,loss,masked,grad_norm,lr,step_s,tokens_per_s,stage_busy,... */
        for (char *line = j->metrics, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (nl)
                *nl = 0;
            int step, epoch;
            double loss, gn, lr, step_s, tok;
            unsigned masked;
            char busy[256] = "", lb[512], sy[256];
            watch_sync(line, tty, sy, sizeof sy);
            if (sscanf(line, "%d,%d,%lf,%u,%lf,%lf,%lf,%lf,%255[^,]", &step, &epoch, &loss, &masked,
                       &gn, &lr, &step_s, &tok, busy) < 8)
                continue;
            w.ema = w.n++ ? (1 - WATCH_EMA) * w.ema + WATCH_EMA * loss : loss;
            w.win_s[w.nwin % WATCH_WINDOW] = step_s;
            w.win_tok[w.nwin % WATCH_WINDOW] = step_s * tok; /* tokens of the step */
            w.nwin++;
            double sum_s = 0, sum_tok = 0;
            int k = w.nwin < WATCH_WINDOW ? w.nwin : WATCH_WINDOW;
            for (int i = 0; i < k; i++) {
                sum_s += w.win_s[i];
                sum_tok += w.win_tok[i];
            }
            double mean_s = sum_s / k, tps = sum_s > 0 ? sum_tok / sum_s : 0;
            double eta = mean_s * (double)(s->steps > (uint32_t)step ? s->steps - (uint32_t)step : 0);
            busy_labels(busy, tty, lb, sizeof lb);
            if (tty)
                printf("\r\033[Kstep %d/%u  committed %u  loss %.4f (ema %.4f)  %.0f tok/s  ETA %.0f s"
                       "  wall %.0f s  busy %s%s", step, s->steps, s->committed_step, loss, w.ema, tps,
                       eta, s->wall_s, lb, sy);
            else
                printf("step=%d loss=%.4f loss_ema=%.4f tokens_per_s=%.0f eta_s=%.0f committed=%u "
                       "wall_s=%.0f busy=%s%s\n", step, loss, w.ema, tps, eta, s->committed_step,
                       s->wall_s, lb, sy);
            next = (uint32_t)step + 1;
        }
        fflush(stdout);
        if (ended(s->state)) {
            if (tty)
                printf("\n");
            printf("job %s %s after %.0f s (from its submit), committed step %u%s%s\n", id, s->state,
                   s->wall_s, s->committed_step, *s->reason ? ": " : "", s->reason);
            int rc = !strcmp(s->state, "done") ? 0 : 1;
            rpc_unpacked_free(j);
            return rc;
        }
        rpc_unpacked_free(j);
        usleep(500 * 1000);
    }
}

static int stop(client *c, const char *id, int at_checkpoint)
{
    Skyloom__V1__StopJobRequest q = SKYLOOM__V1__STOP_JOB_REQUEST__INIT;
    q.job_id = (char *)id;
    q.at_checkpoint = at_checkpoint;
    Skyloom__V1__StopJobResponse *r = NULL;
    sl_err err = {0};
    if (call(c, RPC_M_STOP_JOB, &q, &skyloom__v1__stop_job_response__descriptor, (void **)&r, &err))
        return sl_cli_fail("job", 1, "%s", err.msg);
    if (at_checkpoint && strcmp(r->state, "stopped"))
        printf("job %s stops at its next commit (it is %s; `skyloom job watch %s` follows it)\n", id,
               r->state, id);
    else
        printf("job %s stopped\n", id);
    rpc_unpacked_free(r);
    return 0;
}

static int resume(client *c, const char *id)
{
    Skyloom__V1__ResumeJobRequest q = SKYLOOM__V1__RESUME_JOB_REQUEST__INIT;
    q.job_id = (char *)id;
    Skyloom__V1__ResumeJobResponse *r = NULL;
    sl_err err = {0};
    if (call(c, RPC_M_RESUME_JOB, &q, &skyloom__v1__resume_job_response__descriptor, (void **)&r, &err))
        return sl_cli_fail("job", 1, "%s", err.msg);
    printf("job %s resumes from step %u (committed), as epoch %u\n", id, r->from_step + 1,
           r->epoch + 1);
    rpc_unpacked_free(r);
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

/* Fetches a committed file into dirfd/name (a name sl_path_name_check
 * accepted, in a directory sl_dir_open checked). */
static int fetch(client *c, const char *id, int step, const char *name, int dirfd, sl_err *err)
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

static int write_json(const char *dir, const char *name, json_t *o, sl_err *err)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *t = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (!t)
        return sl_err_set(err, SL_ENOMEM, "%s: cannot encode JSON", name);
    size_t n = strlen(t);
    char *b = sl_xmalloc(n + 2);
    memcpy(b, t, n);
    b[n] = '\n';
    free(t);
    int rc = sl_write_file_atomic(p, b, n + 1, err);
    free(b);
    return rc;
}

/* config.json of the export: a classifier's classes named by the data
 * owner's labels where its check gave them (the names skyloom train's
 * checkpoint gives them), else the config's (LABEL_0, LABEL_1, ... without
 * id2label). */
static int export_config(const dev_config *cfg, const json_t *data, const char *out, sl_err *err)
{
    dev_config c = *cfg;
    const json_t *names = json_object_get(json_array_get(data, 0), "labels");
    int n = (int)json_array_size(names);
    const char **v = n ? sl_xcalloc((size_t)n, sizeof *v) : NULL;
    for (int i = 0; i < n; i++)
        v[i] = json_string_value(json_array_get(names, (size_t)i));
    dev_labels *l = c.task == DEV_TASK_CLASSIFY && n == c.num_labels
                        ? dev_labels_from(v, n, 0, "the data owner's labels", err)
                        : NULL;
    free(v);
    if (c.task == DEV_TASK_CLASSIFY && n == c.num_labels && !l)
        return -1;
    if (l)
        c.label_names = dev_labels_names(l);
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", out);
    int rc = dev_config_save(&c, p, err);
    dev_labels_free(l);
    return rc;
}

/* Beside the model: config.json (export_config), the vocabulary its data
 * was built with (vocab.txt) and a tokenizer config for it, so that
 * BertTokenizer and fill-mask load the folder as it is, and training.json:
 * how it was trained (the options, the data and vocabulary hashes, the
 * step, Skyloom's version). `files` gets the names written after
 * config.json, for the message. */
static int export_extras(client *c, const char *id, int step, const dev_config *cfg, const char *out,
                         char *files, size_t cap, sl_err *err)
{
    files[0] = 0;
    Skyloom__V1__GetJobRequest q = SKYLOOM__V1__GET_JOB_REQUEST__INIT;
    q.job_id = (char *)id;
    q.vocab = 1;
    Skyloom__V1__JobInfo *j = NULL;
    if (call(c, RPC_M_GET_JOB, &q, &skyloom__v1__job_info__descriptor, (void **)&j, err))
        return -1;
    json_t *data = loads_or_null(j->data);
    int cased = json_is_true(json_object_get(json_array_get(data, 0), "cased"));
    int rc = export_config(cfg, data, out, err);
    if (*j->vocab) {
        char p[4400];
        snprintf(p, sizeof p, "%s/vocab.txt", out);
        rc = sl_write_file_atomic(p, j->vocab, strlen(j->vocab), err);
        json_t *tc = json_pack("{s:s, s:b, s:i, s:s, s:s, s:s, s:s, s:s, s:b, s:n}", "tokenizer_class",
                               "BertTokenizer", "do_lower_case", !cased, "model_max_length",
                               cfg->max_pos, "unk_token", "[UNK]", "sep_token", "[SEP]", "pad_token",
                               "[PAD]", "cls_token", "[CLS]", "mask_token", "[MASK]",
                               "tokenize_chinese_chars", 1, "strip_accents");
        json_t *sm = json_pack("{s:s, s:s, s:s, s:s, s:s}", "unk_token", "[UNK]", "sep_token", "[SEP]",
                               "pad_token", "[PAD]", "cls_token", "[CLS]", "mask_token", "[MASK]");
        rc = rc || write_json(out, "tokenizer_config.json", tc, err) ||
             write_json(out, "special_tokens_map.json", sm, err);
        snprintf(files, cap, ", vocab.txt, tokenizer_config.json, special_tokens_map.json");
    } else {
        fprintf(stderr, "skyloom job: job %s: the data owner sent no vocabulary (it sends one up to "
                "768 KiB): no vocab.txt written\n", id);
    }
    const Skyloom__V1__JobSummary *s = j->summary;
    json_t *tags = json_array();
    for (size_t k = 0; k < s->n_tags; k++)
        json_array_append_new(tags, json_string(s->tags[k]));
    json_t *tr = json_pack("{s:s, s:s, s:s, s:o, s:i, s:i, s:o, s:o, s:s, s:I, s:s}", "skyloom_version",
                           SKYLOOM_VERSION, "job_id", s->job_id, "name", s->name, "tags", tags,
                           "step", step, "steps", (int)s->steps, "options", loads_or_null(j->options),
                           "data", data, "vocab_hash", j->vocab_hash, "created_at",
                           (json_int_t)s->created_at, "format",
                           "model.safetensors holds every tensor by its Hugging Face BERT name");
    rc = rc || write_json(out, "training.json", tr, err);
    if (!rc)
        snprintf(files + strlen(files), cap - strlen(files), ", training.json");
    rpc_unpacked_free(j);
    return rc;
}

/* The committed step's parts, assembled into one model.safetensors (a stage
 * of the whole model loads every part; any cut loads from any cut). */
static int export_job(client *c, const char *id, const char *out)
{
    sl_err err = {0};
    if (sl_path_name_check(id, strlen(id), &err))
        return sl_cli_fail("job", 2, "export: job id: %s", err.msg);
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
    /* the coordinator's file names become paths: every one must be a plain
     * name before anything is written */
    for (size_t i = 0; i < r->n_names; i++)
        if (sl_path_name_check(r->names[i], strlen(r->names[i]), &err)) {
            sl_err_wrap(&err, "the coordinator lists a file of job %s", id);
            rpc_unpacked_free(r);
            return sl_cli_fail("job", 1, "export: %s", err.msg);
        }
    char tmp[4200], sub[300];
    snprintf(sub, sizeof sub, ".export-%s", id);
    snprintf(tmp, sizeof tmp, "%s/%s", out, sub);
    dev_stage *s = NULL;
    dev_config cfg;
    char **names = NULL;
    int nnames = 0;
    /* the files wait in OUT/.export-JOB: not a link, not another user's (OUT
     * may be a shared directory such as /tmp) */
    int ofd = -1, tfd = -1;
    if ((ofd = sl_dir_open(AT_FDCWD, out, 0755, SL_DIR_CREATE, &err)) < 0 ||
        (tfd = sl_dir_open(ofd, sub, 0700, SL_DIR_CREATE, &err)) < 0)
        goto fail;
    for (size_t i = 0; i < r->n_names; i++)
        if (fetch(c, id, step, r->names[i], tfd, &err))
            goto fail;
    char p[4400], m[4400];
    snprintf(p, sizeof p, "%s/config.json", tmp);
    int task = dev_ckpt_task(tmp, &err);
    if (task < 0 || dev_config_load(&cfg, p, &err))
        goto fail;
    /* a classification job's: its head, and config.json as BertForSequenceClassification's */
    cfg.task = task;
    if (task == DEV_TASK_CLASSIFY &&
        (dev_config_validate(&cfg, &err) || dev_config_load_names(p, &names, &nnames, &err)))
        goto fail;
    cfg.label_names = (const char *const *)names;
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
    char files[200];
    if (dev_ckpt_save_model(s, m, &err) ||
        export_extras(c, id, step, &cfg, out, files, sizeof files, &err))
        goto fail;
    printf("job %s: step %d exported to %s (model.safetensors, config.json%s)\n", id, step, out, files);
    status = 0;
fail:
    if (status)
        sl_cli_fail("job", 1, "export: %s", err.msg);
    dev_stage_free(s);
    dev_config_free_names(names, nnames);
    if (tfd >= 0) {
        for (size_t i = 0; i < r->n_names; i++)
            unlinkat(tfd, r->names[i], 0);
        close(tfd);
        unlinkat(ofd, sub, AT_REMOVEDIR);
    }
    if (ofd >= 0)
        close(ofd);
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
                           "resume, export, trace, metrics, compare)", sub);
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_of(jc);
            return 0;
        }
    int is_submit = !strcmp(sub, "submit"), is_compare = !strcmp(sub, "compare");
    int takes_id = strcmp(sub, "list") && !is_submit && !is_compare;
    int takes_svg = !strcmp(sub, "trace") || is_compare;
    const char *target = NULL, *pki = NULL, *out = NULL, *svg = NULL;
    int json = 0, at_checkpoint = 0;
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
        } else if (!strcmp(a, "--at-checkpoint") && !strcmp(sub, "stop")) {
            at_checkpoint = 1;
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
            rc = stop(&c, id, at_checkpoint);
        else if (!strcmp(sub, "resume"))
            rc = resume(&c, id);
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
