#include "dev_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sl_mem.h"

int dev_read_file(const char *path, uint64_t max_bytes, char **buf, size_t *len, sl_err *err)
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

int dev_write_file_atomic(const char *path, const dev_iov *parts, int nparts, sl_err *err)
{
    size_t pl = strlen(path);
    char *tmp = sl_xmalloc(pl + 5);
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        sl_err_set(err, SL_EIO, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    for (int i = 0; i < nparts; i++) {
        const char *p = parts[i].p;
        size_t left = parts[i].n;
        while (left > 0) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                sl_err_set(err, SL_EIO, "writing %s: %s", tmp, strerror(errno));
                goto fail;
            }
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0) {
        sl_err_set(err, SL_EIO, "fsync %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        sl_err_set(err, SL_EIO, "closing %s: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        sl_err_set(err, SL_EIO, "renaming %s to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    free(tmp);
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    free(tmp);
    return -1;
}
