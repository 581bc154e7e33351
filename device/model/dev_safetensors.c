#include "dev_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sl_file.h"
#include "sl_mem.h"

#define MAX_HEADER (100u << 20) /* the format's own limit */

struct dev_st {
    int fd;
    char *path;
    uint64_t size, data_start;
    dev_st_tensor *t;
    int n;
    json_t *meta; /* __metadata__, or NULL */
    int checked;  /* written by us: every tensor must have a checksum */
};

/* Our files carry a BLAKE2b-128 of every tensor's bytes in __metadata__
 * under "blake2b/<name>" (metadata is a free string map, so other readers
 * ignore it); files from elsewhere have none and are read unchecked. A file
 * with any checksum, or with our "skyloom." keys, is ours: from then on a
 * tensor without its checksum is an error, so damage cannot switch the
 * check off. */
#define HASH_BYTES 16
static void hash_hex(const void *p, size_t n, char out[2 * HASH_BYTES + 1])
{
    uint8_t h[HASH_BYTES];
    crypto_generichash(h, sizeof h, p, n, NULL, 0);
    sodium_bin2hex(out, 2 * HASH_BYTES + 1, h, sizeof h);
}

static int dtype_of(const char *s, size_t *esize)
{
    if (!strcmp(s, "F32")) {
        *esize = 4;
        return DEV_ST_F32;
    }
    if (!strcmp(s, "F16")) {
        *esize = 2;
        return DEV_ST_F16;
    }
    if (!strcmp(s, "BF16")) {
        *esize = 2;
        return DEV_ST_BF16;
    }
    static const struct {
        const char *n;
        size_t s;
    } other[] = {{"F64", 8}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1},
                 {"U16", 2}, {"U32", 4}, {"U64", 8}};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (!strcmp(s, other[i].n)) {
            *esize = other[i].s;
            return DEV_ST_OTHER;
        }
    return -1;
}

void dev_st_close(dev_st *st)
{
    if (!st)
        return;
    if (st->fd >= 0)
        close(st->fd);
    for (int i = 0; i < st->n; i++)
        free(st->t[i].name);
    free(st->t);
    free(st->path);
    json_decref(st->meta);
    free(st);
}

static int parse_tensor(dev_st *st, const char *name, json_t *v, uint64_t data_len,
                        dev_st_tensor *t, sl_err *err)
{
    memset(t, 0, sizeof *t);
    if (!json_is_object(v))
        return sl_err_set(err, SL_ECORRUPT, "%s: tensor '%s': entry is not an object", st->path, name);
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    json_t *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
    if (!dt || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2)
        return sl_err_set(err, SL_ECORRUPT, "%s: tensor '%s': needs dtype, shape, data_offsets",
                          st->path, name);
    size_t esize;
    t->dtype = dtype_of(dt, &esize);
    if (t->dtype < 0)
        return sl_err_set(err, SL_ECORRUPT, "%s: tensor '%s': unknown dtype '%.15s'", st->path,
                          name, dt);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt);
    size_t nd = json_array_size(shape);
    if (nd > DEV_ST_MAXDIM)
        return sl_err_set(err, SL_ECORRUPT, "%s: tensor '%s': %zu dimensions", st->path, name, nd);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return sl_err_set(err, SL_ECORRUPT, "%s: tensor '%s': bad shape", st->path, name);
        t->shape[i] = json_integer_value(d);
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel))
            return sl_err_set(err, SL_ECORRUPT, "%s: tensor '%s': shape overflows", st->path, name);
    }
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b) ||
        (uint64_t)json_integer_value(e) > data_len)
        return sl_err_set(err, SL_ECORRUPT,
                          "%s: tensor '%s': data_offsets outside the file (truncated?)", st->path,
                          name);
    uint64_t nbytes = (uint64_t)(json_integer_value(e) - json_integer_value(b)), want;
    if (__builtin_mul_overflow(numel, (uint64_t)esize, &want) || want != nbytes)
        return sl_err_set(err, SL_ECORRUPT,
                          "%s: tensor '%s': %llu bytes of data for %llu elements of %s", st->path,
                          name, (unsigned long long)nbytes, (unsigned long long)numel, dt);
    t->name = sl_xstrdup(name);
    t->numel = numel;
    t->offset = st->data_start + (uint64_t)json_integer_value(b);
    t->nbytes = nbytes;
    return 0;
}

/* __metadata__ is a map of strings (the format's rule); ours has checksums. */
static int check_meta(dev_st *st, json_t *v, sl_err *err)
{
    if (!json_is_object(v))
        return sl_err_set(err, SL_ECORRUPT, "%s: __metadata__ must be an object of strings",
                          st->path);
    const char *mk;
    json_t *mv;
    json_object_foreach(v, mk, mv)
    {
        if (!json_is_string(mv))
            return sl_err_set(err, SL_ECORRUPT,
                              "%s: __metadata__ must be an object of strings ('%s' is not)",
                              st->path, mk);
        st->checked |= !strncmp(mk, "blake2b/", 8) || !strncmp(mk, "skyloom.", 8);
    }
    st->meta = json_incref(v);
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    const dev_st_tensor *x = *(const dev_st_tensor *const *)a, *y = *(const dev_st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* The tensors cover the data exactly: no byte twice, none left over. */
static int check_layout(dev_st *st, sl_err *err)
{
    const dev_st_tensor **o = sl_xcalloc((size_t)(st->n ? st->n : 1), sizeof *o);
    for (int i = 0; i < st->n; i++)
        o[i] = &st->t[i];
    qsort(o, (size_t)st->n, sizeof *o, by_offset);
    uint64_t at = st->data_start;
    int rc = 0;
    for (int i = 0; i < st->n && !rc; i++) {
        if (o[i]->offset < at)
            rc = sl_err_set(err, SL_ECORRUPT, "%s: tensors '%s' and '%s' overlap", st->path,
                            o[i - 1]->name, o[i]->name);
        else if (o[i]->offset > at)
            rc = sl_err_set(err, SL_ECORRUPT,
                            "%s: %llu bytes before tensor '%s' belong to no tensor", st->path,
                            (unsigned long long)(o[i]->offset - at), o[i]->name);
        at = o[i]->offset + o[i]->nbytes;
    }
    if (!rc && at != st->size)
        rc = sl_err_set(err, SL_ECORRUPT,
                        "%s: %llu bytes of trailing data after the last tensor", st->path,
                        (unsigned long long)(st->size - at));
    free(o);
    return rc;
}

/* A checksum for a tensor the file does not have means a damaged header. */
static int check_sums_known(dev_st *st, sl_err *err)
{
    const char *mk;
    json_t *mv;
    json_object_foreach(st->meta, mk, mv)
    {
        if (strncmp(mk, "blake2b/", 8) != 0)
            continue;
        int found = 0;
        for (int i = 0; i < st->n && !found; i++)
            found = !strcmp(st->t[i].name, mk + 8);
        if (!found)
            return sl_err_set(err, SL_ECORRUPT,
                              "%s: a checksum for tensor '%s', which the file does not have "
                              "(damaged header?)",
                              st->path, mk + 8);
    }
    return 0;
}

int dev_st_checked(const dev_st *st) { return st->checked; }

dev_st *dev_st_open(const char *path, sl_err *err)
{
    dev_st *st = sl_xcalloc(1, sizeof *st);
    st->path = sl_xstrdup(path);
    st->fd = open(path, O_RDONLY | O_CLOEXEC);
    json_t *root = NULL;
    char *hdr = NULL;
    if (st->fd < 0) {
        sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(st->fd, &sb) || !S_ISREG(sb.st_mode)) {
        sl_err_set(err, SL_EIO, "%s: not a regular file", path);
        goto fail;
    }
    st->size = (uint64_t)sb.st_size;
    uint8_t lenb[8];
    if (st->size < 8 || pread(st->fd, lenb, 8, 0) != 8) {
        sl_err_set(err, SL_ECORRUPT, "%s: too short for a safetensors file", path);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenb[i];
    if (hlen < 2 || hlen > MAX_HEADER || hlen > st->size - 8) {
        sl_err_set(err, SL_ECORRUPT, "%s: bad header length %llu (file has %llu bytes)", path,
                   (unsigned long long)hlen, (unsigned long long)st->size);
        goto fail;
    }
    hdr = sl_try_malloc(hlen + 1);
    if (!hdr || pread(st->fd, hdr, hlen, 8) != (ssize_t)hlen) {
        sl_err_set(err, SL_EIO, "%s: cannot read the header", path);
        goto fail;
    }
    hdr[hlen] = 0;
    st->data_start = 8 + hlen;
    json_error_t je;
    root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        sl_err_set(err, SL_ECORRUPT, "%s: header is not a JSON object (%s)", path,
                   root ? "wrong type" : je.text);
        goto fail;
    }
    size_t cap = json_object_size(root);
    st->t = sl_xcalloc(cap ? cap : 1, sizeof *st->t);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (!strcmp(key, "__metadata__")) {
            if (check_meta(st, v, err))
                goto fail;
            continue;
        }
        if (parse_tensor(st, key, v, st->size - st->data_start, &st->t[st->n], err))
            goto fail;
        st->n++;
    }
    if (check_layout(st, err) || check_sums_known(st, err))
        goto fail;
    json_decref(root);
    free(hdr);
    return st;
fail:
    json_decref(root);
    free(hdr);
    dev_st_close(st);
    return NULL;
}

int dev_st_count(const dev_st *st) { return st->n; }
const dev_st_tensor *dev_st_at(const dev_st *st, int i) { return &st->t[i]; }
const dev_st_tensor *dev_st_find(const dev_st *st, const char *name)
{
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->t[i].name, name))
            return &st->t[i];
    return NULL;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, f;
    if (exp == 0) {
        if (man == 0) {
            f = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            f = sign | exp << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        f = sign | 0x7f800000u | man << 13;
    } else {
        f = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float r;
    memcpy(&r, &f, 4);
    return r;
}

int dev_st_read_f32(dev_st *st, const dev_st_tensor *t, uint64_t first, size_t count, float *dst,
                    sl_err *err)
{
    if (t->dtype == DEV_ST_OTHER)
        return sl_err_set(err, SL_EINVAL, "%s: tensor '%s' has dtype %s; F32, F16 or BF16 expected",
                          st->path, t->name, t->dtype_name);
    if (first > t->numel || count > t->numel - first)
        return sl_err_set(err, SL_EINVAL, "%s: tensor '%s': read past its end", st->path, t->name);
    char key[160];
    snprintf(key, sizeof key, "blake2b/%s", t->name);
    const char *sum = st->meta ? json_string_value(json_object_get(st->meta, key)) : NULL;
    int whole = first == 0 && count == t->numel;
    if (!sum && st->checked && whole)
        return sl_err_set(err, SL_ECORRUPT,
                          "%s: tensor '%s' has no checksum in a checksummed file (damaged "
                          "header?)",
                          st->path, t->name);
    int verify = sum && whole;
    crypto_generichash_state h;
    if (verify)
        crypto_generichash_init(&h, NULL, 0, HASH_BYTES);
    size_t es = t->dtype == DEV_ST_F32 ? 4 : 2;
    uint64_t off = t->offset + first * es;
    if (es == 4) {
        size_t want = count * 4, got = 0;
        while (got < want) {
            ssize_t r = pread(st->fd, (char *)dst + got, want - got, (off_t)(off + got));
            if (r <= 0)
                return sl_err_set(err, SL_EIO, "%s: tensor '%s': short read", st->path, t->name);
            got += (size_t)r;
        }
        /* little-endian host (x86-64, aarch64): the bytes are the floats */
        if (verify)
            crypto_generichash_update(&h, (const uint8_t *)dst, want);
    } else {
        uint16_t buf[4096];
        for (size_t done = 0; done < count;) {
            size_t k = count - done < 4096 ? count - done : 4096;
            if (pread(st->fd, buf, k * 2, (off_t)(off + done * 2)) != (ssize_t)(k * 2))
                return sl_err_set(err, SL_EIO, "%s: tensor '%s': short read", st->path, t->name);
            if (verify)
                crypto_generichash_update(&h, (const uint8_t *)buf, k * 2);
            for (size_t i = 0; i < k; i++) {
                if (t->dtype == DEV_ST_BF16) {
                    uint32_t f = (uint32_t)buf[i] << 16;
                    memcpy(&dst[done + i], &f, 4);
                } else {
                    dst[done + i] = half_to_float(buf[i]);
                }
            }
            done += k;
        }
    }
    if (verify) {
        uint8_t got[HASH_BYTES];
        char hex[2 * HASH_BYTES + 1];
        crypto_generichash_final(&h, got, sizeof got);
        sodium_bin2hex(hex, sizeof hex, got, sizeof got);
        if (strcmp(hex, sum) != 0)
            return sl_err_set(err, SL_ECORRUPT, "%s: tensor '%s': checksum mismatch (damaged file)",
                              st->path, t->name);
    }
    return 0;
}

const char *dev_st_meta(const dev_st *st, const char *key)
{
    return st->meta ? json_string_value(json_object_get(st->meta, key)) : NULL;
}

int dev_st_write(const char *path, const dev_st_out *t, int n, const char *const *extra,
                 sl_err *err)
{
    if (sodium_init() < 0)
        return sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
    json_t *root = json_object();
    json_t *meta = json_pack("{s:s}", "format", "pt");
    json_object_set_new(root, "__metadata__", meta);
    for (int i = 0; extra && extra[i] && extra[i + 1]; i += 2)
        json_object_set_new(meta, extra[i], json_string(extra[i + 1]));
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t count = 1;
        for (int d = 0; d < t[i].ndim; d++)
            count *= (size_t)t[i].shape[d];
        char key[160], hex[2 * HASH_BYTES + 1];
        snprintf(key, sizeof key, "blake2b/%s", t[i].name);
        hash_hex(t[i].data, count * 4, hex);
        json_object_set_new(meta, key, json_string(hex));
        uint64_t numel = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) {
            numel *= (uint64_t)t[i].shape[d];
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        }
        json_object_set_new(root, t[i].name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + numel * 4)));
        off += numel * 4;
    }
    char *h = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!h)
        return sl_err_set(err, SL_ENOMEM, "%s: cannot encode the header", path);
    size_t hl = strlen(h), padded = (hl + 7) & ~(size_t)7;
    sl_atomic a;
    if (sl_atomic_open(&a, path, err)) {
        free(h);
        return -1;
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    sl_atomic_write(&a, lenb, 8);
    sl_atomic_write(&a, h, hl);
    sl_atomic_write(&a, "        ", padded - hl); /* the format pads with spaces */
    free(h);
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++)
            numel *= (size_t)t[i].shape[d];
        sl_atomic_write(&a, t[i].data, numel * 4);
    }
    return sl_atomic_commit(&a, err);
}
