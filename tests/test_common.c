/* sl_err, sl_cli parsers, sl_mem size arithmetic, sl_mkdir, private
 * directories, escaping of control bytes, names from the network as paths
 * and directories opened without following links. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sl_cli.h"
#include "sl_err.h"
#include "sl_file.h"
#include "sl_mem.h"
#include "sl_path.h"
#include "sl_test.h"

static void test_err(void)
{
    sl_err e = {0};
    CHECK(sl_err_set(&e, SL_EIO, "cannot open %s", "x.bin") == -1);
    CHECK(e.code == SL_EIO && strcmp(e.msg, "cannot open x.bin") == 0);
    CHECK(sl_err_wrap(&e, "loading %s", "model") == -1);
    CHECK(strcmp(e.msg, "loading model: cannot open x.bin") == 0);
    CHECK(e.code == SL_EIO);
    /* A long message is truncated, never overflowed. */
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    sl_err_set(&e, SL_EINVAL, "%s", big);
    sl_err_wrap(&e, "%s", big);
    CHECK(strlen(e.msg) == sizeof e.msg - 1);
    CHECK(sl_err_set(NULL, SL_EIO, "dropped") == -1);
    sl_err_clear(&e);
    CHECK(e.code == SL_OK && e.msg[0] == 0);
    CHECK(strcmp(sl_errcode_name(SL_ECORRUPT), "corrupt") == 0);
}

static void test_parse(void)
{
    sl_err e = {0};
    int v;
    CHECK(sl_parse_int("--steps", "12", 1, 100, &v, &e) == 0 && v == 12);
    CHECK(sl_parse_int("--steps", "0", 1, 100, &v, &e) == -1);
    CHECK(strstr(e.msg, "--steps must be between 1 and 100") != NULL);
    CHECK(sl_parse_int("--steps", "12x", 1, 100, &v, &e) == -1);
    CHECK(strstr(e.msg, "must be an integer, got '12x'") != NULL);
    CHECK(sl_parse_int("--steps", "", 1, 100, &v, &e) == -1);
    CHECK(sl_parse_int("--steps", "99999999999999999999", 1, 100, &v, &e) == -1);
    double d;
    CHECK(sl_parse_double("--lr", "1e-4", 0, 1, &d, &e) == 0 && d == 1e-4);
    CHECK(sl_parse_double("--lr", "nan", 0, 1, &d, &e) == -1);
    CHECK(sl_parse_double("--lr", "2", 0, 1, &d, &e) == -1);
    uint64_t b;
    CHECK(sl_parse_bytes("--mem", "512MiB", &b, &e) == 0 && b == 512ull << 20);
    CHECK(sl_parse_bytes("--mem", "2G", &b, &e) == 0 && b == 2ull << 30);
    CHECK(sl_parse_bytes("--mem", "1.5k", &b, &e) == 0 && b == 1536);
    CHECK(sl_parse_bytes("--mem", "12parsecs", &b, &e) == -1);
    CHECK(strstr(e.msg, "unknown unit") != NULL);
    CHECK(sl_parse_bytes("--mem", "-1", &b, &e) == -1);
    int64_t s;
    CHECK(sl_parse_duration("--ttl", "1h", &s, &e) == 0 && s == 3600);
    CHECK(sl_parse_duration("--ttl", "15m", &s, &e) == 0 && s == 900);
    CHECK(sl_parse_duration("--ttl", "90", &s, &e) == 0 && s == 90);
    CHECK(sl_parse_duration("--ttl", "1w", &s, &e) == -1);
}

static void test_mem(void)
{
    size_t r;
    CHECK(sl_mul_ok(1u << 20, 1u << 10, &r) && r == (1u << 30));
    CHECK(!sl_mul_ok(SIZE_MAX / 2, 3, &r));
    CHECK(!sl_add_ok(SIZE_MAX, 1, &r));
    CHECK(sl_add_sat_u64(3, 4) == 7 && sl_add_sat_u64(UINT64_MAX - 1, 1) == UINT64_MAX);
    CHECK(sl_add_sat_u64(UINT64_MAX, 1) == UINT64_MAX && sl_add_sat_u64(UINT64_MAX - 5, 9) == UINT64_MAX);
    float *p = sl_xaligned_alloc(1000);
    CHECK(((uintptr_t)p & 63) == 0);
    sl_aligned_free(p);
}

/* sl_mkdir: the mode it is given, an existing directory is fine, a file by
 * that name or a missing parent is an error naming the path. */
static void test_mkdir(void)
{
    char root[] = "/tmp/sl-mkdir-XXXXXX", d[64], f[64], deep[80];
    CHECK(mkdtemp(root) != NULL);
    snprintf(d, sizeof d, "%s/private", root);
    snprintf(f, sizeof f, "%s/file", root);
    snprintf(deep, sizeof deep, "%s/no/such", root);
    sl_err err = {0};
    mode_t old = umask(022);
    struct stat st;
    CHECK(sl_mkdir(d, 0700, &err) == 0 && stat(d, &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(sl_mkdir(d, 0700, &err) == 0);
    FILE *fp = fopen(f, "w");
    CHECK(fp != NULL);
    if (fp)
        fclose(fp);
    CHECK(sl_mkdir(f, 0755, &err) == -1 && strstr(err.msg, "not a directory"));
    CHECK(sl_mkdir(deep, 0755, &err) == -1 && strstr(err.msg, "cannot create") &&
          strstr(err.msg, deep));
    umask(old);
    unlink(f);
    rmdir(d);
    rmdir(root);
}

/* Private directories are made (or narrowed to) 0700 and say when they
 * changed; atomic writes are 0644 even under umask 000. */
static void test_private(void)
{
    char root[] = "/tmp/sl-private-XXXXXX", d[64], f[80];
    CHECK(mkdtemp(root) != NULL);
    snprintf(d, sizeof d, "%s/keys", root);
    snprintf(f, sizeof f, "%s/keys/x.json", root);
    mode_t old = umask(0), was = 0;
    struct stat st;
    sl_err err = {0};
    CHECK(sl_private_dir(d, &was, &err) == 0 && stat(d, &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(chmod(d, 0777) == 0);
    CHECK(sl_private_dir(d, &was, &err) == 1 && was == 0777);
    CHECK(stat(d, &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(sl_write_file_atomic(f, "{}", 2, &err) == 0 && stat(f, &st) == 0 &&
          (st.st_mode & 0777) == 0644);
    umask(old);
    unlink(f);
    rmdir(d);
    rmdir(root);
}

/* The one rule for names from the network: hostile ones refused, the
 * names the coordinator and devices use accepted. */
static void test_path_names(void)
{
    sl_err err = {0};
    static const char *const good[] = {"model.d0123456789abcdef.safetensors", "data.json",
                                       "j0123456789abcdef", "optim.d1.u3.safetensors", "a", "-x_",
                                       "config.json", "a..b"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        CHECKF(sl_path_name_check(good[i], strlen(good[i]), &err) == 0, "%s: %s", good[i], err.msg);
    static const char *const bad[] = {"", ".", "..", "../x", "/etc/passwd", "a/b", "a/", "/",
                                      ".hidden", "..x", "a b", "a\\b", "caf\xc3\xa9", "x\n",
                                      "x\x1b[31m", "~root", "a:b", "*", "$HOME"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECKF(sl_path_name_check(bad[i], strlen(bad[i]), &err) == -1, "'%s' accepted", bad[i]);
        CHECK(err.code == SL_EINVAL);
    }
    CHECK(sl_path_name_check(NULL, 0, &err) == -1);
    /* a NUL inside the bytes received: "model" would hide "/../x" */
    CHECK(sl_path_name_check("model\0/../x", 11, &err) == -1 && strstr(err.msg, "NUL"));
    CHECK(sl_path_name_check("../x", 4, &err) == -1 && strstr(err.msg, "'/'"));
    char longname[SL_PATH_NAME_MAX + 2];
    memset(longname, 'a', sizeof longname);
    longname[SL_PATH_NAME_MAX] = 0;
    CHECK(sl_path_name_check(longname, SL_PATH_NAME_MAX, &err) == 0);
    longname[SL_PATH_NAME_MAX] = 'a';
    longname[SL_PATH_NAME_MAX + 1] = 0;
    CHECK(sl_path_name_check(longname, SL_PATH_NAME_MAX + 1, &err) == -1 && strstr(err.msg, "at most"));
    /* a message never carries the raw bytes */
    CHECK(sl_path_name_check("\x1b]0;x\x07", 6, &err) == -1 && !strchr(err.msg, 0x1b));
}

/* Directories: made, opened without following a link, of this user only;
 * files inside created without following one either. */
static void test_dir_open(void)
{
    char root[] = "/tmp/sl-diropen-XXXXXX", p[128];
    CHECK(mkdtemp(root) != NULL);
    sl_err err = {0};
    int rfd = open(root, O_RDONLY | O_DIRECTORY);
    CHECK(rfd >= 0);
    mode_t old = umask(0);
    /* missing, without and with SL_DIR_CREATE */
    CHECK(sl_dir_open(rfd, "jobs", 0700, 0, &err) == -1 && strstr(err.msg, "jobs"));
    int d = sl_dir_open(rfd, "jobs", 0700, SL_DIR_CREATE, &err);
    struct stat st;
    CHECK(d >= 0 && fstat(d, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    /* again: it exists and is ours */
    int d2 = sl_dir_open(rfd, "jobs", 0700, SL_DIR_CREATE, &err);
    CHECK(d2 >= 0);
    if (d2 >= 0)
        close(d2);
    /* a mode wider than asked is narrowed */
    CHECK(mkdirat(rfd, "wide", 0777) == 0);
    d2 = sl_dir_open(rfd, "wide", 0700, SL_DIR_CREATE, &err);
    CHECK(d2 >= 0 && fstat(d2, &st) == 0 && (st.st_mode & 0777) == 0700);
    if (d2 >= 0)
        close(d2);
    /* a symbolic link to a directory is refused, not followed */
    snprintf(p, sizeof p, "%s/elsewhere", root);
    CHECK(mkdir(p, 0700) == 0);
    CHECK(symlinkat(p, rfd, "link") == 0);
    CHECK(sl_dir_open(rfd, "link", 0700, SL_DIR_CREATE, &err) == -1 &&
          strstr(err.msg, "symbolic link") && err.code == SL_EAUTH);
    /* a dangling one too: mkdirat does not create its target */
    snprintf(p, sizeof p, "%s/nowhere", root);
    CHECK(symlinkat(p, rfd, "dangling") == 0);
    CHECK(sl_dir_open(rfd, "dangling", 0700, SL_DIR_CREATE, &err) == -1 &&
          strstr(err.msg, "symbolic link"));
    CHECK(faccessat(rfd, "nowhere", F_OK, 0) != 0);
    /* a file by that name */
    int f = openat(rfd, "file", O_WRONLY | O_CREAT, 0600);
    CHECK(f >= 0);
    if (f >= 0)
        close(f);
    CHECK(sl_dir_open(rfd, "file", 0700, SL_DIR_CREATE, &err) == -1 &&
          strstr(err.msg, "not a directory"));
    /* another user's directory (as root: chown it to nobody) */
    if (geteuid() == 0) {
        CHECK(mkdirat(rfd, "theirs", 0700) == 0 && fchownat(rfd, "theirs", 65534, 65534, 0) == 0);
        CHECK(sl_dir_open(rfd, "theirs", 0700, SL_DIR_CREATE, &err) == -1 &&
              strstr(err.msg, "belongs to uid 65534") && err.code == SL_EAUTH);
        unlinkat(rfd, "theirs", AT_REMOVEDIR);
    } else {
        printf("  (another user's directory: not root, not checked)\n");
    }
    /* files inside: created and truncated; not through a link; names checked */
    if (d >= 0) {
        int w = sl_file_create_at(d, "model.safetensors", &err);
        CHECK(w >= 0 && write(w, "abc", 3) == 3);
        if (w >= 0)
            close(w);
        w = sl_file_create_at(d, "model.safetensors", &err);
        CHECK(w >= 0 && fstat(w, &st) == 0 && st.st_size == 0 && S_ISREG(st.st_mode));
        if (w >= 0)
            close(w);
        snprintf(p, sizeof p, "%s/file", root);
        CHECK(symlinkat(p, d, "data.json") == 0);
        CHECK(sl_file_create_at(d, "data.json", &err) == -1 && strstr(err.msg, "symbolic link"));
        CHECK(sl_file_create_at(d, "../file", &err) == -1);
        CHECK(sl_file_create_at(d, "..", &err) == -1);
        CHECK(fstatat(rfd, "file", &st, 0) == 0 && st.st_size == 0);
        close(d);
    }
    /* removal: files and links inside, not what the links point at */
    sl_dir_remove_at(rfd, "jobs");
    CHECK(faccessat(rfd, "jobs", F_OK, AT_SYMLINK_NOFOLLOW) != 0);
    CHECK(faccessat(rfd, "file", F_OK, 0) == 0);
    sl_dir_remove_at(rfd, "link"); /* a link is not removed through */
    CHECK(faccessat(rfd, "elsewhere", F_OK, 0) == 0);
    sl_dir_remove_at(rfd, "missing");
    umask(old);
    unlinkat(rfd, "link", 0);
    unlinkat(rfd, "dangling", 0);
    unlinkat(rfd, "file", 0);
    unlinkat(rfd, "wide", AT_REMOVEDIR);
    unlinkat(rfd, "elsewhere", AT_REMOVEDIR);
    close(rfd);
    CHECK(rmdir(root) == 0);
}

/* Control bytes from files never reach a terminal through a message. */
static void test_escape(void)
{
    char out[64], again[64];
    CHECK(!strcmp(sl_escape_ctl(out, sizeof out, "a\x1b[31mb\n\x7f"), "a\\x1b[31mb\\x0a\\x7f"));
    CHECK(!strcmp(sl_escape_ctl(out, sizeof out, "caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5"));
    /* C1 (CSI as UTF-8), a lone byte, a cut sequence, a surrogate */
    CHECK(!strcmp(sl_escape_ctl(out, sizeof out, "\xc2\x9b|\xff|\xe6\x97|\xed\xa0\x80"),
                  "\\xc2\\x9b|\\xff|\\xe6\\x97|\\xed\\xa0\\x80"));
    sl_escape_ctl(out, sizeof out, "x\x01y\xc3");
    CHECK(!strcmp(sl_escape_ctl(again, sizeof again, out), out));
    /* cut short, never in the middle of an escape, always terminated */
    CHECK(!strcmp(sl_escape_ctl(out, 6, "ab\x01" "cd"), "ab"));
    sl_err err = {0};
    sl_err_set(&err, SL_EINVAL, "tensor '%s'", "\x1b]0;owned\x07");
    CHECK(!strcmp(err.msg, "tensor '\\x1b]0;owned\\x07'"));
    sl_err_wrap(&err, "file \x1b");
    CHECK(!strncmp(err.msg, "file \\x1b: tensor", 17));
}

int main(void)
{
    RUN(test_err);
    RUN(test_parse);
    RUN(test_mem);
    RUN(test_mkdir);
    RUN(test_private);
    RUN(test_escape);
    RUN(test_path_names);
    RUN(test_dir_open);
    return sl_test_done();
}
