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
} part;

typedef struct slot {
    int step;
    part *parts;
    int n;
} slot;

struct coord_ckpt {
    char *dir;
    coord_fileops ops;
    slot up[COORD_ACC_STEPS];
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
    for (int i = 0; i < COORD_ACC_STEPS; i++)
        k->up[i].step = -1;
    return k;
}

void coord_ckpt_free(coord_ckpt *k)
{
    if (!k)
        return;
    for (int i = 0; i < COORD_ACC_STEPS; i++)
        free(k->up[i].parts);
    free(k->dir);
    free(k);
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

static slot *slot_of(coord_ckpt *k, int step)
{
    slot *u = &k->up[step % COORD_ACC_STEPS];
    if (u->step != step) {
        free(u->parts);
        memset(u, 0, sizeof *u);
        u->step = step;
    }
    return u;
}

static part *part_of(const slot *u, int step, const char *name)
{
    if (u->step != step)
        return NULL;
    for (int i = 0; i < u->n; i++)
        if (!strcmp(u->parts[i].name, name))
            return &u->parts[i];
    return NULL;
}

uint64_t coord_ckpt_part_size(const coord_ckpt *k, int step, const char *name)
{
    const part *pt = part_of(&k->up[step % COORD_ACC_STEPS], step, name);
    return pt ? pt->size : 0;
}

int coord_ckpt_piece(coord_ckpt *k, int step, const char *name, uint64_t offset,
                     const uint8_t *data, size_t len, int last, uint64_t size, const uint8_t *sum,
                     size_t sum_len, int *parts_done, char *why, size_t cap)
{
    slot *u = slot_of(k, step);
    part *pt = part_of(u, step, name);
    *parts_done = 0;
    if (!pt && offset == 0) {
        u->parts = sl_xrealloc(u->parts, (size_t)(u->n + 1) * sizeof *u->parts);
        pt = &u->parts[u->n++];
        memset(pt, 0, sizeof *pt);
        memcpy(pt->name, name, strnlen(name, sizeof pt->name - 1));
    }
    if (!pt || pt->done || offset != pt->size || offset + len > COORD_MAX_FILE) {
        snprintf(why, cap, "%s: chunk at %llu, expected %llu", name, (unsigned long long)offset,
                 (unsigned long long)(pt ? pt->size : 0));
        return COORD_PIECE_RANGE;
    }
    sl_err err = {0};
    char *dir = coord_ckpt_step_dir(k, step, 1), *ck = path_of(k->dir, "ckpt");
    int rc = COORD_PIECE_OK;
    if (sl_mkdir(ck, 0700, &err) || sl_mkdir(dir, 0700, &err)) {
        snprintf(why, cap, "%s", err.msg);
        rc = COORD_PIECE_STORE;
    }
    char *p = path_of(dir, name);
    int fd = rc ? -1 : k->ops.open(k->ops.ud, p, O_WRONLY | O_CREAT | O_CLOEXEC | (offset ? 0 : O_TRUNC), 0600);
    if (!rc && (fd < 0 || write_all(k, fd, data, len, (int64_t)offset) ||
                (last && k->ops.fsync(k->ops.ud, fd)))) {
        snprintf(why, cap, "%s: %s", p, strerror(errno));
        rc = COORD_PIECE_STORE;
    } else if (!rc) {
        /* hashed as it arrives (pieces come in order: offset == size), so the
         * last piece needs no read of the whole file */
        if (offset == 0)
            crypto_generichash_init(&pt->hash, NULL, 0, sizeof pt->sum);
        crypto_generichash_update(&pt->hash, data, len);
        pt->size += len;
    }
    if (fd >= 0)
        close(fd);
    if (!rc && last) {
        int bad = size != pt->size || sum_len != 32;
        if (!bad) {
            crypto_generichash_final(&pt->hash, pt->sum, sizeof pt->sum);
            bad = sodium_memcmp(pt->sum, sum, 32) != 0;
        }
        if (bad) { /* start the file again */
            unlink(p);
            pt->size = 0;
            snprintf(why, cap, "%s of step %d arrived damaged (size or checksum differs); send it "
                     "again", name, step);
            rc = COORD_PIECE_DAMAGED;
        } else {
            pt->done = 1;
        }
    }
    free(p);
    free(dir);
    free(ck);
    for (int i = 0; i < u->n; i++)
        *parts_done += u->parts[i].done;
    return rc;
}

void coord_ckpt_drop_partials(coord_ckpt *k)
{
    for (int i = 0; i < COORD_ACC_STEPS; i++) {
        free(k->up[i].parts);
        memset(&k->up[i], 0, sizeof k->up[i]);
        k->up[i].step = -1;
    }
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
    const slot *u = &k->up[step % COORD_ACC_STEPS];
    if (u->step != step)
        return sl_err_set(err, SL_ESTATE, "step %d: no parts", step);
    char *partial = coord_ckpt_step_dir(k, step, 1), *final = coord_ckpt_step_dir(k, step, 0);
    char *cfg = path_of(partial, "config.json");
    int rc = write_atomic(k, cfg, config, strlen(config), err);
    free(cfg);
    /* the manifest lists every file with its sum: dev_ckpt_write_manifest's
     * format; the parts' sums were checked as they arrived */
    json_t *files = json_array();
    for (int i = 0; !rc && i <= u->n; i++) {
        char hex[65];
        uint8_t cs[32];
        if (i == u->n)
            crypto_generichash(cs, sizeof cs, (const uint8_t *)config, strlen(config), NULL, 0);
        hex32(i < u->n ? u->parts[i].sum : cs, hex);
        json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "name",
                                               i < u->n ? u->parts[i].name : "config.json", "bytes",
                                               (json_int_t)(i < u->n ? u->parts[i].size : strlen(config)),
                                               "blake2b", hex));
    }
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

int coord_ckpt_metrics_append(coord_ckpt *k, int step, int epoch, const coord_step_rep *rep, int p,
                              double step_s, double tokens_s, sl_err *err)
{
    const coord_step_rep *last = &rep[p - 1];
    sl_buf b = {0};
    sl_buf_printf(&b, "%d,%d,%.6f,%u,%.6f,%.6g,%.4f,%.1f,", step, epoch, last->loss, last->masked,
                  last->grad_norm, last->lr, step_s, tokens_s);
    for (int i = 0; i < p; i++)
        sl_buf_printf(&b, "%s%.3f", i ? ";" : "",
                      rep[i].step_s > 0 ? (rep[i].fwd + rep[i].bwd) / rep[i].step_s : 0);
    for (int w = 0; w < 4; w++) {
        sl_buf_printf(&b, ",");
        for (int i = 0; i + 1 < p; i++) {
            uint64_t v = w == 0 ? rep[i].raw : w == 1 ? rep[i].wire : w == 2 ? rep[i + 1].raw_up
                                                                             : rep[i + 1].wire_up;
            sl_buf_printf(&b, "%s%llu", i ? ";" : "", (unsigned long long)v);
        }
    }
    uint64_t side_raw = 0, side_wire = 0;
    for (int i = 0; i < p; i++) {
        side_raw += rep[i].raw_side;
        side_wire += rep[i].wire_side;
    }
    sl_buf_printf(&b, ",%llu,%llu\n", (unsigned long long)side_raw, (unsigned long long)side_wire);
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
    char *out = sl_xmalloc(n + 1);
    int row = 0;
    for (char *line = buf; line < buf + n; row++) {
        char *nl = memchr(line, '\n', (size_t)(buf + n - line));
        size_t l = nl ? (size_t)(nl - line) + 1 : (size_t)(buf + n - line);
        if (row == 0 || (nl && atoi(line) <= committed)) {
            memcpy(out + o, line, l);
            o += l;
            const char *c = row ? strchr(line, ',') : NULL;
            if (c && (c = strchr(c + 1, ',')))
                loss = atof(c + 1);
        }
        line += l;
    }
    int rc = o != n ? write_atomic(k, p, out, o, err) : 0;
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
