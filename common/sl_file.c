#include "sl_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sl_log.h"
#include "sl_mem.h"

int sl_read_file(const char *path, uint64_t max_bytes, char **buf, size_t *len, sl_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sl_err_set(err, SL_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return sl_err_set(err, SL_EINVAL, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return sl_err_set(err, SL_EINVAL, "%s: %lld bytes, more than the limit of %llu", path,
                          (long long)st.st_size, (unsigned long long)max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *b = sl_try_malloc(n + 1);
    if (!b) {
        close(fd);
        return sl_err_set(err, SL_ENOMEM, "%s: cannot allocate %zu bytes", path, n + 1);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            free(b);
            close(fd);
            return sl_err_set(err, SL_EIO, "%s: %s", path, e ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)r;
    }
    close(fd);
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

int sl_atomic_open(sl_atomic *a, const char *path, sl_err *err)
{
    memset(a, 0, sizeof *a);
    size_t n = strlen(path);
    a->path = sl_xstrdup(path);
    a->tmp = sl_xmalloc(n + 32);
    snprintf(a->tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0 && !(a->f = fdopen(fd, "wb")))
        close(fd);
    if (!a->f) {
        sl_err_set(err, SL_EIO, "%s: %s", a->tmp, strerror(errno));
        free(a->path);
        free(a->tmp);
        memset(a, 0, sizeof *a);
        return -1;
    }
    return 0;
}

void sl_atomic_write(sl_atomic *a, const void *p, size_t n)
{
    if (!a->failed && n && fwrite(p, 1, n, a->f) != n)
        a->failed = errno ? errno : EIO;
}

static void release(sl_atomic *a)
{
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
}

void sl_atomic_abort(sl_atomic *a)
{
    if (a->f)
        fclose(a->f);
    if (a->tmp)
        unlink(a->tmp);
    release(a);
}

static void fsync_dir(const char *path)
{
    char *d = sl_xstrdup(path);
    int fd = open(dirname(d), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(d);
}

int sl_atomic_commit(sl_atomic *a, sl_err *err)
{
    int e = a->failed;
    if (!e && fflush(a->f))
        e = errno;
    if (!e && fsync(fileno(a->f)))
        e = errno;
    if (fclose(a->f) && !e)
        e = errno;
    a->f = NULL;
    if (!e && rename(a->tmp, a->path))
        e = errno;
    if (e) {
        sl_err_set(err, SL_EIO, "writing %s: %s", a->path, strerror(e));
        unlink(a->tmp);
        release(a);
        return -1;
    }
    fsync_dir(a->path);
    release(a);
    return 0;
}

int sl_mkdir(const char *path, mode_t mode, sl_err *err)
{
    if (mkdir(path, mode) && errno != EEXIST)
        return sl_err_set(err, SL_EIO, "cannot create %s: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) || !S_ISDIR(st.st_mode))
        return sl_err_set(err, SL_EIO, "%s: not a directory", path);
    return 0;
}

int sl_private_dir(const char *path, mode_t *old_mode, sl_err *err)
{
    if (sl_mkdir(path, 0700, err))
        return -1;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return sl_err_set(err, SL_EIO, "%s: not a directory", path);
    if (!(st.st_mode & 077))
        return 0;
    if (st.st_uid != geteuid())
        return sl_err_set(err, SL_EAUTH,
                          "%s (mode %04o) may be used by group or others and belongs to uid %u, "
                          "not to us: refusing to keep secrets there",
                          path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
    if (chmod(path, 0700) != 0)
        return sl_err_set(err, SL_EIO, "%s (mode %04o): cannot make it private: %s", path,
                          (unsigned)(st.st_mode & 07777), strerror(errno));
    if (old_mode)
        *old_mode = st.st_mode & 07777;
    return 1;
}

int sl_write_file_atomic(const char *path, const void *p, size_t n, sl_err *err)
{
    sl_atomic a;
    if (sl_atomic_open(&a, path, err))
        return -1;
    sl_atomic_write(&a, p, n);
    return sl_atomic_commit(&a, err);
}

int sl_pwrite_all(int fd, const void *p, size_t n, off_t off)
{
    const unsigned char *b = p;
    while (n > 0) {
        ssize_t w = pwrite(fd, b, n, off);
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

int sl_lock_file(const char *path, const char *what, const char *who, int *fd_out, sl_err *err)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return sl_err_set(err, SL_EIO, "cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[32] = "";
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK)
            return sl_err_set(err, SL_ESTATE, "%s is in use by another %s%s%s%s (it holds %s)", what,
                              who, holder[0] ? " (pid " : "", holder, holder[0] ? ")" : "", path);
        return sl_err_set(err, SL_EIO, "cannot lock %s: %s", path, strerror(e));
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        sl_log_warn("cannot write the lock file", "path=%s", path);
    *fd_out = fd;
    return 0;
}
