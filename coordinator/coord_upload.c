/* coord_upload.c - models for jobs to start from, uploaded a piece at a time.
 *
 * The admin's client draws an id, sends the file in order (each piece where
 * the last ended, so the BLAKE2b-256 is computed as the pieces arrive), and
 * the last piece's size and sum must match. A submit then claims the upload:
 * the file is renamed into the job's directory. An upload survives a
 * coordinator restart: an unfinished one goes on from its file (the sum so
 * far read at its next piece), and one whose last piece checked out has a
 * marker file beside it (ID.done). A piece sent
 * again after its reply was lost (the same bytes at the same offset) is
 * taken as already written. */
#include "coord_upload.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sl_file.h"
#include "sl_mem.h"
#include "sl_time.h"

#define UP_SLOTS 8              /* uploads in progress or waiting for their submit */
#define UP_IDLE_S 3600          /* an upload untouched this long may be dropped for a new one */
#define UP_MAX_FILE (64ull << 30)
#define UP_ID_LEN 32
#define UP_SUFFIX ".safetensors"
#define UP_DONE ".done"

typedef struct upload {
    char id[UP_ID_LEN + 1]; /* "" = a free slot */
    uint64_t size;
    int done;
    int unhashed;           /* left by an earlier run: the sum so far is read at its next piece */
    int64_t touched;
    crypto_generichash_state hash;
} upload;

struct coord_uploads {
    pthread_mutex_t mu;
    char *dir;
    upload slot[UP_SLOTS];
};

static int id_ok(const char *id)
{
    if (!id || strlen(id) != UP_ID_LEN)
        return 0;
    for (const char *c = id; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return 0;
    return 1;
}

static char *path_with(const coord_uploads *u, const char *id, const char *suffix)
{
    size_t n = strlen(u->dir) + UP_ID_LEN + strlen(suffix) + 2;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s%s", u->dir, id, suffix);
    return p;
}

static char *file_of(const coord_uploads *u, const char *id) { return path_with(u, id, UP_SUFFIX); }

static void drop(coord_uploads *u, upload *x)
{
    char *p = file_of(u, x->id), *m = path_with(u, x->id, UP_DONE);
    unlink(p);
    unlink(m);
    free(p);
    free(m);
    memset(x, 0, sizeof *x);
}

/* An upload a previous run left: its size from the file, done if its marker
 * is there. Its sum so far is read when its next piece comes (rehash), not
 * here: a restart does not read every file it kept. 0, or -1 if the file
 * cannot be read. */
static int readopt(coord_uploads *u, upload *x, const char *id, int64_t now)
{
    char *p = file_of(u, id), *m = path_with(u, id, UP_DONE);
    struct stat sb;
    int rc = stat(p, &sb) == 0 && S_ISREG(sb.st_mode) ? 0 : -1;
    memset(x, 0, sizeof *x);
    if (!rc) {
        snprintf(x->id, sizeof x->id, "%s", id);
        x->size = (uint64_t)sb.st_size;
        x->done = access(m, F_OK) == 0;
        x->unhashed = !x->done;
        x->touched = now;
    }
    free(p);
    free(m);
    return rc;
}

/* The sum of the first x->size bytes of an upload's file. */
static int rehash(coord_uploads *u, upload *x, rpc_status *st)
{
    char *p = file_of(u, x->id);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    uint64_t left = x->size;
    crypto_generichash_init(&x->hash, NULL, 0, crypto_generichash_BYTES);
    uint8_t *buf = sl_xmalloc(1 << 20);
    while (fd >= 0 && left > 0) {
        ssize_t k = read(fd, buf, left < (1 << 20) ? (size_t)left : (1 << 20));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        crypto_generichash_update(&x->hash, buf, (size_t)k);
        left -= (uint64_t)k;
    }
    int code = left == 0 ? RPC_OK
                         : rpc_status_set(st, RPC_INTERNAL, "%s: %s", p,
                                          fd < 0 ? strerror(errno) : "shorter than before");
    if (fd >= 0)
        close(fd);
    free(buf);
    free(p);
    x->unhashed = code != RPC_OK;
    return code;
}

coord_uploads *coord_uploads_open(const char *dir, sl_err *err)
{
    if (sl_mkdir(dir, 0700, err))
        return NULL;
    DIR *d = opendir(dir);
    if (!d) {
        sl_err_set(err, SL_EIO, "%s: %s", dir, strerror(errno));
        return NULL;
    }
    coord_uploads *u = sl_xcalloc(1, sizeof *u);
    pthread_mutex_init(&u->mu, NULL);
    u->dir = sl_xstrdup(dir);
    /* what an earlier run left goes on where it was; past the slots, and a
     * marker without its file, removed */
    int64_t now = sl_unix_time();
    int k = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        char id[UP_ID_LEN + 1];
        snprintf(id, sizeof id, "%.*s", UP_ID_LEN, e->d_name);
        int file = n == UP_ID_LEN + strlen(UP_SUFFIX) && !strcmp(e->d_name + UP_ID_LEN, UP_SUFFIX);
        int mark = n == UP_ID_LEN + strlen(UP_DONE) && !strcmp(e->d_name + UP_ID_LEN, UP_DONE);
        if (mark) {
            char *p = file_of(u, id);
            if (!id_ok(id) || access(p, F_OK) != 0)
                unlinkat(dirfd(d), e->d_name, 0);
            free(p);
        } else if (file && (!id_ok(id) || k >= UP_SLOTS || readopt(u, &u->slot[k], id, now))) {
            upload gone = {0};
            snprintf(gone.id, sizeof gone.id, "%s", id);
            drop(u, &gone);
        } else if (file) {
            k++;
        }
    }
    closedir(d);
    return u;
}

void coord_uploads_close(coord_uploads *u)
{
    if (!u)
        return;
    pthread_mutex_destroy(&u->mu);
    free(u->dir);
    free(u);
}

static upload *find(coord_uploads *u, const char *id)
{
    for (int i = 0; i < UP_SLOTS; i++)
        if (!strcmp(u->slot[i].id, id))
            return &u->slot[i];
    return NULL;
}

/* A slot for a new upload: a free one, else the one idle longest past UP_IDLE_S. */
static upload *take_slot(coord_uploads *u, int64_t now)
{
    upload *old = NULL;
    for (int i = 0; i < UP_SLOTS; i++) {
        upload *x = &u->slot[i];
        if (!x->id[0])
            return x;
        if (now - x->touched >= UP_IDLE_S && (!old || x->touched < old->touched))
            old = x;
    }
    if (old)
        drop(u, old);
    return old;
}

static int append(coord_uploads *u, upload *x, const Skyloom__V1__UploadInitRequest *r,
                  rpc_status *st)
{
    char *p = file_of(u, x->id);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | (r->offset ? 0 : O_TRUNC), 0600);
    int bad = fd < 0 || sl_pwrite_all(fd, r->data.data, r->data.len, (off_t)r->offset) ||
              (r->last && fsync(fd));
    int code = RPC_OK;
    if (bad) {
        code = rpc_status_set(st, RPC_INTERNAL, "%s: %s", p, strerror(errno));
    } else {
        crypto_generichash_update(&x->hash, r->data.data, r->data.len);
        x->size += r->data.len;
    }
    if (fd >= 0)
        close(fd);
    free(p);
    return code;
}

/* Whether the piece's bytes are what the file holds there. */
static int written(coord_uploads *u, const upload *x, const Skyloom__V1__UploadInitRequest *r)
{
    char *p = file_of(u, x->id);
    int fd = open(p, O_RDONLY | O_CLOEXEC), same = 0;
    free(p);
    if (fd < 0)
        return 0;
    uint8_t *buf = sl_xmalloc(r->data.len);
    ssize_t k = pread(fd, buf, r->data.len, (off_t)r->offset);
    same = k == (ssize_t)r->data.len && !memcmp(buf, r->data.data, r->data.len);
    free(buf);
    close(fd);
    return same;
}

int coord_uploads_piece(coord_uploads *u, const Skyloom__V1__UploadInitRequest *r, rpc_status *st)
{
    if (!id_ok(r->upload_id))
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "upload id must be %d hex digits",
                              UP_ID_LEN);
    int64_t now = sl_unix_time();
    pthread_mutex_lock(&u->mu);
    upload *x = find(u, r->upload_id);
    int code = RPC_OK;
    if (!x && r->offset == 0) {
        if ((x = take_slot(u, now))) {
            snprintf(x->id, sizeof x->id, "%s", r->upload_id);
            crypto_generichash_init(&x->hash, NULL, 0, crypto_generichash_BYTES);
        } else {
            code = rpc_status_set(st, RPC_RESOURCE_EXHAUSTED,
                                  "%d uploads are in progress or wait for their submit; "
                                  "try again later", UP_SLOTS);
        }
    }
    if (code != RPC_OK) {
    } else if (!x) {
        code = rpc_status_set(st, RPC_FAILED_PRECONDITION,
                              "upload %s: no such upload (its first piece starts at 0)",
                              r->upload_id);
    } else if (r->data.len && r->offset + r->data.len == x->size && written(u, x, r)) {
        x->touched = now; /* sent again after its reply was lost: already written */
    } else if (x->done) {
        code = rpc_status_set(st, RPC_FAILED_PRECONDITION, "upload %s is complete", r->upload_id);
    } else if (r->offset != x->size) {
        code = rpc_status_set(st, RPC_OUT_OF_RANGE, "upload %s: piece at %llu, expected %llu",
                              r->upload_id, (unsigned long long)r->offset,
                              (unsigned long long)x->size);
    } else if (x->unhashed && (code = rehash(u, x, st)) != RPC_OK) {
        drop(u, x);
    } else if (x->size + r->data.len > UP_MAX_FILE) {
        drop(u, x);
        code = rpc_status_set(st, RPC_OUT_OF_RANGE, "upload %s: larger than %llu bytes",
                              r->upload_id, UP_MAX_FILE);
    } else if ((code = append(u, x, r, st)) != RPC_OK) {
        drop(u, x);
    } else {
        x->touched = now;
        if (r->last) {
            unsigned char sum[crypto_generichash_BYTES];
            crypto_generichash_final(&x->hash, sum, sizeof sum);
            if (r->size != x->size || r->blake2b.len != sizeof sum ||
                sodium_memcmp(sum, r->blake2b.data, sizeof sum)) {
                drop(u, x);
                code = rpc_status_set(st, RPC_DATA_LOSS, "upload %s arrived damaged (size or "
                                      "checksum differs); send it again", r->upload_id);
            } else {
                char *m = path_with(u, x->id, UP_DONE);
                sl_err e = {0};
                if (sl_write_file_atomic(m, "", 0, &e)) {
                    drop(u, x);
                    code = rpc_status_set(st, RPC_INTERNAL, "%s", e.msg);
                } else {
                    x->done = 1;
                }
                free(m);
            }
        }
    }
    pthread_mutex_unlock(&u->mu);
    return code;
}

int coord_uploads_claim(coord_uploads *u, const char *id, const char *dest, rpc_status *st)
{
    if (!id_ok(id))
        return rpc_status_set(st, RPC_INVALID_ARGUMENT, "upload id must be %d hex digits",
                              UP_ID_LEN);
    pthread_mutex_lock(&u->mu);
    upload *x = find(u, id);
    int code = RPC_OK;
    if (!x || !x->done) {
        code = rpc_status_set(st, RPC_FAILED_PRECONDITION,
                              "upload %s is %s", id, x ? "not complete" : "unknown");
    } else {
        char *p = file_of(u, id);
        if (rename(p, dest))
            code = rpc_status_set(st, RPC_INTERNAL, "%s -> %s: %s", p, dest, strerror(errno));
        else
            drop(u, x); /* the marker */
        free(p);
    }
    pthread_mutex_unlock(&u->mu);
    return code;
}
