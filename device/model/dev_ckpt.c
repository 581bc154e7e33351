#include "dev_ckpt.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dev_hashed.h"
#include "sl_file.h"
#include "dev_safetensors.h"
#include "sl_mem.h"

/* ---- names -------------------------------------------------------------- */

typedef struct hf_part {
    char name[128];
    int ndim;
    int64_t shape[2];
    size_t offset; /* floats from the start of our tensor */
    size_t numel;
} hf_part;

/* Our tensor as Hugging Face tensors: 3 for the fused qkv, else 1. */
static int hf_parts(const dev_tensor *t, hf_part out[3])
{
    if (t->flags & DEV_T_QKV) {
        static const char *const which[3] = {"query", "key", "value"};
        const char *q = strstr(t->name, ".qkv.");
        int C = t->rows / 3;
        for (int i = 0; i < 3; i++) {
            snprintf(out[i].name, sizeof out[i].name, "%.*s.%s.%s", (int)(q - t->name), t->name,
                     which[i], q + 5);
            out[i].ndim = t->cols ? 2 : 1;
            out[i].shape[0] = C;
            out[i].shape[1] = t->cols;
            out[i].numel = (size_t)C * (size_t)(t->cols ? t->cols : 1);
            out[i].offset = (size_t)i * out[i].numel;
        }
        return 3;
    }
    snprintf(out[0].name, sizeof out[0].name, "%s", t->name);
    out[0].ndim = t->cols ? 2 : 1;
    out[0].shape[0] = t->rows;
    out[0].shape[1] = t->cols;
    out[0].numel = t->numel;
    out[0].offset = 0;
    return 1;
}

/* The save_* bodies write the host views as the last dev_stage_pull left
 * them: dev_ckpt_save_dir pulls once for both files. */
static int save_model_pulled(dev_stage *s, const char *path, sl_err *err)
{
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    float *p = dev_stage_params(s, NULL);
    dev_st_out *out = sl_xcalloc((size_t)nt * 3, sizeof *out);
    int n = 0;
    for (int k = 0; k < nt; k++) {
        hf_part parts[3];
        int np = hf_parts(&t[k], parts);
        for (int i = 0; i < np; i++, n++) {
            memcpy(out[n].name, parts[i].name, sizeof out[n].name);
            out[n].ndim = parts[i].ndim;
            out[n].shape[0] = parts[i].shape[0];
            out[n].shape[1] = parts[i].shape[1];
            out[n].data = p + t[k].offset + parts[i].offset;
        }
    }
    /* The step ties the model to the optimizer state saved with it. */
    char step[24], units[32];
    int u0, u1;
    dev_stage_units(s, &u0, &u1);
    snprintf(step, sizeof step, "%d", dev_stage_get_step(s));
    snprintf(units, sizeof units, "%d..%d", u0, u1);
    const char *meta[] = {"skyloom.step", step, "skyloom.units", units, NULL};
    int rc = dev_st_write(path, out, n, meta, err);
    free(out);
    return rc;
}

int dev_ckpt_save_model(dev_stage *s, const char *path, sl_err *err)
{
    return dev_stage_pull(s, err) ? -1 : save_model_pulled(s, path, err);
}

static int ignorable(const char *name)
{
    static const char *const prefixes[] = {"bert.pooler.", "cls.seq_relationship.",
                                           "bert.embeddings.position_ids",
                                           "cls.predictions.decoder.bias"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i])))
            return 1;
    return 0;
}

/* Every tensor in the file must belong to this model (any unit). */
static int check_unknown(const dev_config *c, dev_st *st, const char *path, sl_err *err)
{
    dev_tensor *all;
    int nall;
    size_t total;
    if (dev_model_layout(c, 1, dev_unit_head(c), &all, &nall, &total, err))
        return -1;
    /* the range 1..L+1 includes the head's decoder copy; add unit 0 */
    dev_tensor *emb;
    int nemb;
    if (dev_model_layout(c, 0, 0, &emb, &nemb, &total, err)) {
        free(all);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < dev_st_count(st) && rc == 0; i++) {
        const char *name = dev_st_at(st, i)->name;
        if (ignorable(name))
            continue;
        int found = 0;
        for (int k = 0; k < nall + nemb && !found; k++) {
            hf_part parts[3];
            int np = hf_parts(k < nall ? &all[k] : &emb[k - nall], parts);
            for (int j = 0; j < np; j++)
                found |= !strcmp(parts[j].name, name);
        }
        if (found)
            continue;
        int layer;
        if (sscanf(name, "bert.encoder.layer.%d.", &layer) == 1 && layer >= c->layers)
            rc = sl_err_set(err, SL_EINVAL,
                            "%s: tensor '%s': the file has layer %d but the config has %d layers",
                            path, name, layer, c->layers);
        else
            rc = sl_err_set(err, SL_EINVAL, "%s: unexpected tensor '%s' (not part of BERT MLM)",
                            path, name);
    }
    free(all);
    free(emb);
    return rc;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

int dev_ckpt_load_model(dev_stage *s, const char *path, sl_err *err)
{
    dev_st *st = dev_st_open(path, err);
    if (!st)
        return -1;
    int rc = check_unknown(dev_stage_config(s), st, path, err);
    if (!rc)
        rc = dev_stage_pull(s, err); /* the host view is the base of the copy below */
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    size_t np;
    float *p = dev_stage_params(s, &np);
    /* Load into a copy, so a file that fails halfway leaves the stage as it was. */
    float *tmp = rc ? NULL : sl_try_aligned_alloc(np * sizeof(float));
    if (!rc && !tmp)
        rc = sl_err_set(err, SL_ENOMEM, "cannot allocate %zu floats", np);
    if (tmp)
        memcpy(tmp, p, np * sizeof(float));
    for (int k = 0; k < nt && rc == 0; k++) {
        hf_part parts[3];
        int n = hf_parts(&t[k], parts);
        for (int i = 0; i < n && rc == 0; i++) {
            const dev_st_tensor *f = dev_st_find(st, parts[i].name);
            if (!f && (t[k].flags & DEV_T_TIED))
                f = dev_st_find(st, "bert.embeddings.word_embeddings.weight");
            if (!f) {
                rc = sl_err_set(err, SL_EINVAL, "%s: missing tensor '%s'", path, parts[i].name);
                break;
            }
            int same = f->ndim == parts[i].ndim;
            for (int d = 0; same && d < f->ndim; d++)
                same = f->shape[d] == parts[i].shape[d];
            if (!same) {
                char a[96], b[96];
                shape_str(a, sizeof a, f->ndim, f->shape);
                shape_str(b, sizeof b, parts[i].ndim, parts[i].shape);
                rc = sl_err_set(err, SL_EINVAL, "%s: tensor '%s' has shape %s, the config needs %s",
                                path, f->name, a, b);
                break;
            }
            rc = dev_st_read_f32(st, f, 0, parts[i].numel, tmp + t[k].offset + parts[i].offset, err);
        }
    }
    if (rc == 0) {
        memcpy(p, tmp, np * sizeof(float));
        rc = dev_stage_push(s, err);
    }
    sl_aligned_free(tmp);
    dev_st_close(st);
    return rc;
}

/* ---- optimizer state ---------------------------------------------------- */

#define OPT_MAGIC "SKYOPT01"
#define OPT_VERSION 1u
#define OPT_HEADER 64
#define OPT_HASH DEV_HASHED_SUM

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static void header_of(dev_stage *s, int kind, uint8_t h[OPT_HEADER])
{
    const dev_config *c = dev_stage_config(s);
    int u0, u1, nt;
    dev_stage_units(s, &u0, &u1);
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    uint64_t total = 0;
    for (int k = 0; k < nt; k++)
        total += t[k].numel;
    memset(h, 0, OPT_HEADER);
    memcpy(h, OPT_MAGIC, 8);
    put32(h + 8, OPT_VERSION);
    put32(h + 12, (uint32_t)kind);
    put64(h + 16, (uint64_t)dev_stage_get_step(s));
    put32(h + 24, (uint32_t)u0);
    put32(h + 28, (uint32_t)u1);
    put32(h + 32, (uint32_t)c->hidden);
    put32(h + 36, (uint32_t)c->layers);
    put32(h + 40, (uint32_t)c->vocab);
    put32(h + 44, (uint32_t)c->intermediate);
    put32(h + 48, (uint32_t)nt);
    put64(h + 56, total);
}

static int save_optim_pulled(dev_stage *s, int kind, const char *path, sl_err *err)
{
    dev_hashed o;
    if (dev_hashed_open(&o, path, err))
        return -1;
    uint8_t h[OPT_HEADER];
    header_of(s, kind, h);
    dev_hashed_write(&o, h, sizeof h);
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    for (int k = 0; k < nt; k++) {
        uint8_t rec[10];
        size_t len = strlen(t[k].name);
        rec[0] = (uint8_t)len;
        rec[1] = (uint8_t)(len >> 8);
        put64(rec + 2, t[k].numel);
        dev_hashed_write(&o, rec, 2);
        dev_hashed_write(&o, t[k].name, len);
        dev_hashed_write(&o, rec + 2, 8);
    }
    size_t np;
    float *mv = dev_stage_optim_state(s, &np);
    for (int which = 0; which < 2; which++)
        for (int k = 0; k < nt; k++)
            dev_hashed_write(&o, mv + (size_t)which * np + t[k].offset, t[k].numel * sizeof(float));
    return dev_hashed_commit(&o, err);
}

int dev_ckpt_save_optim(dev_stage *s, int kind, const char *path, sl_err *err)
{
    int rc = dev_stage_pull(s, err) ? -1 : save_optim_pulled(s, kind, path, err);
    dev_stage_drop_views(s);
    return rc;
}

/* Pass 1: the checksum over the whole file, before anything is trusted. */
static int verify_hash(FILE *f, uint64_t size, const char *path, sl_err *err)
{
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, OPT_HASH);
    static uint8_t buf[1 << 16];
    uint64_t left = size - OPT_HASH;
    while (left) {
        size_t k = left < sizeof buf ? (size_t)left : sizeof buf;
        if (fread(buf, 1, k, f) != k)
            return sl_err_set(err, SL_EIO, "%s: short read", path);
        crypto_generichash_update(&h, buf, k);
        left -= k;
    }
    uint8_t want[OPT_HASH], got[OPT_HASH];
    if (fread(want, 1, OPT_HASH, f) != OPT_HASH)
        return sl_err_set(err, SL_EIO, "%s: short read", path);
    crypto_generichash_final(&h, got, sizeof got);
    if (sodium_memcmp(want, got, OPT_HASH) != 0)
        return sl_err_set(err, SL_ECORRUPT, "%s: checksum mismatch (the file is damaged)", path);
    return 0;
}

int dev_ckpt_load_optim(dev_stage *s, int kind, const char *path, sl_err *err)
{
    if (sodium_init() < 0)
        return sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
    FILE *f = fopen(path, "rb");
    if (!f)
        return sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
    int rc = -1;
    struct stat sb;
    if (fstat(fileno(f), &sb) || (uint64_t)sb.st_size < OPT_HEADER + OPT_HASH) {
        sl_err_set(err, SL_ECORRUPT, "%s: too short for an optimizer state file", path);
        goto out;
    }
    if (verify_hash(f, (uint64_t)sb.st_size, path, err))
        goto out;
    rewind(f);
    uint8_t h[OPT_HEADER], want[OPT_HEADER];
    if (fread(h, 1, OPT_HEADER, f) != OPT_HEADER) {
        sl_err_set(err, SL_EIO, "%s: short read", path);
        goto out;
    }
    if (memcmp(h, OPT_MAGIC, 8) != 0 || get32(h + 8) != OPT_VERSION) {
        sl_err_set(err, SL_ECORRUPT, "%s: not a Skyloom optimizer state file (version 1)", path);
        goto out;
    }
    if (get32(h + 12) != (uint32_t)kind) {
        sl_err_set(err, SL_EINVAL, "%s: state of optimizer %s, this run uses %s", path,
                   get32(h + 12) == DEV_OPT_LAMB ? "lamb" : "adamw",
                   kind == DEV_OPT_LAMB ? "lamb" : "adamw");
        goto out;
    }
    uint64_t step = get64(h + 16);
    header_of(s, kind, want);
    if (memcmp(h + 24, want + 24, OPT_HEADER - 24) != 0 || step > 0x7fffffff) {
        sl_err_set(err, SL_EINVAL,
                   "%s: saved for units %u..%u of a model with hidden %u, %u layers, vocabulary "
                   "%u, intermediate %u; this stage is units %u..%u of %u/%u/%u/%u",
                   path, get32(h + 24), get32(h + 28), get32(h + 32), get32(h + 36),
                   get32(h + 40), get32(h + 44), get32(want + 24), get32(want + 28),
                   get32(want + 32), get32(want + 36), get32(want + 40), get32(want + 44));
        goto out;
    }
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    for (int k = 0; k < nt; k++) {
        uint8_t rec[8];
        char name[1024];
        if (fread(rec, 1, 2, f) != 2)
            goto short_read;
        size_t len = (size_t)rec[0] | (size_t)rec[1] << 8;
        if (len >= sizeof name || fread(name, 1, len, f) != len || fread(rec, 1, 8, f) != 8)
            goto short_read;
        name[len] = 0;
        if (strcmp(name, t[k].name) != 0) {
            sl_err_set(err, SL_EINVAL, "%s: tensor %d is '%s', expected '%s'", path, k, name,
                       t[k].name);
            goto out;
        }
        if (get64(rec) != t[k].numel) {
            sl_err_set(err, SL_EINVAL, "%s: tensor '%s' has %llu elements, expected %zu", path,
                       name, (unsigned long long)get64(rec), t[k].numel);
            goto out;
        }
    }
    size_t np;
    if (dev_stage_pull(s, err)) /* the parameters' host view goes back with the push below */
        goto out;
    float *mv = dev_stage_optim_state(s, &np);
    uint64_t pos = (uint64_t)ftell(f), need = 0;
    for (int k = 0; k < nt; k++)
        need += 2 * t[k].numel * sizeof(float);
    if (pos + need + OPT_HASH != (uint64_t)sb.st_size) {
        sl_err_set(err, SL_ECORRUPT, "%s: %llu bytes, expected %llu", path,
                   (unsigned long long)sb.st_size, (unsigned long long)(pos + need + OPT_HASH));
        goto out;
    }
    for (int which = 0; which < 2; which++)
        for (int k = 0; k < nt; k++)
            if (fread(mv + (size_t)which * np + t[k].offset, sizeof(float), t[k].numel, f) !=
                t[k].numel)
                goto short_read;
    if (dev_stage_push(s, err))
        goto out;
    dev_stage_set_step(s, (int)step);
    rc = 0;
    goto out;
short_read:
    sl_err_set(err, SL_ECORRUPT, "%s: truncated", path);
out:
    fclose(f);
    dev_stage_drop_views(s);
    return rc;
}

int dev_ckpt_load_dir(dev_stage *s, int kind, const char *dir, sl_err *err)
{
    size_t n = strlen(dir) + 32;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/model.safetensors", dir);
    int rc = -1, step = -1;
    dev_st *st = dev_st_open(p, err);
    if (st) {
        const char *v = dev_st_meta(st, "skyloom.step");
        step = v ? atoi(v) : -1;
        int ours = dev_st_checked(st);
        dev_st_close(st);
        /* a checkpoint is always ours, with checksums: a file without them
         * is not one (or its header lost them) */
        if (!ours)
            sl_err_set(err, SL_ECORRUPT, "%s has no checksums: not a checkpoint written by "
                       "skyloom, or its header is damaged", p);
        else
            rc = dev_ckpt_load_model(s, p, err);
    }
    if (!rc) {
        snprintf(p, n, "%s/optim.bin", dir);
        rc = dev_ckpt_load_optim(s, kind, p, err);
    }
    if (!rc && step != dev_stage_get_step(s))
        rc = sl_err_set(err, SL_EINVAL,
                        "%s: model.safetensors is of step %d, optim.bin of step %d (files of "
                        "different saves)",
                        dir, step, dev_stage_get_step(s));
    free(p);
    return rc;
}

int dev_ckpt_save_dir(dev_stage *s, int kind, const char *dir, sl_err *err)
{
    if (sl_mkdir(dir, 0755, err))
        return -1;
    size_t n = strlen(dir) + 32;
    char *p = sl_xmalloc(n);
    int rc;
    snprintf(p, n, "%s/model.safetensors", dir);
    rc = dev_stage_pull(s, err) ? -1 : save_model_pulled(s, p, err);
    if (!rc) {
        snprintf(p, n, "%s/optim.bin", dir);
        rc = save_optim_pulled(s, kind, p, err);
    }
    dev_stage_drop_views(s);
    if (!rc) {
        snprintf(p, n, "%s/config.json", dir);
        rc = dev_config_save(dev_stage_config(s), p, err);
    }
    free(p);
    return rc;
}
