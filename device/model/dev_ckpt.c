#include "dev_ckpt.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>
#include <fcntl.h>
#include <unistd.h>

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

/* ---- writing ------------------------------------------------------------ */

enum { W_PARAMS = 0, W_MOMENTS = 1 };

/* The units of stages st[0..n) as "a..b" ranges joined by commas, merged
 * where they touch or overlap: one stage of the whole model and any split
 * of it held together both give "0..L+1", and so do several replicas. */
static void units_str(dev_stage *const *st, int n, char *out, size_t cap)
{
    int lo[512], hi[512], k = 0;
    for (int i = 0; i < n && k < 512; i++, k++)
        dev_stage_units(st[i], &lo[k], &hi[k]);
    for (int i = 1; i < k; i++) /* insertion sort by first unit */
        for (int j = i; j > 0 && lo[j] < lo[j - 1]; j--) {
            int t = lo[j]; lo[j] = lo[j - 1]; lo[j - 1] = t;
            t = hi[j]; hi[j] = hi[j - 1]; hi[j - 1] = t;
        }
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < k && o < cap; i++) {
        int a = lo[i], b = hi[i];
        while (i + 1 < k && lo[i + 1] <= b + 1) { /* touching, or overlapping (replicas) */
            i++;
            b = hi[i] > b ? hi[i] : b;
        }
        o += (size_t)snprintf(out + o, cap - o, "%s%d..%d", o ? "," : "", a, b);
    }
}

/* The host views as the last dev_stage_pull left them, as safetensors
 * entries: parameters, or the two moments (NAME.exp_avg, NAME.exp_avg_sq).
 * The head's copy of the word embeddings is left out when a stage of the set
 * holds unit 0 (the two are equal). */
static dev_st_out *collect(dev_stage *const *st, int n, int what, int unit, int *count)
{
    int total = 0, has_embed = 0;
    for (int i = 0; i < n; i++) {
        int nt, u0, u1;
        dev_stage_tensors(st[i], &nt);
        dev_stage_units(st[i], &u0, &u1);
        total += nt;
        has_embed |= u0 == 0;
    }
    dev_st_out *out = sl_xcalloc((size_t)total * 6 + 1, sizeof *out);
    int k = 0;
    for (int i = 0; i < n; i++) {
        int nt;
        const dev_tensor *t = dev_stage_tensors(st[i], &nt);
        size_t np;
        float *p = what == W_PARAMS ? dev_stage_params(st[i], &np) : dev_stage_optim_state(st[i], &np);
        for (int j = 0; j < nt; j++) {
            if (((t[j].flags & DEV_T_TIED) && has_embed) || (unit >= 0 && t[j].unit != unit))
                continue;
            hf_part parts[3];
            int nparts = hf_parts(&t[j], parts);
            for (int moment = 0; moment < (what == W_PARAMS ? 1 : 2); moment++)
                for (int q = 0; q < nparts; q++, k++) {
                    if (what == W_PARAMS)
                        memcpy(out[k].name, parts[q].name, sizeof out[k].name);
                    else
                        snprintf(out[k].name, sizeof out[k].name, "%.100s.%s", parts[q].name,
                                 moment ? "exp_avg_sq" : "exp_avg");
                    out[k].ndim = parts[q].ndim;
                    out[k].shape[0] = parts[q].shape[0];
                    out[k].shape[1] = parts[q].shape[1];
                    out[k].data = p + (size_t)moment * np + t[j].offset + parts[q].offset;
                }
        }
    }
    *count = k;
    return out;
}

static const char *optim_name(int kind) { return kind == DEV_OPT_LAMB ? "lamb" : "adamw"; }

/* The stages' tensors (unit >= 0: that unit's only) as a safetensors file. */
static int write_pulled(dev_stage *const *st, int n, int what, int kind, int unit, const char *path,
                        sl_err *err)
{
    int count;
    dev_st_out *out = collect(st, n, what, unit, &count);
    char step[24], units[256];
    snprintf(step, sizeof step, "%d", dev_stage_get_step(st[0]));
    if (unit >= 0)
        snprintf(units, sizeof units, "%d..%d", unit, unit);
    else
        units_str(st, n, units, sizeof units);
    const char *meta[] = {"skyloom.step", step, "skyloom.units", units,
                          what == W_PARAMS ? NULL : "skyloom.optimizer", optim_name(kind), NULL};
    int rc = dev_st_write(path, out, count, meta, err);
    free(out);
    return rc;
}

int dev_ckpt_save_model(dev_stage *s, const char *path, sl_err *err)
{
    return dev_stage_pull(s, err) ? -1 : write_pulled(&s, 1, W_PARAMS, 0, -1, path, err);
}

/* Tensors a BERT file may hold that the model does not use: for MLM the
 * pooler and the NSP head; to classify the pre-training heads (an MLM or
 * BertForPreTraining checkpoint starts a classifier). */
static int ignorable(const dev_config *c, const char *name)
{
    static const char *const mlm[] = {"bert.pooler.", "cls.seq_relationship.",
                                      "bert.embeddings.position_ids",
                                      "cls.predictions.decoder.bias"};
    static const char *const cls[] = {"cls.", "bert.embeddings.position_ids"};
    int classify = c->task == DEV_TASK_CLASSIFY;
    const char *const *p = classify ? cls : mlm;
    size_t n = classify ? sizeof cls / sizeof cls[0] : sizeof mlm / sizeof mlm[0];
    for (size_t i = 0; i < n; i++)
        if (!strncmp(name, p[i], strlen(p[i])))
            return 1;
    return 0;
}

/* A tensor of the classification head, which --init may start afresh. */
static int cls_head_tensor(const dev_config *c, const dev_tensor *t)
{
    return c->task == DEV_TASK_CLASSIFY && t->unit == dev_unit_head(c);
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
        if (ignorable(c, name))
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
        else if (!strncmp(name, "classifier.", 11))
            rc = sl_err_set(err, SL_EINVAL, "%s: unexpected tensor '%s': the file holds a "
                            "classification head (--task classify and skyloom predict read it)",
                            path, name);
        else
            rc = sl_err_set(err, SL_EINVAL, "%s: unexpected tensor '%s' (not part of BERT %s)",
                            path, name, c->task == DEV_TASK_CLASSIFY ? "for sequence "
                            "classification" : "MLM");
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

/* The file's tensor for part `part` of t, with the shape the config needs
 * (the head's tied copy may be the word embeddings); NULL and err if not. */
static const dev_st_tensor *file_tensor(const dev_st *st, const dev_tensor *t, const hf_part *part,
                                        const char *path, sl_err *err)
{
    const dev_st_tensor *f = dev_st_find(st, part->name);
    if (!f && (t->flags & DEV_T_TIED))
        f = dev_st_find(st, "bert.embeddings.word_embeddings.weight");
    if (!f) {
        sl_err_set(err, SL_EINVAL, "%s: missing tensor '%s'", path, part->name);
        return NULL;
    }
    int same = f->ndim == part->ndim;
    for (int d = 0; same && d < f->ndim; d++)
        same = f->shape[d] == part->shape[d];
    if (!same) {
        char a[96], b[96];
        shape_str(a, sizeof a, f->ndim, f->shape);
        shape_str(b, sizeof b, part->ndim, part->shape);
        sl_err_set(err, SL_EINVAL, "%s: tensor '%s' has shape %s, the config needs %s", path,
                   f->name, a, b);
        return NULL;
    }
    return f;
}

int dev_ckpt_check_model(const dev_config *c, const char *path, sl_err *err)
{
    dev_st *st = dev_st_open(path, err);
    if (!st)
        return -1;
    dev_tensor *t = NULL;
    int nt = 0;
    size_t np;
    int rc = check_unknown(c, st, path, err) ||
             dev_model_layout(c, 0, dev_unit_count(c) - 1, &t, &nt, &np, err);
    for (int k = 0; k < nt && rc == 0; k++) {
        hf_part parts[3];
        int n = hf_parts(&t[k], parts);
        for (int i = 0; i < n && rc == 0; i++)
            if (!cls_head_tensor(c, &t[k]) || dev_st_find(st, parts[i].name))
                rc = file_tensor(st, &t[k], &parts[i], path, err) ? 0 : -1;
    }
    free(t);
    dev_st_close(st);
    return rc ? -1 : 0;
}

/* dev_ckpt_load_model; with `fresh` non-NULL, tensors of the classification
 * head that the file lacks keep the stage's values, and their names go to
 * fresh (comma-separated, cut to cap). */
static int load_model(dev_stage *s, const char *path, char *fresh, size_t cap, sl_err *err)
{
    dev_st *st = dev_st_open(path, err);
    if (!st)
        return -1;
    size_t used = 0;
    if (fresh && cap)
        fresh[0] = 0;
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
            if (fresh && cls_head_tensor(dev_stage_config(s), &t[k]) &&
                !dev_st_find(st, parts[i].name)) {
                if (used < cap)
                    used += (size_t)snprintf(fresh + used, cap - used, "%s%s", used ? ", " : "",
                                             parts[i].name);
                continue;
            }
            const dev_st_tensor *f = file_tensor(st, &t[k], &parts[i], path, err);
            rc = f ? dev_st_read_f32(st, f, 0, parts[i].numel, tmp + t[k].offset + parts[i].offset, err)
                   : -1;
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

int dev_ckpt_load_model(dev_stage *s, const char *path, sl_err *err)
{
    return load_model(s, path, NULL, 0, err);
}

int dev_ckpt_init_model(dev_stage *s, const char *path, char *fresh, size_t cap, sl_err *err)
{
    return load_model(s, path, fresh, cap, err);
}


/* ---- checkpoint directories ---------------------------------------------- */

#define MANIFEST "manifest.json"
#define MANIFEST_FORMAT "skyloom-checkpoint"
#define MANIFEST_VERSION 1

static void hex_of(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int dev_ckpt_file_of(const char *dir, const char *name, dev_ckpt_file *out, sl_err *err)
{
    if (strlen(name) >= sizeof out->name || strchr(name, '/') || !strcmp(name, "..") ||
        !strcmp(name, "."))
        return sl_err_set(err, SL_EINVAL, "'%s' is not a checkpoint file name", name);
    if (sodium_init() < 0)
        return sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
    char *path = join(dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    int rc = -1;
    struct stat sb;
    if (fd < 0) {
        sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        sl_err_set(err, SL_EIO, "%s: not a regular file", path);
        goto out;
    }
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, sizeof out->blake2b);
    static __thread uint8_t buf[1 << 16];
    uint64_t total = 0;
    for (;;) {
        ssize_t k = read(fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            sl_err_set(err, SL_EIO, "%s: %s", path, strerror(errno));
            goto out;
        }
        if (k == 0)
            break;
        crypto_generichash_update(&h, buf, (size_t)k);
        total += (uint64_t)k;
    }
    crypto_generichash_final(&h, out->blake2b, sizeof out->blake2b);
    snprintf(out->name, sizeof out->name, "%s", name);
    out->bytes = total;
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(path);
    return rc;
}

int dev_ckpt_write_part(dev_stage *const *st, int n, int kind, const char *dir, const char *tag,
                        dev_ckpt_file files[2], sl_err *err)
{
    if (n < 1)
        return sl_err_set(err, SL_EINVAL, "a checkpoint part needs a stage");
    for (int i = 1; i < n; i++)
        if (dev_stage_get_step(st[i]) != dev_stage_get_step(st[0]))
            return sl_err_set(err, SL_EINVAL, "stages at steps %d and %d cannot share a checkpoint",
                              dev_stage_get_step(st[0]), dev_stage_get_step(st[i]));
    if (tag && (strchr(tag, '/') || strlen(tag) > 40))
        return sl_err_set(err, SL_EINVAL, "bad checkpoint part tag '%s'", tag);
    if (sl_mkdir(dir, 0755, err))
        return -1;
    char names[2][96];
    int tagged = tag && tag[0];
    snprintf(names[0], sizeof names[0], tagged ? "model.%s.safetensors" : "model.safetensors", tag);
    snprintf(names[1], sizeof names[1], tagged ? "optim.%s.safetensors" : "optim.safetensors", tag);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = dev_stage_pull(st[i], err);
    for (int what = 0; what < 2 && !rc; what++) {
        char *path = join(dir, names[what]);
        rc = write_pulled(st, n, what, kind, -1, path, err);
        free(path);
    }
    for (int i = 0; i < n; i++)
        dev_stage_drop_views(st[i]);
    for (int what = 0; what < 2 && !rc; what++)
        rc = dev_ckpt_file_of(dir, names[what], &files[what], err);
    return rc;
}

int dev_ckpt_write_unit_parts(dev_stage *const *st, int n, int kind, const char *dir,
                              const char *tag, dev_ckpt_file **files, int *nfiles, sl_err *err)
{
    *files = NULL;
    *nfiles = 0;
    if (n < 1 || !tag || !tag[0] || strchr(tag, '/') || strchr(tag, '.') || strlen(tag) > 40)
        return sl_err_set(err, SL_EINVAL, "unit parts need stages and a tag, not '%s'", tag ? tag : "");
    for (int i = 1; i < n; i++)
        if (dev_stage_get_step(st[i]) != dev_stage_get_step(st[0]))
            return sl_err_set(err, SL_EINVAL, "stages at steps %d and %d cannot share a checkpoint",
                              dev_stage_get_step(st[0]), dev_stage_get_step(st[i]));
    if (sl_mkdir(dir, 0755, err))
        return -1;
    int lo = 1 << 30, hi = -1;
    for (int i = 0; i < n; i++) {
        int u0, u1;
        dev_stage_units(st[i], &u0, &u1);
        lo = u0 < lo ? u0 : lo;
        hi = u1 > hi ? u1 : hi;
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = dev_stage_pull(st[i], err);
    *files = sl_xcalloc(2 * (size_t)(hi - lo + 1) + 1, sizeof **files);
    for (int u = lo; u <= hi && !rc; u++) {
        int held = 0;
        for (int i = 0; i < n; i++) {
            int u0, u1;
            dev_stage_units(st[i], &u0, &u1);
            held |= u >= u0 && u <= u1;
        }
        for (int what = 0; what < 2 && held && !rc; what++) {
            char name[96];
            snprintf(name, sizeof name, "%s.%s-u%d.safetensors", what == W_PARAMS ? "model" : "optim",
                     tag, u);
            char *path = join(dir, name);
            rc = write_pulled(st, n, what, kind, u, path, err) ||
                 dev_ckpt_file_of(dir, name, &(*files)[*nfiles], err);
            *nfiles += !rc;
            free(path);
        }
    }
    for (int i = 0; i < n; i++)
        dev_stage_drop_views(st[i]);
    if (rc) {
        free(*files);
        *files = NULL;
        *nfiles = 0;
    }
    return rc ? -1 : 0;
}

/* unit < 0: every tensor of the stages; else unit's alone (the head's copy
 * of the word embeddings always in the head's) */
static int write_extra(const char *dir, const char *name, const dev_ckpt_extra *x, int n, int step,
                       int unit, dev_ckpt_file *file, sl_err *err)
{
    size_t nlen = strlen(name);
    if (strncmp(name, "fed.", 4) || nlen < 15 || nlen >= sizeof file->name ||
        strcmp(name + nlen - 12, ".safetensors") || strchr(name, '/'))
        return sl_err_set(err, SL_EINVAL, "'%s' is not a fed part's name (fed[.TAG].safetensors)",
                          name);
    int total = 0;
    for (int i = 0; i < n; i++) {
        int nt;
        dev_stage_tensors(x[i].st, &nt);
        total += 3 * nt;
    }
    dev_st_out *out = sl_xcalloc((size_t)total + 1, sizeof *out);
    int k = 0, rc = 0;
    dev_stage *st[512] = {0};
    int nst = 0;
    /* one state (prefix and suffix) after another, each in the order its
     * stages come: the file is the same whatever the cuts */
    int *order = sl_xcalloc((size_t)n + 1, sizeof *order), no = 0;
    for (int i = 0; i < n; i++) {
        int lead = 1;
        for (int j = 0; j < i && lead; j++)
            lead = strcmp(x[j].prefix, x[i].prefix) || strcmp(x[j].suffix, x[i].suffix);
        for (int j = i; lead && j < n; j++)
            if (!strcmp(x[j].prefix, x[i].prefix) && !strcmp(x[j].suffix, x[i].suffix))
                order[no++] = j;
    }
    for (int oi = 0; oi < n && !rc; oi++) {
        int i = order[oi];
        /* the head's copy is left out where the same state of unit 0 is written */
        int has_embed = 0;
        for (int j = 0; j < n && unit < 0; j++) {
            int u0, u1;
            dev_stage_units(x[j].st, &u0, &u1);
            has_embed |= u0 == 0 && !strcmp(x[j].prefix, x[i].prefix) &&
                         !strcmp(x[j].suffix, x[i].suffix);
        }
        int seen = 0;
        for (int j = 0; j < nst; j++)
            seen |= st[j] == x[i].st;
        if (!seen && nst < 512)
            st[nst++] = x[i].st;
        int nt;
        const dev_tensor *t = dev_stage_tensors(x[i].st, &nt);
        for (int j = 0; j < nt && !rc; j++) {
            if (((t[j].flags & DEV_T_TIED) && has_embed) || (unit >= 0 && t[j].unit != unit))
                continue;
            hf_part parts[3];
            int np = hf_parts(&t[j], parts);
            for (int q = 0; q < np; q++, k++) {
                int w = snprintf(out[k].name, sizeof out[k].name, "%s%s%s", x[i].prefix,
                                 parts[q].name, x[i].suffix);
                if (w < 0 || (size_t)w >= sizeof out[k].name) {
                    rc = sl_err_set(err, SL_EINVAL, "name '%s%s%s' too long", x[i].prefix,
                                    parts[q].name, x[i].suffix);
                    break;
                }
                out[k].ndim = parts[q].ndim;
                out[k].shape[0] = parts[q].shape[0];
                out[k].shape[1] = parts[q].shape[1];
                out[k].data = x[i].data + t[j].offset + parts[q].offset;
            }
        }
    }
    char steps[24], units[256];
    snprintf(steps, sizeof steps, "%d", step);
    units_str(st, nst, units, sizeof units);
    const char *meta[] = {"skyloom.step", steps, "skyloom.units", units, NULL};
    char *path = join(dir, name);
    if (!rc)
        rc = dev_st_write(path, out, k, meta, err) || dev_ckpt_file_of(dir, name, file, err);
    free(path);
    free(out);
    free(order);
    return rc ? -1 : 0;
}

int dev_ckpt_write_extra(const char *dir, const char *name, const dev_ckpt_extra *x, int n,
                         int step, dev_ckpt_file *file, sl_err *err)
{
    return write_extra(dir, name, x, n, step, -1, file, err);
}

int dev_ckpt_write_extra_unit(const char *dir, const char *name, const dev_ckpt_extra *x, int n,
                              int step, int unit, dev_ckpt_file *file, sl_err *err)
{
    if (unit < 0)
        return sl_err_set(err, SL_EINVAL, "unit %d", unit);
    return write_extra(dir, name, x, n, step, unit, file, err);
}

int dev_ckpt_write_manifest(const char *dir, int step, int kind, int bf16, const dev_ckpt_file *f,
                            int n, sl_err *err)
{
    json_t *files = json_array();
    for (int i = 0; i < n; i++) {
        char hex[65];
        hex_of(f[i].blake2b, sizeof f[i].blake2b, hex);
        json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "name", f[i].name, "bytes",
                                               (json_int_t)f[i].bytes, "blake2b", hex));
    }
    json_t *m = json_pack("{s:s, s:i, s:i, s:s, s:s, s:o}", "format", MANIFEST_FORMAT, "version",
                          MANIFEST_VERSION, "step", step, "optimizer", optim_name(kind),
                          "optim_state", bf16 ? "bf16" : "fp32", "files", files);
    char *text = m ? json_dumps(m, JSON_INDENT(2)) : NULL;
    json_decref(m);
    if (!text)
        return sl_err_set(err, SL_ENOMEM, "cannot encode the manifest");
    char *path = join(dir, MANIFEST);
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps leaves room for the NUL: write it as a newline */
    int rc = sl_write_file_atomic(path, text, len + 1, err);
    free(path);
    free(text);
    return rc;
}

int dev_ckpt_save(dev_stage *const *st, int n, int kind, const char *dir,
                  const char *const *extra, int n_extra, sl_err *err)
{
    dev_ckpt_file *f = sl_xcalloc((size_t)n_extra + 3, sizeof *f);
    int nf = 2, rc = dev_ckpt_write_part(st, n, kind, dir, NULL, f, err);
    if (!rc) {
        char *path = join(dir, "config.json");
        rc = dev_config_save(dev_stage_config(st[0]), path, err) ||
             dev_ckpt_file_of(dir, "config.json", &f[nf++], err);
        free(path);
    }
    for (int i = 0; i < n_extra && !rc; i++)
        rc = dev_ckpt_file_of(dir, extra[i], &f[nf++], err);
    if (!rc)
        rc = dev_ckpt_write_manifest(dir, dev_stage_get_step(st[0]), kind,
                                     dev_stage_bf16_state(st[0]), f, nf, err);
    free(f);
    return rc ? -1 : 0;
}

/* ---- reading ------------------------------------------------------------- */

/* The earlier optimizer file (optim.bin): a 64-byte header (magic
 * "SKYOPT01", version 1, optimizer, step, units, model shape, tensor count,
 * element count), a table of (u16 name length, name, u64 elements), every
 * first moment, every second moment, BLAKE2b-256 of all that. Its names are
 * ours (the fused qkv), read here by name like the new format. */
#define LEGACY_MAGIC "SKYOPT01"
#define LEGACY_HEADER 64
#define LEGACY_MAX_TENSORS 100000

typedef struct legacy {
    int fd;
    char *path;
    int kind, step, nt;
    char **name;
    uint64_t *numel, *off; /* elements, offset in elements from the first tensor */
    uint64_t data, total;  /* file offset of the first moments, elements per moment */
} legacy;

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static void legacy_close(legacy *lg)
{
    if (!lg)
        return;
    if (lg->fd >= 0)
        close(lg->fd);
    for (int i = 0; lg->name && i < lg->nt; i++)
        free(lg->name[i]);
    free(lg->name);
    free(lg->numel);
    free(lg->off);
    free(lg->path);
    free(lg);
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

static legacy *legacy_open(const char *path, const dev_config *c, sl_err *err)
{
    legacy *lg = sl_xcalloc(1, sizeof *lg);
    lg->fd = -1;
    lg->path = sl_xstrdup(path);
    dev_ckpt_file sum;
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path)) : sl_xstrdup(".");
    int rc = dev_ckpt_file_of(dir, slash ? slash + 1 : path, &sum, err);
    free(dir);
    if (rc)
        goto fail;
    lg->fd = open(path, O_RDONLY | O_CLOEXEC);
    uint8_t h[LEGACY_HEADER], want[DEV_HASHED_SUM], got[DEV_HASHED_SUM];
    if (lg->fd < 0 || sum.bytes < LEGACY_HEADER + DEV_HASHED_SUM ||
        pread_all(lg->fd, h, sizeof h, 0)) {
        sl_err_set(err, SL_ECORRUPT, "%s: too short for an optimizer state file", path);
        goto fail;
    }
    /* the trailer is the sum of everything before it */
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, DEV_HASHED_SUM);
    static __thread uint8_t buf[1 << 16];
    for (uint64_t o = 0, end = sum.bytes - DEV_HASHED_SUM; o < end;) {
        size_t k = end - o < sizeof buf ? (size_t)(end - o) : sizeof buf;
        if (pread_all(lg->fd, buf, k, o)) {
            sl_err_set(err, SL_EIO, "%s: short read", path);
            goto fail;
        }
        crypto_generichash_update(&st, buf, k);
        o += k;
    }
    crypto_generichash_final(&st, got, sizeof got);
    if (pread_all(lg->fd, want, sizeof want, sum.bytes - DEV_HASHED_SUM) ||
        sodium_memcmp(want, got, DEV_HASHED_SUM) != 0) {
        sl_err_set(err, SL_ECORRUPT, "%s: checksum mismatch (the file is damaged)", path);
        goto fail;
    }
    if (memcmp(h, LEGACY_MAGIC, 8) != 0 || get32(h + 8) != 1) {
        sl_err_set(err, SL_ECORRUPT, "%s: not a Skyloom optimizer state file (version 1)", path);
        goto fail;
    }
    lg->kind = (int)get32(h + 12);
    uint64_t step = get64(h + 16);
    if ((lg->kind != DEV_OPT_ADAMW && lg->kind != DEV_OPT_LAMB) || step > 0x7fffffff) {
        sl_err_set(err, SL_ECORRUPT, "%s: optimizer %d at step %llu", path, lg->kind,
                   (unsigned long long)step);
        goto fail;
    }
    lg->step = (int)step;
    if (get32(h + 32) != (uint32_t)c->hidden || get32(h + 36) != (uint32_t)c->layers ||
        get32(h + 40) != (uint32_t)c->vocab || get32(h + 44) != (uint32_t)c->intermediate) {
        sl_err_set(err, SL_EINVAL,
                   "%s: saved for a model with hidden %u, %u layers, vocabulary %u, intermediate "
                   "%u; this one has %d/%d/%d/%d",
                   path, get32(h + 32), get32(h + 36), get32(h + 40), get32(h + 44), c->hidden,
                   c->layers, c->vocab, c->intermediate);
        goto fail;
    }
    uint32_t nt = get32(h + 48);
    lg->total = get64(h + 56);
    if (nt > LEGACY_MAX_TENSORS || lg->total > (sum.bytes / 8)) {
        sl_err_set(err, SL_ECORRUPT, "%s: %u tensors of %llu elements do not fit the file", path,
                   nt, (unsigned long long)lg->total);
        goto fail;
    }
    lg->name = sl_xcalloc(nt ? nt : 1, sizeof *lg->name);
    lg->numel = sl_xcalloc(nt ? nt : 1, sizeof *lg->numel);
    lg->off = sl_xcalloc(nt ? nt : 1, sizeof *lg->off);
    uint64_t pos = LEGACY_HEADER, acc = 0;
    for (uint32_t k = 0; k < nt; k++) {
        uint8_t rec[8];
        if (pread_all(lg->fd, rec, 2, pos))
            goto truncated;
        size_t len = (size_t)rec[0] | (size_t)rec[1] << 8;
        lg->name[k] = sl_xmalloc(len + 1);
        lg->nt++; /* counted as soon as it is held, so that legacy_close frees it */
        if (pread_all(lg->fd, lg->name[k], len, pos + 2) || pread_all(lg->fd, rec, 8, pos + 2 + len))
            goto truncated;
        lg->name[k][len] = 0;
        lg->numel[k] = get64(rec);
        lg->off[k] = acc;
        if (lg->numel[k] > lg->total - acc)
            goto truncated;
        acc += lg->numel[k];
        pos += 2 + len + 8;
    }
    lg->data = pos;
    if (acc != lg->total || pos + 2 * 4 * lg->total + DEV_HASHED_SUM != sum.bytes) {
        sl_err_set(err, SL_ECORRUPT, "%s: %llu bytes, the table describes %llu", path,
                   (unsigned long long)sum.bytes,
                   (unsigned long long)(pos + 2 * 4 * acc + DEV_HASHED_SUM));
        goto fail;
    }
    return lg;
truncated:
    sl_err_set(err, SL_ECORRUPT, "%s: truncated tensor table", path);
fail:
    legacy_close(lg);
    return NULL;
}

/* Moment `which` (0 first, 1 second) of tensor `name` into dst (count). */
static int legacy_read(legacy *lg, const char *name, int which, float *dst, size_t count, int *found,
                       sl_err *err)
{
    *found = 0;
    for (int k = 0; k < lg->nt; k++) {
        if (strcmp(lg->name[k], name))
            continue;
        if (lg->numel[k] != count)
            return sl_err_set(err, SL_EINVAL, "%s: tensor '%s' has %llu elements, expected %zu",
                              lg->path, name, (unsigned long long)lg->numel[k], count);
        *found = 1;
        uint64_t off = lg->data + 4 * ((uint64_t)which * lg->total + lg->off[k]);
        if (pread_all(lg->fd, dst, count * sizeof(float), off))
            return sl_err_set(err, SL_EIO, "%s: short read", lg->path);
        return 0;
    }
    return 0;
}

/* What a checkpoint directory offers: its parts, opened, each checked. */
typedef struct ck_dir {
    char *dir;
    int step, kind, bf16;
    dev_st **model, **optim, **fed;
    int nmodel, noptim, nfed;
    legacy *lg; /* the earlier format's moments */
} ck_dir;

static void ck_close(ck_dir *d)
{
    for (int i = 0; i < d->nmodel; i++)
        dev_st_close(d->model[i]);
    for (int i = 0; i < d->noptim; i++)
        dev_st_close(d->optim[i]);
    for (int i = 0; i < d->nfed; i++)
        dev_st_close(d->fed[i]);
    free(d->model);
    free(d->optim);
    free(d->fed);
    legacy_close(d->lg);
    free(d->dir);
    memset(d, 0, sizeof *d);
}

static int part_step(dev_st *st, const char *path, int want, sl_err *err)
{
    const char *v = dev_st_meta(st, "skyloom.step");
    if (!v || atoi(v) != want)
        return sl_err_set(err, SL_ECORRUPT, "%s: of step %s, the checkpoint is of step %d", path,
                          v ? v : "(none)", want);
    return 0;
}

static int add_part(ck_dir *d, const char *name, int step, const dev_config *c, sl_err *err)
{
    int is_model = !strncmp(name, "model.", 6), is_optim = !strncmp(name, "optim.", 6);
    int is_fed = !strncmp(name, "fed.", 4);
    size_t n = strlen(name);
    if ((!is_model && !is_optim && !is_fed) || n < 12 || strcmp(name + n - 12, ".safetensors"))
        return 0; /* config.json, data.json, ... */
    char *path = join(d->dir, name);
    dev_st *st = dev_st_open(path, err);
    int rc = st ? 0 : -1;
    /* a checkpoint is always ours, with checksums: a part without them is
     * not one (or its header lost them) */
    if (!rc && !dev_st_checked(st))
        rc = sl_err_set(err, SL_ECORRUPT, "%s has no checksums: not a checkpoint part written "
                        "by skyloom, or its header is damaged", path);
    if (!rc)
        rc = part_step(st, path, step, err);
    if (!rc && is_model)
        rc = check_unknown(c, st, path, err);
    if (!rc && is_optim) {
        const char *o = dev_st_meta(st, "skyloom.optimizer");
        if (!o || strcmp(o, optim_name(d->kind)))
            rc = sl_err_set(err, SL_ECORRUPT, "%s: optimizer %s, the manifest says %s", path,
                            o ? o : "(none)", optim_name(d->kind));
    }
    free(path);
    if (rc) {
        dev_st_close(st);
        return -1;
    }
    dev_st ***list = is_model ? &d->model : is_optim ? &d->optim : &d->fed;
    int *cnt = is_model ? &d->nmodel : is_optim ? &d->noptim : &d->nfed;
    *list = sl_xrealloc(*list, (size_t)(*cnt + 1) * sizeof **list);
    (*list)[(*cnt)++] = st;
    return 0;
}

static int parse_kind(const char *s)
{
    return !s ? -1 : !strcmp(s, "adamw") ? DEV_OPT_ADAMW : !strcmp(s, "lamb") ? DEV_OPT_LAMB : -1;
}

/* manifest.json: every file it lists must be there with its size and sum. */
static int ck_open_manifest(ck_dir *d, const char *mpath, const dev_config *c, int present_only,
                            sl_err *err)
{
    char *text = NULL;
    size_t len = 0;
    if (sl_read_file(mpath, 1 << 20, &text, &len, err))
        return -1;
    json_error_t je;
    json_t *m = json_loadb(text, len, 0, &je);
    free(text);
    int rc = 0;
    const char *fmt = NULL, *opt = NULL, *state = NULL;
    json_int_t step = -1, version = 0;
    json_t *files = NULL;
    if (!m || json_unpack(m, "{s:s, s:I, s:I, s:s, s:s, s:o}", "format", &fmt, "version", &version,
                          "step", &step, "optimizer", &opt, "optim_state", &state, "files",
                          &files) ||
        strcmp(fmt, MANIFEST_FORMAT) || !json_is_array(files)) {
        json_decref(m);
        return sl_err_set(err, SL_ECORRUPT, "%s: not a Skyloom checkpoint manifest%s%s", mpath,
                          m ? "" : ": ", m ? "" : je.text);
    }
    if (version != MANIFEST_VERSION || step < 0 || step > 0x7fffffff || parse_kind(opt) < 0 ||
        (strcmp(state, "fp32") && strcmp(state, "bf16")))
        rc = sl_err_set(err, SL_ECORRUPT, "%s: version %lld, step %lld, optimizer '%.20s', "
                        "state '%.20s': not one this build reads", mpath, (long long)version,
                        (long long)step, opt, state);
    d->step = (int)step;
    d->kind = parse_kind(opt);
    d->bf16 = state && !strcmp(state, "bf16");
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        if (rc)
            break;
        const char *name = NULL, *hex = NULL;
        json_int_t bytes = -1;
        if (json_unpack(f, "{s:s, s:I, s:s}", "name", &name, "bytes", &bytes, "blake2b", &hex)) {
            rc = sl_err_set(err, SL_ECORRUPT, "%s: files[%zu] needs name, bytes and blake2b",
                            mpath, i);
            break;
        }
        dev_ckpt_file got;
        char *fp = join(d->dir, name);
        int absent = present_only && access(fp, F_OK) != 0;
        free(fp);
        if (absent)
            continue; /* a file of units this loader was not given */
        if (dev_ckpt_file_of(d->dir, name, &got, err)) {
            rc = sl_err_wrap(err, "%s lists it", mpath);
            break;
        }
        char ghex[65];
        hex_of(got.blake2b, sizeof got.blake2b, ghex);
        if ((json_int_t)got.bytes != bytes || strcmp(ghex, hex)) {
            rc = sl_err_set(err, SL_ECORRUPT,
                            "%s/%s: %llu bytes with another checksum than the manifest's %lld "
                            "bytes (the file is damaged or of another save)",
                            d->dir, got.name, (unsigned long long)got.bytes, (long long)bytes);
            break;
        }
        rc = add_part(d, got.name, d->step, c, err);
    }
    json_decref(m);
    if (!rc && (d->nmodel == 0 || d->noptim == 0))
        rc = sl_err_set(err, SL_ECORRUPT, "%s: lists no model or no optimizer part", mpath);
    return rc;
}

/* The earlier format: model.safetensors and optim.bin, no manifest. */
static int ck_open_legacy(ck_dir *d, const dev_config *c, sl_err *err)
{
    char *mp = join(d->dir, "model.safetensors"), *op = join(d->dir, "optim.bin");
    int rc = -1;
    if (access(op, F_OK) != 0 || access(mp, F_OK) != 0) {
        sl_err_set(err, SL_EINVAL, "%s: not a checkpoint (no %s, nor model.safetensors and "
                   "optim.bin)", d->dir, MANIFEST);
        goto out;
    }
    if (!(d->lg = legacy_open(op, c, err)))
        goto out;
    d->step = d->lg->step;
    d->kind = d->lg->kind;
    d->bf16 = -1; /* the earlier format did not record it: either loads */
    if (add_part(d, "model.safetensors", d->step, c, err)) {
        if (err && strstr(err->msg, "of step"))
            sl_err_set(err, SL_EINVAL, "%s: model.safetensors and optim.bin are of different "
                       "saves", d->dir);
        goto out;
    }
    rc = 0;
out:
    free(mp);
    free(op);
    return rc;
}

static int ck_open(ck_dir *d, const char *dir, const dev_config *c, int present_only, sl_err *err)
{
    memset(d, 0, sizeof *d);
    d->dir = sl_xstrdup(dir);
    char *mp = join(dir, MANIFEST);
    int rc = access(mp, F_OK) == 0 ? ck_open_manifest(d, mp, c, present_only, err)
                                   : ck_open_legacy(d, c, err);
    free(mp);
    if (rc)
        ck_close(d);
    return rc;
}

int dev_ckpt_step(const char *dir, sl_err *err)
{
    char *mp = join(dir, MANIFEST);
    int step = -1;
    if (access(mp, F_OK) == 0) {
        char *text = NULL;
        size_t len = 0;
        json_t *m = NULL;
        json_int_t s = -1;
        if (!sl_read_file(mp, 1 << 20, &text, &len, err) && (m = json_loadb(text, len, 0, NULL)) &&
            !json_unpack(m, "{s:I}", "step", &s) && s >= 0 && s <= 0x7fffffff)
            step = (int)s;
        else if (text)
            sl_err_set(err, SL_ECORRUPT, "%s: no step", mp);
        json_decref(m);
        free(text);
    } else {
        char *p = join(dir, "model.safetensors");
        dev_st *st = dev_st_open(p, err);
        const char *v = st ? dev_st_meta(st, "skyloom.step") : NULL;
        if (v)
            step = atoi(v);
        else if (st)
            sl_err_set(err, SL_ECORRUPT, "%s: no skyloom.step", p);
        dev_st_close(st);
        free(p);
    }
    free(mp);
    return step;
}

/* The first part holding `name`; for the head's copy of the word embeddings
 * the embeddings' tensor when no part holds the copy. */
static const dev_st_tensor *ck_find(dev_st **parts, int n, const char *name, const char *alt,
                                    dev_st **which)
{
    for (int pass = 0; pass < (alt ? 2 : 1); pass++)
        for (int i = 0; i < n; i++) {
            const dev_st_tensor *t = dev_st_find(parts[i], pass ? alt : name);
            if (t) {
                *which = parts[i];
                return t;
            }
        }
    return NULL;
}

static int read_part(dev_st **parts, int n, const char *dir, const char *prefix, const hf_part *hp,
                     int tied, const char *suffix, float *dst, sl_err *err)
{
    char name[200], alt[200];
    snprintf(name, sizeof name, "%s%s%s", prefix, hp->name, suffix);
    snprintf(alt, sizeof alt, "%sbert.embeddings.word_embeddings.weight%s", prefix, suffix);
    dev_st *st = NULL;
    const dev_st_tensor *f = ck_find(parts, n, name, tied ? alt : NULL, &st);
    if (!f)
        return sl_err_set(err, SL_EINVAL, "%s: no part holds tensor '%s'", dir, name);
    int same = f->ndim == hp->ndim;
    for (int d = 0; same && d < f->ndim; d++)
        same = f->shape[d] == hp->shape[d];
    if (!same) {
        char a[96], b[96];
        shape_str(a, sizeof a, f->ndim, f->shape);
        shape_str(b, sizeof b, hp->ndim, hp->shape);
        return sl_err_set(err, SL_EINVAL, "%s: tensor '%s' has shape %s, the config needs %s", dir,
                          f->name, a, b);
    }
    return dev_st_read_f32(st, f, 0, hp->numel, dst, err);
}

static int load(dev_stage *s, int kind, const char *dir, int present_only, const char *prefix,
                const dev_ckpt_extra *x, int nx, sl_err *err)
{
    if (!prefix)
        prefix = "";
    const dev_config *c = dev_stage_config(s);
    ck_dir d;
    if (ck_open(&d, dir, c, present_only, err))
        return -1;
    int rc = 0;
    int bf16 = dev_stage_bf16_state(s);
    if (d.kind != kind)
        rc = sl_err_set(err, SL_EINVAL, "%s: state of optimizer %s, this run uses %s (pass "
                        "--optimizer %s)", dir, optim_name(d.kind), optim_name(kind),
                        optim_name(d.kind));
    else if (d.bf16 >= 0 && d.bf16 != bf16)
        rc = sl_err_set(err, SL_EINVAL, "%s: moments saved in %s, this run keeps them in %s "
                        "(pass --optim-state %s)", dir, d.bf16 ? "bf16" : "fp32",
                        bf16 ? "bf16" : "fp32", d.bf16 ? "bf16" : "fp32");
    if (!rc)
        rc = dev_stage_pull(s, err);
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    size_t np = 0;
    float *p = dev_stage_params(s, &np), *mv = rc ? NULL : dev_stage_optim_state(s, &np);
    /* into copies: a checkpoint that fails halfway leaves the stage as it was */
    float *tp = rc ? NULL : sl_try_aligned_alloc(np * sizeof(float));
    float *tmv = rc ? NULL : sl_try_aligned_alloc(2 * np * sizeof(float));
    if (!rc && (!tp || !tmv))
        rc = sl_err_set(err, SL_ENOMEM, "cannot allocate %zu floats to load %s", 3 * np, dir);
    /* the extras into copies too */
    float **tx = sl_xcalloc((size_t)nx + 1, sizeof *tx);
    for (int i = 0; i < nx && !rc; i++)
        if (!(tx[i] = sl_try_aligned_alloc(np * sizeof(float))))
            rc = sl_err_set(err, SL_ENOMEM, "cannot allocate %zu floats to load %s", np, dir);
        else
            memcpy(tx[i], x[i].data, np * sizeof(float));
    if (!rc) { /* (the padding between tensors keeps what it holds) */
        memcpy(tp, p, np * sizeof(float));
        memcpy(tmv, mv, 2 * np * sizeof(float));
    }
    if (!rc && prefix[0] && d.lg)
        rc = sl_err_set(err, SL_EINVAL, "%s: a checkpoint of the earlier format holds no "
                        "replica's state", dir);
    /* a replica's parameters and moments are in the fed parts under its prefix */
    dev_st **mparts = prefix[0] ? d.fed : d.model, **oparts = prefix[0] ? d.fed : d.optim;
    int nm = prefix[0] ? d.nfed : d.nmodel, no = prefix[0] ? d.nfed : d.noptim;
    for (int k = 0; k < nt && !rc; k++) {
        int tied = (t[k].flags & DEV_T_TIED) != 0;
        hf_part parts[3];
        int nparts = hf_parts(&t[k], parts);
        for (int q = 0; q < nparts && !rc; q++) {
            size_t at = t[k].offset + parts[q].offset;
            rc = read_part(mparts, nm, dir, prefix, &parts[q], tied, "", tp + at, err);
            if (!rc && !d.lg)
                rc = read_part(oparts, no, dir, prefix, &parts[q], tied, ".exp_avg", tmv + at, err) ||
                     read_part(oparts, no, dir, prefix, &parts[q], tied, ".exp_avg_sq",
                               tmv + np + at, err);
            for (int i = 0; i < nx && !rc; i++)
                rc = read_part(d.fed, d.nfed, dir, x[i].prefix, &parts[q], tied, x[i].suffix,
                               tx[i] + at, err);
        }
        for (int which = 0; which < 2 && !rc && d.lg; which++) {
            int found;
            float *dst = tmv + (size_t)which * np + t[k].offset;
            rc = legacy_read(d.lg, t[k].name, which, dst, t[k].numel, &found, err);
            if (!rc && !found && tied)
                rc = legacy_read(d.lg, "bert.embeddings.word_embeddings.weight", which, dst,
                                 t[k].numel, &found, err);
            if (!rc && !found)
                rc = sl_err_set(err, SL_EINVAL, "%s/optim.bin: no tensor '%s'", dir, t[k].name);
        }
    }
    if (!rc) {
        memcpy(p, tp, np * sizeof(float));
        memcpy(mv, tmv, 2 * np * sizeof(float));
        for (int i = 0; i < nx; i++)
            memcpy(x[i].data, tx[i], np * sizeof(float));
        rc = dev_stage_push(s, err);
    }
    if (!rc)
        dev_stage_set_step(s, d.step);
    for (int i = 0; i < nx; i++)
        sl_aligned_free(tx[i]);
    free(tx);
    sl_aligned_free(tp);
    sl_aligned_free(tmv);
    dev_stage_drop_views(s);
    ck_close(&d);
    return rc ? -1 : 0;
}

/* Whether the safetensors file DIR/name holds a classification head. */
static int part_classifies(const char *dir, const char *name, sl_err *err)
{
    char *path = join(dir, name);
    dev_st *st = dev_st_open(path, err);
    free(path);
    if (!st)
        return -1;
    int yes = dev_st_find(st, "classifier.weight") != NULL;
    dev_st_close(st);
    return yes;
}

int dev_ckpt_task(const char *dir, sl_err *err)
{
    char *mpath = join(dir, MANIFEST), *text = NULL;
    size_t len = 0;
    int task = -1;
    if (access(mpath, F_OK) != 0) { /* the earlier format */
        int yes = part_classifies(dir, "model.safetensors", err);
        free(mpath);
        return yes < 0 ? -1 : yes ? DEV_TASK_CLASSIFY : DEV_TASK_MLM;
    }
    if (sl_read_file(mpath, 1 << 20, &text, &len, err)) {
        free(mpath);
        return -1;
    }
    json_error_t je;
    json_t *m = json_loadb(text, len, 0, &je), *files = json_object_get(m, "files"), *f;
    size_t i;
    if (!json_is_array(files))
        sl_err_set(err, SL_ECORRUPT, "%s: not a Skyloom checkpoint manifest", mpath);
    else
        task = DEV_TASK_MLM;
    json_array_foreach(files, i, f) {
        const char *name = json_string_value(json_object_get(f, "name"));
        size_t n = name ? strlen(name) : 0;
        if (!name || strncmp(name, "model", 5) || n < 12 || strcmp(name + n - 12, ".safetensors") ||
            strchr(name, '/'))
            continue;
        int yes = part_classifies(dir, name, err);
        if (yes < 0) {
            task = -1;
            break;
        }
        if (yes)
            task = DEV_TASK_CLASSIFY;
    }
    json_decref(m);
    free(text);
    free(mpath);
    return task;
}

int dev_ckpt_load(dev_stage *s, int kind, const char *dir, sl_err *err)
{
    return load(s, kind, dir, 0, NULL, NULL, 0, err);
}

int dev_ckpt_load_fetched(dev_stage *s, int kind, const char *dir, sl_err *err)
{
    return load(s, kind, dir, 1, NULL, NULL, 0, err);
}

int dev_ckpt_load_replica(dev_stage *s, int kind, const char *dir, const char *prefix,
                          const dev_ckpt_extra *x, int nx, int present_only, sl_err *err)
{
    for (int i = 0; i < nx; i++)
        if (x[i].st != s)
            return sl_err_set(err, SL_EINVAL, "extra state %d is another stage's", i);
    return load(s, kind, dir, present_only, prefix, x, nx, err);
}
