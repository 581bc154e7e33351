/* sl_path.c - names from the network as paths; directories without
 * symbolic links (sl_path.h). */
#include "sl_path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

int sl_path_name_check(const char *name, size_t len, sl_err *err)
{
    if (!name || len == 0)
        return sl_err_set(err, SL_EINVAL, "an empty name cannot be a file name");
    if (len > SL_PATH_NAME_MAX)
        return sl_err_set(err, SL_EINVAL, "a name of %zu bytes cannot be a file name (at most %d)",
                          len, SL_PATH_NAME_MAX);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (name_char(c))
            continue;
        const char *what = c == '/' ? "a '/'" : c == 0 ? "a NUL byte" : "a byte";
        return sl_err_set(err, SL_EINVAL, "'%.*s' cannot be a file name: %s (0x%02x) at byte %zu "
                          "(only letters, digits, '.', '_' and '-')", (int)(len < 64 ? len : 64),
                          name, what, c, i);
    }
    if (name[0] == '.')
        return sl_err_set(err, SL_EINVAL, "'%.*s' cannot be a file name: it starts with '.'",
                          (int)(len < 64 ? len : 64), name);
    return 0;
}

int sl_dir_open(int dirfd, const char *path, mode_t mode, int flags, sl_err *err)
{
    if ((flags & SL_DIR_CREATE) && mkdirat(dirfd, path, mode) != 0 && errno != EEXIST)
        return sl_err_set(err, SL_EIO, "cannot create %s: %s", path, strerror(errno));
    int fd = openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat ls;
        if ((e == ELOOP || e == ENOTDIR) && fstatat(dirfd, path, &ls, AT_SYMLINK_NOFOLLOW) == 0) {
            if (S_ISLNK(ls.st_mode))
                return sl_err_set(err, SL_EAUTH, "%s is a symbolic link, not a directory: "
                                  "refusing to follow it", path);
            return sl_err_set(err, SL_EIO, "%s exists and is not a directory", path);
        }
        return sl_err_set(err, SL_EIO, "cannot open the directory %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sl_err_set(err, SL_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISDIR(st.st_mode)) {
        close(fd);
        return sl_err_set(err, SL_EIO, "%s is not a directory", path);
    }
    if (st.st_uid != geteuid()) {
        close(fd);
        return sl_err_set(err, SL_EAUTH, "the directory %s belongs to uid %u, not to this user "
                          "(uid %u): refusing to use it", path, (unsigned)st.st_uid,
                          (unsigned)geteuid());
    }
    mode_t cur = st.st_mode & 07777;
    if ((cur & 077) & ~mode && fchmod(fd, cur & ~((cur & 077) & ~mode)) != 0) {
        int e = errno;
        close(fd);
        return sl_err_set(err, SL_EIO, "%s (mode %04o): cannot narrow it to %04o: %s", path,
                          (unsigned)cur, (unsigned)mode, strerror(e));
    }
    return fd;
}

int sl_file_create_at(int dirfd, const char *name, sl_err *err)
{
    if (sl_path_name_check(name, strlen(name), err))
        return -1;
    int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return sl_err_set(err, SL_EIO, "cannot create %s: %s", name,
                          errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return sl_err_set(err, SL_EIO, "%s is not a regular file", name);
    }
    return fd;
}

void sl_dir_remove_at(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))
            unlinkat(fd, e->d_name, 0);
    }
    closedir(d);
    unlinkat(dirfd, name, AT_REMOVEDIR);
}
