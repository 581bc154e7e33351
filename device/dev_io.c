#include "dev_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sl_mem.h"

int dev_atomic_open(dev_atomic *a, const char *path, sl_err *err)
{
    memset(a, 0, sizeof *a);
    size_t n = strlen(path);
    a->path = sl_xstrdup(path);
    a->tmp = sl_xmalloc(n + 32);
    snprintf(a->tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    a->f = fopen(a->tmp, "wb");
    if (!a->f) {
        sl_err_set(err, SL_EIO, "%s: %s", a->tmp, strerror(errno));
        free(a->path);
        free(a->tmp);
        memset(a, 0, sizeof *a);
        return -1;
    }
    return 0;
}

void dev_atomic_write(dev_atomic *a, const void *p, size_t n)
{
    if (!a->failed && n && fwrite(p, 1, n, a->f) != n)
        a->failed = errno ? errno : EIO;
}

static void release(dev_atomic *a)
{
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
}

void dev_atomic_abort(dev_atomic *a)
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

int dev_atomic_commit(dev_atomic *a, sl_err *err)
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

int dev_mkdir(const char *path, sl_err *err)
{
    if (mkdir(path, 0755) && errno != EEXIST)
        return sl_err_set(err, SL_EIO, "mkdir %s: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) || !S_ISDIR(st.st_mode))
        return sl_err_set(err, SL_EIO, "%s: not a directory", path);
    return 0;
}
