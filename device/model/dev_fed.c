/* dev_fed.c - a stage's part of a federation (dev_fed.h). */
#include "dev_fed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_codec.h"
#include "sl_mem.h"

#define WORD_EMBEDDINGS "bert.embeddings.word_embeddings.weight"

struct dev_fed {
    dev_stage *st;
    dev_fed_cfg c;
    dev_sync *sync;
    const dev_tensor *t;
    int nt;
    size_t np;
    float *theta, *mom, *resid; /* theta_outer, v, e: np floats each, or NULL */
    uint8_t *payload;           /* every tensor's payload, at poff[k] */
    size_t *poff;
    dev_sync_tensor *give;      /* [nt]: what a round is given */
    float *dec;                 /* a decoded payload (the largest tensor) */
    int ready;
    uint64_t bytes;
};

void dev_fed_default(dev_fed_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->mode = DEV_SYNC_STEP;
    c->every = 1;
    c->outer_lr = 0.7f;
    c->outer_momentum = 0.5f;
    c->sync.replicas = 1;
    c->sync.weight[0] = 1.0;
    c->sync.codec = DEV_CODEC_NONE;
}

int dev_fed_parse_sync(const char *s, dev_fed_cfg *c, sl_err *err)
{
    if (!strcmp(s, "step")) {
        c->mode = DEV_SYNC_STEP;
        c->every = 1;
        return 0;
    }
    if (!strncmp(s, "outer:", 6)) {
        char *end;
        long h = strtol(s + 6, &end, 10);
        if (s[6] >= '0' && s[6] <= '9' && !*end && h >= 1 && h <= 1000000000) {
            c->mode = DEV_SYNC_OUTER;
            c->every = (int)h;
            return 0;
        }
    }
    return sl_err_set(err, SL_EINVAL, "--sync must be step or outer:H (H inner steps between "
                      "outer steps, at least 1), got '%s'", s);
}

int dev_fed_parse_codec(const char *s, dev_fed_cfg *c, sl_err *err)
{
    if (!strncmp(s, "topk:", 5)) {
        char *end;
        double f = strtod(s + 5, &end);
        if (end != s + 5 && !*end && f > 0.0 && f <= 1.0) {
            c->sync.codec = DEV_CODEC_TOPK;
            c->sync.topk = f;
            return 0;
        }
    } else if (strcmp(s, "topk") && dev_codec_parse(s) >= 0) {
        c->sync.codec = dev_codec_parse(s);
        c->sync.topk = 0;
        return 0;
    }
    return sl_err_set(err, SL_EINVAL, "--codec-sync must be none, fp16, bf16, int8 or topk:F "
                      "(the fraction F of each tensor sent, 0 < F <= 1), got '%s'", s);
}

void dev_fed_sync_name(const dev_fed_cfg *c, char *buf, size_t n)
{
    if (c->mode == DEV_SYNC_OUTER)
        snprintf(buf, n, "outer:%d", c->every);
    else
        snprintf(buf, n, "%s", c->mode == DEV_SYNC_STEP ? "step" : "none");
}

void dev_fed_codec_name(const dev_fed_cfg *c, char *buf, size_t n)
{
    if (c->sync.codec == DEV_CODEC_TOPK)
        snprintf(buf, n, "topk:%g", c->sync.topk);
    else
        snprintf(buf, n, "%s", dev_codec_name(c->sync.codec));
}

/* int8 scales rows: a matrix's rows, a vector as one row */
static size_t cols_of(const dev_tensor *t) { return t->cols ? (size_t)t->cols : t->numel; }

void dev_fed_free(dev_fed *f)
{
    if (!f)
        return;
    sl_aligned_free(f->theta);
    sl_aligned_free(f->mom);
    sl_aligned_free(f->resid);
    sl_aligned_free(f->dec);
    free(f->payload);
    free(f->poff);
    free(f->give);
    free(f);
}

dev_fed *dev_fed_create(dev_stage *st, const dev_fed_cfg *c, dev_sync *sync, sl_err *err)
{
    if (c->mode != DEV_SYNC_STEP && c->mode != DEV_SYNC_OUTER) {
        sl_err_set(err, SL_EINVAL, "a federation needs --sync step or outer:H");
        return NULL;
    }
    if (!sync || sync->c.replicas != c->sync.replicas || sync->c.codec != c->sync.codec ||
        sync->c.topk != c->sync.topk) {
        sl_err_set(err, SL_EINVAL, "a federation of %d replicas needs their sync, of its codec",
                   c->sync.replicas);
        return NULL;
    }
    dev_fed *f = sl_xcalloc(1, sizeof *f);
    f->st = st;
    f->c = *c;
    f->sync = sync;
    f->t = dev_stage_tensors(st, &f->nt);
    dev_stage_params(st, &f->np);
    f->poff = sl_xcalloc((size_t)f->nt + 1, sizeof *f->poff);
    f->give = sl_xcalloc((size_t)f->nt, sizeof *f->give);
    size_t maxn = 1;
    for (int k = 0; k < f->nt; k++) {
        size_t len = dev_sync_payload_len(&c->sync, f->t[k].numel, cols_of(&f->t[k]));
        if (!len) {
            sl_err_set(err, SL_EINVAL, "tensor '%s': no payload of codec %d for %zu elements",
                       f->t[k].name, c->sync.codec, f->t[k].numel);
            dev_fed_free(f);
            return NULL;
        }
        f->poff[k + 1] = f->poff[k] + len;
        maxn = f->t[k].numel > maxn ? f->t[k].numel : maxn;
    }
    size_t bytes = f->np * sizeof(float);
    int lossy = c->sync.codec != DEV_CODEC_NONE, outer = c->mode == DEV_SYNC_OUTER;
    f->payload = sl_try_malloc(f->poff[f->nt]);
    f->dec = lossy ? sl_try_aligned_alloc(maxn * sizeof(float)) : NULL;
    f->resid = lossy ? sl_try_aligned_alloc(bytes) : NULL;
    f->theta = outer ? sl_try_aligned_alloc(bytes) : NULL;
    f->mom = outer ? sl_try_aligned_alloc(bytes) : NULL;
    if (!f->payload || (lossy && (!f->dec || !f->resid)) || (outer && (!f->theta || !f->mom))) {
        sl_err_set(err, SL_ENOMEM, "cannot allocate a replica's sync state (%.1f MiB)",
                   (double)(f->poff[f->nt] + (2 * outer + lossy) * bytes) / 1048576.0);
        dev_fed_free(f);
        return NULL;
    }
    /* zero until dev_fed_begin, so that no call reads uninitialised state */
    if (f->resid)
        memset(f->resid, 0, bytes);
    if (outer) {
        memset(f->theta, 0, bytes);
        memset(f->mom, 0, bytes);
    }
    for (int k = 0; k < f->nt; k++) {
        const dev_tensor *t = &f->t[k];
        f->give[k] = (dev_sync_tensor){
            .name = (t->flags & DEV_T_TIED) ? WORD_EMBEDDINGS : t->name,
            .n = t->numel, .cols = cols_of(t),
            .payload = (t->flags & DEV_T_TIED) ? NULL : f->payload + f->poff[k]};
    }
    return f;
}

const dev_fed_cfg *dev_fed_config(const dev_fed *f) { return &f->c; }

int dev_fed_begin(dev_fed *f, sl_err *err)
{
    if (dev_stage_pull_params(f->st, err))
        return -1;
    if (f->theta) {
        memcpy(f->theta, dev_stage_params(f->st, NULL), f->np * sizeof(float));
        memset(f->mom, 0, f->np * sizeof(float));
    }
    if (f->resid)
        memset(f->resid, 0, f->np * sizeof(float));
    f->ready = 1;
    return 0;
}

int dev_fed_ready(const dev_fed *f) { return f->ready; }
void dev_fed_set_ready(dev_fed *f) { f->ready = 1; }

/* Tensor k's payload of y (n floats); with error feedback e (which may be
 * y itself), e <- y - decode(payload). */
static int give(dev_fed *f, int k, const float *y, float *e, sl_err *err)
{
    const dev_tensor *t = &f->t[k];
    size_t n = t->numel, cols = cols_of(t), kk = dev_sync_k(&f->c.sync, n);
    uint8_t *p = f->payload + f->poff[k];
    if (dev_codec_encode(f->c.sync.codec, y, n, cols, kk, NULL, p, err) ||
        (e && dev_codec_decode(f->c.sync.codec, p, n, cols, kk, f->dec, err)))
        return sl_err_wrap(err, "tensor '%s'", t->name);
    for (size_t i = 0; e && i < n; i++) {
        if (!isfinite(f->dec[i]) && isfinite(y[i])) {
            char codec[32];
            dev_fed_codec_name(&f->c, codec, sizeof codec);
            return sl_err_set(err, SL_EINVAL, "tensor '%s': element %zu (%g) is beyond what "
                              "--codec-sync %s carries", t->name, i, (double)y[i], codec);
        }
        e[i] = y[i] - f->dec[i];
    }
    f->bytes += f->poff[k + 1] - f->poff[k];
    return 0;
}

static int reduce(dev_fed *f, uint64_t step, sl_err *err)
{
    return f->sync->ops->reduce(f->sync, step, f->give, f->nt, err);
}

int dev_fed_grads(dev_fed *f, uint64_t step, sl_err *err)
{
    if (dev_stage_pull_grads(f->st, err))
        return -1;
    float *g = dev_stage_grads(f->st, NULL);
    for (int k = 0; k < f->nt; k++) {
        const dev_tensor *t = &f->t[k];
        float *x = g + t->offset;
        f->give[k].out = x;
        if (!f->give[k].payload)
            continue;
        float *e = f->resid ? f->resid + t->offset : NULL;
        for (size_t i = 0; e && i < t->numel; i++)
            e[i] = x[i] + e[i];
        if (give(f, k, e ? e : x, e, err))
            return -1;
    }
    if (reduce(f, step, err))
        return -1;
    return dev_stage_push_grads(f->st, err);
}

int dev_fed_outer_due(const dev_fed *f, uint64_t step)
{
    return f->c.mode == DEV_SYNC_OUTER && step % (uint64_t)f->c.every == 0;
}

int dev_fed_outer(dev_fed *f, uint64_t step, sl_err *err)
{
    if (dev_stage_pull_params(f->st, err))
        return -1;
    float *th = dev_stage_params(f->st, NULL), *d = dev_stage_grads(f->st, NULL);
    /* a replica whose owner is away only receives: its steps since the
     * last outer step are not averaged in */
    int away = !dev_sync_present(&f->c.sync, f->sync->replica, step);
    for (int k = 0; k < f->nt; k++) {
        const dev_tensor *t = &f->t[k];
        size_t o = t->offset;
        f->give[k].out = d + o;
        if (!f->give[k].payload || away)
            continue;
        float *e = f->resid ? f->resid + o : NULL;
        for (size_t i = 0; i < t->numel; i++) {
            float pseudo = f->theta[o + i] - th[o + i];
            if (e)
                e[i] = pseudo + e[i];
            else
                d[o + i] = pseudo;
        }
        if (give(f, k, e ? e : d + o, e, err))
            return -1;
    }
    if (reduce(f, step, err))
        return -1;
    float lr = f->c.outer_lr, mu = f->c.outer_momentum;
    for (int k = 0; k < f->nt; k++) {
        const dev_tensor *t = &f->t[k];
        for (size_t i = t->offset; i < t->offset + t->numel; i++) {
            float v = mu * f->mom[i] + d[i];
            float step_dir = d[i] + mu * v;
            f->mom[i] = v;
            f->theta[i] = f->theta[i] - lr * step_dir;
            th[i] = f->theta[i];
        }
    }
    return dev_stage_push_params(f->st, err);
}

float *dev_fed_outer_params(dev_fed *f) { return f->theta; }
float *dev_fed_momentum(dev_fed *f) { return f->mom; }
float *dev_fed_residual(dev_fed *f) { return f->resid; }
uint64_t dev_fed_bytes(const dev_fed *f) { return f->bytes; }
