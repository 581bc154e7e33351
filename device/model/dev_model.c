#include "dev_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_mem.h"
#include "sl_rng.h"

typedef struct builder {
    dev_tensor *t;
    int n, cap;
    size_t total;
} builder;

__attribute__((format(printf, 6, 7))) static void add(builder *b, int unit, unsigned flags, int rows, int cols, const char *fmt, ...)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 32;
        b->t = sl_xrealloc(b->t, (size_t)b->cap * sizeof *b->t);
    }
    dev_tensor *t = &b->t[b->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->unit = unit;
    t->rows = rows;
    t->cols = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    t->offset = b->total;
    t->flags = flags;
    /* Keep every tensor 16-float (64-byte) aligned inside the flat array. */
    b->total += (t->numel + 15) & ~(size_t)15;
}

int dev_model_layout(const dev_config *c, int u0, int u1, dev_tensor **out, int *n,
                     size_t *total, sl_err *err)
{
    int head = dev_unit_head(c);
    if (u0 < 0 || u1 > head || u0 > u1)
        return sl_err_set(err, SL_EINVAL, "unit range %d..%d outside 0..%d", u0, u1, head);
    int C = c->hidden, F = c->intermediate, V = c->vocab;
    builder b = {0};
    for (int u = u0; u <= u1; u++) {
        if (u == 0) {
            const char *p = "bert.embeddings.";
            add(&b, u, DEV_T_DECAY, V, C, "%sword_embeddings.weight", p);
            add(&b, u, DEV_T_DECAY, c->max_pos, C, "%sposition_embeddings.weight", p);
            add(&b, u, DEV_T_DECAY, c->type_vocab, C, "%stoken_type_embeddings.weight", p);
            add(&b, u, DEV_T_LNW, C, 0, "%sLayerNorm.weight", p);
            add(&b, u, 0, C, 0, "%sLayerNorm.bias", p);
        } else if (u < head) {
            int l = u - 1;
            const char *p = "bert.encoder.layer.";
            add(&b, u, DEV_T_DECAY | DEV_T_QKV, 3 * C, C, "%s%d.attention.self.qkv.weight", p, l);
            add(&b, u, DEV_T_QKV, 3 * C, 0, "%s%d.attention.self.qkv.bias", p, l);
            add(&b, u, DEV_T_DECAY, C, C, "%s%d.attention.output.dense.weight", p, l);
            add(&b, u, 0, C, 0, "%s%d.attention.output.dense.bias", p, l);
            add(&b, u, DEV_T_LNW, C, 0, "%s%d.attention.output.LayerNorm.weight", p, l);
            add(&b, u, 0, C, 0, "%s%d.attention.output.LayerNorm.bias", p, l);
            add(&b, u, DEV_T_DECAY, F, C, "%s%d.intermediate.dense.weight", p, l);
            add(&b, u, 0, F, 0, "%s%d.intermediate.dense.bias", p, l);
            add(&b, u, DEV_T_DECAY, C, F, "%s%d.output.dense.weight", p, l);
            add(&b, u, 0, C, 0, "%s%d.output.dense.bias", p, l);
            add(&b, u, DEV_T_LNW, C, 0, "%s%d.output.LayerNorm.weight", p, l);
            add(&b, u, 0, C, 0, "%s%d.output.LayerNorm.bias", p, l);
        } else if (c->task == DEV_TASK_CLASSIFY) {
            int K = c->num_labels;
            add(&b, u, DEV_T_DECAY, C, C, "bert.pooler.dense.weight");
            add(&b, u, 0, C, 0, "bert.pooler.dense.bias");
            add(&b, u, DEV_T_DECAY, K, C, "classifier.weight");
            add(&b, u, 0, K, 0, "classifier.bias");
        } else {
            const char *p = "cls.predictions.";
            add(&b, u, DEV_T_DECAY, C, C, "%stransform.dense.weight", p);
            add(&b, u, 0, C, 0, "%stransform.dense.bias", p);
            add(&b, u, DEV_T_LNW, C, 0, "%stransform.LayerNorm.weight", p);
            add(&b, u, 0, C, 0, "%stransform.LayerNorm.bias", p);
            add(&b, u, 0, V, 0, "%sbias", p);
            if (u0 > 0)
                add(&b, u, DEV_T_DECAY | DEV_T_TIED, V, C, "%sdecoder.weight", p);
        }
    }
    *out = b.t;
    *n = b.n;
    *total = b.total;
    return 0;
}

uint64_t dev_tensor_key(const dev_tensor *t)
{
    const char *s = (t->flags & DEV_T_TIED) ? "bert.embeddings.word_embeddings.weight" : t->name;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

void dev_model_init(const dev_tensor *t, int n, float *params, uint64_t seed, float std)
{
    for (int i = 0; i < n; i++) {
        float *p = params + t[i].offset;
        if (t[i].flags & DEV_T_LNW) {
            for (size_t j = 0; j < t[i].numel; j++)
                p[j] = 1.0f;
        } else if (t[i].cols == 0) {
            memset(p, 0, t[i].numel * sizeof *p);
        } else {
            /* The head's copy must start equal to the word embeddings. */
            uint64_t stream = sl_rng_stream(0x5eed1417ull, dev_tensor_key(&t[i]));
            for (size_t j = 0; j < t[i].numel; j++)
                p[j] = std * sl_rng_normal(seed, stream, j);
        }
    }
}
