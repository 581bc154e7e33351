/* dev_testutil.h - shared by the model tests (test_model.c, test_stages.c,
 * test_ckpt.c): a masked batch with padding and two segments. */
#ifndef DEV_TESTUTIL_H
#define DEV_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_stage.h"
#include "dev_train.h"
#include "sl_rng.h"

typedef struct dt_batch {
    int B, T;
    int32_t *tok, *seg, *valid, *lab;
} dt_batch;

/* Sequences of different lengths (padding), two segments, ~15-25% masked. */
static inline void dt_make_batch(dt_batch *b, int B, int T, int V, uint64_t stream)
{
    size_t n = (size_t)B * T;
    b->B = B;
    b->T = T;
    b->tok = calloc(n, 4);
    b->seg = calloc(n, 4);
    b->valid = calloc(n, 4);
    b->lab = calloc(n, 4);
    for (int s = 0; s < B; s++) {
        int len = T - (s * 7) % (T / 2);
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)s * T + t;
            int in = t < len;
            b->valid[i] = in;
            b->tok[i] = in ? 5 + (int32_t)(sl_rng_u32(0x5EED, stream, i) % (uint32_t)(V - 5)) : 0;
            b->seg[i] = in && t >= len / 2;
            b->lab[i] = -100;
            if (in && (t % 7 == 3 || sl_rng_u32(0x5EED, stream + 1, i) % 100 < 10))
                b->lab[i] = 5 + (int32_t)(sl_rng_u32(0x5EED, stream + 2, i) % (uint32_t)(V - 5));
        }
    }
}

/* The batch's labels for sequence classification with K classes: each
 * sequence's class at its position 0 ([CLS]), -100 everywhere else; every
 * fifth sequence (4, 9, ...) has none. */
static inline void dt_classify(dt_batch *b, int K, uint64_t stream)
{
    for (int s = 0; s < b->B; s++)
        for (int t = 0; t < b->T; t++)
            b->lab[(size_t)s * b->T + t] =
                t == 0 && s % 5 != 4 ? (int32_t)(sl_rng_u32(0xC1A55, stream, (uint64_t)s) % (uint32_t)K)
                                     : -100;
}

static inline dev_batch dt_view(const dt_batch *b)
{
    dev_batch d = {.B = b->B, .T = b->T, .tokens = b->tok, .segments = b->seg,
                   .valid = b->valid, .labels = b->lab};
    return d;
}

static inline void dt_free_batch(dt_batch *b)
{
    free(b->tok);
    free(b->seg);
    free(b->valid);
    free(b->lab);
}

/* The tensor called `name` in any stage of tr: its parameters (grad = 0) or
 * gradients (grad = 1); NULL if absent. */
static inline float *dt_find(dev_train *tr, const char *name, int grad, size_t *numel)
{
    for (int i = 0; i < dev_train_nstages(tr); i++) {
        dev_stage *s = dev_train_stage(tr, i);
        int nt;
        const dev_tensor *t = dev_stage_tensors(s, &nt);
        for (int k = 0; k < nt; k++)
            if (!strcmp(t[k].name, name)) {
                *numel = t[k].numel;
                return (grad ? dev_stage_grads(s, NULL) : dev_stage_params(s, NULL)) + t[k].offset;
            }
    }
    return NULL;
}

/* Runs a test program's cases inside a fresh temporary directory `dir`
 * (a mkdtemp template), removed afterwards. */
static inline int dt_in_tmpdir(char *dir, void (*cases)(void))
{
    if (!mkdtemp(dir)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    cases();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return 0;
}

#endif
