/* sl_path.h - names from the network that become paths, and directories
 * opened without following symbolic links.
 *
 * A name that another machine chose (a file name in a coordinator's listing,
 * a job id in a task, a part a device uploads) may become one component of a
 * local path only if sl_path_name_check accepts it: 1..SL_PATH_NAME_MAX
 * bytes of [A-Za-z0-9._-], not starting with '.', so never "." or "..", never
 * a hidden file, never a separator, a NUL or a control byte. Every such name
 * goes through this one function.
 *
 * Directories that hold such files are opened with sl_dir_open: created when
 * asked and missing, opened O_DIRECTORY | O_NOFOLLOW (a symbolic link in its
 * last component is refused, not followed) and checked with fstat on the
 * descriptor: a directory owned by this user. Files inside are opened
 * relative to that descriptor (sl_file_create_at), so a name is never
 * resolved against anything but the checked directory. */
#ifndef SL_PATH_H
#define SL_PATH_H

#include <stddef.h>
#include <sys/types.h>

#include "sl_err.h"

#define SL_PATH_NAME_MAX 128

/* 0 if name[0..len) may be one component of a local path; -1 (SL_EINVAL,
 * saying why) otherwise. len is the name's length as received: a NUL inside
 * it is refused. */
int sl_path_name_check(const char *name, size_t len, sl_err *err);

enum {
    SL_DIR_CREATE = 1, /* make it (mode) when missing */
};

/* Opens the directory `path` (relative to dirfd, or AT_FDCWD) without
 * following a symbolic link in its last component, making it first with
 * SL_DIR_CREATE. It must be a directory and belong to this process's
 * effective user; one that grants group or others more than `mode` does is
 * narrowed to `mode`. Returns the descriptor (O_CLOEXEC), or -1: missing
 * (without SL_DIR_CREATE), a symbolic link, not a directory, another user's. */
int sl_dir_open(int dirfd, const char *path, mode_t mode, int flags, sl_err *err);

/* Creates (or truncates) the regular file `name` inside the directory dirfd
 * for writing, mode 0644 (tighter under a stricter umask), without following
 * a symbolic link; name must pass sl_path_name_check. Returns the descriptor
 * (O_CLOEXEC) or -1. */
int sl_file_create_at(int dirfd, const char *name, sl_err *err);

/* Removes the regular files directly inside `name` (a directory in dirfd,
 * not followed if it is a symbolic link), then the directory. A missing
 * directory is not an error. Subdirectories are left (the directory then
 * stays too). */
void sl_dir_remove_at(int dirfd, const char *name);

#endif
