/* coord_jobs_files.c - the job manager's calls about checkpoint files:
 * a device's upload of the parts it wrote (UploadInit, UploadChunk) and
 * FetchFile, which gives a device only the committed files of its own
 * units, replica and data record. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
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
    char *mp = coord_path_of(dir, "manifest.json"), *text = NULL;
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
    char why[300], *p = coord_path_of(dir, name);
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
        /* a replica back from away has no parts of the step it starts
         * after: it takes the lowest present replica's (the same model at
         * an outer step; docs/federation.md) */
        if (rep >= 0 && sm->plan.rejoin[rep] && step == sm->plan.start_step - 1)
            rep = coord_job_rejoin_source(sm);
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
        char *p = coord_path_of(dir, r->name);
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
        coord_call_reply(k, &out);
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
    return coord_call_reply(k, &o);
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
    uint32_t away = 0;
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
        for (int r = 0; r < jb->sm.plan.nrep; r++)
            away |= (uint32_t)(jb->sm.plan.away[r] != 0) << r;
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
        return coord_call_reply(k, &o);
    }
    char why[4400] = "";
    int complete = 0;
    /* at most 4 checkpoint steps' parts of the whole model (weights and two
     * moments, in a federation also its sync state: the outer parameters,
     * their momentum and the error-feedback residual; and slack for
     * headers) per device and per job */
    uint64_t quota = 4 * ((nrep > 1 ? 6 : 3) * jb->model_bytes + (4u << 20));
    coord_ckpt_set_model(jb->ck, nunits, quota, quota * (uint64_t)nrep);
    coord_ckpt_set_replicas(jb->ck, nrep, away);
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
    coord_call_settle(j, jb, &fx);
    if (code != RPC_OK)
        return code;
    pthread_mutex_lock(&j->mu);
    o.committed = jb->sm.committed >= (int)r->step;
    pthread_mutex_unlock(&j->mu);
    return coord_call_reply(k, &o);
}
HANDLER(coord_handle_upload_chunk, "UploadChunkRequest", skyloom__v1__upload_chunk_request__descriptor,
        COORD_ALLOW_DEVICE, 0, COORD_MEMBER_CAND | COORD_MEMBER_STAGE, upload_chunk)

