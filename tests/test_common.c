/* sl_err, sl_cli parsers, sl_mem size arithmetic, sl_mkdir, private
 * directories, escaping of control bytes. */
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
    return sl_test_done();
}
