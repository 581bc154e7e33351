/* dev_labels.c - a label vocabulary (dev_labels.h). */
#include "dev_labels.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_tok.h"
#include "sl_file.h"
#include "sl_mem.h"

struct dev_labels {
    int n;
    char *text;       /* "name\n" per label: what the hash covers */
    size_t text_len;
    char *names;      /* the same with '\n' -> '\0'; name[] points into it */
    const char **name;
    size_t *len;
    int32_t *slot;    /* open addressing: a label id, -1 empty */
    size_t mask;
    uint8_t hash[32];
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

int dev_label_ok(const char *s, size_t n, const char **why)
{
    if (n == 0) {
        *why = "is empty";
        return 0;
    }
    if (n > DEV_LABEL_MAX_BYTES) {
        *why = "is longer than 256 bytes";
        return 0;
    }
    if (dev_utf8_check(s, n) < n) {
        *why = "is not valid UTF-8";
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] < 0xa0)) {
            *why = c == '\t' ? "holds a tab" : "holds a control character";
            return 0;
        }
    }
    if (s[0] == ' ' || s[n - 1] == ' ') {
        *why = "starts or ends with a space";
        return 0;
    }
    return 1;
}

void dev_labels_free(dev_labels *l)
{
    if (!l)
        return;
    free(l->text);
    free(l->names);
    free(l->name);
    free(l->len);
    free(l->slot);
    free(l);
}

int dev_labels_find(const dev_labels *l, const char *s, size_t n)
{
    for (size_t i = hash_bytes(s, n) & l->mask;; i = (i + 1) & l->mask) {
        int32_t id = l->slot[i];
        if (id < 0)
            return -1;
        if (l->len[id] == n && memcmp(l->name[id], s, n) == 0)
            return id;
    }
}

/* Builds the label set from n names at (p[i], len[i]); the error names
 * `name` and the line (i + 1) at fault. */
static dev_labels *build(const char *const *p, const size_t *len, int n, const char *name,
                         sl_err *err)
{
    if (n < 2 || n > DEV_LABELS_MAX) {
        sl_err_set(err, SL_EINVAL, "%s: %d labels; a classification needs 2 to %d", name, n,
                   DEV_LABELS_MAX);
        return NULL;
    }
    dev_labels *l = sl_xcalloc(1, sizeof *l);
    l->n = n;
    for (int i = 0; i < n; i++) {
        const char *why;
        if (!dev_label_ok(p[i], len[i], &why)) {
            sl_err_set(err, SL_EINVAL, "%s: line %d: the label %s", name, i + 1, why);
            dev_labels_free(l);
            return NULL;
        }
        l->text_len += len[i] + 1;
    }
    l->text = sl_xmalloc(l->text_len);
    l->names = sl_xmalloc(l->text_len);
    l->name = sl_xmalloc((size_t)n * sizeof *l->name);
    l->len = sl_xmalloc((size_t)n * sizeof *l->len);
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap <<= 1;
    l->slot = sl_xmalloc(cap * sizeof *l->slot);
    for (size_t i = 0; i < cap; i++)
        l->slot[i] = -1;
    l->mask = cap - 1;
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        memcpy(l->text + o, p[i], len[i]);
        l->text[o + len[i]] = '\n';
        memcpy(l->names + o, p[i], len[i]);
        l->names[o + len[i]] = 0;
        l->name[i] = l->names + o;
        l->len[i] = len[i];
        o += len[i] + 1;
        int was = dev_labels_find(l, p[i], len[i]);
        if (was >= 0) {
            sl_err_set(err, SL_EINVAL, "%s: duplicate label '%.64s' on lines %d and %d", name,
                       l->name[i], was + 1, i + 1);
            dev_labels_free(l);
            return NULL;
        }
        size_t k = hash_bytes(p[i], len[i]) & l->mask;
        while (l->slot[k] >= 0)
            k = (k + 1) & l->mask;
        l->slot[k] = i;
    }
    if (sodium_init() < 0) {
        sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
        dev_labels_free(l);
        return NULL;
    }
    crypto_generichash(l->hash, 32, (const unsigned char *)l->text, l->text_len, NULL, 0);
    return l;
}

dev_labels *dev_labels_parse(const char *buf, size_t len, const char *name, sl_err *err)
{
    if (len == 0) {
        sl_err_set(err, SL_EINVAL, "%s: empty label file", name);
        return NULL;
    }
    int n = 0;
    for (size_t i = 0; i < len; i++)
        if (buf[i] == '\n' || i + 1 == len)
            n++;
    if (n > DEV_LABELS_MAX) {
        sl_err_set(err, SL_EINVAL, "%s: more than %d labels", name, DEV_LABELS_MAX);
        return NULL;
    }
    const char **p = sl_xmalloc((size_t)n * sizeof *p);
    size_t *ln = sl_xmalloc((size_t)n * sizeof *ln);
    int k = 0;
    for (size_t i = 0; i < len && k < n;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) : len;
        size_t m = e - i;
        if (m > 0 && buf[i + m - 1] == '\r')
            m--;
        if (m == 0 || memchr(buf + i, 0, m)) {
            sl_err_set(err, SL_EINVAL, "%s: line %d is %s", name, k + 1,
                       m == 0 ? "empty" : "not text (a NUL byte)");
            free(p);
            free(ln);
            return NULL;
        }
        p[k] = buf + i;
        ln[k++] = m;
        i = e + 1;
    }
    dev_labels *l = build(p, ln, k, name, err);
    free(p);
    free(ln);
    return l;
}

dev_labels *dev_labels_load(const char *path, sl_err *err)
{
    char *buf;
    size_t len;
    if (sl_read_file(path, (size_t)DEV_LABELS_MAX * (DEV_LABEL_MAX_BYTES + 2), &buf, &len, err))
        return NULL;
    dev_labels *l = dev_labels_parse(buf, len, path, err);
    free(buf);
    return l;
}

static int all_digits(const char *s)
{
    if (!*s || strlen(s) > 18)
        return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

static int by_bytes(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int by_number(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    long long u = strtoll(x, NULL, 10), v = strtoll(y, NULL, 10);
    return u != v ? (u < v ? -1 : 1) : strcmp(x, y);
}

dev_labels *dev_labels_from(const char *const *names, int n, int sort, const char *name,
                            sl_err *err)
{
    if (n < 0 || n > DEV_LABELS_MAX) {
        sl_err_set(err, SL_EINVAL, "%s: more than %d labels", name, DEV_LABELS_MAX);
        return NULL;
    }
    const char **p = sl_xmalloc(((size_t)n + 1) * sizeof *p);
    size_t *ln = sl_xmalloc(((size_t)n + 1) * sizeof *ln);
    memcpy(p, names, (size_t)n * sizeof *p);
    int numeric = 1;
    for (int i = 0; i < n; i++)
        numeric &= all_digits(p[i]);
    if (sort)
        qsort(p, (size_t)n, sizeof *p, numeric ? by_number : by_bytes);
    for (int i = 0; i < n; i++)
        ln[i] = strlen(p[i]);
    dev_labels *l = build(p, ln, n, name, err);
    free(p);
    free(ln);
    return l;
}

int dev_labels_count(const dev_labels *l) { return l->n; }
const char *dev_labels_name(const dev_labels *l, int id)
{
    return id >= 0 && id < l->n ? l->name[id] : NULL;
}
const char *const *dev_labels_names(const dev_labels *l) { return l->name; }
const char *dev_labels_text(const dev_labels *l, size_t *len)
{
    *len = l->text_len;
    return l->text;
}
void dev_labels_hash(const dev_labels *l, uint8_t out[32]) { memcpy(out, l->hash, 32); }
