/* coord_ckpt.c - a job's checkpoint store (coord_ckpt.h). */
#include "coord_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coord_obs.h"
#include "sl_buf.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

typedef struct part {
    char name[96];
    uint64_t size;
    crypto_generichash_state hash; /* of the pieces written so far, in order */
    uint8_t sum[32];               /* checked when the last piece arrived */
    int done;
    int kind;                      /* PART_* */
    int replica;                   /* its uploader's replica */
    uint8_t *units;                /* [nunits]: the units its tensors are of (done) */
} part;

enum { PART_MODEL, PART_OPTIM, PART_DATA, PART_FED };

/* One device's parts of one step. */
typedef struct slot {
    char device[COORD_DEV_ID_LEN];
    int step;
    part *parts;
    int n;
    uint64_t bytes;
} slot;

struct coord_ckpt {
    char *dir;
    coord_fileops ops;
    slot *slots; /* in the order their first piece came */
    int nslots;
    int nunits;  /* the model's units (0 until set) */
    int nrep;    /* replicas whose parts make a step (1 unless set) */
    uint32_t away; /* bit r: replica r's owner is away, it has no parts */
    uint64_t quota_device, quota_job;
};

/* ---- the file operations --------------------------------------------------------- */

static int sys_open(void *ud, const char *path, int flags, unsigned mode)
{
    (void)ud;
    return open(path, flags, (mode_t)mode);
}

static long sys_pwrite(void *ud, int fd, const void *buf, size_t n, int64_t off)
{
    (void)ud;
    return (long)pwrite(fd, buf, n, (off_t)off);
}

static int sys_fsync(void *ud, int fd)
{
    (void)ud;
    return fsync(fd);
}

static int sys_rename(void *ud, const char *from, const char *to)
{
    (void)ud;
    return rename(from, to);
}

static int write_all(coord_ckpt *k, int fd, const void *p, size_t n, int64_t off)
{
    const unsigned char *b = p;
    while (n > 0) {
        long w = k->ops.pwrite(k->ops.ud, fd, b, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;
            return -1;
        }
        b += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* A whole file written as sl_write_file_atomic does (a temporary file,
 * fsync, rename, the directory's fsync), through the store's operations. */
static int write_atomic(coord_ckpt *k, const char *path, const void *p, size_t n, sl_err *err)
{
    size_t len = strlen(path) + 32;
    char *tmp = sl_xmalloc(len);
    snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    int fd = k->ops.open(k->ops.ud, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    int e = 0;
    if (fd < 0) {
        sl_err_set(err, SL_EIO, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    if (write_all(k, fd, p, n, 0) || k->ops.fsync(k->ops.ud, fd))
        e = errno;
    if (close(fd) && !e)
        e = errno;
    if (!e && k->ops.rename(k->ops.ud, tmp, path))
        e = errno;
    if (e) {
        sl_err_set(err, SL_EIO, "writing %s: %s", path, strerror(e));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    char *d = sl_xstrdup(path), *slash = strrchr(d, '/');
    if (slash)
        *slash = 0;
    int dfd = open(slash ? d : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)k->ops.fsync(k->ops.ud, dfd);
        close(dfd);
    }
    free(d);
    return 0;
}

/* ---- the store --------------------------------------------------------------------- */

static char *path_of(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

void coord_ckpt_set_ops(coord_ckpt *k, const coord_fileops *ops)
{
    k->ops = ops ? *ops : (coord_fileops){0};
    if (!k->ops.open)
        k->ops.open = sys_open;
    if (!k->ops.pwrite)
        k->ops.pwrite = sys_pwrite;
    if (!k->ops.fsync)
        k->ops.fsync = sys_fsync;
    if (!k->ops.rename)
        k->ops.rename = sys_rename;
}

coord_ckpt *coord_ckpt_new(const char *dir, const coord_fileops *ops)
{
    coord_ckpt *k = sl_xcalloc(1, sizeof *k);
    k->dir = sl_xstrdup(dir);
    coord_ckpt_set_ops(k, ops);
    return k;
}

static void slot_free(slot *u)
{
    for (int i = 0; i < u->n; i++)
        free(u->parts[i].units);
    free(u->parts);
}

/* Drops slot i (its files stay where they are). */
static void slot_drop(coord_ckpt *k, int i)
{
    slot_free(&k->slots[i]);
    memmove(&k->slots[i], &k->slots[i + 1], (size_t)(k->nslots - i - 1) * sizeof *k->slots);
    k->nslots--;
}

void coord_ckpt_free(coord_ckpt *k)
{
    if (!k)
        return;
    while (k->nslots)
        slot_drop(k, k->nslots - 1);
    free(k->slots);
    free(k->dir);
    free(k);
}

void coord_ckpt_set_replicas(coord_ckpt *k, int nrep, uint32_t away)
{
    k->nrep = nrep;
    k->away = away;
}

void coord_ckpt_set_model(coord_ckpt *k, int nunits, uint64_t quota_device, uint64_t quota_job)
{
    k->nunits = nunits;
    k->quota_device = quota_device;
    k->quota_job = quota_job;
}

const char *coord_ckpt_dir(const coord_ckpt *k) { return k->dir; }

char *coord_ckpt_step_dir(const coord_ckpt *k, int step, int partial)
{
    char sub[64];
    snprintf(sub, sizeof sub, "ckpt/step-%d%s", step, partial ? ".partial" : "");
    return path_of(k->dir, sub);
}

int coord_ckpt_servable(const char *name)
{
    return coord_part_name_ok(name) || !strcmp(name, "manifest.json") ||
           !strcmp(name, "config.json") || !strcmp(name, "model.safetensors");
}

/* Removes a directory of files (checkpoint directories hold no subdirectories). */
static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *f = path_of(dir, e->d_name);
        unlink(f);
        free(f);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* ---- parts ------------------------------------------------------------------------- */

int coord_tensor_unit(const char *name, int layers)
{
    int l;
    char rest[8];
    /* a federation's sync state: "outer." or "replica.R." before the name */
    if (!strncmp(name, "outer.", 6))
        name += 6;
    else if (!strncmp(name, "replica.", 8) && name[8] >= '0' && name[8] <= '9') {
        const char *d = name + 8;
        while (*d >= '0' && *d <= '9')
            d++;
        if (*d != '.' || d - (name + 8) > 2)
            return -1;
        name = d + 1;
    }
    if (!strncmp(name, "bert.embeddings.", 16))
        return 0;
    if (sscanf(name, "bert.encoder.layer.%d.%1s", &l, rest) == 2)
        return l >= 0 && l < layers ? l + 1 : -1;
    if (!strncmp(name, "cls.", 4) || !strncmp(name, "bert.pooler.", 12) ||
        !strncmp(name, "classifier.", 11))
        return layers + 1;
    return -1;
}

int coord_ckpt_file_units(const char *path, int nunits, uint8_t *units, char *why, size_t cap)
{
    memset(units, 0, (size_t)nunits);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    uint8_t len8[8];
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) || pread(fd, len8, 8, 0) != 8) {
        snprintf(why, cap, "%s: %s", path, fd < 0 ? strerror(errno) : "not a safetensors file");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | len8[i];
    if (n < 2 || n > (16u << 20) || n > (uint64_t)sb.st_size - 8) {
        close(fd);
        snprintf(why, cap, "%s: not a safetensors file (header of %llu bytes)", path,
                 (unsigned long long)n);
        return -1;
    }
    char *hdr = sl_xmalloc(n + 1);
    int rc = pread(fd, hdr, n, 8) == (ssize_t)n ? 0 : -1;
    close(fd);
    json_error_t je;
    json_t *h = rc ? NULL : json_loadb(hdr, n, 0, &je);
    free(hdr);
    if (!json_is_object(h)) {
        json_decref(h);
        snprintf(why, cap, "%s: not a safetensors file (its header is not a JSON object)", path);
        return -1;
    }
    const char *name;
    json_t *v;
    json_object_foreach(h, name, v) {
        if (!strcmp(name, "__metadata__"))
            continue;
        int u = coord_tensor_unit(name, nunits - 2);
        if (u < 0 || u >= nunits) {
            snprintf(why, cap, "%s: tensor '%.100s' is of no unit of this model", path, name);
            rc = -1;
            break;
        }
        units[u] = 1;
    }
    json_decref(h);
    return rc;
}

static slot *slot_find(coord_ckpt *k, const char *device, int step)
{
    for (int i = 0; i < k->nslots; i++)
        if (k->slots[i].step == step && !strcmp(k->slots[i].device, device))
            return &k->slots[i];
    return NULL;
}

static part *part_of(const slot *u, const char *name)
{
    for (int i = 0; u && i < u->n; i++)
        if (!strcmp(u->parts[i].name, name))
            return &u->parts[i];
    return NULL;
}

uint64_t coord_ckpt_part_size(const coord_ckpt *k, const char *device, int step, const char *name)
{
    const part *pt = part_of(slot_find((coord_ckpt *)k, device, step), name);
    return pt ? pt->size : 0;
}

/* Whether step's parts, of every device, cover every unit in a model and an
 * optimizer file, and hold the data record: for every replica. */
static int step_complete(const coord_ckpt *k, int step)
{
    if (!k->nunits)
        return 0;
    int nrep = k->nrep > 0 ? k->nrep : 1;
    size_t per = 2 * (size_t)k->nunits;
    uint8_t *cov = sl_xcalloc(per * (size_t)nrep, 1), *data = sl_xcalloc((size_t)nrep, 1);
    int all = 1;
    for (int i = 0; i < k->nslots; i++) {
        const slot *u = &k->slots[i];
        for (int q = 0; u->step == step && q < u->n; q++) {
            const part *pt = &u->parts[q];
            /* a federation's sync state (fed parts) comes beside the model and
             * optimizer files of the same units; it covers nothing itself */
            if (!pt->done || pt->replica < 0 || pt->replica >= nrep || pt->kind == PART_FED)
                continue;
            data[pt->replica] |= pt->kind == PART_DATA;
            for (int x = 0; pt->units && x < k->nunits; x++)
                cov[per * (size_t)pt->replica + (pt->kind == PART_OPTIM) * (size_t)k->nunits + (size_t)x] |=
                    pt->units[x];
        }
    }
    for (size_t x = 0; x < per * (size_t)nrep; x++)
        all &= cov[x] || (k->away >> (x / per) & 1);
    for (int r = 0; r < nrep; r++)
        all &= data[r] || (k->away >> r & 1);
    free(cov);
    free(data);
    return all;
}

#define SLOTS_PER_DEVICE 4 /* a device's checkpoint steps under way at once */

int coord_ckpt_piece(coord_ckpt *k, const coord_piece *q, int *complete, char *why, size_t cap)
{
    *complete = 0;
    slot *u = slot_find(k, q->device, q->step);
    part *pt = part_of(u, q->name);
    if (!u && q->offset == 0) {
        int mine = 0;
        for (int i = 0; i < k->nslots; i++)
            mine += !strcmp(k->slots[i].device, q->device);
        if (mine >= SLOTS_PER_DEVICE) {
            snprintf(why, cap, "device %s has the parts of %d steps under way already", q->device,
                     mine);
            return COORD_PIECE_QUOTA;
        }
        k->slots = sl_xrealloc(k->slots, (size_t)(k->nslots + 1) * sizeof *k->slots);
        u = &k->slots[k->nslots++];
        memset(u, 0, sizeof *u);
        snprintf(u->device, sizeof u->device, "%s", q->device);
        u->step = q->step;
    }
    if (u && !pt && q->offset == 0) {
        u->parts = sl_xrealloc(u->parts, (size_t)(u->n + 1) * sizeof *u->parts);
        pt = &u->parts[u->n++];
        memset(pt, 0, sizeof *pt);
        memcpy(pt->name, q->name, strnlen(q->name, sizeof pt->name - 1));
        pt->kind = !strncmp(q->name, "data.", 5)    ? PART_DATA
                   : !strncmp(q->name, "optim.", 6) ? PART_OPTIM
                   : !strncmp(q->name, "fed.", 4)   ? PART_FED
                                                    : PART_MODEL;
        pt->replica = q->replica;
    }
    if (!pt || pt->done || q->offset != pt->size || q->offset + q->len > COORD_MAX_FILE) {
        snprintf(why, cap, "%s: chunk at %llu, expected %llu", q->name, (unsigned long long)q->offset,
                 (unsigned long long)(pt ? pt->size : 0));
        return COORD_PIECE_RANGE;
    }
    uint64_t job_bytes = 0;
    for (int i = 0; i < k->nslots; i++)
        job_bytes += k->slots[i].bytes;
    uint64_t dev_bytes = 0;
    for (int i = 0; i < k->nslots; i++)
        if (!strcmp(k->slots[i].device, q->device))
            dev_bytes += k->slots[i].bytes;
    if ((k->quota_device && dev_bytes + q->len > k->quota_device) ||
        (k->quota_job && job_bytes + q->len > k->quota_job)) {
        snprintf(why, cap, "%s of step %d: past the %s's share of the checkpoint store (%llu bytes)",
                 q->name, q->step, k->quota_device && dev_bytes + q->len > k->quota_device ? "device" : "job",
                 (unsigned long long)(k->quota_device && dev_bytes + q->len > k->quota_device
                                          ? k->quota_device : k->quota_job));
        return COORD_PIECE_QUOTA;
    }
    sl_err err = {0};
    char *dir = coord_ckpt_step_dir(k, q->step, 1), *ck = path_of(k->dir, "ckpt");
    int rc = COORD_PIECE_OK;
    if (sl_mkdir(ck, 0700, &err) || sl_mkdir(dir, 0700, &err)) {
        snprintf(why, cap, "%s", err.msg);
        rc = COORD_PIECE_STORE;
    }
    char *p = path_of(dir, q->name);
    int fd = rc ? -1 : k->ops.open(k->ops.ud, p, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW |
                                                     (q->offset ? 0 : O_TRUNC), 0600);
    if (!rc && (fd < 0 || write_all(k, fd, q->data, q->len, (int64_t)q->offset) ||
                (q->last && k->ops.fsync(k->ops.ud, fd)))) {
        snprintf(why, cap, "%s: %s", p, strerror(errno));
        rc = COORD_PIECE_STORE;
    } else if (!rc) {
        /* hashed as it arrives (pieces come in order: offset == size), so the
         * last piece needs no read of the whole file */
        if (q->offset == 0)
            crypto_generichash_init(&pt->hash, NULL, 0, sizeof pt->sum);
        crypto_generichash_update(&pt->hash, q->data, q->len);
        pt->size += q->len;
        u->bytes += q->len;
    }
    if (fd >= 0)
        close(fd);
    if (!rc && q->last) {
        int bad = q->size != pt->size || q->sum_len != 32;
        if (!bad) {
            crypto_generichash_final(&pt->hash, pt->sum, sizeof pt->sum);
            bad = sodium_memcmp(pt->sum, q->sum, 32) != 0;
        }
        if (bad) {
            snprintf(why, cap, "%s of step %d arrived damaged (size or checksum differs); send it "
                     "again", q->name, q->step);
            rc = COORD_PIECE_DAMAGED;
        } else if (pt->kind != PART_DATA) {
            /* a part holds only tensors of units its device runs */
            pt->units = sl_xcalloc((size_t)(k->nunits ? k->nunits : 1), 1);
            char whom[600];
            if (!k->nunits || coord_ckpt_file_units(p, k->nunits, pt->units, whom, sizeof whom)) {
                snprintf(why, cap, "%s of step %d refused: %s", q->name, q->step,
                         k->nunits ? whom : "the model is not known");
                rc = COORD_PIECE_REFUSED;
            }
            for (int x = 0; !rc && x < k->nunits; x++)
                if (pt->units[x] && !(x < q->nunits && q->units[x])) {
                    snprintf(why, cap, "%s of step %d holds tensors of unit %d, which device %s "
                             "does not run", q->name, q->step, x, q->device);
                    rc = COORD_PIECE_REFUSED;
                }
        }
        if (rc) { /* the file starts again */
            unlink(p);
            u->bytes -= pt->size;
            pt->size = 0;
            free(pt->units);
            pt->units = NULL;
        } else {
            pt->done = 1;
            *complete = step_complete(k, q->step);
        }
    }
    free(p);
    free(dir);
    free(ck);
    return rc;
}

void coord_ckpt_drop_partials(coord_ckpt *k)
{
    while (k->nslots)
        slot_drop(k, k->nslots - 1);
    char *ck = path_of(k->dir, "ckpt");
    DIR *d = opendir(ck);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "step-", 5) || n < 8 || strcmp(e->d_name + n - 8, ".partial"))
            continue;
        char *p = path_of(ck, e->d_name);
        rm_dir(p);
        free(p);
    }
    if (d)
        closedir(d);
    free(ck);
}

/* ---- commits ------------------------------------------------------------------------- */

static void hex32(const uint8_t *sum, char hex[65])
{
    for (int k = 0; k < 32; k++)
        snprintf(hex + 2 * k, 3, "%02x", sum[k]);
}

int coord_ckpt_commit(coord_ckpt *k, int step, const char *config, const char *optimizer,
                      const char *optim_state, sl_err *err)
{
    if (!step_complete(k, step))
        return sl_err_set(err, SL_ESTATE, "step %d: its parts are not all in", step);
    char *partial = coord_ckpt_step_dir(k, step, 1), *final = coord_ckpt_step_dir(k, step, 0);
    char *cfg = path_of(partial, "config.json");
    int rc = write_atomic(k, cfg, config, strlen(config), err);
    free(cfg);
    /* the manifest lists every file with its sum: dev_ckpt_write_manifest's
     * format; the parts' sums were checked as they arrived */
    json_t *files = json_array();
    char hex[65];
    for (int i = 0; !rc && i < k->nslots; i++)
        for (int q = 0; k->slots[i].step == step && q < k->slots[i].n; q++) {
            const part *pt = &k->slots[i].parts[q];
            if (!pt->done)
                continue;
            hex32(pt->sum, hex);
            json_t *f = json_pack("{s:s, s:I, s:s}", "name", pt->name, "bytes",
                                  (json_int_t)pt->size, "blake2b", hex);
            if (k->nrep > 1)
                json_object_set_new(f, "replica", json_integer(pt->replica));
            json_array_append_new(files, f);
        }
    uint8_t cs[32];
    crypto_generichash(cs, sizeof cs, (const uint8_t *)config, strlen(config), NULL, 0);
    hex32(cs, hex);
    json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "name", "config.json", "bytes",
                                           (json_int_t)strlen(config), "blake2b", hex));
    json_t *m = json_pack("{s:s, s:i, s:i, s:s, s:s, s:o}", "format", "skyloom-checkpoint",
                          "version", 1, "step", step, "optimizer", optimizer, "optim_state",
                          optim_state, "files", files);
    char *text = json_dumps(m, JSON_INDENT(2));
    json_decref(m);
    char *mp = path_of(partial, "manifest.json");
    if (!rc)
        rc = write_atomic(k, mp, text, strlen(text), err);
    free(mp);
    free(text);
    if (!rc && k->ops.rename(k->ops.ud, partial, final) != 0)
        rc = sl_err_set(err, SL_EIO, "%s: %s", final, strerror(errno));
    free(partial);
    free(final);
    /* the steps up to it need their parts no more */
    for (int i = k->nslots - 1; !rc && i >= 0; i--)
        if (k->slots[i].step <= step) {
            if (k->slots[i].step < step) {
                char *stale = coord_ckpt_step_dir(k, k->slots[i].step, 1);
                rm_dir(stale);
                free(stale);
            }
            slot_drop(k, i);
        }
    return rc;
}

void coord_ckpt_prune(coord_ckpt *k, int step)
{
    char *old = coord_ckpt_step_dir(k, step, 0);
    rm_dir(old);
    free(old);
}

/* ---- metrics.csv ------------------------------------------------------------------------ */

static const char *const metrics_header = COORD_METRICS_HEADER "\n";

int coord_ckpt_metrics_append(coord_ckpt *k, const coord_fx *f, sl_err *err)
{
    const coord_step_rep *rep = f->reps, *last = &rep[f->p - 1];
    int p = f->p;
    sl_buf b = {0};
    sl_buf_printf(&b, "%d,%d,%.6f,%u,%.6f,%.6g,%.4f,%.1f,", f->step, f->epoch, f->loss, f->masked,
                  last->grad_norm, last->lr, f->step_s, f->tokens_s);
    for (int i = 0; i < p; i++)
        sl_buf_printf(&b, "%s%.3f", i ? ";" : "",
                      rep[i].step_s > 0 ? (rep[i].fwd + rep[i].bwd) / rep[i].step_s : 0);
    /* the links between the stages of each replica's chain */
    for (int w = 0; w < 4; w++) {
        sl_buf_printf(&b, ",");
        int n = 0;
        for (int i = 0; i + 1 < p; i++) {
            int end = 0;
            for (int r = 1; r < f->nrep; r++)
                end |= i + 1 == f->rep_first[r];
            if (end)
                continue;
            uint64_t v = w == 0 ? rep[i].raw : w == 1 ? rep[i].wire : w == 2 ? rep[i + 1].raw_up
                                                                             : rep[i + 1].wire_up;
            sl_buf_printf(&b, "%s%llu", n++ ? ";" : "", (unsigned long long)v);
        }
    }
    uint64_t side_raw = 0, side_wire = 0, sync_raw = 0, sync_wire = 0;
    for (int i = 0; i < p; i++) {
        side_raw += rep[i].raw_side;
        side_wire += rep[i].wire_side;
        sync_raw = sl_add_sat_u64(sync_raw, rep[i].raw_sync);
        sync_wire = sl_add_sat_u64(sync_wire, rep[i].wire_sync);
    }
    sl_buf_printf(&b, ",%llu,%llu,", (unsigned long long)side_raw, (unsigned long long)side_wire);
    /* each replica's own loss: its last stage's */
    for (int r = 0; f->nrep > 1 && r < f->nrep; r++)
        sl_buf_printf(&b, "%s%.6f", r ? ";" : "", rep[f->rep_first[r + 1] - 1].loss);
    sl_buf_printf(&b, ",%llu,%llu\n", (unsigned long long)sync_raw, (unsigned long long)sync_wire);
    char *path = path_of(k->dir, "metrics.csv");
    int fd = k->ops.open(k->ops.ud, path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    struct stat sb;
    int ok = fd >= 0 && fstat(fd, &sb) == 0;
    int64_t off = ok ? (int64_t)sb.st_size : 0;
    if (ok && off == 0) {
        ok = !write_all(k, fd, metrics_header, strlen(metrics_header), 0);
        off = (int64_t)strlen(metrics_header);
    }
    if (ok)
        ok = !write_all(k, fd, b.s, b.n, off);
    if (!ok)
        sl_err_set(err, SL_EIO, "writing %s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    free(path);
    free(b.s);
    return ok ? 0 : -1;
}

/* Commas to add to each row of a metrics.csv whose header is `hdr` (hlen
 * bytes, no newline): an older coordinator's header, which the current one
 * extends by columns at the end. 0 for the current header or another. */
static int metrics_pad(const char *hdr, size_t hlen)
{
    const char *cur = COORD_METRICS_HEADER;
    size_t clen = strlen(cur);
    if (hlen >= clen || strncmp(hdr, cur, hlen) || cur[hlen] != ',')
        return 0;
    int pad = 0;
    for (size_t i = hlen; i < clen; i++)
        pad += cur[i] == ',';
    return pad;
}

int coord_ckpt_metrics_truncate(coord_ckpt *k, int committed, double *loss_out, sl_err *err)
{
    char *p = path_of(k->dir, "metrics.csv"), *buf = NULL;
    size_t n = 0, o = 0;
    double loss = 0;
    sl_err rerr = {0};
    *loss_out = 0;
    if (sl_read_file(p, 256u << 20, &buf, &n, &rerr)) {
        free(p);
        return 0; /* none yet */
    }
    /* an older header: the current one, and empty new columns in its rows */
    const char *hnl = memchr(buf, '\n', n);
    int pad = hnl ? metrics_pad(buf, (size_t)(hnl - buf)) : 0;
    size_t cap = n + 1 + (pad ? strlen(COORD_METRICS_HEADER) : 0);
    for (size_t i = 0; pad && i < n; i++)
        cap += buf[i] == '\n' ? (size_t)pad : 0;
    char *out = sl_xmalloc(cap);
    int row = 0;
    for (char *line = buf; line < buf + n; row++) {
        char *nl = memchr(line, '\n', (size_t)(buf + n - line));
        size_t l = nl ? (size_t)(nl - line) + 1 : (size_t)(buf + n - line);
        if (row == 0 && pad) {
            o += (size_t)sprintf(out + o, "%s\n", COORD_METRICS_HEADER);
        } else if (row == 0 || (nl && atoi(line) <= committed)) {
            memcpy(out + o, line, pad ? l - 1 : l);
            o += pad ? l - 1 : l;
            for (int c = 0; row && c < pad; c++)
                out[o++] = ',';
            if (pad)
                out[o++] = '\n';
            const char *c = row ? strchr(line, ',') : NULL;
            if (c && (c = strchr(c + 1, ',')))
                loss = atof(c + 1);
        }
        line += l;
    }
    int rc = o != n || pad ? write_atomic(k, p, out, o, err) : 0;
    free(out);
    free(buf);
    free(p);
    *loss_out = loss;
    return rc;
}

char *coord_ckpt_metrics_from(const coord_ckpt *k, int from)
{
    char *p = path_of(k->dir, "metrics.csv"), *buf = NULL;
    size_t n = 0;
    sl_err err = {0};
    int rc = sl_read_file(p, 64u << 20, &buf, &n, &err);
    free(p);
    if (rc || from <= 0) {
        free(buf);
        return sl_xstrdup("");
    }
    /* rows start with their step: keep the ones >= from */
    size_t o = 0, row = 0;
    char *out = sl_xmalloc(n + 1);
    for (char *line = buf; line < buf + n;) {
        char *nl = memchr(line, '\n', (size_t)(buf + n - line));
        size_t l = nl ? (size_t)(nl - line) + 1 : (size_t)(buf + n - line);
        if (row++ > 0 && atoi(line) >= from) {
            memcpy(out + o, line, l);
            o += l;
        }
        line += l;
    }
    out[o] = 0;
    free(buf);
    return out;
}
