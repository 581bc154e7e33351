/* fuzz_path.c - libFuzzer target: names from the network as paths
 * (sl_path_name_check, sl_dir_open, sl_file_create_at).
 *
 * The input is a name as received (its bytes, NULs included). Properties: a
 * name accepted is 1..SL_PATH_NAME_MAX bytes of [A-Za-z0-9._-] not starting
 * with '.'; made into a directory and into a file inside a box directory, it
 * lands directly in the box (nothing appears beside the box), and a name
 * refused creates nothing. The rule is checked here once more, written out
 * independently of sl_path.c. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "sl_path.h"

static int box = -1, root = -1;

static int entries(int dirfd)
{
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    int n = 0;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    rewinddir(d);
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static int rule(const uint8_t *s, size_t n)
{
    if (n == 0 || n > SL_PATH_NAME_MAX || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (box < 0) {
        const char *b = fu_path("box");
        if (mkdir(b, 0700) != 0 || (box = open(b, O_RDONLY | O_DIRECTORY)) < 0 ||
            (root = open(fu_path(""), O_RDONLY | O_DIRECTORY)) < 0)
            fu_die("box", b);
    }
    sl_err err = {0};
    int ok = sl_path_name_check((const char *)data, size, &err) == 0;
    REQUIREF(ok == rule(data, size), "name of %zu bytes: %s", size, ok ? "accepted" : err.msg);
    REQUIRE(ok || err.code == SL_EINVAL);
    int beside = entries(root);
    if (ok) {
        char name[SL_PATH_NAME_MAX + 1];
        memcpy(name, data, size);
        name[size] = 0;
        int d = sl_dir_open(box, name, 0700, SL_DIR_CREATE, &err);
        REQUIREF(d >= 0, "%s: %s", name, err.msg);
        int f = sl_file_create_at(d, "data.json", &err);
        REQUIREF(f >= 0, "%s: %s", name, err.msg);
        close(f);
        struct stat st;
        REQUIRE(fstatat(box, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode));
        REQUIRE(entries(d) == 1);
        close(d);
        sl_dir_remove_at(box, name);
        /* as a file name too */
        f = sl_file_create_at(box, name, &err);
        REQUIREF(f >= 0, "%s: %s", name, err.msg);
        close(f);
        REQUIRE(unlinkat(box, name, 0) == 0);
    } else if (size > 0 && size <= SL_PATH_NAME_MAX && !memchr(data, 0, size)) {
        /* a refused name never becomes a file through sl_file_create_at */
        char name[SL_PATH_NAME_MAX + 1];
        memcpy(name, data, size);
        name[size] = 0;
        REQUIRE(sl_file_create_at(box, name, &err) == -1);
    }
    REQUIRE(entries(box) == 0 && entries(root) == beside);
    return 0;
}
